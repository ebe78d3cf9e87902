"""Reading and writing YAML configs: :class:`ConfigLoader` (YAML 1.2 floats, bounded nesting and
alias expansion), :func:`parse_yaml`, :func:`load_yaml` (errors name the file and line) and
:func:`dump_yaml`. Re-exported by :mod:`.schema`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError

# A config is a few hundred nodes, a dozen levels deep. The bounds stop an alias bomb (nine
# levels of nine aliases: 9**9 nodes from 1.4 KB) and a deep nesting (RecursionError) at once.
MAX_YAML_DEPTH = 100
MAX_YAML_NODES = 200_000


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also reads ``1e-3`` / ``1E+5`` as floats (YAML 1.2 rule), and
    bounds nesting depth and alias expansion.

    PyYAML follows YAML 1.1, where a float needs a dot, so ``lr: 1e-3`` became the *string*
    ``"1e-3"`` and failed deep inside ``torch.optim``. Each node's *expanded* size (an alias
    counts the whole node it repeats) is computed while composing, in time linear in the text,
    so a document that would expand past :data:`MAX_YAML_NODES` is refused before it is built.
    """

    def __init__(self, stream, name: str | None = None):
        super().__init__(stream)
        if name is not None:
            self.name = name  # marks (and so every error) name the file
        self._depth = 0
        self._sizes: dict[int, int] = {}

    def _refuse(self, mark, what: str) -> ConfigError:
        return ConfigError(f"{self.name}: line {mark.line + 1}, column {mark.column + 1}: {what}")

    def construct_mapping(self, node, deep=False):
        """A key given twice in one mapping is refused (PyYAML keeps the last one silently)."""
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if (
                    isinstance(key_node, yaml.ScalarNode)
                    and key_node.tag != "tag:yaml.org,2002:merge"
                ):
                    key = self.construct_object(key_node, deep=True)
                    try:
                        first = seen.setdefault(key, key_node)
                    except TypeError:  # an unhashable key: SafeLoader's own error follows
                        continue
                    if first is not key_node:
                        raise self._refuse(
                            key_node.start_mark,
                            f"key {key!r} given twice in one mapping (first at line "
                            f"{first.start_mark.line + 1}); remove one",
                        )
        return super().construct_mapping(node, deep=deep)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise self._refuse(mark, "an alias inside the node it refers to (recursive)")
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise self._refuse(mark, f"nested deeper than {MAX_YAML_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        else:
            children = []
        size = 1 + sum(self._sizes[id(c)] for c in children)
        if size > MAX_YAML_NODES:
            raise self._refuse(
                mark, f"expands to more than {MAX_YAML_NODES} values (aliases repeating aliases?)"
            )
        self._sizes[id(node)] = size
        return node


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text with :class:`ConfigLoader` (configs and ``--set`` values).

    Args:
        text: the YAML text.
        source: what errors call it (the file, or ``--set KEY``).

    Returns:
        The parsed value.

    Raises:
        ConfigError: invalid YAML, too deep or too large once aliases are expanded; the message
            starts with ``source`` and gives the line.
    """
    loader = None
    try:
        loader = ConfigLoader(text, source)  # checks for control characters already
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise ConfigError(f"{source}: {where}invalid YAML: {what}") from None
    except yaml.reader.ReaderError as e:  # a control character, at a character offset
        line = text[: e.position].count("\n") + 1
        raise ConfigError(
            f"{source}: line {line}: invalid YAML: {e.reason} {e.character!r}"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path) -> dict:
    """Read a YAML config file (a mapping).

    Args:
        path: the file.

    Returns:
        The top-level mapping.

    Raises:
        ConfigError: not UTF-8, invalid YAML (file and line named), or not a mapping.
        OSError: the file cannot be read.
    """
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}: line {line}: not UTF-8 text (byte {raw[e.start]:#04x} at offset {e.start}); "
            "save the file as UTF-8"
        ) from None
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return data


def dump_yaml(config: dict, path: str | Path | None = None) -> str:
    text = yaml.safe_dump(config, sort_keys=False, default_flow_style=None)
    if path is not None:
        Path(path).write_text(text)
    return text
