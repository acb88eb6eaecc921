"""Debug printing inside the compiled function."""
import torch

import torchfuse


def forward(x):
    h = torch.relu(x @ x.T)
    print("hidden ready")  # PITFALL: print
    return h.softmax(-1)


compiled = torchfuse.compile(forward)
for _ in range(2):
    compiled(torch.randn(4, 8))
