"""Core benchmarks of bcrecord, pure Python (no torch): ratios measured side by side.

Run from the repository root (no install needed; the script puts the repository
root on ``sys.path`` itself)::

    python benchmarks/core.py            # 30 rounds, under a minute
    python benchmarks/core.py --quick    # 5 rounds, a few seconds
    python benchmarks/core.py --rounds 50

Every number printed is a *ratio* between variants timed in the same process,
never an absolute-time verdict. The variants of a case are interleaved round by
round: each round times every variant once, in an order shuffled afresh each
round (seeded, so runs repeat), with the garbage collector disabled during each
timed block. A ratio is taken per round (against the baseline timed in that same
round); the table shows the median of those per-round ratios and their
interquartile range (IQR). Median times per operation are shown for context only.

Cases:

1. **Per-event cost.** A tight loop whose body assigns one local per iteration
   (the source is printed). Variants: the plain function; a
   ``bcrecord.instrument(loop, "x")`` copy (inline probes, what a process without
   torch gets) run inside a fresh ``bcrecord.recording(copy="none")`` per timed
   block, the same inside a default ``recording()`` (``copy='clone'``: each value
   goes through a Python-level ``Sink.append`` in case it needs a copy), and a copy
   with probes spelled as calls (what a process that imported torch gets); a
   ``sys.settrace`` line recorder that reads ``frame.f_locals["x"]`` after each
   line of that function; on Python >= 3.12 a ``sys.monitoring`` recorder (LINE
   events on the loop's code object only, reading the locals through
   ``sys._getframe``); and the floor, the same loop hand-written to append ``x``
   to a list. Every variant that keeps values lets go of its previous block's
   values just before its next block, as ``with recording() as rec:`` in a loop
   does. Target (issue 2): bcrecord <= 2x the plain loop, shown beside the
   settrace recorder. Then (1c) bcrecord and the floor in rounds of their own,
   each block's values freed right after it, to show the allocator's share.
2. **Idle cost.** The instrumented copy with no recording active against the
   plain function: one long call, and many short calls. Target <= 1.10x.
3. **Patch time.** A method of about 70 instructions (count printed): (a) a
   first-time ``bcrecord.patch_method`` + ``remove`` with the rewrite cache
   cleared before each, (b) the same with the cache warm, (c) the source route
   a source-rewriting recorder takes (``inspect.getsource``, ``textwrap.dedent``,
   ``ast.parse``, one inserted call per recorded assignment, ``compile``,
   ``exec``), and (d) patching 50 instances of one class (the rewrite cache
   misses once; the time is compared to one first-time patch).
4. **``bcrecord run`` watching the program's module code.** A target of the program
   itself is patched when its module code defines it: until its last definition has
   run, a trace function watches that code. A program (printed) defines its target
   after two timed loops, each of ``n`` steps: calls of a one-line function from a
   function, and a module-level ``while`` loop of two assignments; it times them
   itself, so start-up is not counted. Variants, each a fresh process per round:
   ``python prog.py``; ``bcrecord run`` with the target defined after the loops (they
   run watched); the same program with the target defined before them (the watch
   ends there). Shown as ratios to the plain run, no target: the README's figures.
"""

from __future__ import annotations

import argparse
import ast
import dis
import gc
import importlib
import importlib.metadata
import inspect
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import bcrecord  # noqa: E402
import bcrecord.rewrite  # noqa: E402
import bcrecord.runtime  # noqa: E402

# --- the harness ---------------------------------------------------------------

#: Seed of the order variants run in, round by round (see :func:`interleave`).
ORDER_SEED = 20261130


def _noop() -> None:
    return None


@dataclass
class Variant:
    """One way of doing the work of a case; ``run`` is the timed part."""

    name: str
    run: Callable[[], None]
    #: Untimed set-up before each timed block (enter a recording, install a tracer).
    enter: Callable[[], None] = _noop
    #: Untimed tear-down after each timed block (may check what was recorded).
    leave: Callable[[], None] = _noop
    #: Operations per timed block, to report a time per operation.
    ops: int = 1


