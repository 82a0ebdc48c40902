"""bcrecord.analysis: numbering of assignments, chains and returns, on every version."""

import json
import math
import os
import re
import signal
import sys
import types

import bytecode
import pytest

import bcrecord
from bcrecord import Attribute, Call, Local, NotPatchableError, Return, TargetError
from bcrecord.analysis import read, resolve, returns_none

from . import corpus
from .commands import plain


def numbered(func):
    first = func.__code__.co_firstlineno
    cmap = read(func.__code__)
    return {(a.name, a.index): a.line - first for sites in cmap.locals.values() for a in sites}


def test_every_assignment_form_is_numbered_as_a_reader_counts():
    # The same table on 3.10, 3.11, 3.12 and 3.13: synthesized stores are left out,
    # a duplicated finally body is one assignment, comprehension variables are not locals.
    assert numbered(corpus.everything) == corpus.EVERYTHING_TARGETS


def test_comprehension_variable_is_not_a_local_of_the_enclosing_function():
    def f(seq):
        out = [v + 1 for v in seq]
        return out

    assert sorted(read(f.__code__).locals) == ["out"]


NO_COLUMNS_SCRIPT = """
import bcrecord

def same_line(xs):
    x = [x * 2 for x in xs]
    return x

def spread(xs):
    y = 0
    z = [(y := v)
         for v in xs] + [y for y in xs]
    w = [v
         for v in xs]
    return y, z, w

for func, specs in ((same_line, ["x"]), (spread, ["y", "z", "w"])):
    locals_ = {name: len(sites) for name, sites in bcrecord.analysis.read(func.__code__).locals.items()}
    with bcrecord.recording() as rec:
        bcrecord.instrument(func, specs)([1, 2])
    print(sorted(locals_.items()), [(key, rec.all(key)) for key in sorted(rec.keys())])
"""


