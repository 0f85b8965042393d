"""A continuous-batching scheduler after vLLM V1's (vllm/v1/core/sched/scheduler.py):

1. RUNNING requests first, in order: each gets `num_tokens - num_computed` new tokens (a
   decode token, or the rest of a prompt), capped by what is left of the step's token budget
   (`max_num_batched_tokens`), which is how chunked prefill arises. When its KV blocks cannot
   be allocated the *last* running request is preempted (FCFS: the most recently admitted),
   repeatedly, until the allocation fits or the request itself was the one preempted.
2. Then, only if nothing was preempted this step, WAITING requests in FCFS order while the
   budget lasts and fewer than `max_num_seqs` run; the head of the queue blocks the rest when
   its blocks do not fit (no skipping ahead).

Preemption by recompute frees the request's blocks and puts it at the front of the waiting
queue with nothing computed: on readmission it prefills its prompt *and* the tokens it had
generated (vLLM V1). Preemption by swap (vLLM V0's other mode) parks the KV in host memory
while swap space lasts and copies it back on readmission; the copies cost time on the step.

The running batch is kept as an array of request ids in admission order; the common step
(everything fits) is a handful of vectorized operations, the preemption path a plain loop.

Why this file is three times nano-vllm's 92-line scheduler (issue 41): nano-vllm schedules
either prefills or decodes in a step and preempts by recompute only. This one follows vLLM
V1, whose behaviour the simulator is checked against: chunked prefill inside one token
budget, preemption by recompute or by swap, windowed layers that give blocks back as they
go, admission through the prefix cache, the KV slots speculation reserves, SGLang's
decode rounds and TensorRT-LLM's attention-DP balance (bstar.sim.adp: each rank's own
line). The common step is vectorized over the batch, since it runs on every step,
so the block rules appear twice: in `schedule`'s array path and in
`_schedule_with_preemption`'s walk, which must agree.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from bstar.errors import BstarError
from bstar.sim.adp import AdpBalance
from bstar.sim.block_manager import BlockManager, change_blocks
from bstar.sim.sequence import (
    FloatArray,
    IntArray,
    Requests,
    all_of,
    any_of,
    sum_of,
)

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int
    # A shorthand for tests: the commands, search and the report's replay pass the GPU's
    # (bstar.engine_defaults.vllm_defaults; 8192 on an H200).
    max_num_batched_tokens: int = 2048
    preemption: str = "recompute"
    # KV slots reserved past each scheduled sequence's new tokens: speculative decoding's
    # K draft tokens (vLLM V1's num_lookahead_tokens; bstar.sim.speculative). 0: none.
    lookahead_tokens: int = 0
    # Decode steps a batch that only decodes runs before the scheduler looks at the queue
    # again (SGLang's --num-continuous-decode-steps; 1: every step, as vLLM does). A request
    # that arrives meanwhile waits for the round's end.
    decode_steps_per_schedule: int = 1
    # Scheduling rounds of pure decode between two looks at the request queue (SGLang's
    # --scheduler-recv-interval: its SchedulerRecvSkipper adds 1 a decode round and receives
    # at the interval, and at once after any other step; 1: every round).
    recv_interval: int = 1
    # Attention data-parallel ranks, and TensorRT-LLM's balance of them (its
    # attention_dp_config: enable_balance with timeout_iters and batching_wait_iters;
    # bstar.sim.adp): new prompts wait until every rank has one, at most the timeout's
    # iterations. 0: no balance (every engine's default).
    dp_ranks: int = 1
    adp_timeout_iters: int = 0
    adp_batching_wait_iters: int = 0

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise BstarError(f"--max-num-seqs must be at least 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise BstarError("--max-num-batched-tokens must be at least 1")
        if not 1 <= self.decode_steps_per_schedule <= 1024:
            raise BstarError("--num-continuous-decode-steps must be in 1..1024, got "
                             f"{self.decode_steps_per_schedule}")
        if not 1 <= self.recv_interval <= 1024:
            raise BstarError("--scheduler-recv-interval must be in 1..1024, got "
                             f"{self.recv_interval}")
        if self.dp_ranks < 1:
            raise BstarError(f"attention data-parallel ranks must be at least 1, got "
                             f"{self.dp_ranks}")
        if not 0 <= self.adp_timeout_iters <= 1 << 20 \
                or not 0 <= self.adp_batching_wait_iters <= 1 << 20:
            raise BstarError("--attention-dp-timeout-iters and --attention-dp-batching-wait-"
                             "iters must be in 0..1048576")
        if self.preemption not in PREEMPTION_MODES:
            raise BstarError(f"--preemption must be one of {', '.join(PREEMPTION_MODES)}, "
                             f"got {self.preemption!r}")

    @property
    def queue_interval_steps(self) -> int:
        """Pure decode steps between two looks at the queue: the decode steps of a round
        times the rounds between two receives (1: every step, as vLLM)."""
        return self.decode_steps_per_schedule * self.recv_interval


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What one step computes: for each scheduled request, `new` tokens on top of `start`."""

    ids: IntArray
    start: IntArray
    new: IntArray
    num_preempted: int
    swap_out_tokens: int  # KV tokens copied to host this step
    swap_in_tokens: int  # KV tokens copied back

    @property
    def empty(self) -> bool:
        return self.ids.size == 0


