"""The transfer proof, end to end on this machine: probe, sweep, calibrate, predict.

    python bench/cpu_transfer.py WORKDIR [--json]   # minutes; needs bstar[tiny,llamacpp]

Two tiny random-weight Llamas of different sizes (bstar.tinymodel) are served by the real
llama.cpp server (bstar.servers.LlamaCppServer) on the CPU. Model A is swept at a short
context; the cost model is calibrated on that sweep alone; then it predicts model A at a
longer context and model B at the short one, and those are swept too. The per-level error
of the predictions is the figure of merit. This script prints it; the slow test
(tests/test_calibrate_transfer.py) asserts a bound on it.

Modelled as llama.cpp runs these files: weights float32 as written in the GGUF ("fp32"),
KV cache float16 (llama.cpp's default cache_type_k/v = f16), one decode step per token for
all running slots. The step time is the median inter-token gap of a level (itl_p50): the
mean TPOT also carries stalls behind other requests' prefills, which the decode model does
not describe.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

# A: ~52M parameters (208 MB of float32), B: ~95M (380 MB): both far past the 32 MiB L3 of
# the machines this runs on, and different enough that a calibration tied to A's size
# would show.
MODEL_A = {"hidden_size": 768, "num_layers": 8, "intermediate_size": 2048, "num_heads": 12,
           "num_kv_heads": 4}
MODEL_B = {"hidden_size": 1024, "num_layers": 8, "intermediate_size": 2816, "num_heads": 16,
           "num_kv_heads": 8}
FIT = ("bandwidth", "compute", "overhead_s")


@dataclass(frozen=True)
class TransferConfig:
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    short_input_len: int = 64
    # At 512 + 32 tokens A's KV read adds ~17% to its weight bytes at batch 8 and attention
    # ~13% to its FLOPs: a context change the prediction must follow. Prefill of 512
    # tokens costs ~1 s on one core, hence fewer requests at that length.
    long_input_len: int = 512
    output_len: int = 64
    num_requests: int = 16
    num_requests_long: int = 8
    # One engine thread: llama.cpp's threads spin at barriers, so on a busy 2-core machine
    # two threads stall each other whenever one is descheduled; one thread degrades
    # gracefully. The probe measures with the same count.
    threads: int = 1
    # One model at one context: compute efficiency and per-sequence overhead are both
    # linear in the batch and tie exactly, so the per-sequence overhead stays at its prior
    # (5 us) and only the rest is fitted.
    fit: tuple[str, ...] = FIT
    metric: str = "itl_p50"
    probe_sizes: dict[str, int] = field(default_factory=dict)  # e.g. {"copy_mib": 64}


@dataclass(frozen=True)
class Case:
    name: str
    run_id: str
    model: str
    points: tuple[Any, ...]  # bstar.calibrate.PointFit

    @property
    def median_abs_error(self) -> float:
        from bstar.calibrate import median_abs_error

        return median_abs_error(self.points)

    @property
    def max_abs_error(self) -> float:
        return max(abs(p.rel_error) for p in self.points)

    @property
    def uncalibrated_median_abs_error(self) -> float:
        from bstar.calibrate import median_abs_error

        return median_abs_error(self.points, uncalibrated=True)


@dataclass(frozen=True)
class TransferResult:
    gpu_file: str
    db: str
    calibration: Any  # bstar.calibrate.Calibration
    cases: tuple[Case, ...]  # the calibration run itself first, then the two transfers
    # The share of the run's wall time in which some runnable task waited for a core
    # (Linux PSI, /proc/pressure/cpu "some"): other processes' load; None where unreadable.
    cpu_pressure: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_file": self.gpu_file, "db": self.db, "cpu_pressure": self.cpu_pressure,
                "calibration": self.calibration.to_dict(),
                "cases": [{"name": c.name, "run_id": c.run_id, "model": c.model,
                           "median_abs_error": c.median_abs_error,
                           "max_abs_error": c.max_abs_error,
                           "uncalibrated_median_abs_error": c.uncalibrated_median_abs_error,
                           "levels": [{"batch": p.batch, "context_tokens": p.context_tokens,
                                       "measured_ms": p.measured_ms,
                                       "predicted_ms": p.predicted_ms,
                                       "rel_error": p.rel_error,
                                       "uncalibrated_ms": p.uncalibrated_ms,
                                       "uncalibrated_rel_error": p.uncalibrated_rel_error}
                                      for p in c.points]}
                          for c in self.cases]}


def cpu_pressure_total_us() -> int | None:
    """Linux's cumulative CPU pressure ("some" total, microseconds in which at least one
    runnable task waited for a core), or None where the kernel does not expose it."""
    try:
        text = Path("/proc/pressure/cpu").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            fields_ = dict(kv.split("=", 1) for kv in line.split()[1:])
            return int(fields_["total"]) if "total" in fields_ else None
    return None


def run_transfer(workdir: str | Path, cfg: TransferConfig | None = None,
                 log: Callable[[str], None] = lambda s: None) -> TransferResult:
    from bstar import calibrate as cal
    from bstar.deployment import Deployment
    from bstar.loadgen.sweep import SweepConfig, run_sweep
    from bstar.servers import LlamaCppServer
    from bstar.specs.gpu import load_gpu_file
    from bstar.specs.presets import get_model
    from bstar.tinymodel import default_tiny_dir

    cfg = cfg or TransferConfig()
    t0_s, p0_us = time.monotonic(), cpu_pressure_total_us()
    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    gpu_file = work / "probe.toml"
    # A fresh process, so BLAS starts with the engine's thread count.
    extra = [a for k, v in cfg.probe_sizes.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    subprocess.run([sys.executable, "-m", "bstar", "probe", "-o", str(gpu_file), "--device",
                    "cpu", "--threads", str(cfg.threads), *extra], check=True,
                   stdout=subprocess.DEVNULL)
    gpu = load_gpu_file(gpu_file)
    log(f"probe: {gpu.hbm_bandwidth_bytes_s / 1e9:.1f} GB/s, "
        f"{gpu.bf16_flops / 1e9:.1f} GFLOP/s fp32 -> {gpu_file}")
    db = work / "runs.db"
    tiny = {"A": default_tiny_dir(**MODEL_A), "B": default_tiny_dir(**MODEL_B)}

    def sweep(url: str, input_len: int, num_requests: int) -> str:
        sc = SweepConfig(url=url, served_model="tiny", concurrency=list(cfg.concurrency),
                         input_len=input_len, output_len=cfg.output_len,
                         num_requests=num_requests, level_time_limit_s=300.0,
                         request_timeout_s=300.0)
        return run_sweep(sc, db=db).run_id

    ctx_slot = cfg.long_input_len + cfg.output_len + 64
    runs: dict[str, str] = {}
    for name in ("A", "B"):
        gguf = tiny[name].gguf_path
        assert gguf is not None
        with LlamaCppServer(gguf, n_parallel=max(cfg.concurrency), ctx_per_slot=ctx_slot,
                            threads=cfg.threads, log_path=work / f"llamacpp-{name}.log") as s:
            url = f"http://127.0.0.1:{s.port}"
            runs[f"{name}-short"] = sweep(url, cfg.short_input_len, cfg.num_requests)
            log(f"swept {name} at input {cfg.short_input_len}: run {runs[f'{name}-short']}")
            if name == "A":
                runs["A-long"] = sweep(url, cfg.long_input_len, cfg.num_requests_long)
                log(f"swept A at input {cfg.long_input_len}: run {runs['A-long']}")

    from bstar.loadgen.sweep import load_result

    def deployment(name: str) -> Deployment:
        return Deployment(get_model(str(tiny[name].hf_dir)), gpu, weight_dtype="fp32",
                             kv_dtype="fp16")

    def points(run: str) -> list[cal.Point]:
        return cal.steps_from_sweep(load_result(db, run), cfg.metric)

    c = cal.calibrate(deployment("A"), points(runs["A-short"]), cfg.fit, engine="llama.cpp",
                      source=f"sweep run {runs['A-short']} ({db}), {cfg.metric}")
    cases = [Case("A, calibration run", runs["A-short"], "A", c.points)]
    for name, model, run in (("A, long context", "A", runs["A-long"]),
                             ("B, short context", "B", runs["B-short"])):
        cases.append(Case(name, run, model,
                          cal.check(deployment(model), c.eff, points(run),
                                    c.bandwidth_scale, c.compute_scale)))
    (work / "profile.toml").write_text(cal.profile_toml(c))
    p1_us = cpu_pressure_total_us()
    pressure = None if p0_us is None or p1_us is None else \
        (p1_us - p0_us) / 1e6 / max(time.monotonic() - t0_s, 1e-9)
    return TransferResult(str(gpu_file), str(db), c, tuple(cases), pressure)


def format_result(r: TransferResult) -> str:
    c = r.calibration
    lines = [f"calibrated on run {r.cases[0].run_id}: bandwidth "
             f"{c.params['bandwidth'].value:.3f}, compute {c.params['compute'].value:.3f} "
             f"(of the probed figures), overhead {c.eff.overhead_s * 1e3:.3f} ms + "
             f"{c.eff.overhead_per_seq_s * 1e6:.1f} us/seq"]
    lines += [f"  note: {n}" for n in c.notes]
    if r.cpu_pressure is not None:
        lines.append(f"  CPU pressure over the run: {r.cpu_pressure:.0%} of the wall time "
                     "(a runnable task waiting for a core)")
    for case in r.cases:
        lines.append(f"{case.name} (run {case.run_id}): median |error| "
                     f"{case.median_abs_error:.1%} (max {case.max_abs_error:.1%}), "
                     f"uncalibrated {case.uncalibrated_median_abs_error:.1%}")
        for p in case.points:
            lines.append(f"  batch {p.batch:>3}  context {p.context_tokens:>4}  measured "
                         f"{p.measured_ms:8.3f} ms  predicted {p.predicted_ms:8.3f} ms  "
                         f"{p.rel_error:+6.1%}  (uncalibrated {p.uncalibrated_rel_error:+6.1%})")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python bench/cpu_transfer.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("workdir", type=Path)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    r = run_transfer(args.workdir, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(r.to_dict(), indent=2) if args.json else format_result(r))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
