"""Both ends of the supported pytorch-metric-learning range, and the lowest torch (README
"Supported versions").

``nox -s pml_low pml_high`` (``pip install nox``, or the ``dev`` extra): each session installs
torch as ``make test`` does, then this package with the lowest (``pml_low``) or the newest
(``pml_high``) PML that ``pyproject.toml`` allows, and runs the tests of the PML-facing code --
losses, miners, samplers, trainers, the functional kernels and their helpers, the registry of
PML's names -- without the tests marked slow. CI runs the newest through ``make test``.
``nox -s torch_low`` runs the same tests with the lowest torch ``pyproject.toml`` allows
(``TORCH_LOW``: 2.11.0, the torch of the lent GPU machines' image) and the newest PML; it is not
in the default sessions (its torch wheel and CUDA libraries are a few GB more).

Each session is a fresh virtual environment under ``.nox/`` (torch included: a few GB, minutes
on the first run; ``nox -r`` reuses it). ``PML_LOW`` and ``TORCH_LOW`` must match the lower bounds in
``pyproject.toml`` (``tests/test_packaging.py`` checks them).
"""

from __future__ import annotations

import nox

PML_LOW = "2.5.0"  # the lowest release with RankedListLoss, which the drop-in tests compare with
PML_HIGH = "pytorch-metric-learning<3"  # the newest release the declared range allows
TORCH = ("torch==2.14.1", "torchvision==0.29.1")  # as the Makefile installs them
# the lowest torch pyproject.toml allows, with its torchvision: the lent GPU machines' torch
TORCH_LOW = ("torch==2.11.0", "torchvision==0.26.0")
TESTS = (
    "tests/losses",
    "tests/miners",
    "tests/samplers",
    "tests/trainers",
    "tests/functional",
    "tests/utils",
    "tests/experiment/test_registry.py",
)

nox.options.sessions = ["pml_low", "pml_high"]  # torch_low: on request


def _install_and_test(session: nox.Session, *pml: str, torch: tuple[str, ...] = TORCH) -> None:
    session.install(*torch)
    session.install("-e", ".[dev]")
    session.install(*pml)
    # The versions really installed, in the log (a resolver surprise would show here).
    session.run(
        "python",
        "-c",
        "import pytorch_metric_learning as p, torch; print('PML', p.__version__, 'torch', "
        "torch.__version__)",
    )
    session.run(
        "python", "-m", "pytest", "-q", "-n", "2", "-m", "not slow", *TESTS, *session.posargs
    )


@nox.session
def pml_low(session: nox.Session) -> None:
    """The lowest supported PML, pinned exactly."""
    _install_and_test(session, f"pytorch-metric-learning=={PML_LOW}")


@nox.session
def pml_high(session: nox.Session) -> None:
    """The newest PML the declared range allows (what ``make test`` and CI get)."""
    _install_and_test(session, "--upgrade", PML_HIGH)


@nox.session
def torch_low(session: nox.Session) -> None:
    """The lowest supported torch, pinned exactly, with the newest PML (not a default session)."""
    _install_and_test(session, "--upgrade", PML_HIGH, torch=TORCH_LOW)
