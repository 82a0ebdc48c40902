"""Exceptions raised by bcrecord.

Every error raised for a bad value of what to record or how -- a spec, a target,
an option such as ``copy=`` or ``keep=`` -- is a subclass of :class:`BcrecordError`
(:class:`SpecError` is a ``ValueError`` too); some arguments of the wrong type (a
number where a list of targets goes) raise ``TypeError`` instead. Both are raised
before anything is changed: a failed patch leaves its target as it was.

>>> import bcrecord
>>> def f(a):
...     x = a
...     return x
>>> for specs in (["y"], ["x@3"], ["x@@"]):
...     try:
...         bcrecord.instrument(f, specs)
...     except bcrecord.BcrecordError as error:
...         print(f"{type(error).__name__}: {error}")
TargetError: f has no assignment to a local named 'y'; assigned locals: x; arguments (their value at entry): a
TargetError: local 'x' in f has 1 site (index 0..0); there is no index 3
SpecError: bad index in 'x@@': expected an int or a list like [0,2]
>>> try:
...     bcrecord.instrument(len, ["x"])
... except NotPatchableError as error:
...     print(error)
len is a builtin or C function: it has no bytecode to patch
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import os
import reprlib
import shlex
import signal
import sys
import types
import unicodedata
import warnings
from typing import Any, Iterable, List, Optional, Sequence, Tuple, Type

__all__ = [
    "BcrecordError",
    "SpecError",
    "TargetError",
    "NotPatchableError",
    "ReturnNodeError",
    "UnsupportedPythonError",
    "RecordingWarning",
]


class BcrecordError(Exception):
    """Base class of bcrecord's own errors: a bad spec, target or option, what cannot be patched,
    saved or run. Not every error raised on purpose is one: a key with no value is a ``KeyError``,
    an argument of the wrong type a ``TypeError``, a recording entered twice a ``RuntimeError``."""


class SpecError(BcrecordError, ValueError):
    """A spec (or its short form) is malformed, e.g. ``'x@one'``."""


class TargetError(BcrecordError, LookupError):
    """A spec names something the function does not have.

    The message names what does exist, e.g. the locals of the function or how
    many assignments a local has.
    """


class ReturnNodeError(TargetError, ValueError):
    """A return node given to ``create_feature_extractor`` names nothing in the model.

    Also a ``ValueError``, which torchvision's extractor raises there: code written
    for it (``except ValueError``) catches this one too.
    """


class NotPatchableError(BcrecordError, TypeError):
    """The object cannot be patched: a builtin, a missing method, no ``__code__``."""


class UnsupportedPythonError(BcrecordError, RuntimeError):
    """This Python version has no bytecode instruction table in bcrecord (the message names those it has)."""


class RecordingWarning(RuntimeWarning):
    """A probe could not record a value (e.g. its copy failed).

    Probes never raise into the patched function; the failure is reported with
    this warning and kept in :attr:`bcrecord.Recording.errors`.
    """


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
#: Frames of these files are bcrecord's (contextlib runs ``bcrecord.torch.record``'s body).
_OWN_FILES: Tuple[str, ...] = (_PACKAGE, os.path.abspath(contextlib.__file__))


def pass_through(path: str) -> None:
    """Have :func:`warn` skip the frames of file ``path`` as bcrecord's own: a file whose code
    only passes a call on (torch's ``Module.__call__``, between a user's line and an
    extractor's forward), so a warning points past it at the user's line.

    >>> import contextlib
    >>> pass_through(contextlib.__file__)  # (already skipped: nothing changes)
    """
    global _OWN_FILES
    path = os.path.abspath(path)
    if path not in _OWN_FILES:
        _OWN_FILES = (*_OWN_FILES, path)


def outside_bcrecord(frame: types.FrameType) -> types.FrameType:
    """``frame``, or the first frame further out that runs no code of bcrecord's own (nor
    contextlib's, running bcrecord's): the user's.

    >>> outside_bcrecord(sys._getframe()).f_code.co_filename.startswith("<doctest")
    True
    """
    return _first_outside(frame)[0]


def _first_outside(frame: types.FrameType) -> Tuple[types.FrameType, int]:
    """:func:`outside_bcrecord`'s frame, and how many frames further out than ``frame`` it is."""
    out = 0
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_OWN_FILES):
        frame, out = frame.f_back, out + 1
    return frame, out


def warn(message: str, category: Type[Warning] = RecordingWarning) -> None:
    """Warn, pointing at the first caller outside bcrecord: the user's line, or the recorded function's.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn("a value could not be recorded")
    >>> caught[0].filename.startswith("<doctest"), caught[0].category.__name__
    (True, 'RecordingWarning')
    """
    _, out = _first_outside(sys._getframe(1))
    warnings.warn(message, category, stacklevel=2 + out)


