"""Emit body expressions as Triton statements, with common-subexpression elimination."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import sympy
import torch

from torchfuse.codegen.float_sizes import float_size_text
from torchfuse.codegen.scope import CseWriter, Scope  # noqa: F401  (Scope re-exported)
from torchfuse.codegen.triton.guards import GuardedLoad, guard_branches, unclamp
from torchfuse.codegen.triton.ops import OPERATOR_OPS, TRITON_OPS
from torchfuse.codegen.triton.printer import compute_dtype, print_index, tl_dtype
from torchfuse.ir.expr import Cast, Const, Expr, IndexValue, Load, Op, Where, index_symbols
from torchfuse.ir.graph import Buffer
from torchfuse.ir.symbols import is_float_size, simplify_index, size_symbols

# First letters of the index symbols that are blocks (xindex, rindex, and a 2-D tile's yindex);
# anything else in an index (sizes, a tile's per-program zindex) is a scalar.
TENSOR_INDEX_PREFIXES = ("x", "r", "y")
# Block symbols whose mask is not their first letter's: an outer reduction's chunk of rows
# (``xchunk``, chunks.py) has a mask of its own, ``[1, 1]`` where every lane of a program is
# in one chunk.
LOOP_KEYS = {"xchunk": "c"}


@dataclass
class Value:
    """A name (or literal) in the generated code; ``is_tensor`` is False for scalars."""

    text: str
    is_tensor: bool


class ExpressionWriter(CseWriter):
    """Turns ``Expr`` trees into Triton statements inside a ``Scope``.

    Args:
        buffers: the graph's buffers (for strides, dtypes).
        pointer_of: name of the kernel argument pointing at a buffer.
        mask_for: the mask text for a load whose index uses the given loop variables.
        resolve_load: hook for loads of buffers computed in this kernel: returns a Value
            (a register) or an Expr to emit instead, or None for a real memory load.
        unit_shape: "[1]" or "[1, 1]": the shape used to make a scalar into a tensor.
    """

    def __init__(self, buffers: dict[str, Buffer], pointer_of: Callable[[str], str],
                 mask_for: Callable[[set[str]], str], resolve_load: Callable[[Load, "Scope"], object],
                 unit_shape: str) -> None:
        self.buffers = buffers
        self.pointer_of = pointer_of
        self.mask_for = mask_for
        self.resolve_load = resolve_load
        self.unit_shape = unit_shape
        # Whether a buffer is a register of the kernel (set by reduction kernels, for hoisting).
        self.is_register: Callable[[str], bool] = lambda name: False
        # Whether a buffer is read from memory only, never computed in this kernel (set by
        # reduction kernels: such a load at an index without the loop's variable is hoisted).
        self.is_kernel_input: Callable[[str], bool] = lambda name: False
        # Where nodes whose branches' loads are already guarded (guards.py), by id; the dict
        # keeps them alive so an id is never reused.
        self._guarded: dict[int, Expr] = {}
        # bfloat16 roundings two elements an instruction (``_round_bf16_pairs``; set by looped
        # reductions when kernel.PACKED_ROUNDINGS is on).
        self.packed_roundings = False
        # Memory loads that vary along both the rows and the reduced axis: each holds a whole
        # tile in registers (launch.py sizes heavy reductions' tiles by them).
        self.tile_loads = 0
        # Memory loads in this scope that vary along the rows only are loaded as whole tiles
        # (kernel.py: a persistent outer reduction's reduced values, TILE_SHAPED_ROW_LOADS).
        self.row_tile_scope: Scope | None = None
        # Rewrites a direct index (simplified, in xindex/rindex) before it is printed: an outer
        # reduction names its rows' chunk and lane (kernel.py); identity otherwise.
        self.rewrite_index: Callable[[sympy.Expr], sympy.Expr] = lambda index: index
        super().__init__()

    def value(self, expr, scope: Scope):
        if isinstance(expr, Where) and id(expr) not in self._guarded:
            expr = guard_branches(expr, done=self._guarded)
        return super().value(expr, scope)

    def tensor(self, expr: Expr, scope: Scope) -> str:
        """``expr`` as a tensor (scalars are widened with tl.full)."""
        value = self.value(expr, scope)
        if value.is_tensor:
            return value.text
        dtype = tl_dtype(compute_dtype(expr.dtype))
        return f"tl.full({self.unit_shape}, {value.text}, {dtype})"

    def hoistable(self, expr: Expr) -> bool:
        """Arithmetic, and a gather from a kernel input whose own index is loop-invariant (it
        goes where its gathered index is computed)."""
        return isinstance(expr, (Op, Cast, Where)) or (self._invariant_input_load(expr) and expr.is_indirect)

    def invariant_leaf(self, expr: Expr) -> bool:
        """A load of a register (a reduction's result, computed before the loop), or a load of a
        kernel input at an index without the loop's variable: a batch norm's per-channel
        statistics in an outer reduction over the batch, a table gathered per output (measured on
        the H200: an EfficientNet squeeze-excite pool at 24% of copy bandwidth loaded four
        per-channel values and took a square root at every step of its loop). Not a memory load
        at the row's index: a loop that runs no time (an empty row) never made it, and before
        the loop it would read an empty tensor's memory."""
        if not isinstance(expr, Load):
            return False
        return self.is_register(expr.buffer) or (self._invariant_input_load(expr) and not expr.is_indirect)

    def _invariant_input_load(self, expr: Expr) -> bool:
        """A memory load of a buffer this kernel only reads, at an index whose direct part has
        no loop variable (``rindex``), of a buffer with elements: a reduction over an empty axis
        loses that axis's variable from its index, and its loop never loads. (A symbolic size is
        never 0: Dynamo specializes sizes 0 and 1.)"""
        if not isinstance(expr, Load) or not self.is_kernel_input(expr.buffer):
            return False
        if any(sympy.sympify(size) == 0 for size in self.buffers[expr.buffer].shape):
            return False
        direct = [sympy.sympify(e) for e in expr.index if not isinstance(e, Expr)]
        return not any(s.name[:1] == "r" for e in direct for s in e.free_symbols)

    def is_computed(self, value: Value) -> bool:
        return value.is_tensor

    def _emit(self, expr: Expr, scope: Scope) -> Value:
        if isinstance(expr, Const):
            return Value(_literal(expr.value, expr.dtype), False)
        if isinstance(expr, IndexValue):
            index = self.rewrite_index(expr.index)
            text = self.index_text(index, as_float=expr.dtype.is_floating_point)
            is_tensor = any(_is_block_symbol(s) for s in index.free_symbols)
            return self._assign(f"{text}" if is_tensor else text, is_tensor, scope, cast=expr.dtype)
        if isinstance(expr, Load):
            return self._emit_load(expr, scope)
        if isinstance(expr, GuardedLoad):
            return self._emit_guarded_load(expr, scope)
        if isinstance(expr, Cast):
            return self._emit_cast(expr, scope)
        if isinstance(expr, Where):
            cond = self.tensor(expr.cond, scope)
            a, b = self.value(expr.if_true, scope).text, self.value(expr.if_false, scope).text
            return self._assign(f"tl.where({cond}, {a}, {b})", True, scope)
        if isinstance(expr, Op):
            return self._emit_op(expr, scope)
        raise NotImplementedError(f"expression {type(expr).__name__}")

    def _assign(self, text: str, is_tensor: bool, scope: Scope, cast: torch.dtype | None = None) -> Value:
        if cast is not None and is_tensor:
            text = f"({text}).to({tl_dtype(compute_dtype(cast))})"
        if not is_tensor:
            return Value(text, False)
        name = self.new_var()
        scope.emit(f"{name} = {text}")
        return Value(name, True)

    def _emit_op(self, expr: Op, scope: Scope) -> Value:
        special = _special_pow(expr, self, scope)
        if special is not None:
            return special
        args = [self.value(a, scope) for a in expr.args]
        if expr.name not in OPERATOR_OPS:
            args = [Value(self.tensor(a, scope), True) for a in expr.args]
        elif not any(a.is_tensor for a in args):
            args[0] = Value(self.tensor(expr.args[0], scope), True)
        operand_dtype = compute_dtype(expr.args[0].dtype)
        text = TRITON_OPS[expr.name](*[a.text for a in args], operand_dtype)
        return self._assign(text, True, scope)

    def _emit_cast(self, expr: Cast, scope: Scope) -> Value:
        inner = self.value(expr.value, scope)
        if not inner.is_tensor and _is_literal(inner.text):
            return Value(_literal(_python_value(inner.text), expr.dtype), False)
        if not inner.is_tensor:  # a size argument: make it a tensor to convert it
            inner = Value(self.tensor(expr.value, scope), True)
        if expr.dtype == torch.bool:
            return self._assign(f"({inner.text} != 0)", True, scope)
        if expr.dtype in (torch.float16, torch.bfloat16):
            return self._assign(_round_to_half(inner.text, compute_dtype(expr.value.dtype), expr.dtype,
                                               self.packed_roundings), True, scope)
        target = compute_dtype(expr.dtype)
        if target == compute_dtype(expr.value.dtype):  # e.g. float16 -> float32: already float32 here
            return inner
        return self._assign(f"{inner.text}.to({tl_dtype(target)})", True, scope)

    def _emit_load(self, expr: Load, scope: Scope) -> Value:
        resolved = self.resolve_load(expr, scope)
        if isinstance(resolved, Value):
            return resolved
        if isinstance(resolved, Expr):
            return self.value(resolved, scope)
        return self._emit_memory_load(expr, scope)

    def _emit_guarded_load(self, expr: GuardedLoad, scope: Scope) -> Value:
        """A load one side of a Where needs only where it is taken: a memory load masked by the
        facts instead of clamped, where they prove the clamps idle; a producer inlined here
        keeps the facts for its own loads."""
        resolved = self.resolve_load(expr.load, scope)
        if isinstance(resolved, Value):
            return resolved
        if isinstance(resolved, Expr):
            return self.value(guard_branches(resolved, expr.facts, self._guarded), scope)
        load, guard = unclamp(expr.load, expr.facts)
        return self._emit_memory_load(load, scope, guard)

    def _emit_memory_load(self, expr: Load, scope: Scope, guard: Expr | None = None) -> Value:
        """``expr`` read from memory; where ``guard`` is given, only on the lanes it holds."""
        buffer = self.buffers[expr.buffer]
        offset_terms, loop_vars = [], set()
        direct = sympy.Integer(0)  # relative to data_ptr(), which includes the storage offset
        for entry, stride in zip(expr.index, buffer.strides):
            if isinstance(entry, Expr):
                gathered = self.tensor(entry, scope)
                offset_terms.append(f"({gathered}) * {print_index(stride)}")
                # The masks of the loop variables the gathered value itself depends on.
                loop_vars |= {_loop_key(sym) for sym in index_symbols(entry) if _is_block_symbol(sym)}
                self._note_sizes(stride)
            else:
                direct = direct + entry * stride
        direct = self.rewrite_index(simplify_index(direct))
        loop_vars |= {_loop_key(s) for s in direct.free_symbols if _is_block_symbol(s)}
        if guard is not None:  # the guard's lanes are the mask's too
            loop_vars |= {_loop_key(s) for s in index_symbols(guard) if _is_block_symbol(s)}
        offset = " + ".join([self.index_text(direct)] + offset_terms)
        if loop_vars == {"x"} and scope is self.row_tile_scope:
            offset, loop_vars = f"{offset} + 0 * rindex", {"x", "r"}
        mask = self.mask_for(loop_vars)
        if guard is not None:
            mask = f"{mask} & {self.tensor(guard, scope)}" if mask else f", {self.tensor(guard, scope)}"
        other = ", other=0" if mask else ""
        text = f"tl.load({self.pointer_of(expr.buffer)} + ({offset}){mask}{other})"
        if buffer.dtype == torch.bool:
            text += ".to(tl.int1)"
        elif compute_dtype(buffer.dtype) != buffer.dtype:
            text += ".to(tl.float32)"
        is_tensor = bool(loop_vars)
        if {"x", "r"} <= loop_vars:
            self.tile_loads += 1
        if not is_tensor:  # a load at a fixed address still gives a (1-element) tensor
            text = f"tl.broadcast_to({text}, {self.unit_shape})"
        return self._assign(text, True, scope)

    def scalar_argument(self, param: str, dtype: torch.dtype, scope: Scope) -> Value:
        """A kernel argument passed by value (a CPU scalar read by a GPU kernel), as a tensor
        of the dtype a load of it would give (half types compute in float32)."""
        return self._assign(f"tl.full({self.unit_shape}, {param}, {tl_dtype(compute_dtype(dtype))})", True, scope)

    def index_text(self, expr: sympy.Expr, as_float: bool = False) -> str:
        """Text of an index; with ``as_float``, of a float-valued size expression (float64)."""
        self._note_sizes(expr)
        if as_float and is_float_size(expr):
            return float_size_text(expr, lambda name: f"tl.cast({name}, tl.float64)", _exact_float32_literal)
        return print_index(expr)

    def _note_sizes(self, expr: sympy.Expr) -> None:
        self.sizes_used |= size_symbols(expr)


def _exact_float32_literal(value: float) -> str:
    """A Python float constant in a Triton expression is a float32: only those it holds exactly
    (1.0, 0.5, ...) are written as literals, since the float64 operand beside it widens them."""
    if float(np.float32(value)) != value:
        raise NotImplementedError(f"constant {value!r} of a float size expression is not exact in float32")
    return repr(value)


def _is_block_symbol(symbol: sympy.Symbol) -> bool:
    return symbol.name[:1] in TENSOR_INDEX_PREFIXES


def _loop_key(symbol: sympy.Symbol) -> str:
    """Which mask a block symbol's lanes take: "x", "r", "y", or "c" (``LOOP_KEYS``)."""
    return LOOP_KEYS.get(symbol.name, symbol.name[0])


def _special_pow(expr: Op, writer: ExpressionWriter, scope: Scope) -> Value | None:
    """``x ** c`` for small constant c as multiplications/sqrt (exact and fast)."""
    if expr.name != "pow" or not isinstance(expr.args[1], Const):
        return None
    exponent = expr.args[1].value
    base = writer.tensor(expr.args[0], scope)
    if exponent == 0.5:
        return writer._assign(f"libdevice.sqrt({base})", True, scope)
    if float(exponent).is_integer() and 0 <= exponent <= 4:
        if exponent == 0:  # 1 even for NaN and inf bases, as eager
            return writer._assign(f"tl.full({writer.unit_shape}, 1, {tl_dtype(compute_dtype(expr.dtype))})", True, scope)
        return writer._assign(" * ".join([base] * int(exponent)), True, scope)
    if exponent == -1:
        return writer._assign(f"1.0 / {base}", True, scope)
    if exponent == -0.5:  # as eager (rsqrt, so (-inf) ** -0.5 is NaN like eager's)
        return writer._assign(f"libdevice.rsqrt({base})", True, scope)
    if exponent == -2:
        return writer._assign(f"1.0 / ({base} * {base})", True, scope)
    return None


def _round_to_half(text: str, source: torch.dtype, target: torch.dtype, packed: bool = False) -> str:
    """``text`` (a ``source`` tensor) rounded to float16/bfloat16 and kept as float32.

    Always through float32, as ATen converts (float64 -> float32 -> half; int -> float ->
    half). bfloat16 uses the ``_round_bf16`` helper (``_round_bf16_pairs`` when ``packed``):
    Triton's interpreter truncates (and mangles non-float32 sources) where GPUs round to
    nearest even.
    """
    as_f32 = text if source == torch.float32 else f"{text}.to(tl.float32)"
    if target == torch.float16:
        return f"{as_f32}.to(tl.float16).to(tl.float32)"
    return f"_round_bf16{'_pairs' if packed else ''}({as_f32})"


def _literal(value, dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        value = float(value)
        if dtype in (torch.float16, torch.bfloat16):  # a half constant holds a half value
            value = float(torch.tensor(value, dtype=torch.float32).to(dtype))
        if value != value:
            return 'float("nan")'
        if value in (float("inf"), float("-inf")):
            return f'float("{value}")'
        return repr(value)
    return str(int(value))


def _is_literal(text: str) -> bool:
    try:
        _python_value(text)
        return True
    except NameError:
        return False


def _python_value(text: str):
    return eval(text, {"float": float})  # literals we printed ourselves
