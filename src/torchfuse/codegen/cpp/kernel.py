"""Render one ``FusedKernel`` as a C++ function (``extern "C"``, called through ctypes).

Mirrors ``codegen/triton/kernel.py``. Where Triton tiles a flat ``xindex``, a C++ kernel
is a loop nest (``loops.py`` merges kernel variables where that is free):

- pointwise: OpenMP-parallel outer loops, a contiguous innermost loop GCC vectorizes;
- reduction, ``rows`` strategy (``rows.py``): one parallel iteration per row; each group of
  independent reductions is one SIMD loop over the row (``reductions.py``), then the row's
  pointwise members, then one loop storing the members over rows x reduced dims. A second
  pass over a row re-reads it from cache, so there is no separate "persistent" variant;
  ``split``: the same for a few long rows, each row split across threads;
- reduction, ``tiled`` strategy (``tiled.py``): when rows are contiguous and the reduced
  dims are strided (a column sum), a block of rows advances together, innermost;
- scatter (``scatter.py``): the source points in order, adding into the destination, with
  the destination's feature dim split among threads (race-free, deterministic).

``strategies.py`` chooses among them.

As in Triton, stores of buffers only read inside the kernel are dropped, in-kernel reads
of pointwise members are recomputed and reads of reductions come from registers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from torchfuse.codegen.cpp.expressions import ExpressionWriter, Scope, Value, store_text
from torchfuse.codegen.cpp import strategies
from torchfuse.codegen.cpp.loops import PARALLEL_GRAIN, Loop, LoopPlan, plan_loops
from torchfuse.codegen.cpp.prelude import PRELUDE, erf_definition
from torchfuse.codegen.cpp.printer import compute_dtype, storage_type, value_type
from torchfuse.codegen.cpp.scatter import destination_offset
from torchfuse.codegen.layout import overwritable_inputs
from torchfuse.ir.expr import Expr, IndexValue, Load, substitute_index, transform, walk
from torchfuse.ir.graph import Buffer, Reduction
from torchfuse.ir.symbols import product, simplify_index
from torchfuse.scheduler.kernel import FusedKernel, KernelMember

# Calls that make a loop compute-bound (see _finish).
WIDE_MATH = tuple(f"std::{name}" for name in (
    "exp exp2 expm1 log log2 log10 log1p sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh erf erfc "
    "pow atan2 hypot").split()) + ("tf_erff",)


@dataclass
class CppKernel:
    """Source of one kernel function and what the wrapper needs to call it."""

    name: str
    source: str
    pointer_args: list[str]  # buffer names, in argument order
    size_args: list[sympy.Symbol]
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    kind: str
    strategy: str  # "pointwise", "rows", "tiled" or "split"
    origins: list[str] = field(default_factory=list)
    # Stored buffer -> an input buffer it may be written over (see ``in_place_candidates``).
    in_place: dict[str, list[str]] = field(default_factory=dict)


class CppKernelRenderer:
    """Renders one kernel; the strategies call back into it for values, stores and loops.

    Args:
        kernel: the scheduled kernel.
        buffers: the graph's buffers.
        avx512: the CPU has AVX-512 (kernels heavy in math functions then use 512-bit vectors).
    """

    def __init__(self, kernel: FusedKernel, buffers: dict[str, Buffer], avx512: bool = False) -> None:
        self.kernel = kernel
        self.avx512 = avx512
        self.buffers = buffers
        self.members = {m.node.name: m for m in kernel.members}
        self.pointers: dict[str, str] = {}
        self.written: set[str] = set()
        self.registers: dict[str, Value] = {}
        # (member, index) -> its inlined body there: each member read at each index is inlined
        # once, so a chain of members each read twice stays as large as the chain.
        self._inlined_reads: dict[tuple[str, tuple], Expr] = {}
        self.writer = ExpressionWriter(buffers, self.pointer, self._resolve_load)
        stores = [self.store_offset(m, {}) for m in kernel.members if m.stored] if kernel.kind == "pointwise" else []
        self.plan: LoopPlan = plan_loops(kernel.x_vars, kernel.x_ranges, kernel.r_vars, kernel.r_ranges,
                                         self._index_exprs(), stores)
        self.xnumel = product(kernel.x_ranges)
        self.rnumel = product(kernel.r_ranges)

    # -- hooks for the expression writer --------------------------------------------------
    def pointer(self, buffer: str) -> str:
        """The kernel argument pointing at ``buffer`` (arguments in order of first use)."""
        if buffer not in self.pointers:
            self.pointers[buffer] = f"ptr{len(self.pointers)}"
        return self.pointers[buffer]

    def _resolve_load(self, load: Load, scope: Scope) -> Value | Expr | None:
        if load.buffer in self.registers:
            return self.registers[load.buffer]
        member = self.members.get(load.buffer)
        if member is None or isinstance(member.node, Reduction):
            return None
        return member.body_at(load.index)

    # -- analysis ---------------------------------------------------------------------------
    def inlined(self, body: Expr) -> Expr:
        """``body`` with loads of this kernel's pointwise members replaced by their bodies."""

        def rewrite(node: Expr) -> Expr | None:
            if not isinstance(node, Load):
                return None
            member = self.members.get(node.buffer)
            if member is None or isinstance(member.node, Reduction):
                return None
            key = (node.buffer, node.index)
            if key not in self._inlined_reads:
                self._inlined_reads[key] = self.inlined(member.body_at(node.index))
            return self._inlined_reads[key]

        return transform(body, rewrite)

    def _index_exprs(self) -> list[sympy.Expr]:
        """Every index this kernel computes, in kernel variables (for loop merging)."""
        found: list[sympy.Expr] = []
        for member in self.kernel.members:
            for node in (node for expr in member.exprs for node in walk(self.inlined(expr))):
                if isinstance(node, Load) and not isinstance(getattr(self.members.get(node.buffer), "node", None), Reduction):
                    found.append(self.load_offset(node))
                elif isinstance(node, IndexValue):
                    found.append(node.index)
            if member.role == "scatter":
                found.append(destination_offset(member, self.buffers[member.node.name], {}))
            elif member.stored:
                found.append(self.store_offset(member, {}))
            if isinstance(member.node, Reduction) and member.node.reduce_op in ("argmax", "argmin"):
                found.append(self.flat_r_index({}))
        return found

    def load_offset(self, load: Load) -> sympy.Expr:
        """The direct (non-gathered) part of a load's flat offset."""
        buffer = self.buffers[load.buffer]
        direct = sum((e * s for e, s in zip(load.index, buffer.strides) if not isinstance(e, Expr)), sympy.Integer(0))
        return simplify_index(direct)

    def store_offset(self, member: KernelMember, substitution: dict) -> sympy.Expr:
        """Where ``member`` stores its value, relative to its buffer's ``data_ptr()``."""
        node = member.node
        buffer = self.buffers[node.name]
        index = tuple(member.var_map.get(v, v) for v in node.vars)
        offset = buffer.flat_offset(index) - buffer.offset
        return simplify_index(sympy.sympify(offset).xreplace(substitution))

    def flat_r_index(self, substitution: dict) -> sympy.Expr:
        """The row-major position within the reduced dims (what argmax returns)."""
        ranges, flat = self.kernel.r_ranges, sympy.Integer(0)
        for k, var in enumerate(self.kernel.r_vars):
            flat = flat + var * product(ranges[k + 1:])
        return simplify_index(flat.xreplace(substitution))

    def body(self, member: KernelMember) -> Expr:
        """The member's body in loop variables."""
        return substitute_index(member.body, self.plan.substitution)

    # -- statements ------------------------------------------------------------------------
    def store(self, member: KernelMember, value: Value, scope: Scope) -> None:
        node = member.node
        self.written.add(node.name)
        offset = self.writer.index_text(self.store_offset(member, self.plan.substitution))
        text = value.text
        if value.dtype != compute_dtype(node.dtype):
            text = f"static_cast<{value_type(node.dtype)}>({text})"
        scope.emit(f"{self.pointer(node.name)}[{offset}] = {store_text(text, node.dtype)};")

    def store_member(self, member: KernelMember, scope: Scope) -> None:
        self.store(member, self.writer.value(self.body(member), scope), scope)

    def size_text(self, expr: sympy.Expr) -> str:
        return self.writer.index_text(expr)

    def parallel_pragma(self, work: sympy.Expr, collapse: int = 1) -> str | None:
        """The ``omp parallel for`` line for ``work`` elements, or None when too small to split."""
        work = sympy.sympify(work)
        condition = ""
        if work.is_number:
            if int(work) < PARALLEL_GRAIN:
                return None
        else:
            condition = f" if({self.size_text(work)} >= {PARALLEL_GRAIN})"
        clause = f" collapse({collapse})" if collapse > 1 else ""
        return f"#pragma omp parallel for num_threads(tf_threads) schedule(static){clause}{condition}"

    def open_loop(self, scope: Scope, loop: Loop, start: str = "0", end: str | None = None) -> Scope:
        end = end if end is not None else self.size_text(loop.size)
        scope.emit(f"for (int64_t {loop.var.name} = {start}; {loop.var.name} < {end}; ++{loop.var.name}) {{")
        return scope.child()

    # -- rendering -------------------------------------------------------------------------
    def render(self) -> CppKernel:
        lines: list[str] = []
        top = Scope(lines, "    ")
        strategy = strategies.render(self, top)
        return self._finish(lines, strategy)

    def _finish(self, lines: list[str], strategy: str) -> CppKernel:
        pointer_args = list(self.pointers)
        sizes = sorted(self.writer.sizes_used, key=lambda s: s.name)
        # No __restrict__: pointers may alias (graph inputs may share memory, a pointwise kernel
        # may write over an input it reads, ``in_place`` below), and a false promise is
        # undefined behaviour GCC acts on: with -mtune=znver2 it reloaded x from memory after
        # storing x + 1 over it. Without it GCC versions loops for aliasing, with a check that
        # an exact overlap (in place, dependence distance 0) passes (docs/decisions.md).
        params = []
        for name in pointer_args:
            ctype = storage_type(self.buffers[name].dtype)
            const = "" if name in self.written else "const "
            params.append(f"{const}{ctype}* {self.pointers[name]}")
        params += [f"int64_t {s.name}" for s in sizes] + ["int tf_threads"]
        origins = ", ".join(self.kernel.origins)
        body = "\n".join(lines)
        # Kernels that call vectorized math functions (libmvec's, our erf) run them 16 floats at
        # a time; elsewhere 8 (GCC's default on AVX-512 machines), which measured faster for
        # memory-bound loops here. Ignored by compilers or CPUs without AVX-512.
        wide = any(f"{fn}(" in body for fn in WIDE_MATH)
        attribute = '__attribute__((target("prefer-vector-width=512"))) ' if wide and self.avx512 else ""
        header = [f"// {self.kernel.kind} kernel ({strategy}): {origins}",
                  f'extern "C" {attribute}void {self.kernel.name}({", ".join(params)}) {{']
        source = "\n".join(header + lines + ["}"]) + "\n"
        return CppKernel(self.kernel.name, source, pointer_args, sizes, self.xnumel, self.rnumel,
                         self.kernel.kind, strategy, self.kernel.origins, self.in_place_candidates())

    def in_place_candidates(self) -> dict[str, list[str]]:
        """Inputs the kernel's single stored member may overwrite (``layout.overwritable_inputs``)."""
        return overwritable_inputs(self.kernel, self.buffers)


def render_kernel(kernel: FusedKernel, buffers: dict[str, Buffer], avx512: bool = False) -> CppKernel:
    """The C++ source of one kernel and its calling convention."""
    return CppKernelRenderer(kernel, buffers, avx512).render()


def render_module(kernels: list[CppKernel]) -> str:
    """One translation unit: the prelude, then every kernel of the graph."""
    body = "\n".join(k.source for k in kernels)
    return erf_definition(body) + PRELUDE + "\n" + body
