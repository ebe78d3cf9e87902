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


def test_prepare_embeddings_self_and_reference():
    from pml_rank_plugins.functional.validation import prepare_embeddings

    x = torch.randn(4, 3, dtype=torch.float16)
    queries, refs, is_self = prepare_embeddings(x, x)
    assert is_self and refs is queries and queries.dtype == torch.float32
    r = torch.randn(5, 3, dtype=torch.float16)
    queries, refs, is_self = prepare_embeddings(x, r)
    assert not is_self and refs.shape == (5, 3) and refs.dtype == torch.float32
    r[2, 1] = float("nan")
    with pytest.raises(ValueError, match="ref_emb contains 1 non-finite"):
        prepare_embeddings(x, r)
