"""Build the PML objects of one experiment from a validated config.

Everything is resolved through :mod:`pml_rank_plugins.config.registry`, so the builder does not
care which dataset, model, loss or sampler class a config names. What the builder injects:

* samplers get ``labels`` (the (N, 2) array for our samplers, the class column for PML's) and the
  trainer's ``batch_size`` and the run ``seed`` when their signature has them and the config
  does not set them;
* optimizers ``<name>_optimizer`` get the parameters of ``models[<name>]`` or
  ``loss_funcs[<name>]`` (skipped, with a log line, when that object has no parameters);
* lr schedulers ``<name>_scheduler_by_{iteration,epoch,plateau}`` get ``optimizers[<name>_optimizer]``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..trainers import distributed as scaled
from . import registry
from .evaluation import DEFAULT_METRICS, make_accuracy_calculator, make_tester
from .schema import ConfigError, is_object_spec, spec_name_and_kwargs
from .splits import labeled_subset, query_gallery_split
from .transforms import collate_for

LOGGER = logging.getLogger(__name__)
SCHEDULER_SUFFIXES = ("_scheduler_by_iteration", "_scheduler_by_epoch", "_scheduler_by_plateau")


def instantiate(value: Any, where: str = "config", **injected) -> Any:
    """Recursively turn object specs inside ``value`` into objects.

    ``injected`` keywords are added to the outermost call when its signature accepts them and
    the config does not already set them.
    """
    if is_object_spec(value):
        return build_object(value, where, **injected)
    if isinstance(value, dict):
        return {k: instantiate(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [instantiate(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def build_object(spec: Any, where: str, **injected) -> Any:
    """Instantiate one ``{Name: kwargs}`` spec (a bare ``"Name"`` means no kwargs)."""
    name, kwargs = spec_name_and_kwargs(spec, where)
    obj = registry.resolve(name)
    kwargs = {k: instantiate(v, f"{where}.{name}.{k}") for k, v in kwargs.items()}
    registry.check_keywords(obj, kwargs, where)
    accepted = registry.accepted_keywords(obj)
    for k, v in injected.items():
        if k not in kwargs and (accepted is None or k in accepted):
            if accepted is None and k not in _named_params(obj):
                continue
            kwargs[k] = v
    return call_named(where, name, obj, **kwargs)


def call_named(where: str, name: str, fn, *args, **kwargs) -> Any:
    """``fn(*args, **kwargs)``; an exception is re-raised with ``where: name:`` in front, so every
    error while building an object names its config key (``optimizers.trunk_optimizer: Adam:
    ...``). The type is kept where it takes a message (so callers can still catch it), else
    :class:`ConfigError`; a ``TypeError`` also shows the signature."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        prefix = f"{where}: {name}: "
        if str(e).startswith(prefix):
            raise
        if isinstance(e, TypeError):
            msg = f"{prefix}{e}; signature: {registry.signature_text(fn)}"
            raise TypeError(msg) from e
        raise _renamed(e, prefix) from e


def _renamed(e: Exception, prefix: str) -> Exception:
    if type(e) in (Exception, RuntimeError, KeyError, AssertionError):
        return ConfigError(f"{prefix}{type(e).__name__}: {e}")
    try:
        return type(e)(f"{prefix}{e}")
    except Exception:  # an exception class whose constructor wants more than a message
        return ConfigError(f"{prefix}{type(e).__name__}: {e}")


def _named_params(obj) -> set[str]:
    try:
        return {p.name for p in registry._init_params(obj)}
    except (TypeError, ValueError):
        return set()


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------- data


