"""Lightning: record inside a LightningModule while it trains, with RecorderCallback.

Run (CPU, a few seconds; the data is made up)::

    python docs/examples/lightning_callback.py --out /tmp/lightning_run

Needs ``pip install 'bcrecord[lightning]'`` (with safetensors, for ``save_dir``).

A small conv net trains for 6 steps and validates twice. The callback records, every
2nd training step and every 2nd validation batch, the conv layer's output (a module
path), the ReLU's input inside ``forward`` (a local, ``feats``) and the conv's
weight and bias (attributes read at entry). It

* keeps each recorded batch on the callback (``callback.last``, ``callback.history``);
* puts mean/std/min/max into ``trainer.callback_metrics``
  (``'bcrecord/fit/conv:forward:return/std'``...);
* logs them, and a channel-mean picture of the conv output, to the CSV logger
  (``<out>/csv/version_0/metrics.csv`` and ``.../bcrecord_images/``);
* saves every recorded value to ``<out>/records/fit`` and ``<out>/records/validate``
  (``bcrecord.load`` reads them back).

The module is patched only while a loop runs: afterwards its code is the original.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import lightning.pytorch as pl
import torch

import bcrecord
from bcrecord.integrations.lightning import RecorderCallback


class ConvNet(pl.LightningModule):
    """Conv -> ReLU -> linear head over 8x8 single-channel images, two classes."""

    conv_code = torch.nn.Conv2d.forward.__code__  # to show that the patches are gone afterwards

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 8 * 8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = self.conv(x)
        hidden = torch.relu(feats)
        return self.head(hidden.flatten(1))

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def data(n: int, seed: int) -> torch.utils.data.DataLoader:
    """Images whose class is whether their top half is brighter than the bottom half."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = (x[:, :, :4].mean((1, 2, 3)) > x[:, :, 4:].mean((1, 2, 3))).long()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def main(out: Path) -> RecorderCallback:
    """Train with the callback; print what it recorded; returns the callback."""
    torch.manual_seed(0)
    callback = RecorderCallback(
        ["conv", ":forward:feats", "conv:forward:self.weight", "conv:forward:self.bias"],
        every_n_steps=2,
        stages=("fit", "validate"),
        save_dir=out / "records",
    )
    trainer = pl.Trainer(
        max_steps=6, log_every_n_steps=1, val_check_interval=3, limit_val_batches=2, num_sanity_val_steps=0,
        callbacks=[callback], logger=pl.loggers.CSVLogger(str(out), name="csv"),
        accelerator="cpu", devices=1, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=str(out),
    )  # fmt: skip
    model = ConvNet()
    original = torch.nn.Conv2d.forward
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice about dataloader workers
        trainer.fit(model, data(48, seed=1), data(16, seed=2))

    for record in callback.history:
        shape = tuple(record["conv:forward:return"].shape)
        std = record.metrics[f"bcrecord/{record.stage}/conv:forward:return/std"]
        print(
            f"{record.stage:8s} step {record.step}  batch {record.batch_idx}  conv out {shape}  std {std:.4f}"
        )
    latest = trainer.callback_metrics["bcrecord/fit/conv:forward:return/std"]
    print(f"trainer.callback_metrics['bcrecord/fit/conv:forward:return/std'] = {float(latest):.4f}")
    print(f"patched after fit: {callback.patched}; Conv2d.forward is the original: "
          f"{torch.nn.Conv2d.forward is original and original.__code__ is ConvNet.conv_code}")  # fmt: skip
    saved = bcrecord.load(out / "records" / "fit")
    print(f"saved training steps: {saved.steps('conv:forward:return')}")
    return callback


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bcrecord_examples/lightning_callback"))
    main(parser.parse_args().out)
