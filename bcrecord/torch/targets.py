"""Target strings for models: ``'<module path>:<method>:<target>'``, expanded over a model.

Forms (``path`` is a dotted path from ``model.named_modules()``, ``''`` for the root; a
submodule compiled in place is at its own path, its children under it: :func:`named_modules`):

* ``'layer1.0:forward:out@2'`` — a local, attribute or return spec of a method;
* ``':_forward_impl:x@0'`` — a method of the root module;
* ``'blocks.3:forward:x'`` — every assignment of ``x``;
* ``'layer1'`` — that module's output (its ``forward``'s return value), as in
  torchvision's ``return_nodes``; that is, before the module's forward hooks run: a hook
  that returns another value changes what the caller gets, which is recorded in the
  caller (``':forward:h'``, or the next module's argument). An argument
  (``'layer1:forward:x'``) is what ``forward`` gets: after forward pre-hooks;
* globs in the path, matched one dotted component at a time: ``'blocks.*:forward:x@1'``,
  ``'layer*.*'`` (``layer1.0``, ``layer2.3``…, not ``layer1.0.conv1``);
* a ``.grad`` suffix records the gradient of the value: ``'layer1.0:forward:out@2.grad'``;
* FX node names of functional ops, where they map to exactly one call or operator
  site of the module's ``forward`` or a method of the module it calls:
  ``'flatten'`` (ResNet's ``torch.flatten``, in ``_forward_impl``), ``'layer1.0.add'``
  (a Bottleneck's ``out += identity``), ``'add_1'`` (the second ``add``).

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
>>> [(t.path, t.method, t.spec) for t in expand(net, "*")]
[('0', 'forward', Return(copy=None)), ('1', 'forward', Return(copy=None))]
"""

from __future__ import annotations

import builtins
import collections.abc
import contextlib
import contextvars
import fnmatch
import functools
import inspect
import itertools
import math
import re
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Container, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple, cast

import torch
from bytecode import Instr, Label
from torch.nn.utils import parametrize

from .._versions import current, global_name, local_name
from ..analysis import compiled_spec, computed_callee_calls, instructions, read
from ..errors import BcrecordError, NotPatchableError, SpecError, TargetError, did_you_mean, warn
from ..patch import function_of, original_code
from ..patch import targets as function_targets
from ..runtime import carried_variable
from ..specs import Attribute, Call, Expr, Return, Spec, compiled_name, full_width_fixed, parse

__all__ = [
    "Target",
    "expand",
    "expand_all",
    "has_forward",
    "unwrap",
    "module_at",
    "named_modules",
    "new_matches",
]

_WRAPPERS: Tuple[type, ...] = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)


@dataclass(frozen=True)
class Target:
    """One concrete target: a spec in one method of one submodule.

    >>> import torch
    >>> from bcrecord.torch import expand
    >>> target = expand(torch.nn.Sequential(torch.nn.Linear(2, 2)), "0:forward:return")[0]
    >>> target.path, target.method, target.spec
    ('0', 'forward', Return(copy=None))
    """

    #: The target as the user wrote it (a glob expands to several targets).
    text: str
    path: str
    method: str
    spec: Spec
    grad: bool = False
    #: True for a bare module path: the module's output.
    output: bool = False


def require_module(model: Any) -> None:
    """Refuse, with a clear ``TypeError``, anything but an ``nn.Module`` instance.

    >>> require_module(torch.nn.Linear)
    Traceback (most recent call last):
    ...
    TypeError: expected an nn.Module instance, got the class Linear: pass an instance, e.g. Linear(...)
    """
    if isinstance(model, torch.nn.Module):
        return
    if isinstance(model, type):
        raise TypeError(
            f"expected an nn.Module instance, got the class {model.__name__}: pass an instance, "
            f"e.g. {model.__name__}(...)"
        )
    raise TypeError(f"expected an nn.Module instance, got {type(model).__name__}: {model!r:.80}")


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside ``nn.DataParallel`` / ``DistributedDataParallel`` / ``torch.compile`` wrappers.

    >>> import torch
    >>> from bcrecord.torch import unwrap
    >>> inner = torch.nn.Linear(1, 1)
    >>> unwrap(torch.nn.DataParallel(inner)) is inner
    True
    """
    compiled = _compiled_wrapper()
    while True:
        if isinstance(model, _WRAPPERS):
            model = model.module  # type: ignore[assignment,attr-defined]
            continue
        if isinstance(model, compiled):
            model = model._orig_mod  # type: ignore[attr-defined]
            continue
        return model


def _compiled_wrapper() -> Tuple[type, ...]:
    """torch.compile's module wrapper class (``OptimizedModule``), or ``()`` before anything
    compiled: its module is imported only then, and importing Dynamo here would cost seconds."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(dynamo, "OptimizedModule", None)
    return () if wrapper is None else (wrapper,)


def named_modules(model: torch.nn.Module, remove_duplicate: bool = True) -> List[Tuple[str, torch.nn.Module]]:
    """``model.named_modules()``, each submodule compiled in place seen through, as :func:`unwrap`
    sees through a compiled root (``model`` itself is listed as it is: unwrap it first).

    ``model.block = torch.compile(model.block)`` puts torch.compile's wrapper at ``'block'``
    and the module at ``'block._orig_mod'``; here the module is at ``'block'`` and its
    children under it (``'block.0'``), the paths a target takes (what the wrapper returns
    is what the module's forward returns) and a glob matches. ``remove_duplicate`` is
    ``named_modules()``'s: False lists a module registered at two paths at each.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU()))
    >>> model[0] = torch.compile(model[0])
    >>> [path for path, _ in model.named_modules()]
    ['', '0', '0._orig_mod', '0._orig_mod.0']
    >>> [(path, type(module).__name__) for path, module in named_modules(model)]
    [('', 'Sequential'), ('0', 'Sequential'), ('0.0', 'ReLU')]
    """
    found = _walk(model, remove_duplicate)
    compiled = _compiled_wrapper()
    # (By each class met once: a whole model's modules are of a few classes.)
    if not compiled or not any(issubclass(kind, compiled) for kind in {type(module) for _, module in found}):
        return found  # (nothing compiled in it, or yet in this process: no wrapper to look for)
    shown: Dict[str, str] = {"": ""}  # each path as named_modules gives it: the path seen through
    wrappers = set()  # the paths, as named_modules gives them, of compiled wrappers
    listed: List[Tuple[str, torch.nn.Module]] = []
    listed_ids: Set[int] = set()
    for path, module in found:
        parent, _, name = path.rpartition(".")
        base = shown.get(parent, parent)  # (a name with a dot in it has no parent listed)
        inside = parent in wrappers and name == "_orig_mod"  # listed at the wrapper's path already
        shown[path] = base if inside else f"{base}.{name}" if base else name
        if path and isinstance(module, compiled):  # (a compiled root is the caller's: unwrap)
            wrappers.add(path)
            if not inside:
                inner = module
                while isinstance(inner, compiled):  # (torch.compile of a compiled module)
                    inner = inner._orig_mod  # type: ignore[attr-defined]
                # A module listed elsewhere (`model.b = torch.compile(model.a)`): once, at
                # the other path, as named_modules() lists a module registered twice.
                if not (remove_duplicate and id(inner) in listed_ids):
                    listed.append((shown[path], inner))
                    listed_ids.add(id(inner))
        elif not inside:
            listed.append((shown[path], module))
            listed_ids.add(id(module))
    return listed


_NAMED_MODULES = torch.nn.Module.named_modules


def _walk(model: torch.nn.Module, remove_duplicate: bool) -> List[Tuple[str, torch.nn.Module]]:
    """``list(model.named_modules(remove_duplicate=...))``, the same list, walked by plain calls.

    torch's generator resumes each level above a module to hand it up (for resnet50's 151
    modules, some 600 resumptions: a third of a whole-model set-up went there). A module whose
    class has a ``named_modules`` of its own is walked by it, from there down. While
    :func:`_resolving` runs, each root is walked once, and where its every module was walked
    (``remove_duplicate=False``, as :func:`~bcrecord.torch.record.warn_shared` asks), the list
    without duplicates is that one, each module at its first path.

    >>> model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Tanh()))
    >>> model.append(model[0])  # the same ReLU at '0' and '2'
    Sequential(...)
    >>> [_walk(model, flag) == list(model.named_modules(remove_duplicate=flag)) for flag in (True, False)]
    [True, True]
    >>> with _resolving(model):
    ...     _ = _walk(model, False)
    ...     _walk(model, True) == list(model.named_modules())
    True
    """
    resolving = _found.get()
    if resolving is None:
        return _walked(model, remove_duplicate)[0]
    # (An entry holds its root: the id it is kept under stays that root's while the block runs.)
    kept = resolving.walks.get((id(model), remove_duplicate))
    if kept is None:
        every = resolving.walks.get((id(model), False))
        if remove_duplicate and every is not None and every[2]:
            # Each module at its first path: the same list (a module met again is skipped
            # with all below it, which its first visit listed already).
            seen: Set[torch.nn.Module] = set()
            first: List[Tuple[str, torch.nn.Module]] = []
            for path, module in every[1]:
                if module not in seen:
                    seen.add(module)
                    first.append((path, module))
            kept = (model, first, True)
        else:
            kept = (model, *_walked(model, remove_duplicate))
        resolving.walks[id(model), remove_duplicate] = kept
    return list(kept[1])


def _walked(model: torch.nn.Module, remove_duplicate: bool) -> Tuple[List[Tuple[str, torch.nn.Module]], bool]:
    """:func:`_walk`'s list, and whether torch's ``named_modules`` walked every module in it
    (no class with one of its own: whose list may be any)."""
    if type(model).named_modules is not _NAMED_MODULES:
        return list(model.named_modules(remove_duplicate=remove_duplicate)), False
    found: List[Tuple[str, torch.nn.Module]] = []
    memo: Set[torch.nn.Module] = set()  # (a set of modules, as torch's: their own hash and ==)
    plain = True

    def visit(module: torch.nn.Module, prefix: str) -> None:
        nonlocal plain
        if type(module).named_modules is not _NAMED_MODULES:
            plain = False
            found.extend(module.named_modules(memo, prefix, remove_duplicate))
            return
        if module in memo:
            return
        if remove_duplicate:
            memo.add(module)
        found.append((prefix, module))
        dot = f"{prefix}." if prefix else ""
        for name, child in module._modules.items():
            if child is not None:
                visit(child, dot + name)

    visit(model, "")
    return found, plain


def module_at(model: torch.nn.Module, path: str) -> torch.nn.Module:
    """The submodule at ``path``, also through a wrapper's ``.module``; a clear error if none.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Linear(3, 1)))
    >>> module_at(torch.nn.DataParallel(model), "1.0")
    Linear(in_features=3, out_features=1, bias=True)
    >>> module_at(model, "1.1")
    Traceback (most recent call last):
    bcrecord.errors.TargetError: the model has no submodule '1.1'; did you mean '1.0'?
    """
    found = _submodule(model, path)
    if found is None:
        raise _no_submodule(model, path)
    return found


class _Found:
    """What :func:`_resolving` has looked up in its model so far."""

    __slots__ = ("model", "modules", "matches", "walks")

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        #: The submodule at each path (None: none there).
        self.modules: Dict[str, Optional[torch.nn.Module]] = {}
        #: The paths each module path or glob matches (see _matching_paths).
        self.matches: Dict[str, List[str]] = {}
        #: What :func:`_walk` gave, by (id(root), remove_duplicate): (root, list, whether torch's
        #: own named_modules walked it all).
        self.walks: Dict[
            Tuple[int, bool], Tuple[torch.nn.Module, List[Tuple[str, torch.nn.Module]], bool]
        ] = {}


#: What :func:`_resolving` has found, while it runs.
_found: contextvars.ContextVar[Optional[_Found]] = carried_variable(
    contextvars.ContextVar("bcrecord_found_submodules", default=None)
)


