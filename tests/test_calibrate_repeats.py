"""`bstar calibrate` takes repeated measurements of the same batch: all are fitted, and the
spread of each repeated batch is reported (text and --json)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bstar import calibrate as cal
from bstar import roofline as rl
from bstar.cli import main
from bstar.deployment import Deployment, Efficiency
from bstar.errors import BstarError
from bstar.fit import load_points
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model
from ptyterm import run_in_pty

TRUE = Efficiency(bandwidth=0.55, compute=0.35, overhead_s=2e-3, overhead_per_seq_s=40e-6)
BATCHES = (1, 4, 16, 64, 256)
CONTEXT = 1024
NOISE = (0.97, 1.0, 1.04)  # three runs of the same sweep: -3%, 0, +4%


def points_csv(tmp_path: Path, context_column: bool) -> Path:
    d = Deployment(get_model("llama-3-8b"), get_gpu("a100-80gb-sxm")).with_eff(TRUE)
    head = "batch,context_tokens,tpot_ms" if context_column else "batch,tpot_ms"
    rows = [head]
    for k in NOISE:  # run after run, as repeats arrive
        for b in BATCHES:
            ms = float(rl.decode_step(d, [b], CONTEXT).step_s[0]) * 1e3 * k
            rows.append(f"{b},{CONTEXT},{ms!r}" if context_column else f"{b},{ms!r}")
    p = tmp_path / "repeats.csv"
    p.write_text("\n".join(rows) + "\n")
    return p


def args(p: Path, *extra: str) -> list[str]:
    return ["calibrate", str(p), "--model", "llama-3-8b", "--gpu", "a100-80gb-sxm",
            "--context", str(CONTEXT), *extra]


@pytest.mark.parametrize("context_column", [False, True])
def test_repeats_are_all_fitted_and_their_spread_reported(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], context_column: bool) -> None:
    assert main(args(points_csv(tmp_path, context_column), "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["points"]) == len(BATCHES) * len(NOISE)
    spread = out["repeat_spread"]
    assert [r["batch"] for r in spread] == list(BATCHES)
    for r in spread:
        assert r["n"] == 3 and r["context_tokens"] == CONTEXT
        assert r["max_ms"] / r["min_ms"] == pytest.approx(1.04 / 0.97)
        assert r["rel_spread"] == pytest.approx((1.04 - 0.97) * r["measured_ms"][1]
                                                / r["mean_ms"], rel=1e-9)
        assert r["std_ms"] == pytest.approx(float(np.std(r["measured_ms"], ddof=1)))
    # The fit runs through the repeats: each batch's prediction lies within its spread.
    for r in spread:
        pred = {p["predicted_ms"] for p in out["points"] if p["batch"] == r["batch"]}
        assert len(pred) == 1 and r["min_ms"] < pred.pop() < r["max_ms"]


@pytest.mark.slow  # calibrates on repeated runs
def test_repeats_in_the_terminal(tmp_path: Path) -> None:
    rc, out = run_in_pty(args(points_csv(tmp_path, False)), columns=80)
    assert rc == 0, out
    lines = [ln for ln in out.splitlines() if " repeats, " in ln]
    assert len(lines) == len(BATCHES)
    assert "batch 16 context 1024: 3 repeats" in out and "spread 7.0%" in out
    assert all(len(ln) <= 80 for ln in lines)


def test_fit_still_refuses_conflicting_repeats(tmp_path: Path) -> None:
    # `bstar fit` draws one curve: a batch needs one value there (the message says so).
    with pytest.raises(BstarError, match="listed twice"):
        load_points(points_csv(tmp_path, False))


def test_calibration_points_keep_every_repeat(tmp_path: Path) -> None:
    pts = load_points(points_csv(tmp_path, False), repeats=True)
    assert len(pts) == len(BATCHES) * len(NOISE)
    assert list(pts.batch) == sorted(pts.batch)
    assert len(cal.points_from_fit(pts, CONTEXT)) == len(pts)
