"""Apply probes to functions and methods, reversibly.

* :func:`instrument` returns a new function; the original is untouched.
* :func:`patch_method` replaces a method on an instance (only that instance
  changes), a class (all instances) or a module (a module-level function).
* :func:`patch_function` swaps ``func.__code__`` in place, so references held
  elsewhere (registries, callbacks, ``from m import f``) fire too.
* :func:`record_locals` is the decorator form of :func:`instrument`.

Patches are :class:`Patch` objects: context managers whose :meth:`Patch.remove`
restores exactly what was there (the same object, the same code). Two patches of
one method stack and can be removed in any order. Anything that goes wrong is
raised before the target is touched.

A function decorated with :func:`functools.wraps` is recorded inside the function
it wraps (found through ``__wrapped__``); since the wrapper holds that function,
it is patched in place.

>>> class Model:
...     def forward(self, x):
...         y = x + 1
...         return y * 2
>>> import bcrecord
>>> with bcrecord.patch_method(Model, "forward", "y") as patch, bcrecord.recording() as rec:
...     Model().forward(1)
4
>>> rec["Model:forward:y@0"], patch.keys
(2, ('Model:forward:y@0',))
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import inspect
import keyword
import sys
import threading
import types
import weakref
from typing import (
    Any,
    Callable,
    Container,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from ._versions import ARGUMENT_REFERENCES, LocalEvents, carry_local_events, current
from .analysis import ProbePoint, Targets, read, resolve
from .errors import NotPatchableError, SpecError, did_you_mean, shown, warn
from .rewrite import SINKS_GET, code_objects, insert_probes
from .runtime import (
    Site,
    _holds,
    arming,
    hold_sites,
    probe_visible_from,
    refresh,
    register_sites,
    release_sites,
    safe_over_forks,
    track,
    tracked,
    untrack,
)
from .specs import Index, Local, SpecLike, compiled_name, parse_all, require_bool

__all__ = [
    "Patch",
    "instrument",
    "original_code",
    "patch_method",
    "patch_function",
    "record_locals",
    "targets",
]

F = TypeVar("F", bound=Callable[..., Any])
#: The owner part of keys: a name, or a function of the instance (None: not recorded).
Owner = Union[str, Callable[[Any], Optional[str]]]
_MISSING = object()


class _PatchLock:
    """A re-entrant lock that knows how deep its owner is inside it.

    The garbage collector can run a finalizer (:func:`remove_soon`) in the middle
    of a patching section of the same thread, where the re-entrant lock lets it in:
    ``depth`` tells it that it would change a slot halfway through a change.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        #: How many times the owner holds it (only the owner reads or writes it).
        self.depth = 0

    def acquire(self, blocking: bool = True) -> bool:
        if not self._lock.acquire(blocking):
            return False
        self.depth += 1
        return True

    def release(self) -> None:
        self.depth -= 1
        self._lock.release()

    def __enter__(self) -> None:
        self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


_lock = safe_over_forks(_PatchLock(), rank=0)
_BASE_ATTR = "__bcrecord_base__"
_SLOT_ATTR = "__bcrecord_slot__"
#: The functions bcrecord made (:func:`_copy_function`): only theirs are that function's
#: own attributes; ``functools.wraps`` copies them into a wrapper's ``__dict__``.
_copies: weakref.WeakSet[types.FunctionType] = weakref.WeakSet()


def _base_of(func: Any) -> Any:
    """The function ``func`` was copied from, if bcrecord made it (else ``func``)."""
    return getattr(func, _BASE_ATTR, func) if func in _copies else func


def _wrapped(func: Any) -> Optional[types.FunctionType]:
    """The Python function ``func`` wraps (its ``__wrapped__``), or None.

    Through a bound method: ``functools.wraps(obj.method)`` (what ``torch.compile(obj.m)``
    and activation-checkpointing wrappers set on an instance) calls the method's function.
    Through the C wrappers that call the function they hold: a staticmethod or classmethod
    (``functools.wraps`` over one, in a class body) and ``functools.lru_cache``/``cache``.
    A hypothesis ``@given`` test has no ``__wrapped__``: its documented
    ``.hypothesis.inner_test`` is the function it runs for each example.

    >>> import functools
    >>> def logged(f):
    ...     return functools.wraps(f)(lambda *args: f(*args))
    >>> @logged
    ... @functools.lru_cache
    ... def square(v):
    ...     return v * v
    >>> _wrapped(square).__qualname__
    'square'
    """
    inner = getattr(func, "__wrapped__", None)
    if inner is None:
        inner = getattr(getattr(func, "hypothesis", None), "inner_test", None)
    for _ in range(100):  # (a __wrapped__ cycle among C wrappers ends it)
        if isinstance(inner, (types.MethodType, staticmethod, classmethod)):
            inner = inner.__func__
        elif isinstance(inner, _CACHE_WRAPPER):
            inner = getattr(inner, "__wrapped__", None)
        else:
            break
    return inner if isinstance(inner, types.FunctionType) else None


#: ``functools.lru_cache``'s (and ``cache``'s) wrapper: it calls the function it holds on a miss.
_CACHE_WRAPPER = type(functools.lru_cache(maxsize=None)(lambda: None))


def function_of(obj: Any) -> types.FunctionType:
    """The plain Python function behind a function, method, staticmethod or wrapper.

    >>> function_of(len)
    Traceback (most recent call last):
    ...
    bcrecord.errors.NotPatchableError: len is a builtin or C function: it has no bytecode to patch
    """
    func = obj
    if isinstance(func, (staticmethod, classmethod, types.MethodType)):
        func = func.__func__
    if _copy_slot(func) is None:  # a recording copy is a function of its own (see _copy_slot)
        func = _base_of(func)
    seen = set()
    while isinstance(func, types.FunctionType) and id(func) not in seen:  # (a cycle ends it)
        seen.add(id(func))
        inner = _wrapped(func)
        if inner is None:
            break
        func = inner
    if not isinstance(func, types.FunctionType) or _autospecced(func):
        raise NotPatchableError(_why_not_a_function(obj))
    return func


def _autospecced(func: types.FunctionType) -> bool:
    """Whether ``func`` is one ``unittest.mock``'s autospec made (``mock.patch(..., autospec=True)``):
    its code only checks the signature and calls the mock it holds."""
    mock = sys.modules.get("unittest.mock")  # (not imported here: no mock exists without it)
    # (Its code checks the signature, _checksig_: not any function given a mock to hold.)
    return (
        mock is not None
        and isinstance(vars(func).get("mock"), mock.NonCallableMock)
        and "_checksig_" in func.__code__.co_names
    )


def _dispatches(func: types.FunctionType) -> bool:
    """Whether ``func`` is a ``functools.singledispatch`` function (which calls one of many),
    or what a ``singledispatchmethod`` gives where it is read (``obj.method``)."""
    if _dispatching_method(func) is not None:
        return True
    return isinstance(getattr(func, "registry", None), types.MappingProxyType) and callable(
        getattr(func, "dispatch", None)
    )


class _Dispatching:
    @functools.singledispatchmethod
    def method(self, value: Any) -> None:
        pass


#: What a ``singledispatchmethod`` gives where it is read (``obj.method``): a function up to
#: 3.13, an object of a class of functools' own on 3.14.
_DISPATCHING_READ = type(_Dispatching().method)


def _dispatching_method(func: Any) -> Optional[functools.singledispatchmethod[Any]]:
    """The ``functools.singledispatchmethod`` that made ``func`` where it was read, or None.

    (Its ``__wrapped__`` is the default implementation: followed, the others went unrecorded.)
    """
    method = getattr(getattr(func, "register", None), "__self__", None)
    return method if isinstance(method, functools.singledispatchmethod) else None


def outermost_taking_instance(func: types.FunctionType) -> types.FunctionType:
    """The outermost function of a ``functools.wraps`` chain that takes a positional argument.

    What a per-instance patch of a wrapper's return patches: it needs the instance as
    the first argument. Wrappers outside it that take only ``*args`` (deprecation
    shims) are passed through.

    >>> import functools
    >>> def shim(f):
    ...     return functools.wraps(f)(lambda *args, **kwargs: f(*args, **kwargs))
    >>> def doubled(f):
    ...     @functools.wraps(f)
    ...     def wrapper(self, x):
    ...         return 2 * f(self, x)
    ...     return wrapper
    >>> def forward(self, x):
    ...     return x
    >>> outermost_taking_instance(shim(doubled(forward))).__code__.co_name
    'wrapper'
    >>> outermost_taking_instance(shim(forward)) is forward
    True
    """
    inner = getattr(func, "__wrapped__", None)
    while not func.__code__.co_argcount and isinstance(inner, types.FunctionType):
        func, inner = inner, getattr(inner, "__wrapped__", None)
    return func


def a_method_name(methods: Union[type, Iterable[str]]) -> str:
    """The method of a class (or of the ``methods`` named) to give in a message asking for one.

    ``forward`` where there is one, else the first whose name has no leading ``__``, else
    the first (``__init__``).

    >>> class Step:
    ...     def __init__(self): pass
    ...     def step(self): pass
    >>> a_method_name(Step), a_method_name(["__init__", "step", "forward"])
    ('step', 'forward')
    """
    if isinstance(methods, type):
        methods = python_methods(methods)
    names = list(methods)
    own = [name for name in names if name[:2] != "__"]
    if "forward" in own or not names:
        return "forward"
    return own[0] if own else names[0]  # (only special ones: __init__...)


def python_methods(cls: type) -> List[str]:
    """The names of the Python functions of class ``cls``: its own, then those it inherits.

    >>> class Base:
    ...     def step(self): pass
    >>> class Sub(Base):
    ...     def __init__(self): pass
    >>> python_methods(Sub), python_methods(dict)  # (dict's are C code)
    (['__init__', 'step'], [])
    """
    found = (k for klass in cls.__mro__ for k, v in vars(klass).items() if isinstance(v, types.FunctionType))
    return list(dict.fromkeys(found))


def no_python_method(cls: type) -> str:
    """Why a class all of whose methods are C code cannot be patched ('' where it has one).

    >>> no_python_method(dict)
    'dict is a class whose methods are all C code: nothing in it can be patched'
    """
    if python_methods(cls):
        return ""
    return f"{cls.__qualname__} is a class whose methods are all C code: nothing in it can be patched"


