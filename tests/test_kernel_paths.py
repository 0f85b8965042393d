"""Kernel paths (issue 37): the fused-MoE terms an engine profile fitted on one kernel path
(a weight precision's kernels on one architecture) never price another path."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from bstar.deployment import KERNEL_FIELDS, Efficiency, generic_kernel_terms, kernel_path
from bstar.engines import engine_profiles, get_engine
from bstar.errors import BstarError
from bstar.options import DeploymentOptions
from bstar.specs.gpu import get_gpu
from bstar.specs.precision import get_precision


@pytest.mark.parametrize(("gpu", "dtype", "path"), [
    ("h200", "mxfp4", "hopper:fp4-dequant"),  # Hopper has no FP4 tensor cores
    ("b200", "mxfp4", "blackwell:fp4-native"),
    ("b200", "nvfp4", "blackwell:fp4-native"),
    ("mi300x", "mxfp4", "cdna3:fp4-dequant"),
    ("h100-sxm", "bf16", "hopper:bf16"),
    ("h200", "fp8-block", "hopper:fp8-native"),
    ("a100-80gb-sxm", "fp8", "ampere:fp8-dequant"),  # no FP8 tensor cores on Ampere
    ("h100-sxm", "int4", "hopper:int4-dequant"),
])
def test_kernel_path_follows_the_catalogs_native_precisions(gpu: str, dtype: str,
                                                            path: str) -> None:
    g = get_gpu(gpu)
    assert kernel_path(g, get_precision(dtype)) == path
    fam = path.split(":")[1].split("-")[0]
    if path.endswith("-native"):
        assert fam in g.native_precisions or dtype in g.native_precisions


def _eff(model: str, gpu: str, engine: str = "vllm", **kw: str) -> Efficiency:
    return DeploymentOptions(model=model, gpu=gpu, engine=engine, **kw).build().eff


def test_terms_fitted_on_one_path_do_not_price_another() -> None:
    vllm = get_engine("vllm")
    # gpt-oss on H200 is the path vLLM's MoE terms were fitted on
    assert vllm.kernel_path == "hopper:fp4-dequant"
    home = _eff("gpt-oss-120b", "h200")
    assert (home.moe_compute, home.moe_layer_s) == (vllm.efficiency().moe_compute,
                                                    vllm.efficiency().moe_layer_s)
    assert home.moe_layer_s > 0
    # Mixtral's bf16 experts on H100, FP8 DeepSeek on H200, gpt-oss natively on an RTX PRO
    # 6000 and dequantized on an A100: none of them is that path, nor has an entry
    for model, gpu in (("mixtral-8x7b", "h100-sxm"), ("deepseek-v3", "h200"),
                       ("gpt-oss-120b", "rtx-pro-6000"), ("gpt-oss-120b", "a100-80gb-sxm")):
        d = DeploymentOptions(model=model, gpu=gpu, engine="vllm").build()
        e = d.eff
        assert {k: getattr(e, k) for k in KERNEL_FIELDS} \
            == generic_kernel_terms(d.kernel_path), (model, gpu)
        # the engine's other terms still apply
        assert e.overhead_s == vllm.efficiency().overhead_s


def test_an_entry_prices_its_own_path_and_a_calibration_its_own_gpu(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # vLLM's entries for B200's native FP4 kernels and for ROCm (kernels and the engine's
    # per-request time), each on its own GPUs only
    vllm = get_engine("vllm")
    for gpu, path in (("b200", "blackwell:fp4-native"), ("mi300x", "cdna3:fp4-dequant")):
        (entry,) = [k for k in vllm.kernels if k.path == path]
        d = DeploymentOptions(model="gpt-oss-120b", gpu=gpu).build()
        assert d.kernel_path == path and d.kernel_terms_priced
        assert {k: getattr(d.eff, k) for k in KERNEL_FIELDS} \
            == {**generic_kernel_terms(path), **dict(entry.values)}
    rocm = DeploymentOptions(model="gpt-oss-120b", gpu="mi300x").build().behaviour
    assert rocm.cold_start_s == dict(vllm.arch_entry("cdna3").behaviour_values)[
        "cold_start_s"] != vllm.behaviour().cold_start_s
    assert DeploymentOptions(model="gpt-oss-120b", gpu="h200").build().behaviour \
        == vllm.behaviour()
    trt = get_engine("trt-llm")
    (entry,) = [k for k in trt.kernels if k.path == "hopper:fp8-native"]
    e = _eff("deepseek-v3", "h200", "trt-llm")
    assert (e.moe_compute, e.moe_layer_s) == (dict(entry.values)["moe_compute"],
                                              dict(entry.values)["moe_layer_s"])
    # a profile calibrated on this GPU names its own kernel terms: they are this path's
    prof = tmp_path / "p.toml"
    prof.write_text('[profile]\ngpu = "b200"\nengine = "vllm"\n'
                    '[efficiency]\nmoe_compute = 0.4\nmoe_layer_s = 3e-5\n')
    d = DeploymentOptions(model="gpt-oss-120b", gpu="b200", profile=str(prof)).build()
    assert (d.eff.moe_compute, d.eff.moe_layer_s) == (0.4, 3e-5)


def test_vllms_blackwell_entry_prices_b200s_front_end_and_no_other_gpus() -> None:
    # [vllm.arch.blackwell]: B200's build spends less per prompt token, more per request;
    # an architecture entry, so it prices every model on Blackwell and nothing on Hopper
    vllm = get_engine("vllm")
    a = vllm.arch_entry("blackwell")
    assert a is not None and a.basis == "fitted" and "bench/fit_runs.py" in a.source
    beh, eff = dict(a.behaviour_values), dict(a.values)
    for model in ("gpt-oss-120b", "llama-3-8b"):
        b200 = DeploymentOptions(model=model, gpu="b200").build()
        assert b200.behaviour.front_token_s == beh["front_token_s"] \
            < vllm.behaviour().front_token_s
        assert b200.behaviour.request_overhead_s == beh["request_overhead_s"] \
            > vllm.behaviour().request_overhead_s
        assert b200.eff.prompt_token_s == eff["prompt_token_s"] < vllm.efficiency().prompt_token_s
        h200 = DeploymentOptions(model=model, gpu="h200").build()
        assert (h200.behaviour, h200.eff.prompt_token_s) \
            == (vllm.behaviour(), vllm.efficiency().prompt_token_s)


def test_sglangs_mla_entry_prices_an_mla_prompts_attention_on_blackwell_only() -> None:
    sglang = get_engine("sglang")
    rate = dict(sglang.arch_entry("blackwell:mla").values)["attention_compute"]
    b200 = DeploymentOptions(model="deepseek-v3", gpu="b200", engine="sglang").build()
    h200 = DeploymentOptions(model="deepseek-v3", gpu="h200", engine="sglang").build()
    assert b200.eff.attention_compute == rate < h200.eff.attention_compute \
        == sglang.efficiency().attention_compute
    # after the architecture's own entry: its time per request still prices DeepSeek-R1
    assert b200.behaviour.request_overhead_s == dict(
        sglang.arch_entry("blackwell").behaviour_values)["request_overhead_s"]
    # a model without MLA runs other attention kernels: the architecture's entry only
    llama = DeploymentOptions(model="llama-3-70b", gpu="b200", engine="sglang",
                              num_gpus=8).build()
    assert llama.eff.attention_compute == sglang.efficiency().attention_compute
    assert llama.behaviour.request_overhead_s == b200.behaviour.request_overhead_s
    # it prices a prompt's attention: an 8k prefill slows by more than 8x a 1k one does
    from bstar.roofline import prefill_s

    at_h200_rate = b200.with_eff(replace(b200.eff, attention_compute=h200.eff.attention_compute))
    extra = {n: prefill_s(b200, n) - prefill_s(at_h200_rate, n) for n in (1024, 8192)}
    assert extra[8192] > 8 * extra[1024] > 0


def test_an_architecture_entry_names_an_architecture_or_its_mla_kernels() -> None:
    from bstar.engines import _archs

    entry = {"basis": "guess", "source": "s", "efficiency": {"attention_compute": 0.1}}
    (a,) = _archs("sglang", {"arch": {"blackwell:mla": entry}})
    assert a.arch == "blackwell:mla"
    with pytest.raises(BstarError, match="ARCH or ARCH:mla"):
        _archs("sglang", {"arch": {"blackwell:gqa": entry}})


def test_fit_runs_start_values_are_read_into_the_record_that_holds_each() -> None:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "fit_runs.py"
    spec = importlib.util.spec_from_file_location("fit_runs", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    vllm = get_engine("vllm")
    e, b = mod.with_start(vllm.efficiency(), vllm.behaviour(),
                          {"prompt_token_s": 4e-6, "request_overhead_s": 0.015})
    assert (e.prompt_token_s, b.request_overhead_s) == (4e-6, 0.015)
    assert e.moe_layer_s == vllm.efficiency().moe_layer_s
    with pytest.raises(SystemExit, match="unknown term"):
        mod.with_start(e, b, {"no_such_term": 1.0})
    with pytest.raises(SystemExit):  # argparse's error: a value that is not a number
        mod.main(["--start", "prompt_token_s=fast"])


def test_a_native_fp4_path_streams_its_weights_at_the_16bit_rate() -> None:
    """A dequantizing kernel converts every 4-bit weight in its main loop (Efficiency's
    int4_weight_stream, a guess); on a native FP4 path the tensor cores read the format, so
    with no entry for that path the generic stream is the 16-bit weights' (issue 37: the
    0.70 made TensorRT-LLM's gpt-oss on B200, which has no B200 entry, stream like Marlin).
    A dequantizing path keeps the guess unless its engine fitted its own (vLLM's Marlin
    path has not; TensorRT-LLM's Triton path on Hopper has, on its gpt-oss runs)."""
    from bstar import step
    from bstar.engines import get_engine

    assert generic_kernel_terms("hopper:fp4-dequant")["int4_weight_stream"] \
        == Efficiency().int4_weight_stream < 1.0
    assert generic_kernel_terms("blackwell:fp4-native")["int4_weight_stream"] == 1.0
    trt_hopper = get_engine("trt-llm").for_gpu("hopper", "hopper:fp4-dequant")[0]
    assert Efficiency().int4_weight_stream < trt_hopper.int4_weight_stream <= 1.0
    for gpu, engine, expected in (("b200", "trt-llm", 1.0),
                                  ("h200", "vllm", Efficiency().int4_weight_stream),
                                  ("h200", "trt-llm", trt_hopper.int4_weight_stream)):
        d = DeploymentOptions(model="gpt-oss-120b", gpu=gpu, engine=engine).build()
        assert d.eff.int4_weight_stream == expected
        # the priced decode step reads the experts at that stream: at batch 64 the 4-bit
        # bytes take their datasheet time / (bandwidth x stream) and nothing more
        w = step.shape(d).decode([64], 2048)
        quantized = float((w.weight_s - w.weight16_s)[0])
        mem = float(step.price_parts(w, d.eff).memory_s[0])
        kv = float(w.kv_s[0]) / d.eff.kv_bandwidth
        sixteen = float(w.weight16_s[0]) / d.eff.bandwidth
        assert mem == pytest.approx(quantized / (d.eff.bandwidth * expected) + sixteen + kv,
                                    rel=1e-9)


def test_the_8bit_stream_belongs_to_the_path_its_engine_fitted_it_on() -> None:
    """The stream of 8-bit weights is a kernel term: SGLang's FP8 block-scaled kernels on
    Hopper and CDNA3 fit their own (DeepSeek-R1's runs), a path whose entry does not name it
    keeps the generic 0.75 (torch._scaled_mm on the repo's H200 harness), and a fit sets it
    only on an 8-bit path's rows."""
    from bstar.deployment import fitted_kernel_fields

    assert "fp8_weight_stream" in KERNEL_FIELDS
    generic = Efficiency().fp8_weight_stream
    assert generic_kernel_terms("hopper:fp8-native")["fp8_weight_stream"] == generic
    sglang = get_engine("sglang")
    for gpu, path in (("h200", "hopper:fp8-native"), ("mi300x", "cdna3:fp8-native")):
        fitted = sglang.for_path(path)[0].fp8_weight_stream
        assert fitted != generic
        assert _eff("deepseek-v3", gpu, "sglang").fp8_weight_stream == fitted
    for engine in ("sglang", "trt-llm"):
        # Ada's FP8 kernels have no entry: the generic stream, not Hopper's
        assert _eff("deepseek-v3", "l40s", engine).fp8_weight_stream == generic
    # TensorRT-LLM's entry for Hopper's FP8 path names no stream; vLLM fitted no 8-bit path
    for engine in ("trt-llm", "vllm"):
        assert _eff("deepseek-v3", "h200", engine).fp8_weight_stream == generic
    assert "fp8_weight_stream" in fitted_kernel_fields("hopper:fp8-native")
    assert "fp8_weight_stream" in fitted_kernel_fields("ampere:int8-dequant")
    for path in ("hopper:fp4-dequant", "blackwell:fp4-native", "hopper:bf16"):
        assert "fp8_weight_stream" not in fitted_kernel_fields(path)


def test_a_cold_start_is_simulated_for_a_run_only() -> None:
    """vLLM's ROCm entry holds a cold start (the runs' first wave waits it): `bstar validate`
    simulates a run with it, while plan, simulate and search price a warm server."""
    from bstar.runs_table import load_runs
    from bstar.validate_stages import simulate_stage, stage_deployment

    run = next(r for r in load_runs("data/inferencemax/runs.csv")
               if r.stage == "mi300x-gpt-oss-120b-vllm-tp8-ep1-1k1k-c4")
    d = stage_deployment(run)
    cold_s = d.behaviour.cold_start_s
    assert cold_s > 1.0
    cold = simulate_stage(run, deployment=d)
    warm = simulate_stage(run, deployment=d.with_behaviour(replace(d.behaviour,
                                                                   cold_start_s=0.0)))
    # the first wave (the run's concurrency, of all its requests) waits it: the mean TTFT
    # grows by about cold_s x concurrency / requests, the per-token time does not move
    assert cold.requests == warm.requests == cold.scored
    assert cold.ttft_mean_ms - warm.ttft_mean_ms == pytest.approx(
        cold_s * 1e3 * run.concurrency / cold.requests, rel=0.05)
    assert cold.tpot_mean_ms == pytest.approx(warm.tpot_mean_ms, rel=0.02)


def test_a_cold_start_belongs_to_its_kernel_path() -> None:
    """TensorRT-LLM's DeepSeek-R1 entry (FP8 blocks on Hopper) holds a cold start; its
    gpt-oss path on the same GPU, whose first wave waits far less, has none: an entry's
    cold start prices its own path only."""
    trt = get_engine("trt-llm")
    fp8 = trt.for_gpu("hopper", "hopper:fp8-native")[1]
    assert fp8.cold_start_s > 1.0
    assert trt.for_gpu("hopper", "hopper:fp4-dequant")[1].cold_start_s == 0.0
    assert trt.for_gpu("blackwell", "blackwell:fp8-native")[1].cold_start_s == 0.0
    # the rest of the behaviour is the engine's
    assert replace(fp8, cold_start_s=0.0) == trt.for_gpu("hopper", "hopper:fp4-dequant")[1]


def test_a_kernel_entry_holds_no_other_behaviour_and_no_terms_it_does_not_name() -> None:
    from bstar.engines import EngineProfile, _kernels

    with pytest.raises(BstarError, match="only cold_start_s"):
        _kernels("x", {"kernels": {"hopper:fp8-native": {
            "basis": "guess", "source": "s", "behaviour": {"request_overhead_s": 0.1}}}})
    # an entry with only a cold start on the profile's own path keeps the profile's terms
    (k,) = _kernels("x", {"kernels": {"hopper:fp8-native": {
        "basis": "guess", "source": "s", "behaviour": {"cold_start_s": 1.5}}}})
    p = EngineProfile("x", "x", "guess", "s", (("moe_layer_s", 4e-5),),
                      kernel_path="hopper:fp8-native", kernels=(k,))
    eff, beh, path, _ = p.for_gpu("hopper", "hopper:fp8-native")
    assert (eff.moe_layer_s, beh.cold_start_s, path) == (4e-5, 1.5, "hopper:fp8-native")


def test_bstar_simulate_prices_a_warm_server(capsys) -> None:  # type: ignore[no-untyped-def]
    from bstar.cli import main

    assert main(["simulate", "--model", "gpt-oss-120b", "--gpu", "mi300x", "--num-gpus", "8",
                 "--concurrency", "1", "--num-requests", "2", "--input-len", "256",
                 "--output-len", "8", "--json"]) == 0
    ttft_ms = json.loads(capsys.readouterr().out)["ttft_ms"]["p50"]
    # neither the 2 s cold start nor the 157 ms a request that stood in for it before
    assert ttft_ms < 100


def test_a_fit_for_a_path_prices_that_paths_runs() -> None:
    """fit_stages(kernel_path=...) prices the candidate terms on the runs of that path
    (validate_stages.fitting._on_path, the deployments fit_stages and evaluate price with)."""
    from bstar.validate_stages.fitting import _on_path

    d = DeploymentOptions(model="gpt-oss-120b", gpu="rtx-pro-6000").build()
    candidate = replace(d.eff, moe_layer_s=5e-5)
    assert _on_path(d, "blackwell-rtx:fp4-native").with_eff(candidate).eff.moe_layer_s == 5e-5
    assert _on_path(d, None).with_eff(candidate).eff.moe_layer_s == 0.0  # as built: generic


def test_engines_toml_entries_name_their_basis() -> None:
    for p in engine_profiles().values():
        if any(k in dict(p.values) for k in KERNEL_FIELDS):
            assert p.kernel_path, p.name
        for k in p.kernels:
            assert k.basis in ("fitted", "guess") and k.source
            assert set(dict(k.values)) <= set(KERNEL_FIELDS)


def test_plan_says_whose_kernel_terms_price_it(capsys) -> None:  # type: ignore[no-untyped-def]
    from bstar.cli import main

    assert main(["plan", "--model", "gpt-oss-120b", "--gpu", "b200", "--context", "2048",
                 "--json"]) == 0
    prof = json.loads(capsys.readouterr().out)["engine_profile"]
    assert prof["kernel_path"] == "blackwell:fp4-native"
    assert "blackwell:fp4-native" in prof["kernel_basis"]
    assert main(["plan", "--model", "gpt-oss-120b", "--gpu", "h200", "--context", "2048"]) == 0
    assert "kernel terms     hopper:fp4-dequant: the vllm profile's own" in \
        capsys.readouterr().out


def test_a_gpu_file_with_an_unknown_arch_name_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "g.toml"
    bad.write_text('id = "x"\nname = "X"\nmemory_bytes = 85899345920\n'
                   'hbm_bandwidth_bytes_s = 2e12\nbf16_flops = 3e14\narch = "hoper"\n')
    with pytest.raises(BstarError, match="arch"):
        get_gpu(str(bad))


def test_native_fp4_experts_multiply_at_the_fp8_rate() -> None:
    """Blackwell runs gpt-oss's MXFP4 experts natively (MXFP4 x MXFP8 MMAs at the FP8 rate);
    Hopper and CDNA3 dequantize them to the 16-bit rate; dense GEMMs keep their own."""
    from bstar import step
    from bstar.deployment import expert_compute

    for gpu, rate in (("b200", "fp8"), ("h200", "bf16"), ("mi300x", "bf16")):
        d = DeploymentOptions(model="gpt-oss-120b", gpu=gpu).build()
        g, m = d.gpu, d.model
        assert expert_compute(g, d.weight) == rate
        sh = step.shape(d)
        assert sh.expert_gemm_s_per_token == pytest.approx(
            2 * m.expert_matmul_params_per_token / g.peak_flops(rate))
        dense = sh.gemm_s_per_token - sh.expert_gemm_s_per_token
        assert dense == pytest.approx(2 * (m.matmul_params_per_token
                                           - m.expert_matmul_params_per_token)
                                      / g.peak_flops("bf16"))
