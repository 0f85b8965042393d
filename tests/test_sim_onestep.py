"""The simulator's one-step price in Python floats (`sim.steptime.OneStep`) is `step.price`:
equal (rel 1e-12) to `price(shape.scheduled(start, new), params)` over random steps, several
kinds of model and tensor parallel, with every field of Efficiency drawn at random. The
fields are read from `dataclasses.fields`, not listed here, so a term added to `step.price`
(a new field, or a new StepWork quantity) that `OneStep` does not price fails this test."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import numpy as np
import pytest

from bstar import step as st
from bstar.deployment import Deployment, Efficiency
from bstar.sim.steptime import coefficients
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

# dense, MoE, MLA (+MoE), DSA, sliding windows, chunked local attention, fixed states; TP > 1;
# quantized weights (the 16-bit part streams at its own rate).
CASES = [("llama-3-8b", 1, ""), ("llama-3-70b", 4, ""), ("mixtral-8x7b", 2, ""),
         ("deepseek-v3", 8, "fp8"), ("deepseek-v3.2", 8, ""), ("gemma-3-27b", 1, ""),
         ("gpt-oss-20b", 1, ""), ("llama-4-scout", 4, ""), ("qwen3-next-80b-a3b", 2, ""),
         ("qwen3-8b", 1, "int4"), ("opt-1.3b", 1, "")]


def random_params(rng: np.random.Generator) -> dict[str, Any]:
    """Every Efficiency field at a random value: a bool either way; a number its default
    times 0.25-1.5, or, when its default is 0 (a term that is off), log-uniform: over
    1e-7-1e-3 s for a time (a name ending in _s), else over 0.1-1e4 (so both sides of a
    threshold such as graph_max_tokens are met)."""
    out: dict[str, Any] = {}
    for f in fields(Efficiency):
        default = f.default
        if isinstance(default, bool):
            out[f.name] = bool(rng.integers(2))
        elif default == 0:
            lo, hi = (-7, -3) if f.name.endswith("_s") else (-1, 4)
            out[f.name] = float(10 ** rng.uniform(lo, hi))
        else:
            out[f.name] = float(default) * float(rng.uniform(0.25, 1.5))
    if rng.random() < 0.2:  # the hard max of cost model 1
        out["roof_sharpness"] = math.inf
    else:
        out["roof_sharpness"] = max(1.0, out["roof_sharpness"])
    return out


def random_step(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A scheduled set: decodes on contexts up to 40k tokens, and 0-3 prompt chunks; half
    of the sets small (a few decodes, short chunks), where fixed terms and floors decide."""
    small = rng.random() < 0.5
    num_dec = int(rng.integers(0, 8 if small else 300))
    num_chunks = int(rng.integers(0 if num_dec else 1, 4))
    start = np.concatenate([rng.integers(1, 40_000, num_dec),
                            rng.integers(0, 20_000, num_chunks)])
    new = np.concatenate([np.ones(num_dec, dtype=np.int64),
                          rng.integers(2, 64 if small else 9_000, num_chunks)])
    order = rng.permutation(start.size)
    return start[order], new[order]


@pytest.mark.parametrize("model,num_gpus,weight", CASES)
def test_one_step_equals_step_price(model: str, num_gpus: int, weight: str) -> None:
    d = Deployment(model=get_model(model), gpu=get_gpu("h100-sxm"), num_gpus=num_gpus,
                   weight_dtype=weight)
    shape = st.shape(d)
    rng = np.random.default_rng(hash((model, num_gpus)) % 2**32)
    for _ in range(12):
        params = random_params(rng)
        k = coefficients(d)
        k = type(k)(shape, params)
        for _ in range(15):
            start, new = random_step(rng)
            want = float(st.price(shape.scheduled(start, new), params)[0])
            got = k.batch_step_s(start, new)
            if math.isnan(want):  # a negative term's power (see OneStep.roof): as numpy's
                assert math.isnan(got)
                continue
            assert want > 0
            assert got == pytest.approx(want, rel=1e-12, abs=0)


