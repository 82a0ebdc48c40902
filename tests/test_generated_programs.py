"""Generated programs behave exactly the same with every recordable site probed.

Each program is compiled and executed twice, each time in a fresh namespace: once
as it is, once with every function it defines patched in place
(:func:`bcrecord.patch_function`) with *all* of its targets -- locals, attribute
chains, call sites, operators, returns
(:meth:`bcrecord.targets(func).specs() <bcrecord.analysis.Targets.specs>`) -- and
every method patched on one instance (:func:`bcrecord.patch_method`, a copy of the
function with a per-instance owner, as the torch layer patches a module) with all
of those such a patch can probe (``specs(per_instance=True)``). Every function is
then called with a few simple arguments (ints, None, strings), a method through
its instance -- the probed ones inside an active recording -- and the outcomes must
be identical:
the returned value (its ``repr``, addresses masked; generators and coroutines are
driven to the end, ten steps at most) or the exception (type and message).
Besides, every probed call that returned must have recorded exactly the object it
returned under its ``return`` key, and no probe may report an error.

Each program runs in a forked child process, so that generated code which loops
forever, recurses, exits or crashes cannot take the test run down: a program whose
*original* run takes longer than ``ORIGINAL_TIMEOUT`` seconds is dropped, and a
probed run that is much slower than the original, or a child that dies, fails.
Those seconds are the child's CPU time, which a loaded machine stretches far less
than wall time (wall time only backs them up, ``WALL_FACTOR`` times longer, for a
program that waits without running).

Programs come from three sources:

* ``hypothesmith.from_grammar()`` and ``hypothesmith.from_node()``, run as they
  are and, where that compiles, also wrapped as the body of a function (so their
  statements assign locals, which is what probes record);
* a strategy of our own that writes functions, methods and async functions from
  the constructs probes must survive (assignments of every kind, augmented ones to
  subscripts and attributes, star-unpacking, loops, try/except/finally with
  ``break``/``continue``/``return`` in ``finally``, ``except*`` (3.11+), ``with``
  with parenthesised items, ``match`` with class, mapping and star patterns and
  guards, comprehensions (async ones too), walrus, lambdas, f-strings nested with
  the same quotes (3.12+), closures two deep with ``nonlocal``, ``global``, ``del``,
  conditional imports, ``yield``, ``yield from`` a generator that raises, ``await``,
  ``super()``);
* a hand-written list of tricky constructs (:data:`TRICKY`), run deterministically,
  among them PEP 695 type parameters and aliases (3.12+), zero-argument ``super()``
  in nested classes, decorators with calls and ``functools.wraps`` wrappers (whose
  patch records the function they wrap, so the return check skips them).

``BCRECORD_HYPOTHESIS_EXAMPLES`` (default 40) sets the number of examples of the
generated-function test; the hypothesmith tests use a quarter of it (their
generators are slow). Without it, the examples are the same on every run
(derandomized), so that a test run, CI's among them, checks what was checked
before; with it, each run is a campaign over fresh random programs (one test can then
run past setup.cfg's ``faulthandler_timeout`` of 300 s, whose stack dump is no hang: the
option turns it off)::

    BCRECORD_HYPOTHESIS_EXAMPLES=2000 python -m pytest -q -o faulthandler_timeout=0 \
        tests/test_generated_programs.py
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import inspect
import json
import os
import re
import select
import signal
import sys
import tempfile
import textwrap
import time
import traceback
import types
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import hypothesis
import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bcrecord

CAMPAIGN = "BCRECORD_HYPOTHESIS_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("BCRECORD_HYPOTHESIS_EXAMPLES", "40"))
ORIGINAL_TIMEOUT = 2.0  # CPU seconds for compiling, executing and calling the original program
PROBED_TIMEOUT = 10.0  # CPU seconds for the probed run, plus 20 times what the original took
WALL_FACTOR = 10  # how much longer than the CPU limits a child may take in wall time
CALLS_PER_FUNCTION = 4
MAX_FUNCTIONS = 40
ARGUMENT_VALUES: Tuple[Any, ...] = (1, None, "ab", 0, -2)

SETTINGS = settings(
    deadline=None,
    database=None,
    derandomize=not CAMPAIGN,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

pytestmark = pytest.mark.filterwarnings("ignore::SyntaxWarning")  # hypothesmith's own compile() calls

if not hasattr(os, "fork"):  # pragma: no cover - every supported CI platform has fork
    pytest.skip("the differential harness isolates programs with os.fork", allow_module_level=True)


# --- running one program (in the child) -------------------------------------------


def _mask(text: str) -> str:
    return re.sub(r"0x[0-9a-fA-F]+", "0x?", text)[:2000]


def _show(value: Any) -> str:
    try:
        return _mask(repr(value))
    except BaseException as exc:  # a generated __repr__ may raise anything
        return f"<repr raised {type(exc).__name__}>"


def _raised(exc: BaseException) -> List[str]:
    if isinstance(exc, RecursionError):
        # The probe is a Python call: the exact depth (and CPython's wording of
        # where the limit was hit) may differ; that recursion failed may not.
        return ["raise", "RecursionError"]
    try:
        message = str(exc)
    except BaseException:
        message = "<str raised>"
    return ["raise", type(exc).__name__, _mask(message)]


def _await(awaitable: Any, steps: List[Any]) -> Any:
    """Drive an awaitable by hand (no event loop): send None until it returns."""
    for _ in range(10):
        try:
            steps.append(_show(awaitable.send(None)))
        except StopIteration as stop:
            return stop.value
    awaitable.close()
    raise TimeoutError("awaitable still running after 10 steps")


def _drive(result: Any) -> List[Any]:
    """The outcome of a call, generators and coroutines run (at most 10 steps)."""
    steps: List[Any] = []
    try:
        if isinstance(result, types.GeneratorType):
            for _ in range(10):
                steps.append(_show(next(result)))
            result.close()
            return ["generator", steps, "open"]
        if isinstance(result, types.CoroutineType):
            return ["coroutine", steps, _show(_await(result, steps))]
        if isinstance(result, types.AsyncGeneratorType):
            for _ in range(5):
                steps.append(_show(_await(result.__anext__(), steps)))
            _await(result.aclose(), steps)
            return ["async generator", steps, "open"]
    except StopIteration as stop:
        return ["generator", steps, "return", _show(stop.value)]
    except StopAsyncIteration:
        return ["async generator", steps, "end"]
    except BaseException as exc:
        return [type(result).__name__, steps, _raised(exc)]
    return ["value", _show(result)]


_LAZY = (
    inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
)


def _functions(namespace: Dict[str, Any]) -> List[Tuple[str, types.FunctionType, Callable[..., Any], Any]]:
    """(label, function to patch, callable to call, instance or None) for what a program defines."""
    found: List[Tuple[str, types.FunctionType, Callable[..., Any], Any]] = []
    seen: set = set()

    def add(label: str, func: Any, call: Callable[..., Any], instance: Any = None) -> None:
        if isinstance(func, types.FunctionType) and func.__code__.co_filename == "<generated>":
            if id(func) not in seen:
                seen.add(id(func))
                found.append((label, func, call, instance))

    for name, value in sorted(namespace.items(), key=lambda item: str(item[0])):
        if isinstance(value, types.FunctionType):
            add(name, value, value)
        elif isinstance(value, type) and value.__module__ == namespace["__name__"]:
            try:
                instance: Any = value.__new__(value)
            except BaseException:
                instance = None
            for attr, raw in sorted(vars(value).items(), key=lambda item: str(item[0])):
                label = f"{name}.{attr}"
                if isinstance(raw, staticmethod):
                    add(label, raw.__func__, raw.__func__)
                elif isinstance(raw, classmethod):
                    add(label, raw.__func__, types.MethodType(raw.__func__, value))
                elif isinstance(raw, types.FunctionType):
                    add(label, raw, raw if instance is None else _through_instance(attr, raw), instance)
    return found[:MAX_FUNCTIONS]


def _through_instance(attr: str, func: types.FunctionType) -> Callable[..., Any]:
    """Call method ``attr`` as ``instance.attr(...)``, where a patch of that instance runs
    (with ``func``'s signature, which :func:`_argument_sets` reads)."""

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not args:  # (no instance to pass: the class's function, as it is)
            return func(**kwargs)
        return getattr(args[0], attr)(*args[1:], **kwargs)

    return call


def _argument_sets(call: Callable[..., Any], instance: Any) -> List[Tuple[tuple, dict]]:
    try:
        parameters = list(inspect.signature(call).parameters.values())
    except (TypeError, ValueError):
        return [((), {})]
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    keyword = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    sets = []
    for value in ARGUMENT_VALUES[:CALLS_PER_FUNCTION]:
        args = [value] * len(positional)
        if instance is not None and args:
            args[0] = instance
        sets.append((tuple(args), {name: value for name in keyword}))
    if not positional and not keyword:
        sets = sets[:1]
    return sets


def run_program(code: types.CodeType, probed: bool) -> Dict[str, Any]:
    """Execute ``code`` in a fresh namespace and call what it defines; describe what happened."""
    namespace: Dict[str, Any] = {"__name__": "generated"}
    try:
        exec(code, namespace)
        executed: List[Any] = ["ok"]
    except BaseException as exc:
        executed = _raised(exc)
    functions = _functions(namespace)
    patches: Dict[str, Any] = {}
    owners: Dict[str, str] = {}
    if probed:
        for number, (label, func, _, instance) in enumerate(functions):
            owners[label] = f"g{number}"
            attr = label.rpartition(".")[2]
            if instance is not None and func.__code__.co_argcount and not attr.startswith("__"):
                # A method: patched on its instance alone, with a per-instance owner (a copy of
                # the function, probes given the instance), as the torch layer patches a module.
                specs = bcrecord.targets(func).specs(per_instance=True)
                if specs:
                    patches[label] = bcrecord.patch_method(
                        instance, attr, specs, name=lambda obj, owner=owners[label]: owner
                    )
                continue
            specs = bcrecord.targets(func).specs()
            if specs:
                patches[label] = bcrecord.patch_function(func, specs, name=owners[label])
    calls: List[Any] = []
    problems: List[str] = []
    recording = bcrecord.recording(copy="none", keep="all") if probed else contextlib.nullcontext()
    with recording as rec:
        for label, func, call, instance in functions:
            in_place = (
                instance is None or not func.__code__.co_argcount or label.rpartition(".")[2][:2] == "__"
            )
            if probed and label in patches and in_place and func.__code__ is patches[label].original_code:
                problems.append(f"{label}: the original code runs inside a recording")
            for args, kwargs in _argument_sets(call, instance):
                try:
                    result = call(*args, **kwargs)
                except BaseException as exc:
                    calls.append([label, _raised(exc)])
                    continue
                calls.append([label, _drive(result)])
                # (A functools.wraps wrapper is patched inside the function it wraps: that one's return.)
                own = not hasattr(func, "__wrapped__")
                if probed and label in patches and own and not func.__code__.co_flags & _LAZY:
                    key = next(k for k in patches[label].keys if k.endswith(":return"))
                    key = owners[label] + key[key.index(":") :]  # (a per-instance owner shows as '*')
                    recorded = rec.all(key) if key in rec else []
                    if not recorded or recorded[-1] is not result:
                        problems.append(f"{label}{args}: returned {_show(result)}, recorded {recorded[-1:]}")
    report: Dict[str, Any] = {"exec": executed, "calls": calls}
    if probed:
        report["problems"] = problems
        report["probes"] = sum(len(p.keys) for p in patches.values())
        report["fired"] = len(rec)
        report["errors"] = [
            f"{e.key}: {type(e.error).__name__}: {e.error}"
            for e in rec.errors
            if not isinstance(e.error, RecursionError)
        ]
    return report


def _child(source: str, out: int, stacks: Any) -> None:
    def send(kind: str, payload: Any = None) -> None:
        os.write(out, (json.dumps([kind, payload]) + "\n").encode())

    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    warnings.simplefilter("ignore")
    sys.breakpointhook = lambda *args, **kwargs: None
    with contextlib.suppress(Exception):
        import resource

        with open("/proc/self/statm") as statm:
            size = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + (1 << 30), resource.RLIM_INFINITY))
    try:
        # Past its CPU time, SIGPROF ends the child (its default action): the parent sees why.
        started = time.process_time()
        signal.setitimer(signal.ITIMER_PROF, ORIGINAL_TIMEOUT)
        code = compile(source, "<generated>", "exec")
        send("phase", "original")
        plain = run_program(code, probed=False)
        signal.setitimer(signal.ITIMER_PROF, 0)
        original_seconds = time.process_time() - started
        send("phase", "probed")
        # Where a probed run runs too long (SIGPROF), hangs (the parent aborts it: SIGABRT) or
        # crashes, the child writes where it was before it dies (a handler of the child's own:
        # dump_traceback_later's thread would be the parent's, a pytest timeout's, after fork).
        faulthandler.enable(file=stacks, all_threads=True)
        faulthandler.register(signal.SIGPROF, file=stacks, all_threads=True, chain=True)
        signal.setitimer(signal.ITIMER_PROF, PROBED_TIMEOUT + 20 * original_seconds)
        probed = run_program(code, probed=True)
        signal.setitimer(signal.ITIMER_PROF, 0)
        send("result", {"plain": plain, "probed": probed})
    except BaseException:
        signal.setitimer(signal.ITIMER_PROF, 0)
        send("crash", traceback.format_exc())


