"""The results store: SQLite (standard library) in WAL mode, one file for all runs.

Every request's record is committed as it finishes, so a crash, a killed server or
Ctrl-C loses nothing already measured; a level row says whether the level completed,
and `bstar sweep --resume RUN` re-runs only the levels that did not. API keys are never
passed here (the options stored are scrubbed by the caller and checked again here), and
every text written passes through `bstar.redact.redact` first: a server's error body that
echoes the `Authorization` header, or a URL with `user:key@`, is stored masked.

Read commands open the DB with `Store(path, readonly=True)`: SQLite's `mode=ro`, never
creating the file or its folder, never adding tables; a missing, corrupt or foreign file is
a one-line BstarError. Opening, the checks and the errors are `bstar.db`'s (the search store
opens through it too); the statements of the results DB's tables are all here.

Default location: `${BSTAR_DATA_DIR:-~/.local/share/bstar}/runs.db`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bstar.db import data_dir, open_db
from bstar.loadgen.client import RequestRecord, RequestSpec
from bstar.redact import redact, redact_obj, redact_opt

SCHEMA_VERSION = 1

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,          -- UTC ISO 8601
    finished_at TEXT,
    status TEXT NOT NULL,              -- running, completed, completed_with_errors,
                                       -- interrupted, failed
    status_detail TEXT,
    url TEXT NOT NULL,
    server_version TEXT,
    served_model TEXT,
    model TEXT,                        -- cost-model preset/config, if given
    gpu TEXT,
    options TEXT NOT NULL,             -- JSON: everything needed to resume (no secrets)
    bstar_version TEXT NOT NULL,
    machine TEXT NOT NULL,             -- JSON: host, platform, python, cpus
    result TEXT                        -- JSON: verdict (knee, recommendation) when finished
);
CREATE TABLE IF NOT EXISTS levels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(id),
    idx INTEGER NOT NULL,              -- position in the sweep plan
    attempt INTEGER NOT NULL,          -- 1, then 2.. when resumed
    concurrency INTEGER,
    rate REAL,
    max_num_seqs INTEGER,
    status TEXT NOT NULL,              -- running, completed, stopped_errors, time_limit,
                                       -- interrupted, server_failed
    status_detail TEXT,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    duration_s REAL,
    stats TEXT,                        -- JSON: LevelStats.to_dict()
    server TEXT,                       -- JSON: LevelServerStats.to_dict()
    predicted TEXT,                    -- JSON: cost-model prediction, if any
    server_log TEXT                    -- path of the kept server log, if bstar started it
);
CREATE INDEX IF NOT EXISTS levels_run ON levels(run_id, idx);
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    level_id INTEGER NOT NULL REFERENCES levels(id),
    idx INTEGER NOT NULL,
    warmup INTEGER NOT NULL,
    ok INTEGER NOT NULL,
    start_s REAL NOT NULL,             -- wall clock, epoch seconds
    ttft_s REAL,
    e2e_s REAL,
    itl_s TEXT,                        -- JSON list of seconds
    prompt_tokens INTEGER,
    expected_prompt_tokens INTEGER,
    output_tokens INTEGER NOT NULL,
    expected_output_tokens INTEGER,
    token_source TEXT NOT NULL,        -- usage or counted
    chunks INTEGER NOT NULL,
    http_status INTEGER,
    error_kind TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS requests_level ON requests(level_id);
CREATE TABLE IF NOT EXISTS prompts (  -- what was sent: each request's prompt, per level
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    level_id INTEGER NOT NULL REFERENCES levels(id),
    idx INTEGER NOT NULL,              -- the request's index (warm-up ones are negative)
    warmup INTEGER NOT NULL,
    sha256 TEXT NOT NULL,              -- of the prompt text (chat: the messages' JSON)
    prompt TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS prompts_level ON prompts(level_id);
INSERT OR IGNORE INTO meta VALUES ('schema_version', '{SCHEMA_VERSION}');
"""

_SECRET_KEYS = ("api_key", "apikey", "authorization", "token", "password")


def default_db_path() -> Path:
    return data_dir() / "runs.db"


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def machine_info() -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def scrub(options: dict[str, Any]) -> dict[str, Any]:
    """Options without anything that looks like a secret (defence in depth): keys that name
    one dropped, credentials in the values (a URL's `user:key@`) masked."""
    return redact_obj({k: v for k, v in options.items()
                       if not any(s in k.lower() for s in _SECRET_KEYS)})


def _json_redacted(obj: Any) -> str | None:
    return None if obj is None else json.dumps(redact_obj(obj))


_OWN_TABLES = {"meta", "runs", "levels", "requests", "prompts"}


