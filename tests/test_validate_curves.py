"""bstar validate on curves tables: like-for-like predictions, leave-one-model-out per
GPU x engine, knee distance, offline model resolution and the table's errors."""

from __future__ import annotations

import csv
import io
import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bstar import roofline as rl
from bstar import validate_curves as vc
from bstar.cli import main
from bstar.deployment import Efficiency
from bstar.errors import BstarError

ROOT = Path(__file__).resolve().parents[1]
COLS = ("model", "gpu", "num_gpus", "engine", "input_len", "output_len", "batch",
        "batch_kind", "itl_ms", "throughput_tok_s", "source")
# In the family a fit moves in: the KV stream follows the weight stream at the prior's ratio
# (bstar.calibrate._FOLLOWS).
TRUE = Efficiency(bandwidth=0.6, kv_bandwidth=0.6 * Efficiency().kv_bandwidth
                     / Efficiency().bandwidth, overhead_s=1.0e-3, allreduce_latency_s=25e-6)


def table(rows: list[dict[str, object]], cols: tuple[str, ...] = COLS) -> str:
    out = io.StringIO()
    w = csv.DictWriter(out, cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return out.getvalue()


def generated(truth: Efficiency, engine: str = "made-up-engine") -> list[vc.CurveRow]:
    """Rows the cost model itself generates with `truth`: three models, TP 1, 2 and 4."""
    out = []
    for model, n in (("llama-2-7b", 1), ("llama-2-13b", 2), ("llama-2-70b", 4)):
        for b in (1, 8, 32):
            for i, o in ((128, 128), (1024, 256)):
                r = vc.CurveRow(model, "a100-80gb-sxm", n, engine, b, "static", "synthetic",
                                input_len=i, output_len=o, step_ms=1.0, step_column="itl_ms",
                                throughput_tok_s=1.0)
                p = vc.predicted(vc.deployment_for(r, truth), r)
                out.append(replace(r, step_ms=p["step_ms"],
                                   throughput_tok_s=p["throughput_tok_s"]))
    return out


def test_predictions_are_like_for_like() -> None:
    r = vc.CurveRow("llama-2-7b", "a100-80gb-sxm", 1, "lmdeploy", 16, "static", "s",
                    input_len=2048, output_len=128, step_ms=20.0, step_column="itl_ms",
                    throughput_tok_s=300.0)
    d = vc.deployment_for(r, Efficiency())
    p = vc.predicted(d, r)
    step_s = float(rl.decode_step(d, [16], 2048 + 64).step_s[0])
    assert p["step_ms"] == pytest.approx(step_s * 1e3, rel=1e-12)
    assert p["throughput_tok_s"] == pytest.approx(
        16 * 128 / (rl.prefill_s(d, 2048, 16) + 128 * step_s), rel=1e-12)
    # A decode-step row is a step at its context; its throughput is not a separate metric.
    s = replace(r, batch_kind="step", context_tokens=512, input_len=0, output_len=0)
    assert set(vc.predicted(d, s)) == {"step_ms"}
    assert vc.predicted(d, s)["step_ms"] == pytest.approx(
        float(rl.decode_step(d, [16], 512).step_s[0]) * 1e3, rel=1e-12)
    # No lengths, no context: nothing to predict it at.
    assert vc.measured(replace(r, input_len=0, output_len=0)) == {}


@pytest.mark.slow  # leave-one-model-out fits
def test_leave_one_model_out_recovers_curves_across_tp_sizes() -> None:
    """Each model is predicted from parameters fitted to the other two; with rows the cost
    model generated, that gives them back, the tensor-parallel ones included (their
    all-reduce latency is fitted on the other models' TP rows)."""
    v = vc.score_curves(generated(TRUE))
    (g,) = v.groups
    assert g.profile is None and g.models == ["llama-2-13b", "llama-2-70b", "llama-2-7b"]
    for k in ("step_ms", "throughput_tok_s"):
        m = g.metrics[k].to_dict()
        assert m["rows"] == 18
        assert m["lomo"] == pytest.approx(0.0, abs=2e-3), k
        assert m["generic"] > 0.05  # the defaults miss them: the figure is not vacuous
    assert g.worst_model_lomo < 5e-3


def test_one_model_has_no_lomo_and_unknown_models_are_skipped_offline() -> None:
    rows = [r for r in generated(TRUE) if r.model == "llama-2-7b"]
    rows.append(replace(rows[0], model="someorg/Unknown-7B-Instruct"))
    v = vc.score_curves(rows)
    (g,) = v.groups
    assert g.model_lomo == {} and any("no leave-one-model-out" in n for n in g.notes)
    (s,) = v.skipped
    assert s["model"] == "someorg/Unknown-7B-Instruct"
    assert "no bundled config" in s["reason"]


def test_knee_distance_in_grid_steps() -> None:
    """A measured decode curve whose throughput is flat past batch 16 has its knee at 16;
    the distance is counted in the curve's own grid to the knee of the prediction."""
    base = vc.CurveRow("opt-1.3b", "h200", 1, "torch-graph", 1, "step", "s",
                       context_tokens=2048, step_ms=1.0, step_column="step_ms")
    grid = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    d = vc.deployment_for(base, Efficiency())
    step16_ms = float(rl.decode_step(d, [16], 2048).step_s[0]) * 1e3
    rows = [replace(base, batch=b, step_ms=(float(rl.decode_step(d, [b], 2048).step_s[0]) * 1e3
                                            if b <= 16 else step16_ms * b / 16))
            for b in grid]
    (k,) = vc.knee_scores(rows)
    assert k.measured_knee == 16 and k.grid == grid
    predicted_at = (len(grid) - 1 if k.predicted_knee is None
                    else min(range(len(grid)), key=lambda i: abs(grid[i] - k.predicted_knee)))
    assert k.predicted_knee != 16 and k.grid_steps_apart == abs(predicted_at - grid.index(16))
    assert vc.knee_scores(rows[:3]) == []  # fewer than four batch sizes: no knee to score


@pytest.mark.parametrize("text, match", [
    ("model,gpu,num_gpus,engine,batch,source\nx,h200,1,e,1,s\n", "missing column.*batch_kind"),
    ("model,gpu,num_gpus,engine,batch,batch_kind,source,colour\nx,h200,1,e,1,step,s,red\n",
     "unknown column.*colour"),
    ("model,gpu,num_gpus,engine,batch,batch_kind,source,step_ms\nx,h200,1,e,1,burst,s,3\n",
     "batch_kind 'burst'"),
    ("model,gpu,num_gpus,engine,batch,batch_kind,source,step_ms\nx,h200,1,e,1,step,s,\n",
     "no measurement"),
    ("model,gpu,num_gpus,engine,batch,batch_kind,source,step_ms\nx,h200,0,e,1,step,s,3\n",
     "num_gpus must be >= 1"),
    ("model,gpu,num_gpus,engine,batch,batch_kind,source,step_ms\nx,h200,1,e,1,step,s,-3\n",
     "step_ms must be positive"),
    ("model,gpu,num_gpus,engine,batch,batch_kind,source,step_ms\nx,h200,1,e,1,step,,3\n",
     "needs its source"),
])
def test_bad_tables_say_where_and_what(text: str, match: str) -> None:
    with pytest.raises(BstarError, match=match):
        vc.curves_from_csv(text, "t.csv")


@pytest.mark.slow  # fits through the CLI
def test_cli_resolves_config_and_probe_paths_next_to_the_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The CPU rows name the tiny model's config.json and the run's probe file, relative to
    the table: `bstar validate` scores them with nothing fetched."""
    src = ROOT / "data" / "cpu"
    for f in ["curves.csv", *[p.name for p in (*src.glob("*config.json"),
                                              *src.glob("*probe-*.toml"))]]:
        shutil.copy(src / f, tmp_path / f)
    assert main(["validate", str(tmp_path / "curves.csv"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "curves" and d["skipped"] == []
    rows = vc.curves_from_csv((src / "curves.csv").read_text())
    assert len(d["groups"]) == len({r.gpu for r in rows})  # one group per probed run
    assert {g["engine"] for g in d["groups"]} == {"vllm", "llama.cpp"}
    for g in d["groups"]:
        assert g["profile"] == g["engine"]
        assert g["metrics"]["step_ms"]["rows"] == sum(1 for r in rows if r.gpu == g["gpu"])
        assert g["metrics"]["step_ms"]["uncalibrated"] is not None
    assert main(["validate", str(tmp_path / "curves.csv")]) == 0
    out = capsys.readouterr().out
    assert "one model: no leave-one-model-out figure" in out


def test_the_repo_curves_tables_parse() -> None:
    for p in [ROOT / "data" / n / "curves.csv" for n in ("published", "h200", "cpu")] + [
            ROOT / "data" / "h200" / "heldout-curves.csv"]:
        rows = vc.curves_from_csv(p.read_text(), str(p), p.parent)
        assert rows and all(r.source for r in rows)


def test_held_out_h200_models_are_predicted_by_the_profile_fitted_before_them() -> None:
    """Five models (InternLM-20B, OPT-2.7B, Gemma-2-9B and -27B, Llama-2-70B) timed on the
    H200 after the torch-graph profile was fitted on seven others: the profile, unchanged,
    predicts their decode steps (the figure docs/cost-model.md quotes)."""
    p = ROOT / "data" / "h200" / "heldout-curves.csv"
    rows = vc.curves_from_csv(p.read_text(), str(p), p.parent)
    assert {r.model for r in rows} == {"internlm-20b", "opt-2.7b", "gemma-2-9b",
                                       "gemma-2-27b", "llama-2-70b"}
    from bstar.engines import get_engine

    errs = vc._errors(rows, get_engine("torch-graph").efficiency())["step_ms"]
    assert len(errs) == len(rows)
    assert float(np.median(np.abs(errs))) < 0.05
    assert max(map(abs, errs)) < 0.15


@pytest.mark.slow  # fits profiles over every curve table
def test_fit_chooses_the_roof_shape_that_made_the_rows() -> None:
    """With roof_sharpness in the fit, the roof's shape is chosen among the candidates by the
    fit it leaves: a curve made with memory and compute times added (k = 1, a CPU thread)
    brings back k = 1, and one of the H200's soft maximum brings back k = 2."""
    for k in (1.0, 2.0):
        truth = replace(TRUE, roof_sharpness=k)
        rows = []
        for b in (1, 16, 64, 128, 256, 512, 1024):
            r = vc.CurveRow("llama-2-7b", "a100-80gb-sxm", 1, "e", b, "static", "synthetic",
                            input_len=128, output_len=128, step_ms=1.0,
                            step_column="itl_ms", throughput_tok_s=1.0)
            p = vc.predicted(vc.deployment_for(r, truth), r)
            rows.append(replace(r, step_ms=p["step_ms"], throughput_tok_s=p["throughput_tok_s"]))
        eff = vc.fit_rows(rows, Efficiency(), ("bandwidth", "compute", "overhead_s",
                                                  "roof_sharpness"))
        assert eff is not None and eff.roof_sharpness == k


def test_predicted_many_prices_a_curve_at_once_with_the_same_numbers() -> None:
    """The fit prices every row of a deployment in one vectorized call per context: the same
    numbers as `predicted` row by row, on every shipped curves table."""
    from collections import defaultdict

    n = 0
    for name in ("published", "h200", "cpu"):
        path = ROOT / "data" / name / "curves.csv"
        rows = vc.curves_from_csv(path.read_text(), str(path), path.parent)
        groups: dict[tuple[str, ...], list[vc.CurveRow]] = defaultdict(list)
        for r in rows:
            if vc.measured(r):
                groups[(r.model, r.gpu, str(r.num_gpus), r.dtype, r.kv_dtype)].append(r)
        for group in groups.values():
            try:
                d = vc.deployment_for(group[0], Efficiency())
            except BstarError:
                continue
            for r, many in zip(group, vc.predicted_many(d, group), strict=True):
                one = vc.predicted(d, r)
                assert many.keys() == one.keys()
                for k in one:
                    assert many[k] == pytest.approx(one[k], rel=1e-12)
                    n += 1
    assert n > 300
