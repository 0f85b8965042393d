"""What a simulation runs on and whether it can finish: the KV pool (`sim_pool`, one for the
check, the engine and `bstar search`'s pruning), the refusal of what could never run
(`check_feasible`) and the bound on steps of what can (`max_steps`). Pure, no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from bstar import roofline as rl
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.sim.block_manager import block_bytes_per_gpu, engine_pool, num_gpu_blocks, peak_blocks
from bstar.sim.scheduler import SchedulerConfig
from bstar.sim.traffic import Workload
from bstar.units import GiB


class PoolConfig(Protocol):
    """What of a `sim.engine.SimConfig` the pool depends on (that module imports this one)."""

    @property
    def scheduler(self) -> SchedulerConfig: ...

    @property
    def prefix_caching(self) -> bool: ...

    @property
    def speculative(self) -> Any: ...


# Each request is simulated step by step, and `bstar simulate` runs a level's workload
# several more times to find its capacity: `simulate --rate 10 --num-requests 10000` took
# 6.6 s of CPU on the 2-core development machine, so the documented 1,000,000 took over ten
# minutes; 100,000 take about one.
MAX_REQUESTS = 100_000


@dataclass(frozen=True, slots=True)
class SimPool:
    """The KV pool a simulation runs on (`sim_pool`): its blocks, the bytes of one, and for
    a model whose windowed layers give blocks back, the blocks a sequence of n tokens holds
    (`window_blocks`; None: the whole-model block, one per `block_size` tokens)."""

    num_blocks: int
    block_bytes: int
    blocks_fn: Any
    lookahead_tokens: int  # slots past a sequence's tokens (speculation's drafts)
    what: str  # how the message names it ("the pool", "the pool with drafter eagle")

    def peak_blocks(self, d: Deployment, tokens: int, max_num_batched_tokens: int) -> int:
        """The most blocks a request that reaches `tokens` holds at once: its tokens and
        lookahead slots in whole blocks, or a windowed model's admission cap."""
        if self.blocks_fn is not None:
            return peak_blocks(d, d.block_size, tokens, max_num_batched_tokens)
        return -(-(tokens + self.lookahead_tokens) // d.block_size)


def sim_pool(d: Deployment, cfg: PoolConfig, w: Workload) -> SimPool:
    """The one pool `simulate` runs on and `check_feasible` (so `bstar search`'s pruning)
    checks. A windowed model alone gets vLLM V1's pool of KV cache group blocks, each
    sequence giving back the blocks behind its window (`engine_pool`). The prefix cache's
    block table and speculation's pool count whole-model blocks: every token of every layer
    (conservative for a windowed model, whose freeing is not combined with them); with
    speculation the drafter's weights leave the pool and its KV joins every block
    (`sim.speculative.num_blocks`), and each sequence holds its lookahead slots."""
    bs = d.block_size
    caching = w.prompt_ids is not None and cfg.prefix_caching
    if cfg.speculative is not None:
        from bstar.sim.speculative import num_blocks

        sp = cfg.speculative
        return SimPool(num_blocks(d, sp, bs), block_bytes_per_gpu(d, bs), None,
                       sp.lookahead_tokens, f"the pool with drafter {sp.drafter.name} and "
                                            f"{sp.lookahead_tokens} lookahead slots")
    windowed = None if caching else engine_pool(d, bs)
    if windowed is not None:
        return SimPool(windowed[0], windowed[1], windowed[2], 0, "the pool")
    return SimPool(num_gpu_blocks(d, bs), block_bytes_per_gpu(d, bs), None, 0, "the pool")


def check_feasible(d: Deployment, cfg: PoolConfig, w: Workload) -> SimPool:
    """Refuse, at once and in one line, what `simulate` could never finish: a request that
    does not fit alone in the pool the engine runs on (`sim_pool`, the drafter's included).
    Returns that pool. What passes runs to completion: the scheduler serves its running list
    in order and preempts from the back, so the request at its head, which fits alone, is
    never preempted and computes at least one token every step; it finishes within its
    prompt + output tokens of steps, then the next one heads the list. A run therefore takes
    at most sum(prompt + output) steps (`max_steps`)."""
    bs = d.block_size
    sc = cfg.scheduler
    if w.num_requests > MAX_REQUESTS:
        raise BstarError(f"--num-requests is capped at {MAX_REQUESTS:,} per run")
    if sc.max_num_batched_tokens < bs:
        raise BstarError(f"--max-num-batched-tokens {sc.max_num_batched_tokens} is below one "
                         f"KV block ({bs} tokens)")
    pool = sim_pool(d, cfg, w)
    if pool.num_blocks < 1:
        raise BstarError(
            f"the KV cache has no blocks: {d.model.name} on {d.num_gpus} x {d.gpu.id} at "
            f"--gpu-util {d.gpu_util:g} leaves {rl.kv_pool_bytes(d) / GiB:.2f} GiB per GPU for "
            f"KV, {pool.what} under one block of {pool.block_bytes:,} bytes")
    if not w.num_requests:
        return pool
    total = w.prompt_tokens + w.output_tokens
    rid = int(np.argmax(total))
    longest = int(total[rid])
    # The last generated token is never fed back, so a request holds at most in+out-1.
    need = pool.peak_blocks(d, longest - 1, sc.max_num_batched_tokens)
    if need > pool.num_blocks:
        raise BstarError(
            f"request {rid + 1} ({int(w.prompt_tokens[rid])} + {int(w.output_tokens[rid])} "
            f"tokens) needs {need} KV blocks; {pool.what} holds {pool.num_blocks} "
            f"({pool.num_blocks * bs} tokens): it could never run. Shorten it or add "
            "memory/GPUs")
    return pool


def max_steps(w: Workload) -> int:
    """The bound on engine steps of a run that passed `check_feasible` (its docstring says
    why): every step moves the request heading the running list by a token or more."""
    return int(np.sum(w.prompt_tokens, dtype=np.int64)
               + np.sum(w.output_tokens, dtype=np.int64))
