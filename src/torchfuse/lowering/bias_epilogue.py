"""Move a bias out of an ATen call into our pointwise kernels.

``split_bias_into_pointwise_users``: ``addmm(bias, a, b)`` becomes ``mm(a, b) + bias`` where
only pointwise ops read the result. ATen's addmm first writes the broadcast bias into its
output, then has the GEMM accumulate into it (reading that output back). When a pointwise
kernel reads the result anyway (a GELU after a linear layer, a residual add), adding the bias
there costs nothing, and the copy pass and the read-back go away. Inductor makes the same split
for the same reason. (On GPUs cuBLAS adds a row bias in the GEMM's epilogue: the pipeline
applies this one to the C++ target only.)

``split_convolution_bias``: on GPUs ``convolution(x, w, bias)`` becomes
``convolution(x, w, None) + bias.view(C, 1, ...)``. ATen runs a cuDNN convolution without its
bias and then adds it with a kernel of its own (``output.add_(bias)`` in ``_convolution``):
one more launch, ATen call and pass over the result per convolution (EfficientNet-B0: 32 a
step, its squeeze-excite convolutions; 197 -> 165 launches a step split). Split, the add joins the
pointwise kernel after the convolution (the activation), and costs nothing. Inductor peels GPU
convolution biases the same way.
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


def split_convolution_bias(gm: torch.fx.GraphModule) -> int:
    """Rewrite every convolution with a bias into the convolution without it plus a broadcast
    add, in place; returns how many were split. The pipeline applies it to Triton-target graphs
    (GPU kernels, or Triton's interpreter on a CPU, so tests run the same path)."""
    return rewrite_eligible(gm, _convolution_with_bias, _split_convolution)


def _convolution_with_bias(node: torch.fx.Node) -> bool:
    if node.op != "call_function" or node.target is not aten.convolution.default:
        return False
    bias = node.args[2]
    if not isinstance(bias, torch.fx.Node):
        return False
    bias, out = bias.meta.get("val"), node.meta.get("val")
    if not isinstance(bias, torch.Tensor) or not isinstance(out, torch.Tensor) or out.dim() < 3:
        return False
    return bias.dim() == 1 and bias.shape[0] == out.shape[1] and bias.dtype == out.dtype


def _split_convolution(graph: torch.fx.Graph, node: torch.fx.Node) -> None:
    x, weight, bias, *rest = node.args
    out = node.meta["val"]
    per_channel = [-1] + [1] * (out.dim() - 2)  # [C, 1, 1]: broadcast over the spatial dims
    with graph.inserting_before(node):
        product = graph.call_function(aten.convolution.default, (x, weight, None, *rest))
        column = graph.call_function(aten.view.default, (bias, per_channel))
        total = graph.call_function(aten.add.Tensor, (product, column))
    with bias.meta["val"].fake_mode:
        column.meta["val"] = bias.meta["val"].view(per_channel)
    # The convolution's shape, dtype and layout (channels-last stays channels-last) for both:
    # the lowering reads only those, and the graph's users see what they saw before.
    product.meta["val"] = total.meta["val"] = out
    node.replace_all_uses_with(total)
    graph.erase_node(node)