@dataclass
class Summary:
    """Median and quartiles of a list of per-round numbers."""

    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        if len(values) == 1:
            return cls(values[0], values[0], values[0])
        q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return cls(median, q1, q3)


def time_block(variant: Variant) -> float:
    """Nanoseconds per operation for one timed block of ``variant``."""
    variant.enter()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        variant.run()
        elapsed = time.perf_counter_ns() - start
    finally:
        if was_enabled:
            gc.enable()
        variant.leave()
    return elapsed / variant.ops


def interleave(
    variants: Sequence[Variant],
    rounds: int,
    warmup: int = 1,
    settle: Optional[Callable[[], None]] = None,
) -> dict[str, list[float]]:
    """Per-round ns/op of every variant; each round runs all, in a shuffled order.

    Shuffled, not rotated: a block runs faster after one that warmed the same data
    (resnet50's early layers' weights in the CPU caches: 5% measured), and a rotation
    keeps every variant behind the same neighbour round after round. A seeded
    shuffle gives each variant every predecessor in turn, and runs repeat.
    ``settle``, when given, runs (untimed) before every block, so that every block
    starts from the same state whatever ran before it.
    """
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    order = random.Random(ORDER_SEED)
    for round_number in range(warmup + rounds):
        for variant in order.sample(list(variants), len(variants)):
            if settle is not None:
                settle()
            per_op = time_block(variant)
            if round_number >= warmup:
                times[variant.name].append(per_op)
        gc.collect()
    return times


def ratios(times: dict[str, list[float]], numerator: str, denominator: str) -> Summary:
    """Summary of the per-round ratios ``numerator / denominator``."""
    return Summary.of([a / b for a, b in zip(times[numerator], times[denominator], strict=True)])


def _format_time(ns: float) -> str:
    if ns < 0:  # a difference of medians can be negative
        return "-" + _format_time(-ns)
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"


def _format_ratio(summary: Summary) -> tuple[str, str]:
    return f"{summary.median:.2f}x", f"{summary.q1:.2f}-{summary.q3:.2f}"


def print_table(rows: Sequence[tuple[str, Optional[Summary], str]], unit: str) -> None:
    """Rows of (variant, ratio summary or None for 'n/a', median time text)."""
    print(f"  {'variant':<44} {'ratio':>9} {'IQR':>13}   {unit}")
    print(f"  {'-' * 44} {'-' * 9} {'-' * 13}   {'-' * len(unit)}")
    for name, summary, when in rows:
        if summary is None:
            ratio, spread = "n/a", ""
        else:
            ratio, spread = _format_ratio(summary)
        print(f"  {name:<44} {ratio:>9} {spread:>13}   {when}")


def verdict(label: str, value: float, target: str, met: bool) -> None:
    print(f"  {label:<50} {value:>8.2f}x   target {target:<8} {'MET' if met else 'MISSED'}")


# --- case 1 and 2: the loop --------------------------------------------------


def loop(n: int) -> int:
    for i in range(n):
        x = i * 2 + 1
    return x


def loop_floor(n: int, out: list[int]) -> int:
    for i in range(n):
        x = i * 2 + 1
        out.append(x)
    return x


def assignment_lines(code: types.CodeType, name: str) -> frozenset[int]:
    """The lines of ``code`` that assign local ``name``: a line recorder reads it after them.

    >>> sorted(assignment_lines(loop.__code__, "x")) == [loop.__code__.co_firstlineno + 2]
    True
    """
    starts = dict(dis.findlinestarts(code))  # offset -> the line that starts there
    lines, line = set(), None
    for instruction in dis.get_instructions(code):
        line = starts.get(instruction.offset, line) or line
        if instruction.opname.startswith("STORE") and instruction.argval == name and line is not None:
            lines.add(line)
    return frozenset(lines)


