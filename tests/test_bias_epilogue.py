"""addmm's bias moves into the pointwise kernel that reads the product (C++ target)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchfuse
from conftest import assert_close, compile_cpp, to_float64
from torchfuse.runtime.cpp_build import compiler_available

pytestmark = pytest.mark.skipif(not compiler_available(), reason="needs a C++ compiler")


def _externs() -> list[str]:
    return [op for g in torchfuse.report().graphs for k in g.kernels if k.kind == "extern" for op in k.ops]


def _check(fn, *args):
    got = compile_cpp(fn)(*args)
    assert_close(got, fn(*args), reference=fn(*to_float64(args)))
    return got


def test_linear_then_gelu_adds_the_bias_in_the_gelu_kernel():
    x, w, b = torch.randn(37, 50), torch.randn(70, 50), torch.randn(70)
    w2, b2 = torch.randn(20, 70), torch.randn(20)
    _check(lambda x, w, b, w2, b2: F.linear(F.gelu(F.linear(x, w, b)), w2, b2), x, w, b, w2, b2)
    # The first linear feeds the GELU: mm + the bias in the kernel. The second is the output: addmm.
    assert sorted(_externs()) == ["aten.addmm.default", "aten.mm.default"]


def test_linear_on_three_dims_splits_through_the_reshape():
    x, w, b = torch.randn(3, 11, 24), torch.randn(40, 24), torch.randn(40)
    _check(lambda x, w, b: x.sum() + torch.relu(F.linear(x, w, b)) * 2, x, w, b)
    assert _externs() == ["aten.mm.default"]


def test_addmm_stays_whole_where_a_non_pointwise_op_reads_it():
    x, w, b = torch.randn(16, 24), torch.randn(40, 24), torch.randn(40)
    _check(lambda x, w, b: F.linear(x, w, b).softmax(-1), x, w, b)  # a reduction reads it
    assert _externs() == ["aten.addmm.default"]
    torchfuse.reset()
    _check(lambda x, w, b: torch.addmm(b, x, w.t(), beta=0.5) + 1, x, w, b)  # scaled bias: kept as is
    assert _externs() == ["aten.addmm.default"]


def test_split_keeps_gradients_right():
    lin = torch.nn.Linear(24, 40)
    x = torch.randn(9, 24, requires_grad=True)
    compiled = compile_cpp(lambda x: F.silu(lin(x)).sum())
    compiled(x).backward()
    grads = [x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()]
    x.grad = lin.weight.grad = lin.bias.grad = None
    F.silu(lin(x)).sum().backward()
    for got, want in zip(grads, [x.grad, lin.weight.grad, lin.bias.grad]):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
