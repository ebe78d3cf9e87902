"""The device-safe bad-input classes on the backends that read no value back (issue 49, item 3).

On ``gpu`` / ``triton`` (``check_values`` off) an out-of-range ``indices_tuple`` / ``self_index``
entry is clamped on the device and the loss is NaN (was an ``IndexError`` on the CPU, a
device-side assert on CUDA, or for a negative index a silent wrap-around), and a NaN/inf embedding
gives a NaN loss; :func:`diagnose_non_finite` then names the argument and the bad element, as the
``cpu`` backend's checks do at the call. None of these inputs ends in an ``IndexError``, and none
adds a host sync (``OpCounter(forbid_syncs=True)``).
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from pml_rank_plugins.functional.backend import use_backend
from pml_rank_plugins.losses import (
    CrossBatchMemory,
    FastAPLoss,
    QuantizedAPLoss,
    RankedListLoss,
    diagnose_non_finite,
)
from pml_rank_plugins.miners import RankedListMiner
from pml_rank_plugins.utils.op_count import OpCounter

N, M = 8, 12  # queries; reference rows of ref_emb

LOSSES = {
    "FastAP": lambda: FastAPLoss(num_bins=5),
    "mAP_Q": lambda: QuantizedAPLoss(num_bins=5),
    "RankedList": lambda: RankedListLoss(),
    "RankedList gallery": lambda: RankedListLoss(gallery_gradient=True),
}


def _batch():
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(N, 4, generator=gen)
    ref = torch.randn(M, 4, generator=gen)
    return emb, torch.arange(N) % 2, ref, torch.arange(M) % 2


def _index_case(kind: str, k: int, bad: int):
    """A pair (``kind="pairs"``) or triplet tuple with entry ``k`` replaced by ``bad`` and the
    message the ``cpu`` backend gives for it (anchors index the N queries, the rest the N rows of
    the batch itself)."""
    if kind == "pairs":
        names, tup = ("positive anchors", "positives", "negative anchors", "negatives"), [
            0,
            2,
            0,
            1,
        ]
    else:
        names, tup = ("anchors", "positives", "negatives"), [0, 2, 1]
    tup[k] = bad
    if bad < 0:
        message = rf"indices_tuple\[{k}\] \({names[k]}\) has negative index {bad}"
    else:
        rows = "query" if names[k].endswith("anchors") else "reference"
        message = rf"indices_tuple\[{k}\] \({names[k]}\) has index {bad} >= {N} {rows} rows"
    return {"indices_tuple": tup}, message


def _cases():
    cases = {}
    for bad in (-1, 40):
        for kind, width in (("pairs", 4), ("triplets", 3)):
            for k in range(width):
                cases[f"{kind}[{k}]={bad}"] = _index_case(kind, k, bad)
        cases[f"self_index={bad}"] = (
            {"self_index": bad},
            r"self_index entries must be .* \[0, 12\)",
        )
    cases["self_index of another label"] = ({"self_index": "label"}, r"self_index\[3\] = 4 is not")
    for value in ("nan", "inf", "-inf"):
        cases[f"embeddings={value}"] = (
            {"embeddings": value},
            rf"embeddings contains 1 non-finite value\(s\).*embeddings\[2, 1\] = {value}",
        )
        cases[f"ref_emb={value}"] = (
            {"ref_emb": value},
            rf"ref_emb contains 1 non-finite value\(s\).*ref_emb\[5, 0\] = {value}",
        )
    return cases


CASES = _cases()


def _arguments(spec: dict):
    """The call's ``(args, kwargs)`` for a case of :func:`_cases`, made on the test device."""
    emb, labels, ref, ref_labels = _batch()
    kwargs = {}
    if "indices_tuple" in spec:
        kwargs["indices_tuple"] = tuple(torch.tensor([i]) for i in spec["indices_tuple"])
    if "self_index" in spec:
        self_index = torch.arange(N)  # column i of ref holds label i % 2, query i's
        if spec["self_index"] == "label":
            self_index[3] = 4
        else:
            self_index[3] = spec["self_index"] if spec["self_index"] < 0 else M + 5
        kwargs.update(ref_emb=ref, ref_labels=ref_labels, self_index=self_index)
    if "embeddings" in spec:
        emb[2, 1] = float(spec["embeddings"])
    if "ref_emb" in spec:
        ref[5, 0] = float(spec["ref_emb"])
        kwargs.update(ref_emb=ref, ref_labels=ref_labels)
    return (emb.requires_grad_(), labels), kwargs


def _diagnose(loss, args, kwargs):
    return diagnose_non_finite(
        loss,
        *args,
        kwargs.get("indices_tuple"),
        kwargs.get("ref_emb"),
        kwargs.get("ref_labels"),
        self_index=kwargs.get("self_index"),
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(LOSSES))
def test_a_bad_input_on_gpu_is_a_nan_loss_and_the_replay_names_it(name, case):
    spec, message = CASES[case]
    args, kwargs = _arguments(spec)
    loss_func = LOSSES[name]()
    with use_backend("gpu"), OpCounter(forbid_syncs=True):  # no IndexError, and no host sync
        loss = loss_func(*args, **kwargs)
    assert math.isnan(float(loss.detach())), loss
    loss.backward()  # the graph stays usable; a flagged loss has a zero (not NaN) gradient
    with use_backend("gpu"):
        cause = _diagnose(loss_func, args, kwargs)
    assert cause is not None and cause.startswith(f"{type(loss_func).__name__}: "), cause
    assert re.search(message, cause), cause
    # the cpu backend refuses the same input at the call with the same message
    with pytest.raises(ValueError, match=message):
        with use_backend("cpu"):
            LOSSES[name]()(*args, **kwargs)


