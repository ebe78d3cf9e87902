"""Plain loop references for the Ranked List Loss, written from the paper's equations.

Wang et al., CVPR 2019: pairwise margin loss (eq. 8), non-trivial mining, negative weights
exp(T (alpha - d)) normalized over the mined negatives (eqs. 9, 12), L_P (eq. 11, with the
journal version's positive weights exp(Tp (d - (alpha - m)))), L = L_P + lam L_N (eq. 13).
Weights are constants (Python floats): the gradient flows through d only.

Query weighting: "mean" is eq. 14 (each query 1/N). "weight_share" is the authors' released Caffe
layer (DistanceWeightedValidPairLossV12,
CaffeMex_RLL_GR_V03_Simp/src/caffe/layers/distance_weighted_valid_pair_loss_V12_layer.cpp in
github.com/XinshaoAmosWang/Ranked-List-Loss-for-DML): query i counts c_i = 0.5 W_i / sum_k W_k,
W_i = sum of its unnormalized mined pair weights; the per-query references return N c_i L_i so
that their mean is sum_i c_i L_i. :func:`reference_caffe_v12_gradient` follows that layer's
backward pair by pair instead (unordered pairs, each end scaled separately), an independent
route to the same gradient.

Deliberately slow and obvious: one query at a time, one pair at a time, scalars only.
"""

from __future__ import annotations

import math

import torch


def _query_loss(pos_d, neg_d, alpha, margin, Tn, Tp, lam):
    """L_P + lam L_N of one query from its lists of mined distances (0-d tensors)."""
    b = alpha - margin
    loss_p = 0.0
    if pos_d:
        wp = [math.exp(Tp * (d.item() - b)) for d in pos_d]
        loss_p = sum(w * (d - b) for w, d in zip(wp, pos_d, strict=True)) / sum(wp)
    loss_n = 0.0
    if neg_d:
        wn = [math.exp(Tn * (alpha - d.item())) for d in neg_d]
        loss_n = sum(w * (alpha - d) for w, d in zip(wn, neg_d, strict=True)) / sum(wn)
    return loss_p, loss_n, loss_p + lam * loss_n


def _weight_sum(pos_d, neg_d, alpha, margin, Tn, Tp):
    """W: the query's unnormalized pair weights exp(Tp (d - (alpha - m))) + exp(Tn (alpha - d))
    summed over its mined positives and negatives (a Python float)."""
    b = alpha - margin
    return sum(math.exp(Tp * (d.item() - b)) for d in pos_d) + sum(
        math.exp(Tn * (alpha - d.item())) for d in neg_d
    )


def _query_factors(weight_sums, query_weighting):
    """Per-query factor on L_i: 1 ("mean") or N * 0.5 W_i / sum_k W_k ("weight_share")."""
    if query_weighting == "mean":
        return [1.0] * len(weight_sums)
    assert query_weighting == "weight_share", query_weighting
    total = sum(weight_sums)
    if total == 0:
        return [0.0] * len(weight_sums)
    return [len(weight_sums) * 0.5 * w / total for w in weight_sums]


def _value(v):
    return v.item() if torch.is_tensor(v) else float(v)


def reference_terms_from_dist(
    dist, pos_mask, neg_mask, alpha, margin, Tn, Tp=0.0, lam=1.0, query_weighting="mean"
):
    """Per-query (loss, L_P, L_N, n_pos, n_neg) lists from a distance matrix, by loops
    (loss times N c_i under "weight_share"; L_P, L_N unweighted)."""
    out, weight_sums = [], []
    for i in range(dist.shape[0]):
        pos_d, neg_d = [], []
        for j in range(dist.shape[1]):
            d = dist[i, j]
            if pos_mask[i, j] and d.item() > alpha - margin:
                pos_d.append(d)
            if neg_mask[i, j] and d.item() < alpha:
                neg_d.append(d)
        lp, ln, loss = _query_loss(pos_d, neg_d, alpha, margin, Tn, Tp, lam)
        out.append((loss, _value(lp), _value(ln), len(pos_d), len(neg_d)))
        weight_sums.append(_weight_sum(pos_d, neg_d, alpha, margin, Tn, Tp))
    factors = _query_factors(weight_sums, query_weighting)
    return [(f * row[0],) + row[1:] for f, row in zip(factors, out, strict=True)]


