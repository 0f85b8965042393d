"""Weight bytes: how many bytes each tensor of a model takes under a weight precision and
the checkpoint's `quantization_config` (which linears it quantizes, which it leaves in the
activation dtype)."""

from __future__ import annotations

import fnmatch
import functools
import re
from typing import TYPE_CHECKING

from bstar.specs.model.tensors import cached_model_tensors
from bstar.specs.precision import Precision, get_precision

if TYPE_CHECKING:
    from bstar.specs.model.fields import ModelFields, Tensor


def quantized_count(m: ModelFields, t: Tensor) -> int:
    """How many of `t`'s copies the checkpoint's quantization_config quantizes."""
    if t.kind != "linear" or not m.quant_scope or t.role in ("router", "conv", "vision") \
            or (t.role == "lm_head" and not m.quant_lm_head) \
            or (m.quant_scope == "experts" and not t.expert):
        return 0
    if not m.quant_skip:
        return t.count
    if not t.layers:
        return 0 if _skipped(t.module, m.quant_skip) else t.count
    per = t.count // len(t.layers)
    return per * sum(1 for i in t.layers
                     if not _skipped(t.module.replace("{i}", str(i)), m.quant_skip))


def weight_bytes_parts(m: ModelFields, weight: Precision,
                       tensors: tuple[Tensor, ...] | None = None) -> tuple[int, int, int]:
    """(dense, routed-expert, input-embedding) bytes of `tensors` (default: the model's) with
    linear weights in `weight` (`ModelSpec.weight_bytes_parts` says which take what)."""
    act = get_precision(m.act_dtype)
    native = bool(m.quant_scope) and weight.name == m.default_dtype
    dense = expert = embed = 0
    for t in cached_model_tensors(m) if tensors is None else tensors:
        if t.kind == "linear" and native:
            q = quantized_count(m, t)
            b = weight.tensor_bytes(t.rows, t.cols) * q \
                + act.value_bytes(t.rows * t.cols) * (t.count - q)
        elif t.kind == "linear" and t.role != "conv":
            b = weight.tensor_bytes(t.rows, t.cols) * t.count
        else:
            b = act.value_bytes(t.params)
        if t.expert:
            expert += b
        elif t.kind == "embedding":
            embed += b
        else:
            dense += b
    return dense, expert, embed


def weight_bytes_16bit(m: ModelFields, weight: Precision) -> tuple[int, int]:
    """Of `weight_bytes_parts`' dense and routed-expert bytes, those kept in the 16-bit
    activation dtype under `weight` (norms, biases, routers, ignored modules, the LM head
    of a checkpoint that does not quantize it): a step streams them as 16-bit weights."""
    if weight.bits >= 16:
        dense, expert, _ = cached_weight_bytes_parts(m, weight)
        return dense, expert
    act = get_precision(m.act_dtype)
    native = bool(m.quant_scope) and weight.name == m.default_dtype
    dense = expert = 0
    for t in cached_model_tensors(m):
        if t.kind == "embedding":
            continue
        if t.kind == "linear" and native:
            b = act.value_bytes(t.rows * t.cols) * (t.count - quantized_count(m, t))
        elif t.kind == "linear" and t.role != "conv":
            b = 0
        else:
            b = act.value_bytes(t.params)
        if t.expert:
            expert += b
        else:
            dense += b
    return dense, expert


# Module-path prefixes of multimodal and hybrid checkpoints, normalized before matching.
_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
             ("language_model.", ""), ("backbone.", "model."))


def _norm_path(path: str) -> str:
    for old, new in _PREFIXES:
        if path.startswith(old):
            return new + path[len(old):]
    return path


@functools.lru_cache(maxsize=65536)
def _skipped(module: str, patterns: tuple[str, ...]) -> bool:
    """Whether a module path matches a quantization_config ignore list the way the loaders
    read it: "re:<regex>" (compressed-tensors), globs ("model.layers.*.self_attn", gpt-oss),
    and plain names matching whole path components (transformers' modules_to_not_convert:
    "lm_head", "mlp.gate", "model.layers.0.self_attn")."""
    module = _norm_path(module)
    parts = module.split(".")
    ancestors = [".".join(parts[:k]) for k in range(1, len(parts) + 1)]
    for raw in patterns:
        if raw.startswith("re:"):
            try:
                rx = re.compile(raw[3:])
            except re.error:
                continue
            if any(rx.fullmatch(a) for a in ancestors) or rx.match(module):
                return True
            continue
        p = _norm_path(raw)
        if "*" in p or "?" in p or "[" in p:
            if any(fnmatch.fnmatchcase(a, p) for a in ancestors):
                return True
        elif f".{p}." in f".{module}.":
            return True
    return False


@functools.lru_cache(maxsize=256)
def cached_weight_bytes_parts(m: ModelFields, weight: Precision) -> tuple[int, int, int]:
    """`weight_bytes_parts(m, weight)` once per spec and precision (keyed by the spec's
    compared fields; its raw config is not one): every decode step of a curve asks."""
    return weight_bytes_parts(m, weight)
