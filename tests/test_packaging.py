"""What a pip user gets (issue 29, item 1): the wheel and sdist carry LICENSE and CITATION.cff,
the version has one source, the README's links name files of the repository by relative paths
(issue 41: the Homepage is a placeholder, and the package is on no index), and the supported-versions statement agrees with the noxfile.

The wheel and sdist are built with setuptools' PEP 517 hooks from a copy of the sources (no
network, no build isolation: the test environment's setuptools is the build backend), so the
checkout is left untouched.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import yaml

import pml_rank_plugins
from pml_rank_plugins._version import __version__

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
README = (ROOT / "README.md").read_text()
# The one base of the README's links into the repository: the project's Homepage + /blob/main/.
BASE = PYPROJECT["project"]["urls"]["Homepage"] + "/blob/main/"
# Markdown inline links and images `[text](target)` / `![alt](target)`, reference definitions
# `[label]: target`, and HTML `href=` / `src=`.
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)", re.M)
HTML = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")


def link_targets(markdown: str) -> list[str]:
    """Every link target of a Markdown text, code blocks and inline code left out."""
    prose = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return [m.group(1) for pattern in (LINK, REFERENCE, HTML) for m in pattern.finditer(prose)]


def is_absolute(target: str) -> bool:
    return re.match(r"^(https?://|mailto:)", target) is not None


# -- the README on a package index --------------------------------------------------------------
def test_link_finder_finds_every_kind_of_link():
    text = (
        "[a](docs/x.md) ![b](fig.png) [c](https://h/y) `[d](not/a/link)`\n"
        "[e]: docs/ref.md\n<a href='rel.html'>f</a>\n```text\n[g](code/block)\n```\n"
    )
    assert link_targets(text) == ["docs/x.md", "fig.png", "https://h/y", "docs/ref.md", "rel.html"]
    assert [t for t in link_targets(text) if not is_absolute(t)] == [
        "docs/x.md",
        "fig.png",
        "docs/ref.md",
        "rel.html",
    ]


def test_readme_is_the_long_description():
    assert PYPROJECT["project"]["readme"] == "README.md"


def test_readme_links_relative_files_that_exist_and_never_the_placeholder_address():
    # Issue 41: the Homepage of pyproject is a placeholder (the repository is not public), so the
    # README links the repository's files by relative paths (they work in a clone, on a code
    # host and in the docs build) and never that address.
    targets = link_targets(README)
    assert len(targets) > 20  # the documentation list is found
    homepage = PYPROJECT["project"]["urls"]["Homepage"]
    assert not [t for t in targets if t.startswith(homepage)]
    for target in targets:
        if is_absolute(target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        assert (ROOT / path).exists(), f"README.md links {target}, but {path} does not exist"


def test_project_urls_use_the_same_base():
    for name, url in PYPROJECT["project"]["urls"].items():
        assert url.startswith(PYPROJECT["project"]["urls"]["Homepage"]), name
        if url.startswith(BASE):
            assert (ROOT / url[len(BASE) :]).is_file(), f"project.urls.{name}: {url}"


# -- version, license, citation ------------------------------------------------------------------
def test_version_has_one_source():
    assert pml_rank_plugins.__version__ == __version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    dynamic = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "pml_rank_plugins._version.__version__"}
    # The CLI reads it without importing torch: _version.py imports nothing.
    tree = ast.parse((ROOT / "pml_rank_plugins" / "_version.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def test_license_is_mit_as_the_metadata_says():
    text = (ROOT / "LICENSE").read_text()
    assert PYPROJECT["project"]["license"] == "MIT"
    assert text.startswith("MIT License") and "pml_rank_plugins contributors" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text


def test_citation_file_cites_the_software_and_the_three_papers():
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
    assert {"message", "title", "authors"} <= set(cff)  # CFF 1.2.0's required keys
    assert cff["version"] == __version__ and cff["license"] == "MIT"
    titles = [ref["title"].replace("\n", " ") for ref in cff["references"]]
    assert titles == [
        "Deep Metric Learning to Rank",
        "Learning with Average Precision: Training Image Retrieval with a Listwise Loss",
        "Ranked List Loss for Deep Metric Learning",
    ]
    for ref in cff["references"]:
        assert ref["type"] == "conference-paper" and ref["year"] == 2019 and ref["authors"]


# -- supported versions ----------------------------------------------------------------------------
def test_declared_pml_range_matches_the_noxfile_and_the_readme():
    pml = [d for d in PYPROJECT["project"]["dependencies"] if d.startswith("pytorch-metric-")]
    assert pml == ["pytorch-metric-learning>=2.5,<3"]
    noxfile = (ROOT / "noxfile.py").read_text()
    assert 'PML_LOW = "2.5.0"' in noxfile and 'PML_HIGH = "pytorch-metric-learning<3"' in noxfile
    assert "| pytorch-metric-learning | >= 2.5, < 3 |" in README
    assert "| torch | >= 2.11 |" in README and "torch>=2.11" in PYPROJECT["project"]["dependencies"]
    # nox -s torch_low tests the declared lowest torch, with the torchvision built for it
    assert 'TORCH_LOW = ("torch==2.11.0", "torchvision==0.26.0")' in noxfile


# -- the built distributions -------------------------------------------------------------------------
def build(tmp_path: Path, hook: str) -> Path:
    """Run setuptools' PEP 517 ``hook`` on a copy of the sources; return the built file."""
    src = tmp_path / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "CITATION.cff"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "pml_rank_plugins",
        src / "pml_rank_plugins",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    out = tmp_path / "dist"
    code = f"from setuptools import build_meta as b; print(b.{hook}({str(out)!r}))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


def test_wheel_and_sdist_carry_license_and_citation(tmp_path):
    wheel = build(tmp_path / "w", "build_wheel")
    assert wheel.name == f"pml_rank_plugins-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = f"pml_rank_plugins-{__version__}.dist-info"
        metadata = zf.read(f"{info}/METADATA").decode()
        assert zf.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert zf.read(f"{info}/licenses/CITATION.cff") == (ROOT / "CITATION.cff").read_bytes()
    assert "pml_rank_plugins/_version.py" in names
    assert any(n.startswith("pml_rank_plugins/experiment/configs/") for n in names)
    assert f"Version: {__version__}" in metadata and "License-Expression: MIT" in metadata
    assert "Requires-Dist: pytorch-metric-learning<3,>=2.5" in metadata
    assert "Metric learning **to rank**" in metadata  # the README is the long description

    sdist = build(tmp_path / "s", "build_sdist")
    with tarfile.open(sdist) as tf:
        members = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    assert {"LICENSE", "CITATION.cff", "README.md", "pyproject.toml"} <= members
    assert "pml_rank_plugins/_version.py" in members
