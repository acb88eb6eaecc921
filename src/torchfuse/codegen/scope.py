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

    def lookup(self, key) -> Any:
        scope: Scope | None = self
        while scope is not None:
            if key in scope.cache:
                return scope.cache[key]
            scope = scope.parent
        return None

    def emit(self, line: str) -> None:
        self.lines.append(self.indent + line)

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
        result = self._emit(expr, scope)
        scope.cache[expr] = result
        return result

    def _emit(self, expr, scope: Scope):  # pragma: no cover - abstract
        raise NotImplementedError
