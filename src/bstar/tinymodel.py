"""A tiny random-weight Llama, built offline, for tests and `bstar demo`.

No model can be downloaded where bstar is tested, yet its sweeps need real servers
(llama.cpp, vLLM) with a real model behind them. This module writes ONE set of seeded
random weights twice: as a Hugging Face folder (for vLLM and transformers) and as a GGUF
file (for llama.cpp), so both servers run the very same network and greedy outputs can
be compared across them.

Design choices, each for a measurable property:
- Byte-level BPE whose 256 tokens are the bytes themselves (token id == byte value),
  with no BOS added: an ASCII prompt of N characters is exactly N prompt tokens on
  every server, so sweeps control input lengths exactly.
- One dummy merge of the byte characters for 0xFE and 0xFF: llama.cpp refuses a `gpt2`
  vocabulary with no merges, and those two bytes never occur in UTF-8 text, so the
  merge never fires.
- The output layer gives exactly zero logits to every token except printable ASCII,
  whose rows are random with a large scale: the best printable token beats EOS by
  tens of logits, so generation never stops early (fixed output lengths even on
  servers that reject `ignore_eos`) and the text is always valid UTF-8.

The heavy imports (numpy, safetensors, tokenizers, gguf) happen inside functions, so
`import bstar.tinymodel` costs nothing; they come with the extra `bstar[tiny]`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Bump when the bytes written change, so cached builds of an older layout are not reused.
BUILDER_VERSION = 1

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
# A plain "role: content" template: the tokenizer has no role tokens, and a template
# made only of text keeps chat prompts countable (every character is one token).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
PRINTABLE_ASCII = range(0x20, 0x7F)  # space .. '~'
MAX_POSITION_EMBEDDINGS = 4096
ROPE_THETA = 10000.0
RMS_NORM_EPS = 1e-5


@dataclass(frozen=True)
class TinyModel:
    """Where a built tiny model lives. `config` is the HF config.json as a dict."""

    hf_dir: Path
    gguf_path: Path | None
    config: dict[str, Any] = field(hash=False)


def _require_tiny_deps() -> None:
    missing = []
    for mod in ("numpy", "safetensors", "tokenizers", "gguf"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        raise ImportError(
            f"building the tiny model needs {', '.join(missing)}; "
            "install the extra: pip install 'bstar[tiny]'"
        )


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE.

    Bytes that are printable Latin-1 map to themselves; the rest (controls, space,
    0x7F-0xA0, 0xAD) are shifted to code points from 256 upwards, in byte order.
    """
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping: dict[int, str] = {b: chr(b) for b in keep}
    shift = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shift)
            shift += 1
    return mapping


def _vocab() -> tuple[list[str], list[str], dict[str, int]]:
    """Token strings in id order, the merges, and the ids of the special tokens."""
    b2u = bytes_to_unicode()
    tokens = [b2u[b] for b in range(256)]  # id == byte value
    merge_left, merge_right = b2u[0xFE], b2u[0xFF]
    tokens.append(merge_left + merge_right)  # a merge's result must be in the vocab
    special = {"bos": len(tokens), "eos": len(tokens) + 1}
    tokens += [BOS_TOKEN, EOS_TOKEN]
    return tokens, [f"{merge_left} {merge_right}"], special


def _hf_config(
    *,
    hidden_size: int,
    num_layers: int,
    intermediate_size: int,
    num_heads: int,
    num_kv_heads: int,
    vocab_size: int,
    bos_id: int,
    eos_id: int,
) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden_size // num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "initializer_range": 0.02,
        # float32 on disk: both servers then compute from the same values, which keeps
        # greedy outputs comparable across them.
        "torch_dtype": "float32",
        "use_cache": True,
    }


