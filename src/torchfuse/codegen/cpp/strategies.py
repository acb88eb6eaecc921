"""Loop structures of C++ kernels: the choice of strategy, and pointwise kernels.

Each strategy writes the body of one kernel function into ``top`` through the renderer's
hooks (values, stores, loops): ``pointwise`` here, ``rows``/``split`` in ``rows.py``,
``tiled`` in ``tiled.py``, ``scatter`` (accumulating scatters) in ``scatter.py``.
"""
from __future__ import annotations

import sympy

from torchfuse.codegen.cpp import rows, scatter, tiled
from torchfuse.codegen.cpp.expressions import Scope
from torchfuse.codegen.cpp.loops import PARALLEL_GRAIN, Loop, close_all, statically_at_least, statically_at_most
from torchfuse.codegen.cpp.splits import specialize, split_points
from torchfuse.ir.expr import Load, walk
from torchfuse.ir.symbols import linear_coefficients, product

# The innermost loop of a pointwise kernel is split into chunks of this many elements when
# there are too few outer iterations to keep every thread busy.
POINTWISE_CHUNK = 4096
# Rows at most this long stay on one thread while a full reduction splits its row across
# threads (``split``).
SPLIT_MAX_ROWS = 8


def render(renderer, top: Scope) -> str:
    """Write the kernel body with the strategy that fits it; returns the strategy's name."""
    if renderer.kernel.kind == "scatter":
        scatter.render_scatter(renderer, top)
        return "scatter"
    if renderer.kernel.kind != "reduction":
        render_pointwise(renderer, top)
        return "pointwise"
    if wants_tiles(renderer):
        tiled.render_tiled(renderer, top)
        return "tiled"
    split = wants_split(renderer)
    rows.render_rows(renderer, top, split)
    return "split" if split else "rows"


def wants_split(renderer) -> bool:
    """Few rows (a full reduction): split each row across threads instead of rows."""
    plan = renderer.plan
    if len(plan.r_loops) != 1 or statically_at_most(renderer.rnumel, PARALLEL_GRAIN - 1):
        return False
    return not plan.x_loops or statically_at_most(renderer.xnumel, SPLIT_MAX_ROWS)


def wants_tiles(renderer) -> bool:
    """Rows contiguous, reduced dims strided (a column sum, a norm's weight gradient): loads
    walk memory contiguously only if a block of rows advances together, innermost.

    Decided by the loads over rows x reduced dims (of reductions and full members): tiles
    when some walk the rows contiguously and none walks the reduced dim contiguously. Loads
    of per-reduced-position vectors (no row index, e.g. a norm's saved mean) do not count.
    """
    plan = renderer.plan
    if not plan.x_loops or statically_at_most(plan.x_loops[-1].size, 4):
        return False
    x_var, r_var = plan.x_loops[-1].var, plan.r_loops[-1].var
    along_x = along_r = 0
    for member in renderer.kernel.members:
        if member.role not in ("reduction", "full"):
            continue
        for node in walk(renderer.inlined(renderer.body(member))):
            if not isinstance(node, Load) or node.buffer in renderer.members:
                continue
            found = linear_coefficients(renderer.load_offset(node), [x_var, r_var])
            if found is None:
                continue
            (cx, cr), _ = found
            if cx == 0 or cr == 0:
                continue  # the same value along a whole tile, or along a whole row
            along_r += cr == 1
            along_x += cx == 1
    return along_x > 0 and along_r == 0


# -- pointwise ------------------------------------------------------------------------------
def render_pointwise(renderer, top: Scope) -> None:
    """Parallel outer loops and a contiguous inner loop (chunked when rows are few)."""
    loops = renderer.plan.x_loops
    stored = [m for m in renderer.kernel.members if m.stored]
    if not loops:  # a 0-dim result
        store_all(renderer, stored, top)
        return
    outer, inner = loops[:-1], loops[-1]
    chunked = bool(outer) and not statically_at_most(inner.size, POINTWISE_CHUNK) \
        and not statically_at_least(product([l.size for l in outer]), 64)
    if chunked:
        chunks = f"{inner.var.name}_chunks"
        top.emit(f"const int64_t {chunks} = ({renderer.size_text(inner.size)} + {POINTWISE_CHUNK - 1}) / {POINTWISE_CHUNK};")
    pragma = renderer.parallel_pragma(renderer.xnumel, len(outer) + (1 if chunked else 0) if outer else 1)
    if pragma:
        top.emit(pragma)
    scope = top
    for loop in outer:
        scope = renderer.open_loop(scope, loop)
    if chunked:
        chunk = Loop(sympy.Symbol(f"{inner.var.name}c", integer=True, nonnegative=True), sympy.Symbol(chunks))
        scope.emit(f"for (int64_t {chunk.var.name} = 0; {chunk.var.name} < {chunks}; ++{chunk.var.name}) {{")
        scope = scope.child()
        start = f"{chunk.var.name} * {POINTWISE_CHUNK}"
        end = f"{inner.var.name}_end"
        scope.emit(f"const int64_t {end} = tf_imin({start} + {POINTWISE_CHUNK}, {renderer.size_text(inner.size)});")
        scope = renderer.open_loop(scope, inner, start, end)
    else:
        bodies = {id(m): renderer.inlined(renderer.body(m)) for m in stored}
        points = split_points(list(bodies.values()), inner.var, inner.size)
        if points and outer:  # cat / pad: one contiguous piece per source (splits.py)
            bounds = [0, *points, int(inner.size)]
            for start, end in zip(bounds, bounds[1:]):
                piece = renderer.open_loop(scope, inner, str(start), str(end))
                values = [renderer.writer.value(specialize(bodies[id(m)], inner.var, start, end), piece) for m in stored]
                for member, value in zip(stored, values):
                    renderer.store(member, value, piece)
                scope.emit("}")
            close_all(scope, top)
            return
        scope = renderer.open_loop(scope, inner)
    store_all(renderer, stored, scope)
    close_all(scope, top)


def store_all(renderer, stored: list, scope: Scope) -> None:
    """Every member's value first, then the stores: each element is read before any store, so a
    member may write an input in place (scheduler/in_place.py) while kernel-mates read it."""
    values = [renderer.writer.value(renderer.body(m), scope) for m in stored]
    for member, value in zip(stored, values):
        renderer.store(member, value, scope)
