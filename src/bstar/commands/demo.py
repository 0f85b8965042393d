"""`bstar demo`: the whole story offline in about a minute. Build the tiny random-weight
model, serve it with llama.cpp on 127.0.0.1, sweep the concurrency, fit the measured curve
and predict past it, stop the server, write one HTML report. Standard library only here."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bstar.commands.common import int_list, positive_int

DEFAULT_LEVELS = [1, 2, 4, 8, 16]


def add_demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output-dir", default="bstar-demo", metavar="DIR",
                   help="where the report, the results DB, the sweep JSON and the server log "
                        "go (default ./bstar-demo)")
    p.add_argument("--concurrency", type=int_list, default=None,
                   help="levels to sweep, comma-separated (default 1,2,4,8,16)")
    p.add_argument("--num-requests", type=positive_int, default=16,
                   help="measured requests per level (default 16)")
    p.add_argument("--input-len", type=positive_int, default=64,
                   help="prompt tokens per request (default 64)")
    p.add_argument("--output-len", type=positive_int, default=32,
                   help="output tokens per request (default 32)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for llama.cpp (default: one core fewer than the machine "
                        "has, at most 4, so the load generator keeps a core)")
    p.add_argument("--json", action="store_true",
                   help="print {run_id, db, report, levels, recommendation} (contract)")
    p.add_argument("--force", action="store_true",
                   help="replace files in DIR that bstar did not write (" + ", ".join(
                       (*DEMO_OUTPUTS, DB_NAME, MODEL_CONFIG)) + ")")


# What demo writes in DIR, each guarded as -o is (bstar.safeio: only a file that starts with
# the header bstar writes for that kind is replaced without --force), all before anything
# runs; the server's log (llamacpp.log) is appended to, never replaced.
DEMO_OUTPUTS = {"this-cpu.toml": ("probe",), "sweep.json": ("json",),
                "report.html": ("html",), "calibration.toml": ("profile",)}
DB_NAME = "bstar.db"  # a results DB: an earlier demo's gets one more run
MODEL_CONFIG = "tiny-llama/config.json"  # a copy of the tiny model's, byte for byte


class _Say:
    """Progress lines on stderr (stdout stays for --json), each with the elapsed time."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.1f}s] {text}", file=sys.stderr, flush=True)


