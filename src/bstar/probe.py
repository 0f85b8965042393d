"""`bstar probe`: measure the local device's achievable memory bandwidth and matmul rate.

The planner's roofline needs three figures per device: memory size, bandwidth and peak
matmul rate. Datasheets give ceilings no engine reaches; this module measures what the
device in front of you actually sustains and writes it as a GPU file in the catalog's
schema (`provenance = "measured"`), so `--gpu FILE` works with it like any catalog GPU.

- bandwidth: a large array copy (far larger than any cache), several threads at once on
  CPU (one numpy copy uses one core; an inference engine streams weights from all its
  threads). Bytes counted = read + write, 2 x the array size: large copies use
  non-temporal stores (glibc memcpy, CUDA copy kernels), so the destination is not read
  first. The median of several runs is kept, robust to one slow run. On CPU a read-only
  stream is measured too, a float32 matrix-vector product over a matrix as large as the
  copy (the kernel of a batch-1 decode step; bytes = the matrix): a copy's writes can
  cost more than reads, so a copy alone understates what decode reads. The larger of
  the two medians is filed as the achievable bandwidth, and both are written down.
- matmul: a large square GEMM, 2 * n^3 FLOPs, median of several runs. On CPU float32 (numpy
  has no bf16 GEMM, and a float32 model computes in float32); on CUDA bf16 (and fp16),
  through torch when torch and a CUDA device are importable.
- memory: /proc/meminfo MemTotal (CPU) or the CUDA device's total memory.

The measurement functions take their sizes as parameters so tests can run them small.
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bstar.units import MiB

# The variables BLAS libraries read for their thread count, once, when numpy loads them.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

# Defaults sized for a few seconds on a 2-core CPU and well under 20 s on slow ones:
# 512 MiB copies (far past any L3) and a 2048^3 GEMM (17 GFLOP: long enough to hide
# start-up and thread wake-up; the median of 7 absorbs a noisy neighbour).
DEFAULT_COPY_BYTES = 512 << 20
DEFAULT_GEMM_N = 2048
DEFAULT_REPEATS = 7


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured rate: every run's value, and the median that is used."""

    name: str
    unit: str
    runs: tuple[float, ...]
    how: str

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the runs were."""
        return (max(self.runs) - min(self.runs)) / self.median if self.median else math.inf


@dataclass(frozen=True, slots=True)
class ProbeResult:
    device: str  # "cpu" or "cuda"
    name: str
    memory_bytes: int
    memory_how: str
    bandwidth: Measurement  # copy, read + write bytes
    matmul: dict[str, Measurement]  # by dtype: "fp32", "bf16", "fp16"
    threads: int
    versions: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0
    read_bandwidth: Measurement | None = None  # read-only stream (GEMV), where measured
    vendor: str = ""  # the GPU file's vendor: "nvidia", "amd" (ROCm); "" -> the device

    @property
    def bandwidth_bytes_s(self) -> float:
        """The achievable figure filed: the better of the copy and the read stream."""
        return max(self.bandwidth.median,
                   self.read_bandwidth.median if self.read_bandwidth else 0.0)

    @property
    def gpu_id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return f"probed-{self.device}-{slug}"[:64].rstrip("-")

    def compute_flops(self) -> float:
        """The rate to file under the catalog's bf16_flops: bf16 where the device has a
        bf16 GEMM; float32 on CPU, where bstar's fp32 weights (compute "bf16" in the
        precision table) run float32 GEMMs."""
        for k in ("bf16", "fp16", "fp32"):
            if k in self.matmul:
                return self.matmul[k].median
        raise ValueError("no matmul measurement")

    def source_line(self) -> str:
        mm = ", ".join(f"{len(m.runs)} x {k} GEMM {m.how}" for k, m in self.matmul.items())
        ver = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        bw = (f"bandwidth = the larger of: median of {len(self.bandwidth.runs)} x "
              f"{self.bandwidth.how}, read+write bytes ({self.bandwidth.median / 1e9:.1f} GB/s)")
        if self.read_bandwidth:
            r = self.read_bandwidth
            bw += (f"; median of {len(r.runs)} x {r.how}, bytes read "
                   f"({r.median / 1e9:.1f} GB/s)")
        return (f"bstar probe on {self.device} ({self.threads} threads): {bw}; "
                f"matmul = median of {mm}; memory from {self.memory_how}; {ver}")

    def gpu_mapping(self) -> dict[str, Any]:
        """The GPU file's fields, catalog schema (bstar.specs.gpu)."""
        d: dict[str, Any] = {
            "id": self.gpu_id,
            "name": self.name,
            "vendor": self.vendor or self.device,
            "memory_bytes": int(self.memory_bytes),
            "memory_source": self.memory_how,
            "hbm_bandwidth_bytes_s": float(self.bandwidth_bytes_s),
            "bf16_flops": float(self.compute_flops()),
            "provenance": "measured",
            "source": self.source_line(),
        }
        if "fp16" in self.matmul:
            d["fp16_flops"] = float(self.matmul["fp16"].median)
        return d

    def to_toml(self) -> str:
        lines = [
            "# Measured by `bstar probe`; load with --gpu THIS_FILE.",
            f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
            f"took {self.elapsed_s:.1f} s",
            f"# copy bandwidth runs (GB/s): {_fmt_runs(self.bandwidth.runs, 1e9)}",
        ]
        if self.read_bandwidth:
            lines.append(f"# read bandwidth runs (GB/s): "
                         f"{_fmt_runs(self.read_bandwidth.runs, 1e9)}")
        if self.device == "cpu":
            lines.append("# bf16_flops holds the measured float32 GEMM rate: this CPU path has "
                         "no bf16 GEMM, and fp32 weights compute at it.")
        for k, m in self.matmul.items():
            lines.append(f"# {k} GEMM runs (GFLOP/s): {_fmt_runs(m.runs, 1e9)}")
        for k, v in self.gpu_mapping().items():
            lines.append(f"{k} = {_toml_value(v)}")
        return "\n".join(lines) + "\n"


