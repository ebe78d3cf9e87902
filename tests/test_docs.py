"""The documentation site builds with warnings as errors (issue 19, item 7) and every
cross-reference checked (``-n``, issue 29 item 6), and README.md stays an entry page.

``make test`` installs sphinx, myst-parser and furo (the ``dev`` extra), so a missing tool is a
failure here, not a skip. The code blocks of the pages are checked by ``tests/test_readme.py``.
"""

from __future__ import annotations

import importlib.util
import io
import re
import runpy
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

# the tests of this module share one module-scoped fixture: under `-n 2 --dist loadfile`
# (make test) they run on one worker, so the fixture is built once
pytestmark = pytest.mark.xdist_group("docs_site")

ROOT = Path(__file__).resolve().parents[1]

API_NAMES = [
    "FastAPLoss",
    "QuantizedAPLoss",
    "RankedListLoss",
    "RankedListMiner",
    "CategoryHardSampler",
    "ChunkedMetricLossOnly",
    "chunked_backward",
]


def test_readme_is_an_entry_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300: move text to docs/)"


def test_readme_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    pages = [p for p in (ROOT / "docs").glob("*.md") if p.name != "index.md"]
    missing = [p.name for p in pages if f"docs/{p.name})" not in readme]
    assert not missing, f"README.md's Documentation section does not link {missing}"


@pytest.mark.parametrize("module", ["sphinx", "myst_parser", "myst_nb", "furo"])
def test_docs_tools_are_installed(module):
    assert (
        importlib.util.find_spec(module) is not None
    ), f"{module} is missing: `make test` installs it (pip install -e '.[dev]')"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    for module in ("sphinx", "myst_parser", "myst_nb", "furo"):
        assert importlib.util.find_spec(module) is not None, f"{module} is not installed"
    from sphinx.cmd.build import build_main

    out = tmp_path_factory.mktemp("site")
    # `python -m sphinx -n -W -q -b html docs OUT` (what `make docs` runs) in this process:
    # sphinx's own entry point with the same flags, but torch and the package, which autodoc
    # imports, are already imported here (a fresh interpreter spends seconds of CPU on them).
    # docs/conf.py puts the checkout on sys.path; the path is restored after the build. Python
    # warnings (the extensions' deprecation notices), which the subprocess printed unread, are
    # ignored here too: -W is about Sphinx's own warnings, which go to stderr.
    stdout, stderr, path = io.StringIO(), io.StringIO(), list(sys.path)
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            returncode = build_main(["-n", "-W", "-q", "-b", "html", str(ROOT / "docs"), str(out)])
    finally:
        sys.path[:] = path
    if returncode != 0:
        print(stdout.getvalue()[-4000:])
        print(stderr.getvalue())
    assert returncode == 0, f"sphinx -n -W failed ({returncode}):\n{stderr.getvalue()[-4000:]}"
    return out


@pytest.mark.slow  # about 10-30 s: a full Sphinx build with autodoc
def test_site_builds_nitpicky_with_warnings_as_errors(site):
    for page in ("index", "getting-started", "ablations", "performance", "api/index"):
        assert (site / f"{page}.html").is_file(), page
    assert (site / "_images" / "ablations.png").is_file()  # the ablations figure is copied


@pytest.mark.slow
def test_api_reference_documents_the_main_classes(site):
    html = "".join(p.read_text() for p in (site / "api").glob("*.html"))
    documented = set(
        re.findall(r'<dt class="sig sig-object py" id="pml_rank_plugins\.\w+\.(\w+)"', html)
    )
    missing = [n for n in API_NAMES if n not in documented]
    assert not missing, f"not documented in the API reference: {missing}"


def _conf() -> dict:
    return runpy.run_path(str(ROOT / "docs" / "conf.py"))


def test_make_docs_is_nitpicky():
    """``make docs`` checks every cross-reference (``-n``) with warnings as errors (``-W``)."""
    rule = (ROOT / "Makefile").read_text().split("\ndocs:", 1)[1].splitlines()[1]
    flags = rule.split()
    assert "-n" in flags and "-W" in flags, f"Makefile's docs rule lacks -n or -W: {rule!r}"


OUR_NAMES = [
    "pml_rank_plugins.losses.FastAPLoss",
    "pml_rank_plugins.functional.ranked_list.reference.ranked_list_terms",
    "pml_rank_plugins.samplers.base.ClassBatchSampler",
    "FastAPLoss",
    "RankedListMiner",
]


@pytest.mark.parametrize("name", OUR_NAMES)
def test_nitpick_regexes_never_hide_our_names(name):
    """The regex ignores are for other projects' objects (no intersphinx offline); a broken
    reference to one of ours must fail the build."""
    hidden = [
        (role, target)
        for role, target in _conf()["nitpick_ignore_regex"]
        if re.fullmatch(role, "py:class") and re.fullmatch(target, name)
    ]
    assert not hidden, f"{name} is silenced by nitpick_ignore_regex {hidden}"


@pytest.mark.parametrize(
    "role, target, ignored",
    [
        ("py:class", "torch.Tensor", True),
        ("py:class", "numpy.ndarray", True),
        ("py:class", "np.ndarray", True),
        ("py:class", "pytorch_metric_learning.miners.base_miner.BaseMiner", True),
        ("py:class", "pathlib.Path", True),
        ("py:class", "torchvision", False),  # a prefix is not enough: the dot is required
        ("py:class", "numpyish.thing", False),
    ],
)
def test_nitpick_regexes_cover_each_library_by_its_dotted_prefix(role, target, ignored):
    matched = any(
        re.fullmatch(r, role) and re.fullmatch(t, target)
        for r, t in _conf()["nitpick_ignore_regex"]
    )
    assert matched is ignored, (role, target)
