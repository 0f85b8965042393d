"""GPU power in the sweep (issue 39): sampled through NVML's own interface, stored with each
level, said once when there is no power source; AMD SMI likewise. The NVML and AMD SMI
modules are fakes injected under their import names (no GPU here)."""

from __future__ import annotations

import sqlite3
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from bstar.loadgen.gpu_telemetry import GpuTelemetry, power_source
from bstar.loadgen.store import Store
from bstar.loadgen.sweep import SweepConfig, load_result, run_sweep

pytest.importorskip("aiohttp", reason="needs aiohttp (a base dependency)")

from fake_openai import FakeServer


class FakeNvml(types.SimpleNamespace):
    """pynvml's calls that bstar makes, by NVML's names; records what was called."""

    def __init__(self, power_mw: int = 412_345, count: int = 1) -> None:
        super().__init__()
        self.power_mw = power_mw
        self.count = count
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        self.calls.append(f"nvmlDeviceGetHandleByIndex({i})")
        return "gpu0"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> Any:
        assert h == "gpu0"
        return types.SimpleNamespace(gpu=90, memory=70)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> Any:
        return types.SimpleNamespace(used=40 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h: str) -> int:
        assert h == "gpu0"
        self.calls.append("nvmlDeviceGetPowerUsage")
        return self.power_mw  # milliwatts, as NVML returns it


def _cfg(url: str) -> SweepConfig:
    return SweepConfig(url=url, served_model="tiny", concurrency=[1, 2], input_len=8,
                       output_len=8, num_requests=8, warmup_requests=0,
                       request_timeout_s=30, level_time_limit_s=30, scrape_interval_s=0.05)