@dataclass(slots=True)
class StepOutcome:
    finished: IntArray
    contiguous_tokens: int  # tokens whose previous token came at the end of the last step
    other_gaps_s: FloatArray  # inter-token gaps of the others (after a stall or preemption)


class Scheduler:
    def __init__(self, cfg: SchedulerConfig, reqs: Requests, blocks: BlockManager) -> None:
        self.cfg = cfg
        self.reqs = reqs
        self.blocks = blocks
        self.waiting: deque[int] = deque()
        # Never more running than requests exist: a huge --max-num-seqs costs no memory.
        self.running = np.zeros(min(cfg.max_num_seqs, len(reqs)) + 1, dtype=np.int64)
        self.num_running = 0
        self.num_preemptions = 0
        # Pure decode steps since the queue was last looked at, or since the last step that
        # did more than decode (SchedulerConfig.queue_interval_steps).
        self.decode_round = 0
        self.adp = AdpBalance(len(reqs), cfg.dp_ranks, cfg.max_num_seqs,
                              cfg.adp_timeout_iters, cfg.adp_batching_wait_iters) \
            if cfg.dp_ranks > 1 and cfg.adp_timeout_iters > 0 else None

    # ---- queue ---------------------------------------------------------------------------
    def add(self, rid: int) -> None:
        if self.adp is not None:
            self.adp.assign(rid, np.concatenate([self.running[:self.num_running],
                                                 self._waiting_ids()]))
        self.waiting.append(rid)

    def _waiting_ids(self) -> IntArray:
        return np.fromiter(self.waiting, dtype=np.int64, count=len(self.waiting))

    @property
    def idle(self) -> bool:
        return self.num_running == 0 and not self.waiting

    # ---- one step's schedule ------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        r, bm, cfg = self.reqs, self.blocks, self.cfg
        ids = self.running[:self.num_running].copy()
        budget = cfg.max_num_batched_tokens
        preempted = swap_out = 0
        if ids.size:
            comp = r.num_computed[ids]
            want = r.prompt_tokens[ids] + r.num_generated[ids] - comp
            total_want = int(sum_of(want))
            if total_want <= budget:
                sched = want
            else:  # the budget runs out part-way: later requests get a chunk or nothing
                before = np.cumsum(want) - want
                sched = np.clip(budget - before, 0, want)
            held = r.num_blocks[ids]
            need, peak, need_sum = self._running_need(comp, sched, held)
            if peak <= bm.num_free:
                if bm.caching:
                    bm.grow_many(ids, need, comp + sched,  # type: ignore[attr-defined]
                                 held + need)
                else:
                    change_blocks(bm, need_sum)
                r.num_blocks[ids] = held + need
                keep = sched > 0
                if not all_of(keep):
                    ids, comp, sched = ids[keep], comp[keep], sched[keep]
                # What was scheduled: all that was wanted, or the whole budget (the chunks
                # fill it exactly when the wants exceed it).
                budget -= min(total_want, budget)
            else:
                ids, comp, sched, budget, preempted, swap_out = self._schedule_with_preemption()
        else:
            comp = sched = ids
        swap_in = 0
        queue_open = self._queue_open(ids, comp, sched)
        if self.adp is not None:
            queue_open = self._adp_opens(ids, comp, sched) and queue_open
        if not preempted and self.waiting and queue_open:
            new_ids, new_comp, new_sched, swap_in = self._admit(ids, sched, budget)
            if new_ids:
                ids = np.concatenate([ids, np.asarray(new_ids, dtype=np.int64)])
                comp = np.concatenate([comp, np.asarray(new_comp, dtype=np.int64)])
                sched = np.concatenate([sched, np.asarray(new_sched, dtype=np.int64)])
        return StepPlan(ids, comp, sched, preempted, swap_out, swap_in)

    def _admit(self, ids: IntArray, sched: IntArray, budget: int
               ) -> tuple[list[int], list[int], list[int], int]:
        """WAITING requests in FCFS order while the budget lasts and fewer than max_num_seqs
        run; the head of the queue blocks the rest when its blocks do not fit. With
        attention-DP ranks balanced (bstar.sim.adp) each rank keeps its own line, its share
        of the token budget and of max_num_seqs: a rank whose head does not fit stops its
        line only. Returns the admitted ids, their computed and scheduled tokens, and the
        tokens swapped back in."""
        r, bm, cfg, adp = self.reqs, self.blocks, self.cfg, self.adp
        prompt, gen, computed = r.prompt_tokens, r.num_generated, r.num_computed
        new_ids: list[int] = []
        new_comp: list[int] = []
        new_sched: list[int] = []
        swap_in = 0
        if adp is not None:
            tokens_left, seats_left = adp.room(ids, sched, self.running[:self.num_running],
                                               cfg.max_num_batched_tokens)
            stopped: set[int] = set()
            passed: list[int] = []  # left in line: their rank's line stopped
        while self.waiting and budget > 0 and self.num_running < cfg.max_num_seqs:
            rid = self.waiting[0]
            cap, k = budget, -1
            if adp is not None:  # a stopped or full rank's line takes nothing more
                k = int(adp.rank_of[rid])
                cap = 0 if k in stopped or seats_left[k] <= 0 else min(budget,
                                                                        int(tokens_left[k]))
            fits = cap > 0
            if fits and bm.caching:
                c, n, need_blocks = self._admit_cached(rid, int(computed[rid]), cap)
                fits = need_blocks >= 0
            elif fits:
                c = int(computed[rid])
                n = min(int(prompt[rid] + gen[rid]) - c, cap)
                need_blocks = int(bm.blocks_for(c + n + cfg.lookahead_tokens, c))
                fits = need_blocks <= bm.num_free
                if fits:
                    bm.allocate(need_blocks)
            if not fits:
                if adp is None:
                    break  # FCFS: the head blocks everyone behind it
                stopped.add(k)
                passed.append(self.waiting.popleft())
                if len(stopped) == adp.ranks:
                    break
                continue
            self.waiting.popleft()
            r.num_blocks[rid] = need_blocks
            if r.swapped[rid]:
                r.swapped[rid] = False
                bm.num_host_free += bm.blocks_for(c)
                swap_in += c
            self.running[self.num_running] = rid
            self.num_running += 1
            new_ids.append(rid)
            new_comp.append(c)
            new_sched.append(n)
            budget -= n
            if adp is not None:
                tokens_left[k] -= n
                seats_left[k] -= 1
        if adp is not None:
            self.waiting.extendleft(reversed(passed))
        return new_ids, new_comp, new_sched, swap_in

    def _running_need(self, comp: IntArray, sched: IntArray,
                      held: IntArray) -> tuple[IntArray, int, int]:
        """Blocks each running request takes for its scheduled tokens, the peak of their
        running total and their sum. A windowed model's request gives back the blocks
        behind its window as it goes (vLLM frees them before it allocates, request by
        request): the net change may be negative, and each prefix of the walk must fit.
        Speculation reserves `lookahead_tokens` slots past the scheduled ones (vLLM's
        num_lookahead_tokens)."""
        bm, look = self.blocks, self.cfg.lookahead_tokens
        if bm.blocks_fn is not None:
            need = np.where(sched > 0, bm.blocks_for(comp + sched + look, comp) - held, 0)
            return need, int(np.cumsum(need).max()), int(need.sum())
        # Never negative: the running total peaks at the end.
        need = np.maximum((comp + sched + (look + bm.block_size - 1)) // bm.block_size - held,
                          0)
        total = int(sum_of(need))
        return need, total, total

    def _queue_open(self, ids: IntArray, comp: IntArray, sched: IntArray) -> bool:
        """Whether this step may admit from the queue: always, unless the engine looks at
        it every N = `queue_interval_steps` > 1 pure decode steps (SGLang's continuous
        decode steps times its receive interval) and this step only decodes; then only
        steps 0, N, 2N, ... of a run of pure decode steps look at the queue."""
        n = self.cfg.queue_interval_steps
        if n == 1:
            return True
        r = self.reqs
        decoding = ids.size > 0 and bool((sched == 1).all()) and bool(
            (comp + 1 == r.prompt_tokens[ids] + r.num_generated[ids]).all()
            and r.num_generated[ids].all())
        if not decoding:
            self.decode_round = 0
            return True
        self.decode_round += 1
        return (self.decode_round - 1) % n == 0

    def _adp_opens(self, ids: IntArray, comp: IntArray, sched: IntArray) -> bool:
        """One iteration of TensorRT-LLM's attention-DP balance (bstar.sim.adp) over this
        step's running requests: those still in their prompt and those decoding."""
        assert self.adp is not None
        r = self.reqs
        gen = r.num_generated[ids]
        decoding = (comp + 1 == r.prompt_tokens[ids] + gen) & (gen > 0)
        return self.adp.opens(self._waiting_ids(), ids[~decoding], ids[decoding])

    def note_decode_steps(self, k: int) -> None:
        """`k` pure decode steps ran at once (the simulator's multi-step jump)."""
        if self.cfg.queue_interval_steps > 1:
            self.decode_round += k
        if self.adp is not None:
            self.adp.jumped(k, self._waiting_ids(), self.running[:self.num_running])

    def _admit_cached(self, rid: int, computed: int, budget: int) -> tuple[int, int, int]:
        """Admission through the prefix cache: (computed tokens after its hits, tokens to
        schedule, blocks it holds), or need -1 when its blocks do not fit."""
        r, bm = self.reqs, self.blocks
        num_tokens = int(r.prompt_tokens[rid] + r.num_generated[rid])
        hit, c, n, need = bm.admission(rid, computed, num_tokens,  # type: ignore[attr-defined]
                                       budget)
        if need > bm.num_free:
            return c, n, -1  # FCFS: the head blocks everyone behind it
        total = -(-(c + n) // bm.block_size)
        bm.admit(rid, hit, total, c + n)  # type: ignore[attr-defined]
        if computed == 0 and not r.num_preemptions[rid]:
            bm.record(num_tokens, c)  # type: ignore[attr-defined]
        r.num_computed[rid] = c
        return c, n, total

    def _schedule_with_preemption(
            self) -> tuple[IntArray, IntArray, IntArray, int, int, int]:
        """The running pass one request at a time, as vLLM walks it, preempting from the
        back of the running list whenever a request's blocks do not fit."""
        r, bm = self.reqs, self.blocks
        running = self.running[:self.num_running].tolist()
        budget = self.cfg.max_num_batched_tokens
        out_ids: list[int] = []
        out_comp: list[int] = []
        out_sched: list[int] = []
        preempted = swap_out = 0
        i = 0
        while i < len(running) and budget > 0:
            rid = running[i]
            c = int(r.num_computed[rid])
            n = min(int(r.prompt_tokens[rid] + r.num_generated[rid]) - c, budget)
            need = int(bm.blocks_for(c + n + self.cfg.lookahead_tokens, c)) \
                - int(r.num_blocks[rid])
            if bm.blocks_fn is None:
                need = max(need, 0)
            self_preempted = False
            while need > bm.num_free:
                victim = running.pop()
                swap_out += self._preempt(victim)
                preempted += 1
                if victim == rid:
                    self_preempted = True
                    break
            if self_preempted:
                break
            if bm.caching:
                bm.grow(rid, need, c + n)  # type: ignore[attr-defined]
            else:
                change_blocks(bm, need)
            r.num_blocks[rid] += need
            out_ids.append(rid)
            out_comp.append(c)
            out_sched.append(n)
            budget -= n
            i += 1
        self.num_running = len(running)
        self.running[:self.num_running] = running
        # Each preempted request was prepended to the queue in turn (vLLM's prepend_request),
        # so the earliest admitted of them is now first in line.
        return (np.asarray(out_ids, dtype=np.int64), np.asarray(out_comp, dtype=np.int64),
                np.asarray(out_sched, dtype=np.int64), budget, preempted, swap_out)

    def _preempt(self, rid: int) -> int:
        """Free a running request's blocks and requeue it first; returns tokens swapped out."""
        r, bm = self.reqs, self.blocks
        held = int(r.num_blocks[rid])
        if bm.caching:
            bm.release(rid)  # type: ignore[attr-defined]
        else:
            bm.free(held)
        r.num_blocks[rid] = 0
        r.num_preemptions[rid] += 1
        self.num_preemptions += 1
        self.waiting.appendleft(rid)
        c = int(r.num_computed[rid])
        if self.cfg.preemption == "swap" and c and bm.blocks_for(c) <= bm.num_host_free:
            bm.num_host_free -= bm.blocks_for(c)
            r.swapped[rid] = True
            return c
        r.num_computed[rid] = 0  # recompute: the KV is dropped
        return 0

    # ---- after the step ---------------------------------------------------------------------
    def update(self, plan: StepPlan, start_s: float, end_s: float) -> StepOutcome:
        """Advance the scheduled requests by their tokens; those that caught up sample one
        token at `end_s`; those that reached their output length finish and free blocks."""
        r = self.reqs
        ids = plan.ids
        comp = plan.start + plan.new
        r.num_computed[ids] = comp
        gen = r.num_generated[ids]
        caught_up = comp == r.prompt_tokens[ids] + gen
        emit = ids[caught_up]
        gen = gen[caught_up]
        first = gen == 0
        if any_of(first):
            r.first_token_s[emit[first]] = end_s
            last = r.last_token_s[emit[~first]]
        else:  # the common step: every token is a next one
            last = r.last_token_s[emit]
        contiguous = last == start_s
        n_contig = int(np.count_nonzero(contiguous))
        other_gaps = end_s - last[~contiguous] if n_contig < last.size else _EMPTY
        gen = gen + 1
        r.num_generated[emit] = gen
        r.last_token_s[emit] = end_s
        fin = emit[gen == r.output_tokens[emit]]
        if fin.size:
            r.finish_s[fin] = end_s
            r.done[fin] = True
            if self.blocks.caching:
                for rid in fin.tolist():
                    self.blocks.release(rid, finished=True)  # type: ignore[attr-defined]
                    self.blocks.forget(rid)  # type: ignore[attr-defined]
            else:
                self.blocks.free(int(r.num_blocks[fin].sum()))
            r.num_blocks[fin] = 0
            run = self.running[:self.num_running]
            kept = run[~r.done[run]]
            self.num_running = kept.size
            self.running[:kept.size] = kept
        return StepOutcome(fin, n_contig, other_gaps)


_EMPTY: FloatArray = np.zeros(0)
