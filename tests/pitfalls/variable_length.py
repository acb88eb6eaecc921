"""Variable-length batches: a new sequence length on a later step recompiles."""
import torch

import torchfuse


def block(x, w):  # PITFALL: variable_shapes
    h = x @ w
    return torch.nn.functional.gelu(h).softmax(-1)


w = torch.randn(8, 8)
compiled = torchfuse.compile(block)
for length in (64, 48, 80, 32):
    compiled(torch.randn(2, length, 8), w)
