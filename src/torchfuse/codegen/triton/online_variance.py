"""One pass, not two, over a looped row for a variance's sum and centered sums.

The lowering computes a variance in two passes (``lowering/rules/reductions.py``): the sum ``t``,
the rounded mean ``m = t / n``, then ``c = sum(x - m)`` and ``s = sum((x - m)^2)`` over the same
rows, tagged ``Reduction.centered``. The centered sums read the mean, so a looped kernel gives
them a loop of their own and reads each row twice. When the row is larger than the cache can
hold until the second loop (a batch norm's chunk of 400 KB in each of hundreds of programs at
once), both loops read from memory: MobileNetV3's channels-last batch-norm statistics over
[128, 64, 112, 112] moved 411 MB for 205 MB of input (212 us on the H100, 32% of copy).

Here one loop computes the sum and, for every lane of the tile, Welford's running mean ``M``
and sum of squared deviations ``Q`` over the elements that lane sees (a lane sees one element
a step; in a forward loop every lane still inside the row has seen ``k + 1`` after step ``k``):

    d = x - M;  M += d / (k + 1);  Q += d * (x - M)

After the loop ``t`` is reduced as before (the same sum, in the same order), ``m`` computed
from it as the kernel always did, and each lane's ``n_l`` elements centered on ``m`` by Chan's
identities, exact for any ``m``: with ``e_l = M_l - m``,

    c = sum_l n_l e_l,     s = sum_l (Q_l + n_l e_l^2)

A row of equal values keeps an exact mean and a variance of exactly 0: every ``M_l`` is that
value and every ``Q_l`` 0, ``e_l`` is the same small difference in every lane (few bits, so
``n_l e_l`` and ``n_l e_l^2`` are exact), and ``s - c^2 / n`` cancels as the lowering intends.
Infinities and NaN reach ``c`` and ``s`` as in the two-pass form (``x - m`` is NaN in both).

The renderer is ``kernel.KernelRenderer``; these functions take it as a parameter (as
``online_softmax.py``'s do).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torchfuse.codegen.scope import Scope
from torchfuse.codegen.triton import reductions as red
from torchfuse.codegen.triton.printer import tl_dtype
from torchfuse.ir.expr import Expr, Op
from torchfuse.ir.graph import CenteredSum, Reduction
from torchfuse.scheduler.kernel import KernelMember


# False renders the two loops (an A/B switch for scripts/ab_policy.py; tests compare both).
ENABLED = True


@dataclass(frozen=True)
class OnlineVariance:
    """A variance's ``total`` and its two centered sums, one loop."""

    total: KernelMember
    deviations: KernelMember
    squares: KernelMember
    mean: Expr  # m, as the deviations' body computes it from the total (x - m)


def merge_variances(groups: list, body: Callable[[KernelMember], Expr]) -> list:
    """``groups`` (the looped kernel's loops, in order; lists of members, or merged groups) with
    each ``[total], [deviations, squares]`` pair of consecutive loops made one ``OnlineVariance``."""
    if not ENABLED:
        return groups
    merged: list = []
    for group in groups:
        previous = merged[-1] if merged else None
        found = (_variance(previous, group, body)
                 if isinstance(previous, list) and isinstance(group, list) else None)
        if found is not None:
            merged[-1] = found
        else:
            merged.append(group)
    return merged


def _variance(first: list[KernelMember], second: list[KernelMember],
              body: Callable[[KernelMember], Expr]) -> OnlineVariance | None:
    if len(first) != 1 or len(second) != 2:
        return None
    (total,) = first
    squares = next((m for m in second if _tag(m) is not None and _tag(m).power == 2), None)
    deviations = next((m for m in second if m is not squares), None)
    if squares is None or deviations is None:
        return None
    tag = _tag(squares)
    nodes = (total.node, deviations.node, squares.node)
    if not (tag.total == total.node.name and tag.deviations == deviations.node.name
            and _tag(deviations) == CenteredSum(tag.mean, tag.total, 1) and total.node.centered is None):
        return None
    # The deviations' body is x - m with x what the total sums (the lowering's form, the mean
    # inlined): m is then rendered after the loop, from the total's register.
    difference = body(deviations)
    if not (isinstance(difference, Op) and difference.name == "sub" and difference.args[0] == body(total)):
        return None
    same_rows = all(n.reduce_op == "sum" and n.dtype == total.node.dtype and n.dtype.is_floating_point
                    and n.reduction_ranges == total.node.reduction_ranges and n.shape == total.node.shape
                    for n in nodes)
    return OnlineVariance(total, deviations, squares, difference.args[1]) if same_rows else None