def build_splits(config: dict, seed: int) -> dict[str, torch.utils.data.Dataset]:
    """Datasets -> ``{split name: dataset}``.

    Either one ``dataset`` cut by ``split:`` (``split: {<split function>: {...}, names: [train,
    val, test], query_gallery: {test: [query, gallery], fraction: 0.5}}``; without ``split`` the
    whole dataset is ``train``), or ``datasets: {split name: dataset spec}`` taking each split
    from a reader's published split (``CUB200(split=test)``, In-Shop ``query``/``gallery``, ...).
    ``split: {mlrc_protocol: {...}, fold: k}`` gives fold k of the MLRC protocol (see
    :mod:`.protocols`). ``transforms.train`` feeds the ``train`` split, ``transforms.eval`` the
    others; relative dataset paths are resolved against ``data_root``.
    """
    from . import protocols
    from .transforms import build_transforms

    transforms = build_transforms(config) or {}
    if "datasets" in config and "dataset" in config:
        raise ConfigError("give either 'dataset' (with 'split') or 'datasets', not both")
    split = dict(config.get("split") or {})
    if protocols.is_mlrc(config):
        return protocols.mlrc_fold_splits(config, transforms)
    if "datasets" in config:
        if split:
            raise ConfigError(
                "split: with 'datasets' every split is given already; 'split' only takes "
                "{mlrc_protocol: {...}} there (folds over datasets.trainval)"
            )
        specs = config["datasets"]
        if not isinstance(specs, dict) or not specs:
            raise ConfigError("datasets: expected {split name: {DatasetClass: {kwargs}}}")
        return {
            name: build_dataset(config, spec, f"datasets.{name}", transforms.get(_kind(name)))
            for name, spec in specs.items()
        }
    dataset = build_dataset(config, config["dataset"], "dataset", transforms.get("eval"))
    train_dataset = dataset
    if transforms:
        train_dataset = build_dataset(config, config["dataset"], "dataset", transforms["train"])
        if not np.array_equal(np.asarray(train_dataset.labels), np.asarray(dataset.labels)):
            raise ConfigError("dataset: two builds gave different labels (must be deterministic)")
    names = list(split.pop("names", ["train", "test"]))
    qg = dict(split.pop("query_gallery", None) or {})
    split.pop("fold", None)
    if not split:
        return {"train": train_dataset}
    fn_name, fn_kwargs = spec_name_and_kwargs(split, "split")
    fn = registry.resolve(fn_name)
    parts = call_named(
        "split", fn_name, fn, np.asarray(dataset.labels), **instantiate(fn_kwargs, "split")
    )
    protocols.check_split_parts(fn_name, parts, names)

    def subset(name, idx):
        return labeled_subset(train_dataset if name == "train" else dataset, idx)

    out = {n: subset(n, idx) for n, idx in zip(names, parts, strict=True)}
    fraction = float(qg.pop("fraction", 0.5))
    qg_seed = int(qg.pop("seed", 0))
    for source, (qname, gname) in qg.items():
        if source not in out:
            raise ConfigError(f"split.query_gallery: no split named {source!r} in {names}")
        base = out.pop(source)
        base_idx = np.asarray(base.indices)
        q, g = query_gallery_split(base.labels, fraction, qg_seed)
        out[qname] = subset(qname, base_idx[q])
        out[gname] = subset(gname, base_idx[g])
    return out


def _kind(split_name: str) -> str:
    return "train" if split_name == "train" else "eval"


def build_dataset(config: dict, spec: Any, where: str, transform=None):
    """One dataset from its spec: paths resolved against ``data_root`` (missing folder: a
    :class:`ConfigError` naming the key and the published archive), ``transform`` injected."""
    from .data_root import resolve_dataset_spec

    spec = resolve_dataset_spec(spec, where, config.get("data_root"))
    name, kwargs = spec_name_and_kwargs(spec, where)
    if transform is not None and kwargs.get("transform") is not None:
        raise ConfigError(
            f"{where}.{name}.transform: set either this or the top-level 'transforms', not both"
        )
    injected = {"transform": transform} if transform is not None else {}
    dataset = build_object(spec, where, **injected)
    if not hasattr(dataset, "labels"):
        raise ConfigError(f"{where}: the dataset must expose .labels, the (N, 2) label array")
    return dataset


def build_sampler(config: dict, train_set, batch_size: int, seed: int):
    spec = config.get("sampler")
    if not spec:
        return None
    name, _ = spec_name_and_kwargs(spec, "sampler")
    cls = registry.resolve(name)
    labels = np.asarray(train_set.labels)
    if getattr(cls, "__module__", "").startswith("pytorch_metric_learning"):
        labels = labels[:, 0]  # PML samplers take 1-D class labels
    return build_object(spec, "sampler", labels=labels, batch_size=batch_size, seed=seed)


# --------------------------------------------------------------------------- models & optim


def build_models(config: dict, device: torch.device) -> dict[str, torch.nn.Module]:
    from .data_root import resolve_weights

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
        cls = registry.resolve(name)
        kwargs = instantiate(kwargs, f"optimizers.{key}.{name}")
        registry.check_keywords(cls, {"params": None, **kwargs}, f"optimizers.{key}")
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
        cls = registry.resolve(name)
        kwargs = instantiate(kwargs, f"lr_schedulers.{key}.{name}")
        out[key] = call_named(f"lr_schedulers.{key}", name, cls, optimizers[opt_key], **kwargs)
    return out


# --------------------------------------------------------------------------- evaluation


