"""Render one ``FusedKernel`` as a Triton kernel.

Pointwise kernels walk a flat ``xindex`` in their store's memory order, or a 2-D tile
``[YBLOCK, XBLOCK]`` when a large read is contiguous along another row than the store
(``tiles2d.py``); reduction kernels tile ``[XBLOCK, RBLOCK]`` with
rows on axis 0 when the reduced axis is contiguous (*inner*), or ``[RBLOCK, XBLOCK]`` with
rows on the lanes' axis when a kept axis is (*outer*: column sums, bias gradients; see
``tiling.py``). A reduction is *persistent* (the whole row in one tile, everything in
registers) when the row is short, else *looped* over ``RBLOCK`` chunks. Stores of buffers
only read inside the kernel are dropped; in-kernel reads of pointwise members are
recomputed and reads of reductions come from registers.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import sympy
import torch

from torchfuse.codegen.layout import overwritable_inputs, store_order
from torchfuse.codegen.triton import online_softmax
from torchfuse.codegen.triton.chunks import CHUNK_MASK, row_chunks
from torchfuse.codegen.triton import reductions as red
from torchfuse.codegen.triton.expressions import ExpressionWriter, Scope, Value
from torchfuse.codegen.triton.printer import compute_dtype, tl_dtype
from torchfuse.codegen.triton.scatter import emit_scatter, scatter_order
from torchfuse.codegen.triton.tiles2d import Tile2D, pointwise_tile
from torchfuse.codegen.triton.tiling import reduction_tiling
from torchfuse.ir.devices import is_kernel_scalar
from torchfuse.ir.expr import Expr, Load, Op, count_ops, loads, substitute_index, walk
from torchfuse.ir.graph import Buffer, Reduction
from torchfuse.ir.symbols import FloorDiv, ModIndex, product, simplify_index, size_symbols
from torchfuse.scheduler.kernel import FusedKernel, KernelMember

XINDEX = sympy.Symbol("xindex", integer=True, nonnegative=True)
RINDEX = sympy.Symbol("rindex", integer=True, nonnegative=True)
# A 2-D tiled pointwise kernel (tiles2d.py): the read's run on tile axis 0, rows outside the tile.
YINDEX = sympy.Symbol("yindex", integer=True, nonnegative=True)
ZINDEX = sympy.Symbol("zindex", integer=True, nonnegative=True)
INT32_LIMIT = 2**31 - 1
# An outer tile holds RBLOCK x XBLOCK with XBLOCK >= 32 lanes along the rows, so a persistent
# outer reduction fits 4096 elements only for short reduced axes.
OUTER_PERSISTENT_LIMIT = 128
# The parameter that sets how many steps of a looped reduction's row Triton keeps in flight
# (``tl.range``'s ``num_stages``): a launch choice like the block sizes (``launch_configs.Config``), so
# max-autotune can time it per kernel. Triton's compile option of that name pipelines only loads
# that feed a ``dot``; ``tl.range(..., num_stages=1)`` compiles what a plain ``range`` does.
LOOP_STAGES_PARAM = "LOOP_STAGES"
# Whether looped reductions round to bfloat16 two elements an instruction (ops._round_bf16_pairs,
# inline PTX: NVIDIA GPUs only). On sm_90 SASS it halves the conversions of EfficientNet's
# squeeze-excite pools (their arithmetic bound 62 -> 50 us on this CPU's count), but in pointwise
# kernels, where the compiler already pairs a rounding that feeds a store, the opaque asm added
# conversions (2.5 -> 3.0 an element), so only looped reductions take it. Measured on the H100
# (scripts/ab_policy.py, 2026-12-07, ninth session), the same bits: the pool over [128, 144, 56,
# 56] 79.0 -> 74.8 us, over [128, 480, 14, 14] 21.4 -> 21.0 us.
PACKED_ROUNDINGS = torch.version.hip is None
# IR ops that compile to the SM's special function unit (MUFU: exp2, reciprocal, square root),
# at 16 an SM a clock on sm_90 against 128 float32 adds: a SiLU is two, a float division one.
SPECIAL_OPS = frozenset({"exp", "exp2", "sigmoid", "tanh", "log", "log2", "sqrt", "rsqrt", "reciprocal", "truediv",
                         "sin", "cos"})
# A marked step also has at least this many ops an element (ir.expr.count_ops, casts counted).
# Measured on the H100 (2026-12-07): a pool over BN + SiLU with its two roundings (10 ops)
# gained from small tiles (113.5 -> 81.0 us), a pool over a SiLU alone (4 ops) lost (65.3 ->
# 70.2 us). 8 lies between the two; no step of 5 to 9 ops was measured.
SPECIAL_STEP_MIN_OPS = 8
# Special functions that take several MUFU instructions and dozens of others (libdevice's exp is
# an exp2 with range reduction; a sigmoid an exp and a division): a step with one of them is a
# TRANSCENDENTAL_STEP, one with divisions and square roots alone a SPECIAL_STEP.
TRANSCENDENTAL_OPS = frozenset({"exp", "exp2", "sigmoid", "tanh", "log", "log2", "sin", "cos"})
PLAIN_STEP, SPECIAL_STEP, TRANSCENDENTAL_STEP = 0, 1, 2
# A persistent outer reduction whose epilogue loads rows from memory loads the values it reduces
# that vary along the rows only (T5's position bias, read across the batch it sums) as whole
# tiles, ``ptr + xindex + 0 * rindex``: loaded as ``[1, XBLOCK]`` rows they took the layout of
# the epilogue's loads, and Triton converted the reduced tiles to it through shared memory,
# computing the exp and the division in both layouts (sm_90 SASS on this CPU, T5's position-bias
# gradient: 41.8 -> 32.2 instructions and 2.0 -> 1.1 MUFU an element; unmeasured on a GPU).
# Without such an epilogue there was no conversion to remove (a squeeze-excite pool over 7 x 7
# rows: 35.7 -> 36.6 instructions, and a smaller tile from the extra live tiles), and looped
# kernels hoist such loads before their loop, where Triton gives them the tile's layout.
TILE_SHAPED_ROW_LOADS = True
# The program id a kernel starts from: int64 when its indices may pass 2**31 (``_needs_int64``).
PROGRAM_ID, PROGRAM_ID_64 = "tl.program_id(0)", "tl.program_id(0).to(tl.int64)"


def flat_prologue(pid: str) -> str:
    """The first line of a flat pointwise kernel: its lanes' indices from the program id
    (``combo.py`` finds this line to run the kernel as a part of a combined launch)."""
    return f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)"


@dataclass
class TritonKernel:
    """Source of one kernel and what the wrapper needs to launch it."""

    name: str
    source: str  # the kernel function (helpers are added by the module writer)
    pointer_args: list[str]  # buffer names, in argument order
    size_args: list[sympy.Symbol]
    xnumel: sympy.Expr
    rnumel: sympy.Expr
    kind: str
    persistent: bool
    origins: list[str] = field(default_factory=list)
    # 0-d CPU buffers a GPU kernel receives by value (lowering/devices.py), after the pointers.
    scalar_args: list[str] = field(default_factory=list)
    device: str = "cuda"  # device type the kernel runs on ("cpu": Triton's interpreter)
    # The ``def``'s name: from a digest of the body, not the graph's kernel name, so identical
    # kernels (every layer of a transformer, forward and backward) have one source and compile once.
    function: str = ""
    outer: bool = False  # a reduction tiled [RBLOCK, XBLOCK]: lanes walk the rows (tiling.py)
    # A pointwise kernel tiled [YBLOCK, XBLOCK] (tiles2d.py): (Z, Y, X), its programs per tile
    # position and the extent of each tile axis, literals in its source; None for 1-D kernels.
    tile: tuple[int, int, int] | None = None
    # Stored buffer -> inputs it may be written over (``overwritable_inputs``); the wrapper
    # decides whether one is dead and ours.
    in_place: dict[str, list[str]] = field(default_factory=dict)
    # Integers the wrapper passes after the pointers: a combined launch's part sizes (combo.py).
    int_args: list[int] = field(default_factory=list)
    # A combined launch (combo.py): the kernels it runs. Not autotuned: its stores sit in the
    # parts' functions, under their own parameter names, so what it writes is not in its text.
    parts: tuple[str, ...] = ()
    # A reduction's tile-shaped values live in one step: its accumulators and its loads that vary
    # along both axes (launch_configs.reduction_config keeps the tiles of heavy ones small); 0 otherwise.
    live_tiles: int = 0
    # A looped reduction whose step computes special functions for each element (SPECIAL_OPS:
    # exp, reciprocal, square root, on the SM's quarter-rate unit) among SPECIAL_STEP_MIN_OPS ops
    # or more: launch_configs.reduction_config gives light outer ones small tiles and many
    # programs, heavy ones with TRANSCENDENTAL_OPS smaller tiles. PLAIN_STEP, SPECIAL_STEP or
    # TRANSCENDENTAL_STEP (true for both of the last two).
    special_step: int = 0
    # An outer reduction whose reads name its rows' chunk (chunks.py): the default launch's
    # XBLOCK divides this many rows (launch_configs.align_to_chunks); 0 for other kernels.
    chunk_lanes: int = 0


def flat_var_map(ranges, kernel_vars, flat: sympy.Symbol) -> dict[sympy.Symbol, sympy.Expr]:
    """Each kernel variable as a function of the flat index over ``ranges`` (row-major)."""
    mapping = {}
    for k, var in enumerate(kernel_vars):
        inner = product(ranges[k + 1:])
        part = FloorDiv(flat, inner)
        mapping[var] = part if k == 0 else ModIndex(part, ranges[k])
    return mapping


class KernelRenderer:
    def __init__(self, kernel: FusedKernel, buffers: dict[str, Buffer], persistent_limit: int = 4096,
                 size_hint=lambda e: 0) -> None:
        self.kernel = kernel
        self.buffers = buffers
        self.is_reduction = kernel.kind == "reduction"
        self.outer = False
        self.tile2d: Tile2D | None = None
        if self.is_reduction:
            tiling = reduction_tiling(kernel, buffers)
            x_vars, x_ranges, self.outer = tiling.x_vars, tiling.x_ranges, tiling.outer
        elif kernel.kind == "scatter":  # scatter.py: atomic adds at runtime indices
            x_vars, x_ranges = scatter_order(kernel, buffers)
        else:
            store = self._store_offset(kernel, buffers)
            x_vars, x_ranges = store_order(list(kernel.x_vars), list(kernel.x_ranges), store)
            self.tile2d = pointwise_tile(kernel, buffers, store)
        # Tile text: rows on axis 0 (inner) or on the lanes' axis 1 (outer); reduce the other.
        self.tile = "[RBLOCK, XBLOCK]" if self.outer else "[XBLOCK, RBLOCK]"
        self.row_shape = "[1, XBLOCK]" if self.outer else "[XBLOCK, 1]"
        self.r_axis = 0 if self.outer else 1
        if self.tile2d is not None:
            self.flat = self._tile_var_map(self.tile2d)
        else:
            self.flat = flat_var_map(x_ranges, x_vars, XINDEX)
            self.flat.update(flat_var_map(kernel.r_ranges, kernel.r_vars, RINDEX))
        self.members = {m.node.name: m for m in kernel.members}
        self.pointers: dict[str, str] = {}
        self.scalars: dict[str, str] = {}  # buffer -> parameter holding its value
        self.registers: dict[str, str] = {}  # reduction buffer -> variable holding its row value
        self.accumulators = 0  # tile-shaped accumulators (looped) or reduced tiles (persistent)
        self.loops_opened = 0  # loops over the row's blocks so far (_open_r_loop)
        rnumel_hint = size_hint(product(kernel.r_ranges))
        limit = min(persistent_limit, OUTER_PERSISTENT_LIMIT) if self.outer else persistent_limit
        self.persistent = self.is_reduction and 0 < rnumel_hint <= limit
        self.int64 = _needs_int64(kernel, buffers, size_hint)
        two_d = self.is_reduction or self.tile2d is not None
        self.writer = ExpressionWriter(buffers, self._pointer, self._mask, self._resolve_load,
                                       "[1, 1]" if two_d else "[1]")
        self.writer.is_register = lambda name: name in self.registers
        self.writer.packed_roundings = PACKED_ROUNDINGS and self.is_reduction and not self.persistent
        self.writer.is_kernel_input = self._is_kernel_input
        self.chunks = row_chunks(XINDEX, self.outer, x_ranges)
        if self.chunks is not None:
            self.writer.rewrite_index = self.chunks.rewrite

    @staticmethod
    def _store_offset(kernel: FusedKernel, buffers: dict[str, Buffer]) -> sympy.Expr | None:
        """The first store's offset in kernel variables. A pointwise kernel's rows enter the flat
        ``xindex`` with its unit-stride row innermost (``codegen.layout``), so that neighbouring
        lanes write neighbouring elements (reductions: ``tiling.py``)."""
        stored = [m for m in kernel.members if m.stored]
        if not stored:
            return None
        node = stored[0].node
        buffer = buffers[node.name]
        return buffer.flat_offset(tuple(stored[0].var_map.get(v, v) for v in node.vars)) - buffer.offset

    @staticmethod
    def _tile_var_map(tile: Tile2D) -> dict[sympy.Symbol, sympy.Expr]:
        """Each kernel row from ``zindex`` (outside the tile), ``yindex`` or ``xindex``."""
        mapping = flat_var_map(list(tile.z_ranges), list(tile.z_vars), ZINDEX)
        mapping.update(flat_var_map(list(tile.y_ranges), list(tile.y_vars), YINDEX))
        mapping.update(flat_var_map(list(tile.x_ranges), list(tile.x_vars), XINDEX))
        return mapping

    # -- hooks for the expression writer --------------------------------------------------
    def _pointer(self, buffer: str) -> str:
        if buffer not in self.pointers:
            self.pointers[buffer] = f"ptr{len(self.pointers)}"
        return self.pointers[buffer]

    def _mask(self, loop_vars: set[str]) -> str:
        if "x" in loop_vars:  # the lanes' mask covers their chunk's
            loop_vars = loop_vars - {"c"}
        masks = [m for v, m in (("y", "ymask"), ("x", "xmask"), ("c", CHUNK_MASK), ("r", "rmask")) if v in loop_vars]
        if not self.is_reduction and self.tile2d is None:
            masks = ["xmask"] if "x" in loop_vars else []
        return (", " + " & ".join(masks)) if masks else ""

    def _is_kernel_input(self, buffer: str) -> bool:
        """Read from memory, not computed by one of this kernel's members. (An input whose memory
        a row member overwrites, ``scheduler/in_place.py``, is stored after the loop that reads
        it: a load hoisted before that loop still reads it first.)"""
        return buffer not in self.members and buffer not in self.registers

    def _resolve_load(self, load: Load, scope: Scope):
        if load.buffer in self.registers:
            return Value(self.registers[load.buffer], True)
        buffer = self.buffers.get(load.buffer)
        if buffer is not None and is_kernel_scalar(buffer, self.kernel.device):
            param = self.scalars.setdefault(load.buffer, f"scalar{len(self.scalars)}")
            return self.writer.scalar_argument(param, buffer.dtype, scope)
        member = self.members.get(load.buffer)
        if member is None or isinstance(member.node, Reduction):
            return None
        return member.body_at(load.index)

    # -- rendering -------------------------------------------------------------------------
    def flat_body(self, member: KernelMember) -> Expr:
        return substitute_index(member.body, self.flat)

    def render(self) -> TritonKernel:
        lines: list[str] = []
        top = Scope(lines, "    ")
        self._emit_prologue(top)
        if self.is_reduction:
            self._emit_reduction_members(top)
            self._define_chunks(lines)
        elif self.kernel.kind == "scatter":
            emit_scatter(self, top)
        else:
            # Values first, then stores: every element is read before it is overwritten, so a
            # member may write a mutated input in place (scheduler/in_place.py).
            stored = [m for m in self.kernel.members if m.stored]
            values = [self.writer.tensor(self.flat_body(m), top) for m in stored]
            mask = "ymask & xmask" if self.tile2d is not None else "xmask"
            for member, value in zip(stored, values):
                self._store(member, value, top, mask)
        return self._finish(lines)

    def _emit_prologue(self, scope: Scope) -> None:
        pid = PROGRAM_ID_64 if self.int64 else PROGRAM_ID
        if self.tile2d is not None:
            self._emit_tile_prologue(pid, scope)
            return
        if self.is_reduction:
            scope.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK){self._axis_suffix('x')}")
        else:
            scope.emit(flat_prologue(pid))
        scope.emit("xmask = xindex < xnumel")
        if self.persistent:
            scope.emit(f"rindex = tl.arange(0, RBLOCK){self._axis_suffix('r')}")
            scope.emit("rmask = rindex < rnumel")

    def _define_chunks(self, lines: list[str]) -> None:
        """``chunks.py``'s names, after ``xmask``, where the body used them."""
        if self.chunks is None or not self.chunks.names:
            return
        pid = PROGRAM_ID_64 if self.int64 else PROGRAM_ID
        at = lines.index("    xmask = xindex < xnumel") + 1
        lines[at:at] = ["    " + line for line in self.chunks.prologue(pid, self._axis_suffix("x"))]

    def _emit_tile_prologue(self, pid: str, scope: Scope) -> None:
        """A 2-D tile's indices: the one program id is (z, y tile, x tile), x fastest; the
        sizes are literals (only static sizes are tiled), so the tile counts fold at compile time."""
        znumel, ynumel, xnumel = self.tile2d.numels
        scope.emit(f"pid = {pid}")
        scope.emit(f"xtiles = ({xnumel} + XBLOCK - 1) // XBLOCK")
        scope.emit(f"ytiles = ({ynumel} + YBLOCK - 1) // YBLOCK")
        if znumel > 1:
            scope.emit("zindex = pid // (xtiles * ytiles)")
        scope.emit("yindex = (pid // xtiles) % ytiles * YBLOCK + tl.arange(0, YBLOCK)[:, None]")
        scope.emit(f"ymask = yindex < {ynumel}")
        scope.emit("xindex = pid % xtiles * XBLOCK + tl.arange(0, XBLOCK)[None, :]")
        scope.emit(f"xmask = xindex < {xnumel}")

    def _axis_suffix(self, var: str) -> str:
        """How a 1-D range of rows (``x``) or reduced elements (``r``) enters the 2-D tile."""
        on_last_axis = (var == "x") == self.outer
        return "[None, :]" if on_last_axis else "[:, None]"

    def _emit_reduction_members(self, top: Scope) -> None:
        members = self.kernel.members
        reductions = [m for m in members if m.role == "reduction"]
        if self.persistent:
            # The reduced values in a scope of their own: a row value the epilogue computes
            # again stays a row there (expressions.row_tile_scope).
            tiles = top
            if self._row_loads_in_epilogue():
                tiles = self.writer.row_tile_scope = Scope(top.lines, top.indent, parent=top)
            for member in members:
                if member.role == "reduction":
                    self._reduce_persistent(member, tiles)
                elif member.stored:
                    self._store_member(member, top)
            return
        for group in online_softmax.merge_pairs(self._loop_groups(reductions), self.flat_body):
            if isinstance(group, online_softmax.OnlinePair):
                online_softmax.emit_pair(self, group, top)
            else:
                self._reduce_looped(group, top)
        for member in members:
            if member.role == "row" and member.stored:
                self._store_member(member, top)
        full = [m for m in members if m.role == "full" and m.stored]
        if full:
            loop = self._open_r_loop(top)
            for member in full:
                self._store_member(member, loop)

    def _row_loads_in_epilogue(self) -> bool:
        """Whether this outer kernel's row values (its epilogue) load memory, so that its reduced
        values' row loads are better tiles (TILE_SHAPED_ROW_LOADS)."""
        if not (self.outer and TILE_SHAPED_ROW_LOADS):
            return False
        rows = [m for m in self.kernel.members if m.role == "row"]
        return any(self._is_kernel_input(load.buffer) for m in rows for load in loads(m.body))

    def _store_member(self, member: KernelMember, scope: Scope) -> None:
        mask = "xmask & rmask" if member.role == "full" else "xmask"
        self._store(member, self.writer.tensor(self.flat_body(member), scope), scope, mask)

    def _loop_groups(self, reductions: list[KernelMember]) -> list[list[KernelMember]]:
        """Consecutive reductions share one loop unless one reads another's result."""
        groups: list[list[KernelMember]] = []
        for member in reductions:
            reads = self._reads_in_kernel(member)
            if groups and not any(m.node.name in reads for m in groups[-1]):
                groups[-1].append(member)
            else:
                groups.append([member])
        return groups

    def _reads_in_kernel(self, member: KernelMember) -> set[str]:
        found, pending = set(), [member.body]
        while pending:
            for load in loads(pending.pop()):
                if load.buffer in self.members and load.buffer not in found:
                    found.add(load.buffer)
                    inner = self.members[load.buffer]
                    if not isinstance(inner.node, Reduction):
                        pending.append(inner.body)
        return found

    def _open_r_loop(self, top: Scope) -> Scope:
        """A loop over the row's blocks. Every second loop of a kernel walks them backwards: a
        loop re-reading what the one before it read (a variance's centered sums, a looped
        softmax's passes) then starts with the blocks read last, those a cache may still hold."""
        backwards = self.loops_opened % 2 == 1
        self.loops_opened += 1
        steps = f"tl.range(0, rnumel, RBLOCK, num_stages={LOOP_STAGES_PARAM})"
        top.emit(f"for {'rstep' if backwards else 'roffset'} in {steps}:")
        loop = Scope(top.lines, top.indent + "    ", parent=top, header=len(top.lines) - 1)
        if backwards:
            loop.emit("roffset = (rnumel - 1) // RBLOCK * RBLOCK - rstep")
        loop.emit(f"rindex = roffset + tl.arange(0, RBLOCK){self._axis_suffix('r')}")
        loop.emit("rmask = rindex < rnumel")
        return loop

    def _reduce_persistent(self, member: KernelMember, scope: Scope) -> None:
        node: Reduction = member.node
        value = self.writer.tensor(self.flat_body(member), scope)
        acc_dtype = red.accumulator_dtype(node.reduce_op, node.dtype, node.body.dtype)
        tile = self.writer.new_var("tile")
        self.accumulators += 1
        scope.emit(f"{tile} = tl.where(xmask & rmask, tl.broadcast_to({value}, {self.tile}).to({tl_dtype(acc_dtype)}), "
                   f"{red.identity(node.reduce_op, acc_dtype)})")
        result = self.writer.new_var("red")
        if node.reduce_op in ("argmax", "argmin"):
            index = f"tl.broadcast_to(rindex, {self.tile})"
            scope.emit(f"_, {result} = tl.reduce(({tile}, {index}), {self.r_axis}, _{node.reduce_op}_combine)")
            scope.emit(f"{result} = {result}{self._axis_suffix('x')}.to(tl.int64)")
        else:
            scope.emit(f"{result} = {red.final_reduce(node.reduce_op, tile, acc_dtype, self.r_axis)}")
            self._finish_bool(node, result, scope)
        self.registers[node.name] = result
        if member.stored:
            self._store(member, result, scope, "xmask")

    def _reduce_looped(self, group: list[KernelMember], top: Scope) -> None:
        accs = []
        for member in group:
            node: Reduction = member.node
            acc_dtype = red.accumulator_dtype(node.reduce_op, node.dtype, node.body.dtype)
            acc = self.writer.new_var("acc")
            top.emit(f"{acc} = tl.full({self.tile}, {red.identity(node.reduce_op, acc_dtype)}, {tl_dtype(acc_dtype)})")
            self.accumulators += 1
            if node.reduce_op in ("argmax", "argmin"):
                top.emit(f"{acc}_index = tl.full({self.tile}, 0, tl.int64)")
                self.accumulators += 1
            accs.append((member, acc, acc_dtype))
        loop = self._open_r_loop(top)
        for member, acc, acc_dtype in accs:
            node = member.node
            value = self.writer.tensor(self.flat_body(member), loop)
            masked = f"tl.where(xmask & rmask, tl.broadcast_to({value}, {self.tile}).to({tl_dtype(acc_dtype)}), {red.identity(node.reduce_op, acc_dtype)})"
            if node.reduce_op in ("argmax", "argmin"):
                loop.emit(f"{acc}, {acc}_index = _{node.reduce_op}_combine({acc}, {acc}_index, {masked}, "
                          f"tl.broadcast_to(rindex, {self.tile}).to(tl.int64))")
            else:
                loop.emit(f"{acc} = {red.combine(node.reduce_op, acc, masked, acc_dtype)}")
        for member, acc, acc_dtype in accs:
            node = member.node
            result = self.writer.new_var("red")
            if node.reduce_op in ("argmax", "argmin"):
                top.emit(f"_, {result} = tl.reduce(({acc}, {acc}_index), {self.r_axis}, _{node.reduce_op}_combine)")
                top.emit(f"{result} = {result}{self._axis_suffix('x')}")
            else:
                top.emit(f"{result} = {red.final_reduce(node.reduce_op, acc, acc_dtype, self.r_axis)}")
                self._finish_bool(node, result, top)
            self.registers[node.name] = result
            if member.stored:
                self._store(member, result, top, "xmask")

    def _finish_bool(self, node: Reduction, result: str, scope: Scope) -> None:
        if node.reduce_op in ("any", "all"):
            scope.emit(f"{result} = {result} != 0")
        elif compute_dtype(node.dtype) != node.body.dtype and node.dtype != torch.bool:
            scope.emit(f"{result} = {result}.to({tl_dtype(compute_dtype(node.dtype))})")

    def _store(self, member: KernelMember, value: str, scope: Scope, mask: str) -> None:
        node = member.node
        buffer = self.buffers[node.name]
        index = tuple(member.var_map.get(v, v) for v in node.vars)
        offset = simplify_index((buffer.flat_offset(index) - buffer.offset).xreplace(self.flat))
        target = tl_dtype(node.dtype) if node.dtype != torch.bool else "tl.int1"
        shape = {"xmask & rmask": self.tile, "ymask & xmask": "[YBLOCK, XBLOCK]"}.get(
            mask, self.row_shape if self.is_reduction else "[XBLOCK]")
        text = f"tl.broadcast_to({value}, {shape}).to({target})"
        # The pointer block must have the mask's shape even where the address is constant.
        used = {s.name for s in offset.free_symbols}
        pad = "" if "xindex" in used else " + 0 * xindex"
        if mask == "xmask & rmask" and "rindex" not in used:
            pad += " + 0 * rindex"
        if mask == "ymask & xmask" and "yindex" not in used:
            pad += " + 0 * yindex"
        scope.emit(f"tl.store({self._pointer(node.name)} + ({self.writer.index_text(offset)}){pad}, {text}, {mask})")

    def _finish(self, lines: list[str]) -> TritonKernel:
        pointer_args, scalar_args = list(self.pointers), list(self.scalars)
        sizes = sorted(self.writer.sizes_used - {YINDEX, ZINDEX}, key=lambda s: s.name)
        # A tiled kernel keeps the (unused) xnumel: every pointwise kernel launches alike.
        params = ([self.pointers[b] for b in pointer_args] + [self.scalars[b] for b in scalar_args]
                  + [s.name for s in sizes] + ["xnumel"])
        constexprs = ["XBLOCK: tl.constexpr"]
        if self.tile2d is not None:
            constexprs = ["YBLOCK: tl.constexpr", "XBLOCK: tl.constexpr"]
        if self.is_reduction:
            params.append("rnumel")
            constexprs.append("RBLOCK: tl.constexpr")
        if self.loops_opened:
            constexprs.append(f"{LOOP_STAGES_PARAM}: tl.constexpr")
        origins = ", ".join(self.kernel.origins)
        doc = [f'    """{self.kernel.kind} kernel: {origins}"""']
        body = "\n".join(doc + lines) + "\n"
        function = canonical_function_name(self.kernel.kind, f"{', '.join(params + constexprs)}\n{body}")
        source = f"@jit\ndef {function}({', '.join(params + constexprs)}):\n" + body
        return TritonKernel(self.kernel.name, source, pointer_args, sizes, product(self.kernel.x_ranges),
                            product(self.kernel.r_ranges), self.kernel.kind, self.persistent, self.kernel.origins,
                            scalar_args, self.kernel.device.type, function,
                            self.outer, self.tile2d.numels if self.tile2d is not None else None,
                            overwritable_inputs(self.kernel, self.buffers),
                            live_tiles=self.writer.tile_loads + self.accumulators if self.is_reduction else 0,
                            special_step=self._special_step(),
                            chunk_lanes=self.chunks.lanes if self.chunks is not None and self.chunks.chunked else 0)

    def _special_step(self) -> int:
        """TRANSCENDENTAL_STEP or SPECIAL_STEP where a looped reduction computes such a function
        of each element it reduces, in a step of SPECIAL_STEP_MIN_OPS ops or more; else PLAIN_STEP."""
        if not self.is_reduction or self.persistent:
            return PLAIN_STEP
        # op names and counts do not depend on the index: the member's body as it is, not re-indexed
        bodies = [m.body for m in self.kernel.members if m.role == "reduction"]
        names = {e.name for body in bodies for e in walk(body) if isinstance(e, Op)}
        if not names & SPECIAL_OPS or sum(count_ops(body) for body in bodies) < SPECIAL_STEP_MIN_OPS:
            return PLAIN_STEP
        return TRANSCENDENTAL_STEP if names & TRANSCENDENTAL_OPS else SPECIAL_STEP


def canonical_function_name(kind: str, signature_and_body: str) -> str:
    """``tf_poi_<digest>`` / ``tf_red_<digest>``: readable kind in profiles, the rest from the text."""
    digest = hashlib.sha256(signature_and_body.encode()).hexdigest()[:16]
    return f"tf_{kind[:3]}_{digest}"


def _needs_int64(kernel: FusedKernel, buffers: dict[str, Buffer], size_hint) -> bool:
    """int32 indexing is faster; use int64 when any buffer touched may exceed 2**31 elements."""
    exprs = [product(kernel.x_ranges) * product(kernel.r_ranges)]
    for member in kernel.members:
        exprs.append(buffers[member.node.name].numel)
        for load in (load for expr in member.exprs for load in loads(expr)):
            exprs.append(buffers[load.buffer].numel if load.buffer in buffers else 0)
    for expr in exprs:
        if size_symbols(sympy.sympify(expr)):
            return True  # dynamic sizes: be safe (see docs/decisions.md)
        if int(expr) > INT32_LIMIT:
            return True
    return False


def render_kernel(kernel: FusedKernel, buffers: dict[str, Buffer], size_hint=lambda e: 0) -> TritonKernel:
    return KernelRenderer(kernel, buffers, size_hint=size_hint).render()