def _why_not_a_function(obj: Any) -> str:
    """Why ``obj`` cannot be patched, and what to patch instead."""
    if isinstance(obj, (staticmethod, classmethod)) and not isinstance(obj.__func__, types.FunctionType):
        # staticmethod(functools.lru_cache(f)): what it holds is what cannot be patched, and
        # the class's attribute gives that (its name is the method's).
        return _why_not_a_function(obj.__func__)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if isinstance(obj, property):  # its getter's name has the class (a 3.13 property's own has not)
        name = getattr(obj.fget, "__qualname__", None) or name
    name = name or shown(obj)  # (not a whole module-level dict, a model's architecture)
    if isinstance(obj, type) and no_python_method(obj):
        return no_python_method(obj)
    if isinstance(obj, type):
        method = a_method_name(obj)
        return (
            f"{obj.__name__} is a class: patch one of its methods, "
            f"e.g. patch_method({obj.__name__}, {method!r}, specs)"
        )
    if isinstance(obj, property):
        return _why_not_a_property(obj, name)
    if isinstance(obj, functools.cached_property):
        # (Its function's name has the class, as the attribute the class reads it by.)
        wrapped = getattr(obj.func, "__qualname__", None) or obj.attrname or name
        return (
            f"{wrapped} is a functools.cached_property: patch the function it wraps, "
            f"patch_function({_reached(obj.func, f'{wrapped}.func')}, specs)"
        )
    if isinstance(obj, (functools.partial, functools.partialmethod)):
        called = getattr(obj.func, "__qualname__", None) or repr(obj.func)
        try:
            function_of(obj.func)
        except NotPatchableError as error:  # (partial(int, base=2): int was suggested)
            return f"a functools.{type(obj).__name__} of {called}, which it calls: {error}"
        reached = _reached(obj.func, "")  # (by its own name, where that reaches it)
        how = f"patch_function({reached}, specs)" if reached else "its .func"
        return f"a functools.{type(obj).__name__} of {called}: patch the function it calls, {how}"
    if isinstance(obj, _DISPATCHING_READ):
        obj = _dispatching_method(obj) or obj
    if isinstance(obj, functools.singledispatchmethod):
        default = getattr(obj.func, "__qualname__", None) or repr(obj.func)
        # Read from the class it is a function already: the descriptor is in the class's __dict__.
        owner, _, attribute = default.rpartition(".")
        held = f"{owner.rpartition('.')[2]}.__dict__[{attribute!r}]" if owner else "it"
        return (
            f"{default} is a functools.singledispatchmethod: patch the implementation that runs, "
            f"{held}.func (the default one) or one registered for a type ({held}.dispatcher.registry[type])"
        )
    if isinstance(obj, types.FunctionType) and _dispatches(obj):
        default = _reached(obj.registry[object], "")  # type: ignore[attr-defined]
        if default:  # its qualified name, its default's, names that (it is held under another name)
            return (
                f"this functools.singledispatch function (of {name}) dispatches: patch the implementation "
                f"that runs, the default one ({default}) or one registered for a type "
                "(<dispatcher>.registry[type])"
            )
        return (
            f"{name} is a functools.singledispatch function: patch the implementation that runs, "
            f"the default one ({name}.registry[object]) or one registered for a type ({name}.registry[type])"
        )
    if str(type(obj).__module__).partition(".")[0] == "numba":  # @njit, @vectorize, @cfunc
        # Its calls run machine code, no bytecode; and numba compiles a patched function's probes
        # (when a call compiles it inside a recording), which it refuses: a TypingError.
        return (
            f"{name} is a numba {type(obj).__name__}: its calls run compiled machine code, not the "
            f"Python function's bytecode, so nothing in them can be recorded; record the Python "
            f"function in calls of its own, bcrecord.instrument({name}.__wrapped__, specs)(...) "
            f"(a patch of {name}.__wrapped__ would give numba the probes to compile, which it refuses)"
        )
    if isinstance(getattr(obj, "__wrapped__", None), types.FunctionType):  # functools.lru_cache, cache
        # (or an object of a Python class that functools.update_wrapper made look like one)
        python = isinstance(inspect.getattr_static(type(obj), "__call__", None), types.FunctionType)
        around = "an object of a Python class" if python else "C code"
        inner = _reached(obj.__wrapped__, "")
        if inner:  # its qualified name names the function itself (fast = lru_cache(slow): 'slow')
            return (
                f"this {type(obj).__name__} around {name} is {around} around a Python function: patch "
                f"the function it wraps, patch_function({inner}, specs)"
            )
        return (
            f"{name} is {_a(type(obj).__name__)} ({around} around a Python function): patch the "
            f"function it wraps, patch_function({name}.__wrapped__, specs)"
        )
    if type(obj).__name__ in ("ScriptMethod", "ScriptFunction") and _from_torch(type(obj)):
        return (
            f"{name} is a TorchScript {type(obj).__name__[6:].lower()} (torch.jit.script or trace made "
            "it): its calls run TorchScript, not Python bytecode; record the Python code it was made "
            "from, before scripting or tracing it"
        )
    if isinstance(obj, types.FunctionType) and _autospecced(obj):
        return (
            f"{name} is a unittest.mock autospec function (a mock.patch(..., autospec=True) in force?), "
            "not the Python function: patch the function it stands in for, outside the mock"
        )
    mock = sys.modules.get("unittest.mock")  # (not imported here: no mock exists without it)
    if mock is not None and isinstance(obj, mock.NonCallableMock):
        return (
            f"{name} is a unittest.mock {type(obj).__name__} (a mock.patch in force?), not a Python "
            "function: patch the function it stands in for, outside the mock"
        )
    descriptor = _python_descriptor(obj)
    if descriptor is not None:
        return f"{name} is {descriptor}"
    if inspect.isroutine(obj):  # builtins, method descriptors (dict.get)
        return f"{name} is a builtin or C function: it has no bytecode to patch"
    call = inspect.getattr_static(type(obj), "__call__", None)
    if _torch_call(obj):
        return (
            f"{name} is a torch module, whose __call__ is torch's: patch its forward, "
            f"patch_method({type(obj).__name__}, 'forward', specs)"
        )
    if isinstance(call, types.FunctionType):
        return (
            f"{name} is a callable {type(obj).__name__} object: patch its class's __call__, "
            f"patch_method({type(obj).__name__}, '__call__', specs)"
        )
    if callable(obj):
        return f"{name} is a builtin or C function: it has no bytecode to patch"
    descriptor = _c_descriptor(obj)
    if descriptor is not None:
        return f"{name!s} is {descriptor}"
    return f"{name!s}, {_a(type(obj).__name__)}: only Python functions can be patched"


def _torch_call(obj: Any) -> bool:
    """Whether ``obj`` is a torch module whose ``__call__`` is torch's (its code is ``forward``), not
    one its class defines in Python (``def __call__(self, x)``: that code runs first, around it)."""
    torch = sys.modules.get("torch")  # (not imported here: no model exists without it)
    if torch is None or not isinstance(obj, torch.nn.Module):
        return False
    call = inspect.getattr_static(type(obj), "__call__", None)
    return call is not None and call is inspect.getattr_static(torch.nn.Module, "__call__", None)


def _why_not_a_property(prop: property, name: str) -> str:
    """What to patch instead of the property ``name``: its getter (setter, deleter) function.

    Each is named where its own name reaches it (``x = property(_get_x)``: ``_get_x``),
    else through the property (``name.fget``).
    """
    # (Its setter's and deleter's values too, where it has them: a getter is not all it runs.)
    fget, *others = (_reached(getattr(prop, part), f"{name}.{part}") for part in ("fget", "fset", "fdel"))
    setters = " or ".join(other for other in others if other)
    also = f" (its setter or deleter: {setters})" if setters else ""
    return f"{name} is a property: patch its getter, patch_function({fget or name + '.fget'}, specs){also}"


def _reached(func: Any, through: str) -> str:
    """How a message names ``func`` (None: ''): its qualified name where that reaches it
    from its module, else ``through``.

    >>> _reached(function_of, "no"), _reached(lambda: 0, "through"), _reached(None, "no")
    ('function_of', 'through', '')
    """
    if func is None:
        return ""
    found: Any = sys.modules.get(getattr(func, "__module__", None) or "")
    for part in str(getattr(func, "__qualname__", "<>")).split("."):  # ('<locals>' reaches nothing)
        found = inspect.getattr_static(found, part, None) if found is not None else None
    return str(func.__qualname__) if found is func else through


def _python_descriptor(obj: Any) -> Optional[str]:
    """What to say of ``obj`` if it is a descriptor whose class is Python code, else None.

    (``inspect`` takes one for a method descriptor, as it takes ``dict.get``.)
    """
    if not isinstance(inspect.getattr_static(type(obj), "__get__", None), types.FunctionType):
        return None
    kind = type(obj).__name__
    getter = getattr(obj, "fget", None)
    if isinstance(getter, types.FunctionType):  # a property of its own kind (enum's, DynamicClassAttribute)
        path = _getter(obj)
        how = f"patch_function({path}, specs)" if path else "its .fget"
        return f"{_a(kind)} descriptor around a getter: patch the getter, {how}"
    return (
        f"{_a(kind)} descriptor (an object of a Python class, not a function): patch the function it "
        f"gives where it is read, or its class's __get__, patch_method({kind}, '__get__', specs)"
    )


def _getter(descriptor: Any) -> str:
    """How a message names the getter of a property-like ``descriptor``: through the class that
    defines it (``Enum.__dict__['value'].fget``) where that holds it, else ``''``.

    >>> import enum, types
    >>> _getter(vars(enum.Enum)["value"]), _getter(types.DynamicClassAttribute(lambda self: 0))
    ("Enum.__dict__['value'].fget", '')
    """
    owner, _, attribute = descriptor.fget.__qualname__.rpartition(".")
    holder: Any = sys.modules.get(descriptor.fget.__module__)
    for part in owner.split(".") if owner else ["<>"]:  # ('<locals>' reaches nothing)
        holder = inspect.getattr_static(holder, part, None) if holder is not None else None
    if isinstance(holder, type) and vars(holder).get(attribute) is descriptor:
        return f"{owner}.__dict__[{attribute!r}].fget"
    return ""


def _c_descriptor(obj: Any) -> Optional[str]:
    """What to say of ``obj`` if it is a descriptor written in C that gives a value, not a
    function (a namedtuple's field, a slot), else None.

    >>> import collections
    >>> _c_descriptor(collections.namedtuple("P", "x").x).split(":")[0]
    'a _tuplegetter (C code that gives an attribute its value)'
    """
    if callable(obj) or inspect.getattr_static(type(obj), "__get__", None) is None:
        return None
    return (
        f"{_a(type(obj).__name__)} (C code that gives an attribute its value): it has no bytecode "
        "to patch; record the value where a function reads it, with an attribute spec ('self.x@0')"
    )


