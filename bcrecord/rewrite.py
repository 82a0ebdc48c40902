"""Build a probed copy of a code object with the ``bytecode`` package.

:func:`insert_probes` is the expensive step (decode, edit, assemble) and is cached
per ``(code, probe points)``. Its result is a :class:`Template` whose probes carry
placeholder site constants; :meth:`Template.bind` swaps in real site ids with a
cheap ``code.replace``, so fifty patches of one method cost one rewrite.

A probe hands a value to the recording runtime; the stack, the variables and the
control flow of the original are left as they were. It is spelled one of two ways
(:func:`set_probe_style`):

* ``'inline'``: ``sinks_get()[site_id].append(value)``, where ``sinks_get`` (a
  constant of the probed code) is :data:`SINKS`'s bound ``get``. Every step is a
  C-level operation (the sinks list belongs to the current context), so a value
  that needs no copy is stored without running any Python frame.
* ``'call'``: ``__bcrecord_probe__(value, site_id)``, one opaque call. Tracing
  compilers can be told to skip it (``bcrecord.torch`` marks it for Dynamo to
  skip); torch.compile cannot trace the inline form (Dynamo raises on its
  constant).

The default, ``'auto'``, is ``'call'`` once torch has been imported and ``'inline'``
otherwise. Per-instance probes, which pass the instance too, always call.

>>> def f(a):
...     x = a + 1
...     return x
>>> from bcrecord.analysis import read, resolve
>>> from bcrecord.specs import Local
>>> template = insert_probes(f.__code__, resolve([Local("x")], read(f.__code__)))
>>> template.bind([7]).co_varnames == f.__code__.co_varnames
True
"""

from __future__ import annotations

import atexit
import builtins
import contextvars
import dataclasses
import gc
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from types import AsyncGeneratorType, CodeType, CoroutineType, FunctionType, GeneratorType
from typing import Any, Dict, List, Optional, Sequence, Tuple

from bytecode import UNSET, Bytecode, ControlFlowGraph, Instr, Label, TryBegin, TryEnd

from . import _versions, analysis
from ._versions import PROBE_NAME
from .analysis import ProbePoint, code_key, consuming_calls, editable_instructions, instructions
from .errors import SpecError, TargetError

__all__ = [
    "SINKS",
    "Template",
    "code_objects",
    "insert_probes",
    "cache_info",
    "clear_cache",
    "probe_style",
    "set_probe_style",
]

#: The sinks list of contexts that set none (:mod:`bcrecord.runtime` fills it in place).
DEFAULT_SINKS: List[Any] = []
#: Where inline probes find the current context's sinks: ``SINKS.get()`` is a list
#: indexed by site id whose items have ``append``. :mod:`bcrecord.runtime` sets it
#: for each context that records.
SINKS: contextvars.ContextVar[List[Any]] = contextvars.ContextVar("bcrecord_sinks", default=DEFAULT_SINKS)
#: The constant inline probes call. One object (each ``SINKS.get`` makes a new
#: bound method), so probed code is recognised by it.
SINKS_GET = SINKS.get

_PLACEHOLDER = "\x00bcrecord-site-{}"
_CACHE_SIZE = 512


PROBE_STYLES = ("auto", "inline", "call")
_style = "auto"


def set_probe_style(style: str) -> str:
    """Spell probes inserted from now on ``'inline'``, as ``'call'``, or ``'auto'``.

    Returns the previous setting. Patches made earlier keep their code. ``'auto'``
    (the default) calls once torch is imported, so that torch.compile meets a
    probe it can skip.

    >>> import bcrecord
    >>> previous = bcrecord.set_probe_style("inline")
    >>> bcrecord.set_probe_style(previous)  # back as it was; returns the setting it replaces
    'inline'
    """
    global _style
    if style not in PROBE_STYLES:
        raise SpecError(f"unknown probe style {style!r}; choose one of {PROBE_STYLES}")
    previous, _style = _style, style
    return previous


