"""Target strings for models: ``'<module path>:<method>:<target>'``, expanded over a model.

Forms (``path`` is a dotted path from ``model.named_modules()``, ``''`` for the root):

* ``'layer1.0:forward:out@2'`` — a local, attribute or return spec of a method;
* ``':_forward_impl:x@0'`` — a method of the root module;
* ``'blocks.3:forward:x'`` — every assignment of ``x``;
* ``'layer1'`` — that module's output (its ``forward``'s return value), as in
  torchvision's ``return_nodes``;
* globs in the path, matched one dotted component at a time: ``'blocks.*:forward:x@1'``,
  ``'layer*.*'`` (``layer1.0``, ``layer2.3``…, not ``layer1.0.conv1``);
* a ``.grad`` suffix records the gradient of the value: ``'layer1.0:forward:out@2.grad'``;
* FX node names of functional ops, where they map to exactly one call or operator
  site of the module's ``forward``/``_forward_impl``: ``'flatten'`` (ResNet's
  ``torch.flatten``), ``'layer1.0.add'`` (a Bottleneck's ``out += identity``),
  ``'add_1'`` (the second ``add``).

>>> import torch
>>> net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
>>> [(t.path, t.method, t.spec) for t in expand(net, "*")]
[('0', 'forward', Return(copy=None)), ('1', 'forward', Return(copy=None))]
"""

from __future__ import annotations

import difflib
import dis
import fnmatch
import inspect
import sys
import types
import warnings
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import torch
from bytecode import Label

from .._versions import is_conditional_jump
from ..analysis import instructions
from ..errors import NotPatchableError, RecordingWarning, SpecError, TargetError
from ..specs import Call, Expr, Return, Spec, parse

__all__ = ["Target", "expand", "expand_all", "has_forward", "unwrap", "module_at"]

_WRAPPERS: Tuple[type, ...] = (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)


@dataclass(frozen=True)
class Target:
    """One concrete target: a spec in one method of one submodule.

    >>> import torch
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


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside ``nn.DataParallel`` / ``DistributedDataParallel`` / ``torch.compile`` wrappers.

    >>> import torch
    >>> inner = torch.nn.Linear(1, 1)
    >>> unwrap(torch.nn.DataParallel(inner)) is inner
    True
    """
    while True:
        if isinstance(model, _WRAPPERS):
            model = model.module  # type: ignore[assignment,attr-defined]
            continue
        # torch.compile's wrapper; its module is imported only once something compiles.
        dynamo = sys.modules.get("torch._dynamo.eval_frame")
        if dynamo is not None and isinstance(model, getattr(dynamo, "OptimizedModule", ())):
            model = model._orig_mod  # type: ignore[union-attr]
            continue
        return model


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
    if not path:  # the root: the model itself, inside any wrapper (as list_targets lists it)
        return unwrap(model)
    for root in (model, unwrap(model)):
        try:
            return root.get_submodule(path)
        except AttributeError:
            continue
    names = [name for name, _ in unwrap(model).named_modules() if name]
    close = difflib.get_close_matches(path, names, n=3)
    hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
    raise TargetError(f"the model has no submodule {path!r}{hint}")


def _split(text: str) -> Tuple[str, str, str, bool]:
    if not isinstance(text, str):
        raise SpecError(f"a target must be a string, got {text!r}")
    text = text.strip()  # '' (as list_targets lists the root): the root's output
    grad = text.endswith(".grad")
    if grad:
        if ":" not in text:
            raise SpecError(f"{text!r}: '.grad' needs a local, e.g. 'layer1.0:forward:out@2.grad'")
        text = text[: -len(".grad")]
    parts = text.split(":")
    if len(parts) == 1:
        return parts[0], "forward", "", grad
    if len(parts) != 3 or not parts[1] or not parts[2]:
        raise SpecError(
            f"bad target {text!r}: expected 'module.path:method:target' (e.g. 'layer1.0:forward:out@2') "
            "or a bare module path (e.g. 'layer1')"
        )
    return parts[0], parts[1], parts[2], grad


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
_FX_METHODS = ("forward", "_forward_impl")


