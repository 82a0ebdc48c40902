"""``bcrecord run``: run an unmodified program with functions patched from the start.

Like ``python -m cProfile``, it runs a script (:func:`runpy.run_path`), a module
(``-m``, :func:`runpy.run_module`) or a program read from stdin (``-``, as ``python -``
runs it: ``sys.argv[0]`` is ``'-'``, its functions are ``__main__``'s) with ``sys.argv``
set to what the program would see, while :class:`RunTarget` strings name what to record::

    bcrecord run --record 'torchvision.models.resnet:ResNet._forward_impl:x@0' \\
                 --save-dir out --every 10  train.py --epochs 3

A target is ``'<module>:<function or Class.method>:<spec>'``; the spec is any
short form of :func:`bcrecord.parse` (``x``, ``x@1``, ``self.fc.weight``,
``self.fc@0``, ``return``...). Functions of the program itself are named with the
module ``__main__`` (or the script's file stem, or the ``-m`` module's name; one
target given under two of these names is one target, recorded once).

How targets are applied:

* **Before the program starts**, every target is checked without importing
  anything: its module is looked up on ``sys.path`` (parent packages are not
  imported), its function is found in the module's code by qualified name, and the
  spec is resolved against that code. An unknown module, function or local stops
  the run before the program's first line, with one line on stderr (a function of
  a module that calls ``exec`` or ``globals()``, or imports ``*``, is looked for
  once that module has run).
* **When the module is imported** (an import hook; modules already imported are
  patched at once), the functions are patched in place
  (:func:`bcrecord.patch_function`), so every reference records: ``from m import
  f``, registries, subclasses that inherit a method. The hook keeps itself first
  on ``sys.meta_path`` (from the next import on) while still letting a finder the
  program put there load its modules: ``bcrecord run -r test_m:test_f:x -m pytest``
  records in test modules that pytest's assertion rewriter loads.
* **Functions of the main program** are patched as soon as the program's top level
  defines them (a trace function watches the main module's top-level statements
  only, and is removed once every such target is patched).

What is kept: with ``--save-dir``, every N-th value of each key (``--every N``:
the values numbered 0, N, 2N... in the order that key fired; the number is the
value's *step*) is copied when it is recorded (the others are not even copied) and
written with :class:`bcrecord.storage.Writer` in batches (every few seconds, 10,000 values or
megabytes, also while the program records nothing: a thread writes what waited),
and at exit -- also when the program raises or calls :func:`sys.exit`, ends with
:func:`os._exit` or replaces itself with an ``os.exec*`` function (the run ends just
before: its values are saved and its report printed; an exec that fails leaves the
program running unrecorded, which one line says). A program killed (SIGTERM, SIGKILL) loses at most
the values of its last few seconds. Values
recorded in child processes are not saved. Without ``--save-dir`` only
counts and the last value of each key are kept, and a summary is printed to
stderr at the end.

What passes through unchanged: the program's ``sys.argv``, stdin, stdout, its
stderr (bcrecord adds its report at the end there: a summary unless ``--quiet``, and
what did not record), and its exit status: a :class:`SystemExit` is re-raised as it
was, an uncaught exception prints its traceback (without bcrecord's frames) and exits
1, as Python does; a :class:`KeyboardInterrupt` ends it as it ends Python. Its
``__main__`` holds what Python puts there (``__annotations__`` too, where the version
does). Two differences: a run whose records could
not be saved ends with status 2 where the program's would be 0; and with
``--save-dir`` the program has one more thread, the writer's (``threading.enumerate()``
lists it while values wait; it stops for a fork, so that no child is forked mid-write, and
starts again after it; on 3.12+ a direct :func:`os.fork` warns that the process is multi-threaded).

>>> target = parse_target("json:dumps:return")
>>> target.module, target.path, target.spec
('json', ('dumps',), Return(copy=None))
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import dis
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import itertools
import keyword
import math
import os
import pkgutil
import runpy
import signal
import sys
import threading
import time
import types
import warnings
import weakref
import zipfile
from collections import defaultdict
from dataclasses import dataclass, fields, is_dataclass
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    TextIO,
    Tuple,
    Union,
    cast,
)

from . import _versions
from .analysis import compiled_spec, read, resolve
from .errors import BcrecordError, RecordingWarning, aligned, did_you_mean, shell_quoted, shown
from .patch import (
    Patch,
    _OneInstance,
    _torch_call,
    a_method_name,
    function_of,
    no_python_method,
    original_code,
    patch_function,
    patch_method,
    targets,
)
from .runtime import (
    Recording,
    Sink,
    copy_value,
    raised_by_signal_handler,
    safe_over_forks,
    silence,
    silently,
)
from .specs import Attribute, Spec, compiled_name, full_width_fixed, parse, require_bool, split_specs
from .storage import Writer

__all__ = ["RunTarget", "RunError", "parse_target", "check_targets", "run", "safe_path"]

#: What holds a function as ``.func`` (bcrecord's errors for them say to patch that).
_FUNCTION_HOLDERS = (functools.partial, functools.partialmethod, functools.cached_property)
_RUNNER_FILES = {os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"}
_SKIP = object()


class RunError(BcrecordError):
    """Bad input to ``bcrecord run``: a target, a program or an option."""


class _ParentRaised(Exception):
    """A parent package of the ``-m`` module raised as it was imported: the program's error,
    shown as Python shows it (its traceback, status 1), not as bad input."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _TargetFailed(BaseException):
    """A target could not be applied while the program ran; ends the run with status 2.

    A BaseException, so that the program's own ``except Exception`` does not swallow it.
    """

    def __init__(self, texts: str, reason: str) -> None:
        super().__init__(f"target {texts}: {reason}")
        #: Why, without the targets.
        self.reason = reason


@dataclass(frozen=True)
class RunTarget:
    """One ``'<module>:<qualified name>:<spec>'`` target of ``bcrecord run``.

    >>> target = parse_target("torchvision.models.resnet:ResNet._forward_impl:x@0")
    >>> target.module, target.qualname, target.spec
    ('torchvision.models.resnet', 'ResNet._forward_impl', Local(name='x', index=(0,), copy=None))
    """

    #: The target as written.
    text: str
    #: The module to patch in, e.g. ``'torchvision.models.resnet'`` or ``'__main__'``.
    module: str
    #: Attribute path from the module, e.g. ``('ResNet', '_forward_impl')``.
    path: Tuple[str, ...]
    spec: Spec

    @property
    def qualname(self) -> str:
        """The function's qualified name within its module, e.g. ``'ResNet._forward_impl'``."""
        return ".".join(self.path)


def split_module(dotted: str) -> Optional[Tuple[str, str]]:
    """``(module, function)`` where a module's name runs on into its function with a dot
    (``'pkg.mod.Net.forward'``, for ``'pkg.mod:Net.forward'``): the longest importable module
    ``dotted`` starts with, found without importing it; or None (also where ``dotted`` is
    itself a module, which holds no function of that name).

    >>> split_module("json.decoder.JSONDecoder.decode"), split_module("nosuch.f")
    (('json.decoder', 'JSONDecoder.decode'), None)
    >>> split_module("json.decoder")  # a module, not json's function 'decoder'
    """
    parts = dotted.split(".")
    if not all(part.isidentifier() for part in parts) or is_module(dotted):
        return None
    for end in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:end])
        if _module_spec(module) is not None:
            return module, ".".join(parts[end:])
    return None


def parse_target(text: str) -> RunTarget:
    """Parse ``'package.module:Class.method:spec'`` or ``'package.module:function:spec'``.

    >>> parse_target("pkg.mod:Model.forward:x@1").path
    ('Model', 'forward')
    >>> parse_target("pkg.mod:forward")
    Traceback (most recent call last):
    ...
    bcrecord.runner.RunError: target 'pkg.mod:forward' needs three parts, \
'package.module:Class.method:SPEC': '__main__:pkg.mod:forward' (spec 'forward' of pkg.mod, defined \
in the script) or 'pkg.mod:forward:return' (function forward of module pkg.mod; 'bcrecord targets \
pkg.mod:forward' lists its specs)
    """
    fixed = full_width_fixed(text, punctuation_only=True)
    if fixed is not None:  # (no part of a target holds an IME's '：' or '＠')
        raise RunError(f"bad target {text!r}: it has full-width characters: write {fixed!r}")
    parts = text.split(":", 2)
    if len(parts) == 2 and all(parts):
        first, second = (p.strip() for p in parts)
        # (a keyword is no module's or function's name: 'json.dumps:return' is no function 'return')
        dotted = all(p.isidentifier() and not keyword.iskeyword(p) for p in f"{first}.{second}".split("."))
        # Which part is missing is a guess: the module (the spec given) or the spec.
        if first == "__main__":
            # (A name the script's top level assigns, a plain variable, is no function to patch.)
            guesses = [(f"{text}:return", f"function {second}, defined in the script; any spec of it works")]
        else:
            split = split_module(first)
            guesses = (
                [(f"{split[0]}:{split[1]}:{second}", f"function {split[1]} of module {split[0]}")]
                if split
                else []
            )
            guesses.append((f"__main__:{text}", f"spec {second!r} of {first}, defined in the script"))
            if dotted:
                guesses.append(
                    (
                        f"{text}:return",
                        f"function {second} of module {first}; 'bcrecord targets {text}' lists its specs",
                    )
                )
        # Only those that are targets ('./train.py:loss' gives none: '__main__:./train.py:loss' is refused).
        offered = [f"'{guess}' ({why})" for guess, why in guesses if _is_target(guess)]
        form = f"target {text!r} needs three parts, 'package.module:Class.method:SPEC'"
        raise RunError(f"{form}: {' or '.join(offered)}" if offered else f"{form}, e.g. 'json:dumps:return'")
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise RunError(
            f"bad target {text!r}: expected 'package.module:Class.method:SPEC' or "
            "'package.module:function:SPEC', e.g. 'json:dumps:return'"
        )
    module, qualname, spec_text = (p.strip() for p in parts)
    path = tuple(qualname.split("."))
    if not all(p.isidentifier() for p in module.split(".")):
        # A script named by its file ('my-train.py', './train.py'): its own functions are __main__'s.
        raise RunError(
            f"bad target {text!r}: {module!r} is no module's dotted name; a function of the program "
            f"itself is '__main__:{qualname}:{spec_text}', one of another module is named as it is "
            "imported ('package.module')"
        )
    if not all(p.isidentifier() for p in path):
        raise RunError(f"bad target {text!r}: {qualname!r} must be a dotted Python name (Class.method)")
    # Names as written in the source: the compiler stores them NFKC-normalised ('\ufb01x' is 'fix').
    path = tuple(compiled_name(name) for name in path)
    try:
        spec = parse(spec_text)
    except BcrecordError as error:
        several = _one_spec_each(module, qualname, spec_text)
        if several:  # (parse's own hint is for a list in Python)
            raise RunError(f"bad target {text!r}: {spec_text!r} is several specs{several}") from None
        raise RunError(f"bad target {text!r}: {error}") from None
    return RunTarget(text, module, path, spec)


def _is_target(text: str) -> bool:
    """Whether :func:`parse_target` takes ``text``."""
    try:
        parse_target(text)
    except RunError:
        return False
    return True


def _one_spec_each(module: str, qualname: str, spec_text: str) -> str:
    """For several specs in one target (``'m:f:x,y'``, ``'m:f:x y'``): the ``--record`` options to
    give instead, one spec each; else ``''``.

    >>> _one_spec_each("m", "C.f", "out@[0, 1],self.w")
    " (one spec a target: --record 'm:C.f:out@[0, 1]' --record 'm:C.f:self.w')"
    >>> _one_spec_each("m", "C.f", "self..w")
    ''
    """
    parts = split_specs(spec_text)
    if parts is None:
        return ""
    options = " ".join(f"--record '{module}:{qualname}:{part}'" for part in parts)  # (names: no quotes)
    return f" (one spec a target: {options})"


# --- checking targets before anything runs --------------------------------------------


def is_module(name: str) -> bool:
    """Whether ``name`` is a module, imported or importable (found without importing it).

    >>> is_module("json.decoder"), is_module("os.path"), is_module("json.nosuch")
    (True, True, False)
    """
    return name in sys.modules or _module_spec(name) is not None


def _module_spec(name: str) -> Optional[importlib.machinery.ModuleSpec]:
    """Find module ``name`` without importing it or its parent packages (None: not found)."""
    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for i in range(1, len(parts)):
        if spec is None:
            return None
        parent = sys.modules.get(".".join(parts[:i]))
        locations = getattr(parent, "__path__", None) if parent is not None else None
        if locations is None:
            locations = spec.submodule_search_locations
        if locations is None:
            return None
        sub = ".".join(parts[: i + 1])
        module = sys.modules.get(sub)
        spec = getattr(module, "__spec__", None) if module is not None else None
        if spec is None:
            spec = importlib.machinery.PathFinder.find_spec(sub, list(locations))
    return spec


def _beside(stream: TextIO) -> TextIO:
    """A stream of its own onto ``stream``'s file descriptor, its encoding, no buffer held
    (line by line); ``stream`` itself where it has no descriptor (a ``StringIO``).

    >>> import io
    >>> held = io.StringIO()
    >>> _beside(held) is held
    True
    """
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):  # (io.UnsupportedOperation is both)
        return stream
    encoding = getattr(stream, "encoding", None) or "utf-8"
    return open(descriptor, "w", buffering=1, closefd=False, encoding=encoding, errors="backslashreplace")  # noqa: SIM115


def close_modules(name: str) -> str:
    """``"; did you mean 'a', 'b'?"`` for the modules named close to module ``name``, which is not
    there (a misspelt ``mymdo``, ``pkg.trian``), or ``''``: the end of a message. Looks for them
    in ``sys.path`` or in the parent package's folders, importing nothing.

    >>> close_modules("json.decodr")
    "; did you mean 'json.decoder', 'json.encoder', 'json.scanner'?"
    >>> close_modules("jsn").startswith("; did you mean 'json'"), close_modules("zzzzzz")
    (True, '')
    >>> close_modules("jsn.decoder")  # (a misspelt package: what to fix first)
    "; no module named 'jsn' either; did you mean 'json'?"
    """
    parent, _, _ = name.rpartition(".")
    if parent:
        spec = _module_spec(parent)
        locations = spec.submodule_search_locations if spec is not None else None
        if locations is None:
            if spec is not None:
                return ""  # (a module, not a package: it has none)
            missing = parent  # (the outermost one missing: what to fix first)
            while "." in missing and _module_spec(missing.rpartition(".")[0]) is None:
                missing = missing.rpartition(".")[0]
            closest = close_modules(missing)
            return f"; no module named {missing!r} either{closest}" if closest else ""
        found = [f"{parent}.{module.name}" for module in pkgutil.iter_modules(list(locations))]
    else:
        found = [module.name for module in pkgutil.iter_modules()] + list(sys.builtin_module_names)
    return did_you_mean(name, found)


