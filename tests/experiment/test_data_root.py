"""Missing dataset paths (issue 50, item 6): the advice fits the user's own list, and the
published archive is named only for the shipped layout."""

from __future__ import annotations

import pytest

from pml_rank_plugins.experiment.data_root import resolve_dataset_spec
from pml_rank_plugins.experiment.schema import ConfigError

ARCHIVE = "Landmarks-clean"


def _error(spec: dict, data_root) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_dataset_spec(spec, "dataset", None if data_root is None else str(data_root))
    return str(info.value)


def test_a_users_own_list_gets_how_paths_resolve_not_the_landmarks_archive(tmp_path):
    (tmp_path / "photos").mkdir()
    own = {"LandmarksList": {"root": "photos", "list_file": "my_list.txt"}}
    message = _error(own, tmp_path)
    assert message.startswith(f"dataset.LandmarksList.list_file: {tmp_path / 'my_list.txt'}")
    assert ARCHIVE not in message and "get them from" not in message
    assert "absolute path, or relative to the data root" in message
    assert f"here the data root {tmp_path}" in message and "not to the config file" in message
    absolute = {"LandmarksList": {"root": str(tmp_path), "list_file": str(tmp_path / "l.txt")}}
    assert ARCHIVE not in _error(absolute, tmp_path)
    # no data root: relative paths start from the current folder, and the message says so
    message = _error({"LandmarksList": {"root": str(tmp_path), "list_file": "l.txt"}}, None)
    assert "here the current folder" in message and ARCHIVE not in message


def test_the_shipped_landmarks_layout_and_benchmark_readers_still_name_the_archive(tmp_path):
    shipped = {"LandmarksList": {"root": "landmarks", "list_file": "landmarks/train_list.txt"}}
    message = _error(shipped, tmp_path)
    assert f"dataset.LandmarksList.root: {tmp_path / 'landmarks'} not found" in message
    assert ARCHIVE in message and "DIR/landmarks/" in message
    (tmp_path / "landmarks").mkdir()
    message = _error(shipped, tmp_path)
    assert message.startswith("dataset.LandmarksList.list_file:") and ARCHIVE in message
    message = _error({"CUB200": {"root": "/no/such/cub"}}, tmp_path)  # a published data set
    assert "CUB_200_2011.tgz" in message
