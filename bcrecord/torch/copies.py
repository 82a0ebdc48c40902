"""Tensor copies for recordings, and the per-target value policies of the torch layer.

Importing this module registers how tensors are copied under each core policy
(the core loads it by name the first time it meets a tensor):

* ``'clone'``: a detached clone — the value as it was when assigned, outside the
  autograd graph (so recording never keeps activations' graphs alive);
* ``'detach'``: the tensor detached, no copy (cheapest; later in-place changes show);
* ``'deepcopy'``: a detached clone (``copy.deepcopy`` refuses non-leaf tensors), also in a list,
  tuple, dict, set or dataclass, whose other contents are deep-copied;
* ``'none'``: the tensor itself, as the core keeps any value (not detached: it stays in
  the autograd graph, and keeps it alive, whatever ``grad`` says).

The others take a tensor recorded inside a ``torch.func`` transform from under its
wrappers: inside ``vmap``, the whole batch (:func:`outside_transforms`).

An object holding tensors whose class is registered with :func:`register_holder`
(torchvision's ``ImageList``, by :mod:`bcrecord.integrations.torchvision`) is rebuilt
around copies of its tensors; any other object follows the core's policy.

:func:`value_policy` builds the copier for one target of :func:`bcrecord.torch.record`
from its options: offload (``to='cpu'``; from a GPU the copy does not block, and
recordings wait for it before a value is read: :meth:`ValuePolicy.settle`), dtype
cast, a reduce function, and ``grad=True`` (keep the value in the autograd graph).

>>> import torch
>>> from bcrecord.runtime import copy_value
>>> t = torch.ones(2, requires_grad=True) * 2
>>> copied = copy_value(t, "clone")
>>> copied.requires_grad, copied.data_ptr() != t.data_ptr()
(False, True)
"""

from __future__ import annotations

import contextvars
import copy as _copy_module
import dataclasses
import functools
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar, Union

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ..errors import SpecError
from ..runtime import (
    _unregister_copy,
    carried_variable,
    copied_container,
    copied_dataclass,
    copied_once,
    copies_without_python,
    copy_value,
    deepcopy_alone,
    deepcopy_as_registered,
    load_plugin,
    reachable,
    register_copy,
    silently,
)

__all__ = ["ValuePolicy", "clone", "detached_clone", "register_holder", "value_policy"]

#: Whether torch.jit.trace is tracing (None outside a trace; a C call per recorded tensor).
_tracing_state: Callable[[], Any] = getattr(torch._C, "_get_tracing_state", lambda: None)
#: Whether a torch.func transform (vmap, grad, jacrev...) is running (a C call per recorded tensor).
_transforms_active: Callable[[], bool] = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
#: Whether torch.inference_mode is on: a copy made there is an inference tensor (a C call per value).
_inference_mode: Callable[[], bool] = getattr(torch, "is_inference_mode_enabled", lambda: False)
#: The guard torch.inference_mode enters (its Python wrapper costs twice the copy of a small tensor).
_InferenceMode: Callable[[bool], Any] = getattr(torch._C, "_InferenceMode", torch.inference_mode)
#: Why saved-tensor hooks are refused now (torch.func.grad's and its kin's transforms refuse
#: them), or None where they are taken.
_hooks_refused: Callable[[], Optional[str]] = getattr(
    torch._C._autograd, "_saved_tensors_hooks_get_disabled_error_message", lambda: None
)
#: How many dispatch modes are on (a C call per recorded tensor; almost always none).
_dispatch_modes: Callable[[], int] = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)
#: Whether a torch-function mode is on (a C call per recorded tensor; almost always none).
_function_mode_on: Callable[[], bool] = getattr(torch._C, "_is_torch_function_mode_enabled", lambda: False)
_function_stack_len: Callable[[], int] = getattr(torch._C, "_len_torch_function_stack", lambda: 1)
_function_stack_at: Callable[[int], Any] = getattr(torch._C, "_get_function_stack_at", lambda k: None)
try:
    from torch.utils._device import DeviceContext as _DeviceContext
except ImportError:  # pragma: no cover - depends on the torch version
    _DeviceContext = type(None)


def _function_modes() -> bool:
    """Whether a torch-function mode is on that may run the program's Python code: any but the
    one ``torch.set_default_device`` turns on for the whole program (torch's, calling nothing
    patched: copies under it need not be run silently, which costs several times the copy).

    >>> _function_modes()
    False
    """
    if not _function_mode_on():
        return False
    return any(not isinstance(_function_stack_at(k), _DeviceContext) for k in range(_function_stack_len()))


#: Whether a copy runs inside :func:`_around_modes` already.
_minding_modes: contextvars.ContextVar[bool] = carried_variable(
    contextvars.ContextVar("bcrecord_minding_modes", default=False)
)
#: Whether the values copied now go back into the code that runs the model (an extractor returns
#: them): inside a transform they stay its tensors there (vmap batches its outputs itself).
returned_inside: contextvars.ContextVar[bool] = carried_variable(
    contextvars.ContextVar("bcrecord_returned_inside", default=False)
)


def _autocasting(tensor: torch.Tensor) -> bool:
    """Whether autocast is on for ``tensor``'s device (False for a device it does not know).

    >>> _autocasting(torch.ones(1))
    False
    """
    try:
        return torch.is_autocast_enabled(tensor.device.type)
    except (RuntimeError, TypeError):  # ('meta'; a torch whose is_autocast_enabled takes no device)
        return False


