"""What a signal handler raises, raised at each place Python runs one, in turn.

Python runs a signal's handler as a call returns or as a Python function starts; what it
raises (a timeout's ``TimeoutError``, a Ctrl-C) comes out of that call. A profile function
sees the same places (``'c_return'`` and ``'call'`` events), so a test raises
:class:`Interrupt` at the first of them, then the second, and so on, and checks what each
left behind.

>>> def f():
...     return len("ab") + len("c")
>>> seen, cut = interrupted(f, calls_made_from(f.__code__))
>>> seen, cut
(['c_return', 'c_return'], False)
>>> interrupted(f, calls_made_from(f.__code__), stop_at=2)
(['c_return', 'c_return'], True)
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, Collection, List, Optional, Tuple

#: Whether a profile event (frame, event, arg) is a place to interrupt.
Place = Callable[[types.FrameType, str, Any], bool]


class Interrupt(BaseException):
    """What a signal handler raises, as these tests raise it: no ``Exception``, which bcrecord
    may take for a failure of its own."""


def interrupted(
    action: Callable[[], Any], where: Place, stop_at: Optional[int] = None
) -> Tuple[List[str], bool]:
    """Run ``action``, raising :class:`Interrupt` at the ``stop_at``-th place ``where`` accepts
    (None: at none, to count them); the events of the places met, and whether it was cut short."""
    seen: List[str] = []

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        if where(frame, event, arg):
            seen.append(event)
            if len(seen) == stop_at:
                raise Interrupt

    sys.setprofile(profile)
    try:
        action()
    except Interrupt:
        return seen, True
    finally:
        sys.setprofile(None)
    return seen, False


def calls_made_from(code: types.CodeType) -> Place:
    """The places of the calls ``code`` makes: a C call's return, a Python function's start
    (not a generator expression's: left unfinished, its close reports what it raised as
    unraisable)."""

    def where(frame: types.FrameType, event: str, arg: Any) -> bool:
        if event == "c_return":
            return frame.f_code is code
        caller = frame.f_back
        return event == "call" and caller is not None and caller.f_code is code and not _generator(frame)

    return where


def calls_in(files: Collection[str]) -> Place:
    """The places inside the code of ``files``: its functions' starts, the returns of the C calls
    they make; not in a lock's own Python methods, nor as a lock's ``__enter__`` returns (taken
    and not noted so, a lock stays held: nothing can be done there)."""

    def where(frame: types.FrameType, event: str, arg: Any) -> bool:
        code = frame.f_code
        locking = code.co_name in ("__enter__", "__exit__", "acquire", "release") and hasattr(
            frame.f_locals.get("self"), "acquire"
        )
        entered = getattr(arg, "__name__", None) == "__enter__" and hasattr(
            getattr(arg, "__self__", None), "acquire"
        )
        return code.co_filename in files and event in ("call", "c_return") and not locking and not entered

    return where


def _generator(frame: types.FrameType) -> bool:
    return frame.f_code.co_name == "<genexpr>"
