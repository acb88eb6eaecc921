"""Run CPU convolutions of inference graphs channels-last: oneDNN's native layout, faster than NCHW.

Each 2-D convolution of an inference graph gets ``clone(memory_format=channels_last)`` of its
input and weight in front (copies the scheduler fuses into the kernel producing the input, so a
pooling kernel writes its result channels-last directly), and its result is declared
channels-last, which is what ATen returns for channels-last operands. The pointwise kernels
after it read whatever layout their input has. Inductor's CPU backend makes the same choice.

The caller applies it to inference graphs only: a training forward graph's saved activations
must keep the layouts its backward graph was traced with. A convolution whose result is a
graph output keeps eager's layout too.
"""
from __future__ import annotations

import torch

aten = torch.ops.aten


def convolutions_channels_last(gm: torch.fx.GraphModule) -> int:
    """Rewrite every eligible convolution in place; returns how many were rewritten."""
    graph = gm.graph
    rewritten = 0
    for node in list(graph.nodes):
        if _eligible(node):
            _rewrite(graph, node)
            rewritten += 1
    if rewritten:
        graph.lint()
        gm.recompile()
    return rewritten


def _eligible(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    x, weight, out = (v.meta.get("val") if isinstance(v, torch.fx.Node) else None
                      for v in (node.args[0], node.args[1], node))
    if not all(isinstance(t, torch.Tensor) for t in (x, weight, out)):
        return False
    if any(user.op == "output" for user in node.users):
        return False  # a graph output keeps eager's layout
    transposed = node.args[6]
    return (not transposed and x.dim() == 4 and x.device.type == "cpu" and x.dtype == torch.float32
            and not x.is_contiguous(memory_format=torch.channels_last))


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    x, weight = node.args[0], node.args[1]
    with graph.inserting_before(node):
        x_cl, weight_cl = (graph.call_function(aten.clone.default, (v,), {"memory_format": torch.channels_last})
                           for v in (x, weight))
    for copy, source in ((x_cl, x), (weight_cl, weight)):
        copy.meta["val"] = _channels_last(source.meta["val"])
    node.args = (x_cl, weight_cl, *node.args[2:])
    node.meta["val"] = _channels_last(node.meta["val"])


def _channels_last(fake: torch.Tensor) -> torch.Tensor:
    """The same fake tensor, laid out channels-last (made in its own fake mode)."""
    with fake.fake_mode:
        return fake.clone(memory_format=torch.channels_last)
