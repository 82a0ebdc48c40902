"""bcrecord.torch.record: values, policies, modes, threads, copies and cleanup."""

import collections
import contextlib
import copy
import dataclasses
import functools
import gc
import io
import os
import pickle
import re
import signal
import sys
import threading
import warnings
import weakref
from inspect import CO_GENERATOR

import pytest
import torch

import bcrecord
from bcrecord.torch import create_feature_extractor, record
from bcrecord.torch.record import StopForward

from ..code_checks import collect_all
from ..forking import fork_while_held
from ..interrupts import calls_made_from, interrupted
from .models import Block, Branchy, Gated, SmallNet, reference_smallnet
from .test_copies import FakeStream


@pytest.fixture
def net():
    torch.manual_seed(0)
    model = SmallNet().eval()
    return model


def snapshot(model):
    """Everything that must be the same after recording: code, attributes, state."""
    return (
        {name: dict(vars(m)) for name, m in model.named_modules()},
        {k: v.clone() for k, v in model.state_dict().items()},
        {cls: dict(vars(cls)) for cls in {type(m) for m in model.modules()}},
    )


def same(a, b):
    mods_a, state_a, classes_a = a
    mods_b, state_b, classes_b = b
    return (
        mods_a.keys() == mods_b.keys()
        and all(mods_a[k].keys() == mods_b[k].keys() for k in mods_a)
        and all(torch.equal(state_a[k], state_b[k]) for k in state_a)
        and classes_a == classes_b
    )


def test_locals_module_outputs_and_in_place_relu(net):
    x = torch.randn(2, 3, 8, 8)
    expected = reference_smallnet(net, x)
    before = snapshot(net)
    with record(net, [":forward:x", "bn1", "blocks.*:forward:out@1", "blocks.1"]) as rec:
        out = net(x)
    assert same(before, snapshot(net))
    assert torch.allclose(out, expected["fc"], atol=1e-6)
    # bn1's output is recorded before the in-place ReLU changes it
    assert torch.allclose(rec["bn1:forward:return"], expected["bn1"], atol=1e-6)
    assert (rec["bn1:forward:return"] < 0).any()
    assert torch.allclose(rec[":forward:x@1"], expected["bn1"], atol=1e-6)
    assert torch.allclose(rec[":forward:x@0"], expected["stem"], atol=1e-6)
    for i in range(3):
        assert torch.allclose(rec[f"blocks.{i}:forward:out@1"], expected[f"blocks.{i}.bn"], atol=1e-6)
    assert torch.allclose(rec["blocks.1:forward:return"], expected["blocks.1"], atol=1e-6)
    assert rec.keys_of("blocks.*:forward:out@1") == [f"blocks.{i}:forward:out@1" for i in range(3)]
    assert rec.keys_of(":forward:x") == [f":forward:x@{i}" for i in range(6)]
    # recorded values are detached clones
    assert not rec[":forward:x@5"].requires_grad


def test_one_shared_code_object_for_all_instances(net):
    with record(net, "blocks.*:forward:out@2") as rec:
        codes = {type(b).forward.__code__ for b in net.blocks}
        net(torch.randn(1, 3, 4, 4))
    assert len(codes) == 1
    assert len(rec) == 3
    assert type(net.blocks[0]).forward.__code__ is Block.forward.__code__


def test_other_instances_of_the_class_are_not_recorded(net):
    other = SmallNet().eval()
    with record(net, "blocks.0:forward:out@0") as rec:
        other(torch.randn(1, 3, 4, 4))
        assert len(rec) == 0
        net(torch.randn(1, 3, 4, 4))
    assert rec.keys() == ["blocks.0:forward:out@0"]


def test_policies_detach_offload_dtype_reduce_keep(net):
    x = torch.randn(2, 3, 8, 8)
    expected = reference_smallnet(net, x)
    with record(net, ["bn1"], copy="detach") as rec:
        net(x)
    # without a copy the in-place ReLU shows through
    assert (rec["bn1:forward:return"] >= 0).all()
    with record(
        net, ["bn1", "fc"], to="cpu", dtype=torch.float64, reduce={"bn1": lambda t: t.mean(0)}
    ) as rec:
        net(x)
    assert rec["bn1:forward:return"].dtype == torch.float64
    assert rec["bn1:forward:return"].shape == (4, 8, 8)
    assert torch.allclose(rec["bn1:forward:return"], expected["bn1"].mean(0).double(), atol=1e-6)
    assert rec["fc:forward:return"].shape == (2, 5)
    with record(net, "fc", keep="last") as rec:
        for _ in range(5):
            net(x)
    assert len(rec.all("fc:forward:return")) == 1
    with pytest.raises(ValueError, match="unknown copy policy"):
        with record(net, "fc", copy="shallow"):
            pass


def test_a_forward_argument_is_recorded_at_entry(net):
    x = torch.randn(2, 3, 8, 8)
    expected = reference_smallnet(net, x)
    with record(net, ["blocks.1:forward:x", ":forward:x@0"]) as rec:
        net(x)
    assert torch.allclose(rec["blocks.1:forward:x"], expected["blocks.0"], atol=1e-5)
    assert torch.allclose(rec[":forward:x@0"], net.stem(x), atol=1e-5)  # reassigned: its first assignment


def test_reduce_by_target_string_as_given_or_as_expanded(net):
    x = torch.randn(2, 3, 8, 8)
    total = lambda t: t.sum()  # noqa: E731
    with record(net, ["blocks.*"], reduce={"blocks.*": total}) as rec:
        net(x)
    assert [rec[f"blocks.{i}:forward:return"].dim() for i in range(3)] == [0, 0, 0]
    with record(net, ["blocks.*"], reduce={"blocks.1": total}) as rec:
        net(x)
    assert [rec[f"blocks.{i}:forward:return"].dim() for i in range(3)] == [4, 0, 4]
    # The expanded target's entry first (the more specific), None too: it was passed over.
    for reduce, dims in (
        ({"blocks.*": total, "blocks.1": None}, [0, 4, 0]),
        ({"blocks.*": None, "blocks.1": total}, [4, 0, 4]),
    ):
        with record(net, ["blocks.*"], reduce=reduce) as rec:
            net(x)
        assert [rec[f"blocks.{i}:forward:return"].dim() for i in range(3)] == dims
    before = snapshot(net)
    with pytest.raises(ValueError, match=r"reduce names targets that are not recorded: \['bn_1'\]"):
        with record(net, ["bn1"], reduce={"bn_1": total}):
            pass
    # Keyed by a recording's key: what it takes, the glob's matches too (it named the glob alone).
    with pytest.raises(bcrecord.SpecError) as caught:
        with record(net, ["blocks.*"], reduce={"blocks.0:forward:return": total}):
            pass
    assert str(caught.value) == (
        "reduce names targets that are not recorded: ['blocks.0:forward:return']; it takes: "
        "'blocks.*', 'blocks.0', 'blocks.1', 'blocks.2'"
    )
    with pytest.raises(bcrecord.TargetError) as caught:
        with record(
            net, ["blocks.0:forward:out", "blocks.0:forward:out@1"], reduce={"blocks.0:forward:out": total}
        ):
            pass
    # (No gradient here: the reason a gradient's reduce must be its value's was said too.)
    assert str(caught.value) == (
        "'blocks.0:forward:out@1' is asked for by 'blocks.0:forward:out' and by 'blocks.0:forward:out@1' "
        "with different reduce functions; give both the same, or ask for it once"
    )
    with pytest.raises(TypeError, match=r"reduce\['bn1'\] must be a callable, got 'mean'"):
        with record(net, ["bn1"], reduce={"bn1": "mean"}):  # would record nothing, one error a value
            pass
    with record(net, ["bn1", "blocks.0"], reduce={"bn1": total, "blocks.0": None}) as rec:  # None: as is
        net(x)
    assert rec["bn1:forward:return"].dim() == 0 and rec["blocks.0:forward:return"].dim() == 4
    assert same(before, snapshot(net))


def test_overlapping_targets_record_each_value_once(net):
    net.train()
    x = torch.randn(2, 3, 8, 8)
    targets = ["blocks.0:forward:out@1", "blocks.0:forward:out", "blocks.*:forward:out@1.grad"]
    with record(net, targets) as rec:
        net(x).sum().backward()
    assert len(rec.all("blocks.0:forward:out@1")) == 1 and len(rec.all("blocks.0:forward:out@1.grad")) == 1
    assert len(rec.all("blocks.2:forward:out@1.grad")) == 1 and len(rec.all("blocks.0:forward:out@0")) == 1


def test_every_read_waits_for_copies_still_in_flight(net):
    x = torch.randn(2, 3, 8, 8)
    with record(net, ["bn1", "fc"], to="cpu") as rec:
        net(x)
        (policy,) = rec._policies
        reads = [
            lambda: rec["fc:forward:return"],
            lambda: rec.all("bn1:forward:return"),
            lambda: rec.get("fc:forward:return"),
            lambda: rec.items(),
            lambda: rec.values_of("bn1"),
        ]
        for read in reads:
            stream = FakeStream()  # what a non-blocking copy from a GPU leaves behind
            policy._pending.add(stream)
            read()
            assert stream.waits == 1 and not policy._pending


def test_gradients_get_the_value_options(net):
    net.train()
    x = torch.randn(2, 3, 8, 8)
    with record(net, ["fc:forward:return.grad"], dtype=torch.float64, reduce=lambda t: t.sum(0)) as rec:
        out = net(x)
        out.pow(2).sum().backward()
    grad = rec["fc:forward:return.grad"]
    # d(sum out^2)/d out = 2 * out, reduced over the batch like the value itself
    assert grad.dtype == torch.float64 and grad.shape == (5,) and not grad.requires_grad
    assert torch.allclose(grad, (2 * out.detach()).sum(0).double(), atol=1e-6)
    assert torch.allclose(rec["fc:forward:return"], out.detach().sum(0).double(), atol=1e-6)
    # Without grad=True the value stays out of the graph (it would keep the graph alive).
    assert not rec["fc:forward:return"].requires_grad


def test_grad_keeps_values_in_the_graph_and_records_gradients(net):
    net.train()
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with record(net, ["blocks.2:forward:out@2.grad", "fc"], grad=True) as rec:
        loss = net(x).pow(2).sum()
        assert rec["fc:forward:return"].requires_grad
        # backprop through a recorded value
        (g,) = torch.autograd.grad(rec["fc:forward:return"].sum(), x, retain_graph=True)
        assert g.shape == x.shape
        loss.backward()
    grad = rec["blocks.2:forward:out@2.grad"]
    assert grad.shape == rec["blocks.2:forward:out@2"].shape and grad.abs().sum() > 0
    assert rec.keys_of("blocks.2:forward:out@2.grad") == [
        "blocks.2:forward:out@2",
        "blocks.2:forward:out@2.grad",
    ]


def test_train_eval_no_grad_and_inference_mode(net):
    x = torch.randn(2, 3, 8, 8)
    for mode in ("train", "eval"):
        getattr(net, mode)()
        for ctx in (torch.no_grad, torch.inference_mode, torch.enable_grad):
            with ctx(), record(net, ["bn1", "blocks.0:forward:identity@0"]) as rec:
                out = net(x)
            assert rec["bn1:forward:return"].shape == (2, 4, 8, 8)
            assert torch.equal(rec["blocks.0:forward:identity@0"], rec["blocks.0:forward:identity@0"])
            assert out.shape == (2, 5)


def test_early_stop_skips_the_rest_and_leaves_the_model_clean(net):
    calls = []
    hook = net.fc.register_forward_hook(lambda *a: calls.append("fc"))
    before = snapshot(net)
    with record(net, ["blocks.0"], stop_after_last=True) as rec:
        assert net(torch.randn(1, 3, 8, 8)) is None
        assert net(torch.randn(1, 3, 8, 8)) is None
    hook.remove()
    assert calls == [] and len(rec.all("blocks.0:forward:return")) == 2
    assert same(before, snapshot(net))
    assert net(torch.randn(1, 3, 8, 8)).shape == (1, 5)
    assert issubclass(StopForward, BaseException) and not issubclass(StopForward, Exception)


def test_early_stop_in_two_threads_shares_the_root_and_leaves_it_clean(net):
    entered, second_in, first_left = threading.Event(), threading.Event(), threading.Event()
    results = {}

    # Gates, not a sleep: a loaded machine could run the second call before the first thread left.
    # (Long timeouts: they only keep a broken gate from hanging the run.)
    def first():
        with record(net, ["bn1"], stop_after_last=True) as rec:
            entered.set()
            second_in.wait(60)
            results["first"] = net(torch.randn(1, 3, 8, 8))
        first_left.set()
        results["first keys"] = rec.keys()

    def second():
        entered.wait(60)
        with record(net, ["blocks.1"], stop_after_last=True) as rec:
            second_in.set()
            results["first left"] = first_left.wait(60)  # the first thread leaves meanwhile
            results["second"] = net(torch.randn(1, 3, 8, 8))
        results["second keys"] = rec.keys()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results["first left"] and results["first"] is None and results["second"] is None
    assert results["first keys"] == ["bn1:forward:return"]
    assert results["second keys"] == ["blocks.1:forward:return"]
    assert "forward" not in net.__dict__ and net(torch.randn(1, 3, 8, 8)).shape == (1, 5)


def test_early_stop_copies_and_saves_the_model_it_runs_on(net):
    x = torch.randn(1, 3, 8, 8)
    with record(net, ["blocks.0"], stop_after_last=True):
        twin = copy.deepcopy(net)
        buffer = io.BytesIO()
        with pytest.warns(bcrecord.RecordingWarning, match="saved while it is recorded"):
            torch.save(net, buffer)
    assert "forward" not in net.__dict__
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    assert torch.equal(twin(x), torch.zeros(1, 5))  # the copy runs its own weights
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.allclose(loaded(x), net(x))


def test_the_stop_reaches_neither_other_threads_nor_a_submodule_called_alone(net):
    from bcrecord.torch import create_feature_extractor

    extractor = create_feature_extractor(net, ["bn1"])
    done, caught = threading.Event(), []

    def serve():  # plain inference in another thread, recording nothing
        while not done.is_set():
            try:
                with torch.no_grad():
                    net(torch.randn(1, 3, 8, 8))
            except BaseException as error:
                caught.append(error)

    worker = threading.Thread(target=serve)
    worker.start()
    try:
        for _ in range(50):
            extractor(torch.randn(1, 3, 8, 8))
    finally:
        done.set()
        worker.join()
    assert caught == []
    with record(net, ["blocks.0.conv"], stop_after_last=True) as rec:
        out = net.blocks[0](torch.randn(1, 4, 8, 8))  # not through the root: runs to the end
    assert out.shape == (1, 4, 8, 8) and len(rec.all("blocks.0.conv:forward:return")) == 1


def test_the_stop_ends_forwards_of_the_context_that_entered_it_an_asyncio_task_it_started_too(net):
    # The README said "only the thread that entered a recording": the rule is the context.
    # A task of the same thread started before the block runs its forward whole (its values
    # reach the threads='all' recording); a task the block starts, and a function it carries
    # into a thread, are stopped as the block is.
    import asyncio

    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        whole = net(x)

    async def main():
        entered, ran = asyncio.Event(), asyncio.Event()

        async def serve():  # started before the block: a context without it
            await entered.wait()
            with torch.no_grad():
                out = net(x)
            ran.set()
            return out

        served = asyncio.ensure_future(serve())
        with torch.no_grad(), record(net, ["bn1"], stop_after_last=True) as rec:
            entered.set()
            await ran.wait()

            async def inside():
                with torch.no_grad():
                    return net(x)

            started_inside = await asyncio.ensure_future(inside())
            carried = await asyncio.get_running_loop().run_in_executor(None, bcrecord.carry(lambda: net(x)))
            own = net(x)
        return await served, started_inside, carried, own, rec

    served, started_inside, carried, own, rec = asyncio.run(main())
    assert torch.equal(served, whole)
    assert started_inside is None and carried is None and own is None
    assert len(rec.all("bn1:forward:return")) == 4


def test_a_targeted_module_replaced_while_recording_is_named_in_a_warning(net):
    # It used to go silently: the new module, never marked, records nothing.
    x = torch.randn(1, 3, 8, 8)
    with pytest.warns(bcrecord.RecordingWarning, match=r"the module at 'fc' was replaced or removed"):
        with record(net, ["fc", "bn1", "blocks.0"]) as rec:
            net(x)
            net.fc = torch.nn.Linear(4, 5)
            net(x)
    assert [len(rec.all(key)) for key in rec.keys()] == [2, 2, 1]  # bn1, blocks.0, then fc once
    assert len(rec.all("fc:forward:return")) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.RecordingWarning)
        with record(net, ["fc", "blocks.0"]) as rec:  # nothing replaced: no warning
            net.fc.weight.data.zero_()
            net(x)
    assert torch.equal(rec["fc:forward:return"], net.fc.bias.detach().expand(1, 5))


def test_a_deep_copy_of_a_targeted_module_put_at_its_path_records_there_and_is_not_warned_of():
    # It records as its module does (marked with it), yet the warning said it recorded nothing.
    import copy

    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    x = torch.ones(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.RecordingWarning)
        with record(net, ["0"]) as rec:
            net[0] = copy.deepcopy(net[0])
            with torch.no_grad():
                net[0].bias.add_(1)
            net(x)
    assert len(rec.all("0:forward:return")) == 1 and torch.equal(rec["0:forward:return"], net[0](x))


def test_a_module_replaced_by_one_holding_its_deep_copy_is_warned_of_as_recording_on():
    # fuse_modules copies the conv into the ConvReLU2d it puts at 'conv': the copy records under
    # 'conv' (a conv folded with its batch norm), yet the warning said nothing ran there recorded.
    from torch.ao.quantization import fuse_modules

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        collections.OrderedDict(
            conv=torch.nn.Conv2d(3, 4, 3), bn=torch.nn.BatchNorm2d(4), relu=torch.nn.ReLU()
        )
    ).eval()
    model.bn.running_mean.uniform_(-1, 1)
    x = torch.randn(1, 3, 8, 8)
    with torch.no_grad():
        conv, fused = model.conv(x), model.bn(model.conv(x))
    with pytest.warns(bcrecord.RecordingWarning) as warned:
        with torch.no_grad(), record(model, ["conv"]) as rec:
            model(x)
            fuse_modules(model, [["conv", "bn", "relu"]], inplace=True)
            model(x)
    [message] = [str(w.message) for w in warned if w.category is bcrecord.RecordingWarning]
    assert message.startswith(
        "the module at 'conv' was replaced while recording by one holding a copy of it made meanwhile "
        "(copy.deepcopy: fuse_modules makes one), at 'conv.0': marked as the module, the copy records "
        "under 'conv'"
    )
    first, second = rec.all("conv:forward:return")
    assert torch.equal(first, conv) and torch.allclose(second, fused, atol=1e-5)


