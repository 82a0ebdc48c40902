"""Readable listings of what a patch does: disassembly before and after, probes marked.

Used by ``bcrecord show``, by the MMEngine hook's ``print_modification`` and by
anyone who wants to see the inserted code:

>>> import bcrecord
>>> def f(a):
...     x = a + 1
...     return x
>>> with bcrecord.patch_function(f, "x") as patch:
...     text = side_by_side(patch.original_code, patch.code)
>>> "bcrecord" in text and text.count("+") >= 5
True
"""

from __future__ import annotations

import difflib
import dis
from types import CodeType
from typing import List, Optional, Tuple

from ._versions import PROBE_NAME, dis_line
from .errors import as_written, padded
from .rewrite import SINKS_GET

__all__ = ["instructions_text", "side_by_side", "decompiled"]


def _has_probes(code: CodeType) -> bool:
    return PROBE_NAME in code.co_names or any(const is SINKS_GET for const in code.co_consts)


def _rows(code: CodeType, encoding: Optional[str] = None) -> List[Tuple[str, str]]:
    """(comparison key, display text) for each instruction, the text as a stream of
    ``encoding`` writes it; caches left out."""
    rows = []
    line: Optional[int] = None
    for instr in dis.get_instructions(code):
        if instr.opname in ("CACHE", "EXTENDED_ARG"):
            continue
        line = dis_line(instr, line)
        arg = instr.argrepr or ("" if instr.arg is None else str(instr.arg))
        if instr.opname == "LOAD_CONST" and isinstance(instr.argval, int) and _has_probes(code):
            arg = str(instr.argval)
        elif instr.opname == "LOAD_CONST" and instr.argval is SINKS_GET:
            arg = "bcrecord.rewrite.SINKS.get"  # its repr carries an address, different each run
        # The line too: a probe's load of a local is not the load of it the next line makes.
        key = (
            f"{line} {instr.opname} {arg}"
            if "to " not in arg and "to L" not in arg
            else f"{line} {instr.opname}"
        )
        rows.append(
            (
                key,
                as_written(f"{'' if line is None else line:>5} {instr.opname:<24} {arg}".rstrip(), encoding),
            )
        )
    return rows


def instructions_text(code: CodeType) -> str:
    """A compact disassembly: line, opname, argument (no offsets, no caches).

    >>> "RETURN" in instructions_text((lambda: 1).__code__)
    True
    """
    return "\n".join(text for _, text in _rows(code))


def side_by_side(
    original: CodeType, patched: CodeType, width: int = 52, encoding: Optional[str] = None
) -> str:
    """Original and patched disassembly in two columns; inserted lines start with ``+``.

    Lines that differ between the two (a method-style load made plain) show ``~``. The left
    column, ``width`` terminal columns wide, is padded by terminal columns (a wide character in a
    local's name takes two), and
    with ``encoding`` (the stream's it is printed to) as that stream writes it, a character
    it lacks escaped.

    >>> import bcrecord
    >>> def f(a):
    ...     x = a + 1
    ...     return x
    >>> with bcrecord.patch_function(f, "x") as patch:
    ...     lines = side_by_side(patch.original_code, patch.code).splitlines()
    >>> lines[0].split()
    ['original', 'patched']
    >>> any("bcrecord" in line for line in lines if line.startswith("+"))  # the probe's first load
    True
    """
    left, right = _rows(original, encoding), _rows(patched, encoding)
    matcher = difflib.SequenceMatcher(a=[k for k, _ in left], b=[k for k, _ in right], autojunk=False)
    out = [f"  {'original':<{width}}   patched", f"  {'-' * width}   {'-' * width}"]
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            for i, j in zip(range(a0, a1), range(b0, b1), strict=True):
                out.append(f"  {padded(left[i][1], width)}   {right[j][1]}")
        elif tag == "insert":
            for j in range(b0, b1):
                out.append(f"+ {'':<{width}}   {right[j][1]}")
        else:
            for k in range(max(a1 - a0, b1 - b0)):
                a = left[a0 + k][1] if a0 + k < a1 else ""
                b = right[b0 + k][1] if b0 + k < b1 else ""
                mark = "~" if a and b else ("-" if a else "+")
                out.append(f"{mark} {padded(a, width)}   {b}")
    return "\n".join(out)


def decompiled(code: CodeType) -> Optional[str]:
    """Decompiled source of ``code`` when the optional ``depyf`` package is installed.

    Returns None when depyf is missing or cannot decompile this code.

    >>> def f(a):
    ...     return a + 1
    >>> source = decompiled(f.__code__)
    >>> source is None or "return" in source
    True
    """
    try:
        import depyf  # type: ignore[import-not-found]
    except Exception:
        return None
    try:
        return str(depyf.decompile(code))
    except Exception:
        return None
