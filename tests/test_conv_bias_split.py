"""GPU-target convolutions lose their bias to our pointwise kernels (lowering/bias_epilogue.py).

ATen adds a cuDNN convolution's bias with a kernel of its own; split, the add joins the kernel
after the convolution. On this machine the Triton target runs through Triton's interpreter,
so the whole path (rewrite, lowering, the fused add) runs here as it does on a GPU.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from conftest import assert_close, compile_strict, to_float64
from torchfuse.lowering.bias_epilogue import split_convolution_bias

aten = torch.ops.aten


def _traced_for_cuda(fn, *tensors):
    """``fn`` traced with fake CUDA tensors of ``tensors``' shapes and strides (no GPU needed)."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda") for t in tensors]
    return make_fx(fn, tracing_mode="fake")(*fakes)


def _convolutions(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is aten.convolution.default]


CASES = {
    "conv2d channels-last": (lambda x, w, b: F.conv2d(x, w, b, padding=1),
                             lambda g: [torch.randn(2, 8, 7, 5, generator=g).to(memory_format=torch.channels_last),
                                        torch.randn(6, 8, 3, 3, generator=g), torch.randn(6, generator=g)]),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2),
               lambda g: [torch.randn(3, 4, 11, generator=g), torch.randn(5, 4, 3, generator=g), torch.randn(5, generator=g)]),
    "grouped conv3d": (lambda x, w, b: F.conv3d(x, w, b, groups=2),
                       lambda g: [torch.randn(1, 4, 3, 4, 5, generator=g), torch.randn(6, 2, 2, 2, 2, generator=g),
                                  torch.randn(6, generator=g)]),
    "transposed conv2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2),
                          lambda g: [torch.randn(2, 4, 3, 5, generator=g), torch.randn(4, 3, 2, 2, generator=g),
                                     torch.randn(3, generator=g)]),
}


@pytest.mark.parametrize("case", CASES)
def test_rewrite_gives_a_biasless_convolution_and_eager_values_and_strides(case):
    fn, make = CASES[case]
    inputs = make(torch.Generator().manual_seed(len(case)))
    gm = _traced_for_cuda(fn, *inputs)
    assert split_convolution_bias(gm) == 1
    assert [n.args[2] for n in _convolutions(gm)] == [None]
    # The rewritten graph is device-agnostic: run it on the CPU against the original function.
    got, want = gm(*inputs), fn(*inputs)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_rewrite_leaves_biasless_convolutions_alone():
    x, w = torch.randn(2, 3, 6, 6), torch.randn(4, 3, 3, 3)
    gm = _traced_for_cuda(lambda x, w: F.conv2d(x, w), x, w)
    assert split_convolution_bias(gm) == 0


def _squeeze_excite(x, w1, b1, w2, b2):
    """A squeeze-excite gate as EfficientNet has it: both 1x1 convolutions carry a bias."""
    s = x.mean((2, 3), keepdim=True)
    s = F.silu(F.conv2d(s, w1, b1))
    return x * torch.sigmoid(F.conv2d(s, w2, b2))


def _se_inputs(seed: int, requires_grad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 16, 5, 7, generator=g).to(memory_format=torch.channels_last)
    params = [torch.randn(4, 16, 1, 1, generator=g), torch.randn(4, generator=g),
              torch.randn(16, 4, 1, 1, generator=g), torch.randn(16, generator=g)]
    return [t.requires_grad_(requires_grad) for t in (x, *params)]


def test_triton_target_adds_the_bias_in_the_next_kernel():
    inputs = _se_inputs(0)
    got = compile_strict(_squeeze_excite, options={"target": "triton"})(*inputs)
    assert_close(got, _squeeze_excite(*inputs), reference=_squeeze_excite(*to_float64(inputs)))
    assert got.stride() == _squeeze_excite(*inputs).stride()
    report = torchfuse.report().graphs[0]
    # Both convolutions run without a bias; no ATen add follows them.
    calls = [line for line in report.wrapper_source.splitlines() if "tf_aten_op" in line and "(" in line and "=" in line]
    assert len(calls) == 2 and all(", None, [" in line for line in calls), calls
    assert not any("aten.add" in op for k in report.kernels if k.kind == "extern" for op in k.ops)


def test_triton_target_training_gradients_match_eager():
    inputs = _se_inputs(1, requires_grad=True)
    compiled = compile_strict(lambda *a: _squeeze_excite(*a).square().sum(), options={"target": "triton"})
    compiled(*inputs).backward()
    got = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    reference = [t.detach().double().requires_grad_() for t in inputs]
    _squeeze_excite(*reference).square().sum().backward()
    _squeeze_excite(*inputs).square().sum().backward()
    for g, e, r in zip(got, [t.grad for t in inputs], [t.grad for t in reference]):
        assert_close(g, e, reference=r)