def under_vmap(tensor: torch.Tensor) -> Tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The tensor under ``vmap``'s batching (the whole batch, in autograd's graph outside it), and
    what turns its gradient into the layout :func:`outside_transforms` records the value in
    (each ``vmap``'s dimension first); ``tensor`` itself where no ``vmap`` batches it.

    >>> inner, layout = under_vmap(torch.ones(2))
    >>> inner.shape, layout(torch.zeros(2)).shape
    (torch.Size([2]), torch.Size([2]))
    """
    functorch = torch._C._functorch
    inner, dims = tensor, []
    while functorch.is_batchedtensor(inner):
        dims.append(functorch.maybe_get_bdim(inner))
        inner = functorch.get_unwrapped(inner)

    def layout(grad: torch.Tensor) -> torch.Tensor:
        for moved, dim in enumerate(reversed(dims)):
            grad = grad.movedim(moved + dim, moved)
        return grad

    return inner, layout


def outside_transforms(tensor: torch.Tensor, copy: Callable[[torch.Tensor], T]) -> T:
    """``copy`` of ``tensor`` as the code around ``torch.func``'s transforms sees it: what is recorded.

    Inside ``vmap`` a value is a batched tensor, and inside ``grad``, ``jacrev`` or
    ``jvp`` a wrapper: neither can be used once the transform returns (a dead batched
    tensor refuses every op; a dead wrapper cannot be saved or pickled). So a value
    recorded there is the tensor under the wrappers: under ``vmap``, the whole batch,
    each ``vmap``'s dimension first (outermost first), as ``vmap`` returns its outputs.
    ``copy`` runs with the transforms off (a ``grad`` transform wraps what ops make).
    Under a functionalization wrapper (``torch.export``), ``copy`` of ``tensor`` as it is.

    >>> import torch
    >>> seen = []
    >>> def twice(row):
    ...     seen.append(outside_transforms(row * 2, torch.clone))
    ...     return row
    >>> _ = torch.func.vmap(twice, in_dims=1)(torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]))
    >>> seen[0]  # row * 2 for each of the 2 columns vmap maps over
    tensor([[ 2.,  6., 10.],
            [ 4.,  8., 12.]])
    """
    if _outside.get():  # (a copy made in a copy below: a reduce's clone, of what is unwrapped already)
        return copy(tensor)
    functorch = torch._C._functorch
    inner, dims = tensor, {}
    while functorch.is_functorch_wrapped_tensor(inner):
        if functorch.is_functionaltensor(inner):
            return copy(tensor)
        dim = functorch.maybe_get_bdim(inner)
        if dim >= 0:  # (-1: a grad transform's wrapper, not vmap's)
            dims[functorch.maybe_get_level(inner)] = dim
        inner = functorch.get_unwrapped(inner)
    # A vmap whose input the value does not depend on (a weight's product, or an outer vmap's
    # input only) batches it not: vmap returns it repeated over that vmap's batch, and so it is.
    sizes = _vmap_sizes()
    with torch._C._DisableFuncTorch():
        # Each vmap's dimension is counted without the outer ones': moved to the front outermost first.
        for moved, level in enumerate(sorted({*dims, *sizes})):
            dim = dims.get(level)
            if dim is None:
                inner = inner.unsqueeze(moved).expand(
                    *inner.shape[:moved], sizes[level], *inner.shape[moved:]
                )
            else:
                inner = inner.movedim(moved + dim, moved)
        token = _outside.set(True)
        try:
            return copy(inner)
        finally:
            _outside.reset(token)


#: Whether a copy of :func:`outside_transforms` runs: its tensor is out from under the wrappers.
_outside: contextvars.ContextVar[bool] = carried_variable(
    contextvars.ContextVar("bcrecord_outside_transforms", default=False)
)


def _vmap_sizes() -> Dict[int, int]:
    """The batch size of each ``vmap`` running now, by its level (outer ones lower); not of one
    right around a ``jvp``: ``jacfwd`` (``hessian``) maps one over its basis, batching the tangents
    only, and returns what else the function gives unrepeated (its ``has_aux`` value)."""
    if _interpreters is None:  # (another torch: the batched levels alone, as wrapped)
        return {}
    sizes = {}
    found = _interpreters()  # (outermost first)
    for n, interpreter in enumerate(found):
        if interpreter.key() == _VMAP and (n + 1 == len(found) or found[n + 1].key() != _JVP):
            sizes[interpreter.level()] = _VmapInterpreter(interpreter).batchSize()
    return sizes


# (C calls: a Python-level list of the interpreters cost 1.4 us a value)
_functorch = torch._C._functorch
_interpreters: Optional[Callable[[], List[Any]]] = getattr(_functorch, "get_interpreter_stack", None)
_VmapInterpreter: Any = getattr(_functorch, "CVmapInterpreterPtr", None)
_VMAP, _JVP = (getattr(getattr(_functorch, "TransformType", None), name, None) for name in ("Vmap", "Jvp"))
if _VmapInterpreter is None or _VMAP is None:
    _interpreters = None


@functools.cache
def _selective_checkpoint_modes() -> Tuple[type, ...]:
    """The dispatch modes of selective activation checkpointing (torch's own, private: none
    where this torch has other names for them)."""
    from torch.utils import checkpoint

    names = ("_CachingTorchDispatchMode", "_CachedTorchDispatchMode")
    return tuple(
        mode for mode in (getattr(checkpoint, name, None) for name in names) if isinstance(mode, type)
    )


def _selective_checkpointing() -> bool:
    """Whether a selective activation checkpoint's dispatch mode is on (one is, or others)."""
    modes = _selective_checkpoint_modes()
    return bool(modes) and any(isinstance(mode, modes) for mode in _dispatch_stack())


