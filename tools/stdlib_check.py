"""Run CPython's own regression tests with every recordable site of a module probed.

For each chosen standard-library module this tool

1. patches, in place (:func:`bcrecord.patch_function`, so that every reference
   fires, ``from mod import f`` in the test suite included), every Python function
   and method the module defines -- module-level functions, methods of its
   classes (static and class methods, property accessors, nested classes) and
   functions behind ``functools.wraps``/``lru_cache`` wrappers -- with *every*
   spec :func:`bcrecord.targets` lists for it (each assignment of each local,
   each attribute-chain load site, each call result and binary operator, every
   return);
2. re-instruments the module each time it is imported again, so the pure-Python
   copies that the tests make with ``import_fresh_module(..., blocked=['_json'])``
   (json, heapq, bisect, functools, operator, ...) are probed too;
3. loads and runs the module's regression tests (``test.test_<module>``, from the
   ``test`` package that ships with the interpreter, through :mod:`unittest`, with
   no ``-u`` resources, like ``python -m test``) inside an active
   ``bcrecord.recording(copy='none', keep='last')``;
4. runs the same tests again in a fresh process with no instrumentation (bcrecord
   not even imported), and compares the outcome of every single test.

Each run is a subprocess of its own (isolation, a timeout). A third run, the same
as the instrumented one except that its recording counts probe events and keeps
no value (its sinks append to ``functools.partial(next, itertools.count())``, C
code the inserted probes call directly: no Python frame per event). As that run
keeps no object alive, a difference of the instrumented run that it does not show
is caused by the recording holding on to the last value of each key
(``copy='none'`` keeps the object itself); the table shows how many in brackets
as "retention".

The report is a table: functions instrumented, functions with no recordable site,
functions that could not be patched (listed below the table with the error),
probes inserted (the sum of ``len(patch.keys)``), distinct keys that fired, probe
events, tests run, failures+errors with and without instrumentation, seconds, and
the number of tests whose outcome differs (each listed below the table with its
traceback). The goal is no difference at all: any difference or crash is a bug in
bcrecord, or a documented limit of it.

Usage (from anywhere; the repository root is put on ``sys.path`` here)::

    python tools/stdlib_check.py                    # every module, this interpreter
    python tools/stdlib_check.py --quick            # a subset for CI (< 2 minutes)
    python tools/stdlib_check.py --modules json,enum --json
    python tools/stdlib_check.py --python /tmp/v3.10.13/bin/python --python /tmp/v3.13.0/bin/python

Exit status: 0 when no module differs, 1 otherwise.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.abc
import importlib.machinery
import io
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback
import types
import unittest
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# --- what to check -------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One row of the report: the modules to instrument and the tests to run."""

    name: str
    modules: Tuple[str, ...]
    tests: str
    min_version: Tuple[int, int] = (3, 10)
    #: Modules that not every supported version has (``_pydatetime`` is 3.12+).
    optional: Tuple[str, ...] = ()


def _t(
    name: str,
    modules: Sequence[str] = (),
    tests: str = "",
    min_version: Tuple[int, int] = (3, 10),
    optional: Sequence[str] = (),
) -> Target:
    return Target(name, tuple(modules) or (name,), tests or f"test.test_{name}", min_version, tuple(optional))


TARGETS: Dict[str, Target] = {
    t.name: t
    for t in (
        _t("json", ["json", "json.decoder", "json.encoder", "json.scanner", "json.tool"]),
        _t("textwrap"),
        _t("difflib"),
        _t("fractions"),
        _t("statistics"),
        _t("heapq"),
        _t("bisect"),
        _t("shlex"),
        _t("string"),
        _t("base64"),
        _t("colorsys"),
        _t("ipaddress"),
        _t("calendar"),
        _t("configparser"),
        _t("csv"),
        _t("dataclasses"),
        _t("enum"),
        _t("functools"),
        _t("pprint"),
        _t("tomllib", ["tomllib", "tomllib._parser", "tomllib._re", "tomllib._types"], min_version=(3, 11)),
        _t("operator"),
        _t("copy"),
        _t("graphlib"),
        _t("fnmatch"),
        _t("html", ["html", "html.parser", "html.entities"], tests="test.test_htmlparser"),
        _t("urllib.parse", tests="test.test_urlparse"),
        _t("argparse"),
        _t("collections", ["collections", "collections.abc"]),
        _t("gettext"),
        _t("random"),
        _t("contextlib"),
        _t("contextlib_async", ["contextlib"], tests="test.test_contextlib_async"),
        _t("tokenize"),
        _t("typing"),
        _t("inspect"),
        _t("ast"),
        _t("datetime", ["datetime", "_pydatetime", "_strptime"], optional=["_pydatetime"]),
        _t("pickle"),
    )
}

