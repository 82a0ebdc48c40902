"""The recording runtime: what a probe does when it fires, and where values go.

Four rules decide it:

* **Who receives a value.** Recordings are entered per *context* (a
  :class:`contextvars.ContextVar`): each thread, and each asyncio task, sees the
  recordings it entered itself, so two threads with their own recordings stay
  apart. A probe that fires in a context with no recording delivers to the
  recordings opened with ``threads='all'``, so worker threads that a library
  starts for you (``nn.DataParallel``'s replicas) still reach the recording that
  ran the forward. :func:`carry` runs a callable inside the caller's recordings.
* **What an idle probe costs.** Nothing: a patched function runs its original code
  object until some recording that takes its patch is entered anywhere in the
  process, and goes back to it when the last such recording exits (patches are
  *armed* and *disarmed*). A recording made with ``only`` arms just those patches,
  so recorders that share a model (several extractors) do not run each other's
  probes. Calls that started before a recording was entered run without probes.
* **What a recorded value costs.** Inserted code runs
  ``SINKS.get()[site_id].append(value)`` (:mod:`bcrecord.rewrite`): the
  context's *sinks list*, indexed by site id. Where the one recording that takes a
  site keeps values uncopied, the item is its list of values, and no Python code
  runs per value; otherwise it is a :class:`Sink` (copy, then store), a fan-out to
  nested recordings, or a drop. A per-instance site's probe (call spelling) also
  passes the instance, and its item keeps one such route per owner name. Items
  are built on a site's first value in a context.
* **What is stored.** A copy made when the value is assigned, by the recording's
  copy policy (overridable per spec): ``'clone'`` calls ``.clone()`` where the
  value has one (and copies lists, tuples, dicts and sets around such values),
  ``'detach'`` calls ``.detach()``, ``'deepcopy'`` uses :func:`copy.deepcopy`,
  ``'none'`` keeps the object itself. Plug-ins (the torch layer) register
  type-specific copies with :func:`register_copy`.

A probe never raises into the patched function: a failed copy or attribute read
is kept in :attr:`Recording.errors` and reported once per key as a
:class:`~bcrecord.errors.RecordingWarning`.

>>> import bcrecord
>>> def f(a):
...     x = a * 2
...     return x + 1
>>> g = bcrecord.instrument(f, ["x", "return"], name="demo")
>>> with bcrecord.recording() as rec:
...     _ = g(3)
>>> rec["demo:f:x@0"], rec["demo:f:return"]
(6, 7)
"""

from __future__ import annotations

import builtins
import contextvars
import copy as _copy_module
import dataclasses
import difflib
import enum
import functools
import importlib
import inspect
import operator
import os
import pickle
import sys
import threading
import traceback
import types
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Container,
    ContextManager,
    Deque,
    Dict,
    Generic,
    Iterable,
    Iterator,
    List,
    Optional,
    ParamSpec,
    Protocol,
    Sequence,
    Set,
    Tuple,
    TypeVar,
    Union,
)

from ._versions import ARGUMENT_REFERENCES, PROBE_NAME
from .errors import SpecError, listed, raised_by_signal_handler, warn
from .rewrite import DEFAULT_SINKS, SINKS
from .rewrite import _cache_lock as _rewrite_cache_lock
from .specs import COPY_POLICIES

__all__ = [
    "Recording",
    "RecordError",
    "Site",
    "Sink",
    "hold_sites",
    "recording",
    "carry",
    "register_copy",
    "load_plugin",
    "copy_value",
    "copies_without_python",
    "silently",
    "silence",
    "register_sites",
    "release_sites",
    "set_frame_switch",
    "track",
    "tracked",
    "arming",
    "refresh",
    "untrack",
    "is_active",
    "context_recordings",
    "receiving_recordings",
    "kept_length",
    "rebuilt_container",
    "copied_container",
    "shallow_copy",
    "copied_dataclass",
    "safe_over_forks",
]

T = TypeVar("T")
#: The parameters of a function that :func:`carry` wraps, kept for its callers' type checks.
P = ParamSpec("P")


@dataclass(frozen=True)
class Site:
    """What one inserted probe reports: its key, and how to read and copy the value.

    With ``owner`` set, the probe passes the instance it ran on, and the key is
    ``owner(instance) + key`` (``key`` then starts with ``':'``); an owner of None
    means that instance is not recorded.
    """

    key: str
    #: Attributes to read from the probed value first (entry-time attribute chains).
    chain: Tuple[str, ...] = ()
    #: A policy name, a callable copier, or None for the recording's policy. A callable
    #: may also have ``copier_for(cls)``: the copier for values of exactly ``cls``,
    #: asked once per type (a shortcut for the types it handles most).
    copy: Any = None
    owner: Optional[Callable[[Any], Optional[str]]] = None
    #: ``id()`` of what inserted this site (its Patch), for recordings that take only some
    #: patches. Not the Patch itself: the registry of sites would keep it, and through it
    #: the patched function, alive (an ``instrument`` copy was never freed).
    tag: Optional[int] = field(default=None, compare=False)


@dataclass(frozen=True)
class RecordError:
    """A value a probe could not record, and why.

    ``error`` is the exception without its traceback (whose frames would keep the value
    that failed, and the function's other locals, alive); ``traceback`` is its text.
    """

    key: str
    error: BaseException
    traceback: str = ""


class ErrorText(Exception):
    """What a copy or pickle of a recording holds of a failure's exception that does not
    survive being pickled (one whose ``__init__`` takes other arguments than the message it
    pickles, one holding a lock): ``'<module>.<class>: <message>'``, its class's name in
    ``kind``. The failure's traceback text is kept as it was.

    >>> error = ErrorText("app.CopyFailed: Odd: not clonable", "app.CopyFailed")
    >>> str(error), error.kind
    ('app.CopyFailed: Odd: not clonable', 'app.CopyFailed')
    """

    def __init__(self, text: str, kind: str = "") -> None:
        super().__init__(text, kind)
        self.kind = kind

    def __str__(self) -> str:
        return str(self.args[0])


def _portable(failure: RecordError) -> RecordError:
    """``failure`` as a pickle or a deep copy of its recording can hold it: its exception
    itself where it pickles and loads back, else an :class:`ErrorText` of it."""
    try:
        pickle.loads(pickle.dumps(failure.error))
        return failure
    except Exception:
        kind = f"{type(failure.error).__module__}.{type(failure.error).__qualname__}"
        try:
            message = str(failure.error)
        except Exception:  # (a __str__ that raises too)
            message = "(its message could not be read)"
        return dataclasses.replace(failure, error=ErrorText(f"{kind}: {message}", kind))


def _without_frames(error: BaseException) -> str:
    """The traceback text of ``error``, whose chain (causes, contexts) then holds no frames.

    Nor does an ``AttributeError`` of it hold the object it names (its ``obj``).

    An exception caught where code still runs is not the failed copy's: a probe in an
    ``except`` block fails with the function's own exception as its context, which keeps
    its traceback (it may be re-raised) and is let go of instead.
    """
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    running: Set[int] = set()
    frame: Optional[types.FrameType] = sys._getframe()
    while frame is not None:
        running.add(id(frame))
        frame = frame.f_back
    seen: Set[int] = set()
    links: List[BaseException] = [error]
    while links:
        link = links.pop()
        # (Seen: a cause may loop back. Caught where code runs: a group's item, the function's.)
        if id(link) in seen or (link is not error and _caught_in(link, running)):
            continue
        seen.add(id(link))
        link.__traceback__ = None
        if isinstance(link, AttributeError):  # (what it was looked up on: an instance, a failed value)
            link.obj = None
        # Both: `raise ... from` in an except block has a cause and a context (not shown,
        # still held), and an exception group holds its exceptions' frames too.
        for chained in (link.__cause__, link.__context__):
            if chained is not None and _caught_in(chained, running):  # the function's own
                if chained is link.__cause__:
                    link.__cause__ = None
                if chained is link.__context__:
                    link.__context__ = None
            elif chained is not None:
                links.append(chained)
        grouped = getattr(link, "exceptions", None)
        if isinstance(grouped, tuple):
            links.extend(one for one in grouped if isinstance(one, BaseException))
    return text


def _caught_in(error: BaseException, frames: Set[int]) -> bool:
    """Whether ``error`` was caught in one of ``frames`` (by id): its traceback starts there."""
    held = error.__traceback__
    return held is not None and id(held.tb_frame) in frames


# --- locks over a fork ---------------------------------------------------------
#
# A child forked (``os.fork``, ``multiprocessing``'s ``fork``, a DataLoader's workers)
# while another thread of the parent held one of bcrecord's locks would start with it
# held by a thread it does not have, and hang on it for good (entering or leaving a
# recording, patching). So the locks that guard changes of several steps are taken in
# their order just before a fork and let go of just after it, in both processes (the
# child gets them free, and the state they guard whole); the ones held only around one
# change, with nothing inside (a finalizer may take the others there), are made anew in
# the child.

#: The locks held over a fork (see safe_over_forks), by rank, taken lowest rank first.
_held_over_forks: Dict[int, weakref.WeakSet[Any]] = {}
#: The locks made anew in a forked child.
_renewed_in_children: weakref.WeakSet[Any] = weakref.WeakSet()
#: The locks this process took for the fork under way, in the order taken.
_taken_for_fork: List[Any] = []


def safe_over_forks(lock: T, rank: Optional[int] = None) -> T:
    """Keep ``lock`` from hanging a forked child; returns it.

    ``rank``: the lock is held over every fork, taken after the locks of lower ranks (a
    thread holding one takes only locks of higher ranks inside it: the patch lock 0, the
    arming lock 1, the sites lock 2). None: a lock held around one brief change, which
    is made anew in the child. Held weakly: a lock of an object goes with it.

    >>> import threading
    >>> lock = safe_over_forks(threading.Lock())
    >>> lock.locked()
    False
    """
    if rank is None:
        _renewed_in_children.add(lock)
    else:
        _held_over_forks.setdefault(rank, weakref.WeakSet()).add(lock)
    return lock


def _before_fork() -> None:
    for rank in sorted(_held_over_forks):
        for lock in list(_held_over_forks[rank]):
            lock.acquire()
            _taken_for_fork.append(lock)


def _after_fork() -> None:
    # The list is this thread's while it holds the first lock: read whole before letting go of
    # any, since another thread forking at once takes them (and fills it) as soon as that one is free.
    taken = _taken_for_fork[:]
    del _taken_for_fork[:]
    for lock in reversed(taken):
        lock.release()


def _after_fork_in_child() -> None:
    _after_fork()  # the forking thread is the child's one thread: it holds them there too
    for lock in list(_renewed_in_children):
        lock._at_fork_reinit()


if hasattr(os, "register_at_fork"):  # (not on Windows, which does not fork)
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork, after_in_child=_after_fork_in_child)

#: Taken while a recording's errors are trimmed to its ``keep``.
_errors_lock = safe_over_forks(threading.Lock())
safe_over_forks(_rewrite_cache_lock)  # (the rewrite module comes before this one)


def _holds(items: Iterable[object], item: object) -> bool:
    """Whether ``item`` itself is among ``items`` (by identity: no ``==`` of a subclass runs).

    A loop, not ``any()`` over a generator: a generator that ``any()`` leaves early is closed
    at once, running code of its own, where a signal handler may raise (a Ctrl-C as a
    recording is left); raised there, it is printed ("Exception ignored") and lost (3.10, 3.11).
    Elsewhere on the recording's paths, ``any()`` and ``all()`` take a list for the same reason.

    >>> a = object()
    >>> _holds((object(), a), a), _holds((), a)
    (True, False)
    """
    for each in items:
        if each is item:
            return True
    return False


def _without(items: Iterable[T], item: object) -> Tuple[T, ...]:
    """``items`` but ``item`` itself, in order, as a tuple (a loop: see :func:`_holds`).

    >>> _without((1, 2, 1), 1)
    (2,)
    """
    kept = []
    for each in items:
        if each is not item:
            kept.append(each)
    return tuple(kept)


def _snapshot(items: Callable[[], Iterable[T]]) -> Tuple[T, ...]:
    """A tuple of what ``items`` (a dict view's maker, such as ``d.values``) gives, again if it changed.

    Making the tuple can run the garbage collector, whose weak-reference callbacks (or
    a thread they let in) may add or drop an entry: "dictionary changed size during
    iteration". Those changes are rare and brief, so the next try succeeds.

    >>> _snapshot({"a": 1}.items)
    (('a', 1),)
    """
    while True:
        try:
            return tuple(items())
        except RuntimeError:
            continue


class _WeakRegistry(Generic[T]):
    """Objects held weakly, by identity: what a ``WeakSet`` does, in a plain dict.

    Entering and leaving a recording adds to, removes from and walks these
    registries, usually right after a model's native code has evicted the
    interpreter from the CPU caches; there a ``WeakSet`` (its Python-level iterator
    guard, ``add`` and ``discard``) costs tens of microseconds a call, a dict of weak
    references a few.

    >>> class Thing: pass
    >>> registry, thing = _WeakRegistry(), Thing()
    >>> registry.add(thing); registry.live() == [thing]
    True
    >>> del thing; registry.live()
    []
    """

    __slots__ = ("_refs",)

    def __init__(self) -> None:
        self._refs: Dict[int, weakref.ReferenceType] = {}

    def add(self, item: T) -> None:
        key, refs = id(item), self._refs
        found = refs.get(key)
        if found is not None and found() is item:
            return

        def forget(dead: weakref.ReferenceType) -> None:  # collected without discard()
            if refs.get(key) is dead:
                refs.pop(key, None)

        refs[key] = weakref.ref(item, forget)

    def discard(self, item: T) -> None:
        found = self._refs.get(id(item))
        if found is not None and found() is item:
            self._refs.pop(id(item), None)

    def get(self, key: int) -> Optional[T]:
        """The registered object whose ``id`` is ``key``, if it is still alive.

        >>> class Thing: pass
        >>> registry, thing = _WeakRegistry(), Thing()
        >>> registry.add(thing); registry.get(id(thing)) is thing, registry.get(0)
        (True, None)
        """
        found = self._refs.get(key)
        return None if found is None else found()

    def take(self) -> List[T]:
        """The registered objects still alive, forgetting every one.

        >>> class Thing: pass
        >>> registry, thing = _WeakRegistry(), Thing()
        >>> registry.add(thing); registry.take() == [thing], registry.live()
        (True, [])
        """
        alive = self.live()
        self._refs.clear()
        return alive

    def live(self) -> List[T]:
        """The registered objects still alive (a snapshot: safe to change while walking)."""
        alive = []
        # (A collection may call forget() meanwhile.) A loop, not a comprehension: no frame on 3.11.
        for ref in _snapshot(self._refs.values):
            item = ref()
            if item is not None:
                alive.append(item)
        return alive


