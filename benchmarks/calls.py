"""Cost of probing every call site of resnet50's Bottleneck.forward (issue 8's target).

Run from the repository root: ``python benchmarks/calls.py [--quick] [--size N]``.

torchvision resnet50 (``weights=None``), CPU, one thread, ``torch.no_grad()``, input
1x3x64x64 (``--size``). Variants, interleaved round by round (``benchmarks/core.py``'s harness),
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
module call inside the Bottlenecks, the last of each call kept: 148 values, as
``keep='last'`` keeps the last of each call site). Target: recorded / unpatched
<= 1.05x. Timings are CPU time of this thread.

Floors: the same probed code with bcrecord's probe swapped for a hand-written one-line
Python function (``probe(value, site, instance)``) that keeps nothing, keeps each value as it is, keeps
a clone of it, or copies it into the buffer it filled at the last forward (``copy_``: the
buffers are made by an untimed forward before the block). They tell the cost of the work itself
(keeping 148 tensors alive, copying them) from that of bcrecord's machinery (routing by
instance, sinks, copy policies).

Part of the cost is glibc's allocator handing memory back to the system and
faulting it in again as kept values pile up: :func:`measure_elsewhere` runs the case
in a fresh process with :data:`KEEP_FREED_MEMORY` in its environment, which
``benchmarks/run.py`` compares with glibc's defaults at 1x3x224x224 (case 7b).
"""

from __future__ import annotations

import argparse
import builtins
import dataclasses
import gc
import json
import os
import subprocess
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
from bcrecord.rewrite import PROBE_NAME  # noqa: E402
from bcrecord.torch import record  # noqa: E402
from benchmarks import core  # noqa: E402  (the interleaving harness)


def _cpu_time_block(variant: core.Variant) -> float:
    """core.time_block, on this thread's CPU time (the machine may be shared)."""
    variant.enter()
    was_enabled = gc.isenabled()
    gc.disable()  # (as core.time_block: no collection inside a timed block)
    try:
        start = time.thread_time_ns()
        variant.run()
        return (time.thread_time_ns() - start) / variant.ops
    finally:
        if was_enabled:
            gc.enable()
        variant.leave()


#: What each variant is, as the tables print it.
NAMES = {
    "unpatched": "unpatched forward",
    "recorded": "every Bottleneck call site recorded (clone)",
    "detached": "the same, copy='detach' (no clone)",
    "probes": "the same, reduced to a number (probes only)",
    "hooks": "forward hooks, clone of every module call",
    "noop_floor": "floor: one-line probe keeping nothing",
    "keep_floor": "floor: one-line probe keeping each value",
    "reuse_floor": "floor: one-line probe copying into a reused buffer",
    "clone_floor": "floor: one-line probe keeping a clone",
}


#: glibc settings that keep freed memory in the process for reuse (see :func:`measure_elsewhere`).
KEEP_FREED_MEMORY = {
    "MALLOC_TRIM_THRESHOLD_": "2147483647",
    "MALLOC_MMAP_THRESHOLD_": "1073741824",
    "MALLOC_TOP_PAD_": "536870912",
}


