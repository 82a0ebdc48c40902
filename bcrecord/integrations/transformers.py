"""Copies of Hugging Face transformers' key/value caches for recordings.

The core loads this module by name the first time a recording copies an object of
transformers (a model's output, a cache). It registers how a ``Cache``
(``DynamicCache``, ``StaticCache``, ...) is copied under ``copy='clone'``, the
default: as a new cache holding detached clones of its tensors. Without it a cache
has no ``.clone()`` and would be kept as it is: under ``model.generate`` the model
fills one cache object step after step, so every recorded output's
``past_key_values`` would show the cache as it is at the end of generation, not as
it was when recorded.

Under ``'detach'`` and ``'none'`` a cache is kept as it is (as any object without
``.clone()``); ``'deepcopy'`` deep-copies it.

>>> import torch
>>> from transformers import DynamicCache
>>> from bcrecord.runtime import copy_value
>>> cache = DynamicCache()
>>> _ = cache.update(torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4), 0)
>>> kept = copy_value(cache, "clone")
>>> _ = cache.update(torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4), 0)
>>> kept.get_seq_length(), cache.get_seq_length()
(2, 3)
"""

from __future__ import annotations

import copy as _copy_module
import types
from typing import Any, Dict, Iterator, Set

try:
    import torch
    from transformers.cache_utils import Cache
except ImportError:
    # transformers without PyTorch (a tokenizer's output recorded), or older than its
    # caches (4.36): no cache to copy, and every other value is copied as before.
    _HAS_CACHES = False
else:
    _HAS_CACHES = True

from ..runtime import copy_value, register_copy

__all__: list = []


def _tensors(value: Any, seen: Set[int]) -> Iterator[torch.Tensor]:
    """Every tensor held by ``value``: in its attributes (``__dict__`` and ``__slots__``),
    lists, tuples, sets and dicts, each object looked at once."""
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        items: Any = value
    elif isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (type, types.ModuleType)) or type(value).__module__ == "builtins":
        return  # (a class or a module is shared, never copied: its namespace is not the cache's)
    else:
        items = list(getattr(value, "__dict__", {}).values())
        for cls in type(value).__mro__:
            slots = cls.__dict__.get("__slots__", ())
            for name in (slots,) if isinstance(slots, str) else slots:
                if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                    items.append(getattr(value, name))
    for item in items:
        yield from _tensors(item, seen)


def _copied_cache(cache: Cache) -> Cache:
    """A new cache like ``cache``, its tensors detached clones (``copy='clone'``).

    The structure is deep-copied (a cache's layers are replaced or grown in place
    while the model runs on); each tensor is copied as a recording copies it, so a
    tensor in the autograd graph (which ``copy.deepcopy`` refuses) is copied too.
    """
    memo: Dict[int, Any] = {}
    for tensor in _tensors(cache, set()):
        memo[id(tensor)] = copy_value(tensor, "clone")
    return _copy_module.deepcopy(cache, memo)


if _HAS_CACHES:
    register_copy(Cache, "clone", _copied_cache)