def _a(noun: str) -> str:
    """``noun`` with its indefinite article, for messages: ``'an int'``, ``'a Parameter'``."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _default_owner(func: types.FunctionType, bound_to: Any = None) -> str:
    """The class a function is defined in (or bound to), else its module."""
    if bound_to is not None:
        return bound_to.__name__ if isinstance(bound_to, type) else type(bound_to).__name__
    parts = func.__qualname__.split(".")[:-1]
    if parts and parts[-1] != "<locals>":
        return parts[-1]
    return func.__module__ or "<unknown>"


def _own_code(func: types.FunctionType) -> types.CodeType:
    """``func``'s code without probes: an in-place patch's are in ``__code__`` while armed.

    Code set anew while it is patched (IPython's autoreload) is its own: set on it, or on a
    class's or module's stand-in for it, which carries it back to ``func`` when its patch goes.
    """
    slot = _slots.get(("code", id(func))) or _copy_slot(func)
    for stand_in in _stand_ins.get(id(func), ()):
        anew = stand_in.set_anew()
        if anew is not None:
            return anew
    return func.__code__ if slot is None or slot.set_anew() is not None else slot.original_code


def original_code(func: types.FunctionType) -> types.CodeType:
    """``func``'s code as it was before any patch: what to read its targets from.

    Code set anew on it while it is patched (IPython's autoreload) is what it runs then,
    unprobed: that code.

    While a recording takes a patch, ``func.__code__`` is the probed code, whose
    call sites and chains the probes split; this is the code they were made from
    (a patched instance's method included).

    >>> import bcrecord
    >>> def double(v):
    ...     w = 2 * v
    ...     return w
    >>> patch = patch_function(double, "w")
    >>> with bcrecord.recording():
    ...     double.__code__ is original_code(double), original_code(double) is patch.original_code
    (False, True)
    >>> patch.remove()
    """
    with _lock:
        slot = _slots.get(("code", id(func))) or _copy_slot(func) or _stand_in_slot(func)
        if slot is None or slot.follows is None:  # unpatched, patched in place, a recording copy
            return _own_code(func)
        # A stand-in: code set anew on it, or on the function it stands in for (it takes that
        # when a recording starts or ends, see _Slot._follow).
        anew = slot.set_anew()
        return anew if anew is not None else _own_code(slot.base)


def _release_each(site_ids: List[List[int]]) -> None:
    """Release the sites of every patch of a recording copy that has been freed.

    Not while a generator or coroutine it made still runs its probed code: on 3.10 its
    frame does not hold the function, so the copy goes first (see release_sites).
    """
    for ids in site_ids:
        release_sites(ids, once_unheld=True)


def _release_copy(slot: _Slot) -> None:
    """Once a recording copy is freed: release its sites, and let its slot go (its patches, which
    a caller may keep, held it), and with it its probed code and its place among what recordings
    arm (a weak one). No lock: the garbage collector runs this wherever it runs, possibly where a
    thread holds the runtime's locks that another, holding the arming lock, waits for (see
    :func:`remove_soon`). (Arming skips the slot meanwhile: its function is gone.)"""
    _release_each(slot.freed_with_copy or [])
    patches, slot.patches = slot.patches, []
    for patch in patches:
        patch._slot = None  # (removed with the copy: a stacked patch kept is no longer active)
        patch._copy_freed = True
    slot.probed, slot._subsets, slot._put_in = slot.original_code, {}, None


def _copy_slot(func: Any) -> Optional[_Slot]:
    """The slot of a recording copy (:func:`instrument`, :func:`record_locals`), else None.

    Such a copy is what callers hold: patching it patches it in place, its own probes
    kept (the patch stacks in its slot), not the original it was copied from.
    """
    if not isinstance(func, types.FunctionType) or func not in _copies:
        return None
    slot = getattr(func, _SLOT_ATTR, None)
    return slot if isinstance(slot, _Slot) else None


def _stand_in_slot(func: Any) -> Optional[_Slot]:
    """The slot of the patch whose stand-in ``func`` is (what runs in a method's place), else None."""
    slot = _stand_ins_running.get(id(func))
    return slot if slot is not None and slot.live is func else None


def _forget_stand_in(slot: _Slot) -> None:
    """Take ``slot`` out of :data:`_stand_ins_running`, where it is still there (not a later slot's)."""
    if _stand_ins_running.get(id(slot.live)) is slot:
        del _stand_ins_running[id(slot.live)]


def _copy_function(func: types.FunctionType, stand_in: bool = False) -> types.FunctionType:
    """A new function object sharing everything with ``func`` but its identity (and any probes).

    A ``stand_in`` (a patch's, in ``func``'s place until it goes) shares its keyword
    defaults' dict: one changed meanwhile stays. A recording copy has a dict of its own.
    """
    new = types.FunctionType(
        _own_code(func), func.__globals__, func.__name__, func.__defaults__, func.__closure__
    )
    kwdefaults = func.__kwdefaults__
    new.__kwdefaults__ = kwdefaults if stand_in or not kwdefaults else dict(kwdefaults)
    # Not a recording copy's slot: this copy is another function, with probes of its own.
    new.__dict__.update({k: v for k, v in func.__dict__.items() if k not in (_SLOT_ATTR, _BASE_ATTR)})
    for attr in ("__qualname__", "__doc__", "__module__", "__type_params__"):
        if hasattr(func, attr):
            setattr(new, attr, getattr(func, attr))
    attr, annotations = _annotations(func)
    if annotations is not None:
        setattr(new, attr, annotations)
    setattr(new, _BASE_ATTR, func)
    _copies.add(new)
    return new


def _annotations(func: types.FunctionType) -> Tuple[str, Any]:
    """Where ``func``'s annotations are, and what: ``('__annotations__', dict)``, or on 3.14
    ``('__annotate__', function)`` while they are not set as a dict: reading them there
    evaluates them, which raises where they name what is not defined yet (PEP 649).
    """
    for attr in current().function_annotations:
        value = getattr(func, attr, None)
        if value is not None:
            return attr, value
    return "__annotations__", None


def _no_slot() -> None:
    """What a pickled slot loads as (see :meth:`_Slot.__reduce__`)."""
    return None


class _Slot:
    """One place that holds a patched function, and every patch applied to it.

    ``live`` is the function object that runs: a copy of ``base`` (or ``base``
    itself when patching in place). Its code is the original while no recording
    takes its patches, and otherwise the code with the probes of the patches the
    active recordings take (see :mod:`bcrecord.runtime`).
    """

    def __init__(
        self,
        base: types.FunctionType,
        live: types.FunctionType,
        restore: Callable[[], None],
    ) -> None:
        self.base = base
        #: ``live``, or a weak reference to it for a recording copy (see :meth:`hold_weakly`).
        self._live: Any = live
        self.original_code = _own_code(base)
        self.restore = restore
        self.patches: List[Patch] = []
        self.probed = self.original_code
        self.armed = False
        self.key: Any = None
        #: For a recording copy's slot: the site ids of its patches, which its finalizer
        #: releases (a list apart from the slot: the finalizer must not keep it alive).
        self.freed_with_copy: Optional[List[List[int]]] = None
        #: A copy :func:`record_locals` made: a record_locals stacked on it adds to it.
        self.decorated = False
        #: The code ``live`` had when this slot last set it (or was made): another there
        #: means someone else replaced it (``f.__code__ = ...``, IPython's autoreload).
        self._code = live.__code__
        self.replaced = False
        #: A patch's stand-in copy (not a recording copy, which is a function of its own): the
        #: defaults and code it last took from ``base``, whose later ones it takes (see _follow).
        self.follows: Optional[Tuple[Any, Any, types.CodeType]] = None
        # Probed code for subsets of the patches (ids in slot order), built when armed.
        self._subsets: Dict[Tuple[int, ...], types.CodeType] = {}
        #: The code arm() put in and the sys.monitoring local events it carried onto it (3.12+):
        #: disarm() carries back only those a tool changed on it meanwhile.
        self._put_in: Optional[Tuple[types.CodeType, LocalEvents]] = None

    @property
    def live(self) -> Any:  # (a FunctionType, or None; typed so, mypy binds it to a MethodType)
        """The function that runs (None: a recording copy that has been freed)."""
        live = self._live
        return live() if type(live) is weakref.ref else live

    @property
    def of_copy(self) -> bool:
        """Whether this is a recording copy's slot, holding it weakly (see :meth:`hold_weakly`)."""
        return type(self._live) is weakref.ref

    def held_copy(self) -> Tuple[bool, Any]:
        """``(gone, copy)``: for a recording copy's slot, the copy, to hold for a call that its
        finalizer must not run in the middle of (see :meth:`Patch.remove`), or ``gone`` where it
        has been freed (its finalizer has run, or is running). For another slot, nothing held: a
        reference more to a stand-in would make its restore scan the heap for deep copies of it."""
        if not self.of_copy:
            return False, None
        copy = self.live
        return copy is None, copy

    def hold_weakly(self) -> None:
        """Hold ``live``, a recording copy that holds this slot, weakly (its patches, made after
        this, too): no cycle then, so that the copy is freed, and its sites with it, as soon as
        nothing holds it, not at a cyclic collection that a program with a large heap (torch's)
        runs rarely, while each recording entered meanwhile arms every such copy."""
        self._live = weakref.ref(self._live)

    def __reduce__(self) -> Tuple[Callable[[], None], Tuple[()]]:
        # A recording copy holds its slot in its __dict__, which cloudpickle and dill send
        # with the function (joblib, Ray, Dask): it arrives a plain function, recording nothing.
        return _no_slot, ()

    def plan(self, patches: List[Patch]) -> types.CodeType:
        """Build the probed code for ``patches`` without changing anything.

        Each patch keeps its own site ids for life, so rebuilding for another patch
        never silences probes that are running in this patch's code.
        """
        # Probes at one place run in this order: those delivered last after the others.
        patches = [patch for patch in patches if not patch.last] + [patch for patch in patches if patch.last]
        points = [point for patch in patches for point in patch._points]
        if not points:
            return self.original_code
        ids = [site for patch in patches for site in patch._site_ids]
        probed = insert_probes(self.original_code, points).bind(ids)
        # Frames (a suspended generator) may run this code after its patch is gone.
        hold_sites(code_objects(probed), ids)
        return probed

    def install(self, patches: List[Patch], afresh: bool = False) -> None:
        """Put in the code for ``patches``; ``afresh``: no subset's code built before stays
        (built in another order of delivery, or spelled otherwise)."""
        probed = self.plan(patches)
        # A subset's code stays right while its patches stay (their site ids are fixed).
        kept = {id(patch) for patch in patches}
        # Under the runtime's lock: a recording entering in another thread arms this slot,
        # reading the patches and adding the code of a subset of them to _subsets (one it
        # builds meanwhile goes into the table this replaces: hence afresh, not a table emptied
        # before the lock is taken).
        with arming():
            subsets = {} if afresh else self._subsets
            self._subsets = {key: code for key, code in subsets.items() if kept.issuperset(key)}
            self.patches, self.probed = patches, probed
            if self.armed:
                refresh(self)

    def probed_inline(self) -> bool:
        """Whether code built for this slot has inline probes (see :mod:`bcrecord.rewrite`)."""
        return any(
            const is SINKS_GET
            for built in (self.probed, *self._subsets.values())
            for code in code_objects(built)
            for const in code.co_consts
        )

    def code_for(self, wanted: Optional[Container[int]]) -> types.CodeType:
        """The code with the probes of the patches in ``wanted`` (by id; all when None)."""
        if wanted is None:
            return self.probed
        # A loop rather than a generator: this runs each time a recording is entered.
        ids = []
        for patch in self.patches:
            if id(patch) in wanted:
                ids.append(id(patch))
        if len(ids) == len(self.patches):
            return self.probed
        if not ids:
            return self.original_code
        chosen = tuple(ids)
        code = self._subsets.get(chosen)
        if code is None:
            code = self._subsets[chosen] = self.plan([p for p in self.patches if id(p) in chosen])
        return code

    def _follow(self) -> None:
        """Give the stand-in the defaults and code set anew on ``base`` since it was made.

        A patch of one instance copies the class's function: ``M.forward.__defaults__ = ...``
        (a config system) or its ``__code__`` set anew (IPython's autoreload) reach the other
        instances, and this one too; then its new code runs, unprobed (see _replaced). Those
        set through the stand-in itself (``M.m.__defaults__`` under a class patch) stay.
        """
        if self.follows is None:
            return
        base, live = self.base, self.live
        if live is None:
            return
        defaults, kwdefaults, code = base.__defaults__, base.__kwdefaults__, _own_code(base)
        seen_defaults, seen_kwdefaults, seen_code = self.follows
        if defaults is not seen_defaults:
            live.__defaults__ = defaults
        if kwdefaults is not seen_kwdefaults:
            live.__kwdefaults__ = kwdefaults
        self.follows = (defaults, kwdefaults, code)
        if code is not seen_code:  # (with as many free variables: the copy has base's closure)
            live.__code__ = code

    def arm(self, wanted: Optional[Container[int]]) -> None:
        self._follow()
        self.armed = True
        live = self.live
        if live is None:  # (a recording copy freed meanwhile: its slot goes with it)
            return
        code = self.code_for(wanted)
        current = live.__code__
        # (_replaced() called only where the code is not ours: this runs per recording entered.)
        if current is not code and ((current is self._code and not self.replaced) or not self._replaced()):
            live.__code__ = self._code = code
            # (Back to the original: only what a tool changed on the running code; see disarm.)
            put_in = self._put_in
            back = (
                put_in[1]
                if put_in is not None and put_in[0] is current and code is self.original_code
                else None
            )
            self._put_in = (code, carry_local_events(current, code, back))
            if _swap_hook is not None:
                _swap_hook(code, code is not self.original_code, live)

    def disarm(self) -> None:
        self._follow()
        self.armed = False
        live = self.live
        if live is None:
            return
        code = live.__code__
        ours = code is self._code and not self.replaced
        if code is not self.original_code and (ours or not self._replaced()):
            live.__code__ = self._code = self.original_code
            # Only the events a tool changed on the code that ran since it was put in: the
            # original's own stay (a debugger that removed its breakpoint from the code it set it on).
            put_in = self._put_in
            carry_local_events(code, self.original_code, put_in[1] if put_in and put_in[0] is code else None)
            self._put_in = None
            if _swap_hook is not None:
                _swap_hook(code, False, live)

    def set_anew(self) -> Optional[types.CodeType]:
        """The code someone else put in ``live`` since this slot last set it, else None."""
        live = self.live
        code = self._code if live is None else live.__code__
        return None if code is self._code else code

    def stale(self) -> bool:
        """Whether ``live`` runs code set anew (or takes it at the next arm, see _follow), not
        the code its patches were made for: they record nothing of it."""
        if self.set_anew() is not None:
            return True
        return self.follows is not None and _own_code(self.base) is not self.follows[2]

    def _replaced(self) -> bool:
        """Whether someone else put code in ``live`` meanwhile: theirs stays, never swapped.

        Once they put back the code this slot had set, or any it built (a tool that saved
        ``f.__code__`` and restores it, after the recording it saved it in), it is this
        slot's again: else probed code would stay for good.
        """
        live = self.live
        if live is None:
            return False
        current = live.__code__
        if current is not self._code and self._built(current):
            self._code = current
        if self.replaced and current is self._code:
            self.replaced = False
        if not self.replaced and current is not self._code:
            self.replaced = True
            warn(
                f"{live.__qualname__}'s code was replaced while it was patched (its "
                "__code__ set anew: IPython's autoreload does so); bcrecord leaves the new code "
                "in place and records nothing of it: remove the patch and patch it again to record it"
            )
        return self.replaced

    def _built(self, code: types.CodeType) -> bool:
        """Whether this slot built ``code`` for its present patches (or it is the original's)."""
        return code is self.original_code or code is self.probed or _holds(self._subsets.values(), code)

    def release(self) -> None:
        untrack(self)
        try:
            self.disarm()  # (code set anew on it stays the function's until its restore carries it back)
        finally:  # (its warning made an error)
            held = _stand_ins.get(id(self.base), [])
            if self in held:
                held.remove(self)
                if not held:
                    del _stand_ins[id(self.base)]
            for patch in self.patches:
                release_sites(patch._site_ids)
            self.patches = []
            self._subsets = {}


# Slots of live patches, keyed by where they are installed.
_slots: Dict[Tuple[Any, ...], _Slot] = {}
#: The slots of ``_slots`` whose stand-in runs in a method's place, by id of the stand-in
#: (which each holds): found by what runs without a walk over every slot in the process.
_stand_ins_running: Dict[int, _Slot] = {}
#: Slots of the patches of a class's or module's function (by id of the function, which
#: they hold) whose stand-in runs there: code set anew on one (autoreload) is the function's.
_stand_ins: Dict[int, List[_Slot]] = {}

#: See :func:`set_swap_hook`.
SwapHook = Callable[[types.CodeType, bool, types.FunctionType], None]
_swap_hook: Optional[SwapHook] = None


def set_swap_hook(hook: Optional[SwapHook]) -> Optional[SwapHook]:
    """Call ``hook(code, armed, function)`` whenever a patched function's probed code goes in or out.

    ``armed`` is True when ``code`` (code with probes) has just been put in
    ``function``, False when it has just been taken out for the original. For a plug-in whose runtime
    caches what it made of a function's code: ``bcrecord.torch`` keeps
    ``torch.compile``'s cached graphs in step with it. Called with the arming lock
    held. Returns the previous hook.

    >>> previous = set_swap_hook(None)
    >>> _ = set_swap_hook(previous)
    """
    global _swap_hook
    previous, _swap_hook = _swap_hook, hook
    return previous


def respell_inline() -> int:
    """Rebuild the code of live patches whose probes are inline, in the current style.

    Returns how many functions were rebuilt. Probes are spelled when their code is
    built; ``bcrecord.torch`` calls this when imported, so that patches made before
    torch was imported get the call spelling torch.compile can run. Patches and
    their keys stay as they were.

    >>> import bcrecord
    >>> previous = bcrecord.set_probe_style("inline")
    >>> twice = bcrecord.instrument(lambda a: a * 2, "return", name="twice")
    >>> _ = bcrecord.set_probe_style("call")
    >>> respell_inline() >= 1
    True
    >>> with bcrecord.recording() as rec:  # the probed code, spelled as a call now
    ...     twice(4), "__bcrecord_probe__" in twice.__code__.co_names
    (8, True)
    >>> rec["twice:<lambda>:return"]
    8
    >>> _ = bcrecord.set_probe_style(previous)
    """
    rebuilt = 0
    with _lock:
        # Every slot with patches is tracked, keyed or not (instrument() makes its own).
        for slot in tracked():
            if not isinstance(slot, _Slot):
                continue
            gone, held = slot.held_copy()  # (held for the call: see Patch.remove)
            if not gone and slot.patches and slot.probed_inline():
                slot.install(slot.patches, afresh=True)
                rebuilt += 1
    return rebuilt


class Patch:
    """A reversible patch; a context manager that removes itself on exit.

    Attributes: ``target`` (what was patched), ``attribute`` (the method name, or
    None for a function), ``name`` (the owner part of keys), ``specs``, ``keys``
    (every key this patch can record) and ``original_code``.

    >>> import bcrecord
    >>> class Model:
    ...     def forward(self, a):
    ...         out = a + 1
    ...         return out * 2
    >>> model = Model()
    >>> with bcrecord.patch_method(model, "forward", ["out", "return"], name="model") as patch:
    ...     with bcrecord.recording() as rec:
    ...         _ = model.forward(1)
    >>> patch.keys, rec["model:forward:out@0"], patch.active
    (('model:forward:out@0', 'model:forward:return'), 2, False)
    >>> "forward" in vars(model)  # removed: the instance is as it was
    False
    """

    def __init__(
        self,
        slot: _Slot,
        target: Any,
        attribute: Optional[str],
        name: Owner,
        specs: tuple,
        points: tuple,
        function: Optional[str] = None,
    ) -> None:
        self._slot: Optional[_Slot] = slot
        #: What was patched, or a weak reference to it: a recording copy, which holds this
        #: patch through its slot (see _Slot.hold_weakly).
        self._target: Any = target
        if slot.of_copy and target is slot.live:  # (a recording copy's, its own or stacked on it)
            self._target = slot._live
        self.attribute = attribute
        #: What probes name values by: ``name``, or the instance filter an in-place patch of
        #: one instance gets (see :class:`_OneInstance`), which ``name`` shows as its string.
        self._owner = name
        self.name = name.name if isinstance(name, _OneInstance) else name
        self.specs = specs
        self._points: Tuple[ProbePoint, ...] = points
        self.original_code = slot.original_code
        #: The function part of keys: the method's name as patched, else the code's own.
        self.function_name = function or _key_function_name(slot.base, slot.original_code)
        # A per-instance owner is only known when the probe runs: '*' stands for it.
        owner = "*" if callable(self.name) else self.name
        self.keys: Tuple[str, ...] = tuple(f"{owner}:{self.function_name}:{p.label}" for p in points)
        self._site_ids: List[int] = register_sites([self._site(point) for point in points])
        #: Whether its probes run after the other patches' at the same place (:meth:`deliver_last`).
        self.last = False
        #: Whether it went with the recording copy it was made on, freed (see _release_copy).
        self._copy_freed = False

    @property
    def target(self) -> Any:
        """What was patched: a class, instance or module, or a function (None: a recording
        copy that has been freed)."""
        target = self._target
        return target() if type(target) is weakref.ref else target

    def _site(self, point: ProbePoint) -> Site:
        suffix = f":{self.function_name}:{point.label}"
        if callable(self._owner):
            return Site(suffix, point.chain, point.copy, owner=self._owner, tag=id(self))
        return Site(self._owner + suffix, point.chain, point.copy, tag=id(self))

    @property
    def active(self) -> bool:
        """False once removed."""
        return self._slot is not None

    @property
    def _armable(self) -> Optional[_Slot]:
        """What arms this patch's probes (None once removed): a recording that takes this
        patch (``only=``) rearms it alone as it starts and ends (see bcrecord.runtime._rearm)."""
        return self._slot

    @property
    def stale(self) -> bool:
        """Whether the function's code was set anew since it was patched (IPython's autoreload
        does so): the patch records nothing of that code (remove it and patch again)."""
        return self._slot is not None and self._slot.stale()

    @property
    def function(self) -> types.FunctionType:
        """The function object that runs while patched."""
        if self._slot is None:
            raise RuntimeError("this patch has been removed")
        return self._slot.live

    @property
    def code(self) -> types.CodeType:
        """The probed code object (with every patch on the same method)."""
        if self._slot is None:
            raise RuntimeError("this patch has been removed")
        return self._slot.probed

    def deliver_last(self) -> None:
        """Run this patch's probes after those of the method's other patches at the same place.

        For a recording that may end the function at a probe (the torch layer's early
        stop raises there): the other patches' recordings get the value first.

        >>> import bcrecord
        >>> def f(a):
        ...     x = a * 2
        ...     return x
        >>> first = bcrecord.patch_function(f, "x", name="a")
        >>> second = bcrecord.patch_function(f, "x", name="b")
        >>> first.deliver_last()
        >>> with bcrecord.recording() as rec:
        ...     _ = f(1)
        >>> rec.keys()  # in the order the probes ran
        ['b:f:x@0', 'a:f:x@0']
        >>> first.remove(); second.remove()
        """
        with _lock:
            slot = self._slot
            if self.last or slot is None:
                return
            gone, held = slot.held_copy()  # (held for the call: see remove)
            if gone:
                return
            self.last = True
            slot.install(slot.patches, afresh=True)  # (subsets built in the former order)

    def remove(self) -> None:
        """Undo this patch; other patches of the same method stay. Idempotent.

        >>> import bcrecord
        >>> def f(a):
        ...     x = a * 2
        ...     return x
        >>> patch = bcrecord.patch_function(f, ["x"], name="m")
        >>> with bcrecord.recording() as rec:
        ...     _ = f(1)
        ...     patch.remove(); patch.remove()
        ...     _ = f(5)  # not recorded
        >>> rec.all("m:f:x@0"), patch.active
        ([2], False)
        """
        with _lock:
            slot, self._slot = self._slot, None
            if slot is None:
                return
            # A recording copy held for the call: its finalizer, which releases the sites of its
            # patches (this one's while it is among them), runs neither meanwhile nor twice with
            # this. Gone, the copy's finalizer has run or is running: it does that.
            gone, held = slot.held_copy()
            if gone:
                return
            remaining = [p for p in slot.patches if p is not self]
            if slot.freed_with_copy is not None:  # released here, not by the copy's finalizer
                slot.freed_with_copy[:] = [ids for ids in slot.freed_with_copy if ids is not self._site_ids]
            if remaining:
                try:
                    slot.install(remaining)
                finally:  # (a warning made an error there)
                    release_sites(self._site_ids)
                return
            # A warning made an error (-W error) on the way must not leave the stand-in there.
            try:
                slot.release()
            finally:
                try:
                    slot.restore()
                finally:
                    if slot.key is not None and _slots.get(slot.key) is slot:  # (not a later slot's)
                        del _slots[slot.key]
                        _forget_stand_in(slot)

    def __enter__(self) -> Patch:
        if self._slot is None:  # (a second ``with`` of one patch: it would record nothing)
            if self._copy_freed:
                raise RuntimeError(
                    "this patch is of a recording copy (instrument, record_locals) that nothing held, "
                    "freed with its patches: keep the copy in a name while it is patched and called"
                )
            raise RuntimeError(
                "this patch was removed (at the end of an earlier with block, or by remove()), so "
                f"a with block of it would record nothing: patch again ({self!r})"
            )
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __copy__(self) -> Patch:
        """The patch itself: a copy would share its slot, and removing the copy would silence
        it. (A patch is a change made to live objects, as a function is one object: ``copy``
        and ``deepcopy`` of what holds patches, an extractor, a callback, keep them.)

        >>> import copy
        >>> def f(a):
        ...     return a
        >>> patch = patch_function(f, "return")
        >>> copy.copy(patch) is patch, copy.deepcopy([patch])[0] is patch
        (True, True)
        >>> patch.remove()
        """
        return self

    def __deepcopy__(self, memo: Dict[int, Any]) -> Patch:
        return self

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            f"a Patch cannot be pickled: it is a change made to objects of this process ({self!r}); "
            "pickle the recorded values (a Recording pickles) and patch again where they are loaded"
        )

    def __repr__(self) -> str:
        # An instance by its class: its repr may be a whole model's, or fail half-built.
        target = self.target
        if self._copy_freed and target is None:  # (None would read as what was patched)
            where = "a recording copy that was freed"
        elif self.attribute:
            where = f"{self.attribute!r} of {_named(target)}"
        else:
            where = repr(target)
        state = "active" if self.active else "removed"
        return f"<Patch {state} {where}: {', '.join(self.keys)}>"


def _key_function_name(function: types.FunctionType, code: types.CodeType) -> str:
    """The function part of a key: the code's name, or, where that is no name (``'<lambda>'``),
    the one the function was given (``collections.namedtuple``'s ``__new__`` is a lambda).

    >>> square, cube = lambda v: v * v, lambda v: v**3
    >>> square.__name__ = "square"
    >>> _key_function_name(square, square.__code__), _key_function_name(cube, cube.__code__)
    ('square', '<lambda>')
    """
    given = getattr(function, "__name__", None)
    if code.co_name.isidentifier() or not isinstance(given, str) or not given.isidentifier():
        return code.co_name
    return given


def _shown_name(function: Any, code: types.CodeType) -> str:
    """How messages name ``function``, whose code is ``code``: its qualified name, but a
    ``functools.wraps`` wrapper's is the wrapped function's, so its own code's name is said too.

    >>> import functools
    >>> def compute(x):
    ...     return x
    >>> @functools.wraps(compute)
    ... def logged(*args):
    ...     return compute(*args)
    >>> _shown_name(compute, compute.__code__), _shown_name(logged, logged.__code__)
    ('compute', 'logged (a functools.wraps wrapper of compute)')
    """
    name = str(function.__qualname__)
    if "__wrapped__" in getattr(function, "__dict__", {}) and code.co_name != function.__name__:
        return f"{code.co_name} (a functools.wraps wrapper of {name})"
    return name


def _check_recorder_dicts(specs: Any, patched: str, name: Optional[Owner]) -> None:
    """Refuse an MMEngine recorder dict whose ``method`` is not the method patched (``patched``:
    the name its keys give it), or that names a ``model``, or a ``name`` the patch's keys do not
    take (``name``: the patch's): in a RecorderHook config they choose the function and the keys,
    and here would be ignored (another function's local of the same name recorded instead, or
    the keys named otherwise than the config says)."""
    one = isinstance(specs, (str, Mapping)) or not isinstance(specs, Iterable)
    given: Iterable[Any] = [specs] if one else specs
    for spec in given:
        if not isinstance(spec, Mapping):
            continue
        model, owner = spec.get("model"), spec.get("name")
        if model not in (None, ""):
            raise SpecError(
                f"{dict(spec)!r}: model={model!r} chooses the submodule a RecorderHook patches; here "
                "the object patched is given: patch that submodule's method (patch_method("
                f"model.get_submodule({model!r}), ...)), or leave 'model' out"
            )
        if owner is not None and owner != name:
            raise SpecError(
                f"{dict(spec)!r}: name={owner!r} names the keys of a RecorderHook's recorder; here the "
                f"patch's keys are named by its own name=: give name={owner!r} there, or leave "
                "'name' out"
            )
        method = spec.get("method")
        if method is not None and method != patched:
            # (a function by its own name: 'forward = _impl' given as forward is '_impl' here)
            raise SpecError(
                f"{dict(spec)!r}: method={method!r} chooses the method a RecorderHook patches; here "
                f"{patched!r} is patched: patch {method!r} instead, or leave 'method' out (or give "
                f"method={patched!r}, the name its keys give it)"
            )


def _attach(
    slot: _Slot,
    target: Any,
    attribute: Optional[str],
    specs: Any,
    name: Optional[Owner],
    default_name: str,
    function: Optional[str] = None,
) -> Patch:
    """Add a patch to ``slot``; raises (changing nothing) when specs do not resolve."""
    if isinstance(specs, Iterator):  # (read twice: parsed, then its recorder dicts checked)
        specs = tuple(specs)
    parsed = parse_all(specs)
    # Its patches were made for the former code: one for the new would share their slot. So
    # would one of the function a class's or module's patched stand-in had set anew: when
    # that patch goes, the new code is carried back to it, over this patch's probes.
    stale = [s for s in (slot, *_stand_ins.get(id(slot.base), ())) if s.patches and s.stale()]
    if stale:
        raise NotPatchableError(
            f"{slot.base.__qualname__}'s code was replaced while it was patched (its __code__ set "
            "anew: IPython's autoreload does so), so the patches on it record nothing of the new "
            f"code ({', '.join(key for s in stale for patch in s.patches for key in patch.keys)}): remove "
            "them and patch it again"
        )
    _check_recorder_dicts(specs, function or _key_function_name(slot.base, slot.original_code), name)
    if name is not None and not isinstance(name, str) and not callable(name):
        raise SpecError(f"name must be a string or a callable of the instance, got {name!r}")
    if isinstance(name, str) and ":" in name:  # (its keys would read as another owner's and function's)
        raise SpecError(
            f"name {name!r} holds ':', which separates the parts of a key ('<name>:<function>:<target>')"
        )
    points = resolve(parsed, read(slot.original_code, _shown_name(slot.base, slot.original_code)))
    if callable(name):
        if not slot.original_code.co_argcount:
            raise NotPatchableError(
                f"{_shown_name(slot.base, slot.original_code)} takes no positional argument: a per-instance "
                "name needs a method whose first argument is the instance"
            )
        points = tuple(dataclasses.replace(point, with_self=True) for point in points)
    patch = Patch(slot, target, attribute, default_name if name is None else name, parsed, points, function)
    try:
        slot.install(slot.patches + [patch])
    except BaseException:
        if _holds(slot.patches, patch):  # in before a warning made an error (-W error)
            slot.install([p for p in slot.patches if p is not patch])
        release_sites(patch._site_ids)
        raise
    return patch


def remove_all(patches: Sequence[Patch]) -> None:
    """Remove ``patches``, last first.

    >>> class Net:
    ...     def forward(self, x):
    ...         return x
    >>> original = Net.forward
    >>> remove_all([patch_method(Net, "forward", "return")]); Net.forward is original
    True
    """
    patches = list(patches)  # (sliced below: a deque is no sliceable sequence)
    for at, patch in enumerate(reversed(patches)):
        try:
            patch.remove()
        except BaseException:
            # What a signal handler raised, or a warning made an error: the others still go.
            remove_all(patches[: len(patches) - at - 1])
            raise


def remove_soon(patches: Sequence[Patch]) -> None:
    """:func:`remove_all` for finalizers: now if no patching is under way, else just after.

    The garbage collector runs a finalizer wherever it runs, possibly inside code
    that holds the runtime's locks, while another thread holds the patch lock and
    waits for those: waiting here for the patch lock would deadlock both threads.
    It may also run inside a patching section of its own thread (adding a patch to
    the slot it would remove one from). So when patching is under way, a
    short-lived thread removes the patches once it is done.

    >>> class Net:
    ...     def forward(self, x):
    ...         return x
    >>> original = Net.forward
    >>> remove_soon([patch_method(Net, "forward", "return")]); Net.forward is original
    True
    """
    if _lock.acquire(blocking=False):
        try:
            if _lock.depth == 1:  # not inside a patching section of this thread
                remove_all(patches)
                return
        finally:
            _lock.release()
    try:
        threading.Thread(target=remove_all, args=(patches,), name="bcrecord-unpatch", daemon=True).start()
    except RuntimeError:  # interpreter shutdown: nothing left to restore for
        pass


def instrument(func: F, specs: Union[SpecLike, Iterable[SpecLike]], name: Optional[Owner] = None) -> F:
    """A recording copy of ``func``; the original is untouched.

    Bound methods give a bound method of the copy, a ``staticmethod`` or
    ``classmethod`` one of the same kind. ``name`` is the owner part of keys
    (default: the class for methods, else the module), or a function of the first
    positional argument that returns it (see :func:`patch_method`). A copy of a
    recording copy starts from the original code, with its own probes only.

    >>> def area(w, h):
    ...     a = w * h
    ...     return a
    >>> import bcrecord
    >>> recorded = bcrecord.instrument(area, "a", name="geo")
    >>> with bcrecord.recording() as rec:
    ...     recorded(2, 3)
    6
    >>> rec["geo:area:a@0"]
    6
    """
    if callable(name) and isinstance(func, staticmethod):  # (as patch_method refuses it)
        raise NotPatchableError(
            f"{func.__func__.__qualname__} is a staticmethod: it gets no instance, so name= cannot be "
            "a function of the instance; give a string"
        )
    if isinstance(func, (staticmethod, classmethod)):
        return type(func)(instrument(func.__func__, specs, name))  # type: ignore[return-value]
    base = function_of(func)
    if base is not _function_of_shallow(func):
        # A copy of the wrapped function would run without the wrapper's code.
        raise NotPatchableError(
            f"{base.__qualname__} is given inside a wrapper (functools.wraps): a recording copy "
            "of it would drop the wrapper; use patch_function(...), which records it in place "
            "and keeps the wrapper, or apply the wrapper to the recording copy"
        )
    live = _copy_function(base)
    slot = _Slot(base, live, restore=lambda: None)
    slot.hold_weakly()  # (before its patch is made: held in ``live`` here meanwhile)
    _attach(slot, live, None, specs, name, _default_owner(base, getattr(func, "__self__", None)))
    probe_visible_from(base.__globals__)
    # The slot lives as long as the function, which holds it: recordings arm it through a weak
    # set, and it holds the function weakly, so that the function goes as soon as nothing holds it.
    setattr(live, _SLOT_ATTR, slot)
    slot.freed_with_copy = [slot.patches[0]._site_ids]
    # Not at exit (weakref's own exit hook): a copy still held records in the exit handlers after it.
    weakref.finalize(live, _release_copy, slot).atexit = False
    track(slot)
    if isinstance(func, types.MethodType):
        return types.MethodType(live, func.__self__)  # type: ignore[return-value]
    return live  # type: ignore[return-value]


def _indexed(spec: SpecLike, index: Index) -> SpecLike:
    """``spec`` with ``index`` where it is a plain local name (``'x'``, also written ``' x'``:
    the short form takes it so, and the index must not be dropped)."""
    if index is None or not isinstance(spec, str):
        return spec
    name = spec.strip()
    return Local(name, index) if name.isidentifier() and not keyword.iskeyword(name) else spec


def record_locals(*specs: SpecLike, index: Index = None, name: Optional[Owner] = None) -> Callable[[F], F]:
    """Decorator: record locals (names, or any specs) of the decorated function.

    ``index`` applies to the local names given as plain strings (``'x'``, not ``'x@1'``,
    ``'self.a'`` or ``'return'``). ``name`` is as :func:`instrument`'s.

    >>> import bcrecord
    >>> @bcrecord.record_locals("x", index=[0, 2], name="demo")
    ... def f():
    ...     x = 1
    ...     x = 2
    ...     x = 3
    ...     return x
    >>> with bcrecord.recording() as rec:
    ...     f()
    3
    >>> rec.keys()
    ['demo:f:x@0', 'demo:f:x@2']
    """
    if not specs:
        raise SpecError("record_locals needs at least one local name or spec")
    if len(specs) == 1 and callable(specs[0]):
        # @record_locals without its parentheses: the function came as the first spec.
        raise SpecError(
            f"record_locals takes the locals to record, and returns the decorator: write "
            f"@record_locals('x', ...) above the function, not @record_locals (given {specs[0]!r})"
        )
    parsed = tuple(_indexed(spec, index) for spec in specs)
    parse_all(parsed)  # a bad spec is an error here, at the decorator, not at the first call

    def decorate(func: F) -> F:
        inner = func.__func__ if isinstance(func, (staticmethod, classmethod)) else func
        below = _copy_slot(inner)
        if below is not None and below.decorated:
            # Stacked on another record_locals: its copy is the decorated name's alone, so
            # add to it (a copy of it would run without its probes).
            patch_function(inner, parsed, name=name)
            return func
        made = instrument(func, parsed, name=name)
        slot = _copy_slot(function_of(made))
        if slot is not None:
            slot.decorated = True
        return made

    return decorate


def _lookup(holder: Any, attribute: str) -> Tuple[Any, Any]:
    """(raw object found statically, raw object in holder's own __dict__ or _MISSING)."""
    if not isinstance(attribute, str) or not attribute:
        raise NotPatchableError(f"a method name must be a non-empty string, got {attribute!r}")
    kinds = (type, types.ModuleType)
    if isinstance(holder, kinds) and not issubclass(type(holder), kinds):
        # An object proxy (wrapt's ObjectProxy) that passes for a class or module: what is read
        # and written through it is not where Python looks the method up.
        stands_for = "class" if isinstance(holder, type) else "module"
        raise NotPatchableError(
            f"{getattr(holder, '__qualname__', None) or getattr(holder, '__name__', '?')} was given as "
            f"{_a(type(holder).__name__)}, an object proxy standing for a {stands_for}: patch the "
            f"{stands_for} itself (the proxy's __wrapped__, where it has one)"
        )
    try:
        raw = inspect.getattr_static(holder, attribute)
    except AttributeError:
        # Not in a __dict__, but maybe made by __getattr__ (a torch module's parameters and
        # submodules): name what it is rather than call it missing.
        try:
            found = getattr(holder, attribute)
        except Exception:
            found = _MISSING
        if found is not _MISSING:
            raise NotPatchableError(
                f"{_named(holder)}'s {attribute!r} is {_a(type(found).__name__)} (from __getattr__): only "
                "Python functions defined on it or its class can be patched"
            ) from None
        # Only what could be patched is suggested (not a module's '_forward_hooks' dict).
        names = [
            n
            for n in dir(holder)
            if not n.startswith("__") and _could_patch(inspect.getattr_static(holder, n, None))
        ]
        hint = did_you_mean(attribute, names)
        if isinstance(holder, types.MethodType) and not hint:  # (patch_method(model.forward, ...))
            owner, name = holder.__self__, holder.__name__
            of = repr(owner) if isinstance(owner, type) else f"the {type(owner).__name__} instance"
            hint = (
                f" (a bound method: patch_method takes the object holding the method, here {of} that "
                f"{name!r} is bound to: patch_method(it, {name!r}, ...); or patch_function(the bound "
                "method, ...))"
            )
        raise NotPatchableError(f"{_named(holder)} has no attribute {attribute!r}{hint}") from None
    own = vars(holder).get(attribute, _MISSING) if hasattr(holder, "__dict__") else _MISSING
    return raw, own


def _could_patch(found: Any) -> bool:
    """Whether an attribute found statically is a function, method or property (a suggestion)."""
    return callable(found) or isinstance(found, (staticmethod, classmethod, property))


def _named(holder: Any) -> str:
    """``holder`` in a message: a class or module by its repr, an instance by its class
    (a model's repr is its whole architecture)."""
    if isinstance(holder, (type, types.ModuleType)):
        return repr(holder)
    return f"this {type(holder).__name__} instance"


#: What a wrapper installed over a patched attribute holds as ``previous`` where the
#: attribute was absent (see :class:`_Restore`; the torch layer's stopping forward).
ABSENT = _MISSING


#: The stand-ins of removed patches that had been replaced meanwhile (their replacement left):
#: where each was installed, ``(holder, attribute)``. What was there before is kept on the stand-in
#: (under ``_LEFT_ATTR``): held here, it would keep the stand-in, through a class (a method's
#: ``super()`` cell, its namespace), alive for good, and with it the holder.
_left_behind: weakref.WeakKeyDictionary[types.FunctionType, Tuple[Callable[[], Any], str]] = (
    weakref.WeakKeyDictionary()
)
_LEFT_ATTR = "__bcrecord_left__"


def _put_back_left(obj: Any = None, method: Optional[str] = None, stand_in: Any = None) -> None:
    """Put back what a removed patch had patched where its stand-in, left because something
    replaced it meanwhile, came back (a ``mock.patch`` that ended after the patch was removed
    restores what it replaced): ``obj``'s ``method`` (a class's: its instances' too), or
    wherever ``stand_in`` is. Called under the patch lock, before patching there anew.
    """
    for left, (held, attribute) in list(_left_behind.items()):
        holder = held()
        if holder is None:
            _left_behind.pop(left, None)
            vars(left).pop(_LEFT_ATTR, None)
            continue
        if stand_in is not None:
            if left is not stand_in:
                continue
        elif attribute != method or not _reaches(obj, holder):
            continue
        if _unwrap_installed(vars(holder).get(attribute, _MISSING)) is not left:
            continue  # (not back there, or not yet: the replacement is still in force)
        del _left_behind[left]
        if _LEFT_ATTR not in vars(left):  # its __dict__ set anew (autoreload's): it runs the new code, left
            continue
        own = vars(left).pop(_LEFT_ATTR)
        if not isinstance(holder, (type, types.ModuleType)):
            _put(vars(holder), attribute, own)
        elif own is _MISSING:
            delattr(holder, attribute)
        else:
            setattr(holder, attribute, own)


def _reaches(obj: Any, holder: Any) -> bool:
    """Whether a patch of ``obj``'s method may meet what ``holder`` holds under that name:
    ``holder`` itself, an instance of the class ``obj``, or the class (or a base class) of
    the instance or class ``obj``, whose method it finds there (its instances and subclasses)."""
    # By the classes' own MROs: isinstance would ask the classes (a Protocol's refuses).
    if holder is obj or (isinstance(obj, type) and obj in type(holder).__mro__):
        return True
    if not isinstance(holder, type):
        return False
    return holder in (obj.__mro__ if isinstance(obj, type) else type(obj).__mro__)


class _Restore:
    """Puts back exactly what ``holder`` had under ``attribute``: ``own``, or nothing.

    Only where ``ours`` (what the patch put there) still is: a later assignment (a
    user's, another library's hook) is theirs to keep, and is left, with a warning. A
    bcrecord wrapper put over ``ours`` (``_bcrecord_runs_wrapped``, holding it as
    ``previous``) is told to put back ``own`` itself when it goes. Copies of ``holder``
    made meanwhile that hold the patched method get ``own`` too.
    """

    def __init__(self, holder: Any, attribute: str, own: Any, ours: Any) -> None:
        self.holder, self.attribute, self.own, self.ours = holder, attribute, own, ours
        stand_in = _unwrap_installed(ours)
        #: What the stand-in started with: changes made through it go to the original.
        self.given = ({name: getattr(stand_in, name, _MISSING) for name in _CARRIED}, dict(vars(stand_in)))
        #: Its annotations then, unevaluated where they are lazy (3.14).
        self.annotations = _annotations(stand_in)
        #: Kept apart: autoreload also sets the stand-in's ``__dict__`` (the new function's).
        self.original = vars(stand_in).get(_BASE_ATTR)
        #: Its code without probes: other code there once the patch is released is someone
        #: else's (IPython's autoreload sets the ``__code__`` of what the class holds).
        self.code = stand_in.__code__

    def __call__(self) -> None:
        holder, attribute, own, ours = self.holder, self.attribute, self.own, self.ours
        self._carry_back()
        current = vars(holder).get(attribute, _MISSING)
        if current is not ours:
            wraps_ours = getattr(current, "previous", None) is ours
            if wraps_ours and getattr(current, "_bcrecord_runs_wrapped", False):
                current.previous = own  # it puts that back when it goes
                return
            left = _unwrap_installed(ours)
            try:
                # Should it come back (a mock.patch that ends now puts it back), the next patch puts
                # back ``own`` there (see _put_back_left). (Held weakly: never a reason to stay alive.)
                _left_behind[left] = (weakref.ref(holder), attribute)
            except TypeError:  # no __weakref__ slot
                pass
            else:
                vars(left)[_LEFT_ATTR] = own
            warn(
                f"{_named(holder)}'s {attribute!r} was replaced while patched; bcrecord left the "
                "replacement in place instead of putting back what it had patched (should the "
                "patched method come back there, the next patch of it puts back the original)"
            )
            return
        if isinstance(holder, (type, types.ModuleType)):
            if own is _MISSING:
                if attribute in vars(holder):
                    delattr(holder, attribute)
            else:
                setattr(holder, attribute, own)
            return
        _put(vars(holder), attribute, own)
        func = _unwrap_installed(ours)
        if func not in _copies:
            return
        # References: this object's, `ours` and `current` here; any other may be a copy's.
        if sys.getrefcount(ours) - ARGUMENT_REFERENCES > 3:
            for held in shallow_copies_holding(ours, attribute, holder):
                _put(held, attribute, own)
        # The slot's, `ours`', `func` here: any other may be a method bound to a deepcopy of
        # holder (deepcopy binds the same function to the copy).
        if sys.getrefcount(func) - ARGUMENT_REFERENCES > 3:
            for held, copy in deep_copies_holding(func, attribute, holder):
                _put(held, attribute, _rebound(own, holder, copy))
        # A copy patched itself meanwhile put back our method when its patch goes: it gets
        # what this one put back instead.
        for slot in list(_slots.values()):
            other = slot.restore
            if isinstance(other, _Restore) and _unwrap_installed(other.own) is func:
                other.own = _rebound(own, holder, other.holder)

    def _carry_back(self) -> None:
        """Code, defaults and attributes set through the stand-in (``A.m.__defaults__ = ...``,
        a registry marking ``A.m``, autoreload's new code) onto the function it stood in for,
        as they would have been set without the patch. (Its keyword defaults are the
        original's dict already.)"""
        stand_in, original = _unwrap_installed(self.ours), self.original
        if not isinstance(original, types.FunctionType):
            return
        if stand_in.__code__ is not self.code:  # (the slot, released, left it: not its own)
            try:
                original.__code__ = stand_in.__code__
            except ValueError:  # another number of free variables: it cannot run there
                warn(
                    f"{original.__qualname__}'s code was replaced while it was patched by code with "
                    "other free variables; bcrecord could not put it in the original function, "
                    "which keeps its former code"
                )
        given, attributes = self.given
        for name, value in given.items():
            now_set = getattr(stand_in, name, _MISSING)  # (_MISSING: __type_params__ before 3.12)
            if now_set is not value:  # set anew (a dict changed in place is shared)
                setattr(original, name, now_set)
        annotations = _annotations(stand_in)
        if annotations[1] is not self.annotations[1]:
            setattr(original, *annotations)
        now = vars(stand_in)
        for name, value in now.items():
            if name not in (_BASE_ATTR, _SLOT_ATTR) and attributes.get(name, _MISSING) is not value:
                setattr(original, name, value)
        for name in attributes.keys() - now.keys():
            vars(original).pop(name, None)


#: A function's own attributes :meth:`_Restore._carry_back` carries (those in its ``__dict__`` too).
#: (And its annotations: see _annotations.)
#: (__type_params__: 3.12+.)
_CARRIED = (
    "__defaults__",
    "__kwdefaults__",
    "__doc__",
    "__name__",
    "__qualname__",
    "__module__",
    "__type_params__",
)


def _put(held: Dict[str, Any], attribute: str, value: Any) -> None:
    if value is _MISSING:
        held.pop(attribute, None)
    else:
        held[attribute] = value


def _rebound(value: Any, holder: Any, other: Any) -> Any:
    """``value`` as ``other``'s: a method bound to ``holder`` bound to ``other`` instead."""
    if isinstance(value, types.MethodType) and value.__self__ is holder:
        return types.MethodType(value.__func__, other)
    return value


def shallow_copies_holding(value: Any, attribute: str, holder: Any) -> List[Dict[str, Any]]:
    """The ``__dict__``s of the other instances of ``holder``'s class that hold ``value`` under ``attribute``.

    A ``copy.copy`` of an object shares the values of its ``__dict__``: one made while
    a patch had put ``value`` there (a method bound to the original) holds it too, and
    would call it for good. Whoever takes ``value`` out of ``holder`` puts the same back
    in these. A scan of every tracked object: call it only where something else refers
    to ``value``.

    >>> import copy, bcrecord
    >>> class Box: pass
    >>> box = Box(); box.run = print
    >>> twin = copy.copy(box)
    >>> bcrecord.patch.shallow_copies_holding(print, "run", box) == [vars(twin)]
    True
    """
    kind, own = type(holder), vars(holder)
    found: List[Dict[str, Any]] = []
    dicts: List[Dict[str, Any]] = []
    for referrer in gc.get_referrers(value):
        if type(referrer) is kind and referrer is not holder:
            found.append(vars(referrer))  # its attributes kept without a dict (3.11+) until asked
        elif type(referrer) is dict and referrer is not own:
            dicts.append(referrer)
    if dicts:  # whose: an instance's attributes, or some other dict (one scan for all of them)
        owned = {id(vars(o)) for o in gc.get_referrers(*dicts) if type(o) is kind and o is not holder}
        found += [held for held in dicts if id(held) in owned]
    unique = {id(held): held for held in found if held.get(attribute, _MISSING) is value}
    return list(unique.values())


def deep_copies_holding(func: Any, attribute: str, holder: Any) -> List[Tuple[Dict[str, Any], Any]]:
    """``(__dict__, instance)`` of each other instance of ``holder``'s class that holds
    ``func`` bound to an instance under ``attribute``: what a ``copy.deepcopy`` of
    ``holder`` made while a patch had put ``func`` bound to ``holder`` there (and a
    shallow copy of that copy: the instance it is bound to is the deep copy). A scan,
    as :func:`shallow_copies_holding`'s.

    >>> import copy, bcrecord
    >>> class Box:
    ...     def run(self): pass
    >>> box = Box(); box.run = Box.run.__get__(box)
    >>> twin = copy.deepcopy(box)
    >>> bcrecord.patch.deep_copies_holding(Box.run, "run", box) == [(vars(twin), twin)]
    True
    """
    kind, found = type(holder), []
    for method in gc.get_referrers(func):
        if type(method) is not types.MethodType or method.__func__ is not func:
            continue
        other = method.__self__
        if type(other) is kind and other is not holder and vars(other).get(attribute) is method:
            found.append((vars(other), other))
            found += [(held, other) for held in shallow_copies_holding(method, attribute, other)]
    return found


def _install(holder: Any, attribute: str, value: Any) -> None:
    if isinstance(holder, (type, types.ModuleType)):
        setattr(holder, attribute, value)
    else:
        vars(holder)[attribute] = value


def patch_function(
    func: Callable[..., Any],
    specs: Union[SpecLike, Iterable[SpecLike]],
    name: Optional[Owner] = None,
    *,
    unwrap: bool = True,
) -> Patch:
    """Patch ``func`` in place (its ``__code__``), so every reference to it records.

    A ``functools.wraps`` wrapper is recorded inside the function it wraps, where its
    locals are; ``unwrap=False`` patches the wrapper itself (its ``return`` is what
    callers get); with a per-instance ``name``, the outermost wrapper that takes the
    instance as its first positional argument (outer ones that take only ``*args``,
    such as deprecation shims, are passed through). ``name`` is the owner part of keys,
    or a function of the first positional argument that returns it (None: not
    recorded), as :func:`patch_method`'s per-instance ``name``.

    >>> import bcrecord
    >>> def double(v):
    ...     out = v * 2
    ...     return out
    >>> alias = double
    >>> with bcrecord.patch_function(double, "out", name="m"), bcrecord.recording() as rec:
    ...     alias(4)
    8
    >>> rec["m:double:out@0"]
    8
    """
    return _patch_in_place(func, specs, name, unwrap=require_bool("unwrap", unwrap))


def _patch_in_place(
    func: Callable[..., Any],
    specs: Union[SpecLike, Iterable[SpecLike]],
    name: Optional[Owner],
    function: Optional[str] = None,
    unwrap: bool = True,
) -> Patch:
    """:func:`patch_function`, with the function part of keys (default: the code's name)."""
    running = _unwrap_installed(func)
    if running in _left_behind:  # a removed patch's stand-in (see _put_back_left): the original
        with _lock:
            _put_back_left(stand_in=running)
        running = func = _base_of(running)
    if not unwrap:
        _refuse_proxy(running)
    if unwrap and isinstance(running, types.FunctionType) and _dispatches(running):
        # Its __wrapped__ is the default implementation only (unwrap=False: the dispatcher).
        raise NotPatchableError(_why_not_a_function(running))
    if unwrap or not isinstance(running, types.FunctionType):
        base = function_of(func)
    else:  # the wrapper; per instance, the outermost one the instance is passed to
        base = outermost_taking_instance(running) if callable(name) else running
        # Keys name the function as its callers know it (functools.wraps copies __name__),
        # not the wrapper's code ('wrapper' for every function one decorator wraps).
        function = function or getattr(running, "__name__", None)
    patch: Optional[Patch] = None
    try:
        with _lock:
            # A patch's copy (``a.f`` of a patched instance): in place means in what runs there,
            # not in the original it was copied from.
            # (Not when what is patched is inside it: a wrapper's copy calls the function it wraps.)
            copied = _stand_in_slot(running)
            if copied is not None and (running is copied.base or base not in (copied.base, running)):
                copied = None
            if copied is not None:
                patch = _attach(copied, running, None, specs, name, _default_owner(running), function)
                return patch
            key = ("code", id(base))
            slot = _slots.get(key) or _copy_slot(base)
            created = slot is None
            if slot is None:
                slot = _Slot(base, base, restore=lambda: None)
                slot.key = key
            patch = _attach(slot, base, None, specs, name, _default_owner(base), function)
            if slot.freed_with_copy is not None:  # a recording copy's: freed with it, if never removed
                slot.freed_with_copy.append(patch._site_ids)
            probe_visible_from(base.__globals__)
            if created:
                _slots[key] = slot
                track(slot)
        return patch
    except BaseException:
        # What a signal handler raised meanwhile (a timeout's), up to the lock's release: the
        # caller gets no patch to remove, so none stays (a slot stored untracked kept the
        # function from recording for good).
        if patch is not None:
            patch.remove()
        raise


def patch_method(
    obj: Any,
    method: str,
    specs: Union[SpecLike, Iterable[SpecLike]],
    name: Optional[Owner] = None,
    *,
    in_place: bool = False,
    unwrap: bool = True,
) -> Patch:
    """Patch ``obj.method`` to record ``specs``; returns a reversible :class:`Patch`.

    ``obj`` is an instance (only it changes), a class (all its instances) or a
    module (a module-level function). ``name`` is the owner part of keys; the
    default is the class name (instance and class) or the module name. ``name``
    may also be a function of the instance that returns its owner name (None: not
    recorded): one class-level patch, one code object, per-instance keys.
    ``in_place=True`` patches the function object itself (see :func:`patch_function`):
    the one there, which is an earlier patch's copy where one is installed (references
    to the original taken before that patch then run without this one's probes).
    A ``functools.wraps`` wrapper is patched in place, inside the function it wraps
    (``unwrap=False``: the wrapper itself, see :func:`patch_function`), where its probes
    run for every instance: a patch of an instance leaves out the other instances'
    values where the function inside is a method of its class (also where its attribute
    wraps a bound method: ``obj.m = torch.compile(obj.m)``, whose instance's are kept),
    one of a subclass keeps every instance's (a per-instance ``name`` can choose).

    >>> import bcrecord
    >>> class Net:
    ...     def forward(self, x):
    ...         h = x * 3
    ...         return h
    >>> net = Net()
    >>> with bcrecord.patch_method(net, "forward", "h@0", name="net"), bcrecord.recording() as rec:
    ...     net.forward(2)
    6
    >>> rec["net:forward:h@0"], "forward" in vars(net)
    (6, False)

    A per-instance ``name``: called with the instance each time a value is recorded
    (``Patch.keys`` shows its owner as ``'*'``; an error it raises, or a return value
    that is no string, goes to the recording's ``errors``, with a warning):

    >>> first, second = Net(), Net()
    >>> owners = {id(first): "first"}  # second: None, not recorded
    >>> with bcrecord.patch_method(Net, "forward", "h", name=lambda net: owners.get(id(net))) as patch:
    ...     with bcrecord.recording() as rec:
    ...         _ = first.forward(1), second.forward(2)
    >>> patch.keys, rec.keys()
    (('*:forward:h@0',), ['first:forward:h@0'])
    """
    # Flags checked first: a string ('False') would be taken as true.
    in_place, unwrap = require_bool("in_place", in_place), require_bool("unwrap", unwrap)
    if type(obj) is str:  # (a str's own methods are C code: never the one meant; a subclass's may be)
        if not isinstance(method, str):
            named = isinstance(method, (type, types.ModuleType))
            given = method.__name__ if named else f"<the {type(method).__name__}>"
            raise NotPatchableError(
                f"patch_method's arguments are swapped: the object comes first, then the method's name: "
                f"patch_method({given}, {obj!r}, ...)"
            )
        raise NotPatchableError(
            f"patch_method takes the object itself, a class, an instance or a module, not its name {obj!r}: "
            f"patch_method({obj}, {method!r}, ...)"
        )
    if isinstance(method, str) and compiled_name(method) != method:
        # Written as in the source ('def \ufb01wd' is 'fiwd' in the class), as specs are; a name
        # set with setattr as it is (not normalised) is found as it is.
        if inspect.getattr_static(obj, method, _MISSING) is _MISSING:
            method = compiled_name(method)
    # Looked up under the lock too: two threads patching one method must see each other's
    # slot (else each copies the original, and removing one drops the other's slot).
    patch: Optional[Patch] = None
    try:
        with _lock:
            patch = _patch_method(obj, method, specs, name, in_place, unwrap)
        if isinstance(obj, type):
            _warn_if_abstract(obj, method)
    except BaseException:
        # A warning made an error (-W error), or what a signal handler raised up to the lock's
        # release: the call that raised changes nothing.
        if patch is not None:
            patch.remove()
        raise
    return patch


def _warn_if_abstract(cls: type, method: str) -> None:
    """Warn that an abstract method's patch records only calls that reach it (``super()``).

    Subclasses override an abstract method, so its own code runs only where an
    override calls it; a user who patched it to see "the" method's values gets none.

    >>> import abc, warnings
    >>> class Base(abc.ABC):
    ...     @abc.abstractmethod
    ...     def m(self): ...
    >>> class Sub(Base):
    ...     def m(self): return 1
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     _warn_if_abstract(Base, "m")
    >>> print(caught[0].message)  # doctest: +ELLIPSIS
    Base.m is abstract: ... patch them to record theirs: ...Sub.m
    """
    if not getattr(inspect.getattr_static(cls, method, None), "__isabstractmethod__", False):
        return
    found: List[str] = []
    waiting: List[type] = list(type.__subclasses__(cls))
    while waiting:
        sub = waiting.pop()
        if method in vars(sub):
            found.append(f"{sub.__qualname__}.{method}")
        waiting.extend(type.__subclasses__(sub))
    overrides = f": {', '.join(sorted(set(found)))}" if found else " (none are defined yet)"
    warn(
        f"{cls.__qualname__}.{method} is abstract: subclasses override it, so it runs only where an "
        f"override calls it (super().{method}(...)); patch them to record theirs{overrides}"
    )


def _patch_method(
    obj: Any,
    method: str,
    specs: Union[SpecLike, Iterable[SpecLike]],
    name: Optional[Owner],
    in_place: bool,
    unwrap: bool,
) -> Patch:
    if _left_behind:
        _put_back_left(obj, method)
    raw, own = _lookup(obj, method)
    if isinstance(obj, type) and not any([method in vars(cls) for cls in obj.__mro__]):
        # Found on the metaclass: a copy put in the class would be its instances' method.
        meta = type(obj).__name__
        try:
            function_of(raw)
        except NotPatchableError as error:  # (type's own __call__, __repr__: C code)
            raise NotPatchableError(
                f"{_named(obj)} and its bases define no {method!r}: the one found is its metaclass "
                f"{meta}'s, and {error}"
            ) from None
        raise NotPatchableError(
            f"{_named(obj)}'s {method!r} comes from its metaclass {meta}: patch the metaclass "
            f"(patch_method({meta}, {method!r}, ...), with name= a function of the class to keep "
            f"{obj.__name__}'s values only)"
        )
    if callable(name) and isinstance(raw, staticmethod):
        raise NotPatchableError(
            f"{method} is a staticmethod: it gets no instance, so name= cannot be a function "
            "of the instance; give a string"
        )
    if isinstance(obj, type):
        default = obj.__name__
    elif isinstance(obj, types.ModuleType):
        default = obj.__name__
    else:
        default = type(obj).__name__
    try:
        base = function_of(raw)
    except NotPatchableError as error:
        if not callable(raw) and not hasattr(type(raw), "__get__"):  # a value: say whose
            raise NotPatchableError(f"{_named(obj)}'s {method!r} is {error}") from None
        if isinstance(raw, property) and getattr(raw.fget, "__name__", method) != method:
            # 'x = property(_get_x)': named by its getter, it was '_get_x', to patch as '_get_x.fget'.
            holder = obj if isinstance(obj, (type, types.ModuleType)) else type(obj)
            where = getattr(holder, "__qualname__", holder.__name__)
            raise NotPatchableError(_why_not_a_property(raw, f"{where}.{method}")) from None
        held = _slot_filled_by(obj, method) if isinstance(raw, types.MemberDescriptorType) else None
        if held is not None:
            holder = obj if isinstance(obj, type) else type(obj)
            raise NotPatchableError(
                f"{holder.__qualname__}.{method} is a slot that the class's __getattr__ fills on the first "
                f"read by calling {held.__qualname__} (an attrs slotted class's cached_property): patch "
                f"that function, patch_function({holder.__name__}.__getattr__.__globals__"
                f"['cached_properties'][{method!r}], specs)"
            ) from None
        if any([cls.__name__ == "ScriptModule" and _from_torch(cls) for cls in type(obj).__mro__]):
            raise NotPatchableError(  # (a traced module's forward is a descriptor of torch's)
                f"{_named(obj)} is a TorchScript module (torch.jit.script or trace made it): its "
                f"{method!r} runs TorchScript, not Python bytecode; patch the module it was made "
                "from, before scripting or tracing it"
            ) from None
        descriptor = _python_descriptor(raw) or _c_descriptor(raw)
        if descriptor is not None and str(error).endswith(descriptor):  # (its repr names no attribute)
            raise NotPatchableError(f"{_named(obj)}'s {method!r} is {descriptor}") from None
        raise
    shallow = _function_of_shallow(raw)
    if not unwrap:
        _refuse_proxy(shallow)
    if not (unwrap or isinstance(obj, (type, types.ModuleType))) and isinstance(shallow, types.FunctionType):
        # The wrapper itself, for one instance: a copy of it there, as any method's is. (In
        # place, every instance would run its probes, and a wrapper taking *args gets no
        # instance to tell them apart by.)
        base = shallow
    # A class's or module's own function that runs in place for everyone there: a recording
    # copy (it keeps its probes), or one patched in place already (bcrecord run, the torch
    # layer), whose probes a copy would run without. Not for an instance or a subclass that
    # inherits it: their patch is a copy of their own (unless the method is wrapped, below).
    shared = isinstance(obj, (type, types.ModuleType)) and own is not _MISSING
    stacks = shared and (_copy_slot(base) is not None or ("code", id(base)) in _slots)
    wrapped = base is not shallow
    # An instance's or subclass's patch of a recording copy a class holds: a copy of the copy
    # would run without the copy's own probes, so it goes in place, keeping its own values
    # (a method's: a staticmethod or classmethod gets no instance to tell whose call it is).
    inherited_copy = not shared and _copy_slot(base) is not None and isinstance(raw, types.FunctionType)
    if in_place or wrapped or stacks or inherited_copy:
        # A wrapper holds the function it wraps: only patching that in place reaches it, for
        # every instance (a subclass's patch too: see the README); an instance's keeps its own.
        # (Given what is there: an earlier patch's copy, if one runs there, is patched.)
        owner = default if name is None else name
        if (wrapped or inherited_copy) and unwrap and isinstance(owner, str):
            passed = _instance_passed(obj, raw, own, base)
            if passed is not None:
                owner = _OneInstance.of(passed, owner, base)
            elif inherited_copy and isinstance(obj, type):
                owner = _OneClass.of(obj, owner, base)
        return _patch_in_place(raw, specs, owner, method, unwrap)
    if not isinstance(obj, (type, types.ModuleType)) and not hasattr(obj, "__dict__"):
        cls = type(obj).__name__
        raise NotPatchableError(
            f"{cls} instances have no __dict__ (uses __slots__?), so none can hold a method of its own: "
            f"patch the class (patch_method({cls}, {method!r}, ...), with name= a function of the "
            "instance to keep this one's values)"
        )
    if not isinstance(obj, (type, types.ModuleType)) and method in _LOOKED_UP_ON_THE_TYPE:
        # obj(x), len(obj)... look the method up on the type: an instance's own would never run.
        cls = type(obj).__name__
        raise NotPatchableError(
            f"{method} is a special method: Python looks it up on the class, so a patch on one "
            f"{cls} instance would never run; patch the class (patch_method({cls}, {method!r}, ...), "
            "with name= a function of the instance to keep this one's values)"
        )

    key = ("attr", id(obj), method)
    slot = _slots.get(key)
    if slot is not None and own is not _MISSING and _unwrap_installed(own) is slot.live:
        patch = _attach(slot, obj, method, specs, name, default, method)
        return patch
    live = _copy_function(base, stand_in=True)
    installed = _wrap_like(raw, live, obj, in_own_dict=raw is own)
    slot = _Slot(base, live, restore=_Restore(obj, method, own, installed))
    slot.follows = (base.__defaults__, base.__kwdefaults__, _own_code(base))
    slot.key = key
    patch = _attach(slot, obj, method, specs, name, default, method)
    try:
        _install(obj, method, installed)
    except (AttributeError, TypeError) as error:  # a __setattr__ that refuses writes (a frozen class)
        slot.release()
        raise NotPatchableError(_write_refused(obj, method, error)) from error
    except BaseException:
        slot.release()
        raise
    try:
        probe_visible_from(base.__globals__)
        replaced = _slots.get(key)  # (a stand-in no longer installed there: a mock came and went)
        if replaced is not None:
            _forget_stand_in(replaced)  # (as _slots: what runs there is found)
        _slots[key] = slot
        _stand_ins_running[id(live)] = slot
        if isinstance(obj, (type, types.ModuleType)):
            _stand_ins.setdefault(id(base), []).append(slot)
        track(slot)
    except BaseException:  # (what a signal handler raised: no patch the caller could remove stays)
        patch.remove()
        raise
    return patch


_OPERATORS = "add sub mul matmul truediv floordiv mod divmod pow lshift rshift and xor or".split()
#: Special methods the interpreter looks up on the class (``obj(x)``, ``len(obj)``, ``a + b``,
#: ``with obj``, ``copy.copy``): one an instance holds is never called. (``__deepcopy__``, ``__getstate__``,
#: ``__post_init__`` and the like are read from the instance, and may be patched there.)
_LOOKED_UP_ON_THE_TYPE = frozenset(
    [f"__{op}__" for op in _OPERATORS]
    + [f"__r{op}__" for op in _OPERATORS]
    + [f"__i{op}__" for op in _OPERATORS if op != "divmod"]
    + """__call__ __len__ __length_hint__ __iter__ __next__ __reversed__ __contains__ __getitem__
    __setitem__ __delitem__ __missing__ __enter__ __exit__ __aenter__ __aexit__ __aiter__ __anext__
    __await__ __repr__ __str__ __bytes__ __format__ __bool__ __hash__ __index__ __int__ __float__
    __complex__ __round__ __trunc__ __floor__ __ceil__ __eq__ __ne__ __lt__ __le__ __gt__ __ge__
    __neg__ __pos__ __abs__ __invert__ __getattr__ __getattribute__ __setattr__ __delattr__ __get__
    __set__ __delete__ __set_name__ __init__ __new__ __del__ __dir__ __sizeof__ __fspath__
    __buffer__ __release_buffer__ __instancecheck__ __subclasscheck__ __copy__ __getnewargs__
    __getnewargs_ex__""".split()
)


def _slot_filled_by(obj: Any, attribute: str) -> Optional[types.FunctionType]:
    """The function that fills the slot ``attribute`` of ``obj``'s class on its first read, or None.

    attrs turns a slotted class's ``functools.cached_property`` into a slot and a generated
    ``__getattr__`` that calls the function (kept in that ``__getattr__``'s globals).
    """
    holder = obj if isinstance(obj, type) else type(obj)
    fills = inspect.getattr_static(holder, "__getattr__", None)
    held = getattr(fills, "__globals__", {}).get("cached_properties")
    func = held.get(attribute) if isinstance(held, dict) else None
    return func if isinstance(func, types.FunctionType) else None


def _write_refused(holder: Any, attribute: str, error: BaseException) -> str:
    """Why ``holder.attribute`` could not be replaced (its ``__setattr__`` raised ``error``),
    and how to patch it all the same: in place, where no attribute is written.

    >>> class Frozen(type):
    ...     def __setattr__(cls, name, value):
    ...         raise AttributeError("frozen")
    >>> class Net(metaclass=Frozen):
    ...     def forward(self, x):
    ...         return x
    >>> _write_refused(Net, "forward", AttributeError("frozen")).split("; ")[0]
    "Net refuses to have its 'forward' replaced (AttributeError: frozen)"
    """
    shown = getattr(holder, "__name__", None) if isinstance(holder, (type, types.ModuleType)) else None
    return (
        f"{shown or _named(holder)} refuses to have its {attribute!r} replaced ({type(error).__name__}: "
        f"{error}); nothing was patched. Patch the function in place instead, where no attribute "
        f"is written: patch_method({shown or 'obj'}, {attribute!r}, specs, in_place=True)"
    )


def _instance_passed(obj: Any, raw: Any, own: Any, base: types.FunctionType) -> Any:
    """The instance that calls of instance ``obj``'s wrapped method pass first to ``base``, the
    function inside the wrapper, where it is known (else None): ``obj`` for a method of its
    class decorated there (``base`` is a function of the class body); for its attribute
    wrapping (or being) a bound method (``obj.m = torch.compile(obj.m)``,
    ``self.forward = self.inner.forward``), the method's own instance.
    """
    if isinstance(obj, (type, types.ModuleType)) or not base.__code__.co_argcount:
        return None
    if own is _MISSING:
        in_class = _class_defining(base, obj) is not None
        return obj if isinstance(raw, types.FunctionType) and in_class else None
    inner = own
    for _ in range(100):  # a __wrapped__ cycle ends it
        if not isinstance(inner, types.FunctionType):
            break
        inner = getattr(inner, "__wrapped__", None)
    if isinstance(inner, types.MethodType) and not isinstance(inner.__self__, type):  # (a classmethod's)
        return inner.__self__
    return None


def _class_defining(function: types.FunctionType, instance: Any) -> Optional[type]:
    """The class of ``instance`` (or a base of it) whose body defines ``function``, or None."""
    return _base_defining(function, type(instance))


def _base_defining(function: types.FunctionType, cls: type) -> Optional[type]:
    """``cls`` or the base of it whose body defines ``function``, or None."""
    holder = function.__qualname__.rpartition(".")[0]
    for k in cls.__mro__:
        if getattr(k, "__qualname__", None) == holder:
            return k
    return None


class _OneInstance:
    """The owner of one instance's patch that went in place: its name there, None for the
    other instances of its class.

    A wrapped method is patched in place, in code every instance runs; this keeps the
    patched instance's values only (its patch's ``name`` is the string). A call given
    something else first (a decorator that passes ``self.inner``, or drops ``self``) is
    kept: whose it is cannot be told, and a value is not dropped on a guess.
    """

    __slots__ = ("instance", "kind", "name")
    #: It runs no patched code: the runtime calls it as it is (not silenced), per value.
    quiet = True

    def __init__(self, instance: Callable[[], Any], kind: type, name: str) -> None:
        self.instance = instance
        self.kind = kind
        self.name = name

    @classmethod
    def of(cls, instance: Any, name: str, function: types.FunctionType) -> Owner:
        """An owner for ``instance`` alone (held weakly where it can be: its patch holds it
        too), among the instances of the class that defines ``function``."""
        try:
            held: Callable[[], Any] = weakref.ref(instance)
        except TypeError:  # no __weakref__ slot
            held = lambda: instance  # noqa: E731
        return cls(held, _class_defining(function, instance) or type(instance), name)

    def __call__(self, instance: Any) -> Optional[str]:
        if instance is not self.instance() and isinstance(instance, self.kind):
            return None  # another instance of the class
        return self.name


class _OneClass(_OneInstance):
    """The owner of a subclass's patch that went in place: its name for the subclass's
    instances, None for the other instances of the base class that defines the function.
    """

    __slots__ = ()

    @classmethod
    def of(cls, instance: Any, name: str, function: types.FunctionType) -> Owner:
        """An owner for the instances of the class ``instance`` (held weakly)."""
        return cls(weakref.ref(instance), _base_defining(function, instance) or instance, name)

    def __call__(self, instance: Any) -> Optional[str]:
        subclass = self.instance()  # (None once freed: no instance of it is left either)
        if isinstance(instance, self.kind) and (subclass is None or not isinstance(instance, subclass)):
            return None  # an instance of the base class, or of another subclass
        return self.name


def _function_of_shallow(raw: Any) -> Any:
    """The function directly behind ``raw`` (through static/class/bound methods only)."""
    if isinstance(raw, (staticmethod, classmethod, types.MethodType)):
        raw = raw.__func__
    return raw if _copy_slot(raw) is not None else _base_of(raw)


def _from_torch(cls: type) -> bool:
    """Whether ``cls`` is torch's (told by its module's name: the core never imports torch)."""
    return str(cls.__module__).partition(".")[0] == "torch"


def _refuse_proxy(func: Any) -> None:
    """Refuse ``unwrap=False`` on an object proxy that passes for a function (wrapt's
    ``FunctionWrapper`` reports the class of what it wraps): its ``__code__`` is the
    wrapped function's, so patching "the wrapper" would patch that one, under another name."""
    if isinstance(func, types.FunctionType) and type(func) is not types.FunctionType:
        name = getattr(func, "__qualname__", None) or shown(func)
        wrapper = getattr(func, "_self_wrapper", None)  # (wrapt's name for the decorator's function)
        which = f" ({wrapper.__qualname__})" if isinstance(wrapper, types.FunctionType) else ""
        raise NotPatchableError(
            f"{name} is {_a(type(func).__name__)}, an object proxy around a function, not a function: "
            f"unwrap=False has no wrapper code of its own to patch (what callers get comes from the "
            f"decorator's function{which}, shared by every function it decorates); leave unwrap=True "
            "to record inside the function it wraps, or patch the decorator's function itself"
        )


def _unwrap_installed(raw: Any) -> Any:
    if isinstance(raw, (staticmethod, classmethod, types.MethodType)):
        return raw.__func__
    return raw


def _wrap_like(raw: Any, live: types.FunctionType, holder: Any, in_own_dict: bool = False) -> Any:
    """``live`` dressed the way ``raw`` was: static/class method, or bound to an instance.

    A plain function kept in an instance's own ``__dict__`` (``m.forward = hook``) is
    not a method: Python calls it without the instance, so it stays plain.
    """
    if isinstance(raw, staticmethod):
        return live if not isinstance(holder, type) else staticmethod(live)
    if isinstance(raw, classmethod):
        owner = holder if isinstance(holder, type) else type(holder)
        return classmethod(live) if isinstance(holder, type) else types.MethodType(live, owner)
    if isinstance(raw, types.MethodType):
        return types.MethodType(live, raw.__self__)
    if isinstance(holder, (type, types.ModuleType)) or in_own_dict:
        return live
    return types.MethodType(live, holder)


def targets(func: Union[Callable[..., Any], types.CodeType]) -> Targets:
    """List everything recordable in ``func`` (a function, method or code object).

    No source is needed. ``print(bcrecord.targets(f))`` shows a table.

    >>> import bcrecord
    >>> def f(self, x):
    ...     y = self.w * x
    ...     return y
    >>> bcrecord.targets(f).specs()
    ['y@0', 'self.w@0', '*@0', 'return']
    """
    if isinstance(func, types.CodeType):
        return Targets(read(func))
    if isinstance(func, types.FunctionType) and _dispatches(func):
        # Its __wrapped__ is the default implementation only, which patching it refuses too.
        raise NotPatchableError(_why_not_a_function(func))
    base = function_of(func)
    return Targets(read(original_code(base), base.__qualname__))
