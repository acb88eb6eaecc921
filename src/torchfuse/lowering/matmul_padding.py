"""Give 16-bit CUDA matmuls a result whose rows start 16-byte aligned.

cuBLAS picks its fast tensor-core kernels only when every matrix's leading dimension is a
multiple of 16 bytes. A result with an odd row length (GPT-2's logits: 50257 columns) falls
back to an "align1" kernel: on the H200 the GPT-2 LM-head matmul took 3.4 ms of a 12 ms step
where Inductor, which pads such matmuls too, took 0.45 ms.

``mm(a, b)`` becomes ``mm(a, pad(b))[:, :n]``, then a contiguous copy: the zero columns of the
padded operand give zero columns we never read, and the copy gives the result eager's layout.
Pointwise readers inline that copy (they read the wide result through its strides); only a
graph output or an ATen call pays it as a kernel. ``addmm`` pads its bias the same way.

In an inference graph, a result that only the graph returns keeps the padded row stride (the
view ``[:, :n]``, no copy): the copy would hold a second result as large as the first at the
peak (GPT-2's logits: 412 MB twice, 929 MB peak against eager's 543 MB). The caller gets eager's
values and shape with a row stride a few elements longer; ``view``, slicing and reductions work
on it as on eager's, and ``is_contiguous()`` is False. A forward graph's outputs keep eager's
layout: its backward was compiled for the traced strides of what it saves.
"""
from __future__ import annotations

import functools

import torch

from torchfuse.lowering.graph_rewrite import rewrite_eligible

aten = torch.ops.aten

ALIGN_BYTES = 16
# Below this many multiply-adds the pad and the copy cost more than the slow kernel loses.
MIN_MULTIPLY_ADDS = 1 << 26


def pad_unaligned_matmuls(gm: torch.fx.GraphModule, padded_outputs: bool = False) -> int:
    """Rewrite every eligible matmul in place; returns how many were rewritten. With
    ``padded_outputs`` (inference graphs), a result only returned keeps the padded stride."""
    return rewrite_eligible(gm, _padded_width, functools.partial(_rewrite, padded_outputs=padded_outputs))


def _padded_width(node: torch.fx.Node) -> int | None:
    """The aligned row length for ``node``'s result, or None when it needs no padding."""
    if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
        return None
    out, a = node.meta.get("val"), node.args[-2].meta.get("val")
    if not isinstance(out, torch.Tensor) or not isinstance(a, torch.Tensor):
        return None
    if out.device.type != "cuda" or out.dtype.itemsize != 2 or out.dim() != 2:
        return None
    (m, n), k = out.shape, a.shape[1]
    if not all(isinstance(size, int) for size in (m, n, k)):
        return None  # symbolic sizes: the kernel must work for every size
    per_row = ALIGN_BYTES // out.dtype.itemsize
    if n % per_row == 0 or k % per_row or m * n * k < MIN_MULTIPLY_ADDS:
        return None  # aligned already; or an odd inner dim, which padding the columns won't fix
    return -(-n // per_row) * per_row


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, padded_outputs: bool = False) -> None:
    width = _padded_width(node)
    n = node.meta["val"].shape[1]
    only_returned = all(user.op == "output" for user in node.users)
    with graph.inserting_before(node):
        padded_args = [_pad_columns(graph, arg, width - n) if i != len(node.args) - 2 else arg
                       for i, arg in enumerate(node.args)]
        wide = graph.call_function(node.target, tuple(padded_args), dict(node.kwargs))
        narrow = graph.call_function(aten.slice.Tensor, (wide, 1, 0, n))
        added = [wide, narrow]
        if not (padded_outputs and only_returned):
            added.append(graph.call_function(aten.clone.default, (narrow,), {"memory_format": torch.contiguous_format}))
    with node.meta["val"].fake_mode:
        for new in added:
            _trace(new)
    node.replace_all_uses_with(added[-1])
    graph.erase_node(node)


def _pad_columns(graph: torch.fx.Graph, value: torch.fx.Node, extra: int) -> torch.fx.Node:
    """``value`` with ``extra`` zero columns (its last dim) when it has that dim to pad (an addmm
    bias of shape [n] or [m, n]; one broadcast along the columns, [m, 1], stays).

    A transposed operand (a linear layer's ``weight.t()``) is padded along its rows and
    transposed back: a straight copy of the weight rather than a transposing one, and the
    operand stays transposed for cuBLAS, its leading dimension unchanged.
    """
    fake = value.meta["val"]
    if fake.dim() == 0 or fake.shape[-1] == 1:
        return value
    if fake.dim() == 2 and fake.stride(0) == 1 and fake.stride(1) != 1:  # transposed
        rows = graph.call_function(aten.permute.default, (value, [1, 0]))
        padded = graph.call_function(aten.constant_pad_nd.default, (rows, [0, 0, 0, extra], 0.0))
        added = [rows, padded, graph.call_function(aten.permute.default, (padded, [1, 0]))]
    else:
        added = [graph.call_function(aten.constant_pad_nd.default, (value, [0, extra], 0.0))]
    with fake.fake_mode:
        for node in added:
            _trace(node)
    return added[-1]


def _trace(node: torch.fx.Node) -> None:
    """Give a new node its fake result, as tracing would have (call inside the fake mode)."""
    def val(value):
        return value.meta["val"] if isinstance(value, torch.fx.Node) else value

    node.meta["val"] = node.target(*[val(a) for a in node.args], **node.kwargs)
