"""``pml-rank check`` prints no Optuna chatter (issue 41, item 5): its search-space dry runs create
in-memory studies, and Optuna logs "A new study created in memory" for each at INFO."""

from __future__ import annotations

import logging

import optuna
import pytest

from pml_rank_plugins.cli import main


@pytest.mark.slow  # builds the three methods of tune_demo (several seconds)
def test_check_prints_no_optuna_study_lines(capfd):
    optuna.logging.set_verbosity(logging.INFO)  # Optuna's default: its INFO lines would show
    assert main(["check", "tune_demo", "--methods", "plugin FastAP"]) == 0
    out, err = capfd.readouterr()
    assert "plugin FastAP: data[" in out
    assert "A new study created" not in out + err
    assert optuna.logging.get_verbosity() == logging.INFO  # restored afterwards
