"""Read a code object: where each local is assigned, each attribute chain loaded,
each value returned — without source.

The compiler leaves several store instructions for one source-level assignment (a
``finally`` body is compiled twice) and adds stores nobody wrote (``x = None; del x``
after ``except ... as x``; the save/restore around an inlined comprehension on
3.12+). :func:`read` groups the first kind by source position and drops the second,
so that assignment numbers match what a reader counts on every Python version.

>>> def f(a):
...     x = a + 1
...     x = x * 2
...     return x
>>> [(s.index, s.line - f.__code__.co_firstlineno) for s in read(f.__code__).locals["x"]]
[(0, 1), (1, 2)]
"""

from __future__ import annotations

import dataclasses
import dis
import functools
import inspect
import itertools
from dataclasses import dataclass, field
from types import CodeType
from typing import (
    Any,
    Dict,
    FrozenSet,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    cast,
)

from bytecode import UNSET, Bytecode, FreeVar, Instr, Label, TryBegin, TryEnd
from bytecode import __version__ as bytecode_version

from . import _versions
from .errors import NotPatchableError, TargetError, aligned, did_you_mean, raised_by_signal_handler
from .specs import SUPER_NO_CALL, Attribute, Call, Expr, Local, Return, Spec, require_bool

__all__ = [
    "Assignment",
    "AttributeLoad",
    "ReturnSite",
    "CallSite",
    "OperatorSite",
    "CodeMap",
    "ProbePoint",
    "Targets",
    "compiled_spec",
    "computed_callee_calls",
    "consuming_calls",
    "forget_readings",
    "instructions",
    "read",
    "resolve",
    "returns_none",
]


@dataclass(frozen=True)
class Assignment:
    """One source-level assignment to a local: its number, where it is, and the
    store instructions (positions in :func:`instructions`) that carry it out."""

    name: str
    index: int
    line: int
    column: Optional[int]
    positions: Tuple[int, ...] = field(repr=False)


@dataclass(frozen=True)
class AttributeLoad:
    """One place in the source where the body loads an attribute chain."""

    chain: str
    index: int
    line: Optional[int]
    column: Optional[int]
    positions: Tuple[int, ...] = field(repr=False)
    method: bool = field(default=False, repr=False)


@dataclass(frozen=True)
class ReturnSite:
    """One return instruction (the implicit ``return None`` included)."""

    index: int
    line: Optional[int]
    column: Optional[int]
    positions: Tuple[int, ...] = field(repr=False)


@dataclass(frozen=True)
class CallSite:
    """One call whose callee is a name or attribute chain; ``positions`` are the calls."""

    callee: str
    index: int
    line: Optional[int]
    column: Optional[int]
    positions: Tuple[int, ...] = field(repr=False)


@dataclass(frozen=True)
class OperatorSite:
    """One binary operator (``+``, ``*=``…); ``positions`` are its instructions."""

    op: str
    index: int
    line: Optional[int]
    column: Optional[int]
    positions: Tuple[int, ...] = field(repr=False)


@dataclass(frozen=True)
class CodeMap:
    """Everything recordable in one code object, numbered in source order.

    Its attribute loads, call and operator sites are found when first asked for
    (:attr:`attributes`, :attr:`calls`, :attr:`operators`): most targets name a local or a
    return, and finding which call consumes each callee is about half of a reading's time
    (the attribute chains, a third of the rest).
    """

    name: str
    qualname: str
    filename: str
    arguments: Tuple[str, ...]
    locals: Dict[str, Tuple[Assignment, ...]]
    returns: Tuple[ReturnSite, ...]
    entry: int = field(repr=False)
    #: Finds the attribute loads, calls and operators, at the first question.
    _later: _LaterSites = field(repr=False, compare=False)
    cells: frozenset = field(repr=False, default=frozenset())
    #: The parameters as the ``def`` line has them, without defaults (``'a, *args, k, **kw'``).
    signature: str = field(repr=False, default="")
    #: Names that are no assigned locals: comprehensions' own variables, the free variables
    #: an enclosing function (or a type parameter list) assigns, and the globals the code
    #: assigns (``global G``), for errors about them.
    comprehension_names: frozenset = field(repr=False, default=frozenset())
    free_names: frozenset = field(repr=False, default=frozenset())
    global_names: frozenset = field(repr=False, default=frozenset())
    #: What the compiler puts before a private name (``__w``) in a class's code: ``'_Net'``.
    private_prefix: str = field(repr=False, default="")
    #: Why each comprehension whose sites are not here cannot be read (see _Sites).
    unreadable: Tuple[str, ...] = field(repr=False, default=())

    @property
    def attributes(self) -> Dict[str, Tuple[AttributeLoad, ...]]:
        """The attribute loads, by chain (``'self.fc.weight'``)."""
        return self._later.attributes()

    @property
    def calls(self) -> Dict[str, Tuple[CallSite, ...]]:
        """The call sites, by callee (``'self.fc'``)."""
        return self._later.found()[0]

    @property
    def operators(self) -> Dict[str, Tuple[OperatorSite, ...]]:
        """The operator sites, by operator (``'+'``)."""
        return self._later.found()[1]

    @property
    def selfless(self) -> FrozenSet[object]:
        """Positions of sites inside separate comprehension code that does not use the
        first argument: a probe there cannot be given the instance (per-instance patches)."""
        return self._later.found()[2]


@dataclass(frozen=True)
class ProbePoint:
    """Where to insert one probe, and the target part of its key (``'x@1'``).

    ``with_self`` makes the probe also pass the function's first argument, so that
    one patched code object can report under each instance's own owner name.
    """

    kind: str  # 'store' | 'load' | 'return' | 'entry'
    positions: Tuple[int, ...]
    label: str
    method: bool = False
    root: str = ""
    chain: Tuple[str, ...] = ()
    copy: Any = None
    with_self: bool = False

    def where(self) -> Tuple[object, ...]:
        """What the inserted code depends on (not the key or the copy policy).

        >>> a = ProbePoint("store", (4,), "x@0", copy="clone")
        >>> a.where() == ProbePoint("store", (4,), "y@0", copy="none").where()
        True
        """
        return (self.kind, self.positions, self.method, self.root, self.with_self)


def instructions(code: CodeType) -> Tuple[object, ...]:
    """The abstract instructions of ``code`` with two-variable pairs split (3.13+), to read.

    Positions in a :class:`CodeMap` index into this sequence; the rewriter edits a copy of
    the same (:func:`editable_instructions`), so both must come from here. Decoded once per
    code object and kept as a tuple: readers index it thousands of times per function,
    which a tuple does in C and a ``Bytecode`` (a list subclass) in Python.

    >>> def f(a):
    ...     x = y = a  # one STORE_FAST_STORE_FAST on 3.13, two stores before
    ...     return x + y
    >>> [i.arg for i in instructions(f.__code__) if getattr(i, "name", "") == "STORE_FAST"]
    ['x', 'y']
    """
    return _decoded(code_key(code))[1]


def editable_instructions(code: CodeType) -> Bytecode:
    """:func:`instructions` as a fresh ``Bytecode`` of the same items, for the rewriter to edit
    (the instructions themselves are shared, and never edited).

    >>> def f(a):
    ...     return a
    >>> editable = editable_instructions(f.__code__)
    >>> list(editable) == list(instructions(f.__code__)), editable is editable_instructions(f.__code__)
    (True, False)
    """
    return _decoded(code_key(code))[0].copy()


def code_key(code: CodeType) -> Tuple[object, ...]:
    """``code`` as a cache key: ``==`` on code objects ignores the file, the qualified
    name and (3.10) the line table, which the code read or rewritten from it keeps.

    >>> a, b = compile("x = 1", "a.py", "exec"), compile("x = 1", "b.py", "exec")
    >>> a == b, code_key(a) == code_key(b)
    (True, False)
    """
    return (code, code.co_filename, _versions.code_qualname(code), code.co_linetable)


@functools.lru_cache(maxsize=256)
def _decoded(key: Tuple[object, ...]) -> Tuple[Bytecode, Tuple[object, ...]]:
    """The code's instructions, and the same as a tuple: one entry, so that what readers
    index and what the rewriter edits hold the same objects (the same labels)."""
    code = cast(CodeType, key[0])
    table = _versions.current()
    if table.unhandled:
        for instr in dis.get_instructions(code):
            if instr.opname in table.unhandled:
                name, line = _versions.code_qualname(code) or code.co_name, instr.positions.lineno  # type: ignore[attr-defined]
                raise NotPatchableError(
                    f"the bytecode package {bytecode_version} cannot rewrite the code of {name} "
                    f"({code.co_filename}, line {line}): it has {table.unhandled[instr.opname]}"
                )
    # The depth CPython gave each exception region is kept: the rewriter keeps it (see
    # bcrecord.rewrite._assemble).
    try:
        bytecode = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    except Exception as error:  # (bytecode 0.17.0 on 3.14: a KeyError, for an async comprehension)
        if raised_by_signal_handler(error):
            raise  # the program's (a timeout's TimeoutError while it read), not the package's
        name = _versions.code_qualname(code) or code.co_name
        raise NotPatchableError(
            f"the bytecode package {bytecode_version} cannot read the code of {name} "
            f"({code.co_filename}, line {code.co_firstlineno}): {type(error).__name__}: {error}"
        ) from error
    if not table.pairs:
        return bytecode, tuple(bytecode)
    split = {pair: (first, second) for pair, first, second in table.pairs}
    out: List[object] = []
    for item in bytecode:
        if isinstance(item, Instr) and item.name in split:
            first, second = split[item.name]
            a, b = cast(Tuple[Any, Any], item.arg)
            out.append(Instr(first, a, location=item.location))
            out.append(_Borrowed(second, b, location=item.location))
        else:
            out.append(item)
    bytecode[:] = out
    return bytecode, tuple(bytecode)


