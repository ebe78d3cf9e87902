"""Retrieval pictures of a trained run: sampled test queries with their top-K retrieved images.

``retrieval.png``: ``num_queries`` test queries drawn with ``numpy.random.default_rng(seed)`` from
the queries that have at least one same-class reference. The draw depends only on the test
split's labels and the seed, never on the model, so every method of a comparison shows the
**same** queries. Each row is the query (black frame, with its AP) followed by its ``k`` nearest
references: rank and a check mark in a solid blue frame when of the query's class, a cross mark in
a dashed vermillion frame otherwise (colour-blind-safe Okabe-Ito colours, never colour alone);
every tile has its class label underneath.
``worst_queries.png``: the same layout for the ``num_queries`` queries of lowest AP.
Each figure also as PDF (``retrieval.pdf``, ``worst_queries.pdf``) for papers.
``retrieval.json``: query positions, retrieved positions and labels, correctness and AP behind
both figures.

Neighbours are ranked by cosine similarity of the embeddings the configured PML tester computes
(``tester.get_all_embeddings``), the query itself excluded when it is in the reference set. AP of a
query is over its full ranking: ``AP = (1/P) sum_{k: item k relevant} precision@k`` with ``P`` the
number of same-class references (the definition PML's MAP@R truncates at R). O(Q R) memory for Q
queries and R references.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from ..experiment import builder
from ..experiment.schema import load_yaml
from ..functional.average_precision import ranked_average_precision
from ..running.checkpoints import choose_checkpoint, load_models
from . import style

if TYPE_CHECKING:  # type hints only; matplotlib is imported lazily
    from matplotlib.figure import Figure

# Frame colour (Okabe-Ito) and line style per tile kind: colour is never the only cue -- the
# frame's style and a check/cross mark (DejaVu Sans has both glyphs) tell the same.
FRAME = {
    "query": (style.OKABE_ITO["black"], "solid"),
    "correct": (style.OKABE_ITO["blue"], "solid"),
    "wrong": (style.OKABE_ITO["vermillion"], "dashed"),
}
CHECK, CROSS = "\u2713", "\u2717"
TILE_INCHES = 1.45
TILE_FONT_PT = 11


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


def _split_entry(config: dict, datasets: dict) -> tuple[str, list[str]]:
    ev = builder.eval_settings(config)
    entries = list(ev["test"] or []) or list(ev["validation"] or [])
    pairs = builder.splits_to_eval(entries[:1], datasets) if entries else []
    if not pairs:
        raise ValueError("config has no eval.test (or eval.validation) split to draw queries from")
    return pairs[0]


def compute_retrieval(
    run_dir: str | Path,
    device: str | None = None,
    num_queries: int = 8,
    k: int = 5,
    seed: int = 0,
    which: str = "best",
) -> dict:
    """Rebuild ``run_dir``'s experiment, load its ``which`` checkpoint and rank the references.

    Returns ``{"split", "reference", "queries": [...], "worst": [...]}``; each entry is
    ``{"query": pos, "label", "ap", "retrieved": [pos...], "correct": [bool...]}`` with positions
    into the query split and the concatenated reference splits.
    """
    run_dir = Path(run_dir)
    config = load_yaml(run_dir / "config.yaml")
    exp = builder.build_experiment(config, device)
    ckpt = choose_checkpoint(run_dir, which)
    load_models(exp.models, ckpt)
    qname, refs = _split_entry(config, exp.datasets)
    tester = builder.build_tester(config, exp.device)
    trunk, embedder = exp.models["trunk"], exp.models.get("embedder", torch.nn.Identity())

    def embed(name):
        emb, lab = tester.get_all_embeddings(exp.datasets[name], trunk, embedder)
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

    def entry(i):
        return {
            "query": int(i),
            "label": int(q_lab[i]),
            "ap": float(ap[i]),
            "retrieved": order[i, :k].tolist(),
            "retrieved_labels": r_lab[order[i, :k]].tolist(),
            "correct": relevant[i, :k].tolist(),
        }

    return {
        "split": qname,
        "reference": refs,
        "checkpoint": ckpt.name,
        "seed": seed,
        "k": k,
        "queries": [entry(i) for i in chosen],
        "worst": [entry(i) for i in worst],
        "_datasets": (exp.datasets[qname], [exp.datasets[r] for r in refs]),
    }


def _image(dataset, pos: int) -> np.ndarray:
    img = dataset[pos][0]
    img = img.detach().float().cpu().numpy() if torch.is_tensor(img) else np.asarray(img, float)
    if img.ndim == 3 and img.shape[0] in (1, 3):
        img = np.moveaxis(img, 0, -1)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    lo, hi = float(img.min()), float(img.max())
    return (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)


def grid_figure(rows: list[dict], query_set, ref_sets, title: str) -> "Figure":
    """One row per query: the query (black frame, AP) and its top-k, each tile with its rank, a
    check or cross mark (blue solid frame: same class; vermillion dashed frame: other class) and
    its class label underneath.

    Args:
        rows: entries of :func:`compute_retrieval` (``query``, ``label``, ``ap``, ``retrieved``,
            ``retrieved_labels``, ``correct``).
        query_set: the dataset ``query`` positions index.
        ref_sets: the reference datasets, concatenated in this order for ``retrieved``.
        title: the figure title (may hold a newline).

    Returns:
        The figure: ``len(rows)`` x ``k + 1`` image axes and a legend of the frame cues.
    """
    from matplotlib.patches import Patch

    ref_index = []
    for ds in ref_sets:
        ref_index += [(ds, i) for i in range(len(ds))]
    k = max(len(r["retrieved"]) for r in rows)
    fig = style.new_figure(TILE_INCHES * (k + 1), (TILE_INCHES + 0.75) * len(rows) + 1.3)
    axes = fig.subplots(len(rows), k + 1, squeeze=False)
    for r, row in enumerate(rows):
        cells = [(query_set, row["query"], "query", f"query\nAP {row['ap']:.2f}", row["label"])]
        for j, (pos, ok, lab) in enumerate(
            zip(row["retrieved"], row["correct"], row["retrieved_labels"])
        ):
            ds, i = ref_index[pos]
            mark = CHECK if ok else CROSS
            cells.append((ds, i, "correct" if ok else "wrong", f"#{j + 1} {mark}", lab))
        for c, ax in enumerate(axes[r]):
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(cells):
                ax.axis("off")
                continue
            ds, i, kind, top, lab = cells[c]
            color, linestyle = FRAME[kind]
            img = _image(ds, i)
            ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1)
            for spine in ax.spines.values():
                spine.set_edgecolor(color)
                spine.set_linestyle(linestyle)
                spine.set_linewidth(4)
            ax.set_title(top, fontsize=TILE_FONT_PT, color=color, fontweight="bold", pad=3)
            ax.set_xlabel(f"class {lab}", fontsize=TILE_FONT_PT, labelpad=3)
    handles = [
        Patch(facecolor="none", edgecolor=FRAME[kind][0], linestyle=FRAME[kind][1], linewidth=3)
        for kind in ("query", "correct", "wrong")
    ]
    labels = ["query (AP over its full ranking)", f"{CHECK} same class", f"{CROSS} other class"]
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=style.MIN_FONT_PT + 1)
    fig.suptitle(title, fontsize=style.FONT_RC["figure.titlesize"])
    return fig


def draw_grid(rows: list[dict], query_set, ref_sets, title: str, path: Path) -> list[Path]:
    """Save :func:`grid_figure` as ``path`` (PNG) and its PDF copy.

    Args:
        rows: see :func:`grid_figure`.
        query_set: see :func:`grid_figure`.
        ref_sets: see :func:`grid_figure`.
        title: see :func:`grid_figure`.
        path: the PNG path.

    Returns:
        ``[png, pdf]``.
    """
    return style.save_figure(grid_figure(rows, query_set, ref_sets, title), path)


def write_retrieval_pictures(
    run_dir: str | Path,
    out_dir: str | Path | None = None,
    device: str | None = None,
    num_queries: int = 8,
    k: int = 5,
    seed: int = 0,
) -> list[Path]:
    """``retrieval.png``, ``worst_queries.png`` (each with a PDF copy) and ``retrieval.json`` for
    ``run_dir``'s best checkpoint.

    Args:
        run_dir: a finished run folder (``config.yaml``, ``checkpoints/``).
        out_dir: where to write (default ``run_dir``).
        device: the device to embed on (default: the config's).
        num_queries: queries per figure.
        k: retrieved references shown per query.
        seed: the query draw's seed.

    Returns:
        ``[retrieval.png, retrieval.pdf, worst_queries.png, worst_queries.pdf, retrieval.json]``.
    """
    run_dir = Path(run_dir)
    out_dir = Path(out_dir or run_dir)
    res = compute_retrieval(run_dir, device, num_queries, k, seed)
    query_set, ref_sets = res.pop("_datasets")
    name = load_yaml(run_dir / "config.yaml").get("name", run_dir.name)
    where = f"{res['split']} split, {res['checkpoint']} of {run_dir.name}"
    n_q, n_w = len(res["queries"]), len(res["worst"])
    paths = draw_grid(
        res["queries"],
        query_set,
        ref_sets,
        f"{name}: top-{k} of {n_q} random queries\n(seed {seed}; {where})",
        out_dir / "retrieval.png",
    )
    paths += draw_grid(
        res["worst"],
        query_set,
        ref_sets,
        f"{name}: top-{k} of the {n_w} queries of lowest AP\n({where})",
        out_dir / "worst_queries.png",
    )
    res["run_dir"] = str(run_dir)
    paths.append(out_dir / "retrieval.json")
    paths[-1].write_text(json.dumps(res, indent=2))
    return paths