def differential(source: str) -> Dict[str, Any]:
    """Run ``source`` plain and probed in a forked child; the child's report.

    ``status`` is ``'done'`` (with ``plain`` and ``probed``), ``'slow'`` (the
    original program ran too long: not a finding), ``'timeout'`` (the probed run
    ran too long, with ``stacks``: where the child was then), or ``'crash'`` (with
    ``detail``). "Too long" is in the child's CPU time (see the module's docstring).
    """
    read_end, write_end = os.pipe()
    stacks = tempfile.TemporaryFile()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "fork() in a multi-threaded process"
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read_end)
        try:
            _child(source, write_end, stacks)
        finally:
            os._exit(0)
    os.close(write_end)
    buffer, messages = b"", []
    phase, phase_started = "original", time.monotonic()
    original_seconds = 0.0
    status: Dict[str, Any] = {}
    try:
        while True:
            limit = ORIGINAL_TIMEOUT if phase == "original" else PROBED_TIMEOUT + 20 * original_seconds
            remaining = WALL_FACTOR * limit - (time.monotonic() - phase_started)
            if remaining <= 0:
                status = {"status": "slow" if phase == "original" else "timeout", "phase": phase}
                if phase == "probed":
                    _abort(pid)
                break
            ready, _, _ = select.select([read_end], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                kind, payload = json.loads(line)
                messages.append((kind, payload))
                if kind == "phase" and payload == "probed":
                    original_seconds = time.monotonic() - phase_started
                    phase, phase_started = "probed", time.monotonic()
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _, wait_status = os.waitpid(pid, 0)
        with stacks:
            stacks.seek(0)
            dumped = stacks.read().decode(errors="replace")
    if os.WIFSIGNALED(wait_status) and os.WTERMSIG(wait_status) == signal.SIGPROF:  # its CPU time ran out
        status = {"status": "slow" if phase == "original" else "timeout", "phase": phase}
    if status:
        return {**status, "stacks": dumped} if status["status"] == "timeout" else status
    for kind, payload in messages:
        if kind == "result":
            return {"status": "done", **payload}
        if kind == "crash":
            return {"status": "crash", "detail": payload}
    return {"status": "crash", "detail": f"child died in phase {phase} (wait status {wait_status})\n{dumped}"}


def _abort(pid: int) -> None:
    """Abort child ``pid`` and wait until it has died: its fault handler writes its stacks first.

    Waiting for the death, not for a while, is what makes the stacks complete however loaded the
    machine is; a child still alive after a generous wait is left to the caller's kill.
    """
    os.kill(pid, signal.SIGABRT)
    deadline = time.monotonic() + 60.0
    while time.monotonic() < deadline:
        # (WNOWAIT: the child is left to be reaped by the caller's waitpid.)
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return
        time.sleep(0.05)


def check_program(source: str) -> Optional[Dict[str, Any]]:
    """Assert that probing changes nothing in ``source``; the report, or None if too slow."""
    report = differential(source)
    if report["status"] == "slow":
        hypothesis.event("dropped: original program too slow")
        return None
    assert report["status"] == "done", f"{report}\n--- program ---\n{source}"
    plain, probed = report["plain"], report["probed"]
    assert probed["exec"] == plain["exec"], source
    assert probed["calls"] == plain["calls"], f"outcomes differ\n--- program ---\n{source}"
    assert probed["problems"] == [], f"{probed['problems']}\n--- program ---\n{source}"
    assert probed["errors"] == [], f"{probed['errors']}\n--- program ---\n{source}"
    return report


def compiles(source: str) -> bool:
    """Whether ``source`` compiles (its SyntaxWarnings silenced)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            compile(source, "<generated>", "exec")
        except (SyntaxError, ValueError):
            return False
    return True


def as_function(source: str) -> Optional[str]:
    """``source`` as the body of a function (so that its names become locals), if that compiles."""
    body = "".join(f"    {line}\n" for line in source.splitlines())
    wrapped = f"def generated(a=1, b=None, *args, **kwargs):\n{body}    return locals()\n"
    return wrapped if compiles(wrapped) else None


# --- hypothesmith ---------------------------------------------------------------


def _hypothesmith_case(source: str) -> None:
    if not compiles(source):
        hypothesis.reject()
    wrapped = as_function(source)
    check_program(source if wrapped is None else wrapped + "\n" + source)


@settings(SETTINGS, max_examples=max(1, EXAMPLES // 4))
@given(hypothesmith.from_grammar())
def test_hypothesmith_grammar_programs_are_unchanged_by_probes(source: str) -> None:
    _hypothesmith_case(source)


@settings(SETTINGS, max_examples=max(1, EXAMPLES // 4))
@given(hypothesmith.from_node())
def test_hypothesmith_node_programs_are_unchanged_by_probes(source: str) -> None:
    _hypothesmith_case(source)


# --- functions written from the constructs probes must survive --------------------

TARGETS = ("x", "y", "z")


@functools.cache
def _expressions(with_self: bool) -> st.SearchStrategy[str]:
    names = ["a", "b", "x", "y", "z", "G"] + (["self.v", "self.v.real", "self.items"] if with_self else [])
    # Attribute chains rooted at a global or a builtin are sites too (G is rebound by `G = ...`).
    names += ["math.pi", "cfg.lr", "cfg.sub.k", "G.real", "len.__name__"]
    leaves = st.sampled_from(names + ["0", "1", "2", "-1", "None", "'s'", "[1, 2]", "(1, 'ab')", "{'k': 2}"])

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        two = st.tuples(inner, inner)
        return st.one_of(
            st.tuples(
                inner, st.sampled_from(["+", "-", "*", "//", "%", "and", "or", "==", "is", "in"]), inner
            ).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} < {t[1]} <= {t[2]})"),
            st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
            inner.map(lambda e: f"(not {e})"),
            inner.map(lambda e: f"[{e} for x in range(2)]"),
            inner.map(lambda e: f"[[x, y] for x in range(2) for y in range(x, 3) if {e}]"),
            inner.map(lambda e: f"{{k: {e} for k in 'ab'}}"),
            inner.map(lambda e: f"sum(i for i in range(3) if {e})"),
            # Walrus targets z only: comprehensions here iterate over x, y, i and k.
            inner.map(lambda e: f"(z := {e})"),
            st.just("[(z := i) for i in range(2)]"),
            two.map(lambda t: f"(lambda q={t[0]}: (q, {t[1]}))()"),
            inner.map(lambda e: f"len(str({e}))"),
            inner.map(lambda e: f"str({e})[:3]"),
            inner.map(lambda e: f"{e}[0]"),
            inner.map(lambda e: f"[*{e}]"),
            st.sampled_from(["a", "b", *TARGETS]).map(lambda n: f"f'<{{{n}!r:>4}}>'"),
            # Call shapes: keywords, star-args, methods, calls inside comprehensions.
            inner.map(lambda e: f"dict(k={e})"),
            inner.map(lambda e: f"max([{e}, 1], key=str)"),
            inner.map(lambda e: f"str({e}).upper()"),
            inner.map(lambda e: f"'{{}}-{{}}'.format({e}, *[1])"),
            inner.map(lambda e: f"(lambda *p, **k: (p, k))({e}, *[1], **{{'q': 2}})"),
            inner.map(lambda e: f"[str(i).zfill(2) for i in range(2) if {e}]"),
            # Callees that are no call sites: an item, a call's result (the calls inside them are).
            inner.map(lambda e: f"[str, repr][1]({e})"),
            inner.map(lambda e: f"(lambda: len)()(str({e}))"),
            # Calls of global-rooted chains: nested, with keywords, star-args, in comprehensions.
            inner.map(lambda e: f"cfg.fn({e}, k=math.pi)"),
            inner.map(lambda e: f"math.floor(math.sqrt(len(str({e}))))"),
            two.map(lambda t: f"cfg.sub.pair(*[{t[0]}], **{{'k': {t[1]}}})"),
            inner.map(lambda e: f"[cfg.fn(i, cfg.sub.k, q={e}) for i in range(2)]"),
            inner.map(lambda e: f"cfg.fn(cfg.fn({e}).count(None), *cfg.fn())"),
            inner.map(lambda e: f"(-{e})"),
            two.map(lambda t: f"({t[0]} | {t[1]})"),
            *(
                [
                    inner.map(lambda e: f"super().m({e})"),
                    st.just("self.items.copy()"),
                    st.just("len(self.items) * self.v"),
                ]
                if with_self
                else []
            ),
        )

    return st.recursive(leaves, extend, max_leaves=5)


# Cached: a strategy built anew for every example is validated anew (st.recursive's checks),
# which took most of an example's time.
@functools.cache
def _statements(with_self: bool, is_async: bool) -> st.SearchStrategy[List[str]]:
    e = _expressions(with_self)
    t = st.sampled_from(TARGETS)
    simple = [
        st.tuples(t, e).map(lambda p: [f"{p[0]} = {p[1]}"]),
        st.tuples(t, e).map(lambda p: [f"{p[0]} += {p[1]}"]),
        st.tuples(t, t, e, e).map(lambda p: [f"{p[0]}, *{p[1]} = {p[2]}, {p[3]}, 7"]),
        st.tuples(t, e).map(lambda p: [f"{p[0]}: int = {p[1]}"]),
        st.tuples(t, t, e).map(lambda p: [f"{p[0]} = {p[1]} = {p[2]}"]),
        t.map(lambda n: [f"{n} = [{n} + 1 for {n} in range(3)]"]),
        t.map(lambda n: [f"del {n}"]),
        t.map(lambda n: [f"import math as {n}"]),
        e.map(lambda x: [f"G = {x}"]),
        e.map(lambda x: [f"cfg.lr = {x}"]),
        e.map(lambda x: [f"return {x}"]),
        e.map(lambda x: [f"raise ValueError({x})"]),
        st.just(["x, y = y, x"]),
        st.tuples(t, e).map(lambda p: [f"{p[0]}[0] = {p[1]}"]),
        # Augmented assignment to a subscript and to attributes (a local's, a global chain's).
        st.tuples(t, e).map(lambda p: [f"{p[0]}[0] += {p[1]}"]),
        e.map(lambda x: [f"cfg.sub.k += {x}"]),
        st.tuples(t, e).map(lambda p: [f"{p[0]} = SimpleNamespace(n={p[1]})", f"{p[0]}.n *= 2"]),
        st.tuples(t, t, e).map(lambda p: [f"[{p[0]}, *{p[1]}] = ({p[2]}, 1)"]),
        st.tuples(t, e).map(
            lambda p: [f"if {p[1]}:", f"    import math as {p[0]}", "else:", f"    {p[0]} = 0"]
        ),
        st.just(["pass"]),
    ]
    if sys.version_info >= (3, 12):  # PEP 701: an f-string nested in one with the same quotes
        simple.append(st.tuples(t, e).map(lambda p: [f'{p[0]} = f"{{f"{{({p[1]})!r}}"!s:>3}}"']))
    if is_async:
        simple.append(st.tuples(t, e).map(lambda p: [f"{p[0]} = await Step({p[1]})"]))
        simple.append(st.tuples(t, e).map(lambda p: [f"{p[0]} = [(v, {p[1]}) async for v in ticks(2)]"]))
        simple.append(st.tuples(t, e).map(lambda p: [f"{p[0]} = [await Step(v) for v in ({p[1]}, 1)]"]))
    else:
        simple.append(st.tuples(t, e).map(lambda p: [f"{p[0]} = yield {p[1]}"]))
        simple.append(st.tuples(t, e).map(lambda p: [f"{p[0]} = yield from [{p[1]}, 1]"]))
        # Delegation to a generator that raises (after yielding) or returns a value.
        simple.append(st.tuples(t, e).map(lambda p: [f"{p[0]} = yield from failing({p[1]})"]))
    if with_self:
        simple.append(e.map(lambda x: [f"self.w = {x}"]))
    leaf = st.one_of(*simple)

    def indent(lines: List[str], by: int = 1) -> List[str]:
        return ["    " * by + line for line in lines]

    def extend(block: st.SearchStrategy[List[str]]) -> st.SearchStrategy[List[str]]:
        body = st.lists(block, min_size=1, max_size=3).map(
            lambda parts: [ln for part in parts for ln in part]
        )
        return st.one_of(
            st.tuples(e, body, body).map(lambda p: [f"if {p[0]}:", *indent(p[1]), "else:", *indent(p[2])]),
            st.tuples(t, e, body).map(
                lambda p: [f"for {p[0]} in range(3):", *indent(p[2]), f"    if {p[1]}:", "        break"]
            ),
            st.tuples(e, body, body).map(
                lambda p: ["for i in [1, 2]:", *indent(p[1]), "else:", *indent(p[2]), f"    z = {p[0]}"]
            ),
            body.map(lambda b: ["w = 0", "while w < 3:", "    w += 1", *indent(b)]),
            body.map(lambda b: ["for x, (y, *z) in [(1, (2, 3)), (4, (5,))]:", *indent(b)]),
            st.tuples(body, body, body).map(
                lambda p: [
                    "try:",
                    *indent(p[0]),
                    "except (ZeroDivisionError, TypeError, ValueError) as exc:",
                    "    x = str(exc)",
                    *indent(p[1]),
                    "finally:",
                    *indent(p[2]),
                ]
            ),
            st.tuples(e, body).map(lambda p: ["try:", f"    return {p[0]}", "finally:", *indent(p[1])]),
            st.tuples(e, e, t, t, body).map(
                lambda p: [
                    f"with nullcontext({p[0]}) as {p[2]}, cfg.ctx({p[1]}) as {p[3]}:",
                    *indent(p[4]),
                ]
            ),
            st.tuples(e, body, body, body).map(
                lambda p: [
                    f"match {p[0]}:",
                    "    case 1 | 2 | 's':",
                    *indent(p[1], 2),
                    "    case [first, *rest]:",
                    "        x = (first, rest)",
                    "    case {'k': found}:",
                    *indent(p[2], 2),
                    "    case str() as text if text:",
                    "        y = text",
                    "    case _:",
                    *indent(p[3], 2),
                ]
            ),
            st.tuples(e, t).map(
                lambda p: [
                    f"def inner(q={p[0]}):",
                    "    nonlocal x",
                    "    x = q",
                    "    return x",
                    f"{p[1]} = inner()",
                ]
            ),
            # break / continue / return inside finally, in a loop.
            st.tuples(e, body, st.sampled_from(["break", "continue", "return x"])).map(
                lambda p: [
                    "for i in range(3):",
                    "    try:",
                    *indent(p[1], 2),
                    "    finally:",
                    f"        if {p[0]}:",
                    f"            {p[2]}",
                ]
            ),
            st.tuples(e, e, t, t, body).map(
                lambda p: [
                    f"with (nullcontext({p[0]}) as {p[2]},",
                    f"      cfg.ctx({p[1]}) as {p[3]}):",
                    *indent(p[4]),
                ]
            ),
            st.tuples(e, body, body).map(
                lambda p: [
                    f"match {p[0]}:",
                    "    case SimpleNamespace(lr=float() as lr) if lr > 0:",
                    "        x = lr",
                    "    case {'k': 2, **others}:",
                    *indent(p[1], 2),
                    "    case (1, *middle, last) | [*middle, last, 'ab']:",
                    "        y = (middle, last)",
                    "    case int(n) | str(n) if n:",
                    *indent(p[2], 2),
                ]
            ),
            # Nested closures two deep, nonlocal at each level, and global in a nested function.
            st.tuples(e, t).map(
                lambda p: [
                    "def outer(q):",
                    "    nonlocal y",
                    "    def innermost():",
                    "        nonlocal q",
                    "        global G",
                    f"        q = (q, {p[0]})",
                    "        G = len(q)",  # (not q: q holds str(G), and G would grow exponentially)
                    "        return q",
                    "    y = innermost()",
                    "    return y",
                    f"{p[1]} = outer(x)",
                ]
            ),
            st.tuples(t, e, body).map(
                lambda p: ["for i in range(2):", f"    {p[0]} = {p[1]}", *indent(p[2]), f"    del {p[0]}"]
            ),
            *(
                [
                    st.tuples(e, body).map(
                        lambda p: [
                            "try:",
                            f"    raise ExceptionGroup('g', [ValueError({p[0]}), KeyError(1)])",
                            "except* ValueError as group:",
                            "    x = repr(group.exceptions)",
                            *indent(p[1]),
                            "except* KeyError:",
                            "    y = 1",
                        ]
                    )
                ]
                if sys.version_info >= (3, 11)
                else []
            ),
        )

    def extend_async(block: st.SearchStrategy[List[str]]) -> st.SearchStrategy[List[str]]:
        body = st.lists(block, min_size=1, max_size=3).map(
            lambda parts: [ln for part in parts for ln in part]
        )
        return st.one_of(
            extend(block),
            st.tuples(t, body).map(lambda p: [f"async with Manager() as {p[0]}:", *indent(p[1])]),
            st.tuples(t, body).map(lambda p: [f"async for {p[0]} in ticks(2):", *indent(p[1])]),
        )

    return st.recursive(leaf, extend_async if is_async else extend, max_leaves=6)


PRELUDE = """\
import math
from contextlib import nullcontext
from types import SimpleNamespace
G = 0
cfg = SimpleNamespace(
    lr=0.5,
    fn=lambda *p, **k: (p, k),
    ctx=nullcontext,
    sub=SimpleNamespace(k=2, pair=lambda *p, **k: (p, sorted(k))),
)

class Step:
    def __init__(self, value):
        self.value = value

    def __await__(self):
        got = yield self.value
        return (self.value, got)

class Manager:
    async def __aenter__(self):
        entered = await Step("in")
        return entered

    async def __aexit__(self, *exc_info):
        left = await Step("out")
        return False

def failing(v):
    first = yield v
    if first is None:
        raise ValueError(v)
    return first

async def ticks(n):
    for tick in range(n):
        got = await Step(tick)
        yield got

class Base:
    v = 3
    items = [1, 2]

    def m(self, a, b=None):
        return (a, b)
"""


@st.composite
def generated_functions(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["def", "async def", "method", "staticmethod", "classmethod"]))
    is_async = kind == "async def"
    with_self = kind == "method"
    body = draw(st.lists(_statements(with_self, is_async), min_size=1, max_size=5))
    # Padding: many locals (indexes past 16 and 256, where Python 3.13 pairs and
    # EXTENDED_ARG begin) and a loop long enough that probes push its jumps far.
    pad = draw(st.one_of(st.just(0), st.integers(1, 40), st.integers(250, 300)))
    padding = ["for i in range(2):", *(f"    p{j} = i + {j}" for j in range(pad))]
    if pad:
        padding += [f"    p{pad - 1}, x = x, p{pad - 1}", f"    y = p{pad // 2} + p0"]
    lines = ["global G", "x = a", "y = b", "z = None"] + (padding if pad else [])
    lines += [line for part in body for line in part]
    if with_self:
        lines.append("r = super().m(a, b)")
    lines.append("return locals()")
    head = {"method": "def m(self, a, b=None):", "staticmethod": "def m(a, b=None):"}.get(
        kind, "def m(cls, a, b=None):" if kind == "classmethod" else f"{kind} f(a, b=None):"
    )
    function = [head] + ["    " + line for line in lines]
    if kind in ("def", "async def"):
        return PRELUDE + "\n" + "\n".join(function) + "\n"
    decorator = [f"@{kind}"] if kind != "method" else []
    klass = ["class C(Base):", "    v = 5"] + ["    " + line for line in decorator + function]
    return PRELUDE + "\n" + "\n".join(klass) + "\n"


@settings(SETTINGS, max_examples=EXAMPLES)
@given(generated_functions())
def test_generated_functions_are_unchanged_by_probes(source: str) -> None:
    if not compiles(source):
        hypothesis.reject()  # e.g. a walrus that rebinds a comprehension variable
    report = check_program(source)
    assert report is not None, "a generated function (bounded loops only) timed out unprobed"
    assert report["probed"]["probes"] > 0 and report["probed"]["fired"] > 0


# --- tricky constructs, deterministically -------------------------------------------

TRICKY: Dict[str, str] = {
    "try/finally with return inside": """
        def f(a, b=None):
            try:
                x = a
                return x
            finally:
                y = 2
                if a == 0:
                    return y

        def g(a, b=None):
            for i in range(3):
                try:
                    if i == 1:
                        continue
                    if i == 2:
                        return i
                finally:
                    x = i
            return -1
    """,
    "nested comprehensions and walrus in comprehension": """
        def f(a, b=None):
            x = [[(y := i * j) for j in range(3)] for i in range(3)]
            z = {k: [v for v in range(k)] for k in range(3)}
            s = {i for i in range(4) if (t := i) % 2}
            x = [x for x in range(3)]
            return x, y, z, s, t
    """,
    "match with or-patterns and captures": """
        def f(a, b=None):
            match (a, b):
                case (1 | 0 | -2 as n, None):
                    out = ("small", n)
                case (str() as s, *rest):
                    out = ("str", s, rest)
                case {"k": found, **others}:
                    out = found, others
                case [x, y] if x == y:
                    out = x
                case _:
                    out = None
            return out
    """,
    "async functions": """
        class Step:
            def __await__(self):
                got = yield 1
                return got

        async def f(a, b=None):
            x = await Step()
            y = [a async for a in agen(a)]
            return x, y

        async def agen(a):
            for i in range(2):
                z = i
                yield a, z
    """,
    "generators with send and throw": """
        def gen(a, b=None):
            total = 0
            while True:
                try:
                    got = yield total
                except ValueError as exc:
                    got = str(exc)
                if got is None:
                    return total
                total = (total, got)

        def drive():
            g = gen(1)
            first = next(g)
            second = g.send("x")
            third = g.throw(ValueError("bad"))
            try:
                g.send(None)
            except StopIteration as stop:
                last = stop.value
            return first, second, third, last

        def delegate(a, b=None):
            inner = yield from gen(a)
            return inner
    """,
    "global and nonlocal": """
        counter = 0

        def f(a, b=None):
            global counter
            counter += 1
            x = a
            def bump(step=1):
                nonlocal x
                x = (x, step)
                return x
            y = bump()
            y = bump(2)
            return counter, x, y
    """,
    "del of locals": """
        def f(a, b=None):
            x = a
            del x
            try:
                return x
            except UnboundLocalError as exc:
                y = str(exc)
            x = 2
            del a
            return x, y
    """,
    "star-unpacking": """
        def f(a, b=None):
            x, *y = [a, b, 3]
            *z, w = range(3)
            (p, *q), r = (1, 2, 3), 4
            first, *_, last = "hello"
            return x, y, z, w, p, q, r, first, last
    """,
    "chained comparisons": """
        def f(a, b=None):
            x = 0 < 1 <= 2 != 3
            y = a == a is not None
            z = 1 < 2 < a if isinstance(a, int) else None
            return x, y, z
    """,
    "with-statements with multiple items": """
        from contextlib import contextmanager, nullcontext

        @contextmanager
        def ctx(v):
            entered = v
            try:
                yield entered
            finally:
                left = entered

        def f(a, b=None):
            with ctx(a) as x, nullcontext(b) as y, ctx(3):
                z = (x, y)
            with (ctx(1) as p,
                  ctx(2) as q):
                r = p + q
            return z, r
    """,
    "lambda defaults": """
        def f(a, b=None):
            x = 1
            g = lambda v=x, w=a: (v, w)
            h = lambda *args, k=b, **kw: (args, k, kw)
            y = [(lambda i=i: i)() for i in range(3)]
            return g(), h(1, k=2), y
    """,
    "class bodies with methods using super()": """
        class Base:
            def __init__(self, v=1):
                self.v = v

            def m(self, a, b=None):
                return ("base", a)

        class Child(Base):
            def __init__(self, v=2):
                super().__init__(v)
                self.w = self.v * 2

            def m(self, a, b=None):
                first = super().m(a)
                second = self.v
                return first, second, self.w

            @classmethod
            def make(cls, a=1):
                made = cls(a)
                return made.m(a)

            @staticmethod
            def helper(a, b=None):
                out = [a, b]
                return out

            @property
            def double(self):
                twice = self.v * 2
                return twice
    """,
    "closures and cell variables": """
        def f(a, b=None):
            x = a
            def inner():
                return x
            x = (x, 1)
            y = inner()
            return y, [inner for _ in range(2)][0]()
    """,
    "exceptions as variables": """
        def f(a, b=None):
            try:
                x = 1 // a
            except ZeroDivisionError as e:
                x = str(e)
            except TypeError as e:
                x = type(e).__name__
            try:
                raise KeyError(a)
            except KeyError as e:
                y = e.args
            return x, y
    """,
    "attribute chains rooted at globals and builtins, and their calls": """
        import math
        from contextlib import nullcontext
        from types import SimpleNamespace

        cfg = SimpleNamespace(lr=0.5, fn=lambda *p, **k: (p, k), sub=SimpleNamespace(k=2))
        G = None

        def f(a, b=None):
            global G
            cfg.sub.k += 1
            x = math.floor(math.sqrt(cfg.sub.k + cfg.lr)), len.__name__
            y = cfg.fn(*cfg.fn(a), *[b], k=math.pi, **{"q": cfg.sub.k})
            z = [cfg.fn(i, k=cfg.lr) for i in range(2) if i or cfg.sub.k]
            with nullcontext(cfg.fn(a)) as w:
                G = cfg.sub
            try:
                v = cfg.missing.attr
            except AttributeError as e:
                v = str(e)
            return x, y, z, w, G.k, v, a and cfg.lr or math.e, -cfg.sub.k % 7

        def gen(a, b=None):
            got = cfg.fn((yield cfg.lr), k=(yield math.pi))
            return got

        def undefined(a, b=None):
            x = cfg.lr
            return nothere.attr(x)
    """,
    "async with, async for and async comprehensions": """
        class Step:
            def __init__(self, value):
                self.value = value

            def __await__(self):
                got = yield self.value
                return (self.value, got)

        class Manager:
            async def __aenter__(self):
                entered = await Step("in")
                return entered

            async def __aexit__(self, *exc_info):
                left = await Step("out")
                return exc_info[0] is KeyError

        async def ticks(n):
            for tick in range(n):
                got = await Step(tick)
                yield got

        async def f(a, b=None):
            async with Manager() as x:
                z = [t async for t in ticks(2) if t]
                w = {t: await Step(t) for t in (a,)}
            async for t in ticks(3):
                if t:
                    last = t
                    break
            else:
                last = None
            async with Manager():
                raise KeyError(a)
            return x, z, w, last

        async def g(a, b=None):
            gen = (t async for t in ticks(2))
            first = await gen.__anext__()
            return first, [s async for s in gen]
    """,
    "yield from a generator that raises or returns": """
        def inner(a):
            got = yield a
            if got is None:
                raise ValueError(a)
            return got

        def f(a, b=None):
            try:
                x = yield from inner(a)
            except ValueError as exc:
                x = ("caught", str(exc))
            y = yield from inner(b)
            return x, y

        def drive(a, b=None):
            g = f(a)
            first = next(g)
            second = g.send(None)
            try:
                g.send("v")
            except StopIteration as stop:
                last = stop.value
            return first, second, last

        def thrown(a, b=None):
            g = f(a)
            next(g)
            try:
                g.throw(KeyError(a))
            except KeyError as exc:
                out = exc.args
            return out
    """,
    "break, continue and return in finally": """
        def f(a, b=None):
            out = []
            for i in range(4):
                try:
                    if i == 1:
                        raise ValueError(i)
                    out.append(i)
                finally:
                    x = i
                    if i == 1:
                        continue
                    if i == 3:
                        break
            while True:
                try:
                    return out, x
                finally:
                    y = a
                    break
            try:
                raise KeyError(a)
            finally:
                return out, x, y
    """,
    "match with class, mapping, star patterns and guards": """
        class Point:
            __match_args__ = ("x", "y")

            def __init__(self, x=0, y=0):
                self.x, self.y = x, y

        def f(a, b=None):
            out = []
            for subject in (Point(a, 2), {"k": a, "rest": 1}, [a, 2, 3, 4], (a,), "ab", 3.5, None):
                match subject:
                    case Point(x=0 | 1 as px, y=py) if py > 1:
                        got = ("point", px, py)
                    case Point(px, py):
                        got = ("other point", px, py)
                    case {"k": int(k), **rest} if k:
                        got = ("map", k, rest)
                    case [first, *middle, last] if len(middle) > 1:
                        got = ("seq", first, middle, last)
                    case (only,):
                        got = ("one", only)
                    case str(s) | float(s):
                        got = ("scalar", s)
                    case _:
                        got = None
                out.append(got)
            return out
    """,
    "zero-argument super() in nested classes": """
        class Base:
            def m(self, a, b=None):
                return ("base", a)

        def make(a, b=None):
            class Outer(Base):
                class Inner(Base):
                    def m(self, a, b=None):
                        got = super().m(a)
                        return ("inner", got)

                def m(self, a, b=None):
                    first = super().m(a)
                    second = self.Inner().m(b)
                    return first, second

            made = Outer()
            return made.m(a, b), __class__ if False else None

        class Holder:
            class Nested(Base):
                def m(self, a, b=None):
                    got = super().m(a)
                    return got, __class__.__name__

            def m(self, a, b=None):
                x = self.Nested().m(a)
                return x
    """,
    "conditional imports, del of locals in loops, global in nested functions": """
        G = 0

        def f(a, b=None):
            if a:
                import math as m
            else:
                from os import path as m
            x = m.__name__
            for i in range(3):
                y = i * 2
                if i == 1:
                    del y
                    continue
                z = y
            try:
                w = y
            except NameError as exc:
                w = str(exc)

            def bump(step):
                global G
                G += step
                return G

            v = bump(a if isinstance(a, int) else 1)
            return x, z, w, v
    """,
    "augmented assignment to subscripts and attributes": """
        from types import SimpleNamespace

        ns = SimpleNamespace(count=1, items=[1, 2])

        def f(a, b=None):
            x = [1, 2, 3]
            x[0] += a if isinstance(a, int) else 5
            x[1:] *= 2
            d = {"k": 1}
            d["k"] -= 3
            d.setdefault("j", [])
            d["j"] += [b]
            o = SimpleNamespace(v=2, w=SimpleNamespace(u=3))
            o.v **= 2
            o.w.u //= 2
            ns.count += 1
            ns.items[0] += 10
            return x, d, o, ns.count, ns.items
    """,
    "generator expressions as the only argument, decorators with calls": """
        import functools

        def tag(label, times=1):
            def decorate(func):
                @functools.wraps(func)
                def wrapper(*args, **kwargs):
                    result = func(*args, **kwargs)
                    return (label * times, result)
                return wrapper
            return decorate

        @tag("t", times=2)
        @functools.cache
        def f(a, b=None):
            x = sum(i for i in range(3))
            y = tuple(str(j) for j in (a, b))
            z = max(k * 2 for k in range(4) if k != a)
            return x, y, z
    """,
    "deeply nested closures with nonlocal": """
        def f(a, b=None):
            x = a
            def level1():
                y = 1
                def level2():
                    nonlocal x, y
                    def level3():
                        nonlocal x
                        x = (x, "l3")
                        return x
                    y = (y, level3())
                    return y
                out = level2()
                return out, y
            first = level1()
            lam = lambda q=x: (q, x)
            return first, x, lam()
    """,
    "return inside a try whose finally raises, in a loop whose finally continues": """
        def f(a, b=None):
            for i in range(3):
                try:
                    try:
                        return a
                    finally:
                        raise ValueError(a)
                finally:
                    if a:
                        continue
            return i
    """,
}

if sys.version_info >= (3, 11):
    TRICKY["exception groups and except*"] = """
        def f(a, b=None):
            try:
                raise ExceptionGroup("many", [ValueError(a), TypeError(b)])
            except* ValueError as group:
                x = [str(e) for e in group.exceptions]
            except* TypeError as group:
                y = len(group.exceptions)
            return x, y

        def g(a, b=None):
            try:
                try:
                    raise ExceptionGroup("one", [KeyError(a)])
                except* ValueError:
                    x = 1
            except ExceptionGroup as outer:
                z = repr(outer.exceptions)
            return z
    """


if sys.version_info >= (3, 12):
    TRICKY.update(
        {
            "type parameters and type aliases (PEP 695)": """
            type Pair[T] = tuple[T, T]

            def first[T](a: T, b: T | None = None) -> T:
                x: T = a
                alias = Pair[int]
                return x, alias.__value__ if hasattr(alias, "__value__") else str(alias)

            class Box[T]:
                def __init__(self, value: T = 1) -> None:
                    self.value = value

                def m[S](self, a: S, b=None) -> tuple[T, S]:
                    pair = (self.value, a)
                    return pair

            def f(a, b=None):
                type Local[U] = list[U]
                box = Box[int](a)
                return box.m(b), Local.__name__, first(a)
        """,
            "nested f-strings with the same quotes (PEP 701)": """
            def f(a, b=None):
                x = f"{f"{a!r}"!s:>6}"
                y = f"{"-".join(f"{v}" for v in (a, b))}"
                z = f"{a=}, {f'{b!r}'}, {'\\n'.join(['p', 'q'])!r}"
                return x, y, z
        """,
        }
    )


@pytest.mark.parametrize("construct", sorted(TRICKY))
def test_tricky_constructs_are_unchanged_by_probes(construct: str) -> None:
    source = textwrap.dedent(TRICKY[construct])
    report = check_program(source)
    assert report is not None, "a hand-written program timed out unprobed"
    assert report["probed"]["probes"] > 0 and report["probed"]["fired"] > 0
    # Something ran to the end (not every call raised), so the comparison covers real results.
    assert any(outcome[1][0] != "raise" for outcome in report["plain"]["calls"]), report["plain"]["calls"]


def test_the_harness_sees_a_difference() -> None:
    """The comparison is not vacuous: a program whose outcome depends on its code object differs."""
    source = "def f(a, b=None):\n    x = a\n    return len(f.__code__.co_code)\n"
    report = differential(source)
    assert report["status"] == "done"
    assert report["plain"]["calls"] != report["probed"]["calls"]
    assert report["probed"]["problems"] == []


def test_the_harness_survives_programs_that_hang_or_die() -> None:
    assert differential("while True:\n    pass\n")["status"] == "slow"
    died = differential("import os\nos._exit(3)\n")
    assert died["status"] == "crash" and "child died" in died["detail"]


def test_a_probed_run_that_hangs_is_reported_with_where_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the probed run loops (f's code differs while a recording takes its probes).
    source = textwrap.dedent(
        """
        def f(a, b=None):
            x = a
            return x

        SIZE = len(f.__code__.co_code)

        def g(a, b=None):
            while len(f.__code__.co_code) != SIZE:
                pass
            return a
        """
    )
    monkeypatch.setattr(sys.modules[__name__], "PROBED_TIMEOUT", 2.0)
    report = differential(source)
    assert report["status"] == "timeout" and report["phase"] == "probed"
    # The loop is lines 9-10; which of them the sampled frame is on depends on when the dump came.
    assert re.search(r'File "<generated>", line (9|10) in g\n', report["stacks"]), report["stacks"]
