"""The generated wrapper: what it keeps alive while a graph runs."""
from __future__ import annotations

import weakref

import torch

from conftest import DEVICE, compile_strict


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
