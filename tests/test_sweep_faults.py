"""Faults injected by the local token server (bench/token_server.py), or by its in-process
fake (tests/fake_openai.py) where a real process adds nothing: each must be recorded per
request with its reason, the run's status must say what happened, nothing measured may be
lost; Ctrl-C then --resume completes; --server-cmd restarts the server per max_num_seqs.
Real processes stay where they matter: a clean run, a dying or killed server, Ctrl-C,
--server-cmd, and the API key through the CLI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bstar.cli import main
from bstar.loadgen.sweep import SweepConfig, load_result, run_sweep
from bstar.servers import free_port
from bstar.stats import poisson_gaps_s

pytest.importorskip("aiohttp", reason="needs aiohttp (a base dependency)")

from conftest import TOKEN_SERVER, TokenServerFactory
from fake_openai import FakeServer

FAST = {"interval_ms": 2}


def cfg(url: str, **kw: Any) -> SweepConfig:
    base: dict[str, Any] = {"url": url, "served_model": "tiny", "concurrency": [2],
                            "input_len": 8, "output_len": 8, "num_requests": 12,
                            "warmup_requests": 0, "request_timeout_s": 30,
                            "level_time_limit_s": 30, "scrape_interval_s": 0.2}
    base.update(kw)
    return SweepConfig(**base)


def kinds(db: Path, run_id: str) -> Counter[str]:
    res = load_result(db, run_id)
    c: Counter[str] = Counter()
    for lv in res.levels:
        c.update((lv.stats or {}).get("error_kinds") or {})
    return c


def db_requests(db: Path) -> list[tuple[Any, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT ok, error_kind, error FROM requests WHERE warmup = 0"
                           ).fetchall()
    finally:
        con.close()


@pytest.mark.slow  # starts the token server
def test_clean_run_records_everything(token_server: TokenServerFactory, tmp_path: Path) -> None:
    srv = token_server(**FAST)
    db = tmp_path / "r.db"
    res = run_sweep(cfg(srv.url, concurrency=[1, 4], warmup_requests=None), db=db)
    assert res.status == "completed"
    d = res.to_dict()
    assert [lv["requests"] for lv in d["levels"]] == [12, 12]
    for lv in d["levels"]:
        assert lv["errors"] == 0 and lv["token_source"] == "usage"
        # The server's schedule bounds what a load cannot shorten: 8 tokens 2 ms apart.
        assert lv["tpot_ms"]["p50"] > 0 and lv["e2e_ms"]["p50"] >= 7 * 2.0
        assert lv["running_max"] is not None
    rows = db_requests(db)
    assert len(rows) == 24 and all(ok for ok, _, _ in rows)  # warm-up stored apart
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM requests WHERE warmup = 1").fetchone()[0] == 1 + 4
    con.close()


def test_unreachable_url(tmp_path: Path) -> None:
    res = run_sweep(cfg(f"http://127.0.0.1:{free_port()}"), db=tmp_path / "r.db")
    assert res.status == "failed"
    assert "unreachable" in res.run["status_detail"]
    assert res.levels[0].status == "server_failed"


def test_wrong_model(tmp_path: Path) -> None:
    srv = FakeServer(**FAST)
    res = run_sweep(cfg(srv.url, served_model="nope"), db=tmp_path / "r.db",
                    session_factory=srv.session)
    assert res.status == "failed"
    assert "'nope' is not served" in res.run["status_detail"]


def test_404_on_wrong_path(tmp_path: Path) -> None:
    srv = FakeServer(**FAST)
    db = tmp_path / "r.db"
    res = run_sweep(cfg(srv.url + "/wrong", num_requests=40), db=db,
                    session_factory=srv.session)
    assert res.status == "failed"
    assert res.levels[0].status == "stopped_errors"
    errs = kinds(db, res.run_id)
    # --max-error-rate stops the level after 8 of 40; requests already started finish.
    assert set(errs) == {"http_404"} and 8 <= errs["http_404"] <= 12
    assert all(e and "HTTP 404" in e for _, _, e in db_requests(db))


@pytest.mark.slow  # starts the token server
def test_401_and_api_key_never_stored(token_server: TokenServerFactory, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "sk-test-SECRET-1234567890"
    srv = token_server(fault="401", api_key=secret, **FAST)
    db = tmp_path / "store" / "r.db"  # the fake server's own log (with its key) is apart
    bad = run_sweep(cfg(srv.url, num_requests=40), db=db, api_key="wrong")
    assert bad.status == "failed"
    errs = kinds(db, bad.run_id)
    assert set(errs) == {"http_401"} and 8 <= errs["http_401"] <= 12
    # The key from the environment, through the CLI, with JSON output.
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    rc = main(["sweep", "--url", srv.url, "--served-model", "tiny", "--concurrency", "2",
               "--input-len", "8", "--output-len", "4", "--num-requests", "6", "--db", str(db),
               "--json", "--quiet"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert json.loads(out.out)["levels"][0]["errors"] == 0
    blobs = [p.read_bytes() for p in db.parent.rglob("*") if p.is_file()]
    assert blobs and not any(secret.encode() in b for b in blobs)
    assert secret not in out.out + out.err
    rc = main(["runs", "--db", str(db), "show", json.loads(out.out)["run_id"], "--json"])
    assert secret not in capsys.readouterr().out


@pytest.mark.parametrize(("fault", "kind"), [("429", "http_429"), ("500", "http_5xx"),
                                             ("reset", "reset"), ("malformed", "malformed_sse")])
def test_intermittent_faults_are_recorded_and_level_continues(
        tmp_path: Path, fault: str, kind: str) -> None:
    srv = FakeServer(fault=fault, fault_every=3, **FAST)
    db = tmp_path / "r.db"
    res = run_sweep(cfg(srv.url, num_requests=12), db=db, session_factory=srv.session)
    lv = res.levels[0]
    assert lv.status == "completed"  # 1 in 3 is under --max-error-rate 0.5
    assert res.status == "completed_with_errors"
    assert kind in res.run["status_detail"]
    errs = kinds(db, res.run_id)
    assert set(errs) == {kind} and errs[kind] == 4
    assert lv.stats is not None and lv.stats["completed"] == 8
    assert lv.stats["throughput_tok_s"] > 0


@pytest.mark.slow  # starts the token server
def test_server_dying_mid_level(token_server: TokenServerFactory, tmp_path: Path) -> None:
    srv = token_server(fault="die", fault_every=5, **FAST)
    db = tmp_path / "r.db"
    res = run_sweep(cfg(srv.url, concurrency=[1, 2], num_requests=20), db=db)
    assert res.levels[0].status == "server_died"
    assert res.status == "failed" and "stopped answering" in res.run["status_detail"]
    rows = db_requests(db)
    assert sum(1 for ok, _, _ in rows if ok) == 5  # everything measured before is kept
    assert {k for ok, k, _ in rows if not ok} <= {"reset", "connect"}
    assert len(res.levels) == 1  # the sweep stopped: no point loading a dead server


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_level_time_limit(tmp_path: Path) -> None:
    srv = FakeServer(fault="hang", fault_every=4, **FAST)
    db = tmp_path / "r.db"
    t0 = time.monotonic()
    res = run_sweep(cfg(srv.url, concurrency=[2], num_requests=40, level_time_limit_s=2.0),
                    db=db, session_factory=srv.session)
    assert time.monotonic() - t0 < 20
    lv = res.levels[0]
    assert lv.status == "time_limit"
    errs = kinds(db, res.run_id)
    assert errs["time_limit"] == 2  # both streams stuck on a hung request at the limit
    assert lv.stats is not None and lv.stats["completed"] >= 3


def _as_from_a_shell() -> None:
    """The child starts with Ctrl-C's default disposition and unblocked, as from a shell:
    both are inherited across exec, and what earlier tests in this pytest process left
    there (a full CI run once left SIGINT without effect) is not the sweep's to inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


