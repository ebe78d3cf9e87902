"""Build the PML objects of one experiment from a validated config.

Everything is resolved through :mod:`pml_rank_plugins.experiment.registry`, so the builder does not
care which dataset, model, loss or sampler class a config names. What the builder injects:

* samplers get ``labels`` (the (N, 2) array for our samplers, the class column for PML's) and the
  trainer's ``batch_size`` and the run ``seed`` when their signature has them and the config
  does not set them;
* optimizers ``<name>_optimizer`` get the parameters of ``models[<name>]`` or
  ``loss_funcs[<name>]`` (skipped, with a log line, when that object has no parameters);
* lr schedulers ``<name>_scheduler_by_{iteration,epoch,plateau}`` get ``optimizers[<name>_optimizer]``.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import random
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import torch
from pytorch_metric_learning.utils import common_functions as pml_common

from ..trainers import distributed as scaled
from . import registry, values
from .accuracy import make_accuracy_calculator, make_tester
from .compiling import parse_compile
from .data_root import resolve_weights
from .datasets import build_splits
from .instantiate import _named_params, build_object, call_named, instantiate
from .schema import ConfigError, spec_name_and_kwargs
from .spec import EvalSettings, RunSpec
from .transforms import collate_for

LOGGER = logging.getLogger(__name__)
SCHEDULER_SUFFIXES = ("_scheduler_by_iteration", "_scheduler_by_epoch", "_scheduler_by_plateau")


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- data


def build_sampler(config: dict, train_set, batch_size: int, seed: int):
    spec = config.get("sampler")
    if not spec:
        return None
    name, _ = spec_name_and_kwargs(spec, "sampler")
    cls = registry.resolve(name, "sampler")
    labels = np.asarray(train_set.labels)
    if getattr(cls, "__module__", "").startswith("pytorch_metric_learning"):
        labels = labels[:, 0]  # PML samplers take 1-D class labels
    return build_object(spec, "sampler", labels=labels, batch_size=batch_size, seed=seed)


# --------------------------------------------------------------------------- models & optim


def build_models(config: dict, device: torch.device) -> dict[str, torch.nn.Module]:
    root = config.get("data_root")
    models = {
        k: build_object(resolve_weights(v, root), f"models.{k}")
        for k, v in config["models"].items()
    }
    if "embedder" not in models:
        models["embedder"] = torch.nn.Identity()
    return {k: m.to(device) for k, m in models.items()}


def build_losses_and_miners(config: dict, device: torch.device):
    losses = {k: build_object(v, f"loss_funcs.{k}") for k, v in config["loss_funcs"].items()}
    losses = {k: (v.to(device) if isinstance(v, torch.nn.Module) else v) for k, v in losses.items()}
    miners = {
        k: build_object(v, f"mining_funcs.{k}")
        for k, v in (config.get("mining_funcs") or {}).items()
        if v is not None
    }
    return losses, miners


def build_optimizers(config: dict, models: dict, losses: dict) -> dict:
    out = {}
    for key, spec in (config.get("optimizers") or {}).items():
        if spec is None:
            continue
        if not key.endswith("_optimizer"):
            raise ConfigError(f"optimizers.{key}: keys must be <model or loss name>_optimizer")
        owner = key[: -len("_optimizer")]
        target = models.get(owner, losses.get(owner))
        if target is None:
            raise ConfigError(
                f"optimizers.{key}: no model or loss named {owner!r} "
                f"(models: {sorted(models)}, losses: {sorted(losses)})"
            )
        params = [p for p in target.parameters() if p.requires_grad]
        if not params:
            LOGGER.info("optimizers.%s: %s has no parameters; skipped", key, owner)
            continue
        name, kwargs = spec_name_and_kwargs(spec, f"optimizers.{key}")
        cls = registry.resolve(name, f"optimizers.{key}")
        kwargs = instantiate(kwargs, f"optimizers.{key}.{name}")
        registry.check_keywords(cls, {"params": None, **kwargs}, f"optimizers.{key}", name)
        out[key] = call_named(f"optimizers.{key}", name, cls, params, **kwargs)
    return out


def build_lr_schedulers(config: dict, optimizers: dict) -> dict:
    out = {}
    for key, spec in (config.get("lr_schedulers") or {}).items():
        if spec is None:
            continue
        suffix = next((s for s in SCHEDULER_SUFFIXES if key.endswith(s)), None)
        if suffix is None:
            raise ConfigError(f"lr_schedulers.{key}: key must end with one of {SCHEDULER_SUFFIXES}")
        opt_key = key[: -len(suffix)] + "_optimizer"
        if opt_key not in optimizers:
            LOGGER.info("lr_schedulers.%s: no optimizer %s; skipped", key, opt_key)
            continue
        name, kwargs = spec_name_and_kwargs(spec, f"lr_schedulers.{key}")
        cls = registry.resolve(name, f"lr_schedulers.{key}")
        kwargs = instantiate(kwargs, f"lr_schedulers.{key}.{name}")
        out[key] = call_named(f"lr_schedulers.{key}", name, cls, optimizers[opt_key], **kwargs)
    return out


# --------------------------------------------------------------------------- evaluation


def eval_settings(config: Mapping) -> dict:
    """The ``eval:`` section with defaults filled in, as a dict (a spec's
    :attr:`~pml_rank_plugins.experiment.RunSpec.eval` holds it parsed; the defaults are
    ``spec.EVAL_DEFAULTS``).

    ``validation``/``test`` are lists of split entries: a split name (query = reference = that
    split) or ``{query: name, reference: [names]}`` (query/gallery retrieval).
    """
    settings = config.eval if isinstance(config, RunSpec) else EvalSettings.parse(config)
    return copy.deepcopy(settings.section)


def splits_to_eval(entries: list, available: dict) -> list[tuple[str, list[str]]]:
    """Config split entries -> PML's ``splits_to_eval`` list of (query, [references])."""
    out = []
    for e in entries or []:
        names = values.split_names(e, "eval")  # the one parser of an entry (also used by validate)
        q, refs = names[0], names[1:] or [names[0]]
        for s in [q, *refs]:
            if s not in available:
                raise ConfigError(f"eval: split {s!r} does not exist (have {sorted(available)})")
        out.append((q, refs))
    return out