def test_default_efficiency_and_an_efficiency_object() -> None:
    """The simulator's own pricer (an Efficiency read once) agrees with price on it."""
    d = Deployment(model=get_model("mixtral-8x7b"), gpu=get_gpu("a100-80gb-sxm"), num_gpus=2)
    k = coefficients(d)
    rng = np.random.default_rng(7)
    for _ in range(50):
        start, new = random_step(rng)
        want = float(st.price(st.shape(d).scheduled(start, new), d.eff)[0])
        assert k.batch_step_s(start, new) == pytest.approx(want, rel=1e-12, abs=0)
    assert k.batch_step_s([], []) == 0.0


def test_a_missed_term_would_fail() -> None:
    """The draw reaches every field: changing any one of them moves some step's price (of
    an fp8 MoE on two GPUs or an int4 dense model), so leaving it out of OneStep would
    break the equality above."""
    shapes = [st.shape(Deployment(model=get_model(m), gpu=get_gpu("h100-sxm"), num_gpus=n,
                                  weight_dtype=w))
              for m, n, w in (("mixtral-8x7b", 2, "fp8"), ("qwen3-8b", 1, "int4"))]
    rng = np.random.default_rng(3)
    steps = [random_step(rng) for _ in range(30)]
    steps += [(np.full(b, 1000), np.ones(b, dtype=np.int64)) for b in range(1, 400, 7)]
    base = random_params(rng)
    # The soft roof of cost model 2, and an eager floor above some steps' kernels.
    base.update(roof_sharpness=2.0, grouped=True, graph_max_tokens=200.0, eager_layer_s=1e-2)

    def prices(p: dict[str, Any]) -> np.ndarray:
        return np.array([float(st.price(sh.scheduled(s, n), p)[0])
                         for sh in shapes for s, n in steps])

    ref = prices(base)
    for f in fields(Efficiency):
        moved = {**base, f.name: (not base[f.name]) if isinstance(base[f.name], bool)
                 else base[f.name] * 1.5}
        assert not np.allclose(prices(moved), ref, rtol=1e-9, atol=0), f.name


@pytest.mark.parametrize("model,num_gpus,weight", CASES)
def test_short_decode_runs_equal_step_price(model: str, num_gpus: int, weight: str) -> None:
    """A decode run priced step by step (runs up to SHORT_RUN_STEPS) is `price` of it."""
    d = Deployment(model=get_model(model), gpu=get_gpu("h100-sxm"), num_gpus=num_gpus,
                   weight_dtype=weight)
    shape = st.shape(d)
    rng = np.random.default_rng(hash((model, weight)) % 2**32)
    for _ in range(8):
        params = random_params(rng)
        k = type(coefficients(d))(shape, params)
        for num_steps in (1, 2, 5, 16, 17, 40):
            start = rng.integers(1, 40_000, int(rng.integers(1, 300)))
            want = st.price(shape.decode_run(start, num_steps), params)
            got = k.decode_run_step_s(start, num_steps)
            assert got.shape == want.shape
            ok = np.isnan(want)
            assert np.array_equal(np.isnan(got), ok)
            np.testing.assert_allclose(got[~ok], want[~ok], rtol=1e-12, atol=0)


@pytest.mark.parametrize("model,num_gpus,weight", CASES)
def test_linear_decode_runs_equal_the_array_path_exactly(model: str, num_gpus: int,
                                                         weight: str) -> None:
    """Issue 41: a short decode run of a model whose groups are all full layers or states
    is priced without building `decode_run`'s arrays; bit for bit what the arrays give."""
    d = Deployment(model=get_model(model), gpu=get_gpu("h100-sxm"), num_gpus=num_gpus,
                   weight_dtype=weight)
    shape = st.shape(d)
    linear = all(g.kind == "state" or (g.kind == "full" and not g.window_tokens)
                 for g in shape.groups)
    k0 = coefficients(d)
    assert (k0.linear is not None) == linear
    if model in ("llama-3-8b", "mixtral-8x7b"):
        assert linear  # the fast path is taken where the simulator spends its time
    if not linear:
        return
    rng = np.random.default_rng(hash((model, weight, 41)) % 2**32)
    for _ in range(6):
        params = random_params(rng)
        k = type(k0)(shape, params)
        for num_steps in (1, 2, 7, 16):
            start = rng.integers(1, 40_000, int(rng.integers(1, 300)))
            want = k.one.price_work(shape.decode_run(start, num_steps))
            assert k._linear_run(start, num_steps) == want


