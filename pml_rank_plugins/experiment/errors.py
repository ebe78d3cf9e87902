"""The config and run-folder error types, in a module of their own so every config module can
raise them (:mod:`.schema` re-exports :class:`ConfigError`; :mod:`.values` checks values for
:mod:`.schema`; :class:`RunFolderError` is :mod:`pml_rank_plugins.running.run_folder`'s, defined
here because :meth:`~pml_rank_plugins.experiment.RunSpec.load` reads run folders)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config is malformed; the message names the offending key path (and file/line for YAML)."""


class RunFolderError(RuntimeError):
    """The run folder cannot be used as asked (the message says why and what to do)."""
