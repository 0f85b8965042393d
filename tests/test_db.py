"""bstar.db, the one SQLite helper: both stores keep their files in one data directory and
open, check and word their errors the same way."""

from __future__ import annotations

from pathlib import Path

import pytest

from bstar.db import data_dir, db_error
from bstar.loadgen.store import default_db_path as results_db
from bstar.search.store import default_db_path as search_db


def test_both_stores_live_in_the_one_data_directory(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("BSTAR_DATA_DIR", str(tmp_path / "d"))
    assert (results_db(), search_db()) == (tmp_path / "d" / "runs.db",
                                           tmp_path / "d" / "search.db")
    monkeypatch.delenv("BSTAR_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "bstar" == search_db().parent == results_db().parent
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert search_db() == tmp_path / "home" / ".local" / "share" / "bstar" / "search.db"


def test_one_wording_for_what_sqlite_says() -> None:
    p = Path("/x/s.db")
    assert str(db_error(p, Exception("file is not a database"), "search DB")) \
        == "/x/s.db is not a bstar search DB (not SQLite, or corrupt): file is not a database"
    assert str(db_error(p, Exception("attempt to write a readonly database"), "results DB")) \
        .startswith("cannot write the results DB /x/s.db: ")
    assert str(db_error(p, PermissionError("denied"), "results DB")) \
        .startswith("cannot write the results DB")
    assert str(db_error(p, Exception("disk I/O error"), "search DB")) \
        == "cannot use the search DB /x/s.db: disk I/O error"