@contextlib.contextmanager
def _resolving(model: torch.nn.Module) -> Iterator[None]:
    """Look each path of ``model`` up once while the block runs, for every target that names it,
    and match each glob against its module paths once (``'blocks.*'``, for each of its targets).

    For :class:`~bcrecord.torch.record.Plan`, which resolves all its targets at once, the model
    unchanged meanwhile, and for the check of the targets when a block ends: a walk from the root
    per lookup (a target's path is looked up some five times, and a thousand targets name a few
    hundred paths), and one over every module per glob target, made set-up grow with the targets.
    A module put in the model after the block is found by the next one. Inside a block for
    the same model, the outer block's findings are kept and added to.

    >>> model = torch.nn.Sequential(torch.nn.ReLU())
    >>> with _resolving(model):
    ...     first = module_at(model, "0")
    ...     model[0] = torch.nn.Tanh()
    ...     again = module_at(model, "0")
    >>> type(first).__name__, type(again).__name__, type(module_at(model, "0")).__name__
    ('ReLU', 'ReLU', 'Tanh')
    """
    outer = _found.get()
    if outer is not None and outer.model is model:
        yield
        return
    token = _found.set(_Found(model))
    try:
        yield
    finally:
        _found.reset(token)


def _submodule(model: torch.nn.Module, path: str) -> Optional[torch.nn.Module]:
    """:func:`module_at`'s lookup, None where there is no such submodule (no hint: it costs)."""
    found = _found.get()
    if found is None or found.model is not model:
        return _lookup(model, path)
    try:
        return found.modules[path]
    except KeyError:
        module = found.modules[path] = _lookup(model, path)
        return module


def _lookup(model: torch.nn.Module, path: str) -> Optional[torch.nn.Module]:
    """:func:`_submodule`'s walk from the root."""
    if not path:  # the root: the model itself, inside any wrapper (as list_targets lists it)
        return unwrap(model)
    names = path.split(".")
    inner = unwrap(model)
    roots = (model,) if inner is model else (model, inner)  # (each looked in once: a miss costs)
    found: Optional[torch.nn.Module] = None
    for root in roots:
        found = _registered(root, names)
        if found is not None:  # (not `or`: an empty Sequential is false)
            break
    if found is None:  # not registered at that path: an attribute may give one (a property)
        for root in roots:
            # (torch refuses get_submodule on TorchScript, whose registered modules are all it has)
            if _through_parametrized(root, path) or isinstance(root, torch.jit.ScriptModule):
                continue
            try:
                found = root.get_submodule(path)
                break
            except AttributeError:
                continue
    # A compiled submodule (`model.layer1 = torch.compile(model.layer1)`): the module inside
    # torch.compile's wrapper, whose forward the wrapper runs, as at the root.
    if isinstance(found, _compiled_wrapper()):
        return unwrap(found)
    return found


def _registered(root: torch.nn.Module, names: Sequence[str]) -> Optional[torch.nn.Module]:
    """The submodule registered at the path ``names`` under ``root`` (each one in its parent's
    ``_modules``, as ``named_modules()`` walks them), None where there is none.

    What ``get_submodule`` finds there too, without its ``hasattr`` and ``getattr`` through
    ``Module.__getattr__`` at every level: a lookup took some 20 us, and a set-up looks up
    every targeted path a few times. No tensor is read (a parametrized one would run its
    parametrization).

    >>> model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU()))
    >>> _registered(model, ["0", "0"]), _registered(model, ["0", "1"])
    (ReLU(), None)
    """
    module: Any = root
    for name in names:
        # (A TorchScript module's is no dict: `in` and [] only. None where a subclass's __init__
        # never called Module's: get_submodule finds nothing there either.)
        children = module.__dict__.get("_modules")
        if children is None or name not in children:
            return None
        module = children[name]
        if not isinstance(module, torch.nn.Module):  # (None: a slot registered empty)
            return None
    return cast(torch.nn.Module, module)


def _through_parametrized(root: torch.nn.Module, path: str) -> bool:
    """Whether ``path`` reaches a parametrized tensor (``'lin.weight'``): ``get_submodule``
    would read it, running its parametrization (spectral_norm's power iteration would advance)."""
    module: Optional[torch.nn.Module] = root
    for name in path.split("."):
        if module is None:
            return False
        if parametrize.is_parametrized(module, name):
            return True
        # (a TorchScript module's _modules is no dict: it has no .get)
        module = module._modules[name] if name in module._modules else None
    return False


def _no_submodule(model: torch.nn.Module, path: str) -> TargetError:
    """The error for a ``path`` that names no submodule, with the paths close to it.

    Close among the paths under its deepest existing ancestor: comparing with every
    path of a model of a thousand modules takes 0.2 s, and the typo is below there.
    """
    ancestor, found = path, None
    while found is None:  # '' is the root, always found
        ancestor = ancestor.rpartition(".")[0]
        found = _submodule(model, ancestor)
    prefix = f"{ancestor}." if ancestor else ""
    names = [prefix + name if name else ancestor for name, _ in named_modules(found)]
    if path in names:  # named_modules joins its names with dots: one of them holds a dot
        return TargetError(
            f"the submodule listed as {path!r} has a '.' in its name (set with setattr, which "
            "does not check; add_module refuses it): no dotted path reaches it; give it a name "
            "without a dot"
        )
    # With the FX node names of the ops there ('flatten', 'layer1.0.add'), torchvision's own, where
    # the last part is the one misspelt (under a module that exists).
    fx = _fx_names_under(model, found, prefix) if path.rpartition(".")[0] == ancestor else []
    hint = did_you_mean(path, [name for name in names if name] + fx, hide_private=False)
    return TargetError(f"the model has no submodule {path!r}{hint}")


def _fx_names_under(model: torch.nn.Module, module: torch.nn.Module, prefix: str) -> List[str]:
    """The FX node names (unnumbered) of the function calls and operators of ``module``'s forward
    and the methods of its own that it calls, each after ``prefix``, that name a site of
    ``model`` (``module`` is at ``prefix``); for a did-you-mean only.

    >>> class Net(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.flatten(x, 1) + 1
    >>> _fx_names_under(Net(), Net(), "")
    ['add', 'flatten']
    """
    forward = getattr(type(module), "forward", None)
    pending = [forward] if isinstance(forward, types.FunctionType) else []
    names: Set[str] = set()
    seen: Set[types.FunctionType] = set()
    try:
        while pending:
            func = function_of(pending.pop())
            if func in seen:
                continue
            seen.add(func)
            found = function_targets(func)
            for callee in found.calls:
                called = _resolved(module, func, callee)
                if called is None or isinstance(called, torch.nn.Module):
                    continue  # a local's (a loop's module), or a module's, whose node is its path
                python = _python_function(called)
                if python is not None and getattr(called, "__self__", None) is module:
                    pending.append(python)  # FX follows a method of the module in place
                elif python is None and str(getattr(called, "__module__", "")).startswith("torch"):
                    # One of torch's: a node. (Not a Python helper, which FX traces into, nor a
                    # builtin: any() runs on Python values, getattr's nodes are refused.)
                    names.add(_fx_name(callee, called))
            names.update(
                base for base, ops in _FX_OPERATORS.items() if any(op in found.operators for op in ops)
            )
    except Exception:  # (a hint only: the error it goes into is what matters)
        pass
    return [prefix + name for name in sorted(names) if _maps(model, prefix + name)]


def _maps(model: torch.nn.Module, name: str) -> bool:
    """Whether the FX node name ``name`` maps to a site of ``model`` (refused names are no hint)."""
    try:
        return _fx_target(model, name) is not None
    except Exception:
        return False


def _split(text: str, model: Optional[torch.nn.Module] = None) -> Tuple[str, str, str, bool]:
    if not isinstance(text, str):
        raise SpecError(f"a target must be a string, got {text!r}")
    text = text.strip()  # '' (as list_targets lists the root): the root's output
    grad = text.endswith(".grad")
    if grad:
        if text[: -len(".grad")].rstrip().endswith(".grad"):
            raise SpecError(f"bad target {text!r}: '.grad' is given twice ('<target>.grad' is its gradient)")
        if ":" not in text:
            raise _bare_path_grad(text[: -len(".grad")])
        text = text[: -len(".grad")]
    parts = [part.strip() for part in text.split(":")]  # ('layer1.0 : forward : out', as run reads it)
    if len(parts) == 1:
        return parts[0], "forward", "", grad
    sliced = _SLICE.match(text)
    if sliced is not None:  # ('blocks[0:2]': its ':' would split the target)
        path = sliced.group(1).strip().rstrip(".")
        child = f"{path}." if path else ""  # (the root's children: '0', not '.0')
        raise SpecError(
            f"bad target {text!r}: a module path takes no slice: name each child ('{child}0') "
            f"or match them with a glob ('{child}*', '{child}[01]')"
        )
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise SpecError(
            f"bad target {text!r}: expected 'module.path:method:target' (e.g. 'layer1.0:forward:out@2') "
            f"or a bare module path (e.g. 'layer1'){_two_parts_meant(parts, model, grad)}"
        )
    return parts[0], parts[1], parts[2], grad


#: A slice written in a module path: ``'blocks[0:2]'``, ``'blocks[1:]:forward:x'``.
_SLICE = re.compile(r"^([^:\[]*)\[\s*-?\d*\s*:\s*-?\d*\s*(?::\s*-?\d*\s*)?\]")


def _two_parts_meant(parts: List[str], model: Optional[torch.nn.Module] = None, grad: bool = False) -> str:
    """For a target of two parts, what it most likely stands for, to end the message with; else
    ''. With the ``model``, a name its module at the path holds is told how to name it; ``grad``:
    the target ended with ``'.grad'``, which the suggestion keeps.

    >>> _two_parts_meant(["layer1.0.forward", "out"]), _two_parts_meant(["layer1", "out@1"])
    ("; did you mean 'layer1.0:forward:out'?", "; did you mean 'layer1:forward:out@1'?")
    >>> _two_parts_meant(["layer1", "forward"])
    "; did you mean 'layer1:forward:return' (what forward returns) or 'layer1' (its output)?"
    >>> _two_parts_meant(["forward", "h"])  # the root's path left out
    "; did you mean ':forward:h'?"
    >>> net = torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.ModuleList([torch.nn.ReLU()]))
    >>> _two_parts_meant(["0", "weight"], net, grad=True)
    "; did you mean '0:forward:self.weight.grad' (the parameter, as forward reads it)?"
    >>> _two_parts_meant(["", "0"], net), _two_parts_meant(["", "1"], net)
    ("; did you mean '0' (its output)?", "; did you mean '1.*' (its submodules' outputs)?")
    """
    if len(parts) != 2 or not all(parts[1:]):
        return ""
    g = ".grad" if grad else ""
    module = _submodule(model, parts[0]) if model is not None else None
    name = parts[1].partition("@")[0].strip()
    kind = _held_by(module, name) if module is not None else None
    child = f"{parts[0]}.{name}" if parts[0] else name
    if kind == "submodule":
        if grad:
            return f"; did you mean '{child}:forward:return.grad' (the gradient of its output)?"
        return f"; did you mean {child!r} (its output)?"
    if kind in ("container", "containers"):  # (of containers only: their children, any depth)
        glob = f"{child}.{'*' if kind == 'container' else '**'}{':forward:return.grad' if grad else ''}"
        return f"; did you mean '{glob}' (its submodules' outputs)?"
    if kind is not None:
        return f"; did you mean '{parts[0]}:forward:self.{parts[1]}{g}' (the {kind}, as forward reads it)?"
    if not parts[0]:
        return ""
    if parts[0] == "forward" or parts[0].startswith("_forward"):  # a method: the root's, path left out
        return f"; did you mean ':{parts[0]}:{parts[1]}{g}'?"
    path, dot, method = parts[0].rpartition(".")
    if dot and method.isidentifier() and "forward" in method:  # a dot where the ':' goes
        return f"; did you mean '{path}:{method}:{parts[1]}{g}'?"
    if parts[1] == "forward" or parts[1].startswith("_forward"):  # the method, without what to record
        returns = f"'{parts[0]}:{parts[1]}:return{g}' (what {parts[1]} returns)"
        return f"; did you mean {returns}{'' if grad else f' or {parts[0]!r} (its output)'}?"
    try:
        parse(parts[1])
    except SpecError:
        return ""
    return f"; did you mean '{parts[0]}:forward:{parts[1]}{g}'?"  # the method left out


