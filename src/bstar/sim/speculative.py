"""Speculative decoding in the simulator (issue 31): the step's price and the accepted
tokens, beside the plain path (bstar.sim.engine calls these only when `SimConfig.speculative`
is set; the plain loop is unchanged).

Each step every decoding sequence verifies its last sampled token and K draft tokens
(priced by `bstar.specdec.scheduled_step_s`, the plan's speculative step); afterwards it keeps
a seeded draw of accepted drafts, the leading successes of K Bernoulli(a) trials, plus the
token the verify step samples. Its KV grows by the accepted tokens; the blocks that only
held rejected drafts are freed. The scheduler reserves K lookahead slots per scheduled
sequence for the drafts it verifies, and K more for an EAGLE head or MTP layer, as vLLM V1's
(`num_lookahead_tokens`; `specdec.lookahead_slots`, `SchedulerConfig.lookahead_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from bstar import roofline as rl
from bstar import step as st
from bstar.deployment import Deployment
from bstar.kv_pool import kv_bytes_per_seq_allocated
from bstar.sim.scheduler import Scheduler, StepPlan
from bstar.sim.sequence import FloatArray, IntArray
from bstar.sim.steptime import OneStep
from bstar.specdec import (
    PROB_BYTES,
    Drafter,
    SpecConfig,
    accepted_drafts,
    lookahead_slots,
)


@dataclass(frozen=True, slots=True)
class SpecSim:
    """Speculation for a simulation: K, the acceptance rate, the drafter, the draw's seed."""

    config: SpecConfig
    drafter: Drafter
    seed: int = 0

    @property
    def k(self) -> int:
        return self.config.num_speculative_tokens

    @property
    def lookahead_tokens(self) -> int:
        return lookahead_slots(self.drafter, self.k)


def num_blocks(d: Deployment, spec: SpecSim, block_size: int) -> int:
    """The KV pool in blocks with speculation: the drafter's weights leave the pool and its
    KV joins every block (a block of the target's layers and one of the drafter's)."""
    pool = rl.kv_pool_bytes(d) - spec.drafter.resident_bytes_per_gpu
    per_block = kv_bytes_per_seq_allocated(d, block_size)
    if spec.drafter.deployment is not None:
        per_block += kv_bytes_per_seq_allocated(spec.drafter.deployment, block_size)
    return max(0, math.floor(pool / per_block))


class SpecStep:
    """Prices a scheduled step with speculation and applies each sequence's accepted drafts."""

    def __init__(self, d: Deployment, spec: SpecSim) -> None:
        self.d, self.spec = d, spec
        self.rng = np.random.default_rng([spec.seed, 31])
        self.target = OneStep(st.shape(d), d.eff)
        dd = spec.drafter.deployment
        self.draft = None if dd is None else OneStep(st.shape(dd), dd.eff)
        self.prob_bw = d.gpu.hbm_bandwidth_bytes_s * d.eff.bandwidth
        self.vocab_size = d.model.vocab_size

    def step_s(self, plan: StepPlan) -> float:
        """`specdec.scheduled_step_s(d, drafter, plan.start, plan.new, k)` in Python floats
        (`OneStep`, as the plain path's step): the same terms in the same order, so the same
        number (tests/test_sim_speculative_fast.py holds them equal); numpy's cost per call on
        one-element StepWorks was 80% of a speculative simulation (issue 40)."""
        k = self.spec.k
        c = plan.start.astype(np.float64)
        n = plan.new.astype(np.float64)
        if n.size == 0:
            return 0.0
        dec = n == 1
        nd = float(dec.sum())
        total = self._verify_s(self.target, c, n, dec, nd, k, True)
        total += nd * (k + 1) * self.vocab_size * PROB_BYTES / self.prob_bw
        one = self.draft
        if one is not None:
            total += self._verify_s(one, c, n, dec, nd, k, False)
            if nd:
                cd = c[dec] + k
                ones = np.ones_like(cd)
                for j in range(1, k):
                    total += one.price(*one.shape.scheduled_sums(cd + j, ones), overhead=False)
        return total

    @staticmethod
    def _verify_s(one: OneStep, c: FloatArray, n: FloatArray, dec: npt.NDArray[np.bool_],
                  nd: float, k: int, overhead: bool) -> float:
        """`specdec._verify_work` priced by `one` (with or without the overhead terms)."""
        sums = one.shape.scheduled_sums(c + k * dec, n)
        if not nd:
            return one.price(*sums, overhead=overhead)
        q = k + 1
        (num_seqs, num_dec, num_chunks, _, kv, score, attn, ckv, ctiles, cattn,
         cattn_g) = sums
        # every term that counts the step's rows takes the drafts too, the row count
        # included (as _verify_work)
        rows = float(n.sum()) + k * nd
        return one.price(num_seqs, num_dec, num_chunks, rows, kv, score * q, attn * q,
                         ckv, ctiles, cattn, cattn_g, gemm_tokens=rows, overhead=overhead)

    def accept(self, sched: Scheduler, plan: StepPlan, end_s: float) -> tuple[IntArray, int]:
        """After `Scheduler.update`: each sequence that verified drafts this step (it decoded
        one token and had emitted one before) keeps its accepted drafts, up to its output
        length. Returns the requests this finished and the extra tokens emitted."""
        r, bm = sched.reqs, sched.blocks
        ids = plan.ids[plan.new == 1]
        ids = ids[~r.done[ids] & (r.first_token_s[ids] < end_s)]
        if ids.size == 0:
            return ids, 0
        m = accepted_drafts(self.rng, self.spec.config.acceptance_rate, self.spec.k, ids.size)
        extra = np.minimum(m, r.output_tokens[ids] - r.num_generated[ids])
        r.num_generated[ids] += extra
        r.num_computed[ids] += extra
        comp = r.num_computed[ids]
        keep = -(-comp // bm.block_size) if bm.blocks_fn is None else np.asarray(
            [bm.blocks_for(int(c)) for c in comp], dtype=np.int64)
        freed = np.maximum(r.num_blocks[ids] - keep, 0)
        bm.free(int(freed.sum()))
        r.num_blocks[ids] -= freed
        fin = ids[r.num_generated[ids] == r.output_tokens[ids]]
        if fin.size:
            r.finish_s[fin] = end_s
            r.done[fin] = True
            bm.free(int(r.num_blocks[fin].sum()))
            r.num_blocks[fin] = 0
            run = sched.running[:sched.num_running]
            kept = run[~r.done[run]]
            sched.num_running = kept.size
            sched.running[:kept.size] = kept
        return fin, int(extra.sum())
