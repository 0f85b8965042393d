"""Closed-loop runs (bstar.runs_table, bstar.validate_runs): the InferenceMAX table reads
back like for like, a run simulates as bench_serving's closed loop, and the 2026 step terms
(fused-MoE rate and floor, the eager floor) price what they say and nothing else."""

from __future__ import annotations

import csv
import importlib.util
import io
import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bstar import step
from bstar.deployment import Efficiency
from bstar.errors import BstarError
from bstar.options import DeploymentOptions
from bstar.runs_table import COLUMNS, REQUIRED, is_runs_table, load_runs, runs_from_csv
from bstar.validate_runs import score_runs
from bstar.validate_stages import simulate_stage, stage_workload
from bstar.validate_stages.simulate import first_chunk_s

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "data" / "inferencemax" / "runs.csv"


def _bench(name: str):  # a bench/ script as a module
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_shipped_table_reads_as_closed_loops() -> None:
    runs = load_runs(TABLE)
    assert len(runs) == 131 + 71 + 61  # H200, B200, MI300X (data/inferencemax/README.md)
    assert {r.gpu for r in runs} == {"h200", "b200", "mi300x"}
    assert {r.engine for r in runs} == {"vllm", "sglang", "trt-llm"}
    assert {r.model for r in runs} == {"gpt-oss-120b", "deepseek-v3"}
    assert len({r.stage for r in runs}) == len(runs)
    for r in runs:
        assert r.arrival == "concurrency" and r.warmup_fraction == 0.0
        assert r.requests_sent == 10 * r.concurrency
        # bench_serving: uniform integers in [int(0.8 L), L]
        assert r.prompt_len[0][1] == int(0.8 * r.prompt_len[-1][1])
        assert r.output_len_min == int(0.8 * r.output_len)
    assert sum(r.dp_attention for r in runs) == 1
    # SGLang streams in chunks of its --stream-interval (10 on H200, 30 on B200, the
    # default 1 on MI300X: each GPU's script), but sends the first token at once
    sg = {g: {r.stream_interval for r in runs if r.engine == "sglang" and r.gpu == g}
          for g in ("h200", "b200", "mi300x")}
    assert sg == {"h200": {10}, "b200": {30}, "mi300x": {0}}
    assert {r.first_chunk_tokens for r in runs} == {1}
    # each GPU's flags, read like for like
    by = {(r.gpu, r.engine): r for r in runs}
    assert by["b200", "sglang"].kv_cache_dtype == "fp8_e4m3"
    assert by["mi300x", "vllm"].block_size == 64
    assert by["mi300x", "vllm"].memory_fraction == 0.95
    assert by["mi300x", "sglang"].decode_steps_per_schedule == 4
    # B200's SGLang script: --scheduler-recv-interval 10 below 16 users, else 30
    recv = {(r.concurrency < 16, r.scheduler_recv_interval) for r in runs
            if (r.gpu, r.engine) == ("b200", "sglang")}
    assert recv == {(True, 10), (False, 30)}
    assert {r.scheduler_recv_interval for r in runs
            if (r.gpu, r.engine) != ("b200", "sglang")} == {1}
    assert by["b200", "vllm"].cuda_graph_mode == "full_and_piecewise"
    assert by["h200", "vllm"].cuda_graph_max_tokens == 2048


def test_converter_writes_the_stated_ranges_and_flags() -> None:
    mod = _bench("to_inferencemax")
    row = {"file": "official_data/agg_gptoss_8k1k.json", "model": "openai/gpt-oss-120b",
           "hw": "h200", "framework": "vllm", "precision": "fp4", "tp": "2", "ep": "1",
           "dp_attention": "false", "conc": "16", "isl": "8192", "osl": "1024",
           "tput_per_gpu": "1000", "output_tput_per_gpu": "100", "mean_ttft": "0.4",
           "median_ttft": "0.3", "p99_ttft": "1", "mean_tpot": "0.01", "median_tpot": "0.01",
           "p99_tpot": "0.02", "mean_itl": "0.01", "mean_e2el": "10", "median_e2el": "10",
           "p99_e2el": "12"}
    out = mod.run_row(row)
    assert set(REQUIRED) <= set(out) <= set(COLUMNS)
    assert (out["prompt_len_min"], out["prompt_len_max"]) == (6553, 8192)
    assert (out["output_len_min"], out["output_len_max"]) == (819, 1024)
    assert (out["max_num_seqs"], out["max_num_batched_tokens"]) == (16, 8192)
    assert out["num_prompts"] == 160 and out["ttft_mean_ms"] == 400.0
    assert out["model"] == "gpt-oss-120b" and "7a9f000" in out["source"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(COLUMNS))
    w.writeheader()
    w.writerow(out)
    (run,) = runs_from_csv(buf.getvalue())
    assert run.output_tok_s == 200.0  # per GPU x TP