def _held_by(module: torch.nn.Module, name: str) -> Optional[str]:
    """What ``module`` holds under ``name``: ``'submodule'``, ``'container'`` (one with no forward
    of its own that holds submodules; ``'containers'``: containers only), ``'parameter'``,
    ``'buffer'``, or the class of another
    module with no forward (a ``ParameterList``); None for nothing, or where its tables are not
    plain dicts (a TorchScript module's).

    >>> _held_by(torch.nn.Linear(1, 1), "weight"), _held_by(torch.nn.Linear(1, 1, bias=False), "bias")
    ('parameter', None)
    """
    tables: List[Dict[str, Any]] = []
    for table in ("_modules", "_parameters", "_buffers"):
        found = getattr(module, table, None)
        if not isinstance(found, dict):
            return None
        tables.append(found)
    held = [table.get(name) for table in tables]
    if isinstance(held[0], torch.nn.Module):
        if has_forward(held[0]):
            return "submodule"
        children = [m for m in held[0]._modules.values() if isinstance(m, torch.nn.Module)]
        if not children:
            return type(held[0]).__name__
        return "container" if any(has_forward(m) for m in children) else "containers"
    return "parameter" if held[1] is not None else "buffer" if held[2] is not None else None


def _bare_path_grad(path: str) -> SpecError:
    """The error for ``'<path>.grad'``: a gradient is a value's, named with its method."""
    return SpecError(
        f"{path + '.grad'!r}: '.grad' follows a target with its method: {path + ':forward:return.grad'!r} "
        "for the gradient of that module's output (e.g. 'layer1.0:forward:out@2.grad' for a local's)"
    )


def _split_in(model: torch.nn.Module, text: str) -> Tuple[str, str, str, bool]:
    """:func:`_split`, where a submodule's own name holds ``':'`` or is ``'grad'`` (a ``ModuleDict``
    key, ``'task:cls'``; torch refuses only dots): the path is the submodule's, as ``list_targets``
    and globs name it (a glob too: ``'heads.task:*'``).

    >>> import torch
    >>> model = torch.nn.ModuleDict({"grad": torch.nn.ReLU(), "a:b": torch.nn.ReLU()})
    >>> _split_in(model, "grad"), _split_in(model, "a:b:forward:return.grad"), _split_in(model, "a:*")
    (('grad', 'forward', '', False), ('a:b', 'forward', 'return', True), ('a:*', 'forward', '', False))
    """
    wide = isinstance(text, str) and full_width_fixed(text, punctuation_only=True) is not None
    if wide and not _names_submodules(model, text.strip()):
        # (an IME's '：' would make one module path of the whole.) A submodule's own name may
        # hold one ('blk（1）', a ModuleDict key): its path is kept, the rest checked. (Looked
        # at only where a full-width character is: matching a glob reads every submodule.)
        path = text.rsplit(":", 2)[0] if text.count(":") >= 2 else ""
        kept = path if path.strip() and _names_submodules(model, path.strip()) else ""
        fixed = full_width_fixed(text[len(kept) :], punctuation_only=True)
        if fixed is not None:
            raise SpecError(f"bad target {text!r}: it has full-width characters: write {kept + fixed!r}")
    if isinstance(text, str) and _SLICE.match(text):
        # ('[0:2]', 'blocks.[1:]': as a glob's character class, it took '0' and '2', or '1', silently)
        if not any(":" in name for name, _ in model.named_modules()):
            return _split(text)
    # Two ':' is a target's form, and a path's with two in its own name ('heads.task:cls:v2'):
    # looked up where the path before the first ':' names no submodule ('heads.task'), or one
    # without that method ('task' beside 'task:cls:v2').
    two_colons = (
        isinstance(text, str)
        and text.count(":") == 2
        and not hasattr(_submodule(model, text.partition(":")[0].strip()), text.split(":")[1].strip())
        and _submodule(model, text.strip()) is not None
    )
    if isinstance(text, str) and ("grad" in text or text.count(":") not in (0, 2) or two_colons):
        stripped = text.strip()
        if _names_submodules(model, stripped):  # a bare path: 'heads.grad', 'heads.a:b', 'heads.a:*'
            return stripped, "forward", "", False
        grad = stripped.endswith(".grad")
        body = stripped[: -len(".grad")] if grad else stripped
        if grad and ":" in body and _names_submodules(model, body):  # 'heads.a:b.grad'
            raise _bare_path_grad(body)
        if body.count(":") > 2:
            path, method, spec_text = body.rsplit(":", 2)
            if method and spec_text and _names_submodules(model, path):
                return path, method, spec_text, grad
        if body.count(":") == 1 and any(":" in name for name, _ in model.named_modules()):
            # Only a path can hold one ':' (a misspelt 'heads.tusk:cls'): say which are there.
            _matching_paths(model, body)
    return _split(text, model)


def _names_submodules(model: torch.nn.Module, path: str) -> bool:
    """Whether ``path`` is a submodule's path, or a glob matching some (``'heads.task:*'``)."""
    if _submodule(model, path) is not None:
        return True
    if not any(ch in path for ch in "*?["):
        return False
    try:
        return bool(_matching_paths(model, path))
    except TargetError:
        return False


#: FX node names of the comparison and unary operators, which are no sites (see Expr).
_FX_UNMAPPED_OPERATORS = {
    "eq": "==",
    "ne": "!=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "neg": "unary -",
    "pos": "unary +",
    "invert": "~",
    "not_": "not",
}

_COMPARISONS = frozenset({"==", "!=", "<", "<=", ">", ">="})

#: FX node names of operators, and the operator symbols they stand for.
_FX_OPERATORS = {
    "add": ("+", "+="),
    "sub": ("-", "-="),
    "mul": ("*", "*="),
    "truediv": ("/", "/="),
    "floordiv": ("//", "//="),
    "matmul": ("@", "@="),
    "pow": ("**", "**="),
    "mod": ("%", "%="),
    "and_": ("&", "&="),
    "or_": ("|", "|="),
    "xor": ("^", "^="),
    "lshift": ("<<", "<<="),
    "rshift": (">>", ">>="),
}

#: C functions that apply operators, or a function they are given, to the values they
#: are given: FX numbers what they do to tensors (``sum``'s adds), which is no site.
#: The FX names each can make; None: any (whatever the function it is given makes).
_APPLYING: Dict[object, Optional[Tuple[str, ...]]] = {
    builtins.sum: ("add",),
    math.prod: ("mul",),
    functools.reduce: None,
    itertools.accumulate: None,
    itertools.starmap: None,
    map: None,
    functools.partial: None,
}


def _applies(called: object, base: str, func: types.FunctionType) -> bool:
    """Whether ``called``, called in ``func``, is a C function that may make FX nodes named
    ``base`` (see _APPLYING): for one that applies the function it is given (``map``),
    where ``func`` loads a function of that name without calling it there
    (``functools.reduce(operator.add, xs)``; a lambda's ops are sites of their own)."""
    try:
        names = _APPLYING[called]
    except Exception:  # not one of them (or unhashable)
        return False
    if names is not None:
        return base in names
    calls = function_targets(func).calls
    called_here = sum(
        len(c.positions)
        for callee, sites in calls.items()
        if callee.rsplit(".", 1)[-1] == base
        for c in sites
    )
    return _loads_of(original_code(func), base) > called_here


def _assigns(module: torch.nn.Module, func: types.FunctionType, name: str, base: str) -> bool:
    """Whether ``func`` assigns to its local ``name`` a function FX names ``base``: a
    global or attribute of that name (``act = F.relu``; ``pool = F.max_pool2d if c
    else F.avg_pool2d``), or an attribute chain holding one (``act = self.act_fn``); or
    may, taking it out of a list, tuple or dict an attribute chain holds (``for act in
    self.acts``, ``f, g = self.pair``: where it loads one that holds such a function)."""
    table = current()
    code = original_code(func)
    items = instructions(code)
    labels = {item: k for k, item in enumerate(items) if isinstance(item, Label)}

    def following(k: int) -> Optional[Instr]:
        return next((item for item in items[k + 1 :] if isinstance(item, Instr)), None)

    def stored_in_name(k: int) -> bool:  # what the instruction at k pushes goes to the local
        after = following(k)
        if after is not None and after.is_uncond_jump() and isinstance(after.arg, Label):
            after = following(labels[after.arg])  # a conditional expression's first branch
        return after is not None and after.name in table.stores and local_name(after.arg) == name

    for k, item in enumerate(items):
        if not isinstance(item, Instr):
            continue
        loaded = table.attr_load(item) or global_name(item)
        if loaded == base and stored_in_name(k):
            return True
    for chain, loads in function_targets(func).attributes.items():
        if any(isinstance(k, int) and stored_in_name(k) for load in loads for k in load.positions):
            held = _resolved(module, func, chain)
            if held is not None and not isinstance(held, torch.nn.Module) and _fx_name(chain, held) == base:
                return True
    for chain in function_targets(func).attributes:
        held = _resolved(module, func, chain)
        kept = list(held.values()) if isinstance(held, dict) else held
        if not isinstance(kept, (list, tuple)):
            continue
        functions = [one for one in kept if callable(one) and not isinstance(one, torch.nn.Module)]
        if any(_fx_name(chain, one) == base for one in functions):
            return True
    return False


def _loads_of(code: types.CodeType, name: str) -> int:
    """How many instructions of ``code`` load ``name`` as a global, builtin or attribute."""
    table = current()
    count = 0
    for item in instructions(code):
        if isinstance(item, Instr):
            loaded = table.attr_load(item) or table.method_load(item) or global_name(item)
            count += loaded == name
    return count


@dataclass
class _FxSite:
    """One site FX would number under the module's name, and what decides if it runs."""

    #: Where it runs: the call positions that lead to it, then its own position.
    order: Tuple[int, ...]
    method: str
    spec: Spec
    label: str
    #: The forward-jump spans around it (tagged by where their code runs): sites with
    #: the same guards run together or not at all.
    guards: frozenset
    #: Whether it is inside a loop (or a comprehension): it may run several times.
    looped: bool = False


@dataclass
class _FxScope:
    """What FX numbers under one module's name for one op: every site that makes such a
    node, in the order they run, and why that order cannot be told (if it cannot)."""

    base: str
    sites: List[_FxSite] = field(default_factory=list)
    #: Why the numbering is not fixed by the code (a loop, a traced-into call...).
    problems: List[str] = field(default_factory=list)
    #: Where a node of the op runs that is no site (``f(x).flatten()``): names of the
    #: sites after it are not fixed; with the forward-jump spans around it (as a site's guards).
    unplaced: List[Tuple[Tuple[int, ...], frozenset]] = field(default_factory=list)
    #: Where a call of a function an expression computes runs (``ACTS[name](x)``): FX names
    #: it as the op it is when traced, which may be this one; placed as :attr:`unplaced`.
    computed: List[Tuple[Tuple[int, ...], frozenset]] = field(default_factory=list)
    #: What else FX makes such nodes of that is no site (``-x`` for ``'neg'``), described.
    unmapped: List[str] = field(default_factory=list)


