"""A block of generated lines with its common-subexpression cache, shared by all renderers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Scope:
    """Generated lines plus the CSE cache; a loop body is a child scope of its parent, so it
    sees values computed outside the loop but its own values do not leak out."""

    lines: list[str]
    indent: str
    parent: "Scope | None" = None
    cache: dict = field(default_factory=dict)
    # The index in ``lines`` of the line opening this block (a loop's ``for``): values that do not
    # change in the block are computed before that line (``CseWriter.value``). None: never.
    header: int | None = None
    _insert_at: int | None = None  # while hoisting into this scope: where its lines go
    _moved: tuple["Scope", ...] = ()  # ... and the open blocks that move down a line each time

    def lookup(self, key) -> Any:
        scope: Scope | None = self
        while scope is not None:
            if key in scope.cache:
                return scope.cache[key]
            scope = scope.parent
        return None

    def owner(self, key) -> "Scope | None":
        """The scope (this one or an enclosing one) whose cache holds ``key``."""
        scope: Scope | None = self
        while scope is not None and key not in scope.cache:
            scope = scope.parent
        return scope

    def emit(self, line: str) -> None:
        if self._insert_at is None:
            self.lines.append(self.indent + line)
            return
        self.lines.insert(self._insert_at, self.indent + line)
        self._insert_at += 1
        for block in self._moved:
            block.header += 1  # type: ignore[operator]

    def child(self) -> "Scope":
        """A nested block (a loop body) one indent deeper."""
        return Scope(self.lines, self.indent + "    ", parent=self)


class CseWriter:
    """What every renderer's expression writer shares: fresh names, the memoised ``value``
    (one generated statement per distinct sub-expression in a scope) and the size symbols the
    kernel text mentions (they become kernel arguments). Subclasses implement ``_emit``."""

    def __init__(self) -> None:
        self.counter = 0
        self.sizes_used: set = set()

    def new_var(self, prefix: str = "tmp") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def value(self, expr, scope: Scope):
        cached = scope.lookup(expr)
        if cached is not None:
            return cached
        home = self._home(expr, scope)
        if home is scope:
            result = self._emit(expr, scope)
        else:
            result = self._emit_hoisted(expr, scope, home)
        home.cache[expr] = result
        return result

    def _home(self, expr, scope: Scope) -> Scope:
        """Where to compute ``expr``: ``scope``, or, for arithmetic whose operands were all
        computed outside the loop ``scope`` is in, the innermost scope holding them (loop-invariant
        code motion: a row's mean divided once per row, not at every step of the loop over the
        row; Triton did not hoist a ``div_rn`` itself, and such reductions ran up to 2x slower)."""
        if scope.header is None:
            return scope
        chain, block = [], scope
        while block is not None:
            chain.append(block)
            block = block.parent
        if self.invariant_leaf(expr):  # the first scope without a header: outside every loop
            outermost = next((i for i, block in enumerate(chain) if block.header is None), len(chain) - 1)
            return chain[outermost]
        if not self.hoistable(expr):
            return scope
        children = expr.children()
        for child in children:
            self.value(child, scope)
        owners = [scope.owner(child) for child in children if self.is_computed(scope.lookup(child))]
        if not owners:
            return scope
        home = min(owners, key=chain.index)  # the innermost scope holding an operand
        # Every block left on the way out must have a header to put the line before.
        return home if all(block.header is not None for block in chain[:chain.index(home)]) else scope

    def _emit_hoisted(self, expr, scope: Scope, home: Scope):
        """``expr`` emitted into ``home`` just before the block (below it, around ``scope``) opens."""
        moved, block = [], scope
        while block.parent is not home:
            moved.append(block)
            block = block.parent
        moved.append(block)
        home._insert_at, home._moved = block.header, tuple(moved)
        try:
            return self._emit(expr, home)
        finally:
            home._insert_at, home._moved = None, ()

    def invariant_leaf(self, expr) -> bool:  # pragma: no cover - renderers that hoist override it
        """Whether ``expr`` is a value computed before any loop (a reduction's register)."""
        return False

    def hoistable(self, expr) -> bool:  # pragma: no cover - renderers that hoist override it
        """Whether ``expr`` is pure arithmetic on its operands (no load, no index)."""
        return False

    def is_computed(self, value) -> bool:  # pragma: no cover - renderers that hoist override it
        """Whether ``value`` names a computed statement (not a literal or a size argument)."""
        return False

    def _emit(self, expr, scope: Scope):  # pragma: no cover - abstract
        raise NotImplementedError
