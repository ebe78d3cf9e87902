"""Revisited Oxford / Paris evaluation (Radenovic, Iscen, Tolias, Avrithis, Chum, CVPR 2018).

Each query ``q`` has ground truth ``gnd[q]`` with three disjoint lists of database indices:
``easy``, ``hard`` and ``junk`` (the published ``gnd_roxford5k.pkl`` / ``gnd_rparis6k.pkl``, read by
:class:`pml_rank_plugins.data.RevisitedOxfordParis`). The three protocols differ in what counts
as a positive and what is ignored:

=========  ===================  ======================
protocol   positives            ignored (removed)
=========  ===================  ======================
easy       easy                 junk + hard
medium     easy + hard          junk
hard       hard                 junk + easy
=========  ===================  ======================

Ignored images are removed from the ranking (the images below them move up), then, with
``r_1 < r_2 < ... < r_n`` the 0-based positions of the ``n`` ranked positives among the
remaining images and ``N+`` the number of positives in the ground truth, the average precision
is the trapezoidal rule of the original Oxford ``compute_ap``::

    AP = (1 / N+) sum_j (P0_j + P1_j) / 2,   P0_j = (j - 1) / r_j  (1 when r_j = 0),
                                              P1_j = j / (r_j + 1),       j = 1..n

and the precision at ``k`` is the revisited protocol's ``mP@k`` definition: with
``p_j = r_j + 1`` (1-based) and ``k' = min(max_j p_j, k)``, ``P@k = #{j : p_j <= k'} / k'`` (a
query whose positives are all ranked before ``k`` can still reach 1). A positive the ranking does
not contain (a truncated ranking) counts as missed. A query with no positive for a protocol is
excluded from that protocol's means and counted: ``num_queries_<protocol>`` is the number of
queries averaged, ``num_skipped_<protocol>`` the number excluded. A protocol without any query
reports ``nan`` means. Values are fractions in [0, 1] (the paper prints them x 100).

This module is pure numpy/torch: ranking with :func:`revisited_evaluate`, scoring with
:func:`revisited_map`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

PROTOCOLS = ("easy", "medium", "hard")
GROUND_TRUTH_KEYS = ("easy", "hard", "junk")
# protocol -> (lists that are positives, lists that are ignored)
PROTOCOL_LISTS = {
    "easy": (("easy",), ("junk", "hard")),
    "medium": (("easy", "hard"), ("junk",)),
    "hard": (("hard",), ("junk", "easy")),
}


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    """``ks`` as a tuple of distinct positive Python ints, else ``ValueError``."""
    if isinstance(ks, (int, np.integer)) or not isinstance(ks, (Sequence, np.ndarray)):
        raise ValueError(f"ks must be a sequence of positive integers, got {ks!r}")
    out = []
    for k in ks:
        if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"ks must hold positive integers, got {k!r} in {list(ks)}")
        out.append(int(k))
    if len(set(out)) != len(out):
        raise ValueError(f"ks has duplicates: {out}")
    return tuple(out)


def _index_list(entry: Mapping, where: str, key: str, num_db: int | None, range_name: str):
    """``entry[key]`` as a 1-D int64 array of distinct indices in ``[0, num_db)``."""
    values = np.asarray(entry[key])
    if values.size == 0:
        return np.zeros(0, np.int64)
    if values.ndim != 1 or not (
        np.issubdtype(values.dtype, np.integer)
        or (np.issubdtype(values.dtype, np.floating) and np.all(np.mod(values, 1) == 0))
    ):
        raise ValueError(f"{where}[{key!r}] must be a flat list of integer indices")
    values = values.astype(np.int64)
    if num_db is None:
        if (values < 0).any():
            raise ValueError(f"{where}[{key!r}] has negative index {int(values.min())}")
    else:
        bad = values[(values < 0) | (values >= num_db)]
        if len(bad):
            raise ValueError(
                f"{where}[{key!r}] has index {int(bad[0])}, outside {range_name} "
                f"(0..{num_db - 1})"
            )
    if len(np.unique(values)) != len(values):
        raise ValueError(f"{where}[{key!r}] lists an index twice")
    return values


def check_ground_truth_entry(
    entry: Mapping, where: str, num_db: int | None = None, range_name: str = "the database"
) -> dict[str, np.ndarray]:
    """One query's ``easy``/``hard``/``junk`` lists, validated: the one ground-truth check used
    by :func:`revisited_map` and by the dataset reader
    (:class:`pml_rank_plugins.data.RevisitedOxfordParis`).

    Args:
        entry: the query's mapping (other keys such as ``bbx`` are ignored here).
        where: how messages name the entry, e.g. ``"gnd[3]"``.
        num_db: database size when known: indices must lie in ``0..num_db - 1`` (else only
            non-negative).
        range_name: how messages name that range (e.g. ``"'imlist'"``).

    Returns:
        ``{"easy", "hard", "junk"}`` -> int64 arrays, pairwise disjoint.

    Raises:
        ValueError: naming ``where``, the list and the problem (missing key, not a flat integer
            list, an index out of range or repeated, a shared index).
    """
    if not isinstance(entry, Mapping):
        raise ValueError(f"{where} must be a dict, got {type(entry).__name__}")
    for key in GROUND_TRUTH_KEYS:
        if key not in entry:
            raise ValueError(
                f"{where} has no key {key!r} (keys: {sorted(map(str, entry))}); "
                "each query needs 'easy', 'hard' and 'junk' index lists"
            )
    lists = {key: _index_list(entry, where, key, num_db, range_name) for key in GROUND_TRUTH_KEYS}
    for i, a in enumerate(GROUND_TRUTH_KEYS):
        for b in GROUND_TRUTH_KEYS[i + 1 :]:
            common = np.intersect1d(lists[a], lists[b])
            if len(common):
                raise ValueError(
                    f"{where}: index {int(common[0])} is in both {a!r} and {b!r}; "
                    "the lists must be disjoint"
                )
    return lists


def _ground_truth(gnd: Sequence[Mapping], num_queries: int) -> list[dict[str, np.ndarray]]:
    """Validated ``easy``/``hard``/``junk`` arrays per query (pairwise disjoint)."""
    if isinstance(gnd, Mapping) or not isinstance(gnd, Sequence):
        raise ValueError("gnd must be a list with one dict per query (the pickle's 'gnd' entry)")
    if len(gnd) != num_queries:
        raise ValueError(f"gnd has {len(gnd)} queries but the ranking has {num_queries} columns")
    return [check_ground_truth_entry(entry, f"gnd[{q}]") for q, entry in enumerate(gnd)]


def _as_ranks(ranks) -> np.ndarray:
    if isinstance(ranks, torch.Tensor):
        ranks = ranks.detach().cpu().numpy()
    ranks = np.asarray(ranks)
    if ranks.ndim != 2 or ranks.shape[0] == 0:
        raise ValueError(
            "ranks must have shape (num_db, num_queries) with num_db >= 1 (database indices "
            f"sorted by decreasing similarity, one column per query), got {ranks.shape}"
        )
    if not np.issubdtype(ranks.dtype, np.integer) or isinstance(ranks.flat[0], np.bool_):
        raise ValueError(f"ranks must hold integer database indices, got dtype {ranks.dtype}")
    ranks = ranks.astype(np.int64)
    if (ranks < 0).any():
        raise ValueError(f"ranks has a negative database index {int(ranks.min())}")
    ordered = np.sort(ranks, axis=0)
    repeated = np.flatnonzero((ordered[1:] == ordered[:-1]).any(axis=0))
    if len(repeated):
        raise ValueError(f"ranks column {int(repeated[0])} lists a database index twice")
    return ranks


def average_precision(positions: np.ndarray, num_positives: int) -> float:
    """Oxford ``compute_ap``: trapezoidal AP from the sorted 0-based ``positions`` of the ranked
    positives (ignored images already removed) and the ground-truth count ``num_positives``. O(n).
    """
    positions = np.asarray(positions, dtype=np.float64)
    j = np.arange(len(positions), dtype=np.float64)
    before = np.where(positions == 0, 1.0, j / np.maximum(positions, 1.0))
    after = (j + 1.0) / (positions + 1.0)
    return float((before + after).sum() / (2.0 * num_positives))


def _positions(column: np.ndarray, positives: np.ndarray, ignored: np.ndarray) -> np.ndarray:
    """Sorted 0-based positions of ``positives`` in ``column`` once ``ignored`` are removed."""
    positive_at = np.flatnonzero(np.isin(column, positives))
    ignored_at = np.flatnonzero(np.isin(column, ignored))
    # Each positive moves up by the number of ignored images ranked above it.
    return positive_at - np.searchsorted(ignored_at, positive_at)


def revisited_map(ranks, gnd: Sequence[Mapping], ks: Sequence[int] = (1, 5, 10)) -> dict:
    """mAP and mP@k of a ranking under the Easy, Medium and Hard revisited protocols.

    Args:
        ranks: ``(num_db, num_queries)`` integer array (numpy or torch): column ``q`` lists
            database indices by decreasing similarity to query ``q`` (all of them, or a
            truncated top list: positives it lacks count as missed).
        gnd: one mapping per query with index lists ``easy``, ``hard``, ``junk`` (pairwise
            disjoint; other keys such as ``bbx`` are ignored).
        ks: the cut-offs of mP@k.

    Returns:
        A flat dict with ``map_<p>``, ``mp_at_<k>_<p>`` (floats, ``nan`` when no query counts),
        ``num_queries_<p>`` (queries averaged) and ``num_skipped_<p>`` (queries without a positive
        under protocol ``p``, excluded), for ``p`` in easy, medium, hard.

    Raises ``ValueError`` naming the problem (shape, repeated index, missing key, overlapping
    lists, an index outside a complete ranking). O(num_queries num_db log num_db).
    """
    ks = _check_ks(ks)
    ranks = _as_ranks(ranks)
    num_db, num_queries = ranks.shape
    truth = _ground_truth(gnd, num_queries)
    if (ranks < num_db).all():  # distinct values in [0, num_db): every column ranks the whole db
        for query, lists in enumerate(truth):
            for key, values in lists.items():
                if len(values) and values.max() >= num_db:
                    raise ValueError(
                        f"gnd[{query}][{key!r}] has index {int(values.max())}, but the ranking "
                        f"covers a database of {num_db} images"
                    )
    result: dict = {}
    for protocol in PROTOCOLS:
        positive_keys, ignored_keys = PROTOCOL_LISTS[protocol]
        aps, precisions, skipped = [], [], 0
        for query, lists in enumerate(truth):
            positives = np.concatenate([lists[key] for key in positive_keys])
            if len(positives) == 0:
                skipped += 1
                continue
            ignored = np.concatenate([lists[key] for key in ignored_keys])
            positions = _positions(ranks[:, query], positives, ignored)
            aps.append(average_precision(positions, len(positives)))
            ranked = positions + 1
            row = []
            for k in ks:
                cut = min(int(ranked.max()), k) if len(ranked) else k
                row.append((ranked <= cut).sum() / cut)
            precisions.append(row)
        counted = len(aps)
        result[f"map_{protocol}"] = float(np.mean(aps)) if counted else float("nan")
        means = np.mean(precisions, axis=0) if counted else [float("nan")] * len(ks)
        for k, value in zip(ks, means):
            result[f"mp_at_{k}_{protocol}"] = float(value)
        result[f"num_queries_{protocol}"] = counted
        result[f"num_skipped_{protocol}"] = skipped
    return result


def _as_matrix(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x))
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must have shape (N, D) with N, D >= 1, got {tuple(x.shape)}")
    if x.dtype == torch.bool or x.is_complex():
        raise ValueError(f"{name} must be real numbers, got {x.dtype}")
    x = x.detach().to("cpu", torch.float64)
    bad = torch.nonzero(~torch.isfinite(x).all(dim=1)).flatten()
    if len(bad):
        raise ValueError(f"{name} has non-finite values in row(s) {bad[:5].tolist()}")
    # Same convention as torch.nn.functional.normalize / PML: a zero row stays zero.
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def revisited_ranks(query_embeddings, db_embeddings) -> np.ndarray:
    """``(num_db, num_queries)`` database indices by decreasing cosine similarity per query.

    Computed in float64; ties keep the database order (stable sort). O(num_db num_queries D)
    time, O(num_db num_queries) memory.
    """
    queries = _as_matrix(query_embeddings, "query_embeddings")
    database = _as_matrix(db_embeddings, "db_embeddings")
    if queries.shape[1] != database.shape[1]:
        raise ValueError(
            f"query_embeddings have dimension {queries.shape[1]} but db_embeddings "
            f"{database.shape[1]}"
        )
    similarity = (database @ queries.T).numpy()
    return np.argsort(-similarity, axis=0, kind="stable")


def revisited_evaluate(
    query_embeddings, db_embeddings, gnd: Sequence[Mapping], ks: Sequence[int] = (1, 5, 10)
) -> dict[str, float]:
    """Rank the database by cosine similarity to each query and score it with
    :func:`revisited_map`.

    Args:
        query_embeddings: ``(num_queries, D)`` (torch or numpy), row ``q`` for ``gnd[q]``.
        db_embeddings: ``(num_db, D)``, row ``i`` for database index ``i``.
        gnd: per-query ``easy``/``hard``/``junk`` index lists (``RevisitedOxfordParis.gnd``).
        ks: cut-offs of mP@k.

    Returns the flat dict of :func:`revisited_map` (``map_easy``, ``map_medium``, ``map_hard``,
    ``mp_at_<k>_<protocol>``, ``num_queries_<protocol>``, ``num_skipped_<protocol>``).
    """
    ks = _check_ks(ks)
    return revisited_map(revisited_ranks(query_embeddings, db_embeddings), gnd, ks)
