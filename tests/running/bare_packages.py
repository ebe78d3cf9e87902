"""Start a test's helper process on one module of the package, without torch.

``import pml_rank_plugins.running.run_folder`` runs ``pml_rank_plugins/running/__init__.py``
first, which imports torch and most of the package: 3-5 s of CPU for a helper process that only
needs the run folder's lock (a few standard-library imports). :data:`BARE_PACKAGES` is Python
source that registers the package and each of its subpackages as an empty package (the real
folder as its ``__path__``, its ``__init__`` not run), so the import that follows loads the
requested module, and what it imports, from the real files and nothing else.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pml_rank_plugins"
_PACKAGES = {
    ".".join(init.parent.relative_to(PACKAGE.parent).parts): str(init.parent)
    for init in sorted(PACKAGE.rglob("__init__.py"))
}

BARE_PACKAGES = (
    "import sys, types\n"
    f"for _name, _folder in {_PACKAGES!r}.items():\n"
    "    _module = types.ModuleType(_name)\n"
    "    _module.__path__ = [_folder]\n"
    "    sys.modules[_name] = _module\n"
)
