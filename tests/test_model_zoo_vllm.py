"""`bstar kv` against vLLM-on-CPU for tiny random-weight models with sliding-window and
state-space layers (issue 18, item 6): the server's KV pool (vllm:cache_config_info's
num_gpu_blocks and kv_cache_max_concurrency) against bstar's vLLM V1 layout
(`kv_layout`, docs/models.md), which must agree within block rounding.

Each model is served with an exact KV pool (--kv-cache-memory-bytes), a max_model_len and a
max_num_batched_tokens that make a sliding window's share differ from a full layer's. The
hybrid models are written by transformers from a tiny config (random weights); their
tensors' parameter count is checked against bstar's count of the same config too. About a
minute per vLLM start on 2 cores.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bstar import kvcheck
from bstar.deployment import Deployment
from bstar.kv_pool import kv_layout
from bstar.loadgen.kvserver import server_pool
from bstar.loadgen.scrape import parse_prometheus, snapshot
from bstar.report.text import format_kv_check
from bstar.servers import vllm_cpu_command, vllm_cpu_env
from bstar.specs.gpu import load_gpu_file
from bstar.specs.model import from_hf_config, load_config_file

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MAX_LEN = 2048
BATCHED = 256  # max_num_batched_tokens: a 128-token window keeps 127 + 256 tokens

# Tiny hybrids, written by the vLLM install's transformers (random weights, float32).
_WRITE_HYBRID = r'''
import json, shutil, sys, torch
import transformers as tf
kind, out, tok = sys.argv[1:4]
torch.manual_seed(0)
common = dict(vocab_size=259, hidden_size=256, intermediate_size=512, num_attention_heads=4,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
              bos_token_id=257, eos_token_id=258, tie_word_embeddings=False)
if kind == "qwen3_next":
    # a state (128 KiB of recurrent state in float32) larger than a 128-token attention
    # page (128 KiB): the engine grows the block to 256 tokens and pads the state's page
    cfg = tf.Qwen3NextConfig(num_hidden_layers=4, linear_num_key_heads=2,
        linear_num_value_heads=8, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_conv_kernel_dim=4, full_attention_interval=2, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=128,
        shared_expert_intermediate_size=128, **common)
    model = tf.Qwen3NextForCausalLM(cfg)
else:
    cfg = tf.NemotronHConfig(hybrid_override_pattern="M*M-", num_hidden_layers=4,
        mamba_num_heads=8, mamba_head_dim=32, n_groups=2, ssm_state_size=16, conv_kernel=4,
        **common)
    model = tf.NemotronHForCausalLM(cfg)
model.to(torch.float32).save_pretrained(out, safe_serialization=True)
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
          "generation_config.json"):
    shutil.copy(f"{tok}/{f}", f"{out}/{f}")
print(sum(p.numel() for p in model.parameters()))
'''


def _tiny_sliding(tmp_path: Path) -> Path:
    pytest.importorskip("gguf", reason="needs the extra bstar[tiny]")
    from bstar.tinymodel import default_tiny_dir

    model = default_tiny_dir(hidden_size=256, num_layers=4, intermediate_size=688,
                             num_heads=4, num_kv_heads=4, gguf=False)
    out = tmp_path / "tiny-sliding"
    shutil.copytree(model.hf_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg["sliding_window"] = 128
    cfg["layer_types"] = ["sliding_attention", "full_attention"] * 2
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _serve(python: str, model_dir: Path, pool_bytes: int) -> tuple[str, str]:
    """Start vLLM on CPU, read /metrics once it answers, stop it: (metrics, log)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = vllm_cpu_command(python, model_dir, port=port, max_num_seqs=8,
                           max_model_len=MAX_LEN, kv_cache_memory_bytes=pool_bytes)
    cmd += ["--max-num-batched-tokens", str(BATCHED)]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env |= vllm_cpu_env(kv_cache_gib=None)
    log_path = model_dir / "vllm.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 480
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    pytest.fail(f"vLLM exited {proc.returncode}:\n"
                                + log_path.read_text()[-3000:])
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                                timeout=3) as r:
                        text = r.read().decode()
                    if "cache_config_info" in text:
                        return text, log_path.read_text()
                except OSError:
                    pass
                time.sleep(2)
            pytest.fail("vLLM did not answer within 480 s")
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    raise AssertionError("unreachable")


