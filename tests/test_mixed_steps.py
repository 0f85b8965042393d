"""Mixed prefill + decode steps: the black-box measurement (bstar.loadgen.mixed), its points
file, and `bstar calibrate` reading it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bstar import calibrate as cal
from bstar.cli import main
from bstar.deployment import Deployment, Efficiency
from bstar.fit.points import load_steps
from bstar.loadgen.mixed import (
    MixedConfig,
    StepSample,
    gap_at,
    measure_steps,
    mixed_gap,
    to_csv,
    window_means,
)
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model


def test_gap_at_picks_the_token_nearest_the_first_token() -> None:
    times = [0.0, 0.02, 0.04, 0.30, 0.32]  # the step ending at 0.30 ran the chunk
    assert gap_at(times, 0.301) == (3, pytest.approx(0.26))
    assert gap_at(times, 0.299) == (3, pytest.approx(0.26))
    assert gap_at(times, -1.0) is None  # nearest is the first token: no gap
    assert gap_at([0.5], 0.5) is None


def test_mixed_gap_is_the_median_over_streams_with_exact_context() -> None:
    # Two streams (prompts 16 and 20 tokens); client jitter moves each token by < 1 ms.
    a = [0.0, 0.02, 0.04, 0.30, 0.32]
    b = [0.001, 0.021, 0.041, 0.2995, 0.3205]
    gap, ctx = mixed_gap([a, b], 0.3002, [16, 20])  # type: ignore[misc]
    assert gap == pytest.approx(np.median([0.26, 0.2585]))
    # The 4th token (index 3) came out of the mixed step: KV = prompt + 4 - 1.
    assert ctx == round((16 + 3 + 20 + 3) / 2)
    assert mixed_gap([a, [0.0]], 0.3, [16, 16]) is None


def test_window_means() -> None:
    # A token read 30 ms late (index 3) lengthens its gap and shortens the next: the window
    # mean is the step. Two streams in lockstep; prompts of 10 tokens.
    a = [0.0, 0.1, 0.2, 0.33, 0.4, 0.5, 0.6, 0.7, 0.8]
    b = [0.0, 0.1, 0.2, 0.30, 0.4, 0.5, 0.6, 0.7, 0.8]
    means, ctx = window_means([a, b], 1, 8, 4, [10, 10])
    assert means == pytest.approx([0.1, 0.1])
    assert ctx == round(sum(10 + i for i in range(1, 9)) / 8)


def test_config_checks_the_schedule_fits_the_output_cap() -> None:
    from bstar.errors import BstarError

    with pytest.raises(BstarError, match="too short"):
        MixedConfig(max_tokens=50)
    with pytest.raises(BstarError, match="at least 2"):
        MixedConfig(chunk_tokens=(1,))


def _synthetic(d: Deployment) -> list[StepSample]:
    """Steps priced by the cost model at `d`'s own efficiencies, as the measurement writes them."""
    shapes = [("decode", b, 64, 0) for b in (1, 2, 4, 8)]
    shapes += [("mixed", b, 70, n) for b in (1, 4, 8) for n in (32, 128, 240)]
    shapes += [("prefill", 0, n, n) for n in (32, 128, 240)]
    pts = [cal.Point(b, c, 1.0, k, n, 0) for k, b, c, n in shapes]
    pred = cal.predict_step_s(d, pts)
    return [StepSample(k, b, c, n, 0, float(t), (float(t), float(t) * 1.01))
            for (k, b, c, n), t in zip(shapes, pred, strict=True)]


