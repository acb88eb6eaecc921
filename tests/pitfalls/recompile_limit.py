"""dynamic=False with a new length every step: recompiles until the limit sends it to eager."""
import torch

import torchfuse


def normalize(x):  # PITFALL: recompile_limit
    return (x - x.mean()) / (x.std() + 1e-5)


compiled = torchfuse.compile(normalize, dynamic=False)
for length in range(4, 16):
    compiled(torch.randn(length))
