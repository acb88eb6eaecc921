"""max_pool2d lowered as a pointwise max over the window (lowering/rules/pooling.py).

Values are a max, exact in any dtype, so they must equal eager's bit for bit (NaN where
eager has NaN); indices must equal eager's exactly (the backward scatters through them).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchfuse
from conftest import compile_strict
from opcheck import NAN, INF, fallbacks, floats

# (shape, kernel, stride, padding, dilation, ceil_mode)
CASES = [
    ((2, 3, 8, 8), 2, 2, 0, 1, False),
    ((2, 3, 9, 11), 2, 2, 0, 1, False),  # odd sizes: the last row/column is dropped
    ((2, 3, 9, 11), 2, 2, 0, 1, True),  # ceil mode: a last window past the end
    ((2, 3, 9, 11), 3, 2, 1, 1, False),  # padding
    ((2, 3, 9, 11), 3, 2, 1, 1, True),
    ((3, 10, 7), 2, 1, 0, 1, False),  # 3-d input, overlapping windows
    ((2, 3, 12, 13), 3, 2, 1, 2, True),  # dilation
    ((1, 2, 8, 9), (2, 3), (1, 2), (1, 1), 1, True),  # per-dim parameters
]


def _inputs(shape, dtype=torch.float32, seed=0):
    x = floats(shape, dtype, specials=(NAN, INF, -INF, 0.0, -0.0), seed=seed)
    x.view(-1)[17] = NAN  # a NaN inside the input, not only on the first window
    return x


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_values_and_indices_match_eager(case):
    shape, k, s, p, d, ceil = case
    x = _inputs(shape)
    fn = lambda x: F.max_pool2d_with_indices(x, k, s, p, d, ceil)  # noqa: E731
    got, want = compile_strict(fn)(x), fn(x)
    assert torch.equal(got[1], want[1])
    assert torch.allclose(got[0], want[0], equal_nan=True, rtol=0, atol=0)
    assert "aten.max_pool2d_with_indices.default" not in fallbacks()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_other_float_dtypes(dtype):
    x = _inputs((2, 4, 7, 10), dtype)
    fn = lambda x: F.max_pool2d(x, 3, 2, 1) * 2  # noqa: E731
    assert torch.allclose(compile_strict(fn)(x), fn(x), equal_nan=True, rtol=0, atol=0)


def test_channels_last_and_sliced_inputs():
    x = _inputs((2, 6, 10, 12)).contiguous(memory_format=torch.channels_last)
    fn = lambda x, y: (F.max_pool2d(x, 2), F.max_pool2d(y[:, 1:5, ::2, 1:], 2, 1))  # noqa: E731
    y = _inputs((2, 6, 20, 13), seed=1)
    for got, want in zip(compile_strict(fn)(x, y), fn(x, y)):
        assert torch.allclose(got, want, equal_nan=True, rtol=0, atol=0)


def test_relu_batchnorm_epilogue_fuses_into_the_pool():
    """The pool's loads recompute BatchNorm + ReLU: one kernel, no stored activation."""
    x = _inputs((2, 8, 16, 16))
    params = [floats((8,), torch.float32, low=0.5, high=2.0, specials=(), seed=i) for i in range(4)]

    def fn(x, w, b, mean, var):
        return F.max_pool2d(F.relu(F.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5)), 2)

    with torch.no_grad():
        got, want = compile_strict(fn)(x, *params), fn(x, *params)
        ref = fn(x.double(), *(p.double() for p in params))
    finite = torch.isfinite(want)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.allclose(got[finite].double(), ref[finite], rtol=1e-5, atol=1e-6)
    graph = torchfuse.report().graphs[0]
    assert [k.kind for k in graph.kernels] == ["pointwise"], graph


def test_backward_uses_the_indices():
    x = _inputs((2, 3, 9, 11), seed=2).nan_to_num().requires_grad_()
    fn = lambda x: (F.max_pool2d(x, 3, 2, 1, ceil_mode=True) ** 2).sum()  # noqa: E731
    (got,) = torch.autograd.grad(compile_strict(fn)(x), x)
    (want,) = torch.autograd.grad(fn(x), x)
    assert torch.allclose(got, want)
