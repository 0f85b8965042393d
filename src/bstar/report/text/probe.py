"""`bstar probe`: what was measured on this machine and the GPU file written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bstar.units import GiB


def print_probe(result: Any, gpu: Any, output: Path) -> None:
    """A `probe.ProbeResult` and the GpuSpec read back from the file it wrote."""
    from bstar.report.text._common import clean_text

    print(f"{clean_text(gpu.name)} ({result.device}, {result.threads} threads), "
          f"{result.elapsed_s:.1f} s")
    print(f"  memory     {gpu.memory_bytes / GiB:.1f} GiB ({result.memory_how})")
    print(f"  bandwidth  {gpu.hbm_bandwidth_bytes_s / 1e9:.1f} GB/s  (filed: the larger of)")
    for m in (result.bandwidth, result.read_bandwidth):
        if m is not None:
            print(f"    {m.median / 1e9:8.1f} GB/s  {m.how} (runs spread {m.spread:.0%})")
    for k, m in result.matmul.items():
        print(f"  {k} GEMM  {m.median / 1e9:.1f} GFLOP/s  (runs spread {m.spread:.0%})")
    print(f"  ridge      {gpu.ridge_flops_per_byte:.1f} FLOP/byte")
    print(f"wrote {output} (id {gpu.id}); use it with --gpu {output}")
