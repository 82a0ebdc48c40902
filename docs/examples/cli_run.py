"""``bcrecord run``: record inside an unmodified training script from the command line.

Run (CPU, a few seconds)::

    python docs/examples/cli_run.py --out /tmp/cli_run

Needs ``pip install 'bcrecord[torch,save]'`` (saving tensors takes safetensors).

It runs this command, as you would in a shell::

    bcrecord run --record '__main__:TinyNet.forward:hidden' --record '__main__:main:loss@1' \\
        --save-dir OUT --every 2 docs/examples/train_plain.py --steps 6

``train_plain.py`` is an ordinary PyTorch script that never imports bcrecord; the
CLI patches ``TinyNet.forward`` (both assignments of ``hidden``: before and after
the ReLU) and the training loop's ``loss`` as soon as the script defines them,
keeps every 2nd value of each key, and saves them to ``OUT``. The script's output
and exit status pass through unchanged. This driver then reads the records back.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import List

import torch

import bcrecord

SCRIPT = Path(__file__).resolve().with_name("train_plain.py")
TARGETS = ["__main__:TinyNet.forward:hidden", "__main__:main:loss@1"]


def command(out: Path) -> List[str]:
    """The ``bcrecord run`` command line (through ``python -m bcrecord``)."""
    records = [arg for target in TARGETS for arg in ("--record", target)]
    return [sys.executable, "-m", "bcrecord", "run", *records, "--save-dir", str(out), "--every", "2",
            str(SCRIPT), "--steps", "6"]  # fmt: skip


def main(out: Path) -> bcrecord.storage.Loaded:
    """Run the script under the CLI, show its output, and read the records back."""
    done = subprocess.run(command(out), capture_output=True, text=True, check=False)
    print(done.stdout, end="")
    print(f"exit status {done.returncode}; bcrecord said: {done.stderr.strip().splitlines()[-1]}")
    saved = bcrecord.load(out)
    for key in saved:
        print(f"{key:28s} steps {saved.steps(key)}")
    before, after = saved["TinyNet:forward:hidden@0"], saved["TinyNet:forward:hidden@1"]
    same = all(torch.equal(torch.relu(b), a) for b, a in zip(before, after, strict=True))
    print(f"hidden@1 == relu(hidden@0) at every saved step: {same}")
    print("saved losses:", [round(float(v), 4) for v in saved["__main__:main:loss@1"]])
    return saved


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bcrecord_examples/cli_run"))
    main(parser.parse_args().out)
