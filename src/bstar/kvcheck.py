"""The server's KV pool against bstar's: measured B_mem beside computed B_mem, explained.

A vLLM server says how much KV it got in `/metrics` (`vllm:cache_config_info`: num_gpu_blocks
and block_size, and on CPU the configured kv_cache_memory_bytes) and in its start-up log
("KV cache size: N tokens"). bstar computes the same pool from the model and the GPU
(memory x utilization - weights - reserve, docs/cost-model.md) or takes an explicit pool (a
CPU's VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes). `check_kv` puts the two side by side
and splits the difference into its causes:

- reserve: vLLM profiles activations, CUDA graphs and its context at start-up and keeps what
  it measured; bstar assumes a fixed reserve (--reserve-gib). The pools differ by the
  difference of the reserves; the reserve that makes them agree is reported.
- block rounding: the engine allocates whole blocks of `block_size` tokens, so the pool
  holds floor(pool / block bytes) blocks and a sequence takes ceil(tokens / block_size).
- layer kinds (hybrid models): vLLM V1 gives each kind of layer its own KV cache groups
  sharing one pool (`kv_layout`, docs/models.md): a sliding window takes
  window - 1 + max_num_batched_tokens tokens, a state layer two pages padded to the
  attention page, whose block grows to hold it. A block is then one page of each layer of
  a group, and a sequence takes the blocks of every group.
- KV precision: the bytes per token follow the cache dtype.

Pure: no HTTP and no parsing here. `loadgen/kvserver.py` reads a server's /metrics (over
HTTP or from a saved file) into the `ServerPool` this module compares; `loadgen/regime.py`
feeds it a stored sweep's figures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.kv_pool import KvLayout, kv_layout
from bstar.units import GiB, fmt_bytes_binary

DISAGREE = 0.10  # a relative B_mem difference above this is flagged


@dataclass(frozen=True)
class ServerPool:
    """What a server says of its KV pool (None: not exported): vLLM's cache_config_info
    labels (num_gpu_blocks, block_size, the configured kv_cache_memory_bytes of a CPU pool,
    kv_cache_size_tokens in newer versions) and the engine's name."""

    engine: str | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_memory_bytes: int | None = None
    kv_cache_size_tokens: int | None = None


def b_mem_blocks(num_blocks: int, block_size: int, tokens_per_seq: int) -> int:
    """Sequences of `tokens_per_seq` tokens that `num_blocks` whole blocks hold."""
    if tokens_per_seq < 1 or block_size < 1:
        raise BstarError("tokens per sequence and block size must be at least 1")
    return num_blocks // math.ceil(tokens_per_seq / block_size)