def _random_weights(cfg: dict[str, Any], seed: int) -> dict[str, Any]:
    """HF-named float32 tensors. Scales keep activations O(1) through the layers."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h = cfg["hidden_size"]
    inter = cfg["intermediate_size"]
    hd = cfg["head_dim"]
    nh = cfg["num_attention_heads"]
    nkv = cfg["num_key_value_heads"]
    vocab = cfg["vocab_size"]

    def linear(out_f: int, in_f: int) -> Any:
        # 1/sqrt(fan_in): unit-variance inputs give unit-variance outputs, so attention
        # scores are O(1) (position matters, which is what exposes a wrong q/k layout).
        w = rng.standard_normal((out_f, in_f), dtype=np.float32)
        w *= np.float32(1.0 / np.sqrt(in_f))
        return w

    t: dict[str, Any] = {}
    t["model.embed_tokens.weight"] = rng.standard_normal((vocab, h), dtype=np.float32)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        t[p + "self_attn.q_proj.weight"] = linear(nh * hd, h)
        t[p + "self_attn.k_proj.weight"] = linear(nkv * hd, h)
        t[p + "self_attn.v_proj.weight"] = linear(nkv * hd, h)
        t[p + "self_attn.o_proj.weight"] = linear(h, nh * hd)
        t[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        t[p + "mlp.gate_proj.weight"] = linear(inter, h)
        t[p + "mlp.up_proj.weight"] = linear(inter, h)
        t[p + "mlp.down_proj.weight"] = linear(h, inter)
    t["model.norm.weight"] = np.ones(h, dtype=np.float32)
    # After the final RMSNorm the hidden state has unit RMS, so a row of N(0, 1) gives a
    # logit of spread sqrt(h) (32 at h=1024): the best of 95 printable rows sits tens of
    # logits above the zero rows (EOS included), at any temperature a client sends.
    lm_head = np.zeros((vocab, h), dtype=np.float32)
    printable = list(PRINTABLE_ASCII)
    lm_head[printable] = rng.standard_normal((len(printable), h), dtype=np.float32)
    t["lm_head.weight"] = lm_head
    return t


def _permute_qk(w: Any, n_head: int) -> Any:
    """HF rotary layout (halves) -> GGUF/llama.cpp layout (interleaved pairs).

    HF's Llama rotates dimension j with j + head_dim/2 inside each head; llama.cpp's
    RoPE rotates adjacent pairs (2j, 2j+1). So within each head, rows are reordered
    [0, d/2, 1, d/2+1, ...], the same reordering llama.cpp's converter applies.
    """
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_hf_tokenizer(out: Path, tokens: list[str], merges: list[str], eos_id: int) -> None:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tokens) if tok not in (BOS_TOKEN, EOS_TOKEN)}
    left, right = merges[0].split(" ")
    bpe = models.BPE(vocab=vocab, merges=[(left, right)], fuse_unk=False)
    tok = Tokenizer(bpe)
    # No regex split and no prefix space: the text goes to bytes as is, one token each.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    # No post-processor: nothing (no BOS) is added around the prompt.
    tok.add_special_tokens(
        [
            AddedToken(BOS_TOKEN, special=True, normalized=False),
            AddedToken(EOS_TOKEN, special=True, normalized=False),
        ]
    )
    if tok.token_to_id(EOS_TOKEN) != eos_id:
        raise AssertionError("special token ids moved; the vocabulary layout changed")
    tok.save(str(out / "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_POSITION_EMBEDDINGS,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "special": True,
                "normalized": False,
                "lstrip": False,
                "rstrip": False,
                "single_word": False,
            }
            for i, t in enumerate(tokens)
            if t in (BOS_TOKEN, EOS_TOKEN)
        },
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN}, indent=2
        )
        + "\n"
    )


def _write_gguf(
    path: Path,
    cfg: dict[str, Any],
    weights: dict[str, Any],
    tokens: list[str],
    merges: list[str],
    special: dict[str, int],
) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_name("bstar-tiny-random-llama")
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_rope_dimension_count(cfg["head_dim"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)

    w.add_tokenizer_model("gpt2")
    # "default" pre-tokenizer: with a single merge that never fires, any split gives
    # one token per byte, so the choice cannot change token counts.
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    types = [gguf.TokenType.NORMAL] * len(tokens)
    types[special["bos"]] = gguf.TokenType.CONTROL
    types[special["eos"]] = gguf.TokenType.CONTROL
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(special["bos"])
    w.add_eos_token_id(special["eos"])
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w.add_tensor("token_embd.weight", weights["model.embed_tokens.weight"])
    for i in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", weights[p + "input_layernorm.weight"])
        w.add_tensor(b + "attn_q.weight", _permute_qk(weights[p + "self_attn.q_proj.weight"], nh))
        w.add_tensor(b + "attn_k.weight", _permute_qk(weights[p + "self_attn.k_proj.weight"], nkv))
        w.add_tensor(b + "attn_v.weight", weights[p + "self_attn.v_proj.weight"])
        w.add_tensor(b + "attn_output.weight", weights[p + "self_attn.o_proj.weight"])
        w.add_tensor(b + "ffn_norm.weight", weights[p + "post_attention_layernorm.weight"])
        w.add_tensor(b + "ffn_gate.weight", weights[p + "mlp.gate_proj.weight"])
        w.add_tensor(b + "ffn_up.weight", weights[p + "mlp.up_proj.weight"])
        w.add_tensor(b + "ffn_down.weight", weights[p + "mlp.down_proj.weight"])
    w.add_tensor("output_norm.weight", weights["model.norm.weight"])
    w.add_tensor("output.weight", weights["lm_head.weight"])

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def build_tiny_model(
    out_dir: str | os.PathLike[str],
    *,
    hidden_size: int = 1024,
    num_layers: int = 8,
    intermediate_size: int = 2816,
    num_heads: int = 16,
    num_kv_heads: int = 8,
    seed: int = 0,
    gguf: bool = True,
) -> TinyModel:
    """Write the tiny model under `out_dir`: `out_dir/hf/` and `out_dir/tiny.gguf`.

    The defaults (~95M parameters) show a throughput knee near 4-8 streams on two CPU
    cores; hidden 256-512 gives a smaller model that keeps scaling to 16.
    """
    _require_tiny_deps()
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, num_heads by num_kv_heads")
    if (hidden_size // num_heads) % 2:
        raise ValueError("head_dim must be even for rotary embeddings")

    from safetensors.numpy import save_file

    out = Path(out_dir)
    hf_dir = out / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)

    tokens, merges, special = _vocab()
    cfg = _hf_config(
        hidden_size=hidden_size,
        num_layers=num_layers,
        intermediate_size=intermediate_size,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        vocab_size=len(tokens),
        bos_id=special["bos"],
        eos_id=special["eos"],
    )
    weights = _random_weights(cfg, seed)

    (hf_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    (hf_dir / "generation_config.json").write_text(
        json.dumps({"bos_token_id": special["bos"], "eos_token_id": special["eos"]}, indent=2)
        + "\n"
    )
    save_file(weights, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    _write_hf_tokenizer(hf_dir, tokens, merges, special["eos"])

    gguf_path: Path | None = None
    if gguf:
        gguf_path = out / "tiny.gguf"
        _write_gguf(gguf_path, cfg, weights, tokens, merges, special)
    return TinyModel(hf_dir=hf_dir, gguf_path=gguf_path, config=cfg)


def _cache_root() -> Path:
    env = os.environ.get("BSTAR_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "bstar"


def default_tiny_dir(**params: Any) -> TinyModel:
    """Build (once) and return the tiny model cached under the bstar cache directory.

    The folder is `${BSTAR_CACHE_DIR:-~/.cache/bstar}/tiny-<hash>`, the hash covering
    the build parameters and BUILDER_VERSION. A build goes to a temporary folder that
    is renamed into place when complete, so an interrupted build is never reused and
    concurrent callers end up with one complete copy.
    """
    defaults: dict[str, Any] = {
        "hidden_size": 1024,
        "num_layers": 8,
        "intermediate_size": 2816,
        "num_heads": 16,
        "num_kv_heads": 8,
        "seed": 0,
        "gguf": True,
    }
    unknown = set(params) - set(defaults)
    if unknown:
        raise TypeError(f"unknown tiny model parameters: {sorted(unknown)}")
    full = {**defaults, **params}
    key = json.dumps({"v": BUILDER_VERSION, **full}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = _cache_root()
    final = root / f"tiny-{digest}"
    marker = final / "complete.json"
    if not marker.exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tiny-{digest}-", dir=root))
        try:
            build_tiny_model(tmp, **full)
            (tmp / "complete.json").write_text(key + "\n")
            try:
                tmp.rename(final)
            except OSError:
                # Another process finished first (or a stale incomplete folder exists).
                if not marker.exists():
                    shutil.rmtree(final, ignore_errors=True)
                    tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    cfg = json.loads((final / "hf" / "config.json").read_text())
    gguf_path = final / "tiny.gguf" if full["gguf"] else None
    return TinyModel(hf_dir=final / "hf", gguf_path=gguf_path, config=cfg)
