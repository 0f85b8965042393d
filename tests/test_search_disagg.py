"""`bstar search` with disaggregated candidates (issue 38): P:D ratios and each side's layout
beside the aggregated candidates, the crossover between the two layouts as the demand grows,
the JSON each candidate carries, and the simulator the units run on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bstar.cli import main
from bstar.disaggregate import DisaggregatedDeployment, WorkerSpec, plan_disaggregated
from bstar.errors import BstarError
from bstar.options import DeploymentOptions
from bstar.search import InProcess, SearchSpec, SearchStore, Traffic, run_search
from bstar.search.disagg import _ratios
from bstar.sim import parse_slo
from bstar.sim.disagg import PoolSpec, simulate_disaggregated, simulate_pools

# The stored inputs of the crossover: DeepSeek-V3 on H200, 4,096-token prompts and 512-token
# outputs, SLO TTFT 2 s / TPOT 50 ms (p99). Aggregated, every step that carries a prefill
# chunk of up to 8,192 tokens stretches every running sequence's TPOT, so a replica is held
# well below its capacity by the TPOT target; disaggregated, the decode workers never carry
# a prefill, and a unit runs near its capacity, but it needs at least 3 workers of 8 GPUs.
CROSSOVER = ["--model", "deepseek-v3", "--gpu", "h200", "--num-gpus", "8",
             "--input-len", "4096", "--output-len", "512", "--slo", "ttft:2000,tpot:50",
             "--max-num-seqs", "512", "--draws", "1", "--rel-tol", "0.1"]


def _spec(argv: list[str]) -> SearchSpec:
    """The spec `bstar search ARGV` runs (the engine profile's terms, as the CLI's)."""
    import argparse

    from bstar.commands.search import add_search_arguments, spec_from_args

    p = argparse.ArgumentParser()
    add_search_arguments(p)
    return spec_from_args(p.parse_args(argv))


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory) -> dict[float, dict]:
    """The search at the two demands, run once for this module's tests."""
    tmp = tmp_path_factory.mktemp("disagg-search")
    return {rate: _search(tmp, rate) for rate in (2.0, 60.0)}


def _search(tmp_path: Path, rate: float) -> dict:
    spec = _spec([*CROSSOVER, "--rate", f"{rate:g}"])
    assert spec.layouts == "both"  # the default for a mixture of experts
    store = SearchStore(tmp_path / f"s{rate:g}.db")
    try:
        with InProcess() as backend:
            return run_search(spec, backend, store).to_dict()
    finally:
        store.close()


def test_crossover_aggregated_at_low_demand_disaggregated_at_high(
        searched: dict[float, dict]) -> None:
    low, high = searched[2.0], searched[60.0]
    # The per-unit answers do not depend on the demand (same draws, rescaled): only the
    # counts do, which is what moves the winner.
    assert low["layouts"]["deepseek-v3"]["winner"] == "aggregated"
    assert high["layouts"]["deepseek-v3"]["winner"] == "disaggregated"
    for s in (low, high):
        lay = s["layouts"]["deepseek-v3"]
        agg, dis = lay["aggregated"], lay["disaggregated"]
        # the why: the aggregated replica is held by its TPOT target below its capacity;
        # the disaggregated unit by a side's throughput, at more output per GPU
        assert agg["limit"] == "SLO" and "tpot" in agg["reason"]
        assert dis["limit"] == "compute" and "side" in dis["reason"]
        assert dis["tok_s_per_gpu"] > agg["tok_s_per_gpu"]
        assert lay["runner_up"] is not None and lay["runner_up"]["rank"] == 2
        assert "GPUs" in lay["why"]
    lo_agg = low["layouts"]["deepseek-v3"]["aggregated"]
    lo_dis = low["layouts"]["deepseek-v3"]["disaggregated"]
    assert lo_agg["gpus_total"] < lo_dis["gpus_total"]  # one 8-GPU server against a unit
    hi_agg = high["layouts"]["deepseek-v3"]["aggregated"]
    hi_dis = high["layouts"]["deepseek-v3"]["disaggregated"]
    assert hi_dis["gpus_total"] < hi_agg["gpus_total"]
    # the replica counts follow from the rates: ceil(demand / rate per unit)
    for s, rate in ((low, 2.0), (high, 60.0)):
        for r in s["candidates"]:
            if r["status"] == "ok":
                per = r["rate_per_replica_req_s"] * r["data_parallel"]
                assert r["instances"] == max(1, math.ceil(rate / per * (1 - 1e-9)))
                assert r["gpus_total"] == r["instances"] * r["num_gpus"]


