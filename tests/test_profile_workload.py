"""`bstar calibrate RUN -o PROFILE` records the traffic the sweep measured (its prefix-cache
hit rate, prompt and output lengths) in the profile's [workload] table; `bstar simulate
--profile PROFILE` simulates it when the user gives no workload of their own."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from bstar import roofline as rl
from bstar.cli import main
from bstar.deployment import Deployment
from bstar.loadgen.client import RequestRecord
from bstar.loadgen.measured import MAX_PROFILE_LENGTHS, _kept_lengths, traffic_from_profile
from bstar.loadgen.store import Store
from bstar.options import DeploymentOptions

PROMPTS = [3000 + 10 * i for i in range(50)]  # mean 3245


def stored_sweep(db: Path, hit_rate: float) -> str:
    """Five concurrency levels whose median ITL is the roofline's step (what calibrate fits),
    each with 10 completed requests (the lengths) and the server's prefix-cache counters."""
    d: Deployment = DeploymentOptions(model="llama-3-8b", gpu="a100-80gb-sxm").build()
    with Store(db) as s:
        rid = s.create_run(url="http://127.0.0.1:1/v1", served_model="m", model="llama-3-8b",
                           gpu="a100-80gb-sxm", options={"input_len": 3245, "output_len": 100},
                           bstar_version="test", run_id="run-hit")
        for lv, b in enumerate((1, 8, 32, 128, 256)):
            lid, _ = s.start_level(rid, lv, concurrency=b, rate=None, max_num_seqs=None)
            prompts = PROMPTS[10 * lv:10 * lv + 10]
            for i, p in enumerate(prompts):
                s.add_request(lid, RequestRecord(index=i, ok=True, start_s=0.0, ttft_s=0.1,
                                                 e2e_s=1.0, prompt_tokens=p,
                                                 output_tokens=100 + lv))
            step_ms = float(rl.decode_step(d, [b], 3295).step_s[0]) * 1e3
            q = sum(prompts)
            s.finish_level(lid, status="completed",
                           stats={"completed": 10, "itl_ms": {"p50": step_ms}},
                           server={"prefix_cache_hit_tokens": int(hit_rate * q),
                                   "prefix_cache_query_tokens": q})
        s.update_run(rid, status="completed")
    return rid


