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

from bstar.deployment import (
    BEHAVIOUR_FIELDS,
    EFFICIENCY_FIELDS,
    KERNEL_FIELDS,
    Efficiency,
    EngineBehaviour,
    generic_kernel_terms,
)
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
    # The kernel path its KERNEL_FIELDS were fitted on ("": the profile sets none), and its
    # entries for other paths (bstar.deployment.kernel_path), each with its basis.
    kernel_path: str = ""
    kernels: tuple[KernelEntry, ...] = ()
    # Entries for one architecture's build of the engine (`[ENGINE.arch.ARCH]`).
    archs: tuple[ArchEntry, ...] = ()

    def arch_entry(self, arch: str) -> ArchEntry | None:
        """The entry for `arch` itself ("blackwell"), or for one attention kind on it
        ("blackwell:mla")."""
        return next((a for a in self.archs if a.arch == arch), None)

    def arch_entries(self, arch: str, mla: bool = False) -> tuple[ArchEntry, ...]:
        """The entries that price a deployment on `arch`: the architecture's own, then its
        entry for multi-head latent attention where the model has it (`mla`)."""
        keys = (arch, f"{arch}:mla") if mla else (arch,)
        return tuple(a for k in keys if (a := self.arch_entry(k)) is not None)

    def kernel_entry(self, path: str) -> KernelEntry | None:
        return next((k for k in self.kernels if k.path == path), None)

    def for_gpu(self, arch: str, path: str, mla: bool = False
                ) -> tuple[Efficiency, EngineBehaviour, str, str]:
        """(efficiencies, behaviour, the path their kernel terms belong to, the basis in
        words) for a deployment on a GPU of architecture `arch` whose linears take kernel
        path `path`: the profile's terms, with its entries for `arch` over them where it has
        them (`arch_entries`: the MLA one only for a model with multi-head latent attention,
        `mla`), and the kernel terms of `for_path`."""
        eff, terms_path, basis = self.for_path(path)
        beh = self.behaviour()
        for a in self.arch_entries(arch, mla):
            eff = replace(eff, **dict(a.values))
            beh = replace(beh, **{k: type(getattr(beh, k))(v) for k, v in a.behaviour_values})
            basis += f"; {a.arch}: {a.basis} ({a.source})"
        k = self.kernel_entry(path)
        if k is not None and k.behaviour_values:  # the path's own first-use cost
            beh = replace(beh, **dict(k.behaviour_values))
        return eff, beh, terms_path, basis

    def for_path(self, path: str) -> tuple[Efficiency, str, str]:
        """(efficiencies, the path their kernel terms belong to, the basis in words) for a
        deployment whose linears take kernel path `path`: the profile's own terms where
        `path` is the one they were fitted on, an entry's where the profile has one for
        `path`, else the profile's (which the Deployment then replaces by the generic
        values: a term learned on one path never prices another)."""
        eff = self.efficiency()
        k = self.kernel_entry(path)
        if k is not None and k.values:  # the terms it does not name: the path's generic ones
            return (replace(eff, **{**generic_kernel_terms(path), **dict(k.values)}), path,
                    f"{path}: {k.basis} ({k.source})")
        if not self.kernel_path or self.kernel_path == path:
            return eff, self.kernel_path, f"{path}: the {self.name} profile's own"
        return eff, self.kernel_path, (
            f"{path}: no entry in the {self.name} profile (generic {', '.join(KERNEL_FIELDS)};"
            f" its fitted ones belong to {self.kernel_path})")

    def apply(self, eff: Efficiency) -> Efficiency:
        """`eff` with this profile's efficiency values."""
        return replace(eff, **dict(self.values))

    def efficiency(self) -> Efficiency:
        return self.apply(Efficiency())

    def behaviour(self) -> EngineBehaviour:
        """EngineBehaviour's defaults with this profile's values."""
        return replace(EngineBehaviour(), **{k: type(getattr(EngineBehaviour(), k))(v)
                                             for k, v in self.behaviour_values})