def _fx_target(model: torch.nn.Module, text: str) -> Optional[Target]:
    """Map a torchvision/FX node name of a functional op (``'flatten'``, ``'layer1.0.add'``,
    ``'add_1'``) to the call or operator site it names, if that is unambiguous.

    FX numbers a module's ops in the order they run, over everything it traces inside
    that module: ``forward``, and the methods of the module it calls
    (``self._forward_impl(x)``), which are followed here in place. Where that order
    is not fixed by the code (a loop, sites on different sides of a branch, a
    comprehension, a call of a Python helper or of ``super()`` with such ops, an
    earlier method call on a call's result), the name is refused, naming the sites to
    use instead.
    """
    parent, _, node = text.rpartition(".")
    # (ASCII digits: '²' is a digit to isdigit, and no number to int)
    numbered = node.rpartition("_")[2]
    suffixed = numbered.isdigit() and numbered.isascii()
    base, _, number = node.rpartition("_") if suffixed else (node, "", "0")
    if text.startswith(".") or (suffixed and number.startswith("0")):
        # No name FX makes: its root's nodes have no leading '.', and it numbers an op's second
        # node '_1', its eleventh '_10' ('add_0', 'add_01' would be read as 'add', 'add_1').
        return None
    occurrence = int(number or 0)
    forward = getattr(type(unwrap(model)), "forward", None)
    if not parent and isinstance(forward, types.FunctionType) and base in _argument_names(forward):
        # FX's placeholder of forward's argument takes the bare name: 'pad' is the input,
        # F.pad's first node 'pad_1'.
        if occurrence == 0:
            return None
        occurrence -= 1
    scope = _fx_scope(model, parent, base)
    if scope is None or not (scope.sites or scope.problems or scope.unplaced):
        return None
    # (once each: a helper method forward calls twice has its sites twice in the order they run)
    labels = ", ".join(dict.fromkeys(f"'{parent}:{site.method}:{site.label}'" for site in scope.sites))
    kind = type(module_at(model, parent)).__name__
    if not scope.sites and scope.problems:  # FX's nodes of that name are all made elsewhere (sum())
        raise TargetError(
            f"{text!r}: {kind} {'; '.join(dict.fromkeys(scope.problems))}, and has no {base!r} site of "
            "its own: record inside a Python function it calls (bcrecord.patch_function), or pick a "
            "target from list_targets"
        )
    if not scope.sites:
        raise TargetError(
            f"{text!r}: {kind} calls .{base}() only on values that are not a name or attribute chain "
            f"(f(x).{base}(...)): FX makes a node of each, but such a call is no site here, so its "
            "result cannot be recorded where it is made; record the value it is called on or the "
            "local its result ends up in (list_targets shows the sites)"
        )
    if scope.unmapped:  # FX numbers those among the calls of that name: their names shift
        raise TargetError(
            f"{text!r}: {kind} has {' and '.join(dict.fromkeys(scope.unmapped))}, of which FX makes "
            f"{base!r} nodes too, numbered with its {base!r} calls, and which bcrecord cannot record: "
            f"which call FX names {node!r} is not known here; name the site instead: {labels}"
        )
    if scope.problems:
        raise TargetError(
            f"{text!r}: {kind} {'; '.join(dict.fromkeys(scope.problems))}, so the order in which FX "
            f"numbers its {base!r} ops is not fixed by the code; name the site instead: {labels}"
        )
    # A call of a function an expression computes may be one of these ops, numbered with them.
    unplaced = scope.unplaced + scope.computed
    what = (
        f"calls .{base}() on a value that is not a name or attribute chain (f(x).{base}()), which "
        "FX numbers too and which is no site"
        if scope.unplaced and (not scope.computed or min(scope.unplaced) < min(scope.computed))
        else "calls a function an expression computes (ACTS[name](x), getattr(F, name)(x), (f if c "
        f"else g)(x)), which FX names as the op it is when traced ({base!r} too, numbered with these) "
        "and which is no site"
    )
    branched = len({site.guards for site in scope.sites}) > 1
    if branched and (unplaced or not _numbered(scope, occurrence)):
        raise TargetError(
            f"{text!r}: {kind} has {len(scope.sites)} {base!r} sites and not all of them run "
            f"together (a branch decides), so which of them FX names {node!r} depends on the "
            f"branch that runs; name the site instead: {labels}"
        )
    if unplaced:
        first = min(order for order, _ in unplaced)
        guards = scope.sites[0].guards  # (the same for every site, as checked above)
        if any(not guards <= around for _, around in unplaced):
            # It may run where the sites do not (the other side of an if): FX's name of
            # it is then the one a site has where they run (timm's LeViT attention).
            raise TargetError(
                f"{text!r}: {kind} {what}, and a branch decides whether it or the sites run, so "
                f"which op FX names {node!r} depends on "
                f"the branch that runs; name the site instead: {labels}"
            )
        if occurrence >= sum(site.order < first for site in scope.sites):
            raise TargetError(
                f"{text!r}: {kind} {what}, so FX's {base!r} names from there on are not fixed; "
                f"name the site instead: {labels}"
            )
    if occurrence >= len(scope.sites):
        again = (
            f"; FX numbers the ops of each run of {parent!r} on (its second run's first {base!r} is "
            f"{base}_{len(scope.sites)}), where each site here records every run: record the site "
            "with bcrecord.torch.record() and take rec.all(key)"
            if parent and _runs_again(model, parent)
            else ""
        )
        raise TargetError(
            f"{text!r}: {kind} has {len(scope.sites)} {base!r} site(s) ({labels}); "
            f"there is no number {occurrence}{again}"
        )
    chosen = scope.sites[occurrence]
    return Target(text, parent, chosen.method, chosen.spec)


def _numbered(scope: _FxScope, occurrence: int) -> bool:
    """Whether the site at ``occurrence`` is FX's op of that number in every run that has
    one, though a branch decides whether some sites run: each earlier site runs wherever it
    does (every jump that may skip one skips it too), and it runs wherever a later one does.
    Models' heads so guard an auxiliary output after the main one (FCN's second
    ``F.interpolate``, under ``if self.aux_classifier``): the first is always ``'interpolate'``.

    >>> site = functools.partial(_FxSite, method="forward", spec=None, label="")
    >>> always, maybe = frozenset(), frozenset({"if"})
    >>> head = _FxScope("interpolate", [site((1,), guards=always), site((5,), guards=maybe)])
    >>> _numbered(head, 0), _numbered(head, 1)
    (True, True)
    >>> # As Conv3d's _conv_forward: where the guarded one is skipped, FX's 'conv3d' is the other
    >>> conv = _FxScope("conv3d", [site((1,), guards=maybe), site((5,), guards=always)])
    >>> _numbered(conv, 0), _numbered(conv, 1)
    (False, False)
    """
    if occurrence >= len(scope.sites):
        return True  # (refused below: no such number)
    guards = scope.sites[occurrence].guards
    return all(site.guards <= guards for site in scope.sites[:occurrence]) and all(
        guards <= site.guards for site in scope.sites[occurrence + 1 :]
    )


def _fx_scope(model: torch.nn.Module, parent: str, base: str) -> Optional[_FxScope]:
    """The sites FX numbers ``base`` ops at under the module at ``parent``, in the order
    they run; None where there is no such module or no Python forward."""
    try:
        module = module_at(model, parent)
    except TargetError:
        return None
    forward = getattr(type(module), "forward", None)
    if not isinstance(forward, types.FunctionType):
        return None
    scope = _FxScope(base)
    # Sites are those of the function inside forward's functools.wraps wrappers (_fx_sites).
    # A wrapper's own ops are not counted: they are mostly on other values (transformers'
    # checkpointing wrapper builds a message with '+'), which FX does not number.
    _fx_sites(module, forward, (), frozenset(), scope, frozenset([forward]))
    scope.sites.sort(key=lambda site: site.order)
    return scope


def fx_name_clash(model: torch.nn.Module, path: str, leaves: Tuple[type, ...] = ()) -> Optional[str]:
    """Why FX may give the node name ``path``, a module path, to another op, or None.

    torchvision names a module's call after its path, unless an op of the same name
    ran before it under the parent module (``torch.relu(x)`` before ``self.relu(x)``):
    the op is then ``'relu'`` and the module's call ``'relu_1'``. It also strips a
    ``_<digits>`` suffix from a torch.nn module's name and numbers the call among the
    ops of the stripped name (ViT's ``ln_1`` is its ``'ln'``, ``ln_2`` its ``'ln_1'``);
    and for a module it traces into that runs more than once, the path names the last
    op of its last run. A module path still means the module's output (at its first
    call) here; this says where torchvision's would differ. ``leaves``: module classes
    its ``tracer_kwargs`` make leaves too (``leaf_modules``).

    >>> import torch
    >>> class Net(torch.nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.relu = torch.nn.ReLU()
    ...     def forward(self, x):
    ...         return self.relu(torch.relu(x) + 1)
    >>> print(fx_name_clash(Net(), "relu"))  # doctest: +ELLIPSIS
    torchvision's node 'relu' may be ':forward:torch.relu()@0', which runs before the module's call...
    """
    parent, _, node = path.rpartition(".")
    scope = _fx_scope(model, parent, node)
    if scope is None:
        return None
    if scope.sites and not _calls_the_module(model, parent, scope.sites[0], node):
        first = scope.sites[0]
        return (
            f"torchvision's node {path!r} may be '{parent}:{first.method}:{first.label}', which runs "
            "before the module's call (torchvision's own name for the module's call then ends in a number)"
        )
    module = module_at(model, path)
    leaf = _fx_leaf(module) or isinstance(module, leaves)
    stem = _fx_stripped(node)
    if stem != node and leaf:
        numbered = _fx_scope(model, parent, stem)
        if numbered is not None and numbered.sites:
            # torchvision's numbers: none for the first, then _1, _2...: never _0 (nor _01).
            number = node.rpartition("_")[2]
            occurrence = len(numbered.sites) if number.startswith("0") else int(number)
            named = numbered.sites[occurrence] if occurrence < len(numbered.sites) else None
            if named is None or not _calls_the_module(model, parent, named, node):
                return (
                    f"torchvision strips the number from the module's name and numbers its call among "
                    f"the {stem!r} ops, so "
                    + (
                        f"its node {path!r} may be '{parent}:{named.method}:{named.label}'"
                        if named is not None
                        else f"it may have no node {path!r}"
                    )
                )
    if not leaf and _runs_again(model, path):
        return (
            f"the module runs more than once in a forward and FX traces into it: torchvision's node "
            f"{path!r} is the last op it traced in the module's last run"
        )
    return None


def _runs_again(model: torch.nn.Module, path: str) -> bool:
    """Whether its parents' forwards may call the module at ``path`` more than once (two call
    sites that are not the two sides of one if/else, or one in a loop), at this path or at
    another it is registered at too (a module shared by the blocks that hold it: CoaT's)."""
    module = module_at(model, path)
    runs: List[_FxSite] = []
    for at, registered in named_modules(model, remove_duplicate=False):
        if registered is module:
            parent, _, node = at.rpartition(".")
            scope = _fx_scope(model, parent, node)
            if scope:
                runs += [site for site in scope.sites if _calls_the_module(model, parent, site, node)]
    if any(site.looped for site in runs):
        return True
    return any(not _either_or(a, b) for a, b in itertools.combinations(runs, 2))


def _either_or(a: _FxSite, b: _FxSite) -> bool:
    """Whether ``a`` and ``b`` are on the two sides of one if/else (only one of them runs):
    a forward jump skips the side of the first, and the jump at that side's end skips
    the second (ShuffleNet's blocks call ``branch2`` so)."""
    first, second = (a, b) if a.order <= b.order else (b, a)
    at = first.order[:-1]
    if at != second.order[:-1]:
        return False
    here, there = first.order[-1], second.order[-1]
    for where, (start, end) in first.guards:
        if where != at or not start < here < end <= there:
            continue
        for other, (jump, label) in second.guards:
            if other == at and here < jump < end and label > there:
                return True
    return False


def _fx_stripped(name: str) -> str:
    """The name torchvision numbers a node under: without a ``_<digits>`` suffix (``ln_1``: ``ln``)."""
    stem, _, number = name.rpartition("_")
    return stem if stem and number.isdigit() and number.isascii() else name


