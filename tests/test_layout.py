"""The package's layout rules, checked from the source (issue 19: "the one-way house").

* Imports run one way: every top-level subpackage may import only the subpackages listed for it in
  :data:`ALLOWED` (``functional`` at the bottom, ``cli`` on top); the import graph between
  modules has no cycle.
* No module imports another module of the package inside a function or method body (a hidden
  import hides a dependency and usually a cycle); the CLI (``cli.py`` and the command modules of
  ``commands/``) is exempt, since it imports the heavy subpackages lazily behind its parser.
* The CLI imports only the public names (``__all__``) of ``experiment``, ``running`` and
  ``reporting``.
* Sizes: no module over 450 lines, no subpackage over 30% of the package's lines, no function of
  the CLI over 60 lines.

Each check parses the files with :mod:`ast`; nothing is imported except for the ``__all__`` check.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

import pytest

from tests.function_sizes import function_lengths

PACKAGE = "pml_rank_plugins"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

LIBRARY = {"functional", "utils", "losses", "miners", "samplers", "trainers", "data", "models"}
# subpackage -> the subpackages it may import (besides itself and the root's ``__version__``)
ALLOWED: dict[str, set[str]] = {
    "_version": set(),  # the version string, standard library only: importable from anywhere
    "functional": set(),
    "utils": {"functional"},
    "losses": {"functional", "utils"},
    "miners": {"functional", "utils"},
    "data": {"functional"},
    "models": {"functional"},
    "samplers": {"functional", "data"},
    "trainers": {"functional", "utils"},
    "experiment": LIBRARY,
    "running": LIBRARY | {"experiment"},
    "reporting": LIBRARY | {"experiment", "running"},
}
# Modules on top of everything: the CLI (its entry point, parser and ``commands/``) and
# ``python -m``.
TOP = {"cli", "cli_args", "commands", "__main__"}
CLI = {"cli", "cli_args", "commands", "__main__"}  # the subpackage names of the CLI's modules
MAX_MODULE_LINES = 450
MAX_FOLDER_SHARE = 0.30
MAX_CLI_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


MODULES = package_files()
CLI_MODULES = sorted(m for m in MODULES if m.partition(".")[2].split(".")[0] in CLI)
# The CLI's entry point and its commands (and their shared helpers, ``commands.base``) import the
# heavy subpackages inside functions, so that ``--help`` stays fast; the parser (``cli_args``), the
# table (``commands``) and the shared option groups (``commands.options``) need not.
LAZY_IMPORTS_ALLOWED = {f"{PACKAGE}.cli"} | {
    m for m in CLI_MODULES if m.startswith(f"{PACKAGE}.commands.") and not m.endswith(".options")
}


def from_target(module: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module a ``from X import ...`` in ``module`` (file ``path``) imports from."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]  # a module's package
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def resolve(module: str, path: Path, node: ast.ImportFrom | ast.Import) -> list[str]:
    """The package modules an import statement in ``module`` names (absolute, existing ones)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
    target = from_target(module, path, node)
    if target.split(".")[0] != PACKAGE:
        return []
    out = []
    for alias in node.names:
        sub = f"{target}.{alias.name}"
        out.append(sub if sub in MODULES else target)  # `from . import mod` names a module
    return out


def imports_of(module: str, path: Path) -> tuple[list[str], list[tuple[int, str]]]:
    """(package modules imported at module level, [(line, module) imported inside a function])."""
    tree = ast.parse(path.read_text(), str(path))
    top: list[str] = []
    nested: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in resolve(module, path, child):
                    if in_function:
                        nested.append((child.lineno, target))
                    else:
                        top.append(target)
            is_function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            visit(child, in_function or is_function)

    visit(tree, False)
    return top, nested


GRAPH = {m: imports_of(m, p) for m, p in MODULES.items()}


