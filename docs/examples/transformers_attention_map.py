"""Hugging Face transformers: GPT-2's attention maps, recorded inside the attention function.

Run (CPU, a few seconds; the model is built from a tiny config, nothing is downloaded)::

    python docs/examples/transformers_attention_map.py --out /tmp/attention

Needs ``pip install 'bcrecord[transformers,viz]'`` (the picture takes matplotlib).

GPT-2's attention runs the module-level function ``eager_attention_forward`` (with
``attn_implementation="eager"``); its local ``attn_weights`` is assigned five times:
the scores ``q @ k.T * scale`` (``@0``), plus the causal mask (``@1``), the softmax
(``@2``), a dtype cast (``@3``) and dropout (``@4``). The function is shared by all
layers, so :func:`bcrecord.patch_function` gets an owner function that names each
call by the attention module it was given: keys read
``transformer.h.1.attn:eager_attention_forward:attn_weights@2``.

It draws every layer's and head's probabilities into ``attention.png``, checks them
against ``output_attentions=True``, and saves the records with :func:`bcrecord.save`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Dict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.models.gpt2 import modeling_gpt2  # noqa: E402

import bcrecord  # noqa: E402

LAYERS, HEADS, TOKENS = 2, 4, 12


def build() -> GPT2LMHeadModel:
    """A 2-layer, 4-head GPT-2, eager attention; random weights (seed 0) wide enough for varied maps."""
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=LAYERS, n_head=HEADS, n_embd=32, vocab_size=100, n_positions=64,
        bos_token_id=0, eos_token_id=0, attn_implementation="eager", initializer_range=0.3,
    )  # fmt: skip
    return GPT2LMHeadModel(config).eval()


def tokens() -> torch.Tensor:
    """The example's input: one sequence of 12 token ids from seed 1."""
    return torch.randint(0, 100, (1, TOKENS), generator=torch.Generator().manual_seed(1))


def main(out: Path) -> Dict[str, torch.Tensor]:
    """Record, draw, check and save; returns ``{key: probabilities}``."""
    model = build()
    paths = {id(module): path for path, module in model.named_modules()}
    with (
        bcrecord.patch_function(
            modeling_gpt2.eager_attention_forward,
            ["attn_weights@0", "attn_weights@2"],
            name=lambda module: paths.get(id(module)),  # the layer's path; None: not recorded
        ) as patch,
        bcrecord.recording(only=[patch]) as rec,
        torch.no_grad(),
    ):
        reference = model(tokens(), output_attentions=True).attentions
    probs = {i: rec[f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@2"] for i in range(LAYERS)}
    for i in range(LAYERS):
        same = torch.equal(probs[i], reference[i])
        scores = rec[f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@0"]
        print(f"layer {i}: probabilities {tuple(probs[i].shape)} equal output_attentions: {same}; "
              f"scores range [{float(scores.min()):.3f}, {float(scores.max()):.3f}]")  # fmt: skip

    out.mkdir(parents=True, exist_ok=True)
    figure, axes = plt.subplots(LAYERS, HEADS, figsize=(2.2 * HEADS, 2.2 * LAYERS), squeeze=False)
    for i in range(LAYERS):
        for h in range(HEADS):
            axes[i][h].imshow(probs[i][0, h].numpy(), cmap="viridis", vmin=0, vmax=1)
            axes[i][h].set_title(f"layer {i} head {h}", fontsize=8)
            axes[i][h].set_xticks([])
            axes[i][h].set_yticks([])
    figure.suptitle("GPT-2 attention probabilities (query rows, key columns)", fontsize=9)
    figure.savefig(out / "attention.png", dpi=80)
    plt.close(figure)
    bcrecord.save(rec, out / "records", step=0)
    print(f"wrote {out / 'attention.png'} and {len(rec)} keys to {out / 'records'}")
    return {key: rec[key] for key in rec.keys()}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bcrecord_examples/transformers_attention_map"))
    main(parser.parse_args().out)
