"""Processes for tests/running/test_torchrun_faults.py: ``python -m tests.running.fault_scenarios
SCENARIO DIR``, one process per torchrun rank (``RANK`` ... in the environment) or, for
``orphan``, the parent of a ``--jobs 2`` pool.

* ``stuck``: a 2-rank ``compare`` in which rank 1 stops itself (SIGSTOP) in its 2nd training
  step; rank 0 prints the error it exits with.
* ``writers``: a 2-rank ``compare`` and ``sweep``; rank 1 records every file it opens for writing
  below DIR (an audit hook) into ``DIR/../rank1_writes.json``.
* ``orphan``: :func:`execute` with 2 workers on runs that would take minutes; each worker writes
  ``DIR/worker.<pid>`` when it starts training.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from pytorch_metric_learning.losses import ContrastiveLoss

from pml_rank_plugins.experiment import registry
from pml_rank_plugins.running import distributed
from pml_rank_plugins.running.pool import execute, make_jobs
from tests.tiny import tiny_config

FAST = {"trainer": {"MetricLossOnly": {"iterations_per_epoch": 2, "num_epochs": 1}}}


class StopOnRank1Loss(ContrastiveLoss):
    """ContrastiveLoss whose 2nd call on rank 1 stops the process (as ``kill -STOP`` would)."""

    calls = 0

    def forward(self, *args, **kwargs):
        StopOnRank1Loss.calls += 1
        if StopOnRank1Loss.calls == 2 and distributed.env_rank() == 1:
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().forward(*args, **kwargs)


class SlowLoss(ContrastiveLoss):
    """ContrastiveLoss that takes 0.2 s per call and marks its process in ``marker_dir``."""

    def __init__(self, marker_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.marker_dir = marker_dir

    def forward(self, *args, **kwargs):
        Path(self.marker_dir, f"worker.{os.getpid()}").touch()
        time.sleep(0.2)
        return super().forward(*args, **kwargs)


registry.register("StopOnRank1Loss", StopOnRank1Loss)
registry.register("SlowLoss", SlowLoss)


def stuck(root: Path) -> int:
    from pml_rank_plugins.reporting.compare import run_comparison  # not in the orphan's processes

    cfg = tiny_config(loss_funcs={"metric_loss": {"StopOnRank1Loss": {}}}, **FAST)
    t0 = time.monotonic()
    try:
        run_comparison(cfg, root / "compare", pictures=False)
    except distributed.RankTimeoutError as e:
        print(f"ERROR after {time.monotonic() - t0:.1f} s: {e}", flush=True)
        return 1
    print("finished without a timeout", flush=True)
    return 0


def writers(root: Path) -> int:
    from pml_rank_plugins.reporting.compare import run_comparison
    from pml_rank_plugins.reporting.sweep import run_sweep

    written: list[str] = []
    prefix = str(root)

    def audit(event, args):
        if event == "open" and isinstance(args[0], (str, os.PathLike)):
            path, mode, flags = str(args[0]), args[1], args[2]
            writing = (mode and any(c in str(mode) for c in "wax+")) or (
                mode is None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            )
            if writing and os.path.abspath(path).startswith(prefix):
                written.append(path)

    if distributed.env_rank() == 1:
        sys.addaudithook(audit)
    cfg = tiny_config(**FAST)
    cfg["methods"] = {"A": None, "B": {"loss_funcs": {"metric_loss": {"TripletMarginLoss": {}}}}}
    run_comparison(cfg, root / "compare", seeds=1, pictures=False)
    grid = {"loss_funcs.metric_loss.neg_margin": ["0.5", "1.0"]}
    run_sweep(tiny_config(**FAST), None, grid, root / "sweep")
    distributed.shutdown()
    if distributed.env_rank() == 1:
        (root.parent / "rank1_writes.json").write_text(json.dumps(written))
    return 0


def orphan(root: Path) -> int:
    cfg = tiny_config(loss_funcs={"metric_loss": {"SlowLoss": {"marker_dir": str(root)}}})
    cfg["trainer"]["MetricLossOnly"]["iterations_per_epoch"] = 10_000
    jobs = make_jobs({"slow": cfg}, root / "runs", seeds=2)
    execute(jobs, resume=False, n_jobs=2)
    return 0


if __name__ == "__main__":
    scenario, folder = sys.argv[1], Path(sys.argv[2])
    sys.exit({"stuck": stuck, "writers": writers, "orphan": orphan}[scenario](folder))
