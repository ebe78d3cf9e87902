"""The convergence of a study's runs: the probe that sets the training budget, and the check that
the tuned (and default) settings converged at it.

From the run folders' ``metrics.json`` (validation primary metric per epoch, :func:`load_curves`):

* per run, the best-so-far validation curve (what early stopping keeps; a run that stopped early
  stays at its best after its last epoch);
* per method, the mean of those curves over seeds, its plateau (the last value) and the first
  epoch where the mean is within ``TOLERANCE`` (0.5 points) of the plateau;
* the budget: that epoch for the method with the highest plateau ("the best curve").

:func:`convergence_check` adds, per method, how much the mean best-so-far curve still rose over
the last ``LATE`` epochs and how many runs had their best epoch among them (for the Omniglot
study: the budget came from the probe at default settings; this says how far the tuned settings
were from their plateau). Everything here is O(runs x epochs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

TOLERANCE = 0.005  # 0.5 points of the primary metric (a fraction)
PRIMARY = "mean_average_precision_at_r"  # configs/studies/omniglot.yaml's eval.primary_metric


def load_curves(probe: Path, primary: str) -> dict[str, dict[str, list[float]]]:
    """``{method: {run: [validation value per epoch]}}`` from the probe's run folders."""
    out: dict[str, dict[str, list[float]]] = {}
    for metrics in sorted(probe.glob("*/seed*/metrics.json")):
        m = json.loads(metrics.read_text())
        if m.get("status") != "finished" or not m.get("history"):
            continue
        vals = [next(iter(r["validation"].values()))[primary] for r in m["history"]]
        out.setdefault(m["name"], {})[metrics.parent.name] = vals
    return out


def best_so_far(values: list[float], epochs: int) -> np.ndarray:
    """Running maximum, carried to ``epochs`` entries (early stopping keeps the best)."""
    run = np.maximum.accumulate(np.asarray(values, dtype=float))
    return np.concatenate([run, np.full(epochs - run.size, run[-1])])


def convergence(curves: dict[str, dict[str, list[float]]]) -> dict:
    """Per method: seeds, mean best-so-far curve, plateau, converged epoch; and the budget."""
    epochs = max(len(v) for runs in curves.values() for v in runs.values())
    methods = {}
    for method, runs in curves.items():
        mean = np.mean([best_so_far(v, epochs) for v in runs.values()], axis=0)
        plateau = float(mean[-1])
        first = int(np.argmax(mean >= plateau - TOLERANCE)) + 1
        methods[method] = {
            "seeds": len(runs),
            "epochs_run": {r: len(v) for r, v in runs.items()},
            "mean_best_so_far": mean.tolist(),
            "plateau": plateau,
            "converged_epoch": first,
        }
    best = max(methods, key=lambda k: methods[k]["plateau"])
    return {
        "tolerance": TOLERANCE,
        "best_method": best,
        "budget_epochs": methods[best]["converged_epoch"],
        "methods": methods,
    }


def markdown(report: dict) -> str:
    lines = [
        "| method | seeds | epochs run (per seed) | plateau (%) | within 0.5 points from epoch |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for method, m in report["methods"].items():
        runs = ", ".join(str(m["epochs_run"][r]) for r in sorted(m["epochs_run"]))
        lines.append(
            f"| {method} | {m['seeds']} | {runs} | {100 * m['plateau']:.2f} | "
            f"{m['converged_epoch']} |"
        )
    lines += [
        "",
        f"Best curve: {report['best_method']}; budget: {report['budget_epochs']} "
        "epochs (the first epoch where its mean best-so-far validation value is within 0.5 "
        "points of its plateau).",
    ]
    return "\n".join(lines) + "\n"


def plot(curves: dict, report: dict, path: Path) -> None:
    """The probe's curves (thin: each seed; thick: the mean best-so-far) and the budget, as a PNG."""
    import matplotlib.pyplot as plt  # lazily: the CLI's start-up imports no matplotlib

    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    for i, (method, runs) in enumerate(curves.items()):
        color = f"C{i}"
        for vals in runs.values():
            ax.plot(
                range(1, len(vals) + 1),
                [100 * v for v in vals],
                color=color,
                alpha=0.3,
                linewidth=0.8,
            )
        mean = report["methods"][method]["mean_best_so_far"]
        ax.plot(
            range(1, len(mean) + 1),
            [100 * v for v in mean],
            color=color,
            linewidth=2,
            label=f"{method} (mean best so far)",
        )
    ax.axvline(report["budget_epochs"], color="k", linestyle=":", label="budget")
    ax.set_xlabel("epoch (50 updates each)")
    ax.set_ylabel("validation MAP@R (%)")
    ax.set_title("Convergence probe: validation MAP@R per epoch (thin: each seed)")
    ax.legend(fontsize=9)
    fig.savefig(path, dpi=110)
    plt.close(fig)


LATE = 5  # epochs: the end of the budget whose gain says whether a run was still improving


def convergence_check(phase: Path, primary: str = PRIMARY) -> dict:
    """:func:`convergence` of ``phase``'s runs plus, per method, ``late_gain`` (mean best-so-far
    at the last epoch minus ``LATE`` epochs before) and ``best_in_late`` (runs whose first best
    epoch is among the last ``LATE``)."""
    curves = load_curves(phase, primary)
    report = convergence(curves)
    epochs = max(len(v) for runs in curves.values() for v in runs.values())
    report["late_epochs"] = LATE
    for method, m in report["methods"].items():
        mean = m["mean_best_so_far"]
        m["late_gain"] = mean[-1] - mean[-1 - LATE]
        m["best_in_late"] = sum(
            int(np.argmax(v)) + 1 > epochs - LATE for v in curves[method].values()
        )
    return report


def convergence_check_markdown(report: dict) -> str:
    late = report["late_epochs"]
    lines = [
        f"| method | runs | best-so-far at the end (%) | within 0.5 points from epoch | gain over"
        f" the last {late} epochs (points) | runs with their best in the last {late} epochs |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for method, m in report["methods"].items():
        lines.append(
            f"| {method} | {m['seeds']} | {100 * m['plateau']:.2f} | {m['converged_epoch']} |"
            f" {100 * m['late_gain']:.2f} | {m['best_in_late']} |"
        )
    return "\n".join(lines) + "\n"
