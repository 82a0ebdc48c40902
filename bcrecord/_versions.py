"""Everything that differs between Python versions, as one table per version.

This is the only module that looks at ``sys.version_info``. The rest of the engine
asks the current :class:`Table` how to call a probe, how to duplicate a value, and
which opcodes store, load or return, and reads as if there were one Python.

There are two spellings of a probe (see :mod:`bcrecord.rewrite`): *call*,
``__bcrecord_probe__(value, site)``, which reaches the runtime through a name loaded
with ``LOAD_GLOBAL`` (it resolves through builtins; torch.compile, Dynamo, refuses
``LOAD_CONST <function>``), and *inline*, ``sinks_get()[site].append(value)``, which
runs no Python frame when the value needs no copy. ``sinks_get`` is the bound
``get`` of the ContextVar that holds each context's sinks, a constant of the probed
code, so finding it costs no name lookup. Site ids are plain int constants.

>>> current().name in {"3.10", "3.11", "3.12", "3.13", "3.14"}
True
"""

from __future__ import annotations

import dataclasses
import dis
import sys
import weakref
from dataclasses import dataclass
from types import CodeType
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence, Tuple, Union, cast

from bytecode import CellVar, FreeVar, Instr, Label

from .errors import UnsupportedPythonError

__all__ = ["Table", "current", "carry_local_events", "code_qualname", "dis_line", "PROBE_NAME", "SUPPORTED"]

#: The global name under which inserted code finds the probe (call spelling).
PROBE_NAME = "__bcrecord_probe__"
#: What a guarded inline probe's handler drops: a probe's own calls running out of
#: frames or memory, where the original code would not have. Anything else a probe
#: raises is a signal handler's (see ``errors.raised_by_signal_handler``) or an
#: interrupt: the code's own.
PROBE_FAILURES = (RecursionError, MemoryError)


def _argument_references() -> int:
    value = object()
    return sys.getrefcount(value) - 1  # (less the local variable's own)


#: The references ``sys.getrefcount(name)`` counts for its own argument where ``name`` is a
#: local variable passed straight in: 1 up to 3.13; 3.14 passes a local it can borrow without
#: taking one, 0. Measured here in that same form, so that code counting who else holds an
#: object (``getrefcount(x) - ARGUMENT_REFERENCES > known``) reads the same on every version.
ARGUMENT_REFERENCES = _argument_references()

Location = object  # bytecode.InstrLocation; kept opaque here
Instrs = List[Instr]


