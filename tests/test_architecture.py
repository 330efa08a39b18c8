"""The layering docs/ARCHITECTURE.md promises, read from the project's own source with `ast`:

- no import cycle between project modules (function-level imports count: a cycle that only
  closes inside a function is still two modules that cannot be understood apart; so do imports
  under `if TYPE_CHECKING:`: they never run, but a cycle through them is still two modules that
  cannot be understood apart, and a protocol in a module both import breaks it);
- `safety/` and `kernelsearch/` import nothing from `tuner` (they stand alone);
- the floors at the top: nothing outside `tuner/cli/` imports the CLI (the entry point
  `tuner/__main__.py` aside), and nothing outside `tuner/daemon/` imports the daemon but the CLI
  that drives it (an operation, a search or a monitor that needs something of the daemon's has
  it moved down beside its own floor, and the daemon imports it from there).

Relative imports are resolved.
Dynamic imports (`importlib.import_module` of a name from a table) are not seen here; the tables
themselves fail loudly on a stale name (tests/test_architecture.py::test_module_tables_resolve).
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tuner", "safety", "kernelsearch")
#: the one module above the CLI: `python -m tuner`
CLI_ENTRY_POINTS = {"tuner.__main__"}
#: the floors at the top, highest first: each may import those below it, none those above
TOP_FLOORS = ("tuner.cli", "tuner.daemon")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    return {module_name(root, p): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (under `if TYPE_CHECKING:` too)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def imports_of(name: str, path: Path, modules: set[str]) -> list[tuple[str, int]]:
    """(imported project module, line) for each import in the file at `path` (module `name`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, int]] = []

    def resolve(dotted: str) -> str | None:
        # the longest prefix that is a project module: `import tuner.search.loop` -> tuner.search.loop
        parts = dotted.split(".")
        while parts:
            cand = ".".join(parts)
            if cand in modules:
                return cand
            parts.pop()
        return None

    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (m := resolve(alias.name)) is not None:
                    out.append((m, node.lineno))
            continue
        if node.level:
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            src = ".".join(base + ([node.module] if node.module else []))
        else:
            src = node.module or ""
        for alias in node.names:
            # `from pkg import sub` imports the submodule when there is one
            m = resolve(f"{src}.{alias.name}") if f"{src}.{alias.name}" in modules else resolve(src)
            if m is not None:
                out.append((m, node.lineno))
    return out


def import_graph(root: Path = ROOT) -> tuple[dict[str, set[str]], dict[tuple[str, str], str]]:
    mods = project_modules(root)
    names = set(mods)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    where: dict[tuple[str, str], str] = {}
    for m, p in mods.items():
        for dep, line in imports_of(m, p, names):
            if dep != m:
                graph[m].add(dep)
                where.setdefault((m, dep), f"{p.relative_to(root)}:{line}")
    return graph, where


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _cycle_path(comp: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One concrete loop through a component, for the failure message."""
    members = set(comp)
    path = [comp[0]]
    seen = {comp[0]}
    while True:
        nxt = sorted(d for d in graph[path[-1]] if d in members)
        back = [d for d in nxt if d == comp[0]]
        if back and len(path) > 1:
            return path + [comp[0]]
        fresh = [d for d in nxt if d not in seen]
        if not fresh:
            return path + [nxt[0]] if nxt else path
        path.append(fresh[0])
        seen.add(fresh[0])


def _floor(m: str) -> int | None:
    """The index in TOP_FLOORS of the floor module `m` is on (None: below them all)."""
    for i, f in enumerate(TOP_FLOORS):
        if m == f or m.startswith(f + "."):
            return i
    return None


def violations(root: Path = ROOT) -> list[str]:
    graph, where = import_graph(root)
    problems: list[str] = []
    for comp in cycles(graph):
        loop = _cycle_path(comp, graph)
        steps = ", ".join(f"{a} -> {b} ({where[(a, b)]})" for a, b in zip(loop, loop[1:]) if (a, b) in where)
        problems.append(f"import cycle among {', '.join(comp)}: {steps}")
    for m, deps in sorted(graph.items()):
        top = m.split(".")[0]
        for d in sorted(deps):
            if top in ("safety", "kernelsearch") and d.split(".")[0] == "tuner":
                problems.append(f"{m} imports {d} ({where[(m, d)]}): {top} must not import tuner")
            if top == "safety" and d.split(".")[0] == "kernelsearch":
                problems.append(f"{m} imports {d} ({where[(m, d)]}): safety must not import kernelsearch")
            if (d == "tuner.cli" or d.startswith("tuner.cli.")) and not (
                    m == "tuner.cli" or m.startswith("tuner.cli.") or m in CLI_ENTRY_POINTS):
                problems.append(f"{m} imports {d} ({where[(m, d)]}): only the CLI imports the CLI")
            elif (up := _floor(d)) is not None and m not in CLI_ENTRY_POINTS and (
                    (mine := _floor(m)) is None or mine > up):
                problems.append(f"{m} imports {d} ({where[(m, d)]}): {TOP_FLOORS[up]} is a floor "
                                f"above it (only {' and '.join(TOP_FLOORS[:up + 1])} import it)")
    return problems


def test_the_project_imports_point_downwards_only():
    problems = violations()
    assert not problems, "\n".join(problems)


def test_workloads_do_not_import_the_simulated_host():
    """The simulated host registers its workloads (tuner/sim/__init__.py); the workloads below
    it never reach up for them."""
    graph, where = import_graph()
    up = [f"{m} -> {d} ({where[(m, d)]})" for m, deps in sorted(graph.items())
          if m.startswith("tuner.workloads") for d in sorted(deps) if d.startswith("tuner.sim")]
    assert not up, "\n".join(up)


# -- the checker itself finds what it is meant to find -------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg / "__init__.py").touch()
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        for parent in p.relative_to(tmp_path).parents:
            if str(parent) != ".":
                (tmp_path / parent / "__init__.py").touch()
        p.write_text(text)
    return tmp_path


def test_a_cycle_closed_inside_a_function_through_a_relative_import_is_found(tmp_path):
    root = _tree(tmp_path, {
        "tuner/ops/__init__.py": "def invoke():\n    from tuner.search.loop import run\n",
        "tuner/search/loop.py": "def run():\n    from ..ops import get\n",
    })
    (msg,) = violations(root)
    assert "import cycle among tuner.ops, tuner.search.loop" in msg
    assert "tuner/search/loop.py:2" in msg


def test_plain_downward_imports_are_not_cycles(tmp_path):
    root = _tree(tmp_path, {
        "tuner/a.py": "from typing import Any\n",
        "tuner/b.py": "import tuner.a\nfrom . import a\n",
    })
    assert violations(root) == []


def test_layer_breaks_are_found(tmp_path):
    root = _tree(tmp_path, {
        "tuner/cli/__init__.py": "from tuner.ops.registry import x\n",
        "tuner/ops/registry.py": "x = 1\n", "tuner/cli/common.py": "",
        "tuner/daemon/service.py": "def settings():\n    from tuner.cli.common import settings\n",
        "tuner/__main__.py": "from tuner.cli import main\n",
        "safety/journal.py": "import tuner.errors\n",
        "kernelsearch/guard.py": "from tuner import trial\n",
        "tuner/errors.py": "", "tuner/trial.py": "",
    })
    got = violations(root)
    assert len(got) == 3, got
    assert any("tuner.daemon.service imports tuner.cli.common" in g for g in got)
    assert any("safety.journal imports tuner.errors" in g for g in got)
    assert any("kernelsearch.guard imports tuner.trial" in g for g in got)


# -- the module tables name modules that exist ----------------------------------------------------

def _tables() -> list[str]:
    from tuner import ops
    from tuner.cli import MODULES
    from tuner.knobs.registry import PROVIDERS
    from tuner.ops.safety import knob_factory
    from tuner.proposers import _REGISTRY

    watchdog_spec, _ = knob_factory(SimpleNamespace(backend="real", root=Path("/")))
    return [*ops.OP_MODULES, *(f"tuner.cli.{m}" for m in MODULES),
            *(f"tuner.knobs.{p}" for p in PROVIDERS), *_REGISTRY.values(), watchdog_spec]


@pytest.mark.parametrize("spec", _tables())
def test_module_tables_resolve(spec):
    mod, _, attr = spec.partition(":")
    assert importlib.util.find_spec(mod) is not None, f"{spec}: no module {mod}"
    if attr:
        assert hasattr(importlib.import_module(mod), attr), f"{spec}: {mod} has no {attr}"


# -- small modules: no file in tuner/, kernelsearch/, safety/ over MAX_LINES ----------------------

MAX_LINES = 500


def oversized(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    """`path (N lines)` for every .py file under the packages longer than `limit` lines."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8", errors="replace").splitlines())
            if n > limit:
                out.append(f"{path.relative_to(root)} ({n} lines)")
    return out


