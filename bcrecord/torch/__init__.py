"""The torch layer: record anything inside an ``nn.Module``.

Install with ``pip install bcrecord[torch]``; ``import bcrecord`` alone never imports
torch.

>>> import torch
>>> from bcrecord.torch import record
>>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
>>> with record(net, "0") as rec:
...     y = net(torch.ones(1, 3))
>>> rec["0:forward:return"].shape
torch.Size([1, 3])

* :func:`record` — a context manager yielding the recording of target strings
  such as ``'layer1.0:forward:out@2'``, ``':_forward_impl:x@0'`` or ``'layer1'``.
* :func:`create_feature_extractor` — a drop-in for torchvision's, that also takes
  local and attribute targets and needs no tracing.
* :func:`list_targets` — every recordable target per submodule.

Tensor values are detached clones by default (see :mod:`bcrecord.torch.copies`).
Under ``torch.compile`` the probe runs outside the graph (once this package is
imported, Dynamo skips it and everything it calls, as ``torch.compiler.disable``
would), so compiled models record correctly, with a graph break wherever a probe runs
(a module's probes are in its class's method: at every instance of that class).
``torch.jit.script`` compiles a model's Python source, not its bytecode: a scripted
module (scripted inside a block or not) records nothing; record the Python model.
``torch.jit.trace`` inside a block records the runs it traces (the trace and its
check); the traced module it returns records nothing.
"""

from __future__ import annotations

try:
    import torch
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("bcrecord.torch needs PyTorch: pip install 'bcrecord[torch]'") from error

import functools
import sys
import warnings
import weakref
from typing import Any, Callable, List, Mapping, Optional, Tuple

from .. import patch as _patch
from .. import runtime as _runtime
from . import copies  # noqa: F401  (registers tensor copies)
from . import record as _record_module
from .extractor import FeatureExtractor, create_feature_extractor, list_targets
from .record import ModelRecording, RecordBlock, StopForward, _GradientHook, patched_classes, record
from .targets import Target, expand, unwrap

__all__ = [
    "FeatureExtractor",
    "ModelRecording",
    "StopForward",
    "Target",
    "create_feature_extractor",
    "expand",
    "list_targets",
    "record",
    "unwrap",
]


def _probe_outside_dynamo() -> None:
    """Make torch.compile call the probe eagerly, with everything it calls.

    Tracing into the probe would turn its bookkeeping into graph side effects (and
    lose values on the first compiled call), and letting Dynamo compile the frames
    the probe calls (copies, reduce functions) would run them on fake tensors. So
    the core probe is marked for Dynamo to skip (a graph break at each probe site,
    never inlined), and it switches Dynamo's frame evaluation off around each
    delivery when it runs inside compiled code
    (:func:`bcrecord.runtime.set_frame_switch`). That is what the public
    ``torch.compiler.disable`` wrapper does too, but its Python (stance and export
    checks) runs on every recorded value: measured in benchmarks/RESULTS.md case
    1b, and after a forward has evicted the interpreter from the CPU caches it cost
    tens of microseconds per extractor call. The wrapper remains the fallback where
    torch lacks the pieces used here.

    The marks need Dynamo, whose import takes longer than torch's own (0.65 s against
    0.73 s, torch 2.13, CPU): they are made when the program imports it (torch.compile
    does), before it compiles anything; now, where it has already.
    """
    core = _runtime.__bcrecord_probe__
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame
    except ImportError:  # pragma: no cover - depends on the torch build
        _disabled_in_dynamo(core)
        return
    _runtime.set_frame_switch(set_eval_frame)
    # What Dynamo's error gives as the reason where a graph break is refused
    # (fullgraph=True, strict export): otherwise "reason: None", with a hint to remove the call.
    core._torchdynamo_disable_msg = _NO_FULLGRAPH  # type: ignore[attr-defined]
    # An extractor's forward breaks the graph first where it looks up its plan: the reason
    # given where that is refused (with none, the lock a later line takes was named).
    FeatureExtractor._plan._torchdynamo_disable_msg = _NO_FULLGRAPH_EXTRACTOR  # type: ignore[attr-defined]
    # An extractor's first call in a mode resolves its targets and patches: bookkeeping
    # for Dynamo to run, not trace (traced, a compiled extractor's plan for its second
    # mode came out with the first mode's targets). Once per mode: the wrapper's cost is nothing.
    # So is the making of its recordings (one per call running at a time). A record() block
    # in a compiled function: Dynamo runs that function eagerly (it cannot enter the block)
    # but compiled the frames the block's entry and exit call, warning of the builtins it
    # cannot trace there. Not torch.compiler.disable: a warning of the block's would point at
    # that wrapper's line, not the user's.
    for holder, name in _RUN_EAGERLY:
        setattr(holder, name, _without_dynamo(getattr(holder, name), set_eval_frame))
    globals()["record"] = _record_module.record  # (the name this package gives it too)
    _unmarked.extend([core, FeatureExtractor._plan, *(getattr(cls, name) for cls, name in _RUN_EAGERLY)])
    if "torch._dynamo" not in sys.modules:
        from ..runner import _ImportHook  # (the same hook `bcrecord run` patches modules with)

        hook = _ImportHook(["torch._dynamo"], lambda module: _skipped_by_dynamo())
        _unmarked_hook.append(hook)
        sys.meta_path.insert(0, hook)
        if "torch._dynamo" not in sys.modules:  # (not begun by another thread meanwhile)
            return
    # Imported, or being imported by another thread: this import waits for it to be done.
    import torch._dynamo  # noqa: F401

    _skipped_by_dynamo()