def _module_code(spec: importlib.machinery.ModuleSpec) -> Optional[types.CodeType]:
    """The module's code object, if its loader can give it without running it.

    Only read: no ``.pyc`` is written and no compile-time warning shown, for the import
    compiles the module again where it finds no ``.pyc``, and shows them then.
    """
    get_code = getattr(spec.loader, "get_code", None)
    if get_code is None:
        return None
    dont_write = sys.dont_write_bytecode
    try:
        sys.dont_write_bytecode = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = get_code(spec.name)
    except Exception:  # a syntax error and the like: the import will report it
        return None
    finally:
        sys.dont_write_bytecode = dont_write
    return code if isinstance(code, types.CodeType) else None


def _functions(code: types.CodeType, prefix: str = "") -> Iterator[Tuple[str, types.CodeType]]:
    """``(qualified name, code)`` of every function and class body nested in module ``code``."""
    for const in code.co_consts:
        if not isinstance(const, types.CodeType) or const.co_name.startswith("<"):
            continue
        qualname = prefix + const.co_name
        yield qualname, const
        is_function = bool(const.co_flags & _CO_OPTIMIZED)
        yield from _functions(const, qualname + (".<locals>." if is_function else "."))


#: The code flag of a function's code (a class body's has not got it).
_CO_OPTIMIZED = inspect.CO_OPTIMIZED


def _a_class(target: RunTarget, methods: Union[type, Sequence[str]]) -> str:
    """Why ``target`` names a class, with the target for one of its ``methods`` to give instead."""
    if isinstance(methods, type) and no_python_method(methods):
        return f"target {target.text!r}: {no_python_method(methods)}"
    spec = target.text.split(":", 2)[2]
    example = f"{target.module}:{target.qualname}.{a_method_name(methods)}:{spec}"
    return f"target {target.text!r}: {target.path[-1]} is a class: name one of its methods, e.g. {example!r}"


def _check_in_code(target: RunTarget, code: types.CodeType, where: str) -> None:
    """Check ``target`` against module code: raise :class:`RunError` if it cannot apply."""
    functions = list(_functions(code))
    defined = dict(functions)
    found = [c for name, c in functions if name == target.qualname]
    if not found:
        if target.path[0] not in code.co_names and not _binds_unseen_names(code):
            hint = did_you_mean(target.path[0], _last_bindings(code)[0])  # (a misspelt class or function)
            raise RunError(f"target {target.text!r}: {where} never defines {target.path[0]!r}{hint}")
        # 'outer.inner' where inner is a def inside outer: a local of each call, out of the
        # module's reach, unless something sets that attribute (a decorator's result may be
        # anything, so only a def nested in a function is refused here).
        for end in range(1, len(target.path)):
            prefix, name = ".".join(target.path[:end]), target.path[end]
            if f"{prefix}.<locals>.{name}" in defined and not _sets_attribute(code, name):
                raise RunError(
                    f"target {target.text!r}: {name} is a function defined inside {prefix}, made "
                    "anew by each call, out of the module's reach: it cannot be a target"
                )
        return  # defined some other way (assigned, inherited, generated): checked when patched
    functions_found = [c for c in found if c.co_flags & _CO_OPTIMIZED]
    if not functions_found:  # only class bodies by that name
        inside = target.qualname + "."
        methods = [n[len(inside) :] for n, _ in functions if n.startswith(inside)]
        methods = [name for name in methods if "." not in name]  # its own, not theirs
        raise RunError(_a_class(target, methods))
    first: Optional[BcrecordError] = None
    for candidate in functions_found:
        try:
            resolve([target.spec], read(candidate, target.qualname))
            return
        except BcrecordError as error:
            first = first or error
    raise RunError(f"target {target.text!r}: {first}")


def _binds_unseen_names(code: types.CodeType) -> bool:
    """Whether module ``code``, or code nested in it, may bind global names that none of its
    stores names: it calls ``exec`` (a ``def`` in a string), writes through ``globals()``, or
    imports ``*``.

    >>> _binds_unseen_names(compile("exec('def f(): pass')", "<m>", "exec"))
    True
    >>> _binds_unseen_names(compile("def f(): pass", "<m>", "exec"))
    False
    >>> _binds_unseen_names(compile("app.exec(); mode = 'exec'; self.globals = {}", "<m>", "exec"))
    False
    >>> _binds_unseen_names(compile("from os.path import *", "<m>", "exec"))
    True
    """
    table = _versions.current()
    for instr in dis.get_instructions(code):
        # The builtins by name only: not an attribute (Qt's app.exec(), self.globals) nor a
        # string ('exec', compile's mode), which would defer the check of every target there.
        if instr.opname in table.name_loads and instr.argval in ("exec", "globals"):
            return True
        if table.star_import in (instr.opname, instr.argrepr):
            return True
    return any(_binds_unseen_names(c) for c in code.co_consts if isinstance(c, types.CodeType))


def _sets_attribute(code: types.CodeType, name: str) -> bool:
    """Whether ``code``, or code nested in it, may set attribute ``name`` of something:
    ``x.name = v``, or any call of ``setattr`` (which name it sets is not known)."""
    for instr in dis.get_instructions(code):
        if (instr.opname == "STORE_ATTR" and instr.argval == name) or instr.argval == "setattr":
            return True
    return any(_sets_attribute(c, name) for c in code.co_consts if isinstance(c, types.CodeType))


def _last_bindings(code: Optional[types.CodeType]) -> Tuple[Dict[str, int], Dict[str, int]]:
    """The last line where module ``code`` binds each global name, and each attribute name.

    ``def step``, ``class A`` and ``step = ...`` bind ``step``; ``A.m = f`` binds ``m``.
    """
    names: Dict[str, int] = {}
    attributes: Dict[str, int] = {}
    if code is None:
        return names, attributes
    lines = {offset: line for start, end, line in code.co_lines() for offset in range(start, end, 2)}
    for instr in dis.get_instructions(code):
        line = lines.get(instr.offset)
        kind = {"STORE_NAME": names, "STORE_GLOBAL": names, "STORE_ATTR": attributes}.get(instr.opname)
        if kind is not None and line is not None:
            kind[instr.argval] = max(kind.get(instr.argval, line), line)
    return names, attributes


def _function(value: Any) -> Any:
    """What a found target is: a bound method (a classmethod's, an instance's) by its function,
    a wrapper (``step = functools.wraps``-style ``deco(step)``, ``torch.compile(step)``) by the
    function inside, which its patch records (in place)."""
    value = value.__func__ if isinstance(value, types.MethodType) else value
    seen = set()
    while isinstance(value, types.FunctionType) and id(value) not in seen:  # (a cycle ends it)
        seen.add(id(value))
        inner = getattr(value, "__wrapped__", None)
        inner = inner.__func__ if isinstance(inner, types.MethodType) else inner
        if not isinstance(inner, types.FunctionType):
            break
        value = inner
    return value


def _undecorated(value: Any, qualname: str) -> Optional[types.FunctionType]:
    """The function a decorator that does not use ``functools.wraps`` holds in the closure of
    the wrapper it put in its place (``@timed def step``: ``step`` is ``timed``'s ``inner``),
    which the wrapper calls: the one the target's ``def`` made, told by its qualified name.
    None where ``value`` is that function, or holds no one such function.

    >>> def timed(fn):
    ...     def inner(*args):
    ...         return fn(*args)
    ...     return inner
    >>> def step(x):
    ...     return x
    >>> _undecorated(timed(step), "step") is step, _undecorated(step, "step")
    (True, None)
    """
    if not isinstance(value, types.FunctionType) or value.__qualname__ == qualname:
        return None
    found: List[types.FunctionType] = []
    waiting: List[types.FunctionType] = [value]
    seen: Set[int] = set()
    while waiting and len(seen) < 16:  # (wrappers around wrappers, a few deep)
        wrapper = waiting.pop()
        seen.add(id(wrapper))
        for cell in wrapper.__closure__ or ():
            try:
                held = cell.cell_contents
            except ValueError:  # (an empty cell)
                continue
            if isinstance(held, types.FunctionType) and id(held) not in seen:
                if held.__qualname__ == qualname:
                    found.append(held)
                else:
                    waiting.append(held)
    return found[0] if len(found) == 1 else None


def _defined(value: Any) -> Tuple[Any, int]:
    """Which definition a found target is, to tell when the program binds it anew: its function,
    and for a method of a module-level instance, that instance (``model = Net()`` run twice;
    by its id: holding it would keep an instance the program dropped alive)."""
    instance = value.__self__ if isinstance(value, types.MethodType) else None
    return _function(value), id(instance)


_NOT_FOUND = object()


def _found(root: Any, path: Sequence[str]) -> Any:
    """What dotted ``path`` names from ``root``, or ``_NOT_FOUND`` (never raises: a trace calls it)."""
    try:
        return _walk(root, path)[1]
    except Exception:  # missing, or an attribute that raises when read
        return _NOT_FOUND


def _walk(root: Any, path: Sequence[str]) -> Tuple[Any, Any]:
    """``(holder, value)``: what dotted ``path`` names from ``root``, and what holds it.

    Raises :class:`BcrecordError` naming the attributes close to a missing one.
    """
    holder = value = root
    for part in path:
        holder = value
        try:
            value = getattr(holder, part)
        except AttributeError:
            raise BcrecordError(
                f"{shown(holder)} has no attribute {part!r}{did_you_mean(part, dir(holder))}"
            ) from None
    return holder, value


def _wrapped_target(texts: Sequence[str], path: Sequence[str], value: Any) -> str:
    """For a target that names a wrapper object (a pytest fixture, ``functools.cache``, a
    ``functools.partial``, a callable object), the target of the function that runs, as a hint
    to add to the refusal; else ``''``.

    >>> import functools
    >>> _wrapped_target(["m:f:x"], ["f"], functools.cache(lambda: 0))
    "; as a target: 'm:f.__wrapped__:x'"
    >>> _wrapped_target(["m:p:x"], ["p"], functools.partial(_wrapped_target, ["m:p:x"]))
    "; as a target: 'bcrecord.runner:_wrapped_target:x'"
    """
    dotted = ".".join(path)
    named = []
    said = "as a target"
    for text in texts:
        # (the parts as parse_target reads them: 'm : f : x' is 'm', 'f', 'x')
        module, _, spec = (part.strip() for part in text.split(":", 2))
        instead = instead_of(module, dotted, value)
        if instead is None:
            return ""
        if instead.endswith(".__call__") and not _has_site(type(value).__call__, spec):
            # (a decorator's object holding the def it was given, click's Command: its
            # __call__ has not the def's locals, the function it holds has)
            held = [
                name
                for name, function in sorted(getattr(value, "__dict__", {}).items())
                if isinstance(function, types.FunctionType) and _has_site(function, spec)
            ]
            if len(held) != 1:
                return ""
            instead = f"{module}:{dotted}.{held[0]}"
            said = f"but its __call__ has no such site: the function it holds as .{held[0]} has, as a target"
        named.append(f"{instead}:{spec}")
    return f"; {said}: " + ", ".join(map(repr, named))


def _has_site(function: Any, spec: str) -> bool:
    """Whether ``spec`` (a short form) names a site of ``function``'s code."""
    try:
        inner = function_of(function)
        resolve([parse(spec)], read(original_code(inner), inner.__qualname__))
    except (BcrecordError, TypeError, AttributeError):
        return False
    return True


def instead_of(module: str, dotted: str, value: Any) -> Optional[str]:
    """``'module:path'`` of the Python function that runs where ``module:dotted`` names
    ``value``, a wrapper of it that cannot itself be patched (``functools.cache``'s, a
    ``functools.partial``, an object of a class with a Python ``__call__``: its class's,
    every object of that class); None for anything else, or where no module reaches it.

    >>> import functools
    >>> instead_of("m", "C.f", functools.cache(lambda: 0)), instead_of("m", "f", instead_of)
    ('m:C.f.__wrapped__', None)
    >>> instead_of("m", "p", functools.partial(instead_of, "m"))
    'bcrecord.runner:instead_of'
    """
    owner = type(value)
    if isinstance(value, (types.FunctionType, type)) or owner.__module__ == "unittest.mock":
        return None  # (a mock's __call__ is Python code too: the refusal says what to do)
    if str(owner.__module__).partition(".")[0] == "numba":
        return None  # (its calls run machine code; numba refuses to compile its function patched)
    if isinstance(getattr(value, "__wrapped__", None), types.FunctionType):
        return f"{module}:{dotted}.__wrapped__"
    if isinstance(value, functools.partial):
        function = value.func
        if not isinstance(function, types.FunctionType) or "<locals>" in function.__qualname__:
            return None
        where = function.__module__
        if where is None:  # made by exec() in globals without a __name__: named where module holds it
            held = sys.modules.get(module)
            if held is None or getattr(held, function.__qualname__, None) is not function:
                return None
            where = module
        return f"{where}:{function.__qualname__}"
    if isinstance(inspect.getattr_static(owner, "__call__", None), types.FunctionType):
        if (
            "<locals>" not in owner.__qualname__
        ):  # (the class, not the instance: Python calls type(x).__call__)
            model = _torch_call(value)  # (a model's __call__ is torch's: its code is forward)
            return f"{owner.__module__}:{owner.__qualname__}.{'forward' if model else '__call__'}"
    return None


def _check_live(target: RunTarget, module: types.ModuleType) -> None:
    """Check ``target`` against an imported module: the attribute must exist, the spec resolve."""
    try:
        _, value = _walk(module, target.path)
    except BcrecordError as error:
        raise RunError(f"target {target.text!r}: {error}") from None
    if isinstance(value, property) and value.fget is not None:  # 'C.p': its getter
        value = value.fget
    if isinstance(value, type):
        raise RunError(_a_class(target, value))
    try:
        func = function_of(value)
        resolve([target.spec], read(original_code(func), func.__qualname__))
    except BcrecordError as error:
        hint = _wrapped_target([target.text], target.path, value)
        raise RunError(f"target {target.text!r}: {error}{hint}") from None