def test_reader_refuses_an_inverted_range() -> None:
    text = TABLE.read_text().splitlines()
    header, row = text[0], text[1].split(",")
    cols = header.split(",")
    row[cols.index("output_len_min")] = "5000"
    with pytest.raises(BstarError, match="output_len_min"):
        runs_from_csv(header + "\n" + ",".join(row))
    assert is_runs_table(cols)


def test_workload_draws_uniform_outputs_and_starts_every_user_at_zero() -> None:
    run = load_runs(TABLE)[0]
    w = stage_workload(run, 2000, seed=1)
    out = np.asarray(w.output_tokens)
    assert out.min() >= run.output_len_min and out.max() <= run.output_len
    assert abs(out.mean() - (run.output_len_min + run.output_len) / 2) < 5
    inp = np.asarray(w.prompt_tokens)
    assert inp.min() >= run.prompt_len[0][1] and inp.max() <= run.prompt_len[-1][1]
    assert w.arrival_s is None and w.num_users == run.concurrency  # a closed loop


def test_first_chunk_waits_for_its_tokens() -> None:
    first = np.array([1.0, 1.0])
    finish = np.array([11.0, 1.5])
    out = np.array([11, 2])
    # 1 s per token after the first: the 10th token is 9 s later; a 2-token request ends.
    assert np.allclose(first_chunk_s(first, finish, out, 10), [10.0, 1.5])
    assert np.allclose(first_chunk_s(first, finish, out, 1), first)


def test_a_run_scores_all_four_figures() -> None:
    runs = [r for r in load_runs(TABLE) if r.engine == "vllm" and r.concurrency == 4][:2]
    v = score_runs(runs, lomo=False).to_dict()
    assert v["kind"] == "runs" and v["settings"]["warmup_fraction"] == 0.0
    g = v["groups"][0]
    for way in ("generic", "profile"):
        assert set(g["summary"][way]) >= {"tpot_mean_ms", "ttft_mean_ms", "e2e_mean_ms",
                                          "output_tok_s_per_gpu"}
    p = g["stages"][0]["predicted"]["profile"]
    assert p["scored"] == p["requests"] == 40  # nothing left out as warm-up


def _deployment(model: str, n: int = 1):
    return DeploymentOptions(model=model, gpu="h200", num_gpus=n).build()


def test_moe_terms_price_only_moe_layers() -> None:
    base = Efficiency()
    moe = replace(base, moe_layer_s=10e-6, moe_compute=0.5)
    d = _deployment("gpt-oss-120b")
    s = step.shape(d)
    w = s.decode(np.array([4.0]), 1000)
    extra = step.price(w, replace(base, moe_layer_s=10e-6)) - step.price(w, base)
    assert np.allclose(extra, 36 * 10e-6)
    # the fused-MoE rate slows a prefill's expert GEMMs, never a dense model's step
    pre = s.prefill(8000)
    assert step.price(pre, moe)[0] > step.price(pre, replace(moe, moe_compute=1.0))[0]
    dense = step.shape(_deployment("llama-3-8b"))
    for wd in (dense.decode(np.array([4.0]), 1000), dense.prefill(8000)):
        assert np.allclose(step.price(wd, moe), step.price(wd, base))


def test_eager_floor_only_past_the_captured_graphs() -> None:
    base = Efficiency()
    eager = replace(base, eager_layer_s=1e-3, graph_max_tokens=512)
    s = step.shape(_deployment("llama-3-8b"))
    small = s.decode(np.array([64.0]), 1000)
    assert np.allclose(step.price(small, eager), step.price(small, base))
    big = s.prefill(600)  # 600 tokens > 512: at least 32 layers x 1 ms
    assert step.price(big, eager)[0] >= 32e-3 - 1e-12
    assert step.price(big, base)[0] < 32e-3