def test_every_candidate_carries_its_layout_and_sides(searched: dict[float, dict]) -> None:
    s = searched[60.0]
    layouts = {r["layout"] for r in s["candidates"]}
    assert layouts == {"aggregated", "disaggregated"}
    for r in s["candidates"]:
        if r["layout"] != "disaggregated":
            assert "prefill" not in r and "decode" not in r
            continue
        for side in ("prefill", "decode"):
            assert {"workers", "tp", "ep", "dp", "max_num_seqs"} <= set(r[side])
        p, d = r["prefill"], r["decode"]
        assert r["pd_ratio"] == f"{p['workers']}P:{d['workers']}D"
        assert r["num_gpus"] == p["workers"] * p["tp"] + d["workers"] * d["tp"]
        assert d["batch"] <= d["max_num_seqs"] <= 512  # the cap given, at most B_mem
        if r["status"] == "ok":
            assert r["data_parallel"] == 1
            assert r["tok_s_per_gpu"] == pytest.approx(
                r["rate_per_replica_req_s"] * 512 / r["num_gpus"])
    w = s["winners"]["deepseek-v3"]
    assert w["layout"] == "disaggregated"
    assert "--disaggregation-mode prefill" in w["flags"]["prefill"]["sglang"]
    assert "--disaggregation-mode decode" in w["flags"]["decode"]["sglang"]
    assert "--max-running-requests 512" in w["flags"]["decode"]["sglang"]
    assert "NixlConnector" in w["flags"]["decode"]["vllm"]
    json.dumps(s)  # the whole object is JSON


def test_wide_aggregated_flags_name_expert_parallel_and_dp_attention(
        searched: dict[float, dict]) -> None:
    s = searched[2.0]
    w = s["winners"]["deepseek-v3"]
    assert w["layout"] == "aggregated"
    assert (w["expert_parallel"], w["attention_dp"]) == (8, 8)  # the wide layout wins
    assert "--enable-dp-attention --dp-size 8 --ep-size 8" in w["flags"]["sglang"]
    assert "--data-parallel-size 8 --enable-expert-parallel" in w["flags"]["vllm"]
    assert "--tensor-parallel-size" not in w["flags"]["vllm"]  # attention TP 1


def test_ratios_are_the_nearest_to_the_balance() -> None:
    assert _ratios(1.0)[0] == (1, 1)
    assert _ratios(2.1)[0] == (2, 1)
    assert _ratios(0.34)[0] == (1, 3)
    for bal in (0.1, 0.7, 1.6, 9.0):
        got = _ratios(bal)
        assert len(got) == 3 and all(math.gcd(p, q) == 1 for p, q in got)
        dist = [abs(math.log(p / q / bal)) for p, q in got]
        assert dist == sorted(dist)


