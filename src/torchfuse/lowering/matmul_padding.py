"""Give 16-bit CUDA matmuls a result whose rows start 16-byte aligned.

cuBLAS picks its fast tensor-core kernels only when every matrix's leading dimension is a
multiple of 16 bytes. A result with an odd row length (GPT-2's logits: 50257 columns) falls
back to an "align1" kernel: on the H200 the GPT-2 LM-head matmul took 3.4 ms of a 12 ms step
where Inductor, which pads such matmuls too, took 0.45 ms.

``mm(a, b)`` becomes ``mm_into_padded_rows(a, b, width)``: ATen's ``mm(..., out=)`` into a
result of eager's shape whose rows are ``width`` elements apart (the next multiple of 16
bytes). The operands stay as they are (their leading dimensions are aligned already: the
rewrite requires an aligned inner dimension), so no padded copy of the weight exists (GPT-2:
77 MB). ``addmm`` likewise. Then a contiguous copy gives eager's layout: pointwise readers
inline it (they read the result through its strides); only a graph output or an ATen call pays
it as a kernel.

In an inference graph, a result that only the graph returns keeps the padded row stride (no
copy), also through views that only reshape its leading dims (GPT-2's logits are returned as
``_unsafe_view(mm, [batch, tokens, vocab])``): the copy would hold a second result as large as
the first at the peak (GPT-2's logits: 412 MB twice, 929 MB peak against eager's 543 MB), and
took 0.22 ms of GPT-2's 2.74 ms step on the H200. The caller gets eager's values and shape with
a row stride a few elements longer; ``view``, slicing and reductions work on it as on eager's,
and ``is_contiguous()`` is False. A forward graph's outputs keep eager's layout: its backward
was compiled for the traced strides of what it saves.
"""
from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx

from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.extern import lower_extern
from torchfuse.lowering.graph_rewrite import rewrite_eligible
from torchfuse.lowering.registry import register_lowering

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


# Views that reshape a result's leading dims and keep its rows: a padded row stride stays valid.
ROW_KEEPING_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, padded_outputs: bool = False) -> None:
    width = _padded_width(node)
    views = _returned_through_views(node) if padded_outputs else None
    target = mm_into_padded_rows if node.target is aten.mm.default else addmm_into_padded_rows
    with graph.inserting_before(node):
        padded = graph.call_function(target, (*node.args, width), dict(node.kwargs))
        added = [padded]
        if views is None:
            added.append(graph.call_function(aten.clone.default, (padded,), {"memory_format": torch.contiguous_format}))
    with node.meta["val"].fake_mode:
        for new in added:
            _trace(new)
        node.replace_all_uses_with(added[-1])
        for view in views or []:  # now views of the padded result: a view op, strides retraced
            view.target = aten.view.default
            _trace(view)
    graph.erase_node(node)


def _returned_through_views(node: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The views between ``node`` and the graph's output when the graph only returns it,
    reshaped along its leading dims at most (GPT-2's logits: ``mm`` then ``_unsafe_view`` to
    [batch, tokens, vocab]); None when anything else reads it."""
    chain, current, width = [], node, node.meta["val"].shape[-1]
    while True:
        users = list(current.users)
        if users and all(user.op == "output" for user in users):
            return chain
        if len(users) != 1 or users[0].target not in ROW_KEEPING_VIEWS:
            return None
        current = users[0]
        if list(current.args[1])[-1:] != [width]:
            return None
        chain.append(current)


def _padded_result(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    return torch.empty_strided((a.shape[0], b.shape[1]), (width, 1), dtype=a.dtype, device=a.device)


def _aligned_columns(n: int, result: torch.Tensor) -> int:
    """The columns of a matmul cuBLAS computes with its aligned kernels: a multiple of 16 bytes.
    An odd N alone, with every leading dimension aligned, still got an sm75 kernel on the H200
    (3.3 ms for GPT-2's LM head against 0.45 ms at N = 50264)."""
    per_row = ALIGN_BYTES // result.element_size()
    return n - n % per_row


def mm_into_padded_rows(a: torch.Tensor, b: torch.Tensor, width: int) -> torch.Tensor:
    """``a @ b`` with its rows ``width`` elements apart (called by the wrapper, an ATen call):
    the aligned columns in one matmul, the last few in a second, small one."""
    out = _padded_result(a, b, width)
    main = _aligned_columns(b.shape[1], out)
    torch.mm(a, b[:, :main], out=out[:, :main])
    if main < b.shape[1]:
        torch.mm(a, b[:, main:], out=out[:, main:])
    return out


def addmm_into_padded_rows(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, width: int, *,
                           beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    """``addmm`` with its rows ``width`` elements apart (called by the wrapper, an ATen call), in
    two column ranges as ``mm_into_padded_rows``; a bias along the columns is split alike."""
    out = _padded_result(a, b, width)
    n = b.shape[1]
    main = _aligned_columns(n, out)
    for columns in (slice(0, main), slice(main, n)):
        if columns.start < columns.stop:
            part = bias[..., columns] if bias.dim() and bias.shape[-1] == n else bias
            torch.addmm(part, a, b[:, columns], beta=beta, alpha=alpha, out=out[:, columns])
    return out


@register_lowering(mm_into_padded_rows, addmm_into_padded_rows)
def _lower_padded(ctx: LoweringContext, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
    return lower_extern(ctx, node, args, kwargs)  # an ATen call, not a fallback


def _trace(node: torch.fx.Node) -> None:
    """Give a new node its fake result, as tracing would have (call inside the fake mode)."""
    def val(value):
        return value.meta["val"] if isinstance(value, torch.fx.Node) else value

    args = [val(a) for a in node.args]
    if node.target in (mm_into_padded_rows, addmm_into_padded_rows):
        # The result's metadata only: a fake ``out=`` call copies, which fake CUDA tensors
        # cannot do on a CPU-only torch (tests trace for CUDA without a GPU).
        node.meta["val"] = _padded_result(*args[-3:])
    else:
        node.meta["val"] = node.target(*args, **node.kwargs)