class _Borrowed(Instr):
    """The second half of a split pair: its location is the pair's, its first half's
    (the compiler keeps one), so it does not say where this half is in the source."""


def _arg_signature(arg: object) -> object:
    if arg is UNSET:
        return None
    if isinstance(arg, (str, int, float, complex, bytes, bool, type(None))):
        return arg
    if isinstance(arg, tuple) and all(isinstance(a, (str, int, bool)) for a in arg):
        return arg
    name = getattr(arg, "name", None)
    if isinstance(name, str):
        return name
    return type(arg).__name__


def _real(bytecode: Sequence[object]) -> List[Tuple[int, Instr]]:
    return [(pos, item) for pos, item in enumerate(bytecode) if isinstance(item, Instr)]


class _Identity:
    """Maps a store or load to the source construct it belongs to.

    With column information (3.11+) the position span identifies the construct (the
    stores of one ``import``, which share its span, are told apart by
    :func:`_counted_in_runs`).
    3.10 has line numbers only. Its compiler copies code (both paths of a
    ``finally``, a statement's tail into each branch of a conditional), and a copy
    starts at a jump target; so a site is identified by its line and by how many
    sites of the same name precede it in its run of same-line code since the last
    jump target. Copies match; two assignments on one line stay apart unless a
    branch separates them (a limit of 3.10's line table).
    """

    def __init__(self, bytecode: Sequence[object]) -> None:
        self._bytecode = bytecode
        self._ordinals: Optional[Dict[int, int]] = None  # (counted where first asked: code without columns)

    def _count_ordinals(self) -> Dict[int, int]:
        ordinal: Dict[int, int] = {}
        seen: Dict[object, int] = {}
        line: object = object()
        for pos, instr in enumerate(self._bytecode):
            if isinstance(instr, Label):
                line = object()  # a jump target starts a new run: copies start at one
            if not isinstance(instr, Instr):
                continue
            if instr.lineno != line:
                seen, line = {}, instr.lineno
            key = (instr.name.split("_")[0], _arg_signature(instr.arg))
            ordinal[pos] = seen.get(key, 0)
            seen[key] = ordinal[pos] + 1
        return ordinal

    def of(self, pos: int, instr: Instr) -> Tuple[object, ...]:
        loc = instr.location
        if loc is not None and loc.col_offset is not None:
            return (loc.lineno, loc.col_offset, loc.end_lineno, loc.end_col_offset)
        if self._ordinals is None:
            self._ordinals = self._count_ordinals()
        return (instr.lineno, self._ordinals[pos])


def _column(instr: Instr) -> Optional[int]:
    loc = instr.location
    return None if loc is None else loc.col_offset


def _own_column(instr: Instr) -> Optional[int]:
    """``instr``'s column where it is its own, None where it is a split pair's second half's.

    >>> from bytecode.instr import InstrLocation
    >>> _own_column(_Borrowed("STORE_FAST", "b", location=InstrLocation(1, 1, 4, 5)))
    >>> _own_column(Instr("STORE_FAST", "a", location=InstrLocation(1, 1, 4, 5)))
    4
    """
    return None if isinstance(instr, _Borrowed) else _column(instr)


def _within(inner: Instr, outer: Instr) -> bool:
    a, b = inner.location, outer.location
    if a is None or b is None or a.lineno is None or b.lineno is None:
        return False
    if a.col_offset is None or b.col_offset is None or b.end_lineno is None:
        return a.lineno == b.lineno
    start = (a.lineno, a.col_offset) >= (b.lineno, b.col_offset)
    end = (a.end_lineno or a.lineno, a.end_col_offset or 0) <= (b.end_lineno, b.end_col_offset or 0)
    return start and end


def _stores(item: object, name: object, stores: FrozenSet[str]) -> bool:
    return isinstance(item, Instr) and item.name in stores and _versions.local_name(item.arg) == name


def _comprehension_stores(bytecode: Sequence[object], save: int) -> Optional[Set[int]]:
    """Positions of the stores an inlined comprehension (3.12+) makes of the variable
    that the ``LOAD_FAST_AND_CLEAR`` at ``save`` saves, found by the code's shape.

    For code without columns (``python -X no_debug_ranges``), where a user's store on
    the comprehension's line cannot be told from them by place. The comprehension runs
    in a region of the exception table whose handler restores the saved variable and
    raises again: its stores of the variable inside that region and in the handler are
    the comprehension's, and so is the first one after the region (the restore).
    None where the code has another shape.
    """
    name = _versions.local_name(cast(Instr, bytecode[save]).arg)
    handler: Optional[Label] = None
    for item in bytecode[save + 1 :]:
        if isinstance(item, TryBegin):
            handler = item.target if isinstance(item.target, Label) else None
            break
        if isinstance(item, Instr) and item.name not in _versions.current().comprehension_setup:
            return None
    ends = [k for k, item in enumerate(bytecode) if isinstance(item, TryEnd) and item.entry.target is handler]
    if handler is None or not ends or handler not in bytecode:
        return None
    stores = _versions.current().stores
    mine = {k for k in range(save, ends[-1]) if _stores(bytecode[k], name, stores)}
    # The handler's restores: from its label to the RERAISE ending it.
    cleanup = set()
    for k in range(bytecode.index(handler) + 1, len(bytecode)):
        item = bytecode[k]
        if isinstance(item, Instr):
            if _stores(item, name, stores):
                cleanup.add(k)
            if item.name == "RERAISE":
                break
    if not cleanup:
        return None  # a handler that restores nothing: not a comprehension's
    restore = next(
        (
            k
            for k in range(ends[-1], len(bytecode))
            if k not in cleanup and _stores(bytecode[k], name, stores)
        ),
        None,
    )
    return mine | cleanup | ({restore} if restore is not None else set())


def _synthesized_stores(
    real: List[Tuple[int, Instr]], bytecode: Sequence[object], comprehensions: Optional[Set[int]] = None
) -> set:
    """Positions of stores the compiler added that no source line wrote; those of inlined
    comprehensions' own variables are added to ``comprehensions`` too."""
    table = _versions.current()
    synthesized = set()
    saves: List[Instr] = []
    unplaced: Set[int] = set()  # the comprehensions' own stores, in code without columns
    for pos, instr in real if table.comprehension_save else ():
        if instr.name != table.comprehension_save:
            continue
        found = _comprehension_stores(bytecode, pos) if _column(instr) is None else None
        if found is None:
            saves.append(instr)
        else:
            unplaced |= found  # its line alone would take a user's store on it too
    for k, (pos, instr) in enumerate(real):
        if instr.name not in table.stores:
            continue
        name = _versions.local_name(instr.arg)
        if instr.lineno is None:
            synthesized.add(pos)  # cleanup code without a line: never a user's store
            continue
        prev = real[k - 1][1] if k else None
        nxt = real[k + 1][1] if k + 1 < len(real) else None
        if (
            prev is not None
            and nxt is not None
            and prev.name == "LOAD_CONST"
            and prev.arg is None
            and nxt.name in table.deletes
            and _versions.local_name(nxt.arg) == name
            and nxt.lineno == instr.lineno
            and _one_place(prev, instr, nxt)
        ):
            synthesized.add(pos)  # `except ... as name` clean-up: name = None; del name
            continue
        if pos in unplaced or any(_versions.local_name(s.arg) == name and _within(instr, s) for s in saves):
            synthesized.add(pos)  # an inlined comprehension's own variable (3.12+)
            if comprehensions is not None:
                comprehensions.add(pos)
    return synthesized


def _one_place(*instrs: Instr) -> bool:
    """Whether the instructions share one source position (all compiler-made), as far as known.

    The clean-up after ``except ... as x`` puts all of its instructions at one place;
    a user's own ``x = None; del x`` has three. Code without columns (3.10) cannot tell.
    """
    columns = {getattr(getattr(i, "location", None), "col_offset", None) for i in instrs}
    return None in columns or len(columns) == 1


Position = Any  # an index into instructions(code), or (index of LOAD_CONST, inner position)
Raw = Tuple[str, Position, Instr, Tuple[object, ...], Any]  # name, position, instr, identity, extra


def _group(sites: Iterable[Raw], placed: bool = False) -> Dict[str, List[Tuple[List[Position], Instr, Any]]]:
    """Group sites by source construct; order each name's groups in source order.

    ``placed``: each site's extra is its place in source order (operators).
    """
    groups: Dict[Tuple[str, Tuple[object, ...]], Tuple[Any, List[Position], Instr, Any]] = {}
    for seq, (name, pos, instr, ident, extra) in enumerate(sites):
        key = (name, ident)
        if key in groups:
            groups[key][1].append(pos)
        else:
            column = _column(instr)
            order = extra if placed else (instr.lineno or 0, -1 if column is None else column, seq)
            groups[key] = (order, [pos], instr, extra)
    by_name: Dict[str, List[Tuple[Tuple[int, int, int], List[Position], Instr, Any]]] = {}
    for (name, _), group in groups.items():
        by_name.setdefault(name, []).append(group)
    return {
        name: [
            (positions, instr, extra) for _, positions, instr, extra in sorted(entries, key=lambda g: g[0])
        ]
        for name, entries in sorted(by_name.items())
    }