def check_targets(
    targets: Sequence[RunTarget],
    main_code: Optional[types.CodeType] = None,
    main_names: Sequence[str] = ("__main__",),
    main_where: str = "the program",
) -> None:
    """Check each target before the program runs; raise :class:`RunError` on the first bad one.

    Modules are looked up without being imported; a function found in the module's
    code is checked against the spec. ``main_code`` is the program's own code, which the
    targets of a module in ``main_names`` are checked in; ``main_where`` names it in messages.

    >>> check_targets([parse_target("json:dumps:return")])
    >>> check_targets([parse_target("json:loads:nosuch")])
    Traceback (most recent call last):
    ...
    bcrecord.runner.RunError: target 'json:loads:nosuch': loads has no assignment to a local named 'nosuch'; \
assigned locals: cls, s; arguments (their value at entry): kw, object_hook, object_pairs_hook, \
parse_constant, parse_float, parse_int
    >>> check_targets([parse_target("no_such_module.sub:f:x")])
    Traceback (most recent call last):
    ...
    bcrecord.runner.RunError: target 'no_such_module.sub:f:x': no module named 'no_such_module.sub' \
on sys.path as the program starts (a module the program makes importable itself, by sys.path.insert, \
is found with PYTHONPATH set to its folder)
    """
    for target in targets:
        if target.module in main_names:
            if main_code is not None:
                _check_in_code(target, main_code, main_where)
            continue
        module = sys.modules.get(target.module)
        if module is not None:
            _check_live(target, module)
            code = None
        else:
            spec = _module_spec(target.module)
            if spec is None:
                script = f" (the script's own {target.qualname}: '__main__:{target.qualname}:...')"
                path = (
                    " on sys.path as the program starts (a module the program makes importable itself, "
                    "by sys.path.insert, is found with PYTHONPATH set to its folder)"
                )
                raise RunError(
                    f"target {target.text!r}: no module named {target.module!r}"
                    + (script if target.module.endswith(".py") else path + close_modules(target.module))
                )
            code = _module_code(spec)
        if code is not None:
            _check_in_code(target, code, f"module {target.module}")


# --- applying targets when their module is imported ------------------------------------


class _Loader(importlib.abc.Loader):
    """Wraps a module's loader: runs the module, then calls ``after(module)``.

    The module's ``__loader__`` and ``__spec__.loader`` are set back to the real
    loader before the module runs, so the program never sees this wrapper.
    """

    def __init__(
        self,
        loader: Any,
        after: Callable[[types.ModuleType], None],
        failed: Callable[[types.ModuleType, BaseException], None],
    ) -> None:
        self.loader = loader
        self.after = after
        self.failed = failed

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[types.ModuleType]:
        create = getattr(self.loader, "create_module", None)
        return None if create is None else create(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: types.ModuleType) -> None:
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self.loader
        try:
            self.loader.exec_module(module)
        except BaseException as error:
            self.failed(module, error)
            raise
        self.after(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)


class _ImportHook(importlib.abc.MetaPathFinder):
    """A meta path finder that calls ``after(module)`` right after one of ``modules`` is
    executed (to patch the targets in it; the torch layer's Dynamo set-up)."""

    def __init__(self, modules: Sequence[str], after: Callable[[types.ModuleType], None]) -> None:
        self.modules = frozenset(modules)
        self.after = after
        #: Modules whose code raised while being imported, and what it raised.
        self.raised: Dict[str, str] = {}
        self.closed = False
        self._lock = safe_over_forks(threading.Lock())
        #: The module names this hook is finding, per thread: another such hook it asks in
        #: turn asks it back (each asks the finders but itself), which then finds nothing.
        self._finding = threading.local()

    def _failed(self, module: types.ModuleType, error: BaseException) -> None:
        self.raised[module.__name__] = type(error).__name__

    def _first(self) -> None:
        """Be first on ``sys.meta_path`` again, ahead of a finder the program put there since.

        pytest's assertion rewriter goes first, and loads the test modules itself: ahead of
        it, this hook still lets it load them (it asks the finders after it), and patches them.
        """
        meta_path = sys.meta_path
        if meta_path and meta_path[0] is self:
            return
        with self._lock:  # (imports in two threads; the runner closing)
            if self in meta_path and not self.closed:
                # From index i to 0: importlib, iterating the list, goes on at i + 1, unmoved.
                meta_path.remove(self)
                meta_path.insert(0, self)

    def close(self) -> None:
        """Leave ``sys.meta_path`` for good."""
        with self._lock:
            self.closed = True
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Optional[types.ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        self._first()
        finding: Set[str] = self._finding.__dict__.setdefault("names", set())
        if fullname not in self.modules or fullname in finding:
            return None
        finding.add(fullname)
        try:
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                spec = find(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader, self.after, self._failed)
                    return spec  # type: ignore[no-any-return]
            return None
        finally:
            finding.discard(fullname)


# --- the recording that streams values out ---------------------------------------------


#: About how many items :func:`_nbytes` looks at inside one value (the rest are taken to
#: be as large as those looked at): a value is sized as it is recorded, in the program's
#: thread, so a list of lists of lists costs a bounded look, not one per item.
_SIZED_ITEMS = 100


def _nbytes(value: Any, budget: int = _SIZED_ITEMS) -> int:
    """Roughly how many bytes buffering ``value`` holds: a tensor's or array's data, and the
    sum over a container's items (an LSTM's tuple of output and state, a dict of arrays),
    so that a run recording containers of large values writes them as often as it would
    the values alone.

    >>> _nbytes(bytes(1000)) > 1000, _nbytes([bytes(1000)] * 2) > 2000
    (True, True)
    """
    try:
        if hasattr(value, "element_size") and hasattr(value, "nelement"):
            return int(value.element_size() * value.nelement())
        if budget > 0 and isinstance(value, (list, tuple, dict, set, frozenset)) and value:
            items = value.values() if isinstance(value, dict) else value
            return sys.getsizeof(value) + _sampled(items, len(value), budget)
        if budget > 0 and is_dataclass(value) and not isinstance(value, type):  # a model's output object
            items = [getattr(value, field.name, None) for field in fields(value)]
            return _sampled(items, len(items), budget)
        return int(getattr(value, "nbytes", 0)) or sys.getsizeof(value)
    except Exception as error:
        if raised_by_signal_handler(error):
            raise
        return 64


def _sampled(items: Iterable[Any], count: int, budget: int) -> int:
    """The bytes of ``count`` items, from the first few sized, each with its share of ``budget``
    (fewer the deeper: the square root of what is left, so that 4 levels are reached).

    >>> _sampled([bytes(1000)] * 50, 50, 100) > 50_000
    True
    """
    looked = list(itertools.islice(items, min(count, math.isqrt(budget))))
    if not looked:
        return 0
    share = (budget - len(looked)) // len(looked)  # what each may look at inside it
    return sum(_nbytes(item, share) for item in looked) * count // len(looked)


class _Stream(Recording):
    """A recording that hands every N-th value of each key to ``deliver(key, step, value)``.

    The values in between are counted but neither copied nor kept.
    """

    def __init__(self, deliver: Callable[[str, int, Any], None], every: int, copy: str) -> None:
        # only=[]: values of the patches this run makes (:meth:`take`), not the program's own.
        super().__init__(copy=copy, keep="last", threads="all", only=[])
        self._deliver = deliver
        self._every = every
        self._counters: Dict[str, Iterator[int]] = {}
        self._counters_lock = safe_over_forks(threading.Lock())

    def _sink(self, site_id: int, owner: Optional[str] = None) -> Optional[Sink]:
        sink = super()._sink(site_id, owner)
        if sink is None:
            return None
        key = sink.key
        with self._counters_lock:
            counter = self._counters.setdefault(key, itertools.count())
        every, deliver, policy = self._every, self._deliver, sink.policy

        def gate(value: Any) -> Any:
            step = next(counter)
            if step % every:
                return _SKIP
            return step, (policy(value) if callable(policy) else copy_value(value, policy))

        def append(item: Any) -> None:
            if item is not _SKIP:
                deliver(key, item[0], item[1])

        # The gate is the sink's copy: it runs first, and copies only the values kept.
        return Sink(self, key, append, gate, sink.chain)

    def take(self, patch: Patch) -> None:
        """Record the values of ``patch`` too."""
        self._take(patch)

    def counts(self) -> Dict[str, int]:
        """How many times each key fired (saved or not)."""
        # repr(itertools.count(7)) is 'count(7)': read without advancing it.
        return {key: int(repr(counter)[6:-1]) for key, counter in list(self._counters.items())}


#: The environment variable that sets how many seconds values wait at most before they are
#: written (the collector's ``flush_seconds``), for tests only: a test that replaces the writer
#: mid-run needs no write to come early, however slowly a loaded machine runs the program.
_FLUSH_SECONDS_VARIABLE = "_BCRECORD_FLUSH_SECONDS"


def _flush_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """How many seconds values wait at most before they are written: 5, or the test setting.

    >>> _flush_seconds({}), _flush_seconds({"_BCRECORD_FLUSH_SECONDS": "3600"})
    (5.0, 3600.0)
    """
    text = environ.get(_FLUSH_SECONDS_VARIABLE)
    if text is None:
        return 5.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not seconds > 0 or math.isinf(seconds):
        raise RunError(f"{_FLUSH_SECONDS_VARIABLE} must be a positive number of seconds, got {text!r}")
    return seconds


class _Collector:
    """Where values go: batches written with :class:`~bcrecord.storage.Writer`, or a summary."""

    def __init__(
        self,
        writer: Optional[Writer],
        flush_bytes: int = 64 << 20,
        flush_seconds: float = 5.0,
        flush_values: int = 10_000,
    ) -> None:
        self.writer = writer
        self.flush_bytes = flush_bytes
        #: Values written at most in one batch: writing one holds its index entry (some 1.5 kB,
        #: 5 kB for a small tensor), so a million small values (a loss a step) in one batch took
        #: 1.5 GB at the end of the run.
        self.flush_values = flush_values
        self.flush_seconds = flush_seconds
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.buffer: List[Tuple[str, int, Any]] = []
        self.buffered = 0
        self.last_flush = time.monotonic()
        #: Set to stop the thread that writes what waited too long (see start_timer).
        self.stopped = threading.Event()
        self.timer: Optional[threading.Thread] = None
        #: Whether a thread writes what waits (between start_timer and stop_timer).
        self.timing = False
        #: ``timing`` as it was before a fork (see pause): restored after it, in the parent.
        self.timing_before_fork = False
        self.saved: Dict[str, int] = defaultdict(int)
        self.last: Dict[str, Any] = {}
        self.error: Optional[str] = None
        #: Told ``error`` when saving fails, at once (the run may go on for hours, saving nothing).
        self.on_error: Optional[Callable[[str], None]] = None
        #: Values recorded that no write saved: the batch that failed, and every one after it.
        self.unsaved = 0
        #: Per key saved as a repr: its line in ``warnings``, how many values, each reason once.
        self.reprs: Dict[str, Tuple[int, int, List[str]]] = {}
        self.warnings: List[str] = []
        #: The program's ``__main__`` module, noted with its first value: pickle finds the
        #: program's own classes there, also after runpy has put bcrecord's back.
        self.main: Optional[types.ModuleType] = None
        if writer is not None:
            # Reading an action imports ctypes: now, not in the program's first write, where
            # importlib took a timeout's TimeoutError (an OSError) for a file not there.
            _os_action(signal.SIGINT)

    def deliver(self, key: str, step: int, value: Any) -> None:
        if os.getpid() != self.pid:  # a forked child: its values are not ours to write
            return
        if self.main is None:
            self.main = sys.modules.get("__main__")
        with self.lock:
            if self.writer is None:  # (the summary shows each key's last value: not kept once written)
                self.last[key] = value
                self.saved[key] += 1
                return
            if self.error is not None:
                self.unsaved += 1
                return
            self.buffer.append((key, step, value))
            self.buffered += _nbytes(value)
            if (
                self.buffered >= self.flush_bytes
                or len(self.buffer) >= self.flush_values
                or time.monotonic() - self.last_flush >= self.flush_seconds
            ):
                self.flush()
            elif self.timing and self.timer is None:
                self._start_thread()

    def _unsavable(self, key: str, step: int, why: str) -> None:
        """A value the writer kept as its repr: one line per key, which counts them all and
        says each reason (a key's later values may fail for others than its first did)."""
        line, count, whys = self.reprs.get(key) or (len(self.warnings), 0, [])
        if line == len(self.warnings):
            self.warnings.append("")
        if why not in whys and len(whys) < 4:  # (a fourth stands for any more: the line says three)
            whys.append(why)
        self.reprs[key] = line, count + 1, whys
        self.warnings[line] = _repr_note(key, count + 1, whys)

    def flush(self) -> None:
        """Write what is buffered; a failure (a full disk) stops saving but never the program."""
        if os.getpid() != self.pid:  # a forked child (before the lock: another thread may hold it)
            return
        with self.lock:
            if self.writer is None or self.error is not None:
                return
            batch: List[Tuple[str, int, Any]] = []
            try:
                with _SignalsHeld():  # (the batch taken inside: a handler raising then drops none)
                    batch, self.buffer, self.buffered = self.buffer, [], 0
                    self.last_flush = time.monotonic()
                    # Silently: the writer's own calls (json.dumps, os.path...) are not the program's.
                    silently(self._write, batch)
            except Exception as error:
                if raised_by_signal_handler(error):  # the held handler's, run after the write: the program's
                    raise
                self.unsaved += len(batch) + len(self.buffer)  # (none is written after this)
                self.buffer, self.buffered = [], 0
                self.error = (
                    str(error) if isinstance(error, BcrecordError) else f"{type(error).__name__}: {error}"
                )
                if self.on_error is not None:
                    try:
                        self.on_error(self.error)
                    except Exception as telling:  # (a report that fails must not fail the program)
                        if raised_by_signal_handler(telling):
                            raise

    def start_timer(self) -> None:
        """Write buffered values every few seconds also while the program records nothing.

        Values are otherwise written when the next one comes: after a quiet stretch (a
        long evaluation), a program killed then (SIGTERM from a scheduler, SIGKILL)
        would lose what came before it. A thread, not a signal handler: the program's
        own signal handling stays as it was.

        The thread runs only while values wait to be written: a program that joins every
        thread it finds (``threading.enumerate()``) waits a few seconds at most, never for
        good.
        """
        if self.writer is None:
            return
        _PAUSED_FOR_FORKS.add(self)
        with self.lock:
            self.timing = True
            if self.buffer and self.timer is None:
                self._start_thread()

    def _start_thread(self) -> None:
        """Start the thread that writes waiting values (the lock held, none running)."""
        timer = threading.Thread(target=self._write_waiting, name="bcrecord-writer", daemon=True)
        try:
            # Held: a handler raising inside Thread.start (a timeout's) would leave the thread
            # started, but unknown to threading and to this collector.
            with _SignalsHeld():
                # Silently: threading's calls are not the program's (this runs inside a probe).
                silently(lambda _: timer.start(), None)
                self.timer = timer
        except RuntimeError as error:  # at interpreter shutdown: the values wait for close()
            if raised_by_signal_handler(error):
                raise

    def stop_timer(self) -> None:
        _PAUSED_FOR_FORKS.discard(self)
        with self.lock:
            self.timing = False
            timer = self.timer
        if timer is not None:
            self.stopped.set()
            timer.join()

    def pause(self) -> None:
        """Before a fork: stop the writing thread, once the write it may be doing is done.

        A child forked mid-write would hold, for good, the locks the write held (an import's
        lock, torch's allocator's) and could deadlock on them: a DataLoader worker, a
        ``multiprocessing`` child. (Nothing is written here: a Ctrl-C that came during a
        write in a fork hook would be lost, as Python ignores what its fork hooks raise.)
        """
        if os.getpid() != self.pid:
            return
        with self.lock:
            self.timing_before_fork, self.timing = self.timing, False
            timer = self.timer
        if timer is not None:
            self.stopped.set()
            silently(lambda _: timer.join(), None)  # (threading's calls are not the program's)
            with self.lock:
                self.timer = None
                self.stopped.clear()

    def resume(self) -> None:
        """After a fork, in the parent: the writing thread again, where values wait."""
        if os.getpid() != self.pid:
            return
        with self.lock:
            self.timing, self.timing_before_fork = self.timing_before_fork, False
            if self.timing and self.buffer and self.timer is None:
                self._start_thread()

    def _write_waiting(self) -> None:
        silence()  # for good: nothing this thread runs (Event.wait, the writer) is the program's
        while not self.stopped.wait(self.flush_seconds / 2):
            with self.lock:
                if self.buffer and time.monotonic() - self.last_flush >= self.flush_seconds:
                    self.flush()
                if not self.buffer:  # nothing waits: the next value starts another
                    self.timer = None
                    return

    def _write(self, batch: List[Tuple[str, int, Any]]) -> None:
        """One :meth:`~bcrecord.storage.Writer.write_many`: one file pair, one index update."""
        assert self.writer is not None
        if not batch:
            return
        directory = self.writer.directory
        # The program removed it (cleaning its output folder); one not made yet this write makes.
        if self.writer.made and not (directory / "records").is_dir():
            lost = sum(self.saved.values())
            self.writer = Writer(directory)
            self.saved.clear()
            self.warnings.append(
                f"the records directory {directory} was removed while the program ran, and made again"
                + (f": the {lost} value(s) saved in it before are gone" if lost else "")
            )
        with _main_module(self.main):
            self.writer.write_many(_by_step(batch), unsavable=self._unsavable)
        for key, _, _ in batch:
            self.saved[key] += 1


#: The collectors whose writing thread stops while the process forks (see _Collector.pause).
_PAUSED_FOR_FORKS: weakref.WeakSet[_Collector] = weakref.WeakSet()


def _before_fork() -> None:
    for collector in list(_PAUSED_FOR_FORKS):
        collector.pause()


def _after_fork_in_parent() -> None:
    for collector in list(_PAUSED_FOR_FORKS):
        collector.resume()


if hasattr(os, "register_at_fork"):  # (not on Windows, which does not fork)
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent)