def did_you_mean(word: str, names: Iterable[str], hide_private: bool = True) -> str:
    """``"; did you mean 'a', 'b'?"`` for up to three of ``names`` close to ``word``, or
    ``''``: the end of a message about a name that is not there. Private names
    (``_slow_forward``) are suggested only for a word that starts with ``_`` too, or
    with ``hide_private=False``, which hides nothing (module paths: ``_orig_mod.layer1``
    in a compiled model; saved keys: ``__main__:f:x@0``).

    >>> did_you_mean("forwrd", ["forward", "_slow_forward", "__format__", "train"])
    "; did you mean 'forward'?"
    >>> did_you_mean("_forwrd_impl", ["_forward_impl", "train"])
    "; did you mean '_forward_impl'?"
    >>> did_you_mean("zzz", ["forward"])
    ''
    >>> did_you_mean("__main__:f:loss", ["__main__:f:loss@0"])
    "; did you mean '__main__:f:loss@0'?"
    >>> did_you_mean("nn.functional.softmax", ["F.softmax", "nn.functional.dropout"])
    "; did you mean 'F.softmax', 'nn.functional.dropout'?"
    >>> did_you_mean("forward_impl", ["forward", "_forward_impl"])  # its underscore left out
    "; did you mean '_forward_impl', 'forward'?"
    """
    # A word that starts with "__" ('__call_') hides nothing, nor does hide_private=False.
    private = "" if word.startswith("__") or not hide_private else "__" if word.startswith("_") else "_"
    names = list(dict.fromkeys(names))
    candidates = [n for n in names if not (private and n.startswith(private))]
    close = difflib.get_close_matches(word, candidates, n=3)
    # A private name but for its leading underscores: the word, typed without them, first.
    bare = word.lstrip("_")
    exact = [n for n in names if n != word and n.lstrip("_") == bare and private and n.startswith(private)]
    close = (exact[:1] + close)[:3]
    # Where none of them ends as a dotted word does, one that does first: the same function
    # reached another way ('F.softmax' for 'nn.functional.softmax', over 'nn.functional.dropout').
    last = word.rpartition(".")[2]
    if "." in word and last.isidentifier() and not any(n.rpartition(".")[2] == last for n in close):
        same = [n for n in candidates if n.rpartition(".")[2] == last and n != word]
        close = list(dict.fromkeys(same[:1] + close))[:3]
    return f"; did you mean {', '.join(map(repr, close))}?" if close else ""


def listed(keys: Iterable[str], shown: int = 20) -> str:
    """The first ``shown`` of ``keys`` for an error's message (a long run records thousands: one
    line, not all of them), as ``bcrecord view`` lists them.

    >>> listed(["a", "b"]), listed([]), listed([f"k{i}" for i in range(25)], shown=3)
    ('a, b', 'none', 'k0, k1, k2 and 22 more')
    """
    names = list(keys)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more or "none"


#: Reprs in messages, cut short: a line each, not a module-level list's every item.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlevel = 2


def shown(value: Any) -> str:
    """``value`` in a message: a class, module or function by its repr, anything else by a
    short one, or by its class where that repr spans lines (a model's repr is its whole
    architecture; a module-level list's or dict's, every item).

    >>> shown(list(range(1000)))
    '[0, 1, 2, 3, 4, 5, ...]'
    >>> class Net:
    ...     def __repr__(self):
    ...         return "Net(\\n  (fc): Linear()\\n)"
    >>> shown(Net()), shown(Net)
    ('this Net instance', "<class 'bcrecord.errors.Net'>")
    """
    if isinstance(value, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)):
        return repr(value)
    try:
        text = _SHORT.repr(value)
    except Exception:  # (a repr that raises)
        text = object.__repr__(value)
    return f"this {type(value).__name__} instance" if "\n" in text else text


