"""A LLaMA-style block trained with an .item() for logging and variable sequence lengths.

Run: python tests/pitfalls/llama_training.py [--target triton] [--steps N]
"""
import argparse

import torch
import torch.nn.functional as F

import torchfuse
from torchfuse.models import make_llama_block

parser = argparse.ArgumentParser()
parser.add_argument("--target", default="auto")
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

model, _ = make_llama_block("cpu", torch.float32, "small", seed=0)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses = []


def train_step(x, target):
    out = model(x)
    loss = F.mse_loss(out, target)
    losses.append(loss.item())  # PITFALL: item
    return loss


step = torchfuse.compile(train_step, options={"target": args.target})
lengths = [16, 12, 20, 8, 24, 16, 10, 14]
for i in range(args.steps):
    x = torch.randn(2, lengths[i % len(lengths)], 64)
    loss = step(x, torch.roll(x, 1, dims=1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"step losses: {', '.join(f'{v:.3f}' for v in losses)}")
