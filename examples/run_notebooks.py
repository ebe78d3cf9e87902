"""Re-execute the example notebooks in place, so their committed outputs are current.

The notebooks in ``examples/`` are committed *with* their outputs: the documentation site renders
them without executing anything (myst-nb, ``nb_execution_mode = "off"``). After editing one (in
Jupyter, or any editor), refresh its outputs with

    python examples/run_notebooks.py            # every notebook
    python examples/run_notebooks.py 02 04      # the notebooks whose names start so

Each notebook runs top to bottom with nbclient in a fresh temporary working directory (so its run
folders never land in the repository), then is written back with the new outputs. The kernel
gets ``PML_RANK_DATA`` (``--data-root``; default: the variable, else ``<repo>/../shared/data``).
A notebook that fails is left unchanged and the script exits 1 naming it. The wall and CPU time of
each are printed with the machine's load average: at its default size every notebook must finish in
under a minute on CPU (``tests/test_examples.py`` runs them too, with a smaller training budget:
its ``TEST_SETTINGS``).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = Path(__file__).resolve().parent
CELL_TIMEOUT_S = 600


def cpu_seconds_of_children() -> float:
    """User + system CPU seconds of the finished child processes (the kernels, and the worker
    processes they started and waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def execute(
    nb: nbformat.NotebookNode, work_dir: str | Path, timeout: int = CELL_TIMEOUT_S
) -> tuple[float, float]:
    """Run ``nb`` in place with ``work_dir`` as its working directory.

    Returns ``(wall seconds, CPU seconds)``; the CPU seconds (kernel and its workers, user +
    system) do not depend on the machine's load the way the wall time does.

    Streams are coalesced (a ``\\r`` progress line keeps only its last state), no timing
    metadata is recorded, so re-running an unchanged notebook changes only what it prints.
    Raises ``nbclient.exceptions.CellExecutionError`` naming the failing cell.
    """
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(work_dir)}},
        coalesce_streams=True,
        record_timing=False,
    )
    start, cpu = time.perf_counter(), cpu_seconds_of_children()
    client.execute()  # shuts the kernel down and waits for it at the end
    return time.perf_counter() - start, cpu_seconds_of_children() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook name prefixes (default: all)")
    parser.add_argument(
        "--data-root",
        default=os.environ.get("PML_RANK_DATA") or str(HERE.parents[1] / "shared" / "data"),
        help="the folder holding omniglot/ (default: $PML_RANK_DATA, else <repo>/../shared/data)",
    )
    args = parser.parse_args(argv)
    # the kernels inherit the environment; the notebooks read PML_RANK_DATA, not a relative path,
    # since they run in a temporary directory
    os.environ["PML_RANK_DATA"] = str(Path(args.data_root).resolve())
    paths = sorted(HERE.glob("[0-9][0-9]_*.ipynb"))
    if args.names:
        paths = [p for p in paths if any(p.name.startswith(n) for n in args.names)]
    if not paths:
        parser.error(f"no notebook in {HERE} matches {args.names}")
    failed = []
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="pml_rank_example_") as work:
            try:
                seconds, cpu = execute(nb, work)
            except CellExecutionError as e:
                print(f"{path.name}: FAILED (left unchanged)\n{e}", file=sys.stderr)
                failed.append(path.name)
                continue
        nbformat.validate(nb)
        nbformat.write(nb, path)
        print(
            f"{path.name}: {seconds:.1f} s wall, {cpu:.1f} s CPU "
            f"(load average {load:.1f} at the start, {os.cpu_count()} cores)"
        )
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
