"""The physical reading of a fit's terms: from a model (and GPU), the weight, KV and FLOP
figures that turn a, b and c into bandwidths and FLOP/s, and the cost model's compute term
that gives an unseen roof (`spec_terms`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bstar.deployment import Deployment
    from bstar.specs.model import ModelSpec
    from bstar.specs.precision import Precision


def spec_terms(m: ModelSpec, weight: Precision, kv: Precision,
               d: Deployment | None = None, context_tokens: int | None = None
               ) -> dict[str, Any]:
    """For model `m` at these weight and KV precisions: the weight, KV and FLOP figures that
    give a, b and c a physical reading, and with a deployment `d` (its GPU) the cost model's
    compute term, ms per sequence, at `context_tokens` (default 512). The caller names the
    model and builds the deployment (`options.DeploymentOptions.spec_terms`)."""
    ctx = context_tokens or 512
    out: dict[str, Any] = {
        "weight_bytes": m.weight_bytes(weight),
        "flops_per_token": float(2 * m.matmul_params_per_token
                                 + m.attention_flops_per_token(ctx)),
        "context": ctx, "model_name": m.name}
    if context_tokens is not None:
        out["kv_bytes_per_seq"] = m.kv_bytes_per_seq(ctx, kv)
    if d is not None:
        from bstar import roofline as rl

        one = rl.decode_step(d, [1], ctx)
        out["compute_ms_per_seq"] = float(one.compute_s[0]) * 1e3
        out["gpu_name"] = d.gpu.id
        out["flops_eff"] = d.eff.compute
    return out
