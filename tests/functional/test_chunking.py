"""``LabelCategories``: categories computed per chunk, also under ``torch.compile``."""

from __future__ import annotations

import pytest
import torch

from pml_rank_plugins.functional.chunking import IGNORED, LabelCategories


def _expected(labels: torch.Tensor, ref_labels: torch.Tensor, self_columns) -> torch.Tensor:
    """The loop definition: 0 same label, 1 different, 2 at each row's self column."""
    out = torch.empty(len(labels), len(ref_labels), dtype=torch.int8)
    for i in range(len(labels)):
        for j in range(len(ref_labels)):
            out[i, j] = 0 if labels[i] == ref_labels[j] else 1
        if self_columns is not None:
            out[i, self_columns[i]] = IGNORED
    return out


def _rows_in_chunks(labels, ref_labels, self_columns, chunk):
    source = LabelCategories(labels, ref_labels, self_columns)
    # .clone(): each call reuses the source's buffer.
    return torch.cat(
        [source.rows(s, min(s + chunk, len(labels))).clone() for s in range(0, len(labels), chunk)]
    )


@pytest.mark.parametrize("chunk", [6, 4])
def test_rows_equal_the_loop_definition_eager_and_compiled(chunk):
    labels = torch.tensor([3, 3, 7, 7, 9, 9])
    ref_labels = torch.tensor([7, 3, 3, 9, 7, 9, 1])
    self_columns = torch.tensor([1, 2, 0, 4, 3, 5])
    expected = _expected(labels, ref_labels, self_columns)
    assert torch.equal(_rows_in_chunks(labels, ref_labels, self_columns, chunk), expected)
    # Issue 48: the ignored pairs were written as 2 into a bool buffer through an int8 view;
    # compiled (functionalization copies the storage as bool) they read back as 1, a negative.
    torch._dynamo.reset()
    compiled = torch.compile(_rows_in_chunks, backend="aot_eager")
    assert torch.equal(compiled(labels, ref_labels, self_columns, chunk), expected)
    torch._dynamo.reset()


def test_rows_into_an_out_buffer_and_a_wrong_dtype_is_refused():
    labels = torch.tensor([0, 0, 1])
    source = LabelCategories(labels, labels, torch.arange(3))
    out = torch.full((3, 3), 5, dtype=torch.int8)
    rows = source.rows(0, 3, out=out)
    assert rows.data_ptr() == out.data_ptr()
    assert torch.equal(out, _expected(labels, labels, torch.arange(3)))
    with pytest.raises(ValueError, match="out must be an int8 buffer, got torch.bool"):
        source.rows(0, 3, out=torch.empty(3, 3, dtype=torch.bool))