def outside_selective_checkpoint(copy: Callable[[Any], T], value: Any) -> T:
    """``copy(value)`` out of sight of selective activation checkpointing's dispatch modes.

    A selective checkpoint (``checkpoint(..., context_fn=create_selective_checkpoint_contexts(policy))``)
    counts the ops of the forward its policy saves, per op, and hands their outputs, in that order,
    to the same ops when it recomputes the forward for the backward. A copy's ops counted
    there (a clone, a reduce's matmul) would shift that order: the recompute, which runs
    without probes once the recording has ended, would get a copy's output for one of the
    model's, and silently wrong gradients. So the modes above and including the checkpoint's
    are taken off while ``copy`` runs, and those that are not the checkpoint's put back over it.

    >>> import functools, torch
    >>> from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    >>> saves_clones = functools.partial(create_selective_checkpoint_contexts, [torch.ops.aten.clone.default])
    >>> seen = []
    >>> def body(x):
    ...     seen.append(outside_selective_checkpoint(torch.clone, x))
    ...     return (x * 2).clone().sum()
    >>> x = torch.ones(2, requires_grad=True)
    >>> checkpoint(body, x, use_reentrant=False, context_fn=saves_clones).backward()
    >>> x.grad, len(seen)
    (tensor([2., 2.]), 1)
    """
    modes = _selective_checkpoint_modes()
    pop = functools.partial(torch._C._pop_torch_dispatch_stack, None)  # (None: the top, a program's)
    push = torch._C._push_on_torch_dispatch_stack
    stack = _dispatch_stack()
    lowest = next(k for k, mode in enumerate(stack) if isinstance(mode, modes))
    taken: List[Any] = []  # top first
    try:
        for _ in range(len(stack) - lowest):
            taken.append(pop())
        others = [mode for mode in reversed(taken) if not isinstance(mode, modes)]
        for mode in others:
            push(mode)
        try:
            return copy(value)
        finally:
            for _ in others:
                pop()
    finally:
        for mode in reversed(taken):
            push(mode)


def _around_modes(copy: Callable[[Any], T], value: Any) -> T:
    """``copy(value)`` while a dispatch or torch-function mode is on: run :func:`silently`.

    The copies above run no Python code on a plain tensor, so recordings do not silence
    them (:func:`copies_without_python`), except where a mode is on: its
    ``__torch_dispatch__`` or ``__torch_function__`` runs for the copy's ops, and may call
    patched code, whose values are not the program's. Out of sight of a selective
    checkpoint too (:func:`outside_selective_checkpoint`). ``copy`` is called again inside,
    where :data:`_minding_modes` says this is done.

    >>> from torch.overrides import TorchFunctionMode
    >>> class Seen(TorchFunctionMode):
    ...     def __torch_function__(self, func, types, args=(), kwargs=None):
    ...         return func(*args, **(kwargs or {}))
    >>> with Seen():
    ...     kept = _around_modes(detached_clone, torch.ones(2))
    >>> kept
    tensor([1., 1.])
    """
    return silently(_minded, (copy, value))


def _minded(call: Tuple[Callable[[Any], T], Any]) -> T:
    copy, value = call
    _minding_modes.set(True)  # (in silently's copy of the context: gone after it)
    if _dispatch_modes() and _selective_checkpointing():
        return outside_selective_checkpoint(copy, value)
    return copy(value)


def _dispatch_stack() -> List[Any]:
    """The dispatch modes on, bottom first: a tracer's infra modes, then those a program entered
    (the checkpoint's among them: popping takes those first)."""
    return [torch._C._get_dispatch_stack_at(k) for k in range(_dispatch_modes())]


