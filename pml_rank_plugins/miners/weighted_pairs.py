"""A PML pair tuple ``(a1, p, a2, n)`` that also carries one weight per negative pair."""

from __future__ import annotations

import torch


class WeightedPairs(tuple):
    """``(a1, p, a2, n)`` with ``.weights``: a float tensor aligned with the negative pairs.

    It is a plain 4-tuple to everything in PML (``BaseMiner.output_assertion``,
    ``lmu.convert_to_pairs``, every pair loss), so losses that do not know about ``.weights``
    simply ignore it. ``weights[k]`` is the weight of the pair ``(a2[k], n[k])``.
    """

    weights: torch.Tensor

    def __new__(cls, a1, p, a2, n, weights: torch.Tensor) -> "WeightedPairs":
        if len(weights) != len(a2) or len(n) != len(a2) or len(a1) != len(p):
            raise ValueError(
                f"mismatched lengths: a1={len(a1)}, p={len(p)}, a2={len(a2)}, n={len(n)}, "
                f"weights={len(weights)} (weights are aligned with the negative pairs (a2, n))"
            )
        obj = super().__new__(cls, (a1, p, a2, n))
        obj.weights = weights
        return obj

    def __reduce__(self):
        return (type(self), (*self, self.weights))

    def __repr__(self) -> str:
        return f"WeightedPairs({tuple.__repr__(self)}, weights={self.weights!r})"
