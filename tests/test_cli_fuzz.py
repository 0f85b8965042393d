"""Issue 19: the command line under hostile input. Hypothesis drives `bstar` in-process over
model configs, GPU files, point files, traces, results DBs and flags; every case must end
with an exit status in {0, 1, 2, 3} (a SystemExit from argparse counts, with its status),
never a traceback, never a raw ESC on stdout, and within a bound (signal.alarm).

Derandomized (the same cases every run, in CI too); CASES says how many run in all, and
`test_case_count` checks that it is at least 1,000. A failing case is stored under
tests/fuzz-corpus/new/ (tests/fuzz_corpus.py) and, once committed, replayed first by
tests/test_cli_corpus.py: derandomized draws alone found the subnormal-GPU case in one run
and not the next (issue 30). `test_hostile_file_kinds` tries every hostile kind of file on
every reader (issue 30: huge integers, deep nesting, folders, FIFOs, symlink loops, ...).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bounded import Hang, bounded
from bstar.cli import main
from fuzz_corpus import store_failure

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs signal.alarm")

CASE_TIMEOUT_S = 30  # a bound against a hang, far above any case's run time
# Sized to run in about a minute on a shared 2-core machine: a simulate case costs ~1 s
# (it measures each level's capacity too), a plan case ~20 ms.
EXAMPLES = {"gpu": 260, "model": 200, "points": 250, "trace": 100, "flags": 260, "db": 60}
CASES = sum(EXAMPLES.values())
OK_STATUS = {0, 1, 2, 3}
_ids = itertools.count()
_calls = [0]  # cases run so far in this session
_replays = [0]  # of which stored corpus cases (tests/test_cli_corpus.py), not fuzz draws
_work: list[Path] = []  # the module's folder of files, for storing a failing case


def _settings(name: str) -> settings:
    return settings(max_examples=EXAMPLES[name], derandomize=True, deadline=None,
                    database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


def run_cli(argv: list[str], store: bool = True) -> tuple[int, str, str]:
    """`bstar ARGV` in this process: (status, stdout, stderr); asserts the contract. A
    failing case is stored as a reproducer (fuzz_corpus.store_failure) unless `store` is
    False (a stored case replayed)."""
    if not store:
        _replays[0] += 1
    try:
        return _run_cli(argv)
    except (AssertionError, pytest.fail.Exception) as e:
        if store and _work:
            where = store_failure(argv, _work[0], f"{type(e).__name__}: {e}")
            if where is not None:
                print(f"fuzz: failing case stored as {where}", file=sys.stderr)
        raise


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    _calls[0] += 1
    out, err = io.StringIO(), io.StringIO()
    status: int
    try:
        with bounded(CASE_TIMEOUT_S), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                status = main(argv)
            except SystemExit as e:  # argparse: --help or a bad flag
                status = e.code if isinstance(e.code, int) else 2
    except Hang:
        pytest.fail(f"bstar {' '.join(argv)} ran past {CASE_TIMEOUT_S} s")
    except Exception as e:  # a traceback: the defect this test is for
        raise AssertionError(f"bstar {' '.join(argv)} raised {type(e).__name__}: {e}") from e
    e_text = err.getvalue()
    assert status in OK_STATUS, (argv, status, e_text[-500:])
    assert "Traceback" not in e_text, (argv, e_text[-2000:])
    # Output to a pipe carries no escape sequence: names are printed as data (issue 30).
    assert "\x1b" not in out.getvalue(), (argv, out.getvalue()[:500])
    errors = [ln for ln in e_text.splitlines() if ": error:" in ln]
    if status == 2:  # a usage or input error: one line that says what is wrong
        assert len(errors) == 1, (argv, e_text)
    if "--json" in argv and status == 0 and out.getvalue().strip():
        json.loads(out.getvalue(), parse_constant=_no_constant)  # strict JSON
    return status, out.getvalue(), e_text


def _no_constant(name: str) -> None:
    raise AssertionError(f"--json printed {name}, which is not JSON")


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("fuzz")
    _work[:] = [path]
    yield path
    _work.clear()


def _file(work: Path, suffix: str, data: str | bytes) -> Path:
    p = work / f"f{next(_ids)}{suffix}"
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data, encoding="utf-8")
    return p


# ---- value pools ------------------------------------------------------------------------
HOSTILE_NUMBERS = ["0", "-1", "1", "2", "3", "0.5", "inf", "-inf", "nan", "1e300", "-0",
                   "1e-300", "abc", "", " ", "1,2", "2k", "1_000", "0x10", "9" * 30,
                   "1e308", "5e-324", "1" * 5000]
numbers = st.one_of(st.sampled_from(HOSTILE_NUMBERS),
                    st.integers(-5, 10**6).map(str),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr))
json_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                        st.floats(allow_nan=True, allow_infinity=True),
                        st.text(max_size=6), st.lists(st.integers(0, 4), max_size=3),
                        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
junk_bytes = st.binary(min_size=0, max_size=64).map(lambda b: b"\xff\xfe" + b)


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(v), repr(v))
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))


# ---- GPU files --------------------------------------------------------------------------
GPU_FIELDS = ["name", "memory_bytes", "hbm_bandwidth_bytes_s", "bf16_flops", "fp8_flops",
              "num_sms", "interconnect_bytes_s", "vendor", "provenance", "bogus"]
GOOD_GPU = {"name": "x", "memory_bytes": 80 * 2**30, "hbm_bandwidth_bytes_s": 2e12,
            "bf16_flops": 1e15}
gpu_values = st.one_of(json_values, st.sampled_from(
    [0, -1, 1e30, 2**64, float("inf"), float("nan"), "5", True, 1.5, 5e-324, 1e-300,
     "\x1b]0;x\x07$\\bogus$[/]"]))


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
@_settings("gpu")
# Issue 30: a subnormal interconnect halved to 0.0 under tensor parallelism.
@example(fields={"interconnect_bytes_s": 5e-324}, form="toml", junk=b"",
         flags=[["--num-gpus", "2"]])
@example(fields={"name": "\x1b]0;x\x07$\\bogus$[/]"}, form="json", junk=b"", flags=[])
@given(fields=st.dictionaries(st.sampled_from(GPU_FIELDS), gpu_values, max_size=4),
       form=st.sampled_from(["toml", "json", "bytes"]), junk=junk_bytes,
       flags=st.lists(st.sampled_from([["--json"], ["--num-gpus", "2"], ["--context", "4k"],
                                       ["--gpu-util", "0.99"], ["--reserve-gib", "70"]]),
                      max_size=2))
def test_gpu_files(work: Path, fields: dict[str, object], form: str, junk: bytes,
                   flags: list[list[str]]) -> None:
    gpu = {**GOOD_GPU, **fields}
    if form == "bytes":
        path = _file(work, ".toml", junk)
    elif form == "json":
        path = _file(work, ".json", json.dumps(gpu, default=str))
    else:
        path = _file(work, ".toml", "".join(f"{k} = {_toml_value(v)}\n" for k, v in gpu.items()
                                            if not isinstance(v, list | dict | type(None))))
    run_cli(["plan", "--model", "llama-3-8b", "--gpu", str(path),
             *(x for f in flags for x in f)])


# ---- model configs ----------------------------------------------------------------------
MODEL_KEYS = ["model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
              "num_local_experts", "num_experts_per_tok", "sliding_window", "torch_dtype",
              "tie_word_embeddings"]
GOOD_MODEL = {"model_type": "llama", "hidden_size": 512, "num_hidden_layers": 4,
              "num_attention_heads": 8, "num_key_value_heads": 4, "intermediate_size": 1024,
              "vocab_size": 1000, "max_position_embeddings": 4096}
model_values = st.one_of(
    st.integers(-3, 1 << 16), st.none(), st.booleans(), st.text(max_size=5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["llama", "mistral", "qwen2", "mixtral", "gemma2", "bfloat16"]))


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
@_settings("model")
@given(fields=st.dictionaries(st.sampled_from(MODEL_KEYS), model_values, max_size=3),
       raw=st.sampled_from(["object", "list", "bytes", "text"]), junk=junk_bytes,
       command=st.sampled_from(["plan", "plan-json", "compare"]))
def test_model_configs(work: Path, fields: dict[str, object], raw: str, junk: bytes,
                       command: str) -> None:
    folder = work / f"m{next(_ids)}"
    folder.mkdir()
    cfg = folder / "config.json"
    if raw == "bytes":
        cfg.write_bytes(junk)
    elif raw == "list":
        cfg.write_text(json.dumps([GOOD_MODEL]))
    elif raw == "text":
        cfg.write_text("{not json")
    else:
        cfg.write_text(json.dumps({**GOOD_MODEL, **fields}, default=str))
    argv = [command.removesuffix("-json"), "--model", str(cfg if fields else folder), "--gpu",
            "h100-sxm", *(["--json"] if command.endswith("-json") else [])]
    run_cli(argv)


# ---- point files ------------------------------------------------------------------------
POINT_COLUMNS = ["batch", "tpot_ms", "throughput_tok_s"]
cell = st.one_of(st.sampled_from(["1", "2", "4", "8", "16", "10", "12.5", "0", "-3", "inf",
                                  "nan", "1e300", "", "x", "3.7", "1e-300"]),
                 st.floats(0.01, 1e4).map(lambda v: f"{v:.4g}"),
                 st.integers(1, 4096).map(str))


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
@_settings("points")
@given(columns=st.lists(st.sampled_from([*POINT_COLUMNS, "context_tokens", "bogus", ""]),
                        min_size=1, max_size=3),
       rows=st.lists(st.lists(cell, min_size=1, max_size=4), max_size=8),
       form=st.sampled_from(["csv", "csv-bom", "json", "bytes"]), junk=junk_bytes,
       command=st.sampled_from(["fit", "fit-json", "calibrate"]))
def test_point_files(work: Path, columns: list[str], rows: list[list[str]], form: str,
                     junk: bytes, command: str) -> None:
    if form == "bytes":
        path = _file(work, ".csv", junk)
    elif form == "json":
        objs = [{c: v for c, v in zip(columns, r, strict=False)} for r in rows]
        path = _file(work, ".json", json.dumps(objs))
    else:
        text = ",".join(columns) + "\n" + "".join(",".join(r) + "\n" for r in rows)
        path = _file(work, ".csv", ("\ufeff" if form == "csv-bom" else "") + text)
    if command == "calibrate":
        run_cli(["calibrate", str(path), "--model", "llama-3-8b", "--gpu", "h100-sxm",
                 "--context", "1024"])
    else:
        run_cli(["fit", str(path), "--bootstrap", "5",
                 *(["--json"] if command == "fit-json" else [])])


def test_bom_points_are_read(work: Path) -> None:
    path = _file(work, ".csv", "\ufeffbatch,tpot_ms\n1,10\n2,10.5\n4,11\n8,12\n")
    status, out, err = run_cli(["fit", str(path), "--bootstrap", "0", "--json"])
    assert status == 0, err
    assert [p["batch"] for p in json.loads(out)["points"]] == [1, 2, 4, 8]


# ---- traces -----------------------------------------------------------------------------
trace_cell = st.one_of(st.sampled_from(["0", "0.5", "1", "10", "-1", "nan", "inf", "1e300",
                                        "", "x", "64", "0.0"]),
                       st.floats(0, 10).map(lambda v: f"{v:.3f}"),
                       st.integers(1, 300).map(str))


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
@_settings("trace")
@given(rows=st.lists(st.tuples(trace_cell, trace_cell, trace_cell), max_size=6),
       form=st.sampled_from(["csv", "jsonl", "bytes", "header-only"]), junk=junk_bytes,
       command=st.sampled_from(["simulate", "search"]))
def test_traces(work: Path, rows: list[tuple[str, str, str]], form: str, junk: bytes,
                command: str) -> None:
    head = "arrival_s,prompt_tokens,output_tokens\n"
    if form == "bytes":
        path = _file(work, ".csv", junk)
    elif form == "header-only":
        path = _file(work, ".csv", head)
    elif form == "jsonl":
        path = _file(work, ".jsonl", "".join(
            json.dumps({"arrival_s": a, "prompt_tokens": i, "output_tokens": o}) + "\n"
            for a, i, o in rows))
    else:
        path = _file(work, ".csv", head + "".join(",".join(r) + "\n" for r in rows))
    if command == "simulate":
        run_cli(["simulate", "--trace", str(path), "--max-num-seqs", "8", "--json"])
    else:
        run_cli(["search", "--trace", str(path), "--slo", "ttft:2000", "--gpu", "h100-sxm",
                 "--num-gpus", "1", "--max-num-seqs", "16", "--draws", "1",
                 "--num-requests", "30", "--db", str(work / f"s{next(_ids)}.db"), "--json"])


# ---- flags ------------------------------------------------------------------------------
small = st.sampled_from(["0", "-1", "1", "2", "8", "30", "inf", "nan", "x", "1e300", ""])
lengths = st.sampled_from(["64", "0", "-5", "normal:inf:inf", "normal:64:nan", "uniform:5:1",
                           "uniform:1:64", "lognormal:32:16", "empirical:", "empirical:1,x",
                           "fixed:8", "normal:1e300:1", "x", "1e300"])
slos = st.sampled_from(["ttft:500", "ttft:5,ttft:6", "tpot:0", "ttft:inf", "e2e:nan",
                        "bogus:1", "ttft", "ttft:500,tpot:50", ""])
PLAN_FLAGS = {"--context": small, "--batch": small, "--num-gpus": small, "--gpu-util": numbers,
              "--reserve-gib": numbers, "--block-size": small, "--bw-eff": numbers,
              "--max-tpot-ms": numbers, "--dtype": st.sampled_from(["fp8", "x", "int4"]),
              "--overhead-ms": numbers, "--overhead-per-seq-us": numbers}
SIM_FLAGS = {"--rate": numbers, "--concurrency": small, "--seed": numbers,
             "--max-num-seqs": small, "--max-num-batched-tokens": small,
             "--input-len": lengths, "--output-len": lengths, "--slo": slos,
             "--reserve-gib": numbers, "--think-time-s": numbers,
             "--max-sim-time-s": numbers, "--swap-space-gib": numbers,
             "--preemption": st.sampled_from(["swap", "recompute", "x"])}
FIT_FLAGS = {"--predict": small, "--critical-batch": numbers, "--seed": numbers,
             "--bootstrap": st.sampled_from(["0", "3", "-1", "x", "1000000000"]),
             "--knee-step": numbers,
             "--max-tpot-ms": numbers}
SEARCH_FLAGS = {"--rate": numbers, "--seed": numbers, "--input-len": lengths,
                "--output-len": lengths, "--slo": slos, "--reserve-gib": numbers,
                "--max-num-batched-tokens": small, "--rel-tol": numbers}


def _flags(table: dict[str, st.SearchStrategy[str]]) -> st.SearchStrategy[list[str]]:
    """Up to three of the table's flags, each with a value from its pool."""
    def with_values(names: list[str]) -> st.SearchStrategy[list[str]]:
        return st.tuples(*(table[n] for n in names)).map(
            lambda vals: [x for n, v in zip(names, vals, strict=True) for x in (n, v)])

    return st.lists(st.sampled_from(sorted(table)), max_size=3, unique=True).flatmap(
        with_values)


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
@_settings("flags")
@given(data=st.data(), command=st.sampled_from(["plan"] * 4 + ["fit"] * 3 + ["search"] * 3
                                               + ["simulate"]))
