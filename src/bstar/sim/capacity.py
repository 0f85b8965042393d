"""The largest request rate a deployment sustains: one definition for `bstar simulate`,
`bstar search` and the load-stage validation.

A continuous-batching server has no fixed service time: as the rate rises, more requests run
at once and every step gets longer, until the running batch reaches its cap (max_num_seqs,
or what the KV pool holds). Past that point each extra request waits: the queue grows for
as long as the load lasts. A rate is sustained when its queue stays steady.

`queue_grows(run)` is the test on one open-loop simulation: the time from arrival to first
token, against arrival time, over the second half of the arrivals (after the batch has had
time to fill). A queue that grows makes every later request wait longer by a constant
fraction of its arrival time: arriving at n / rate and served from n / capacity, it waits
(rate / capacity - 1) x its arrival time; a steady one does not. Growth is a slope above
GROWTH_SLOPE (so a growing rate is above capacity x 1.02).

`capacity(d, cfg, unit)` is the largest rate whose queue does not grow, by bisection on the
rate with Poisson arrivals (the seed fixed), to REL_TOL. It starts from the completion rate
of a saturated run (every request waiting at t = 0): with equal lengths the requests of a
saturated run move in lock-step waves whose prefills stall the decodes, so that figure is a
floor of what a server fed steadily sustains, not its capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bstar.deployment import Deployment
from bstar.sim.engine import SimConfig, SimRun, simulate
from bstar.sim.traffic import Workload


def saturated_workload(unit: Workload, max_num_seqs: int, kv_blocks: int | None = None,
                       block_size: int = 16) -> Workload:
    """The unit workload's requests (repeated to at least 4 x the batch that can run: at most
    max_num_seqs, and at most what the KV pool holds of the shortest request), all at t=0."""
    batch = max_num_seqs
    if kv_blocks is not None:
        shortest = int(unit.prompt_tokens.min()) + 1
        batch = min(batch, max(1, kv_blocks // -(-shortest // block_size)))
    n = max(unit.num_requests, 4 * batch)
    idx = np.arange(n) % unit.num_requests
    cached = None if unit.cached_tokens is None else np.asarray(unit.cached_tokens)[idx]
    return Workload(unit.prompt_tokens[idx], unit.output_tokens[idx], np.zeros(n),
                    cached_tokens=cached, prompt_ids=_ids(unit, n))


def _ids(unit: Workload, n: int) -> Any:
    """The unit's prompt identity over `n` cycled requests (`PromptIds.cycle`)."""
    return None if unit.prompt_ids is None else unit.prompt_ids.cycle(n)


def capacity_req_s(run: SimRun) -> float:
    """Requests finished per second between the first and third quarter of the finishes of a
    saturated run (the batch is full there: the queue empties only near the end)."""
    f = np.sort(run.requests.finish_s[run.requests.done])
    n = f.size
    if n < 4:
        return n / run.duration_s if run.duration_s > 0 else 0.0
    i, j = n // 4, (3 * n) // 4
    span = float(f[j] - f[i])
    return (j - i) / span if span > 0 else n / run.duration_s


GROWTH_SLOPE = 0.02  # seconds of extra wait per second of arrivals: capacity < 0.98 x rate
REL_TOL = 0.02


