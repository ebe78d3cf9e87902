"""Soft-histogram kernels by backend (``triton_kernel``: the fused Triton kernel).

Nothing is imported here, so that importing the package never imports ``triton``.
"""
