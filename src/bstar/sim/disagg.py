"""A disaggregated deployment simulated request by request: a prefill pool and a decode pool,
one scheduler each, and the KV transfer between them. Pure: the seed is passed in, nothing
is written.

An event loop over a heap of (time, order, event). Each request:

1. arrives (a closed loop's user sends it when its last one ended, all users at t = 0; or an
   open Poisson stream) and is held `request_overhead_s` (+ `front_token_s` a prompt token)
   by the front end (the engine's `EngineBehaviour`, as the single-pool simulator holds it);
2. waits in the prefill pool's FIFO queue; an idle prefill worker takes whole prompts from
   its head while they fit its step (`max_num_seqs`, the token budget
   `max_num_batched_tokens`; the first always: one longer than the budget runs alone in
   chunks of the budget) and runs them as one step priced by `bstar.step`
   (`sim.steptime.OneStep`);
3. its KV crosses the link (`bstar.kv_link.kv_transfer`: latency + one GPU's bytes over one
   GPU's link) to the decode worker with the fewest requests, where it waits;
4. a decode worker admits waiting requests (FIFO) at each step boundary while it holds fewer
   than its cap (min(max_num_seqs, B_mem), `bstar.disaggregate.decode_side`) and runs
   back-to-back decode steps over what it holds, each priced by `bstar.step` at the batch's
   actual context; a request's first token is the end of its first decode step (TTFT) and it
   leaves when its output is complete. With speculation on the decode side
   (`PoolSpec.speculative`, MTP or EAGLE), every decode step is `bstar.specdec`'s
   scheduled speculative step (verify k + 1 tokens a sequence, the draft passes) and each
   sequence gains 1 + its accepted drafts (`specdec.accepted_drafts`: the leading successes
   of k Bernoulli(a) trials, drawn from the seed), capped at its output.

Scored as the benchmark client does: TTFT from the send to the first token, TPOT =
(E2E - TTFT) / (output - 1), means over the requests after `warmup_requests`.

Not simulated (docs/disaggregation.md, "What bstar does not model"): links shared by
concurrent transfers, KV-aware routing, layer-by-layer KV streaming, preemption on the decode
side (the cap already keeps the pool from running out).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.kv_link import KvLink, kv_transfer
from bstar.sim.steptime import coefficients
from bstar.specdec import SpecConfig
from bstar.stats import poisson_gaps_s

MAX_REQUESTS = 2_000_000


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One pool as the simulator sees it: its workers' deployment and limits."""

    d: Deployment
    workers: int
    max_num_seqs: int  # decode: the batch cap (min of the engine's and B_mem)
    max_num_batched_tokens: int  # prefill: the step's token budget (decode: unused)
    speculative: SpecConfig | None = None  # decode: speculative decoding (module docstring)


@dataclass(slots=True)
class _Req:
    id: int
    user: int
    sent_s: float
    prompt: int
    output: int
    prefill_start_s: float = math.nan
    kv_arrived_s: float = math.nan
    first_token_s: float = math.nan
    done_s: float = math.nan
    generated: int = 0


@dataclass(frozen=True, slots=True)
class DisaggSimResult:
    """Per-request times (s) of the counted requests, and the means the client reports."""

    ttft_s: np.ndarray = field(repr=False)
    tpot_s: np.ndarray = field(repr=False)
    e2e_s: np.ndarray = field(repr=False)
    prefill_wait_s: np.ndarray = field(repr=False)  # from schedulable to its prefill step
    kv_to_first_token_s: np.ndarray = field(repr=False)  # KV arrived -> first token: the
    # wait for a decode slot and the first decode step
    span_s: float
    output_tokens: int
    num_gpus: int
    requests: int
    warmup_requests: int

    def to_dict(self) -> dict[str, Any]:
        def stats(a: np.ndarray) -> dict[str, float]:
            return {"mean_ms": float(a.mean() * 1e3), "median_ms": float(np.median(a) * 1e3),
                    "p99_ms": float(np.percentile(a, 99) * 1e3)}

        return {"layout": "disaggregated", "requests": self.requests,
                "warmup_requests": self.warmup_requests, "ttft": stats(self.ttft_s),
                "tpot": stats(self.tpot_s), "e2e": stats(self.e2e_s),
                "prefill_wait": stats(self.prefill_wait_s),
                "kv_to_first_token": stats(self.kv_to_first_token_s), "span_s": self.span_s,
                "output_tok_s_per_gpu": self.output_tokens / self.span_s / self.num_gpus}


