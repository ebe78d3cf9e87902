"""The config error type, in a module of its own so every config module can raise it
(:mod:`.schema` re-exports it; :mod:`.values` checks values for :mod:`.schema`)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config is malformed; the message names the offending key path (and file/line for YAML)."""
