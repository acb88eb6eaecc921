"""Split reductions: two stages when one kernel would leave most of the GPU idle.

A reduction with few outputs over many elements (``loss.mean()`` over 8 M values, a bias
gradient ``grad.sum(0)`` with 2048 outputs over 4096 rows, channels-last batch-norm statistics)
gets one program per output, or per 32-128 outputs when it is outer: a handful of programs on
a 132-SM GPU, each streaming megabytes alone. Split, the first stage reduces ``S`` chunks of
each output's elements in parallel into a small partial buffer, and the second reduces the
``S`` partials of each output.

This is an IR rewrite for the Triton target, run before scheduling (docs/decisions.md says
why): a ``Reduction`` over ``R`` elements becomes

- ``P`` (``<name>_part``): the same reduction over ``chunk`` elements, with one more output
  axis ``s`` of size ``S``. For inner reductions element ``j`` of chunk ``s`` is element
  ``s * chunk + j`` of the original flat reduced range (row-major over its reduced dims): each
  program streams one contiguous run. Outer reductions interleave: element ``j`` of chunk ``s``
  is element ``j * S + s``, so for one ``j`` the rows ``(s, c)`` of a tile are ``S * C``
  consecutive elements in memory. With contiguous chunks a channels-last batch norm over 16
  channels read runs of 16 elements (32 bytes) a chunk apart, and the first stage got
  ``S * 16`` rows. ``argmax``/``argmin`` keep contiguous chunks: their ties go to the first
  chunk, which must hold the first elements. ``P`` sits first for outer reductions
  (``[S, *out]``, so the kept contiguous axis stays innermost for its store and the second
  stage's reads) and last for inner ones (``[*out, S]``).
- ``<name>``: the same op over the ``S`` partials (sum of sums, max of maxima, any of anys).

So the scheduler fuses producers into ``P`` and epilogues after ``<name>`` as for any
reduction, and every renderer runs both. ``argmax``/``argmin`` keep, per chunk, the extreme
value and its local index; the second stage takes the argmax of the values (the first chunk
wins ties and NaN, as the first element does in eager), then gathers that chunk's local index.
Variance needs no combine of partial (mean, M2, count): ours is two reductions (the mean, then
the squared deviations from it, ``lowering/rules/reductions.py``), each split on its own.
Sizes must be static; a symbolic reduction stays one kernel (correct, and outer-tiled).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import sympy
import torch

from torchfuse.codegen.triton.tiling import MIN_PROGRAMS, OUTER_MIN_XBLOCK, accesses_of, orientation_votes
from torchfuse.ir.expr import Const, Expr, IndexValue, Load, Op, Where, loads, substitute_index, transform
from torchfuse.ir.graph import Buffer, Graph, Pointwise, Reduction
from torchfuse.ir.symbols import FloorDiv, ModIndex, index_vars, product, simplify_index

INT64 = torch.int64


@dataclass(frozen=True)
class SplitPolicy:
    """When and how far to split (sizes in elements)."""

    min_elements: int = 1 << 18  # below this one launch costs more than the idle SMs
    min_programs: int = MIN_PROGRAMS  # an unsplit grid this small is split
    target_programs: int = 1024  # first-stage programs aimed at (~8 per SM)
    min_program_elements: int = 4096  # elements one first-stage program reduces, at least
    outer_lanes: int = 64  # rows one outer first-stage program covers (launch.OUTER_XBLOCK or less)


POLICY = SplitPolicy()  # tests replace it to split small reductions

# How far the vote follows pointwise producers to the buffers a fused kernel really reads, and
# how many distinct reads it keeps. A chain that reuses its values reaches the same (buffer,
# index) reads again and again: they are deduplicated, so the walk is linear in distinct reads.
LEAF_DEPTH = 24
LEAF_LIMIT = 64


@dataclass(frozen=True)
class Split:
    count: int  # S
    chunk: int
    outer: bool
    interleaved: bool = False  # element j of chunk s is j * S + s (else s * chunk + j)


def split_reductions(graph: Graph, device_types: set[str], policy: SplitPolicy | None = None) -> list[str]:
    """Split every reduction of ``graph`` on ``device_types`` that ``plan_split`` picks.

    Returns:
        One line per split, for the report.
    """
    policy = policy or POLICY
    producers = {n.name: n for n in graph.nodes if isinstance(n, Pointwise)}
    reductions = [n for n in graph.nodes if isinstance(n, Reduction) and n.device.type in device_types]
    reads = _Memo(lambda n: leaf_reads(n.body, producers))
    nodes, notes = [], []
    for node in graph.nodes:
        plan = plan_split(node, graph.buffers, policy, producers,
                          lambda node=node: _siblings(node, reductions, reads)) \
            if isinstance(node, Reduction) and node in reductions else None
        if plan is None:
            nodes.append(node)
            continue
        nodes.extend(_rewrite(node, plan, graph))
        notes.append(f"{node.name} ({node.reduce_op} of {_numel(node.reduction_ranges)} elements into "
                     f"{_numel(node.shape)}) split in two stages: {plan.count} chunks of {plan.chunk}"
                     f"{' (outer)' if plan.outer else ''}")
    graph.nodes = nodes
    return notes


def _numel(shape) -> int | None:
    total = product(shape)
    return int(total) if sympy.sympify(total).is_Integer else None


def leaf_reads(body: Expr, producers: dict[str, Pointwise]) -> tuple[list[Load], set[str]]:
    """The direct loads that ``body`` reaches through its pointwise producers, of buffers that
    are not producers, each at its index in ``body``'s variables: what a kernel fusing those
    producers reads from memory. Also every buffer passed on the way. A producer's own buffer
    has a nominal (row-major) layout, not the one its inputs are read in: loads still on a
    producer when the walk stops (LEAF_DEPTH, LEAF_LIMIT) are left out of the vote."""
    frontier = {(load.buffer, load.index): load for load in loads(body) if not load.is_indirect}
    leaves: dict[tuple, Load] = {}
    passed: set[str] = set()
    for _ in range(LEAF_DEPTH):
        deeper: dict[tuple, Load] = {}
        for (name, index), load in frontier.items():
            passed.add(name)
            producer = producers.get(name)
            if producer is None:
                leaves.setdefault((name, index), load)
                continue
            mapping = dict(zip(producer.vars, index))
            for inner in loads(producer.body):
                if not inner.is_indirect:
                    moved = tuple(simplify_index(sympy.sympify(e).xreplace(mapping)) for e in inner.index)
                    deeper.setdefault((inner.buffer, moved), Load(inner.dtype, inner.buffer, moved))
        if not deeper or len(leaves) + len(deeper) > LEAF_LIMIT:
            break
        frontier = deeper
    return list(leaves.values()), passed


class _Memo:
    """``function(node)``, computed once per node name (only for the nodes that get that far)."""

    def __init__(self, function: Callable[[Reduction], Any]) -> None:
        self.function, self.values = function, {}

    def __call__(self, node: Reduction) -> Any:
        if node.name not in self.values:
            self.values[node.name] = self.function(node)
        return self.values[node.name]


def _siblings(node: Reduction, reductions: list[Reduction], reads: _Memo) -> list[Load]:
    """The leaf reads (``leaf_reads``, in ``node``'s variables) of the other reductions over the
    same rows and reduced range that pass through a buffer ``node``'s reads pass through: the
    scheduler fuses them with ``node`` when their splits agree (a batch norm's backward:
    ``sum(dy)`` and ``sum(dy * (x - mean))``), so they vote on the orientation together and get
    the same split. ``reads(n)``: ``leaf_reads`` of ``n``'s body."""
    same_rows = [other for other in reductions if other is not node and other.shape == node.shape
                 and other.reduction_ranges == node.reduction_ranges]
    found = []
    for other in same_rows:
        if reads(node)[1] & reads(other)[1]:
            renames = dict(zip(other.vars, node.vars)) | dict(zip(other.reduction_vars, node.reduction_vars))
            found.extend(Load(load.dtype, load.buffer, tuple(simplify_index(sympy.sympify(e).xreplace(renames))
                                                             for e in load.index)) for load in reads(other)[0])
    return found


def plan_split(node: Reduction, buffers: dict[str, Buffer], policy: SplitPolicy,
               producers: dict[str, Pointwise] | None = None,
               siblings: Callable[[], list[Load]] = list) -> Split | None:
    """How to split ``node``, or None when one kernel already fills the GPU (or is small).

    The reads vote on the orientation as the renderer sees them once the scheduler fuses the
    pointwise ``producers`` (tiling.py): through them (``leaf_reads``), since a batch norm's
    ``x.float()`` is its own node here, and its buffer's layout is not x's. ``siblings()``
    (``_siblings``) vote with ``node``.
    """
    outputs, reduced = _numel(node.shape), _numel(node.reduction_ranges)
    if outputs is None or reduced is None or outputs * reduced < policy.min_elements:
        return None
    # Enough programs or too short to split, whichever way it is tiled: no need to vote (the
    # vote inlines producers and the siblings', a cost in graphs with hundreds of reductions).
    if -(-outputs // OUTER_MIN_XBLOCK) >= policy.min_programs or \
            reduced < 2 * max(2, policy.min_program_elements // policy.outer_lanes):
        return None
    x_vars = [v for v, s in zip(node.vars, node.shape) if s != 1]
    r_vars = [v for v, s in zip(node.reduction_vars, node.reduction_ranges) if s != 1]
    found = [*leaf_reads(node.body, producers or {})[0], *siblings()]
    inner_votes, outer_votes = orientation_votes(accesses_of(found, buffers, r_vars), x_vars, r_vars[-1]) \
        if r_vars else (0, 0)
    # A tie (a channels-last x and an NCHW gradient, equally large) splits outer: with chunks
    # interleaved, a tile's rows (s, c) are consecutive for x, and for one channel consecutive
    # chunks s are neighbouring elements of the NCHW read too, so both reads coalesce. Split
    # inner, the channels-last read stepped 16 elements between lanes.
    outer = outer_votes > 0 and outer_votes >= inner_votes
    lanes = policy.outer_lanes if outer else 1
    unsplit_programs = -(-outputs // (OUTER_MIN_XBLOCK if outer else 1))  # the most the launcher makes
    min_chunk = max(2, policy.min_program_elements // lanes)
    if unsplit_programs >= policy.min_programs or reduced < 2 * min_chunk:
        return None
    wanted = max(2, -(-policy.target_programs * lanes // outputs))
    chunk = _chunk_near(reduced, max(min_chunk, -(-reduced // wanted)))
    interleaved = outer and node.reduce_op not in ("argmax", "argmin")
    return Split(-(-reduced // chunk), chunk, outer, interleaved)


def _chunk_near(total: int, target: int) -> int:
    """The chunk length closest to ``target`` (within a factor 2, at most 4096 away) that divides
    ``total``, so no chunk is ragged (no clamped indices); else ``target``."""
    for delta in range(min(target // 2, 4096) + 1):
        for chunk in (target - delta, target + delta):
            if 0 < chunk <= total and total % chunk == 0:
                return chunk
    return target


def _rewrite(node: Reduction, plan: Split, graph: Graph) -> list:
    """The nodes replacing ``node``: the first stage(s), then what keeps ``node``'s name."""
    if node.reduce_op in ("argmax", "argmin"):
        return _rewrite_arg(node, plan, graph)
    part = _first_stage(node, plan, graph, node.reduce_op, node.dtype, "_part")
    return [part, _second_stage(node, plan, part, node.name, node.reduce_op, node.dtype)]


def _part_shape(node: Reduction, plan: Split) -> tuple:
    count = sympy.Integer(plan.count)
    return (count, *node.shape) if plan.outer else (*node.shape, count)


def _part_index(node_vars, chunk_var, plan: Split) -> tuple:
    """Index of a partial: the node's output index with the chunk's position added."""
    return (chunk_var, *node_vars) if plan.outer else (*node_vars, chunk_var)


def _first_stage(node: Reduction, plan: Split, graph: Graph, op: str, dtype: torch.dtype, suffix: str) -> Reduction:
    shape = _part_shape(node, plan)
    part_vars = index_vars(len(shape))
    chunk_var, out_vars = (part_vars[0], part_vars[1:]) if plan.outer else (part_vars[-1], part_vars[:-1])
    (j,) = index_vars(1, "r")
    flat = j * plan.count + chunk_var if plan.interleaved else chunk_var * plan.chunk + j
    total = _numel(node.reduction_ranges)
    ragged = plan.count * plan.chunk != total
    # A ragged last chunk reads a clamped (valid) element and drops it with the identity.
    reduced = _unflatten(sympy.Min(flat, total - 1) if ragged else flat, node.reduction_ranges)
    mapping = dict(zip(node.vars, out_vars)) | dict(zip(node.reduction_vars, reduced))
    body = substitute_index(node.body, mapping)
    if ragged:
        inside = Op(torch.bool, "lt", (IndexValue(INT64, flat), Const(INT64, total)))
        body = Where(body.dtype, inside, body, Const(body.dtype, _identity(op, body.dtype)))
    name = f"{node.name}{suffix}"
    graph.buffers[name] = Buffer.contiguous(name, shape, dtype, node.device)
    return Reduction(name, shape, dtype, node.device, body, op, (sympy.Integer(plan.chunk),),
                     (*shape, sympy.Integer(plan.chunk)), (len(shape),), node.origin)


def _second_stage(node: Reduction, plan: Split, part: Reduction, name: str, op: str, dtype: torch.dtype) -> Reduction:
    (s,) = index_vars(1, "r")
    body = Load(part.dtype, part.name, _part_index(node.vars, s, plan))
    reduced_axis = 0 if plan.outer else len(node.shape)
    # Every op here is its own combine: a sum of partial sums, a max of maxima, any of anys.
    return Reduction(name, node.shape, dtype, node.device, body, op, (sympy.Integer(plan.count),),
                     part.shape, (reduced_axis,), node.origin)


def _rewrite_arg(node: Reduction, plan: Split, graph: Graph) -> list:
    """argmax/argmin: per chunk the extreme value and its local index; then the first chunk
    holding the overall extreme, and its local index plus that chunk's start."""
    extreme = "max" if node.reduce_op == "argmax" else "min"
    values = _first_stage(node, plan, graph, extreme, node.body.dtype, "_part")
    local = _first_stage(node, plan, graph, node.reduce_op, INT64, "_part_index")
    chunk_name = f"{node.name}_chunk"
    graph.buffers[chunk_name] = Buffer.contiguous(chunk_name, node.shape, INT64, node.device)
    best = _second_stage(node, plan, values, chunk_name, node.reduce_op, INT64)
    which = Load(INT64, chunk_name, tuple(node.vars))
    inside = Load(INT64, local.name, _part_index(node.vars, which, plan))
    start = Op(INT64, "mul", (which, Const(INT64, plan.chunk)))
    result = Pointwise(node.name, node.shape, INT64, node.device, Op(INT64, "add", (start, inside)), node.origin)
    return [values, local, best, result]


def _unflatten(flat: sympy.Expr, ranges) -> list[sympy.Expr]:
    """Row-major indices over ``ranges`` of a flat position, nested as views nest them (so
    ``simplify_index`` folds ``d * (q // d) + q % d`` back into ``q`` in the loads)."""
    indices, rest = [], flat
    for size in reversed(ranges[1:]):
        indices.append(ModIndex(rest, size))
        rest = FloorDiv(rest, size)
    indices.append(rest)
    return list(reversed(indices))


def _identity(op: str, dtype: torch.dtype):
    """The value a padded element contributes: nothing."""
    if op in ("sum", "any"):
        return False if dtype == torch.bool else 0
    if op in ("prod", "all"):
        return True if dtype == torch.bool else 1
    largest = op in ("min", "argmin")
    if dtype == torch.bool:
        return largest
    if dtype.is_floating_point:
        return float("inf") if largest else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if largest else info.min