def probe_style() -> str:
    """How probes inserted now are spelled: ``'inline'`` or ``'call'``.

    >>> probe_style() in ("inline", "call")
    True
    """
    if _style != "auto":
        return _style
    # Looking in sys.modules imports nothing: the core never imports torch.
    return "call" if "torch" in sys.modules else "inline"


@dataclass(frozen=True)
class Template:
    """A probed code object whose site constants are still placeholders."""

    code: CodeType
    #: The placeholder constant of each probe point, in point order.
    placeholders: Tuple[str, ...]

    def bind(self, site_ids: Sequence[int]) -> CodeType:
        """The runnable code, with probe point ``k`` reporting as ``site_ids[k]``.

        >>> from bcrecord.analysis import read, resolve
        >>> from bcrecord.specs import Local, Return
        >>> code = (lambda a: [b := a + 1, b][1]).__code__
        >>> template = insert_probes(code, resolve([Local("b"), Return()], read(code)))
        >>> [c for c in template.bind([7, 9]).co_consts if c in (7, 9)]  # b's probe, the return's
        [7, 9]
        >>> template.bind([7])
        Traceback (most recent call last):
        ValueError: expected 2 site ids, got 1
        """
        if len(site_ids) != len(self.placeholders):
            raise ValueError(f"expected {len(self.placeholders)} site ids, got {len(site_ids)}")
        return _bind(self.code, dict(zip(self.placeholders, site_ids, strict=True)))


def _bind(code: CodeType, sites: Dict[str, int]) -> CodeType:
    # Comprehensions compiled as code of their own (genexprs; all on 3.10/3.11) may hold probes too.
    consts = tuple(
        sites.get(c, c) if isinstance(c, str) else _bind(c, sites) if isinstance(c, CodeType) else c
        for c in code.co_consts
    )
    return code.replace(co_consts=consts)


def code_objects(code: CodeType) -> List[CodeType]:
    """``code`` and every code object nested in its constants (all may carry site ids).

    >>> len(code_objects((lambda: [y for y in ()]).__code__)) >= 1
    True
    """
    found = [code]
    for const in code.co_consts:
        if isinstance(const, CodeType):
            found.extend(code_objects(const))
    return found


@dataclass(frozen=True)
class _Guarded:
    """An inline probe to wrap in a handler that drops its failures (see :func:`_guard`)."""

    instrs: Tuple[Instr, ...]
    location: object


def _guard(items: Sequence[object]) -> List[object]:
    """Expand each :class:`_Guarded` probe into a try region whose handler drops its own failures.

    An inline probe runs C calls (and a sink's ``append``), and CPython counts C
    calls against the recursion limit too, so at exactly the limit a probe could
    raise ``RecursionError`` where the original code did not. Its handler (placed
    after the code; the normal path gains no instruction) drops such an error (or a
    ``MemoryError``: ``_versions.PROBE_FAILURES``) and resumes right after the
    probe. Other exceptions (``KeyboardInterrupt``, what a signal handler raised)
    are re-raised inside the region the probe sits in, so the code's own handlers
    see them as before. Exception tables hold no nested regions: a probe inside one
    closes it, and reopens a copy after itself.
    """
    table = _versions.current()
    out: List[object] = []
    handlers: List[Tuple[object, Label, Label, object]] = []
    active: object = None  # the TryBegin open at this point of ``out``
    for item in items:
        if isinstance(item, TryBegin):
            active = item
            out.append(item)
        elif isinstance(item, TryEnd):
            # After a probe, what is open is a copy of ``item.entry``: close that.
            out.append(TryEnd(active) if isinstance(active, TryBegin) else item)
            active = None
        elif isinstance(item, _Guarded):
            handler, resume = Label(), Label()
            ours = TryBegin(handler, push_lasti=False)
            outer = active
            if isinstance(outer, TryBegin):
                out.append(TryEnd(outer))
            out += [ours, *item.instrs, TryEnd(ours), resume]
            if isinstance(outer, TryBegin):
                active = _reopen(outer)
                out.append(active)
            out += table.guard_exit(item.location)
            handlers.append((outer, handler, resume, item.location))
        else:
            out.append(item)
    if isinstance(active, TryBegin):  # pragma: no cover - code never ends inside a region
        out.append(TryEnd(active))
    for outer, handler, resume, location in handlers:
        reraise = Label()
        out += [handler, *table.guard_handler(resume, reraise, location), reraise]
        # Only the re-raise runs inside the probe's own region, so that the code's
        # handlers see what they would have seen without the probe.
        if isinstance(outer, TryBegin):
            region = _reopen(outer)
            out += [region, table.guard_reraise(location), TryEnd(region)]
        else:
            out.append(table.guard_reraise(location))
    return _without_empty_regions(out)


