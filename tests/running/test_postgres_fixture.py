"""The ``postgres`` fixture (``tests/running/conftest.py``): one server per session, a fresh
database per test."""

from __future__ import annotations

import optuna


def test_each_test_gets_a_fresh_database_on_the_session_server(postgres, postgres_server):
    assert postgres.startswith(f"postgresql://postgres:s3cret@127.0.0.1:{postgres_server}/tune")
    assert optuna.get_all_study_summaries(storage=postgres) == []  # nothing from other tests
    optuna.create_study(study_name="left behind", storage=postgres)
    assert [s.study_name for s in optuna.get_all_study_summaries(storage=postgres)] == [
        "left behind"
    ]