def test_points_csv_round_trip(tmp_path: Path) -> None:
    d = Deployment(get_model("llama-3-8b"), get_gpu("a100-80gb-sxm"))
    samples = _synthetic(d)
    path = tmp_path / "points.csv"
    path.write_text("# a comment line\n" + to_csv(samples))
    pts, warnings = load_steps(path, None)
    assert warnings == []
    assert [(p.batch, p.context_tokens, p.chunk_tokens) for p in pts] == \
        [(s.batch, s.context_tokens, s.chunk_tokens) for s in samples]
    assert [p.step_s for p in pts] == pytest.approx([s.step_s for s in samples], rel=1e-5)
    assert sum(p.mixed for p in pts) == 12


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_calibrate_cli_fits_mixed_points(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Points made by the model at known parameters: `bstar calibrate POINTS` reads the chunk
    columns, fits the chunk terms by default, and gets the mixed steps back."""
    truth = Efficiency(bandwidth=0.6, compute=0.5, overhead_s=2e-3,
                          overhead_per_seq_s=20e-6, attention_compute=0.3,
                          chunk_layer_s=40e-6)
    d = Deployment(get_model("llama-3-8b"), get_gpu("a100-80gb-sxm"), eff=truth)
    path = tmp_path / "points.csv"
    path.write_text(to_csv(_synthetic(d)))
    rc = main(["calibrate", str(path), "--model", "llama-3-8b", "--gpu", "a100-80gb-sxm",
               "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out)
    assert res["params"]["attention_compute"]["status"] != "fixed"
    assert res["params"]["chunk_layer_s"]["status"] != "fixed"
    mixed = [p for p in res["points"] if p["chunk_tokens"]]
    assert len(mixed) == 12
    assert max(abs(p["rel_error"]) for p in mixed) < 0.01
    # The table shows the chunk column.
    rc = main(["calibrate", str(path), "--model", "llama-3-8b", "--gpu", "a100-80gb-sxm"])
    assert rc == 0
    assert "chunk" in capsys.readouterr().out


@pytest.mark.slow  # starts the token server
def test_measure_steps_against_the_token_server(token_server: Any) -> None:
    """The plumbing, live: a fixed-rate server (no real steps) gives decode gaps of its
    interval and one sample per (batch, chunk) and per prefill length."""
    srv = token_server(interval_ms=10)
    cfg = MixedConfig(batches=(2,), chunk_tokens=(8, 24), repeats=2, decode_steps=6,
                      warm_steps=2, settle_steps=1, max_tokens=200)
    samples = measure_steps(srv.url, "tiny", cfg)
    kinds = [(s.kind, s.batch, s.chunk_tokens > 0) for s in samples]
    assert kinds == [("decode", 2, False), ("mixed", 2, True), ("mixed", 2, True),
                     ("prefill", 0, True), ("prefill", 0, True)]
    dec = samples[0]
    # The server sends one token per 10 ms at the fastest: a busy machine only stretches
    # the gaps, so only the floor is asserted.
    assert dec.step_s >= 0.010 * 0.9
    assert all(len(s.samples_s) == 2 for s in samples[1:])
    assert all(s.step_s > 0 for s in samples if s.kind != "prefill")


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_mixed_step_costs_more_than_decode(vllm_python: str, tiny_model: Any,
                                                tmp_path: Path) -> None:
    """vLLM-on-CPU, live (about 2 minutes): a 256-token prompt injected into 2 decoding
    streams makes their gap longer than a decode step (its GEMMs run 258 rows instead of 2:
    ~48 GFLOP of fp32 on two cores, many times a decode step's work; the factor itself
    depends on what else the cores run, so only the order is asserted), and a lone
    256-token prefill costs more than a decode step too."""
    from bstar.servers import vllm_cpu_server

    python = vllm_python
    cfg = MixedConfig(batches=(2,), chunk_tokens=(256,), repeats=3, decode_steps=12,
                      max_tokens=400)
    with vllm_cpu_server(python, tiny_model.hf_dir, max_num_seqs=4, max_model_len=1024,
                         log_path=tmp_path / "vllm.log") as srv:
        samples = measure_steps(srv.url, "tiny", cfg)
    by = {s.kind: s for s in samples}
    assert set(by) == {"decode", "mixed", "prefill"}
    assert by["mixed"].chunk_tokens == 256 and by["prefill"].chunk_tokens == 256
    assert by["mixed"].step_s > by["decode"].step_s, samples
    assert by["prefill"].step_s > by["decode"].step_s, samples


# ---- the recorded vLLM-on-CPU steps (data/cpu/, bench/vllm_cpu_mixed.sh) -------------------
CPU_DATA = Path(__file__).resolve().parents[1] / "data" / "cpu"


def cpu_deployment(tag: str) -> Deployment:
    """The tiny model as vLLM-on-CPU ran it: fp32 weights and KV cache, on the CPU probed at
    the start of run `tag` (data/cpu/probe-TAG.toml)."""
    from bstar.specs.gpu import load_gpu_file
    from bstar.specs.model import from_hf_config

    cfg = json.loads((CPU_DATA / "tiny-config.json").read_text())
    return Deployment(from_hf_config(cfg, name="tiny"),
                         load_gpu_file(CPU_DATA / f"probe-{tag}.toml"),
                         weight_dtype="fp32", kv_dtype="fp32")


def repeat_noise(path: Path) -> list[float]:
    """Per chunked point of a points file: half the repeats' range over their median."""
    import csv

    rows = csv.DictReader(ln for ln in path.read_text().splitlines() if not ln.startswith("#"))
    return [(float(r["max_ms"]) - float(r["min_ms"])) / (2 * float(r["median_ms"]))
            for r in rows if int(r["chunk_tokens"])]


@pytest.mark.parametrize("path", sorted(CPU_DATA.glob("vllm-mixed-*.csv")),
                         ids=lambda p: p.name)
def test_recorded_cpu_mixed_steps(path: Path) -> None:
    """The fitted model predicts the measured mixed steps within the measurement's own
    noise: the joint fit's median |error| on the mixed points is at most the median
    half-range of their repeats; and fitting the mixed points does better on them than a
    decode-only calibration."""
    from bstar.loadgen.mixed import decode_vs_joint

    tag = path.stem.removeprefix("vllm-mixed-")
    e = decode_vs_joint(cpu_deployment(tag), load_steps(path, None)[0])
    tolerance = float(np.median(repeat_noise(path)))
    assert len(e.points) >= 6
    assert e.joint_median <= tolerance, (e.joint_median, tolerance)
    assert e.joint_median < e.decode_only_median, (e.joint_median, e.decode_only_median)