def eval_settings(config: dict) -> dict:
    """The ``eval:`` section with defaults filled in.

    ``validation``/``test`` are lists of split entries: a split name (query = reference = that
    split) or ``{query: name, reference: [names]}`` (query/gallery retrieval).
    """
    ev = dict(config.get("eval") or {})
    ev.setdefault("metrics", list(DEFAULT_METRICS))
    ev.setdefault("recall_at_k", [1, 2, 4, 8])
    ev.setdefault("k", "max_bin_count")
    ev.setdefault("primary_metric", "mean_average_precision_at_r")
    ev.setdefault("test_interval", 1)
    ev.setdefault("patience", None)
    ev.setdefault("validation", ["val"])
    ev.setdefault("test", [])
    return ev


def splits_to_eval(entries: list, available: dict) -> list[tuple[str, list[str]]]:
    """Config split entries -> PML's ``splits_to_eval`` list of (query, [references])."""
    out = []
    for e in entries or []:
        if isinstance(e, str):
            q, refs = e, [e]
        elif isinstance(e, dict) and "query" in e:
            q = e["query"]
            refs = e.get("reference", [q])
            refs = [refs] if isinstance(refs, str) else list(refs)
        else:
            raise ConfigError(f"eval: split entry {e!r}: a name or {{query: q, reference: [r]}}")
        for s in [q, *refs]:
            if s not in available:
                raise ConfigError(f"eval: split {s!r} does not exist (have {sorted(available)})")
        out.append((q, refs))
    return out


def build_tester(config: dict, device: torch.device, end_of_testing_hook=None):
    """The configured PML tester; its calculator is ours (Recall@K, faiss or ``CustomKNN``)
    unless the tester spec names an ``accuracy_calculator`` itself."""
    ev = eval_settings(config)
    tester_spec = ev.get("tester") or {"GlobalEmbeddingSpaceTester": {}}
    name, kwargs = spec_name_and_kwargs(tester_spec, "eval.tester")
    cls = registry.resolve(name)
    kwargs = instantiate(kwargs, f"eval.tester.{name}")
    registry.check_keywords(cls, kwargs, "eval.tester")
    calc = kwargs.pop("accuracy_calculator", None) or make_accuracy_calculator(
        metrics=ev["metrics"], recall_at_k=ev["recall_at_k"], k=ev["k"], device=device
    )
    primary = ev["primary_metric"]
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


def build_experiment(config: dict, device: torch.device | str | None = None) -> Experiment:
    """Seed, then build data, models, losses, miners, optimizers, schedulers and the sampler."""
    device = torch.device(device or config.get("device") or "cpu")
    seed = int(config.get("seed", 0))
    seed_everything(seed)
    datasets = build_splits(config, seed)
    if "train" not in datasets:
        raise ConfigError(f"split: one split must be named 'train' (have {sorted(datasets)})")
    tname, tkwargs = spec_name_and_kwargs(config["trainer"], "trainer")
    trainer_cls = registry.resolve(tname)
    tkwargs = instantiate(dict(tkwargs), f"trainer.{tname}")
    num_epochs = int(tkwargs.pop("num_epochs", 1))
    if num_epochs < 1:
        raise ConfigError(f"trainer: num_epochs must be >= 1, got {num_epochs}")
    amp = tkwargs.pop("amp", None)
    try:
        scaled.parse_amp(amp)
    except ValueError as e:
        raise ConfigError(f"trainer.{tname}.{e}") from None
    registry.check_keywords(trainer_cls, tkwargs, "trainer")
    if "batch_size" not in tkwargs:
        raise ConfigError("trainer: batch_size is required")
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
        extra={"amp": amp, "grad_scaler": scaled.make_grad_scaler(amp, device)},
    )


def make_trainer(exp: Experiment, end_of_iteration_hook=None, end_of_epoch_hook=None):
    """The configured PML trainer; single-process data loading by default (reproducible)."""
    kwargs = dict(exp.trainer_kwargs)
    kwargs.setdefault("dataloader_num_workers", 0)
    kwargs.setdefault("data_device", exp.device)
    if "label_hierarchy_level" in _named_params(exp.trainer_cls):
        kwargs.setdefault("label_hierarchy_level", 0)
    trainer_cls, models = exp.trainer_cls, exp.models
    if exp.extra.get("amp") is not None or scaled.world_size() > 1:
        # global-batch data parallelism + autocast; exp.models stay unwrapped (checkpoints, eval)
        trainer_cls = scaled.distributed_trainer_class(trainer_cls)
        models = scaled.wrap_ddp(models, exp.device, kwargs.get("freeze_these", ()))
        kwargs.update(amp=exp.extra.get("amp"), grad_scaler=exp.extra.get("grad_scaler"))
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
