"""Logging inside the compiled function."""
import logging

import torch

import torchfuse

log = logging.getLogger("train")


def forward(x):
    h = torch.relu(x) + 1
    log.info("mean activation %s", h.mean())  # PITFALL: logging
    return h * 2


compiled = torchfuse.compile(forward)
for _ in range(2):
    compiled(torch.randn(4, 8))
