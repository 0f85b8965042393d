"""Time of one engine step with a mixed batch (prefill chunks + decode tokens), for the
simulator and the capacity search.

No arithmetic of its own: `StepCoefficients` binds a deployment's per-GPU constants
(`bstar.step.StepShape`) to its efficiencies, and every step is priced by `bstar.step.price`,
the same function the plan's curve (`roofline.decode_step`), prefill (`roofline.prefill_s`)
and calibration use. So:

- a step of B decode sequences all at context s costs `roofline.decode_step(d, [B], s)`;
- a step that prefills one prompt of n tokens from scratch costs `roofline.prefill_s(d, n)`.

Per step, over the scheduled sequences i, each computing n_i new tokens on top of c_i already
in the KV cache (decode: n_i = 1; a prompt chunk: n_i > 1), the work is: T = sum n_i tokens
through the weight GEMMs (weights read once), decode attention over sum_dec held(c_i + 1),
and each chunk's attention over its causal area reading its keys once per 128-query tile
(bstar.step has the formula). A small chunk's GEMM rows are priced by the soft roof of the
weight GEMMs, not hidden under the weight read by one max over the step (measured: a
128-token chunk on 64 decoding sequences adds 2.0 ms on an H200; docs/cost-model.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from bstar import step as st
from bstar.deployment import Deployment

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class StepCoefficients:
    """A deployment's step shape and efficiencies: what the simulator prices steps with."""

    shape: st.StepShape
    eff: Any  # Efficiency, or a mapping of its fields

    def decode_step_s(self, num_seqs: npt.ArrayLike,
                      held_sums: tuple[npt.ArrayLike, ...] | None = None) -> FloatArray:
        """Pure-decode steps of `num_seqs` sequences whose held tokens sum, per layer group,
        to `held_sums` (None: no tokens held, the floor of a step)."""
        b = np.atleast_1d(np.asarray(num_seqs, dtype=np.float64))
        if held_sums is None:
            held_sums = tuple(np.zeros_like(b) for _ in self.shape.groups)
        return st.price(self.shape.decode_held(b, held_sums), self.eff)

    def decode_run_step_s(self, start_tokens: npt.ArrayLike, num_steps: int) -> FloatArray:
        """Times of `num_steps` consecutive pure-decode steps of the same sequences."""
        return st.price(self.shape.decode_run(start_tokens, num_steps), self.eff)

    def step_work(self, start_tokens: npt.ArrayLike, new_tokens: npt.ArrayLike) -> st.StepWork:
        return self.shape.scheduled(start_tokens, new_tokens)

    def batch_step_s(self, start_tokens: npt.ArrayLike, new_tokens: npt.ArrayLike) -> float:
        """One step over sequences each computing `new_tokens` on top of `start_tokens`."""
        if np.asarray(new_tokens).size == 0:
            return 0.0
        return float(st.price(self.shape.scheduled(start_tokens, new_tokens), self.eff)[0])


def coefficients(d: Deployment) -> StepCoefficients:
    """The simulator's step pricer for a deployment (its shape, its efficiencies)."""
    return StepCoefficients(st.shape(d), st.params_dict(d.eff))
