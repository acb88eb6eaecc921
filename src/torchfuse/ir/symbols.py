"""Index arithmetic on sympy: loop variables, floor division, modulo and simplification.

Sizes and indices are sympy expressions so that one kernel serves many sizes: a dynamic
dimension is a symbol (``s0``) that becomes a kernel argument. We define our own
``FloorDiv`` and ``ModIndex`` instead of sympy's ``floor``/``Mod`` because every index in
a kernel is a non-negative integer, which lets us simplify far more aggressively (and
predictably) than sympy can for general integers.
"""
from __future__ import annotations

import functools

import sympy


class FloorDiv(sympy.Function):
    """``base // divisor`` for non-negative integer ``base`` and positive ``divisor``."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        if divisor == 1:
            return base
        if divisor == 0:  # only from an empty range (a 0 size), where no index is evaluated
            return sympy.Integer(0)
        if base == 0:
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) // int(divisor))
        if isinstance(base, FloorDiv):  # (a // b) // c == a // (b * c)
            return FloorDiv(base.args[0], base.args[1] * divisor)
        if isinstance(base, ModIndex) and (base.args[1] / divisor).is_integer:
            # (a % (k * d)) // d == (a // d) % k: Triton's axis analysis finds the runs of equal
            # values in the latter and none in the former (a load at such an index goes scalar).
            return ModIndex(FloorDiv(base.args[0], divisor), base.args[1] / divisor)
        # floor((k * d + r) / d) == k + floor(r / d) for any integer k.
        multiple, rest = _split_multiples(base, divisor)
        if multiple != 0 and _nonnegative(rest):  # the rest must stay a valid (>= 0) base
            return sympy.expand(multiple / divisor) + FloorDiv(rest, divisor)
        return None


class ModIndex(sympy.Function):
    """``base % divisor`` for non-negative integer ``base`` and positive ``divisor``."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        if divisor == 1 or divisor == 0 or base == 0:  # divisor 0: see FloorDiv
            return sympy.Integer(0)
        if base.is_Integer and divisor.is_Integer:
            return sympy.Integer(int(base) % int(divisor))
        if isinstance(base, ModIndex) and (base.args[1] / divisor).is_integer:
            # (b % (k * d)) % d == b % d. Also for Triton's sake: its axis analysis finds no
            # contiguity in a remainder of a remainder, and loads at such an index go scalar.
            return ModIndex(base.args[0], divisor)
        multiple, rest = _split_multiples(base, divisor)
        if multiple != 0 and _nonnegative(rest):  # (k * d + r) % d == r % d, for r >= 0 here
            return ModIndex(rest, divisor)
        return None


