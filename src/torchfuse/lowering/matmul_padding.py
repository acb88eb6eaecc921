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

Outputs from ``padded_from`` on return the padded result itself, also through views that only
reshape its leading dims (GPT-2's logits are returned as ``_unsafe_view(mm, [batch, tokens,
vocab])``); readers inside the graph still read the copy, which their kernels inline. The copy
would hold a second result as large as the first at the peak (GPT-2's logits: 412 MB twice, 929
MB peak against eager's 543 MB; 0.22 ms of GPT-2's 2.74 ms step on the H200).

- Inference graphs: every output (``padded_from=0``). The caller gets eager's values and shape
  with a row stride a few elements longer; ``view``, slicing and reductions work on it as on
  eager's, and ``is_contiguous()`` is False.
- Forward graphs: the outputs saved for the backward, when aot_autograd asks for the forward's
  output strides (``TracingContext.output_strides``): it then gives the backward graph's inputs
  those strides before the backward is compiled. BERT's MLM forward wrote a contiguous copy of
  its [8192, 30522] logits for the backward (500 MB, inside a 0.61 ms kernel) and the backward
  read rows 61044 bytes apart. The user's outputs keep eager's layout.
- Backward graphs: none (their outputs are gradients, compared with eager's by their users).
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


def pad_unaligned_matmuls(gm: torch.fx.GraphModule, padded_from: int | None = None) -> int:
    """Rewrite every eligible matmul in place; returns how many were rewritten. Outputs at
    positions ``padded_from`` and later return a padded result as it is (None: no output)."""
    return rewrite_eligible(gm, _padded_width, functools.partial(_rewrite, padded_from=padded_from))


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


def has_unaligned_matmul(gm: torch.fx.GraphModule) -> bool:
    """Whether ``pad_unaligned_matmuls`` would rewrite anything in ``gm``."""
    return any(_padded_width(node) is not None for node in gm.graph.nodes)


# Views that reshape a result's leading dims and keep its rows: a padded row stride stays valid.
ROW_KEEPING_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _rewrite(graph: torch.fx.Graph, node: torch.fx.Node, padded_from: int | None = None) -> None:
    width = _padded_width(node)
    target = mm_into_padded_rows if node.target is aten.mm.default else addmm_into_padded_rows
    with graph.inserting_before(node):
        padded = graph.call_function(target, (*node.args, width), dict(node.kwargs))
        copy = graph.call_function(aten.clone.default, (padded,), {"memory_format": torch.contiguous_format})
    with node.meta["val"].fake_mode:
        _trace(padded)
        _trace(copy)
        node.replace_all_uses_with(copy)
        if padded_from is not None:
            _return_padded(graph, copy, padded, padded_from)
    graph.erase_node(node)
    if not copy.users:
        graph.erase_node(copy)


def _return_padded(graph: torch.fx.Graph, copy: torch.fx.Node, padded: torch.fx.Node, padded_from: int) -> None:
    """Outputs from ``padded_from`` on that are ``copy`` or row-keeping views of it return the
    same views of ``padded``; the views nothing reads any more are erased."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    several = isinstance(output.args[0], (list, tuple))
    values = list(output.args[0]) if several else [output.args[0]]
    width, orphans = copy.meta["val"].shape[-1], []
    for position in range(padded_from, len(values)):
        chain = _views_from(values[position], copy, width)
        if chain is None:
            continue
        with graph.inserting_before(output):
            rebuilt = _rebuild_views(graph, chain, padded)
        if rebuilt is not None:
            values[position] = rebuilt
            orphans += chain
    output.args = (type(output.args[0])(values) if several else values[0], *output.args[1:])
    for view in reversed(list(dict.fromkeys(orphans))):
        if not view.users:
            graph.erase_node(view)


def _views_from(value: Any, copy: torch.fx.Node, width: int) -> list[torch.fx.Node] | None:
    """The row-keeping views from ``copy`` to ``value``, outermost last; None when ``value`` is
    not ``copy`` seen through such views."""
    chain = []
    while value is not copy:
        if not isinstance(value, torch.fx.Node) or value.target not in ROW_KEEPING_VIEWS:
            return None
        if list(value.args[1])[-1:] != [width]:
            return None
        chain.append(value)
        value = value.args[0]
    return chain[::-1]


def _rebuild_views(graph: torch.fx.Graph, chain: list[torch.fx.Node], padded: torch.fx.Node) -> torch.fx.Node | None:
    """``chain``'s views applied to ``padded`` (as views: strides retraced), or None when one
    of them cannot view the padded strides; the new nodes are then removed."""
    current, added = padded, []
    try:
        for view in chain:
            current = graph.call_function(aten.view.default, (current, *view.args[1:]))
            added.append(current)
            _trace(current)
    except RuntimeError:  # the fake op's "view size is not compatible with input tensor's size and stride"
        for node in reversed(added):
            graph.erase_node(node)
        return None
    return current


def padded_output_strides(gm: torch.fx.GraphModule) -> dict[int, tuple[int, ...]]:
    """Output position -> strides, for the outputs that return a padded result (or a view of one)."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    strides = {}
    for position, value in enumerate(values):
        root = value
        while isinstance(root, torch.fx.Node) and root.target is aten.view.default:
            root = root.args[0]
        if isinstance(root, torch.fx.Node) and root.target in (mm_into_padded_rows, addmm_into_padded_rows):
            strides[position] = tuple(int(s) for s in value.meta["val"].stride())
    return strides


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
