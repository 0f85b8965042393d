"""Weight and KV-cache precisions, and the exact bytes they take.

Quantized formats carry scales (and zero points) per group of weights; those bytes are
counted, because at 4 bits they add 3-12% to the weights that decode streams every step.
docs/models.md gives each checkpoint format's layout and where it comes from.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from bstar.errors import BstarError, closest


@dataclass(frozen=True, slots=True)
class Precision:
    name: str
    bits: int  # bits per stored value
    # Scales: one per block of `block_rows` output rows x `group_size` inputs
    # (group_size 0: the whole row, i.e. per-channel). No scale bits: no scales.
    group_size: int = 0
    block_rows: int = 1
    scale_bits_per_group: int = 0
    # Matmul rate to use: "bf16", "fp16", "fp8" or "int8" (W4A16 computes in 16-bit).
    compute: str = "bf16"
    # bitsandbytes groups the flattened tensor (blocks of `group_size` values, not per row).
    flat: bool = False
    # A second level of scales: one of `super_bits` per `super_group` groups (bnb's double
    # quantization of its absmax values).
    super_group: int = 0
    super_bits: int = 0
    tensor_bits: int = 0  # per tensor: global scales, shapes (nvfp4, fp8 per tensor, ...)
    col_bits: int = 0  # per input feature: GPTQ's g_idx (int32)

    def tensor_bytes(self, rows: int, cols: int) -> int:
        """Exact bytes of a rows x cols weight matrix (cols = input features)."""
        value_bits = rows * cols * self.bits
        scale_bits = 0
        if self.scale_bits_per_group:
            if self.flat:
                groups = math.ceil(rows * cols / self.group_size)
            else:
                groups_per_row = math.ceil(cols / self.group_size) if self.group_size else 1
                groups = math.ceil(rows / self.block_rows) * groups_per_row
            scale_bits = groups * self.scale_bits_per_group
            if self.super_group:
                scale_bits += math.ceil(groups / self.super_group) * self.super_bits
        extra = self.tensor_bits + cols * self.col_bits
        return math.ceil((value_bits + scale_bits + extra) / 8)

    def value_bytes(self, count: int) -> int:
        """Exact bytes of `count` unscaled values (norms, biases, KV entries)."""
        return math.ceil(count * self.bits / 8)


# W4A16 (AWQ style): 4-bit weights, a fp16 scale and a 4-bit zero point per 128 inputs.
# int8 / fp8 weights: per-output-channel fp32 scales (group = whole row).
# DeepSeek-V3's native fp8 ("weight_block_size": [128, 128]) has one fp32 scale per 128x128 block.
# The checkpoint formats below are docs/models.md's table, one line each.
_PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", 32, compute="bf16"),
    "bf16": Precision("bf16", 16, compute="bf16"),
    "fp16": Precision("fp16", 16, compute="fp16"),
    "fp8": Precision("fp8", 8, scale_bits_per_group=32, compute="fp8"),
    "fp8-block": Precision("fp8-block", 8, group_size=128, block_rows=128,
                           scale_bits_per_group=32, compute="fp8"),
    # fp8 with one fp32 weight scale per tensor (HF "fp8" without blocks, compressed-tensors
    # strategy "tensor", ModelOpt FP8) and its static input scale.
    "fp8-tensor": Precision("fp8-tensor", 8, tensor_bits=64, compute="fp8"),
    "int8": Precision("int8", 8, scale_bits_per_group=32, compute="int8"),
    "int4": Precision("int4", 4, group_size=128, scale_bits_per_group=16 + 4, compute="fp16"),
    # OCP MXFP4 (gpt-oss): e2m1 values, one e8m0 scale per 32 inputs.
    "mxfp4": Precision("mxfp4", 4, group_size=32, scale_bits_per_group=8, compute="bf16"),
    # NVFP4 (ModelOpt, compressed-tensors nvfp4-pack-quantized): e2m1 values, one e4m3 scale
    # per 16 inputs, a fp32 global weight scale and a fp32 input scale per tensor.
    "nvfp4": Precision("nvfp4", 4, group_size=16, scale_bits_per_group=8, tensor_bits=64,
                       compute="bf16"),
    # bitsandbytes: NF4/FP4 in blocks of 64 of the flattened tensor, a fp32 absmax per block;
    # with double quantization the absmax is 8-bit with a fp32 scale per 256 blocks, plus
    # the 256-entry fp32 code table and its offset.
    "bnb4": Precision("bnb4", 4, group_size=64, scale_bits_per_group=32, flat=True,
                      tensor_bits=16 * 32, compute="bf16"),
    "bnb4-dq": Precision("bnb4-dq", 4, group_size=64, scale_bits_per_group=8, flat=True,
                         super_group=256, super_bits=32, tensor_bits=256 * 32 + 32 + 16 * 32,
                         compute="bf16"),
    # LLM.int8(): int8 rows, one fp32 scale (SCB) per output row.
    "bnb8": Precision("bnb8", 8, scale_bits_per_group=32, compute="int8"),
}
_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "w8a8": "int8", "w4a16": "int4", "awq": "int4", "gptq": "int4", "float8": "fp8",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "int4-g128": "int4",
    # The engines' spellings (vLLM --quantization / --kv-cache-dtype, SGLang, TensorRT-LLM,
    # ModelOpt's quant_algo): the same formats under other names.
    "fp8_e4m3fn": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "e4m3": "fp8",
    "fp8_ds_mla": "fp8", "modelopt_fp4": "nvfp4", "nvfp4_e2m1": "nvfp4", "mxfp4_e2m1": "mxfp4",
}
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4", "mxfp4", "nvfp4")
KV_DTYPES = ("bf16", "fp16", "fp8")
# Checkpoint formats a config's quantization_config names (bstar.specs.model): accepted as
# weight precisions wherever the weight dtypes are (the checkpoint's own is the default).
CHECKPOINT_DTYPES = ("fp8-block", "fp8-tensor", "bnb4", "bnb4-dq", "bnb8")
# Group-size families: int4-g32 (AWQ: fp16 scale + 4-bit zero per group), gptq4-g128 /
# gptq8-g0 (GPTQ: fp16 scale + zero per group, int32 g_idx per input; g0 = per channel),
# w4a16-g128[-asym] / w8a16-g128 (compressed-tensors pack-quantized: bf16 scales, zero
# points only when asymmetric, the int64 weight_shape per tensor).
_FAMILY = re.compile(r"^(int4|gptq4|gptq8|w4a16|w8a16)-g(\d+)(-asym)?$")


@functools.cache
def _family_precision(key: str) -> Precision | None:
    m = _FAMILY.match(key)
    if not m:
        return None
    fam, group, asym = m.group(1), int(m.group(2)), bool(m.group(3))
    if group > 1 << 20:
        return None
    if fam == "int4":
        return Precision(key, 4, group_size=group, scale_bits_per_group=16 + 4, compute="fp16")
    if fam.startswith("gptq"):
        bits = int(fam[-1])
        return Precision(key, bits, group_size=group, scale_bits_per_group=16 + bits,
                         col_bits=32, compute="fp16")
    bits = 4 if fam == "w4a16" else 8
    return Precision(key, bits, group_size=group,
                     scale_bits_per_group=16 + (bits if asym else 0), tensor_bits=128,
                     compute="bf16")


# A checkpoint's 4-bit float format: a table's or an engine's bare "fp4" names whichever of
# these the checkpoint is (InferenceMAX's `precision` column says fp4 for gpt-oss's MXFP4
# and for NVIDIA's NVFP4 DeepSeek-R1 alike).
FP4_FORMATS = ("mxfp4", "nvfp4")
# Names that mean "the checkpoint's own" (vLLM's and SGLang's `auto`).
_OWN = ("", "auto", "default")


def weight_dtype_for(name: str, checkpoint: str, where: str = "") -> str:
    """The weight precision that `name` (a flag's, a table's or an engine's spelling) means
    for a model whose checkpoint is `checkpoint` (its `default_dtype`): "" (the checkpoint's
    own) where the name is blank or `auto`, or names the family the checkpoint already is
    ("fp8" of an fp8-block checkpoint, "fp4" of an MXFP4 or NVFP4 one); else bstar's name
    for it. An unknown name, or "fp4" of a checkpoint that is no FP4 format (MXFP4 or NVFP4:
    say which), is refused with the list. docs/models.md ("Precision names")."""
    key = name.strip().lower()
    at = f"{where}: " if where else ""
    if key in _OWN:
        return ""
    own = get_precision(checkpoint)
    if key == "fp4":
        if own.name in FP4_FORMATS:
            return ""
        raise BstarError(f"{at}'fp4' is ambiguous for a {own.name} checkpoint: name "
                         f"the format ({', '.join(FP4_FORMATS)})")
    try:
        found = get_precision(key, allowed=(*WEIGHT_DTYPES, *CHECKPOINT_DTYPES, "fp32"))
    except BstarError as e:
        raise BstarError(f"{at}{e}") from None
    if found.name == own.name or (found.name == "fp8" and own.name.startswith("fp8")):
        return ""  # the checkpoint's own format, with its exact scales
    return found.name


def check_weight_dtype(name: str, where: str = "") -> None:
    """Refuse, with the list, a weight dtype name no checkpoint could mean (a table is read
    before its models are: `weight_dtype_for` then says what the name means for each)."""
    key = name.strip().lower()
    if key in _OWN or key == "fp4":
        return
    try:
        get_precision(key, allowed=(*WEIGHT_DTYPES, *CHECKPOINT_DTYPES, "fp32"))
    except BstarError as e:
        raise BstarError(f"{where}: {e}" if where else str(e)) from None


def kv_dtype_for(name: str, default: str = "bf16", where: str = "") -> str:
    """The KV-cache precision `name` means (vLLM's `--kv-cache-dtype` spellings: auto, fp8,
    fp8_e4m3, fp8_e5m2, ...): `default` where blank or auto; an unknown name is refused with
    the list."""
    key = name.strip().lower()
    if key in _OWN:
        return default
    try:
        return get_precision(key, allowed=(*KV_DTYPES, "fp32")).name
    except BstarError as e:
        raise BstarError(f"{where}: {e}" if where else str(e)) from None


def get_precision(name: str, *, allowed: tuple[str, ...] | None = None) -> Precision:
    key = _ALIASES.get(name.lower(), name.lower())
    found = _PRECISIONS.get(key) or _family_precision(key)
    weights = allowed is not None and "int4" in allowed  # a weight precision is asked for
    ok = found is not None and (allowed is None or key in allowed or key == "fp32"
                                or (weights and (key in CHECKPOINT_DTYPES
                                                 or key not in _PRECISIONS)))
    if not ok:
        pool = allowed or tuple(_PRECISIONS)
        raise BstarError(f"unknown precision {name!r} (one of: {', '.join(pool)})"
                         + closest(name, pool))
    assert found is not None
    return found