def _without_empty_regions(items: List[object]) -> List[object]:
    """Drop try regions that cover no instruction (a probe right at a region's edge
    leaves one); ``bytecode`` would encode them with a negative size."""
    out: List[object] = []
    for item in items:
        if isinstance(item, TryEnd):
            k = len(out) - 1
            while k >= 0 and not isinstance(out[k], (Instr, TryBegin, TryEnd)):
                k -= 1  # labels and line markers emit no code
            if k >= 0 and out[k] is item.entry:
                del out[k]
                continue
        out.append(item)
    return out


def _reopen(entry: TryBegin) -> TryBegin:
    return TryBegin(entry.target, entry.push_lasti, stack_depth=entry.stack_depth)


class _Edits:
    """Instructions to insert before/after, or to substitute for, given positions."""

    def __init__(self) -> None:
        self.before: Dict[int, List[object]] = {}
        self.after: Dict[int, List[object]] = {}
        self.tail: Dict[int, List[object]] = {}  # after every probe at that position
        self.replace: Dict[int, Instr] = {}

    def apply(self, items: Sequence[object]) -> List[object]:
        out: List[object] = []
        for pos, item in enumerate(items):
            out += self.before.get(pos, [])
            out.append(self.replace.get(pos, item))
            out += self.after.get(pos, [])
            out += self.tail.get(pos, [])
        return out


def _location(items: Sequence[object], pos: int) -> object:
    """The anchor's location, or the last real one before it: inserted code needs a line."""
    for k in range(pos, -1, -1):
        item = items[k]
        if isinstance(item, Instr) and item.lineno is not None:
            return item.location
    for item in items[pos:]:
        if isinstance(item, Instr) and item.lineno is not None:
            return item.location
    return None


def _rewrite(code: CodeType, points: Sequence[ProbePoint], inline: bool) -> Template:
    if any([point.with_self for point in points]) and not code.co_argcount:
        raise ValueError(f"{code.co_name} has no first argument to pass as self")
    first = code.co_varnames[0] if code.co_argcount else ""
    if any([point.with_self for point in points]) and _rebinds(code, first):
        # Each probe passes what the first argument holds when it runs: after a `del self`
        # nothing (on 3.12+ the load does not check, and the interpreter would crash).
        raise TargetError(
            f"{_versions.code_qualname(code) or code.co_name} deletes or rebinds its first argument "
            f"{first!r}: a per-instance patch "
            "(name= a function of the instance, or an instance patched in place) cannot tell whose "
            "values its probes take then; patch it with name= a string"
        )
    names = [_PLACEHOLDER.format(k) for k in range(len(points))]
    return Template(_rewrite_code(code, points, names, first, nested=False, inline=inline), tuple(names))


def _rebinds(code: CodeType, name: str) -> bool:
    """Whether ``code`` assigns to or deletes its local ``name`` (a cell's too), or a function
    nested in it does so through ``nonlocal``."""
    table = _versions.current()
    changes = table.stores | table.deletes
    for instr in instructions(code):
        if isinstance(instr, Instr) and instr.name in changes:
            if getattr(instr.arg, "name", instr.arg) == name:
                return True
    return any(
        isinstance(const, CodeType) and name in const.co_freevars and _rebinds(const, name)
        for const in code.co_consts
    )


def _load_self(code: CodeType, first: str, nested: bool, location: object) -> Instr:
    table = _versions.current()
    if not nested:
        return table.load_local(first, first in code.co_cellvars, location)
    if first not in code.co_freevars:
        raise TargetError(
            f"a per-instance patch cannot probe inside a comprehension ({code.co_name}) that does not use "
            f"{first!r}: it is separate code (a generator expression; on 3.10/3.11 any comprehension)"
        )
    return table.load_free(first, location)