class PyFloorDiv(sympy.Function):
    """Python's ``a // b`` for an ``a`` that may be negative (size arithmetic such as
    ``(n - 3) // n``); ``b`` is positive. Printed sign-safe, since C and Triton truncate."""

    is_integer = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        return _python_eval(base, divisor, lambda a, b: a // b, FloorDiv)


class PyMod(sympy.Function):
    """Python's ``a % b`` (result in [0, b)) for an ``a`` that may be negative; ``b`` positive."""

    is_integer = True
    is_nonnegative = True

    @classmethod
    def eval(cls, base: sympy.Expr, divisor: sympy.Expr) -> sympy.Expr | None:
        return _python_eval(base, divisor, lambda a, b: a % b, ModIndex)


def _python_eval(base: sympy.Expr, divisor: sympy.Expr, compute, nonnegative_form) -> sympy.Expr | None:
    """Fold constants; on a provably non-negative base, the fast non-negative function."""
    if base.is_Integer and divisor.is_Integer and int(divisor) != 0:
        return sympy.Integer(compute(int(base), int(divisor)))
    if divisor == 1 or _nonnegative(base):
        return nonnegative_form(base, divisor)  # FloorDiv/ModIndex fold divisor 1 themselves
    return None


def _nonnegative(expr: sympy.Expr) -> bool:
    return expr == 0 or bool(sympy.sympify(expr).is_nonnegative)


def _split_multiples(base: sympy.Expr, divisor: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
    """Split ``base`` into (terms that are integer multiples of divisor, the rest)."""
    multiple, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(base)):
        quotient = sympy.cancel(term / divisor)
        if _is_integer_polynomial(quotient):
            multiple += term
        else:
            rest += term
    return multiple, rest


def _is_integer_polynomial(expr: sympy.Expr) -> bool:
    """True when ``expr`` is a product of integers and integer-valued symbols/functions."""
    if expr.is_Integer:
        return True
    numer, denom = sympy.fraction(sympy.together(expr))
    if denom != 1:
        return False
    coeff, _ = numer.as_coeff_Mul()
    return coeff.is_Integer


@functools.lru_cache(maxsize=None)
def index_var(prefix: str, position: int) -> sympy.Symbol:
    """The loop variable ``{prefix}{position}``: ``i`` for output dims, ``r`` for reduced dims."""
    return sympy.Symbol(f"{prefix}{position}", integer=True, nonnegative=True)


def index_vars(rank: int, prefix: str = "i") -> tuple[sympy.Symbol, ...]:
    return tuple(index_var(prefix, k) for k in range(rank))


def is_loop_var(symbol: sympy.Basic) -> bool:
    """Loop variables are named i*, r* or x* (kernel vars); sizes are s*/u* from Dynamo."""
    return isinstance(symbol, sympy.Symbol) and symbol.name[:1] in ("i", "r", "x")


def size_symbols(expr: sympy.Expr) -> set[sympy.Symbol]:
    """Free symbols of ``expr`` that are sizes, not loop variables."""
    return {s for s in sympy.sympify(expr).free_symbols if not is_loop_var(s)}


# torch's sympy functions (torch.utils._sympy.functions) whose value is a float: a SymFloat of
# sizes, e.g. a batch norm's ``1.0 / (N * H * W)`` in its decomposed backward.
FLOAT_SIZE_FUNCTIONS = frozenset({"FloatTrueDiv", "IntTrueDiv", "ToFloat"})


def is_float_size(expr: sympy.Expr) -> bool:
    """Whether ``expr``, arithmetic on sizes, is float-valued (it holds a float number or one of
    ``FLOAT_SIZE_FUNCTIONS``), not an integer index."""
    expr = sympy.sympify(expr)
    return bool(expr.atoms(sympy.Float)) or any(type(f).__name__ in FLOAT_SIZE_FUNCTIONS
                                                for f in expr.atoms(sympy.Function))


def product(values) -> sympy.Expr:
    result = sympy.Integer(1)
    for value in values:
        result = result * value
    return result


def contiguous_strides(shape) -> tuple[sympy.Expr, ...]:
    strides = []
    running = sympy.Integer(1)
    for size in reversed(tuple(shape)):
        strides.append(running)
        running = running * size
    return tuple(reversed(strides))


def simplify_index(expr: sympy.Expr) -> sympy.Expr:
    """Expand and fold ``d * (x // d) + x % d`` back into ``x`` (views that merge dims make it),
    and ``d * ((x // d) % k) + x % d`` into ``x % (k * d)``."""
    return _simplify_index(sympy.sympify(expr))


# Index expressions repeat across a model's identical layers (and a kernel's members): each
# distinct one is expanded and folded once. sympy expressions are immutable and hashable.
@functools.lru_cache(maxsize=1 << 16)
def _simplify_index(expr: sympy.Expr) -> sympy.Expr:
    expr = sympy.expand(expr)
    for _ in range(8):  # each pass folds one level of nesting
        folded = _fold_div_mod(expr)
        if folded == expr:
            return expr
        expr = sympy.expand(folded)
    return expr


def _fold_div_mod(expr: sympy.Expr) -> sympy.Expr:
    terms = list(sympy.Add.make_args(expr))
    for mod_term in terms:
        coeff, mod = _coeff_of_function(mod_term, ModIndex)
        if mod is None:
            continue
        base, divisor = mod.args
        wanted_coeff, wanted_div = coeff * divisor, FloorDiv(base, divisor)
        for div_term in terms:
            div_coeff, div = _coeff_of_function(div_term, FloorDiv)
            if div is None or sympy.simplify(div_coeff - wanted_coeff) != 0:
                continue
            remaining = [t for t in terms if t is not mod_term and t is not div_term]
            if div == wanted_div:
                return sympy.Add(*remaining) + coeff * base
        for split_term in terms:  # d * ((x // d) % k) + x % d == x % (k * d)
            split_coeff, split = _coeff_of_function(split_term, ModIndex)
            if (split is not None and split is not mod and split.args[0] == wanted_div
                    and sympy.simplify(split_coeff - wanted_coeff) == 0):
                remaining = [t for t in terms if t is not mod_term and t is not split_term]
                return sympy.Add(*remaining) + coeff * ModIndex(base, divisor * split.args[1])
    return expr


def _coeff_of_function(term: sympy.Expr, function: type) -> tuple[sympy.Expr, sympy.Expr | None]:
    """Write ``term`` as ``coeff * function(...)``; (term, None) when it is not of that form."""
    factors = sympy.Mul.make_args(term)
    calls = [f for f in factors if isinstance(f, function)]
    if len(calls) != 1:
        return term, None
    coeff = sympy.Mul(*[f for f in factors if f is not calls[0]])
    return coeff, calls[0]


def linear_coefficients(expr: sympy.Expr, variables) -> tuple[list[sympy.Expr], sympy.Expr] | None:
    """Coefficients of ``expr`` in ``variables`` and the constant term, or None if not affine."""
    found = _linear_coefficients(sympy.sympify(expr), tuple(variables))
    return None if found is None else (list(found[0]), found[1])


@functools.lru_cache(maxsize=1 << 16)
def _linear_coefficients(expr: sympy.Expr, variables: tuple) -> tuple[tuple, sympy.Expr] | None:
    expr = sympy.expand(expr)
    coeffs = []
    for var in variables:
        coeff = expr.coeff(var, 1)
        if coeff.has(*variables):
            return None
        coeffs.append(coeff)
    constant = sympy.expand(expr - sum(c * v for c, v in zip(coeffs, variables)))
    if constant.has(*variables):
        return None
    return tuple(coeffs), constant
