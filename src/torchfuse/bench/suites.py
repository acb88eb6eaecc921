"""The cases ``torchfuse bench`` knows: the micro patterns and the models, selected by suite,
device and name. Apart from ``cases.py`` so that the model modules can build on it."""
from __future__ import annotations

import torch

from torchfuse.bench import models, patterns
from torchfuse.bench.cases import Case, pattern_case


def all_cases() -> list[Case]:
    return [pattern_case(p) for p in patterns.PATTERNS] + models.CASES


def select(suite: str, device: torch.device, names: set[str] | None = None) -> list[Case]:
    """Cases of ``suite`` ("micro", "models" or "all") that run on ``device``, optionally by name."""
    chosen = [c for c in all_cases() if (suite == "all" or c.suite == suite) and device.type in c.devices]
    if names:
        known = {c.name for c in all_cases()}
        unknown = names - known
        if unknown:
            raise ValueError(f"unknown case(s) {sorted(unknown)}; cases: {', '.join(sorted(known))}")
        chosen = [c for c in chosen if c.name in names]
    return chosen
