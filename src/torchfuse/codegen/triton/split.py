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
  stage's reads) and last for inner ones (``[*out, S]``), except where an inner reduction
  also has a large read along its outputs (``Split.row_read``): first, so that programs next
  in launch order share that read's sectors.
- ``<name>``: the same op over the ``S`` partials (sum of sums, max of maxima, any of anys).

So the scheduler fuses producers into ``P`` and epilogues after ``<name>`` as for any
reduction, and every renderer runs both. ``argmax``/``argmin`` keep, per chunk, the extreme
value and its local index; the second stage takes the argmax of the values (the first chunk
wins ties and NaN, as the first element does in eager), then gathers that chunk's local index.
A variance (``lowering/rules/reductions.py``: ``m = sum(x) / n``, then the sums of ``x - m``
and ``(x - m)^2``, tagged ``Reduction.centered``) splits as one: the first stage sums each
chunk, takes its mean ``m_s`` and sums the chunk again around ``m_s`` (one kernel, two loops
over the chunk, x read from memory once); the second combines the chunks exactly around the
global mean (Chan et al.: ``_rewrite_centered``). Split one by one, the centered sums' first
stage waited for the global mean and read x a second time.
Sizes must be static; a symbolic reduction stays one kernel (correct, and outer-tiled).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

import sympy
import torch

from torchfuse.codegen.triton.tiling import MIN_PROGRAMS, OUTER_MIN_XBLOCK, accesses_of, orientation_votes
from torchfuse.ir.expr import Cast, Const, Expr, IndexValue, Load, Op, Where, loads, substitute_index, transform
from torchfuse.ir.graph import Buffer, CenteredSum, Graph, Pointwise, Reduction
from torchfuse.ir.symbols import FloorDiv, ModIndex, index_vars, product, simplify_index

INT64 = torch.int64


@dataclass(frozen=True)
class SplitPolicy:
    """When and how far to split (sizes in elements)."""

    min_elements: int = 1 << 18  # below this one launch costs more than the idle SMs
    min_programs: int = MIN_PROGRAMS  # an unsplit grid this small is split
    target_programs: int = 1024  # first-stage programs aimed at (~8 per SM)
    # Chunks per output, at most: the second stage reads them in a loop of its own, one short
    # run of programs (a channels-last batch norm over 24 channels got 3136 chunks, and its
    # second stage took 117 us on the H200 in one program of 25 steps a pass).
    max_chunks: int = 512
    min_program_elements: int = 4096  # elements one first-stage program reduces, at least
    outer_lanes: int = 64  # rows one outer first-stage program covers (launch_configs.OUTER_XBLOCK or less)


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
    row_read: bool = False  # a large read walks an output row contiguously (inner splits: see plan_split)

    @property
    def chunks_first(self) -> bool:
        """Whether the partials are [S, *out] (else [*out, S])."""
        return self.outer or self.row_read


def split_reductions(graph: Graph, device_types: set[str], policy: SplitPolicy | None = None) -> list[str]:
    """Split every reduction of ``graph`` on ``device_types`` that ``plan_split`` picks.

    Returns:
        One line per split, for the report.
    """
    policy = policy or POLICY
    producers = {n.name: n for n in graph.nodes if isinstance(n, Pointwise)}
    reductions = [n for n in graph.nodes if isinstance(n, Reduction) and n.device.type in device_types]
    direct: dict[str, list[Load]] = {}  # each producer's direct loads, found once for every walk
    reads = _Memo(lambda n: leaf_reads(n.body, producers, direct))
    plans = {n.name: plan_split(n, graph.buffers, policy, producers, lambda n=n: _siblings(n, reductions, reads),
                                reads) for n in reductions}
    groups = _centered_groups(graph, plans)
    nodes, notes = [], []
    for node in graph.nodes:
        group = groups.get(node.name)
        if group is not None:
            nodes.extend(_rewrite_centered(node, group, graph))
            if node is group.total:
                notes.append(f"{group.total.name}, {group.deviations.name} and {group.squares.name} (a variance's "
                             f"sum and centered sums of {_numel(node.reduction_ranges)} elements into "
                             f"{_numel(node.shape)}) split together in two stages: {group.plan.count} chunks of "
                             f"{group.plan.chunk}{' (outer)' if group.plan.outer else ''}, each centered on its own mean")
            continue
        plan = plans.get(node.name)
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


