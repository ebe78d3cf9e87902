"""Shipped experiment configs (package data; ``configs/`` at the repository root links here)."""
