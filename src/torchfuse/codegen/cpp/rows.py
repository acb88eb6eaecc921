"""Reductions by rows: one parallel iteration per row (``rows``), or, for a few long rows,
each row split across threads (``split``, a full reduction such as ``loss.mean()``).

Inside a row, each group of independent reductions is one SIMD loop over the reduced dims
(chunked for float32 sums, see ``reductions.py``); then the row's pointwise members are
stored, then one loop stores the members over rows x reduced dims. A second pass over a
row re-reads it from cache, and prefetches the next row meanwhile (``prefetch.py``).
"""
from __future__ import annotations

import sympy
import torch

from torchfuse.codegen.cpp import reductions as red
from torchfuse.codegen.cpp.expressions import Scope
from torchfuse.codegen.cpp.prefetch import NextRowPrefetch
from torchfuse.codegen.cpp.printer import compute_dtype
from torchfuse.codegen.cpp.loops import PARALLEL_GRAIN, close_all, statically_at_most
from torchfuse.ir.expr import Expr, Load, Op, loads, walk
from torchfuse.ir.graph import Reduction
from torchfuse.scheduler.kernel import KernelMember

# Elements of a float32 partial sum (see reductions.py): 16 per lane with 8-lane vectors.
REDUCTION_CHUNK = 128
# Per-thread partial results of a split reduction are combined in thread order (so results
# do not depend on timing); at most this many threads take part.
MAX_SPLIT_THREADS = 64


def render_rows(renderer, top: Scope, split: bool) -> None:
    """Rows in parallel (``split``: rows in order, each split across threads)."""
    x_loops = renderer.plan.x_loops
    if x_loops and not split:
        pragma = renderer.parallel_pragma(renderer.xnumel * renderer.rnumel, len(x_loops))
        if pragma:
            top.emit(pragma)
    row = top
    for loop in x_loops:
        row = renderer.open_loop(row, loop)
    members = renderer.kernel.members
    hoist_row_invariant_loads(renderer, row)
    full = [m for m in members if m.role == "full" and m.stored]
    groups = loop_groups(renderer, [m for m in members if m.role == "reduction"])
    reuse = {} if split or not groups else reused_values(renderer, groups[-1], full)
    later_passes = len(groups) - 1 + (1 if full else 0)
    prefetch = None if split or not groups else NextRowPrefetch(renderer, groups[0], later_passes)
    for k, group in enumerate(groups):
        if k and prefetch:
            prefetch.emit(row, k - 1)
        reduce_group(renderer, group, row, split, reuse if k == len(groups) - 1 else {})
    for member in members:
        if member.role == "row" and member.stored:
            renderer.store_member(member, row)
    if full:
        if prefetch:
            prefetch.emit(row, later_passes - 1)
        _store_full(renderer, full, row, split, reuse)
    close_all(row, top)


def hoist_row_invariant_loads(renderer, row: Scope) -> None:
    """Load, once per row, every value the row's loops read at an index without reduced
    variables (a row's target, a scalar scale). The loops then find it in the row's scope.
    Why: the pointers are not ``__restrict__`` (they may alias, kernel.py), so GCC
    cannot move such a load out of a SIMD loop whose reduction partials live in memory; it
    kept a scalar loop, loading and dividing per element (cross-entropy's backward: the
    one-hot's row sum took 4 of the kernel's 5.6 ms)."""
    r_vars = {loop.var for loop in renderer.plan.r_loops}
    seen: set[Load] = set()
    for member in renderer.kernel.members:
        for node in walk(renderer.inlined(renderer.body(member))):
            if not isinstance(node, Load) or node in seen or node.buffer in renderer.members:
                continue
            seen.add(node)
            if _load_row_invariant(node, r_vars):
                renderer.writer.value(node, row)


def hoist_row_invariant_values(renderer, expr: Expr, row: Scope) -> None:
    """Compute, once per row, each largest floating-point part of ``expr`` that does not depend
    on the reduced variables (a layer norm's ``rsqrt(var + eps)`` and its mean, from the row's
    reductions); the store loop then finds them in the row's scope. GCC left such chains inside
    the loop (a 2048 x 1024 layer norm on 2 cores: the corrected two-pass variance's extra
    arithmetic cost ~20%, ~10% with this; docs/decisions.md). Integer division and remainder
    stay inside: the loop may run zero times, and hoisted they could divide by zero.

    Each distinct node is looked at once, outermost first (a body shares sub-expressions: an
    inlined chain read twice per link would otherwise be walked as a tree of 2**links)."""
    invariant = _row_invariant_nodes(renderer, expr)
    visited: set[int] = set()
    pending = [expr]
    while pending:
        node = pending.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if id(node) in invariant:
            if isinstance(node, Op) and node.dtype.is_floating_point:
                renderer.writer.value(node, row)
            continue
        pending.extend(reversed(node.children()))


def _row_invariant_nodes(renderer, expr: Expr) -> set[int]:
    """Ids of the nodes of ``expr`` that do not depend on the reduced variables (nor divide
    integers), computed children first."""
    r_vars = {loop.var for loop in renderer.plan.r_loops}
    invariant: set[int] = set()
    for node in walk(expr):
        if _locally_row_invariant(node, r_vars) and all(id(c) in invariant for c in node.children()):
            invariant.add(id(node))
    return invariant


