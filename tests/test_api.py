"""The public API: names, options, errors, fallbacks and the report."""
from __future__ import annotations

import pytest
import torch

import torchfuse
import torchfuse.options
from conftest import compile_strict


def test_unknown_option_and_mode_name_the_valid_ones():
    with pytest.raises(ValueError, match="valid options: target"):
        torchfuse.compile(torch.sin, options={"targte": "triton"})
    with pytest.raises(ValueError, match="valid modes: default"):
        torchfuse.compile(torch.sin, mode="fastest")
    with pytest.raises(ValueError, match="valid targets"):
        torchfuse.compile(torch.sin, options={"target": "cuda"})


def test_backend_is_registered_with_dynamo():
    fn = torch.compile(lambda x: x.cos() + 1, backend="torchfuse")
    x = torch.randn(5)
    torch.testing.assert_close(fn(x), x.cos() + 1)
    assert torchfuse.report().graphs


def test_internal_error_falls_back_to_aten_with_a_warning(monkeypatch):
    import torchfuse.scheduler.schedule as scheduling

    def broken(graph, **kwargs):
        raise RuntimeError("scheduler exploded")

    monkeypatch.setattr(scheduling, "schedule", broken)
    x = torch.randn(4, 4)
    with pytest.warns(UserWarning, match="Running it with ATen instead"):
        out = torchfuse.compile(lambda t: t * 2 + 1, options={"target": "triton"})(x)
    torch.testing.assert_close(out, x * 2 + 1)
    assert "scheduler exploded" in torchfuse.report().graphs[0].error


def test_strict_mode_raises_internal_errors(monkeypatch):
    import torchfuse.scheduler.schedule as scheduling

    monkeypatch.setattr(scheduling, "schedule", lambda graph, **kw: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(Exception, match="boom"):
        compile_strict(lambda t: t * 2)(torch.randn(3))


def test_report_lists_kernels_ops_and_fallbacks():
    def fn(x):
        return torch.cumsum(x * 2, 0) + 1  # cumsum runs as an ATen call

    compile_strict(fn)(torch.randn(8))
    report = torchfuse.report()
    graph = report.graphs[0]
    kinds = [k.kind for k in graph.kernels]
    assert "extern" in kinds and "pointwise" in kinds
    assert any("aten.mul" in op for k in graph.kernels for op in k.ops)
    text = str(report)
    assert "kernel" in text and graph.name in text
    torchfuse.reset()
    assert torchfuse.report().graphs == []


def test_refused_fusion_has_a_reason():
    def fn(x):
        # A row reduction then a column reduction of its result: different iteration spaces.
        return (x * x.sum(1, keepdim=True)).sum(0)

    x = torch.randn(6, 5)
    torch.testing.assert_close(compile_strict(fn)(x), fn(x))
    decisions = torchfuse.report().graphs[0].decisions
    assert decisions and all(not d.fused and d.reason for d in decisions)
    assert any("reduction over" in d.reason for d in decisions)


def test_column_reduction_fuses_with_its_broadcast_consumer():
    def fn(x):
        return x * x.sum(0)

    x = torch.randn(6, 5)
    torch.testing.assert_close(compile_strict(fn)(x), fn(x))
    assert len(torchfuse.report().graphs[0].generated_kernels) == 1


def test_graph_without_inputs_and_lifted_constants():
    from conftest import DEVICE

    assert torch.equal(compile_strict(lambda: torch.arange(5) * 2)(), torch.arange(5) * 2)
    x = torch.randn(7, device=DEVICE)
    table = torch.linspace(-1, 1, 7, device=DEVICE)
    fn = lambda t: torch.where(t > 0, t, torch.tensor(0.0, device=DEVICE)) + table  # noqa: E731
    torch.testing.assert_close(compile_strict(fn)(x), fn(x))
    assert not torchfuse.report().graphs[-1].fallbacks


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_max_autotune_turns_autotuning_on_and_an_option_overrides_it(mode):
    assert torchfuse.options.Options.from_user(None, mode).autotune
    assert not torchfuse.options.Options.from_user({"autotune": False}, mode).autotune
    assert torchfuse.options.Options.from_user({"autotune": True}).autotune
    assert not torchfuse.options.Options.from_user(None, "reduce-overhead").autotune
    with pytest.raises(ValueError, match="option 'autotune' must be True or False"):
        torchfuse.options.Options.from_user({"autotune": "yes"}, mode)