def test_prompt_token_time_is_not_divided_by_tensor_parallel() -> None:
    """prompt_token_s adds the same time per prompt token at every TP size (the part of a
    prefill that tensor parallelism does not divide), and nothing to a decode step."""
    term = replace(Efficiency(), prompt_token_s=10e-6)
    for n in (1, 2, 8):
        s = step.shape(_deployment("gpt-oss-120b", n))
        pre = s.prefill(8000)
        extra = step.price(pre, term) - step.price(pre, Efficiency())
        assert np.allclose(extra, 8000 * 10e-6)
        dec = s.decode(np.array([64.0]), 8000)
        assert np.allclose(step.price(dec, term), step.price(dec, Efficiency()))


def test_one_run_simulates_fast_and_deterministically() -> None:
    run = next(r for r in load_runs(TABLE) if r.engine == "sglang")
    a, b = simulate_stage(run), simulate_stage(run)
    assert a == b and a.requests == 10 * run.concurrency


# ---- every run read like for like (issue 37): dtypes, KV cache, memory, graphs ----------------

def _one_run(**cells: str) -> str:
    """A one-row runs table: the shipped table's first H200 gpt-oss run on vLLM with `cells`
    set (vLLM's reading of memory_fraction: TensorRT-LLM's is of the free memory)."""
    rows = list(csv.DictReader(io.StringIO(TABLE.read_text())))
    row = next(r for r in rows if r["gpu"] == "h200" and r["model"] == "gpt-oss-120b"
               and r["engine"] == "vllm")
    row.update(cells)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(row))
    w.writeheader()
    w.writerow(row)
    return buf.getvalue()


def _run_deployment(**cells: str):
    from bstar.validate_stages import stage_deployment

    (run,) = runs_from_csv(_one_run(**cells))
    return stage_deployment(run)


def test_nvfp4_runs_are_priced_with_nvfp4_weights() -> None:
    """A run of an NVFP4 checkpoint is simulated with NVFP4 weights, not the model's FP8
    default (the 4 x B200 DeepSeek-R1 runs got FP8's B_mem: 18 sequences at 2k tokens)."""
    from bstar.roofline import b_mem, weight_bytes
    from bstar.specs.presets import get_model

    nv = _run_deployment(model="deepseek-v3", dtype="nvfp4", gpu="b200", num_gpus="4")
    fp8 = _run_deployment(model="deepseek-v3", dtype="fp8", gpu="b200", num_gpus="4")
    assert nv.weight.name == "nvfp4" and fp8.weight.name == "fp8-block"
    assert weight_bytes(nv) < 0.6 * weight_bytes(fp8)
    assert b_mem(nv, 2048) > 10 * b_mem(fp8, 2048)
    # `fp4` names the checkpoint's own FP4 format: NVIDIA's NVFP4 DeepSeek-R1, gpt-oss's MXFP4
    own = _run_deployment(model="nvidia/DeepSeek-R1-0528-FP4-v2", dtype="fp4", gpu="b200",
                      num_gpus="4")
    assert own.weight.name == "nvfp4" == get_model("deepseek-r1-0528-fp4").default_dtype
    assert _run_deployment(dtype="fp4").weight.name == "mxfp4"
    # the engines' spellings are the same formats
    assert _run_deployment(model="deepseek-v3", dtype="modelopt_fp4", gpu="b200",
                       num_gpus="4").weight.name == "nvfp4"


def test_fp8_kv_cache_runs_get_an_fp8_pool() -> None:
    from bstar.roofline import b_mem, kv_bytes_per_token

    fp8 = _run_deployment(model="deepseek-v3", dtype="fp8", gpu="b200",
                          kv_cache_dtype="fp8_e4m3", num_gpus="8")
    auto = _run_deployment(model="deepseek-v3", dtype="fp8", gpu="b200", num_gpus="8")
    assert (fp8.kv_dtype, auto.kv_dtype) == ("fp8", "bf16")
    assert kv_bytes_per_token(fp8) * 2 == kv_bytes_per_token(auto)
    assert b_mem(fp8, 2048) >= 2 * b_mem(auto, 2048) - 1


