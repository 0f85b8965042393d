"""The disaggregated deployment: the KV transfer's price, the P:D balance, TTFT's parts,
the plan command and the disaggregated runs table and its converter."""

from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bstar.disagg_load import md1_wait_s, operating_point
from bstar.disagg_runs import COLUMNS, disagg_runs_from_csv, score_disagg_runs, summary
from bstar.disaggregate import DisaggregatedDeployment, WorkerSpec, plan_disaggregated
from bstar.errors import BstarError
from bstar.kv_link import default_link_kind, kv_link, kv_transfer
from bstar.options import DeploymentOptions
from bstar.specs.gpu import get_gpu
from bstar.specs.precision import get_precision
from bstar.specs.presets import get_model

ROOT = Path(__file__).resolve().parents[1]
DSR1 = DeploymentOptions(model="deepseek-r1", gpu="h200", engine="sglang", kv_dtype="fp8")


# ---- the transfer -----------------------------------------------------------------------------
def test_transfer_is_latency_plus_one_gpus_bytes_over_its_link() -> None:
    m, fp8 = get_model("deepseek-r1"), get_precision("fp8")
    link = kv_link("ib-ndr", get_gpu("h200"))
    t = kv_transfer(m, fp8, 8192, 8, link)
    # MLA: 61 layers x (512 latent + 64 rope) values x 1 byte a token, not split by TP.
    assert t.kv_bytes == 8192 * 61 * 576
    assert t.bytes_per_gpu == t.kv_bytes
    assert link.bytes_s == 400e9 / 8
    assert t.transfer_s == pytest.approx(link.latency_s + t.kv_bytes / 50e9)


def test_a_gqa_models_kv_splits_over_the_decode_attention_shard() -> None:
    m, bf16 = get_model("llama-3-70b"), get_precision("bf16")
    link = kv_link("nvlink", get_gpu("h200"))
    one = kv_transfer(m, bf16, 4096, 1, link)
    eight = kv_transfer(m, bf16, 4096, 8, link)
    assert one.kv_bytes == 4096 * 80 * 2 * 8 * 128 * 2  # layers x K,V x 8 heads x 128 x 2 B
    assert eight.bytes_per_gpu == one.kv_bytes // 8
    # NVLink from the GPU catalog: 900 GB/s both ways, 450 one way
    assert link.bytes_s == pytest.approx(450e9)
    assert eight.transfer_s < one.transfer_s


def test_links_by_topology_and_refusals() -> None:
    h200, gb200 = get_gpu("h200"), get_gpu("gb200")
    assert default_link_kind(h200, 8) == "nvlink"
    assert default_link_kind(h200, 16) == "ib-ndr"
    assert default_link_kind(gb200, 64) == "nvl72"
    with pytest.raises(BstarError, match="NVL72"):
        kv_link("nvl72", h200)
    with pytest.raises(BstarError, match="unknown KV link"):
        kv_link("carrier-pigeon", h200)


# ---- the sides and their balance --------------------------------------------------------------
def _plan(p: int, d: int, **kw: object) -> object:
    dd = DisaggregatedDeployment(DSR1, WorkerSpec(p, 8), WorkerSpec(d, 8, max_num_seqs=64))
    return plan_disaggregated(dd, 8192, 1024, **kw)  # type: ignore[arg-type]


def test_the_ratio_balances_prefill_and_decode_rates() -> None:
    plan = _plan(1, 2)
    pre, dec = plan.prefill, plan.decode  # type: ignore[attr-defined]
    # mu_p: prompts a step / step time; mu_d: batch / (output x TPOT at that batch)
    assert pre.req_s == pytest.approx(pre.prompts_per_step / pre.step_s)
    assert dec.req_s == pytest.approx(dec.batch / (1024 * dec.tpot_s))
    r = plan.ratio  # type: ignore[attr-defined]
    assert r == pytest.approx(dec.req_s / pre.req_s)
    # At the balanced worker counts the two sides pass the same requests/s.
    assert 1 * pre.req_s == pytest.approx(1 / r * dec.req_s)
    d = plan.to_dict()  # type: ignore[attr-defined]
    assert d["ratio"]["balanced_prefill_workers"] == math.ceil(2 * r)
    # Twice the decode workers want twice the prefill workers (the ratio does not move).
    assert _plan(1, 4).ratio == pytest.approx(r)  # type: ignore[attr-defined]


