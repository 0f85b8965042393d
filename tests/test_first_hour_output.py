"""Issue 12, items 3-11: what `plan`, `compare`, `models` and `gpus` print, checked in a
pseudo-terminal as a user's terminal shows it (tests/ptyterm.py), and the JSON beside it."""

from __future__ import annotations

import json
import re

import pytest

from bstar import roofline as rl
from bstar.cli import build_parser, main
from bstar.options import DeploymentOptions
from bstar.plan import make_plan
from bstar.specs.gpu import get_gpu, gpu_catalog
from bstar.specs.presets import get_model, model_index
from ptyterm import run_in_pty


def _fits(text: str, columns: int) -> None:
    for line in text.splitlines():
        assert len(line) <= columns, line
    assert "…" not in text  # rich's mark of a cut cell


# ---- 3 and 4: tables keep ids and numbers whole, and list their sources ---------------------
@pytest.mark.parametrize("columns", [80, 100])
def test_models_table_keeps_ids_and_lists_sources(columns: int) -> None:
    rc, out = run_in_pty(["models"], columns=columns)
    assert rc == 0, out
    _fits(out, columns)
    flat = out.replace("\n", "")
    for pid, info in model_index().items():
        assert re.search(rf"│ {re.escape(pid)} +│", out), pid
        assert f"{pid}: {info.source}" in flat  # the sources list under the table


@pytest.mark.parametrize("columns", [80, 100])
def test_gpus_table_keeps_ids_and_lists_sources(columns: int) -> None:
    rc, out = run_in_pty(["gpus"], columns=columns)
    assert rc == 0, out
    _fits(out, columns)
    flat = out.replace("\n", "")
    for gid, g in gpu_catalog().items():
        assert re.search(rf"│ {re.escape(gid)} +│", out), gid
        assert f"{gid}: {g.source}" in flat


def test_compare_at_100_columns_shows_b_star_whole() -> None:
    rc, out = run_in_pty(["compare", "--model", "llama-3-8b,llama-3.1-405b",
                          "--gpu", "a100-80gb-sxm,h200"], columns=100)
    assert rc == 0, out
    _fits(out, 100)
    d = DeploymentOptions().build()
    for ctx in (512, 2048, 8192):
        assert f" {rl.b_star(d, ctx):.2f} " in out  # 14.96, not '14…' or 15.0


# ---- 9: a row that does not fit says so, with the GPUs that would -------------------------
def test_compare_row_that_does_not_fit() -> None:
    rc, out = run_in_pty(["compare", "--model", "llama-3.1-405b", "--gpu", "a100-80gb-sxm",
                          "--context", "2048"], columns=80)
    assert rc == 0, out
    _fits(out, 80)
    d = DeploymentOptions("llama-3.1-405b").build()
    assert f"{rl.b_star(d, 2048):.1f}" not in out  # no B* beside a B_mem of 0
    row = next(line for line in out.splitlines() if "llama-3.1-405b" in line and "│" in line)
    assert "no fit" in row and "--num-gpus 16" in row and " 0 " not in row
    assert "does not fit: the smallest tensor-parallel size that fits is --num-gpus 16" \
        in " ".join(out.split())


# ---- 5: B* printed consistently, one stated regime boundary, the row at the pick -------------
def test_plan_prints_b_star_and_the_row_at_the_recommendation() -> None:
    rc, out = run_in_pty(["plan", "--context", "8192"], columns=80)
    assert rc == 0, out
    d = DeploymentOptions().build()
    p = make_plan(d, (8192,))
    cp = p.contexts[0]
    assert f"B* = W / kv_per_seq = {cp.b_star:.2f}" in out  # 14.96
    assert "B* = W / kv_per_seq = 15.0 " not in out
    rec = cp.recommendation.max_num_seqs
    at = rl.curve(d, [rec], 8192)
    assert (f"at {rec}: TPOT {at.tpot_s[0] * 1e3:.2f} ms per request, "
            f"{at.throughput_tok_s[0]:,.0f} tok/s, {at.regime[0]}") in out
    # The regime column's boundary is stated beside B*.
    assert cp.b_star_read is not None
    flat = " ".join(out.split())
    assert f"the regime turns kv-dominated at B = {cp.b_star_read:.2f}" in flat
    j = cp.to_dict()["recommendation"]["at_batch"]
    assert j["batch"] == rec and j["tpot_ms"] == pytest.approx(at.tpot_s[0] * 1e3)
    assert j["regime"] == at.regime[0]


def test_regime_labels_switch_where_stated() -> None:
    d = DeploymentOptions().build()
    br = rl.b_star_read(d, 2048)
    assert br is not None and br < rl.b_star(d, 2048)
    c = rl.curve(d, [int(br), int(br) + 1], 2048)
    assert c.regime == ("weight-dominated", "kv-dominated")


# ---- 6: past B_mem the engine queues; the table says so -------------------------------------
def test_rows_past_b_mem_show_the_queue() -> None:
    rc, out = run_in_pty(["plan", "--context", "512"], columns=80)
    assert rc == 0, out
    d = DeploymentOptions().build()
    bm = rl.b_mem(d, 512)
    step_bm = rl.curve(d, [bm], 512).step_s[0]
    row = next(line for line in out.splitlines() if line.strip().startswith("1024 "))
    assert f"queued: {bm} run, {1024 - bm} wait" in row
    # TPOT is the running requests' (B_mem's step), not a time-sliced 1024/B_mem multiple.
    assert float(row.split()[1]) == pytest.approx(step_bm * 1e3, rel=0.005)
    pt = next(x for x in make_plan(d, (512,)).to_dict()["contexts"][0]["curve"]
              if x["batch"] == 1024)
    assert pt["waiting"] == 1024 - bm and pt["running_batch"] == bm
    assert pt["running_tpot_ms"] == pytest.approx(step_bm * 1e3)


