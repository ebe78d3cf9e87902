"""scripts/study_reuse.py: a claim's run is copied from another phase only when its saved config
is the same in every key but the name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from pml_rank_plugins.experiment import collect_methods, resolve_config
from pml_rank_plugins.experiment.spec import read_run_config
from pml_rank_plugins.experiment.yamlfile import dump_yaml
from pml_rank_plugins.running.jobs import make_jobs

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("study_reuse", ROOT / "scripts" / "study_reuse.py")
study_reuse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(study_reuse)

CLAIM = "claims/batch_size"  # "M=80 (tuned)" is plugin FastAP's tuned setting; "M=40" is not


def _source_run(source: Path, config: dict, name: str, seed: int, status="finished") -> Path:
    run = source / name.replace(" ", "_") / f"seed{seed}"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "best.pt").write_bytes(b"weights")
    dump_yaml({**config, "name": name}, run / "config.yaml")
    test = {"mean_average_precision_at_r": 0.7 + seed / 100}
    (run / "metrics.json").write_text(json.dumps({"name": name, "status": status, "test": test}))
    return run


def _jobs(data_root: Path, out: Path, seeds: int):
    configs = collect_methods([resolve_config(CLAIM)], [], None, str(data_root))
    return {(j.name, j.run_id): j for j in make_jobs(configs, out, seeds)}


def test_only_runs_of_the_same_config_and_seed_are_reused(tmp_path, capsys):
    source, out = tmp_path / "tuned", tmp_path / "claim"
    jobs = _jobs(tmp_path, out, 3)
    for seed in (1, 2, 3):
        cfg = jobs[("M=80 (tuned)", f"seed{seed}")].config.config
        _source_run(source, cfg, "plugin FastAP", seed, "failed" if seed == 3 else "finished")
    # another method's finished seed 1, one key away from "M=40": not reused for it
    other = json.loads(json.dumps(jobs[("M=40", "seed1")].config.config))
    other["optimizers"]["trunk_optimizer"]["Adam"]["lr"] *= 2
    _source_run(source, other, "other", 1)
    (out / "M_80_tuned" / "seed2").mkdir(parents=True)  # an existing folder is never touched
    (out / "M_80_tuned" / "seed2" / "mine.txt").write_text("kept")

    assert (
        study_reuse.main(
            [str(source), CLAIM, str(out), "--seeds", "3", "--data-root", str(tmp_path)]
        )
        == 0
    )

    reused = out / "M_80_tuned" / "seed1"
    metrics = json.loads((reused / "metrics.json").read_text())
    assert (
        metrics["name"] == "M=80 (tuned)" and metrics["test"]["mean_average_precision_at_r"] == 0.71
    )
    assert metrics["reused_from"] == str(source / "plugin_FastAP" / "seed1")
    assert read_run_config(reused)["name"] == "M=80 (tuned)"
    assert (reused / "checkpoints" / "best.pt").read_bytes() == b"weights"
    assert sorted(p.name for p in (out / "M_80_tuned" / "seed2").iterdir()) == ["mine.txt"]
    assert not (out / "M_80_tuned" / "seed3").exists()  # the source run failed
    assert not (out / "M_40").exists()  # batch_size 40 is no run of the source
    assert not list(out.glob("*/.*reusing"))
    assert "1 run(s)" in capsys.readouterr().out


def test_a_key_at_another_value_is_no_match(tmp_path):
    jobs = _jobs(tmp_path, tmp_path / "claim", 1)
    job = jobs[("M=80 (tuned)", "seed1")]
    cfg = json.loads(json.dumps(job.config.config))
    cfg["trainer"]["MetricLossOnly"]["num_epochs"] += 1
    run = _source_run(tmp_path / "tuned", cfg, "plugin FastAP", 1)
    assert study_reuse.match(job, [run]) is None
    cfg["trainer"]["MetricLossOnly"]["num_epochs"] -= 1
    run2 = _source_run(tmp_path / "tuned2", cfg, "plugin FastAP", 1)
    assert study_reuse.match(job, [run, run2]) == run2
