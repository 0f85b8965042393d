"""Regime per level from /metrics, measured vs computed B_mem, the KV check (`bstar kv`),
and the other engines' metric names on recorded or composed fixtures (tests/fixtures/metrics).
Offline and fast; the real regime-3 sweep is tests/test_regime3_e2e.py."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bstar import kvcheck
from bstar import roofline as rl
from bstar.cli import main
from bstar.deployment import Deployment
from bstar.loadgen import regime
from bstar.loadgen.kvserver import server_pool_text
from bstar.loadgen.scrape import parse_prometheus, snapshot
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

FIX = Path(__file__).parent / "fixtures" / "metrics"
VLLM_CPU = FIX / "vllm-0.32.0-cpu.prom"
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 258,
        "max_position_embeddings": 4096, "torch_dtype": "float32",
        "tie_word_embeddings": False}


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(TINY))
    return p


# ---- the engines' metrics -------------------------------------------------------------------
def test_vllm_cpu_fixture_pool() -> None:
    snap = snapshot(parse_prometheus(VLLM_CPU.read_text()))
    assert snap.engine == "vllm"
    assert (snap.num_gpu_blocks, snap.block_size) == (48, 128)
    assert snap.kv_cache_memory_bytes == 50331648 == 48 * 128 * 8192
    assert snap.kv_cache_size_tokens == 6144
    assert snap.preemptions_total == 0
    assert snap.kv_cache_usage == 0


def test_sglang_fixture() -> None:
    snap = snapshot(parse_prometheus((FIX / "sglang.prom").read_text()))
    assert snap.engine == "sglang"
    assert (snap.running, snap.waiting) == (211, 45)
    assert snap.kv_cache_usage == pytest.approx(0.99)
    assert snap.max_total_tokens == 436275
    assert snap.preemptions_total == 17  # the counter, not the per-interval gauge
    assert snap.generation_tokens_total == pytest.approx(7.557572e6)


def test_tgi_fixture() -> None:
    snap = snapshot(parse_prometheus((FIX / "tgi.prom").read_text()))
    assert snap.engine == "tgi"
    assert (snap.running, snap.waiting) == (32, 7)
    assert snap.preemptions_total is None and snap.kv_cache_usage is None


# ---- per-level regime -----------------------------------------------------------------------
def _lv(mns: int | None, pre: int | None, kv: float | None, run: float | None,
        wait: float | None, **server: Any) -> dict[str, Any]:
    return {"max_num_seqs": mns, "concurrency": 64, "requests": 10, "preemptions": pre,
            "kv_cache_usage_max": kv, "running_max": run, "waiting_max": wait,
            "tpot_ms": {"p99": 10.0}, "server": {"engine": "vllm", **server}}


def test_classify_level() -> None:
    assert regime.classify_level(_lv(32, 5, 1.0, 32, 9))["number"] == 3
    # Full pool, queue, fewer running than the cap: regime 3 before any preemption.
    full = regime.classify_level(_lv(64, 0, 0.99, 40, 20))
    assert full["number"] == 3 and "wait for blocks" in full["reason"]
    capped = regime.classify_level(_lv(8, 0, 0.34, 8, 56))
    assert capped["regime"] == "batch-capped" and capped["number"] is None
    fits = regime.classify_level(_lv(8, 0, 0.3, 8, 0), "kv-dominated")
    assert fits["regime"] == "kv-dominated" and fits["number"] == 1
    # No scrape saw the queue or the full cap (a loaded machine's samples missed them): the
    # engine's counters still show the cap running full with more streams open than it.
    counted = regime.classify_level(_lv(8, 0, 0.3, 5, 0, tokens_per_step=7.9), "kv-dominated")
    assert counted["regime"] == "batch-capped" and "7.90 tokens per step" in counted["evidence"]
    short = regime.classify_level(_lv(8, 0, 0.3, 5, 0, tokens_per_step=5.0), "kv-dominated")
    assert short["regime"] == "kv-dominated"  # steps well under the cap: the batch fit
    # llama.cpp: slots are the cap.
    lc = {"concurrency": 8, "requests": 8, "preemptions": None, "kv_cache_usage_max": None,
          "running_max": 4, "waiting_max": 4, "server": {"slots": 4}}
    assert regime.classify_level(lc)["regime"] == "batch-capped"


def test_analyze_names_onset_and_b_mem(tiny_config: Path, tmp_path: Path) -> None:
    gpu = tmp_path / "cpu.toml"
    gpu.write_text('[cpu]\nname = "cpu"\nmemory_bytes = 25000000000\n'
                   'hbm_bandwidth_bytes_s = 1e10\nbf16_flops = 5e10\n')
    srv = {"num_gpu_blocks": 48, "block_size": 128, "kv_cache_memory_bytes": 50331648}
    sweep = {"options": {"input_len": 100, "output_len": 100, "model": str(tiny_config),
                         "gpu": str(gpu), "deployment_args": {"dtype": "fp32",
                                                              "kv_dtype": "fp32"}},
             "levels": [_lv(8, 0, 0.34, 8, 56, **srv), _lv(16, 0, 0.68, 16, 48, **srv),
                        _lv(32, 22, 1.0, 32, 41, **srv), _lv(64, 32, 1.0, 47, 41, **srv)]}
    a = regime.analyze(sweep)
    assert a is not None
    assert a["measured_b_mem"] == 24 and a["computed_b_mem"] == 24
    assert a["preemption_onset"] == 32 and a["regime3_levels"] == [32, 64]
    assert "max_num_seqs 32: regime 3 (memory-exhausted)" in a["verdict"]
    assert "preemptions start at max_num_seqs 32, past the measured B_mem 24" in a["verdict"]
    # A model with twice the KV per token: bstar's B_mem halves, and the check flags it.
    sweep["options"]["deployment_args"]["kv_dtype"] = "bf16"
    b = regime.analyze(sweep)
    assert b is not None and b["computed_b_mem"] == 48 and b["kv_check"]["flagged"]
    assert regime.analyze({"levels": [{"requests": 3, "server": None}]}) is None


def test_compare_simulation() -> None:
    meas = {"levels": [
        {"max_num_seqs": m, "requests": 9, "preemptions": p, "tpot_ms": {"p99": t}}
        for m, p, t in ((8, 0, 10.0), (16, 0, 20.0), (32, 5, 40.0), (64, 9, 50.0))]}
    sim = [{"max_num_seqs": m, "preemptions": p, "tpot_ms": {"p99": t}}
           for m, p, t in ((8, 0, 11.0), (16, 0, 20.0), (32, 0, 30.0), (64, 3, 60.0))]
    c = regime.compare_simulation(meas, sim)
    assert (c["onset"], c["sim_onset"], c["onset_steps_apart"], c["base"]) == (32, 64, 1, 16)
    row = c["levels"][3]
    assert row["growth"] == 2.5 and row["sim_growth"] == 3.0
    assert row["growth_error"] == pytest.approx(0.2)
    assert c["max_abs_growth_error"] == pytest.approx(0.25)  # 32: 1.5 vs 2.0


# ---- the KV check ---------------------------------------------------------------------------
def test_check_kv_gpu_explains_reserve() -> None:
    d = Deployment(get_model("llama-3-8b"), get_gpu("h100-sxm"))
    per_token = d.model.kv_bytes_per_token(d.kv)
    # The server kept 1 GiB more than bstar's 2 GiB reserve: 1 GiB fewer KV bytes.
    blocks = (rl.kv_pool_bytes(d) - 2**30) // (per_token * 16)
    text = (f'vllm:cache_config_info{{block_size="16",num_gpu_blocks="{blocks}"}} 1.0\n'
            "vllm:num_requests_running 0\n")
    c = kvcheck.check_kv(d, server_pool_text(text), 2048 + 512)
    assert c.computed_pool_source == "gpu"
    assert c.measured_b_mem == blocks // 160
    assert c.implied_reserve_bytes is not None
    assert abs(c.implied_reserve_bytes - 3 * 2**30) < per_token * 16
    assert any("--reserve-gib 3.00" in n for n in c.explanation)
    assert 0 < c.rel_diff < 0.10 and not c.flagged


def test_check_kv_flags_over_ten_percent() -> None:
    d = Deployment(get_model("llama-3-8b"), get_gpu("h100-sxm"))
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="10000"} 1.0\n'
    c = kvcheck.check_kv(d, server_pool_text(text), 2048)
    assert c.flagged and any(n.startswith("DISAGREE") for n in c.explanation)


def test_check_kv_log_tokens_without_blocks() -> None:
    d = Deployment(get_model("llama-3-8b"), get_gpu("h100-sxm"))
    with pytest.raises(Exception, match="no KV pool size"):
        kvcheck.check_kv(d, server_pool_text("vllm:num_requests_running 0\n"), 1000)
    c = kvcheck.check_kv(d, server_pool_text("vllm:num_requests_running 0\n"), 1000,
                         log_tokens=160_000)
    assert c.measured_tokens == 160_000 and c.measured_b_mem == 160_000 // 16 // 63


@pytest.fixture
def metrics_url() -> Iterator[str]:
    body = VLLM_CPU.read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/metrics"
            self.send_response(200 if ok else 404)
            self.end_headers()
            if ok:
                self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_kv_command_url_json(metrics_url: str, tiny_config: Path, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    gpu = tmp_path / "cpu.toml"
    gpu.write_text('[cpu]\nname = "cpu"\nmemory_bytes = 25000000000\n'
                   'hbm_bandwidth_bytes_s = 1e10\nbf16_flops = 5e10\n')
    args = ["kv", "--url", metrics_url, "--model", str(tiny_config), "--gpu", str(gpu),
            "--dtype", "fp32", "--input-len", "100", "--output-len", "100"]
    assert main([*args, "--kv-dtype", "fp32", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["measured_b_mem"] == d["computed_b_mem"] == 24
    assert d["computed_pool_source"] == "explicit" and d["flagged"] is False
    assert d["kv_bytes_per_token"] == 8192
    # bf16 KV against a float32 cache: half the bytes a token, twice the B_mem: flagged.
    assert main([*args, "--kv-dtype", "bf16"]) == 1
    out = capsys.readouterr()
    assert "DISAGREE" in out.out and "check the KV precision" in out.out
    assert "differ by more than 10%" in out.err


def test_kv_command_metrics_file(tiny_config: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["kv", "--metrics-file", str(VLLM_CPU), "--model", str(tiny_config),
               "--gpu", "a100-80gb-sxm", "--dtype", "fp32", "--kv-dtype", "fp32",
               "--input-len", "1000", "--output-len", "24"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "server         48.00 MiB        48       6,144       6" in out
    assert "block rounding" in out


def test_kv_command_takes_the_servers_token_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """A sliding-window layer holds window - 1 + max_num_batched_tokens tokens in flight
    (vLLM V1's pool): a smaller budget leaves more sequences room."""
    b_mem = {}
    for budget in ("256", "8192"):
        main(["kv", "--metrics-file", str(VLLM_CPU), "--model", "gemma-3-27b", "--gpu",
              "h100-sxm", "--input-len", "8000", "--output-len", "192", "--kv-pool-bytes",
              str(20 * 2**30), "--max-num-batched-tokens", budget, "--json"])
        b_mem[budget] = json.loads(capsys.readouterr().out)["computed_b_mem"]
    assert b_mem["256"] > b_mem["8192"] > 0