def reference_rll(
    x,
    labels,
    ref=None,
    ref_labels=None,
    *,
    alpha=1.2,
    margin=0.4,
    Tn=10.0,
    Tp=0.0,
    lam=1.0,
    gallery_gradient=False,
    allowed_pos=None,
    allowed_neg=None,
    query_weighting="mean",
):
    """Per-query RLL losses (list of 0-d tensors) of embeddings ``x`` against ``ref``.

    ``ref=None``: the batch is its own gallery, self-pairs skipped. Distances are Euclidean
    between L2-normalized vectors. ``gallery_gradient=False``: in query i's list the gallery
    vector is detached, so only x_i gets gradient from its own list (paper sec. 3.2).
    ``allowed_pos`` / ``allowed_neg``: optional sets of (i, j) restricting the lists (mined pairs).
    ``query_weighting``: "mean" (L_i) or "weight_share" (N c_i L_i, see the module docstring).
    """
    self_mode = ref is None
    if self_mode:
        ref, ref_labels = x, labels
    losses, weight_sums = [], []
    for i in range(len(x)):
        q = x[i] / torch.sqrt((x[i] ** 2).sum())
        pos_d, neg_d = [], []
        for j in range(len(ref)):
            if self_mode and j == i:
                continue
            g = ref[j] / torch.sqrt((ref[j] ** 2).sum())
            if not gallery_gradient:
                g = g.detach()
            d = torch.sqrt(((q - g) ** 2).sum())
            if labels[i] == ref_labels[j]:
                if allowed_pos is not None and (i, j) not in allowed_pos:
                    continue
                if d.item() > alpha - margin:
                    pos_d.append(d)
            else:
                if allowed_neg is not None and (i, j) not in allowed_neg:
                    continue
                if d.item() < alpha:
                    neg_d.append(d)
        losses.append(x.new_zeros(()) + _query_loss(pos_d, neg_d, alpha, margin, Tn, Tp, lam)[2])
        weight_sums.append(_weight_sum(pos_d, neg_d, alpha, margin, Tn, Tp))
    factors = _query_factors(weight_sums, query_weighting)
    return [f * loss for f, loss in zip(factors, losses, strict=True)]


def reference_caffe_v12_gradient(x, labels, margin=0.4, Tn=10.0, Tp=0.0):
    """The gradient the authors' Caffe layer (DistanceWeightedValidPairLossV12) gives the
    features ``x`` (``(N, D)``, the layer's input: already L2-normalized), pair by pair.

    Its facts, restated: boundaries 1 - m/2 (positives) and 1 + m/2 (negatives); over unordered
    pairs (a, b), a < b, the pair weight is base^(T v), base e here (the released configs leave
    the layer's base at its default, recorded as 2.71828), v = d - (1 - m/2) with T = Tp for a
    same-label pair, v = (1 + m/2) - d with T = Tn otherwise, and 0 when v <= 0; S+_i / S-_i
    sum the positive / negative weights of the pairs touching i; W = sum_i (S+_i + S-_i). Each
    end e of a pair gets 0.5 w / S^{sign}_e * (S+_e + S-_e) / W times the pair's unit gradient,
    +-(x_e - x_other) / d (+ for positives: pull together; - for negatives: push apart). The
    layer's 1e-8 added to each sum and 1e-6 to d are left out. Returns a float64 ``(N, D)``
    tensor.
    """
    x = x.detach().double()
    n = len(x)
    pos_thr, neg_thr = 1.0 - margin / 2.0, 1.0 + margin / 2.0
    pairs = []
    s_pos, s_neg = [0.0] * n, [0.0] * n
    for a in range(n):
        for b in range(a + 1, n):
            d = math.sqrt(sum((x[a, k].item() - x[b, k].item()) ** 2 for k in range(x.shape[1])))
            same = bool(labels[a] == labels[b])
            v = d - pos_thr if same else neg_thr - d
            w = math.exp((Tp if same else Tn) * v) if v > 0 else 0.0
            pairs.append((a, b, d, same, w))
            sums = s_pos if same else s_neg
            sums[a] += w
            sums[b] += w
    total = sum(s_pos) + sum(s_neg)
    grad = torch.zeros_like(x)
    for a, b, d, same, w in pairs:
        if w == 0.0:
            continue
        sums = s_pos if same else s_neg
        sign = 1.0 if same else -1.0
        for end, other in ((a, b), (b, a)):
            weight = 0.5 * w / sums[end] * (s_pos[end] + s_neg[end]) / total
            grad[end] += weight * sign * (x[end] - x[other]) / d
    return grad
