"""bcrecord.patch: where patches go, how they stack, and that removal restores exactly."""

import collections
import functools
import os
import pickle
import sys
import types
import typing
import warnings

import pytest

import bcrecord
from bcrecord import NotPatchableError, SpecError, TargetError, UnsupportedPythonError, _versions, rewrite

from . import corpus
from .code_checks import collect_all, probes_in
from .forking import fork_while_held
from .interrupts import Interrupt, calls_in, interrupted


class Block:
    def forward(self, x):
        out = x + 1
        out = out * 2
        return out


def test_instance_patch_changes_only_that_instance_and_is_removed_exactly():
    a, b = Block(), Block()
    patch = bcrecord.patch_method(a, "forward", "out@1", name="blocks.0")
    assert "forward" in vars(a) and "forward" not in vars(b)
    with bcrecord.recording() as rec:
        assert a.forward(1) == b.forward(1) == 4
    assert rec.all("blocks.0:forward:out@1") == [4]
    patch.remove()
    patch.remove()  # idempotent
    assert "forward" not in vars(a) and not patch.active
    assert a.forward.__func__ is Block.forward and Block.forward.__code__ is patch.original_code


def test_class_patch_reaches_all_instances_and_restores_the_same_object():
    original = Block.__dict__["forward"]
    with bcrecord.patch_method(Block, "forward", "out@0") as patch, bcrecord.recording() as rec:
        Block().forward(1), Block().forward(2)
        assert Block.__dict__["forward"] is patch.function
    assert rec.all("Block:forward:out@0") == [2, 3]
    assert Block.__dict__["forward"] is original and original.__code__ is patch.original_code


def test_inherited_method_patched_on_subclass_is_deleted_again():
    class Sub(Block):
        pass

    with bcrecord.patch_method(Sub, "forward", "out@0"), bcrecord.recording() as rec:
        Sub().forward(5)
        Block().forward(5)
    assert rec.all("Sub:forward:out@0") == [6]
    assert "forward" not in vars(Sub)


def test_module_function_patch():
    module = types.ModuleType("fake_mod")
    exec("def helper(v):\n    doubled = v * 2\n    return doubled\n", module.__dict__)
    original = module.helper
    with bcrecord.patch_method(module, "helper", "doubled"), bcrecord.recording() as rec:
        assert module.helper(4) == 8
        assert original(5) == 10  # not in place: a held reference is unchanged
    assert rec.all("fake_mod:helper:doubled@0") == [8]
    assert module.helper is original


def test_in_place_patch_reaches_references_held_elsewhere():
    registry = {"cb": corpus.everything}
    with bcrecord.patch_method(corpus, "everything", "msg", in_place=True) as patch:
        assert corpus.everything is registry["cb"]
        with bcrecord.recording() as rec:
            registry["cb"]([1], None)
    assert rec["tests.corpus:everything:msg@0"] == "boom"
    assert corpus.everything.__code__ is patch.original_code


def test_code_set_anew_while_patched_in_place_stays_with_a_warning():
    # IPython's autoreload updates a function in place: f.__code__ = new code.
    def f(a):
        x = a + 1
        return x

    def edited(a):
        x = a + 100
        return x

    patch = bcrecord.patch_function(f, "x")
    with bcrecord.recording() as rec:
        assert f(1) == 2
    f.__code__ = edited.__code__
    with pytest.warns(bcrecord.RecordingWarning, match=r"f's code was replaced while it was patched"):
        with bcrecord.recording() as later:
            assert f(1) == 101
    patch.remove()
    assert f(1) == 101 and f.__code__ is edited.__code__
    assert rec.all(patch.keys[0]) == [2] and len(later) == 0
    with bcrecord.patch_function(f, "x") as again, bcrecord.recording() as rec:
        assert f(1) == 101
    assert rec.all(again.keys[0]) == [101]


def test_code_set_anew_on_a_class_patch_stand_in_goes_to_the_original_on_removal():
    # IPython's autoreload sets the __code__ of the function the class (or module) holds:
    # the patch's stand-in. Removing the patch must not bring the code before the edit back.
    class A:
        def m(self, a):
            x = a + 1
            return x

    def edited(self, a):
        x = a + 100
        return x

    original = A.__dict__["m"]
    patch = bcrecord.patch_method(A, "m", "x")
    for attribute in ("__code__", "__defaults__", "__doc__", "__dict__"):  # (what autoreload sets)
        setattr(A.m, attribute, getattr(edited, attribute))
    with pytest.warns(bcrecord.RecordingWarning, match=r"A.m's code was replaced while it was patched"):
        with bcrecord.recording() as rec:
            assert A().m(1) == 101
    patch.remove()
    assert A.__dict__["m"] is original and original.__code__ is edited.__code__ and A().m(2) == 102
    assert len(rec) == 0
    with bcrecord.patch_method(A, "m", "x") as again, bcrecord.recording() as rec:
        assert A().m(1) == 101
    assert rec.all(again.keys[0]) == [101]


def test_a_replaced_code_warning_made_an_error_leaves_recordings_and_patches_working():
    # pytest's filterwarnings = error: the warning raises where the probes go in or out.
    import warnings

    from bcrecord import runtime

    class A:
        def m(self, a):
            x = a + 1
            return x

    def f(a):
        y = a * 2
        return y

    def edited(self, a):
        return a + 100

    def edited_again(self, a):
        return a + 1000

    original = A.__dict__["m"]
    patch_a, patch_f = bcrecord.patch_method(A, "m", "x"), bcrecord.patch_function(f, "y")
    A.m.__code__ = edited.__code__
    with warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.RecordingWarning)
        failed = bcrecord.recording()
        with pytest.raises(bcrecord.RecordingWarning, match="code was replaced while it was patched"):
            failed.__enter__()
        assert not failed.active and not runtime.is_active() and f.__code__ is patch_f.original_code
        with bcrecord.recording() as rec:  # the other patch still records
            assert (f(3), A().m(1)) == (6, 101)
        patch_a.remove()
        assert A.__dict__["m"] is original and original.__code__ is edited.__code__
        patch_a = bcrecord.patch_method(A, "m", "return")
        A.m.__code__ = edited_again.__code__
        with pytest.raises(bcrecord.RecordingWarning, match="code was replaced while it was patched"):
            patch_a.remove()  # raised on the way: the original goes back all the same
    patch_f.remove()
    assert rec.items() == [("tests.test_patch:f:y@0", 6)]
    assert A.__dict__["m"] is original and A().m(1) == 1001 and not runtime.is_active()


def test_a_patch_whose_replaced_code_warning_is_an_error_is_not_left_in_its_function():
    import warnings

    def f(a):
        x = a + 1
        x = x * 2
        return x

    def other(a):
        return -a

    original = f.__code__
    first = bcrecord.patch_function(f, "x@0", name="one")
    # (The recording's end finds the other tool's code in place: it leaves it, warning.)
    with pytest.warns(bcrecord.RecordingWarning, match="code was replaced while it was patched"):
        with bcrecord.recording():
            saved, f.__code__ = f.__code__, other.__code__
            with warnings.catch_warnings():
                warnings.simplefilter("error", bcrecord.RecordingWarning)
                # (Refused before anything changes: made for the code before the swap, it would
                # share the slot of a patch whose code is not running.)
                with pytest.raises(NotPatchableError, match="code was replaced while it was patched"):
                    bcrecord.patch_function(f, "x@1", name="two")
    f.__code__ = saved  # (the other tool puts the patch's code back)
    with bcrecord.recording() as rec:
        assert f(1) == 4
    first.remove()
    with bcrecord.recording():  # nothing of the failed patch is left to arm
        assert f.__code__ is original
    assert rec.items() == [("one:f:x@0", 2)]


def test_code_another_tool_swapped_and_put_back_while_patched_is_ours_again():
    # A tool that saves f.__code__ (the probed code, during a recording), swaps its own in
    # and puts the saved one back: the patch records again, and its removal leaves the original.
    def f(a):
        x = a + 1
        return x

    def other(a):
        return -a

    original = f.__code__
    patch = bcrecord.patch_function(f, "x")
    with pytest.warns(bcrecord.RecordingWarning, match=r"f's code was replaced while it was patched"):
        with bcrecord.recording() as during:
            saved = f.__code__
            f.__code__ = other.__code__
            assert f(1) == -1
    f.__code__ = saved
    with bcrecord.recording() as rec:
        assert f(4) == 5
    patch.remove()
    assert f.__code__ is original and f(2) == 3
    assert len(during) == 0 and rec.all("tests.test_patch:f:x@0") == [5]


def test_probed_code_a_tool_saved_during_a_recording_and_puts_back_after_it_is_ours_still():
    # It was taken for code set anew: the probes stayed in f for good, recording nothing.
    def f(a):
        x = a + 1
        return x

    original = f.__code__
    patch = bcrecord.patch_function(f, "x")
    with bcrecord.recording():
        saved = f.__code__
    f.__code__ = saved  # (the probed code, outside any recording)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with bcrecord.recording() as rec:
            assert f(4) == 5
        assert f.__code__ is original and f(1) == 2
        patch.remove()
    assert f.__code__ is original and rec.all("tests.test_patch:f:x@0") == [5]


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is 3.12+")
def test_sys_monitoring_events_a_tool_changes_on_the_original_code_during_a_recording_stay():
    # A tool holding the code it set events on (a debugger's breakpoint) removes them, or a
    # tool that starts meanwhile sets its own there, while a recording runs: the recording's
    # exit put back the events the probed code had, bringing the breakpoint back ([1, 2, 3])
    # and dropping the other tool's (0).
    monitoring = sys.monitoring
    line = monitoring.events.LINE

    def f(a):
        x = a + 1
        y = x * 2
        return y

    original, first = f.__code__, f.__code__.co_firstlineno
    debugger, late = [t for t in range(1, 6) if monitoring.get_tool(t) is None][:2]
    seen = []
    monitoring.use_tool_id(debugger, "bcrecord-test")
    try:
        monitoring.register_callback(debugger, line, lambda code, number: seen.append(number - first))
        monitoring.set_local_events(debugger, original, line)
        with bcrecord.patch_function(f, ["x"], name="m") as patch:
            with bcrecord.recording() as rec:
                assert f(1) == 4 and seen == [1, 2, 3]
                monitoring.set_local_events(debugger, original, 0)  # the breakpoint removed
                monitoring.use_tool_id(late, "bcrecord-test-late")
                monitoring.set_local_events(late, original, line)
            assert monitoring.get_local_events(debugger, original) == 0
            assert monitoring.get_local_events(late, original) == line
            assert f(2) == 6 and seen == [1, 2, 3] and rec.all("m:f:x@0") == [2]
            monitoring.set_local_events(debugger, original, line)
            with bcrecord.recording():
                monitoring.set_local_events(debugger, original, 0)
                patch.remove()  # (the code put back by the patch's removal)
            assert monitoring.get_local_events(debugger, original) == 0
    finally:
        for tool in (debugger, late):
            if monitoring.get_tool(tool) is not None:
                monitoring.set_local_events(tool, original, 0)
                monitoring.register_callback(tool, line, None)
                monitoring.free_tool_id(tool)


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is 3.12+")
def test_sys_monitoring_local_events_go_with_the_code_a_recording_swaps_in_and_out():
    # A tool (a debugger's breakpoint, a line profiler) sets local events on the code it
    # found in f, or on the code that runs in f's frames: it sees f's lines while a
    # recording runs and after, as without the patch.
    monitoring = sys.monitoring
    line = monitoring.events.LINE

    def f(a):
        x = a + 1
        y = x * 2
        return y

    first = f.__code__.co_firstlineno
    tool = next(t for t in range(1, 6) if monitoring.get_tool(t) is None)
    seen = []
    monitoring.use_tool_id(tool, "bcrecord-test")
    try:
        monitoring.register_callback(tool, line, lambda code, number: seen.append(number - first))
        monitoring.set_local_events(tool, f.__code__, line)
        with bcrecord.patch_function(f, ["x", "y"], name="m"):
            with bcrecord.recording() as rec:
                assert f(1) == 4 and seen == [1, 2, 3]
                monitoring.set_local_events(tool, f.__code__, 0)  # off, on the probed code
                assert f(2) == 6 and seen == [1, 2, 3]
            assert f(3) == 8 and seen == [1, 2, 3]  # and off it stays
            monitoring.set_local_events(tool, f.__code__, line)
            with bcrecord.recording() as again:
                assert f(4) == 10 and seen == [1, 2, 3] * 2
    finally:
        monitoring.register_callback(tool, line, None)
        monitoring.free_tool_id(tool)  # (clears its local events too)
    assert rec.all("m:f:x@0") == [2, 3] and rec.all("m:f:y@0") == [4, 6]
    assert again.all("m:f:x@0") == [5] and again.all("m:f:y@0") == [10]


@pytest.mark.skipif(not hasattr(sys, "monitoring"), reason="sys.monitoring is 3.12+")
def test_sys_monitoring_local_events_on_nested_code_go_with_the_code_a_recording_swaps_in():
    # A breakpoint in an inner def of a patched function: the probed code's inner code is
    # rebuilt (an equal code object of its own), so the breakpoint fired nowhere while a
    # recording ran ([] inside), and one the tool removed there came back after.
    monitoring = sys.monitoring
    line = monitoring.events.LINE

    def f(a):
        x = a + 1

        def inner(b):
            c = b * 2
            return c

        return inner(x) + inner(0)

    original = f.__code__
    (nested,) = [c for c in original.co_consts if isinstance(c, types.CodeType)]
    first = nested.co_firstlineno
    tool = next(t for t in range(1, 6) if monitoring.get_tool(t) is None)
    seen = []
    monitoring.use_tool_id(tool, "bcrecord-test")
    try:
        monitoring.register_callback(tool, line, lambda code, n: seen.append((code.co_name, n - first)))
        monitoring.set_local_events(tool, nested, line)
        with bcrecord.patch_function(f, ["x"], name="m"):
            with bcrecord.recording() as rec:
                assert f(1) == 4 and seen == [("inner", 1), ("inner", 2)] * 2
                running = [c for c in f.__code__.co_consts if isinstance(c, types.CodeType)]
                assert running[0] is not nested and monitoring.get_local_events(tool, running[0]) == line
                monitoring.set_local_events(tool, running[0], 0)  # the breakpoint removed where it ran
                assert f(2) == 6 and len(seen) == 4
            assert monitoring.get_local_events(tool, nested) == 0 and f(3) == 8 and len(seen) == 4
    finally:
        monitoring.set_local_events(tool, nested, 0)
        monitoring.register_callback(tool, line, None)
        monitoring.free_tool_id(tool)
    assert rec.all("m:f:x@0") == [2, 3]


def test_a_keyword_default_changed_while_patched_stays_and_a_recording_copy_has_its_own():
    class D:
        def m(self, a, *, k=1):
            v = a + k
            return v

    with bcrecord.patch_method(D, "m", "v"):
        D.m.__kwdefaults__["k"] = 50
        assert D().m(1) == 51
    assert D().m(1) == 51 and D.m.__kwdefaults__ == {"k": 50}

    def f(a, *, k=1):
        v = a + k
        return v

    g = bcrecord.instrument(f, "v")
    g.__kwdefaults__["k"] = 7
    assert (g(1), f(1)) == (8, 2)


def test_two_patches_stack_and_remove_in_any_order():
    for order in ((0, 1), (1, 0)):
        obj = Block()
        patches = [
            bcrecord.patch_method(obj, "forward", "out@0", name="first"),
            bcrecord.patch_method(obj, "forward", ["out@1", "return"], name="second"),
        ]
        with bcrecord.recording() as rec:
            obj.forward(1)
        assert rec.keys() == ["first:forward:out@0", "second:forward:out@1", "second:forward:return"]
        patches[order[0]].remove()
        with bcrecord.recording() as rec:
            obj.forward(1)
        assert [k.split(":")[0] for k in rec.keys()][0] == ("second" if order[0] == 0 else "first")
        patches[order[1]].remove()
        assert "forward" not in vars(obj)
        with bcrecord.recording() as rec:
            obj.forward(1)
        assert len(rec) == 0


def test_failed_patch_changes_nothing():
    obj = Block()
    before_class = dict(vars(Block))
    for bad, error, message in [
        ("nope", TargetError, "assigned locals: out"),
        ("out@7", TargetError, r"has 2 sites \(index 0\.\.1\); there is no index 7"),
        ("self.missing@0", TargetError, "never loads 'self.missing'"),
        ("x@one", SpecError, "bad index"),
    ]:
        with pytest.raises(error, match=message):
            bcrecord.patch_method(obj, "forward", bad)
        assert "forward" not in vars(obj)
        with pytest.raises(error):
            bcrecord.patch_method(Block, "forward", bad)
        assert dict(vars(Block)) == before_class
    # a failed second patch leaves the first one working
    with bcrecord.patch_method(obj, "forward", "out@0"):
        with pytest.raises(TargetError):
            bcrecord.patch_method(obj, "forward", "out@9")
        with bcrecord.recording() as rec:
            obj.forward(1)
        assert rec.keys() == ["Block:forward:out@0"]