def test_flags(work: Path, data: st.DataObject, command: str) -> None:
    if command == "plan":
        argv = ["plan", *data.draw(_flags(PLAN_FLAGS))]
    elif command == "simulate":
        flags = data.draw(_flags(SIM_FLAGS))
        if "--rate" not in flags and "--concurrency" not in flags:
            flags += ["--rate", "5"]
        # Cheap sizes first (a later flag wins): a hostile value of these (1e6 requests) is
        # legal, only slow.
        argv = ["simulate", "--input-len", "64", "--output-len", "16", *flags,
                "--num-requests", "10"]
        if "--max-num-seqs" not in flags:
            argv += ["--max-num-seqs", "8"]
    elif command == "fit":
        pts = _file(work, ".csv", "batch,tpot_ms\n1,10\n2,10.4\n4,11\n8,12.5\n16,15\n")
        argv = ["fit", str(pts), *data.draw(_flags(FIT_FLAGS))]
        if "--bootstrap" not in argv:
            argv += ["--bootstrap", "3"]
    else:
        flags = data.draw(_flags(SEARCH_FLAGS))
        argv = ["search", *flags, "--gpu", "h100-sxm", "--num-gpus", "1", "--max-num-seqs",
                "16", "--draws", "1", "--num-requests", "30",
                "--db", str(work / f"s{next(_ids)}.db")]
        if "--slo" not in flags:
            argv += ["--slo", "ttft:2000"]
        if "--rate" not in flags:
            argv += ["--rate", "2"]
    if data.draw(st.booleans()):
        argv.append("--json")
    run_cli(argv)


