"""Elementwise ops: one table entry per ATen op, one generic rule that builds the body.

The output dtype and shape come from the node's ``meta['val']`` (eager's own answer).
Operands are cast to the *promoted* dtype first (as eager converts them): the output dtype
for arithmetic and math, the promoted input dtype for comparisons, bool for logical ops.
The op is then computed in ``opmath`` of that dtype (float32 for halves) and its result
cast to the output dtype once, so half-precision chains round after each op like eager.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.fx

from torchfuse.frontend.aot import FMA_OPS
from torchfuse.frontend.symbolic import strides_of
from torchfuse.ir.expr import Const, Expr, Op, Where
from torchfuse.lowering.context import LoweringContext
from torchfuse.lowering.registry import register_lowering
from torchfuse.lowering.rules.common import cast, opmath, operand, out_meta, output_shape, result_type
from torchfuse.lowering.values import TensorValue

aten = torch.ops.aten

# ATen op packet -> IR op name, for ops computed in the output dtype.
ARITHMETIC = {
    aten.mul: "mul", aten.maximum: "maximum", aten.minimum: "minimum", aten.pow: "pow",
    aten.atan2: "atan2", aten.copysign: "copysign", aten.hypot: "hypot", aten.fmod: "fmod",
    aten.remainder: "remainder", aten.floor_divide: "floordiv", aten.neg: "neg", aten.abs: "abs",
    aten.sign: "sign", aten.sgn: "sign", aten.reciprocal: "reciprocal", aten.trunc: "trunc",
    aten.floor: "floor", aten.ceil: "ceil", aten.round: "round", aten.frac: "frac",
    aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1", aten.log: "log", aten.log2: "log2",
    aten.log10: "log10", aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt",
    aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos",
    aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh",
    aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh", aten.erf: "erf",
    aten.erfc: "erfc", aten.erfinv: "erfinv", aten.sigmoid: "sigmoid", aten.lgamma: "lgamma",
    aten.bitwise_and: "bitwise_and", aten.bitwise_or: "bitwise_or", aten.bitwise_xor: "bitwise_xor",
    aten.bitwise_not: "bitwise_not", aten.bitwise_left_shift: "bitwise_left_shift",
    aten.bitwise_right_shift: "bitwise_right_shift", aten.__and__: "bitwise_and",
    aten.__or__: "bitwise_or", aten.__xor__: "bitwise_xor", aten.__lshift__: "bitwise_left_shift",
    aten.__rshift__: "bitwise_right_shift",
}
# Ops whose python-scalar operand eager reads at full (opmath) precision instead of first
# converting it to the op's dtype (ATen's "original_scalar_value" kernels): a half
# ``x * 1.3`` multiplies by float32 1.3, while ``x < 0.1`` compares with float16 0.1.
# add/sub (see add_sub) follow CUDA, which adds float32 1.3; CPU eager adds float16 1.2998.
OPMATH_SCALARS = {"mul", "truediv", "floordiv", "truncdiv"}
# Ops whose inputs are compared or tested in their promoted dtype; the output is bool.
PREDICATES = {
    aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge",
    aten.isnan: "isnan", aten.isinf: "isinf", aten.isfinite: "isfinite", aten.signbit: "signbit",
}
LOGICAL = {
    aten.logical_and: "logical_and", aten.logical_or: "logical_or",
    aten.logical_xor: "logical_xor", aten.logical_not: "logical_not",
}


def pointwise_op(ctx: LoweringContext, node: torch.fx.Node, inputs: tuple, compute: torch.dtype | None,
                 build: Callable[[list[Expr]], Expr], round_scalars: bool = True, strides: tuple | None = None) -> Any:
    """Add a node whose body is ``build(operands)`` with operands cast to ``compute``.

    ``compute=None`` leaves each tensor operand in its own dtype (scalars take the output's).
    Operands reach ``build`` in ``opmath`` of that dtype (float32 for float16/bfloat16).
    Python scalars are converted to the promoted dtype first, as eager's TensorIterator
    does, unless ``round_scalars`` is False (see ``OPMATH_SCALARS``). ``strides`` lays the
    result out other than contiguously.
    """
    meta = out_meta(node)
    shape = output_shape(node)

    def body(index: tuple) -> Expr:
        operands = []
        for x in inputs:
            promoted = compute or getattr(x, "dtype", meta.dtype)
            if isinstance(x, TensorValue) or round_scalars:
                operands.append(cast(operand(x, index, shape, promoted), opmath(promoted)))
            else:
                operands.append(operand(x, index, shape, opmath(promoted)))
        return cast(build(operands), meta.dtype)

    return ctx.pointwise(shape, meta.dtype, meta.device, body, strides)


def _named(name: str, dtype_of: Callable[[Expr], torch.dtype] = lambda a: a.dtype) -> Callable[[list[Expr]], Expr]:
    return lambda args: Op(dtype_of(args[0]), name, tuple(args))


# Rounding an integer (or bool) gives it back unchanged, as in eager.
_IDENTITY_ON_INTEGERS = {"floor", "ceil", "round", "trunc"}


def _arithmetic_rule(name: str):
    def rule(ctx: LoweringContext, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
        dtype = out_meta(node).dtype
        if name in _IDENTITY_ON_INTEGERS and not dtype.is_floating_point:
            return pointwise_op(ctx, node, args[:1], dtype, lambda a: a[0])
        return pointwise_op(ctx, node, args[:2], dtype, _named(name), round_scalars=name not in OPMATH_SCALARS)

    return rule


def _predicate_rule(name: str):
    def rule(ctx: LoweringContext, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
        return pointwise_op(ctx, node, args[:2], result_type(*args[:2]), _named(name, lambda a: torch.bool))

    return rule


def _logical_rule(name: str):
    def rule(ctx: LoweringContext, node: torch.fx.Node, *args: Any, **kwargs: Any) -> Any:
        return pointwise_op(ctx, node, args[:2], torch.bool, _named(name))

    return rule


for _packet, _name in ARITHMETIC.items():
    register_lowering(_packet)(_arithmetic_rule(_name))
for _packet, _name in PREDICATES.items():
    register_lowering(_packet)(_predicate_rule(_name))
for _packet, _name in LOGICAL.items():
    register_lowering(_packet)(_logical_rule(_name))


@register_lowering(aten.add, aten.sub, aten.rsub)
def add_sub(ctx: LoweringContext, node: torch.fx.Node, a: Any, b: Any, alpha: Any = 1) -> Any:
    """``a + alpha * b`` (``rsub``: ``b - alpha * a``), with alpha and a scalar operand in opmath.

    Eager differs by device for a half tensor plus a python scalar: CUDA adds the scalar in
    float32, CPU first rounds it to the half type. We follow CUDA, Triton's target.
    """
    target = node.target.overloadpacket
    name = "add" if target is aten.add else "sub"
    first, second = (b, a) if target is aten.rsub else (a, b)
    dtype = out_meta(node).dtype
    compute = opmath(dtype)

    def build(args: list[Expr]) -> Expr:
        if dtype == torch.bool:  # bool + bool is logical or (True + True == True)
            return Op(dtype, "logical_or", (args[0], args[1])) if alpha else args[0]
        # alpha may be a SymInt (a size, or an int argument Dynamo made dynamic)
        scaled = args[1] if alpha == 1 else Op(compute, "mul", (args[1], operand(alpha, (), (), compute)))
        return Op(compute, name, (args[0], scaled))

    return pointwise_op(ctx, node, (first, second), dtype, build, round_scalars=False)


@register_lowering(aten.div, aten.true_divide)
def div(ctx: LoweringContext, node: torch.fx.Node, a: Any, b: Any, rounding_mode: str | None = None) -> Any:
    dtype = out_meta(node).dtype
    compute = opmath(dtype)
    if rounding_mode is None:
        return pointwise_op(ctx, node, (a, b), dtype, _named("truediv"), round_scalars=False)
    if dtype.is_floating_point and rounding_mode == "trunc":
        return pointwise_op(ctx, node, (a, b), dtype,
                            lambda args: Op(compute, "trunc", (Op(compute, "truediv", tuple(args)),)),
                            round_scalars=False)
    # Float floordiv follows ATen's div_floor_floating, not floor(a / b) (see ops.py).
    name = "truncdiv" if rounding_mode == "trunc" else "floordiv"
    return pointwise_op(ctx, node, (a, b), dtype, _named(name), round_scalars=False)


@register_lowering(aten.round.decimals)
def round_decimals(ctx: LoweringContext, node: torch.fx.Node, x: Any, decimals: int = 0) -> Any:
    """As ATen: ``nearbyint(x * 10**d) / 10**d`` (``nearbyint(x / 10**-d) * 10**-d`` for d < 0)."""
    dtype = out_meta(node).dtype
    compute = opmath(dtype)
    scale = Const(compute, float(10 ** abs(decimals)))

    def build(args: list[Expr]) -> Expr:
        if decimals < 0:
            return Op(compute, "mul", (Op(compute, "round", (Op(compute, "truediv", (args[0], scale)),)), scale))
        return Op(compute, "truediv", (Op(compute, "round", (Op(compute, "mul", (args[0], scale)),)), scale))

    return pointwise_op(ctx, node, (x,), dtype, build)


@register_lowering(aten.fmax, aten.fmin)
def fmax_fmin(ctx: LoweringContext, node: torch.fx.Node, a: Any, b: Any) -> Any:
    """maximum/minimum that ignore a NaN operand (NaN only when both are NaN)."""
    dtype = out_meta(node).dtype
    compute = opmath(dtype)
    name = "maximum" if node.target.overloadpacket is aten.fmax else "minimum"

    def build(args: list[Expr]) -> Expr:
        x, y = args
        both = Op(compute, name, (x, y))
        if not compute.is_floating_point:
            return both
        x_nan, y_nan = Op(torch.bool, "isnan", (x,)), Op(torch.bool, "isnan", (y,))
        return Where(compute, x_nan, y, Where(compute, y_nan, x, both))

    return pointwise_op(ctx, node, (a, b), dtype, build)


@register_lowering(aten.relu)
def relu(ctx: LoweringContext, node: torch.fx.Node, x: Any) -> Any:
    """``maximum(x, 0)``: NaN stays NaN, as eager's relu."""
    dtype = out_meta(node).dtype
    compute = opmath(dtype)
    return pointwise_op(ctx, node, (x,), dtype, lambda a: Op(compute, "maximum", (a[0], Const(compute, 0))))


@register_lowering(aten.where)
def where(ctx: LoweringContext, node: torch.fx.Node, cond: Any, a: Any, b: Any) -> Any:
    dtype = out_meta(node).dtype
    compute = opmath(dtype)

    def build(args: list[Expr]) -> Expr:
        return Where(compute, cast(args[0], torch.bool), cast(args[1], compute), cast(args[2], compute))

    return pointwise_op(ctx, node, (cond, a, b), None, build)


@register_lowering(aten.clamp, aten.clamp_min, aten.clamp_max)
def clamp(ctx: LoweringContext, node: torch.fx.Node, x: Any, low: Any = None, high: Any = None) -> Any:
    if node.target.overloadpacket is aten.clamp_max:
        low, high = None, low
    dtype = out_meta(node).dtype
    compute = opmath(dtype)
    present = [v for v in (low, high) if v is not None]

    def build(args: list[Expr]) -> Expr:
        value, rest = args[0], list(args[1:])
        if low is not None:
            value = Op(compute, "maximum", (value, rest.pop(0)))
        if high is not None:
            value = Op(compute, "minimum", (value, rest.pop(0)))
        return value

    return pointwise_op(ctx, node, (x, *present), dtype, build)


@register_lowering(aten._to_copy, aten.clone, aten.lift_fresh_copy,
                   aten._conj, aten.positive, aten.contiguous, aten.copy,
                   torch.ops.prims.convert_element_type.default)
def copy(ctx: LoweringContext, node: torch.fx.Node, x: Any, *args: Any, **kwargs: Any) -> Any:
    """A (possibly dtype-converting) copy; a device change runs as an ATen call, except a 0-d
    CPU value copied to the GPU, which the GPU kernel receives by value (``_scalar_to_device``)."""
    if node.target.overloadpacket is aten.copy:
        x = args[0]  # copy(dst, src): the result is src in dst's layout
    meta = out_meta(node)
    if getattr(x, "device", meta.device) != meta.device and not _scalar_to_device(x, meta.device):
        return NotImplemented
    # clone(memory_format=channels_last): the layout is the point (a convolution's input).
    explicit = node.kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format)
    return pointwise_op(ctx, node, (x,), meta.dtype, lambda args: args[0],
                        strides=strides_of(node.meta["val"]) if explicit else None)


