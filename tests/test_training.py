"""Forward and backward through aot_autograd: gradients match a float64 reference."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import torchfuse
from conftest import DEVICE, compile_strict, generated_kernel_count
from torchfuse.models.llama import make_llama_block


def _relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.double() - reference.double()).norm() / reference.double().norm().clamp_min(1e-30)).item()


def _loss_and_grads(model, x):
    x = x.clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    out = model(x)
    out.double().pow(2).mean().backward()
    return [out.detach(), x.grad] + [p.grad for p in model.parameters()]


def test_llama_block_forward_and_backward_match_float64():
    model, x = make_llama_block(DEVICE, torch.float32, "small")
    reference = _loss_and_grads(copy.deepcopy(model).double(), x.double())
    eager = _loss_and_grads(model, x)
    ours = _loss_and_grads(compile_strict(model), x)
    for got, want, ref in zip(ours, eager, reference):
        assert torch.isfinite(got).all()
        assert _relative_error(got, ref) <= max(4 * _relative_error(want, ref), 1e-6)
    kinds = {g.kind for g in torchfuse.report().graphs}
    assert {"forward", "backward"} <= kinds


def test_cross_entropy_forward_and_backward():
    logits = torch.randn(37, 101, device=DEVICE, requires_grad=True)
    target = torch.randint(0, 101, (37,), device=DEVICE)
    compiled = compile_strict(F.cross_entropy)
    loss = compiled(logits, target)
    (grad,) = torch.autograd.grad(loss, logits)
    logits64 = logits.detach().double().requires_grad_()
    ref_loss = F.cross_entropy(logits64, target)
    (ref_grad,) = torch.autograd.grad(ref_loss, logits64)
    assert abs(loss.item() - ref_loss.item()) < 1e-5
    assert _relative_error(grad, ref_grad) < 1e-5
    assert generated_kernel_count() <= 4


def test_inference_graph_when_no_grad_is_needed():
    model, x = make_llama_block(DEVICE, torch.float32, "small")
    with torch.no_grad():
        compile_strict(model)(x)
    assert [g.kind for g in torchfuse.report().graphs] == ["inference"]
