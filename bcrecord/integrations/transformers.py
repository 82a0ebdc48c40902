"""Hugging Face transformers: copies of key/value caches, and a recorder for attention.

:func:`attention_recorder` patches the module-level ``eager_attention_forward`` (or a
variant of that name, ``simple_eager_attention_forward``...) a model's attention
layers call, keys named by each layer's path, and refuses a model whose attention
never calls it (``attn_implementation='sdpa'``, flash attention), which would record
nothing.

The core loads this module by name the first time a recording copies an object of
transformers (a model's output, a cache). It registers how a ``Cache``
(``DynamicCache``, ``StaticCache``, ...) is copied under ``copy='clone'``, the
default: as a new cache holding detached clones of its tensors (moved, cast or
reduced as well by :func:`bcrecord.torch.record`'s ``to``, ``dtype`` and
``reduce``). Without it a cache has no ``.clone()`` and would be kept as it is:
under ``model.generate`` the model fills one cache object step after step, so every
recorded output's ``past_key_values`` would show the cache as it is at the end of
generation, not as it was when recorded.

Under ``'detach'`` and ``'none'`` a cache is kept as it is (as any object without
``.clone()``; under ``'none'``, a new one where ``to``, ``dtype`` or ``reduce``
apply); ``'deepcopy'`` deep-copies it.

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
import inspect
import types
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Set, Tuple, Union

try:
    import torch
    from transformers.cache_utils import Cache
except ImportError:
    # transformers without PyTorch (a tokenizer's output recorded), or older than its
    # caches (4.36): no cache to copy, and every other value is copied as before.
    _HAS_CACHES = False
else:
    _HAS_CACHES = True
    from ..torch.copies import register_holder

from ..analysis import read
from ..errors import TargetError, warn
from ..patch import Patch, function_of, patch_function
from ..specs import SpecLike

__all__ = ["attention_recorder"]

#: The module-level function every transformers 5 model's eager attention path calls.
ATTENTION_FUNCTION = "eager_attention_forward"


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


def _copied_cache(cache: Cache, copy: Callable[[Any], Any]) -> Cache:
    """A new cache like ``cache``, holding ``copy`` of each of its tensors.

    The structure is deep-copied (a cache's layers are replaced or grown in place
    while the model runs on); each tensor is copied as the recording copies a value
    (a detached clone; moved, cast or reduced by the torch layer's ``to``, ``dtype``
    and ``reduce``), so a tensor in the autograd graph (which ``copy.deepcopy``
    refuses) is copied too.
    """
    memo: Dict[int, Any] = {}
    for tensor in _tensors(cache, set()):
        memo[id(tensor)] = copy(tensor)
    return _copy_module.deepcopy(cache, memo)


if _HAS_CACHES:
    # (Not under 'detach': the cache is kept as it is, the live one.)
    register_holder(Cache, _copied_cache, policies=("clone", "deepcopy"))


def _attention_modules(modules: List[Tuple[str, Any]]) -> List[Tuple[str, Any, Callable[..., Any]]]:
    """``(path, module, function)`` for each of ``modules`` (``(path, module)``) whose ``forward``
    calls a module-level ``eager_attention_forward``, or a variant named so (TimesFM's
    ``simple_eager_attention_forward``, Llama 4's ``vision_eager_attention_forward``),
    looked up in the globals of the module's own code."""
    found = []
    for path, module in modules:
        forward = getattr(type(module), "forward", None)
        if not callable(forward):
            continue
        forward = inspect.unwrap(forward)  # (transformers decorates forwards)
        code = getattr(forward, "__code__", None)
        names = [] if code is None else [name for name in code.co_names if name.endswith(ATTENTION_FUNCTION)]
        for name in names:
            function = getattr(forward, "__globals__", {}).get(name)
            if callable(function):
                found.append((path, module, function))
    return found


def _softmax_targets(modules: List[Tuple[str, Any]]) -> List[str]:
    """``'<path>:forward:<chain>()'`` for each of ``modules`` (``(path, module)``) whose own
    ``forward`` calls a softmax (``nn.functional.softmax``, ``torch.softmax``,
    ``scores.softmax``...): where a model without an attention function (DeBERTa) computes
    its probabilities."""
    found = []
    for path, module in modules:
        forward = getattr(type(module), "forward", None)
        code = getattr(inspect.unwrap(forward), "__code__", None) if callable(forward) else None
        if code is None or "softmax" not in code.co_names:  # (cheap: most modules have none)
            continue
        chains = [chain for chain in read(code).calls if chain.rpartition(".")[2] == "softmax"]
        found += [f"{path}:forward:{chain}()" for chain in chains[:1]]
    return found


def _without_function(name: str, modules: List[Tuple[str, Any]]) -> str:
    """What to do for a model (its ``(path, module)`` pairs) whose attention modules call no
    attention function."""
    sites = _softmax_targets(modules)
    if not sites:  # (no module's forward calls a softmax: a state-space model, Mamba's)
        return (
            f"nor does any module's forward call a softmax: {name} may compute no attention; "
            "bcrecord.torch.list_targets(model) lists what it computes, to record with bcrecord.torch.record"
        )
    others = len(sites) - 1
    more = f" (and {others} more module{'s' * (others > 1)} whose forward calls a softmax)" if others else ""
    return (
        f"{name} computes attention in its modules' forward: record the probabilities there, "
        f"e.g. bcrecord.torch.record(model, [{sites[0]!r}]){more}; "
        "bcrecord.torch.list_targets(model) lists every target"
    )


def _warn_of_attention_elsewhere(
    name: str, modules: List[Tuple[str, Any]], calling: Set[int], function: Callable[..., Any]
) -> None:
    """Warn where attention modules of a model (``modules``, ``(path, module)`` pairs) that
    call no attention function (their ids not in ``calling``) compute their probabilities in
    their own forward: GIT's text layers do, beside a vision tower that calls ``function``,
    and a patch of ``function`` would leave them out without a word. Told apart from a
    router's softmax (Mixtral's) by the module's class name."""
    elsewhere = [
        (path, module)
        for path, module in modules
        if id(module) not in calling and "attention" in type(module).__name__.lower()
    ]
    sites = _softmax_targets(elsewhere)
    if sites:
        paths = [site.partition(":")[0] for site in sites]
        shown = ", ".join(paths[:2]) + (f" and {len(paths) - 2} more" if len(paths) > 2 else "")
        warn(
            f"attention_recorder: {len(sites)} attention module{'s' * (len(sites) > 1)} of {name} "
            f"({shown}) compute{'s' * (len(sites) == 1)} attention in {'their' if len(sites) > 1 else 'its'} "
            f"own forward, not through {function.__module__}.{function.__qualname__}: this patch does not "
            f"record {'them' if len(sites) > 1 else 'it'}; record the probabilities there, "
            f"e.g. bcrecord.torch.record(model, [{sites[0]!r}])"
        )


def _implementation(model: Any, module: Any) -> Optional[str]:
    """The attention implementation a module runs (its own config's, else the model's)."""
    config = getattr(module, "config", None) or getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)


