"""The console of many runs: labelled log lines, workers' records printed by the parent, repeated
lines folded.

Every log line of a run starts with its name (``run_label``: ``[plugin FastAP seed1] epoch
3/6 ...``); ``spawn`` workers send their log records to the parent (:func:`log_to_parent` in the
worker, :class:`ToParentLoggers` behind the parent's ``QueueListener``), which prints them through
its own logging configuration (:func:`logger_levels` carries the levels over); a line that
repeats across runs is printed once, with the count at the end (:func:`repeated_logs_once`);
:func:`child_environment` sets variables the workers read when they start (``TQDM_DISABLE``).
Used by :mod:`.pool` (``compare``/``sweep``) and :mod:`.tune`.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import threading
from typing import Iterator

# One line per epoch per run by design: never folded by :func:`repeated_logs_once`.
EPOCH_LOGGER = "pml_rank_plugins.running.training"


def log_to_parent(log_queue, levels: dict) -> None:
    """Worker side: every log record goes to the parent (printed by its handlers), with the
    parent's logger levels (``spawn`` workers start with no logging configuration)."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(logging.handlers.QueueHandler(log_queue))
    logging.captureWarnings(True)  # each worker would print a library's warning once itself
    for name, level in levels.items():
        logging.getLogger(name or None).setLevel(level)


def logger_levels() -> dict[str, int]:
    """The root level (key ``""``) and every explicitly set logger level of this process."""
    levels = {"": logging.getLogger().level}
    for name, logger in logging.Logger.manager.loggerDict.items():
        if isinstance(logger, logging.Logger) and logger.level != logging.NOTSET:
            levels[name] = logger.level
    return levels


class ToParentLoggers(logging.Handler):
    """Parent side of the workers' queue: a record is handled by its logger, as if logged here."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


@contextlib.contextmanager
def run_label(label: str) -> Iterator[None]:
    """Prefix every log record created inside the block with ``[label] `` (e.g. ``[plugin
    FastAP seed1] epoch 3/6 ...``); the label is kept in ``record.run_label``.

    Args:
        label: the run's name, e.g. ``"plugin FastAP seed1"``.
    """
    previous = logging.getLogRecordFactory()

    def labelled(*args, **kwargs) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not hasattr(record, "run_label"):
            record.run_label = label
            record.msg = f"[{label}] {record.msg}"
        return record

    logging.setLogRecordFactory(labelled)
    try:
        yield
    finally:
        logging.setLogRecordFactory(previous)


class _RepeatFilter(logging.Filter):
    """Lets the first record of each (level, logger, message without run label) through."""

    def __init__(self, min_level: int):
        super().__init__()
        self.min_level = min_level
        self.counts: dict[tuple[int, str, str], int] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        decided = getattr(record, "_pml_rank_first", None)  # one verdict for all handlers
        if decided is not None:
            return decided
        if record.levelno < self.min_level or (
            record.name == EPOCH_LOGGER and record.levelno < logging.WARNING
        ):
            return True
        message = record.getMessage()
        label = getattr(record, "run_label", None)
        if label and message.startswith(f"[{label}] "):
            message = message[len(label) + 3 :]
        key = (record.levelno, record.name, message)
        with self._lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            record._pml_rank_first = self.counts[key] == 1
        return record._pml_rank_first


@contextlib.contextmanager
def repeated_logs_once(min_level: int = logging.INFO) -> Iterator[None]:
    """Inside the block, a log line (at ``min_level`` or above) that repeats -- the same level,
    logger and message, whichever run logged it -- is printed once; at the end of the block each
    such line is logged again with ``(repeated N times, shown once)``. Per-epoch lines are never
    folded. Applies to the root logger's handlers (and logging's last-resort handler).

    Args:
        min_level: the lowest level folded, e.g. ``logging.WARNING``.
    """
    fold = _RepeatFilter(min_level)
    handlers = [*logging.getLogger().handlers, logging.lastResort]
    for handler in handlers:
        if handler is not None:
            handler.addFilter(fold)
    try:
        yield
    finally:
        for handler in handlers:
            if handler is not None:
                handler.removeFilter(fold)
        for (level, name, message), count in fold.counts.items():
            if count > 1:
                logging.getLogger(name).log(
                    level, "%s (repeated %d times, shown once)", message, count
                )


@contextlib.contextmanager
def child_environment(**values: str) -> Iterator[None]:
    """Environment variables for the processes started inside the block (tqdm reads
    ``TQDM_DISABLE`` when a ``spawn`` worker imports it, before any code of ours runs there)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
