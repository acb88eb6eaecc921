"""Looped rows' ``max`` and ``sum(exp(v - max))`` in one pass (codegen/triton/online_softmax.py):
softmax, log-softmax and cross-entropy over rows too long to hold (> 4096) give eager's values,
infinities and NaN included, on the Triton target (its interpreter on a CPU)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchfuse
from conftest import DEVICE, assert_close

COLUMNS = 5003  # looped: more than a persistent row holds, and odd


def _compiled(fn):
    return torchfuse.compile(fn, options={"target": "triton", "strict": True})


def _online_kernels() -> int:
    return sum("accmax" in (k.source or "") for g in torchfuse.report().graphs for k in g.kernels)


def _rows(dtype):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(9, COLUMNS, generator=gen) * 4
    x[1, ::3] = float("-inf")  # some -inf: they add 0
    x[2] = float("-inf")  # all -inf: NaN, as eager
    x[3, 17] = float("inf")  # +inf: NaN from inf - inf, as eager
    x[4, 4000] = float("nan")
    x[5] = torch.linspace(-50, 50, COLUMNS)  # the max grows at every element of every lane
    x[6] = torch.linspace(50, -50, COLUMNS)
    x[7, :4999] = float("-inf")  # a few finite values at the end
    return x.to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_softmax_rows_in_one_pass_match_eager(op, dtype):
    fn = {"softmax": lambda x: torch.softmax(x.float(), -1), "log_softmax": lambda x: F.log_softmax(x.float(), -1)}[op]
    x = _rows(dtype)
    got, want, reference = _compiled(fn)(x), fn(x), fn(x.double())
    assert _online_kernels() >= 1
    assert_close(got, want, torch.float32, reference=reference)


def test_cross_entropy_forward_and_backward_in_one_pass_match_eager():
    gen = torch.Generator().manual_seed(8)
    logits = (torch.randn(33, COLUMNS, generator=gen) * 3).to(DEVICE, torch.bfloat16).requires_grad_()
    target = torch.randint(0, COLUMNS, (33,), generator=gen).to(DEVICE)

    def step(logits):
        loss = F.cross_entropy(logits.float(), target)
        return (loss, *torch.autograd.grad(loss, logits))

    got, want = _compiled(step)(logits), step(logits)
    reference = step(logits.detach().double().requires_grad_())
    assert _online_kernels() == 1
    assert_close(list(got), list(want), torch.bfloat16, reference=list(reference))


def test_only_the_max_of_the_same_values_pairs():
    """``sum(exp(y - max(x)))`` is not a softmax's normalizer: two loops, as before."""
    gen = torch.Generator().manual_seed(9)
    x, y = (torch.randn(4, COLUMNS, generator=gen).to(DEVICE) for _ in range(2))

    def fn(x, y):
        return (y - x.amax(-1, keepdim=True)).exp().sum(-1)

    got = _compiled(fn)(x, y)
    assert _online_kernels() == 0
    assert_close(got, fn(x, y), torch.float32, reference=fn(x.double(), y.double()))
