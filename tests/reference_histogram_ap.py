"""Plain loop references for FastAP and mAP_Q / mAP_T, written from the papers' equations.

FastAP (Cakir et al. CVPR 2019): squared distances of L2-normalized embeddings, centres
c_l = 4 l / L (l = 0..L), kernel max(0, 1 - |d2 - c_l| / (4 / L)); h+/h- per query, H cumulative,
FastAP = (1/N+) sum_l h+_l H+_l / H_l (eq. 14), 0/0 terms = 0.
mAP_Q (Revaud et al. ICCV 2019): cosine similarity s, centres b_m = 1 - (m - 1) 2 / (M - 1),
triangular kernel, first/last bins saturating (eq. 7-8), AP_Q = sum_m P_m c+_m / N+ (eq. 9-11);
tie-aware P_m = (1 + c+_m + 2 C+_{m-1}) / (1 + c_m + 2 C_{m-1}) (eq. 13).

Deliberately slow and obvious: one query, one bin, one item at a time, scalar tensors.
"""

from __future__ import annotations

import torch


def dense_kernel(value, centre, width):
    """Triangular kernel of one scalar value at one bin centre."""
    return torch.clamp(1 - torch.abs(value - centre) / width, min=0)


def _normalize(x):
    return x / x.norm(dim=1, keepdim=True)


def query_lists(n, m, labels, ref_labels, exclude_self, pos_pairs=None, neg_pairs=None):
    """Per query, the reference indices of its positives and negatives."""
    lists = []
    for i in range(n):
        if pos_pairs is not None:
            pos = sorted({j for (a, j) in pos_pairs if a == i and not (exclude_self and j == i)})
            neg = sorted({j for (a, j) in neg_pairs if a == i and not (exclude_self and j == i)})
        else:
            pos = [
                j for j in range(m) if ref_labels[j] == labels[i] and not (exclude_self and j == i)
            ]
            neg = [j for j in range(m) if ref_labels[j] != labels[i]]
        lists.append((pos, neg))
    return lists


def fastap_reference(emb, labels, num_bins, ref_emb=None, ref_labels=None, pairs=None):
    """(loss, per-query AP list with None for skipped queries), loss = 1 - mean over valid."""
    exclude_self = ref_emb is None
    q = _normalize(emb)
    r = q if ref_emb is None else _normalize(ref_emb)
    ref_labels = labels if ref_labels is None else ref_labels
    width = 4.0 / num_bins
    centres = [4.0 * b / num_bins for b in range(num_bins + 1)]
    lists = query_lists(len(q), len(r), labels, ref_labels, exclude_self, *(pairs or (None, None)))
    aps = []
    for i, (pos, neg) in enumerate(lists):
        if not pos or not neg:
            aps.append(None)
            continue
        d2 = {j: ((q[i] - r[j]) ** 2).sum() for j in pos + neg}
        h_pos = [sum(dense_kernel(d2[j], c, width) for j in pos) for c in centres]
        h_neg = [sum(dense_kernel(d2[j], c, width) for j in neg) for c in centres]
        ap = 0
        cum_pos = cum_all = 0
        for b in range(num_bins + 1):
            cum_pos = cum_pos + h_pos[b]
            cum_all = cum_all + h_pos[b] + h_neg[b]
            if float(cum_all.detach()) > 0:
                ap = ap + h_pos[b] * cum_pos / cum_all
        aps.append(ap / len(pos))
    valid = [a for a in aps if a is not None]
    loss = sum(1 - a for a in valid) / len(valid) if valid else torch.zeros(())
    return loss, aps


def quantized_ap_reference(
    emb, labels, num_bins, tie_aware=False, class_balanced=False, ref_emb=None, ref_labels=None
):
    """(loss, per-query AP list), Revaud et al.'s mAP_Q / mAP_T with optional class balance."""
    exclude_self = ref_emb is None
    q = _normalize(emb)
    r = q if ref_emb is None else _normalize(ref_emb)
    ref_labels = labels if ref_labels is None else ref_labels
    delta = 2.0 / (num_bins - 1)
    centres = [1.0 - m * delta for m in range(num_bins)]
    lists = query_lists(len(q), len(r), labels, ref_labels, exclude_self)

    def weight(s, m):
        if m == 0 and float(s.detach()) >= centres[0]:
            return torch.ones_like(s)  # saturating first bin
        if m == num_bins - 1 and float(s.detach()) <= centres[-1]:
            return torch.ones_like(s)  # saturating last bin
        return dense_kernel(s, centres[m], delta)

    aps = []
    for i, (pos, neg) in enumerate(lists):
        if not pos or not neg:
            aps.append(None)
            continue
        s = {j: (q[i] * r[j]).sum() for j in pos + neg}
        c_pos = [sum(weight(s[j], m) for j in pos) for m in range(num_bins)]
        c_all = [c_pos[m] + sum(weight(s[j], m) for j in neg) for m in range(num_bins)]
        ap = 0
        before_pos = before_all = 0
        for m in range(num_bins):
            if tie_aware:
                precision = (1 + c_pos[m] + 2 * before_pos) / (1 + c_all[m] + 2 * before_all)
            else:
                total = before_all + c_all[m]
                precision = (before_pos + c_pos[m]) / total if float(total.detach()) > 0 else 0
            ap = ap + precision * c_pos[m] / len(pos)
            before_pos = before_pos + c_pos[m]
            before_all = before_all + c_all[m]
        aps.append(ap)
    valid_idx = [i for i, a in enumerate(aps) if a is not None]
    if not valid_idx:
        return torch.zeros(()), aps
    if class_balanced:
        classes = [int(labels[i]) for i in valid_idx]
        per_class = {c: classes.count(c) for c in set(classes)}
        weights = [len(valid_idx) / (len(per_class) * per_class[c]) for c in classes]
    else:
        weights = [1.0] * len(valid_idx)
    loss = sum(w * (1 - aps[i]) for w, i in zip(weights, valid_idx)) / len(valid_idx)
    return loss, aps
