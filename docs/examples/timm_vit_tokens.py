"""A timm Vision Transformer: the tokens after every block, in one forward pass.

Run (CPU, a second or two; no weights are downloaded)::

    python docs/examples/timm_vit_tokens.py --out /tmp/vit_records

Needs ``pip install 'bcrecord[torch,save]' timm`` (saving tensors takes safetensors).

timm's ``VisionTransformer.forward_features`` runs its blocks as one
``nn.Sequential`` call; bcrecord records, without tracing and without touching timm:

* ``blocks.*``: every block's output tokens (``(batch, 1 + patches, dim)``);
* ``blocks.*.attn:forward:attn@2``: inside every attention module, the attention
  probabilities (the local ``attn`` after its softmax; timm computes it when
  ``fused_attn`` is off, which :func:`build` sets -- with fused attention the
  probabilities never exist outside ``scaled_dot_product_attention``);
* ``:forward_features:x``: every assignment of ``x`` in ``forward_features`` that
  runs (patch embedding, position embedding, ..., the blocks, the final norm).

It prints, per block, the class token's norm, how similar each block's tokens are
to the previous block's, and how much the class token attends to itself; and
saves everything with :func:`bcrecord.save`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict

import timm
import torch

import bcrecord
from bcrecord.torch import record

TARGETS = ["blocks.*", "blocks.*.attn:forward:attn@2", ":forward_features:x"]


def build() -> torch.nn.Module:
    """ViT-Tiny for 64x64 images (16 patches of 16x16), random weights from seed 0, unfused attention."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64).eval()
    for block in model.blocks:
        block.attn.fused_attn = False  # compute softmax(q k^T) in Python, as a local
    return model


def image() -> torch.Tensor:
    """The example's input: two 3x64x64 images from seed 1."""
    return torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))


def main(out: Path) -> Dict[str, torch.Tensor]:
    """Record, print and save; returns ``{key: value}``."""
    model = build()
    with torch.no_grad(), record(model, TARGETS) as rec:
        model(image())
    blocks = rec.keys_of("blocks.*")
    print(f"{len(blocks)} blocks, tokens {tuple(rec[blocks[0]].shape)}")
    previous = rec[rec.keys_of(":forward_features:x")[3]]  # the tokens entering block 0
    for i, key in enumerate(blocks):
        tokens = rec[key]
        similarity = float(torch.nn.functional.cosine_similarity(tokens, previous, dim=-1).mean())
        norm = float(tokens[:, 0].norm(dim=-1).mean())
        to_self = float(
            rec[f"blocks.{i}.attn:forward:attn@2"][:, :, 0, 0].mean()
        )  # (batch, heads, query, key)
        print(f"{key:24s} cls norm {norm:7.3f}  cos(prev) {similarity:.3f}  cls->cls attention {to_self:.3f}")
        previous = tokens
    ran = [key for key in rec.keys_of(":forward_features:x") if key in rec]  # the loop branch did not run
    print("forward_features assignments that ran:", ", ".join(ran))
    bcrecord.save(rec, out, step=0)
    print(f"saved {len(rec)} keys to {out}")
    return {key: rec[key] for key in rec.keys()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bcrecord_examples/timm_vit_tokens"))
    main(parser.parse_args().out)