# Fast modules with no known difference on any supported version (for CI).
QUICK = (
    "json",
    "textwrap",
    "heapq",
    "bisect",
    "shlex",
    "string",
    "base64",
    "colorsys",
    "fractions",
    "operator",
    "csv",
    "dataclasses",
    "copy",
    "graphlib",
    "fnmatch",
    "html",
    "contextlib",
    "ipaddress",
)

#: Quick modules left out from a version on, where their own tests check that an object is
#: freed which the recording's last value keeps (a retention difference, see the report):
#: 3.14's test_dataclasses has test_original_class_is_gced.
NOT_QUICK_FROM: Dict[str, Tuple[int, int]] = {"dataclasses": (3, 14)}

# Resources the tests may use; like ``python -m test`` without ``-u``, none.
DEFAULT_RESOURCES: Tuple[str, ...] = ()


# --- results -----------------------------------------------------------------


@dataclass
class RunResult:
    """What one child process reports."""

    target: str
    mode: str  # 'plain' | 'instrumented'
    python: str = ""
    ok: bool = False  # the child ran to the end and reported
    crash: str = ""  # why it did not (exit status, timeout, traceback)
    seconds: float = 0.0
    tests_run: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0
    expected_failures: int = 0
    unexpected_successes: int = 0
    outcomes: Dict[str, str] = field(default_factory=dict)  # test id -> outcome (non-'ok' only)
    details: Dict[str, str] = field(default_factory=dict)  # test id -> traceback (failures/errors)
    functions: int = 0
    no_sites: int = 0
    unpatchable: List[str] = field(default_factory=list)  # 'qualname: error'
    probes_inserted: int = 0
    keys_fired: int = 0
    events: int = 0
    recording_errors: List[str] = field(default_factory=list)
    modules_instrumented: List[str] = field(default_factory=list)


