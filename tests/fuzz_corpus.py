"""The CLI fuzz's memory: reproducer cases in tests/fuzz-corpus/, one JSON file each.

Hypothesis runs derandomized (the same cases every run, so no example database), which
finds a defect only where its fixed draw lands: the subnormal-GPU case was found in one full
run and not in the next. So every case that ever failed is kept here and replayed first, by
a plain parametrized test (tests/test_cli_corpus.py), in the fast loop and in CI.

A case: {"id", "why", "files": {relative path: spec}, "argv": [...]} where "{tmp}" in argv
stands for the folder the files are made in. A file spec is one of {"text": str},
{"b64": base64 bytes}, {"gz_b64": gzip + base64 bytes} (100k-deep JSON in 200 bytes),
{"dir": true}, {"fifo": true}, {"symlink": target}, {"sql": a script run by sqlite3}.

When a fuzz case fails, `store_failure` writes it under tests/fuzz-corpus/new/ with the
files its argv names, captured the same way; commit the file (move it up a level and name
it) with the fix, and the case is replayed first from then on.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parent / "fuzz-corpus"
NEW = CORPUS / "new"
MAX_CAPTURE_BYTES = 1 << 20  # a reproducer file larger than this is stored gzipped, cut


def cases() -> list[dict[str, Any]]:
    """Every stored case (the committed ones, then any new ones), sorted by id."""
    out = []
    for p in sorted([*CORPUS.glob("*.json"), *NEW.glob("*.json")]):
        case = json.loads(p.read_text(encoding="utf-8"))
        case.setdefault("id", p.stem)
        out.append(case)
    return out


def _make(path: Path, spec: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if "text" in spec:
        path.write_text(spec["text"], encoding="utf-8")
    elif "b64" in spec:
        path.write_bytes(base64.b64decode(spec["b64"]))
    elif "gz_b64" in spec:
        path.write_bytes(gzip.decompress(base64.b64decode(spec["gz_b64"])))
    elif spec.get("dir"):
        path.mkdir(exist_ok=True)
    elif spec.get("fifo"):
        os.mkfifo(path)
    elif "symlink" in spec:
        path.symlink_to(spec["symlink"])
    elif "sql" in spec:
        con = sqlite3.connect(path)
        con.executescript(spec["sql"])
        con.commit()
        con.close()
    else:
        raise ValueError(f"unknown file spec {sorted(spec)}")


def materialize(case: dict[str, Any], tmp: Path) -> list[str]:
    """Make the case's files under `tmp`; its argv with {tmp} filled in."""
    for rel, spec in case.get("files", {}).items():
        _make(tmp / rel, spec)
    return [a.replace("{tmp}", str(tmp)) for a in case["argv"]]


def _capture(path: Path) -> dict[str, Any]:
    if path.is_symlink():
        return {"symlink": os.readlink(path)}
    if path.is_dir():
        return {"dir": True}
    if path.exists() and not path.is_file():
        return {"fifo": True}
    data = path.read_bytes()[:MAX_CAPTURE_BYTES]
    try:
        return {"text": data.decode("utf-8")} if len(data) < 4096 else \
            {"gz_b64": base64.b64encode(gzip.compress(data, mtime=0)).decode()}
    except UnicodeDecodeError:
        return {"b64": base64.b64encode(data).decode()}


def capture(argv: list[str], work: Path) -> dict[str, Any]:
    """A case for `argv`: the paths under `work` it names (a folder: the files in it)."""
    files: dict[str, Any] = {}
    out = []
    for a in argv:
        p = Path(a)
        if a.startswith(str(work)) and (p.exists() or p.is_symlink()):
            rel = p.relative_to(work)
            if p.is_dir() and not p.is_symlink():
                for q in sorted(p.rglob("*")):
                    if not q.is_dir() or q.is_symlink():
                        files[str(q.relative_to(work))] = _capture(q)
                files.setdefault(str(rel), {"dir": True})
            else:
                files[str(rel)] = _capture(p)
        out.append(a.replace(str(work), "{tmp}"))
    return {"files": files, "argv": out}


def store_failure(argv: list[str], work: Path, error: str) -> Path | None:
    """Write the failing case to tests/fuzz-corpus/new/ (None when it cannot be written:
    a read-only checkout still reports the failure itself)."""
    try:
        case = capture(argv, work)
        key = hashlib.sha256(json.dumps(case, sort_keys=True).encode()).hexdigest()[:12]
        case = {"id": f"new-{key}", "why": error[:300], **case}
        NEW.mkdir(parents=True, exist_ok=True)
        path = NEW / f"new-{key}.json"
        path.write_text(json.dumps(case, indent=1) + "\n", encoding="utf-8")
        return path
    except (OSError, ValueError):
        return None