def test_each_record_finds_the_modules_at_its_paths_as_they_are_when_it_starts():
    # record() looks each path up once for all the targets naming it: a module put at a path
    # since an earlier record() is the one the next finds.
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Sequential(torch.nn.Tanh()))
    x = torch.tensor([-1.0, 2.0])
    targets = ["1.0", "1.0:forward:input", "1.*", "*"]
    with record(model, targets) as rec:
        model(x)
    model[0] = torch.nn.Identity()
    model[1][0] = torch.nn.Sigmoid()
    with record(model, targets) as again:
        model(x)
    assert rec.keys_of("1.*") == again.keys_of("1.*") == ["1.0:forward:return"]
    assert torch.equal(rec["1.0:forward:input"], torch.tensor([0.0, 2.0]))
    assert torch.equal(rec["1.0:forward:return"], torch.tanh(torch.tensor([0.0, 2.0])))
    assert torch.equal(again["1.0:forward:input"], x)
    assert torch.equal(again["1.0:forward:return"], torch.sigmoid(x))
    assert torch.equal(again["0:forward:return"], x)


def test_glob_targets_sharing_a_pattern_each_match_the_modules_there_when_record_starts():
    # record() matches each glob once for all the targets that hold it: each has every match,
    # and a module added since an earlier record() is matched by the next.
    model = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh())
    x = torch.tensor([-1.0, 2.0])
    targets = ["*", "*:forward:input"]
    with record(model, targets) as rec:
        model(x)
    model.append(torch.nn.Sigmoid())
    with record(model, targets) as again:
        model(x)
    assert rec.keys_of("*") == ["0:forward:return", "1:forward:return"]
    assert again.keys_of("*") == ["0:forward:return", "1:forward:return", "2:forward:return"]
    assert again.keys_of("*:forward:input") == ["0:forward:input", "1:forward:input", "2:forward:input"]
    assert torch.equal(again["2:forward:input"], torch.tanh(torch.tensor([0.0, 2.0])))
    assert torch.equal(again["2:forward:return"], torch.sigmoid(torch.tanh(torch.tensor([0.0, 2.0]))))


def test_a_module_taken_out_of_the_model_while_recording_is_freed_then_and_nothing_is_said():
    # The block keeps the modules it found as it started, to tell at its end whether any
    # was added: weakly, so that one taken out meanwhile (and its tensors) goes at once.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    x = torch.ones(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.RecordingWarning)
        with torch.no_grad(), record(model, ["*"]) as rec:
            gone = weakref.ref(model[1][0])
            del model[1][0]  # not a target: nothing to say of it
            gc.collect()
            assert gone() is None
            model(x)
    assert torch.equal(rec["1:forward:return"], model[0](x))


def test_a_module_a_glob_target_matches_added_while_recording_is_named_in_a_warning(net):
    # It used to go silently: added after the targets were resolved, it was never marked.
    x = torch.randn(1, 3, 8, 8)
    with pytest.warns(bcrecord.RecordingWarning) as caught:
        with record(net, ["blocks.*:forward:out@0", "blocks.*", "fc"]) as rec:
            net(x)
            net.blocks.append(Block(4))
            net.blocks.append(Block(4))
            net(x)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and said[0].startswith(
        "the modules at 'blocks.3' (matching 'blocks.*:forward:out@0'), 'blocks.4' (matching "
        "'blocks.*:forward:out@0') were added while recording: they recorded nothing"
    )
    assert sorted({key.split(":")[0] for key in rec.keys()}) == ["blocks.0", "blocks.1", "blocks.2", "fc"]
    assert len(rec.all("blocks.2:forward:return")) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.RecordingWarning)
        with record(net, ["blocks.*", "fc"]) as rec:  # added before the block: recorded, no warning
            net.extra = torch.nn.Linear(1, 1)  # matched by no target: no warning either
            net(x)
    assert torch.allclose(rec["blocks.4:forward:return"].mean((2, 3)) @ net.fc.weight.T + net.fc.bias, net(x))
    with pytest.warns(bcrecord.RecordingWarning) as caught:
        with torch.no_grad(), record(net, ["blocks.*"]) as rec:
            net.blocks.insert(0, Block(4))  # moves the others on: they record at their old paths
            net(x)
    with torch.no_grad():
        last = net.blocks(net.relu(net.bn1(net.stem(x))))  # the output of the last block, 'blocks.5'
    assert torch.allclose(rec["blocks.4:forward:return"], last) and len(rec.keys()) == 5
    said = [str(w.message) for w in caught]  # one warning: the moved ones are not said to be added
    assert len(said) == 1 and said[0].startswith("the modules at 'blocks.0', 'blocks.1', 'blocks.2', ")
    assert "'blocks.4' were replaced or removed" in said[0]
    assert said[0].endswith(
        "the ones moved still record under their old paths ('blocks.0' is now at 'blocks.1', 'blocks.1' "
        "is now at 'blocks.2', 'blocks.2' is now at 'blocks.3', 'blocks.3' is now at 'blocks.4', "
        "'blocks.4' is now at 'blocks.5')"
    )


def test_a_module_s_output_is_what_its_forward_returns_before_hooks_its_argument_after_pre_hooks():
    # As documented in bcrecord.torch.targets: hooks run outside forward, in Module.__call__.
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), torch.ones(1, 2)
    model[0].register_forward_pre_hook(lambda module, args: (args[0] * 10,))
    model[0].register_forward_hook(lambda module, args, out: out + 100)
    with record(model, ["0", "0:forward:input", "1:forward:input"]) as rec:
        model(x)
    assert torch.equal(rec["0:forward:input"], x * 10)  # after the pre-hook
    assert torch.allclose(rec["0:forward:return"], model[0].forward(x * 10))  # before the hook
    assert torch.allclose(rec["1:forward:input"], model[0].forward(x * 10) + 100)  # what the caller got


class _NoGradForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    @torch.no_grad()  # a decorated forward: its targets are in the function it wraps
    def forward(self, x):
        h = self.fc(x)
        return h * 2


class _InferenceForward(_NoGradForward):
    @torch.inference_mode()
    def forward(self, x):
        h = self.fc(x)
        return h * 2


def test_values_are_what_the_forward_computes_across_dtypes_autocast_and_decorated_forwards():
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), torch.randn(1, 2)
    with record(model, ["0", "0:forward:self.weight"]) as rec:
        model(x)
        model.to(torch.float64)  # mid-block: the same modules, recorded on
        model(x.double())
        model.half()
        model(x.half())
    assert [v.dtype for v in rec.all("0:forward:return")] == [torch.float32, torch.float64, torch.float16]
    assert torch.equal(rec.all("0:forward:self.weight")[2], model[0].weight.detach())
    model.float()
    with torch.autocast("cpu", dtype=torch.bfloat16), record(model, ["0"]) as rec:
        out = model(x)
    assert rec["0:forward:return"].dtype == torch.bfloat16 and torch.equal(
        rec["0:forward:return"].relu(), out
    )
    params = {name: torch.ones_like(p) for name, p in model.named_parameters()}
    with record(model, ["0", "0:forward:self.weight"]) as rec:
        torch.func.functional_call(model, params, (x,))
    assert torch.equal(rec["0:forward:self.weight"], torch.ones(2, 2))  # the parameters it was given
    assert torch.allclose(rec["0:forward:return"], (x.sum() + 1).expand(1, 2))
    for kind in (_NoGradForward, _InferenceForward):
        decorated = kind()
        with record(decorated, [":forward:h", ""], grad=True) as rec:
            out = decorated(x)
        assert torch.equal(rec[":forward:h@0"] * 2, out) and torch.equal(rec[":forward:return"], out)
        assert not rec[":forward:h@0"].requires_grad


def test_bad_targets_give_clear_errors_and_change_nothing(net):
    before = snapshot(net)
    for target, error, message in [
        ("blokcs.0", bcrecord.TargetError, "did you mean 'blocks.0'"),
        ("_blocks.0", bcrecord.TargetError, "did you mean 'blocks.0'"),
        ("blocks.0:forward:nope", bcrecord.TargetError, "assigned locals: identity, out"),
        ("blocks.0:forward:out@9", bcrecord.TargetError, "there is no index 9"),
        ("blocks.0:nomethod:x", bcrecord.NotPatchableError, "no method 'nomethod'"),
        ("blocks.0:forwrd:x", bcrecord.NotPatchableError, "no method 'forwrd'; did you mean 'forward'"),
        ("a:b", bcrecord.SpecError, "expected 'module.path:method:target'"),
        ("zz*", bcrecord.TargetError, "no submodule matches"),
        ("block.*", bcrecord.TargetError, r"'block' names no submodule there; did you mean 'blocks'\?"),
    ]:
        with pytest.raises(error, match=message):
            with record(net, ["bn1", target]):
                pass
        assert same(before, snapshot(net))
    for model, targets, message in [
        (net, 123, "targets must be a string or a list of strings, got int"),
        (net, None, "targets must be a string or a list of strings, got NoneType"),
        (None, "bn1", "expected an nn.Module instance, got NoneType"),
        (type(net), "bn1", r"got the class SmallNet: pass an instance, e.g. SmallNet\(...\)"),
    ]:
        with pytest.raises(TypeError, match=message):
            with record(model, targets):
                pass
        assert same(before, snapshot(net))
    with pytest.raises(bcrecord.SpecError, match="'bn1:forward:return.grad' for the gradient"):
        with record(net, "bn1.grad"):
            pass
    # Iterated, bytes gave their ints: "a target must be a string, got 98".
    for text in (b"bn1", bytearray(b"bn1")):
        with pytest.raises(bcrecord.SpecError, match=r"^targets are text: give a str, not b'bn1'$"):
            with record(net, text):
                pass
        assert same(before, snapshot(net))


def test_a_grad_that_is_no_bool_is_refused_before_anything_is_patched(net):
    # grad='no' was true: every value was kept in the autograd graph.
    before = snapshot(net)
    for grad in ("no", "False", None):
        with pytest.raises(bcrecord.SpecError, match=f"^grad is True or False, got {re.escape(repr(grad))}$"):
            with record(net, ["bn1"], grad=grad):
                pass
        assert same(before, snapshot(net))
    with record(net, ["bn1"], grad=False) as rec:
        net(torch.randn(1, 3, 8, 8, requires_grad=True))
    assert not rec["bn1:forward:return"].requires_grad


def test_a_stop_after_last_that_is_no_bool_is_refused_before_anything_is_patched(net):
    # stop_after_last='no' was true: every forward was cut short after its last target.
    before = snapshot(net)
    for stop in ("no", "False", None, torch.ones(2)):
        with pytest.raises(
            bcrecord.SpecError, match=f"^stop_after_last is True or False, got {re.escape(repr(stop))}$"
        ):
            with record(net, ["bn1"], stop_after_last=stop):
                pass
        assert same(before, snapshot(net))
    with record(net, ["bn1"], stop_after_last=False):
        assert net(torch.randn(1, 3, 8, 8)).shape == (1, 5)  # ran to its end
    # A ModelRecording made directly checks it too (it took None and 'no').
    for stop in ("no", None):
        with pytest.raises(bcrecord.SpecError, match=f"^stop_after_last is True or False, got {stop!r}$"):
            bcrecord.torch.ModelRecording(stop_after_last=stop)


def test_record_as_a_decorator_refuses_what_cannot_be_called_at_once(net):
    # It was refused only where the decorated name was called: "'int' object is not callable".
    with pytest.raises(TypeError, match=r"^record\(\.\.\.\) decorates a function .*, got 5 \(int\)$"):
        record(net, "bn1")(5)

    @record(net, "bn1")
    def run(x):
        return net(x)

    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(run(x), net(x)) and run.__name__ == "run"


