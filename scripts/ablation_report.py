"""Tables and figure of docs/ablations.md from the `pml-rank compare` outputs of each claim.

Reads ``<runs>/<claim>/summary.json`` (written by ``pml-rank compare``; the statistics are
``pml_rank_plugins.reporting.statistics``'s, nothing is recomputed here), prints one Markdown table
per claim and draws ``docs/figures/ablations.png``: test MAP@R per setting (mean and 95% t
interval, every seed as a dot) and the paired difference to the paper's default setting.

    python scripts/ablation_report.py [--runs runs/ablations] [--figure docs/figures/ablations.png]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

CLAIMS = {
    "fastap_bins": "FastAP bins L",
    "batch_size": "FastAP batch size M",
    "hard_vs_random": "FastAP batches",
    "map_q_vs_t": "listwise AP variant",
    "rll_margin_tn": "RLL margin m, Tn",
}
PRIMARY = "mean_average_precision_at_r"
SHOWN = [("precision_at_1", "P@1"), ("r_precision", "RP"), (PRIMARY, "MAP@R")]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def table(summary: dict) -> str:
    ref = summary["reference"]
    head = ["setting", "n"] + [f"{label} (95% CI)" for _, label in SHOWN]
    head += [f"Δ MAP@R vs {ref} (95% CI)", "p (paired t)", "verdict"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for name, row in summary["rows"].items():
        cells = [name]
        main = row[PRIMARY]
        cells.append(str(main["n"]))
        for key, _ in SHOWN:
            s = row[key]
            cells.append(f"{_pct(s['mean'])} ± {_pct(s['ci_half_width'])}")
        if name == ref:
            cells += ["reference", "", ""]
        else:
            d = summary["differences"][name][PRIMARY]
            cells.append(
                f"{100 * d['mean']:+.2f} [{100 * d['ci_low']:+.2f}, {100 * d['ci_high']:+.2f}]"
            )
            p = d["p_ttest"]
            cells.append("< 0.001" if p < 0.001 else f"{p:.3f}")
            cells.append(
                ("higher" if d["mean"] > 0 else "lower")
                if d["ci_excludes_zero"]
                else "inconclusive"
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def figure(summaries: dict[str, dict], path: Path) -> None:
    n = len(summaries)
    fig, axes = plt.subplots(2, n, figsize=(3.4 * n, 6.2), squeeze=False)
    for col, (claim, summary) in enumerate(summaries.items()):
        names = list(summary["rows"])
        ref = summary["reference"]
        top, bottom = axes[0][col], axes[1][col]
        for i, name in enumerate(names):
            s = summary["rows"][name][PRIMARY]
            color = "tab:red" if name == ref else "tab:blue"
            top.errorbar(
                i, 100 * s["mean"], yerr=100 * s["ci_half_width"], fmt="o", color=color, capsize=4
            )
            top.scatter([i] * len(s["values"]), [100 * v for v in s["values"]], s=8, color="0.6")
            if name != ref:
                d = summary["differences"][name][PRIMARY]
                bottom.errorbar(
                    i,
                    100 * d["mean"],
                    yerr=100 * d["ci_half_width"],
                    fmt="s",
                    capsize=4,
                    color="tab:green" if d["ci_excludes_zero"] else "0.3",
                )
        bottom.axhline(0, color="tab:red", lw=1)
        for ax in (top, bottom):
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels([m.replace(" (paper)", "*") for m in names], rotation=35, ha="right")
            ax.set_xlim(-0.5, len(names) - 0.5)
        top.set_title(CLAIMS.get(claim, claim))
        if col == 0:
            top.set_ylabel("test MAP@R (%), mean ± 95% CI")
            bottom.set_ylabel("Δ MAP@R vs paper default (points)")
    fig.suptitle(
        "Omniglot ablations (* = paper's default, the paired reference; grey dots = seeds)",
        fontsize=11,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="runs/ablations")
    parser.add_argument("--figure", default="docs/figures/ablations.png")
    args = parser.parse_args()
    summaries = {}
    for claim in CLAIMS:
        f = Path(args.runs) / claim / "summary.json"
        if f.exists():
            summaries[claim] = json.loads(f.read_text())
    if not summaries:
        raise SystemExit(f"no <claim>/summary.json under {args.runs}: run scripts/run_ablations.sh")
    for claim, summary in summaries.items():
        total = summary.get("total_wall_seconds")
        print(f"### {claim}" + (f" ({total:.0f} s)" if total else "") + "\n")
        print(table(summary) + "\n")
    figure(summaries, Path(args.figure))
    print(f"figure: {args.figure}")


if __name__ == "__main__":
    main()
