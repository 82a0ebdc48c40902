"""A plain PyTorch training script that knows nothing of bcrecord.

``cli_run.py`` runs it under ``bcrecord run`` to record inside it, unmodified::

    bcrecord run --record '__main__:TinyNet.forward:hidden' --save-dir out --every 2 \\
        docs/examples/train_plain.py --steps 6

On its own: ``python docs/examples/train_plain.py --steps 6``.
"""

from __future__ import annotations

import argparse

import torch


class TinyNet(torch.nn.Module):
    """Two linear layers with a ReLU between them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 16)
        self.fc2 = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.fc1(x)
        hidden = torch.relu(hidden)
        return self.fc2(hidden)


def main(steps: int) -> float:
    """Fit y = sum(x) on fixed random data for ``steps`` steps; returns the last loss."""
    torch.manual_seed(0)
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)
    model = TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.zeros(())
    for step in range(steps):
        batch = slice(8 * (step % 4), 8 * (step % 4) + 8)
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.4f}")
    return float(loss.detach())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="train a tiny net on random data")
    parser.add_argument("--steps", type=int, default=6)
    main(parser.parse_args().steps)