def _rewrite_code(
    code: CodeType, points: Sequence[ProbePoint], names: Sequence[str], first: str, nested: bool, inline: bool
) -> CodeType:
    table = _versions.current()

    guarded = inline and table.guards_probes

    def inline_probe(instrs: List[Instr], loc: object) -> List[object]:
        return [_Guarded(tuple(instrs), loc)] if guarded else list(instrs)

    def probe(load: List[Instr], site: str, loc: object, extra: List[Instr]) -> List[object]:
        if inline and not extra:
            return inline_probe(table.append_probe(SINKS_GET, load, site, loc), loc)
        _keep_probe_findable_at_exit()
        return list(table.call_probe(load, site, loc, extra))

    def tee(site: str, loc: object, extra: List[Instr]) -> List[object]:
        if inline and not extra:
            return inline_probe(table.append_tee(SINKS_GET, site, loc), loc)
        return list(table.tee_probe(site, loc, extra))

    bytecode = editable_instructions(code)
    items = list(bytecode)
    edits = _Edits()
    cells = set(code.co_cellvars)

    inner: Dict[int, List[Tuple[ProbePoint, str]]] = {}
    for point, site in zip(points, names, strict=True):
        for pos in point.positions:
            if isinstance(pos, tuple):  # inside a comprehension's code constant
                outer, rest = pos
                inner.setdefault(outer, []).append((dataclasses.replace(point, positions=(rest,)), site))
    for outer, pairs in inner.items():
        load = items[outer]
        assert isinstance(load, Instr) and isinstance(load.arg, CodeType)
        new_inner = _rewrite_code(
            load.arg, [p for p, _ in pairs], [n for _, n in pairs], first, nested=True, inline=inline
        )
        edits.replace[outer] = Instr("LOAD_CONST", new_inner, location=load.location)  # type: ignore[arg-type]

    for point, site in zip(points, names, strict=True):
        for pos in point.positions:
            if isinstance(pos, tuple):
                continue
            anchor = items[pos]
            loc = _location(items, pos)
            extra = [_load_self(code, first, nested, loc)] if point.with_self else []
            if point.kind == "store":
                assert isinstance(anchor, Instr)
                load = table.load_stored(anchor, loc)
                edits.after.setdefault(pos, []).extend(probe([load], site, loc, extra))
            elif point.kind in ("call", "expr"):
                # The call's result / the operator's result is on top of the stack.
                edits.after.setdefault(pos, []).extend(tee(site, loc, extra))
            elif point.kind == "load":
                assert isinstance(anchor, Instr)
                edits.after.setdefault(pos, []).extend(tee(site, loc, extra))
                # Each load's own spelling: one site may be a plain and a method-style load
                # (on one line where code has no columns, a branch between them).
                name = table.method_load(anchor)
                if name is not None and pos not in edits.replace:
                    edits.replace[pos] = table.plain_attr(str(name), anchor.location)
                    edits.tail[pos] = list(table.method_stack(loc))
                    if table.method_call_fix:
                        old_call, new_call = table.method_call_fix
                        calls = consuming_calls(items, pos, slots=2)  # [method, self] slots
                        if not calls:  # pragma: no cover - every method load is called
                            raise RuntimeError(f"no {old_call} matches the method load at {pos}")
                        for call in calls:
                            call_instr = items[call]
                            assert isinstance(call_instr, Instr)
                            edits.replace[call] = Instr(
                                new_call, call_instr.arg, location=call_instr.location
                            )
            elif point.kind == "return":
                assert isinstance(anchor, Instr)
                before = edits.before.setdefault(pos, [])
                if anchor.name == table.return_const:
                    if pos not in edits.replace:
                        before.insert(0, Instr("LOAD_CONST", anchor.arg, location=anchor.location))
                        edits.replace[pos] = Instr(table.return_value, location=anchor.location)
                before.extend(tee(site, loc, extra))
            elif point.kind == "entry":
                load = table.load_local(point.root, point.root in cells, loc)
                edits.before.setdefault(pos, []).extend(probe([load], site, loc, extra))
            else:  # pragma: no cover - ProbePoint kinds are fixed by analysis.resolve
                raise ValueError(f"unknown probe kind {point.kind!r}")

    # What the inserted runs add to the stack, at most: on top of the original's depth there
    # (the replaced instructions keep or lower it), so the original's size plus that bounds it.
    peaks = [_peak(run) for inserted in (edits.before, edits.after, edits.tail) for run in inserted.values()]
    bound = None if None in peaks else code.co_stacksize + max((p for p in peaks if p is not None), default=0)
    bytecode[:] = _guard(edits.apply(items)) if guarded else edits.apply(items)
    # Seed the variable order with the original's: otherwise bytecode numbers locals by
    # first use, which reorders co_varnames (and locals()) on 3.12+.
    bytecode.argnames = list(code.co_varnames)
    new = _assemble(bytecode, bound)
    if table.line_table is not None and table.own_line_table(bytecode):
        # The same instructions as to_code() assembled (same order, same sizes): their lines.
        concrete = list(bytecode.to_concrete_bytecode())
        if sum(instr.size for instr in concrete) == len(new.co_code):
            new = new.replace(co_linetable=table.line_table(concrete, new.co_firstlineno))
    if new.co_varnames != code.co_varnames:  # pragma: no cover - guarded invariant
        raise RuntimeError(f"rewriting {code.co_name} changed its variables")
    return new


