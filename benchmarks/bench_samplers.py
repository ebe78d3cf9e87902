"""Epoch construction time at Stanford-Online-Products scale: ours vs PML's HierarchicalSampler.

SOP-like labels: 120,053 items, 22,634 classes, 12 categories, batch 256 (FastAP's setting,
5 batches per category pair -> 330 batches). Target: one epoch of CategoryHardSampler < 1 s.
PML's sampler builds its epoch in ``reshuffle()``; ours in ``epoch_batches()``. Both are timed
in this process, best of ``--repeats``. Run: ``python benchmarks/bench_samplers.py``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from _measure import print_header, print_row, time_calls
from pytorch_metric_learning.samplers import HierarchicalSampler

from pml_rank_plugins.samplers import CategoryHardSampler, RandomClassSampler


def sop_like_labels(
    num_items: int = 120_053, num_classes: int = 22_634, num_categories: int = 12, seed: int = 0
) -> np.ndarray:
    """Every class >= 2 items (SOP has 2-12 images per product), classes spread over categories."""
    rng = np.random.default_rng(seed)
    counts = np.full(num_classes, 2)
    extra = rng.multinomial(num_items - counts.sum(), rng.dirichlet(np.ones(num_classes)))
    counts += np.minimum(extra, 10)
    counts[: num_items - counts.sum()] += 1  # top up to the exact item count
    classes = np.repeat(np.arange(num_classes), counts)
    categories = (np.arange(num_classes) % num_categories)[classes]
    return np.stack([classes, categories], axis=1)


def best_time(fn, repeats: int) -> float:
    return time_calls(fn, warmup=0, repeats=repeats)["time"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    labels = sop_like_labels()
    print(f"labels: {len(labels)} items, {len(np.unique(labels[:, 0]))} classes, 12 categories")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        ours = CategoryHardSampler(labels, batch_size=256, batches_per_pair=5)
        ours_init = time.perf_counter() - start
        start = time.perf_counter()
        pml = HierarchicalSampler(labels, 256, "all", batches_per_super_tuple=5)
        pml_init = time.perf_counter() - start
        rand = RandomClassSampler(labels, batch_size=256)
    ours_epoch = best_time(lambda: ours.epoch_batches(1), args.repeats)
    pml_epoch = best_time(pml.reshuffle, args.repeats)
    rand_epoch = best_time(lambda: rand.epoch_batches(1), args.repeats)
    short = sum(len(b) != 256 for b in pml.batches)
    rows = [
        ("CategoryHardSampler (ours)", ours_init, ours_epoch, len(ours), 0),
        ("HierarchicalSampler (PML)", pml_init, pml_epoch, len(pml.batches), short),
        ("RandomClassSampler (ours)", float("nan"), rand_epoch, len(rand), 0),
    ]
    print_header(["sampler", "init s", "epoch s", "batches", "short batches"])
    for name, init, epoch, batches, n_short in rows:
        print_row([name, f"{init:.3f}", f"{epoch:.3f}", batches, n_short])
    print(
        f"epoch-construction ratio PML / ours: {pml_epoch / ours_epoch:.2f}x "
        f"(target: ours < 1 s: {'met' if ours_epoch < 1 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
