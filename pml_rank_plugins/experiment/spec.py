"""One run, parsed and validated once: :class:`RunSpec`.

A config reaches the runner as a plain mapping (a YAML file's method, ``--set`` applied). It is
parsed once, at the boundary (:func:`~pml_rank_plugins.experiment.collect_methods`,
:meth:`RunSpec.load` for a run folder's ``config.yaml``, :meth:`RunSpec.of` for a caller's dict),
into a frozen :class:`RunSpec`: the validated mapping plus what every layer reads from it -- the
evaluation settings with their defaults (:class:`EvalSettings`), the protocol (:class:`Protocol`:
one run, or MLRC with its fold and folds), the trainer (:class:`TrainerSpec`), the seed, the device
and the data root. Everything below the boundary takes a spec and reads its fields instead of
re-deriving them (validating, resolving the split function, applying defaults) from the dict.

A :class:`RunSpec` is also a read-only ``Mapping`` over its config (``spec["seed"]``,
``spec.get("eval")``, ``dict(spec)``), so code written for config dicts keeps working; the
derived copies (:meth:`RunSpec.for_run`, :meth:`RunSpec.fold`, :meth:`RunSpec.with_config`) are
not validated again: they change keys whose values are checked here (seed, name, fold) or
nothing a validation looks at (the transforms of a loaded run).

Parsing is O(size of the config) plus one :func:`~pml_rank_plugins.experiment.validate` (which
resolves every class name) and one resolution of the split function.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import torch

from ..data.splits import mlrc_protocol
from . import registry, values
from .accuracy import DEFAULT_METRICS
from .errors import ConfigError, RunFolderError
from .schema import SPLIT_KEYS, spec_name_and_kwargs, validate
from .yamlfile import load_yaml

DEFAULT_PRIMARY = "mean_average_precision_at_r"
CONFIG_FILE = "config.yaml"
# eval: defaults (``eval_settings`` of earlier versions); lists are copied per parse
EVAL_DEFAULTS: dict[str, Any] = {
    "metrics": list(DEFAULT_METRICS),
    "recall_at_k": [1, 2, 4, 8],
    "k": "max_bin_count",
    "primary_metric": DEFAULT_PRIMARY,
    "test_interval": 1,
    "patience": None,
    "validation": ["val"],
    "test": [],
}
# eval.pictures: what ``compare``/``sweep`` draw per method (kept out of EVAL_DEFAULTS, so the
# ``section`` that runs record is the same with or without it)
PICTURE_DEFAULTS: dict[str, Any] = {"num_queries": 8, "k": 5, "pdf": True}


def plain(value: Any) -> Any:
    """Deep copy with tuples as lists and mappings as dicts, so a config equals its YAML round
    trip (what ``config.yaml`` holds)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def split_name(entry: Any) -> str:
    """The query split of a split entry (a name or ``{query: q, reference: [...]}``)."""
    return entry if isinstance(entry, str) else entry["query"]


@dataclass(frozen=True)
class PictureSettings:
    """``eval.pictures``: the retrieval pictures ``compare`` and ``sweep`` draw per method.

    ``num_queries`` rows of ``k + 1`` tiles in each of the two figures (``retrieval``,
    ``worst_queries``), and their PDF copies when ``pdf``; defaults ``PICTURE_DEFAULTS``.
    The cost is O(num_queries x (k + 1)) tiles per figure (about 2 s per method at the defaults
    on a loaded 2-core machine, a third of it the PDF). Evaluation only: nothing trained depends
    on it.
    """

    num_queries: int = PICTURE_DEFAULTS["num_queries"]
    k: int = PICTURE_DEFAULTS["k"]
    pdf: bool = PICTURE_DEFAULTS["pdf"]

    @classmethod
    def parse(cls, ev: Mapping) -> PictureSettings:
        """The settings of an ``eval`` section (checked by
        :func:`~pml_rank_plugins.experiment.validate`)."""
        return cls(**{**PICTURE_DEFAULTS, **dict(ev.get("pictures") or {})})


