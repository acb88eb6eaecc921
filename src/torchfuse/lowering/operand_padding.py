"""Zero-pad 16-bit CUDA matmul operands whose rows are not 16-byte aligned.

``matmul_padding.py`` gives an odd-width *result* aligned rows. A training step then multiplies
by the *gradient* of that result: BERT's LM-head backward computes the input gradient ``g @ W``
(inner dimension K = 30522) and the weight gradient ``g.t() @ x`` (M = 30522) from ``g``, the
[8192, 30522] logits gradient, whose rows are 61044 bytes apart. cuBLAS ran both with its slow
sm80 kernels on the H200: 1.62 and 1.63 ms. With ``g`` zero-padded to 30528 columns: 0.50 and
0.51 ms (``scripts/measure_unaligned_operands.py``); the pad is one copy of ``g``.

An operand's unaligned dimension is the one it is contiguous along:

- K (a row-major left operand, or a column-major right one): both operands get zero-padded
  along K; the padding's products are zeros, so the result is eager's up to summation order.
- M (a column-major left operand, ``g.t()``): the left operand gets p more rows and the result
  p more rows, which a slice drops (the slice is contiguous: whole rows).

A padded operand is a view of ``constant_pad_nd`` of its source (the operand, or the tensor it
transposes), made once per source and padded dimension, so ``g @ W`` and ``g.t() @ x`` share one
padded ``g``. Sums over the source (a bias gradient) read the padded copy's first columns, so
when ``g``'s producer is a generated kernel whose only other readers are those sums, the
scheduler can compute ``g`` straight into the padded buffer.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from torchfuse.lowering.matmul_padding import ALIGN_BYTES, MIN_MULTIPLY_ADDS

aten = torch.ops.aten
TRANSPOSES = (aten.t.default, aten.transpose.int, aten.permute.default)
# Readers of the source that may read the padded copy's first columns instead (any strides do).
STRIDE_AGNOSTIC_READERS = (aten.sum.dim_IntList, aten.sum.default)


def pad_unaligned_operands(gm: torch.fx.GraphModule) -> int:
    """Rewrite every eligible mm/addmm of ``gm`` in place; returns how many."""
    pads: dict[tuple[torch.fx.Node, int], torch.fx.Node] = {}
    replaced: list[torch.fx.Node] = []  # operands the rewrites stopped reading
    rewritten = 0
    for node in list(gm.graph.nodes):
        plan = _plan(node)
        if plan is not None:
            replaced += [n for n in node.args[-2:] if isinstance(n, torch.fx.Node)]
            _rewrite(gm.graph, node, *plan, pads)
            rewritten += 1
    if rewritten:
        _read_padded_sources(gm.graph, pads)
        for operand in dict.fromkeys(replaced):  # transposes nothing reads any more
            if operand.op == "call_function" and operand.target in TRANSPOSES and not operand.users:
                gm.graph.erase_node(operand)
        gm.graph.lint()
        gm.recompile()
    return rewritten


def _val(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else None


def _is_row_major(t: torch.Tensor) -> bool:
    return t.dim() == 2 and t.stride(1) == 1 and t.stride(0) == t.shape[1]


def _contiguous_dim(t: torch.Tensor) -> int | None:
    """0 or 1 for a dense 2-D operand stored column- or row-major, None otherwise."""
    if _is_row_major(t):
        return 1
    if _is_row_major(t.t()):
        return 0
    return None


def _plan(node: torch.fx.Node) -> tuple[int, int] | None:
    """(padding of K, padding of M) for an eligible matmul, or None."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    out, a, b = _val(node), _val(node.args[-2]), _val(node.args[-1])
    if not all(isinstance(t, torch.Tensor) for t in (out, a, b)):
        return None
    if out.device.type != "cuda" or out.dtype.itemsize != 2 or out.dim() != 2:
        return None
    (m, k), n = a.shape, b.shape[1]
    if not all(isinstance(size, int) for size in (m, n, k, *a.stride(), *b.stride())) or m * n * k < MIN_MULTIPLY_ADDS:
        return None
    a_dim, b_dim = _contiguous_dim(a), _contiguous_dim(b)
    if a_dim is None or b_dim is None:
        return None
    per_row = ALIGN_BYTES // out.dtype.itemsize
    pad_k = -k % per_row if (a_dim == 1 or b_dim == 0) else 0
    pad_m = -m % per_row if a_dim == 0 and _bias_allows_rows(node) else 0
    return (pad_k, pad_m) if pad_k or pad_m else None


