"""`bstar validate STAGES.csv`: the simulator against measured load stages.

The table (`bstar.stages_table`: its columns, `Stage`, `stages_from_csv`, `load_stages`) has
one row per load stage of a real server: a load generator sent requests at a rate (or with a
concurrency) for a duration, and measured each request's TTFT and E2E.

Each stage is simulated like for like (`simulate_stage`): the stage's deployment
(`stage_deployment`, through `bstar.options.DeploymentOptions`), its scheduler
(max_num_seqs, max_num_batched_tokens), its arrival process at its rate (constant: fixed
gaps of 1/rate, as inference-perf's constant load sends; poisson: exponential gaps), its
prompt lengths drawn from the table's percentiles (`draw_prompt_lengths`: the
piecewise-linear inverse CDF through min, p10, p25, p50, p75, p90, p99 and max) and its
fixed output length (`ignore_eos`), and its prompts' identity: the shared system prompt
(`shared_prefix_len`) and the `distinct_prompts` sent in turn, whose hits the simulator's
prefix cache finds (`bstar.sim.prefix_cache`; vLLM V1 caches prefixes by default). Every
step is priced by `bstar.step.price` through the simulator. To stay fast, a stage is
simulated for at most MAX_WINDOW_S seconds of arrivals (and MAX_REQUESTS requests); the
first WARMUP_FRACTION of the requests (an empty server's warm-up) are left out of the
figures.

Scored per stage: the means of E2E, TTFT and the time per output token (E2E - TTFT) /
(output_len - 1), |predicted / measured - 1|, and the saturation state (`saturation_state`):

- TTFT growth g = (TTFT p90 - TTFT p50) / (0.4 x window): under a queue that grows through
  the stage, a request arriving at time t waits about g x t with g = rate / capacity - 1, so
  TTFT is uniform over the window and its p90 and p50 lie 0.4 x g x window apart. A steady
  server's TTFT does not grow: g is ~0 (1e-5 on the shared stages).
- "queue growing" when g > GROWTH_LIMIT (the server serves under ~98% of what is offered) or
  more than FAILED_LIMIT of the requests failed (timed out: the client gave up on a queue);
  else "steady": what the measured row shows (`measured_state`, from its TTFT p50, p90,
  duration and failures). The simulation has every request's wait, so its state
  (`predicted_state`) is `bstar.sim.capacity.queue_grows`, the one definition `bstar
  simulate` and `bstar search` use: the slope of the wait against arrival time over the
  second half of the arrivals, above the same GROWTH_LIMIT (or a run cut off at its time
  limit). Its g from the percentiles is reported beside it.

The latency errors are aggregated over the stages the data measure as steady: an overloaded
stage's TTFT and E2E are set by how long it ran and by the client's timeout, not by the
server's speed. Overloaded stages are scored on their state (and show their growth).

Per GPU x engine (`score_stages`), three ways: generic (the default efficiencies), profile
(the engine's bundled profile, or `engine=`), and leave one model out (`fit_stages`: the
parameters in `fit` fitted by `bstar.calibrate.fit_efficiency` to the OTHER models' steady
stages, from the generic defaults, in log space over their E2E, TTFT and per-token means,
each simulated for at most FIT_WINDOW_S; then predicting the stages of the model left out).

For a loop over candidate efficiencies (a profile fit): `load_stages(path)` once, then
`evaluate(stages, eff)` -> (per-stage `StageScore`s, `Summary`).

The package: `bstar.stages_table` reads the table, `simulate` simulates a stage and decides
its saturation state, `fitting` fits engine terms to stages through the simulator (one set
for all, `fit_stages`, or with each kernel path's own kernel terms, `fit_stages_by_path`,
which the leave-one-GPU-out way uses), `score` scores the predictions (generic, profile,
leave one model out, leave one GPU out); every name below is importable from
`bstar.validate_stages`.
"""

from bstar.stages_table import (
    ARRIVALS,
    COLUMNS,
    PROMPT_QUANTILES,
    REQUIRED,
    Stage,
    is_stages_table,
    load_stages,
    stages_from_csv,
)
from bstar.validate_stages.fitting import (
    PathFit,
    fit_stages,
    fit_stages_by_path,
    priced_by_path,
)
from bstar.validate_stages.score import (
    DEFAULT_FIT,
    FIT_ITERATIONS,
    FIT_WINDOW_S,
    METRICS,
    StageScore,
    StagesGroup,
    StagesValidation,
    Summary,
    evaluate,
    score_stage,
    score_stages,
    summarize_scores,
)
from bstar.validate_stages.simulate import (
    FAILED_LIMIT,
    GROWING,
    GROWTH_LIMIT,
    MAX_REQUESTS,
    MAX_WINDOW_S,
    STEADY,
    WARMUP_FRACTION,
    StagePrediction,
    draw_prompt_lengths,
    growing_stage_capacity_req_s,
    measured_growth,
    measured_state,
    predicted_state,
    saturation_state,
    simulate_stage,
    stage_deployment,
    stage_requests,
    stage_workload,
    ttft_growth,
)

__all__ = [
    "ARRIVALS", "COLUMNS", "DEFAULT_FIT", "FAILED_LIMIT", "FIT_ITERATIONS", "FIT_WINDOW_S",
    "GROWING", "GROWTH_LIMIT", "MAX_REQUESTS", "MAX_WINDOW_S", "METRICS", "PROMPT_QUANTILES",
    "REQUIRED", "STEADY", "WARMUP_FRACTION", "PathFit", "Stage", "StagePrediction",
    "StageScore", "StagesGroup", "StagesValidation", "Summary", "draw_prompt_lengths",
    "evaluate", "fit_stages", "fit_stages_by_path", "growing_stage_capacity_req_s",
    "is_stages_table", "load_stages", "measured_growth", "measured_state", "predicted_state",
    "priced_by_path", "saturation_state", "score_stage", "score_stages", "simulate_stage",
    "stage_deployment", "stage_requests", "stage_workload", "stages_from_csv",
    "summarize_scores", "ttft_growth",
]