def _state(obj, func):
    from bcrecord import patch as patch_module

    return (
        dict(vars(obj)),
        dict(vars(Block)),
        func.__code__,
        Block.forward.__code__,
        dict(patch_module._slots),
    )


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        # the last of several specs bad: the good ones before it patch nothing either
        (lambda obj, f: bcrecord.patch_method(obj, "forward", ["out@0", "x", "nope"]), TargetError, "nope"),
        (lambda obj, f: bcrecord.patch_method(Block, "forward", ["out@1", "out@7"]), TargetError, "index 7"),
        (lambda obj, f: bcrecord.patch_function(f, ["a", "return", "b@x"]), SpecError, "bad index in 'b@x'"),
        (lambda obj, f: bcrecord.instrument(f, ["b", 5]), SpecError, "a spec must be"),
        (lambda obj, f: bcrecord.record_locals("b", "c")(f), TargetError, "named 'c'"),
        # a flag of the wrong type: a string was taken as true ('False' patched in place)
        (
            lambda obj, f: bcrecord.patch_method(obj, "forward", "out", in_place="False"),
            SpecError,
            "in_place",
        ),
        (lambda obj, f: bcrecord.patch_method(Block, "forward", "out", unwrap="no"), SpecError, "unwrap"),
        (
            lambda obj, f: bcrecord.patch_function(f, "b", unwrap="False"),
            SpecError,
            "unwrap is True or False",
        ),
        (
            lambda obj, f: bcrecord.patch_method(obj, "forwrd", "out"),
            NotPatchableError,
            "did you mean 'forward'",
        ),
    ],
)
def test_bad_input_among_good_raises_before_changing_anything_even_over_other_patches(call, error, message):
    def f(a):
        b = a * 3
        return b

    obj = Block()
    # Another patch of each, and a recording running: both stay as they were, and go on working.
    with bcrecord.patch_method(Block, "forward", "out@1", name="other"), bcrecord.patch_function(f, "b"):
        with bcrecord.recording() as rec:
            before = _state(obj, f)
            with pytest.raises(error, match=message):
                call(obj, f)
            assert _state(obj, f) == before
            assert obj.forward(1) == 4 and f(2) == 6
            with bcrecord.patch_method(obj, "forward", "out@0", name="obj"):  # a good call after it works
                obj.forward(2)
    # (the instance's own patch leaves out the class patch's probes for it, as documented)
    assert (rec.all("other:forward:out@1"), rec.all("obj:forward:out@0"), rec.all(f"{__name__}:f:b@0")) == (
        [4],
        [3],
        [6],
    )
    assert "forward" not in vars(obj) and obj.forward(1) == 4


def test_not_patchable_targets_give_clear_errors():
    with pytest.raises(NotPatchableError, match="builtin or C function"):
        bcrecord.patch_method([], "append", "x")
    with pytest.raises(NotPatchableError, match="builtin or C function"):
        bcrecord.instrument(len, "x")

    class Lazy:  # a non-data descriptor written in Python (inspect takes it for a C one)
        def __init__(self, func):
            self.func = func

        def __get__(self, obj, kind=None):
            return self.func.__get__(obj, kind)

    class Holder:
        @Lazy
        def m(self):
            return 1

    with pytest.raises(NotPatchableError, match=r"'m' is a Lazy descriptor \(an object of a Python class"):
        bcrecord.patch_method(Holder, "m", "return")
    with pytest.raises(NotPatchableError, match=r"patch_method\(Lazy, '__get__', specs\)$"):
        bcrecord.instrument(vars(Holder)["m"], "return")
    assert Holder().m() == 1
    # An instance is named by its class: a model's repr is its whole architecture.
    with pytest.raises(NotPatchableError, match="^this Block instance has no attribute 'forwrd'; did you"):
        bcrecord.patch_method(Block(), "forwrd", "out")
    # Only what could be patched is suggested, not data with a close name.
    holder = Block()
    holder._forward_hooks, holder.forwarded = {}, 3
    with pytest.raises(NotPatchableError, match=r"has no attribute 'forwrd'; did you mean 'forward'\?$"):
        bcrecord.patch_method(holder, "forwrd", "out")
    message = "^this SimpleNamespace instance's 'value' is 3, an int: only Python functions can be patched$"
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.patch_method(types.SimpleNamespace(value=3), "value", "x")
    # A value is shown short: its repr was every item of a module-level table, a model's whole
    # architecture (lines of it).
    shown = r"^\[0, 1, 2, 3, 4, 5, \.\.\.\], a list: only Python functions"
    with pytest.raises(NotPatchableError, match=shown):
        bcrecord.instrument(list(range(100_000)), "x")

    class Net:
        def __call__(self, x):
            return x

        def __repr__(self):
            return "Net(\n  (fc): Linear()\n)"

    shown = r"^this Net instance is a callable Net object: patch its class's"
    with pytest.raises(NotPatchableError, match=shown):
        bcrecord.instrument(Net(), "x")

    class Cached:
        @functools.cached_property
        def total(self):
            return 1

    # It said "total is ... (its .func)": no class, no expression to patch.
    message = r"^\S*\.Cached\.total is a functools.cached_property: patch the function it wraps, "
    message += r"patch_function\(\S*\.Cached\.total\.func, specs\)$"
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.patch_method(Cached, "total", "return")
    with bcrecord.patch_function(Cached.total.func, "return", name="c"), bcrecord.recording() as rec:
        assert Cached().total == 1
    assert rec.all("c:total:return") == [1]

    class Memo:
        @functools.lru_cache  # noqa: B019 (the test needs a method wrapped in C)
        def value(self, x):
            y = x + 1
            return y

        @property
        def size(self):
            return 1

    message = r"\.Memo\.value is a _lru_cache_wrapper .*patch_function\(.*\.Memo\.value\.__wrapped__, specs"
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.patch_method(Memo, "value", "y")
    # On 3.13 a property has a name of its own, without the class: the getter's is used.
    message = r"\.Memo\.size is a property: patch its getter, patch_function\(.*\.Memo\.size\.fget, specs\)"
    with pytest.raises(NotPatchableError, match=message):  # (it said '<property>.fget')
        bcrecord.patch_method(Memo, "size", "return")
    with bcrecord.patch_function(Memo.size.fget, "return"), bcrecord.recording() as rec:
        assert Memo().size == 1
    assert rec.all("Memo:size:return") == [1]
    # What the message says works: the wrapper calls the patched function.
    with bcrecord.patch_function(Memo.value.__wrapped__, "y"), bcrecord.recording() as rec:
        assert Memo().value(3) == 4
    assert rec.all("Memo:value:y@0") == [4]

    class Slotted:
        __slots__ = ()

        def f(self):
            y = 1
            return y

    one = Slotted()
    # It said only "patch the class instead", which records every instance: now how to keep one's.
    message = (
        r"Slotted instances have no __dict__ \(uses __slots__\?\), so none can hold a method of its own: "
    )
    message += (
        r"patch the class \(patch_method\(Slotted, 'f', \.\.\.\), with name= a function of the instance"
    )
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.patch_method(one, "f", "y")
    owner = lambda obj: "one" if obj is one else None  # noqa: E731
    with bcrecord.patch_method(Slotted, "f", "y", name=owner), bcrecord.recording() as rec:
        assert one.f() == Slotted().f() == 1
    assert rec.all("one:f:y@0") == [1] and rec.keys() == ["one:f:y@0"]

    class Settable:
        @property
        def size(self):
            return 1

        @size.setter
        def size(self, value):
            kept = value * 2
            self.__dict__["kept"] = kept

    # A property with a setter: the message named only the getter, whose values are not the setter's.
    message = (
        r"\.Settable\.size is a property: patch its getter, patch_function\(.*\.Settable\.size\.fget, specs\)"
    )
    message += r" \(its setter or deleter: .*\.Settable\.size\.fset\)$"
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.patch_method(Settable, "size", "kept")
    with bcrecord.patch_function(Settable.size.fset, "kept"), bcrecord.recording() as rec:
        Settable().size = 4
    assert rec.all("Settable:size:kept@0") == [8]


def _get_area(self):
    area = self.side**2
    return area


class Square:
    def __init__(self, side):
        self.side = side

    area = property(_get_area)  # a getter under a name of its own

    def _get_side2(self):
        twice = self.side * 2
        return twice

    perimeter_half = property(_get_side2)


def test_a_property_made_of_a_named_getter_says_to_patch_that_function():
    # It said "_get_area is a property: ... patch_function(_get_area.fget, specs)": no such thing.
    message = r"^\S*Square\.area is a property: patch its getter, patch_function\(_get_area, specs\)$"
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.patch_method(Square, "area", "area")
    with pytest.raises(NotPatchableError, match=r"patch_function\(Square\._get_side2, specs\)$"):
        bcrecord.patch_method(Square(1), "perimeter_half", "twice")
    # What it says works: the property calls the function patched in place.
    with bcrecord.patch_function(_get_area, "area", name="sq"), bcrecord.recording() as rec:
        assert Square(3).area == 9
    assert rec.all("sq:_get_area:area@0") == [9]
    # So for a partial of it (it said '(its .func)').
    message = r"^a functools\.partial of _get_area: patch the function it calls, "
    message += r"patch_function\(_get_area, specs\)$"
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.patch_function(functools.partial(_get_area, Square(2)), "area")


def test_generated_attributes_without_code_say_why_and_what_works():
    import collections
    import enum

    # A namedtuple's field is C code: "..., a _tuplegetter: only Python functions can be patched".
    Point = collections.namedtuple("Point", "x y")
    with pytest.raises(
        NotPatchableError, match=r"'x' is a _tuplegetter \(C code that gives an attribute its"
    ):
        bcrecord.patch_method(Point, "x", "return")
    with pytest.raises(
        NotPatchableError, match=r"no bytecode to patch; record the value where a function reads"
    ):
        bcrecord.targets(Point.y)

    # An enum's value: "patch_method(property, '__get__', specs)" on 3.12+, enum's property, not the
    # builtin one that name gives; the getter it runs is what to patch.
    class Color(enum.Enum):
        RED = 1

    getter = r"around a getter: patch the getter, patch_function\(Enum\.__dict__\['value'\]\.fget, specs\)$"
    with pytest.raises(NotPatchableError, match=getter):
        bcrecord.patch_method(Color, "value", "return")
    with (
        bcrecord.patch_function(enum.Enum.__dict__["value"].fget, "return", name="e"),
        bcrecord.recording() as rec,
    ):
        assert Color.RED.value == 1
    assert rec.all("e:value:return") == [1]

    # A partial of a builtin: "patch the function it calls, patch_function(int, specs)", which fails.
    with pytest.raises(
        NotPatchableError, match=r"^a functools\.partial of int, which it calls: int is a class whose"
    ):
        bcrecord.patch_function(functools.partial(int, base=2), "return")


def test_a_cached_property_of_an_attrs_slotted_class_says_which_function_to_patch():
    attrs = pytest.importorskip("attrs")

    @attrs.define  # (slots=True: the cached_property becomes a slot its __getattr__ fills)
    class Box:
        side: int

        @functools.cached_property
        def volume(self):
            v = self.side**3
            return v

    # It said "...Box.volume, a member_descriptor: only Python functions can be patched".
    message = (
        r"^\S*Box\.volume is a slot that the class's __getattr__ fills on the first read by calling "
        r"\S*Box\.volume \(an attrs slotted class's cached_property\): patch that function, "
        r"patch_function\(Box\.__getattr__\.__globals__\['cached_properties'\]\['volume'\], specs\)$"
    )
    for holder in (Box, Box(1)):
        with pytest.raises(NotPatchableError, match=message):
            bcrecord.patch_method(holder, "volume", "v")
    # What it says works.
    function = Box.__getattr__.__globals__["cached_properties"]["volume"]
    with bcrecord.patch_function(function, "v", name="box"), bcrecord.recording() as rec:
        assert Box(2).volume == 8
    assert rec.all("box:volume:v@0") == [8]


def test_a_hypothesis_given_test_is_recorded_in_the_function_it_runs():
    from hypothesis import given, settings, strategies

    seen = []

    @settings(max_examples=5, database=None)
    @given(strategies.integers(0, 9))
    def test_doubled(n):
        y = n * 2
        seen.append(y)

    # @given's wrapper has no __wrapped__: it was patched itself, where no 'y' is assigned.
    with bcrecord.patch_function(test_doubled, "y", name="h"), bcrecord.recording() as rec:
        test_doubled()
    assert rec.all("h:test_doubled:y@0") == seen and len(seen) == 5
    with pytest.raises(NotPatchableError, match=r"^\S*test_doubled is given inside a wrapper"):
        bcrecord.record_locals("y")(test_doubled)  # a copy would drop @given
    below = settings(max_examples=3, database=None)(
        given(strategies.integers(0, 9))(
            bcrecord.record_locals("y", name="b")(test_doubled.hypothesis.inner_test)
        )
    )
    seen.clear()
    with bcrecord.recording() as rec:
        below()
    assert rec.all("b:test_doubled:y@0") == seen and len(seen) == 3


def test_a_singledispatchmethod_read_from_an_instance_is_refused_as_the_descriptor_is():
    class Shape:
        @functools.singledispatchmethod
        def scale(self, by):
            r = "other"
            return r

        @scale.register
        def _(self, by: int):
            r = by * 2
            return r

    shape = Shape()
    # shape.scale is a function whose __wrapped__ is the default implementation: patching it
    # recorded only the calls that fell back to it (shape.scale(2) gave nothing, silently).
    message = r"^\S*Shape\.scale is a functools.singledispatchmethod: patch the implementation that runs, "
    message += r"Shape\.__dict__\['scale'\]\.func \(the default one\) or one registered for a type "
    message += r"\(Shape\.__dict__\['scale'\]\.dispatcher\.registry\[type\]\)$"
    for refused in (
        lambda: bcrecord.patch_function(shape.scale, "r"),
        lambda: bcrecord.patch_method(Shape, "scale", "r"),
    ):
        with pytest.raises(NotPatchableError, match=message):
            refused()
    # Nor are its targets listed (they were the default implementation's, which run refused).
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.targets(shape.scale)

    @functools.singledispatch
    def area(shape):
        a = 0
        return a

    with pytest.raises(NotPatchableError, match=r"^\S*area is a functools.singledispatch function"):
        bcrecord.targets(area)
    assert bcrecord.targets(area.registry[object]).specs() == ["a@0", "return"]
    # What it says works (it said 'its .func', which Shape.scale, a function, has not).
    registered = Shape.__dict__["scale"].dispatcher.registry[int]
    with bcrecord.patch_function(registered, "r", name="s"), bcrecord.recording() as rec:
        assert shape.scale(2) == 4 and shape.scale("x") == "other"
    assert rec.all("s:_:r@0") == [4]


def test_keys_of_a_generated_lambda_use_the_name_it_was_given():
    import collections
    import typing

    Point = collections.namedtuple("Point", "x y")

    class Pair(typing.NamedTuple):
        left: int
        right: int = 0

    # Their __new__ is a lambda renamed __new__: the keys said 'Point:<lambda>:return'.
    for cls, args in ((Point, (1, 2)), (Pair, (3,))):
        with bcrecord.patch_function(cls.__new__, ["return", "x" if cls is Point else "left"]) as patch:
            with bcrecord.recording() as rec:
                made = cls(*args)
        assert patch.keys[0] == f"{cls.__name__}:__new__:return" and rec[patch.keys[0]] == made
        assert rec[patch.keys[1]] == args[0]
    plain = lambda v: v + 1  # noqa: E731  (a lambda known by no other name keeps its own)
    with bcrecord.patch_function(plain, "return", name="m") as patch:
        assert patch.keys == ("m:<lambda>:return",)


class Parameter:
    pass


class Layer(Block):
    """Attributes made by __getattr__ and a dir() naming some twice, as torch's nn.Module has."""

    def __getattr__(self, name):
        if name == "weight":
            return Parameter()
        raise AttributeError(name)

    def __dir__(self):
        return [*super().__dir__(), "forward", "weight"]


def test_a_cache_under_a_staticmethod_or_classmethod_says_what_to_patch():
    # It said "A.s is a builtin or C function: it has no bytecode to patch".
    class A:
        @staticmethod
        @functools.lru_cache
        def s(a):
            x = a * 2
            return x

        @classmethod
        @functools.cache
        def c(cls, a):
            x = a * 3
            return x

    for method in ("s", "c"):
        wrapped = rf"patch_function\(.*\.A\.{method}\.__wrapped__, specs"
        message = rf"^.*\.A\.{method} is a _lru_cache_wrapper .*{wrapped}"
        with pytest.raises(NotPatchableError, match=message):
            bcrecord.patch_method(A, method, "x")
    with pytest.raises(NotPatchableError, match=r"A\.s is a _lru_cache_wrapper"):
        bcrecord.targets(A.__dict__["s"])
    # What the message says works.
    with (
        bcrecord.patch_function(A.s.__wrapped__, "x", name="A"),
        bcrecord.patch_function(A.c.__wrapped__, "x", name="A"),
        bcrecord.recording() as rec,
    ):
        assert (A.s(2), A.c(2)) == (4, 6)
    assert (rec["A:s:x@0"], rec["A:c:x@0"]) == (4, 6)


def test_a_python_class_made_to_look_like_the_function_it_wraps_is_not_called_c_code():
    # functools.update_wrapper(self, f) in a decorator class: it said "(C code around ...)".
    class Traced:
        def __init__(self, f):
            functools.update_wrapper(self, f)
            self.f = f

        def __call__(self, *args):
            return self.f(*args)

    @Traced
    def g(a):
        x = a + 1
        return x

    message = (
        r"^.*g is a Traced \(an object of a Python class around a Python function\): patch the function "
        r"it wraps, patch_function\(.*g\.__wrapped__, specs\)$"
    )
    with pytest.raises(NotPatchableError, match=message):
        bcrecord.patch_function(g, "x")
    with bcrecord.patch_function(g.__wrapped__, "x", name="m"), bcrecord.recording() as rec:
        assert g(1) == 2
    assert rec["m:g:x@0"] == 2


