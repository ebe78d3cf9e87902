"""What a config may name: the known namespaces, the user's allowance and the deny list.

Configs and run folders from others are code: a name in a config becomes a call. So a config
names classes of the known namespaces (``NAMESPACES``: PML, this plugin's losses, miners,
samplers, trainers, data and models, ``torch.optim``, ``torch.nn``, ``torchvision.transforms``,
``torchvision.models``) or of modules the user allowed *outside* the config
(:func:`allow_modules`, ``pml-rank --allow-module my_pkg``, ``$PML_RANK_ALLOW_MODULES``).
``DENIED_MODULES`` (``os``, ``subprocess``, ``builtins``, ...) can never be allowed.
:mod:`.registry` applies :func:`check_path` to a dotted path *before* importing its module (an
import runs module code) and :func:`check_object` to what it resolves (an allowed module may
re-export ``os.system``).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any, Iterable


class UnknownNameError(KeyError):
    """A config names a class that no namespace defines."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


PML_MODULES = (
    "pytorch_metric_learning.losses",
    "pytorch_metric_learning.miners",
    "pytorch_metric_learning.samplers",
    "pytorch_metric_learning.distances",
    "pytorch_metric_learning.reducers",
    "pytorch_metric_learning.regularizers",
    "pytorch_metric_learning.trainers",
    "pytorch_metric_learning.testers",
    "pytorch_metric_learning.utils.accuracy_calculator",
    "pytorch_metric_learning.utils.inference",
)
PLUGIN_SUBPACKAGES = (
    "pml_rank_plugins.losses",
    "pml_rank_plugins.miners",
    "pml_rank_plugins.samplers",
    "pml_rank_plugins.trainers",
    "pml_rank_plugins.data",
    "pml_rank_plugins.data.splits",
    "pml_rank_plugins.models",
    "pml_rank_plugins.experiment.accuracy",
)
TORCH_MODULES = (
    "torch.optim",
    "torch.optim.lr_scheduler",
    "torch.nn",
    "torchvision.transforms",
    "torchvision.models",
)

_OWN_NAMESPACES = (*PLUGIN_SUBPACKAGES, "pml_rank_plugins.utils")
# Modules (and their submodules) whose objects a config may name without any allowance.
NAMESPACES = (*PML_MODULES, *_OWN_NAMESPACES, *TORCH_MODULES)
# Never nameable, not even after allow_modules(): they run commands, load code or touch files.
DENIED_MODULES = (
    "os",
    "posix",
    "nt",
    "subprocess",
    "_posixsubprocess",
    "builtins",
    "sys",
    "shutil",
    "importlib",
    "pickle",
    "_pickle",
    "copyreg",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "socket",
    "_socket",
    "ssl",
    "http",
    "urllib",
    "ftplib",
    "smtplib",
    "webbrowser",
    "ctypes",
    "_ctypes",
    "multiprocessing",
    "concurrent",
    "threading",
    "_thread",
    "asyncio",
    "signal",
    "pty",
    "code",
    "codeop",
    "runpy",
    "pdb",
    "io",
    "_io",
    "pathlib",
    "tempfile",
    "glob",
    "zipfile",
    "tarfile",
    "inspect",
    "types",
    "gc",
    "operator",
    "functools",
    "torch.hub",
    "torch.serialization",
    "torch.package",
    "torch.utils.cpp_extension",
)
ALLOW_ENV = "PML_RANK_ALLOW_MODULES"
ALLOW_HINT = (
    "to allow a module you trust, pass --allow-module my_pkg or set "
    f"{ALLOW_ENV}=my_pkg (or register() the class in Python)"
)
_MODULE_NAME = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

_ALLOWED: list[str] = []


