"""The decomposition table handed to aot_autograd: which ATen ops reach lowering as smaller ops.

We take PyTorch's core-ATen table and add the composite ops whose parts fuse well
(layer norm, softmax, GELU, ...). Matmuls, convolutions and attention stay whole: they
run as ATen calls.
"""
from __future__ import annotations

import functools

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from torchfuse.frontend.foreach import foreach_decompositions

aten = torch.ops.aten

EXTRA = [
    aten.native_layer_norm, aten.native_layer_norm_backward, aten._softmax, aten._log_softmax,
    aten._softmax_backward_data, aten._log_softmax_backward_data, aten.gelu, aten.gelu_backward,
    aten.silu, aten.silu_backward, aten.native_group_norm, aten.native_group_norm_backward,
    aten.nll_loss_forward, aten.nll_loss_backward, aten.mse_loss, aten.mse_loss_backward,
    aten.hardtanh, aten.hardswish, aten.hardsigmoid, aten.leaky_relu, aten.elu, aten.softplus,
    aten.mish, aten.logsumexp, aten.addcmul, aten.addcdiv, aten.lerp, aten._unsafe_index,
    aten.std, aten.std_mean, aten.native_batch_norm, aten._native_batch_norm_legit_functional,
    aten._native_batch_norm_legit_no_training, aten.native_batch_norm_backward,
    # Eval-mode BatchNorm reaches aot as this mutating op; without its decomposition aot
    # rejects the graph as not functional.
    aten._native_batch_norm_legit,
]

# Decompositions we do not want: these lower better (or must stay ATen calls) whole.
# Attention stays whole too: torch 2.13's decomposition of the CPU flash-attention op gives
# wrong input gradients for a causal GQA block (found by tests/test_training.py).
# Embedding's backward is one accumulating scatter (lowering/rules/scatter.py); decomposed, its
# padding rows became additions of zero (an atomic each on a GPU, all into one row).
KEEP_WHOLE = [
    aten.mm, aten.bmm, aten.addmm, aten.convolution, aten.convolution_backward,
    aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_attention_math, aten.embedding_dense_backward,
]


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict:
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(EXTRA))
    table.update(foreach_decompositions())  # optimizer steps: one op per tensor, then fused
    for op in KEEP_WHOLE:
        for overload in op.overloads():
            table.pop(getattr(op, overload), None)
    return table