def _peak(run: Sequence[object]) -> Optional[int]:
    """The most a straight run of inserted instructions adds to the stack where it runs, as
    CPython counts it (the net effect of each instruction); None where it is not straight.

    >>> _peak([Instr("LOAD_CONST", 1), Instr("LOAD_CONST", 2), Instr("POP_TOP"), Instr("POP_TOP")])
    2
    """
    depth = peak = 0
    for item in run:
        if not isinstance(item, Instr) or item.has_jump():
            return None
        depth += item.stack_effect(jump=False)
        peak = max(peak, depth)
    return peak


def _assemble(bytecode: Bytecode, bound: Optional[int] = None) -> CodeType:
    """``bytecode.to_code()``, each of the original's exception regions keeping the stack depth
    CPython gave it; only the regions bcrecord inserts (which have none) get one computed.
    ``bound``: a stack size known to suffice (see :func:`_rewrite_code`), where there is no
    region: then no control-flow graph is built to compute it (most of the assembly's time).

    ``bytecode`` computes every depth from the stack it finds in the region, but CPython
    unwinds below values that are dead there: in ``for ...: try: return x`` inside a
    ``try``/``finally`` whose ``finally`` raises, ``x`` lies under the ``finally`` body's
    region, and a handler that kept it would go back into the loop with it (3.11+: a crash).

    >>> import warnings
    >>> source = '''
    ... def f(a):
    ...     for i in range(2):
    ...         try:
    ...             try:
    ...                 return a
    ...             finally:
    ...                 raise ValueError(a)
    ...         finally:
    ...             continue
    ... '''
    >>> with warnings.catch_warnings():  # (3.14 warns of the continue in a finally)
    ...     warnings.simplefilter("ignore", SyntaxWarning)
    ...     exec(source)
    >>> f.__code__ = _assemble(Bytecode.from_code(f.__code__, conserve_exception_block_stackdepth=True))
    >>> f(1) is None  # (with the computed depths: a segmentation fault)
    True
    """
    if not any([isinstance(item, TryBegin) for item in bytecode]):  # (no exception table: 3.10)
        if bound is not None:
            return bytecode.to_code(stacksize=bound, compute_exception_stack_depths=False)
        return bytecode.to_code()
    graph = ControlFlowGraph.from_bytecode(bytecode)
    # The graph's regions are copies, in code order; a region a jump splits has several.
    ours = [item for item in bytecode if isinstance(item, TryBegin) and item.stack_depth is UNSET]
    copies = [item for block in graph for item in block if isinstance(item, TryBegin)]
    unset = [item for item in copies if item.stack_depth is UNSET]
    given = [(item, item.stack_depth) for item in copies if item.stack_depth is not UNSET]
    stacksize = graph.compute_stacksize()  # (sets every region's depth)
    if len(unset) == len(ours):
        # Each inserted region covers one probe, no jump: one copy each, so its depth carries
        # back to the code as it is. The graph's own way back (``to_code``) fuses split copies
        # with a list search each, quadratic in a long ``try`` block's branches.
        for region, copy in zip(ours, unset, strict=True):
            region.stack_depth = copy.stack_depth
        return bytecode.to_code(stacksize=stacksize, compute_exception_stack_depths=False)
    for region, depth in given:  # pragma: no cover - an inserted region split by a jump
        region.stack_depth = depth
    return graph.to_code(stacksize=stacksize, compute_exception_stack_depths=False)


