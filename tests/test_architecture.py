"""The layers of docs/architecture.md, checked on the source: the library never reaches into
the command line, and the modules import each other without a cycle."""

from __future__ import annotations

import ast
import functools
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


@functools.cache
def _tree(path: Path) -> ast.Module:
    """Each module parsed once for the whole file (the walks below read the same trees)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def in_layer(name: str, layer: tuple[str, ...]) -> bool:
    return any(name == x or name.startswith(x + ".") for x in layer)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


@functools.cache
def imported(module: str, path: Path, top_level_only: bool,
             type_checking: bool = False) -> frozenset[str]:
    """Modules `module` imports: every import statement that can run (inside functions
    too), or only those run when it is imported (module level). `if TYPE_CHECKING:` blocks
    are left out unless `type_checking` (they never run, but a signature naming
    argparse.Namespace still ties the library to the command line)."""
    tree = _tree(path)
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
    return frozenset(out)


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


@pytest.mark.parametrize(("top_level_only", "type_checking"),
                         [(True, False), (False, False), (False, True)],
                         ids=["module-level", "all-imports", "with-type-checking"])
def test_no_import_cycle_among_bstar_modules(top_level_only: bool,
                                             type_checking: bool) -> None:
    # Module level: what runs on import. All imports: the lazy ones inside functions too
    # (the cycle report.views -> commands.plan -> report -> report.views was one of those).
    # With type checking: the `if TYPE_CHECKING:` imports as well (issue 27: a type-only
    # circle still says two rooms lean on each other).
    graph = {name: {d for d in imported(name, path, top_level_only, type_checking)
                    if d in MODULES and d != name}
             for name, path in MODULES.items()}
    assert _cycles(graph) == []
    # The detector finds a planted cycle.
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


# docs/architecture.md's layers, lowest first (a package stands for its modules).
LAYERS = (
    ("bstar", "bstar.specs", "bstar.presets", "bstar.errors", "bstar.units", "bstar.stats",
     "bstar.deployment", "bstar.engine_defaults", "bstar.safeio"),
    ("bstar.roofline", "bstar.kv_pool", "bstar.sim.steptime", "bstar.specdec",
     "bstar.kv_link"),
    ("bstar.knee", "bstar.slo", "bstar.recommend", "bstar.fit", "bstar.calibrate", "bstar.energy",
     "bstar.engines", "bstar.curves_table", "bstar.stages_table",
     "bstar.runs_table",
     "bstar.probe", "bstar.tinymodel", "bstar.kvcheck"),
    ("bstar.options", "bstar.plan", "bstar.disaggregate", "bstar.disagg_load"),
    ("bstar.sim", "bstar.loadgen", "bstar.servers", "bstar.search", "bstar.capacity",
     "bstar.validate", "bstar.validate_curves", "bstar.validate_stages", "bstar.validate_runs",
     "bstar.db", "bstar.disagg_runs"),
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
    # Type-only imports count too: fit/spec.py once called `options.build()` on a
    # DeploymentOptions it named under `if TYPE_CHECKING:` (issue 41). The package itself
    # (bstar/__init__.py) is the public facade: it names the API's modules for the type
    # checker and loads them lazily, so its arrows are not a layer's.
    upward = [f"{name} -> {dep}" for name, path in MODULES.items() if name != "bstar"
              for dep in imported(name, path, top_level_only=False, type_checking=True)
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
    return [n.value for n in ast.walk(_tree(path))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and _SQL.match(n.value)]


def test_sql_statements_live_in_the_stores() -> None:
    outside = {name: _sql_strings(path)[:2] for name, path in MODULES.items()
               if name not in STORES and _sql_strings(path)}
    assert outside == {}
    # The check sees the statements where they are.
    assert all(_sql_strings(MODULES[name]) for name in STORES)


# ---- sizes: "no file under src/ over 500 lines, no function over 80 without a reason" --------
MAX_FILE_LINES = 500
MAX_FUNCTION_LINES = 80
REASON = "long on purpose"  # what a longer function's docstring says, then why


def test_no_module_over_500_lines() -> None:
    sizes = {name: len(path.read_text(encoding="utf-8").splitlines())
             for name, path in MODULES.items()}
    assert {n: s for n, s in sizes.items() if s > MAX_FILE_LINES} == {}
    assert max(sizes.values()) > MAX_FILE_LINES // 2  # the count sees real files


def _long_functions() -> dict[str, str]:
    out = {}
    for name, path in MODULES.items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                    node.end_lineno or node.lineno) - node.lineno + 1 > MAX_FUNCTION_LINES:
                out[f"{name}.{node.name}"] = (ast.get_docstring(node) or "").lower()
    return out


def test_every_function_over_80_lines_says_why() -> None:
    long_ones = _long_functions()
    assert {n: d[:60] for n, d in long_ones.items() if REASON not in d} == {}
    assert long_ones  # the walk finds the ones that do say why (the client's state machine)


# ---- decisions in their rooms ------------------------------------------------------------------
# docs/architecture.md: knees, SLO batches and a level's batch are decided in the library's
# decision rooms; everything else reads them.
KNEE_ROOMS = ("bstar.knee", "bstar.recommend", "bstar.plan", "bstar.fit", "bstar.sim",
              "bstar.loadgen.sweep", "bstar.validate_curves")


def test_only_the_decision_rooms_compute_knees() -> None:
    users = sorted(name for name, path in MODULES.items()
                   if any(in_layer(d, ("bstar.knee",))
                          for d in imported(name, path, top_level_only=False)))
    assert users and all(in_layer(u, KNEE_ROOMS) for u in users), users


def _defines(path: Path, fn: str) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == fn
               for n in ast.walk(_tree(path)))


@pytest.mark.slow  # over 1.4 s on the 2-core machine: the fast loop stays under a minute
def test_one_definition_of_a_level_batch_and_an_slo_batch() -> None:
    assert [n for n, p in MODULES.items() if _defines(p, "level_batch")] == ["bstar.fit.points"]
    # The SLO batch is a field of the plan and a property of the fit (over the fit's own
    # knee); no view or command derives one.
    defined = [n for n, p in MODULES.items() if _defines(p, "sla_batch")
               or _defines(p, "slo_batch")]
    assert defined and all(in_layer(n, KNEE_ROOMS) for n in defined), defined


# ---- units: "unit formatting lives once, in units.py" -------------------------------------------
def _binary_unit_literals(path: Path) -> list[int]:
    """Lines holding 2**30, 2**20 or 1 << 30 as code (not text; 1 << 20 also counts things,
    e.g. fit.run's grid cap)."""
    out = []
    for n in ast.walk(_tree(path)):
        if isinstance(n, ast.BinOp) and isinstance(n.left, ast.Constant) and isinstance(
                n.right, ast.Constant) and (
                (isinstance(n.op, ast.Pow) and n.left.value == 2 and n.right.value in (20, 30))
                or (isinstance(n.op, ast.LShift) and n.left.value == 1
                    and n.right.value == 30)):
            out.append(n.lineno)
    return out


def test_binary_units_come_from_units_py() -> None:
    found = {name: _binary_unit_literals(p) for name, p in MODULES.items()
             if name != "bstar.units" and _binary_unit_literals(p)}
    assert found == {}
    assert _binary_unit_literals(MODULES["bstar.units"])  # where they do live


# ---- "every command's text goes through emit" ----------------------------------------------
def _stdout_prints_outside_emit(path: Path) -> list[int]:
    """Lines of print() calls to stdout (no file=) that are not part of an emit(...) call."""
    tree = _tree(path)
    inside: set[int] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "emit":
            inside |= {id(x) for a in n.args for x in ast.walk(a)}
    return [n.lineno for n in ast.walk(tree)
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"
            and not any(k.arg == "file" for k in n.keywords) and id(n) not in inside]


def test_commands_print_through_emit() -> None:
    cmds = {n: p for n, p in MODULES.items() if n.startswith("bstar.commands.")}
    found = {n: _stdout_prints_outside_emit(p) for n, p in cmds.items()
             if n not in ("bstar.commands.emit", "bstar.commands.host")
             and _stdout_prints_outside_emit(p)}
    assert found == {}
    assert _stdout_prints_outside_emit(cmds["bstar.commands.emit"])  # the check sees prints


# ---- rooms: no cycle between folders, no command importing another --------------------------
# What is counted: every import statement under src/bstar that can run, at module level or
# inside a function (a lazy import is still an arrow); `if TYPE_CHECKING:` blocks are left
# out here (annotations only; the module-level test above counts them separately). A folder
# is a package directory (bstar.sim, bstar.loadgen, ...); a top-level module is its own room.
def room_of(module: str) -> str:
    parts = module.split(".")
    if module in MODULES and MODULES[module].name == "__init__.py":
        return module if len(parts) <= 2 else ".".join(parts[:2])
    return ".".join(parts[:2]) if len(parts) >= 2 else module


def _room_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        if name == "bstar":
            continue
        src = room_of(name)
        for dep in imported(name, path, top_level_only=False):
            if dep in MODULES and dep != "bstar" and room_of(dep) != src:
                graph.setdefault(src, set()).add(room_of(dep))
    return graph


def test_no_import_cycle_among_folders() -> None:
    graph = _room_graph()
    assert _cycles(graph) == []
    # The rooms are the folders and the top-level modules; the walk sees their arrows.
    assert room_of("bstar.sim.engine") == "bstar.sim" and room_of("bstar.plan") == "bstar.plan"
    assert "bstar.kvcheck" in graph["bstar.loadgen"]


# The command layer's shared helpers are not commands: commands/common.py (flag parsers and
# the deployment/traffic flags every command maps) and commands/emit.py (the one output
# path). Every other module under commands/ is a command (or, host.py, an entry point) and
# imports no other: `bstar report SOURCE` gets each command's flags and page from
# bstar.cli.REPORT_SOURCES.
COMMAND_HELPERS = ("bstar.commands.common", "bstar.commands.emit",
                   "bstar.commands.disagg_flags",  # plan and simulate --disaggregate
                   "bstar.commands.traffic_flags")  # simulate's and search's traffic


def test_no_command_imports_another() -> None:
    commands = [n for n in MODULES if n.startswith("bstar.commands.")
                and n not in COMMAND_HELPERS]
    found = {n: sorted(d for d in imported(n, MODULES[n], top_level_only=False,
                                           type_checking=True)
                       if d.startswith("bstar.commands.") and d != n
                       and d not in COMMAND_HELPERS)
             for n in commands}
    assert {n: d for n, d in found.items() if d} == {}
    assert len(commands) > 10  # the walk sees the commands
    # The helpers themselves import no command either.
    assert {h: sorted(d for d in imported(h, MODULES[h], top_level_only=False)
                      if d.startswith("bstar.commands.") and d not in COMMAND_HELPERS)
            for h in COMMAND_HELPERS} == {h: [] for h in COMMAND_HELPERS}


# ---- docs/architecture.md names every module, and every module it names exists -------------
ARCHITECTURE = SRC.parent / "docs" / "architecture.md"
# A path under src/bstar as the page writes it: `sim/engine.py`, `kvcheck.py`, `sim/`.
_PATH = re.compile(r"(?<![\w./-])((?:[a-z_]+/)*[a-z_]+\.py)\b")
_FOLDER = re.compile(r"(?<![\w./-])([a-z_]+/)(?![\w.])")
ELSEWHERE = ("tests/", "bench/", "docs/", "scripts/")  # paths outside the package


def _module_paths() -> set[str]:
    return {str(p.relative_to(PKG)) for p in PKG.rglob("*.py") if p.name != "__init__.py"}


def test_architecture_md_names_only_modules_that_exist() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    exists = _module_paths()
    basenames = {p.rsplit("/", 1)[-1] for p in exists}
    named = set(_PATH.findall(text))
    # A path with its folder must exist as written; a bare file name (`engine.py` on the
    # sim/ line of the diagram) must be some module's file.
    missing = sorted(p for p in named if not p.startswith(ELSEWHERE) and (
        p not in exists if "/" in p else p not in basenames))
    assert missing == []
    folders = {str(p.relative_to(PKG)) + "/" for p in PKG.rglob("*") if p.is_dir()
               and p.name != "__pycache__"}
    # A folder likewise: `sim/`, or `charts/` on the report/ line (some folder's last name).
    folder_names = folders | {f.rstrip("/").rsplit("/", 1)[-1] + "/" for f in folders}
    assert sorted(set(_FOLDER.findall(text)) - folder_names - set(ELSEWHERE)) == []
    # The check can fail: a module that is not there is seen as missing.
    assert "sim/no_such_module.py" not in exists and "kvcheck.py" in named


def test_every_module_is_named_in_architecture_md() -> None:
    named = set(_PATH.findall(ARCHITECTURE.read_text(encoding="utf-8")))
    # Each module by its path from src/bstar (`loadgen/kvserver.py`, top level `plan.py`).
    assert sorted(_module_paths() - named) == []


# ---- one Poisson generator ----------------------------------------------------------------------
def _poisson_draws(path: Path) -> list[int]:
    """Lines drawing exponential gaps at a rate: `expovariate(...)` or `exponential(1 / r)`."""
    out = []
    for n in ast.walk(_tree(path)):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            continue
        if n.func.attr == "expovariate" or (
                n.func.attr == "exponential" and n.args and isinstance(n.args[0], ast.BinOp)
                and isinstance(n.args[0].op, ast.Div)):
            out.append(n.lineno)
    return out


def test_one_poisson_generator() -> None:
    # The simulator's open loop, capacity's, the validation stages' and the live sweep's
    # arrivals all come from stats.poisson_gaps_s (issue 41: worker.py and sim/traffic.py
    # each wrote one).
    found = {n: _poisson_draws(p) for n, p in MODULES.items() if _poisson_draws(p)}
    assert list(found) == ["bstar.stats"]