def _tag(member: KernelMember) -> CenteredSum | None:
    node = member.node
    return node.centered if isinstance(node, Reduction) else None


def emit_variance(renderer: Any, group: OnlineVariance, top: Scope) -> None:
    """One forward loop computing the three sums of ``group``; their row values become registers
    (and are stored where the kernel stores them), as ``_reduce_looped`` leaves them."""
    node = group.total.node
    acc_dtype = red.accumulator_dtype("sum", node.dtype, node.body.dtype)
    dtype = tl_dtype(acc_dtype)
    write = renderer.writer
    total, means, squares = write.new_var("acc"), write.new_var("accmean"), write.new_var("accsq")
    for acc in (total, means, squares):
        top.emit(f"{acc} = tl.full({renderer.tile}, 0, {dtype})")
    renderer.accumulators += 3
    loop = renderer._open_r_loop(top, forwards=True)
    value = write.tensor(renderer.flat_body(group.total), loop)
    element, delta, inverse = write.new_var("elem"), write.new_var("delta"), write.new_var("inv")
    loop.emit(f"{element} = tl.where(xmask & rmask, tl.broadcast_to({value}, {renderer.tile}).to({dtype}), 0)")
    loop.emit(f"{total} = {total} + {element}")
    # Step k of a forward loop: every lane still inside the row has now seen k + 1 elements.
    # Correctly rounded (div_rn), so the first step's 1 / 1 is exactly 1: a row of equal values
    # then gives every lane exactly that value as its mean, and 0 deviations afterwards.
    loop.emit(f"{inverse} = tl.div_rn(tl.full([1, 1], 1.0, tl.float32), "
              f"tl.full([1, 1], 1.0, tl.float32) * (roffset // RBLOCK + 1))")
    loop.emit(f"{delta} = {element} - {means}")
    loop.emit(f"{means} = {means} + tl.where(xmask & rmask, {delta} * {inverse}, 0)")
    loop.emit(f"{squares} = {squares} + tl.where(xmask & rmask, {delta} * ({element} - {means}), 0)")
    axis = renderer.r_axis
    row_total = write.new_var("red")
    top.emit(f"{row_total} = {red.final_reduce('sum', total, acc_dtype, axis)}")
    _finish(renderer, group.total, row_total, top)
    # The mean, as the kernel computes it from the row's total (a register now).
    mean = write.tensor(group.mean, top)
    seen, offset = write.new_var("seen"), write.new_var("offset")
    # Elements lane p of the row's blocks saw: one a step while roffset + p < rnumel.
    top.emit(f"{seen} = ((rnumel - tl.arange(0, RBLOCK){renderer._axis_suffix('r')} + RBLOCK - 1) // RBLOCK)"
             f".to({dtype})")
    top.emit(f"{offset} = {means} - {mean}")
    # Lanes that saw nothing add 0 (not 0 * inf when the mean is far from 0).
    row_deviations, row_squares = write.new_var("red"), write.new_var("red")
    top.emit(f"{row_deviations} = "
             f"{red.final_reduce('sum', f'tl.where({seen} > 0, {seen} * {offset}, 0)', acc_dtype, axis)}")
    top.emit(f"{row_squares} = "
             f"{red.final_reduce('sum', f'tl.where({seen} > 0, {squares} + {seen} * {offset} * {offset}, 0)', acc_dtype, axis)}")
    _finish(renderer, group.deviations, row_deviations, top)
    _finish(renderer, group.squares, row_squares, top)


def _finish(renderer: Any, member: KernelMember, result: str, top: Scope) -> None:
    renderer._finish_bool(member.node, result, top)
    renderer.registers[member.node.name] = result
    if member.stored:
        renderer._store(member, result, top, "xmask")
