"""Whether an FX graph returns a node's result, possibly through views of it.

Rewrites that make two results share memory (one cast viewed twice, one matmul split in
parts) must leave returned results alone: eager gives each its own memory and version counter.
"""
from __future__ import annotations

from typing import Callable

import torch.fx


def returned(node: torch.fx.Node, aliases: Callable[[torch.fx.Node, torch.fx.Node], bool]) -> bool:
    """Whether the graph's output reads ``node``, directly or through users for which
    ``aliases(user, source)`` says the user's result may share ``source``'s memory."""
    pending, seen = [node], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for user in current.users:
            if user.op == "output":
                return True
            if aliases(user, current):
                pending.append(user)
    return False