def test_a_wraps_decorator_over_a_cache_or_a_staticmethod_records_the_function_inside():
    # functools.wraps over lru_cache (or over a staticmethod, in a class body) stopped at the
    # wrapper: "lw has no assignment to a local named 'x'; assigned locals: (none)".
    def logged(f):
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            return f(*args, **kwargs)

        return wrapper

    @logged
    @functools.lru_cache
    def lw(a):
        x = a - 2
        return x

    class B:
        @logged
        @staticmethod
        def s(a):
            x = a * 11
            return x

    assert bcrecord.targets(lw).specs() == ["x@0", "-@0", "return"]
    with (
        bcrecord.patch_function(lw, "x", name="m") as patch,
        bcrecord.patch_method(B, "s", "x"),
        bcrecord.recording() as rec,
    ):
        assert (lw(5), lw(5), lw(6), B.s(1)) == (3, 3, 4, 11)
    assert rec.all("m:lw:x@0") == [3, 4] and rec.all("B:s:x@0") == [11]  # (a cache hit runs no code)
    assert patch.keys == ("m:lw:x@0",) and lw.__wrapped__.__wrapped__.__code__ is patch.original_code


def test_an_attribute_made_by_getattr_is_named_and_suggestions_are_not_repeated():
    with pytest.raises(NotPatchableError) as caught:
        bcrecord.patch_method(Layer(), "weight", "x")
    assert str(caught.value) == (
        "this Layer instance's 'weight' is a Parameter (from __getattr__): only Python functions "
        "defined on it or its class can be patched"
    )
    with pytest.raises(NotPatchableError) as caught:
        bcrecord.patch_method(Layer(), "forwrd", "out")
    assert str(caught.value) == "this Layer instance has no attribute 'forwrd'; did you mean 'forward'?"


def test_unsupported_python_version_is_a_clear_error(monkeypatch):
    with pytest.raises(UnsupportedPythonError, match=r"Python 3\.9 is not supported"):
        _versions.current((3, 9))
    monkeypatch.setattr(_versions, "_current", None)
    monkeypatch.setattr(sys, "version_info", (3, 99, 0, "final", 0))
    # An empty rewrite cache: a template of Block.forward an earlier test made is reused without
    # a version check, so after test_fifty_instances_share_one_rewrite nothing raised.
    monkeypatch.setattr(rewrite, "_cache", type(rewrite._cache)())
    obj = Block()
    with pytest.raises(UnsupportedPythonError, match=r"3\.99"):
        bcrecord.patch_method(obj, "forward", "out")
    assert "forward" not in vars(obj)


def test_fifty_instances_share_one_rewrite():
    rewrite.clear_cache()
    before = rewrite.cache_info()["misses"]
    blocks = [Block() for _ in range(50)]
    patches = [bcrecord.patch_method(b, "forward", "out", name=f"blocks.{i}") for i, b in enumerate(blocks)]
    assert rewrite.cache_info()["misses"] - before == 1
    with bcrecord.recording() as rec:
        for b in blocks:
            b.forward(1)
    assert len(rec) == 100 and rec["blocks.49:forward:out@1"] == 4
    for p in patches:
        p.remove()


def test_decorator_records_and_keeps_the_function_usable():
    @bcrecord.record_locals("acc", index=[0, 2], name="deco")
    def summed(values):
        acc = 0
        for v in values:
            acc = acc + v
        acc = -acc
        return acc

    assert summed([1, 2]) == -3  # no recording: plain call
    with bcrecord.recording() as rec:
        assert summed([1, 2]) == -3
    assert rec.keys() == ["deco:summed:acc@0", "deco:summed:acc@2"]
    assert rec["deco:summed:acc@2"] == -3


def test_idle_patched_function_runs_the_original_code():
    obj = Block()
    with bcrecord.patch_method(obj, "forward", "out") as patch:
        assert obj.forward.__func__.__code__ is patch.original_code
        with bcrecord.recording():
            assert obj.forward.__func__.__code__ is patch.code
        assert obj.forward.__func__.__code__ is patch.original_code


def test_a_recording_with_only_arms_just_the_patches_it_takes():
    obj = Block()
    first = bcrecord.patch_method(obj, "forward", "out@0", name="first")
    second = bcrecord.patch_method(obj, "forward", ["out@1", "return"], name="second")
    live = obj.forward.__func__
    try:
        assert probes_in(first.code) == 3
        with bcrecord.recording(only=[first]) as outer:
            assert probes_in(live.__code__) == 1
            with bcrecord.recording() as inner:  # takes every patch: all armed
                assert live.__code__ is first.code
                obj.forward(1)
            assert probes_in(live.__code__) == 1
            with bcrecord.recording(only=[second]):
                assert probes_in(live.__code__) == 3
            outer._take(second)  # taken while active (bcrecord run's patches made on import)
            assert live.__code__ is first.code
            obj.forward(2)
        assert live.__code__ is first.original_code
        assert inner.keys() == ["first:forward:out@0", "second:forward:out@1", "second:forward:return"]
        assert outer.all("first:forward:out@0") == [2, 3] and outer.all("second:forward:return") == [6]
        with bcrecord.recording(only=[second]) as rec:
            assert probes_in(live.__code__) == 2
            obj.forward(1)
        assert rec.keys() == ["second:forward:out@1", "second:forward:return"]
    finally:
        first.remove()
        second.remove()
    assert "forward" not in vars(obj)


def test_removal_from_a_finalizer_never_waits_for_a_busy_patch_lock():
    # A finalizer may run inside code holding the runtime's locks while another
    # thread holds the patch lock and waits for those: it must not wait in turn.
    import threading

    from bcrecord import patch as patch_module

    original = Block.forward
    patch = bcrecord.patch_method(Block, "forward", "out")
    held, release = threading.Event(), threading.Event()

    def hold_the_lock():
        with patch_module._lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    held.wait()
    patch_module.remove_soon([patch])  # returns at once: the lock is busy
    assert patch.active and Block.forward is not original
    release.set()
    holder.join()
    for remover in [t for t in threading.enumerate() if t.name == "bcrecord-unpatch"]:
        remover.join(10)  # (it may be done already)
    assert not patch.active and Block.forward is original


def test_removal_from_a_finalizer_inside_this_thread_s_patching_waits_for_it(monkeypatch):
    # The collector may finalize a dropped patch of a method while this thread adds
    # another patch to the same method: removing it there would undo the new one too.
    import threading

    from bcrecord import patch as patch_module

    original = Block.forward
    dropped = bcrecord.patch_method(Block, "forward", "out@0", name="dropped")
    real_plan = patch_module._Slot.plan

    def plan_with_a_collection(slot, patches):
        if len(patches) == 2:  # the new patch's install, halfway
            patch_module.remove_soon([dropped])
        return real_plan(slot, patches)

    monkeypatch.setattr(patch_module._Slot, "plan", plan_with_a_collection)
    kept = bcrecord.patch_method(Block, "forward", "out@1", name="kept")
    monkeypatch.undo()
    for remover in [t for t in threading.enumerate() if t.name == "bcrecord-unpatch"]:
        remover.join(10)
    try:
        assert not dropped.active and kept.active and Block.forward is not original
        with bcrecord.recording() as rec:
            Block().forward(1)
        assert rec.keys() == ["kept:forward:out@1"]
    finally:
        kept.remove()
    assert Block.forward is original


def test_patch_repr_and_keys():
    with bcrecord.patch_method(Block, "forward", ["out@0", "return"], name="m") as patch:
        assert patch.keys == ("m:forward:out@0", "m:forward:return")
        assert "active" in repr(patch) and "m:forward:return" in repr(patch)
    assert "removed" in repr(patch)


def test_targets_table_and_data():
    t = bcrecord.targets(corpus.ToyModel.forward)
    assert "outputs@1" in t.specs() and "self.linear1@0" in t.specs()
    table = str(t)
    assert table.splitlines()[0] == "ToyModel.forward(self, inputs, data_samples, mode)"
    assert "local      outputs" in table or "local" in table.splitlines()[2]
    data = t.as_dict()
    outputs = [r for r in data["targets"] if r["target"] == "outputs"]
    first = corpus.ToyModel.forward.__code__.co_firstlineno
    assert [(r["index"], r["line"] - first) for r in outputs] == [(0, 3), (1, 4), (2, 9)]


def test_targets_read_the_original_code_while_a_recording_runs_its_probes():
    def area(self, w, h):
        a = self.scale * w * h
        return abs(a)

    def listed() -> list:
        return bcrecord.targets(area).specs()

    before = listed()
    instance = types.SimpleNamespace(scale=2)
    holder = types.SimpleNamespace(area=types.MethodType(area, instance))
    with bcrecord.patch_function(area, ["a", "*@0", "abs()", "self.scale"], name="f") as patch:
        with bcrecord.recording() as rec:
            assert area.__code__ is not patch.original_code  # the probes run now
            inside = listed()
            assert bcrecord.patch.original_code(area) is patch.original_code
            area(instance, 2, 3)
    assert inside == before == ["a@0", "self.scale@0", "abs()@0", "*@0", "*@1", "return"]
    assert rec["f:area:abs()@0"] == 12 and rec["f:area:*@0"] == 4
    # a patched instance's own copy of a method reads as its original too
    with bcrecord.patch_method(holder, "area", ["a"], name="h"), bcrecord.recording() as rec:
        assert bcrecord.targets(holder.area).specs() == before
        holder.area(1, 5)
    assert rec["h:area:a@0"] == 10


def test_a_shallow_copy_made_while_an_instance_is_patched_runs_its_own_method_after_removal():
    import copy

    class Counter:
        def __init__(self):
            self.k = 1

        def step(self, v):
            y = v + self.k
            return y

    counter = Counter()
    kept = {"step": None}
    with bcrecord.patch_method(counter, "step", ["y"]):
        twin = copy.copy(counter)  # shares the instance __dict__'s values: the patched method too
        kept["step"] = counter.step  # a dict of the user's, not an instance's: left alone
    twin.k = 100
    assert twin.step(1) == 101 and "step" not in vars(twin) and "step" not in vars(counter)
    assert kept["step"].__self__ is counter and kept["step"](1) == 2


class Scaled:
    def __init__(self, k):
        self.k = k

    def fwd(self, x):
        z = x * self.k
        return z


def test_a_deep_copy_made_while_an_instance_is_patched_records_itself_then_runs_the_class_s_method():
    import copy

    net = Scaled(2)
    with bcrecord.patch_method(net, "fwd", ["z"], name="net"):
        twin = copy.deepcopy(net)  # the EMA pattern: the copy's method is bound to the copy
        twin.k = 10
        with bcrecord.recording() as rec:
            assert twin.fwd(1) == 10
    assert rec.all("net:fwd:z@0") == [10] and "fwd" not in vars(twin) and "fwd" not in vars(net)
    # Nothing of the patch is left in the copy to hide a later patch of the class.
    with bcrecord.patch_method(Scaled, "fwd", ["z"], name="cls"), bcrecord.recording() as rec:
        net.fwd(1), twin.fwd(2)
    assert rec.all("cls:fwd:z@0") == [2, 20]


def test_a_copy_patched_itself_gets_the_class_s_method_back_whichever_patch_goes_first():
    import copy

    for make in (copy.copy, copy.deepcopy):
        net = Scaled(2)
        first = bcrecord.patch_method(net, "fwd", ["z"], name="net")
        twin = make(net)  # holds the patched method (bound to net, or to itself)
        twin.k = 10
        second = bcrecord.patch_method(twin, "fwd", ["z"], name="twin")
        first.remove()
        second.remove()  # put back what it found: the first patch's method, gone now
        assert "fwd" not in vars(twin) and twin.fwd(1) == 10, make
        with bcrecord.patch_method(Scaled, "fwd", ["z"], name="cls"), bcrecord.recording() as rec:
            twin.fwd(1)
        assert rec.all("cls:fwd:z@0") == [10], make


def test_one_class_patch_with_per_instance_owner_names():
    blocks = [Block() for _ in range(3)]
    paths = {id(b): f"layer1.{i}" for i, b in enumerate(blocks[:2])}  # the third is not named

    with bcrecord.patch_method(
        Block, "forward", ["out@1", "return"], name=lambda m: paths.get(id(m))
    ) as patch:
        assert patch.keys == ("*:forward:out@1", "*:forward:return")
        with bcrecord.recording() as rec:
            for x, b in enumerate(blocks):
                b.forward(x)
        assert len({b.forward.__func__.__code__ for b in blocks}) == 1  # one shared code object
    assert rec.keys() == [
        "layer1.0:forward:out@1",
        "layer1.0:forward:return",
        "layer1.1:forward:out@1",
        "layer1.1:forward:return",
    ]
    assert rec.all("layer1.0:forward:out@1") == [2] and rec.all("layer1.1:forward:out@1") == [4]
    with pytest.raises(NotPatchableError, match="first argument is the instance"):
        bcrecord.patch_function(lambda: 1, "return", name=str)


def test_inline_probes_are_respelled_as_calls_on_request_even_while_recording():
    # What importing bcrecord.torch does for patches made before torch was imported.
    from bcrecord.patch import respell_inline

    class Box:
        def grow(self, a):
            y = a + 1
            return y * 2

    original = Box.grow.__code__
    previous = rewrite.set_probe_style("inline")
    try:
        box = Box()
        patch = bcrecord.patch_method(Box, "grow", ["y", "return"], name="box")
        other = bcrecord.instrument(lambda a: a - 1, "return", name="other")
        with bcrecord.recording() as rec:
            assert box.grow(1) == 4
            rewrite.set_probe_style("call")
            assert respell_inline() >= 2
            assert calls_probe(Box.grow) and calls_probe(other)  # the armed code is swapped at once
            assert box.grow(2) == 6 and other(5) == 4
        assert respell_inline() == 0  # nothing inline is left
        assert rec.all("box:grow:y@0") == [2, 3] and rec.all("box:grow:return") == [4, 6]
        assert rec.all("other:<lambda>:return") == [4]
        assert patch.keys == ("box:grow:y@0", "box:grow:return")
        patch.remove()
        assert Box.grow.__code__ is original and box.grow(1) == 4
    finally:
        rewrite.set_probe_style(previous)


def calls_probe(func):
    return _versions.PROBE_NAME in func.__code__.co_names


def test_a_plain_function_kept_on_an_instance_stays_plain():
    # m.forward = hook: Python calls it without the instance, and so must the patch.
    class Model:
        pass

    def hook(x):
        y = x + 1
        return y

    m = Model()
    m.forward = hook
    with bcrecord.patch_method(m, "forward", ["y"], name="m"), bcrecord.recording() as rec:
        assert m.forward(1) == 2
    assert rec["m:forward:y@0"] == 2 and m.__dict__["forward"] is hook and m.forward(5) == 6


def test_the_swap_hook_sees_probed_code_go_in_and_out():
    from bcrecord.patch import set_swap_hook

    def f(a):
        b = a + 1
        return b

    seen = []
    previous = set_swap_hook(lambda code, armed, function: seen.append((code, armed, function)))
    try:
        with bcrecord.patch_function(f, "b"):
            original = f.__code__
            with bcrecord.recording():
                probed = f.__code__
                f(1)
            with bcrecord.recording():
                f(2)
    finally:
        set_swap_hook(previous)
    assert probed is not original
    mine = [(code, armed, function) for code, armed, function in seen if code is probed]  # (others' arm too)
    assert mine == [(probed, True, f), (probed, False, f), (probed, True, f), (probed, False, f)]


def test_a_per_instance_name_on_a_staticmethod_is_refused():
    class Tools:
        @staticmethod
        def scale(v):
            y = v * 3
            return y

    with pytest.raises(bcrecord.NotPatchableError, match="scale is a staticmethod: it gets no instance"):
        bcrecord.patch_method(Tools, "scale", "y", name=lambda inst: "t")
    assert Tools.scale(2) == 6 and "scale" in vars(Tools) and isinstance(vars(Tools)["scale"], staticmethod)


def test_instrument_and_record_locals_take_a_per_instance_name_as_patch_method_does():
    # Typed as taking a string only, while they took the function too: now typed and documented.
    class Encoder:
        def __init__(self, role):
            self.role = role

        @bcrecord.record_locals("h", name=lambda encoder: encoder.role or None)
        def forward(self, x):
            h = x + 1
            return h

        def scale(self, x):
            y = x * 3
            return y

        @staticmethod
        def plain(v):
            y = v * 3
            return y

    Encoder.scale = bcrecord.instrument(Encoder.scale, "y", name=lambda encoder: encoder.role or None)
    query, frozen = Encoder("query"), Encoder("")
    with bcrecord.recording() as rec:
        assert (query.forward(1), frozen.forward(2), query.scale(1), frozen.scale(2)) == (2, 3, 3, 6)
    assert rec.keys() == ["query:forward:h@0", "query:scale:y@0"]
    with pytest.raises(bcrecord.NotPatchableError, match="plain is a staticmethod: it gets no instance"):
        bcrecord.instrument(vars(Encoder)["plain"], "y", name=lambda inst: "t")
    with pytest.raises(bcrecord.NotPatchableError, match="plain is a staticmethod: it gets no instance"):
        bcrecord.record_locals("y", name=lambda inst: "t")(vars(Encoder)["plain"])
    assert Encoder.plain(2) == 6 and isinstance(vars(Encoder)["plain"], staticmethod)