def test_a_longer_prompt_wants_more_prefill_per_decode_worker() -> None:
    dd = DisaggregatedDeployment(DSR1, WorkerSpec(1, 8), WorkerSpec(1, 8, max_num_seqs=64))
    short = plan_disaggregated(dd, 1024, 1024)
    long = plan_disaggregated(dd, 8192, 1024)
    assert long.ratio > short.ratio


def test_prefill_budget_packs_whole_prompts_and_chunks_long_ones() -> None:
    dd = DisaggregatedDeployment(DSR1, WorkerSpec(1, 8, max_num_batched_tokens=8192),
                                 WorkerSpec(1, 8, max_num_seqs=8))
    assert plan_disaggregated(dd, 1024, 64).prefill.prompts_per_step == 8
    p = plan_disaggregated(dd, 20000, 64).prefill
    assert (p.prompts_per_step, p.chunks_per_prompt) == (1, 3)


# ---- TTFT -------------------------------------------------------------------------------------
def test_ttft_is_the_sum_of_its_parts() -> None:
    plan = _plan(1, 2, concurrency=16)
    a = plan.at_load  # type: ignore[attr-defined]
    parts = plan.to_dict()["at_load"]["ttft_parts_ms"]  # type: ignore[attr-defined]
    assert a.ttft_s * 1e3 == pytest.approx(sum(parts.values()))
    assert a.transfer_s == plan.transfer.transfer_s  # type: ignore[attr-defined]
    assert a.prefill_s == plan.prefill.alone_s  # type: ignore[attr-defined]
    assert a.first_decode_step_s == a.tpot_s  # the first token comes from a decode step
    assert a.request_overhead_s == pytest.approx(0.1568)  # the sglang profile's
    # Little's law over the loop: N = X x (TTFT + (output - 1) x TPOT)
    assert pytest.approx(a.throughput_req_s * (a.ttft_s + 1023 * a.tpot_s), rel=1e-6) == 16


def test_past_capacity_the_extra_users_wait_in_front_of_the_binding_side() -> None:
    plan = _plan(1, 4, concurrency=2000)
    a = plan.at_load  # type: ignore[attr-defined]
    assert plan.bound == "prefill"  # type: ignore[attr-defined]
    assert a.bound == "prefill" and a.prefill_queue_s > 10 * a.prefill_s
    assert a.throughput_req_s == pytest.approx(plan.capacity_req_s, rel=1e-3)  # type: ignore
    assert pytest.approx(a.throughput_req_s * (a.ttft_s + 1023 * a.tpot_s), rel=1e-6) == 2000


def test_md1_wait() -> None:
    assert md1_wait_s(0.0, 1.0) == 0.0
    assert md1_wait_s(0.5, 2.0) == pytest.approx(1.0)
    assert math.isinf(md1_wait_s(1.0, 1.0))


def test_a_rate_past_capacity_is_refused() -> None:
    with pytest.raises(BstarError, match="capacity"):
        _plan(1, 1, rate_req_s=1000.0)


def test_unloaded_has_no_queue() -> None:
    plan = _plan(1, 1)
    a = plan.at_load  # type: ignore[attr-defined]
    assert a.prefill_queue_s == 0 and a.decode_wait_s == 0
    assert operating_point is not None


