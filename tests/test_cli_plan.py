"""`bstar plan/compare/models/gpus` through main(argv), and the --json contract."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bstar.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_plan_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "plan", "--json")
    assert isinstance(out, dict)
    assert out["model"] == "llama-3-8b" and out["gpu"] == "a100-80gb-sxm"
    assert out["num_gpus"] == 1
    for k, t in (("weight_bytes", int), ("kv_bytes_per_token", int),
                 ("ridge_flops_per_byte", float)):
        assert isinstance(out[k], t), k
    assert [c["context_tokens"] for c in out["contexts"]] == [512, 2048, 8192]
    for c in out["contexts"]:
        assert isinstance(c["kv_bytes_per_seq"], int) and isinstance(c["b_mem"], int)
        assert isinstance(c["b_star"], float) and isinstance(c["tpot_floor_ms"], float)
        assert c["compute_crossover_batch"] is None or isinstance(
            c["compute_crossover_batch"], float)
        assert set(c["recommendation"]) >= {"max_num_seqs", "reason"}
        batches = [p["batch"] for p in c["curve"]]
        assert batches[0] == 1 and batches[-1] > c["b_mem"]  # powers of two past B_mem
        for p in c["curve"]:
            assert set(p) >= {"batch", "step_ms", "amortized_ms_per_token", "throughput_tok_s",
                              "arithmetic_intensity", "regime"}
            assert p["amortized_ms_per_token"] == pytest.approx(
                p["step_ms"] / min(p["batch"], c["b_mem"]))


def test_plan_batch_and_context_options(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "plan", "--model", "llama-3-70b", "--gpu", "a100-80gb-sxm",
                   "--num-gpus", "4", "--context", "2048,8192", "--batch", "1,8,32", "--json")
    assert out["num_gpus"] == 4
    assert [p["batch"] for p in out["contexts"][0]["curve"]] == [1, 8, 32]


def test_plan_sla_caps_recommendation(capsys: pytest.CaptureFixture[str]) -> None:
    free = run_json(capsys, "plan", "--context", "512", "--json")
    capped = run_json(capsys, "plan", "--context", "512", "--max-tpot-ms", "14", "--json")
    r_free = free["contexts"][0]["recommendation"]["max_num_seqs"]
    r_cap = capped["contexts"][0]["recommendation"]
    assert r_cap["max_num_seqs"] < r_free and "SLA" in r_cap["reason"]
    run_json(capsys, "plan", "--context", "512", "--batch", str(r_cap["max_num_seqs"]),
             "--json")


def test_plan_human_output_names_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "GiB" in out and "GB" in out and "max_num_seqs" in out
    assert "--max-num-seqs" in out and "--max-running-requests" in out


def test_compare_lists_every_row_and_flags_what_does_not_fit(
        capsys: pytest.CaptureFixture[str]) -> None:
    rows = run_json(capsys, "compare", "--model", "llama-3-8b,llama-2-13b,llama-3-70b,mixtral-8x7b",
                    "--gpu", "a100-80gb-sxm", "--context", "512,2048,8192", "--json")
    assert len(rows) == 12
    no_fit = [r for r in rows if not r["fits"]]
    assert {r["model"] for r in no_fit} == {"llama-3-70b", "mixtral-8x7b"}
    assert all(r["min_num_gpus"] == 2 for r in no_fit)
    assert main(["compare", "--model", "llama-3-8b,llama-2-13b", "--context", "512"]) == 0


def test_models_and_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    models = run_json(capsys, "models", "--json")
    assert len(models) >= 20
    gpus = run_json(capsys, "gpus", "--json")
    ids = {g["id"] for g in gpus}
    assert {"a100-80gb-sxm", "h100-sxm", "h200", "mi300x", "l4"} <= ids
    assert main(["gpus"]) == 0 and main(["models"]) == 0


@pytest.mark.parametrize(("argv", "needle"), [
    (["plan", "--model", "llama-3-8", "--json"], "did you mean"),
    (["plan", "--gpu", "a100", "--json"], "did you mean"),
    (["plan", "--model", "llama-3-70b", "--json"], "--num-gpus 2"),
    (["plan", "--context", "0"], "context length"),
    (["plan", "--batch", "-3"], "batch size"),
    (["plan", "--kv-dtype", "int3"], "unknown precision"),
    (["plan", "--gpu-util", "1.5"], "gpu-util"),
    (["plan", "--model", "/nonexistent/config.json"], "no such file"),
])
def test_user_errors_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str],
                                          needle: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err and err.count("\n") == 0


@pytest.mark.parametrize("argv", [["plan", "--context", "abc"], ["plan", "--batch", "1,x"]])
def test_malformed_lists_are_argparse_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2


def test_user_gpu_file_and_config_path(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = tmp_path / "mygpu.toml"
    gpu.write_text('name = "My GPU"\nmemory_bytes = 25769803776\n'
                   'hbm_bandwidth_bytes_s = 1e12\nbf16_flops = 200e12\n')
    cfg = tmp_path / "m" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 1024,
                               "num_hidden_layers": 8, "num_attention_heads": 16,
                               "num_key_value_heads": 8, "intermediate_size": 2816,
                               "vocab_size": 32000}))
    out = run_json(capsys, "plan", "--model", str(cfg.parent), "--gpu", str(gpu), "--json")
    assert out["gpu"] == "mygpu" and out["model"] == "m"
    cfg.write_text('{"model_type": "llama", "hidden_size": 1024}')
    assert main(["plan", "--model", str(cfg)]) == 2
    assert "num_hidden_layers" in capsys.readouterr().err


def test_help_does_not_import_heavy_modules() -> None:
    code = ("import sys; from bstar.cli import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = [m for m in ('numpy', 'rich', 'matplotlib', 'aiohttp', 'httpx', 'scipy')"
            " if m in sys.modules]\nprint(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_plan_kv_per_gpu_is_the_steps_at_tp16(capsys: pytest.CaptureFixture[str]) -> None:
    # Issue 41: Llama-3-70B's 8 KV heads at TP 16 leave each GPU one whole head (1/8 of the
    # KV), not 1/16. The amortized floor and b_star_weights_read take the step's KV per
    # sequence, not the whole model's divided by the GPU count.
    from bstar import step
    from bstar.options import DeploymentOptions

    out = run_json(capsys, "plan", "--model", "llama-3-70b", "--gpu", "h100-sxm",
                   "--num-gpus", "16", "--context", "8192", "--json")
    assert isinstance(out, dict)
    c = out["contexts"][0]
    d = DeploymentOptions(model="llama-3-70b", gpu="h100-sxm", num_gpus=16).build()
    sh = step.shape(d)
    bw = d.gpu.hbm_bandwidth_bytes_s
    kv_s = float(sh.decode(1, 8192).kv_s[0])  # the step's KV read for one sequence
    assert c["amortized_floor_ms"] == pytest.approx(kv_s / d.eff.kv_stream() * 1e3)
    # Dense: weights read = dense + one embedding row per token, so B x kv = W_read(B) at
    # B = dense / (kv - row).
    expect = float(sh.weight_s(0.0)) / (kv_s - sh.weight_s_per_token)
    assert c["b_star_weights_read"] == pytest.approx(expect, rel=1e-6)
    assert c["kv_bytes_per_seq"] / 16 < kv_s * bw  # the old rule's share was too small
