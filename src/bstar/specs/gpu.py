"""GpuSpec: datasheet (or measured) figures of one accelerator, and the bundled catalog.

Memory is exact bytes as the device reports it (nvidia-smi's MiB x 2**20): datasheets say
"80GB" for 81,920 MiB. Bandwidth and FLOP/s are decimal, as datasheets give them.

Beside the roofline's figures, each entry says what the kernels see (docs/gpus.md): the
architecture family, the precisions its tensor cores run natively, SMs and clock, board
power, and the path and latency of a small all-reduce. All of these are optional, so that
GPU files written before them still load; none of them prices a step yet.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from bstar import safeio
from bstar.errors import BstarError, closest
from bstar.specs.precision import get_precision

# Bounds of a GPU file's figures, far past any accelerator (an H200: 141 GB, 4.8e12 B/s,
# 1e15 FLOP/s), so that a typo or an infinity is an error, not a plan of nonsense
# ("ridge 0.0"). GpuSpec itself only asks for finite positive figures (calibration scales
# them).
MAX_MEMORY_BYTES = 2**50
# The smallest rate (B/s, FLOP/s) a figure may state, far below any accelerator's (and any
# CPU's): a typo, not a slow device.
MIN_RATE = 1e6
_MAX_RATE = {"hbm_bandwidth_bytes_s": 1e16, "interconnect_bytes_s": 1e16,
             "bf16_flops": 1e19, "fp16_flops": 1e19, "fp8_flops": 1e19, "int8_ops": 1e19,
             "fp4_flops": 1e19}

# Architecture families, as the kernels tell them apart (a kernel path is chosen per family:
# Hopper's wgmma, datacenter Blackwell's tcgen05, the sm_120 parts' mma.sync block-scaled
# path, CDNA's MFMA). "blackwell-rtx" is compute capability 12.x (RTX PRO / GeForce
# Blackwell): same formats as B200, other tensor-core instructions and kernels.
ARCHS = ("volta", "turing", "ampere", "ada", "hopper", "blackwell", "blackwell-rtx",
         "cdna2", "cdna3", "cdna4", "rdna3", "rdna4", "cpu")
# Formats a tensor core (matrix core) can run natively. All but the last two are
# bstar.specs.precision names; mxfp8 and mxfp6 are tensor-core formats no checkpoint
# precision of bstar's uses yet (OCP MX: e4m3/e2m3 values, one e8m0 scale per 32).
NATIVE_PRECISIONS = ("fp16", "bf16", "fp8", "int8", "int4", "nvfp4", "mxfp4")
TENSOR_ONLY_PRECISIONS = ("mxfp8", "mxfp6")
# How a tensor-parallel all-reduce travels between the GPUs of one instance.
ALLREDUCE_LINKS = ("nvlink-nvswitch", "nvlink-nvl72", "nvlink-bridge", "xgmi", "pcie", "none")
# Bounds of the descriptive figures: 0 is "unknown"; anything else in range.
_RANGE = {"boost_clock_mhz": (10.0, 10_000.0), "tdp_w": (1.0, 10_000.0),
          "allreduce_latency_us": (0.01, 1e6),
          # The power model's own figures (bstar.energy, docs/energy.md): 0 = its default.
          "idle_w": (0.1, 10_000.0), "power_limit_w": (1.0, 10_000.0),
          "power_memory_fraction": (0.01, 1.0), "power_exponent": (0.1, 10.0)}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    id: str
    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_s: float
    bf16_flops: float
    fp16_flops: float = 0.0
    fp8_flops: float = 0.0
    int8_ops: float = 0.0
    interconnect_bytes_s: float = 0.0  # total (both directions) per GPU, as datasheets state
    vendor: str = ""
    source: str = ""
    memory_source: str = ""
    provenance: str = "datasheet"  # or "measured" (bstar probe)
    # Streaming multiprocessors (AMD: compute units); 0 = unknown. Attention over one short
    # prompt chunk runs heads x query-tiles blocks: fewer blocks than SMs leave SMs idle.
    num_sms: int = 0
    # The chip as the kernels see it (docs/gpus.md); "" / () / 0 = unknown.
    fp4_flops: float = 0.0  # dense FP4 tensor rate (NVFP4 / MXFP4) where it is native
    arch: str = ""  # one of ARCHS
    native_precisions: tuple[str, ...] = ()  # NATIVE_PRECISIONS + TENSOR_ONLY_PRECISIONS
    boost_clock_mhz: float = 0.0
    tdp_w: float = 0.0  # board power (TDP / TBP / TGP) as the datasheet states it
    allreduce_link: str = ""  # one of ALLREDUCE_LINKS
    # One small-message (one-shot) all-reduce across the instance's GPUs, the whole
    # collective (not per log2 round); allreduce_source says whether measured or estimated.
    allreduce_latency_us: float = 0.0
    chip_source: str = ""  # where arch, precisions, SMs, clock and power come from
    allreduce_source: str = ""
    # The power model (bstar.energy, docs/energy.md); 0 / "" = its documented default.
    idle_w: float = 0.0  # board power with nothing running, clocks up (measured or guessed)
    # The power the model caps at where no datasheet TDP is published (tdp_w = 0): a guess
    # or an nvidia-smi power limit, said in power_source.
    power_limit_w: float = 0.0
    power_memory_fraction: float = 0.0  # share of (TDP - idle) a step saturating HBM draws
    power_exponent: float = 0.0  # k in idle + (TDP - idle) * u^k
    power_source: str = ""  # where idle, the limit and the curve come from

    def __post_init__(self) -> None:
        for k in ("id", "name", "vendor", "source", "memory_source", "provenance", "arch",
                  "allreduce_link", "chip_source", "allreduce_source", "power_source"):
            if not isinstance(getattr(self, k), str):
                raise BstarError(f"GPU {self.id!r}: {k} must be a string, got "
                                 f"{getattr(self, k)!r}")
        if not isinstance(self.memory_bytes, int) or self.memory_bytes <= 0:
            raise BstarError(f"GPU {self.id!r}: memory_bytes must be a positive integer")
        for k in ("hbm_bandwidth_bytes_s", "bf16_flops"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise BstarError(f"GPU {self.id!r}: {k} must be a positive finite number, "
                                 f"got {v!r}")
        if not isinstance(self.num_sms, int) or self.num_sms < 0:
            raise BstarError(f"GPU {self.id!r}: num_sms must be a non-negative integer")
        for k in ("fp16_flops", "fp8_flops", "int8_ops", "interconnect_bytes_s"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and v >= 0 and math.isfinite(v)):
                raise BstarError(f"GPU {self.id!r}: {k} must be a finite number, not "
                                 f"negative, got {v!r}")
        for k in _MAX_RATE:
            v = getattr(self, k)
            # A rate that is not 0 (unknown) is at least MIN_RATE: a subnormal one (5e-324)
            # halves to 0.0 in the all-reduce price and divides by zero.
            if v and v < MIN_RATE:
                raise BstarError(f"GPU {self.id!r}: {k} must be 0 (unknown) or at least "
                                 f"{MIN_RATE:g}, got {v!r}")
        self._check_chip()

    def _check_chip(self) -> None:
        """The descriptive fields: known names, finite figures in range."""
        if self.arch and self.arch not in ARCHS:
            raise BstarError(f"GPU {self.id!r}: unknown arch {self.arch!r} (one of: "
                             f"{', '.join(ARCHS)})" + closest(self.arch, ARCHS))
        if self.allreduce_link and self.allreduce_link not in ALLREDUCE_LINKS:
            raise BstarError(f"GPU {self.id!r}: unknown allreduce_link "
                             f"{self.allreduce_link!r} (one of: {', '.join(ALLREDUCE_LINKS)})"
                             + closest(self.allreduce_link, ALLREDUCE_LINKS))
        known = NATIVE_PRECISIONS + TENSOR_ONLY_PRECISIONS
        if not isinstance(self.native_precisions, tuple):
            raise BstarError(f"GPU {self.id!r}: native_precisions must be a list of names")
        for p in self.native_precisions:
            if p not in known:
                raise BstarError(f"GPU {self.id!r}: unknown native_precisions entry {p!r} "
                                 f"(one of: {', '.join(known)})" + closest(str(p), known))
        for k, (lo, hi) in _RANGE.items():
            v = getattr(self, k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise BstarError(f"GPU {self.id!r}: {k} must be a finite number, got {v!r}")
            if v and not lo <= v <= hi:
                raise BstarError(f"GPU {self.id!r}: {k} must be 0 (unknown) or between "
                                 f"{lo:g} and {hi:g}, got {v!r}")

    def peak_flops(self, compute: str) -> float:
        """Dense tensor rate for a compute dtype, falling back to 16-bit where the
        hardware has no faster path (e.g. fp8 on an A100 runs as 16-bit)."""
        rate = {"bf16": self.bf16_flops, "fp16": self.fp16_flops or self.bf16_flops,
                "fp8": self.fp8_flops, "int8": self.int8_ops}.get(compute, 0.0)
        return rate or self.bf16_flops

    @property
    def ridge_flops_per_byte(self) -> float:
        """Roofline ridge point (Williams et al. 2009): peak BF16 FLOP/s over HBM bytes/s."""
        return self.bf16_flops / self.hbm_bandwidth_bytes_s


_FIELDS = set(GpuSpec.__dataclass_fields__)
_NUMERIC = {"hbm_bandwidth_bytes_s", "bf16_flops", "fp16_flops", "fp8_flops", "int8_ops",
            "interconnect_bytes_s", "fp4_flops"}
_STRINGS = ("id", "name", "vendor", "source", "memory_source", "provenance", "arch",
            "allreduce_link", "chip_source", "allreduce_source", "power_source")


def _native_name(name: str) -> str:
    """A native-precision name as the catalog spells it: the precision vocabulary's own
    spelling for its aliases (fp8_e4m3 -> fp8, bfloat16 -> bf16), lower case otherwise."""
    key = name.strip().lower()
    if key in NATIVE_PRECISIONS or key in TENSOR_ONLY_PRECISIONS:
        return key
    try:
        return get_precision(key).name
    except BstarError:
        return key  # refused by GpuSpec with the list of known names


def gpu_from_mapping(gpu_id: str, d: Mapping[str, Any], where: str) -> GpuSpec:
    unknown = set(d) - _FIELDS
    if unknown:
        raise BstarError(f"{where}: unknown GPU field(s) {', '.join(sorted(unknown))}")
    for k in ("name", "memory_bytes", "hbm_bandwidth_bytes_s", "bf16_flops"):
        if k not in d:
            raise BstarError(f"{where}: GPU {gpu_id!r} is missing {k!r}")
    kw = dict(d)
    kw.setdefault("id", gpu_id)
    mem = kw["memory_bytes"]
    if isinstance(mem, float) and math.isfinite(mem) and mem.is_integer():
        if not 0 < mem <= MAX_MEMORY_BYTES:
            raise BstarError(f"{where}: memory_bytes must be a positive integer of at most "
                             f"2**50 (1 PiB), got {mem!r}")
        kw["memory_bytes"] = int(mem)
    if not isinstance(kw["memory_bytes"], int) or isinstance(kw["memory_bytes"], bool):
        raise BstarError(f"{where}: memory_bytes must be an integer number of bytes")
    for k in _NUMERIC & set(kw):
        if isinstance(kw[k], bool) or not isinstance(kw[k], int | float):
            raise BstarError(f"{where}: {k} must be a number, got {kw[k]!r}")
        kw[k] = float(kw[k])
        if not (math.isfinite(kw[k]) and kw[k] <= _MAX_RATE[k]):
            raise BstarError(f"{where}: {k} must be a finite number of at most "
                             f"{_MAX_RATE[k]:g}, got {kw[k]!r}")
    if not 0 < kw["memory_bytes"] <= MAX_MEMORY_BYTES:
        raise BstarError(f"{where}: memory_bytes must be a positive integer of at most "
                         f"2**50 (1 PiB), got {kw['memory_bytes']!r}")
    sms = kw.get("num_sms", 0)
    if isinstance(sms, bool) or not isinstance(sms, int) or not 0 <= sms <= 1_000_000:
        raise BstarError(f"{where}: num_sms must be an integer between 0 and 1000000, "
                         f"got {sms!r}")
    for k in _STRINGS:
        if k in kw and not isinstance(kw[k], str):
            raise BstarError(f"{where}: {k} must be a string, got {kw[k]!r}")
    for k in ("arch", "allreduce_link"):
        if k in kw:
            kw[k] = kw[k].strip().lower()
    if "native_precisions" in kw:
        names = kw["native_precisions"]
        if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
            raise BstarError(f"{where}: native_precisions must be a list of precision names "
                             f"(strings), got a {type(names).__name__}")
        kw["native_precisions"] = tuple(dict.fromkeys(_native_name(n) for n in names))
    for k in _RANGE.keys() & kw.keys():
        if isinstance(kw[k], bool) or not isinstance(kw[k], int | float):
            raise BstarError(f"{where}: {k} must be a number, got {kw[k]!r}")
        try:
            kw[k] = float(kw[k])
        except OverflowError:
            raise BstarError(f"{where}: {k} must be a finite number, got an integer too "
                             "large for a float") from None
    try:
        return GpuSpec(**kw)
    except BstarError as e:
        raise BstarError(f"{where}: {e}") from None


@cache
def gpu_catalog() -> dict[str, GpuSpec]:
    text = resources.files("bstar.presets").joinpath("gpus.toml").read_text()
    data = tomllib.loads(text)
    return {k: gpu_from_mapping(k, v, f"gpus.toml [{k}]") for k, v in data.items()}


def load_gpu_file(path: Path) -> GpuSpec:
    """A user GPU file: TOML or JSON, one table in the catalog's schema (optionally under
    its id, as in the catalog)."""
    text = safeio.read_text(path, what="GPU file (TOML or JSON)")
    data = (safeio.parse_json(text, str(path)) if path.suffix == ".json"
            else safeio.parse_toml(text, str(path)))
    if not isinstance(data, dict):
        raise BstarError(f"{path}: expected a table of GPU fields")
    if "name" not in data and len(data) == 1 and isinstance(next(iter(data.values())), dict):
        gpu_id, data = next(iter(data.items()))
    else:
        gpu_id = str(data.get("id", path.stem))
    return gpu_from_mapping(gpu_id, data, str(path))


def get_gpu(name: str) -> GpuSpec:
    """A catalog id (case-insensitive) or a path to a TOML/JSON GPU file."""
    p = Path(name)
    if p.suffix in (".toml", ".json") or p.is_file():
        return load_gpu_file(p)
    cat = gpu_catalog()
    key = name.lower().replace("_", "-").replace(" ", "-")
    if key in cat:
        return cat[key]
    raise BstarError(f"unknown GPU {name!r}" + closest(key, cat) + " (see `bstar gpus`)")
