"""Cost of probing every call site of resnet50's Bottleneck.forward (issue 8's target).

Run from the repository root: ``python benchmarks/calls.py [--quick]``.

torchvision resnet50 (``weights=None``), CPU, one thread, ``torch.no_grad()``, input
1x3x64x64. Variants, interleaved round by round (``benchmarks/core.py``'s harness),
median of per-round ratios with the interquartile range:

* unpatched forward;
* every call site of ``Bottleneck.forward`` (``self.conv1()``, ``self.bn1()``,
  ``self.relu()``… in all 16 blocks) recorded with ``bcrecord.torch.record`` (entered
  once around the timed block, ``keep='last'``, detached clones) — 10 call sites a
  block (``self.downsample()`` only where there is one), 148 values per forward.

Also, to split the cost: the same with ``copy='detach'`` (no copy: the tensors are
kept alive, which is what makes the next forward allocate fresh memory), with a
``reduce`` that turns each value into a number (the probes alone: nothing kept), and
forward hooks doing the same work as the default (a clone of the output of every
module call inside the Bottlenecks, the last kept). Target: recorded / unpatched
<= 1.05x. Timings are CPU time of this thread.

Part of the cost is glibc's allocator handing memory back to the system and
faulting it in again as kept values pile up. Measured here (2026-11-30), run with
``MALLOC_TOP_PAD_=536870912 MALLOC_TRIM_THRESHOLD_=2147483647
MALLOC_MMAP_THRESHOLD_=1073741824``: recorded 1.05x, detach 1.04x, hooks 1.05x,
against 1.08x, 1.05x and 1.07x in the same session without them.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision.models.resnet import Bottleneck  # noqa: E402

import bcrecord  # noqa: E402
from bcrecord.torch import record  # noqa: E402
from benchmarks import core  # noqa: E402  (the interleaving harness)


def _cpu_time_block(variant: core.Variant) -> float:
    """core.time_block, on this thread's CPU time (the machine may be shared)."""
    variant.enter()
    try:
        start = time.thread_time_ns()
        variant.run()
        return (time.thread_time_ns() - start) / variant.ops
    finally:
        variant.leave()


#: What each variant is, as the tables print it.
NAMES = {
    "unpatched": "unpatched forward",
    "recorded": "every Bottleneck call site recorded (clone)",
    "detached": "the same, copy='detach' (no clone)",
    "probes": "the same, reduced to a number (probes only)",
    "hooks": "forward hooks, clone of every module call",
}


@dataclass
class Measured:
    """Per-round times of each variant (keys of :data:`NAMES`), and what was probed."""

    times: Dict[str, List[float]]
    #: Call sites in Bottleneck.forward, and values recorded per forward.
    sites: int
    per_forward: int


def measure(rounds: int, forwards: int, size: int = 64) -> Measured:
    """Build resnet50, check the recorded values, and time the variants interleaved.

    ``forwards`` forwards per block, timed by ``core.time_block`` (set it to choose the clock).
    """
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None).eval()
    x = torch.randn(1, 3, size, size)
    callees = sorted(bcrecord.targets(Bottleneck.forward).calls)
    targets = [f"layer*.*:forward:{callee}()" for callee in callees]
    sites = sum(len(s) for s in bcrecord.targets(Bottleneck.forward).calls.values())

    with torch.no_grad():
        expected = model(x)
        with record(model, targets, keep="last") as check:
            got = model(x)
    if not torch.equal(got, expected):
        raise SystemExit("recording changed the model's output")
    values = sum(len(check.all(k)) for k in check.keys())
    # self.downsample(x) runs only in the 4 blocks that have one
    per_forward = 16 * (sites - 1) + sum(
        m.downsample is not None for m in model.modules() if isinstance(m, Bottleneck)
    )
    if values != per_forward:
        raise SystemExit(f"expected {per_forward} recorded call results, got {values}")
    with torch.no_grad():  # one value checked against an independent computation
        block = model.layer3[2]
        conv3 = block.conv3(check["layer3.2:forward:self.relu()@1"])
    if not torch.allclose(check["layer3.2:forward:self.conv3()@0"], conv3, atol=1e-5):
        raise SystemExit("a recorded call result is wrong")

    state: Dict[str, Any] = {}

    def forward_n() -> None:
        with torch.no_grad():
            for _ in range(forwards):
                model(x)

    def enter_recorded() -> None:
        state["context"] = record(model, targets, keep="last")
        state["rec"] = state["context"].__enter__()

    def enter_detached() -> None:
        state["context"] = record(model, targets, keep="last", copy="detach")
        state["rec"] = state["context"].__enter__()

    def enter_probes_only() -> None:
        state["context"] = record(model, targets, keep="last", reduce=lambda t: 0)
        state["rec"] = state["context"].__enter__()

    kept: Dict[Any, torch.Tensor] = {}
    inner = [m for block in model.modules() if isinstance(block, Bottleneck) for m in block.children()]

    def keep_clone(module: Any, args: Any, output: torch.Tensor) -> None:
        kept[module] = output.detach().clone()

    def enter_hooks() -> None:
        state["hooks"] = [m.register_forward_hook(keep_clone) for m in inner]

    def leave_hooks() -> None:
        for handle in state.pop("hooks"):
            handle.remove()
        kept.clear()

    def leave_recorded() -> None:
        state.pop("context").__exit__(None, None, None)
        if sum(len(rec.all(k)) for rec in [state.pop("rec")] for k in rec.keys()) != per_forward:
            raise RuntimeError("a call site was not recorded")

    variants = [
        core.Variant("unpatched", forward_n, ops=forwards),
        core.Variant("recorded", forward_n, enter=enter_recorded, leave=leave_recorded, ops=forwards),
        core.Variant("detached", forward_n, enter=enter_detached, leave=leave_recorded, ops=forwards),
        core.Variant("probes", forward_n, enter=enter_probes_only, leave=leave_recorded, ops=forwards),
        core.Variant("hooks", forward_n, enter=enter_hooks, leave=leave_hooks, ops=forwards),
    ]
    times = core.interleave(variants, rounds)
    return Measured(times, sites, per_forward)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    args = parser.parse_args(argv)
    rounds, forwards = (3, 2) if args.quick else (20, 5)
    core.time_block = _cpu_time_block  # CPU time: other jobs may share the machine
    measured = measure(rounds, forwards)
    times = measured.times
    summary = core.ratios(times, "recorded", "unpatched")
    print(
        f"bcrecord {bcrecord.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}"
    )
    sites = f"{measured.sites} sites x 16 blocks"
    print(f"== resnet50 with every call site of Bottleneck.forward recorded ({sites}) ==")
    rows: List[Any] = [(text, core.ratios(times, name, "unpatched"), "") for name, text in NAMES.items()]
    rows.append(("recorded (clone) / forward hooks", core.ratios(times, "recorded", "hooks"), ""))
    core.print_table(rows, "")
    core.verdict("recorded / unpatched", summary.median, "<= 1.05x", summary.median <= 1.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
