"""`bstar search` on every backend: the same answer in-process, in a process pool and on a
local Ray head; resume after a kill; and sanity against the planner."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bstar.cli import main
from bstar.deployment import Deployment
from bstar.plan import make_plan
from bstar.search import (
    InProcess,
    ProcessPool,
    RayBackend,
    SearchSpec,
    SearchStore,
    Traffic,
    run_search,
)
from bstar.search.evaluate import failures
from bstar.sim import (
    Lengths,
    Poisson,
    SchedulerConfig,
    SimConfig,
    parse_lengths,
    parse_slo,
    simulate_levels,
)
from bstar.specs.gpu import get_gpu
from bstar.specs.presets import get_model

# Whole searches in process pools, a Ray head and killed subprocesses: minutes, not seconds.
pytestmark = pytest.mark.slow

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _spec() -> SearchSpec:
    return SearchSpec(("llama-3-8b", "llama-3-70b"), ("a100-80gb-sxm", "l40s"),
                      Traffic(8.0, parse_lengths("lognormal:256:256"),
                              parse_lengths("lognormal:128:96"), num_requests=100, seed=5,
                              draws=2),
                      parse_slo("ttft:1500,tpot:60"), num_gpus=(1, 2, 4),
                      max_num_seqs=(32, 128))


def _answer(rows: list[dict[str, object]]) -> str:
    return json.dumps(rows, sort_keys=True)


def test_process_pool_gives_the_in_process_answer(tmp_path: Path) -> None:
    spec = _spec()
    with InProcess() as b:
        a = run_search(spec, b, SearchStore(tmp_path / "a.db"))
    with ProcessPool(2) as b:
        p = run_search(spec, b, SearchStore(tmp_path / "p.db"))
    assert a.counts()["evaluations"] >= 8
    assert _answer(a.rows) == _answer(p.rows)
    assert p.timing["evaluations_run"] == a.timing["evaluations_run"]


@pytest.mark.ray
def test_ray_local_head_gives_the_in_process_answer(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    spec = _spec()
    with InProcess() as b:
        a = run_search(spec, b, SearchStore(tmp_path / "a.db"))
    backend = RayBackend(None, 2)
    with backend:
        r = run_search(spec, backend, SearchStore(tmp_path / "r.db"))
        assert "local cluster" in backend.describe()
    assert backend.workers == 2 and backend.start_s > 0
    assert _answer(a.rows) == _answer(r.rows)


def test_resume_after_kill_gives_the_same_answer(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    argv = ["search", "--model", "llama-3-8b,llama-3-70b", "--gpu", "a100-80gb-sxm,h100-sxm",
            "--num-gpus", "1,2,4", "--rate", "8", "--input-len", "lognormal:256:256",
            "--output-len", "lognormal:160:120", "--num-requests", "300", "--draws", "1",
            "--slo", "ttft:1500,tpot:60", "--max-num-seqs", "16,64,256"]
    env = dict(os.environ, PYTHONPATH=SRC)
    proc = subprocess.Popen([sys.executable, "-m", "bstar.cli", *argv, "--db", str(db),
                             "--json"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    stored = 0
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if db.exists():
                try:
                    with sqlite3.connect(db, timeout=5) as c:
                        stored = c.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
                except sqlite3.OperationalError:
                    stored = 0  # the schema is not there yet
            if stored >= 3:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the search finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with sqlite3.connect(db) as c:
        status = c.execute("SELECT status FROM searches").fetchone()[0]
        killed_rows = c.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    assert status == "running" and killed_rows >= 3  # killed mid-run, rows kept
    assert main([*argv, "--db", str(db), "--resume", "--json"]) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed["timing"]["evaluations_reused"] == killed_rows
    assert resumed["timing"]["evaluations_run"] == resumed["counts"]["evaluations"] - killed_rows
    assert main([*argv, "--db", str(tmp_path / "fresh.db"), "--json"]) == 0
    fresh = json.loads(capsys.readouterr().out)
    assert _answer(resumed["candidates"]) == _answer(fresh["candidates"])
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT status FROM searches").fetchone()[0] == "completed"


def test_sanity_against_the_planner(tmp_path: Path) -> None:
    """At a low demand the winner's max_num_seqs stays within plan's B_mem even when the grid
    offers more; latency-bound winners still meet the SLO with another seed."""
    d_model, gpu = "llama-3-70b", "a100-80gb-sxm"
    slo = parse_slo("ttft:2000,tpot:45")
    traffic = Traffic(0.5, Lengths.fixed(512), Lengths.fixed(128), num_requests=400, seed=0,
                      draws=5)
    spec = SearchSpec((d_model,), (gpu,), traffic, slo, num_gpus=(2, 4),
                      max_num_seqs=(16, 256, 4096))
    with InProcess() as b:
        res = run_search(spec, b, SearchStore(tmp_path / "s.db"))
    w = res.winners[d_model]
    d = Deployment(get_model(d_model), get_gpu(gpu), w["tensor_parallel"])
    b_mem = make_plan(d, [512 + 128]).contexts[0].b_mem
    assert w["max_num_seqs"] <= b_mem, (w["max_num_seqs"], b_mem)
    assert max(spec.max_num_seqs) > b_mem  # the grid offered more: capped at B_mem
    checked = 0
    for r in res.rows:
        if r["status"] != "ok" or r["limit"] != "SLO":
            continue
        dd = Deployment(get_model(r["model"]), get_gpu(r["gpu"]), r["tensor_parallel"])
        cfg = SimConfig(SchedulerConfig(r["max_num_seqs"], r["max_num_batched_tokens"]))
        (s,) = simulate_levels(dd, [r["max_num_seqs"]], Poisson(r["rate_per_replica_req_s"]),
                               traffic.input_len, traffic.output_len, traffic.num_requests,
                               seed=12345,
                               config=cfg, slo=slo)
        assert not failures(s, slo), (r["replica_key"], failures(s, slo))
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize("jobs", [1, 2])
def test_ctrl_c_stops_cleanly_and_resume_finishes(tmp_path: Path, jobs: int) -> None:
    """A KeyboardInterrupt mid-search (here raised from the progress callback, where Ctrl-C
    would land) leaves the finished rows stored and the search marked interrupted; --resume
    runs only the rest."""
    spec = _spec()
    store = SearchStore(tmp_path / "s.db")

    def stop_after_two(done: int, total: int) -> None:
        if done >= 2:
            raise KeyboardInterrupt

    backend = ProcessPool(jobs) if jobs > 1 else InProcess()
    with pytest.raises(KeyboardInterrupt), backend:
        run_search(spec, backend, store, progress=stop_after_two)
    sid = spec.search_id()
    assert store.status(sid) == "interrupted" and store.count(sid) == 2
    with InProcess() as b:
        res = run_search(spec, b, store, resume=True)
    assert res.timing["evaluations_reused"] == 2
    assert res.timing["evaluations_run"] == res.counts()["evaluations"] - 2
    assert store.status(sid) == "completed"
