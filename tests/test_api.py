"""The public API: everything in __all__ resolves, and importing bstar stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

import bstar


def test_all_names_resolve() -> None:
    """Each public name is the very object its defining module holds (no stand-in, no
    copy), and __all__ lists exactly the exports and the version."""
    import importlib

    assert sorted(bstar.__all__) == sorted([*bstar._EXPORTS, "__version__"])
    for name, module in bstar._EXPORTS.items():
        assert getattr(bstar, name) is getattr(importlib.import_module(module), name), name
    assert bstar.get_model("llama-3-8b").name == "llama-3-8b"
    assert isinstance(bstar.IDEAL, bstar.Efficiency)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        bstar.nope  # noqa: B018


def test_recommend_is_one_thing_the_submodule() -> None:
    # `bstar.recommend` used to name both a function and its submodule (a module-class
    # hack kept the function); it is the submodule, as the import system makes it, and the
    # function lives in it.
    import types

    from bstar import recommend

    assert isinstance(recommend, types.ModuleType) and "recommend" not in bstar.__all__
    bstar.make_plan(bstar.Deployment(model=bstar.get_model("llama-3-8b"),
                                     gpu=bstar.get_gpu("h100-sxm")), [1024])
    assert bstar.recommend is recommend
    r = recommend.recommend(64.0, 100)
    assert r == bstar.Recommendation.from_cost_model(64.0, 100)


def test_import_is_light() -> None:
    code = "import sys, bstar; print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_notebook_style_use() -> None:
    d = bstar.Deployment(model=bstar.get_model("llama-3-8b"), gpu=bstar.get_gpu("h100-sxm"))
    plan = bstar.make_plan(d, [1024])
    assert plan.contexts[0].recommendation.max_num_seqs >= 1
