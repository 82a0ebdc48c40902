"""Record inside a model: :func:`record`.

How a model is patched: targets are grouped by the class that runs them, and each
(class, method) gets one patch of the method's function, in place — one rewritten
code object shared by every instance (16 Bottlenecks, one code object), reached also
through bound methods stored elsewhere (``self.forward = self.forward_split_cat``)
and ``super()`` calls. The probes pass the instance
they run on; the instance's module path is read from a marker that
:func:`record` puts in the targeted submodules' ``__dict__`` for the duration.
Because the marker travels with the instance's ``__dict__``:

* ``nn.DataParallel`` replicas (made by copying ``__dict__``) record under the same
  path, from their worker threads (recordings here take ``threads='all'``;
  an extractor's, where its model holds one);
* ``copy.deepcopy`` of a model being recorded gives a copy that records itself
  (its own values, under the same paths), never the original;
* pickling / ``torch.save`` of a whole model while it is being recorded stores a
  *stale* marker: the loaded model is clean (it never records) and a
  :class:`~bcrecord.errors.RecordingWarning` says so at save time.

A module held by two models recorded at the same time (a distiller holding an
extractor of its teacher: ``'tfeat.model.1'`` there is the teacher's ``'1'``) keeps
one marker, which notes its other paths: each recording gets its values under its
own path. Instances of the same class elsewhere (not targeted) run the patched code but are
not recorded. On exit every patch and marker is removed: the model is exactly as
before (same objects, same code, same ``state_dict``).
"""

from __future__ import annotations

import bisect
import collections.abc
import contextlib
import contextvars
import copyreg
import dataclasses
import functools
import inspect
import itertools
import reprlib
import sys
import threading
import types
import weakref
from collections import defaultdict, deque
from copy import deepcopy
from typing import (
    Any,
    Callable,
    Collection,
    ContextManager,
    Dict,
    FrozenSet,
    Generic,
    Iterable,
    Iterator,
    List,
    Mapping,
    NoReturn,
    Optional,
    ParamSpec,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
    overload,
)

import torch

from .._versions import ARGUMENT_REFERENCES
from ..analysis import read, resolve
from ..errors import SpecError, TargetError, outside_bcrecord, pass_through, warn
from ..patch import (
    ABSENT,
    Patch,
    function_of,
    original_code,
    outermost_taking_instance,
    patch_method,
    remove_all,
    shallow_copies_holding,
)
from ..runtime import (
    _ATOMIC,
    Recording,
    Sink,
    _copied_by_method,
    _holds,
    _without,
    carried_variable,
    context_recordings,
    deepcopy_refused,
    raised_by_signal_handler,
    receiving_recordings,
    safe_over_forks,
    silently,
)
from ..specs import Attribute, Local, Return, Spec, require_bool
from .copies import (
    Device,
    ValuePolicy,
    _itself,
    _shares_memory,
    _tracing_state,
    _transforms_active,
    under_vmap,
    value_policy,
)
from .targets import (
    Target,
    _resolving,
    _submodule,
    callable_name,
    expand_all,
    module_at,
    named_modules,
    new_matches,
    require_module,
    unwrap,
    wraps_forward,
)

# A warning from inside a model's call (an extractor's first call) points past torch's
# ``Module.__call__`` at the user's line; a recorded forward's own frames are never skipped.
pass_through(torch.nn.modules.module.__file__)

__all__ = ["record", "ModelRecording", "StopForward"]

_MARK = "_bcrecord_path"
_marks_lock = safe_over_forks(threading.Lock())
#: Held while a record() block's entry is claimed (see RecordBlock.__enter__); re-entrant, as a
#: finalizer may enter a block while it is held.
_blocks_lock = safe_over_forks(threading.RLock())
#: For each module marked now (by id): how many passes mark it, per path.
_mark_counts: Dict[int, Dict[str, int]] = {}
#: For each function patched for a model, per patch of it, the classes of the recorded modules that
#: run it and of the modules on the way to them: a compiled graph that inlined it is guarded on one
#: of them, where it reached the module by looping over a container too, by the type of the compiled
#: frame's module (``bcrecord.torch._drop_graphs_holding``). Only the patches still applied count:
#: an ended recording's classes would drop other models' graphs at every later swap. The classes are
#: held weakly: a recording kept where the class's functions reach it (their module's namespace) holds
#: its patches, so a class held here would keep the namespace, the recording and the model for good.
patched_classes: weakref.WeakKeyDictionary[
    Any, weakref.WeakKeyDictionary[Patch, Tuple[weakref.ReferenceType[type], ...]]
] = weakref.WeakKeyDictionary()


class StopForward(BaseException):
    """Raised by a probe to end a forward early once every target is recorded.

    A BaseException, so that a model's own ``except Exception`` does not swallow it.
    ``recording`` is the recording whose last target was recorded, ``stops`` every
    recording whose pass it ends (the nested ones stopping early, all done): the
    outermost caller that runs one of those passes ends there (an extractor inside
    another one, or inside a recorded model, lets the outer one's stop through).
    """

    def __init__(
        self, key: str, recording: Optional[ModelRecording] = None, stops: Tuple[ModelRecording, ...] = ()
    ) -> None:
        super().__init__(key)
        self.recording = recording
        self.stops = stops or ((recording,) if recording is not None else ())

    def _caught_further_out(self, outer: Tuple[Tuple[ModelRecording, ...], ...]) -> bool:
        """Whether a caller further out (``outer``: what :data:`_catching` held when this
        caller began) ends the pass of one of the recordings this stop ends."""
        return any([rec in self.stops for running in outer for rec in running])


def _stale(path: str) -> _StalePath:
    return _StalePath(path)


class _StalePath(str):
    """A marker loaded from a pickle saved by earlier versions: inert, like a plain str."""


class _PathMark(str):
    """A submodule's path while it is being recorded (see the module docstring).

    ``copy.deepcopy`` of the module meanwhile gives a copy marked the same (so it
    records itself); the copies are noted so that they are unmarked with the module.
    """

    module: Any
    #: Weak references to the copies marked with it (None while there are none: unmarking
    #: runs once per extractor call, where walking even an empty WeakSet costs microseconds).
    copies: Optional[List[weakref.ReferenceType]] = None
    #: On the module's marker: the marks of the other paths it is recorded at meanwhile (a
    #: model holding another model's extractor); replaced, never changed: probes read it unlocked.
    also: Tuple[_PathMark, ...] = ()
    #: ``copies``, kept after unmarking: a copy put at the module's path recorded there
    #: (see _warn_replaced). Those gone are let go of at the next copy.
    made: Tuple[weakref.ReferenceType, ...] = ()

    def __deepcopy__(self, memo: Dict[int, Any]) -> _PathMark:
        twin = memo.get(id(self.module))  # the copy of the marked module, being made now
        if twin is not None:
            if self.copies is None:
                self.copies = []
            self.copies.append(weakref.ref(twin))
            self.made = (*(ref for ref in self.made if ref() is not None), weakref.ref(twin))
        return self

    def __reduce__(self) -> Tuple[Callable[[str], str], Tuple[str]]:
        if self.module.__dict__.get(_MARK) is not self:
            # Left on a shallow copy (copy.copy, __dict__ copied) after its pass: inert.
            return str, (str(self),)
        warn(
            f"bcrecord: a module ({str(self) or '<root>'}) is being saved while it is recorded; "
            "the saved copy loads without recording"
        )
        # Saved as a plain str: inert (only a marker records), and loading needs no bcrecord.
        return str, (str(self),)


def _one_path_each(model: torch.nn.Module, modules: Mapping[str, torch.nn.Module]) -> None:
    """Refuse targets that reach one module object at two paths: it has one path while recorded.

    >>> wrapped = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.ReLU()))
    >>> try:
    ...     _one_path_each(wrapped, {"0": wrapped.module[0], "module.0": wrapped.module[0]})
    ... except TargetError as error:
    ...     print(str(error)[:61])
    'module.0' is '0' reached through the DataParallel's 'module'
    """
    inner = unwrap(model)
    # The wrappers' own path to the model inside ('module', torch.compile's '_orig_mod'); found by
    # a whole walk (a generator left early is closed at once: see bcrecord.runtime._holds).
    wrapped = "" if inner is model else {id(m): path for path, m in model.named_modules()}.get(id(inner), "")
    paths: Dict[int, str] = {}
    for path, module in modules.items():
        first = paths.setdefault(id(module), path)
        if first == path:
            continue
        for outer, bare in ((path, first), (first, path)):
            if wrapped and outer == (f"{wrapped}.{bare}" if bare else wrapped):
                raise TargetError(
                    f"{outer!r} is {bare!r} reached through the {type(model).__name__}'s {wrapped!r} "
                    f"(one {type(module).__name__} object); while recorded a module has one path: "
                    "target one of them"
                )
        # A submodule compiled in its place: its module at its path and at the wrapper's
        # '_orig_mod' ('1' and '1._orig_mod'), nothing registered twice.
        if [name for name in path.split(".") if name != "_orig_mod"] == [
            name for name in first.split(".") if name != "_orig_mod"
        ]:
            outer, bare = (path, first) if len(path) > len(first) else (first, path)
            raise TargetError(
                f"{outer!r} is {bare!r} reached through torch.compile's wrapper's '_orig_mod' (one "
                f"{type(module).__name__} object); while recorded a module has one path: target one of them"
            )
        # Both ways at once ('module.blocks.0' and 'blocks.0._orig_mod' under DataParallel).
        seen = [_seen_through(p, wrapped) for p in (path, first)]
        if wrapped and seen[0] == seen[1]:
            raise TargetError(
                f"{first!r} and {path!r} are {seen[0]!r} reached through wrappers (the "
                f"{type(model).__name__}'s {wrapped!r}, torch.compile's wrapper's '_orig_mod'; one "
                f"{type(module).__name__} object); while recorded a module has one path: target one of them"
            )
        raise TargetError(
            f"{path!r} and {first!r} are the same {type(module).__name__} object (registered "
            "twice); while recorded a module has one path: target one of them"
        )


def _seen_through(path: str, wrapped: str) -> str:
    """``path`` without the wrappers' path to the model (``wrapped``, ``'module'``) and
    torch.compile's wrappers' ``'_orig_mod'`` parts: the module's path as targets name it."""
    if wrapped and (path == wrapped or path.startswith(f"{wrapped}.")):
        path = path[len(wrapped) + 1 :]
    return ".".join(name for name in path.split(".") if name != "_orig_mod")


def warn_shared(model: torch.nn.Module, modules: Mapping[str, torch.nn.Module]) -> None:
    """Warn where a module is targeted at a second name of it (``self.b = self.a``, one object).

    Its probes cannot tell through which path it was called: every call of it records
    under the targeted path, its calls as ``'a'`` too (a feature extractor's module path
    gives its first call's output, torchvision has no node ``'b'``). At its first path, as
    ``named_modules()`` and FX name it, a module run several times is nothing new: unsaid.

    >>> import warnings
    >>> model = torch.nn.Sequential(torch.nn.ReLU())
    >>> model.append(model[0])  # the same ReLU at '0' and '1'
    Sequential(...)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_shared(model, {"0": model[0]})
    ...     warn_shared(model, {"1": model[1]})
    >>> [str(warning.message)[:51] for warning in caught]
    ["'1' is another name of the ReLU at '0' (one object)"]
    """
    paths: Dict[int, List[str]] = {id(module): [] for module in modules.values()}  # (the targeted only)
    for path, module in named_modules(unwrap(model), remove_duplicate=False):
        if id(module) in paths:
            paths[id(module)].append(path)
    for path, module in modules.items():
        names = paths.get(id(module), [])
        if path in names[1:]:
            warn(
                f"{path!r} is another name of the {type(module).__name__} at {names[0]!r} (one object): "
                f"its probes cannot tell through which name it is called, so its calls as {names[0]!r} "
                f"are recorded under {path!r} too; target {names[0]!r} for its every call"
            )


def _path_mark(module: torch.nn.Module, path: str) -> _PathMark:
    mark = _PathMark(path)
    mark.module = module
    return mark