@functools.cache
def _libc() -> Any:
    """The C library (loaded once: each load took 30 us, twice a signal a write)."""
    import ctypes

    return ctypes.CDLL(None)


def _os_action(number: int, action: Optional[bytes] = None) -> Optional[bytes]:
    """The OS's action for signal ``number`` (libc's ``struct sigaction``, as bytes), having
    set it to ``action`` if given; None where it cannot be read (no ``sigaction``).

    ``signal.signal`` sets the action anew: it clears what ``signal.siginterrupt(number,
    False)`` asked for (system calls restarted), which only the action read before it
    puts back.

    >>> import signal
    >>> action = _os_action(signal.SIGINT)  # read
    >>> action is None or len(_os_action(signal.SIGINT, action)) == 1024  # set as it was
    True
    """
    if not hasattr(signal, "siginterrupt"):  # (Windows)
        return None
    try:
        import ctypes

        sigaction = _libc().sigaction
        # Room for any libc's struct sigaction (glibc's takes 152 bytes).
        old, new = ctypes.create_string_buffer(1024), action and ctypes.create_string_buffer(action, 1024)
        if sigaction(number, new, old) != 0:
            return None
    except (ImportError, OSError, AttributeError) as error:
        if raised_by_signal_handler(error):  # (a timeout's TimeoutError is an OSError)
            raise
        return None
    return old.raw


def _unsettable(error: BaseException) -> bool:
    """Whether ``signal.signal`` raised ``error`` for a signal it cannot set here (another
    interpreter), not a handler that ran meanwhile (a timeout's ``TimeoutError`` is an OSError)."""
    return isinstance(error, (ValueError, OSError)) and not raised_by_signal_handler(error)


class _SignalsHeld:
    """Run the block with the program's Python signal handlers held back, then run them.

    A write of buffered values in the main thread (where Python runs signal handlers)
    cut short by Ctrl-C, by a SIGTERM handler that exits or a SIGALRM timeout's that
    raises, would lose every value of the batch it was writing (a timeout's ordinary
    exception would also be taken for a failed write, which ends saving); it is over
    in moments, and the signal comes right after. Every signal with a Python handler
    is held: no one knows which a program's handler raises from.

    A class, not a ``contextlib.contextmanager``: what the held handler raises (Ctrl-C's
    ``KeyboardInterrupt``) goes up through this file's frames only, which the program's
    traceback leaves out, and never through contextlib's, which it would show.
    """

    def __init__(self) -> None:
        self.held: List[int] = []
        self.replaced: Dict[int, Any] = {}
        #: The OS's action of each signal replaced, as it was (see _os_action).
        self.actions: Dict[int, Optional[bytes]] = {}
        #: What a handler raised while the others were held or put back.
        self.late: Optional[BaseException] = None

    def __enter__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        number = 0
        try:
            for number in signal.valid_signals():
                handler = signal.getsignal(number)
                if callable(handler):  # the program's (or Python's default_int_handler): not SIG_DFL/SIG_IGN
                    self.actions[number] = _os_action(number)
                    self.replaced[number] = handler  # (first: put back whatever comes next)
                    signal.signal(number, lambda number, frame: self.held.append(number))
        except BaseException as error:
            if _unsettable(error):
                self.replaced.pop(number, None)  # not settable here (another interpreter): as it was
                return
            # A handler not held yet ran meanwhile and raised (a timeout's TimeoutError, an
            # OSError too): the program's, raised as a held one's, after the block.
            self.late = error

    def __exit__(self, *exc_info: Any) -> None:
        # Every one goes back, also where one put back runs meanwhile and raises (a timer's
        # handler): what it raised comes after the rest are back.
        late = self.late
        waiting = dict(self.replaced)
        while waiting:
            number, handler = next(iter(waiting.items()))
            try:
                signal.signal(number, handler)
                action = self.actions.get(number)
                if action is not None:  # as the program set it (its siginterrupt flag)
                    _os_action(number, action)
                del waiting[number]
            except BaseException as error:  # (then put it back again)
                late = late or error
                if _unsettable(error):
                    del waiting[number]  # not settable: no use trying again
        for number in self.held:
            # Its own handler runs now, called as the signal would call it: not raise_signal,
            # which would write to a wakeup fd (asyncio's add_signal_handler) a second time.
            self.replaced[number](number, inspect.currentframe())
        if late is not None:
            raise late


def _owner_names(
    groups: Mapping[str, Mapping[Tuple[str, ...], Any]], main_names: Sequence[str] = ()
) -> Dict[Tuple[str, Tuple[str, ...]], str]:
    """Owner names for targets whose keys would otherwise collide.

    A method's keys start with its class's name: ``enc:Block.forward`` and
    ``dec:Block.forward`` would both give ``Block:forward:...``. Such targets get
    the module-qualified name (``enc.Block``); the rest keep the default. The
    program's own module goes by ``main_names`` (``__main__`` and its file stem):
    one class under both is one class.

    >>> _owner_names({"enc": {("Block", "forward"): []}, "dec": {("Block", "forward"): []}})
    {('enc', ('Block', 'forward')): 'enc.Block', ('dec', ('Block', 'forward')): 'dec.Block'}
    >>> _owner_names({"__main__": {("A", "f"): []}, "prog": {("A", "g"): []}}, ("__main__", "prog"))
    {}
    >>> sorted(set(_owner_names({"__main__": {("A", "f"): []}, "prog": {("A", "g"): []},
    ...                          "enc": {("A", "f"): []}}, ("__main__", "prog")).values()))
    ['__main__.A', 'enc.A']
    """

    def same(module: str) -> str:
        return "__main__" if module in main_names else module

    holders: Dict[str, set] = defaultdict(set)
    for module, paths in groups.items():
        for path in paths:
            holders[path[-2] if len(path) > 1 else module].add((same(module), path[:-1]))
    return {
        (module, path): ".".join([same(module), *path[:-1]])
        for module, paths in groups.items()
        for path in paths
        if len(path) > 1 and len(holders[path[-2]]) > 1
    }


@contextlib.contextmanager
def _main_module(module: Optional[types.ModuleType]) -> Iterator[None]:
    """``module`` as ``sys.modules['__main__']`` for the block (to pickle the program's classes)."""
    current = sys.modules.get("__main__")
    if module is None or module is current:
        yield
        return
    sys.modules["__main__"] = module
    try:
        yield
    finally:
        sys.modules["__main__"] = current  # type: ignore[assignment]


def _by_step(batch: List[Tuple[str, int, Any]]) -> List[Tuple[int, Dict[str, List[Any]]]]:
    """``[(key, step, value)]`` as ``[(step, {key: [values]})]``, steps in order."""
    steps: Dict[int, Dict[str, List[Any]]] = defaultdict(lambda: defaultdict(list))
    for key, step, value in batch:
        steps[step][key].append(value)
    return [(step, dict(steps[step])) for step in sorted(steps)]


def _group_path(target: RunTarget) -> Tuple[str, ...]:
    """The path ``target`` is patched at: 'C.p.fget' is 'C.p', one getter patched once for both."""
    path = target.path
    return path[:-1] if len(path) > 2 and path[-1] == "fget" else path


def _by_other_main_name(
    targets: Sequence[RunTarget], main_names: Sequence[str]
) -> Dict[Tuple[str, Tuple[str, ...], Spec], RunTarget]:
    """``('__main__', path, spec)``: the same target under the program's other name, if given.

    The program's own module is ``__main__`` and its file stem (or ``-m`` name): one
    target given under both names is one target, patched once (under the other name,
    which also covers the script imported by that name).

    >>> both = [parse_target("__main__:f:x"), parse_target("prog:f:x")]
    >>> [twin.text for twin in _by_other_main_name(both, ("__main__", "prog")).values()]
    ['prog:f:x']
    """
    return {
        ("__main__", _group_path(t), t.spec): t
        for t in targets
        if t.module in main_names and t.module != "__main__"
    }


# --- running a program -----------------------------------------------------------------


def _is_runner_frame(filename: str) -> bool:
    """Whether a traceback frame is bcrecord's or runpy's (left out of the program's traceback)."""
    return filename in _RUNNER_FILES or os.path.abspath(filename) in _RUNNER_FILES


#: What probes run: the runtime and the torch layer's copies.
_PROBE_FILES = {
    os.path.join(os.path.dirname(os.path.abspath(__file__)), *parts)
    for parts in (("runtime.py",), ("torch", "copies.py"))
}


def _program_traceback(
    tb: Optional[types.TracebackType], from_a_probe: bool = False
) -> Optional[types.TracebackType]:
    """``tb`` as Python would show it without bcrecord: its frames and runpy's left out.

    ``from_a_probe`` (a ``KeyboardInterrupt``, which a probe lets through, while it
    copied a value): everything from the probe's frame on goes too, so the traceback
    ends at the program's line that ran the probe.

    An ``import`` statement's traceback has no import machinery frames (Python removes
    them), except those before bcrecord's import hook, which broke Python's removal:
    they go too. (``importlib.import_module`` keeps them all, and so does this.)
    """
    kept: List[types.TracebackType] = []
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if from_a_probe and kept and filename in _PROBE_FILES:
            # Raised inside a probe (a Ctrl-C while a value is copied): the program's line
            # that ran it is where it came from; what the probe called is not the program's.
            break
        if _is_runner_frame(filename):
            after = tb.tb_next
            if after is None or not _is_import_frame(after.tb_frame.f_code.co_filename):
                while kept and _is_import_frame(kept[-1].tb_frame.f_code.co_filename):
                    kept.pop()
        else:
            kept.append(tb)
        tb = tb.tb_next
    if not kept:  # (a SyntaxError in the program: its own place is in the error)
        return None
    for frame, after in zip(kept, [*kept[1:], None], strict=True):
        frame.tb_next = after  # (writable since Python 3.7)
    return kept[0]


def _as_the_program_s(error: BaseException) -> None:
    """Every traceback in ``error``'s chain (its causes and contexts) as :func:`_program_traceback`'s."""
    seen: Set[int] = set()
    pending: List[Optional[BaseException]] = [error]
    while pending:
        one = pending.pop()
        if one is None or id(one) in seen:
            continue
        seen.add(id(one))
        # Only an error that is no Exception leaves a probe (it keeps the others to itself).
        one.__traceback__ = _program_traceback(one.__traceback__, not isinstance(one, Exception))
        pending += [one.__cause__, one.__context__]