def _fx_target(model: torch.nn.Module, text: str) -> Optional[Target]:
    """Map a torchvision/FX node name of a functional op (``'flatten'``, ``'layer1.0.add'``,
    ``'add_1'``) to the call or operator site it names, if that is unambiguous."""
    from ..patch import targets as function_targets

    parent, _, node = text.rpartition(".")
    base, _, number = node.rpartition("_") if node.rpartition("_")[2].isdigit() else (node, "", "0")
    occurrence = int(number or 0)
    try:
        module = module_at(model, parent)
    except TargetError:
        return None
    sites: List[Tuple[str, Spec]] = []
    labels: List[str] = []
    branching = looping = False
    for method in _FX_METHODS:
        func = getattr(type(module), method, None)
        if not isinstance(func, types.FunctionType):
            continue
        found = function_targets(func)
        # FX numbers ops in the order they run: here, the order of their instructions.
        ordered: List[Tuple[int, Spec, str]] = []
        placed: List[int] = []  # every instruction of those sites
        for callee, calls in found.calls.items():
            if callee.rsplit(".", 1)[-1] == base:
                ordered += [(c.positions[0], Call(callee, c.index), f"{callee}()@{c.index}") for c in calls]
                placed += [p for c in calls for p in c.positions]
        for op in _FX_OPERATORS.get(base, ()):
            operators = found.operators.get(op, ())
            ordered += [(o.positions[0], Expr(op, o.index), f"{op}@{o.index}") for o in operators]
            placed += [p for o in operators for p in o.positions]
        ordered.sort(key=lambda site: site[0])
        sites += [(method, spec) for _, spec, _ in ordered]
        labels += [f"'{parent}:{method}:{label}'" for _, _, label in ordered]
        branching = branching or (bool(ordered) and _has_conditionals(func.__code__))
        spans = _loop_spans(func.__code__) if placed else []
        looping = looping or any(start <= p <= end for p in placed for start, end in spans)
    if not sites:
        return None
    if len(sites) > 1 and branching:
        raise TargetError(
            f"{text!r}: {type(module).__name__} has {len(sites)} {base!r} sites and conditional "
            f"branches, so which of them FX names {node!r} depends on the branch that runs; "
            f"name the site instead: {', '.join(labels)}"
        )
    if looping:
        # FX numbers each execution ('add_1': the loop's second turn); a site is every turn.
        raise TargetError(
            f"{text!r}: {type(module).__name__} runs {base!r} in a loop, so FX numbers its "
            f"{base!r} ops by the turns the loop makes, not by site; name the site instead (it "
            f"records every turn): {', '.join(labels)}"
        )
    if occurrence >= len(sites):
        raise TargetError(
            f"{text!r}: {type(module).__name__} has {len(sites)} {base!r} site(s) in "
            f"{'/'.join(_FX_METHODS)}; there is no number {occurrence}"
        )
    method, spec = sites[occurrence]
    return Target(text, parent, method, spec)


def _has_conditionals(code: types.CodeType) -> bool:
    """Whether ``code`` branches on a condition (``if``, ``and``/``or``, ``x if c else y``)."""
    return any(is_conditional_jump(instr.opname) for instr in dis.get_instructions(code))


def _loop_spans(code: types.CodeType) -> List[Tuple[int, int]]:
    """The loops of ``code`` (``for``, ``while``) as spans of positions in ``instructions(code)``.

    A loop runs from the label a jump goes back to, through that jump.

    >>> def f(xs):
    ...     total = 0
    ...     for x in xs:
    ...         total += x
    ...     return total
    >>> len(_loop_spans(f.__code__)), _loop_spans(has_forward.__code__)
    (1, [])
    """
    items = instructions(code)
    labels = {item: k for k, item in enumerate(items) if isinstance(item, Label)}
    spans = []
    for k, item in enumerate(items):
        target = getattr(item, "arg", None)
        if isinstance(target, Label) and labels[target] <= k:
            spans.append((labels[target], k))
    return spans


def _matching_paths(model: torch.nn.Module, pattern: str) -> List[str]:
    if not any(ch in pattern for ch in "*?["):
        module_at(model, pattern)  # raises a clear error if missing
        return [pattern]
    wanted = pattern.split(".")
    roots = [model] if unwrap(model) is model else [model, unwrap(model)]
    for root in roots:
        found = [
            name
            for name, _ in root.named_modules()
            if name
            and len(name.split(".")) == len(wanted)
            and all(fnmatch.fnmatchcase(a, b) for a, b in zip(name.split("."), wanted, strict=True))
        ]
        if found:
            return found
    raise TargetError(f"no submodule matches {pattern!r}")


