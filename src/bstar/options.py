"""A deployment by name: `DeploymentOptions` builds a `bstar.deployment.Deployment`.

The commands map their flags onto it (`bstar plan --model ... --profile ...`), the sweep
stores it with a run (`to_dict`/`from_dict`), and the report rebuilds the same deployment
from the store. It holds names (preset ids, file paths), not loaded specs, so it is small,
hashable and JSON-able; `build()` loads the presets, the engine profile and the calibration
profile (which is why it sits apart from the values in `bstar.deployment`: those are what
the engines and calibration import).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from bstar.deployment import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    DEFAULT_RESERVE_GIB,
    IDEAL,
    KERNEL_FIELDS,
    NO_GRAPHS,
    Deployment,
    Efficiency,
    EngineBehaviour,
    kernel_path,
)
from bstar.engine_defaults import BLOCK_SIZE, GPU_MEMORY_UTILIZATION
from bstar.errors import BstarError
from bstar.specs.gpu import MAX_MEMORY_BYTES
from bstar.units import GiB

if TYPE_CHECKING:
    from bstar.specs.gpu import GpuSpec
    from bstar.specs.model import ModelSpec

# Flag names a sweep stored before `DeploymentOptions` existed (`deployment_args`), by field.
_LEGACY_KEYS = {"dtype": "weight_dtype"}


@dataclass(frozen=True, slots=True)
class DeploymentOptions:
    """One model x GPU x engine setting by name; `build()` gives the cost model's view.

    - `model`, `gpu`: preset ids or files (None: bstar plan's defaults).
    - `weight_dtype` ("" = the checkpoint's), `kv_dtype`, `gpu_util`, `reserve_gib` (per-GPU
      memory kept out of the KV pool), `block_size` (KV block, tokens).
    - `bw_eff`, `flops_eff`, `overhead_ms`, `overhead_per_seq_us`: efficiency overrides
      (None: the profile's, else the stated defaults of `roofline.Efficiency`).
    - `ideal`: the pure roofline; `profile`: a `bstar calibrate` profile file.
    - `engine`: the engine profile whose priors the efficiencies start from (bstar/engines.py;
      "" = vllm); a `profile` sets the fields it names over them.
    - `assume_unmodeled`: read a config bstar does not fully model on the stated assumption
      (`--assume-unmodeled`; False leaves it to BSTAR_ASSUME_UNMODELED).
    - `enforce_eager`: no CUDA graphs (vLLM --enforce-eager, SGLang --disable-cuda-graph);
      `cuda_graph_max_tokens`: the largest step a captured graph runs (SGLang
      --cuda-graph-max-bs, vLLM's max_cudagraph_capture_size; None: the engine profile's).
    """

    model: str | None = None
    gpu: str | None = None
    num_gpus: int = 1
    weight_dtype: str = ""
    kv_dtype: str = "bf16"
    gpu_util: float = GPU_MEMORY_UTILIZATION
    reserve_gib: float | None = None  # None: the profile's reserve, else DEFAULT_RESERVE_GIB
    block_size: int = BLOCK_SIZE
    bw_eff: float | None = None
    flops_eff: float | None = None
    overhead_ms: float | None = None
    overhead_per_seq_us: float | None = None
    ideal: bool = False
    profile: str | None = None
    engine: str = ""
    assume_unmodeled: bool = False
    enforce_eager: bool = False
    cuda_graph_max_tokens: int | None = None
    # Parallel layout inside num_gpus (bstar.deployment.Deployment): expert-parallel size
    # and attention data-parallel ranks.
    expert_parallel: int = 1
    data_parallel: int = 1

    def with_target(self, model: str | None = None, gpu: str | None = None
                    ) -> DeploymentOptions:
        """The same settings for another model and/or GPU (None keeps the current one)."""
        return replace(self, model=model or self.model, gpu=gpu or self.gpu)

    def build(self, warn: Callable[[str], None] | None = None) -> Deployment:
        """Load the presets (and the profile) into a `Deployment` (`assemble`, the one
        builder). `warn` hears about a profile calibrated on another GPU (its efficiencies
        are then a guess)."""
        from bstar.engines import get_engine
        from bstar.specs.gpu import get_gpu
        from bstar.specs.presets import get_model

        engine = get_engine(self.engine)  # validates the name even under --ideal
        prof = None
        if self.profile:
            from bstar.calibrate import load_profile

            if self.ideal:
                raise BstarError("--ideal and --profile contradict each other; give one")
            prof = load_profile(self.profile)
        d = assemble(
            get_model(self.model or DEFAULT_MODEL, self.assume_unmodeled or None),
            get_gpu(self.gpu or DEFAULT_GPU), num_gpus=self.num_gpus,
            weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype, gpu_util=self.gpu_util,
            reserve_bytes=None if self.reserve_gib is None else _reserve_bytes(self.reserve_gib),
            block_size=self.block_size, eff=IDEAL if self.ideal else None,
            engine="ideal" if self.ideal else engine.name,
            behaviour=EngineBehaviour() if self.ideal else None, profile=prof,
            expert_parallel=self.expert_parallel, data_parallel=self.data_parallel)
        d = d.with_eff(self._override(d.eff))
        if prof is not None and prof.gpu and prof.gpu != d.gpu.id and warn is not None:
            # Efficiencies belong to one GPU x engine; on another GPU they are a guess.
            warn(f"profile {self.profile} was calibrated on {prof.gpu}, "
                 f"applied to {d.gpu.id}")
        return d

    def spec_terms(self, context_tokens: int | None = None) -> dict[str, Any]:
        """`fit.spec.spec_terms` of this model (and with a GPU, the deployment `build()`
        gives); empty without a model."""
        if self.model is None:
            if self.gpu is not None:
                raise BstarError("--gpu needs --model: the compute term is the model's FLOPs "
                                 "at the GPU's peak")
            return {}
        from bstar.fit.spec import spec_terms
        from bstar.specs.precision import get_precision
        from bstar.specs.presets import get_model

        m = get_model(self.model, self.assume_unmodeled or None)
        return spec_terms(m, get_precision(self.weight_dtype or m.default_dtype),
                          get_precision(self.kv_dtype),
                          self.build() if self.gpu is not None else None, context_tokens)

    def efficiency(self) -> Efficiency:
        """The efficiencies without a profile: the engine's priors (IDEAL under `ideal`)
        with the flag overrides (what `bstar search` applies to uncalibrated GPUs)."""
        from bstar.engines import get_engine

        return self._override(IDEAL if self.ideal else get_engine(self.engine).efficiency())

    def behaviour(self) -> EngineBehaviour:
        """The engine's behaviour without a profile: the engine profile's (none under
        `ideal`: the seeds' arithmetic has no request overhead and no scheduling lag)."""
        from bstar.engines import get_engine

        engine = get_engine(self.engine)
        return EngineBehaviour() if self.ideal else engine.behaviour()

    def _override(self, eff: Efficiency) -> Efficiency:
        over: dict[str, float] = {}
        if self.bw_eff is not None:
            over["bandwidth"] = self.bw_eff
        if self.flops_eff is not None:
            over["compute"] = self.flops_eff
        if self.overhead_ms is not None:
            over["overhead_s"] = self.overhead_ms / 1e3
        if self.overhead_per_seq_us is not None:
            over["overhead_per_seq_s"] = self.overhead_per_seq_us / 1e6
        if self.enforce_eager and self.cuda_graph_max_tokens:
            raise BstarError("--enforce-eager captures no graph, so --cuda-graph-max-bs "
                             "means nothing with it; give one")
        if self.enforce_eager:
            over["graph_max_tokens"] = NO_GRAPHS
        elif self.cuda_graph_max_tokens is not None:
            over["graph_max_tokens"] = float(self.cuda_graph_max_tokens)
        return replace(eff, **over) if over else eff

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeploymentOptions:
        """From `to_dict()`, ignoring unknown keys and None (the field's default stands);
        flag names a sweep stored before this type (`dtype`) are read too."""
        known = {f.name for f in fields(cls)}
        out: dict[str, Any] = {}
        for k, v in data.items():
            k = _LEGACY_KEYS.get(k, k)
            if k in known and v is not None:
                out[k] = v
        return cls(**out)

    @classmethod
    def from_sweep_options(cls, options: dict[str, Any]) -> DeploymentOptions:
        """A stored sweep's deployment: its `deployment` dict, or the `deployment_args` of
        runs stored before it, with the run's `model` and `gpu`."""
        stored = dict(options.get("deployment") or options.get("deployment_args") or {})
        if stored.get("reserve_gib") == DEFAULT_RESERVE_GIB:
            # Stores written before --reserve-gib could be left unset (None) hold the default
            # as a number, and a profile's reserve applied to them: read it so again.
            stored["reserve_gib"] = None
        return cls.from_dict({**stored, "model": options.get("model"),
                              "gpu": options.get("gpu")})


def _reserve_bytes(reserve_gib: float) -> int:
    if not 0 <= reserve_gib * GiB <= MAX_MEMORY_BYTES:
        raise BstarError(f"--reserve-gib must be between 0 and {MAX_MEMORY_BYTES // GiB} "
                         f"GiB, got {reserve_gib:g}")
    return round(reserve_gib * GiB)


def assemble(model: ModelSpec, gpu: GpuSpec, *, num_gpus: int = 1, weight_dtype: str = "",
             kv_dtype: str = "bf16", gpu_util: float = GPU_MEMORY_UTILIZATION,
             reserve_bytes: int | None = None, block_size: int = BLOCK_SIZE,
             eff: Efficiency | None = None, engine: str = "",
             behaviour: EngineBehaviour | None = None, profile: Any = None,
             expert_parallel: int = 1, data_parallel: int = 1) -> Deployment:
    """The one deployment builder: `DeploymentOptions.build` (so every command) and
    `bstar search` call it. The dtypes are read as the one vocabulary (docs/models.md,
    "Precision names": engines' spellings, `auto`, a bare `fp4`). Where `engine` names an
    engine profile, its terms for this GPU's architecture and the weights' kernel path price
    the deployment (`EngineProfile.for_gpu`; docs/cost-model.md, "Kernel paths"); an `eff` or
    `behaviour` given (the engine's priors with a command's overrides) takes the entries'
    values only for the fields it left at the profile's own. A calibration `profile` sets
    the fields it names over them (its kernel terms, fitted on its own GPU, price it) and
    scales the GPU where the engine beat a probed figure. The memory reserve per GPU: an
    explicit one (`reserve_bytes`, from `--reserve-gib`) wins; else the profile's (read from
    the engine's start-up log); else DEFAULT_RESERVE_GIB. `expert_parallel` and
    `data_parallel` lay the experts and the attention out inside the num_gpus
    (`Deployment`)."""
    from bstar.engines import engine_profiles
    from bstar.specs.precision import get_precision, kv_dtype_for, weight_dtype_for

    weight = weight_dtype_for(weight_dtype, model.default_dtype, "--dtype")
    terms_path = ""
    ep = engine_profiles().get(engine) if engine and engine != "ideal" else None
    if ep is not None:
        e_gpu, b_gpu, terms_path, _ = ep.for_gpu(
            gpu.arch, kernel_path(gpu, get_precision(weight or model.default_dtype)),
            mla=model.is_mla)
        eff = e_gpu if eff is None else _entries_over(eff, ep.efficiency(), e_gpu)
        behaviour = b_gpu if behaviour is None else _entries_over(behaviour, ep.behaviour(),
                                                                  b_gpu)
    if reserve_bytes is None:
        reserve_bytes = profile.reserve_bytes if profile is not None \
            and profile.reserve_bytes is not None else round(DEFAULT_RESERVE_GIB * GiB)
    d = Deployment(model=model, gpu=gpu, num_gpus=num_gpus, weight_dtype=weight,
                   kv_dtype=kv_dtype_for(kv_dtype, where="--kv-dtype"), gpu_util=gpu_util,
                   reserve_bytes=reserve_bytes, block_size=block_size,
                   eff=eff if eff is not None else Efficiency(), engine=engine,
                   behaviour=behaviour if behaviour is not None else EngineBehaviour(),
                   kernel_terms_path=terms_path, expert_parallel=expert_parallel,
                   data_parallel=data_parallel)
    if profile is None:
        return d
    if {k for k, _ in profile.values} & set(KERNEL_FIELDS):
        d = replace(d, kernel_terms_path="")  # calibrated on this GPU: its path's own
    return profile.apply(d)


def _entries_over(given: Any, base: Any, entry: Any) -> Any:
    """`given` (a record) with `entry`'s value of every field it left at `base`'s: the
    engine's entries for a GPU apply, a command's overrides win."""
    changes = {f.name: getattr(entry, f.name) for f in fields(given)
               if getattr(given, f.name) == getattr(base, f.name)
               and getattr(entry, f.name) != getattr(base, f.name)}
    return replace(given, **changes) if changes else given
