"""GPU telemetry while a sweep level runs: utilization, memory and board power of GPU 0,
from NVIDIA's NVML (`nvidia-ml-py`, module `pynvml`) or AMD's AMD SMI (`amdsmi`) where
they are installed and a local GPU answers. Both are optional: without them (or without a
GPU) `GpuTelemetry.create()` returns None and `power_source()` says why, once per sweep.

NVML's calls, as NVIDIA names them: nvmlInit, nvmlDeviceGetCount,
nvmlDeviceGetHandleByIndex, nvmlDeviceGetUtilizationRates (percent of the sample period a
kernel ran / the memory was read or written), nvmlDeviceGetMemoryInfo,
nvmlDeviceGetPowerUsage (milliwatts, the board's draw) and nvmlShutdown. AMD SMI's:
amdsmi_init, amdsmi_get_processor_handles, amdsmi_get_gpu_activity (gfx_activity,
umc_activity in percent), amdsmi_get_power_info (socket power in watts; unsupported fields
are "N/A" or 2**32 - 1) and amdsmi_shut_down. A test injects a fake module under either
name (sys.modules).
"""

from __future__ import annotations

import contextlib
import importlib
import math
from typing import Any

MAX_BOARD_W = 10_000.0  # a reading above this (2**32 - 1 "unsupported") is not a power


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _watts(v: Any) -> float | None:
    """A power reading in watts, or None when it is not one (N/A, unsupported, negative)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    w = float(v)
    return w if math.isfinite(w) and 0 < w < MAX_BOARD_W else None


class GpuTelemetry:
    """Samples GPU 0 (`sample()`), sums them up per level (`summary()`), lets go of the
    library (`close()`). `source` is "nvml" or "amdsmi"."""

    def __init__(self, lib: Any, handle: Any, source: str = "nvml") -> None:
        self._lib = lib
        self._handle = handle
        self.source = source
        self._sm: list[float] = []
        self._mem_bw: list[float] = []
        self._mem_used: list[float] = []
        self._power_w: list[float] = []
        self._closed = False

    @classmethod
    def create(cls) -> GpuTelemetry | None:
        """NVML's GPU 0, else AMD SMI's; None when neither answers."""
        return cls._nvml() or cls._amdsmi()

    @classmethod
    def _nvml(cls) -> GpuTelemetry | None:
        nvml = _import("pynvml")  # provided by the nvidia-ml-py package
        if nvml is None:
            return None
        try:
            nvml.nvmlInit()
        except Exception:  # no driver, no device: telemetry is optional
            return None
        try:
            if nvml.nvmlDeviceGetCount() < 1:
                raise LookupError("no NVIDIA GPU")
            return cls(nvml, nvml.nvmlDeviceGetHandleByIndex(0), "nvml")
        except Exception:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()
            return None

    @classmethod
    def _amdsmi(cls) -> GpuTelemetry | None:
        amd = _import("amdsmi")
        if amd is None:
            return None
        try:
            amd.amdsmi_init()
        except Exception:
            return None
        try:
            handles = amd.amdsmi_get_processor_handles()
            if not handles:
                raise LookupError("no AMD GPU")
            return cls(amd, handles[0], "amdsmi")
        except Exception:
            with contextlib.suppress(Exception):
                amd.amdsmi_shut_down()
            return None

    def sample(self) -> None:
        """One reading of each figure; one that fails is left out (the others still count)."""
        if self._closed:
            return
        if self.source == "nvml":
            self._sample_nvml()
        else:
            self._sample_amd()

    def _sample_nvml(self) -> None:
        lib, h = self._lib, self._handle
        try:
            u = lib.nvmlDeviceGetUtilizationRates(h)
            m = lib.nvmlDeviceGetMemoryInfo(h)
            self._sm.append(float(u.gpu))
            self._mem_bw.append(float(u.memory))
            self._mem_used.append(float(m.used))
        except Exception:
            pass
        try:
            w = _watts(lib.nvmlDeviceGetPowerUsage(h) / 1000.0)  # milliwatts
        except Exception:
            w = None
        if w is not None:
            self._power_w.append(w)

    def _sample_amd(self) -> None:
        lib, h = self._lib, self._handle
        try:
            a = lib.amdsmi_get_gpu_activity(h)
            self._sm.append(float(a["gfx_activity"]))
            self._mem_bw.append(float(a["umc_activity"]))
        except Exception:
            pass
        try:
            p = lib.amdsmi_get_power_info(h)
            w = next((x for x in (_watts(p.get(k)) for k in (
                "current_socket_power", "socket_power", "average_socket_power"))
                if x is not None), None)
        except Exception:
            w = None
        if w is not None:
            self._power_w.append(w)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self._sm:
            out |= {"sm_util_mean_pct": sum(self._sm) / len(self._sm),
                    "sm_util_max_pct": max(self._sm),
                    "mem_bw_util_mean_pct": sum(self._mem_bw) / len(self._mem_bw),
                    "mem_bw_util_max_pct": max(self._mem_bw)}
        if self._mem_used:
            out["mem_used_max_bytes"] = max(self._mem_used)
        if self._power_w:
            out |= {"power_mean_w": sum(self._power_w) / len(self._power_w),
                    "power_max_w": max(self._power_w),
                    "power_samples": len(self._power_w), "power_source": self.source}
        return out

    def close(self) -> None:
        """nvmlShutdown / amdsmi_shut_down, once."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            if self.source == "nvml":
                self._lib.nvmlShutdown()
            else:
                self._lib.amdsmi_shut_down()


def power_source() -> tuple[str | None, str]:
    """Which library would give the sweep GPU power ("nvml", "amdsmi") and a line on it, or
    (None, why not): what the sweep says once at its start."""
    t = GpuTelemetry.create()
    if t is None:
        have = [n for n in ("pynvml", "amdsmi") if _import(n) is not None]
        why = ("no local GPU answered " + " or ".join(have) if have else
               "neither NVML (pip install nvidia-ml-py) nor AMD SMI (amdsmi) is installed")
        return None, (f"no power source: {why}; the sweep stores no GPU power (calibrate "
                      "keeps the power model's defaults, docs/energy.md)")
    try:
        t.sample()
        got = t.summary()
    finally:
        t.close()
    if "power_mean_w" not in got:
        return None, (f"no power source: {t.source} answered but reads no board power; the "
                      "sweep stores no GPU power")
    return t.source, (f"power: {t.source}, GPU 0 at {got['power_mean_w']:.0f} W now; "
                      "sampled with each level")
