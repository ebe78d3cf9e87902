"""No function in ``pml_rank_plugins/running`` is longer than 50 lines (issue 30).

Counted as ``tests/test_layout.py`` counts the CLI's: from the first decorator to the last line,
docstring included, every function and method (nested ones too).
"""

from __future__ import annotations

from pathlib import Path

from tests.function_sizes import function_lengths

RUNNING = Path(__file__).resolve().parents[2] / "pml_rank_plugins" / "running"
MAX_LINES = 50


def test_the_counter_counts_decorators_docstrings_and_nested_functions(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        "@decorator\n"
        "def outer():\n"
        '    """doc"""\n'
        "    def inner():\n"
        "        return 1\n"
        "    return inner\n"
        "class C:\n"
        "    def method(self):\n"
        "        pass\n"
    )
    assert function_lengths(source) == {"outer": 6, "outer.inner": 2, "C.method": 2}


def test_no_function_in_running_over_50_lines():
    files = sorted(RUNNING.glob("*.py"))
    assert len(files) > 10  # the package is where this test thinks it is
    long = {
        f"{path.name}:{name}": n
        for path in files
        for name, n in function_lengths(path).items()
        if n > MAX_LINES
    }
    assert not long, long