def test_code_without_columns_numbers_an_inlined_comprehension_s_name_as_with_them():
    # python -X no_debug_ranges (PYTHONNODEBUGRANGES) compiles code without columns. On
    # 3.12+ the place of an inlined comprehension's save and restore of its variable was
    # then taken to be its line: `x = [... for x in xs]` had no assignment to x, a walrus
    # on the line of a comprehension over the same name none, and a comprehension's
    # variable on another line than its start was an assignment of the function.
    run = plain("-X", "no_debug_ranges", "-c", NO_COLUMNS_SCRIPT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [
        "[('x', 1)] [('__main__:same_line:x@0', [[2, 4]])]",
        "[('w', 1), ('y', 2), ('z', 1)] [('__main__:spread:w@0', [[1, 2]]), "
        "('__main__:spread:y@0', [0]), ('__main__:spread:y@1', [1, 2]), "
        "('__main__:spread:z@0', [[1, 2, 1, 2]])]",
    ]


def test_except_cleanup_store_is_not_an_assignment():
    def f():
        try:
            raise KeyError
        except KeyError as e:
            pass
        e = 5
        return e

    assert [a.line - f.__code__.co_firstlineno for a in read(f.__code__).locals["e"]] == [3, 5]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.10 code has no columns to tell them apart")
def test_a_user_s_own_none_and_del_on_one_line_is_an_assignment():
    def f(a):
        x = a
        x = None; del x  # noqa: E702
        x = 3
        return x

    assert [a.line - f.__code__.co_firstlineno for a in read(f.__code__).locals["x"]] == [1, 2, 3]


def test_loop_condition_and_finally_copies_share_one_number():
    def f(n):
        total = 0
        while (k := n) > 0:
            n -= 1
            try:
                total = total + k
            finally:
                done = total
        return done

    cmap = read(f.__code__)
    assert [len(cmap.locals[name]) for name in ("total", "k", "n", "done")] == [2, 1, 1, 1]
    # the finally body is compiled twice: one assignment, two store instructions
    assert len(cmap.locals["done"][0].positions) == 2


def test_each_binding_of_one_name_in_one_import_is_an_assignment_also_in_copies_of_a_finally():
    # From 3.11 an import gives all its stores the statement's place: they were one site.
    def f():
        import os as x, sys as x  # noqa: E401, I001, F811
        try:
            from os import sep as y, name as y  # noqa: I001, F811
        finally:
            import json as z, math as z, json as z  # noqa: E401, I001, F811
        return x, y, z

    def g():
        done = None
        while done is None:
            try:
                continue  # the exception path's copy of the finally is dead code, after a jump
            finally:
                import os as done, sys as done  # noqa: E401, I001, F811
        return done

    cmap = read(f.__code__)
    assert [len(cmap.locals[name]) for name in ("x", "y", "z")] == [2, 2, 3]
    # the finally body is compiled twice: each of its three assignments, two store instructions
    assert [len(site.positions) for site in cmap.locals["z"]] == [2, 2, 2]
    assert len(read(g.__code__).locals["done"]) == 3
    fi = bcrecord.instrument(f, ["x@1", "y@0", "z@1", "z@2"], name="f")
    gi = bcrecord.instrument(g, ["done@2"], name="g")
    with bcrecord.recording(copy="none") as rec:
        assert fi() == (sys, os.name, json) and gi() is sys
    assert [rec.all(key) for key in ("f:f:x@1", "f:f:y@0", "f:f:z@1", "f:f:z@2", "g:g:done@2")] == [
        [sys], [os.sep], [math], [json], [sys]
    ]


def test_same_line_assignments_are_ordered_by_column():
    def f():
        x = 1; x = (x := 5) + 1  # noqa: E702
        return x

    sites = read(f.__code__).locals["x"]
    got = [(s.line - f.__code__.co_firstlineno, s.column) for s in sites]
    if sys.version_info >= (3, 11):
        assert got == [(1, 8), (1, 15), (1, 20)]
    else:  # 3.10 code objects carry no columns: three assignments, in execution order
        assert got == [(1, None), (1, None), (1, None)]
        assert [s.positions[0] for s in sites] == sorted(s.positions[0] for s in sites)


def test_the_second_name_that_one_instruction_stores_is_not_given_the_first_s_column():
    def f(pair):
        na, da = pair
        return na, da

    rows = bcrecord.targets(f).as_dict()["targets"]
    got = {
        r["target"]: (r["line"] - f.__code__.co_firstlineno, r["column"])
        for r in rows
        if r["kind"] == "local"
    }
    columns = sys.version_info >= (3, 11)
    # 3.13 stores both with one STORE_FAST_STORE_FAST, placed at 'na': 'da' was listed at 2:8 too.
    own = columns and sys.version_info < (3, 13)
    assert got == {"na": (1, 8 if columns else None), "da": (1, 12 if own else None)}


def test_a_one_line_while_whose_condition_assigns_its_body_s_name():
    def f(n):
        while (n := n - 1) > 0: n = n - 1  # noqa: E701
        return n

    g = bcrecord.instrument(f, ["n@0", "n@1"], name="w")
    with bcrecord.recording() as rec:
        assert g(7) == 0
    got = (rec.all("w:f:n@0"), rec.all("w:f:n@1"))
    if sys.version_info >= (3, 11):
        assert got == ([6, 4, 2, 0], [5, 3, 1])  # the condition's, the body's
    else:  # no columns (README): the condition's first and the body's, then its later ones
        assert got == ([6, 5, 3, 1], [4, 2, 0])


def test_two_loads_of_one_chain_on_one_line_that_a_branch_separates():
    def f(a):
        y = [] if a.b is None else list(a.b)
        return y

    g = bcrecord.instrument(f, Attribute("a.b", at="load"), name="br")
    with bcrecord.recording() as rec:
        assert g(types.SimpleNamespace(b=(1, 2))) == [1, 2]
    if sys.version_info >= (3, 11):
        assert (rec.all("br:f:a.b@0"), rec.all("br:f:a.b@1")) == ([(1, 2)], [(1, 2)])
    else:  # no columns (README): one site with both values
        assert bcrecord.targets(f).specs() == ["y@0", "a.b@0", "list()@0", "return"]
        assert rec.all("br:f:a.b@0") == [(1, 2), (1, 2)]


def test_a_comprehension_s_variable_or_an_enclosing_function_s_is_named_as_such():
    def outer(scale):
        def f(self, xs):
            outs = [layer(x) * scale for layer in self.layers for x in xs]
            squares = sum(v * v for v in xs)
            return outs, squares

        return f

    f = outer(2)
    code = f.__code__
    for name, told in [
        ("layer", "'layer' is a comprehension's own variable, no assignment: record what"),
        ("v@0", "'v' is a comprehension's own variable"),
        ("scale", "'scale' is assigned by an enclosing function, record it there, or is a type parameter"),
    ]:
        with pytest.raises(
            TargetError, match=re.escape(f"has no assignment to a local named {name.split('@')[0]!r}")
        ):
            bcrecord.instrument(f, ["outs", name])
        with pytest.raises(TargetError, match=re.escape(told)):
            bcrecord.instrument(f, ["outs", name])
        assert f.__code__ is code


COUNTER = 0


def test_a_global_the_function_assigns_is_named_as_such():
    def bump(step):
        global COUNTER
        COUNTER = COUNTER + step
        return COUNTER

    code = bump.__code__
    with pytest.raises(TargetError) as caught:
        bcrecord.instrument(bump, "COUNTER")
    assert "('COUNTER' is a global the function assigns ('global COUNTER'), no local" in str(caught.value)
    assert bump.__code__ is code
    # What it points to records the value stored there.
    with bcrecord.recording() as rec:
        bcrecord.instrument(bump, "+@0", name="m")(2)
    assert rec.all("m:bump:+@0") == [COUNTER]


@pytest.mark.skipif(sys.version_info < (3, 12), reason="type parameters are new in 3.12")
def test_a_type_parameter_is_not_said_to_be_assigned_by_an_enclosing_function():
    # T is a free variable of f as 'scale' above is, but no function around f assigns it.
    namespace = {}
    exec("def f[T](p):\n    g = lambda: T\n    return g()", namespace)
    with pytest.raises(TargetError) as caught:
        bcrecord.instrument(namespace["f"], "T")
    assert str(caught.value).endswith(
        "('T' is assigned by an enclosing function, record it there, or is a type parameter)"
    )


@pytest.mark.skipif(sys.version_info < (3, 14), reason="template strings are new in 3.14")
@pytest.mark.parametrize("template", ["t'{y!r}'", "t'{y}'"])
def test_code_the_bytecode_package_cannot_rewrite_is_said_so_by_function_line_and_construct(template):
    # bytecode 0.19.1 takes BUILD_INTERPOLATION's argument for CONVERT_VALUE's: a !r or !a
    # conversion failed to read ("ValueError: 5 is not a valid FormatValue", from `bcrecord
    # run` and `bcrecord targets` too), any other failed to write back (a bare AssertionError).
    namespace = {}
    exec(f"def f(x):\n    y = x + 1\n    s = {template}\n    return s.strings", namespace)
    try:
        with bcrecord.recording() as rec:
            assert bcrecord.instrument(namespace["f"], "y", name="t")(1) == ("", "")
    except NotPatchableError as error:
        assert str(error) == (
            f"the bytecode package {bytecode.__version__} cannot rewrite the code of f (<string>, line 3): "
            "it has a template string with a value in it (as t'{x}' has)"
        )
    else:  # a bytecode that reads and writes it
        assert rec["t:f:y@0"] == 2


@pytest.mark.skipif(sys.version_info < (3, 14), reason="template strings are new in 3.14")
def test_a_generator_expression_the_bytecode_package_cannot_read_is_left_out_not_the_function():
    # A t'{v}' in a generator expression made the whole function refused, for any spec, with an
    # error naming the generator expression; one in a nested def or lambda was left alone.
    namespace = {}
    source = "def f(a):\n    g = (t'{v}'.values for v in range(2))\n    c = a + 1\n    return c, list(g)\n"
    exec(source, namespace)
    f = namespace["f"]
    with bcrecord.patch_function(f, ["c", "g"], name="t"), bcrecord.recording() as rec:
        assert f(1) == (2, [(0,), (1,)])
    assert rec["t:f:c@0"] == 2 and type(rec["t:f:g@0"]).__name__ == "generator"
    assert bcrecord.targets(f).specs() == ["c@0", "g@0", "list()@0", "range()@0", "+@0", "return"]
    unreadable = (
        f" (not looked for in: the bytecode package {bytecode.__version__} cannot rewrite the code of "
        "f.<locals>.<genexpr> (<string>, line 2): it has a template string with a value in it "
        "(as t'{x}' has))"
    )
    with pytest.raises(TargetError, match="^f never calls 'str'; callees: list, range ") as caught:
        bcrecord.patch_function(f, "str()")
    assert str(caught.value).endswith(unreadable)


def test_an_or_pattern_binds_its_names_once_whichever_alternative_matched():
    def f(s):
        match s:
            case [x] | (x, _):
                pass
            case {"k": y} | [_, _, y]:
                pass
        x = 0
        return x

    assert [spec for spec in bcrecord.targets(f).specs() if "@" in spec] == ["x@0", "x@1", "y@0"]
    with bcrecord.patch_function(f, ["x", "y"], name="t"), bcrecord.recording() as rec:
        for subject in ([5], (6, 7), {"k": 8}, [1, 2, 9]):
            assert f(subject) == 0
    assert rec.all("t:f:x@0") == [5, 6] and rec.all("t:f:y@0") == [8, 9]
    assert rec.all("t:f:x@1") == [0, 0, 0, 0]


class _Private:
    def __init__(self):
        self.__scale = 3

    def forward(self, x):
        __y = x * self.__scale
        return self.__double(__y)

    def __double(self, v):
        return 2 * v


def test_private_names_are_spelt_as_in_the_source_and_keyed_as_the_class_s_code_has_them():
    # The compiler writes self.__scale as self._Private__scale in the class's code.
    assert bcrecord.targets(_Private.forward).specs()[:4] == [
        "_Private__y@0",
        "self._Private__double@0",
        "self._Private__scale@0",
        "self._Private__double()@0",
    ]
    specs = ["self.__scale", "self.__scale@0", "__y", "self.__double()", "self._Private__scale"]
    with bcrecord.patch_method(_Private, "forward", specs, name="p"):
        with bcrecord.recording() as rec:
            assert _Private().forward(2) == 12
    assert not rec.errors
    assert {key: rec.all(key) for key in rec.keys()} == {
        "p:forward:self._Private__scale": [3],
        "p:forward:self._Private__scale@0": [3],
        "p:forward:_Private__y@0": [6],
        "p:forward:self._Private__double()@0": [12],
    }


def test_attribute_chains_and_method_style_loads():
    def f(self, x):
        h = self.linear1(x)
        w = self.linear1.weight
        return self.linear2(h) + w

    cmap = read(f.__code__)
    assert sorted(cmap.attributes) == ["self.linear1", "self.linear1.weight", "self.linear2"]
    assert [s.method for s in cmap.attributes["self.linear1"]] == [True, False]
    assert len(cmap.attributes["self.linear1"]) == 2
    assert cmap.arguments == ("self", "x")


CONFIG = types.SimpleNamespace(lr=0.5, sub=types.SimpleNamespace(k=3))


def test_chains_rooted_at_a_global_or_builtin_are_loads_to_record():
    def step(x):
        y = CONFIG.lr * x + CONFIG.sub.k
        z = math.floor(y) + math.pi + int.real.__doc__.count("")
        return z

    cmap = read(step.__code__)
    assert sorted(cmap.attributes) == [
        "CONFIG.lr",
        "CONFIG.sub",
        "CONFIG.sub.k",
        "int.real",
        "int.real.__doc__",
        "int.real.__doc__.count",
        "math.floor",
        "math.pi",
    ]
    with bcrecord.patch_function(step, ["CONFIG.lr@0", "CONFIG.sub.k@0", "math.pi@0"], name="s"):
        with bcrecord.recording() as rec:
            got = step(4.0)
    assert got == math.floor(5.0) + math.pi + int.real.__doc__.count("")
    got = [rec[f"s:step:{chain}@0"] for chain in ("CONFIG.lr", "CONFIG.sub.k", "math.pi")]
    assert got == [0.5, 3, math.pi]
    # Read at entry, a chain's root must be an argument: the hint names the form that works...
    with pytest.raises(TargetError, match=r"record it where it is read: 'CONFIG.lr@0'"):
        resolve([Attribute("CONFIG.lr")], cmap)
    # ...and a chain the function never loads is not hinted at.
    with pytest.raises(TargetError, match=r"step never loads it; chains it loads: CONFIG.lr, "):
        resolve([Attribute("CONFIG.rate")], cmap)
    # A misspelt chain or callee, where it is read, is hinted at.
    with pytest.raises(TargetError, match=r"never loads 'CONFIG.sub.kk'; .* did you mean 'CONFIG.sub.k', "):
        resolve([Attribute("CONFIG.sub.kk", at="load")], cmap)
    with pytest.raises(TargetError, match=r"never calls 'math.flor'; callees: .* did you mean 'math.floor'"):
        resolve([Call("math.flor")], cmap)
    # super() is never a call site (it said no more than "never calls 'super'").
    with pytest.raises(TargetError, match=r"never calls 'super'; .* \(super\(\) is no call site, nor is"):
        resolve([Call("super")], cmap)
    # Nor a method called through it, written as a chain ('super.forward()').
    with pytest.raises(TargetError, match=r"never calls 'super.m'; .* \(super\(\) is no call site, nor is"):
        resolve([Call("super.m")], cmap)


def test_return_sites_include_the_implicit_return():
    def f(a):
        if a:
            return 1

    assert len(read(f.__code__).returns) == 2


def test_returns_at_one_place_are_one_site():
    # `return 1` inside `with`, and the return after an exception __exit__ swallowed:
    # two return instructions, at one source position.
    def f(cm):
        with cm:
            return 1

    (site,) = read(f.__code__).returns
    assert len(site.positions) == 2 and site.index == 0


def test_resolve_errors_name_what_exists():
    def f(self, a):
        b = a
        b = b + 1
        return self.c

    cmap = read(f.__code__)
    with pytest.raises(TargetError, match="assigned locals: b"):
        resolve([Local("nope")], cmap)
    with pytest.raises(TargetError, match=r"has 2 sites \(index 0\.\.1\); there is no index 5"):
        resolve([Local("b", 5)], cmap)
    with pytest.raises(TargetError, match="chains it loads: self.c"):
        resolve([Attribute("self.d", at="load")], cmap)
    with pytest.raises(TargetError, match="root must be an argument"):
        resolve([Attribute("b.real")], cmap)
    # An argument never reassigned: its value at entry.
    assert [(p.kind, p.label, p.root) for p in resolve([Local("a")], cmap)] == [("entry", "a", "a")]
    assert [p.label for p in resolve([Local("a", 0)], cmap)] == ["a"]
    with pytest.raises(TargetError, match="argument 'a' is never reassigned; it has one value, at entry"):
        resolve([Local("a", 1)], cmap)
    points = resolve([Local("b"), Return(), Attribute("self.c"), Attribute("self.c", at="load")], cmap)
    assert [(p.kind, p.label) for p in points] == [
        ("store", "b@0"),
        ("store", "b@1"),
        ("return", "return"),
        ("entry", "self.c"),
        ("load", "self.c@0"),
    ]


def test_overlapping_specs_name_each_site_once():
    def f(x):
        out = x + 1
        out = out * 2
        return out

    cmap = read(f.__code__)
    points = resolve([Local("out"), Local("out", 1), Return(), Return()], cmap)
    assert [p.label for p in points] == ["out@0", "out@1", "return"]
    with pytest.raises(TargetError, match="'out@1' is asked for twice with different copy policies"):
        resolve([Local("out"), Local("out", 1, copy="none")], cmap)


def test_per_instance_specs_leave_out_sites_in_comprehension_code_without_the_first_argument():
    class Net:
        k = 2

        def forward(self, rows):
            a = [sum(self.k * y for y in row) + len(list(z.real for z in row)) for row in rows]
            b = any((w := x) > self.k for x in rows[0])
            c = [q * 3 for q in rows[0]]
            return a, b, c, w

    found = bcrecord.targets(Net.forward)
    # 'z.real' and the second '*' are in generator expressions that never touch 'self'
    # (the second only on 3.10/3.11, where a list comprehension is code of its own too);
    # a walrus inside one that does is the function's own local.
    left_out = ["z.real@0", "*@1"] if sys.version_info < (3, 12) else ["z.real@0"]
    everything = found.specs()
    assert "w@0" in everything and "self.k@1" in everything
    assert found.specs(per_instance=True) == [s for s in everything if s not in left_out]
    # A flag that is no bool is refused (None listed everything, as False does).
    with pytest.raises(TypeError, match=r"^per_instance is True or False, got None$"):
        found.specs(per_instance=None)


def test_a_walrus_in_comprehension_code_assigning_a_nonlocal_is_the_function_s_assignment():
    def outer():
        x = 0

        def inc(d):
            nonlocal x
            x = d
            y = [(x := x + 1) for _ in range(2)]  # code of its own on 3.10/3.11
            s = sum((x := x * v) for v in (2, 3))  # a generator expression: on every version
            return x, y, s

        return inc

    inc = outer()
    assert [spec for spec in bcrecord.targets(inc).specs() if spec.startswith("x@")] == ["x@0", "x@1", "x@2"]
    with bcrecord.patch_function(inc, ["x"], name="t"), bcrecord.recording() as rec:
        assert inc(10) == (72, [11, 12], 96)
    assert [rec.all(f"t:inc:x@{k}") for k in range(3)] == [[10], [11, 12], [24, 72]]


def test_the_read_inside_an_augmented_attribute_assignment_is_a_load_site():
    class Counter:
        def __init__(self):
            self.count, self.inner = 10, self

        def step(self):
            self.count += 1  # reads self.count (10), then stores 11
            self.inner.count *= 2  # reads self.inner, then self.inner.count (11)
            return self.count  # 22

    specs = ["self.count@0", "self.count@1", "self.inner@0", "self.inner.count@0"]
    assert bcrecord.targets(Counter.step).specs() == [*specs, "*=@0", "+=@0", "return"]
    counter = Counter()
    with bcrecord.patch_method(counter, "step", specs, name="c"), bcrecord.recording(copy="none") as rec:
        counter.step()
    assert [rec[f"c:step:{spec}"] for spec in specs] == [10, 22, counter, 11]


def test_the_table_s_header_gives_the_parameters_in_def_order_with_their_stars():
    def f(a, /, b, *args, k=1, **kw):
        y = a + k
        return y

    def g(a, *, k):
        return a + k

    assert str(bcrecord.targets(f)).splitlines()[0].endswith("f(a, /, b, *args, k, **kw)")
    assert str(bcrecord.targets(g)).splitlines()[0].endswith("g(a, *, k)")


def test_ipython_and_jupyter_display_the_table_not_the_one_line_repr():
    # A notebook cell ending in bcrecord.targets(f) showed '<Targets of f: 2 sites>'.
    def f(a):
        x = a
        return x

    found = bcrecord.targets(f)
    written = []
    # The part of IPython's pretty printer a _repr_pretty_ uses (IPython is no core dependency).
    found._repr_pretty_(types.SimpleNamespace(text=written.append), False)
    assert written == [str(found)]
    lines = written[0].splitlines()
    assert (lines[0].rsplit(".", 1)[-1], lines[1].split(), lines[2].split()[-1]) == (
        "f(a)",
        ["kind", "target", "index", "line", "spec"],
        "x@0",
    )
    assert repr(found).endswith(".f: 2 sites>")


def test_code_the_compiler_drops_has_no_sites_on_any_version():
    # As the README says: unreachable code is not in the code object to count.
    def f(a):
        if a:
            raise ValueError(str(a))
            dropped = str(a) + 1
        if False:
            dropped = str(2)
        kept = str(3) + "!"
        return kept

    found = bcrecord.targets(f)
    assert sorted(found.locals) == ["kept"] and list(found.operators) == ["+"]
    assert [site.line - f.__code__.co_firstlineno for site in found.calls["str"]] == [2, 6]
    with pytest.raises(TargetError, match="has no assignment to a local named 'dropped'"):
        bcrecord.instrument(f, "dropped")


def test_returns_none_only_where_every_return_gives_the_constant_none():
    # The torch extractor's forward-hook warning relies on it (a hook returning None
    # leaves the module's output as it is): on the safe side wherever a value may come back.
    seen = []

    def bare(module, args, output):
        if output is None:
            return
        seen.append(output)

    def in_try_and_with(module, args, output):
        try:
            with open(__file__):
                seen.append(output)
                return
        finally:
            seen.clear()

    def conditional(module, args, output):
        return None if output else output  # a jump brings `output` to the return

    def through_a_local(module, args, output):
        nothing = None
        return nothing

    def generator(module, args, output):
        yield output

    def forwarded(module, args, output):
        return seen.append(output)  # None too, but only list.append knows it

    assert [returns_none(f.__code__) for f in (bare, in_try_and_with, conditional)] == [True, True, False]
    assert [returns_none(f.__code__) for f in (through_a_local, generator, forwarded)] == [False] * 3
    assert bare(None, (), 1) is None and seen == [1]


def test_names_a_code_generator_made_unnameable_are_not_listed_as_targets():
    # pytest's assertion rewriting adds @py_assert1, @pytest_ar._saferepr(): targets() listed
    # them, with specs such as '@py_assert1@0' that the parser refuses.
    import ast

    from _pytest.assertion.rewrite import rewrite_asserts

    source = "def test_x():\n    y = 3\n    assert y * 2 == 7, 'odd'\n"
    tree = ast.parse(source)
    rewrite_asserts(tree, source.encode())
    namespace = {}
    exec(compile(tree, "test_gen.py", "exec"), namespace)
    code = namespace["test_x"].__code__
    assert any(name.startswith("@py_assert") for name in code.co_varnames)  # (rewritten)
    found = bcrecord.targets(code)
    assert [spec for spec in found.specs() if "@py" in spec or "@pytest" in spec] == []
    assert "y@0" in found.specs() and list(found.locals) == ["y"]
    for spec in found.specs():  # each spec listed is one the parser takes
        bcrecord.parse(spec)


def test_the_targets_table_stays_aligned_for_a_local_of_wide_characters():
    namespace: dict = {}
    exec("def f(x):\n    日本 = x * 2\n    return 日本\n", namespace)
    # Padded by code points, '日本' (four columns) pushed its row's next column two further.
    line = "2:4" if sys.version_info >= (3, 11) else "2"  # (3.10's code has no columns)
    assert str(bcrecord.targets(namespace["f"])).splitlines()[1:3] == [
        "kind      target  index  line  spec",
        f"local     日本    0      {line:<4}  日本@0",
    ]


def _h(a):
    return a


def test_calls_of_a_function_an_expression_computes_are_told_from_named_ones_on_every_version():
    # What the torch layer refuses FX names after: FX names such a call as the op it is when traced.
    from bcrecord.analysis import computed_callee_calls, instructions

    acts = {"h": _h}

    def computed(x, c, o):
        a = acts["h"](x)  # an item
        b = _h(o)(x)  # a call's result
        d = (_h if c else abs)(x)  # picked at run time
        return a, b, d

    def named(x, o):
        # A name, a chain, a method of a value, a generator expression's and a lambda's own call,
        # a star call, and a call in a conditional argument.
        return _h(x), math.floor(x), o.real.conjugate(), _h(x).conjugate(), sum(v for v in [x]), (
            lambda v: v
        )(x), _h(*[x]), _h(x if o else 0)

    items = instructions(computed.__code__)
    first = computed.__code__.co_firstlineno
    assert [items[k].lineno - first for k in computed_callee_calls(computed.__code__)] == [1, 2, 3]
    assert computed_callee_calls(named.__code__) == []


def test_code_the_bytecode_package_fails_to_read_is_refused_naming_the_package_and_error(monkeypatch):
    # bytecode 0.17.0 on 3.14 raises a bare KeyError on an async comprehension in a comprehension.
    namespace = {}
    exec("def odd(x):\n    y = x + 1\n    return y\n", namespace)
    odd = namespace["odd"]

    def fails(code, **kwargs):
        raise KeyError(123)

    monkeypatch.setattr(bytecode.Bytecode, "from_code", staticmethod(fails))
    with pytest.raises(NotPatchableError) as raised:
        read(odd.__code__)
    assert str(raised.value) == (
        f"the bytecode package {bytecode.__version__} cannot read the code of odd (<string>, line 1): "
        "KeyError: 123"
    )
    assert isinstance(raised.value.__cause__, KeyError)


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
def test_a_timeout_a_signal_handler_raises_while_code_is_read_is_the_program_s(monkeypatch):
    # It came out as a NotPatchableError: a program's `except TimeoutError` never saw its timeout.
    namespace = {}
    exec("def slow(x):\n    y = x + 1\n    return y\n", namespace)

    def timeout(number, frame):
        raise TimeoutError("too slow")

    def interrupted(code, **kwargs):
        signal.raise_signal(signal.SIGUSR1)  # (the handler runs here, as a timer's would)

    old = signal.signal(signal.SIGUSR1, timeout)
    try:
        monkeypatch.setattr(bytecode.Bytecode, "from_code", staticmethod(interrupted))
        with pytest.raises(TimeoutError, match="too slow"):
            read(namespace["slow"].__code__)
    finally:
        signal.signal(signal.SIGUSR1, old)
    monkeypatch.undo()
    assert [p.label for p in resolve([Local("y")], read(namespace["slow"].__code__))] == ["y@0"]


def test_code_is_decoded_once_and_read_as_a_tuple_while_the_rewriter_edits_a_fresh_copy(monkeypatch):
    from bcrecord.analysis import editable_instructions, forget_readings, instructions

    def f(a):
        x = a + 1
        return x

    calls = []
    original = bytecode.Bytecode.from_code

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    forget_readings()
    monkeypatch.setattr(bytecode.Bytecode, "from_code", staticmethod(counted))
    first, again = instructions(f.__code__), instructions(f.__code__)
    editable = editable_instructions(f.__code__)
    read(f.__code__)
    assert len(calls) == 1  # decoded once for the readers, the reading and the rewriter
    assert type(first) is tuple and first is again
    assert isinstance(editable, bytecode.Bytecode)
    assert all(a is b for a, b in zip(editable, first, strict=True))  # the same labels, too
    editable.pop()
    assert len(instructions(f.__code__)) == len(first)  # an edit of the copy leaves the readers' alone
    forget_readings()
    assert instructions(f.__code__) is not first and len(calls) == 2  # decoded again once forgotten


def test_calls_and_operators_are_found_only_when_asked_for_and_once(monkeypatch):
    from bcrecord import analysis

    def f(self, a):
        x = self.fc(a) + 1
        ys = [self.fc(y) * 2 for y in a]  # a comprehension: code of its own on 3.10/3.11
        return x, ys

    asked = []
    original = analysis.consuming_calls

    def counted(*args, **kwargs):
        asked.append(1)
        return original(*args, **kwargs)

    analysis.forget_readings()
    monkeypatch.setattr(analysis, "consuming_calls", counted)
    cmap = read(f.__code__)
    points = resolve([Local("x"), Return()], cmap)
    assert [p.label for p in points] == ["x@0", "return"]
    assert asked == []  # a local and a return: no call site looked for
    assert {name: len(sites) for name, sites in cmap.calls.items()} == {"self.fc": 2}
    assert {op: len(sites) for op, sites in cmap.operators.items()} == {"+": 1, "*": 1}
    assert asked  # looked for now
    before = len(asked)
    assert [p.label for p in resolve([Call("self.fc")], cmap)] == ["self.fc()@0", "self.fc()@1"]
    assert analysis.Targets(cmap).specs() == [
        "x@0",
        "ys@0",
        "self.fc@0",
        "self.fc@1",
        "self.fc()@0",
        "self.fc()@1",
        "*@0",
        "+@0",
        "return",
    ]
    assert len(asked) == before  # found once, for every later question


def test_attribute_loads_are_found_only_when_asked_for_and_once(monkeypatch):
    # Finding the attribute chains was a third of reading a function whose targets name only
    # a local ('layer*.*:forward:out', each Bottleneck's): they are found at the first question.
    from bcrecord import analysis

    def f(self, a):
        x = self.fc.weight + a
        ys = [self.fc.bias * y for y in a]  # a comprehension: code of its own on 3.10/3.11
        return x, ys

    chained = []
    original = analysis._chains

    def counted(*args):
        chained.append(1)
        return original(*args)

    analysis.forget_readings()
    monkeypatch.setattr(analysis, "_chains", counted)
    cmap = read(f.__code__)
    assert [p.label for p in resolve([Local("x"), Return()], cmap)] == ["x@0", "return"]
    assert chained == []  # a local and a return: no chain looked for
    found = {chain: len(sites) for chain, sites in cmap.attributes.items()}
    assert found == {"self.fc": 2, "self.fc.bias": 1, "self.fc.weight": 1}
    assert chained  # looked for now (in the comprehension too, where it is code of its own)
    before = len(chained)
    assert [p.label for p in resolve([Attribute("self.fc.bias", at="load")], cmap)] == ["self.fc.bias@0"]
    listed = ["x@0", "ys@0", "self.fc@0", "self.fc@1", "self.fc.bias@0", "self.fc.weight@0"]
    listed += ["*@0", "+@0", "return"]
    assert analysis.Targets(cmap).specs() == listed
    assert len(chained) == before  # found once, for every later question