class _Result(unittest.TextTestResult):
    """A result that also remembers every test's outcome by id."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: Dict[str, str] = {}
        self.details: Dict[str, str] = {}

    def _note(self, test: Any, outcome: str, err: Any = None) -> None:
        key = test.id() if hasattr(test, "id") else str(test)
        # A subtest's parameters may print with an address, each process's own.
        key = re.sub(r" at 0x[0-9a-fA-F]+>", ">", key)
        self.outcomes[key] = outcome
        if err is not None:
            self.details[key] = "".join(traceback.format_exception(*err))[-4000:]

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._note(test, "failure", err)

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._note(test, "error", err)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            kind = "failure" if issubclass(err[0], test.failureException) else "error"
            self._note(subtest, kind, err)

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._note(test, "skip")

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._note(test, "expected failure")

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._note(test, "unexpected success")


# --- instrumentation (child side) ---------------------------------------------


def _candidates(obj: Any) -> Iterator[Any]:
    """Function-bearing things inside one class attribute or module global."""
    if isinstance(obj, (staticmethod, classmethod)):
        yield obj.__func__
        return
    yielded = False
    for attr in ("fget", "fset", "fdel"):  # property, enum.property, DynamicClassAttribute
        inner = getattr(obj, attr, None) if not isinstance(obj, type) else None
        if isinstance(inner, types.FunctionType):
            yielded = True
            yield inner
    if yielded:
        return
    if isinstance(obj, types.FunctionType):
        yield obj
        return
    if isinstance(obj, type) or isinstance(obj, types.ModuleType):
        return
    for attr in ("func", "__func__", "__wrapped__"):  # cached_property, partialmethod, lru_cache
        try:
            inner = getattr(obj, attr, None)
        except Exception:
            continue
        if isinstance(inner, types.FunctionType):
            yield inner
            return


class Instrumenter:
    """Patches every function of a module in place, with every recordable site."""

    def __init__(self) -> None:
        import bcrecord
        from bcrecord.patch import function_of

        self._bcrecord = bcrecord
        self._function_of = function_of
        self.patches: List[Any] = []
        self.seen: Set[int] = set()
        self.keep_alive: List[Any] = []
        self.functions = 0
        self.no_sites = 0
        self.unpatchable: List[str] = []
        self.modules: List[str] = []
        self._owners: Set[Tuple[str, str]] = set()
        self._generation: Dict[str, int] = {}
        self._instrumented_modules: Set[int] = set()

    def module(self, module: types.ModuleType) -> None:
        """Instrument one module object (once; a re-imported copy counts as new)."""
        if id(module) in self._instrumented_modules:
            return
        self._instrumented_modules.add(id(module))
        self.keep_alive.append(module)
        name = module.__name__
        generation = self._generation.get(name, 0)
        self._generation[name] = generation + 1
        prefix = name if generation == 0 else f"{name}#{generation}"
        self.modules.append(prefix)
        for qualname, func in self._functions(module):
            self._patch(prefix, qualname, func)

    def _functions(self, module: types.ModuleType) -> Iterator[Tuple[str, types.FunctionType]]:
        name = module.__name__
        classes: List[type] = []
        found: List[Tuple[str, Any]] = []
        for value in list(vars(module).values()):
            if isinstance(value, type):
                if value.__module__ == name:
                    classes.append(value)
            else:
                found += [(getattr(f, "__qualname__", "?"), f) for f in _candidates(value)]
        seen_classes: Set[int] = set()
        while classes:
            cls = classes.pop(0)
            if id(cls) in seen_classes:
                continue
            seen_classes.add(id(cls))
            for value in list(vars(cls).values()):
                if isinstance(value, type):
                    if value.__module__ == name and value.__qualname__.startswith(cls.__qualname__ + "."):
                        classes.append(value)
                    continue
                found += [(getattr(f, "__qualname__", "?"), f) for f in _candidates(value)]
        for qualname, obj in found:
            try:
                func = self._function_of(obj)
            except Exception:
                continue  # a builtin: nothing to patch
            if func.__module__ != name or id(func) in self.seen:
                continue
            self.seen.add(id(func))
            self.keep_alive.append(func)
            yield qualname, func

    def _owner(self, prefix: str, func: types.FunctionType) -> str:
        scope = func.__qualname__.rpartition(".")[0]
        owner = f"{prefix}.{scope}" if scope else prefix
        candidate, n = owner, 1
        while (candidate, func.__code__.co_name) in self._owners:
            n += 1
            candidate = f"{owner}~{n}"
        self._owners.add((candidate, func.__code__.co_name))
        return candidate

    def _patch(self, prefix: str, qualname: str, func: types.FunctionType) -> None:
        bcrecord = self._bcrecord
        label = f"{prefix}:{func.__qualname__}"
        try:
            specs = bcrecord.targets(func).specs()
        except Exception as error:
            self.unpatchable.append(f"{label}: targets(): {type(error).__name__}: {error}")
            return
        if not specs:
            self.no_sites += 1
            return
        try:
            patch = bcrecord.patch_function(func, specs, name=self._owner(prefix, func))
        except Exception as error:
            self.unpatchable.append(f"{label}: {type(error).__name__}: {error}")
            return
        self.functions += 1
        self.patches.append(patch)

    @property
    def probes(self) -> int:
        return sum(len(p.keys) for p in self.patches)


class _Reinstrument(importlib.abc.MetaPathFinder):
    """Instruments chosen modules every time they are executed (fresh imports too)."""

    def __init__(self, names: Set[str], instrumenter: Instrumenter) -> None:
        self.names = names
        self.instrumenter = instrumenter

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if not isinstance(
            loader, (importlib.machinery.SourceFileLoader, importlib.machinery.SourcelessFileLoader)
        ):
            return spec
        original: Callable[[types.ModuleType], None] = loader.exec_module
        instrumenter = self.instrumenter

        def exec_module(module: types.ModuleType) -> None:
            original(module)
            instrumenter.module(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _load_tests(name: str) -> unittest.TestSuite:
    from test import support

    support.verbose = 0
    support.use_resources = list(DEFAULT_RESOURCES)
    return unittest.defaultTestLoader.loadTestsFromName(name)


def _run_suite(suite: unittest.TestSuite, result: RunResult) -> None:
    stream = io.StringIO()
    runner = unittest.TextTestRunner(stream=stream, verbosity=0, resultclass=_Result)
    outcome = runner.run(suite)
    assert isinstance(outcome, _Result)
    result.tests_run = outcome.testsRun
    result.failures = len(outcome.failures)
    result.errors = len(outcome.errors)
    result.skipped = len(outcome.skipped)
    result.expected_failures = len(outcome.expectedFailures)
    result.unexpected_successes = len(outcome.unexpectedSuccesses)
    result.outcomes = outcome.outcomes
    result.details = outcome.details


MODES = ("plain", "instrumented", "counted")


def _counting_recording(events: Iterator[int]) -> Any:
    """A recording that counts every probe event in C and keeps no value.

    Each site's sink appends to an object whose ``append`` is
    ``functools.partial(next, events)``: the inserted code calls it directly, so
    counting runs no Python frame, and nothing recorded stays alive.
    """
    from bcrecord.runtime import Recording, Sink

    class Counter:
        __slots__ = ("append",)

        def __init__(self, events: Iterator[int]) -> None:
            self.append = functools.partial(next, events)

    class CountingSink(Sink):
        __slots__ = ("counter",)

        def direct(self) -> Any:
            return self.counter

    class CountingRecording(Recording):
        def __init__(self, events: Iterator[int]) -> None:
            super().__init__(copy="none", keep="last")
            self._counter = Counter(events)

        def _sink(self, site_id: int, owner: Optional[str] = None) -> Optional[Sink]:
            sink = super()._sink(site_id, owner)
            if sink is None:
                return None
            counting = CountingSink(self, sink.key, sink.store, "none")
            counting.counter = self._counter
            return counting

    return CountingRecording(events)


def child(target: Target, mode: str) -> RunResult:
    """Run one target's tests in this process.

    ``plain``: no instrumentation, bcrecord not imported. ``instrumented``: every
    function patched, tests run inside ``recording(copy='none', keep='last')``.
    ``counted``: the same, with a recording that counts probe events in C code
    (``functools.partial(next, itertools.count())``, no Python frame per event) and
    keeps no value; so a difference that this run does not show is caused by
    retention of recorded values.
    """
    result = RunResult(target=target.name, mode=mode, python=sys.version.split()[0])
    start = time.perf_counter()
    if mode == "plain":
        suite = _load_tests(target.tests)
        _run_suite(suite, result)
    else:
        import bcrecord

        instrumenter = Instrumenter()
        sys.meta_path.insert(0, _Reinstrument(set(target.modules), instrumenter))
        for name in target.modules:
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError:
                if name in target.optional:
                    continue
                raise
            instrumenter.module(module)
        events = itertools.count()
        if mode == "counted":
            rec: Any = _counting_recording(events)
        else:
            rec = bcrecord.recording(copy="none", keep="last")
        # Load the tests inside the recording too: IsolatedAsyncioTestCase (3.13's
        # test_contextlib_async) runs each test in a context copied when the
        # TestCase is made, and a recording reaches only contexts it was entered in.
        with rec:
            suite = _load_tests(target.tests)
            _run_suite(suite, result)
        result.functions = instrumenter.functions
        result.no_sites = instrumenter.no_sites
        result.unpatchable = instrumenter.unpatchable
        result.probes_inserted = instrumenter.probes
        result.keys_fired = len(rec.keys())
        result.events = next(events) if mode == "counted" else 0
        result.recording_errors = [f"{e.key}: {type(e.error).__name__}: {e.error}" for e in rec.errors[:50]]
        result.modules_instrumented = instrumenter.modules
    result.seconds = round(time.perf_counter() - start, 2)
    result.ok = True
    return result


# --- the parent side ------------------------------------------------------------


def _python_version(python: str) -> Tuple[int, int, str]:
    out = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[0], sys.version_info[1], sys.version.split()[0])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]), int(out[1]), out[2]


def run_child(python: str, target: Target, mode: str, timeout: float) -> RunResult:
    """Run one (target, mode) in a subprocess and read back its report."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            python,
            str(Path(__file__).resolve()),
            "--child",
            target.name,
            "--mode",
            mode,
            "--result",
            str(out),
        ]
        env = dict(os.environ, PYTHONHASHSEED="0", PYTHONDONTWRITEBYTECODE="1")
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp, env=env)
        except subprocess.TimeoutExpired:
            return RunResult(target.name, mode, crash=f"timeout after {timeout:.0f} s", seconds=timeout)
        if out.exists():
            return RunResult(**json.loads(out.read_text()))
        tail = (proc.stdout[-1500:] + "\n" + proc.stderr[-3000:]).strip()
        seconds = round(time.perf_counter() - start, 2)
        return RunResult(target.name, mode, crash=f"exit status {proc.returncode}: {tail}", seconds=seconds)