# --- sites and sinks ---------------------------------------------------------
#
# Inline probes run ``SINKS.get()[site_id].append(value)`` (``bcrecord.rewrite``;
# ``_context`` here is that ContextVar): its ``get()`` returns the *sinks list* of
# the current context, and item ``site_id`` of that list is where the value goes.
# Every step is C-level, and when the only recording that takes a site keeps
# values uncopied, the item is that recording's list of values itself, so storing
# a value runs no Python frame at all. Other items are Python objects with an
# ``append``.
#
# Every sinks list is as long as the largest site id + 1 at every moment (lists are
# extended under the lock before an id is handed out), so inserted code can never
# index past the end. Item 0 is the :class:`_Routing` that owns the list.

_SITES: Dict[int, Site] = {}
# Re-entrant: a finalizer (release_sites, _unhold) may run from GC while the lock is held.
_sites_lock = safe_over_forks(threading.RLock(), rank=2)
#: Released ids that no live code reports with any more, for reuse.
_free_ids: List[int] = []
#: For each id, how many live code objects report with it (see hold_sites).
_holders: Dict[int, int] = {}
#: Held ids to release once no code reports with them (see release_sites' once_unheld).
_release_when_unheld: Set[int] = set()
#: Appending to it drops the value (C-level): sinks of sites nothing takes.
_NOWHERE: Deque[Any] = deque(maxlen=0)


class _Unrouted:
    """The item of a site not routed yet in a sinks list: routes it on its first value."""

    __slots__ = ("site_id",)

    def __init__(self, site_id: int) -> None:
        self.site_id = site_id

    def _routed(self) -> Any:
        """This site's item in the current context's sinks list, routed (and put there)."""
        sinks = _context.get()
        routing: _Routing = sinks[0]
        version = routing.version
        target = routing.route(self.site_id)
        with _sites_lock:
            if routing.version == version and sinks[self.site_id] is self:
                sinks[self.site_id] = target
                routing.routed = True
        return target

    def append(self, value: Any) -> None:
        try:
            target = self._routed()
        except Exception as error:  # a probe must never raise into user code
            # (A RecursionError is never a handler's, and looking takes a frame. Not isinstance:
            # at the recursion limit that call fails too, on 3.10.)
            if error.__class__ is not RecursionError and raised_by_signal_handler(error):
                raise  # the program's own (see raised_by_signal_handler)
            return
        target.append(value)

    def deliver(self, value: Any, instance: Any) -> None:
        """What a per-instance site's probe calls (see :class:`_ByOwner`)."""
        try:
            deliver = self._routed().deliver
        except Exception as error:  # not a per-instance site any more (released), or routing failed
            if error.__class__ is not RecursionError and raised_by_signal_handler(error):
                raise
            return
        deliver(value, instance)


#: Item ``k`` of every fresh sinks list (item 0 is replaced by the list's routing).
_UNROUTED: List[Any] = [None]


class _Routing:
    """Whose values a sinks list routes where: item 0 of its sinks list.

    ``own`` are the recordings entered in the context; ``recordings`` those that
    receive its values (``own``, or the ``threads='all'`` recordings for contexts
    that have none).
    """

    __slots__ = ("sinks", "own", "recordings", "version", "routed", "silent", "__weakref__")

    def __init__(
        self, own: Tuple[Recording, ...], recordings: Tuple[Recording, ...], sinks: Optional[List[Any]] = None
    ) -> None:
        self.own = own
        self.recordings = recordings
        self.version = 0
        #: Whether any item of ``sinks`` differs from ``_UNROUTED``'s (see :meth:`reset`).
        self.routed = False
        #: What probes of the context find while a value is copied (see :func:`silently`).
        self.silent = _Silent(self)
        with _sites_lock:
            # ``sinks``: a list made elsewhere to fill in place (the ContextVar's default).
            self.sinks: List[Any] = [] if sinks is None else sinks
            self.sinks[:] = _UNROUTED
            self.sinks[0] = self
            _routings.add(self)
            for rec in own:  # (so that each can stop it delivering to it when it ends)
                rec._included.add(self)

    def route(self, site_id: int) -> Any:
        """Where this context's values of ``site_id`` go: something with ``append``.

        For a per-instance site (its :attr:`Site.owner` set), a :class:`_ByOwner`.
        """
        site = _SITES.get(site_id)
        if site is not None and site.owner is not None:
            return _ByOwner(site_id, site.owner, self.recordings) if self.recordings else _NOWHERE
        return _route(self.recordings, site_id, None)

    def retire(self) -> None:
        """Stop tracking this routing if no context holds its sinks any more.

        The sinks list and its routing refer to each other, so without this they
        would wait for the cyclic garbage collector, and every site registered
        meanwhile would extend them.
        """
        with _sites_lock:
            sinks = self.sinks
            # References: this routing's slot and ``sinks`` here.
            if sys.getrefcount(sinks) - ARGUMENT_REFERENCES <= 2:
                _routings.discard(self)
                _ownerless.discard(self)
                sinks[0] = None  # break the cycle: the list is freed now

    def drop(self, rec: Recording) -> None:
        """Deliver no more to ``rec`` (it ended), for the contexts that still hold this list.

        Contexts copied while ``rec`` was active (an asyncio task it started, a
        ``copy_context()``) share the list; they keep the other recordings.
        """
        with _sites_lock:
            self.own = _without(self.own, rec)
            if self.own:
                self.recordings = _without(self.recordings, rec)
            else:
                # A context with no recording of its own now: as one that never had any, it
                # delivers to the threads='all' recordings (kept so by _set_shared).
                self.recordings = _without(_shared, rec)
                _ownerless.add(self)
            self.routed = True  # routes to rec may be anywhere in the list
            self.reset()

    def reset(self) -> None:
        """Forget every route (they are rebuilt on the next value of each site).

        A routing that has routed nothing since its last reset (the default
        routing, in a process whose recordings are all entered in the thread
        that runs the model) has nothing to forget: entering and leaving a
        ``threads='all'`` recording then costs no copy of the list.
        """
        with _sites_lock:
            self.version += 1
            if self.routed:
                self.sinks[1:] = _UNROUTED[1:]
                self.routed = False


class _FanOut:
    """A site taken by several recordings of one context (nested recordings)."""

    __slots__ = ("targets",)

    def __init__(self, targets: List[Any]) -> None:
        self.targets = targets

    def append(self, value: Any) -> None:
        stop: Optional[BaseException] = None
        for target in self.targets:
            try:
                target.append(value)
            except BaseException as raised:  # an early stop: raised once every recording has the value
                stop = stop or raised
        if stop is not None:
            raise stop


def _route(recordings: Tuple[Recording, ...], site_id: int, owner: Optional[str]) -> Any:
    """Where ``recordings`` keep values of ``site_id`` (of ``owner``): something with ``append``."""
    found = []
    for rec in recordings:
        sink = rec._sink(site_id, owner)
        if sink is not None:
            found.append(sink.direct())
    if not found:
        return _NOWHERE
    return found[0] if len(found) == 1 else _FanOut(found)


class _ByOwner:
    """The item of a per-instance site in a sinks list: routes by the instance's owner.

    The probe of such a site passes the instance it ran on; ``owner(instance)``
    names it (None: not recorded), and the route for each name is built on its
    first value, like every route, and kept until the sinks list is reset.
    """

    __slots__ = ("site_id", "owner", "recordings", "targets")

    def __init__(
        self, site_id: int, owner: Callable[[Any], Optional[str]], recordings: Tuple[Recording, ...]
    ) -> None:
        self.site_id = site_id
        # A name= function may call patched code (a method recorded too): not the program's
        # values. bcrecord's own owners (``quiet``: they read a dict) skip that cost per value.
        self.owner = owner if getattr(owner, "quiet", False) else functools.partial(silently, owner)
        self.recordings = recordings
        #: Owner name -> where its values go.
        self.targets: Dict[str, Any] = {}

    def deliver(self, value: Any, instance: Any) -> None:
        try:
            name = self.owner(instance)
            if name is None:
                return
            target = self.targets.get(name)
            if target is None:
                if not isinstance(name, str):  # (checked here: once per name, not per value)
                    raise TypeError(f"the owner function (name=) gave {name!r}, not a str (or None)")
                # Two threads may both build it: the same route either way.
                target = self.targets[name] = _route(self.recordings, self.site_id, name)
        except Exception as error:  # a broken owner function must not break the model
            if error.__class__ is not RecursionError and raised_by_signal_handler(error):
                raise
            for rec in self.recordings:
                try:
                    rec._fail(f"<owner of {type(instance).__name__}>{_SITES[self.site_id].key}", error)
                except Exception as reporting:
                    if reporting.__class__ is not RecursionError and raised_by_signal_handler(reporting):
                        raise  # what a signal handler raised while reporting: the program's own
            return
        target.append(value)


_routings: _WeakRegistry[_Routing] = _WeakRegistry()
#: Routings whose own recordings all ended while contexts still hold them (a task or a
#: carried thread that runs on): they deliver to the threads='all' recordings.
_ownerless: _WeakRegistry[_Routing] = _WeakRegistry()


def register_sites(sites: Sequence[Site]) -> List[int]:
    """Give each site an id for inserted code to report with (released ids are reused).

    >>> ids = register_sites([Site("a:f:x@0")]); release_sites(ids)
    """
    global _sinks_short
    with _sites_lock:
        if _sinks_short:  # (a call that what a signal handler raised cut short left some lists short)
            _grow_sinks()
        ids: List[int] = []
        grown: List[_Unrouted] = []
        reused: List[_Unrouted] = []
        for site in sites:
            if _free_ids:
                unrouted = _Unrouted(_free_ids.pop())
                _UNROUTED[unrouted.site_id] = unrouted
                reused.append(unrouted)
            else:
                unrouted = _Unrouted(len(_UNROUTED) + len(grown))
                grown.append(unrouted)
            ids.append(unrouted.site_id)
            _SITES[unrouted.site_id] = site
        if grown:
            _sinks_short = True
            _UNROUTED.extend(grown)
            _grow_sinks()
            _sinks_short = False
        for routing in _routings.live():
            for unrouted in reused:
                routing.sinks[unrouted.site_id] = unrouted
    return ids


#: Whether sinks lists may be shorter than ``_UNROUTED`` (see :func:`_grow_sinks`).
_sinks_short = False


def _grow_sinks() -> None:
    """Make every sinks list as long as ``_UNROUTED`` (under ``_sites_lock``), with its items.

    Each list catches up from where it is, so a call cut short (what a signal handler
    raised, a timeout's ``TimeoutError``) is completed by the next one, before any id
    past a list's end is handed out: ids come from ``len(_UNROUTED)``, never from a list's.
    """
    size = len(_UNROUTED)
    for routing in _routings.live():
        sinks = routing.sinks
        if len(sinks) < size:
            sinks.extend(_UNROUTED[len(sinks) : size])


def release_sites(ids: Sequence[int], once_unheld: bool = False) -> None:
    """Forget sites; probes still running with these ids become silent.

    An id is reused only once no code that reports with it is alive (see
    :func:`hold_sites`). Every context drops its routes for these sites, so a
    recording that stays open across many patch/remove cycles does not grow.
    With ``once_unheld``, a site that live code still reports with is forgotten
    only once that code is gone: a freed recording copy's generator (which on 3.10
    does not hold its function) records on as it does on 3.11+.

    >>> release_sites([])
    """
    gone = set(ids)
    with _sites_lock:
        if once_unheld:
            held = {site_id for site_id in gone if site_id in _holders}
            _release_when_unheld.update(held)
            gone -= held
        routings = _routings.live()
        for site_id in gone:
            _forget(site_id, routings)


def _forget(site_id: int, routings: Sequence[_Routing]) -> None:
    """Silence one site in every context (under ``_sites_lock``), its id free once unheld."""
    if _SITES.pop(site_id, None) is None:
        return
    _release_when_unheld.discard(site_id)
    _UNROUTED[site_id] = _NOWHERE
    for routing in routings:
        routing.sinks[site_id] = _NOWHERE
    if site_id not in _holders:
        _free_ids.append(site_id)


def hold_sites(holders: Sequence[Any], ids: Sequence[int]) -> None:
    """Keep ``ids`` from reuse while any of ``holders`` (code reporting with them) lives.

    A generator may go on running old code after its patch is removed: its probes
    must stay silent rather than report under a site that reused the id.

    >>> ids = register_sites([Site("a:f:x@0")])
    >>> code = compile("1", "<doc>", "eval")
    >>> hold_sites([code], ids); release_sites(ids); del code
    """
    ids = tuple(ids)
    if not ids or not holders:
        return
    with _sites_lock:
        for site_id in ids:
            _holders[site_id] = _holders.get(site_id, 0) + len(holders)
    for holder in holders:
        weakref.finalize(holder, _unhold, ids).atexit = False


def _unhold(ids: Tuple[int, ...]) -> None:
    with _sites_lock:
        for site_id in ids:
            left = _holders.get(site_id, 1) - 1
            if left > 0:
                _holders[site_id] = left
                continue
            _holders.pop(site_id, None)
            if site_id in _release_when_unheld:
                _forget(site_id, _routings.live())
            elif site_id not in _SITES:
                _free_ids.append(site_id)