#: Methods Dynamo runs eagerly, with everything they call (see _probe_outside_dynamo).
_RUN_EAGERLY: List[Tuple[Any, str]] = [
    (FeatureExtractor, "_first_in_mode"),
    (FeatureExtractor, "_new_recording"),
    # record() called in a compiled function, with its block: traced, it broke the graph in
    # reprlib and was traced again on every call.
    (_record_module, "record"),
    (RecordBlock, "__enter__"),
    (RecordBlock, "__exit__"),
    # A .grad target's hook, which a backward inside a compiled function runs.
    (_GradientHook, "__call__"),
]


#: What Dynamo is to skip, until it is imported (the probe first), and the import hook waiting for it.
_unmarked: List[Callable[..., Any]] = []
_unmarked_hook: List[Any] = []


def _skipped_by_dynamo() -> None:
    """Mark what :data:`_unmarked` holds for Dynamo to skip (it calls them, never traces them),
    once: when the program imports Dynamo, or, where a finder of its own imported it past the
    import hook, when a recording next starts or ends (before its probes run)."""
    functions, _unmarked[:] = list(_unmarked), []
    for hook in _unmarked_hook:
        hook.close()
    _unmarked_hook.clear()
    if not functions:
        return
    try:
        from torch._dynamo.decorators import skip
    except ImportError:  # pragma: no cover - depends on the torch build
        _disabled_in_dynamo(functions[0])
        return
    for function in functions:
        skip(function)  # (marks its code, and returns it: what holds it keeps it)


def _disabled_in_dynamo(core: Callable[..., Any]) -> None:
    """Where torch lacks the pieces used here: the probe wrapped by ``torch.compiler.disable``."""
    import builtins

    setattr(builtins, _runtime.PROBE_NAME, torch.compiler.disable(core, recursive=True))


def _without_dynamo(method: Callable[..., Any], switch: Callable[[Any], Any]) -> Callable[..., Any]:
    """``method``, run with Dynamo's frame evaluation off (``switch`` is its ``set_eval_frame``), as
    ``torch.compiler.disable`` runs it, from a frame of bcrecord's own, which warnings pass over."""

    @functools.wraps(method)
    def eager(*args: Any, **kwargs: Any) -> Any:
        prior = switch(None)
        try:
            return method(*args, **kwargs)
        finally:
            switch(prior)

    return eager


#: Why a recorded model cannot compile to one graph (shown in Dynamo's error).
_NO_FULLGRAPH = (
    "bcrecord records a value here, outside the graph (a graph break wherever it records), so "
    "torch.compile(fullgraph=True) and torch.export.export(strict=True) refuse a recorded model: "
    "compile or export it outside record() (or bcrecord.recording(), around a patch) and extractors "
    "(forward hooks trace into the graph)"
)

#: Why a feature extractor cannot compile to one graph (shown in Dynamo's error).
_NO_FULLGRAPH_EXTRACTOR = (
    "a bcrecord feature extractor records outside the graph (graph breaks), so "
    "torch.compile(fullgraph=True) and torch.export.export(strict=True) refuse it: compile it "
    "without fullgraph=True, or export it with strict=False (the default; its features are the "
    "exported graph's outputs)"
)


