"""`bstar runs list|show|export|compare` over runs swept against the local token server."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from bstar.cli import main

pytest.importorskip("aiohttp", reason="needs aiohttp (a base dependency)")

from conftest import TokenServerFactory


def sweep(url: str, db: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    rc = main(["sweep", "--url", url, "--concurrency", "1,4", "--input-len", "16",
               "--output-len", "8", "--num-requests", "12", "--db", str(db), "--json",
               "--quiet", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


@pytest.mark.slow  # starts the token server
def test_runs_list_show_export_compare(token_server: TokenServerFactory, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "runs.db"
    fast = token_server(interval_ms=2)
    slow = token_server(interval_ms=8)
    a = sweep(fast.url, db, capsys)
    b = sweep(slow.url, db, capsys)
    # The contract's keys, on every level.
    for lv in a["levels"]:
        for key in ("concurrency", "requests", "errors", "throughput_tok_s", "ttft_ms",
                    "tpot_ms", "itl_ms", "e2e_ms", "preemptions", "kv_cache_usage_max",
                    "predicted"):
            assert key in lv
    assert {"run_id", "db", "levels", "knee", "recommendation"} <= set(a)
    assert a["db"] == str(db)

    assert main(["runs", "--db", str(db), "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == [b["run_id"], a["run_id"]]  # newest first
    assert all(r["levels_done"] == 2 and r["status"] == "completed" for r in listed)

    # A unique prefix (two runs started in the same second share up to their random part).
    n = next(i for i in range(1, len(a["run_id"]) + 1)
             if not b["run_id"].startswith(a["run_id"][:i]))
    assert main(["runs", "--db", str(db), "show", a["run_id"][:n]]) == 0
    shown = capsys.readouterr().out
    assert a["run_id"] in shown and "recommendation" in shown

    assert main(["runs", "--db", str(db), "export", a["run_id"], "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [int(r["concurrency"]) for r in rows] == [1, 4]
    assert float(rows[1]["throughput_tok_s"]) == pytest.approx(
        a["levels"][1]["throughput_tok_s"])
    assert "tpot_ms_p99" in rows[0]

    out_file = tmp_path / "req.json"
    assert main(["runs", "--db", str(db), "export", a["run_id"], "--what", "requests",
                 "--format", "json", "-o", str(out_file)]) == 0
    reqs = json.loads(out_file.read_text())
    assert sum(1 for r in reqs if not r["warmup"]) == 24

    assert main(["runs", "--db", str(db), "compare", a["run_id"], b["run_id"], "--json"]) == 0
    cmp = json.loads(capsys.readouterr().out)
    assert cmp["runs"] == [a["run_id"], b["run_id"]]
    assert len(cmp["levels"]) == 2
    for i, row in enumerate(cmp["levels"]):
        fa, sl = row["runs"]
        # Each run's own figures in its own column (exact: no timing in it) ...
        assert fa["throughput_tok_s"] == a["levels"][i]["throughput_tok_s"]
        assert sl["throughput_tok_s"] == b["levels"][i]["throughput_tok_s"]
        # ... and the slow server's under what its 8 ms schedule allows (a load can only
        # lower it): 8 tokens take >= 7 x 8 ms, a stream's 12 / c requests one after another.
        c = row["concurrency"]
        assert sl["throughput_tok_s"] <= 12 * 8 / (math.ceil(12 / c) * 7 * 8e-3)
    assert main(["runs", "--db", str(db), "compare", a["run_id"], b["run_id"]]) == 0
    table = capsys.readouterr().out
    assert "tok/s ratio" in table and a["run_id"] in table


def test_runs_show_unknown_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bstar.loadgen.store import Store

    Store(tmp_path / "x.db").close()  # an empty results DB
    assert main(["runs", "--db", str(tmp_path / "x.db"), "show", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    # A missing DB is an error, and reading it creates neither the file nor its folder.
    missing = tmp_path / "no" / "such.db"
    assert main(["runs", "--db", str(missing), "show", "nope"]) == 2
    assert "no results DB at" in capsys.readouterr().err
    assert not missing.parent.exists()


def test_export_output_check_reads_through_safeio(tmp_path: Path) -> None:
    # The -o check of `runs export` lives in the library (loadgen/export.py) and reads an
    # existing -o through safeio: a FIFO is refused at once (the command's open() waited
    # for a writer), an earlier export may be replaced.
    import os

    from bstar.errors import BstarError
    from bstar.loadgen.export import check_export_output, export_text

    db = tmp_path / "runs.db"
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    with pytest.raises(BstarError, match="not an earlier bstar export"):
        check_export_output(fifo, db, force=False)
    earlier = tmp_path / "levels.csv"
    earlier.write_text(export_text([{"concurrency": 1, "status": "completed", "requests": 8,
                                     "errors": 0}], "csv"))
    check_export_output(earlier, db, force=False)  # an earlier export: replaced
    assert export_text([{"model": "=cmd()"}], "csv").splitlines()[1] == "'=cmd()"