class _ShowAsTheProgramS:
    """``sys.excepthook`` while ``error`` goes up through bcrecord's frames to Python's top level.

    Python prints an uncaught exception with ``sys.excepthook`` and the frames it went
    through; those are bcrecord's, which this leaves out. Any other exception is shown
    by the hook that was there. Put back at its first call.
    """

    def __init__(self, error: BaseException, hook: Callable[..., Any]) -> None:
        self.error = error
        self.hook = hook
        _as_the_program_s(error)
        #: The program's traceback (frames the error passes through on its way up come before it).
        self.traceback = error.__traceback__

    def __call__(self, kind: type, error: BaseException, tb: Optional[types.TracebackType]) -> None:
        if sys.excepthook is self:
            sys.excepthook = self.hook
        if error is self.error:
            tb = error.__traceback__ = self.traceback
        self.hook(kind, error, tb)


def _without_import_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """``tb`` from its first frame that is not the import machinery's (``__import__``'s are)."""
    while tb is not None and _is_import_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _is_import_frame(filename: str) -> bool:
    """Whether a frame is the import machinery's (``<frozen importlib._bootstrap>`` and the like)."""
    return filename.startswith("<frozen importlib._bootstrap")


def _repr_note(key: str, count: int, whys: Sequence[str]) -> str:
    """The report's line on ``key``'s ``count`` values saved as their repr, for ``whys``.

    >>> _repr_note("f:x@0", 1, ["a meta tensor has no data"])
    'f:x@0: a meta tensor has no data; saved its repr'
    >>> _repr_note("f:x@0", 3, ["a meta tensor has no data", "Lock cannot be pickled (...)"])
    'f:x@0: 3 values saved as their repr: a meta tensor has no data; Lock cannot be pickled (...)'
    >>> _repr_note("f:x@0", 9, [f"reason {n}" for n in range(4)])
    'f:x@0: 9 values saved as their repr: reason 0; reason 1; reason 2; and others'
    """
    if count == 1:
        return f"{key}: {whys[0]}; saved its repr"
    shown_whys = "; ".join(whys[:3]) + ("; and others" if len(whys) > 3 else "")
    return f"{key}: {count} values saved as their repr: {shown_whys}"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _describe(value: Any) -> str:
    """The report's last value: an array's or tensor's class, shape and dtype, anything else's
    repr cut short (never raising: a repr that raises, a ``shape`` that is no sequence).

    >>> _describe(list(range(1000))), _describe("two\\nlines")
    ('[0, 1, 2, 3, 4, 5, ...]', "'two\\\\nlines'")
    """
    try:
        shape = getattr(value, "shape", None)
    except RuntimeError:  # a nested tensor has no one shape
        shape = "nested"
    except Exception:
        shape = None
    try:
        if isinstance(shape, str) and shape == "nested":
            return f"{type(value).__name__} (nested) {str(value.dtype).replace('torch.', '')}"
        if shape is not None:
            dtype = str(getattr(value, "dtype", "")).replace("torch.", "")
            return f"{type(value).__name__} {list(shape)} {dtype}".rstrip()
    except Exception:  # a shape that is a method, a dtype that raises: the repr says what it is
        pass
    text = shown(value)  # one line (a model's repr is its architecture), and not raising
    return text if len(text) <= 60 else text[:57] + "..."


def loaded_chains(code: types.CodeType) -> List[str]:
    """The attribute chains ``code`` loads (``self.fc.weight``), in source order, each once.

    >>> class C:
    ...     def f(self, x):
    ...         return x * self.scale + self.shift
    >>> loaded_chains(C.f.__code__)
    ['self.scale', 'self.shift']
    """
    return list(targets(code).attributes)


def unloaded_chain_note(function: str, chain: str, loaded: Sequence[str], spelt: Optional[str] = None) -> str:
    """``''`` when ``chain`` (an entry target's) is, or is part of, or extends a chain that
    ``function`` loads; else says it loads no such chain, the likely one and those it loads.
    ``spelt`` is ``chain`` as the code spells it, as :func:`loaded_chains` gives them
    (a class's private names mangled: ``self.__w`` is ``self._Net__w``).

    An entry target reads its chain when the function starts, loaded there or not: a
    misspelt one is no error until that read fails (an AttributeError) at run time.

    >>> unloaded_chain_note("C.f", "self.fc.weight", ["self.fc"])
    ''
    >>> unloaded_chain_note("C.f", "self.scal", ["self.scale", "self.fc.weight"])
    "C.f never loads self.scal; did you mean 'self.scale'? (the chains it loads: self.scale, \
self.fc.weight)"
    """
    spelt = spelt or chain
    if any(spelt == one or one.startswith(spelt + ".") or spelt.startswith(one + ".") for one in loaded):
        return ""
    hint = did_you_mean(spelt, loaded, hide_private=False)
    return f"{function} never loads {chain}{hint} (the chains it loads: {', '.join(loaded) or 'none'})"


@dataclass(frozen=True)
class _EntryRead:
    """An entry target's chain and what its function loads (to say why reading it failed)."""

    function: str
    chain: str
    loaded: Tuple[str, ...]
    #: ``chain`` as the code spells it (private names mangled: ``self._Net__w``).
    spelt: str


@dataclass
class _Program:
    """What to run and how ``sys`` should look to it."""

    name: str
    is_module: bool
    argv: List[str]
    path0: str
    main_names: Tuple[str, ...]
    code: Optional[types.CodeType]
    where: str
    #: The script's file: a module imported under the script's stem is patched as
    #: ``__main__`` only if it is this file.
    file: Optional[str] = None
    #: Why the script's source does not compile (Python then fails it as it would).
    uncompiled: Optional[str] = None
    #: The source of a program read from stdin (``-``), run as ``python -`` runs it.
    source: Optional[bytes] = None
    #: A directory or zip program: Python puts it on ``sys.path`` even under ``python -P``.
    bundle: bool = False

    def sys_path(self, path: Sequence[str], running: bool = False) -> List[str]:
        """``sys.path`` as Python gives the program: its folder (:attr:`path0`) in place of the
        first entry, where ``python -m bcrecord`` and the ``bcrecord`` command put the working
        directory. Under ``python -P`` (``PYTHONSAFEPATH``) or ``python -I`` they put none there,
        and Python adds no script's or ``-m``'s folder either: only a directory or zip program's,
        which runpy itself puts first as it runs it (``running``: it is left to runpy, or it is
        there twice).

        >>> prog = _Program("prog.py", False, ["prog.py"], "/app", ("__main__",), None, "prog.py")
        >>> prog.sys_path(["/cwd", "/lib"]) == (["/cwd", "/lib"] if safe_path() else ["/app", "/lib"])
        True
        """
        safe = safe_path()
        rest = list(path) if safe else list(path[1:])
        if self.bundle:
            return rest if running else [self.path0, *rest]
        return rest if safe else [self.path0, *rest]


def safe_path() -> bool:
    """Whether Python puts no script's, ``-m``'s or working directory's folder on ``sys.path``:
    under ``python -P`` (``PYTHONSAFEPATH``), or ``python -I``, which implies it (3.11+) or,
    on 3.10, which has no ``-P``, does it itself.

    >>> import subprocess
    >>> def under(*flags):
    ...     # (-I ignores PYTHONPATH: the child is told where this package is.)
    ...     here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ...     code = f"import sys; sys.path[:0] = [{here!r}]; import bcrecord.runner as r; print(r.safe_path())"
    ...     return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True).stdout
    >>> under("-I"), under("-E")
    ('True\\n', 'False\\n')
    """
    flags = sys.flags
    if flags.isolated:
        return True
    return _versions.current().safe_path_flag and bool(flags.safe_path)  # type: ignore[attr-defined]


def _close_files(path: str) -> str:
    """``"; did you mean 'train.py'?"`` for the files in ``path``'s folder named close to it (as
    ``path`` gives the folder), or ``''``.

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> open(os.path.join(folder, "train.py"), "w").close()
    >>> _close_files(os.path.join(folder, "trian.py")) == f"; did you mean '{folder}/train.py'?"
    True
    """
    folder = os.path.dirname(path)
    try:
        names = os.listdir(folder or os.curdir)
    except OSError:  # (no such folder either)
        return ""
    return did_you_mean(path, [os.path.join(folder, found) for found in names])


def _program(program: str, args: Sequence[str], is_module: bool) -> _Program:
    if is_module:
        argv = sys.argv
        # Parent packages see the argv python -m gives them while it looks for the module.
        sys.argv = ["-m", *args]
        try:
            _import_parent(program)
            spec = importlib.util.find_spec(program)  # imports parent packages, as python -m does
            name = program
            if spec is not None and spec.submodule_search_locations is not None:
                name = program + ".__main__"  # a package runs its __main__ submodule
                spec = importlib.util.find_spec(name)
                if spec is None:
                    raise RunError(
                        f"{program!r} is a package with no __main__ module: it cannot be run with -m"
                    )
        except (ImportError, AttributeError, TypeError, ValueError) as error:  # (as runpy says them)
            if program.endswith(".py"):
                hint = f" (a script? drop -m: bcrecord run ... {program})"
            else:  # (a misspelt package: "No module named 'pkgg'")
                missing = getattr(error, "name", None) if isinstance(error, ModuleNotFoundError) else None
                hint = close_modules(missing) if isinstance(missing, str) else ""
            raise RunError(f"cannot run module {program!r}: {error}{hint}") from None
        finally:
            sys.argv = argv
        if spec is None:
            raise RunError(f"no module named {program!r}{close_modules(program)}")
        code = _module_code(spec)
        return _Program(
            program, True, [program, *args], _working_directory(), ("__main__", name), code, f"module {name}"
        )
    if program == "-":
        return _stdin_program(args)
    if not os.path.exists(program):
        raise RunError(f"no such file: {program!r}{_close_files(program)}")
    if not os.path.isdir(program) and not os.path.isfile(program):
        # A pipe (`bcrecord run ... <(generate)`, /dev/stdin, a FIFO) can be read once: read it
        # now and run what was read, as python reads it once (runpy would find it empty).
        return _read_program(program, args)
    # A directory or zip file runs its __main__.py with itself first on sys.path, as
    # `python app` does: its own modules are found there, and checked there.
    bundle = os.path.isdir(program) or zipfile.is_zipfile(program)
    main_file = program
    if os.path.isdir(program):
        # (its __main__.pyc where it has no __main__.py, as Python's import finds one)
        mains = [os.path.join(program, name) for name in ("__main__.py", "__main__.pyc")]
        main_file = next((path for path in mains if os.path.isfile(path)), mains[0])
        if not os.path.isfile(main_file):
            raise RunError(f"{program!r} is a directory with no __main__.py: there is nothing to run")
    code = None
    uncompiled = None
    if bundle and not os.path.isdir(program):
        try:
            with zipfile.ZipFile(program) as archive:
                # (zipimport runs a __main__.pyc too)
                members = archive.namelist()
                inside = next((name for name in ("__main__.py", "__main__.pyc") if name in members), None)
                if inside is None:
                    raise RunError(f"{program!r} is a zip file with no __main__.py: there is nothing to run")
                source = archive.read(inside)
        except (OSError, zipfile.BadZipFile) as error:
            raise RunError(f"cannot read {program!r}: {error}") from None
        # Checked as a script is (runpy runs the archive's own copy, found on sys.path).
        code, uncompiled = _compiled(source, os.path.join(os.path.abspath(program), inside), read_only=True)
    if os.path.isfile(main_file) and not zipfile.is_zipfile(main_file):
        source = _source_of(main_file)
        code, uncompiled = _compiled(source, main_file, read_only=True)
    stem = os.path.splitext(os.path.basename(program))[0]
    names = ("__main__", stem) if stem.isidentifier() and not bundle else ("__main__",)
    return _Program(
        program,
        False,
        [program, *args],
        # As Python: a script's own folder, a symlink's target's (its siblings are there).
        os.path.abspath(program) if bundle else os.path.dirname(os.path.realpath(program)),
        names,
        code,
        program,
        None if bundle else os.path.realpath(program),
        uncompiled,
        bundle=bundle,
    )


def _compiled(
    source: bytes, filename: str, read_only: bool = False
) -> Tuple[Optional[types.CodeType], Optional[str]]:
    """The code of a program's ``source`` as runpy gets it -- a ``.pyc``'s own (read by its
    magic number, whatever the file's name) or the source compiled -- and why there is none.
    ``read_only``: the code is only read (runpy compiles the program again to run it, and
    shows its compile-time warnings then), so it shows none of them.

    >>> code, why = _compiled(b"x = 1\\n", "prog.py")
    >>> code.co_filename, why
    ('prog.py', None)
    >>> _compiled(b"x = (\\n", "prog.py")[1]
    "SyntaxError: '(' was never closed (prog.py, line 1)"
    """
    try:
        code = pkgutil.read_code(io.BytesIO(source))
        if code is not None:
            return code, None
        with warnings.catch_warnings():
            if read_only:
                warnings.simplefilter("ignore")
            return compile(source, filename, "exec", dont_inherit=True), None
    except (SyntaxError, ValueError, EOFError, TypeError) as error:
        if source[2:4] == b"\r\n" and b"\0" in source[:16]:  # a .pyc's header, another Python's magic
            return None, "RuntimeError: Bad magic number in .pyc file (compiled by another Python version)"
        # (a damaged .pyc, marshal's errors): the program fails as Python would make it fail
        return None, f"{type(error).__name__}: {error}"