@pytest.mark.parametrize("name", ["FastAP", "RankedList"])
def test_the_flag_is_per_call_and_valid_inputs_are_untouched(name):
    # Valid indices and self_index: the same value as the cpu backend, and finite.
    args, _ = _arguments({})
    emb, labels, ref, ref_labels = _batch()
    for kwargs in (
        {"indices_tuple": tuple(torch.tensor(i) for i in ([0, 1], [2, 3], [0, 1], [1, 2]))},
        {"ref_emb": ref, "ref_labels": ref_labels, "self_index": torch.arange(N)},
    ):
        with use_backend("gpu"):
            value = LOSSES[name]()(*args, **kwargs)
        with use_backend("cpu"):
            expected = LOSSES[name]()(*args, **kwargs)
        torch.testing.assert_close(value, expected)
        with use_backend("gpu"):
            assert _diagnose(LOSSES[name](), args, kwargs) is None


# The Ranked List family's triton backend (the fused kernel) runs only in Triton's interpreter on
# the CPU: its bad-index case is one of the interpreter cases of
# tests/functional/ranked_list/test_ranked_list_triton.py ("bad_indices_nan_loss").


def test_check_values_on_the_loss_still_raises_at_the_call():
    args, kwargs = _arguments(CASES["pairs[3]=40"][0])
    with pytest.raises(ValueError, match=CASES["pairs[3]=40"][1]):
        FastAPLoss(backend="gpu", check_values=True)(*args, **kwargs)


def test_the_replay_restores_check_values_and_a_valid_nan_is_none():
    loss_func = RankedListLoss(backend="gpu")
    args, kwargs = _arguments(CASES["embeddings=nan"][0])
    assert _diagnose(loss_func, args, kwargs) is not None
    assert loss_func.check_values is None  # restored
    # PML's own loss (no check_values switch): the embeddings are checked for NaN/inf
    from pytorch_metric_learning.losses import ContrastiveLoss

    cause = _diagnose(ContrastiveLoss(), args, kwargs)
    assert cause.startswith("ContrastiveLoss: embeddings contains 1 non-finite"), cause
    assert _diagnose(ContrastiveLoss(), *_arguments({})) is None


def test_a_cross_batch_memory_is_refused_naming_its_inner_loss():
    args, kwargs = _arguments({})
    with pytest.raises(ValueError, match=r"pass its \.loss"):
        _diagnose(CrossBatchMemory(FastAPLoss(), 4, memory_size=16), args, kwargs)


@pytest.mark.parametrize("bad", [-1, 40, "label"])
def test_the_miner_flags_a_bad_self_index_with_nan_weights(bad):
    # (the miner reads its pair counts back anyway; the flag itself is device-side)
    args, kwargs = _arguments({"self_index": bad})
    miner = RankedListMiner()
    with use_backend("gpu"):
        pairs = miner(args[0], args[1], kwargs["ref_emb"], kwargs["ref_labels"],
                      self_index=kwargs["self_index"])  # fmt: skip
    assert len(pairs.weights) and torch.isnan(pairs.weights).all()
    with pytest.raises(ValueError, match="self_index"):
        RankedListMiner(check_values=True, backend="gpu")(
            args[0], args[1], kwargs["ref_emb"], kwargs["ref_labels"],
            self_index=kwargs["self_index"],
        )  # fmt: skip


@pytest.mark.parametrize("name", ["FastAP", "RankedList"])
@pytest.mark.parametrize("kind", ["pairs", "triplets", "self_index"])
def test_the_safety_costs_no_sync_and_at_most_18_operators(monkeypatch, name, kind):
    # Measured against the same call with the clamping switched off (valid inputs, forward and
    # backward): 0 syncs either way; FastAP +18 / +15 / +11 operators (pairs / triplets /
    # self_index), RankedList the same, and nothing at all without indices or self_index.
    from pml_rank_plugins.losses import self_index as self_index_module

    emb, labels, ref, ref_labels = _batch()
    given = {
        "pairs": {
            "indices_tuple": tuple(torch.tensor(i) for i in ([0, 1], [2, 3], [0, 1], [1, 2]))
        },
        "triplets": {"indices_tuple": tuple(torch.tensor([i]) for i in (0, 2, 1))},
        "self_index": {"ref_emb": ref, "ref_labels": ref_labels, "self_index": torch.arange(N)},
    }[kind]

    def count(**kwargs):
        x = emb.clone().requires_grad_()
        with use_backend("gpu"), OpCounter(forbid_syncs=True) as ops:
            LOSSES[name]()(x, labels, **kwargs).backward()
        return ops.total

    count(**given)  # a first call makes the kernels' cached constants: not counted
    safe, plain = count(**given), count()
    monkeypatch.setattr(self_index_module, "_safe_indices_tuple", lambda t, e, r: (t, None))
    monkeypatch.setattr(self_index_module, "clamp_self_index", lambda s, lab, ref_lab: (s, None))
    assert 0 < safe - count(**given) <= 18
    assert count() == plain
