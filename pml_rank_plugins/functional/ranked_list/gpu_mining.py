"""RLL's non-trivial pair mining for accelerators (the ``gpu`` backend of
:class:`~pml_rank_plugins.miners.RankedListMiner`), with one host synchronisation per call.

A miner returns index tuples ``(a1, p, a2, n)`` whose lengths depend on the data, so the host
must learn them: that one read is unavoidable (PML's miners read them through ``nonzero`` /
boolean indexing, one sync each). Here it happens once per call, whatever the number of chunks:

1. pass 1, per chunk (the ``gpu`` chunk rule of
   :func:`~pml_rank_plugins.functional.ranked_list.gpu.chunk_rows_for`): distances, mined masks
   ``pos & (d > alpha - m)``, ``neg & (d < alpha)`` and the normalized negative weights
   ``exp(Tn (min - d)) / sum`` (eqs. 9, 12); the chunk's two counts stay on the device;
2. :func:`host_counts`: every chunk's counts in one device-to-host copy (the sync);
3. pass 2, per chunk: ``torch.nonzero_static`` with the now known sizes (no sync) gives the
   pairs, sorted by anchor as ``nonzero`` would; with one chunk pass 1's masks are reused, with
   several each chunk is recomputed (bit-identical), so memory stays O(chunk x M).

Time O(N M d) (twice with several chunks); memory O(chunk x M) + the output. Pure torch.

Under ``torch.compile``: with ``fullgraph=True`` dynamo captures the counts' ``.tolist()`` as
data-dependent (unbacked) sizes, so the miner is part of one graph (the read still happens when
the graph runs, so a CUDA graph cannot capture it); a default compile breaks the graph at
:func:`host_counts` instead.
"""

from __future__ import annotations

from typing import Optional

import torch

from .gpu import chunk_rows_for
from .gpu_steps import inverse_or_zero, masked_exp, mine
from .params import checked_params


def host_counts(counts: torch.Tensor) -> list[list[int]]:
    """The miner's one host read: ``counts`` (a small int64 tensor of mined-pair counts) as
    Python ints, in a single device-to-host copy."""
    return counts.cpu().tolist()


def _mined_masks(dist, pos, neg, Tn: float):
    """``(pos, neg, w, inv)``: the unnormalized ``Tn`` weights of the mined negatives and their
    inverse row sums (``cpu.chunked_ranked_list_mining``'s values)."""
    w = masked_exp(dist, neg, Tn, -1.0)
    return pos, neg, w, inverse_or_zero(w.sum(1))


def _pairs(masks, sizes, start: int):
    """``(a1, p, a2, n, weights)`` of one chunk from its masks and known pair counts."""
    pos, neg, w, inv = masks
    ap = torch.nonzero_static(pos, size=sizes[0])
    an = torch.nonzero_static(neg, size=sizes[1])
    a2, ng = an[:, 0], an[:, 1]
    weights = w[a2, ng] * inv[a2]
    return ap[:, 0] + start, ap[:, 1], a2 + start, ng, weights


def _cat(parts):
    """The chunks' ``(a1, p, a2, n, weights)`` joined (one chunk: as is)."""
    if len(parts) == 1:
        return parts[0]
    return tuple(torch.cat(column) for column in zip(*parts))


def gpu_ranked_list_mining(
    queries: torch.Tensor,
    refs: torch.Tensor,
    pairs,
    alpha: float = 1.2,
    margin: float = 0.4,
    Tn: float = 10.0,
    chunk_size: Optional[int] = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(a1, p, a2, n, weights)``: RLL's non-trivial pairs of ``queries`` ``(N, d)`` against
    ``refs`` ``(M, d)`` (Euclidean) with candidates from ``pairs`` (a
    :class:`~pml_rank_plugins.functional.ranked_list.gpu_steps.LabelPairs` or
    :class:`~pml_rank_plugins.functional.ranked_list.gpu_steps.DensePairs`), sorted by anchor,
    and each mined negative's normalized weight; the values of
    :func:`~pml_rank_plugins.functional.ranked_list.cpu.chunked_ranked_list_mining`. No
    gradient. One host synchronisation (see the module docstring)."""
    params = checked_params(alpha, margin, Tn)
    n, m = len(queries), len(refs)
    chunk_rows = chunk_rows_for(n, m, chunk_size, queries)
    starts = range(0, max(n, 1), chunk_rows)  # one (empty) chunk when N = 0
    single = len(starts) == 1
    with torch.no_grad(), torch.autocast(queries.device.type, enabled=False):
        ref_sq = (refs * refs).sum(1)

        def chunk(start: int):
            stop = min(start + chunk_rows, n)
            q = queries if single else queries[start:stop]
            return _mined_masks(*mine(q, refs, ref_sq, pairs.candidates(start, stop), params), Tn)

        kept, counts = None, []
        for start in starts:
            masks = chunk(start)
            counts.append(torch.stack([masks[0].sum(), masks[1].sum()]))
            kept = masks if single else None
        sizes = host_counts(torch.stack(counts))
        parts = [
            _pairs(kept if single else chunk(start), size, start)
            for start, size in zip(starts, sizes)
        ]
    return _cat(parts)


def gpu_mining_from_dist(
    dist: torch.Tensor, pairs, alpha: float = 1.2, margin: float = 0.4, Tn: float = 10.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`gpu_ranked_list_mining` on a precomputed ``(N, M)`` distance matrix (any PML
    distance object): one chunk, one host read. O(N M)."""
    params = checked_params(alpha, margin, Tn)
    with torch.no_grad():
        d = dist.detach()
        cand_pos, cand_neg = pairs.candidates(0, len(d))
        pos = torch.gt(d, params.alpha - params.margin).logical_and_(cand_pos)
        neg = torch.lt(d, params.alpha).logical_and_(cand_neg)
        masks = _mined_masks(d, pos, neg, params.Tn)
        (sizes,) = host_counts(torch.stack([pos.sum(), neg.sum()]).unsqueeze(0))
        return _pairs(masks, sizes, 0)


__all__ = ["gpu_mining_from_dist", "gpu_ranked_list_mining", "host_counts"]