def _signature_text(code: CodeType) -> str:
    """``code``'s parameters in ``def`` order, with ``/``, ``*`` and ``**``, without defaults.

    >>> def f(a, b=1, /, c=2, *args, k, **kw): pass
    >>> _signature_text(f.__code__)
    'a, b, /, c, *args, k, **kw'
    """
    names, positional, kwonly = code.co_varnames, code.co_argcount, code.co_kwonlyargcount
    parts = list(names[:positional])
    if code.co_posonlyargcount:
        parts.insert(code.co_posonlyargcount, "/")
    at = positional + kwonly  # co_varnames: positional, keyword-only, then *args and **kwargs
    if code.co_flags & inspect.CO_VARARGS:
        parts.append("*" + names[at])
        at += 1
    elif kwonly:
        parts.append("*")
    parts += names[positional : positional + kwonly]
    if code.co_flags & inspect.CO_VARKEYWORDS:
        parts.append("**" + names[at])
    return ", ".join(parts)


def _argument_names(code: CodeType) -> Tuple[str, ...]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return tuple(code.co_varnames[:count])


def _chains(
    real: List[Tuple[int, Instr]], bytecode: Sequence[object]
) -> Iterator[Tuple[str, int, Instr, bool]]:
    """Yield (chain, position, instr, method) for every attribute load on a local, a global
    (``cfg.lr``, ``math.pi``) or a builtin."""
    table = _versions.current()
    dup = table.dup(None)
    chain: Optional[List[str]] = None
    previous = -1
    for pos, instr in real:
        if chain is not None and any(isinstance(x, Label) for x in bytecode[previous + 1 : pos]):
            chain = None  # a jump target between root and attribute: not one expression
        previous = pos
        if chain is not None and instr.name == dup.name and instr.arg == dup.arg:
            continue  # 'self.n += 1' copies self, then loads n from the copy: the same chain
        attr = table.attr_load(instr)
        method = table.method_load(instr) if attr is None else None
        if chain is not None and (attr or method):
            chain.append(str(attr or method))
            yield ".".join(chain), pos, instr, method is not None
            if method is not None:
                chain = None
            continue
        root = _root_name(instr, table)
        chain = None if root is None else [root]


def _root_name(instr: Instr, table: _versions.Table) -> Optional[str]:
    if instr.name in table.local_loads:
        return _versions.local_name(instr.arg)
    return _versions.global_name(instr)


def _callees(real: List[Tuple[int, Instr]], bytecode: Sequence[object]) -> Iterator[Tuple[str, int, int]]:
    """Yield (chain, position of its last load, stack slots it occupies) for every
    name or attribute chain that might be called: local, global and builtin roots."""
    table = _versions.current()
    chain: Optional[List[str]] = None
    loaded = 0  # stack slots the chain's own loads push
    null_before = False
    previous: Optional[Instr] = None
    last = -1
    for pos, instr in real:
        if chain is not None and any(isinstance(x, Label) for x in bytecode[last + 1 : pos]):
            chain = None
        last = pos
        attr = table.attr_load(instr)
        method = table.method_load(instr) if attr is None else None
        if chain is not None and (attr or method):
            chain.append(str(attr or method))
            loaded += instr.stack_effect()
            # A NULL pushed just before the root (3.11/3.12) is this callee's only if its
            # loads bring no NULL or self of their own; otherwise it is an outer call's
            # (``o.f(1)(2)``, ``getattr(o, 'f')(x)``).
            yield ".".join(chain), pos, loaded + (null_before and loaded == 1)
            if method is not None:
                chain = None
        else:
            root = _root_name(instr, table)
            if root is None:
                chain = None
            else:
                chain = [root]
                loaded = instr.stack_effect()
                null_before = (
                    table.null_below_callable and previous is not None and previous.name == "PUSH_NULL"
                )
                yield root, pos, loaded + (null_before and loaded == 1)
        previous = instr


def consuming_calls(
    items: Sequence[object], pos: int, slots: int, labels: Optional[Dict[Label, int]] = None
) -> List[int]:
    """The call instructions that call what the instructions up to ``pos`` pushed.

    ``slots`` is how many stack slots the callable takes (2 with a NULL or self
    slot). Returns [] if the value is used any other way. Follows every path, since
    3.10's compiler copies a statement's tail into each branch (one load, several
    calls); used both to find call sites and to match 3.10's ``CALL_METHOD``.

    >>> def f(g, a):
    ...     return g(a, 1)
    >>> items = instructions(f.__code__)
    >>> pos = next(k for k, i in enumerate(items) if getattr(i, "arg", None) == "g")
    >>> slots = 2 if getattr(items[pos - 1], "name", "") == "PUSH_NULL" else 1  # 3.11/3.12: NULL first
    >>> [items[k].name.split("_")[0] for k in consuming_calls(items, pos, slots)]
    ['CALL']
    """
    table = _versions.current()
    if labels is None:  # label -> position; callers scanning many loads pass it once
        labels = {item: k for k, item in enumerate(items) if isinstance(item, Label)}
    found: List[int] = []
    seen = set()
    passed: Set[Label] = set()
    exits: Set[Label] = set()  # async for loops' END_ASYNC_FOR handlers, entered from their regions
    work = [(pos + 1, 0)]
    while work:
        k, height = work.pop()
        while k < len(items) and (k, height) not in seen:
            seen.add((k, height))
            item = items[k]
            k += 1
            if isinstance(item, Label):
                passed.add(item)
            if not isinstance(item, Instr):
                continue
            if height == 0 and (table.attr_load(item) or table.method_load(item)):
                return []  # an attribute of this value is loaded: the chain goes on
            if height == 0 and item.name in table.with_enters:
                return []  # a context manager: the call at the block's end is its __exit__
            pre, post = item.pre_and_post_stack_effect(jump=False)
            if height + pre < 0:  # this instruction consumes the callee's slots
                if item.name in table.calls and height + pre == -slots:
                    found.append(k - 1)
                    break
                return []
            target = table.jump_target(item)
            if target is not None:
                jump_pre, jump_post = item.pre_and_post_stack_effect(jump=True)
                work.append((labels[target], height + jump_pre + jump_post))
            exit = _async_for_exit(items, k - 1, labels)
            if exit is not None:
                # The loop ends there with the exception above the async iterator.
                work.append((labels[exit], height + 1))
                exits.add(exit)
            if item.is_uncond_jump() or item.is_final():
                break
            height += pre + post
    if found and passed:
        # Where another path joins this one, the callee on the stack may be another
        # value: '(h if c else k)(a)', '(fn or h)(a)'. Then it names no call.
        visited = {k for k, _ in seen} | {pos}
        entries = _entries(items)
        if any(
            source not in visited
            and not _rethrown(items, source, table)
            # (a region of the loop's throw() path enters its exit at the loop's own stack)
            and not (label in exits and isinstance(items[source], TryBegin))
            for label in passed
            for source in entries.get(label, ())
        ):
            return []
    return sorted(set(found))


def computed_callee_calls(code: CodeType) -> List[int]:
    """The calls (positions in :func:`instructions`) whose callee an expression computes:
    neither a name, an attribute chain, nor an attribute of a value (``f(x).flatten()``),
    but an item (``ACTS[name](x)``, ``self.acts[0](x)``), a call's result
    (``getattr(F, name)(x)``) or a value picked at run time (``(f if c else g)(x)``).
    What they call is known only when they run.

    >>> def f(acts, g, x, c):
    ...     return acts[0](x), g(x)(x), (g if c else acts)(x), g(x), x.real(), g(x).imag()
    >>> len(computed_callee_calls(f.__code__))  # the first three
    3
    """
    table = _versions.current()
    items = instructions(code)
    real = [(pos, i) for pos, i in enumerate(items) if isinstance(i, Instr)]
    labels = {item: k for k, item in enumerate(items) if isinstance(item, Label)}
    named: Set[int] = set()
    for _, pos, slots in _callees(real, items):
        named.update(consuming_calls(items, pos, slots, labels))
    # (a chain's call that is no site, as '(F.relu if c or True else F.gelu)(x)' folded, stays)
    chained = {pos for _, pos, _, _ in _chains(real, items)}
    for pos, instr in real:
        if pos in chained:
            continue
        if table.method_load(instr):
            named.update(consuming_calls(items, pos, 2, labels))
        elif table.attr_load(instr) or instr.name in table.function_makers:
            # (a function made here: a comprehension's on 3.10/3.11, a generator expression's, a
            # lambda called at once, whose code is read on its own; a NULL, on 3.11/3.12, is
            # pushed before the value's code)
            named.update(consuming_calls(items, pos, 1, labels) or consuming_calls(items, pos, 2, labels))
    return [pos for pos, instr in real if instr.name in table.calls and pos not in named]