# --- arming ------------------------------------------------------------------


class Armable(Protocol):
    """Something whose probes are switched in while a recording that takes them is active."""

    def arm(self, wanted: Optional[Container[int]]) -> None:
        """Switch in the probes of the patches whose ``id`` is in ``wanted``; all when None."""

    def disarm(self) -> None:
        """Switch every probe out."""


_armables: _WeakRegistry[Armable] = _WeakRegistry()
#: Recordings active anywhere in the process.
_active_count = 0
#: Active recordings that take every patch (made without ``only``).
_taking_all = 0
#: For each patch (by id) that active recordings take with ``only``: how many take it.
_wanted: Dict[int, int] = {}
_arm_lock = safe_over_forks(threading.RLock(), rank=1)


def _wanted_now() -> Optional[Container[int]]:
    return None if _taking_all else _wanted


def track(item: Armable) -> None:
    """Arm ``item`` whenever a recording that takes its patches is active (now too).

    >>> class Switch:
    ...     on = False
    ...     def arm(self, wanted): self.on = True
    ...     def disarm(self): self.on = False
    >>> switch = Switch(); track(switch)
    >>> with recording():
    ...     during = switch.on
    >>> during, switch.on
    (True, False)
    >>> untrack(switch)
    """
    with _arm_lock:
        _armables.add(item)
        if _active_count:
            item.arm(_wanted_now())


def arming() -> ContextManager[Any]:
    """The lock arming and disarming run under: hold it to change what an item's ``arm`` reads.

    A recording entered in another thread arms items meanwhile; re-entrant, so ``refresh``
    may be called inside.

    >>> with arming():
    ...     pass
    """
    return _arm_lock


def refresh(item: Armable) -> None:
    """Arm or disarm ``item`` for the recordings active now (after its probes changed).

    >>> class Switch:
    ...     on = False
    ...     def arm(self, wanted): self.on = True
    ...     def disarm(self): self.on = False
    >>> switch = Switch(); refresh(switch); switch.on
    False
    """
    with _arm_lock:
        if _active_count:
            item.arm(_wanted_now())
        else:
            item.disarm()


def untrack(item: Armable) -> None:
    """Stop arming ``item`` (the caller restores its original state).

    >>> class Switch:
    ...     on = False
    ...     def arm(self, wanted): self.on = True
    ...     def disarm(self): self.on = False
    >>> switch = Switch(); track(switch); untrack(switch)
    >>> with recording():
    ...     switch.on
    False
    """
    with _arm_lock:
        _armables.discard(item)


def tracked() -> List[Armable]:
    """The items :func:`track` holds now (a snapshot; items garbage-collected are gone).

    >>> class Switch:
    ...     def arm(self, wanted): pass
    ...     def disarm(self): pass
    >>> switch = Switch(); track(switch)
    >>> switch in tracked()
    True
    >>> untrack(switch); switch in tracked()
    False
    """
    return _armables.live()


def context_recordings() -> Tuple[Recording, ...]:
    """The recordings entered in the current context, outermost first.

    >>> with recording() as outer, recording() as inner:
    ...     context_recordings() == (outer, inner)
    True
    """
    return _context.get()[0].own


def receiving_recordings() -> Tuple[Recording, ...]:
    """The recordings the current context's values go to: those entered in it, or where it
    has none, the ``threads='all'`` ones.

    >>> with recording() as rec:
    ...     receiving_recordings() == (rec,)
    True
    """
    routing = _context.get()[0]
    return () if routing is None else routing.recordings


def is_active() -> bool:
    """Whether any recording is active anywhere in the process.

    >>> is_active()
    False
    """
    return _active_count > 0


def _rearm(items: Optional[Sequence[int]] = None) -> None:
    """Give every armable the probes the active recordings take (none: the original code).

    ``items``: only the armables of these ids (those still tracked), where what the
    recordings take changed for their patches alone: a recording made with ``only``
    rearms those of its own patches as it starts and ends, whose code is all that
    changes, so that it costs what they do however many others the process holds.

    One that raises (a warning made an error by ``-W error``) does not keep the others
    from their code: the first error is raised once they all have it.
    """
    wanted = _wanted_now() if _active_count else None
    error: Optional[BaseException] = None
    for item in _armables.live() if items is None else map(_armables.get, items):
        if item is None:  # (its patches removed since: untracked)
            continue
        try:
            if _active_count:
                item.arm(wanted)
            else:
                item.disarm()
        except BaseException as raised:
            error = error or raised
    if error is not None:
        raise error


def _activate(only: Optional[Iterable[int]], arming: Optional[Sequence[int]] = None) -> Optional[Set[int]]:
    """A recording starts; ``only``: the ids of the patches it takes (None: every patch), whose
    armables' ids are ``arming`` (None: unknown, every armable is rearmed).

    Returns the ids counted (for :func:`_deactivate`), None for every patch.
    """
    global _active_count, _taking_all
    with _arm_lock:
        _active_count += 1
        ids = None if only is None else set(only)
        if ids is None:
            _taking_all += 1
            changed = _taking_all == 1
        else:
            changed = _want(ids, 1)
        if changed or (_active_count == 1 and arming is None):
            try:
                _rearm(None if ids is None else arming)
            except BaseException:
                _deactivate(ids, arming)  # not started: the counts and the code as they were
                raise
        return ids


def _deactivate(ids: Optional[Set[int]], arming: Optional[Sequence[int]] = None) -> None:
    """A recording ends; ``ids`` as :func:`_activate` returned them, ``arming`` as it was given."""
    global _active_count, _taking_all
    with _arm_lock:
        _active_count -= 1
        if ids is None:
            _taking_all -= 1
            changed = _taking_all == 0
        else:
            changed = _want(ids, -1)
        if changed or (_active_count == 0 and arming is None):
            try:
                _rearm(None if ids is None else arming)
            except BaseException:
                # Cut short (what a signal handler raised: a timeout), the code would stay as
                # far as it got, armed for good: once more, whole (it arms what the counts say).
                _rearm()
                raise


def _arming_of(patches: Iterable[Any]) -> Optional[List[int]]:
    """The ids of what arms the probes of ``patches`` (each one's ``_armable``), once each; None
    where one names none (not a patch of this package's, or removed). Ids, not the armables: a
    recording kept after its block must not hold them (a stand-in's holds what it was set on)."""
    found: Dict[int, None] = {}
    for patch in patches:
        item = getattr(patch, "_armable", None)
        if item is None:
            return None
        found[id(item)] = None
    return list(found)


def _want(ids: Iterable[int], step: int) -> bool:
    """Count recordings taking ``ids`` up (step 1) or down (-1).

    True if that changes what is armed: a patch became wanted or stopped being
    wanted while no recording takes every patch.
    """
    changed = False
    for tag_id in ids:
        count = _wanted.get(tag_id, 0) + step
        if count > 0:
            _wanted[tag_id] = count
        else:
            _wanted.pop(tag_id, None)
        if count == (1 if step > 0 else 0):
            changed = True
    return changed and not _taking_all


# --- copies ------------------------------------------------------------------

Copier = Callable[[Any], Any]
_registered: Dict[Tuple[str, type], Copier] = {}
# One type -> copier table per policy (None: keep the value itself). The probe
# reads these directly, so the common case is a single dict lookup.
_copier_cache: Dict[str, Dict[type, Optional[Copier]]] = {policy: {} for policy in COPY_POLICIES}
#: The most types a table of copiers holds: it holds them, and a class made anew per call (a
#: ``namedtuple``, a notebook cell run again) would be kept for good; a full one starts afresh.
_COPIERS_HELD = 1024
_CONTAINERS = (list, tuple, dict, set, frozenset)
_ATOMIC = (int, float, complex, str, bytes, bool, type(None), range, type)


def register_copy(cls: type, policy: str, copier: Copier) -> None:
    """Use ``copier`` for values of ``cls`` (and subclasses) under ``policy``.

    >>> import bcrecord
    >>> class Box:
    ...     def __init__(self, v): self.v = v
    >>> bcrecord.register_copy(Box, "clone", lambda b: Box(b.v))
    >>> bcrecord.copy_value(Box(1), "clone").v
    1
    """
    _known_policy(policy)
    if not isinstance(cls, type):
        raise TypeError(f"register_copy takes the class whose values it copies, got {cls!r}")
    if not callable(copier):
        raise TypeError(f"register_copy takes a function that copies a value, got {copier!r}")
    _registered[(policy, cls)] = copier
    if policy == "deepcopy":
        _nested_deepcopies.pop(cls, None)
        if cls is not object and _ALONE.get(id(copier)) is not copier:
            _nested_deepcopies[cls] = copier
    for table in _copier_cache.values():
        table.clear()
    if policy == "none":  # values under 'none' may no longer go straight into their lists
        for routing in _routings.live():
            routing.reset()


def _unregister_copy(cls: type, policy: str) -> None:
    """Drop the copier :func:`register_copy` gave ``cls`` itself under ``policy``, if any: its
    values are copied as their base classes' (``bcrecord.torch``'s ``register_holder`` again,
    for fewer policies)."""
    if policy == "deepcopy":
        _nested_deepcopies.pop(cls, None)
    if _registered.pop((policy, cls), None) is not None:
        for table in _copier_cache.values():
            table.clear()


def _known_policy(policy: str) -> None:
    if policy not in COPY_POLICIES:
        raise SpecError(f"unknown copy policy {policy!r}; choose one of {COPY_POLICIES}")


def _method_copier(method: str, policy: str) -> Copier:
    def call(value: Any) -> Any:
        return getattr(value, method)()

    call.__name__ = f"{policy}_by_{method}"
    return call


def rebuilt_container(value: Any, contents: Any) -> Any:
    """A new ``type(value)`` (a dict, list, set or tuple, or a subclass) holding ``contents``.

    ``contents``: a dict of the new items for a dict, a list of the new elements
    otherwise. The constructor is tried with one iterable and, for tuples, with one
    argument per element (namedtuples first that way); a result that does not hold
    exactly ``contents`` (a constructor that reads its arguments its own way) is not
    taken. A dict, list or set whose constructor fails (``defaultdict``'s factory)
    is copied, then refilled — never the live value. None where no way works. A
    subclass instance's attributes (its ``__dict__``) are set on the new one, and a
    struct sequence (``os.stat_result``) keeps the fields its items do not show.

    >>> import collections
    >>> class Names(tuple): pass
    >>> Point = collections.namedtuple("Point", "x y")
    >>> rebuilt_container(Names(("ab",)), ["cd"]), rebuilt_container(Point(1, 2), [3, 4])
    (('cd',), Point(x=3, y=4))
    >>> rebuilt_container(collections.defaultdict(list, a=[1]), {"a": [2]})
    defaultdict(<class 'list'>, {'a': [2]})
    """
    kind = type(value)
    if kind in _CONTAINERS:
        return kind(contents)
    rebuilt = _rebuilt_subclass(value, contents)
    state = getattr(value, "__dict__", None)
    if state and rebuilt is not None and state is not value:  # (not an AttrDict's own items)
        # As the value has them (shallow, as copy.copy's), except where its constructor set
        # one of the new items: a ModelOutput's fields, copies the live ones must not replace.
        made = rebuilt.__dict__
        items = {id(item) for item in (contents.values() if isinstance(contents, dict) else contents)}
        made.update({name: attr for name, attr in state.items() if id(made.get(name, attr)) not in items})
    return rebuilt


def _rebuilt_subclass(value: Any, contents: Any) -> Any:
    kind = type(value)
    if isinstance(value, dict):
        try:
            rebuilt = kind(contents)
        except Exception as error:
            if raised_by_signal_handler(error):  # the program's own (a timeout's), not a constructor's
                raise
            rebuilt = None
        # Taken where it holds exactly the new items (dict's own view: no subclass's
        # __getitem__); a constructor that reads its first argument its own way
        # (Meta(source, **items)) gives something else.
        if (
            rebuilt is not None
            and dict.__len__(rebuilt) == len(contents)
            and all([dict.get(rebuilt, k, _MISSING) is v for k, v in contents.items()])
        ):
            return rebuilt
        refilled = _copy_module.copy(value)
        refilled.update(contents)
        return refilled
    forms: Tuple[str, ...] = ("iterable", "arguments")
    if isinstance(getattr(kind, "n_sequence_fields", None), int):
        # A struct sequence: its constructor takes the fields that are not items (the
        # numbers and strings behind os.stat_result's st_mtime_ns) as a dict, which
        # its __reduce__ gives.
        forms = ("struct sequence",)
    elif hasattr(value, "_fields"):
        forms = ("arguments", "iterable")
    elif not isinstance(value, tuple):
        forms = ("iterable",)
    for form in forms:
        try:
            if form == "struct sequence":
                rebuilt = kind(contents, value.__reduce__()[1][1])
            else:
                rebuilt = kind(contents) if form == "iterable" else kind(*contents)
        except Exception as error:
            if raised_by_signal_handler(error):
                raise
            continue
        if isinstance(rebuilt, (set, frozenset)):  # no order to compare: its constructor took them
            return rebuilt
        if len(rebuilt) == len(contents) and all([a is b for a, b in zip(rebuilt, contents, strict=True)]):
            return rebuilt
    if isinstance(value, list):
        same_list = _copy_module.copy(value)
        same_list[:] = contents
        return same_list
    if isinstance(value, set):
        same_set = _copy_module.copy(value)
        same_set.clear()
        same_set.update(contents)
        return same_set
    return None