def _fmt_runs(runs: tuple[float, ...], scale: float) -> str:
    return ", ".join(f"{r / scale:.1f}" for r in runs)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)  # Python's float repr (1.5e+10, 123.0) is valid TOML
    # JSON strings with ASCII escapes are valid TOML basic strings.
    return json.dumps(str(v), ensure_ascii=True)


def _median_rate(work: float, fn: Callable[[], None], repeats: int) -> tuple[float, ...]:
    fn()  # warm-up: page faults, thread pool start, BLAS dispatch
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        rates.append(work / (time.perf_counter() - t0))
    return tuple(rates)


# ---- CPU (numpy) ----------------------------------------------------------------------------
def cpu_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cpu_bandwidth(copy_bytes: int = DEFAULT_COPY_BYTES, repeats: int = DEFAULT_REPEATS,
                  threads: int | None = None) -> Measurement:
    """Copy `copy_bytes` split over `threads` threads; numpy releases the GIL in copies."""
    import numpy as np

    threads = threads or cpu_threads()
    n = max(copy_bytes // 8 // threads, 1)
    srcs = [np.ones(n, dtype=np.float64) for _ in range(threads)]
    dsts = [np.zeros(n, dtype=np.float64) for _ in range(threads)]
    moved_bytes = 2.0 * 8 * n * threads  # read source + write destination

    with ThreadPoolExecutor(threads) as pool:
        def copy_all() -> None:
            list(pool.map(lambda i: np.copyto(dsts[i], srcs[i]), range(threads)))

        runs = _median_rate(moved_bytes, copy_all, repeats)
    how = f"{threads}-thread copy of {_mib(8 * n * threads)}"
    return Measurement("bandwidth", "bytes/s", runs, how)


def cpu_read_bandwidth(read_bytes: int = DEFAULT_COPY_BYTES,
                       repeats: int = DEFAULT_REPEATS) -> Measurement:
    """float32 GEMV y = W x over a `read_bytes` matrix (BLAS threads it): the bytes of W
    are read once per run; x and y (a few KiB) stay in cache."""
    import numpy as np

    cols = 4096
    rows = max(read_bytes // 4 // cols, 1)
    w = np.ones((rows, cols), dtype=np.float32)
    x = np.ones(cols, dtype=np.float32)
    y = np.empty(rows, dtype=np.float32)
    runs = _median_rate(float(w.nbytes), lambda: np.matmul(w, x, out=y), repeats)
    return Measurement("read-bandwidth", "bytes/s", runs,
                       f"float32 GEMV over a {_mib(w.nbytes)} matrix (numpy BLAS)")


def cpu_matmul(n: int = DEFAULT_GEMM_N, repeats: int = DEFAULT_REPEATS) -> Measurement:
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), dtype=np.float32)
    runs = _median_rate(2.0 * n**3, lambda: np.matmul(a, b, out=c), repeats)
    return Measurement("matmul-fp32", "flop/s", runs, f"n={n} float32 (numpy)")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def cpu_memory_bytes() -> tuple[int, str]:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024, "/proc/meminfo MemTotal"
    except (OSError, ValueError, IndexError):
        pass
    pages, page = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return int(pages * page), "sysconf(SC_PHYS_PAGES) x SC_PAGE_SIZE"


def check_sizes(sizes: dict[str, int], memory_bytes: int) -> None:
    """The arrays a probe holds at once (the copy's source and destination; GEMM's A, B
    and C in float32) must fit in half of this machine's memory: `--gemm-n 1000000` asks
    for 12 TB."""
    from bstar.errors import BstarError
    from bstar.units import fmt_bytes

    need = max(2 * sizes.get("copy_bytes", 0), 3 * 4 * sizes.get("gemm_n", 0) ** 2)
    if need > memory_bytes // 2:
        raise BstarError(f"--gemm-n/--copy-mib: the probe would hold {fmt_bytes(need)}, over "
                         f"half of this machine's memory ({fmt_bytes(memory_bytes)})")