def inlined_call(items: Sequence[object], pos: int, slots: int, labels: Dict[Label, int]) -> List[int]:
    """Where a call that the compiler runs as a loop of the function's own has its result.

    3.14 compiles ``all(g)``, ``any(g)`` and ``tuple(g)`` of a generator expression ``g``
    as a test whether the name loaded at ``pos`` is the builtin: if it is, a loop in the
    function computes the result (``LOAD_CONST True``/``False`` for ``all``/``any``, the
    list made into a tuple for ``tuple``); if not, the call runs. Each place the result is
    pushed, on either path, is given, as :func:`consuming_calls` gives the calls; [] for
    any other use of the value, and on versions that call every call.

    >>> def f(xs):
    ...     return any(x > 1 for x in xs)
    >>> items = instructions(f.__code__)
    >>> labels = {item: k for k, item in enumerate(items) if isinstance(item, Label)}
    >>> pos = next(k for k, i in enumerate(items) if isinstance(i, Instr) and "any" in str(i.arg))
    >>> results = inlined_call(items, pos, 1, labels)
    >>> results == [] or sorted({items[k].name for k in results}) == ["CALL", "LOAD_CONST"]
    True
    """
    table = _versions.current()
    if not table.inlined_call_check:
        return []
    test: List[Tuple[int, Instr]] = []
    for k in range(pos + 1, len(items)):
        item = items[k]
        if isinstance(item, Label) or len(test) == len(table.inlined_call_check):
            break
        if isinstance(item, Instr):
            test.append((k, item))
    if [item.name for _, item in test] != list(table.inlined_call_check):
        return []
    jump = table.jump_target(test[-1][1])
    if jump is None or jump not in labels:
        return []
    otherwise = labels[jump]
    calls = consuming_calls(items, otherwise, slots, labels)  # the callee still on the stack there
    # The loop's way: the callee popped, then everything up to the call's own label. The
    # result is pushed right after the loop's iterator is popped, leaving the stack as it
    # was below the callee (tuple's: with the list to make a tuple of); loops of the
    # iterable's own run above the genexpr's function, higher.
    # (Which builtin: the one the test compares with, whatever loaded the name: a global, or
    # a local or argument, tuple=tuple.)
    leaves = 1 if any(getattr(item.arg, "name", None) == table.inlined_with_list for _, item in test) else 0
    results: List[int] = []
    work, seen = [(test[-1][0] + 1, 1)], set()  # (height 1: the callee)
    while work:
        k, height = work.pop()
        while test[-1][0] < k < otherwise and (k, height) not in seen:
            seen.add((k, height))
            item = items[k]
            k += 1
            if not isinstance(item, Instr):
                continue
            pre, post = item.pre_and_post_stack_effect(jump=False)
            if height + pre < 0:
                return []  # it reaches below the callee: no loop of this call's
            target = table.jump_target(item)
            if target is not None and target in labels:
                jump_pre, jump_post = item.pre_and_post_stack_effect(jump=True)
                work.append((labels[target], height + jump_pre + jump_post))
            if item.name == table.pop_iterator and height + pre + post == leaves:
                results.append(next(j for j in range(k, len(items)) if isinstance(items[j], Instr)))
                break  # (what follows is the code after the call's)
            if item.is_uncond_jump() or item.is_final():
                break
            height += pre + post
    pushed = {cast(Instr, items[k]).name for k in results}
    if not calls or not results or not pushed <= table.inlined_results:
        return []
    return sorted(set(calls + results))


def _async_for_exit(items: Sequence[object], pos: int, labels: Dict[Label, int]) -> Optional[Label]:
    """Where an ``async for`` loop whose ``GET_ANEXT`` is at ``pos`` goes on when it ends, if
    that is through the exception table (3.11+): the ``END_ASYNC_FOR`` handler of the region
    ``pos`` is in, entered with the stack as before ``GET_ANEXT`` and the exception on top.
    None for any other instruction, and on 3.10, whose ``SETUP_FINALLY`` is a jump.

    A value pushed before an async comprehension, inlined on 3.12+ (``sum([x async for
    x in it])``'s callee), is used only after that loop ends.
    """
    item = items[pos]
    if not isinstance(item, Instr) or item.name != "GET_ANEXT":
        return None
    for k in range(pos - 1, -1, -1):
        before = items[k]
        if isinstance(before, TryEnd):
            return None
        if isinstance(before, TryBegin):
            handler = before.target
            if not isinstance(handler, Label) or handler not in labels:
                return None
            first = next(
                (i for i in itertools.islice(items, labels[handler], None) if isinstance(i, Instr)), None
            )
            return handler if first is not None and first.name == "END_ASYNC_FOR" else None
    return None


def _rethrown(items: Sequence[object], source: int, table: _versions.Table) -> bool:
    """Whether ``source`` ends an ``await``'s ``throw()`` path (its stack is the send
    loop's: the callee below it is the same): the rethrow opcode falling through into
    the loop's end (in a handler's body), or the jump right after it."""
    item = items[source]
    if isinstance(item, Instr) and item.name == table.await_rethrow:
        return True
    for item in reversed(items[:source]):
        if isinstance(item, Instr):
            return item.name == table.await_rethrow
    return False


#: The last ``(items, _entries(items))``: a function's call sites ask for the same code.
_last_entries: Tuple[Any, Dict[Label, List[int]]] = (None, {})


def _entries(items: Sequence[object]) -> Dict[Label, List[int]]:
    """For each label, the positions execution can come from: its jumps (and handlers'
    entries), and the instruction before it where that one falls through."""
    global _last_entries
    last = _last_entries  # one read: another thread may replace it
    if last[0] is items:
        return last[1]
    table = _versions.current()
    entries: Dict[Label, List[int]] = {}
    previous: Optional[int] = None  # the last instruction that falls through, if any
    runs: List[List[Label]] = [[]]  # labels with nothing between them: one place
    for k, item in enumerate(items):
        if isinstance(item, Label):
            entries.setdefault(item, [])
            if previous is not None:
                entries[item].append(previous)
            runs[-1].append(item)
            continue
        target = table.jump_target(item) if isinstance(item, Instr) else getattr(item, "target", None)
        if isinstance(target, Label):
            entries.setdefault(target, []).append(k)
        if isinstance(item, Instr):
            previous = None if item.is_uncond_jump() or item.is_final() else k
            if runs[-1]:
                runs.append([])
    for run in runs:
        if len(run) > 1:
            shared = sorted({k for label in run for k in entries[label]})
            for label in run:
                entries[label] = shared
    _last_entries = (items, entries)
    return entries


class _Sites:
    """Raw recordable sites of a code object, with those of its comprehensions that are
    code objects of their own (every one on 3.10/3.11, generator expressions after).

    Such a comprehension is a separate code object (a constant of its function);
    what it calls, loads and computes belongs to the function as a reader sees it,
    and so does a walrus target inside it (a cell of the function, or a free variable
    of it: ``nonlocal x``). Their positions are ``(position of the LOAD_CONST, position
    inside)``.

    Stores are found at once; attribute loads, calls and operators when first asked for
    (:meth:`loads`, :meth:`calls`, :meth:`operators`): telling which call consumes each
    callee is about half of a reading's time, and a target that names a local or a return
    never asks.
    """

    def __init__(self, code: CodeType, outer_cells: frozenset, nested: bool = False) -> None:
        table = _versions.current()
        bytecode = instructions(code)
        real = _real(bytecode)
        identity = _Identity(bytecode)
        self._bytecode, self._real, self._identity, self._nested = bytecode, real, identity, nested
        inlined: Set[int] = set()
        synthesized = _synthesized_stores(real, bytecode, inlined)
        #: Names a comprehension stores as its own variable: no assignments of the function.
        self.comprehension_names = {
            name
            for pos, i in real
            if i.name in table.stores
            and (name := _versions.local_name(i.arg))
            and (pos in inlined or (nested and not (isinstance(i.arg, FreeVar) and name in outer_cells)))
        }
        #: Names the code assigns as globals (``global G``): no locals (for errors about them).
        self.global_names = {i.arg for _, i in real if i.name == "STORE_GLOBAL"}
        #: Why each comprehension whose sites are left out cannot be read.
        self.unreadable: List[str] = []
        self.stores: List[Raw] = [
            (name, pos, i, identity.of(pos, i), None)
            for pos, i in real
            if i.name in table.stores
            and pos not in synthesized
            and (name := _versions.local_name(i.arg))
            and (not nested or (isinstance(i.arg, FreeVar) and name in outer_cells))
        ]
        self.stores = _counted_in_runs(self.stores, bytecode)
        #: The comprehensions read: (position of the LOAD_CONST, its identity, its sites).
        self._inner: List[Tuple[int, Tuple[object, ...], _Sites]] = []
        for pos, i in real:
            if (
                i.name == "LOAD_CONST"
                and isinstance(i.arg, CodeType)
                and i.arg.co_name in table.separate_comprehensions
            ):
                try:
                    inner = _Sites(i.arg, outer_cells, nested=True)
                except NotPatchableError as error:
                    # Code the bytecode package cannot read (3.14's t'{x}'): its sites are
                    # left out, and the function is rewritten around it, as around a nested def.
                    self.unreadable.append(str(error))
                    continue
                # Its sites are its own constructs, never one of the function's on the same
                # line (3.10 tells constructs apart by line and count).
                where = identity.of(pos, i)
                self._inner.append((pos, where, inner))
                self.stores += [_nest(pos, where, site) for site in inner.stores]
                self.comprehension_names |= inner.comprehension_names
        self._loads: Optional[List[Raw]] = None
        self._calls: Optional[List[Raw]] = None
        self._operators: Optional[List[Raw]] = None

    def loads(self) -> List[Raw]:
        """The attribute loads, the comprehensions' included (found at the first call)."""
        found = self._loads
        if found is None:
            identity = self._identity
            found = [(c, p, i, identity.of(p, i), m) for c, p, i, m in _chains(self._real, self._bytecode)]
            for pos, where, inner in self._inner:
                found += [_nest(pos, where, site) for site in inner.loads()]
            self._loads = found  # (two threads may both find them: equal lists)
        return found

    def calls(self) -> List[Raw]:
        """The call sites, the comprehensions' included (found at the first call)."""
        found = self._calls
        if found is None:
            found = self._own_calls()
            for pos, where, inner in self._inner:
                found += [_nest(pos, where, site) for site in inner.calls()]
            self._calls = found  # (two threads may both find them: equal lists)
        return found

    def _own_calls(self) -> List[Raw]:
        table = _versions.current()
        bytecode, identity = self._bytecode, self._identity
        calls: List[Raw] = []
        labels = {item: k for k, item in enumerate(bytecode) if isinstance(item, Label)}
        for chain, pos, slots in _callees(self._real, bytecode):
            load = bytecode[pos]
            assert isinstance(load, Instr)
            # One site per call instruction, identified by its callee's load, and placed
            # where the call instruction says it starts (the callee's start; a method call
            # written over lines, `(o\n.m(1))`, at the method's name, as tracebacks show it):
            # a load split from a 3.13 pair carries the pair's first half's place. 3.10 has
            # no columns.
            calls += [
                (chain, call, _placed(cast(Instr, bytecode[call]), load), identity.of(pos, load), None)
                for call in consuming_calls(bytecode, pos, slots, labels)
                or inlined_call(bytecode, pos, slots, labels)
                if not (chain == "super" and _then_attribute(bytecode, call, table))
            ]
        return calls

    def operators(self) -> List[Raw]:
        """The operator sites, the comprehensions' included (found at the first call)."""
        found = self._operators
        if found is None:
            found = self._own_operators()
            for pos, where, inner in self._inner:
                for op, inner_pos, instr, ident, ((line, (index, _)), source) in inner.operators():
                    place = ((line, (pos, index)), source)
                    found.append((op, (pos, inner_pos), instr, (where, ident), place))
            if not self._nested:
                found = _placed_operators(found)
            self._operators = found
        return found

    def _own_operators(self) -> List[Raw]:
        # An operator is placed where its right operand starts in the source, just after
        # the operator itself: '(a + b) + c' has the inner '+' first, as a reader counts, on
        # every version (the instruction's own position spans the whole expression). The
        # operand's first instruction need not be its start in the source ('a + (b if c
        # else d)' runs 'c' first), so the earliest place of its instructions is taken.
        # Code without columns (3.10) is placed in the order the compiler lays it out.
        # Its extra is (order in the code, start in the source or None).
        table = _versions.current()
        bytecode, real, identity = self._bytecode, self._real, self._identity
        operators: List[Raw] = []
        operands = _Operands(real, bytecode)
        found = [(k, pos, i, op) for k, (pos, i) in enumerate(real) if (op := table.binary_op(i)) is not None]
        copies: Dict[Tuple[object, ...], List[Tuple[int, int]]] = {}
        for k, pos, i, _ in found:
            copies.setdefault(identity.of(pos, i), []).append((k, pos))
        starts = {pos: operands.start(k) for k, pos, _, _ in found}
        sources = {pos: _operand_place(bytecode, start, pos) for pos, start in starts.items()}
        index = {pos: j for j, (pos, _) in enumerate(real)}
        folded: Set[int] = set()
        for group in copies.values():
            ends = frozenset(pos for _, pos in group)
            for k, pos in group if len(group) > 1 and _column(real[group[0][0]][1]) is not None else ():
                if sources[pos] is None:
                    # A tail the compiler copied into each branch (3.12+): one operand before them.
                    shared = operands.shared_start(k, ends)
                    if shared is not None:
                        first, source, reached = shared
                        for copy in reached:
                            starts[copy], sources[copy] = first, source
            if not table.folds_percent_format and table.binary_op(real[group[0][0]][1]) == "%":
                # Every copy the same constant: not ("%s" if c else "<%r>") % (a,) copied into branches.
                formats = {_folded_format(bytecode, real, index, k, starts[pos]) for k, pos in group}
                if len(formats) == 1 and None not in formats:
                    folded.update(ends)
        for _, pos, i, op in found:
            operand = starts[pos]
            if pos in folded:
                continue  # compiled into f-string code from 3.11 on: no operator there either
            anchor = i if operand is None else cast(Instr, bytecode[operand])
            order = (anchor.lineno or 0, (pos if operand is None else operand, -1))
            operators.append((op, pos, i, identity.of(pos, i), (order, sources[pos])))
        return operators


