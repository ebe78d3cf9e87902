"""Plots written as PNG only, for tests that read no PDF (the ``png_plots_only`` fixture of
``tests/conftest.py``, or :func:`use_png_plots_only` from some point of a test on).

A PDF copy draws the figure again and subsets its TrueType fonts with fontTools: about half a
second of CPU per figure, and a tune writes 1 + 1 per method, a comparison 2-3, a sweep 1 per
metric. Every other step of the outputs runs as usual. ``tests/reporting/test_plots.py`` writes
and checks the PDFs; the CLI tests and the failed-run compare test write them as users get them.
"""

from __future__ import annotations

import pytest

from pml_rank_plugins.reporting import style


def use_png_plots_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """``style.save_figure`` without its PDF copy, from here on in the test (or the
    ``monkeypatch`` context)."""
    real = style.save_figure

    def png_only(fig, png, pdf=True, **kwargs):
        return real(fig, png, pdf=False, **kwargs)

    monkeypatch.setattr(style, "save_figure", png_only)
