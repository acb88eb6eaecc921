"""The foundation's fusion patterns: correct against float64, and fused into few kernels."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import DEVICE, assert_close, compile_strict, generated_kernel_count, to_float64


def bias_gelu(x, b):
    return F.gelu(x * 1.5 + b)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


def scaled_softmax(x):
    return torch.softmax(x * 0.125, -1)


def add_rmsnorm(x, r, w):
    h = x + r
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w, h


SHAPES = [(37, 65), (4, 3, 130), (1, 7)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "fn, extra, kernels",
    [(bias_gelu, "b", 1), (layer_norm, "wb", 1), (scaled_softmax, "", 1), (add_rmsnorm, "rw", 1)],
    ids=["bias_gelu", "layer_norm", "scaled_softmax", "add_rmsnorm"],
)
def test_pattern_is_correct_and_fused(fn, extra, kernels, shape):
    x = torch.randn(shape, device=DEVICE)
    args = [x]
    for name in extra:
        args.append(torch.randn(shape, device=DEVICE) if name == "r" else torch.randn(shape[-1], device=DEVICE))
    compiled = compile_strict(fn)
    assert_close(compiled(*args), fn(*args), reference=fn(*to_float64(args)))
    assert generated_kernel_count() == kernels


def test_non_contiguous_and_broadcast_inputs():
    x = torch.randn(65, 37, device=DEVICE).t()  # non-contiguous
    b = torch.randn(1, 65, device=DEVICE)  # broadcast over rows
    compiled = compile_strict(bias_gelu)
    assert_close(compiled(x, b), bias_gelu(x, b), reference=bias_gelu(x.double(), b.double()))
    assert generated_kernel_count() == 1


def test_looped_reduction_matches_eager():
    x = torch.randn(3, 9000, device=DEVICE)  # longer than a persistent row
    compiled = compile_strict(scaled_softmax)
    assert_close(compiled(x), scaled_softmax(x), reference=scaled_softmax(x.double()))


@pytest.mark.parametrize("name", ["rmsnorm_backward", "grouped_heads_sum", "short_rows_layer_norm", "window_softmax",
                                  "long_rows_layer_norm", "bn_relu_backward_channels_last"])
def test_reduction_micro_cases_match_float64(name):
    """The bench's micro cases for slow reduction shapes (a norm's weight gradient, grouped-query
    heads' gradient sums, layer norms and softmaxes of short rows), at the test size, against float64."""
    from torchfuse.bench.patterns import BY_NAME, to_reference

    pattern = BY_NAME[name]
    inputs = pattern.make_inputs(DEVICE, torch.float32, "small", seed=3)
    compiled = compile_strict(pattern.fn)
    assert_close(compiled(*inputs), pattern.fn(*inputs), reference=pattern.fn(*to_reference(inputs)))
