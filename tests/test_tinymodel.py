"""The tiny random Llama: tokenizer counts, config, tensor shapes, GGUF layout, cache."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("safetensors", reason="needs the extra bstar[tiny]")
pytest.importorskip("tokenizers", reason="needs the extra bstar[tiny]")
pytest.importorskip("gguf", reason="needs the extra bstar[tiny]")

import numpy as np

from bstar.tinymodel import (
    PRINTABLE_ASCII,
    TinyModel,
    build_tiny_model,
    bytes_to_unicode,
    default_tiny_dir,
)

# Smaller than the default so the module stays well under its 10 s budget; the shapes
# logic is the same for any size.
SMALL = {
    "hidden_size": 256,
    "num_layers": 2,
    "intermediate_size": 512,
    "num_heads": 8,
    "num_kv_heads": 4,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=3, **SMALL)


def test_files_written(tiny: TinyModel) -> None:
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ):
        assert (tiny.hf_dir / name).is_file(), name
    assert tiny.gguf_path is not None and tiny.gguf_path.is_file()


@pytest.mark.parametrize("n", [1, 7, 32, 500])
def test_ascii_prompt_of_n_chars_is_n_tokens(tiny: TinyModel, n: int) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny.hf_dir / "tokenizer.json"))
    text = ("The quick brown fox jumps over the lazy dog, 0123456789! " * 20)[:n]
    enc = tok.encode(text)
    assert len(enc.ids) == n
    assert enc.ids == list(text.encode())  # token id == byte value, no BOS
    assert tok.decode(enc.ids) == text


def test_tokenizer_config(tiny: TinyModel) -> None:
    cfg = json.loads((tiny.hf_dir / "tokenizer_config.json").read_text())
    assert cfg["add_bos_token"] is False
    assert "messages" in cfg["chat_template"]


def test_config_values(tiny: TinyModel) -> None:
    cfg = json.loads((tiny.hf_dir / "config.json").read_text())
    assert cfg == tiny.config
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["hidden_size"] == 256
    assert cfg["num_hidden_layers"] == 2
    assert cfg["intermediate_size"] == 512
    assert cfg["num_attention_heads"] == 8
    assert cfg["num_key_value_heads"] == 4
    assert cfg["head_dim"] == 32
    # 256 bytes + the dummy merge + BOS + EOS: small, and EOS is a real id.
    assert cfg["vocab_size"] == 259
    assert cfg["eos_token_id"] < cfg["vocab_size"]


def test_safetensors_shapes(tiny: TinyModel) -> None:
    from safetensors.numpy import load_file

    cfg = tiny.config
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    t = load_file(str(tiny.hf_dir / "model.safetensors"))
    expected = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        expected |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    assert {k: a.shape for k, a in t.items()} == expected
    assert all(a.dtype == np.float32 for a in t.values())


def test_output_layer_only_printable_ascii(tiny: TinyModel) -> None:
    from safetensors.numpy import load_file

    lm = load_file(str(tiny.hf_dir / "model.safetensors"))["lm_head.weight"]
    nonzero = set(np.flatnonzero(np.abs(lm).sum(axis=1)).tolist())
    assert nonzero == set(PRINTABLE_ASCII)  # EOS and every other row are exactly zero


def test_gguf_matches_hf_with_permuted_qk(tiny: TinyModel) -> None:
    import gguf
    from safetensors.numpy import load_file

    assert tiny.gguf_path is not None
    hf = load_file(str(tiny.hf_dir / "model.safetensors"))
    r = gguf.GGUFReader(str(tiny.gguf_path))
    g = {t.name: np.asarray(t.data).reshape(tuple(reversed(t.shape.tolist()))) for t in r.tensors}
    assert len(g) == len(hf)
    np.testing.assert_array_equal(g["output.weight"], hf["lm_head.weight"])
    np.testing.assert_array_equal(
        g["blk.1.attn_v.weight"], hf["model.layers.1.self_attn.v_proj.weight"]
    )
    # Within each head, GGUF row 2j is HF row j and row 2j+1 is HF row j + d/2.
    d = tiny.config["head_dim"]
    hq = hf["model.layers.0.self_attn.q_proj.weight"]
    gq = g["blk.0.attn_q.weight"]
    np.testing.assert_array_equal(gq[d + 0], hq[d + 0])
    np.testing.assert_array_equal(gq[d + 1], hq[d + d // 2])
    np.testing.assert_array_equal(gq[d + 2], hq[d + 1])
    hk = hf["model.layers.0.self_attn.k_proj.weight"]
    gk = g["blk.0.attn_k.weight"]
    np.testing.assert_array_equal(gk[1], hk[d // 2])
    # The vocabulary and its one dummy merge (llama.cpp rejects a gpt2 vocab without).
    b2u = bytes_to_unicode()
    field = r.fields["tokenizer.ggml.merges"]
    merges = [bytes(field.parts[i]).decode() for i in field.data]
    assert merges == [f"{b2u[0xFE]} {b2u[0xFF]}"]


def test_default_tiny_dir_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BSTAR_CACHE_DIR", str(tmp_path))
    a = default_tiny_dir(**SMALL, gguf=False)
    assert a.hf_dir.parent.parent == tmp_path
    assert a.hf_dir.parent.name.startswith("tiny-")
    assert a.gguf_path is None
    stamp = (a.hf_dir / "model.safetensors").stat().st_mtime_ns
    b = default_tiny_dir(**SMALL, gguf=False)
    assert b == a
    assert (b.hf_dir / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    c = default_tiny_dir(**SMALL, gguf=False, seed=1)
    assert c.hf_dir != a.hf_dir
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers


def test_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # makes `import gguf` fail
    with pytest.raises(ImportError, match=r"bstar\[tiny\]"):
        build_tiny_model(tmp_path)
