"""How long each function is, for the size rules of ``tests/test_layout.py`` (the CLI: 60 lines)
and ``tests/running/test_function_sizes.py`` (``running/``: 50 lines).

Counted from the first decorator to the last line, docstring included, every function and
method, nested ones too. The file is parsed with :mod:`ast`, never imported.
"""

from __future__ import annotations

import ast
from pathlib import Path


def function_lengths(path: Path) -> dict[str, int]:
    """``{qualified name: lines}`` of every function and method in ``path``."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out[name[:-1]] = child.end_lineno - first + 1
            visit(child, name)

    visit(ast.parse(path.read_text(), str(path)), "")
    return out
