"""The README's PyTorch example runs as written."""

import torch

from ..test_readme import python_blocks


def test_torch_example_runs():
    (block,) = python_blocks(torch=True)
    namespace = {"__name__": "__main__"}
    exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["rec"]["bn1:forward:return"].shape == (1, 64, 112, 112)
    assert set(namespace["features"]) == {"c3", "pooled"}
    assert isinstance(namespace["logits"], torch.Tensor)