def test_worker_spec_checks() -> None:
    with pytest.raises(BstarError, match="divide"):
        WorkerSpec(1, 8, dp=3)
    with pytest.raises(BstarError, match="positive"):
        WorkerSpec(0, 8)
    with pytest.raises(BstarError, match="at most"):
        WorkerSpec(1, 10**30)
    with pytest.raises(BstarError, match="max_num_seqs"):
        WorkerSpec(1, 8, max_num_seqs=True)  # type: ignore[arg-type]
    assert WorkerSpec(2, 8, dp=8).attention_tp == 1


# ---- the command ------------------------------------------------------------------------------
def _bstar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bstar", *args], capture_output=True,
                          text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT / "src"),
                                                    "PATH": "/usr/bin:/bin"})


def test_plan_disaggregate_json_and_the_deployment_file(tmp_path: Path) -> None:
    f = tmp_path / "d.toml"
    f.write_text('model = "deepseek-r1"\ngpu = "h200"\nengine = "sglang"\nkv_dtype = "fp8"\n'
                 '[prefill]\nworkers = 1\ntp = 8\n[decode]\nworkers = 2\ntp = 8\n'
                 'max_num_seqs = 32\n')
    out = _bstar("plan", "--deployment", str(f), "--prompt-tokens", "2048", "--json",
                 "--concurrency", "16", "--decode-workers", "3")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["layout"] == "disaggregated"
    assert (d["prefill"]["workers"], d["decode"]["workers"]) == (1, 3)  # the flag wins
    assert d["decode"]["max_num_seqs"] == 32 and d["transfer"]["link"]["kind"] == "ib-ndr"
    bad = tmp_path / "bad.toml"
    bad.write_text("[prefill]\nworkers = 1\n[decode]\nwrokers = 2\n")
    out = _bstar("plan", "--deployment", str(bad))
    assert out.returncode != 0 and "wrokers" in out.stderr and "Traceback" not in out.stderr


def test_plan_json_without_disaggregate_keeps_its_shape() -> None:
    out = _bstar("plan", "--model", "llama-3-8b", "--context", "2048", "--json")
    d = json.loads(out.stdout)
    assert "layout" not in d and "contexts" in d


# ---- the runs table and its converter ---------------------------------------------------------
SHARED_ROW = {
    "hardware": "h200", "framework": "dynamo-trt", "model": "dsr1", "precision": "fp8",
    "spec_method": "none", "disagg": "True", "is_multinode": "True", "prefill_tp": "8",
    "prefill_ep": "8", "prefill_dp_attention": "True", "prefill_num_workers": "1",
    "decode_tp": "8", "decode_ep": "8", "decode_dp_attention": "False",
    "decode_num_workers": "9", "num_prefill_gpu": "8", "num_decode_gpu": "72", "isl": "1024",
    "osl": "1024", "conc": "72", "image": "img", "date": "2026-03-23", "run_url": "u",
    "m_mean_ttft": "0.8812", "m_median_ttft": "0.2208", "m_mean_tpot": "0.01626",
    "m_median_tpot": "0.0162", "m_mean_e2el": "17.5", "m_output_tput_per_gpu": "56.1",
}


def _conv():  # bench/to_inferencex_disagg.py
    sys.path.insert(0, str(ROOT / "bench"))
    import to_inferencex_disagg as conv

    return conv


def _side(workers: int, dp_attn: bool, ep: int = 8) -> dict:
    return {"num-worker": workers, "tp": 8, "ep": ep, "dp-attn": dp_attn}


def _trt_recipe(decode_workers: int, decode_mbs: int, clients: str, mtp: int = 0) -> dict:
    def side(adp: bool, mbs: int, mnt: int) -> dict:
        return {"tensor_parallel_size": 8, "moe_expert_parallel_size": 8,
                "enable_attention_dp": adp, "max_batch_size": mbs, "max_num_tokens": mnt,
                "kv_cache_config": {"dtype": "fp8"}}

    dec = side(False, decode_mbs, decode_mbs)
    if mtp:
        dec["speculative_config"] = {"decoding_type": "MTP", "num_nextn_predict_layers": mtp}
    return {"resources": {"prefill_workers": 1, "decode_workers": decode_workers},
            "backend": {"trtllm_config": {"prefill": side(True, 8, 8192), "decode": dec}},
            "benchmark": {"concurrencies": clients}}


