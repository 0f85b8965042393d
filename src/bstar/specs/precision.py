"""Weight and KV-cache precisions, and the exact bytes they take.

Quantized formats carry scales (and zero points) per group of weights; those bytes are
counted, because at 4 bits they add ~3% to the weights that decode streams every step.
"""

from __future__ import annotations

import math
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

    def tensor_bytes(self, rows: int, cols: int) -> int:
        """Exact bytes of a rows x cols weight matrix (cols = input features)."""
        value_bits = rows * cols * self.bits
        scale_bits = 0
        if self.scale_bits_per_group:
            groups_per_row = math.ceil(cols / self.group_size) if self.group_size else 1
            row_blocks = math.ceil(rows / self.block_rows)
            scale_bits = row_blocks * groups_per_row * self.scale_bits_per_group
        return math.ceil((value_bits + scale_bits) / 8)

    def value_bytes(self, count: int) -> int:
        """Exact bytes of `count` unscaled values (norms, biases, KV entries)."""
        return math.ceil(count * self.bits / 8)


# W4A16 (AWQ/GPTQ style): 4-bit weights, a fp16 scale and a 4-bit zero point per 128 inputs.
# int8 / fp8 weights: per-output-channel fp32 scales (group = whole row).
# DeepSeek-V3's native fp8 ("weight_block_size": [128, 128]) has one fp32 scale per 128x128 block.
_PRECISIONS: dict[str, Precision] = {
    "fp32": Precision("fp32", 32, compute="bf16"),
    "bf16": Precision("bf16", 16, compute="bf16"),
    "fp16": Precision("fp16", 16, compute="fp16"),
    "fp8": Precision("fp8", 8, scale_bits_per_group=32, compute="fp8"),
    "fp8-block": Precision("fp8-block", 8, group_size=128, block_rows=128,
                           scale_bits_per_group=32, compute="fp8"),
    "int8": Precision("int8", 8, scale_bits_per_group=32, compute="int8"),
    "int4": Precision("int4", 4, group_size=128, scale_bits_per_group=16 + 4, compute="fp16"),
}
_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "w8a8": "int8", "w4a16": "int4", "awq": "int4", "gptq": "int4", "float8": "fp8",
    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
}
WEIGHT_DTYPES = ("bf16", "fp16", "fp8", "int8", "int4")
KV_DTYPES = ("bf16", "fp16", "fp8")


def get_precision(name: str, *, allowed: tuple[str, ...] | None = None) -> Precision:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in _PRECISIONS or (allowed is not None and key not in allowed and key != "fp32"):
        pool = allowed or tuple(_PRECISIONS)
        raise BstarError(f"unknown precision {name!r} (one of: {', '.join(pool)})"
                         + closest(name, pool))
    return _PRECISIONS[key]