def run_demo(args: argparse.Namespace) -> int:
    from bstar.errors import BstarError
    from bstar.fit.points import MIN_POINTS

    say = _Say()
    out = Path(args.output_dir)
    levels = sorted(set(args.concurrency or DEFAULT_LEVELS))
    if len(levels) < MIN_POINTS:
        # The fit needs them; said now, not after a minute of measuring.
        raise BstarError(f"--concurrency {','.join(map(str, levels))}: the fit needs at least "
                         f"{MIN_POINTS} distinct levels (e.g. "
                         f"{','.join(map(str, DEFAULT_LEVELS[:MIN_POINTS]))})")
    if out.exists() and not out.is_dir():
        raise BstarError(f"-o {out} is a file; bstar demo writes a folder (give a new name)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BstarError(f"-o {out}: cannot create the folder ({e.strerror or e})") from None
    guard_demo_outputs(out, args.force)
    threads = args.threads or max(1, min(4, (os.cpu_count() or 2) - 1))
    try:
        import aiohttp  # noqa: F401  (missing extras fail now, not after a minute)
        import matplotlib  # noqa: F401
        import scipy  # noqa: F401
        import xllamacpp  # noqa: F401
    except ImportError as e:
        raise BstarError(f"bstar demo needs the extras: pip install 'bstar[tiny,llamacpp,"
                         f"plot]' ({e})") from None
    from bstar.loadgen.sweep import SweepInterrupted, Terminated, signals_as_interrupts

    # SIGTERM and SIGHUP, like Ctrl-C, unwind the demo in every phase, so the llama.cpp
    # server it starts is stopped (the default action killed the process on the spot and
    # left the server running under init); the sweep turns them into SweepInterrupted.
    try:
        with signals_as_interrupts():
            return _demo(args, out, levels, threads, say)
    except SweepInterrupted as e:
        # The server was the demo's own and is gone: `sweep --resume` has nothing to resume
        # against. The levels measured so far stay in the DB.
        print(f"bstar: demo interrupted during the sweep; its llama.cpp server is stopped; "
              f"the levels measured so far are run {e.run_id} in {e.db} (bstar runs show "
              f"{e.run_id} --db {e.db}); run bstar demo again for the whole story",
              file=sys.stderr)
        return 130
    except KeyboardInterrupt as e:  # Ctrl-C, or Terminated: SIGTERM/SIGHUP
        why = e.signal_name if isinstance(e, Terminated) else "Ctrl-C"
        print(f"bstar: demo interrupted ({why}); the server it started, if any, is stopped",
              file=sys.stderr)
        return 130


def guard_demo_outputs(out: Path, force: bool) -> None:
    """Before anything runs: each file demo writes in `out` may replace only the same kind
    of file bstar wrote (an earlier demo's), as `-o` does; `bstar.db` must be a bstar
    results DB (one more run goes into it). With `force`, a foreign file is replaced (a
    foreign bstar.db removed first). A folder, FIFO or dangling symlink is refused as `-o`
    refuses it."""
    from bstar import safeio
    from bstar.errors import BstarError

    for name, kinds in DEMO_OUTPUTS.items():
        safeio.check_output(out / name, "-o", force, kinds)
    config = out / MODEL_CONFIG
    if config.is_file() and config.stat().st_size and not force:
        # Compared with the tiny model's once it is built (_copy_config); a file that is
        # not even JSON cannot be that copy.
        try:
            safeio.load_json(config)
        except BstarError:
            raise BstarError(f"-o {config} exists and is not the tiny model's config.json; "
                             "give --force to overwrite it, or another folder") from None
    db = out / DB_NAME
    if not (db.is_file() and db.stat().st_size):
        safeio.check_output(db, "-o", force)  # missing or empty: fine; a folder, FIFO: not
        return
    try:
        from bstar.loadgen.store import Store

        Store(db, readonly=True).close()
    except BstarError as e:
        if not force:
            raise BstarError(f"-o {db} exists and is not a bstar results DB ({e}); give "
                             "--force to replace it, or another folder") from None
        for p in (db, *(Path(f"{db}{x}") for x in ("-wal", "-shm", "-journal"))):
            p.unlink(missing_ok=True)


def _copy_config(src: Path, dest: Path, force: bool) -> None:
    """The tiny model's config.json into DIR (the cost model reads it from a folder whose
    name labels the plots); an existing different file only with --force."""
    from bstar import safeio
    from bstar.errors import BstarError

    data = src.read_bytes()
    if dest.is_file() and not force and dest.stat().st_size and dest.read_bytes() != data:
        raise BstarError(f"-o {dest} exists and is not the tiny model's config.json; give "
                         "--force to overwrite it, or another folder")
    try:
        dest.parent.mkdir(exist_ok=True)
    except OSError as e:
        raise BstarError(f"-o {dest.parent}: cannot create the folder ({e.strerror or e})") \
            from None
    safeio.write_output(dest, data, "-o")


def _demo(args: argparse.Namespace, out: Path, levels: list[int], threads: int,
          say: _Say) -> int:
    from bstar.errors import BstarError
    from bstar.servers import LlamaCppServer
    from bstar.tinymodel import default_tiny_dir

    say("building the tiny random-weight model (cached after the first run)")
    tiny = default_tiny_dir()
    if tiny.gguf_path is None:
        raise BstarError("the tiny model was built without its GGUF file")
    # The cost model reads the same config.json, from a folder whose name labels the plots.
    model_dir = out / "tiny-llama"
    _copy_config(tiny.hf_dir / "config.json", out / MODEL_CONFIG, args.force)
    gpu_file = out / "this-cpu.toml"
    say(f"measuring this CPU's bandwidth and matmul rate for the cost model ({gpu_file})")
    _probe(gpu_file, threads)
    log = out / "llamacpp.log"
    say(f"starting llama.cpp on 127.0.0.1: {max(levels)} slots, {threads} threads ({log})")
    with LlamaCppServer(tiny.gguf_path, n_parallel=max(levels),
                        ctx_per_slot=args.input_len + args.output_len + 64,
                        threads=threads, timeout_s=120, log_path=log) as server:
        say(f"sweeping concurrency {','.join(map(str, levels))}: {args.num_requests} requests "
            f"per level, {args.input_len} tokens in, {args.output_len} out")
        result = _sweep(server.url, levels, args, out / DB_NAME, say, model_dir, gpu_file)
    say("server stopped")
    sweep, fit, views, calibration, uncalibrated = analyse(result, out, say)
    from bstar.report.build import demo_report
    from bstar.report.html import write_html

    report = write_html(demo_report(views, "bstar demo"), out / "report.html")
    say("report written")
    rec = sweep.get("recommendation") or {}
    from bstar.commands.emit import emit
    from bstar.report.text import print_demo

    profile = (out / "calibration.toml").resolve()
    return emit(args, lambda: {
        "run_id": sweep["run_id"], "db": sweep["db"], "report": str(report.resolve()),
        "levels": sweep["levels"], "recommendation": rec,
        "fit": {"knee_batch": fit.knee_batch, "throughput_kind": fit.throughput_kind,
                "predictions": [p.to_dict() for p in fit.predictions]},
        "calibration": {"profile": str(profile), "metric": CALIBRATION_METRIC,
                        "median_abs_error": calibration.median_abs_error,
                        "uncalibrated_median_abs_error": uncalibrated,
                        "roof_sharpness": calibration.eff.roof_sharpness}},
        lambda: print_demo(sweep, fit, report, calibration.median_abs_error, uncalibrated,
                           profile))


def analyse(result: Any, out: Path, say: Callable[[str], None]
            ) -> tuple[dict[str, Any], Any, dict[str, Any], Any, float]:
    """After the sweep: write sweep.json, fit the levels, calibrate the cost model on them
    and build what the report draws (`views.demo_views`). Returns the sweep dict, the fit,
    the views, the calibration and the uncalibrated median |error|."""
    from bstar import __version__, safeio

    sweep = result.to_dict()
    sweep_json = out / "sweep.json"
    # The first key is the header that marks the file as bstar's (bstar.safeio: an earlier
    # demo's sweep.json is replaced, a user's file of that name is not).
    text = json.dumps({"generator": f"bstar {__version__}", **sweep}, indent=2) + "\n"
    safeio.write_output(sweep_json, text.encode(), "-o")

    from bstar.fit import fit_points, load_points, prefill_aware

    points = load_points(sweep_json)
    top = max(points.batch)
    predict = [2 * top, 4 * top]
    say(f"fitting {len(points.batch)} measured levels, predicting batch {predict[0]} and "
        f"{predict[1]}")
    from bstar.report.views import demo_views

    # Throughput extrapolated in the quantity measured: output tokens with each prefill.
    fit = prefill_aware(fit_points(points, predict=predict), sweep)
    calibration, uncalibrated = _calibrate(result, out / "calibration.toml")
    say(f"calibrated the cost model on its own {len(calibration.points)} levels: median "
        f"|error| {calibration.median_abs_error:.1%} (uncalibrated {uncalibrated:.1%}; roof "
        f"shape k = {calibration.eff.roof_sharpness:g}); predicting with it and replaying "
        "the levels in the simulator")
    views = demo_views(sweep, fit, calibration.apply(_deployment(sweep)),
                       calibration_summary(calibration, uncalibrated),
                       "The tiny model on this CPU, four ways")
    return sweep, fit, views, calibration, uncalibrated


def _deployment(sweep: dict[str, Any]) -> Any:
    from bstar.report.views import sweep_deployment

    return sweep_deployment(sweep.get("options") or {})


def calibration_summary(calibration: Any, uncalibrated: float) -> dict[str, Any]:
    """What the report says the calibrated prediction rests on, from the calibration."""
    return {"levels": len(calibration.points), "metric": CALIBRATION_METRIC,
            "metric_words": "their median inter-token gap: one decode step",
            "median_abs_error": calibration.median_abs_error,
            "uncalibrated_median_abs_error": uncalibrated,
            "roof_sharpness": calibration.eff.roof_sharpness}


CALIBRATION_METRIC = "itl_p50"


def _calibrate(result: Any, path: Path) -> tuple[Any, float]:
    """The cost model calibrated on the demo's own levels (their median inter-token gap:
    one decode step), from the llama.cpp profile's priors on the probed CPU
    (`calibrate.calibrate_own_levels`); written as a profile. The report's prediction is a
    proof of the method, not of the defaults."""
    from bstar import calibrate as cal
    from bstar import safeio

    c, uncalibrated = cal.calibrate_own_levels(
        _deployment(result.to_dict()), cal.steps_from_sweep(result, CALIBRATION_METRIC),
        source=f"bstar demo run {result.run_id}")
    safeio.write_output(path, cal.profile_toml(c).encode(), "-o")
    return c, uncalibrated


def _probe(path: Path, threads: int) -> None:
    """A quick `bstar probe` of this CPU at llama.cpp's thread count (small arrays, 3 runs:
    about a second), written as a GPU file the cost model and the simulator read."""
    from bstar import safeio
    from bstar.probe import probe_cpu_toml

    text = probe_cpu_toml(threads, copy_bytes=128 << 20, gemm_n=1024, repeats=3)
    safeio.write_output(path, text.encode(), "-o")


# llama.cpp holds the tiny model in fp32 (the GGUF is F32) and its KV cache in f16.
DEPLOYMENT = {"weight_dtype": "fp32", "kv_dtype": "fp16", "engine": "llama.cpp"}


def _sweep(url: str, levels: list[int], args: argparse.Namespace, db: Path, say: _Say,
           model_dir: Path, gpu_file: Path) -> Any:
    from bstar.loadgen.sweep import SweepConfig, run_sweep
    from bstar.report.views import sweep_deployment

    labels: dict[int, str] = {}

    def on_event(kind: str, data: dict[str, Any]) -> None:
        # One line per finished level keeps a minute-long wait readable.
        if kind == "level_start":
            labels[data["level"]] = data.get("label", "")
        elif kind == "level_end":
            tput = (data.get("stats") or {}).get("throughput_tok_s")
            say(f"  {labels.get(data['level'], data['level'])}: "
                + (f"{tput:,.1f} tok/s" if tput else str(data.get("status"))))

    cfg = SweepConfig(url=url, served_model="tiny", concurrency=levels,
                      input_len=args.input_len, output_len=args.output_len,
                      num_requests=args.num_requests, level_time_limit_s=120.0,
                      request_timeout_s=120.0, model=str(model_dir), gpu=str(gpu_file),
                      deployment={**DEPLOYMENT, "model": str(model_dir),
                                  "gpu": str(gpu_file)})
    return run_sweep(cfg, db=db, on_event=on_event,
                     deployment=sweep_deployment(cfg.to_options()))