def expand(model: torch.nn.Module, text: str) -> List[Target]:
    """The concrete targets a target string stands for in ``model``, or a clear error.

    >>> import torch
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    >>> [(t.path, t.method, t.output) for t in expand(model, "*:forward:return")]
    [('0', 'forward', False), ('1', 'forward', False)]
    >>> [(t.path, t.output) for t in expand(model, "1")]  # a bare path: the module's output
    [('1', True)]
    """
    pattern, method, spec_text, grad = _split(text)
    if not spec_text and not any(ch in pattern for ch in "*?["):
        try:
            module_at(model, pattern)
        except TargetError:
            mapped = _fx_target(model, pattern)  # a functional op's FX node name?
            if mapped is not None:
                return [mapped]
            raise
    spec = parse(spec_text) if spec_text else Return()
    is_glob = any(ch in pattern for ch in "*?[")
    targets = []
    for path in _matching_paths(model, pattern):
        module = module_at(model, path)
        if isinstance(module, torch.jit.ScriptModule):
            raise NotPatchableError(
                f"{type(module).__name__} at {path or '<root>'!r} is a TorchScript module: its code is "
                "TorchScript, not Python bytecode; record it before scripting, or where it is called"
            )
        runs = _method_that_runs(module, method, path)
        where = f"{type(module).__name__} at {path or '<root>'!r}"
        if runs is None and method == "forward" and not has_forward(module):
            raise NotPatchableError(
                f"{where} runs a forward set on the instance, not a method of its class; "
                "record inside what it calls, or patch that function with bcrecord.patch_function"
            )
        if runs is None or (runs != method and spec_text):
            instead = "" if runs is None else f" (it runs {runs}: its targets are '{path}:{runs}:...')"
            warnings.warn(
                f"bcrecord: {where} has its own {method} attribute; {type(module).__name__}.{method} "
                f"records only if that calls it{instead}",
                RecordingWarning,
                stacklevel=3,
            )
        # A bare path is the module's output: what the method that runs returns.
        runs = method if runs is None or spec_text else runs
        if not has_forward(module) and runs == "forward":
            if is_glob:
                continue  # a container (ModuleList, ModuleDict) among the matches: it never runs
            raise TargetError(
                f"{where} has no forward of its own (a container): target its submodules "
                f"('{path}.0', '{path}.*')"
            )
        static = inspect.getattr_static(type(module), runs, None)
        if isinstance(static, (staticmethod, classmethod)):
            kind = type(static).__name__
            raise NotPatchableError(
                f"{where}: {runs} is a {kind}, which does not run on the module, so its values have no "
                f"module path; record it with bcrecord.patch_method({type(module).__name__}, {runs!r}, ...)"
            )
        func = getattr(type(module), runs, None)
        if not isinstance(func, types.FunctionType):
            kind = "no method" if func is None else "no Python method"
            raise NotPatchableError(f"{where} has {kind} {runs!r}")
        concrete = f"{path}:{runs}:{spec_text}" if spec_text else path
        given = text.strip().removesuffix(".grad")
        targets.append(Target(concrete if is_glob else given, path, runs, spec, grad, not spec_text))
    if not targets:
        raise TargetError(f"{pattern!r} matches only containers (no forward of their own)")
    return targets


def has_forward(module: torch.nn.Module) -> bool:
    """Whether ``module``'s class defines a ``forward`` (containers such as ``ModuleList`` do not).

    >>> import torch
    >>> has_forward(torch.nn.Linear(1, 1)), has_forward(torch.nn.ModuleList())
    (True, False)
    """
    return getattr(type(module), "forward", None) is not getattr(torch.nn.Module, "forward", None)


def _method_that_runs(module: torch.nn.Module, method: str, path: str) -> Optional[str]:
    """The name of the class method that runs as ``module.<method>``; None if unknown.

    Usually ``method``; an instance attribute can replace it with another method
    (``self.forward = self.forward_fast``) or with something else (a
    ``functools.partial``, a wrapper that may or may not call the class's method).
    """
    own = getattr(module, "__dict__", {}).get(method)
    if own is None:
        return method
    own = getattr(own, "__wrapped__", own)  # a wrapper that says what it wraps (ours at the root too)
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
    if isinstance(texts, str):
        texts = [texts]
    out: Dict[str, List[Target]] = {}
    for text in texts:
        out[text] = expand(model, text)
    if not out:
        raise SpecError("no targets given")
    return out
