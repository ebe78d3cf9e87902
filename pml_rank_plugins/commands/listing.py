"""``pml-rank list``: the names the registry resolves, grouped by kind."""

from __future__ import annotations

import argparse
import sys

from .base import Command
from .options import LIST_KINDS

__all__ = ["ListNames"]


class ListNames(Command):
    """The resolvable names grouped by kind (a ``losses:`` header, then one indented line per
    name: what to write in a config, and the class it resolves to), only ``--kind``'s group when
    given; exit status 1 (and a line on stderr) when nothing matches."""

    name = "list"
    help = "list resolvable names by kind, e.g. pml-rank list --kind losses"
    loads_configs = False  # no config, no run folder, no device

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        what = "show names or targets containing it (any case), e.g. FastAP"
        parser.add_argument("substring", nargs="?", default="", help=what)
        parser.add_argument(
            "--kind",
            choices=LIST_KINDS,
            metavar="KIND",
            help=f"only names of this kind ({', '.join(LIST_KINDS)}), e.g. --kind losses",
        )

    def run(self, args: argparse.Namespace) -> int:
        from ..experiment import listing

        needle = args.substring.lower()
        found = 0
        for group in LIST_KINDS if args.kind is None else (args.kind,):
            rows = [(n, t) for n, t in listing(group) if needle in n.lower() or needle in t.lower()]
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
