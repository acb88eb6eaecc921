"""16-bit CUDA matmuls with an odd row length get a padded, aligned result (lowering/matmul_padding.py)."""
from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from conftest import compile_strict
from torchfuse.lowering.matmul_padding import pad_unaligned_matmuls

aten = torch.ops.aten


def lm_head_and_biased(a, w, bias):
    return torch.mm(a, w.t()), torch.addmm(bias, a, w.t()), torch.addmm(bias.narrow(0, 0, 8).unsqueeze(1), a.narrow(0, 0, 8), w.narrow(0, 0, 8).t())


def _traced_for_cuda(fn, *shapes, dtype=torch.bfloat16):
    """``fn`` traced with fake CUDA tensors (no GPU needed): the rewrite decides on the metadata."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        fakes = [torch.empty(shape, dtype=dtype, device="cuda") for shape in shapes]
    return make_fx(fn, tracing_mode="fake")(*fakes)


def test_rewrite_pads_the_columns_and_gives_eager_values_and_layout():
    gm = _traced_for_cuda(lm_head_and_biased, (4096, 768), (50257, 768), (50257,))
    assert pad_unaligned_matmuls(gm) == 2  # the [8, 8] addmm is too small to pay off
    widths = {n.meta["val"].shape[-1] for n in gm.graph.nodes
              if n.target in (aten.mm.default, aten.addmm.default)}
    assert widths == {50264, 8}
    # The rewritten graph is device-agnostic: run it on the CPU against the original function.
    gen = torch.Generator().manual_seed(0)
    a, w, bias = (torch.randn(shape, generator=gen).bfloat16() for shape in ((64, 768), (50257, 768), (50257,)))
    for got, want in zip(gm(a, w, bias), lm_head_and_biased(a, w, bias)):
        assert got.stride() == want.stride()
        assert torch.equal(got, want)


@pytest.mark.parametrize("reason, shapes, dtype", [
    ("aligned already", ((4096, 768), (50256, 768), (50256,)), torch.bfloat16),
    ("float32", ((4096, 768), (50257, 768), (50257,)), torch.float32),
    ("odd inner dim", ((4096, 767), (50257, 767), (50257,)), torch.bfloat16),
])
def test_rewrite_leaves_other_matmuls_alone(reason, shapes, dtype):
    gm = _traced_for_cuda(lambda a, w, b: torch.addmm(b, a, w.t()), *shapes, dtype=dtype)
    assert pad_unaligned_matmuls(gm) == 0, reason


@pytest.mark.gpu
def test_odd_width_matmul_on_the_gpu_matches_eager_with_eager_strides():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(512, 256, generator=gen).to("cuda", torch.bfloat16)
    w = torch.randn(1001, 256, generator=gen).to("cuda", torch.bfloat16)

    def fn(a, w):
        logits = a @ w.t()
        return logits, torch.relu(logits) * 2

    got, want = compile_strict(fn)(a, w), fn(a, w)
    for g, e in zip(got, want):
        assert g.stride() == e.stride()
        torch.testing.assert_close(g, e)
    # The pad is one of our kernels (a copy of the weight with zero rows), not an ATen call.
    assert any("constant_pad_nd" in " ".join(k.ops) and k.kind != "extern"
               for g in torchfuse.report().graphs for k in g.kernels)
