"""A training step that logs the loss with .item() inside the compiled region."""
import torch

import torchfuse

model = torch.nn.Linear(16, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
history = []


def train_step(x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    history.append(loss.item())  # PITFALL: item
    loss.backward()
    return loss


step = torchfuse.compile(train_step)
for _ in range(3):
    opt.zero_grad()
    step(torch.randn(8, 16), torch.randn(8, 4))
    opt.step()
print(f"last loss {history[-1]:.3f}")
