"""Backends of the soft-histogram AP kernel (FastAP, mAP_Q / mAP_T): :mod:`.gpu` (sync-free
torch), :mod:`.triton_kernel` (fused Triton), and :mod:`.dispatch`, which picks one of them or the
CPU kernel of :mod:`pml_rank_plugins.functional.soft_histogram`."""
