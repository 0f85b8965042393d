"""`bstar search`: candidate rules, pruning against brute force, bisection against a dense
sweep, the cost arithmetic, the JSON contract and the report."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bstar import roofline as rl
from bstar.cli import main
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.search import (
    InProcess,
    Memory,
    SearchSpec,
    SearchStore,
    Traffic,
    parse_prices,
    plan_candidates,
    prune,
    run_search,
    tp_sizes,
    tp_split_error,
)
from bstar.search.candidates import Replica, sim_config
from bstar.search.evaluate import Task, evaluate, failures
from bstar.search.spec import at_rate
from bstar.sim import Lengths, parse_lengths, parse_slo, simulate, summarize
from bstar.sim.capacity import capacity_req_s, saturated_workload
from bstar.specs.gpu import get_gpu
from bstar.specs.model import ModelSpec
from bstar.specs.presets import get_model

EXAMPLE_PRICES = Path(__file__).resolve().parents[1] / "examples" / "gpu-prices-example.toml"


def _model(**kw: int) -> ModelSpec:
    base = dict(name="m", model_type="llama", hidden_size=1024, num_layers=2, num_heads=16,
                num_kv_heads=4, head_dim=64, vocab_size=1000, intermediate_size=4096)
    base.update(kw)
    return ModelSpec(**base)  # type: ignore[arg-type]


# ---- tensor parallel splits (vLLM's rules) -------------------------------------------------
def test_tp_sizes_follow_vllm_head_rules() -> None:
    m8 = get_model("llama-3-8b")  # 32 heads, 8 KV heads
    assert tp_sizes(m8, 8) == [1, 2, 4, 8]
    assert tp_sizes(m8, 6) == [1, 2]  # 3 and 6 do not divide 32 heads
    # 4 KV heads, tp 8: vLLM replicates KV heads (8 % 4 == 0) -> allowed.
    assert tp_split_error(_model(num_heads=16, num_kv_heads=4), 8) is None
    # 6 KV heads, tp 4: neither divides the other.
    err = tp_split_error(_model(num_heads=24, num_kv_heads=6, intermediate_size=4800), 4)
    assert err is not None and "KV heads" in err
    err = tp_split_error(_model(intermediate_size=4098), 4)
    assert err is not None and "MLP width" in err
    moe = get_model("qwen3-30b-a3b")  # 32 heads, 4 KV heads, expert width 768
    assert tp_sizes(moe, 8) == [1, 2, 4, 8]


# ---- prices --------------------------------------------------------------------------------
def test_example_price_file_is_dated_with_sources() -> None:
    p = parse_prices(EXAMPLE_PRICES.read_text(), str(EXAMPLE_PRICES))
    assert p.as_of and p.currency == "USD"
    assert {"a100-80gb-sxm", "h100-sxm", "h200", "l40s"} <= set(p.gpus)
    assert all(x.source.startswith("https://") for x in p.gpus.values())
    assert "NOT current" in EXAMPLE_PRICES.read_text()


@pytest.mark.parametrize("text,msg", [
    ("[gpus.h100-sxm]\nper_gpu_hour = 2.0\n", "as_of"),
    ("as_of = '2026-01-01'\n", "no .gpus"),
    ("as_of = '2026-01-01'\n[gpus.h100-sxm]\nper_gpu_hour = -1\n", "positive"),
    ("as_of = '2026-01-01'\n[gpus.h100-sxm]\nsource = 'x'\n", "per_gpu_hour"),
])
def test_bad_price_files(text: str, msg: str) -> None:
    with pytest.raises(BstarError, match=msg):
        parse_prices(text)


# ---- pruning vs brute force ----------------------------------------------------------------
@pytest.mark.slow  # simulates every candidate
def test_pruning_never_drops_a_configuration_that_meets_the_slo() -> None:
    """On a small grid (2 models x 2 GPUs x tp 1,2 x 2 limits), every pruned replica is
    simulated anyway at rates from almost idle up to its capacity: none meets the SLO
    (or the simulator refuses it, for memory), while unpruned ones do meet it somewhere."""
    slo = parse_slo("ttft:400,tpot:13")
    traffic = Traffic(5.0, parse_lengths("uniform:64:1536"), parse_lengths("uniform:16:96"),
                      num_requests=40, seed=3, draws=1)
    spec = SearchSpec(("llama-3-8b", "llama-3-70b"), ("a100-80gb-sxm", "l40s"), traffic, slo,
                      num_gpus=(1, 2), max_num_seqs=(8, 64), max_num_batched_tokens=(512,))
    cands, pruned, _w, unit = plan_candidates(spec)
    replicas = {c.replica.key: c.replica for c in cands}
    limits = {p.limit for p in pruned.values()}
    assert {"memory", "SLO"} <= limits, limits  # the grid exercises both kinds
    met_unpruned = 0
    for key, r in replicas.items():
        cfg = sim_config(r)
        try:
            cap = capacity_req_s(simulate(r.deployment, cfg, saturated_workload(
                unit, r.max_num_seqs)))
        except BstarError:
            assert key in pruned and pruned[key].limit == "memory"
            continue
        rates = cap * np.geomspace(1e-3, 0.9, 8)
        meets = any(not failures(summarize(simulate(r.deployment, cfg, at_rate(unit, x)), slo),
                                 slo) for x in rates)
        if key in pruned:
            assert not meets, f"{key} was pruned ({pruned[key].reason}) but meets the SLO"
        elif meets:
            met_unpruned += 1
    assert met_unpruned >= 2


def test_slo_bound_prunes_slow_gpu_and_keeps_fast_one() -> None:
    w = Traffic(1.0, Lengths.fixed(128), Lengths.fixed(32), num_requests=10).unit_workload()
    slo = parse_slo("ttft:5000,tpot:15")
    m = get_model("llama-3-8b")
    for gpu, pruned in (("l40s", True), ("h100-sxm", False)):
        d = Deployment(m, get_gpu(gpu))
        p = prune(Replica("llama-3-8b", gpu, 1, 16, 2048, d), w, slo)
        assert (p is not None and p.limit == "SLO") == pruned, (gpu, p)


# ---- bisection vs a dense sweep ------------------------------------------------------------
@pytest.mark.slow  # a dense sweep of simulations
def test_bisection_within_5_percent_of_a_dense_sweep() -> None:
    d = Deployment(get_model("llama-3-8b"), get_gpu("a100-80gb-sxm"))
    slo = parse_slo("ttft:800,tpot:25")
    traffic = Traffic(10.0, parse_lengths("uniform:128:512"), parse_lengths("uniform:32:160"),
                      num_requests=160, seed=1, draws=1)
    r = Replica("llama-3-8b", "a100-80gb-sxm", 1, 256, 2048, d)
    task = Task(r, traffic, slo, 0.02)
    res = evaluate(task)
    assert res["status"] == "ok" and res["limit"] == "SLO", res  # a latency-bound case
    found = res["rate_per_replica_req_s"]
    roof = task.max_utilization * res["capacity"]["capacity_req_s"]
    unit = traffic.unit_workload()
    cfg = sim_config(r)
    grid = np.linspace(roof / 80, roof, 80)  # 1.25% of the roof apart
    ok = [not failures(summarize(simulate(d, cfg, at_rate(unit, x)), slo), slo) for x in grid]
    # The dense sweep's answer: the largest rate below which every grid rate meets the SLO.
    first_fail = next(i for i, v in enumerate(ok) if not v)
    dense = grid[first_fail - 1]
    assert abs(found / dense - 1) <= 0.05, (found, dense)


# ---- cost arithmetic and ranking -----------------------------------------------------------
def _small_spec(**kw: object) -> SearchSpec:
    base = dict(models=("llama-3-8b",), gpus=("h100-sxm", "l40s"),
                traffic=Traffic(12.0, parse_lengths("uniform:64:512"),
                                parse_lengths("uniform:32:128"), num_requests=120),
                slo=parse_slo("ttft:1000,tpot:40"), num_gpus=(1, 2), max_num_seqs=(32, 128))
    base.update(kw)
    return SearchSpec(**base)  # type: ignore[arg-type]


@pytest.mark.slow  # a whole search
def test_replicas_gpus_and_cost_follow_from_the_rate(tmp_path: Path) -> None:
    prices = parse_prices(EXAMPLE_PRICES.read_text())
    with InProcess() as b:
        res = run_search(_small_spec(), b, SearchStore(tmp_path / "s.db"), prices)
    ok = [r for r in res.rows if r["status"] == "ok"]
    assert ok
    demand = 12.0
    for r in ok:
        per_inst = r["data_parallel"] * r["rate_per_replica_req_s"]
        assert r["instances"] == max(1, math.ceil(demand / per_inst - 1e-9))
        assert r["gpus_total"] == r["instances"] * r["num_gpus"]
        mtok_h = demand * res.mean_output_tokens * 3600 / 1e6
        assert r["cost_per_mtok"] == pytest.approx(
            r["gpus_total"] * prices.gpus[r["gpu"]].per_gpu_hour / mtok_h)
    costs = [r["cost_per_mtok"] for r in ok]
    assert costs == sorted(costs) and [r["rank"] for r in ok] == list(range(1, len(ok) + 1))
    assert any(r["pareto_cost"] for r in ok) and any(r["pareto_throughput"] for r in ok)
    w = res.winners["llama-3-8b"]
    assert w["replica_key"] == ok[0]["replica_key"] and "--max-num-seqs" in w["flags"]["vllm"]


def test_default_grid_is_around_knee_and_b_mem() -> None:
    spec = _small_spec(max_num_seqs=(), num_gpus=(1,), gpus=("a100-80gb-sxm",))
    cands, _pruned, _w, unit = plan_candidates(spec)
    d = cands[0].replica.deployment
    from bstar.search.candidates import typical_context

    bm = rl.b_mem(d, typical_context(unit))
    seqs = sorted({c.replica.max_num_seqs for c in cands})
    assert seqs and max(seqs) <= bm and math.floor(0.85 * bm) in seqs and len(seqs) >= 2


def test_spec_refuses_a_tpot_only_slo() -> None:
    with pytest.raises(BstarError, match="ttft"):
        _small_spec(slo=parse_slo("tpot:40"))


# ---- CLI -----------------------------------------------------------------------------------
SMALL = ["search", "--model", "llama-3-8b", "--gpu", "h100-sxm,l40s", "--num-gpus", "1,2",
         "--rate", "12", "--input-len", "uniform:64:512", "--output-len", "uniform:32:128",
         "--num-requests", "120", "--slo", "ttft_p99_ms=1000,tpot_p99_ms=40",
         "--max-num-seqs", "32,128"]


@pytest.mark.slow  # a whole search
def test_cli_json_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--db", str(tmp_path / "s.db"), "--price", str(EXAMPLE_PRICES),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"search_id", "db", "backend", "models", "demand_req_s", "slo", "traffic", "prices",
            "ranked_by", "counts", "winners", "candidates", "timing"} <= set(out)
    assert out["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 40.0}
    assert out["ranked_by"] == "cost_per_mtok"
    row = out["candidates"][0]
    assert {"rank", "model", "gpu", "num_gpus", "tensor_parallel", "data_parallel",
            "max_num_seqs", "max_num_batched_tokens", "status", "limit", "reason",
            "rate_per_replica_req_s", "instances", "gpus_total", "tok_s_per_gpu",
            "ttft_p99_ms", "tpot_p99_ms", "cost_per_mtok", "terms", "calibrated",
            "pareto_cost", "pareto_throughput"} <= set(row)
    assert row["rank"] == 1 and row["limit"] in ("SLO", "memory", "compute")
    assert out["winners"]["llama-3-8b"]["flags"]["vllm"].startswith("vllm serve")
    assert all(r["terms"] == "defaults" for r in out["candidates"])


@pytest.mark.slow  # a whole search
def test_cli_table_names_binding_limit_and_flags(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--db", str(tmp_path / "s.db")]) == 0
    out = capsys.readouterr().out
    assert "binding" in out and "vllm serve" in out and "ranked by GPUs" in out


@pytest.mark.parametrize("argv,msg", [
    (["--rate", "5"], "give the SLO"),
    (["--rate", "5", "--slo", "tpot:50"], "ttft"),
    (["--slo", "ttft:500"], "demand"),
    (["--rate", "5", "--slo", "ttft:500", "--price", "/nonexistent.toml"], "price file"),
    (["--rate", "5", "--slo", "ttft:500", "--ray", "--jobs", "1", "--model", "nope"], "nope"),
])
def test_cli_errors_are_one_line(argv: list[str], msg: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", "--db", str(tmp_path / "s.db"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("bstar: error:") and msg in err


@pytest.mark.slow  # a whole search
def test_calibrated_rows_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = tmp_path / "h100.toml"
    prof.write_text('[profile]\ngpu = "h100-sxm"\nengine = "vllm"\n\n[efficiency]\n'
                    "bandwidth = 0.8\ncompute = 0.55\noverhead_s = 0.0008\n"
                    "overhead_per_seq_s = 4e-06\nallreduce_latency_s = 8e-06\n")
    assert main([*SMALL, "--db", str(tmp_path / "s.db"), "--profile", str(prof),
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["candidates"]
    assert {r["terms"] for r in rows if r["gpu"] == "h100-sxm"} == {"calibrated"}
    assert {r["calibrated"] for r in rows if r["gpu"] == "h100-sxm"} == {str(prof)}
    assert {r["terms"] for r in rows if r["gpu"] == "l40s"} == {"defaults"}


@pytest.mark.slow  # a whole search, twice
def test_report_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    pytest.importorskip("jinja2")
    html, svg = tmp_path / "s.html", tmp_path / "s.svg"
    args = [*SMALL[1:], "--db", str(tmp_path / "s.db"), "--price", str(EXAMPLE_PRICES)]
    assert main(["report", "search", *args, "-o", str(html), "--plot", str(svg)]) == 0
    text = html.read_text()
    assert "cheapest deployment" in text and "<svg" in text and "Pareto" in text
    assert "vllm serve" in text and svg.read_text().startswith("<")
    capsys.readouterr()
    # The report reused nothing it was not asked to: a second run with --resume reuses all.
    assert main(["search", *args, "--resume", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["timing"]["evaluations_run"] == 0
    assert out["timing"]["evaluations_reused"] == out["counts"]["evaluations"]


def test_memory_settings_change_the_answer(tmp_path: Path) -> None:
    """--gpu-util enters the deployment: a smaller pool prunes more (nothing is cached
    across different questions)."""
    spec = _small_spec()
    tight = replace(spec, memory=Memory(gpu_util=0.3))
    _c1, p1, _w1, _u1 = plan_candidates(spec)
    _c2, p2, _w2, _u2 = plan_candidates(tight)
    assert len(p2) > len(p1) and spec.search_id() != tight.search_id()


def test_trace_gives_lengths_pattern_and_default_demand(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    trace = tmp_path / "t.csv"
    rng = np.random.default_rng(0)
    t = np.cumsum(rng.exponential(0.25, 200))  # 4 req/s on average, Poisson
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(
        f"{a:.4f},{64 + i % 300},{16 + i % 50}" for i, a in enumerate(t)) + "\n")
    assert main(["search", "--trace", str(trace), "--gpu", "h100-sxm", "--num-gpus", "1",
                 "--slo", "ttft:800,tpot:30", "--max-num-seqs", "64",
                 "--db", str(tmp_path / "s.db"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["demand_req_s"] == pytest.approx(199 / (t[-1] - t[0]))
    assert out["traffic"]["trace"]["num_requests"] == 200
    assert out["traffic"]["num_requests"] == 200
    assert out["mean_output_tokens"] == pytest.approx(np.mean([16 + i % 50 for i in range(200)]))
    assert out["counts"]["feasible"] == 1


# ---- the search's demand and profiles, in the library (issue 41: the command held them) ----
def test_demand_from_a_trace_is_its_mean_arrival_rate(tmp_path: Path) -> None:
    from bstar.search.spec import DEFAULT_NUM_REQUESTS, demand_and_requests
    from bstar.sim.traffic import read_trace_file

    f = tmp_path / "t.csv"
    f.write_text("arrival_s,prompt_tokens,output_tokens\n0,10,5\n1,10,5\n2,10,5\n4,10,5\n")
    trace = read_trace_file(str(f))
    # 4 arrivals over 4 s: 3 gaps, 0.75 requests/s; every request of the trace by default.
    assert demand_and_requests(None, trace, None) == (0.75, 4)
    assert demand_and_requests(2.0, trace, 3) == (2.0, 3)  # given: as given
    assert demand_and_requests(2.0, None, None) == (2.0, DEFAULT_NUM_REQUESTS)
    with pytest.raises(BstarError, match="give the demand"):
        demand_and_requests(None, None, None)
    f.write_text("arrival_s,prompt_tokens,output_tokens\n1,10,5\n1,10,5\n")
    with pytest.raises(BstarError, match="spans no time"):
        demand_and_requests(None, read_trace_file(str(f)), None)
    with pytest.raises(BstarError, match="is a folder"):
        read_trace_file(str(tmp_path))  # a folder: one line naming it (through safeio)
    f.write_text("not,a,trace\n")
    with pytest.raises(BstarError, match=f"--trace {f}: "):
        read_trace_file(str(f))  # a parse error names the file too


def test_profiles_parse_gpu_equals_file() -> None:
    from bstar.search.spec import parse_profiles

    assert parse_profiles(["H100-SXM = a.toml", "b.toml"]) == (("h100-sxm", "a.toml"),
                                                               ("", "b.toml"))
    assert parse_profiles([]) == ()
