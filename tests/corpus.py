"""Functions used as fixtures: every kind of assignment, one per line.

Line numbers matter: tests compare numbered targets against these lines, so edit
with care (tests use offsets from each function's first line).
"""

import contextlib


def everything(seq, flag):
    x = 1
    x += 2
    y: int = 3
    for i in seq:
        x = x + i
    with contextlib.nullcontext(5) as cm:
        pass
    try:
        raise ValueError("boom")
    except ValueError as err:
        msg = str(err)
    if (w := x * 2) > 0:
        pass
    a, *rest = seq
    import os.path as osp
    match flag:
        case {"k": captured}:
            pass
        case _:
            captured = None

    def inner():
        nonlocal z
        z = 10

    z = 0
    inner()
    squares = [q * q for q in seq]
    try:
        t = 1
    finally:
        f = 2
    return x, y, i, cm, msg, w, a, rest, osp, captured, z, squares, t, f


# (name, index) -> line offset from the `def` line, as a reader counts.
EVERYTHING_TARGETS = {
    ("x", 0): 1,
    ("x", 1): 2,
    ("y", 0): 3,
    ("i", 0): 4,
    ("x", 2): 5,
    ("cm", 0): 6,
    ("err", 0): 10,
    ("msg", 0): 11,
    ("w", 0): 12,
    ("a", 0): 14,
    ("rest", 0): 14,
    ("osp", 0): 15,
    ("captured", 0): 17,
    ("captured", 1): 20,
    ("inner", 0): 22,
    ("z", 0): 26,
    ("squares", 0): 28,
    ("t", 0): 30,
    ("f", 0): 32,
}


class Linear:
    def __init__(self, scale):
        self.weight = scale

    def __call__(self, x):
        return x * self.weight


class ToyModel:
    """The seeds' ToyModel, without torch."""

    def __init__(self):
        self.linear1 = Linear(2)
        self.linear2 = Linear(3)

    def forward(self, inputs, data_samples=None, mode="tensor"):
        if isinstance(inputs, list):
            inputs = sum(inputs)
        outputs = self.linear1(inputs)
        outputs = self.linear2(outputs)
        if mode == "tensor":
            return outputs
        elif mode == "loss":
            loss = data_samples - outputs
            outputs = dict(loss=loss)
            return outputs
        return outputs