def _scalar_to_device(x: Any, device: torch.device) -> bool:
    """Is ``x`` a 0-d CPU value copied to a GPU? Then the copy is a GPU node reading it as a
    kernel scalar (ir/devices.py), as eager's ``gpu_x.copy_(cpu_scalar)`` does: an ATen copy
    instead would make the CPU value a stored buffer, built by a C++ kernel, and a graph with
    C++ kernels cannot be replayed as a CUDA graph (``shifted[..., 0] = 0`` in T5's
    ``_shift_right`` lifts its 0 as a CPU tensor constant)."""
    return (isinstance(x, TensorValue) and x.rank == 0 and x.device.type == "cpu"
            and device.type != "cpu")


@register_lowering(aten.sigmoid_backward)
def sigmoid_backward(ctx: LoweringContext, node: torch.fx.Node, grad: Any, y: Any) -> Any:
    dtype = out_meta(node).dtype
    c = opmath(dtype)
    one = Const(c, 1.0)
    return pointwise_op(ctx, node, (grad, y), dtype,
                        lambda a: Op(c, "mul", (a[0], Op(c, "mul", (a[1], Op(c, "sub", (one, a[1])))))))


@register_lowering(aten.tanh_backward)
def tanh_backward(ctx: LoweringContext, node: torch.fx.Node, grad: Any, y: Any) -> Any:
    dtype = out_meta(node).dtype
    c = opmath(dtype)
    one = Const(c, 1.0)
    return pointwise_op(ctx, node, (grad, y), dtype,
                        lambda a: Op(c, "mul", (a[0], Op(c, "sub", (one, Op(c, "mul", (a[1], a[1])))))))


@register_lowering(*FMA_OPS)
def fma(ctx: LoweringContext, node: torch.fx.Node, a: Any, b: Any, c: Any) -> Any:
    """``a * b + c`` rounded once (``lerp``'s decomposition produces it, e.g. in AdamW).

    For float32 and the halves the product is exact in float64, so computing in float64 and
    rounding at the end matches a fused multiply-add except for rare double-rounding ties;
    float64 itself rounds twice (an ulp at most).
    """
    dtype = out_meta(node).dtype
    wide = torch.float64 if dtype.is_floating_point else dtype
    return pointwise_op(ctx, node, (a, b, c), wide,
                        lambda x: Op(wide, "add", (Op(wide, "mul", (x[0], x[1])), x[2])))