def differences(plain: RunResult, other: RunResult) -> List[str]:
    """How ``other`` differs from ``plain``: crashes, test counts, each test's outcome."""
    if not plain.ok:
        return [f"plain run crashed: {plain.crash}"]
    if not other.ok:
        return [f"{other.mode} run crashed: {other.crash}"]
    found: List[str] = []
    if plain.tests_run != other.tests_run:
        found.append(f"tests run: {plain.tests_run} plain, {other.tests_run} {other.mode}")
    for test_id in sorted(set(plain.outcomes) | set(other.outcomes)):
        a, b = plain.outcomes.get(test_id, "ok"), other.outcomes.get(test_id, "ok")
        if a != b:
            detail = other.details.get(test_id) or plain.details.get(test_id) or ""
            found.append(f"{test_id}: {a} plain, {b} {other.mode}\n{detail}".rstrip())
    for error in other.recording_errors:
        found.append(f"recording error: {error}")
    return found


def _head(difference: str) -> str:
    return difference.split("\n", 1)[0]


def _shorten(difference: str, lines: int = 12) -> str:
    parts = difference.split("\n")
    if len(parts) <= lines:
        return difference
    return "\n".join(parts[:2] + ["    ..."] + parts[-(lines - 3) :])


@dataclass
class Row:
    """One module on one interpreter: its runs and how they differ."""

    python: str
    target: str
    interpreter: str = ""
    runs: Dict[str, RunResult] = field(default_factory=dict)
    skipped_reason: str = ""
    #: Instrumented vs plain: the headline. Each entry starts with the test id.
    differences: List[str] = field(default_factory=list)
    #: Those of ``differences`` that the counting run (which keeps no values) does not show.
    retention: List[str] = field(default_factory=list)
    #: Counting run vs plain.
    counted_differences: List[str] = field(default_factory=list)

    def compare(self) -> None:
        plain, inst = self.runs.get("plain"), self.runs.get("instrumented")
        if plain is None or inst is None:
            return
        self.differences = differences(plain, inst)
        counted = self.runs.get("counted")
        if counted is not None:
            self.counted_differences = differences(plain, counted)
            if counted.ok:
                remaining = {_head(d).replace(" counted", " instrumented") for d in self.counted_differences}
                self.retention = [d for d in self.differences if _head(d) not in remaining]