def test_patch_method_takes_a_method_named_as_the_source_writes_it():
    # 'def \ufb01wd' (a ligature) defines 'fiwd': the name as written was "no attribute", while
    # the specs beside it, the CLI and the torch layer take names as the source writes them.
    namespace: dict = {}
    exec("class N:\n    def \ufb01wd(self, a):\n        \ufb01 = a + 1\n        return \ufb01\n", namespace)
    cls = namespace["N"]
    with bcrecord.patch_method(cls, "\ufb01wd", "\ufb01") as patch, bcrecord.recording() as rec:
        assert cls().fiwd(1) == 2
    assert (patch.attribute, rec.keys()) == ("fiwd", ["N:fiwd:fi@0"])
    setattr(cls, "\ufb01x", cls.fiwd)  # a name set as it is, not normalised: found as it is
    with bcrecord.patch_method(cls, "\ufb01x", "fi") as patch, bcrecord.recording() as rec:
        assert vars(cls)["\ufb01x"](cls(), 2) == 3  # (cls().\ufb01x would be cls().fix)
    assert patch.attribute == "\ufb01x" and rec.keys() == ["N:\ufb01x:fi@0"]


def test_a_class_named_by_a_string_is_told_to_give_the_class_itself():
    # Was "this str instance has no attribute 'forward'; did you mean 'format'?".
    slots = dict(bcrecord.patch._slots)
    with pytest.raises(NotPatchableError) as caught:
        bcrecord.patch_method("Net", "forward", "h")
    assert str(caught.value) == (
        "patch_method takes the object itself, a class, an instance or a module, not its name 'Net': "
        "patch_method(Net, 'forward', ...)"
    )
    with pytest.raises(NotPatchableError, match=r"not its name 'abc': patch_method\(abc, 'upper', \.\.\.\)$"):
        bcrecord.patch_method("abc", "upper", "x")  # (a str's own method too: C code)
    assert bcrecord.patch._slots == slots and str.upper.__qualname__ == "str.upper"  # nothing installed

    class Net:
        def forward(self, x):
            return x

    # The arguments swapped: it suggested patch_method(forward, <class ...>, ...).
    for obj, shown in ((Net, "Net"), (Net(), "<the Net>"), (sys.modules[__name__], __name__)):
        with pytest.raises(NotPatchableError) as caught:
            bcrecord.patch_method("forward", obj, "x")
        assert str(caught.value) == (
            "patch_method's arguments are swapped: the object comes first, then the method's name: "
            f"patch_method({shown}, 'forward', ...)"
        )
    assert bcrecord.patch._slots == slots and "forward" in vars(Net)

    class Text(str):  # a str of a subclass with a method of its own is patched as any instance
        def shout(self):
            loud = self.upper()
            return loud

    with bcrecord.patch_method(Text("hi"), "shout", "loud") as patch, bcrecord.recording() as rec:
        patch.target.shout()
    assert rec.keys() == ["Text:shout:loud@0"] and rec["Text:shout:loud@0"] == "HI"


def test_instrument_refuses_a_function_inside_a_wrapper():
    import functools

    def times_ten(func):
        @functools.wraps(func)
        def wrapper(*args):
            return func(*args) * 10

        return wrapper

    @times_ten
    def g(x):
        y = x + 1
        return y

    # A copy of the inner function would run without the wrapper (2 instead of 20).
    with pytest.raises(NotPatchableError, match="wrapper.*patch_function"):
        bcrecord.instrument(g, "y")
    with pytest.raises(NotPatchableError, match="wrapper"):
        bcrecord.record_locals("y")(g)
    with bcrecord.patch_function(g, "y", name="w"), bcrecord.recording() as rec:
        assert g(1) == 20
    assert rec["w:g:y@0"] == 2


def times_ten(func):
    """A functools.wraps decorator of a method that changes what it returns."""

    @functools.wraps(func)
    def wrapper(self, x):
        return func(self, x) * 10

    return wrapper


def test_unwrap_false_records_what_the_wrapper_returns_and_leaves_it_as_it_was():
    def shim(func):  # a deprecation shim: *args only, passes the result through
        @functools.wraps(func)
        def passing(*args, **kwargs):
            return func(*args, **kwargs)

        return passing

    class M:
        @shim
        @times_ten
        def forward(self, x):
            y = x + 1
            return y

    m, wrappers = M(), (M.forward, M.forward.__wrapped__)
    codes = [w.__code__ for w in wrappers]
    with (
        bcrecord.patch_method(M, "forward", ["y", "return"], name="in"),
        bcrecord.patch_method(M, "forward", "return", name="out", unwrap=False),
        bcrecord.patch_method(M, "forward", "return", name=lambda inst: "each", unwrap=False),
        bcrecord.recording() as rec,
    ):
        assert m.forward(1) == 20
    assert dict(rec.items()) == {
        "in:forward:y@0": 2,
        "in:forward:return": 2,  # the wrapped function's
        "out:forward:return": 20,  # the outermost wrapper's (the shim)
        "each:forward:return": 20,  # per instance: the outermost wrapper given the instance
    }
    assert [w.__code__ for w in wrappers] == codes and (M.forward, M.forward.__wrapped__) == wrappers


def test_a_wrapper_made_over_a_patch_s_copy_is_not_taken_for_that_copy():
    # functools.wraps copies the copy's __dict__, bcrecord's notes in it, into the wrapper.
    @times_ten
    @bcrecord.record_locals("y", name="in")
    def f(self, x):
        y = x + 1
        return y

    with bcrecord.patch_function(f, "return", name="w", unwrap=False), bcrecord.recording() as rec:
        assert f(None, 1) == 20
    assert dict(rec.items()) == {"in:f:y@0": 2, "w:f:return": 20}  # the wrapper's return
    # The wrapper's locals are asked of the wrapper, which a message names as one: it named the
    # function wrapped (whose name functools.wraps copies), saying it had no 'y'.
    with pytest.raises(TargetError) as caught:
        bcrecord.patch_function(f, "y", unwrap=False)
    assert str(caught.value).startswith(
        f"wrapper (a functools.wraps wrapper of {f.__qualname__}) has no assignment to a local named 'y'"
    )

    class C:
        def m(self, x):
            y = x + 1
            return y

    def passing_times_ten(func):
        @functools.wraps(func)
        def wrapper(*args):
            return func(*args) * 10

        return wrapper

    with bcrecord.patch_method(C, "m", "y"):

        class B:
            m = passing_times_ten(C.m)  # made while C.m is patched

    with bcrecord.patch_method(B, "m", "y"), bcrecord.recording() as rec:
        assert B().m(1) == 20
    assert dict(rec.items()) == {"B:m:y@0": 2}

    class D(C):
        pass

    d = D()
    with bcrecord.patch_method(d, "m", "y"):
        wrapped = passing_times_ten(d.m)  # as obj.m = torch.compile(obj.m) during a patch
    d.m = wrapped
    with bcrecord.patch_method(d, "m", "y"), bcrecord.recording() as rec:
        assert d.m(2) == 30
    assert dict(rec.items()) == {"D:m:y@0": 3} and vars(d)["m"] is wrapped


def test_a_wrapped_method_is_patched_in_place_keeping_the_instance_s_values():
    class Wrapped:
        @times_ten
        def forward(self, x):
            y = x + 1
            return y

    class Plain:
        def forward(self, x):
            return x + 1

    a, b = Wrapped(), Wrapped()
    original = Wrapped.forward.__wrapped__.__code__
    with bcrecord.patch_method(a, "forward", "y", name="a") as patch, bcrecord.recording() as rec:
        assert (a.forward(1), b.forward(2)) == (20, 30)
        assert Wrapped.forward.__wrapped__.__code__ is not original and "forward" not in vars(a)
    # The function inside the wrapper runs in place, for every instance; only a's values are kept.
    assert rec.all("a:forward:y@0") == [2] and patch.keys == ("a:forward:y@0",) and patch.name == "a"
    assert Wrapped.forward.__wrapped__.__code__ is original
    with bcrecord.patch_method(Wrapped, "forward", "y") as patch, bcrecord.recording() as rec:
        a.forward(1), b.forward(2)
    assert rec.all("Wrapped:forward:y@0") == [2, 3]  # a class's patch: every instance

    class Sub(Wrapped):
        pass

    sub = Sub()
    with bcrecord.patch_method(sub, "forward", "y", name="sub"), bcrecord.recording() as rec:
        sub.forward(1), a.forward(2)  # a is a Wrapped, the class whose method it is: left out
    assert rec.all("sub:forward:y@0") == [2]

    class Slotted:
        __slots__ = ("__dict__",)  # no __weakref__: the instance is told apart all the same

        @times_ten
        def forward(self, x):
            y = x + 1
            return y

    c, d = Slotted(), Slotted()
    with bcrecord.patch_method(c, "forward", "y", name="c"), bcrecord.recording() as rec:
        c.forward(1), d.forward(2)
    assert rec.all("c:forward:y@0") == [2]
    p, q = Plain(), Plain()
    for unwrap in (True, False):  # no wrapper: unwrap=False changes nothing, the patch stays p's
        with (
            bcrecord.patch_method(p, "forward", "return", name="p", unwrap=unwrap),
            bcrecord.recording() as rec,
        ):
            p.forward(1), q.forward(100)
        assert rec.all("p:forward:return") == [2] and "forward" not in vars(p)


def test_an_instance_attribute_wrapping_its_own_bound_method_is_seen_through():
    import functools

    # What torch.compile(obj.m) and activation-checkpointing wrappers set on an instance.
    class A:
        def m(self, x):
            y = x + 1
            return y

    a, b = A(), A()
    inner = a.m

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        z = 0
        return inner(*args, **kwargs) * 10 + z

    a.m = wrapper
    assert list(bcrecord.targets(a.m).locals) == ["y"]  # A.m's, not the wrapper's z
    with bcrecord.patch_method(a, "m", ["y"]) as patch, bcrecord.recording() as rec:
        assert (a.m(1), b.m(5)) == (20, 6)
    assert rec.all("A:m:y@0") == [2] and patch.keys == ("A:m:y@0",)  # a's value only
    assert vars(a)["m"] is wrapper and A.m.__code__.co_varnames == ("self", "x", "y")


def test_an_instance_s_in_place_patch_keeps_every_value_it_cannot_tell_apart():
    import functools

    def impl(x):
        y = x * 2
        return y

    class A:
        @functools.wraps(impl)  # a method made from a plain function: impl's first argument is x
        def m(self, x):
            return impl(x)

    a, b = A(), A()
    with bcrecord.patch_method(a, "m", "y") as patch, bcrecord.recording() as rec:
        a.m(3), b.m(4)
    assert rec.all("A:m:y@0") == [6, 8] and patch.name == "A"  # impl runs for both: both kept

    class Net:
        def m(self, x):
            y = x * 2
            return y

    net, other = Net(), Net()
    with bcrecord.patch_method(net, "m", "y", in_place=True), bcrecord.recording() as rec:
        net.m(1), other.m(2)
    assert rec.all("Net:m:y@0") == [2, 4]  # in place, as asked: every caller of the function
    # net's attribute wraps another object's method: the calls that reach it are other's.
    third = Net()
    net.m = shim = functools.wraps(other.m)(lambda *args: other.m(*args))
    with bcrecord.patch_method(net, "m", "y", name="net"), bcrecord.recording() as rec:
        net.m(1), third.m(100)
    assert rec.all("net:m:y@0") == [2] and vars(net)["m"] is shim

    def drop_self(f):  # the body takes no self: whose call it is cannot be told, so none is dropped
        @functools.wraps(f)
        def w(self, *args):
            return f(*args)

        return w

    class Static:
        @drop_self
        def m(x):
            y = x + 1
            return y

    s, t = Static(), Static()
    with bcrecord.patch_method(s, "m", "y", name="s"), bcrecord.recording() as rec:
        s.m(1), t.m(10)
    assert rec.all("s:m:y@0") == [2, 11]


def test_unwrap_false_on_an_instance_s_wrapper_of_its_own_method_patches_the_wrapper():
    import functools

    class A:
        def m(self, x):
            y = x + 1
            return y

    a = A()
    inner = a.m

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        z = inner(*args, **kwargs) * 10
        return z

    a.m = wrapper
    with bcrecord.patch_method(a, "m", ["z", "return"], unwrap=False), bcrecord.recording() as rec:
        assert a.m(1) == 20
    assert rec.all("A:m:z@0") == [20] and rec.all("A:m:return") == [20]