def test_unknown_or_ambiguous_dtypes_are_refused_with_the_list() -> None:
    with pytest.raises(BstarError, match=r"line 2: dtype: unknown precision 'fp5'.*nvfp4"):
        runs_from_csv(_one_run(dtype="fp5"))  # refused as the table is read
    with pytest.raises(BstarError, match="'fp4' is ambiguous for a fp8-block checkpoint"):
        _run_deployment(model="deepseek-v3", dtype="fp4")
    with pytest.raises(BstarError, match=r"kv_cache_dtype.*unknown precision 'int3'"):
        runs_from_csv(_one_run(kv_cache_dtype="int3"))


def test_memory_fraction_block_size_and_graphs_are_the_runs_own() -> None:
    from bstar.deployment import NO_GRAPHS, Efficiency

    d = _run_deployment(memory_fraction="0.95", block_size="64", cuda_graph_max_tokens="2048")
    assert (d.gpu_util, d.block_size, d.eff.graph_max_tokens) == (0.95, 64, 2048.0)
    blank = _run_deployment(memory_fraction="", block_size="")
    assert blank.gpu_util == DeploymentOptions().gpu_util
    assert blank.block_size == DeploymentOptions().block_size
    assert _run_deployment(cuda_graph_mode="none").eff.graph_max_tokens == NO_GRAPHS
    # a fit's efficiencies keep the run's graph settings
    from bstar.validate_stages import stage_deployment

    (run,) = runs_from_csv(_one_run(cuda_graph_max_tokens="1024"))
    assert stage_deployment(run, eff=Efficiency()).eff.graph_max_tokens == 1024.0
    for bad in ({"memory_fraction": "1.5"}, {"cuda_graph_mode": "sometimes"},
                {"decode_steps_per_schedule": "0"}, {"scheduler_recv_interval": "0"},
                {"num_gpus": "1e300"}):
        with pytest.raises(BstarError):
            runs_from_csv(_one_run(**bad))


def test_stream_interval_leaves_the_first_token_and_decode_steps_reach_the_scheduler() -> None:
    # SGLang sends a request's first token at once whatever its stream interval
    # (sgl-project/sglang@004ec01 scheduler_output_processor_mixin.stream_output_generation:
    # len(output_ids) % interval == 1); a table states a first chunk that waits
    (run,) = runs_from_csv(_one_run(stream_interval="30", first_chunk_tokens=""))
    assert (run.first_chunk_tokens, run.stream_interval) == (1, 30)
    (run,) = runs_from_csv(_one_run(stream_interval="30", first_chunk_tokens="7"))
    assert run.first_chunk_tokens == 7
    # four decode steps a round delay admissions: the closed loop's mean TTFT grows
    (one,) = runs_from_csv(_one_run(concurrency="8", num_prompts="16"))
    (four,) = runs_from_csv(_one_run(concurrency="8", num_prompts="16",
                                     decode_steps_per_schedule="4"))
    a, b = simulate_stage(one), simulate_stage(four)
    assert b.ttft_mean_ms > a.ttft_mean_ms
    # so does SGLang's receive interval (B200's script: 30 from 16 users), and more of it
    # delays them more
    (ten,) = runs_from_csv(_one_run(concurrency="8", num_prompts="16",
                                    scheduler_recv_interval="10"))
    (thirty,) = runs_from_csv(_one_run(concurrency="8", num_prompts="16",
                                       scheduler_recv_interval="30"))
    c, d = simulate_stage(ten), simulate_stage(thirty)
    assert a.ttft_mean_ms < c.ttft_mean_ms < d.ttft_mean_ms


