"""The garbage collector is paused while torchfuse compiles a graph, and restored after."""
from __future__ import annotations

import gc

import torch

import torchfuse
from torchfuse import pipeline


def _compile_recording_collector(monkeypatch) -> list[bool]:
    states: list[bool] = []
    original = pipeline.compile_graph

    def recording(*args, **kwargs):
        states.append(gc.isenabled())
        return original(*args, **kwargs)

    monkeypatch.setattr(pipeline, "compile_graph", recording)
    torchfuse.reset()
    x = torch.randn(17, 33, requires_grad=True)
    compiled = torch.compile(lambda t: (t * 2).relu().sum(-1), backend="torchfuse")
    out = compiled(x)
    out.sum().backward()
    torch.testing.assert_close(out, (x.detach() * 2).relu().sum(-1))
    torch.testing.assert_close(x.grad, torch.where(x > 0, 2.0, 0.0))
    return states


def test_collector_paused_while_compiling_and_restored(monkeypatch):
    assert gc.isenabled()
    states = _compile_recording_collector(monkeypatch)
    assert states and not any(states)  # forward and backward graphs compiled with it off
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled(monkeypatch):
    gc.disable()
    try:
        _compile_recording_collector(monkeypatch)
        assert not gc.isenabled()
    finally:
        gc.enable()