@dataclass(frozen=True)
class LevelRow:
    id: int
    run_id: str
    idx: int
    attempt: int
    concurrency: int | None
    rate: float | None
    max_num_seqs: int | None
    status: str
    status_detail: str | None
    duration_s: float | None
    stats: dict[str, Any] | None
    server: dict[str, Any] | None
    predicted: dict[str, Any] | None
    server_log: str | None


class Store:
    """A connection to the results DB. Writes commit immediately; `readonly=True` opens an
    existing DB for reading only (the read commands)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *,
                 readonly: bool = False) -> None:
        self.path = Path(path) if path else default_db_path()
        self.readonly = readonly
        # NORMAL in WAL mode: a committed row survives a process crash (not power loss),
        # which is the failure the store guards against, at a fraction of FULL's cost.
        self.conn = open_db(self.path, "results DB", _OWN_TABLES, _SCHEMA, readonly=readonly,
                            need={"runs", "levels", "requests"},
                            missing="run bstar sweep first, or give --db",
                            synchronous="NORMAL")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def logs_dir(self) -> Path:
        return self.path.parent / "logs"

    # -- runs ----------------------------------------------------------------------------
    def create_run(self, *, url: str, served_model: str | None, model: str | None,
                   gpu: str | None, options: dict[str, Any], bstar_version: str,
                   server_version: str | None = None, run_id: str | None = None) -> str:
        rid = run_id or new_run_id()
        self.conn.execute(
            "INSERT INTO runs (id, created_at, status, url, server_version, served_model,"
            " model, gpu, options, bstar_version, machine) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (rid, utc_now(), "running", redact_opt(url), redact_opt(server_version),
             redact_opt(served_model), redact_opt(model), redact_opt(gpu),
             json.dumps(scrub(options)), bstar_version, json.dumps(machine_info())))
        self.conn.commit()
        return rid

    def update_run(self, run_id: str, **fields: Any) -> None:
        allowed = {"status", "status_detail", "finished_at", "server_version", "served_model",
                   "result"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"cannot update run fields {sorted(bad)}")
        if "result" in fields and not isinstance(fields["result"], str | None):
            fields["result"] = json.dumps(fields["result"])
        fields = {k: redact_opt(v) if isinstance(v, str) else v for k, v in fields.items()}
        cols = ", ".join(f"{k} = ?" for k in fields)
        self.conn.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*fields.values(), run_id))
        self.conn.commit()

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            # Accept a unique prefix, as git does for commits.
            rows = self.conn.execute("SELECT * FROM runs WHERE id LIKE ?",
                                     (run_id + "%",)).fetchall()
            if len(rows) != 1:
                return None
            row = rows[0]
        d = dict(row)
        for k in ("options", "machine", "result"):
            d[k] = json.loads(d[k]) if d.get(k) else None
        return d

    def list_runs(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT r.*, (SELECT COUNT(DISTINCT idx) FROM levels l WHERE l.run_id = r.id"
            " AND l.status = 'completed') AS levels_done FROM runs r"
            " ORDER BY r.created_at DESC, r.rowid DESC LIMIT ?", (limit,)).fetchall()
        return [dict(r) for r in rows]

    # -- levels --------------------------------------------------------------------------
    def start_level(self, run_id: str, idx: int, *, concurrency: int | None,
                    rate: float | None, max_num_seqs: int | None) -> tuple[int, int]:
        """Insert a level row (status running); returns (level_id, attempt)."""
        (prev,) = self.conn.execute(
            "SELECT COALESCE(MAX(attempt), 0) FROM levels WHERE run_id = ? AND idx = ?",
            (run_id, idx)).fetchone()
        attempt = int(prev) + 1
        cur = self.conn.execute(
            "INSERT INTO levels (run_id, idx, attempt, concurrency, rate, max_num_seqs,"
            " status, started_at) VALUES (?,?,?,?,?,?,?,?)",
            (run_id, idx, attempt, concurrency, rate, max_num_seqs, "running", utc_now()))
        self.conn.commit()
        assert cur.lastrowid is not None
        return int(cur.lastrowid), attempt

    def finish_level(self, level_id: int, *, status: str, status_detail: str | None = None,
                     duration_s: float | None = None, stats: dict[str, Any] | None = None,
                     server: dict[str, Any] | None = None,
                     predicted: dict[str, Any] | None = None,
                     server_log: str | None = None) -> None:
        self.conn.execute(
            "UPDATE levels SET status = ?, status_detail = ?, finished_at = ?, duration_s = ?,"
            " stats = ?, server = ?, predicted = ?, server_log = COALESCE(?, server_log)"
            " WHERE id = ?",
            (status, redact_opt(status_detail), utc_now(), duration_s,
             _json_redacted(stats), _json_redacted(server), _json_redacted(predicted),
             redact_opt(server_log), level_id))
        self.conn.commit()

    def set_level_log(self, level_id: int, path: str) -> None:
        self.conn.execute("UPDATE levels SET server_log = ? WHERE id = ?",
                          (redact_opt(path), level_id))
        self.conn.commit()

    def levels(self, run_id: str, *, latest_only: bool = True) -> list[LevelRow]:
        rows = self.conn.execute(
            "SELECT * FROM levels WHERE run_id = ? ORDER BY idx, attempt", (run_id,)).fetchall()
        out: dict[tuple[int, int], LevelRow] = {}
        for r in rows:
            lr = LevelRow(
                id=r["id"], run_id=r["run_id"], idx=r["idx"], attempt=r["attempt"],
                concurrency=r["concurrency"], rate=r["rate"], max_num_seqs=r["max_num_seqs"],
                status=r["status"], status_detail=r["status_detail"],
                duration_s=r["duration_s"],
                stats=json.loads(r["stats"]) if r["stats"] else None,
                server=json.loads(r["server"]) if r["server"] else None,
                predicted=json.loads(r["predicted"]) if r["predicted"] else None,
                server_log=r["server_log"])
            out[(lr.idx, 0 if latest_only else lr.attempt)] = lr
        return list(out.values())

    # -- requests ------------------------------------------------------------------------
    def add_request(self, level_id: int, r: RequestRecord, *, commit: bool = True) -> None:
        """`commit=False`: the caller commits (`commit()`) a batch of records at once, as
        the sweep does with the records its load workers return together."""
        self.conn.execute(
            "INSERT INTO requests (level_id, idx, warmup, ok, start_s, ttft_s, e2e_s, itl_s,"
            " prompt_tokens, expected_prompt_tokens, output_tokens, expected_output_tokens,"
            " token_source, chunks, http_status, error_kind, error)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (level_id, r.index, int(r.warmup), int(r.ok), r.start_s, r.ttft_s, r.e2e_s,
             json.dumps([round(x, 7) for x in r.itl_s]), r.prompt_tokens,
             r.expected_prompt_tokens, r.output_tokens, r.expected_output_tokens,
             r.token_source, r.chunks, r.http_status, r.error_kind, redact_opt(r.error)))
        if commit:
            self.conn.commit()

    def commit(self) -> None:
        self.conn.commit()

    def add_prompts(self, level_id: int, specs: list[RequestSpec]) -> None:
        """Store what each request of a level sends (before the level runs)."""
        rows = []
        for sp in specs:
            text = sp.prompt if sp.messages is None else json.dumps(sp.messages)
            text = text or ""
            # The hash is of what was sent; the text stored is masked like every other.
            rows.append((level_id, sp.index, int(sp.warmup),
                         hashlib.sha256(text.encode()).hexdigest(), redact(text, patterns=False)))
        self.conn.executemany("INSERT INTO prompts (level_id, idx, warmup, sha256, prompt)"
                              " VALUES (?, ?, ?, ?, ?)", rows)
        self.conn.commit()

    def prompts(self, level_id: int) -> list[dict[str, Any]]:
        """The prompts a level sent, warm-up first, in index order."""
        rows = self.conn.execute("SELECT idx, warmup, sha256, prompt FROM prompts WHERE"
                                 " level_id = ? ORDER BY idx", (level_id,)).fetchall()
        return [dict(r) for r in rows]

    def requests(self, level_id: int) -> list[RequestRecord]:
        rows = self.conn.execute("SELECT * FROM requests WHERE level_id = ? ORDER BY id",
                                 (level_id,)).fetchall()
        return [RequestRecord(
            index=r["idx"], ok=bool(r["ok"]), start_s=r["start_s"], ttft_s=r["ttft_s"],
            e2e_s=r["e2e_s"], itl_s=json.loads(r["itl_s"] or "[]"),
            prompt_tokens=r["prompt_tokens"], output_tokens=r["output_tokens"],
            token_source=r["token_source"], chunks=r["chunks"], http_status=r["http_status"],
            error_kind=r["error_kind"], error=r["error"], warmup=bool(r["warmup"]),
            expected_prompt_tokens=r["expected_prompt_tokens"],
            expected_output_tokens=r["expected_output_tokens"]) for r in rows]

    def request_rows(self, run_id: str) -> list[dict[str, Any]]:
        rows = self.conn.execute(
            "SELECT l.idx AS level, l.attempt, l.concurrency, l.rate, l.max_num_seqs, q.*"
            " FROM requests q JOIN levels l ON q.level_id = l.id WHERE l.run_id = ?"
            " ORDER BY l.idx, l.attempt, q.id", (run_id,)).fetchall()
        return [dict(r) for r in rows]
