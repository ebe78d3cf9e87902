"""The retrieval grid of :mod:`.retrieval`: query tiles and their top-k, drawn with fixed margins.

Each row is the query (black frame, with its AP) followed by its ``k`` nearest references: rank
and a check mark in a solid blue frame when of the query's class, a cross mark in a dashed
vermillion frame otherwise (colour-blind-safe Okabe-Ito colours, never colour alone); every tile
has its class label (the class name, when the dataset keeps names) underneath. The grid is drawn without a layout engine (fixed margins in
inches, :func:`grid_geometry`); its PNG is written with fast compression and its PDF with Type 3
fonts (:func:`save_pdf`: no TrueType subsetting). O(rows x cols) tiles.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..data.labels import label_names
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
# Fixed margins of a grid, inches: the figure title (two lines) on top, the legend at the bottom,
# each tile's two-line title above it and its class label below it, a gap between columns.
TITLE_IN, LEGEND_IN, TILE_TITLE_IN, TILE_LABEL_IN, SIDE_IN, COL_GAP_IN = (
    0.6,
    0.5,
    0.5,
    0.3,
    0.1,
    0.15,
)


def _image(dataset, pos: int) -> np.ndarray:
    img = dataset[pos][0]
    img = img.detach().float().cpu().numpy() if torch.is_tensor(img) else np.asarray(img, float)
    if img.ndim == 3 and img.shape[0] in (1, 3):
        img = np.moveaxis(img, 0, -1)
    if img.ndim == 3 and img.shape[-1] == 1:
        img = img[..., 0]
    lo, hi = float(img.min()), float(img.max())
    return (img - lo) / (hi - lo) if hi > lo else np.zeros_like(img)


def tile_label(dataset, label: int, width_pt: float = float("inf")) -> str:
    """The text under a tile: the class name when the dataset keeps names
    (:func:`~pml_rank_plugins.data.label_names`), else ``class <id>``. A name wider than
    ``width_pt`` (points, at the tiles' font size) keeps its end after an ellipsis (under
    category folders the class folder ends the name): measured with matplotlib's own text
    metrics, so wide letters shorten it more. O(len(name)) measurements."""
    names = label_names(dataset)[0]
    if names is None or not 0 <= int(label) < len(names):
        return f"class {label}"
    name = str(names[int(label)])
    for start in range(len(name)):
        text = name if start == 0 else "\u2026" + name[start:]
        if _text_width_pt(text) <= width_pt:
            return text
    return "\u2026"


@functools.lru_cache(maxsize=4096)  # a grid measures the same names in many tiles
def _text_width_pt(text: str) -> float:
    """Width in points of ``text`` in the tiles' font (the default family, ``TILE_FONT_PT``)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextToPath

    prop = FontProperties(size=TILE_FONT_PT)
    return TextToPath().get_text_width_height_descent(text, prop, ismath=False)[0]


def grid_geometry(num_rows: int, num_cols: int) -> tuple[float, float, dict]:
    """Figure size (inches) and ``Figure.subplots_adjust`` keywords of a retrieval grid.

    Fixed margins in inches (:data:`TITLE_IN` ...) instead of constrained layout, which solved
    the same positions at every draw (about 1 s per grid on a loaded 2-core machine). Each tile
    gets :data:`TILE_INCHES` of width; each row its tile plus its title and label bands.

    Args:
        num_rows: queries shown.
        num_cols: ``k + 1`` (the query and its top-k).

    Returns:
        ``(width, height, adjust)``.
    """
    width = TILE_INCHES * num_cols
    height = (TILE_INCHES + 0.75) * num_rows + 1.3
    row_gap = TILE_LABEL_IN + TILE_TITLE_IN
    ax_h = height - TITLE_IN - TILE_TITLE_IN - LEGEND_IN - TILE_LABEL_IN - (num_rows - 1) * row_gap
    ax_h /= num_rows
    ax_w = (width - 2 * SIDE_IN - (num_cols - 1) * COL_GAP_IN) / num_cols
    adjust = {
        "left": SIDE_IN / width,
        "right": 1 - SIDE_IN / width,
        "bottom": (LEGEND_IN + TILE_LABEL_IN) / height,
        "top": 1 - (TITLE_IN + TILE_TITLE_IN) / height,
        "wspace": COL_GAP_IN / ax_w,
        "hspace": row_gap / ax_h,
    }
    return width, height, adjust


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
    width, height, adjust = grid_geometry(len(rows), k + 1)
    # a tile's label may span its axis and most of the gap to the next (each label takes half)
    label_pt = 72 * ((width - 2 * SIDE_IN - k * COL_GAP_IN) / (k + 1) + 0.8 * COL_GAP_IN)
    fig = style.new_figure(width, height, layout=None)
    fig.subplots_adjust(**adjust)
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
            ax.set_xlabel(tile_label(ds, lab, label_pt), fontsize=TILE_FONT_PT, labelpad=3)
    handles = [
        Patch(facecolor="none", edgecolor=FRAME[kind][0], linestyle=FRAME[kind][1], linewidth=3)
        for kind in ("query", "correct", "wrong")
    ]
    labels = ["query (AP over its full ranking)", f"{CHECK} same class", f"{CROSS} other class"]
    fig.legend(
        handles,
        labels,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.02 / height),
        ncols=3,
        fontsize=style.MIN_FONT_PT + 1,
        borderaxespad=0.0,
    )
    fig.suptitle(title, fontsize=style.FONT_RC["figure.titlesize"], y=1 - 0.08 / height, va="top")
    return fig


def draw_grid(
    rows: list[dict], query_set, ref_sets, title: str, path: Path, pdf: bool = True
) -> list[Path]:
    """Save :func:`grid_figure` as ``path`` (PNG, zlib level 1: about twice the bytes of level 6,
    written in half the time) and, with ``pdf``, its PDF copy (Type 3 fonts: the text stays
    searchable, without TrueType subsetting's cost; see :func:`.style.save_figure`).

    Args:
        rows: see :func:`grid_figure`.
        query_set: see :func:`grid_figure`.
        ref_sets: see :func:`grid_figure`.
        title: see :func:`grid_figure`.
        path: the PNG path.
        pdf: also write the PDF.

    Returns:
        ``[png, pdf]`` (``[png]`` without ``pdf``).
    """
    fig = grid_figure(rows, query_set, ref_sets, title)
    return style.save_figure(fig, path, pdf=pdf, pdf_fonttype=3, png_compression=1)


def save_pdf(fig: "Figure", path: Path) -> None:
    """The PDF copy of a grid with Type 3 fonts (see :func:`draw_grid`)."""
    import matplotlib

    with matplotlib.rc_context({**style.FONT_RC, "pdf.fonttype": 3}):
        fig.savefig(path)