def _instr(name: str, arg: object = None, location: Location = None) -> Instr:
    # ``Instr`` rejects an explicit arg for argument-less opcodes.
    if arg is None:
        return Instr(name, location=location)  # type: ignore[arg-type]
    return Instr(name, arg, location=location)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Table:
    """How one Python version spells the few instruction sequences bcrecord inserts."""

    name: str
    #: Opcodes that bind a local or cell variable; their arg is the name (or Cell/FreeVar).
    stores: FrozenSet[str]
    #: Opcodes that push a local's value (roots of attribute chains).
    local_loads: FrozenSet[str]
    #: Deletes, used to spot the compiler's ``x = None; del x`` after ``except ... as x``.
    deletes: FrozenSet[str]
    #: Two-variable superinstructions and the plain pair each splits into.
    pairs: Tuple[Tuple[str, str, str], ...]
    #: Opcodes that start a function's body; inserted entry code goes after the last.
    prologue: FrozenSet[str]
    #: Saves a variable around an inlined comprehension (3.12+), else None.
    comprehension_save: Optional[str]
    #: Names of the comprehensions compiled as code objects of their own (all on
    #: 3.10/3.11; only generator expressions from 3.12 on, which inlines the rest).
    separate_comprehensions: FrozenSet[str]
    #: ``LOAD_GLOBAL``'s arg for a callable, given a name.
    global_arg: Callable[[str], object]
    #: Instructions that call the callable pushed by ``global_arg`` with n arguments.
    call: Callable[[int, object], Instrs]
    #: Duplicate the top of the stack.
    dup: Callable[[object], Instr]
    #: Move the duplicated value above the (callable, NULL) pair just pushed.
    raise_value: Callable[[object], Instrs]
    #: How a method-style attribute load is spelled: returns the attribute name or None.
    method_load: Callable[[Instr], Optional[str]]
    #: How a plain attribute load is spelled: returns the attribute name or None.
    attr_load: Callable[[Instr], Optional[str]]
    #: Plain attribute load instruction for a name.
    plain_attr: Callable[[str, object], Instr]
    #: After a plain load, rebuild the stack shape a method-style load leaves.
    method_stack: Callable[[object], Instrs]
    #: The call opcode that pairs with a method-style load but needs rewriting
    #: once the load is plain (3.10's ``CALL_METHOD``), with its replacement.
    method_call_fix: Optional[Tuple[str, str]]
    #: Return opcodes: (returns top of stack, returns its constant arg).
    return_value: str
    return_const: Optional[str]
    #: Opcodes that call (their result is left on the stack).
    calls: FrozenSet[str] = frozenset()
    #: What may come between an inlined comprehension's first save and the region it runs in:
    #: more saves, and the swaps that put the iterable back on top (3.12+).
    comprehension_setup: FrozenSet[str] = frozenset()
    #: Opcodes that push a function made in the code (3.13+ set its closure and defaults after).
    function_makers: FrozenSet[str] = frozenset({"MAKE_FUNCTION"})
    #: Opcodes that enter a ``with`` block. The bytecode package models them as
    #: keeping the context manager's slot (it becomes ``__exit__``), so the call of
    #: ``__exit__`` at the block's end would look like a call of the manager.
    with_enters: FrozenSet[str] = frozenset()
    #: Whether a call's NULL slot goes below its callable (3.11, 3.12), so that a
    #: ``PUSH_NULL`` just before a callee's root may be that callee's; 3.13 pushes it
    #: after the callable, 3.10 has none.
    null_below_callable: bool = False
    #: The opcode that ends an ``await``'s ``throw()`` path (3.12+): the jump after it
    #: goes back into the await's send loop with the stack it had, so no other value
    #: joins the path there.
    await_rethrow: Optional[str] = None
    #: The line table for concrete instructions and a first line, where bcrecord
    #: writes it itself: bytecode 0.17 (the last for 3.10) drops the lines after an
    #: instruction without one (a generator's ``GEN_START``) on 3.10; bytecode 0.19
    #: writes a column of 128 to 255 where CPython 3.11+ read only up to 127.
    line_table: Optional[Callable[[Sequence[object], int], bytes]] = None
    #: Whether code (its abstract instructions) needs :attr:`line_table` rather than
    #: the one ``bytecode`` writes.
    own_line_table: Callable[[Sequence[object]], bool] = lambda instructions: True
    #: Opcodes that push a global or builtin by name (roots of callee chains).
    global_loads: FrozenSet[str] = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
    #: The operator symbol of a binary-operator instruction (``'+'``, ``'+='``), or None.
    binary_op: Callable[[Instr], Optional[str]] = lambda instr: None
    #: The symbol of an operator that is no site: a comparison (``'=='``), a unary
    #: operator (``'unary -'``, ``'~'``, ``'not'``) or an item read (``'[]'``, unpacking
    #: too), or None.
    value_op: Callable[[Instr], Optional[str]] = lambda instr: _value_op(
        instr, "UNARY_POSITIVE", "BINARY_SUBSCR"
    )
    #: Whether the compiler turns ``'%s-%r' % (a, b)`` (a string constant formatting a
    #: tuple display with ``%s``/``%r``/``%a`` units only) into f-string code, leaving
    #: no ``%`` operator (3.11+).
    folds_percent_format: bool = True
    #: Push ``TOS.<name>`` as a method (the (method, self) pair a method call takes).
    load_method: Callable[[str, object], Instr] = lambda name, loc: _instr("LOAD_METHOD", name, loc)
    #: Call the method pushed by ``load_method`` with n arguments.
    call_method: Callable[[int, object], Instrs] = lambda n, loc: [_instr("CALL_METHOD", n, loc)]
    #: Replace the two top items with ``second[top]``.
    subscript: Callable[[object], Instrs] = lambda loc: [_instr("BINARY_SUBSCR", None, loc)]
    #: Move the duplicated value above the two-item method pair just pushed.
    raise_over_method: Callable[[object], Instrs] = lambda loc: [
        _instr("ROT_THREE", None, loc),
        _instr("ROT_THREE", None, loc),
    ]
    #: The conditional jump that pops its test (3.11 spells the direction), or None
    #: where there is no exception table (3.10): inline probes are then unguarded.
    pop_jump_if_false: Optional[str] = None
    #: What follows a guarded probe. 3.13 looks up the handler of an error raised in
    #: a callee at the code unit *before* the call, so a call right after the probe
    #: would land in the probe's region: a NOP keeps them apart.
    guard_exit: Callable[[object], Instrs] = lambda loc: []
    #: Opcodes whose label argument is no jump at run time: 3.14's ``END_ASYNC_FOR`` names
    #: its loop's ``END_SEND`` for monitoring's sake and goes on to the next instruction.
    pseudo_jumps: FrozenSet[str] = frozenset()
    #: How 3.14 starts a call of ``all()``, ``any()`` or ``tuple()`` on a generator expression:
    #: where the name is the builtin, it runs the loop in the function itself, and the jump
    #: that ends these instructions goes to the call; () where calls are only calls.
    inlined_call_check: Tuple[str, ...] = ()
    #: What pops a loop's iterator once the loop ends (3.14), if an instruction of its own.
    pop_iterator: Optional[str] = None
    #: What pushes such a loop's result: ``all``/``any``'s constant, ``tuple``'s list made one.
    inlined_results: FrozenSet[str] = frozenset()
    #: The builtin, as the check names it, whose loop keeps its list under the iterator.
    inlined_with_list: Optional[str] = None
    #: Opcodes whose code the ``bytecode`` package cannot read or write back, each with the
    #: construct that compiles to it (measured where the version is this interpreter's).
    unhandled: Dict[str, str] = dataclasses.field(default_factory=dict)
    #: Whether Python gives ``__main__`` an empty ``__annotations__`` dict as it starts,
    #: before the program's first line (3.10 to 3.13; 3.14's annotations are lazy).
    main_annotations: bool = True
    #: The attributes a copy of a function takes its annotations from, the first one set:
    #: 3.14 evaluates them when first read, through ``__annotate__``, and reading
    #: ``__annotations__`` raises where they name what is not defined yet (PEP 649).
    function_annotations: Tuple[str, ...] = ("__annotations__",)
    #: Whether Python makes the program path ``.`` absolute as the working directory itself
    #: (3.11+); 3.10 joins it to the working directory as any relative path (``/cwd/.``).
    dot_is_working_directory: bool = True
    #: Whether ``sys.flags`` has ``safe_path`` (``python -P``, ``PYTHONSAFEPATH``: 3.11+).
    safe_path_flag: bool = True
    #: Opcodes that push a global or builtin by name in any code, a class body's and an
    #: annotation scope's too (``dis`` names: ``bcrecord run`` reads a module's code with it).
    name_loads: FrozenSet[str] = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})
    #: How ``dis`` names ``from m import *``: an opcode, or the argument of an intrinsic call.
    star_import: str = "IMPORT_STAR"

    def jump_target(self, instr: Instr) -> Optional[Label]:
        """The label ``instr`` may jump to, or None.

        >>> current().jump_target(Instr("LOAD_CONST", 1)) is None
        True
        """
        target = instr.arg
        return target if isinstance(target, Label) and instr.name not in self.pseudo_jumps else None

    def load_probe(self, location: Location) -> Instrs:
        """Push the probe as a callable (with its NULL slot where the version has one).

        >>> [(instr.name, PROBE_NAME in str(instr.arg)) for instr in current().load_probe(None)]
        [('LOAD_GLOBAL', True)]
        """
        return [_instr("LOAD_GLOBAL", self.global_arg(PROBE_NAME), location)]

    def call_probe(
        self, load_value: Instrs, site: Union[int, str], location: Location, extra: Sequence[Instr] = ()
    ) -> Instrs:
        """``probe(<value>, site, *extra)`` with the result dropped; the stack is unchanged.

        >>> instrs = current().call_probe([Instr("LOAD_FAST", "x")], 7, None)
        >>> instrs[0].name, instrs[-1].name, [instr.arg for instr in instrs if instr.name == "LOAD_CONST"]
        ('LOAD_GLOBAL', 'POP_TOP', [7])
        """
        return [
            *self.load_probe(location),
            *load_value,
            _instr("LOAD_CONST", site, location),
            *extra,
            *self.call(2 + len(extra), location),
            _instr("POP_TOP", None, location),
        ]

    def tee_probe(self, site: Union[int, str], location: Location, extra: Sequence[Instr] = ()) -> Instrs:
        """``probe(TOS, site, *extra)`` leaving TOS in place, for values that are never named.

        >>> instrs = current().tee_probe(7, None)
        >>> instrs[0].name in ("DUP_TOP", "COPY"), instrs[-1].name  # a copy of TOS is what goes
        (True, 'POP_TOP')
        """
        return [
            self.dup(location),
            *self.load_probe(location),
            *self.raise_value(location),
            _instr("LOAD_CONST", site, location),
            *extra,
            *self.call(2 + len(extra), location),
            _instr("POP_TOP", None, location),
        ]

    def _load_sink(self, sinks_get: object, site: Union[int, str], location: Location) -> Instrs:
        # sinks_get()[site].append, as a method pair. A constant callable needs the
        # stack shape a plain call takes (method_stack: its NULL slot, 3.11+).
        return [
            _instr("LOAD_CONST", sinks_get, location),
            *self.method_stack(location),
            *self.call(0, location),
            _instr("LOAD_CONST", site, location),
            *self.subscript(location),
            self.load_method("append", location),
        ]

    def append_probe(
        self, sinks_get: object, load_value: Instrs, site: Union[int, str], location: Location
    ) -> Instrs:
        """``sinks_get()[site].append(<value>)``, result dropped; the stack is unchanged.

        >>> instrs = current().append_probe(list, [Instr("LOAD_FAST", "x")], 7, None)
        >>> instrs[0].arg is list, instrs[-1].name
        (True, 'POP_TOP')
        """
        return [
            *self._load_sink(sinks_get, site, location),
            *load_value,
            *self.call_method(1, location),
            _instr("POP_TOP", None, location),
        ]

    def append_tee(self, sinks_get: object, site: Union[int, str], location: Location) -> Instrs:
        """``sinks_get()[site].append(TOS)`` leaving TOS in place.

        >>> instrs = current().append_tee(list, 7, None)
        >>> instrs[0].name in ("DUP_TOP", "COPY"), instrs[1].arg is list, instrs[-1].name
        (True, True, 'POP_TOP')
        """
        return [
            self.dup(location),
            *self._load_sink(sinks_get, site, location),
            *self.raise_over_method(location),
            *self.call_method(1, location),
            _instr("POP_TOP", None, location),
        ]

    @property
    def guards_probes(self) -> bool:
        """Whether inline probes get an exception-table handler (3.11+).

        >>> current((3, 10)).guards_probes, current((3, 12)).guards_probes
        (False, True)
        """
        return self.pop_jump_if_false is not None

    def guard_handler(self, resume: Label, reraise: Label, location: Location) -> List[Instr]:
        """Handler code for a guarded probe: drop a ``RecursionError`` or ``MemoryError``
        and go on at ``resume``.

        Entered through the exception table with the exception on top of the stack
        as it was when the probe began. Anything else (``KeyboardInterrupt``, what a
        signal handler raised meanwhile) jumps to ``reraise``, where
        :meth:`guard_reraise` raises it again.

        >>> table = current()
        >>> not table.guards_probes or table.guard_handler(Label(), Label(), None)[0].arg == PROBE_FAILURES
        True
        """
        if self.pop_jump_if_false is None:
            raise NotImplementedError(f"Python {self.name} has no exception table to guard probes with")
        return [
            # A constant, not globals: the patched module may have its own names for them.
            _instr("LOAD_CONST", PROBE_FAILURES, location),
            _instr("CHECK_EXC_MATCH", None, location),
            _instr(self.pop_jump_if_false, reraise, location),
            _instr("POP_TOP", None, location),
            _instr("JUMP_BACKWARD", resume, location),
        ]

    def guard_reraise(self, location: Location) -> Instr:
        """Raise the exception on top of the stack again, keeping its traceback.

        >>> current().guard_reraise(None).name
        'RERAISE'
        """
        return _instr("RERAISE", 0, location)

    def load_local(self, name: str, cell: bool, location: Location) -> Instr:
        """Push local ``name`` (from its cell when it is a cell variable).

        >>> current().load_local("x", True, None).name
        'LOAD_DEREF'
        """
        if cell:
            return _instr("LOAD_DEREF", CellVar(name), location)
        return _instr("LOAD_FAST", name, location)

    def load_free(self, name: str, location: Location) -> Instr:
        """Push free variable ``name`` (a closure's, from the code around it).

        >>> current().load_free("self", None).name
        'LOAD_DEREF'
        """
        return _instr("LOAD_DEREF", FreeVar(name), location)

    def load_stored(self, store: Instr, location: Location) -> Instr:
        """Push the variable that ``store`` (one of :attr:`stores`) binds: the value just stored.

        >>> current().load_stored(Instr("STORE_FAST", "x"), None).name
        'LOAD_FAST'
        """
        return _instr(store.name.replace("STORE_", "LOAD_"), store.arg, location)


