"""Drawing a random number with NumPy inside the compiled function."""
import numpy as np
import torch

import torchfuse


def augment(x):
    y = x * 2
    noise = np.random.rand()  # PITFALL: numpy_call
    return y + noise


compiled = torchfuse.compile(augment)
for _ in range(2):
    compiled(torch.randn(8))