def _sglang_recipe(draft_tokens: int | None = None) -> dict:
    side = {"tp-size": 8, "dp-size": 1, "ep-size": 1, "max-running-requests": 256,
            "max-prefill-tokens": 163840, "chunked-prefill-size": 32768}
    dec = dict(side, **{"max-running-requests": 64})
    if draft_tokens:
        dec["speculative-num-draft-tokens"] = draft_tokens
    return {"resources": {"prefill_workers": 1, "decode_workers": 9},
            "backend": {"sglang_config": {"prefill": side, "decode": dec}},
            "benchmark": {"concurrencies": "1x16x72"}}


def _checkout(tmp: Path, trt_entries: list, recipes: dict) -> Path:
    """A stand-in for an InferenceX checkout: the master config and the named recipes."""
    import yaml

    conv = _conv()
    sg = [{"spec-decoding": m, "conc-list": [1, 16, 72], "recipe": f"sg-{m}.yaml",
           "prefill": _side(1, False, 1), "decode": _side(9, False, 1)}
          for m in ("none", "mtp")]
    master = {"dsr1-fp8-h200-dynamo-trt": {"seq-len-configs": [
                  {"isl": 1024, "osl": 1024, "search-space": trt_entries}]},
              "dsr1-fp8-h200-dynamo-sglang": {"seq-len-configs": [
                  {"isl": 1024, "osl": 1024, "search-space": sg}]}}
    recipes = {"sg-none.yaml": _sglang_recipe(), "sg-mtp.yaml": _sglang_recipe(3), **recipes}
    (tmp / conv.MASTER).parent.mkdir(parents=True)
    (tmp / conv.MASTER).write_text(yaml.safe_dump(master))
    (tmp / conv.RECIPES).mkdir(parents=True)
    for name, body in recipes.items():
        (tmp / conv.RECIPES / name).write_text(yaml.safe_dump(body))
    return tmp


def _trt_entry(recipe: str, label: int, decode_workers: int = 9, spec: str | None = None
               ) -> dict:
    e = {"conc-list": [label], "recipe": recipe, "prefill": _side(1, True),
         "decode": _side(decode_workers, False)}
    if spec:
        e["spec-decoding"] = spec
    return e


def test_converter_reads_each_run_with_its_recipes_flags(tmp_path: Path) -> None:
    conv = _conv()
    # the master config labels the recipe c8; its client ran 72 users (the recipe's list)
    co = _checkout(tmp_path, [_trt_entry("c8.yaml", 8), _trt_entry("c1.yaml", 1)],
                   {"c8.yaml": _trt_recipe(9, 256, "72"), "c1.yaml": _trt_recipe(9, 1, "11")})
    agg = dict(SHARED_ROW, disagg="False")
    rows = conv.convert([SHARED_ROW, agg, dict(SHARED_ROW, conc="11")], co)
    assert len(rows) == 2
    r, low = rows
    assert (r["prefill_workers"], r["prefill_tp"], r["prefill_ep"], r["prefill_dp"]) \
        == (1, 8, 8, 8)
    # TensorRT-LLM's limits are per attention rank: the prefill worker's 8 ranks hold 8 x
    assert (r["prefill_max_num_seqs"], r["prefill_max_num_batched_tokens"]) == (64, 65536)
    assert (r["decode_workers"], r["decode_dp"], r["decode_max_num_seqs"]) == (9, 1, 256)
    assert low["decode_max_num_seqs"] == 1  # 9 slots for 11 users: the cap binds
    assert r["kv_cache_dtype"] == "fp8" and "c8.yaml" in r["source"]
    assert (r["prompt_len_min"], r["prompt_len_max"], r["num_prompts"]) == (819, 1024, 720)
    assert r["ttft_mean_ms"] == pytest.approx(881.2) and r["tpot_mean_ms"] == 16.26
    assert r["engine"] == "trt-llm" and r["kv_link"] == "ib-ndr"
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS)
    w.writeheader()
    w.writerows(rows)
    run, low_run = disagg_runs_from_csv(buf.getvalue())
    assert run.sides["decode"]["workers"] == 9 and run.prompt_tokens == 922
    assert run.has_dp_or_ep
    # the cap read from the recipe is what makes two of the 11 users wait for a slot
    p = score_disagg_runs([low_run])[0]
    assert p.bound == "decode" and p.predicted_ttft_ms > 1000


