"""A Python if on a tensor's value (clip the update only when it is large)."""
import torch

import torchfuse


def update(w, g):
    step = g * 0.1
    if step.norm() > 1.0:  # PITFALL: data_dependent_branch
        step = step / step.norm()
    return w - step


compiled = torchfuse.compile(update)
for _ in range(2):
    compiled(torch.randn(16), torch.randn(16))