def _folded_format(
    bytecode: Sequence[object],
    real: List[Tuple[int, Instr]],
    index: Dict[int, int],
    k: int,
    start: Optional[int],
) -> Optional[str]:
    """The format, if the ``%`` operator ``real[k]`` (its right operand starting at ``start``;
    ``index``: position -> index in ``real``) is a string constant formatting a tuple
    display, ``'%s-%r' % (a, b)``, that 3.11+ compile into f-string code: one ``%s``,
    ``%r`` or ``%a`` unit per item (see _percent_units). 3.10 builds a tuple of more
    than 30 items another way: those are not recognised."""
    j = index.get(start, 0) if start is not None else 0
    if j == 0 or k == 0:
        return None
    before, items = real[k - 1]
    if items.name != "BUILD_TUPLE" or any(isinstance(x, Label) for x in bytecode[before + 1 : real[k][0]]):
        return None
    left_pos, left = real[j - 1]
    if left.name != "LOAD_CONST" or not isinstance(left.arg, str):
        return None
    if any(isinstance(x, Label) for x in bytecode[left_pos + 1 : cast(int, start)]):
        return None
    return left.arg if _percent_units(left.arg) == items.arg else None


def _percent_units(fmt: str) -> Optional[int]:
    """How many format units ``fmt`` has if every one is as simple as CPython 3.11+ compile
    into f-string code (``%s``, ``%r``, ``%a``; flags, up to two digits of width and of
    precision), else None.

    >>> _percent_units("%s-%5r %%"), _percent_units("%d"), _percent_units("%100s")
    (2, None, None)
    """
    pos = count = 0
    while True:
        while pos < len(fmt) and (fmt[pos] != "%" or fmt[pos : pos + 2] == "%%"):
            pos += 2 if fmt[pos] == "%" else 1
        if pos >= len(fmt):
            return count
        pos += 1  # the '%'
        while pos < len(fmt) and fmt[pos] in "-+ #0":
            pos += 1
        for leading in ("", "."):  # the width, then the precision
            if fmt.startswith(leading, pos):
                pos += len(leading)
                digits = 0
                while pos < len(fmt) and fmt[pos].isdigit() and fmt[pos].isascii():
                    pos, digits = pos + 1, digits + 1
                if digits >= 3:
                    return None
                if leading and pos >= len(fmt):
                    return None
        if pos >= len(fmt) or fmt[pos] not in "sra":
            return None
        pos, count = pos + 1, count + 1


def _placed(call: Instr, load: Instr) -> Instr:
    """Which instruction places a call site: the call, where it has a column (3.11+)."""
    return call if _column(call) is not None and call.lineno is not None else load


def _then_attribute(bytecode: Sequence[object], pos: int, table: _versions.Table) -> bool:
    """Whether an attribute of what the instruction at ``pos`` pushed is loaded right after.

    ``super().m`` is one instruction from 3.12 on (``LOAD_SUPER_ATTR``), no call:
    so that a function has the same call sites on every version, it is none on
    3.10/3.11 either.
    """
    following = next((item for item in bytecode[pos + 1 :] if isinstance(item, Instr)), None)
    return following is not None and bool(table.attr_load(following) or table.method_load(following))


def _source_start(items: Sequence[object]) -> Optional[Tuple[int, int]]:
    """The earliest (line, column) of the instructions in ``items`` that have one, or None.

    A split pair's second half has its first half's place, before its own: it counts
    only where nothing else does.
    """
    places = [
        (isinstance(instr, _Borrowed), instr.lineno, column)
        for instr in items
        if isinstance(instr, Instr) and instr.lineno is not None and (column := _column(instr)) is not None
    ]
    return min(places)[1:] if places else None


def _operand_place(bytecode: Sequence[object], start: Optional[int], pos: int) -> Optional[Tuple[int, int]]:
    """Where the right operand of the binary operator at ``pos``, starting at ``start``,
    starts in the source (None: not known).

    A lone name whose load is a split pair's second half (``a % b`` on 3.13: one
    instruction loads both, placed at ``a``) ends where the operator's span ends.
    """
    if start is None:
        return None
    operand = [item for item in bytecode[start:pos] if isinstance(item, Instr)]
    end = cast(Instr, bytecode[pos]).location
    if (
        len(operand) == 1
        and isinstance(operand[0], _Borrowed)
        and end is not None
        and end.end_lineno is not None
        and end.end_col_offset is not None
    ):
        return end.end_lineno, end.end_col_offset - len(_versions.local_name(operand[0].arg))
    return _source_start(bytecode[start:pos])


def _placed_operators(operators: List[Raw]) -> List[Raw]:
    """The operators with their place in source order as extra (see :func:`_group`).

    Where every operator's right operand has columns (3.11+), its start in the source
    (the order in the code breaks ties); else line by line, and on one line in the
    order the compiler lays them out (3.10: a condition before its branches, an
    assignment's value before its subscript target).
    """
    by_source = all(source is not None for *_, (_, source) in operators)
    return [
        (op, pos, instr, ident, (source[0], (source[1], order[1])) if by_source else order)
        for op, pos, instr, ident, (order, source) in operators
    ]


