"""Parameters of the Ranked List Loss (Wang et al., "Ranked List Loss for Deep Metric Learning",
CVPR 2019): their checks, PML's default ``alpha``, the two parametrizations of the term weights,
the checks that the loss stays representable in the compute dtype, and the checks every kernel
runs first (:func:`checked_params`, :func:`check_embedding_pair`, :func:`check_dist_masks`).

Notation as in :mod:`~pml_rank_plugins.functional.ranked_list.reference`: negative boundary
``alpha``, margin ``m`` (positives pulled within ``alpha - m``), temperatures ``Tn`` (eq. 9) and ``Tp``
(positive twin, journal version), ``L = lam_pos L_P + lam L_N`` (eq. 13, ``lam_pos = 1`` in the
paper). Shared by the dense and chunked kernels, the loss and the miner. All O(1) except
:func:`check_loss_finite` (O(N)). Pure torch, no PML import.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..query_weighting import check_query_weighting


class ChunkParams(NamedTuple):
    """The kernel's parameters as plain floats (``alpha``, ``m``, ``Tn``, ``Tp``, ``lam``,
    ``lam_pos`` as in :func:`~pml_rank_plugins.functional.ranked_list.reference.ranked_list_terms`).
    """

    alpha: float
    margin: float
    Tn: float
    Tp: float = 0.0
    lam: float = 1.0
    lam_pos: float = 1.0
    share: bool = False  # query_weighting == "weight_share": also compute log W per query


def checked_params(*values: float, query_weighting: str = "mean") -> ChunkParams:
    """``values`` (``alpha, margin, Tn`` and optionally ``Tp, lam, lam_pos``, in the order of
    :func:`check_rll_params`) checked by it, then ``query_weighting`` by
    ``check_query_weighting``; returned as a :class:`ChunkParams` of floats (``share``:
    ``"weight_share"``). The first step of every kernel and miner. O(1)."""
    check_rll_params(*values)
    share = check_query_weighting(query_weighting) == "weight_share"
    return ChunkParams(*(float(value) for value in values), share=share)


def check_embedding_pair(queries: torch.Tensor, refs: torch.Tensor) -> None:
    """``ValueError`` unless ``queries`` ``(N, d)`` and ``refs`` ``(M, d)`` are 2-D of one width
    and one floating dtype (the Euclidean kernels' inputs). Reads no value."""
    if queries.ndim != 2 or refs.ndim != 2 or queries.shape[1] != refs.shape[1]:
        raise ValueError(
            f"need (N, d) queries and (M, d) refs, got {tuple(queries.shape)}, {tuple(refs.shape)}"
        )
    if queries.dtype != refs.dtype or not queries.dtype.is_floating_point:
        raise ValueError(
            f"queries and refs must share one float dtype, got {queries.dtype}, {refs.dtype}"
        )


def check_dist_masks(dist: torch.Tensor, pos_mask: torch.Tensor, neg_mask: torch.Tensor) -> None:
    """``ValueError`` unless ``dist``, ``pos_mask`` and ``neg_mask`` share one ``(N, M)`` shape
    (the dense kernels' inputs). Reads no value."""
    if dist.ndim != 2 or pos_mask.shape != dist.shape or neg_mask.shape != dist.shape:
        raise ValueError(
            f"dist, pos_mask and neg_mask must share one (N, M) shape, got {tuple(dist.shape)}, "
            f"{tuple(pos_mask.shape)}, {tuple(neg_mask.shape)}"
        )


def check_rll_params(
    alpha: float,
    margin: float,
    Tn: float,
    Tp: float = 0.0,
    lam: float = 1.0,
    lam_pos: float = 1.0,
) -> None:
    """Raise ``ValueError`` unless ``alpha > margin >= 0``, ``Tn, Tp, lam, lam_pos >= 0``, all
    finite real numbers (bools refused)."""
    values = {"alpha": alpha, "margin": margin, "Tn": Tn, "Tp": Tp, "lam": lam, "lam_pos": lam_pos}
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"{name} must be a real number, got {value!r}")
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{name} must be finite, got {value}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if alpha <= margin:
        raise ValueError(
            f"alpha must be larger than margin (positive boundary alpha - margin > 0), "
            f"got alpha={alpha}, margin={margin}"
        )
    for name in ("Tn", "Tp", "lam", "lam_pos"):
        if values[name] < 0:
            raise ValueError(f"{name} must be >= 0, got {values[name]}")