def _fx_wrapped(caller: types.FunctionType, callee: str) -> bool:
    """Whether ``caller`` calls ``callee``, a global name of its module's or a module's function
    (``helpers.scaled``), that ``torch.fx.wrap`` made a leaf function of in that module: FX
    makes one node of such a call and numbers nothing inside it (swin_v2's
    ``_get_relative_position_bias``).

    >>> _fx_wrapped(_fx_wrapped, "len"), _fx_wrapped(_fx_wrapped, "torch.relu")
    (False, False)
    """
    # fx.wrap(name) registers (id of the module's globals, name): FX swaps that global for
    # its tracing wrapper while it traces (a private table of torch.fx's: none, if renamed).
    wrapped = getattr(getattr(torch.fx, "_symbolic_trace", None), "_wrapped_fns_to_patch", {})
    if not wrapped:
        return False
    owner, _, name = callee.rpartition(".")
    if not owner:
        return (id(caller.__globals__), name) in wrapped
    held: Any = caller.__globals__.get(owner.split(".")[0])
    for part in owner.split(".")[1:]:
        held = getattr(held, part, None)
    return isinstance(held, types.ModuleType) and (id(vars(held)), name) in wrapped


def _fx_leaf(module: torch.nn.Module) -> bool:
    """Whether torchvision's FX tracer makes one node of a call of ``module`` rather than
    tracing into its forward: torch.nn's own modules but ``Sequential`` (FX's default),
    and an instance of any module class ``torchvision.ops`` exports (its extractor's
    ``leaf_modules``: Swin's ``StochasticDepth``, ``SqueezeExcitation``, ``Conv2dNormActivation``).

    >>> _fx_leaf(torch.nn.ReLU()), _fx_leaf(torch.nn.Sequential())
    (True, False)
    """
    ops = sys.modules.get("torchvision.ops")  # (not imported here: a model of its modules has)
    if ops is not None and isinstance(module, _torchvision_leaves(ops)):
        return True
    where = type(module).__module__ or ""
    return where.startswith(("torch.nn", "torch.ao.nn")) and not isinstance(module, torch.nn.Sequential)


@functools.cache
def _torchvision_leaves(ops: types.ModuleType) -> Tuple[type, ...]:
    """The module classes ``torchvision.ops`` exports, as its extractor lists its leaves."""
    return tuple(
        kind for kind in vars(ops).values() if isinstance(kind, type) and issubclass(kind, torch.nn.Module)
    )


def _calls_the_module(model: torch.nn.Module, parent: str, site: _FxSite, node: str) -> bool:
    """Whether ``site`` calls the submodule ``node`` of the module at ``parent``: through
    the method's first argument (``self.relu()``; ``s.relu()`` where it is named ``s``), by
    its name or another attribute holding it (``self.act = self.relu``, or a partial of it)."""
    root, _, rest = site.spec.target.partition(".") if isinstance(site.spec, Call) else ("", "", "")
    owner = module_at(model, parent)
    method = getattr(type(owner), site.method, None)
    try:
        code = original_code(function_of(method))
    except NotPatchableError:
        return False
    if not (code.co_argcount > 0 and code.co_varnames[0] == root):
        return False
    if rest == node:
        return True
    held = owner._modules.get(rest, vars(owner).get(rest)) if rest.isidentifier() else None
    while isinstance(held, functools.partial):
        held = held.func
    return held is not None and held is owner._modules.get(node)


def _fx_sites(
    module: torch.nn.Module,
    func: types.FunctionType,
    at: Tuple[int, ...],
    guards: frozenset,
    scope: _FxScope,
    seen: frozenset,
) -> None:
    """Add ``func``'s sites of ``scope.base``: ``func`` runs at call positions ``at``,
    inside the forward-jump spans ``guards``, inside the methods ``seen``."""
    # Inside functools.wraps wrappers, as the sites are: spans, loads and names of that code.
    func = function_of(func)
    base, method = scope.base, func.__name__
    found = function_targets(func)
    spans, jumps = _jump_spans(original_code(func))

    def guarded(position: int) -> frozenset:
        return guards | {(at, span) for span in jumps if span[0] < position < span[1]}

    me = _first_argument(func)  # 'self', as the method names it
    placed: List[Tuple[object, Spec, str]] = []
    for callee, calls in found.calls.items():
        called = _resolved(module, func, callee)
        if called is None and "." not in callee and _assigns(module, func, callee, base):
            # act = F.relu; act(x): FX sees the function when it runs, and names it.
            scope.problems.append(
                f"calls {callee}, a local it assigns {base!r} to (FX names that call {base!r} too)"
            )
            continue
        while isinstance(called, functools.partial):  # (a partial of a module calls the module)
            called = called.func
        if isinstance(called, torch.nn.Module):
            # A module call is a node under the module's own path: one of ours only for
            # a child named base (self.relu), not for a grandchild (self.inner.relu); and
            # for a child torchvision strips to base (a call of torch.nn's self.ln_1: 'ln').
            # The child's path is the name it was first registered under, whatever attribute
            # the call reads it through (self.act = self.relu: 'relu').
            owner, _, child = callee.partition(".")
            if owner == me and "." not in child:
                child = next((name for name, held in module.named_children() if held is called), child)
            if (owner == me and child == base) or (
                owner == me and _fx_stripped(child) == base and _fx_leaf(called)
            ):
                placed += [(c.positions[0], Call(callee, c.index), f"{callee}()@{c.index}") for c in calls]
            continue
        if _applies(called, base, func):
            scope.problems.append(
                f"calls {callee}, whose {base!r} ops on tensors (made in C: no site) FX numbers too"
            )
            continue
        if _held_tensor(called):
            continue  # FX runs it on the tensor itself (it proxies parameters only): no node
        if _fx_name(callee, called) == base:
            placed += [(c.positions[0], Call(callee, c.index), f"{callee}()@{c.index}") for c in calls]
        if _fx_wrapped(func, callee):
            continue  # one node, named above: nothing inside it numbered
        python = _python_function(called)
        if python is None:
            continue  # a tensor's method, a builtin, a class, or one of torch's functions
        if getattr(called, "__self__", None) is module and callee == f"{me}.{python.__name__}":
            # A method of the module: FX follows it in place, numbering its ops as forward's.
            position = calls[0].positions[0]
            inlined = _FxScope(base)
            if python in seen:  # recursion
                inlined.problems += [f"calls {callee} from itself"] if _has_fx_sites(python, base) else []
            elif isinstance(position, int):
                _fx_sites(module, python, at + (position,), guarded(position), inlined, seen | {python})
            scope.unmapped += inlined.unmapped
            scope.computed += inlined.computed
            if not inlined.sites and not inlined.problems and not inlined.unplaced:
                continue
            if len(calls) > 1 or len(calls[0].positions) > 1:
                scope.problems.append(f"runs {callee} more than once")
            elif not isinstance(position, int):
                scope.problems.append(f"calls {callee} inside a comprehension or an inner function")
            elif _within(position, spans):
                scope.problems.append(f"calls {callee} in a loop")
            scope.sites += inlined.sites
            scope.problems += inlined.problems
            scope.unplaced += inlined.unplaced
        elif _has_fx_sites(python, base):
            scope.problems.append(
                f"calls {callee}, a Python function FX traces into, which has {base!r} ops "
                "(itself or in what it calls)"
            )
    code = original_code(func)
    for inner in code.co_consts:  # a lambda or inner def: FX traces into it where it is called
        if isinstance(inner, types.CodeType) and inner.co_name not in current().separate_comprehensions:
            if _names_base(function_targets(inner), base):
                scope.problems.append(f"defines {inner.co_name}, an inner function with {base!r} ops")
    # A method with such ops that runs other than as self.m(...), which is followed above
    # (f = self.m; f(x), getattr(self, 'm'), me = self; me.m(x)): FX traces into it there.
    followed = {callee.partition(".")[2] for callee in found.calls if callee.partition(".")[0] == me}
    named = set(code.co_names) | {c for c in code.co_consts if isinstance(c, str) and c.isidentifier()}
    for name in sorted(named - followed - {func.__name__}):
        helper = inspect.getattr_static(type(module), name, None)
        if isinstance(helper, types.FunctionType) and _has_fx_sites(helper, base):
            scope.problems.append(f"refers to {name}, a method with {base!r} ops, other than by calling it")
    for chain, getter in _properties_read(module, found.attributes, me):
        if _has_fx_sites(getter, base):
            scope.problems.append(
                f"reads {chain}, a property whose code FX traces into, which has {base!r} ops"
            )
    if "super" in original_code(func).co_names and any(
        _has_fx_sites(inherited, base)
        for kind in type(module).__mro__[1:]
        for name in original_code(func).co_names
        for inherited in [vars(kind).get(name)]
        if isinstance(inherited, types.FunctionType)
    ):
        scope.problems.append("calls a method through super(), which FX traces into")
    for op in _FX_OPERATORS.get(base, ()):
        placed += [
            (o.positions[0], Expr(op, o.index), f"{op}@{o.index}") for o in found.operators.get(op, ())
        ]
    scope.unplaced += [
        (at + (position,), guarded(position)) for position in _unchained_loads(original_code(func), base)
    ]
    scope.computed += [
        (at + (position,), guarded(position)) for position in computed_callee_calls(original_code(func))
    ]
    unmapped = _unmapped_nodes(original_code(func), base, me)
    if unmapped:
        scope.unmapped.append(unmapped)
    for where, spec, label in placed:
        if not isinstance(where, int):  # in a nested code object: a comprehension's loop
            scope.sites.append(_FxSite(at + _flat(where), method, spec, label, guards, looped=True))
            scope.problems.append(f"runs {base!r} inside a comprehension or an inner function")
            continue
        looped = _within(where, spans)
        scope.sites.append(_FxSite(at + (where,), method, spec, label, guarded(where), looped))
        if looped:
            # FX numbers each execution ('add_1': the loop's second turn); a site is every turn.
            scope.problems.append(f"runs {base!r} in a loop (FX numbers each turn)")


def _fx_tensor_node(model: torch.nn.Module, name: str) -> Optional[Tuple[str, Optional[str]]]:
    """For FX's node of a parameter or buffer (``blk.blk_scale``: the module's path, then
    the tensor's path with ``_`` for ``.``), the tensor's path and a target reading it:
    in the first method of its module that loads it, of those its ``forward`` runs
    (``forward``, then the methods it calls, breadth first); None if none does."""
    root = unwrap(model)
    reader, _, node = name.rpartition(".")  # torchvision prefixes the module whose code reads it
    for path, _ in [*root.named_parameters(), *root.named_buffers()]:
        if path.replace(".", "_") != node:
            continue
        owner, _, attribute = path.rpartition(".")
        places = [(owner, attribute)]
        if reader != owner and (not reader or path.startswith(reader + ".")):
            places.insert(0, (reader, path[len(reader) + 1 :] if reader else path))
        above = owner
        while above:  # ('m.inner.w', inner a plain holder: m's forward reads self.inner.w)
            above = above.rpartition(".")[0]
            if above != reader:
                places.append((above, path[len(above) + 1 :] if above else path))
        for module, chain in places:
            try:
                kind = type(root.get_submodule(module))
            except AttributeError:
                continue
            for method, func in _methods_forward_runs(kind):
                me = _first_argument(function_of(func))  # ('s' in def forward(s, x))
                if me and f"{me}.{chain}" in function_targets(function_of(func)).attributes:
                    return path, f"{module}:{method}:{me}.{chain}@0"
        return path, None
    return None


def _methods_forward_runs(kind: type) -> List[Tuple[str, types.FunctionType]]:
    """``forward`` of the class ``kind`` and the methods it calls (``self.m(...)``), breadth first."""
    found: List[Tuple[str, types.FunctionType]] = []
    queue, seen = ["forward"], set()
    while queue:
        method = queue.pop(0)
        func = inspect.getattr_static(kind, method, None)
        if method in seen or not isinstance(func, types.FunctionType):
            continue
        seen.add(method)
        found.append((method, func))
        for callee in function_targets(function_of(func)).calls:
            owner, _, rest = callee.partition(".")
            if owner == "self" and rest and "." not in rest:
                queue.append(rest)
    return found


def _held_tensor(called: object) -> bool:
    """Whether ``called`` is a method of a tensor that is not a parameter (a buffer:
    ``self.index.view``): FX's tracer proxies parameters only, so such a call runs on
    the tensor while it traces and makes no node, though it is a site here."""
    held = getattr(called, "__self__", None)
    return isinstance(held, torch.Tensor) and not isinstance(held, torch.nn.Parameter)