def leaf_reads(body: Expr, producers: dict[str, Pointwise],
               direct: dict[str, list[Load]] | None = None) -> tuple[list[Load], set[str]]:
    """The direct loads that ``body`` reaches through its pointwise producers, of buffers that
    are not producers, each at its index in ``body``'s variables: what a kernel fusing those
    producers reads from memory. Also every buffer passed on the way. A producer's own buffer
    has a nominal (row-major) layout, not the one its inputs are read in: loads still on a
    producer when the walk stops (LEAF_DEPTH, LEAF_LIMIT) are left out of the vote. ``direct``
    keeps each producer's direct loads across calls (BERT's backward: 16,000 walks of bodies)."""
    direct = {} if direct is None else direct
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
            if name not in direct:
                direct[name] = [inner for inner in loads(producer.body) if not inner.is_indirect]
            for inner in direct[name]:
                moved = Load(inner.dtype, inner.buffer, _moved_index(inner.index, tuple(producer.vars), index))
                deeper.setdefault((moved.buffer, moved.index), moved)
        if not deeper or len(leaves) + len(deeper) > LEAF_LIMIT:
            break
        frontier = deeper
    return list(leaves.values()), passed


def _moved(load: Load, mapping: dict) -> Load:
    """``load`` (direct) with its index variables replaced by ``mapping``."""
    return Load(load.dtype, load.buffer, _substituted(load.index, mapping))


def _substituted(index: tuple, mapping: dict) -> tuple:
    return tuple(simplify_index(sympy.sympify(e).xreplace(mapping)) for e in index)


@functools.lru_cache(maxsize=1 << 16)
def _moved_index(index: tuple, variables: tuple, values: tuple) -> tuple:
    """``index`` with ``variables`` replaced by ``values``, simplified. Memoized: every reduction
    over the same rows walks the same producers (BERT's backward: 515 walks)."""
    return _substituted(index, dict(zip(variables, values)))


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
            renames = {a: b for a, b in (*zip(other.vars, node.vars), *zip(other.reduction_vars, node.reduction_vars))
                       if a != b}
            # Index variables are numbered by position, so over the same rows there is nothing to
            # rename (renaming GPT-2's 75 layer-norm sums into each other's was 1.5 s of compile).
            if renames:
                found.extend(_moved(load, renames) for load in reads(other)[0])
            else:
                found.extend(reads(other)[0])
    return found


