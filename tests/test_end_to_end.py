"""End to end: a patched function behaves exactly like the original, and records."""

import asyncio
import concurrent.futures
import functools
import importlib
import linecache
import multiprocessing
import py_compile
import sys
import traceback

import pytest

import bcrecord
from bcrecord import Attribute, Return

from . import corpus


def every_spec(func):
    """Every recordable site of func, as specs."""
    return bcrecord.targets(func).specs() or ["return"]


def run_both(func, *args, **kwargs):
    """(original outcome, patched outcome, recording) for one call."""
    patched = bcrecord.instrument(func, every_spec(func), name="t")

    def outcome(f):
        try:
            return ("ok", f(*args, **kwargs))
        except Exception as error:  # compare exceptions by type and message
            return ("raised", type(error), str(error))

    original = outcome(func)
    with bcrecord.recording(copy="none") as rec:
        result = outcome(patched)
    return original, result, rec


def test_corpus_function_same_result_and_every_value_recorded():
    original, patched, rec = run_both(corpus.everything, [1, 2, 3], {"k": 7})
    assert patched == original
    assert rec["t:everything:x@2"] == 1 + 2 + 1 + 2 + 3
    assert rec.all("t:everything:i@0") == [1, 2, 3]
    assert rec["t:everything:captured@0"] == 7
    assert rec["t:everything:rest@0"] == [2, 3]
    assert rec["t:everything:err@0"].args == ("boom",)
    assert rec["t:everything:z@0"] == 0
    assert rec["t:everything:f@0"] == 2
    assert rec["t:everything:osp@0"].__name__ == "posixpath" or rec["t:everything:osp@0"].__name__ == "ntpath"
    assert rec["t:everything:return"] == original[1]


def test_exceptions_and_tracebacks_keep_original_file_and_lines():
    def boom(a):
        b = a + 1
        raise ValueError(f"bad {b}")

    patched = bcrecord.instrument(boom, "b")
    with bcrecord.recording() as rec, pytest.raises(ValueError, match="bad 2") as info:
        patched(1)
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno) == (__file__, boom.__code__.co_firstlineno + 2)
    assert rec.all("tests.test_end_to_end:boom:b@0") == [2]


def test_generators_record_every_step():
    def gen(n):
        for k in range(n):
            sq = k * k
            yield sq
        return "done"

    patched = bcrecord.instrument(gen, ["sq", "return"], name="g")
    with bcrecord.recording() as rec:
        assert list(patched(4)) == [0, 1, 4, 9]
    assert rec.all("g:gen:sq@0") == [0, 1, 4, 9]
    assert rec["g:gen:return"] == "done"


def test_coroutines_and_async_generators():
    async def coro(x):
        await asyncio.sleep(0)
        y = x * 3
        return y

    async def agen(n):
        for k in range(n):
            v = k + 10
            yield v

    c = bcrecord.instrument(coro, "y", name="a")
    g = bcrecord.instrument(agen, "v", name="a")

    async def main():
        return await c(2), [v async for v in g(2)]

    with bcrecord.recording() as rec:
        assert asyncio.run(main()) == (6, [10, 11])
    assert rec["a:coro:y@0"] == 6
    assert rec.all("a:agen:v@0") == [10, 11]


def test_closures_zero_argument_super_and_recursion():
    class Base:
        def value(self, x):
            return x + 1

    class Child(Base):
        def value(self, x):
            r = super().value(x)
            return r * 2

    def make_counter():
        count = 0

        def bump(step):
            nonlocal count
            count += step
            return count

        return bump

    def fact(n):
        res = 1 if n <= 1 else n * fact(n - 1)
        return res

    with bcrecord.patch_method(Child, "value", "r"), bcrecord.recording() as rec:
        assert Child().value(1) == 4
    assert rec["Child:value:r@0"] == 2

    bump = make_counter()
    patched = bcrecord.instrument(bump, "count")
    with bcrecord.recording() as rec:
        assert patched(2) == 2 and patched(3) == 5 and bump(1) == 6
    assert rec.all(rec.keys()[0]) == [2, 5]

    with bcrecord.patch_function(fact, "res", name="m"), bcrecord.recording() as rec:
        assert fact(4) == 24
    assert rec.all("m:fact:res@0") == [1, 2, 6, 24]


