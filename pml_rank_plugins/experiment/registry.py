"""Name -> class (or factory function) resolution for YAML configs.

A config names every object by a string: ``{FastAPLoss: {num_bins: 10}}``. :func:`resolve` turns
the string into a Python callable by searching, in this order:

1. **Explicit forms** (never ambiguous):

   * ``plugin:Name`` or ``pml_rank_plugins.Name`` -- this plugin's class ``Name`` (searched over
     the exports of our subpackages, see below);
   * ``pml:Name`` -- PML's class ``Name``;
   * a fully qualified dotted path ``package.module.Name`` inside the known namespaces (e.g.
     ``torch.optim.Adam``, ``pml_rank_plugins.losses.FastAPLoss``), or inside a module the user
     allowed outside the config (``my_project.nets.MyNet`` after :func:`allow_modules`,
     ``pml-rank --allow-module my_project`` or ``PML_RANK_ALLOW_MODULES=my_project``).

2. **Bare names**, first hit wins:

   a. names added with :func:`register` (user classes);
   b. PML 2.9 (losses, miners, samplers, distances, reducers, regularizers, trainers, testers,
      ``AccuracyCalculator``, ``CustomKNN``/``FaissKNN``);
   c. this plugin (losses, miners, samplers, trainers, data, models, config);
   d. ``torch.optim``, ``torch.optim.lr_scheduler``, ``torch.nn``, ``torchvision.transforms``,
      ``torchvision.models``.

**Collision rule.** Where PML and the plugin both define a name (``FastAPLoss``,
``RankedListLoss``, ``CrossBatchMemory``, ``SelfSupervisedLoss``), the bare name keeps **PML's** meaning, so an existing PML config behaves
exactly as before; the plugin's class is reached as ``pml_rank_plugins.FastAPLoss`` or
``plugin:FastAPLoss``. Names only the plugin defines (``QuantizedAPLoss``, ``GlyphDataset``,
``CategoryHardSampler``, ...) resolve bare. :func:`register` refuses a name that already resolves
to a different object unless ``override=True`` (so a user registration cannot silently change the
meaning of a PML name).

**Trust rule.** A config names classes, not arbitrary callables: a name resolves only to an object
*defined* in the known namespaces (``NAMESPACES``), in a module the user allowed
(:func:`allow_modules`), or registered with :func:`register`. The module of a dotted path is
checked *before* it is imported, and the resolved object's ``__module__`` after (so
``allowed_module.system`` imported there ``from os`` is refused). ``DENIED_MODULES`` (``os``,
``subprocess``, ``builtins``, ...) can never be allowed. A refused name raises
:class:`UnknownNameError` naming the config key and how to allow a module.

Our classes are discovered at *lookup time* by reading the public exports (``__all__``, else
every public attribute defined inside ``pml_rank_plugins``) of each subpackage's ``__init__``,
so a class added to e.g. ``pml_rank_plugins/losses/__init__.py`` is found with no change here.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from types import ModuleType
from typing import Any, Callable

import torch
from pytorch_metric_learning.losses import BaseMetricLossFunction, MultipleLosses
from pytorch_metric_learning.losses.base_loss_wrapper import BaseLossWrapper
from pytorch_metric_learning.miners import BaseMiner
from pytorch_metric_learning.trainers import BaseTrainer

from .allowlist import (  # noqa: F401 -- re-exported: registry.allow_modules is the public API
    _MODULE_NAME,
    _OWN_NAMESPACES,
    ALLOW_ENV,
    DENIED_MODULES,
    NAMESPACES,
    PLUGIN_SUBPACKAGES,
    PML_MODULES,
    TORCH_MODULES,
    UnknownNameError,
    allow_modules,
    allowed_modules,
    check_object,
    check_path,
    is_under,
    is_under_cached,
)
from .argtypes import check_argument_types
from .errors import ConfigError

_USER: dict[str, Callable] = {}

PLUGIN_PREFIXES = ("plugin:", "pml_rank_plugins.")
PML_PREFIX = "pml:"


def _import(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _public_callables(
    module: ModuleType, own_prefix: tuple[str, ...] | None = None
) -> dict[str, Callable]:
    """Public classes/functions exported by ``module``.

    With ``__all__`` those names; otherwise every public callable attribute, restricted to objects
    defined under ``own_prefix`` when given (so we do not re-export e.g. ``torch`` from our
    packages). Private names and submodules are skipped.
    """
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    out = {}
    for n in names:
        obj = getattr(module, n, None)
        if obj is None or isinstance(obj, ModuleType) or not callable(obj):
            continue
        if own_prefix and not is_under_cached(str(getattr(obj, "__module__", None)), own_prefix):
            continue
        out[n] = obj
    return out


def _namespace(
    modules: tuple[str, ...], own_prefix: tuple[str, ...] | None = None
) -> dict[str, Callable]:
    table: dict[str, Callable] = {}
    for mod in filter(None, map(_import, modules)):  # the importable ones
        for n, obj in _public_callables(mod, own_prefix).items():
            table.setdefault(n, obj)
    return table


def pml_names() -> dict[str, Callable]:
    return _namespace(PML_MODULES, PML_MODULES)


def plugin_names() -> dict[str, Callable]:
    """Our exported classes, scanned now (so newly merged classes appear automatically)."""
    return _namespace(PLUGIN_SUBPACKAGES, _OWN_NAMESPACES)


def torch_names() -> dict[str, Callable]:
    """``torch.optim``, ``torch.nn``, ``torchvision.transforms``/``models`` public objects
    defined there (not, e.g., ``functools.wraps`` imported by ``torch.optim.lr_scheduler``)."""
    return _namespace(TORCH_MODULES, TORCH_MODULES)


def all_names() -> dict[str, str]:
    """Every resolvable bare name -> the dotted path it resolves to (for listings and errors)."""
    out: dict[str, str] = {}
    for table in (_USER, pml_names(), plugin_names(), torch_names()):
        for n, obj in table.items():
            out.setdefault(n, f"{getattr(obj, '__module__', '?')}.{n}")
    return out


KINDS = ("losses", "miners", "samplers", "trainers", "datasets", "models", "optimizers", "other")
# (kind, base classes), first match wins: a loss is an nn.Module too, so losses come before models.
# Losses are PML's metric losses, PML's loss wrappers (CrossBatchMemory, SelfSupervisedLoss),
# MultipleLosses, and torch's own losses (``torch.nn.modules.loss._Loss``).
_KIND_BASES: tuple[tuple[str, tuple[type, ...]], ...] = (
    (
        "losses",
        (BaseMetricLossFunction, BaseLossWrapper, MultipleLosses, torch.nn.modules.loss._Loss),
    ),
    ("miners", (BaseMiner,)),
    ("samplers", (torch.utils.data.Sampler,)),
    ("trainers", (BaseTrainer,)),
    ("datasets", (torch.utils.data.Dataset,)),
    ("models", (torch.nn.Module,)),
    ("optimizers", (torch.optim.Optimizer,)),
)
# torch Modules that are not models: image transforms and PML's distances/reducers/regularizers.
_NOT_MODELS = (
    "torchvision.transforms",
    "pytorch_metric_learning.distances",
    "pytorch_metric_learning.reducers",
    "pytorch_metric_learning.regularizers",
)


def kind_of(obj: Callable) -> str:
    """The ``KINDS`` entry of a resolvable object, decided by its class.

    A class is classified by ``issubclass`` against :data:`_KIND_BASES` (first match wins). A
    factory function is classified by its return annotation when that is a class (torchvision's
    ``resnet18() -> ResNet`` is a model). Image transforms and PML's distances, reducers and
    regularizers are ``torch.nn.Module`` subclasses but not models: they, plain functions,
    schedulers, testers, ... are ``"other"``.
    """
    cls = obj
    if not inspect.isclass(cls):
        try:
            cls = inspect.signature(obj).return_annotation
        except (TypeError, ValueError):  # builtins without a signature
            return "other"
    if not inspect.isclass(cls):
        return "other"
    for kind, bases in _KIND_BASES:
        if issubclass(cls, bases):
            if kind == "models" and is_under(str(getattr(obj, "__module__", "")), _NOT_MODELS):
                return "other"
            return kind
    return "other"


def _rows() -> list[tuple[str, str, Callable]]:
    """``(name, target, object)`` for :func:`listing`, sorted by bare name, PML's entry first."""
    rows: dict[str, tuple[str, Callable]] = {}
    for table in (_USER, pml_names(), plugin_names(), torch_names()):
        for n, obj in table.items():
            rows.setdefault(n, (f"{getattr(obj, '__module__', '?')}.{n}", obj))
    out = [(n, target, obj) for n, (target, obj) in rows.items()]
    for n, obj in plugin_names().items():
        target = f"{getattr(obj, '__module__', '?')}.{n}"
        if rows[n][0] != target:
            out.append((f"{PLUGIN_PREFIXES[1]}{n}", target, obj))
    return sorted(out, key=lambda r: (r[0].rpartition(".")[2].lower(), "." in r[0]))


