"""Reductions by tiles of rows (``tiled``): for reductions over a strided dim, e.g. a column
sum of a row-major matrix or a norm's weight gradient.

Reducing row by row would walk the reduced dim with a large stride (one cache line per
element). Instead a tile of ``TILE`` consecutive rows (innermost kernel rows, contiguous in
memory) advances together: for each reduced position, a SIMD loop over the tile updates one
accumulator per row, held in small arrays. The loop order is the only difference from
``rows.py``; results are the same (float32 sums are chunked the same way).
"""
from __future__ import annotations

from torchfuse.codegen.cpp import reductions as red
from torchfuse.codegen.cpp.expressions import Scope, Value
from torchfuse.codegen.cpp.printer import compute_dtype, value_type
from torchfuse.codegen.cpp.rows import REDUCTION_CHUNK, loop_groups
from torchfuse.codegen.cpp.loops import close_all, statically_at_most

TILE = 32  # rows per tile: 128 bytes of float32 per reduced position


class _Tile:
    """The current tile: rows ``start <= lane < end`` of the innermost row loop ``lane``."""

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self.start = f"{lane}s"
        self.end = f"{lane}e"

    @property
    def at(self) -> str:
        return f"[{self.lane} - {self.start}]"

    def open(self, renderer, scope: Scope) -> Scope:
        """A SIMD loop over the tile's rows (each iteration touches only its own row's slots)."""
        scope.emit("#pragma omp simd")
        scope.emit(f"for (int64_t {self.lane} = {self.start}; {self.lane} < {self.end}; ++{self.lane}) {{")
        return scope.child()


def render_tiled(renderer, top: Scope) -> None:
    plan = renderer.plan
    outer, inner = plan.x_loops[:-1], plan.x_loops[-1]
    tile = _Tile(inner.var.name)
    size = renderer.size_text(inner.size)
    tiles = f"{inner.var.name}_tiles"
    top.emit(f"const int64_t {tiles} = ({size} + {TILE - 1}) / {TILE};")
    pragma = renderer.parallel_pragma(renderer.xnumel * renderer.rnumel, len(outer) + 1)
    if pragma:
        top.emit(pragma)
    scope = top
    for loop in outer:
        scope = renderer.open_loop(scope, loop)
    scope.emit(f"for (int64_t {inner.var.name}t = 0; {inner.var.name}t < {tiles}; ++{inner.var.name}t) {{")
    body = scope.child()
    body.emit(f"const int64_t {tile.start} = {inner.var.name}t * {TILE};")
    body.emit(f"const int64_t {tile.end} = tf_imin({tile.start} + {TILE}, {size});")
    members = renderer.kernel.members
    for group in loop_groups(renderer, [m for m in members if m.role == "reduction"]):
        _reduce_group(renderer, group, body, tile)
    rows = [m for m in members if m.role == "row" and m.stored]
    if rows:
        lane = tile.open(renderer, body)
        for member in rows:
            renderer.store_member(member, lane)
        close_all(lane, body)
    full = [m for m in members if m.role == "full" and m.stored]
    if full:
        loops = body
        for loop in plan.r_loops:
            loops = renderer.open_loop(loops, loop)
        lane = tile.open(renderer, loops)
        for member in full:
            renderer.store_member(member, lane)
        close_all(lane, body)
    close_all(body, top)


def _reduce_group(renderer, group, body: Scope, tile: _Tile) -> None:
    writer = renderer.writer
    accs = []
    for member in group:
        node = member.node
        acc = red.accumulator(node.reduce_op, node.dtype, node.body.dtype)
        name = writer.new_var("acc")
        for line in red.declarations(acc, name, length=str(TILE)):
            body.emit(line)
        accs.append((member, acc, name))
    r_loops = renderer.plan.r_loops
    scope = body
    for loop in r_loops[:-1]:
        scope = renderer.open_loop(scope, loop)
    inner = r_loops[-1]
    size = renderer.size_text(inner.size)
    start, end = "0", size
    slots = {name: name for _, _, name in accs}
    chunked = any(acc.part_type for _, acc, _ in accs) and not statically_at_most(inner.size, REDUCTION_CHUNK)
    if chunked:
        chunk = f"{inner.var.name}c"
        scope.emit(f"for (int64_t {chunk} = 0; {chunk} < {size}; {chunk} += {REDUCTION_CHUNK}) {{")
        scope = scope.child()
        start, end = chunk, f"tf_imin({chunk} + {REDUCTION_CHUNK}, {size})"
        for _, acc, name in accs:
            if acc.part_type:
                slots[name] = writer.new_var("part")
                for line in red.declarations(acc, slots[name], part=True, length=str(TILE)):
                    scope.emit(line)
    loop = renderer.open_loop(scope, inner, start, end)
    lane = tile.open(renderer, loop)
    index = writer.index_text(renderer.flat_r_index(renderer.plan.substitution))
    for member, acc, name in accs:
        value = writer.text(renderer.body(member), lane)
        for line in red.update(acc, red.Slot(slots[name], tile.at), value, index):
            lane.emit(line)
    close_all(lane, scope)
    if chunked:
        fold = tile.open(renderer, scope)
        for _, acc, name in accs:
            if slots[name] != name:
                for line in red.combine(acc, red.Slot(name, tile.at), red.Slot(slots[name], tile.at)):
                    fold.emit(line)
        close_all(fold, scope)
    close_all(scope, body)
    arrays = {}
    for member, _, name in accs:
        arrays[name] = writer.new_var("red")
        body.emit(f"{value_type(member.node.dtype)} {arrays[name]}[{TILE}];")
    results = tile.open(renderer, body)
    for member, acc, name in accs:
        dtype = member.node.dtype
        results.emit(f"{arrays[name]}{tile.at} = {red.result(acc, red.Slot(name, tile.at), dtype)};")
        value = Value(f"{arrays[name]}{tile.at}", compute_dtype(dtype))
        renderer.registers[member.node.name] = value
        if member.stored:
            renderer.store(member, value, results)
    close_all(results, body)
