"""Issue 40, part B: hostile output and process cases, each through the CLI or the
function that owns the rule.

- The overwrite guard (-o, --plot, demo's files) replaces only a file that starts with the
  header bstar writes for that kind of output, never one that quotes a marker further down
  (item 6), and demo checks all its files before anything starts (item 8).
- A full disk or a closed stdout is one line and exit 1; a broken pipe exits quietly (item 7).
- A key in the --url query is masked where passwords are (item 9); "passwd: No such file"
  is not a secret.
- Ray failures past the retry budget are one line naming the candidate (item 10).
- demo stops its server and prints one line on SIGTERM/SIGHUP in every phase (item 11).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bounded import run_bstar
from bstar import safeio
from bstar.cli import main

ROOT = Path(__file__).resolve().parent.parent
BOUND_S = 30


def run(argv: list[str]) -> tuple[int, str, str]:
    """`bstar ARGV` in-process: (status, stdout, stderr), bounded in time."""
    return run_bstar(argv, BOUND_S)


def one_line_error(argv: list[str], *words: str, status: int = 2) -> str:
    got, _, err = run(argv)
    lines = err.strip().splitlines()
    assert got == status, (argv[:6], got, err[-800:])
    assert "Traceback" not in err and len(lines) == 1, err[-800:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# ---- item 6: the overwrite guard reads a header at the start ------------------------------
# The markers the guard once looked for anywhere in a file's first 8 KB.
QUOTED_MARKERS = (
    b'<meta name="generator" content="bstar 1.0">',
    b"tEXtSoftware\x00bstar",
    b"<dc:title>bstar</dc:title>",
    b"# bstar calibration profile (`bstar calibrate`); use with --profile THIS_FILE",
    b"# Measured by `bstar probe`; load with --gpu THIS_FILE.",
    b'{"generator": "bstar 1.0"}',
)


@pytest.mark.parametrize("marker", QUOTED_MARKERS)
def test_a_marker_quoted_in_a_users_file_is_not_bstars_header(tmp_path: Path,
                                                               marker: bytes) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"My notes on bstar's outputs. Its files carry:\n" + marker + b"\n")
    assert not safeio.written_by_bstar(notes)
    # ...and so bstar refuses to replace it, whatever it would write there.
    for flag in ("-o", "--plot"):
        with pytest.raises(safeio.BstarError, match="--force"):
            safeio.check_output(notes, flag)
    safeio.check_output(notes, "-o", force=True)  # --force still overrides


def test_each_writers_own_header_is_recognised_for_its_kind_only() -> None:
    from bstar.probe import probe_cpu

    probe = probe_cpu(1 << 20, 32, 1, 1).to_toml().encode()
    assert safeio.starts_as_bstars(probe, ("probe",))
    assert not safeio.starts_as_bstars(probe, ("profile", "html", "png", "svg", "json"))
    # Indenting the header, or text before it, is no longer bstar's start.
    assert not safeio.starts_as_bstars(b"x\n" + probe)
    assert not safeio.starts_as_bstars(b" " + probe)


@pytest.mark.slow  # ~3 s: draws a report, a PNG and an SVG
def test_outputs_replace_only_their_own_kind(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    assert run(["report", "plan", "--context", "512", "-o", str(report)])[0] == 0
    html = report.read_bytes()
    assert safeio.starts_as_bstars(html, ("html",))
    pts = tmp_path / "pts.csv"
    pts.write_text("batch,tpot_ms\n1,10\n2,10.4\n4,11\n8,12.5\n")
    # calibrate -o onto a report: a report is bstar's, but not a profile.
    one_line_error(["calibrate", str(pts), "--model", "llama-3-8b", "--gpu", "h100-sxm",
                    "--context", "1024", "-o", str(report)], "--force", "calibration profile")
    one_line_error(["plan", "--plot", str(report)], "--force")
    assert report.read_bytes() == html
    profile = tmp_path / "cal.toml"
    assert run(["calibrate", str(pts), "--model", "llama-3-8b", "--gpu", "h100-sxm",
                "--context", "1024", "-o", str(profile)])[0] == 0
    assert safeio.starts_as_bstars(profile.read_bytes(), ("profile",))
    for suffix in (".png", ".svg"):
        pic = tmp_path / f"p{suffix}"
        assert run(["plan", "--context", "512", "--plot", str(pic)])[0] == 0
        assert safeio.starts_as_bstars(pic.read_bytes(), (suffix[1:],)), suffix
        assert run(["plan", "--context", "512", "--plot", str(pic)])[0] == 0, suffix
        # A report's -o never replaces a chart.
        html_name = pic.with_suffix(".html")
        html_name.write_bytes(pic.read_bytes())
        one_line_error(["report", "plan", "-o", str(html_name)], "--force")


# ---- item 7: stdout that cannot be written ------------------------------------------------
def _bstar(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "bstar", *argv], env=env, text=True,
                          stderr=subprocess.PIPE, timeout=120, check=False, **kw)  # type: ignore[call-overload]


def _one_line(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err[-800:]
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.slow  # starts four interpreters
@pytest.mark.parametrize("argv", [["plan", "--json"], ["plan"]])
def test_a_full_disk_or_a_closed_stdout_is_one_line_and_exit_1(argv: list[str]) -> None:
    if not Path("/dev/full").exists():  # pragma: no cover
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        r = _bstar(argv, stdout=full)
    assert r.returncode == 1
    _one_line(r.stderr, "cannot write to standard output", "No space left")
    # `bstar ... >&-`: fd 1 closed before Python starts (sys.stdout is None).
    r = _bstar(argv, preexec_fn=lambda: os.close(1))
    assert r.returncode == 1
    _one_line(r.stderr, "standard output is closed")


@pytest.mark.slow  # starts two interpreters
def test_a_closed_stderr_never_lands_in_stdout() -> None:
    # `2>&-`: Python's sys.stderr is None, and print(file=None) writes to stdout.
    def close_stderr() -> None:
        os.close(2)

    r = subprocess.run([sys.executable, "-m", "bstar", "plan", "--model", "no-such-model"],
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, text=True,
                       stdout=subprocess.PIPE, timeout=120, check=False,
                       preexec_fn=close_stderr)
    assert r.returncode == 2 and r.stdout == ""
    r = subprocess.run([sys.executable, "-m", "bstar", "plan", "--json"],
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, text=True,
                       stdout=subprocess.PIPE, timeout=120, check=False,
                       preexec_fn=close_stderr)
    assert r.returncode == 0 and json.loads(r.stdout)["model"]


@pytest.mark.slow  # starts two interpreters
@pytest.mark.parametrize("argv", [["gpus", "--json"], ["gpus"]])
def test_a_broken_pipe_ends_quietly(argv: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.Popen([sys.executable, "-m", "bstar", *argv], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.close()  # `| head -c 0`: the reader is gone before bstar writes
    err = p.stderr.read()
    assert p.wait(timeout=120) == 1
    assert err == "", err[-800:]


# ---- item 9: a key in the --url query; "passwd: No such file" -----------------------------
QUERY_KEY = "Qk4vT9zLm2Xw7RbN5cJ8"  # no pattern's shape: only its place in the URL tells


@pytest.fixture(autouse=True)
def _registry_restored() -> Iterator[None]:
    """The redaction registry as it was: what a test registers stays in that test."""
    from bstar import redact

    saved = set(redact._registered)
    yield
    redact._registered.clear()
    redact._registered.update(saved)


@pytest.mark.parametrize("param", ["token", "key", "api_key", "access_token", "X-Amz-Signature"])
def test_a_url_query_credential_is_masked_and_registered(param: str) -> None:
    from bstar import redact

    url = f"http://127.0.0.1:8000/v1?{param}={QUERY_KEY}&max_tokens=16"
    assert redact.redact_url(url) == f"http://127.0.0.1:8000/v1?{param}=***&max_tokens=16"
    # The registry has it: a server's echo of the bare value is masked too.
    redact.register_url(url)
    assert redact.redact(f"unknown key {QUERY_KEY}") == "unknown key ***"


def test_an_os_error_after_passwd_is_not_a_secret() -> None:
    from bstar.redact import redact

    for text in ("passwd: No such file", "cat: /etc/passwd: No such file or directory",
                 "secret: Permission denied", f"password: {os.strerror(21)}"):
        assert redact(text) == text
    # Real masking holds: one word, a quoted value, a near miss, an `=` pair.
    assert redact("passwd: hunter2") == "passwd: ***"
    assert redact("password: No") == "password: ***"
    assert redact('{"password": "No such file"}') == '{"password": "*** such file"}'
    assert redact("passwd: Nosuchfile or directory") == "passwd: *** or directory"
    assert redact("password=No such") == "password=*** such"


@pytest.mark.slow  # a sweep against a 127.0.0.1 server: ~2 s
def test_a_url_query_key_is_never_stored_or_printed(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from hostile_fake import HostileServer

    db = tmp_path / "store" / "r.db"
    with HostileServer() as s:
        url = f"{s.url}/?token={QUERY_KEY}"
        rc = main(["sweep", "--url", url, "--served-model", "tiny", "--concurrency", "1",
                   "--input-len", "8", "--output-len", "4", "--num-requests", "2",
                   "--warmup-requests", "0", "--max-error-rate", "1", "--db", str(db),
                   "--json", "--quiet"])
    out = capsys.readouterr()
    assert rc == 0, out.err[-800:]
    texts = [out.out, out.err]
    for argv in (["list"], ["list", "--json"]):
        main(["runs", "--db", str(db), *argv])
        texts.append(capsys.readouterr().out)
    assert "token=***" in texts[-1]  # the run is there, its key masked
    files = [p.read_bytes().decode("utf-8", "replace") for p in db.parent.rglob("*")
             if p.is_file()]
    assert not [t for t in texts + files if QUERY_KEY in t]


# ---- item 8: demo guards each file it writes, up front ------------------------------------
DEMO_RUN = ROOT / "tests" / "fixtures" / "demo-run" / "bstar-demo"
DEMO_FILES = ["this-cpu.toml", "sweep.json", "report.html", "calibration.toml", "bstar.db",
              "tiny-llama/config.json"]


@pytest.mark.parametrize("name", DEMO_FILES)
def test_demo_refuses_a_users_file_before_anything_starts(tmp_path: Path, name: str) -> None:
    # Refused before the extras are even imported: this runs without them.
    out = tmp_path / "demo"
    mine = out / name
    mine.parent.mkdir(parents=True)
    mine.write_text("my own notes\n")
    one_line_error(["demo", "-o", str(out), "--concurrency", "1,2,4"], name, "--force")
    assert mine.read_text() == "my own notes\n"
    # Nothing started: no model copy, no probe, no server log, no DB.
    made = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert made == [name]


def test_demo_replaces_an_earlier_demos_files_and_force_replaces_a_users(
        tmp_path: Path) -> None:
    import shutil

    from bstar.commands.demo import DB_NAME, guard_demo_outputs
    from bstar.errors import BstarError

    out = tmp_path / "demo"
    shutil.copytree(DEMO_RUN, out)  # an earlier demo's probe file, model config and DB
    (out / "sweep.json").write_text('{\n  "generator": "bstar 0.1",\n  "levels": []\n}\n')
    guard_demo_outputs(out, force=False)
    # A foreign bstar.db is refused, and replaced (removed first) only with --force.
    (out / DB_NAME).write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    with pytest.raises(BstarError, match="not a bstar results DB"):
        guard_demo_outputs(out, force=False)
    guard_demo_outputs(out, force=True)
    assert not (out / DB_NAME).exists()


def test_demo_refuses_fewer_levels_than_the_fit_needs_at_once(tmp_path: Path) -> None:
    from bstar.fit.points import MIN_POINTS

    levels = ",".join(str(2 ** i) for i in range(MIN_POINTS - 1))
    one_line_error(["demo", "-o", str(tmp_path / "d"), "--concurrency", levels],
                   "--concurrency", f"at least {MIN_POINTS}")
    assert not (tmp_path / "d").exists()  # refused before the folder was made


# ---- item 11: demo and signals --------------------------------------------------------------
def _servers_logging_to(log: Path) -> list[int]:
    """The processes whose stdout is `log` (the llama.cpp server demo started, and only it:
    the log is this test's own file)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(d / "fd" / "1") == str(log):
                    pids.append(int(d.name))
    return pids


def _wait_for(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return False


@pytest.mark.slow  # starts llama.cpp on the CPU
@pytest.mark.parametrize(("sig", "phase"), [(signal.SIGTERM, "starting"),
                                            (signal.SIGTERM, "sweeping"),
                                            (signal.SIGHUP, "sweeping")])
def test_a_signal_stops_demo_and_its_server_in_every_phase(tmp_path: Path, sig: int,
                                                           phase: str) -> None:
    pytest.importorskip("xllamacpp", reason="demo needs the extra bstar[llamacpp]")
    # A demo that finished before the signal landed (exit 0, report written: this test's
    # reader, starved behind a busy machine, read level 1's line after the sweep had ended)
    # did not test anything: it runs once more. A signal that lands and is lost fails.
    assert (_signal_demo(tmp_path / "try1", sig, phase)
            or _signal_demo(tmp_path / "try2", sig, phase)), (
        "the demo finished before the signal twice: lengthen its sweep")


def _default_signals() -> None:
    """In the demo's process: SIGTERM and SIGHUP at their default actions. A suite started
    under nohup (or by a runner that ignores SIGHUP) passes SIG_IGN on, and the demo rightly
    keeps an ignored SIGHUP ignored (loadgen/sweep.signals_as_interrupts): the test would
    send a signal the demo was told to ignore (it then finished, exit 0: this test failed
    so in a suite started with nohup)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


LEVEL_LINE = re.compile(r"^\[\s*[\d.]+s\]   \S+: ")  # demo's line as a level of the sweep ends


def _signal_demo(tmp_path: Path, sig: int, phase: str) -> bool:
    """One demo, signalled in `phase`; False when it had finished before the signal came."""
    out = tmp_path / "demo"
    log = out / "llamacpp.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    # The levels after the first must outlast the test's read of the first level's line on a
    # loaded machine: at 8 requests of 32 tokens the whole demo once finished (exit 0, report
    # written) before the signal came, in the full suite beside other work. 128 tokens make
    # levels 2 and 4 about four times as long; the signal still lands after level 1.
    p = subprocess.Popen([sys.executable, "-m", "bstar", "demo", "-o", str(out),
                          "--concurrency", "1,2,4", "--num-requests", "8", "--output-len",
                          "128", "--threads", "1"], env=env, text=True,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         preexec_fn=_default_signals)
    assert p.stderr is not None
    seen: list[str] = []
    try:
        if phase == "starting":
            # As soon as the server process exists: it is loading, not yet healthy.
            assert _wait_for(lambda: bool(_servers_logging_to(log)) or p.poll() is not None,
                             120), "no server started"
        else:
            for line in p.stderr:  # the first level measured: inside the sweep
                seen.append(line)
                if LEVEL_LINE.match(line):
                    break
            assert _servers_logging_to(log), seen
        assert p.poll() is None, "the demo ended before the signal: lengthen its sweep"
        p.send_signal(sig)
        err = p.stderr.read()
        rc = p.wait(timeout=120)
        if rc == 0 and "report written" in err:
            return False
        assert rc == 130, [*seen[-5:], err[-2000:]]
        assert "Traceback" not in err, err[-2000:]
        lines = [x for x in err.splitlines() if x.startswith("bstar:")]
        assert len(lines) == 1 and "demo interrupted" in lines[0], err[-2000:]
        assert "--resume" not in err  # the server a resume would need is gone
        if phase == "sweeping":  # what was measured is named, and kept
            assert "runs show" in lines[0], lines[0]
        # The server is stopped, not left to init.
        assert _wait_for(lambda: not _servers_logging_to(log), 10), _servers_logging_to(log)
        return True
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        for pid in _servers_logging_to(log):  # what the code under test left: this test's
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


# ---- round 2's leftover: a 300-character name in a --plot, --db or -o path -------------------
LONG = "a" * 300


@pytest.mark.parametrize("where", [f"{LONG}/x", f"{LONG}"], ids=["folder", "file"])
@pytest.mark.parametrize("argv", [
    ["plan", "--plot", "{p}.png"],
    ["report", "plan", "-o", "{p}.html"],
    ["runs", "--db", "{p}.db", "list"],
    ["sweep", "--db", "{p}.db", "--url", "http://127.0.0.1:9", "--concurrency", "1",
     "--num-requests", "1", "--served-model", "m", "--quiet"],
    ["search", "--db", "{p}.db", "--rate", "1", "--slo", "ttft:1000"],
])
def test_a_name_too_long_for_the_file_system_is_one_line(tmp_path: Path, where: str,
                                                         argv: list[str]) -> None:
    path = str(tmp_path / where)
    line = one_line_error([a.replace("{p}", path) for a in argv], "over the 255")
    assert "Traceback" not in line and "OSError" not in line
    assert list(tmp_path.iterdir()) == []


# ---- item 10: Ray failures past the retry budget -------------------------------------------
class _FakeRay:
    """Ray's API as RayBackend uses it, run in this process: the `crash_at`-th task's
    result is `error` (what Ray raises once a task's retries are spent); the others run."""

    def __init__(self, error: BaseException, crash_at: int) -> None:
        import ray.exceptions

        self.exceptions = ray.exceptions
        self.error, self.crash_at = error, crash_at
        self.submitted = 0
        self.cancelled: list[object] = []

    def remote(self, **_: object) -> Callable[[Callable[[object], object]], object]:
        fake = self

        class _Remote:
            def __init__(self, fn: Callable[[object], object]) -> None:
                self.fn = fn

            def remote(self, x: object) -> tuple[int, Callable[[object], object], object]:
                fake.submitted += 1
                return (fake.submitted, self.fn, x)

        return _Remote

    def wait(self, pending: list[object], num_returns: int) -> tuple[list[object], list[object]]:
        return pending[:num_returns], pending[num_returns:]

    def get(self, ref: tuple[int, Callable[[object], object], object]) -> object:
        n, fn, x = ref
        if n == self.crash_at:
            raise self.error
        return fn(x)

    def cancel(self, ref: object, force: bool) -> None:
        self.cancelled.append(ref)


@pytest.mark.slow  # imports Ray (seconds) and runs a small search twice
@pytest.mark.parametrize("error", ["WorkerCrashedError", "LocalRayletDiedError"])
def test_a_ray_task_past_its_retries_is_one_line_and_the_search_resumes(
        tmp_path: Path, error: str) -> None:
    pytest.importorskip("ray")
    import ray.exceptions

    from bstar.errors import BstarError
    from bstar.search import (
        InProcess,
        RayBackend,
        SearchSpec,
        SearchStore,
        Traffic,
        run_search,
    )
    from bstar.sim import parse_lengths, parse_slo

    spec = SearchSpec(("llama-3-8b",), ("a100-80gb-sxm",),
                      Traffic(4.0, parse_lengths("fixed:128"), parse_lengths("fixed:32"),
                              num_requests=30, seed=1, draws=1),
                      parse_slo("ttft:2000,tpot:100"), num_gpus=(1, 2), max_num_seqs=(16, 64))
    fake = _FakeRay(getattr(ray.exceptions, error)(), crash_at=2)
    backend = RayBackend(None, 1)
    backend._ray = fake
    store = SearchStore(tmp_path / "s.db")
    with pytest.raises(BstarError) as e:
        run_search(spec, backend, store)
    line = str(e.value)
    assert "\n" not in line and error in line and "--resume" in line
    assert "candidate llama-3-8b|a100-80gb-sxm|tp" in line  # the one that failed, named
    assert fake.cancelled  # what was still pending was cancelled
    # Resumable: the row finished before the failure is reused, the rest run.
    with InProcess() as b:
        resumed = run_search(spec, b, SearchStore(tmp_path / "s.db"), resume=True)
    with InProcess() as b:
        fresh = run_search(spec, b, SearchStore(tmp_path / "fresh.db"))
    assert resumed.timing["evaluations_reused"] == 1
    assert json.dumps(resumed.rows, sort_keys=True) == json.dumps(fresh.rows, sort_keys=True)


def _die(code: int) -> None:
    os._exit(code)  # a worker killed in the middle of its task, every time


@pytest.mark.ray
@pytest.mark.slow  # a local Ray head: 20 s
def test_a_real_ray_worker_killed_twice_is_a_task_failure() -> None:
    pytest.importorskip("ray")
    from ray import cloudpickle

    from bstar.search.backends import RAY_MAX_RETRIES, RayBackend, TaskFailed

    # The workers cannot import this test module: the function travels by value.
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with RayBackend(None, 1) as b, pytest.raises(TaskFailed) as e:
            list(b.imap_unordered(_die, [3]))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert e.value.index == 0
    assert "WorkerCrashedError" in e.value.why and f"after {RAY_MAX_RETRIES} retry" in e.value.why


def _sleep_then(x: int) -> int:
    time.sleep(x)
    return x


@pytest.mark.ray
@pytest.mark.slow  # a local Ray head, its raylet killed: about 30 s
def test_a_dead_raylet_is_one_line_not_rays_log_dump(capfd: pytest.CaptureFixture[str]) -> None:
    """Issue 40: with the raylet killed, bstar's error was one line, but Ray's driver printed
    the raylet's last 20 log lines (and the node's death notice) around it, about 40 lines
    on stdout from its own thread. They are held; the error says what Ray said first."""
    pytest.importorskip("ray")
    from ray import cloudpickle

    from bstar.search.backends import RayBackend, TaskFailed

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        with RayBackend(None, 1) as b:
            import ray

            node = ray._private.worker._global_node
            raylet_pid = node.all_processes["raylet"][0].process.pid
            it = b.imap_unordered(_sleep_then, [4, 0, 0])
            time.sleep(1)
            os.kill(raylet_pid, signal.SIGKILL)
            with pytest.raises(TaskFailed) as e:
                list(it)
            time.sleep(3)  # Ray's reporting thread runs on its own time
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert "LocalRayletDiedError" in e.value.why and "\n" not in e.value.why
    out, err = capfd.readouterr()
    assert "(raylet)" not in out + err and "state-dump" not in out + err


@pytest.mark.ray
@pytest.mark.slow  # a local Ray head and one actor: about 15 s
def test_sweep_ray_actor_lost_is_one_line_and_raylet_reports_held() -> None:
    """Issue 40: `sweep --ray`'s load actors now hold Ray's raylet reports as `search --ray`
    does, and an actor Ray lost (killed) ends the sweep with one BstarError line naming what
    Ray said, not an ActorDiedError traceback. Closing the pool gives Ray its printer back."""
    pytest.importorskip("ray")
    import asyncio

    import ray._private.worker as rw

    from bstar.errors import BstarError
    from bstar.loadgen.workers import LoadPool

    original = rw.print_to_stdstream
    pool = LoadPool(1, ray="local")
    pool.start()
    try:
        assert getattr(rw.print_to_stdstream, "_bstar_held", False)
        handle = pool._handles[0]
        pool._ray.kill(handle.actor, no_restart=True)
        with pytest.raises(BstarError) as e:
            asyncio.run(handle.call("drain"))
    finally:
        pool.close()
    assert "load worker lost on Ray" in str(e.value) and "\n" not in str(e.value)
    assert "Actor" in str(e.value)
    assert rw.print_to_stdstream is original
