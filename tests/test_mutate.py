"""scripts/mutate.py: the mutation pass's own parts. Every mutation of the committed YAML files
still lands on exactly one line of the package (a refactor that moves a line makes the pass err,
and this test says which); a mutation keeps the line's indentation and ending; bad entries are
refused naming the entry; one run judges caught / survived by the tests' exit status and puts the
file's bytes and time back."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("mutate", ROOT / "scripts" / "mutate.py")
mutate = importlib.util.module_from_spec(spec)
sys.modules["mutate"] = mutate  # dataclasses resolves the module of Mutation's annotations
spec.loader.exec_module(mutate)

YAMLS = sorted((ROOT / "scripts").glob("mutations_*.yaml"))


def m(**kw) -> dict:
    return {"file": "f.py", "original": "x = 1", "replacement": "x = 2", "tests": ["t"], **kw}


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.name)
def test_every_committed_mutation_finds_its_one_line(path):
    mutations = mutate.load_mutations(path)
    assert mutations
    for i, mutation in enumerate(mutations, 1):
        text = (ROOT / mutation.file).read_text()
        new = mutate.mutated_text(text, mutation)  # raises, naming the line, when not exactly one
        changed = [(a, b) for a, b in zip(text.splitlines(), new.splitlines()) if a != b]
        assert len(changed) == 1 and len(new.splitlines()) == len(text.splitlines()), (path, i)
        for test in mutation.tests:  # a path or node id that exists (the rest: -k and its EXPR)
            if test.startswith("tests/"):
                assert (ROOT / test.split("::")[0]).exists(), (path, i, test)


def test_mutated_text_keeps_indentation_and_line_ending_and_counts_occurrences():
    text = "def f():\n    x = 1\r\n    return x\n\nx = 1\n"
    once = mutate.Mutation.from_mapping(m(occurrence=1), "e")
    assert mutate.mutated_text(text, once) == "def f():\n    x = 2\r\n    return x\n\nx = 1\n"
    second = mutate.Mutation.from_mapping(m(occurrence=2, replacement=""), "e")
    assert mutate.mutated_text(text, second).endswith("\npass\n")  # "": the line becomes pass
    with pytest.raises(ValueError, match=r"is on lines \[2, 5\]"):
        mutate.mutated_text(text, mutate.Mutation.from_mapping(m(), "e"))
    with pytest.raises(ValueError, match="no occurrence 3"):
        mutate.mutated_text(text, mutate.Mutation.from_mapping(m(occurrence=3), "e"))
    with pytest.raises(ValueError, match="is on no line"):
        mutate.mutated_text("y = 1\n", mutate.Mutation.from_mapping(m(), "e"))


@pytest.mark.parametrize(
    "entry, message",
    [
        ("not a mapping", "must be a mapping"),
        (m(colour="red"), r"unknown keys \['colour'\]"),
        ({"file": "f.py", "original": "x"}, r"missing keys \['replacement', 'tests'\]"),
        (m(tests=[]), "tests must be a non-empty list"),
        (m(expect="maybe"), "expect must be"),
        (m(replacement="  x = 1 "), "equals the original"),
        (m(occurrence=0), "occurrence must be an integer >= 1"),
        (m(occurrence=True), "occurrence must be an integer >= 1"),
    ],
)
def test_a_bad_entry_is_refused_naming_it(entry, message):
    with pytest.raises(ValueError, match=message) as info:
        mutate.Mutation.from_mapping(entry, "muts.yaml: mutation 4")
    assert str(info.value).startswith("muts.yaml: mutation 4: ")


def test_run_one_judges_by_the_tests_and_restores_the_file(tmp_path):
    (tmp_path / "mod.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "test_mod.py").write_text(
        "from mod import double\n\ndef test_it():\n    assert double(3) == 6\n"
    )
    (tmp_path / "conftest.py").write_text("")  # rootdir here: the repository's config unused
    stamp = (1_000_000_000, 1_000_000_000)
    os.utime(tmp_path / "mod.py", ns=stamp)
    before = (tmp_path / "mod.py").read_bytes()
    broken = mutate.Mutation.from_mapping(
        {"file": "mod.py", "original": "return 2 * x", "replacement": "return 3 * x",
         "tests": ["test_mod.py"]}, "e")  # fmt: skip
    harmless = mutate.Mutation.from_mapping(
        {"file": "mod.py", "original": "return 2 * x", "replacement": "return x + x",
         "tests": ["test_mod.py"], "expect": "survived"}, "e")  # fmt: skip
    no_tests = mutate.Mutation.from_mapping(
        {"file": "mod.py", "original": "return 2 * x", "replacement": "return 0",
         "tests": ["test_missing.py"]}, "e")  # fmt: skip
    outcome, detail = mutate.run_one(broken, tmp_path, in_place=False, timeout=120)
    assert outcome == "caught" and detail.startswith("FAILED test_mod.py::test_it"), detail
    assert mutate.run_one(harmless, tmp_path, in_place=False, timeout=120)[0] == "survived"
    outcome, detail = mutate.run_one(no_tests, tmp_path, in_place=False, timeout=120)
    assert outcome == "error" and "exit status 4" in detail, detail  # usage error: not judged
    assert (tmp_path / "mod.py").read_bytes() == before
    assert (tmp_path / "mod.py").stat().st_mtime_ns == stamp[1]