@pytest.mark.parametrize("model,num_gpus,weight", CASES)
def test_a_decode_run_priced_until_an_arrival_is_its_prefix(model: str, num_gpus: int,
                                                            weight: str) -> None:
    """`decode_run_until` (the simulator's decode run cut by an arrival): `_linear_run`'s
    times bit for bit, through the `extra`-th step from the first that ends at or past the
    stop (the cut the engine's searchsorted over all k_max steps gives), at most max_steps,
    None past UNTIL_STEPS or for a shape `_linear_run` does not take."""
    from bstar.sim.steptime import UNTIL_STEPS

    d = Deployment(model=get_model(model), gpu=get_gpu("h100-sxm"), num_gpus=num_gpus,
                   weight_dtype=weight)
    k0 = coefficients(d)
    start = np.random.default_rng(7).integers(1, 40_000, 50)
    if k0.linear is None:
        assert k0.decode_run_until(start, 10, 0.0, 0.0, 1) is None
        return
    now = 12.5
    full = k0._linear_run(start, UNTIL_STEPS)
    ends = now + np.cumsum(full)
    for stop_at in (0, 1, 5, 30):  # the stop lands inside step stop_at (0-based)
        stop_s = float(ends[stop_at]) - full[stop_at] / 2
        for extra in (1, 2):
            for max_steps in (3, 40, UNTIL_STEPS):
                got = k0.decode_run_until(start, max_steps, now, stop_s, extra)
                cut = min(max_steps, int(np.searchsorted(ends, stop_s)) + extra)
                assert got == full[:cut], (stop_at, extra, max_steps)
    # A stop exactly at a step's end: that step is the first "at or past" it.
    assert k0.decode_run_until(start, 40, now, float(ends[3]), 1) == full[:4]
    assert k0.decode_run_until(start, UNTIL_STEPS + 1, now, float(ends[-1]) + 1.0, 1) is None


@pytest.mark.parametrize("model,num_gpus,weight", CASES)
def test_full_layer_steps_equal_scheduled_sums_exactly(model: str, num_gpus: int,
                                                        weight: str) -> None:
    """Issue 41: a step of a model of full layers only is priced from two sums and its
    chunks' terms (kept per set of chunks) instead of `scheduled_sums` of the whole step;
    bit for bit the same price."""
    d = Deployment(model=get_model(model), gpu=get_gpu("h100-sxm"), num_gpus=num_gpus,
                   weight_dtype=weight)
    shape = st.shape(d)
    k0 = coefficients(d)
    assert k0.full_only == all(g.kind == "full" and not g.window_tokens
                               for g in shape.groups)
    if model == "llama-3-8b":
        assert k0.full_only
    rng = np.random.default_rng(hash((model, weight, 4141)) % 2**32)
    for _ in range(6):
        k = type(k0)(shape, random_params(rng))
        for _ in range(10):
            start, new = random_step(rng)
            if rng.random() < 0.4:
                new = np.ones_like(new)
            want = k.one.price(*shape.scheduled_sums(start, new))
            assert k.batch_step_s(start, new) == want
            assert k.batch_step_s(start, new) == want  # its chunk terms kept
            # The same chunks beside other decodes: the kept terms, the decodes' own sums.
            more = np.concatenate([start, rng.integers(1, 40_000, 5)])
            more_new = np.concatenate([new, np.ones(5, dtype=new.dtype)])
            assert k.batch_step_s(more, more_new) == k.one.price(
                *shape.scheduled_sums(more, more_new))
