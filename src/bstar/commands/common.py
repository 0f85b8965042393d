"""Argument helpers shared by commands. Standard library only at top level: imported at
start-up (the library types they map flags onto load inside the functions)."""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from bstar.deployment import Deployment
    from bstar.options import DeploymentOptions

T = TypeVar("T")


def _list_of(kind: Callable[[str], T], what: str) -> Callable[[str], list[T]]:
    def parse(text: str) -> list[T]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}")
        out = []
        for s in items:
            try:
                out.append(kind(s))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{s!r} is not {what}") from None
        return out
    return parse


def _int_token(s: str) -> int:
    # Accept 2048, 2_048, 2k, 8K, 1M for token counts and batch sizes.
    t = s.lower().replace("_", "")
    mult = 1
    if t.endswith("k"):
        t, mult = t[:-1], 1024
    elif t.endswith("m"):
        t, mult = t[:-1], 1024 * 1024
    return int(t) * mult


int_list = _list_of(_int_token, "an integer")
def _finite(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise ValueError(s)
    return v


float_list = _list_of(_finite, "a finite number")
str_list = _list_of(str, "a name")


def finite_float(s: str) -> float:
    """Any finite number (no nan, inf)."""
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a number") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {s}")
    return v


def _number(s: str, *, positive: bool) -> float:
    v = finite_float(s)
    if positive and not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {s}")
    if not positive and not v >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {s}")
    return v


def positive_float(s: str) -> float:
    return _number(s, positive=True)


def non_negative_float(s: str) -> float:
    return _number(s, positive=False)


def at_most(limit: float, unit: str) -> Callable[[str], float]:
    """A non-negative finite number no larger than `limit`: a flag whose value is later
    multiplied (GiB -> bytes, ms -> s) stays finite after the arithmetic too."""
    def parse(s: str) -> float:
        v = non_negative_float(s)
        if v > limit:
            raise argparse.ArgumentTypeError(f"must be at most {limit:,.0f} {unit}, got {s}")
        return v
    return parse


# 1 PiB (2**50 bytes, specs/gpu.MAX_MEMORY_BYTES): past any accelerator or host's memory.
gib_amount = at_most(1024 * 1024, "GiB (1 PiB)")
# An engine step costs milliseconds; 10 s per step (or per sequence of a step) is no engine's.
step_ms = at_most(10_000, "ms (10 s a step)")
step_us = at_most(10_000_000, "us (10 s a step)")


def add_electricity_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--electricity-usd-per-kwh: the price the energy per output token is costed at
    (bstar.energy, docs/energy.md)."""
    from bstar.units import DEFAULT_ELECTRICITY_USD_PER_KWH

    p.add_argument("--electricity-usd-per-kwh", type=non_negative_float,
                   default=DEFAULT_ELECTRICITY_USD_PER_KWH, metavar="USD",
                   help="electricity price the energy per output token is costed at "
                        f"(default {DEFAULT_ELECTRICITY_USD_PER_KWH:g} $/kWh; docs/energy.md)")


def add_force_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--force for a parser with -o or --plot (once, however many of those it has)."""
    if "--force" in p._option_string_actions:
        return
    p.add_argument("--force", action="store_true",
                   help="overwrite an existing -o/--plot file that bstar did not write")


# What each command's -o writes (bstar.safeio's kinds): it may replace only a file of that
# kind that bstar wrote (a calibration profile never replaces a report).
OUTPUT_KINDS = {"report": ("html",), "calibrate": ("profile",), "probe": ("probe",)}
PLOT_KINDS = ("png", "svg")


