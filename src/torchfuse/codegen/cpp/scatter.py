"""C++ scatter kernels: each source point adds its value at a runtime index, in a fixed order.

A ``ScatterAdd`` (``ir/graph.py``) may send several points to one element, so two threads
must never add into the same element. The loops over the source points keep their order
(outermost first: an embedding gradient's tokens, then its feature dim); a loop is a
*column* when some direct entry of the destination index is exactly its variable (the
feature dim ``j`` of ``weight_grad[idx[n], j]``): different values of it write different
elements, so threads may split it. The kernel splits the outermost column among its threads
(``#pragma omp parallel for`` when it is the outermost loop; otherwise a parallel region in
which each thread runs every other loop over its own slice of the column, in chunks of 16
elements so that no two threads share a cache line of a float row); without a column it runs
on one thread. Either way each element receives its additions in the loops' order, so results
are the same from run to run and for every thread count.

Index and mask values are computed in the shallowest loop they depend on (an embedding row's
index once per token), and the mask guards everything below it, so padding rows are skipped
whole. The addition is the op table's ``add`` (integers wrap through unsigned arithmetic).
"""
from __future__ import annotations

from typing import Any

import sympy

from torchfuse.codegen.cpp.expressions import Scope
from torchfuse.codegen.cpp.loops import PARALLEL_GRAIN, Loop, close_all, statically_at_most
from torchfuse.codegen.cpp.ops import CPP_OPS
from torchfuse.ir.expr import Expr, index_symbols, substitute_index
from torchfuse.ir.graph import Buffer
from torchfuse.ir.symbols import simplify_index
from torchfuse.scheduler.kernel import KernelMember

# Threads split a column in multiples of this many elements (64 bytes of float32).
COLUMN_CHUNK = 16


def destination_offset(member: KernelMember, buffer: Buffer, substitution: dict) -> sympy.Expr:
    """The direct part of a scatter's destination offset (runtime entries left out), in loop
    variables: what loop planning sees of the store."""
    direct = sum((sympy.sympify(e) * s for e, s in zip(member.index, buffer.strides) if not isinstance(e, Expr)),
                 sympy.Integer(0))
    return simplify_index(sympy.sympify(direct).xreplace(substitution))


def render_scatter(renderer: Any, top: Scope) -> None:
    """Write the body of a scatter kernel into ``top`` (``renderer`` is a ``CppKernelRenderer``)."""
    member: KernelMember = renderer.kernel.members[0]
    plan = renderer.plan
    index = [substitute_index(e, plan.substitution) if isinstance(e, Expr)
             else simplify_index(sympy.sympify(e).xreplace(plan.substitution)) for e in member.index]
    mask = substitute_index(member.mask, plan.substitution) if member.mask is not None else None
    loops = plan.x_loops
    pending = [e for e in index if isinstance(e, Expr)] + ([mask] if mask is not None else [])
    opened: set[sympy.Symbol] = set()
    # Values of no loop come first: nothing may stand between an omp pragma and its loop.
    scope = _emit_ready(renderer, top, pending, mask, opened)
    column = _parallel_column(loops, index)
    scope, slice_bounds = _open_parallel(renderer, scope, loops, column)
    for loop in loops:
        if slice_bounds is not None and loop is column:
            scope = renderer.open_loop(scope, loop, *slice_bounds)
        else:
            scope = renderer.open_loop(scope, loop)
        opened.add(loop.var)
        scope = _emit_ready(renderer, scope, pending, mask, opened)
    _add(renderer, member, index, scope)
    close_all(scope, top)


def _parallel_column(loops: list[Loop], index: list) -> Loop | None:
    """The outermost loop whose variable is a whole direct entry of the destination index."""
    direct = {entry for entry in index if not isinstance(entry, Expr)}
    for loop in loops:
        if loop.var in direct and not statically_at_most(loop.size, 1):
            return loop
    return None


def _open_parallel(renderer: Any, top: Scope, loops: list[Loop], column: Loop | None) -> tuple[Scope, tuple | None]:
    """Split ``column`` among threads: returns the scope the loops open in, and the bounds of
    this thread's slice of the column (None when the column loop is the parallel loop itself,
    or when nothing is split)."""
    work = sympy.sympify(renderer.xnumel)
    if column is None or (work.is_number and int(work) < PARALLEL_GRAIN):
        return top, None
    if column is loops[0]:
        top.emit(renderer.parallel_pragma(work))
        return top, None
    condition = "" if work.is_number else f" if({renderer.size_text(work)} >= {PARALLEL_GRAIN})"
    top.emit(f"#pragma omp parallel num_threads(tf_threads){condition}")
    top.emit("{")
    region = top.child()
    size = renderer.size_text(column.size)
    region.emit(f"const int64_t tf_share = (({size} + omp_get_num_threads() - 1) / omp_get_num_threads() "
                f"+ {COLUMN_CHUNK - 1}) / {COLUMN_CHUNK} * {COLUMN_CHUNK};")
    region.emit(f"const int64_t tf_lo = tf_imin(omp_get_thread_num() * tf_share, {size});")
    region.emit(f"const int64_t tf_hi = tf_imin(tf_lo + tf_share, {size});")
    return region, ("tf_lo", "tf_hi")


def _emit_ready(renderer: Any, scope: Scope, pending: list[Expr], mask: Expr | None,
                opened: set[sympy.Symbol]) -> Scope:
    """Compute the index entries and the mask whose loop variables are all open; the mask then
    guards the rest (returns the scope inside its ``if``)."""
    loop_vars = {loop.var for loop in renderer.plan.x_loops}
    for expr in list(pending):
        if not (index_symbols(expr) & loop_vars) <= opened:
            continue
        pending.remove(expr)
        value = renderer.writer.value(expr, scope)
        if expr is mask:
            scope.emit(f"if ({value.text}) {{")
            scope = scope.child()
    return scope


def _add(renderer: Any, member: KernelMember, index: list, scope: Scope) -> None:
    """``destination[offset] = destination[offset] + value`` (the op table's ``add``)."""
    node = member.node
    buffer = renderer.buffers[node.name]
    writer = renderer.writer
    value = writer.value(substitute_index(member.body, renderer.plan.substitution), scope)
    renderer.written.add(node.name)
    terms = []
    direct = sympy.Integer(0)
    for entry, stride in zip(index, buffer.strides):
        if isinstance(entry, Expr):
            terms.append(f"{writer.text(entry, scope)} * {writer.index_text(stride)}")
        else:
            direct = direct + entry * stride
    offset = " + ".join([writer.index_text(simplify_index(direct))] + terms)
    target = f"{renderer.pointer(node.name)}[{offset}]"
    scope.emit(f"{target} = {CPP_OPS['add'](target, value.text, node.dtype)};")
