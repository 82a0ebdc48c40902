"""bcrecord.rewrite: the probed code object, and the traps measured on real interpreters."""

import dis
import subprocess
import sys
import textwrap
import types

import pytest

import bcrecord
from bcrecord import _versions, rewrite, runtime
from bcrecord._versions import PROBE_NAME
from bcrecord.analysis import read, resolve
from bcrecord.specs import Local, Return, parse_all


def probed(func, specs):
    points = resolve(parse_all(specs), read(func.__code__))
    template = rewrite.insert_probes(func.__code__, points)
    return template.bind(list(range(1000, 1000 + len(points))))


@pytest.fixture
def style(request):
    """Set the probe style for one test, then put back the session's."""
    before = rewrite.set_probe_style(request.param)
    yield request.param
    assert rewrite.set_probe_style(before) == request.param


@pytest.mark.parametrize("style", ["inline", "call"], indirect=True)
def test_how_each_spelling_reaches_the_runtime(style):
    # The call spelling loads the probe by name (Dynamo refuses LOAD_CONST <function>);
    # the inline one calls SINKS.get, a constant, so no name is looked up per value.
    def f(a):
        x = a + 1
        return x

    code = probed(f, ["x", "return"])
    assert not any(isinstance(c, types.FunctionType) for c in code.co_consts)
    instrs = list(dis.get_instructions(code))
    globals_loaded = [i.argval for i in instrs if i.opname == "LOAD_GLOBAL"]
    getters = [i for i in instrs if i.opname == "LOAD_CONST" and i.argval is rewrite.SINKS_GET]
    # Besides the getter, the only callable constant: the class an inline probe's handler matches (3.11+).
    assert {c for c in code.co_consts if callable(c) and c is not rewrite.SINKS_GET} <= {Exception}
    if style == "inline":
        assert globals_loaded == [] and len(getters) == 2
    else:
        assert globals_loaded == [PROBE_NAME, PROBE_NAME] and getters == []
    assert {1000, 1001} <= set(code.co_consts)


@pytest.mark.parametrize("style", ["inline", "call"], indirect=True)
def test_both_spellings_record_the_same_values(style):
    def f(items):
        total = 0
        for item in items:
            total += item
        out = [total * k for k in range(2)]
        return out

    patched = bcrecord.instrument(f, ["total", "out", "return", "range()"], name="s")
    with bcrecord.recording() as rec:
        assert patched([1, 2]) == [0, 3]
    assert rec.all("s:f:total@0") == [0] and rec.all("s:f:total@1") == [1, 3]
    assert rec["s:f:out@0"] == [0, 3] and rec["s:f:return"] == [0, 3]
    assert list(rec["s:f:range()@0"]) == [0, 1]
    probed_code = patched.__bcrecord_slot__.probed
    inline = any(c is rewrite.SINKS_GET for c in probed_code.co_consts)
    assert inline == (style == "inline") and (PROBE_NAME in probed_code.co_names) == (style == "call")


def test_style_follows_torch_when_auto(monkeypatch):
    monkeypatch.setattr(rewrite, "_style", "auto")
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert rewrite.probe_style() == "inline"
    monkeypatch.setitem(sys.modules, "torch", object())
    assert rewrite.probe_style() == "call"
    with pytest.raises(ValueError, match="unknown probe style 'fast'"):
        rewrite.set_probe_style("fast")
    assert rewrite._style == "auto"  # unchanged by the bad value


def test_inserted_instructions_have_real_line_numbers():
    def f(flag):
        try:
            if flag:
                raise KeyError
        except KeyError as e:
            y = e
        return None

    code = probed(f, ["y", "return"])
    probe_lines = _lines_of_probe_loads(code)
    assert probe_lines and all(line is not None for line in probe_lines)


def _tenth(v):
    return 10 // v


def _one_line_generator(v): yield 10 // v  # fmt: skip


def _in_a_generator_expression(data):
    return sum((z := _tenth(v)) for v in data)


