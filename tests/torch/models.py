"""Small models for the torch-layer tests (no downloads)."""

import torch
from torch import nn


class Block(nn.Module):
    """A residual block with an in-place ReLU right after a batch norm."""

    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x
        out = self.conv(x)
        out = self.bn(out)
        out = self.relu(out)
        out = out + identity
        return out


class TwoLayers(nn.Module):
    """Two linear layers: 'a' then 'b', for tests that need a model and nothing more."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class SmallNet(nn.Module):
    def __init__(self, channels=4, blocks=3, classes=5):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.blocks = nn.Sequential(*[Block(channels) for _ in range(blocks)])
        self.fc = nn.Linear(channels, classes)

    def forward(self, x):
        x = self.stem(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.blocks(x)
        x = x.mean((2, 3))
        x = self.fc(x)
        return x


class Gated(nn.Module):
    """Data-dependent control flow, assert and int(tensor): FX cannot trace it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        assert x.dim() == 2, "expects a batch of vectors"
        h = self.a(x)
        steps = int(h.abs().sum() > 1.0) + 1
        for _ in range(steps):
            h = torch.tanh(h)
        if h.mean() > 0:
            out = self.b(h)
        else:
            out = -self.b(h)
        return out


class Branchy(nn.Module):
    """A local assigned in a branch this instance never takes (``h@0``) and in one it does (``h@1``)."""

    def __init__(self):
        super().__init__()
        self.fast = False
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        if self.fast:
            h = x * 2
        else:
            h = self.lin(x)
        return h


def reference_smallnet(net, x, training=False):
    """Every intermediate of SmallNet.forward computed by hand, independently (``training``: the
    batch norms normalize by the batch's statistics, leaving the running ones as they are)."""
    values = {}
    with torch.no_grad():
        x = net.stem(x)
        values["stem"] = x.clone()
        x = torch.nn.functional.batch_norm(
            x,
            net.bn1.running_mean,
            net.bn1.running_var,
            net.bn1.weight,
            net.bn1.bias,
            training,
            0.0,
            net.bn1.eps,
        )
        values["bn1"] = x.clone()
        x = torch.relu(x)
        for i, block in enumerate(net.blocks):
            identity = x
            out = block.conv(x)
            out = torch.nn.functional.batch_norm(
                out,
                block.bn.running_mean,
                block.bn.running_var,
                block.bn.weight,
                block.bn.bias,
                training,
                0.0,
                block.bn.eps,
            )
            values[f"blocks.{i}.bn"] = out.clone()
            out = torch.relu(out) + identity
            values[f"blocks.{i}"] = out.clone()
            x = out
        values["pooled"] = x.mean((2, 3))
        values["fc"] = net.fc(values["pooled"])
    return values


class OnlyRaises(torch.nn.Module):
    """As JetMoe's JetMoeMoA: a ``forward`` that only raises; its model calls ``map`` instead."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def map(self, x):
        return self.lin(x)

    def forward(self, x):
        raise NotImplementedError("call map")


class CallsMap(torch.nn.Module):
    """A model around :class:`OnlyRaises`, at ``'moa'``."""

    def __init__(self):
        super().__init__()
        self.moa = OnlyRaises()

    def forward(self, x):
        return self.moa.map(x)