def _flat(position: object) -> Tuple[int, ...]:
    """A site's position (``(outer, inner)`` in nested code) as a sortable key."""
    if isinstance(position, int):
        return (position,)
    assert isinstance(position, tuple)
    return _flat(position[0]) + _flat(position[1])


def _first_argument(func: types.FunctionType) -> str:
    """The name ``func`` gives its instance (``self``, mostly); '' if it takes none."""
    code = func.__code__  # (probes change no argument: no need to look up the original)
    return code.co_varnames[0] if code.co_argcount else ""


def _fx_name(callee: str, called: object) -> str:
    """The name FX gives a call of ``callee`` (``called``, resolved): a torch function's own
    name (``self.gate = torch.sigmoid``: ``'sigmoid'``; a partial's of one, the function's:
    ``self.act = partial(F.gelu, approximate='tanh')``, ``'gelu'``), else the callee's last name."""
    while isinstance(called, functools.partial):
        called = called.func
    name = getattr(called, "__name__", None)
    if (
        called is None
        or isinstance(called, type)
        or _python_function(called) is not None
        or not isinstance(name, str)
        or not name.isidentifier()
    ):
        return callee.rsplit(".", 1)[-1]
    return name


def _names_base(found: Any, base: str) -> bool:
    """Whether ``found`` (a code object's targets) has call or operator sites FX names ``base``."""
    return any(callee.rsplit(".", 1)[-1] == base for callee in found.calls) or any(
        op in found.operators for op in _FX_OPERATORS.get(base, ())
    )


def _resolved(module: Optional[torch.nn.Module], func: types.FunctionType, chain: str) -> object:
    """What the callee ``chain`` of ``func`` (run on ``module``) is now; None for a local's."""
    root, *names = chain.split(".")
    code = original_code(func)
    if root == _first_argument(func) and module is not None:
        found: object = module
    elif root in func.__code__.co_freevars and func.__closure__:  # a closure's: its value now
        try:
            found = func.__closure__[func.__code__.co_freevars.index(root)].cell_contents
        except ValueError:  # an empty cell
            return None
    elif root in code.co_varnames or root in code.co_cellvars or root in code.co_freevars:
        return None  # a local or an argument (a global of that name is another object)
    elif root in func.__globals__:
        found = func.__globals__[root]
    elif hasattr(builtins, root):
        found = getattr(builtins, root)
    else:
        return None  # not defined yet
    for name in names:
        if isinstance(inspect.getattr_static(found, name, None), (property, functools.cached_property)):
            # Not run to see what it returns: a parametrized tensor's getter runs the
            # parametrization (spectral_norm's power iteration would advance its buffers).
            return None
        try:
            found = getattr(found, name)
        except Exception:  # an attribute set later, a property that fails: nothing to follow
            return None
    return found


def _properties_read(
    module: torch.nn.Module, chains: Iterable[str], me: str = "self"
) -> List[Tuple[str, types.FunctionType]]:
    """The properties with Python getters that the attribute ``chains`` (``'self.a.b'``, the
    instance named ``me`` in them) read, as ``(chain up to the property, getter)``: FX runs
    and traces them.

    Found statically, without running any getter; submodules are followed through
    their module's table of them.
    """
    found: Dict[str, types.FunctionType] = {}
    for chain in chains:
        root, *names = chain.split(".")
        if root != me:
            continue
        owner: object = module
        for depth, name in enumerate(names, 1):
            static = inspect.getattr_static(owner, name, None)
            if isinstance(static, (property, functools.cached_property)):
                getter = static.fget if isinstance(static, property) else static.func
                if isinstance(getter, types.FunctionType):
                    found.setdefault(".".join([me, *names[:depth]]), getter)
                break  # what a getter returns is not known without running it
            if static is None and isinstance(owner, torch.nn.Module):
                static = owner._modules.get(name)
            if static is None:
                break
            owner = static
    return list(found.items())


def _python_function(called: object) -> Optional[types.FunctionType]:
    """The Python code FX traces into when ``called`` is called, if any.

    None for builtins, classes, tensors' methods and torch's own functions
    (``F.relu``: one node each); a partial's function, a method's function and a
    callable object's ``__call__`` otherwise.
    """
    while isinstance(called, functools.partial):
        called = called.func
    inner = getattr(called, "__func__", called)
    if not isinstance(inner, types.FunctionType):
        call = inspect.getattr_static(type(called), "__call__", None)
        if isinstance(called, type) or not isinstance(call, types.FunctionType):
            return None
        return call  # an object with a Python __call__
    if getattr(called, "__self__", None) is None and (inner.__module__ or "").partition(".")[0] == "torch":
        return None
    return inner


def _has_fx_sites(func: types.FunctionType, base: str, depth: int = 4) -> bool:
    """Whether a Python function FX traces into has calls or operators FX would name
    ``base``, itself or in the Python functions it calls (``depth`` levels down)."""
    try:
        func = function_of(func)  # the code its sites are in (inside wrappers)
        found = function_targets(func)
    except Exception:  # no code to read (a C function reached through Python)
        return False
    if _names_base(found, base):
        return True
    if any(_applies(_resolved(None, func, callee), base, func) for callee in found.calls):
        return True
    if _unchained_loads(original_code(func), base):
        return True
    if depth == 0:
        return False
    for callee in found.calls:
        inner = None if _fx_wrapped(func, callee) else _python_function(_resolved(None, func, callee))
        if inner is not None and inner is not func and _has_fx_sites(inner, base, depth - 1):
            return True
    return False


def _unmapped_nodes(code: types.CodeType, base: str, me: Optional[str]) -> Optional[str]:
    """What in ``code`` FX makes ``base`` nodes of that are no call or operator sites,
    described (``'a comparison (>)'``), or None: comparisons and unary operators,
    item reads (``getitem``), and attribute reads from a value other than ``me`` or a
    global's chain (``x.shape``: ``getattr``)."""
    symbol = _FX_UNMAPPED_OPERATORS.get(base)
    if symbol is None and base not in ("getitem", "getattr"):
        return None  # (most names: nothing to look for)
    table = current()
    root = ""  # what the attribute chain being read starts at: me, a global, or another value
    for item in instructions(code):
        if not isinstance(item, Instr):
            continue
        op = table.value_op(item)
        if op is not None and op == symbol:
            return f"a {'comparison' if op in _COMPARISONS else 'unary operator'} ({op})"
        if base == "getitem" and op == "[]":
            return "an item read or unpacking (x[i], a, b = x)"
        if base == "getattr" and table.attr_load(item) and root == "value":
            return f"an attribute read from a value (.{table.attr_load(item)})"
        if item.name in table.local_loads:
            root = "me" if local_name(item.arg) == me else "value"
        elif item.name in table.global_loads:
            root = "global"
        elif not (table.attr_load(item) or table.method_load(item)):
            root = "value"
    return None


def _unchained_loads(code: types.CodeType, base: str) -> List[int]:
    """Positions of loads of an attribute named ``base`` from a value that is not a name
    or an attribute chain (``f(x).flatten``): calls FX numbers that are no sites."""
    table = current()
    items = instructions(code)
    found = []
    previous: Optional[Instr] = None
    for position, item in enumerate(items):
        if not isinstance(item, Instr):
            continue
        if (table.attr_load(item) or table.method_load(item)) == base and not (
            previous is not None
            and (
                previous.name in table.local_loads
                or previous.name in table.global_loads
                or table.attr_load(previous)
                or table.method_load(previous)
            )
        ):
            found.append(position)
        previous = item
    return found


def _within(position: int, spans: List[Tuple[int, int]]) -> bool:
    return any(start < position < end for start, end in spans)


def _jump_spans(code: types.CodeType) -> Tuple[List[Tuple[int, int]], List[Tuple[int, int]]]:
    """The loops of ``code`` (``for``, ``while``: from the label a jump goes back to,
    through that jump), and what a forward jump may skip (an ``if``'s body, its
    ``else``, the right of ``and``: from the jump to its label) or a ``return`` does
    (all that follows it: in a method FX traces into, an early return skips the rest
    of the method, not what its caller runs after it); spans of positions in
    ``instructions(code)``.

    >>> def f(xs, c):
    ...     total = 0
    ...     for x in xs:
    ...         total += x
    ...     if c:
    ...         total = -total
    ...     return total
    >>> loops, skips = _jump_spans(f.__code__)
    >>> len(loops), len(skips) >= 1, _jump_spans(has_forward.__code__)[0]
    (1, True, [])
    """
    items = instructions(code)
    labels = {item: k for k, item in enumerate(items) if isinstance(item, Label)}
    table = current()
    returns = {table.return_value, table.return_const}
    loops, skips = [], []
    for k, item in enumerate(items):
        if isinstance(item, Instr) and item.name in returns:
            skips.append((k, len(items)))
        elif isinstance(item, Instr) and (label := table.jump_target(item)) is not None:
            # (not 3.14's END_ASYNC_FOR: its label is for monitoring, it goes on to what follows)
            target = labels[label]
            if target <= k:
                loops.append((target, k))
            else:
                skips.append((k, target))
    return loops, skips


def _matching_paths(model: torch.nn.Module, pattern: str) -> List[str]:
    found = _found.get()
    if found is None or found.model is not model:
        return _match(model, pattern)
    if pattern not in found.matches:  # (an error is raised again each time: it is not kept)
        found.matches[pattern] = _match(model, pattern)
    return list(found.matches[pattern])


def _match(model: torch.nn.Module, pattern: str) -> List[str]:
    """:func:`_matching_paths`'s matching, over every module path."""
    if not any(ch in pattern for ch in "*?[") or _submodule(model, pattern) is not None:
        module_at(model, pattern)  # raises a clear error if missing
        return [pattern]  # (also a name with a glob's characters in it: 'blk[0]')
    wanted = pattern.split(".")
    # (Without a '**', only a path of as many parts can match: the others are not split.)
    dots = -1 if "**" in wanted else len(wanted) - 1
    roots = _glob_roots(model)
    # A compiled submodule's children at its path ('1.*': '1.0'), else as named_modules()
    # names them, under torch.compile's wrapper ('1._orig_mod.*').
    for root, raw in itertools.product(roots, (False, True)):
        found = [
            name
            for name, _ in (root.named_modules() if raw else named_modules(root))
            if name and (dots < 0 or name.count(".") == dots) and _parts_match(name.split("."), wanted)
        ]
        if found:
            return found
    dotted = _dotted_for_subscripts(model, pattern)
    if dotted is not None and _names_submodules(model, dotted):
        raise TargetError(
            f"no submodule matches {pattern!r}: a child (a Sequential's, a ModuleList's, a ModuleDict's) "
            f"is named with a dot, not indexed: {dotted!r}"
        )
    raise TargetError(f"no submodule matches {pattern!r}{_misspelt_part(model, wanted)}")


def _parts_match(parts: List[str], wanted: List[str]) -> bool:
    """Whether a module path's parts match a glob's, each with ``fnmatch``; a part that is
    exactly ``'**'`` matches any number of whole parts, none too (``'a**'`` is one part's).

    >>> _parts_match(["attn"], ["**", "attn"]), _parts_match(["blocks", "0", "attn"], ["**", "attn"])
    (True, True)
    >>> _parts_match(["blocks", "0", "attn"], ["*", "attn"]), _parts_match(["a", "b"], ["a**"])
    (False, False)
    """
    if "**" not in wanted:  # (part by part: record(resnet50, ['layer*.*']) set-up 15% slower otherwise)
        return len(parts) == len(wanted) and all(map(fnmatch.fnmatchcase, parts, wanted))
    # The glob's positions reachable after each part, one pass (trying each split of every
    # '**' took time exponential in their number).
    ends = len(wanted)

    def closure(positions: Set[int]) -> Set[int]:  # a '**' may match no part: step over it
        pending = list(positions)
        while pending:
            at = pending.pop()
            if at < ends and wanted[at] == "**" and at + 1 not in positions:
                positions.add(at + 1)
                pending.append(at + 1)
        return positions

    positions = closure({0})
    for part in parts:
        positions = closure(
            {
                at if wanted[at] == "**" else at + 1
                for at in positions
                if at < ends and (wanted[at] == "**" or fnmatch.fnmatchcase(part, wanted[at]))
            }
        )
        if not positions:
            return False
    return ends in positions


