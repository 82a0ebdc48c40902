"""torchvision: its objects holding tensors, copied around their tensors' copies.

The core loads this module by name the first time a recording copies an object of
torchvision (see :func:`bcrecord.runtime.load_plugin`). A detection model's ``ImageList`` (the padded
batch and each image's size, ``transform:forward:image_list@0``) is recorded as a new
``ImageList`` whose ``tensors`` is copied as any recorded tensor is (a detached
clone by default; moved, cast or reduced by ``to``, ``dtype`` and ``reduce``), not the
model's own object with its live tensor.

>>> import torch
>>> from torchvision.models.detection.image_list import ImageList
>>> from bcrecord.runtime import copy_value
>>> live = ImageList(torch.zeros(1, 3, 4, 4), [(4, 3)])
>>> kept = copy_value(live, "clone")
>>> _ = live.tensors.add_(1)
>>> float(kept.tensors.sum()), kept.image_sizes
(0.0, [(4, 3)])
"""

from __future__ import annotations

from typing import Any, Callable

from torchvision.models.detection.image_list import ImageList

from ..torch.copies import register_holder

__all__ = ["image_list"]


def image_list(value: ImageList, copy: Callable[[Any], Any]) -> ImageList:
    """A new ``ImageList``: ``copy`` of the padded batch, and the image sizes copied.

    >>> import torch
    >>> copied = image_list(ImageList(torch.ones(1, 3, 2, 2), [(2, 2)]), lambda t: t * 0)
    >>> float(copied.tensors.sum()), copied.image_sizes
    (0.0, [(2, 2)])
    """
    return ImageList(copy(value.tensors), [tuple(size) for size in value.image_sizes])


register_holder(ImageList, image_list)