def test_defaults_keyword_only_star_args_and_signature():
    def f(a, b=2, *args, c, d=4, **kw):
        s = a + b + sum(args) + c + d + sum(kw.values())
        return s

    patched = bcrecord.instrument(f, "s")
    import inspect

    assert inspect.signature(patched) == inspect.signature(f)
    assert (patched.__name__, patched.__qualname__, patched.__doc__) == (
        f.__name__,
        f.__qualname__,
        f.__doc__,
    )
    with bcrecord.recording() as rec:
        assert patched(1, c=3) == f(1, c=3) == 10
        assert patched(1, 1, 1, c=1, d=1, e=1) == f(1, 1, 1, c=1, d=1, e=1) == 6
    assert rec.all(rec.keys()[0]) == [10, 6]


def test_wraps_decorated_static_class_and_bound_methods():
    def logged(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            return func(*args, **kwargs)

        return wrapper

    class K:
        factor = 10

        @logged
        def deco(self, x):
            inner = x + 1
            return inner

        @staticmethod
        def stat(x):
            st = x * 2
            return st

        @classmethod
        def clsm(cls, x):
            cm = x * cls.factor
            return cm

        def plain(self, x):
            p = x - 1
            return p

    k = K()
    with bcrecord.recording() as rec:
        with bcrecord.patch_method(K, "deco", "inner"):
            assert k.deco(1) == 2 and K.deco.__wrapped__ is not None
        with bcrecord.patch_method(K, "stat", "st"):
            assert K.stat(2) == 4 and k.stat(3) == 6
        with bcrecord.patch_method(K, "clsm", "cm"):
            assert K.clsm(1) == 10 and k.clsm(2) == 20
        bound = bcrecord.instrument(k.plain, "p")
        assert bound(5) == 4 and bound.__self__ is k
    assert rec["K:deco:inner@0"] == 2
    assert rec.all("K:stat:st@0") == [4, 6]
    assert rec.all("K:clsm:cm@0") == [10, 20]
    assert rec["K:plain:p@0"] == 4
    # everything restored
    assert isinstance(K.__dict__["stat"], staticmethod) and isinstance(K.__dict__["clsm"], classmethod)
    assert K.stat(1) == 2


def test_function_from_exec_without_source():
    source = "def hidden(a):\n    q = a * 7\n    return q\n"
    namespace = {}
    exec(compile(source, "<generated-17>", "exec"), namespace)
    hidden = namespace["hidden"]
    assert not linecache.getlines("<generated-17>")
    patched = bcrecord.instrument(hidden, "q", name="gen")
    with bcrecord.recording() as rec:
        assert patched(3) == 21
    assert rec["gen:hidden:q@0"] == 21


def test_lambda():
    lam = lambda v: v * 2  # noqa: E731
    patched = bcrecord.instrument(lam, Return(), name="l")
    with bcrecord.recording() as rec:
        assert patched(4) == 8
    assert rec["l:<lambda>:return"] == 8


def test_module_imported_from_sourceless_pyc(tmp_path, monkeypatch):
    src = tmp_path / "sourceless_mod.py"
    src.write_text("def compute(a):\n    hidden = a + 100\n    return hidden\n")
    py_compile.compile(str(src), cfile=str(tmp_path / "sourceless_mod.pyc"))
    src.unlink()
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("sourceless_mod")
    try:
        assert module.__spec__.origin.endswith(".pyc")
        with bcrecord.patch_method(module, "compute", "hidden") as patch, bcrecord.recording() as rec:
            assert module.compute(1) == 101
        assert rec["sourceless_mod:compute:hidden@0"] == 101
        assert module.compute is patch.target.compute and module.compute.__code__ is patch.original_code
    finally:
        sys.modules.pop("sourceless_mod", None)


def test_toy_model_with_mmengine_style_keys():
    model = corpus.ToyModel()
    specs = [
        dict(type="FunctionRecorder", target="outputs", index=[1]),
        dict(type="AttributeRecorder", target="self.linear1.weight"),
        Attribute("self.linear1", at="load"),
    ]
    with bcrecord.patch_method(model, "forward", specs, name="runner_model"), bcrecord.recording() as rec:
        assert model.forward([1, 2]) == 18
        assert model.forward(1, 10, mode="loss") == {"loss": 4}
    assert rec.all("runner_model:forward:outputs@1") == [18, 6]
    assert rec["runner_model:forward:self.linear1.weight"] == 2
    assert rec["runner_model:forward:self.linear1@0"] is model.linear1
    assert "forward" not in vars(model)


def test_method_load_probe_keeps_stack_for_nested_and_conditional_calls():
    class M:
        def f(self, a, b=0):
            return a + b

        def g(self):
            return 5

        def run(self, flag):
            out = self.f(
                self.g(),
                self.f(1, 2) if flag else self.g(),
            )
            return out

    m = M()
    with bcrecord.patch_method(
        M, "run", [Attribute("self.f", at="load"), Attribute("self.g", at="load"), "out"]
    ):
        with bcrecord.recording() as rec:
            assert m.run(True) == 8 and m.run(False) == 10
    assert rec["M:run:out@0"] == 10
    assert [v.__func__ for v in rec.all("M:run:self.f@0")] == [M.f, M.f]
    assert len(rec.all("M:run:self.g@0")) == 2 and len(rec.all("M:run:self.g@1")) == 1


def test_every_site_of_a_varied_function_keeps_behaviour():
    def varied(self, items, *, limit=3):
        acc = []
        for idx, item in enumerate(items):
            if idx >= limit:
                break
            try:
                val = int(item)
            except (TypeError, ValueError) as exc:
                val = str(exc)
            finally:
                last = idx
            acc.append(self.conv(val) if isinstance(val, int) else val)
        total = sum(v for v in acc if isinstance(v, int))
        with open(__file__) as fh:
            head = fh.readline()
        return acc, total, last, head

    class S:
        def conv(self, v):
            return v * 2

    args = (S(), ["1", None, "x", "4", "5"])
    original, patched, rec = run_both(varied, *args, limit=4)
    assert patched == original
    assert rec.all("t:varied:val@0") == [1, 4]
    assert rec.all("t:varied:last@0") == [0, 1, 2, 3]


def test_an_argument_never_reassigned_is_recorded_at_entry():
    class Layer:
        def forward(self, x, scale=2):
            y = x * scale
            return y

    layer = Layer()
    with bcrecord.patch_method(layer, "forward", ["x", "scale", "y"], name="l"), bcrecord.recording() as rec:
        layer.forward(3)
        layer.forward(4, scale=5)
    assert rec.all("l:forward:x") == [3, 4] and rec.all("l:forward:scale") == [2, 5]
    assert rec.all("l:forward:y@0") == [6, 20]


@pytest.fixture
def sigint_put_back():
    """pdb's ``continue`` sets its own SIGINT handler and leaves it: later tests ran with it (a
    Ctrl-C of the test run, or a test's own SIGINT, would start a debugger on a spent stdin)."""
    import signal

    previous = signal.getsignal(signal.SIGINT)
    yield
    if previous is not None:  # (None: a handler set from C, which Python cannot put back)
        signal.signal(signal.SIGINT, previous)


def test_pdb_skipping_bcrecord_steps_as_in_the_unpatched_function(tmp_path, sigint_put_back):
    import io
    import pdb

    path = tmp_path / "stepped.py"
    path.write_text("def f(a):\n    x = a + 1\n    y = x * 2\n    return y\n")
    namespace = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    f = namespace["f"]

    def stops(skip):
        out = io.StringIO()
        debugger = pdb.Pdb(stdin=io.StringIO("step\n" * 4 + "continue\n"), stdout=out, skip=skip)
        debugger.use_rawinput = False
        assert debugger.runcall(f, 1) == 4
        lines = [line.split("(Pdb) ")[-1] for line in out.getvalue().splitlines()]
        return [line for line in lines if line.startswith("> ")]

    original = stops(None)
    assert [line.split("(")[1] for line in original[:4]] == ["2)f", "3)f", "4)f", "4)f"]
    with bcrecord.patch_function(f, ["x", "y"], name="m"), bcrecord.recording() as rec:
        stepped_into_bcrecord = stops(None)
        skipping = stops(["bcrecord.*"])
    # Without skip the first step goes into the probe's Python code; with it, as unpatched.
    assert "bcrecord" in stepped_into_bcrecord[1]
    assert skipping == original
    assert rec.all("m:f:x@0") == [2, 2] and rec.all("m:f:y@0") == [4, 4]


def test_entry_attribute_of_a_generator_is_read_when_its_body_starts():
    class Holder:
        v = 1

    def gen(o):
        yield o.v

    holder = Holder()
    with bcrecord.patch_function(gen, ["o.v"], name="m"), bcrecord.recording() as rec:
        started = gen(holder)
        holder.v = 99  # after the call, before the first next(): the README's documented read
        assert next(started) == 99
    assert rec.all("m:gen:o.v") == [99]


_TRACED_SOURCE = """def f(a, b):
    x = a + 1
    if x > 2:
        x = x * b
    for i in range(2):
        y = x + i
    try:
        1 / (a - a)
    except ZeroDivisionError as e:
        w = len(str(e))
    return [y, w]
"""
_TRACED_SPECS = ["a", "x", "y", "i", "e", "w", "len()", "return"]


def _traced_function(tmp_path):
    path = tmp_path / "traced.py"
    path.write_text(_TRACED_SOURCE)
    namespace = {}
    exec(compile(_TRACED_SOURCE, str(path), "exec"), namespace)
    return namespace["f"], str(path)


def _check_traced_values(rec):
    assert rec.all("m:f:x@0") == [3] and rec.all("m:f:x@1") == [9] and rec.all("m:f:i@0") == [0, 1]
    assert rec["m:f:w@0"] == len("division by zero") and rec["m:f:return"] == [10, 16]


def test_a_tracer_sees_the_lines_of_the_unpatched_function(tmp_path):
    f, path = _traced_function(tmp_path)

    def events():
        seen = []

        def tracer(frame, event, arg):
            if frame.f_code.co_filename != path:
                return None
            seen.append((event, frame.f_lineno))
            return tracer

        previous = sys.gettrace()  # (a coverage run's tracer, where there is one)
        sys.settrace(tracer)
        try:
            assert f(2, 3) == [10, 16]
        finally:
            sys.settrace(previous)
        return seen

    original = events()
    assert ("line", 10) in original and original[-1] == ("return", 11)
    with bcrecord.patch_function(f, _TRACED_SPECS, name="m"), bcrecord.recording() as rec:
        assert events() == original
    _check_traced_values(rec)


@pytest.mark.filterwarnings("ignore:assigning None to:RuntimeWarning")  # (3.12+: the jump back, both)
def test_pdb_next_print_and_jump_in_a_patched_function_as_in_the_unpatched_one(tmp_path, sigint_put_back):
    import io
    import pdb

    f, path = _traced_function(tmp_path)
    commands = "next\nnext\np x\nnext\nnext\njump 2\nnext\np x\nnext\nnext\nnext\nnext\np (i, y)\ncontinue\n"

    def session():
        out = io.StringIO()
        debugger = pdb.Pdb(stdin=io.StringIO(commands), stdout=out)
        debugger.use_rawinput = False
        result = debugger.runcall(f, 2, 3)
        return result, out.getvalue()

    original = session()
    assert original[0] == [10, 16] and "(Pdb) 3\n" in original[1] and "(Pdb) (0, 9)\n" in original[1]
    with bcrecord.patch_function(f, _TRACED_SPECS, name="m"), bcrecord.recording() as rec:
        assert session() == original
    # The jump ran x = a + 1 twice: the patch recorded each.
    assert rec.all("m:f:x@0") == [3, 3] and rec["m:f:return"] == [10, 16]


def test_coverage_measures_the_lines_and_arcs_of_the_unpatched_function(tmp_path):
    coverage = pytest.importorskip("coverage")
    f, path = _traced_function(tmp_path)

    def measured():
        cov = coverage.Coverage(data_file=None, branch=True, include=[path])
        cov.start()
        try:
            assert f(2, 3) == [10, 16]
        finally:
            cov.stop()
        data = cov.get_data()
        return sorted(data.lines(path)), sorted(data.arcs(path))

    original = measured()
    assert original[0] == list(range(2, 12))
    with bcrecord.patch_function(f, _TRACED_SPECS, name="m"), bcrecord.recording() as rec:
        assert measured() == original
    _check_traced_values(rec)


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is 3.12+")
def test_a_sys_monitoring_tool_sees_the_lines_of_the_unpatched_function(tmp_path):
    monitoring = sys.monitoring
    f, path = _traced_function(tmp_path)
    tool = next(t for t in range(1, 6) if monitoring.get_tool(t) is None)
    seen = []

    def line(code, number):
        if code.co_filename == path:
            seen.append(number)

    def events():
        seen.clear()
        assert f(2, 3) == [10, 16]
        return list(seen)

    monitoring.use_tool_id(tool, "bcrecord-test")
    try:
        monitoring.register_callback(tool, monitoring.events.LINE, line)
        monitoring.set_events(tool, monitoring.events.LINE)
        original = events()
        assert original[:3] == [2, 3, 4]
        with bcrecord.patch_function(f, _TRACED_SPECS, name="m"), bcrecord.recording() as rec:
            assert events() == original
        assert events() == original  # and once it is removed
    finally:
        monitoring.set_events(tool, 0)
        monitoring.register_callback(tool, monitoring.events.LINE, None)
        monitoring.free_tool_id(tool)
    _check_traced_values(rec)


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is 3.12+")
def test_an_event_a_monitoring_tool_disabled_fires_once_more_in_the_probed_code(tmp_path):
    # What the README says of sys.monitoring.DISABLE (coverage's sysmon core returns it): the
    # probed code is a code object of its own, where each line fires once, then stays off.
    monitoring = sys.monitoring
    f, path = _traced_function(tmp_path)
    tool = next(t for t in range(1, 6) if monitoring.get_tool(t) is None)
    seen = []

    def line(code, number):
        if code.co_filename == path:
            seen.append(number)
        return monitoring.DISABLE

    def lines():
        seen.clear()
        assert f(2, 3) == [10, 16]
        return list(seen)

    monitoring.use_tool_id(tool, "bcrecord-test")
    try:
        monitoring.register_callback(tool, monitoring.events.LINE, line)
        monitoring.set_events(tool, monitoring.events.LINE)
        first = lines()
        assert sorted(set(first)) == list(range(2, 12)) and lines() == []
        with bcrecord.patch_function(f, _TRACED_SPECS, name="m"):
            with bcrecord.recording() as rec:
                assert lines() == first and lines() == []
            assert lines() == []  # the original's, still off
            with bcrecord.recording() as again:
                assert lines() == []  # the same probed code, off too
    finally:
        monitoring.set_events(tool, 0)
        monitoring.register_callback(tool, monitoring.events.LINE, None)
        monitoring.free_tool_id(tool)
    assert rec.all("m:f:x@0") == [3, 3] and again.all("m:f:x@0") == [3]


def test_pdb_next_out_of_a_callee_into_a_patched_caller_skipping_bcrecord(tmp_path, sigint_put_back):
    import io
    import pdb

    path = tmp_path / "callee.py"
    path.write_text("def f(a):\n    z = g(a)\n    return z\n\ndef g(v):\n    w = v * 2\n    return w\n")
    namespace = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    f = namespace["f"]

    def stops(skip):
        out = io.StringIO()
        commands = f"break {path}:6\ncontinue\nnext\nnext\nnext\ncontinue\n"
        debugger = pdb.Pdb(stdin=io.StringIO(commands), stdout=out, skip=skip)
        debugger.use_rawinput = False
        assert debugger.runcall(f, 1) == 2
        lines = [line.split("(Pdb) ")[-1] for line in out.getvalue().splitlines()]
        return [line for line in lines if line.startswith("> ")]

    original = stops(None)
    assert [line[line.index("callee.py") :] for line in original[1:]] == [
        "callee.py(6)g()",
        "callee.py(7)g()",
        "callee.py(7)g()->2",
        "callee.py(3)f()",
    ]
    with bcrecord.patch_function(f, ["z"], name="m"), bcrecord.recording() as rec:
        stepped_into_bcrecord = stops(None)
        skipping = stops(["bcrecord.*"])
    # pdb steps once g has returned: into the probe that follows the call (the README says so).
    assert "bcrecord" in stepped_into_bcrecord[-1]
    assert skipping == original
    assert rec.all("m:f:z@0") == [2, 2]


def test_a_spawned_worker_has_the_patches_its_imports_make_and_sends_back_what_it_recorded(
    tmp_path, monkeypatch
):
    # A spawned worker imports the program afresh: a patch made when a module is imported
    # is made there too, one made in the parent afterwards is not (README).
    (tmp_path / "spawned_patches.py").write_text(
        "import bcrecord\n\n"
        "def f(a):\n    x = a * 2\n    return x\n\n"
        "f = bcrecord.instrument(f, 'x', name='spawned')\n\n"
        "class Net:\n    def forward(self, a):\n        h = a + 1\n        return h\n\n"
        "def task(a):\n"
        "    with bcrecord.recording() as rec:\n"
        "        f(a)\n"
        "        Net().forward(a)\n"
        "    return dict(rec.items()), rec\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spawned = importlib.import_module("spawned_patches")
    patch = bcrecord.patch_method(spawned.Net, "forward", "h")
    try:
        spawn = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn) as pool:
            items, rec = pool.submit(spawned.task, 20).result(timeout=120)
        with bcrecord.recording() as here:
            spawned.task(1)  # in this process the method's patch is there too
    finally:
        patch.remove()
        sys.modules.pop("spawned_patches", None)
    assert items == {"spawned:f:x@0": 40}
    assert rec.all("spawned:f:x@0") == [40] and not rec.active
    assert here.all("Net:forward:h@0") == [2]
