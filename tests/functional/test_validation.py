import pytest
import torch

from pml_rank_plugins.functional.validation import check_finite, compute_dtype


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_check_finite_rejects_non_finite(bad):
    x = torch.zeros(3, 2)
    x[1, 0] = bad
    with pytest.raises(ValueError, match="embeddings contains 1 non-finite"):
        check_finite(x, "embeddings")


def test_check_finite_accepts_finite():
    check_finite(torch.randn(4, 3), "embeddings")


@pytest.mark.parametrize(
    "given, expected",
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_compute_dtype_promotes_half_precision(given, expected):
    assert compute_dtype(given) == expected