def _container_copier(policy: str) -> Copier:
    def fallback(value: Any, contents: Any) -> Any:
        unchanged = all([a is b for a, b in zip(contents, value, strict=True)])
        if unchanged and isinstance(value, (tuple, frozenset)):
            return value  # nothing in it to copy, and no way to make one (sys.float_info)
        if policy == "detach" and _holds_its_own(contents, value):
            return value  # nothing in it detached, only rebuilt: as it is (its class takes no items)
        return _copy_module.deepcopy(value)

    copy_item = functools.partial(copy_value, policy=policy)

    def rebuild(value: Any, made: Dict[int, Tuple[Any, Any]]) -> Any:
        return copied_container(value, lambda item: copied_once(item, copy_item, made), made, fallback)

    return _one_copy(rebuild)


def _holds_its_own(contents: Any, value: Any) -> bool:
    """Whether ``contents``, container ``value``'s items as ``'detach'`` copied them (a dict of
    them for a dict, a list otherwise), are its own: each item, or a container rebuilt around
    that item's own.

    >>> inner = [1]
    >>> _holds_its_own([[1], "a"], (inner, "a")), _holds_its_own([[2]], (inner,))
    (True, False)
    """
    pairs = _paired(contents, value)
    met: Set[int] = set()
    while pairs:
        copied, original = pairs.pop()
        if copied is original or id(original) in met:
            continue
        met.add(id(original))  # (a container that holds itself: compared once)
        if type(copied) is not type(original):
            return False
        if isinstance(original, _CONTAINERS):
            more = _paired(copied, original)
        elif dataclasses.is_dataclass(original):  # ('detach' rebuilds one around its fields' copies)
            more = _fields_paired(copied, original)
        else:
            return False
        if more is None:
            return False
        pairs += more
    return True


def _fields_paired(copied: Any, original: Any) -> Optional[List[Tuple[Any, Any]]]:
    """Dataclass ``original``'s fields, each beside its copy's (None: one is set in one alone).

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Cfg:
    ...     lr: list
    >>> _fields_paired(Cfg([2]), Cfg([1]))
    [([2], [1])]
    """
    pairs = []
    for item in dataclasses.fields(original):
        mine, theirs = getattr(copied, item.name, _MISSING), getattr(original, item.name, _MISSING)
        if (mine is _MISSING) != (theirs is _MISSING):
            return None
        pairs.append((mine, theirs))
    return pairs


def _paired(contents: Any, value: Any) -> Optional[List[Tuple[Any, Any]]]:
    """Container ``value``'s items, each beside its counterpart in ``contents`` (None: they differ)."""
    if len(contents) != len(value):
        return None
    if isinstance(value, dict):
        if contents.keys() != value.keys():
            return None
        return [(contents[key], item) for key, item in value.items()]
    if isinstance(value, (set, frozenset)):
        # No order to pair their items by: the same items (hashable) compare equal.
        return [] if set(contents) == value else None
    return list(zip(contents, value, strict=True))


def copied_container(
    value: Any,
    copy_item: Callable[[Any], Any],
    made: Dict[int, Tuple[Any, Any]],
    fallback: Callable[[Any, Any], Any],
) -> Any:
    """A copy of the dict, list, set or tuple ``value`` (or a subclass's) with ``copy_item`` of each item.

    ``made`` maps ``id(original)`` to ``(original, copy)`` for what was copied so far in
    one copy of a value (as :func:`copied_dataclass`'s): a container met twice is copied
    once, and a list or dict that holds itself holds its copy, as ``copy.deepcopy``
    keeps them. The copy is :func:`rebuilt_container`'s; where it has no way,
    ``fallback(value, contents)`` makes it.

    >>> loop = [1]; loop.append(loop)
    >>> made = {}
    >>> def copy(item): return copied_container(item, copy, made, None) if type(item) is list else item
    >>> copied = copy(loop)
    >>> copied is not loop, copied[1] is copied
    (True, True)
    """
    earlier = made.get(id(value))
    if earlier is not None and earlier[0] is value:
        if type(earlier[1]) is _Unfinished:  # a list or dict subclass met among its own items
            shell = earlier[1].shell()
            if shell is not None:
                return shell
        else:
            return earlier[1]
    kind = type(value)
    if kind is list or kind is dict:
        # Made empty and registered first, so that an item reaching it again gets this copy.
        copied: Any = kind()
        made[id(value)] = (value, copied)
        if kind is list:
            copied.extend([copy_item(item) for item in value])
        else:
            copied.update({key: copy_item(item) for key, item in value.items()})
        return copied
    unfinished = None
    if isinstance(value, (list, dict)) and earlier is None:
        # Its copy is made from its copied items; one of them reaching it again (an
        # OrderedDict holding itself) gets an empty copy made then, filled here after.
        unfinished = _Unfinished(value)
        made[id(value)] = (value, unfinished)
    if isinstance(value, dict):
        contents: Any = {key: copy_item(item) for key, item in value.items()}
    else:
        contents = [copy_item(item) for item in value]
    if unfinished is not None and unfinished.made is not None:
        rebuilt = unfinished.made
        if isinstance(rebuilt, dict):  # (its own methods: an OrderedDict keeps its order apart)
            rebuilt.clear()  # (a copy.copy of a defaultdict: the live items)
            rebuilt.update(contents)
        else:
            rebuilt[:] = contents
        made[id(value)] = (value, rebuilt)
        return rebuilt
    earlier = made.get(id(value))  # a tuple met again among its own items (through a list)
    if earlier is not None and earlier[0] is value and type(earlier[1]) is not _Unfinished:
        return earlier[1]
    rebuilt = rebuilt_container(value, contents)
    if rebuilt is None:
        rebuilt = fallback(value, contents)
    made[id(value)] = (value, rebuilt)
    return rebuilt


class _Unfinished:
    """The place in ``made`` of a list or dict subclass whose items are being copied."""

    __slots__ = ("value", "made", "tried")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.made: Any = None
        self.tried = False

    def shell(self) -> Any:
        """Its copy, empty until its items are copied (None where none can be made)."""
        if not self.tried:
            self.tried = True
            self.made = rebuilt_container(self.value, {} if isinstance(self.value, dict) else [])
        return self.made


def shallow_copy(value: T) -> T:
    """``copy.copy(value)``, a new object also where the value's ``__copy__`` returns itself.

    A frozen dataclass may say so (it cannot change), while the tensors or lists it holds
    can: a recorded copy needs an object of its own to hold their copies. An enum member
    and an object that ``object.__new__`` cannot make (a C base) are the value itself.

    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Out:
    ...     items: list
    ...     def __copy__(self):
    ...         return self
    >>> out = Out([1])
    >>> copied = shallow_copy(out)
    >>> copied is not out, copied.items is out.items
    (True, True)
    """
    copied = _copy_module.copy(value)
    if copied is not value or isinstance(value, enum.Enum):  # (a member is itself: one of a kind)
        return copied
    try:
        copied = object.__new__(type(value))
    except TypeError:  # a class of a C base (an Exception's): it stays the value itself
        return value
    state = getattr(value, "__dict__", None)
    if state is not None:
        copied.__dict__.update(state)  # (not through __setattr__: a frozen one's too)
    for kind in type(value).__mro__:  # slots, a base class's too
        slots = kind.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name.startswith("__") and not name.endswith("__"):  # a private one: mangled
                name = f"_{kind.__name__.lstrip('_')}{name}"
            if name not in ("__dict__", "__weakref__") and hasattr(value, name):
                object.__setattr__(copied, name, getattr(value, name))
    return copied


#: The copies made so far in the one value being copied in this thread, by id, with their
#: originals (kept alive, so that no id is reused meanwhile): a tree with parent links, a
#: list holding itself or a list met twice is copied with its links, each object once.
_copies = threading.local()


def _one_copy(copy: Callable[[Any, Dict[int, Tuple[Any, Any]]], Any]) -> Copier:
    """``copy(value, made)`` with the ``made`` of the value being copied (a new one at the top)."""

    def run(value: Any) -> Any:
        made: Optional[Dict[int, Tuple[Any, Any]]] = getattr(_copies, "made", None)
        if made is not None:
            return copy(value, made)
        _copies.made = made = {}
        try:  # (too deep to copy: a RecursionError, reported; never the live value)
            return copy(value, made)
        finally:
            _copies.made = None

    return run


def _dataclass_copier(policy: str) -> Copier:
    copy_item = functools.partial(copy_value, policy=policy)
    return _one_copy(
        lambda value, made: copied_dataclass(value, lambda item: copied_once(item, copy_item, made), made)
    )


def copied_once(item: Any, copy: Callable[[Any], Any], made: Dict[int, Tuple[Any, Any]]) -> Any:
    """``copy(item)``, or the copy of ``item`` already made in the value being copied (``made``).

    An item met twice in one value (an array, a tensor: ``[a, a]``) is copied once, as
    ``copy.deepcopy`` keeps it: the copy holds one copy twice, not two.

    >>> items = [[1]]
    >>> made = {}
    >>> first, again = (copied_once(item, list, made) for item in items * 2)
    >>> first is again, first is items[0]
    (True, False)
    """
    earlier = made.get(id(item))
    if earlier is not None and earlier[0] is item and type(earlier[1]) is not _Unfinished:
        return earlier[1]
    copied = copy(item)
    if copied is not item and id(item) not in made:  # (a container registers itself)
        made[id(item)] = (item, copied)
    return copied


def copied_dataclass(value: Any, copy_field: Callable[[Any], Any], made: Dict[int, Tuple[Any, Any]]) -> Any:
    """A copy of the dataclass ``value`` (:func:`shallow_copy`) with ``copy_field`` of each field.

    ``made`` maps ``id(original)`` to ``(original, copy)`` for the dataclasses copied so
    far in one copy of a value, the originals kept so that no id is reused meanwhile:
    ``copy_field`` passes it on, so an object met twice (a tree with parent links) is
    copied once and the links are kept. A field not set yet (``field(init=False)``) is
    skipped; fields are set through ``object.__setattr__``, a frozen dataclass's too (on
    the copy only). An enum member is itself.

    >>> import dataclasses
    >>> @dataclasses.dataclass
    ... class Pair:
    ...     left: list
    ...     right: list
    >>> pair = Pair([1], [2])
    >>> copied = copied_dataclass(pair, list, {})
    >>> copied == pair, copied.left is pair.left
    (True, False)
    """
    earlier = made.get(id(value))
    if earlier is not None and earlier[0] is value:
        return earlier[1]
    copied = shallow_copy(value)
    if copied is value:  # (an enum member): never changed through its copy
        return value
    made[id(value)] = (value, copied)
    own = getattr(value, "__dict__", None)
    for item in dataclasses.fields(value):
        if own is not None and item.name not in own and not _data_descriptor(type(value), item.name):
            continue  # not set yet (at __init__'s entry): getattr gives the class's default
        try:
            content = getattr(value, item.name)
        except AttributeError:  # field(init=False) not set yet
            continue
        object.__setattr__(copied, item.name, copy_field(content))
    return copied


def _data_descriptor(cls: type, name: str) -> bool:
    """Whether ``cls.<name>`` is a data descriptor (a slot, a property, a ``__set__`` of its own),
    which holds an instance's value outside its ``__dict__``; not a class's default value.

    >>> class A:
    ...     __slots__ = ("x",)
    ...     y = 1
    >>> _data_descriptor(A, "x"), _data_descriptor(A, "y"), _data_descriptor(A, "z")
    (True, False, False)
    """
    found = inspect.getattr_static(cls, name, None)
    return found is not None and hasattr(type(found), "__set__")


#: Plug-ins that register copies for a library's classes: the library's top-level package ->
#: the module to import the first time a value of one of its classes is copied. The layers
#: above the core register theirs (:func:`register_plugin`): the core names none of them.
_PLUGINS: Dict[str, str] = {}
#: The libraries of plug-ins to load as soon as a recording is entered where the program has
#: imported the library (each tried once; see :func:`register_plugin`). A tuple, replaced
#: whole: entries iterate it while another thread drops one.
_load_at_entry: Tuple[str, ...] = ()


def register_plugin(library: str, module: str, at_entry: bool = False) -> None:
    """Import ``module`` the first time a value of a class from ``library`` is copied.

    ``library`` is a top-level package name; ``module`` registers copies for its classes
    (:func:`register_copy`) when imported. With ``at_entry``, it is imported as soon as a
    recording is entered where the program has imported ``library``: what it sets up then
    holds from the first value (the torch layer's probes skip torch.compile's tracing; at
    the first tensor a probe met inside compiled code, Dynamo had traced into them).
    ``bcrecord`` registers its own layers' plug-ins this way, so that the core never
    imports them.

    >>> register_plugin("nosuchlib", "nosuchlib_bcrecord_copies")
    >>> _PLUGINS.pop("nosuchlib")
    'nosuchlib_bcrecord_copies'
    """
    global _load_at_entry
    _PLUGINS[library] = module
    if at_entry and library not in _load_at_entry:
        _load_at_entry = (*_load_at_entry, library)


def _plugins_at_entry() -> None:
    """Load the plug-ins registered ``at_entry`` whose library the program has imported. Not
    while the library is being imported (another thread), nor where ``sys.modules`` holds
    another thing under its name (``None``, to keep it out); a plug-in that fails to import
    is left to the first value of its library, whose copy says why."""
    global _load_at_entry
    for library in _load_at_entry:
        held = sys.modules.get(library)
        if not isinstance(held, types.ModuleType):
            continue
        if getattr(getattr(held, "__spec__", None), "_initializing", False):
            continue
        # (once: a plug-in that fails to import would cost each entry its import)
        _load_at_entry = tuple(other for other in _load_at_entry if other != library)
        module = _PLUGINS.get(library)
        if module is None:  # (loaded meanwhile, by the first value of its library)
            continue
        try:
            importlib.import_module(module)
        except Exception:  # (its import fails at the first value too, where a recording says so)
            continue
        _PLUGINS.pop(library, None)


def load_plugin(cls: type) -> None:
    """Import the plug-in that registers copies for ``cls``'s library, the first time one is met;
    or a base class's (a cache class of a model's own code, a subclass of transformers' ``Cache``).

    >>> load_plugin(int)  # (no plug-in for the standard library: nothing to do)
    """
    for klass in cls.__mro__ if _PLUGINS else ():
        plugin = _PLUGINS.pop(str(klass.__module__).partition(".")[0], None)
        if plugin is not None:
            importlib.import_module(plugin)


