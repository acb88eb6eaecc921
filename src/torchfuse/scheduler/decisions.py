"""Every fusion the scheduler makes or refuses is recorded, with its reason, for the report."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FusionDecision:
    fused: bool
    reason: str
    node: str = ""  # the node that was (or was not) added
    kernel: str = ""  # the kernel it was considered for

    @staticmethod
    def yes(reason: str = "legal and worth it") -> "FusionDecision":
        return FusionDecision(True, reason)

    @staticmethod
    def no(reason: str) -> "FusionDecision":
        return FusionDecision(False, reason)

    def about(self, node: str, kernel: str) -> "FusionDecision":
        return FusionDecision(self.fused, self.reason, node, kernel)

    def __bool__(self) -> bool:
        return self.fused

    def __str__(self) -> str:
        verb = "fused into" if self.fused else "not fused into"
        return f"{self.node} {verb} {self.kernel}: {self.reason}"
