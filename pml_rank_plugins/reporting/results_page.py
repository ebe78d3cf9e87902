"""The Omniglot study's results page (``docs/results.md``): its generated regions, made from the
published ``summary.json`` files of the study's split and of the other class splits.

``python scripts/study_report.py splits docs/study docs/results.md`` calls :func:`splits_main`
(no run folders needed): from ``DOCS/tuned``, ``DOCS/claims/<claim>`` (the study's split) and
``DOCS/splits/seed<k>``, ``DOCS/splits/claims<k>/<claim>`` (the other class splits, written by
``scripts/run_splits.sh``; whichever have finished), the tables of :mod:`.across_splits` for the
methods (reference: ``DOCS/tuned/vs_best.json``'s) and each decided claim (its own reference).
Writes ``DOCS/splits/robustness.json`` and ``.md`` and replaces the generated regions
(:func:`region_markers`) of the results page: the methods' table and its sentences, the claims'
tables, and the compute of the split steps with the command to resume. The constants below are
that study's design (configs/studies/omniglot.yaml); ``pml-rank study`` writes the same tables
for any config (:mod:`.study_page`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from ..data.splits import class_disjoint_split
from .across_splits import (
    across_splits,
    across_splits_sentences,
    across_splits_table,
    level_simulation,
    seed_range,
    split_seed,
)

SPLIT_STEPS = ("seed1", "seed2", "claims1", "seed3")  # scripts/run_splits.sh's steps, in order
PLANNED_SPLITS = {1, 2, 3}  # the split seeds of the steps seed<k>
SPLIT_CLAIMS = ("batch_size", "rll_margin_tn")  # the decided claims re-run by step claims<k>
STUDY_CLASSES = 136  # characters of images_background_small1 (configs/studies/omniglot.yaml)
STUDY_FRACTIONS = (0.5, 0.25, 0.25)  # its class_disjoint_split fractions (train, val, test)
RESUME_COMMAND = "PML_RANK_DATA=../shared/data OUT=runs/splits scripts/run_splits.sh"
REPORT_COMMAND = "python scripts/study_report.py splits docs/study docs/results.md"


def split_overlap(seed: int, study_seed: int = 0) -> dict[str, dict[str, int]]:
    """How the characters of split ``study_seed`` fall into split ``seed``'s parts: ``{study
    part: {part: count}}`` for the study's 136 classes and fractions (``data.splits``'s shuffle
    depends only on the number of classes and the seed, so no data is read)."""
    labels = np.arange(STUDY_CLASSES)
    names = ("train", "val", "test")
    a = class_disjoint_split(labels, STUDY_FRACTIONS, study_seed)
    b = class_disjoint_split(labels, STUDY_FRACTIONS, seed)
    return {
        na: {nb: len(np.intersect1d(pa, pb)) for nb, pb in zip(names, b)}
        for na, pa in zip(names, a)
    }


def _study_summary(docs: Path, claim: str | None = None) -> Path:
    """The split-0 ``summary.json`` that the split steps re-run: ``DOCS/tuned`` (the methods,
    steps ``seed<k>``) or ``DOCS/claims/<claim>`` (steps ``claims<k>/<claim>``)."""
    return docs / ("tuned" if claim is None else f"claims/{claim}") / "summary.json"


def _compute_rows(docs: Path) -> tuple[list[str], list[str]]:
    """The compute table's rows (published steps) and the steps not finished: not published
    yet, or published with fewer rows than the split-0 comparison they re-run (a ``compare
    --methods`` subset; the missing rows are named, never counted as finished)."""
    rows, missing = [], []
    for step in SPLIT_STEPS:
        folders = (
            [docs / "splits" / step]
            if not step.startswith("claims")
            else [docs / "splits" / step / c for c in SPLIT_CLAIMS]
        )
        for folder in folders:
            path = folder / "summary.json"
            name = str(folder.relative_to(docs / "splits"))
            if not path.is_file():
                missing.append(name)
                continue
            s = json.loads(path.read_text())
            runs = sum(r.get("n_runs", 0) for r in s["rows"].values())
            failed = sum(r.get("n_failed", 0) for r in s["rows"].values())
            secs = sum(sum(r["seconds"]["values"]) for r in s["rows"].values())
            shape = f"{len(s['rows'])} x {s['seeds']}"
            claim = folder.name if step.startswith("claims") else None
            counterpart = _study_summary(docs, claim)
            if counterpart.is_file():
                wanted = list(json.loads(counterpart.read_text())["rows"])
                absent = [r for r in wanted if r not in s["rows"]]
                if absent:
                    shape = f"{len(wanted) - len(absent)} of {len(wanted)} x {s['seeds']}"
                    missing.append(f"{name} (not run yet: {', '.join(absent)})")
            rows.append(
                f"| {name} | {step.removeprefix('claims').removeprefix('seed')} | {shape} |"
                f" {runs} ({failed} failed) | {secs:,.0f} | {s['total_wall_seconds']:,.0f} |"
                f" {s.get('jobs', '-')} |"
            )
    return rows, missing


def splits_compute_markdown(docs: Path) -> str:
    """Compute and wall time of the published split steps, the ones still missing, and the
    command that resumes them."""
    rows, missing = _compute_rows(docs)
    lines = [
        "| step | split seed | rows x seeds | runs | run seconds | command wall (s) | jobs |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "Read from each step's `summary.json` (`docs/study/splits/<step>/`): run seconds are the"
        " runs' own wall seconds summed (two at a time with `--jobs 2`), the command wall the"
        " `compare` commands' (a `--resume` adds its own).",
        "",
        (
            f"**Not finished when this was generated:** {', '.join(missing)}."
            if missing
            else "**Every step has finished.**"
        )
        + " Resume (or run) the steps with the same command; each is resumable and publishes"
        " its outputs to `docs/study/splits/<step>/` when it finishes; then regenerate this page's"
        " generated sections:",
        "",
        "```bash",
        f"{RESUME_COMMAND}                 # every step: {' '.join(SPLIT_STEPS)}",
        f"{RESUME_COMMAND} seed3           # chosen steps only",
        REPORT_COMMAND,
        "```",
    ]
    return "\n".join(lines) + "\n"


def load_split_summaries(docs: Path) -> tuple[dict[int, dict], dict[str, dict[int, dict]]]:
    """``(methods, claims)``: the tuned comparison's ``summary.json`` per split seed (split 0:
    ``DOCS/tuned``, split k: ``DOCS/splits/seed<k>``) and, per decided claim, its summaries
    (split 0: ``DOCS/claims/<claim>``, split k: ``DOCS/splits/claims<k>/<claim>``); only
    finished comparisons (those that wrote ``summary.json``)."""

    def read(path: Path, seed: int) -> dict:
        summary = json.loads(path.read_text())
        split_seed(summary, str(path), seed)
        return summary

    def seed_of(folder: Path, prefix: str) -> int | None:
        tail = folder.name[len(prefix) :]
        return int(tail) if folder.name.startswith(prefix) and tail.isdigit() else None

    methods = {0: read(_study_summary(docs), 0)}
    found = [(seed_of(f, "seed"), f) for f in (docs / "splits").glob("seed*")]
    for k, folder in sorted((k, f) for k, f in found if k is not None):
        if (folder / "summary.json").is_file():
            methods[k] = read(folder / "summary.json", k)
    claims: dict[str, dict[int, dict]] = {}
    for claim in SPLIT_CLAIMS:
        if _study_summary(docs, claim).is_file():
            claims[claim] = {0: read(_study_summary(docs, claim), 0)}
        found = [(seed_of(f, "claims"), f) for f in (docs / "splits").glob("claims*")]
        for k, folder in sorted((k, f) for k, f in found if k is not None):
            if claim in claims and (folder / claim / "summary.json").is_file():
                claims[claim][k] = read(folder / claim / "summary.json", k)
    return methods, claims


SPLITS_TEXT = """\
**How to read it.** Each split's cell is the paired difference against {reference} on that split's
seeds (mean ± 95% CI, `*`: the interval excludes 0) and its verdict, by the rules of the study's
tables (Holm over the table's rows within the split, TOST against ±1.0 point, MDD); split 0 is
the study's (10 seeds, the verdicts of the table below), splits 1-3 are other class-disjoint
68 / 34 / 34 partitions of the same 136 characters (`split.class_disjoint_split.seed` = k,
recorded in each `summary.json`), each run with every method's tuned setting on 5 paired seeds
(1-5: within a split, seed s of every method shares its initial weights and batch order). The
reference was chosen on split 0's test results; on the other splits it is fixed in advance.

**The pooled test is a random-effects mean over the splits**, not a paired analysis with split
as a block: the question is whether a verdict survives *another* partition of the characters, so
the split is a random draw from the possible partitions and the effect may differ between them
(the held-out-alphabets check of issue 42 moved plugin FastAP's gap from -6.56 to -0.57). A
blocked (fixed-effect) analysis would test the average over these particular splits with the seed
noise alone and call a gap that exists on one split only "significant". Per split, the mean
paired difference and its variance s² / n enter a DerSimonian-Laird random-effects mean; with 2-4
splits the between-split variance τ² is poorly estimated, so the interval and test use the
Hartung-Knapp-Sidik-Jonkman variance (modified: never narrower than the DerSimonian-Laird one)
with a t distribution on k - 1 degrees of freedom (`reporting.statistics.random_effects_mean`).
The price is power: with 2 splits (1 degree of freedom, t = 12.7) almost nothing can hold, with 4
a consistent gap of a few points can. τ (points) is the estimated spread of the true difference
between splits.

{level}
The blocked test keeps its level only when the splits share one true difference; with a
spread between splits it calls a zero mean difference significant far more often than 5%, the
random-effects test stays at or below 5% (conservative with 2-3 splits).

Split 0 enters the pooled test with {pooled_seeds}:
every split then counts with one design, and the split on which the settings were tuned and the
reference chosen (where its gaps are favoured by that selection) does not weigh twice (once
another split has finished, the sentences under the table say whether all its seeds would change
the column). "Holds across splits": the
same direction on every split and the pooled test significant after Holm over the table's rows.

**Caveat: the tuned settings were chosen on split 0's validation classes, which are partly test
classes in the other splits** (hyperparameters carry over, never weights: every run trains from
scratch on its split's training characters). {overlap} A tuned setting can thus look better on a
split whose test characters it was tuned on; the partitions share characters in every part, so
the splits are not independent samples of characters either.
"""


def level_markdown(report: dict, splits: Sequence[int] = (2, 3, 4)) -> str:
    """The level of the two pooled tests (:func:`level_simulation`) at this design's spread:
    the median over the rows of the study split's paired standard deviation, 5 seeds."""
    sd = float(np.median([r["splits"]["0"]["std"] for r in report["rows"].values()]))
    none, some = level_simulation(splits, 0.0, sd), level_simulation(splits, sd, sd)
    lines = [
        "| splits | τ = 0: random effects | τ = 0: blocked | τ = s: random effects |"
        " τ = s: blocked |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for k in splits:
        cells = [none[k]["random_effects"], none[k]["blocked"]]
        cells += [some[k]["random_effects"], some[k]["blocked"]]
        lines.append(f"| {k} | " + " | ".join(f"{100 * c:.1f}%" for c in cells) + " |")
    return (
        "How often each pooled test rejects a true mean difference of 0 at the 5% level, in a"
        " simulation of this design (`level_simulation` in `scripts/study_report.py`: 5 paired"
        f" seeds per split, paired standard deviation s = {100 * sd:.2f} points, the median of"
        " split 0's rows; 20,000 draws, seed 0), with no spread of the true difference between"
        " splits (τ = 0) and with a spread as large as the seed noise (τ = s):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def splits_markdown(docs: Path) -> dict[str, str]:
    """The generated sections of the results page: ``{"methods", "claims", "compute"}``."""
    methods, claims = load_split_summaries(docs)
    reference = json.loads((docs / "tuned" / "vs_best.json").read_text())["reference"]
    report = across_splits(methods, reference)
    overlap = " ".join(
        f"Split {k}'s 34 test characters hold {o['val']['test']} of split 0's validation"
        f" characters and {o['test']['test']} of its test characters."
        for k in sorted(set(list(methods)[1:]) | PLANNED_SPLITS)
        for o in [split_overlap(k)]
    )
    methods_md = (
        across_splits_table(report, "method")
        + "\n"
        + across_splits_sentences(report, "method")
        + "\n"
        + SPLITS_TEXT.format(
            reference=reference,
            overlap=overlap,
            pooled_seeds=(
                f"seeds {seed_range(report['pooled_run_ids']['0'])}, the seeds the other splits"
                " ran"
                if len(report["splits"]) > 1
                else "the seeds the other splits run (1-5 in `scripts/run_splits.sh`)"
            ),
            level=level_markdown(report),
        )
    )
    parts, claim_reports = [], {}
    for claim, summaries in claims.items():
        ref = summaries[0]["reference"]
        claim_reports[claim] = rep = across_splits(summaries, ref)
        parts += [
            f"#### {claim} (reference: {ref})",
            "",
            across_splits_table(rep, "setting"),
            across_splits_sentences(rep, "setting"),
        ]
    claims_md = "\n".join(parts) + (
        "\nSame form as the methods' table: split 0 from `docs/study/claims/<claim>/` (10 seeds),"
        " split k from `docs/study/splits/claims<k>/<claim>/` (5 seeds); Holm over the claim's"
        " rows within a split and over its rows for the pooled test.\n"
    )
    return {
        "methods": methods_md,
        "claims": claims_md,
        "compute": splits_compute_markdown(docs),
        "report": {"methods": report, "claims": claim_reports},
    }


def region_markers(name: str) -> tuple[str, str]:
    return (
        f"<!-- generated by scripts/study_report.py splits: {name} (do not edit by hand) -->",
        f"<!-- end of generated: {name} -->",
    )


def fill_regions(page: str, sections: dict[str, str]) -> str:
    """``page`` with the text between each section's :func:`region_markers` replaced by the
    section; a section whose markers are missing (or out of order) raises ValueError."""
    for name, text in sections.items():
        begin, end = region_markers(name)
        i, j = page.find(begin), page.find(end)
        if i < 0 or j < i:
            raise ValueError(f"the page has no region {begin!r} ... {end!r}")
        page = page[: i + len(begin)] + "\n\n" + text.rstrip("\n") + "\n\n" + page[j:]
    return page


def splits_main(docs: str, page: str) -> int:
    """Write ``DOCS/splits/robustness.json`` and ``.md`` and refresh the generated regions of
    the results page ``page``."""
    sections = splits_markdown(Path(docs))
    report = sections.pop("report")
    target = Path(docs) / "splits"
    target.mkdir(parents=True, exist_ok=True)
    (target / "robustness.json").write_text(json.dumps(report, indent=2))
    (target / "robustness.md").write_text("\n".join(f"## {k}\n\n{v}" for k, v in sections.items()))
    Path(page).write_text(fill_regions(Path(page).read_text(), sections))
    print(sections["methods"], end="")
    return 0
