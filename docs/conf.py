"""Sphinx configuration for the pml_rank_plugins documentation site.

Build from the repository root with ``make docs`` (or
``python -m sphinx -n -W -b html docs docs/_build/html``). Pages are Markdown (MyST); the API
reference is generated from the package's Google-style docstrings with autodoc + napoleon,
importing the package from this checkout.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # autodoc imports pml_rank_plugins from the checkout

from pml_rank_plugins._version import __version__  # noqa: E402 (after the sys.path insert)

project = "pml_rank_plugins"
author = "pml_rank_plugins contributors"
copyright = "2026, pml_rank_plugins contributors"
release = __version__  # the one source: pml_rank_plugins/_version.py
version = ".".join(__version__.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_nb",  # MyST Markdown (it loads myst_parser itself) and the example notebooks
]

source_suffix = {".md": "myst-nb", ".rst": "restructuredtext", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = [
    "_build",
    "Thumbs.db",
    ".DS_Store",
    "**/.ipynb_checkpoints",
    "study/**",
    "gpu/**",  # measured files as they came back from a GPU machine (linked from performance.md)
]  # study/: data

# MyST: headings get anchors so pages can link to sections (``page.md#section``).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# The example notebooks (docs/notebooks/ links to examples/*.ipynb) are committed with their
# outputs: render those, never execute (`python examples/run_notebooks.py` refreshes them).
nb_execution_mode = "off"
nb_render_markdown_format = "myst"  # the tables the notebooks display as Markdown
nb_merge_streams = True

# autodoc: members in source order, documented once each (packages re-export from submodules).
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "furo"
html_title = f"pml_rank_plugins {release}"  # the version on every page (furo's sidebar title)
autodoc_inherit_docstrings = False  # torch.autograd.Function docs refer to labels of torch

# A wider content column and sideways-scrolling tables (furo's 46em column cut wide tables and
# wrapped "95.26 ± 2.93" over three lines): docs/_static/custom.css.
html_static_path = ["_static"]
html_css_files = ["custom.css"]

# Nitpicky builds (``-n``, what ``make docs`` runs) check every cross-reference. The site is built
# offline: intersphinx is not enabled because its inventories (objects.inv of torch, numpy, PML,
# ...) would be downloaded at build time, and none is available locally. References to other
# projects' objects therefore cannot resolve and are not ours to fix: they render as code,
# unlinked. One narrow entry per library; our own names must resolve (fix the role or the path).
nitpick_ignore_regex = [
    (r"py:(class|func|meth|data|attr|exc)", r"torch\..+"),  # PyTorch (type hints and bases)
    (r"py:(class|func|data)", r"(numpy|np)\..+"),  # NumPy, also as ``np.ndarray``
    (r"py:(class|func|meth|exc)", r"pytorch_metric_learning\..+"),  # PML bases and hints
    (r"py:(class|func)", r"PIL\..+"),  # Pillow images
    (r"py:(class|func)", r"scipy\..+"),  # scipy.io.loadmat
    (r"py:class", r"(pathlib|collections\.abc)\..+"),  # the standard library's hints
]
nitpick_ignore = [
    ("py:class", "Path"),  # ``pathlib.Path`` in hints read unqualified (``from pathlib import``)
]