@pytest.mark.slow  # starts the token server
def test_sigint_then_resume(token_server: TokenServerFactory, tmp_path: Path) -> None:
    srv = token_server(interval_ms=20)
    db = tmp_path / "r.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "bstar", "sweep", "--url", srv.url, "--served-model", "tiny",
           "--concurrency", "1,2,4", "--input-len", "8", "--output-len", "10",
           "--num-requests", "16", "--db", str(db), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=_as_from_a_shell)
    deadline = time.monotonic() + 60
    n = 0
    while time.monotonic() < deadline:  # interrupt once level 2 has stored some requests
        time.sleep(0.1)
        if db.exists():
            con = sqlite3.connect(db)
            try:
                n = con.execute("SELECT COUNT(*) FROM requests q JOIN levels l ON "
                                "q.level_id = l.id WHERE l.idx = 1 AND q.warmup = 0"
                                ).fetchone()[0]
            except sqlite3.OperationalError:
                n = 0
            finally:
                con.close()
            if n >= 3:
                break
    assert n >= 3, "the sweep did not reach its second level"
    proc.send_signal(signal.SIGINT)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err.decode()
    assert b"--resume" in err
    with sqlite3.connect(db) as con:
        run_id, status = con.execute("SELECT id, status FROM runs").fetchone()
        levels = con.execute("SELECT idx, status FROM levels ORDER BY id").fetchall()
        kept = con.execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    assert status == "interrupted"
    assert levels == [(0, "completed"), (1, "interrupted")]
    _interrupted_level_counts_what_it_stored(db, run_id)
    rc = main(["sweep", "--resume", run_id, "--db", str(db), "--quiet", "--json"])
    assert rc == 0
    res = load_result(db, run_id)
    assert res.status == "completed"
    assert [lv.status for lv in res.levels] == ["completed"] * 3
    assert [lv.attempt for lv in res.levels] == [1, 2, 1]
    with sqlite3.connect(db) as con:
        assert con.execute("SELECT COUNT(*) FROM requests").fetchone()[0] > kept  # kept + new