@pytest.mark.parametrize(
    "func, spec, run",
    [
        (_one_line_generator, "return", lambda f: list(f(0))),
        (_in_a_generator_expression, "z", lambda f: f([1, 0])),
        (_in_a_generator_expression, "_tenth()@0", lambda f: f([1, 0])),
    ],
)
def test_tracebacks_through_probed_code_keep_their_lines(func, spec, run):
    # On 3.10, bytecode 0.17 drops the lines after a generator's GEN_START.
    def lines(f):
        with pytest.raises(ZeroDivisionError) as error:
            run(f)
        return [(entry.name, entry.lineno) for entry in error.traceback][1:]

    expected = lines(func)
    with bcrecord.recording():
        assert lines(bcrecord.instrument(func, spec)) == expected
    assert all(line > 0 for _, line in expected)


def test_a_column_past_127_leaves_the_lines_after_it_as_they_were():
    # bytecode 0.19 writes a column of 128..255 in a form whose bytes CPython 3.11+ read
    # up to 127 only: every line after it was off (3.11 wrote past its line array when traced).
    pad = " " * 130
    source = f"def f(k, d):\n    x = (1 +\n{pad}k(2))\n    y = k(3)\n    z = 1 / d\n    return x + y + z\n"
    namespace = {}
    exec(compile(source, "<wide>", "exec"), namespace)
    func = namespace["f"]

    def failing_line(f):
        with pytest.raises(ZeroDivisionError) as error:
            f(lambda v: v, 0)
        return error.traceback[-1].lineno + 1  # (pytest counts lines from 0)

    assert failing_line(func) == 5
    probed = bcrecord.instrument(func, ["y", "k()"], name="m")
    with bcrecord.recording() as rec:
        assert failing_line(probed) == 5
        code = probed.__code__
        assert max(end for _, end, _ in code.co_lines()) == len(code.co_code)
        if hasattr(code, "co_positions"):  # (3.11+)
            assert len(list(code.co_positions())) == len(code.co_code) // 2
    assert rec["m:f:y@0"] == 3 and rec.all("m:f:k()@1") == [3]


def test_a_per_instance_patch_of_a_method_that_deletes_or_rebinds_self_is_refused():
    # Its probes would pass what `self` holds when they run: nothing after `del self`
    # (3.12+ crashed), another object after `self = ...` (values under its name).
    class M:
        def forward(self, x):
            y = x + 1
            del self
            z = y * 2
            return z

        def step(self, x):
            self = self.inner
            z = x * 2
            return z

        def swap(self, x):
            def away():
                nonlocal self
                del self

            away()
            z = x * 2
            return z

    for method in ("forward", "step", "swap"):
        original = vars(M)[method]
        with pytest.raises(
            bcrecord.TargetError, match=f"{method} deletes or rebinds its first argument 'self'"
        ):
            bcrecord.patch_method(M, method, "z", name=lambda instance: "m")
        assert vars(M)[method] is original and original.__code__.co_code == vars(M)[method].__code__.co_code
    with bcrecord.patch_method(M, "forward", "z", name="m"), bcrecord.recording() as rec:
        assert M().forward(1) == 4
    assert rec["m:forward:z@0"] == 4


def test_equal_code_from_other_files_or_lines_is_rewritten_for_itself():
    # Code objects compare equal across files (and, on 3.10, line layouts): the
    # rewrite and analysis caches must still tell them apart.
    def compiled(filename, blank_lines):
        source = "\n" * blank_lines + "def t(x):\n    y = 1 // x\n    return y\n"
        namespace = {}
        exec(compile(source, filename, "exec"), namespace)
        return namespace["t"]

    for func in (compiled("/src/a.py", 0), compiled("/src/b.py", 0), compiled("/src/b.py", 40)):
        with pytest.raises(ZeroDivisionError) as error, bcrecord.recording():
            bcrecord.instrument(func, "y")(0)
        last = error.traceback[-1]
        assert (str(last.path), last.lineno + 1) == (
            func.__code__.co_filename,
            func.__code__.co_firstlineno + 1,
        )


def _lines_of_probe_loads(code):
    lines = []
    for instr in dis.get_instructions(code):
        if (
            instr.opname == "LOAD_GLOBAL" and instr.argval == PROBE_NAME
        ) or instr.argval is rewrite.SINKS_GET:
            lines.append(
                instr.positions.lineno if sys.version_info >= (3, 11) else _line_at(code, instr.offset)
            )
    return lines


