"""`bstar runs export`: a stored run's levels or requests as rows, as CSV or JSON text, and
whether an existing -o may be replaced by it (only an earlier export, an empty file, or
with --force; never the results DB or another SQLite file)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from bstar.errors import BstarError

# The columns that mark a file as an earlier `runs export` (levels, or requests).
EXPORT_MARKS = ({"concurrency", "status", "requests", "errors"},
                {"level", "attempt", "level_id", "start_s", "token_source"})
# A cell a spreadsheet would run as a formula (OWASP's "CSV injection" list): a server's
# text (an error body, a model id) must stay text.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def flat_level(lv: dict[str, Any]) -> dict[str, Any]:
    """A level of `SweepResult.to_dict()` as one flat row: its dicts spread into
    `key_subkey` columns, the server's figures and error kinds kept as JSON text."""
    out: dict[str, Any] = {}
    for k, v in lv.items():
        if k in ("server", "error_kinds"):
            out[k] = json.dumps(v) if v else ""
        elif isinstance(v, dict):
            for kk, vv in v.items():
                out[f"{k}_{kk}"] = vv
        else:
            out[k] = v
    return out


def csv_cells(row: dict[str, Any]) -> dict[str, Any]:
    """A row for CSV: text cells that start like a formula get a leading apostrophe
    (numbers stay numbers)."""
    return {k: "'" + v if isinstance(v, str) and v.startswith(FORMULA_START) else v
            for k, v in row.items()}


def export_text(rows: list[dict[str, Any]], fmt: str) -> str:
    """The rows as `fmt` ("json": a list of objects; else CSV, every row's columns in the
    order first seen)."""
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    buf = io.StringIO()
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    w = csv.DictWriter(buf, fieldnames=cols)
    w.writeheader()
    w.writerows(csv_cells(r) for r in rows)
    return buf.getvalue()


def is_export(path: str | Path) -> bool:
    """Whether the existing file at `path` is an earlier `bstar runs export` (CSV or JSON,
    levels or requests) or empty, so that overwriting it loses nothing else. Read through
    `bstar.safeio` (bounded; a FIFO or a folder is not an export)."""
    from bstar import safeio

    try:
        data = safeio.read_bytes(path, safeio.MAX_TABLE_BYTES, "-o file")
    except BstarError:
        return False
    if not data.strip():
        return True
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return False
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except ValueError:
            return False
        return isinstance(rows, list) and all(isinstance(r, dict) for r in rows) and (
            not rows or any(m <= set(rows[0]) for m in EXPORT_MARKS))
    header = set(next(csv.reader([text.splitlines()[0]]), []))
    return any(m <= header for m in EXPORT_MARKS)


def check_export_output(out: str | Path, db: str | Path, force: bool) -> None:
    """Refuse an -o that would destroy data: the DB itself (or its -wal/-shm), a folder, or
    an existing file that is not an earlier export (unless `force`)."""
    from bstar import safeio

    out = Path(out)
    if out.is_dir():
        raise BstarError(f"-o {out} is a folder; give a file")
    if not out.exists():
        return
    dbp = Path(db).resolve()
    same = {dbp, Path(f"{dbp}-wal"), Path(f"{dbp}-shm"), Path(f"{dbp}-journal")}
    if out.resolve() in same or (dbp.exists() and out.samefile(dbp)):
        raise BstarError(f"-o {out} is the results DB itself; export to another file")
    try:
        head = safeio.read_bytes(out, safeio.MAX_TABLE_BYTES, "-o file")[:16]
    except BstarError:
        head = b""
    if head == b"SQLite format 3\x00":
        raise BstarError(f"-o {out} is a SQLite database; bstar does not overwrite it "
                         "(export to another file)")
    if not force and not is_export(out):
        raise BstarError(f"-o {out} exists and is not an earlier bstar export; "
                         "give --force to overwrite it, or another file")
