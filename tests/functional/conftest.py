"""Fixtures shared by the functional tests."""

import pytest
import torch


@pytest.fixture
def two_threads():
    """torch at two intra-op threads for the test (the chunk threads' count), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