def _cpu_gpu_file(tmp_path: Path) -> Path:
    gpu = tmp_path / "cpu.toml"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    gpu.write_text(f'[cpu]\nname = "this CPU"\nmemory_bytes = {mem}\n'
                   'hbm_bandwidth_bytes_s = 10e9\nbf16_flops = 50e9\nprovenance = "measured"\n')
    return gpu


def _check(tmp_path: Path, python: str, model_dir: Path, pool_blocks: int) -> dict[str, Any]:
    """Serve `model_dir` with a pool of `pool_blocks` of bstar's blocks and compare."""
    cfg = load_config_file(model_dir)
    # vLLM-on-CPU runs float32: the weights, the KV cache and the states (a hybrid's
    # recurrent state is float32 on CPU whatever the config says).
    spec = replace(from_hf_config(cfg, name=model_dir.name), state_bits=(32, 32))
    d = Deployment(model=spec, gpu=load_gpu_file(_cpu_gpu_file(tmp_path)),
                      weight_dtype="fp32", kv_dtype="fp32", block_size=128, reserve_bytes=0)
    layout = kv_layout(d, MAX_LEN, BATCHED)
    pool = pool_blocks * layout.bytes_per_block
    metrics, log = _serve(python, model_dir, pool)
    snap = snapshot(parse_prometheus(metrics))
    check = kvcheck.check_kv(d, server_pool(snap), MAX_LEN, max_num_batched_tokens=BATCHED)
    info = next(s.labels for s in parse_prometheus(metrics)
                if s.name == "vllm:cache_config_info")
    server_concurrency = float(info["kv_cache_max_concurrency"])
    ours = check.computed_blocks / layout.blocks_per_seq
    print(format_kv_check(check))
    print(f"{model_dir.name}: server concurrency {server_concurrency:.4f}, bstar {ours:.4f}; "
          f"block {check.block_size}, {layout.kinds}")
    assert check.computed_pool_source == "explicit"
    assert check.block_size == layout.block_size
    # within block rounding: the same whole blocks, the same sequences
    assert abs(check.computed_blocks - check.measured_blocks) <= 1, check
    assert abs(ours - server_concurrency) <= 1 / layout.blocks_per_seq, (ours, info)
    assert check.computed_b_mem == math.floor(server_concurrency + 1e-9)
    assert "Maximum concurrency" in log
    return {"check": check, "layout": layout, "server": server_concurrency, "log": log}


def test_sliding_window_pool_agrees_with_vllm_cpu(vllm_python: str, tmp_path: Path) -> None:
    r = _check(tmp_path, vllm_python, _tiny_sliding(tmp_path), pool_blocks=100)
    kinds = {k.kind: k for k in r["layout"].kinds}
    # the window's share is 127 + 256 tokens, not the full 2,048
    assert kinds["sliding"].tokens_per_seq == 128 - 1 + BATCHED
    assert kinds["sliding"].blocks_per_seq < kinds["full"].blocks_per_seq


@pytest.mark.parametrize("kind", ["qwen3_next", "nemotron_h"])
def test_hybrid_state_pool_agrees_with_vllm_cpu(vllm_python: str, tmp_path: Path,
                                                kind: str) -> None:
    tok = _tiny_sliding(tmp_path)
    out = tmp_path / f"tiny-{kind}"
    proc = subprocess.run([vllm_python, "-c", _WRITE_HYBRID, kind, str(out), str(tok)],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode:
        pytest.skip(f"transformers could not write a tiny {kind}: {proc.stderr[-500:]}")
    written = int(proc.stdout.split()[-1])
    spec = from_hf_config(load_config_file(out), name=kind)
    assert spec.num_params == written  # bstar's tensors are the checkpoint's
    r = _check(tmp_path, vllm_python, out, pool_blocks=40)
    assert any(k.kind == "state" for k in r["layout"].kinds)
    if kind == "qwen3_next":  # the attention block grew until its page holds the state
        assert r["layout"].block_size == 256 == r["check"].block_size
