"""The package's runtime dependencies for ``scripts/gpu_check.py``: which are missing, and the
set-up of a bare GPU machine from carried wheels (issue 40).

* :func:`runtime_requirements` -- ``[project].dependencies`` of ``pyproject.toml``;
* :func:`check_dependencies` -- each one: installed version, whether its module imports, and
  what is wrong (the ``environment`` part fails naming every missing one);
* :func:`install_missing` -- when a dependency's module cannot be found, installs the wheels of
  ``.device-wheels/`` (``make gpu-wheels``) whose distributions are not installed, with
  ``pip install --no-index --no-deps`` (no network needed), and says what it installed.

``python scripts/gpu_check_deps.py [--wheels DIR] [--print]``: the check, then the install
(``--print``: what would be installed, nothing installed). Imports no torch: ``gpu_check.py``
runs it before any part.

faiss: ``faiss-cpu`` (the dependency) or ``faiss-gpu`` satisfy it; ``make gpu-wheels`` carries
faiss-cpu (faiss-gpu's wheel is 135 MB plus the CUDA 12 runtime: install it where a network
exists, ``pip uninstall -y faiss-cpu && pip install faiss-gpu-cu12``); the ``knn`` part names the
build that ran.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WHEELS = ROOT / ".device-wheels"
# distribution -> the module that proves it is there (the name when they are the same)
MODULES = {
    "pytorch-metric-learning": "pytorch_metric_learning",
    "record-keeper": "record_keeper",
    "faiss-cpu": "faiss",
    "pyyaml": "yaml",
    "scikit-learn": "sklearn",
}
# distributions another one stands in for (faiss-gpu has the same module and API)
ALTERNATIVES = {"faiss-cpu": ("faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cu11")}
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)$")


def normalize(name: str) -> str:
    """PEP 503 name: ``Record_Keeper`` -> ``record-keeper``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[tuple[str, str]]:
    """``[(distribution, version specifier)]`` of ``[project].dependencies``."""
    text = pyproject.read_text()
    try:
        import tomllib  # Python >= 3.11

        deps = tomllib.loads(text)["project"]["dependencies"]
    except ImportError:  # Python 3.10: the list of quoted strings after "dependencies = ["
        block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.S | re.M)
        deps = re.findall(r'"([^"]+)"', block.group(1)) if block else []
    found = []
    for dep in deps:
        match = _NAME.match(dep.split(";")[0])
        if match:
            found.append((normalize(match.group(1)), match.group(2).strip()))
    return found


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def spec_problem(version: str, spec: str) -> str | None:
    """Why ``version`` does not satisfy ``spec`` (``None``: it does, or it cannot be checked)."""
    if not spec:
        return None
    try:
        from packaging.specifiers import SpecifierSet  # pip's vendored copy is not importable
        from packaging.version import Version
    except ImportError:
        return None
    return None if Version(version) in SpecifierSet(spec) else f"{version} does not satisfy {spec}"


def check_dependencies(import_modules: bool = True) -> list[dict]:
    """Each runtime dependency: ``{"name", "spec", "module", "version", "problem"}`` (``problem``
    ``None`` when it is there). ``import_modules=False``: only look the module up (no import)."""
    rows = []
    for name, spec in runtime_requirements():
        module = MODULES.get(name, name.replace("-", "_"))
        candidates = [name, *ALTERNATIVES.get(name, ())]
        dist = next((c for c in candidates if installed_version(c)), None)
        version = installed_version(dist) if dist else None
        problem = None
        if import_modules:
            try:
                importlib.import_module(module)
            except Exception as e:  # noqa: BLE001 -- reported: any import failure is a finding
                problem = f"import {module} fails: {type(e).__name__}: {e}"
        elif importlib.util.find_spec(module) is None:
            problem = f"module {module} not found"
        if problem is None and version is None:
            problem = f"module {module} imports but no distribution {' or '.join(candidates)}"
        if problem is None and dist == name:
            problem = spec_problem(version, spec)
        rows.append(
            {
                "name": name if dist in (None, name) else f"{name} (as {dist})",
                "spec": spec,
                "module": module,
                "version": version,
                "problem": problem,
            }
        )
    return rows