@pytest.mark.slow  # starts the token server per level
def test_server_cmd_restarts_per_max_num_seqs(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    cmd = (f"{sys.executable} {TOKEN_SERVER} --port {{port}} --max-seqs {{max_num_seqs}} "
           "--interval-ms 10")
    res = run_sweep(SweepConfig(server_cmd=cmd, max_num_seqs=[1, 2, 4], concurrency=[4],
                                input_len=8, output_len=10, num_requests=16,
                                health_timeout_s=30, scrape_interval_s=0.1), db=db)
    assert res.status == "completed"
    d = res.to_dict()
    for lv, mns in zip(d["levels"], (1, 2, 4), strict=True):
        assert lv["max_num_seqs"] == mns
        assert lv["running_max"] == mns and lv["waiting_max"] >= 4 - mns - 1
        # cache_config_info: mns * 8 blocks of 16 tokens; a sequence of 18 tokens takes 2.
        assert lv["kv_capacity_seqs"] == mns * 8 // 2
        log = Path(lv["server_log"])
        assert log.is_file() and log.is_relative_to(tmp_path)
        assert f"--max-seqs {mns}" in log.read_text()


def test_chat_endpoint_counts_template_tokens(tmp_path: Path) -> None:
    srv = FakeServer(**FAST)
    db = tmp_path / "r.db"
    res = run_sweep(cfg(srv.url, endpoint="chat", input_len=40), db=db,
                    session_factory=srv.session)
    assert res.status == "completed"
    con = sqlite3.connect(db)
    got = con.execute("SELECT DISTINCT prompt_tokens, expected_prompt_tokens FROM requests"
                      ).fetchall()
    con.close()
    # The fake chat template adds 11 tokens per message: the content was sized to 29.
    assert got == [(40, 40)]
    assert (res.levels[0].stats or {})["client_cpu_pct"] is not None


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_open_loop_rate_levels(tmp_path: Path) -> None:
    srv = FakeServer(**FAST)
    res = run_sweep(cfg(srv.url, concurrency=None, rate=[20.0, 80.0], num_requests=40),
                    db=tmp_path / "r.db", session_factory=srv.session)
    assert res.status == "completed"
    d = res.to_dict()
    assert [lv["rate"] for lv in d["levels"]] == [20.0, 80.0]
    # The arrival schedule is the level's seeded Poisson draw: request k is due at the sum
    # of the first k gaps. A busy machine can only start requests late, never early, so the
    # measured spread of starts is at least the scheduled one (and not wildly more).
    con = sqlite3.connect(tmp_path / "r.db")
    for lv, rate in zip(res.levels, (20.0, 80.0), strict=True):
        # The live worker draws its gaps from stats.poisson_gaps_s, one per request sent,
        # seeded with the level's prompt seed (loadgen/worker.drive).
        rng = np.random.default_rng((lv.stats or {})["prompt_seed"])
        scheduled_s = sum(float(poisson_gaps_s(rate, rng, 1)[0]) for _ in range(39))
        starts = [r for (r,) in con.execute(
            "SELECT start_s FROM requests r JOIN levels l ON r.level_id = l.id "
            "WHERE l.idx = ? AND NOT r.warmup ORDER BY start_s", (lv.idx,))]
        assert len(starts) == 40
        assert starts[-1] - starts[0] >= scheduled_s - 0.005
        assert starts[-1] - starts[0] < scheduled_s + 30.0  # not a 1/rate mix-up
        assert (lv.stats or {})["duration_s"] >= scheduled_s - 0.005
    con.close()
    assert d["knee"]["points"] == 0 and "need at least two" in d["knee"]["note"]


@pytest.mark.slow  # starts the token server
def test_managed_server_killed_mid_level(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    cmd = (f"{sys.executable} {TOKEN_SERVER} --port {{port}} --max-seqs {{max_num_seqs}} "
           "--interval-ms 2 --fault die --fault-every 6")
    res = run_sweep(SweepConfig(server_cmd=cmd, max_num_seqs=[1, 2], input_len=8,
                                output_len=8, num_requests=20, warmup_requests=0,
                                health_timeout_s=30), db=db)
    for lv in res.levels:  # each value got a fresh server, and each one died
        assert lv.status == "server_died"
        assert lv.status_detail is not None and "server exited (code 1)" in lv.status_detail
        # 6 requests started before the 7th killed it; one may still have been streaming.
        assert lv.stats is not None and lv.stats["completed"] in (5, 6)  # kept
        assert lv.server_log and "token server" in Path(lv.server_log).read_text()
    assert res.status == "incomplete"  # --resume would retry both levels
    assert "server_died" in res.run["status_detail"]


def test_prompt_lengths_from_usage_without_tokenize(tmp_path: Path) -> None:
    srv = FakeServer(no_tokenize=True, **FAST)
    db = tmp_path / "r.db"
    res = run_sweep(cfg(srv.url, input_len=37), db=db, session_factory=srv.session)
    assert res.status == "completed"
    con = sqlite3.connect(db)
    got = con.execute("SELECT DISTINCT prompt_tokens FROM requests").fetchall()
    con.close()
    assert got == [(37,)]
    assert (res.levels[0].stats or {})["prompt_token_count_method"] == "usage"


def test_prompts_from_jsonl(tmp_path: Path) -> None:
    srv = FakeServer(**FAST)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": "p" * n, "output_len": 3 + n % 2})
                                 for n in (5, 6, 7)) + "\n")
    db = tmp_path / "r.db"
    res = run_sweep(cfg(srv.url, prompts_file=str(prompts), num_requests=6), db=db,
                    session_factory=srv.session)
    assert res.status == "completed"
    con = sqlite3.connect(db)
    got = con.execute("SELECT prompt_tokens, output_tokens FROM requests WHERE warmup = 0 "
                      "ORDER BY idx").fetchall()
    con.close()
    assert got == [(5, 4), (6, 3), (7, 4)] * 2  # used in order, cycling


