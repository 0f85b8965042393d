"""DeploymentOptions: the deployment by name that commands build and sweeps store."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bstar import calibrate as cal
from bstar import roofline as rl
from bstar.deployment import IDEAL, Deployment, Efficiency
from bstar.loadgen.sweep import SweepConfig
from bstar.options import DeploymentOptions
from bstar.report.views import sweep_deployment
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

CUSTOM = Efficiency(bandwidth=0.5, compute=0.4, overhead_s=1e-3, overhead_per_seq_s=2e-5)


def profile_file(tmp_path: Path, gpu: str = "a100-80gb-sxm") -> Path:
    """A calibration profile with CUSTOM's efficiencies and a 3 GiB reserve."""
    d = Deployment(get_model("llama-3-8b"), get_gpu(gpu))
    pts = [cal.Point(b, 512, float(rl.decode_step(d.with_eff(CUSTOM), [b], 512).step_s[0]))
           for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    c = replace(cal.calibrate(d, pts), reserve_bytes=3 * 2**30)
    path = tmp_path / "prof.toml"
    path.write_text(cal.profile_toml(c))
    return path


def _off_path(engine: Any) -> Efficiency:
    """The engine's efficiencies on a kernel path it has no terms for: generic MoE terms."""
    from bstar.deployment import KERNEL_FIELDS

    return replace(engine.efficiency(), **{k: getattr(Efficiency(), k) for k in KERNEL_FIELDS})


def test_defaults_build_bstar_plans_default_deployment() -> None:
    d = DeploymentOptions().build()
    # The default engine is vLLM: its fitted profile over Efficiency's defaults.
    from bstar.engines import get_engine

    # Its fused-MoE terms belong to the kernel path they were fitted on (docs/cost-model.md,
    # "Kernel paths"): a bf16 Llama on an A100 is not that path.
    assert d == Deployment(get_model("llama-3-8b"), get_gpu("a100-80gb-sxm"),
                           eff=get_engine("vllm").apply(Efficiency()), engine="vllm",
                           behaviour=get_engine("vllm").behaviour(),
                           kernel_terms_path=get_engine("vllm").kernel_path)
    assert d.kernel_path == "ampere:bf16" and d.eff.moe_layer_s == Efficiency().moe_layer_s
    import tomllib
    from importlib.resources import files

    toml = tomllib.loads(files("bstar.presets").joinpath("engines.toml").read_text())
    assert d.eff.kv_bandwidth == toml["vllm"]["efficiency"]["kv_bandwidth"] \
        != Efficiency().kv_bandwidth
    assert d.behaviour.scheduling_lag_steps == 1


def test_flags_map_onto_the_deployment() -> None:
    o = DeploymentOptions("llama-2-7b", "h100-sxm", num_gpus=2, weight_dtype="fp8",
                          kv_dtype="fp8", gpu_util=0.8, reserve_gib=1.5, block_size=32,
                          bw_eff=0.6, overhead_ms=2.0)
    d = o.build()
    assert (d.model.name, d.gpu.id, d.num_gpus) == (get_model("llama-2-7b").name,
                                                    "h100-sxm", 2)
    assert (d.weight.name, d.kv.name, d.gpu_util) == ("fp8", "fp8", 0.8)
    assert d.reserve_bytes == round(1.5 * 2**30) and d.block_size == 32
    from bstar.engines import get_engine

    assert d.eff == replace(_off_path(get_engine("vllm")), bandwidth=0.6, overhead_s=2e-3)
    assert DeploymentOptions(ideal=True).build().eff == IDEAL


def test_to_dict_from_dict_round_trip_and_old_stored_flags() -> None:
    o = DeploymentOptions("llama-2-7b", "h100-sxm", weight_dtype="fp8", flops_eff=0.5,
                          profile="p.toml", engine="vllm")
    assert DeploymentOptions.from_dict(o.to_dict()) == o
    assert DeploymentOptions.from_dict({**o.to_dict(), "unknown": 1}) == o
    # Runs stored before DeploymentOptions kept argparse names under deployment_args.
    old = {"model": "llama-2-7b", "gpu": "h100-sxm",
           "deployment_args": {"dtype": "fp8", "kv_dtype": "fp8", "bw_eff": None,
                               "reserve_gib": 2.0, "ideal": False}}
    assert DeploymentOptions.from_sweep_options(old) == DeploymentOptions(
        "llama-2-7b", "h100-sxm", weight_dtype="fp8", kv_dtype="fp8")
    assert SweepConfig.from_options(old).deployment == DeploymentOptions(
        "llama-2-7b", "h100-sxm", weight_dtype="fp8", kv_dtype="fp8").to_dict()


def test_profile_applies_and_survives_the_store(tmp_path: Path) -> None:
    prof = profile_file(tmp_path)
    o = DeploymentOptions("llama-3-8b", "a100-80gb-sxm", profile=str(prof))
    d = o.build()
    assert d.eff == cal.load_profile(prof).eff != Efficiency()
    assert d.reserve_bytes == 3 * 2**30  # the profile's reserve, --reserve-gib at default
    assert DeploymentOptions(**{**o.to_dict(), "reserve_gib": 1.0}).build().reserve_bytes \
        == 2**30
    # A sweep stores the options; the report rebuilds the same deployment (profile kept).
    cfg = SweepConfig(url="http://127.0.0.1:1", concurrency=[1], model=o.model, gpu=o.gpu,
                      deployment=o.to_dict())
    assert sweep_deployment(SweepConfig.from_options(cfg.to_options()).to_options()) == d
    with pytest.raises(Exception, match="contradict"):
        replace(o, ideal=True).build()


def test_a_profile_from_another_gpu_warns(tmp_path: Path) -> None:
    prof = profile_file(tmp_path)
    heard: list[str] = []
    DeploymentOptions("llama-3-8b", "h100-sxm", profile=str(prof)).build(warn=heard.append)
    assert heard and "calibrated on a100-80gb-sxm" in heard[0]


def test_a_calibrated_profile_keeps_the_engines_scheduling_lag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `bstar calibrate ... -o p.toml` then `--profile p.toml`: the profile names the fitted
    # efficiencies and the request overhead, not the scheduling lag, so vLLM's async
    # scheduling (lag 1, engines.toml) stays (it used to fall to 0 under any profile).
    import json

    from bstar.cli import main

    d = Deployment(get_model("llama-3-8b"), get_gpu("a100-80gb-sxm"))
    pts = tmp_path / "steps.csv"
    pts.write_text("batch,context_tokens,tpot_ms\n" + "".join(
        f"{b},512,{float(rl.decode_step(d.with_eff(CUSTOM), [b], 512).step_s[0]) * 1e3!r}\n"
        for b in (1, 4, 16, 64, 256)))
    prof = tmp_path / "p.toml"
    assert main(["calibrate", str(pts), "--model", "llama-3-8b", "--gpu", "a100-80gb-sxm",
                 "--engine", "vllm", "-o", str(prof), "--json"]) == 0
    capsys.readouterr()
    from bstar.engines import get_engine

    vllm = get_engine("vllm").behaviour()
    assert vllm.scheduling_lag_steps == 1
    built = DeploymentOptions("llama-3-8b", "a100-80gb-sxm", profile=str(prof)).build()
    assert built.behaviour == vllm
    assert built.eff.bandwidth == pytest.approx(cal.load_profile(prof).eff.bandwidth)
    assert main(["plan", "--profile", str(prof), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["behaviour"]["scheduling_lag_steps"] == 1


def test_a_profile_applies_exactly_the_fields_it_names(tmp_path: Path) -> None:
    from bstar.engines import get_engine

    vllm = get_engine("vllm")
    p = tmp_path / "few.toml"
    p.write_text("[efficiency]\nbandwidth = 0.5\n")
    d = DeploymentOptions("llama-3-8b", "a100-80gb-sxm", profile=str(p)).build()
    assert d.eff == replace(_off_path(vllm), bandwidth=0.5)
    assert d.behaviour == vllm.behaviour()
    # A profile written before [behaviour] existed named its fields under [efficiency].
    p.write_text("[efficiency]\nbandwidth = 0.5\nrequest_overhead_s = 0.002\n"
                 "scheduling_lag_steps = 0\n")
    d = DeploymentOptions("llama-3-8b", "a100-80gb-sxm", profile=str(p)).build()
    assert (d.behaviour.request_overhead_s, d.behaviour.scheduling_lag_steps) == (0.002, 0)
    assert d.eff == replace(_off_path(vllm), bandwidth=0.5)
    p.write_text("[efficiency]\nbandwidth = 0.5\n[behaviour]\nscheduling_lag_steps = 2\n")
    with pytest.raises(Exception, match="scheduling_lag_steps must be 0 or 1"):
        cal.load_profile(p)


def test_one_builder_for_commands_and_search(tmp_path: Path) -> None:
    # Issue 41: with a 6 GiB profile reserve and --reserve-gib 3 on one H100, plan and
    # simulate priced a 3 GiB reserve and search 6 GiB. The explicit flag wins everywhere
    # (an explicit 2, the default's value, too); without it the profile's applies.
    from bstar.cli import build_parser
    from bstar.commands.common import build_deployment
    from bstar.commands.search import spec_from_args
    from bstar.search.run import plan_candidates

    # A profile of one field and a measured 6 GiB reserve (profile_file calibrates: slow).
    path = tmp_path / "reserve.toml"
    path.write_text(f'[profile]\ngpu = "h100-sxm"\n[efficiency]\nbandwidth = 0.7\n'
                    f"[memory]\nreserve_bytes = {6 * 2**30}\n")
    prof = str(path)
    for flag in (None, "3", "2"):
        given = [] if flag is None else ["--reserve-gib", flag]
        want = (6 if flag is None else float(flag)) * 2**30
        for cmd in ("plan", "simulate"):
            args = build_parser(only=cmd).parse_args(
                [cmd, "--gpu", "h100-sxm", "--profile", prof, *given])
            assert build_deployment(args).reserve_bytes == want, (cmd, flag)
        args = build_parser(only="search").parse_args(
            ["search", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--num-gpus", "1",
             "--profile", prof, "--slo", "ttft:1000", "--rate", "1", "--max-num-seqs", "8",
             "--max-num-batched-tokens", "2048", "--num-requests", "20", *given])
        cands, _pruned, _warnings, _unit = plan_candidates(spec_from_args(args))
        assert {c.replica.deployment.reserve_bytes for c in cands} == {want}, flag
