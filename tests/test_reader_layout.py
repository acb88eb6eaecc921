"""Stored buffers are laid out the way the kernels reading them walk them (scheduler/reader_layout.py).

The static half: which buffers move, and which must not. The running half: a training step
whose forward saves a relaid buffer for the backward computes eager's values and gradients,
and so does its ATen fallback, whether the failure comes before or after aot_autograd was told
the new strides."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import torchfuse
from conftest import DEVICE, assert_close, compile_strict, to_float64
from torchfuse import pipeline
from torchfuse.frontend.decompositions import decomposition_table
from torchfuse.ir.expr import loads
from torchfuse.ir.graph import Pointwise, Reduction
from torchfuse.lowering.driver import lower
from torchfuse.scheduler.reader_layout import _lane_var
from torchfuse.scheduler.schedule import schedule

S, H = 16, 4


def _lowered(fn, *args):
    return lower(make_fx(fn, decomposition_table=decomposition_table())(*args), "g")


def _relaid(graph, movable_outputs_from):
    """Schedule ``graph`` and return the outputs it relaid."""
    return schedule(graph, movable_outputs_from=movable_outputs_from).relaid_outputs


def _embedding_buffer(graph):
    (node,) = [n for n in graph.nodes if isinstance(n, Pointwise) and n.origin == "aten.embedding"]
    return graph.buffers[node.name]


def _bias_inputs(batch=2):
    return torch.randint(0, 32, (S, S)), torch.randn(32, H), torch.randn(batch, H, S, S)


def saved_bias(buckets, table, scores):
    """A forward graph that reads a [S, S, H] lookup as [1, H, S, S] and saves it (output 1)."""
    bias = F.embedding(buckets, table)
    return torch.softmax(scores * bias.permute(2, 0, 1).unsqueeze(0), -1), bias


def test_a_saved_buffer_read_through_a_permutation_takes_its_readers_order():
    graph = _lowered(saved_bias, *_bias_inputs())
    assert _relaid(graph, 1) == {1: (S * H, 1, S)}
    bias = _embedding_buffer(graph)
    assert bias.strides == (S * H, 1, S)  # [S, H, S] in memory: the readers' S innermost
    assert graph.outputs[1].strides == bias.strides


def test_a_user_visible_output_keeps_eagers_layout():
    graph = _lowered(saved_bias, *_bias_inputs())
    assert _relaid(graph, None) == {}
    assert _embedding_buffer(graph).strides == (S * H, H, 1)


def test_an_intermediate_read_by_an_aten_call_keeps_its_layout():
    def bias_into_matmul(buckets, table, scores):
        bias = F.embedding(buckets, table).permute(2, 0, 1)  # [H, S, S], read by bmm as well
        return torch.softmax(scores * bias, -1) + torch.bmm(bias, bias).unsqueeze(0)

    graph = _lowered(bias_into_matmul, *_bias_inputs())
    assert _relaid(graph, None) == {}
    assert _embedding_buffer(graph).strides == (S * H, H, 1)


def test_readers_split_between_two_orders_keep_the_layout():
    """One reader walks the lookup's own order, one the permuted order, over as many
    elements: no dimension has a majority, so eager's layout stays."""
    def both_orders(buckets, table, a, b):
        bias = F.embedding(buckets, table)
        return (a * bias).sum(), (b * bias.permute(2, 0, 1)).sum()

    buckets, table, _ = _bias_inputs()
    graph = _lowered(both_orders, buckets, table, torch.randn(S, S, H), torch.randn(H, S, S))
    assert _relaid(graph, None) == {}


class RelativeBiasAttention(torch.nn.Module):
    """T5's pattern: a learned bias per (bucket, head), looked up for every (query, key) pair and
    added to the scores of every batch element; the backward needs the bias again."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(32, H))

    def forward(self, buckets, scores, values):
        bias = F.embedding(buckets, self.table).permute(2, 0, 1).unsqueeze(0)
        return (torch.softmax(scores * bias, -1) @ values).square().mean()


def _training_step(model, compiled, dtype=torch.float32):
    torch.manual_seed(0)
    buckets = torch.randint(0, 32, (S, S), device=DEVICE)
    scores = torch.randn(3, H, S, S, device=DEVICE, dtype=dtype, requires_grad=True)
    values = torch.randn(3, H, S, 8, device=DEVICE, dtype=dtype)
    loss = compiled(buckets, scores, values)
    loss.backward()
    return loss.detach(), model.table.grad.detach().clone(), scores.grad.detach().clone()


def _eager_and_reference():
    model = RelativeBiasAttention().to(DEVICE)
    expected = _training_step(model, model)
    reference_model = RelativeBiasAttention().to(DEVICE).double()
    reference_model.load_state_dict(model.state_dict())
    reference = _training_step(reference_model, reference_model, torch.float64)
    model.table.grad = None
    return model, expected, reference


def test_training_with_a_relaid_saved_buffer_matches_eager():
    model, expected, reference = _eager_and_reference()
    got = _training_step(model, compile_strict(model))
    assert_close(list(got), list(expected), reference=to_float64(list(reference)))
    forward, backward = torchfuse.report().graphs[:2]
    assert list(forward.output_strides.values()) == [(S * H, 1, S)]
    assert backward.input_strides  # the backward took the saved bias with its new strides


@pytest.mark.parametrize("failing", ["wrapper", "after the report"])
def test_the_aten_fallback_returns_the_layouts_aot_autograd_was_told(monkeypatch, failing):
    """A forward that fails before its output strides are reported falls back with eager's
    layouts (and reports none); one that fails after returns the strides it promised."""
    def fail(*args):
        raise RuntimeError("a deliberate internal failure")

    if failing == "wrapper":
        stages = [(name, fail if name == "wrapper" else stage) for name, stage in pipeline.STAGES]
        monkeypatch.setattr(pipeline, "STAGES", stages)
    else:
        monkeypatch.setattr(pipeline, "_note_untuned_cpp_kernels", fail)
    model, expected, reference = _eager_and_reference()
    with pytest.warns(UserWarning, match="could not compile"):
        got = _training_step(model, compile_strict(model, options={"strict": False}))
    assert_close(list(got), list(expected), reference=to_float64(list(reference)))
    forward = torchfuse.report().graphs[0]
    assert forward.target == "aten"
    promised = [] if failing == "wrapper" else [(S * H, 1, S)]
    assert list(forward.output_strides.values()) == promised


def test_a_row_statistic_does_not_make_a_reduction_outer():
    """Layer norm's centered sums read their input along the reduced row and the row's mean
    once a row; only the first says where the lanes go. (Counting the mean as a read along
    the rows had BERT's embedding sum stored transposed.)"""
    graph = _lowered(lambda x, w: F.layer_norm(x * 2, (96,), w), torch.randn(2, 64, 96), torch.randn(96))
    centered = [n for n in graph.nodes if isinstance(n, Reduction) and n.origin == "aten.var_mean.correction"
                and any(load.buffer != "x_1" for load in loads(n.body))]
    assert centered
    for node in centered:
        (source,) = {load.buffer for load in loads(node.body) if graph.buffers[load.buffer].shape == (2, 64, 96)}
        assert _lane_var(node, node.body, graph.buffers, skip=source) == node.reduction_vars[0]
