"""Collecting per-row scores with .tolist() inside the compiled function."""
import torch

import torchfuse


def score(x):
    logits = torch.tanh(x @ x.T)
    scores = logits.sum(-1).tolist()  # PITFALL: tolist
    return logits * 2, scores


compiled = torchfuse.compile(score)
for _ in range(2):
    compiled(torch.randn(6, 8))
