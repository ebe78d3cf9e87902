"""Retrieval pictures of a trained run: sampled test queries with their top-K retrieved images.

``retrieval.png``: ``num_queries`` test queries drawn with ``numpy.random.default_rng(seed)`` from
the queries that have at least one same-class reference. The draw depends only on the test
split's labels and the seed, never on the model, so every method of a comparison shows the
**same** queries. Each row is the query (black frame, with its AP) followed by its ``k`` nearest
references: rank and a check mark in a solid blue frame when of the query's class, a cross mark in
a dashed vermillion frame otherwise (colour-blind-safe Okabe-Ito colours, never colour alone);
every tile has its class label underneath.
``worst_queries.png``: the same layout for the ``num_queries`` queries of lowest AP.
Each figure also as PDF (``retrieval.pdf``, ``worst_queries.pdf``) for papers, unless
``pdf=False``.
``retrieval.json``: query positions, retrieved positions and labels, correctness and AP behind
both figures, and the run folder and checkpoint they were computed from. A dataset that keeps
its class names (:class:`~pml_rank_plugins.data.ImageFolderDataset`'s folders) shows them under
the tiles and in the record (``class_name``, ``retrieved_class_names``) instead of bare ids.

Cost per run (the demo's 8 methods, 2 loaded cores; see docs/getting-started.md for numbers):
rebuilding the experiment and embedding the test split once with the run's tester dominates
(the same forward pass as the run's final test; skipped when the run saved those embeddings); each grid is drawn without a layout engine
(fixed margins in inches, :func:`grid_geometry`), its PNG written with fast compression and its
PDF with Type 3 fonts (no TrueType subsetting). ``missing_pictures`` says which outputs are
missing or older than the run's checkpoint, so a resumed comparison draws only those.

Neighbours are ranked by cosine similarity of the embeddings the configured PML tester computes
(``tester.get_all_embeddings``; or the ones the run saved at its final test,
``RUN_DIR/embeddings/<split>.npz``, when they belong to the checkpoint used), the query itself excluded when it is in the reference set. AP of a
query is over its full ranking: ``AP = (1/P) sum_{k: item k relevant} precision@k`` with ``P`` the
number of same-class references (the definition PML's MAP@R truncates at R). O(Q R) memory for Q
queries and R references.
"""

from __future__ import annotations

import contextlib
import functools
import json
import types
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
import tqdm
from pytorch_metric_learning.testers import base_tester

from ..data.labels import label_names
from ..experiment import builder
from ..experiment.datasets import build_splits
from ..experiment.spec import RunSpec
from ..functional.average_precision import ranked_average_precision
from ..running.checkpoints import choose_checkpoint, load_models
from . import style
from .retrieval_grid import (  # noqa: F401 -- re-exported: the grid's public names
    CHECK,
    CROSS,
    FRAME,
    TILE_INCHES,
    draw_grid,
    grid_figure,
    grid_geometry,
    save_pdf,
)

if TYPE_CHECKING:  # type hints only; matplotlib is imported lazily
    pass

FIGURES = ("retrieval", "worst_queries")
JSON_NAME = "retrieval.json"


def choose_queries(labels: Sequence[int], eligible: np.ndarray, num: int, seed: int) -> np.ndarray:
    """Sorted positions of ``num`` queries drawn without replacement among ``eligible`` positions.

    Depends only on ``labels``' length, ``eligible`` and ``seed`` (never on embeddings), so the
    same test split gives the same queries for every method.
    """
    eligible = np.flatnonzero(np.asarray(eligible, dtype=bool))
    if len(eligible) == 0:
        raise ValueError("no query has a same-class reference; nothing to show")
    rng = np.random.default_rng(seed)
    pick = rng.choice(eligible, size=min(num, len(eligible)), replace=False)
    return np.sort(pick)


def _split_entry(spec: RunSpec, datasets: dict) -> tuple[str, list[str]]:
    entries = spec.eval.entries(["test"]) or spec.eval.entries(["validation"])
    pairs = builder.splits_to_eval(entries[:1], datasets) if entries else []
    if not pairs:
        raise ValueError("config has no eval.test (or eval.validation) split to draw queries from")
    return pairs[0]


