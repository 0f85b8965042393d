"""bstar validate: the prediction of each metric, leave-one-out calibration, the table."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from bstar import roofline as rl
from bstar import validate as va
from bstar.cli import main
from bstar.deployment import Efficiency
from bstar.errors import BstarError

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "published-measurements.csv"
HEADER = "model,gpu,num_gpus,engine,input_len,output_len,batch,metric,value,source"
_PRIOR = Efficiency()
# In the family validate fits: the KV stream and the attention rate follow the fitted weight
# stream and GEMM rate at the prior's ratios (bstar.calibrate._FOLLOWS).
TRUE = Efficiency(bandwidth=0.6, compute=0.45,
                     kv_bandwidth=0.6 * _PRIOR.kv_bandwidth / _PRIOR.bandwidth,
                     attention_compute=0.45 * _PRIOR.attention_compute / _PRIOR.compute)


def row(metric: str, batch: int, i: int = 512, o: int = 256, value: float = 1.0,
        model: str = "llama-3-8b", gpu: str = "a100-80gb-sxm", n: int = 1) -> va.Row:
    return va.Row(model, gpu, n, "eng 1", i, o, batch, metric, value, "https://example.org")


def test_tpot_is_the_decode_step_at_the_mean_context() -> None:
    r = row("tpot_ms", 32, 1000, 200)
    d = va.deployment_for(r)
    want = float(rl.decode_step(d, [32], 1100).step_s[0]) * 1e3
    assert va.predict(d, r) == pytest.approx(want, rel=1e-12)


def test_throughput_counts_prefill_and_every_decode_step() -> None:
    r = row("throughput_tok_s", 16, 2048, 128)
    d = va.deployment_for(r)
    step_s = float(rl.decode_step(d, [16], 2048 + 64).step_s[0])
    total_s = rl.prefill_s(d, 2048, 16) + 128 * step_s
    assert va.predict(d, r) == pytest.approx(16 * 128 / total_s, rel=1e-12)
    per_gpu = replace(r, metric="throughput_tok_s_per_gpu", num_gpus=2)
    d2 = va.deployment_for(per_gpu)
    assert va.predict(d2, per_gpu) == pytest.approx(
        va.predict(d2, replace(per_gpu, metric="throughput_tok_s")) / 2)


@pytest.mark.slow  # one fit per model left out
def test_leave_one_out_recovers_rows_the_model_generated() -> None:
    rows = []
    for metric, b, i, o in (("tpot_ms", 1, 512, 128), ("tpot_ms", 64, 512, 128),
                            ("throughput_tok_s", 128, 2048, 128),
                            ("throughput_tok_s", 256, 128, 512), ("tpot_ms", 16, 4096, 256)):
        r = row(metric, b, i, o)
        rows.append(replace(r, value=va.predict(va.deployment_for(r, TRUE), r)))
    v = va.validate(rows)
    for res in v.rows:
        assert res.calibrated_error == pytest.approx(0.0, abs=1e-4)
    # The defaults miss them: the uncalibrated error is real.
    assert v.uncalibrated_median_abs_error > 0.05
    eff = v.group_eff[("a100-80gb-sxm", "eng 1")]
    assert eff.bandwidth == pytest.approx(TRUE.bandwidth, rel=1e-3)
    assert eff.compute == pytest.approx(TRUE.compute, rel=1e-3)


def test_median_and_loo_leave_the_held_out_row_out() -> None:
    rows = [row("tpot_ms", b, value=v) for b, v in ((1, 10.0), (8, 11.0), (64, 20.0))]
    rows.append(row("tpot_ms", 128, value=1000.0))  # wildly off: must not predict itself
    v = va.validate(rows, fit=("bandwidth",))
    wild = v.rows[-1]
    assert wild.calibrated_error is not None and wild.calibrated_error < -0.9
    errs = sorted(abs(r.uncalibrated_error) for r in v.rows)
    assert v.uncalibrated_median_abs_error == pytest.approx((errs[1] + errs[2]) / 2)


def test_small_groups_get_no_calibrated_prediction() -> None:
    v = va.validate([row("tpot_ms", 1, value=12.0), row("tpot_ms", 4, value=13.0)])
    assert all(r.calibrated is None for r in v.rows)
    assert v.calibrated_median_abs_error is None
    assert any("too few" in n for n in v.notes)


@pytest.mark.parametrize("text, match", [
    ("model,gpu\nx,y\n", "missing column"),
    (HEADER + ",color\n", "unknown column"),
    (HEADER + "\nm,g,1,e,1,1,1,latency,5,src\n", "metric"),
    (HEADER + "\nm,g,1,e,1,1,1,tpot_ms,5,\n", "source"),
    (HEADER + "\nm,g,one,e,1,1,1,tpot_ms,5,src\n", "integers"),
    (HEADER + "\nm,g,1,e,1,1,1,tpot_ms,-5,src\n", "positive"),
    (HEADER + "\n", "no rows"),
])
def test_bad_tables_are_user_errors(text: str, match: str) -> None:
    with pytest.raises(BstarError, match=match):
        va.rows_from_csv(text)


def test_example_table_parses_and_names_a_source_for_every_row() -> None:
    rows = va.rows_from_csv(EXAMPLE.read_text(), str(EXAMPLE))
    assert len(rows) >= 10
    assert all(r.source.startswith("https://") for r in rows)
    for r in rows:
        va.deployment_for(r)  # every model and GPU is known to the planner


@pytest.mark.slow  # fits every model's rows through the CLI
def test_cli_prints_rows_and_medians(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = tmp_path / "t.csv"
    lines = [HEADER] + [f"llama-3-8b,a100-80gb-sxm,1,vllm,512,128,{b},tpot_ms,{v},https://x"
                        for b, v in ((1, 14.0), (16, 16.0), (64, 22.0), (128, 30.0))]
    t.write_text("\n".join(lines) + "\n")
    assert main(["validate", str(t), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["rows"]) == 4
    assert out["calibrated_median_abs_error"] is not None
    assert main(["validate", str(t)]) == 0
    assert "median |error|" in capsys.readouterr().out