def probe_cpu(copy_bytes: int = DEFAULT_COPY_BYTES, gemm_n: int = DEFAULT_GEMM_N,
              repeats: int = DEFAULT_REPEATS, threads: int | None = None) -> ProbeResult:
    """`threads` sets the copy's threads; BLAS (the GEMV and GEMM) uses what the process
    allows (OPENBLAS_NUM_THREADS, set before numpy loads: `bstar probe --threads`)."""
    import numpy as np

    t0 = time.perf_counter()
    mem, how = cpu_memory_bytes()
    bw = cpu_bandwidth(copy_bytes, repeats, threads)
    read = cpu_read_bandwidth(copy_bytes, repeats)
    mm = cpu_matmul(gemm_n, repeats)
    return ProbeResult("cpu", cpu_name(), mem, how, bw, {"fp32": mm}, threads or cpu_threads(),
                       {"numpy": np.__version__, "python": platform.python_version()},
                       time.perf_counter() - t0, read_bandwidth=read)


def probe_cpu_toml(threads: int, copy_bytes: int = DEFAULT_COPY_BYTES,
                   gemm_n: int = DEFAULT_GEMM_N, repeats: int = DEFAULT_REPEATS) -> str:
    """`probe_cpu` at exactly `threads` threads, BLAS included, as its TOML. BLAS reads its
    thread count when numpy loads, so the probe runs in a fresh interpreter with
    OPENBLAS/OMP/MKL_NUM_THREADS set: an engine given N threads is compared with N threads'
    bandwidth and matmul rate, not with the whole machine's."""
    import subprocess
    import sys

    from bstar.errors import BstarError

    env = {**os.environ, **dict.fromkeys(BLAS_THREAD_VARS, str(threads))}
    code = ("import sys; from bstar.probe import probe_cpu; "
            f"sys.stdout.write(probe_cpu({copy_bytes}, {gemm_n}, {repeats}, {threads})"
            ".to_toml())")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise BstarError(f"the CPU probe failed: {r.stderr.strip()[-500:]}")
    return r.stdout


# ---- CUDA (torch) ---------------------------------------------------------------------------
def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def probe_cuda(copy_bytes: int = 2 << 30, gemm_n: int = 8192,
               repeats: int = DEFAULT_REPEATS) -> ProbeResult:
    """Device-to-device copy and bf16/fp16 GEMMs on CUDA device 0, timed with
    synchronisation around each run (kernel launch cost is negligible at these sizes)."""
    import torch

    t0 = time.perf_counter()
    dev = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(dev)

    def timed(work: float, fn: Callable[[], object]) -> tuple[float, ...]:
        def run() -> None:
            fn()
            torch.cuda.synchronize(dev)
        return _median_rate(work, run, repeats)

    def copy_rate() -> Measurement:
        n = copy_bytes // 2
        src = torch.ones(n, dtype=torch.bfloat16, device=dev)
        dst = torch.empty_like(src)
        return Measurement("bandwidth", "bytes/s", timed(2.0 * 2 * n, lambda: dst.copy_(src)),
                           f"device copy of {_mib(2 * n)} (torch)")

    def gemm_rate(name: str, dt: Any) -> Measurement:
        a = torch.randn(gemm_n, gemm_n, dtype=dt, device=dev)
        b = torch.randn(gemm_n, gemm_n, dtype=dt, device=dev)
        return Measurement(f"matmul-{name}", "flop/s", timed(2.0 * gemm_n**3, lambda: a @ b),
                           f"n={gemm_n} {name} (torch)")

    # Each helper's tensors are freed on return, before the next allocates.
    bw = copy_rate()
    matmul = {"bf16": gemm_rate("bf16", torch.bfloat16),
              "fp16": gemm_rate("fp16", torch.float16)}
    torch.cuda.empty_cache()
    vendor, versions = cuda_vendor(torch)
    return ProbeResult("cuda", props.name, int(props.total_memory),
                       "torch.cuda.get_device_properties total_memory", bw, matmul, 1,
                       {"torch": torch.__version__, **versions},
                       time.perf_counter() - t0, vendor=vendor)


def cuda_vendor(torch: Any) -> tuple[str, dict[str, str]]:
    """Who made torch's "cuda" device, and the runtime's version: ROCm builds of torch
    expose AMD GPUs through the same torch.cuda API and set torch.version.hip."""
    hip = getattr(torch.version, "hip", None)
    if hip:
        return "amd", {"hip": str(hip)}
    return "nvidia", {"cuda": str(torch.version.cuda)}


def probe(device: str = "auto", **sizes: int) -> ProbeResult:
    """Probe CUDA device 0 when `device` is "cuda" (or "auto" and one is usable), else CPU."""
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be auto, cpu or cuda, got {device!r}")
    if device == "cuda" or (device == "auto" and cuda_available()):
        return probe_cuda(**sizes)
    return probe_cpu(**sizes)


def _mib(n: float) -> str:
    return f"{n / MiB:.0f} MiB"