def _refuse_fused(name: str, modules: Dict[str, Any], model: Any, function: str) -> None:
    """Refuse ``modules`` (by path) where they run another attention implementation than eager."""
    running = {path: _implementation(model, module) for path, module in modules.items()}
    others = {path: kind for path, kind in running.items() if kind not in (None, "eager")}
    if others:
        # (SDPA and flash attention run fused kernels: the Python function never runs.)
        kinds = " / ".join(sorted({repr(kind) for kind in others.values()}))
        where = ", ".join(list(others)[:2]) + (f" and {len(others) - 2} more" if len(others) > 2 else "")
        raise TargetError(
            f"attention_recorder: {name} runs attn_implementation={kinds} in {where}: it never calls "
            f"{function}, so nothing would be recorded; load it with "
            "attn_implementation='eager' (from_pretrained(..., attn_implementation='eager')) or call "
            "model.set_attn_implementation('eager') first"
        )


def attention_recorder(
    model: Any, specs: Union[SpecLike, Iterable[SpecLike]], function: Optional[Callable[..., Any]] = None
) -> Patch:
    """Patch the attention function ``model``'s layers call; each layer's keys named by its path.

    ``function`` defaults to the ``eager_attention_forward`` the model's attention modules
    call (one function; give it where the modules call several). A model that runs
    another attention implementation (``'sdpa'``, the default, or flash attention) never
    calls it: that raises :class:`~bcrecord.errors.TargetError` saying how to switch to
    ``'eager'``, instead of a recording that stays empty. Where other attention modules of
    the model compute attention in their own ``forward`` (GIT's text layers, beside a
    vision tower that calls the function), it warns with a target that records them. Use
    the returned patch as a context manager, with ``bcrecord.recording(only=[patch])``.

    Each model's function numbers its locals its own way (GPT-2's ``attn_weights@2`` is
    the probabilities, T5's the scores plus the mask): ``bcrecord.targets(function)``
    lists them, and the call site ``'nn.functional.softmax()'`` names the probabilities
    in every model whose function calls it.

    >>> import torch, bcrecord
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> config = GPT2Config(n_layer=2, n_head=2, n_embd=8, vocab_size=10, n_positions=8,
    ...                     bos_token_id=0, eos_token_id=0)
    >>> gpt2 = GPT2LMHeadModel(config).eval()
    >>> attention_recorder(gpt2, ["attn_weights@2"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bcrecord.errors.TargetError: attention_recorder: GPT2LMHeadModel runs attn_implementation='sdpa' in ...
    >>> gpt2.set_attn_implementation("eager")
    >>> with attention_recorder(gpt2, ["attn_weights@2"]) as patch, bcrecord.recording(only=[patch]) as rec:
    ...     _ = gpt2(torch.tensor([[1, 2, 3]]))
    >>> rec["transformer.h.1.attn:eager_attention_forward:attn_weights@2"].shape
    torch.Size([1, 2, 3, 3])
    """
    # Checked first, naming what was given: not an AttributeError from inside (named_modules, __module__).
    if not callable(getattr(model, "named_modules", None)):
        raise TypeError(
            "attention_recorder takes a model, an nn.Module instance, "
            f"not {type(model).__name__}: {model!r:.80}"
        )
    if function is not None:
        function_of(function)  # a NotPatchableError saying what it is instead
    from ..torch.targets import named_modules, unwrap

    # A decoder layer compiled in its place (`layers[0] = torch.compile(layers[0])`) seen
    # through, as record() names its modules: 'model.layers.0.self_attn', not '...0._orig_mod...';
    # so is a wrapper of the whole model (torch.compile, DataParallel, DDP): not '_orig_mod.model...'.
    listed = named_modules(unwrap(model))
    modules = _attention_modules(listed)
    functions = list(dict.fromkeys(f for _, _, f in modules))
    name = type(unwrap(model)).__name__  # (the user's model, not torch.compile's OptimizedModule)
    if function is None:
        fused = all(_implementation(model, module) not in (None, "eager") for _, module, _ in modules)
        if len(functions) > 1 and fused:
            # None runs eagerly: said first, as function= would not help (where some do, it would).
            named = " or ".join(f"{f.__module__}.{f.__qualname__}" for f in functions)
            _refuse_fused(name, {path: module for path, module, _ in modules}, model, named)
        if len(functions) != 1:
            what = ", ".join(f"{f.__module__}.{f.__qualname__}" for f in functions) or "none"
            raise TargetError(
                f"attention_recorder: {name}'s attention modules call {len(functions)} "
                f"{ATTENTION_FUNCTION} functions ({what}); "
                + ("give function= to choose one" if functions else _without_function(name, listed))
            )
        function = functions[0]
    callers = [(path, module) for path, module, f in modules if f is function]
    if not callers:
        raise TargetError(
            f"attention_recorder: no module of {name} calls {function.__module__}.{function.__qualname__}; "
            f"its attention modules call: {', '.join(f'{f.__module__}.{f.__qualname__}' for f in functions)}"
        )
    _refuse_fused(name, dict(callers), model, f"{function.__module__}.{function.__qualname__}")
    _warn_of_attention_elsewhere(name, listed, {id(module) for _, module, _ in modules}, function)
    paths = {id(module): path for path, module in listed}
    # The owner of a call is its first argument (the attention module); None: not recorded.
    return patch_function(function, specs, name=lambda module: paths.get(id(module)))
