"""Helpers shared by the model cases (models.py, models_hf.py, models_vision.py)."""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch import nn

from torchfuse.bench import patterns
from torchfuse.bench.cases import Workload, training_workload


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Batch-norm running statistics away from their identity defaults (eval mode would hide bugs)."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.copy_(0.1 * torch.randn(module.num_features, generator=gen))
            module.running_var.copy_(1 + 0.1 * torch.rand(module.num_features, generator=gen))
    return model


def checked_training(model: nn.Module, inputs: tuple, loss_of: Callable[[Any], torch.Tensor],
                     dtype: torch.dtype, note: str, autocast: torch.dtype | None = None) -> Workload:
    """A training step (``cases.training_workload``) judged against the same step in float64.

    Compared with eager alone, a bf16 training step's gradients differ by about eager's own
    rounding error (1-2% for a few layers on a CPU, more with depth), so any fixed bound is either
    loose or fails a correct compile of a deep model. Against float64 the runner accepts twice
    eager's own error: the bound grows with the model's depth as eager's error does. On an H200 the
    float64 step of these models takes well under a second.
    """
    workload = training_workload(model, inputs, loss_of, dtype, note, autocast)
    workload.reference = lambda: float64_training_step(model, inputs, loss_of)
    return workload


def float64_training_step(model: nn.Module, inputs: tuple, loss_of: Callable[[Any], torch.Tensor]) -> tuple:
    """The loss and every parameter's gradient of one step of a float64 copy of ``model`` (no
    autocast), in the order ``training_workload`` returns them. Batch norm in train mode
    normalizes with the batch's statistics, so the copy's running statistics do not matter."""
    model64 = copy.deepcopy(model).double()
    params = [p for p in model64.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    loss = loss_of(model64(*patterns.to_reference(inputs)))
    loss.backward()
    return (loss.detach(), *[p.grad for p in params])