def guard_outputs(args: argparse.Namespace) -> None:
    """Before a command runs: its -o FILE and --plot FILE may replace only a file bstar
    wrote of the same kind (an earlier report, plot, profile or probe), recognised by the
    header bstar writes at its start, unless --force (bstar.safeio). `runs export -o`
    keeps its own rule (it also accepts an earlier export)."""
    from bstar import safeio

    force = bool(getattr(args, "force", False))
    out = getattr(args, "output", None)
    command = getattr(args, "command", "")
    if out and command != "runs":
        safeio.check_output(out, "-o", force, OUTPUT_KINDS.get(command, safeio.OWN_KINDS))
    if plot := getattr(args, "plot", None):
        safeio.check_output(plot, "--plot", force, PLOT_KINDS)


# ---- `bstar report SOURCE`: the page's file, the command line it shows, the reply ----------
def add_report_output(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, metavar="FILE.html",
                   help="where to write the report (one self-contained HTML file)")
    add_force_argument(p)


def command_line() -> str:
    """The command as typed, when bstar was started as a program (not from a test harness);
    shown on a report's page."""
    import shlex
    import sys
    from pathlib import Path

    prog = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path()
    if prog.name == "bstar" or (prog.name == "__main__.py" and prog.parent.name == "bstar"):
        return shlex.join(["bstar", *sys.argv[1:]])
    return ""


def report_written(args: argparse.Namespace,
                   write: Callable[[], tuple[Any, dict[str, Any] | None]]) -> int:
    """Run `write` (it writes the report and returns its path and what --json adds), then
    say where it went; a file that cannot be written is one line, not a traceback."""
    from bstar.commands.emit import emit
    from bstar.errors import BstarError

    try:
        path, extra = write()
    except OSError as e:
        # The report's file (or --plot's) on a read-only or missing folder: one line.
        where = e.filename or args.output
        raise BstarError(f"cannot write {where}: {e.strerror or e}") from None
    return emit(args, lambda: {"report": str(path), **(extra or {})},
                lambda: print(f"report written to {path}"))