class _Owner:
    """Per-instance owner name for one patch: the marked path, if this patch wants it.

    Wanted: a marker for one of the plan's own modules at that path (the module, a
    ``deepcopy`` or ``nn.DataParallel`` replica of it, which carry its marker). Another
    model of the same architecture, recorded at the same time, is marked with the
    same paths; its modules are other objects, so its values stay out.
    """

    #: It runs no patched code: the core calls it as it is (not silenced), per value.
    quiet = True

    def __init__(self, modules: Mapping[str, torch.nn.Module]) -> None:
        # Weak: the patch's sites may outlive the plan (a frame still running its code).
        self.modules = {path: weakref.ref(module) for path, module in modules.items()}

    def __call__(self, module: Any) -> Optional[str]:
        try:
            mark = module.__dict__.get(_MARK)
        except AttributeError:  # an instance without __dict__ is never marked
            return None
        if type(mark) is not _PathMark:
            return None
        # The marker itself, not str(mark): its hash is computed once, not per value.
        wanted = self.modules.get(mark)
        if wanted is not None:
            module = wanted()
            # Also while the module is still marked with it: a shallow copy (copy.copy) keeps
            # the marker after the pass, and must not record in a later one.
            if module is mark.module and module.__dict__.get(_MARK) is mark:
                return mark
        for other in mark.also:  # (usually none) this plan's path may be another of the module's
            wanted = self.modules.get(other)
            if wanted is not None:
                module = wanted()
                if module is mark.module and module.__dict__.get(_MARK) is mark:
                    return other
                # (or a copy's original's: the copy records itself where the original is recorded)
                if module is other.module and module.__dict__.get(_MARK) is other:
                    return other
        return None


#: What ``copy.deepcopy`` keeps as it is (a class, a function, a module...): never looked into.
#: Its exact types, as deepcopy looks them up (an int subclass's attributes are copied).
_DEEPCOPY_KEEPS = frozenset(
    {
        *_ATOMIC,
        type(Ellipsis),
        type(NotImplemented),
        types.FunctionType,
        types.BuiltinFunctionType,
        types.CodeType,
        types.ModuleType,
        weakref.ref,
        property,
    }
)


def _reduced_parts(item: Any) -> List[Any]:
    """What ``copy.deepcopy`` (and pickle) copy of ``item``, an object that is no plain container:
    its ``__reduce_ex__(4)``'s arguments, state, list items and dict items (a class's own
    ``copyreg`` reducer first, as deepcopy looks); none where that raises (deepcopy says why then,
    or the class copies itself its own way), nor for an array of numbers (numpy's, pandas')."""
    if _copied_by_method(type(item)) and not getattr(getattr(item, "dtype", None), "hasobject", True):
        return []  # (its reduce copies its data: nothing in it to find)
    try:
        reductor = copyreg.dispatch_table.get(type(item))
        reduced = reductor(item) if reductor is not None else item.__reduce_ex__(4)
        if isinstance(reduced, str) or not isinstance(reduced, tuple):  # a global's name
            return []
        parts: List[Any] = [reduced[1:3]]
        if len(reduced) > 3 and reduced[3] is not None:
            parts.append(list(reduced[3]))
        if len(reduced) > 4 and reduced[4] is not None:
            parts.append(list(reduced[4]))
    except Exception as error:
        if raised_by_signal_handler(error):
            raise
        return []
    return parts


def _leaf_copies(value: Any, memo: Dict[int, Any]) -> None:
    """Put into ``memo`` (``copy.deepcopy``'s) a copy of each tensor in ``value`` that is in the
    autograd graph: as pickle copies one, a leaf of its values that requires grad (``copy.deepcopy``
    refuses a tensor that is no leaf). Tensors are found where deepcopy would reach them: through
    tuples, lists, sets and dicts, and in any other object what its ``__reduce_ex__`` gives (its
    attributes, slots, items; what an object copying itself with its own ``__deepcopy__`` would
    pickle), so that deepcopy copies each of them so; everything else is deepcopy's to copy
    (a registered holder, torchvision's ``ImageList``, too), each object once. What a deep copy
    of a recording does where its values hold such tensors (see ``Recording.__deepcopy__``).

    >>> import copy, torch
    >>> from bcrecord.torch import record
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    >>> with record(model, ["0"], grad=True) as rec:
    ...     _ = model(torch.ones(1, 2))
    >>> kept = copy.deepcopy(rec)["0:forward:return"]
    >>> kept.is_leaf, kept.requires_grad, torch.equal(kept, rec["0:forward:return"])
    (True, True, True)
    """

    # (What reduce made, walked too, held until the walk ends: no id of it reused meanwhile.)
    pending, seen, held = [value], set(), []
    while pending:
        item = pending.pop()
        if type(item) in _DEEPCOPY_KEEPS or isinstance(item, type) or id(item) in seen or id(item) in memo:
            continue
        seen.add(id(item))
        kind = type(item)
        if kind is list or kind is tuple or kind is set or kind is frozenset:
            pending.extend(item)
        elif kind is dict:
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, torch.Tensor):
            # (A sparse compressed or strided nested tensor, leaf or not: torch's deepcopy of it
            # raises, 'Cannot access storage', 'aten::new_empty'; clone copies it.)
            if not item.is_leaf or item.layout in _COMPRESSED or item.is_nested:
                memo[id(item)] = item.detach().clone().requires_grad_(item.requires_grad)
                memo.setdefault(id(memo), []).append(item)  # (kept alive, as deepcopy keeps what it copied)
        else:
            parts = _reduced_parts(item)
            held.append(parts)
            pending.extend(parts)