def missing(rows: list[dict]) -> list[str]:
    return [f"{row['name']} ({row['problem']})" for row in rows if row["problem"]]


def faiss_route(faiss: dict) -> str:
    """Which faiss build the k-NN search gets, and the faiss-gpu route when it is the CPU one."""
    gpu_route = "faiss-gpu: `pip uninstall -y faiss-cpu && pip install faiss-gpu-cu12` where a "
    gpu_route += "network exists (135 MB wheel plus the CUDA 12 runtime: too big to carry)"
    if not faiss["installed"]:
        return f"none (CUDA: the exact torch search TorchKNN; CPU: PML's CustomKNN); {gpu_route}"
    if faiss["build"] == "GPU":
        return f"faiss-gpu {faiss['version']} ({faiss['gpus']} GPUs)"
    return (
        f"faiss-cpu {faiss['version']} (CUDA embeddings: the exact torch search TorchKNN on the "
        f"GPU, faiss-gpu not checked); {gpu_route}"
    )


def wheel_distribution(wheel: Path) -> str:
    """``record_keeper-0.9.32-py3-none-any.whl`` -> ``record-keeper``."""
    return normalize(wheel.name.split("-")[0])


def wheels_to_install(folder: Path) -> list[Path]:
    """The wheels in ``folder`` whose distribution is not installed, by name."""
    return [w for w in sorted(folder.glob("*.whl")) if not installed_version(wheel_distribution(w))]


def pip_install(wheels: list[Path], python: str = sys.executable) -> tuple[int, str]:
    """``pip install --no-index --no-deps`` of ``wheels`` into ``python``'s environment (the one
    every subprocess of the kit uses); retried with ``--break-system-packages`` where the image's
    Python is externally managed (PEP 668)."""
    cmd = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    cmd += [str(w) for w in wheels]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 and "externally-managed-environment" in done.stdout + done.stderr:
        done = subprocess.run(
            [*cmd[:4], "--break-system-packages", *cmd[4:]], capture_output=True, text=True
        )
    return done.returncode, (done.stdout + done.stderr).strip()


def install_missing(folder: Path = DEFAULT_WHEELS, dry_run: bool = False) -> dict:
    """When a runtime dependency's module is not found, install the wheels of ``folder`` whose
    distributions are missing.

    Returns:
        ``{"needed": [missing before], "folder", "installed": [wheel names], "error": str |
        None, "message": one line for the report}``; nothing is installed when nothing is
        missing, and ``error`` says why when the folder is absent or pip fails.
    """
    needed = missing(check_dependencies(import_modules=False))
    result = {"needed": needed, "folder": str(folder), "installed": [], "error": None}
    if not needed:
        return {**result, "message": "every runtime dependency found: nothing installed"}
    wheels = wheels_to_install(folder) if folder.is_dir() else []
    if not folder.is_dir():
        result["error"] = f"missing {', '.join(needed)}, and no wheel folder {folder}"
        result["error"] += " (run `make gpu-wheels` where PyPI is reachable and carry it)"
    elif dry_run:
        return {**result, "message": f"would install {[w.name for w in wheels]} from {folder}"}
    elif wheels:
        code, output = pip_install(wheels)
        if code == 0:
            result["installed"] = [w.name for w in wheels]
        else:
            result["error"] = f"pip install from {folder} failed ({code}): {output[-500:]}"
    still = missing(check_dependencies(import_modules=False))
    if still and not result["error"]:
        result["error"] = f"still missing after the install: {', '.join(still)}"
    installed = ", ".join(result["installed"]) or "nothing"
    message = f"missing {', '.join(needed)}; installed {installed} from {folder}"
    return {**result, "message": message + (f"; {result['error']}" if result["error"] else "")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=DEFAULT_WHEELS)
    parser.add_argument("--print", action="store_true", help="say what would be installed")
    args = parser.parse_args(argv)
    result = install_missing(args.wheels, dry_run=args.print)
    print(f"gpu_check setup: {result['message']}")
    return 1 if result["error"] else 0


if __name__ == "__main__":
    sys.exit(main())