def subpackage(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_package_is_found():
    # guards every other test here against passing on an empty or misplaced tree
    assert {"functional", "losses", "experiment", "running", "reporting"} <= {
        subpackage(m) for m in MODULES
    }
    assert len(MODULES) > 60


def test_no_in_package_import_inside_a_function():
    hidden = [
        f"{MODULES[m].relative_to(ROOT.parent)}:{line} imports {target}"
        for m, (_, nested) in GRAPH.items()
        if m not in LAZY_IMPORTS_ALLOWED
        for line, target in nested
    ]
    assert not hidden, "move these imports to the top of their module:\n" + "\n".join(hidden)


def test_imports_run_one_way():
    wrong = []
    for m, (top, nested) in GRAPH.items():
        sub = subpackage(m)
        if sub is None or sub in TOP:
            continue
        allowed = ALLOWED.get(sub)
        assert allowed is not None, f"{m}: subpackage {sub!r} has no entry in ALLOWED"
        for target in top + [t for _, t in nested]:
            other = subpackage(target)
            if other is None or other == sub:  # the root (``__version__``) or itself
                continue
            if other not in allowed:
                wrong.append(f"{m} imports {target} ({sub} may import {sorted(allowed)})")
    assert not wrong, "\n".join(wrong)


def find_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes (first == last), or None."""
    state: dict[str, int] = defaultdict(int)  # 0 new, 1 on the stack, 2 done
    stack: list[str] = []

    def dfs(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in graph.get(node, ()):
            if state[nxt] == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if state[nxt] == 0:
                found = dfs(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if state[node] == 0:
            found = dfs(node)
            if found:
                return found
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None


def test_no_import_cycle():
    graph = {m: sorted(set(top)) for m, (top, _) in GRAPH.items()}
    # A package's __init__ importing its own modules is how packages work; a module importing its
    # own package's __init__ back would close a cycle and is reported.
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cli_modules_are_found():
    assert {f"{PACKAGE}.cli", f"{PACKAGE}.cli_args", f"{PACKAGE}.commands"} <= set(CLI_MODULES)
    assert f"{PACKAGE}.commands.train" in LAZY_IMPORTS_ALLOWED
    assert f"{PACKAGE}.commands.options" not in LAZY_IMPORTS_ALLOWED


@pytest.mark.parametrize("package", ["experiment", "running", "reporting"])
def test_cli_imports_only_public_names(package):
    """Every CLI module (``cli``, ``cli_args``, ``commands.*``) imports ``package`` itself, never one
    of its submodules, and only names in its ``__all__``."""
    public = set(importlib.import_module(f"{PACKAGE}.{package}").__all__)
    target = f"{PACKAGE}.{package}"
    used = []
    for m in CLI_MODULES:
        tree = ast.parse(MODULES[m].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):  # `import pml_rank_plugins.running.x`
                assert not [a.name for a in node.names if a.name.startswith(target)], m
            if not isinstance(node, ast.ImportFrom):
                continue
            source = from_target(m, MODULES[m], node)
            if source == target:
                used += [a.name for a in node.names]
            else:
                assert not source.startswith(target + "."), f"{m} imports the submodule {source}"
    assert used, f"the CLI does not import {package}"
    assert set(used) <= public, sorted(set(used) - public)


def test_function_lengths_counts_nested_functions_and_methods(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    def g():\n        pass\n    return g\n\n\nclass C:\n"
                    "    @staticmethod\n    def h():\n        return 1\n")  # fmt: skip
    assert function_lengths(path) == {"f": 4, "f.g": 2, "C.h": 3}


def test_no_cli_function_over_60_lines():
    long = {
        f"{MODULES[m].relative_to(ROOT.parent)}:{name}": n
        for m in CLI_MODULES
        for name, n in function_lengths(MODULES[m]).items()
        if n > MAX_CLI_FUNCTION_LINES
    }
    assert not long, long


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_over_450_lines():
    big = {str(p.relative_to(ROOT)): lines(p) for p in MODULES.values()}
    big = {k: n for k, n in big.items() if n > MAX_MODULE_LINES}
    assert not big, big


def test_no_folder_over_30_percent_of_the_package():
    total = sum(lines(p) for p in MODULES.values())
    per: dict[str, int] = defaultdict(int)
    for m, p in MODULES.items():
        sub = subpackage(m)
        if sub is not None and p.parent != ROOT:
            per[sub] += lines(p)
    shares = {k: v / total for k, v in per.items()}
    assert set(shares) >= {"experiment", "running", "reporting", "functional"}
    assert max(shares.values()) <= MAX_FOLDER_SHARE, shares
