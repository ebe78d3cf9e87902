"""The comparison figures: colour-blind-safe styles with a second cue, titles, labels, legends,
readable fonts, direction colours in ``differences.png`` and a PDF next to every PNG."""

from __future__ import annotations

import matplotlib.colors
import matplotlib.text
import pytest

from pml_rank_plugins.reporting import plots, style
from pml_rank_plugins.reporting.summary import summarize
from tests.reporting.synthetic import METHODS, synthetic_results


def _font_sizes(fig) -> list[float]:
    fig.draw_without_rendering()  # creates the tick labels
    return [
        t.get_fontsize()
        for t in fig.findobj(matplotlib.text.Text)
        if t.get_visible() and t.get_text().strip()
    ]


def _check_labelled(fig, names):
    (ax,) = [a for a in fig.axes if a.get_legend() is not None]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == list(names)
    sizes = _font_sizes(fig)
    assert len(sizes) > 10 and min(sizes) >= style.MIN_FONT_PT
    return ax


def _lines_by_label(ax) -> dict:
    """label -> the data line (of a plain line or of an errorbar container)."""
    out = {line.get_label(): line for line in ax.get_lines()}
    out.update({c.get_label(): c.lines[0] for c in ax.containers})
    return out


def test_method_family_strips_the_implementation_prefix():
    assert style.method_family("plugin FastAP") == ("FastAP", "plugin")
    assert style.method_family("PML Triplet + miner") == ("Triplet + miner", "PML")
    assert style.method_family("Contrastive") == ("Contrastive", None)
    assert style.method_family("PML") == ("PML", None)  # a bare prefix is a name of its own
    styles = style.method_styles([f"loss{i}" for i in range(20)])
    cues = {(s["color"], s["marker"]) for s in styles.values()}
    assert len(cues) == 20  # colour and marker never repeat together for 20 families
    assert all(s["color"] in style.SERIES_COLORS for s in styles.values())


def test_validation_figure_one_colour_per_family_plugin_solid_pml_dashed():
    results = synthetic_results()
    fig = plots.validation_figure(results, summarize(results))
    ax = _check_labelled(fig, METHODS)
    lines = _lines_by_label(ax)
    plugin, pml = lines["plugin FastAP"], lines["PML FastAP"]
    assert plugin.get_color() == pml.get_color() and plugin.get_marker() == pml.get_marker()
    assert plugin.get_linestyle() == "-" and pml.get_linestyle() == "--"
    families = ["plugin FastAP", "PML Contrastive", "PML Triplet + miner", "MyLoss"]
    assert len({lines[n].get_color() for n in families}) == 4
    assert len({lines[n].get_marker() for n in families}) == 4
    assert lines["MyLoss"].get_linestyle() == "-"
    assert "plugin solid, PML dashed" in ax.get_legend().get_title().get_text()


def test_bands_and_error_bars_stay_within_0_and_100_percent():
    results = synthetic_results(seeds=2)  # t = 12.7: the raw 95% band runs past 0 and 100%
    run = results["PML FastAP"]["seed1"]
    run["history"][-1]["validation"]["val"]["mean_average_precision_at_r"] = 0.99
    run["test"]["test"]["recall_at_1"] = 0.05
    for fig in (plots.validation_figure(results, summarize(results)), plots.recall_figure(results)):
        low, high = fig.axes[0].get_ylim()
        assert -5 <= low and high <= 105


def test_recall_figure_has_title_labels_legend_and_the_same_styles():
    results = synthetic_results()
    ax = _check_labelled(plots.recall_figure(results), METHODS)
    assert "Recall@K" in ax.get_title()
    lines = _lines_by_label(ax)
    assert lines["plugin FastAP"].get_color() == lines["PML FastAP"].get_color()
    assert lines["PML FastAP"].get_linestyle() == "--"


def _difference(mean, half_width, n=3):
    excludes = None if half_width is None else abs(mean) > half_width
    return {"mean": mean, "ci_half_width": half_width, "ci_excludes_zero": excludes, "n": n}


def test_differences_are_coloured_and_marked_by_direction():
    primary = "mean_average_precision_at_r"
    diffs = {
        "up": _difference(0.05, 0.01),
        "down": _difference(-0.05, 0.01),
        "unsure": _difference(0.01, 0.05),
        "single": _difference(0.02, None, n=1),
    }
    summary = {
        "primary_metric": primary,
        "reference": "ref",
        "differences": {n: {primary: d} for n, d in diffs.items()},
    }
    fig = plots.differences_figure(summary)
    ax = fig.axes[0]
    assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
    # One marker line per row (rows top to bottom in order), coloured by direction.
    by_row = {round(c.lines[0].get_ydata()[0]): c.lines[0] for c in ax.containers}
    assert len(by_row) == 4
    expected = ["better", "worse", "inconclusive", "no CI"]
    for y, kind in zip([3, 2, 1, 0], expected):
        color, marker, _ = style.DIRECTIONS[kind]
        assert matplotlib.colors.same_color(by_row[y].get_color(), color), kind
        assert by_row[y].get_marker() == marker
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [style.DIRECTIONS[k][2] for k in expected]
    assert min(_font_sizes(fig)) >= style.MIN_FONT_PT
    # A worse method is never drawn in the "better" colour (the old figure's green for any *).
    assert not matplotlib.colors.same_color(by_row[2].get_color(), style.DIRECTIONS["better"][0])


def test_no_differences_no_figure():
    assert plots.differences_figure({"differences": {}}) is None


@pytest.mark.parametrize("with_reference", [True, False])
def test_write_plots_writes_a_pdf_next_to_each_png(tmp_path, with_reference):
    results = synthetic_results(seeds=2)
    summary = summarize(results) if with_reference else {}
    paths = plots.write_plots(results, tmp_path, summary)
    pngs = [p for p in paths if p.suffix == ".png"]
    names = {"val_map_at_r.png", "recall_at_k.png"} | (
        {"differences.png"} if with_reference else set()
    )
    assert {p.name for p in pngs} == names
    assert paths == [q for p in pngs for q in (p, p.with_suffix(".pdf"))]
    for p in paths:
        head = p.read_bytes()[:4]
        assert head == (b"%PDF" if p.suffix == ".pdf" else b"\x89PNG")
