"""Tensors saved with bcrecord.storage come back equal, with their index metadata."""

import torch

from bcrecord.storage import Writer, load
from bcrecord.torch import record

from .models import SmallNet


def test_tensor_round_trip_through_safetensors(tmp_path):
    net = SmallNet().eval()
    writer = Writer(tmp_path)
    kept = []
    for step in range(3):
        with record(net, ["bn1", ":forward:x@5"]) as rec:
            net(torch.randn(1, 3, 8, 8))
        writer.write(rec, step=step)
        kept.append(rec["bn1:forward:return"])
    loaded = load(tmp_path)
    assert loaded.steps("bn1:forward:return") == [0, 1, 2]
    assert all(torch.equal(a, b) for a, b in zip(loaded["bn1:forward:return"], kept, strict=True))
    entry = next(e for e in loaded.entries if e.key == "bn1:forward:return")
    assert entry.info["shape"] == [1, 4, 8, 8] and entry.info["dtype"] == "float32"
    assert entry.info["bytes"] == 4 * 4 * 8 * 8 and entry.info["kind"] == "tensor"
    assert sorted(p.suffix for p in (tmp_path / "records").iterdir()) == [".safetensors"] * 3