class _Operands:
    """Where the right operands of a code's binary operators start."""

    def __init__(self, real: List[Tuple[int, Instr]], bytecode: Sequence[object]) -> None:
        self.real, self.bytecode = real, bytecode
        self.table = _versions.current()
        #: Each label's index, and the indices of the jumps to it.
        self.labels = {item: p for p, item in enumerate(bytecode) if isinstance(item, Label)}
        self.jumps: Dict[Label, List[int]] = {}
        for pos, i in real:
            target = self.table.jump_target(i)
            if target is not None:
                self.jumps.setdefault(target, []).append(pos)

    def start(self, k: int) -> Optional[int]:
        """Where the right operand of the binary operator ``real[k]`` starts, or None.

        That is the latest instruction from which every path of the code up to the
        operator pushes exactly one value without reaching below it, entered only from
        that instruction (no jump from elsewhere lands inside: ``a + (b if c else d)``
        starts at ``c``, not at ``d``).

        Straight-line code is read once, backwards from the operator, keeping what the
        code from each instruction on needs below it and what it leaves; from the first
        label or jump back, each candidate is checked on its own (:meth:`_one_value`).
        """
        real, bytecode = self.real, self.bytecode
        end = real[k][0]
        # Where the operator's span starts, its left operand's start (3.11+; 3.10 has no columns).
        first_line = real[k][1].lineno if _column(real[k][1]) is not None else None
        need = left = 0  # of the code from the candidate to the operator
        straight = True
        for j in range(k - 1, -1, -1):
            start, instr = real[j]
            if straight:
                following = real[j + 1][0]
                straight = not (
                    self.table.jump_target(instr) is not None
                    or instr.is_final()
                    or any(isinstance(bytecode[p], Label) for p in range(start + 1, following))
                )
            if straight:
                pre, post = instr.pre_and_post_stack_effect(jump=False)
                need = max(0, -pre, need - pre - post)
                left += pre + post
                if need == 0 and left == 1:
                    return start
            elif first_line is not None and instr.lineno is not None and instr.lineno < first_line:
                return None  # before the expression (3.11+): its right operand cannot start there
            elif self._one_value(start, end):
                return start
        return None

    def shared_start(
        self, k: int, ends: FrozenSet[int]
    ) -> Optional[Tuple[int, Optional[Tuple[int, int]], Set[int]]]:
        """For the binary operator ``real[k]``, one of the copies at ``ends`` the compiler made
        of it (3.12+ copy a statement's short tail into each branch of its right operand:
        ``n * (a or (1 if c else 2))``): where the right operand they share starts, its
        start in the source, and the copies it reaches. None if no instruction before
        starts code that reaches ``real[k]`` and another copy, every path reaching a copy
        having pushed one value, entered from nowhere else.
        """
        first_line = self.real[k][1].lineno or 0  # the operator's span starts there (3.11+)
        for j in range(k - 1, -1, -1):
            start, instr = self.real[j]
            if instr.lineno is not None and instr.lineno < first_line:
                return None  # before the expression: its operand cannot start there
            found = self._walk(start, ends)
            if found is None or self.real[k][0] not in found[1] or len(found[1]) < 2:
                continue
            visited, reached = found
            if any(
                isinstance(self.bytecode[p], Label)
                and any(
                    source not in visited and not _rethrown(self.bytecode, source, self.table)
                    for source in self.jumps.get(cast(Label, self.bytecode[p]), ())
                )
                for p in visited
            ):
                continue  # entered from elsewhere
            return start, _source_start([self.bytecode[p] for p in sorted(visited)]), reached
        return None

    def _one_value(self, start: int, end: int) -> bool:
        """Whether the code from ``start`` to ``end`` (excluded) is entered at ``start`` only and
        every path through it reaches ``end`` having pushed one value, never reaching below."""
        bytecode = self.bytecode
        for p in range(start + 1, end):
            item = bytecode[p]
            if isinstance(item, Label) and any(
                not start <= source < end and not _rethrown(bytecode, source, self.table)
                for source in self.jumps.get(item, ())
            ):
                return False  # entered from elsewhere (an await's throw() path returns to its loop)
        return self._walk(start, frozenset([end]), last=end) is not None

    def _walk(
        self, start: int, ends: FrozenSet[int], last: Optional[int] = None
    ) -> Optional[Tuple[Set[int], Set[int]]]:
        """Follow every path from ``start`` until it reaches one of ``ends``: the positions on
        the way and the ends reached, if every path reaches one having pushed one value,
        never reaching below, and jumps nowhere before ``start`` (nor after ``last``)."""
        bytecode, labels = self.bytecode, self.labels
        work, seen, visited, reached = [(start, 0)], set(), set(), set()
        while work:
            p, height = work.pop()
            while p not in ends:
                if p >= len(bytecode):
                    return None  # ran off the end
                if (p, height) in seen:
                    break
                seen.add((p, height))
                visited.add(p)
                item = bytecode[p]
                p += 1
                if not isinstance(item, Instr):
                    continue
                label = self.table.jump_target(item)
                if label is not None:
                    target = labels.get(label)
                    if target is None or target < start or (last is not None and target > last):
                        return None  # leaves the range
                    pre, post = item.pre_and_post_stack_effect(jump=True)
                    if height + pre < 0:
                        return None
                    work.append((target, height + pre + post))
                    if item.is_uncond_jump():
                        break
                pre, post = item.pre_and_post_stack_effect(jump=False)
                if height + pre < 0 or item.is_final():
                    return None
                height += pre + post
            else:
                if height != 1:
                    return None
                reached.add(p)
        return visited, reached


def _counted_in_runs(sites: List[Raw], bytecode: Sequence[object]) -> List[Raw]:
    """``sites`` (in code order), where one source place holds several of a name, told apart.

    From 3.11 a store's place is its target's, but an ``import`` gives each of its stores the
    whole statement's: ``import os as x, sys as x`` is two assignments to ``x`` at one place.
    Each of the compiler's copies of a statement (both paths of a ``finally``) is entered
    by a jump or follows code that jumps away or ends, so the n-th site of a name at a place,
    counted since the last of those, is the n-th assignment there in every copy: it keeps
    the place's identity with its count added (the first, count 0, keeps it as it is). 3.10
    counts its sites so already.

    >>> place = (1, 4, 1, 28)
    >>> stores = [("x", 1, None, place, None), ("x", 3, None, place, None)]
    >>> [site[3] for site in _counted_in_runs(stores, [Instr("NOP")] * 4)]
    [(1, 4, 1, 28), (1, 4, 1, 28, 1)]
    >>> [site[3] for site in _counted_in_runs(stores, [Instr("NOP"), Instr("NOP"), Label(), Instr("NOP")])]
    [(1, 4, 1, 28), (1, 4, 1, 28)]
    """
    if len({(name, ident) for name, _, _, ident, _ in sites}) == len(sites):
        return sites  # each at a place of its own (most code): nothing to count
    counted: List[Raw] = []
    seen: Dict[Tuple[str, Tuple[object, ...]], int] = {}
    scanned = 0
    for name, pos, instr, ident, extra in sites:
        if any([_run_ends(item) for item in bytecode[scanned:pos]]):
            seen = {}  # a new run, and maybe a copy, starts
        scanned = pos
        count = seen.get((name, ident), 0)
        seen[(name, ident)] = count + 1
        counted.append((name, pos, instr, ident + (count,) if count else ident, extra))
    return counted


def _run_ends(item: object) -> bool:
    """Whether ``item`` is a jump target, or code that never runs on into what follows it."""
    if isinstance(item, Label):
        return True
    return isinstance(item, Instr) and (item.is_uncond_jump() or item.is_final())


def _nest(outer: int, where: Tuple[object, ...], site: Raw) -> Raw:
    name, pos, instr, ident, extra = site
    return name, (outer, pos), instr, (where, ident), extra


def read(code: CodeType, qualname: Optional[str] = None) -> CodeMap:
    """Find every recordable site in ``code``, numbered in source order (cached per code object).

    ``qualname`` names the function in messages (3.10 code objects lack one).

    >>> def g(self, x):
    ...     y = self.scale * x
    ...     return y
    >>> cmap = read(g.__code__)
    >>> sorted(cmap.locals), sorted(cmap.attributes), len(cmap.returns)
    (['y'], ['self.scale'], 1)
    """
    return _read(code_key(code), qualname)


def forget_readings() -> None:
    """Forget every code object read and decoded (see :func:`bcrecord.rewrite.clear_cache`).

    >>> forget_readings(); _read.cache_info().currsize
    0
    """
    _decoded.cache_clear()
    _read.cache_clear()


@functools.lru_cache(maxsize=256)
def _read(key: Tuple[object, ...], qualname: Optional[str] = None) -> CodeMap:
    """The uncached :func:`read` (``key``: :func:`code_key`)."""
    code = cast(CodeType, key[0])
    table = _versions.current()
    bytecode = instructions(code)
    real = _real(bytecode)
    raw = _Sites(code, frozenset(code.co_cellvars + code.co_freevars))

    local_map = {
        name: tuple(
            # A split pair's second store has its first's column, not its own (3.13: 'na, da = p'): none.
            Assignment(name, n, instr.lineno or 0, _own_column(instr), tuple(positions))
            for n, (positions, instr, _) in enumerate(groups)
        )
        for name, groups in _group(raw.stores).items()
        if _nameable(name)
    }
    return_ops = {table.return_value, table.return_const}
    # One site per source position: the compiler gives a `with` body's return and the
    # return after an exception its __exit__ swallowed the same place, a reader one row.
    return_positions: Dict[Tuple[Optional[int], Optional[int]], List[int]] = {}
    for pos, instr in real:
        if instr.name in return_ops:
            return_positions.setdefault((instr.lineno, _column(instr)), []).append(pos)
    returns = tuple(
        ReturnSite(n, line, column, tuple(positions))
        for n, ((line, column), positions) in enumerate(
            sorted(return_positions.items(), key=lambda item: (item[0][0] or 0, item[0][1] or 0, item[1]))
        )
    )

    entry = 0
    for pos, instr in real:
        if instr.name in table.prologue:
            entry = pos + 1
            break
    return CodeMap(
        name=code.co_name,
        qualname=str(qualname or _versions.code_qualname(code) or code.co_name),
        filename=code.co_filename,
        arguments=_argument_names(code),
        signature=_signature_text(code),
        locals=local_map,
        returns=returns,
        entry=entry,
        _later=_LaterSites(code, raw, local_map),
        cells=frozenset(code.co_cellvars),
        comprehension_names=frozenset(raw.comprehension_names),
        free_names=frozenset(code.co_freevars) - {"__class__"},  # (the cell super() reads)
        global_names=frozenset(raw.global_names),
        private_prefix=_private_prefix(_versions.code_qualname(code) or qualname or ""),
        unreadable=tuple(raw.unreadable),
    )


