"""MMEngine: record inside a model from a config, with bcrecord's RecorderHook.

Run (CPU, a few seconds; needs ``pip install 'bcrecord[mmengine]'``)::

    python docs/examples/mmengine_config.py --out /tmp/mmengine_run

It registers the MMEngine recorder proposal's ``ToyModel`` and a toy dataset, reads
``mmengine_toy_config.py`` (next to this script) with ``Config.fromfile``, points
its ``work_dir`` and the hook's ``save_dir`` at ``--out`` and trains one epoch of
four iterations. The config's ``custom_hooks`` hold a ``RecorderHook`` with the
proposal's recorders -- ``outputs@1`` and ``self.linear1.weight`` -- so after each
iteration ``runner.message_hub`` has ``'runner_model:forward:outputs@1'`` and
``'runner_model:forward:self.linear1.weight'``, and every iteration is saved to
``<out>/records/train`` (``bcrecord.load`` reads it back).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, List, Union

import torch
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, MODELS
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

import bcrecord

CONFIG = Path(__file__).resolve().with_name("mmengine_toy_config.py")


@MODELS.register_module(name="BcrecordExampleToyModel", force=True)
class ToyModel(BaseModel):
    """The toy model of the MMEngine recorder proposal."""

    def __init__(self, data_preprocessor: Any = None) -> None:
        super().__init__(data_preprocessor=data_preprocessor)
        self.linear1 = nn.Linear(2, 2)
        self.linear2 = nn.Linear(2, 1)

    def forward(self, inputs: Any, data_samples: Any, mode: str = "tensor") -> Any:
        if isinstance(inputs, list):
            inputs = torch.stack(inputs)
        if isinstance(data_samples, list):
            data_sample = torch.stack(data_samples)
        outputs = self.linear1(inputs)
        outputs = self.linear2(outputs)
        if mode == "loss":
            loss = (data_sample - outputs).sum()
            outputs = dict(loss=loss)
            return outputs
        return outputs


@DATASETS.register_module(name="BcrecordExampleToyDataset", force=True)
class ToyDataset(Dataset):
    """``n`` random 2-vectors and labels from seed 0."""

    def __init__(self, n: int = 12) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randn(n, 2, generator=g)
        self.label = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        return dict(inputs=self.data[index], data_samples=self.label[index])


def main(out: Path) -> Dict[str, List[Any]]:
    """Train from the config; print what the MessageHub and the records hold."""
    cfg = Config.fromfile(str(CONFIG))
    cfg.work_dir = str(out / "work")
    cfg.custom_hooks[0]["save_dir"] = str(out / "records")
    runner = Runner.from_cfg(cfg)
    runner.train()

    hub = runner.message_hub
    outputs: Union[torch.Tensor, None] = hub.get_info("runner_model:forward:outputs@1")
    weight: Union[torch.Tensor, None] = hub.get_info("runner_model:forward:self.linear1.weight")
    assert outputs is not None and weight is not None
    print(
        f"message hub: outputs@1 {tuple(outputs.shape)} = {[round(v, 4) for v in outputs.flatten().tolist()]}"
    )
    print(f"message hub: self.linear1.weight {tuple(weight.shape)}")
    saved = bcrecord.load(out / "records" / "train")
    print(f"saved iterations: {saved.steps('runner_model:forward:outputs@1')}")
    unchanged = type(runner.model).forward.__code__ is ToyModel.__dict__["forward"].__code__
    print(f"model patched after the run: {'forward' in vars(runner.model) or not unchanged}")
    return {key: saved[key] for key in saved}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bcrecord_examples/mmengine_config"))
    main(parser.parse_args().out)
