"""A small mutation pass: one-line breaks of the package, each judged by the tests that should see it.

    python scripts/mutate.py scripts/mutations.yaml                # every mutation of the file
    python scripts/mutate.py scripts/mutations.yaml --only 3 7     # mutations 3 and 7 (1-based)
    python scripts/mutate.py scripts/mutations.yaml --in-place     # mutate the working tree itself

The mutation file (YAML) is a list of mappings::

    - file: pml_rank_plugins/samplers/class_pools.py
      original: "items = items[torch.randperm(len(items), generator=generator)[:t].numpy()]"
      replacement: "items = items[:t]"
      tests: [tests/samplers/test_class_pools.py]    # pytest arguments: paths, -k EXPR
      why: taking the first t items of a class instead of a random t   # optional
      expect: survived                                                 # optional, see below
      occurrence: 2                   # optional: the 2nd line with that text (1-based)

``original`` is the text of exactly one line of ``file`` (compared without its indentation; a
text found on no line or on several is an error, so a mutation never lands on the wrong line;
``occurrence: N`` picks the N-th of several);
``replacement`` replaces it with the same indentation (``""``: the line becomes ``pass``);
``tests`` are pytest arguments (paths, node ids, ``-k EXPR``). For
each mutation the script writes the mutated file, runs ``python -m pytest -q -x -n 0
-p no:cacheprovider <tests>`` and records **caught** (pytest exit status 1: a test failed),
**survived** (status 0), **error** (any other status: collection or usage error, so nothing was
judged) or **timeout**. ``expect: survived`` marks a known, explained survivor (its ``why``
says why it is harmless): the exit status is 1 only when a mutation without that mark survives,
or one with it is caught (the explanation is then stale), or any mutation errs.

Where it mutates: by default in a private copy of the repository (the files ``git ls-files -co
--exclude-standard`` lists, made once per call under a temporary folder, removed at the end),
with ``PYTHONPATH`` pointing at the copy so that test subprocesses import it too; the working
tree is never written, so people editing or testing it at the same time are not affected.
``--in-place`` mutates the working tree instead: a file is mutated only when ``git status
--short <file>`` shows no change, its bytes and modification time are saved first and restored
in a ``finally`` right after its test run (also on Ctrl-C), and the restored bytes are checked.

Timing: one pytest process per mutation (about 3 s of imports plus the chosen tests), run one
after the other; choose small test subsets.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PYTEST = ["-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider"]


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One one-line change of ``file`` and the tests expected to notice it."""

    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]
    why: str = ""
    expect: str = "caught"
    occurrence: int | None = None

    @classmethod
    def from_mapping(cls, m: dict, where: str) -> Mutation:
        """A mutation from one entry of the YAML list; ``ValueError`` naming ``where`` if bad."""
        if not isinstance(m, dict):
            raise ValueError(f"{where}: a mutation must be a mapping, got {m!r}")
        unknown = sorted(set(m) - {f.name for f in dataclasses.fields(cls)})
        missing = sorted({"file", "original", "replacement", "tests"} - set(m))
        if unknown or missing:
            raise ValueError(f"{where}: unknown keys {unknown}, missing keys {missing}")
        tests = m["tests"]
        if isinstance(tests, str):
            tests = [tests]
        if not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"{where}: tests must be a non-empty list of pytest paths")
        if m.get("expect", "caught") not in ("caught", "survived"):
            raise ValueError(f"{where}: expect must be 'caught' or 'survived'")
        if str(m["original"]).strip() == str(m["replacement"]).strip():
            raise ValueError(f"{where}: the replacement equals the original line")
        occurrence = m.get("occurrence")
        if occurrence is not None and (type(occurrence) is not int or occurrence < 1):
            raise ValueError(f"{where}: occurrence must be an integer >= 1, got {occurrence!r}")
        return cls(
            file=str(m["file"]),
            original=str(m["original"]),
            replacement=str(m["replacement"]),
            tests=tuple(tests),
            why=str(m.get("why", "")),
            expect=str(m.get("expect", "caught")),
            occurrence=occurrence,
        )


