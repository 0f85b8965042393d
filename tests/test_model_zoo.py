"""The models people serve in 2026 (issue 18): hybrid attention and 4-bit weights, counted
from each bundled config.json or refused by name. Every expected figure is computed here
from the config's own numbers (or is the published size the preset records)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bstar import roofline as rl
from bstar.cli import main
from bstar.deployment import Deployment
from bstar.errors import BstarError
from bstar.kv_pool import default_max_num_batched_tokens, kv_layout, kv_per_kind
from bstar.specs.gpu import get_gpu
from bstar.specs.model import from_hf_config
from bstar.specs.precision import get_precision
from bstar.specs.presets import get_model, model_index

NEW = ["gpt-oss-20b", "gpt-oss-120b", "llama-4-scout", "llama-4-maverick", "gemma-3-27b",
       "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b", "qwen3-235b-a22b", "qwen3-next-80b-a3b",
       "deepseek-v3.2", "nemotron-h-8b"]
BF16 = get_precision("bf16")


def config(pid: str) -> dict[str, Any]:
    root = resources.files("bstar.presets").joinpath("models")
    return dict(json.loads(root.joinpath(f"{pid}.json").read_text()))


def deployment(pid: str, gpu: str = "h200", **kw: Any) -> Deployment:
    return Deployment(model=get_model(pid), gpu=get_gpu(gpu), **kw)


def attention_bytes_per_token(cfg: dict[str, Any]) -> int:
    """K and V of every KV head, bf16, one layer."""
    return 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * 2


# ---- gpt-oss-20b ----------------------------------------------------------------------------
def test_gpt_oss_20b_weights_are_the_mxfp4_checkpoint() -> None:
    d = deployment("gpt-oss-20b")
    w = rl.weight_bytes(d)
    assert d.weight.name == "mxfp4"
    assert abs(w - 13.8e9) <= 0.03 * 13.8e9  # issue 18: "the checkpoint holds about 13.8 GB"
    info = model_index()["gpt-oss-20b"]
    assert abs(w - info.published_checkpoint_bytes) <= 0.02 * info.published_checkpoint_bytes
    # The experts are MXFP4 (4 bits + an 8-bit scale per 32 inputs); attention, router,
    # embeddings and LM head stay bf16 (modules_to_not_convert).
    m = d.model
    expert_params = sum(t.params for t in m.tensors() if t.expert and t.kind == "linear")
    expert_bias = sum(t.params for t in m.tensors() if t.expert and t.kind != "linear")
    rest = m.num_params - expert_params - expert_bias
    assert all(t.cols % 32 == 0 for t in m.tensors() if t.expert and t.kind == "linear")
    assert w == expert_params * (4 + 8 / 32) / 8 + 2 * (expert_bias + rest)


def test_gpt_oss_20b_kv_is_12_full_layers_and_12_windows() -> None:
    cfg = config("gpt-oss-20b")
    ctx = 8192
    per_layer = attention_bytes_per_token(cfg)
    types = cfg["layer_types"]
    assert types.count("full_attention") == 12 and types.count("sliding_attention") == 12
    expected = sum((ctx if t == "full_attention" else min(ctx, cfg["sliding_window"]))
                   * per_layer for t in types)
    d = deployment("gpt-oss-20b")
    assert rl.kv_bytes_per_seq(d, ctx) == expected == 12 * per_layer * (ctx + 128)
    kinds = {k["kind"]: k for k in kv_per_kind(d, ctx)}
    assert kinds["sliding"]["tokens_per_layer"] == 128 and kinds["full"]["layers"] == 12


# ---- Qwen3-Next -------------------------------------------------------------------------------
def qwen3_next_state_bytes(cfg: dict[str, Any]) -> int:
    """One gated delta net layer's state (vLLM's gated_delta_net_state_shape), bf16."""
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    conv = (2 * nk * dk + nv * dv) * (cfg["linear_conv_kernel_dim"] - 1)
    return 2 * (conv + nv * dk * dv)


def test_qwen3_next_kv_is_12_full_layers_plus_a_fixed_state() -> None:
    cfg = config("qwen3-next-80b-a3b")
    n_full = cfg["num_hidden_layers"] // cfg["full_attention_interval"]
    n_linear = cfg["num_hidden_layers"] - n_full
    assert (n_full, n_linear) == (12, 36)
    state = qwen3_next_state_bytes(cfg)
    d = deployment("qwen3-next-80b-a3b")
    for ctx in (8192, 32768):
        expected = n_full * ctx * attention_bytes_per_token(cfg) + n_linear * state
        assert rl.kv_bytes_per_seq(d, ctx) == expected
    # the linear layers' state does not grow with the context
    assert rl.kv_bytes_per_seq(d, 16384) - rl.kv_bytes_per_seq(d, 8192) \
        == n_full * 8192 * attention_bytes_per_token(cfg)


def test_qwen3_next_b_mem_follows_vllm_hybrid_pool() -> None:
    """B_mem at 8k on an H200, from vLLM V1's rules written out here: the attention block
    grows to 16 x cdiv(state, 16 x page per token) tokens so its page holds a state; the
    36 state layers pad their page to it; layers go in KV cache groups of 12 (the fewest
    of a kind), and a sequence takes cdiv(8192, block) blocks of the full group and two of
    each of the three state groups (mamba_cache_mode "align": the running state and the
    last block-aligned one)."""
    cfg = config("qwen3-next-80b-a3b")
    tp = 2  # 159 GB of weights: two H200s; KV heads and states split over both
    d = deployment("qwen3-next-80b-a3b", num_gpus=tp)
    per_token = attention_bytes_per_token(cfg) // tp
    state = qwen3_next_state_bytes(cfg) // tp
    block = 16 * math.ceil(state / (16 * per_token))
    page = block * per_token
    blocks = math.ceil(8192 / block) + 2 * (36 // 12)
    expected = rl.kv_pool_bytes(d) // (blocks * 12 * page)
    assert rl.b_mem(d, 8192) == expected
    assert kv_layout(d, 8192).block_size == block
    # pricing every layer as full attention (before issue 18) gave under 40% of it
    all_full = rl.kv_pool_bytes(d) // (48 * 8192 * per_token)
    assert expected > 2.5 * all_full


def test_nemotron_h_state_in_float32_from_its_config() -> None:
    cfg = config("nemotron-h-8b")
    m = get_model("nemotron-h-8b")
    pattern = cfg["hybrid_override_pattern"]
    inner = cfg["mamba_num_heads"] * cfg["mamba_head_dim"]
    conv = (inner + 2 * cfg["n_groups"] * cfg["ssm_state_size"]) * (cfg["conv_kernel"] - 1)
    ssm = cfg["mamba_num_heads"] * cfg["mamba_head_dim"] * cfg["ssm_state_size"]
    state = 2 * conv + 4 * ssm  # vLLM keeps Nemotron-H's recurrent state in float32
    kv = 2 * cfg["num_key_value_heads"] * cfg["attention_head_dim"] * 2
    assert m.kv_bytes_per_seq(8192, BF16) == pattern.count("*") * 8192 * kv \
        + pattern.count("M") * state


def test_llama4_chunked_layers_hold_the_current_chunk() -> None:
    cfg = config("llama-4-scout")["text_config"]
    m = get_model("llama-4-scout")
    chunk = cfg["attention_chunk_size"]
    kinds = m.kinds()
    assert kinds.count("full") == cfg["num_hidden_layers"] // 4  # NoPE every 4th layer
    g = next(g for g in m.layer_groups() if g.kind == "chunked")
    assert [g.held(t) for t in (1, chunk, chunk + 1, 3 * chunk - 5)] == [1, chunk, 1, chunk - 5]
    arr = np.array([0.0, chunk, chunk + 1.0])
    assert g.read(arr).tolist() == [0.0, chunk, 1.0]


def test_deepseek_v32_dsa_holds_the_indexer_keys_and_reads_top_k() -> None:
    cfg = config("deepseek-v3.2")
    v3, v32 = get_model("deepseek-v3"), get_model("deepseek-v3.2")
    index_bytes = cfg["index_head_dim"] + 4 * cfg["index_head_dim"] // 128  # fp8 + scales
    assert v32.kv_bytes_per_token(BF16) - v3.kv_bytes_per_token(BF16) \
        == cfg["num_hidden_layers"] * index_bytes
    g = v32.layer_groups()[0]
    assert g.kind == "dsa" and g.topk_tokens == cfg["index_topk"]
    assert g.read(1000) == 1000  # under top-k everything is read
    long = 100_000
    latent = cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    assert g.read(long) == pytest.approx(
        (cfg["index_topk"] * latent + long * index_bytes / 2) / (latent + index_bytes / 2))


# ---- weights of every preset -----------------------------------------------------------------
@pytest.mark.parametrize("pid", NEW)
def test_checkpoint_bytes_within_2_percent_of_published(pid: str) -> None:
    """The checkpoint's bytes (W plus any MTP layers it ships) against the published size:
    the one its publisher gives, or the published parameter count at the checkpoint's
    16-bit dtype. DeepSeek-V3.2's FP8 checkpoint has no published byte size."""
    info = model_index()[pid]
    m = get_model(pid)
    if info.published_checkpoint_bytes:
        ref, unit = info.published_checkpoint_bytes, info.published_checkpoint_rounding
    elif m.default_dtype in ("bf16", "fp16"):
        ref, unit = 2 * info.published_params, 2 * info.published_rounding
    else:
        pytest.skip(f"{pid}: no published checkpoint size for {m.default_dtype}")
    assert abs(m.checkpoint_bytes() - ref) <= max(0.02 * ref, unit), (m.checkpoint_bytes(), ref)