def check(pythons: Sequence[str], names: Sequence[str], jobs: int, timeout: float, count: bool) -> List[Row]:
    """Run every (interpreter, module, mode) and compare."""
    rows: List[Row] = []
    work: List[Tuple[Row, str, Target, str]] = []
    for python in pythons:
        major, minor, version = _python_version(python)
        for name in names:
            target = TARGETS[name]
            row = Row(version, name, interpreter=python)
            rows.append(row)
            if (major, minor) < target.min_version:
                row.skipped_reason = f"needs Python {'.'.join(map(str, target.min_version))}+"
                continue
            modes = ("instrumented", "counted", "plain") if count else ("instrumented", "plain")
            work += [(row, python, target, mode) for mode in modes]

    def one(item: Tuple[Row, str, Target, str]) -> None:
        row, python, target, mode = item
        result = run_child(python, target, mode, timeout)
        result.python = result.python or row.python
        row.runs[mode] = result
        state = (
            f"{result.tests_run} tests, {result.seconds} s" if result.ok else f"CRASH {result.crash[:300]}"
        )
        print(f"  {row.python} {target.name} {mode}: {state}", file=sys.stderr, flush=True)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, work))
    for row in rows:
        row.compare()
    return rows


def table(rows: Sequence[Row]) -> str:
    """The report as a Markdown table."""
    head = (
        "| python | module | functions | no sites | unpatchable | probes inserted | keys fired | events "
        "| tests run | fail+err plain | fail+err instr. | seconds plain / instr. | differences (retention) "
        "| diff. counting run |"
    )
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        if r.skipped_reason:
            lines.append(f"| {r.python} | {r.target} |" + " – |" * 10 + f" n/a: {r.skipped_reason} | – |")
            continue
        p, i = r.runs["plain"], r.runs["instrumented"]
        c = r.runs.get("counted")

        def fe(x: RunResult) -> str:
            return str(x.failures + x.errors) if x.ok else "crash"

        diff = "none" if not r.differences else f"**{len(r.differences)}** ({len(r.retention)})"
        counted = "–" if c is None else (str(len(r.counted_differences)) if r.counted_differences else "none")
        events = str(c.events) if c is not None and c.ok else "–"
        lines.append(
            f"| {r.python} | {r.target} | {i.functions} | {i.no_sites} | {len(i.unpatchable)} "
            f"| {i.probes_inserted} | {i.keys_fired} | {events} | {p.tests_run if p.ok else '?'} "
            f"| {fe(p)} | {fe(i)} | {p.seconds} / {i.seconds} | {diff} | {counted} |"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Run CPython's regression tests for stdlib modules with every function patched "
        "(all recordable sites, inside an active recording) and compare with plain runs.",
    )
    parser.add_argument("--modules", help=f"comma-separated subset of: {', '.join(TARGETS)}")
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)} (for CI)")
    parser.add_argument(
        "--json", action="store_true", help="print the full results as JSON instead of a table"
    )
    parser.add_argument("--save", metavar="PATH", help="also write the full results as JSON to PATH")
    parser.add_argument(
        "--python",
        action="append",
        help="interpreter to check (repeatable; default: the one running this script)",
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel child processes")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds per child process")
    parser.add_argument(
        "--no-count-events",
        action="store_true",
        help="skip the extra run that counts probe events (and tells retention apart)",
    )
    parser.add_argument("--list", action="store_true", help="list the modules and their test packages")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        try:
            result = child(TARGETS[args.child], args.mode)
        except BaseException:
            result = RunResult(
                args.child, args.mode, python=sys.version.split()[0], crash=traceback.format_exc()
            )
        Path(args.result).write_text(json.dumps(asdict(result)))
        sys.stdout.flush()
        os._exit(0)  # skip interpreter teardown: atexit hooks of the tests are not ours

    if args.list:
        for t in TARGETS.values():
            print(f"{t.name:14} {t.tests:24} {', '.join(t.modules)}")
        return 0
    if args.modules:
        names = [n.strip() for n in args.modules.split(",") if n.strip()]
        unknown = [n for n in names if n not in TARGETS]
        if unknown:
            parser.error(f"unknown modules {unknown}; choose from {list(TARGETS)}")
    else:
        names = list(TARGETS)
        if args.quick:  # (for this interpreter's version)
            names = [n for n in QUICK if sys.version_info[:2] < NOT_QUICK_FROM.get(n, (99, 0))]
    pythons = args.python or [sys.executable]
    rows = check(pythons, names, args.jobs, args.timeout, not args.no_count_events)
    if args.save:
        Path(args.save).write_text(json.dumps([asdict(r) for r in rows], indent=1))
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    else:
        print(table(rows))
        for r in rows:
            retention = set(r.retention)
            for d in r.differences:
                note = " [retention: not in the run that keeps no values]" if d in retention else ""
                print(f"\n[{r.python} {r.target}]{note} {_shorten(d)}")
            for d in r.counted_differences:
                if _head(d).replace(" counted", " instrumented") not in {_head(x) for x in r.differences}:
                    print(f"\n[{r.python} {r.target}] (counting run only) {_shorten(d)}")
            inst = r.runs.get("instrumented")
            if inst is not None and inst.unpatchable:
                print(f"\n[{r.python} {r.target}] unpatchable:")
                for u in inst.unpatchable:
                    print(f"  {u}")
    return 1 if any(r.differences for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
