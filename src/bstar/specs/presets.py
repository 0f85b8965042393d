"""Model lookup: a local config.json (or its folder), a bundled preset, or a hub id."""

from __future__ import annotations

import json
import os
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

from bstar.errors import BstarError, closest
from bstar.specs.model import (
    ASSUME_ENV,
    ModelSpec,
    fetch_hub_config,
    from_hf_config,
    load_config_file,
)


@dataclass(frozen=True, slots=True)
class PresetInfo:
    id: str
    hf_repo: str
    source: str
    aliases: tuple[str, ...]
    published_params: float
    published_active_params: float
    published_params_source: str
    # The checkpoint's published size in bytes (its files' weights) and where it is given;
    # 0 when none was recorded. tests/test_model_zoo.py checks bstar's bytes against it.
    published_checkpoint_bytes: int = 0
    published_checkpoint_source: str = ""
    published_checkpoint_rounding: int = 0
    # "no-input-embedding": the published active count leaves the input embedding out.
    active_convention: str = ""
    # Unit of the last digit of a rounded published figure (0: an exact count).
    published_rounding: float = 0.0
    published_active_rounding: float = 0.0


@cache
def model_index() -> dict[str, PresetInfo]:
    root = resources.files("bstar.presets").joinpath("models")
    data = tomllib.loads(root.joinpath("index.toml").read_text())
    out = {}
    for k, v in data.items():
        total = float(v["published_params"])
        active = float(v.get("published_active_params", total))
        # A dense model's active figure is its total, rounded the same way.
        active_rounding = v.get("published_active_rounding",
                                v.get("published_rounding", 0.0) if active == total else 0.0)
        out[k] = PresetInfo(
            id=k, hf_repo=v["hf_repo"], source=v["source"],
            aliases=tuple(v.get("aliases", ())), published_params=total,
            published_active_params=active,
            published_params_source=v.get("published_params_source", ""),
            published_rounding=float(v.get("published_rounding", 0.0)),
            published_active_rounding=float(active_rounding),
            published_checkpoint_bytes=int(v.get("published_checkpoint_bytes", 0)),
            published_checkpoint_source=v.get("published_checkpoint_source", ""),
            published_checkpoint_rounding=int(v.get("published_checkpoint_rounding", 0)),
            active_convention=v.get("active_convention", ""))
    return out


def _resolve_preset(name: str) -> str | None:
    key = name.lower()
    index = model_index()
    if key in index:
        return key
    for pid, info in index.items():
        if key in info.aliases or key == info.hf_repo.lower():
            return pid
    return None


def get_model(name: str, assume_unmodeled: bool | None = None) -> ModelSpec:
    """`name` is a path to a config.json or its folder, a preset id or alias, or (online
    only) a Hugging Face repo id. `assume_unmodeled` (None: BSTAR_ASSUME_UNMODELED=1 in the
    environment) reads a config with a layer kind, quantization method or key bstar does not
    model on the stated assumption instead of refusing it (docs/models.md)."""
    assume = (os.environ.get(ASSUME_ENV, "") not in ("", "0") if assume_unmodeled is None
              else assume_unmodeled)
    p = Path(name).expanduser()
    if p.exists():
        cfg = load_config_file(p)
        label = (p if p.is_dir() else p.parent).name or str(p)
        return from_hf_config(cfg, name=label, source=str(p), assume_unmodeled=assume)
    pid = _resolve_preset(name)
    if pid is not None:
        root = resources.files("bstar.presets").joinpath("models")
        cfg = json.loads(root.joinpath(f"{pid}.json").read_text())
        return from_hf_config(cfg, name=pid, source=model_index()[pid].source,
                              assume_unmodeled=assume)
    if name.endswith(".json") or name.startswith((".", "/", "~")):
        raise BstarError(f"{name}: no such file")
    if name.count("/") == 1:
        return from_hf_config(fetch_hub_config(name), name=name.split("/")[1],
                              source=f"hf:{name}", assume_unmodeled=assume)
    names = list(model_index()) + [a for i in model_index().values() for a in i.aliases]
    raise BstarError(f"unknown model {name!r}" + closest(name, names)
                     + " (see `bstar models`; or give a config.json path)")
