"""Retrieval pictures: AP by hand, query choice independent of the model, same queries for every
method of a comparison, figures written, a fixed layout that keeps every text inside and apart,
``--resume`` drawing only missing or out-of-date pictures and never deleting one."""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
from pathlib import Path

import matplotlib.colors
import matplotlib.text
import numpy as np
import pytest
import torch
import tqdm
from matplotlib.backends.backend_agg import FigureCanvasAgg
from pytorch_metric_learning.testers import base_tester

from pml_rank_plugins.data import LabeledSubset
from pml_rank_plugins.functional import ranked_average_precision
from pml_rank_plugins.reporting import compare, retrieval, retrieval_grid, style
from pml_rank_plugins.running.load import embed, load_run, save_embeddings
from tests.tiny import TinyDataset, tiny_config

# the picture tests share one drawn comparison (module fixture :func:`drawn`) and the others one
# comparison without pictures (:func:`undrawn`): one xdist group builds each once per worker
pytestmark = pytest.mark.xdist_group("retrieval_drawn")
FAST = ["trainer.iterations_per_epoch=2", "trainer.num_epochs=1"]


def two_methods() -> dict:
    cfg = tiny_config()
    cfg["methods"] = {
        "Contrastive": None,
        "MultiSimilarity": {"loss_funcs": {"metric_loss": {"MultiSimilarityLoss": {}}}},
    }
    return cfg


def one_method() -> dict:
    cfg = tiny_config()
    cfg["methods"] = {"Contrastive": None}
    return cfg


@pytest.fixture(scope="module")
def drawn(tmp_path_factory) -> tuple[Path, dict, str]:
    """``compare`` of :func:`two_methods` (1 seed) with its pictures drawn: the folder, the summary
    and the ``pml_rank_plugins.reporting.compare`` INFO log lines. Read it, or copy it first
    (:func:`copy_drawn`)."""
    out = tmp_path_factory.mktemp("drawn") / "cmp"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("pml_rank_plugins.reporting.compare")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        summary = compare.run_comparison(two_methods(), out, overrides=FAST)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return out, summary, stream.getvalue()


