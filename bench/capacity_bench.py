"""Benchmark of `bstar capacity` (one command: python bench/capacity_bench.py).

A generated day (one-minute intervals, 1,440 of them: a cosine from 40 to 160 req/s with
its peak at 14:00 and three seeded bursts of x1.5 for 5 minutes), the request mix of the
bundled Azure conversation sample (examples/traces/azure-conv-2023-sample.csv: its 300
requests' lengths), the SLO TTFT p99 <= 1 s and TPOT p99 <= 50 ms, and three deployments:
Llama-3.1-8B on one H100 SXM, on one H200 and on one A100-80GB SXM (vllm serve's default
limits on each). All three policies, the provisioning delay 300 s, the cool-down 600 s;
once with every ramp replayed (`--replay all`, the default) and once with only the ramps
past a replica's capacity (`--replay overloaded`).

It prints the wall time of the capacity run, then of one `bstar search` at the day's peak
over the same three replicas (in this process, an empty store), and their ratio; the goal
is under 30 s for the capacity run. The machine's load average is printed before and after:
on a shared machine other processes take CPU from this one.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bstar.capacity import Settings, diurnal, plan_capacity, replica_for
from bstar.engine_defaults import vllm_defaults
from bstar.options import DeploymentOptions
from bstar.search import InProcess, SearchSpec, SearchStore, Traffic, make_backend, run_search
from bstar.sim import parse_slo, parse_trace

ROOT = Path(__file__).resolve().parent.parent
AZURE = ROOT / "examples" / "traces" / "azure-conv-2023-sample.csv"
MODEL = "llama-3.1-8b"
GPUS = ("h100-sxm", "h200", "a100-80gb-sxm")
SLO = "ttft:1000,tpot:50"
GOAL_S = 30.0
# (replay, worker processes): in this process, then on this machine's cores.
RUNS = (("all", 1), ("all", os.cpu_count() or 1), ("overloaded", 1))


def main() -> None:
    print(f"load average before: {os.getloadavg()}")
    trace = parse_trace(AZURE.read_bytes())
    curve = diurnal(160.0, 40.0, interval_s=60.0, bursts=3, burst_factor=1.5, burst_s=300,
                    seed=0)
    slo = parse_slo(SLO)
    traffic = Traffic(curve.peak_req_s, trace=trace, num_requests=len(trace.arrival_s))
    replicas = []
    for g in GPUS:
        d = DeploymentOptions(model=MODEL, gpu=g).build()
        lim = vllm_defaults(d.gpu)
        replicas.append(replica_for(d, MODEL, lim.max_num_seqs, lim.max_num_batched_tokens))
    times = {}
    results = {}
    for mode, jobs in RUNS:
        t0 = time.perf_counter()
        c0 = time.process_time()
        with make_backend(jobs) as backend:
            res = plan_capacity(replicas, curve, traffic, slo,
                                Settings(delay_s=300, cooldown_s=600, replay=mode),
                                backend=backend)
        cap_s = time.perf_counter() - t0
        cpu_s = time.process_time() - c0
        label = f"--replay {mode} --jobs {jobs}"
        times[label] = cap_s
        results[(mode, jobs)] = res.to_dict()
        sims = 0
        for d in res.deployments:
            for p in d.policies:
                sims += p.simulations
                if jobs > 1:
                    continue
                print(f"{d.replica.gpu:>14} {p.policy:>9}: {p.gpu_hours:7.1f} GPU-h, max "
                      f"{p.replicas_max:3d} replicas, idle {p.idle_fraction:.0%}, SLO "
                      f"attainment {p.slo_attainment:.2%}, {p.ramp['intervals']} ramp "
                      f"intervals ({p.ramp['attainment_lost']:.2%} of requests lost there), "
                      f"{p.simulations} replay simulations")
        same = ""
        if (mode, 1) in results and jobs > 1:
            a, b = results[(mode, 1)], results[(mode, jobs)]
            a.pop("timing", None)
            b.pop("timing", None)
            same = "; the answer equals --jobs 1's" if a == b else "; ANSWER DIFFERS FROM --jobs 1"
        print(f"capacity {label}: {len(curve.rates_req_s)} intervals x "
              f"{len(replicas)} deployments x 3 policies in {cap_s:.1f} s wall, {cpu_s:.1f} s "
              f"CPU in this process ({sims} replay simulations); goal < {GOAL_S:g} s: "
              f"{'met' if cap_s < GOAL_S else 'NOT met'}{same}")
    spec = SearchSpec((MODEL,), GPUS, traffic, slo, num_gpus=(1,),
                      max_num_seqs=tuple(sorted({r.max_num_seqs for r in replicas})))
    with tempfile.TemporaryDirectory() as tmp, InProcess() as backend:
        store = SearchStore(Path(tmp) / "search.db")
        t0 = time.perf_counter()
        out = run_search(spec, backend, store)
        search_s = time.perf_counter() - t0
        store.close()
    print(f"search at the peak ({curve.peak_req_s:.1f} req/s, {len(out.rows)} candidates): "
          f"{search_s:.1f} s; capacity / search = "
          + ", ".join(f"{t / search_s:.1f} ({m})" for m, t in times.items()))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
