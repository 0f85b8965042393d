"""`bstar probe -o FILE`: measure this machine and write a GPU file (catalog schema)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bstar.commands.common import add_force_argument, positive_int


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="GPU file to write (TOML; use it with --gpu FILE)")
    add_force_argument(p)
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="what to measure: CUDA device 0 when torch sees one (auto), or the CPU")
    p.add_argument("--copy-mib", type=positive_int, default=None,
                   help="size of the copied array, MiB (default 512 on CPU, 2048 on CUDA)")
    p.add_argument("--gemm-n", type=positive_int, default=None,
                   help="side of the square GEMM (default 2048 on CPU, 8192 on CUDA)")
    p.add_argument("--repeats", type=positive_int, default=7,
                   help="timed runs of each measurement; the median is kept (default 7)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads to measure with (default: all this process may use); "
                        "match the engine's, e.g. llama.cpp --threads")
    p.add_argument("--json", action="store_true", help="print the written fields as JSON")


def run_probe(args: argparse.Namespace) -> int:
    import os
    import sys

    from bstar import probe as pr  # imports no numpy: BLAS's threads can still be set

    if args.threads and "numpy" not in sys.modules:
        # BLAS reads its thread count when numpy loads: set it first.
        for var in pr.BLAS_THREAD_VARS:
            os.environ[var] = str(args.threads)
    from bstar.errors import BstarError
    from bstar.specs.gpu import load_gpu_file

    if args.output.suffix not in ("", ".toml"):
        raise BstarError(f"{args.output}: bstar probe writes TOML; name the file *.toml")
    if args.device == "cuda" and not pr.cuda_available():
        raise BstarError("--device cuda: torch with a CUDA device is not importable here")
    sizes: dict[str, int] = {"repeats": args.repeats}
    if args.threads:
        if args.device == "cuda" or (args.device == "auto" and pr.cuda_available()):
            raise BstarError("--threads applies to a CPU probe")
        sizes["threads"] = args.threads
    if args.copy_mib:
        sizes["copy_bytes"] = args.copy_mib << 20
    if args.gemm_n:
        sizes["gemm_n"] = args.gemm_n
    pr.check_sizes(sizes, pr.cpu_memory_bytes()[0])
    try:
        result = pr.probe(args.device, **sizes)
    except MemoryError:
        raise BstarError("the probe's arrays do not fit in memory; give a smaller --gemm-n "
                         "or --copy-mib") from None
    try:
        args.output.write_text(result.to_toml())
    except OSError as e:
        raise BstarError(f"{args.output}: cannot write ({e.strerror})") from None
    gpu = load_gpu_file(args.output)  # what every command will read back
    from bstar.commands.emit import emit
    from bstar.report.text import print_probe

    return emit(args, lambda: {
        "file": str(args.output), **result.gpu_mapping(),
        "bandwidth_runs_bytes_s": list(result.bandwidth.runs),
        "read_bandwidth_runs_bytes_s":
            list(result.read_bandwidth.runs) if result.read_bandwidth else None,
        "matmul_runs_flops": {k: list(m.runs) for k, m in result.matmul.items()},
        "elapsed_s": result.elapsed_s}, lambda: print_probe(result, gpu, args.output))