@dataclass(frozen=True, slots=True)
class KernelEntry:
    """A profile's kernel terms for one kernel path (`[ENGINE.kernels."ARCH:PATH"]`), and
    the cold start its kernels cost a server that has not run them yet (behaviour
    `cold_start_s`: kernels compiled or tuned for each new shape on first use belong to the
    path, not to the engine's other paths on the same GPU)."""

    path: str
    basis: str  # "fitted" (on which rows: `source`) or "guess" (what would pin it)
    source: str
    values: tuple[tuple[str, float], ...]
    behaviour_values: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, slots=True)
class ArchEntry:
    """A profile's engine terms on one architecture (`[ENGINE.arch.ARCH]`): where the
    engine's build for that platform differs (another CPU path, other graphs, another
    front end) and data show it; each with its basis. `[ENGINE.arch."ARCH:mla"]` holds
    terms of that build's multi-head latent attention kernels (another attention backend)
    and prices MLA models only, after the architecture's own entry."""

    arch: str  # "blackwell", or "blackwell:mla"
    basis: str
    source: str
    values: tuple[tuple[str, float], ...]  # Efficiency fields (no kernel terms)
    behaviour_values: tuple[tuple[str, float], ...]


def _archs(name: str, tab: dict) -> tuple[ArchEntry, ...]:
    out = []
    for arch, a in tab.get("arch", {}).items():
        at = f"engines.toml [{name}.arch.{arch}]"
        vals, beh = a.get("efficiency", {}), a.get("behaviour", {})
        if ":" in arch and arch.split(":", 1)[1] != "mla":
            raise BstarError(f"{at}: an architecture entry is ARCH or ARCH:mla")
        if set(vals) & set(KERNEL_FIELDS):
            raise BstarError(f"{at}: kernel terms belong to a kernel path ([{name}.kernels])")
        unknown = (set(vals) - set(EFFICIENCY_FIELDS)) | (set(beh) - set(BEHAVIOUR_FIELDS))
        if unknown:
            raise BstarError(f"{at}: unknown field(s) {sorted(unknown)}")
        if a.get("basis") not in ("fitted", "guess") or not a.get("source"):
            raise BstarError(f"{at}: needs basis 'fitted' or 'guess' and a source")
        out.append(ArchEntry(arch, str(a["basis"]), str(a["source"]),
                             tuple((k, float(v)) for k, v in vals.items()),
                             tuple((k, float(v)) for k, v in beh.items())))
    return tuple(out)


def _kernels(name: str, tab: dict) -> tuple[KernelEntry, ...]:
    out = []
    for path, k in tab.get("kernels", {}).items():
        at = f"engines.toml [{name}.kernels.{path!r}]"
        vals, beh = k.get("efficiency", {}), k.get("behaviour", {})
        if set(vals) - set(KERNEL_FIELDS):
            raise BstarError(f"{at}: only {', '.join(KERNEL_FIELDS)} belong to a kernel path")
        if set(beh) - {"cold_start_s"}:
            raise BstarError(f"{at}: of the behaviour, only cold_start_s belongs to a kernel "
                             "path")
        if k.get("basis") not in ("fitted", "guess") or not k.get("source"):
            raise BstarError(f"{at}: needs basis 'fitted' or 'guess' and a source")
        out.append(KernelEntry(path, str(k["basis"]), str(k["source"]),
                               tuple((a, float(v)) for a, v in vals.items()),
                               tuple((a, float(v)) for a, v in beh.items())))
    return tuple(out)


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
                                  tuple((k, float(v)) for k, v in beh.items()),
                                  str(tab.get("kernel_path", "")), _kernels(name, tab),
                                  _archs(name, tab))
        if set(vals) & set(KERNEL_FIELDS) and not out[name].kernel_path:
            raise BstarError(f"engines.toml [{name}]: kernel terms need the kernel_path they "
                             "were fitted on")
    return out


def get_engine(name: str | None) -> EngineProfile:
    """A profile by name or alias (case-insensitive); None or "" = the default (vLLM)."""
    key = (name or DEFAULT_ENGINE).lower().strip()
    profiles = engine_profiles()
    for p in profiles.values():
        if key == p.name or key in p.aliases:
            return p
    raise BstarError(f"unknown engine {name!r} (one of: {', '.join(profiles)})")
