"""The hit rate a sweep measured drives the prediction: `--from-run` reads a stored sweep's
lengths and prefix-cache counters, and a search sized on it buys fewer GPUs than the same
search with caching off, saying why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bstar.cli import main
from bstar.loadgen.client import RequestRecord
from bstar.loadgen.measured import measured_traffic
from bstar.loadgen.store import Store


def stored_sweep(db: Path, hit_rate: float) -> str:
    """A finished one-level sweep: 50 requests of 3000-3490 prompt tokens, 100 out, and
    the server's prefix-cache counters at `hit_rate`."""
    with Store(db) as s:
        rid = s.create_run(url="http://127.0.0.1:1/v1", served_model="m", model="llama-3-8b",
                           gpu="h100-sxm", options={}, bstar_version="test", run_id="run-hit")
        lid, _ = s.start_level(rid, 0, concurrency=8, rate=None, max_num_seqs=None)
        prompts = [3000 + 10 * i for i in range(50)]
        for i, p in enumerate(prompts):
            s.add_request(lid, RequestRecord(index=i, ok=True, start_s=0.0, ttft_s=0.1,
                                             e2e_s=1.0, prompt_tokens=p, output_tokens=100))
        q = sum(prompts)
        s.finish_level(lid, status="completed", server={
            "prefix_cache_hit_tokens": int(hit_rate * q), "prefix_cache_query_tokens": q})
        s.update_run(rid, status="completed")
    return rid


def test_measured_traffic_reads_lengths_and_hit_rate(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    stored_sweep(db, 0.9)
    m = measured_traffic(db, "run-hit")
    assert len(m.prompt_tokens) == 50 and set(m.output_tokens) == {100}
    assert m.hit_rate == pytest.approx(0.9, abs=1e-4)
    assert m.shared_prefix_tokens == round(0.9 * 3245)  # mean prompt 3245
    inp, _ = m.lengths()
    own = [int(x) for x in inp.removeprefix("empirical:").split(",")]
    assert own[0] == 3000 - m.shared_prefix_tokens  # the prefix is added back by the shape
    assert m.lengths(shared=False)[0].startswith("empirical:3000,")


@pytest.mark.slow
def test_search_from_a_high_hit_rate_run_buys_fewer_gpus(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stored_sweep(tmp_path / "runs.db", 0.9)
    base = ["search", "--from-run", "run-hit", "--runs-db", str(tmp_path / "runs.db"),
            "--rate", "20", "--slo", "ttft:2000,tpot:100", "--gpu", "h100-sxm",
            "--num-gpus", "1,2,4", "--draws", "1", "--num-requests", "200", "--json"]
    gpus = {}
    for name, extra in (("cached", []), ("off", ["--no-prefix-caching"])):
        assert main([*base, "--db", str(tmp_path / f"{name}.db"), *extra]) == 0
        out, err = capsys.readouterr()
        gpus[name] = json.loads(out)["winners"]["llama-3-8b"]["gpus_total"]
        if name == "cached":  # says why
            assert "measured prefix-cache hit rate 90.0%" in err
            assert "shared prefix" in err
    assert gpus["cached"] < gpus["off"]


def test_simulate_from_run_shows_measured_beside_simulated_hit_rate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stored_sweep(tmp_path / "runs.db", 0.9)
    args = ["simulate", "--from-run", "run-hit", "--runs-db", str(tmp_path / "runs.db"),
            "--rate", "2", "--num-requests", "60", "--max-num-seqs", "16"]
    assert main([*args, "--json"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["from_run"]["prefix_cache_hit_rate"] == pytest.approx(0.9, abs=1e-4)
    # One shared prefix of 0.9 x the mean prompt: every request but the first hits it, in
    # whole blocks.
    assert obj["prefix_cache_hit_rate"] == pytest.approx(0.9, abs=0.03)
    assert main(args) == 0
    assert "prefix-cache hit rate at max_num_seqs 16: measured 90.0%, simulated" in \
        capsys.readouterr().out