class SettraceRecorder:
    """A ``sys.settrace`` recorder: ``frame.f_locals[name]`` at each line event (or return)
    that follows a line assigning it, once per assignment as bcrecord records it."""

    def __init__(self, code: types.CodeType, name: str) -> None:
        self.code = code
        self.name = name
        self.lines = assignment_lines(code, name)
        self.values: list[Any] = []
        self._previous: Optional[int] = None

    def _global(self, frame: types.FrameType, event: str, arg: Any) -> Optional[Callable[..., Any]]:
        if frame.f_code is self.code:
            self._previous = None
            return self._local
        return None

    def _local(self, frame: types.FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "line" or event == "return":
            if self._previous in self.lines:
                self.values.append(frame.f_locals[self.name])
            self._previous = frame.f_lineno
        return self._local

    def start(self) -> None:
        self.values = []
        sys.settrace(self._global)

    def stop(self) -> None:
        sys.settrace(None)


class MonitoringRecorder:
    """A ``sys.monitoring`` (3.12+) recorder: LINE events of one code object, locals via ``_getframe``."""

    def __init__(self, code: types.CodeType, name: str) -> None:
        self.code = code
        self.name = name
        self.lines = assignment_lines(code, name)
        self._previous: Optional[int] = None
        self.values: list[Any] = []
        monitoring = sys.monitoring  # type: ignore[attr-defined]
        self.monitoring = monitoring
        free = [t for t in range(6) if monitoring.get_tool(t) is None]
        if not free:
            raise RuntimeError("no free sys.monitoring tool id")
        preferred = monitoring.PROFILER_ID
        self.tool = preferred if preferred in free else free[0]
        monitoring.use_tool_id(self.tool, "bcrecord-benchmark")
        monitoring.register_callback(self.tool, monitoring.events.LINE, self._line)

    def _line(self, code: types.CodeType, line_number: int) -> None:
        # (The loop's back edge reports its ``for`` line after each assignment, and the
        # return line after the last: each read follows one assignment.)
        if self._previous in self.lines:
            self.values.append(sys._getframe(1).f_locals[self.name])
        self._previous = line_number

    def start(self) -> None:
        self.values = []
        self._previous = None
        self.monitoring.set_local_events(self.tool, self.code, self.monitoring.events.LINE)

    def stop(self) -> None:
        self.monitoring.set_local_events(self.tool, self.code, 0)

    def close(self) -> None:
        self.stop()
        self.monitoring.register_callback(self.tool, self.monitoring.events.LINE, None)
        self.monitoring.free_tool_id(self.tool)


BC_NAME = "bcrecord instrument + recording(copy='none')"
CLONE_NAME = "bcrecord, default recording() (copy='clone')"
CALL_NAME = "bcrecord, probes as calls, copy='none'"
FLOOR_NAME = "hand-written floor (list.append(x))"
#: Case 1c: the same, with what a block kept freed right after it.
BC_RELEASED_NAME = "bcrecord recording(copy='none'), freed after"
FLOOR_RELEASED_NAME = "hand-written floor, freed after"


def case_per_event(rounds: int, n: int) -> None:
    print("== 1. Per-event cost (one recorded local per loop iteration) ==")
    print(f"  loop body timed (n={n} iterations per block, x recorded each iteration):")
    print(textwrap.indent(inspect.getsource(loop).rstrip(), "      "))

    # Both probe spellings, chosen explicitly: 'inline' is what a process without torch
    # gets, 'call' what it gets once torch is imported (benchmarks/run.py imports it).
    # The torch layer first, where torch is: a recording entered with torch imported loads
    # it, which spells the inline probes made before as calls.
    if "torch" in sys.modules:
        importlib.import_module("bcrecord.torch")
    previous_style = bcrecord.set_probe_style("inline")
    try:
        instrumented = bcrecord.instrument(loop, "x", name="bench")
        bcrecord.set_probe_style("call")
        called = bcrecord.instrument(loop, "x", name="bench")
    finally:
        bcrecord.set_probe_style(previous_style)
    key = "bench:loop:x@0"
    # What each variant recorded in its last block. Every variant lets go of it just
    # before its next block, as ``with recording() as rec:`` in a loop does (binding
    # ``rec`` frees the previous recording) and as the settrace, monitoring and
    # hand-written variants do: kept values then come back from the allocator warm.
    # :func:`case_freed_after` lets go right after the block instead, to show what
    # the allocator's state alone costs.
    kept: dict[str, Any] = {}

    def enter(name: str, copy: str) -> Callable[[], None]:
        def enter_recording() -> None:
            kept.pop(name, None)
            kept[name] = bcrecord.recording(copy=copy).__enter__()

        return enter_recording

    def leave(name: str) -> Callable[[], None]:
        def leave_recording() -> None:
            rec = kept[name]
            rec.__exit__(None, None, None)
            got = len(rec.all(key)) if key in rec else 0
            if got != n or rec[key] != loop(n):
                raise RuntimeError(f"bcrecord recorded {got} values of x, expected {n}")

        return leave_recording

    tracer = SettraceRecorder(loop.__code__, "x")

    def leave_settrace() -> None:
        tracer.stop()
        if tracer.values != [i * 2 + 1 for i in range(n)]:
            raise RuntimeError(f"settrace recorded {len(tracer.values)} values, expected {n}")

    floor_sink: list[list[int]] = [[]]

    def enter_floor() -> None:
        floor_sink[0] = []

    variants = [
        Variant("unpatched", lambda: None if loop(n) else None),
        Variant(BC_NAME, lambda: None if instrumented(n) else None, enter(BC_NAME, "none"), leave(BC_NAME)),
        Variant(
            CLONE_NAME,
            lambda: None if instrumented(n) else None,
            enter(CLONE_NAME, "clone"),
            leave(CLONE_NAME),
        ),
        Variant(CALL_NAME, lambda: None if called(n) else None, enter(CALL_NAME, "none"), leave(CALL_NAME)),
        Variant(
            "sys.settrace line recorder (f_locals)",
            lambda: None if loop(n) else None,
            tracer.start,
            leave_settrace,
        ),
        Variant(FLOOR_NAME, lambda: None if loop_floor(n, floor_sink[0]) else None, enter_floor),
    ]
    monitor: Optional[MonitoringRecorder] = None
    if sys.version_info >= (3, 12):
        monitor = MonitoringRecorder(loop.__code__, "x")
        active_monitor = monitor

        def leave_monitoring() -> None:
            active_monitor.stop()
            values = active_monitor.values
            if values != [i * 2 + 1 for i in range(n)]:
                raise RuntimeError(f"sys.monitoring recorded {len(values)} values, expected {n}")

        monitored = Variant(
            "sys.monitoring LINE recorder (_getframe)",
            lambda: None if loop(n) else None,
            active_monitor.start,
            leave_monitoring,
        )
        variants.insert(5, monitored)
    try:
        times = interleave(variants, rounds)
    finally:
        if monitor is not None:
            monitor.close()
        sys.settrace(None)

    names = [v.name for v in variants]
    rows: list[tuple[str, Optional[Summary], str]] = []
    for name in names:
        per_iteration = statistics.median(times[name]) / n
        rows.append((name, ratios(times, name, "unpatched"), f"{per_iteration:.1f} ns/iteration"))
    if monitor is None:
        rows.insert(5, ("sys.monitoring LINE recorder (_getframe)", None, "needs Python >= 3.12"))
    print_table(rows, "median time (context only)")
    bc_name = BC_NAME
    settrace_vs_bc = ratios(times, "sys.settrace line recorder (f_locals)", bc_name)
    ratio, spread = _format_ratio(settrace_vs_bc)
    print(f"  {'settrace / bcrecord':<44} {ratio:>9} {spread:>13}")
    if monitor is not None:
        ratio, spread = _format_ratio(ratios(times, "sys.monitoring LINE recorder (_getframe)", bc_name))
        print(f"  {'sys.monitoring / bcrecord':<44} {ratio:>9} {spread:>13}")
    ratio, spread = _format_ratio(ratios(times, bc_name, FLOOR_NAME))
    print(f"  {'bcrecord / hand-written floor':<44} {ratio:>9} {spread:>13}")
    overhead = (statistics.median(times[bc_name]) - statistics.median(times["unpatched"])) / n
    print(f"  (bcrecord adds about {overhead:.0f} ns per recorded event here; context only)")
    after = case_freed_after(rounds, n, instrumented)
    print(f"  {allocator_note(times, after, n)}")
    print("  Targets:")
    bc = ratios(times, bc_name, "unpatched").median
    verdict("bcrecord inline probes, copy='none' / unpatched", bc, "<= 2x", bc <= 2.0)
    faster = settrace_vs_bc.median  # (issue 7's other target for this case)
    verdict("settrace recorder / bcrecord inline probes", faster, ">= 10x", faster >= 10.0)
    print()


def case_freed_after(rounds: int, n: int, instrumented: Callable[[int], int]) -> dict[str, list[float]]:
    """Case 1 again, each block's values freed right after it: the allocator's part.

    Freed values return their memory to the system (CPython frees empty arenas), so
    the next block that keeps values takes fresh pages; freed just before, as in
    case 1, they come back warm. The difference is the same for any recorder.
    """
    print("  1c. the same with each block's values freed right after it (diagnostic):")
    state: dict[str, Any] = {}

    def enter_recording() -> None:
        state["rec"] = bcrecord.recording(copy="none").__enter__()

    def leave_recording() -> None:
        rec = state.pop("rec")
        rec.__exit__(None, None, None)
        if len(rec.all("bench:loop:x@0")) != n:
            raise RuntimeError("bcrecord lost values")

    floor_sink: list[list[int]] = [[]]

    def fresh_list() -> None:
        floor_sink[0] = []

    variants = [
        Variant("unpatched", lambda: None if loop(n) else None),
        Variant(
            BC_RELEASED_NAME, lambda: None if instrumented(n) else None, enter_recording, leave_recording
        ),
        Variant(
            FLOOR_RELEASED_NAME,
            lambda: None if loop_floor(n, floor_sink[0]) else None,
            fresh_list,
            fresh_list,
        ),
    ]
    times = interleave(variants, rounds)
    print_table(
        [
            (name, ratios(times, name, "unpatched"), f"{statistics.median(times[name]) / n:.1f} ns/iteration")
            for name in times
        ],
        "median time (context only)",
    )
    return times


def allocator_note(kept: dict[str, list[float]], freed: dict[str, list[float]], n: int) -> str:
    """What freeing each block's values right after it adds per event (differences of medians)."""

    def extra(name: str, freed_name: str) -> str:
        per_event = (statistics.median(freed[freed_name]) - statistics.median(freed["unpatched"])) / n
        per_event -= (statistics.median(kept[name]) - statistics.median(kept["unpatched"])) / n
        return _format_time(per_event)

    return (
        f"(freed right after each block, kept values cost {extra(BC_NAME, BC_RELEASED_NAME)} more "
        f"per event with bcrecord and {extra(FLOOR_NAME, FLOOR_RELEASED_NAME)} with the "
        "hand-written loop: the allocator's share, not the probe's; context only)"
    )


def case_idle(rounds: int, n: int, calls: int) -> None:
    print("== 2. Idle cost (patched, no recording active) ==")
    patched = bcrecord.instrument(loop, "x", name="idle")
    if bcrecord.runtime.is_active():
        raise RuntimeError("a recording is active; the idle case needs none")
    same_code = patched.__code__ is loop.__code__
    print(f"  patched function runs the original code object while idle: {'yes' if same_code else 'no'}")

    def many_calls(func: Callable[[int], int]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(calls):
                func(1)

        return run

    variants = [
        Variant("unpatched loop(n)", lambda: None if loop(n) else None),
        Variant("patched, idle loop(n)", lambda: None if patched(n) else None),
        Variant("unpatched loop(1) calls", many_calls(loop), ops=calls),
        Variant("patched, idle loop(1) calls", many_calls(patched), ops=calls),
    ]
    times = interleave(variants, rounds)
    long_call = ratios(times, "patched, idle loop(n)", "unpatched loop(n)")
    short_calls = ratios(times, "patched, idle loop(1) calls", "unpatched loop(1) calls")
    rows: list[tuple[str, Optional[Summary], str]] = [
        (
            f"unpatched, one call of loop({n})",
            Summary(1.0, 1.0, 1.0),
            _format_time(statistics.median(times["unpatched loop(n)"])) + "/call",
        ),
        (
            f"patched idle, one call of loop({n})",
            long_call,
            _format_time(statistics.median(times["patched, idle loop(n)"])) + "/call",
        ),
        (
            f"unpatched, {calls} calls of loop(1)",
            Summary(1.0, 1.0, 1.0),
            _format_time(statistics.median(times["unpatched loop(1) calls"])) + "/call",
        ),
        (
            f"patched idle, {calls} calls of loop(1)",
            short_calls,
            _format_time(statistics.median(times["patched, idle loop(1) calls"])) + "/call",
        ),
    ]
    print_table(rows, "median time (context only)")
    print("  Targets:")
    verdict(f"idle patched / unpatched, loop({n})", long_call.median, "<= 1.10x", long_call.median <= 1.10)
    verdict(
        f"idle patched / unpatched, {calls} x loop(1)",
        short_calls.median,
        "<= 1.10x",
        short_calls.median <= 1.10,
    )
    print()


# --- case 3: patch time ------------------------------------------------------


class Config:
    def __init__(self) -> None:
        self.scale = 1.5
        self.shift = -0.25


class Layer:
    """A small layer whose ``forward`` is the method being patched (about 70 instructions)."""

    def __init__(self) -> None:
        self.cfg = Config()
        self.weights = [0.5, -1.0, 2.0, 0.25]

    def forward(self, xs: list[float]) -> tuple[list[float], float]:
        scale = self.cfg.scale
        shift = self.cfg.shift
        weights = self.weights
        total = 0.0
        out = []
        for i, x in enumerate(xs):
            h = x * scale + shift
            if h < 0.0:
                h = 0.0
            total += h * weights[i % len(weights)]
            out.append(h)
        mean = total / max(len(out), 1)
        return out, mean


#: Locals recorded in case 3 (every assignment of each).
RECORDED = ("h", "total", "mean")
_RECORD_CALL = "__record__"


def _insert_records(tree: ast.AST, names: Sequence[str]) -> int:
    """After each assignment to one of ``names``, insert ``__record__('name', name)``; returns how many."""
    wanted = set(names)
    inserted = 0
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if not isinstance(statements, list) or not statements or not isinstance(statements[0], ast.stmt):
                continue
            new: list[ast.stmt] = []
            for statement in statements:
                new.append(statement)
                if isinstance(statement, ast.Assign):
                    targets = [t for t in statement.targets if isinstance(t, ast.Name)]
                elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
                    targets = [statement.target] if isinstance(statement.target, ast.Name) else []
                else:
                    targets = []
                for target in targets:
                    if target.id in wanted:
                        call = ast.Call(
                            func=ast.Name(_RECORD_CALL, ast.Load()),
                            args=[ast.Constant(target.id), ast.Name(target.id, ast.Load())],
                            keywords=[],
                        )
                        new.append(ast.copy_location(ast.Expr(call), statement))
                        inserted += 1
            setattr(node, field, new)
    return inserted


def source_route(func: Callable[..., Any], names: Sequence[str]) -> types.FunctionType:
    """What a source-rewriting recorder does to get a recording copy of ``func``."""
    assert isinstance(func, types.FunctionType)
    source = inspect.getsource(func)
    tree = ast.parse(textwrap.dedent(source))
    _insert_records(tree, names)
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, func.__code__.co_firstlineno - 1)
    code = compile(tree, func.__code__.co_filename, "exec")
    namespace: dict[str, Any] = {}
    exec(code, func.__globals__, namespace)
    return namespace[func.__name__]  # type: ignore[no-any-return]


def case_patch_time(rounds: int, reps: int, instances: int) -> None:
    print("== 3. Patch time (patch_method on a ~70-instruction method) ==")
    count = len(list(dis.get_instructions(Layer.forward)))
    specs = list(RECORDED)
    print(f"  Layer.forward: {count} instructions (dis.get_instructions); recording {', '.join(specs)}")

    # The source route must produce a working function with the same behaviour.
    tree = ast.parse(textwrap.dedent(inspect.getsource(Layer.forward)))
    inserted = _insert_records(tree, RECORDED)
    recorded_calls: list[str] = []
    Layer.forward.__globals__[_RECORD_CALL] = lambda name, value: recorded_calls.append(name)
    try:
        rebuilt = source_route(Layer.forward, RECORDED)
        if rebuilt(Layer(), [1.0, -2.0]) != Layer().forward([1.0, -2.0]) or not recorded_calls:
            raise RuntimeError("the source route built a function that behaves differently")
    finally:
        del Layer.forward.__globals__[_RECORD_CALL]
    print(f"  source route inserts {inserted} record calls (one per recorded assignment)")

    def first_time() -> None:
        for _ in range(reps):
            bcrecord.rewrite.clear_cache()
            bcrecord.patch_method(Layer, "forward", specs).remove()

    def cached() -> None:
        for _ in range(reps):
            bcrecord.patch_method(Layer, "forward", specs).remove()

    def by_source() -> None:
        for _ in range(reps):
            source_route(Layer.forward, RECORDED)

    objects = [Layer() for _ in range(instances)]

    def many_instances() -> None:
        bcrecord.rewrite.clear_cache()
        patches = [bcrecord.patch_method(obj, "forward", specs) for obj in objects]
        for patch in patches:
            patch.remove()

    def warm_cache() -> None:
        bcrecord.patch_method(Layer, "forward", specs).remove()

    variants = [
        Variant("first-time patch", first_time, ops=reps),
        Variant("cached patch", cached, warm_cache, ops=reps),
        Variant("source route", by_source, ops=reps),
        Variant("instances", many_instances),
    ]
    times = interleave(variants, rounds)

    # The cache check, outside any timing.
    bcrecord.rewrite.clear_cache()
    before = bcrecord.rewrite.cache_info()["misses"]
    patches = [bcrecord.patch_method(obj, "forward", specs) for obj in objects]
    after = bcrecord.rewrite.cache_info()["misses"]
    with bcrecord.recording(copy="none") as rec:
        for obj in objects[:2]:
            obj.forward([1.0, 2.0])
    recorded_ok = len(rec.all("Layer:forward:mean@0")) == 2
    for patch in patches:
        patch.remove()
    if not recorded_ok or "forward" in vars(objects[0]):
        raise RuntimeError("patching instances did not record, or remove() left the instance patched")

    def when(name: str, per: str = "/patch") -> str:
        return _format_time(statistics.median(times[name])) + per

    rows: list[tuple[str, Optional[Summary], str]] = [
        ("(a) first-time patch + remove (cache cleared)", Summary(1.0, 1.0, 1.0), when("first-time patch")),
        (
            "(b) cached patch + remove",
            ratios(times, "cached patch", "first-time patch"),
            when("cached patch"),
        ),
        (
            "(c) source route (getsource..exec)",
            ratios(times, "source route", "first-time patch"),
            when("source route", "/function"),
        ),
        (
            f"(d) {instances} instance patches + removes",
            ratios(times, "instances", "first-time patch"),
            when("instances", f"/{instances} patches"),
        ),
    ]
    print("  ratios to (a), one first-time patch:")
    print_table(rows, "median time (context only)")
    print("  source route compared with bcrecord:")
    for label, denominator in (
        ("source route / first-time patch", "first-time patch"),
        ("source route / cached patch", "cached patch"),
    ):
        ratio, spread = _format_ratio(ratios(times, "source route", denominator))
        print(f"  {label:<44} {ratio:>9} {spread:>13}")
    grown = after - before
    status = "as expected" if grown == 1 else "UNEXPECTED (expected +1)"
    print(
        f"  rewrite cache misses over {instances} instance patches: {before} -> {after} (+{grown}, {status})"
    )
    print()


# --- case 4: bcrecord run's watch of the program's module code ---------------

#: The watched program: ``{early}`` or ``{late}`` is where it defines its target.
WATCHED_PROGRAM = """\
import json
import time

N = {n}


def one_line():
    return 1


def call_many(n):
    for _ in range(n):
        one_line()


{early}start = time.perf_counter_ns()
call_many(N)
calls_ns = time.perf_counter_ns() - start
start = time.perf_counter_ns()
i = 0
while i < N:
    i += 1
    j = i
loop_ns = time.perf_counter_ns() - start
{late}
print(json.dumps({{"calls": calls_ns / N, "loop": loop_ns / N, "x": target()}}))
"""

WATCHED_TARGET = "def target():\n    x = 1\n    return x\n"


def watched_program(n: int, defined_first: bool) -> str:
    """The source of case 4's program, its target defined before or after the timed loops."""
    early, late = (WATCHED_TARGET, "") if defined_first else ("", WATCHED_TARGET)
    return WATCHED_PROGRAM.format(n=n, early=early, late=late)


def run_program(path: Path, watched: bool) -> dict[str, float]:
    """Per-step ns of the program's two loops, run plainly or under ``bcrecord run``.

    Raises where it fails, or where ``bcrecord run`` did not record its target once.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, str(path)]
    if watched:
        command[1:1] = ["-m", "bcrecord", "run", "-r", "__main__:target:x"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    if watched and "__main__:target:x@0  1       1" not in result.stderr:
        raise RuntimeError(f"bcrecord run did not record x once:\n{result.stderr[-2000:]}")
    times: dict[str, float] = json.loads(result.stdout.splitlines()[-1])
    return times


def case_watched_program(rounds: int, n: int) -> None:
    print("== 4. bcrecord run: the program's module code watched until its target's def has run ==")
    source = watched_program(n, defined_first=False)
    print(textwrap.indent(source, "    | ", predicate=lambda line: True), end="")
    variants = {
        "plain": (False, False),  # python prog.py (its target defined last)
        "watched": (False, True),  # bcrecord run, the target defined last: both loops watched
        "defined first": (True, True),  # bcrecord run, the target defined before the loops
    }
    times: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    order = random.Random(ORDER_SEED)
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        for first in (False, True):
            paths[first] = Path(folder) / f"prog_{'first' if first else 'last'}.py"
            paths[first].write_text(watched_program(n, first))
        for round_number in range(1 + rounds):  # (the first round warms the disk cache: untimed)
            for name in order.sample(list(variants), len(variants)):
                first, watched = variants[name]
                measured = run_program(paths[first], watched)
                if round_number:
                    times[name].append(measured)
    rows: list[tuple[str, Optional[Summary], str]] = []
    for loop_name, label in (
        ("calls", "call of a one-line function"),
        ("loop", "module-level while loop step"),
    ):
        for name in variants:
            per_round = [t[loop_name] for t in times[name]]
            summary = Summary.of([a / b[loop_name] for a, b in zip(per_round, times["plain"], strict=True)])
            when = _format_time(statistics.median(per_round)) + "/step"
            rows.append((f"{label}: {name}", summary, when))
    print("  ratios to the plain run of the same loop (a fresh process per variant and round):")
    print_table(rows, "median time (context only)")
    print()


# --- main --------------------------------------------------------------------


def header(mode: str, rounds: int) -> None:
    try:
        bytecode_version = importlib.metadata.version("bytecode")
    except importlib.metadata.PackageNotFoundError:
        import bytecode

        bytecode_version = getattr(bytecode, "__version__", "unknown")
    print(f"bcrecord core benchmarks ({mode}: {rounds} interleaved rounds per case)")
    print(f"  Python    {sys.version.split()[0]} ({platform.python_implementation()}) {sys.executable}")
    print(f"  platform  {platform.platform()}, {platform.machine()}")
    where = Path(bcrecord.__file__).parent
    print(f"  bytecode  {bytecode_version}; bcrecord {bcrecord.__version__} from {where}")
    print("  ratio = median over rounds of (variant / baseline timed in the same round); IQR of those ratios")
    print()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5 rounds and smaller blocks (a few seconds)")
    parser.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    args = parser.parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 30)
    if rounds < 1:
        parser.error("--rounds must be at least 1")
    started = time.perf_counter()
    header("quick" if args.quick else "normal", rounds)
    if args.quick:
        case_per_event(rounds, n=50_000)
        case_idle(rounds, n=50_000, calls=50_000)
        case_patch_time(rounds, reps=5, instances=50)
        case_watched_program(rounds, n=20_000)
    else:
        case_per_event(rounds, n=200_000)
        case_idle(rounds, n=200_000, calls=200_000)
        case_patch_time(rounds, reps=20, instances=50)
        case_watched_program(rounds, n=100_000)
    print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
