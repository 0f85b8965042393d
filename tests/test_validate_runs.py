"""Closed-loop runs (bstar.runs_table, bstar.validate_runs): the InferenceMAX table reads
back like for like, a run simulates as bench_serving's closed loop, and the 2026 step terms
(fused-MoE rate and floor, the eager floor) price what they say and nothing else."""

from __future__ import annotations

import csv
import importlib.util
import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bstar import step
from bstar.deployment import Efficiency
from bstar.errors import BstarError
from bstar.options import DeploymentOptions
from bstar.runs_table import COLUMNS, is_runs_table, load_runs, runs_from_csv
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
    assert len(runs) == 131
    assert {r.engine for r in runs} == {"vllm", "sglang", "trt-llm"}
    assert {r.model for r in runs} == {"gpt-oss-120b", "deepseek-v3"}
    for r in runs:
        assert r.arrival == "concurrency" and r.warmup_fraction == 0.0
        assert r.requests_sent == 10 * r.concurrency
        # bench_serving: uniform integers in [int(0.8 L), L]
        assert r.prompt_len[0][1] == int(0.8 * r.prompt_len[-1][1])
        assert r.output_len_min == int(0.8 * r.output_len)
    assert sum(r.dp_attention for r in runs) == 1
    assert {r.first_chunk_tokens for r in runs if r.engine == "sglang"} == {10}
    assert {r.first_chunk_tokens for r in runs if r.engine != "sglang"} == {1}


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
    assert set(out) == set(COLUMNS)
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