#: An index or a key written as Python indexes a container: ``[3]``, ``[-1]``, ``['a']``.
_SUBSCRIPT = re.compile(r"\[\s*(-?\d+|\*|'[^'\[\]]*'|\"[^\"\[\]]*\")\s*\]")


def _dotted_for_subscripts(model: torch.nn.Module, pattern: str) -> Optional[str]:
    """``pattern`` with its subscripts written as a path's names (``'blocks[3]'``: ``'blocks.3'``,
    ``"heads['a']"``: ``'heads.a'``, ``'blocks[-1]'``: the last child's), or None where it has none.

    >>> model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    >>> [_dotted_for_subscripts(model, text) for text in ("0[-1]", "[0]['1']", "0[*]", "0")]
    ['0.1', '0.1', '0.*', None]
    """
    dotted, end = "", 0
    for subscript in _SUBSCRIPT.finditer(pattern):
        parent = (dotted + pattern[end : subscript.start()]).rstrip(".")
        key = subscript.group(1)
        if key[0] in "'\"":
            key = key[1:-1]
        elif key.startswith("-"):  # counted from the end of the children there
            module = _submodule(model, parent)
            children = [] if module is None else list(module._modules)
            if int(key) < -len(children):
                return None
            key = children[int(key)]
        dotted, end = f"{parent}.{key}" if parent else key, subscript.end()
    return None if not end else dotted + pattern[end:]


def _glob_roots(model: torch.nn.Module) -> List[torch.nn.Module]:
    """Where a glob's paths start: the model inside a wrapper first (``'*'`` is its children,
    not DataParallel's ``'module'``), then the wrapper (``'module.*'`` still matches through it)."""
    inner = unwrap(model)
    return [model] if inner is model else [inner, model]


def _misspelt_part(model: torch.nn.Module, wanted: List[str]) -> str:
    """``" ('block' names no submodule there; did you mean 'blocks'?)"`` for the first part
    of a glob that no submodule path matches there, or ``''``; a part after a ``'*'`` too
    (``'layer*.0.con1'``: the blocks the glob reached have ``'conv1'``), not after a ``'**'``.
    """
    # (Both as a glob matches them: seen through a block compiled in place, and naming its wrapper.)
    paths = [
        name.split(".")
        for root in _glob_roots(model)
        for listed in (named_modules(root), root.named_modules())
        for name, _ in listed
        if name
    ]
    for depth, part in enumerate(wanted):
        if part == "**":
            break
        reached = [path for path in paths if len(path) > depth and _parts_match(path[:depth], wanted[:depth])]
        if not any(_parts_match(path[: depth + 1], wanted[: depth + 1]) for path in reached):
            here = list(dict.fromkeys(path[depth] for path in reached))
            if not any(ch in part for ch in "*?["):
                return f" ({part!r} names no submodule there{did_you_mean(part, here, hide_private=False)})"
            if _SUBSCRIPT.search(part):  # ('stages[7]': an index meant, whose child is not there)
                return ""
            more = f" and {len(here) - 8} more" if len(here) > 8 else ""
            names = f"; there: {', '.join(map(repr, here[:8]))}{more}" if here else ""
            return f" ({part!r} matches no submodule there{names})"
    return ""


def expand(model: torch.nn.Module, text: str) -> List[Target]:
    """The concrete targets a target string stands for in ``model``, or a clear error.

    >>> import torch
    >>> from bcrecord.torch import expand
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    >>> [(t.path, t.method, t.output) for t in expand(model, "*:forward:return")]
    [('0', 'forward', False), ('1', 'forward', False)]
    >>> [(t.path, t.output) for t in expand(model, "1")]  # a bare path: the module's output
    [('1', True)]

    A glob matches a path part by part (``'*'``: one part); a part that is exactly ``'**'``
    matches any number of parts, none too, as in pathlib's globs:

    >>> nested = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(torch.nn.ReLU()))
    >>> [t.path for t in expand(nested, "*")], [t.path for t in expand(nested, "**.0")]
    (['0', '1'], ['0', '1.0'])
    """
    require_module(model)
    pattern, method, spec_text, grad = _split_in(model, text)
    method = compiled_name(method)  # as the source has it: the class holds 'fiwd' for 'def \ufb01wd'
    if not spec_text and not any(ch in pattern for ch in "*?["):
        # Not a module: a functional op's FX node name? (Asked before module_at's error is
        # made: its "did you mean" compares the name with every module path, 0.1 s on a big
        # model, for each of an extractor's op names.)
        if _submodule(model, pattern) is None:
            mapped = _fx_target(model, pattern)
            if mapped is not None:
                return [mapped]
            tensors = dict(unwrap(model).named_parameters()) | dict(unwrap(model).named_buffers())
            # A tensor's path, as state_dict names it ('head.weight'; a root's 'w' is FX's node too: below).
            if "." in pattern and pattern in tensors:
                kind = "parameter" if isinstance(tensors[pattern], torch.nn.Parameter) else "buffer"
                owner_path, _, name = pattern.rpartition(".")
                owner = _submodule(model, owner_path)
                if owner is not None and has_forward(owner) and name.isidentifier():
                    # (its first argument's name: 'self', or what the class calls it)
                    names = getattr(getattr(type(owner).forward, "__code__", None), "co_varnames", ("self",))
                    at_entry = f"{owner_path}:forward:{names[0] if names else 'self'}.{name}"
                    where = f"its value as its module's forward starts is {at_entry!r}"
                else:  # (a ParameterList's '0'): where a method reads it
                    read = _fx_tensor_node(model, pattern.replace(".", "_"))
                    where = (
                        f"record it where a method reads it: {read[1]!r}"
                        if read and read[1]
                        else ("no method its module's forward runs reads it: record a value made from it")
                    )
                raise TargetError(f"{pattern!r} is a {kind}, not a submodule: {where}")
            missing = _no_submodule(model, pattern)
            parent, _, node = pattern.rpartition(".")
            parent_module = _submodule(model, parent)
            # ('', a Sequential's index, a leading '.'): no FX name
            if parent_module is None or not node or node.isdigit() or pattern.startswith("."):
                raise missing from None
            owner = type(parent_module).__name__
            tensor = _fx_tensor_node(model, pattern)
            if tensor is not None:
                where = (
                    f"record it where a method reads it: {tensor[1]!r}"
                    if tensor[1]
                    else f"no method its module's forward runs reads self.{tensor[0].rpartition('.')[2]} "
                    "(a property or a helper may), so no target reads it: record a value made from it"
                )
                raise TargetError(
                    f"{pattern!r} is FX's node for the tensor {tensor[0]!r}, not an output; {where}"
                )
            forward = getattr(type(unwrap(model)), "forward", None)
            if not parent and isinstance(forward, types.FunctionType) and node in _argument_names(forward):
                raise TargetError(
                    f"{pattern!r} is an argument of {type(unwrap(model)).__name__}.forward (FX's placeholder "
                    "node: the input as given), not a value the model computes: use the input itself"
                )
            joined = f"{missing} Nor" if str(missing).endswith("?") else f"{missing}; nor"
            if _fx_stripped(node) in _FX_UNMAPPED_OPERATORS:
                raise TargetError(
                    f"{joined} is {node!r} a site bcrecord records: FX's node for a comparison or "
                    f"a unary operator ({_FX_UNMAPPED_OPERATORS[_fx_stripped(node)]}) in "
                    f"{owner}.forward; bcrecord records binary arithmetic operators only: record "
                    "the value it is applied to, or a call or local its result goes to"
                )
            raise TargetError(
                f"{joined} is {node!r} an FX name of a call or operator site of {owner}.forward "
                "that bcrecord can map (FX's getattr, getitem and size nodes, and ops inside Python "
                "helpers it traces into, have none): pick a target from list_targets"
            )
    spec = parse(spec_text) if spec_text else Return()
    is_glob = any(ch in pattern for ch in "*?[")
    targets = []
    checked: Dict[Tuple[type, str], Any] = {}
    for path in _matching_paths(model, pattern):
        module = module_at(model, path)
        if isinstance(module, torch.jit.ScriptModule):
            if is_glob:
                continue  # as list_targets leaves it out: a glob takes what can be recorded
            raise NotPatchableError(scripted(module, path))
        runs = _method_that_runs(module, method, path)
        where = f"{type(module).__name__} at {path or '<root>'!r}"
        if runs is None and method == "forward" and not has_forward(module):
            raise NotPatchableError(
                f"{where} runs a forward set on the instance, not a method of its class; "
                "record inside what it calls, or patch that function with bcrecord.patch_function"
            )
        if (runs is None or (runs != method and spec_text)) and _warn.get():
            instead = "" if runs is None else f" (it runs {runs}: its targets are '{path}:{runs}:...')"
            if runs is None:
                instead = f" (it is {callable_name(module.__dict__.get(method))})"
            if runs is None and not spec_text:
                caller = (
                    f"record where the caller takes it ('{path.rpartition('.')[0]}:forward:<local>', "
                    "as list_targets lists them)"
                    if path
                    else "take what model(...) returns"
                )
                instead += (
                    f"; the path records {type(module).__name__}.{method}'s return, not what that "
                    f"returns to its caller (accelerate's hooks' post_forward may change it): for that "
                    f"value, {caller}"
                )
            warn(
                f"bcrecord: {where} has its own {method} attribute; {type(module).__name__}.{method} "
                f"records only if that calls it{instead}"
            )
        # A bare path is the module's output: what the method that runs returns.
        runs = method if runs is None or spec_text else runs
        if not has_forward(module) and runs == "forward":
            if is_glob:
                continue  # a container (ModuleList, ModuleDict) among the matches: it never runs
            children = [name for name, _ in module.named_children()]
            if not children:  # (a ParameterList: parameters, no modules; or an empty container)
                raise TargetError(
                    f"{where} has no forward of its own and holds no submodules: record where what "
                    "it holds is used, in the module that reads it"
                )
            first = f"{path}.{children[0]}" if path else children[0]
            every = f"{path}.*" if path else "*"
            raise TargetError(
                f"{where} has no forward of its own (a container): target its submodules "
                f"({first!r}, {every!r})"
            )
        # (Checked once per class: 16 Bottlenecks' were a tenth of a whole-resnet set-up.)
        func = checked.get((type(module), runs), _UNCHECKED)
        if func is _UNCHECKED:
            func = checked[type(module), runs] = _method_recorded(
                type(module), runs, where, path, spec, spec_text, is_glob
            )
        if func is None:
            continue
        if isinstance(spec, Attribute) and spec.at == "entry":
            _refuse_parametrized_read(module, func, spec, where, grad)
        concrete = f"{path}:{runs}:{spec_text}" if spec_text else path
        given = text.strip().removesuffix(".grad") if grad else text.strip()  # (a module named 'grad')
        if spec_text:  # 'layer1.0 : forward : out' is keyed as 'layer1.0:forward:out'
            # (the last two ':' only: a path's own name keeps its spaces, 'heads.a: b')
            head, method_text, spec_part = given.rsplit(":", 2)
            given = f"{head.rstrip()}:{method_text.strip()}:{spec_part.strip()}"
        targets.append(Target(concrete if is_glob else given, path, runs, spec, grad, not spec_text))
    if not targets:
        raise TargetError(
            f"{pattern!r} matches only containers (no forward of their own), forwards with no return, "
            "forward(*args) modules, static, class or builtin forwards, or TorchScript modules, which "
            "cannot be recorded"
        )
    return targets


def scripted(module: torch.nn.Module, path: str) -> str:
    """Why the TorchScript ``module`` at ``path`` cannot be recorded.

    >>> scripted(torch.jit.script(torch.nn.ReLU()), "").split(": ")[0]
    "RecursiveScriptModule at '<root>' is a TorchScript module"
    """
    return (
        f"{type(module).__name__} at {path or '<root>'!r} is a TorchScript module: its code is "
        "TorchScript, not Python bytecode; record it before scripting, or where it is called"
    )


