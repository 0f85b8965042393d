"""Expert parallel and attention data parallel: the arithmetic `bstar.step` prices them with
(issue 38; docs/cost-model.md, "Expert and attention data parallel"). Pure, no I/O.

- the busiest expert-parallel rank: the expected maximum over ranks of the tokens the router
  sends a rank (`routed_tokens_max_ratio`) and of the experts it touches
  (`experts_touched_max_fraction`), under uniform independent top-k routing;
- the all-to-all's copies per token (`dispatch_sends_per_token`);
- a deployment's communication per step (`comm_terms`): the attention all-reduces inside a
  rank and the MoE layers' exchange between data-parallel ranks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from bstar.deployment import Deployment

FloatArray = npt.NDArray[np.float64]


def expert_fraction_read(batch: npt.ArrayLike, top_k: int, num_experts: int) -> FloatArray:
    """Expected fraction of a layer's experts that at least one of B tokens routes to,
    assuming uniform independent routing: 1 - (1 - k/E)^B."""
    return 1.0 - (1.0 - top_k / num_experts) ** np.asarray(batch, dtype=np.float64)


def allreduce_rounds(num_gpus: int) -> float:
    """Latency units of one small all-reduce over `num_gpus` GPUs: log2(N), 1 at N = 2.

    A decode step's all-reduces carry kilobytes, so their time is latency, and a latency-bound
    all-reduce is log2(N) dependent exchange rounds (recursive doubling / a tree), each ending
    when the slowest rank arrives (docs/cost-model.md, "Tensor parallel")."""
    return math.log2(num_gpus) if num_gpus > 1 else 0.0


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] by Blom's approximation,
    Phi^-1((n - 0.375) / (n + 0.25)): 1.43 at n = 8 (exact 1.424), 0.59 at n = 2 (exact
    0.564); 0 at n = 1."""
    if n <= 1:
        return 0.0
    from statistics import NormalDist

    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def routed_tokens_max_ratio(tokens: npt.ArrayLike, top_k: int, num_experts: int,
                            ranks: int) -> FloatArray:
    """Expected maximum over `ranks` expert-parallel ranks of the tokens the router sends a
    rank, over its mean (T k / ranks), for T = `tokens` each choosing top_k distinct experts
    of num_experts uniformly (E / ranks experts a rank). A token sends a rank a
    hypergeometric count, mean k / ranks, variance k (m / E)(1 - m / E)(E - k)/(E - 1) with
    m = E / ranks; over T independent tokens the rank's count is about normal, and the
    maximum over ranks is mean + z_ranks x sd (`expected_max_normal`; the ranks' small
    negative correlation is ignored: it errs high). Capped at T x min(k, m) (every token's
    experts on one rank). 1 for one rank or no tokens; -> 1 as T grows (sd / mean ~
    1 / sqrt(T)). Routing skew (hot experts) is not modelled: uniform routing is the floor."""
    t = np.asarray(tokens, dtype=np.float64)
    if ranks <= 1 or num_experts <= 0:
        return np.ones_like(t)
    e, k = float(num_experts), float(top_k)
    m = e / ranks
    mean = t * k / ranks
    var = t * k * (m / e) * (1.0 - m / e) * (e - k) / max(e - 1.0, 1.0)
    hi = np.minimum(mean + expected_max_normal(ranks) * np.sqrt(var), t * min(k, m))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(t > 0, hi / np.where(mean > 0, mean, 1.0), 1.0)


def experts_touched_max_fraction(tokens: npt.ArrayLike, top_k: int, num_experts: int,
                                 ranks: int) -> FloatArray:
    """Expected maximum over `ranks` expert-parallel ranks of the fraction of a rank's own
    experts that at least one of T tokens routes to: each of its m = E / ranks experts is
    touched with p = 1 - (1 - k/E)^T (`expert_fraction_read`); the rank's count is about
    binomial(m, p), its maximum over ranks mean + z_ranks x sd (`expected_max_normal`),
    capped at m. The step reads the weights of the rank that touched the most. With one
    rank, `expert_fraction_read`."""
    p = expert_fraction_read(tokens, top_k, num_experts)
    if ranks <= 1:
        return p
    m = num_experts / ranks
    hi = np.minimum(m, m * p + expected_max_normal(ranks) * np.sqrt(m * p * (1.0 - p)))
    return np.asarray(hi / m, dtype=np.float64)


def dispatch_sends_per_token(top_k: int, num_experts: int, ranks: int) -> float:
    """Expected number of OTHER expert-parallel ranks a token's top-k experts sit on (the
    copies an all-to-all dispatch sends, and the combine returns): (ranks - 1) x P(a given
    rank holds one of its experts) = (ranks - 1)(1 - C(E - m, k) / C(E, k)), m = E / ranks."""
    if ranks <= 1 or num_experts <= 0:
        return 0.0
    m = num_experts // ranks
    miss = 1.0
    for i in range(top_k):  # C(E - m, k) / C(E, k) as a product
        miss *= max(num_experts - m - i, 0) / (num_experts - i)
    return (ranks - 1) * (1.0 - miss)


def comm_terms(d: Deployment) -> tuple[float, float]:
    """(link seconds per token of a step, latency rounds per step) of `d`'s communication,
    per GPU: the attention's two all-reduces per layer inside each data-parallel rank and,
    with attention data parallel, the MoE layers' exchange between ranks."""
    m, g, n = d.model, d.gpu, d.num_gpus
    dp, ta, ep = d.data_parallel, d.attention_tp, d.expert_parallel
    comm_per_token = 0.0
    rounds = 0.0
    if n > 1:
        if g.interconnect_bytes_s <= 0:
            from bstar.errors import BstarError

            raise BstarError(f"{g.id} has no interconnect bandwidth in its spec; cannot "
                             "model tensor parallel")
        link = g.interconnect_bytes_s / 2  # one direction of the datasheet's total
        act = m.hidden_size * 2  # one token's bf16 hidden state
        # Two all-reduces per layer of the rank's B/dp x hidden activations over its ta GPUs;
        # a ring moves 2(ta-1)/ta of the message over each link direction.
        if ta > 1:
            comm_per_token = 2 * m.num_layers * 2 * (ta - 1) / ta * act / link / dp
            rounds = 2 * m.num_layers * allreduce_rounds(ta)
        moe = m.num_moe_layers if m.is_moe else 0
        if dp > 1 and moe:
            if ep > 1:
                # EP all-to-all per MoE layer: a GPU dispatches its T/n tokens to the other
                # ranks holding their experts and the combine returns them (one exchange
                # round each way on a switched link: latency x 2 per MoE layer).
                sends = dispatch_sends_per_token(m.num_experts_per_tok, m.num_experts, ep)
                comm_per_token += moe * 2 * sends * act / link / n
                rounds += 2 * moe
            else:
                # Tensor-parallel experts under attention DP: all-gather the ranks' tokens
                # and reduce-scatter the outputs over the n GPUs (ring: (n-1)/n each).
                comm_per_token += moe * 2 * (n - 1) / n * act / link
                rounds += 2 * moe * allreduce_rounds(n)
    return comm_per_token, rounds
