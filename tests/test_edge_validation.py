"""Issue 19, defects 6, 9, 11 and 13: every number from a flag or a file is checked for
finiteness and range (one line naming the flag or the file and field, exit 2); --json is
strict JSON; fit and calibrate scale with the number of points; warnings aggregate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bstar.cli import main
from bstar.errors import BstarError


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and err.count("\n") == 0, err
    return err


def _status(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's one-line usage error
        return int(e.code or 0)


@pytest.mark.parametrize(("argv", "needle"), [
    (["simulate", "--rate", "inf"], "--rate"),
    (["simulate", "--rate", "nan"], "--rate"),
    (["simulate", "--rate", "1", "--seed", "-1"], "--seed"),
    (["simulate", "--rate", "1", "--reserve-gib", "inf"], "--reserve-gib"),
    (["simulate", "--rate", "1", "--input-len", "normal:inf:inf"], "--input-len"),
    (["simulate", "--rate", "1", "--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (["simulate", "--rate", "1", "--slo", "ttft:500,ttft:600"], "ttft twice"),
    (["simulate", "--rate", "1", "--slo", "ttft:inf"], "ttft"),
    (["search", "--rate", "1", "--slo", "ttft:100", "--input-len", "normal:inf:inf"],
     "--input-len"),
    (["search", "--rate", "1", "--slo", "ttft:100", "--seed", "-1"], "--seed"),
    (["search", "--rate", "inf", "--slo", "ttft:100"], "--rate"),
    (["search", "--rate", "1", "--slo", "ttft:100", "--max-num-batched-tokens", "0"],
     "--max-num-batched-tokens"),
    (["plan", "--reserve-gib", "nan"], "--reserve-gib"),
    (["sweep", "--url", "http://[::1", "--concurrency", "1", "--db", "/nonexistent/x.db"],
     "--url"),
])
def test_bad_flags_are_one_line(argv: list[str], needle: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _status(argv) == 2
    assert needle in _err(capsys)


def test_gpu_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = 'name = "x"\nmemory_bytes = 85899345920\nhbm_bandwidth_bytes_s = 2e12\n' \
           'bf16_flops = 1e15\n'
    cases = {
        "inf-bw.toml": (base.replace("2e12", "inf"), "hbm_bandwidth_bytes_s"),
        "nan-flops.toml": (base.replace("1e15", "nan"), "bf16_flops"),
        "huge-mem.toml": (base.replace("85899345920", "1e30"), "memory_bytes"),
        "name.toml": (base.replace('"x"', "5"), "name"),
        "sms.toml": (base + "num_sms = -4\n", "num_sms"),
    }
    for fname, (text, field) in cases.items():
        p = tmp_path / fname
        p.write_text(text)
        assert main(["plan", "--gpu", str(p)]) == 2, fname
        err = _err(capsys)
        assert str(p) in err and field in err, err
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(base.replace('"x"', '"caf\xe9"').encode("latin-1"))
    assert main(["plan", "--gpu", str(bad)]) == 2
    assert "UTF-8" in _err(capsys)
    # A sane file still plans, and its ridge is a real number.
    good = tmp_path / "good.toml"
    good.write_text(base)
    assert main(["plan", "--gpu", str(good), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ridge_flops_per_byte"] == pytest.approx(500)


@pytest.mark.slow  # a second or more on the 2-core machine; the fast loop stays under a minute
def test_price_and_trace_files_not_utf8(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    price = tmp_path / "p.toml"
    price.write_bytes(b'as_of = "2026"\n[gpus.h100-sxm]\nper_gpu_hour = 3\n# \xff\xfe\n')
    assert main(["search", "--price", str(price), "--rate", "1", "--slo", "ttft:100",
                 "--db", str(tmp_path / "s.db")]) == 2
    assert "UTF-8" in _err(capsys)
    price.write_text('as_of = "2026"\n[gpus.h100-sxm]\nper_gpu_hour = inf\n')
    assert main(["search", "--price", str(price), "--rate", "1", "--slo", "ttft:100",
                 "--db", str(tmp_path / "s.db")]) == 2
    assert "per_gpu_hour" in _err(capsys)
    trace = tmp_path / "t.csv"
    trace.write_bytes(b"arrival_s,prompt_tokens,output_tokens\n0,1\xff,1\n")
    assert main(["simulate", "--trace", str(trace)]) == 2
    assert "UTF-8" in _err(capsys)
    # A trace with a BOM is read.
    trace.write_text("\ufeffarrival_s,prompt_tokens,output_tokens\n0,10,10\n0.1,10,10\n")
    assert main(["simulate", "--trace", str(trace), "--max-num-seqs", "4", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 2


def test_prompts_files(tmp_path: Path) -> None:
    from bstar.loadgen.workload import load_prompts_jsonl

    p = tmp_path / "p.jsonl"
    for text, needle in [('{"prompt": 5}\n', '"prompt" must be a string'),
                         ('{"messages": "hi"}\n', '"messages"'),
                         ('{"messages": [{"role": "user", "content": 3}]}\n', '"messages"'),
                         ('{"prompt": "a", "output_len": 1e300}\n', '"output_len"'),
                         ('{"prompt": "a", "output_len": true}\n', '"output_len"'),
                         ('["prompt"]\n', "expected an object")]:
        p.write_text(text)
        with pytest.raises(BstarError, match=needle):
            load_prompts_jsonl(p)
    p.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(BstarError, match="UTF-8"):
        load_prompts_jsonl(p)
    p.write_text('{"prompt": "hello", "output_len": 4}\n{"messages": [{"role": "user", '
                 '"content": "hi"}]}\n')
    assert len(load_prompts_jsonl(p)) == 2


def test_fit_points_edges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "pts.csv"
    p.write_text("batch,tpot_ms\n1,10\n2,10.5\n1e300,11\n")
    assert main(["fit", str(p)]) == 2
    err = _err(capsys)
    assert "line 4" in err and "batch" in err
    p.write_bytes("\ufeffbatch,tpot_ms\n1,10\n2,10.5\n4,11\n8,12\n".encode())
    assert main(["fit", str(p), "--bootstrap", "0", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["points"]) == 4
    p.write_bytes(b"batch,tpot_ms\n1,10\xff\n")
    assert main(["fit", str(p)]) == 2
    assert "UTF-8" in _err(capsys)


def test_repeated_rows_warn_once_with_a_count(tmp_path: Path) -> None:
    from bstar.fit import load_points

    rows = "".join(f"{1 + i % 8},{10 + (i % 8) * 0.5}\n" for i in range(5000))
    p = tmp_path / "dup.csv"
    p.write_text("batch,tpot_ms\n" + rows)
    pts = load_points(p)
    assert len(pts) == 8
    assert len(pts.warnings) == 2 and "4,991 more" in pts.warnings[1]


def test_json_never_emits_nan_or_infinity() -> None:
    from bstar.commands.emit import dumps

    text = dumps({"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": -float("inf")}})
    assert json.loads(text) == {"a": None, "b": [None, 1.5], "c": {"d": None}}
    assert "NaN" not in text and "Infinity" not in text


def test_lengths_and_traces_refuse_non_finite() -> None:
    from bstar.sim.traffic import parse_lengths, parse_trace

    for bad in ("normal:inf:inf", "normal:64:nan", "lognormal:1e300:1", "uniform:1:1e12"):
        with pytest.raises(BstarError):
            parse_lengths(bad, "--input-len")
    for bad in ("nan", "inf", "-1", "1e300"):
        with pytest.raises(BstarError, match="arrival_s"):
            parse_trace(f"arrival_s,prompt_tokens,output_tokens\n0,1,1\n{bad},1,1\n")
    draws = parse_lengths("normal:64:1e6").sample(np.random.default_rng(0), 1000)
    assert draws.min() >= 1 and np.all(np.isfinite(draws))


# ---- scale (item 11): counts, not times ----------------------------------------------------
def test_fit_solves_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """The number of least-squares solves does not grow with the points, and each solve
    sees at most MAX_FIT_POINTS of them: the fit is O(n log n), not one solve per split."""
    import bstar.fit as fit
    import bstar.fit.model as model
    import bstar.fit.run as run

    calls: list[int] = []
    real = model._solve

    def counting(mode, b, y, start):  # type: ignore[no-untyped-def]
        calls.append(b.size)
        return real(mode, b, y, start)

    monkeypatch.setattr(model, "_solve", counting)
    monkeypatch.setattr(run, "_solve", counting)
    rng = np.random.default_rng(0)
    counts = {}
    for n in (200, 5000):
        b = np.arange(1, n + 1)
        step = np.maximum(10 + 0.02 * b * 2000 / n, (10 / (0.6 * n) + 0.02 * 2000 / n) * b)
        pts = fit.make_points(b.tolist(),
                              tpot_ms=(step * (1 + 0.01 * rng.standard_normal(n))).tolist())
        calls.clear()
        res = fit.fit_points(pts, n_bootstrap=10)
        counts[n] = len(calls)
        assert max(calls) <= model.MAX_FIT_POINTS
        assert res.roof_source == "data"
        assert res.params.crossover_batch == pytest.approx(0.6 * n, rel=0.1)
    assert counts[5000] <= counts[200] + model.REFINE_SPLITS


def test_calibrate_shapes_once_same_answer() -> None:
    """Repeats of a step shape are priced once and gathered: the calibration is the one
    the points give one by one."""
    import bstar.calibrate as cal
    from bstar.options import DeploymentOptions

    d = DeploymentOptions(model="llama-3-8b", gpu="h100-sxm").build()
    rng = np.random.default_rng(1)
    pts = [cal.Point(b, 1024, (8 + 0.05 * b) / 1e3 * (1 + 0.01 * rng.standard_normal()))
           for b in (1, 2, 4, 8, 16, 32, 64, 128) for _ in range(5)]
    uniq, inv = cal._unique_shapes(pts)
    assert len(uniq) == 8 and [uniq[i].batch for i in inv] == [p.batch for p in pts]
    many = cal.calibrate(d, pts)
    assert len(many.points) == len(pts)
    one_by_one = np.concatenate([cal.predict_step_s(d, [p]) for p in pts])
    assert np.allclose(cal.predict_step_s(d, uniq)[inv], one_by_one)


def test_profiles_and_validate_tables(tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    cases = {"reserve.toml": ("[efficiency]\nbandwidth = 0.8\n[memory]\nreserve_bytes = inf\n",
                              "reserve_bytes"),
             "table.toml": ("profile = 5\n[efficiency]\nbandwidth = 0.8\n", "[profile]"),
             "inf.toml": ("[efficiency]\nbandwidth = inf\n", "bandwidth")}
    for name, (text, needle) in cases.items():
        p = tmp_path / name
        p.write_text(text)
        assert main(["plan", "--profile", str(p)]) == 2
        assert needle in _err(capsys)
    p = tmp_path / "bytes.toml"
    p.write_bytes(b"\xff\xfe[efficiency]\n")
    assert main(["plan", "--profile", str(p)]) == 2
    assert "UTF-8" in _err(capsys)