def _local_name(arg: object) -> str:
    return arg.name if isinstance(arg, (CellVar, FreeVar)) else str(arg)


_SYMBOLS = {
    "ADD": "+",
    "SUBTRACT": "-",
    "MULTIPLY": "*",
    "MATRIX_MULTIPLY": "@",
    "TRUE_DIVIDE": "/",
    "FLOOR_DIVIDE": "//",
    "MODULO": "%",
    "REMAINDER": "%",
    "POWER": "**",
    "LSHIFT": "<<",
    "RSHIFT": ">>",
    "AND": "&",
    "OR": "|",
    "XOR": "^",
}


def _op_310(instr: Instr) -> Optional[str]:
    # BINARY_ADD / INPLACE_ADD ... (BINARY_SUBSCR is not an operator site)
    for prefix, suffix in (("BINARY_", ""), ("INPLACE_", "=")):
        if instr.name.startswith(prefix) and instr.name[len(prefix) :] in _SYMBOLS:
            return _SYMBOLS[instr.name[len(prefix) :]] + suffix
    return None


def _op_311(instr: Instr) -> Optional[str]:
    # BINARY_OP with a BinaryOp arg: ADD, INPLACE_ADD ... (3.14's SUBSCR is not an operator)
    if instr.name != "BINARY_OP":
        return None
    name = getattr(instr.arg, "name", "")
    inplace = name.startswith("INPLACE_")
    symbol = _SYMBOLS.get(name[len("INPLACE_") :] if inplace else name)
    return None if symbol is None else symbol + ("=" if inplace else "")


