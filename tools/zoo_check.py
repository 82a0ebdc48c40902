"""Sweep timm's model registry: does recording every local change anything, and is it right?

For each model (``timm.list_models()``, filtered by ``--pattern``, sampled by
``--seed``, cut by ``--limit``) this tool, in a worker process:

1. **builds** it (``pretrained=False``, ``torch.manual_seed(seed)``, eval mode) --
   first on the ``meta`` device to count parameters (``--max-params``), then for
   real within ``--budget`` seconds; a model that fails to build, or whose build
   or one plain forward exceeds the budget, is reported as *did not build / too
   slow* and not checked further;
2. picks the **input**: ``timm.data.resolve_data_config`` gives the default size;
   models whose pretrained config does not say ``fixed_input_size`` run at a
   smaller size (``--small``, 128 by default) when that works, else at the default;
3. runs the **unpatched** model twice (``torch.manual_seed`` before each run,
   ``torch.no_grad()``): the output, and a determinism check;
4. runs it once more under a ``sys.settrace`` **reference** reader (below);
5. **patches** every ``forward``-like method (``forward``, ``forward_*``,
   ``_forward*``, ``*_forward``: ``forward_features``, ``forward_head``,
   ``_forward_impl``, ``_conv_forward``...) that any class in the MRO of any
   submodule's class defines in Python -- torch.nn's own classes included -- with
   every local spec :func:`bcrecord.targets` lists: one class-level
   :func:`bcrecord.patch_method` per (class, method), ``name=`` a callable that maps
   an instance to ``'<module path>|<code qualname>'`` through a dict
   ``id(module) -> path`` (instances outside the model are not recorded);
6. runs the same input inside ``bcrecord.recording(copy='clone')`` and checks the
   output is **bitwise identical** to the unpatched output;
7. compares the **recorded values** with the reference, removes every patch,
   checks each patched class's ``__dict__`` (and each function's ``__code__``) is
   exactly what it was, and runs the model once more (still identical);
8. tries torchvision's FX ``create_feature_extractor(model, return_nodes=[leaf])``
   where ``leaf`` is the last leaf module the forward ran, and runs it.

The reference
-------------
An independent reader of the *original* code: a ``sys.settrace`` tracer that, for
frames whose code object is one of the original forward-like code objects and
whose first argument is a module of the model, turns on opcode events
(``frame.f_trace_opcodes``). The store instructions of each code object come from
:mod:`dis` (``STORE_FAST``/``STORE_DEREF``), not from bcrecord. At each opcode
event, if the instruction executed just before in that frame was a store of
``name``, the tracer reads ``frame.f_locals[name]`` -- the value right after that
store -- and keeps a detached clone. Line events are not enough: they fire before
a line runs, so they miss all but the last of several stores to one name on one
line (``y = x; x = x * 2``, one-line loops) and cannot tell a store that kept the
value (``x = x.contiguous()``, in-place ``x += 1`` on a tensor) from no store, nor
an in-place change (``x.mul_(2)``) from a store. Opcode events see each store.

The one store CPython adds that is not an assignment -- ``name = None`` right
before ``del name`` at the end of an ``except ... as name`` block -- is skipped
(a ``STORE_*`` immediately followed by ``DELETE_*`` of the same name).

The comparison rule: per ``(module path, code qualname, local name)``, the list of
every value bcrecord recorded for that name (all its assignment indexes ``x@0``,
``x@1``..., merged in execution order) must equal, element by element and with
the same length, the list the reference saw. Execution order across indexes comes
from a second patch stacked on the same method, recording the same sites into a
second recording with a ``copy=`` callable that returns a global sequence number.
Values are equal when: tensors have the same dtype, shape and device and the same
bytes (so ``NaN == NaN`` and ``-0.0 != 0.0``); lists, tuples and dicts are equal
element by element; modules are the same object; scalars, strings, dtypes and
sizes are ``==``; any other object only needs the same type (objects made during
a forward differ from run to run). A name the reference saw stored that bcrecord
lists no site for is a mismatch too. With ``--all-sites`` the values patch also
takes every call, operator, attribute-load and return site (outputs must still be
identical; returns are compared with the tracer's ``return`` events).

Results are JSON lines (``--out DIR/results.jsonl``), written after each model,
so ``--resume`` skips models already there. A summary table and a failure list
(the first error line of each) are printed and written to ``DIR/summary.md``.

Usage (from anywhere; the repository root is put on ``sys.path`` here)::

    python tools/zoo_check.py --pattern 'resnet18' --out /tmp/zoo
    python tools/zoo_check.py --seed 0 --limit 60 --out /tmp/zoo --max-minutes 35
    python tools/zoo_check.py --pattern 'resnet*' --pattern 'vit_*' --limit 20 --out /tmp/zoo --resume

Exit status: 0 when every checked model gave identical outputs and
reference-equal records with its classes restored, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dis
import fnmatch
import gc
import inspect
import itertools
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time
import traceback
import types
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Method names patched on every class: forward, forward_*, _forward*, *_forward.
FORWARD_LIKE = re.compile(r"^(forward|forward_\w+|_forward\w*|\w+_forward)$")
_LOCAL_LABEL = re.compile(r"^(?P<name>[A-Za-z_]\w*)@\d+$")
_MAX_MISMATCHES = 5


# --- configuration and small helpers -----------------------------------------------------


@dataclass
class Config:
    """What a worker needs to check one model (sent to it as JSON)."""

    budget: float = 30.0
    seed: int = 0
    threads: int = 1
    small: int = 128
    max_params: float = 250e6
    all_sites: bool = False
    fx: bool = True


class TooSlow(BaseException):
    """Raised by the alarm when a step exceeds its time budget (a BaseException, so
    that a model's own ``except Exception`` does not swallow it)."""


def first_line(error: BaseException) -> str:
    """``'TypeError: the first line of the message'``, at most 300 characters."""
    text = str(error).strip().splitlines()
    line = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    return line[:300]


@contextlib.contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise :class:`TooSlow` in the main thread if the block runs over ``seconds``."""

    def alarm(signum: int, frame: Any) -> None:
        raise TooSlow(f"{what} took more than {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def current_rss_mb() -> float:
    """Resident memory of this process in MiB (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


# --- values: copies for the reference, and equality -----------------------------------


def snapshot(value: Any) -> Any:
    """The reference's own copy of a value: tensors detached and cloned, containers rebuilt."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [snapshot(item) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _bytes_equal(a: Any, b: Any) -> bool:
    import torch

    if a.numel() == 0:
        return True
    if a.layout != torch.strided or a.is_quantized:
        return bool(torch.equal(a, b))
    try:
        return bool(
            torch.equal(
                a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
            )
        )
    except RuntimeError:
        return bool(torch.equal(a, b))


def same(a: Any, b: Any) -> bool:
    """Equality as documented in the module docstring (bitwise for tensors)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        return _bytes_equal(a, b)
    if isinstance(a, torch.nn.Module) or isinstance(b, torch.nn.Module):
        return a is b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, set, frozenset)) and isinstance(b, (list, tuple, set, frozenset)):
        if isinstance(a, (set, frozenset)):
            return isinstance(b, (set, frozenset)) and len(a) == len(b)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    if isinstance(a, (int, str, bytes, type(None), torch.dtype, torch.device, complex)):
        return type(a) is type(b) and a == b
    return type(a) is type(b)