def load_mutations(path: Path) -> list[Mutation]:
    """The mutations of a YAML file (see the module docstring)."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of mutations, got {type(data).__name__}")
    return [Mutation.from_mapping(m, f"{path}: mutation {i}") for i, m in enumerate(data, 1)]


def mutated_text(text: str, mutation: Mutation) -> str:
    """``text`` with the one line equal to ``mutation.original`` (ignoring indentation)
    replaced, keeping its indentation and line ending; ``ValueError`` unless exactly one line
    matches (or, with ``occurrence``, unless there is such an occurrence)."""
    lines = text.splitlines(keepends=True)
    want = mutation.original.strip()
    hits = [i for i, line in enumerate(lines) if line.strip() == want]
    if mutation.occurrence is not None:
        if len(hits) < mutation.occurrence:
            raise ValueError(
                f"{mutation.file}: {want!r} is on {len(hits)} lines, no occurrence "
                f"{mutation.occurrence}"
            )
        hits = [hits[mutation.occurrence - 1]]
    if len(hits) != 1:
        where = f"lines {[i + 1 for i in hits]}" if hits else "no line"
        raise ValueError(
            f"{mutation.file}: {want!r} is on {where}; it must be on exactly one (or give "
            "occurrence: N)"
        )
    line = lines[hits[0]]
    indent = line[: len(line) - len(line.lstrip())]
    ending = line[len(line.rstrip("\r\n")) :]
    lines[hits[0]] = indent + (mutation.replacement.strip() or "pass") + ending
    return "".join(lines)


def copy_repository(dest: Path) -> Path:
    """Copy the tracked and untracked, not ignored, files of the working tree into ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree but still tracked
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target.symlink_to(os.readlink(src))
        elif src.is_file():
            shutil.copy2(src, target)
    return dest


def _clean_in_git(path: Path) -> bool:
    out = subprocess.run(
        ["git", "status", "--short", "--", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    return out.returncode == 0 and out.stdout.strip() == ""


def run_one(mutation: Mutation, tree: Path, in_place: bool, timeout: float) -> tuple[str, str]:
    """Apply ``mutation`` in ``tree``, run its tests, restore the file; ``(outcome, detail)``."""
    path = tree / mutation.file
    if in_place and not _clean_in_git(path):
        return "skipped", "the file has uncommitted changes (git status --short)"
    original = path.read_bytes()
    stat = path.stat()
    new = mutated_text(original.decode(), mutation).encode()
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    try:
        path.write_bytes(new)
        try:
            proc = subprocess.run(
                [sys.executable, *PYTEST, *mutation.tests],
                cwd=tree,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return "timeout", f"over {timeout:g} s"
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # compiled caches stay valid
        if hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(original).digest():
            raise RuntimeError(f"{path}: could not restore the original bytes")
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    outcome = {0: "survived", 1: "caught"}.get(proc.returncode, "error")
    if outcome == "caught":
        failed = [ln for ln in proc.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        tail = failed[0] if failed else tail
    elif outcome == "error":
        tail = f"pytest exit status {proc.returncode}: {(proc.stderr or proc.stdout)[-400:]}"
    return outcome, tail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mutations", type=Path, help="YAML list of mutations")
    parser.add_argument("--only", type=int, nargs="+", help="1-based numbers of mutations to run")
    parser.add_argument("--in-place", action="store_true", help="mutate the working tree itself")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per test run")
    args = parser.parse_args(argv)
    mutations = load_mutations(args.mutations)
    chosen = args.only or range(1, len(mutations) + 1)
    with tempfile.TemporaryDirectory(prefix="mutate-") as tmp:
        tree = ROOT if args.in_place else copy_repository(Path(tmp))
        for i in chosen:  # every mutation must find its line before any test runs
            mutated_text((tree / mutations[i - 1].file).read_text(), mutations[i - 1])
        print("| # | file | mutation | outcome | tests | detail |")
        print("| --- | --- | --- | --- | --- | --- |")
        bad = 0
        for i in chosen:
            m = mutations[i - 1]
            t0 = time.perf_counter()
            outcome, detail = run_one(m, tree, args.in_place, args.timeout)
            judged = outcome in ("caught", "survived")
            if outcome in ("error", "timeout") or (judged and outcome != m.expect):
                bad += 1
            what = f"`{m.original.strip()}` -> `{m.replacement.strip() or 'pass'}`"
            note = detail if outcome != "survived" else (m.why or detail)
            note = note.replace("|", "/")
            secs = time.perf_counter() - t0
            print(
                f"| {i} | {m.file} | {what.replace('|', '/')} | {outcome} ({secs:.0f} s) "
                f"| {' '.join(m.tests)} | {note} |",
                flush=True,
            )
    print(f"\n{bad} unexpected outcome(s) of {len(chosen)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
