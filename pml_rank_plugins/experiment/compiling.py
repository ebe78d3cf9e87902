"""``trainer.compile``: whether (and how) the runner puts a run's models and losses under
``torch.compile``.

Forms (under the trainer spec, e.g. ``trainer: {MetricLossOnly: {compile: ...}}``, or
``--set trainer.compile=...``, or ``--compile``, the same as ``--set trainer.compile=true``)::

    compile: false            # or null / absent: eager (the default)
    compile: true             # torch.compile's defaults: backend inductor, mode default
    compile:                  # any of the keys, each optional
      backend: aot_eager      # a torch._dynamo backend name (torch._dynamo.list_backends)
      mode: reduce-overhead   # an inductor mode (CUDA graphs); inductor only
      fullgraph: true         # a graph break is an error instead of a split graph
      dynamic: null           # torch.compile's ``dynamic`` (true, false or null: automatic)

:func:`parse_compile` turns a value into :class:`CompileSettings` (or ``None`` for eager) and
refuses anything else naming the key: an unknown key or backend, a mode that is not an inductor
mode, a mode with another backend (torch ignores it there with a warning only), a non-boolean
``fullgraph``. What the runner does with it: :mod:`pml_rank_plugins.running.compiled`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .errors import ConfigError

COMPILE_KEYS = ("backend", "mode", "fullgraph", "dynamic")
DEFAULT_BACKEND = "inductor"


@dataclass(frozen=True)
class CompileSettings:
    """The keywords of ``torch.compile`` a run uses (``mode=None``: torch's default mode)."""

    backend: str = DEFAULT_BACKEND
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None

    def kwargs(self) -> dict[str, Any]:
        """``torch.compile`` / ``nn.Module.compile`` keywords."""
        return asdict(self)


def parse_compile(value: Any, key: str = "trainer.compile") -> CompileSettings | None:
    """``None`` (eager) for ``false`` / ``null``, else the :class:`CompileSettings` of ``true`` or
    of a mapping of :data:`COMPILE_KEYS` (see the module docstring).

    Raises:
        ConfigError: naming ``key`` (``key.backend``, ``key.mode``, ...) for any other value.
    """
    if value is None or value is False:
        return None
    if value is True:
        return CompileSettings()
    if not isinstance(value, dict):
        raise ConfigError(
            f"{key}: expected true, false or a mapping with keys {list(COMPILE_KEYS)}, got "
            f"{type(value).__name__} {value!r}"
        )
    unknown = sorted(map(str, set(value) - set(COMPILE_KEYS)))
    if unknown:
        raise ConfigError(f"{key}: unknown key(s) {unknown}; allowed: {list(COMPILE_KEYS)}")
    backend = value.get("backend", DEFAULT_BACKEND)
    _check_backend(backend, f"{key}.backend")
    mode = value.get("mode")
    if mode is not None:
        _check_mode(mode, backend, f"{key}.mode")
    for flag, allowed in (("fullgraph", (True, False)), ("dynamic", (True, False, None))):
        if flag in value and not any(value[flag] is v for v in allowed):
            shown = " or ".join("null" if v is None else str(v).lower() for v in allowed)
            raise ConfigError(f"{key}.{flag}: expected {shown}, got {value[flag]!r}")
    return CompileSettings(backend, mode, bool(value.get("fullgraph", False)), value.get("dynamic"))


def _check_backend(backend: Any, key: str) -> None:
    """A registered ``torch._dynamo`` backend name (imported only when a backend is named)."""
    if backend == DEFAULT_BACKEND:
        return
    import torch._dynamo  # noqa: PLC0415 -- ~1 s; only configs that name a backend pay it

    names = torch._dynamo.list_backends(exclude_tags=())
    if not isinstance(backend, str) or backend not in names:
        raise ConfigError(f"{key}: unknown torch.compile backend {backend!r}; one of {names}")


def _check_mode(mode: Any, backend: Any, key: str) -> None:
    """An inductor mode (``torch._inductor.list_mode_options``), with the inductor backend."""
    import torch._inductor  # noqa: PLC0415 -- only configs that name a mode pay the import

    modes = sorted(torch._inductor.list_mode_options())
    if not isinstance(mode, str) or mode not in modes:
        raise ConfigError(f"{key}: unknown torch.compile mode {mode!r}; one of {modes}")
    if backend != DEFAULT_BACKEND:
        raise ConfigError(
            f"{key}: {mode!r} is an inductor mode, but the backend is {backend!r} (torch would "
            "ignore the mode); drop the mode or use backend: inductor"
        )
