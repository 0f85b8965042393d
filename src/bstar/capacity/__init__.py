"""`bstar capacity`: replicas that follow a demand curve over a day, under static, reactive
and scheduled policies, with what each costs and the SLO attainment it keeps through the
transitions (docs/capacity.md). Pure: a demand curve, deployments and an SLO in, numbers out.

    from bstar.capacity import diurnal, plan_capacity, Settings
    result = plan_capacity([replica], diurnal(100, 20), traffic, slo, Settings(delay_s=300))
"""

from __future__ import annotations

from bstar.capacity.demand import DemandCurve, diurnal, from_trace, parse_rate_csv
from bstar.capacity.policies import POLICIES, Schedule, Settings, required, schedule
from bstar.capacity.run import (
    CapacityResult,
    PolicyResult,
    evaluate_replica,
    plan_capacity,
    replica_for,
    scale,
)

__all__ = [
    "POLICIES",
    "CapacityResult",
    "DemandCurve",
    "PolicyResult",
    "Schedule",
    "Settings",
    "diurnal",
    "evaluate_replica",
    "from_trace",
    "parse_rate_csv",
    "plan_capacity",
    "replica_for",
    "required",
    "scale",
    "schedule",
]
