"""`bstar search`: the cheapest deployment that meets an SLO.

For each candidate (model, GPU, GPUs per instance, tensor parallel size, engine limits) the
largest request rate one replica serves within the SLO is found by bisection with the
simulator; replicas for the demand and the cost per million output tokens follow. The
evaluations run in this process, in a local process pool or on Ray, give the same results on
each, and are stored as they finish so a search can resume.

    from bstar.search import SearchSpec, Traffic, InProcess, SearchStore, run_search
    from bstar.sim import parse_slo
    spec = SearchSpec(("llama-3-8b",), ("h100-sxm",), Traffic(20.0), parse_slo("ttft:1000"))
    with InProcess() as backend:
        result = run_search(spec, backend, SearchStore("search.db"))
"""

from __future__ import annotations

from bstar.search.backends import Backend, InProcess, ProcessPool, RayBackend, make_backend
from bstar.search.candidates import Candidate, Pruned, Replica, prune, tp_sizes, tp_split_error
from bstar.search.evaluate import Task, evaluate
from bstar.search.prices import Price, PriceTable, load_prices, parse_prices
from bstar.search.run import SearchResult, plan_candidates, run_search
from bstar.search.spec import Memory, SearchSpec, Traffic
from bstar.search.store import SearchStore, default_db_path

__all__ = [
    "Backend",
    "Candidate",
    "InProcess",
    "Memory",
    "Price",
    "PriceTable",
    "ProcessPool",
    "Pruned",
    "RayBackend",
    "Replica",
    "SearchResult",
    "SearchSpec",
    "SearchStore",
    "Task",
    "Traffic",
    "default_db_path",
    "evaluate",
    "load_prices",
    "make_backend",
    "parse_prices",
    "plan_candidates",
    "prune",
    "run_search",
    "tp_sizes",
    "tp_split_error",
]
