"""The comparison table's notes: the time column says it depends on ``--jobs`` and load."""

from __future__ import annotations

from pml_rank_plugins.reporting.summary import summarize
from pml_rank_plugins.reporting.tables import markdown_table
from tests.reporting.synthetic import synthetic_results


def _after_table(text: str) -> str:
    """The lines between the first table and the next one."""
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if not line.startswith("| "))
    after = lines[end:]
    stop = next((i for i, line in enumerate(after) if line.startswith("| ")), len(after))
    return "\n".join(after[:stop])


def test_time_column_note_names_jobs_and_load():
    summary = summarize(synthetic_results(seeds=2))
    text = markdown_table(summary)
    assert "time/run (s)" in text.splitlines()[0]
    note = _after_table(text)
    assert "Time/run" in note and "`--jobs`" in note and "load" in note
    assert note.count("Time/run") == 1
