"""A Python if on a tensor's shape, with inputs of several lengths."""
import torch

import torchfuse


def encode(x):
    if x.shape[1] > 24:  # PITFALL: shape_branch
        x = x[:, :24]
    return torch.tanh(x) * 2


compiled = torchfuse.compile(encode)
for length in (16, 20, 32, 40, 12):
    compiled(torch.randn(2, length))