def describe(value: Any) -> str:
    """A short description of a value for mismatch reports."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)} {value.dtype}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[{len(value)}]"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def difference(a: Any, b: Any) -> str:
    """Why two values differ, briefly."""
    import torch

    if (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and a.dtype == b.dtype
    ):
        if a.is_floating_point():
            diff = (a.double() - b.double()).abs()
            return f"{describe(a)}: max |diff| {float(diff.nan_to_num(float('inf')).max()):.3g}"
        return f"{describe(a)}: {int((a != b).sum())} elements differ"
    return f"{describe(a)} vs {describe(b)}"


# --- the reference: a settrace reader of each store ----------------------------------------


@dataclass
class CodeInfo:
    """What the reference needs about one original code object."""

    qualname: str
    self_name: str
    #: Offset of each store instruction -> the local it stores.
    stores: Dict[int, str]


def store_offsets(code: types.CodeType) -> Dict[int, str]:
    """Offsets of the instructions that store a local, from :mod:`dis` alone."""
    instructions = list(dis.get_instructions(code))
    out: Dict[int, str] = {}
    for position, ins in enumerate(instructions):
        if ins.opname not in ("STORE_FAST", "STORE_DEREF"):
            continue
        following = instructions[position + 1] if position + 1 < len(instructions) else None
        if (
            following is not None
            and following.opname in ("DELETE_FAST", "DELETE_DEREF")
            and following.argval == ins.argval
        ):
            continue  # `except ... as name` cleanup: name = None; del name
        out[ins.offset] = ins.argval
    return out


class StoreTracer:
    """``sys.settrace`` reader: the value of each local right after each store."""

    def __init__(self, infos: Dict[types.CodeType, CodeInfo], paths: Dict[int, str], returns: bool) -> None:
        self.infos = infos
        self.paths = paths
        self.returns = returns
        self.values: Dict[Tuple[str, str, str], List[Any]] = defaultdict(list)
        self.frames = 0

    def __call__(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        info = self.infos.get(frame.f_code)
        if info is None:
            return None
        path = self.paths.get(id(frame.f_locals.get(info.self_name)))
        if path is None:
            return None
        self.frames += 1
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        stores, log, last = info.stores, self.values, [-1]
        qualname, returns = info.qualname, self.returns

        def local(frame: types.FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                name = stores.get(last[0])
                if name is not None:
                    found = frame.f_locals
                    if name in found:
                        log[(path, qualname, name)].append(snapshot(found[name]))
                last[0] = frame.f_lasti
            elif event == "return" and returns:
                log[(path, qualname, "return")].append(snapshot(arg))
            return local

        return local


# --- one model ------------------------------------------------------------------------------


@dataclass
class Method:
    """One forward-like method of one class."""

    cls: type
    attribute: str
    raw: Any
    function: types.FunctionType
    qualname: str


def forward_like_methods(model: Any) -> Tuple[List[Method], List[str]]:
    """Every forward-like plain method defined by a class in any submodule's MRO."""
    import torch

    seen: set = set()
    methods: List[Method] = []
    skipped: List[str] = []
    for module in model.modules():
        for cls in type(module).__mro__:
            if cls in (torch.nn.Module, object):
                continue
            for attribute, raw in list(vars(cls).items()):
                if not FORWARD_LIKE.match(attribute) or (cls, attribute) in seen:
                    continue
                seen.add((cls, attribute))
                if not isinstance(raw, types.FunctionType):
                    if callable(raw) or isinstance(raw, (staticmethod, classmethod)):
                        skipped.append(f"{cls.__qualname__}.{attribute}: {type(raw).__name__}, not a method")
                    continue
                function = inspect.unwrap(raw)
                if not isinstance(function, types.FunctionType):
                    skipped.append(f"{cls.__qualname__}.{attribute}: wraps a non-Python callable")
                    continue
                code = function.__code__
                if not code.co_argcount:
                    skipped.append(f"{cls.__qualname__}.{attribute}: no positional self argument")
                    continue
                qualname = getattr(code, "co_qualname", function.__qualname__)
                methods.append(Method(cls, attribute, raw, function, qualname))
    return methods, skipped


