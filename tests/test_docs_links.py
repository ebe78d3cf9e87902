"""Links and install lines of README.md and the docs pages point at places that exist, and
docs/index.md is readable as plain Markdown (issue 41, item 5)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FILES = [ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# The repository address is a placeholder (pyproject), and the package is on no index.
NOWHERE = ("github.com/pml-rank-plugins", "git+https://", 'install "pml_rank_plugins[')


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_link_or_install_line_points_nowhere(path):
    text = path.read_text()
    for bad in NOWHERE:
        assert bad not in text, f"{path.relative_to(ROOT)}: {bad!r}"
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # an outside address, or an anchor of the same page
        file = (path.parent / target.split("#")[0]).resolve()
        assert file.exists(), f"{path.relative_to(ROOT)}: link to {target}: no such file"


def test_index_lists_every_toctree_page_as_a_link():
    text = (DOCS / "index.md").read_text()
    toctree = [
        line.strip()
        for block in re.findall(r"```\{toctree\}\n(.*?)```", text, re.S)
        for line in block.splitlines()
        if line.strip() and not line.startswith(":")
    ]
    links = [t[: -len(".md")] for t in LINK.findall(text) if t.endswith(".md")]
    assert toctree and toctree == links, (toctree, links)
    assert "distributed" in toctree