class _LaterSites:
    """A code map's attribute loads, calls and operators, and the positions a per-instance
    patch cannot probe (which they add to), found at the first question (see :class:`CodeMap`)."""

    def __init__(self, code: CodeType, raw: _Sites, local_map: Dict[str, Tuple[Assignment, ...]]) -> None:
        self._code, self._raw, self._locals = code, raw, local_map
        self._attributes: Optional[Dict[str, Tuple[AttributeLoad, ...]]] = None
        self._found: Optional[
            Tuple[Dict[str, Tuple[CallSite, ...]], Dict[str, Tuple[OperatorSite, ...]], FrozenSet[object]]
        ] = None

    def attributes(self) -> Dict[str, Tuple[AttributeLoad, ...]]:
        found = self._attributes
        if found is None:
            found = self._attributes = {  # (two threads may both find them: equal values)
                chain: tuple(
                    AttributeLoad(chain, n, instr.lineno, _column(instr), tuple(positions), method=method)
                    for n, (positions, instr, method) in enumerate(groups)
                )
                for chain, groups in _group(self._raw.loads()).items()
                if _nameable(chain)
            }
        return found

    def found(
        self,
    ) -> Tuple[Dict[str, Tuple[CallSite, ...]], Dict[str, Tuple[OperatorSite, ...]], FrozenSet[object]]:
        found = self._found
        if found is None:
            found = self._found = self._find()  # (two threads may both find them: equal values)
        return found

    def _find(
        self,
    ) -> Tuple[Dict[str, Tuple[CallSite, ...]], Dict[str, Tuple[OperatorSite, ...]], FrozenSet[object]]:
        code, raw = self._code, self._raw
        call_map = {
            chain: tuple(
                CallSite(chain, n, instr.lineno, _column(instr), tuple(positions))
                for n, (positions, instr, _) in enumerate(groups)
            )
            for chain, groups in _group(raw.calls()).items()
            if _nameable(chain)
        }
        operator_map = {
            op: tuple(
                OperatorSite(op, n, instr.lineno, _column(instr), tuple(positions))
                for n, (positions, instr, _) in enumerate(groups)
            )
            for op, groups in _group(raw.operators(), placed=True).items()
        }
        first = code.co_varnames[0] if code.co_argcount else None
        nested = {
            pos
            for group in (self._locals, self.attributes(), call_map, operator_map)
            for sites in group.values()
            for site in sites
            for pos in site.positions
            if isinstance(pos, tuple)
        }
        selfless = frozenset(pos for pos in nested if first not in _code_of(code, pos).co_freevars)
        return call_map, operator_map, selfless


#: Code whose call returns a generator or a coroutine, not what its ``return`` gives.
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def returns_none(code: CodeType) -> bool:
    """Whether a call of ``code`` can only return None: each return gives the constant
    None (a bare ``return``, or the end of the body), never a value computed or jumped to.

    False where that is not plain from the instructions (``return self.log(x)`` returns
    None too, but only the callee knows): a caller that relies on it stays on the safe side.

    >>> def observe(module, args, output):
    ...     if output is None:
    ...         return
    ...     seen.append(output)
    >>> returns_none(observe.__code__), returns_none((lambda m, a, out: out + 1).__code__)
    (True, False)
    >>> returns_none((lambda m, a, out: out if out else None).__code__)
    False
    """
    if code.co_flags & _RESUMABLE:
        return False
    table = _versions.current()
    previous: object = None
    for item in instructions(code):
        if not isinstance(item, (Instr, Label)):
            continue  # (TryBegin, TryEnd: markers, not instructions; the value stays the one loaded)
        if isinstance(item, Instr):
            if item.name == table.return_const and item.arg is not None:
                return False
            # A Label before the return: a jump brings another value to it.
            constant_none = (
                isinstance(previous, Instr) and previous.name == "LOAD_CONST" and previous.arg is None
            )
            if item.name == table.return_value and not constant_none:
                return False
        previous = item
    return True


def _nameable(chain: str) -> bool:
    """Whether a spec can name ``chain``: each of its names is an identifier, as the source's are.

    Code generators name their own variables otherwise, so that none is the source's
    (pytest's assertion rewriting: ``@py_assert1``, ``@pytest_ar._saferepr``).

    >>> _nameable("self.fc"), _nameable("@py_assert1"), _nameable("@pytest_ar._saferepr")
    (True, False, False)
    """
    return all(name.isidentifier() for name in chain.split("."))


def _private_prefix(qualname: str) -> str:
    """The prefix of private names in code named ``qualname``: its innermost class's name
    with one underscore (a scope followed by ``<locals>`` is a function's).

    >>> _private_prefix("Net.forward"), _private_prefix("Net.forward.<locals>.helper"), _private_prefix("f")
    ('_Net', '_Net', '')
    >>> _private_prefix("make.<locals>.__Hidden.step"), _private_prefix("__.m")
    ('_Hidden', '')
    """
    scopes = qualname.split(".")
    pairs = zip(scopes[:-1], scopes[1:], strict=True)
    classes = [name for name, after in pairs if "<locals>" not in (name, after)]
    bare = classes[-1].lstrip("_") if classes else ""
    return f"_{bare}" if bare else ""


#: A spec of one kind (what :func:`compiled_spec` takes, it gives).
_AnySpec = TypeVar("_AnySpec", Local, Attribute, Return, Call, Expr)


def compiled_spec(spec: _AnySpec, code: CodeType, qualname: Optional[str] = None) -> _AnySpec:
    """``spec`` with its private names spelt as ``code`` has them: ``self.__w`` in a method
    of a class ``Net`` is ``self._Net__w`` (``qualname`` names ``code`` where it has no
    ``co_qualname``: 3.10).

    >>> class Net:
    ...     def f(self):
    ...         return self.__w
    >>> compiled_spec(Attribute("self.__w.grad"), Net.f.__code__, "Net.f").target
    'self._Net__w.grad'
    """
    return cast(
        _AnySpec, _as_compiled(spec, _private_prefix(_versions.code_qualname(code) or qualname or ""))
    )


def _as_compiled(spec: Spec, prefix: str) -> Spec:
    """``spec`` with its private names (``self.__w``) spelt as a class's code has them
    (``self._Net__w``), as the compiler does; ``spec`` itself where it has none."""

    def mangled(name: str) -> str:
        private = prefix and name.startswith("__") and not name.endswith("__")
        return f"{prefix}{name}" if private else name

    if isinstance(spec, Local) and mangled(spec.name) != spec.name:
        return dataclasses.replace(spec, name=mangled(spec.name))
    if isinstance(spec, (Attribute, Call)):
        target = ".".join(mangled(part) for part in spec.target.split("."))
        return spec if target == spec.target else dataclasses.replace(spec, target=target)
    return spec


def _code_of(code: CodeType, pos: object) -> CodeType:
    """The code object that holds the nested site position ``pos``, ``(outer, inner)``."""
    while isinstance(pos, tuple):
        outer, pos = cast(Tuple[int, object], pos)
        code = cast(CodeType, cast(Instr, instructions(code)[outer]).arg)
    return code


def _pick(sites: Sequence, index: Optional[Tuple[int, ...]], what: str, func: str) -> List:
    if index is None:
        return list(sites)
    last = len(sites) - 1
    for i in index:
        if i > last:
            raise TargetError(
                f"{what} in {func} has {len(sites)} "
                f"{'site' if len(sites) == 1 else 'sites'} (index 0..{last}); "
                f"there is no index {i}"
            )
    return [sites[i] for i in index]


def _names(items: Iterable[str]) -> str:
    names = sorted(items)
    return ", ".join(names) if names else "(none)"


def resolve(specs: Sequence[Spec], cmap: CodeMap) -> Tuple[ProbePoint, ...]:
    """The probe points for ``specs`` in the code mapped by ``cmap``, or a clear error.

    >>> def h(a):
    ...     b = a
    ...     return b
    >>> [p.label for p in resolve([Local("b"), Return()], read(h.__code__))]
    ['b@0', 'return']
    >>> resolve([Local("c")], read(h.__code__))
    Traceback (most recent call last):
    ...
    bcrecord.errors.TargetError: h has no assignment to a local named 'c'; assigned locals: b; \
arguments (their value at entry): a
    """
    try:
        return _resolve(specs, cmap)
    except TargetError as error:
        if not cmap.unreadable:
            raise
        # The site may be in a comprehension left out: say so.
        raise TargetError(f"{error} (not looked for in: {'; '.join(cmap.unreadable)})") from None


