"""The checkpoint's weight precision and which linears it covers, from its
`quantization_config` (docs/models.md, one row per method). A method bstar does not model is
refused by name unless `assume` (the weights then count in the activation dtype)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bstar.errors import BstarError
from bstar.specs.model.keys import ASSUME_HINT
from bstar.specs.precision import get_precision


def quantization(cfg: Mapping[str, Any], where: str, act: str,
                  assume: bool) -> dict[str, Any]:
    """The checkpoint's weight precision and which linears it covers, from
    quantization_config (docs/models.md, one row per method)."""
    q = cfg.get("quantization_config")
    plain = dict(default_dtype=act)
    if q is None:
        return plain
    if not isinstance(q, Mapping):
        raise BstarError(f"{where}: 'quantization_config' must be a JSON object")
    method = str(q.get("quant_method", "")).lower()
    skip = _patterns(q, where, "modules_to_not_convert", "ignore", "ignored_layers",
                     "exclude_modules", "llm_int8_skip_modules")
    scope, lm_head = "linear", False
    bits = q.get("bits", q.get("w_bit"))
    if method == "mxfp4":
        name, scope = "mxfp4", "experts"  # vLLM's Mxfp4Config quantizes the MoE experts only
    elif method == "fp8":
        name = "fp8-block" if q.get("weight_block_size") else "fp8-tensor"
        if q.get("weight_block_size") not in (None, [128, 128]):
            raise BstarError(f"{where}: quantization_config weight_block_size "
                             f"{q.get('weight_block_size')!r} (bstar models [128, 128])")
    elif method == "fbgemm_fp8":
        name = "fp8"
    elif method in ("awq", "gptq", "awq_marlin", "gptq_marlin"):
        group = q.get("group_size", q.get("q_group_size", 128))
        if not isinstance(group, int) or isinstance(group, bool) or group == 0 or group < -1:
            raise BstarError(f"{where}: quantization_config group_size must be a positive "
                             f"integer or -1, got {group!r}")
        g = 0 if group == -1 else group
        if method.startswith("awq"):
            if bits != 4:
                raise BstarError(f"{where}: quantization_config bits {bits!r} with awq "
                                 "(bstar models 4)")
            name = f"int4-g{g}"
        else:
            if bits not in (4, 8):
                raise BstarError(f"{where}: quantization_config bits {bits!r} with gptq "
                                 "(bstar models 4 and 8)")
            name = f"gptq{bits}-g{g}"
            lm_head = bool(q.get("lm_head", False))
    elif method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        names = {"FP8": "fp8-tensor", "NVFP4": "nvfp4"}
        if algo not in names:
            return _unknown_quant(f"quant_algo {algo!r} of modelopt", where, act, assume)
        name = names[algo]
    elif method == "compressed-tensors":
        name = _compressed_tensors(q, where)
        if name is None:
            return _unknown_quant("config_groups of compressed-tensors", where, act, assume)
    elif method == "bitsandbytes":
        if q.get("load_in_4bit"):
            name = "bnb4-dq" if q.get("bnb_4bit_use_double_quant") else "bnb4"
        elif q.get("load_in_8bit"):
            name = "bnb8"
        else:
            return _unknown_quant("bitsandbytes without load_in_4bit/8bit", where, act, assume)
    else:
        return _unknown_quant(f"quant_method {method!r}", where, act, assume)
    name = get_precision(name).name  # int4-g128 is int4
    return dict(default_dtype=name, quant_scope=scope, quant_skip=skip, quant_lm_head=lm_head)


def _unknown_quant(what: str, where: str, act: str, assume: bool) -> dict[str, Any]:
    if not assume:
        raise BstarError(f"{where}: quantization_config {what} is not a method bstar models"
                         f"{ASSUME_HINT} with the weights in {act}")
    return dict(default_dtype=act)


def _patterns(q: Mapping[str, Any], where: str, *keys: str) -> tuple[str, ...]:
    out: list[str] = []
    for k in keys:
        v = q.get(k)
        if v is None:
            continue
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise BstarError(f"{where}: quantization_config {k!r} must be a list of names")
        for x in v:
            if x.startswith("re:"):
                check_regex(x[3:], f"{where}: quantization_config {k!r}")
        out += v
    return tuple(out)


MAX_REGEX_REPEATS = 4
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")


def check_regex(pattern: str, where: str) -> None:
    """Refuse a pattern Python's backtracking `re` could take exponential time on: a repeat
    inside a repeat (`([a-z_.0-9]+)+#`), alternatives under a repeat (`(a|ab)*`) or a
    backreference. The ignore patterns checkpoints ship (`re:.*lm_head`,
    `re:model.layers.\\d+.mlp.gate$`) have none of these: each repeat is one character class,
    which matches in time linear in the module path per starting point."""
    import re
    from re import _parser  # type: ignore[attr-defined]

    if len(pattern) > 1000:
        raise BstarError(f"{where}: regex of {len(pattern)} characters (at most 1000)")
    try:
        tree = _parser.parse(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise BstarError(f"{where}: not a valid regex {pattern[:80]!r} ({e})") from None

    repeats = [0]

    def walk(sub: Any, in_repeat: bool) -> None:
        for op, av in sub:
            name = str(op)
            if name in _REPEATS:
                _lo, hi, body = av
                if in_repeat and hi != 1:
                    _refuse("a repeat inside a repeat")
                repeats[0] += hi != 1
                if repeats[0] > MAX_REGEX_REPEATS:
                    # k repeats in a row try ~C(n + k, k) splits of an n-character path.
                    _refuse(f"more than {MAX_REGEX_REPEATS} repeats")
                walk(body, in_repeat or hi != 1)
            elif name == "BRANCH":
                if in_repeat:
                    _refuse("alternatives under a repeat")
                for b in av[1]:
                    walk(b, in_repeat)
            elif name in ("GROUPREF", "GROUPREF_EXISTS"):
                _refuse("a backreference")
            elif name == "SUBPATTERN":
                walk(av[3], in_repeat)
            elif name in ("ASSERT", "ASSERT_NOT", "ATOMIC_GROUP"):
                walk(av[1] if name != "ATOMIC_GROUP" else av, in_repeat)

    def _refuse(why: str) -> None:
        raise BstarError(f"{where}: regex {pattern[:80]!r} has {why}, which Python's re can "
                         "take exponential time to match; write it without one")

    walk(tree, False)


def _compressed_tensors(q: Mapping[str, Any], where: str) -> str | None:
    """compressed-tensors' weight scheme (W4A16 / W8A16 pack-quantized, W8A8 int8, FP8,
    NVFP4) when every config group uses the same one; None otherwise."""
    groups = q.get("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        return None
    names = set()
    for g in groups.values():
        w = g.get("weights") if isinstance(g, Mapping) else None
        if not isinstance(w, Mapping):
            return None
        nb, typ = w.get("num_bits"), str(w.get("type", "int"))
        strategy = str(w.get("strategy", "tensor"))
        gs = w.get("group_size") or 0
        if not isinstance(gs, int):
            raise BstarError(f"{where}: compressed-tensors group_size must be an integer")
        if typ == "float" and nb == 8:
            names.add({"tensor": "fp8-tensor", "channel": "fp8", "block": "fp8-block"}
                      .get(strategy, ""))
        elif typ == "float" and nb == 4:
            names.add("nvfp4" if strategy in ("tensor_group", "group") and gs == 16 else "")
        elif typ == "int" and nb in (4, 8):
            if strategy == "channel":
                names.add("int8" if nb == 8 else "w4a16-g0")
            elif strategy == "group" and gs > 0:
                names.add(f"w{nb}a16-g{gs}" + ("" if w.get("symmetric", True) else "-asym"))
            else:
                names.add("")
        else:
            names.add("")
    if len(names) != 1 or "" in names:
        return None
    return names.pop()

