"""functional/screened_inputs.py: the cpu path's screened checks and normalization give
validation.py's values, gradients and errors."""

import pytest
import torch

from pml_rank_plugins.functional.screened_inputs import (
    check_finite_screened,
    normalize_rows_screened,
    prepare_embeddings_screened,
)
from pml_rank_plugins.functional.validation import normalize_rows, prepare_embeddings


@pytest.mark.parametrize("case", ["ordinary", "zero row", "huge row", "tiny row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normalize_bit_identical_values_and_gradients(case, dtype):
    x = torch.randn(7, 5, dtype=dtype, generator=torch.Generator().manual_seed(0))
    if case == "zero row":
        x[2] = 0.0
    elif case == "huge row":
        x[2] *= torch.finfo(dtype).max / 10
    elif case == "tiny row":
        x[2] *= 1e-14
    upstream = torch.randn(7, 5, dtype=dtype, generator=torch.Generator().manual_seed(1))
    out = []
    for fn in (normalize_rows_screened, normalize_rows):
        x1 = x.clone().requires_grad_()
        value = fn(x1)
        out.append((value, torch.autograd.grad(value, x1, upstream)[0]))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


def test_finiteness_screen_reports_as_check_finite():
    x = torch.randn(4, 3)
    check_finite_screened(x, "x")
    check_finite_screened(torch.full((4, 3), 3e38), "x")  # the sum overflows: full check passes
    x[1, 1] = float("nan")
    with pytest.raises(ValueError, match="x contains 1 non-finite"):
        check_finite_screened(x, "x")
    ref = torch.randn(5, 3)
    ref[0, 0] = float("-inf")
    for fn in (prepare_embeddings_screened, prepare_embeddings):
        with pytest.raises(ValueError, match="ref_emb contains 1 non-finite"):
            fn(torch.randn(2, 3), ref)
    q = torch.randn(2, 3, dtype=torch.float16)
    a, b = prepare_embeddings_screened(q, q), prepare_embeddings(q, q)
    assert a[2] and b[2] and torch.equal(a[0], b[0]) and a[0].dtype == torch.float32