class _Owner:
    """``name=`` of one patch: the instance's module path (and the method's qualname)."""

    def __init__(self, paths: Dict[int, str], qualname: str) -> None:
        self.paths = paths
        self.qualname = qualname

    def __call__(self, instance: Any) -> Optional[str]:
        path = self.paths.get(id(instance))
        return None if path is None else f"{path}|{self.qualname}"


@dataclass
class Outcome:
    """The result of one model (one JSON line)."""

    model: str
    status: str = "ok"
    stage: str = ""
    error: str = ""
    params: Optional[int] = None
    input_size: Optional[List[int]] = None
    built: bool = False
    ran: bool = False
    deterministic: Optional[bool] = None
    identical: Optional[bool] = None
    reference_equal: Optional[bool] = None
    restored: Optional[bool] = None
    after_identical: Optional[bool] = None
    bcrecord_ok: Optional[bool] = None
    classes: int = 0
    methods_patched: int = 0
    methods_skipped: List[str] = field(default_factory=list)
    sites: int = 0
    recorded_values: int = 0
    reference_values: int = 0
    reference_frames: int = 0
    compared_keys: int = 0
    mismatches: List[str] = field(default_factory=list)
    mismatch_count: int = 0
    patch_errors: List[str] = field(default_factory=list)
    #: --all-sites specs bcrecord refused up front (documented limitations), not failures.
    limitations: List[str] = field(default_factory=list)
    record_errors: List[str] = field(default_factory=list)
    fx_node: str = ""
    fx_ok: Optional[bool] = None
    fx_value_equal: Optional[bool] = None
    fx_error: str = ""
    times: Dict[str, float] = field(default_factory=dict)
    rss_mb: float = 0.0


def _meta_params(name: str) -> Optional[int]:
    import timm
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.device("meta"):
                model = timm.create_model(name, pretrained=False)
        return sum(p.numel() for p in model.parameters())
    except Exception:
        return None


def _input_sizes(model: Any, small: int) -> List[Tuple[int, ...]]:
    from timm.data import resolve_data_config

    size = tuple(int(v) for v in resolve_data_config({}, model=model)["input_size"])
    cfg = getattr(model, "pretrained_cfg", None) or {}
    sizes = [size]
    if small and not cfg.get("fixed_input_size", False) and len(size) == 3 and max(size[1:]) > small:
        sizes.insert(0, (size[0], min(size[1], small), min(size[2], small)))
    return sizes


def _leaf_order(model: Any) -> Tuple[List[Any], List[Tuple[str, Any]]]:
    """Hooks recording which leaf modules ran, in order, and their latest outputs."""
    ran: List[Tuple[str, Any]] = []
    handles = []
    for path, module in model.named_modules():
        if path and not any(True for _ in module.children()):
            handles.append(
                module.register_forward_hook(lambda m, i, o, path=path: ran.append((path, snapshot(o))))
            )
    return handles, ran