def plan_split(node: Reduction, buffers: dict[str, Buffer], policy: SplitPolicy,
               producers: dict[str, Pointwise] | None = None,
               siblings: Callable[[], list[Load]] = list,
               reads: Callable[[Reduction], tuple[list[Load], set[str]]] | None = None) -> Split | None:
    """How to split ``node``, or None when one kernel already fills the GPU (or is small).

    The reads vote on the orientation as the renderer sees them once the scheduler fuses the
    pointwise ``producers`` (tiling.py): through them (``leaf_reads``), since a batch norm's
    ``x.float()`` is its own node here, and its buffer's layout is not x's. ``siblings()``
    (``_siblings``) vote with ``node``. ``reads(node)``: ``leaf_reads`` of its body, memoized by
    the caller (the siblings' votes walk the same bodies).
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
    own = reads(node) if reads is not None else leaf_reads(node.body, producers or {})
    found = [*own[0], *siblings()]
    inner_votes, outer_votes = orientation_votes(accesses_of(found, buffers, r_vars), x_vars, r_vars[-1]) \
        if r_vars else (0, 0)
    # A tie (a channels-last x and an NCHW gradient, equally large) splits outer: with chunks
    # interleaved, a tile's rows (s, c) are consecutive for x, and for one channel consecutive
    # chunks s are neighbouring elements of the NCHW read too, so both reads coalesce. Split
    # inner, the channels-last read stepped 16 elements between lanes.
    outer = outer_votes > 0 and outer_votes >= inner_votes
    # Whether the scheduler fuses a producer or stores it (read twice, or too long to recompute)
    # is decided later: stored, its buffer is read as it is laid out now. If those direct reads
    # vote outer, the renderer may tile outer, with one program per 32 outputs: size the split
    # (and the "enough programs" test) for that too (a BERT bias gradient read through a stored
    # producer was left unsplit, 768 outputs, and ran 24 programs).
    direct_outer = bool(r_vars) and orientation_votes(
        accesses_of([load for load in loads(node.body) if not load.is_indirect], buffers, r_vars),
        x_vars, r_vars[-1])[1] > 0
    may_tile_outer = outer or direct_outer
    lanes = policy.outer_lanes if may_tile_outer else 1
    unsplit_programs = -(-outputs // (OUTER_MIN_XBLOCK if may_tile_outer else 1))  # the fewest it may get
    min_chunk = max(2, policy.min_program_elements // lanes)
    if unsplit_programs >= policy.min_programs or reduced < 2 * min_chunk:
        return None
    wanted = min(policy.max_chunks, max(2, -(-policy.target_programs * lanes // outputs)))
    chunk = _chunk_near(reduced, max(min_chunk, -(-reduced // wanted)))
    interleaved = outer and node.reduce_op not in ("argmax", "argmin")
    # Inner, but a large read walks an output row (Swin's patch-embedding LayerNorm weight
    # gradient: the NCHW convolution output along r, the NHWC gradient along the channels):
    # with the partials [S, *out], programs next in launch order take the next channels of one
    # chunk and read the rest of the gradient's sectors while they are in L2. With [*out, S]
    # they took the next chunks of one channel, 2 bytes of each 32-byte sector, whose other
    # channels' programs ran 512 programs later (on the H200: 9% of copy bandwidth).
    return Split(-(-reduced // chunk), chunk, outer, interleaved, row_read=outer_votes > 0)


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
    return (count, *node.shape) if plan.chunks_first else (*node.shape, count)


def _part_index(node_vars, chunk_var, plan: Split) -> tuple:
    """Index of a partial: the node's output index with the chunk's position added."""
    return (chunk_var, *node_vars) if plan.chunks_first else (*node_vars, chunk_var)


def _first_stage(node: Reduction, plan: Split, graph: Graph, op: str, dtype: torch.dtype, suffix: str,
                 recenter: Callable[[Expr, sympy.Symbol], Expr] | None = None) -> Reduction:
    """``node``'s reduction over each chunk; ``recenter(body, chunk variable)`` rewrites the body
    (in the partial's variables) before a ragged chunk masks it."""
    shape = _part_shape(node, plan)
    part_vars = index_vars(len(shape))
    chunk_var, out_vars = (part_vars[0], part_vars[1:]) if plan.chunks_first else (part_vars[-1], part_vars[:-1])
    (j,) = index_vars(1, "r")
    flat = j * plan.count + chunk_var if plan.interleaved else chunk_var * plan.chunk + j
    total = _numel(node.reduction_ranges)
    ragged = plan.count * plan.chunk != total
    # A ragged last chunk reads a clamped (valid) element and drops it with the identity.
    reduced = _unflatten(sympy.Min(flat, total - 1) if ragged else flat, node.reduction_ranges)
    mapping = dict(zip(node.vars, out_vars)) | dict(zip(node.reduction_vars, reduced))
    body = substitute_index(node.body, mapping)
    if recenter is not None:
        body = recenter(body, chunk_var)
    if ragged:
        inside = Op(torch.bool, "lt", (IndexValue(INT64, flat), Const(INT64, total)))
        body = Where(body.dtype, inside, body, Const(body.dtype, _identity(op, body.dtype)))
    name = f"{node.name}{suffix}"
    graph.buffers[name] = Buffer.contiguous(name, shape, dtype, node.device)
    return Reduction(name, shape, dtype, node.device, body, op, (sympy.Integer(plan.chunk),),
                     (*shape, sympy.Integer(plan.chunk)), (len(shape),), node.origin)


def _second_stage(node: Reduction, plan: Split, part: Reduction | None, name: str, op: str, dtype: torch.dtype,
                  combine: Callable[[sympy.Symbol], Expr] | None = None) -> Reduction:
    """``op`` over the partials of each output: ``combine(s)``, the term of chunk ``s``, or else
    ``part``'s partial."""
    (s,) = index_vars(1, "r")
    # Every op here is its own combine: a sum of partial sums, a max of maxima, any of anys.
    body = combine(s) if combine is not None else Load(part.dtype, part.name, _part_index(node.vars, s, plan))
    reduced_axis = 0 if plan.chunks_first else len(node.shape)
    return Reduction(name, node.shape, dtype, node.device, body, op, (sympy.Integer(plan.count),),
                     _part_shape(node, plan), (reduced_axis,), node.origin)


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


@dataclass(frozen=True)
class _Centered:
    """A variance's reductions over the same rows (``CenteredSum``): ``total = sum(x)``, the
    pointwise ``mean = total / n``, ``deviations = sum(x - mean)``, ``squares = sum((x - mean)^2)``."""

    total: Reduction
    mean: Pointwise
    deviations: Reduction
    squares: Reduction
    plan: Split  # the total's, for all three


def _centered_groups(graph: Graph, plans: dict[str, Split | None]) -> dict[str, _Centered]:
    """The variances to split together, by the name of each of their three reductions.

    A tag whose nodes are not as ``CenteredSum`` says (a pass rewrote them, the total is not
    split) leaves its reductions to be split one by one: correct, only slower.
    """
    position = {node.name: k for k, node in enumerate(graph.nodes)}
    groups: dict[str, _Centered] = {}
    for squares in graph.nodes:
        tag = squares.centered if isinstance(squares, Reduction) else None
        if tag is None or tag.power != 2:
            continue
        members = [graph.nodes[position[name]] if name in position else None
                   for name in (tag.total, tag.mean, tag.deviations)]
        total, mean, deviations = members
        if not (isinstance(total, Reduction) and isinstance(mean, Pointwise) and isinstance(deviations, Reduction)
                and plans.get(total.name) is not None and deviations.name in plans and squares.name in plans):
            continue
        group = _Centered(total, mean, deviations, squares, plans[total.name])
        if _is_centered_group(group, position) and not any(m.name in groups for m in (total, deviations, squares)):
            groups.update({m.name: group for m in (total, deviations, squares)})
    return groups


def _is_centered_group(group: _Centered, position: dict[str, int]) -> bool:
    """The nodes are what the tags say, in an order that lets the first stages all sit where the
    total was: same rows and dtype, the centered sums read the mean and otherwise only what the
    total's position already sees."""
    total, mean, deviations, squares = group.total, group.mean, group.deviations, group.squares
    tag = squares.centered
    same = all(r.shape == total.shape and r.reduction_ranges == total.reduction_ranges and r.dtype == total.dtype
               and r.device == total.device and r.reduce_op == "sum" for r in (deviations, squares))
    if not (same and total.dtype.is_floating_point and mean.dtype == total.dtype and mean.shape == total.shape
            and total.centered is None and deviations.centered == CenteredSum(tag.mean, tag.total, 1)):
        return False
    if not position[total.name] < position[mean.name] < min(position[deviations.name], position[squares.name]):
        return False
    for sums in (deviations, squares):
        reads = {load.buffer for load in loads(sums.body)}
        if mean.name not in reads or any(position.get(b, -1) >= position[total.name] for b in reads - {mean.name}):
            return False
    return True


def _rewrite_centered(node: Reduction, group: _Centered, graph: Graph) -> list:
    """The nodes replacing one of ``group``'s reductions. In the total's place: every first stage
    (the chunk sums, the chunk means ``m_s``, the sums centered on them), then the total's second
    stage; in the centered sums' places, their exact combination (Chan et al.): with
    ``e_s = m_s - mean`` and ``n_s`` elements in chunk ``s``,
    ``sum(x - mean) = sum_s(c_s + n_s e_s)`` and
    ``sum((x - mean)^2) = sum_s(q_s + 2 e_s c_s + n_s e_s^2)``, identities for any ``m_s``."""
    plan, mean = group.plan, group.mean
    dtype = mean.dtype
    part_mean = f"{mean.name}_part"
    if node is group.total:
        total_part = _first_stage(node, plan, graph, "sum", node.dtype, "_part")
        mean_part = _chunk_means(group, total_part, graph)

        def recenter(body: Expr, chunk_var: sympy.Symbol) -> Expr:
            def rewrite(e: Expr) -> Expr | None:
                if isinstance(e, Load) and e.buffer == mean.name:
                    return Load(dtype, part_mean, _part_index(e.index, chunk_var, plan))
                return None
            return transform(body, rewrite)

        firsts = [_first_stage(sums, plan, graph, "sum", sums.dtype, "_part", recenter)
                  for sums in (group.deviations, group.squares)]
        return [total_part, mean_part, *firsts, _second_stage(node, plan, total_part, node.name, "sum", node.dtype)]

    def chunk(s: sympy.Symbol) -> tuple[Expr, Expr, Expr]:
        """Chunk ``s``'s count, its mean's offset from the overall mean and its ``c_s``."""
        index = _part_index(node.vars, s, plan)
        offset = Op(dtype, "sub", (Load(dtype, part_mean, index), Load(dtype, mean.name, tuple(node.vars))))
        return _chunk_count(plan, _numel(node.reduction_ranges), s, dtype), offset, \
            Load(dtype, f"{group.deviations.name}_part", index)

    def deviations(s: sympy.Symbol) -> Expr:
        count, offset, c = chunk(s)
        return Op(dtype, "add", (c, Op(dtype, "mul", (count, offset))))

    def squares(s: sympy.Symbol) -> Expr:
        count, offset, c = chunk(s)
        q = Load(dtype, f"{group.squares.name}_part", _part_index(node.vars, s, plan))
        cross = Op(dtype, "mul", (Op(dtype, "mul", (Const(dtype, 2.0), offset)), c))
        return Op(dtype, "add", (Op(dtype, "add", (q, cross)), Op(dtype, "mul", (count, Op(dtype, "mul", (offset, offset))))))

    combine = deviations if node is group.deviations else squares
    return [_second_stage(node, plan, None, node.name, "sum", node.dtype, combine)]


def _chunk_means(group: _Centered, total_part: Reduction, graph: Graph) -> Pointwise:
    """``m_s = (sum of chunk s) / n_s`` for every output and chunk, in the mean's dtype."""
    shape, dtype, plan = total_part.shape, group.mean.dtype, group.plan
    part_vars = index_vars(len(shape))
    chunk_var = part_vars[0] if plan.chunks_first else part_vars[-1]
    count = _chunk_count(plan, _numel(group.total.reduction_ranges), chunk_var, dtype)
    # div_rn: a rounded m_s, as the unsplit rough mean (lowering/rules/reductions.py says why)
    body = Op(dtype, "div_rn", (Load(total_part.dtype, total_part.name, part_vars), count))
    name = f"{group.mean.name}_part"
    graph.buffers[name] = Buffer.contiguous(name, shape, dtype, group.mean.device)
    return Pointwise(name, shape, dtype, group.mean.device, body, group.mean.origin)


def _chunk_count(plan: Split, total: int, s: sympy.Symbol, dtype: torch.dtype) -> Expr:
    """``n_s``: how many of the ``total`` elements chunk ``s`` holds (``_first_stage``'s order)."""
    if plan.count * plan.chunk == total:
        return Const(dtype, float(plan.chunk))
    if plan.interleaved:  # elements j * S + s < total
        count = FloorDiv(total - s + plan.count - 1, plan.count)
    else:  # elements s * chunk + j < total: the last chunk is short
        count = sympy.Min(plan.chunk, total - s * plan.chunk)
    return Cast(dtype, IndexValue(INT64, count))


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