def test_converter_reads_sglangs_flags_and_the_mtp_drafts(tmp_path: Path) -> None:
    conv = _conv()
    co = _checkout(tmp_path, [_trt_entry("m.yaml", 16, spec="mtp")],
                   {"m.yaml": _trt_recipe(9, 128, "144", mtp=3)})
    sg = dict(SHARED_ROW, framework="dynamo-sglang", prefill_ep="1", decode_ep="1",
              prefill_dp_attention="False", conc="16")
    rows = conv.convert([sg, dict(sg, spec_method="mtp"),
                         dict(SHARED_ROW, spec_method="mtp", conc="144")], co)
    plain, spec, trt = rows
    assert (plain["prefill_max_num_seqs"], plain["decode_max_num_seqs"]) == (256, 64)
    # the step's budget: the smaller of --max-prefill-tokens and --chunked-prefill-size
    assert plain["prefill_max_num_batched_tokens"] == 32768
    assert plain["kv_cache_dtype"] == "" and "num_speculative_tokens" not in plain
    assert spec["num_speculative_tokens"] == 2  # EAGLE top-k 1: 3 verified = 2 drafts + 1
    assert trt["num_speculative_tokens"] == 3


def test_converter_refuses_a_run_without_exactly_one_recipe(tmp_path: Path) -> None:
    conv = _conv()
    co = _checkout(tmp_path, [_trt_entry("a.yaml", 8), _trt_entry("b.yaml", 8),
                              _trt_entry("w.yaml", 4, decode_workers=9)],
                   {"a.yaml": _trt_recipe(9, 256, "72"), "b.yaml": _trt_recipe(9, 256, "72"),
                    "w.yaml": _trt_recipe(7, 256, "36")})
    with pytest.raises(conv.RecipeError, match="2 recipes match"):
        conv.convert([SHARED_ROW], co)
    with pytest.raises(conv.RecipeError, match="0 recipes match"):
        conv.convert([dict(SHARED_ROW, conc="5")], co)
    with pytest.raises(conv.RecipeError, match="decode_workers 7 in the recipe"):
        conv.convert([dict(SHARED_ROW, conc="36")], co)
    no_dp = _trt_recipe(9, 256, "36")
    no_dp["backend"]["trtllm_config"]["prefill"]["enable_attention_dp"] = False
    with pytest.raises(conv.RecipeError, match=r"prefill TP/EP/DP \(8, 8, 1\) in the recipe"):
        conv.convert([dict(SHARED_ROW, conc="36", decode_num_workers="9")],
                     _checkout(tmp_path / "d", [_trt_entry("d.yaml", 4)], {"d.yaml": no_dp}))
    with pytest.raises(conv.RecipeError, match="has no drafter"):
        conv.convert([dict(SHARED_ROW, conc="36", spec_method="mtp")],
                     _checkout(tmp_path / "m", [_trt_entry("n.yaml", 4, spec="mtp")],
                               {"n.yaml": _trt_recipe(9, 256, "36")}))


