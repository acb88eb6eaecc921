"""Run CPU convolutions of inference graphs channels-last: oneDNN's native layout, faster than NCHW.

Each 2-D convolution of an inference graph gets ``clone(memory_format=channels_last)`` of its
input and weight in front (copies the scheduler fuses into the kernel producing the input, so a
pooling kernel writes its result channels-last directly), and its result is declared
channels-last, which is what ATen returns for channels-last operands. The pointwise kernels
after it read whatever layout their input has. Inductor's CPU backend makes the same choice.

The caller applies it to inference graphs only: a training forward graph's saved activations
must keep the layouts its backward graph was traced with. A convolution whose result is a
graph output keeps eager's layout too (it is rewritten only where eager's is channels-last).
"""
from __future__ import annotations

import torch

from torchfuse.lowering.graph_rewrite import rewrite_eligible

aten = torch.ops.aten


def convolutions_channels_last(gm: torch.fx.GraphModule) -> int:
    """Rewrite every eligible convolution in place; returns how many were rewritten."""
    return rewrite_eligible(gm, _eligible, _rewrite)


def _eligible(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    x, weight, out = (v.meta.get("val") if isinstance(v, torch.fx.Node) else None
                      for v in (node.args[0], node.args[1], node))
    if not all(isinstance(t, torch.Tensor) for t in (x, weight, out)):
        return False
    if any(user.op == "output" for user in node.users) and not out.is_contiguous(memory_format=torch.channels_last):
        return False  # a graph output keeps eager's layout
    transposed = node.args[6]
    return not transposed and x.dim() == 4 and x.device.type == "cpu" and x.dtype == torch.float32


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    operands = [_in_channels_last(graph, node, v) for v in node.args[:2]]
    node.args = (*operands, *node.args[2:])
    node.meta["val"] = _channels_last(node.meta["val"])


def _in_channels_last(graph: torch.fx.Graph, conv: torch.fx.Node, value: torch.fx.Node) -> torch.fx.Node:
    """``value`` as a channels-last tensor: itself when it is one at run time, else a copy.

    Graph inputs and convolution results have their traced layout at run time. Our own
    kernels' buffers are contiguous whatever the trace says, so those get the copy, which the
    scheduler fuses into the kernel computing them.
    """
    if value.meta["val"].is_contiguous(memory_format=torch.channels_last) and (
            value.op == "placeholder" or value.target is aten.convolution.default):
        return value
    with graph.inserting_before(conv):
        copy = graph.call_function(aten.clone.default, (value,), {"memory_format": torch.channels_last})
    copy.meta["val"] = _channels_last(value.meta["val"])
    return copy


def _channels_last(fake: torch.Tensor) -> torch.Tensor:
    """The same fake tensor, laid out channels-last (made in its own fake mode)."""
    with fake.fake_mode:
        return fake.clone(memory_format=torch.channels_last)