def _usable_extras(method: Method, specs: List[str], owner: _Owner, limitations: List[str]) -> List[str]:
    """The non-local specs (``--all-sites``) that bcrecord accepts here, one by one.

    bcrecord refuses some sites up front with a clear error (a call inside a 3.11
    comprehension cannot be probed by a per-instance patch): those are limitations,
    listed, not failures; the locals are checked regardless.
    """
    import bcrecord

    extras = [spec for spec in specs if not _LOCAL_LABEL.match(spec)]
    try:
        bcrecord.patch_method(method.cls, method.attribute, extras, name=owner, in_place=True).remove()
        return extras
    except bcrecord.BcrecordError:
        pass
    usable = []
    for spec in extras:
        try:
            bcrecord.patch_method(method.cls, method.attribute, [spec], name=owner, in_place=True).remove()
            usable.append(spec)
        except bcrecord.BcrecordError as error:
            limitations.append(f"{method.qualname} {spec}: {first_line(error)}")
    return usable


def check_model(name: str, config: Config, phase: Callable[[str], None]) -> Outcome:
    """Run every check on one model; never raises (except KeyboardInterrupt)."""
    import timm
    import torch

    import bcrecord
    from bcrecord import runtime as bcrecord_runtime

    result = Outcome(name)
    times = result.times
    started = time.perf_counter()

    def step(label: str) -> None:
        phase(label)
        result.stage = label

    def timed(label: str, since: float) -> None:
        times[label] = round(time.perf_counter() - since, 3)

    step("size")
    result.params = _meta_params(name)
    if result.params is not None and result.params > config.max_params:
        result.status = "too_large"
        result.error = f"{result.params / 1e6:.0f}M parameters > --max-params {config.max_params / 1e6:.0f}M"
        return result

    step("build")
    since = time.perf_counter()
    try:
        with deadline(config.budget, "build"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(config.seed)
            model = timm.create_model(name, pretrained=False)
            model.eval()
    except TooSlow as error:
        result.status, result.error = "too_slow", first_line(error)
        return result
    except Exception as error:
        result.status, result.error = "build_failed", first_line(error)
        return result
    timed("build", since)
    result.built = True
    result.params = sum(p.numel() for p in model.parameters())

    def forward(x: Any) -> Any:
        torch.manual_seed(config.seed)
        with torch.no_grad():
            return model(x)

    step("forward")
    baseline: Any = None
    image: Any = None
    leaves: List[Tuple[str, Any]] = []
    errors: List[str] = []
    for size in _input_sizes(model, config.small):
        torch.manual_seed(config.seed)
        image = torch.randn(1, *size)
        handles, leaves = _leaf_order(model)
        since = time.perf_counter()
        try:
            with deadline(config.budget, f"forward at {size}"):
                baseline = forward(image)
        except TooSlow as error:
            result.status, result.error = "too_slow", first_line(error)
            return result
        except Exception as error:
            errors.append(f"{size}: {first_line(error)}")
            continue
        finally:
            for handle in handles:
                handle.remove()
        timed("forward", since)
        result.input_size = list(size)
        break
    if result.input_size is None:
        result.status, result.error = "forward_failed", "; ".join(errors)
        return result
    result.ran = True
    since = time.perf_counter()
    with deadline(config.budget * 2, "second forward"):
        result.deterministic = same(baseline, forward(image))

    # Everything forward-like, and the original code objects the reference reads.
    paths = {id(module): path for path, module in model.named_modules()}
    methods, result.methods_skipped = forward_like_methods(model)
    infos: Dict[types.CodeType, CodeInfo] = {}
    for method in methods:
        code = method.function.__code__
        infos[code] = CodeInfo(method.qualname, code.co_varnames[0], store_offsets(code))
    classes = {method.cls for method in methods}
    result.classes = len(classes)
    held = _methods_held_by_instances(model, infos)

    step("reference")
    since = time.perf_counter()
    tracer = StoreTracer(infos, paths, returns=config.all_sites)
    try:
        with deadline(config.budget * 8, "reference run"):
            sys.settrace(tracer)
            try:
                traced = forward(image)
            finally:
                sys.settrace(None)
    except TooSlow as error:
        result.status, result.error = "too_slow", first_line(error)
        return result
    timed("reference", since)
    result.reference_frames = tracer.frames
    result.reference_values = sum(len(v) for v in tracer.values.values())
    if not same(traced, baseline):
        result.status, result.error = "nondeterministic", "the traced run differs from the plain run"

    step("patch")
    since = time.perf_counter()
    before = {cls: dict(vars(cls)) for cls in classes}
    codes = {method.function: method.function.__code__ for method in methods}
    counter = itertools.count()

    def order(value: Any) -> int:
        return next(counter)

    value_patches: List[Any] = []
    order_patches: List[Any] = []
    identical: Optional[bool] = None
    recorded: Any = None
    ordering: Any = None
    try:
        for method in methods:
            owner = _Owner(paths, method.qualname)
            try:
                listing = bcrecord.targets(method.raw)
                local_sites = [(site.name, site.index) for sites in listing.locals.values() for site in sites]
                specs: List[Any] = [bcrecord.Local(n, i) for n, i in local_sites]
                if config.all_sites:
                    specs += _usable_extras(method, listing.specs(), owner, result.limitations)
                if not specs:
                    continue
                value_patches.append(
                    bcrecord.patch_method(method.cls, method.attribute, specs, name=owner, in_place=True)
                )
                if local_sites:
                    order_specs = [bcrecord.Local(n, i, copy=order) for n, i in local_sites]
                    order_patches.append(
                        bcrecord.patch_method(
                            method.cls, method.attribute, order_specs, name=owner, in_place=True
                        )
                    )
            except Exception as error:
                result.patch_errors.append(f"{method.qualname}: {first_line(error)}")
        result.methods_patched = len(value_patches)
        result.sites = sum(len(p.keys) for p in value_patches)
        timed("patch", since)

        step("record")
        since = time.perf_counter()
        recorded = bcrecord.recording(copy="clone", only=value_patches)
        ordering = bcrecord.recording(copy="none", only=order_patches)
        with warnings.catch_warnings(record=True), deadline(config.budget * 4, "recorded run"):
            warnings.simplefilter("always")
            with recorded, ordering:
                output = forward(image)
        identical = same(output, baseline)
        timed("record", since)
    except TooSlow as error:
        result.status, result.error = "too_slow", first_line(error)
    finally:
        step("unpatch")
        for patch in reversed(order_patches + value_patches):
            patch.remove()
    result.restored = (
        all(
            set(vars(cls)) == set(snapshot_) and all(vars(cls)[k] is v for k, v in snapshot_.items())
            for cls, snapshot_ in before.items()
        )
        and all(function.__code__ is code for function, code in codes.items())
        and not bcrecord_runtime.is_active()
    )
    if result.status == "too_slow":
        return result
    result.identical = identical
    result.record_errors = [f"{e.key}: {first_line(e.error)}" for e in recorded.errors][:_MAX_MISMATCHES]
    result.record_errors += [f"order {e.key}: {first_line(e.error)}" for e in ordering.errors][
        :_MAX_MISMATCHES
    ]

    step("compare")
    since = time.perf_counter()
    _compare(recorded, ordering, tracer, result, held)
    timed("compare", since)
    with deadline(config.budget * 2, "forward after unpatching"):
        result.after_identical = same(forward(image), baseline)
    result.bcrecord_ok = bool(
        result.identical
        and result.reference_equal
        and result.restored
        and result.after_identical
        and not result.patch_errors
        and not result.record_errors
    )
    del recorded, ordering, tracer

    if config.fx:
        step("fx")
        since = time.perf_counter()
        _fx_check(model, image, leaves, config, result)
        timed("fx", since)
    times["total"] = round(time.perf_counter() - started, 3)
    result.stage = "done"
    if result.status == "ok" and not result.bcrecord_ok:
        result.status = "bcrecord_failed"
    return result


def _methods_held_by_instances(model: Any, infos: Dict[types.CodeType, CodeInfo]) -> Dict[str, str]:
    """Qualnames of methods that a module keeps as a bound method in its own ``__dict__``
    (``self.forward = self.forward_fused``), with where: a class-level patch misses those."""
    held: Dict[str, str] = {}
    for path, module in model.named_modules():
        for attribute, value in vars(module).items():
            if isinstance(value, types.MethodType) and isinstance(value.__func__, types.FunctionType):
                info = infos.get(inspect.unwrap(value.__func__).__code__)
                if info is not None:
                    held.setdefault(info.qualname, f"{path or '<root>'}.__dict__[{attribute!r}]")
    return held


def _compare(
    recorded: Any, ordering: Any, tracer: StoreTracer, result: Outcome, held: Dict[str, str]
) -> None:
    """Per (path, qualname, local): bcrecord's values in execution order vs the reference's."""
    ours: Dict[Tuple[str, str, str], List[Tuple[int, Any]]] = defaultdict(list)
    for key in recorded.keys():
        owner, _method, target = key.rsplit(":", 2)
        path, qualname = owner.rsplit("|", 1)
        values = recorded.all(key)
        result.recorded_values += len(values)
        match = _LOCAL_LABEL.match(target)
        if match:
            sequence = ordering.all(key) if key in ordering else []
            if len(sequence) != len(values):
                result.mismatches.append(f"{key}: {len(values)} values but {len(sequence)} order stamps")
                continue
            ours[(path, qualname, match["name"])].extend(zip(sequence, values, strict=True))
        elif target == "return" and tracer.returns:
            ours[(path, qualname, "return")].extend(enumerate(values))
    count = 0
    for key in sorted(set(ours) | set(tracer.values)):
        mine = [value for _, value in sorted(ours.get(key, []), key=lambda pair: pair[0])]
        theirs = tracer.values.get(key, [])
        result.compared_keys += 1
        label = f"{key[0] or '<root>'} {key[1]} {key[2]}"
        problem = ""
        if not mine:
            problem = f"reference saw {len(theirs)} stores, bcrecord recorded none"
            if key[1] in held:
                problem += f" (bound method held in {held[key[1]]}: the class-level patch misses it)"
        elif len(mine) != len(theirs):
            problem = f"bcrecord recorded {len(mine)} values, reference saw {len(theirs)}"
        else:
            for index, (a, b) in enumerate(zip(mine, theirs, strict=True)):
                if not same(a, b):
                    problem = f"value {index} differs: bcrecord {difference(a, b)} / reference {describe(b)}"
                    break
        if problem:
            count += 1
            if len(result.mismatches) < _MAX_MISMATCHES:
                result.mismatches.append(f"{label}: {problem}")
    result.mismatch_count = count + len([m for m in result.mismatches if "order stamps" in m])
    result.reference_equal = result.mismatch_count == 0


def _fx_check(model: Any, image: Any, leaves: List[Tuple[str, Any]], config: Config, result: Outcome) -> None:
    import torch
    from torchvision.models.feature_extraction import create_feature_extractor

    if not leaves:
        result.fx_ok, result.fx_error = False, "no leaf module ran"
        return
    node, expected = leaves[-1]
    result.fx_node = node
    try:
        with deadline(config.budget * 4, "FX"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            extractor = create_feature_extractor(model, return_nodes=[node])
            extractor.eval()
            torch.manual_seed(config.seed)
            with torch.no_grad():
                features = extractor(image)
        result.fx_ok = True
        result.fx_value_equal = same(features[node], expected)
    except (Exception, TooSlow) as error:
        result.fx_ok, result.fx_error = False, first_line(error)
    finally:
        model.eval()


# --- the worker process ----------------------------------------------------------------------


def worker_main(config_json: str) -> None:
    """Check models named on stdin, one per line; answer JSON lines on the original stdout."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything a model prints goes to the log, not into the protocol
    config = Config(**json.loads(config_json))

    def send(message: Dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    import timm  # noqa: F401
    import torch

    import bcrecord.torch  # noqa: F401  (tensor copies)

    torch.set_num_threads(config.threads)
    send({"ready": True})
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        print(f"=== {name}", file=sys.stderr, flush=True)
        try:
            outcome = check_model(name, config, lambda label: send({"phase": label}))
        except Exception as error:
            outcome = Outcome(name, status="error", stage="tool", error=first_line(error))
            traceback.print_exc()
        outcome.rss_mb = round(current_rss_mb(), 1)
        send({"result": asdict(outcome)})
        gc.collect()


class Worker:
    """A worker process, restarted after a crash, a timeout or too much memory."""

    def __init__(self, config: Config, log: Path, rss_limit_mb: float) -> None:
        self.config = config
        self.log = log
        self.rss_limit_mb = rss_limit_mb
        self.process: Optional[subprocess.Popen] = None
        self.buffer = b""
        self.log_file = open(log, "ab")

    def start(self) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(asdict(self.config))]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log_file, cwd=str(ROOT)
        )
        self.buffer = b""
        message = self._read(time.monotonic() + 600)
        if not message or not message.get("ready"):
            self.stop()
            raise RuntimeError(f"the worker did not start; see {self.log}")

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                if stream is not None:
                    stream.close()
            self.process = None

    def _read(self, until: float) -> Optional[Dict[str, Any]]:
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = until - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)  # type: ignore[no-any-return]

    def check(self, name: str, timeout: float, on_phase: Callable[[str], None]) -> Dict[str, Any]:
        if self.process is None or self.process.poll() is not None:
            self.stop()
            self.start()
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(name.encode() + b"\n")
        self.process.stdin.flush()
        until = time.monotonic() + timeout
        phase = "start"
        while True:
            message = self._read(until)
            if message is None:
                if self.process.poll() is None:
                    error = f"no result within {timeout:.0f}s (hard timeout, during {phase})"
                    status = "timeout"
                else:
                    error = f"the worker died (exit status {self.process.returncode}) during {phase}"
                    status = "crashed"
                self.stop()
                return asdict(Outcome(name, status=status, stage=phase, error=error))
            if "phase" in message:
                phase = message["phase"]
                on_phase(phase)
            elif "result" in message:
                result: Dict[str, Any] = message["result"]
                if result.get("rss_mb", 0) > self.rss_limit_mb:
                    self.stop()
                return result

    def close(self) -> None:
        self.stop()
        self.log_file.close()


# --- selection, progress, summary ---------------------------------------------------------


def select_models(
    patterns: Sequence[str], excludes: Sequence[str], seed: Optional[int], limit: Optional[int]
) -> List[str]:
    """timm's registry, filtered by fnmatch patterns, shuffled by ``seed``, cut at ``limit``."""
    import timm

    names = sorted(timm.list_models())
    if patterns:
        names = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if excludes:
        names = [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in excludes)]
    if seed is not None:
        random.Random(seed).shuffle(names)
    return names[:limit] if limit is not None else names


def load_results(path: Path) -> Dict[str, Dict[str, Any]]:
    """The results already in a JSON-lines file (a torn last line is ignored)."""
    results: Dict[str, Dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            results[record["model"]] = record
    return results


class Progress:
    """tqdm when it is installed, else a line per model."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0
        try:
            from tqdm import tqdm

            self.bar: Any = tqdm(total=total, unit="model", dynamic_ncols=True)
        except ImportError:  # pragma: no cover - depends on the environment
            self.bar = None

    def describe(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description_str(text[:60])

    def advance(self, name: str, status: str, counts: Dict[str, int]) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix(counts, refresh=False)
            self.bar.update(1)
        else:
            print(f"[{self.done}/{self.total}] {name}: {status}", flush=True)

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


NOT_BUILT = ("build_failed", "too_large", "too_slow", "forward_failed")


def summarize(results: List[Dict[str, Any]], elapsed: Optional[float] = None) -> str:
    """The summary table and failure lists, as Markdown."""
    checked = [r for r in results if r.get("identical") is not None]
    built = [r for r in results if r.get("built")]
    ran = [r for r in results if r.get("ran")]

    def count(items: Iterable[Dict[str, Any]], key: str) -> int:
        return sum(1 for r in items if r.get(key) is True)

    def rate(n: int, d: int) -> str:
        return f"{n} ({100 * n / d:.1f}%)" if d else "0"

    fx_tried = [r for r in checked if r.get("fx_ok") is not None]
    fx_ok = count(fx_tried, "fx_ok")
    lines = [
        "| measure | models |",
        "|---|---|",
        f"| tried | {len(results)} |",
        f"| built (within the budget) | {len(built)} |",
        f"| ran a plain forward within the budget | {len(ran)} |",
        f"| checked (patched, recorded, compared) | {len(checked)} |",
        f"| identical outputs (bitwise) | {rate(count(checked, 'identical'), len(checked))} |",
        f"| reference-equal records | {rate(count(checked, 'reference_equal'), len(checked))} |",
        f"| classes' dicts restored | {rate(count(checked, 'restored'), len(checked))} |",
        f"| **bcrecord: all checks pass** | **{rate(count(checked, 'bcrecord_ok'), len(checked))}** |",
        f"| **FX create_feature_extractor works** | **{rate(count(fx_tried, 'fx_ok'), len(fx_tried))}** |",
        f"| FX value equals the leaf's output | {rate(count(fx_tried, 'fx_value_equal'), fx_ok)} |",
    ]
    sums = {
        key: sum(int(r.get(key) or 0) for r in checked)
        for key in ("methods_patched", "sites", "recorded_values", "reference_values", "compared_keys")
    }
    lines.append("")
    lines.append(
        f"Over the checked models: {sums['methods_patched']} (class, method) patches, {sums['sites']} local "
        f"sites, {sums['recorded_values']} values recorded, {sums['reference_values']} values read by the "
        f"reference, {sums['compared_keys']} (module, method, local) sequences compared."
    )
    nondeterministic = [r["model"] for r in checked if r.get("deterministic") is False]
    if nondeterministic:
        lines.append(f"Non-deterministic unpatched forward: {', '.join(nondeterministic)}.")
    if elapsed is not None:
        lines.append(f"Wall time of this run: {elapsed / 60:.1f} min ({elapsed:.0f} s).")

    failures = [r for r in results if r.get("identical") is not None and not r.get("bcrecord_ok")]
    failures += [
        r
        for r in results
        if r.get("status") in ("error", "crashed", "timeout", "nondeterministic") and r not in failures
    ]
    lines += ["", "### bcrecord failures", ""]
    if not failures:
        lines.append("None.")
    for r in failures:
        flags = ", ".join(
            f"{k}={r.get(k)}" for k in ("identical", "reference_equal", "restored", "after_identical")
        )
        lines.append(f"- `{r['model']}` ({r.get('status')}, {flags}): {_first_problem(r)}")
    limited = [r for r in results if r.get("limitations")]
    if limited:
        lines += ["", "### Sites bcrecord refused up front (--all-sites; limitations, not failures)", ""]
        for r in limited:
            lines.append(f"- `{r['model']}`: {len(r['limitations'])} site(s), e.g. {r['limitations'][0]}")
    lines += ["", "### Did not build / too slow / too large", ""]
    skipped = [r for r in results if r.get("status") in NOT_BUILT]
    if not skipped:
        lines.append("None.")
    for r in skipped:
        lines.append(f"- `{r['model']}` ({r['status']}): {r.get('error', '')}")
    lines += ["", "### FX failures", ""]
    fx_failed = [r for r in fx_tried if not r.get("fx_ok")]
    if not fx_failed:
        lines.append("None.")
    for r in fx_failed:
        lines.append(f"- `{r['model']}` (node `{r.get('fx_node')}`): {r.get('fx_error', '')}")
    return "\n".join(lines) + "\n"


def _first_problem(result: Dict[str, Any]) -> str:
    for key in ("mismatches", "patch_errors", "record_errors"):
        if result.get(key):
            return str(result[key][0])
    if result.get("identical") is False:
        return "the recorded run's output differs from the unpatched output"
    if result.get("restored") is False:
        return "a patched class or function was not restored"
    if result.get("after_identical") is False:
        return "the output after unpatching differs"
    return str(result.get("error") or "")


def _counts(results: Iterable[Dict[str, Any]]) -> Dict[str, int]:
    rows = list(results)
    return {
        "ok": sum(1 for r in rows if r.get("bcrecord_ok")),
        "bad": sum(1 for r in rows if r.get("identical") is not None and not r.get("bcrecord_ok")),
        "skip": sum(1 for r in rows if r.get("status") in NOT_BUILT + ("timeout", "crashed", "error")),
        "fx": sum(1 for r in rows if r.get("fx_ok")),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description="Record every local of every forward-like method of timm models with bcrecord; check "
        "outputs are bitwise identical and records equal a sys.settrace reference; compare with FX.",
    )
    parser.add_argument(
        "--pattern", action="append", default=[], help="fnmatch pattern of model names (repeatable)"
    )
    parser.add_argument(
        "--exclude", action="append", default=[], help="fnmatch pattern to leave out (repeatable)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="shuffle the selection (random subset); also the torch seed (default 0)",
    )
    parser.add_argument("--limit", type=int, default=None, help="check at most this many models")
    parser.add_argument(
        "--out", default="zoo_results", help="results folder (results.jsonl, summary.md, worker.log)"
    )
    parser.add_argument("--resume", action="store_true", help="skip models already in DIR/results.jsonl")
    parser.add_argument(
        "--budget", type=float, default=30.0, help="seconds allowed to build, and for one forward"
    )
    parser.add_argument(
        "--max-params", type=float, default=250e6, help="skip larger models (counted on 'meta')"
    )
    parser.add_argument(
        "--small", type=int, default=128, help="input side for models without a fixed size (0: default)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the worker")
    parser.add_argument(
        "--all-sites", action="store_true", help="also record calls, operators, attributes, returns"
    )
    parser.add_argument("--no-fx", action="store_true", help="skip the FX create_feature_extractor attempt")
    parser.add_argument(
        "--max-minutes", type=float, default=None, help="start no new model after this many minutes"
    )
    parser.add_argument(
        "--rss-limit-mb", type=float, default=6000, help="restart the worker above this memory"
    )
    parser.add_argument(
        "--in-process", action="store_true", help="no worker process (no hard timeout; debugging)"
    )
    parser.add_argument("--worker", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        worker_main(args.worker)
        return 0

    config = Config(
        budget=args.budget,
        seed=0 if args.seed is None else args.seed,
        threads=args.threads,
        small=args.small,
        max_params=args.max_params,
        all_sites=args.all_sites,
        fx=not args.no_fx,
    )
    names = select_models(args.pattern, args.exclude, args.seed, args.limit)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    if not args.resume and results_path.exists():
        results_path.unlink()
    done = load_results(results_path)
    todo = [n for n in names if n not in done]
    print(f"{len(names)} models selected, {len(names) - len(todo)} already done, results in {results_path}")
    hard_timeout = args.budget * 20 + 120
    started = time.monotonic()
    progress = Progress(len(todo))
    worker: Any = None
    try:
        if args.in_process:
            import torch

            import bcrecord.torch  # noqa: F401

            torch.set_num_threads(args.threads)
        else:
            worker = Worker(config, out / "worker.log", args.rss_limit_mb)
        with open(results_path, "a") as fh:
            for name in todo:
                if args.max_minutes is not None and time.monotonic() - started > args.max_minutes * 60:
                    progress.write(f"stopping: --max-minutes {args.max_minutes} reached")
                    break
                progress.describe(name)

                def show(label: str, name: str = name) -> None:
                    progress.describe(f"{name} {label}")

                if worker is None:
                    result = asdict(check_model(name, config, show))
                else:
                    result = worker.check(name, hard_timeout, show)
                fh.write(json.dumps(result) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
                done[name] = result
                if result.get("identical") is not None and not result.get("bcrecord_ok"):
                    progress.write(f"FAIL {name}: {_first_problem(result)}")
                progress.advance(name, result["status"], _counts(done.values()))
    except KeyboardInterrupt:
        progress.write("interrupted; rerun with --resume to continue")
    finally:
        progress.close()
        if worker is not None:
            worker.close()
    results = [done[n] for n in names if n in done]
    elapsed = time.monotonic() - started
    summary = summarize(results, elapsed)
    (out / "summary.md").write_text(summary)
    print(summary)
    failed = [r for r in results if r.get("identical") is not None and not r.get("bcrecord_ok")]
    failed += [r for r in results if r.get("status") in ("error", "crashed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