@dataclass(frozen=True)
class EvalSettings:
    """The ``eval:`` section with its defaults (``EVAL_DEFAULTS``) filled in.

    ``validation``/``test`` are split entries: a split name (query = reference = that split) or
    ``{query: name, reference: [names]}``; ``section`` is the whole section as a dict (defaults
    included, ``tester`` and ``revisited`` as written), what
    :func:`~pml_rank_plugins.experiment.eval_settings` returns.
    """

    metrics: tuple[str, ...]
    recall_at_k: tuple[int, ...]
    k: Any
    primary_metric: str
    test_interval: int
    patience: int | None
    validation: tuple
    test: tuple
    tester: Any
    section: dict = field(repr=False)
    pictures: PictureSettings = field(default_factory=PictureSettings)

    @classmethod
    def parse(cls, config: Mapping) -> EvalSettings:
        """The settings of ``config`` (no validation: :func:`~pml_rank_plugins.experiment.validate`
        checks them)."""
        ev = dict(config.get("eval") or {})
        for key, default in EVAL_DEFAULTS.items():
            ev.setdefault(key, copy.deepcopy(default))
        return cls(
            metrics=tuple(ev["metrics"] or ()),
            recall_at_k=tuple(ev["recall_at_k"] or ()),
            k=ev["k"],
            primary_metric=str(ev["primary_metric"] or DEFAULT_PRIMARY),
            test_interval=int(ev["test_interval"]),
            patience=ev["patience"],
            validation=tuple(ev["validation"] or ()),
            test=tuple(ev["test"] or ()),
            tester=ev.get("tester"),
            section=ev,
            pictures=PictureSettings.parse(ev),
        )

    def entries(self, kinds: Sequence[str], available: Mapping | None = None) -> list:
        """The split entries of ``kinds`` (``"validation"``, ``"test"``) in that order, keeping
        only those whose query split is in ``available`` when given (an MLRC fold has no
        ``val`` split of its own when it is the test half, a ``datasets:`` config may lack one)."""
        out = [copy.deepcopy(e) for kind in kinds for e in getattr(self, kind)]
        if available is not None:
            out = [e for e in out if split_name(e) in available]
        return out


@dataclass(frozen=True)
class Protocol:
    """How a config is run: ``"single"`` (one run) or ``"mlrc"`` (the MLRC protocol of
    ``experiment.mlrc``, ``split: {mlrc_protocol: ...}``): ``fold`` is ``split.fold`` (``None``:
    every fold, one run each), ``num_folds`` the protocol's fold count (``None`` for single
    runs)."""

    kind: str
    fold: int | None = None
    num_folds: int | None = None

    @classmethod
    def parse(cls, config: Mapping) -> Protocol:
        """Resolves the split function once (the MLRC protocol is chosen by naming it)."""
        split = {k: v for k, v in (config.get("split") or {}).items() if k not in SPLIT_KEYS}
        if not split:
            return cls("single")
        name, kwargs = spec_name_and_kwargs(split, "split")
        if registry.resolve(name, "split") is not mlrc_protocol:
            return cls("single")
        fold = (config.get("split") or {}).get("fold")
        return cls("mlrc", None if fold is None else int(fold), int(kwargs.get("num_folds", 4)))

    @property
    def is_mlrc(self) -> bool:
        return self.kind == "mlrc"

    @property
    def all_folds(self) -> bool:
        """An MLRC config without ``split.fold``: trained as one run per fold."""
        return self.kind == "mlrc" and self.fold is None


@dataclass(frozen=True)
class TrainerSpec:
    """The ``trainer:`` spec: PML trainer ``name``, its keywords as written (``num_epochs``,
    ``amp`` and ``compile``, which the runner consumes, removed) and those three (``compile``
    as written; ``experiment.compiling.parse_compile`` reads it)."""

    name: str
    kwargs: dict
    num_epochs: int
    amp: Any
    compile: Any = None

    @classmethod
    def parse(cls, config: Mapping) -> TrainerSpec:
        name, kwargs = spec_name_and_kwargs(config["trainer"], "trainer")
        kwargs = dict(kwargs)
        num_epochs = int(kwargs.pop("num_epochs", 1))
        amp = kwargs.pop("amp", None)
        return cls(str(name), kwargs, num_epochs, amp, kwargs.pop("compile", None))


