"""Helpers shared by the elementwise rules: operands, dtypes and broadcasting."""
from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx

from torchfuse.frontend.symbolic import shape_of
from torchfuse.ir.expr import Cast, Const, Expr, IndexValue
from torchfuse.ir.symbols import is_float_size
from torchfuse.lowering.context import load_broadcast
from torchfuse.lowering.values import TensorValue


def out_meta(node: torch.fx.Node) -> torch.Tensor:
    meta = node.meta["val"]
    if isinstance(meta, (list, tuple)):
        meta = meta[0]
    return meta


HALF_DTYPES = (torch.float16, torch.bfloat16)


def opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype eager computes an op of ``dtype`` in: float32 for float16/bfloat16.

    Elementwise rules compute each ATen op in this dtype and cast the result to the op's
    dtype once, so a fused chain of half ops rounds after every op, exactly as eager does
    (and one ATen op that lowers to several IR ops rounds only once, as eager's kernel).
    """
    return torch.float32 if dtype in HALF_DTYPES else dtype


# Casts from a dtype to a wider one that holds every value exactly: casting back is a no-op.
_EXACT_WIDENING = {
    torch.float16: (torch.float32, torch.float64), torch.bfloat16: (torch.float32, torch.float64),
    torch.float32: (torch.float64,), torch.int32: (torch.int64,),
}


def cast(expr: Expr, dtype: torch.dtype) -> Expr:
    if expr.dtype == dtype:
        return expr
    if isinstance(expr, Const):
        return Const(dtype, _convert_scalar(expr.value, dtype))
    if isinstance(expr, Cast) and expr.value.dtype == dtype and expr.dtype in _EXACT_WIDENING.get(dtype, ()):
        return expr.value  # e.g. float16 -> float32 -> float16
    return Cast(dtype, expr)


def _convert_scalar(value: Any, dtype: torch.dtype) -> Any:
    if dtype == torch.bool:
        return bool(value)
    if dtype in HALF_DTYPES:  # eager converts a scalar operand to the op's dtype first
        return float(torch.tensor(float(value), dtype=torch.float32).to(dtype))
    if dtype.is_floating_point:
        return float(value)
    return int(value)


def operand(value: Any, index: tuple, out_shape: tuple, dtype: torch.dtype) -> Expr:
    """``value`` (tensor, python scalar or SymInt) read at ``index`` and cast to ``dtype``."""
    if isinstance(value, TensorValue):
        return cast(load_broadcast(value, index, out_shape), dtype)
    if isinstance(value, sympy.Expr) and not value.is_number:
        # a SymFloat of sizes (1 / (N * H * W)) is computed in float64, as Python does
        return cast(IndexValue(torch.float64 if is_float_size(value) else torch.int64, value), dtype)
    if isinstance(value, sympy.Expr):
        value = float(value) if value.is_Float else int(value)
    return Const(dtype, _convert_scalar(value, dtype))


def result_type(*values: Any) -> torch.dtype:
    """PyTorch's type promotion over tensors (by dtype and rank) and python scalars."""
    stand_ins = []
    for value in values:
        if isinstance(value, TensorValue):
            stand_ins.append(torch.empty((1,) if value.rank else (), dtype=value.dtype))
        elif isinstance(value, sympy.Expr):
            stand_ins.append(float(value) if value.is_Float else 1)
        elif value is not None:
            stand_ins.append(value)
    if len(stand_ins) == 1:
        only = stand_ins[0]
        return only.dtype if isinstance(only, torch.Tensor) else torch.result_type(torch.tensor(0), only)
    result = torch.result_type(stand_ins[0], stand_ins[1])
    for extra in stand_ins[2:]:
        result = torch.promote_types(result, torch.result_type(torch.empty((1,), dtype=result), extra))
    return result


def output_shape(node: torch.fx.Node) -> tuple[sympy.Expr, ...]:
    return shape_of(out_meta(node))
