"""Engine profiles: bundled priors for the engine-side terms of the cost model.

`--engine NAME` starts the cost model from the profile's values instead of the generic
defaults of `bstar.Efficiency` and `bstar.deployment.EngineBehaviour`. A profile holds what
the engine decides: its CPU time per step and per running sequence, the fixed per-layer
kernel costs, whether its attention materialises scores, its all-reduce latency (Efficiency);
its work per request and whether it schedules a step ahead (EngineBehaviour, the TOML's
`behaviour` table); and a GPU-side rate where its kernels differ from the generic ones and
data show it (vllm's paged attention KV stream). Each profile in
`presets/engines.toml` names its source and says whether its values were fitted to public
measurements (`basis = "fitted"`) or are a stated guess (`basis = "guess"`).
Pure: reads only the bundled TOML.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources

from bstar.deployment import BEHAVIOUR_FIELDS, EFFICIENCY_FIELDS, Efficiency, EngineBehaviour
from bstar.errors import BstarError

DEFAULT_ENGINE = "vllm"


@dataclass(frozen=True, slots=True)
class EngineProfile:
    name: str
    title: str
    basis: str  # "fitted" or "guess"
    source: str
    values: tuple[tuple[str, float], ...]  # Efficiency fields this profile sets
    aliases: tuple[str, ...] = ()
    note: str = ""
    behaviour_values: tuple[tuple[str, float], ...] = ()  # EngineBehaviour fields it sets

    def apply(self, eff: Efficiency) -> Efficiency:
        """`eff` with this profile's efficiency values."""
        return replace(eff, **dict(self.values))

    def efficiency(self) -> Efficiency:
        return self.apply(Efficiency())

    def behaviour(self) -> EngineBehaviour:
        """EngineBehaviour's defaults with this profile's values."""
        return replace(EngineBehaviour(), **{k: type(getattr(EngineBehaviour(), k))(v)
                                             for k, v in self.behaviour_values})


@cache
def engine_profiles() -> dict[str, EngineProfile]:
    text = resources.files("bstar.presets").joinpath("engines.toml").read_text()
    out = {}
    for name, tab in tomllib.loads(text).items():
        vals, beh = tab.get("efficiency", {}), tab.get("behaviour", {})
        unknown = (set(vals) - set(EFFICIENCY_FIELDS)) | (set(beh) - set(BEHAVIOUR_FIELDS))
        if unknown:
            raise BstarError(f"engines.toml [{name}]: unknown field(s) {sorted(unknown)}")
        if tab.get("basis") not in ("fitted", "guess"):
            raise BstarError(f"engines.toml [{name}]: basis must be 'fitted' or 'guess'")
        out[name] = EngineProfile(name, str(tab["title"]), str(tab["basis"]),
                                  str(tab["source"]),
                                  tuple((k, float(v)) for k, v in vals.items()),
                                  tuple(tab.get("aliases", ())), str(tab.get("note", "")),
                                  tuple((k, float(v)) for k, v in beh.items()))
    return out


def get_engine(name: str | None) -> EngineProfile:
    """A profile by name or alias (case-insensitive); None or "" = the default (vLLM)."""
    key = (name or DEFAULT_ENGINE).lower().strip()
    profiles = engine_profiles()
    for p in profiles.values():
        if key == p.name or key in p.aliases:
            return p
    raise BstarError(f"unknown engine {name!r} (one of: {', '.join(profiles)})")
