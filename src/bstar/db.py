"""The one SQLite helper (standard library) under bstar's stores: where their files live
(`data_dir`), opening one for writing (created with its folder, WAL) or for reading only
(never created, never altered: `open_db`), the refusal of a SQLite file that holds someone
else's tables (`check_tables`), and the one-line BstarError for what SQLite says
(`db_error`, `errors`).

Each store keeps its own tables' statements and opens through here: `bstar.loadgen.store`
(the results DB, runs.db) and `bstar.search.store` (the search DB, search.db). No other
module imports sqlite3 (tests/test_architecture.py); a caller that reads a store and
catches its errors catches `DbError`.
"""

from __future__ import annotations

import functools
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator, Set
from contextlib import contextmanager
from pathlib import Path

from bstar.errors import BstarError

DbError = sqlite3.Error  # what a store's reads and writes raise when SQLite fails
Connection = sqlite3.Connection


def data_dir() -> Path:
    """Where bstar keeps its DBs: $BSTAR_DATA_DIR, else $XDG_DATA_HOME/bstar, else
    ~/.local/share/bstar."""
    env = os.environ.get("BSTAR_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "bstar"


def db_error(path: Path, e: BaseException, what: str) -> BstarError:
    """One line for a DB that cannot be used (`what` names it: "results DB", "search DB"):
    what the path is and what SQLite said."""
    msg = str(e) or type(e).__name__
    if "not a database" in msg or "malformed" in msg:
        return BstarError(f"{path} is not a bstar {what} (not SQLite, or corrupt): {msg}")
    if "readonly" in msg or "read-only" in msg or isinstance(e, PermissionError):
        return BstarError(f"cannot write the {what} {path}: {msg} "
                          "(a read-only file or folder? give --db elsewhere)")
    return BstarError(f"cannot use the {what} {path}: {msg}")


@contextmanager
def errors(path: Path, what: str) -> Iterator[None]:
    """SQLite's errors inside the block as `db_error`'s one line."""
    try:
        yield
    except sqlite3.Error as e:
        raise db_error(path, e, what) from None


@functools.cache
def schema_columns(schema: str) -> dict[str, frozenset[str]]:
    """The columns `schema` gives each of its tables (run on an in-memory DB)."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(schema)
        tables = [r[0] for r in mem.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")]
        return {t: frozenset(r[1] for r in mem.execute(f"PRAGMA table_info({t!r})"))
                for t in tables}
    finally:
        mem.close()


def has_tables(conn: Connection) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name NOT LIKE "
                        "'sqlite_%' LIMIT 1").fetchone() is not None


def check_tables(conn: Connection, path: Path, own: Set[str], need: Set[str],
                 what: str, schema: str = "", write: bool = False) -> None:
    """Refuse a SQLite file that is not a bstar DB: bstar never adds its tables to a
    foreign DB nor reads someone else's table as its own. A table of bstar's name must
    have bstar's columns (`schema`: a foreign `runs` or `meta` table is not ours); to write,
    every table must be one of `own` (a foreign app's DB with a `meta` table beside its
    own is refused). With `need`, those tables must all be there (a read)."""
    names = {r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
    foreign = names - own if write else (names if not names & own else set())
    if names and foreign:
        raise BstarError(f"{path} is a SQLite file but not a bstar {what} (its tables: "
                         f"{', '.join(sorted(foreign)[:5])}); give --db another path")
    expected = schema_columns(schema) if schema else {}
    for t in sorted(names & own & expected.keys()):
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({t!r})")}
        if not expected[t] <= have:
            raise BstarError(f"{path} is a SQLite file but not a bstar {what} (its table "
                             f"{t!r} lacks bstar's columns); give --db another path")
    missing = need - names
    if missing:
        raise BstarError(f"{path} is not a bstar {what}: no {', '.join(sorted(missing))} "
                         "table")


def connect_readonly(path: Path, what: str, missing: str) -> Connection:
    """SQLite's read-only open (`mode=ro`): never creates the file, never writes to it.
    A missing path is a BstarError ("no {what} at {path}: {missing}")."""
    if not path.is_file():
        raise BstarError(f"no {what} at {path}: {missing}")
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    if not Path(f"{path}-wal").exists():
        # No writer has the DB open (a WAL DB's -wal lives while it does): read it as it
        # is. Plain `mode=ro` on a WAL DB would leave -wal and -shm files behind.
        uri += "&immutable=1"
    with errors(path, what):
        return sqlite3.connect(uri, uri=True, timeout=30.0)


def connect_writable(path: Path, what: str) -> Connection:
    """Open (creating it and its folder) a bstar DB for writing."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise BstarError(f"cannot create the folder of the {what} {path}: "
                         f"{e.strerror or e}") from None
    if path.is_dir():
        raise BstarError(f"the {what} {path} is a folder; give --db a file")
    with errors(path, what):
        return sqlite3.connect(str(path), timeout=30.0)


def open_db(path: Path, what: str, own: Set[str], schema: str, *, readonly: bool = False,
            need: Set[str] = frozenset(), missing: str = "",
            synchronous: str | None = None) -> Connection:
    """A store's connection, rows as `sqlite3.Row`. For writing: created if need be,
    refused if foreign (`check_tables`), in WAL mode (`synchronous` as given), `schema` run
    (CREATE ... IF NOT EXISTS) and committed. With `readonly`: an existing DB opened
    read-only (`connect_readonly`; `missing` completes its error), its `need` tables
    checked, nothing written. Every failure is one BstarError; the connection is closed."""
    from bstar.safeio import check_path_names

    check_path_names(path, "--db")  # `OSError: File name too long` from is_file() below
    if not readonly and path.is_file() and path.stat().st_size:
        # An existing file is checked read-only first: nothing is written to a foreign DB
        # (not even the WAL switch) before it is refused.
        probe = connect_readonly(path, what, missing)
        try:
            # A DB with tables must hold bstar's core ones (`need`): a foreign file whose
            # only table happens to be a `meta (key, value)` is not ours either.
            if has_tables(probe):
                check_tables(probe, path, own, need, what, schema, write=True)
        except sqlite3.Error as e:
            raise db_error(path, e, what) from None
        finally:
            probe.close()
    conn = connect_readonly(path, what, missing) if readonly else connect_writable(path, what)
    try:
        conn.row_factory = sqlite3.Row
        check_tables(conn, path, own, need if readonly else set(), what, schema,
                     write=not readonly)
        if not readonly:
            conn.execute("PRAGMA journal_mode=WAL")
            if synchronous:
                conn.execute(f"PRAGMA synchronous={synchronous}")
            conn.executescript(schema)
            conn.commit()
    except sqlite3.Error as e:
        conn.close()
        raise db_error(path, e, what) from None
    except BaseException:
        conn.close()
        raise
    return conn
