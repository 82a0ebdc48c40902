"""The core demo behind ``bcrecord demo``: record inside a model without editing it.

Pure Python (no torch): the seeds' ToyModel on lists of floats. It lists the
targets of ``forward``, patches it with the MMEngine proposal's specs, runs a few
steps, prints what was recorded and the disassembly with the probes marked.

>>> import io
>>> run(out=io.StringIO())
0
"""

from __future__ import annotations

import sys
from typing import List, Optional, TextIO

from .listing import side_by_side
from .patch import patch_method, targets
from .runtime import recording
from .specs import SpecLike

Vector = List[float]


class Linear:
    """y = w * x + b on a list of floats; ``weight`` is a plain attribute."""

    def __init__(self, weight: float, bias: float) -> None:
        self.weight = weight
        self.bias = bias

    def __call__(self, x: Vector) -> Vector:
        return [self.weight * v + self.bias for v in x]


class ToyModel:
    """The MMEngine proposal's ToyModel, without torch."""

    def __init__(self) -> None:
        self.linear1 = Linear(2.0, 1.0)
        self.linear2 = Linear(-0.5, 0.0)

    def forward(self, inputs: Vector, data_samples: Optional[Vector] = None, mode: str = "tensor") -> object:
        outputs = self.linear1(inputs)
        outputs = [max(v, 0.0) for v in outputs]
        outputs = self.linear2(outputs)
        if mode == "tensor":
            return outputs
        loss = sum((d - o) ** 2 for d, o in zip(data_samples or [], outputs, strict=False))
        return dict(loss=loss)


def run(out: TextIO = sys.stdout) -> int:
    """Run the demo, printing to ``out``; returns 0."""
    model = ToyModel()
    print("1. What can be recorded in ToyModel.forward (no source needed):\n", file=out)
    print(targets(model.forward), file=out)

    specs: List[SpecLike] = [
        dict(type="FunctionRecorder", target="outputs", index=[0, 2]),
        dict(type="AttributeRecorder", target="self.linear1.weight"),
        "return",
    ]
    print("\n2. Record with the MMEngine proposal's specs, owner 'runner_model':\n", file=out)
    with patch_method(model, "forward", specs, name="runner_model") as patch:
        with recording() as rec:
            for step in range(3):
                model.forward([float(step), -1.0, 2.0], [0.0, 0.0, 0.0], mode="loss")
        for key in rec.keys():
            print(f"   {key:<40} {rec.all(key)}", file=out)
        print("\n3. The patched code, probes marked with '+':\n", file=out)
        print(side_by_side(patch.original_code, patch.code), file=out)
    print("\n4. After the patch is removed, forward is the original again:", file=out)
    print(f"   'forward' in vars(model): {'forward' in vars(model)}", file=out)
    return 0