def test_two_threads_with_their_own_recordings_get_only_their_own(net):
    results = {}
    barrier = threading.Barrier(2)
    inputs = {0: torch.randn(1, 3, 8, 8), 1: torch.randn(1, 3, 8, 8) * 10}

    def run(tag, target):
        with record(net, [target]) as rec:
            barrier.wait()
            for _ in range(5):
                net(inputs[tag])
        results[tag] = rec

    threads = [
        threading.Thread(target=run, args=(0, "blocks.0")),
        threading.Thread(target=run, args=(1, "blocks.1")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results[0].keys() == ["blocks.0:forward:return"]
    assert results[1].keys() == ["blocks.1:forward:return"]
    expected = {tag: reference_smallnet(net, inputs[tag]) for tag in (0, 1)}
    assert all(
        torch.allclose(v, expected[0]["blocks.0"], atol=1e-5)
        for v in results[0].all("blocks.0:forward:return")
    )
    assert all(
        torch.allclose(v, expected[1]["blocks.1"], atol=1e-4)
        for v in results[1].all("blocks.1:forward:return")
    )
    assert len(results[0].all("blocks.0:forward:return")) == 5


def test_worker_threads_reach_the_recording_like_data_parallel(net):
    # nn.DataParallel runs its replicas in worker threads (parallel_apply), which needs
    # accelerators; the same shape here: replicas made by copying __dict__, run in threads.
    x = torch.randn(1, 4, 8, 8)
    with record(net, ["blocks.0", "blocks.1"]) as rec:  # threads='all', the default
        replicas = [
            net.blocks[0]._replicate_for_data_parallel(),
            net.blocks[1]._replicate_for_data_parallel(),
        ]
        outs = [None, None]

        def work(i):
            outs[i] = replicas[i](x)

        workers = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert torch.equal(rec["blocks.0:forward:return"], outs[0])
    assert torch.equal(rec["blocks.1:forward:return"], outs[1])
    with record(net, ["blocks.0"], threads="context") as rec:  # another thread's values stay out
        worker = threading.Thread(target=net.blocks[0], args=(x,))
        worker.start()
        worker.join()
        out = net.blocks[0](x * 2)
    assert len(rec.all("blocks.0:forward:return")) == 1 and torch.equal(rec["blocks.0:forward:return"], out)


def test_a_module_registered_at_two_paths_is_recorded_through_either_name():
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(2, 2)
            self.b = self.a  # one object, two names

        def forward(self, x):
            return self.b(self.a(x) * 10)

    model, x = Shared(), torch.ones(1, 2)
    # Said: the values of its calls through 'a' are under 'b' too (it used to go unsaid).
    with pytest.warns(bcrecord.RecordingWarning) as caught, torch.no_grad(), record(model, ["b"]) as rec:
        model(x)
    assert [str(w.message) for w in caught] == [
        "'b' is another name of the Linear at 'a' (one object): its probes cannot tell through which "
        "name it is called, so its calls as 'a' are recorded under 'b' too; target 'a' for its every call"
    ]
    first = model.a(x)
    assert [v.tolist() for v in rec.all("b:forward:return")] == [first.tolist(), model.a(first * 10).tolist()]
    with pytest.raises(
        bcrecord.TargetError, match=r"'b' and 'a' are the same Linear object \(registered twice\)"
    ):
        with record(model, ["a", "b"]):
            pass


def test_data_parallel_wrapper_paths_resolve(net):
    wrapped = torch.nn.DataParallel(net)
    with record(wrapped, ["bn1", "module.blocks.0"]) as rec:
        wrapped(torch.randn(1, 3, 8, 8))
    assert sorted(rec.keys()) == ["bn1:forward:return", "module.blocks.0:forward:return"]
    with record(wrapped, ["", ":forward:x@5"]) as rec:  # the root: the model inside
        out = wrapped(torch.randn(1, 3, 8, 8))
    assert torch.equal(rec[":forward:return"], out) and torch.equal(rec[":forward:x@5"], out)


def test_a_module_named_with_and_without_the_wrapper_s_path_is_said_to_be_one(net):
    # 'module.fc' and 'fc' of a DataParallel were "the same Linear object (registered twice)":
    # nothing was registered twice, one path goes through the wrapper.
    wrapped = torch.nn.DataParallel(net)
    through = "reached through the DataParallel's 'module'"
    for targets, said in [
        (["fc", "module.fc:forward:return"], f"'module.fc' is 'fc' {through}"),
        (["module", ":forward:x@1"], f"'module' is '' {through}"),
    ]:
        with pytest.raises(bcrecord.TargetError, match="^" + re.escape(said) + r" \(one \w+ object\); while"):
            with record(wrapped, targets):
                pass
    assert not any("_bcrecord_path" in vars(module) for module in net.modules())


def test_a_compiled_submodule_named_with_and_without_the_wrapper_s_path_is_said_to_be_one():
    # model[1] = torch.compile(model[1]): '1' and '1._orig_mod' were "the same Sequential
    # object (registered twice)": nothing was registered twice, one path goes through
    # torch.compile's wrapper.
    import torch._dynamo

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    model[1] = torch.compile(model[1], backend="eager")
    through = "reached through torch.compile's wrapper's '_orig_mod'"
    for targets, said in [
        (["1", "1._orig_mod"], f"'1._orig_mod' is '1' {through} (one Sequential object)"),
        (["1._orig_mod.0:forward:input", "1.0"], f"'1._orig_mod.0' is '1.0' {through} (one Linear object)"),
    ]:
        with pytest.raises(bcrecord.TargetError, match="^" + re.escape(said) + "; while"):
            with record(model, targets):
                pass
    with torch.no_grad(), record(model, ["1._orig_mod.0"]) as rec:
        out = model(torch.ones(1, 2))
    assert torch.equal(rec["1._orig_mod.0:forward:return"], out)


def test_a_compiled_submodule_named_through_data_parallel_and_torch_compile_s_wrapper_is_said_to_be_one():
    # Under DataParallel, with block 0 compiled in its place, 'module.blocks.0' and
    # 'blocks.0._orig_mod' were "the same Linear object (registered twice)": both are
    # 'blocks.0', reached through the two wrappers.
    import torch._dynamo

    torch._dynamo.reset()
    model = torch.nn.Sequential()
    model.blocks = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    model.blocks[0] = torch.compile(model.blocks[0], backend="eager")
    wrapped = torch.nn.DataParallel(model)
    through = (
        "are 'blocks.0' reached through wrappers (the DataParallel's 'module', torch.compile's "
        "wrapper's '_orig_mod'; one Linear object); while"
    )
    for targets in (["module.blocks.0", "blocks.0._orig_mod"], ["module.blocks.0._orig_mod", "blocks.0"]):
        said = f"{targets[0]!r} and {targets[1]!r} {through}"
        with pytest.raises(bcrecord.TargetError, match="^" + re.escape(said)):
            with record(wrapped, targets):
                pass
    with torch.no_grad(), record(wrapped, ["module.blocks.0"]) as rec:
        out = wrapped(torch.ones(1, 2))
    assert torch.equal(rec["module.blocks.0:forward:return"].relu(), out)


def test_deepcopy_records_the_copy_never_the_original(net):
    x = torch.randn(1, 3, 8, 8)
    with record(net, ["fc"]) as rec:
        twin = copy.deepcopy(net)
        with torch.no_grad():
            twin.fc.bias.add_(100.0)
        twin(x)
        from_twin = rec["fc:forward:return"]
        net(x)
        from_net = rec["fc:forward:return"]
    assert torch.allclose(from_twin, from_net + 100.0, atol=1e-4)
    assert net.state_dict().keys() == twin.state_dict().keys()
    assert not hasattr(net.fc, "_bcrecord_path")
    assert not hasattr(twin.fc, "_bcrecord_path")  # the copy is unmarked with the original
    with record(net, ["fc"]) as again:
        twin(x)  # recorded then, not now
        net(x)
    assert len(again.all("fc:forward:return")) == 1
    with record(twin, ["fc"]) as own:
        twin(x)
    assert torch.allclose(own["fc:forward:return"], from_twin)


def test_a_deep_copy_recorded_meanwhile_by_another_recording_records_for_both(net):
    # The copy held its original's marker; the second recording put its own in its place and
    # took it away when it ended: the first got none of the copy's values from then on.
    x = torch.randn(1, 3, 8, 8)

    def counts(rec):
        return {key: len(rec.all(key)) for key in rec.keys()}

    with record(net, ["fc", "bn1"]) as outer:
        twin = copy.deepcopy(net)
        with record(twin, ["fc"]) as inner:
            twin(x)
        twin(x)
        again = copy.deepcopy(net)  # an extractor's call marks and unmarks the copy each time
        extracted = create_feature_extractor(again, ["fc"], stop_early=False)(x)["fc"]
        again(x)
        assert torch.equal(outer.all("fc:forward:return")[-1], extracted)
        child = copy.deepcopy(net.fc)  # recorded at another path: its own, the root
        with record(child, [""]) as root:
            child(x.flatten(1)[:, : net.fc.in_features])
    assert counts(outer) == {"fc:forward:return": 5, "bn1:forward:return": 4}
    assert counts(inner) == {"fc:forward:return": 1} and counts(root) == {":forward:return": 1}
    assert torch.equal(inner["fc:forward:return"], outer.all("fc:forward:return")[0])
    for module in (net.fc, twin.fc, again.fc, child):
        assert "_bcrecord_path" not in vars(module)


def test_a_recording_pickles_saves_and_copies_as_a_snapshot_inside_its_block_and_after():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    x = torch.ones(1, 2, requires_grad=True)
    with record(model, ["0", "1:forward:input@0.grad"], reduce=lambda t: t * 2) as rec:
        model(x).sum().backward()
        inside = copy.deepcopy(rec)
        model(x)  # after the copy: in the recording, not in the copy
    buffer = io.BytesIO()
    torch.save(rec, buffer)
    buffer.seek(0)
    copies = [pickle.loads(pickle.dumps(rec)), copy.copy(rec), torch.load(buffer, weights_only=False)]
    twice = (model[0](x) * 2).detach()
    assert [len(c.all("0:forward:return")) for c in [inside, *copies]] == [1, 2, 2, 2]
    assert all(torch.equal(c["0:forward:return"], twice) for c in [inside, *copies])
    assert torch.equal(inside["1:forward:input.grad"], (model[0](x) > 0).float() * 2)  # relu's, reduced
    assert [c.keys_of("1:forward:input@0.grad") for c in copies] == [
        ["1:forward:input", "1:forward:input.grad"]
    ] * 3
    for kept in [inside, *copies]:
        with pytest.raises(RuntimeError, match="record\\(\\) block has ended"):
            with kept:
                pass
    assert rec.all("0:forward:return")[0] is not copies[0].all("0:forward:return")[0]


@pytest.mark.parametrize("options", [{"grad": True}, {"copy": "none"}])
def test_a_recording_of_values_in_the_autograd_graph_deep_copies_as_it_pickles(options):
    # copy.deepcopy raised torch's "Only Tensors created explicitly by the user (graph leaves)
    # support the deepcopy protocol": its values are in the graph, which deepcopy refuses.
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    with record(model, ["0", ":forward:input"], **options) as rec:
        out = model(torch.ones(1, 2, requires_grad=True))
        inside = copy.deepcopy(rec)
    after, pickled = copy.deepcopy(rec), pickle.loads(pickle.dumps(rec))
    expected = model[0](torch.ones(1, 2)).detach()
    for kept in (inside, after, pickled):
        value = kept["0:forward:return"]
        assert torch.equal(value.detach(), expected) and value.is_leaf and value.requires_grad
    assert inside["0:forward:return"] is not rec["0:forward:return"]
    assert rec["0:forward:return"].grad_fn is not None  # the recording's own, still in the graph
    assert out.grad_fn is not None


class _Padded:
    """An object holding a tensor, as torchvision's ImageList holds the padded images."""

    def __init__(self, tensors: torch.Tensor, sizes: list) -> None:
        self.tensors = tensors
        self.sizes = sizes


class _Floats(torch.nn.Module):
    def forward(self, x):
        y = [float(i) for i in range(1000)]
        return x * 2, y


def test_a_deep_copy_of_a_recording_looks_into_no_number(monkeypatch):
    # Each of a list's floats was looked up as a possible registered holder: a deep copy of a
    # recording of 100,000 floats took 192 ms where 24 ms copy them. (Nor is one reduced.)
    module = sys.modules["bcrecord.torch.record"]  # (bcrecord.torch.record is the function)
    looked = []
    reduced = module._reduced_parts
    monkeypatch.setattr(module, "_reduced_parts", lambda item: looked.append(item) or reduced(item))
    model = _Floats()
    with record(model, [":forward:y"], copy="none") as rec:
        model(torch.ones(2))
    kept = copy.deepcopy(rec)[":forward:y@0"]
    assert kept == [float(i) for i in range(1000)] and kept is not rec[":forward:y@0"]
    assert looked == []


@pytest.mark.parametrize("options", [{"grad": True}, {"copy": "none"}])
def test_a_registered_holder_of_values_in_the_autograd_graph_deep_copies_as_it_pickles(options):
    # copy.deepcopy raised torch's "Only Tensors created explicitly by the user (graph leaves)
    # support the deepcopy protocol" for an ImageList's tensors: holders were not reached.
    from bcrecord.torch.copies import register_holder

    register_holder(_Padded, lambda padded, copy: _Padded(copy(padded.tensors), copy(padded.sizes)))

    class Pad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 3)

        def forward(self, x):
            return _Padded(self.lin(x), [(1, 3)])

    model = torch.nn.Sequential(Pad())
    with record(model, ["0"], **options) as rec:
        model(torch.ones(1, 2))
    copied, pickled = (
        copy.deepcopy(rec)["0:forward:return"],
        pickle.loads(pickle.dumps(rec))["0:forward:return"],
    )
    expected = model[0].lin(torch.ones(1, 2)).detach()
    for kept in (copied, pickled):
        assert type(kept) is _Padded and kept.sizes == [(1, 3)]
        assert (
            torch.equal(kept.tensors.detach(), expected)
            and kept.tensors.is_leaf
            and kept.tensors.requires_grad
        )
    assert copied is not rec["0:forward:return"] and copied.sizes is not rec["0:forward:return"].sizes
    assert rec["0:forward:return"].tensors.grad_fn is not None  # the recording's own, still in the graph


class _Sized:
    """A registered holder whose rebuild makes its sizes tuples, as torchvision's ImageList's does."""

    rebuilt = 0

    def __init__(self, tensors: torch.Tensor, sizes: list) -> None:
        self.tensors = tensors
        self.sizes = sizes


def _sized(value: _Sized, copy) -> _Sized:
    _Sized.rebuilt += 1
    return _Sized(copy(value.tensors), [tuple(size) for size in value.sizes])


class _TwoSized(torch.nn.Module):
    def __init__(self, grad: bool) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 3)
        self.grad = grad

    def forward(self, x):
        tensors = self.lin(x) if self.grad else self.lin(x).detach()
        sizes = [[1, 3]]
        return _Sized(tensors, sizes), _Sized(tensors, sizes)


@pytest.mark.parametrize("grad", [True, False])
def test_a_deep_copy_of_a_recording_copies_a_registered_holder_as_deepcopy_does(grad):
    # Each registered holder was rebuilt, in the graph or not: its parts were copied apart, not
    # through deepcopy's memo (two ImageLists sharing their image_sizes got one each), and a part
    # the rebuild remakes came out changed (image_sizes' lists made tuples), where pickle keeps both.
    from bcrecord.torch.copies import register_holder

    register_holder(_Sized, _sized)
    model = torch.nn.Sequential(_TwoSized(grad))
    with record(model, ["0"], copy="none") as rec:
        model(torch.ones(1, 2))
    _Sized.rebuilt = 0
    copied, pickled = (
        copy.deepcopy(rec)["0:forward:return"],
        pickle.loads(pickle.dumps(rec))["0:forward:return"],
    )
    for first, second in (copied, pickled):
        assert first.sizes == [[1, 3]] and first.sizes is second.sizes and first.tensors is second.tensors
        assert first.tensors.is_leaf and first.tensors.requires_grad is grad
    assert _Sized.rebuilt == 0
    assert copied[0].sizes is not rec["0:forward:return"][0].sizes


class _Attributes:
    """A program's own object holding a tensor in an attribute."""

    def __init__(self, scores: torch.Tensor) -> None:
        self.scores = scores
        self.names = ["a"]


class _Slots:
    __slots__ = ("scores",)

    def __init__(self, scores: torch.Tensor) -> None:
        self.scores = scores


class _Element:
    """As MMEngine's data elements: its fields in a dict, copied by its own ``__deepcopy__``."""

    def __init__(self, scores: torch.Tensor) -> None:
        self._fields = {"scores": scores}

    @property
    def scores(self) -> torch.Tensor:
        return self._fields["scores"]

    def __deepcopy__(self, memo):
        other = type(self).__new__(type(self))
        other._fields = copy.deepcopy(self._fields, memo)
        return other


class _Returns(torch.nn.Module):
    def __init__(self, wrap):
        super().__init__()
        self.lin = torch.nn.Linear(2, 3)
        self.wrap = wrap

    def forward(self, x):
        return self.wrap(self.lin(x))


@pytest.mark.parametrize("options", [{"grad": True}, {"copy": "none"}])
@pytest.mark.parametrize("holder", [_Attributes, _Slots, _Element])
def test_an_object_holding_values_in_the_autograd_graph_deep_copies_as_it_pickles(options, holder):
    # copy.deepcopy raised torch's "Only Tensors created explicitly by the user (graph leaves)
    # support the deepcopy protocol" for a tensor in an object's attribute, slot or own fields
    # (an MMEngine InstanceData): only containers, dataclasses and registered holders were walked.
    model = torch.nn.Sequential(_Returns(holder))
    with record(model, ["0"], **options) as rec:
        model(torch.ones(1, 2))
    copied, pickled = (
        copy.deepcopy(rec)["0:forward:return"],
        pickle.loads(pickle.dumps(rec))["0:forward:return"],
    )
    expected = model[0].lin(torch.ones(1, 2)).detach()
    for kept in (copied, pickled):
        assert type(kept) is holder and kept is not rec["0:forward:return"]
        assert torch.equal(kept.scores.detach(), expected)
        assert kept.scores.is_leaf and kept.scores.requires_grad
    assert rec["0:forward:return"].scores.grad_fn is not None  # the recording's own, still in the graph


class _OwnCopy:
    """An object that copies itself its own way, and refuses pickle."""

    def __init__(self, n: list) -> None:
        self.n = n

    def __deepcopy__(self, memo):
        return _OwnCopy(self.n + ["copied"])

    def __reduce_ex__(self, protocol):
        raise TypeError("not pickled")


def _hook() -> None:
    pass


class _Spied:
    reduced: list = []

    def __reduce_ex__(self, protocol):
        _Spied.reduced.append(protocol)
        return object.__reduce_ex__(self, protocol)


def test_a_deep_copy_of_a_recording_copies_other_objects_as_deepcopy_does():
    # Next to a value in the autograd graph: an object that refuses __reduce_ex__ is still
    # copied by its own __deepcopy__, and a class and functions are kept as deepcopy keeps them
    # (never reduced: a class's own __reduce_ex__ is no reduction of the class).
    model = torch.nn.Sequential(_Returns(lambda t: (t, _OwnCopy([1]), _Spied, _Returns, len, _hook)))
    with record(model, ["0"], copy="none") as rec:
        model(torch.ones(1, 2))
    kept, own, spied, cls, builtin, function = copy.deepcopy(rec)["0:forward:return"]
    assert kept.is_leaf and kept.requires_grad and own.n == [1, "copied"]
    assert (spied, cls, builtin, function) == (_Spied, _Returns, len, _hook)
    assert _Spied.reduced == []