def _detached_copy_of(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def _normal_clone(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` made outside ``torch.inference_mode``: a normal tensor, not an inference one.

    A kept value is read after the block: an inference tensor there refuses in-place
    updates and autograd (a linear probe trained on recorded features raised "Inference
    tensors cannot be saved for backward"); a clone made outside inference mode is normal.

    >>> with torch.inference_mode():
    ...     kept = _normal_clone(torch.ones(2) * 2)
    >>> kept.is_inference(), kept.add_(1)
    (False, tensor([3., 3.]))
    """
    with _InferenceMode(False):
        # (no graph to keep: inference mode built none; a parameter is detached from its own)
        return tensor.detach().clone() if tensor.requires_grad else tensor.clone()


def clone(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` as it is now.

    ``tensor.clone()``: a tensor that takes part in autograd stays in the graph, any
    other is copied as :func:`detached_clone` copies it (the same op there; under
    ``torch.inference_mode``, a normal tensor too). Few calls and checks: it runs for every
    recorded tensor.

    >>> import torch
    >>> live = torch.tensor([-1.0, 2.0])
    >>> kept = clone(live)
    >>> _ = live.relu_()
    >>> kept, live
    (tensor([-1.,  2.]), tensor([0., 2.]))
    """
    if (
        _dispatch_modes() or _function_mode_on() and _function_modes()
    ) and not _minding_modes.get():  # (see _around_modes)
        return _around_modes(clone, tensor)
    if (
        _transforms_active() and not returned_inside.get()
    ):  # inside torch.func.vmap or grad: the tensor under their wrappers
        return outside_transforms(tensor, torch.Tensor.clone)
    # Traced too, one op whether or not the tensor needs grad: torch.jit.trace checks
    # its trace by tracing again under no_grad, and needs the same graph.
    return _normal_clone(tensor) if _inference_mode() else tensor.clone()


def detached_clone(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` outside autograd: the copy the default ``'clone'`` policy keeps.

    ``detach()`` (skipped for tensors outside autograd already: one dispatcher op
    fewer per recorded value), then ``clone()``: the data is copied now. Not torch's
    copy-on-write clone, which is cheaper where the value is never overwritten: it
    sees writes made through torch only, so a value whose memory a numpy array or a
    C library writes (an input buffer refilled in place) would change after the fact.
    Under ``torch.inference_mode`` the copy is made outside it: a normal tensor, which
    autograd and in-place ops take after the block (:func:`_normal_clone`).
    One function, not two, because it runs for every recorded tensor.

    >>> import torch
    >>> live = torch.ones(2, requires_grad=True) * 3
    >>> kept = detached_clone(live)
    >>> kept.requires_grad, torch.equal(kept, live)
    (False, True)
    """
    if (
        _dispatch_modes() or _function_mode_on() and _function_modes()
    ) and not _minding_modes.get():  # (see _around_modes)
        return _around_modes(detached_clone, tensor)
    if (
        _transforms_active() and not returned_inside.get()
    ):  # inside torch.func.vmap or grad: the tensor under their wrappers
        return outside_transforms(tensor, _detached_copy_of)
    if _inference_mode():
        return _normal_clone(tensor)
    if tensor.requires_grad or _tracing_state() is not None:
        # Traced: the same ops whether or not the tensor needs grad (see clone).
        return tensor.detach().clone()
    return tensor.clone()


def _kept_in_graph(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself (``copy='detach'`` with ``grad=True``), from under ``torch.func``'s
    wrappers where a transform runs (a batched tensor is dead once ``vmap`` returns)."""
    if _transforms_active() and not returned_inside.get():
        if (
            _dispatch_modes() or _function_mode_on() and _function_modes()
        ) and not _minding_modes.get():  # (see _around_modes)
            return _around_modes(_kept_in_graph, tensor)
        return outside_transforms(tensor, _itself)
    return tensor


def _detached(tensor: torch.Tensor) -> torch.Tensor:
    if (
        _dispatch_modes() or _function_mode_on() and _function_modes()
    ) and not _minding_modes.get():  # (see _around_modes)
        return _around_modes(_detached, tensor)
    if _transforms_active() and not returned_inside.get():
        return outside_transforms(tensor, torch.Tensor.detach)
    return tensor.detach()


def _detached_copy(tensor: torch.Tensor) -> torch.Tensor:
    if (
        _dispatch_modes() or _function_mode_on() and _function_modes()
    ) and not _minding_modes.get():  # (see _around_modes)
        return _around_modes(_detached_copy, tensor)
    if _transforms_active() and not returned_inside.get():
        return outside_transforms(tensor, _detached_copy_of)
    return _normal_clone(tensor) if _inference_mode() else tensor.detach().clone()


def _deepcopy_outside_autograd(value: Any) -> Any:
    """``copy.deepcopy(value)``; where a tensor in it requires grad (deepcopy takes leaves only:
    ``dict(loss=loss)``, and keeps a leaf's ``requires_grad``), the container rebuilt with its
    tensors' detached copies, as a tensor alone is copied, and the rest of it deep-copied (as
    ``'deepcopy'`` copies each)."""
    if (
        _dispatch_modes() or _function_mode_on() and _function_modes()
    ) and not _minding_modes.get():  # (see _around_modes)
        return _around_modes(_deepcopy_outside_autograd, value)
    if _inference_mode():  # copied outside it: normal tensors, as a tensor alone is (_normal_clone)
        with _InferenceMode(False):
            return _deepcopy_outside_autograd(value)
    container = isinstance(value, (list, tuple, dict, set, frozenset)) or dataclasses.is_dataclass(value)
    if not container:
        return _copy_module.deepcopy(value)  # (an object that holds one its own way: the errors say so)
    if not _requires_grad_within(value):
        try:
            return deepcopy_as_registered(value)  # (a plug-in's object in it: as its copier copies it)
        except RuntimeError:  # one in the graph inside an object in it (a holder: ImageList, a cache)
            pass
    return _map(value, _detached_copy, functools.partial(copy_value, policy="deepcopy"), policy="deepcopy")


def _requires_grad_within(value: Any) -> bool:
    """Whether a tensor in ``value`` (through tuples, lists, sets, dicts and dataclasses) requires
    grad; a tracer's stand-in there (a fake tensor, an FX proxy) is refused, as one alone is."""
    graph = False
    for item in reachable(value):
        if type(item) is torch.Tensor:
            graph = graph or item.requires_grad
        elif isinstance(item, (torch.Tensor, *_TRACED)):
            if traced_stand_in(type(item)) is not None:
                _refuse_traced(item)
            graph = graph or bool(getattr(item, "requires_grad", False))
    return graph


#: What a tracer runs a model on in place of its values, and why such a value is not recorded.
_TRACED: Dict[type, str] = {
    FakeTensor: (
        "a FakeTensor, which holds no values: torch.export (non-strict) or make_fx traces the model "
        "on fake tensors; record a run of the model outside the trace"
    ),
    torch.fx.Proxy: (
        "a torch.fx Proxy, which holds no value: torch.fx.symbolic_trace traces the model with "
        "proxies; record a run of the model outside the trace"
    ),
}


def traced_stand_in(cls: type) -> Optional[str]:
    """Why values of ``cls`` are not recorded, where a tracer runs a model on them in place of
    values (fake tensors, FX proxies); None for any other class.

    >>> traced_stand_in(torch.Tensor), traced_stand_in(torch.fx.Proxy).split(",")[0]
    (None, 'a torch.fx Proxy')
    """
    for kind, why in _TRACED.items():
        if issubclass(cls, kind):
            return why
    return None


#: By tensor subclass: why its values are not recorded (see traced_stand_in), its __tensor_flatten__.
_stand_in_classes: Dict[type, Tuple[Optional[str], Any]] = {}


def _held_stand_in(tensor: torch.Tensor) -> Optional[str]:
    """Why ``tensor`` is not recorded: a tracer's stand-in, or a wrapper subclass (a DTensor,
    any ``__tensor_flatten__`` one) around one, which a tracer makes of such an input; else None.

    >>> _held_stand_in(torch.nn.Parameter(torch.ones(1))) is None
    True
    """
    cls = type(tensor)
    found = _stand_in_classes.get(cls)
    if found is None:  # (per class: this runs for every recorded Parameter)
        if len(_stand_in_classes) >= 1024:
            _stand_in_classes.clear()
        found = _stand_in_classes[cls] = (traced_stand_in(cls), getattr(cls, "__tensor_flatten__", None))
    why, flatten = found
    if why is not None or flatten is None:
        return why
    names, _ = flatten(tensor)
    for name in names:
        inner = getattr(tensor, name, None)
        why = _held_stand_in(inner) if isinstance(inner, torch.Tensor) else None
        if why is not None:
            return f"a {cls.__name__} around {why}"
    return None


def _refuse_traced(value: Any, why: Optional[str] = None) -> Any:
    """Refuse a tracer's stand-in for a value (a recording's errors say why)."""
    raise ValueError(f"not recorded: {why or traced_stand_in(type(value))}")


def _refuse_held(tensor: torch.Tensor) -> None:
    """Refuse ``tensor`` where :func:`_held_stand_in` says why (not inside a tracer's own outputs)."""
    if not returned_inside.get():
        why = _held_stand_in(tensor)
        if why is not None:
            _refuse_traced(tensor, why)


def _traced_into(copy: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``copy`` where the value goes back into the traced program (an extractor's features under
    ``torch.export``: its outputs there), else the refusal of a tracer's stand-in for a value."""

    def copied(value: Any) -> Any:
        return copy(value) if returned_inside.get() else _refuse_traced(value)

    return copied


def _refusing_held(copy: Callable[[torch.Tensor], Any]) -> Callable[[torch.Tensor], Any]:
    """``copy`` as a core policy's tensor copier: a wrapper subclass around a tracer's stand-in
    refused first, as :func:`_map` refuses one (a value policy's tensors go through it)."""

    def copied(tensor: torch.Tensor) -> Any:
        if type(tensor) is not torch.Tensor:
            _refuse_held(tensor)
        return copy(tensor)

    return copied


_core_copies = {
    policy: _refusing_held(copy)
    for policy, copy in (("clone", detached_clone), ("detach", _detached), ("deepcopy", _detached_copy))
}
# Inside a container under 'deepcopy', copy.deepcopy copies a tensor (a module's parameters
# stay Parameters); a traced stand-in is refused there by _requires_grad_within.
deepcopy_alone(_core_copies["deepcopy"])
deepcopy_alone(_refuse_traced)
for _policy, _copy in _core_copies.items():
    register_copy(torch.Tensor, _policy, _copy)
# Not under 'none' (the value itself): a copier there would slow down every 'none' value.
for _kind in _TRACED:
    for _policy in ("clone", "detach", "deepcopy"):
        register_copy(_kind, _policy, _refuse_traced)
# Containers and objects holding tensors: see _deepcopy_outside_autograd (a tensor alone: _detached_copy).
register_copy(object, "deepcopy", _deepcopy_outside_autograd)

Device = Union[str, torch.device, None]
T = TypeVar("T")


def _map(
    value: Any,
    fn: Callable[[torch.Tensor], Any],
    other: Optional[Callable[[Any], Any]] = None,
    made: Optional[Dict[int, Tuple[Any, Any]]] = None,
    policy: Optional[str] = None,
) -> Any:
    """Apply ``fn`` to every tensor in (nested) tuples, lists, dicts, sets and dataclasses,
    and ``other`` (if given) to everything else in them (a numpy array: the core's copy).
    An object of a class :func:`register_holder` names is rebuilt around its tensors' ``fn``
    (under copy ``policy``, where given: those the class was registered for).

    Containers are rebuilt as the core rebuilds them (:func:`copied_container`:
    subclasses, ``defaultdict``, each container once, so a list holding itself holds
    its copy), a tuple or frozenset subclass that cannot be as a plain one; a dataclass
    (a model's output object) is copied with each field mapped, as the core copies one
    (:func:`copied_dataclass`: each object once, so a tree with parent links keeps them).
    """
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor:  # (a fake tensor in a tuple: the tuple is not recorded)
            _refuse_held(value)
        return fn(value) if made is None else copied_once(value, fn, made)  # ([h, h]: one copy)
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        made = {} if made is None else made
        return copied_container(value, lambda content: _map(content, fn, other, made, policy), made, _plain)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        made = {} if made is None else made
        return copied_dataclass(value, lambda content: _map(content, fn, other, made, policy), made)
    rebuild = _holder(type(value), policy)
    if rebuild is not None:
        made = {} if made is None else made
        return copied_once(
            value, lambda held: rebuild(held, lambda content: _map(content, fn, other, made, policy)), made
        )
    if other is None:
        return value
    return other(value) if made is None else copied_once(value, other, made)


#: How to rebuild an object that holds tensors, by its class: ``rebuild(value, copy)`` (see register_holder).
Rebuild = Callable[[Any, Callable[[Any], Any]], Any]
#: Each registered class's rebuild, and the copy policies it is rebuilt under.
_HOLDERS: Dict[type, Tuple[Rebuild, Tuple[str, ...]]] = {}
#: Copy policies a holder may be rebuilt under (under 'none' every value is kept as it is).
_HOLDER_POLICIES = ("clone", "detach", "deepcopy")


def register_holder(cls: type, rebuild: Rebuild, policies: Sequence[str] = _HOLDER_POLICIES) -> None:
    """Copy values of ``cls`` (and subclasses) as ``rebuild(value, copy)``: a new object around copies.

    For a library's object that holds tensors (torchvision's ``ImageList``, a
    transformers cache): without it, such an object is recorded as itself, its tensors
    the live ones (neither copied, nor moved, cast or reduced by ``to``, ``dtype`` or
    ``reduce``). ``copy`` copies a part as the recording's options copy a value (a
    tensor, a list of them). ``policies``: the copy policies it is rebuilt under (of
    ``'clone'``, ``'detach'`` and ``'deepcopy'``; under ``'none'`` it is rebuilt only where
    ``to``, ``dtype`` or ``reduce`` apply); under the others it is copied as before.

    >>> import torch
    >>> class Boxes:
    ...     def __init__(self, xyxy: torch.Tensor) -> None: self.xyxy = xyxy
    >>> register_holder(Boxes, lambda boxes, copy: Boxes(copy(boxes.xyxy)))
    >>> live = Boxes(torch.ones(2))
    >>> kept = value_policy(dtype=torch.float64)(live)
    >>> kept is live, kept.xyxy.dtype
    (False, torch.float64)
    """
    unknown = [policy for policy in policies if policy not in _HOLDER_POLICIES]
    if unknown or isinstance(policies, str):
        raise SpecError(f"register_holder: policies are some of {_HOLDER_POLICIES}, not {policies!r}")
    _HOLDERS[cls] = (rebuild, tuple(policies))
    for policy, copy_tensor in (
        ("clone", detached_clone),
        ("detach", _detached),
        ("deepcopy", _detached_copy),
    ):
        if policy in policies:
            other = functools.partial(copy_value, policy=policy)
            register_copy(cls, policy, functools.partial(_map, fn=copy_tensor, other=other, policy=policy))
        else:  # (registered again for fewer policies: not its earlier copier, which would rebuild it)
            _unregister_copy(cls, policy)


def _holder(cls: type, policy: Optional[str] = None) -> Optional[Rebuild]:
    """How to rebuild a ``cls`` holding tensors under copy ``policy`` (:func:`register_holder`, for
    ``cls`` or the nearest base class registered for ``policy``); None for other classes and policies
    (under ``'none'``, or None, it is rebuilt where ``to``, ``dtype`` or ``reduce`` apply)."""
    load_plugin(cls)  # (torchvision's: registers ImageList the first time one is met)
    # (A subclass registered for fewer policies: under the others, as its base class is.)
    for base in cls.__mro__:
        entry = _HOLDERS.get(base)
        if entry is not None and (policy not in _HOLDER_POLICIES or policy in entry[1]):
            return entry[0]
    return None


def _plain(value: Any, contents: List[Any]) -> Any:
    """A plain tuple or frozenset of ``contents``, for a subclass's that cannot be rebuilt."""
    return tuple(contents) if isinstance(value, tuple) else frozenset(contents)


def value_policy(
    copy: str = "clone",
    to: Device = None,
    dtype: Optional[torch.dtype] = None,
    reduce: Optional[Callable[[torch.Tensor], Any]] = None,
    grad: bool = False,
) -> ValuePolicy:
    """A copier applying the torch layer's options to every tensor in a value.

    Order: ``reduce``, then detach (unless ``grad`` or ``copy='none'``), then move/cast, then
    clone unless moving or casting made a copy (``copy='clone'`` or ``'deepcopy'``: what
    ``reduce`` returns may be a view, or its own tensor that it changes later); where ``reduce``
    returns tuples, lists or dicts of tensors (``t.chunk(2)``), to each tensor in them.
    Non-tensor values, and what ``reduce`` makes of a tensor that is neither, follow the
    core's ``copy`` policy.
    ``dtype`` (a floating or complex dtype) casts the tensors of its kind only:
    floating-point ones to a floating dtype, complex ones to a complex dtype; the
    indices of a ``topk``, masks, and the imaginary parts stay exact. ``copy='none'``
    keeps each value itself, as the core does (a tensor in the autograd graph stays
    there; a list is the model's own); ``reduce``, ``to`` and ``dtype`` still apply.

    >>> import torch
    >>> keep = value_policy(reduce=lambda t: t.mean(0), dtype=torch.float64)
    >>> keep(torch.tensor([[1.0, 3.0], [3.0, 5.0]]))
    tensor([2., 4.], dtype=torch.float64)
    >>> value_policy(dtype=torch.float16)((torch.ones(1), torch.tensor([7])))
    (tensor([1.], dtype=torch.float16), tensor([7]))
    """
    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype= takes a torch.dtype (a floating-point or complex one), not {dtype!r}")
    if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
        raise SpecError(
            f"dtype= casts floating-point or complex values: give such a torch.dtype, not {dtype!r}"
        )
    if to is not None:
        try:
            device = to if isinstance(to, torch.device) else torch.device(to)
        except RuntimeError as error:  # a str that names no device ('cpux')
            raise SpecError(f"to= names no device: {to!r} ({error})") from None
        except TypeError:
            raise TypeError(f"to= takes a device ('cpu', 'cuda:0', a torch.device), not {to!r}") from None
        # Now, not per value: every value would fail into rec.errors.
        missing = _unavailable(device)
        if missing is not None:
            raise SpecError(f"to={to!r}: {missing}")
    return ValuePolicy(copy, to, dtype, reduce, grad)


def _unavailable(device: torch.device) -> Optional[str]:
    """Why tensors cannot be moved to ``device`` on this machine; None where they can (or torch cannot tell).

    >>> _unavailable(torch.device("cpu")) is None
    True
    >>> _unavailable(torch.device("cuda")) in (None, "cuda is not available on this machine")
    True
    """
    if device.type in ("cpu", "meta"):
        return None
    # torch.cuda, torch.xpu...; MPS's is_available is torch.backends.mps's.
    backend = torch.backends.mps if device.type == "mps" else getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if not callable(is_available):
        # A backend torch has no check for (hpu, lazy, one a plug-in registers): an empty
        # tensor moved there tells (each value's copy failed, into rec.errors).
        try:
            torch.empty(0).to(device)
        except Exception as error:
            said = (str(error).splitlines() or [""])[0].split(". ")[0]  # (the first sentence)
            return f"tensors cannot be moved to {device.type} here ({type(error).__name__}: {said})"
        return None
    if not is_available():
        return f"{device.type} is not available on this machine"
    count = getattr(getattr(torch, device.type, None), "device_count", None)
    if device.index is not None and callable(count) and device.index >= count():
        return f"this machine has {count()} {device.type} device(s), numbered from 0"
    return None


class ValuePolicy:
    """What :func:`value_policy` returns: a copier, with a shortcut for plain tensors.

    Recordings ask :meth:`copier_for` once per type of value (see
    :class:`bcrecord.runtime.Site`); for ``torch.Tensor`` without a reduce, move or
    cast it is a single function, so the usual recorded value (a module's output)
    goes through one call instead of four.
    """

    __slots__ = (
        "copy",
        "device",
        "dtype",
        "reduce",
        "grad",
        "_in_graph",
        "_itself",
        "_tensor",
        "_other",
        "_pending",
    )

    def __init__(
        self,
        copy: str,
        to: Device,
        dtype: Optional[torch.dtype],
        reduce: Optional[Callable[[torch.Tensor], Any]],
        grad: bool,
    ) -> None:
        self.copy = copy
        self.device = torch.device(to) if to is not None else None
        self.dtype = dtype
        self.reduce = reduce
        self.grad = grad
        #: Whether tensors stay in the autograd graph: ``grad``, or ``'none'`` (the value itself).
        self._in_graph = grad or copy == "none"
        #: What becomes of a value in a container that is no tensor: the core's copy.
        self._other: Callable[[Any], Any] = functools.partial(copy_value, policy=copy)
        #: GPU streams with copies to the CPU still in flight (see :meth:`settle`).
        self._pending: Set[Any] = set()
        copies = copy in ("clone", "deepcopy")
        self._tensor: Callable[[torch.Tensor], Any]
        if reduce is not None or self.device is not None or dtype is not None:
            self._tensor = self._one
        elif copies:
            self._tensor = clone if grad else detached_clone
        elif copy == "none":
            self._tensor = _itself
        else:
            self._tensor = _kept_in_graph if grad else _detached
        #: Whether every value is kept as it is (``'none'``, nothing to apply): containers too.
        self._itself = copy == "none" and self._tensor is _itself

    def __call__(self, value: Any) -> Any:
        if self._itself:
            return value
        if (
            isinstance(value, (torch.Tensor, list, tuple, dict, set, frozenset))
            or (dataclasses.is_dataclass(value) and not isinstance(value, type))
            or _holder(type(value), self.copy) is not None
        ):
            try:
                return _map(value, self._tensor, self._other, policy=self.copy)
            except TypeError as error:  # (a reduce's dict for a tensor in a set: said so)
                if "unhashable" not in str(error) or not any(
                    isinstance(item, (set, frozenset)) for item in reachable(value)
                ):
                    raise
                raise TypeError(
                    f"{error}: a set in the value holds what reduce returns for its tensors, which must "
                    "be hashable, as a set's items are (a tensor, a number)"
                ) from None
        return copy_value(value, self.copy)

    def copier_for(self, cls: type) -> Callable[[Any], Any]:
        """The copier for values of exactly ``cls``: the tensor one for ``torch.Tensor``.

        >>> policy = value_policy(reduce=lambda t: t.sum())
        >>> policy.copier_for(torch.Tensor)(torch.ones(3)), policy.copier_for(list)([torch.ones(2)])
        (tensor(3.), [tensor(2.)])
        """
        if cls is torch.Tensor:
            return self._tensor
        if not self._itself and traced_stand_in(cls) is not None:  # (a fake tensor, an FX proxy)
            return _traced_into(self)
        return self

    def settle(self) -> None:
        """Wait for the copies from a GPU to the CPU (``to='cpu'``) this policy started.

        They are made with ``non_blocking=True``, so the GPU fills the CPU tensor
        later; read before then, it holds garbage. Recordings call this before
        their values are read. Does nothing when no such copy is in flight.

        >>> keep = value_policy(to="cpu")
        >>> keep(torch.ones(2)).device.type, keep.settle()
        ('cpu', None)
        """
        if not self._pending:  # the usual case: nothing offloaded from a GPU
            return
        for stream in list(self._pending):
            # Discard before waiting: a copy queued meanwhile re-adds its stream.
            self._pending.discard(stream)
            stream.synchronize()

    def _one(self, live: torch.Tensor) -> Any:
        if _dispatch_modes() and _selective_checkpointing():  # (see outside_selective_checkpoint)
            return outside_selective_checkpoint(self._one, live)
        if (
            _transforms_active() and not returned_inside.get()
        ):  # inside torch.func.vmap or grad: see outside_transforms
            return outside_transforms(live, self._applied)
        return self._applied(live)

    def _applied(self, live: torch.Tensor) -> Any:
        reduce = self.reduce
        if reduce is None:
            return self._keep(live)
        if _autocasting(live):
            # On the value as it is, not in the program's lower precision: as its gradient's
            # reduce runs in the backward, outside autocast (a value in bfloat16, its gradient not).
            with torch.autocast(live.device.type, enabled=False):
                return self._reduced(live, reduce)
        return self._reduced(live, reduce)

    def _reduced(self, live: torch.Tensor, reduce: Callable[[torch.Tensor], Any]) -> Any:
        if not self._in_graph:
            # Outside autograd: a reduce that saved tensors for backward would be counted
            # by activation checkpointing, whose recompute runs no probes (CheckpointError).
            # Detached only where there is a graph (one op less per value under no_grad),
            # and always while traced (torch.jit.trace's check traces again under no_grad).
            in_graph = live.requires_grad or _tracing_state() is not None
            reduced = reduce(live.detach() if in_graph else live)
        elif _hooks_refused() is not None:
            # Inside torch.func.grad, vjp or jacrev, which refuse saved-tensor hooks: a
            # checkpoint's (non-reentrant: hooks too) cannot be running there either.
            reduced = reduce(live)
        else:
            # In the graph, its saved tensors kept out of sight of an enclosing checkpoint's
            # count (innermost saved-tensor hooks win). Hooks turn off torch's check that a saved
            # tensor is unchanged at backward: one that shares the value's memory, which the
            # model may change in place later (ReLU(inplace=True)), is saved as a copy, else
            # the gradient would be that of the changed value (no error said so).
            with torch.autograd.graph.saved_tensors_hooks(_saving_apart_from(live), _itself):
                reduced = reduce(live)
        if isinstance(reduced, torch.Tensor):
            return self._keep(reduced)
        if isinstance(reduced, (list, tuple, dict)):
            # t.chunk(2), (t.mean(), t.std()): each tensor in it is kept as a reduced tensor is
            return _map(reduced, self._keep, self._other, policy=self.copy)
        return copy_value(reduced, self.copy)  # a number, an array: the core's copy

    def _keep(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (the live value, or reduce's result) detached, moved, cast; then cloned,
        unless moving or casting made a copy."""
        if not self._in_graph:
            tensor = tensor.detach()
        device = self.device
        dtype = self.dtype
        # Only to a dtype of its own kind: index and mask tensors, and imaginary parts, stay exact.
        if dtype is not None and (tensor.is_floating_point(), tensor.is_complex()) != (
            dtype.is_floating_point,
            dtype.is_complex,
        ):
            dtype = None
        copies = self.copy in ("clone", "deepcopy")
        fresh = False  # a copy made here: not cloned again
        if device is not None or dtype is not None:
            before = tensor
            source = tensor.device
            offload = device is not None and device.type == "cpu" and source.type == "cuda"
            if copies and _inference_mode():
                # Made outside it, a normal tensor (see _normal_clone): not copied again after,
                # which would read a copy from a GPU still in flight.
                with _InferenceMode(False):  # (detached: inference mode built no graph to keep)
                    tensor = tensor.detach().to(device=device, dtype=dtype, non_blocking=offload)
            else:
                tensor = tensor.to(device=device, dtype=dtype, non_blocking=offload)
            if offload:  # the GPU has yet to fill it: recordings wait before reading
                self._pending.add(torch.cuda.current_stream(source))
            fresh = not _shares_memory(tensor, before)
        # Any other: live, or what reduce returned, which may share live's memory however made
        # (a view, through DLPack), be a view keeping a larger tensor alive, or be reduce's own
        # tensor, changed in place later (a running mean).
        if copies and not fresh:
            tensor = clone(tensor)
        return tensor


def _saving_apart_from(live: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A saved-tensor pack hook that saves a copy of a tensor sharing ``live``'s memory.

    The memory ``live`` spans is copied once, however many tensors the reduce saves of it:
    each of them (``live`` itself, ``t * t``'s two, a transpose, an expanded view) is saved
    as a view of that one copy; one reaching past it, or any where ``live`` spans more than
    twice its own size (a slice with gaps), as a copy of its own.

    >>> live = torch.ones(2, requires_grad=True) * 1
    >>> with torch.autograd.graph.saved_tensors_hooks(_saving_apart_from(live), _itself):
    ...     reduced = (live * live).sum()
    >>> _ = live.detach().mul_(5)  # changed in place after it was recorded
    >>> torch.autograd.grad(reduced, live)[0].tolist()  # d(sum(t*t))/dt at t = 1
    [2.0, 2.0]
    """
    try:
        address = live.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # (sparse, nested: no one storage to tell by)
        address = None
    strided = address is not None and live.layout == torch.strided and not live.is_nested
    start = live.storage_offset() if strided else 0
    span = _span(live) if strided else 0
    # (One copy where the value is dense or nearly: a slice with gaps, a ViT's class token
    # tokens[:, 0], spans its whole parent, each saved tensor is copied alone instead.)
    strided = strided and 0 < span <= 2 * live.numel()
    copied: List[torch.Tensor] = []

    def save(tensor: torch.Tensor) -> torch.Tensor:
        try:
            shared = address is None or tensor.untyped_storage().data_ptr() == address
        except (RuntimeError, NotImplementedError):
            shared = True
        if not shared:
            return tensor
        plain = strided and tensor.layout == torch.strided and not tensor.is_nested
        # (A view of the copy has no conjugate or negative bit: t.conj()'s would be t's.)
        plain = plain and not (tensor.is_conj() or tensor.is_neg() or live.is_conj() or live.is_neg())
        offset = tensor.storage_offset() - start if plain else -1
        if offset < 0 or tensor.dtype != live.dtype or offset + _span(tensor) > span:
            # Detached: autograd gives the unpacked tensor its place in the graph back.
            return tensor.detach().clone()
        if not copied:
            copied.append(live.detach().as_strided((span,), (1,), start).clone())
        return copied[0].as_strided(tensor.size(), tensor.stride(), offset)

    return save


def _span(tensor: torch.Tensor) -> int:
    """How many elements of its storage a strided ``tensor`` reaches, from its first."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((n - 1) * step for n, step in zip(tensor.shape, tensor.stride(), strict=True))


def _itself(value: T) -> T:
    return value


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. functional)
        return True


# Torch's own ops on plain tensors and parameters: no patched Python code runs in these
# copies, so recordings need not silence their probes around them (runtime.silently).
_plain_copies = (
    detached_clone,
    clone,
    _detached,
    _detached_copy,
    _itself,
    _kept_in_graph,
    torch.Tensor.detach,
)
for _plain_copy in _plain_copies:
    copies_without_python(_plain_copy, torch.Tensor, torch.nn.Parameter)
for _plain_copy in _core_copies.values():
    copies_without_python(_plain_copy, torch.Tensor, torch.nn.Parameter)
