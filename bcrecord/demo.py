"""``bcrecord demo``: record inside a small CNN without editing it, save, and draw.

The model is :class:`bcrecord.demo_model.TinyResNet` (shipped in the package, CPU,
no downloads). The demo

1. lists what can be recorded in ``BasicBlock.forward``, read from its bytecode;
2. records the locals of the model's ``forward`` (every assignment of ``x``) and of
   the first block (``out@1``, the batch norm's output, and ``out@2``, after the
   in-place ReLU) with :func:`bcrecord.torch.record`, over a few training steps,
   saving each step with :class:`bcrecord.storage.Writer`;
3. shows that the value *before* the in-place ReLU survived (it has negative
   values; the ReLU overwrote that very tensor a moment later);
4. runs ``bcrecord view`` on the saved records: the summary table and the pictures
   in ``DIR/plots`` (feature maps, heatmaps, histograms, values over steps).

Needs torch, safetensors and (for pictures) matplotlib:
``pip install 'bcrecord[torch,save,viz]'``. Runs in about 6 seconds on a 2-core CPU (the
first run a little longer: matplotlib builds its font cache), about 3 with ``plots=False``.

>>> import io, tempfile
>>> run(tempfile.mkdtemp(), steps=2, plots=False, out=io.StringIO())
0
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any, List, Optional, TextIO, Tuple, Union

from .errors import BcrecordError, shell_quoted
from .storage import _expanded

__all__ = ["run", "TARGETS"]

#: What the demo records (targets of :func:`bcrecord.torch.record`).
TARGETS = [":forward:x", "layer1.0:forward:out@[1,2]"]
_MARKER = ".bcrecord-demo"


def _need(*needed: Tuple[str, str]) -> None:
    """Refuse, naming every missing one at once, unless each ``(module, extra)`` is installed.

    >>> try:
    ...     _need(("bcrecord_missing_a", "torch"), ("json", "save"), ("bcrecord_missing_b", "viz"))
    ... except BcrecordError as error:
    ...     print(error)
    the demo needs bcrecord_missing_a and bcrecord_missing_b: pip install 'bcrecord[torch,viz]'
    """
    missing = [(module, extra) for module, extra in needed if importlib.util.find_spec(module) is None]
    if missing:
        modules = " and ".join(module for module, _ in missing)
        extras = ",".join(dict.fromkeys(extra for _, extra in missing))
        raise BcrecordError(f"the demo needs {modules}: pip install 'bcrecord[{extras}]'")


def _demo_keys() -> List[str]:
    """The keys the demo saves: every assignment of ``x`` in the model's ``forward``, and the
    first block's ``out@1`` and ``out@2`` (read from the bytecode, as :data:`TARGETS` picks them).

    >>> _demo_keys()[:2], _demo_keys()[-2:]
    ([':forward:x@0', ':forward:x@1'], ['layer1.0:forward:out@1', 'layer1.0:forward:out@2'])
    """
    from .demo_model import TinyResNet
    from .patch import targets

    assignments = targets(TinyResNet.forward).locals["x"]
    return [f":forward:x@{a.index}" for a in assignments] + [f"layer1.0:forward:out@{i}" for i in (1, 2)]


def _foreign_keys(directory: Path) -> List[str]:
    """Keys saved in an earlier demo's ``directory`` that the demo did not write (a ``bcrecord run
    -o`` into it since): clearing the folder would delete their values."""
    from .storage import saved_keys

    if not any((directory / name).exists() for name in ("index.json", "index.jsonl")):
        return []
    try:
        saved = saved_keys(directory)
    except (BcrecordError, OSError) as error:  # unreadable: whose values it holds is unknown
        raise BcrecordError(
            f"{directory} has an index the demo cannot read ({error}), so it is not replaced; "
            "choose another folder with --out DIR"
        ) from None
    ours = set(_demo_keys())
    return [key for key in saved if key not in ours]


def _prepare(directory: Path) -> None:
    """Make ``directory`` for the demo, clearing what an earlier demo left there (only that).

    A folder of an earlier demo that holds values of other keys too (``bcrecord run -o`` into
    it) is refused, and nothing in it is deleted.
    """
    if directory.exists() and not directory.is_dir():
        raise BcrecordError(f"{directory} is a file, not a directory; choose another with --out DIR")
    if directory.exists() and any(directory.iterdir()):
        if not (directory / _MARKER).exists():
            raise BcrecordError(
                f"{directory} exists and was not made by bcrecord demo; choose another with --out DIR"
            )
        foreign = _foreign_keys(directory)
        if foreign:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise BcrecordError(
                f"{directory} holds values the demo did not save ({shown}); rerunning the demo there "
                "would delete them: choose another folder with --out DIR"
            )
        for name in ("records", "plots"):
            shutil.rmtree(directory / name, ignore_errors=True)
        for name in ("index.json", "index.jsonl"):
            (directory / name).unlink(missing_ok=True)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / _MARKER).write_text("made by bcrecord demo; rerunning the demo replaces this folder\n")
    except OSError as error:
        raise BcrecordError(
            f"cannot write to {directory}: {error.strerror or error}; choose another with --out DIR"
        ) from None


def _minimum(values: List[Any]) -> float:
    return min(float(v.min()) for v in values)


def run(
    directory: Union[str, os.PathLike[str]] = "bcrecord-demo",
    steps: int = 5,
    plots: bool = True,
    out: Optional[TextIO] = None,
) -> int:
    """Run the demo, saving into ``directory`` and printing to ``out``; returns 0.

    ``steps`` training steps are recorded; ``plots=False`` skips the pictures (and
    matplotlib). A ``directory`` that exists must be empty or an earlier demo's, holding
    only the values that demo saved (a rerun replaces them).

    >>> import io, tempfile
    >>> out = io.StringIO()
    >>> run(tempfile.mkdtemp(), steps=1, plots=False, out=out)
    0
    >>> "The value before the in-place ReLU survived" in out.getvalue()
    True
    """
    out = sys.stdout if out is None else out
    if isinstance(steps, bool) or not isinstance(steps, int):  # (before an earlier demo's folder is cleared)
        raise BcrecordError(f"--steps must be a whole number, got {steps!r}")
    if steps < 1:
        raise BcrecordError(f"--steps must be at least 1, got {steps}")
    _need(("torch", "torch"), ("safetensors", "save"), *([("matplotlib", "viz")] if plots else []))
    started = time.perf_counter()

    import torch

    # As bcrecord.save expands it: '~/demo' under home, never a folder named '~' here; './~' that folder.
    directory = _expanded(directory)
    _prepare(directory)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: more threads only contend
    try:
        return _run(directory, steps, plots, out, started)
    finally:
        torch.set_num_threads(threads)


def _run(directory: Path, steps: int, plots: bool, out: TextIO, started: float) -> int:
    import torch

    from . import viz
    from .demo_model import BasicBlock, TinyResNet, example_images
    from .patch import targets
    from .storage import Writer
    from .torch import record

    torch.manual_seed(0)
    model = TinyResNet()
    images, labels = example_images(8)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def say(text: str = "") -> None:
        print(text, file=out)

    say("bcrecord demo: a small ResNet-like CNN (bcrecord.demo_model.TinyResNet), on CPU, no downloads.\n")
    found = targets(BasicBlock.forward)
    lines = str(found).splitlines()
    say("1. What can be recorded in BasicBlock.forward, read from its bytecode (locals shown):\n")
    say("\n".join("   " + line for line in lines[:2] + [ln for ln in lines[2:] if ln.startswith("local")]))
    say(
        f"   ... and {len(found.specs()) - sum(len(s) for s in found.locals.values())} attribute, call, "
        "operator and return sites: bcrecord targets bcrecord.demo_model:BasicBlock.forward\n"
    )

    say(f"2. Record {TARGETS} for {steps} training step(s), saving each step to {directory}:\n")
    writer = Writer(directory)
    for step in range(steps):
        with record(model, TARGETS) as rec:
            logits = model(images)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        written = writer.write(rec, step=step)
        say(f"   step {step}: loss {loss.item():.3f}, {written} values saved")

    loaded = viz.load(directory, keys=["layer1.0:forward:out@1", "layer1.0:forward:out@2"])
    before, after = loaded["layer1.0:forward:out@1"], loaded["layer1.0:forward:out@2"]
    say("\n3. The value before the in-place ReLU survived:\n")
    say(f"   layer1.0:forward:out@1  out = self.bn1(out)   min {_minimum(before):+.3f}  (batch norm output)")
    say(f"   layer1.0:forward:out@2  out = self.relu(out)  min {_minimum(after):+.3f}  (ReLU, in place)")
    say("   self.relu overwrote the tensor that out@1 names; bcrecord copied it when it was assigned.\n")

    view = f"bcrecord view {shell_quoted(str(directory), getattr(out, 'encoding', None))}"  # to paste
    say(f"4. {view}:\n")
    viz.view(directory, plots=plots, out=out, progress=False)
    seconds = time.perf_counter() - started
    say(f"\nDone in {seconds:.1f} s. Next:")
    # (After --no-plots: `view` draws the pictures the demo skipped; it has a --no-plots of its own,
    # which it needs where matplotlib is not installed.)
    if plots:
        say(f"   {view}          # this table and the pictures again")
    elif importlib.util.find_spec("matplotlib") is not None:
        say(f"   {view}          # this table again, now with the pictures")
    else:
        say(f"   {view} --no-plots          # this table again (pictures need: pip install 'bcrecord[viz]')")
    say("   bcrecord targets bcrecord.demo_model:TinyResNet.forward")
    say("   bcrecord run --record 'bcrecord.demo_model:BasicBlock.forward:out@1' --save-dir DIR script.py")
    return 0
