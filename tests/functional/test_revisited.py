"""Revisited Oxford/Paris mAP and mP@k against a plain loop written from the protocol."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pml_rank_plugins.functional.revisited import (
    average_precision,
    revisited_evaluate,
    revisited_map,
    revisited_ranks,
)

# Protocol definition (Radenovic et al. 2018, sec. 3): positives and ignored lists.
DEFINITION = {
    "easy": (["easy"], ["junk", "hard"]),
    "medium": (["easy", "hard"], ["junk"]),
    "hard": (["hard"], ["junk", "easy"]),
}


def reference(ranks, gnd, ks):
    """Walk each ranked list once, dropping ignored images, as the protocol describes."""
    out = {}
    for protocol, (pos_keys, ign_keys) in DEFINITION.items():
        aps, precs, skipped = [], [], 0
        for q, entry in enumerate(gnd):
            positives = {i for key in pos_keys for i in entry[key]}
            ignored = {i for key in ign_keys for i in entry[key]}
            if not positives:
                skipped += 1
                continue
            kept = [int(i) for i in ranks[:, q] if int(i) not in ignored]
            found, ap, hits = 0, 0.0, []
            for position, index in enumerate(kept):
                if index in positives:
                    before = 1.0 if position == 0 else found / position
                    found += 1
                    after = found / (position + 1)
                    ap += (before + after) / 2 / len(positives)
                    hits.append(position + 1)
            aps.append(ap)
            row = []
            for k in ks:
                cut = min(max(hits), k) if hits else k
                row.append(sum(1 for h in hits if h <= cut) / cut)
            precs.append(row)
        out[f"map_{protocol}"] = sum(aps) / len(aps) if aps else math.nan
        for j, k in enumerate(ks):
            out[f"mp_at_{k}_{protocol}"] = (
                sum(r[j] for r in precs) / len(precs) if precs else math.nan
            )
        out[f"num_queries_{protocol}"] = len(aps)
        out[f"num_skipped_{protocol}"] = skipped
    return out


def assert_same(got, want):
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(got[key]), key
        else:
            assert got[key] == pytest.approx(value, abs=1e-12), key


def test_hand_computed_values():
    # database 0..4; query 0 ranks 3, 0, 1, 2, 4; easy {0}, hard {2}, junk {1}
    ranks = np.array([[3], [0], [1], [2], [4]])
    gnd = [{"easy": [0], "hard": [2], "junk": [1], "bbx": [0, 0, 1, 1]}]
    got = revisited_map(ranks, gnd, ks=(1, 5))
    # medium: kept 3, 0, 2, 4 -> positives at 0-based 1 and 2:
    # AP = 1/2 [(0 + 1/2)/2 + (1/2 + 2/3)/2] = 5/12; P@1 = 0/1; P@5: k' = min(3, 5) -> 2/3
    assert got["map_medium"] == pytest.approx(5 / 12)
    assert got["mp_at_1_medium"] == 0 and got["mp_at_5_medium"] == pytest.approx(2 / 3)
    # easy: kept 3, 0, 4 (hard 2 ignored); hard: kept 3, 2, 4 (easy 0 ignored): AP = 1/4 each
    assert got["map_easy"] == pytest.approx(1 / 4) and got["map_hard"] == pytest.approx(1 / 4)
    assert got["mp_at_5_easy"] == pytest.approx(1 / 2)
    assert got["num_queries_medium"] == 1 and got["num_skipped_medium"] == 0


def test_perfect_and_worst_rankings():
    gnd = [{"easy": [0, 1], "hard": [], "junk": []}]
    assert revisited_map(np.array([[0], [1], [2], [3]]), gnd)["map_easy"] == 1.0
    worst = revisited_map(np.array([[2], [3], [0], [1]]), gnd)
    # positives at 0-based 2, 3: [(0/2 + 1/3)/2 + (1/3 + 2/4)/2] / 2 = 7/24
    assert worst["map_easy"] == pytest.approx(7 / 24)
    assert average_precision(np.array([0, 1]), 2) == 1.0
    assert average_precision(np.array([0]), 4) == 0.25  # three positives never ranked


def test_queries_without_positives_are_counted_not_averaged():
    ranks = np.array([[0, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3]])
    gnd = [
        {"easy": [1], "hard": [], "junk": [0]},  # only easy: under Hard its positive is ignored
        {"easy": [], "hard": [], "junk": [0, 2]},  # every relevant image is junk
        {"easy": [], "hard": [3], "junk": []},  # only hard: skipped under Easy
    ]
    got = revisited_map(ranks, gnd)
    assert_same(got, reference(ranks, gnd, (1, 5, 10)))
    assert (got["num_queries_easy"], got["num_skipped_easy"]) == (1, 2)
    assert (got["num_queries_medium"], got["num_skipped_medium"]) == (2, 1)
    assert (got["num_queries_hard"], got["num_skipped_hard"]) == (1, 2)
    assert got["map_easy"] == 1.0  # junk 0 removed: easy 1 is first
    # hard: only query 2 counts, its positive 3 is 4th: (0/3 + 1/4) / 2
    assert got["map_hard"] == pytest.approx(1 / 8)
    assert got["map_medium"] == pytest.approx((1 + 1 / 8) / 2)
    alone = revisited_map(ranks[:, 1:2], gnd[1:2])
    assert all(math.isnan(alone[f"map_{p}"]) for p in ("easy", "medium", "hard"))
    assert alone["num_queries_medium"] == 0 and alone["num_skipped_medium"] == 1


@pytest.mark.parametrize("seed", range(12))
def test_matches_loop_reference_on_random_rankings(seed):
    rng = np.random.default_rng(seed)
    num_db, num_queries = int(rng.integers(1, 40)), int(rng.integers(1, 6))
    ranks = np.stack([rng.permutation(num_db) for _ in range(num_queries)], axis=1)
    gnd = []
    for _ in range(num_queries):
        kinds = rng.integers(0, 4, size=num_db)  # 0 easy, 1 hard, 2 junk, 3 negative
        gnd.append(
            {
                key: np.flatnonzero(kinds == i).tolist()
                for i, key in enumerate(("easy", "hard", "junk"))
            }
        )
    ks = (1, 3, 5, 10)
    assert_same(revisited_map(ranks, gnd, ks), reference(ranks, gnd, ks))


def test_truncated_ranking_counts_unranked_positives_as_missed():
    ranks = np.array([[7], [2]])  # top-2 of a larger database
    gnd = [{"easy": [7, 9], "hard": [], "junk": [2]}]
    got = revisited_map(ranks, gnd)
    assert got["map_easy"] == pytest.approx(0.5)  # one of two positives, at the top
    assert_same(got, reference(ranks, gnd, (1, 5, 10)))


def test_torch_ranks_and_evaluate_with_cosine_similarity():
    db = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7], [-1.0, 0.0]])
    queries = torch.tensor([[2.0, 0.1], [0.0, 5.0]])  # scale must not matter (cosine)
    ranks = revisited_ranks(queries, db)
    assert ranks[:, 0].tolist() == [0, 2, 1, 3] and ranks[:, 1].tolist() == [1, 2, 0, 3]
    gnd = [{"easy": [2], "hard": [0], "junk": []}, {"easy": [1], "hard": [], "junk": [2]}]
    got = revisited_evaluate(queries, db.cpu().numpy(), gnd)
    assert_same(got, reference(ranks, gnd, (1, 5, 10)))
    assert_same(revisited_map(torch.from_numpy(ranks), gnd), got)
    # query 0: easy 2 is first once hard 0 is ignored; query 1 has no hard image
    assert got["map_medium"] == 1.0 and got["map_easy"] == 1.0 and got["map_hard"] == 1.0
    assert got["num_skipped_hard"] == 1 and got["num_queries_hard"] == 1
    assert set(got) >= {"map_easy", "map_medium", "map_hard", "mp_at_10_hard", "num_queries_hard"}


@pytest.mark.parametrize(
    "ranks,gnd,ks,match",
    [
        (np.arange(3), [{}], (1,), r"shape \(num_db, num_queries\)"),
        (np.array([[0.0], [1.0]]), [{}], (1,), "integer database indices"),
        (np.array([[0], [0]]), [{}], (1,), "column 0 lists a database index twice"),
        (np.array([[0], [-1]]), [{}], (1,), "negative database index"),
        (np.array([[0], [1]]), [], (1,), "gnd has 0 queries but the ranking has 1"),
        (np.array([[0], [1]]), [{"easy": [0], "hard": []}], (1,), r"gnd\[0\] has no key 'junk'"),
        (
            np.array([[0], [1]]),
            [{"easy": [0], "hard": [0], "junk": []}],
            (1,),
            "both 'easy' and 'hard'",
        ),
        (
            np.array([[0], [1]]),
            [{"easy": [5], "hard": [], "junk": []}],
            (1,),
            r"gnd\[0\]\['easy'\] has index 5",
        ),
        (np.array([[0], [1]]), [{"easy": [-2], "hard": [], "junk": []}], (1,), "negative index"),
        (np.array([[0], [1]]), [{"easy": [0], "hard": [], "junk": []}], (0,), "positive integers"),
        (np.array([[0], [1]]), [{"easy": [0], "hard": [], "junk": []}], (1, 1), "duplicates"),
    ],
)
def test_bad_input(ranks, gnd, ks, match):
    with pytest.raises(ValueError, match=match):
        revisited_map(ranks, gnd, ks)


def test_evaluate_bad_embeddings():
    gnd = [{"easy": [0], "hard": [], "junk": []}]
    with pytest.raises(ValueError, match="dimension 2 but db_embeddings 3"):
        revisited_evaluate(np.ones((1, 2)), np.ones((4, 3)), gnd)
    with pytest.raises(ValueError, match=r"db_embeddings has non-finite values in row\(s\) \[1\]"):
        revisited_evaluate(np.ones((1, 2)), np.array([[1.0, 0], [np.nan, 0]]), gnd)
    with pytest.raises(ValueError, match="query_embeddings must have shape"):
        revisited_evaluate(np.ones(2), np.ones((4, 2)), gnd)
