"""`bstar validate RUNS.csv`'s leave-one-GPU-out way (issue 37, item 5): a figure left out
is fitted on none of the rows it predicts."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest

from bstar.cli import main
from bstar.report.text.validate import format_runs_validation
from bstar.runs_table import runs_from_csv
from bstar.validate_runs import score_runs
from bstar.validate_stages import DEFAULT_FIT, PathFit, score
from bstar.validate_stages.simulate import simulate_stage

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "data" / "inferencemax" / "runs.csv"


def _table(picks: list[tuple[str, str, str]]) -> str:
    """A runs table of the shipped table's first run of each (engine, gpu, model) in
    `picks`, at the lowest concurrency."""
    rows = list(csv.DictReader(io.StringIO(TABLE.read_text())))
    out = []
    for eng, gpu, model in picks:
        mine = [r for r in rows if (r["engine"], r["gpu"], r["model"]) == (eng, gpu, model)]
        out.append(min(mine, key=lambda r: int(r["concurrency"])))
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(out[0]))
    w.writeheader()
    w.writerows(out)
    return buf.getvalue()


PICKS = [("vllm", "h200", "gpt-oss-120b"), ("vllm", "b200", "gpt-oss-120b"),
         ("sglang", "h200", "deepseek-v3")]


@pytest.fixture
def fake_fit(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """fit_stages records what it was given and returns its start; simulate_stage returns
    one real prediction (a run of the table) for every stage, so nothing costs a
    simulation beyond the first."""
    calls: list[dict[str, Any]] = []
    (one,) = runs_from_csv(_table(PICKS[:1]))
    canned = simulate_stage(one, max_window_s=5)

    def fit(stages, prior, fit, *args, behaviour=None, **kw):
        calls.append({"gpus": sorted({s.gpu for s in stages}),
                      "engines": sorted({s.engine for s in stages}),
                      "stages": [s.stage for s in stages], "fit": tuple(fit),
                      "prior": prior})
        return PathFit(prior, behaviour, {})

    monkeypatch.setattr(score, "fit_stages_by_path", fit)
    monkeypatch.setattr(score, "simulate_stage", lambda *a, **k: canned)
    return calls


def test_leave_one_gpu_out_fits_only_the_other_gpus_runs(fake_fit: list[dict[str, Any]]
                                                           ) -> None:
    runs = runs_from_csv(_table(PICKS))
    v = score_runs(runs, lomo=False)
    by_gpu = {c["gpus"][0]: c for c in fake_fit}
    # one fit per vLLM group, each on the other GPU's run only; sglang has one GPU: no fit
    assert len(fake_fit) == 2
    h200_run, b200_run = (r.stage for r in runs[:2])
    assert by_gpu["b200"]["stages"] == [b200_run]  # fitted for the H200 group
    assert by_gpu["h200"]["stages"] == [h200_run]  # fitted for the B200 group
    # the shared terms, and the fused-MoE terms each kernel path of the other GPU fits
    assert all(c["engines"] == ["vllm"] and c["fit"] == (*DEFAULT_FIT, *score.LOGO_KERNEL_FIT)
               for c in fake_fit)
    # from the generic start: the fitted terms at Efficiency's defaults, as LOMO starts
    assert all(c["prior"].overhead_s == score.Efficiency().overhead_s for c in fake_fit)
    # H200's and B200's gpt-oss kernel paths differ: the profile's fused-MoE terms (fitted
    # on H200's own runs) are in neither left-out fit, generic as for a GPU with no entry
    assert all((c["prior"].moe_compute, c["prior"].moe_layer_s) == (1.0, 0.0)
               for c in fake_fit)
    d = v.to_dict()
    groups = {(g["gpu"], g["engine"]): g for g in d["groups"]}
    for gpu, other in (("h200", "b200"), ("b200", "h200")):
        g = groups[gpu, "vllm"]
        assert "logo" in g["summary"] and "output_tok_s_per_gpu" in g["summary"]["logo"]
        assert g["stages"][0]["predicted"]["logo"] is not None
        assert g["logo_gpus"] == [other] and set(g["logo_eff"]) == set(DEFAULT_FIT)
    sg = groups["h200", "sglang"]
    assert "logo" not in sg["summary"] and "logo" not in sg["stages"][0]["predicted"]
    assert any("one GPU" in n for n in sg["notes"])
    text = format_runs_validation(d)
    assert "LOGO" in text and "LOGO (fitted on b200)" in text


def test_no_logo_skips_it_and_no_lomo_does_not(fake_fit: list[dict[str, Any]]) -> None:
    runs = runs_from_csv(_table(PICKS[:2]))
    d = score_runs(runs, lomo=False, logo=False).to_dict()
    assert not fake_fit and all("logo" not in g["summary"] for g in d["groups"])


def test_cli_no_lomo_keeps_logo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    import bstar.validate_runs as vr

    seen: list[dict[str, Any]] = []
    real = vr.score_runs

    def spy(runs, fit=DEFAULT_FIT, **kw):
        seen.append(kw)
        return real(runs, fit, **{**kw, "lomo": False, "logo": False})

    monkeypatch.setattr(vr, "score_runs", spy)
    monkeypatch.setattr(score, "simulate_stage", _cheap_simulation())
    f = tmp_path / "runs.csv"
    f.write_text(_table(PICKS[:1]))
    for flag in ("--no-lomo", "--no-logo"):
        assert main(["validate", str(f), flag, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["kind"] == "runs"
    assert (seen[0]["lomo"], seen[0]["logo"]) == (False, True)
    assert (seen[1]["lomo"], seen[1]["logo"]) == (True, False)


def _cheap_simulation():
    (one,) = runs_from_csv(_table(PICKS[:1]))
    canned = simulate_stage(one, max_window_s=5)
    return lambda *a, **k: canned