#: The sparse compressed layouts (torch's deepcopy of such a tensor raises).
_COMPRESSED = frozenset(
    getattr(torch, name)
    for name in ("sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
    if hasattr(torch, name)
)

deepcopy_refused.append(_leaf_copies)  # (a core recording's values may hold them too)


#: Orders the beginnings and ends of passes (see _all_done_here).
_pass_clock = itertools.count(1)

#: Leaf hooks a recording holds before it first lets go of those whose leaves are gone.
_LEAF_SWEEP_AT = 64


class ModelRecording(Recording):
    """A :class:`~bcrecord.Recording` of a model's targets.

    Besides the core API (``rec[key]``, ``rec.all(key)``…) it knows which keys each
    target string produced: :meth:`keys_of` and :meth:`values_of`.

    >>> import torch
    >>> from bcrecord.torch import record
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sequential(torch.nn.ReLU()))
    >>> with record(model, ["1.*"]) as rec:
    ...     _ = model(torch.ones(1, 2))
    >>> rec.keys_of("1.*"), len(rec.values_of("1.*")["1.0:forward:return"])
    (['1.0:forward:return'], 1)
    """

    #: The frame whose block it records for, while the block runs (see :func:`_inside_another_forward`).
    _opened_in: Optional[types.FrameType] = None
    #: The option that asked for the early stop, as warnings name it.
    _stop_option = "stop_after_last"
    #: The ``.grad`` keys of leaves whose gradient no backward had recorded when the block ended.
    _left_leaves: FrozenSet[str] = frozenset()

    def __init__(self, *, stop_after_last: bool = False, **options: Any) -> None:
        require_bool("stop_after_last", stop_after_last)
        super().__init__(**options)
        #: Keys each target string produced (shared with the plan: read, never changed).
        self.targets: Mapping[str, List[str]] = {}
        self._stop = stop_after_last
        self._needed: frozenset = frozenset()
        self._seen: Set[str] = set()
        #: Whether this pass raised its stop (one that returns caught it: see _ran_whole).
        self._stopped = False
        #: Whether a pass of this recording is running (see _all_done_here).
        self._passing = False
        #: The value policies of the plan (their copies from a GPU finish before reads).
        self._policies: Tuple[ValuePolicy, ...] = ()
        #: Per ``.grad`` key, how many values asked for a gradient, and the positions of
        #: the gradients kept (they arrive in backward order; they are kept in the values').
        self._asked: Dict[str, int] = {}
        self._grad_positions: Dict[str, List[int]] = {}
        #: Per ``.grad`` key, how many values had asked for a gradient at the last clear():
        #: their gradients, still to come, are dropped with them.
        self._cleared: Dict[str, int] = {}
        self._grad_lock = safe_over_forks(threading.Lock())
        #: Gradient hooks on leaf tensors (parameters) that have not fired yet.
        self._leaf_hooks: Set[_GradientHook] = set()
        #: The hook waiting on each (key, leaf tensor id): one gradient per backward.
        self._leaf_waiting: Dict[Tuple[str, int], _GradientHook] = {}
        #: How many leaf hooks, once reached, have those of leaves gone since let go (see _gradient_of).
        self._leaf_sweep_at = _LEAF_SWEEP_AT
        #: When its pass last began and last ended (see _pass_clock).
        self._began = self._last_end = 0
        #: Whether the record() block it was made for has ended (its patches are gone).
        self._ended = False
        #: The modules a forward stopped early unwinds (see _stopping_skips_hooks).
        self._unwound: Sequence[torch.nn.Module] = ()
        #: The modules whose instance ``forward`` it unwinds, the model's too (see _stopping_skips_wrappers).
        self._through: Sequence[torch.nn.Module] = ()
        #: The model whose forward catches the stop (under record(); an extractor catches
        #: it outside the model): its own hooks see what the forward returns then.
        self._caught_in: Optional[torch.nn.Module] = None

    def __enter__(self) -> ModelRecording:
        if self._ended:  # entered again, it would record nothing, silently
            raise RuntimeError(
                "this recording's record() block has ended and the model is unpatched: "
                "enter a new record(model, targets) to record again"
            )
        super().__enter__()
        return self

    def __getstate__(self) -> Dict[str, Any]:
        """What a pickle, ``torch.save`` or copy of the recording holds: as the core's
        (:meth:`bcrecord.Recording.__getstate__`, its values as they are now), with its targets'
        keys, ended (its block's patches stay with the model); not its value policies (a
        ``reduce`` lambda does not pickle: they have made its values) nor its gradient hooks:
        gradients still to come go to the recording itself, not to a copy.

        >>> import copy, pickle, torch
        >>> from bcrecord.torch import record
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3))
        >>> with record(model, ["0"], reduce=lambda t: t.sum()) as rec:
        ...     _ = model(torch.ones(1, 2))
        ...     inside = copy.deepcopy(rec)
        >>> kept = pickle.loads(pickle.dumps(rec))
        >>> kept.keys_of("0"), torch.equal(kept["0:forward:return"], inside["0:forward:return"])
        (['0:forward:return'], True)
        """
        state = super().__getstate__()
        state.update(
            targets={text: list(keys) for text, keys in self.targets.items()},
            _policies=(),
            _grad_lock=None,
            _leaf_hooks=set(),
            _leaf_waiting={},
            _leaf_sweep_at=_LEAF_SWEEP_AT,
            _ended=True,
            _passing=False,
            _unwound=(),
            _through=(),
            _caught_in=None,
            _opened_in=None,
        )
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._grad_lock = safe_over_forks(threading.Lock())

    def _settle(self) -> None:
        for policy in self._policies:
            policy.settle()

    def _values(self, key: str) -> Any:
        try:
            return super()._values(key)
        except KeyError:
            # A target string read as a key (rec["bn1"]): its keys are what record() expanded it to.
            named = self.targets.get(key) if isinstance(key, str) else None
            if named and key not in named:
                # Its keys that hold values (of a branch not taken, none): those to read.
                held = [k for k in named if self._data.get(k)]
                shown = ", ".join(map(repr, (held or named)[:3])) + (
                    ", ..." if len(held or named) > 3 else ""
                )
                if not held:
                    try:
                        super()._values(named[0])
                        why = ""  # (recorded meanwhile, in another thread)
                    except KeyError as error:
                        why = f"; {error.args[0]}"
                    raise KeyError(
                        f"{key!r} is a target, not a key, and none of its keys ({shown}) holds a value{why}"
                    ) from None
                some = "" if len(held) == len(named) else f" ({len(named) - len(held)} more hold none)"
                raise KeyError(
                    f"{key!r} is a target, not a key: its keys are {shown}{some}; read rec[{held[0]!r}], "
                    f"or rec.values_of({key!r}) for all of them"
                ) from None
            # A gradient whose value was recorded: its probe ran, the backward did not
            # (the core's message would blame a branch not taken).
            value_key = key[: -len(".grad")] if isinstance(key, str) and key.endswith(".grad") else None
            failed = any([error.key == key for error in self.errors])
            if value_key is None or failed or not self._data.get(value_key) or self._data.get(key):
                raise
            if not self._asked.get(value_key):
                why = (
                    "but none of its values was in the autograd graph (recorded under torch.no_grad() "
                    "or inference_mode, or computed from nothing that requires grad)"
                )
            elif key in self._left_leaves and self._token is None:
                why = (
                    "but it is a leaf (a parameter), whose gradient only a backward inside the block "
                    "records, and none ran before the block ended (a backward after it records nothing)"
                )
            else:
                why = (
                    "but no backward pass has reached it yet: one from a loss computed from it records "
                    "it (a forward that stop_after_last ended returns None: there, with grad=True, "
                    "call backward on a loss of the recorded value)"
                )
            said = f"no gradient recorded for {key!r}: its value {value_key!r} was recorded, {why}"
            raise KeyError(said) from None

    def _probes(self, key: Any) -> bool:
        # Its plan's keys: its probes are gone once the block ends, when values are read.
        return any([key in keys for keys in self.targets.values()]) or super()._probes(key)

    def keys_of(self, target: str) -> List[str]:
        """The keys a target string given to :func:`record` names (recorded or not yet).

        >>> import torch
        >>> from bcrecord.torch import record
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
        >>> with record(model, ["*:forward:return"]) as rec:
        ...     pass
        >>> rec.keys_of("*:forward:return")
        ['0:forward:return', '1:forward:return']
        """
        try:
            return list(self.targets[target])
        except KeyError:
            raise KeyError(
                f"{target!r} is not a target of this recording; targets: {list(self.targets)}"
            ) from None

    def values_of(self, target: str) -> Dict[str, List[Any]]:
        """``{key: all values}`` for a target string (keys with no value left out).

        >>> import torch
        >>> from bcrecord.torch import record
        >>> model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.ReLU())
        >>> with record(model, ["*:forward:return"]) as rec:
        ...     _ = model(torch.tensor([-1.0, 2.0]))
        ...     _ = model(torch.tensor([3.0]))
        >>> {key: [v.tolist() for v in values] for key, values in rec.values_of("*:forward:return").items()}
        {'0:forward:return': [[0.0, 2.0], [3.0]], '1:forward:return': [[0.0, 2.0], [3.0]]}
        """
        return {key: self.all(key) for key in self.keys_of(target) if key in self}

    def _collect(self, keys: Iterable[str], first: bool, last: Optional[int] = None) -> List[Any]:
        """The values of ``keys`` in order: each one's first (``first``), or its ``last`` ones (all: None).

        One pass over the stored lists, for the extractor's output of every call
        (which settles the copies once, first: :meth:`_settle`).
        """
        values: List[Any] = []
        for key in keys:
            found = self._data.get(key)
            if found:
                if first:
                    values.append(found[0])
                elif last is None or len(found) <= last:
                    values.extend(found)
                else:
                    values.extend(list(found)[-last:])
        return values

    def _start_pass(self) -> None:
        """Begin a new forward pass (early stop counts targets per pass)."""
        self._seen = set()
        self._stopped = False
        self._passing = True
        self._began = next(_pass_clock)

    def _runs_whole(self) -> bool:
        """Whether ending its pass early would skip what must run (see the three checks)."""
        return (
            _stopping_skips_hooks(self._unwound)
            or _stopping_skips_wrappers(self._through)
            or _hooks_take_the_output(self._caught_in)
        )

    def _end_pass(self) -> None:
        """The pass ended (returned, stopped or raised): it holds back no other's stop."""
        self._passing = False
        self._last_end = next(_pass_clock)

    def _ran_whole(self) -> None:
        """A pass that could have stopped early returned: warn, once, where that is because
        the model's own code caught the stop, or because a target names a site that did not
        run while every target has a value.

        A target without an index (``'blocks.1:forward:x'``) names every assignment of
        its local, some maybe in a branch this model never takes (timm's blocks have
        such sites); the stop waits for each. The values are right; the rest of the
        model ran for nothing.
        """
        if self._stopped:  # (raised, and it returned)
            if "stop caught" not in self._warned:
                self._warned.add("stop caught")
                warn(
                    "the early stop was caught by the model's own code (a bare 'except:' or "
                    "'except BaseException:' around a target), which ran on: its forward returned "
                    "what it made after that; the values recorded are the model's"
                )
            return
        unseen = [key for key in self._needed if key not in self._seen]
        if not self._stop or not unseen or "stop held back" in self._warned:
            return
        for keys in self.targets.values():
            if not any([key in self._seen for key in keys]):  # a target the pass never reached
                return
        self._warned.add("stop held back")
        warn(
            f"{self._stop_option}: this forward ran to its end although every target has a value, "
            f"because the stop waits for every site a target names and {unseen} did not run "
            "(a branch not taken); name the sites that run (with their @index) to stop after them"
        )

    def _end(self) -> None:
        """Its ``record()`` block has ended: it is never entered again, and a recording kept
        after its block holds its values, not the model's modules the early stop looked at."""
        self._ended = True
        self._unwound, self._through, self._caught_in = (), (), None
        self._opened_in = None  # (a frame: held, it would hold its locals)

    def __exit__(self, *exc: object) -> None:
        try:
            super().__exit__(*exc)
        finally:
            # A parameter outlives the recording: a hook left on it would record every
            # later backward (and keep this recording alive). An activation's hook stays,
            # for a backward after the block; it goes with the activation.
            if self._leaf_hooks:  # (usually none: no new set then, on every extractor call)
                hooks, self._leaf_hooks = self._leaf_hooks, set()
                self._leaf_waiting = {}
                for hook in list(hooks):  # (one may fire meanwhile, in autograd's thread)
                    hook.remove()
                # (for the message of a gradient read later: no backward after the block records it)
                self._left_leaves = frozenset(hook.key for hook in hooks)

    def clear(self) -> None:
        """Drop everything recorded so far, gradients waiting included (the recording stays active).

        >>> import torch
        >>> from bcrecord.torch import record
        >>> model = torch.nn.Sequential(torch.nn.ReLU())
        >>> with record(model, ["0"]) as rec:
        ...     _ = model(torch.ones(1))
        ...     rec.clear()
        ...     _ = model(torch.zeros(1))
        >>> rec.all("0:forward:return")
        [tensor([0.])]
        """
        with self._grad_lock:
            super().clear()
            self._grad_positions.clear()
            self._cleared = dict(self._asked)
            # A parameter's hook waits for one gradient per backward, however many reads:
            # gone, so that a read after the clear asks for its own.
            hooks, self._leaf_hooks, self._leaf_waiting = self._leaf_hooks, set(), {}
        for hook in list(hooks):
            hook.remove()

    def _gradient_of(self, key: str, tensor: torch.Tensor, keep: Callable[[Any], Any]) -> None:
        """Record ``tensor``'s gradient under ``key + '.grad'``, at the position of its value.

        A leaf (a parameter) gets one gradient per backward however often it is read
        before it: while a hook of ``key`` waits on it, another read adds none (a
        module run twice in a forward, a checkpointed forward run again in backward).
        """
        if tensor.is_leaf:
            waiting = self._leaf_waiting.get((key, id(tensor)))
            if waiting is not None and waiting.handle is not None and waiting.tensor() is tensor:
                return
        with self._grad_lock:
            position = self._asked.get(key, 0)
            self._asked[key] = position + 1
        hook = _GradientHook(self, key + ".grad", position, keep, tensor)
        if tensor.is_leaf:
            self._leaf_hooks.add(hook)
            hook.waiting = (key, id(tensor))
            self._leaf_waiting[hook.waiting] = hook
            if len(self._leaf_hooks) >= self._leaf_sweep_at:
                # A fresh leaf each step (an input that requires grad) and no backward: its hook
                # would be held for good, one a step. (Swept at doublings: amortized, no callback.)
                for gone in [h for h in self._leaf_hooks if h.tensor() is None]:
                    self._leaf_hooks.discard(gone)
                    if gone.waiting is not None and self._leaf_waiting.get(gone.waiting) is gone:
                        del self._leaf_waiting[gone.waiting]
                self._leaf_sweep_at = max(_LEAF_SWEEP_AT, 2 * len(self._leaf_hooks))

    def _add_gradient(self, key: str, position: int, grad: Any) -> None:
        """Store a gradient among the others in the order of their values, not of backward (``keep`` too)."""
        with self._grad_lock:
            if position < self._cleared.get(key[: -len(".grad")], 0):  # its value was cleared
                return
            values = self._data.get(key)
            if values is None:
                values = self._data[key] = [] if self._maxlen is None else deque(maxlen=self._maxlen)
            positions = self._grad_positions.setdefault(key, [])
            where = bisect.bisect(positions, position)
            if self._maxlen is not None and len(values) == self._maxlen:
                if where == 0:  # older than every gradient kept: keep='last'/N drops it
                    return
                values.popleft()  # type: ignore[union-attr]
                positions.pop(0)
                where -= 1
            values.insert(where, grad)
            positions.insert(where, position)

    def _sink(self, site_id: int, owner: Optional[str] = None) -> Optional[Sink]:
        sink = super()._sink(site_id, owner)
        if not self._stop or sink is None or sink.key not in self._needed:
            return sink
        store, key = sink.store, sink.key

        def store_then_maybe_stop(value: Any) -> None:
            store(value)
            # Only this recording's own forward stops, and only where a caller catches
            # the stop: a value from another thread (threads='all') is kept, never
            # ends that thread's forward, and a submodule called on its own runs on.
            if self._entered_here():
                self._seen.add(key)
                if self._seen >= self._needed and _stopping.get() and _all_done_here():
                    # Every pass stopping early here is done: the outermost of them ends, unless
                    # one of them must run whole.
                    stops = (self, *_without(_stopping_here(), self))
                    for rec in stops:  # (a loop, not any(): see bcrecord.runtime._holds)
                        if rec._runs_whole():
                            return
                    for rec in stops:
                        rec._stopped = True
                    raise StopForward(key, self, stops)

        return sink.with_store(store_then_maybe_stop)


#: Forward hooks registered for every module (torch.nn.modules.module.register_module_forward_hook).
_GLOBAL_FORWARD_HOOKS: Mapping[int, Any] = getattr(torch.nn.modules.module, "_global_forward_hooks", {})


def _stopping_skips_hooks(unwound: Iterable[torch.nn.Module]) -> bool:
    """Whether ending the forward now would skip forward hooks that keep state across modules.

    A forward hook registered for every module pairs with a pre-hook to track which
    modules run (PyTorch's ModuleTracker, so ``FlopCounterMode``): a forward ended
    early would leave the modules it unwound on that stack for good. A hook
    registered with ``always_call=True`` must run even if the forward raises (torch
    runs it for an ``Exception``, not for :class:`StopForward`). Where there is
    either, on ``unwound`` (the modules on the way to the targets), the forward runs whole.
    """
    return bool(_GLOBAL_FORWARD_HOOKS) or any([module._forward_hooks_always_called for module in unwound])


def _stopping_skips_wrappers(through: Iterable[torch.nn.Module]) -> bool:
    """Whether ending the forward now would skip the end of a forward set on a module's instance.

    accelerate's hooks (``cpu_offload``, ``dispatch_model``, ``add_hook_to_module``) set
    ``module.forward`` to a partial that loads the weights, runs the class's forward, then
    offloads them (or moves the output): a stop raised inside would leave the weights
    loaded for good. Where a module of ``through`` has such a forward, the forward runs whole.

    >>> import functools, torch
    >>> lin = torch.nn.Linear(1, 1)
    >>> before = _stopping_skips_wrappers([lin])
    >>> lin.forward = functools.partial(torch.nn.Linear.forward, lin)
    >>> before, _stopping_skips_wrappers([lin])
    (False, True)
    """
    return any([wraps_forward(module) for module in through])


def _hooks_take_the_output(model: Optional[torch.nn.Module]) -> bool:
    """Whether ``model`` has hooks that take its forward's output, None when stopped early
    inside it (a forward hook would get None in place of the output): it runs whole then."""
    if model is None:
        return False
    hooks = torch.nn.modules.module
    return bool(
        model._forward_hooks
        or model._backward_hooks
        or model._backward_pre_hooks
        or getattr(hooks, "_global_backward_hooks", None)
        or getattr(hooks, "_global_backward_pre_hooks", None)
    )


def _stopping_here(passing: bool = True) -> List[ModelRecording]:
    """The recordings of this context that stop early (whose pass runs, where ``passing``)."""
    recordings = context_recordings()
    return [
        rec
        for rec in recordings
        if isinstance(rec, ModelRecording) and rec._stop and (rec._passing or not passing)
    ]


def _all_done_here() -> bool:
    """Whether every pass running in this context that stops early has all its values.

    Nested passes that each stop early (an extractor of an extractor, two
    ``record(stop_after_last=True)`` of one model) end the forward only once the
    last of them is done: each one's values are then there. A recording whose
    model is not running now (its pass has not begun) holds back nothing, unless its
    model is inside one that runs and it has run no pass since that one's began: the
    forward may yet call it (else it ran whole, with its values, for nothing).
    """
    stopping = _stopping_here(passing=False)
    running = [rec for rec in stopping if rec._passing]
    if not all([rec._seen >= rec._needed for rec in running]):
        return False
    for waiting in stopping:
        if waiting._passing or not waiting._through:
            continue
        model = waiting._through[-1]
        for rec in running:
            outer = rec._through[-1] if rec._through else None
            if outer is None or outer is model or waiting._last_end > rec._began:
                continue
            if any([module is model for module in outer.modules()]):
                return False
    return True


@dataclasses.dataclass(slots=True)  # (made for each key: a whole resnet's 160)
class _Request:
    """What the targets ask of one key (see :class:`Plan`)."""

    cls: type
    method: str
    path: str
    spec: Spec
    reducer: Any
    grad: bool
    #: The first target string that asked for it.
    text: str
    #: Whether only ``.grad`` targets no ``reduce`` entry names asked for it so far: it takes
    #: the reduce of the value's own target, when one comes (a gradient takes its value's).
    adopts: bool = False


def _check_reduce(reduce: Any) -> None:
    """Refuse a ``reduce`` that is neither a callable nor a dict of callables (or None)."""
    if reduce is None or callable(reduce):
        return
    if not isinstance(reduce, Mapping):
        raise TypeError(f"reduce must be a callable or a dict of target -> callable, got {reduce!r}")
    for key, function in reduce.items():
        if function is not None and not callable(function):  # None: that target unreduced
            raise TypeError(f"reduce[{key!r}] must be a callable, got {function!r}")


def _check_reduce_keys(reduce: Any, expanded: Mapping[str, Sequence[Target]]) -> None:
    """Refuse a bad ``reduce``, or a dict with a key that names no target (a typo would do nothing)."""
    _check_reduce(reduce)
    if reduce is None or callable(reduce):
        return
    # (the expanded ones too: a glob's matches, a key's own spelling, 'layer1:forward:return')
    concrete = (key for targets in expanded.values() for t in targets for key in _reduce_keys("", t)[:-1])
    named = list(dict.fromkeys([*expanded, *concrete]))
    unknown = [key for key in reduce if key not in named]
    if unknown:
        shown = ", ".join(map(repr, named[:12])) + (f", ... ({len(named)} in all)" if len(named) > 12 else "")
        raise SpecError(f"reduce names targets that are not recorded: {unknown}; it takes: {shown}")


#: What record() takes besides the model and the targets.
RECORD_OPTIONS = ("copy", "to", "dtype", "reduce", "grad", "keep", "threads", "stop_after_last")


def check_options(**options: Any) -> None:
    """Refuse what :func:`record` would refuse in ``options``, before any model is at hand.

    For callers that take ``record()``'s options now and record later (the Lightning
    callback). A ``reduce`` dict's keys are checked against the targets by ``record()``.

    >>> check_options(copy="detach", keep="last", dtype=torch.float16)
    >>> check_options(cpy="clone")
    Traceback (most recent call last):
    TypeError: unknown option(s) cpy; accepted: copy, to, dtype, reduce, grad, keep, threads, stop_after_last
    """
    unknown = sorted(set(options) - set(RECORD_OPTIONS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; accepted: {', '.join(RECORD_OPTIONS)}")
    copy = options.get("copy", "clone")
    if copy not in ("clone", "detach", "deepcopy", "none"):
        raise SpecError(f"unknown copy policy {copy!r}; choose one of clone, detach, deepcopy, none")
    # (grad='no' would be true: values kept in the autograd graph; stop_after_last='no', forwards cut short)
    grad = require_bool("grad", options.get("grad", False))
    require_bool("stop_after_last", options.get("stop_after_last", False))
    value_policy(copy, options.get("to"), options.get("dtype"), None, grad)
    _check_reduce(options.get("reduce"))
    ModelRecording(keep=options.get("keep", "all"), threads=options.get("threads", "context"))


def _reduce_keys(text: str, target: Target) -> Tuple[str, ...]:
    """The ``reduce`` entries that may name ``target`` (from the target string ``text``), the
    more specific first: the expanded target (``'layer1'`` of ``'layer*'``), for a ``.grad``
    target its ``.grad`` form first (it records the value too), then ``text``."""
    if target.grad:
        return (f"{target.text}.grad", target.text, text)
    return (target.text, text)


def _names(reduce: Mapping[str, Any], text: str, target: Target) -> bool:
    """Whether the ``reduce`` dict has an entry of its own for ``target`` (None included)."""
    return any([key in reduce for key in _reduce_keys(text, target)])


def _reduce_for(reduce: Any, text: str, target: Target) -> Optional[Callable[[torch.Tensor], Any]]:
    """The reduce function for ``target`` (from the target string ``text``): by the first of
    :func:`_reduce_keys` the dict has; an entry of None is no reduce, there too."""
    if reduce is None or callable(reduce):
        return reduce
    for key in _reduce_keys(text, target):
        if key in reduce:
            return reduce[key]
    return None


class _GradCopy:
    """The copier of a ``.grad`` target: keeps the value and records its gradient."""

    def __init__(
        self, plan: Plan, key: str, keep: Callable[[Any], Any], keep_grad: Callable[[Any], Any]
    ) -> None:
        # Weak: the patch holds this copier, and a recording made with ``only=`` its patches;
        # a recording kept after its block must not keep the plan (and the model) alive.
        self.plan = weakref.ref(plan)
        self.key, self.keep, self.keep_grad = key, keep, keep_grad

    def __call__(self, value: Any) -> Any:
        plan = self.plan()
        rec = None if plan is None else plan.recording
        if rec is not None:
            if not isinstance(value, torch.Tensor):
                rec._fail(
                    self.key + ".grad",
                    TypeError(f"a gradient is recorded for a tensor; this value is a {type(value).__name__}"),
                )
            # Not under no_grad/inference_mode: a parameter requires grad there too, but that
            # forward has no backward (its hook would take the next training step's gradient).
            elif torch.is_grad_enabled():
                # Inside vmap, the whole batch's (as the value is): the batched tensor is no part of
                # the graph a backward outside vmap runs through.
                graphed, layout = under_vmap(value)
                if graphed.requires_grad:
                    keep_grad = self.keep_grad if graphed is value else _after(layout, self.keep_grad)
                    # The recording of this pass, even if the gradient arrives after it ends.
                    rec._gradient_of(self.key, graphed, keep_grad)
        return self.keep(value)


def _after(first: Callable[[Any], Any], then: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``then(first(x))``."""
    return lambda value: then(first(value))


class _GradientHook:
    """A hook for one recorded value's gradient: records it once, then removes itself.

    Once, because a leaf (a parameter) takes part in every later backward; removed,
    so that the tensor is left with the hooks it had.
    """

    __slots__ = ("rec", "key", "position", "keep", "tensor", "handle", "had_none", "waiting")

    def __init__(
        self, rec: ModelRecording, key: str, position: int, keep: Callable[[Any], Any], tensor: torch.Tensor
    ) -> None:
        # Weak: the graph holds the hook (in C++, unseen by the cycle collector), and the
        # recording holds the graph (its values): a recording dropped before a backward came
        # would be kept for good, with all it holds.
        self.rec = weakref.ref(rec)
        self.key, self.position, self.keep = key, position, keep
        #: Its entry in the recording's table of hooks waiting on leaves, if it is one.
        self.waiting: Optional[Tuple[str, int]] = None
        self.had_none = tensor._backward_hooks is None
        # Weak: the hook must not keep an activation (and its graph) alive.
        self.tensor = weakref.ref(tensor)
        self.handle: Any = tensor.register_hook(self)

    def __call__(self, grad: torch.Tensor) -> Optional[torch.Tensor]:
        if self.handle is None:  # fired already
            return None
        rec = self.rec()
        if rec is not None and self.waiting is not None and _backward_of_another(rec):
            return None  # a leaf's: another thread's backward reached it; this one's is still to come
        self.remove()
        if rec is None:  # dropped: nobody can read its gradients
            return None
        rec._leaf_hooks.discard(self)
        if self.waiting is not None and rec._leaf_waiting.get(self.waiting) is self:
            del rec._leaf_waiting[self.waiting]
        try:
            kept = silently(self.keep, grad)  # (as a value's copy: see runtime.silently)
        except Exception as error:  # never into the backward pass: into rec.errors
            if raised_by_signal_handler(error):  # the program's own (a timeout's)
                raise
            rec._fail(self.key, error)
            return None
        # A gradient kept uncopied ('detach', 'none'): autograd takes a gradient that nothing
        # else holds as a parameter's .grad, which later backwards add to and zero_grad zeroes
        # in place. Held itself (an alias of one without a graph is the same value), it is not
        # taken; a view of it (a reduce's) is kept apart by handing backward a copy instead.
        if isinstance(kept, torch.Tensor) and kept is not grad and _same_view(kept, grad):
            kept = grad
        rec._add_gradient(self.key, self.position, kept)
        try:
            # (What a reduce returned: a property of it may run the program's code, or raise.)
            shares = silently(lambda held: _holds_view_of(held, grad), kept)
        except Exception as error:  # never into the backward pass: go on with a copy
            if raised_by_signal_handler(error):
                raise
            shares = True
        return grad.clone() if shares else None

    def remove(self) -> None:
        handle, self.handle = self.handle, None
        if handle is None:
            return
        handle.remove()  # torch allows this from inside the hook itself
        tensor = self.tensor()
        if tensor is not None and self.had_none and not tensor._backward_hooks:
            tensor._backward_hooks = None  # as it was: no hooks at all


def _backward_of_another(rec: ModelRecording) -> bool:
    """Whether the backward running now is another recording context's than ``rec``'s.

    A leaf's hook (a parameter's) fires in every backward that reaches the leaf, whichever
    thread's forward read it. A backward on the CPU runs in the thread that called it, in
    its context: one whose recordings are others' (a second thread recording the same model)
    is theirs. One run where no recording is entered (a thread the block started, autograd's
    own threads, a GPU's) cannot be told apart: taken.
    """
    if isinstance(threading.current_thread(), threading._DummyThread):  # (not a thread of Python's)
        return False
    if not context_recordings():
        return False
    return not _holds(receiving_recordings(), rec)


def _same_view(kept: torch.Tensor, grad: torch.Tensor) -> bool:
    """Whether ``kept`` is ``grad`` detached, and ``grad`` has no graph: the same value."""
    if (
        grad.requires_grad
        or kept.requires_grad
        or type(kept) is not type(grad)
        or grad.layout != torch.strided
    ):
        return False
    try:
        return (kept.data_ptr(), kept.dtype, kept.shape, kept.stride(), kept.device) == (
            grad.data_ptr(),
            grad.dtype,
            grad.shape,
            grad.stride(),
            grad.device,
        )
    except (RuntimeError, NotImplementedError):  # (no storage: a functional or fake tensor)
        return False


def _holds_view_of(kept: Any, grad: torch.Tensor, depth: int = 0) -> bool:
    """Whether ``kept`` (a tensor, or what a reduce returned: containers and dataclasses of
    them, nested) holds a tensor other than ``grad`` that shares its memory; True where it
    is nested too deep to tell (backward then goes on with a copy, which costs only memory)."""
    if isinstance(kept, torch.Tensor):
        return kept is not grad and _shares_memory(kept, grad)
    if depth > 8:
        return True
    if isinstance(kept, dict):
        items: Iterable[Any] = kept.values()
    elif isinstance(kept, (list, tuple, set, frozenset)):
        items = kept
    elif dataclasses.is_dataclass(kept) and not isinstance(kept, type):
        items = [getattr(kept, field.name, None) for field in dataclasses.fields(kept)]
    else:
        return False
    for item in items:
        if _holds_view_of(item, grad, depth + 1):
            return True
    return False


def _enclosing(model: torch.nn.Module, modules: Mapping[str, torch.nn.Module]) -> Tuple[torch.nn.Module, ...]:
    """Each module on the way from ``model`` to the targeted ``modules`` (by path), once; ``model`` last.

    >>> import torch
    >>> inner = torch.nn.Sequential(torch.nn.Linear(1, 1))
    >>> model = torch.nn.Sequential(inner, torch.nn.ReLU())
    >>> _enclosing(model, {"0.0": inner[0]}) == (inner[0], inner, model)
    True
    """
    root = module_at(model, "")  # (inside a wrapper)
    found: Dict[int, torch.nn.Module] = {}
    climbed: Set[str] = set()  # the paths whose way up is in ``found`` already
    for path, module in modules.items():
        parts = path.split(".") if path else []
        for k in range(len(parts), 0, -1):
            found.setdefault(id(module), module)
            parent = ".".join(parts[: k - 1])
            if parent in climbed:  # (16 Bottlenecks: 4 layers, climbed once each)
                break
            climbed.add(parent)
            module = module_at(model, parent)
    found.setdefault(id(root), root)
    found.pop(id(model), None)
    return (*found.values(), model)


def _one_site_specs(spec: Spec, code: types.CodeType, qualname: str) -> List[Tuple[Spec, str]]:
    """``spec`` split into one spec per site it names, each with its key label."""
    points = resolve([spec], read(code, qualname))
    out: List[Tuple[Spec, str]] = []
    for point in points:
        if isinstance(spec, Local) and point.kind == "store":  # (an argument's is its entry value)
            one: Spec = Local(spec.name, int(point.label.rsplit("@", 1)[1]))
        elif isinstance(spec, Attribute) and spec.at == "load":
            one = Attribute(spec.target, "load", int(point.label.rsplit("@", 1)[1]))
        else:
            one = spec
        out.append((one, point.label))
    return out


Marked = List[Tuple[torch.nn.Module, _PathMark]]


def _mark_all(marks: Sequence[Tuple[torch.nn.Module, _PathMark]]) -> Marked:
    """Put each path marker on its module; returns the (module, marker) pairs marked (all of them).

    A module already marked by another recording of the same path is counted, not
    marked again; one marked at another path (a model holding an extractor of another
    model: the teacher's ``'1'`` is the distiller's ``'tfeat.model.1'``) keeps its
    marker, which notes this path too (``also``): each recording's probes take their
    own path. Raises, marking nothing, if a module has a foreign attribute under the
    marker's name.
    """
    done: Marked = []
    with _marks_lock:
        try:
            for module, mark in marks:
                attrs = module.__dict__
                counts = _mark_counts.get(id(module))
                current = attrs.get(_MARK)
                if not counts and type(current) is _PathMark and current.module is not module:
                    # A copy made while its original is recorded holds the original's marker (so
                    # it records itself). Its own marker notes that one, so that both recordings
                    # take its values, and gives it back when it is unmarked (it was dropped: the
                    # original's recording got none of the copy's values after this one).
                    mark.also = (current,)
                    attrs[_MARK] = mark
                    _mark_counts[id(module)] = {mark: 1}
                elif counts and type(current) is _PathMark:
                    count = counts.get(mark, 0)
                    counts[mark] = count + 1
                    if not count and current != mark:
                        current.also = (*current.also, mark)
                elif _MARK in attrs and type(current) not in (str, _StalePath, _PathMark):
                    raise TargetError(
                        f"{type(module).__name__} at {str(mark)!r} already has an attribute {_MARK!r}"
                    )
                else:
                    mark.also = ()
                    attrs[_MARK] = mark
                    _mark_counts[id(module)] = {mark: 1}
                done.append((module, mark))
        except BaseException:
            _unmark_locked(done)
            raise
    return done


def _marks_its_module(mark: _PathMark) -> bool:
    """Whether ``mark`` is still on the module it was made for."""
    module = mark.module
    return module is not None and module.__dict__.get(_MARK) is mark


def _unmark_all(marked: Marked) -> None:
    with _marks_lock:
        _unmark_locked(marked)


def _unmark_locked(marked: Marked) -> None:
    """Take each marker of ``marked`` off; the pairs done leave the list, so that a second call,
    after one cut short (what a signal handler raised), takes off the rest. (One cut short before
    its count went down is done again; after it, doing it again changes nothing more.)"""
    done = 0
    try:
        for done, (module, mark) in enumerate(marked):  # noqa: B007 (read in finally)
            counts = _mark_counts.get(id(module), {})
            count = counts.get(mark, 0) - 1
            if count > 0:
                counts[mark] = count
                continue
            counts.pop(mark, None)
            current = module.__dict__.get(_MARK)
            if type(current) is not _PathMark:
                if not counts:
                    _mark_counts.pop(id(module), None)
                continue
            if current != mark:  # one of its other paths: the marker stays, for the one it names
                current.also = tuple(other for other in current.also if other != mark)
                continue
            # Still recorded at another path: that path's marker takes over.
            heir = None
            for other in current.also:
                if other in counts:
                    heir = other
                    break
            if heir is not None:
                heir.also = tuple(other for other in current.also if other is not heir)
                module.__dict__[_MARK] = heir
            else:
                _mark_counts.pop(id(module), None)
                # A copy's: its original's marker again, while that one is still marked (see _mark_all).
                given = None
                for other in current.also:
                    if _marks_its_module(other):
                        given = other
                        break
                if given is not None and given.module is not module:
                    module.__dict__[_MARK] = given
                else:
                    del module.__dict__[_MARK]
            current.also = ()
            copies, current.copies = current.copies, None
            for ref in copies or ():  # copies made while it was marked
                twin = ref()
                if twin is not None and twin.__dict__.get(_MARK) is current and id(twin) not in _mark_counts:
                    del twin.__dict__[_MARK]
        else:
            done = len(marked)
    finally:
        del marked[:done]


_Found = TypeVar("_Found")


class _found_once(Generic[_Found]):  # noqa: N801 (a decorator, as functools.cached_property)
    """``functools.cached_property`` without the lock Python 3.11's takes: one lock for every
    instance, so that one plan's walk held up every other's, and a child forked while another
    thread held it would wait for it forever at its first plan's.

    >>> class C:
    ...     @_found_once
    ...     def walked(self):
    ...         print("walking")
    ...         return 1
    >>> c = C()
    >>> c.walked, c.walked  # (kept in the instance, as a cached_property does: read as an attribute)
    walking
    (1, 1)
    """

    def __init__(self, find: Callable[[Any], _Found]) -> None:
        self.find = find
        self.__doc__ = find.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: Optional[type] = None) -> _found_once[_Found]: ...
    @overload
    def __get__(self, instance: object, owner: Optional[type] = None) -> _Found: ...
    def __get__(self, instance: Any, owner: Optional[type] = None) -> Any:
        if instance is None:
            return self
        # (two threads may both find it: one answer)
        value = instance.__dict__[self.name] = self.find(instance)
        return value


#: The options of :func:`record` that :class:`Plan` takes: what is recorded and how it is
#: copied (the others, ``keep``, ``threads``, ``stop_after_last``, are the recording's).
PLAN_OPTIONS: Tuple[str, ...] = ("copy", "to", "dtype", "reduce", "grad")


class Plan:
    """What :func:`record` sets up for one (model, targets, options), reusable across passes.

    Expanding the targets and grouping their specs by (class, method, instance
    paths) is done once here; :meth:`patch` applies one patch per group and
    :meth:`running` runs one recording with the targeted modules marked. A
    :class:`~bcrecord.torch.FeatureExtractor` keeps its plan and patches across
    calls, so each call only marks modules and enters a recording.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        targets: Union[str, Iterable[str]],
        *,
        copy: str = "clone",
        to: Device = None,
        dtype: Optional[torch.dtype] = None,
        reduce: Union[
            Callable[[torch.Tensor], Any], Mapping[str, Optional[Callable[[torch.Tensor], Any]]], None
        ] = None,
        grad: bool = False,
    ) -> None:
        check_options(copy=copy, grad=grad)
        self.model = model
        self.copy = copy
        #: The recording running now (gradient targets store their gradients in it).
        self.recording: Optional[ModelRecording] = None
        #: Keys each target string produces.
        self.keys: Dict[str, List[str]] = {}
        #: The targeted submodules, by path.
        self.modules: Dict[str, torch.nn.Module] = {}
        policies: Dict[Any, ValuePolicy] = {}

        def policy(reducer: Any, wants_grad: bool) -> ValuePolicy:
            found = policies.get((reducer, wants_grad))
            if found is None:  # (made once: each key of a target asks)
                found = policies[reducer, wants_grad] = value_policy(copy, to, dtype, reducer, wants_grad)
            return found

        # What the targets ask of each key: overlapping targets ("out" and "out@1",
        # "x@0" and "x@0.grad") ask for one value, recorded once.
        requests: Dict[str, _Request] = {}
        # One reading per (spec, code): the instances of a class (16 Bottlenecks) share its code.
        sites_of: Dict[Tuple[Spec, types.CodeType], List[Tuple[Spec, str]]] = {}
        # One look-up per (class, method), and of its code, for all its instances' targets.
        functions: Dict[Tuple[type, str], Tuple[types.FunctionType, types.CodeType]] = {}
        with _resolving(model):  # each submodule path walked once, for all the targets
            expanded = expand_all(model, targets)
            _check_reduce_keys(reduce, expanded)
            for text, concrete in expanded.items():
                self.keys[text] = []
                for target in concrete:
                    module = self.modules.setdefault(target.path, module_at(model, target.path))
                    cls, method = type(module), target.method
                    if (cls, method) not in functions:
                        func = function_of(getattr(cls, method))
                        functions[cls, method] = (func, original_code(func))
                    func, code = functions[cls, method]
                    reducer = _reduce_for(reduce, text, target)
                    # A gradient no reduce entry names: it takes its value's (see _Request.adopts).
                    unnamed = target.grad and isinstance(reduce, Mapping) and not _names(reduce, text, target)
                    sites = sites_of.get((target.spec, code))
                    if sites is None:
                        try:
                            sites = _one_site_specs(target.spec, code, func.__qualname__)
                            sites_of[target.spec, code] = sites
                        except TargetError as error:  # say which module: a glob reaches many
                            raise TargetError(f"{text!r} at {target.path or '<root>'!r}: {error}") from None
                    keys = self.keys[text]
                    for spec, label in sites:
                        key = f"{target.path}:{method}:{label}"
                        keys.append(key)
                        if target.grad:
                            keys.append(key + ".grad")
                        found = requests.get(key)
                        if found is None:
                            requests[key] = _Request(
                                cls, method, target.path, spec, reducer, target.grad, text, adopts=unnamed
                            )
                            continue
                        if found.reducer is not reducer and not unnamed:
                            if not found.adopts:
                                graded = found.grad or target.grad
                                why = " (a gradient takes its value's)" if graded else ""
                                raise TargetError(
                                    f"{key!r} is asked for by {found.text!r} and by {text!r} with different "
                                    f"reduce functions{why}; give both the same, or ask for it once"
                                )
                            found.reducer, found.text = reducer, text
                        found.adopts = found.adopts and unnamed
                        found.grad = found.grad or target.grad
            # One patch per (class, method, set of instance paths): specs wanted by exactly
            # the same instances share it. Gradient targets get a patch per key.
            wanted: Dict[Tuple[type, str, Spec], set] = defaultdict(set)
            grad_specs: Dict[Tuple[type, str, str], List[Spec]] = defaultdict(list)
            # One spec per (site, policy): 16 instances' keys share it (a spec is checked as it is
            # made, which a whole resnet's 160 keys paid 160 times). By identity: the instances of
            # a class share their site specs (sites_of), and a spec's hash is computed each time.
            with_policy: Dict[Tuple[int, int], Spec] = {}
            paths_of: Dict[Tuple[type, str, int], Tuple[Spec, set]] = {}
            for key, asked in requests.items():
                keep_value = policy(asked.reducer, grad)  # a .grad target hooks the live value, not this
                if asked.grad:
                    # The gradient gets the value's options, outside the graph.
                    keep_grad = policy(asked.reducer, False)
                    grad_specs[(asked.cls, asked.method, asked.path)].append(
                        dataclasses.replace(asked.spec, copy=_GradCopy(self, key, keep_value, keep_grad))
                    )
                else:
                    kept_as = with_policy.get((id(asked.spec), id(keep_value)))
                    if kept_as is None:
                        kept_as = with_policy[id(asked.spec), id(keep_value)] = dataclasses.replace(
                            asked.spec, copy=keep_value
                        )
                    group = paths_of.get((asked.cls, asked.method, id(kept_as)))
                    if group is None:
                        group = paths_of[asked.cls, asked.method, id(kept_as)] = (kept_as, set())
                    group[1].add(asked.path)
            for (cls, method, _), (kept_as, paths) in paths_of.items():  # (equal specs: one group)
                wanted[(cls, method, kept_as)] |= paths
            _one_path_each(model, self.modules)
            #: The modules on the way from the model to each target, itself last: what a
            #: forward stopped at a target unwinds (the model's own, for an extractor).
            self.enclosing = _enclosing(model, self.modules)
        self.specs: Dict[Tuple[type, str, frozenset], List[Spec]] = defaultdict(list)
        for (cls, method, spec), paths in wanted.items():
            self.specs[(cls, method, frozenset(paths))].append(spec)
        for (cls, method, path), specs in grad_specs.items():
            self.specs[(cls, method, frozenset([path]))].extend(specs)
        self.needed = frozenset(k for keys in self.keys.values() for k in keys if not k.endswith(".grad"))
        #: Every value policy of the targets, for recordings to wait on (see ModelRecording._settle).
        self.policies: Tuple[ValuePolicy, ...] = tuple(policies.values())
        #: ``keys``, read-only, for recordings to share.
        self.keys_view: Mapping[str, List[str]] = types.MappingProxyType(self.keys)
        #: A marker per targeted submodule, made once (see the module docstring).
        self.marks = [(module, _path_mark(module, path)) for path, module in self.modules.items()]

    @_found_once
    def syncs(self) -> bool:
        """Whether a forward with autograd on must run whole (see :func:`syncs_gradients`): an
        extractor's stop asks; a walk over every module, so not made where nothing asks."""
        return syncs_gradients(self.model)

    def patch(self, stops: bool = False) -> List[Patch]:
        """Apply one in-place patch per group; all or none.

        ``stops``: for a recording that may stop the forward early: its probes run after
        other recordings' at the same place, which get the value before the stop.

        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> plan = Plan(model, ["0", "1:forward:input"])
        >>> patches = plan.patch()
        >>> [patch.keys for patch in patches]  # '*': the path of each instance recorded
        [('*:forward:return',), ('*:forward:input',)]
        >>> remove_all(patches)
        """
        patches: List[Patch] = []
        try:
            for (cls, method, owners), specs in self.specs.items():
                # In place: bound methods kept elsewhere (self.forward = self.forward_split_cat)
                # and super() calls reach the probes too; the owner picks the instances.
                owner = _Owner({path: self.modules[path] for path in owners})
                # A method's return is what its caller gets: a functools.wraps wrapper's
                # (transformers' can_return_tuple...), which may change what the function it
                # wraps returned; its other targets are in that function. Per instance: the
                # outermost wrapper given the instance (not a ``*args`` deprecation shim).
                outer = getattr(cls, method)
                returns = [spec for spec in specs if isinstance(spec, Return)]
                if (
                    returns
                    and isinstance(outer, types.FunctionType)
                    and isinstance(getattr(outer, "__wrapped__", None), types.FunctionType)
                    and outermost_taking_instance(outer) is not function_of(outer)
                ):
                    patches.append(
                        patch_method(cls, method, returns, name=owner, in_place=True, unwrap=False)
                    )
                    self._note_classes(patches[-1], cls)
                    specs = [spec for spec in specs if not isinstance(spec, Return)]
                    if not specs:
                        continue
                patches.append(patch_method(cls, method, specs, name=owner, in_place=True))
                self._note_classes(patches[-1], cls)
            if stops:
                for patch in patches:
                    patch.deliver_last()
        except BaseException:
            remove_all(patches)
            raise
        return patches

    def _note_classes(self, patch: Patch, cls: type) -> None:
        """Note, for ``patch``'s function, the classes a compiled graph running it is guarded on."""
        noted = patched_classes.setdefault(patch.function, weakref.WeakKeyDictionary())
        kinds = (cls, *(type(module) for module in self.enclosing))
        noted[patch] = (*noted.get(patch, ()), *(weakref.ref(kind) for kind in kinds))

    def recording_for(
        self,
        patches: Sequence[Patch],
        *,
        keep: Union[str, int],
        threads: str,
        stop_after_last: bool,
        reused: bool = False,
    ) -> ModelRecording:
        """A recording of ``patches``' values; ``reused``: one made to run pass after pass.

        A reused recording keeps its routes when it exits; between passes call its
        ``_empty()`` (see :class:`~bcrecord.torch.FeatureExtractor`).

        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> plan = Plan(model, ["0", "1:forward:input"])
        >>> patches = plan.patch()
        >>> rec = plan.recording_for(patches, keep="last", threads="context", stop_after_last=False)
        >>> rec.keys_of("0"), rec.active
        (['0:forward:return'], False)
        >>> remove_all(patches)
        """
        kind = _ReusedRecording if reused else ModelRecording
        rec = kind(copy=self.copy, keep=keep, threads=threads, stop_after_last=stop_after_last, only=patches)
        rec.targets = self.keys_view
        rec._policies = self.policies
        if stop_after_last:
            rec._needed = self.needed
            # An extractor calls the model, and catches the stop outside its forward; the
            # model's own forward catches it under record() (see _StopAtRoot).
            rec._unwound = self.enclosing if reused else self.enclosing[:-1]
            # (The model's own forward set on it runs inside the stop's catch, _StopAtRoot, too.)
            rec._through = self.enclosing
            rec._caught_in = None if reused else self.enclosing[-1]
        return rec

    def running(
        self,
        patches: Sequence[Patch],
        *,
        keep: Union[str, int],
        threads: str,
        stop_after_last: bool,
    ) -> Pass:
        """One recording of ``patches``' values, with the targeted modules marked.

        With ``stop_after_last``, the model's ``forward`` returns None once every
        target is recorded.

        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
        >>> plan = Plan(model, ["0", "1:forward:input"])
        >>> patches = plan.patch()
        >>> with plan.running(patches, keep="all", threads="context", stop_after_last=False) as rec:
        ...     out = model(torch.ones(1, 2))
        >>> linear = rec["0:forward:return"]
        >>> torch.equal(rec["1:forward:input"], linear), torch.equal(out, linear.relu())
        (True, True)
        >>> remove_all(patches)
        """
        rec = self.recording_for(patches, keep=keep, threads=threads, stop_after_last=stop_after_last)
        return Pass(self, rec, stop_after_last)


class _ReusedRecording(ModelRecording):
    """A model recording entered once per extractor call (routes kept between calls)."""

    _keeps_routes = True
    _stop_option = "stop_early"

    def _sink(self, site_id: int, owner: Optional[str] = None) -> Optional[Sink]:
        sink = super()._sink(site_id, owner)
        if sink is None:
            return None
        store = sink.store

        def store_while_active(value: Any) -> None:
            # Another thread (threads='all') may finish copying a value after the call
            # ended: it is not the next call's.
            if self._token is not None:
                store(value)

        return sink.with_store(store_while_active)


class Pass:
    """One pass of ``rec`` over the model: targeted modules marked while it is active.

    With ``stop_at_root``, the model's ``forward`` catches :class:`StopForward` and
    returns None; otherwise the caller catches it (the extractor calls the model
    itself). A class rather than a generator: it runs once per extractor call.
    """

    __slots__ = ("plan", "rec", "stop_at_root", "marked", "stopping")

    def __init__(self, plan: Plan, rec: ModelRecording, stop_at_root: bool) -> None:
        self.plan, self.rec, self.stop_at_root = plan, rec, stop_at_root
        self.marked: Marked = []
        #: The model's stopping forward this pass is in (see _StopAtRoot.take).
        self.stopping: Optional[_StopAtRoot] = None

    def __enter__(self) -> ModelRecording:
        plan, rec = self.plan, self.rec
        self.marked = _mark_all(plan.marks)
        try:
            if self.stop_at_root:
                self.stopping = _StopAtRoot.take(plan.model, rec)
            plan.recording = rec
            rec.__enter__()
        except BaseException:
            self.__exit__()
            raise
        return rec

    def __exit__(self, *exc: object) -> None:
        try:
            self.rec.__exit__()
        finally:
            self.plan.recording = None  # the plan outlives the pass; its values must not
            try:
                if self.stopping is not None:
                    # Forgotten once released: an exit done again after one cut short releases it then.
                    _StopAtRoot.release(self.plan.model, self.rec, self.stopping)
                    self.stopping = None
            finally:  # (its warning made an error)
                try:
                    _unmark_all(self.marked)
                except BaseException:
                    _unmark_all(self.marked)  # the rest, where what a signal handler raised cut it short
                    raise


def record(
    model: torch.nn.Module,
    targets: Union[str, Iterable[str]],
    *,
    copy: str = "clone",
    to: Device = None,
    dtype: Optional[torch.dtype] = None,
    reduce: Union[
        Callable[[torch.Tensor], Any], Mapping[str, Optional[Callable[[torch.Tensor], Any]]], None
    ] = None,
    grad: bool = False,
    keep: Union[str, int] = "all",
    stop_after_last: bool = False,
    threads: Optional[str] = "all",
) -> RecordBlock:
    """Record ``targets`` inside ``model`` while the block runs; yields the recording.

    Targets are strings like ``'layer1.0:forward:out@2'``, ``':_forward_impl:x@0'``,
    ``'blocks.*:forward:x'`` or a bare module path ``'layer1'`` (its output); see
    :mod:`bcrecord.torch.targets`. Keys are ``'<path>:<method>:<target>'``; a bare
    path's key is ``'<path>:forward:return'`` (``'<path>:forward_fast:return'`` where the
    instance sets another method as its forward, ``self.forward = self.forward_fast``: its
    output is that method's return). Targets are resolved when the block starts: a
    module put in the model meanwhile (at a targeted path, or where a glob target matches:
    ``model.blocks.append(...)``) records nothing, and a warning names it when the block ends.

    Values are detached clones by default (``copy='detach'`` keeps the tensor itself,
    detached; ``copy='none'`` keeps each value itself, as the core does: a tensor stays in
    the autograd graph). ``to='cpu'`` offloads (from a GPU without blocking the model; reading
    a value waits for its copy; a device this machine lacks is a SpecError), ``dtype``
    casts, ``reduce`` (a callable, or a dict by expanded target, else by target string as
    given; None: as is) is applied first,
    ``grad=True`` keeps values in the autograd graph; a ``.grad`` target's gradient
    gets the same ``to``, ``dtype`` and ``reduce``. ``keep='last'`` or an int bounds memory per key.

    ``stop_after_last=True`` ends each forward pass as soon as every target has a
    value: the model's ``forward`` then returns None, and the rest of the model is
    not computed (a model with forward or backward hooks of its own, which would get
    None, runs whole). A target naming several sites (a local without ``@index``)
    waits for each: one in a branch the model does not take holds the stop back
    (the forward runs whole, with a warning naming it).

    ``threads='all'`` (the default) also takes the values of threads that have no
    recording of their own: ``nn.DataParallel``'s replicas run in threads it starts,
    also where the model recorded is the one inside it; so does any other thread that
    runs the model meanwhile. ``'context'`` takes this thread's values only (and those
    of threads and tasks it hands its context to, :func:`bcrecord.carry`).

    >>> import torch
    >>> from bcrecord.torch import record
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(inplace=True))
    >>> with record(net, ["0", "1"]) as rec:
    ...     out = net(torch.ones(1, 2))
    >>> torch.equal(rec["1:forward:return"], out), sorted(rec.keys_of("0"))
    (True, ['0:forward:return'])

    What it returns is good for one ``with`` block: call ``record()`` for each. As a
    decorator, it records each call of the function in a block of its own (see
    :class:`RecordBlock`).
    """
    if isinstance(targets, collections.abc.Iterator):  # (a generator: as a decorator, each call reads it)
        targets = tuple(targets)
    policy = dict(copy=copy, to=to, dtype=dtype, reduce=reduce, grad=grad)
    run = dict(keep=keep, threads="all" if threads is None else threads, stop_after_last=stop_after_last)
    shown = f"{type(model).__name__}, {_short.repr(targets)}"
    return RecordBlock(functools.partial(_record, model, targets, policy, run), shown)


P = ParamSpec("P")
T = TypeVar("T")
#: How a record(...) block shows its targets: a long list cut short.
_short = reprlib.Repr()
_short.maxlist = _short.maxtuple = 4
_short.maxstring = 120


#: What reading values from record()'s own result says: its values are the entered block's.
_NOT_A_RECORDING = (
    "record() returns a context manager: write 'with record(model, targets) as rec:' "
    "and run the model inside the block"
)


class RecordBlock(contextlib.AbstractContextManager["ModelRecording"]):
    """What :func:`record` returns: a context manager good for one block, that says so when
    entered again, or a decorator whose function records each call in a block of its own,
    keeping the function's signature (for type checkers too). That block's recording is
    not handed to the function: a recording the caller has entered gets the values too (not
    the gradients of ``.grad`` targets, which go to the block's own recording alone).

    >>> import bcrecord, torch
    >>> from bcrecord.torch import record
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    >>> @record(net, "1")
    ... def run(x: torch.Tensor) -> torch.Tensor:
    ...     return net(x)
    >>> with bcrecord.recording() as outer:
    ...     y = run(torch.ones(1, 2))
    >>> outer.keys(), torch.equal(outer["1:forward:return"], y)
    (['1:forward:return'], True)
    >>> record(net, "1")
    <record(Sequential, '1'): not entered yet>
    """

    def __init__(self, make: Callable[[], ContextManager[ModelRecording]], shown: str = "") -> None:
        self._make = make
        #: The model's class and the targets as given, for the repr.
        self._shown = shown
        self._block: Optional[ContextManager[ModelRecording]] = None
        self._used = False
        #: Whether a thread is entering it now (see __enter__).
        self._entering = False

    def __repr__(self) -> str:
        state = "entered" if self._block is not None else "used" if self._used else "not entered yet"
        return f"<record({self._shown}): {state}>"

    def __getitem__(self, key: str) -> NoReturn:
        raise TypeError(f"{_NOT_A_RECORDING}; then read rec[{key!r:.80}]")

    # Without these, `in`, `for` and `len` would fall back to __getitem__(0) and say "rec[0]".
    def __contains__(self, key: object) -> NoReturn:
        raise TypeError(f"{_NOT_A_RECORDING}; then test {key!r:.80} in rec")

    def __iter__(self) -> NoReturn:
        raise TypeError(f"{_NOT_A_RECORDING}; then iterate over rec.keys()")

    def __len__(self) -> NoReturn:
        raise TypeError(f"{_NOT_A_RECORDING}; then call len(rec)")

    def __bool__(self) -> bool:  # (not len(): a block is an object like any other)
        return True

    def __getattr__(self, name: str) -> Any:
        # Called only for names the block lacks: a recording's own (`keys`, `all`, the instance's
        # `errors`, `failures`, `targets`) means a forgotten `with`.
        own = ("errors", "failures", "targets")
        if not name.startswith("_") and (hasattr(ModelRecording, name) or name in own):
            raise AttributeError(f"{_NOT_A_RECORDING}; then call rec.{name}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __enter__(self) -> ModelRecording:
        claimed = False
        try:
            # Claimed under the lock (two threads entering one block at once both went in),
            # refused outside it (as a recording's entry: see bcrecord.Recording.__enter__).
            with _blocks_lock:
                if not self._used and not self._entering:
                    claimed = True
                    self._entering = True
            if not claimed:
                raise RuntimeError(
                    "this record(...) has been entered already: call record() again for each "
                    "'with' block (or keep one block open around the loop)"
                )
            # Where the block runs: code further out than it cannot get the model's output (see
            # _inside_another_forward). Found first: nothing may cut in once the block is entered.
            opener = outside_bcrecord(sys._getframe(1))
            block = self._make()
            rec = block.__enter__()  # (a bad target raises here: the block was never used)
            self._used, self._block = True, block
            rec._opened_in = opener
        finally:
            if claimed:
                self._entering = False
        return rec

    def __exit__(self, *exc: Any) -> Optional[bool]:
        block, self._block = self._block, None
        if block is None:  # exited again, or never entered: nothing to end, as a recording's exit
            return None
        return block.__exit__(*exc)

    def __call__(self, function: Callable[P, T]) -> Callable[P, T]:
        if not callable(function):  # (now, not where the decorated name is first called)
            raise TypeError(
                f"record(...) decorates a function to record around its calls, got {function!r:.80} "
                f"({type(function).__name__})"
            )

        @functools.wraps(function)
        def recorded(*args: P.args, **kwargs: P.kwargs) -> T:
            with RecordBlock(self._make, self._shown):
                return function(*args, **kwargs)

        return recorded


@contextlib.contextmanager
def _record(
    model: torch.nn.Module, targets: Union[str, Iterable[str]], policy: Dict[str, Any], run: Dict[str, Any]
) -> Iterator[ModelRecording]:
    """:func:`record`'s block: plan, patch, record, and remove the patches after."""
    require_bool("stop_after_last", run["stop_after_last"])
    require_module(model)  # (before the walk below: what is not a module has no modules)
    with _resolving(model):
        # Every module at each of its paths, walked first: warn_shared's list, and the glob's
        # (each module once) made from it; the same at the end means nothing was added.
        walked = named_modules(unwrap(model), remove_duplicate=False)
        plan = Plan(model, targets, **policy)
        warn_shared(model, plan.modules)
    # (Weak: a module taken out of the model during the block is freed as it would be.)
    modules_then = [(path, weakref.ref(module)) for path, module in walked]
    del walked
    patches = plan.patch(stops=bool(run.get("stop_after_last")))
    try:
        running = plan.running(patches, **run)
    except BaseException:  # a bad keep= or threads=
        remove_all(patches)
        raise
    try:
        with running as rec:
            yield rec
    finally:
        try:
            # Again (nothing more to do after a whole exit): what a signal handler raised as the
            # with's exit began cut it short before any of it ran, and left the recording entered.
            running.__exit__()
        finally:
            remove_all(patches)
            running.rec._end()
        _warn_replaced(plan)
        _warn_added(plan, modules_then)


def _warn_replaced(plan: Plan) -> None:
    """Warn where a targeted submodule is no longer at its path: replaced (or removed) during the block.

    The targets were resolved, and their modules marked, when the block started: one put
    at that path meanwhile (``model.fc = nn.Identity()``, an adapter swapped in) recorded
    nothing, so the path's values end at the swap; one holding a deep copy of the module made
    meanwhile (``fuse_modules``) has the copy record under the path. Said once, when the block ends.
    """
    # (Not a deepcopy of the module, made during the block and put there: it records as its
    # module does, under the same path, marked with it.)
    marks = dict(zip(plan.modules, (mark for _, mark in plan.marks), strict=True))
    gone = [
        path
        for path, module in plan.modules.items()
        if (now := _submodule(plan.model, path)) is not module
        and not any([copy() is now for copy in marks[path].made])
    ]
    if not gone:  # (the usual case: no walk of the model's modules)
        return
    copies = _copies_in(plan, gone, marks)
    gone = [path for path in gone if path not in copies]
    if gone:
        listed = ", ".join(repr(path) for path in gone)
        warn(
            f"the module{'s' if len(gone) > 1 else ''} at {listed} "
            f"{'were' if len(gone) > 1 else 'was'} replaced or removed while recording: what ran there "
            "afterwards recorded nothing (targets are resolved when record() starts); record "
            f"the model again to include it{_moved(plan, gone)}"
        )
    for path, now in copies.items():
        warn(
            f"the module at {path!r} was replaced while recording by one holding a copy of it made "
            f"meanwhile (copy.deepcopy: fuse_modules makes one), at {now!r}: marked as the module, the "
            f"copy records under {path!r} as the module did, so the values of {path!r} after the change "
            f"are the copy's (record the model again to record the new modules at their own paths)"
        )


def _moved(plan: Plan, gone: Sequence[str]) -> str:
    """``'; the one from 'a' is now at 'b'...'`` for targeted modules moved to another path
    (``ModuleList.insert``): still marked, they record under their first path."""
    paths = {id(module): path for path, module in named_modules(unwrap(plan.model))}
    moved = [(path, paths[id(plan.modules[path])]) for path in gone if id(plan.modules[path]) in paths]
    if not moved:
        return ""
    listed = ", ".join(f"{old!r} is now at {new!r}" for old, new in moved)
    if len(moved) > 1:
        return f"; the ones moved still record under their old paths ({listed})"
    return f"; the one moved still records under its old path ({listed})"


def _copies_in(plan: Plan, gone: Sequence[str], marks: Mapping[str, _PathMark]) -> Dict[str, str]:
    """Of the targeted modules gone from their paths (not moved), those whose deep copy made
    during the block is in the model, and its path (``fuse_modules`` copies a conv into the
    fused module it puts at the conv's path): marked as the module, it records under its path."""
    paths = {id(module): path for path, module in named_modules(unwrap(plan.model))}
    return {
        path: paths[id(copy)]
        for path in gone
        if id(plan.modules[path]) not in paths  # (moved: said by _moved)
        for copy in (ref() for ref in marks[path].made)
        if copy is not None and id(copy) in paths
    }


def _warn_added(
    plan: Plan, modules_then: Sequence[Tuple[str, Callable[[], Optional[torch.nn.Module]]]]
) -> None:
    """Warn where a glob target matches a module added during the block (``model.blocks.append(...)``).

    Its module was not there to be marked when the block started: it recorded nothing.
    Said once, when the block ends, naming the paths. ``modules_then``: each path of
    ``named_modules(unwrap(model), remove_duplicate=False)`` when it started, and a weak
    reference to its module.
    """
    if not any([ch in text for text in plan.keys for ch in "*?["]):
        return  # (no glob: nothing to match again, no walk)
    root = unwrap(plan.model)
    if root is plan.model and _same_modules(named_modules(root, remove_duplicate=False), modules_then):
        return  # (the usual case: every glob matches what it matched, no module read again)
    added: Dict[str, str] = {}  # path: the first target string that matches it
    targeted = {id(module) for module in plan.modules.values()}
    with _resolving(plan.model):  # each glob matched once, for all its targets
        for text in plan.keys:
            for path in new_matches(plan.model, text, plan.modules):
                if id(_submodule(plan.model, path)) not in targeted:  # (not one moved: still marked)
                    added.setdefault(path, text)
    if added:
        many = len(added) > 1
        listed = ", ".join(f"{path!r} (matching {text!r})" for path, text in added.items())
        warn(
            f"the module{'s' if many else ''} at {listed} {'were' if many else 'was'} added while "
            f"recording: {'they' if many else 'it'} recorded nothing (targets are resolved when "
            f"record() starts); record the model again to include {'them' if many else 'it'}"
        )


def _same_modules(
    now: Sequence[Tuple[str, torch.nn.Module]],
    then: Sequence[Tuple[str, Callable[[], Optional[torch.nn.Module]]]],
) -> bool:
    """Whether a walk lists the modules ``then`` refers to, at the same paths, in the same order."""
    return len(now) == len(then) and all(
        path == path_then and module is ref()
        for (path, module), (path_then, ref) in zip(now, then, strict=True)
    )


#: Whether a caller in this context catches :class:`StopForward` (the root's
#: forward under ``stop_after_last``, or an extractor): only then does a probe raise it.
_stopping: contextvars.ContextVar[bool] = carried_variable(
    contextvars.ContextVar("bcrecord_stopping", default=False)
)
_roots_lock = safe_over_forks(threading.Lock())
#: The :class:`_StopAtRoot` calls running in this context, outermost first.
_roots_running: contextvars.ContextVar[Tuple[_StopAtRoot, ...]] = carried_variable(
    contextvars.ContextVar("bcrecord_roots_running", default=())
)
#: The callers in this context that catch :class:`StopForward` (roots that stop, extractors),
#: outermost first: each one's recordings (see StopForward._caught_further_out).
_catching: contextvars.ContextVar[Tuple[Tuple[ModelRecording, ...], ...]] = carried_variable(
    contextvars.ContextVar("bcrecord_catching", default=())
)
#: Whether torch.export is tracing (torch.compiler.is_exporting, where torch has it).
_exporting: Callable[[], bool] = getattr(getattr(torch, "compiler", None), "is_exporting", lambda: False)


def _tracing() -> bool:
    """Whether torch.export, torch.jit.trace or make_fx is tracing: a forward stopped early would give
    them no output (jit.trace: "didn't return any values"; export loses track of the unwound calls;
    make_fx's graph returns None)."""
    return _exporting() or _tracing_state() is not None or _making_fx()


def _making_fx() -> bool:
    """Whether ``make_fx`` traces (its dispatch mode is on: checked only where a mode is)."""
    if not torch._C._len_torch_dispatch_stack():
        return False
    try:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode
    except ImportError:  # (another torch)
        return False
    return get_proxy_mode() is not None


def threads_for(model: torch.nn.Module, threads: Optional[str]) -> str:
    """``threads`` as given, or by default ``'all'`` where ``model`` holds an ``nn.DataParallel``
    (its replicas run in threads it starts, with no recording of their own), else ``'context'``:
    an extractor's, which runs the model itself, in the call.

    >>> linear = torch.nn.Linear(1, 1)
    >>> threads_for(torch.nn.DataParallel(linear), None), threads_for(linear, None)
    ('all', 'context')
    """
    if threads is not None:
        return threads
    parallel = any([isinstance(module, torch.nn.DataParallel) for module in model.modules()])
    return "all" if parallel else "context"


def syncs_gradients(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds a DistributedDataParallel, whose gradients sync only after a whole forward.

    DDP readies its gradient all-reduce when its forward returns: a forward stopped
    early unwinds through it, and every rank would keep its own gradients, silently.
    So with autograd on, a forward through one is not stopped early.

    >>> syncs_gradients(torch.nn.Linear(1, 1))
    False
    """
    return any([isinstance(module, torch.nn.parallel.DistributedDataParallel) for module in model.modules()])


def broadcasts_buffers_next(model: torch.nn.Module) -> bool:
    """Whether a DistributedDataParallel that ``model`` holds, or the one running it, would
    broadcast its buffers at its next forward unless this forward returns.

    After a training step DDP broadcasts rank 0's buffers (batch norm statistics) at the
    start of the next forward; a forward without autograd turns that off when it returns.
    Stopped early on one rank only (a recording there, none on the others), the ranks'
    next forwards disagreed on the broadcast and hung. So such a forward runs whole, also
    without autograd; once it has, the ones after it may stop early.

    >>> broadcasts_buffers_next(torch.nn.Linear(1, 1))
    False
    """
    wrappers = [
        module for module in model.modules() if isinstance(module, torch.nn.parallel.DistributedDataParallel)
    ]
    running = getattr(torch.nn.parallel.DistributedDataParallel, "_active_ddp_module", None)
    if running is not None:
        wrappers.append(running)
    return any([getattr(ddp, "will_sync_module_buffers", lambda: True)() for ddp in wrappers])


def inside_ddp_forward() -> bool:
    """Whether a DistributedDataParallel's forward is running, around a model that holds none.

    A model recorded on its own (``record(ddp.module, ...)``) may still be run by the DDP
    around it (``ddp(x)``): stopped early, it would unwind that forward as well. DDP marks
    its forward on its class (for Dynamo); a DDP run by the python reducer marks nothing.

    >>> inside_ddp_forward()
    False
    """
    return getattr(torch.nn.parallel.DistributedDataParallel, "_active_ddp_module", None) is not None


#: The code every module's call runs: a frame of it is a module's call in progress.
_CALL_CODE = getattr(torch.nn.Module._call_impl, "__code__", None)


def _inside_another_forward(model: torch.nn.Module, until: Collection[types.FrameType] = ()) -> bool:
    """Whether ``model`` is called from inside another module's code: its call (its forward, a
    hook), or another of its methods (a LightningModule's ``training_step``), which needs the
    output; but a wrapper's that hands on its output (DistributedDataParallel, torch.compile's).
    Only the frames up to one in ``until`` count (the frame that opened the recording's block,
    which is handed what the model returns, None when it stops, unless it is another module's
    method too): code further out gets what the block's code makes of it.

    >>> import torch
    >>> inner = torch.nn.Identity()
    >>> inner.forward = lambda x: _inside_another_forward(inner)
    >>> class Task(torch.nn.Module):
    ...     def step(self, x): return inner(x)
    >>> inner(1), torch.nn.Sequential(inner)(1), Task().step(1), torch.nn.DataParallel(inner)(1)
    (False, True, True, False)
    """
    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        # (Its locals read only where a method's first argument is named self: reading them
        # copies them all, on some Pythons.)
        if code is _CALL_CODE or (code.co_argcount and code.co_varnames[0] == "self"):
            caller = frame.f_locals.get("self")
            if caller is not model and isinstance(caller, torch.nn.Module) and unwrap(caller) is not model:
                return True
        if _holds(until, frame):
            return False
        frame = frame.f_back
    return False


class _StopAtRoot:
    """``model.forward`` while recordings with ``stop_after_last`` run on ``model``.

    It calls the forward that was there and returns None when a recording of this
    context stops the pass. One per model, shared by the recordings that run on it
    at the same time (threads), and taken out when the last one ends. A
    ``copy.deepcopy`` of the model made meanwhile gets one that calls the copy.
    """

    def __init__(
        self, model: torch.nn.Module, forward: Any, previous: Any, source: Optional[_StopAtRoot] = None
    ) -> None:
        self.model, self.forward, self._previous = model, forward, previous
        #: syncs_gradients(model), found at the first call (a deepcopy's model is not built yet here).
        self.syncs: Optional[bool] = None
        self.recordings: List[ModelRecording] = []
        #: For a deepcopy's: the model's own, whose recordings stop the copy's passes too
        #: (weak: the copy must not keep them, or their values, alive).
        self.source = None if source is None else weakref.ref(source)
        #: The deepcopies' (weak): put back with this one when no recording runs on them.
        self.twins: weakref.WeakSet[_StopAtRoot] = weakref.WeakSet()

    @property
    def previous(self) -> Any:
        """What the model's ``__dict__`` held under ``forward`` before (``_MISSING``: nothing)."""
        return self._previous

    @previous.setter
    def previous(self, value: Any) -> None:
        # A patch removed under this one hands it what to put back (patch.ABSENT protocol):
        # the deepcopies made meanwhile hold that patch's method bound to themselves.
        old, self._previous = self._previous, value
        func = getattr(old, "__func__", None)
        for twin in list(self.twins):
            if func is not None and getattr(twin.previous, "__func__", None) is func:
                rebound = isinstance(value, types.MethodType) and value.__self__ is self.model
                twin.previous = types.MethodType(value.__func__, twin.model) if rebound else value

    def _running(self) -> List[ModelRecording]:
        source = None if self.source is None else self.source()
        return self.recordings + (source.recordings if source is not None else [])

    #: Targets see through it to the forward it runs (see targets._method_that_runs).
    _bcrecord_runs_wrapped = True

    @property
    def __wrapped__(self) -> Any:  # inspect.signature(model.forward) sees the real one
        return self.forward

    @property
    def __code__(self) -> types.CodeType:  # torch.export reads model.forward.__code__
        return inspect.unwrap(self.forward).__code__

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        # A bound method where the forward is one, to isinstance (not to type()): torch.jit.script
        # of the model reads the forward's source file (inspect.getsourcefile takes methods, not
        # objects) and compiles its source, without probes (a scripted model records nothing).
        return types.MethodType if type(self.forward) is types.MethodType else _StopAtRoot

    def __getattr__(self, name: str) -> Any:
        # Anything else read of model.forward is the forward's own (torch.jit.script reads its
        # __func__, __globals__, __closure__).
        if name == "forward":  # (no recursion, should it be missing)
            raise AttributeError(name)
        return getattr(self.forward, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        outer = _roots_running.get()
        if self in outer:
            # The model's forward calling the model (recursion): part of the pass, which the
            # outermost call ends (caught here, the stop would hand None to the forward).
            return self.forward(*args, **kwargs)
        running = self._running()
        started = [rec for rec in running if rec._entered_here()]
        for rec in started:
            rec._start_pass()
        if self.syncs is None:
            self.syncs = syncs_gradients(self.model)
        # Not inside DistributedDataParallel with autograd on (nor without, where its return
        # turns off its next broadcast of buffers), nor while torch.export or
        # torch.jit.trace traces, nor inside a torch.func transform (vmap, grad, jacrev): a
        # forward stopped early would give them no output. (An extractor returns its
        # features itself: it stops under jit.trace, not under export.)
        synced = (self.syncs or inside_ddp_forward()) and (
            torch.is_grad_enabled() or broadcasts_buffers_next(self.model)
        )
        stopping = not synced and not _tracing() and not _transforms_active()
        # Each variable is set back to what it held, each in a finally of its own, the first one
        # opened before anything is set: cut short anywhere (what a signal handler raised, a
        # Ctrl-C), none is left set, as a stale one made a later forward's stop escape.
        was_stopping, catching = _stopping.get(), _catching.get()
        # Called by another module's forward, which needs its output, where no caller further
        # out ends the pass (a stopping root, an extractor): it runs whole (handed None, that
        # forward failed: "linear(): argument 'input' must be Tensor, not NoneType").
        stopping = stopping and (
            bool(catching)
            or not _inside_another_forward(self.model, [rec._opened_in for rec in started if rec._opened_in])
        )
        try:
            _stopping.set(stopping)
            try:
                _roots_running.set((*outer, self))
                try:
                    if stopping:
                        _catching.set((*catching, tuple(running)))
                    returned = self.forward(*args, **kwargs)
                    if stopping:
                        for rec in started:
                            rec._ran_whole()
                    return returned
                except StopForward as stop:
                    # Another's (a recording run by a caller further out), or one a caller further
                    # out ends too (handed None here, the forward that called this one would run on).
                    if not any([rec in stop.stops for rec in running]) or stop._caught_further_out(catching):
                        raise
                    return None
                finally:
                    if stopping:
                        _catching.set(catching)
            finally:
                _roots_running.set(outer)
        finally:
            try:
                _stopping.set(was_stopping)
            finally:
                for rec in started:
                    rec._end_pass()

    def __deepcopy__(self, memo: Dict[int, Any]) -> Any:
        twin = memo.get(id(self.model))
        if twin is None:  # not copied as part of its model: the same model's
            return _StopAtRoot(self.model, self.forward, self.previous, self)
        # What a deepcopy of the model would have made of them: methods bound to the copy
        # (a forward the model set on itself, self.forward = self.forward_fast, included).
        forward = deepcopy(self.forward, memo)
        previous = self.previous if self.previous is _MISSING else deepcopy(self.previous, memo)
        made = _StopAtRoot(twin, forward, previous, self)
        self.twins.add(made)
        return made

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        # Saved mid-pass: the saved model gets the forward it had.
        if self.previous is _MISSING:
            return getattr, (self.model, "forward")
        return _itself, (self.previous,)

    @staticmethod
    def take(model: torch.nn.Module, rec: ModelRecording) -> _StopAtRoot:
        """Put one in ``model.forward`` (or join the one there) for ``rec``; the one it is in."""
        with _roots_lock:
            current = model.__dict__.get("forward", _MISSING)
            if type(current) is not _StopAtRoot or current.model is not model:
                current = _StopAtRoot(model, model.forward, current)
                model.__dict__["forward"] = current
            current.recordings.append(rec)
            return current

    @staticmethod
    def release(model: torch.nn.Module, rec: ModelRecording, root: _StopAtRoot) -> None:
        """Take ``rec`` out of ``root`` (what :meth:`take` gave it), and ``root`` out of
        ``model.forward`` once no recording runs on it. Done again (after a call cut short by
        what a signal handler raised), it does what is left."""
        told = None
        with _roots_lock:
            if not _holds(root.recordings, rec):
                return  # released already
            others = [r for r in root.recordings if r is not rec]
            if others:
                root.recordings = others
                return
            current = model.__dict__.get("forward", _MISSING)
            if current is not root and current is root.previous:
                pass  # put back already, by a call cut short after it
            elif current is not root:
                # Set meanwhile over it (accelerate's add_hook_to_module keeps it as _old_forward):
                # left there, it holds no recording, so it records and stops nothing. Told once
                # the deepcopies' are out, outside the lock (a warning made an error raises).
                told = (
                    f"bcrecord: {type(model).__name__}.forward was set on the model during a "
                    f"stop_after_last block (it is {callable_name(model.__dict__.get('forward'))}) and is "
                    "left there; where it calls the forward it replaced, as accelerate's add_hook_to_module "
                    "does, that is bcrecord's stopping forward, which now only calls the model's: set "
                    "such hooks outside the block"
                )
            else:
                # A copy.copy of the model made meanwhile shares its __dict__'s values: this too.
                # (References: the model's __dict__, `root` here and in Pass.__exit__.)
                copies = []
                if sys.getrefcount(root) - ARGUMENT_REFERENCES > 3:
                    copies = shallow_copies_holding(root, "forward", model)
                for holder in [model.__dict__, *copies]:
                    _put_back(holder, root)
            # A deepcopy of the model made meanwhile has one of its own: out with this one,
            # unless a recording of its own runs on it (that one takes it out when it ends).
            twins = list(root.twins)
            while twins:
                twin = twins.pop()
                if not twin.recordings and twin.model.__dict__.get("forward") is twin:
                    _put_back(twin.model.__dict__, twin)
                    twins += list(twin.twins)
            root.recordings = []
        if told is not None:
            warn(told)


def _put_back(holder: Dict[str, Any], root: _StopAtRoot) -> None:
    """What ``root`` replaced in ``holder`` (a model's ``__dict__``), or nothing."""
    if root.previous is _MISSING:
        del holder["forward"]
    else:
        holder["forward"] = root.previous


#: (The core's: a patch removed under a stopping forward hands it what to put back.)
_MISSING = ABSENT
