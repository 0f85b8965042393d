"""`bstar fit` through main(argv): the --json contract, seed 001 both ways, human output,
one-line errors with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bstar.cli import main

ROOT = Path(__file__).resolve().parents[1]
SEED001 = str(ROOT / "examples" / "seed001.csv")


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["fit", *argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out, dict)
    return out


def test_seed001_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, SEED001, "--critical-batch", "128", "--predict", "256,512")
    assert set(out) >= {"params", "knee_batch", "predictions", "regime_at"}
    assert isinstance(out["params"], dict) and out["params"]["roof"] == "critical-batch"
    assert isinstance(out["knee_batch"], int)
    assert [p["batch"] for p in out["predictions"]] == [256, 512]
    for p, tpot in zip(out["predictions"], (37.0, 73.0), strict=True):
        assert set(p) >= {"batch", "throughput_tok_s", "tpot_ms", "low", "high"}
        assert abs(p["throughput_tok_s"] / 7000 - 1) <= 0.10
        assert abs(p["tpot_ms"] / tpot - 1) <= 0.10
        assert p["low"]["tpot_ms"] <= p["tpot_ms"] <= p["high"]["tpot_ms"]
        assert p["low"]["throughput_tok_s"] <= p["throughput_tok_s"] <= p["high"][
            "throughput_tok_s"]
    assert out["regime_at"]["512"] == "compute-bound"
    assert out["regime_at"]["1"] == "memory-bound"
    assert set(out["knees"]["fitted"]) == {"step", "doubling", "bca"}


@pytest.mark.slow  # bootstraps through the CLI
def test_seed001_without_roof(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, SEED001)
    assert out["params"]["roof"] == "unknown" and out["params"]["c_ms"] is None
    assert "plateau cannot be determined" in out["params"]["roof_note"]
    assert [p["batch"] for p in out["predictions"]] == [256, 512]  # default: 2x, 4x
    assert all(p["bound"] == "tpot_lower_bound" for p in out["predictions"])
    assert out["knee_batch"] is None
    assert main(["fit", SEED001]) == 0
    text = capsys.readouterr().out
    assert "plateau cannot be determined from these points" in text
    assert "TPOT at least this" in text


def test_human_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", SEED001, "--critical-batch", "128", "--predict", "256,512",
                 "--max-tpot-ms", "30"]) == 0
    text = capsys.readouterr().out
    for s in ("a = ", "b = ", "c = ", "B* = a/b", "memory-bound", "compute-bound", "residual",
              "seed 000", "seed 004", "BCA", "SLA TPOT <= 30 ms", "knee: B ="):
        assert s in text, s


def test_model_and_gpu_give_a_roof(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, SEED001, "--model", "llama-2-7b", "--gpu", "h100-sxm",
                   "--context", "512")
    assert out["params"]["roof"] == "cost-model"
    assert out["spec"]["compute_ms_per_seq"] > 0
    # a as a bandwidth: the model's weight bytes over a.
    assert out["params"]["weight_bandwidth_bytes_s"] == pytest.approx(
        out["spec"]["weight_bytes"] / (out["params"]["a_ms"] / 1e3))
    assert out["params"]["kv_bandwidth_bytes_s"] is not None


def test_sweep_style_json_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pts = tmp_path / "p.json"
    pts.write_text(json.dumps([{"batch": 1, "tpot_ms": 10}, {"batch": 4, "tpot_ms": 10.6},
                               {"batch": 16, "tpot_ms": 12.5}]))
    out = run_json(capsys, str(pts), "--predict", "32", "--bootstrap", "0")
    assert out["predictions"][0]["batch"] == 32


@pytest.mark.parametrize(("text", "message"), [
    ("batch,tpot_ms\n1,10\n2,11\n", "need at least 3"),
    ("batch,tpot_ms\n1,10\n2,11\n2,12\n4,1\n", "line 4: batch 2 is listed twice"),
    ("batch,tpot_ms\n1,10\n2,x\n4,1\n", "line 3: tpot_ms is 'x', not a number"),
    ("batch,tpot_ms\n1,10\n2,0\n4,1\n", "line 3: tpot_ms must be positive"),
    ("batch,tok_s\n1,10\n2,0\n4,1\n", "line 1: unknown column 'tok_s'"),
])
def test_bad_input_exit_2_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   text: str, message: str) -> None:
    p = tmp_path / "bad.csv"
    p.write_text(text)
    assert main(["fit", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bstar: error: ") and message in err
    assert err.count("\n") == 1


def test_gpu_without_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fit", SEED001, "--gpu", "h100-sxm"]) == 2
    assert "--gpu needs --model" in capsys.readouterr().err
