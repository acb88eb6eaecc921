"""Appending to a Python list passed into the compiled function."""
import torch

import torchfuse


def step(x, losses):
    y = torch.sin(x) * 2
    losses.append(y.mean())  # PITFALL: list_mutation
    return y


compiled = torchfuse.compile(step)
losses = []
for _ in range(4):
    compiled(torch.randn(8), losses)
