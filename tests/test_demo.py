"""`bstar demo` end to end: tiny model, llama.cpp on 127.0.0.1, sweep, fit, report (slow:
a real server on the CPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bstar.cli import main

pytest.importorskip("xllamacpp", reason="needs the extra bstar[llamacpp]")
pytest.importorskip("gguf", reason="needs the extra bstar[tiny]")
# A chart whose legend or labels squeeze its axes to nothing is a broken picture.
pytestmark = pytest.mark.filterwarnings("error:constrained_layout not applied:UserWarning")


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    # Fewer, shorter levels than the default keep CI quick; the path is the same.
    assert main(["demo", "-o", str(out), "--concurrency", "1,2,4", "--num-requests", "8",
                 "--output-len", "16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) >= {"run_id", "db", "report", "levels", "recommendation"}
    assert Path(d["db"]).is_file() and Path(d["report"]).is_file()
    assert [lv["concurrency"] for lv in d["levels"]] == [1, 2, 4]
    for lv in d["levels"]:
        # Every request succeeds against a healthy local llama.cpp (keep-alive included).
        assert lv["status"] == "completed" and lv["errors"] == 0, lv
        assert lv["requests"] == 8 and lv["throughput_tok_s"] > 0
        assert lv["tpot_ms"]["p50"] > 0 and lv["ttft_ms"]["p99"] >= lv["ttft_ms"]["p50"]
    assert d["recommendation"]["max_num_seqs"] in (1, 2, 4)
    html = Path(d["report"]).read_text(encoding="utf-8")
    # Predicted/fitted/measured/simulated on one picture, then the sweep and the fit.
    assert html.count('<figure class="plot"') == 3
    assert Path(d["report"]).with_name("this-cpu.toml").is_file()  # the probed "GPU" file
    assert all(lv["predicted"] for lv in d["levels"])  # the cost model ran for each level
    # The cost model was calibrated on the demo's own levels before it predicted (the
    # profile file is there to reuse, and loads). The fit minimises a robust loss over the
    # levels, not their median error: on a loaded machine three noisy levels can leave the
    # calibrated median above the prior's, so no order of the two medians is asserted, only
    # that both were computed.
    cal = d["calibration"]
    from bstar.calibrate.profiles import load_profile

    assert dict(load_profile(cal["profile"]).values)  # fitted values, in a valid file
    assert math.isfinite(cal["median_abs_error"])
    assert math.isfinite(cal["uncalibrated_median_abs_error"])
    # The roof's shape was chosen with it, and the profile file carries the choice.
    assert cal["roof_sharpness"] in (1.0, 2.0)
    assert f"roof_sharpness = {cal['roof_sharpness']!r}" in Path(cal["profile"]).read_text()
    # The fit extrapolates the quantity the sweep measured: output tokens, prefill included.
    assert d["fit"]["throughput_kind"].startswith("output, prefill included")
    assert d["run_id"] in html
    # One story: each predicted throughput point beside a level names its calibration and
    # basis, and a calibrated one off by more than 15% says it misses.
    import re

    points = re.findall(r"<title>((?:un)?calibrated cost model \(output tok/s incl\. prefill\) "
                        r"at (?:batch|concurrency) \d+: [^<]*)</title>", html)
    assert len(points) == 2 * 2 * 3, points  # two charts, two predictions, three levels
    for text in points:
        err = int(re.search(r"([+-]\d+)% vs measured", text).group(1))
        if text.startswith("calibrated") and abs(err) > 15:
            assert text.endswith("(misses by more than 15%)"), text
    for raw in ("bound: unknown", "tpot_lower_bound", "incl_prefill"):
        assert raw not in re.sub(r"<svg.*?</svg>", "", html, flags=re.S), raw
    # The stored run reports on its own too.
    assert main(["report", "run", d["run_id"], "--db", d["db"], "-o",
                 str(tmp_path / "run.html")]) == 0