@pytest.mark.slow
def test_calibrate_records_the_workload_and_simulate_uses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, prof = tmp_path / "runs.db", tmp_path / "p.toml"
    stored_sweep(db, 0.9)
    assert main(["calibrate", "run-hit", "--db", str(db), "--model", "llama-3-8b", "--gpu",
                 "a100-80gb-sxm", "--fit", "bandwidth,overhead_s", "-o", str(prof),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    q = sum(PROMPTS)
    hits = sum(int(0.9 * sum(PROMPTS[10 * lv:10 * lv + 10])) for lv in range(5))
    assert out["workload"]["prefix_cache_hit_tokens"] == hits
    assert out["workload"]["prefix_cache_query_tokens"] == q
    tab = tomllib.loads(prof.read_text())["workload"]
    assert tab["run"] == "run-hit" and tab["requests"] == 50
    assert sorted(tab["prompt_tokens"]) == PROMPTS
    assert sorted(set(tab["output_tokens"])) == [100, 101, 102, 103, 104]
    assert tab["prefix_cache_hit_rate"] == pytest.approx(hits / q)
    m = traffic_from_profile(prof)
    assert m is not None and m.shared_prefix_tokens == round(hits / q * 3245)

    args = ["simulate", "--profile", str(prof), "--gpu", "a100-80gb-sxm", "--model",
            "llama-3-8b", "--rate", "2", "--num-requests", "60", "--max-num-seqs", "16"]
    assert main([*args, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["from_run"]["run_id"] == "run-hit"
    assert obj["from_run"]["prefix_cache_hit_rate"] == pytest.approx(hits / q)
    # One shared prefix of 0.9 x the mean prompt: every request but the first hits it.
    assert obj["prefix_cache_hit_rate"] == pytest.approx(0.9, abs=0.03)
    assert main(args) == 0
    assert "prefix-cache hit rate at max_num_seqs 16: measured 90.0%, simulated" in \
        capsys.readouterr().out
    # A workload of the user's own wins: no [workload] traffic, no cache hits to report.
    assert main([*args, "--input-len", "300", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert "from_run" not in obj


def calibrated_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The profile `bstar calibrate -o` writes for a stored sweep with a 90% hit rate."""
    db, prof = tmp_path / "runs.db", tmp_path / "p.toml"
    stored_sweep(db, 0.9)
    assert main(["calibrate", "run-hit", "--db", str(db), "--model", "llama-3-8b", "--gpu",
                 "a100-80gb-sxm", "--fit", "bandwidth,overhead_s", "-o", str(prof)]) == 0
    capsys.readouterr()
    return prof


def test_long_length_lists_keep_their_quantiles() -> None:
    x = tuple(range(1, 10 * MAX_PROFILE_LENGTHS + 1))
    kept = _kept_lengths(x)
    assert len(kept) == MAX_PROFILE_LENGTHS
    assert kept[0] == 1 and kept[-1] == len(x)
    assert kept == sorted(kept)
    assert _kept_lengths((5, 3, 9)) == [5, 3, 9]


def test_a_bad_workload_table_is_one_line_error(tmp_path: Path) -> None:
    from bstar.errors import BstarError

    p = tmp_path / "p.toml"
    p.write_text("[efficiency]\n[workload]\nprompt_tokens = [1, 0]\noutput_tokens = [5]\n")
    with pytest.raises(BstarError, match=r"workload\.prompt_tokens"):
        traffic_from_profile(p)
    p.write_text("[efficiency]\n")
    assert traffic_from_profile(p) is None


def test_search_sizes_for_the_profiles_workload_unless_given_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bstar.cli import build_parser
    from bstar.commands.search import spec_from_args

    prof = calibrated_profile(tmp_path, capsys)
    base = ["search", "--profile", f"a100-80gb-sxm={prof}", "--rate", "5", "--slo",
            "ttft:2000,tpot:100", "--gpu", "a100-80gb-sxm"]
    spec = spec_from_args(build_parser().parse_args(base))
    m = traffic_from_profile(prof)
    assert m is not None
    assert spec.traffic.prompt_shape.shared_prefix_tokens == m.shared_prefix_tokens
    assert "measured prefix-cache hit rate 90.0%" in capsys.readouterr().err
    spec = spec_from_args(build_parser().parse_args([*base, "--input-len", "300"]))
    assert spec.traffic.prompt_shape is None


def test_explicit_default_lengths_beat_the_profiles_workload(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 41: `--input-len 512 --output-len 256` typed out was taken for "not given"
    # (profile_traffic compared with the defaults) and the profile's workload replaced it.
    from bstar.cli import build_parser
    from bstar.commands.search import spec_from_args
    from bstar.commands.simulate import study_options

    prof = calibrated_profile(tmp_path, capsys)
    m = traffic_from_profile(prof)
    assert m is not None and m.lengths(shared=False) != ("512", "256")
    explicit = ["--input-len", "512", "--output-len", "256"]
    sim = ["simulate", "--profile", str(prof), "--rate", "1"]
    o = study_options(build_parser(only="simulate").parse_args([*sim, *explicit]))
    assert (o.input_len, o.output_len, o.prompt_shape) == ("512", "256", None)
    # Not given: the profile's workload, as before.
    o = study_options(build_parser(only="simulate").parse_args(sim))
    assert (o.input_len, o.output_len) != ("512", "256")
    base = ["search", "--profile", f"a100-80gb-sxm={prof}", "--rate", "5", "--slo",
            "ttft:2000,tpot:100", "--gpu", "a100-80gb-sxm"]
    spec = spec_from_args(build_parser(only="search").parse_args([*base, *explicit]))
    assert spec.traffic.prompt_shape is None
    no_profile = [base[0], *base[3:], *explicit]
    assert spec.traffic.input_len.describe() == spec_from_args(build_parser(
        only="search").parse_args(no_profile)).traffic.input_len.describe()
