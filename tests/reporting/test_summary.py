"""``summarize_dir``: the tables recomputed from run folders alone carry the same Holm, TOST and
MDD columns as ``summarize`` with the saved config's margin; a bad margin on the command line is
exit 2 naming the key before anything trains."""

from __future__ import annotations

import json

import pytest

from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment.schema import dump_yaml
from pml_rank_plugins.reporting.summary import (
    add_command,
    read_commands,
    summarize,
    summarize_dir,
)
from pml_rank_plugins.reporting.tables import markdown_table
from tests.tiny import tiny_config

MAPR = "mean_average_precision_at_r"
VALUES = {
    "ref": [0.50, 0.52, 0.49, 0.51, 0.53, 0.50],
    "close": [0.501, 0.519, 0.492, 0.509, 0.531, 0.502],
    "better": [0.53, 0.55, 0.50, 0.55, 0.56, 0.52],
}


def _write_runs(out, margin) -> dict:
    """``OUT/<name>/seed<i>/{config.yaml, metrics.json}`` as ``compare`` leaves them."""
    results = {}
    for name, vals in VALUES.items():
        results[name] = {}
        for i, v in enumerate(vals):
            cfg = tiny_config(name=name, seed=i)
            if margin is not None:
                cfg["compare"] = {"equivalence_margin": margin}
            m = {"name": name, "status": "finished", "test": {"test": {MAPR: v}}}
            m["wall_seconds"] = 1.0
            run = out / name / f"seed{i}"
            run.mkdir(parents=True)
            dump_yaml(cfg, run / "config.yaml")
            (run / "metrics.json").write_text(json.dumps(m))
            results[name][f"seed{i}"] = m
    return results


@pytest.mark.parametrize("margin", [None, 0.5])
def test_summarize_dir_reads_the_margin_from_the_saved_config(tmp_path, margin, png_plots_only):
    results = _write_runs(tmp_path, margin)
    again = summarize_dir(tmp_path, reference="ref")
    ordered = {n: results[n] for n in sorted(results)}  # run folders without summary.json
    direct = summarize(ordered, reference="ref", margin=margin)
    assert again["equivalence_margin"] == margin
    assert again["differences"] == direct["differences"]
    md = (tmp_path / "comparison.md").read_text()
    direct["seeds"] = again["seeds"]
    assert md == markdown_table(direct)
    assert json.loads((tmp_path / "summary.json").read_text())["equivalence_margin"] == margin
    verdicts = {n: again["differences"][n][MAPR]["verdict"] for n in ("close", "better")}
    assert verdicts["better"] == "higher"
    if margin is None:
        assert verdicts["close"].startswith("inconclusive (MDD ") and "TOST" not in md
    else:
        assert verdicts["close"] == "equivalent within ±0.5" and "TOST ±0.5 Holm" in md


@pytest.mark.parametrize("bad", ["0", "-1", "abc", "true", ".inf"])
def test_a_bad_margin_on_the_command_line_is_exit_2_naming_the_key(tmp_path, capsys, bad):
    path = tmp_path / "c.yaml"
    dump_yaml(tiny_config(), path)
    out = tmp_path / "cmp"
    args = ["compare", str(path), "--out", str(out), "--set", f"compare.equivalence_margin={bad}"]
    assert main(args) == 2
    assert "compare.equivalence_margin" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())  # nothing trained


def test_summarize_dir_keeps_the_commands_record(tmp_path, png_plots_only):
    _write_runs(tmp_path, None)
    first = summarize_dir(tmp_path, reference="ref")
    record = {"total_wall_seconds": 4984.5, "jobs": 2, "tuned_from": "runs/t", "pictures": {}}
    (tmp_path / "summary.json").write_text(json.dumps({**first, **record}))
    again = summarize_dir(tmp_path, reference="better")  # the statistics change, the record not
    saved = json.loads((tmp_path / "summary.json").read_text())
    for key, value in record.items():
        assert again[key] == saved[key] == value
    assert saved["reference"] == "better" and set(saved["differences"]) == {"ref", "close"}


def test_read_commands_of_every_kind_of_previous_summary(tmp_path):
    path = tmp_path / "summary.json"
    assert read_commands(path) == []  # none written yet
    path.write_text(json.dumps({"rows": {}}))  # no wall time recorded: no command to count
    assert read_commands(path) == []
    legacy = {"total_wall_seconds": 561.9, "pictures_seconds": 2.5, "jobs": 2, "rows": {}}
    path.write_text(json.dumps(legacy))  # written before the list existed: one command
    assert read_commands(path) == [
        {"total_wall_seconds": 561.9, "pictures_seconds": 2.5, "jobs": 2}
    ]
    listed = [{"total_wall_seconds": 1.0, "jobs": 1}, {"total_wall_seconds": 2.0, "jobs": 2}]
    path.write_text(json.dumps({**legacy, "commands": listed}))  # the list wins
    assert read_commands(path) == listed


def test_add_command_records_this_command_and_sums_the_seconds(tmp_path):
    path = tmp_path / "summary.json"
    fresh = {"total_wall_seconds": 10.0, "pictures_seconds": 1.5}
    add_command(fresh, None, jobs=2)
    assert fresh["commands"] == [{"total_wall_seconds": 10.0, "pictures_seconds": 1.5, "jobs": 2}]
    assert (fresh["total_wall_seconds"], fresh["pictures_seconds"]) == (10.0, 1.5)
    path.write_text(json.dumps(fresh))
    resumed = {"total_wall_seconds": 4.0}  # drew no pictures: 0 s on them
    add_command(resumed, path, jobs=3)
    assert [c["jobs"] for c in resumed["commands"]] == [2, 3]
    assert (resumed["total_wall_seconds"], resumed["pictures_seconds"]) == (14.0, 1.5)
    # a previous command without its picture time: the sum is unknown, left out
    path.write_text(json.dumps({"total_wall_seconds": 7.0}))
    drawn = {"total_wall_seconds": 4.0, "pictures_seconds": 0.5}
    add_command(drawn, path, jobs=1)
    assert drawn["total_wall_seconds"] == 11.0 and "pictures_seconds" not in drawn
    assert drawn["commands"][1] == {"total_wall_seconds": 4.0, "pictures_seconds": 0.5, "jobs": 1}
    # no summary where the resume looks (nothing recorded before it): this command alone
    alone = {"total_wall_seconds": 3.0, "pictures_seconds": 0.0}
    add_command(alone, tmp_path / "missing.json", jobs=1)
    assert len(alone["commands"]) == 1 and alone["total_wall_seconds"] == 3.0
