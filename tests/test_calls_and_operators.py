"""Call and Expr specs: values that never reach a local, on every Python version."""

import asyncio
import math
import sys

import pytest

import bcrecord
from bcrecord import Call, Expr, TargetError


class Seq:
    """A tiny 'tensor' whose methods return new values (so chained calls make sense)."""

    def __init__(self, values):
        self.values = list(values)

    def scale(self, k=1, *, bias=0):
        return Seq(v * k + bias for v in self.values)

    def total(self):
        return sum(self.values)

    def __add__(self, other):
        return Seq(a + b for a, b in zip(self.values, other.values, strict=True))

    def __eq__(self, other):
        return isinstance(other, Seq) and self.values == other.values


def flatten(seq, start=0):
    return Seq(seq.values[start:])


class Net:
    def __init__(self):
        self.avgpool = lambda s: s.scale(2)
        self.fc = lambda s: s.total()

    def forward_impl(self, x):
        return self.fc(flatten(self.avgpool(x), 1))

    def every_call_form(self, x, items, kw):
        a = len(items)  # bare name
        b = x.scale(3)  # method call (NULL/self slot, CALL_METHOD on 3.10)
        c = x.scale(k=2, bias=1)  # keyword arguments
        d = x.scale(*items, **kw)  # *args / **kwargs
        e = [x.scale(v).total() for v in items]  # inside a comprehension (inlined on 3.12+)
        with open(__file__) as fh:
            f = len(fh.readline())  # inside a with statement
        g = x.scale(2).scale(5)  # chained calls
        h = self.avgpool(x) + self.avgpool(b)  # an operator result never named
        return a, b, c, d, e, f, g, h


def test_resnet_style_return_of_nested_calls_records_each_call():
    net = Net()
    x = Seq([1, 2, 3])
    specs = [Call("self.avgpool"), Call("flatten"), Call("self.fc"), "return"]
    with bcrecord.patch_method(Net, "forward_impl", specs), bcrecord.recording() as rec:
        result = net.forward_impl(x)
    assert rec["Net:forward_impl:self.avgpool()@0"] == Seq([2, 4, 6])
    assert rec["Net:forward_impl:flatten()@0"] == Seq([4, 6])
    assert rec["Net:forward_impl:self.fc()@0"] == 10 == result
    assert rec["Net:forward_impl:return"] == 10


def test_every_call_form_keeps_the_stack_and_records_the_right_value():
    net = Net()
    x = Seq([1, 2])
    items, kw = [2], {"bias": 5}
    expected = net.every_call_form(x, items, kw)
    found = bcrecord.targets(Net.every_call_form)
    calls = {c: [s.index for s in sites] for c, sites in found.calls.items()}
    assert calls["len"] == [0, 1] and calls["x.scale"] == [0, 1, 2, 3, 4] and calls["self.avgpool"] == [0, 1]
    specs = [Call(name) for name in found.calls] + [Expr("+")]
    with bcrecord.patch_method(Net, "every_call_form", specs), bcrecord.recording() as rec:
        assert net.every_call_form(x, items, kw) == expected
    key = "Net:every_call_form:"
    assert rec[key + "len()@0"] == 1
    assert rec[key + "x.scale()@0"] == Seq([3, 6])
    assert rec[key + "x.scale()@1"] == Seq([3, 5])
    assert rec[key + "x.scale()@2"] == Seq([7, 9])
    assert rec[key + "len()@1"] == expected[5]
    assert rec[key + "x.scale()@4"] == Seq([2, 4])  # x.scale(2) in x.scale(2).scale(5)
    assert rec[key + "self.avgpool()@1"] == Seq([6, 12])
    assert rec[key + "+@0"] == expected[7]
    # inside the comprehension: inlined on 3.12+, a nested code object rewritten too on 3.10/3.11
    assert rec.all(key + "x.scale()@3") == [Seq([2, 4])]


