"""The layers of docs/architecture.md, checked on the source: the library never reaches into
the command line, and the modules import each other without a cycle."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "bstar"

# The command-line layer: the argparse table, the commands and `python -m bstar`.
CLI_LAYER = ("bstar.cli", "bstar.__main__", "bstar.commands")
FORBIDDEN = ("argparse", "bstar.cli", "bstar.commands")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def in_layer(name: str, layer: tuple[str, ...]) -> bool:
    return any(name == x or name.startswith(x + ".") for x in layer)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imported(module: str, path: Path, top_level_only: bool,
             type_checking: bool = False) -> set[str]:
    """Modules `module` imports: every import statement that can run (inside functions
    too), or only those run when it is imported (module level). `if TYPE_CHECKING:` blocks
    are left out unless `type_checking` (they never run, but a signature naming
    argparse.Namespace still ties the library to the command line)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    is_pkg = path.name == "__init__.py"
    nodes: list[ast.stmt] = []
    if top_level_only:
        todo = list(tree.body)
        while todo:
            n = todo.pop()
            if isinstance(n, ast.If) and not _is_type_checking(n):
                todo += n.body + n.orelse
            elif isinstance(n, ast.Try):
                todo += n.body + n.orelse + n.finalbody
                for h in n.handlers:
                    todo += h.body
            else:
                nodes.append(n)
    else:
        todo_any: list[ast.AST] = [tree]
        while todo_any:
            n = todo_any.pop()
            if isinstance(n, ast.If) and _is_type_checking(n) and not type_checking:
                todo_any += n.orelse  # annotations only: never imported at run time
                continue
            if isinstance(n, ast.stmt):
                nodes.append(n)
            todo_any += list(ast.iter_child_nodes(n))
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - (n.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            # `from bstar import roofline` imports the module bstar.roofline (its package
            # is imported first in any case); `from bstar.plan import make_plan`, bstar.plan.
            subs = {f"{base}.{a.name}" for a in n.names} & MODULES.keys()
            out.update(subs if subs else {base})
    return out


def test_the_library_never_imports_the_command_line() -> None:
    offenders = []
    for name, path in MODULES.items():
        if in_layer(name, CLI_LAYER):
            continue
        for dep in imported(name, path, top_level_only=False, type_checking=True):
            if in_layer(dep, FORBIDDEN):
                offenders.append(f"{name} imports {dep}")
    assert offenders == []


def test_the_walk_sees_what_the_command_layer_imports() -> None:
    # The check above must be able to fail: the commands do import argparse and the library.
    deps = imported("bstar.commands.plan", MODULES["bstar.commands.plan"], False)
    assert "argparse" in deps and "bstar.commands.common" in deps
    assert "bstar.plan" in imported("bstar.commands.plan", MODULES["bstar.commands.plan"],
                                    False)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(u: str) -> None:
        state[u] = 1
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                found.append([*stack[stack.index(v):], v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u)
    return found


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module-level", "all-imports"])
def test_no_import_cycle_among_bstar_modules(top_level_only: bool) -> None:
    # Module level: what runs on import. All imports: the lazy ones inside functions too
    # (the cycle report.views -> commands.plan -> report -> report.views was one of those).
    graph = {name: {d for d in imported(name, path, top_level_only)
                    if d in MODULES and d != name}
             for name, path in MODULES.items()}
    assert _cycles(graph) == []
    # The detector finds a planted cycle.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


# docs/architecture.md's layers, lowest first (a package stands for its modules).
LAYERS = (
    ("bstar", "bstar.specs", "bstar.presets", "bstar.errors", "bstar.units", "bstar.stats"),
    ("bstar.roofline", "bstar.kv_pool", "bstar.sim.steptime"),
    ("bstar.knee", "bstar.slo", "bstar.recommend", "bstar.fit", "bstar.calibrate",
     "bstar.engines",
     "bstar.validate", "bstar.validate_curves", "bstar.curves_table", "bstar.stages_table",
     "bstar.probe", "bstar.tinymodel"),
    ("bstar.deployment", "bstar.plan"),
    ("bstar.sim", "bstar.loadgen", "bstar.servers", "bstar.search",
     "bstar.kvcheck", "bstar.validate_stages", "bstar.db"),
    ("bstar.report",),
    ("bstar.commands",),
    ("bstar.cli", "bstar.__main__"),
)


def layer_of(module: str) -> int:
    best: tuple[int, int] | None = None
    for i, names in enumerate(LAYERS):
        for x in names:
            if (module == x or module.startswith(x + ".")) and (best is None
                                                                 or len(x) > best[1]):
                best = (i, len(x))
    assert best is not None, f"{module} is in no layer of docs/architecture.md"
    return best[0]


def test_imports_point_down_the_layers() -> None:
    upward = [f"{name} -> {dep}" for name, path in MODULES.items()
              for dep in imported(name, path, top_level_only=False)
              if dep in MODULES and dep not in (name, "bstar")
              and layer_of(dep) > layer_of(name)]
    assert upward == []
    assert layer_of("bstar.sim.steptime") < layer_of("bstar.sim.engine")


# docs/architecture.md, "what is written to the results DB": one helper opens every SQLite
# file, checks it and words its errors (bstar.db); each store holds its own tables'
# statements (the results DB's, the search DB's). Nothing else talks to SQLite.
SQLITE_HELPER = "bstar.db"
STORES = ("bstar.db", "bstar.loadgen.store", "bstar.search.store")
_SQL = re.compile(r"^\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|PRAGMA)\b")


def test_only_the_store_helper_imports_sqlite3() -> None:
    users = sorted(name for name, path in MODULES.items()
                   if any(d == "sqlite3" or d.startswith("sqlite3.")
                          for d in imported(name, path, top_level_only=False,
                                            type_checking=True)))
    assert users == [SQLITE_HELPER]


def _sql_strings(path: Path) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _SQL.match(n.value)]


def test_sql_statements_live_in_the_stores() -> None:
    outside = {name: _sql_strings(path)[:2] for name, path in MODULES.items()
               if name not in STORES and _sql_strings(path)}
    assert outside == {}
    # The check sees the statements where they are.
    assert all(_sql_strings(MODULES[name]) for name in STORES)
