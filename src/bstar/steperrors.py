"""How well the cost model predicts measured mixed (prefill + decode) steps, calibrated two
ways: on the decode points only (what a decode sweep gives; the chunk terms and, when
every decode step is memory-bound, the compute rate stay at their priors), and on all the
points together (`bstar calibrate` on a points file with chunk columns). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bstar import calibrate as cal
from bstar import roofline as rl


@dataclass(frozen=True, slots=True)
class MixedErrors:
    points: tuple[cal.Point, ...]  # the chunked ones (mixed and prefill), in order
    decode_only: tuple[float, ...]  # relative errors, calibrated on the decode points
    joint: tuple[float, ...]  # calibrated on every point
    decode_cal: cal.Calibration
    joint_cal: cal.Calibration

    @staticmethod
    def _median(x: Sequence[float]) -> float:
        return float(np.median(np.abs(x)))

    @property
    def decode_only_median(self) -> float:
        return self._median(self.decode_only)

    @property
    def joint_median(self) -> float:
        return self._median(self.joint)

    @property
    def decode_only_max(self) -> float:
        return float(np.max(np.abs(self.decode_only)))

    @property
    def joint_max(self) -> float:
        return float(np.max(np.abs(self.joint)))


def decode_vs_joint(d: rl.Deployment, points: Sequence[cal.Point]) -> MixedErrors:
    """Errors on the points with a prompt chunk, calibrated on the decode points alone and
    on all points (calibrate's default parameters in both: the chunk terms join the
    joint fit)."""
    decode = [p for p in points if not p.mixed]
    chunked = [p for p in points if p.mixed]
    dec = cal.calibrate(d, decode)
    dec_err = tuple(p.rel_error for p in cal.check(d, dec.eff, chunked, dec.bandwidth_scale,
                                                   dec.compute_scale))
    joint = cal.calibrate(d, points)
    joint_err = tuple(p.rel_error for p in cal.check(d, joint.eff, chunked,
                                                     joint.bandwidth_scale,
                                                     joint.compute_scale))
    return MixedErrors(tuple(chunked), dec_err, joint_err, dec, joint)
