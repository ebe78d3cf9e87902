"""The figures' shared style: a colour-blind-safe palette, a second cue besides colour, readable
font sizes and a vector copy next to every PNG.

Palette: Okabe & Ito (2008), "Color Universal Design" -- eight colours that stay distinct under
the common forms of colour blindness. Every series also differs by a second cue: a marker per
colour, a line style per implementation (plugin solid, PML dashed) or, in ``differences.png``, a
marker per direction. Font sizes are at least 10 pt, so text is at least 10 pt tall when the PNG
is shown at its natural size (``DPI`` pixels per inch). matplotlib is imported only by the
functions that draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:  # for type hints only: matplotlib is imported lazily (fast CLI start-up)
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky blue": "#56B4E9",
    "bluish green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish purple": "#CC79A7",
}
# Series colours in order of use; yellow (low contrast on white) last.
SERIES_COLORS = [
    OKABE_ITO[c]
    for c in (
        "blue",
        "orange",
        "bluish green",
        "vermillion",
        "reddish purple",
        "sky blue",
        "black",
        "yellow",
    )
]
# Seven markers against eight colours: colour and marker repeat together only after 56 series.
MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
IMPLEMENTATIONS = {"plugin": "-", "PML": "--"}  # method-name prefix -> line style
GREY = "#666666"
# Direction of a paired difference -> colour, marker, legend label.
DIRECTIONS = {
    "better": (OKABE_ITO["blue"], "^", "better: 95% CI above 0"),
    "worse": (OKABE_ITO["vermillion"], "v", "worse: 95% CI below 0"),
    "inconclusive": (GREY, "o", "inconclusive: 95% CI contains 0"),
    "no CI": (OKABE_ITO["black"], "D", "one pair: no CI"),
}
MIN_FONT_PT = 10
FONT_RC = {
    "font.size": 11,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "xtick.labelsize": 10,
    "ytick.labelsize": 10,
    "legend.fontsize": 10,
    "legend.title_fontsize": 10,
    "figure.titlesize": 12,
    "pdf.fonttype": 42,  # TrueType in the PDF: text stays text, editable in a paper's figure
}
DPI = 110
VECTOR_SUFFIX = ".pdf"


def method_family(name: str) -> tuple[str, str | None]:
    """``("FastAP", "plugin")`` for ``"plugin FastAP"``, ``("Triplet + miner", "PML")`` for
    ``"PML Triplet + miner"``; a name without an ``plugin ``/``PML `` prefix is its own family
    with implementation ``None``.

    Args:
        name: a method name of a comparison.

    Returns:
        ``(family, implementation)``.
    """
    for impl in IMPLEMENTATIONS:
        if name.startswith(impl + " ") and name[len(impl) + 1 :].strip():
            return name[len(impl) + 1 :].strip(), impl
    return name, None


def method_styles(names: Iterable[str]) -> dict[str, dict]:
    """One colour and marker per loss family (in order of first appearance), the line style by
    implementation: plugin solid, PML dashed (markers hollow), other names solid.

    Args:
        names: the method names, in the order they are plotted.

    Returns:
        ``{name: {"color", "marker", "linestyle", "markerfacecolor"}}`` -- keyword arguments for
        ``Axes.plot``/``Axes.errorbar``.
    """
    families: list[str] = []
    out = {}
    for name in names:
        family, impl = method_family(name)
        if family not in families:
            families.append(family)
        i = families.index(family)
        color = SERIES_COLORS[i % len(SERIES_COLORS)]
        out[name] = {
            "color": color,
            "marker": MARKERS[i % len(MARKERS)],
            "linestyle": IMPLEMENTATIONS.get(impl, "-"),
            "markerfacecolor": "white" if impl == "PML" else color,
        }
    return out


def direction(d: dict | None) -> str | None:
    """``"better"``/``"worse"`` when the 95% CI of a paired difference (method - reference, a
    higher-is-better metric) excludes 0, ``"inconclusive"`` when it contains 0, ``"no CI"`` for a
    single pair, ``None`` without a difference.

    Args:
        d: a paired-difference record of :func:`.statistics.paired_difference` (or ``None``).

    Returns:
        A key of :data:`DIRECTIONS` or ``None``.
    """
    if not d:
        return None
    if d.get("ci_excludes_zero") is None:
        return "no CI"
    if not d["ci_excludes_zero"]:
        return "inconclusive"
    return "better" if d["mean"] > 0 else "worse"


def new_figure(width: float, height: float, layout: str | None = "constrained") -> "Figure":
    """A pyplot-free figure (no global state to close), by default with constrained layout, so
    legends placed outside the axes keep their room.

    Constrained layout solves the positions at every draw (about 1 s for a 48-axes retrieval
    grid on a loaded 2-core machine); a grid of fixed geometry passes ``layout=None`` and places
    its axes with ``Figure.subplots_adjust`` instead.

    Args:
        width: inches.
        height: inches.
        layout: a matplotlib layout engine name, or ``None`` for none.

    Returns:
        The :class:`matplotlib.figure.Figure`.
    """
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout=layout)


def save_figure(
    fig: "Figure",
    png: Path,
    pdf: bool = True,
    pdf_fonttype: int = 42,
    png_compression: int = 6,
) -> list[Path]:
    """Write ``png`` and, with ``pdf``, its vector copy (same name, ``.pdf``) for papers.

    Costs (one 48-tile retrieval grid, 2 loaded cores): the PNG about 0.5-1 s, mostly drawing;
    the PDF draws once more, and with TrueType fonts (``pdf_fonttype=42``, editable text) spends
    about 0.4 s per font subsetting it with fontTools; Type 3 (``3``) keeps the text searchable
    and costs about half as much.

    Args:
        fig: the figure.
        png: the PNG path.
        pdf: also write the PDF.
        pdf_fonttype: matplotlib's ``pdf.fonttype``: 42 (TrueType) or 3 (Type 3).
        png_compression: zlib level of the PNG, 0-9 (1: a bigger file, written faster).

    Returns:
        ``[png, pdf]``, or ``[png]`` without ``pdf``.
    """
    import matplotlib

    png = Path(png)
    with matplotlib.rc_context(FONT_RC):
        fig.savefig(png, dpi=DPI, pil_kwargs={"compress_level": png_compression})
        if not pdf:
            return [png]
        out = png.with_suffix(VECTOR_SUFFIX)
        # The layout is solved in figure fractions: keep the PNG's instead of solving it again.
        fig.set_layout_engine("none")
        with matplotlib.rc_context({"pdf.fonttype": pdf_fonttype}):
            fig.savefig(out)
    return [png, out]


def label_axes(ax: "Axes", title: str, xlabel: str, ylabel: str) -> None:
    """Title, axis labels, tick labels and grid at the style's sizes (explicit, so that they do
    not depend on the rcParams in force when matplotlib creates the ticks).

    Args:
        ax: a :class:`matplotlib.axes.Axes`.
        title: the axes title.
        xlabel: the x-axis label.
        ylabel: the y-axis label.
    """
    ax.set_title(title, fontsize=FONT_RC["axes.titlesize"])
    ax.set_xlabel(xlabel, fontsize=FONT_RC["axes.labelsize"])
    ax.set_ylabel(ylabel, fontsize=FONT_RC["axes.labelsize"])
    ax.tick_params(labelsize=FONT_RC["xtick.labelsize"])
    ax.grid(alpha=0.3)
