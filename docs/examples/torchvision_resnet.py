"""ResNet-18 from torchvision: each stage's output and the values *before* each ReLU.

Run (CPU, a second or two; no weights are downloaded)::

    python docs/examples/torchvision_resnet.py --out /tmp/resnet_records

Needs ``pip install 'bcrecord[torch,save]' torchvision`` (saving tensors takes safetensors).

One forward pass, torchvision's code untouched, records:

* ``layer1`` ... ``layer4``: each stage's output (bare module paths, as torchvision's
  ``return_nodes``);
* ``layer*.*:forward:out@1`` and ``layer*.*:forward:out@5``: inside every
  ``BasicBlock``, the value after ``bn1`` and after ``out += identity`` -- both right
  before an in-place ``ReLU``, so no forward hook can see them (a hook on ``bn1``
  gets a tensor that the ReLU overwrites a moment later);
* ``:_forward_impl:x@1``: the stem's batch-norm output, before its ReLU.

It prints one line per target and saves everything with :func:`bcrecord.save`
(``bcrecord.load(out)`` reads it back).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict, List

import torch
import torchvision

import bcrecord
from bcrecord.torch import record

TARGETS: List[str] = [
    ":_forward_impl:x@1",
    "layer1",
    "layer2",
    "layer3",
    "layer4",
    "layer*.*:forward:out@1",
    "layer*.*:forward:out@5",
]


def build() -> torchvision.models.ResNet:
    """The example's model: ResNet-18, random weights from seed 0, eval mode."""
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval()


def image() -> torch.Tensor:
    """The example's input: one 3x64x64 image from seed 1."""
    return torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def main(out: Path) -> Dict[str, torch.Tensor]:
    """Record, print and save; returns ``{key: value}``."""
    model = build()
    with torch.no_grad(), record(model, TARGETS) as rec:
        logits = model(image())

    # What a forward hook on bn1 would have kept (no clone): the ReLU overwrote it.
    hooked: List[torch.Tensor] = []
    handle = model.layer1[0].bn1.register_forward_hook(lambda m, i, o: hooked.append(o))
    with torch.no_grad():
        model(image())
    handle.remove()

    print(f"logits {tuple(logits.shape)}")
    for key in rec.keys():
        value = rec[key]
        negative = float((value < 0).float().mean())
        print(f"{key:32s} {str(tuple(value.shape)):18s} negative {negative:6.1%}")
    recorded_min, hooked_min = float(rec["layer1.0:forward:out@1"].min()), float(hooked[0].min())
    print(f"layer1.0 bn1 output min: recorded {recorded_min:.4f}, forward hook {hooked_min:.4f}")
    bcrecord.save(rec, out, step=0)
    print(f"saved {len(rec)} keys to {out}")
    return {key: rec[key] for key in rec.keys()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bcrecord_examples/torchvision_resnet"))
    main(parser.parse_args().out)
