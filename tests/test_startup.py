"""Issue 12, item 12: `bstar plan` keeps rich, scipy, aiohttp and matplotlib off its path,
and `bstar --help` imports no command module; issue 21: nor the other commands' renderers
(bench/startup.py measures the time)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("rich", "scipy", "aiohttp", "matplotlib", "jinja2")


def loaded_after(argv: list[str]) -> list[str]:
    code = ("import contextlib, io, json, sys\nfrom bstar.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(" + repr(argv) + ")\n    except SystemExit:\n        pass\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def test_plan_imports_no_heavy_module() -> None:
    mods = loaded_after(["plan"])
    assert "bstar.plan" in mods and "numpy" in mods  # it did plan (numpy: the cost model)
    assert [m for m in mods if m.split(".")[0] in HEAVY] == []
    # numpy's masked arrays (np.unique loads them) were a fifth of its start-up (issue 41).
    assert "numpy.ma" not in mods
    assert "difflib" not in mods  # only for an unknown name's suggestions


def test_plan_imports_only_its_own_renderer() -> None:
    # bstar.report.text loads a renderer module when its name is first asked for: the plan
    # needs its own and the shared helpers, no other command's, no chart or HTML builder.
    mods = loaded_after(["plan", "--model", "llama-3-8b", "--gpu", "h100-sxm"])
    assert [m for m in mods if m.startswith("bstar.report")] == [
        "bstar.report", "bstar.report.text", "bstar.report.text._common",
        "bstar.report.text.plan"]


def test_help_imports_no_command_module() -> None:
    mods = loaded_after(["--help"])
    assert [m for m in mods if m.startswith("bstar.commands.")] == []
    assert "numpy" not in mods


def test_a_command_registers_only_its_own_flags() -> None:
    mods = loaded_after(["gpus", "--json"])
    assert [m for m in mods if m.startswith("bstar.commands.")] == ["bstar.commands.common",
                                                                    "bstar.commands.emit",
                                                                    "bstar.commands.plan"]


def test_the_text_package_exports_each_renderer_it_can_load() -> None:
    """`__all__` is written out for static tools; it names the lazy table's entries, no more
    and no fewer, and each resolves to its module's object."""
    import importlib

    text = importlib.import_module("bstar.report.text")
    assert sorted(text.__all__) == sorted(text._RENDERERS)
    for name, module in text._RENDERERS.items():
        mod = importlib.import_module(f"bstar.report.text.{module}")
        assert getattr(text, name) is getattr(mod, name)
