"""A command whose optional part is missing says so in one line (which extra, the pip
command) and exits 2: no traceback. Modules are made unimportable by an import hook."""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bstar.cli import main
from bstar.errors import missing_module_message

ROOT = Path(__file__).resolve().parents[1]
SEED001 = str(ROOT / "examples" / "seed001.csv")


class _Blocker(importlib.abc.MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


@pytest.fixture
def block(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., None]]:
    """block("matplotlib", ...): those packages (and their submodules) cannot be imported,
    as if not installed; modules already loaded are hidden for the test."""
    blocker = _Blocker(set())

    def add(*names: str) -> None:
        blocker.names.update(names)
        for mod in list(sys.modules):
            if mod.split(".")[0] in names:
                monkeypatch.delitem(sys.modules, mod)

    monkeypatch.setattr(sys, "meta_path", [blocker, *sys.meta_path])
    yield add


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("argv", [
    ["fit", SEED001, "--plot", "{tmp}/fit.png"],
    ["simulate", "--max-num-seqs", "2,4", "--concurrency", "4", "--num-requests", "20",
     "--plot", "{tmp}/s.svg"],
    ["report", "plan", "-o", "{tmp}/r.html"],
])
@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_missing_plot_extra_is_one_line(block: Callable[..., None], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str],
                                        argv: list[str]) -> None:
    block("matplotlib", "jinja2", "markupsafe")
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    line = one_line_error(capsys)
    assert line.startswith("bstar: error: ")
    assert "pip install 'bstar[plot]'" in line


def test_missing_llamacpp_extra_in_demo(block: Callable[..., None], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    block("xllamacpp")
    assert main(["demo", "--output-dir", str(tmp_path / "d")]) == 2
    line = one_line_error(capsys)
    assert "llamacpp" in line and "pip install 'bstar[" in line


def test_an_unforeseen_import_of_an_extra_still_gets_one_line(
        block: Callable[..., None], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    # Whatever path imports an extra's module without its own check, main() names the extra.
    import bstar.commands.fit as fit_cmd

    def needs_gguf(args: object) -> int:
        import gguf  # noqa: F401

        return 0

    block("gguf")
    monkeypatch.setattr(fit_cmd, "run_fit", needs_gguf)
    assert main(["fit", SEED001]) == 2
    assert one_line_error(capsys) == ("bstar: error: bstar fit needs gguf, from the 'tiny' "
                                      "extra: pip install 'bstar[tiny]'")


def test_a_missing_base_dependency_says_how_to_repair(
        block: Callable[..., None], capsys: pytest.CaptureFixture[str]) -> None:
    block("scipy")
    assert main(["fit", SEED001]) == 2
    line = one_line_error(capsys)
    assert "scipy" in line and "base dependency" in line and "pip install" in line


def test_other_import_errors_are_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    # A bug (an import of something bstar never depends on) must still raise.
    import bstar.commands.fit as fit_cmd

    def broken(args: object) -> int:
        import no_such_module_anywhere  # type: ignore[import-not-found]  # noqa: F401

        return 0

    monkeypatch.setattr(fit_cmd, "run_fit", broken)
    with pytest.raises(ModuleNotFoundError):
        main(["fit", SEED001])


def test_message_table() -> None:
    assert missing_module_message("matplotlib.pyplot", "bstar plan") == (
        "bstar plan needs matplotlib, from the 'plot' extra: pip install 'bstar[plot]'")
    assert missing_module_message("torch") is None


def test_base_dependencies_cover_the_main_commands() -> None:
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {d.split(">")[0].split("=")[0].strip() for d in meta["dependencies"]}
    assert {"numpy", "rich", "scipy", "aiohttp"} <= base
    extras = meta["optional-dependencies"]
    assert not extras["fit"] and not extras["sweep"]  # kept empty, for old install lines
