"""The loop shared by the FX rewrites that run before lowering (bias epilogues, channels-last
convolutions, matmul padding): rewrite each eligible node, then re-check and regenerate once."""
from __future__ import annotations

from typing import Any, Callable

import torch


def rewrite_eligible(gm: torch.fx.GraphModule, eligible: Callable[[torch.fx.Node], Any],
                     rewrite: Callable[[torch.fx.Graph, torch.fx.Node], None]) -> int:
    """Apply ``rewrite`` to every node ``eligible`` accepts (truthy), in place; returns how many."""
    rewritten = 0
    for node in list(gm.graph.nodes):
        if eligible(node):
            rewrite(gm.graph, node)
            rewritten += 1
    if rewritten:
        gm.graph.lint()
        gm.recompile()
    return rewritten