@pytest.mark.parametrize("copy_policy", ["clone", "none"])
def test_a_deep_copy_of_a_recording_copies_sparse_compressed_and_nested_tensors(copy_policy):
    # torch's deepcopy of them raises ('Cannot access storage of SparseCsrTensorImpl',
    # 'aten::new_empty' for a nested tensor): the recording's deepcopy raised, where pickle worked.
    values = [
        torch.randn(3, 3).to_sparse_csr(),
        torch.randn(4, 4).to_sparse_bsr((2, 2)),
        torch.nested.nested_tensor([torch.randn(2), torch.randn(3)]),
        torch.randn(3, 3).to_sparse(),
    ]
    model = torch.nn.Sequential(_Returns(lambda t: values))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (torch's: nested and sparse are prototypes)
        with record(model, ["0"], copy=copy_policy) as rec:
            model(torch.ones(1, 2))
        copied = copy.deepcopy(rec)["0:forward:return"]
    for twin, value in zip(copied, values, strict=True):
        assert twin is not value and twin.layout == value.layout
        if value.is_nested:
            assert all(torch.equal(a, b) for a, b in zip(twin.unbind(), value.unbind(), strict=True))
        else:
            assert torch.equal(twin.to_dense(), value.to_dense())


class _Tagged(int):
    """A label carrying the score it was picked by, in an attribute."""


def _tagged(scores: torch.Tensor) -> _Tagged:
    label = _Tagged(int(scores.argmax()))
    label.score = scores.max()
    return label


def test_a_deep_copy_of_a_recording_looks_into_a_subclass_of_a_number_as_deepcopy_does():
    # An int subclass's attribute holding a tensor in the autograd graph still raised torch's
    # 'Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol',
    # where pickle worked: the walk kept any int (isinstance), where deepcopy keeps only an int
    # itself (its exact type) and copies a subclass's attributes.
    model = torch.nn.Sequential(_Returns(_tagged))
    with record(model, ["0"], copy="none") as rec:
        model(torch.ones(1, 2))
    copied, pickled = (
        copy.deepcopy(rec)["0:forward:return"],
        pickle.loads(pickle.dumps(rec))["0:forward:return"],
    )
    expected = model[0].lin(torch.ones(1, 2)).max().detach()
    for kept in (copied, pickled):
        assert type(kept) is _Tagged and kept == rec["0:forward:return"]
        assert torch.equal(kept.score.detach(), expected) and kept.score.is_leaf and kept.score.requires_grad


def test_a_deep_copy_of_a_recording_out_of_the_graph_looks_for_no_graph_tensor(monkeypatch):
    # Every object of the values was reduced once more to look for tensors in the autograd graph,
    # also where there were none: a recording of 10,000 objects took 3 times as long to copy.
    # A plain deep copy comes first; what it copied is in the caller's memo (shared stays shared).
    module = sys.modules["bcrecord.torch.record"]
    looked = []
    monkeypatch.setattr(module, "_leaf_copies", lambda value, memo: looked.append(value))
    shared = _Attributes(torch.ones(2))
    model = torch.nn.Sequential(_Returns(lambda t: [shared, _Attributes(t.detach())]))
    with record(model, ["0"], copy="none") as rec:
        model(torch.ones(1, 2))
    copied, outside = copy.deepcopy((rec, shared))
    assert looked == [] and copied["0:forward:return"][0] is outside and outside is not shared
    assert torch.equal(copied["0:forward:return"][1].scores, model[0].lin(torch.ones(1, 2)).detach())


def test_one_module_at_two_paths_of_one_model_is_refused_with_the_reason():
    shared = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
    with pytest.raises(bcrecord.TargetError, match="'2' and '0' are the same Linear object"):
        with record(model, ["0", "2"]):
            pass


def test_a_module_held_by_two_models_records_in_each_under_its_own_path():
    shared = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(shared, torch.nn.ReLU(), shared)
    other = torch.nn.ModuleDict({"a": shared})
    before = snapshot(model)
    x = torch.ones(1, 2)
    with record(model, ["0"]) as outer, record(other, ["a"]) as inner:
        model(x)
    assert len(outer.all("0:forward:return")) == 2  # the module runs twice, one path
    assert torch.equal(inner.all("a:forward:return")[1], shared(shared(x).relu()).detach())
    assert inner.keys() == ["a:forward:return"] and outer.keys() == ["0:forward:return"]
    assert same(before, snapshot(model)) and "_bcrecord_path" not in vars(shared)


def test_the_first_path_may_end_first_the_other_records_on():
    shared = torch.nn.Linear(2, 2)
    model, other = torch.nn.Sequential(shared), torch.nn.ModuleDict({"a": shared})
    first, second = record(model, ["0"]), record(other, ["a"])
    one, two = first.__enter__(), second.__enter__()
    first.__exit__(None, None, None)  # the module's own marker ('0') goes; 'a' takes over
    model(torch.ones(1, 2))
    with record(model, ["0"]) as again:  # and '0' may be recorded again meanwhile
        model(torch.zeros(1, 2))
    second.__exit__(None, None, None)
    model(torch.ones(1, 2))
    assert one.keys() == [] and len(again.all("0:forward:return")) == 1
    assert len(two.all("a:forward:return")) == 2
    assert "_bcrecord_path" not in vars(shared)


class _Distiller(torch.nn.Module):
    """A student trained on a teacher's features: the teacher's extractor is a submodule."""

    def __init__(self, teacher):
        super().__init__()
        self.student = torch.nn.Linear(4, 4)
        self.tfeat = create_feature_extractor(teacher, ["1"])

    def forward(self, x):
        return ((self.student(x) - self.tfeat(x)["1"]) ** 2).mean()


def test_a_model_holding_an_extractor_records_inside_it():
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    distiller, x = _Distiller(teacher), torch.randn(2, 4)
    expected = teacher[1](teacher[0](x)).detach()
    with record(distiller, ["tfeat.model.1", "tfeat.model.0"]) as rec:
        loss = distiller(x)
    assert torch.allclose(rec["tfeat.model.1:forward:return"], expected)
    assert torch.allclose(loss, ((distiller.student(x) - expected) ** 2).mean())  # the extractor's own value
    feats = create_feature_extractor(distiller, ["tfeat.model.1", "student"])(x)
    assert torch.allclose(feats["tfeat.model.1"], expected)
    assert all("_bcrecord_path" not in vars(module) for module in distiller.modules())


def test_saving_while_recording_loads_clean_with_a_warning(net):
    with record(net, ["fc"]):
        buffer = io.BytesIO()
        with pytest.warns(bcrecord.RecordingWarning, match="loads without recording"):
            torch.save(net, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        with bcrecord.recording() as plain:
            loaded(torch.randn(1, 3, 8, 8))
    assert len(plain) == 0
    assert type(loaded.fc.__dict__["_bcrecord_path"]) is str  # a plain str: loads without bcrecord
    with record(loaded, ["fc"]) as again:  # and records like any model; the leftover goes
        loaded(torch.randn(1, 3, 8, 8))
    assert len(again.all("fc:forward:return")) == 1 and "_bcrecord_path" not in loaded.fc.__dict__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pickle.dumps(net)  # after recording: nothing left to warn about


def test_model_that_fx_cannot_trace():
    torch.manual_seed(1)
    model = Gated().eval()
    x = torch.randn(3, 4)
    with pytest.raises(torch.fx.proxy.TraceError, match="control flow"):
        torch.fx.symbolic_trace(model)
    with record(model, [":forward:h", ":forward:out@0", ":forward:out@1", ":forward:steps@0"]) as rec:
        out = model(x)
    h = model.a(x)
    steps = int(h.abs().sum() > 1.0) + 1
    assert rec[":forward:steps@0"] == steps
    assert len(rec.all(":forward:h@1")) == steps
    hs = [h]
    for _ in range(steps):
        hs.append(torch.tanh(hs[-1]))
    assert torch.allclose(rec.all(":forward:h@1")[-1], hs[-1].detach())
    branch = ":forward:out@0" if hs[-1].mean() > 0 else ":forward:out@1"
    assert torch.allclose(rec[branch], out.detach())
    # The other branch's key: planned, read after the block (its probes gone), not a typo.
    other = ({":forward:out@0", ":forward:out@1"} - {branch}).pop()
    with pytest.raises(KeyError, match=f"'{other}': its probe was placed but did not run while recorded"):
        rec[other]
    with pytest.raises(KeyError, match=r"\(did you mean '"):
        rec[":forward:outt@0"]


def test_bound_methods_stored_on_the_instance_are_reached():
    # timm's FasterNet does `self.forward = self.forward_split_cat` in __init__.
    class Mixer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.forward = self.forward_split_cat

        def forward_split_cat(self, x):
            y = x + 1
            return y

    model = torch.nn.Sequential(Mixer())
    with record(model, ["0:forward_split_cat:y@0"]) as rec:
        model(torch.ones(2))
    assert torch.equal(rec["0:forward_split_cat:y@0"], torch.full((2,), 2.0))
    assert "_bcrecord_path" not in vars(model[0])


def test_two_models_of_one_architecture_recorded_at_once_keep_their_own_values():
    # Teacher and student: same classes, same paths; each recording takes only its model's modules.
    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    student = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    x = torch.randn(2, 4)
    with torch.no_grad(), record(teacher, ["0"]) as rt, record(student, ["0"]) as rs:
        teacher(x)
        student(x)
        student(x)
    with torch.no_grad():
        assert [torch.equal(v, teacher[0](x)) for v in rt.all("0:forward:return")] == [True]
        assert [torch.equal(v, student[0](x)) for v in rs.all("0:forward:return")] == [True, True]


def test_a_parameter_s_gradient_is_recorded_once_per_backward_and_leaves_no_hook():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    weight = model[0].weight
    x = torch.randn(4, 3)
    grads = []
    with record(model, ["0:forward:self.weight@0.grad"]) as rec:
        for _ in range(3):
            model.zero_grad()
            model(x).pow(2).sum().backward()
            grads.append(weight.grad.clone())
        model(x)  # a forward with no backward in the block: its hook goes at exit
    assert weight._backward_hooks is None  # as before: the parameter keeps no hook
    model(x).sum().backward()  # later training is not recorded
    recorded = rec.all("0:forward:self.weight@0.grad")
    assert len(recorded) == 3 and all(torch.allclose(r, g) for r, g in zip(recorded, grads, strict=True))


def test_the_hooks_of_fresh_leaves_no_backward_reached_are_let_go_of_while_the_block_runs():
    # An input that requires grad, made anew each step, with no backward: its hook was held
    # until the block ended, one a step (0.7 kB each: 14 MB over 20,000 steps).
    model = torch.nn.Linear(4, 4)
    with record(model, [":forward:input.grad"], keep="last") as rec:
        for _ in range(1000):
            model(torch.randn(2, 4, requires_grad=True))
        held = len(rec._leaf_hooks)
        x = torch.randn(2, 4, requires_grad=True)
        model(x).sum().backward()
    assert held < 2 * 64 and len(rec._leaf_waiting) <= len(rec._leaf_hooks) < 2 * 64
    assert torch.equal(rec[":forward:input.grad"], torch.ones(2, 4) @ model.weight)


@pytest.mark.parametrize(
    "targets, reduce",
    [
        (["1", "1:forward:return.grad"], {"1": "norm"}),
        (["1:forward:return.grad", "1"], {"1": "norm"}),
        (["*", "1:forward:return.grad"], {"*": "norm"}),
    ],
)
def test_a_gradient_target_no_reduce_entry_names_takes_the_reduce_of_its_value(targets, reduce):
    # It was refused as asking for the value with another reduce (None), unless the function
    # was given twice, although a gradient takes its value's reduce.
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh())
    x = torch.randn(2, 3)
    with record(m, targets, reduce={k: torch.linalg.vector_norm for k in reduce}) as rec:
        out = m(x)
        out.sum().backward()
    assert torch.allclose(rec["1:forward:return"], out.detach().norm())
    assert torch.allclose(rec["1:forward:return.grad"], torch.ones(2, 4).norm())
    if "*" not in reduce:  # named for the gradient: its own entry, which must be the value's
        for own in ("1:forward:return.grad", "1:forward:return"):  # (either way: it was dropped)
            with pytest.raises(bcrecord.TargetError, match=r"functions \(a gradient takes its value's\);"):
                with record(m, targets, reduce={"1": torch.linalg.vector_norm, own: None}):
                    pass
    # A glob's: by its expanded .grad key too (it was refused as naming no target).
    norms = {"1:forward:return.grad": torch.linalg.vector_norm}
    with record(m, ["*:forward:return.grad"], reduce=norms) as rec:
        m(x).sum().backward()
    assert rec["1:forward:return.grad"].dim() == 0 and rec["0:forward:return.grad"].dim() == 2


def test_a_recording_around_a_decorated_function_gets_its_values_not_its_gradients():
    # As the README says: a gradient goes to the record() block's own recording alone.
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh())
    x = torch.randn(2, 3)

    @record(net, ["1:forward:return.grad"])
    def step(x):
        out = net(x)
        out.sum().backward()
        return out

    with bcrecord.recording() as outer:
        out = step(x)
    assert outer.keys() == ["1:forward:return"] and torch.equal(outer["1:forward:return"], out.detach())


def test_a_parameter_s_gradient_comes_once_per_backward_not_per_read_nor_from_no_grad_forwards():
    from torch.utils.checkpoint import checkpoint

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.lin(torch.tanh(self.lin(x)))

    class Checkpointed(torch.nn.Module):
        def __init__(self, reentrant):
            super().__init__()
            self.inner, self.reentrant = Twice(), reentrant

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=self.reentrant)

    torch.manual_seed(0)
    x = torch.randn(2, 3, requires_grad=True)
    key = "inner.lin:forward:self.weight.grad"
    for model in (Checkpointed(True), Checkpointed(False)):
        weight = model.inner.lin.weight
        grads = []
        with record(model, [key]) as rec:
            for step in range(2):
                model.zero_grad()
                model(x * (step + 1)).sum().backward()  # lin runs twice, and again in the recompute
                grads.append(weight.grad.clone())
                with torch.no_grad():
                    model(x)  # an evaluation forward: no backward, no gradient
            with torch.inference_mode():
                model(x)
        recorded = rec.all(key)
        assert len(recorded) == 2 and all(torch.allclose(r, g) for r, g in zip(recorded, grads, strict=True))
        assert weight._backward_hooks is None and rec._leaf_waiting == {}  # none kept past its backward


def test_checkpointed_values_come_again_in_a_backward_inside_the_block_and_once_after_it():
    from torch.utils.checkpoint import checkpoint

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            h = self.lin(x)
            h = torch.tanh(h)
            return h * 2

    class Net(torch.nn.Module):
        def __init__(self, reentrant):
            super().__init__()
            self.inner, self.reentrant = Inner(), reentrant

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=self.reentrant).sum()

    torch.manual_seed(0)
    x = torch.randn(2, 3, requires_grad=True)
    targets = ["inner.lin", "inner:forward:h@0", "inner.lin:forward:return.grad"]
    for reentrant in (True, False):
        model = Net(reentrant)
        expected = model.inner.lin(x).detach()
        with record(model, targets, keep="all") as rec:
            model(x).backward()  # recomputes inside the block: the forward's value, then the recompute's
        values = rec.all("inner.lin:forward:return")
        assert len(values) == 2 and all(torch.allclose(value, expected) for value in values)
        assert len(rec.all("inner:forward:h@0")) == 2
        assert len(rec.all("inner.lin:forward:return.grad")) == 1
        with record(model, targets, keep="all") as rec:
            loss = model(x)
        loss.backward()  # after the block: the original code recomputes, the forward's values alone
        assert [len(rec.all(key)) for key in ("inner.lin:forward:return", "inner:forward:h@0")] == [1, 1]
        assert torch.allclose(rec["inner.lin:forward:return"], expected)
        # the non-reentrant kind's forward ran in the graph: its activations' gradients come
        assert ("inner.lin:forward:return.grad" in rec.keys()) is not reentrant


def test_a_reduce_under_activation_checkpointing_leaves_backward_working_after_the_block():
    from torch.utils.checkpoint import checkpoint

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            return torch.tanh(h)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False).sum()

    torch.manual_seed(0)
    model, x = Net(), torch.randn(3, 4)
    expected = torch.autograd.grad(torch.tanh(model.inner.lin(x)).sum(), model.inner.lin.weight)[0]
    for grad in (False, True):
        model.zero_grad()
        with record(model, ["inner:forward:h"], reduce=lambda t: t.norm(), grad=grad) as rec:
            loss = model(x)
        norm = rec["inner:forward:h@0"]
        assert torch.allclose(norm, model.inner.lin(x).norm()) and norm.requires_grad is grad
        if grad:  # the reduced value is in the graph: its gradient is the norm's
            (through,) = torch.autograd.grad(norm, model.inner.lin.weight, retain_graph=True)
            direct = torch.autograd.grad(model.inner.lin(x).norm(), model.inner.lin.weight)[0]
            assert torch.allclose(through, direct)
        loss.backward()  # the recompute runs no probes: the reduce must not have been counted
        assert torch.allclose(model.inner.lin.weight.grad, expected)


@pytest.mark.parametrize("saved", ["mm", "mm and clone"])
def test_selective_activation_checkpointing_never_counts_a_copy_among_the_model_s_ops(saved):
    # A selective checkpoint hands the outputs its policy saved, counted per op in the forward,
    # to the same ops in order when it recomputes. The probes' copies (a clone, a reduce's
    # matmul) were counted: a backward after the block, whose recompute runs no probes, got a
    # copy's output for the model's, silently wrong gradients; a backward inside the block
    # failed its recompute's records ("aten.clone.default encountered during backward...").
    import functools

    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    ops = [torch.ops.aten.mm.default] + ([torch.ops.aten.clone.default] if "clone" in saved else [])
    context = functools.partial(create_selective_checkpoint_contexts, ops)

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1, self.w2 = torch.nn.Parameter(torch.randn(4, 4)), torch.nn.Parameter(torch.randn(4, 4))

        def forward(self, x):
            a = torch.tanh(x @ self.w1)
            b = torch.sin(a).clone()
            return torch.tanh(b @ self.w2) * a

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return checkpoint(self.inner, x, use_reentrant=False, context_fn=context).sum()

    torch.manual_seed(0)
    model, x, projection = Net(), torch.randn(4, 4), torch.randn(4, 4)
    expected = torch.autograd.grad(model(x), [model.inner.w1, model.inner.w2])
    a = torch.tanh(x @ model.inner.w1).detach()
    for options in ({}, {"reduce": lambda t: t @ projection}, {"grad": True}, {"copy": "deepcopy"}):
        with record(model, ["inner:forward:a", "inner:forward:b"], **options) as rec:
            loss = model(x)
        got = torch.autograd.grad(loss, [model.inner.w1, model.inner.w2])  # after the block
        assert all(torch.allclose(g, e) for g, e in zip(got, expected, strict=True)), options
        assert torch.allclose(rec["inner:forward:a@0"], a @ projection if "reduce" in options else a)
        assert not rec.errors, options
        with record(model, ["inner:forward:a"], keep="all", **options) as rec:
            got = torch.autograd.grad(model(x), [model.inner.w1, model.inner.w2])  # inside it: recomputed
        assert all(torch.allclose(g, e) for g, e in zip(got, expected, strict=True)), options
        assert len(rec.all("inner:forward:a@0")) == 2 and not rec.errors, options


def test_a_reduce_in_the_graph_records_inside_torch_func_grad_and_its_kin():
    # With grad=True a reduce ran under saved-tensor hooks of bcrecord's own (out of sight of
    # a checkpoint's), which torch.func.grad, vjp and jacrev refuse: nothing was recorded, the
    # error blamed "saved tensor hooks" the user never set, and an extractor with a reduce
    # (grad=True by default) raised.
    from torch.func import functional_call, grad, jacrev

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x = torch.randn(5, 4)
    params = {name: p.detach() for name, p in model.named_parameters()}
    expected = torch.tanh(model[0](x)).norm().detach()
    for transform in (grad, jacrev):
        with record(model, ["1"], reduce=lambda t: t.norm(), grad=True) as rec:
            transform(lambda p: functional_call(model, p, (x,)).sum())(params)
        assert not rec.errors and torch.allclose(rec["1:forward:return"], expected), transform
    extractor = create_feature_extractor(model, ["1"], reduce=lambda t: t.norm())
    inner = {f"model.{name}": value for name, value in params.items()}
    gradients = grad(lambda p: functional_call(extractor, p, (x,))["1"])(inner)
    direct = grad(lambda p: torch.tanh(functional_call(model[0], p, (x,))).norm())(
        {"weight": params["0.weight"], "bias": params["0.bias"]}
    )
    assert torch.allclose(gradients["model.0.weight"], direct["weight"])


def test_gradients_are_in_the_order_of_their_values_whatever_backward_s_order():
    # One module called twice: backward reaches the second call first.
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            a = self.lin(x)
            b = self.lin(torch.tanh(a))
            return (b * 5).sum() + a.sum()

    torch.manual_seed(0)
    model, x = Twice(), torch.randn(2, 3)
    for keep in ("all", "last"):
        with record(model, ["lin:forward:return.grad"], keep=keep) as rec:
            model(x).backward()
        assert bool((rec["lin:forward:return.grad"] == 5).all())  # the second call's: d/db = 5
    assert len(rec.all("lin:forward:return.grad")) == 1
    with record(model, ["lin:forward:return.grad"]) as rec:
        model(x).backward()
    first, second = rec.all("lin:forward:return.grad")
    assert bool((second == 5).all()) and not bool((first == 5).all())


def test_a_gradient_asked_of_a_value_that_is_no_tensor_is_a_recorded_error():
    gru = torch.nn.Sequential(torch.nn.GRU(3, 4, batch_first=True))
    message = "gradient is recorded for a tensor; this value is a tuple"
    with pytest.warns(bcrecord.RecordingWarning, match=message):
        with record(gru, ["0:forward:return.grad"]) as rec:
            gru(torch.randn(1, 2, 3))
    assert rec.keys() == ["0:forward:return"]
    assert [e.key for e in rec.errors] == ["0:forward:return.grad"]


def test_a_gradient_whose_reduce_fails_is_an_error_of_the_recording_not_of_backward():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))

    def fails(t):
        if t.shape == (4, 2):  # the value and its gradient are both 4x2: both fail
            raise ValueError("no")
        return t

    with pytest.warns(bcrecord.RecordingWarning):
        with record(model, ["0:forward:return.grad"], reduce=fails) as rec:
            model(torch.randn(4, 3)).sum().backward()  # does not raise
    assert {e.key for e in rec.errors} == {"0:forward:return", "0:forward:return.grad"}


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
@pytest.mark.parametrize("during", ["forward", "backward"])
def test_what_a_signal_handler_raises_while_a_value_or_gradient_is_kept_reaches_the_program(during):
    # A SIGALRM timeout's TimeoutError raised while a value (or its gradient) was copied
    # was taken for that copy's failure: kept in rec.errors, the training step ran on.
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))

    kept = []

    def slow(t):
        kept.append(t)  # the output in the forward, then its gradient in the backward
        if len(kept) == (1 if during == "forward" else 2):
            signal.raise_signal(signal.SIGALRM)  # the timer fires while this value is kept
        return t

    def times_out(number, frame):
        raise TimeoutError("step timed out")

    old = signal.signal(signal.SIGALRM, times_out)
    try:
        with record(model, ["0:forward:return.grad"], reduce=slow) as rec:
            with pytest.raises(TimeoutError, match="step timed out"):
                model(torch.randn(4, 3)).sum().backward()
    finally:
        signal.signal(signal.SIGALRM, old)
    assert rec.errors == [] and len(kept) == (1 if during == "forward" else 2)


