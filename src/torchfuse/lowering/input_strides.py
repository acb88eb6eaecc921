"""Give a graph's inputs the strides its real inputs have, when those differ from the traced ones.

aot_autograd traces the backward graph with the strides eager would have given the tensors the
forward saves. When a compiled forward returns a saved tensor with other strides (a padded
matmul result, ``matmul_padding.py``), it reports them (``TracingContext.output_strides``) and
aot_autograd hands the backward compiler example inputs with those strides, but leaves the
graph's placeholders as traced. Lowering reads a placeholder's layout from its metadata, so the
example's strides are copied onto the placeholder.

The graph's own views were traced for the old strides: a ``view`` that merges padded rows into
one dimension has no meaning for the new ones. The whole graph is therefore traced again with the
new inputs (fake tensors, nothing runs); when that fails, such an input is read through a
contiguous copy instead, as eager's layout was.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch._guards import detect_fake_mode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

aten = torch.ops.aten


def adopt_input_strides(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> list[str]:
    """Placeholders of ``gm`` whose example input has other strides take them; returns their
    names (each with ", through a contiguous copy" when the graph's views refused them)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    changed = [(node, example) for node, example in zip(placeholders, example_inputs)
               if _other_strides(node.meta.get("val"), example)]
    if not changed:
        return []
    traced = {node: node.meta.get("val") for node in gm.graph.nodes}
    for node, example in changed:
        node.meta["val"] = example
    views_hold = _traces_again(gm, [n.meta.get("val") for n in placeholders])
    for node, value in traced.items():  # later nodes keep their metadata: layout preferences only
        if node.op != "placeholder":
            node.meta["val"] = value
    if views_hold:
        return [node.name for node, _ in changed]
    for node, _ in changed:
        _read_through_contiguous_copy(gm.graph, node, traced[node])
    gm.recompile()
    return [f"{node.name}, through a contiguous copy" for node, _ in changed]


def _other_strides(traced: Any, example: Any) -> bool:
    if not (isinstance(traced, torch.Tensor) and isinstance(example, torch.Tensor)):
        return False
    sizes = (*traced.shape, *traced.stride(), *example.shape, *example.stride())
    if not all(isinstance(s, int) for s in sizes):
        return False  # symbolic: aot_autograd restrides only static layouts
    return tuple(traced.shape) == tuple(example.shape) and tuple(traced.stride()) != tuple(example.stride())


def _traces_again(gm: torch.fx.GraphModule, inputs: list[Any]) -> bool:
    mode = detect_fake_mode([x for x in inputs if isinstance(x, torch.Tensor)])
    if mode is None:
        return False
    try:
        with mode:
            FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*inputs)
    except Exception:  # noqa: BLE001 - e.g. "view size is not compatible with input tensor's size and stride"
        return False
    return True


def _read_through_contiguous_copy(graph: torch.fx.Graph, node: torch.fx.Node, traced: torch.Tensor) -> None:
    users = list(node.users)
    with graph.inserting_after(node):
        copy = graph.call_function(aten.clone.default, (node,), {"memory_format": torch.contiguous_format})
    copy.meta["val"] = traced
    for user in users:
        user.replace_input_with(node, copy)
