"""Timing inside the compiled function with a builtin Dynamo cannot trace."""
import time

import torch

import torchfuse


def forward(x):
    h = torch.relu(x) * 3
    started = time.perf_counter()  # PITFALL: unsupported_call
    return h + 1, started


compiled = torchfuse.compile(forward)
for _ in range(2):
    compiled(torch.randn(8))
