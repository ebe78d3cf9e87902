"""RankedListLoss forward+backward: ours vs PML's RankedListLoss vs the N x N product floor.

For each N (d = 128, labels with 4 items per class, alpha 1.2, margin 0.4, Tn 10) and each
case, a fresh subprocess builds the inputs, reads its resident set size (RSS,
/proc/self/statm), runs forward+backward ``--warmup`` untimed times and then ``--repeats`` timed
times, and reports the best timed call and the peak RSS growth over the pre-call RSS
(``ru_maxrss`` minus that baseline, warm-up included). The cases of one N are measured in turn,
``--rounds`` times over (fresh subprocesses each round), keeping each case's best time and
largest peak (shared harness: ``benchmarks/_measure.py``). Cases:

* ours    -- ``pml_rank_plugins.losses.RankedListLoss`` (default ``gallery_gradient=False``:
  gradient through the query side of each list, the paper's sec. 3.2);
* ours_gg -- the same with ``gallery_gradient=True`` (both ends of every pair, as PML);
* pml     -- ``pytorch_metric_learning.losses.RankedListLoss(margin=0.4, Tn=10,
  imbalance=0.5, alpha=1.2)`` (skipped above ``--pml-max``: O(N^2) floats, several of them);
* floor   -- ``S = X @ X.T; (S * S).sum().backward()``, the cost of touching every pair once.

``--load train|spawn`` runs a competing CPU load (``benchmarks/_load.py``: a one-thread training
process, or a niced loop starting short Python processes) during the whole measurement, floor
and PML included; the script starts it and stops it. The load averages before and after are
printed with the table.

Targets (CPU, 2 threads, N = 4096): ours >= 5x faster than PML and <= 1.5x the floor; ours'
peak memory growth <= 1/8 of PML's; N = 16384 (``--sizes 16384``) under 1 GiB of growth. The
same under ``--load train``; under ``--load spawn``: never slower than PML and <= 2x the floor.
``--device cuda``, ``--autocast``, ``--json PATH`` and ``--in-process``, ``--backends`` and
``--cuda-graph``: as in
``bench_histogram_ap.py`` (``benchmarks/_measure.py``). ``--backend NAME`` (``cpu``, ``gpu``,
``triton`` or ``auto``) runs this table's ``ours`` and ``ours_gg`` under
``use_backend(NAME)`` (cases ``ours@NAME``, ``ours_gg@NAME``), beside PML and the floor of the
same run: ``--backend triton`` measures the fused kernel
(``functional/ranked_list/triton_kernel.py``) for both gradient modes (``ours_gg`` runs its
``grad_R`` kernel too); ``--backends`` gives the per-backend table instead.
Run: ``python benchmarks/bench_ranked_list.py [--sizes 1024 4096 16384] [--load train]
[--device cpu|cuda] [--autocast none bfloat16] [--json PATH] [--in-process]
[--backend triton]``.
"""

from __future__ import annotations

import warnings
from functools import partial

from _backend_report import report_backends
from _backends import BACKEND_CHOICES
from _measure import (
    add_pairwise_flags,
    bench_main,
    bench_parser,
    mib,
    ratio,
    report_pairwise,
    run_pairwise_case,
    seconds,
    times_cell,
    versus_pml,
)
from pytorch_metric_learning.losses import RankedListLoss as PMLRankedListLoss

from pml_rank_plugins.losses import RankedListLoss

CASES = ["ours", "ours_gg", "floor", "pml"]
COLUMNS = [
    "N",
    "ours s",
    "ours gg s",
    "PML s",
    "floor s",
    "PML / ours",
    "PML / ours gg",
    "ours / floor",
    "ours gg / floor",
    "ours MiB",
    "ours gg MiB",
    "PML MiB",
    "floor MiB",
    "ours / PML mem",
]


def make_loss(case: str):
    """The loss of ``case``: ``"pml"``, ``"ours"`` or ``"ours_gg"`` (``gallery_gradient``)."""
    if case == "pml":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PML warns for any Tn > 5
            return PMLRankedListLoss(margin=0.4, Tn=10.0, imbalance=0.5, alpha=1.2)
    return RankedListLoss(margin=0.4, alpha=1.2, Tn=10.0, gallery_gradient=case == "ours_gg")


SPEC = {
    "losses": ["ours"],
    "labels": {"ours": "RankedList", "pml": "PML RankedList", "floor": "floor"},
    "pml_loss": "ranked_list",
}


def report(args) -> None:
    """Measures every size and case, prints the table (``--backends``: one row per backend)."""
    if args.backends:
        title = (
            "RankedListLoss forward+backward by backend, {where}, "
            f"d={args.dim}, alpha 1.2, margin 0.4, Tn 10, 4 per class, gallery_gradient=False, "
            f"{args.warmup} warm-up call(s), {args.repeats} timed call(s) at most x "
            f"{args.rounds} round(s); peak = {{peak}} during all calls"
        )
        report_backends(__file__, args, title, SPEC)
        return
    backend = args.backend
    title = (
        f"RankedListLoss forward+backward, {{where}}, d={args.dim}, "
        "alpha 1.2, margin 0.4, Tn 10, 4 per class, "
        f"{args.warmup} warm-up call(s), best of {args.repeats} timed x {args.rounds} "
        "rounds; peak = {peak} during all calls; ours = gallery_gradient=False, gg = True"
        + (f"; ours and gg on backend {backend}" if backend else "")
    )
    cases = [ours_case(case, backend) for case in CASES]
    row = partial(size_row, backend=backend)
    report_pairwise(__file__, cases, args, title, COLUMNS, row, "O(N^2)")


def ours_case(case: str, backend: str | None) -> str:
    """``case`` as measured: ``"ours"`` / ``"ours_gg"`` under ``--backend NAME`` become
    ``"ours@NAME"`` (``_measure.run_pairwise_case`` runs them under ``use_backend(NAME)``)."""
    return f"{case}@{backend}" if backend and case.startswith("ours") else case


def size_row(n: int, best: dict, backend: str | None = None) -> list:
    """The table row of size ``n`` from its cases' results (``"skipped"`` / ``"-"`` for a case
    not run or failed); ``backend``: the ``--backend`` the ``ours`` cases ran under."""
    ours, gg = best[ours_case("ours", backend)], best[ours_case("ours_gg", backend)]
    floor, pml = best["floor"], best.get("pml")
    speedup, memory = versus_pml(ours, pml)
    return [
        n,
        seconds(ours),
        seconds(gg),
        seconds(pml),
        seconds(floor),
        speedup,
        versus_pml(gg, pml)[0],
        times_cell(ratio(ours, floor), 2),
        times_cell(ratio(gg, floor), 2),
        mib(ours),
        mib(gg),
        mib(pml),
        mib(floor),
        memory,
    ]


def main() -> None:
    parser = bench_parser(__doc__)
    add_pairwise_flags(parser, sizes=[1024, 4096])
    parser.add_argument(
        "--backend",
        choices=BACKEND_CHOICES,
        default=None,
        help="run ours and ours gg of this table under this backend (triton: the fused kernel); "
        "default: the loss's default selection",
    )
    bench_main(parser, partial(run_pairwise_case, make_loss), report)


if __name__ == "__main__":
    main()
