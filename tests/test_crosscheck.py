"""Fast paths held equal to their references over deployments drawn at random (issue 41):

- the simulator's float step pricer (`sim.steptime`) and `step.price`;
- the plan's speculative step (`specdec.spec_step_s`) and the simulator's
  (`sim.speculative.SpecStep.step_s`, over `specdec.scheduled_step_s`);
- the pool in the plan (`roofline.b_mem`, `specdec.b_mem` with a drafter) and in the
  simulator (`sim.feasible.check_feasible` on `sim_pool`): one sequence of a context fits in
  one exactly when it fits in the other;
- `b_star_read` and the amortized floor against the curve they summarize (`decode_step`'s
  KV and weight bytes: its slope per sequence, and where the two cross).

Deployments: TP 1-16, dense, MoE, MLA, DSA, windowed, chunked and hybrid (state) presets,
KV dtypes, engine profiles, speculation on and off. Hypothesis draws them derandomized (the
same cases every run, in the fast loop and in CI). A case that ever failed is kept in
tests/fuzz-corpus/crosscheck/ (one JSON file each: the drawn arguments) and replayed first;
a new failure is written to tests/fuzz-corpus/new/crosscheck-*.json (commit it there, moved
up into crosscheck/, with the fix), as tests/fuzz_corpus.py does for the CLI fuzz."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bstar import roofline as rl
from bstar import specdec as sd
from bstar import step
from bstar.errors import BstarError
from bstar.kv_pool import default_max_num_batched_tokens
from bstar.options import DeploymentOptions
from bstar.sim import SchedulerConfig, SimConfig, Workload, check_feasible
from bstar.sim.speculative import SpecSim, SpecStep
from bstar.sim.steptime import coefficients

CORPUS = Path(__file__).resolve().parent / "fuzz-corpus"
CASES = CORPUS / "crosscheck"
NEW = CORPUS / "new"

# One of each kind bstar models: dense GQA, MoE, MLA + MoE, DSA, sliding windows (+MoE),
# chunked local attention, a hybrid with fixed states, MHA.
MODELS = ("llama-3-8b", "llama-3-70b", "qwen3-32b", "mixtral-8x7b", "qwen3-30b-a3b",
          "deepseek-v3", "deepseek-v3.2", "gemma-3-27b", "gpt-oss-20b", "llama-4-scout",
          "qwen3-next-80b-a3b", "nemotron-h-8b", "opt-6.7b")
GPUS = ("h100-sxm", "h200", "a100-80gb-sxm", "b200", "mi300x")
ENGINES = ("vllm", "sglang", "trt-llm", "vllm-v0")
KV_DTYPES = ("bf16", "fp8")
TPS = (1, 2, 4, 8, 16)
DRAFTERS = (None, "eagle", "ngram", "auto")

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, database=None)

deployments = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS), "gpu": st.sampled_from(GPUS),
    "num_gpus": st.sampled_from(TPS), "kv_dtype": st.sampled_from(KV_DTYPES),
    "engine": st.sampled_from(ENGINES)})


def _corpus(test: str) -> list[dict[str, Any]]:
    """The stored cases of `test` (tests/fuzz-corpus/crosscheck/*.json whose "test" is it)."""
    if not CASES.is_dir():
        return []
    out = []
    for p in sorted(CASES.glob("*.json")):
        case = json.loads(p.read_text(encoding="utf-8"))
        if case.get("test") == test:
            out.append(case["args"])
    return out


def replayed(test: str) -> Callable[[Any], Any]:
    """Replay every stored case of `test` first (hypothesis @example)."""
    def wrap(fn: Any) -> Any:
        for args in _corpus(test):
            fn = example(**args)(fn)
        return fn
    return wrap


def kept(test: str, args: dict[str, Any], check: Callable[[], None]) -> None:
    """Run `check`; on a failure store the drawn `args` under tests/fuzz-corpus/new/."""
    try:
        check()
    except AssertionError:
        # One file per test, overwritten: hypothesis replays its shrunk (smallest) failing
        # case last, so that is the one left.
        text = json.dumps({"test": test, "args": args}, sort_keys=True)
        NEW.mkdir(parents=True, exist_ok=True)
        (NEW / f"crosscheck-{test}.json").write_text(text + "\n", encoding="utf-8")
        raise


def build(dep: dict[str, Any]) -> Any:
    """The drawn deployment through the one builder; None when the model cannot shard to
    that TP (a drawn combination, not a defect)."""
    try:
        return DeploymentOptions(**dep).build()
    except BstarError:
        return None


def drafter(d: Any, kind: str | None) -> Any:
    if kind is None:
        return None
    try:
        return sd.make_drafter(d, kind)
    except BstarError:  # e.g. auto on a model whose MTP layer bstar cannot form
        return None


@SETTINGS
@given(dep=deployments, seed=st.integers(0, 2**32 - 1))
@replayed("one_step")
def test_float_step_pricer_is_step_price(dep: dict[str, Any], seed: int) -> None:
    d = build(dep)
    if d is None:
        return
    rng = np.random.default_rng(seed)
    num_dec = int(rng.integers(0, 200))
    num_chunks = int(rng.integers(0 if num_dec else 1, 4))
    start = np.concatenate([rng.integers(1, 40_000, num_dec),
                            rng.integers(0, 20_000, num_chunks)])
    new = np.concatenate([np.ones(num_dec, dtype=np.int64),
                          rng.integers(2, 9_000, num_chunks)])

    def check() -> None:
        want = float(step.price(step.shape(d).scheduled(start, new), d.eff)[0])
        assert coefficients(d).batch_step_s(start, new) == pytest.approx(want, rel=1e-9)

    kept("one_step", {"dep": dep, "seed": seed}, check)


@SETTINGS
@given(dep=deployments, kind=st.sampled_from(DRAFTERS[1:]), k=st.integers(1, 6),
       batch=st.integers(1, 512), ctx=st.integers(2, 32_768))
@replayed("spec_step")
def test_plan_and_simulator_price_the_same_speculative_step(
        dep: dict[str, Any], kind: str, k: int, batch: int, ctx: int) -> None:
    d = build(dep)
    dr = None if d is None else drafter(d, kind)
    if dr is None:
        return
    # The plan's sequences hold ctx tokens once the step's token is in; the simulator's
    # start from ctx - 1 and compute one (tests/test_specdec.py).
    plan = SimpleNamespace(start=np.full(batch, ctx - 1), new=np.ones(batch, dtype=np.int64))
    spec = SpecSim(sd.SpecConfig(k, 0.7, kind), dr)

    def check() -> None:
        want = float(sd.spec_step_s(d, dr, [batch], ctx, k)[0])
        assert SpecStep(d, spec).step_s(plan) == pytest.approx(want, rel=1e-9)

    kept("spec_step", {"dep": dep, "kind": kind, "k": k, "batch": batch, "ctx": ctx}, check)


def _fits_sim(d: Any, dr: Any, kind: str | None, k: int, tokens: int) -> bool:
    """Whether the simulator runs a request that holds `tokens` (prompt `tokens`, one output
    token, which is never fed back)."""
    spec = None if dr is None else SpecSim(sd.SpecConfig(k, 0.7, kind or "eagle"), dr)
    cfg = SimConfig(SchedulerConfig(1, default_max_num_batched_tokens(d)),
                    prefix_caching=False, speculative=spec)
    try:
        check_feasible(d, cfg, Workload(np.array([tokens]), np.array([1]), np.zeros(1)))
    except BstarError:
        return False
    return True


def _fits_plan(d: Any, dr: Any, k: int, tokens: int) -> bool:
    return sd.b_mem(d, dr, tokens, k) >= 1


@SETTINGS
@given(dep=deployments, kind=st.sampled_from(DRAFTERS), k=st.integers(1, 6),
       frac=st.floats(0.0, 1.0))
@replayed("pool")
def test_one_pool_in_the_plan_and_the_simulator(dep: dict[str, Any], kind: str | None,
                                                k: int, frac: float) -> None:
    d = build(dep)
    if d is None:
        return
    dr = drafter(d, kind)
    if kind is not None and dr is None:
        return
    kinds = {g.kind for g in d.model.layer_groups()}
    # Where the simulator counts whole-model blocks (every token of every layer) and the
    # plan vLLM V1's pool of KV cache groups, the simulator holds no more than the plan
    # says, never more (sim/block_manager.py's docstring): a model with fixed states, and
    # a windowed model with a drafter (sim/feasible.sim_pool). Elsewhere the two agree to
    # the token.
    exact = "state" not in kinds and not (dr is not None and kinds & {"sliding", "chunked"})
    # The longest request the plan says fits (bisection on its B_mem >= 1), and one token
    # more.
    lo, hi = 0, 1 << 30
    if _fits_plan(d, dr, k, hi):
        return  # a pool past a billion tokens: nothing to bisect
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _fits_plan(d, dr, k, mid):
            lo = mid
        else:
            hi = mid
    probe = max(1, int(frac * lo)) if lo else 1

    def check() -> None:
        if not exact:
            for tokens in (probe, lo + 1):
                assert not _fits_sim(d, dr, kind, k, tokens) or _fits_plan(d, dr, k, tokens)
            return
        if lo:
            assert _fits_sim(d, dr, kind, k, lo)
            assert _fits_sim(d, dr, kind, k, probe)
        assert not _fits_sim(d, dr, kind, k, lo + 1)

    kept("pool", {"dep": dep, "kind": kind, "k": k, "frac": frac}, check)


@SETTINGS
@given(dep=deployments, ctx=st.integers(1, 131_072))
@replayed("b_star")
def test_b_star_read_and_the_floor_are_the_curves(dep: dict[str, Any], ctx: int) -> None:
    d = build(dep)
    if d is None:
        return
    bw = d.gpu.hbm_bandwidth_bytes_s
    kv = rl.kv_bytes_read_per_seq_per_gpu(d, ctx)

    def check() -> None:
        c = rl.decode_step(d, np.array([3.0, 11.0]), ctx)
        slope = float(c.kv_bytes_read[1] - c.kv_bytes_read[0]) / 8.0
        assert slope == pytest.approx(kv, rel=1e-9)  # the curve's KV per added sequence
        assert rl.amortized_floor_s(d, ctx) * bw * d.eff.kv_stream() == pytest.approx(kv)
        b = rl.b_star_read(d, ctx)
        if b is not None and 1e-3 < b < 1e7:
            at = rl.decode_step(d, np.array([b]), ctx)
            # where the curve's KV bytes reach its weight bytes (root to 60 bisections)
            assert float(at.kv_bytes_read[0]) == pytest.approx(
                float(at.weight_bytes_read[0]), rel=1e-6)
        if not math.isfinite(kv) or kv <= 0:
            raise AssertionError(f"KV per sequence {kv}")

    kept("b_star", {"dep": dep, "ctx": ctx}, check)
