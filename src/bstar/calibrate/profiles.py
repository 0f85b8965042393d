"""The calibration profile file: written from a `Calibration` (`profile_toml`), read back
as a `Profile` that `--profile FILE` applies to a deployment (`load_profile`: a small TOML
reader, the only I/O of bstar.calibrate)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from bstar import safeio
from bstar.calibrate.params import MAX_EFF_MEASURED, _eff_dict, scaled
from bstar.calibrate.results import Calibration
from bstar.deployment import (
    BEHAVIOUR_FIELDS,
    EFFICIENCY_FIELDS,
    Deployment,
    Efficiency,
    EngineBehaviour,
    split_values,
)
from bstar.errors import BstarError


def profile_toml(c: Calibration) -> str:
    """The calibration profile (TOML): GPU x engine x version, efficiencies, overheads,
    their uncertainty, the fit quality, the source and every point's residual."""
    def val(x: Any) -> str:
        if x is None:
            return '"n/a"'
        if isinstance(x, bool):
            return "true" if x else "false"
        if isinstance(x, int):
            return str(x)
        if isinstance(x, float):
            return repr(x) if math.isfinite(x) else '"n/a"'
        return json.dumps(str(x), ensure_ascii=True)

    lines = ["# bstar calibration profile (`bstar calibrate`); use with --profile THIS_FILE",
             "[profile]"]
    for k, x in (("gpu", c.gpu), ("engine", c.engine), ("engine_version", c.engine_version),
                 ("model", c.model), ("num_gpus", c.num_gpus),
                 ("weight_dtype", c.weight_dtype), ("kv_dtype", c.kv_dtype),
                 ("source", c.source),
                 ("created", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))):
        lines.append(f"{k} = {val(x)}")
    values = _eff_dict(c.eff, c.behaviour)
    lines.append("\n[efficiency]")
    for k, x in values.items():
        if k in EFFICIENCY_FIELDS:
            lines.append(f"{k} = {val(x)}")
    # The shape of the model the values belong to (not fitted).
    k = c.eff.roof_sharpness
    lines.append(f"roof_sharpness = {'inf' if math.isinf(k) else val(float(k))}")
    lines.append(f"grouped = {val(c.eff.grouped)}")
    lines.append("\n[behaviour]  # the engine outside a step; a field not named keeps "
                 "the engine profile's")
    for k, x in values.items():
        if k in BEHAVIOUR_FIELDS:
            lines.append(f"{k} = {val(x)}")
    lines.append("\n[gpu_scale]  # the engine beats the (probed) GPU figures by these factors")
    lines.append(f"bandwidth = {val(c.bandwidth_scale)}")
    lines.append(f"compute = {val(c.compute_scale)}")
    lines.append("\n[uncertainty]  # 1 sigma; n/a = not fitted, not identified or at a bound")
    for k, p in c.params.items():
        lines.append(f"{k} = {val(p.std)}")
    lines.append("\n[fit]")
    lines.append(f"fitted = {json.dumps([k for k, p in c.params.items() if p.fitted])}")
    lines.append(f"median_abs_error = {val(c.median_abs_error)}")
    lines.append(f"max_abs_error = {val(c.max_abs_error)}")
    lines.append(f"uncalibrated_median_abs_error = {val(c.uncalibrated_median_abs_error)}")
    lines.append(f"notes = {json.dumps(list(c.notes))}")
    if c.reserve_bytes is not None:
        lines.append("\n[memory]  # from the engine's start-up log")
        lines.append(f"reserve_bytes = {c.reserve_bytes}")
        lines.append(f"kv_pool_bytes = {val(c.kv_pool_bytes)}")
    for p in c.points:
        lines += ["\n[[points]]", f"batch = {p.batch}", f"context_tokens = {p.context_tokens}",
                  f"measured_ms = {val(p.measured_ms)}", f"predicted_ms = {val(p.predicted_ms)}",
                  f"rel_error = {val(p.rel_error)}"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Profile:
    """A profile file: `values` are the fields it names (of Efficiency or EngineBehaviour);
    `apply` sets exactly those, the others keep the deployment's (its engine profile's)."""

    values: tuple[tuple[str, Any], ...]
    gpu: str
    engine: str
    engine_version: str
    reserve_bytes: int | None
    path: str
    bandwidth_scale: float = 1.0
    compute_scale: float = 1.0
    # The [power] table (bstar.calibrate.power): idle_w and exponent fitted to the sweep's
    # GPU power; empty when the sweep stored none.
    power: tuple[tuple[str, float], ...] = ()

    @property
    def eff(self) -> Efficiency:
        """Efficiency's defaults with the profile's efficiency values."""
        return replace(Efficiency(), **{k: v for k, v in self.values
                                        if k in EFFICIENCY_FIELDS})

    def apply(self, d: Deployment) -> Deployment:
        d = d.with_values(dict(self.values))
        if self.power:
            pw = dict(self.power)
            d = replace(d, gpu=replace(
                d.gpu, idle_w=max(pw["idle_w"], 0.1), power_exponent=pw["exponent"],
                power_source=f"calibrated: idle and exponent fitted to a sweep's GPU power "
                             f"({self.path}); TDP from the datasheet"))
        return scaled(d, d.eff, self.bandwidth_scale, self.compute_scale)


def _defaults(record: type) -> dict[str, Any]:
    inst = record()
    return {f.name: getattr(inst, f.name) for f in fields(record)}


def _table_values(p: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The [efficiency] and [behaviour] tables' values, checked against their records
    (profiles written before [behaviour] existed named its fields under [efficiency])."""
    eff_tab = data.get("efficiency")
    if not isinstance(eff_tab, dict):
        raise BstarError(f"{p}: not a bstar calibration profile (no [efficiency] table)")
    beh_tab = data.get("behaviour", {})
    if not isinstance(beh_tab, dict):
        raise BstarError(f"{p}: [behaviour] must be a table")
    unknown = set(eff_tab) - {*EFFICIENCY_FIELDS, *BEHAVIOUR_FIELDS}
    if unknown:
        raise BstarError(f"{p}: unknown efficiency field(s) {', '.join(sorted(unknown))}")
    unknown = set(beh_tab) - set(BEHAVIOUR_FIELDS)
    if unknown:
        raise BstarError(f"{p}: unknown behaviour field(s) {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for k, x in {**eff_tab, **beh_tab}.items():
        want = type(_defaults(EngineBehaviour if k in BEHAVIOUR_FIELDS else Efficiency)[k])
        if want is bool:
            if not isinstance(x, bool):
                raise BstarError(f"{p}: {k} must be true or false")
            values[k] = x
            continue
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise BstarError(f"{p}: {k} must be a number, got {str(x)[:40]!r}")
        values[k] = float(x) if want is float else x
    e, b = split_values(values)
    try:  # the records check their own values
        replace(Efficiency(), **e)
        replace(EngineBehaviour(), **b)
    except BstarError as err:  # the one schema: deployment.FIELD_RANGES
        raise BstarError(f"{p}: {err}") from None
    return values


def load_profile(path: str | Path) -> Profile:
    p = Path(path)
    return profile_from_data(p, safeio.load_toml(p, what="profile (TOML)"))


def profile_from_text(path: str | Path, text: str) -> Profile:
    """What `load_profile` would read from a file holding `text` (`calibrate -o` checks the
    profile it is about to write with this: what bstar writes, bstar reads back)."""
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise BstarError(f"{path}: not TOML ({e})") from None
    return profile_from_data(Path(path), data)


def profile_from_data(p: Path, data: dict[str, Any]) -> Profile:
    """A parsed profile, checked: every value against the records' one schema
    (deployment.FIELD_RANGES), errors naming the file and the field."""
    values = _table_values(p, data)
    prof, mem, sc = (data.get(k, {}) for k in ("profile", "memory", "gpu_scale"))
    for name, tab in (("profile", prof), ("memory", mem), ("gpu_scale", sc)):
        if not isinstance(tab, dict):
            raise BstarError(f"{p}: [{name}] must be a table")
    reserve = mem.get("reserve_bytes")
    if reserve is not None and (isinstance(reserve, bool)
                                or not isinstance(reserve, int | float)
                                or not 0 <= reserve <= 2**50):
        raise BstarError(f"{p}: memory.reserve_bytes must be a number of bytes in 0..2**50, "
                         f"got {reserve!r}")
    try:
        bs, cs = float(sc.get("bandwidth", 1.0)), float(sc.get("compute", 1.0))
    except (TypeError, ValueError):
        raise BstarError(f"{p}: gpu_scale values must be numbers") from None
    if not (1.0 <= bs <= MAX_EFF_MEASURED and 1.0 <= cs <= MAX_EFF_MEASURED):
        raise BstarError(f"{p}: gpu_scale must be in [1, {MAX_EFF_MEASURED:g}]")
    for k in ("gpu", "engine", "engine_version"):
        if not isinstance(prof.get(k, ""), str):
            raise BstarError(f"{p}: profile.{k} must be a string")
    return Profile(tuple(values.items()), str(prof.get("gpu", "")), str(prof.get("engine", "")),
                   str(prof.get("engine_version", "")),
                   int(reserve) if isinstance(reserve, int | float) else None, str(p), bs, cs,
                   _power_table(p, data.get("power")))


def _power_table(p: Path, tab: Any) -> tuple[tuple[str, float], ...]:
    """The [power] table's idle_w and exponent, checked (absent: no power fit)."""
    if tab is None:
        return ()
    if not isinstance(tab, dict):
        raise BstarError(f"{p}: [power] must be a table")
    out = []
    for k, lo, hi in (("idle_w", 0.0, 10_000.0), ("exponent", 0.1, 10.0)):
        v = tab.get(k)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi \
                or not math.isfinite(v):
            raise BstarError(f"{p}: power.{k} must be a number in {lo:g}..{hi:g}, got {v!r}")
        out.append((k, float(v)))
    return tuple(out)