def saved_embeddings(
    run_dir: Path, split: str, ckpt: Path
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The ``split`` embeddings the run saved at its final test, if they belong to ``ckpt``.

    Reads ``RUN_DIR/embeddings/<split>.npz`` (keys ``embeddings`` (N, D), ``labels`` (N, L),
    ``checkpoint``: the checkpoint file name), as
    :func:`pml_rank_plugins.running.load.save_embeddings` writes it. Used only when its
    ``checkpoint`` is ``ckpt``'s name and the file is not older than ``ckpt``; otherwise (or
    when missing or unreadable) ``None``, and the caller embeds the split again.

    Returns:
        ``(embeddings, labels)`` as tensors, or ``None``.
    """
    path = Path(run_dir) / "embeddings" / f"{split}.npz"
    try:
        if path.stat().st_mtime < ckpt.stat().st_mtime:
            return None
        with np.load(path, allow_pickle=False) as data:
            if str(data["checkpoint"]) != ckpt.name:
                return None
            return torch.from_numpy(data["embeddings"]), torch.from_numpy(data["labels"])
    except (OSError, KeyError, ValueError):  # absent, or not such a file: embed again
        return None


def compute_retrieval(
    run_dir: str | Path,
    device: str | None = None,
    num_queries: int = 8,
    k: int = 5,
    seed: int = 0,
    which: str = "best",
    spec: RunSpec | None = None,
) -> dict:
    """Rebuild ``run_dir``'s experiment, load its ``which`` checkpoint and rank the references.

    ``spec``: the run's spec when the caller holds it (a comparison's job), else
    ``RunSpec.load(run_dir)``. Where the run saved every needed split's embeddings at its final
    test (``saved_embeddings``), only the datasets are built (the models are not: nothing is
    embedded).

    Returns ``{"split", "reference", "queries": [...], "worst": [...]}``; each entry is
    ``{"query": pos, "label", "ap", "retrieved": [pos...], "correct": [bool...]}`` with positions
    into the query split and the concatenated reference splits.
    """
    run_dir = Path(run_dir)
    spec = spec if spec is not None else RunSpec.load(run_dir)
    ckpt = choose_checkpoint(run_dir, which)
    builder.seed_everything(spec.seed)  # as build_experiment does before the splits
    datasets = build_splits(spec, spec.seed)
    qname, refs = _split_entry(spec, datasets)
    saved = {name: saved_embeddings(run_dir, name, ckpt) for name in (qname, *refs)}
    if any(v is None for v in saved.values()):
        exp = builder.build_experiment(spec, device)
        load_models(exp.models, ckpt)
        datasets = exp.datasets
        tester = builder.build_tester(spec, exp.device)
        trunk, embedder = exp.models["trunk"], exp.models.get("embedder", torch.nn.Identity())

    @functools.cache  # a split that is query and reference (test vs test) is embedded once
    def embed(name):
        if saved[name] is not None:
            emb, lab = saved[name]
        else:
            with _quiet_tester_bars():
                emb, lab = tester.get_all_embeddings(datasets[name], trunk, embedder)
        return torch.nn.functional.normalize(emb.float(), dim=1).cpu(), lab[:, 0].cpu().numpy()

    q_emb, q_lab = embed(qname)
    r_parts = [embed(r) for r in refs]
    r_emb = torch.cat([e for e, _ in r_parts])
    r_lab = np.concatenate([lab for _, lab in r_parts])
    sim = q_emb @ r_emb.T
    same_set = refs == [qname]
    if same_set:
        sim.fill_diagonal_(-float("inf"))  # the query is not its own neighbour
    num_ref = sim.shape[1] - int(same_set)
    order = torch.argsort(sim, dim=1, descending=True)[:, :num_ref].numpy()
    relevant = r_lab[order] == q_lab[:, None]
    ap = ranked_average_precision(torch.from_numpy(relevant)).numpy()
    eligible = relevant.any(axis=1)
    chosen = choose_queries(q_lab, eligible, num_queries, seed)
    worst = np.flatnonzero(eligible)[np.argsort(ap[eligible], kind="stable")[:num_queries]]

    names = label_names(datasets[qname])[0]  # ids index the names of the dataset cut (if kept)

    def entry(i):
        out = {
            "query": int(i),
            "label": int(q_lab[i]),
            "ap": float(ap[i]),
            "retrieved": order[i, :k].tolist(),
            "retrieved_labels": r_lab[order[i, :k]].tolist(),
            "correct": relevant[i, :k].tolist(),
        }
        if names is not None:
            out["class_name"] = names[out["label"]]
            out["retrieved_class_names"] = [names[c] for c in out["retrieved_labels"]]
        return out

    return {
        "split": qname,
        "reference": refs,
        "checkpoint": ckpt.name,
        "seed": seed,
        "k": k,
        "queries": [entry(i) for i in chosen],
        "worst": [entry(i) for i in worst],
        "_datasets": (datasets[qname], [datasets[r] for r in refs]),
    }


@contextlib.contextmanager
def _quiet_tester_bars():
    """PML's tester draws a progress bar per embedded split (``tqdm.tqdm(dataloader)`` in
    ``base_tester``) and takes no option to hide it; under the comparison's own ``pictures`` bar
    those would print two extra bars per method. Only ``base_tester``'s name ``tqdm`` is replaced,
    inside this block; a PML without it is left alone."""
    if not hasattr(base_tester, "tqdm"):
        yield
        return
    saved = base_tester.tqdm
    base_tester.tqdm = types.SimpleNamespace(tqdm=functools.partial(tqdm.tqdm, disable=True))
    try:
        yield
    finally:
        base_tester.tqdm = saved


def picture_paths(out_dir: str | Path, pdf: bool = True) -> list[Path]:
    """The files :func:`write_retrieval_pictures` writes into ``out_dir``, in its order:
    ``retrieval.png`` (``.pdf``), ``worst_queries.png`` (``.pdf``), ``retrieval.json``."""
    out_dir = Path(out_dir)
    suffixes = (".png", style.VECTOR_SUFFIX) if pdf else (".png",)
    return [out_dir / f"{name}{suf}" for name in FIGURES for suf in suffixes] + [
        out_dir / JSON_NAME
    ]


def missing_pictures(
    run_dir: str | Path, out_dir: str | Path | None = None, pdf: bool = True, which: str = "best"
) -> list[Path]:
    """The outputs of :func:`write_retrieval_pictures` that are missing or out of date.

    All of them are out of date when ``retrieval.json`` is missing or unreadable, names another
    run folder or checkpoint, or is older than the run's ``which`` checkpoint (the run was
    retrained or continued since); otherwise only the absent files are listed. Reads one JSON
    file and a few ``stat`` calls: no model is built.

    Args:
        run_dir: the run folder the pictures are drawn from.
        out_dir: where they are (default ``run_dir``).
        pdf: whether the PDF copies are expected.
        which: the checkpoint the pictures use (``"best"``).

    Returns:
        The paths to (re)write, in ``picture_paths`` order; ``[]`` when all are up to date.
    """
    run_dir = Path(run_dir)
    paths = picture_paths(out_dir or run_dir, pdf)
    record = paths[-1]
    try:
        ckpt = choose_checkpoint(run_dir, which)
        saved = json.loads(record.read_text())
        fresh = (
            isinstance(saved, dict)
            and saved.get("run_dir") == str(run_dir)
            and saved.get("checkpoint") == ckpt.name
            and record.stat().st_mtime >= ckpt.stat().st_mtime
        )
    except (OSError, ValueError):  # no record / checkpoint, or an unreadable record
        fresh = False
    return [p for p in paths if not fresh or not p.exists()]


def write_retrieval_pictures(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    device: str | None = None,
    num_queries: int = 8,
    k: int = 5,
    seed: int = 0,
    pdf: bool = True,
    only_missing: bool = False,
    spec: RunSpec | None = None,
) -> list[Path]:
    """``retrieval.png``, ``worst_queries.png`` (each with a PDF copy) and ``retrieval.json`` for
    ``run_dir``'s best checkpoint (``spec``: the run's spec when the caller holds it).

    Cost: building the run's experiment and one embedding pass over the test split with the
    run's tester (the same work as the run's final test; most of the time on a CPU), then two
    figures of ``num_queries x (k + 1)`` image tiles (each under a second; the PDF copy adds
    about half of that). With ``only_missing`` nothing is computed when ``missing_pictures``
    finds every output up to date, and only the missing or out-of-date files are written
    otherwise; no file is ever deleted.

    Args:
        run_dir: a finished run folder (``config.yaml``, ``checkpoints/``).
        out_dir: where to write (default ``run_dir``; created if missing).
        device: the device to embed on (default: the config's).
        num_queries: queries per figure.
        k: retrieved references shown per query.
        seed: the query draw's seed.
        pdf: also write the PDF copies.
        only_missing: write only what ``missing_pictures`` lists.

    Returns:
        ``picture_paths``: ``[retrieval.png, retrieval.pdf, worst_queries.png,
        worst_queries.pdf, retrieval.json]`` (without the PDFs when ``pdf`` is false), whether
        written now or found up to date.
    """
    run_dir = Path(run_dir)
    out_dir = Path(out_dir or run_dir)
    paths = picture_paths(out_dir, pdf)
    todo = set(missing_pictures(run_dir, out_dir, pdf) if only_missing else paths)
    if not todo:
        return paths
    spec = spec if spec is not None else RunSpec.load(run_dir)
    res = compute_retrieval(run_dir, device, num_queries, k, seed, spec=spec)
    query_set, ref_sets = res.pop("_datasets")
    out_dir.mkdir(parents=True, exist_ok=True)
    name = spec.get("name", run_dir.name)
    where = f"{res['split']} split, {res['checkpoint']} of {run_dir.name}"
    n_q, n_w = len(res["queries"]), len(res["worst"])
    titles = {
        "retrieval": f"{name}: top-{k} of {n_q} random queries\n(seed {seed}; {where})",
        "worst_queries": f"{name}: top-{k} of the {n_w} queries of lowest AP\n({where})",
    }
    for fig_name, rows in (("retrieval", res["queries"]), ("worst_queries", res["worst"])):
        png = out_dir / f"{fig_name}.png"
        want_pdf = pdf and png.with_suffix(style.VECTOR_SUFFIX) in todo
        if png in todo or want_pdf:
            fig = grid_figure(rows, query_set, ref_sets, titles[fig_name])
            if png in todo:
                style.save_figure(fig, png, pdf=want_pdf, pdf_fonttype=3, png_compression=1)
            else:  # the PDF alone
                save_pdf(fig, png.with_suffix(style.VECTOR_SUFFIX))
    res["run_dir"] = str(run_dir)
    # Written last: a run interrupted while drawing leaves no record, so the next
    # ``only_missing`` call draws everything again.
    paths[-1].write_text(json.dumps(res, indent=2))
    return paths