def is_under(module: str, prefixes: Iterable[str]) -> bool:
    """True when ``module`` is one of ``prefixes`` or a submodule of one (``a.b`` is under
    ``a``; ``ab`` is not)."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@functools.lru_cache(maxsize=4096)
def is_under_cached(module: str, prefixes: tuple[str, ...]) -> bool:
    """:func:`is_under` for a tuple of prefixes, remembered (the registry's scans ask it of the
    same few hundred pairs on every lookup; it was half of their CPU)."""
    return is_under(module, prefixes)


def _check_allowance(name: str, source: str) -> str:
    """One entry of an allowance, stripped; ``ValueError`` for a malformed or denied one."""
    name = name.strip()
    if not _MODULE_NAME.match(name):
        raise ValueError(f"{source}: {name!r} is not a module name (e.g. my_pkg or my_pkg.nets)")
    if is_under(name, DENIED_MODULES):
        raise ValueError(
            f"{source}: module {name!r} cannot be allowed: configs may never name "
            f"{', '.join(DENIED_MODULES[:8])}, ... (they run commands or load code)"
        )
    return name


def allow_modules(names: Iterable[str]) -> None:
    """Let configs name objects defined in the modules ``names`` and their submodules
    (``my_pkg`` allows ``my_pkg.sub.Thing``).

    Also written to ``os.environ["PML_RANK_ALLOW_MODULES"]`` so worker processes (spawned by
    ``compare --jobs``, torchrun) inherit it.

    Args:
        names: module prefixes, e.g. ``["my_pkg", "other.nets"]``.

    Raises:
        ValueError: a name is not a module name, or is (or contains) a denied module such as
            ``os`` or ``subprocess`` (``DENIED_MODULES``); nothing is allowed then.
    """
    if isinstance(names, str):
        names = [names]
    checked = [_check_allowance(n, "allow_modules") for n in names]
    for n in checked:
        if n not in _ALLOWED:
            _ALLOWED.append(n)
    os.environ[ALLOW_ENV] = ",".join(allowed_modules())


def allowed_modules() -> tuple[str, ...]:
    """The module prefixes allowed beyond ``NAMESPACES``: those given to
    :func:`allow_modules` and those in ``$PML_RANK_ALLOW_MODULES`` (comma-separated, read now).

    Returns:
        The prefixes, each once, in the order given.

    Raises:
        ValueError: the environment variable names a malformed or denied module.
    """
    out = list(_ALLOWED)
    for n in os.environ.get(ALLOW_ENV, "").split(","):
        if n.strip():
            n = _check_allowance(n, f"${ALLOW_ENV}")
            if n not in out:
                out.append(n)
    return tuple(out)


def _user_allowed(where: str) -> tuple[str, ...]:
    try:
        return allowed_modules()
    except ValueError as e:
        raise UnknownNameError(f"{where}{e}") from None


# torchvision's datasets give no .labels: a folder of class sub-folders (its ImageFolder layout)
# is read by the plugin's ImageFolderDataset, which does.
DATASETS_HINT = (
    ". For a folder with one sub-folder per class (torchvision's ImageFolder layout) use "
    "ImageFolderDataset: {root: DIR} (category_folders: true for DIR/<category>/<class>/), "
    "which gives the (N, 2) labels the samplers and trainers need"
)


def check_path(name: str, module_name: str, where: str) -> None:
    """Refuse a dotted path whose module is outside the namespaces, before importing it."""
    if is_under(module_name, DENIED_MODULES):
        raise UnknownNameError(
            f"{where}{name!r} is refused: configs name classes, and module {module_name!r} can "
            "never be named (it runs commands, loads code or touches files; not even with "
            "--allow-module). Wrap what you need in a class and register() it in Python"
        )
    if not is_under(module_name, NAMESPACES + _user_allowed(where)):
        raise UnknownNameError(
            f"{where}{name!r} is not allowed: module {module_name!r} is outside the namespaces a "
            f"config may name ({', '.join(_SHORT_NAMESPACES)}); {ALLOW_HINT}"
            + (DATASETS_HINT if is_under(module_name, ("torchvision.datasets",)) else "")
        )


def check_object(name: str, obj: Any, where: str) -> Any:
    """Refuse an object not *defined* in an allowed module (e.g. ``os.system`` re-exported by an
    allowed module); returns ``obj``."""
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) or is_under(module, DENIED_MODULES):
        raise UnknownNameError(
            f"{where}{name!r} is refused: it is defined in module {module!r}, which configs may "
            "never name (not even with --allow-module)"
        )
    if not is_under(module, NAMESPACES + _user_allowed(where)):
        raise UnknownNameError(
            f"{where}{name!r} is not allowed: it is defined in module {module!r}, outside the "
            f"namespaces a config may name ({', '.join(_SHORT_NAMESPACES)}); {ALLOW_HINT}"
        )
    return obj


_SHORT_NAMESPACES = (
    "pytorch_metric_learning",
    "pml_rank_plugins' losses/miners/samplers/trainers/data/models",
    "torch.optim",
    "torch.nn",
    "torchvision.transforms",
    "torchvision.models",
)
