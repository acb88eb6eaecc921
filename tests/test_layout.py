"""Kernels walk memory in its stored order (codegen/layout.py): neighbouring iterations of the
innermost block axis touch neighbouring elements, which on a GPU is what makes a warp's loads
and stores coalesced. Checked statically on the generated index expressions, then by running."""
from __future__ import annotations

import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from conftest import DEVICE, assert_close, compile_strict
from torchfuse.codegen.triton.kernel import XINDEX, KernelRenderer
from torchfuse.ir.expr import loads
from torchfuse.ir.symbols import simplify_index
from torchfuse.lowering.driver import lower
from torchfuse.scheduler.schedule import schedule


def bn_add_relu(x, scale, shift, residual):
    """Inference batch norm folded to a per-channel affine, a residual add and ReLU: ResNet's
    block tail, on channels-last activations."""
    return torch.relu(x * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1) + residual)


def _inputs(n=4, c=24, h=7, w=5):
    gen = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(n, c, h, w, generator=gen).to(memory_format=torch.channels_last) for _ in range(2))
    return x, torch.randn(c, generator=gen), torch.randn(c, generator=gen), residual


def _steps_along_xindex(offset: sympy.Expr) -> sympy.Expr:
    """How far an offset moves between neighbouring lanes (xindex and xindex + 1)."""
    return simplify_index(offset.xreplace({XINDEX: XINDEX + 1}) - offset)


def test_channels_last_pointwise_kernel_walks_its_store_and_large_loads_contiguously():
    args = _inputs()
    graph = lower(make_fx(bn_add_relu)(*args), "g")
    (kernel,) = schedule(graph).kernels
    renderer = KernelRenderer(kernel, graph.buffers)
    (member,) = [m for m in kernel.members if m.stored]
    out = graph.buffers[member.node.name]
    store = out.flat_offset(tuple(member.var_map.get(v, v) for v in member.node.vars))
    assert simplify_index(store.xreplace(renderer.flat)) == XINDEX
    full_size = [load for load in loads(renderer.flat_body(member))
                 if graph.buffers[load.buffer].numel == out.numel]
    assert len(full_size) == 2  # x and the residual
    for load in full_size:
        offset = graph.buffers[load.buffer].flat_offset(load.index)
        assert _steps_along_xindex(offset) == 1, (load.buffer, offset)


def test_channels_last_pointwise_kernel_matches_eager():
    args = tuple(a.to(DEVICE) for a in _inputs(3, 17, 6, 5))
    got = compile_strict(bn_add_relu)(*args)
    assert got.stride() == bn_add_relu(*args).stride()
    assert_close(got, bn_add_relu(*args), reference=bn_add_relu(*(a.double() for a in args)))
