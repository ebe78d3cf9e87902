"""Start-up cost of the processes that run the package (issue 30 item 6): no heavy import that the
run does not need.

Every CLI command, ``--jobs`` spawn worker, tune worker and torchrun rank is a fresh interpreter
that imports the runner. torchvision (its ``__init__`` imports ``torchvision.ops``, and so
``torch._dynamo`` and sympy), matplotlib and Optuna cost seconds of CPU together, and a run with no
torchvision transform or ResNet, no picture and no tuning needs none of them. So the package
imports them where they are used (``experiment.transforms`` builds no torchvision ``Compose``,
``models.resnet_embedder`` imports torchvision when it builds a ResNet, ``data.glyphs`` imports
matplotlib when it renders, ``experiment.search_space`` imports Optuna when it checks a ``tune``
section, and the registry imports torchvision only for a name that PML, the plugin and ``torch``
lack).

The checks run in a fresh interpreter (this one has imported everything already): one
subprocess goes through the stages of a tiny run, recording for each watched package the stage
and the package (or test) source line whose import pulled it in; each test reads one stage. The
last stages import each package on purpose, so the recorder is shown to catch an import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pml_rank_plugins.experiment import registry

REPO = Path(__file__).resolve().parents[1]
WATCHED = ("torchvision", "matplotlib", "optuna")

# Runs in the subprocess. ``first[package] = [stage, "file:line"]``: the innermost frame of this
# repository (package or tests) on the stack when ``package`` was first looked for.
SCRIPT = r"""
import importlib.abc, json, os, sys, traceback

WATCHED = set(sys.argv[1].split(","))
ROOT = sys.argv[2]
first = {}
stage = "start"


class Recorder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in WATCHED and name not in first and name not in sys.modules:
            ours = [f for f in traceback.extract_stack() if f.filename.startswith(ROOT)]
            where = f"{os.path.relpath(ours[-1].filename, ROOT)}:{ours[-1].lineno}" if ours else "?"
            first[name] = [stage, where]
        return None  # only watches: the usual finders import the package


sys.meta_path.insert(0, Recorder())

stage = "import running.pool"
import pml_rank_plugins.running.pool

stage = "import the runner's packages"
import pml_rank_plugins.data, pml_rank_plugins.experiment, pml_rank_plugins.models
import pml_rank_plugins.running

stage = "tiny config parsed"
from pml_rank_plugins.experiment import RunSpec, build_experiment, build_tester, make_trainer, registry
from tests.tiny import tiny_config

spec = RunSpec.parse(tiny_config())

stage = "tiny experiment built"
exp = build_experiment(spec, "cpu")
make_trainer(exp)
build_tester(spec.config, exp.device)

stage = "tiny run trained (pml-rank train)"
from pml_rank_plugins.cli import main
from pml_rank_plugins.experiment import dump_yaml

dump_yaml(tiny_config(), os.path.join(sys.argv[3], "tiny.yaml"))
code = main(["train", os.path.join(sys.argv[3], "tiny.yaml"), "--out", sys.argv[3] + "/run"])
assert code == 0, code

stage = "control: resolve torchvision's Resize"
registry.resolve("Resize")
stage = "control: glyph font folder"
from pml_rank_plugins.data import glyphs

glyphs.font_dir()
stage = "control: import running.tune"
import pml_rank_plugins.running.tune

print("FIRST-IMPORTS " + json.dumps(first))
"""

STAGES = [
    "import running.pool",
    "import the runner's packages",
    "tiny config parsed",
    "tiny experiment built",
    "tiny run trained (pml-rank train)",
]


# the module's tests share one fixture run: one xdist group builds it once (make test)
pytestmark = pytest.mark.xdist_group("import_cost")


@pytest.fixture(scope="module")
def first_imports(tmp_path_factory) -> dict[str, list[str]]:
    """``{package: [stage, "file:line"]}`` of the watched packages the subprocess imported."""
    out = tmp_path_factory.mktemp("import_cost")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, ",".join(WATCHED), str(REPO) + os.sep, str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("FIRST-IMPORTS ")]
    return json.loads(line.removeprefix("FIRST-IMPORTS "))


@pytest.mark.slow  # one fresh interpreter through a whole tiny run (about 6 CPU s)
@pytest.mark.parametrize("stage", STAGES)
def test_the_common_path_imports_no_torchvision_matplotlib_or_optuna(first_imports, stage):
    upto = ["start", *STAGES[: STAGES.index(stage) + 1]]
    pulled = {pkg: where for pkg, (at, where) in first_imports.items() if at in upto}
    assert not pulled, "\n".join(
        f"{pkg} was imported at stage {first_imports[pkg][0]!r} by {where}; import it inside the "
        "function that needs it (see this module's docstring)"
        for pkg, where in pulled.items()
    )


@pytest.mark.slow  # shares the fixture above
@pytest.mark.parametrize(
    "package, stage, culprit",
    [
        ("torchvision", "control: resolve torchvision's Resize", "experiment/registry.py"),
        ("matplotlib", "control: glyph font folder", "data/glyphs.py"),
        ("optuna", "control: import running.tune", "running/"),
    ],
)
def test_the_recorder_catches_an_import_and_names_its_module(
    first_imports, package, stage, culprit
):
    # guards the test above against passing because nothing is ever recorded
    at, where = first_imports[package]
    assert at == stage
    assert where.startswith(f"pml_rank_plugins/{culprit}"), where


def test_bare_names_resolve_as_before_and_torchvision_is_searched_last():
    import torch
    import torchvision

    assert registry.resolve("Adam") is torch.optim.Adam
    assert registry.resolve("Linear") is torch.nn.Linear
    assert registry.resolve("Resize") is torchvision.transforms.Resize
    assert registry.resolve("resnet50") is torchvision.models.resnet50
    # the one-module-at-a-time search agrees with the full table, torch's names before torchvision's
    table = registry.torch_names()
    names = ["Adam", "SGD", "StepLR", "Conv2d", "Identity", "Resize", "Normalize", "resnet18"]
    assert set(names) <= set(table)
    assert [registry.resolve(name) for name in names] == [table[name] for name in names]


def test_registering_a_torchvision_name_is_still_refused():
    class Resize:
        pass

    with pytest.raises(ValueError, match=r"'Resize' already resolves to torchvision\.transforms"):
        registry.register("Resize", Resize)
    assert registry.resolve("Resize") is not Resize


def test_an_unknown_name_still_lists_close_torchvision_names():
    with pytest.raises(registry.UnknownNameError, match=r"at transforms\.train\[0\].*Resize"):
        registry.resolve("Resise", "transforms.train[0]")
