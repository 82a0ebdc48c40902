"""The small CNN of ``bcrecord demo``: ResNet-like, shipped in the package, no downloads.

:class:`TinyResNet` is a stem (conv, batch norm, in-place ReLU), two stages of
:class:`BasicBlock` and a linear classifier; its ``forward`` and the blocks'
``forward`` are written the way torchvision's ResNet is, locals reassigned step by
step, so every intermediate value is a numbered assignment (``x@1`` is the batch
norm's output, which the in-place ReLU then overwrites). :func:`example_images`
draws a batch of synthetic pictures (discs, stripes, squares) with their class
labels, so that feature maps show shapes.

Needs torch (``pip install 'bcrecord[torch]'``).

>>> import torch
>>> model = TinyResNet()
>>> images, labels = example_images(4)
>>> model(images).shape, labels.tolist()
(torch.Size([4, 3]), [0, 1, 2, 0])
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import nn

__all__ = ["BasicBlock", "TinyResNet", "example_images", "CLASSES"]

#: The classes :func:`example_images` draws.
CLASSES = ("disc", "stripes", "square")


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a shortcut, as in torchvision's ResNet.

    ``self.relu`` is in place: right after ``out = self.bn1(out)`` it overwrites that
    very tensor, so ``out@1`` is only the batch norm's output if it is copied when
    assigned (bcrecord's default).
    """

    def __init__(self, in_channels: int, channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample: Optional[nn.Module] = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample is not None:
            identity = self.downsample(x)
        out = out + identity
        out = self.relu(out)
        return out


class TinyResNet(nn.Module):
    """A ResNet-like CNN for 32x32 RGB images: 8 then 16 channels, 3 classes, 5,147 parameters."""

    def __init__(self, width: int = 8, classes: int = len(CLASSES)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(width, width))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, stride=2))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x


def example_images(batch: int = 8, size: int = 32, seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(images, labels)``: ``batch`` RGB pictures of :data:`CLASSES`, cycling through them.

    Shapes are placed, sized and coloured at random (seeded), on a dark noisy
    background; images are ``(batch, 3, size, size)`` floats, roughly zero-mean.

    >>> images, labels = example_images(3, size=16)
    >>> images.shape, labels.tolist()
    (torch.Size([3, 3, 16, 16]), [0, 1, 2])
    """
    generator = torch.Generator().manual_seed(seed)
    rows = torch.arange(size, dtype=torch.float32).view(-1, 1).expand(size, size)
    cols = torch.arange(size, dtype=torch.float32).view(1, -1).expand(size, size)
    images = torch.empty(batch, 3, size, size)
    labels = torch.arange(batch) % len(CLASSES)
    for i in range(batch):
        r = torch.rand(6, generator=generator)
        cy, cx = size * (0.3 + 0.4 * r[0]), size * (0.3 + 0.4 * r[1])
        radius = size * (0.18 + 0.12 * r[2])
        kind = int(labels[i])
        if kind == 0:
            mask = (rows - cy) ** 2 + (cols - cx) ** 2 <= radius**2
        elif kind == 1:
            period = 4 + int(4 * r[3])
            mask = ((rows + cols * r[4]) // (period / 2)) % 2 == 0
        else:
            mask = ((rows - cy).abs() <= radius) & ((cols - cx).abs() <= radius)
        colour = 0.5 + 0.5 * torch.rand(3, generator=generator)
        background = 0.1 * torch.randn(3, size, size, generator=generator)
        images[i] = background + mask.float() * colour.view(3, 1, 1)
    images = (images - 0.25) / 0.35
    return images, labels