# ---- results DBs ------------------------------------------------------------------------
@_settings("db")
@given(kind=st.sampled_from(["junk", "sqlite-header", "empty", "foreign", "folder"]),
       junk=st.binary(max_size=200),
       action=st.sampled_from([["list"], ["show", "x"], ["export", "x"],
                               ["compare", "x", "y"], ["list", "--json"]]))
def test_results_dbs(work: Path, kind: str, junk: bytes, action: list[str]) -> None:
    import sqlite3

    path = work / f"db{next(_ids)}.db"
    if kind == "junk":
        path.write_bytes(junk)
    elif kind == "sqlite-header":
        path.write_bytes(b"SQLite format 3\x00" + junk)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "foreign":
        con = sqlite3.connect(path)
        con.execute("CREATE TABLE t (x)")
        con.commit()
        con.close()
    else:
        path.mkdir()
    before = path.read_bytes() if path.is_file() else None
    run_cli(["runs", "--db", str(path), *action])
    if before is not None:
        assert path.read_bytes() == before  # a read never alters the file


# ---- issue 30: every hostile kind of file on every reader ----------------------------------
def _kind_text(kind: str, fmt: str) -> str | bytes:
    big = "1" * 5000
    if kind == "big-int":
        return {"json": '{"a": ' + big + "}", "toml": f"a = {big}\n",
                "csv": f"batch,tpot_ms\n{big},1\n"}[fmt]
    if kind == "deep":
        return ("a = " if fmt == "toml" else "") + "[" * 100_000 + "]" * 100_000
    if kind == "deep-tables":
        return "a = " + "{b = " * 2000 + "1" + "}" * 2000 + "\n"
    if kind == "not-utf8":
        return b"\xff\xfe\x00b\xe9\x80"
    if kind == "nul":
        return b"\x00" * 64
    if kind == "empty":
        return ""
    if kind == "escape-name":
        return {"json": json.dumps({**GOOD_GPU, "name": "\x1b]8;;http://x\x07$\\bogus$[/]"}),
                "toml": 'name = "\\u001b[31m$\\\\bogus$[/]"\nmemory_bytes = 85899345920\n'
                        "hbm_bandwidth_bytes_s = 2e12\nbf16_flops = 1e15\n",
                "csv": "batch,tpot_ms\n1,\x1b[31m\n"}[fmt]
    raise ValueError(kind)


