"""A graph's inputs take the strides of the real inputs when those differ from the traced ones
(lowering/input_strides.py): aot_autograd restrides a backward's example inputs with the strides
the compiled forward reported for what it saves, and leaves the placeholders as traced."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from torchfuse.lowering.input_strides import adopt_input_strides

aten = torch.ops.aten


def _traced(fn, *shapes):
    mode = FakeTensorMode()
    with mode:
        fakes = [torch.empty(shape) for shape in shapes]
    return make_fx(fn, tracing_mode="fake")(*fakes), mode


def _padded_like(mode, shape, width):
    with mode:
        return torch.empty_strided(shape, (width, 1))


def test_inputs_take_the_real_strides_and_the_graph_still_computes_eagers_values():
    def backward(saved, grad):  # rows read pointwise and viewed along their leading dims
        return (saved.exp() * grad).view(2, 8, 13), saved.sum(0)

    gm, mode = _traced(backward, (16, 13), (16, 13))
    padded = _padded_like(mode, (16, 13), 16)
    assert adopt_input_strides(gm, [padded, gm.graph.find_nodes(op="placeholder")[1].meta["val"]]) == ["saved_1"]
    assert gm.graph.find_nodes(op="placeholder")[0].meta["val"].stride() == (16, 1)
    assert not any(n.target is aten.clone.default for n in gm.graph.nodes)
    storage = torch.randn(16, 16)
    saved, grad = storage[:, :13], torch.randn(16, 13)
    for got, want in zip(gm(saved, grad), backward(saved.contiguous(), grad)):
        assert torch.equal(got, want)


def test_a_view_the_real_strides_cannot_take_reads_a_contiguous_copy():
    def backward(saved):
        return saved.view(-1) * 2  # merges the padded rows: no view of them exists

    gm, mode = _traced(backward, (16, 13))
    assert adopt_input_strides(gm, [_padded_like(mode, (16, 13), 16)]) == ["saved_1, through a contiguous copy"]
    copies = [n for n in gm.graph.nodes if n.target is aten.clone.default]
    assert len(copies) == 1 and copies[0].meta["val"].stride() == (13, 1)
    saved = torch.randn(16, 16)[:, :13]
    assert torch.equal(gm(saved), backward(saved.contiguous()))


def test_the_same_strides_or_symbolic_ones_change_nothing():
    gm, mode = _traced(lambda x: x * 2, (4, 5))
    same = gm.graph.find_nodes(op="placeholder")[0].meta["val"]
    assert adopt_input_strides(gm, [same]) == []
    assert adopt_input_strides(gm, [3]) == []
