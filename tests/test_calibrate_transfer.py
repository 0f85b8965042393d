"""The transfer proof on this machine (slow): probe, sweep model A with the real llama.cpp
server, calibrate on that sweep alone, then predict model A at a longer context and a
bigger model B at the first, and sweep those to compare (bench/cpu_transfer.py, the harness).

Stated bound: the median |error| over the four levels (batch 1, 2, 4, 8) of EACH transfer
is at most 40%, and the calibration run itself is fitted within 25%. Measured on a shared,
busy 2-core machine (docs/calibrate.md): 22% (A at 544 tokens) and 20% (B), against 35%
and 21% uncalibrated. The bound is loose because the machine is shared: other processes'
load moves single levels by tens of percent.

What load cannot change is asserted always (four levels a case, a longer context in the
long run, the profile written). The accuracy bounds are judged only where the run had the
cores to itself: Linux's CPU pressure over the run (the share of its wall time in which a
runnable task waited for a core, /proc/pressure/cpu) at most PRESSURE_LIMIT. Beside a
CPU-bound process (issue 40: the suite twice in a row beside one) the measured times are
the other process's as much as the engine's, and the test then skips its accuracy part,
saying so with the pressure it saw, instead of failing CI on a timing.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from bstar import calibrate as cal

HARNESS = Path(__file__).resolve().parents[1] / "bench" / "cpu_transfer.py"

TRANSFER_BOUND = 0.40
FIT_BOUND = 0.25
PRESSURE_LIMIT = 0.25


@pytest.mark.slow
def test_calibration_on_one_sweep_predicts_another_context_and_a_sibling_model(
        tmp_path: Path) -> None:
    pytest.importorskip("xllamacpp", reason="needs the extra bstar[llamacpp]")
    pytest.importorskip("gguf", reason="needs the extra bstar[tiny]")
    pytest.importorskip("scipy", reason="needs scipy (a base dependency)")
    bench = _harness()
    format_result = bench.format_result
    r = bench.run_transfer(tmp_path, log=print)
    print(format_result(r))
    fitted, *transfers = r.cases
    assert len(transfers) == 2
    assert len(fitted.points) == 4 and all(len(c.points) == 4 for c in transfers)
    # The long-context run really holds a longer context than the calibration run.
    assert transfers[0].points[0].context_tokens > fitted.points[0].context_tokens
    prof = cal.load_profile(tmp_path / "profile.toml")
    assert prof.engine == "llama.cpp"
    if r.cpu_pressure is not None and r.cpu_pressure > PRESSURE_LIMIT:
        pytest.skip(f"accuracy not judged: CPU pressure {r.cpu_pressure:.0%} over the run "
                    f"(> {PRESSURE_LIMIT:.0%}: other processes held the cores)")
    assert fitted.median_abs_error <= FIT_BOUND, format_result(r)
    for case in transfers:
        assert case.median_abs_error <= TRANSFER_BOUND, (case.name, format_result(r))


def _harness() -> ModuleType:
    """bench/cpu_transfer.py, imported from its file (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_cpu_transfer", HARNESS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


def test_the_harness_imports_and_parses_its_arguments() -> None:
    # The fast check of the slow harness: bench/cpu_transfer.py loads and its main rejects a
    # missing WORKDIR as argparse does.
    bench = _harness()
    assert bench.TransferConfig().fit == bench.FIT
    total = bench.cpu_pressure_total_us()
    assert total is None or (isinstance(total, int) and total >= 0)
    with pytest.raises(SystemExit):
        bench.main([])
