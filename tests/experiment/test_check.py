"""`pml-rank check`: one summary line per method, exit 0; config mistakes exit 2 with the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pml_rank_plugins import cli
from pml_rank_plugins.experiment.schema import expand_methods, load_yaml

CONFIGS = Path(cli.__file__).resolve().parent / "experiment" / "configs"


def test_check_prints_one_line_per_method(capsys):
    assert cli.main(["check", str(CONFIGS / "default.yaml")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    methods = expand_methods(load_yaml(CONFIGS / "default.yaml"))
    assert len(lines) == 1 + len(methods)
    assert lines[1].startswith("plugin FastAP: data[train 3640/182c val 1820/91c test 1820/91c]")
    assert "loss[metric_loss=plugin:FastAPLoss]" in lines[1]
    assert "loss[metric_loss=FastAPLoss]" in lines[4] and "trunk=ConvEmbedder(248.9k)" in lines[4]


def _write(tmp_path, cfg) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def test_check_reports_config_errors_with_exit_2(tmp_path, capsys):
    cfg = load_yaml(CONFIGS / "default.yaml")
    cfg.pop("methods")
    cfg["loss_funcs"] = {"metric_loss": {"FastAPLos": {}}}
    assert cli.main(["check", _write(tmp_path, cfg)]) == 2
    assert "FastAPLos" in capsys.readouterr().err


def test_missing_data_root_and_env_default(tmp_path, capsys, monkeypatch):
    cfg = load_yaml(CONFIGS / "default.yaml")
    cfg.pop("methods")
    cfg["loss_funcs"] = {"metric_loss": {"ContrastiveLoss": {}}}
    cfg["dataset"] = {"StanfordOnlineProducts": {"root": "Stanford_Online_Products"}}
    path = _write(tmp_path, cfg)
    monkeypatch.setenv("PML_RANK_DATA", str(tmp_path))
    assert cli.main(["check", path]) == 2
    err = capsys.readouterr().err
    assert f"dataset.StanfordOnlineProducts.root: {tmp_path}/Stanford_Online_Products" in err
    assert "Stanford_Online_Products.zip" in err
    assert cli.main(["check", path, "--data-root", str(tmp_path / "nope")]) == 2
    assert "--data-root" in capsys.readouterr().err


def test_check_refuses_a_bad_search_space_naming_the_key(tmp_path, capsys):
    # issue 22: `pml-rank check` validates tune spaces too
    cfg = load_yaml(CONFIGS / "tune_demo.yaml")
    cfg["methods"]["PML FastAP"]["tune"]["space"]["loss_funcs.metric_loss.num_bins"] = {
        "int": [40, 5]
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert cli.main(["check", str(path), "--methods", "PML FastAP"]) == 2
    err = capsys.readouterr().err
    assert "tune.space.loss_funcs.metric_loss.num_bins" in err and "low 40 > high 5" in err


def test_the_summary_line_names_what_the_sampler_excludes_with_the_fix(tmp_path, capsys):
    """Issue 50: CategoryHardSampler excluding categories was a UserWarning only; check's
    summary line now names them (with the dataset's category name) and the fix."""
    import warnings

    from tests.data.image_folder_fixture import make_image_folder
    from tests.experiment.test_data_scan import folder_config

    classes = {"a": ["x", "y"], "b": ["z", "w"], "c": ["lonely"]}  # c: 4 items, fewer than 6
    folder = make_image_folder(tmp_path / "photos", classes, bad_file=False, empty_class=False)
    cfg = folder_config(folder.root, CategoryHardSampler={})
    cfg["trainer"]["MetricLossOnly"]["batch_size"] = 12  # two categories x 6 items
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cli.main(["check", _write(tmp_path, cfg)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    sampler = line.split(" sampler[")[1].split("] optim[")[0]
    assert sampler == (
        "plugin:CategoryHardSampler: excludes 1 of 3 categories (2 ('c') has 4 usable items in "
        "classes of >= 2, fewer than the 6 needed); fix: a smaller batch_size (now 12; each "
        "category fills 6), more categories_per_batch (now 2), or more items"
    )
    assert not [w for w in caught if "excluded" in str(w.message)]  # said once, in the line
    # training still warns (the summary is check's)
    from pml_rank_plugins.experiment import builder

    with pytest.warns(UserWarning, match="category 2 excluded"):
        builder.build_experiment(cfg, "cpu")


def test_single_item_classes_are_in_the_summary_line(tmp_path, capsys):
    from tests.data.image_folder_fixture import make_image_folder
    from tests.experiment.test_data_scan import folder_config

    folder = make_image_folder(tmp_path / "photos", bad_file=False, empty_class=False)
    for rel in folder.images["fruit/apple"][1:]:  # apple keeps one image
        (folder.root / rel).unlink()
    cfg = folder_config(folder.root, RandomClassSampler={})
    assert cli.main(["check", _write(tmp_path, cfg)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert (
        " sampler[plugin:RandomClassSampler: 1 class(es) have a single item and are never "
        + ("sampled (a query needs a positive); fix: 2+ items in each] ")
        in line
    )
