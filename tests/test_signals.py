"""`loadgen.sweep.signals_as_interrupts`: SIGTERM and SIGHUP become `Terminated` inside the
block (sweep and demo unwind through it), and one that something on the way swallowed is
raised again as the block ends instead of being lost (a demo once exited 0 with its report
written after a SIGTERM)."""

from __future__ import annotations

import os
import signal

import pytest

from bstar.loadgen.sweep import Terminated, signals_as_interrupts


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_raises_terminated_and_the_old_handler_comes_back(sig: int) -> None:
    before = signal.getsignal(sig)
    with pytest.raises(Terminated) as e, signals_as_interrupts():
        os.kill(os.getpid(), sig)
        for _ in range(1000):  # the handler runs at the next bytecode boundary
            pass
    assert e.value.signal_name == signal.Signals(sig).name
    assert signal.getsignal(sig) == before


def test_a_swallowed_signal_is_raised_as_the_block_ends() -> None:
    reached_end = False
    with pytest.raises(Terminated), signals_as_interrupts():
        try:  # a library callback that catches everything
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        except BaseException:
            pass
        reached_end = True
    assert reached_end


def test_no_signal_no_exception() -> None:
    with signals_as_interrupts():
        x = 1
    assert x == 1