def test_operator_sites_listed_with_positions_and_errors():
    def f(out, identity):
        out = out + identity
        out += 1
        return out * 2 + 1

    t = bcrecord.targets(f)
    assert sorted(t.operators) == ["*", "+", "+="]
    assert [o.line - f.__code__.co_firstlineno for o in t.operators["+"]] == [1, 3]
    g = bcrecord.instrument(f, ["+@1", "*", "+="], name="ops")
    with bcrecord.recording() as rec:
        assert g(1, 2) == 9
    assert rec["ops:f:*@0"] == 8 and rec["ops:f:+@1"] == 9 and rec["ops:f:+=@0"] == 4
    with pytest.raises(TargetError, match="has no '-' operator; operators: \\* \\+ \\+="):
        bcrecord.instrument(f, "-")
    with pytest.raises(TargetError, match="never calls 'g'"):
        bcrecord.instrument(f, "g()")


def test_call_sites_are_the_same_on_every_version():
    # A method-style call's receiver is not itself a call site (3.10/3.11 LOAD_METHOD).
    found = bcrecord.targets(Net.every_call_form)
    assert sorted(found.calls) == ["fh.readline", "len", "open", "self.avgpool", "x.scale"]
    assert bcrecord.targets(Net.forward_impl).specs() == [
        "self.avgpool@0",
        "self.fc@0",
        "flatten()@0",
        "self.avgpool()@0",
        "self.fc()@0",
        "return",
    ]


def test_a_with_statement_is_no_call_of_its_context_manager():
    # 3.11+ calls __exit__ where the manager was loaded; that is not a call site.
    import threading

    class Guarded:
        def __init__(self):
            self.lock = threading.Lock()

        def step(self, x):
            with self.lock:
                y = abs(x)
            return y

    assert sorted(bcrecord.targets(Guarded.step).calls) == ["abs"]
    with pytest.raises(TargetError, match="never calls 'self.lock'"):
        bcrecord.patch_method(Guarded, "step", "self.lock()")


def test_a_call_of_an_item_is_no_call_site_and_the_error_says_what_to_record():
    # self.layers[0](x): asking for 'self.layers()' said only "callees: (none)".
    class Stack:
        def __init__(self):
            self.layers = [abs, str]

        def forward(self, x):
            h = self.layers[0](x)
            return self.layers[1](h)

    found = bcrecord.targets(Stack.forward)
    assert found.calls == {} and found.specs() == ["h@0", "self.layers@0", "self.layers@1", "return"]
    message = (
        r"never calls 'self.layers'; callees: \(none\) \(where an item of it is called, "
        r"self.layers\[0\]\(x\), that call is no call site: record its value where it is assigned "
        r"to a local or returned \('return'\), or 'self.layers@0'\)"
    )
    with pytest.raises(TargetError, match=message):
        bcrecord.patch_method(Stack, "forward", "self.layers()")
    # What it says works.
    with bcrecord.patch_method(Stack, "forward", ["h", "return"]), bcrecord.recording() as rec:
        assert Stack().forward(-2) == "2"
    assert (rec["Stack:forward:h@0"], rec["Stack:forward:return"]) == (2, "2")


def test_operators_are_numbered_as_a_reader_counts_them_on_every_version():
    # The n-th operator symbol from the left, also where brackets nest the expressions.
    def f(a, b, c, d):
        y = (a + b) + c
        z = a - (b - (c - d))
        w = a * b + c * d
        v = [x + a for x in (b, c)] + [d]
        return y, z, w, v

    with bcrecord.patch_function(f, ["+", "-", "*"]), bcrecord.recording() as rec:
        f(1, 10, 100, 1000)
    values = {key.split(":")[-1]: rec.all(key) for key in rec.keys()}
    assert values == {
        "+@0": [11],  # a + b
        "+@1": [111],  # (a + b) + c
        "-@0": [1 - (10 - (100 - 1000))],
        "-@1": [10 - (100 - 1000)],
        "-@2": [100 - 1000],
        "*@0": [10],
        "*@1": [100_000],
        "+@2": [100_010],  # a * b + c * d
        "+@3": [11, 101],  # x + a, inside the comprehension
        "+@4": [[11, 101, 1000]],
    }


def test_super_attribute_is_no_call_site_on_any_version():
    # 3.12+ compiles super().m to one instruction (no call); 3.10/3.11 agree with it.
    class Base:
        def m(self, v):
            return v + 1

    class Child(Base):
        def m(self, v):
            r = super().m(v)
            proxy = super()
            return r, proxy

    assert list(bcrecord.targets(Child.m).calls) == ["super"]  # the bare super() only
    assert [c.index for c in bcrecord.targets(Child.m).calls["super"]] == [0]