def test_unwrap_false_on_one_instance_of_a_class_with_a_wrapped_method_records_that_instance_only():
    # The wrapper the class holds was patched in place, for every instance, all of whose values
    # were kept under the one instance's name (a wrapper taking *args gets no instance to tell
    # them apart by).
    import functools

    def decorated(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            out = fn(*args, **kwargs)
            return out

        return wrapper

    class C:
        @decorated
        def m(self, a):
            s = a + 1
            return s

    first, second = C(), C()
    original = C.__dict__["m"]
    with bcrecord.patch_method(first, "m", ["out"], unwrap=False, name="first"), bcrecord.recording() as rec:
        assert [first.m(1), second.m(2), C().m(3)] == [2, 3, 4]
    assert rec.all("first:m:out@0") == [2] and rec.keys() == ["first:m:out@0"]
    assert C.__dict__["m"] is original and original.__code__.co_name == "wrapper" and vars(first) == {}


def test_a_default_patch_of_an_instance_whose_wrapper_is_patched_goes_inside_the_function_it_wraps():
    # The instance's copy of the wrapper (unwrap=False) was taken for what to patch in place:
    # its return was recorded as the inner function's, and the inner function's locals refused.
    import functools

    def times_ten(fn):
        @functools.wraps(fn)
        def wrapper(self, v):
            w = fn(self, v)
            return w * 10

        return wrapper

    class A:
        @times_ten
        def m(self, v):
            y = v + 1
            return y

    a, other = A(), A()
    inner_code = A.__dict__["m"].__wrapped__.__code__
    for order in ("outer first", "inner first"):
        outer = bcrecord.patch_method(a, "m", "w", name="outer", unwrap=False)
        inner = bcrecord.patch_method(a, "m", ["y", "return"], name="inner")
        with bcrecord.recording() as rec:
            assert [a.m(1), other.m(5)] == [20, 60]
        recorded = {key: rec.all(key) for key in rec.keys()}
        assert recorded == {"outer:m:w@0": [2], "inner:m:y@0": [2], "inner:m:return": [2]}
        for patch in (outer, inner) if order == "outer first" else (inner, outer):
            patch.remove()
        assert vars(a) == {} and A.__dict__["m"].__wrapped__.__code__ is inner_code


def test_unwrap_false_keys_name_the_function_not_the_wrapper_code():
    import functools

    def times_ten(func):
        @functools.wraps(func)
        def wrapper(x):
            return func(x) * 10

        return wrapper

    @times_ten
    def alpha(x):
        return x + 1

    @times_ten
    def beta(x):
        return x + 2

    with (
        bcrecord.patch_function(alpha, "return", name="m", unwrap=False),
        bcrecord.patch_function(beta, "return", name="m", unwrap=False),
        bcrecord.recording() as rec,
    ):
        alpha(1), beta(1)
    assert dict(rec.items()) == {"m:alpha:return": 20, "m:beta:return": 30}  # not both 'm:wrapper:return'


def test_patches_made_while_another_is_armed_start_from_the_original_code():
    class M:
        def forward(self, x):
            y = x + 1
            return y

    def f(x):
        y = x + 1
        return y

    m = M()
    p = bcrecord.patch_function(f, "y", name="P")
    q = bcrecord.patch_function(M.forward, "y", name="P")
    try:
        with bcrecord.recording():  # p and q armed: their probes are in __code__ now
            g = bcrecord.instrument(f, "return", name="I")
            r = bcrecord.patch_method(m, "forward", "return", name="Q")
        assert r.original_code is q.original_code
        with bcrecord.recording() as rec:
            assert g(1) == 2 and m.forward(1) == 2
        assert rec.keys() == ["I:f:return", "Q:forward:return"]
        r.remove()
    finally:
        q.remove()
        p.remove()


def test_keys_name_the_method_as_patched_where_it_is_another_function():
    class Net:
        def _impl(self, x):
            y = x + 1
            return y

        forward = _impl  # an alias: the code's own name is _impl

    net = Net()
    for in_place in (False, True):
        with bcrecord.patch_method(Net, "forward", ["y", "return"], in_place=in_place) as patch:
            with bcrecord.recording() as rec:
                net.forward(1)
        assert patch.keys == ("Net:forward:y@0", "Net:forward:return")
        assert rec.keys() == ["Net:forward:y@0", "Net:forward:return"]
    # Patched by its own name, it keeps it.
    with bcrecord.patch_method(Net, "_impl", "y") as patch, bcrecord.recording() as rec:
        net._impl(1)
    assert patch.keys == ("Net:_impl:y@0",) and rec["Net:_impl:y@0"] == 2


def test_an_instrumented_copy_is_freed_with_its_sites_once_dropped():
    import gc
    import weakref

    from bcrecord import runtime

    def f(x):
        y = x + 1
        return y

    collect_all()  # all of earlier tests' garbage: the collection below must free only ours
    sites, armables = len(runtime._SITES), len(runtime.tracked())
    copies = []
    for i in range(50):
        g = bcrecord.instrument(f, ["y", "return"], name="m")
        if i % 2:  # a patch stacked on the copy, never removed: its sites go with the copy
            bcrecord.patch_function(g, "+@0", name="more")
        with bcrecord.recording() as rec:
            assert g(1) == 2
        assert rec.all("m:f:y@0") == [2] and rec.get("more:f:+@0") == (2 if i % 2 else None)
        copies.append(weakref.ref(g))
    del g
    gc.collect()
    # The registry of sites kept each copy's Patch, and through it the copy, alive.
    assert [ref() for ref in copies] == [None] * 50
    assert (len(runtime._SITES), len(runtime.tracked())) == (sites, armables)


def test_an_instrumented_copy_is_freed_as_soon_as_it_is_dropped_without_a_cyclic_collection():
    # The copy and its slot held each other: only a cyclic collection freed them, which a large
    # heap makes rare (3.13, 3.14), and every recording entered meanwhile armed each dropped
    # copy: a copy made per step made each step slower, 0.1 ms to 10 ms over 10,000 steps.
    import gc
    import weakref

    from bcrecord import runtime

    def f(x):
        y = x + 1
        return y

    collect_all()
    sites, armables = len(runtime._SITES), len(runtime.tracked())
    gc.disable()
    try:
        for stacked in (False, True):
            g = bcrecord.instrument(f, ["y"], name="m")
            kept = bcrecord.patch_function(g, "return", name="more") if stacked else None
            with bcrecord.recording() as rec:
                assert g(1) == 2
            assert rec["m:f:y@0"] == 2
            copy = weakref.ref(g)
            del g
            assert copy() is None
            # Its slot and probed code went with it (a patch stacked on it and kept too): its sites too.
            assert (len(runtime._SITES), len(runtime.tracked())) == (sites, armables)
            assert kept is None or not kept.active
    finally:
        gc.enable()


def test_a_recording_copy_freed_while_its_stacked_patch_is_removed_frees_each_site_once():
    # The copy freed inside remove() (by a collection run there, or another thread dropping it):
    # its finalizer released the sites, then remove() built code holding them again, and a site
    # id went into the free list twice: two later patches shared it, one's values recorded under
    # the other's key. (Collections run at other places on 3.10 and 3.11: there it passed too.)
    import collections
    import gc

    from bcrecord import runtime

    def f(x):
        y = x + 1
        z = y * 2
        return z

    thresholds = gc.get_threshold()
    try:
        for n in range(100):
            g = bcrecord.instrument(f, "y", name="a")
            stacked = bcrecord.patch_function(g, "z", name="b")
            g.me = g  # (a cycle: freed by a collection, wherever it runs)
            del g
            gc.set_threshold(1 + n % 7, 1, 1)
            stacked.remove()
            gc.set_threshold(*thresholds)
            gc.collect()
            assert [i for i, c in collections.Counter(runtime._free_ids).items() if c > 1] == []
    finally:
        gc.set_threshold(*thresholds)
    kept = [bcrecord.instrument(f, "y", name=f"h{k}") for k in range(len(runtime._free_ids) + 2)]
    with bcrecord.recording() as rec:
        for k, h in enumerate(kept):
            h(k)
    assert {key: rec.all(key) for key in rec.keys()} == {f"h{k}:f:y@0": [k + 1] for k in range(len(kept))}


def test_removing_an_instance_s_patch_scans_the_heap_for_deep_copies_only_where_one_may_hold_it(monkeypatch):
    # remove() held the stand-in in a local for the call, a reference more: its restore took that
    # for a deep copy's and scanned every object (gc.get_referrers), 5 to 10 ms a removal in a
    # process with torch (0.1 ms before).
    import copy
    import gc

    class Box:
        def run(self, x):
            y = x + 1
            return y

    scans = []
    referrers = gc.get_referrers
    monkeypatch.setattr(gc, "get_referrers", lambda *objs: scans.append(objs) or referrers(*objs))
    box = Box()
    bcrecord.patch_method(box, "run", "y").remove()
    assert scans == [] and "run" not in vars(box)
    patch = bcrecord.patch_method(box, "run", "y")
    twin = copy.deepcopy(box)  # (holds the stand-in bound to itself: the scan finds it)
    patch.remove()
    assert scans and "run" not in vars(twin)


_RECORDED_AT_EXIT = """
import atexit

def report():
    with bcrecord.recording() as rec:
        area(2, 3)
    print(rec.keys())

atexit.register(report)  # (runs after the exit hooks registered later)
import bcrecord

def _area(w, h):
    a = w * h
    return a

area = bcrecord.instrument(_area, "a", name="geo")
"""


def test_a_with_block_of_a_patch_of_a_copy_that_nothing_holds_says_so():
    # It said the patch was removed "at the end of an earlier with block, or by remove()".
    def f(x):
        y = x + 1
        return y

    stacked = bcrecord.patch_function(bcrecord.instrument(f, "y"), "return")
    with pytest.raises(
        RuntimeError, match=r"of a recording copy \(instrument, record_locals\) that nothing held"
    ):
        with stacked:
            pass
    # Its repr named None as what was patched.
    assert repr(stacked) == f"<Patch removed a recording copy that was freed: {__name__}:f:return>"


def test_a_recording_copy_still_held_at_exit_records_in_an_exit_handler():
    # weakref's exit hook ran the copy's finalizer, taking its probes out of the live copy.
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", _RECORDED_AT_EXIT], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "['geo:_area:a@0']", result.stderr


_FREED_UNDER_THE_SITES_LOCK = """
import gc, threading
import bcrecord
from bcrecord import runtime

gc.disable()

def make():
    class Net:
        @bcrecord.record_locals("y", name="n")
        def forward(self, x):
            y = x + 1
            return y

make()  # (a class: in a cycle, freed by a collection)
in_sites, armed, done = threading.Event(), threading.Event(), []

def armer():
    in_sites.wait()
    with runtime.arming():
        armed.set()
        with runtime._sites_lock:
            done.append("armer")

def collector():
    with runtime._sites_lock:
        in_sites.set()
        armed.wait()
        gc.collect()
    done.append("collector")

threads = [threading.Thread(target=armer, daemon=True), threading.Thread(target=collector, daemon=True)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join(10)
print(sorted(done))
"""


def test_a_recording_copy_freed_where_a_thread_holds_the_sites_lock_deadlocks_none():
    # Its finalizer took the arming lock: run by a collection inside a section holding the
    # sites lock, while another thread held the arming lock and waited for the sites lock.
    # (In a process of its own: threads left deadlocked would hold the locks for later tests.)
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", _FREED_UNDER_THE_SITES_LOCK], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "['armer', 'collector']", result.stderr


def test_a_generator_or_coroutine_of_a_dropped_recording_copy_records_until_it_is_freed():
    import asyncio
    import gc

    from bcrecord import runtime

    def gen(n):
        for k in range(n):
            val = k * 2
            yield val

    async def co(a):
        await asyncio.sleep(0)
        got = a + 1
        return got

    collect_all()
    sites = len(runtime._SITES)
    with bcrecord.recording() as rec:
        it = bcrecord.instrument(gen, "val", name="gd")(3)  # the copy itself is dropped at once
        gc.collect()  # on 3.10 no frame holds its function: this freed the copy (and its sites, before)
        assert next(it) == 0
    with bcrecord.recording() as later:
        assert list(it) == [2, 4]
    assert rec.all("gd:gen:val@0") == [0] and later.all("gd:gen:val@0") == [2, 4]

    async def main():
        with bcrecord.recording() as rec:
            pending = bcrecord.instrument(co, "got", name="cd")(1)
            gc.collect()
            assert await pending == 2
        return rec

    assert asyncio.run(main()).all("cd:co:got@0") == [2]
    del it
    collect_all()
    assert len(runtime._SITES) == sites  # released once the generator is gone


def test_a_recording_copy_is_patched_as_itself_its_own_probes_kept():
    def area(w, h):
        a = w * h
        return a

    original_code = area.__code__
    summed = bcrecord.record_locals("a", name="deco")(area)
    with bcrecord.patch_function(summed, "return", name="more") as patch, bcrecord.recording() as rec:
        assert summed(2, 3) == area(2, 3) == 6
    # Both the copy's probes and the patch's; the original was not patched (it recorded nothing).
    assert (rec.all("deco:area:a@0"), rec.all("more:area:return")) == ([6], [6])
    assert area.__code__ is original_code and not patch.active

    class Net:
        @bcrecord.record_locals("y", name="deco")
        def forward(self, x):
            y = x + 1
            return y

    with bcrecord.patch_method(Net, "forward", "return", name="pm"), bcrecord.recording() as rec:
        assert Net().forward(1) == 2
    assert sorted(rec.keys()) == ["deco:forward:y@0", "pm:forward:return"]
    with bcrecord.recording() as rec:  # removed: the copy's own probes stay
        Net().forward(2)
    assert rec.keys() == ["deco:forward:y@0"]
    # A copy of a copy starts from the original code, with its own probes only.
    again = bcrecord.instrument(summed, "return", name="again")
    with bcrecord.recording() as rec:
        assert again(3, 3) == 9
    assert rec.keys() == ["again:area:return"]


def test_a_recording_copy_keeps_its_probes_under_an_instance_s_or_a_subclass_s_patch():
    class Net:
        @bcrecord.record_locals("v", name="deco")
        def m(self, x):
            v = x + 1
            w = v * 2
            return w

    class Sub(Net):
        pass

    a, b, s = Net(), Net(), Sub()
    code = Net.m.__code__
    with bcrecord.patch_method(a, "m", "w", name="a"), bcrecord.recording() as rec:
        assert (a.m(1), b.m(10), s.m(100)) == (4, 22, 202)
    # The copy's probes for everyone; the instance's patch for that instance only.
    assert (rec.all("deco:m:v@0"), rec.all("a:m:w@0")) == ([2, 11, 101], [4])
    with bcrecord.patch_method(Sub, "m", "w", name="sub"), bcrecord.recording() as rec:
        assert (a.m(1), s.m(100)) == (4, 202)
    assert (rec.all("deco:m:v@0"), rec.all("sub:m:w@0")) == ([2, 101], [202])
    # The instance gets no method of its own: a patch of its class records it too.
    with bcrecord.patch_method(a, "m", "w", name="a"), bcrecord.patch_method(Net, "m", "w", name="net"):
        with bcrecord.recording() as rec:
            assert (a.m(1), b.m(10)) == (4, 22)
    assert (rec.all("a:m:w@0"), rec.all("net:m:w@0")) == ([4], [4, 22])
    with bcrecord.recording() as rec:  # all removed: the copy's own probes stay
        a.m(1)
    assert rec.keys() == ["deco:m:v@0"] and Net.m.__code__ is code and "m" not in vars(Sub)

    class Static:
        @bcrecord.record_locals("v", name="deco")
        @staticmethod
        def s(x):
            v = x + 1
            return v

    # No instance to tell calls apart: the instance's patch is a copy of its own (without
    # the copy's probes), never the other instances' values under its name.
    one = Static()
    with bcrecord.patch_method(one, "s", "return", name="one"), bcrecord.recording() as rec:
        assert (one.s(1), Static().s(10)) == (2, 11)
    assert (rec.all("one:s:return"), rec.all("deco:s:v@0")) == ([2], [11])


def test_an_in_place_patch_and_a_class_patch_of_one_method_stack_in_either_order():
    class M:
        def forward(self, x):
            y = x + 1
            z = y * 2
            return z

    original = M.__dict__["forward"]
    code = original.__code__
    for in_place_first in (True, False):
        patches = []
        for kind in ("in_place", "class") if in_place_first else ("class", "in_place"):
            if kind == "in_place":  # as bcrecord run and the torch layer patch
                patches.append(bcrecord.patch_method(M, "forward", "y", name="A", in_place=True))
            else:
                patches.append(bcrecord.patch_method(M, "forward", "z", name="B"))
        with bcrecord.recording() as rec:
            assert M().forward(1) == 4
        assert sorted(rec.items()) == [("A:forward:y@0", 2), ("B:forward:z@0", 4)]
        for patch in patches:
            patch.remove()
        assert M.__dict__["forward"] is original and original.__code__ is code
        with bcrecord.recording() as rec:
            M().forward(1)
        assert rec.keys() == []


def _stand_ins_found_are_those_installed() -> bool:
    """Whether the stand-ins found by identity are those of the slots installed by attribute."""
    installed = {id(slot) for key, slot in bcrecord.patch._slots.items() if key[0] == "attr"}
    return {id(slot) for slot in bcrecord.patch._stand_ins_running.values()} == installed


def test_a_stand_in_is_found_by_itself_and_forgotten_with_its_patch():
    # What runs in a patched method's place is looked up by identity, not by a walk over every
    # patch in the process: a record() block among 300 patches took 829 us, 443 us among none.
    class M:
        def forward(self, x):
            y = x + 1
            return y

    before = dict(bcrecord.patch._stand_ins_running)
    outer = bcrecord.patch_method(M, "forward", "y", name="B")
    stand_in = M.__dict__["forward"]
    inner = bcrecord.patch_method(M, "forward", "y", name="A", in_place=True)  # in the stand-in
    assert bcrecord.patch.original_code(stand_in) is outer.original_code
    assert bcrecord.patch._stand_ins_running == {**before, id(stand_in): outer._armable}
    assert _stand_ins_found_are_those_installed()
    with bcrecord.recording() as rec:
        M().forward(1)
    inner.remove()
    outer.remove()
    assert bcrecord.patch._stand_ins_running == before and M.__dict__["forward"] is not stand_in
    assert sorted(rec.items()) == [("A:forward:y@0", 2), ("B:forward:y@0", 2)]


def test_a_stand_in_patched_over_after_a_mock_is_found_no_more_as_the_later_one_runs_there():
    # A mock set over a patched method, then patched itself: the later patch's stand-in is what
    # runs there, and the earlier one, still patched, is found by identity no more (as before,
    # when every slot held by place was searched), nor kept for good.
    from unittest import mock

    class M:
        def forward(self, x):
            y = x + 1
            return y

    def fake(self, x):
        y = x * 10
        return y

    before = dict(bcrecord.patch._stand_ins_running)
    first = bcrecord.patch_method(M, "forward", "y", name="first")
    with mock.patch.object(M, "forward", fake):
        second = bcrecord.patch_method(M, "forward", "y", name="second")
        with bcrecord.recording() as rec:
            assert M().forward(1) == 10
        assert (
            _stand_ins_found_are_those_installed()
            and len(bcrecord.patch._stand_ins_running) == len(before) + 1
        )
        second.remove()
    first.remove()
    assert _stand_ins_found_are_those_installed() and bcrecord.patch._stand_ins_running == before
    assert rec.items() == [("second:forward:y@0", 10)] and M().forward(1) == 2


def test_a_patch_of_an_instance_or_subclass_stays_theirs_where_the_class_s_function_runs_in_place():
    class Base:
        @bcrecord.record_locals("y", name="deco")
        def f(self, x):
            y = x + 1
            return y

        def g(self, x):
            z = x * 2
            return z

    class Sub(Base):
        pass

    base, sub, other = Base(), Sub(), Base()
    # Base.f is a recording copy; Base.g gets patched in place (as bcrecord run does).
    with bcrecord.patch_method(Base, "g", "z", name="inplace", in_place=True):
        with (
            bcrecord.patch_method(base, "f", "return", name="one"),
            bcrecord.patch_method(Sub, "g", "return", name="sub"),
            bcrecord.recording() as rec,
        ):
            for obj in (base, sub, other):
                obj.f(1)
                obj.g(10)
    # Only the patched instance / the subclass record under their patch's name.
    assert rec.all("one:f:return") == [2] and rec.all("sub:g:return") == [20]
    # The others keep the class's probes; a patched instance or subclass has its own method,
    # except where the class's is a recording copy: its probes run for everyone.
    assert rec.all("deco:f:y@0") == [2, 2, 2] and rec.all("inplace:g:z@0") == [20, 20]


def test_patch_function_of_a_patched_instance_s_method_patches_what_that_instance_runs():
    class C:
        def f(self, x):
            y = x + 1
            return y * 2

    original_code = C.f.__code__
    a, b = C(), C()
    with bcrecord.patch_method(a, "f", "x", name="inst"):
        with bcrecord.patch_function(a.f, "return", name="on_a"), bcrecord.recording() as rec:
            assert (a.f(1), b.f(2)) == (4, 6)
    # a's own copy got it (not the class's function, which b runs).
    assert rec.all("on_a:f:return") == [4] and rec.all("inst:f:x") == [1]
    assert "f" not in vars(a) and C.f.__code__ is original_code

    class D:
        @bcrecord.record_locals("y", name="rl")
        def f(self, x):
            y = x + 1
            return y * 2

    a, b = D(), D()
    with bcrecord.patch_method(a, "f", "x", name="inst"):
        with bcrecord.patch_function(a.f, "return", name="on_f"), bcrecord.recording() as rec:
            assert (a.f(1), b.f(2)) == (4, 6)
    # a's patch went into the class's recording copy (keeping its probes), which everyone
    # runs: patching that function patches it for everyone.
    assert rec.all("on_f:f:return") == [4, 6] and rec.all("rl:f:y@0") == [2, 3]
    assert rec.all("inst:f:x") == [1]


def test_a_special_method_of_one_instance_is_refused_and_nothing_changes():
    class Acc:
        def __call__(self, a):
            c = a + 1
            return c

    acc = Acc()
    with pytest.raises(
        NotPatchableError, match=r"__call__ is a special method: Python looks it up on the class"
    ):
        bcrecord.patch_method(acc, "__call__", ["c"])
    assert "__call__" not in vars(acc) and acc(1) == 2
    with bcrecord.patch_method(Acc, "__call__", ["c"]), bcrecord.recording() as rec:
        acc(1)
    assert rec.all("Acc:__call__:c@0") == [2]


def test_copy_copy_s_method_is_refused_on_an_instance():
    class Doc:
        def __copy__(self):  # copy.copy reads it from the class
            out = Doc()
            return out

    with pytest.raises(NotPatchableError, match="__copy__ is a special method"):
        bcrecord.patch_method(Doc(), "__copy__", ["out"])


def test_a_special_method_read_from_the_instance_may_be_patched_on_one():
    import copy

    class Doc:
        def __deepcopy__(self, memo):  # copy.deepcopy reads it with getattr: from the instance
            out = Doc()
            return out

    doc = Doc()
    with bcrecord.patch_method(doc, "__deepcopy__", ["out"]), bcrecord.recording() as rec:
        twin = copy.deepcopy(doc)
    assert isinstance(twin, Doc) and [type(v) for v in rec.all("Doc:__deepcopy__:out@0")] == [Doc]


def test_instrument_and_record_locals_keep_static_and_class_methods():
    class K:
        @bcrecord.record_locals("u")
        @staticmethod
        def st(a):
            u = a * 2
            return u

        @bcrecord.record_locals("u")
        @classmethod
        def cm(cls, a):
            u = a * 3
            return u

    assert isinstance(vars(K)["st"], staticmethod) and isinstance(vars(K)["cm"], classmethod)
    with bcrecord.recording() as rec:
        assert (K().st(1), K.st(2), K.cm(1), K().cm(2)) == (2, 4, 3, 6)
    assert rec.all("K:st:u@0") == [2, 4] and rec.all("K:cm:u@0") == [3, 6]


def test_stacked_record_locals_keep_every_layer_s_probes():
    @bcrecord.record_locals("x", name="outer")
    @bcrecord.record_locals("y", name="inner")
    def f(a):
        y = a + 1
        x = y * 2
        return x

    with bcrecord.recording() as rec:
        assert f(1) == 4
    assert dict((k, rec.all(k)) for k in rec.keys()) == {"inner:f:y@0": [2], "outer:f:x@0": [4]}
    copied = bcrecord.instrument(f, "y", name="geo")  # a new copy: its own probes only
    other = bcrecord.record_locals("x", name="deco")(copied)  # not stacked: a copy of its own
    with bcrecord.recording() as rec:
        assert copied(1) == other(1) == 4
    assert dict((k, rec.all(k)) for k in rec.keys()) == {"geo:f:y@0": [2], "deco:f:x@0": [4]}


def test_record_locals_index_applies_to_local_names_only_and_a_misspelt_return_is_hinted():
    def f(a):
        b = a + 1
        b = b * 2
        return b

    with bcrecord.recording() as rec:
        bcrecord.record_locals("b", "return", index=1)(f)(1)
    assert dict((k, rec.all(k)) for k in rec.keys()) == {
        "tests.test_patch:f:b@1": [4],
        "tests.test_patch:f:return": [4],
    }
    with bcrecord.recording() as rec:  # a name with spaces, which the short form takes: indexed too
        bcrecord.record_locals(" b ", index=0)(f)(1)
    assert dict((k, rec.all(k)) for k in rec.keys()) == {"tests.test_patch:f:b@0": [2]}
    with pytest.raises(
        TargetError, match=r"local named 'retrun'; assigned locals: b; .*; did you mean 'return'\?$"
    ):
        bcrecord.patch_function(f, ["retrun"])


def test_removal_leaves_a_replacement_made_while_patched_and_warns():
    class A:
        def m(self, x):
            y = x + 1
            return y

    def replacement(self, x):
        return -x

    original = A.__dict__["m"]
    patch = bcrecord.patch_method(A, "m", ["y"])
    A.m = replacement  # someone else's change (a hook, a user) after the patch
    with pytest.warns(bcrecord.RecordingWarning, match="'m' was replaced while patched; bcrecord left"):
        patch.remove()
    assert A.__dict__["m"] is replacement and A().m(2) == -2
    A.m = original
    a = A()
    patch = bcrecord.patch_method(a, "m", ["y"])
    a.m = replacement.__get__(a)
    with pytest.warns(bcrecord.RecordingWarning, match="this A instance's 'm' was replaced"):
        patch.remove()
    assert a.m(3) == -3


def test_a_mock_ended_after_the_patch_was_removed_leaves_the_original_to_the_next_patch():
    # mock.patch.object started inside the patch and stopped after its removal puts back what it
    # replaced: the patch's stand-in. The next patch puts back the original (class and instance).
    from unittest import mock

    class A:
        def m(self, x):
            y = x + 1
            return y

    original, a, b = A.__dict__["m"], A(), A()
    for holder in (A, a):
        patch = bcrecord.patch_method(holder, "m", "y")
        mocked = mock.patch.object(holder, "m", return_value=0)
        mocked.start()
        with pytest.warns(bcrecord.RecordingWarning, match="should the patched method come back there"):
            patch.remove()
        mocked.stop()
        assert a.m(1) == 2  # the stand-in, inert, is back
    with bcrecord.patch_method(A, "m", "y", name="cls"), bcrecord.recording() as rec:
        assert A.__dict__["m"] is not original and (a.m(1), b.m(10)) == (2, 11)
    assert A.__dict__["m"] is original and "m" not in vars(a)
    assert rec.all("cls:m:y@0") == [2, 11]  # a's own method left behind would have kept it out
    patch = bcrecord.patch_method(A, "m", "y")
    with mock.patch.object(A, "m", return_value=0):
        with pytest.warns(bcrecord.RecordingWarning, match="was replaced while patched"):
            patch.remove()
    with bcrecord.patch_function(A.m, "y", name="fn"), bcrecord.recording() as rec:  # (given the stand-in)
        assert A.__dict__["m"] is original and b.m(3) == 4
    assert rec.all("fn:m:y@0") == [4] and original.__code__ is patch.original_code

    # The next patch of an instance or a subclass that finds the class's stand-in puts it back too
    # (only the class's own next patch did: the stand-in, refusing pickles, stayed for good).
    class S(A):
        pass

    for holder in (A(), S):
        patch = bcrecord.patch_method(A, "m", "y")
        with mock.patch.object(A, "m", return_value=0):
            with pytest.warns(bcrecord.RecordingWarning, match="was replaced while patched"):
                patch.remove()
        assert A.__dict__["m"] is not original
        with bcrecord.patch_method(holder, "m", "y", name="next"):
            assert A.__dict__["m"] is original
        assert A.__dict__["m"] is original

    # One left on a Protocol, which refuses isinstance checks, leaves other classes' patches be.
    class Greeter(typing.Protocol):
        def m(self, x):
            y = x + 1
            return y

    patch = bcrecord.patch_method(Greeter, "m", "y")
    with mock.patch.object(Greeter, "m", return_value=0):
        with pytest.warns(bcrecord.RecordingWarning, match="was replaced while patched"):
            patch.remove()
    with bcrecord.patch_method(A(), "m", "y"), bcrecord.patch_method(S, "m", "y"):
        assert A.__dict__["m"] is original
        assert _stand_ins_found_are_those_installed()
    assert _stand_ins_found_are_those_installed()


def test_a_left_stand_in_that_autoreload_updated_stays_the_method_and_the_next_patch_records_it():
    # A mock ended after the patch's removal puts back the stand-in; autoreload then sets its code
    # and its __dict__ (the edited function's), where the original was kept: the next patch deleted
    # the class's method (own not found there: put back as "absent"), and could not patch it.
    from unittest import mock

    class A:
        def m(self, x):
            y = x + 1
            return y

    def edited(self, x):
        y = x + 100
        return y

    patch = bcrecord.patch_method(A, "m", "y")
    with mock.patch.object(A, "m", return_value=0):
        with pytest.warns(bcrecord.RecordingWarning, match="was replaced while patched"):
            patch.remove()
    for attribute in ("__code__", "__defaults__", "__doc__", "__dict__"):  # (what autoreload sets)
        setattr(A.__dict__["m"], attribute, getattr(edited, attribute))
    with bcrecord.patch_method(A, "m", "y", name="a"), bcrecord.recording() as rec:
        assert A().m(1) == 101
    assert rec.all("a:m:y@0") == [101] and A().m(2) == 102


def test_a_class_whose_patched_method_was_replaced_and_left_is_freed_with_its_replacement():
    # What the patch had replaced (the class's method, whose super() cell holds the class) was
    # held from a global table keyed weakly by the stand-in that the replacement holds: the
    # class, and the instances, could never go.
    import gc
    import weakref

    class Base:
        def m(self, x):
            return x

    def make():
        class A(Base):
            def m(self, x):
                y = super().m(x) + 1
                return y

        patch = bcrecord.patch_method(A, "m", ["y"])
        stand_in = A.m
        A.m = lambda self, x: -stand_in(self, x)  # someone else's wrapper, left in place
        with pytest.warns(bcrecord.RecordingWarning, match="'m' was replaced while patched"):
            patch.remove()
        return A

    A = make()
    assert A().m(2) == -3
    held = weakref.ref(A)
    del A
    gc.collect()
    assert held() is None


def test_threads_patching_one_method_at_once_each_stack_and_leave_the_original(monkeypatch):
    import threading
    import time
    import warnings

    from bcrecord import patch as patching

    class A:
        def m(self, a):
            x = a + 1
            return x

    original = A.__dict__["m"]
    made = {}

    def patch(i):
        made[i] = bcrecord.patch_method(A, "m", ["x"], name=f"t{i}")

    threads = [threading.Thread(target=patch, args=(i,)) for i in range(2)]
    waiting = set()
    real_acquire = patching._lock.acquire

    def acquire(blocking=True):
        if threading.current_thread() in threads:
            waiting.add(threading.current_thread().name)
        return real_acquire(blocking)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "replaced while patched"
        patching._lock.acquire()  # both threads start and wait: each must see the other's slot
        monkeypatch.setattr(patching._lock, "acquire", acquire)
        try:
            for thread in threads:
                thread.start()
            # Both at the lock before it opens: a fixed sleep let a loaded machine patch one after
            # the other, the case of two at once unchecked. (The deadline only keeps it from hanging.)
            deadline = time.monotonic() + 60
            while len(waiting) < 2 and time.monotonic() < deadline:
                time.sleep(0.001)
        finally:
            patching._lock.release()
        for thread in threads:
            thread.join()
        monkeypatch.undo()
        assert len(waiting) == 2
        with bcrecord.recording() as rec:
            A().m(1)
        made[0].remove()
        later = bcrecord.patch_method(A, "m", ["x"], name="main")
        made[1].remove()
        later.remove()
    assert rec["t0:m:x@0"] == rec["t1:m:x@0"] == 2
    assert A.__dict__["m"] is original


def test_patching_an_abstract_method_warns_naming_the_overrides_and_records_super_calls():
    import abc

    class Base(abc.ABC):
        @abc.abstractmethod
        def m(self, a):
            x = a * 10
            return x

    class Own(Base):
        def m(self, a):
            return a

    class Calls(Base):
        def m(self, a):
            return super().m(a) + 1

    class Deeper(Calls):
        def m(self, a):
            return a - 1

    with pytest.warns(
        bcrecord.RecordingWarning,
        match=r"Base\.m is abstract: subclasses override it, so it runs only where an override calls it "
        r"\(super\(\)\.m\(\.\.\.\)\); patch them to record theirs: .*Calls\.m, .*Deeper\.m, .*Own\.m$",
    ):
        patch = bcrecord.patch_method(Base, "m", ["x"])
    with patch, bcrecord.recording() as rec:
        assert (Own().m(2), Calls().m(2), Deeper().m(2)) == (2, 21, 1)
    assert rec.all("Base:m:x@0") == [20]  # only the call that reached it
    assert Base.__dict__["m"].__isabstractmethod__ and Base.__abstractmethods__ == frozenset({"m"})


def test_patching_an_abstract_method_with_no_override_yet_says_so_and_other_methods_do_not_warn():
    import abc
    import warnings

    class Base(abc.ABC):
        @abc.abstractmethod
        def m(self): ...

        def n(self, a):
            y = a
            return y

    with pytest.warns(bcrecord.RecordingWarning, match=r"Base\.m is abstract: .* \(none are defined yet\)$"):
        bcrecord.patch_method(Base, "m", ["return"]).remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bcrecord.patch_method(Base, "n", ["y"]).remove()


def test_an_abstract_method_s_warning_made_an_error_leaves_no_patch_behind():
    # The warning came after the patch was installed: -W error raised, with the patch left on.
    import abc
    import warnings

    class Base(abc.ABC):
        @abc.abstractmethod
        def m(self, x):
            y = x + 1
            return y

    original = Base.__dict__["m"]
    for in_place in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(bcrecord.RecordingWarning, match=r"Base\.m is abstract"):
                bcrecord.patch_method(Base, "m", "y", in_place=in_place)
        assert Base.__dict__["m"] is original and original.__code__ is Base.__dict__["m"].__code__
        assert not calls_probe(original)
        with bcrecord.recording() as rec:
            assert original(None, 1) == 2
        assert rec.keys() == []


def test_a_method_a_class_gets_from_its_metaclass_is_refused_pointing_to_the_metaclass():
    class Meta(type):
        def mm(cls, a):
            x = a + 1
            return x

    class K(metaclass=Meta):
        pass

    with pytest.raises(NotPatchableError, match=r"'mm' comes from its metaclass Meta: patch the metaclass"):
        bcrecord.patch_method(K, "mm", ["x"])
    assert "mm" not in vars(K) and K.mm(1) == 2  # nothing changed
    owner = lambda cls: "K" if cls is K else None  # noqa: E731
    with bcrecord.patch_method(Meta, "mm", ["x"], name=owner), bcrecord.recording() as rec:
        assert K.mm(1) == 2 and Meta("L", (), {}).mm(5) == 6
    assert rec.all("K:mm:x@0") == [2] and list(rec.keys()) == ["K:mm:x@0"]


def test_a_class_or_module_that_refuses_attribute_writes_is_refused_clearly_and_left_as_it_was():
    # A metaclass (or module class) whose __setattr__ raises: its own error, raw, said nothing
    # of what to do. Now a NotPatchableError naming the way that writes no attribute.
    class Frozen(type):
        def __setattr__(cls, name, value):
            raise AttributeError(f"{cls.__name__} is frozen")

    class Net(metaclass=Frozen):
        def forward(self, x):
            y = x + 1
            return y

    class ReadOnly(types.ModuleType):
        def __setattr__(self, name, value):
            raise TypeError("read-only module")

    module = ReadOnly("lazy")
    exec("def g(a):\n    b = a * 2\n    return b\n", vars(module))
    for holder, method, error in (
        (Net, "forward", "AttributeError: Net is frozen"),
        (module, "g", "TypeError"),
    ):
        function = vars(holder)[method]
        code = function.__code__
        with pytest.raises(
            NotPatchableError, match=rf"refuses to have its '{method}' replaced \({error}"
        ) as info:
            bcrecord.patch_method(holder, method, "return")
        assert f"patch_method({holder.__name__}, '{method}', specs, in_place=True)" in str(info.value)
        assert vars(holder)[method] is function and function.__code__ is code
        with bcrecord.recording() as rec:  # nothing left armed
            getattr(holder, method)(*([Net()] if holder is Net else []), 1)
        assert len(rec) == 0
    with bcrecord.patch_method(Net, "forward", "y", in_place=True), bcrecord.recording() as rec:
        assert Net().forward(1) == 2
    assert rec.all("Net:forward:y@0") == [2]


def test_a_special_method_only_type_has_is_refused_as_missing_not_sent_to_the_metaclass():
    # K(...) and isinstance(x, K) run type's C code: there is nothing in K to patch, and
    # patch_method(type, '__call__', ...) would fail too.
    class K:
        def step(self, a):
            return a

    for method in ("__call__", "__instancecheck__"):
        with pytest.raises(NotPatchableError) as raised:
            bcrecord.patch_method(K, method, ["return"])
        assert str(raised.value) == (
            f"{K!r} and its bases define no {method!r}: the one found is its metaclass type's, "
            f"and type.{method} is a builtin or C function: it has no bytecode to patch"
        )
    assert "__call__" not in vars(K) and isinstance(K(), K)  # nothing changed


def test_a_removed_patch_entered_again_says_so_instead_of_recording_nothing():
    def f(a):
        x = a + 1
        return x

    patch = bcrecord.patch_function(f, "x", name="m")
    with patch, bcrecord.recording() as rec:
        f(1)
    with pytest.raises(RuntimeError, match=r"^this patch was removed \(at the end of an earlier with block"):
        with patch:
            pass
    assert rec.all("m:f:x@0") == [2] and not patch.active and f(1) == 2


def test_a_mock_in_a_function_s_place_is_refused_as_a_mock():
    # Not "patch MagicMock.__call__": that would record the mock library's code, for every mock.
    import types
    from unittest import mock

    module = types.ModuleType("holder")

    def step(a):
        x = a + 1
        return x

    module.step = step
    with mock.patch.object(module, "step") as stand_in:
        for attempt in (
            lambda: bcrecord.patch_method(module, "step", "x"),
            lambda: bcrecord.patch_function(module.step, "x"),
            lambda: bcrecord.instrument(module.step, "x"),
        ):
            with pytest.raises(NotPatchableError) as raised:
                attempt()
            assert str(raised.value) == (
                f"{stand_in!r} is a unittest.mock MagicMock (a mock.patch in force?), not a Python "
                "function: patch the function it stands in for, outside the mock"
            )
    assert module.step is step and step(1) == 2


def test_a_mock_autospec_function_in_a_method_s_place_is_refused_as_a_mock():
    # It is a Python function: its code (a signature check and a call of the mock) was patched,
    # and a local of the method was refused as missing from it.
    from unittest import mock

    class B:
        def forward(self, x):
            y = x + 1
            return y

    original = B.__dict__["forward"]
    with mock.patch.object(B, "forward", autospec=True, side_effect=original):
        stand_in = B.__dict__["forward"]
        for patch in (
            lambda: bcrecord.patch_method(B, "forward", "y"),
            lambda: bcrecord.patch_function(stand_in, "return"),
        ):
            with pytest.raises(NotPatchableError) as raised:
                patch()
            assert str(raised.value) == (
                "forward is a unittest.mock autospec function (a mock.patch(..., autospec=True) in "
                "force?), not the Python function: patch the function it stands in for, outside the mock"
            )
            assert B.__dict__["forward"] is stand_in and not probes_in(stand_in.__code__)
        assert B().forward(1) == 2
    with bcrecord.patch_method(B, "forward", "y"), bcrecord.recording() as rec:
        B().forward(1)
    assert rec.all("B:forward:y@0") == [2]
    # Not any function that holds a mock (a test helper's): its code is what is recorded.
    B.forward.mock = mock.Mock()
    with bcrecord.patch_method(B, "forward", "y"), bcrecord.recording() as rec:
        B().forward(2)
    assert rec.all("B:forward:y@0") == [3]


def test_record_locals_without_parentheses_or_with_a_bad_spec_fails_at_the_decorator():
    def summed(values):
        acc = 0
        for v in values:
            acc = acc + v
        return acc

    with pytest.raises(SpecError, match=r"write @record_locals\('x', ...\) above the function"):
        bcrecord.record_locals(summed)
    with pytest.raises(SpecError, match=r"cannot parse spec 'x@'"):
        bcrecord.record_locals("acc", "x@")
    assert summed([1, 2]) == 3 and not probes_in(summed.__code__)  # untouched


def test_a_singledispatch_function_is_refused_and_its_registered_implementations_patch():
    @functools.singledispatch
    def process(value):
        out = ("default", value)
        return out

    @process.register
    def _(value: int):
        out = value * 2
        return out

    with pytest.raises(NotPatchableError, match=r"process is a functools.singledispatch function: patch"):
        bcrecord.patch_function(process, ["out"])
    with bcrecord.patch_function(process.registry[int], ["out"], name="m"), bcrecord.recording() as rec:
        assert process(3) == 6 and process("s") == ("default", "s")
    assert rec.all("m:_:out@0") == [6]
    # unwrap=False: the dispatcher itself, as asked (what every call returns)
    with bcrecord.patch_function(process, "return", name="d", unwrap=False), bcrecord.recording() as rec:
        process(3), process("s")
    assert rec.all("d:process:return") == [6, ("default", "s")]
    module = types.ModuleType("dispatching")
    module.process = process
    with pytest.raises(NotPatchableError, match=r"process is a functools.singledispatch function: patch"):
        bcrecord.patch_method(module, "process", ["out"])
    with (
        bcrecord.patch_method(module, "process", "return", name="d", unwrap=False),
        bcrecord.recording() as rec,
    ):
        module.process(3)
    assert rec.all("d:process:return") == [6]


def test_defaults_and_attributes_set_through_a_patched_method_stay_after_it_is_removed():
    class A:
        def m(self, a, b=2, *, c=3):
            x = a + b + c
            return x

    A.m.dropped = 1
    with bcrecord.patch_method(A, "m", ["x"]):
        A.m.__defaults__ = (20,)  # a config system setting defaults
        A.m.__kwdefaults__["c"] = 30
        A.m.registered = True  # a registry marking the method
        del A.m.dropped
        assert A().m(1) == 51
    assert A().m(1) == 51 and A.m.registered is True and not hasattr(A.m, "dropped")
    assert not hasattr(A.m, "__bcrecord_base__")
    with bcrecord.patch_method(A, "m", ["x"]):
        A.m.__kwdefaults__ = {"c": 300}  # set anew, not changed in place
        A.m.__doc__ = "set while patched"
        A.m.__module__ = "package.models"  # a library giving its public functions their home (was lost)
    assert A().m(1) == 321 and A.m.__doc__ == "set while patched"
    assert A.m.__module__ == "package.models"
    if hasattr(A.m, "__type_params__"):  # 3.12+
        with bcrecord.patch_method(A, "m", ["x"]):
            A.m.__type_params__ = (typing.TypeVar("T"),)
        assert [param.__name__ for param in A.m.__type_params__] == ["T"]


def test_a_patch_s_repr_names_an_instance_by_its_class_without_calling_its_repr():
    class Half:
        def __repr__(self):
            raise RuntimeError("half-built")

        def m(self, a):
            x = a + 1
            return x

    with bcrecord.patch_method(Half(), "m", ["x"], name="h") as patch:
        assert repr(patch) == "<Patch active 'm' of this Half instance: h:m:x@0>"
    with bcrecord.patch_method(Half, "m", ["x"]) as patch:
        assert repr(patch).startswith("<Patch active 'm' of <class ")


@pytest.mark.parametrize("style", ["inline", "call"])
def test_a_function_with_builtins_of_its_own_keeps_its_globals_as_they_were(style):
    namespace = {"__builtins__": {"len": len, "sorted": sorted, "globals": globals}, "__name__": "sandbox"}
    exec("def f(a):\n    x = len(a)\n    return x, sorted(globals())\n", namespace)
    f = namespace["f"]
    previous = bcrecord.set_probe_style(style)
    try:
        with bcrecord.patch_function(f, ["x"]), bcrecord.recording() as rec:
            assert f("abc") == (3, ["__builtins__", "__name__", "f"])
    finally:
        bcrecord.set_probe_style(previous)
    assert rec["sandbox:f:x@0"] == 3 and f("ab") == (2, ["__builtins__", "__name__", "f"])


def test_defaults_set_anew_on_the_class_reach_an_instance_patched_meanwhile():
    # A config system sets M.forward's defaults after one instance was patched: the
    # instance's calls use them, as they would unpatched, and removal keeps the newest.
    class M:
        def forward(self, x, k=1, *, kw=2):
            y = x + k + kw
            return y

    m = M()
    patch = bcrecord.patch_method(m, "forward", "y", name="m")
    M.forward.__defaults__ = (10,)
    M.forward.__kwdefaults__ = {"kw": 100}
    with bcrecord.recording() as rec:
        assert m.forward(0) == 110
    assert rec.all("m:forward:y@0") == [110] and m.forward(1) == 111
    M.forward.__defaults__ = (20,)
    patch.remove()
    assert M.forward.__defaults__ == (20,) and M.forward.__kwdefaults__ == {"kw": 100}
    assert m.forward(0) == M().forward(0) == 120


def test_code_set_anew_on_the_class_runs_in_an_instance_patched_meanwhile():
    # IPython's autoreload sets M.forward.__code__ after one instance was patched: that
    # instance ran the code from before the edit; it runs the new one (unprobed, as an
    # in-place patch whose code is replaced does, with the same warning).
    class M:
        def forward(self, x):
            y = x + 1
            return y

    def edited(self, x):
        y = x + 100
        return y

    m = M()
    patch = bcrecord.patch_method(m, "forward", "y", name="m")
    M.forward.__code__ = edited.__code__
    with pytest.warns(bcrecord.RecordingWarning, match=r"M.forward's code was replaced while it was patched"):
        with bcrecord.recording() as rec:
            assert m.forward(1) == 101
    assert len(rec) == 0 and m.forward(2) == 102
    patch.remove()
    assert M.forward.__code__ is edited.__code__ and m.forward(1) == M().forward(1) == 101


@pytest.mark.parametrize("under", ["class patch first", "class patch after", "in place"])
def test_code_set_anew_under_a_class_patch_runs_in_an_instance_patched_too(under):
    # IPython's autoreload sets the __code__ of what the class holds: under a class patch its
    # stand-in, patched in place the function itself. An instance patched too went on running
    # (and recording) the code from before the edit while the other instances ran the new one.
    class M:
        def forward(self, x):
            y = x + 1
            return y

    def edited(self, x):
        y = x + 100
        return y

    m = M()
    if under == "class patch after":
        own = bcrecord.patch_method(m, "forward", "y", name="m")
    if under == "in place":
        shared = bcrecord.patch_function(M.forward, "y", name="M")
    else:
        shared = bcrecord.patch_method(M, "forward", "y", name="M")
    if under != "class patch after":
        own = bcrecord.patch_method(m, "forward", "y", name="m")
    with bcrecord.recording() as rec:
        assert m.forward(1) == 2 and M().forward(2) == 3
    assert rec.all("m:forward:y@0") == [2] and rec.all("M:forward:y@0") == [3]
    M.__dict__["forward"].__code__ = edited.__code__
    with pytest.warns(bcrecord.RecordingWarning, match=r"M.forward's code was replaced while it was patched"):
        with bcrecord.recording() as rec:
            assert m.forward(1) == 101 and M().forward(2) == 102
    assert len(rec) == 0
    own.remove()
    shared.remove()
    assert m.forward(3) == M().forward(3) == 103


def test_targets_and_another_patch_after_code_set_anew_while_patched():
    # After autoreload set the code of a patched function, targets() listed the code from before
    # the edit, and another patch was made for that code: refused for a local only the new code
    # has (no such local), or silently recording nothing of the code that runs.
    def f(a):
        x = a + 1
        return x

    def edited(a):
        x = a * 10
        y = x + 3
        return y

    class A:
        def m(self, a):
            x = a + 1
            return x

        def edited_m(self, a):
            x = a * 10
            y = x + 3
            return y

    patch = bcrecord.patch_function(f, "x", name="f")
    f.__code__ = edited.__code__
    assert bcrecord.targets(f).specs()[:2] == ["x@0", "y@0"]
    replaced = r"f's code was replaced while it was patched .* \(f:f:x@0\): remove them and patch it again"
    with pytest.raises(NotPatchableError, match=replaced):
        bcrecord.patch_function(f, ["x", "y"], name="again")
    of_class = bcrecord.patch_method(A, "m", "x", name="A")
    A.m.__code__ = A.edited_m.__code__
    assert "y@0" in bcrecord.targets(A.m).specs()
    with pytest.raises(NotPatchableError, match=r"A.m's code was replaced while it was patched"):
        bcrecord.patch_method(A, "m", "y")
    with pytest.warns(bcrecord.RecordingWarning, match=r"code was replaced while it was patched"):
        patch.remove()
        of_class.remove()
    with bcrecord.patch_function(f, ["x", "y"], name="again"), bcrecord.recording() as rec:
        assert f(1) == 13
    assert rec.all("again:edited:x@0") == [10] and rec.all("again:edited:y@0") == [13]


def test_a_copy_of_a_patch_is_the_patch_and_pickling_one_says_why_it_cannot():
    # copy.copy(patch) made a second Patch sharing the slot: removing it released the
    # original's sites, which stayed "active" and recorded nothing; pickling failed on code.
    import copy
    import pickle

    def f(a):
        x = a + 1
        return x

    patch = bcrecord.patch_function(f, "x", name="m")
    holder = {"patches": [patch]}
    assert copy.copy(patch) is patch and copy.deepcopy(holder)["patches"][0] is patch
    with pytest.raises(TypeError, match=r"a Patch cannot be pickled: it is a change made to objects"):
        pickle.dumps(holder)
    with bcrecord.recording() as rec:
        assert f(1) == 2
    assert rec.all("m:f:x@0") == [2] and patch.active
    copy.copy(patch).remove()
    assert not patch.active and f.__code__ is patch.original_code


def test_a_recorder_dict_naming_another_method_than_the_one_patched_is_refused():
    # Its 'method' was ignored: forward's own 'y' was recorded in place of _impl's.
    class Model:
        def forward(self, x):
            y = x + 1
            return self._impl(y)

        def _impl(self, y):
            y = y * 2
            return y

    model, forward = Model(), Model.__dict__["forward"]
    recorder = dict(type="FunctionRecorder", method="_impl", target="y", index=[0])
    # (from a generator too: it was parsed, used up, then found empty by the check, and taken)
    for specs in (recorder, [recorder, "x"], (spec for spec in [recorder]), iter([recorder, "x"])):
        with pytest.raises(
            SpecError, match="method='_impl' chooses the method a RecorderHook patches; here "
        ):
            bcrecord.patch_method(model, "forward", specs)
        assert Model.__dict__["forward"] is forward and "forward" not in vars(model)
    with pytest.raises(SpecError, match="here 'forward' is patched: patch '_impl' instead"):
        bcrecord.instrument(Model.forward, recorder)
    # The method it names: recorded as given.
    with bcrecord.recording() as rec, bcrecord.patch_method(model, "_impl", recorder, name="m"):
        assert model.forward(1) == 4
    assert rec.all("m:_impl:y@0") == [4]
    # Its model and name, as its method: they were dropped (the keys said 'Model:', not 'head:').
    for extra, said in (
        (dict(model="head"), r"model='head' chooses the submodule a RecorderHook patches; .*'model' out$"),
        (dict(name="head"), r"name='head' names the keys .*: give name='head' there, or leave 'name' out$"),
    ):
        with pytest.raises(SpecError, match=said):
            bcrecord.patch_method(model, "forward", dict(type="FunctionRecorder", target="y", **extra))
        assert Model.__dict__["forward"] is forward and "forward" not in vars(model)
    named = dict(type="FunctionRecorder", target="y", name="head", model="")
    with bcrecord.recording() as rec, bcrecord.patch_method(model, "forward", named, name="head"):
        assert model.forward(1) == 4
    assert rec.all("head:forward:y@0") == [2]


def test_a_recorder_dict_naming_the_function_a_wrapper_is_patched_as_is_taken():
    # Patched with unwrap=False, the wrapper's code ('wrapper') is keyed by the function's name
    # ('f'): a method='f' was refused as naming another than 'wrapper'.
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args):
            r = fn(*args)
            return r

        return wrapper

    @deco
    def f(a):
        x = a * 2
        return x

    recorder = dict(type="FunctionRecorder", method="f", target="r", index=[0])
    with bcrecord.recording() as rec, bcrecord.patch_function(f, recorder, unwrap=False, name="w") as patch:
        f(2)
    assert patch.keys == ("w:f:r@0",) and rec.all("w:f:r@0") == [4]
    with pytest.raises(SpecError, match=r"here 'f' is patched: patch 'g' instead, .*give method='f'"):
        bcrecord.patch_function(f, dict(recorder, method="g"), unwrap=False)


