"""A vLLM start-up log: the KV pool the engine actually got (`parse_vllm_log`), in bytes
for a deployment (`kv_pool_from_log`), and the reserve that makes bstar's pool match it
(`reserve_from_kv_pool`, so B_mem is the engine's)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.units import GiB


@dataclass(frozen=True, slots=True)
class VllmKvLog:
    kv_cache_bytes: int | None  # "Available KV cache memory: 52.37 GiB" (v1, per GPU)
    kv_cache_tokens: int | None  # "GPU KV cache size: 433,392 tokens" (v1)
    gpu_blocks: int | None  # "# GPU blocks: 27084" (v0)


_GIB_RE = re.compile(r"Available KV cache memory:\s*([\d.]+)\s*GiB")
_TOKENS_RE = re.compile(r"(?:GPU|CPU|XPU|TPU) KV cache size:\s*([\d,]+)\s*tokens")
# v0 logs "# GPU blocks: N, # CPU blocks: M"; the CPU blocks there are swap space.
_BLOCKS_RE = re.compile(r"# GPU blocks:\s*(\d+)")


def parse_vllm_log(text: str) -> VllmKvLog:
    """The KV pool figures a vLLM server logs at start-up (last occurrence wins: a log may
    hold several starts). Raises BstarError if none is present."""
    def last(rx: re.Pattern[str]) -> str | None:
        m = rx.findall(text)
        return m[-1] if m else None

    gib, tokens, blocks = last(_GIB_RE), last(_TOKENS_RE), last(_BLOCKS_RE)
    if gib is None and tokens is None and blocks is None:
        raise BstarError("no KV cache size in this log (looked for 'Available KV cache "
                         "memory', 'KV cache size: N tokens', '# GPU blocks')")
    return VllmKvLog(round(float(gib) * GiB) if gib else None,
                     int(tokens.replace(",", "")) if tokens else None,
                     int(blocks) if blocks else None)


def kv_pool_from_log(d: Deployment, log: VllmKvLog) -> int:
    """Per-GPU KV pool bytes: the logged memory when present, else tokens (or blocks) times
    the deployment's per-GPU KV bytes per token."""
    if log.kv_cache_bytes is not None:
        return log.kv_cache_bytes
    per_token = d.model.kv_bytes_per_token(d.kv, num_gpus=d.num_gpus)
    tokens = log.kv_cache_tokens if log.kv_cache_tokens is not None \
        else (log.gpu_blocks or 0) * d.block_size
    return tokens * per_token


def reserve_from_kv_pool(d: Deployment, kv_pool_bytes: int) -> int:
    """The reserve that makes bstar's pool (memory x util - weights - reserve) equal the
    measured one, so B_mem matches the engine's."""
    reserve = math.floor(d.gpu.memory_bytes * d.gpu_util) - rl.weight_bytes_per_gpu(d) \
        - kv_pool_bytes
    if reserve < 0:
        raise BstarError(
            f"the measured KV pool ({kv_pool_bytes / GiB:.2f} GiB) exceeds memory x util "
            f"- weights ({(kv_pool_bytes + reserve) / GiB:.2f} GiB): check --gpu-util, "
            "--gpu and --dtype against the server's settings")
    return reserve
