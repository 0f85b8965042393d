"""The engine loop: an event loop over engine steps and request arrivals.

Each iteration takes the arrivals due by now, asks the scheduler for the step's batch, prices
the step with the cost model (`steptime`), advances the clock by it and lets the scheduler
account the tokens; finished requests of a closed loop schedule their user's next arrival.
When nothing runs the clock jumps to the next arrival. When the batch can only decode (no
prefill running, nobody admissible) the loop jumps over many steps at once, priced exactly
as step-by-step (see `_fast_forward`), so a quiet server costs no more than a busy one.

Pure: the workload (drawn from a seeded generator by `traffic`) and the deployment come in,
a `SimRun` goes out; nothing is printed or written here.

Why this file is longer than nano-vllm's engine (issue 41): nano-vllm runs a model and needs
no clock, while this loop is the clock. A quarter of it is the multi-step jump
(`_fast_forward`, `_commit_decode_run`), which makes a 10,000-request study take seconds
instead of minutes and has to account every jumped step as the plain loop would (ITL
weights, blocks, the arrival and time-limit cuts); the rest is what a served request meets
before and between steps: the front end's tokenizer queue and per-request overhead,
closed-loop users, the scheduling lag of one step, swap transfers and the speculative
verify step. Each part is a few lines against the plain loop it extends; splitting them into
modules would pass the loop's state around for no reader's gain.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.sim.block_manager import BlockManager, change_blocks
from bstar.sim.feasible import MAX_REQUESTS as MAX_REQUESTS  # its home: feasible.py
from bstar.sim.feasible import check_feasible, max_steps
from bstar.sim.scheduler import Scheduler, SchedulerConfig
from bstar.sim.sequence import (
    FloatArray,
    IntArray,
    Requests,
    all_of,
    any_of,
    min_of,
    running_sum,
    sum_of,
)
from bstar.sim.steptime import StepCoefficients, coefficients
from bstar.sim.traffic import Workload
from bstar.units import GiB

# Every pass of the simulator's loop moves a token, a request or the clock: a run that
# takes more passes than this many per token (prompt and output, plus one per request) is
# stopped and says so, whatever the input (issue 19: a NaN arrival spun it forever).
# Recompute preemption replays prompts, so the bound leaves room for many replays.
STEPS_PER_TOKEN = 64


@dataclass(frozen=True, slots=True)
class SimConfig:
    scheduler: SchedulerConfig
    # vLLM V0's --swap-space default, per GPU; only used with preemption "swap".
    swap_space_bytes: int = 4 * GiB
    # Host link for swapping: PCIe 4.0 x16 is 32 GB/s per direction, ~25 GB/s achieved.
    host_bandwidth_bytes_s: float = 25e9
    max_sim_time_s: float = 24 * 3600.0  # simulated seconds; the run stops there
    # Multi-step jumps when only decodes can run; off gives the plain step loop (tests hold
    # the two equal).
    fast_forward: bool = True
    # vLLM V1's automatic prefix caching (on by default, as the engine's; off with
    # --no-prefix-caching). It acts on workloads that carry prompt identity
    # (`Workload.prompt_ids`) and on `Workload.cached_tokens`; without either every prompt is
    # distinct and the cache is not modelled.
    prefix_caching: bool = True
    # Speculative decoding (bstar.sim.speculative.SpecSim); None: plain decode.
    speculative: Any = None
    # A server measured from a cold start: no request is scheduled before this time
    # (EngineBehaviour.cold_start_s; bstar validate sets it for the runs it reads).
    cold_start_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.max_sim_time_s > 0:
            raise BstarError(f"--max-sim-time-s must be positive, got {self.max_sim_time_s}")
        if self.swap_space_bytes < 0 or not self.host_bandwidth_bytes_s > 0:
            raise BstarError("swap space must not be negative and host bandwidth positive")
        if not 0 <= self.cold_start_s < self.max_sim_time_s:
            raise BstarError(f"cold start must be in [0, max_sim_time_s), got "
                             f"{self.cold_start_s}")


@dataclass(slots=True)
class Timeline:
    """State at the start of steps (one point per multi-step jump)."""

    time_s: list[float] = field(default_factory=list)
    kv_used_blocks: list[int] = field(default_factory=list)
    num_waiting: list[int] = field(default_factory=list)
    num_running: list[int] = field(default_factory=list)

    def add(self, t: float, used: int, waiting: int, running: int) -> None:
        self.time_s.append(t)
        self.kv_used_blocks.append(used)
        self.num_waiting.append(waiting)
        self.num_running.append(running)


@dataclass(frozen=True, slots=True)
class SimRun:
    """Everything one simulation produced; `metrics.summarize` turns it into numbers."""

    deployment: Deployment
    config: SimConfig
    workload: Workload
    requests: Requests
    num_blocks: int
    block_size: int
    duration_s: float
    num_steps: int
    num_preemptions: int
    itl_values_s: FloatArray  # inter-token gaps, weighted
    itl_weights: IntArray
    timeline: Timeline
    truncated: bool  # stopped at max_sim_time_s (or the step bound) with requests unfinished
    # Why the loop ended: "done" (every request finished), "time limit" (max_sim_time_s
    # simulated), "step limit" (the bound on loop passes, STEPS_PER_TOKEN per token, or on
    # steps, `max_steps`; neither is reached by a run `check_feasible` passed).
    stop_reason: str = "done"
    # Prefix-cache counters as vLLM's vllm:prefix_cache_hits / _queries count them (prompt
    # tokens at admission of requests never preempted); None: no cache modelled.
    prefix_hit_tokens: int | None = None
    prefix_query_tokens: int | None = None
    # Seconds the GPUs spent in steps of each number of scheduled sequences (prefill and
    # decode alike): what `metrics.run_energy` prices; the rest of duration_s is idle.
    busy_s_by_seqs: dict[int, float] = field(default_factory=dict)


def simulate(d: Deployment, cfg: SimConfig, w: Workload) -> SimRun:
    pool = check_feasible(d, cfg, w)
    bs = d.block_size
    caching = w.prompt_ids is not None and cfg.prefix_caching
    sc = cfg.scheduler
    if pool.lookahead_tokens:
        sc = replace(sc, lookahead_tokens=pool.lookahead_tokens)
    host_blocks = cfg.swap_space_bytes // pool.block_bytes \
        if cfg.scheduler.preemption == "swap" else 0
    coeffs = coefficients(d)
    reqs = Requests.new(w.prompt_tokens, w.output_tokens)
    if caching:
        from bstar.sim.prefix_cache import CachingBlockManager

        assert w.prompt_ids is not None
        w.prompt_ids.check(reqs.prompt_tokens)
        bm: BlockManager = CachingBlockManager(pool.num_blocks, bs, w.prompt_ids,
                                               reqs.prompt_tokens, reqs.output_tokens,
                                               host_blocks)
        return _Loop(d, cfg, w, coeffs, reqs, bm, Scheduler(sc, reqs, bm)).run()
    if w.cached_tokens is not None and cfg.prefix_caching:
        # A hit covers whole blocks and never the last prompt token (it must be computed to
        # sample the first output token), as vLLM's prefix cache.
        hit = np.minimum(np.asarray(w.cached_tokens, dtype=np.int64),
                         reqs.prompt_tokens - 1) // bs * bs
        reqs.num_computed[:] = np.maximum(hit, 0)
    bm = BlockManager(pool.num_blocks, bs, host_blocks, blocks_fn=pool.blocks_fn)
    return _Loop(d, cfg, w, coeffs, reqs, bm, Scheduler(sc, reqs, bm)).run()


class _Loop:
    def __init__(self, d: Deployment, cfg: SimConfig, w: Workload, k: StepCoefficients,
                 reqs: Requests, bm: BlockManager, sched: Scheduler) -> None:
        self.d, self.cfg, self.w, self.k = d, cfg, w, k
        self.reqs, self.bm, self.sched = reqs, bm, sched
        self.heap: list[tuple[float, int]] = []  # (time the engine sees it, request id)
        # The server's front end: requests wait here, in arrival order, for its one thread
        # to tokenize their prompts (EngineBehaviour.front_token_s; empty when that is 0).
        self.front: list[tuple[float, int]] = []  # (arrival time, request id)
        self.front_free_s = 0.0  # when the front end's thread is next free
        self.next_issue = 0
        if w.closed_loop:
            for _ in range(min(w.num_users, w.num_requests)):
                self._issue(0.0)
        else:
            assert w.arrival_s is not None
            arr = np.asarray(w.arrival_s, dtype=np.float64)
            if arr.size and not (np.all(np.isfinite(arr)) and float(arr.min()) >= 0):
                bad = int(np.flatnonzero(~np.isfinite(arr) | (arr < 0))[0])
                raise BstarError(f"request {bad + 1}'s arrival time is {arr[bad]!r}: "
                                 "arrivals must be finite and not negative")
            reqs.arrival_s[:] = w.arrival_s
            for i in np.argsort(arr, kind="stable"):
                self._enqueue(float(arr[i]), int(i))
            self._drain_front(np.inf)  # every arrival is known, so is the front end's order
        self.now = 0.0
        # With a scheduling lag of one step, the schedule of the step starting now was made
        # when the previous step started: only requests that had arrived by then join it.
        self.lag = bool(d.behaviour.scheduling_lag_steps)
        self.step_start = 0.0
        self.num_steps = 0
        self.itl_scalar_v: list[float] = []
        self.itl_scalar_w: list[int] = []
        self.itl_arrays_v: list[FloatArray] = []
        self.itl_arrays_w: list[IntArray] = []
        self.timeline = Timeline()
        self.busy_s_by_seqs: dict[int, float] = {}
        self.spec = None
        if cfg.speculative is not None:
            from bstar.sim.speculative import SpecStep

            self.spec = SpecStep(d, cfg.speculative)
        # Swap copies per KV token, per GPU, over the host link.
        self.swap_s_per_token = k.shape.kv_bytes_per_token() \
            / cfg.host_bandwidth_bytes_s

    def _issue(self, t: float) -> None:
        rid = self.next_issue
        self.next_issue += 1
        self.reqs.arrival_s[rid] = t
        self._enqueue(t, rid)

    def _enqueue(self, t: float, rid: int) -> None:
        """Request `rid` arrives at the server at `t`. The server's per-request work
        (request_overhead_s) runs beside other requests'; its tokenization
        (front_token_s per prompt token) waits for the front end's one thread."""
        if self.d.behaviour.front_token_s > 0:
            heapq.heappush(self.front, (t, rid))
        else:
            heapq.heappush(self.heap, (self._ready_s(t), rid))

    def _ready_s(self, t: float) -> float:
        """When a request the front end is done with at `t` can be scheduled: after its
        per-request work, and not before a cold server's first step."""
        return max(t + self.d.behaviour.request_overhead_s, self.cfg.cold_start_s)

    def _tokenized_s(self, t: float, rid: int) -> float:
        """When the front end's thread, free at front_free_s, finishes request `rid` that
        arrived at `t`."""
        return max(t, self.front_free_s) \
            + self.d.behaviour.front_token_s * float(self.reqs.prompt_tokens[rid])

    def _drain_front(self, upto: float) -> None:
        """Tokenize, first come first served, every request that has arrived by `upto`: the
        order is final then, since a closed loop issues no request before the clock."""
        while self.front and self.front[0][0] <= upto:
            t, rid = heapq.heappop(self.front)
            self.front_free_s = self._tokenized_s(t, rid)
            heapq.heappush(self.heap, (self._ready_s(self.front_free_s), rid))

    def _next_arrival_s(self) -> float:
        """The earliest time a request not yet scheduled can reach the engine (inf: none)."""
        t = self.heap[0][0] if self.heap else np.inf
        if self.front:
            t = min(t, self._ready_s(self._tokenized_s(*self.front[0])))
        return float(t)

    def run(self) -> SimRun:
        sched, heap, reqs = self.sched, self.heap, self.reqs
        limit = self.cfg.max_sim_time_s
        closed = self.w.closed_loop
        think = self.w.think_s
        n_total = self.w.num_requests
        truncated = False
        stop = "done"
        stalled = 0
        steps_bound = max_steps(self.w)  # sum(prompt + output): check_feasible says why
        max_passes = STEPS_PER_TOKEN * (steps_bound + n_total) + 1000
        passes = 0
        while True:
            passes += 1
            if passes > max_passes or self.num_steps > steps_bound:
                truncated, stop = True, "step limit"
                break
            if self.front:
                self._drain_front(self.now)
            horizon = self.step_start if self.lag and not sched.idle else self.now
            while heap and heap[0][0] <= horizon:
                sched.add(heapq.heappop(heap)[1])
            if sched.idle:
                if not heap and not self.front:
                    break
                nxt = min(heap[0][0] if heap else np.inf,
                          self.front[0][0] if self.front else np.inf)
                if not nxt > self.now:  # NaN: the clock would never move
                    raise BstarError(f"arrival time {nxt!r} does not advance the clock")
                self.now = nxt
                continue
            if self.now >= limit:
                truncated, stop = True, "time limit"
                break
            if self.cfg.fast_forward and self.spec is None and self._fast_forward():
                continue
            self.timeline.add(self.now, self.bm.num_used, len(sched.waiting),
                              sched.num_running)
            plan = sched.schedule()
            if plan.empty:
                # Only after preempting the sole running request; the next pass admits it
                # (it fits alone: check_feasible).
                stalled += 1
                if stalled > 2:
                    raise RuntimeError("simulator made no progress")  # a bug, not input
                continue
            stalled = 0
            dt = (self.k.batch_step_s(plan.start, plan.new) if self.spec is None
                  else self.spec.step_s(plan)) \
                + (plan.swap_in_tokens + plan.swap_out_tokens) * self.swap_s_per_token
            t0, self.now = self.now, self.now + dt
            self._busy(int(plan.ids.size), dt)
            self.step_start = t0
            self.num_steps += 1
            out = sched.update(plan, t0, self.now)
            num_finished = out.finished.size
            if self.spec is not None:
                fin, extra = self.spec.accept(sched, plan, self.now)
                num_finished += fin.size
                if extra:  # accepted drafts arrive with the verified token: no gap
                    self.itl_scalar_v.append(0.0)
                    self.itl_scalar_w.append(extra)
            if out.contiguous_tokens:
                self.itl_scalar_v.append(dt)
                self.itl_scalar_w.append(out.contiguous_tokens)
            if out.other_gaps_s.size:
                self.itl_arrays_v.append(out.other_gaps_s)
                self.itl_arrays_w.append(np.ones(out.other_gaps_s.size, dtype=np.int64))
            if closed:
                for _ in range(min(num_finished, n_total - self.next_issue)):
                    self._issue(self.now + float(think[self.next_issue]))
        self.timeline.add(self.now, self.bm.num_used, len(sched.waiting), sched.num_running)
        itl_v = np.concatenate([np.asarray(self.itl_scalar_v, dtype=np.float64),
                                *self.itl_arrays_v])
        itl_w = np.concatenate([np.asarray(self.itl_scalar_w, dtype=np.int64),
                                *self.itl_arrays_w])
        return SimRun(self.d, self.cfg, self.w, reqs, self.bm.num_blocks, self.bm.block_size,
                      self.now, self.num_steps, sched.num_preemptions, itl_v, itl_w,
                      self.timeline, truncated or not bool(reqs.done.all()), stop,
                      *self._prefix_counters(), busy_s_by_seqs=self.busy_s_by_seqs)

    def _prefix_counters(self) -> tuple[int | None, int | None]:
        bm, w = self.bm, self.w
        if bm.caching:
            return bm.hit_tokens, bm.query_tokens  # type: ignore[attr-defined]
        if w.cached_tokens is not None and self.cfg.prefix_caching:
            hit = np.minimum(np.asarray(w.cached_tokens, dtype=np.int64),
                             w.prompt_tokens - 1) // bm.block_size * bm.block_size
            return int(np.maximum(hit, 0).sum()), int(w.prompt_tokens.sum())
        return None, None

    # ---- multi-step jump ----------------------------------------------------------------------
    def _busy(self, num_seqs: int, dt: float) -> None:
        """`dt` seconds of steps of `num_seqs` sequences (what run_energy prices)."""
        self.busy_s_by_seqs[num_seqs] = self.busy_s_by_seqs.get(num_seqs, 0.0) + dt

    def _fast_forward(self) -> bool:
        """Run K pure-decode steps at once when nothing else can happen in them: every running
        request decodes (no prefill chunk, all within the token budget), nobody waiting can be
        admitted before a request finishes, and the KV blocks the K steps need are free.
        K stops before the first finish, before a needed block is missing (that step takes the
        preemption path) and at the first step to end past an arrival that could be admitted.
        Returns False (take one ordinary step) when fewer than 2 steps qualify."""
        sched, r, bm, cfg = self.sched, self.reqs, self.bm, self.cfg.scheduler
        b = sched.num_running
        if b == 0 or b > cfg.max_num_batched_tokens:
            return False
        admit_blocked = b >= cfg.max_num_seqs
        if sched.waiting and not admit_blocked:  # cheap checks first: most refusals are here
            head = sched.waiting[0]
            c = int(r.num_computed[head])
            num_tokens = int(r.prompt_tokens[head] + r.num_generated[head])
            if bm.caching:
                _, _, n, need = bm.admission(  # type: ignore[attr-defined]
                    head, c, num_tokens, cfg.max_num_batched_tokens - b)
            else:
                n = min(num_tokens - c, cfg.max_num_batched_tokens - b)
                need = bm.blocks_for(c + n, c)
            if (n > 0 and need <= bm.num_free) or bm.blocks_fn is not None:
                return False  # it gets in this step (or, windowed, once blocks are freed)
            admit_blocked = True  # blocks only shrink until someone finishes
        ids = sched.running[:b]
        comp = r.num_computed[ids]
        gen = r.num_generated[ids]
        if any_of(r.prompt_tokens[ids] + gen - comp != 1) or not all_of(gen):
            return False  # a prefill (or its last chunk) is running
        k_max = int(min_of(r.output_tokens[ids] - gen)) - 1  # the finishing step is ordinary
        if k_max < 2:
            return False
        held = r.num_blocks[ids]
        bs = bm.block_size

        def new_blocks(k: int) -> int:
            # Windowed: nothing freed during the run (an upper bound on every step's need,
            # non-decreasing in k); the commit frees what the run's last step leaves.
            if bm.blocks_fn is not None:
                return int(np.maximum(bm.blocks_for(comp + k, comp) - held, 0).sum())
            return int(sum_of(np.maximum((comp + (k + bs - 1)) // bs - held, 0)))

        if new_blocks(k_max) > bm.num_free:
            lo, hi = 0, k_max  # largest k with new_blocks(k) <= free
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if new_blocks(mid) <= bm.num_free:
                    lo = mid
                else:
                    hi = mid - 1
            k_max = lo
            if k_max < 2:
                return False
        # The step during which an admissible arrival lands still runs; the next one sees it
        # (with a scheduling lag, the one after): the run's steps are priced that far.
        arrival_s = self._next_arrival_s() if not admit_blocked and (self.heap or self.front) \
            else None
        extra = 1 + int(self.lag)
        steps_s = self._run_steps(comp, k_max, arrival_s, extra)
        ends = self.now + running_sum(steps_s)
        cut = len(steps_s)
        if arrival_s is not None:
            cut = min(cut, int(ends.searchsorted(arrival_s, side="left")) + extra)
        # Do not start steps past the time limit.
        cut = min(cut, int(ends.searchsorted(self.cfg.max_sim_time_s, side="left")) + 1)
        if cut < 2:
            return False
        self._commit_decode_run(ids, comp, gen, held, steps_s[:cut], ends[:cut])
        return True

    def _run_steps(self, comp: IntArray, k_max: int, arrival_s: float | None,
                   extra: int) -> FloatArray:
        """The times of the decode run's steps that an arrival at `arrival_s` lets start
        (`StepCoefficients.decode_run_until`), else of all k_max of them: the cut is the
        one pricing all k_max gives, as a prefix of a run is priced as the run is."""
        if arrival_s is not None:
            steps = self.k.decode_run_until(comp, k_max, self.now, arrival_s, extra)
            if steps is not None:
                return np.array(steps)
        return self.k.decode_run_step_s(comp, k_max)

    def _commit_decode_run(self, ids: IntArray, comp: IntArray, gen: IntArray,
                           held: IntArray, steps_s: FloatArray, ends: FloatArray) -> None:
        """Every running request (`ids`, with its computed/generated tokens and blocks held
        before the run) computes and samples one token in each of the run's steps."""
        r, bm, b, cut = self.reqs, self.bm, len(ids), len(steps_s)
        bs = bm.block_size
        self.timeline.add(self.now, bm.num_used, len(self.sched.waiting), b)
        last = r.last_token_s[ids]
        contiguous = last == self.now
        n_contig = int(sum_of(contiguous))
        if n_contig:
            self.itl_scalar_v.append(float(steps_s[0]))
            self.itl_scalar_w.append(n_contig)
        if n_contig < b:
            gaps = ends[0] - last[~contiguous]
            self.itl_arrays_v.append(gaps)
            self.itl_arrays_w.append(np.ones(gaps.size, dtype=np.int64))
        self.itl_arrays_v.append(steps_s[1:])
        self.itl_arrays_w.append(np.full(cut - 1, b, dtype=np.int64))
        if bm.caching:
            need = np.maximum((comp + cut + bs - 1) // bs - held, 0)
            bm.grow_many(ids, need, comp + cut, held + need)  # type: ignore[attr-defined]
        else:
            if bm.blocks_fn is not None:  # as the last of `cut` ordinary steps leaves them
                need = bm.blocks_for(comp + cut, comp + cut - 1) - held
            else:
                need = np.maximum((comp + cut + bs - 1) // bs - held, 0)
            change_blocks(bm, int(need.sum()))
        r.num_blocks[ids] = held + need
        r.num_computed[ids] = comp + cut
        r.num_generated[ids] = gen + cut
        self.step_start = float(ends[-2]) if cut > 1 else self.now
        self._busy(b, float(ends[-1]) - self.now)
        self.now = float(ends[-1])
        r.last_token_s[ids] = self.now
        self.num_steps += cut
        self.sched.note_decode_steps(cut)