class _CompiledCode:
    """Keeps ``torch.compile``'s cached graphs in step with the code bcrecord swaps in.

    Dynamo caches what it compiled per code object and inlines the ``forward`` of
    submodules into the caller's graph, guarding on the module's type but not on its
    method's ``__code__`` (it assumes ``__code__`` is never reassigned). A model
    compiled while a patched method ran its original code would keep running that
    graph once probes are swapped in, and record nothing. So when probed code goes
    in after Dynamo compiled something while that code was out, the graphs that may
    run the method are dropped and the next call compiles with the probes. Graphs
    compiled while probes were in keep them (they deliver to whatever records at the
    time, nothing when nothing does), so an extractor or a long ``record()``
    recompiles once, not on every call.

    Only the graphs that may run the method go (see :func:`_drop_graphs_holding`):
    a compiled model elsewhere in the process keeps its own, where dropping them all
    would recompile it after every extractor call. Where Dynamo's internals lack what
    that reads, every cached graph is dropped (``torch._dynamo.reset_code_caches``).
    """

    def __init__(self) -> None:
        #: Dynamo's count of compiled graphs when this last dropped every cached graph.
        self.dropped_at = 0
        #: The count when each probed code was last taken out, or its graphs last dropped.
        self.out_at: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        #: Dynamo's counters (one object for the process), found at the first swap.
        self.counters: Optional[Mapping[str, Mapping[str, int]]] = None
        #: Dynamo's count of graphs last seen, and its 'stats' counter then (a new one once
        #: the counters were cleared, as tests and benchmarks do, or reset() did).
        self.seen = 0
        self.stats: Optional[Mapping[str, int]] = None
        #: What the count is offset by: from a clear on, the count at the last swap.
        self.base = 0
        #: The count (offset) at the last swap.
        self.compiled = 0

    def __call__(self, code: Any, armed: bool, function: Any) -> None:
        # This runs twice per extractor call, right after a forward has evicted the
        # interpreter from the CPU caches: each lookup avoided there saves microseconds.
        counters = self.counters
        if counters is None:
            # Dynamo never loaded, or being loaded by another thread (no counters yet): nothing compiled.
            counters = getattr(getattr(sys.modules.get("torch._dynamo"), "utils", None), "counters", None)
            if counters is None:
                return
            self.counters = counters
        if _unmarked:  # Dynamo imported past the import hook (a finder of the program's own)
            dynamo = sys.modules["torch._dynamo"]
            if not getattr(getattr(dynamo, "__spec__", None), "_initializing", False):  # (all of it)
                _skipped_by_dynamo()
        stats = counters.get("stats")  # (not [...]: Counter's __missing__ is Python code)
        seen = 0 if stats is None else stats.get("unique_graphs", 0)
        if stats is not self.stats or seen < self.seen:
            if self.stats is not None or seen < self.seen:  # the counters were cleared
                # Counted on from the last swap: graphs compiled since the clear count as
                # newer. (Not every graph: those of models run while recording is off would
                # be dropped at each swap, and recompile again and again.)
                self.base = self.compiled
            self.stats = stats
        self.seen = seen
        compiled = self.compiled = self.base + seen
        # Nothing compiled since the last drop (always, in eager code): the comparisons below
        # would find nothing to do, so the weak dictionary (Python code) is left alone.
        if compiled <= self.dropped_at:
            return
        if not armed:
            self.out_at[code] = compiled
        elif compiled > self.out_at.get(code, 0):
            if _drop_graphs_holding(function):
                self.out_at[code] = compiled
                return
            dynamo = sys.modules["torch._dynamo"]
            # reset() where this lighter one is missing: it drops the counters too.
            drop = getattr(dynamo, "reset_code_caches", None) or dynamo.reset
            drop()
            self.dropped_at = compiled


def _drop_graphs_holding(function: Any) -> bool:
    """Drop Dynamo's cached graphs that may run ``function``; False where it cannot tell which.

    A graph that inlined a method is guarded on the type of the module it was called
    on, or, where it reached the module by looping over a container, on the type of
    the module whose frame was compiled, one on the way to it; one that inlined a
    function on the function itself. The graphs of a frame whose guards name the
    function, or one of those classes or their subclasses (by ``id``, as Dynamo's
    guards print them), are dropped, with every graph of that frame.
    """
    ids = _ids_guards_name(function)
    if ids is None:
        return False
    try:
        from torch._C._dynamo.eval_frame import reset_code
        from torch._dynamo import config, convert_frame
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        # Guarded on instances where it is off, unless it is deprecated: always on, whatever it says.
        entry = getattr(config, "_config", {}).get("inline_inbuilt_nn_modules")
        if entry is None or not getattr(entry, "deprecated", False):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if not getattr(config, "inline_inbuilt_nn_modules", True):
                    return False
        stale = []
        for ref in list(convert_frame.input_codes.seen):
            frame_code = ref()
            if frame_code is None:
                continue
            for entry in _debug_get_cache_entry_list(frame_code):
                parts = entry.guard_manager.code_parts
                if not parts or any(name in part for part in parts for name in ids):  # (none: unknown)
                    stale.append(frame_code)
                    break
    except Exception:  # (ImportError, AttributeError: another torch's internals)
        return False
    for frame_code in stale:
        reset_code(frame_code)
    return True


def _ids_guards_name(function: Any) -> Optional[List[str]]:
    """The ``id()`` of ``function``, of the recorded modules' classes that run it and of the
    modules' on the way to them (with their subclasses), as text; None for a function no
    model's recording patched (where the graphs that may run it are not known)."""
    classes: List[type] = []
    for patch, kinds in list(patched_classes.get(function, {}).items()):
        if patch.active:  # (a removed patch's model is no longer recorded)
            alive = [kind() for kind in kinds]  # (held weakly: see patched_classes)
            classes += [kind for kind in alive if kind is not None and kind not in classes]
    if not classes:
        return None
    for cls in classes:  # (grows as it goes: every subclass)
        if cls is torch.nn.Module:
            # A plain Module holding the targets (on the way to them): its subclasses are every
            # model, whose graphs would all go at every swap.
            continue
        subclasses: List[type] = type.__subclasses__(cls)
        classes += [sub for sub in subclasses if sub not in classes]
    return [str(id(item)) for item in [function, *classes]]


_probe_outside_dynamo()
_patch.set_swap_hook(_CompiledCode())
# Patches made before torch was imported call a constant Dynamo cannot trace (it
# raises): give them the call spelling, which it skips.
_patch.respell_inline()
