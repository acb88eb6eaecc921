"""One cast where aot_autograd's graph casts a tensor and, separately, a view of it.

Under autocast a backward often holds both ``_to_copy(x, bf16)`` and
``_to_copy(view(x, shape), bf16)``: T5's softmax backward casts its float32 score gradient once
for the attention matmuls (as a ``[B*H, S, S]`` view) and once for the position bias's gradient
(as ``[B, H, S, S]``). They are the same values at the same offsets, but lowered as two nodes
only the one an ATen call reads is stored; the other is recomputed inside the bias gradient's
batch sum, from the float32 inputs of the score gradient (6 bytes an element read, against the
stored bf16 cast's 2). Here the second cast becomes a view of the first, so its readers load
what the first stores.

Only dense row-major tensors qualify: then a ``view`` of the cast is valid wherever the view of
the tensor was, with the same elements at the same offsets. Neither cast may reach the graph's
outputs (directly or through views): two outputs would then share memory that eager gave each
its own, and an in-place change to one would show in the other (or, for a tensor saved for the
backward, trip autograd's version check).
"""
from __future__ import annotations

import torch
import torch.fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from torchfuse.frontend.fx_outputs import returned

_CAST = torch.ops.aten._to_copy.default
_VIEWS = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)


def share_casts_of_views(gm: torch.fx.GraphModule) -> int:
    """Of each ``_to_copy(x)`` and ``_to_copy(view(x))`` with the same arguments, keep the first
    and make the other a view of it; returns how many casts became views."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    replaced = 0
    for cast in list(gm.graph.nodes):
        shared = _as_view_of_earlier_cast(gm.graph, cast, order)
        if shared is None:
            continue
        shared.meta = dict(cast.meta)
        source = cast.args[0]
        cast.replace_all_uses_with(shared)
        gm.graph.erase_node(cast)
        if source.target in _VIEWS and not source.users:
            gm.graph.erase_node(source)
        replaced += 1
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced


def _as_view_of_earlier_cast(graph: torch.fx.Graph, cast: torch.fx.Node,
                             order: dict[torch.fx.Node, int]) -> torch.fx.Node | None:
    """A view node, inserted before ``cast``, of an earlier equal cast of the same memory, or None."""
    if cast.op != "call_function" or cast.target != _CAST or len(cast.args) != 1:
        return None
    source = cast.args[0]
    if not isinstance(source, torch.fx.Node) or not _row_major(cast) or not _row_major(source) \
            or _reaches_output(cast):
        return None
    earlier = lambda other: (other is not cast and other.target == _CAST and other.kwargs == cast.kwargs  # noqa: E731
                             and order.get(other, len(order)) < order[cast] and _row_major(other)
                             and not _reaches_output(other))
    if source.target in _VIEWS:  # cast(view(x)) after cast(x): view the latter
        base = source.args[0]
        if isinstance(base, torch.fx.Node) and _row_major(base):
            for whole in base.users:
                if earlier(whole) and whole.args == (base,):
                    with graph.inserting_before(cast):
                        return graph.call_function(source.target, (whole, *source.args[1:]), dict(source.kwargs))
        return None
    sizes = tuple(source.meta["val"].shape)
    if not all(isinstance(size, int) for size in sizes):  # a symbolic size would need its own node
        return None
    for view in source.users:  # cast(x) after cast(view(x)): view the latter back to x's sizes
        if view.target in _VIEWS and view.args[0] is source and _row_major(view):
            for part in view.users:
                if earlier(part) and part.args == (view,):
                    with graph.inserting_before(cast):
                        return graph.call_function(torch.ops.aten.view.default, (part, list(sizes)))
    return None


def _reaches_output(node: torch.fx.Node) -> bool:
    """Whether the graph returns ``node`` or a view of it (through any chain of view ops)."""
    return returned(node, lambda user, source: _is_view(user))


def _is_view(node: torch.fx.Node) -> bool:
    """An op whose result aliases its input (its schema's first return has alias info)."""
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.returns and schema.returns[0].alias_info is not None)


def _row_major(node: torch.fx.Node) -> bool:
    """Dense, row-major and at offset 0, provably (a symbolic size adds no guard: it must be
    known without one)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return False
    return statically_known_true(value.storage_offset() == 0) and statically_known_true(value.is_contiguous())