@pytest.mark.parametrize("fraction", ["0.85", ""])
def test_a_trt_llm_runs_memory_fraction_is_of_the_memory_left_free(fraction: str) -> None:
    """TensorRT-LLM's free_gpu_memory_fraction (blank: its default 0.9) sizes the KV pool as a
    share of the memory the weights and runtime leave, not of the whole GPU as vLLM's
    --gpu-memory-utilization does: a run of gpt-oss-120b on one H200 with 0.85 was given a
    pool of 0.85 x 141 GB - weights - reserve, about 15% less than the engine's."""
    from bstar.roofline import kv_pool_bytes, weight_bytes_per_gpu

    d = _run_deployment(engine="trt-llm", gpu="h200", memory_fraction=fraction)
    f = float(fraction or 0.9)
    free = d.gpu.memory_bytes - weight_bytes_per_gpu(d) - d.reserve_bytes
    assert kv_pool_bytes(d) == pytest.approx(f * free, abs=2)
    # vLLM's fraction of the same number is of the whole GPU.
    v = _run_deployment(engine="vllm", gpu="h200", memory_fraction=fraction)
    assert kv_pool_bytes(v) == math.floor(v.gpu.memory_bytes * f) \
        - weight_bytes_per_gpu(v) - v.reserve_bytes


def test_a_runs_table_is_read_through_safeio(tmp_path: Path) -> None:
    # docs/architecture.md: every reader of a user's file goes through bstar.safeio. A FIFO
    # blocked the old reader's open() until a writer came; safeio refuses it at once.
    import os

    fifo = tmp_path / "runs.csv"
    os.mkfifo(fifo)
    with pytest.raises(BstarError, match=r"not a regular file|FIFO|fifo"):
        load_runs(fifo)


# ---- TensorRT-LLM's rows as their scripts set them (issue 38; bstar.sim.adp) -------------
def test_tables_carry_the_scripts_balance_and_limits() -> None:
    runs = load_runs(TABLE)
    (dpa,) = [r for r in runs if r.dp_attention]
    assert (dpa.engine, dpa.attention_dp_timeout_iters,
            dpa.attention_dp_batching_wait_iters) == ("trt-llm", 60, 0)
    assert {r.attention_dp_timeout_iters for r in runs if not r.dp_attention} == {0}
    # dsr1_fp8_h200_trt_slurm.sh: --max_num_tokens (CONC + ISL + 64) rounded up to 64 a
    # rank, trtllm-serve's default max_batch_size, an FP8 KV cache; gpt-oss's script:
    # --max_batch_size CONC, --max_num_tokens 20000
    ds = [r for r in runs if r.engine == "trt-llm" and r.model == "deepseek-v3"]
    for r in ds:
        ranks = r.data_parallel
        per_rank = (r.concurrency + int(r.prompt_len[-1][1]) + 127) // 64 * 64
        assert r.max_num_batched_tokens == per_rank * ranks
        assert r.max_num_seqs == 2048 * ranks and r.kv_cache_dtype == "fp8"
    oss = [r for r in runs if r.engine == "trt-llm" and r.model == "gpt-oss-120b"]
    assert {(r.max_num_batched_tokens, r.stream_interval) for r in oss} == {(20000, 20)}
    assert all(r.max_num_seqs == r.concurrency for r in oss)
    ix = load_runs(ROOT / "data" / "inferencex-h200" / "runs.csv")
    assert {(r.engine, r.attention_dp_timeout_iters) for r in ix if r.dp_attention} \
        == {("trt-llm", 60)}
    # the converters write what the tables hold
    row = _bench("to_inferencex")._settings("trt", True)
    assert row["attention_dp_timeout_iters"] == 60
    assert "attention_dp_timeout_iters" in COLUMNS


def test_a_runs_table_refuses_a_negative_timeout() -> None:
    text = TABLE.read_text()
    rows = list(csv.DictReader(io.StringIO(text)))
    rows[0]["attention_dp_timeout_iters"] = "-3"
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerow(rows[0])
    with pytest.raises(BstarError, match="attention_dp_timeout_iters"):
        runs_from_csv(buf.getvalue())


def test_the_measured_attention_dp_run_waits_as_the_gate_says() -> None:
    """InferenceMAX's TensorRT-LLM run of DeepSeek-R1 with attention DP (8k prompts, 64
    users) measured a median TTFT of 3.6 s; without the balance's gate bstar puts it at
    0.35 s (3.0 s with it, `bstar validate data/inferencemax/runs.csv`)."""
    (run,) = [r for r in load_runs(TABLE) if r.dp_attention]
    gated = simulate_stage(run)
    free = simulate_stage(replace(run, attention_dp_timeout_iters=0))
    measured = run.ttft_p50_ms
    assert measured is not None
    assert free.ttft_p50_ms < 0.2 * measured
    assert 0.5 * measured < gated.ttft_p50_ms < 2 * measured