def test_a_recording_entered_while_another_thread_adds_a_patch_to_its_function():
    # Entering a recording builds (and keeps) the code of the subset of a function's patches
    # it takes; adding or removing a patch rewrote that table under another lock: "dictionary
    # changed size during iteration" in the patching thread, seen with record() in threads.
    import threading

    def f(a):
        x = a + 1
        return x

    first = bcrecord.patch_function(f, ["x"], name="first")
    second = bcrecord.patch_function(f, ["x"], name="second")
    with bcrecord.recording(only=[first]):  # the table holds a subset's code
        f(1)
    got = {}

    def enter():
        with bcrecord.recording(only=[second]) as rec:
            got["second"] = f(2)
        got["rec"] = rec

    other = threading.Thread(target=enter)

    def meanwhile(frame, event, arg):  # run that thread while this one walks the table
        if event == "c_call" and getattr(arg, "__name__", None) == "issuperset" and not other.is_alive():
            sys.setprofile(None)
            other.start()
            other.join(0.5)  # (with the table locked it waits: the lock is this thread's)

    sys.setprofile(meanwhile)
    try:
        third = bcrecord.patch_function(f, ["x"], name="third")
    finally:
        sys.setprofile(None)
        other.join()
    for patch in (first, second, third):
        patch.remove()
    assert got["second"] == 3 and got["rec"].all("second:f:x@0") == [3]