def _interrupted_level_counts_what_it_stored(db: Path, run_id: str) -> None:
    """The interrupted level's row says how many measured requests it stored (it showed 0
    with some stored: issue 19, item 13)."""
    with sqlite3.connect(db) as con:
        (level_id,) = con.execute("SELECT id FROM levels WHERE status = 'interrupted'"
                                  ).fetchone()
        stored = con.execute("SELECT COUNT(*) FROM requests WHERE level_id = ? AND warmup = 0",
                             (level_id,)).fetchone()[0]
    lv = next(x for x in load_result(db, run_id).levels if x.status == "interrupted")
    assert stored > 0 and lv.stats is not None and lv.stats["requests"] == stored
    assert lv.to_dict()["requests"] == stored


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text() if (task / "children").exists() else ""
        out |= {int(x) for x in text.split()}
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_sigint_with_workers_keeps_every_record(token_server: TokenServerFactory,
                                                tmp_path: Path) -> None:
    """Ctrl-C in a terminal reaches the whole process group: the worker processes ignore
    it, the sweep cancels their requests in flight, stores every record they finished,
    marks the level interrupted with what it stored, and no worker outlives it."""
    srv = token_server(interval_ms=20)
    db = tmp_path / "r.db"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "bstar", "sweep", "--url", srv.url, "--served-model", "tiny",
           "--concurrency", "2,4", "--input-len", "8", "--output-len", "10",
           "--num-requests", "40", "--db", str(db), "--quiet", "--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True, preexec_fn=_as_from_a_shell)
    deadline = time.monotonic() + 90
    n = 0
    workers: set[int] = set()
    while time.monotonic() < deadline:  # interrupt once level 2 has stored some requests
        time.sleep(0.1)
        workers |= _children(proc.pid)
        if not db.exists():
            continue
        con = sqlite3.connect(db)
        try:
            n = con.execute("SELECT COUNT(*) FROM requests q JOIN levels l ON "
                            "q.level_id = l.id WHERE l.idx = 1 AND q.warmup = 0"
                            ).fetchone()[0]
        except sqlite3.OperationalError:
            n = 0
        finally:
            con.close()
        if n >= 3:
            break
    assert n >= 3, "the sweep did not reach its second level"
    assert len(workers) >= 2
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert b"--resume" in err and b"Traceback" not in err
    end = time.monotonic() + 10
    while any(_alive(p) for p in workers) and time.monotonic() < end:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers), "a load worker outlived the sweep"
    with sqlite3.connect(db) as con:
        run_id, status = con.execute("SELECT id, status FROM runs").fetchone()
        levels = con.execute("SELECT idx, status FROM levels ORDER BY id").fetchall()
        idx = [r[0] for r in con.execute(
            "SELECT q.idx FROM requests q JOIN levels l ON q.level_id = l.id "
            "WHERE l.idx = 1 AND q.warmup = 0")]
    assert status == "interrupted"
    assert levels == [(0, "completed"), (1, "interrupted")]
    assert len(idx) == len(set(idx)) >= n  # nothing stored twice, nothing lost
    _interrupted_level_counts_what_it_stored(db, run_id)
    rc = main(["sweep", "--resume", run_id, "--db", str(db), "--quiet", "--json"])
    assert rc == 0
    res = load_result(db, run_id)
    assert [lv.status for lv in res.levels] == ["completed"] * 2
    assert [(lv.stats or {}).get("requests") for lv in res.levels] == [40, 40]


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_silent_server_honours_request_timeout(tmp_path: Path) -> None:
    """A server that accepts connections and never answers (issue 19, item 5): the sweep
    gives up after --request-timeout, not 10 s, and says why."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)  # the kernel accepts; nobody ever reads or answers
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        res = run_sweep(cfg(url, request_timeout_s=2), db=tmp_path / "r.db")
    finally:
        sock.close()
    assert res.status == "failed"
    detail = res.run["status_detail"]
    assert "not answering" in detail and "within 2 s" in detail, detail
    assert res.levels[0].status == "server_failed"


def test_level_where_every_request_failed_is_failed(tmp_path: Path) -> None:
    """Fewer requests than the error-rate rule needs, all failing: the level is `failed`,
    not `completed` (issue 19, item 13)."""
    srv = FakeServer(fault="500", fault_every=1, **FAST)
    res = run_sweep(cfg(srv.url, num_requests=4), db=tmp_path / "r.db",
                    session_factory=srv.session)
    lv = res.levels[0]
    assert lv.status == "failed"
    assert lv.status_detail is not None and "every request failed" in lv.status_detail
    assert "http_5xx x4" in lv.status_detail
    assert res.status == "failed"


@pytest.mark.parametrize("flags", [["--concurrency", "0"], ["--concurrency", "-1"],
                                   ["--concurrency", "2,0"], ["--rate", "0"],
                                   ["--rate", "inf"], ["--rate", "nan"],
                                   ["--concurrency", "2", "--workers", "-1"],
                                   ["--concurrency", "2", "--warmup-requests", "-1"]])
def test_bad_load_flags_exit_2_with_one_line(flags: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 19, item 4: no level runs on a load that cannot be sent."""
    db = tmp_path / "r.db"
    try:  # refused by the flag's parser (SystemExit 2) or by SweepConfig.validate (rc 2)
        rc = main(["sweep", "--url", "http://127.0.0.1:9", *flags, "--db", str(db),
                   "--quiet"])
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    assert flags[-2] in lines[0]
    assert not db.exists()