@dataclass
class Measured:
    """Per-round times of each variant (keys of :data:`NAMES`), and what was probed."""

    times: Dict[str, List[float]]
    #: Call sites in Bottleneck.forward, and values recorded per forward.
    sites: int
    per_forward: int
    #: The glibc settings of :data:`KEEP_FREED_MEMORY` this process started with (unset: absent).
    malloc: Dict[str, str] = dataclasses.field(default_factory=dict)


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

    # The last value of each call (a block calls its relu three times), as keep='last' keeps
    # each call site's: 148 values, the n-th call of a module told from the others by a count
    # that a pre-hook on the model starts again at each forward.
    kept: Dict[Any, torch.Tensor] = {}
    calls_seen: Dict[Any, int] = {}
    inner = [m for block in model.modules() if isinstance(block, Bottleneck) for m in block.children()]

    def keep_clone(module: Any, args: Any, output: torch.Tensor) -> None:
        nth = calls_seen.get(module, 0)
        calls_seen[module] = nth + 1
        kept[module, nth] = output.detach().clone()

    def enter_hooks() -> None:
        state["hooks"] = [m.register_forward_hook(keep_clone) for m in inner]
        state["hooks"].append(model.register_forward_pre_hook(lambda module, args: calls_seen.clear()))

    def leave_hooks() -> None:
        for handle in state.pop("hooks"):
            handle.remove()
        if len(kept) != per_forward:
            raise RuntimeError(f"the hooks kept {len(kept)} values, not {per_forward}")
        kept.clear()

    def leave_recorded() -> None:
        state.pop("context").__exit__(None, None, None)
        if sum(len(rec.all(k)) for rec in [state.pop("rec")] for k in rec.keys()) != per_forward:
            raise RuntimeError("a call site was not recorded")

    # The floors: bcrecord's probed code, its probe (found in builtins) swapped for one line.
    by_site: Dict[Any, torch.Tensor] = {}

    def do_nothing(value: Any, site: int, instance: Any = None) -> None:
        by_site[site, id(instance)] = None  # (the site noted, as by the others: the count is checked)

    def keep_as_is(value: Any, site: int, instance: Any = None) -> None:
        by_site[site, id(instance)] = value

    def keep_a_clone(value: Any, site: int, instance: Any = None) -> None:
        by_site[site, id(instance)] = value.clone()

    def copy_into_buffer(value: Any, site: int, instance: Any = None) -> None:
        buffer = by_site.get((site, id(instance)))
        if buffer is None or buffer.shape != value.shape:
            by_site[site, id(instance)] = value.clone()
        else:
            buffer.copy_(value)

    def enter_floor(probe: Any) -> Any:
        def enter() -> None:
            enter_recorded()
            state["probe"] = getattr(builtins, PROBE_NAME)
            setattr(builtins, PROBE_NAME, probe)
            if probe is copy_into_buffer:  # its buffers made before the block: none is made in it
                with torch.no_grad():
                    model(x)

        return enter

    def leave_floor() -> None:
        setattr(builtins, PROBE_NAME, state.pop("probe"))
        state.pop("context").__exit__(None, None, None)
        if state.pop("rec").keys() or len(by_site) != per_forward:
            raise RuntimeError("a hand-written probe missed a call site, or bcrecord's ran")
        by_site.clear()

    variants = [
        core.Variant("unpatched", forward_n, ops=forwards),
        core.Variant("recorded", forward_n, enter=enter_recorded, leave=leave_recorded, ops=forwards),
        core.Variant("detached", forward_n, enter=enter_detached, leave=leave_recorded, ops=forwards),
        core.Variant("probes", forward_n, enter=enter_probes_only, leave=leave_recorded, ops=forwards),
        core.Variant("hooks", forward_n, enter=enter_hooks, leave=leave_hooks, ops=forwards),
        *(
            core.Variant(name, forward_n, enter=enter_floor(probe), leave=leave_floor, ops=forwards)
            for name, probe in [
                ("noop_floor", do_nothing),
                ("keep_floor", keep_as_is),
                ("reuse_floor", copy_into_buffer),
                ("clone_floor", keep_a_clone),
            ]
        ),
    ]
    times = core.interleave(variants, rounds)
    malloc = {key: os.environ[key] for key in KEEP_FREED_MEMORY if key in os.environ}
    return Measured(times, sites, per_forward, malloc)


#: Marks the line of ``--json`` output among whatever else the process prints.
JSON_TAG = "BCRECORD-CALLS-JSON "


def measure_elsewhere(rounds: int, forwards: int, size: int, env: Dict[str, str]) -> Measured:
    """:func:`measure` in a fresh process whose environment adds ``env``.

    glibc reads its ``MALLOC_*`` settings when the process starts, so comparing them
    (``KEEP_FREED_MEMORY`` against the defaults) takes a process each. Those settings
    are not inherited from this process: ``env={}`` runs on glibc's defaults.
    """
    inherited = {key: value for key, value in os.environ.items() if key not in KEEP_FREED_MEMORY}
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--json", "--size", str(size)]
        + ["--rounds", str(rounds), "--forwards", str(forwards)],
        env={**inherited, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    found = [line[len(JSON_TAG) :] for line in done.stdout.splitlines() if line.startswith(JSON_TAG)]
    if done.returncode != 0 or len(found) != 1:
        raise RuntimeError(f"calls.py --json failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return Measured(**json.loads(found[0]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    parser.add_argument("--size", type=int, default=64, help="input height and width (default 64)")
    parser.add_argument("--rounds", type=int, help="rounds (default 20; --quick: 3)")
    parser.add_argument("--forwards", type=int, help="forwards per timed block (default 5; --quick: 2)")
    parser.add_argument("--json", action="store_true", help="print the per-round times as one JSON line")
    args = parser.parse_args(argv)
    rounds, forwards = (3, 2) if args.quick else (20, 5)
    rounds, forwards = args.rounds or rounds, args.forwards or forwards
    core.time_block = _cpu_time_block  # CPU time: other jobs may share the machine
    measured = measure(rounds, forwards, args.size)
    if args.json:
        print(JSON_TAG + json.dumps(dataclasses.asdict(measured)))
        return 0
    times = measured.times
    summary = core.ratios(times, "recorded", "unpatched")
    print(
        f"bcrecord {bcrecord.__version__}, torch {torch.__version__}, torchvision {torchvision.__version__}"
    )
    sites = f"{measured.sites} sites x 16 blocks, 1x3x{args.size}x{args.size}"
    print(f"== resnet50 with every call site of Bottleneck.forward recorded ({sites}) ==")
    rows: List[Any] = [(text, core.ratios(times, name, "unpatched"), "") for name, text in NAMES.items()]
    rows.append(("recorded (clone) / forward hooks", core.ratios(times, "recorded", "hooks"), ""))
    core.print_table(rows, "")
    core.verdict("recorded / unpatched", summary.median, "<= 1.05x", summary.median <= 1.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