def test_layouts_aggregated_keeps_the_old_search() -> None:
    """--layouts aggregated: no unit, and the spec hashes as a search before layouts did."""
    base = SearchSpec(models=("deepseek-v3",), gpus=("h200",), traffic=Traffic(2.0),
                      slo=parse_slo("ttft:2000"))
    assert base.layouts == "aggregated" and "layouts" not in base.to_dict()
    both = _spec([*CROSSOVER, "--rate", "2"])
    agg = _spec([*CROSSOVER, "--rate", "2", "--layouts", "aggregated"])
    assert both.search_id() != agg.search_id() and "layouts" not in agg.to_dict()
    from bstar.search import plan_candidates

    assert {c.replica.layout for c in plan_candidates(agg)[0]} == {"aggregated"}
    assert {c.replica.layout for c in plan_candidates(both)[0]} == {"aggregated",
                                                                   "disaggregated"}
    with pytest.raises(BstarError, match="--layouts"):
        SearchSpec(models=("deepseek-v3",), gpus=("h200",), traffic=Traffic(2.0),
                   slo=parse_slo("ttft:2000"), layouts="split")


@pytest.mark.parametrize("argv,layouts", [([], "both"), (["--layouts", "aggregated"],
                                                          "aggregated")])
def test_cli_layouts_default_is_both_for_a_mixture_of_experts(
        argv: list[str], layouts: str) -> None:
    assert _spec(["--model", "deepseek-v3", "--rate", "2", "--slo", "ttft:2000",
                  *argv]).layouts == layouts
    assert _spec(["--model", "llama-3-8b", "--rate", "2",
                  "--slo", "ttft:2000"]).layouts == "aggregated"


def test_cli_text_names_winner_runner_up_and_each_sides_flags(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["search", *CROSSOVER, "--rate", "60", "--db", str(tmp_path / "s.db")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "layouts: disaggregated wins; runner-up: #2" in out
    assert "prefill x " in out and "decode x 1" in out and "--disaggregation-mode" in out
    assert "bound by its prefill side" in out or "bound by its decode side" in out


def test_simulate_pools_is_the_drawn_simulation() -> None:
    """The search's entry (given requests and arrival times) and `bstar simulate`'s (drawn
    lengths and Poisson arrivals) run the same loop: the same draw gives the same times."""
    dd = DisaggregatedDeployment(DeploymentOptions(model="deepseek-v3", gpu="h200"),
                                 WorkerSpec(workers=1, tp=8), WorkerSpec(workers=1, tp=8))
    plan = plan_disaggregated(dd, 1024, 64)
    pre = PoolSpec(plan.prefill_d, 1, 1 << 20, plan.prefill.budget_tokens)
    dec = PoolSpec(plan.decode_d, 1, plan.decode.batch, 0)
    link = plan.transfer.link
    a = simulate_disaggregated(pre, dec, link, num_requests=50, prompt_len=(512, 1536),
                               output_len=(32, 96), rate_req_s=5.0, seed=3)
    rng = np.random.default_rng(3)
    prompts = rng.integers(512, 1537, 50)
    outputs = rng.integers(32, 97, 50)
    from bstar.stats import poisson_gaps_s

    gaps = poisson_gaps_s(5.0, rng, 50)
    b = simulate_pools(pre, dec, link, prompts, outputs,
                       arrival_s=np.concatenate([[0.0], np.cumsum(gaps[:-1])]))
    assert np.array_equal(a.ttft_s, b.ttft_s) and np.array_equal(a.e2e_s, b.e2e_s)
    with pytest.raises(BstarError, match="one of them"):
        simulate_pools(pre, dec, link, prompts, outputs)
    with pytest.raises(BstarError, match="at least 1 token"):
        simulate_pools(pre, dec, link, [0], [5], concurrency=1)


def test_report_page_shows_the_unit_and_each_sides_flags(searched: dict[float, dict],
                                                         tmp_path: Path) -> None:
    pytest.importorskip("jinja2")
    from bstar.report import write_search_report

    page = write_search_report(searched[60.0], tmp_path / "search.html").read_text()
    assert "unit(s) of 2P:1D" in page and "req/s per unit" in page
    assert "prefill, sglang" in page and "decode, vllm" in page
    assert "--disaggregation-mode decode" in page
