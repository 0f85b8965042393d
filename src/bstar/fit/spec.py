"""The physical reading of a fit's terms: from a model (and GPU), the weight, KV and FLOP
figures that turn a, b and c into bandwidths and FLOP/s, and the cost model's compute term
that gives an unseen roof (`spec_terms`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bstar.errors import BstarError

if TYPE_CHECKING:
    from bstar.options import DeploymentOptions


def spec_terms(options: DeploymentOptions, context_tokens: int | None = None
               ) -> dict[str, Any]:
    """From the model (and GPU) of `options`: the weight, KV and FLOP figures that give a,
    b and c a physical reading, and with a GPU the cost model's compute term, ms per
    sequence, at `context_tokens` (default 512). Empty without a model."""
    if options.model is None:
        if options.gpu is not None:
            raise BstarError("--gpu needs --model: the compute term is the model's FLOPs at "
                             "the GPU's peak")
        return {}
    from bstar.specs.precision import get_precision
    from bstar.specs.presets import get_model

    m = get_model(options.model, options.assume_unmodeled or None)
    ctx = context_tokens or 512
    kv = get_precision(options.kv_dtype)
    out: dict[str, Any] = {
        "weight_bytes": m.weight_bytes(get_precision(options.weight_dtype or m.default_dtype)),
        "flops_per_token": float(2 * m.matmul_params_per_token
                                 + m.attention_flops_per_token(ctx)),
        "context": ctx, "model_name": m.name}
    if context_tokens is not None:
        out["kv_bytes_per_seq"] = m.kv_bytes_per_seq(ctx, kv)
    if options.gpu is not None:
        from bstar import roofline as rl

        d = options.build()
        one = rl.decode_step(d, [1], ctx)
        out["compute_ms_per_seq"] = float(one.compute_s[0]) * 1e3
        out["gpu_name"] = d.gpu.id
        out["flops_eff"] = d.eff.compute
    return out