def test_the_stored_table_reads_and_scores() -> None:
    text = (ROOT / "data" / "inferencex-h200" / "disagg_runs.csv").read_text()
    runs = disagg_runs_from_csv(text)
    assert len(runs) == 20 and len({r.run for r in runs}) == 20
    scores = score_disagg_runs([r for r in runs if r.concurrency <= 32])
    s = summary(scores)
    assert s["scored"] + s["skipped"] == s["runs"]
    assert s["skipped"] == 0 and s["mtp"]["runs"] == 3  # SGLang's at 1, 8 and 16 users
    for x in scores:
        assert x.predicted_tpot_ms and x.predicted_ttft_ms
        assert (x.acceptance_used is not None) == (x.run.spec_method == "mtp")


def test_table_refusals() -> None:
    head = ",".join(COLUMNS)
    with pytest.raises(BstarError, match="missing column"):
        disagg_runs_from_csv("run,model\nx,y\n")
    row = dict.fromkeys(COLUMNS, "")
    row.update(run="r", model="deepseek-r1", gpu="h200", engine="sglang", prefill_workers="1",
               prefill_tp="8", decode_workers="1", decode_tp="8", concurrency="1",
               num_prompts="10", prompt_len_min="900", prompt_len_max="800",
               output_len_min="1", output_len_max="2", ttft_mean_ms="1", tpot_mean_ms="1",
               source="s")
    with pytest.raises(BstarError, match="above"):
        disagg_runs_from_csv(head + "\n" + ",".join(row[c] for c in COLUMNS) + "\n")


# ---- MTP on the decode side (issue 38 item 3) ---------------------------------------------------
def _mtp_row(**over: str) -> dict[str, str]:
    row = dict.fromkeys(COLUMNS, "")
    row.update(run="r", model="deepseek-r1", gpu="h200", engine="sglang", kv_cache_dtype="fp8",
               spec_method="mtp", num_speculative_tokens="2", prefill_workers="1",
               prefill_tp="8", decode_workers="2", decode_tp="8", kv_link="ib-ndr",
               concurrency="8", num_prompts="80", prompt_len_min="800",
               prompt_len_max="1024", output_len_min="800", output_len_max="1024",
               ttft_mean_ms="300", tpot_mean_ms="10", source="s")
    row.update(over)
    return row


def _table(*rows: dict[str, str]) -> str:
    return "\n".join([",".join(COLUMNS), *(",".join(r[c] for c in COLUMNS) for r in rows)])


def test_a_speculative_decode_side_is_specdecs_step_over_the_tokens_it_yields() -> None:
    from bstar import specdec as sd
    from bstar.disaggregate import side_deployment
    from bstar.specdec import SpecConfig

    dd = DisaggregatedDeployment(DSR1, WorkerSpec(1, 8), WorkerSpec(2, 8, max_num_seqs=64))
    plain = plan_disaggregated(dd, 1024, 1024)
    low = plan_disaggregated(dd, 1024, 1024, speculative=SpecConfig(2, 0.3, "mtp"))
    high = plan_disaggregated(dd, 1024, 1024, speculative=SpecConfig(2, 0.8, "mtp"))
    d, _ = side_deployment(DSR1, dd.decode)
    dr = sd.make_drafter(d, "mtp")
    dec = high.decode
    # The drafter's weights and KV leave the pool; the cap (64) is what runs.
    assert dec.b_mem == sd.b_mem(d, dr, 2048, 2) < plain.decode.b_mem
    assert dec.batch == 64
    want = sd.spec_step_s(d, dr, 64, dec.context_tokens, 2)[0] / sd.expected_tokens(0.8, 2)
    assert dec.tpot_s == pytest.approx(want, rel=1e-12)
    assert high.decode.tpot_s < low.decode.tpot_s  # more accepted drafts, fewer steps a token
    assert dec.to_dict()["speculative"] == {"drafter": "mtp", "num_speculative_tokens": 2,
                                            "acceptance_rate": 0.8,
                                            "tokens_per_step": sd.expected_tokens(0.8, 2)}
    assert plain.decode.to_dict()["speculative"] is None