# ---- 7: tensor-parallel sizes the engines accept --------------------------------------------
def test_num_gpus_that_cannot_shard_the_heads_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--num-gpus", "3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in captured.err
    assert "32 attention heads do not divide by 3" in err[0]
    assert "sizes that work: 1, 2, 4, 8, 16, 32" in err[0]


def test_tensor_parallel_rules() -> None:
    m = get_model("mixtral-8x22b")  # 48 heads, 8 KV heads: 3 and 6 split Q but not KV
    assert m.tensor_parallel_problem(3) is not None and "8 KV heads" in \
        (m.tensor_parallel_problem(3) or "")
    assert m.tensor_parallel_problem(16) is None  # KV heads replicate 2x
    assert get_model("qwen2.5-7b").tensor_parallel_sizes() == [1, 2, 4]  # 28 heads, 4 KV
    assert get_model("llama-3-8b").tensor_parallel_problem(2) is None
    # The smallest GPU count offered is one the engine accepts.
    d = DeploymentOptions("llama-3.1-405b").build()
    assert rl.min_gpus_that_fit(d, 2048) == 16


# ---- 8: an SLO no batch meets exits 3 and says the floor ------------------------------------
@pytest.mark.parametrize("as_json", [False, True])
def test_unmeetable_slo_exits_3(capsys: pytest.CaptureFixture[str], as_json: bool) -> None:
    argv = ["plan", "--context", "2048", "--max-tpot-ms", "5"] + (["--json"] if as_json else [])
    assert main(argv) == 3
    captured = capsys.readouterr()
    floor = rl.curve(DeploymentOptions().build(), [1], 2048).tpot_s[0] * 1e3
    assert (f"TPOT <= 5 ms cannot be met on this hardware at 2048 tokens: the floor is "
            f"{floor:.2f} ms at batch 1") in captured.err
    if as_json:
        c = json.loads(captured.out)["contexts"][0]
        assert c["sla_met"] is False and c["tpot_batch1_ms"] == pytest.approx(floor)
    else:
        assert "the SLO cannot be met on this hardware" in captured.out
    assert main(["plan", "--context", "2048", "--max-tpot-ms", "50", "--json"]) == 0


# ---- 10: the engines' own flag spellings -----------------------------------------------------
def test_engine_flag_spellings_are_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu-memory-utilization", "0.8", "--tensor-parallel-size", "2",
                 "--max-model-len", "4096", "--kv-cache-dtype", "fp8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["gpu_util"], d["num_gpus"], d["kv_dtype"]) == (0.8, 2, "fp8")
    assert [c["context_tokens"] for c in d["contexts"]] == [4096]
    parser = build_parser()
    aliases = ["--gpu-memory-utilization", "0.8", "--tensor-parallel-size", "2",
               "--kv-cache-dtype", "fp8"]
    for cmd in (["compare", "--max-model-len", "4096"], ["simulate"],
                ["sweep", "--url", "http://127.0.0.1:1"],
                ["calibrate", "x.csv", "--max-model-len", "4096"]):
        a = parser.parse_args([*cmd, *aliases])
        assert (a.gpu_util, a.num_gpus, a.kv_dtype) == (0.8, 2, "fp8"), cmd
    a = parser.parse_args(["fit", "x.csv", "--tensor-parallel-size", "2", "--kv-cache-dtype",
                           "fp8", "--max-model-len", "4096"])
    assert (a.num_gpus, a.kv_dtype, a.context) == (2, "fp8", 4096)


# ---- 11: the engines' defaults ----------------------------------------------------------------
def test_vllm_default_max_num_seqs_follows_its_gpu_rule() -> None:
    from bstar.engine_defaults import vllm_batch_defaults

    def seqs(gpu_id: str) -> int:
        g = get_gpu(gpu_id)
        return vllm_batch_defaults(g.memory_bytes, f"{g.id} {g.name}").max_num_seqs

    assert seqs("a100-80gb-sxm") == 256  # 80 GiB, but an A100
    assert seqs("h200") == 1024
    assert seqs("h100-sxm") == 1024
    assert seqs("l4") == 256


def test_plan_says_when_the_engine_default_is_above_b_mem() -> None:
    rc, out = run_in_pty(["plan", "--gpu", "h200", "--context", "8192"], columns=80)
    assert rc == 0, out
    d = DeploymentOptions(gpu="h200").build()
    bm = rl.b_mem(d, 8192)
    assert bm < 1024
    flat = " ".join(out.split())
    assert f"vLLM's default max_num_seqs 1024 is above B_mem = {bm}" in flat
    eds = make_plan(d, (8192,)).to_dict()["contexts"][0]["engine_defaults"]
    assert {e["engine"] for e in eds} == {"vllm", "sglang", "tgi"}
    assert eds[0]["max_num_seqs"] == 1024 and eds[0]["note"]
