"""Commands of ``scripts/gpu_check_parts.py`` run in its own process under ``--tiny``.

A ``--tiny`` run (CI on the CPU, ``tests/test_gpu_check.py``) would otherwise start a Python
process that imports torch (4-6 s of CPU) for each benchmark script and for pytest, to run toy
sizes whose times mean nothing. A full run keeps one fresh process per command
(``gpu_check_parts.run``): its timings and peaks are measurements.
"""

from __future__ import annotations

import contextlib
import io
import os
import runpy
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def run_here(argv: list, env_extra: dict | None = None, cwd=ROOT) -> Iterator[io.StringIO]:
    """Runs the ``with`` body in this process as ``gpu_check_parts.run`` would run ``argv`` in a
    new one: ``sys.argv = argv``, ``env_extra`` in ``os.environ``, working directory ``cwd``,
    stdout and stderr into the yielded buffer; all restored afterwards. No time limit here: the
    part's own limit (``gpu_check.py`` stops its process group) still holds."""
    buffer = io.StringIO()
    saved_argv, saved_path, saved_cwd = sys.argv, list(sys.path), os.getcwd()
    saved_env = {key: os.environ.get(key) for key in env_extra or {}}
    sys.argv = [str(a) for a in argv]
    os.environ.update(env_extra or {})
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield buffer
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def exit_code(exit: SystemExit) -> int:
    """The status ``python script`` ends with after ``exit`` (``None``: 0; a message: 1)."""
    if exit.code is None or isinstance(exit.code, int):
        return exit.code or 0
    print(exit.code, file=sys.stderr)
    return 1


def run_script_here(script: Path, argv: list) -> tuple[int, str]:
    """``python script *argv`` in this process (``runpy`` as ``__main__``, the script's folder
    first on ``sys.path``, as Python starts a script); ``(exit code, output)`` as
    ``gpu_check_parts.run`` returns them (an uncaught exception: its traceback, exit code 1)."""
    with run_here([script, *argv]) as output:
        sys.path.insert(0, str(Path(script).parent))
        try:
            runpy.run_path(str(script), run_name="__main__")
            code = 0
        except SystemExit as e:
            code = exit_code(e)
        except Exception:  # noqa: BLE001 -- what the script's own process would print and exit 1
            traceback.print_exc()
            code = 1
    return code, output.getvalue()