def test_a_subset_built_in_another_thread_while_a_patch_is_delivered_last_is_not_kept(monkeypatch):
    # deliver_last (and respell_inline) emptied the table of subsets' code before taking the
    # arming lock: a recording entering in another thread meanwhile stored the code it was
    # building, in the former order, in the emptied table, and later recordings taking that
    # subset delivered in the former order for good.
    import threading

    from bcrecord import patch as patch_module

    def f(a):
        x = a + 1
        return x

    p1, p2, p3 = (bcrecord.patch_function(f, "x", name=name) for name in ("p1", "p2", "p3"))
    built, go = threading.Event(), threading.Event()
    plan = patch_module._Slot.plan

    def slow_plan(self, patches):  # a big function's subset, built in the recording's thread
        code = plan(self, patches)
        if threading.current_thread().name == "entering" and len(patches) == 2:
            built.set()
            go.wait(5)
        return code

    monkeypatch.setattr(patch_module._Slot, "plan", slow_plan)

    def enter():
        with bcrecord.recording(only=[p1, p2]):
            pass

    entering = threading.Thread(target=enter, name="entering")
    entering.start()
    assert built.wait(5)
    delivering = threading.Thread(target=p1.deliver_last)
    delivering.start()
    delivering.join(0.2)  # (waits for the arming lock, which the entering thread holds)
    go.set()
    delivering.join()
    entering.join()
    monkeypatch.setattr(patch_module._Slot, "plan", plan)
    with bcrecord.recording(only=[p1, p2]) as rec:
        f(1)
    assert rec.keys() == ["p2:f:x@0", "p1:f:x@0"]
    patch_module.remove_all([p1, p2, p3])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("lock", [bcrecord.patch._lock, rewrite._cache_lock], ids=["patch", "rewrite cache"])