def _find_copier(policy: Any, cls: type) -> Optional[Copier]:
    if callable(policy):
        # A policy may name a cheaper copier per type (the torch layer's, for tensors).
        for_type = getattr(policy, "copier_for", None)
        return policy if for_type is None else for_type(cls)  # type: ignore[no-any-return]
    load_plugin(cls)
    for klass in cls.__mro__:
        found = _registered.get((policy, klass))
        if found is not None:
            return found
    if policy == "none" or issubclass(cls, _ATOMIC):
        return None
    if policy == "deepcopy":
        if issubclass(cls, _CONTAINERS) or dataclasses.is_dataclass(cls):
            return _deepcopy_after_plugins
        return _copy_module.deepcopy
    if issubclass(cls, _CONTAINERS):
        return _container_copier(policy)
    # A tensor-like has both; other objects' .detach() ends something (a file's buffer,
    # a weakref.finalize), never called for them.
    method = "clone" if policy == "clone" else "detach"
    if callable(getattr(cls, "clone", None)) and callable(getattr(cls, method, None)):
        return _method_copier(method, policy)
    if dataclasses.is_dataclass(cls):  # a model's output object: each field as it would be alone
        return _dataclass_copier(policy)
    if policy == "clone" and _copied_by_method(cls):
        bases = _named_bases(cls)
        if ("pandas", "Index") in bases:
            return _pandas_index_copy
        return _pandas_frame_copy if ("pandas", "NDFrame") in bases else _array_copier(policy)
    return None


def _deepcopy_after_plugins(value: Any) -> Any:
    """``copy.deepcopy(value)``, a list, tuple, dict, set or dataclass, once the plug-ins of the
    classes in it are loaded (:func:`load_plugin`): copied then as they register, a tensor in a
    list as the torch layer copies one under ``'deepcopy'`` (detached), as one alone is.

    >>> _deepcopy_after_plugins([1, {"a": [2]}])
    [1, {'a': [2]}]
    """
    if _PLUGINS:
        plugins = len(_PLUGINS)
        # (One class's plug-in is looked for once: a list of 100,000 floats looked up item by
        # item made its copy 8 times as slow as copy.deepcopy alone.)
        for cls in {type(item) for item in reachable(value)}:
            load_plugin(cls)
        if len(_PLUGINS) < plugins:  # (one registered its copies: this value's may be among them)
            return copy_value(value, "deepcopy")
    return deepcopy_as_registered(value)


def deepcopy_as_registered(value: Any) -> Any:
    """``copy.deepcopy(value)``, but each object in it (through lists, tuples, sets, dicts and
    dataclasses) whose class has a copier of its own under ``'deepcopy'``
    (:func:`register_copy`) copied by that copier, as one alone is (an object met twice, once).

    >>> class Handle:
    ...     def __init__(self, v): self.v = v
    ...     def __deepcopy__(self, memo): raise TypeError("no deep copy")
    >>> register_copy(Handle, "deepcopy", lambda h: Handle(h.v))
    >>> copied = deepcopy_as_registered({"k": [Handle(1)]})
    >>> copied["k"][0].v
    1
    >>> _unregister_copy(Handle, "deepcopy")  # (this example's class: no walk for later values)
    """
    # Given in deepcopy's memo: it takes each of them where it meets it (by id), shared ones too.
    memo: Dict[int, Any] = {}
    if _nested_deepcopies:  # (none, mostly: no walk)
        for item in reachable(value):
            copier = _own_deepcopy(type(item)) if item is not value else None
            if copier is not None:
                memo[id(item)] = copier(item)
    return _copy_module.deepcopy(value, memo)


#: The classes whose copier under 'deepcopy' copies them inside containers too (deepcopy_as_registered).
_nested_deepcopies: Dict[type, Copier] = {}
#: Copiers for 'deepcopy' that copy a value alone only, by id (see deepcopy_alone; held: ids stay theirs).
_ALONE: Dict[int, Any] = {}


def deepcopy_alone(copier: Copier) -> Copier:
    """Mark ``copier``, to be registered for ``'deepcopy'``, as one for a value alone: inside a
    container, ``copy.deepcopy`` copies such values. The torch layer's tensor copy is one:
    given to deepcopy's memo, it would be the copy of a module's parameter too, a tensor in a
    copy of the module where a ``Parameter`` was. Returns ``copier``.

    >>> deepcopy_alone(len) is len
    True
    """
    _ALONE[id(copier)] = copier
    return copier


def _own_deepcopy(cls: type) -> Optional[Copier]:
    """The copier :func:`register_copy` gave ``cls`` or a base class under ``'deepcopy'``, for
    values inside containers too (not ``object``'s, nor one for values alone)."""
    for klass in cls.__mro__[:-1]:
        copier = _nested_deepcopies.get(klass)
        if copier is not None:
            return copier
    return None


def reachable(value: Any) -> Iterator[Any]:
    """``value`` and each object in it, through lists, tuples, sets, deques, dicts' values and
    dataclasses' fields, once each (a container that holds itself too); numbers and strings,
    which hold nothing, left out.

    >>> [type(item).__name__ for item in reachable([1, "a", {"k": (2.0, [3])}])]
    ['list', 'dict', 'tuple', 'list']
    """
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if isinstance(item, _ATOMIC) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        if isinstance(item, (list, tuple, set, frozenset, deque)):
            pending.extend(reversed(item) if isinstance(item, (list, tuple, deque)) else item)
        elif isinstance(item, dict):
            pending.extend(reversed(list(item.values())))
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            pending.extend(getattr(item, f.name, None) for f in reversed(dataclasses.fields(item)))


#: Bases, as (package, class name), of the arrays and frames whose ``copy()`` copies their data:
#: numpy's arrays and scalars and pandas' frames, series, indexes and extension arrays, their
#: subclasses included (a masked array, a recarray, a ``memmap``, a program's own ndarray subclass).
_COPIED_BY_METHOD = {
    ("numpy", "ndarray"),
    ("numpy", "generic"),
    ("numpy", "flatiter"),  # (``a.flat``: its copy is an array of the items)
    ("numpy", "nditer"),
    ("pandas", "NDFrame"),
    ("pandas", "Index"),
    ("pandas", "ExtensionArray"),
}


def _named_bases(cls: type) -> Set[Tuple[str, str]]:
    """``cls`` and its bases as (package, class name): numpy's and pandas' are known by name, the
    core imports neither.

    >>> sorted(_named_bases(bool))
    [('builtins', 'bool'), ('builtins', 'int'), ('builtins', 'object')]
    """
    return {(str(klass.__module__).partition(".")[0], klass.__name__) for klass in cls.__mro__}


def _copied_by_method(cls: type) -> bool:
    """Whether ``cls`` is one of :data:`_COPIED_BY_METHOD`'s."""
    return not _named_bases(cls).isdisjoint(_COPIED_BY_METHOD) and callable(getattr(cls, "copy", None))


# pandas' deep copy of a frame keeps its index, and an index's ``copy()`` shares its data,
# which may be a numpy array the program writes to later: ``pd.DataFrame(data, index=keys)``
# holds ``keys`` itself, and ``keys[0] = 99`` would change the recorded frame. So their
# axes are copied too. (The items of an ``object`` index or column are kept, as pandas'
# copies keep them.)


def _pandas_index_copy(index: Any) -> Any:
    """A pandas index's copy, its data copied."""
    return index.copy(deep=True)


def _pandas_frame_copy(frame: Any) -> Any:
    """A pandas frame's or series' deep copy, its index's (and columns') data copied too."""
    copied = frame.copy(deep=True)
    copied.index = frame.index.copy(deep=True)
    if frame.ndim == 2:  # (not getattr(frame, "columns"): a series' item may be named so)
        copied.columns = frame.columns.copy(deep=True)
    return copied


def _array_copier(policy: str) -> Copier:
    """``value.copy()``; in a numpy array of Python objects, each object copied under ``policy`` too
    (the array's ``copy()`` keeps them: a list in it, appended to later, would change), as a list's;
    so too in a structured array's object fields and in ``a.flat`` of such an array."""
    copy_item = functools.partial(copy_value, policy=policy)

    def copy_objects(original: Any, copied: Any, made: Dict[int, Tuple[Any, Any]]) -> None:
        """Copy the objects ``original`` (a plain ndarray) holds into ``copied``, its copy."""
        if original.dtype.names is not None:  # a structured array: each field holding objects
            for name in original.dtype.names:
                if original.dtype.fields[name][0].hasobject:
                    copy_objects(original[name], copied[name], made)
            return
        # A view of the copy where it is contiguous; a field of a structured copy is strided,
        # and reshaping it would copy it: its items are set by their index.
        flat = copied.reshape(-1) if copied.flags.c_contiguous else None
        for position, item in enumerate(original.flat):  # (in C order, as the index is read)
            item_copy = copied_once(item, copy_item, made)
            if item_copy is item:
                continue
            if flat is not None:
                flat[position] = item_copy
            else:
                copied[_c_index(position, copied.shape)] = item_copy

    def copy_items(value: Any, made: Dict[int, Tuple[Any, Any]]) -> Any:
        copied = value.copy()
        made[id(value)] = (value, copied)  # before its items: one holding it (or itself) gets this copy
        if type(value).__name__ == "flatiter":  # (its copy is an array of the items)
            copy_objects(value.base.reshape(-1), copied, made)
            return copied
        ndarray = [k for k in type(value).__mro__ if k.__name__ == "ndarray"][0]
        copy_objects(value.view(ndarray), copied.view(ndarray), made)  # (a masked array's data too)
        return copied

    with_items = _one_copy(copy_items)

    def copy(value: Any) -> Any:
        array = value.base if type(value).__name__ == "flatiter" else value  # (a.flat has no dtype)
        # (Not a pandas object column: pandas' copies keep its items.)
        if getattr(getattr(array, "dtype", None), "hasobject", False) and any(
            k.__name__ == "ndarray" for k in type(array).__mro__
        ):
            return with_items(value)
        return value.copy()

    return copy