def test_deepseek_checkpoint_carries_its_mtp_layer() -> None:
    m = get_model("deepseek-v3.2")
    mtp = sum(t.params for t in m.mtp_tensors())
    # the HF repo is 685B = the 671B model + the MTP module
    assert abs(m.num_params + mtp - 685e9) <= 1e9


# ---- quantization_config methods --------------------------------------------------------------
def llama(**extra: Any) -> dict[str, Any]:
    cfg = json.loads(resources.files("bstar.presets").joinpath("models")
                     .joinpath("llama-3-8b.json").read_text())
    return {**cfg, **extra}


def linear_params(m: Any, skip: tuple[str, ...] = ("lm_head",)) -> int:
    return sum(t.params for t in m.tensors() if t.kind == "linear" and t.name not in skip)


def other_bytes(m: Any, skip: tuple[str, ...] = ("lm_head",)) -> int:
    return 2 * (m.num_params - linear_params(m, skip))


@pytest.mark.parametrize(("q", "bits_per_value", "per_group", "group"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True}, 4, 20, 32),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, 4, 20, 128),
    ({"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": False}, 4, 20, 64),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, 8, 24, 128),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 8, 0, 0),
    ({"quant_method": "mxfp4"}, 4, 8, 32),
])
def test_group_quantized_bytes(q: dict[str, Any], bits_per_value: int, per_group: int,
                               group: int) -> None:
    m = from_hf_config(llama(quantization_config=q))
    w = m.weight_bytes(get_precision(m.default_dtype))
    lin = [t for t in m.tensors() if t.kind == "linear" and t.name != "lm_head"]
    if q["quant_method"] == "mxfp4":  # only the MoE experts are MXFP4; a dense model has none
        assert w == 2 * m.num_params
        return
    if q["quant_method"] == "fp8":  # one fp32 scale per 128 x 128 block
        scales = sum(math.ceil(t.rows / 128) * math.ceil(t.cols / 128) * t.count * 4
                     for t in lin)
        assert w == linear_params(m) + scales + other_bytes(m)
        return
    g_idx = sum(t.cols * t.count * 4 for t in lin) if q["quant_method"] == "gptq" else 0
    values = sum(t.params for t in lin) * bits_per_value // 8
    scales = sum(t.rows * (t.cols // group) * t.count for t in lin) * per_group // 8
    assert w == values + scales + g_idx + other_bytes(m)


def test_nvfp4_and_compressed_tensors_and_bitsandbytes() -> None:
    nv = from_hf_config(llama(quantization_config={
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
        "exclude_modules": ["lm_head"]}))
    lin = [t for t in nv.tensors() if t.kind == "linear" and t.name != "lm_head"]
    n = sum(t.count for t in lin)
    values = sum(t.params for t in lin)
    assert nv.weight_bytes(get_precision("nvfp4")) \
        == values // 2 + values // 16 + 8 * n + other_bytes(nv)
    ct = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "ignore": ["lm_head", "re:.*self_attn.*"],
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
              "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
              "symmetric": True}}}}
    m = from_hf_config(llama(quantization_config=ct))
    assert m.default_dtype == "w4a16-g128"
    attn = [t for t in m.tensors() if t.module.startswith("model.layers.{i}.self_attn")
            and t.kind == "linear"]
    mlp = [t for t in m.tensors() if t.name.startswith("mlp.")]
    assert attn and all(m.quantized_count(t) == 0 for t in attn)  # ignored: stays bf16
    assert all(m.quantized_count(t) == t.count for t in mlp)
    w = m.weight_bytes(get_precision("w4a16-g128"))
    # 4-bit values, a bf16 scale per 128 inputs, the int64 weight_shape pair per tensor
    mlp_bytes = sum(t.count * (t.rows * t.cols // 2 + t.rows * (t.cols // 128) * 2 + 16)
                    for t in mlp)
    assert w == mlp_bytes + 2 * (m.num_params - sum(t.params for t in mlp))
    bnb = from_hf_config(llama(quantization_config={
        "quant_method": "bitsandbytes", "load_in_4bit": True,
        "bnb_4bit_use_double_quant": True, "bnb_4bit_quant_type": "nf4"}))
    assert bnb.default_dtype == "bnb4-dq"
    w = bnb.weight_bytes(get_precision("bnb4-dq"))
    blocks = sum(math.ceil(t.rows * t.cols / 64) * t.count for t in lin)
    assert w > linear_params(bnb) // 2 + blocks + other_bytes(bnb)  # + second-level scales
    assert w < (linear_params(bnb) * 4.2) // 8 + other_bytes(bnb)


def test_modules_to_not_convert_match_per_layer_and_by_pattern() -> None:
    q = {"quant_method": "fp8", "modules_to_not_convert": ["model.layers.0.mlp", "lm_head"]}
    m = from_hf_config(llama(quantization_config=q))
    up = next(t for t in m.tensors() if t.name == "mlp.up")
    assert m.quantized_count(up) == up.count - 1  # every layer but layer 0
    q_proj = next(t for t in m.tensors() if t.name == "q_proj")
    assert m.quantized_count(q_proj) == q_proj.count
    gpt = get_model("gpt-oss-20b")
    assert all(gpt.quantized_count(t) == 0 for t in gpt.tensors() if not t.expert)


# ---- refused loudly ------------------------------------------------------------------------------
def write(tmp_path: Path, cfg: dict[str, Any]) -> str:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.mark.parametrize(("change", "named"), [
    ({"layer_types": ["full_attention"] * 31 + ["mystery_attention"]}, "mystery_attention"),
    ({"quantization_config": {"quant_method": "hqq", "bits": 4}}, "hqq"),
    ({"quantization_config": {"quant_method": "awq", "bits": 3}}, "bits"),
    ({"cross_attention_layers": [3, 8]}, "cross_attention_layers"),
    ({"mamba_d_state": 16}, "mamba_d_state"),
])
def test_unmodelled_exits_2_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch,
                                      change: dict[str, Any], named: str) -> None:
    monkeypatch.delenv("BSTAR_ASSUME_UNMODELED", raising=False)
    path = write(tmp_path, llama(**change))
    assert main(["plan", "--model", path, "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1, err


def test_assume_flag_proceeds_on_the_stated_assumption(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, llama(layer_types=["full_attention"] * 31 + ["mystery"],
                                 quantization_config={"quant_method": "hqq"}))
    monkeypatch.setenv("BSTAR_ASSUME_UNMODELED", "1")
    assert main(["plan", "--model", path, "--json", "--context", "1024"]) == 0
    out = json.loads(capsys.readouterr().out)
    base = get_model("llama-3-8b")
    assert out["weight_bytes"] == base.weight_bytes(BF16)  # as bf16
    assert out["kv_bytes_per_token"] == base.kv_bytes_per_token(BF16)  # as full attention


# ---- issue 19, item 9 and 10: hostile configs, one line naming the key ---------------------
@pytest.mark.parametrize(("cfg", "key"), [
    ({"model_type": "llava", "text_config": "llama"}, "text_config"),
    ({"model_type": "llava", "text_config": [1, 2]}, "text_config"),
    ({**json.loads(resources.files("bstar.presets").joinpath("models")
                   .joinpath("opt-1.3b.json").read_text()), "num_attention_heads": 0},
     "num_attention_heads"),
    (llama(max_position_embeddings="8k"), "max_position_embeddings"),
    (llama(max_position_embeddings=4096.5), "max_position_embeddings"),
    (llama(layer_types="sliding_attention", sliding_window=4096), "layer_types"),
])
def test_hostile_config_one_line_naming_the_key(cfg: dict[str, Any], key: str,
                                                tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BstarError, match=key):
        from_hf_config(cfg)
    assert main(["plan", "--model", write(tmp_path, cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert key in err and len(err.splitlines()) == 1 and "Traceback" not in err


# ---- plan shows per kind what a sequence holds --------------------------------------------
def test_plan_json_and_text_show_each_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "qwen3-next-80b-a3b", "--gpu", "h200", "--num-gpus", "2",
                 "--context", "8192", "--json"]) == 0
    ctx = json.loads(capsys.readouterr().out)["contexts"][0]
    kinds = {k["kind"]: k for k in ctx["kv_per_kind"]}
    assert set(kinds) == {"full", "state"}
    assert sum(k["bytes"] for k in kinds.values()) == ctx["kv_bytes_per_seq"]
    assert sum(k["allocated_bytes_per_gpu"] for k in kinds.values()) \
        == ctx["kv_bytes_per_seq_allocated_per_gpu"]
    assert kinds["state"]["tokens_per_layer"] == 0 and kinds["state"]["layers"] == 36
    assert main(["plan", "--model", "gpt-oss-20b", "--gpu", "h200", "--context", "8192"]) == 0
    text = capsys.readouterr().out
    assert "12 sliding layers x 128 tokens (window 128)" in text
    assert "12 full layers x 8,192 tokens" in text


def test_sliding_pool_share_is_window_plus_batched_tokens() -> None:
    """vLLM's SlidingWindowSpec: min(window - 1 + max_num_batched_tokens, max_model_len)
    tokens, whole blocks, plus one block the window may start inside."""
    d = deployment("gpt-oss-20b")
    lay = kv_layout(d, 32768, max_num_batched_tokens=2048)
    sliding = next(k for k in lay.kinds if k.kind == "sliding")
    assert sliding.tokens_per_seq == 128 - 1 + 2048
    assert sliding.blocks_per_seq == math.ceil((128 - 1 + 2048) / 16) + 1
    full = next(k for k in lay.kinds if k.kind == "full")
    assert full.blocks_per_seq == 32768 // 16
    per_token = d.model.layer_groups()[0].kv_values_per_token * 2
    assert lay.group_size == 12 and lay.page_bytes == 16 * per_token
    assert lay.bytes_per_seq == (2048 + sliding.blocks_per_seq) * 12 * 16 * per_token
    assert default_max_num_batched_tokens(d) == 8192  # an H200 under vllm serve
    assert default_max_num_batched_tokens(replace(d, gpu=get_gpu("a100-80gb-sxm"))) == 2048
    cpu = replace(get_gpu("h200"), id="cpu", name="this CPU")
    assert default_max_num_batched_tokens(replace(d, gpu=cpu)) == 2048


def test_granite4_and_jamba_states_from_their_keys() -> None:
    granite = {"model_type": "granitemoehybrid", "hidden_size": 1536, "num_hidden_layers": 4,
               "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 1000,
               "intermediate_size": 512, "shared_intermediate_size": 4096,
               "num_local_experts": 0, "layer_types": ["mamba", "mamba", "attention", "mamba"],
               "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_n_groups": 1,
               "mamba_d_state": 128, "mamba_d_conv": 4, "mamba_expand": 2,
               "torch_dtype": "bfloat16"}
    m = from_hf_config(granite)
    inner = 48 * 64
    conv = (inner + 2 * 1 * 128) * 3
    ssm = 48 * 64 * 128
    assert [(g.kind, g.num_layers) for g in m.layer_groups()] == [("full", 1), ("state", 3)]
    assert m.layer_groups()[1].state_bytes_per_seq == 2 * (conv + ssm)
    assert m.intermediate_size == 4096  # the shared MLP is the dense MLP without experts
    jamba = {"model_type": "jamba", "hidden_size": 512, "num_hidden_layers": 8,
             "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000,
             "intermediate_size": 1024, "attn_layer_period": 8, "attn_layer_offset": 4,
             "expert_layer_period": 2, "expert_layer_offset": 1, "num_experts": 4,
             "num_experts_per_tok": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
             "mamba_expand": 2, "mamba_dt_rank": "auto", "torch_dtype": "bfloat16"}
    j = from_hf_config(jamba)
    assert j.kinds().count("full") == 1 and j.mlps().count("moe") == 4
    inner = 2 * 512
    assert j.layer_groups()[1].state_bytes_per_seq == 2 * (inner * 3 + inner * 16)
    assert kv_layout(Deployment(model=j, gpu=get_gpu("h200")), 4096) \
        .kinds[1].blocks_per_seq == 2  # Mamba-1: no prefill checkpoint page


@pytest.mark.parametrize("pid", ["gpt-oss-20b", "nemotron-h-8b", "llama-3-8b"])
def test_simulator_blocks_match_b_mem(pid: str) -> None:
    from bstar.sim.block_manager import (
        BlockManager,
        block_bytes_per_gpu,
        num_engine_blocks,
        seq_blocks,
    )

    d = deployment(pid)
    blocks, per_seq = num_engine_blocks(d, 16), seq_blocks(d, 16)
    assert blocks // per_seq(8192) == rl.vllm_max_concurrency(d, 8192)
    bm = BlockManager(blocks, 16, blocks_fn=per_seq)
    assert bm.blocks_for(8192) == kv_layout(d, 8192).blocks_per_seq
    assert all(per_seq(t) <= per_seq(t + 1) for t in range(0, 3000, 7))  # never shrinks
    if pid == "llama-3-8b":  # one kind: the engine's block is the classic one
        assert num_engine_blocks(d, 16) * block_bytes_per_gpu(d, 16) \
            == blocks * kv_layout(d, 16).bytes_per_block