def test_an_operator_whose_right_operand_branches_comes_before_the_operators_in_it():
    def g(a, b):
        r = a + (b if b > 9 else b + 1)
        return r

    with bcrecord.patch_function(g, "+"), bcrecord.recording() as rec:
        g(100, 5)
    values = [rec.all(f"{g.__module__}:g:+@{i}") for i in (0, 1)]
    if sys.version_info >= (3, 11):
        assert values == [[106], [6]]
    else:  # 3.10 copies the outer '+' into both branches on one line: see the README's limits
        assert sorted(values) == [[6], [106]]


def test_an_operator_the_compiler_copies_into_branches_keeps_every_operator_in_reading_order():
    # 3.12+ copy the statement's tail ('n * ...', the tuple, the return) into each branch of
    # its right operand; the other operators keep their places as a reader counts them.
    def f(n, scale, flag):
        ys = [x % 2 for x in range(n % 5)]
        return ys, n * (scale or (1 if flag else n % 3))

    listed = [(row["target"], row["index"]) for row in bcrecord.targets(f).as_dict()["targets"]]
    assert [site for site in listed if site[0] in "%*"] == [("%", 0), ("%", 1), ("%", 2), ("*", 0)]
    with bcrecord.patch_function(f, ["%", "*"]), bcrecord.recording() as rec:
        for scale, flag in [(0, True), (0, False), (3, True)]:
            f(4, scale, flag)
    values = {key.split(":")[-1]: rec.all(key) for key in rec.keys()}
    assert values == {"%@1": [4] * 3, "%@0": [0, 1, 0, 1] * 3, "%@2": [1], "*@0": [4, 4, 12]}


def test_an_operand_right_after_a_walrus_on_its_line_keeps_its_operator_in_reading_order():
    # 3.13 fuses 'w := ...' and the load of 'b' into one instruction placed at 'w':
    # the outer '%' still counts from where 'b' is, after the inner one.
    def f(a, b, c):
        r = (w := a % (c or 7)) % b
        return r, w

    with bcrecord.patch_function(f, "%"), bcrecord.recording() as rec:
        assert f(47, 4, 10) == (3, 7)
        f(47, 4, 0)
    assert [rec.all(f"{f.__module__}:f:%@{k}") for k in (0, 1)] == [[7, 5], [3, 1]]


def test_string_formatting_that_3_11_compiles_away_is_no_operator_on_any_version():
    # From 3.11 '%s-%r' % (a, b) is f-string code, no '%' operator; 3.10 agrees with it.
    def f(a, b):
        s = "%s-%r" % (a, b)  # noqa: UP031
        t = a % b
        u = "%d" % (a,)  # noqa: UP031  (a unit f-strings do not take: an operator on every version)
        return s, t, u, "%s" % (a, b, 1) if a < 0 else 0  # noqa: F507, UP031  (more items than units: too)

    with bcrecord.patch_function(f, "%"), bcrecord.recording() as rec:
        assert f(7, 5) == ("7-5", 2, "7", 0)
    assert rec.keys() == [f"{f.__module__}:f:%@0", f"{f.__module__}:f:%@1"]
    assert [rec[key] for key in rec.keys()] == [2, "7"]
    assert [site.index for site in bcrecord.targets(f).operators["%"]] == [0, 1, 2]

    def g(a, b):  # a conditional's strings (3.10 copies the '%' into both branches): kept
        return ("%s!" if b else "<%r>") % (a,)

    with bcrecord.patch_function(g, "%@0"), bcrecord.recording() as rec:
        g(5, True), g(6, False)
    assert rec.all(f"{g.__module__}:g:%@0") == ["5!", "<6>"]


def test_an_operator_whose_right_operand_is_long_comes_before_the_operators_in_it():
    # 40 calls in the right operand: far more instructions than any fixed look-back window.
    source = "def f(a, b, c):\n    r = a * (b * c" + " + g(0)" * 40 + ")\n    return r\n"
    namespace = {"g": lambda v: v}
    exec(source, namespace)
    f = namespace["f"]
    with bcrecord.patch_function(f, "*"), bcrecord.recording() as rec:
        f(2, 3, 5)
    assert [rec.all(f"<unknown>:f:*@{i}") for i in (0, 1)] == [[30], [15]]  # exec'd: no module


