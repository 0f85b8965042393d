"""A time bound for an in-process `bstar` call: SIGALRM raises `Hang`, which is not an
Exception, so no handler in bstar swallows it. Used by the CLI fuzz and the hostile-input
tests to turn a hang into a failure instead of a blocked suite."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


class Hang(BaseException):
    """Raised by the alarm when the bounded block ran past its seconds."""


def _on_alarm(signum: int, frame: object) -> None:
    raise Hang


@contextlib.contextmanager
def bounded(seconds: int) -> Iterator[None]:
    if not hasattr(signal, "SIGALRM"):  # pragma: no cover
        yield
        return
    old = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_bstar(argv: list[str], seconds: int) -> tuple[int, str, str]:
    """`bstar ARGV` in-process: (status, stdout, stderr), failing the test if it runs past
    `seconds` (the hostile-input tests' runner)."""
    import io

    import pytest

    from bstar.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with bounded(seconds), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else 2
    except Hang:
        pytest.fail(f"bstar {' '.join(argv)[:200]} ran past {seconds} s")
    return status, out.getvalue(), err.getvalue()