def copy_drawn(drawn: tuple[Path, dict, str], out: Path) -> Path:
    """A copy of the :func:`drawn` comparison at ``out``, its pictures up to date there: file times
    are kept, and each ``retrieval.json`` names the copied run folder (with its time kept)."""
    shutil.copytree(drawn[0], out)  # copy2: modification times kept
    for record in out.glob("*/retrieval.json"):
        saved = json.loads(record.read_text())
        assert saved["run_dir"] == str(drawn[0] / record.parent.name / "seed0")
        stat = record.stat()
        record.write_text(json.dumps({**saved, "run_dir": str(record.parent / "seed0")}))
        os.utime(record, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return out


@pytest.fixture(scope="module")
def undrawn(tmp_path_factory) -> tuple[Path, dict]:
    """``compare`` of :func:`one_method` with ``pictures=False``: its folder and summary. Read it,
    or copy the folder first."""
    out = tmp_path_factory.mktemp("undrawn") / "cmp"
    return out, compare.run_comparison(one_method(), out, overrides=FAST, pictures=False)


def test_average_precision_by_hand():
    rel = np.array(
        [
            [1, 0, 1, 0],  # (1/1 + 2/3) / 2
            [0, 0, 0, 1],  # (1/4) / 1
            [1, 1, 0, 0],  # (1 + 1) / 2
            [0, 0, 0, 0],  # no positive: NaN, never 0
        ],
        dtype=bool,
    )
    ap = ranked_average_precision(torch.as_tensor(rel)).numpy()
    assert ap[:3] == pytest.approx([(1 + 2 / 3) / 2, 0.25, 1.0])
    assert np.isnan(ap[3])


def test_query_choice_depends_only_on_eligibility_and_seed():
    labels = np.repeat(np.arange(10), 3)
    eligible = np.ones(30, dtype=bool)
    eligible[[0, 5]] = False
    a = retrieval.choose_queries(labels, eligible, 8, seed=0)
    assert np.array_equal(a, retrieval.choose_queries(labels, eligible, 8, seed=0))
    assert len(a) == 8 and np.all(np.diff(a) > 0) and not set(a) & {0, 5}
    assert not np.array_equal(a, retrieval.choose_queries(labels, eligible, 8, seed=1))
    assert len(retrieval.choose_queries(labels, eligible, 100, seed=0)) == 28
    with pytest.raises(ValueError, match="no query has a same-class reference"):
        retrieval.choose_queries(labels, np.zeros(30, dtype=bool), 8, seed=0)


@pytest.mark.slow
def test_every_method_shows_the_same_queries(drawn):
    out, summary, _ = drawn
    records = {}
    for method in ("Contrastive", "MultiSimilarity"):
        for png in ("retrieval.png", "worst_queries.png"):
            assert (out / method / png).stat().st_size > 5000
        records[method] = json.loads((out / method / "retrieval.json").read_text())
        names = ["retrieval.png", "retrieval.pdf", "worst_queries.png", "worst_queries.pdf"]
        assert [p.rsplit("/", 1)[-1] for p in summary["pictures"][method]] == names + [
            "retrieval.json"
        ]
        assert (out / method / "retrieval.pdf").read_bytes()[:4] == b"%PDF"
    a, b = records["Contrastive"], records["MultiSimilarity"]
    assert [q["query"] for q in a["queries"]] == [q["query"] for q in b["queries"]]
    assert len(a["queries"]) == 8 and a["split"] == "test"
    # Retrieved lists and AP come from each method's own embeddings.
    for rec in (a, b):
        for q in rec["queries"] + rec["worst"]:
            assert len(q["retrieved"]) == 5 and q["query"] not in q["retrieved"]
            assert len(q["retrieved_labels"]) == 5
            assert [lab == q["label"] for lab in q["retrieved_labels"]] == q["correct"]
            assert 0.0 < q["ap"] <= 1.0
        worst = [q["ap"] for q in rec["worst"]]
        assert worst == sorted(worst) and worst[0] <= min(q["ap"] for q in rec["queries"])


def test_grid_tiles_carry_rank_mark_class_label_and_a_frame_style_per_kind():
    data = TinyDataset(num_classes=3, per_class=4)
    rows = [
        {
            "query": 0,
            "label": 0,
            "ap": 0.5,
            "retrieved": [1, 5, 2],
            "retrieved_labels": [0, 1, 0],
            "correct": [True, False, True],
        },
        {
            "query": 4,
            "label": 1,
            "ap": 1.0,
            "retrieved": [5],
            "retrieved_labels": [1],
            "correct": [True],
        },
    ]
    fig = retrieval.grid_figure(rows, data, [data], "title\nsecond line")
    axes = np.array(fig.axes).reshape(2, 4)
    assert fig._suptitle.get_text() == "title\nsecond line"
    assert [ax.get_xlabel() for ax in axes[0]] == ["class 0", "class 0", "class 1", "class 0"]
    assert axes[0, 0].get_title() == "query\nAP 0.50"
    assert [ax.get_title() for ax in axes[0, 1:]] == ["#1 \u2713", "#2 \u2717", "#3 \u2713"]
    assert not axes[1, 2].get_visible() or not axes[1, 2].axison  # no tile past k for row 2
    styles = [ax.spines["top"].get_linestyle() for ax in axes[0, 1:3]]
    assert styles[0] != styles[1]  # correct solid, wrong dashed: not colour alone
    colors = [ax.spines["top"].get_edgecolor() for ax in axes[0, 1:3]]
    assert matplotlib.colors.same_color(colors[0], retrieval.FRAME["correct"][0])
    assert matplotlib.colors.same_color(colors[1], retrieval.FRAME["wrong"][0])
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()][1:] == [
        "\u2713 same class",
        "\u2717 other class",
    ]
    fig.draw_without_rendering()
    sizes = [
        t.get_fontsize()
        for t in fig.findobj(matplotlib.text.Text)
        if t.get_visible() and t.get_text().strip()
    ]
    assert min(sizes) >= style.MIN_FONT_PT


def _texts_inside_and_apart(fig) -> None:
    """Every visible text inside the figure; tile titles and labels clear of other rows' texts."""
    FigureCanvasAgg(fig).draw()  # what savefig(png) draws
    renderer = fig.canvas.get_renderer()
    fig_box = fig.bbox
    texts = [
        t
        for t in fig.findobj(matplotlib.text.Text)
        if t.get_visible() and t.get_text().strip() and t.figure is fig
    ]
    boxes = [t.get_window_extent(renderer) for t in texts]
    for t, b in zip(texts, boxes):
        assert fig_box.x0 - 0.5 <= b.x0 and b.x1 <= fig_box.x1 + 0.5, t.get_text()
        assert fig_box.y0 - 0.5 <= b.y0 and b.y1 <= fig_box.y1 + 0.5, t.get_text()
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            assert not boxes[i].overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())