def _method_recorded(
    cls: type, runs: str, where: str, path: str, spec: Spec, spec_text: str, is_glob: bool
) -> Optional[types.FunctionType]:
    """The function of ``cls`` that runs as ``runs``, which a target of ``expand`` records; None
    where a glob passes over it (what ``list_targets`` leaves out), a clear error where one
    target names it. Of the class alone: the instances of a class that a glob matches share it."""
    static = inspect.getattr_static(cls, runs, None)
    if is_glob and not is_python_method(cls, runs):
        return None  # as list_targets leaves it out: a glob takes what can be recorded
    if isinstance(static, (staticmethod, classmethod)):
        kind = type(static).__name__
        raise NotPatchableError(
            f"{where}: {runs} is a {kind}, which does not run on the module, so its values have no "
            f"module path; record it with bcrecord.patch_method({cls.__name__}, {runs!r}, ...)"
        )
    func = getattr(cls, runs, None)
    if not isinstance(func, types.FunctionType):
        kind = "no method" if func is None else "no Python method"
        # Statically: reading a class's __annotations__ would add one to it (3.10-3.13).
        methods = [
            n for n in dir(cls) if isinstance(inspect.getattr_static(cls, n, None), types.FunctionType)
        ]
        raise NotPatchableError(f"{where} has {kind} {runs!r}{did_you_mean(runs, methods)}")
    if not takes_instance(func):
        if is_glob:
            return None  # as a container is: a glob takes what can be recorded
        # A decorator that does not use functools.wraps hides the method behind its own function.
        named = "" if func.__name__ == runs else f" (its function is {func.__qualname__}: a decorator's?)"
        raise NotPatchableError(
            f"{where}: {runs} takes no positional argument (def {runs}(*args)){named}, so the module "
            f"it runs on is not known to the patch of {cls.__name__} its instances share; "
            f"record it with bcrecord.patch_method(module, {runs!r}, ...) on the instance"
        )
    if not spec_text and is_generator_function(func):
        if is_glob:
            return None  # as list_targets leaves it out
        # Its return is the generator's own, when it is used up (None, mostly), not the generator.
        raise TargetError(
            f"{where}: {runs} is a generator function, whose output is the generator the caller "
            f"iterates, which a module path does not record: record what it yields where it makes "
            f"it ('{path}:{runs}:<local>'), or where the caller takes it"
        )
    if is_glob and isinstance(spec, Return) and not has_return(func):
        return None  # a forward that only raises (JetMoe's JetMoeMoA) has no output, as a container
    return func


def new_matches(model: torch.nn.Module, text: str, known: Container[str]) -> List[str]:
    """The paths of recordable modules the glob target ``text`` matches in ``model`` now, not in ``known``.

    For a module added after the targets were expanded (``model.blocks.append(...)`` while
    recording); ``[]`` for a target without a glob, or one that no longer expands.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> _ = model.append(torch.nn.ReLU())
    >>> new_matches(model, "*:forward:return", {"0"}), new_matches(model, "1", {"0"})
    (['1'], [])
    """
    try:
        pattern = _split_in(model, text)[0]
        if not any(ch in pattern for ch in "*?[") or all(p in known for p in _matching_paths(model, pattern)):
            return []  # (the cheap check first: expanding reads the code of every match)
        with _expanding_again():
            found = expand(model, text)
    except BcrecordError:  # the model changed so that the target no longer expands
        return []
    return list(dict.fromkeys(target.path for target in found if target.path not in known))


#: What ``expand``'s cache of checks holds for a class not checked yet.
_UNCHECKED = object()


def _argument_names(func: types.FunctionType) -> Tuple[str, ...]:
    """The names of ``func``'s arguments after the first (``self``), inside its wrappers."""
    code = function_of(func).__code__
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[1:count]


def _refuse_parametrized_read(
    module: torch.nn.Module, func: types.FunctionType, spec: Attribute, where: str, grad: bool
) -> None:
    """Refuse an entry read of a parametrized tensor (``register_parametrization``, spectral_norm).

    Reading it computes it: at entry that is one more run of the parametrization
    (spectral_norm's power iteration would advance, changing the model's buffers),
    and a tensor the forward never uses (so its ``.grad`` never comes). A load site
    records the tensor the forward computes and uses.
    """
    # Private names as the class's code has them: 'self.__lin' is the module's '_Net__lin'.
    root, *names = compiled_spec(spec, func.__code__, func.__qualname__).chain
    if func.__code__.co_argcount == 0 or func.__code__.co_varnames[0] != root:
        return  # the chain starts at another argument: no module known here
    owner: object = module
    for depth, name in enumerate(names):
        if not isinstance(owner, torch.nn.Module):
            return
        if parametrize.is_parametrized(owner, name):
            read = ".".join(spec.chain[: depth + 2])
            load_form = spec.target + "@0" + (".grad" if grad else "")
            raise TargetError(
                f"{where}: {read!r} is parametrized ({type(owner.parametrizations[name][0]).__name__}): "
                "reading it at entry runs its parametrization once more (spectral_norm's power "
                "iteration would advance) and gives a tensor the forward does not use; record it where "
                f"{func.__name__} reads it, its load sites ({load_form!r}...), or in the method of the "
                "module that reads it"
            )
        owner = owner._modules.get(name)  # (getattr would compute a parametrized tensor)


#: False while targets already expanded once (and warned about) are expanded again.
_warn: contextvars.ContextVar[bool] = carried_variable(
    contextvars.ContextVar("bcrecord_expand_warns", default=True)
)


@contextlib.contextmanager
def _expanding_again() -> Iterator[None]:
    """Expand targets again (the extractor, per mode) without repeating the first expansion's warnings."""
    token = _warn.set(False)
    try:
        yield
    finally:
        _warn.reset(token)


def takes_instance(func: types.FunctionType) -> bool:
    """Whether the method ``func`` (inside its wrappers) takes the instance as a positional argument.

    The torch layer's per-instance patches pass it to the probes; ``def forward(*args)``
    has none to pass.

    >>> takes_instance(torch.nn.Linear.forward), takes_instance(lambda *args: args)
    (True, False)
    """
    return function_of(func).__code__.co_argcount > 0


def is_generator_function(func: types.FunctionType) -> bool:
    """Whether the method ``func`` (inside its wrappers) makes a generator: its module path's
    value would be the generator, which its return does not give.

    >>> def forward(self, x):
    ...     yield x
    >>> is_generator_function(forward), is_generator_function(torch.nn.Linear.forward)
    (True, False)
    """
    inner = function_of(func)
    return inspect.isgeneratorfunction(inner) or inspect.isasyncgenfunction(inner)


def is_python_method(cls: type, name: str) -> bool:
    """Whether ``cls.<name>`` is a method recordable on its instances: a Python function,
    not a staticmethod, classmethod or builtin (``forward = staticmethod(F.silu)``,
    ``forward = torch.relu``), whose values would have no module path.

    >>> class Act(torch.nn.Module):
    ...     forward = staticmethod(torch.nn.functional.silu)
    >>> is_python_method(torch.nn.Linear, "forward"), is_python_method(Act, "forward")
    (True, False)
    """
    if isinstance(inspect.getattr_static(cls, name, None), (staticmethod, classmethod)):
        return False
    return isinstance(getattr(cls, name, None), types.FunctionType)


def has_return(func: types.FunctionType) -> bool:
    """Whether the method ``func`` (inside its wrappers) has a return instruction: one that only
    raises (JetMoe's ``JetMoeMoA.forward``; the model calls its other methods) has no output.

    >>> def only_raises(self, x):
    ...     raise NotImplementedError
    >>> has_return(torch.nn.Linear.forward), has_return(only_raises)
    (True, False)
    """
    inner = function_of(func)
    return bool(read(original_code(inner), inner.__qualname__).returns)


def has_forward(module: torch.nn.Module) -> bool:
    """Whether ``module``'s class defines a ``forward`` (containers such as ``ModuleList`` do not).

    >>> import torch
    >>> has_forward(torch.nn.Linear(1, 1)), has_forward(torch.nn.ModuleList())
    (True, False)
    """
    return getattr(type(module), "forward", None) is not getattr(torch.nn.Module, "forward", None)


def wraps_forward(module: torch.nn.Module) -> bool:
    """Whether ``module``'s instance holds a ``forward`` that is no method of its class: a
    wrapper (accelerate's hooks' partial) that may do more once the class's forward returns.

    >>> import functools, torch
    >>> lin = torch.nn.Linear(1, 1)
    >>> before = wraps_forward(lin)
    >>> lin.forward = functools.partial(torch.nn.Linear.forward, lin)
    >>> before, wraps_forward(lin)
    (False, True)
    """
    own: Any = getattr(module, "__dict__", {}).get("forward")
    if getattr(own, "_bcrecord_runs_wrapped", False):  # ours at the root (stop_after_last): see through
        own = own.__wrapped__
    # A method of its own (self.forward = self.forward_fast; bcrecord's patch of one instance)
    # is the model's code, which a stop ends as it ends the class's forward.
    if own is None or (isinstance(own, types.MethodType) and own.__self__ is module):
        return False
    # Dynamo's (torch.compile's OptimizedModule sets its forward so, as does `m.forward =
    # torch.compile(m.forward)`) only runs the forward it compiled: its context ends on a stop too.
    return not (isinstance(own, types.FunctionType) and hasattr(own, "_torchdynamo_orig_callable"))


def callable_name(called: Any) -> str:
    """How a warning names a callable set on an instance in place of a method.

    >>> import functools
    >>> callable_name(functools.partial(len, [])), callable_name(len)
    ('functools.partial(builtins.len)', 'builtins.len')
    """
    if getattr(called, "_bcrecord_runs_wrapped", False):  # ours at the root (stop_after_last)
        called = called.__wrapped__
    func = called.func if isinstance(called, functools.partial) else called
    name = getattr(func, "__qualname__", type(func).__qualname__)
    name = f"{getattr(func, '__module__', None) or type(func).__module__}.{name}"
    return f"functools.partial({name})" if isinstance(called, functools.partial) else name


def _method_that_runs(module: torch.nn.Module, method: str, path: str) -> Optional[str]:
    """The name of the class method that runs as ``module.<method>``; None if unknown.

    Usually ``method``; an instance attribute can replace it with another method
    (``self.forward = self.forward_fast``) or with something else (a
    ``functools.partial``, a wrapper that may or may not call the class's method).
    """
    own = getattr(module, "__dict__", {}).get(method)
    if own is None:
        return method
    if getattr(own, "_bcrecord_runs_wrapped", False):  # ours at the root (stop_after_last): see through
        own = own.__wrapped__
    # Any other wrapper there (accelerate's hooks: a partial with __wrapped__) may change
    # what the module returns: not the class's method, whatever it says it wraps.
    if isinstance(own, types.MethodType) and own.__self__ is module:
        name = own.__func__.__name__
        if getattr(type(module), name, None) is own.__func__:
            return name
    return None


def expand_all(model: torch.nn.Module, texts: Iterable[str]) -> Dict[str, List[Target]]:
    """Every target string expanded; keys keep the user's order.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sequential(torch.nn.ReLU()))
    >>> {text: [t.path for t in found] for text, found in expand_all(model, ["1.*", "0"]).items()}
    {'1.*': ['1.0'], '0': ['0']}
    """
    require_module(model)
    if isinstance(texts, str):
        texts = [texts]
    elif isinstance(texts, (bytes, bytearray, memoryview)):  # (iterated, they give ints)
        raise SpecError(f"targets are text: give a str, not {bytes(texts)!r:.80}")
    elif not isinstance(texts, collections.abc.Iterable) or isinstance(texts, collections.abc.Mapping):
        raise TypeError(f"targets must be a string or a list of strings, got {type(texts).__name__}")
    out: Dict[str, List[Target]] = {}
    for text in texts:
        out[text] = expand(model, text)
    if not out:
        raise SpecError("no targets given")
    return out