def test_a_shallow_copy_made_while_recorded_is_not_recorded_afterwards():
    torch.manual_seed(0)
    net, x = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()), torch.randn(2, 3)
    with record(net, ["0"]):
        twin = copy.copy(net[0])  # its __dict__, marker included, copied as it is
    twin.weight = torch.nn.Parameter(torch.zeros(3, 3))
    with record(net, ["0"]) as rec:
        net(x)
        twin(x)
    assert len(rec.all("0:forward:return")) == 1 and torch.allclose(rec["0:forward:return"], net[0](x))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the copy's old marker is inert: saving it says nothing
        torch.save(twin, io.BytesIO())


def test_nested_recordings_that_stop_early_stop_once_both_have_their_values(net):
    x = torch.randn(1, 3, 8, 8)
    expected = reference_smallnet(net, x)
    with record(net, ["bn1"], stop_after_last=True) as outer:
        with record(net, ["blocks.1"], stop_after_last=True) as inner:
            assert net(x) is None
    assert torch.allclose(outer["bn1:forward:return"], expected["bn1"], atol=1e-5)
    assert torch.allclose(inner["blocks.1:forward:return"], expected["blocks.1"], atol=1e-5)


@pytest.mark.parametrize("order", ["model first", "submodule first"])
def test_nested_recordings_that_stop_early_of_a_model_and_its_submodule_end_the_model_s_forward(order):
    # The submodule's stopping forward caught the stop, both done, and handed None to the
    # model's forward, which ran on: "linear(): argument 'input' must be Tensor, not NoneType".
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model = torch.nn.Sequential(inner, torch.nn.Linear(4, 4))
    x = torch.randn(1, 4)
    blocks = [record(model, ["0.0"], stop_after_last=True), record(inner, ["1"], stop_after_last=True)]
    if order == "submodule first":
        blocks.reverse()
    with blocks[0] as first, blocks[1] as second:
        assert model(x) is None
    recs = (first, second) if order == "model first" else (second, first)
    assert torch.equal(recs[0]["0.0:forward:return"], inner[0](x))
    assert torch.equal(recs[1]["1:forward:return"], inner(x))
    assert "forward" not in vars(model) and "forward" not in vars(inner)


@pytest.mark.parametrize("outer", [None, "a recording of the model that does not stop"])
def test_a_stopping_recording_of_a_submodule_run_by_its_model_runs_it_whole(outer):
    # The submodule's forward returned None into the model's, which failed on it: "linear():
    # argument 'input' must be Tensor, not NoneType". Called on its own, it still stops.
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model = torch.nn.Sequential(inner, torch.nn.Linear(4, 4))
    x = torch.randn(1, 4)
    expected = model(x)
    with contextlib.ExitStack() as stack:
        if outer is not None:
            stack.enter_context(record(model, ["1"]))
        rec = stack.enter_context(record(inner, ["0"], stop_after_last=True))
        assert torch.equal(model(x), expected)
        assert inner(x) is None
    assert [v.tolist() for v in rec.all("0:forward:return")] == [inner[0](x).tolist()] * 2
    assert "forward" not in vars(model) and "forward" not in vars(inner)


@pytest.mark.parametrize("method", ["training_step", "forward_features"])
def test_a_stopping_recording_of_a_submodule_called_by_another_method_of_a_module_runs_it_whole(method):
    # A LightningModule's training_step (or a timm model's forward_features) calling
    # self.backbone(x): no module's call was on the stack, so the backbone stopped and the
    # method got None for its output. Called on its own, the backbone still stops.
    torch.manual_seed(0)

    class Task(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
            self.head = torch.nn.Linear(4, 1)

        def training_step(self, x):
            return self.head(self.backbone(x)).sum()

        def forward_features(self, x):
            return self.backbone(x).relu()

    task = Task()
    x = torch.randn(2, 4)
    expected = getattr(task, method)(x)
    with record(task.backbone, ["0"], stop_after_last=True) as rec:
        assert torch.equal(getattr(task, method)(x), expected)
        assert task.backbone(x) is None
    assert [v.tolist() for v in rec.all("0:forward:return")] == [task.backbone[0](x).tolist()] * 2
    assert "forward" not in vars(task.backbone)


def test_a_stopping_recording_opened_inside_a_module_s_method_stops_its_model_called_in_the_block():
    # A feature loss in a training_step: a helper opens the block on a separate network and
    # reads the recording. The training_step further out never gets the network's output: the
    # forward still stops (it ran whole, and a head that could not take the input raised).
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.head = torch.nn.Linear(4 * 8 * 8, 10)  # 8x8 inputs only

        def forward(self, x):
            return self.head(self.body(x).flatten(1))

    feat = Net()

    def features(x):
        with record(feat, ["body"], stop_after_last=True) as rec:
            assert feat(x) is None
        return rec["body:forward:return"]

    class Task(torch.nn.Module):
        def training_step(self, x):
            return features(x)

    x = torch.ones(1, 3, 16, 16)
    assert torch.equal(Task().training_step(x), feat.body(x))


def test_a_stopping_block_opened_in_a_helper_that_returned_or_in_a_module_s_method_runs_it_whole():
    # The block's opening frame, held by its id: once the helper that entered the block by hand
    # returned, a frame made later at that address ended the walk early, and the forward of a
    # training_step that uses the output stopped (None). Opened in a module's own forward, whose
    # code uses the output after the block, it ran whole before the walk stopped at the opener.
    torch.manual_seed(0)
    feat = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    x = torch.ones(1, 4)
    expected = feat(x)

    def start():
        block = record(feat, ["0"], stop_after_last=True)
        return block, block.__enter__()

    class Task(torch.nn.Module):
        def training_step(self, x):
            return feat(x)

    block, rec = start()
    try:
        for _ in range(20):  # (frames made and freed meanwhile)
            assert torch.equal(Task().training_step(x), expected)
    finally:
        block.__exit__(None, None, None)

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.feat = feat

        def forward(self, x):
            with record(self.feat, ["0"], stop_after_last=True):
                out = self.feat(x)
            return out

    assert torch.equal(Wrapper()(x), expected)
    assert rec._opened_in is None  # (the frame let go when the block ended)


def test_a_parameter_gradient_recorded_in_two_threads_is_each_thread_s_own():
    # A parameter's hook fires in every backward that reaches it: thread A's backward
    # recorded A's gradient into B's recording too, and took B's hook away (B's own was lost).
    model = torch.nn.Linear(3, 1, bias=False)
    torch.nn.init.ones_(model.weight)
    a_forward, b_forward, a_backward = threading.Event(), threading.Event(), threading.Event()
    got = {}

    def run(k, mine, wait_for, then):
        with record(model, [":forward:self.weight.grad"], grad=True) as rec:
            out = model(torch.full((1, 3), float(k)))  # d(out.sum())/dW = [k, k, k]
            mine.set()
            assert wait_for.wait(10)
            out.sum().backward()
            then.set()
        got[k] = [g.tolist() for g in rec.all(":forward:self.weight.grad")]

    first = threading.Thread(target=run, args=(1, a_forward, b_forward, a_backward))
    second = threading.Thread(
        target=lambda: a_forward.wait(10) and run(2, b_forward, a_backward, threading.Event())
    )
    first.start(), second.start()
    first.join(20), second.join(20)
    assert got == {1: [[[1.0, 1.0, 1.0]]], 2: [[[2.0, 2.0, 2.0]]]}
    assert not model.weight._backward_hooks


def test_one_record_block_entered_by_a_second_thread_while_the_first_enters_it_is_refused():
    # Both went in: the second replaced the first's block, whose recording then ended early
    # (its generator finalized from the other thread) and lost its values.
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    block = record(model, "0")
    make, inside, go_on = block._make, threading.Event(), threading.Event()

    def slow_make():
        inside.set()
        assert go_on.wait(10)
        return make()

    block._make = slow_make
    got = []

    def first():
        with block as rec:
            model(torch.ones(1, 2))
        got.append(len(rec.all("0:forward:return")))

    thread = threading.Thread(target=first)
    thread.start()
    assert inside.wait(10)
    with pytest.raises(RuntimeError, match=r"this record\(\.\.\.\) has been entered already"):
        block.__enter__()
    go_on.set()
    thread.join(10)
    assert got == [1] and "forward" not in vars(model)


def test_a_parameter_gradient_from_a_backward_in_a_thread_the_block_started_is_recorded():
    # A thread with no recording of its own cannot be told apart from autograd's: its
    # backward's gradient is taken (told apart as another context's, it was dropped).
    model = torch.nn.Linear(2, 2)
    with record(model, [":forward:self.weight.grad"]) as rec:
        y = model(torch.ones(1, 2)).sum()
        worker = threading.Thread(target=y.backward)
        worker.start()
        worker.join(10)
    assert torch.equal(rec[":forward:self.weight.grad"], model.weight.grad)


def test_a_nested_stopping_recording_of_a_submodule_that_runs_later_holds_the_stop_back():
    # The model's recording had its value first, and the submodule's, whose pass had not begun,
    # held nothing back: the forward ended before the submodule ran, which recorded nothing.
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), inner, torch.nn.Linear(3, 1))
    x = torch.randn(2, 3)
    with record(model, "0", stop_after_last=True) as outer, record(inner, "0", stop_after_last=True) as sub:
        assert model(x) is None
    assert torch.equal(outer["0:forward:return"], model[0](x))
    assert torch.equal(sub["0:forward:return"], inner[0](model[0](x)))


@pytest.mark.parametrize("kind", ["forward hook", "forward set on the instance"])
def test_nested_stopping_recordings_run_whole_where_the_outer_model_must(kind):
    # A stop of both ended the model's forward, though it has a hook of its own (which got
    # None) or a forward set on it (whose work after the class's forward was skipped).
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), inner, torch.nn.Linear(4, 1))
    x = torch.randn(2, 4)
    expected, seen = model(x), []
    if kind == "forward hook":
        model.register_forward_hook(lambda module, args, out: seen.append(out))
    else:
        run = model.forward

        def forward(*args):
            out = run(*args)
            seen.append(out)
            return out

        model.forward = forward
    blocks = record(model, ["0"], stop_after_last=True), record(inner, ["1"], stop_after_last=True)
    with blocks[0] as outer, blocks[1] as sub:
        assert torch.equal(model(x), expected)
    assert len(seen) == 1 and torch.equal(seen[0], expected)
    assert torch.equal(outer["0:forward:return"], model[0](x))
    assert torch.equal(sub["1:forward:return"], inner(model[0](x)))


@pytest.mark.parametrize("called_before", [False, True])
def test_a_stopping_recording_of_a_model_whose_forward_calls_an_extractor_ends_at_the_target_inside_it(
    called_before,
):
    # A distiller: the extractor caught the stop of both (at its last node) and returned, and
    # the student's forward ran whole, silently, its target recorded.
    from bcrecord.torch import create_feature_extractor

    torch.manual_seed(0)
    teacher = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))

    class Student(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tfeat = create_feature_extractor(teacher, {"2": "t"})
            self.head = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.head(self.tfeat(x)["t"])

    student, x = Student(), torch.randn(2, 4)
    if called_before:  # (the extractor patches at its first call)
        assert torch.equal(student(x), student.head(teacher(x)))
    with record(student, ["tfeat.model.2"], stop_after_last=True) as rec:
        assert student(x) is None
    assert torch.equal(rec["tfeat.model.2:forward:return"], teacher(x))
    assert torch.equal(student(x), student.head(teacher(x)))  # the extractor works on


@pytest.mark.parametrize("inner_kind", ["record", "core"])
def test_a_recording_inside_one_that_stops_early_gets_the_value_the_stop_comes_at(net, inner_kind):
    # The stopping recording's probe at that place runs last (Patch.deliver_last), and a
    # core recording taking the same probe gets the value before the stop is raised.
    x = torch.randn(1, 3, 8, 8)
    expected = reference_smallnet(net, x)
    with record(net, ["bn1"], stop_after_last=True) as stopping:
        inner = record(net, ["bn1"]) if inner_kind == "record" else bcrecord.recording()
        with inner as plain:
            assert net(x) is None
    assert torch.allclose(stopping["bn1:forward:return"], expected["bn1"], atol=1e-5)
    assert torch.allclose(plain["bn1:forward:return"], expected["bn1"], atol=1e-5)


class _Linear2(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        y = self.lin(x) * 2
        return y


def test_targets_inside_a_recording_are_read_from_the_code_without_its_probes():
    from bcrecord.torch import list_targets

    model = _Linear2()
    x = torch.ones(1, 2)
    before = list(list_targets(model))
    with record(model, [":forward:self.lin@0", ":forward:y@0"]) as outer:
        assert list(list_targets(model)) == before  # not the probe's call, nor the split chain
        # the probes split the call's chain; a second recording finds the call all the same
        with record(model, [":forward:self.lin()@0", ":forward:*@0"]) as inner:
            out = model(x)
    assert ":forward:self.lin()@0" in before and not any("probe" in t for t in before)
    assert torch.equal(inner[":forward:self.lin()@0"], model.lin(x))
    assert torch.equal(inner[":forward:*@0"], out) and torch.equal(outer[":forward:y@0"], out)
    assert outer[":forward:self.lin@0"] is model.lin


class _Scale(torch.nn.Module):
    def _scaled(self, x):
        y = x * 2
        return y

    forward = _scaled  # forward is another function (torch.fx's lazy GraphModule does this)


def test_a_forward_that_is_another_function_keeps_forward_in_its_keys():
    from bcrecord.torch import create_feature_extractor

    net = torch.nn.Sequential(_Scale(), torch.nn.ReLU())
    x = torch.tensor([[1.0, -2.0]])
    with record(net, ["0", "0:forward:y"]) as rec:
        net(x)
    assert rec.keys() == ["0:forward:y@0", "0:forward:return"]
    assert torch.equal(rec["0:forward:return"], x * 2) and torch.equal(rec["0:forward:y@0"], x * 2)
    assert torch.equal(create_feature_extractor(net, ["0"])(x)["0"], x * 2)


def test_a_recording_whose_block_ended_cannot_be_entered_again(net):
    x = torch.randn(1, 3, 8, 8)
    with record(net, ["bn1"]) as rec:
        net(x)
    with pytest.raises(RuntimeError, match=r"record\(\) block has ended and the model is unpatched"):
        with rec:
            net(x)  # would record nothing
    assert len(rec.all("bn1:forward:return")) == 1 and not rec.active
    collect_all()  # no earlier test's patch removed by a collection while we count
    slots = len(bcrecord.patch._slots)
    with pytest.raises(bcrecord.SpecError, match="keep must be"):  # refused after patching: unpatched again
        with record(net, ["bn1"], keep=0):
            pass
    assert len(bcrecord.patch._slots) == slots and not bcrecord.runtime.is_active()


def test_a_record_block_exited_from_another_thread_twice_or_never_entered_ends_once(net):
    # A second exit (an exit stack and a finally both ending it) raised a bare
    # AssertionError, and under python -O an AttributeError on None: a recording's second
    # exit does nothing, and so does this one.
    x = torch.randn(1, 3, 8, 8)
    before = snapshot(net)
    block = record(net, ["bn1"], stop_after_last=True)
    rec = block.__enter__()
    net(x)
    ended = threading.Thread(target=block.__exit__, args=(None, None, None))
    ended.start()
    ended.join()
    assert block.__exit__(None, None, None) is None
    assert record(net, ["bn1"]).__exit__(None, None, None) is None
    assert len(rec.all("bn1:forward:return")) == 1 and not rec.active and not bcrecord.runtime.is_active()
    assert same(snapshot(net), before)


def test_reading_a_target_string_as_a_key_names_its_keys(net):
    with record(net, ["bn1", ":forward:x"]) as rec:
        net(torch.randn(1, 3, 8, 8))
    with pytest.raises(KeyError, match=r"'bn1' is a target, not a key: its keys are 'bn1:forward:return'; "):
        rec["bn1"]  # as the README reads it: rec["bn1:forward:return"]
    assert rec["bn1:forward:return"].shape == (1, 4, 8, 8)
    many = ", ".join(map(repr, rec.keys_of(":forward:x")[:3]))
    with pytest.raises(KeyError, match=rf"its keys are {many}, \.\.\.; read rec\[':forward:x@0'\], or"):
        rec[":forward:x"]  # a local without @index: one key per assignment


def test_reading_a_target_string_as_a_key_names_the_keys_that_hold_values():
    # A target in a branch not taken: "its keys are ':forward:w@0'; read rec[':forward:w@0']",
    # a key holding no value either (reading it raised again); a glob's message named first
    # the keys of modules that never ran.
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)

        def forward(self, x, flag=False):
            y = self.c(x)
            if flag:
                w = self.a(self.b(y))
                y = w
            return y

    model = Branchy()
    with record(model, ["*", ":forward:w"]) as rec:
        out = model(torch.ones(1, 2))
    with pytest.raises(KeyError) as error:
        rec[":forward:w"]
    assert error.value.args[0].startswith(
        "':forward:w' is a target, not a key, and none of its keys (':forward:w@0') holds a value; "
        "no values recorded for ':forward:w@0': its probe was placed but did not run while recorded "
        "(in a branch not taken"
    )
    with pytest.raises(KeyError) as error:
        rec["*"]
    assert error.value.args[0] == (
        "'*' is a target, not a key: its keys are 'c:forward:return' (2 more hold none); "
        "read rec['c:forward:return'], or rec.values_of('*') for all of them"
    )
    assert torch.equal(rec["c:forward:return"], out)


def test_reading_values_from_record_itself_says_to_enter_it_with_with(net):
    block = record(net, ["bn1"])  # `with` forgotten: what record() returns holds no values
    net(torch.randn(1, 3, 8, 8))
    hint = r"record\(\) returns a context manager: write 'with record\(model, targets\) as rec:'"
    with pytest.raises(TypeError, match=hint):
        block["bn1:forward:return"]
    with pytest.raises(TypeError, match=r"inside the block; then test 'bn1:forward:return' in rec$"):
        "bn1:forward:return" in block  # noqa: B015
    with pytest.raises(TypeError, match=r"inside the block; then iterate over rec.keys\(\)$"):
        list(block)
    with pytest.raises(TypeError, match=r"inside the block; then call len\(rec\)$"):
        len(block)
    assert bool(block)
    for name in ("keys", "all", "keys_of", "items", "errors", "targets", "failures"):
        with pytest.raises(AttributeError, match=hint):
            getattr(block, name)
    with pytest.raises(AttributeError, match=r"'RecordBlock' object has no attribute 'nothing'$"):
        block.nothing  # noqa: B018 (a name no recording has: the usual error)
    assert not hasattr(block, "_missing") and repr(block) == "<record(SmallNet, ['bn1']): not entered yet>"


def test_what_record_returns_is_for_one_block_and_says_so(net):
    x = torch.randn(1, 3, 8, 8)
    before = snapshot(net)
    block = record(net, ["bn1"])
    assert repr(block) == "<record(SmallNet, ['bn1']): not entered yet>"
    with block as rec:
        net(x)
        assert repr(block) == "<record(SmallNet, ['bn1']): entered>"
        with pytest.raises(RuntimeError, match=r"entered already: call record\(\) again for each"):
            with block:
                pass
        net(x)  # the outer block records on
    with pytest.raises(RuntimeError, match=r"entered already"):  # as a loop that reuses it would
        with block:
            net(x)
    assert repr(block) == "<record(SmallNet, ['bn1']): used>"
    many = [f"conv1:forward:x@{n}" for n in range(9)]
    assert repr(record(net, many)) == (
        "<record(SmallNet, ['conv1:forward:x@0', 'conv1:forward:x@1', 'conv1:forward:x@2', "
        "'conv1:forward:x@3', ...]): not entered yet>"
    )
    assert len(rec.all("bn1:forward:return")) == 2 and same(snapshot(net), before)
    bad = record(net, ["bn9"])
    for _ in range(2):  # a block that failed to start was never used: the same error again
        with pytest.raises(bcrecord.TargetError, match="no submodule 'bn9'"):
            with bad:
                pass

    @record(net, ["bn1"])  # as a decorator: a block per call
    def forward_twice():
        net(x)
        return bcrecord.runtime.context_recordings()[-1]

    assert (
        len(forward_twice().all("bn1:forward:return")) == 1
        and len(forward_twice().all("bn1:forward:return")) == 1
    )

    @record(net, (path for path in ["bn1"]))  # a generator: the second call found it used up
    def forward_from_a_generator():
        net(x)
        return bcrecord.runtime.context_recordings()[-1]

    assert [len(forward_from_a_generator().all("bn1:forward:return")) for _ in range(2)] == [1, 1]
    assert same(snapshot(net), before)


def test_the_early_stop_lets_hooks_that_track_modules_run():
    # FlopCounterMode's ModuleTracker pairs a pre-hook with a hook for every module; an
    # always_call hook must run even when the forward raises. A forward ended early
    # would skip both: it runs whole instead, with the same values.
    from torch.utils.flop_counter import FlopCounterMode

    from bcrecord.torch import create_feature_extractor

    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()), torch.nn.Linear(8, 8)
    )
    x = torch.randn(4, 8)
    extractor = create_feature_extractor(net, ["0.0"])
    with FlopCounterMode(display=False) as counter:
        features = extractor(x)
        torch.randn(64, 64) @ torch.randn(64, 64)  # inside no module
    counts = {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}
    linear = 2 * 4 * 8 * 8  # the flops of one Linear(8, 8) on 4 rows
    assert counts["Global"] == 2 * linear + 2 * 64**3 and counts["FeatureExtractor.model.0"] == linear
    assert torch.equal(features["0.0"], net[0][0](x))
    depth = []
    handles = [module.register_forward_pre_hook(lambda *_: depth.append(1)) for module in net.modules()]
    handles.append(net[0].register_forward_hook(lambda *_: depth.pop() and None, always_call=True))
    handles += [
        m.register_forward_hook(lambda *_: depth.pop() and None) for m in (net, net[0][0], net[0][1], net[1])
    ]
    with record(net, ["0.0"], stop_after_last=True) as rec:
        out = net(x)
    assert depth == [] and torch.equal(out, net(x)) and torch.equal(rec["0.0:forward:return"], net[0][0](x))
    for handle in handles:
        handle.remove()
    calls = []
    outer = torch.nn.Sequential(net)
    for name, module in (("net", net), ("outer", outer), ("extractor", extractor)):  # never unwound
        module.register_forward_hook(lambda *_, name=name: calls.append(name), always_call=True)
    whole = net(x)
    calls.clear()
    with record(net, ["0.0"], stop_after_last=True):  # net's hooks would get None for its output
        assert torch.equal(net(x), whole) and torch.equal(outer(x), whole)  # so it runs whole
    assert calls == ["net", "net", "outer"]
    assert sorted(extractor(x)) == ["0.0"]  # an extractor's stop would unwind net: it runs whole
    assert calls[3:] == ["net", "extractor"]