TEXT_KINDS = ["big-int", "deep", "deep-tables", "not-utf8", "nul", "empty", "escape-name"]
PATH_KINDS = ["folder", "fifo", "symlink-loop", "dangling-symlink"]
READERS = {  # name: (file format, argv with {p} for the file)
    "gpu-json": ("json", ["plan", "--gpu", "{p}"]),
    "gpu-toml": ("toml", ["plan", "--gpu", "{p}", "--json"]),
    "config": ("json", ["plan", "--model", "{p}", "--gpu", "h100-sxm"]),
    "config-folder": ("json", ["compare", "--model", "{dir}", "--gpu", "h100-sxm"]),
    "points-json": ("json", ["fit", "{p}", "--bootstrap", "3"]),
    "points-csv": ("csv", ["fit", "{p}", "--bootstrap", "3", "--json"]),
    "calibrate": ("csv", ["calibrate", "{p}", "--model", "llama-3-8b", "--gpu", "h100-sxm",
                          "--context", "1024"]),
    "profile": ("toml", ["plan", "--profile", "{p}"]),
    "price": ("toml", ["search", "--rate", "1", "--slo", "ttft:2000", "--gpu", "h100-sxm",
                       "--max-num-seqs", "16", "--draws", "1", "--num-requests", "30",
                       "--price", "{p}", "--db", "{dir}/s.db"]),
    "trace-csv": ("csv", ["simulate", "--trace", "{p}", "--max-num-seqs", "8"]),
    "trace-jsonl": ("json", ["simulate", "--trace", "{p}", "--max-num-seqs", "8", "--json"]),
    "metrics": ("csv", ["kv", "--metrics-file", "{p}"]),
    "validate": ("csv", ["validate", "{p}"]),
}
SUFFIX = {"json": ".json", "toml": ".toml", "csv": ".csv"}


