"""TensorRT-LLM's attention-data-parallel balance: context requests held until every rank
has one (PyExecutor._balance_adp_requests, tensorrt_llm/_torch/pyexecutor/py_executor.py,
read at NVIDIA/TensorRT-LLM's 1.1-1.3 releases; `attention_dp_config` in the server's
options: enable_balance, timeout_iters, batching_wait_iters; off unless enable_balance).

With attention DP every rank runs its own requests' attention, and a step waits for the
slowest rank. So that one rank's prefill does not stall seven ranks' decodes, the executor
holds new prompts (context requests) until each rank has one to run. Every iteration:

- every rank has a context request and fewer generation requests than its max_batch_size:
  the wait counter is reset; the prompts run (after `batching_wait_iters` more iterations
  when every rank also decodes);
- otherwise the counter goes up and the prompts wait; they run when it reaches
  `timeout_iters` (the counter is reset), or at once when some rank has nothing to decode.

The counter runs on every iteration, whether or not a prompt waits: a lone prompt waits
until the counter next reaches the timeout, anywhere from 0 to timeout_iters iterations.
InferenceX's and InferenceMAX's TensorRT-LLM scripts with attention DP set enable_balance,
timeout_iters 60 and batching_wait_iters 0 (data/inferencex-h200/README.md).

A new request goes to the rank with the fewest active requests (TensorRT-LLM's request
queue assigns new requests across ranks by their active counts; ties to the lowest rank)
and stays there; each rank admits from its own line within its share of the step's token
budget and of max_num_seqs (`room`; the scheduler's `_admit`). Not modelled: the gate
holding a running prompt's later chunks (the scripts' max_num_tokens fits a whole prompt a
rank).
"""

from __future__ import annotations

import numpy as np

from bstar.sim.sequence import IntArray


class AdpBalance:
    """The balance gate's state over one simulation (see the module docstring)."""

    __slots__ = ("batching_count", "batching_wait", "rank_of", "ranks",
                 "seqs_per_rank", "timeout", "wait_count")

    def __init__(self, num_requests: int, ranks: int, max_num_seqs: int, timeout_iters: int,
                 batching_wait_iters: int = 0) -> None:
        self.ranks = ranks
        # A rank's max_batch_size: the server's cap split over its ranks.
        self.seqs_per_rank = max(1, max_num_seqs // ranks)
        self.timeout = timeout_iters
        self.batching_wait = batching_wait_iters
        self.rank_of = np.full(num_requests, -1, dtype=np.int64)
        self.wait_count = 0
        self.batching_count = 0

    def assign(self, rid: int, active: IntArray) -> None:
        """A request that reaches the engine goes, once, to the rank with the fewest of the
        `active` requests (running or waiting)."""
        if self.rank_of[rid] < 0:
            placed = active[self.rank_of[active] >= 0]
            self.rank_of[rid] = int(np.argmin(self._per_rank(placed)))

    def _per_rank(self, ids: IntArray) -> IntArray:
        return np.bincount(self.rank_of[ids], minlength=self.ranks)

    def _every_rank_ready(self, ctx: IntArray, gen: IntArray) -> bool:
        """Every rank has a prompt (`ctx` a rank) and room beside its decodes (`gen`)."""
        return bool((ctx > 0).all()) and bool((gen < self.seqs_per_rank).all())

    def opens(self, waiting: IntArray, prefilling: IntArray, decoding: IntArray) -> bool:
        """One iteration of the gate: whether this step may admit waiting requests, given
        the requests waiting, the running ones still in their prompt and those decoding."""
        gen = self._per_rank(decoding)
        all_gen = bool((gen > 0).all())
        if self._every_rank_ready(self._per_rank(waiting) + self._per_rank(prefilling), gen):
            self.wait_count = 0
            if all_gen and self.batching_count < self.batching_wait:
                self.batching_count += 1
                return False
            self.batching_count = 0
            return True
        self.wait_count += 1
        if self.wait_count >= self.timeout or not all_gen:
            self.wait_count = 0
            return True
        return False

    def room(self, ids: IntArray, sched: IntArray, running: IntArray,
             max_num_batched_tokens: int) -> tuple[IntArray, IntArray]:
        """Each rank's tokens left of its share of the step's budget after its running
        requests' scheduled ones, and its seats left under its max_batch_size."""
        share = max_num_batched_tokens // self.ranks
        used = np.bincount(self.rank_of[ids], weights=sched, minlength=self.ranks)
        return ((share - used).astype(np.int64),
                self.seqs_per_rank - self._per_rank(running))

    def jumped(self, k: int, waiting: IntArray, decoding: IntArray) -> None:
        """`k` pure decode iterations ran at once (the simulator's multi-step jump): nobody
        could be admitted in them, and each moved the counter as `opens` would."""
        gen = self._per_rank(decoding)
        if bool((gen > 0).all()) and not self._every_rank_ready(self._per_rank(waiting), gen):
            self.wait_count = (self.wait_count + k) % self.timeout
        else:
            self.wait_count = 0
