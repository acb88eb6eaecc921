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
