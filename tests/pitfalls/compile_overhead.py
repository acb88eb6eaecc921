"""A tiny function compiled and called twice: compiling costs more than it can save."""
import torch

import torchfuse


def scale(x):  # PITFALL: compile_overhead
    return x * 2 + 1


compiled = torchfuse.compile(scale)
for _ in range(2):
    compiled(torch.randn(4))
