"""fullgraph=True with .item() feeding a Python branch: compiling raises."""
import torch

import torchfuse


def clipped_step(w, g):
    step = g * 0.1
    if step.abs().max().item() > 1.0:  # PITFALL: item
        step = step.clamp(-1.0, 1.0)
    return w - step


compiled = torchfuse.compile(clipped_step, fullgraph=True)
compiled(torch.randn(16), torch.randn(16))