def _offloaded(module, log):
    """``module`` wrapped as accelerate's ``cpu_offload`` wraps it: its ``forward`` an instance
    attribute, a partial that loads its own parameters before the class's forward and offloads
    them (to the meta device) after it returns."""
    kept = {name: p.detach().clone() for name, p in module.named_parameters(recurse=False)}

    def put(device=None):
        for name, value in kept.items():
            value = value if device is None else torch.empty_like(value, device=device)
            setattr(module, name, torch.nn.Parameter(value, requires_grad=False))

    put("meta")
    original = module.forward

    def new_forward(module, *args, **kwargs):
        put()  # pre_forward
        output = original(*args, **kwargs)
        put("meta")  # post_forward
        log.append(type(module).__name__)
        return output

    module.forward = functools.update_wrapper(functools.partial(new_forward, module), original)
    return module


def test_the_early_stop_runs_whole_through_a_forward_set_on_the_instance():
    # accelerate's hooks (cpu_offload, dispatch_model) set each module's forward to a partial
    # that moves weights in, runs the class's forward, and offloads them after it returns:
    # a stop raised inside would skip that, leaving the weights loaded (on the device) for good.
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()), torch.nn.Linear(3, 2)
    )
    x = torch.randn(2, 3)
    whole, first, weight = net(x), net[0][0](x), net[0][0].weight.detach().clone()
    log = []
    _offloaded(net[0][0], log)
    _offloaded(net[1], log)
    assert torch.equal(net(x), whole) and log == ["Linear", "Linear"]
    log.clear()
    before = {name: dict(vars(m)) for name, m in net.named_modules()}
    wrapped = pytest.warns(bcrecord.RecordingWarning, match="Linear at '0.0' has its own forward attribute")
    with wrapped, record(net, ["0.0", "0.0:forward:self.weight@0"], stop_after_last=True) as rec:
        out = net(x)
    assert torch.equal(rec["0.0:forward:self.weight@0"], weight)  # loaded, as the forward used it
    assert torch.equal(rec["0.0:forward:return"], first) and torch.equal(out, whole)
    assert log == ["Linear", "Linear"] and net[0][0].weight.device.type == "meta"
    assert {name: dict(vars(m)) for name, m in net.named_modules()}.keys() == before.keys()
    assert all(vars(m).keys() == before[name].keys() for name, m in net.named_modules())
    assert vars(net[0][0])["forward"] is before["0.0"]["forward"] and "forward" not in vars(net)
    with pytest.warns(bcrecord.RecordingWarning, match="Linear at '0.0' has its own forward attribute"):
        extractor = create_feature_extractor(net, ["0.0"])
    log.clear()
    features = extractor(x)
    assert torch.equal(features["0.0"], first) and log == ["Linear", "Linear"]
    assert net[0][0].weight.device.type == "meta"
    extractor.close()
    plain = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())  # no wrapper: it stops
    with record(plain, ["0"], stop_after_last=True):
        assert plain(x) is None
    _offloaded(plain, log)  # at the root, the stop would unwind its wrapper too
    log.clear()
    with pytest.warns(bcrecord.RecordingWarning, match="Sequential at '<root>' has its own forward"):
        with record(plain, ["0", ""], stop_after_last=True):
            assert torch.equal(plain(x), plain[1](plain[0](x)))
    assert log == ["Sequential"]


def test_a_second_backward_through_a_kept_graph_adds_no_gradient():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
    x = torch.randn(2, 3)
    with record(net, ["0:forward:return.grad", "0:forward:self.weight.grad"]) as rec:
        y = net(x)
        y.sum().backward(retain_graph=True)
        (2 * y).sum().backward()
    first = 1 - y.detach() ** 2  # d tanh(z)/dz, for the first backward's ones
    assert (
        torch.allclose(rec.all("0:forward:return.grad")[0], first)
        and len(rec.all("0:forward:return.grad")) == 1
    )
    assert (
        torch.allclose(rec["0:forward:self.weight.grad"], first.T @ x)
        and len(rec.all("0:forward:self.weight.grad")) == 1
    )


def test_a_reduce_that_runs_recorded_code_records_nothing_more():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    x = torch.randn(2, 3)
    # The reduce of '0' runs net[1], itself recorded: only the program's call is.
    with record(net, ["0", "1"], reduce={"0": lambda t: net[1](t).sum()}) as rec:
        out = net(x)
    assert len(rec.all("1:forward:return")) == 1 and torch.equal(rec["1:forward:return"], out)
    assert torch.allclose(rec["0:forward:return"], out.sum())


def test_the_model_s_own_hooks_never_get_none_from_an_early_stop():
    # A stop is caught inside the model's forward: its own hooks would then take None
    # for its output (and crash, or return a dict of None). The forward runs whole.
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())
    shapes = []
    handle = net.register_forward_hook(lambda module, args, out: shapes.append(tuple(out.shape)))
    x = torch.ones(1, 2)
    with torch.no_grad(), record(net, ["0"], stop_after_last=True) as rec:
        out = net(x)
    assert shapes == [(1, 2)] and torch.equal(out, net[1](net[0](x)))
    assert torch.equal(rec["0:forward:return"], net[0](x))
    handle.remove()
    handle = net.register_full_backward_pre_hook(lambda module, grad: None)  # it wants a tensor out
    with record(net, ["0"], stop_after_last=True):
        assert torch.equal(net(x.requires_grad_()), net[1](net[0](x)))
    handle.remove()
    with torch.no_grad(), record(net, ["0"], stop_after_last=True):
        assert net(x) is None  # no hook: it stops