def build_tester(config: Mapping, device: torch.device, end_of_testing_hook=None):
    """The configured PML tester; its calculator is ours (Recall@K, faiss or ``CustomKNN``)
    unless the tester spec names an ``accuracy_calculator`` itself. ``config``: a
    :class:`~pml_rank_plugins.experiment.RunSpec` (or a config mapping, whose ``eval:`` section is
    read)."""
    ev = config.eval if isinstance(config, RunSpec) else EvalSettings.parse(config)
    tester_spec = ev.tester or {"GlobalEmbeddingSpaceTester": {}}
    name, kwargs = spec_name_and_kwargs(tester_spec, "eval.tester")
    cls = registry.resolve(name, "eval.tester")
    kwargs = instantiate(kwargs, f"eval.tester.{name}")
    registry.check_keywords(cls, kwargs, "eval.tester", name)
    values.check_tester(name, kwargs)
    calc = kwargs.pop("accuracy_calculator", None) or make_accuracy_calculator(
        metrics=list(ev.metrics), recall_at_k=list(ev.recall_at_k), k=ev.k, device=device
    )
    primary = ev.primary_metric
    if primary not in calc.get_curr_metrics():
        raise ConfigError(
            f"eval.primary_metric {primary!r} is not computed; metrics: {calc.get_curr_metrics()}"
        )
    kwargs.setdefault("data_device", device)
    if end_of_testing_hook is not None:
        kwargs.setdefault("end_of_testing_hook", end_of_testing_hook)
    return make_tester(calc, tester_cls=cls, **kwargs)


# --------------------------------------------------------------------------- trainer


@dataclass
class Experiment:
    """Everything one run needs; built fresh (and deterministically) for train, resume and eval."""

    config: dict
    seed: int
    device: torch.device
    datasets: dict
    models: dict
    loss_funcs: dict
    mining_funcs: dict
    optimizers: dict
    lr_schedulers: dict
    sampler: Any
    trainer_cls: type
    trainer_kwargs: dict
    num_epochs: int
    extra: dict = field(default_factory=dict)
    spec: RunSpec | None = None

    def eval_entries(self, *kinds: str) -> list:
        """The config's split entries of ``kinds`` (``"validation"``, ``"test"``) whose query
        split this experiment built (:meth:`~pml_rank_plugins.experiment.EvalSettings.entries`)."""
        ev = self.spec.eval if self.spec is not None else EvalSettings.parse(self.config)
        return ev.entries(kinds, self.datasets)


