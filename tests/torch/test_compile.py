"""torch.compile: a patched model compiles, runs correctly and records every value."""

import collections
import contextlib
import warnings

import pytest
import torch
import torch._dynamo

import bcrecord
from bcrecord.torch import record

from .models import SmallNet, reference_smallnet


def _prints_ok(script):
    """Run ``script`` in a fresh interpreter (bcrecord and torch imported there in its order):
    it must end printing ``ok``."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok"]
    return result


def test_compiled_patched_model_records_correct_values_every_call():
    torch.manual_seed(0)
    net = SmallNet().eval()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="aot_eager")
    counters = torch._dynamo.utils.counters
    counters.clear()
    with record(net, ["bn1", "blocks.1:forward:out@1", ":forward:x@4"]) as rec:
        for _ in range(3):
            x = torch.randn(2, 3, 8, 8)
            out = compiled(x)
            expected = reference_smallnet(net, x)
            assert torch.allclose(out, expected["fc"], atol=1e-5)
            assert torch.allclose(rec["bn1:forward:return"], expected["bn1"], atol=1e-5)
            assert torch.allclose(rec["blocks.1:forward:out@1"], expected["blocks.1.bn"], atol=1e-5)
            assert torch.allclose(rec[":forward:x@4"], expected["pooled"], atol=1e-5)
    assert [len(rec.all(k)) for k in rec.keys()] == [3, 3, 3]
    # the probe runs outside the graph: it breaks the graph, nothing else does
    reasons = list(counters["graph_break"])
    assert reasons and all("bcrecord_probe" in r for r in reasons), [r[:300] for r in reasons]


def test_a_module_target_breaks_the_graph_at_every_instance_of_its_class():
    # The docs said "one graph break per probe site": 'bn1' patches BatchNorm2d's forward,
    # whose probe every BatchNorm2d of the model runs (recording nothing for the others).
    net = SmallNet().eval()
    batch_norms = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    x = torch.randn(2, 3, 8, 8)
    for targets, breaks in [([":forward:x@4"], 1), (["bn1"], len(batch_norms))]:
        torch._dynamo.reset()
        with record(net, targets) as rec:
            explained = torch._dynamo.explain(net)(x)
        assert explained.graph_break_count == breaks, targets
        assert all("bcrecord_probe" in str(b.reason) for b in explained.break_reasons)
        assert [len(rec.all(k)) for k in rec.keys()] == [1]
    assert len(batch_norms) == 4


def test_compiled_model_without_recording_has_no_probe_breaks():
    net = SmallNet().eval()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="aot_eager")
    counters = torch._dynamo.utils.counters
    counters.clear()
    with record(net, ["bn1"]):
        pass
    compiled(torch.randn(1, 3, 8, 8))
    assert not counters["graph_break"]


def test_what_the_probe_calls_runs_eagerly_under_compile():
    # A reduce function (called by the probe) must see real tensors with Dynamo
    # switched off, never be compiled itself; Dynamo is back on afterwards.
    from torch._C._dynamo.eval_frame import get_eval_frame_callback

    net = SmallNet().eval()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="aot_eager")
    callbacks, kinds = [], []

    def reduce(t):
        callbacks.append(get_eval_frame_callback())
        kinds.append(type(t))
        return t.sum()

    x = torch.randn(2, 3, 8, 8)
    with record(net, ["bn1", ":forward:x@4"], reduce=reduce) as rec:
        for _ in range(2):
            out = compiled(x)
    expected = reference_smallnet(net, x)
    assert torch.allclose(out, expected["fc"], atol=1e-5)
    assert callbacks and all(cb is None for cb in callbacks), callbacks
    assert kinds == [torch.Tensor] * 4
    assert torch.allclose(rec["bn1:forward:return"], expected["bn1"].sum(), atol=1e-4)
    assert get_eval_frame_callback() is None


def test_a_function_patched_before_torch_was_imported_compiles_and_records():
    # Patched first, its probes are spelled inline: a constant Dynamo cannot trace
    # (compiling raised). Importing bcrecord.torch re-spells them as calls.
    import textwrap

    script = textwrap.dedent(
        """
        import sys
        import bcrecord

        def f(t):
            x = t * 2
            ys = [x * k for k in range(2)]
            return x + 1

        patched = bcrecord.instrument(f, ["x", "ys"], name="early")
        assert "torch" not in sys.modules and bcrecord.rewrite.probe_style() == "inline"
        import torch
        import bcrecord.torch

        compiled = torch.compile(lambda t: patched(t) * 3, backend="eager")
        with bcrecord.recording() as rec:
            out = compiled(torch.ones(2))
        assert torch.equal(out, torch.full((2,), 9.0)), out
        assert torch.equal(rec["early:f:x@0"], torch.full((2,), 2.0))
        assert [v.tolist() for v in rec["early:f:ys@0"]] == [[0.0, 0.0], [2.0, 2.0]]
        print("ok")
        """
    )
    _prints_ok(script)


def test_importing_the_torch_layer_leaves_dynamo_unloaded_and_marks_the_probe_once_it_loads():
    # Importing Dynamo to mark the probe doubled the time of `import torch` (0.65 s more on
    # torch 2.13): the marks are made when the program imports it, before it compiles.
    import textwrap

    script = textwrap.dedent(
        """
        import sys
        import torch
        import bcrecord.torch
        from bcrecord import runtime
        from bcrecord.torch import FeatureExtractor, RecordBlock, create_feature_extractor, record
        from bcrecord.torch.record import _GradientHook

        assert "torch._dynamo" not in sys.modules
        assert not hasattr(runtime.__bcrecord_probe__, "_torchdynamo_disable")
        net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
        x = torch.ones(2, 3)
        compiled = torch.compile(net, backend="eager")
        from torch._dynamo.utils import counters

        with record(net, ["1"]) as rec:
            out = compiled(x)
        assert torch.equal(out, net(x)) and torch.equal(rec["1:forward:return"], net[1](net[0](x)))
        assert sum(counters["graph_break"].values()) == 1, dict(counters["graph_break"])
        features = torch.compile(create_feature_extractor(net, ["1"]), backend="eager")(x)
        assert torch.equal(features["1"], net[1](net[0](x)))
        marked = [runtime.__bcrecord_probe__, FeatureExtractor._plan, FeatureExtractor._first_in_mode,
                  FeatureExtractor._new_recording, RecordBlock.__enter__, RecordBlock.__exit__, record,
                  _GradientHook.__call__]
        assert all(function._torchdynamo_disable is True for function in marked)
        assert not [f for f in sys.meta_path if type(f).__module__ == "bcrecord.runner"]  # gone
        print("ok")
        """
    )
    _prints_ok(script)


def test_a_core_recording_loads_the_torch_layer_so_that_compiled_code_skips_its_probes():
    # With torch imported and bcrecord.torch not, the layer was loaded at the first tensor a probe
    # met, inside compiled code: Dynamo traced into the probe (29 graph breaks, a recompile limit).
    import textwrap

    script = textwrap.dedent(
        """
        import sys, warnings
        import torch
        import bcrecord

        def helper(x):
            y = x * 2
            return torch.sin(y)

        bcrecord.patch_function(helper, ["y"], name="h")

        @torch.compile(backend="eager")
        def f(x):
            return helper(x + 1) * 3

        x = torch.randn(3)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with bcrecord.recording() as rec:
                assert "bcrecord.torch" in sys.modules
                for i in range(3):
                    f(x + i)
        from torch._dynamo.utils import counters

        assert [torch.equal(v, (x + i + 1) * 2) for i, v in enumerate(rec.all("h:helper:y@0"))] == [True] * 3
        # (as where the program imports bcrecord.torch first: the probe's breaks, nothing else)
        breaks = dict(counters["graph_break"])
        assert all("__bcrecord_probe__" in reason for reason in breaks), breaks
        assert sum(counters["graph_break"].values()) <= 2 and counters["stats"]["unique_graphs"] <= 4
        assert [str(w.message)[:80] for w in caught] == []
        print("ok")
        """
    )
    _prints_ok(script)


def test_importing_the_torch_layer_while_another_thread_imports_dynamo_waits_for_it():
    # The marks imported Dynamo's decorators at once, beside the other thread's import of
    # Dynamo, which then failed ("partially initialized module"). That import is held half
    # way here while the torch layer is imported.
    import textwrap

    script = textwrap.dedent(
        """
        import sys, threading, importlib, importlib.abc, time, torch

        held = threading.Event()
        release = threading.Event()

        class Hold(importlib.abc.MetaPathFinder):
            # Holds the import of torch._dynamo half way (at its submodule 'config') until released.
            def find_spec(self, name, path, target=None):
                if name == "torch._dynamo.config" and threading.current_thread().name == "importer":
                    held.set()
                    release.wait(10)
                return None

        sys.meta_path.insert(0, Hold())
        errors = []
        def importer():
            try:
                importlib.import_module("torch._dynamo")
            except BaseException as error:
                errors.append(repr(error))
        thread = threading.Thread(target=importer, name="importer")
        thread.start()
        assert held.wait(10)
        threading.Timer(0.5, release.set).start()
        import bcrecord.torch
        from bcrecord import runtime
        thread.join()
        assert errors == [], errors
        assert runtime.__bcrecord_probe__._torchdynamo_disable is True
        print("ok")
        """
    )
    _prints_ok(script)


def test_a_recording_while_another_thread_imports_dynamo_takes_it_for_nothing_compiled(monkeypatch):
    # Its counters were read from the module being imported: "partially initialized module
    # 'torch._dynamo' has no attribute 'utils'", from record().
    import sys
    import types

    import bcrecord.torch

    swapped = bcrecord.torch._CompiledCode()
    monkeypatch.setitem(sys.modules, "torch._dynamo", types.ModuleType("torch._dynamo"))
    swapped(SmallNet.forward.__code__, True, SmallNet.forward)
    assert swapped.counters is None  # (read again at the next swap, once Dynamo is there)
    monkeypatch.undo()
    swapped(SmallNet.forward.__code__, True, SmallNet.forward)
    assert swapped.counters is torch._dynamo.utils.counters


def test_dynamo_imported_past_the_torch_layer_s_hook_is_marked_when_a_recording_starts():
    # A finder of the program's own, ahead of the hook, found Dynamo: the probe was never
    # marked (Dynamo warned of set_eval_frame at each compiled call), the hook left for good.
    import textwrap

    script = textwrap.dedent(
        """
        import importlib.abc, importlib.machinery, sys
        import torch
        import bcrecord.torch
        from bcrecord import runtime
        from bcrecord.torch import record

        class Own(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.startswith("torch._dynamo"):
                    return importlib.machinery.PathFinder.find_spec(name, path, target)
                return None

        sys.meta_path.insert(0, Own())
        import torch._dynamo
        assert not hasattr(runtime.__bcrecord_probe__, "_torchdynamo_disable")
        net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
        x = torch.ones(2, 3)
        compiled = torch.compile(net, backend="eager")
        with record(net, ["1"]) as rec:
            assert runtime.__bcrecord_probe__._torchdynamo_disable is True
            out = compiled(x)
        assert torch.equal(out, net(x)) and torch.equal(rec["1:forward:return"], out)
        assert not [f for f in sys.meta_path if type(f).__module__ == "bcrecord.runner"]
        print("ok")
        """
    )
    assert "set_eval_frame" not in _prints_ok(script).stderr


def test_the_probe_is_the_core_function_with_dynamo_s_frame_switch():
    # One Python call per recorded value in eager code: no wrapper around the core probe.
    import builtins

    from torch._C._dynamo.eval_frame import set_eval_frame

    from bcrecord import runtime

    assert getattr(builtins, runtime.PROBE_NAME) is runtime.__bcrecord_probe__
    assert runtime.__bcrecord_probe__._torchdynamo_disable is True  # Dynamo skips it
    switch = runtime.set_frame_switch(None)
    try:
        assert switch is set_eval_frame
    finally:
        runtime.set_frame_switch(switch)


def test_fullgraph_compile_of_a_recorded_model_says_bcrecord_s_probe_is_why():
    # Dynamo's own error said "reason: None" and hinted to remove a torch.compiler.disable call.
    net = SmallNet().eval()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager", fullgraph=True)
    with record(net, ["bn1"]) as rec:
        with pytest.raises(torch._dynamo.exc.Unsupported) as raised:
            compiled(torch.randn(1, 3, 8, 8))
    assert "reason: bcrecord records a value here" in str(raised.value)
    assert "compile or export it outside record()" in str(raised.value)
    assert rec.keys() == []
    torch._dynamo.reset()
    assert compiled(torch.randn(1, 3, 8, 8)).shape == (1, 5)  # outside record(): one graph


def test_fullgraph_compile_of_a_function_patched_in_a_core_recording_names_bcrecord_recording():
    # The reason named record() alone: a patch_method user records with bcrecord.recording().
    net = SmallNet().eval()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager", fullgraph=True)
    with bcrecord.patch_method(SmallNet, "forward", ["x@1"]), bcrecord.recording() as rec:
        with pytest.raises(torch._dynamo.exc.Unsupported) as raised:
            compiled(torch.randn(1, 3, 8, 8))
    assert "outside record() (or bcrecord.recording(), around a patch)" in str(raised.value)
    assert rec.keys() == []
    torch._dynamo.reset()
    assert compiled(torch.randn(1, 3, 8, 8)).shape == (1, 5)  # outside the recording: one graph


def test_a_model_compiled_before_recording_records_and_recompiles_once():
    # Dynamo inlines submodules' forward into the caller's graph and does not guard
    # on __code__: a graph compiled before the probes went in must not be reused.
    from bcrecord.torch import create_feature_extractor

    torch.manual_seed(0)
    net = SmallNet().eval()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager")
    x = torch.randn(2, 3, 8, 8)
    compiled(x)  # compiled with the original code, nothing recording
    expected = reference_smallnet(net, x)
    with record(net, ["bn1", "blocks.1:forward:out@1"]) as rec:
        compiled(x)
    assert torch.allclose(rec["bn1:forward:return"], expected["bn1"], atol=1e-5)
    assert torch.allclose(rec["blocks.1:forward:out@1"], expected["blocks.1.bn"], atol=1e-5)
    extractor = create_feature_extractor(compiled, ["bn1"])
    stats = torch._dynamo.utils.counters["stats"]
    firsts = [extractor(x)["bn1"] for _ in range(2)]
    graphs = stats["unique_graphs"]
    lasts = [extractor(x)["bn1"] for _ in range(3)]
    assert stats["unique_graphs"] == graphs  # once the probes are in its graph, no recompiles
    for value in firsts + lasts:
        assert torch.allclose(value, expected["bn1"], atol=1e-5)
    assert torch.allclose(compiled(x), expected["fc"], atol=1e-5)  # between calls: same outputs
    extractor.close()


def test_code_swaps_drop_dynamo_s_caches_only_for_graphs_compiled_without_the_probes(monkeypatch):
    from bcrecord.torch import _CompiledCode

    counters: collections.defaultdict = collections.defaultdict(collections.Counter)
    monkeypatch.setattr(torch._dynamo.utils, "counters", counters)
    drops = []
    monkeypatch.setattr(torch._dynamo, "reset_code_caches", lambda: drops.append("dropped"))
    # A function defined here, whose class cannot be found from its name: every graph goes.
    function = lambda: 0  # noqa: E731
    hook, code = _CompiledCode(), function.__code__
    hook(code, False, function)  # probes out, in, out, in: nothing compiled (eager use)
    hook(code, True, function)
    hook(code, False, function)
    hook(code, True, function)
    assert drops == [] and len(hook.out_at) == 0 and "stats" not in counters
    hook(code, False, function)
    counters["stats"]["unique_graphs"] += 1  # compiled while the probes were out
    hook(code, True, function)
    assert drops == ["dropped"]
    counters["stats"]["unique_graphs"] += 1  # compiled with the probes in: the graph has them
    hook(code, False, function)
    hook(code, True, function)
    assert drops == ["dropped"]
    counters.clear()  # cleared (as Dynamo's own tests do): counting starts again
    hook(code, False, function)
    counters["stats"]["unique_graphs"] += 1
    hook(code, True, function)
    assert drops == ["dropped", "dropped"]


def test_an_extractor_of_a_compiled_model_records_after_dynamo_s_counters_were_cleared():
    # The counters cleared (tests and benchmarks do, between phases) and a graph compiled
    # without the probes after that: its count was below the one noted when the probes last
    # went out, so the graph stayed, and the extractor raised "never reached ['bn1']".
    from bcrecord.torch import create_feature_extractor

    torch.manual_seed(0)
    net = SmallNet().eval()
    torch._dynamo.reset()
    compiled = torch.compile(net, backend="eager", dynamic=False)
    extractor = create_feature_extractor(compiled, ["bn1"])
    x, y, z = torch.randn(2, 3, 8, 8), torch.randn(3, 3, 8, 8), torch.randn(4, 3, 8, 8)
    for _ in range(2):
        assert torch.allclose(extractor(x)["bn1"], reference_smallnet(net, x)["bn1"], atol=1e-5)
    torch._dynamo.utils.counters.clear()
    compiled(y)  # compiled while the probes are out, after the clear
    assert torch.allclose(extractor(y)["bn1"], reference_smallnet(net, y)["bn1"], atol=1e-5)
    compiled(z)  # and again, for another shape
    assert torch.allclose(extractor(z)["bn1"], reference_smallnet(net, z)["bn1"], atol=1e-5)
    stats = torch._dynamo.utils.counters["stats"]
    for batch in (x, y, z):  # each shape's graph compiled again, with the probes
        assert torch.allclose(extractor(batch)["bn1"], reference_smallnet(net, batch)["bn1"], atol=1e-5)
    graphs = stats["unique_graphs"]
    for batch in (x, y, z):  # and then kept: no more recompiles
        assert torch.allclose(extractor(batch)["bn1"], reference_smallnet(net, batch)["bn1"], atol=1e-5)
    assert stats["unique_graphs"] == graphs
    extractor.close()


def test_a_compiled_patch_alternating_with_idle_calls_after_a_clear_of_the_counters_recompiles_nothing():
    # benchmarks/run.py's case 6 clears Dynamo's counters after the warm-ups, then alternates
    # recorded and idle calls of one compiled patched model: taken for graphs of unknown age,
    # the clear dropped every graph at the next swap, the idle calls compiled theirs again,
    # which the next swap dropped again: 123 recompiles while timing.
    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            y = self.lin(x)
            return y * 2

    torch.manual_seed(0)
    toy, x = Toy(), torch.randn(3, 2)
    expected = toy.lin(x).detach()
    torch._dynamo.reset()
    with bcrecord.patch_method(toy, "forward", ["y"], name="toy"):
        compiled = torch.compile(toy, backend="eager")
        for recording in (True, False):  # the warm-ups
            with bcrecord.recording() if recording else contextlib.nullcontext():
                compiled(x)
        torch._dynamo.utils.counters.clear()
        for _ in range(4):
            with bcrecord.recording() as rec:
                compiled(x)
            compiled(x)
            assert torch.allclose(rec["toy:forward:y@0"], expected)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0


def test_where_dynamo_has_only_reset_an_extractor_of_a_compiled_model_recompiles_once(monkeypatch):
    # Older torch has no reset_code_caches: where the graphs holding the code cannot be told,
    # reset() drops them all, and clears the counters with them. That clear is bcrecord's own:
    # taken for someone else's (as a clear is since counters.clear() is noticed), every call
    # would reset Dynamo and compile again.
    import bcrecord.torch as bt
    from bcrecord.torch import create_feature_extractor

    caches, reset, resets = torch._dynamo.reset_code_caches, torch._dynamo.reset, []

    def reset_all():  # (reset itself calls reset_code_caches)
        resets.append(1)
        torch._dynamo.reset_code_caches = caches
        try:
            reset()
            torch._dynamo.utils.counters.clear()  # (as older torch's reset does)
        finally:
            torch._dynamo.reset_code_caches = None

    monkeypatch.setattr(torch._dynamo, "reset_code_caches", None)
    monkeypatch.setattr(torch._dynamo, "reset", reset_all)
    monkeypatch.setattr(bt, "_drop_graphs_holding", lambda function: False)
    torch.manual_seed(0)
    net = SmallNet().eval()
    reset_all()
    resets.clear()
    compiled = torch.compile(net, backend="eager", dynamic=False)
    x = torch.randn(2, 3, 8, 8)
    compiled(x)  # a graph without the probes
    extractor = create_feature_extractor(compiled, ["bn1"])
    for _ in range(4):
        assert torch.allclose(extractor(x)["bn1"], reference_smallnet(net, x)["bn1"], atol=1e-5)
    assert len(resets) == 1
    extractor.close()


class _Unrelated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x).relu()


@pytest.mark.parametrize("inline_flag", [None, False])
def test_recording_another_model_leaves_a_compiled_model_s_graphs_alone(inline_flag, monkeypatch):
    # inline_inbuilt_nn_modules=False, a flag torch deprecated (always on, whatever it says), made
    # every swap drop every compiled graph: the other model recompiled at each extractor call.
    from bcrecord.torch import create_feature_extractor

    config = torch._dynamo.config
    entry = getattr(config, "_config", {}).get("inline_inbuilt_nn_modules")
    if inline_flag is not None:
        if entry is None or not getattr(entry, "deprecated", False):
            pytest.skip("a torch that honours inline_inbuilt_nn_modules")
        with warnings.catch_warnings():  # (torch's FutureWarning, said once a process)
            warnings.simplefilter("ignore")
            monkeypatch.setattr(config, "inline_inbuilt_nn_modules", inline_flag)
    torch.manual_seed(0)
    net = SmallNet().eval()
    torch._dynamo.reset()
    other = torch.compile(_Unrelated(), backend="eager")
    extractor = create_feature_extractor(net, ["bn1"])
    stats = torch._dynamo.utils.counters["stats"]
    x, y = torch.randn(1, 3, 8, 8), torch.randn(2, 3)
    other(y)
    graphs = stats["unique_graphs"]
    for _ in range(4):  # each extractor call swaps the probes in and out of SmallNet's code
        other(y)
        expected = reference_smallnet(net, x)["bn1"]
        assert torch.allclose(extractor(x)["bn1"], expected, atol=1e-5)
        with record(net, ["bn1"]) as rec:
            net(x)
        assert torch.allclose(rec["bn1:forward:return"], expected, atol=1e-5)
    assert stats["unique_graphs"] == graphs  # the other model compiled once
    extractor.close()


def test_recordings_that_ended_leave_other_compiled_models_graphs_alone():
    # The classes on the way to a recorded module stayed noted for good, as classes a graph
    # running its method may be guarded on: every later extractor call (of any model with
    # that module class) dropped the graphs of compiled models of those classes (here one
    # that once held a BatchNorm), and a plain nn.Module on the way stood for every
    # subclass: every compiled model's, also while it was recorded (3 recompiles here).
    from bcrecord.torch import create_feature_extractor

    torch.manual_seed(0)
    box = torch.nn.Module()
    box.seq = torch.nn.Sequential(torch.nn.BatchNorm2d(3).eval())
    once = _Unrelated()
    once.bn = torch.nn.BatchNorm2d(3).eval()
    for model, target in [(box, "seq.0"), (once, "bn")]:
        with record(model, [target]):
            pass
    torch._dynamo.reset()
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)).eval()
    other = torch.compile(_Unrelated(), backend="eager")
    extractor = create_feature_extractor(net, ["1"])
    stats = torch._dynamo.utils.counters["stats"]
    x, y = torch.randn(1, 3, 4, 4), torch.randn(2, 3)
    expected = other(y)
    graphs = stats["unique_graphs"]
    for _ in range(4):
        assert torch.equal(other(y), expected)
        assert torch.allclose(extractor(x)["1"], net(x), atol=1e-6)
    assert stats["unique_graphs"] == graphs  # the other model compiled once
    extractor.close()


class _Doubled(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2) + 1


def _assigned_forward(self, x):
    h = x - 1
    return h


class _Assigned(torch.nn.Module):
    pass


_Assigned.forward = _assigned_forward  # (its qualified name names no class)


class _Holder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fx = torch.fx.symbolic_trace(_Doubled())  # a generated forward, named 'forward'
        self.assigned = _Assigned()

    def forward(self, x):
        return self.assigned(self.fx(x)) * 3


def test_a_model_compiled_before_recording_records_methods_whose_names_name_no_class():
    torch._dynamo.reset()
    net = _Holder()
    compiled = torch.compile(net, backend="eager")
    x = torch.ones(2)
    compiled(x)  # compiled before the recording: its graph inlined the methods without probes
    with record(net, ["fx", "assigned:forward:h"]) as rec:
        assert torch.equal(compiled(x), torch.full((2,), 6.0))
    assert torch.equal(rec["fx:forward:return"], torch.full((2,), 3.0))
    assert torch.equal(rec["assigned:forward:h@0"], torch.full((2,), 2.0))


class _Sine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        z = self.lin(x)
        return torch.sin(z)


class _Looped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Sine() for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:  # Dynamo's guards name the list's type, not its items'
            x = layer(x)
        return x


def test_modules_reached_by_looping_over_a_container_record_in_a_model_compiled_before():
    from bcrecord.torch import create_feature_extractor

    for model, path in [(_Looped(), "layers.1"), (torch.nn.Sequential(_Sine(), _Sine(), _Sine()), "1")]:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend="eager")
        x = torch.randn(2, 4)
        compiled(x)  # compiled before the recording: its graph inlined the layers without probes
        with torch.no_grad():
            z = model.get_submodule(path).lin(model.get_submodule(path[:-1] + "0")(x))
        with record(compiled, [path, f"{path}:forward:z@0"]) as rec:
            compiled(x)
        assert torch.allclose(rec[f"{path}:forward:z@0"], z, atol=1e-6)
        assert torch.allclose(rec[f"{path}:forward:return"], torch.sin(z), atol=1e-6)
        extractor = create_feature_extractor(compiled, [path])
        assert torch.allclose(extractor(x)[path], torch.sin(z), atol=1e-6)
        extractor.close()


def test_a_compiled_extractor_makes_its_recordings_without_a_dynamo_warning(monkeypatch):
    # Dynamo traced the making of the extractor's recording at its first call and warned
    # "Dynamo does not know how to trace the builtin `_thread.allocate_lock`".
    import warnings

    from bcrecord.torch import create_feature_extractor

    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set())  # (it warns once a process)
    torch.manual_seed(0)
    net = SmallNet().eval()
    torch._dynamo.reset()
    extractor = create_feature_extractor(net, ["bn1", ":forward:x@4"])
    compiled = torch.compile(extractor, backend="eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in [1, 2]:
            x = torch.randn(batch, 3, 8, 8)
            features, expected = compiled(x), reference_smallnet(net, x)
            assert torch.allclose(features["bn1"], expected["bn1"], atol=1e-5)
            assert torch.allclose(features[":forward:x@4"], expected["pooled"], atol=1e-5)
    assert [str(w.message)[:80] for w in caught] == []
    extractor.close()


def test_fullgraph_compile_or_strict_export_of_an_extractor_says_why_it_cannot():
    # Dynamo's error said "reason: None" at the first call and, once the extractor had
    # run, "Dynamo does not know how to enter a `lock` context manager".
    from bcrecord.torch import create_feature_extractor

    net = SmallNet().eval()
    x = torch.randn(1, 3, 8, 8)
    extractor = create_feature_extractor(net, ["bn1"])
    for attempt in ["first call", "after an eager call"]:
        torch._dynamo.reset()
        with pytest.raises(torch._dynamo.exc.Unsupported) as raised:
            torch.compile(extractor, backend="eager", fullgraph=True)(x)
        assert "reason: a bcrecord feature extractor records outside the graph" in str(raised.value), attempt
        with pytest.raises(torch._dynamo.exc.Unsupported) as raised:
            torch.export.export(extractor, (x,), strict=True)
        assert "export it with strict=False" in str(raised.value), attempt
        assert torch.allclose(extractor(x)["bn1"], reference_smallnet(net, x)["bn1"], atol=1e-5)
    torch._dynamo.reset()
    features = torch.compile(extractor, backend="eager")(x)  # without fullgraph: compiles, records
    assert torch.allclose(features["bn1"], reference_smallnet(net, x)["bn1"], atol=1e-5)
    extractor.close()


def test_a_record_block_inside_a_compiled_function_records_without_dynamo_warnings(monkeypatch):
    # Dynamo runs a function holding the block eagerly, and compiled the frames its entry
    # called: it warned of `_thread.allocate_lock` and `unicodedata.normalize` there.
    import warnings

    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set())  # (it warns once a process)
    torch.manual_seed(0)
    net = SmallNet().eval()
    torch._dynamo.reset()

    @torch.compile(backend="eager")
    def step(x):
        with record(net, ["bn1", "blocks.1:forward:out@1"]) as rec:
            out = net(x)
        return out, rec

    counters = torch._dynamo.utils.counters
    counters.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            x = torch.randn(2, 3, 8, 8)
            (out, rec), expected = step(x), reference_smallnet(net, x)
            assert torch.allclose(out, expected["fc"], atol=1e-5)
            assert torch.allclose(rec["bn1:forward:return"], expected["bn1"], atol=1e-5)
            assert torch.allclose(rec["blocks.1:forward:out@1"], expected["blocks.1.bn"], atol=1e-5)
    assert [str(w.message)[:80] for w in caught] == []
    # record() itself runs eagerly too: traced, it broke the graph inside reprlib.
    breaks = list(counters["graph_break"])
    assert not any("sq_contains" in reason for reason in breaks), breaks


def test_a_gradient_hook_run_by_a_backward_inside_a_compiled_function_runs_eagerly(monkeypatch):
    # Dynamo compiled the hook's frames: graph breaks inside bcrecord and a warning that it
    # cannot trace copy_context.
    import warnings

    monkeypatch.setattr(torch._dynamo.utils, "warn_once_cache", set())
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()

    @torch.compile(backend="eager")
    def step(x):
        loss = net(x).sum()
        loss.backward()
        return loss

    x = torch.randn(5, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with record(net, ["0:forward:return.grad"]) as rec:
            step(x)
    tanh_grad = 1 - torch.tanh(net[0](x)) ** 2
    assert torch.allclose(rec["0:forward:return.grad"], net[2].weight.detach() * tanh_grad, atol=1e-6)
    assert [str(w.message)[:80] for w in caught] == []
    breaks = counters["graph_break"]
    inside = [reason for reason in breaks if "inference_mode" in reason or "non-Tensor" in reason]
    assert inside == []


def test_a_compiled_model_still_stops_early_its_forward_being_dynamo_s():
    # OptimizedModule's forward is set on its instance (Dynamo's wrapper of the model's): the
    # early stop, which runs whole through a forward set on an instance (accelerate's hooks),
    # took it for such a wrapper, and a compiled model or its extractor ran to the end.
    from bcrecord.torch import FeatureExtractor

    ran = []

    class Tail(torch.nn.Module):
        def forward(self, x):
            ran.append(1)
            return x * 2

    torch._dynamo.reset()
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), Tail())
    compiled = torch.compile(net, backend="eager")
    x = torch.ones(1, 2)
    with record(compiled, ["0"], stop_after_last=True) as rec:
        assert compiled(x) is None
    assert torch.allclose(rec["0:forward:return"], net[0](x)) and ran == []
    extractor = FeatureExtractor(compiled, ["0"])
    assert torch.allclose(extractor(x)["0"], net[0](x)) and ran == []
    extractor.close()
    net[0].forward = torch.compile(net[0].forward, backend="eager")  # one module's, set on it
    with pytest.warns(bcrecord.RecordingWarning, match="Linear at '0' has its own forward attribute"):
        with record(net, ["0"], stop_after_last=True):
            assert net(x) is None
    assert ran == []


def test_an_extractor_of_a_compiled_model_switched_between_train_and_eval_recompiles_no_more():
    # Each mode had its own patches, so each call put in code the other mode's graphs were
    # compiled without: switching modes every call recompiled every call.
    from bcrecord.torch import create_feature_extractor

    torch.manual_seed(0)
    net = SmallNet()
    torch._dynamo.reset()
    extractor = create_feature_extractor(torch.compile(net, backend="eager"), ["bn1", "blocks.1"])
    stats = torch._dynamo.utils.counters["stats"]
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        for mode in (True, False):  # the first round compiles each mode's graphs
            extractor.train(mode)
            extractor(x)
        graphs = stats["unique_graphs"]
        for mode in (True, False, True, False):
            extractor.train(mode)
            features = extractor(x)
            assert net.training is mode
            expected = reference_smallnet(net, x, training=mode)
            assert all(torch.allclose(features[key], expected[key], atol=1e-5) for key in ("bn1", "blocks.1"))
    assert stats["unique_graphs"] == graphs
    extractor.close()