def _locally_row_invariant(node: Expr, r_vars: set) -> bool:
    if isinstance(node, Load):
        return _load_row_invariant(node, r_vars)
    if isinstance(node, Op):
        return node.dtype.is_floating_point or not any(word in node.name for word in ("div", "mod", "rem"))
    if not node.children() and getattr(node, "index", None) is not None:  # IndexValue
        return not sympy.sympify(node.index).free_symbols & r_vars
    return True


def _load_row_invariant(load: Load, r_vars: set) -> bool:
    """A load at a plain index (no gathered entry) that names no reduced variable."""
    return not any(isinstance(entry, Expr) or sympy.sympify(entry).free_symbols & r_vars for entry in load.index)


def _store_full(renderer, full: list[KernelMember], row: Scope, split: bool, reuse: dict[KernelMember, Expr]) -> None:
    """One loop over the reduced dims storing the members over rows x reduced dims."""
    r_loops = renderer.plan.r_loops
    if split:
        pragma = renderer.parallel_pragma(renderer.rnumel, len(r_loops))
        if pragma:
            row.emit(pragma)
    if not split:
        for member in full:
            hoist_row_invariant_values(renderer, renderer.inlined(renderer.body(member)), row)
    scope = row
    for loop in r_loops:
        scope = renderer.open_loop(scope, loop)
    for member in full:
        if member in reuse:  # computed by the last reduction pass and parked in the output
            offset = renderer.writer.index_text(renderer.store_offset(member, renderer.plan.substitution))
            parked = renderer.writer.assign(f"{renderer.pointer(member.node.name)}[{offset}]", member.node.dtype, scope)
            scope.cache[reuse[member]] = parked
            renderer.store(member, renderer.writer.value(renderer.inlined(renderer.body(member)), scope), scope)
        else:
            renderer.store_member(member, scope)
    close_all(scope, row)


# Ops worth a store and a reload (from cache) rather than computing twice.
EXPENSIVE = frozenset("exp exp2 expm1 log log2 log10 log1p erf erfc erfinv tanh sigmoid pow sin cos tan lgamma".split())


def reused_values(renderer, last_group: list[KernelMember], full: list[KernelMember]) -> dict[KernelMember, Expr]:
    """Expensive values that a full member needs and the last reduction pass computes anyway.

    Softmax's ``exp(x - max) / sum`` recomputes the ``exp`` that its sum already computed.
    Eager's kernel writes that ``exp`` to the output during the sum and rescales it in place;
    so do we: the sum's pass stores the value in the member's own buffer and the final pass
    reads it back (from cache: the row was just written) instead of recomputing it. Only for
    float32/float64 outputs, which hold the value exactly.
    """
    computed: set[Expr] = set()
    for member in last_group:
        computed |= {e for e in walk(renderer.inlined(renderer.body(member))) if isinstance(e, Op)}
    found: dict[KernelMember, Expr] = {}
    for member in full:
        dtype = member.node.dtype
        if dtype not in (torch.float32, torch.float64):
            continue
        for expr in _outermost_first(renderer.inlined(renderer.body(member))):
            if (isinstance(expr, Op) and expr.name in EXPENSIVE and expr in computed
                    and compute_dtype(expr.dtype) == dtype):
                found[member] = expr
                break
    return found


def _outermost_first(expr: Expr) -> list[Expr]:
    return list(reversed(list(walk(expr))))


def loop_groups(renderer, reductions: list[KernelMember]) -> list[list[KernelMember]]:
    """Consecutive reductions share one loop unless one reads another's result."""
    groups: list[list[KernelMember]] = []
    for member in reductions:
        reads = _reads_in_kernel(renderer, member)
        if groups and not any(m.node.name in reads for m in groups[-1]):
            groups[-1].append(member)
        else:
            groups.append([member])
    return groups


def _reads_in_kernel(renderer, member: KernelMember) -> set[str]:
    found, pending = set(), [member.body]
    while pending:
        for load in loads(pending.pop()):
            if load.buffer in renderer.members and load.buffer not in found:
                found.add(load.buffer)
                inner = renderer.members[load.buffer]
                if not isinstance(inner.node, Reduction):
                    pending.append(inner.body)
    return found


def reduce_group(renderer, group: list[KernelMember], row: Scope, split: bool,
                 parked: dict[KernelMember, Expr]) -> None:
    """One pass over the row computing every reduction of ``group``; registers its results.
    ``parked`` values are stored into their member's buffer on the way (``reused_values``)."""
    writer = renderer.writer
    accs = []
    for member in group:
        node: Reduction = member.node
        acc = red.accumulator(node.reduce_op, node.dtype, node.body.dtype)
        name = writer.new_var("acc")
        for line in red.declarations(acc, name):
            row.emit(line)
        accs.append((member, acc, name))
    if split:
        _split_pass(renderer, accs, row)
    else:
        scope = row
        for loop in renderer.plan.r_loops[:-1]:
            scope = renderer.open_loop(scope, loop)
        accumulate(renderer, accs, scope, {name: name for _, _, name in accs}, "0", None, parked)
        close_all(scope, row)
    for member, acc, name in accs:
        result = writer.assign(red.result(acc, red.Slot(name), member.node.dtype), member.node.dtype, row, "red")
        renderer.registers[member.node.name] = result
        if member.stored:
            renderer.store(member, result, row)