def queue_grows(run: SimRun, rate_req_s: float | None = None) -> bool:
    """Whether the wait of an open-loop run grows over the second half of its arrivals (a
    request still unfinished counts as waiting past the end of the run)."""
    r = run.requests
    arrival = r.arrival_s
    n = arrival.size
    if n < 8:
        return bool(run.truncated)
    order = np.argsort(arrival, kind="stable")
    late = order[n // 2:]
    first = np.where(np.isnan(r.first_token_s[late]), run.duration_s, r.first_token_s[late])
    wait = first - arrival[late]
    t = arrival[late]
    if float(t[-1] - t[0]) <= 0:
        return False
    slope = float(np.polyfit(t, wait, 1)[0])
    return slope > GROWTH_SLOPE


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one saturated simulation says: the capacity and the batch it ran at."""

    capacity_req_s: float
    capacity_tok_s: float  # output tokens per second at capacity
    running_max: int
    preemptions: int
    kv_utilization_max: float
    max_num_seqs: int

    @property
    def kv_bound(self) -> bool:
        """The KV pool, not max_num_seqs, caps the batch at capacity."""
        return self.preemptions > 0 or self.running_max < self.max_num_seqs

    def sustains(self, rate_req_s: float) -> bool:
        """A steady queue at this rate (below the capacity)."""
        return rate_req_s < self.capacity_req_s

    def to_dict(self) -> dict[str, Any]:
        return {"capacity_req_s": self.capacity_req_s, "capacity_tok_s": self.capacity_tok_s,
                "running_max": self.running_max, "preemptions": self.preemptions,
                "kv_utilization_max": self.kv_utilization_max, "kv_bound": self.kv_bound}


def open_loop(unit: Workload, rate_req_s: float, num_requests: int, seed: int = 0) -> Workload:
    """`num_requests` of the unit's requests (cycled) arriving as Poisson at `rate_req_s`."""
    from bstar.stats import poisson_gaps_s

    idx = np.arange(num_requests) % unit.num_requests
    gaps = poisson_gaps_s(rate_req_s, np.random.default_rng(seed), num_requests)
    cached = None if unit.cached_tokens is None else np.asarray(unit.cached_tokens)[idx]
    return Workload(unit.prompt_tokens[idx], unit.output_tokens[idx], np.cumsum(gaps),
                    cached_tokens=cached, prompt_ids=_ids(unit, num_requests))


def sample_size(max_num_seqs: int) -> int:
    """Requests per capacity probe: enough for the batch to fill (by Little's law near
    capacity, about two batches' worth of arrivals) and then to show a growing wait: six
    batches' worth, at least 400, at most 3,000."""
    return int(min(3000, max(400, 6 * max_num_seqs)))


def head(unit: Workload, n: int) -> Workload:
    """The unit's first `n` requests (all of them when it has fewer), arrivals kept."""
    if unit.num_requests <= n:
        return unit
    cached = None if unit.cached_tokens is None else np.asarray(unit.cached_tokens)[:n]
    arrivals = None if unit.arrival_s is None else np.asarray(unit.arrival_s)[:n]
    ids = None if unit.prompt_ids is None else unit.prompt_ids.take(np.arange(n))
    return Workload(unit.prompt_tokens[:n], unit.output_tokens[:n], arrivals,
                    cached_tokens=cached, prompt_ids=ids)


def capacity(d: Deployment, cfg: SimConfig, unit: Workload, seed: int = 0,
             rel_tol: float = REL_TOL, num_requests: int | None = None
             ) -> tuple[Capacity, SimRun]:
    """The deployment's capacity for requests like `unit`'s: the largest Poisson rate whose
    queue does not grow (see the module docstring), to `rel_tol`; with the run there.

    Every probe, the saturated one included, runs `sample_size(max_num_seqs)` of the unit's
    requests (a saturated run of 10,000 requests says what one of 1,536 does, at 6x the
    cost), or `num_requests` of them (bench/capacity_noise.py: what the size does to the
    answer). The bracket starts warm: the saturated floor is a few percent under the
    capacity (lock-step waves), so the first rate above it is floor x (1 + 4 rel_tol), two
    bisections from rel_tol, and only a floor that still does not grow there widens by
    1.5x."""
    from bstar.sim.feasible import sim_pool
    from bstar.sim.metrics import summarize

    seqs = cfg.scheduler.max_num_seqs
    n = sample_size(seqs) if num_requests is None else num_requests
    sample = head(unit, n)
    sat = simulate(d, cfg, saturated_workload(sample, seqs, sim_pool(d, cfg, sample).num_blocks,
                                              d.block_size))
    floor = capacity_req_s(sat)
    mean_out = float(np.mean(unit.output_tokens))

    def grows(rate: float) -> tuple[bool, SimRun]:
        run = simulate(d, cfg, open_loop(unit, rate, n, seed))
        return queue_grows(run, rate), run

    if floor <= 0:
        s = summarize(sat)
        return Capacity(0.0, 0.0, s.running_max, s.preemptions, s.kv_utilization_max,
                        seqs), sat
    lo, hi = 0.0, floor
    lo_run: SimRun | None = None
    step = 1.0 + 4.0 * rel_tol
    for _ in range(12):  # find a growing rate above the floor
        g, run = grows(hi)
        if g:
            break
        lo, lo_run, hi = hi, run, hi * step
        step = 1.5
    while lo == 0.0:  # the floor itself grows: look below it
        hi_ = hi / 1.5
        g, run = grows(hi_)
        if not g:
            lo, lo_run = hi_, run
            break
        hi = hi_
        if hi < 1e-6:
            break
    while hi / max(lo, 1e-12) - 1 > rel_tol and lo > 0:
        mid = float(np.sqrt(lo * hi))
        g, run = grows(mid)
        if g:
            hi = mid
        else:
            lo, lo_run = mid, run
    run = lo_run if lo_run is not None else sat
    s = summarize(run)
    sat_s = summarize(sat)
    return Capacity(lo, lo * mean_out, max(s.running_max, sat_s.running_max),
                    s.preemptions, max(s.kv_utilization_max, sat_s.kv_utilization_max),
                    seqs), run
