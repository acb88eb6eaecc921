"""Emit body expressions as C++ statements, with common-subexpression elimination.

Mirrors ``codegen/triton/expressions.py``: every non-literal value becomes one
``const T tmpN = ...;`` line in the innermost scope that needs it, and a scope's values are
visible in its nested scopes (a loop body sees the row's values).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import sympy
import torch

from torchfuse.codegen.float_sizes import float_size_text
from torchfuse.codegen.scope import CseWriter, Scope  # noqa: F401  (Scope re-exported)
from torchfuse.codegen.cpp.ops import CPP_OPS
from torchfuse.codegen.cpp.printer import compute_dtype, literal, print_index, storage_type, value_type
from torchfuse.ir.expr import Cast, Const, Expr, IndexValue, Load, Op, Where
from torchfuse.ir.graph import Buffer
from torchfuse.ir.symbols import is_float_size, simplify_index, size_symbols


@dataclass
class Value:
    """A name or literal in the generated code, and its compute dtype."""

    text: str
    dtype: torch.dtype
    is_literal: bool = False


# Loads resolved by the kernel: a register (reduction result) or an expression to inline.
LoadResolver = Callable[[Load, Scope], "Value | Expr | None"]


class ExpressionWriter(CseWriter):
    """Turns ``Expr`` trees (indices already in loop variables) into C++ statements.

    Args:
        buffers: the graph's buffers (strides, dtypes, shapes).
        pointer_of: name of the kernel argument pointing at a buffer.
        resolve_load: hook for loads of buffers computed in this kernel.
    """

    def __init__(self, buffers: dict[str, Buffer], pointer_of: Callable[[str], str],
                 resolve_load: LoadResolver) -> None:
        self.buffers = buffers
        self.pointer_of = pointer_of
        self.resolve_load = resolve_load
        super().__init__()

    def text(self, expr: Expr, scope: Scope) -> str:
        return self.value(expr, scope).text

    def assign(self, text: str, dtype: torch.dtype, scope: Scope, prefix: str = "tmp") -> Value:
        name = self.new_var(prefix)
        scope.emit(f"const {value_type(dtype)} {name} = {text};")
        return Value(name, compute_dtype(dtype))

    def _emit(self, expr: Expr, scope: Scope) -> Value:
        if isinstance(expr, Const):
            return Value(literal(expr.value, expr.dtype), compute_dtype(expr.dtype), True)
        if isinstance(expr, IndexValue):
            index = self.index_text(expr.index, as_float=expr.dtype.is_floating_point)
            text = f"({index} != 0)" if expr.dtype == torch.bool else f"static_cast<{value_type(expr.dtype)}>({index})"
            return self.assign(text, expr.dtype, scope)
        if isinstance(expr, Load):
            return self._emit_load(expr, scope)
        if isinstance(expr, Cast):
            return self._emit_cast(expr, scope)
        if isinstance(expr, Where):
            cond = self.text(expr.cond, scope)
            a, b = self.text(expr.if_true, scope), self.text(expr.if_false, scope)
            return self.assign(f"{cond} ? {a} : {b}", expr.dtype, scope)
        if isinstance(expr, Op):
            special = _special_pow(expr, self, scope)
            if special is not None:
                return special
            args = [self.text(a, scope) for a in expr.args]
            operand_dtype = compute_dtype(expr.args[0].dtype)
            return self.assign(CPP_OPS[expr.name](*args, operand_dtype), expr.dtype, scope)
        raise NotImplementedError(f"expression {type(expr).__name__}")

    def _emit_cast(self, expr: Cast, scope: Scope) -> Value:
        if isinstance(expr.value, Const):  # fold the literal (as the Triton writer does)
            return Value(literal(_convert(expr.value.value, expr.dtype), expr.dtype), compute_dtype(expr.dtype), True)
        inner = self.text(expr.value, scope)
        source = compute_dtype(expr.value.dtype)
        if expr.dtype == torch.bool:
            return self.assign(f"({inner} != 0)", expr.dtype, scope)
        if expr.dtype in (torch.float16, torch.bfloat16):
            # Through float32, as ATen converts (float64 -> float32 -> half; int -> float -> half).
            as_f32 = inner if source == torch.float32 else _int_to_float(inner, source, "float")
            fn = "tf_round_f16" if expr.dtype == torch.float16 else "tf_round_bf16"
            return self.assign(f"{fn}({as_f32})", expr.dtype, scope)
        target = compute_dtype(expr.dtype)
        if target == source:
            return self.value(expr.value, scope)
        if target.is_floating_point:
            return self.assign(_int_to_float(inner, source, value_type(target)), target, scope)
        return self.assign(f"static_cast<{value_type(target)}>({inner})", target, scope)

    def _emit_load(self, expr: Load, scope: Scope) -> Value:
        resolved = self.resolve_load(expr, scope)
        if isinstance(resolved, Value):
            return resolved
        if isinstance(resolved, Expr):
            return self.value(resolved, scope)
        buffer = self.buffers[expr.buffer]
        terms: list[str] = []
        direct = sympy.Integer(0)  # relative to data_ptr(), which includes the storage offset
        for entry, stride, size in zip(expr.index, buffer.strides, buffer.shape):
            if isinstance(entry, Expr):
                gathered = self.text(entry, scope)
                terms.append(f"tf_clamp_index({gathered}, {self.index_text(size)}) * {self.index_text(stride)}")
            else:
                direct = direct + entry * stride
        offset = " + ".join([self.index_text(simplify_index(direct))] + terms)
        return self.assign(load_text(self.pointer_of(expr.buffer), offset, buffer.dtype), buffer.dtype, scope)

    def index_text(self, expr: sympy.Expr, as_float: bool = False) -> str:
        """C++ text of an index (with ``as_float``, of a float-valued size expression, in
        double); the sizes it mentions become kernel arguments."""
        self.sizes_used |= size_symbols(sympy.sympify(expr))
        if as_float and is_float_size(expr):
            return float_size_text(expr, lambda name: f"static_cast<double>({name})", repr)
        return print_index(expr)


def load_text(pointer: str, offset: str, dtype: torch.dtype) -> str:
    if dtype == torch.float16:
        return f"tf_f16_to_f32({pointer}[{offset}])"
    if dtype == torch.bfloat16:
        return f"tf_bf16_to_f32({pointer}[{offset}])"
    return f"{pointer}[{offset}]"


def store_text(value: str, dtype: torch.dtype) -> str:
    """``value`` (in ``dtype``'s compute type) as the bits stored in a ``dtype`` buffer."""
    if dtype == torch.float16:
        return f"tf_f32_to_f16({value})"
    if dtype == torch.bfloat16:
        return f"tf_f32_to_bf16({value})"
    return value


def _convert(value, dtype: torch.dtype):
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    return int(value)


def _special_pow(expr: Op, writer: ExpressionWriter, scope: Scope) -> Value | None:
    """``x ** c`` for small constant c as multiplications/sqrt, as ATen's pow with a scalar."""
    if expr.name != "pow" or not isinstance(expr.args[1], Const):
        return None
    exponent = float(expr.args[1].value)
    dtype = compute_dtype(expr.dtype)
    base = writer.text(expr.args[0], scope)
    if not dtype.is_floating_point:
        if not (exponent.is_integer() and 0 <= exponent <= 4):
            return None
        text = "1" if exponent == 0 else base
        for _ in range(int(exponent) - 1):  # multiplications that wrap on overflow, as ATen's
            text = f"tf_wmul<{storage_type(dtype)}>({text}, {base})"
        return writer.assign(text, dtype, scope)
    one = literal(1, dtype)
    if exponent == 0.5:
        return writer.assign(f"std::sqrt({base})", dtype, scope)
    if exponent.is_integer() and 0 <= exponent <= 4:
        if exponent == 0:  # 1 even for NaN and inf bases, as eager
            return Value(one, dtype, True)
        return writer.assign(" * ".join([base] * int(exponent)), dtype, scope)
    if exponent == -1:
        return writer.assign(f"{one} / {base}", dtype, scope)
    if exponent == -0.5:
        return writer.assign(f"{one} / std::sqrt({base})", dtype, scope)
    if exponent == -2:
        return writer.assign(f"{one} / ({base} * {base})", dtype, scope)
    return None


def _int_to_float(inner: str, source: torch.dtype, ctype: str) -> str:
    """``inner`` (of dtype ``source``) converted to the float type ``ctype``.

    From an integer, ``tf_plus_zero`` keeps a zero +0: GCC (with -fno-trapping-math) folds
    ``(float)(int)x`` into ``truncf(x)``, which gives -0.0 for x in (-1, 0) where the round trip
    through an integer gives +0.0 (atan2 and division then differ; found by fuzzing). GCC first
    drops a plain ``+ 0`` (an integer converts to +0 only), so the helper selects instead.
    """
    text = f"static_cast<{ctype}>({inner})"
    if source.is_floating_point or source == torch.bool:
        return text
    return f"tf_plus_zero({text})"