def _line_at(code, offset):
    line = None
    for start, _, lineno in code.co_lines():
        if start <= offset:
            line = lineno
    return line


def test_varnames_and_locals_order_are_kept():
    def f(a, b):
        [c for c in range(2)]
        z = a
        y = b
        x = z + y
        return sorted(locals()) and list(locals())

    code = probed(f, ["x", "y", "z"])
    assert code.co_varnames == f.__code__.co_varnames
    patched = bcrecord.instrument(f, ["x", "y", "z"])
    with bcrecord.recording():
        assert patched(1, 2) == f(1, 2)


def test_unbound_comprehension_variable_never_probed_and_no_crash():
    # 3.12/3.13: probing the restore store after an inlined comprehension when the
    # variable was unbound segfaults. Run in a subprocess so a crash is a failure.
    script = textwrap.dedent(
        """
        import bcrecord
        def f(n):
            squares = [v * v for v in range(n)]
            if n > 5:
                v = 1
            return squares
        specs = bcrecord.targets(f).specs()
        assert specs == ["squares@0", "v@0", "range()@0", "*@0", "return"], specs
        g = bcrecord.instrument(f, specs)
        with bcrecord.recording() as rec:
            assert g(3) == [0, 1, 4]
            assert g(7)[-1] == 36
        assert rec.all("__main__:f:v@0") == [1]
        assert rec.all("__main__:f:squares@0")[0] == [0, 1, 4]
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("style", ["inline", "call"])
def test_exception_regions_keep_the_stack_depth_cpython_gave_them(style):
    # 3.11+: `return a` leaves a dead `a` under the region of a finally body that raises;
    # CPython's handler unwinds below it, bytecode's recomputed depth kept it, and the
    # outer finally's `continue` went back into the loop with it: a segmentation fault.
    # (Found by the generated-programs campaign, 3.11, in a method; any one probe did it.)
    # Run in a subprocess so a crash is a failure.
    script = textwrap.dedent(
        f"""
        import bcrecord
        bcrecord.set_probe_style({style!r})
        def f(a):
            for i in range(3):
                try:
                    try:
                        return a
                    finally:
                        raise ValueError(a)
                finally:
                    continue
        specs = bcrecord.targets(f).specs()
        assert specs == ["i@0", "ValueError()@0", "range()@0", "return"], specs
        g = bcrecord.instrument(f, specs, name="p")
        with bcrecord.recording() as rec:
            assert g(1) is None and g(2) is None
        assert rec.all("p:f:i@0") == [0, 1, 2, 0, 1, 2], rec.all("p:f:i@0")
        assert rec.all("p:f:return") == [None, None]
        print("ok")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize("style", ["inline", "call"])
def test_code_run_while_the_interpreter_exits_still_finds_the_probe(style):
    # Finalization puts builtins back as they were at start, dropping __bcrecord_probe__ from
    # them before it frees the modules' globals: a suspended generator's finally, or a __del__,
    # run then stopped at a call-spelled probe with a NameError.
    script = textwrap.dedent(
        f"""
        import bcrecord
        bcrecord.set_probe_style({style!r})
        def batches():
            try:
                while True:
                    yield 1
            finally:
                closing = "generator done"
                print(closing)
        class Held:
            def __del__(self):
                closing = "finalizer done"
                print(closing)
        for function in (batches, Held.__del__):
            bcrecord.patch_function(function, "closing", name="m")
        with bcrecord.recording() as rec:
            suspended = batches()
            next(suspended)
            held = Held()
            held.me = held  # (freed at exit, by the collector)
        print("exits")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    first, *then = done.stdout.splitlines()
    assert (first, sorted(then)) == ("exits", ["finalizer done", "generator done"])


def test_pairs_with_high_variable_indices_are_split_not_rebuilt():
    # bytecode 0.19.1 mis-encodes STORE_FAST_STORE_FAST with an index >= 16 (3.13).
    names = [f"v{k}" for k in range(20)]
    body = "\n".join(f"    {n} = {k}" for k, n in enumerate(names))
    source = (
        f"def f():\n{body}\n    v18, v19 = v19, v18\n    v0, v17 = v17, v0\n    return v18, v19, v0, v17\n"
    )
    namespace = {}
    exec(source, namespace)
    f = namespace["f"]
    patched = bcrecord.instrument(f, ["v18", "v19", "v0", "v17"], name="p")
    with bcrecord.recording() as rec:
        assert patched() == f() == (19, 18, 17, 0)
    assert rec.all("p:f:v18@1") == [19] and rec.all("p:f:v17@1") == [0]
    assert rec.all("p:f:v19@0") == [19] and rec.all("p:f:v0@1") == [17]


def test_one_rewrite_for_many_binds():
    def f(a):
        x = a
        return x

    rewrite.clear_cache()
    points = resolve([Local("x"), Return()], read(f.__code__))
    first = rewrite.insert_probes(f.__code__, points)
    second = rewrite.insert_probes(f.__code__, points)
    assert first is second
    assert rewrite.cache_info()["misses"] >= 1 and rewrite.cache_info()["size"] == 1
    a, b = first.bind([1, 2]), first.bind([3, 4])
    assert a.co_code == b.co_code and a is not b
    assert {1, 2} <= set(a.co_consts) and {3, 4} <= set(b.co_consts)


class _Failing:
    """A sink whose append raises, standing in for a C call that fails at the recursion limit."""

    def __init__(self, error):
        self.error = error

    def append(self, value):
        raise self.error


@pytest.mark.parametrize("style", ["inline"], indirect=True)
def test_a_failing_inline_probe_is_dropped_and_interrupts_reach_the_code(style):
    def f(a):
        try:
            x = a + 1
            for k in range(2):
                x = x * (k + 2)
        except KeyboardInterrupt:
            return "interrupted"
        return x

    guarded = _versions.current().guards_probes  # 3.11+: an exception table
    with bcrecord.patch_function(f, ["x", "return"]) as patch, bcrecord.recording() as rec:
        sinks = runtime._context.get()  # this context's sinks list: item k is site k's sink
        first, second, ret = patch._site_ids
        sinks[first] = _Failing(RecursionError("maximum recursion depth exceeded"))
        if guarded:
            assert f(1) == 12  # the failure is dropped; the other probes still record
            assert rec.all(patch.keys[1]) == [4, 12] and rec.all(patch.keys[2]) == [12]
        else:  # 3.10: no exception table, the probe is unguarded (documented)
            with pytest.raises(RecursionError):
                f(1)
        sinks[first] = _Failing(KeyboardInterrupt())
        assert f(1) == "interrupted"  # re-raised where the code's own handler catches it
        # A sink lets through only what a signal handler raised (a timeout's): the program's.
        sinks[first] = _Failing(TimeoutError("a SIGALRM handler's"))
        with pytest.raises(TimeoutError):
            f(1)
        sinks[ret] = _Failing(KeyboardInterrupt())
        sinks[first] = rec._sink(first).direct()
        with pytest.raises(KeyboardInterrupt):  # outside any try: it leaves the function
            f(1)


class _Holder:
    def __init__(self, inner):
        self.inner = inner


class _Inner:
    @property
    def bad(self):
        raise KeyError("bad")


def _fails(value):
    raise ZeroDivisionError(value)


def _errors_right_after_probes(a, holder):
    caught = []
    for _ in range(8):  # a few rounds, so that 3.13 specializes the call and the property
        try:
            _fails(a - 1)  # a probe on `-` ends right before the call
        except ZeroDivisionError as error:
            caught.append(error.args[0])
        try:
            caught.append(holder.inner.bad)  # a probe on `holder.inner` ends right before `.bad`
        except KeyError as error:
            caught.append(error.args[0])
    return caught


@pytest.mark.parametrize("style", ["inline", "call"], indirect=True)
def test_an_error_right_after_a_probe_reaches_the_code_not_the_probe(style):
    # 3.13 looks up the handler of an error raised in a callee (or a property) at the
    # code unit before the call: it must not be the probe's.
    expected = _errors_right_after_probes(5, _Holder(_Inner()))
    patched = bcrecord.instrument(_errors_right_after_probes, ["-@0", "holder.inner@0"], name="e")
    with bcrecord.recording() as rec:
        assert patched(5, _Holder(_Inner())) == expected == [4, "bad"] * 8
    assert rec.all("e:_errors_right_after_probes:-@0") == [4] * 8
    assert len(rec.all("e:_errors_right_after_probes:holder.inner@0")) == 8


MIXED_LOADS_SCRIPT = """
import types
import bcrecord

cfg = types.SimpleNamespace(fn=lambda *p, **k: (p, k))

def f(a):
    x = cfg.fn(1) if a else cfg.fn
    y = cfg.fn if a else cfg.fn(2)
    z = cfg.fn(*cfg.fn(a), k=1)
    return x, y, z

g = bcrecord.instrument(f, [bcrecord.Attribute("cfg.fn", at="load")])
with bcrecord.recording() as rec:
    same = [g(a) == f(a) for a in (0, 1)]
values = [v for key in rec.keys() for v in rec.all(key)]
print(same, len(values), all(v is cfg.fn for v in values))
"""


@pytest.mark.parametrize("columns", [True, False], ids=["columns", "no_debug_ranges"])
def test_a_site_that_is_a_plain_and_a_method_style_load_records_both(columns):
    # On one line where code has no columns (3.10; -X no_debug_ranges later), a plain
    # load and a method-style load of one chain are one site. The rewrite made each
    # load of the site plain or not as its first one was: the probe after the other
    # copied a method-style load's NULL (a crash on 3.12+), or the patch failed with
    # "no CALL_METHOD matches the method load" (3.10).
    flags = [] if columns else ["-X", "no_debug_ranges"]
    run = subprocess.run(
        [sys.executable, *flags, "-c", MIXED_LOADS_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[0] == "[True, True] 8 True"


def _branches_in_a_try(count):
    # `count` if/else branches inside one `try`: each branch splits the try region in
    # bytecode's control-flow graph.
    lines = ["def f(a):", "    x = a", "    try:"]
    for k in range(count):
        lines += [f"        if x % 3 == {k % 3}:", f"            x = x + {k}"]
        lines += ["        else:", f"            x = x - {k}"]
    lines += ["    except ZeroDivisionError:", "        pass", "    return x"]
    namespace = {}
    exec("\n".join(lines), namespace)
    return namespace["f"]


def test_rewriting_a_long_try_block_costs_calls_in_proportion_to_its_size():
    # bytecode's way back from its control-flow graph (ControlFlowGraph.to_code) searches
    # a list from its start for each split region it fuses: four times the branches took
    # 6.6 times the calls (3.13), a 20,000-line function minutes. Counted, not timed.
    import cProfile
    import pstats

    def calls(count):
        func = _branches_in_a_try(count)
        points = resolve(parse_all(["x"]), read(func.__code__))
        rewrite.clear_cache()
        profile = cProfile.Profile()
        profile.enable()
        template = rewrite.insert_probes(func.__code__, points)
        profile.disable()
        assert len(points) == len(template.placeholders) == 2 * count + 1
        want = func(1)
        with bcrecord.patch_function(func, ["x"], name="m"), bcrecord.recording() as rec:
            assert func(1) == want
        assert rec["m:f:x@0"] == 1 and len(rec) == count + 1  # (one branch of each if taken)
        return pstats.Stats(profile).total_calls

    small, large = calls(150), calls(600)
    assert large < 4.6 * small, (small, large)


def _factorial(n):
    if n <= 1:
        r = 1
    else:
        r = n * _factorial(n - 1)
    return r


def _deepest_completed(headroom):
    """The largest ``n`` for which ``_factorial(n)`` completes with ``headroom`` frames left."""
    frame, depth = sys._getframe(), 0
    while frame:
        frame, depth = frame.f_back, depth + 1
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + headroom)
    deepest = 0
    try:
        for n in range(headroom - 100, headroom + 5):
            try:
                _factorial(n)
            except RecursionError:
                break
            deepest = n
    finally:
        sys.setrecursionlimit(old)
    return deepest


@pytest.mark.parametrize("copy", ["none", "clone"])
@pytest.mark.parametrize("style", ["inline", "call"], indirect=True)
def test_a_probed_recursion_reaches_its_recursion_error_at_most_two_calls_earlier(style, copy):
    # As the README says: a guarded inline probe (3.11+) never fails at the limit; a probe
    # spelled as a call is a Python frame, and its copy may be another (measured: 3.10 one
    # call earlier, 3.11 two with copy='none', 3.12 and 3.13 two with copy='clone').
    import math

    plain = _deepest_completed(1000)
    with bcrecord.patch_function(_factorial, ["r", "*", "_factorial()"], name="m"):
        with bcrecord.recording(copy=copy, keep=2) as rec:
            probed = _deepest_completed(1000)
            assert _factorial(900) == math.factorial(900)
    assert plain - 2 <= probed <= plain
    if style == "inline" and sys.version_info >= (3, 11):
        assert probed == plain
    assert rec.all("m:_factorial:r@1")[-1] == math.factorial(900)


def _appending(n, acc):
    acc.append(n)
    try:
        return _appending(n + 1, acc)
    except RecursionError:
        return n


@pytest.mark.parametrize("style", ["inline"], indirect=True)  # (guarded: no failure of its own)
@pytest.mark.parametrize("spec", ["acc.append@0", "acc.append()@0", "return"])
def test_a_recorded_list_append_counts_against_the_recursion_limit_on_3_11_alone(spec, style):
    # As the README says: 3.11 runs `acc.append(n)` as a call of its own that skips the
    # recursion check only where its result is thrown away and the method was loaded as a
    # method; recording the method or the result makes it a plain C call, which checks: one
    # level less. A recorded return leaves the call as it was; 3.10, 3.12 and 3.13 have no
    # such call.
    plain = _appending(0, [])
    with bcrecord.patch_function(_appending, [spec], name="m"):
        with bcrecord.recording(copy="none", keep=1) as rec:
            probed = _appending(0, [])
    less = 1 if sys.version_info[:2] == (3, 11) and spec != "return" else 0
    assert (probed, rec.errors) == (plain - less, [])
    assert len(rec) == 1


@pytest.mark.parametrize("style", ["inline", "call"], indirect=True)
def test_the_stack_size_bound_taken_without_a_graph_is_never_below_the_graph_s(style, monkeypatch):
    # Code without exception regions is assembled with the original's stack size plus what
    # the inserted runs add (no control-flow graph): a size too small would crash CPython.
    import argparse
    import collections
    import dataclasses
    import inspect
    import json.decoder
    import json.encoder
    import textwrap

    from . import corpus

    checked = []
    assemble = rewrite._assemble

    def both(bytecode, bound=None):
        new = assemble(bytecode, bound)
        if bound is not None:
            exact = bytecode.to_code()  # (its size computed on the graph)
            assert new.co_stacksize >= exact.co_stacksize, (
                bytecode.name,
                new.co_stacksize,
                exact.co_stacksize,
            )
            checked.append(bytecode.name)
        return new

    monkeypatch.setattr(rewrite, "_assemble", both)
    rewrite.clear_cache()
    functions = [
        func
        for module in (argparse, collections, json.decoder, json.encoder, textwrap, corpus)
        for _, holder in inspect.getmembers(module, lambda m: inspect.isfunction(m) or inspect.isclass(m))
        for func in ([holder] if inspect.isfunction(holder) else vars(holder).values())
        if inspect.isfunction(func)
        and func.__module__ == module.__name__
        and not hasattr(func, "__wrapped__")
    ]
    for func in functions:
        specs = bcrecord.targets(func).specs()
        if not specs:
            continue
        points = resolve(parse_all(specs), read(func.__code__))
        for with_self in (False, True) if func.__code__.co_argcount else (False,):
            try:
                rewrite.insert_probes(
                    func.__code__, [dataclasses.replace(p, with_self=with_self) for p in points]
                )
            except bcrecord.TargetError:  # (a per-instance patch of a function that rebinds self)
                pass
    rewrite.clear_cache()
    assert len(checked) > 100
