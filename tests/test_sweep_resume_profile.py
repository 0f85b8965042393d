"""Issue 12, item 16: a sweep run with `--profile` keeps it: `--resume` predicts the levels it
finishes with the profile's efficiencies, and the report rebuilt from the store draws the
calibrated prediction (bench/token_server.py as the server)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")

from bstar.cli import main
from bstar.loadgen.runner import predict_level
from bstar.options import DeploymentOptions
from bstar.report.views import sweep_view
from conftest import TokenServerFactory
from test_deployment import profile_file

FLAGS = ["--input-len", "8", "--output-len", "4", "--num-requests", "3", "--json", "--quiet"]


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:  # type: ignore[type-arg]
    assert main(argv) == 0
    return dict(json.loads(capsys.readouterr().out))


@pytest.mark.slow  # starts the token server
def test_resume_and_report_keep_the_profile(token_server: TokenServerFactory, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    srv = token_server(interval_ms=2)
    prof = profile_file(tmp_path)
    db = str(tmp_path / "r.db")
    first = _json(capsys, ["sweep", "--url", srv.url, "--concurrency", "1,2", "--db", db,
                           "--model", "llama-3-8b", "--gpu", "a100-80gb-sxm",
                           "--profile", str(prof), *FLAGS])
    run_id = first["run_id"]
    ctx = first["levels"][0]["predicted"]["context_tokens"]
    calibrated = DeploymentOptions("llama-3-8b", "a100-80gb-sxm", profile=str(prof)).build()
    plain = DeploymentOptions("llama-3-8b", "a100-80gb-sxm").build()
    assert predict_level(calibrated, 2, ctx)["tpot_ms"] != pytest.approx(
        predict_level(plain, 2, ctx)["tpot_ms"])
    # Drop the second level, as a run interrupted before it; --resume (no --profile) redoes it.
    with sqlite3.connect(db) as con:
        (level_id,) = con.execute("SELECT id FROM levels WHERE run_id = ? AND idx = 1",
                                  (run_id,)).fetchone()
        for table in ("requests", "prompts"):
            con.execute(f"DELETE FROM {table} WHERE level_id = ?", (level_id,))
        con.execute("DELETE FROM levels WHERE id = ?", (level_id,))
    resumed = _json(capsys, ["sweep", "--resume", run_id, "--db", db, *FLAGS])
    assert [lv["concurrency"] for lv in resumed["levels"]] == [1, 2]
    redone = resumed["levels"][1]["predicted"]
    assert redone["tpot_ms"] == pytest.approx(predict_level(calibrated, 2, ctx)["tpot_ms"])
    # The report's predicted curve, rebuilt from the stored options, is the calibrated one.
    shown = _json(capsys, ["runs", "show", run_id, "--db", db, "--json"])
    curve = sweep_view(shown)["predicted_curve"]
    assert curve["batch"][0] == 1
    assert curve["tpot_ms"][0] == pytest.approx(predict_level(calibrated, 1, ctx)["tpot_ms"])
    assert curve["calibrated"] and curve["label"].startswith("calibrated cost model")


def test_level_prediction_is_the_quantity_the_level_measures() -> None:
    """A level measures output tokens per second with every prompt's prefill in it, so its
    prediction is the prefill-then-decode aggregate (as `bstar validate` predicts a curve),
    not B / TPOT; without lengths it stays B / TPOT and says so."""
    from bstar.deployment import Deployment
    from bstar.specs.gpu import get_gpu
    from bstar.specs.presets import get_model
    from bstar.validate import Row, predict

    d = Deployment(get_model("llama-3-8b"), get_gpu("h100-sxm"))
    p = predict_level(d, 16, 1024 + 64, 1024, 128)
    row = Row("llama-3-8b", "h100-sxm", 1, "vllm", 1024, 128, 16, "throughput_tok_s", 1.0, "-")
    assert p["throughput_basis"] == "incl_prefill"
    assert p["throughput_tok_s"] == pytest.approx(predict(d, row), rel=1e-12)
    assert p["decode_throughput_tok_s"] == pytest.approx(16 / (p["tpot_ms"] / 1e3), rel=1e-9)
    assert p["throughput_tok_s"] < 0.9 * p["decode_throughput_tok_s"]  # 1,024-token prompts
    q = predict_level(d, 16, 1024 + 64)
    assert q["throughput_basis"] == "decode_only"
    assert q["throughput_tok_s"] == pytest.approx(p["decode_throughput_tok_s"])