def positive_int(s: str) -> int:
    try:
        v = _int_token(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {s}")
    return v


def non_negative_int(s: str) -> int:
    """A count that may be 0 (off), at most 2**20."""
    try:
        v = _int_token(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if not 0 <= v <= 1 << 20:
        raise argparse.ArgumentTypeError(f"must be in 0..{1 << 20}, got {s}")
    return v


SEED_MAX = 2**63 - 1


def seed_int(s: str) -> int:
    """A random seed: an integer in 0 .. 2**63 - 1 (what numpy's generators take)."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
    if not 0 <= v <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2**63 - 1, got {s}")
    return v


positive_int_list = _list_of(positive_int, "a positive integer")


def add_deployment_arguments(p: argparse.ArgumentParser, *, many: bool = False) -> None:
    """--model/--gpu/--num-gpus/precision/memory/efficiency flags, the fields of
    `bstar.options.DeploymentOptions` (`deployment_options` maps them)."""
    from bstar.engine_defaults import BLOCK_SIZE, DEFAULT_RESERVE_GIB, GPU_MEMORY_UTILIZATION

    g = p.add_argument_group("model and hardware")
    if many:
        g.add_argument("--model", type=str_list, default=None,
                       help="preset names or config.json paths, comma-separated")
        g.add_argument("--gpu", type=str_list, default=None,
                       help="GPU catalog ids or GPU files (TOML/JSON), comma-separated")
    else:
        g.add_argument("--model", default=None,
                       help="preset name, config.json (or its folder), or hub id when online "
                            "(default: llama-3-8b)")
        g.add_argument("--gpu", default=None,
                       help="GPU catalog id or a GPU file (TOML/JSON) (default: a100-80gb-sxm)")
    g.add_argument("--num-gpus", "--tensor-parallel-size", dest="num_gpus", type=positive_int,
                   default=1, help="tensor-parallel degree (default: 1)")
    g.add_argument("--data-parallel-size", dest="data_parallel_size", type=positive_int,
                   default=1,
                   help="attention data-parallel ranks (vLLM --data-parallel-size: "
                        "--num-gpus is each rank's tensor-parallel size, the GPUs are "
                        "their product; with --enable-dp-attention, SGLang's --dp: --num-gpus "
                        "is all the GPUs and each rank takes num-gpus / dp of them; default "
                        "1). Each rank runs its own sequences' attention and holds their KV")
    g.add_argument("--enable-dp-attention", action="store_true",
                   help="SGLang's spelling: attention data parallel inside --num-gpus GPUs "
                        "(--data-parallel-size ranks, default one a GPU)")
    g.add_argument("--expert-parallel-size", "--ep-size", dest="expert_parallel_size",
                   type=positive_int, default=None,
                   help="GPUs the routed experts are split over, each holding whole experts "
                        "(SGLang --ep-size, TensorRT-LLM --ep_size; default 1: tensor-parallel "
                        "experts)")
    g.add_argument("--enable-expert-parallel", action="store_true",
                   help="vLLM's spelling: expert parallel over all the GPUs")
    g.add_argument("--assume-unmodeled", action="store_true",
                   help="read a config whose layer kind, quantization method or memory key "
                        "bstar does not model on a stated assumption (unknown layers as full "
                        "attention, unknown quantization as the config's dtype; "
                        "docs/models.md) instead of refusing it; the same as "
                        "BSTAR_ASSUME_UNMODELED=1")
    g.add_argument("--dtype", default="",
                   help="weight precision: bf16, fp16, fp8, int8, int4 (W4A16, group 128) "
                        "(default: the checkpoint's)")
    g.add_argument("--kv-dtype", "--kv-cache-dtype", dest="kv_dtype", default="bf16",
                   help="KV cache precision: bf16, fp16, fp8")
    g.add_argument("--gpu-util", "--gpu-memory-utilization", dest="gpu_util",
                   type=positive_float, default=GPU_MEMORY_UTILIZATION,
                   help="fraction of GPU memory the engine may use (vLLM "
                        f"--gpu-memory-utilization; default {GPU_MEMORY_UTILIZATION:g})")
    g.add_argument("--reserve-gib", type=gib_amount, default=None,
                   help="per-GPU memory kept for activations, CUDA graphs and context, GiB; "
                        "given, it wins over a --profile's measured reserve (default: the "
                        f"profile's, else {DEFAULT_RESERVE_GIB:g})")
    g.add_argument("--block-size", type=positive_int, default=BLOCK_SIZE,
                   help=f"KV cache block size in tokens (default {BLOCK_SIZE})")
    e = p.add_argument_group("efficiency (stated defaults; replace by calibration)")
    e.add_argument("--bw-eff", type=positive_float, default=None,
                   help="achieved fraction of peak HBM bandwidth by the weight stream "
                        "(default 0.80)")
    e.add_argument("--flops-eff", type=positive_float, default=None,
                   help="achieved fraction of dense peak FLOP/s (default 0.70)")
    e.add_argument("--overhead-ms", type=step_ms, default=None,
                   help="per-step engine CPU overhead, ms (default: the engine profile's)")
    e.add_argument("--overhead-per-seq-us", type=step_us, default=None,
                   help="per-step overhead per running sequence, us (default: the engine "
                        "profile's)")
    e.add_argument("--engine", default="", metavar="NAME",
                   help="engine whose priors the cost model starts from: vllm (default), "
                        "vllm-v0, sglang, trt-llm, lmdeploy, llama.cpp, torch-graph "
                        "(docs/cost-model.md)")
    add_graph_arguments(e)
    e.add_argument("--ideal", action="store_true",
                   help="pure roofline: efficiencies 1, no overhead (the seeds' arithmetic)")
    e.add_argument("--profile", default=None, metavar="FILE",
                   help="calibration profile from `bstar calibrate`: its efficiencies, "
                        "overheads and reserve (flags above still override)")


def deployment_options(args: argparse.Namespace, model: str | None = None,
                       gpu: str | None = None) -> DeploymentOptions:
    """The deployment flags as `DeploymentOptions` (flags a command lacks keep the type's
    defaults); `model`/`gpu` replace --model/--gpu (for `compare`'s lists)."""
    from bstar.options import DeploymentOptions

    flags = {"model": model or _single(getattr(args, "model", None)),
             "gpu": gpu or _single(getattr(args, "gpu", None)),
             "num_gpus": getattr(args, "num_gpus", None),
             "weight_dtype": getattr(args, "dtype", None),
             "kv_dtype": getattr(args, "kv_dtype", None),
             "gpu_util": getattr(args, "gpu_util", None),
             "reserve_gib": getattr(args, "reserve_gib", None),
             "block_size": getattr(args, "block_size", None),
             "bw_eff": getattr(args, "bw_eff", None),
             "flops_eff": getattr(args, "flops_eff", None),
             "overhead_ms": getattr(args, "overhead_ms", None),
             "overhead_per_seq_us": getattr(args, "overhead_per_seq_us", None),
             "ideal": getattr(args, "ideal", None),
             "profile": getattr(args, "profile", None),
             "engine": getattr(args, "engine", None),
             "assume_unmodeled": getattr(args, "assume_unmodeled", None),
             "enforce_eager": getattr(args, "enforce_eager", None),
             "cuda_graph_max_tokens": getattr(args, "cuda_graph_max_tokens", None),
             **parallel_layout(args)}
    return DeploymentOptions.from_dict(flags)


def parallel_layout(args: argparse.Namespace) -> dict[str, int | None]:
    """num_gpus, expert_parallel and data_parallel from the engines' spellings
    (`add_deployment_arguments`): vLLM's --data-parallel-size multiplies the GPUs;
    SGLang's --enable-dp-attention splits --num-gpus into ranks; --enable-expert-parallel
    spreads the experts over all of them."""
    tp = getattr(args, "num_gpus", None)
    dp = getattr(args, "data_parallel_size", None) or 1
    if tp is None:
        return {}
    if getattr(args, "enable_dp_attention", False):
        total, ranks = tp, dp if dp > 1 else tp
    else:
        total, ranks = tp * dp, dp
    ep = getattr(args, "expert_parallel_size", None)
    if ep is None:
        ep = total if getattr(args, "enable_expert_parallel", False) else 1
    return {"num_gpus": total, "data_parallel": ranks, "expert_parallel": ep}


def _single(value: object) -> str | None:
    # compare's --model/--gpu are lists; its callers pass one entry as model/gpu.
    return value if isinstance(value, str) else None


def warn(message: str) -> None:
    """One warning line on stderr. A warning may quote a profile's or a run's strings
    (`[profile] gpu`): through clean_text, so they print as data, not terminal codes."""
    import sys

    from bstar.report.text._common import clean_text

    print(f"bstar: warning: {clean_text(message, WARNING_CHARS)}", file=sys.stderr)


WARNING_CHARS = 2000  # the most of one warning line that is printed (cli.ERROR_CHARS)


def build_deployment(args: argparse.Namespace, model: str | None = None,
                     gpu: str | None = None) -> Deployment:
    """`deployment_options(args, model, gpu).build()`, warnings to stderr."""
    return deployment_options(args, model, gpu).build(warn=warn)


def add_graph_arguments(e: Any) -> None:
    """The engines' CUDA graph settings (DeploymentOptions.enforce_eager and
    .cuda_graph_max_tokens), in their own spellings."""
    e.add_argument("--enforce-eager", "--disable-cuda-graph", dest="enforce_eager",
                   action="store_true",
                   help="no CUDA graphs (vLLM --enforce-eager, SGLang --disable-cuda-graph): "
                        "every step pays the eager launch floor (docs/cost-model.md)")
    e.add_argument("--cuda-graph-max-bs", "--max-cudagraph-capture-size",
                   dest="cuda_graph_max_tokens", type=positive_int, default=None,
                   metavar="N", help="the largest step a captured CUDA graph runs, tokens "
                                     "(SGLang --cuda-graph-max-bs, vLLM's max_cudagraph_"
                                     "capture_size; default: the engine profile's)")


def add_speculative_arguments(p: argparse.ArgumentParser) -> None:
    """--num-speculative-tokens/--acceptance-rate/--drafter (bstar.specdec)."""
    s = p.add_argument_group("speculative decoding (docs/cost-model.md)")
    s.add_argument("--num-speculative-tokens", dest="num_speculative_tokens",
                   type=positive_int, default=None, metavar="K",
                   help="draft tokens per step: price speculative decoding beside plain "
                        "decode (off when not given)")
    s.add_argument("--acceptance-rate", dest="acceptance_rate", type=acceptance_arg,
                   default=0.7, metavar="A",
                   help="probability each draft token is accepted (default 0.7), or "
                        "from:RUN: the rate `bstar sweep` read from vLLM's /metrics in a "
                        "run (a sweep --json file or a run id in the default results DB)")
    s.add_argument("--drafter", default="auto",
                   help="eagle (an EAGLE head: one decoder layer + the LM head), mtp (the "
                        "target's multi-token-prediction layer), ngram (prompt lookup, CPU "
                        "only) or a draft model's preset/config.json (default auto: mtp when "
                        "the model ships MTP layers, else eagle)")


def acceptance_arg(s: str) -> float | str:
    """--acceptance-rate: a number in [0, 1], or from:RUN (resolved once K is known)."""
    if s.startswith("from:") and len(s) > len("from:"):
        return s
    return non_negative_float(s)


def spec_config_from_args(args: argparse.Namespace) -> Any:
    """The SpecConfig the flags name (--acceptance-rate from:RUN resolved once K is known),
    or None when --num-speculative-tokens is not given."""
    k = getattr(args, "num_speculative_tokens", None)
    if k is None:
        return None
    from bstar.specdec import SpecConfig

    rate = args.acceptance_rate
    if isinstance(rate, str):  # from:RUN
        from bstar.loadgen.measured import measured_acceptance

        rate = measured_acceptance(rate.removeprefix("from:"), k)
        args.acceptance_rate = rate
    return SpecConfig(k, rate, args.drafter)


def speculative_from_args(args: argparse.Namespace, d: Deployment) -> tuple[Any, Any]:
    """(SpecConfig, Drafter) the flags name for deployment `d`, or (None, None) when
    --num-speculative-tokens is not given. A draft model is loaded here (presets, files)."""
    cfg = spec_config_from_args(args)
    if cfg is None:
        return None, None
    from bstar.specdec import AUTO_DRAFTER, DRAFTER_KINDS, make_drafter

    draft = None
    if args.drafter not in (*DRAFTER_KINDS, AUTO_DRAFTER):
        from bstar.specs.presets import get_model

        draft = get_model(args.drafter)
    return cfg, make_drafter(d, args.drafter, draft)


# ---- the traffic flags `bstar simulate` and `bstar search` share --------------------------


def add_backend_arguments(x: argparse._ArgumentGroup, what: str) -> None:
    """--jobs and --ray: where `what`'s simulations run (bstar.search.backends)."""
    x.add_argument("--jobs", type=positive_int, default=None,
                   help=f"worker processes for {what} (default 1: in this process); with "
                        "--ray, the local cluster's CPUs (default: all)")
    x.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run on Ray: a local cluster on 127.0.0.1, or an existing one at "
                        "ADDRESS (needs bstar[ray])")


@contextlib.contextmanager
def progress_ticks(label: str, quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr labelled `label`, as a `tick(done, total)` callback; None
    (no bar) when `quiet`. rich loads only here. Enter it after starting a process pool
    (its bar runs a thread; the pool forks)."""
    if quiet:
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=Console(stderr=True),
                  transient=True) as bar:
        task = bar.add_task(label, total=None)

        def tick(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield tick