def _resolve(specs: Sequence[Spec], cmap: CodeMap) -> Tuple[ProbePoint, ...]:
    """:func:`resolve`, without the note about comprehensions left out."""
    func = cmap.qualname
    points: List[ProbePoint] = []
    for spec in (_as_compiled(given, cmap.private_prefix) for given in specs):
        if isinstance(spec, Local):
            if spec.name not in cmap.locals and spec.name in cmap.arguments:
                # An argument never reassigned has one value: the one it is called with.
                if spec.index not in (None, (0,)):
                    raise TargetError(
                        f"{func}: argument {spec.name!r} is never reassigned; it has one value, "
                        f"at entry: '{spec.name}' (or '{spec.name}@0')"
                    )
                points.append(ProbePoint("entry", (cmap.entry,), spec.name, root=spec.name, copy=spec.copy))
                continue
            if spec.name not in cmap.locals:
                # Arguments never reassigned are recordable too (at entry): name them.
                kept = [name for name in cmap.arguments if name not in cmap.locals and name != "self"]
                also = f"; arguments (their value at entry): {_names(kept)}" if kept else ""
                # A misspelt 'return' parses as a local.
                hint = did_you_mean(spec.name, [*cmap.locals, *kept, "return"], hide_private=False)
                if spec.name in cmap.comprehension_names:
                    hint = (
                        f" ({spec.name!r} is a comprehension's own variable, no assignment: record "
                        "what the comprehension computes, its calls or operators, or the list it makes)"
                    )
                elif spec.name in cmap.free_names:
                    # A type parameter (def f[T]) is a free variable too, and its code cannot tell.
                    hint = (
                        f" ({spec.name!r} is assigned by an enclosing function, record it there, "
                        "or is a type parameter)"
                    )
                elif spec.name in cmap.global_names:
                    hint = (
                        f" ({spec.name!r} is a global the function assigns ('global {spec.name}'), no local: "
                        "record the call or operator that computes it; bcrecord.targets lists them)"
                    )
                raise TargetError(
                    f"{func} has no assignment to a local named {spec.name!r}; "
                    f"assigned locals: {_names(cmap.locals)}{also}{hint}"
                )
            sites = _pick(cmap.locals[spec.name], spec.index, f"local {spec.name!r}", func)
            points += [
                ProbePoint("store", a.positions, f"{spec.name}@{a.index}", copy=spec.copy) for a in sites
            ]
        elif isinstance(spec, Attribute) and spec.at == "load":
            if spec.target not in cmap.attributes:
                raise TargetError(
                    f"{func} never loads {spec.target!r}; chains it loads: {_names(cmap.attributes)}"
                    + did_you_mean(spec.target, cmap.attributes)
                )
            sites = _pick(cmap.attributes[spec.target], spec.index, f"chain {spec.target!r}", func)
            points += [
                ProbePoint("load", s.positions, f"{spec.target}@{s.index}", method=s.method, copy=spec.copy)
                for s in sites
            ]
        elif isinstance(spec, Attribute):
            root, *rest = spec.chain
            if root not in cmap.arguments:
                if spec.target in cmap.attributes:
                    where = f"record it where it is read: '{spec.target}@0', or at='load'"
                else:
                    where = f"{func} never loads it; chains it loads: {_names(cmap.attributes)}"
                raise TargetError(
                    f"{spec.target!r} is read at entry, so its root must be an argument of "
                    f"{func}; arguments: {_names(cmap.arguments)} ({where})"
                )
            points.append(
                ProbePoint("entry", (cmap.entry,), spec.target, root=root, chain=tuple(rest), copy=spec.copy)
            )
        elif isinstance(spec, Call):
            if spec.target not in cmap.calls:
                hint = did_you_mean(spec.target, cmap.calls)
                loaded = spec.target in cmap.attributes or spec.target in cmap.locals
                if loaded or spec.target in cmap.arguments:
                    # self.layers[0](x): the item is called, not the chain; no call site names it.
                    site = f"'{spec.target}@0'" if loaded else f"'{spec.target}'"
                    hint = (
                        f" (where an item of it is called, {spec.target}[0](x), that call is no call "
                        "site: record its value where it is assigned to a local or returned ('return'), "
                        f"or {site})"
                    )
                if spec.target == "super" or spec.target.startswith("super."):
                    hint = f" ({SUPER_NO_CALL})"
                raise TargetError(f"{func} never calls {spec.target!r}; callees: {_names(cmap.calls)}{hint}")
            sites = _pick(cmap.calls[spec.target], spec.index, f"call {spec.target!r}", func)
            points += [
                ProbePoint("call", c.positions, f"{spec.target}()@{c.index}", copy=spec.copy) for c in sites
            ]
        elif isinstance(spec, Expr):
            if spec.op not in cmap.operators:
                found = " ".join(sorted(cmap.operators)) or "(none)"
                raise TargetError(f"{func} has no {spec.op!r} operator; operators: {found}")
            sites = _pick(cmap.operators[spec.op], spec.index, f"operator {spec.op!r}", func)
            points += [ProbePoint("expr", o.positions, f"{spec.op}@{o.index}", copy=spec.copy) for o in sites]
        elif isinstance(spec, Return):
            if not cmap.returns:
                raise TargetError(f"{func} has no return instruction")
            positions = tuple(p for site in cmap.returns for p in site.positions)
            points.append(ProbePoint("return", positions, "return", copy=spec.copy))
    # Overlapping specs (["out", "out@1"]) name a site once: one probe, one value a run.
    unique: Dict[str, ProbePoint] = {}
    for point in points:
        first = unique.setdefault(point.label, point)
        if first.copy is not point.copy and first.copy != point.copy:
            raise TargetError(
                f"{func}: {point.label!r} is asked for twice with different copy policies "
                f"({first.copy!r} and {point.copy!r})"
            )
    return tuple(unique.values())


class Targets:
    """Everything recordable in one function, as data and as a readable table.

    ``locals`` maps each assigned local to its assignments, ``attributes`` each
    attribute chain to its load sites, ``returns`` lists return sites.
    ``str(targets)`` is a table; :meth:`as_dict` is plain data (for JSON).

    >>> import bcrecord
    >>> def f(self, a):
    ...     x = self.scale * a
    ...     return x
    >>> found = bcrecord.targets(f)
    >>> found.specs()
    ['x@0', 'self.scale@0', '*@0', 'return']
    >>> [(row["kind"], row["target"]) for row in found.as_dict()["targets"]]
    [('local', 'x'), ('attribute', 'self.scale'), ('operator', '*'), ('return', 'return')]
    """

    def __init__(self, cmap: CodeMap) -> None:
        self.name = cmap.qualname
        self.arguments = cmap.arguments
        self._signature = cmap.signature
        self.locals = dict(cmap.locals)
        self.attributes = dict(cmap.attributes)
        self.calls = dict(cmap.calls)
        self.operators = dict(cmap.operators)
        self.returns = cmap.returns
        self._selfless = cmap.selfless

    def specs(self, per_instance: bool = False) -> List[str]:
        """Every short-form spec that names one site here, in a table's order.

        ``per_instance=True`` leaves out the sites that a per-instance patch (one whose
        probes are given the first argument, as the torch layer's are) cannot probe:
        those inside a comprehension that is code of its own and does not use that
        argument (a generator expression; on 3.10/3.11 any comprehension).

        >>> import bcrecord
        >>> def f(self, a):
        ...     x = self.fc(a)
        ...     x = x + 1
        ...     return x
        >>> bcrecord.targets(f).specs()
        ['x@0', 'x@1', 'self.fc@0', 'self.fc()@0', '+@0', 'return']
        >>> def g(self, xs):
        ...     return all(x.ok() for x in xs), any(self.ok(x) for x in xs)
        >>> bcrecord.targets(g).specs()
        ['self.ok@0', 'x.ok@0', 'all()@0', 'any()@0', 'self.ok()@0', 'x.ok()@0', 'return']
        >>> bcrecord.targets(g).specs(per_instance=True)
        ['self.ok@0', 'all()@0', 'any()@0', 'self.ok()@0', 'return']
        """
        per_instance = require_bool("per_instance", per_instance, error=TypeError)

        def kept(site: Any) -> bool:
            return not per_instance or not self._selfless.intersection(site.positions)

        out = [f"{a.name}@{a.index}" for sites in self.locals.values() for a in sites if kept(a)]
        out += [f"{s.chain}@{s.index}" for sites in self.attributes.values() for s in sites if kept(s)]
        out += [f"{c.callee}()@{c.index}" for sites in self.calls.values() for c in sites if kept(c)]
        out += [f"{o.op}@{o.index}" for sites in self.operators.values() for o in sites if kept(o)]
        return out + (["return"] if self.returns else [])

    def as_dict(self) -> Dict[str, Any]:
        """Plain data: lists of dicts with kind, target, index, line, column and spec
        (the short form that records the site, as the table's last column).

        >>> import bcrecord
        >>> def f(a):
        ...     x = a
        ...     return x
        >>> found = bcrecord.targets(f).as_dict()
        >>> found["function"], found["arguments"]
        ('f', ['a'])
        >>> [(row["kind"], row["target"], row["index"], row["line"]) for row in found["targets"]]
        [('local', 'x', 0, 2), ('return', 'return', 0, 3)]
        >>> [row["spec"] for row in found["targets"]]
        ['x@0', 'return']
        """
        rows: List[Dict[str, object]] = []
        for sites in self.locals.values():
            rows += [
                dict(kind="local", target=a.name, index=a.index, line=a.line, column=a.column) for a in sites
            ]
        for loads in self.attributes.values():
            rows += [
                dict(kind="attribute", target=s.chain, index=s.index, line=s.line, column=s.column)
                for s in loads
            ]
        for calls in self.calls.values():
            rows += [
                dict(kind="call", target=f"{c.callee}()", index=c.index, line=c.line, column=c.column)
                for c in calls
            ]
        for ops in self.operators.values():
            rows += [
                dict(kind="operator", target=o.op, index=o.index, line=o.line, column=o.column) for o in ops
            ]
        rows += [
            dict(kind="return", target="return", index=r.index, line=r.line, column=r.column)
            for r in self.returns
        ]
        for row in rows:
            row["spec"] = "return" if row["kind"] == "return" else f"{row['target']}@{row['index']}"
        return {"function": self.name, "arguments": list(self.arguments), "targets": rows}

    def __str__(self) -> str:
        return self._table()

    def _table(self, encoding: Optional[str] = None) -> str:
        """The table ``str`` gives, its columns measured as a stream of ``encoding`` writes them
        (a local it lacks escaped: ``bcrecord targets`` under an ASCII terminal)."""
        rows = [("kind", "target", "index", "line", "spec")]
        for row in self.as_dict()["targets"]:
            line = "" if row["line"] is None else str(row["line"])
            if row["column"] is not None:
                line += f":{row['column']}"
            rows.append((str(row["kind"]), str(row["target"]), str(row["index"]), line, str(row["spec"])))
        lines = [f"{self.name}({self._signature})", *aligned(rows, encoding)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Targets of {self.name}: {len(self.specs())} sites>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's and Jupyter's display: the table, as ``print`` shows it.

        A notebook cell ending in ``bcrecord.targets(f)`` shows this, not the one-line
        ``repr``. ``printer`` is IPython's pretty printer: only its ``text`` is used.
        """
        printer.text(str(self))
