"""Reuse finished runs whose configuration is exactly one another phase already trained.

Four of the claims' settings (configs/claims/*.yaml) are, to the last key, the tuned setting of
their loss: ``M=80 (tuned)``, ``L=41 (tuned)`` and ``category-hard (tuned)`` are plugin FastAP's
tuned runs, ``tuned`` of rll_margin_tn is plugin RankedList's. On one machine a run is
bit-reproducible from its config and seed, so training them again would reproduce the tuned
phase's numbers at the cost of 40 runs (about 40 minutes of the study with two jobs).

    python scripts/study_reuse.py runs/study/tuned claims/batch_size runs/study/claims/batch_size \\
        --seeds 10 --data-root ../shared/data

For each run ``compare CONFIG --seeds N --out OUT`` would train, the run of ``FROM`` with the
same run id (``seed<S>``) whose saved ``config.yaml`` equals the run's resolved config in every
key but ``name`` (``experiment.schema.config_diff``: nothing tolerated, not even a key spelled
out at its default value) and whose ``metrics.json`` says ``finished`` is copied whole
(checkpoints too, so pictures and ``pml-rank eval`` work) into the run's folder, renamed to the
run's method in ``config.yaml`` and ``metrics.json``, with ``reused_from`` (the source folder)
recorded in ``metrics.json``. ``compare --resume`` then reuses the copy as a finished run. A run
folder that already exists is never touched; the copy is made under a temporary name and renamed
into place, so an interrupted reuse leaves no half folder. Prints one line per reused run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from pml_rank_plugins.experiment import collect_methods, resolve_config
from pml_rank_plugins.experiment.schema import config_diff
from pml_rank_plugins.experiment.spec import read_run_config
from pml_rank_plugins.experiment.yamlfile import dump_yaml
from pml_rank_plugins.running.jobs import Job, make_jobs

IGNORED = ("name",)  # the method's label: the one key a reused run may differ in


def finished_runs(source: Path) -> dict[str, list[Path]]:
    """``{run_id: [run folders]}`` of ``source``'s finished runs (``*/seed*/metrics.json``)."""
    found: dict[str, list[Path]] = {}
    for metrics in sorted(source.glob("*/*/metrics.json")):
        if json.loads(metrics.read_text()).get("status") == "finished":
            found.setdefault(metrics.parent.name, []).append(metrics.parent)
    return found


def match(job: Job, candidates: list[Path]) -> Path | None:
    """The candidate whose saved config equals ``job``'s in every key but :data:`IGNORED`."""
    for run_dir in candidates:
        diff = config_diff(read_run_config(run_dir), job.config.config)
        if all(path in IGNORED for path, _, _ in diff):
            return run_dir
    return None


def reuse(job: Job, source: Path) -> None:
    """Copy ``source`` into ``job.run_dir`` (which must not exist) under ``job.name``."""
    tmp = job.run_dir.with_name(f".{job.run_dir.name}.reusing")
    shutil.rmtree(tmp, ignore_errors=True)  # our own leftover of an interrupted copy
    shutil.copytree(source, tmp)
    config = read_run_config(tmp)
    config["name"] = job.name
    dump_yaml(config, tmp / "config.yaml")
    metrics = json.loads((tmp / "metrics.json").read_text())
    metrics["name"] = job.name
    metrics["reused_from"] = str(source)
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
    tmp.rename(job.run_dir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", type=Path, help="a finished phase's --out, e.g. runs/study/tuned")
    parser.add_argument("config", help="the config compare will run, e.g. claims/batch_size")
    parser.add_argument("out", type=Path, help="compare's --out for that config")
    parser.add_argument("--seeds", type=int, required=True)
    parser.add_argument("--data-root", required=True)
    args = parser.parse_args(argv)
    configs = collect_methods([resolve_config(args.config)], [], None, args.data_root)
    runs = finished_runs(args.source)
    reused = 0
    for job in make_jobs(configs, args.out, args.seeds):
        if job.run_dir.exists():
            continue
        found = match(job, runs.get(job.run_id, []))
        if found is not None:
            job.run_dir.parent.mkdir(parents=True, exist_ok=True)
            reuse(job, found)
            reused += 1
            print(f"reused {found} as {job.name} / {job.run_id}")
    print(f"study_reuse: {reused} run(s) of {args.source} reused for {args.config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
