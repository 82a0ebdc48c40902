"""Tensor copies for recordings, and the per-target value policies of the torch layer.

Importing this module registers how tensors are copied under each core policy
(the core loads it by name the first time it meets a tensor):

* ``'clone'``: a detached clone — the value as it was when assigned, outside the
  autograd graph (so recording never keeps activations' graphs alive). For CPU
  tensors it is torch's copy-on-write clone: no data is copied unless the model
  later writes to the tensor in place (``relu_``, ``+=``), so recording a value
  that is never overwritten costs next to nothing;
* ``'detach'``: the tensor detached, no copy (cheapest; later in-place changes show);
* ``'deepcopy'``: a detached clone (``copy.deepcopy`` refuses non-leaf tensors).

:func:`value_policy` builds the copier for one target of :func:`bcrecord.torch.record`
from its options: offload (``to='cpu'``), dtype cast, a reduce function, and
``grad=True`` (keep the value in the autograd graph).

>>> import torch
>>> from bcrecord.runtime import copy_value
>>> t = torch.ones(2, requires_grad=True) * 2
>>> copied = copy_value(t, "clone")
>>> copied.requires_grad, copied.data_ptr() != t.data_ptr()
(False, True)
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import torch

from ..runtime import register_copy

__all__ = ["clone", "value_policy"]

#: torch's copy-on-write clone (private API, in torch since 2.2): the copy is made
#: when either tensor is first written, so values never overwritten are not copied.
_lazy_clone: Optional[Callable[[torch.Tensor], torch.Tensor]] = getattr(torch, "_lazy_clone", None)


def clone(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` as it is now: copy-on-write where torch supports it.

    Used for detached CPU tensors with the usual (strided) layout; anything else,
    and tensors that take part in autograd, get ``tensor.clone()``.

    >>> import torch
    >>> live = torch.tensor([-1.0, 2.0])
    >>> kept = clone(live)
    >>> _ = live.relu_()
    >>> kept, live
    (tensor([-1.,  2.]), tensor([0., 2.]))
    """
    if (
        _lazy_clone is not None
        and tensor.is_cpu
        and not tensor.requires_grad
        and tensor.layout == torch.strided
    ):
        try:
            return _lazy_clone(tensor)
        except (RuntimeError, NotImplementedError):  # a tensor subclass or kind it does not take
            pass
    return tensor.clone()


def _outside_graph(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` detached, skipping the op when it is outside autograd already.

    Only for values that are cloned next: the clone is a new tensor either way.
    """
    return tensor.detach() if tensor.requires_grad else tensor


register_copy(torch.Tensor, "clone", lambda t: clone(_outside_graph(t)))
register_copy(torch.Tensor, "detach", lambda t: t.detach())
register_copy(torch.Tensor, "deepcopy", lambda t: t.detach().clone())

Device = Union[str, torch.device, None]


def _map(value: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor in (nested) tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return type(value)((k, _map(v, fn)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        items = [_map(v, fn) for v in value]
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
            return type(value)(*items)
        return type(value)(items)
    return value


def value_policy(
    copy: str = "clone",
    to: Device = None,
    dtype: Optional[torch.dtype] = None,
    reduce: Optional[Callable[[torch.Tensor], Any]] = None,
    grad: bool = False,
) -> Callable[[Any], Any]:
    """A copier applying the torch layer's options to every tensor in a value.

    Order: ``reduce``, then detach (unless ``grad``), then move/cast, then clone if
    the result still shares memory with the live value (``copy='clone'``).
    Non-tensor values follow the core's ``copy`` policy.

    >>> import torch
    >>> keep = value_policy(reduce=lambda t: t.mean(0), dtype=torch.float64)
    >>> keep(torch.tensor([[1.0, 3.0], [3.0, 5.0]]))
    tensor([2., 4.], dtype=torch.float64)
    """
    from ..runtime import copy_value

    device = torch.device(to) if to is not None else None

    plain = reduce is None and device is None and dtype is None

    def one(tensor: torch.Tensor) -> Any:
        if plain:  # the usual case, without the checks below
            if copy == "clone":
                return clone(tensor if grad else _outside_graph(tensor))
            return tensor if grad else tensor.detach()
        live = tensor
        if reduce is not None:
            tensor = reduce(tensor)
            if not isinstance(tensor, torch.Tensor):
                return tensor
        if not grad:
            tensor = tensor.detach()
        if device is not None or dtype is not None:
            tensor = tensor.to(
                device=device, dtype=dtype, non_blocking=live.is_cuda and device == torch.device("cpu")
            )
        if copy == "clone" and _shares_memory(tensor, live):
            tensor = clone(tensor)
        return tensor

    def keep(value: Any) -> Any:
        if isinstance(value, (torch.Tensor, list, tuple, dict)):
            return _map(value, one)
        return copy_value(value, copy)

    return keep


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. functional)
        return True