def test_sweep_stores_power_per_level_from_nvml(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    srv = FakeServer(interval_ms=2)
    events: list[tuple[str, dict[str, Any]]] = []
    db = tmp_path / "r.db"
    res = run_sweep(_cfg(srv.url), db=db, session_factory=srv.session,
                    on_event=lambda k, d: events.append((k, d)))
    assert res.status == "completed"
    said = [d for k, d in events if k == "power_source"]
    assert len(said) == 1 and said[0]["source"] == "nvml" and "412 W" in said[0]["detail"]
    stored = load_result(db, res.run_id)
    assert len(stored.levels) == 2
    for lv in stored.levels:
        gpu = (lv.server or {})["gpu"]
        assert gpu["power_mean_w"] == pytest.approx(412.345)
        assert gpu["power_max_w"] == pytest.approx(412.345)
        assert gpu["power_samples"] >= 1 and gpu["power_source"] == "nvml"
        assert gpu["sm_util_mean_pct"] == 90.0
    # Every nvmlInit has its nvmlShutdown (the probe's and each level's).
    assert nvml.calls.count("nvmlInit") == nvml.calls.count("nvmlShutdown") == 3
    assert "nvmlDeviceGetHandleByIndex(0)" in nvml.calls


def test_sweep_without_a_power_source_says_so_once(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    srv = FakeServer(interval_ms=2)
    events: list[tuple[str, dict[str, Any]]] = []
    db = tmp_path / "r.db"
    res = run_sweep(_cfg(srv.url), db=db, session_factory=srv.session,
                    on_event=lambda k, d: events.append((k, d)))
    assert res.status == "completed"
    said = [d for k, d in events if k == "power_source"]
    assert len(said) == 1 and said[0]["source"] is None
    assert "no power source" in said[0]["detail"] and "nvidia-ml-py" in said[0]["detail"]
    for lv in load_result(db, res.run_id).levels:
        assert "power_mean_w" not in ((lv.server or {}).get("gpu") or {})
        assert lv.stats is not None and lv.stats["completed"] == 8


def test_nvml_without_a_gpu_is_no_power_source(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(count=0)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    source, line = power_source()
    assert source is None and "no local GPU answered pynvml" in line
    assert nvml.calls == ["nvmlInit", "nvmlShutdown"]


def test_amdsmi_power_and_activity(monkeypatch: pytest.MonkeyPatch) -> None:
    amd = types.SimpleNamespace(
        calls=[],
        amdsmi_init=lambda: None,
        amdsmi_get_processor_handles=lambda: ["mi300x"],
        amdsmi_get_gpu_activity=lambda h: {"gfx_activity": 75, "umc_activity": 55,
                                           "mm_activity": "N/A"},
        # MI300: current_socket_power; the average is unsupported there (2**32 - 1).
        amdsmi_get_power_info=lambda h: {"current_socket_power": 612,
                                         "average_socket_power": 2**32 - 1,
                                         "power_limit": 750},
        amdsmi_shut_down=lambda: amd.calls.append("shut_down"))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(sys.modules, "amdsmi", amd)
    t = GpuTelemetry.create()
    assert t is not None and t.source == "amdsmi"
    t.sample()
    got = t.summary()
    assert got["power_mean_w"] == 612.0 and got["power_source"] == "amdsmi"
    assert got["sm_util_mean_pct"] == 75.0 and got["mem_bw_util_mean_pct"] == 55.0
    t.close()
    t.close()
    assert amd.calls == ["shut_down"]


def test_a_store_written_before_power_still_loads(tmp_path: Path) -> None:
    """A results DB whose levels' server JSON has no power (every store before issue 39, or
    a sweep without a GPU) loads; the calibrate fit finds no power in it."""
    from bstar.calibrate.power import level_power

    db = tmp_path / "old.db"
    with Store(db) as st:
        run_id = st.create_run(url="http://x", served_model="m", model=None, gpu=None,
                               options={"concurrency": [1]}, bstar_version="0")
        lid, _ = st.start_level(run_id, 0, concurrency=1, rate=None, max_num_seqs=None)
        st.finish_level(lid, status="completed", duration_s=1.0,
                        stats={"completed": 1}, server={"gpu": {"sm_util_mean_pct": 50.0}})
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM levels").fetchone()[0] == 1
    con.close()
    res = load_result(db, run_id)
    assert level_power(res.levels[0]) is None


TRUE_IDLE_W, TRUE_EXPONENT = 95.0, 1.35


def _stored_run(db: Path, d: Any, batches: list[int], noise_w: list[float]) -> str:
    """A sweep run as the store keeps it, each level's GPU power from a known curve at the
    utilization the cost model gives the level (a fake NVML's readings, stored)."""
    from bstar import energy
    from bstar import roofline as rl

    ctx = 256 + 128 // 2
    e = energy.decode_energy(d, batches, ctx)
    assert e is not None
    tdp = d.gpu.tdp_w
    steps_ms = rl.curve(d, batches, ctx).step_s * 1e3
    with Store(db) as st:
        run_id = st.create_run(url="http://x", served_model="m", model="llama-3-8b",
                               gpu=d.gpu.id, options={"input_len": 256, "output_len": 128,
                                                      "concurrency": batches},
                               bstar_version="0")
        for i, (b, u, n, step) in enumerate(zip(batches, e.utilization, noise_w, steps_ms,
                                                strict=True)):
            w = TRUE_IDLE_W + (tdp - TRUE_IDLE_W) * float(u) ** TRUE_EXPONENT + n
            lid, _ = st.start_level(run_id, i, concurrency=b, rate=None, max_num_seqs=None)
            st.finish_level(lid, status="completed", duration_s=10.0,
                            stats={"completed": 50, "itl_ms": {"p50": float(step)},
                                   "tpot_ms": {"p50": float(step), "mean": float(step)}},
                            server={"gpu": {"power_mean_w": w, "power_max_w": w + 5,
                                            "power_samples": 20, "power_source": "nvml"}})
        st.update_run(run_id, status="completed")
    return run_id


BATCHES = [1, 4, 16, 64, 128, 256]
NOISE_W = [0.8, -0.6, 0.4, -0.9, 0.5, -0.3]  # a watt or so: NVML's readings wander


def test_calibrate_recovers_a_known_power_curve_from_stored_levels(tmp_path: Path) -> None:
    import bstar
    from bstar.calibrate.power import power_from_run
    from bstar.deployment import Deployment

    d = Deployment(bstar.get_model("llama-3-8b"), bstar.get_gpu("h100-sxm"))
    exact = power_from_run(d, load_result(
        tmp_path / "a.db", _stored_run(tmp_path / "a.db", d, BATCHES, [0.0] * len(BATCHES))))
    assert exact is not None
    assert exact.fit.idle_w == pytest.approx(TRUE_IDLE_W, rel=0.02)
    assert exact.fit.exponent == pytest.approx(TRUE_EXPONENT, rel=0.02)
    # With a watt of noise per level the curve still matches the truth within 2% over the
    # utilizations the levels ran; idle power is an extrapolation below the lowest level's
    # (batch 1 decode still streams the weights: u ~ 0.45), so it is known less well.
    got = power_from_run(d, load_result(
        tmp_path / "b.db", _stored_run(tmp_path / "b.db", d, BATCHES, NOISE_W)))
    assert got is not None and got.fit.points == len(BATCHES) and got.fit.rms_error_w < 1.0
    tdp = d.gpu.tdp_w
    for u, w in zip(got.utilization, got.predicted_w(), strict=True):
        assert w == pytest.approx(TRUE_IDLE_W + (tdp - TRUE_IDLE_W) * u ** TRUE_EXPONENT,
                                  rel=0.02)
    assert got.fit.idle_w == pytest.approx(TRUE_IDLE_W, rel=0.05)


def test_calibrate_cli_writes_the_power_curve_that_plan_applies(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import bstar
    from bstar.cli import main
    from bstar.deployment import Deployment

    d = Deployment(bstar.get_model("llama-3-8b"), bstar.get_gpu("h100-sxm"))
    db = tmp_path / "r.db"
    run_id = _stored_run(db, d, BATCHES, [0.0] * len(BATCHES))
    prof = tmp_path / "p.toml"
    assert main(["calibrate", run_id, "--db", str(db), "--model", "llama-3-8b", "--gpu",
                 "h100-sxm", "--json", "-o", str(prof)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["power"]["idle_w"] == pytest.approx(TRUE_IDLE_W, rel=0.02)
    assert out["power"]["exponent"] == pytest.approx(TRUE_EXPONENT, rel=0.02)
    assert "[power]" in prof.read_text()
    assert main(["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--profile",
                 str(prof), "--context", "320", "--json"]) == 0
    basis = json.loads(capsys.readouterr().out)["power_basis"]
    assert basis["idle_basis"] == "calibrated" and basis["curve_basis"] == "calibrated"
    assert basis["idle_w"] == pytest.approx(out["power"]["idle_w"])
    assert basis["exponent"] == pytest.approx(out["power"]["exponent"])


def test_calibrate_without_stored_power_keeps_the_defaults(tmp_path: Path) -> None:
    import bstar
    from bstar.calibrate.power import power_from_run
    from bstar.deployment import Deployment

    d = Deployment(bstar.get_model("llama-3-8b"), bstar.get_gpu("h100-sxm"))
    db = tmp_path / "r.db"
    run_id = _stored_run(db, d, [1, 4], [0.0, 0.0])  # two levels: too few to fit
    assert power_from_run(d, load_result(db, run_id)) is None