def test_operators_in_a_condition_count_where_they_are_written():
    def pick(a, b, c):
        r = (a * b) if (b * c) else 0
        return r

    def kept(xs, b, c):
        r = [b % c for x in xs if x % 2]
        return r

    def stored(x, a, b, c, d):
        x[a * b] = c * d
        return x

    async def awaited(x, a, b, c, d):
        x[a * b] = c * d
        # 3.12+ re-enters the await's loop from its throw() path, after the return: that
        # is no jump into the operand, and this function's operators keep their order.
        y = 0 + await _echo(1)
        return x, y

    with bcrecord.patch_function(pick, "*"), bcrecord.patch_function(kept, "%"), bcrecord.recording() as rec:
        pick(2, 3, 5)
        kept([1, 2, 3], 7, 4)
    values = [rec.all(f"{pick.__module__}:pick:*@{i}") for i in (0, 1)]
    values += [rec.all(f"{kept.__module__}:kept:%@{i}") for i in (0, 1)]
    with bcrecord.patch_function(stored, "*"), bcrecord.patch_function(awaited, "*"):
        with bcrecord.recording() as rec:
            stored({}, 2, 3, 5, 7)
            asyncio.run(awaited({}, 2, 3, 5, 7))
    values += [rec.all(f"{stored.__module__}:stored:*@{i}") for i in (0, 1)]
    values += [rec.all(f"{awaited.__module__}:awaited:*@{i}") for i in (0, 1)]
    if sys.version_info >= (3, 11):  # a * b, then b * c; b % c, then x % 2; a * b, then c * d
        assert values == [[6], [15], [3, 3], [1, 0, 1], [6], [35], [6], [35]]
    else:  # no columns: on one line, in the order the compiler lays them out (see the README)
        assert values == [[15], [6], [1, 0, 1], [3, 3], [35], [6], [35], [6]]


async def _echo(v):
    return v


def _h(v):
    return v * 2


def _k(v):
    return v * 100


def test_a_callee_picked_at_run_time_is_no_site_of_either_name():
    # Both names reach the call; the probe there cannot tell which one ran.
    def either(c, a):
        return (_h if c else _k)(a) + 1

    def fallback(fn, a):
        return (fn or _h)(a)

    assert "_h" not in bcrecord.targets(either).calls and "_k" not in bcrecord.targets(either).calls
    assert "_h" not in bcrecord.targets(fallback).calls
    with pytest.raises(TargetError, match="never calls '_h'"):
        bcrecord.instrument(fallback, "_h()")
    recorded = bcrecord.instrument(either, "+@0", name="m")  # the sum after the call still is one
    with bcrecord.recording() as rec:
        assert recorded(True, 3) == 7 and recorded(False, 3) == 301
    assert rec.all("m:either:+@0") == [7, 301]


def test_calls_inside_a_generator_expression_count_where_they_are_written():
    def total(n):
        s = sum(_h(i) for i in range(n))
        return s + _h(10)

    recorded = bcrecord.instrument(total, ["_h()@0", "_h()@1"], name="m")
    with bcrecord.recording() as rec:
        assert recorded(3) == 26
    assert rec.all("m:total:_h()@0") == [0, 2, 4] and rec.all("m:total:_h()@1") == [20]


class _Maker:
    def f(self, x):
        return lambda y: x + y


def _make(x):
    return lambda y: x * y


def test_a_call_whose_result_is_called_again_is_a_site_on_every_version():
    def chained(o, v):
        r = o.f(1)(2)
        s = _make(3)(4)
        t = getattr(o, "f")(v)(5)  # noqa: B009 (the call form under test)
        u = type(v)(6)
        return r, s, t, u

    assert sorted(bcrecord.targets(chained).calls) == ["_make", "getattr", "o.f", "type"]
    specs = ["o.f()@0", "_make()@0", "getattr()@0", "type()@0"]
    patched = bcrecord.instrument(chained, specs, name="m")
    with bcrecord.recording() as rec:
        assert patched(_Maker(), 7) == (3, 12, 12, 6)
    assert rec["m:chained:o.f()@0"](10) == 11 and rec["m:chained:_make()@0"](10) == 30
    assert rec["m:chained:getattr()@0"].__func__ is _Maker.f and rec["m:chained:type()@0"] is int