def _full_attention_only(d: Deployment) -> bool:
    return all(g.kind == "full" and not g.window_tokens for g in d.model.layer_groups())


def simulate_disaggregated(prefill: PoolSpec, decode: PoolSpec, link: KvLink, *,
                           num_requests: int, prompt_len: tuple[int, int],
                           output_len: tuple[int, int], concurrency: int | None = None,
                           rate_req_s: float | None = None, seed: int = 0,
                           warmup_requests: int = 0, attention_tp: int | None = None,
                           max_sim_time_s: float = 7 * 24 * 3600.0) -> DisaggSimResult:
    """Run the two pools (module docstring, `simulate_pools`) and return the counted
    requests' times. Lengths are uniform integers in [min, max]; `concurrency` users in a
    closed loop or a Poisson stream of `rate_req_s`. `attention_tp`: ways the decode side shards a
    sequence's KV (default its TP size; TP / attention DP with DP attention)."""
    if (concurrency is None) == (rate_req_s is None):
        raise BstarError("give a concurrency or a rate, one of them")
    if not 1 <= num_requests <= MAX_REQUESTS:
        raise BstarError(f"requests must be in 1..{MAX_REQUESTS:,}, got {num_requests}")
    if not 0 <= warmup_requests < num_requests:
        raise BstarError("warm-up requests must be fewer than the requests")
    for lo, hi in (prompt_len, output_len):
        if not 1 <= lo <= hi:
            raise BstarError(f"a length range must be 1 <= min <= max, got [{lo}, {hi}]")
    rng = np.random.default_rng(seed)
    prompts = rng.integers(prompt_len[0], prompt_len[1] + 1, num_requests)
    outputs = rng.integers(output_len[0], output_len[1] + 1, num_requests)
    arrival_s = None
    if rate_req_s is not None:
        gaps = poisson_gaps_s(rate_req_s, rng, num_requests)
        arrival_s = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    return simulate_pools(prefill, decode, link, prompts, outputs, arrival_s=arrival_s,
                          concurrency=concurrency, warmup_requests=warmup_requests,
                          attention_tp=attention_tp, max_sim_time_s=max_sim_time_s,
                          seed=seed)