def _real(value, name: str) -> float:
    """``value`` as a float if it is a finite real number (bools refused), else ``ValueError``."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def default_alpha(margin: float, alpha: float | None) -> float:
    """``alpha``, or PML's default ``1 + margin / 2`` when it is ``None`` (1.2 for the paper's
    ``margin = 0.4``). ``margin`` itself is checked by :func:`check_rll_params`."""
    if alpha is not None:
        return alpha
    return 1.0 + _real(margin, "margin") / 2.0


def term_weights(imbalance: float | None, lam: float | None) -> tuple[float, float]:
    """``(lam_pos, lam)``, the weights of ``L_P`` and ``L_N``, from one of the two
    parametrizations.

    Args:
        imbalance: PML's ``b`` in ``[0, 1]``: ``(1 - b) L_P + b L_N``, i.e. ``(1 - b, b)``
            (``(1 - b) *`` the paper's loss with ``lam = b / (1 - b)``), or ``None``.
        lam: the paper's eq. 13 ``L_P + lam L_N``, i.e. ``(1, lam)``, or ``None`` (1).

    Returns:
        ``(lam_pos, lam)`` as floats.

    Raises:
        ValueError: both given (naming both and the conversion), or ``imbalance`` outside
            ``[0, 1]`` (also hinting at the positional order, since the old one put ``Tn``
            third).
    """
    if imbalance is not None and lam is not None:
        raise ValueError(
            f"pass either imbalance (PML: (1 - imbalance) L_P + imbalance L_N) or lam (paper: "
            f"L_P + lam L_N), not both: got imbalance={imbalance!r}, lam={lam!r}; imbalance=b is "
            "(1 - b) * the loss with lam=b / (1 - b)"
        )
    if imbalance is None:
        return 1.0, 1.0 if lam is None else lam
    b = _real(imbalance, "imbalance")
    if not 0.0 <= b <= 1.0:
        raise ValueError(
            f"imbalance must be in [0, 1], got {b:g} (the positional order is PML's: margin, Tn, "
            "imbalance, alpha, Tp; pass alpha=... by keyword)"
        )
    return 1.0 - b, b


def check_loss_range(dtype: torch.dtype, alpha: float, lam: float, lam_pos: float = 1.0) -> None:
    """Raise ``ValueError`` naming ``alpha`` / ``lam`` / ``lam_pos`` if one is not representable
    in the compute ``dtype`` (it would round to ``inf`` and make the loss or its gradient
    inf/NaN)."""
    big = torch.finfo(dtype).max
    for name, value in (("alpha", alpha), ("lam", lam), ("lam_pos", lam_pos)):
        if value > big:
            raise ValueError(
                f"{name}={value:g} exceeds the largest {dtype} ({big:.4g}): the loss would "
                f"overflow; use a smaller {name} or float64 embeddings"
            )


def check_loss_finite(value: torch.Tensor, alpha: float, lam: float) -> None:
    """Raise ``ValueError`` if the per-query losses (or their sum, which the mean reduction
    forms) overflow: inputs are finite and weights normalized, so only large ``lam * L_N``
    (``L_N <= alpha``) or huge distances can get there. O(N)."""
    if not torch.isfinite(value.sum()):
        big = torch.finfo(value.dtype).max
        raise ValueError(
            f"the Ranked List Loss overflows {value.dtype} (largest {big:.4g}): per-query losses "
            f"reach L_P + lam * L_N with lam={lam:g}, L_N <= alpha={alpha:g}; use a smaller lam "
            "or alpha, smaller distances, or float64 embeddings"
        )


__all__ = [
    "ChunkParams",
    "check_dist_masks",
    "check_embedding_pair",
    "check_loss_finite",
    "check_loss_range",
    "check_rll_params",
    "checked_params",
    "default_alpha",
    "term_weights",
]