@pytest.mark.slow  # ~150 cases, ~10 s on the 2-core machine
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("kind", TEXT_KINDS + PATH_KINDS)
@pytest.mark.parametrize("reader", sorted(READERS))
def test_hostile_file_kinds(work: Path, reader: str, kind: str) -> None:
    fmt, argv = READERS[reader]
    folder = work / f"k{next(_ids)}"
    folder.mkdir()
    name = "config.json" if reader.startswith("config") else f"in{SUFFIX[fmt]}"
    p = folder / name
    if kind == "folder":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "symlink-loop":
        p.symlink_to(p.name)
    elif kind == "dangling-symlink":
        p.symlink_to("nowhere" + p.suffix)
    else:
        data = _kind_text(kind, fmt)
        if isinstance(data, bytes):
            p.write_bytes(data)
        else:
            p.write_text(data, encoding="utf-8")
    status, _, _ = run_cli([a.replace("{p}", str(p)).replace("{dir}", str(folder))
                            for a in argv])
    if kind in PATH_KINDS or kind in ("big-int", "deep", "not-utf8"):
        assert status == 2, (reader, kind)  # refused, with the one line run_cli checked


def test_case_count() -> None:
    """Runs last (file order): the cases the tests above ran, at least 1,000."""
    assert CASES >= 1000
    # The corpus replays alone (the fast loop: over 100 of them once the corpus grew) are
    # not a fuzz run.
    if _calls[0] - _replays[0] < 100:
        pytest.skip("run with the fuzz tests above to count their cases")
    print(f"CLI fuzz: {_calls[0]} cases", file=sys.stderr)
    assert _calls[0] >= 1000