def simulate_pools(prefill: PoolSpec, decode: PoolSpec, link: KvLink, prompts: Any,
                   outputs: Any, *, arrival_s: Any = None, concurrency: int | None = None,
                   warmup_requests: int = 0, attention_tp: int | None = None,
                   max_sim_time_s: float = 7 * 24 * 3600.0, seed: int = 0) -> DisaggSimResult:
    """The two pools over given requests: `prompts[i]` and `outputs[i]` tokens, sent at
    `arrival_s[i]` (an open stream, nondecreasing) or by `concurrency` users in a closed
    loop (one of the two). `bstar search` runs its drawn workloads through this; the module
    docstring says what is simulated. Long on purpose: one event loop whose handlers share
    its queues and clock, as closures (split apart, each would take them all as
    arguments). `seed` draws the accepted drafts of a speculative decode side."""
    prompts = np.asarray(prompts, dtype=np.int64)
    outputs = np.asarray(outputs, dtype=np.int64)
    num_requests = len(prompts)
    if (concurrency is None) == (arrival_s is None):
        raise BstarError("give a concurrency or arrival times, one of them")
    if not 1 <= num_requests <= MAX_REQUESTS or len(outputs) != num_requests:
        raise BstarError(f"requests must be in 1..{MAX_REQUESTS:,}, prompts and outputs "
                         "alike")
    if not 0 <= warmup_requests < num_requests:
        raise BstarError("warm-up requests must be fewer than the requests")
    if int(prompts.min()) < 1 or int(outputs.min()) < 1:
        raise BstarError("every prompt and output must be at least 1 token")
    pre_c, dec_c = coefficients(prefill.d), coefficients(decode.d)
    beh = prefill.d.behaviour
    full_only = _full_attention_only(decode.d)
    dec_shape = dec_c.shape
    shard = attention_tp or decode.d.num_gpus
    kv_prec, model = decode.d.kv, decode.d.model
    transfer_cache: dict[int, float] = {}

    def transfer_s(prompt: int) -> float:
        t = transfer_cache.get(prompt)
        if t is None:
            t = kv_transfer(model, kv_prec, prompt, shard, link).transfer_s
            transfer_cache[prompt] = t
        return t

    heap: list[tuple[float, int, str, Any]] = []
    order = 0

    def push(t: float, kind: str, payload: Any) -> None:
        nonlocal order
        order += 1
        heapq.heappush(heap, (t, order, kind, payload))

    reqs: list[_Req] = []
    next_id = 0

    def send(t: float, user: int) -> None:
        nonlocal next_id
        if next_id >= num_requests:
            return
        i = next_id
        next_id += 1
        r = _Req(i, user, t, int(prompts[i]), int(outputs[i]))
        reqs.append(r)
        push(t + beh.request_overhead_s + beh.front_token_s * r.prompt, "ready", r)

    if concurrency is not None:
        for u in range(min(concurrency, num_requests)):
            send(0.0, u)
    else:
        for t_send in np.asarray(arrival_s, dtype=np.float64):
            send(float(t_send), -1)

    prefill_queue: list[_Req] = []
    pq_head = 0
    prefill_idle = list(range(prefill.workers))
    dec_waiting: list[list[_Req]] = [[] for _ in range(decode.workers)]
    dec_running: list[list[_Req]] = [[] for _ in range(decode.workers)]
    dec_busy = [False] * decode.workers
    dec_load = [0] * decode.workers  # requests a worker holds or waits for
    budget = prefill.max_num_batched_tokens

    def prefill_step_s(batch: list[_Req]) -> float:
        if len(batch) == 1 and batch[0].prompt > budget:
            p, total = batch[0].prompt, 0.0
            for start in range(0, p, budget):
                total += pre_c.batch_step_s([float(start)], [float(min(budget, p - start))])
            return total
        return pre_c.batch_step_s(np.zeros(len(batch)), [float(r.prompt) for r in batch])

    def start_prefills(t: float) -> None:
        nonlocal pq_head
        while prefill_idle and pq_head < len(prefill_queue):
            w = prefill_idle.pop()
            batch = [prefill_queue[pq_head]]
            pq_head += 1
            tokens = batch[0].prompt
            while (pq_head < len(prefill_queue) and len(batch) < prefill.max_num_seqs
                   and tokens + prefill_queue[pq_head].prompt <= budget):
                tokens += prefill_queue[pq_head].prompt
                batch.append(prefill_queue[pq_head])
                pq_head += 1
            for r in batch:
                r.prefill_start_s = t
            push(t + prefill_step_s(batch), "prefilled", (w, batch))

    spec = decode.speculative
    if spec is not None:
        from bstar import specdec as sd

        drafter = sd.make_drafter(decode.d, spec.drafter)
        spec_rng = np.random.default_rng(seed)

    def decode_step_s(running: list[_Req]) -> float:
        if spec is not None:
            starts = [float(r.prompt + r.generated) for r in running]
            return sd.scheduled_step_s(decode.d, drafter, starts, np.ones(len(running)),
                                       spec.num_speculative_tokens)
        b = float(len(running))
        if full_only:  # every layer reads all a sequence holds: one sum
            held = float(sum(r.prompt + r.generated + 1 for r in running))
            helds = [held] * len(dec_shape.groups)
        else:
            ctx = np.array([r.prompt + r.generated + 1 for r in running], dtype=np.float64)
            helds = [float(g.held(ctx).sum()) for g in dec_shape.groups]
        kv = score = attn = 0.0
        for g, h in zip(dec_shape.groups, helds, strict=True):
            kv += g.kv_s_per_token * h + g.state_s_per_seq * b
            score += g.score_s_per_pos * h
            attn += g.decode_attention_s_per_pos * h
        return dec_c.one.price(b, b, 0.0, b, kv, score, attn, 0.0, 0.0, 0.0, 0.0)

    def start_decode(t: float, w: int) -> None:
        running, waiting = dec_running[w], dec_waiting[w]
        while waiting and len(running) < decode.max_num_seqs:
            running.append(waiting.pop(0))
        if not running:
            dec_busy[w] = False
            return
        dec_busy[w] = True
        push(t + decode_step_s(running), "decoded", w)

    done = 0
    t = 0.0
    while heap:
        t, _, kind, payload = heapq.heappop(heap)
        if t > max_sim_time_s:
            raise BstarError(f"the simulation passed {max_sim_time_s:g} s of simulated time "
                             f"with {num_requests - done} requests left")
        if kind == "ready":
            prefill_queue.append(payload)
            start_prefills(t)
        elif kind == "prefilled":
            w, batch = payload
            prefill_idle.append(w)
            for r in batch:
                push(t + transfer_s(r.prompt), "kv", r)
            start_prefills(t)
        elif kind == "kv":
            r = payload
            r.kv_arrived_s = t
            w = min(range(decode.workers), key=lambda i: (dec_load[i], i))
            dec_load[w] += 1
            dec_waiting[w].append(r)
            if not dec_busy[w]:
                start_decode(t, w)
        elif kind == "decoded":
            w = payload
            still = []
            gains = (None if spec is None else 1 + sd.accepted_drafts(
                spec_rng, spec.acceptance_rate, spec.num_speculative_tokens,
                len(dec_running[w])))
            for j, r in enumerate(dec_running[w]):
                r.generated = (r.generated + 1 if gains is None
                               else min(r.output, r.generated + int(gains[j])))
                if math.isnan(r.first_token_s):  # its first step (1 token, or more drafted)
                    r.first_token_s = t
                if r.generated >= r.output:
                    r.done_s = t
                    dec_load[w] -= 1
                    done += 1
                    if concurrency is not None:
                        send(t, r.user)
                else:
                    still.append(r)
            dec_running[w] = still
            start_decode(t, w)
    counted = [r for r in reqs if r.id >= warmup_requests]
    ttft = np.array([r.first_token_s - r.sent_s for r in counted])
    e2e = np.array([r.done_s - r.sent_s for r in counted])
    outs = np.array([r.output for r in counted], dtype=np.float64)
    tpot = np.where(outs > 1, (e2e - ttft) / np.maximum(outs - 1, 1), 0.0)
    ready = np.array([r.sent_s + beh.request_overhead_s + beh.front_token_s * r.prompt
                      for r in counted])
    pwait = np.array([r.prefill_start_s for r in counted]) - ready
    start = min(r.sent_s for r in counted)
    dwait = np.array([r.first_token_s - r.kv_arrived_s for r in counted])
    return DisaggSimResult(ttft, tpot, e2e, pwait, dwait, max(t - start, 1e-12),
                           int(outs.sum()), prefill.d.num_gpus * prefill.workers
                           + decode.d.num_gpus * decode.workers, len(counted),
                           warmup_requests)


def simulate_plan(plan: Any, *, num_requests: int, prompt_len: tuple[int, int],
                  output_len: tuple[int, int], concurrency: int | None = None,
                  rate_req_s: float | None = None, seed: int = 0,
                  warmup_requests: int = 0) -> DisaggSimResult:
    """`simulate_disaggregated` over a `bstar.disaggregate.DisaggPlan`'s two sides: its
    deployments, worker counts, prefill budget and decode cap (min of the engine's and
    B_mem), and its link."""
    dd = plan.deployment
    pre = PoolSpec(plan.prefill_d, dd.prefill.workers,
                   dd.prefill.max_num_seqs or MAX_REQUESTS, plan.prefill.budget_tokens)
    dec = PoolSpec(plan.decode_d, dd.decode.workers, plan.decode.batch, 0,
                   plan.decode.speculative)
    return simulate_disaggregated(pre, dec, plan.transfer.link, num_requests=num_requests,
                                  prompt_len=prompt_len, output_len=output_len,
                                  concurrency=concurrency, rate_req_s=rate_req_s, seed=seed,
                                  warmup_requests=warmup_requests,
                                  attention_tp=dd.decode.attention_tp)
