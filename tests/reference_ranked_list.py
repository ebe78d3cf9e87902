"""Plain loop references for the Ranked List Loss, written from the paper's equations.

Wang et al., CVPR 2019: pairwise margin loss (eq. 8), non-trivial mining, negative weights
exp(T (alpha - d)) normalized over the mined negatives (eqs. 9, 12), L_P (eq. 11, with the
journal version's positive weights exp(Tp (d - (alpha - m)))), L = L_P + lam L_N (eq. 13).
Weights are constants (Python floats): the gradient flows through d only.

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


def _value(v):
    return v.item() if torch.is_tensor(v) else float(v)


def reference_terms_from_dist(dist, pos_mask, neg_mask, alpha, margin, Tn, Tp=0.0, lam=1.0):
    """Per-query (loss, L_P, L_N, n_pos, n_neg) lists from a distance matrix, by loops."""
    out = []
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
    return out


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
):
    """Per-query RLL losses (list of 0-d tensors) of embeddings ``x`` against ``ref``.

    ``ref=None``: the batch is its own gallery, self-pairs skipped. Distances are Euclidean
    between L2-normalized vectors. ``gallery_gradient=False``: in query i's list the gallery
    vector is detached, so only x_i gets gradient from its own list (paper sec. 3.2).
    ``allowed_pos`` / ``allowed_neg``: optional sets of (i, j) restricting the lists (mined pairs).
    """
    self_mode = ref is None
    if self_mode:
        ref, ref_labels = x, labels
    losses = []
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
    return losses
