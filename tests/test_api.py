"""The public API: everything in __all__ resolves, and importing bstar stays light."""

from __future__ import annotations

import subprocess
import sys

import bstar


def test_all_names_resolve() -> None:
    for name in bstar.__all__:
        assert getattr(bstar, name) is not None, name


def test_import_is_light() -> None:
    code = "import sys, bstar; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_notebook_style_use() -> None:
    d = bstar.Deployment(model=bstar.get_model("llama-3-8b"), gpu=bstar.get_gpu("h100-sxm"))
    plan = bstar.make_plan(d, [1024])
    assert plan.contexts[0].recommendation.max_num_seqs >= 1
