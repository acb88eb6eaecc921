"""Ops that run as calls of the ATen op itself: matmuls, convolutions, attention, and any op
without a lowering rule (those are listed in the report's ``fallbacks``)."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx

from torchfuse.frontend.symbolic import offset_of, shape_of, strides_of
from torchfuse.ir.graph import Buffer
from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.values import TensorValue

aten = torch.ops.aten


def lower_extern(ctx: LoweringContext, node: torch.fx.Node, args: tuple, kwargs: dict) -> Any:
    """Add an Extern node calling ``node.target``; return its outputs as TensorValues."""
    # The ATen op gets each operand we compute in the layout tracing saw, so that its results
    # have the layouts tracing predicted: cuDNN attention's output follows its query's layout
    # while its meta function assumes [b, t, h, d] order, as in eager, where the query is a
    # transposed projection. A contiguous query there cost a layout-fixing copy per call.
    _adopt_traced_layouts(ctx, node.args, args)
    _adopt_traced_layouts(ctx, node.kwargs, kwargs)
    extern_args = _to_extern_args(ctx, args)
    extern_kwargs = {k: _to_extern_args(ctx, v) for k, v in kwargs.items()}
    meta = node.meta.get("val")
    buffers: list[Buffer] = []
    paths: list[Any] = []
    result = _describe_outputs(ctx, meta, (), buffers, paths)
    ctx.extern(node.target, extern_args, extern_kwargs, tuple(buffers), tuple(paths))
    return result


def _adopt_traced_layouts(ctx: LoweringContext, traced: Any, values: Any) -> None:
    """Walk FX arguments and their lowered values side by side (same structure)."""
    if isinstance(traced, torch.fx.Node) and isinstance(values, TensorValue):
        meta = traced.meta.get("val")
        if isinstance(meta, torch.Tensor):
            ctx.adopt_traced_layout(values, strides_of(meta))
    elif isinstance(traced, (list, tuple)) and isinstance(values, (list, tuple)) and len(traced) == len(values):
        for t, v in zip(traced, values):
            _adopt_traced_layouts(ctx, t, v)
    elif isinstance(traced, dict) and isinstance(values, dict):
        for key in traced.keys() & values.keys():
            _adopt_traced_layouts(ctx, traced[key], values[key])


def _to_extern_args(ctx: LoweringContext, value: Any) -> Any:
    if isinstance(value, TensorValue):
        return ctx.extern_arg(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_to_extern_args(ctx, v) for v in value)
    return value


def _describe_outputs(ctx: LoweringContext, meta: Any, path: tuple, buffers: list, paths: list) -> Any:
    """Make a buffer for each tensor in ``meta`` (walking tuples); mirror its structure."""
    if isinstance(meta, torch.Tensor):
        name = ctx.new_name()
        buffer = Buffer(name, shape_of(meta), meta.dtype, meta.device, strides_of(meta), offset_of(meta))
        buffers.append(buffer)
        paths.append(path)
        return TensorValue.of_buffer(name, buffer.shape, meta.dtype, meta.device)
    if isinstance(meta, (list, tuple)):
        return tuple(_describe_outputs(ctx, m, path + (i,), buffers, paths) for i, m in enumerate(meta))
    return meta


def _extern_rule(ctx: LoweringContext, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
    return lower_extern(ctx, node, args, kwargs)


# Ops we deliberately leave to ATen (libraries beat generated code here): not fallbacks.
register_lowering(
    aten.mm, aten.bmm, aten.addmm, aten.baddbmm, aten.convolution, aten.convolution_backward,
    aten._scaled_dot_product_efficient_attention, aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_cudnn_attention, aten._scaled_dot_product_flash_attention_for_cpu,
    aten._scaled_dot_product_efficient_attention_backward,
    aten._scaled_dot_product_flash_attention_backward, aten._scaled_dot_product_cudnn_attention_backward,
    aten._scaled_dot_product_flash_attention_for_cpu_backward,
    aten._efficient_attention_forward, aten._efficient_attention_backward,
    aten._flash_attention_forward, aten._flash_attention_backward,
    # An input mutation's copy; the scheduler drops it where the kernel can write in place.
    aten.copy_,
    aten.native_dropout, aten.rand, aten.randn, aten.rand_like, aten.randn_like, aten.bernoulli,
    aten.randint, aten.sort, aten.topk, aten.cumsum, aten.cumprod, aten._fused_sdp_choice,
)(_extern_rule)