def test_a_child_forked_while_another_thread_patches_patches_and_records_and_does_not_hang(lock):
    # Patching runs under the patch lock and the rewrite cache's: a child forked while
    # another thread held one waited for it for good.
    class Net:
        def forward(self, a):
            h = a + 1
            return h

    def in_child():
        patch = bcrecord.patch_method(Net, "forward", "h")
        with bcrecord.recording() as rec:
            Net().forward(41)
        patch.remove()
        return rec.all("Net:forward:h@0"), bcrecord.patch._lock.depth

    assert fork_while_held(lock, in_child) == "([42], 0)"


def test_a_copy_instrument_made_pickles_by_name_where_it_took_the_original_s_place(monkeypatch):
    # A task sent to a spawn worker is pickled, a function by its module and name (README).
    module = types.ModuleType("bcrecord_pickled_by_name")
    exec("def f(a):\n    x = a * 2\n    return x\n", module.__dict__)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    copy = bcrecord.instrument(module.f, "x", name="pk")
    with pytest.raises(pickle.PicklingError, match="not the same object"):
        pickle.dumps(copy)
    module.f = copy
    assert pickle.loads(pickle.dumps(copy)) is copy


def test_a_recording_copy_pickled_by_value_arrives_a_plain_function():
    # cloudpickle and dill (joblib, Ray, Dask) send a __main__ function by value, its __dict__
    # with it: the slot bcrecord keeps there was refused ("a Patch cannot be pickled").
    import cloudpickle

    @bcrecord.record_locals("x")
    def step(a):
        x = a + 1
        return x

    doubled = bcrecord.instrument(lambda a: a * 2, "return", name="twice")
    sent, sent_doubled = (pickle.loads(cloudpickle.dumps(func)) for func in (step, doubled))
    with bcrecord.recording() as rec:
        assert sent(1) == 2 and sent_doubled(3) == 6
        assert step(2) == 3
    assert dict(rec.items()) == {"tests.test_patch:step:x@0": 3}  # (none of the sent ones)


def test_a_numba_function_is_refused_saying_its_calls_run_no_bytecode_and_what_records_instead():
    def double(x):
        y = x * 2
        return y

    class CPUDispatcher:  # what @numba.njit gives: machine code, its Python function as __wrapped__
        __module__ = "numba.core.registry"

        def __init__(self, func):
            self.__wrapped__ = func
            self.__qualname__ = func.__name__

        def __call__(self, x):
            return x * 2

    compiled = CPUDispatcher(double)
    # It said "patch_function(double.__wrapped__, specs)": numba then compiles the probes (inside a
    # recording) and raises a TypingError, or runs its machine code, recording nothing.
    message = r"^double is a numba CPUDispatcher: its calls run compiled machine code, .*"
    message += r"bcrecord\.instrument\(double\.__wrapped__, specs\)\(\.\.\.\)"
    for attempt in (bcrecord.patch_function, bcrecord.instrument):
        with pytest.raises(NotPatchableError, match=message):
            attempt(compiled, "y")
    with bcrecord.recording() as rec:
        assert bcrecord.instrument(compiled.__wrapped__, "y")(3) == 6
    assert rec.all(f"{__name__}:double:y@0") == [6]


def test_real_numba_functions_are_refused_and_their_python_function_records_in_calls_of_its_own():
    numba = pytest.importorskip("numba")

    def double(x):
        y = x * 2
        return y

    kinds = {
        "CPUDispatcher": numba.njit(double),
        "DUFunc": numba.vectorize(double),
        "CFunc": numba.cfunc("int64(int64)")(double),
    }
    for kind, compiled in kinds.items():
        for attempt in (bcrecord.patch_function, bcrecord.instrument, bcrecord.targets):
            with pytest.raises(
                NotPatchableError, match=rf"^\S*\.double is a numba {kind}: its calls run compiled"
            ):
                attempt(compiled, "y") if attempt is not bcrecord.targets else attempt(compiled)
    assert kinds["CPUDispatcher"](3) == 6 and double.__code__ is kinds["CPUDispatcher"].py_func.__code__
    with bcrecord.recording() as rec:
        assert bcrecord.instrument(kinds["CPUDispatcher"].__wrapped__, "y")(3) == 6
    assert rec.all(f"{__name__}:double:y@0") == [6]


@pytest.mark.skipif(sys.version_info < (3, 14), reason="lazy annotations (PEP 649) are 3.14's")
def test_functions_whose_annotations_name_what_is_not_defined_yet_patch_and_keep_them_lazy():
    # Copying a function read its __annotations__, which 3.14 evaluates when first read:
    # patch_method, instrument and record_locals raised a NameError for annotations naming a
    # class defined later, or a name imported only for type checkers; patch_function worked.
    namespace: dict = {"__name__": "lazy"}
    source = (
        "class Model:\n"
        "    def forward(self, x: np.ndarray) -> Later:\n"
        "        y = x + 1\n"
        "        return y\n"
        "def area(w: Later, h: int) -> int:\n"
        "    a = w * h\n"
        "    return a\n"
    )
    exec(compile(source, "<lazy>", "exec"), namespace)
    Model, area = namespace["Model"], namespace["area"]
    original = Model.__dict__["forward"]
    copies = [bcrecord.instrument(area, "a"), bcrecord.record_locals("a")(area)]
    model = Model()
    with bcrecord.patch_method(model, "forward", "y", name="one"), bcrecord.recording() as rec:
        assert [copy(2, 3) for copy in copies] == [6, 6] and model.forward(4) == 5
    with bcrecord.patch_method(Model, "forward", "y", name="all"), bcrecord.recording() as every:
        assert Model().forward(1) == 2
        Model.forward.__annotations__ = {"x": int}  # set through the stand-in: the function's
    assert rec.all("lazy:area:a@0") == [6, 6] and rec.all("one:forward:y@0") == [5]
    assert every.all("all:forward:y@0") == [2] and "forward" not in vars(model)
    assert Model.__dict__["forward"] is original and original.__annotations__ == {"x": int}
    for copy in copies:
        with pytest.raises(NameError, match="'Later'"):  # still lazy, as the function's own
            _ = copy.__annotations__
    namespace["Later"] = Later = type("Later", (), {})
    assert [copy.__annotations__ for copy in copies] == [{"w": Later, "h": int, "return": int}] * 2


class _ObjectProxy:
    """What wrapt's ``ObjectProxy`` and ``FunctionWrapper`` are to Python: an object that reports
    the class of what it wraps, and reads and writes its attributes (a function's ``__code__`` too)."""

    def __init__(self, wrapped, wrapper=None):
        object.__setattr__(self, "__wrapped__", wrapped)
        object.__setattr__(self, "_self_wrapper", wrapper)

    @property
    def __class__(self):
        return type(self.__wrapped__)

    def __getattr__(self, name):
        return getattr(self.__wrapped__, name)

    def __setattr__(self, name, value):
        setattr(self.__wrapped__, name, value)

    def __call__(self, *args, **kwargs):
        return self._self_wrapper(self.__wrapped__, args, kwargs)


def test_unwrap_false_on_an_object_proxy_around_a_function_is_refused_and_changes_nothing():
    # Such a proxy passes for a function, and its __code__ is the wrapped function's: its
    # "wrapper" patched was the inner function, whose return was recorded as what callers get.
    def doubler(wrapped, args, kwargs):
        return wrapped(*args, **kwargs) * 2

    def wd(a):
        x = a + 1
        return x

    proxy, code = _ObjectProxy(wd, doubler), wd.__code__
    module = types.ModuleType("proxied")
    module.wd = proxy
    for patch in (
        lambda: bcrecord.patch_function(proxy, "return", unwrap=False),
        lambda: bcrecord.patch_method(module, "wd", "return", unwrap=False),
    ):
        with pytest.raises(NotPatchableError) as raised:
            patch()
        message = str(raised.value)
        assert (
            "<locals>.wd is a _ObjectProxy, an object proxy around a function, not a function: unwrap=False "
            "has no wrapper code of its own to patch (what callers get comes from the decorator's function "
            "(test_unwrap_false_on_an_object_proxy_around_a_function_is_refused_and_changes_nothing.<locals>"
            ".doubler), shared by every function it decorates)" in message
        )
        assert wd.__code__ is code and module.wd is proxy and proxy(1) == 4
    with bcrecord.patch_function(proxy, "x", name="p"), bcrecord.recording() as rec:
        assert proxy(1) == 4
    assert rec.all("p:wd:x@0") == [2] and wd.__code__ is code


def test_the_original_of_a_function_patch_method_replaced_pickles_once_removed_and_under_patch_function():
    # As the README says: pickle looks the function up by name and finds the recording copy.
    import pickle

    module = types.ModuleType("bcrecord_pickled_functions")
    exec("def f(x):\n    y = x + 1\n    return y\n", module.__dict__)
    sys.modules[module.__name__] = module
    try:
        f = module.f
        with bcrecord.patch_method(module, "f", "y"):
            with pytest.raises(pickle.PicklingError):
                pickle.dumps(f)
        assert pickle.loads(pickle.dumps(f)) is f
        with bcrecord.patch_function(f, "y"):
            assert pickle.loads(pickle.dumps(f)) is f
    finally:
        del sys.modules[module.__name__]


def test_an_object_proxy_standing_for_a_class_or_module_is_refused_and_changes_nothing():
    # inspect.getattr_static took it for a class and raised a TypeError of its own.
    class A:
        def m(self, v):
            y = v + 1
            return y

    module = types.ModuleType("proxied")
    module.f = A.m
    original = A.__dict__["m"]
    for holder, method, kind in ((A, "m", "class"), (module, "f", "module")):
        with pytest.raises(NotPatchableError) as raised:
            bcrecord.patch_method(_ObjectProxy(holder), method, "y")
        assert str(raised.value).endswith(
            f"was given as a _ObjectProxy, an object proxy standing for a {kind}: patch the {kind} itself "
            "(the proxy's __wrapped__, where it has one)"
        )
    assert A.__dict__["m"] is original and module.f is original and vars(original) == {}


def test_a_patch_says_it_is_stale_once_its_function_s_code_is_set_anew():
    def f(x):
        y = x + 1
        return y

    def g(x):
        y = x * 10
        return y

    patch = bcrecord.patch_function(f, "y")
    assert patch.stale is False
    f.__code__ = g.__code__  # as IPython's autoreload does
    assert patch.stale is True
    with pytest.warns(bcrecord.RecordingWarning, match="code was replaced while it was patched"):
        patch.remove()
    assert patch.stale is False and f(1) == 10


def test_patching_a_function_in_place_is_refused_while_its_patched_stand_in_runs_code_set_anew():
    # patch_function of the original was accepted: made for the new code, which removing the
    # stand-in's patch carries back to it, over its probes (it recorded nothing after that).
    module = types.ModuleType("bcrecord_reloaded")
    exec("def f(x):\n    y = x + 1\n    return y\n", module.__dict__)
    original = module.f
    patch = bcrecord.patch_method(module, "f", ["y"], name="m")
    namespace = {}
    exec("def f(x):\n    y = x + 1000\n    y = y + 1\n    return y\n", namespace)
    module.f.__code__ = namespace["f"].__code__  # as IPython's autoreload does
    with pytest.raises(NotPatchableError) as raised:
        bcrecord.patch_function(original, ["y@1"], name="m")
    assert str(raised.value) == (
        "f's code was replaced while it was patched (its __code__ set anew: IPython's autoreload does so), "
        "so the patches on it record nothing of the new code (m:f:y@0): remove them and patch it again"
    )
    with pytest.warns(bcrecord.RecordingWarning, match="code was replaced while it was patched"):
        patch.remove()
    with bcrecord.patch_function(original, ["y@1"], name="m"), bcrecord.recording() as rec:
        assert original(1) == 1002
    assert rec.all("m:f:y@1") == [1002]


def _interrupted(a):
    x = a + 1
    return x


@pytest.mark.parametrize("form", ["patch_function", "patch_method"])
def test_an_interrupt_at_any_call_while_patching_leaves_the_function_as_it_was(form):
    # What a signal handler raises (a timeout's TimeoutError) comes out of a call. Cut short while
    # patching, the sinks lists were left shorter than the ids handed out (a later patch's probes
    # raised IndexError inside the program's function, in other threads), or a slot stayed,
    # untracked (the function recorded nothing for good), or the patch stayed with no Patch to
    # remove it. Interrupted at each place in bcrecord's code in turn (tests/interrupts.py).
    import threading

    from bcrecord import analysis, patch, runtime

    module, original = sys.modules[__name__], _interrupted.__code__
    where = calls_in({runtime.__file__, patch.__file__, rewrite.__file__, analysis.__file__})
    made = []

    def make():
        if form == "patch_function":
            made.append(bcrecord.patch_function(_interrupted, "x"))
        else:
            made.append(bcrecord.patch_method(module, "_interrupted", "x"))

    places, _ = interrupted(make, where)
    made.pop().remove()
    assert len(places) > 100
    cut = 0
    slots = dict(patch._slots)  # (those of earlier tests' recording copies still held)
    for nth in range(1, len(places) + 1):
        # No released id to reuse: the patch's sites grow every sinks list.
        held = runtime.register_sites([runtime.Site("t:f:x@0")] * len(runtime._free_ids))
        _, raised = interrupted(make, where, stop_at=nth)
        if raised:
            cut += 1
            assert module._interrupted is _interrupted and _interrupted.__code__ is original, nth
            assert patch._slots == slots and not made, nth
        else:
            made.pop().remove()
        make()  # records, in another thread too
        with bcrecord.recording(threads="all") as rec:
            module._interrupted(1)
            worker = threading.Thread(target=module._interrupted, args=(2,))
            worker.start()
            worker.join()
        made.pop().remove()
        runtime.release_sites(held)
        assert sorted(rec.all(f"{__name__}:_interrupted:x@0")) == [2, 3], nth
    assert cut > 50 and module._interrupted is _interrupted and _interrupted.__code__ is original


def test_remove_all_cut_short_by_an_interrupt_still_removes_the_rest(monkeypatch):
    # A timeout's exception as one patch's removal returned left the patches before it in place:
    # a record() block's exit left its model's classes patched for good.
    from bcrecord.patch import Patch, remove_all

    def first(a):
        x = a + 1
        return x

    def second(a):
        y = a * 2
        return y

    codes = first.__code__, second.__code__
    patches = [bcrecord.patch_function(first, "x"), bcrecord.patch_function(second, "y")]
    remove = Patch.remove

    def interrupted(self):
        remove(self)
        if self is patches[1]:
            raise Interrupt

    monkeypatch.setattr(Patch, "remove", interrupted)
    with pytest.raises(Interrupt):
        remove_all(collections.deque(patches))  # (a sequence that is not sliced: the rest went)
    assert (first.__code__, second.__code__) == codes
    assert not any(patch.active for patch in patches)


def _slow(v):
    r = v * 2
    return r


def _default_conversion(v):
    r = ("obj", v)
    return r


_fast = functools.lru_cache(maxsize=None)(_slow)
_convert = functools.singledispatch(_default_conversion)


def test_a_cache_or_dispatcher_held_under_another_name_is_told_the_function_to_patch():
    # Their qualified names are the function's they wrap: the message named that one as the
    # cache, and told patch_function(_slow.__wrapped__), which fails (a plain function has none).
    with pytest.raises(NotPatchableError) as caught:
        bcrecord.patch_function(_fast, "r")
    assert str(caught.value) == (
        "this _lru_cache_wrapper around _slow is C code around a Python function: patch the function "
        "it wraps, patch_function(_slow, specs)"
    )
    with pytest.raises(NotPatchableError, match=r"^this functools.singledispatch function \(of "):
        bcrecord.patch_method(sys.modules[__name__], "_convert", "r")
    assert "the default one (_default_conversion)" in str(
        pytest.raises(NotPatchableError, bcrecord.patch_function, _convert, "r").value
    )
    with bcrecord.patch_function(_slow, "r"), bcrecord.recording() as rec:  # what it says works
        _fast(4)
    assert rec.all(f"{__name__}:_slow:r@0") == [8]


def test_a_bound_method_given_to_patch_method_is_told_to_pass_what_holds_it():
    # It said only "this method instance has no attribute 'forward'".
    class ToyModel:
        def forward(self, inputs):
            outputs = inputs + 1
            return outputs

    model = ToyModel()
    with pytest.raises(bcrecord.NotPatchableError) as caught:
        bcrecord.patch_method(model.forward, "forward", ["outputs"])
    assert str(caught.value) == (
        "this method instance has no attribute 'forward' (a bound method: patch_method takes the "
        "object holding the method, here the ToyModel instance that 'forward' is bound to: "
        "patch_method(it, 'forward', ...); or patch_function(the bound method, ...))"
    )
    assert "forward" not in vars(model) and ToyModel.forward(model, 1) == 2