def test_a_warmed_up_run_starts_from_an_idle_warm_server() -> None:
    """InferenceX's client sends 2 x CONC warm-up requests and waits for them before the run
    (benchmark_serving gathers them): the run's requests start all at once on an idle server
    that has paid any cold start. Only they are simulated, every one scored; a run without a
    warm-up starts cold."""
    from bstar.deployment import EngineBehaviour

    cold = EngineBehaviour(cold_start_s=2.0)
    (plain,) = runs_from_csv(_one_run(concurrency="4", num_prompts="40"))
    (warm,) = runs_from_csv(_one_run(concurrency="4", num_prompts="40", warmup_prompts="8"))
    assert (plain.warmed_up, warm.warmed_up) == (False, True)
    assert plain.requests_sent == warm.requests_sent == 40
    a, b = simulate_stage(plain, behaviour=cold), simulate_stage(warm, behaviour=cold)
    assert a.requests == a.scored == b.requests == b.scored == 40
    # the cold run's first wave (4 of 40) waits 2 s more: 0.2 s on the mean
    assert 0.15 < (a.ttft_mean_ms - b.ttft_mean_ms) / 1e3 < 0.25
    # the warm run's first wave is a burst of 4 prompts prefilled together: slower than the
    # steady loop's single prompts, so its mean is above its median
    assert b.ttft_mean_ms > b.ttft_p50_ms


def test_inferencex_runs_are_warm_from_the_day_the_client_warmed_up() -> None:
    """The warm-up came with InferenceX@d053ae24e (2026-01-21): runs dated after it are
    warmed up, older ones started cold; the converter and the shipped table agree."""
    runs = load_runs(ROOT / "data" / "inferencex-h200" / "runs.csv")
    assert all(r.requests_sent == 10 * r.concurrency for r in runs)
    dates = {r.stage: re.search(r"\d{4}-\d\d-\d\d", r.source).group() for r in runs}
    assert all(r.warmed_up == (dates[r.stage] >= "2026-01-22") for r in runs)
    warm = {(e, sum(r.warmed_up for r in runs if r.engine == e)) for e in ("sglang", "trt-llm")}
    assert warm == {("sglang", 15), ("trt-llm", 6)}
    conv = _bench("to_inferencex")
    row = {"framework": "trt", "conc": "4", "isl": "1024", "osl": "1024", "prefill_tp": "8",
           "prefill_ep": "1", "prefill_dp_attention": "False", "spec_method": "none",
           "image": "", "precision": "fp8", "run_url": "u", "m_output_tput_per_gpu": "1",
           "m_tput_per_gpu": "2"}
    row |= {f"m_{s}_{m}": "0.1" for s in ("mean", "median", "p99")
            for m in ("ttft", "tpot", "itl", "e2el")}
    for date, warmup in (("2026-01-14", ""), ("2026-03-25", 8)):
        assert conv.run_row({**row, "date": date})["warmup_prompts"] == warmup


def test_inferencex_kinds_are_read_from_the_run_names() -> None:
    mod = _bench("inferencex_subsets")

    def stage(run: str, tpot: float) -> dict:
        return {"stage": run, "predicted": {"profile": {"errors": {
            "tpot_mean_ms": tpot, "ttft_mean_ms": -tpot}}}}

    v = {"groups": [{"stages": [stage("h200-deepseek-v3-sglang-tp8-ep1-1k1k-c4", 0.1),
                                stage("h200-deepseek-v3-trt-llm-tp8-ep8-dpa-mtp-1k1k-c256", -0.3),
                                stage("h200-deepseek-v3-trt-llm-tp8-ep8-1k1k-c8", 0.2)]}]}
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in
            mod.table(v).splitlines()[2:]}
    assert rows["without MTP"] == ["2", "15.0%", "15.0%", "- |"]
    assert rows["with EP 8 or attention DP"][:2] == ["2", "25.0%"]
    assert rows["MTP (acceptance: the other MTP runs')"][:2] == ["1", "30.0%"]
    assert rows["all"][:2] == ["3", "20.0%"]
