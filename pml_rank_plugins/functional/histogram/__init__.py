"""The soft-histogram AP family (FastAP, mAP_Q / mAP_T): one module a backend, one dispatch point.

* :mod:`.reference`: the equations, AP from positive/negative histograms (FastAP eq. 14, Revaud
  et al. eq. 9-13) and the exact AP used as ground truth.
* :mod:`.cpu`: the chunked CPU kernel of the histograms (two-bin interpolation fused with
  ``Q R^T``, threads over chunks); the ``cpu`` backend, bit-identical to earlier releases.
* :mod:`.gpu`: the same histograms for an accelerator, sync-free, chunked from a fixed budget.
* :mod:`.triton_kernel` (kernels in :mod:`.triton_jit`, launches in :mod:`.triton_launch`,
  the ``torch.library`` custom ops ``pml_rank::`` that ``torch.compile`` sees in
  :mod:`.triton_ops`): the fused Triton kernel.
* :mod:`.sync_free`, :mod:`.ap_losses`: the losses' glue and the per-query ``1 - AP`` with a
  closed-form backward, for the ``gpu`` / ``triton`` backends.
* :mod:`.dispatch`: the one place that picks a backend (``cpu``, ``gpu``, ``triton``).

Re-exported here: the names :mod:`pml_rank_plugins.functional` has always exported from this
family (the reference and the ``cpu`` kernel). :mod:`.dispatch` and :mod:`.triton_kernel` are
imported by name (``from pml_rank_plugins.functional.histogram import dispatch``), so that
importing the package does not import Triton.
"""

from .cpu import PairHistogram, pair_categories, pair_histograms
from .reference import exact_average_precision, histogram_ap, tie_aware_histogram_ap

__all__ = [
    "PairHistogram",
    "exact_average_precision",
    "histogram_ap",
    "pair_categories",
    "pair_histograms",
    "tie_aware_histogram_ap",
]
