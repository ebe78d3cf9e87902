"""Behaviour shared by FastAPLoss and QuantizedAPLoss (``losses/histogram_ap_base.py``)."""

import pytest
import torch

from pml_rank_plugins.losses import FastAPLoss, QuantizedAPLoss

LOSSES = [FastAPLoss, QuantizedAPLoss]


# -- empty batch / empty reference set (issue 12.10): zero loss on the graph, all skipped -----
@pytest.mark.parametrize("loss_class", LOSSES)
def test_empty_batch_gives_connected_zero_loss(loss_class):
    emb = torch.zeros(0, 4, requires_grad=True)
    loss_fn = loss_class()
    loss = loss_fn(emb, torch.zeros(0, dtype=torch.long))
    assert loss.item() == 0 and loss.requires_grad
    loss.backward()
    assert emb.grad is not None and emb.grad.shape == (0, 4)
    assert loss_fn.num_valid_queries == 0 and loss_fn.num_skipped_queries == 0


@pytest.mark.parametrize("loss_class", LOSSES)
def test_empty_ref_emb_gives_connected_zero_loss_every_query_skipped(loss_class):
    emb = torch.randn(5, 4, requires_grad=True)
    ref = torch.zeros(0, 4, requires_grad=True)
    loss_fn = loss_class()
    loss = loss_fn(emb, torch.arange(5) % 2, ref_emb=ref, ref_labels=torch.zeros(0).long())
    assert loss.item() == 0 and loss.requires_grad
    loss.backward()
    assert torch.equal(emb.grad, torch.zeros(5, 4))
    assert ref.grad is not None and ref.grad.shape == (0, 4)
    assert loss_fn.num_valid_queries == 0 and loss_fn.num_skipped_queries == 5


@pytest.mark.parametrize("loss_class", LOSSES)
def test_empty_queries_against_a_reference_set(loss_class):
    emb = torch.zeros(0, 4, requires_grad=True)
    ref = torch.randn(6, 4, requires_grad=True)
    loss_fn = loss_class()
    loss = loss_fn(emb, torch.zeros(0).long(), ref_emb=ref, ref_labels=torch.arange(6) % 2)
    assert loss.item() == 0 and loss.requires_grad
    loss.backward()
    assert torch.equal(ref.grad, torch.zeros(6, 4))
    assert loss_fn.num_valid_queries == 0 and loss_fn.num_skipped_queries == 0


@pytest.mark.parametrize("loss_class", LOSSES)
def test_no_valid_query_gives_zero_gradient_on_both_sides(loss_class):
    # Every query lacks a negative (one class): all skipped, zero loss, zero (not None) gradient
    # for the queries and the reference set alike.
    emb = torch.randn(4, 3, requires_grad=True)
    ref = torch.randn(3, 3, requires_grad=True)
    loss_fn = loss_class()
    loss = loss_fn(emb, torch.zeros(4).long(), ref_emb=ref, ref_labels=torch.zeros(3).long())
    loss.backward()
    assert loss.item() == 0 and loss_fn.num_skipped_queries == 4
    assert torch.equal(emb.grad, torch.zeros(4, 3)) and torch.equal(ref.grad, torch.zeros(3, 3))