def test_no_module_in_the_packages_is_over_500_lines(tmp_path):
    """One job a module: a file past the limit is split by what its parts hold (issue 36)."""
    root = _tree(tmp_path, {"safety/big.py": "x = 1\n" * (MAX_LINES + 1),
                            "safety/small.py": "x = 1\n" * MAX_LINES})
    assert oversized(root) == [f"safety/big.py ({MAX_LINES + 1} lines)"]
    over = oversized()
    assert not over, f"files over {MAX_LINES} lines (split them by what they hold): {over}"


# -- TYPE_CHECKING cycles and the daemon's floor (issue 36) ----------------------------------------

def test_a_cycle_closed_only_under_type_checking_is_found(tmp_path):
    root = _tree(tmp_path, {
        "tuner/workloads/llama.py": "from tuner.workloads.llama_ops import Ops\n",
        "tuner/workloads/llama_ops.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from tuner.workloads.llama import Runtime\n"),
    })
    (msg,) = violations(root)
    assert "import cycle among tuner.workloads.llama, tuner.workloads.llama_ops" in msg
    assert "tuner/workloads/llama_ops.py:3" in msg


def test_a_lower_floor_importing_the_daemon_is_found(tmp_path):
    root = _tree(tmp_path, {
        "tuner/daemon/kernel_canary.py": "", "tuner/daemon/client.py": "X = 1\n",
        "tuner/ops/profile.py": "def monitors():\n    from tuner.daemon.kernel_canary import M\n",
        "tuner/ops/probation.py": "from ..daemon.client import X\n",
        "kernelsearch/reader.py": "import tuner.daemon.client\n",
        # downward and within the floors: allowed
        "tuner/daemon/service.py": "from tuner.ops import profile\nfrom . import client\n",
        "tuner/cli/apply_cmd.py": "from tuner.daemon.client import X\n",
        "tuner/__main__.py": "import tuner.daemon.client\n",
    })
    got = violations(root)
    assert sorted(g.split(" (")[0] for g in got) == [
        # twice: kernelsearch imports no tuner, and nothing below the daemon imports it
        "kernelsearch.reader imports tuner.daemon.client",
        "kernelsearch.reader imports tuner.daemon.client",
        "tuner.ops.probation imports tuner.daemon.client",
        "tuner.ops.profile imports tuner.daemon.kernel_canary"], got
    assert any("tuner/ops/profile.py:2" in g and "only tuner.cli and tuner.daemon import it" in g
               for g in got), got
