"""The search store: SQLite (standard library, WAL), one row per evaluated configuration,
committed as each finishes, so Ctrl-C or a kill loses nothing already computed and
`--resume` evaluates only what is missing.

A search is named by the hash of its spec (`SearchSpec.search_id`); an evaluation row by its
replica key plus a hash of everything that decides its result (deployment, engine limits,
traffic, SLO, tolerance), so a row is never reused for a different question.

Default location: `${BSTAR_DATA_DIR:-~/.local/share/bstar}/search.db`. A corrupt file, a
SQLite file of someone else's (bstar never adds its tables to one) or a path it cannot write
is a one-line BstarError; every text stored passes through `bstar.redact`. Opening, the
checks and the errors are `bstar.db`'s; the statements of the search tables are all here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bstar.db import data_dir, errors, open_db
from bstar.redact import redact_obj

T = TypeVar("T")

_OWN_TABLES = {"searches", "evaluations"}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS searches (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,          -- UTC ISO 8601
    updated_at TEXT NOT NULL,
    status TEXT NOT NULL,              -- running, completed, interrupted
    spec TEXT NOT NULL                 -- JSON: SearchSpec.to_dict()
);
CREATE TABLE IF NOT EXISTS evaluations (
    search_id TEXT NOT NULL REFERENCES searches(id),
    key TEXT NOT NULL,                 -- replica key + hash of its inputs
    result TEXT NOT NULL,              -- JSON: the evaluation's row
    elapsed_s REAL,                    -- time the evaluation took where it ran
    backend TEXT,
    finished_at TEXT NOT NULL,
    PRIMARY KEY (search_id, key)
);
"""


def default_db_path() -> Path:
    return data_dir() / "search.db"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


_WHAT = "search DB"


class SearchStore:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.db = open_db(self.path, _WHAT, _OWN_TABLES, _SCHEMA, need=_OWN_TABLES)

    def _guard(self, fn: Callable[..., T], *a: Any) -> T:
        with errors(self.path, _WHAT):
            return fn(*a)

    def begin(self, search_id: str, spec: dict[str, Any], resume: bool) -> None:
        self._guard(self._begin, search_id, spec, resume)

    def _begin(self, search_id: str, spec: dict[str, Any], resume: bool) -> None:
        """Start (or with `resume`, continue) a search. Without `resume` earlier rows of the
        same search are dropped: the search runs from scratch."""
        with self.db:
            if not resume:
                self.db.execute("DELETE FROM evaluations WHERE search_id = ?", (search_id,))
                self.db.execute("DELETE FROM searches WHERE id = ?", (search_id,))
            self.db.execute(
                "INSERT INTO searches (id, created_at, updated_at, status, spec) "
                "VALUES (?, ?, ?, 'running', ?) ON CONFLICT(id) DO UPDATE SET "
                "status = 'running', updated_at = excluded.updated_at",
                (search_id, _now(), _now(), json.dumps(redact_obj(spec), sort_keys=True)))

    def done(self, search_id: str) -> dict[str, dict[str, Any]]:
        def read() -> dict[str, dict[str, Any]]:
            rows = self.db.execute("SELECT key, result FROM evaluations WHERE search_id = ?",
                                   (search_id,)).fetchall()
            out: dict[str, dict[str, Any]] = {}
            for k, v in rows:
                try:
                    row = json.loads(v)
                except ValueError:
                    continue  # an unreadable row is evaluated again
                if isinstance(row, dict):
                    out[k] = row
            return out

        return self._guard(read)

    def count(self, search_id: str) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM evaluations WHERE search_id = ?",
                                   (search_id,)).fetchone()[0])

    def add(self, search_id: str, key: str, result: dict[str, Any], elapsed_s: float | None,
            backend: str) -> None:
        self._guard(self._add, search_id, key, result, elapsed_s, backend)

    def _add(self, search_id: str, key: str, result: dict[str, Any], elapsed_s: float | None,
             backend: str) -> None:
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO evaluations (search_id, key, result, elapsed_s, "
                "backend, finished_at) VALUES (?, ?, ?, ?, ?, ?)",
                (search_id, key, json.dumps(redact_obj(result), sort_keys=True), elapsed_s,
                 backend, _now()))

    def finish(self, search_id: str, status: str) -> None:
        self._guard(self._finish, search_id, status)

    def _finish(self, search_id: str, status: str) -> None:
        with self.db:
            self.db.execute("UPDATE searches SET status = ?, updated_at = ? WHERE id = ?",
                            (status, _now(), search_id))

    def status(self, search_id: str) -> str | None:
        row = self.db.execute("SELECT status FROM searches WHERE id = ?",
                              (search_id,)).fetchone()
        return None if row is None else str(row[0])

    def close(self) -> None:
        self.db.close()
