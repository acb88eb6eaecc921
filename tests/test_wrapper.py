"""The generated wrapper: what it keeps alive while a graph runs."""
from __future__ import annotations

import weakref

import torch

import torchfuse

from conftest import DEVICE, assert_close, compile_strict
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
    assert "tf_as_strided_from(as_strided" in report().graphs[-1].wrapper_source


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


def test_views_of_an_input_follow_the_offset_it_arrives_at():
    """Dynamo does not guard storage offsets: a graph traced for an input at offset 27 runs on
    the same shape at offsets 0 and 18. Views of it (an ATen operand, a returned view) are made
    relative to the input's own offset, as the kernels index from its ``data_ptr()``. They were
    absolute: offset 18 gave wrong results, offset 0 an out-of-bounds error. An operand an op
    only reads is reinterpreted (``tf_reinterpret``, about half of ``as_strided``'s host cost)."""
    from torchfuse.diagnostics.report import report
    from torchfuse.runtime.wrapper import _writes_no_argument

    def fn(x, w):
        return (x[2:, 1:].t() @ w).relu(), x[1:, 2:].t(), (x.exp()[1:] * 2).sum()

    gen = torch.Generator().manual_seed(3)
    base = torch.randn(40, 9, generator=gen, dtype=torch.float64).to(DEVICE)
    w = torch.randn(35, 6, generator=gen, dtype=torch.float64).to(DEVICE)
    compiled = compile_strict(fn)
    for x in (base[3:], base[:37].clone(), base[2:39]):  # storage offsets 27, 0 and 18
        for got, want in zip(compiled(x, w), fn(x, w)):
            assert got.stride() == want.stride()
            torch.testing.assert_close(got, want)
    source = report().graphs[-1].wrapper_source
    assert "tf_reinterpret(" in source, source
    aten = torch.ops.aten
    assert _writes_no_argument(aten.mm.default) and _writes_no_argument(aten.convolution.default)
    assert not _writes_no_argument(aten.add_.Tensor) and not _writes_no_argument(aten.mm.out)
    assert not _writes_no_argument(lambda x: x)  # no schema: as_strided


def test_launches_fix_the_wrappers_own_buffers_and_literals_only(monkeypatch):
    """``WrapperWriter.fixed_args``: each launcher's fixed positions are pointers to buffers this
    wrapper allocated (never a graph input or an ATen result) and literal integers."""
    import re

    from torchfuse.runtime import wrapper

    captured: list = []
    original = wrapper.bind_wrapper

    def bind(source, constants, *rest):
        captured.append((source, rest[-1]))
        return original(source, constants, *rest)

    monkeypatch.setattr(wrapper, "bind_wrapper", bind)

    def fn(x, w):
        y = torch.sigmoid(x) * 2
        z = y.sum(1, keepdim=True) + y.amax(1, keepdim=True)
        return ((y - z) @ w).relu() + 1, z

    x, w = torch.randn(33, 17), torch.randn(17, 5)
    out = torchfuse.compile(fn, options={"target": "triton", "strict": True})(x, w)
    # float64 decides the tolerance: a sum of 17 then a matmul differ from eager's float32 by
    # the reduction order (2e-5 on a value of 4 in one CI draw)
    assert_close(list(out), list(fn(x, w)), reference=list(fn(x.double(), w.double())))
    source, fixed_args = captured[-1]
    own = set(re.findall(r"(\w+) = tf_empty", source)) | set(re.findall(r"(\w+) = (\w+)(?:\.view\(.*\))?; del \2", source))
    assert any(fixed_args.values()), (source, fixed_args)
    calls = list(re.finditer(r"(tf_kernel\d+)\.launch\([^,]+, [^,]+, (.*)\)$", source, re.M))
    assert len(calls) == len(fixed_args), source
    for call in calls:
        args = [a.strip() for a in call.group(2).split(",")]
        for position in fixed_args.get(call.group(1), ()):
            assert args[position] in own or args[position].isdigit(), (call.group(0), position)
        assert not {i for i, a in enumerate(args) if a in ("x", "w") or a.startswith("arg")} & fixed_args.get(call.group(1), set())