def test_an_mtp_run_implies_the_acceptance_its_tpot_was_made_at() -> None:
    from bstar.disagg_runs import implied_acceptance, plan_for_run

    (run,) = disagg_runs_from_csv(_table(_mtp_row()))
    made = plan_for_run(run, 0.6).at_load.tpot_s * 1e3
    (run,) = disagg_runs_from_csv(_table(_mtp_row(tpot_mean_ms=f"{made!r}")))
    assert implied_acceptance(run) == pytest.approx(0.6, abs=2e-4)
    # past either end: 0 (slower than no draft accepted) or 1
    (slow,) = disagg_runs_from_csv(_table(_mtp_row(tpot_mean_ms="1000")))
    (fast,) = disagg_runs_from_csv(_table(_mtp_row(tpot_mean_ms="0.01")))
    assert (implied_acceptance(slow), implied_acceptance(fast)) == (0.0, 1.0)


def test_mtp_runs_are_priced_at_the_other_runs_acceptance_leave_one_out() -> None:
    from bstar.disagg_runs import acceptances, plan_for_run

    (base,) = disagg_runs_from_csv(_table(_mtp_row()))
    rows = []
    for i, a in enumerate((0.4, 0.5, 0.7)):
        tpot = plan_for_run(base, a).at_load.tpot_s * 1e3
        rows.append(_mtp_row(run=f"r{i}", tpot_mean_ms=f"{tpot!r}"))
    rows.append(_mtp_row(run="k3", num_speculative_tokens="3"))  # alone at its K
    rows.append(_mtp_row(run="none", spec_method="none", num_speculative_tokens=""))
    runs = disagg_runs_from_csv(_table(*rows))
    acc = acceptances(runs)
    assert set(acc) == {"r0", "r1", "r2", "k3"}
    assert acc["r0"][0] == pytest.approx((0.5 + 0.7) / 2, abs=2e-4)  # the others' median
    assert acc["r2"][0] == pytest.approx((0.4 + 0.5) / 2, abs=2e-4)
    assert acc["r1"][1] == pytest.approx(0.5, abs=2e-4)  # what it implies, beside
    assert acc["k3"][0] is None and "no other sglang MTP run at K 3" in acc["k3"][2]
    scores = {s.run.run: s for s in score_disagg_runs(runs)}
    assert scores["k3"].skipped.startswith("speculative decoding (MTP): no other")
    r0 = scores["r0"]
    assert not r0.skipped and r0.acceptance_used == pytest.approx(0.6, abs=2e-4)
    assert r0.predicted_tpot_ms == pytest.approx(plan_for_run(runs[0], r0.acceptance_used)
                                                 .at_load.tpot_s * 1e3)
    assert r0.to_dict()["acceptance"]["num_speculative_tokens"] == 2
    # the speedup: the plan's plain TPOT over its speculative one; measured against the run
    # of the same layout, lengths and users without MTP ("none" here: tpot 10 ms)
    plain = plan_for_run(runs[0]).at_load.tpot_s * 1e3
    assert r0.predicted_speedup == pytest.approx(plain / r0.predicted_tpot_ms)
    assert r0.twin == "none" and r0.measured_speedup == pytest.approx(
        10.0 / runs[0].tpot_mean_ms)
    assert scores["none"].acceptance_used is None and not scores["none"].skipped
    stated = {s.run.run: s for s in score_disagg_runs(runs, acceptance=0.55)}
    assert stated["k3"].acceptance_used == 0.55 and stated["k3"].acceptance_basis == "stated"
    s = summary(list(scores.values()))
    assert (s["mtp"]["runs"], s["without_mtp"]["runs"]) == (3, 1)


def test_an_mtp_row_needs_its_draft_count() -> None:
    with pytest.raises(BstarError, match="num_speculative_tokens"):
        disagg_runs_from_csv(_table(_mtp_row(num_speculative_tokens="")))