@dataclass(frozen=True)
class KvCheck:
    """Measured (the server) beside computed (bstar) KV pool and B_mem."""

    tokens_per_seq: int
    block_size: int
    kv_bytes_per_token: int  # per GPU, bstar's model spec at the KV precision
    measured_blocks: int | None
    measured_tokens: int | None
    measured_pool_bytes: int | None  # measured blocks x block bytes
    measured_b_mem: int | None
    computed_pool_bytes: int
    computed_pool_source: str  # "explicit" (CPU pool) or "gpu" (memory x util - W - reserve)
    computed_blocks: int
    computed_b_mem: int
    reserve_bytes: int  # bstar's reserve (gpu source)
    implied_reserve_bytes: int | None  # the reserve that makes bstar's pool the measured one
    rel_diff: float | None  # computed / measured B_mem - 1
    flagged: bool
    explanation: list[str] = field(default_factory=list)
    server: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def check_kv(d: Deployment, server: ServerPool, tokens_per_seq: int, *,
             pool_bytes: int | None = None, log_tokens: int | None = None,
             max_num_batched_tokens: int | None = None) -> KvCheck:
    """Compare the server's KV pool (`server`, from one scrape of /metrics; `log_tokens`, the
    start-up log's "KV cache size: N tokens") with bstar's for deployment `d`.

    `pool_bytes`: an explicit pool (vLLM on CPU); default the server's configured
    kv_cache_memory_bytes when it exports one, else bstar's GPU pool of `d`.
    `max_num_batched_tokens`: the server's (sizes a sliding window's share; default vLLM's
    for the GPU)."""
    if tokens_per_seq < 1:
        raise BstarError("--tokens-per-seq (input + output tokens) must be at least 1")
    block = server.block_size or d.block_size
    d = replace(d, block_size=block)
    layout = kv_layout(d, tokens_per_seq, max_num_batched_tokens)
    block = layout.block_size  # a hybrid model's attention block holds a state page
    d = replace(d, block_size=block)
    per_token = d.model.kv_bytes_per_token(d.kv, num_gpus=d.num_gpus)
    bb = layout.bytes_per_block
    seq_blocks = layout.blocks_per_seq
    notes: list[str] = []
    m_blocks = server.num_gpu_blocks
    m_tokens = m_blocks * block if m_blocks is not None else (
        server.kv_cache_size_tokens or log_tokens)
    if m_blocks is None and m_tokens is not None:
        m_blocks = m_tokens // block
    if m_blocks is None:
        raise BstarError("the server exports no KV pool size (vllm:cache_config_info "
                         "num_gpu_blocks, kv_cache_size_tokens) and no start-up log was given")
    m_pool = m_blocks * bb
    m_b_mem = m_blocks // seq_blocks
    explicit = pool_bytes if pool_bytes is not None else server.kv_cache_memory_bytes
    if explicit is not None:
        c_pool, source = int(explicit), "explicit"
        implied = None
        notes.append(f"pool: {fmt_bytes_binary(c_pool)} set explicitly "
                     "(VLLM_CPU_KVCACHE_SPACE or --kv-cache-memory-bytes); no reserve or "
                     "activations come out of it")
    else:
        c_pool, source = rl.kv_pool_bytes(d), "gpu"
        weights = rl.weight_bytes_per_gpu(d)
        usable = math.floor(d.gpu.memory_bytes * d.gpu_util)
        implied = usable - weights - m_pool
        notes.append(f"pool: {fmt_bytes_binary(d.gpu.memory_bytes)} x util {d.gpu_util:g} = "
                     f"{fmt_bytes_binary(usable)} - weights {fmt_bytes_binary(weights)} - "
                     f"reserve {fmt_bytes_binary(d.reserve_bytes)} = "
                     f"{fmt_bytes_binary(c_pool)} per GPU (bstar)")
        notes.append(f"reserve: the server kept {fmt_bytes_binary(implied)} for activations, "
                     "CUDA graphs and its context where bstar assumed "
                     f"{fmt_bytes_binary(d.reserve_bytes)} "
                     f"({fmt_bytes_binary(implied - d.reserve_bytes, signed=True)}); --reserve-gib "
                     f"{implied / GiB:.2f} makes the pools agree")
    c_blocks = c_pool // bb if bb else 0
    c_b_mem = c_blocks // seq_blocks
    lost = c_pool - c_blocks * bb
    notes.append(_blocks_note(layout, per_token, tokens_per_seq, c_blocks, lost,
                              m_blocks))
    if source == "explicit" and c_blocks != m_blocks:
        notes.append(f"the explicit pool gives {c_blocks:,} blocks, the server reports "
                     f"{m_blocks:,}: check the KV precision (--kv-dtype, bstar uses "
                     f"{d.kv.name}) and the model's KV heads and layers")
    rel = (c_b_mem / m_b_mem - 1.0) if m_b_mem else None
    flagged = rel is None or abs(rel) > DISAGREE
    if flagged:
        notes.append(f"DISAGREE: bstar's B_mem {c_b_mem:,} vs the server's {m_b_mem:,} "
                     f"differs by more than {DISAGREE:.0%}")
    return KvCheck(tokens_per_seq, block, per_token, m_blocks, m_tokens, m_pool, m_b_mem,
                   c_pool, source, c_blocks, c_b_mem, d.reserve_bytes, implied, rel, flagged,
                   notes, asdict(server))


def _blocks_note(layout: KvLayout, per_token: int, tokens_per_seq: int, c_blocks: int,
                 lost: int, m_blocks: int) -> str:
    """How whole blocks round the pool and a sequence: one kind of layer (bytes a token x
    tokens a block), or a hybrid model's block of every layer kind's pages."""
    block, bb = layout.block_size, layout.bytes_per_block
    if len(layout.kinds) == 1 and layout.kinds[0].kind in ("full", "dsa"):
        seq_blocks = math.ceil(tokens_per_seq / block)
        return (f"block rounding: {per_token:,} B/token x {block} tokens = "
                f"{fmt_bytes_binary(bb)} a block; bstar's pool is {c_blocks:,} whole "
                f"blocks ({fmt_bytes_binary(lost)} left over), the server has "
                f"{m_blocks:,}; a {tokens_per_seq:,}-token sequence takes {seq_blocks} blocks "
                f"({seq_blocks * block - tokens_per_seq:,} tokens of the last one unused)")
    shares = ", ".join(
        f"{k.kind} {k.num_layers} layers: {k.pool_groups} group(s) x {k.blocks_per_seq} "
        f"block(s)" + (f" ({k.tokens_per_seq:,} tokens)" if k.tokens_per_seq else "")
        for k in layout.kinds)
    return (f"layer kinds: a block is {layout.group_size} layers x "
            f"{fmt_bytes_binary(layout.page_bytes)} pages = {fmt_bytes_binary(bb)} ({block} "
            f"tokens); a {tokens_per_seq:,}-token sequence takes {layout.blocks_per_seq:,} "
            f"blocks ({shares}; max_num_batched_tokens {layout.max_in_flight_tokens:,}); "
            f"bstar's pool is {c_blocks:,} whole blocks ({fmt_bytes_binary(lost)} left over), "
            f"the server has {m_blocks:,}")
