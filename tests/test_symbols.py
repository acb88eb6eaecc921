"""Index algebra (ir/symbols.py): the folds that keep flat indices simple enough for Triton's
axis analysis to see contiguous runs, checked against integer arithmetic."""
from __future__ import annotations

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from torchfuse.ir.symbols import FloorDiv, ModIndex, simplify_index

X = sympy.Symbol("xindex", integer=True, nonnegative=True)
S = sympy.Symbol("s0", integer=True, positive=True)


def test_a_remainder_of_a_remainder_by_a_divisor_folds():
    assert ModIndex(ModIndex(X, 768), 64) == ModIndex(X, 64)
    assert ModIndex(ModIndex(X, 2 * S), S) == ModIndex(X, S)
    # 512 does not divide 768, and s0 does not divide 2 * s0 the other way round: kept
    assert ModIndex(ModIndex(X, 768), 512) != ModIndex(X, 512)
    assert ModIndex(ModIndex(X, S), 2 * S) != ModIndex(X, 2 * S)


def test_a_quotient_of_a_remainder_is_a_remainder_of_a_quotient():
    """Triton's axis analysis finds the runs of equal values in ``(x // 16) % 8`` and none in
    ``(x % 128) // 16``: a load at an index with the latter goes one element an instruction."""
    assert FloorDiv(ModIndex(X, 128), 16) == ModIndex(FloorDiv(X, 16), 8)
    assert FloorDiv(ModIndex(X, 4 * S), S) == ModIndex(FloorDiv(X, S), 4)
    assert FloorDiv(ModIndex(X, 100), 16) != ModIndex(FloorDiv(X, 16), sympy.Rational(100, 16))


def test_the_parts_of_a_remainder_fold_back_into_it():
    """A rotary embedding's head split of a row of q, k and v: (x % 768) // 64 * 64 + x % 64."""
    split = FloorDiv(ModIndex(X, 768), 64) * 64 + ModIndex(ModIndex(X, 768), 64)
    assert simplify_index(256 * FloorDiv(X, 768) + split + 32) == 256 * FloorDiv(X, 768) + ModIndex(X, 768) + 32
    assert simplify_index(FloorDiv(ModIndex(X, 4 * S), S) * S + ModIndex(X, S)) == ModIndex(X, 4 * S)
    # a coefficient that is not the divisor: not a split of the remainder
    assert simplify_index(FloorDiv(ModIndex(X, 768), 64) * 128 + ModIndex(X, 64)).has(FloorDiv)


@settings(max_examples=300, deadline=None)
@given(x=st.integers(0, 10**6), d=st.integers(1, 64), k=st.integers(1, 12), m=st.integers(1, 5))
def test_folds_agree_with_integer_arithmetic(x, d, k, m):
    modulus = k * d
    nested = ModIndex(ModIndex(X, modulus), d)
    split = simplify_index(m * d * FloorDiv(ModIndex(X, modulus), d) + m * ModIndex(X, d) + 3)
    assert int(nested.subs(X, x)) == (x % modulus) % d
    assert int(split.subs(X, x)) == m * d * ((x % modulus) // d) + m * (x % d) + 3


def test_a_branch_drops_only_the_clamps_its_conditions_make_idle():
    """codegen/triton/guards.py: under ``x0 < 5`` the clamp ``Min(x0 + 1, 9)`` does nothing (with
    slack), ``Min(x1, 9)`` may; the load keeps the latter and is masked by every fact."""
    import torch

    from torchfuse.codegen.triton.guards import unclamp
    from torchfuse.ir.expr import Const, IndexValue, Load, Op

    x0, x1 = sympy.symbols("x0 x1", integer=True, nonnegative=True)
    below = Op(torch.bool, "lt", (IndexValue(torch.int64, x0), Const(torch.int64, 5)))
    at_least = Op(torch.bool, "ge", (IndexValue(torch.int64, x1), Const(torch.int64, 2)))
    load = Load(torch.float32, "buf", (sympy.Min(x0 + 1, 9), sympy.Min(x1, 9), sympy.Max(x1 - 2, 0)))
    unclamped, guard = unclamp(load, ((below, True), (at_least, True)))
    assert unclamped.index == (x0 + 1, sympy.Min(x1, 9), x1 - 2)
    assert guard == Op(torch.bool, "logical_and", (below, at_least))
    # the false side of x0 < 5 says x0 >= 5: Max(x0 - 5, 0) is x0 - 5, Min(x0, 4) is 4, and
    # Min(x0, 9) is either
    clamped = (sympy.Max(x0 - 5, 0), sympy.Min(x0, 4), sympy.Min(x0, 9))
    unclamped, guard = unclamp(Load(torch.float32, "buf", clamped), ((below, False),))
    assert unclamped.index == (x0 - 5, 4, sympy.Min(x0, 9))
    assert guard == Op(torch.bool, "logical_not", (below,))
    assert unclamp(load, ())[1] is None