def test_a_call_of_a_global_chain_inside_another_is_a_site_on_every_version():
    # F.relu(F.conv2d(x)) with F a module global: on 3.13 the outer call's NULL comes
    # right before the inner callee's root, and is not the inner callee's.
    def nested(x):
        y = math.floor(math.sqrt(x))
        z = math.floor(math.sqrt(x + 1)) + math.floor(abs(x))
        return y, z

    calls = bcrecord.targets(nested).calls
    assert sorted(calls) == ["abs", "math.floor", "math.sqrt"]
    assert [len(calls[name]) for name in ("abs", "math.floor", "math.sqrt")] == [1, 3, 2]
    specs = ["math.sqrt()@0", "math.sqrt()@1", "math.floor()@2", "abs()@0"]
    patched = bcrecord.instrument(nested, specs, name="m")
    with bcrecord.recording() as rec:
        assert patched(16) == (4, 4 + 16)
    assert rec["m:nested:math.sqrt()@0"] == 4.0 and rec["m:nested:math.sqrt()@1"] == math.sqrt(17)
    assert rec["m:nested:math.floor()@2"] == 16 and rec["m:nested:abs()@0"] == 16


def test_calls_whose_callee_load_is_half_of_a_pair_keep_their_order_and_place():
    # 3.13 fuses 'STORE_FAST h' + 'LOAD_FAST h' (and two loads) into one instruction
    # with the first half's place; the call is placed by its own instruction.
    def fused(fs, r, fn):
        pairs = [h(1) + h(2) for h in fs]
        return pairs, fn(r)

    calls = bcrecord.targets(fused).calls
    patched = bcrecord.instrument(fused, ["h()@0", "h()@1"], name="m")
    with bcrecord.recording() as rec:
        patched([lambda v: v * 10], 3, abs)
    assert rec.all("m:fused:h()@0") == [10] and rec.all("m:fused:h()@1") == [20]
    if sys.version_info >= (3, 11):  # 3.10 has no columns
        line = fused.__code__.co_firstlineno + 2
        assert (calls["fn"][0].line, calls["fn"][0].column) == (line, 22)
        assert [site.column for site in calls["h"]] == [17, 24]


async def _doubled(x):
    return x * 2


def test_an_awaited_call_records_the_coroutine_it_returns_and_its_local_what_the_await_gives():
    import asyncio
    import inspect

    async def awaiting(n):
        y = await _doubled(n)
        return y

    patched = bcrecord.instrument(awaiting, ["_doubled()", "y"], name="m")
    with bcrecord.recording(copy="none") as rec:
        assert asyncio.run(patched(3)) == 6
    (called,) = rec.all("m:awaiting:_doubled()@0")
    assert inspect.iscoroutine(called) and called.cr_code is _doubled.__code__
    assert rec.all("m:awaiting:y@0") == [6]


def _counted(n):
    yield from range(n)
    return n * 10


def test_a_delegated_call_records_the_generator_it_returns_and_its_local_what_yield_from_gives():
    import inspect

    def delegating(n):
        total = yield from _counted(n)
        return total

    patched = bcrecord.instrument(delegating, ["_counted()", "total"], name="m")
    with bcrecord.recording(copy="none") as rec:
        assert list(patched(2)) == [0, 1]
    (called,) = rec.all("m:delegating:_counted()@0")
    assert inspect.isgenerator(called) and called.gi_code is _counted.__code__
    assert rec.all("m:delegating:total@0") == [20]


def test_a_call_whose_arguments_await_is_a_site_on_every_version():
    # 3.12+ compile 'await' to a send loop that its throw() path jumps back into.
    import asyncio

    async def awaiting(n):
        a = str(await _doubled(n))
        b = str(n)
        c = sum([await _doubled(w) for w in range(n)])
        return a, b, c

    assert [len(bcrecord.targets(awaiting).calls[name]) for name in ("str", "sum")] == [2, 1]
    patched = bcrecord.instrument(awaiting, ["str()@0", "str()@1", "sum()@0"], name="m")
    with bcrecord.recording() as rec:
        assert asyncio.run(patched(3)) == ("6", "3", 6)
    assert [rec[f"m:awaiting:{spec}"] for spec in ("str()@0", "str()@1", "sum()@0")] == ["6", "3", 6]

    async def handling(n, fail):
        try:
            if fail:
                raise ValueError
        except ValueError:  # a handler's await: its throw() path falls through into the loop's end
            n = str(await _doubled(n))
        finally:  # compiled twice: for the normal and the exceptional way out
            last = str(await _doubled(n))
        return last, str(n)

    assert len(bcrecord.targets(handling).calls["str"]) == 3
    patched = bcrecord.instrument(handling, ["str()@0", "str()@1"], name="m")
    with bcrecord.recording() as rec:
        assert asyncio.run(patched(3, True)) == ("66", "6")
        assert asyncio.run(patched(2, False)) == ("4", "2")
    assert rec.all("m:handling:str()@0") == ["6"] and rec.all("m:handling:str()@1") == ["66", "4"]