def aligned(rows: Sequence[Sequence[str]], encoding: Optional[str] = None) -> List[str]:
    """``rows`` of cells as lines of columns two spaces apart, each as wide as a terminal shows
    its widest cell: a wide character (CJK, an emoji) two columns, a combining mark none.

    With ``encoding`` (the stream's the lines are printed to), a character it lacks is written
    escaped (``\\u65e5``), as such a stream writes it, and measured so.

    >>> for line in aligned([("key", "n"), ("日本", "1"), ("e\\u0301", "2")]):
    ...     print(line)
    key   n
    日本  1
    é     2
    >>> aligned([("key", "n"), ("日本", "1")], "ascii")
    ['key           n', '\\\\u65e5\\\\u672c  1']
    """
    rows = [[as_written(cell, encoding) for cell in row] for row in rows]
    widths = [max(_columns(row[i]) for row in rows) for i in range(len(rows[0]))] if rows else []
    return ["  ".join(padded(cell, w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def as_written(text: str, encoding: Optional[str]) -> str:
    """``text`` as a stream of ``encoding`` writes it with ``errors='backslashreplace'`` (a
    character it lacks escaped); ``text`` itself for None or an encoding Python does not know.

    >>> as_written("größe", "ascii"), as_written("größe", "utf-8"), as_written("größe", None)
    ('gr\\\\xf6\\\\xdfe', 'größe', 'größe')
    """
    if encoding is None:
        return text
    try:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:
        return text


def padded(text: str, width: int) -> str:
    """``text`` with spaces after it up to ``width`` terminal columns (a wide character two).

    >>> padded("日本", 6) + "|", padded("abc", 2) + "|"
    ('日本  |', 'abc|')
    """
    return text + " " * (width - _columns(text))


def _columns(text: str) -> int:
    """How many terminal columns ``text`` takes: a wide character (CJK) two, a combining one none.

    >>> _columns("m:x@0"), _columns("日本"), _columns("e\u0301")
    (5, 4, 1)
    """
    return sum(
        0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
        for ch in text
    )


def shell_quoted(path: str, encoding: Optional[str] = None) -> str:
    """``path`` quoted to paste into a shell (bash, zsh), naming the same file: as
    :func:`shlex.quote` quotes it, or, where that would not name it once printed (bytes that
    are no UTF-8, which Python holds surrogate-escaped; a control character; a character
    that ``encoding``, the stream's it is printed to, lacks and would write escaped, or
    writes as other bytes than the file's name has: latin-1's one byte for 'ñ'), in
    bash's ``$'...'`` with those bytes as ``\\xHH``.

    >>> print(shell_quoted("runs/a b"), shell_quoted("runs/bad\\udcffname"), shell_quoted("é", "ascii"))
    'runs/a b' $'runs/bad\\xffname' $'\\xc3\\xa9'
    """
    try:
        plain = path.isprintable() and path.encode(encoding or "utf-8") == os.fsencode(path)
    except (UnicodeEncodeError, LookupError):
        plain = False
    if plain or not path:
        return shlex.quote(path)
    kept = "".join(
        chr(byte) if 0x20 <= byte < 0x7F and byte not in b"\\'" else f"\\x{byte:02x}"
        for byte in os.fsencode(path)
    )
    return f"$'{kept}'"


#: Every signal number a handler can be called with.
_SIGNAL_NUMBERS = frozenset(int(number) for number in signal.valid_signals())


def raised_by_signal_handler(error: BaseException) -> bool:
    """Whether ``error`` came out of a Python signal handler, not from bcrecord's own work.

    Python runs a signal's handler in the main thread wherever that thread is, inside
    a probe's copy too. What it raises there (a timeout's ``TimeoutError``) is the
    program's, and a probe lets it through as if the signal had come right after it,
    where it handles a failed copy of its own by keeping it in ``rec.errors``.

    A handler's frame is told by how Python calls it: with a signal number and then
    the frame the signal interrupted, its caller (a method, ``*args`` and a ``partial``
    too). Not by comparing with the handlers installed: a handler may put the old one
    back before it raises. One frame, no helper: probes call this near the recursion
    limit.

    >>> import signal
    >>> def timeout(number, frame):
    ...     raise TimeoutError("too slow")
    >>> old = signal.signal(signal.SIGUSR1, timeout)
    >>> try:
    ...     signal.raise_signal(signal.SIGUSR1)
    ... except TimeoutError as error:
    ...     raised_by_signal_handler(error), raised_by_signal_handler(ValueError("a copy's"))
    (True, False)
    >>> _ = signal.signal(signal.SIGUSR1, old)
    """
    tb = error.__traceback__
    # (The first entry is the frame catching it, still running: never a handler's.)
    tb = tb.tb_next if tb is not None else None
    while tb is not None:
        frame = tb.tb_frame
        tb = tb.tb_next
        caller, code = frame.f_back, frame.f_code
        count, varargs = code.co_argcount, code.co_flags & inspect.CO_VARARGS
        if caller is None or (count < 2 and not varargs):
            continue
        local = frame.f_locals
        args = [local.get(name) for name in code.co_varnames[:count]]
        if varargs:
            rest = local.get(code.co_varnames[count + code.co_kwonlyargcount])
            if isinstance(rest, tuple):
                args.extend(rest)
        # (In that order: a frame and then a number is a stack inspection's, such as
        # inspect.getframeinfo(inspect.currentframe(), 1), which can fail in a copy.)
        for number, interrupted in zip(args, args[1:], strict=False):
            if interrupted is caller and type(number) is int and number in _SIGNAL_NUMBERS:
                return True
    return False