def _c_index(position: int, shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """The index of item ``position`` of an array of ``shape``, counted in C order.

    >>> _c_index(5, (2, 3)), _c_index(0, ())
    ((1, 2), ())
    """
    index = []
    for extent in reversed(shape):
        position, at = divmod(position, extent)
        index.append(at)
    return tuple(reversed(index))


def copy_value(value: T, policy: str) -> T:
    """Copy ``value`` the way recordings do under ``policy``.

    >>> import bcrecord
    >>> data = [1, [2]]
    >>> copied = bcrecord.copy_value(data, "clone")
    >>> data[1].append(3); copied
    [1, [2]]
    """
    try:
        table = _copier_cache[policy]
    except (KeyError, TypeError):  # (TypeError: an unhashable policy)
        _known_policy(policy)
        raise
    kind = type(value)
    try:
        copier = table[kind]
    except KeyError:
        copier = _copier_into(table, policy, kind)
    return value if copier is None else copier(value)


def _copier_into(table: Dict[type, Optional[Copier]], policy: Any, kind: type) -> Optional[Copier]:
    """The copier of ``kind``'s values under ``policy``, found and kept in ``table`` (bounded)."""
    if len(table) >= _COPIERS_HELD:
        table.clear()
    return table.setdefault(kind, _guarded(_find_copier(policy, kind), kind))


#: (copier, exact type) pairs whose copies run no Python code a probe could be in.
_RUNS_NO_PYTHON: Set[Tuple[Any, type]] = set()


def copies_without_python(copier: Copier, *classes: type) -> None:
    """Say that ``copier`` runs no patched Python code on values of exactly ``classes``.

    Such copies need not be run :func:`silently`, which costs a few hundred
    nanoseconds a value; the torch layer says so of its tensor copies.

    >>> class Point:
    ...     def __init__(self, x): self.x = x
    >>> def copy_point(p): return Point(p.x)
    >>> register_copy(Point, "clone", copy_point); copies_without_python(copy_point, Point)
    >>> copy_value(Point(2), "clone").x
    2
    """
    _RUNS_NO_PYTHON.update((copier, cls) for cls in classes)
    for table in _copier_cache.values():
        table.clear()


def _guarded(copier: Optional[Copier], cls: type) -> Optional[Copier]:
    """``copier``, run :func:`silently` unless it runs no Python code on ``cls`` values."""
    if copier is None:
        return copier
    try:
        without_python = (copier, cls) in _RUNS_NO_PYTHON
    except TypeError:  # an unhashable copier (a callable dataclass instance) was never said to be one
        without_python = False
    return copier if without_python else functools.partial(silently, copier)


# --- recordings --------------------------------------------------------------


class _Mute:
    """A site's item in silent sinks: drops every value."""

    __slots__ = ()

    def append(self, value: Any) -> None:
        pass

    def deliver(self, value: Any, instance: Any) -> None:
        pass


_MUTE = _Mute()


class _Silent:
    """The sinks probes find while a recorded value is being copied (see :func:`silently`).

    Item 0 is still the context's routing: the recordings entered stay what they are.
    """

    __slots__ = ("routing",)

    def __init__(self, routing: _Routing) -> None:
        self.routing = weakref.ref(routing)  # (a routing is freed with its sinks list)

    def __getitem__(self, site_id: int) -> Any:
        return self.routing() if site_id == 0 else _MUTE


def silently(function: Callable[[T], Any], value: T) -> Any:
    """``function(value)`` with this context's probes recording nothing.

    What copies a recorded value (a copier, a ``reduce``, a chain read) may run
    patched code: a patched ``clone()``, ``__deepcopy__`` or property. Its values
    are not the program's, and copying them would call it again, without end.

    >>> import bcrecord
    >>> def double(x):
    ...     y = 2 * x
    ...     return y
    >>> patched = bcrecord.instrument(double, ["y"], name="demo")
    >>> with bcrecord.recording() as rec:
    ...     bcrecord.runtime.silently(patched, 1), patched(2)
    (2, 4)
    >>> rec.all("demo:double:y@0")
    [4]
    """
    # In a copy of the context, never by set and reset in this one: an exception a signal
    # handler raises between the two (a timeout) would leave this context silenced for good.
    context = contextvars.copy_context()
    context.run(_context.set, _context.get()[0].silent)
    return context.run(function, value)


def silence() -> Callable[[], None]:
    """Silence this context's probes now; call the function returned to end it (once).

    For work that spans frames, where :func:`silently` cannot wrap one call: the
    command line's runner keeps its own set-up quiet until the program's code starts.

    >>> import bcrecord
    >>> square = bcrecord.instrument(lambda v: v * v, ["return"], name="sq")
    >>> with bcrecord.recording() as rec:
    ...     end = bcrecord.runtime.silence()
    ...     _ = square(2)
    ...     end(); end()  # the second call does nothing
    ...     _ = square(3)
    >>> rec.all("sq:<lambda>:return")
    [9]
    """
    token: Optional[contextvars.Token] = _context.set(_context.get()[0].silent)

    def end() -> None:
        nonlocal token
        if token is not None:
            _context.reset(token)
            token = None

    return end


class Sink:
    """Where one site's values go in one recording: read the chain, copy, store.

    ``append`` is what a probe calls; it never raises an ``Exception`` of its own
    into the patched function (failures go to :attr:`Recording.errors`), only what a
    signal handler raised meanwhile (see :func:`raised_by_signal_handler`).
    """

    __slots__ = ("rec", "key", "store", "policy", "chain", "copiers")

    def __init__(
        self, rec: Recording, key: str, store: Callable[[Any], None], policy: Any, chain: Tuple[str, ...] = ()
    ) -> None:
        self.rec = rec
        self.key = key
        self.store = store
        self.policy = policy
        self.chain = chain
        #: type -> copier (None: keep the value itself), shared per policy name.
        self.copiers: Dict[type, Optional[Copier]] = {} if callable(policy) else _copier_cache[policy]

    def with_store(self, store: Callable[[Any], None]) -> Sink:
        """The same sink storing through ``store``.

        >>> kept = []
        >>> sink = Sink(recording(), "f:x@0", print, "none").with_store(kept.append)
        >>> sink.append(3); kept
        [3]
        """
        return Sink(self.rec, self.key, store, self.policy, self.chain)

    def direct(self) -> Any:
        """What a probe appends to: the list of values itself when nothing is copied.

        >>> values = []
        >>> Sink(recording(), "f:x@0", values.append, "none").direct() is values
        True
        >>> Sink(recording(), "f:x@0", values.append, "clone").direct()
        <Sink f:x@0 copy='clone'>
        """
        container: Any = getattr(self.store, "__self__", None)
        if (
            self.policy == "none"
            and not self.chain
            and type(container) in (list, deque)
            and self.store == container.append
            and not any([policy == "none" for policy, _ in _registered])
        ):
            return container
        return self

    def append(self, value: Any) -> None:
        """Read the chain, copy and store ``value``; a failure goes to the recording's errors.

        >>> rec, kept = recording(), []
        >>> sink = Sink(rec, "f:x@0", kept.append, "clone", chain=("real",))
        >>> sink.append(2 + 3j); sink.append("no attribute real")
        >>> kept, [(error.key, type(error.error).__name__) for error in rec.errors]
        ([2.0], [('f:x@0', 'AttributeError')])
        """
        try:
            if self.chain:
                value = silently(self._read, value)
            kind = type(value)
            copier: Any = self.copiers.get(kind, _MISSING)
            if copier is _MISSING:
                copier = _copier_into(self.copiers, self.policy, kind)
            self.store(value if copier is None else copier(value))
        except Exception as error:  # a probe must never raise into user code
            signalled = False
            try:
                signalled = raised_by_signal_handler(error)
                if not signalled:
                    self.rec._fail(self.key, error)
            except Exception as reporting:
                # Reporting failed too: at the recursion limit it needs frames, and
                # warnings turned into errors raise here. Never into user code, but for
                # what a signal handler raised meanwhile (a failing copy's time is mostly
                # spent here, formatting its traceback).
                try:
                    signalled = raised_by_signal_handler(reporting)
                except Exception:
                    pass
                if signalled:
                    raise  # (``reporting``: the program's own)
            if signalled:
                raise  # the program's own (a timeout's), not a failed copy

    def _read(self, value: Any) -> Any:
        return _read_chain(value, self.chain)

    def __repr__(self) -> str:
        return f"<Sink {self.key} copy={self.policy!r}>"


_shared: Tuple[Recording, ...] = ()
#: The sinks of contexts with no recording of their own: the threads='all' recordings'.
_default_routing = _Routing((), (), DEFAULT_SINKS)
_context = SINKS

#: bcrecord's own context variables, each with its default: the state of the recordings of a
#: context, which :func:`carry` hands on (see :func:`carried_variable`).
_carried_variables: Dict[contextvars.ContextVar[Any], Any] = {}


def carried_variable(var: contextvars.ContextVar[T]) -> contextvars.ContextVar[T]:
    """Register ``var`` (one with a default) as part of the recordings' state, which
    :func:`carry` hands on to the functions it wraps; returns ``var``.

    >>> import contextvars
    >>> stopping = carried_variable(contextvars.ContextVar("bcrecord_example", default=False))
    >>> _carried_variables[stopping]
    False
    """
    _carried_variables[var] = contextvars.Context().run(var.get)
    return var


carried_variable(_context)
_MISSING = object()
_NO_INSTANCE = object()
#: What a recording's :meth:`Recording.__enter__` holds until it has armed its patches.
_NOT_ARMED = object()
#: Held while a recording's entry or exit is claimed (see :meth:`Recording.__enter__`);
#: re-entrant: a finalizer that leaves a recording may run while it is held.
_entering_lock = safe_over_forks(threading.RLock())
Keep = Union[str, int]


def _sinks_of(own: Tuple[Recording, ...]) -> List[Any]:
    """A sinks list for a context whose own recordings are ``own``."""
    return _Routing(own, own).sinks if own else _default_routing.sinks


def _own_before(token: contextvars.Token) -> Optional[Tuple[Recording, ...]]:
    """The own recordings of the context before the ``_context.set`` that made ``token``."""
    sinks = token.old_value
    if sinks is contextvars.Token.MISSING:
        sinks = DEFAULT_SINKS
    routing = sinks[0]
    return None if routing is None else routing.own


def _set_shared(recordings: Tuple[Recording, ...]) -> None:
    global _shared
    with _sites_lock:
        _shared = recordings
        for routing in (_default_routing, *_ownerless.live()):
            routing.recordings = recordings
            routing.reset()


class Recording:
    """Values recorded while this recording was active, by key.

    Use :func:`recording` to make one. Keys look like
    ``'<owner>:<function>:<target>'``: ``'Model:forward:x@1'`` for the second
    assignment of local ``x``, ``'Model:forward:self.fc.weight'`` for an attribute
    read at entry, ``'Model:forward:self.fc@0'`` for its first load site, and
    ``'Model:forward:return'`` for the returned value.

    >>> import bcrecord
    >>> def f(a):
    ...     for i in range(a):
    ...         x = i * 10
    ...     return x
    >>> g = bcrecord.instrument(f, ["x"], name="m")
    >>> with bcrecord.recording(keep=2) as rec:
    ...     _ = g(4)
    >>> list(rec), rec["m:f:x@0"], rec.all("m:f:x@0")
    (['m:f:x@0'], 30, [20, 30])
    """

    #: Keep routes and cached sinks when leaving, to be entered again and again with
    #: its values emptied in between (:meth:`_empty`); freed by the cycle collector.
    _keeps_routes = False
    #: A copy (pickle, ``copy``) of a recording made with ``only``: its patches stayed behind.
    _copied_without_patches = False
    #: (A recording pickled by a bcrecord before this was noted: every armable is rearmed.)
    _arming: Optional[List[int]] = None
    #: Whether a thread is entering or leaving it now (see :meth:`__enter__`).
    _busy = False
    #: Whether it was ever entered: reading one never entered means a forgotten ``with``. (False
    #: from __init__; True here for a recording pickled before this was noted, empty and entered.)
    _entered_ever = True

    def __init__(
        self,
        copy: str = "clone",
        keep: Keep = "all",
        threads: str = "context",
        only: Optional[Iterable[Any]] = None,
    ) -> None:
        _known_policy(copy)
        maxlen = kept_length(keep)
        if threads not in ("context", "all"):
            raise SpecError(f"threads must be 'context' or 'all', got {threads!r}")
        self.copy = copy
        self.keep = keep
        self.threads = threads
        self._maxlen = maxlen
        self._data: Dict[str, Union[List[Any], Deque[Any]]] = {}
        patches = None if only is None else _patches_in(only)
        self._only = None if patches is None else {id(tag) for tag in patches}
        #: The patches of ``_only``, held: an id freed by its patch could name a new one.
        self._only_held: List[Any] = [] if patches is None else patches
        #: The ids of what arms their probes: entering and leaving rearm these alone (None: every armable).
        self._arming: Optional[List[int]] = None if patches is None else _arming_of(patches)
        #: The routing kept across passes (``_keeps_routes``), reused while the context matches.
        self._kept: Optional[_Routing] = None
        #: The patch ids this recording armed while active with ``only`` (see :meth:`_take`).
        self._armed_for: Optional[Set[int]] = None
        #: Whether this recording is counted among those active (:func:`_activate`), to count down.
        self._counted = False
        self._token: Optional[contextvars.Token] = None
        self._routing: Optional[_Routing] = None
        self._warned: set = set()
        #: The routings that deliver to this recording: also those of recordings entered
        #: after it in contexts copied from its own (a thread it carried, a task).
        self._included: _WeakRegistry[_Routing] = _WeakRegistry()
        #: Values that could not be recorded, in the order they failed (with ``keep=N``,
        #: each key's first failure and its last N).
        self.errors: List[RecordError] = []
        #: How many values of each key could not be recorded, all of them counted.
        self.failures: Dict[str, int] = {}
        self._entered_ever = False

    # context management ----------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether the recording is currently entered."""
        return self._token is not None

    def __enter__(self) -> Recording:
        claimed = False
        try:
            # Claimed under the lock (two threads entering one recording at once both went
            # in); refused outside it (a collection while making the error may run a
            # finalizer that leaves a recording).
            with _entering_lock:
                if self._token is None and not self._busy:
                    claimed = True  # (first: what a signal handler raises next leaves it unclaimed)
                    self._busy = True
            if not claimed:
                raise RuntimeError("this recording is already active; make a new one to nest")
            return self._enter()
        finally:
            if claimed:
                self._busy = False

    def _enter(self) -> Recording:
        for library in _load_at_entry:  # (usually none, or the torch layer's)
            if library in sys.modules:
                _plugins_at_entry()
                break
        if self._copied_without_patches:  # it would record nothing, silently
            raise RuntimeError(
                "this recording is a copy (pickled or copied) of one made with only=, whose patches "
                "a copy does not hold: it keeps the values; to record, enter a new recording(only=...)"
            )
        current = _context.get()
        outer = current[0].own
        routing = self._kept
        if isinstance(current, _Silent):
            # Entered while a value is copied (by a finalizer or a signal handler that ran
            # then): the recordings entered around the copy, silent, get none of its values.
            routing = _Routing(outer + (self,), (self,))
        elif routing is None or routing.own[:-1] != outer:
            if routing is not None:  # entered in another context: the old routing is done
                self._kept = None
                routing.retire()
            routing = _Routing(outer + (self,), outer + (self,))
            if self._keeps_routes:
                self._kept = routing
        self._routing = routing
        armed: Any = _NOT_ARMED
        try:
            self._token = _context.set(routing.sinks)
            with _arm_lock:  # not between activating and noting it (see _take)
                if self.threads == "all":
                    _set_shared(_shared + (self,))
                count = _active_count  # (under the lock: no other thread's change)
                try:
                    armed = self._armed_for = _activate(self._only, self._arming)
                except BaseException:
                    if _active_count != count:  # counted, then cut short on its way out
                        armed = None if self._only is None else set(self._only)
                    raise
                self._counted = True
        except BaseException:
            # Not entered, and none of it left (a with block does not leave what its __enter__
            # raised out of): a warning made an error while arming, or what a signal handler
            # raised on the way (a timeout's TimeoutError, a KeyboardInterrupt).
            self._not_entered(current, routing, armed)
            raise
        self._entered_ever = True
        return self

    def _not_entered(self, before: Any, routing: _Routing, armed: Any) -> None:
        """Undo an :meth:`__enter__` that raised: ``before``, the context's sinks it found;
        ``armed``, what :func:`_activate` returned, if it returned."""
        with _arm_lock:
            if armed is not _NOT_ARMED:
                self._armed_for, self._counted = None, False
                _deactivate(armed, self._arming)
            if self.threads == "all":
                _set_shared(_without(_shared, self))
        token, self._token, self._routing = self._token, None, None
        try:
            if token is None:
                raise ValueError  # (set, but interrupted before its token was kept)
            _context.reset(token)
        except ValueError:
            _context.set(before)
        if routing is not self._kept:
            routing.retire()

    def __exit__(self, *exc: object) -> None:
        if self._busy:  # being entered or left by another thread: not this exit's to end
            return
        token, self._token = self._token, None
        if token is None:
            return
        # Busy until it has left: another thread's entry meanwhile took the fields this exit
        # reads (its count, its routings) for its own, and the count went wrong. (No call
        # before the try: nothing can cut in between.)
        self._busy = True
        try:
            routing, self._routing = self._routing, None
            # Each step is taken even where one before it was cut short by what a signal handler
            # raised (a timeout's TimeoutError, a KeyboardInterrupt): the recording then leaves no
            # context delivering to it, nor its patches armed.
            left = False
            try:
                self._leave_context(token, routing)
                left = True
            finally:
                try:
                    with _sites_lock:
                        # A recording entered in a context copied from this one's (a carried thread,
                        # a task) made a routing that delivers to this one too: no more. (Its own, too,
                        # where leaving the context was cut short.)
                        for other in self._included.take():
                            delivers = _holds(other.recordings, self)
                            if (other is not routing or not left) and delivers:
                                other.drop(self)
                finally:
                    try:
                        self._disarm()
                    except BaseException:
                        self._disarm()  # (what it had not done, if it was cut short as it began)
                        raise
        finally:
            self._busy = False

    def _leave_context(self, token: contextvars.Token, routing: Optional[_Routing]) -> None:
        """The context as it was before this recording was entered (see :meth:`__exit__`)."""
        current: _Routing = _context.get()[0]
        own = current.own
        if own and own[-1] is self and _own_before(token) == own[:-1]:
            try:
                _context.reset(token)
            except ValueError:  # exited from another context than the one it entered
                _context.set(_sinks_of(own[:-1]))
        elif _holds(own, self):
            # Exited before a recording entered after it (manual __exit__ calls): only
            # this one leaves; resetting the token would drop the later ones too.
            _context.set(_sinks_of(_without(own, self)))
            if current is not routing and current is not self._kept:
                current.retire()
        if routing is not None:
            _context.get()  # the variable caches the last value it gave: now this context's
            sinks = routing.sinks
            # References: the routing's and ``sinks`` here; more are contexts copied while
            # this was active, which must stop delivering to it.
            held = sys.getrefcount(sinks) - ARGUMENT_REFERENCES > 2
            del sinks
            if held:
                routing.drop(self)
                if routing is self._kept:
                    self._kept = None
            elif routing is not self._kept:
                routing.retire()

    def _disarm(self) -> None:
        """No more in the shared recordings, its patches disarmed (see :meth:`__exit__`); a
        second call does what the first did not."""
        with _arm_lock:
            if self.threads == "all" and _holds(_shared, self):
                # Usually the last one entered: no loop then.
                _set_shared(_shared[:-1] if _shared[-1] is self else _without(_shared, self))
            if not self._counted:
                return
            ids = None if self._only is None else self._armed_for or set()
            count = _active_count  # (under the lock: no other thread's change)
            try:
                _deactivate(ids, self._arming)
            except BaseException:
                if _active_count == count:  # cut short as it began: not counted down yet
                    _deactivate(ids, self._arming)
                raise
            finally:
                self._armed_for, self._counted = None, False

    def _entered_here(self) -> bool:
        """Whether this recording was entered in the current context (not only shared
        with it, as ``threads='all'`` recordings are with contexts that have none)."""
        # ``in`` compares by identity first, and recordings define no other equality; it
        # runs where the early stop checks each value, with no generator frame to make.
        return self in _context.get()[0].own

    def _empty(self) -> None:
        """Empty every list of values in place, for a recording entered once per call.

        For recordings that keep their routes (``_keeps_routes``): the lists stay the
        same objects, so the routes and cached sinks built in earlier passes stay
        valid and the next pass does not rebuild them. Keys stay, with no values.
        """
        for values in _snapshot(self._data.values):
            values.clear()
        self.errors.clear()
        self.failures.clear()

    # storing ---------------------------------------------------------------

    def _sink(self, site_id: int, owner: Optional[str] = None) -> Optional[Sink]:
        """Where this recording keeps values of ``site_id`` (of ``owner``, for per-instance sites).

        None: not taken (the site is gone, or belongs to a patch outside ``only``).
        Subclasses change what is stored by wrapping the returned sink.
        """
        site = _SITES.get(site_id)
        if site is None:
            return None
        if self._only is not None and site.tag not in self._only:
            return None
        key = site.key if owner is None else owner + site.key
        values = self._data.get(key)
        if values is None:
            # setdefault: two threads may race to create the first list for a key.
            values = self._data.setdefault(key, [] if self._maxlen is None else deque(maxlen=self._maxlen))
        return Sink(self, key, values.append, site.copy or self.copy, site.chain)

    def _take(self, tag: Any) -> None:
        """Take the values of ``tag``'s sites too (a recording made with ``only``), arming them."""
        with _arm_lock:
            if self._only is None or id(tag) in self._only:
                return
            self._only.add(id(tag))
            self._only_held.append(tag)
            arming = _arming_of([tag])
            if self._arming is not None:
                self._arming = None if arming is None else self._arming + arming
            armed = self._armed_for
            if armed is not None and id(tag) not in armed:
                armed.add(id(tag))
                if _want((id(tag),), 1):
                    _rearm(arming)
        # A site may have fired before this (in another thread): routed nowhere then.
        self._reroute()

    def _reroute(self) -> None:
        """Rebuild every route to this recording (after :meth:`clear`, or a subclass change)."""
        with _sites_lock:
            for routing in _routings.live():
                if _holds(routing.recordings, self):
                    routing.reset()

    def _fail(self, key: str, error: BaseException) -> None:
        failed = RecordError(key, error, _without_frames(error))
        with _errors_lock:  # (probes in other threads fail too)
            self.errors.append(failed)
            self.failures[key] = self.failures.get(key, 0) + 1
            if self._maxlen is not None:  # as values are: the key's first and last ``keep`` failures
                mine = [n for n, kept in enumerate(self.errors) if kept.key == key]
                if len(mine) > self._maxlen + 1:
                    del self.errors[mine[1]]
        if key not in self._warned:
            self._warned.add(key)
            warn(f"bcrecord could not record {key}: {type(error).__name__}: {_opening(str(error))}")

    def add(self, key: str, value: Any) -> None:
        """Store ``value`` under ``key`` (for plug-ins, e.g. gradients), kept as ``keep`` says.

        The value itself, not copied as a probe copies its value by the recording's policy:
        copy it first (:func:`copy_value`) where it may change afterwards.

        >>> import bcrecord
        >>> rec = bcrecord.recording(); rec.add("m:f:x@0.grad", 1); rec["m:f:x@0.grad"]
        1
        """
        values = self._data.get(key)
        if values is None:
            values = self._data.setdefault(key, [] if self._maxlen is None else deque(maxlen=self._maxlen))
        values.append(value)

    # reading ---------------------------------------------------------------

    def _settle(self) -> None:
        """Finish copies still in flight, before values are read.

        The core copies synchronously; a plug-in whose copies complete later (the
        torch layer's non-blocking copies from a GPU) waits for them here.
        """

    def _recorded(self) -> List[Tuple[str, Union[List[Any], Deque[Any]]]]:
        """``(key, values)`` of every key with a value (a key whose copies all failed has none)."""
        # A snapshot first: a probe in another thread may add a key meanwhile.
        return [(key, values) for key, values in _snapshot(self._data.items) if values]

    def _values(self, key: str) -> Union[List[Any], Deque[Any]]:
        self._settle()
        values = self._data.get(key)
        if not values:
            failed = [error.error for error in self.errors if error.key == key]
            if failed:  # (reading the value, or copying it: the error says which)
                first = failed[0]
                raise KeyError(
                    f"no value recorded for {key!r}: recording it failed, "
                    f"{type(first).__name__}: {first} (see .errors)"
                )
            known = [k for k, _ in self._recorded()]
            if not known and not self._entered_ever:
                raise KeyError(
                    f"no values recorded for {key!r}: this recording was never entered; write "
                    "'with bcrecord.recording() as rec:' around the calls to record"
                )
            shown = listed(known) if known else "(nothing recorded yet)"
            if self._probes(key):
                where = (
                    "in a branch not taken, or a function not called, or a generator or "
                    "coroutine made before the recording started: it runs without probes"
                )
                if self.threads != "all":  # (values of contexts without a recording go nowhere)
                    where += (
                        "; or in another thread, or in an asyncio task started before the recording: "
                        "threads='all' takes those (and bcrecord.carry a function handed to a thread)"
                    )
                raise KeyError(
                    f"no values recorded for {key!r}: its probe was placed but did not run while "
                    f"recorded ({where}); recorded keys: {shown}"
                )
            close = difflib.get_close_matches(key, known, n=3) if isinstance(key, str) else []
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise KeyError(f"no values recorded for {key!r}{hint}; recorded keys: {shown}")
        return values

    def _probes(self, key: Any) -> bool:
        """Whether a probe placed for this recording records ``key`` (for its missing-key message).

        The core knows the probes in place now; a per-instance site's keys depend on
        owners it cannot list (subclasses that know their keys say so).
        """
        return any(
            site.owner is None and site.key == key and (self._only is None or site.tag in self._only)
            for site in _snapshot(_SITES.values)
        )

    def __getitem__(self, key: str) -> Any:
        """The latest value recorded under ``key``; ``KeyError`` (with close keys) if none.

        >>> import bcrecord
        >>> with bcrecord.recording() as rec:
        ...     rec.add("f:x", 1)
        ...     rec.add("f:x", 2)
        >>> rec["f:x"]
        2
        """
        return self._values(key)[-1]

    def all(self, key: str) -> List[Any]:
        """Every value recorded under ``key``, in execution order (as kept by ``keep``).

        >>> import bcrecord
        >>> with bcrecord.recording(keep=2) as rec:
        ...     for value in [1, 2, 3]:
        ...         rec.add("f:x", value)
        >>> rec.all("f:x")
        [2, 3]
        """
        return list(self._values(key))

    def get(self, key: str, default: Any = None) -> Any:
        """The latest value under ``key``, or ``default``.

        >>> import bcrecord
        >>> with bcrecord.recording() as rec:
        ...     rec.add("f:x", 1)
        >>> rec.get("f:x"), rec.get("f:y", "never recorded")
        (1, 'never recorded')
        """
        self._settle()
        values = self._data.get(key)
        return default if not values else values[-1]

    def keys(self) -> List[str]:
        """Recorded keys (those with a value), in the order their probes first ran in this
        recording (a key whose first value failed to copy, see :attr:`errors`, keeps that place).

        >>> import bcrecord
        >>> with bcrecord.recording() as rec:
        ...     rec.add("f:y", 1)
        ...     rec.add("f:x", 2)
        ...     rec.add("f:y", 3)
        >>> rec.keys()
        ['f:y', 'f:x']
        """
        return [key for key, _ in self._recorded()]

    def items(self) -> List[Tuple[str, Any]]:
        """``(key, latest value)`` pairs, in :meth:`keys`' order.

        >>> import bcrecord
        >>> with bcrecord.recording() as rec:
        ...     rec.add("f:x", 1)
        ...     rec.add("f:x", 2)
        >>> rec.items()
        [('f:x', 2)]
        """
        self._settle()
        return [(key, values[-1]) for key, values in self._recorded()]

    def __contains__(self, key: object) -> bool:
        return bool(self._data.get(key))  # type: ignore[call-overload]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self._recorded())

    def clear(self) -> None:
        """Drop everything recorded so far (the recording stays active).

        >>> import bcrecord
        >>> with bcrecord.recording() as rec:
        ...     rec.add("f:x", 1)
        ...     rec.clear()
        ...     rec.add("f:x", 2)
        >>> rec.all("f:x")
        [2]
        """
        self._data.clear()
        self.errors.clear()
        self.failures.clear()
        self._reroute()

    def __getstate__(self) -> Dict[str, Any]:
        """What a pickle or a copy (``copy.copy``, ``copy.deepcopy``) of a recording holds.

        Its values, errors and settings as they are now (inside its block: those so far),
        not being entered: where it is entered is this context's, and the patches of
        ``only`` this process's. A copy of its values' lists, so the copy keeps them as
        they were when it was made.

        >>> import copy, pickle, bcrecord
        >>> with bcrecord.recording(keep=2) as rec:
        ...     rec.add("m:f:x@0", 1)
        ...     snapshot = copy.deepcopy(rec)
        ...     rec.add("m:f:x@0", 2)
        >>> snapshot.all("m:f:x@0"), snapshot.active, pickle.loads(pickle.dumps(rec)).all("m:f:x@0")
        ([1], False, [1, 2])
        """
        self._settle()
        state = self.__dict__.copy()
        state.update(
            # (another thread may add a key meanwhile: a recording with threads='all')
            _data={key: _copy_module.copy(values) for key, values in _snapshot(self._data.items)},
            errors=[_portable(failure) for failure in self.errors],
            failures=dict(self.failures),
            _warned=set(self._warned),
            _token=None,
            _busy=False,
            _routing=None,
            _kept=None,
            _armed_for=None,
            _counted=False,
            _included=_WeakRegistry(),
        )
        if self._only is not None:
            state.update(_only=set(), _only_held=[], _arming=[], _copied_without_patches=True)
        return state

    def __deepcopy__(self, memo: Dict[int, Any]) -> Recording:
        """A deep copy: the snapshot :meth:`__getstate__` holds, each value deep-copied. Where a
        value ``copy.deepcopy`` refuses to copy (a tensor in the autograd graph, recorded with
        ``copy='none'``), the plug-ins' :data:`deepcopy_refused` put copies of what they can
        into the memo first (the torch layer: a leaf of such a tensor's values, as pickle copies it).

        >>> import copy
        >>> with recording() as rec:
        ...     rec.add("m:f:x@0", [1])
        >>> twin = copy.deepcopy(rec); twin.all("m:f:x@0"), twin.all("m:f:x@0")[0] is rec.all("m:f:x@0")[0]
        ([[1]], False)
        """
        state = self.__getstate__()
        twin = type(self).__new__(type(self))
        memo[id(self)] = twin
        # A plain deep copy first, on a memo of its own: looking for what deepcopy refuses reduces
        # every object once more (10,000 objects: 44 ms copied, 89 ms looked through and copied).
        trial = dict(memo)
        try:
            copied = _copy_module.deepcopy(state, trial)
        except RuntimeError as error:  # (torch's 'Only Tensors created explicitly by the user…')
            if raised_by_signal_handler(error) or not deepcopy_refused:
                raise
            for values in state["_data"].values():
                for prepare in deepcopy_refused:
                    prepare(values, memo)
            copied = _copy_module.deepcopy(state, memo)
        else:
            kept = trial.pop(id(trial), [])  # (deepcopy's own: what it copied, kept alive)
            memo.update(trial)
            memo.setdefault(id(memo), []).extend(kept)
        setstate = getattr(twin, "__setstate__", None)  # (a subclass's; pickle's default else)
        if setstate is not None:
            setstate(copied)
        else:
            twin.__dict__.update(copied)
        return twin

    def __repr__(self) -> str:
        state = "active" if self.active else "inactive"
        return f"<Recording {state}, {len(self)} key{'' if len(self) == 1 else 's'}>"


def _opening(message: str, limit: int = 300) -> str:
    """A failure's message as a warning shows it: its first line, cut at ``limit`` characters
    (torch's dispatcher errors list every backend, 6 to 17 KB); :attr:`Recording.errors` holds it whole.

    >>> _opening("Could not run 'aten::x'.\\nBackends: CPU, CUDA, Meta...")
    "Could not run 'aten::x'. (the whole message in the recording's errors)"
    >>> _opening("short")
    'short'
    """
    first, _, rest = message.lstrip().partition("\n")  # (the first line that says something)
    if len(first) > limit:
        first, rest = first[:limit] + "...", "cut"
    return f"{first} (the whole message in the recording's errors)" if rest.strip() else first


#: What plug-ins do where ``copy.deepcopy`` of a recording's values raises: each puts copies
#: into deepcopy's memo (``prepare(values, memo)``) of values it refuses (see Recording.__deepcopy__).
deepcopy_refused: List[Callable[[Any, Dict[int, Any]], None]] = []


def _patches_in(only: Any) -> List[Any]:
    """``only=``'s patches, or a TypeError (a key or a function there would silently match nothing).

    >>> _patches_in(["m:f:x@0"])
    Traceback (most recent call last):
    TypeError: only= takes patches (what patch_method and patch_function return), got 'm:f:x@0'
    """
    if isinstance(only, (str, bytes)) or not isinstance(only, Iterable):
        raise TypeError(f"only= takes a list of patches (what patch_method returns), got {only!r}")
    tags = list(only)
    for tag in tags:
        # (A patch, as the runtime knows one: it has sites. Not imported: patch.py uses this.)
        if not isinstance(getattr(tag, "_site_ids", None), list):
            raise TypeError(f"only= takes patches (what patch_method and patch_function return), got {tag!r}")
        if getattr(tag, "active", True) is False:  # it would record nothing, silently
            raise SpecError(f"only= names a patch that was removed: {tag!r}")
    return tags


def kept_length(keep: Keep) -> Optional[int]:
    """How many values per key ``keep`` keeps (None: all); a SpecError for a bad ``keep``.

    >>> kept_length("last"), kept_length("all"), kept_length(3)
    (1, None, 3)
    """
    if isinstance(keep, str) and keep in ("last", "all"):
        return 1 if keep == "last" else None
    if not isinstance(keep, (bool, str)):
        try:
            count = operator.index(keep)  # numpy's and torch's integers too
        except TypeError:
            count = 0
        if count > sys.maxsize:  # (no ring buffer that long: every value would be lost)
            raise SpecError(f"keep={count} is more values than a key can hold; keep='all' keeps every one")
        if count > 0:
            return count
    shown = f"{keep!r} ({type(keep).__name__})" if not isinstance(keep, (str, int)) else repr(keep)
    raise SpecError(f"keep must be 'all', 'last' or a positive int, got {shown}")


def recording(
    copy: str = "clone", keep: Keep = "all", threads: str = "context", only: Optional[Iterable[Any]] = None
) -> Recording:
    """A new :class:`Recording`; use it as a context manager.

    ``copy`` is the default copy policy (``'clone'``, ``'detach'``, ``'deepcopy'``,
    ``'none'``); ``keep`` is ``'all'``, ``'last'`` or how many values to keep per
    key; ``threads='all'`` also takes values from threads that have no recording
    of their own; ``only`` (an iterable of patches) takes values from those patches
    alone.

    >>> import bcrecord
    >>> with bcrecord.recording(keep="last") as rec:
    ...     pass
    >>> len(rec)
    0
    """
    return Recording(copy=copy, keep=keep, threads=threads, only=only)


def carry(func: Callable[P, T]) -> Callable[P, T]:
    """Wrap ``func`` to run inside the caller's current recordings (e.g. in a worker thread).

    The recordings are those entered where ``carry`` is called. Each call runs in a copy of
    the context it is called in, with those recordings, as a task or ``asyncio.to_thread``
    runs in a copy: the program's own context variables (a request id, ``decimal``'s
    context) are those of where it runs, and what it sets in them stays in that copy. Where
    no recording is entered (a decorator at import), ``func`` itself is returned: it records
    in the recordings of wherever it runs.

    A coroutine, generator or async generator that ``func`` returns runs there too, each
    step (its body runs where it is awaited or iterated, not where it is made). The wrapper
    of an ``async def`` function, generator function (a ``types.coroutine`` one too) or
    async generator function is one too, so frameworks that check
    ``inspect.iscoroutinefunction``, ``inspect.isgeneratorfunction`` or
    ``inspect.isasyncgenfunction`` treat it as they treat ``func`` (unlike ``func``, such a
    wrapper checks its arguments at its first step, not when it is called, and its context
    is a copy of the one it first steps in).

    >>> import asyncio, bcrecord, inspect, threading
    >>> def double(a):
    ...     y = a * 2
    ...     return y
    >>> async def job(a):
    ...     return recorded(a)
    >>> recorded = bcrecord.instrument(double, "y", name="demo")
    >>> with bcrecord.recording() as rec:
    ...     carried = bcrecord.carry(job)
    ...     worker = threading.Thread(target=lambda: asyncio.run(carried(5))); worker.start(); worker.join()
    >>> rec["demo:double:y@0"], inspect.iscoroutinefunction(carried), bcrecord.carry(job) is job
    (10, True, True)
    """
    if not callable(func):  # (the wrapper would fail only when called, elsewhere: a worker thread)
        raise TypeError(f"carry takes a function to run inside the recordings, got {func!r:.80}")
    here = contextvars.copy_context()
    if not here.run(context_recordings):
        return func
    # bcrecord's own variables as they are here (each of them: one the calling context has
    # set, while here it is not, would mix another state with this one).
    # (A snapshot: another thread importing the torch layer may register its variables now.)
    carried = [(var, here.get(var, default)) for var, default in _snapshot(_carried_variables.items)]

    def context() -> contextvars.Context:
        inside = contextvars.copy_context()
        for var, value in carried:
            if inside.get(var, _unset) is not value:
                inside.run(var.set, value)
        return inside

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def run_coroutine(*args: Any, **kwargs: Any) -> Any:
            inside = context()
            result = inside.run(func, *args, **kwargs)
            if isinstance(result, types.CoroutineType):
                return await _awaitable_steps(inside, result)
            return await result  # (a function marked as one that returns another awaitable)

        return run_coroutine  # type: ignore[return-value]

    if inspect.isgeneratorfunction(func):

        @functools.wraps(func)
        def run_generator(*args: Any, **kwargs: Any) -> Any:
            inside = context()
            return (yield from _stepped_in(inside, inside.run(func, *args, **kwargs)))

        if _iterable_coroutine(func):  # (awaited, not iterated: its wrapper too)
            return types.coroutine(run_generator)  # type: ignore[return-value]
        return run_generator  # type: ignore[return-value]

    if inspect.isasyncgenfunction(func):
        return functools.wraps(func)(_async_generator_function(context, func))  # type: ignore[return-value]

    @functools.wraps(func)  # (its name, signature and doc: a thread's or task's name shows it)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        inside = context()
        result = inside.run(func, *args, **kwargs)
        if isinstance(result, types.CoroutineType):
            return _awaited_in(inside, result)  # type: ignore[return-value]
        if isinstance(result, types.GeneratorType):
            if _iterable_coroutine(result):
                return _awaitable_steps(inside, result)  # type: ignore[return-value]
            return _stepped_in(inside, result)  # type: ignore[return-value]
        if isinstance(result, types.AsyncGeneratorType):
            return _async_generator_function(lambda: inside, lambda: result)()  # type: ignore[return-value]
        return result

    return run


_unset = object()


def _iterable_coroutine(func_or_generator: Any) -> bool:
    """Whether a generator function (a partial or method of one) or generator is
    ``types.coroutine``'s (awaitable)."""
    while isinstance(func_or_generator, functools.partial):
        func_or_generator = func_or_generator.func
    func_or_generator = getattr(func_or_generator, "__func__", func_or_generator)
    code = getattr(func_or_generator, "__code__", None) or getattr(func_or_generator, "gi_code", None)
    return isinstance(code, types.CodeType) and bool(code.co_flags & inspect.CO_ITERABLE_COROUTINE)


def _stepped_in(context: contextvars.Context, inner: Any) -> Any:
    """A generator that runs each step of the generator or coroutine ``inner`` in ``context``."""
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            yielded = context.run(inner.send, value) if error is None else context.run(inner.throw, error)
        except StopIteration as stop:
            return stop.value
        value, error = None, None
        try:
            value = yield yielded
        except GeneratorExit:
            context.run(inner.close)
            raise
        except BaseException as raised:  # (a task's CancelledError): thrown in where it runs
            error = raised


@types.coroutine
def _awaitable_steps(context: contextvars.Context, inner: Any) -> Any:
    return (yield from _stepped_in(context, inner))


async def _awaited_in(context: contextvars.Context, inner: Any) -> Any:
    """The coroutine ``inner``, each step run in ``context``: what awaits it gets its result."""
    return await _awaitable_steps(context, inner)


def _async_generator_function(
    context: Callable[[], contextvars.Context], func: Callable[..., Any]
) -> Callable[..., Any]:
    """An async generator function (as ``inspect.isasyncgenfunction`` sees it) whose async
    generators run the one ``func`` makes, each step of each item in a context ``context()`` gives."""

    async def run_async_generator(*args: Any, **kwargs: Any) -> Any:
        inside = context()
        inner = inside.run(func, *args, **kwargs)
        value: Any = None
        error: Optional[BaseException] = None
        while True:
            step = inner.asend(value) if error is None else inner.athrow(error)
            try:
                yielded = await _awaitable_steps(inside, step)
            except StopAsyncIteration:
                return
            value, error = None, None
            try:
                value = yield yielded
            except GeneratorExit:
                await _awaitable_steps(inside, inner.aclose())
                raise
            except BaseException as raised:  # thrown in where it runs, as athrow() does
                error = raised

    return run_async_generator


# --- the probe ---------------------------------------------------------------


def _read_chain(value: Any, chain: Tuple[str, ...]) -> Any:
    for name in chain:
        value = getattr(value, name)
    return value


#: See :func:`set_frame_switch`.
_switch: Optional[Callable[[Any], Any]] = None


def set_frame_switch(switch: Optional[Callable[[Any], Any]]) -> Optional[Callable[[Any], Any]]:
    """Run every value a called probe delivers between ``switch(None)`` and ``switch(prior)``.

    For a plug-in whose runtime evaluates frames its own way: ``bcrecord.torch``
    passes Dynamo's ``set_eval_frame``, so that inside compiled code the recording
    runs in plain Python. ``switch(None)`` returns what to restore afterwards, or
    None for nothing. Set inside the probe rather than as a wrapper around it, so
    a recorded value costs no extra Python call. Returns the previous switch.

    >>> previous = set_frame_switch(None)
    >>> _ = set_frame_switch(previous)
    """
    global _switch
    previous, _switch = _switch, switch
    return previous


def __bcrecord_probe__(value: Any, site_id: int, instance: Any = _NO_INSTANCE) -> None:
    """Called by inserted code of the ``'call'`` spelling: deliver ``value`` to the recordings.

    Without ``instance`` this is what inline probes do:
    ``SINKS.get()[site_id].append(value)``. ``instance`` (the method's
    self) is passed only by per-instance sites, whose keys start with its owner.
    """
    if _switch is not None:  # a global test, cheaper than a local kept for every value
        switch = _switch
        prior = switch(None)
        if prior is not None:  # frames were being evaluated another way: deliver with that off
            try:
                __bcrecord_probe__(value, site_id, instance)
            finally:
                switch(prior)
            return
    try:
        target = _context.get()[site_id]
    except IndexError:  # not an id inserted code reports with
        return
    if instance is _NO_INSTANCE:
        target.append(value)
        return
    try:
        deliver = target.deliver
    except AttributeError:  # released: the site's item drops values
        return
    deliver(value, instance)


# Call-spelled probes find the runtime with LOAD_GLOBAL, which falls back to builtins.
setattr(builtins, PROBE_NAME, __bcrecord_probe__)


def probe_visible_from(globals_: Dict[str, Any]) -> None:
    """Make the probe resolvable from a function whose globals have custom builtins.

    It goes into those builtins, where Python looks it up, not into the globals,
    which the function's own code may list (``globals()``).

    >>> namespace = {"__builtins__": {}}
    >>> probe_visible_from(namespace)
    >>> namespace["__builtins__"][PROBE_NAME] is getattr(builtins, PROBE_NAME), PROBE_NAME in namespace
    (True, False)
    """
    custom = globals_.get("__builtins__", builtins)
    namespace = custom if isinstance(custom, dict) else getattr(custom, "__dict__", None)
    # Any probe there will do (a test may have put its own in builtins).
    if PROBE_NAME in globals_ or (namespace is not None and PROBE_NAME in namespace):
        return
    # The builtins' own (the torch layer's is marked for Dynamo to skip).
    probe = getattr(builtins, PROBE_NAME, __bcrecord_probe__)
    if isinstance(namespace, dict):
        namespace[PROBE_NAME] = probe
    else:  # builtins without a dict to add to
        globals_[PROBE_NAME] = probe