def _bias_allows_rows(node: torch.fx.Node) -> bool:
    """Extra result rows are fine when addmm's bias broadcasts along the rows."""
    if node.target is aten.mm.default:
        return True
    bias = _val(node.args[0])
    return isinstance(bias, torch.Tensor) and (bias.dim() < 2 or bias.shape[0] == 1)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, pad_k: int, pad_m: int,
             pads: dict[tuple[torch.fx.Node, int], torch.fx.Node]) -> None:
    a, b = node.args[-2], node.args[-1]
    with graph.inserting_before(node):
        new_a = _padded_operand(graph, a, {1: pad_k, 0: pad_m}, pads)
        new_b = _padded_operand(graph, b, {0: pad_k}, pads)
        matmul = graph.call_function(node.target, (*node.args[:-2], new_a, new_b), dict(node.kwargs))
        _trace(matmul)
        result = matmul
        if pad_m:
            result = graph.call_function(aten.slice.Tensor, (matmul, 0, 0, _val(node).shape[0]))
            _trace(result)
    node.replace_all_uses_with(result)
    graph.erase_node(node)


def _padded_operand(graph: torch.fx.Graph, operand: torch.fx.Node, padding: dict[int, int],
                    pads: dict[tuple[torch.fx.Node, int], torch.fx.Node]) -> torch.fx.Node:
    """``operand`` zero-padded at the end of each of its dims by ``padding[dim]`` (a view of a
    padded source: the operand, or the tensor it transposes)."""
    for dim, amount in padding.items():
        if not amount:
            continue
        source, transposed = _source_of(operand)
        key = (source, 1 - dim if transposed else dim)
        if key not in pads:
            # Made before its first matmul, not after the source: a weight's padded copy would
            # live from the graph's start.
            spec = [0, amount] if key[1] == 1 else [0, 0, 0, amount]
            pads[key] = graph.call_function(aten.constant_pad_nd.default, (source, spec, 0.0))
            _trace(pads[key])
        operand = pads[key]
        if transposed:
            operand = graph.call_function(aten.t.default, (operand,))
            _trace(operand)
    return operand


def _source_of(operand: torch.fx.Node) -> tuple[torch.fx.Node, bool]:
    """(the row-major tensor ``operand`` is or transposes, whether it transposes it)."""
    if operand.op == "call_function" and operand.target in TRANSPOSES:
        source = operand.args[0]
        if isinstance(source, torch.fx.Node) and isinstance(_val(source), torch.Tensor) \
                and _val(source).dim() == 2 and _is_row_major(_val(source)):
            return source, True
    return operand, False


def _read_padded_sources(graph: torch.fx.Graph, pads: dict[tuple[torch.fx.Node, int], torch.fx.Node]) -> None:
    """Sums over a source padded along its columns, after the padded copy, read its first columns."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    for (source, dim), padded in pads.items():
        if dim != 1 or source.op != "call_function":
            continue
        readers = [user for user in source.users
                   if user.target in STRIDE_AGNOSTIC_READERS and position[user] > position[padded]]
        if not readers:
            continue
        with graph.inserting_after(padded):
            narrow = graph.call_function(aten.slice.Tensor, (padded, 1, 0, _val(source).shape[1]))
            _trace(narrow)
        for reader in readers:
            reader.replace_input_with(source, narrow)


def _trace(node: torch.fx.Node) -> None:
    """Give a new node its fake result, as tracing would have."""
    args = [_val(a) if isinstance(a, torch.fx.Node) else a for a in node.args]
    fake_mode = next(a.fake_mode for a in args if hasattr(a, "fake_mode"))
    with fake_mode:
        node.meta["val"] = node.target(*args, **node.kwargs)
