"""Split ``addmm(bias, a, b)`` into ``mm(a, b) + bias`` where only pointwise ops read the result.

ATen's addmm first writes the broadcast bias into its output, then has the GEMM accumulate
into it (reading that output back). When a pointwise kernel reads the result anyway (a GELU
after a linear layer, a residual add), adding the bias there costs nothing, and the copy pass
and the read-back go away. Inductor makes the same split for the same reason.
"""
from __future__ import annotations

import torch

from torchfuse.lowering.graph_rewrite import rewrite_eligible

aten = torch.ops.aten

# Reshapes between a linear layer's [B*T, N] matmul and its [B, T, N] users.
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def split_bias_into_pointwise_users(gm: torch.fx.GraphModule) -> int:
    """Rewrite every eligible addmm in place; returns how many were split."""
    return rewrite_eligible(gm, _eligible, _split)


def _eligible(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.addmm.default:
        return False
    if any(node.kwargs.get(k, 1) != 1 for k in ("beta", "alpha")) or len(node.args) != 3:
        return False
    bias, out = node.args[0].meta.get("val"), node.meta.get("val")
    if not isinstance(bias, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    # A row bias only: a full [M, N] addend is read whole either way.
    return bias.dim() == 1 and bias.dtype == out.dtype and _only_pointwise_readers(node)


def _only_pointwise_readers(node: torch.fx.Node) -> bool:
    if not node.users:
        return False
    for user in node.users:
        if user.op != "call_function":
            return False  # a graph output (saved for backward, say): keep addmm
        if user.target in _VIEWS:
            if not _only_pointwise_readers(user):
                return False
        elif torch.Tag.pointwise not in getattr(user.target, "tags", ()):
            return False
    return True


def _split(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    bias, a, b = node.args
    with graph.inserting_before(node):
        product = graph.call_function(aten.mm.default, (a, b))
        total = graph.call_function(aten.add.Tensor, (product, bias))
    # Same shape, dtype and (contiguous) strides as addmm's result: lowering reads only those.
    product.meta["val"] = total.meta["val"] = node.meta["val"]
    node.replace_all_uses_with(total)
    graph.erase_node(node)
