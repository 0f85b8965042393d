"""The CLI fuzz's stored reproducers (tests/fuzz-corpus/, tests/fuzz_corpus.py), replayed
before the fuzz itself (this file sorts first) and in the fast loop: each must end under the
fuzz's contract (exit 0-3, one error line for 2, strict --json, no traceback, no hang), and
a file the case made that bstar did not create for that purpose is left as it was."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from fuzz_corpus import cases, materialize
from test_cli_fuzz import run_cli

CASES = cases()


def _digests(tmp: Path) -> dict[str, str]:
    out = {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and signal.alarm")
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_stored_case(case: dict[str, Any], tmp_path: Path) -> None:
    argv = materialize(case, tmp_path)
    before = _digests(tmp_path)
    run_cli(argv, store=False)
    after = _digests(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before, case["id"]


def test_the_corpus_holds_the_issue_30_cases() -> None:
    ids = {c["id"] for c in CASES}
    assert {"subnormal-interconnect-tp2", "points-json-100k-deep", "db-foreign-meta",
            "ignore-regex-backtracking", "plot-dev-full"} <= ids
