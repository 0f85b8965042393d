"""Each layer's kind from a config.json, under each family's keys (docs/models.md): the mixer
(full, sliding or chunked attention, a gated delta net, Mamba, none) and the MLP (dense, MoE,
none) of every layer, the Mamba mixer's sizes, and a multimodal checkpoint's vision tower."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bstar.errors import BstarError
from bstar.specs.model.keys import ASSUME_HINT, MAX_LAYERS, integer, positive
from bstar.specs.model.tensors import Tensor

# layer_types entries and the kind each is (docs/models.md).
_LAYER_TYPES = {"full_attention": "full", "attention": "full", "global_attention": "full",
                "sliding_attention": "sliding", "chunked_attention": "chunked",
                "linear_attention": "linear_attention", "mamba": "mamba"}
# Nemotron-H's hybrid_override_pattern: one character per layer.
_PATTERN = {"M": ("mamba", "none"), "*": ("full", "none"), "-": ("none", "dense"),
            "E": ("none", "moe")}


def layer_kinds(cfg: Mapping[str, Any], mt: str, n_layers: int, max_pos: int, where: str,
                 assume: bool) -> tuple[tuple[str, ...], int, int]:
    """(each layer's kind, sliding window, attention chunk) from the config's keys."""
    window = 0
    if cfg.get("sliding_window") and cfg.get("use_sliding_window") is not False:
        window = integer(cfg, where, "sliding_window")
    chunk = integer(cfg, where, "attention_chunk_size", default=0) if mt.startswith("llama4") \
        else 0
    types = cfg.get("layer_types")
    if mt == "nemotron_h":
        return _nemotron_blocks(cfg, n_layers, where)[0], window, chunk
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise BstarError(f"{where}: 'layer_types' must be a list of strings, got "
                             f"{type(types).__name__}")
        if len(types) != n_layers:
            raise BstarError(f"{where}: 'layer_types' has {len(types)} entries for "
                             f"{n_layers} layers")
        kinds = []
        for t in types:
            k = _LAYER_TYPES.get(t)
            if k is None:
                if not assume:
                    raise BstarError(f"{where}: layer_types has {t!r}, a layer kind bstar "
                                     f"does not model{ASSUME_HINT} pricing it as full "
                                     "attention")
                k = "full"
            if (k == "sliding" and not window) or (k == "chunked" and not chunk):
                k = "full"
            kinds.append(k)
        return tuple(kinds), window, chunk
    if mt == "jamba":
        period = positive(cfg, where, "attn_layer_period")
        offset = integer(cfg, where, "attn_layer_offset")
        return tuple("full" if i % period == offset else "mamba" for i in range(n_layers)), \
            window, chunk
    if mt == "qwen3_next":
        every = positive(cfg, where, "full_attention_interval")
        return tuple("full" if (i + 1) % every == 0 else "linear_attention"
                     for i in range(n_layers)), window, chunk
    if chunk:
        nope = cfg.get("no_rope_layers")
        if not nope:
            every = positive(cfg, where, "no_rope_layer_interval") \
                if "no_rope_layer_interval" in cfg else 4
            nope = [int((i + 1) % every != 0) for i in range(n_layers)]
        if not isinstance(nope, list) or len(nope) != n_layers:
            raise BstarError(f"{where}: 'no_rope_layers' must list one 0/1 per layer")
        # vLLM's Llama-4: RoPE layers use chunked local attention, NoPE layers attend fully.
        return tuple("chunked" if r else "full" for r in nope), window, chunk
    if not window:
        return ("full",) * n_layers, 0, chunk
    if mt.startswith("gemma2"):
        # Gemma-2 alternates: even layers slide, odd layers attend globally (HF Gemma2).
        return tuple("sliding" if i % 2 == 0 else "full" for i in range(n_layers)), window, 0
    if "sliding_window_pattern" in cfg:
        every = positive(cfg, where, "sliding_window_pattern")
        return tuple("full" if (i + 1) % every == 0 else "sliding"
                     for i in range(n_layers)), window, 0
    if max_pos and window >= max_pos:
        return ("full",) * n_layers, 0, chunk
    return ("sliding",) * n_layers, window, chunk


def _nemotron_blocks(cfg: Mapping[str, Any], n_layers: int,
                     where: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Nemotron-H's layers (mixer kinds, MLP kinds): hybrid_override_pattern (M Mamba-2,
    * attention, - MLP, E MoE) or, as transformers 5 writes it, layers_block_type
    ("linear_attention" is its name for a Mamba-2 layer)."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is None:
        blocks = cfg.get("layers_block_type", cfg.get("layer_types"))
        names = {"linear_attention": "M", "mamba": "M", "full_attention": "*",
                 "attention": "*", "mlp": "-", "moe": "E"}
        if not isinstance(blocks, list) or not all(isinstance(b, str) for b in blocks):
            raise BstarError(f"{where}: Nemotron-H needs 'hybrid_override_pattern' or "
                             "'layers_block_type' (a list of strings)")
        for b in blocks:
            if b not in names:
                raise BstarError(f"{where}: layers_block_type has {b!r}, a layer kind bstar "
                                 "does not model")
        pattern = "".join(names[b] for b in blocks)
    if not isinstance(pattern, str) or len(pattern) != n_layers:
        raise BstarError(f"{where}: 'hybrid_override_pattern' must be a string of one "
                         f"character per layer ({n_layers})")
    for c in pattern:
        if c not in _PATTERN:
            raise BstarError(f"{where}: hybrid_override_pattern has {c!r}, a layer kind "
                             "bstar does not model (M, *, - and E are)")
    return tuple(_PATTERN[c][0] for c in pattern), tuple(_PATTERN[c][1] for c in pattern)


def mlp_kinds(cfg: Mapping[str, Any], mt: str, n_layers: int, where: str) -> tuple[str, ...]:
    if mt == "nemotron_h":
        return _nemotron_blocks(cfg, n_layers, where)[1]
    if mt.startswith("llama4"):
        moe = cfg.get("moe_layers")
        if moe is None:
            step = positive(cfg, where, "interleave_moe_layer_step") \
                if "interleave_moe_layer_step" in cfg else 1
            moe = list(range(step - 1, n_layers, step))
        if not isinstance(moe, list) or not all(isinstance(i, int) for i in moe):
            raise BstarError(f"{where}: 'moe_layers' must be a list of layer indices")
        return tuple("moe" if i in set(moe) else "dense" for i in range(n_layers))
    if mt == "jamba" and integer(cfg, where, "num_experts", default=0) > 1:
        period = positive(cfg, where, "expert_layer_period")
        offset = integer(cfg, where, "expert_layer_offset")
        return tuple("moe" if i % period == offset else "dense" for i in range(n_layers))
    return ()


def mamba_sizes(cfg: Mapping[str, Any], mt: str, h: int, where: str) -> dict[str, Any]:
    """The Mamba mixer's sizes under each family's key spelling."""
    def get(*keys: str, default: int | None = None) -> int:
        return integer(cfg, where, *keys, default=default)

    kernel = get("conv_kernel", "mamba_d_conv")
    out = dict(conv_kernel=kernel,
               conv_bias=bool(cfg.get("use_conv_bias", cfg.get("mamba_conv_bias", True))),
               ssm_proj_bias=bool(cfg.get("use_bias", cfg.get("mamba_proj_bias", False))))
    if mt == "jamba":
        inner = get("mamba_expand") * h
        ds = get("mamba_d_state")
        rank = cfg.get("mamba_dt_rank", "auto")
        dt_rank = math.ceil(h / 16) if rank == "auto" else get("mamba_dt_rank")
        return out | dict(mamba=(1, 0, 0, 0, ds, inner, dt_rank))
    nh = get("mamba_num_heads", "mamba_n_heads")
    hd = get("mamba_head_dim", "mamba_d_head")
    ng = get("n_groups", "mamba_n_groups", default=1)
    ds = get("ssm_state_size", "mamba_d_state")
    inner = nh * hd
    if nh <= 0 or hd <= 0 or kernel < 1:
        raise BstarError(f"{where}: Mamba heads, head dim and conv kernel must be positive")
    return out | dict(mamba=(2, nh, hd, ng, ds, inner, 0))


def vision_tensors(cfg: Mapping[str, Any], where: str) -> tuple[Tensor, ...]:
    """A multimodal checkpoint's vision encoder (a ViT: Gemma-3's SigLIP, Llama-4's) and its
    projector, from vision_config: the bytes vLLM loads beside the language model."""
    vc = cfg.get("vision_config")
    if not isinstance(vc, Mapping):
        return ()
    text = cfg["text_config"]
    vw = f"{where} vision_config"
    h = integer(vc, vw, "hidden_size")
    inter = integer(vc, vw, "intermediate_size")
    n = integer(vc, vw, "num_hidden_layers")
    patch = integer(vc, vw, "patch_size")
    image = integer(vc, vw, "image_size")
    channels = integer(vc, vw, "num_channels", default=3)
    th = integer(text, where, "hidden_size")
    if patch <= 0 or n > MAX_LAYERS:
        raise BstarError(f"{vw}: patch_size must be positive")
    patches = (image // patch) ** 2

    def v(name: str, rows: int, cols: int, count: int, kind: str = "linear") -> Tensor:
        return Tensor(f"vision.{name}", rows, cols, count, kind, module=f"vision_tower.{name}",
                      role="vision")

    out = [v("attn", h, h, 4 * n), v("attn.bias", 4 * h, 1, n, "vector"),
           v("mlp.fc1", inter, h, n), v("mlp.fc2", h, inter, n),
           v("mlp.bias", inter + h, 1, n, "vector"), v("layer_norms", h, 1, 4 * n, "vector")]
    cls = 1 if str(vc.get("model_type", "")).startswith("llama4") else 0
    out += [v("patch_embedding", h, channels * patch * patch, 1),
            v("position_embedding", patches + cls, h, 1, "vector"),
            v("post_layernorm", h, 1, 2 * (1 + cls), "vector")]
    if cls:
        # Llama-4: a class token, the pixel-shuffle MLP and the projector into the text model.
        ratio = vc.get("pixel_shuffle_ratio", 0.5)
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not (
                0.01 <= ratio <= 1):
            raise BstarError(f"{vw}: pixel_shuffle_ratio must be a number in [0.01, 1] "
                             f"(Llama-4's is 0.5), got {ratio!r}")
        shuffled = round(h / (ratio * ratio))
        proj_in = integer(vc, vw, "projector_input_dim")
        proj_out = integer(vc, vw, "projector_output_dim")
        out += [v("class_embedding", h, 1, 1, "vector"),
                v("adapter.fc1", proj_in, shuffled, 1), v("adapter.fc2", proj_out, proj_in, 1),
                v("projector", th, integer(vc, vw, "vision_output_dim"), 1)]
    else:
        # Gemma-3: the projection into the text model and its soft-embedding norm.
        out += [v("projector", th, h, 1), v("projector.norm", h, 1, 1, "vector")]
    return tuple(out)