def test_grid_fixed_layout_keeps_every_text_inside_and_apart():
    data = TinyDataset(num_classes=3, per_class=4)
    row = {
        "query": 0,
        "label": 0,
        "ap": 0.5,
        "retrieved": [1, 5, 2, 3, 9],
        "retrieved_labels": [0, 1, 0, 0, 2],
        "correct": [True, False, True, True, False],
    }
    for num_rows in (1, 3, 8):
        fig = retrieval.grid_figure([row] * num_rows, data, [data], "title\nsecond line")
        assert fig.get_layout_engine() is None  # no constrained layout solve per draw
        _texts_inside_and_apart(fig)
        legend_box = fig.legends[0].get_window_extent()
        lowest_tile = min(ax.get_window_extent().y0 for ax in fig.axes)
        assert legend_box.y1 < lowest_tile  # the legend sits below the last row's labels


def test_grid_geometry_gives_every_tile_its_width():
    width, height, adjust = retrieval.grid_geometry(8, 6)
    assert width == pytest.approx(6 * retrieval.TILE_INCHES)
    assert 0 < adjust["left"] < adjust["right"] < 1 and 0 < adjust["bottom"] < adjust["top"] < 1
    tile_w = width * (adjust["right"] - adjust["left"]) / (6 + 5 * adjust["wspace"])
    assert tile_w == pytest.approx(
        (width - 2 * retrieval_grid.SIDE_IN - 5 * retrieval_grid.COL_GAP_IN) / 6
    )


def _mtimes(folder):
    return {p.name: p.stat().st_mtime_ns for p in folder.iterdir() if p.is_file()}