def accumulate(renderer, accs, scope: Scope, targets: dict[str, str], start: str, end: str | None,
               parked: dict[KernelMember, Expr] | None = None) -> None:
    """The innermost reduced loop from ``start`` to ``end``, folding into ``targets``."""
    writer = renderer.writer
    inner = renderer.plan.r_loops[-1]
    size = end or renderer.size_text(inner.size)
    chunked = any(acc.part_type for _, acc, _ in accs) and not statically_at_most(inner.size, REDUCTION_CHUNK)
    slots = dict(targets)
    if chunked:  # float32 sums: float32 partials per chunk, folded into float64 (see reductions.py)
        chunk = f"{inner.var.name}c"
        scope.emit(f"for (int64_t {chunk} = {start}; {chunk} < {size}; {chunk} += {REDUCTION_CHUNK}) {{")
        scope = scope.child()
        start, size = chunk, f"tf_imin({chunk} + {REDUCTION_CHUNK}, {size})"
        for _, acc, name in accs:
            if acc.part_type:
                slots[name] = writer.new_var("part")
                for line in red.declarations(acc, slots[name], part=True):
                    scope.emit(line)
    # argmax/argmin must see elements in order (the first extreme wins): no simd for them.
    if all(acc.omp_op is not None for _, acc, _ in accs):
        clauses = [c for _, acc, name in accs for c in red.clauses(acc, slots[name])]
        scope.emit("#pragma omp simd " + " ".join(clauses))
    body = renderer.open_loop(scope, inner, start, size)
    index = writer.index_text(renderer.flat_r_index(renderer.plan.substitution))
    for member, acc, name in accs:
        value = writer.text(renderer.body(member), body)
        for line in red.update(acc, red.Slot(slots[name]), value, index):
            body.emit(line)
    for member, expr in (parked or {}).items():
        renderer.store(member, writer.value(expr, body), body)
    scope.emit("}")
    if chunked:
        for _, acc, name in accs:
            if slots[name] != targets[name]:  # only chunk partials fold; others accumulate directly
                for line in red.combine(acc, red.Slot(targets[name]), red.Slot(slots[name])):
                    scope.emit(line)
        scope.parent.emit("}")


def _split_pass(renderer, accs, row: Scope) -> None:
    """One row across threads: each reduces a contiguous range into its own slot, then the
    slots are combined in thread order (deterministic; argmax keeps the first extreme)."""
    writer = renderer.writer
    inner = renderer.plan.r_loops[0]
    size = renderer.size_text(inner.size)
    used = writer.new_var("nthreads")
    row.emit(f"int {used} = 1;")
    for _, acc, name in accs:
        for line in red.declarations(acc, f"{name}_slot", length=str(MAX_SPLIT_THREADS)):
            row.emit(line)
    condition = "" if inner.size.is_number else f" if({size} >= {PARALLEL_GRAIN})"
    row.emit(f"#pragma omp parallel num_threads(tf_threads < {MAX_SPLIT_THREADS} ? tf_threads : "
             f"{MAX_SPLIT_THREADS}){condition}")
    row.emit("{")
    region = row.child()
    region.emit("const int tid = omp_get_thread_num(), nth = omp_get_num_threads();")
    region.emit(f"if (tid == 0) {used} = nth;")
    # Ranges are whole chunks, so every thread's float32 partials are as short as one row's.
    region.emit(f"const int64_t per = (({size} + nth - 1) / nth + {REDUCTION_CHUNK - 1}) / {REDUCTION_CHUNK} * "
                f"{REDUCTION_CHUNK};")
    region.emit(f"const int64_t lo = tf_imin(tid * per, {size}), hi = tf_imin(lo + per, {size});")
    mine = {}
    for _, acc, name in accs:
        mine[name] = f"{name}_mine"
        for line in red.declarations(acc, mine[name]):
            region.emit(line)
    accumulate(renderer, accs, region, mine, "lo", "hi")
    for _, acc, name in accs:
        for line in _copy(acc, red.Slot(f"{name}_slot", "[tid]"), red.Slot(mine[name])):
            region.emit(line)
    row.emit("}")
    row.emit(f"for (int t = 0; t < {used}; ++t) {{")
    for _, acc, name in accs:
        for line in red.combine(acc, red.Slot(name), red.Slot(f"{name}_slot", "[t]")):
            row.emit("    " + line)
    row.emit("}")


def _copy(acc: red.Accumulator, target: red.Slot, source: red.Slot) -> list[str]:
    lines = [f"{target.value} = {source.value};"]
    if acc.tracks_nan:
        lines.append(f"{target.nan} = {source.nan};")
    if acc.is_arg:
        lines.append(f"{target.index} = {source.index};")
    return lines