def build_experiment(
    config: RunSpec | Mapping, device: torch.device | str | None = None
) -> Experiment:
    """Seed, then build data, models, losses, miners, optimizers, schedulers and the sampler.

    ``config``: a :class:`~pml_rank_plugins.experiment.RunSpec` (validated when it was parsed), or a
    config mapping, validated here (:meth:`~pml_rank_plugins.experiment.RunSpec.of`): every path
    that builds a run (train, resume, eval of a saved or edited ``config.yaml``, check) refuses the
    same configs, naming the key. ``device``: overrides the config's (``--device``; the CPU when
    neither says).
    """
    spec = RunSpec.of(config)
    config = spec.config
    device = spec.torch_device(device)
    seed = spec.seed
    seed_everything(seed)
    datasets = build_splits(spec, seed)
    if "train" not in datasets:
        raise ConfigError(f"split: one split must be named 'train' (have {sorted(datasets)})")
    values.check_eval_splits(config, datasets)
    tname, tkwargs = spec_name_and_kwargs(config["trainer"], "trainer")
    trainer_cls = registry.resolve(tname, "trainer")
    tkwargs = instantiate(dict(tkwargs), f"trainer.{tname}")
    values.check_trainer(tname, tkwargs)
    num_epochs = int(tkwargs.pop("num_epochs", 1))
    amp = tkwargs.pop("amp", None)
    try:
        scaled.parse_amp(amp)
    except ValueError as e:
        raise ConfigError(f"trainer.{tname}.{e}") from None
    compiling = parse_compile(tkwargs.pop("compile", None), f"trainer.{tname}.compile")
    registry.check_keywords(trainer_cls, tkwargs, "trainer", tname)
    if "collate_fn" in _named_params(trainer_cls):  # unequal image sizes: name the transform key
        tkwargs.setdefault("collate_fn", collate_for(datasets["train"], "train split"))
    seed_everything(seed)  # model init must not depend on how much randomness the data used
    models = build_models(config, device)
    losses, miners = build_losses_and_miners(config, device)
    optimizers = build_optimizers(config, models, losses)
    schedulers = build_lr_schedulers(config, optimizers)
    sampler = build_sampler(config, datasets["train"], int(tkwargs["batch_size"]), seed)
    return Experiment(
        config=config,
        seed=seed,
        device=device,
        datasets=datasets,
        models=models,
        loss_funcs=losses,
        mining_funcs=miners,
        optimizers=optimizers,
        lr_schedulers=schedulers,
        sampler=sampler,
        trainer_cls=trainer_cls,
        trainer_kwargs=tkwargs,
        num_epochs=num_epochs,
        extra={
            "amp": amp,
            "grad_scaler": scaled.make_grad_scaler(amp, device),
            "compile": compiling,  # a CompileSettings or None (running.compiled applies it)
        },
        spec=spec,
    )


def make_trainer(exp: Experiment, end_of_iteration_hook=None, end_of_epoch_hook=None):
    """The configured PML trainer; single-process data loading by default (reproducible)."""
    kwargs = dict(exp.trainer_kwargs)
    kwargs.setdefault("dataloader_num_workers", 0)
    # PML's own keywords that PML does not validate (a negative worker count fails in torch)
    values.check_trainer(spec_name_and_kwargs(exp.config["trainer"], "trainer")[0], kwargs)
    kwargs.setdefault("data_device", exp.device)
    if "label_hierarchy_level" in _named_params(exp.trainer_cls):
        kwargs.setdefault("label_hierarchy_level", 0)
    trainer_cls, models = exp.trainer_cls, exp.models
    if exp.extra.get("amp") is not None or scaled.world_size() > 1:
        # global-batch data parallelism + autocast; exp.models stay unwrapped (checkpoints, eval)
        trainer_cls = scaled.distributed_trainer_class(trainer_cls)
        models = scaled.wrap_ddp(models, exp.device, kwargs.get("freeze_these", ()))
        kwargs.update(amp=exp.extra.get("amp"), grad_scaler=exp.extra.get("grad_scaler"))
    quiet_pml_progress_warning()
    with _without_idle_optimizer_warnings(exp.models):
        return trainer_cls(
            models=models,
            optimizers=exp.optimizers,
            loss_funcs=exp.loss_funcs,
            mining_funcs=exp.mining_funcs,
            dataset=exp.datasets["train"],
            sampler=exp.sampler,
            lr_schedulers=exp.lr_schedulers,
            end_of_iteration_hook=end_of_iteration_hook,
            end_of_epoch_hook=end_of_epoch_hook,
            **kwargs,
        )


# PML's BaseTrainer.train formats its progress bar with "%.5f" % the loss tensor, which requires
# grad: torch warns once per process, about PML's own display line, not about anything a config
# can change. Matched on PML's module and the exact message: the same warning elsewhere still shows.
_PML_PROGRESS_WARNING = r"Converting a tensor with requires_grad=True to a scalar"
_PML_TRAINER_MODULE = r"pytorch_metric_learning\.trainers\.base_trainer"


def quiet_pml_progress_warning() -> None:
    """Ignore torch's ``requires_grad`` UserWarning raised by PML's progress-bar line (idempotent:
    ``warnings.filterwarnings`` replaces an identical filter)."""
    warnings.filterwarnings(
        "ignore", message=_PML_PROGRESS_WARNING, category=UserWarning, module=_PML_TRAINER_MODULE
    )


class _DropMessages(logging.Filter):
    def __init__(self, messages: set[str]):
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.messages


@contextlib.contextmanager
def _without_idle_optimizer_warnings(models: Mapping[str, torch.nn.Module]):
    """PML's trainer logs ``optimizers is missing "<model>_optimizer"`` for every model without
    one; for a model with no trainable parameter (an ``Identity`` embedder) there is nothing to
    optimize, so that line is dropped. A model with parameters and no optimizer still warns."""
    idle = {
        f'optimizers is missing "{key}_optimizer"'
        for key, model in models.items()
        if not any(p.requires_grad for p in model.parameters())
    }
    drop = _DropMessages(idle)
    pml_logger = pml_common.LOGGER  # PML's logger (renamable with c_f.set_logger_name)
    pml_logger.addFilter(drop)
    try:
        yield
    finally:
        pml_logger.removeFilter(drop)
