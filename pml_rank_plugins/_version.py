"""The package version, in one place.

Standard library only (nothing at all is imported), so ``pml-rank --version`` can read it without
importing torch; ``pyproject.toml`` reads it too (``[tool.setuptools.dynamic]``) and
``docs/conf.py`` shows it on the site.
"""

__version__ = "0.1.0"
