"""``pml-rank list``: the names the registry resolves, grouped by kind; ``--kind configs``: the
shipped configs (name and the first line of each file's description)."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .base import Command
from .options import LIST_KINDS

__all__ = ["ListNames", "config_description", "shipped_config_rows"]

CONFIGS = "configs"


def config_description(path: Path) -> str:
    """The first line of a config's leading comment, without ``#`` (``""`` when it has none)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text.startswith("#"):
            return ""
        text = text.lstrip("#").strip()
        if text:
            return re.sub(r"\s+", " ", text)
    return ""


def shipped_config_rows() -> list[tuple[str, str]]:
    """``(name, description)`` of every shipped config (what ``pml-rank train NAME`` takes),
    sorted by name, ablations, benchmarks, claims and studies included."""
    from ..experiment import shipped_configs

    return [(name, config_description(path)) for name, path in shipped_configs().items()]


class ListNames(Command):
    """The resolvable names grouped by kind (a ``losses:`` header, then one indented line per
    name: what to write in a config, and the class it resolves to), only ``--kind``'s group when
    given; ``--kind configs``: the shipped configs, one line each (name, description); exit
    status 1 (and a line on stderr) when nothing matches."""

    name = "list"
    help = "list resolvable names by kind, e.g. pml-rank list --kind losses"
    loads_configs = False  # no config, no run folder, no device

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        what = "show names or targets containing it (any case), e.g. FastAP"
        parser.add_argument("substring", nargs="?", default="", help=what)
        parser.add_argument(
            "--kind",
            choices=(*LIST_KINDS, CONFIGS),
            metavar="KIND",
            help=f"only names of this kind ({', '.join(LIST_KINDS)}), or the shipped configs "
            "(configs), e.g. --kind losses",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ..experiment import listing

        needle = args.substring.lower()
        found = 0
        for group in LIST_KINDS if args.kind is None else (args.kind,):
            rows = shipped_config_rows() if group == CONFIGS else listing(group)
            rows = [(n, t) for n, t in rows if needle in n.lower() or needle in t.lower()]
            if not rows:
                continue
            print(f"{group}:" if not found else f"\n{group}:")
            for name, target in rows:
                print(f"  {name:40s} {target}")
            found += len(rows)
        if not found:
            where = f" among the {args.kind}" if args.kind else ""
            hint = "`pml-rank list` shows them all"
            print(
                f"pml-rank: no name or target{where} contains {args.substring!r}; {hint}",
                file=sys.stderr,
            )
        return 0 if found else 1