_cache: OrderedDict[Tuple[Tuple[object, ...], Tuple[Tuple[object, ...], ...], str], Template] = OrderedDict()
_cache_lock = threading.Lock()
_stats = {"hits": 0, "misses": 0}


_exit_handler_registered = False


def _keep_probe_findable_at_exit() -> None:
    """Once code calling the probe by name is made: at exit, see :func:`_probe_into_globals`."""
    global _exit_handler_registered
    if not _exit_handler_registered:
        _exit_handler_registered = True
        atexit.register(_probe_into_globals)


def _probe_into_globals() -> None:
    """Put the probe into the globals of every function and suspended generator whose code calls it.

    Python's finalization puts builtins back as they were at its start, before it frees the
    modules' globals: the ``finally`` of a generator still suspended then, or a ``__del__``
    run then, found no ``__bcrecord_probe__`` (a NameError stopped it). An ``atexit`` handler
    runs before that, when the program is done with its globals.
    """
    probe = getattr(builtins, PROBE_NAME, None)
    if probe is None:
        return
    for item in gc.get_objects():
        kind = type(item)
        if kind is FunctionType:
            code, namespace = item.__code__, item.__globals__
        elif kind in _SUSPENDABLE:
            frame = getattr(item, _SUSPENDABLE[kind])
            if frame is None:
                continue
            code, namespace = frame.f_code, frame.f_globals
        else:
            continue
        if PROBE_NAME in code.co_names and PROBE_NAME not in namespace:
            namespace[PROBE_NAME] = probe


#: Each kind of suspendable code's frame attribute.
_SUSPENDABLE = {GeneratorType: "gi_frame", CoroutineType: "cr_frame", AsyncGeneratorType: "ag_frame"}


def insert_probes(code: CodeType, points: Sequence[ProbePoint]) -> Template:
    """A :class:`Template` of ``code`` with a probe at each of ``points`` (cached).

    >>> def f(a):
    ...     return a
    >>> from bcrecord.analysis import read, resolve
    >>> from bcrecord.specs import Return
    >>> points = resolve([Return()], read(f.__code__))
    >>> insert_probes(f.__code__, points) is insert_probes(f.__code__, points)
    True
    """
    style = probe_style()
    key = (code_key(code), tuple(point.where() for point in points), style)
    with _cache_lock:
        template = _cache.get(key)
        if template is not None:
            _cache.move_to_end(key)
            _stats["hits"] += 1
            return template
    template = _rewrite(code, points, inline=style == "inline")
    with _cache_lock:
        _stats["misses"] += 1
        _cache[key] = template
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return template


def cache_info() -> Dict[str, int]:
    """Hits, misses and size of the rewrite cache.

    >>> sorted(cache_info())
    ['hits', 'misses', 'size']
    """
    with _cache_lock:
        return {**_stats, "size": len(_cache)}


def clear_cache() -> None:
    """Forget every cached rewrite, and every code object read (for benchmarks of first-time
    patch cost: a function patched for the first time is read, then rewritten).

    >>> clear_cache(); cache_info()["size"]
    0
    """
    with _cache_lock:
        _cache.clear()
        _stats.update(hits=0, misses=0)
    analysis.forget_readings()
