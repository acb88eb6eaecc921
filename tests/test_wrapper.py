"""The generated wrapper: what it keeps alive while a graph runs."""
from __future__ import annotations

import weakref

import torch

from conftest import DEVICE, compile_strict
from torchfuse.runtime.wrapper import direct_binding


def _record_extern_calls(monkeypatch) -> list[int]:
    """Wrap every ATen op the wrapper calls; returns, per call, how many results of earlier calls
    are still alive when it starts."""
    from torchfuse.runtime import wrapper

    alive_at_call: list[int] = []
    results: list[weakref.ref] = []

    def recording(op):
        def call(*args, **kwargs):
            alive_at_call.append(sum(ref() is not None for ref in results))
            out = op(*args, **kwargs)
            results.append(weakref.ref(out))
            return out
        return call

    original = wrapper.bind_wrapper

    def bind(source, constants, *rest):
        constants = {name: recording(value) if isinstance(value, torch._ops.OpOverload) else value
                     for name, value in constants.items()}
        return original(source, constants, *rest)

    monkeypatch.setattr(wrapper, "bind_wrapper", bind)
    return alive_at_call


def test_an_extern_result_dies_with_its_last_reader(monkeypatch):
    """Each ATen call's result is freed once its last reader has run, not when the graph returns.
    The wrapper once kept every ``externN_result`` name to the end of the call, and on the H200
    an 8-layer LLaMA stack peaked at 6x eager's memory."""
    alive_at_call = _record_extern_calls(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(64, 64, generator=gen) / 8).to(DEVICE) for _ in range(6)]
    x = torch.randn(32, 64, generator=gen).to(DEVICE)

    def fn(x, *weights):
        for w in weights:
            x = torch.relu(x @ w)
        return x

    out = compile_strict(fn)(x, *weights)
    torch.testing.assert_close(out, fn(x, *weights))
    assert len(alive_at_call) == len(weights)
    # Only the previous matmul's result, relu'd in place, is alive: it is this matmul's input.
    assert max(alive_at_call) <= 1, alive_at_call


def test_graph_names_cannot_hide_the_wrappers_own_names():
    """Buffer names come from the graph: a saved tensor called ``as_strided`` (timm's MobileNetV3
    backward) or ``max`` must not replace the helpers the wrapper calls."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchfuse.diagnostics.report import report
    from torchfuse.options import Options
    from torchfuse.pipeline import compile_graph

    def fn(x, y):
        return (x.exp() + y).t(), x[1:].t()  # outputs that are strided views of buffers and inputs

    x, y = torch.randn(5, 7), torch.randn(5, 7)
    gm = make_fx(fn)(x, y)
    for node, name in zip([n for n in gm.graph.nodes if n.op == "placeholder"], ["as_strided", "max"]):
        node.name = name
    gm.recompile()
    call = compile_graph(gm, [x, y], "inference", Options(strict=True))
    for got, want in zip(call([x, y]), fn(x, y)):
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want)
    assert "tf_as_strided(as_strided" in report().graphs[-1].wrapper_source


def test_hot_aten_calls_go_through_their_python_binding():
    """Convolutions and matmuls are called unboxed through their Python binding (the overload's
    ``__call__`` boxes every argument: ~20 us more a convolution on the H200); any other overload,
    and ops outside the list, stay as they are."""
    aten = torch.ops.aten
    assert direct_binding(aten.convolution.default) is torch._C._VariableFunctions.convolution
    assert direct_binding(aten.addmm.default) is torch._C._VariableFunctions.addmm
    assert direct_binding(aten.mm.dtype) is aten.mm.dtype
    assert direct_binding(aten.add.Tensor) is aten.add.Tensor
    x, w, b = torch.randn(2, 3, 9, 9), torch.randn(4, 3, 3, 3), torch.randn(4)
    args = (x, w, b, [2, 1], [1, 0], [1, 1], False, [0, 0], 1)
    assert torch.equal(direct_binding(aten.convolution.default)(*args), aten.convolution.default(*args))