@pytest.mark.slow
def test_resume_draws_only_missing_pictures_and_never_deletes(tmp_path, monkeypatch, caplog, drawn):
    cfg, fast = two_methods(), FAST
    out = copy_drawn(drawn, tmp_path / "cmp")  # drawn: compare.run_comparison(cfg, out, fast)
    folder = out / "Contrastive"
    names = [p.name for p in retrieval.picture_paths(folder)]
    # one progress line per method, naming what it wrote
    assert "pictures of Contrastive: " + ", ".join(names) + " in" in drawn[2]
    assert sorted(names) == sorted(n for n in _mtimes(folder))
    before = _mtimes(folder)
    assert retrieval.missing_pictures(folder / "seed0", folder) == []

    calls = []
    real = retrieval.compute_retrieval
    monkeypatch.setattr(
        retrieval, "compute_retrieval", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    # Everything present and newer than the checkpoint: nothing is built or drawn.
    summary = compare.run_comparison(cfg, out, overrides=fast, resume=True)
    assert calls == [] and _mtimes(folder) == before
    assert [p.rsplit("/", 1)[-1] for p in summary["pictures"]["Contrastive"]] == names
    # One PDF lost: only it (and the record) are written again.
    (folder / "worst_queries.pdf").unlink()
    caplog.clear()
    with caplog.at_level("INFO", logger="pml_rank_plugins.reporting.compare"):
        compare.run_comparison(cfg, out, overrides=fast, resume=True)
    assert calls == [1] and "pictures of Contrastive: worst_queries.pdf in" in caplog.text
    after = _mtimes(folder)
    assert (folder / "worst_queries.pdf").read_bytes()[:4] == b"%PDF"
    unchanged = ["retrieval.png", "retrieval.pdf", "worst_queries.png"]
    assert {n: after[n] for n in unchanged} == {n: before[n] for n in unchanged}
    # pictures=False with resume: no picture is drawn, and none deleted.
    (folder / "retrieval.png").unlink()
    kept = _mtimes(folder)
    summary = compare.run_comparison(cfg, out, overrides=fast, resume=True, pictures=False)
    assert "pictures" not in summary and _mtimes(folder) == kept and calls == [1]


@pytest.mark.slow
def test_pictures_are_out_of_date_when_the_checkpoint_is_newer(tmp_path, drawn):
    out = copy_drawn(drawn, tmp_path / "cmp")  # pictures drawn by compare.run_comparison
    folder, run = out / "Contrastive", out / "Contrastive" / "seed0"
    record = folder / "retrieval.json"
    assert retrieval.missing_pictures(run, folder) == []
    assert retrieval.missing_pictures(run, folder, pdf=False) == []
    ckpt = run / "checkpoints" / "best.pt"
    later = record.stat().st_mtime + 10
    os.utime(ckpt, (later, later))  # the run was retrained after the pictures
    assert retrieval.missing_pictures(run, folder) == retrieval.picture_paths(folder)
    os.utime(ckpt, (later - 20, later - 20))
    saved = json.loads(record.read_text())
    record.write_text(json.dumps({**saved, "run_dir": str(tmp_path / "elsewhere")}))
    assert retrieval.missing_pictures(run, folder) == retrieval.picture_paths(folder)
    record.write_text("{not json")
    assert retrieval.missing_pictures(run, folder) == retrieval.picture_paths(folder)


def test_pictures_false_writes_no_picture(undrawn):
    out, summary = undrawn  # compare.run_comparison(one_method(), out, FAST, pictures=False)
    assert "pictures" not in summary
    assert (out / "Contrastive" / "seed0" / "metrics.json").is_file()  # the run is there
    assert not [p for p in (out / "Contrastive").iterdir() if p.is_file()]


def test_pictures_without_pdf_and_no_tester_bars(tmp_path, capsys, undrawn):
    out = tmp_path / "cmp"
    shutil.copytree(undrawn[0], out)  # compare.run_comparison(..., pictures=False)
    capsys.readouterr()
    run = out / "Contrastive" / "seed0"
    paths = retrieval.write_retrieval_pictures(run, tmp_path / "pics", pdf=False)
    assert [p.name for p in paths] == [
        "retrieval.png",
        "worst_queries.png",
        "retrieval.json",
    ]
    assert sorted(p.name for p in (tmp_path / "pics").iterdir()) == sorted(p.name for p in paths)
    assert "it/s" not in capsys.readouterr().err  # PML's per-split embedding bars are hidden
    assert base_tester.tqdm is tqdm  # and put back


def test_saved_test_embeddings_are_reused_only_for_their_checkpoint(tmp_path, monkeypatch, undrawn):
    out = tmp_path / "cmp"
    shutil.copytree(undrawn[0], out)  # compare.run_comparison(..., pictures=False); changed below
    run = out / "Contrastive" / "seed0"
    assert (run / "embeddings" / "test.npz").exists()  # the run saved its final test's
    shutil.rmtree(run / "embeddings")  # first without them: embedded again
    embedded = retrieval.compute_retrieval(run)
    loaded = load_run(run)
    emb, labels = embed(loaded, "test")
    (run / "embeddings").mkdir()
    saved = run / "embeddings" / "test.npz"
    save_embeddings(saved, emb, labels, split="test", checkpoint=loaded.checkpoint.name)

    calls = []
    real = base_tester.BaseTester.get_all_embeddings
    monkeypatch.setattr(
        base_tester.BaseTester,
        "get_all_embeddings",
        lambda *a, **k: calls.append(1) or real(*a, **k),
    )
    reused = retrieval.compute_retrieval(run)
    assert calls == []  # nothing embedded again
    for key in ("queries", "worst"):
        assert [q["retrieved"] for q in reused[key]] == [q["retrieved"] for q in embedded[key]]
        assert [q["ap"] for q in reused[key]] == pytest.approx([q["ap"] for q in embedded[key]])
    # Embeddings of another checkpoint, or older than the checkpoint: embedded again.
    save_embeddings(saved, emb, labels, split="test", checkpoint="latest.pt")
    retrieval.compute_retrieval(run)
    assert calls == [1]
    save_embeddings(saved, emb, labels, split="test", checkpoint=loaded.checkpoint.name)
    os.utime(saved, (0, 0))
    retrieval.compute_retrieval(run)
    assert calls == [1, 1]


def test_grid_tiles_show_the_class_names_a_dataset_keeps_and_fit_them():
    # issue 50: pictures of one's own folder showed "class 3", not the folder's name
    data = TinyDataset(num_classes=3, per_class=4)
    data.class_names = ["animals/Zebra", "WWWWWWWWWWWWWWWWWWWW", "fruit/Banana split, ripe"]
    subset = LabeledSubset(data, np.arange(12))  # names are found through the subset
    row = {
        "query": 0,
        "label": 0,
        "ap": 0.5,
        "retrieved": [1, 5, 9, 2, 3],
        "retrieved_labels": [0, 1, 2, 0, 0],
        "correct": [True, False, False, True, True],
    }
    fig = retrieval.grid_figure([row, row], subset, [subset], "title\nsecond line")
    labels = [ax.get_xlabel() for ax in np.array(fig.axes).reshape(2, 6)[0]]
    assert labels[:2] == ["animals/Zebra"] * 2 and labels[4:] == ["animals/Zebra"] * 2
    wide, banana = labels[2:4]  # too wide for a tile: their ends after an ellipsis
    assert wide.startswith("\u2026W") and set(wide[1:]) == {"W"} and len(wide) < 20
    assert banana.startswith("\u2026") and "fruit/Banana split, ripe".endswith(banana[1:])
    assert len(banana) > len(wide)  # narrow letters: more of them fit
    _texts_inside_and_apart(fig)  # measured, not counted: every label clears its neighbours