async def _counting(n):
    for i in range(n):
        yield i


def test_a_call_whose_argument_is_an_async_comprehension_is_a_site_on_every_version():
    # 3.12+ inline the comprehension, whose loop ends through the exception table.
    import asyncio

    async def gathered(n):
        total = 1 + sum([i * 2 async for i in _counting(n)])
        sizes = str(len([[j async for j in _counting(i)] async for i in _counting(n)]))
        return total, sizes

    calls = bcrecord.targets(gathered).calls
    assert [len(calls[name]) for name in ("sum", "len", "str")] == [1, 1, 1]
    patched = bcrecord.instrument(gathered, ["sum()", "len()", "str()", "+"], name="m")
    with bcrecord.recording() as rec:
        assert asyncio.run(patched(3)) == (7, "3")
    assert [rec[f"m:gathered:{spec}@0"] for spec in ("sum()", "len()", "str()", "+")] == [6, 3, "3", 7]


def _both_ways(xs, z):
    y = tuple(x * 2 for x in xs)
    w = max(all(a for a in _pair(any(b for b in z))), 3)
    return y, w


def _pair(v):
    return [v, not v]


def test_all_any_and_tuple_of_a_generator_expression_are_call_sites_run_either_way(monkeypatch):
    # 3.14 runs all(g), any(g) and tuple(g) as a loop of the function's own where the name is
    # the builtin (and calls it otherwise): they were no call sites there, 'any()@0' unknown.
    specs = ["tuple()@0", "all()@0", "any()@0", "max()@0", "_pair()@0", "return"]
    assert set(specs) <= set(bcrecord.targets(_both_ways).specs())
    builtin = all  # (the loop sets this module's own 'all')
    for all_of in (builtin, lambda values: 7 + len(list(values))):  # the builtin, then a name of the module's
        monkeypatch.setitem(_both_ways.__globals__, "all", all_of)
        with bcrecord.patch_function(_both_ways, specs, name="m"), bcrecord.recording(keep="all") as rec:
            assert _both_ways([1, 2], [0, 0]) == ((2, 4), 3 if all_of is builtin else 9)
            _both_ways([], [1])
        assert rec.all("m:_both_ways:tuple()@0") == [(2, 4), ()]
        assert rec.all("m:_both_ways:any()@0") == [False, True]
        assert rec.all("m:_both_ways:_pair()@0") == [[False, True], [True, False]]
        assert rec.all("m:_both_ways:all()@0") == ([False, False] if all_of is builtin else [9, 9])
        assert rec.all("m:_both_ways:return") == [
            ((2, 4), rec.all("m:_both_ways:max()@0")[0]),
            ((), 3 if all_of is builtin else 9),
        ]


def _keyed(args, tuple=tuple, any=any):
    key = tuple(type(v) for v in args)
    return key, any(v for v in args)


def test_all_any_and_tuple_bound_to_a_local_name_are_call_sites_as_on_3_13():
    # functools._make_key's form (tuple=tuple as an argument): 3.14 tests the local against the
    # builtin and runs the loop as for a global name; tuple()@0 was no site there, only on 3.13.
    assert bcrecord.targets(_keyed).specs() == ["key@0", "any()@0", "tuple()@0", "type()@0", "return"]
    with bcrecord.patch_function(_keyed, ["tuple()@0", "any()@0"], name="m"), bcrecord.recording() as rec:
        assert _keyed([1, "a"]) == ((int, str), True)
        assert _keyed([0], tuple=list, any=lambda values: "own") == ([int], "own")
    assert rec.all("m:_keyed:tuple()@0") == [(int, str), [int]]
    assert rec.all("m:_keyed:any()@0") == [True, "own"]
