"""The README's PyTorch example runs as written."""

import torch

from ..test_readme import python_blocks


def test_torch_example_runs():
    (block,) = python_blocks(torch=True)
    namespace = {"__name__": "__main__"}
    exec(compile(block, "README.md", "exec"), namespace)
    rec = namespace["rec"]
    assert rec["bn1:forward:return"].shape == (1, 64, 112, 112)
    assert rec["bn1:forward:return"].min() < 0  # "before the in-place ReLU"
    assert rec.keys_of("layer*") == [f"layer{i}:forward:return" for i in range(1, 5)]
    assert [x.shape for x in rec.all(":_forward_impl:x@4")] == [(1, 256, 56, 56)]  # layer1's output
    assert set(namespace["features"]) == {"c3", "pooled"}
    assert isinstance(namespace["logits"], torch.Tensor)