def listing(kind: str | None = None) -> list[tuple[str, str]]:
    """``(name to write in a config, what it resolves to)`` for every resolvable class.

    Unlike ``all_names``, a plugin class whose bare name is taken by PML (``FastAPLoss``,
    ``RankedListLoss``, ``CrossBatchMemory``, ...) is listed too, under ``pml_rank_plugins.Name``.
    Sorted by bare name, PML's entry before ours. With ``kind`` (one of ``KINDS``), only the
    names of that kind (see ``kind_of``); an unknown kind raises ``ValueError`` listing them.
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    return [(n, t) for n, t, obj in _rows() if kind is None or kind_of(obj) == kind]


def register(name: str, obj: Callable, override: bool = False) -> Callable:
    """Make ``obj`` (a class or factory) resolvable as ``name`` in configs; returns ``obj``.

    Raises ``ValueError`` when ``name`` already resolves to a different object and ``override``
    is false. Usable as ``register("MyNet", MyNet)``.
    """
    if not callable(obj):
        raise TypeError(f"register({name!r}, ...): expected a class or callable, got {obj!r}")
    if not override:
        try:
            existing = resolve(name)
        except UnknownNameError:
            existing = None
        if existing is not None and existing is not obj:
            raise ValueError(
                f"{name!r} already resolves to {existing.__module__}.{existing.__qualname__}; "
                "pass override=True to shadow it"
            )
    _USER[name] = obj
    return obj


def unregister(name: str) -> None:
    _USER.pop(name, None)


def _unknown(name: str, candidates: list[str], why: str, loc: str = "") -> UnknownNameError:
    """The error for an unknown ``name``, with the closest ``candidates`` (bare names) written in
    the namespace the user wrote: ``pml_rank_plugins.FastAPLos`` suggests
    ``pml_rank_plugins.FastAPLoss``, not the bare ``FastAPLoss`` (PML's class: following a bare
    hint would silently swap the implementation)."""
    cut = max(name.rfind("."), name.rfind(":")) + 1
    head, short = name[:cut], name[cut:]
    close = [head + c for c in difflib.get_close_matches(short, candidates, n=5)]
    hint = f"; closest matches: {', '.join(close)}" if close else ""
    at = f" at {loc.removesuffix(': ')}" if loc else ""
    return UnknownNameError(f"unknown name {name!r}{at} ({why}){hint}")


def resolve(name: str, where: str = "") -> Callable:
    """Return the class/function ``name`` refers to (see the module docstring for the rule).

    Args:
        name: what the config writes, e.g. ``"FastAPLoss"`` or ``"torch.optim.SGD"``.
        where: the config key naming it (``"loss_funcs.metric_loss"``), put in front of errors.

    Returns:
        The class or factory function.

    Raises:
        UnknownNameError: nothing matches (with the closest known names), or the name is outside
            the allowed namespaces (with how to allow a module), or in a denied module.
    """
    loc = f"{where}: " if where else ""
    if not isinstance(name, str) or not name:
        raise UnknownNameError(f"{loc}expected a class name (string), got {name!r}")
    for prefix in PLUGIN_PREFIXES:
        if name.startswith(prefix):
            short = name[len(prefix) :]
            table = plugin_names()
            if short in table:
                return table[short]
            if prefix == "pml_rank_plugins." and "." in short:
                break  # a real dotted path inside our package: handled below
            raise _unknown(name, sorted(table), "not exported by pml_rank_plugins", loc)
    if name.startswith(PML_PREFIX):
        short = name[len(PML_PREFIX) :]
        table = pml_names()
        if short in table:
            return table[short]
        raise _unknown(name, sorted(table), "not in pytorch_metric_learning", loc)
    if ":" not in name and "." in name:
        module_name, _, attr = name.rpartition(".")
        if not _MODULE_NAME.match(name):
            raise UnknownNameError(f"{loc}{name!r} is not a class name or dotted path")
        check_path(name, module_name, loc)  # before importing: an import runs module code
        mod = _import(module_name)
        if mod is None:
            raise UnknownNameError(f"{loc}unknown name {name!r}: cannot import {module_name!r}")
        if not hasattr(mod, attr) or attr.startswith("_"):
            raise _unknown(name, sorted(_public_callables(mod)), f"not in {module_name}", loc)
        return check_object(name, getattr(mod, attr), loc)
    if (found := _bare(name)) is not None:
        return found
    raise _unknown(name, sorted(all_names()), "not registered, not in PML, plugin or torch", loc)


def _bare(name: str) -> Callable | None:
    """What the bare ``name`` resolves to (rule 2 above), or None. The torch modules are searched
    one at a time, first hit wins as in :func:`torch_names`, so torchvision (last; its import takes
    seconds) is imported only for a name that PML, the plugin and torch lack."""
    if name in _USER:
        return _USER[name]
    for table in (pml_names(), plugin_names()):
        if name in table:
            return table[name]
    for module in TORCH_MODULES:
        table = _namespace((module,), TORCH_MODULES)
        if name in table:
            return table[name]
    return None


def plugin_twin(obj: Any) -> str | None:
    """``pml_rank_plugins.Name`` when ``obj`` is PML's ``Name`` and the plugin has its own
    ``Name`` (e.g. ``CrossBatchMemory``, which accepts our losses where PML's refuses them)."""
    if not getattr(obj, "__module__", "").startswith("pytorch_metric_learning"):
        return None
    name = getattr(obj, "__name__", None)
    twin = plugin_names().get(name) if name else None
    if twin is None or twin is obj:
        return None
    return f"{PLUGIN_PREFIXES[1]}{name}"


def is_plugin_object(obj: Any) -> bool:
    return getattr(obj, "__module__", "").startswith("pml_rank_plugins")


def qualified_name(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def signature_text(obj: Callable) -> str:
    """``Name(arg=default, ...)`` including keywords accepted by base classes via ``**kwargs``."""
    params = [str(p) for p in _init_params(obj)]
    return f"{getattr(obj, '__name__', obj)}({', '.join(params)})"


def _own_init_signature(cls: type) -> inspect.Signature | None:
    init = cls.__dict__.get("__init__")
    if init is None:
        return None
    try:
        return inspect.signature(init)
    except (TypeError, ValueError):
        return None


def _init_params(obj: Callable) -> list[inspect.Parameter]:
    """Keyword parameters of ``obj``; for classes, follow ``**kwargs`` up the MRO.

    PML losses pass unknown keywords on to ``BaseMetricLossFunction`` (``distance``, ``reducer``,
    ...), so a class's own signature alone would hide them.
    """
    if not inspect.isclass(obj):
        try:
            return [
                p for p in inspect.signature(obj).parameters.values() if p.kind != p.VAR_POSITIONAL
            ]
        except (TypeError, ValueError):
            return []
    seen: dict[str, inspect.Parameter] = {}
    var_kw = None
    for cls in obj.__mro__:
        if cls is object:
            break
        sig = _own_init_signature(cls)
        if sig is None:
            continue
        has_var_kw = False
        for p in list(sig.parameters.values())[1:]:  # drop self
            if p.kind == p.VAR_KEYWORD:
                has_var_kw = True
                var_kw = p
            elif p.kind != p.VAR_POSITIONAL and p.name not in seen:
                seen[p.name] = p
        if not has_var_kw:
            var_kw = None
            break
    params = list(seen.values())
    if var_kw is not None:
        params.append(var_kw)
    return params


def accepted_keywords(obj: Callable) -> set[str] | None:
    """Keyword names ``obj`` accepts, or ``None`` when it takes arbitrary ``**kwargs``."""
    params = _init_params(obj)
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params}


def check_keywords(obj: Callable, kwargs: dict, where: str = "", name: str | None = None) -> None:
    """Raise ``TypeError`` naming the bad keyword(s), close matches and ``obj``'s signature;
    :class:`ConfigError` naming ``where.Name.key`` for a value of a type the class rules out
    (:func:`~pml_rank_plugins.experiment.argtypes.check_argument_types`); ``name``: the class as
    the config spells it (``plugin:FastAPLoss``), else its ``__name__``."""
    accepted = accepted_keywords(obj)
    bad = [k for k in kwargs if k not in accepted] if accepted is not None else []
    if bad:
        hints = []
        for k in bad:
            close = difflib.get_close_matches(k, sorted(accepted), n=3)
            hints.append(f"{k!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        loc = f" at {where}" if where else ""
        raise TypeError(
            f"{getattr(obj, '__name__', obj)}{loc}: unexpected keyword(s) {', '.join(hints)}; "
            f"signature: {signature_text(obj)}"
        )
    name = name or getattr(obj, "__name__", str(obj))
    where = f"{where}.{name}" if where else name
    check_argument_types(_init_params(obj), kwargs, where, ConfigError)