class Recursive(torch.nn.Module):
    """A forward that calls the module itself."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 3)

    def forward(self, x, depth=2):
        h = self.fc(x)
        if depth:
            h = self(h, depth - 1) + 1
        return h


def test_a_forward_that_calls_its_own_model_is_stopped_by_the_outermost_call_only():
    # The recursive call was ended alone: None went back into the forward (TypeError there).
    torch.manual_seed(0)
    model, x = Recursive(), torch.randn(2, 3)
    with record(model, [":forward:return", "fc"], stop_after_last=True) as rec:
        assert model(x) is None
    innermost = model.fc(model.fc(model.fc(x)))  # the first return: the deepest call's
    assert torch.allclose(rec[":forward:return"], innermost) and len(rec.all(":forward:return")) == 1
    assert len(rec.all("fc:forward:return")) == 3 and "forward" not in vars(model)
    with record(model, [":forward:return"]) as rec:  # without the stop: each call's return
        out = model(x)
    returns = rec.all(":forward:return")
    assert len(returns) == 3 and all(map(torch.allclose, returns, [innermost, out - 1, out]))


def test_a_deepcopy_made_while_stopping_early_stops_as_the_model_does():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x = torch.randn(5, 3)
    with record(net, ["0"], stop_after_last=True) as rec:
        twin = copy.deepcopy(net)
        assert twin(x) is None  # stopped after '0', as the model's own forward is
        assert net(x) is None
    values = rec.all("0:forward:return")
    assert len(values) == 2 and all(torch.equal(v, net[0](x)) for v in values)
    assert torch.equal(twin(x), net(x))  # afterwards both run to the end
    assert "forward" not in vars(twin)  # its stopping forward went with the model's
    with bcrecord.patch_method(torch.nn.Sequential, "forward", ["return"], name="seq"):
        with bcrecord.recording() as later:
            twin(x)
    assert later.keys() == ["seq:forward:return"]  # so a later class patch reaches it


def test_a_forward_set_on_the_model_inside_an_early_stop_block_holds_no_recording():
    # accelerate's add_hook_to_module inside the block: it keeps model.forward, the stopping
    # forward, as _old_forward, and sets its partial; remove_hook_from_module puts it back.
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x = torch.randn(5, 3)
    whole = net(x)
    with pytest.warns(bcrecord.RecordingWarning, match=r"Sequential.forward was set on the model during"):
        with record(net, ["0"], stop_after_last=True) as rec:
            net._old_forward = net.forward
            net.forward = functools.update_wrapper(
                functools.partial(lambda m, *a: m._old_forward(*a), net), net
            )
            assert torch.equal(net(x), whole)  # through a wrapper: it runs whole
    assert torch.equal(net(x), whole) and torch.equal(rec["0:forward:return"], net[0](x))
    net.forward = net._old_forward  # remove_hook_from_module
    del net._old_forward
    kept = type(net.forward).__name__
    assert rec not in getattr(net.forward, "recordings", [])  # the model holds no ended recording
    with record(net, ["0"], stop_after_last=True) as later:
        assert net(x) is None
    assert torch.equal(later["0:forward:return"], net[0](x))
    assert kept == "_StopAtRoot" and "forward" not in vars(net)  # gone with the next block
    assert torch.equal(net(x), whole)


def test_a_forward_set_inside_an_early_stop_block_under_warnings_as_errors_leaves_no_mark():
    # The warning that it is left there, made an error (-W error, pytest's filterwarnings),
    # was raised before the pass took its path markers off the modules: the model kept them
    # (and torch.save, deepcopy carried them), and the count of them was never freed.
    marks = sys.modules["bcrecord.torch.record"]._mark_counts
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    x = torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(bcrecord.RecordingWarning, match="forward was set on the model during"):
            with record(net, ["0"], stop_after_last=True):
                net.forward = functools.partial(torch.nn.Sequential.forward, net)
                net(x)
    assert [name for name in vars(net[0]) if "bcrecord" in name] == [] and id(net[0]) not in marks
    del net.forward
    with record(net, ["0"], stop_after_last=True) as rec:
        assert net(x) is None
    assert list(rec.keys()) == ["0:forward:return"] and "forward" not in vars(net)


def test_an_instance_patch_removed_inside_an_early_stop_block_leaves_nothing_behind():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x = torch.randn(5, 3)
    patch = bcrecord.patch_method(net, "forward", ["return"], name="user")
    with warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.RecordingWarning)  # bcrecord's own wrapper: no warning
        with record(net, ["0"], stop_after_last=True):
            assert net(x) is None
            twin = copy.deepcopy(net)  # its stopping forward holds the patched method bound to it
            patch.remove()  # under the stopping forward, which holds the patched method
    assert "forward" not in vars(net) and torch.equal(net(x), net[2](net[1](net[0](x))))
    assert "forward" not in vars(twin) and torch.equal(twin(x), net(x))
    with bcrecord.patch_method(torch.nn.Sequential, "forward", ["return"], name="seq"):
        with bcrecord.recording() as later:
            net(x), twin(x)
    assert len(later.all("seq:forward:return")) == 2


class _Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.k = 1.0

    def forward(self, x):
        return self.lin(x) * self.k


def test_a_shallow_copy_made_while_stopping_early_runs_its_own_forward_after_the_block():
    torch.manual_seed(0)
    model, x = _Scaled(), torch.ones(1, 2)
    with torch.no_grad(), record(model, ["lin"], stop_after_last=True):
        shallow = copy.copy(model)  # shares the model's __dict__ values: its stopping forward too
    shallow.k = 10.0
    assert "forward" not in vars(shallow) and "forward" not in vars(model)
    with torch.no_grad():
        assert torch.equal(shallow(x), model.lin(x) * 10.0)  # its own k, not the model's
        with record(model, ["lin"], stop_after_last=True):
            assert torch.equal(shallow(x), model.lin(x) * 10.0)  # not stopped: not the model


class _OwnForward(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)
        self.forward = self.forward_fast  # set on the instance, as some models do

    def forward_fast(self, x):
        return self.lin(x)


def test_a_deepcopy_made_while_stopping_early_keeps_a_forward_the_model_set_on_itself_bound_to_the_copy():
    torch.manual_seed(0)
    model, x = _OwnForward(), torch.ones(1, 2)
    with torch.no_grad(), record(model, ["lin"], stop_after_last=True):
        twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lin.weight.fill_(0.0)
        twin.lin.bias.fill_(0.0)
        with record(twin, ["lin"], stop_after_last=True) as rec:
            assert twin(x) is None
        assert torch.equal(rec["lin:forward:return"], torch.zeros(1, 2))
        assert twin.forward.__self__ is twin and torch.equal(twin(x), torch.zeros(1, 2))
        assert vars(twin)["forward"] == twin.forward_fast  # its own again, no stopping wrapper
        saved = io.BytesIO()
        torch.save(twin, saved)
        saved.seek(0)
        loaded = torch.load(saved, weights_only=False)
        assert torch.equal(loaded(x), torch.zeros(1, 2)) and torch.equal(model(x), model.lin(x))


def _as_tuple(func):  # what transformers' can_return_tuple does: changes what forward returns
    @functools.wraps(func)
    def wrapper(self, x, as_tuple=False):
        out = func(self, x)
        return (out,) if as_tuple else out

    return wrapper


def _deprecation_shim(func):  # *args only: passes the result through
    @functools.wraps(func)
    def passing(*args, **kwargs):
        return func(*args, **kwargs)

    return passing


class Wrapped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    @_deprecation_shim
    @_as_tuple
    def forward(self, x):
        h = self.fc(x)
        return h.relu()


def test_a_module_path_records_what_a_wrapped_forward_returns_and_its_locals_inside():
    torch.manual_seed(0)
    net = torch.nn.Sequential(Wrapped(), Wrapped())
    x = torch.randn(3, 2)
    seen = {}
    hooks = [m.register_forward_hook(lambda m, a, o, i=i: seen.setdefault(i, o)) for i, m in enumerate(net)]
    codes = [w.__code__ for w in (Wrapped.forward, Wrapped.forward.__wrapped__)]
    with record(net, ["0", "1:forward:return", "1:forward:h"]) as rec:
        out = net[1](net[0](x, as_tuple=True)[0], as_tuple=True)
    for hook in hooks:
        hook.remove()
    # What each module returned (a tuple, as the hooks saw it), not what the function inside returned
    assert isinstance(rec["0:forward:return"], tuple) and torch.equal(rec["0:forward:return"][0], seen[0][0])
    assert torch.equal(rec["1:forward:return"][0], out[0])
    assert torch.equal(rec["1:forward:h@0"], net[1].fc(seen[0][0]))  # a local: inside, as before
    assert [w.__code__ for w in (Wrapped.forward, Wrapped.forward.__wrapped__)] == codes
    extractor = bcrecord.torch.create_feature_extractor(net, ["0"])
    assert isinstance(extractor(x)["0"], torch.Tensor)  # as_tuple=False: the tensor itself

    class Fast(torch.nn.Module):  # an instance's forward: another method, itself wrapped
        def __init__(self):
            super().__init__()
            self.forward = self.forward_fast

        @_as_tuple
        def forward_fast(self, x):
            return x * 2

    fast = torch.nn.Sequential(Fast())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "has its own forward attribute" warning
        with record(fast, ["0"]) as rec:
            fast[0](x, as_tuple=True)
    assert rec.keys() == ["0:forward_fast:return"] and torch.equal(rec["0:forward_fast:return"][0], x * 2)


def test_torch_export_inside_a_recording_that_stops_early_exports_the_whole_model():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    x = torch.randn(4, 2)
    with record(net, ["0"], stop_after_last=True) as rec:
        # export reads net.forward.__code__, and traces the forward to its end: no stop there
        program = torch.export.export(net, (x,))
        assert net(x) is None  # a plain call still stops
    assert torch.equal(program.module()(x), net(x))
    assert "forward" not in vars(net)
    assert torch.equal(rec["0:forward:return"], net[0](x))  # from the plain call
    with record(net, ["0"], stop_after_last=True) as rec:
        traced = torch.jit.trace(net, (x,))  # traced whole too: a stopped forward returns nothing
    assert torch.allclose(traced(x), net(x)) and len(rec.all("0:forward:return")) >= 1
    # make_fx too (its graph returned None)
    from torch.fx.experimental.proxy_tensor import make_fx

    with record(net, ["0"], stop_after_last=True) as rec:
        graph = make_fx(net)(x)
    assert torch.allclose(graph(x), net(x)) and torch.equal(rec["0:forward:return"], net[0](x))


def test_torch_jit_trace_inside_a_recording_traces_the_model_and_records_its_runs():
    torch.manual_seed(0)
    model, x = SmallNet().eval(), torch.randn(2, 3, 8, 8)
    options = [
        {},
        {"copy": "detach"},
        {"reduce": lambda t: t.mean(0)},
        {"dtype": torch.float64},
        {"grad": True},
    ]
    for kw in options:
        with record(model, ["bn1", ":forward:x@1", "blocks.0:forward:out@0"], **kw) as rec:
            traced = torch.jit.trace(model, x)  # traces, then checks by tracing again
        assert torch.allclose(traced(x), model(x))
        # The trace and its check ran the model (three times): each run's values, as they
        # were before the in-place ReLU (except with copy='detach', which keeps the live one).
        with torch.no_grad():
            bn1 = model.bn1(model.stem(x))
        expected = bn1.mean(0) if "reduce" in kw else bn1.relu() if "copy" in kw else bn1
        values = rec.all("bn1:forward:return") + rec.all(":forward:x@1")
        assert len(values) >= 4 and all(torch.allclose(v.float(), expected, atol=1e-6) for v in values)
        assert "bcrecord" not in str(traced.graph)  # the probes' copies are not in the graph


def test_torch_jit_script_inside_a_recording_compiles_the_source_and_its_module_records_nothing():
    torch.manual_seed(0)
    model, x = SmallNet().eval(), torch.randn(2, 3, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's, from torch 2.10 on
        with record(model, ["bn1", ":forward:x@1"]) as rec:
            scripted = torch.jit.script(model)
            out = scripted(x)
    assert torch.allclose(out, model(x)) and rec.keys() == []


def test_torch_jit_script_inside_a_recording_that_stops_early_compiles_the_model_and_records_nothing():
    torch.manual_seed(0)
    model, x = SmallNet().eval(), torch.randn(2, 3, 8, 8)
    holder = torch.nn.Sequential(model)  # a module holding the recorded model is scripted with it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's, from torch 2.10 on
        with record(model, ["bn1"], stop_after_last=True) as rec:
            scripted, scripted_holder = torch.jit.script(model), torch.jit.script(holder)
            outs = [scripted(x), scripted_holder(x)]
            assert rec.keys() == []  # the scripted modules run TorchScript: no probes
            assert model(x) is None  # the model itself still records, and stops
    assert "forward" not in vars(model)
    expected = model(x)
    assert all(torch.allclose(out, expected) for out in outs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        assert torch.allclose(torch.jit.script(model)(x), expected)  # and after the block
    assert torch.allclose(rec["bn1:forward:return"], model.bn1(model.stem(x)))


def test_a_stop_held_back_by_a_site_that_did_not_run_is_said_once():
    net = torch.nn.Sequential(Branchy(), torch.nn.Linear(4, 4))
    x = torch.randn(2, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad(), record(net, ["0:forward:h"], stop_after_last=True) as rec:
            outs = [net(x), net(x)]
    said = [str(w.message) for w in caught if "stop_after_last" in str(w.message)]
    assert len(said) == 1 and "['0:forward:h@0'] did not run" in said[0]
    assert all(isinstance(out, torch.Tensor) for out in outs)  # ran whole: the values are right
    assert torch.allclose(rec["0:forward:h@1"], net[0].lin(x))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad(), record(net, ["0:forward:h@1"], stop_after_last=True):
            assert net(x) is None  # the site that runs: stopped after it, nothing said
    assert not [w for w in caught if "stop_after_last" in str(w.message)]


def test_a_stop_the_model_s_own_bare_except_catches_is_said_once():
    # A bare except around a target caught the stop and ran its fallback: the forward
    # returned what that made, and nothing said so.
    class Fallback(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)

        def forward(self, x):
            try:
                h = self.a(x)
            except:  # noqa: E722
                h = torch.zeros(len(x), 3)
            return self.b(h)

    torch.manual_seed(0)
    net, x = Fallback(), torch.randn(2, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad(), record(net, ["a"], stop_after_last=True) as rec:
            outs = [net(x), net(x)]
        with torch.no_grad():
            features = create_feature_extractor(net, ["a"])(x)
    said = [str(w.message) for w in caught if "caught by the model's own code" in str(w.message)]
    assert len(said) == 2 and "a bare 'except:'" in said[0]  # once per recording
    with torch.no_grad():
        assert all(torch.equal(out, net.b(torch.zeros(2, 3))) for out in outs)
        assert torch.equal(rec["a:forward:return"], net.a(x)) and torch.equal(features["a"], net.a(x))


def test_a_gradient_no_backward_reached_is_missing_for_that_reason_not_a_branch():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    x = torch.randn(3, 4)
    targets = ["1:forward:return.grad", "0:forward:self.weight.grad"]
    with record(net, targets) as rec:
        out = net(x)
    assert torch.equal(rec["1:forward:return"], out)  # its value is there, its probe ran
    with pytest.raises(KeyError, match=f"'{targets[0]}': its value .* was recorded, but no backward pass"):
        rec[targets[0]]
    # A parameter's: no backward after the block records it either.
    with pytest.raises(KeyError, match=f"'{targets[1]}': its value .* was recorded, but it is a leaf"):
        rec[targets[1]]
    with torch.no_grad(), record(net, targets[:1]) as rec:
        net(x)
    with pytest.raises(KeyError, match="none of its values was in the autograd graph"):
        rec.all(targets[0])
    # A forward stop_after_last ended returns None; a loss of the value itself reaches it.
    with record(net, targets[:1], stop_after_last=True) as rec:
        assert net(x) is None
    with pytest.raises(KeyError, match="call backward on a loss of the recorded value"):
        rec[targets[0]]
    with record(net, targets[:1], stop_after_last=True, grad=True) as rec:
        net(x)
        rec["1:forward:return"].pow(2).sum().backward()
    assert torch.allclose(rec[targets[0]], 2 * torch.tanh(net[0](x)))


def test_attention_fast_path_and_out_proj_record_what_the_readme_says():
    # nn.MultiheadAttention never calls out_proj; in eval mode without autograd the fused
    # fast path runs none of a TransformerEncoderLayer's Python code (README, PyTorch models).
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    x = torch.randn(2, 5, 8)
    targets = ["", "self_attn", "linear1", "self_attn.out_proj"]
    with torch.no_grad(), record(layer, targets) as rec:
        y = layer(x)
    assert rec.keys() == [":forward:return"] and torch.equal(rec[":forward:return"], y)
    hooked = []  # (a forward hook on a submodule turns the fast path off)
    layer.linear1.register_forward_hook(lambda module, args, out: hooked.append(out.detach().clone()))
    with record(layer, targets) as rec:
        y = layer(x)
    assert rec.keys() == ["self_attn:forward:return", "linear1:forward:return", ":forward:return"]
    assert torch.equal(rec["linear1:forward:return"], hooked[0]) and torch.allclose(rec[":forward:return"], y)


def test_clear_drops_the_gradients_still_to_come_of_the_values_it_dropped():
    # A backward after clear() added the cleared values' gradients: two gradients for one
    # value (rec.all(...grad)[0] was the cleared one's), a parameter's with no value at all.
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
    x1, x2 = torch.randn(2, 3), torch.randn(2, 3)
    with record(net, ["0:forward:return.grad", "0:forward:self.weight.grad"]) as rec:
        y1 = net(x1)
        rec.clear()
        y2 = net(x2)
        net.zero_grad()
        (3 * y2.sum()).backward()
        (y1.sum()).backward()  # the cleared value's backward: nothing recorded
    assert len(rec.all("0:forward:return")) == len(rec.all("0:forward:return.grad")) == 1
    assert torch.allclose(rec["0:forward:return.grad"], 3 * (1 - y2.detach() ** 2))
    expected = (3 * (1 - y2.detach() ** 2)).T @ x2  # d(3 sum tanh(W x2 + b))/dW
    assert torch.allclose(rec["0:forward:self.weight.grad"], expected)
    with record(net, ["0:forward:self.weight.grad"]) as rec:
        y1 = net(x1)
        rec.clear()
        y1.sum().backward()
    assert rec.keys() == [] and net[0].weight._backward_hooks is None


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"copy": "detach"},
        {"copy": "deepcopy"},
        {"grad": True},
        {"copy": "detach", "grad": True},  # (it kept the dead batched tensor)
        {"dtype": torch.float64},
    ],
)
def test_values_recorded_inside_vmap_are_the_whole_batch_batch_dimension_first(options):
    # They were vmap's batched tensors, dead once vmap returned: every op on them raised,
    # and an ensemble's (stack_module_state) looked like one model's values.
    model, x = _mlp(), torch.randn(5, 3)
    with bcrecord.torch.record(model, ["0", "1"], **options) as rec:
        torch.func.vmap(model, in_dims=1)(x.t())  # (vmap's dimension is not the first here)
    dtype = options.get("dtype", torch.float32)
    assert rec["0:forward:return"].dtype == dtype
    assert torch.allclose(rec["0:forward:return"], model[0](x).to(dtype))
    assert torch.allclose(rec["1:forward:return"], model[1](model[0](x)).to(dtype))
    # vmap of vmap: each vmap's dimension first, the outermost first.
    grid = torch.randn(2, 3, 5)  # (3: the features; 2 and 5: the vmaps' dimensions)
    with bcrecord.torch.record(model, ["0"], **options) as rec:
        torch.func.vmap(torch.func.vmap(model, in_dims=1), in_dims=0)(grid)
    expected = model[0](grid.transpose(1, 2))  # [2, 5, 4]
    assert rec["0:forward:return"].shape == (2, 5, 4)
    assert torch.allclose(rec["0:forward:return"], expected.to(dtype))


class _ThreeValues(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4))

    def forward(self, x, y):
        by_x = x * 3  # batched by the inner vmap only
        by_y = y * 5  # by the outer one only
        by_none = self.w * 2  # by neither
        return (by_x + by_y + by_none).sum()


@pytest.mark.parametrize("options", [{}, {"copy": "detach"}, {"reduce": lambda t: t * 1}])
def test_a_value_recorded_inside_vmap_that_a_vmap_does_not_batch_is_repeated_over_its_batch(options):
    # As vmap returns such a value: c of shape (2, 5, 4), though it depends on y alone. It was
    # recorded without that vmap's dimension (c: (2, 4), d: (5, 4), the weight's: (4,)): one
    # key's first dimension was the outer vmap's, another's the inner one's.
    model, x, y = _ThreeValues(), torch.randn(5, 4), torch.randn(2, 4)

    def run(a, b):
        model(a, b)
        return a * 3, b * 5, model.w * 2

    grid = torch.func.vmap(torch.func.vmap(run, in_dims=(0, None)), in_dims=(None, 0))
    with bcrecord.torch.record(
        model, [":forward:by_x", ":forward:by_y", ":forward:by_none"], **options
    ) as rec:
        returned = grid(x, y)
    for name, by_vmap in zip(["by_x", "by_y", "by_none"], returned, strict=True):
        assert by_vmap.shape == (2, 5, 4)
        assert torch.equal(rec[f":forward:{name}@0"], by_vmap.detach())
    # Under one vmap: the weight's product is repeated over its batch of 5.
    with bcrecord.torch.record(model, [":forward:by_none"], **options) as rec:
        torch.func.vmap(model, in_dims=(0, None))(x, y[0])
    assert torch.equal(rec[":forward:by_none@0"], (model.w * 2).detach().expand(5, 4))
    if not options:  # its gradient: one tensor's for the whole batch, summed over it (as documented)
        with bcrecord.torch.record(model, [":forward:by_none.grad"]) as rec:
            torch.func.vmap(model, in_dims=(0, None))(x, y[0]).sum().backward()
        assert torch.equal(rec[":forward:by_none@0.grad"], torch.full((4,), 5.0))


def test_a_value_recorded_inside_jacfwd_or_hessian_is_the_forward_s_not_repeated_over_its_basis():
    # jacfwd maps a jvp over its basis (one vmap level around a jvp): the forward's values were
    # repeated once per input element, (100, 8) for a layer's (8,), as its aux value is not.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(100, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x = torch.randn(100)
    with bcrecord.torch.record(model, ["0"]) as rec:
        _, aux = torch.func.jacfwd(lambda a: (model(a), model[0](a)), has_aux=True)(x)
    assert rec["0:forward:return"].shape == aux.shape == (8,)
    assert torch.allclose(rec["0:forward:return"], model[0](x))
    with bcrecord.torch.record(model, ["0"]) as rec:
        torch.func.hessian(model)(x)
    assert torch.allclose(rec["0:forward:return"], model[0](x))


def test_vmap_with_a_chunk_size_records_each_chunk_s_batch_as_a_value():
    model, x = _mlp(), torch.randn(5, 3)
    with bcrecord.torch.record(model, ["0"], keep="all") as rec:
        torch.func.vmap(model, chunk_size=2)(x)
    values = rec.all("0:forward:return")
    assert [tuple(value.shape) for value in values] == [(2, 4), (2, 4), (1, 4)]
    assert torch.allclose(torch.cat(values), model[0](x))


def test_stop_after_last_runs_a_forward_called_inside_a_torch_func_transform_whole():
    # A stopped forward returns None: vmap raised its own "must only return Tensors, got
    # NoneType", and grad's loss was None.
    model, x = _mlp(), torch.randn(5, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (no "stop held back" warning: it never stops there)
        with bcrecord.torch.record(model, ["0", "1"], stop_after_last=True) as rec:
            out = torch.func.vmap(model)(x)
    assert torch.allclose(out, model(x))
    assert torch.allclose(rec["1:forward:return"], model[1](model[0](x)))
    params = {name: p.detach() for name, p in model.named_parameters()}
    with bcrecord.torch.record(model, ["0"], stop_after_last=True) as rec:
        grads = torch.func.grad(lambda p: torch.func.functional_call(model, p, (x,)).sum())(params)
    model.zero_grad()
    model(x).sum().backward()
    assert torch.allclose(grads["0.weight"], model[0].weight.grad)
    assert torch.allclose(rec["0:forward:return"], model[0](x))
    # Outside a transform it still stops: the forward returns None.
    with bcrecord.torch.record(model, ["0"], stop_after_last=True):
        assert model(x) is None


@pytest.mark.parametrize("in_dims", [0, 1])
def test_a_gradient_of_a_value_recorded_inside_vmap_is_the_whole_batch_s(in_dims):
    # A backward outside vmap records it, in the value's layout (batch first). The batched tensor
    # requires no grad: none was recorded, and the error blamed torch.no_grad().
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    x = torch.randn(5, 4) if in_dims == 0 else torch.randn(4, 5)
    with record(model, ["0:forward:return.grad", "0:forward:self.weight.grad"]) as rec:
        torch.func.vmap(model, in_dims=in_dims)(x).sum().backward()
    rows = x if in_dims == 0 else x.T
    hidden = model[0](rows)
    hidden.retain_grad()
    model[2](model[1](hidden)).sum().backward()
    assert rec["0:forward:return"].shape == rec["0:forward:return.grad"].shape == (5, 3)
    assert torch.allclose(rec["0:forward:return.grad"], hidden.grad)
    assert rec["0:forward:self.weight.grad"].shape == (3, 4)


def test_a_parameter_s_gradient_asked_after_a_backward_outside_the_block_says_no_backward_ran_inside():
    # It said no backward had reached it "yet": none ever would (its hook goes with the block).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    with record(model, ["0:forward:return.grad", "0:forward:self.weight.grad"]) as rec:
        out = model(torch.randn(2, 4))
    out.sum().backward()
    assert rec["0:forward:return.grad"].shape == (2, 3)  # an activation's: after the block too
    with pytest.raises(KeyError) as caught:
        rec["0:forward:self.weight.grad"]
    assert "it is a leaf (a parameter), whose gradient only a backward inside the block records" in str(
        caught.value
    )


def test_a_reduce_under_autocast_runs_on_the_value_as_recorded_as_its_gradient_s_does():
    # It ran in bfloat16 (gram of a float32 input, inexact), its gradient's reduce in float32.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    x = torch.randn(4, 8)

    def gram(t):
        return t @ t.T

    targets = ["0:forward:input", "0:forward:self.weight", "0:forward:self.weight.grad"]
    with record(model, targets, reduce=gram) as rec:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        assert out.dtype == torch.bfloat16  # (the model's own ops are cast)
        out.float().sum().backward()
    assert rec["0:forward:input"].dtype == torch.float32
    assert torch.equal(rec["0:forward:input"], gram(x))
    assert torch.equal(rec["0:forward:self.weight"], gram(model[0].weight.detach()))
    assert rec["0:forward:self.weight.grad"].dtype == rec["0:forward:self.weight"].dtype


def test_a_reduce_inside_vmap_sees_the_whole_batch_and_an_ensembles_values_are_per_model():
    model, x = _mlp(), torch.randn(5, 3)
    with bcrecord.torch.record(model, ["0"], reduce=lambda t: t.mean(0)) as rec:
        torch.func.vmap(model)(x)
    assert torch.allclose(rec["0:forward:return"], model[0](x).mean(0))  # as without vmap
    models = [_mlp() for _ in range(3)]
    for k, member in enumerate(models):
        torch.nn.init.constant_(member[0].bias, float(k))
    params, buffers = torch.func.stack_module_state(models)
    base = models[0]

    def ensemble(params, buffers, x):
        return torch.func.functional_call(base, (params, buffers), (x,))

    with bcrecord.torch.record(base, ["0"]) as rec:
        torch.func.vmap(ensemble, in_dims=(0, 0, None))(params, buffers, x)
    assert rec["0:forward:return"].shape == (3, 5, 4)
    assert torch.allclose(rec["0:forward:return"], torch.stack([member[0](x) for member in models]).detach())


def test_values_recorded_inside_torch_func_grad_are_plain_tensors_that_save(tmp_path):
    # They were grad's wrapper tensors: arithmetic worked after the transform, but
    # torch.save, pickle and bcrecord.save raised "Cannot access storage of TensorWrapper".
    model, x = _mlp(), torch.randn(5, 3)
    with bcrecord.torch.record(model, ["0", "0:forward:return.grad"]) as rec:
        torch.func.grad(lambda x: model(x).sum())(x)
    # Under a vmap of grad (per-example gradients) too.
    with bcrecord.torch.record(model, ["1"]) as per_example:
        torch.func.vmap(torch.func.grad(lambda row: model(row).sum()))(x)
    hidden = model[0](x).detach()
    assert torch.equal(rec["0:forward:return"], hidden)
    assert torch.allclose(per_example["1:forward:return"], hidden.relu())
    assert torch.equal(pickle.loads(pickle.dumps(rec["0:forward:return"])), hidden)
    bcrecord.save(rec, str(tmp_path))
    (saved,) = bcrecord.load(str(tmp_path))["0:forward:return"]
    assert torch.equal(saved, hidden)
    # The gradient of the sum through the ReLU and the last Linear: relu'(h) * w2.
    expected = (hidden > 0).float() * model[2].weight.detach()
    assert torch.allclose(rec["0:forward:return.grad"], expected)


def test_the_instances_of_a_class_share_one_reading_of_its_code_per_spec(net, monkeypatch):
    # Set-up reads each (spec, code) once: 16 Bottlenecks of resnet50 share their forward's.
    record_module = sys.modules["bcrecord.torch.record"]
    reads = []
    read = record_module._one_site_specs
    monkeypatch.setattr(record_module, "_one_site_specs", lambda *args: reads.append(args[2]) or read(*args))
    with record(net, ["blocks.*:forward:out", "blocks.*:forward:identity", "bn1"]) as rec:
        net(torch.randn(1, 3, 8, 8))
    assert sorted(reads) == ["Block.forward", "Block.forward", "_BatchNorm.forward"]
    keys = rec.keys_of("blocks.*:forward:out")
    assert len(keys) == 3 * len([key for key in keys if key.startswith("blocks.0:")]) > 3


@pytest.mark.parametrize(
    "targets, options",
    [
        (["0", "1:forward:input"], {}),
        (["0:forward:return.grad", "0:forward:self.weight.grad"], {}),
        (["0"], {"stop_after_last": True}),
    ],
    ids=["values", "gradients", "stop_after_last"],
)
def test_a_recording_kept_after_its_block_holds_its_values_not_the_model(targets, options):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    held = [weakref.ref(module) for module in model.modules()]
    with record(model, targets, **options) as rec:
        out = model(torch.randn(3, 4))
    del model, out
    gc.collect()
    assert [ref() for ref in held] == [None, None, None]
    assert rec["0:forward:return"].shape == (3, 4)


def test_a_model_class_and_recording_of_a_dropped_exec_namespace_are_freed():
    # A notebook-like namespace holds the class and the recording; the class's functions hold
    # the namespace. Nothing outside refers to them, so the cycle collector frees them all.
    source = (
        "class Cell(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.lin = torch.nn.Linear(4, 4)\n"
        "    def forward(self, x):\n"
        "        h = self.lin(x)\n"
        "        return h\n"
        "model = Cell()\n"
        "with record(model, [':forward:h']) as rec:\n"
        "    model(torch.ones(2, 4))\n"
    )
    namespace = {"torch": torch, "record": record}
    exec(source, namespace)
    assert namespace["rec"][":forward:h@0"].shape == (2, 4)
    held = [weakref.ref(namespace[name]) for name in ("Cell", "model", "rec")]
    del namespace
    gc.collect()
    assert [ref() for ref in held] == [None, None, None]


class _Hidden(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        y = torch.relu(h)
        return y


@pytest.mark.parametrize(
    "make, target, copy",
    [
        (lambda: torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()), "0:forward:return", "none"),
        (lambda: torch.nn.Sequential(_Hidden(), _Hidden()), "0:forward:h@0", "clone"),
    ],
    ids=["kept as it is", "cloned"],
)
def test_a_gradient_no_backward_came_for_leaks_neither_the_recording_nor_the_model(make, target, copy):
    # The gradient hook waits on the activation, which the recording holds: through the
    # autograd graph (C++, unseen by the cycle collector) a hook holding the recording
    # kept both, and the model, for good.
    model = make()
    with record(model, [target + ".grad"], copy=copy) as rec:
        model(torch.randn(3, 4)).sum()
    held = [weakref.ref(rec), weakref.ref(model), weakref.ref(rec[target])]
    del model, rec
    gc.collect()
    assert [ref() for ref in held] == [None, None, None]


def test_a_gradient_reaches_a_recording_kept_after_its_block_and_nothing_once_it_is_dropped():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    x = torch.randn(3, 4)
    with record(model, ["0:forward:return.grad"], copy="none") as rec:
        out = model(x)
    out.sum().backward()  # after the block: the kept recording gets it
    assert torch.allclose(rec["0:forward:return.grad"], 1 - torch.tanh(model[0](x)).pow(2))
    with record(model, ["0:forward:return.grad"], copy="none") as rec:
        out = model(x)
    del rec
    model.zero_grad()
    out.sum().backward()  # its hook finds no recording: backward runs as usual
    expected = ((1 - torch.tanh(model[0](x)).pow(2)).t() @ x).detach()
    assert torch.allclose(model[0].weight.grad, expected, atol=1e-6)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("lock", ["_marks_lock", "_roots_lock", "_grad_lock"])
def test_a_child_forked_while_another_thread_holds_a_lock_of_the_torch_layer_records_and_does_not_hang(
    net, lock
):
    # Paths are marked under _marks_lock, the early stop's root is put in under _roots_lock, a
    # gradient is noted under its recording's _grad_lock: a child forked while another
    # thread held one waited for it for good.
    net.train()
    x = torch.ones(1, 3, 8, 8)
    with record(net, ["fc:forward:return", "fc:forward:return.grad"], grad=True) as outer:
        expected = net(x)

        def in_child():
            torch.set_num_threads(1)  # (a forked child's OpenMP pool, as a DataLoader worker's)
            with record(net, ["blocks.0"], stop_after_last=True) as rec:
                net(x)
            net(x).sum().backward()
            return len(rec.all("blocks.0:forward:return")), outer.all("fc:forward:return.grad")[-1].tolist()

        module = sys.modules["bcrecord.torch.record"]
        held = outer._grad_lock if lock == "_grad_lock" else getattr(module, lock)
        assert fork_while_held(held, in_child) == "(1, [[1.0, 1.0, 1.0, 1.0, 1.0]])"
    assert torch.equal(outer["fc:forward:return"], expected)


def test_an_interrupt_at_any_call_of_a_stopping_forward_leaves_no_stop_state_behind():
    # What a signal handler raises (a Ctrl-C, a timeout) between the forward's setting of its
    # context variables and their reset (at any call it makes there) left them set: a later
    # record(stop_after_last=True) of another model, whose submodule was called on its own, had
    # StopForward raised into the program. (Interrupted at each place in turn: tests/interrupts.py.)
    record_module = sys.modules["bcrecord.torch.record"]
    where = calls_made_from(record_module._StopAtRoot.__call__.__code__)
    net, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.randn(1, 4)

    def stopped():
        with record(net, ["0"], stop_after_last=True):
            net(x)

    places, _ = interrupted(stopped, where)
    assert len(places) > 10
    for nth in range(1, len(places) + 1):
        interrupted(stopped, where, stop_at=nth)
        state = (
            record_module._stopping.get(),
            record_module._roots_running.get(),
            record_module._catching.get(),
        )
        assert state == (False, (), ()), nth
    other = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with record(other, ["0"], stop_after_last=True) as rec:
        assert other[0](x).shape == (1, 4)  # called on its own: runs on
        assert other(x) is None  # the model's own forward stops
    assert rec["0:forward:return"].shape == (1, 4)


def test_an_interrupt_anywhere_in_nested_stopping_blocks_is_raised_and_leaves_nothing_behind(monkeypatch):
    # Interrupted at each start of Python code of the torch layer's recording module in turn,
    # and of every generator. Two bugs: (1) checks that looked with any()/all() over a
    # generator left it unfinished, and it was closed at once, running its code again (3.10,
    # 3.11): what a signal handler raised there was printed ("Exception ignored in <genexpr>")
    # and lost, and the Ctrl-C did not stop the program. (2) Cut short as a block's exit began,
    # or as it began to take the model's stopping forward out, the block left the recording
    # entered, or that forward on the model: later blocks recorded, but never stopped.
    record_module = sys.modules["bcrecord.torch.record"]

    def where(frame, event, arg):
        code = frame.f_code
        generator = code.co_flags & CO_GENERATOR
        return event == "call" and (code.co_filename == record_module.__file__ or generator)

    net = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.nn.ReLU())
    x = torch.randn(1, 4)

    def stopped():
        with record(net, ["0.0"], stop_after_last=True) as outer:
            with record(net, ["0"], stop_after_last=True) as inner:
                assert net(x) is None
        return outer, inner

    lost = []
    monkeypatch.setattr(sys, "unraisablehook", lost.append)
    stopped()  # (planned: the places met from then on are the same each time)
    places, cut = interrupted(stopped, where)
    assert not cut and len(places) > 100
    for nth in range(1, len(places) + 1):
        assert interrupted(stopped, where, stop_at=nth) == (places[:nth], True), nth
        assert not bcrecord.runtime.is_active() and "forward" not in vars(net), nth
        assert record_module._MARK not in vars(net[0]) and record_module._MARK not in vars(net[0][0]), nth
    gc.collect()
    assert [type(each.exc_value).__name__ for each in lost] == []
    outer, inner = stopped()  # and they still stop
    assert torch.equal(inner["0:forward:return"], net[0](x))
    assert torch.equal(outer["0.0:forward:return"], net[0][0](x))


def test_an_interrupt_while_a_block_s_modules_are_unmarked_leaves_none_marked():
    # A timeout's exception as unmarking began left path markers in the modules' __dict__: saving
    # the idle model warned that it was being recorded.
    record_module = sys.modules["bcrecord.torch.record"]
    codes = (record_module._unmark_all.__code__, record_module._unmark_locked.__code__)

    def where(frame, event, arg):  # (inside the unmarking, and as it starts)
        return event in ("call", "c_return") and frame.f_code in codes

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            return torch.relu(h)

    net, x = torch.nn.Sequential(Block(), Block(), Block()), torch.randn(1, 4)

    def unmarked(stop_at=None):
        block = record(net, ["0:forward:h", "1", "2.fc"])
        block.__enter__()
        net(x)
        return interrupted(lambda: block.__exit__(None, None, None), where, stop_at)  # its exit, cut short

    places, _ = unmarked()
    assert len(places) > 5
    for nth in range(1, len(places) + 1):
        unmarked(nth)
        marked = [name for name, module in net.named_modules() if record_module._MARK in vars(module)]
        assert marked == [] and not any(id(m) in record_module._mark_counts for m in net.modules()), nth
    with record(net, ["1"]) as rec:
        net(x)
    assert torch.equal(rec["1:forward:return"], net[1](net[0](x)))


def test_a_core_recording_holding_a_tensor_in_the_autograd_graph_deep_copies():
    # copy.deepcopy raised torch's "Only Tensors created explicitly by the user (graph leaves)
    # support the deepcopy protocol" (a ModelRecording's did not): the copy was README's snapshot.
    import copy

    def f(x):
        y = x * 2
        return y

    w = torch.ones(2, requires_grad=True)
    with bcrecord.recording(copy="none") as rec, bcrecord.patch_function(f, ["y"]):
        f(w)
    live = rec[f"{__name__}:f:y@0"]
    kept = copy.deepcopy(rec)[f"{__name__}:f:y@0"]
    assert not live.is_leaf and kept.is_leaf and kept.requires_grad and torch.equal(kept, live)
    assert kept.untyped_storage().data_ptr() != live.untyped_storage().data_ptr()


@pytest.mark.parametrize("copy", ["detach", "none"])
def test_a_gradient_kept_uncopied_is_not_the_parameter_s_grad_that_later_backwards_change(copy):
    # Under 'detach' autograd took the recorded gradient as the parameter's .grad (nothing else
    # held it): a second backward added to it, zero_grad(set_to_none=False) zeroed it. So did a
    # view of it that a reduce kept, under 'none' too.
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            y = x * self.scale
            return y * 1.0

    torch.manual_seed(0)
    model, x = Scaled(), torch.randn(4, 3)
    targets = [":forward:self.scale.grad", ":forward:y@0.grad"]
    with record(model, targets, copy=copy, keep="all") as rec:
        model(x).sum().backward()
        model(x).sum().backward()  # accumulated, no zero_grad
    model.zero_grad(set_to_none=False)
    assert [g.tolist() for g in rec.all(":forward:self.scale.grad")] == [x.sum(0).tolist()] * 2
    assert [g.tolist() for g in rec.all(":forward:y@0.grad")] == [torch.ones(4, 3).tolist()] * 2
    model.zero_grad()  # (None: the first backward's gradient becomes .grad where nothing else holds it)
    with record(model, [":forward:self.scale.grad"], copy=copy, reduce=lambda t: t[:1]) as rec:
        model(x).sum().backward()
        model(x).sum().backward()
    assert rec[":forward:self.scale.grad"].tolist() == x.sum(0)[:1].tolist()
    assert torch.allclose(model.scale.grad, 2 * x.sum(0))  # (backward's own sums, unchanged)

    @dataclasses.dataclass
    class Head:
        first: torch.Tensor

    # A view inside what a reduce returns: nested containers, a dataclass.
    for reduce, first in (
        (lambda t: {"a": [t[:1]]}, lambda kept: kept["a"][0]),
        (lambda t: [Head(t[:1])], lambda kept: kept[0].first),
    ):
        model.zero_grad()
        with record(model, [":forward:self.scale.grad"], copy=copy, reduce=reduce) as rec:
            model(x).sum().backward()
            model(x).sum().backward()
        assert first(rec[":forward:self.scale.grad"]).tolist() == x.sum(0)[:1].tolist()

    class Lazy(Head):  # a field whose getter raises: never into backward
        @property
        def first(self):
            raise ValueError("the program's getter")

        @first.setter
        def first(self, value):
            self._first = value

    model.zero_grad()
    if copy == "none":  # (under 'detach' its copy reads the field first: an error of the recording)
        with record(model, [":forward:self.scale.grad"], copy=copy, reduce=lambda t: Lazy(t[:1])) as rec:
            model(x).sum().backward()
        assert torch.allclose(model.scale.grad, x.sum(0)) and isinstance(
            rec[":forward:self.scale.grad"], Lazy
        )


def test_only_an_early_stop_looks_for_a_distributed_wrapper_and_an_extractor_once(monkeypatch):
    # (A walk over every module: it was made at every record() set-up, where nothing asks.)
    record_module = sys.modules["bcrecord.torch.record"]
    walks = []
    real = record_module.syncs_gradients
    monkeypatch.setattr(record_module, "syncs_gradients", lambda model: walks.append(model) or real(model))
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    x = torch.ones(1, 2)
    with record(net, ["0"]) as rec:
        net(x)
    assert walks == [] and rec["0:forward:return"].shape == (1, 3)
    extractor = create_feature_extractor(net, ["1"])
    for _ in range(3):
        assert torch.equal(extractor(x)["1"], net[1](net[0](x)))
    assert walks == [net]  # at the first call, with the plan
    extractor.close()


def test_one_plan_looking_for_a_distributed_wrapper_holds_up_no_other(monkeypatch):
    # (functools.cached_property took one lock for every plan on Python 3.11: the second
    # plan waited for the first's walk, and a child forked meanwhile would wait forever.)
    record_module = sys.modules["bcrecord.torch.record"]
    real = record_module.syncs_gradients
    slow, inside = torch.nn.Sequential(torch.nn.Linear(2, 2)), threading.Event()
    release = threading.Event()

    def walk(model):
        if model is slow:
            inside.set()
            release.wait(10)
        return real(model)

    monkeypatch.setattr(record_module, "syncs_gradients", walk)
    first, second = (
        record_module.Plan(slow, ["0"]),
        record_module.Plan(torch.nn.Sequential(torch.nn.ReLU()), ["0"]),
    )
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(first.syncs))
    waiting.start()
    try:
        assert inside.wait(10)
        done = threading.Thread(target=lambda: answers.append(second.syncs))
        done.start()
        done.join(5)
        assert answers == [False] and not done.is_alive()  # the second plan's, while the first walks
    finally:
        release.set()
        waiting.join(10)
    assert answers == [False, False] and first.syncs is False
