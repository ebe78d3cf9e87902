"""Imports run one way: functional <- utils <- losses / miners <- trainers (issue 19)."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "pml_rank_plugins"
ALLOWED = {
    "functional": {"functional"},
    "utils": {"functional", "utils"},
    "losses": {"functional", "utils", "losses"},
    "miners": {"functional", "utils", "miners"},
    "trainers": {"functional", "utils", "losses", "miners", "trainers"},
}


def _package_imports(path: Path) -> list[tuple[str, bool]]:
    """``(subpackage, at_module_level)`` for every import of this package in ``path``."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            folders = path.relative_to(PACKAGE).parts[:-1]
            parts = folders[: max(0, len(folders) + 1 - node.level)]
            target = [*parts, *(node.module or "").split(".")]
            names = [a.name for a in node.names] if not node.module else [""]
            found += [((target + [n])[0] or n, id(node) in top) for n in names]
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = (
                [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            )
            for module in modules:
                if module and module.split(".")[0] == "pml_rank_plugins":
                    found.append((module.split(".")[1] if "." in module else "", id(node) in top))
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_the_layers_below_it(layer):
    files = sorted((PACKAGE / layer).rglob("*.py"))
    assert files
    for path in files:
        for target, _ in _package_imports(path):
            assert target in ALLOWED[layer], f"{path.relative_to(PACKAGE)} imports {target}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_package_imports_are_at_module_level(layer):
    for path in sorted((PACKAGE / layer).rglob("*.py")):
        for target, at_top in _package_imports(path):
            assert at_top, f"{path.relative_to(PACKAGE)} imports {target} inside a function"