_COMPARISONS = {"EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">="}
_UNARY = {"UNARY_NEGATIVE": "unary -", "UNARY_INVERT": "~", "UNARY_NOT": "not"}


def _value_op(instr: Instr, positive: str, subscript: str) -> Optional[str]:
    # ``positive``/``subscript``: how the version spells unary + and x[i] (an opcode,
    # or CALL_INTRINSIC_1's / BINARY_OP's arg name).
    name, arg = instr.name, getattr(instr.arg, "name", "")
    if name == "COMPARE_OP":  # (3.13 adds a _CAST variant: the result converted to bool)
        return _COMPARISONS.get(arg[: -len("_CAST")] if arg.endswith("_CAST") else arg)
    if name in _UNARY:
        return _UNARY[name]
    if positive in (name, arg):
        return "unary +"
    if subscript in (name, arg) or name in ("UNPACK_SEQUENCE", "UNPACK_EX"):
        return "[]"
    return None


def _named(opname: str) -> Callable[[Instr], Optional[str]]:
    """Reads the attribute name of ``opname`` instructions whose arg is a plain name."""

    def name_of(instr: Instr) -> Optional[str]:
        return str(instr.arg) if instr.name == opname else None

    return name_of


def _310() -> Table:
    return Table(
        name="3.10",
        stores=frozenset({"STORE_FAST", "STORE_DEREF"}),
        local_loads=frozenset({"LOAD_FAST", "LOAD_DEREF"}),
        deletes=frozenset({"DELETE_FAST", "DELETE_DEREF"}),
        pairs=(),
        prologue=frozenset({"GEN_START"}),
        comprehension_save=None,
        separate_comprehensions=frozenset({"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"}),
        global_arg=lambda name: name,
        call=lambda n, loc: [_instr("CALL_FUNCTION", n, loc)],
        dup=lambda loc: _instr("DUP_TOP", None, loc),
        raise_value=lambda loc: [_instr("ROT_TWO", None, loc)],
        method_load=_named("LOAD_METHOD"),
        attr_load=_named("LOAD_ATTR"),
        plain_attr=lambda name, loc: _instr("LOAD_ATTR", name, loc),
        method_stack=lambda loc: [],
        method_call_fix=("CALL_METHOD", "CALL_FUNCTION"),
        return_value="RETURN_VALUE",
        return_const=None,
        calls=frozenset({"CALL_FUNCTION", "CALL_FUNCTION_KW", "CALL_FUNCTION_EX", "CALL_METHOD"}),
        with_enters=frozenset({"SETUP_WITH", "BEFORE_ASYNC_WITH"}),
        binary_op=_op_310,
        folds_percent_format=False,
        line_table=_line_table_310,
        dot_is_working_directory=False,
        safe_path_flag=False,
    )


def _line_table_310(instructions: Sequence[object], first_line: int) -> bytes:
    """3.10's ``co_linetable`` for concrete instructions, as CPython 3.10 assembles it.

    Pairs of (bytes covered, line delta), the delta -128 for "no line"; long spans
    and deltas are split (``Objects/lnotab_notes.txt``).

    >>> from bytecode import ConcreteInstr
    >>> _line_table_310([ConcreteInstr("NOP", lineno=None), ConcreteInstr("NOP", lineno=3)], 3)
    b'\\x02\\x80\\x02\\x00'
    """
    # Where the line changes, a range closes: (bytes covered, its line or None).
    ranges: List[Tuple[int, Optional[int]]] = []
    line: Optional[int] = first_line
    start = offset = 0
    for instr in instructions:
        lineno = getattr(instr, "lineno", None)
        if lineno != line:
            ranges.append((offset - start, line))
            start, line = offset, lineno
        offset += getattr(instr, "size", 2)
    ranges.append((offset - start, line))
    table = bytearray()
    previous = first_line
    for covered, line in ranges:
        if covered == 0:
            continue
        if line is None:
            delta = -128
        else:
            delta, previous = line - previous, line
            while delta > 127:
                table.extend((0, 127))
                delta -= 127
            while delta < -127:
                table.extend((0, -127 & 0xFF))
                delta += 127
        while covered > 254:
            table.extend((254, delta & 0xFF))
            delta = -128 if line is None else 0
            covered -= 254
        table.extend((covered, delta & 0xFF))
    return bytes(table)


def _varint(value: int) -> bytes:
    # 6 bits a byte, the least significant first; bit 6 says more follow.
    out = bytearray()
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    out.append(value)
    return bytes(out)


def _svarint(value: int) -> bytes:
    return _varint(((-value) << 1) | 1 if value < 0 else value << 1)


def _location_entry(size: int, location: Location, line: int) -> Tuple[bytes, int]:
    """One entry of a 3.11+ locations table: ``size`` code units (1..8) at ``location``, the
    line of the entry before being ``line``. Returns the entry and the line it leaves."""

    def header(code: int) -> bytes:
        return bytes((0x80 | code << 3 | (size - 1),))

    lineno = getattr(location, "lineno", None)
    if lineno is None:
        return header(15), line  # no location
    end_line = getattr(location, "end_lineno", None)
    column = getattr(location, "col_offset", None)
    end_column = getattr(location, "end_col_offset", None)
    delta = lineno - line
    if column is None or end_column is None:
        if end_line is None or end_line == lineno:
            return header(13) + _svarint(delta), lineno  # a line, no columns
    elif end_line == lineno:
        if delta == 0 and column < 80 and 0 <= end_column - column < 16:
            return header(column // 8) + bytes((column % 8 << 4 | end_column - column,)), line
        # Both columns are single bytes here, below the 128 that starts an entry.
        if 0 <= delta < 3 and column < 128 and end_column < 128:
            return header(10 + delta) + bytes((column, end_column)), lineno
    long = _svarint(delta) + _varint((end_line if end_line is not None else lineno) - lineno)
    long += _varint(0 if column is None else column + 1) + _varint(
        0 if end_column is None else end_column + 1
    )
    return header(14) + long, lineno


def _location_table(merge: bool) -> Callable[[Sequence[object], int], bytes]:
    """3.11+'s ``co_linetable`` (the locations table) for concrete instructions, as CPython
    assembles it (``Objects/locations.md``): entries of up to 8 code units at one place,
    one for each instruction with its inline caches, or (``merge``, 3.12+) for each run
    of instructions at one place.

    >>> from types import SimpleNamespace as Of
    >>> at = Of(lineno=4, end_lineno=4, col_offset=130, end_col_offset=134)  # past 127: long form
    >>> _location_table(merge=True)([Of(name="NOP", size=2, location=at)] * 2, 3)
    b'\\xf1\\x02\\x00C\\x02G\\x02'
    """

    def line_table(instructions: Sequence[object], first_line: int) -> bytes:
        runs: List[List[object]] = []  # [location, code units]
        for instr in instructions:
            location = getattr(instr, "location", None)
            units = getattr(instr, "size", 2) // 2
            if runs and (getattr(instr, "name", "") == "CACHE" or (merge and runs[-1][0] == location)):
                runs[-1][1] = cast(int, runs[-1][1]) + units
            else:
                runs.append([location, units])
        table = bytearray()
        line = first_line
        for location, units in runs:
            left = cast(int, units)
            while left > 0:
                entry, line = _location_entry(min(left, 8), location, line)
                table += entry
                left -= 8
        return bytes(table)

    return line_table


def _wide_columns(instructions: Sequence[object]) -> bool:
    """Whether an instruction on one line has a column of 128 or more: bytecode 0.19 can
    write it where CPython reads only up to 127, which shifts every location after it."""
    # (A list: a generator left early, as bytecode's __iter__ would be, is closed at once, running
    # its code, where what a signal handler raises is lost on 3.10 and 3.11.)
    for instr in list(instructions):
        location = getattr(instr, "location", None)
        if location is None or location.lineno is None or location.end_lineno != location.lineno:
            continue
        if max(location.col_offset or 0, location.end_col_offset or 0) >= 128:
            return True
    return False


def _swap_up(loc: object) -> Instrs:
    # [v, v, A, B] -> [v, A, B, v] for either order of the (callable, NULL) pair.
    return [_instr("SWAP", 2, loc), _instr("SWAP", 3, loc)]


def _tuple_method(i: Instr) -> Optional[str]:
    if i.name == "LOAD_ATTR" and isinstance(i.arg, tuple) and i.arg[0]:
        return str(i.arg[1])
    return None


def _tuple_attr(i: Instr) -> Optional[str]:
    if i.name == "LOAD_ATTR" and isinstance(i.arg, tuple) and not i.arg[0]:
        return str(i.arg[1])
    return None


def _311() -> Table:
    return Table(
        name="3.11",
        stores=frozenset({"STORE_FAST", "STORE_DEREF"}),
        local_loads=frozenset({"LOAD_FAST", "LOAD_DEREF"}),
        deletes=frozenset({"DELETE_FAST", "DELETE_DEREF"}),
        pairs=(),
        prologue=frozenset({"RESUME"}),
        comprehension_save=None,
        separate_comprehensions=frozenset({"<listcomp>", "<setcomp>", "<dictcomp>", "<genexpr>"}),
        global_arg=lambda name: (True, name),
        call=lambda n, loc: [_instr("PRECALL", n, loc), _instr("CALL", n, loc)],
        dup=lambda loc: _instr("COPY", 1, loc),
        raise_value=_swap_up,
        method_load=_named("LOAD_METHOD"),
        attr_load=_named("LOAD_ATTR"),
        plain_attr=lambda name, loc: _instr("LOAD_ATTR", name, loc),
        # 3.11 calls expect [NULL, callable, args...].
        method_stack=lambda loc: [_instr("PUSH_NULL", None, loc), _instr("SWAP", 2, loc)],
        method_call_fix=None,
        return_value="RETURN_VALUE",
        return_const=None,
        calls=frozenset({"CALL", "CALL_FUNCTION_EX"}),
        null_below_callable=True,
        with_enters=frozenset({"BEFORE_WITH", "BEFORE_ASYNC_WITH"}),
        binary_op=_op_311,
        call_method=lambda n, loc: [_instr("PRECALL", n, loc), _instr("CALL", n, loc)],
        raise_over_method=_swap_up,
        pop_jump_if_false="POP_JUMP_FORWARD_IF_FALSE",
        line_table=_location_table(merge=False),
        own_line_table=_wide_columns,
    )


def _312() -> Table:
    return Table(
        name="3.12",
        name_loads=frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"}),
        star_import="INTRINSIC_IMPORT_STAR",
        stores=frozenset({"STORE_FAST", "STORE_DEREF"}),
        local_loads=frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF"}),
        deletes=frozenset({"DELETE_FAST", "DELETE_DEREF"}),
        pairs=(),
        prologue=frozenset({"RESUME"}),
        comprehension_save="LOAD_FAST_AND_CLEAR",
        comprehension_setup=frozenset({"LOAD_FAST_AND_CLEAR", "SWAP"}),
        separate_comprehensions=frozenset({"<genexpr>"}),
        global_arg=lambda name: (True, name),
        call=lambda n, loc: [_instr("CALL", n, loc)],
        dup=lambda loc: _instr("COPY", 1, loc),
        raise_value=_swap_up,
        method_load=_tuple_method,
        attr_load=_tuple_attr,
        plain_attr=lambda name, loc: _instr("LOAD_ATTR", (False, name), loc),
        method_stack=lambda loc: [_instr("PUSH_NULL", None, loc), _instr("SWAP", 2, loc)],
        method_call_fix=None,
        return_value="RETURN_VALUE",
        return_const="RETURN_CONST",
        calls=frozenset({"CALL", "CALL_FUNCTION_EX"}),
        null_below_callable=True,
        with_enters=frozenset({"BEFORE_WITH", "BEFORE_ASYNC_WITH"}),
        await_rethrow="CLEANUP_THROW",
        binary_op=_op_311,
        value_op=lambda instr: _value_op(instr, "INTRINSIC_UNARY_POSITIVE", "BINARY_SUBSCR"),
        load_method=lambda name, loc: _instr("LOAD_ATTR", (True, name), loc),
        call_method=lambda n, loc: [_instr("CALL", n, loc)],
        raise_over_method=_swap_up,
        pop_jump_if_false="POP_JUMP_IF_FALSE",
        line_table=_location_table(merge=True),
        own_line_table=_wide_columns,
    )


_PAIRS_313 = (
    ("STORE_FAST_STORE_FAST", "STORE_FAST", "STORE_FAST"),
    ("STORE_FAST_LOAD_FAST", "STORE_FAST", "LOAD_FAST"),
    ("LOAD_FAST_LOAD_FAST", "LOAD_FAST", "LOAD_FAST"),
)


def _313() -> Table:
    return Table(
        name="3.13",
        name_loads=frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS"}),
        star_import="INTRINSIC_IMPORT_STAR",
        stores=frozenset({"STORE_FAST", "STORE_DEREF"}),
        local_loads=frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF"}),
        deletes=frozenset({"DELETE_FAST", "DELETE_DEREF"}),
        # bytecode 0.19.1 mis-encodes pairs whose second variable index is >= 16, and
        # a probe cannot sit between the halves of a pair: every pair is split.
        pairs=_PAIRS_313,
        prologue=frozenset({"RESUME"}),
        comprehension_save="LOAD_FAST_AND_CLEAR",
        comprehension_setup=frozenset({"LOAD_FAST_AND_CLEAR", "SWAP"}),
        separate_comprehensions=frozenset({"<genexpr>"}),
        global_arg=lambda name: (True, name),
        call=lambda n, loc: [_instr("CALL", n, loc)],
        dup=lambda loc: _instr("COPY", 1, loc),
        raise_value=_swap_up,
        method_load=_tuple_method,
        attr_load=_tuple_attr,
        plain_attr=lambda name, loc: _instr("LOAD_ATTR", (False, name), loc),
        # 3.13 calls expect [callable, NULL, args...].
        method_stack=lambda loc: [_instr("PUSH_NULL", None, loc)],
        method_call_fix=None,
        return_value="RETURN_VALUE",
        return_const="RETURN_CONST",
        calls=frozenset({"CALL", "CALL_KW", "CALL_FUNCTION_EX"}),
        function_makers=frozenset({"MAKE_FUNCTION", "SET_FUNCTION_ATTRIBUTE"}),
        await_rethrow="CLEANUP_THROW",
        with_enters=frozenset({"BEFORE_WITH", "BEFORE_ASYNC_WITH"}),
        binary_op=_op_311,
        value_op=lambda instr: _value_op(instr, "INTRINSIC_UNARY_POSITIVE", "BINARY_SUBSCR"),
        load_method=lambda name, loc: _instr("LOAD_ATTR", (True, name), loc),
        call_method=lambda n, loc: [_instr("CALL", n, loc)],
        raise_over_method=_swap_up,
        pop_jump_if_false="POP_JUMP_IF_FALSE",
        guard_exit=lambda loc: [_instr("NOP", None, loc)],
        line_table=_location_table(merge=True),
        own_line_table=_wide_columns,
    )


def _subscr_op() -> object:
    from bytecode import BinaryOp

    return getattr(BinaryOp, "SUBSCR", 26)


def _round_trips(source: str) -> bool:
    """Whether the ``bytecode`` package reads the code of ``source`` and writes it back
    (False where this interpreter cannot compile it).

    >>> _round_trips("x = 1")
    True
    """
    from bytecode import Bytecode

    try:
        code = compile(source, "<measured>", "exec")
    except SyntaxError:
        return False
    try:
        Bytecode.from_code(code).to_code()
    except Exception:
        return False
    return True


def _314() -> Table:
    # Tested on Debian's CPython 3.14.10 (tools/python314.sh); the differences follow its ``dis``.
    base = _313()
    return Table(
        **{
            **base.__dict__,
            "name": "3.14",
            "local_loads": base.local_loads | {"LOAD_FAST_BORROW"},
            "pairs": _PAIRS_313
            + (("LOAD_FAST_BORROW_LOAD_FAST_BORROW", "LOAD_FAST_BORROW", "LOAD_FAST_BORROW"),),
            "return_const": None,
            # BINARY_SUBSCR became BINARY_OP with the SUBSCR operator.
            "subscript": lambda loc: [_instr("BINARY_OP", _subscr_op(), loc)],
            "value_op": lambda instr: _value_op(instr, "INTRINSIC_UNARY_POSITIVE", "SUBSCR"),
            "main_annotations": False,
            "function_annotations": ("__annotate__", "__annotations__"),
            "pseudo_jumps": frozenset({"END_ASYNC_FOR"}),
            # No such opcode: ``with`` copies the manager and LOAD_SPECIAL takes the copy for
            # __exit__, which the stack walk sees consume the manager (not a call of it).
            "with_enters": frozenset(),
            "inlined_call_check": ("COPY", "LOAD_COMMON_CONSTANT", "IS_OP", "POP_JUMP_IF_FALSE"),
            "pop_iterator": "POP_ITER",
            "inlined_results": frozenset({"LOAD_CONST", "CALL_INTRINSIC_1"}),
            "inlined_with_list": "BUILTIN_TUPLE",
            # bytecode 0.19.1 takes BUILD_INTERPOLATION's argument for CONVERT_VALUE's: it
            # fails to read a !r or !a conversion and to write any back.
            "unhandled": (
                {}
                if sys.version_info < (3, 14) or _round_trips("x = 1\nt'{x}{x!r}{x!a:>3}'")
                else {"BUILD_INTERPOLATION": "a template string with a value in it (as t'{x}' has)"}
            ),
        }
    )


_TABLES = {(3, 10): _310, (3, 11): _311, (3, 12): _312, (3, 13): _313, (3, 14): _314}
SUPPORTED = tuple(f"{major}.{minor}" for major, minor in _TABLES)
_current: Optional[Table] = None


def current(version: Optional[Tuple[int, int]] = None) -> Table:
    """The instruction table for this interpreter (or for ``version``).

    >>> current((3, 11)).name
    '3.11'
    >>> current((3, 9))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bcrecord.errors.UnsupportedPythonError: Python 3.9 is not supported by bcrecord (supported: ...)
    """
    global _current
    if version is None and _current is not None:
        return _current
    key = version or (sys.version_info[0], sys.version_info[1])
    build = _TABLES.get(key)
    if build is None:
        raise UnsupportedPythonError(
            f"Python {key[0]}.{key[1]} is not supported by bcrecord (supported: {', '.join(SUPPORTED)})"
        )
    table = build()
    if version is None:
        _current = table
    return table


def local_name(arg: object) -> str:
    """The variable name behind a store/load arg (a str, CellVar or FreeVar).

    >>> local_name(CellVar("x")), local_name("y")
    ('x', 'y')
    """
    return _local_name(arg)


def global_name(instr: Instr) -> Optional[str]:
    """The name a global or builtin load pushes, or None for another instruction
    (3.11+ give ``LOAD_GLOBAL`` a ``(push NULL, name)`` pair).

    >>> global_name(Instr("LOAD_NAME", "len")), global_name(Instr("LOAD_FAST", "x"))
    ('len', None)
    """
    if instr.name not in current().global_loads:
        return None
    return str(instr.arg[1]) if isinstance(instr.arg, tuple) else str(instr.arg)


#: ``sys.monitoring`` (3.12+), looked up once: getattr(sys, "monitoring", None) on 3.10/3.11
#: raises and catches an AttributeError, a microsecond, twice per recording entered per slot.
_MONITORING: Any = getattr(sys, "monitoring", None)


#: The local events carried by :func:`carry_local_events`: by (where the code is nested, tool id).
LocalEvents = Dict[Tuple[Tuple[Tuple[str, int, int], ...], int], int]


def carry_local_events(old: CodeType, new: CodeType, put_in: Optional[LocalEvents] = None) -> LocalEvents:
    """Give ``new`` the ``sys.monitoring`` local events each tool set on ``old`` (3.12+; else nothing).

    For code put into a function in place of ``old``: a tool that set events on the code a
    function runs (a debugger's breakpoints, a line profiler) keeps seeing it. Code nested in
    ``old`` (an inner ``def``, a lambda, a comprehension) is paired with ``new``'s by name and
    first line, and carried too: ``new``'s nested code is rebuilt even where it holds no probe.
    ``put_in``: the events ``old`` had (what this returned) when it was put in the function in
    place of ``new``; a tool's events that are still those on ``old`` stay as they are on
    ``new``, where the tool may have changed them meanwhile (a debugger removing a breakpoint
    from the code it set it on). Returns the local events on ``new`` after, of the tools that
    set some.

    >>> def f():
    ...     pass
    >>> carry_local_events(f.__code__, (lambda: None).__code__)  # (no tool set any)
    {}
    """
    carried: LocalEvents = {}
    monitoring = _MONITORING
    if monitoring is None:
        return carried
    tools = [tool for tool in range(6) if monitoring.get_tool(tool) is not None]  # (ids 0 to 5)
    if not tools:
        return carried
    for where, was, now in _paired(old, new):
        for tool in tools:
            events = monitoring.get_local_events(tool, was)
            if put_in is not None and put_in.get((where, tool), 0) == events:  # (unchanged where it ran)
                events = monitoring.get_local_events(tool, now)
            elif events != monitoring.get_local_events(tool, now):
                monitoring.set_local_events(tool, now, events)
            if events:
                carried[(where, tool)] = events
    return carried


Where = Tuple[Tuple[str, int, int], ...]
#: The pairs of nested code :func:`_nested_pairs` found, by ids of the two codes (each held
#: weakly: a probed code that goes frees its site ids, see runtime.hold_sites).
_PAIRED: Dict[Tuple[int, int], Tuple[Any, Any, List[Tuple[Where, Any, Any]]]] = {}


def _paired(old: CodeType, new: CodeType) -> List[Tuple[Where, CodeType, CodeType]]:
    """:func:`_nested_pairs` of ``old`` and ``new``, found once for the two: this runs each
    time a recording is entered or left while a tool is registered (coverage's sysmon core)."""
    key = (id(old), id(new))
    found = _PAIRED.get(key)
    if found is not None and found[0]() is old and found[1]() is new:
        return [(where, was(), now()) for where, was, now in found[2]]  # (old holds its nested code)
    pairs = list(_nested_pairs(old, new, ()))

    def forget(gone: Any) -> None:
        entry = _PAIRED.get(key)
        if entry is not None and (entry[0] is gone or entry[1] is gone):  # (not a later pair's)
            del _PAIRED[key]

    _PAIRED[key] = (
        weakref.ref(old, forget),
        weakref.ref(new, forget),
        [(where, weakref.ref(was), weakref.ref(now)) for where, was, now in pairs],
    )
    return pairs


def _nested_pairs(
    old: CodeType, new: CodeType, where: Tuple[Tuple[str, int, int], ...]
) -> Iterator[Tuple[Tuple[Tuple[str, int, int], ...], CodeType, CodeType]]:
    # Probes add constants but no code objects, and keep the order code is first loaded in:
    # the k-th nested code of a name and first line in old is the k-th in new.
    yield where, old, new
    if old is new:
        return
    mates: Dict[Tuple[str, int], List[CodeType]] = {}
    for const in new.co_consts:
        if isinstance(const, CodeType):
            mates.setdefault(_nested_name(const), []).append(const)
    taken: Dict[Tuple[str, int], int] = {}
    for const in old.co_consts:
        if isinstance(const, CodeType):
            name = _nested_name(const)
            k = taken[name] = taken.get(name, -1) + 1
            found = mates.get(name, ())
            if k < len(found):
                yield from _nested_pairs(const, found[k], (*where, (*name, k)))


def _nested_name(code: CodeType) -> Tuple[str, int]:
    return code_qualname(code) or code.co_name, code.co_firstlineno


def dis_line(instr: dis.Instruction, previous: Optional[int]) -> Optional[int]:
    """The source line of ``instr`` as ``dis`` gives it (``previous``, the line of the
    instruction before, where ``dis`` says none): positions from 3.11 on; 3.10 marks only
    where a line starts, and 3.13 says whether one does (a bool).

    >>> import dis
    >>> def f():
    ...     return 1
    >>> line = None
    >>> for instr in dis.get_instructions(f):
    ...     line = dis_line(instr, line)
    >>> line - f.__code__.co_firstlineno  # the return's line
    1
    """
    positions = getattr(instr, "positions", None)
    if positions is not None and positions.lineno is not None:
        return int(positions.lineno)
    starts = instr.starts_line
    return starts if isinstance(starts, int) and not isinstance(starts, bool) else previous


def code_qualname(code: CodeType) -> Optional[str]:
    """``code``'s qualified name, or None where code objects have none (3.10).

    >>> class K:
    ...     def f(self): pass
    >>> code_qualname(K.f.__code__) in (K.f.__qualname__, None)
    True
    """
    return getattr(code, "co_qualname", None)
