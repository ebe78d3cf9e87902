"""The ``eval.revisited`` test sets.

**Revisited Oxford / Paris** (Radenovic et al., CVPR 2018) as test sets::

    eval:
      revisited:
        - dataset: {RevisitedOxfordParis: {root: revisitop, name: roxford5k}}
          batch_size: 1        # optional: full-size images differ in size
          ks: [1, 5, 10]       # optional: mP@k

Each entry builds the reader's ``query`` and ``database`` splits (``split`` is injected, and the
``transforms.eval`` list unless the entry gives ``transform: [...]``), embeds both with the
trained trunk + embedder, and adds ``test[<name>]`` with ``map_easy``, ``map_medium``,
``map_hard``, ``mp_at_<k>_<protocol>`` and ``num_queries_<protocol>``
(:func:`pml_rank_plugins.functional.revisited_evaluate`).

This module reads the entries and builds their datasets; the embedding and scoring run in
:func:`pml_rank_plugins.running.evaluate.revisited_eval`.
"""

from __future__ import annotations

from typing import Any

from .datasets import build_dataset
from .instantiate import build_object
from .schema import ConfigError, spec_name_and_kwargs
from .transforms import NamedCompose, build_transforms
from .values import MAX_BATCH, integer


def revisited_entries(config: dict) -> list[dict]:
    """The ``eval.revisited`` list, checked, with defaults (``name`` from the dataset's
    ``name`` keyword, ``ks`` (1, 5, 10), ``batch_size`` None = the tester's)."""
    entries = (config.get("eval") or {}).get("revisited") or []
    if not isinstance(entries, list):
        raise ConfigError("eval.revisited: expected a list of {dataset: {...}} entries")
    out = []
    allowed = {"dataset", "name", "ks", "batch_size", "transform"}
    for i, e in enumerate(entries):
        where = f"eval.revisited[{i}]"
        if not isinstance(e, dict) or "dataset" not in e:
            raise ConfigError(f"{where}: expected {{dataset: {{RevisitedOxfordParis: {{...}}}}}}")
        bad = set(e) - allowed
        if bad:
            raise ConfigError(f"{where}: unknown key(s) {sorted(bad)}; allowed {sorted(allowed)}")
        ds_name, kwargs = spec_name_and_kwargs(e["dataset"], f"{where}.dataset")
        if "split" in kwargs:
            raise ConfigError(
                f"{where}.dataset.{ds_name}.split: leave it out (query and database are built)"
            )
        ks = e.get("ks", [1, 5, 10])
        if not isinstance(ks, (list, tuple)) or not ks:
            raise ConfigError(f"{where}.ks: expected a non-empty list of integers, got {ks!r}")
        ks = tuple(integer(k, f"{where}.ks[{j}]", 1) for j, k in enumerate(ks))
        if e.get("batch_size") is not None:
            integer(e["batch_size"], f"{where}.batch_size", 1, MAX_BATCH)
        out.append(
            {
                "where": where,
                "dataset": e["dataset"],
                "name": str(e.get("name") or kwargs.get("name") or ds_name),
                "ks": ks,
                "batch_size": e.get("batch_size"),
                "transform": e.get("transform"),
            }
        )
    return out


def build_revisited(config: dict, entry: dict) -> tuple[Any, Any]:
    """The (query, database) datasets of one ``eval.revisited`` entry."""
    where = entry["where"]
    if entry["transform"] is not None:
        transform = NamedCompose(
            [build_object(t, f"{where}.transform[{i}]") for i, t in enumerate(entry["transform"])],
            f"{where}.transform",
        )
    else:
        transform = (build_transforms(config) or {}).get("eval")
    name, kwargs = spec_name_and_kwargs(entry["dataset"], f"{where}.dataset")
    out = []
    for split in ("query", "database"):
        spec = {name: {**kwargs, "split": split}}
        out.append(build_dataset(config, spec, f"{where}.dataset", transform))
    return out[0], out[1]