@dataclass(frozen=True, eq=False)
class RunSpec(Mapping):
    """One validated run config and what the layers read from it (see the module docstring).

    ``config`` is the validated mapping (plain dicts and lists, as ``config.yaml`` holds it);
    do not change it in place (derive a spec with :meth:`with_config` instead). As a ``Mapping``
    a spec reads like ``config`` and equals a dict with the same content.

    Attributes:
        config (dict): the validated config (plain dicts and lists).
        name (str | None): the run's name (``name:``; :meth:`for_run` sets it per run).
        seed (int): the run's seed (``seed:``, default 0, checked).
        device (str | None): ``device:`` as checked, ``None`` for the default (the CPU).
        data_root (str | None): ``data_root:`` as a string, ``None`` when unset.
        eval (EvalSettings): the ``eval:`` section with its defaults filled in.
        protocol (Protocol): single run or MLRC (fold, fold count).
        trainer (TrainerSpec): the ``trainer:`` spec (name, keywords, epochs, AMP).
    """

    config: dict = field(repr=False)
    name: str | None
    seed: int
    device: str | None
    data_root: str | None
    eval: EvalSettings = field(repr=False)
    protocol: Protocol
    trainer: TrainerSpec = field(repr=False)

    # ----------------------------------------------------------------- making specs

    @classmethod
    def parse(cls, config: Mapping) -> RunSpec:
        """Validate ``config`` (a copy, tuples as lists) once and derive the fields.

        Raises:
            ConfigError, UnknownNameError, TypeError: as :func:`validate
                <pml_rank_plugins.experiment.validate>`.
        """
        config = plain(config)
        validate(config)
        return cls._derive(config)

    @classmethod
    def of(cls, config: Mapping | RunSpec) -> RunSpec:
        """``config`` itself when it is a spec, else :meth:`parse` of it (callers with dicts)."""
        return config if isinstance(config, RunSpec) else cls.parse(config)

    @classmethod
    def load(cls, run_dir: str | Path, data_root: str | Path | None = None) -> RunSpec:
        """The spec of a run folder (its ``config.yaml``, ``read_run_config``), validated;
        ``data_root`` replaces the saved one (the data moved since training)."""
        config = read_run_config(run_dir)
        if data_root is not None:
            config["data_root"] = str(data_root)
        return cls.parse(config)

    @classmethod
    def _derive(cls, config: dict) -> RunSpec:
        root = config.get("data_root")
        return cls(
            config=config,
            name=config.get("name"),
            seed=values.seed_of(config),
            device=values.check_device(config.get("device")),
            data_root=None if root is None else str(root),
            eval=EvalSettings.parse(config),
            protocol=Protocol.parse(config),
            trainer=TrainerSpec.parse(config),
        )

    def with_config(self, config: Mapping) -> RunSpec:
        """A spec of ``config``, a variant of this spec's config that needs no new validation
        (only keys whose values are checked here changed, e.g. the transforms of a loaded run)."""
        return RunSpec._derive(plain(config))

    def for_run(self, name: str, seed: int) -> RunSpec:
        """This spec named ``name`` with seed ``seed`` (one run of a comparison)."""
        config = copy.deepcopy(self.config)
        config["seed"] = values.integer(seed, "seed", 0, values.MAX_SEED)
        config["name"] = name
        return replace(self, config=config, name=name, seed=config["seed"])

    def seeded_runs(self, name: str, seeds: int) -> list[RunSpec]:
        """Runs ``seed, seed+1, ..., seed+seeds-1`` of this spec, named ``name``."""
        if seeds < 1:
            raise ValueError(f"--seeds must be >= 1, got {seeds}")
        return [self.for_run(name, self.seed + i) for i in range(seeds)]

    def fold(self, k: int) -> RunSpec:
        """Fold ``k`` of an MLRC spec as an ordinary single run (``split.fold = k``)."""
        if not self.protocol.is_mlrc:
            raise ValueError("fold(): not an MLRC config")
        config = copy.deepcopy(self.config)
        config["split"]["fold"] = int(k)
        return replace(self, config=config, protocol=replace(self.protocol, fold=int(k)))

    # ----------------------------------------------------------------- reading it

    def device_for(self, override: str | None = None) -> str | None:
        """``--device`` when given (checked), else the config's ``device`` (``None``: default)."""
        if override is not None:
            return values.check_device(override, "--device")
        return self.device

    def torch_device(self, override: str | torch.device | None = None) -> torch.device:
        """:meth:`device_for` as a ``torch.device`` (the CPU by default)."""
        if isinstance(override, torch.device):
            return override
        return torch.device(self.device_for(override) or "cpu")

    def __getitem__(self, key: str) -> Any:
        return self.config[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.config)

    def __len__(self) -> int:
        return len(self.config)

    def __deepcopy__(self, memo: dict) -> dict:
        """A deep copy is the config as a plain dict (what callers that edit a copy want)."""
        return copy.deepcopy(self.config, memo)

    __hash__ = object.__hash__


def read_run_config(run_dir: str | Path) -> dict:
    """A run folder's ``config.yaml`` as written (the one reader of that file).

    Raises:
        RunFolderError: ``run_dir`` holds no ``config.yaml`` (not a run folder).
        ConfigError: the file is no YAML mapping.
    """
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        raise RunFolderError(
            f"{path} not found: {run_dir} is not a run folder (give the --out of a `pml-rank "
            "train` run)"
        )
    return load_yaml(path)


__all__ = [
    "CONFIG_FILE",
    "DEFAULT_PRIMARY",
    "ConfigError",
    "EvalSettings",
    "PictureSettings",
    "Protocol",
    "RunSpec",
    "TrainerSpec",
    "plain",
    "read_run_config",
    "split_name",
]