def test_plan_disaggregate_prices_a_speculative_decode_side() -> None:
    base = ["plan", "--disaggregate", "--model", "deepseek-r1", "--gpu", "h200", "--engine",
            "sglang", "--kv-dtype", "fp8", "--prefill-tp", "8", "--decode-tp", "8",
            "--concurrency", "32", "--json"]
    plain = json.loads(_bstar(*base).stdout)
    out = _bstar(*base, "--num-speculative-tokens", "2", "--acceptance-rate", "0.6")
    assert out.returncode == 0, out.stderr
    spec = json.loads(out.stdout)
    assert plain["decode"]["speculative"] is None
    assert spec["decode"]["speculative"]["num_speculative_tokens"] == 2
    assert spec["decode"]["b_mem"] < plain["decode"]["b_mem"]  # the drafter's share
    assert spec["at_load"]["tpot_ms"] < plain["at_load"]["tpot_ms"]
    bad = _bstar(*base, "--num-speculative-tokens", "2", "--drafter", "llama-3-8b")
    assert bad.returncode != 0 and "draft model" in bad.stderr and "Traceback" not in bad.stderr
    sim = _bstar("simulate", "--disaggregate", "--model", "deepseek-r1", "--gpu", "h200",
                 "--engine", "sglang", "--kv-dtype", "fp8", "--prefill-tp", "8",
                 "--decode-tp", "8", "--concurrency", "16", "--num-speculative-tokens", "2",
                 "--acceptance-rate", "0.6", "--json")
    assert sim.returncode == 0, sim.stderr
    d = json.loads(sim.stdout)
    # the simulated decode side draws each step's accepted drafts; its mean TPOT is the
    # plan's (a step over the tokens it yields on average) within the draws' noise
    assert d["decode"]["speculative"]["num_speculative_tokens"] == 2
    assert d["simulation"]["tpot"]["mean_ms"] == pytest.approx(d["at_load"]["tpot_ms"],
                                                               rel=0.03)


def test_a_simulated_speculative_decode_side_gains_its_accepted_drafts() -> None:
    from bstar import specdec as sd
    from bstar.disaggregate import side_deployment
    from bstar.kv_link import kv_link
    from bstar.sim.disagg import PoolSpec, simulate_disaggregated
    from bstar.specdec import SpecConfig

    pd, _ = side_deployment(DSR1, WorkerSpec(1, 8))
    d, _ = side_deployment(DSR1, WorkerSpec(1, 8))
    link = kv_link("ib-ndr", d.gpu)
    dr = sd.make_drafter(d, "mtp")

    def run(spec: SpecConfig | None) -> float:
        res = simulate_disaggregated(PoolSpec(pd, 1, 8, 8192), PoolSpec(d, 1, 8, 0, spec),
                                     link, num_requests=4, prompt_len=(1000, 1000),
                                     output_len=(301, 301), concurrency=1)
        return float(res.tpot_s.mean())

    # One user, every draft accepted: each step yields K + 1 = 3 tokens, so 300 tokens after
    # the first step's 3 take 99 more steps (and the last yields 0 extra: capped at 301).
    all_in = run(SpecConfig(2, 1.0, "mtp"))
    step = sd.scheduled_step_s(d, dr, [1150.0], [1.0], 2)  # one step mid-way through
    assert all_in * 300 == pytest.approx(100 * step, rel=0.02)
    # None accepted: one token a step at the speculative step's price (slower than plain).
    none_in = run(SpecConfig(2, 0.0, "mtp"))
    assert none_in == pytest.approx(step, rel=0.02) and none_in > run(None)


def test_disagg_validate_takes_help_and_refuses_an_unknown_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    import disagg_validate

    assert disagg_validate.main(["--help"]) == 0
    assert "--simulate" in capsys.readouterr().out
    assert disagg_validate.main(["--bogus"]) == 2  # not read as a file name
    assert "unexpected --bogus" in capsys.readouterr().err
