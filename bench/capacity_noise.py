"""What the size of a capacity probe does to the capacity `bstar simulate` prints for the
bundled Mooncake sample (one command: python bench/capacity_noise.py; issue 41, item 5).

`bstar.sim.capacity.capacity` runs every probe on `sample_size(max_num_seqs)` requests:
1,536 at vLLM's default cap of 256. On examples/traces/mooncake-sample.jsonl (300 requests
of ~14k prompt tokens; Llama-3-8B on an A100-80GB) the KV pool holds about 47 of them, so
`sample_size(47)` = 400 requests per probe would be about 4x cheaper. This prints, for
the default size and for the size of the batch its searches found held (their
`running_max`), the capacity found with the Poisson seed 0 to 3 (the arrivals of every
probe), its spread and the CPU seconds of each search: the answer with a smaller sample is
not shifted, it is noisier, and the spread is what decides whether the cheaper probe is
good enough. Pure CPU work (no files written); a few minutes.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

from bstar.deployment import Deployment
from bstar.engine_defaults import vllm_defaults
from bstar.sim import SchedulerConfig, SimConfig, make_workload
from bstar.sim.capacity import capacity, sample_size
from bstar.sim.study import StudyOptions
from bstar.sim.traffic import parse_lengths, read_trace_file
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

MOONCAKE = Path(__file__).resolve().parent.parent / "examples/traces/mooncake-sample.jsonl"
SEEDS = (0, 1, 2, 3)


def main() -> int:
    d = Deployment(model=get_model("llama-3-8b"), gpu=get_gpu("a100-80gb-sxm"))
    o = StudyOptions(trace=str(MOONCAKE))  # the study's default lengths and seed
    arrivals = read_trace_file(str(MOONCAKE))
    defaults = vllm_defaults(d.gpu)
    cfg = SimConfig(SchedulerConfig(defaults.max_num_seqs, defaults.max_num_batched_tokens))
    # The unit workload `bstar.sim.study.sustained` builds for the trace (the study's seed 0).
    unit = make_workload(arrivals, parse_lengths(o.input_len), parse_lengths(o.output_len),
                         len(arrivals.arrival_s), np.random.default_rng(o.seed))
    print(f"capacity of {MOONCAKE.name} ({unit.num_requests} requests), llama-3-8b on "
          f"a100-80gb-sxm, max_num_seqs {defaults.max_num_seqs}, by probe size and Poisson "
          "seed")
    n = sample_size(defaults.max_num_seqs)
    held = 0
    for _ in range(2):  # the default size, then the batch the KV pool held
        caps, cpus = [], []
        for seed in SEEDS:
            c0 = time.process_time()
            cap, _ = capacity(d, cfg, unit, seed=seed, num_requests=n)
            cpus.append(time.process_time() - c0)
            caps.append(cap.capacity_req_s)
            held = max(held, cap.running_max)
            print(f"  {n:5d} requests per probe, seed {seed}: {cap.capacity_req_s:.4f} req/s "
                  f"({cpus[-1]:.2f} s CPU)", flush=True)
        mean = statistics.fmean(caps)
        print(f"  {n:5d}: mean {mean:.4f} req/s, min {min(caps):.4f}, max {max(caps):.4f} "
              f"(spread {(max(caps) - min(caps)) / mean:.1%} of the mean; batch held "
              f"{held}); median CPU {statistics.median(cpus):.2f} s")
        n = sample_size(held)
    return 0


if __name__ == "__main__":
    sys.exit(main())