def _stdin_program(args: Sequence[str]) -> _Program:
    """The program on stdin, read to its end now (targets are checked against its code), to
    run as ``python -`` runs it: ``sys.argv[0]`` is ``'-'``, ``sys.path[0]`` is ``''`` (the
    working directory), its file is ``<stdin>``, and ``__main__`` its only name."""
    stdin = getattr(sys.stdin, "buffer", sys.stdin)
    if stdin is None:
        raise RunError("the program is '-' (read from stdin), but there is no stdin")
    try:
        source = stdin.read()
    except (OSError, ValueError) as error:  # (closed, or not readable)
        raise RunError(f"cannot read the program from stdin: {error}") from None
    if isinstance(source, str):  # a text stdin without a buffer (one a caller put there)
        source = source.encode()
    code = None
    uncompiled = None
    try:
        code = compile(source, "<stdin>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as error:
        uncompiled = f"{type(error).__name__}: {error}"  # raised again when it runs, as Python does
    where = "the program on stdin"
    return _Program("-", False, ["-", *args], "", ("__main__",), code, where, None, uncompiled, source)


def _absolute(path: str) -> str:
    """``path``, a program file or folder, absolute as Python makes its program's (``__file__``,
    the traceback's file): joined to the working directory, not normalised.

    >>> _absolute("/app/./prog.py"), _absolute("./prog.py") == os.path.join(os.getcwd(), "./prog.py")
    ('/app/./prog.py', True)
    """
    if os.path.isabs(path):
        return path
    if path == "." and _versions.current().dot_is_working_directory:
        return os.getcwd()
    return os.path.join(os.getcwd(), path)


def _main_globals() -> Dict[str, Any]:
    """What Python puts in ``__main__`` before the program's own names (runpy adds ``__name__``,
    ``__file__`` and the rest): the builtins module (runpy's exec would put its dict) and, where
    the version has it, an empty ``__annotations__``, in the order Python puts them.

    >>> list(_main_globals())[-1], _main_globals()["__builtins__"] is builtins
    ('__builtins__', True)
    """
    annotations: Dict[str, Any] = {"__annotations__": {}} if _versions.current().main_annotations else {}
    return {**annotations, "__builtins__": builtins}


def _working_directory() -> str:
    """``os.getcwd()``, or ``''`` where the working directory was removed (python -m runs on then)."""
    try:
        return os.getcwd()
    except OSError:
        return ""


def _import_parent(program: str) -> None:
    """Import the ``-m`` module's parent package as runpy does first: an error its own code
    raises (an ImportError included, one not about the package itself missing) is the
    program's (:class:`_ParentRaised`); a missing package is said when the module is looked up."""
    parent = program.rpartition(".")[0]
    if not parent:
        return
    try:
        __import__(parent)
    except ImportError as error:
        if error.name is None or (error.name != parent and not parent.startswith(error.name + ".")):
            raise _ParentRaised(error) from None
    except Exception as error:
        raise _ParentRaised(error) from None


def _source_of(path: str) -> bytes:
    """The bytes of the program file at ``path``, or a :class:`RunError` that names it."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as error:
        raise RunError(f"cannot read {path!r}: {error.strerror or error}") from None


def _read_program(program: str, args: Sequence[str]) -> _Program:
    """A script that can be read once (a pipe: ``<(generate)``, ``/dev/stdin``, a FIFO), read to
    its end now, to run as ``python <(generate)`` runs it: ``sys.argv[0]`` and its file are the
    path given, ``sys.path[0]`` that path's folder, and ``__main__`` its only name."""
    source = _source_of(program)
    code, uncompiled = _compiled(source, program)
    folder = os.path.dirname(os.path.abspath(program))
    argv = [program, *args]
    return _Program(program, False, argv, folder, ("__main__",), code, program, None, uncompiled, source)


#: What torch.compile imports: the torch layer makes Dynamo skip probes, and all they call.
_DYNAMO = ("torch", "torch._dynamo")


def _torch_layer_for_dynamo(imported: Optional[types.ModuleType] = None) -> None:
    """Import :mod:`bcrecord.torch` once the program has Dynamo (fully imported), before it
    compiles anything: else Dynamo traces into probes and bcrecord's own code (extra graph
    breaks, recompiles). Not for torch alone: it would cost the program Dynamo's import.
    ``imported``: the module whose import just ran its code (still marked as initializing)."""
    torch = sys.modules.get("torch")
    if "torch._dynamo" not in sys.modules or torch is None or "bcrecord.torch" in sys.modules:
        return
    if imported is not torch and getattr(getattr(torch, "__spec__", None), "_initializing", False):
        # torch imports it while itself being imported (torch up to 2.8 does): when torch's
        # code is done, then (this is called again for torch, its code run)
        return
    end = silence()
    try:
        importlib.import_module("bcrecord.torch")
    finally:
        end()


#: ``os``'s functions that replace the process with another program.
_EXEC_FUNCTIONS = ("execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe")


def _descriptor_closed(stream: TextIO) -> bool:
    """Whether ``stream``'s file descriptor was closed under it (``os.close(2)``, as a program
    that detaches from its terminal does): a write there fails, and at exit Python's flush of
    what is left in it turns the exit status into 120. A stream with none (a StringIO) is open.

    >>> import io
    >>> _descriptor_closed(io.StringIO()), _descriptor_closed(sys.__stdout__)
    (False, False)
    """
    try:
        os.fstat(stream.fileno())
    except (AttributeError, ValueError, io.UnsupportedOperation):  # (ValueError: the stream is closed)
        return False
    except OSError:
        return True
    return False


def _os_builtin_module() -> Optional[types.ModuleType]:
    """The built-in module whose functions ``os`` gives as its own: ``posix`` (``nt`` on Windows)."""
    return sys.modules.get(os.name)


class _Runner:
    """Targets, the recording and where values go, for one run of one program.

    :func:`run` is the usual entry point; this class is what it drives:
    :meth:`start` (patch, hook imports, enter the recording), :meth:`execute`
    (run the program, returns its exit status) and :meth:`close` (flush, report).
    """

    def __init__(
        self,
        targets: Sequence[RunTarget],
        program: _Program,
        writer: Optional[Writer],
        every: int = 1,
        copy: str = "clone",
        quiet: bool = False,
        stderr: Optional[TextIO] = None,
        flush_seconds: float = 5.0,
    ) -> None:
        self.targets = list(targets)
        self.program = program
        self.every = every
        self.quiet = quiet
        # Taken now: the program may point sys.stderr at its own log, or close it.
        self._stderr = stderr if stderr is not None else sys.stderr
        self.collector = _Collector(writer, flush_seconds=flush_seconds)
        self.collector.on_error = self._saving_failed
        self.recording = _Stream(self.collector.deliver, every, copy)
        self.patches: List[Patch] = []
        #: The keys each target (by its text) records under, over all its patches.
        self.keys_of: Dict[str, Set[str]] = defaultdict(set)
        self.applied: set = set()
        #: The modules patched once imported (after their own code ran), while the program ran.
        self.patched_on_import: Set[str] = set()
        #: Targets that read a chain when their function starts, by text (see _failure).
        self.entry_reads: Dict[str, _EntryRead] = {}
        self.groups: Dict[str, Dict[Tuple[str, ...], List[RunTarget]]] = defaultdict(
            lambda: defaultdict(list)
        )
        #: Texts of targets that are another's under another name of the program's module:
        #: applied when that one is.
        self.aliases: Dict[str, List[str]] = defaultdict(list)
        named = _by_other_main_name(self.targets, program.main_names)
        for target in self.targets:
            twin = named.get((target.module, _group_path(target), target.spec))
            if twin is not None:
                self.aliases[twin.text].append(target.text)
                continue
            self.groups[target.module][_group_path(target)].append(target)
        self.owners = _owner_names(self.groups, program.main_names)
        watched = [m for m in self.groups if m != "__main__"] + list(_DYNAMO)
        self.hook = _ImportHook(watched, self._after_import)
        self._saved_sys: Optional[Tuple[List[str], List[str]]] = None
        self._trace: Any = None
        self._previous_trace: Any = None
        self._closed = False
        #: True when a target failed to apply and the run was stopped.
        self.aborted = False
        #: Why a definition of a program's target was not patched, where another may be.
        self.refused: Dict[str, str] = {}
        #: What the program's module lacked of a target's path when its code bound it last.
        self.absent: Dict[str, str] = {}
        #: The program's module, and what was ``__main__`` before it was put back there.
        self.program_module: Optional[types.ModuleType] = None
        self._main_before: Optional[types.ModuleType] = None
        #: ``os``'s functions the run replaced (see :meth:`_hook_abrupt_ends`), by name.
        self._abrupt_functions: Dict[str, Callable[..., Any]] = {}

    def _saving_failed(self, error: str) -> None:
        print(
            f"bcrecord: {error}; nothing more is saved in this run, which goes on (the report at its "
            "end says what was saved)",
            file=self.stderr,
            flush=True,
        )

    @property
    def stderr(self) -> TextIO:
        if self._stderr is None or getattr(self._stderr, "closed", False) or _descriptor_closed(self._stderr):
            try:
                # Closed by the program: file descriptor 2, which Python's sys.stderr leaves open.
                self._stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
            except OSError:  # no descriptor 2 either (started with 2>&-): no report
                self._stderr = open(os.devnull, "w")  # noqa: SIM115
        return self._stderr

    # patching ---------------------------------------------------------------------------

    def _apply(
        self, module: types.ModuleType, module_names: Sequence[str], only: Optional[set] = None
    ) -> None:
        end = silence()  # what patching calls (inspect, os.path...) is not the program's
        try:
            self._patch(module, module_names, only)
        finally:
            end()

    def _patch(self, module: types.ModuleType, module_names: Sequence[str], only: Optional[set]) -> None:
        for name in module_names:
            for path, group in self.groups.get(name, {}).items():
                texts = ", ".join(repr(t.text) for t in group)
                if only is not None and not any(t.text in only for t in group):
                    continue
                specs = [t.spec for t in group]
                owner = self.owners.get((name, path))
                value = None
                try:
                    holder, value = _walk(module, path)
                    inner = _undecorated(value, group[0].qualname)
                    if inner is not None:
                        # The def checked before the program started, under a decorator's
                        # wrapper that calls it: in place, keyed as the def would be.
                        default = holder.__name__ if isinstance(holder, type) else None
                        patch = patch_function(inner, specs, name=owner or default)
                    elif isinstance(value, property) or isinstance(holder, property):
                        # A property's getter ('C.p' or 'C.p.fget'): its function, in place
                        # (a property's fget cannot be set), so only where it is defined.
                        getter = value.fget if isinstance(value, property) else value
                        if getter is None:
                            raise BcrecordError(f"{'.'.join(path)} is a property without a getter")
                        if isinstance(holder, type) and path[-1] not in vars(holder):
                            where = next(k for k in holder.__mro__ if path[-1] in vars(k))
                            raise BcrecordError(
                                f"{holder.__name__}.{path[-1]} is a property it inherits from "
                                f"{where.__name__}; its getter records for every class that has "
                                f"it: target '{where.__module__}:{where.__qualname__}.{path[-1]}:...'"
                            )
                        patch = patch_function(getter, specs, name=owner)
                    elif isinstance(value, types.FunctionType) and (
                        isinstance(holder, (*_FUNCTION_HOLDERS, types.FunctionType))
                        or path[-1] == "__wrapped__"
                    ):
                        # A function an object holds ('C.cp.func' of a cached_property, a
                        # partial's 'p.func', 'h.alt' after h.alt = g, the function in C code
                        # around it, 'f.__wrapped__' of functools.cache): no method of it, so
                        # keyed as patch_function keys it (not '_lru_cache_wrapper:__wrapped__').
                        patch = patch_function(value, specs, name=owner)
                    else:
                        # In place, so references taken before the patch record too; but an
                        # inherited method goes on the class named, as patch_method does: in
                        # place in its base, the base's own instances would record under this name.
                        inherited = isinstance(holder, type) and path[-1] not in vars(holder)
                        # An instance's method from its class ('m:model.forward'): in place too (a
                        # pickle of the instance stays clean), keeping that instance's values only:
                        # the others of its class (a teacher, an EMA copy) run the same code.
                        patch_owner: Any = owner
                        if (
                            not isinstance(holder, (type, types.ModuleType))
                            and path[-1] not in (getattr(holder, "__dict__", None) or {})
                            and isinstance(
                                inspect.getattr_static(type(holder), path[-1], None), types.FunctionType
                            )
                        ):
                            patch_owner = _OneInstance.of(
                                holder, owner or type(holder).__name__, _function(value)
                            )
                        patch = patch_method(
                            holder, path[-1], specs, name=patch_owner, in_place=not inherited
                        )
                except (AttributeError, BcrecordError) as error:
                    hint = _wrapped_target([t.text for t in group], path, value)
                    top_level = name in self.program.main_names and len(path) == 1 and not callable(value)
                    if top_level and not hint:
                        hint = (
                            f" (a variable the program's top level assigns: record it inside a function "
                            f"that assigns it, '__main__:that_function:{path[0]}')"
                        )
                    raise _TargetFailed(texts, f"{error}{hint}") from None
                self.patches.append(patch)
                # (3.10's code has no qualified name: its private names are mangled by the function's)
                qualname = patch.function.__qualname__
                for target in group:  # the keys each target's own spec records under
                    labels = [p.label for p in resolve([target.spec], read(patch.original_code, qualname))]
                    self.keys_of[target.text].update(
                        f"{patch.name}:{patch.function_name}:{x}" for x in labels
                    )
                    if isinstance(target.spec, Attribute) and target.spec.at == "entry":
                        chains = tuple(loaded_chains(patch.original_code))
                        spelt = compiled_spec(target.spec, patch.original_code, qualname).target
                        entry = _EntryRead(target.qualname, target.spec.target, chains, spelt)
                        self.entry_reads[target.text] = entry
                self.recording.take(patch)
                self.applied.update(t.text for t in group)
                self.applied.update(a for t in group for a in self.aliases.get(t.text, ()))

    def _after_import(self, module: types.ModuleType) -> None:
        if module.__name__ in _DYNAMO:
            _torch_layer_for_dynamo(module)
            if module.__name__ not in self.groups:
                return
        if self.program.file is not None and module.__name__ in self.program.main_names:
            # A module named like the script: the script imported by name, or another module.
            where = getattr(module, "__file__", None)
            if where is None or os.path.realpath(where) != self.program.file:
                return
        self.patched_on_import.add(module.__name__)
        self._apply(module, [module.__name__])

    def _start_main_trace(self, on_start: Callable[[], None]) -> None:
        """Call ``on_start`` when the program's module code starts (runpy's work is done),
        and patch the program's own targets as its module code defines them.

        A target is patched once its whole path exists (``A.m = _m`` after ``class A``),
        and again each time the program binds it anew (a second ``def step``), up to
        the last line of the module's code that binds it: each definition records.
        """
        groups = [
            (name, path, {t.text for t in group})
            for name in self.program.main_names
            for path, group in self.groups.get(name, {}).items()
        ]
        names, attributes = _last_bindings(self.program.code)
        #: Per group: the last line that may bind it (None: none seen in the code).
        last: Dict[int, Optional[int]] = {}
        for k, (_, path, _) in enumerate(groups):
            lines = [names.get(path[0])] + ([attributes.get(path[-1])] if len(path) > 1 else [])
            last[k] = max((line for line in lines if line is not None), default=None)
        #: Per group: the function patched (or refused) there last; the groups settled.
        seen: Dict[int, Any] = {}
        done: Set[int] = set()
        found: List[types.FrameType] = []

        def apply_defined(frame: types.FrameType) -> None:
            module = sys.modules.get("__main__")
            if module is None or vars(module) is not frame.f_globals:
                module = types.ModuleType("__main__")
                module.__dict__.update(frame.f_globals)  # read-only view for lookups
            line = frame.f_lineno
            for k, (name, path, texts) in enumerate(groups):
                if k in done:
                    continue
                # Bindings still to come: lines up to the last that binds it have not all run.
                bound = last[k]
                more = bound is not None and line is not None and line <= bound
                value = _found(module, path) if path[0] in frame.f_globals else _NOT_FOUND
                if value is not _NOT_FOUND and (k not in seen or seen[k] != _defined(value)):
                    try:
                        self._apply(module, [name], only=texts)
                    except _TargetFailed as error:
                        if not more and not (texts & self.applied):
                            raise
                        # Another definition is to come, or came: that one is the target.
                        self.refused.update(dict.fromkeys(texts, error.reason))
                    # What is there now: a patch may have put a copy there (an inherited method).
                    seen[k] = _defined(_found(module, path))
                if not more and (k in seen or bound is not None):
                    done.add(k)  # patched, and no line left to bind it again (or never to be)
                    if k not in seen and path[0] in frame.f_globals:  # 'A.m': A has no m
                        try:
                            _walk(module, path)
                        except BcrecordError as error:
                            self.absent.update(dict.fromkeys(texts, str(error)))

        # A tracer set before (coverage, a debugger) keeps seeing every frame: each event
        # goes to it first, and what it returns is what the frame keeps once this one stops.
        previous = sys.gettrace()
        theirs: List[Any] = [None]  # its local trace of the program's module frame

        def local(frame: types.FrameType, event: str, arg: Any) -> Any:
            if theirs[0] is not None:
                theirs[0] = theirs[0](frame, event, arg)
            if event in ("line", "return"):
                apply_defined(frame)
                if len(done) == len(groups) or event == "return":
                    self._stop_trace()
                    frame.f_trace = theirs[0]
                    return theirs[0]
            return local

        def global_(frame: types.FrameType, event: str, arg: Any) -> Any:
            traced = None
            if previous is not None:
                traced = previous(frame, cast(Any, event), arg)
                if sys.gettrace() is not global_ and self._trace is global_:
                    sys.settrace(global_)  # it set itself again (coverage's C tracer does)
            # The program's module code (its parent packages were imported by _program);
            # not a module runpy imports (pkgutil), nor namedtuple's exec.
            if found or frame.f_code.co_name != "<module>" or frame.f_globals.get("__name__") != "__main__":
                return traced
            found.append(frame)
            main = sys.modules.get("__main__")
            if main is not None and vars(main) is frame.f_globals:
                self.program_module = main
            script = self.program.file
            source = (
                script is not None
                and not script.endswith(".pyc")
                and os.path.isfile(frame.f_code.co_filename)
            )
            if source and frame.f_globals.get("__loader__") is None:  # (a .py file, or one without a suffix)
                # What `python script.py` gives its module, where runpy's has None and ''.
                loader = importlib.machinery.SourceFileLoader("__main__", frame.f_code.co_filename)
                frame.f_globals.update(__loader__=loader, __package__=None)
            on_start()
            if not groups:
                self._stop_trace()
                return traced
            theirs[0] = traced
            return local

        self._previous_trace = previous
        self._trace = global_
        sys.settrace(global_)

    def _stop_trace(self) -> None:
        if self._trace is not None and sys.gettrace() is self._trace:
            sys.settrace(self._previous_trace)
        self._trace = None

    # the run ----------------------------------------------------------------------------

    def start(self) -> None:
        """Enter the recording, patch loaded modules, hook imports, set ``sys.argv``/``sys.path``."""
        self.recording.__enter__()
        try:
            for name in self.groups:
                module = sys.modules.get(name)
                if module is not None and name not in self.program.main_names:
                    self._apply(module, [name])
        except _TargetFailed as error:
            self.recording.__exit__(None, None, None)
            raise RunError(str(error)) from None
        sys.meta_path.insert(0, self.hook)
        self._hook_abrupt_ends()
        _torch_layer_for_dynamo()
        silently(lambda _: self.collector.start_timer(), None)  # threading's calls are not the program's
        self._saved_sys = (sys.argv[:], sys.path[:])
        sys.argv[:] = self.program.argv
        sys.path[:] = self.program.sys_path(sys.path, running=True)

    def _hook_abrupt_ends(self) -> None:
        """Close the run when the program replaces itself (``os.execv``, ``os.execlp``...) or
        ends with :func:`os._exit` (as a training script may, to skip a slow teardown).

        Either ends the process at once: no ``atexit`` handler runs, so the values waiting
        to be written and the report would be lost. So while the run lasts, these ``os``
        functions are replaced by ones that close it first (in the process the run started
        in only: a forked child's ``os._exit``, as ``multiprocessing`` ends one, is left
        alone). (Each one the program calls: ``os.execvp`` tries each folder of ``PATH`` with
        ``os.execv``, and only a failure of the call the program made is the program's.)
        ``os.execv``, ``os.execve`` and ``os._exit`` are ``posix``'s own (``nt``'s on
        Windows): replaced there too, for a program that calls ``posix._exit``.
        """
        builtin = _os_builtin_module()
        for name in (*_EXEC_FUNCTIONS, "_exit"):
            function = getattr(os, name, None)
            if function is not None:
                self._abrupt_functions[name] = function
                replaced = self._close_first(function)
                setattr(os, name, replaced)
                if builtin is not None and getattr(builtin, name, None) is function:
                    setattr(builtin, name, replaced)

    def _close_first(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` (an exec function, ``os._exit``), closing the run before it is called."""
        ending = "exit" if function.__name__ == "_exit" else "exec"

        @functools.wraps(function)
        def close_then_call(*args: Any, **kwargs: Any) -> Any:
            closing = not self._closed and os.getpid() == self.collector.pid  # (not a forked child's)
            if closing:
                self.close(abrupt=True)
                self.stderr.flush()  # (exec and os._exit write out no buffer)
                if ending == "exit" and self.collector.error is not None and args[:1] == (0,):
                    args = (2,)  # (as for a program that returns: the report says why)
            try:
                return function(*args, **kwargs)
            except BaseException as error:
                if closing:  # the program runs on, unrecorded: say so
                    print(
                        f"bcrecord: the program's os.{function.__name__} raised {type(error).__name__}: "
                        f"bcrecord had ended the run to save its values before the {ending}, so what it "
                        "does from here on is not recorded",
                        file=self.stderr,
                    )
                raise

        return close_then_call

    def execute(self) -> int:
        """Run the program; returns its exit status (a ``SystemExit`` is re-raised as it was)."""
        # runpy's own calls (os.path, pkgutil...) before the program's code are not the program's.
        started = silence()
        # (a file's: a -m module's name needs no working directory, which may have been removed)
        a_file = not self.program.is_module and self.program.source is None
        path = _absolute(self.program.name) if a_file else self.program.name
        given = self.program.argv[0]

        def on_start() -> None:
            # runpy's sys.argv[0] is the absolute path it was given (for __file__, absolute as
            # Python makes it); Python's is the path as the command line gave it.
            if a_file and sys.argv and sys.argv[0] == path:
                sys.argv[0] = given
            started()

        self._start_main_trace(on_start)
        try:
            if self.program.is_module:
                runpy.run_module(self.program.name, _main_globals(), run_name="__main__", alter_sys=True)
            elif self.program.source is not None:
                self._run_read_program()
            else:
                runpy.run_path(path, _main_globals(), run_name="__main__")
            return 0
        except _TargetFailed as error:
            print(f"bcrecord: {error}", file=self.stderr)
            self.aborted = True
            return 2
        except KeyboardInterrupt as error:
            _as_the_program_s(error)  # (re-raised: see run())
            raise
        except (SystemExit, GeneratorExit):
            raise
        except BaseException as error:
            _as_the_program_s(error)
            sys.excepthook(type(error), error, error.__traceback__)
            return 1
        finally:
            started()
            self._stop_trace()
            self.collector.on_error = None  # (the program has ended: the report says it next)
            self.collector.flush()
            if self.program_module is not None and sys.modules.get("__main__") is not self.program_module:
                # runpy put the caller's __main__ back: the program's threads and atexit handlers,
                # which may still run, pickle its classes through it (python script.py keeps it).
                self._main_before = sys.modules.get("__main__")
                sys.modules["__main__"] = self.program_module

    def _run_read_program(self) -> None:
        """Run the program read from stdin (or a pipe) in a new ``__main__`` module, as ``python -``
        (``python <(generate)``) does, and as runpy runs a script: the module is
        ``sys.modules['__main__']`` while it runs."""
        assert self.program.source is not None
        stdin = self.program.name == "-"
        filename = "<stdin>" if stdin else self.program.name
        code = self.program.code
        if code is None:  # its SyntaxError, raised as the program's
            code = compile(self.program.source, filename, "exec", dont_inherit=True)
        module = types.ModuleType("__main__")
        loader = (
            importlib.machinery.BuiltinImporter
            if stdin
            else importlib.machinery.SourceFileLoader("__main__", filename)
        )
        module.__dict__.update(_main_globals())
        module.__dict__.update(__loader__=loader, __file__=filename, __cached__=None)
        before = sys.modules.get("__main__")
        sys.modules["__main__"] = module
        try:
            exec(code, module.__dict__)
        finally:
            if before is not None:
                sys.modules["__main__"] = before

    def close(self, abrupt: bool = False, at_exit: bool = False) -> None:
        """Flush, leave the recording, unhook imports, remove patches, restore ``sys``; report.

        ``abrupt``: the program ends with ``os._exit`` or an exec, which throw away what its
        ``sys.stdout`` holds unwritten: it is not written here either. ``at_exit``: the
        interpreter is ending (an ``atexit`` handler): the program's module stays
        ``sys.modules['__main__']``, which the interpreter then clears as it clears a program's,
        so that its objects end as they would without bcrecord (a file it left open is flushed
        and closed; left to the garbage collector, its text layer could be finalized after
        the buffer under it, and what it held unwritten was lost).
        """
        if self._closed or os.getpid() != self.collector.pid:  # closed, or a forked child exiting
            return
        self._closed = True
        if abrupt:
            # What the program left unwritten in its sys.stderr (half a line) is thrown away by
            # os._exit and exec: the report goes round that buffer, to the descriptor under it.
            self._stderr = _beside(self.stderr)
        self._stop_trace()
        self.collector.stop_timer()
        self.collector.on_error = None  # (the report says it next)
        interrupt: Optional[KeyboardInterrupt] = None
        try:
            self.collector.flush()
        except KeyboardInterrupt as error:
            # Ctrl-C during the last save (held until the batch was written): finish closing
            # (patches removed, the report) first, then let it go on.
            interrupt = error
        if self.recording.active:
            self.recording.__exit__(None, None, None)
        self.hook.close()
        for holder in filter(None, (os, _os_builtin_module())):
            for name, function in self._abrupt_functions.items():
                if (
                    getattr(getattr(holder, name, None), "__wrapped__", None) is function
                ):  # (not the program's)
                    setattr(holder, name, function)
        with warnings.catch_warnings():
            # The program rebinding what it defines (B.m = m2 after B.m was patched) is its own.
            warnings.filterwarnings("ignore", ".* was replaced while patched", RecordingWarning)
            for patch in reversed(self.patches):
                patch.remove()
        if self._saved_sys is not None:
            sys.argv[:], sys.path[:] = self._saved_sys
        if (
            not at_exit
            and self._main_before is not None
            and sys.modules.get("__main__") is self.program_module
        ):
            sys.modules["__main__"] = self._main_before
        try:
            # The program's output first, as a report at exit comes after it (Python flushes
            # the program's stdout only once the atexit handlers, this one too, have run).
            if not abrupt:
                sys.stdout.flush()
        except Exception:  # (closed, or replaced by the program with something else)
            pass
        self.report()
        if interrupt is not None:
            raise interrupt.with_traceback(None)  # (bcrecord's frames: nothing of the program's)

    def close_at_exit(self) -> None:
        """:meth:`close`, as the command line's ``atexit`` handler.

        A Ctrl-C during the last save there (the program has ended; what was being written
        is written first) is said in one line, after the report, as the run's other reports
        are: Python would print it as an error in bcrecord's handler, with bcrecord's frames.
        """
        try:
            self.close(at_exit=True)
        except KeyboardInterrupt:
            print(
                "bcrecord: KeyboardInterrupt during the last save, after the program ended (what was "
                "saved is said above)",
                file=self.stderr,
            )

    # reporting --------------------------------------------------------------------------

    def _why(self, target: RunTarget) -> str:
        """Why ``target`` never applied: its module was not imported, or stopped first."""
        if target.text in self.refused:
            return self.refused[target.text]
        if target.module in self.program.main_names:
            name = ".".join(target.path)
            if self.program.uncompiled is not None:
                return f"the program does not compile ({self.program.uncompiled})"
            module = self.program_module
            if module is not None and _found(module, target.path) is not _NOT_FOUND:
                # Defined, never seen: the tracer that watches the module's lines was taken away.
                return (
                    f"the program defined {name} after it turned off bcrecord's tracing of its "
                    "module's lines (sys.settrace: a debugger or profiler it starts?)"
                )
            missing = self.absent.get(target.text)
            if missing is not None and module is not None:
                try:  # said again from what is there now: a method added later (A.m = f) is close
                    _walk(module, target.path)
                except BcrecordError as error:
                    missing = str(error)
            return f"the program ended before defining {name}" + (f": {missing}" if missing else "")
        raised = self.hook.raised.get(target.module)
        if raised is not None:
            return f"importing {target.module} raised {raised}"
        if target.module in sys.modules:
            return (
                f"{target.module} was imported, but not through bcrecord's import hook (a finder "
                "ahead of it on sys.meta_path, or importlib's exec_module called directly, loaded it)"
            )
        return f"{target.module} was not imported"

    def _failure(self, key: str, errors: List[BaseException]) -> str:
        """Why ``key`` lost ``errors``' values: its entry chain could not be read, or a copy failed."""
        first = errors[0]
        said = f"(the first: {type(first).__name__}: {first})"
        count = self.recording.failures.get(key, len(errors))  # (errors keeps some of them)
        entry = next((e for text, e in self.entry_reads.items() if key in self.keys_of[text]), None)
        # getattr's own AttributeError names the attribute missing: the read failed, not a copy.
        if entry is not None and isinstance(first, AttributeError):
            missing = getattr(first, "name", None)
            if missing is not None and missing in entry.spelt.split(".")[1:]:
                note = unloaded_chain_note(entry.function, entry.chain, entry.loaded, entry.spelt)
                return (
                    f"{count} value(s) not recorded: reading {entry.chain} when "
                    f"{entry.function} starts failed {said}" + (f"; {note}" if note else "")
                )
        return f"{count} value(s) not recorded, their copy failed {said}"

    def report(self) -> None:
        """Print what was recorded (and what never applied) to stderr."""
        out = self.stderr
        if self.aborted:
            return
        for target in [t for t in self.targets if t.text not in self.applied]:
            print(f"bcrecord: target {target.text!r} was never applied: {self._why(target)}", file=out)
        counts = self.recording.counts()
        fired = {key for key, n in counts.items() if n}
        failed: Dict[str, List[BaseException]] = defaultdict(list)
        for record_error in list(self.recording.errors):
            failed[record_error.key].append(record_error.error)
        # Reached: a value came, or came and could not be recorded (said below, key by key).
        heard = {text for text, keys in self.keys_of.items() if keys & (fired | failed.keys())}
        heard |= {alias for text in heard for alias in self.aliases.get(text, ())}
        for target in [t for t in self.targets if t.text in self.applied and t.text not in heard]:
            imported = (
                f"; {target.module} was patched once imported, so calls its own code made while it "
                "was being imported are not recorded"
                if target.module in self.patched_on_import
                else ""
            )
            print(
                f"bcrecord: target {target.text!r} recorded nothing in this process (nothing reached "
                f"it once patched{imported}; child processes, such as DataLoader workers, are not "
                "recorded)",
                file=out,
            )
        for key, errors in failed.items():
            print(f"bcrecord: {key}: {self._failure(key, errors)}", file=out)
        for line in self.collector.warnings:
            print(f"bcrecord: {line}", file=out)
        if self.collector.error is not None:
            print(f"bcrecord: {self.collector.error}", file=out)
        if self.quiet:
            return
        writer = self.collector.writer
        if writer is not None:
            if not writer.made and self.collector.error is None:  # no value came to save: none made
                # (the program may have made it itself: then it is not ours to say unmade)
                made = "" if os.path.lexists(writer.directory) else f", and {writer.directory} was not made"
                print(f"bcrecord: nothing was saved{made or f' to {writer.directory}'}", file=out)
                return
            saved, keys = sum(self.collector.saved.values()), len(self.collector.saved)
            every = "" if self.every == 1 else f", every {_ordinal(self.every)} value"
            done = f"bcrecord: saved {saved} value(s) of {keys} key(s) to {writer.directory}{every}"
            if self.collector.error is not None:
                done += f" before saving failed ({self.collector.unsaved} value(s) recorded were not saved)"
            if saved or self.collector.error is None:
                pasted = shell_quoted(str(writer.directory), getattr(out, "encoding", None))
                done += f"; see them with: bcrecord view {pasted}"
            print(done, file=out)
            return
        if not fired:
            print("bcrecord: nothing was recorded", file=out)
            return
        rows = [("key", "values", "last value")]
        last = self.collector.last
        # Values recorded: what fired less what failed (said above). A key whose copies all
        # failed fired without a value to show.
        failures = self.recording.failures
        rows += [
            (k, str(n - failures.get(k, 0)), _describe(last[k]) if k in last else "- (copy failed)")
            for k, n in counts.items()
            if n
        ]
        late = _save_dir_after_the_program(self.program.argv[1:])
        why = f"{late} came after the program, which took it as its own" if late else "no --save-dir"
        print(f"bcrecord: recorded ({why}, so nothing was saved):", file=out)
        for line in aligned(rows, getattr(out, "encoding", None)):
            print("  " + line, file=out)


def _save_dir_after_the_program(args: Sequence[str]) -> str:
    """The program's first argument that reads as ``run``'s ``--save-dir``, or ``''``.

    After the program they are the program's own (as with ``python -m cProfile``): a summary
    that saved nothing says so, as the program may well have an ``-o`` of its own.

    >>> _save_dir_after_the_program(["--epochs", "2", "-o", "out"])
    "'-o out'"
    >>> _save_dir_after_the_program(["--save-dir=runs/a"]), _save_dir_after_the_program(["-output"])
    ("'--save-dir=runs/a'", '')
    """
    for k, arg in enumerate(args):
        if arg in ("-o", "--save-dir"):
            return repr(" ".join(args[k : k + 2]))
        if arg.startswith("--save-dir="):
            return repr(arg)
    return ""


def _shadowed(folder: str) -> List[str]:
    """Modules of the program's ``folder`` whose names bcrecord has imported from elsewhere.

    Python finds an imported module in ``sys.modules`` first: under ``bcrecord run`` the
    program's own ``platform.py`` is not its ``import platform`` (``python prog.py`` would
    have found it, where Python itself has not imported that name already).
    """
    try:
        entries = os.listdir(folder)
    except OSError:  # a zip program, a folder gone: nothing to compare
        return []
    names = set()
    for entry in entries:
        name = entry[:-3] if entry.endswith(".py") else entry
        if name.isidentifier() and (
            entry.endswith(".py") or os.path.isfile(os.path.join(folder, entry, "__init__.py"))
        ):
            names.add(name)
    found = []
    for name in sorted((names - {"__main__"}) & sys.modules.keys()):  # (a directory program's own)
        origin = getattr(getattr(sys.modules[name], "__spec__", None), "origin", None)
        if name in sys.builtin_module_names or origin in ("built-in", "frozen"):
            continue  # found ahead of any folder: python prog.py does not import the folder's either
        if not _imported_from(sys.modules[name], folder, name):
            found.append(name)
    return found


def _imported_from(module: types.ModuleType, folder: str, name: str) -> bool:
    """Whether ``module`` is the file ``name`` of ``folder`` (a module or a package)."""
    where = getattr(module, "__file__", None)
    return where is not None and os.path.dirname(os.path.abspath(where)) in (
        os.path.abspath(folder),
        os.path.join(os.path.abspath(folder), name),
    )


def _taken_from_the_program(folder: str, modules: Mapping[str, types.ModuleType]) -> List[str]:
    """Modules of the program's ``folder`` that bcrecord imported as its own, before the program starts.

    The ``bcrecord`` command and ``python -m bcrecord`` put the working directory first on
    ``sys.path`` (to find the user's modules): started in the program's folder, bcrecord's own
    ``import shlex`` finds the program's ``shlex.py`` there, and bcrecord may then fail.
    ``modules`` is ``sys.modules`` as bcrecord's run started, before any of the program's.
    """
    return sorted(
        name
        for name, module in modules.items()
        # (bcrecord itself, found there, is the one the program imports too)
        if name not in ("__main__", "bcrecord") and "." not in name and _imported_from(module, folder, name)
    )


def _taken_warning(taken: Sequence[str]) -> str:
    """What bcrecord says where it imported the program's own modules ``taken`` as its own.

    >>> _taken_warning(["shlex"])[:60]
    "bcrecord: warning: bcrecord imported the program's own shlex"
    """
    return (
        f"bcrecord: warning: bcrecord imported the program's own {', '.join(taken)} in place of the "
        "module(s) of that name it uses (the working directory, the program's folder, comes first "
        "on sys.path): it may fail; start bcrecord from another folder (bcrecord run ... DIR/prog.py)"
    )


def taken_from_the_working_directory() -> List[str]:
    """Modules of the working directory that bcrecord imported as its own so far.

    The command line puts the working directory first on ``sys.path`` (unless
    :func:`safe_path`): started in a folder with its own ``platform.py``, bcrecord's
    ``import platform`` gets that one, and bcrecord can fail before :func:`run` has
    looked (the command line then says so, with this list).

    >>> import importlib, tempfile
    >>> here, folder = os.getcwd(), tempfile.mkdtemp()
    >>> _ = open(os.path.join(folder, "its_own.py"), "w").close()
    >>> os.chdir(folder); sys.path.insert(0, "")
    >>> _ = importlib.import_module("its_own")  # as bcrecord would import a module named so
    >>> taken_from_the_working_directory()
    ['its_own']
    >>> _ = sys.path.pop(0), sys.modules.pop("its_own"), os.chdir(here)
    """
    here = _working_directory()
    on_path = bool(here) and any(os.path.abspath(entry or os.curdir) == here for entry in sys.path)
    return _taken_from_the_program(here, dict(sys.modules)) if on_path else []


def _note_earlier_values(writer: Writer, out: TextIO) -> None:
    """Say so where the save directory holds values already: this run's join them."""
    try:
        earlier = writer.saved
    except (BcrecordError, OSError):
        return  # the writer will say what is wrong when it saves
    if earlier:
        print(
            f"bcrecord: {writer.directory} holds {earlier} value(s) saved before; this run's are added "
            "to them (their steps start again at 0)",
            file=out,
        )


def run(
    targets: Sequence[str],
    program: str,
    args: Sequence[str] = (),
    *,
    module: bool = False,
    save_dir: Optional[str] = None,
    every: int = 1,
    copy: str = "clone",
    quiet: bool = False,
    stderr: Optional[TextIO] = None,
    linger: bool = False,
) -> int:
    """Run ``program`` (a script path, or a module name with ``module=True``) recording ``targets``.

    ``args`` are the program's arguments (``sys.argv[1:]`` there); ``save_dir``, ``every``,
    ``copy`` and ``quiet`` are the command line's ``--save-dir``, ``--every`` (it needs
    ``save_dir``), ``--copy`` and ``--quiet``; ``stderr`` is where bcrecord's report goes
    (default: ``sys.stderr`` as the run starts).

    Returns the program's exit status; a :class:`SystemExit` it raises is re-raised
    after the records are flushed. Bad input raises :class:`RunError` before the
    program starts. ``linger=True`` (the command line) keeps recording until the
    interpreter exits -- values from the program's ``atexit`` handlers and from
    threads still running are saved too -- instead of stopping when ``program`` returns.

    >>> import io, os, tempfile
    >>> script = os.path.join(tempfile.mkdtemp(), "prog.py")
    >>> with open(script, "w") as handle:
    ...     _ = handle.write("def square(v):\\n    out = v * v\\n    return out\\n"
    ...                      "print(sum(square(i) for i in range(4)))\\n")
    >>> err = io.StringIO()
    >>> run(["__main__:square:out"], script, stderr=err)
    14
    0
    >>> print(err.getvalue().strip())
    bcrecord: recorded (no --save-dir, so nothing was saved):
      key                    values  last value
      __main__:square:out@0  4       9
    """
    if not isinstance(every, int) or isinstance(every, bool) or every < 1:
        raise RunError(f"--every must be a positive integer, got {every!r}")
    for flag, value in (("module", module), ("quiet", quiet), ("linger", linger)):
        require_bool(flag, value, error=RunError)
    if every != 1 and save_dir is None:  # the summary counts every value: it would do nothing
        raise RunError(f"--every {every} chooses the values to save: give --save-dir DIR too")
    parsed = [parse_target(t) for t in targets]
    if not parsed:
        raise RunError("nothing to record: give at least one --record TARGET")
    flush_seconds = _flush_seconds()
    ours = dict(sys.modules)  # before the program's parent packages (python -m imports them)
    try:
        prog = _program(program, args, module)
    except _ParentRaised as raised:  # its traceback, as python -m shows it (without runpy's frames)
        error = raised.error
        _as_the_program_s(error)
        error.__traceback__ = _without_import_frames(error.__traceback__)
        sys.excepthook(type(error), error, error.__traceback__)
        return 1
    saved_path = sys.path[:]
    sys.path[:] = prog.sys_path(saved_path)  # where the program's own modules are found (checked next)
    try:
        check_targets(parsed, prog.code, prog.main_names, prog.where)
    finally:
        sys.path[:] = saved_path
    # (Its folder's modules are the program's only where its folder is on its sys.path.)
    # (and where there is a folder: a working directory removed meanwhile is none)
    folder = prog.path0 or _working_directory()
    on_path = bool(folder) and prog.path0 in prog.sys_path(saved_path)
    shadowed = _shadowed(folder) if on_path else []
    told = sys.stderr if stderr is None else stderr
    if shadowed and told is not None:  # (None: started without a stderr; print would use stdout)
        names = ", ".join(shadowed)
        print(
            f"bcrecord: warning: the program's folder has module(s) of its own named {names}, which "
            f"bcrecord imported from elsewhere before the program starts: the program's import of "
            "them gets bcrecord's (as for names Python itself imports first); rename the program's "
            "if it needs its own",
            file=told,
        )
    taken = _taken_from_the_program(folder, ours) if on_path else []
    if taken and told is not None:
        print(_taken_warning(taken), file=told)
    # (The directory is made when the first value is saved: a run that saves none makes none.)
    writer = Writer(save_dir, make=False) if save_dir is not None else None
    if writer is not None and not quiet and told is not None:  # (as above: never the program's stdout)
        _note_earlier_values(writer, told)
    runner = _Runner(
        parsed, prog, writer, every=every, copy=copy, quiet=quiet, stderr=stderr, flush_seconds=flush_seconds
    )
    runner.start()
    if linger:
        atexit.register(runner.close_at_exit)
    try:
        status = runner.execute()
    except SystemExit as exit_:
        if runner.collector.error is not None and exit_.code in (0, None):
            raise SystemExit(2) from None  # (as for a program that returns: the report says why)
        raise
    except KeyboardInterrupt as error:
        if linger:  # the command line: Python ends the process as it would have (by SIGINT, after
            # atexit), and shows the traceback as it would have, without bcrecord's frames
            sys.excepthook = _ShowAsTheProgramS(error, sys.excepthook)
        raise
    finally:
        if not linger:
            runner.close()
    if runner.collector.error is not None and status == 0:
        return 2  # (the report says why: at close, or at exit when lingering)
    return status
