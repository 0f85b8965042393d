"""A replica's SLO attainment at steady loads below the rate it serves at the SLO: what
`bstar capacity` reads for every interval where enough replicas serve (bstar.capacity.run).
Pure: Poisson arrivals at a few fractions of the rate, each simulated once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bstar.search.candidates import Replica, sim_config
from bstar.search.spec import at_rate
from bstar.sim import Slo, Workload, simulate
from bstar.sim.capacity import head

STEADY_FRACTIONS = (0.25, 0.5, 0.75, 0.9, 1.0)
STEADY_REQUESTS = 400  # requests simulated at each rate


@dataclass(frozen=True, slots=True)
class SteadyAttainment:
    """Attainment of one replica fed Poisson arrivals at fractions of its SLO rate."""

    rates_req_s: tuple[float, ...]
    attainment: tuple[float, ...]

    def at(self, rate_req_s: float) -> float:
        """Linear between the simulated rates; below the lowest, the lowest's (a lighter
        load only helps)."""
        return float(np.interp(rate_req_s, self.rates_req_s, self.attainment))


def steady_attainment(r: Replica, unit: Workload, rate_req_s: float, slo: Slo,
                      capacity_req_s: float | None = None,
                      num_requests: int = STEADY_REQUESTS) -> SteadyAttainment:
    """Simulated at STEADY_FRACTIONS of the SLO rate and, with `capacity_req_s` above it,
    half-way to 0.98 x the capacity and at it (loads whose queue still does not grow: what
    `--replay overloaded` reads for the milder ramps)."""
    from bstar.capacity.replay import met

    u = head(unit, num_requests)
    rates = [f * rate_req_s for f in STEADY_FRACTIONS]
    top = 0.98 * capacity_req_s if capacity_req_s is not None else 0.0
    if top > 1.01 * rate_req_s:
        rates += [(rate_req_s + top) / 2, top]
    att = []
    for x in rates:
        w = at_rate(u, x)
        run = simulate(r.deployment, sim_config(r), w)
        rq = run.requests
        assert w.arrival_s is not None
        ok = met(w.arrival_s, rq.first_token_s, rq.finish_s, rq.done, rq.output_tokens, slo)
        att.append(float(ok.mean()))
    return SteadyAttainment(tuple(rates), tuple(att))
