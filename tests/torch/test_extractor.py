"""bcrecord.torch.extractor: the FX-free feature extractor and list_targets."""

import operator
import sys
import types
import warnings

import pytest
import torch

import bcrecord
from bcrecord.torch import create_feature_extractor, list_targets

from ..code_checks import collect_all, probes_in
from ..interrupts import calls_made_from, interrupted
from .models import Branchy, CallsMap, Gated, SmallNet, TwoLayers, reference_smallnet


def test_module_paths_and_locals_with_names():
    torch.manual_seed(0)
    net = SmallNet().eval()
    x = torch.randn(2, 3, 8, 8)
    expected = reference_smallnet(net, x)
    extractor = create_feature_extractor(
        net, {"bn1": "pre_relu", "blocks.2": "last_block", ":forward:x@4": "pooled"}
    )
    feats = extractor(x)
    assert list(feats) == ["pre_relu", "last_block", "pooled"]
    assert torch.allclose(feats["pre_relu"], expected["bn1"], atol=1e-6)
    assert torch.allclose(feats["last_block"], expected["blocks.2"], atol=1e-5)
    assert torch.allclose(feats["pooled"], expected["pooled"], atol=1e-5)
    assert isinstance(extractor, torch.nn.Module) and extractor.model is net


def test_list_form_and_globs_and_train_eval_nodes():
    net = SmallNet().eval()
    feats = create_feature_extractor(net, ["blocks.*"])(torch.randn(1, 3, 4, 4))
    assert list(feats) == ["blocks.0", "blocks.1", "blocks.2"]
    both = create_feature_extractor(net, train_return_nodes=["bn1"], eval_return_nodes=["fc"])
    # Starts in the model's mode, as torchvision's does, without changing the model.
    assert not both.training and list(both(torch.randn(1, 3, 4, 4))) == ["fc"]
    assert list(both.eval()(torch.randn(1, 3, 4, 4))) == ["fc"]
    assert list(both.train()(torch.randn(2, 3, 4, 4))) == ["bn1"]
    mixed = SmallNet().train()
    mixed.bn1.eval()
    assert create_feature_extractor(mixed, ["fc"]).training and not mixed.bn1.training


def test_early_stop_by_default_and_full_forward_on_request():
    net = SmallNet().eval()
    seen = []
    net.fc.register_forward_hook(lambda *a: seen.append(1))
    create_feature_extractor(net, ["blocks.0"])(torch.randn(1, 3, 4, 4))
    assert seen == []
    create_feature_extractor(net, ["blocks.0"], stop_early=False)(torch.randn(1, 3, 4, 4))
    assert seen == [1]


def test_loops_give_lists_and_unreached_targets_are_named():
    torch.manual_seed(3)
    model = Gated().eval()
    x = torch.randn(2, 4)
    feats = create_feature_extractor(model, [":forward:h@1"], stop_early=False)(x)
    steps = int(model.a(x).abs().sum() > 1.0) + 1
    assert (len(feats[":forward:h@1"]) if steps > 1 else 1) == steps
    never = (
        ":forward:out@1"
        if model(x).mean() * 0 == 0 and torch.tanh(model.a(x)).mean() > 0
        else ":forward:out@0"
    )
    with pytest.raises(RuntimeError, match="never reached"):
        create_feature_extractor(model, [never], stop_early=False)(x)


def test_a_module_replaced_after_the_first_call_is_named_in_the_error():
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    extractor = create_feature_extractor(net, ["2"])
    extractor(torch.ones(1, 2))
    net[2] = torch.nn.Linear(2, 1)  # the extractor resolved the old one
    with pytest.raises(RuntimeError, match=r"never reached \['2'\] \(the modules at \['2'\] are not those"):
        extractor(torch.ones(1, 2))


def test_an_extractor_whose_patched_code_was_set_anew_says_so_and_records_the_new_code_once_closed():
    # As IPython's autoreload does: the hint blamed a branch not taken, or the mode.
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)

        def forward(self, x):
            h = self.lin(x)
            return h + 1

    namespace = {}
    exec("def forward(self, x):\n    h = self.lin(x)\n    h = h * 100\n    return h + 1\n", namespace)
    model, x = torch.nn.Sequential(Block(), Block()), torch.ones(1, 3)
    extractor = create_feature_extractor(model, ["0:forward:h@0", "1"])
    extractor(x)
    Block.forward.__code__ = namespace["forward"].__code__
    with pytest.warns(bcrecord.RecordingWarning, match="code was replaced while it was patched"):
        with pytest.raises(RuntimeError) as raised:
            extractor(x)
    assert str(raised.value).endswith(
        "_once_closed.<locals>.Block.forward was set anew since this extractor patched it, as IPython's "
        "autoreload does: close the extractor, extractor.close(), and call it again)"
    )
    extractor.close()
    features = extractor(x)
    assert torch.equal(features["0:forward:h@0"], model[0].lin(x)) and torch.equal(features["1"], model(x))


def test_an_extractor_closed_during_its_call_says_so_and_works_at_the_next():
    # A bare KeyError: True (its outputs, cleared by close(), were read after the forward).
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2)).eval()
    extractor = create_feature_extractor(net, ["0", "2"])
    x = torch.ones(1, 2)
    extractor(x)
    handle = net[1].register_forward_pre_hook(lambda module, args: extractor.close())
    with pytest.raises(RuntimeError) as raised:
        extractor(x)
    assert str(raised.value) == (
        "this forward pass never reached ['2'] (this extractor was closed during the call, which took "
        "its patches out)"
    )
    handle.remove()
    features = extractor(x)
    assert torch.equal(features["0"], net[0](x)) and torch.equal(features["2"], net(x))


def test_an_extractor_closed_before_its_call_made_its_recording_says_so_and_works_at_the_next():
    # close() in another thread between the call's look-up of its plan and the making of its
    # recording: an internal SpecError ("only= names a patch that was removed").
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()).eval()
    extractor = create_feature_extractor(net, ["0"])
    x = torch.ones(1, 2)
    extractor(x)
    plan, patches, idle, outputs = next(iter(extractor._plans.values()))
    idle.clear()  # (every recording in a call in another thread: one is made)
    make = extractor._new_recording
    extractor._new_recording = lambda *args: (extractor.close(), make(*args))[1]
    with pytest.raises(
        RuntimeError, match=r"^this extractor was closed during the call, which took its patches out$"
    ):
        extractor(x)
    del extractor._new_recording
    assert torch.equal(extractor(x)["0"], net[0](x))


def test_two_threads_first_calls_of_an_extractor_patch_once_and_close_removes_it_all(monkeypatch):
    # Both first calls planned and patched; the first set of patches was lost from the
    # extractor's table, and close() left it in place (a later recording ran probed code).
    import threading

    from bcrecord.torch.record import Plan

    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()).eval()
    extractor = create_feature_extractor(net, ["0"])
    planned, patches = [], []
    patching, second_planning = threading.Event(), threading.Event()
    new_plan, patch = extractor._new_plan, Plan.patch

    def planning(nodes):
        planned.append(nodes)
        if len(planned) == 2:
            second_planning.set()
        return new_plan(nodes)

    def slow_patch(self, *args, **kwargs):
        if not patching.is_set():
            patching.set()
            # The other first call plans meanwhile, unless it waits for this one (the lock).
            second_planning.wait(0.3)
        made = patch(self, *args, **kwargs)
        patches.extend(made)
        return made

    extractor._new_plan = planning
    monkeypatch.setattr(Plan, "patch", slow_patch)
    features = {}

    def call(k):
        features[k] = extractor(torch.full((1, 2), float(k)))["0"]

    threads = [threading.Thread(target=call, args=(k,)) for k in (1, 2)]
    threads[0].start()
    assert patching.wait(10)
    threads[1].start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    assert len(planned) == 1
    assert [features[k].tolist() for k in (1, 2)] == [
        net[0](torch.full((1, 2), float(k))).tolist() for k in (1, 2)
    ]
    assert patches == [p for _, ps, _, _ in extractor._plans.values() for p in ps]
    extractor.close()
    assert patches and not any(p.active for p in patches)


def test_a_module_s_instance_patched_after_the_first_call_is_named_in_the_error():
    # The hint blamed a branch not taken, or train and eval modes.
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1)).eval()
    extractor = create_feature_extractor(net, ["2"])
    x = torch.ones(1, 2)
    assert torch.equal(extractor(x)["2"], net(x))
    with bcrecord.patch_method(net[2], "forward", "return", name="mine"):
        with pytest.raises(RuntimeError) as raised:
            extractor(x)
    assert str(raised.value) == (
        "this forward pass never reached ['2'] (the forward of the module at '2' is set on the instance, "
        "by a patch of that module or an assignment, and runs instead of its class's, which this "
        "extractor records: remove it)"
    )
    assert torch.equal(extractor(x)["2"], net(x))  # removed: recorded again


def test_a_reduce_dict_may_name_a_glob_the_return_nodes_give_as_record_takes_it():
    # The extractor expands globs before it plans: 'reduce names targets that are not recorded'.
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3), torch.nn.ReLU())
    x = torch.ones(2, 3)
    total = lambda t: t.sum()  # noqa: E731
    features = create_feature_extractor(net, ["[01]", "2"], reduce={"[01]": total, "1": None, "2": total})(x)
    assert features["0"].dim() == 0 and features["1"].shape == (2, 3) and features["2"].dim() == 0
    with pytest.raises(bcrecord.SpecError, match=r"reduce names targets that are not recorded: \['\[12\]'\]"):
        create_feature_extractor(net, ["[01]"], reduce={"[12]": total})(x)


def test_a_target_reached_but_not_recorded_says_why():
    net = SmallNet().eval()

    def broken(t):
        raise ValueError("no such statistic")

    extractor = create_feature_extractor(net, ["bn1", "fc"], reduce={"bn1": broken})
    with (
        pytest.warns(bcrecord.RecordingWarning),
        pytest.raises(
            RuntimeError, match=r"reached but could not record 'bn1' \(ValueError: no such statistic\)"
        ),
    ):
        extractor(torch.randn(1, 3, 8, 8))


@pytest.mark.parametrize("stop_early", [True, False])
def test_a_target_one_of_whose_values_could_not_be_recorded_says_so(stop_early):
    # The others were given as if whole: a shorter list, or with the early stop the loop's next
    # turn's value as the first (a warning on the extractor's first call only).
    class Loop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(3)])

        def forward(self, x):
            for block in self.blocks:
                h = torch.relu(block(x))
                x = h
            return x

    seen = []

    def first_fails(t):
        seen.append(t)
        if len(seen) == 1:
            raise ValueError("boom")
        return t

    extractor = create_feature_extractor(Loop(), [":forward:h"], reduce=first_fails, stop_early=stop_early)
    for _ in range(2):
        seen.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", bcrecord.RecordingWarning)
            with pytest.raises(
                RuntimeError, match=r"reached but could not record ':forward:h' \(ValueError: boom\)$"
            ):
                extractor(torch.randn(2, 4))
        assert len(seen) == (2 if stop_early else 3)  # (it ran on to the next value, or to the end)


def test_copy_detach_given_to_an_extractor_detaches_its_features():
    # With the extractor's grad=True, 'detach' kept each tensor itself, in the graph. (Not copied,
    # as 'detach' says: the in-place ReLU after it shows.)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(inplace=True), torch.nn.Linear(4, 1))
    x = torch.randn(8, 4)
    first = create_feature_extractor(net, ["0", "2"], copy="detach")(x)["0"]
    assert not first.requires_grad and first.grad_fn is None
    assert torch.equal(first, torch.relu(net[0](x)).detach())
    kept = create_feature_extractor(net, ["0", "2"], copy="detach", grad=True)(x)["0"]
    assert kept.requires_grad  # as given: the tensor itself, in the graph


def test_features_keep_their_graph_as_torchvision_s_do():
    torch.manual_seed(0)
    net = SmallNet().train()
    x = torch.randn(2, 3, 8, 8)
    features = create_feature_extractor(net, ["blocks.1"], stop_early=False)(x)
    features["blocks.1"].sum().backward()  # a head trained on the features trains the backbone
    through_extractor = net.stem.weight.grad.clone()
    net.zero_grad()
    net.blocks[1](net.blocks[0](net.relu(net.bn1(net.stem(x))))).sum().backward()
    assert torch.allclose(through_extractor, net.stem.weight.grad, atol=1e-5)
    detached = create_feature_extractor(net, ["blocks.1"], grad=False)(x)["blocks.1"]
    assert not detached.requires_grad and torch.allclose(detached, features["blocks.1"])


def test_a_module_path_gives_the_first_call_as_torchvision_names_it():
    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.act = torch.nn.Tanh()

        def forward(self, x):
            h = self.act(x)
            h = self.act(h * 10)
            return h

    x = torch.tensor([0.5])
    first, second = torch.tanh(x), torch.tanh(torch.tanh(x) * 10)
    for stop_early in (True, False):
        features = create_feature_extractor(Twice(), ["act", "act_1"], stop_early=stop_early)(x)
        assert torch.equal(features["act"], first) and torch.equal(features["act_1"], second)
    loop = create_feature_extractor(Twice(), [":forward:h"], stop_early=False)(x)[":forward:h"]
    assert [v.item() for v in loop] == [first.item(), second.item()]  # a local in a loop: every value


def test_a_module_path_that_torchvision_gives_an_earlier_op_is_read_as_the_module_with_a_warning():
    class Clash(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.relu = torch.nn.ReLU()

        def forward(self, x):
            x = torch.relu(x - 1)  # torchvision: 'relu'
            return self.relu(x + 0.5)  # torchvision: 'relu_1'

    x = torch.tensor([[0.0, 3.0]])
    message = (
        r"return node 'relu' is a module path: bcrecord returns that module's output, but "
        r"torchvision's node 'relu' may be ':forward:torch\.relu\(\)@0', which runs before"
    )
    with pytest.warns(bcrecord.RecordingWarning, match=message) as caught:
        features = create_feature_extractor(Clash(), ["relu", "relu_1", ":forward:torch.relu()@0"])(x)
    assert len(caught) == 1
    assert features["relu"].tolist() == features["relu_1"].tolist() == [[0.5, 2.5]]
    assert features[":forward:torch.relu()@0"].tolist() == [[0.0, 2.0]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the module's call first: the same node either way
        create_feature_extractor(SmallNet(), ["bn1", "blocks.0.relu"])


def test_a_module_path_to_a_module_with_forward_hooks_says_torchvision_returns_what_they_return():
    # It went unsaid: torchvision's GraphModule calls the module, hooks and all; here the value
    # is what its forward returns (see bcrecord.torch.targets).
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), torch.ones(1, 2)
    model[0].register_forward_hook(lambda module, args, out: out + 100)
    with pytest.warns(bcrecord.RecordingWarning) as caught:
        extractor = create_feature_extractor(model, ["0", "1"])
    assert [str(w.message) for w in caught] == [
        "return node '0': the Linear there has forward hooks; bcrecord returns what its forward "
        "returns, before them, where torchvision's node is what they return (the same where they "
        "return None)"
    ]
    features = extractor(x)
    assert torch.allclose(features["0"], model[0].forward(x))
    assert torch.allclose(features["1"], (model[0].forward(x) + 100).relu())


def test_forward_hooks_that_only_return_none_change_nothing_and_raise_no_warning():
    # transformers leaves such hooks on every layer once output_hidden_states=True has
    # collected from it: torchvision's node is the module's output all the same.
    model, x = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()), torch.ones(1, 2)
    collected = []

    def collect(module, args, output):
        if output is None:
            return
        collected.append(output)

    model[0].register_forward_hook(collect)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        features = create_feature_extractor(model, ["0"])(x)
    model(x)  # what the hook saw, the module's output
    assert torch.equal(features["0"], collected[-1]) and torch.equal(features["0"], model[0].forward(x))
    model[0].register_forward_hook(lambda module, args, out: out * 2)  # this one may replace it
    with pytest.warns(bcrecord.RecordingWarning, match="the Linear there has forward hooks"):
        create_feature_extractor(model, ["0"])


def test_module_paths_torchvision_numbers_otherwise_are_read_as_the_module_with_a_warning():
    class Numbered(torch.nn.Module):  # ViT's EncoderBlock: ln_1, ln_2
        def __init__(self):
            super().__init__()
            self.ln_1 = torch.nn.LayerNorm(2)
            self.ln_2 = torch.nn.LayerNorm(2)

        def forward(self, x):
            return self.ln_2(self.ln_1(x) * 3)

    model = Numbered()
    x = torch.tensor([[0.0, 1.0]])
    with pytest.warns(bcrecord.RecordingWarning, match=r"its node 'ln_1' may be ':forward:self\.ln_2\(\)@0'"):
        features = create_feature_extractor(model, ["ln", "ln_1"])(x)
    assert torch.equal(features["ln"], model.ln_1(x)) and torch.equal(features["ln_1"], model.ln_1(x))
    model.ln_0 = model.ln_1  # torchvision's numbers start at _1: it has no node 'ln_0'
    with pytest.warns(bcrecord.RecordingWarning) as caught:
        create_feature_extractor(model, ["ln_0"])
    said = [str(w.message) for w in caught]
    assert len(said) == 2 and "it may have no node 'ln_0'" in said[0]
    # Its calls as 'ln_1' record under 'ln_0' too (this used to go unsaid):
    assert said[1].startswith("'ln_0' is another name of the LayerNorm at 'ln_1' (one object)")

    class Block(torch.nn.Module):
        def forward(self, x):
            return x + 1

    class Twice(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(self.block(x)) * 2

    message = "the module runs more than once in a forward"
    with pytest.warns(bcrecord.RecordingWarning, match=message) as caught:
        features = create_feature_extractor(Twice(), ["block"])(x)
    assert len(caught) == 1 and features["block"].tolist() == [[1.0, 2.0]]  # its first call's

    class EitherSide(Twice):  # ShuffleNet's blocks: one call on each side of an if/else
        def __init__(self, split):
            super().__init__()
            self.split = split

        def forward(self, x):
            if self.split:
                a, b = x.chunk(2, dim=1)
                out = torch.cat((a, self.block(b)), dim=1)
            else:
                out = torch.cat((x, self.block(x)), dim=1)
            return out * 2

    class BothSides(Twice):  # two ifs: both calls may run
        def forward(self, x):
            if x.shape[0] > 0:
                x = self.block(x)
            if x.shape[1] > 0:
                x = self.block(x)
            return x

    for split in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            features = create_feature_extractor(EitherSide(split), ["block"])(x)
        assert features["block"].tolist() == ([[2.0]] if split else [[1.0, 2.0]])
    with pytest.warns(bcrecord.RecordingWarning, match=message):
        create_feature_extractor(BothSides(), ["block"])


def test_a_module_shared_by_the_blocks_that_call_it_runs_more_than_once_and_is_warned_of():
    # timm's CoaT: its blocks hold one shared module each call. Only the calls of the parent
    # at the named path were counted: no warning, and a value other than torchvision's.
    class PositionEncoding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.proj(x) + x

    class Block(torch.nn.Module):
        def __init__(self, shared):
            super().__init__()
            self.pe = shared

        def forward(self, x):
            return self.pe(x) * 2

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.pe = PositionEncoding()
            self.blocks = torch.nn.Sequential(Block(self.pe), Block(self.pe))

        def forward(self, x):
            return self.blocks(x)

    torch.manual_seed(0)
    net, x = Net().eval(), torch.randn(2, 4)
    with pytest.warns(bcrecord.RecordingWarning, match="the module runs more than once in a forward"):
        features = create_feature_extractor(net, ["pe"])(x)
    assert torch.equal(features["pe"], net.pe(x))  # its first call's
    with pytest.raises(bcrecord.TargetError, match=r"no number 1; FX numbers the ops of each run of"):
        create_feature_extractor(net, ["pe.add_1"])


def test_a_node_naming_nothing_is_a_value_error_as_torchvision_s_with_fx_names_suggested():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(3, 3)

        def forward(self, x):
            out = self.fc(x)
            out += x
            return out

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.Sequential(Block())

        def forward(self, x):
            return self._body(x)

        def _body(self, x):
            return torch.flatten(self.blocks(x), 1)

    net = Net()
    # torchvision raises ValueError (code catching it stopped catching a LookupError)...
    with pytest.raises(ValueError) as caught:
        create_feature_extractor(net, ["flaten"])
    assert isinstance(caught.value, bcrecord.TargetError) and type(caught.value) is bcrecord.ReturnNodeError
    # ...and the FX names it would give are suggested (module paths only were).
    assert "the model has no submodule 'flaten'; did you mean 'flatten'?" in str(caught.value)
    with pytest.raises(bcrecord.ReturnNodeError, match=r"did you mean 'blocks.0.add', "):
        create_feature_extractor(net, {"blocks.0.ad": "f"})
    assert torch.equal(
        create_feature_extractor(net, ["flatten"])(torch.ones(1, 3))["flatten"], net(torch.ones(1, 3))
    )
    # A site a method lacks is one too (it was a plain TargetError, a LookupError).
    with pytest.raises(ValueError, match=r"'zz'"):
        create_feature_extractor(net, [":_body:zz"])

    # Only names that map are offered: no builtin (any(), getattr) nor a Python helper FX traces into.
    def helper(x):
        return x * 2

    class Guarded(torch.nn.Module):
        def forward(self, x):
            if any(d > 1 for d in x.shape):
                x = helper(x)
            return torch.relu(x)

    with pytest.raises(bcrecord.ReturnNodeError) as caught:
        create_feature_extractor(Guarded(), ["rel"])
    assert "did you mean 'relu'?" in str(caught.value) and "'any'" not in str(caught.value)
    assert "'helper'" not in str(caught.value)


def test_a_module_tracer_kwargs_make_a_leaf_is_not_warned_of_as_running_more_than_once(recwarn):
    # torchvision's node of a leaf module is its call's output, as bcrecord's: no warning.
    class Block(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x + 4)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block(self.block(x) - 1)

    net, x = Net(), torch.randn(2, 3)
    features = create_feature_extractor(net, ["block"], tracer_kwargs={"leaf_modules": [Block]})(x)
    assert torch.equal(features["block"], torch.relu(x + 4))
    assert not [w for w in recwarn if issubclass(w.category, bcrecord.RecordingWarning)]
    with pytest.warns(bcrecord.RecordingWarning, match="the module runs more than once in a forward"):
        create_feature_extractor(net, ["block"], tracer_kwargs={"leaf_modules": [torch.nn.ReLU]})
    with pytest.raises(TypeError, match=r"tracer_kwargs\['leaf_modules'\] must be a list of module classes"):
        create_feature_extractor(net, ["block"], tracer_kwargs={"leaf_modules": Block})


def test_no_clash_warning_where_the_module_is_called_first_through_a_first_argument_not_named_self():
    class Named(torch.nn.Module):
        def __init__(s):
            super().__init__()
            s.b0 = torch.nn.Linear(2, 2)
            s.relu = torch.nn.ReLU()

        def forward(s, x):
            return s.relu(s.b0(x))

    net, x = Named(), torch.ones(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the module's call is FX's 'b0' node: nothing to warn of
        features = create_feature_extractor(net, {"b0": "f0", "relu": "f1"})(x)
    assert torch.equal(features["f0"], net.b0(x)) and torch.equal(features["f1"], net.b0(x).relu())


def test_features_come_in_the_order_the_forward_reached_them_as_torchvision_s():
    net, x = SmallNet(), torch.randn(2, 3, 8, 8)
    for nodes in (["blocks.1", ":forward:x@0", "bn1"], {"blocks.1": "c", ":forward:x@0": "a", "bn1": "b"}):
        for stop_early in (True, False):
            features = create_feature_extractor(net, nodes, stop_early=stop_early)
            for _ in range(2):  # the first call and a later one (whose recording is reused)
                names = list(features(x))
                assert names == (
                    [":forward:x@0", "bn1", "blocks.1"] if isinstance(nodes, list) else ["a", "b", "c"]
                )


def test_bad_return_nodes():
    net = SmallNet()
    with pytest.raises(bcrecord.SpecError, match="names 3 targets"):
        create_feature_extractor(net, {"blocks.*": "b"})
    with pytest.raises(bcrecord.SpecError, match="return_nodes is required"):
        create_feature_extractor(net)
    with pytest.raises(bcrecord.TargetError, match="no submodule"):
        create_feature_extractor(net, ["nothere"])
    with pytest.raises(TypeError, match="return_nodes must be a list of module paths or targets"):
        create_feature_extractor(net, 7)
    with pytest.raises(bcrecord.SpecError, match=r"together \(eval_return_nodes is missing\)"):
        create_feature_extractor(net, train_return_nodes=["bn1"])
    with pytest.raises(TypeError, match="expected an nn.Module instance, got NoneType"):
        create_feature_extractor(None, ["bn1"])
    with pytest.raises(TypeError, match="expected an nn.Module instance, got NoneType"):
        list_targets(None)


def test_output_names_are_strings_as_torchvision_s_extractor_makes_them():
    # {'bn1': 1} returned the feature under the int 1, where torchvision's returns it under '1'
    # (it str()s every name), so code written for one read a KeyError from the other.
    torch.manual_seed(0)
    net = SmallNet().eval()
    x = torch.randn(2, 3, 8, 8)
    features = create_feature_extractor(net, {"bn1": 1, "blocks.2": None})(x)
    assert list(features) == ["1", "None"]
    assert torch.allclose(features["1"], reference_smallnet(net, x)["bn1"], atol=1e-6)
    with pytest.raises(bcrecord.SpecError, match=r"output names must be unique, got \['1', '1'\]"):
        create_feature_extractor(net, {"bn1": 1, "blocks.2": "1"})  # (torchvision's keeps one)


def test_list_targets_covers_every_submodule_without_tracing():
    net = SmallNet()
    targets = list_targets(net)
    paths = [t for t in targets if ":" not in t]
    assert paths == [name for name, _ in net.named_modules()]
    assert ":forward:x@5" in targets and "blocks.0:forward:out@3" in targets
    assert "blocks.0:forward:self.relu@0" in targets
    text = str(targets)
    assert text.splitlines()[0] == "<root>" and "    blocks.0:forward:identity@0" in text
    # every listed local/attribute target can be recorded
    sample = [t for t in targets if ":forward:" in t and "self." not in t][:12]
    with bcrecord.torch.record(net, sample) as rec:
        net(torch.randn(1, 3, 4, 4))
    assert len(rec) >= len([t for t in sample if not t.endswith("return")])
    # one method name, as a str: not its letters
    assert list_targets(net, "forward") == list_targets(net, ["forward"]) != paths
    # A misspelt method listed the paths alone, as if the model had no sites; a number failed in set().
    with pytest.raises(
        bcrecord.TargetError, match="no submodule defines 'forwrd' in Python; did you mean 'forward'"
    ):
        list_targets(net, ["forwrd"])
    with pytest.raises(TypeError, match="methods is a method name or a list of them, got 3"):
        list_targets(net, 3)
    assert list_targets(net, ["forwrd", "forward"]) == list_targets(net, "forward")  # one of them is there


def test_list_targets_displays_in_ipython_as_the_grouped_table():
    # A notebook cell ending in list_targets(net) showed the flat list of strings.
    targets = list_targets(torch.nn.Sequential(torch.nn.Linear(1, 1)))
    written = []
    # The part of IPython's pretty printer a _repr_pretty_ uses (its text method).
    targets._repr_pretty_(types.SimpleNamespace(text=written.append), False)
    assert written == [str(targets)]
    lines = written[0].splitlines()
    assert (lines[0], lines[1].startswith("    :forward:"), "0" in lines) == ("<root>", True, True)
    assert repr(targets) == repr(list(targets))  # a list still, for code that prints its repr


def test_extractor_patches_once_and_the_model_is_itself_between_calls():
    import copy
    import gc

    from bcrecord import patch as patch_module
    from bcrecord.runtime import is_active

    torch.manual_seed(1)
    net = SmallNet().eval()
    x = torch.randn(2, 3, 8, 8)
    expected = reference_smallnet(net, x)
    original_code = type(net.blocks[0]).forward.__code__
    collect_all()  # patches earlier tests left to the collector: not counted as this test's
    slots_before = len(patch_module._slots)
    extractor = create_feature_extractor(net, ["bn1", "blocks.2"])
    first = extractor(x)
    patches = [p for _, ps, _, _ in extractor._plans.values() for p in ps]
    assert patches and all(p.active for p in patches)
    second = extractor(x)
    assert [p for _, ps, _, _ in extractor._plans.values() for p in ps] == patches  # planned once
    for feats in (first, second):
        assert torch.allclose(feats["bn1"], expected["bn1"], atol=1e-6)
        assert torch.allclose(feats["blocks.2"], expected["blocks.2"], atol=1e-5)
    # Between calls: original code, no marker, no recording, same outputs.
    assert not is_active() and type(net.blocks[0]).forward.__code__ is original_code
    assert all("_bcrecord_path" not in m.__dict__ for m in net.modules())
    with bcrecord.recording() as outside:  # another recording sees nothing of the extractor's
        net(x)
    assert outside.keys() == []
    twin = copy.deepcopy(extractor)  # a copy plans for itself
    assert twin._plans == {} and torch.allclose(twin(x)["bn1"], first["bn1"])
    extractor.close()
    assert not any(p.active for p in patches) and extractor._plans == {}
    assert torch.allclose(extractor(x)["bn1"], first["bn1"])  # patches again
    del extractor, twin
    gc.collect()
    assert len(patch_module._slots) == slots_before  # garbage collection removed the rest


def test_outputs_wait_for_copies_still_in_flight():
    from .test_copies import FakeStream

    net = SmallNet().eval()
    x = torch.randn(2, 3, 8, 8)
    extractor = create_feature_extractor(net, ["bn1", "fc"], to="cpu")
    first = extractor(x)
    plan = extractor._plan(False)[0]
    stream = FakeStream()  # a copy from a GPU queued by the next call, as the probe would
    net.fc.register_forward_pre_hook(lambda *_: plan.policies[0]._pending.add(stream))
    second = extractor(x)
    assert stream.waits == 1 and not plan.policies[0]._pending
    assert torch.equal(first["fc"], second["fc"]) and first["fc"].device.type == "cpu"


def test_extractor_rejects_unknown_options_and_bad_values_at_once():
    with pytest.raises(TypeError, match="unknown option.*stop_after.*; an extractor's is stop_early=$"):
        create_feature_extractor(SmallNet(), ["bn1"], stop_after_last=True)
    net = SmallNet()
    bad = [
        ({"copy": "bogus"}, bcrecord.SpecError, "unknown copy policy 'bogus'"),
        ({"threads": "some"}, bcrecord.SpecError, "threads must be 'context' or 'all'"),
        ({"reduce": {"nosuch": abs}}, bcrecord.SpecError, r"reduce names targets that are not recorded"),
        ({"reduce": {"bn1": "mean"}}, TypeError, r"reduce\['bn1'\] must be a callable"),
        ({"dtype": torch.int8}, bcrecord.SpecError, "dtype= casts floating-point or complex values"),
        ({"dtype": "float16"}, TypeError, "dtype= takes a torch.dtype"),
        ({"to": "cpux"}, bcrecord.SpecError, "to= names no device: 'cpux'"),
        ({"to": 2.5}, TypeError, r"to= takes a device \('cpu', 'cuda:0', a torch.device\), not 2.5"),
        ({"grad": "no"}, bcrecord.SpecError, "grad is True or False, got 'no'"),
        ({"stop_early": "no"}, bcrecord.SpecError, "stop_early is True or False, got 'no'"),
    ]
    for options, error, words in bad:
        with pytest.raises(error, match=words):  # not at the first call
            create_feature_extractor(net, ["bn1"], **options)
    assert not any("forward" in vars(m) for m in net.modules())


def test_torchvision_s_tracing_arguments_are_taken_in_its_order_and_concrete_args_refused():
    # They were unknown options (a TypeError naming none of them as torchvision's).
    torch.manual_seed(0)
    net, x = SmallNet().eval(), torch.randn(2, 3, 8, 8)
    expected = reference_smallnet(net, x)
    leaves = {"leaf_modules": [torch.nn.BatchNorm2d]}
    extractor = create_feature_extractor(net, {"bn1": "pre_relu"}, None, None, leaves, True)
    assert torch.allclose(extractor(x)["pre_relu"], expected["bn1"], atol=1e-6)
    features = create_feature_extractor(net, ["bn1"], tracer_kwargs=leaves, suppress_diff_warning=True)(x)
    assert torch.allclose(features["bn1"], expected["bn1"], atol=1e-6)
    with pytest.raises(TypeError, match=r"tracer_kwargs must be a dict or None, got list"):
        create_feature_extractor(net, ["bn1"], tracer_kwargs=[torch.nn.BatchNorm2d])
    message = r"concrete_args fixes .* is traced here: .*pass them there \(extractor\(x, flag=\.\.\.\)\)$"
    with pytest.raises(TypeError, match=message):
        create_feature_extractor(net, ["bn1"], concrete_args={"flag": True})
    assert torch.allclose(create_feature_extractor(net, ["bn1"], concrete_args={})(x)["bn1"], expected["bn1"])
    with pytest.raises(TypeError, match=r"^suppress_diff_warning is True or False, got 'yes'$"):
        create_feature_extractor(net, ["bn1"], suppress_diff_warning="yes")
    assert not any("forward" in vars(m) for m in net.modules())


def test_a_call_leaves_nothing_for_the_cycle_collector():
    # Each call makes a recording; it and its values must go by reference counting
    # alone (they used to wait for the cyclic collector, holding the tensors).
    import gc

    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    extractor = create_feature_extractor(net, ["0", "1"])
    extractor(torch.ones(1, 2))  # the first call patches
    collect_all()  # (all of earlier tests' garbage: one pass left some to the calls below)
    gc.disable()
    try:
        for _ in range(3):
            feats = extractor(torch.ones(1, 2))
        assert sorted(feats) == ["0", "1"]
        del feats
        assert gc.collect() == 0
    finally:
        gc.enable()
        extractor.close()


def test_extractors_sharing_a_model_run_only_their_own_probes():
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    first = create_feature_extractor(net, ["0"], stop_early=False)
    second = create_feature_extractor(net, ["2"], stop_early=False)
    x = torch.ones(1, 2)
    first(x), second(x)  # both have patched Linear.forward now
    seen = []
    handle = net[0].register_forward_pre_hook(
        lambda m, a: seen.append(probes_in(torch.nn.Linear.forward.__code__))
    )
    try:
        with torch.no_grad():
            got = first(x)["0"], second(x)["2"]
            with bcrecord.recording():  # a recording taking every patch arms both
                first(x)
    finally:
        handle.remove()
        first.close(), second.close()
    assert seen == [1, 1, 2]
    assert torch.allclose(got[0], net[0](x)) and torch.allclose(got[1], net(x))
    assert probes_in(torch.nn.Linear.forward.__code__) == 0


def test_gradient_targets_are_refused_with_the_reason():
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    for nodes in ({"0:forward:return.grad": "h"}, ["2", "0:forward:return.grad"]):
        with pytest.raises(bcrecord.SpecError, match="before any gradient exists"):
            create_feature_extractor(net, nodes)


def test_threads_calling_one_extractor_each_get_their_own_values():
    import sys
    import threading

    torch.manual_seed(0)
    net = SmallNet().eval()
    extractor = create_feature_extractor(net, ["bn1", "blocks.1"])
    inputs = [torch.randn(1, 3, 8, 8) for _ in range(4)]
    expected = [reference_smallnet(net, x) for x in inputs]
    errors, barrier = [], threading.Barrier(len(inputs))

    def worker(n):
        try:
            barrier.wait()
            for _ in range(30):
                feats = extractor(inputs[n])
                assert torch.allclose(feats["bn1"], expected[n]["bn1"], atol=1e-6)
                assert torch.allclose(feats["blocks.1"], expected[n]["blocks.1"], atol=1e-5)
        except BaseException as error:
            errors.append(error)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(len(inputs))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    (_, _, idle, _) = extractor._plan(False)
    assert 1 <= len(idle) <= len(inputs)  # one recording per call running at once, reused
    assert all("_bcrecord_path" not in m.__dict__ for m in net.modules())
    extractor.close()


class _Looped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        for _ in range(3):
            h = self.fc(x)
            x = x + h
        return self.head(x)


def test_early_stop_gives_a_looped_target_s_first_value_whatever_else_is_asked():
    torch.manual_seed(0)
    net = _Looped()
    x = torch.randn(2, 4)
    first = net.fc(x).detach()
    alone = create_feature_extractor(net, {":forward:h@0": "h"})(x)
    with_head = create_feature_extractor(net, {":forward:h@0": "h", "head": "out"})(x)
    assert torch.allclose(alone["h"], first) and torch.allclose(with_head["h"], first)
    whole = create_feature_extractor(net, {":forward:h@0": "h", "head": "out"}, stop_early=False)(x)
    assert len(whole["h"]) == 3 and torch.allclose(whole["h"][0], first)


def test_an_extractor_of_an_extractor_stops_where_both_have_their_values():
    torch.manual_seed(0)
    x = torch.randn(2, 3)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 3), torch.nn.ReLU())
    inner = create_feature_extractor(net, {"2": "two"})
    outer = create_feature_extractor(inner, {"model.0": "zero"})
    assert torch.equal(outer(x)["zero"], net[0](x))
    nested = create_feature_extractor(create_feature_extractor(net, {"0": "zero"}), {"model.2": "two"})
    assert torch.equal(nested(x)["two"], net[2](net[1](net[0](x))))


class _Repeats(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 3)

    def forward(self, x):
        for _ in range(4):
            x = self.l(x)
        return x


def test_keep_never_drops_the_first_call_a_module_path_names():
    torch.manual_seed(0)
    net, x = _Repeats(), torch.randn(1, 3)
    first = net.l(x)
    calls = [first]
    for _ in range(3):
        calls.append(net.l(calls[-1]))
    for keep in ("all", 2, "last"):
        got = create_feature_extractor(net, {"l": "f", ":forward:x": "xs"}, stop_early=False, keep=keep)(x)
        assert torch.allclose(got["f"], first), keep
        kept = {"all": calls, 2: calls[-2:], "last": calls[-1]}[keep]
        assert torch.allclose(
            torch.stack(got["xs"]) if keep != "last" else got["xs"],
            torch.stack(kept) if keep != "last" else kept,
        )
    with pytest.raises(ValueError, match="keep must be 'all', 'last' or a positive int, got 0"):
        create_feature_extractor(net, ["l"], keep=0)


def test_a_value_another_thread_finishes_after_a_call_is_not_the_next_call_s():
    import threading

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3))
    copying, release = threading.Event(), threading.Event()
    late = threading.Thread(target=lambda: net(torch.ones(1, 3) * 100), name="late")

    # (Long timeouts: a loaded machine may take seconds; they only keep a broken gate from hanging.)
    def held_up(value):
        if threading.current_thread() is late:  # the raw model, called while the extractor runs
            copying.set()
            release.wait(60)
        elif not late.is_alive() and not copying.is_set():  # the first call: let the late one start
            late.start()
            copying.wait(60)
        return value

    extractor = create_feature_extractor(net, {"0": "out"}, reduce=held_up, threads="all")
    x1, x2 = torch.randn(1, 3), torch.randn(1, 3)
    assert torch.allclose(extractor(x1)["out"], net(x1))  # its value went to this call (threads='all')...
    release.set()  # ...and is stored only now, after the call
    late.join(60)
    assert not late.is_alive()  # done storing: the next call cannot get its value by lateness alone
    assert torch.allclose(extractor(x2)["out"], net(x2))  # not the late thread's value


def test_another_thread_running_the_model_meanwhile_adds_nothing_to_the_features():
    import threading

    net = torch.nn.Sequential(torch.nn.Linear(3, 3))
    extractor = create_feature_extractor(net, ["0"], grad=False)
    inside, done = threading.Event(), threading.Event()

    def other():  # the raw model, called while the extractor's call runs
        net(torch.full((1, 3), 100.0))
        done.set()

    def wait_for_it(module, args):
        if threading.current_thread() is threading.main_thread() and not inside.is_set():
            inside.set()
            threading.Thread(target=other).start()
            done.wait(60)  # (long: a loaded machine may take seconds to run the other thread)

    handle = net[0].register_forward_pre_hook(wait_for_it)
    x = torch.randn(1, 3)
    assert torch.equal(extractor(x)["0"], net[0](x))  # not the other thread's (it ran first)
    handle.remove()


def test_list_targets_leaves_out_paths_that_have_no_output():
    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(1, 1)])

        def forward(self, x):
            return self.blocks[0](x)

    listed = list_targets(Holder())
    assert "blocks" not in listed and not any(t.startswith("blocks:") for t in listed)
    assert "blocks.0" in listed and "blocks.0:forward:return" in listed
    features = create_feature_extractor(Holder(), [t for t in listed if ":" not in t])(torch.ones(1, 1))
    assert sorted(features) == ["", "blocks.0"]


def test_list_targets_leaves_out_the_path_of_a_module_whose_forward_only_raises():
    # JetMoe's JetMoeMoA.forward only raises (the model calls its map and reduce): its path
    # was listed, and record(model, list_targets(model)) refused it ("no return instruction").
    net, x = CallsMap(), torch.ones(1, 2)
    listed = list_targets(net)
    assert [t for t in listed if ":" not in t] == ["", "moa.lin"]
    assert "moa:forward:NotImplementedError()@0" in listed  # its sites stay
    with bcrecord.torch.record(net, listed) as rec:  # every listed target records
        out = net(x)
    assert torch.equal(rec["moa.lin:forward:return"], out) and torch.equal(rec[":forward:return"], out)


def test_list_targets_leaves_out_torchscript_submodules_and_what_is_inside_them():
    scripted = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU()))
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), scripted)
    listed = list_targets(net)
    assert [t for t in listed if ":" not in t] == ["", "0"]
    x = torch.ones(1, 3)
    with bcrecord.torch.record(net, listed) as rec:  # every listed target records
        out = net(x)
    assert torch.equal(rec[":forward:return"], out) and torch.equal(rec["0:forward:return"], net[0](x))
    with bcrecord.torch.record(net, ["*"]) as rec:  # a glob skips them too
        net(x)
    assert rec.keys() == ["0:forward:return"]
    with pytest.raises(bcrecord.NotPatchableError, match="at '1' is a TorchScript module"):
        with bcrecord.torch.record(net, ["1"]):  # named: refused, saying why
            pass
    with pytest.raises(bcrecord.TargetError, match="'1\\*' matches only .* or TorchScript modules"):
        with bcrecord.torch.record(net, ["1*"]):
            pass


def test_a_torchscript_model_is_refused_by_list_targets_and_patches_saying_it_is_torchscript():
    # list_targets listed nothing, silently; patch_method called a scripted forward a C function,
    # and told a traced one to patch torch's own descriptor class.
    class Net(torch.nn.Module):
        def forward(self, x):
            y = x + 1
            return y

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's, from torch 2.10 on
        scripted, traced = torch.jit.script(Net()), torch.jit.trace(Net(), torch.ones(1))
    for model in (scripted, traced):
        kind = type(model).__name__
        with pytest.raises(bcrecord.NotPatchableError, match=f"^{kind} at '<root>' is a TorchScript module"):
            list_targets(model)
        held = vars(model).get("forward")
        with pytest.raises(bcrecord.NotPatchableError) as raised:
            bcrecord.patch_method(model, "forward", "y")
        assert str(raised.value) == (
            f"this {kind} instance is a TorchScript module (torch.jit.script or trace made it): its "
            "'forward' runs TorchScript, not Python bytecode; patch the module it was made from, before "
            "scripting or tracing it"
        )
        assert vars(model).get("forward") is held
    with pytest.raises(bcrecord.NotPatchableError, match="Net.forward is a TorchScript method .*: its calls"):
        bcrecord.targets(scripted.forward)


def test_list_targets_leaves_out_sites_a_module_patch_cannot_probe_and_the_rest_all_record():
    # nn.MultiheadAttention.forward checks its arguments in generator expressions that
    # never use 'self': one patch of a class cannot tell its instances apart there.
    mha = torch.nn.MultiheadAttention(8, 2)
    listed = list_targets(mha)
    assert ":forward:self.in_proj_weight@0" in listed
    assert not any("_arg_requires_grad" in t or "x.transpose" in t for t in listed)
    q = torch.randn(3, 1, 8)
    with pytest.raises(bcrecord.TargetError, match="comprehension"):
        with bcrecord.torch.record(mha, [":forward:x.transpose()@0"]):
            pass
    with bcrecord.torch.record(mha, listed) as rec:  # the whole list records at once
        out, weights = mha(q, q, q)
    assert torch.equal(rec[":forward:return"][0], out) and torch.equal(rec[":forward:return"][1], weights)
    assert torch.equal(rec[":forward:self.in_proj_weight@0"], mha.in_proj_weight)


def test_a_recording_of_another_model_that_stops_early_holds_back_no_extractor():
    torch.manual_seed(0)
    other = torch.nn.Sequential(torch.nn.Linear(3, 3))
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(5, 1))  # its tail fails on x
    x = torch.randn(1, 3)
    with bcrecord.torch.record(other, ["0"], stop_after_last=True):
        features = create_feature_extractor(net, ["0"])(x)  # stops before the failing layer
    assert torch.allclose(features["0"], net[0](x))


def test_the_model_is_the_extractor_s_submodule_model_and_its_checkpoint_loads_there():
    net, other = SmallNet(), SmallNet()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    extractor = create_feature_extractor(net, ["bn1"])
    assert list(extractor.state_dict()) == [f"model.{k}" for k in net.state_dict()]
    extractor.model.load_state_dict(other.state_dict())  # as the docstring says
    pairs = zip(net.state_dict().values(), other.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_an_extractor_traces_with_torch_jit_trace_and_its_check():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(3, 3)

        def forward(self, x):
            h = self.a(x)
            return h.relu()

    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 3)
    for grad in (True, False):
        extractor = create_feature_extractor(model, ["a", ":forward:h"], grad=grad)
        # strict=False: the output is a dict. The check traces again under no_grad, and
        # needs the same graph (it differed where the copies depended on requires_grad).
        traced = torch.jit.trace(extractor, x, strict=False)
        out = traced(2 * x)
        assert torch.allclose(out["a"], model.a(2 * x)) and torch.allclose(out[":forward:h"], out["a"])
        assert out["a"].requires_grad is grad
        extractor.close()


def test_an_extractor_exports_with_torch_export_and_its_program_gives_the_features():
    torch.manual_seed(0)
    model, x = TwoLayers().eval(), torch.randn(3, 4)
    extractor = create_feature_extractor(model, {"a": "hidden"})
    # Under export the forward runs whole (export's tracer lost track of calls a stop unwound).
    program = torch.export.export(extractor, (x,))
    out = program.module()(2 * x)
    assert list(out) == ["hidden"] and torch.allclose(out["hidden"], model.a(2 * x))
    extractor.close()


@pytest.mark.parametrize("mode", ["real", "fake"])
def test_an_extractor_traces_with_make_fx_and_its_graph_gives_the_features(mode):
    # Its features go back into the trace (its outputs there): fake ones too, not refused as a
    # record() block refuses a tracer's stand-ins.
    from torch.fx.experimental.proxy_tensor import make_fx

    torch.manual_seed(0)
    model, x = TwoLayers().eval(), torch.randn(3, 4)
    extractor = create_feature_extractor(model, {"a": "hidden"})
    params = dict(extractor.named_parameters())
    graph = make_fx(lambda p, x: torch.func.functional_call(extractor, p, (x,)), tracing_mode=mode)(params, x)
    out = graph(params, 2 * x)
    assert list(out) == ["hidden"] and torch.allclose(out["hidden"], model.a(2 * x))
    with pytest.raises(torch.fx.proxy.TraceError, match="cannot be iterated"):
        torch.fx.symbolic_trace(extractor)  # its forward(*args): as the README says
    extractor.close()


class _Compares(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        h = self.lin(x)
        return torch.where(h > 0, -h, h * 2)


@pytest.mark.parametrize("node, symbol", [("gt", ">"), ("neg", "unary -")])
def test_fx_names_of_comparisons_and_unary_operators_are_refused_saying_so(node, symbol):
    model = _Compares()
    with pytest.raises(bcrecord.TargetError) as refused:
        create_feature_extractor(model, [node])
    said = str(refused.value)
    assert (
        f"is {node!r} a site bcrecord records: FX's node for a comparison or a unary operator ({symbol})"
        in said
    )
    assert "binary arithmetic operators only" in said
    x = torch.randn(2, 3)
    h = model.lin(x)
    assert torch.allclose(create_feature_extractor(model, ["mul"])(x)["mul"], h * 2)  # a binary one maps


class _NegBoth(torch.nn.Module):
    def forward(self, x):
        y = -x  # FX's 'neg'
        return torch.neg(y * 2.0)  # FX's 'neg_1'


class _GtBoth(torch.nn.Module):
    def forward(self, x):
        return (x > 0.0).float() + torch.gt(x, 0.5).float()  # 'gt', then 'gt_1'


class _EqBoth(torch.nn.Module):
    def forward(self, x):
        return (x == 1.0).float() + x.eq(0.25).float()


class _GetattrBoth(torch.nn.Module):
    def forward(self, x):
        n = x.shape[0]  # FX's 'getattr' (and 'getitem')
        return getattr(x, "mT") * n  # noqa: B009  (FX: a getattr call, "getattr_1")


class _GetitemBoth(torch.nn.Module):
    def forward(self, x):
        return x[0] * 2.0 + operator.getitem(x, 1)  # 'getitem', then 'getitem_1'


class _NegInHelper(torch.nn.Module):
    def forward(self, x):
        return self._scaled(-x)

    def _scaled(self, y):
        return torch.neg(y) * 3.0


class _NegCallsOnly(torch.nn.Module):
    def forward(self, x):
        return torch.neg(x) + torch.neg(x * 2.0)


@pytest.mark.parametrize(
    "model, node, what",
    [
        (_NegBoth(), "neg", "a unary operator (unary -)"),
        (_GtBoth(), "gt", "a comparison (>)"),
        (_EqBoth(), "eq", "a comparison (==)"),
        (_GetattrBoth(), "getattr", "an attribute read from a value (.shape)"),
        (_GetitemBoth(), "getitem", "an item read or unpacking"),
        (_NegInHelper(), "neg", "a unary operator (unary -)"),
    ],
)
def test_fx_names_shared_with_operators_that_are_no_sites_are_refused(model, node, what):
    # FX numbers -x, x > 0, x.shape, x[0] among the calls it names the same: the calls'
    # names shift, so mapping 'neg' to the first torch.neg call would give another value.
    for name in (node, f"{node}_1"):
        with pytest.raises(bcrecord.TargetError) as refused:
            create_feature_extractor(model, [name])
        said = str(refused.value)
        assert f"has {what}" in said and "name the site instead" in said, said


def test_fx_names_of_calls_alone_still_map():
    x = torch.tensor([[1.0, -2.0], [3.0, 0.5]])
    out = create_feature_extractor(_NegCallsOnly(), ["neg", "neg_1"])(x)
    assert torch.equal(out["neg"], -x) and torch.equal(out["neg_1"], -(x * 2.0))


class _BiasTable(torch.nn.Module):
    """A buffer's .view before a parameter's, as maxvit's relative position bias."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(9, 2))
        self.register_buffer("index", torch.arange(9).flip(0))

    def forward(self, x):
        order = self.index.view(3, 3)
        bias = self.table.view(9, 2)
        return x + bias[order[0]] + self.index.view(9, 1)[:3]


def test_fx_names_skip_calls_on_buffers_which_fx_runs_without_a_node():
    # FX proxies parameters, not buffers: self.index.view(3, 3) runs while it traces and
    # its node 'view' is the parameter's view, 'view_1' none (once the buffer's view).
    torch.manual_seed(0)
    model, x = _BiasTable(), torch.randn(3, 2)
    names = [node.name for node in torch.fx.symbolic_trace(model).graph.nodes]
    assert names.count("view") == 1 and "view_1" not in names
    out = create_feature_extractor(model, ["view", "add"])(x)
    assert torch.equal(out["view"], model.table.view(9, 2))
    assert torch.equal(out["add"], x + model.table[[8, 7, 6]])
    with pytest.raises(bcrecord.TargetError, match="has 1 'view' site"):
        create_feature_extractor(model, ["view_1"])


class _EitherTranspose(torch.nn.Module):
    """timm's LeViT attention: a .transpose() site on one side of an if, none on the other."""

    def __init__(self, use_conv):
        super().__init__()
        self.use_conv = use_conv

    def forward(self, q, v):
        if self.use_conv:
            attn = q.transpose(-2, -1) @ v
        else:
            attn = (q @ v).transpose(1, 2)
        return attn


def test_fx_names_of_a_site_on_one_side_of_a_branch_whose_other_side_is_no_site_are_refused():
    # FX's 'transpose' is q.transpose() where use_conv is set, else (q @ v).transpose(),
    # which is no site: it was mapped to q.transpose(), and the call said it never ran.
    q, v = torch.randn(2, 3, 3), torch.randn(2, 3, 3)
    for use_conv, first in ((True, "transpose"), (False, "matmul")):
        model = _EitherTranspose(use_conv)
        names = [node.name for node in torch.fx.symbolic_trace(model).graph.nodes]
        assert names[2:4] == [first, ({"transpose", "matmul"} - {first}).pop()]
        with pytest.raises(bcrecord.TargetError, match="a branch decides whether it or the sites run"):
            create_feature_extractor(model, ["transpose"])
        site = ":forward:q.transpose()@0" if use_conv else ":forward:attn@1"
        out = create_feature_extractor(model, {site: "t"})(q, v)
        assert torch.equal(out["t"], q.transpose(-2, -1) if use_conv else (q @ v).transpose(1, 2))


class _SpectralHead(torch.nn.Module):
    """Reads a spectral-normed weight in its own forward (a property: the parametrization)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.utils.parametrizations.spectral_norm(torch.nn.Linear(4, 4))

    def forward(self, x):
        return x @ self.lin.weight.t() + x.relu()


def test_fx_names_leave_a_parametrized_weight_read_by_forward_unrun():
    # Telling which FX names a call has read self.lin.weight, running spectral_norm's
    # power iteration: its buffers _u and _v changed when the extractor was made.
    torch.manual_seed(0)
    model = _SpectralHead().train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    create_feature_extractor(model, ["relu"]).close()
    with pytest.raises(bcrecord.TargetError, match="no submodule 'lin.weight'"):
        create_feature_extractor(model, ["lin.weight"])  # (torch's get_submodule reads it)
    extractor = create_feature_extractor(model.eval(), ["t", "add"])
    assert all(torch.equal(value, before[key]) for key, value in model.state_dict().items())
    x = torch.randn(3, 4)
    out = extractor(x)
    assert torch.equal(out["t"], model.lin.weight.t())  # (eval: no power iteration)
    assert torch.allclose(out["add"], x @ model.lin.weight.t() + x.relu())
    names = [node.name for node in torch.fx.symbolic_trace(model).graph.nodes]
    assert names.count("t") == 1 and "add" in names
    extractor.close()


class _PosEnc(torch.nn.Module):
    """timm CoaT's ConvPosEnc: one module run by each block."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.proj(x.transpose(1, 2)).transpose(1, 2) + 1.0


class _SharedPosEnc(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.cpe = _PosEnc()

    def forward(self, x):
        return self.cpe(self.cpe(x) * 2.0)


def test_fx_names_of_ops_in_a_module_run_twice_give_its_first_runs_op_also_without_the_early_stop():
    # FX names the first run's op 'cpe.add', the second's 'cpe.add_1' (refused here): the
    # site records both runs, and stop_early=False gave the list of both.
    torch.manual_seed(0)
    model, x = _SharedPosEnc(), torch.randn(2, 3, 3)
    names = [node.name for node in torch.fx.symbolic_trace(model).graph.nodes]
    assert names.count("add") == 1 and "add_1" in names and "add_2" not in names
    first = model.cpe.proj(x.transpose(1, 2)).transpose(1, 2) + 1.0
    for stop_early in (True, False):
        out = create_feature_extractor(model, ["cpe.add", "cpe.transpose"], stop_early=stop_early)(x)
        assert torch.allclose(out["cpe.add"], first), stop_early
        assert torch.equal(out["cpe.transpose"], x.transpose(1, 2)), stop_early
    with pytest.raises(bcrecord.TargetError, match="its second run's first 'add' is add_1"):
        create_feature_extractor(model, ["cpe.add_1"])


def test_an_extractor_whose_stop_a_site_that_did_not_run_holds_back_says_so_once():
    net = torch.nn.Sequential(Branchy(), torch.nn.Linear(4, 4))
    extractor = create_feature_extractor(net, ["0:forward:h"])
    x = torch.randn(3, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outs = [extractor(x), extractor(x)]
    said = [str(w.message) for w in caught if "stop_early" in str(w.message)]
    assert len(said) == 1 and "['0:forward:h@0'] did not run" in said[0]
    assert all(torch.allclose(out["0:forward:h"], net[0].lin(x)) for out in outs)
    extractor.close()


class _Steps(torch.nn.Module):
    """A loop run as often as the call says."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)

    def forward(self, x, steps):
        h = x
        for _ in range(steps):
            h = self.fc(h).tanh()
        return h


def test_a_site_in_a_loop_gives_a_tensor_when_it_ran_once_and_a_list_otherwise():
    torch.manual_seed(0)
    net, x = _Steps(), torch.randn(1, 2)
    extractor = create_feature_extractor(net, {":forward:h@1": "h"}, stop_early=False, grad=False)
    once, thrice = extractor(x, 1)["h"], extractor(x, 3)["h"]
    assert isinstance(once, torch.Tensor) and torch.allclose(once, net.fc(x).tanh())
    assert isinstance(thrice, list) and len(thrice) == 3
    assert torch.allclose(thrice[0], once) and torch.allclose(thrice[2], net(x, 3))


def test_an_extractor_takes_a_submodule_named_grad_or_with_a_colon():
    # 'heads.grad' was refused as a gradient target, then (past that) recorded the ModuleDict 'heads'.
    from .test_targets import _KeyedHeads

    net = _KeyedHeads()
    x = torch.randn(3, 2)
    features = create_feature_extractor(net, ["heads.grad", "heads.task:cls"])(x)
    assert list(features) == ["heads.grad", "heads.task:cls"]
    assert torch.equal(features["heads.grad"], net.heads["grad"](x))
    assert torch.equal(features["heads.task:cls"], net(x))
    with pytest.raises(bcrecord.SpecError, match="before any gradient exists"):
        create_feature_extractor(net, ["heads.grad:forward:return.grad"])


def test_an_extractor_inside_vmap_returns_its_features_batched_as_vmap_returns_outputs():
    # Its features are the forward's outputs there: vmap batches them itself, so they stay
    # vmap's tensors inside (taken from under the wrapper, vmap saw unbatched values and
    # repeated each for every example: [5, 5, 4]).
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    x = torch.randn(5, 3)
    features = torch.func.vmap(create_feature_extractor(net, ["0", "1"]))(x)
    assert features["0"].shape == (5, 4)
    assert torch.allclose(features["0"], net[0](x)) and torch.allclose(features["1"], net[0](x).relu())


@pytest.mark.parametrize("reentrant", [True, False])
def test_features_inside_a_checkpointed_module_are_in_the_graph_only_under_the_non_reentrant_kind(reentrant):
    from torch.utils.checkpoint import checkpoint

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Tanh())
            self.head = torch.nn.Linear(3, 1)

        def forward(self, x):
            return self.head(checkpoint(self.block, x, use_reentrant=reentrant))

    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 3, requires_grad=True)
    features = create_feature_extractor(model, ["block.0"])(x)
    # The reentrant kind runs its first forward without autograd: its values have no graph.
    assert features["block.0"].requires_grad is not reentrant
    assert torch.allclose(features["block.0"], model.block[0](x))


def test_features_extracted_under_inference_mode_are_normal_tensors():
    # They were inference tensors: a probe trained on them raised, as in-place ops did.
    torch.manual_seed(0)
    model, x = SmallNet().eval(), torch.randn(2, 3, 8, 8)
    extractor = create_feature_extractor(model, ["bn1", "fc"])
    with torch.inference_mode():
        features = extractor(x)
    assert not any(feature.is_inference() for feature in features.values())
    probe = torch.nn.Linear(5, 1)
    probe(features["fc"]).sum().backward()
    assert torch.allclose(probe.weight.grad, features["fc"].sum(0, keepdim=True))
    with torch.no_grad():
        assert torch.allclose(features["fc"], model(x))


def test_a_target_in_a_branch_the_input_decides_is_not_said_to_be_one_of_the_other_mode():
    # GPT-2's 'transformer:forward:attention_mask@0' (assigned where a mask is given), a
    # Mixtral's experts' locals (run under experts_implementation='eager' only): the error
    # gave train mode as the reason and per-mode targets as the way out, which change nothing.
    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x, mask=None):
            if mask is not None:
                x = x * mask
            return self.lin(x)

    model, x = Masked().eval(), torch.ones(1, 2)
    extractor = create_feature_extractor(model, [":forward:x@0"])
    with pytest.raises(RuntimeError) as error:
        extractor(x)
    assert str(error.value).startswith(
        "this forward pass never reached [':forward:x@0'] (in a branch it did not take, or a function "
        "it did not call; the model ran in eval mode: a target in a branch only train mode takes"
    )
    assert torch.equal(extractor(x, torch.zeros(1, 2))[":forward:x@0"], torch.zeros(1, 2))


def test_a_target_inside_a_layer_that_took_torch_s_fast_path_says_so():
    # It gave train mode as the reason and per-mode targets as the way out; the fused fast
    # path of an eval TransformerEncoderLayer without autograd runs none of its Python code.
    model = torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True), 1
    ).eval()
    extractor = create_feature_extractor(model, ["layers.0.linear1"])
    x = torch.randn(1, 3, 8)
    with torch.no_grad(), pytest.raises(RuntimeError) as error:
        extractor(x)
    assert str(error.value) == (
        "this forward pass never reached ['layers.0.linear1'] (layers.0.linear1 is inside the "
        "TransformerEncoderLayer at 'layers.0', which in eval mode without autograd takes torch's fused "
        "fast path and runs none of its Python code: call it with autograd on, or in train mode, or "
        "after torch.backends.mha.set_fastpath_enabled(False))"
    )
    got = extractor(x)["layers.0.linear1"]  # with autograd on: its Python code runs
    layer = model.layers[0]
    assert torch.allclose(got, layer.linear1(layer.norm1(x + layer.self_attn(x, x, x)[0])))


class _Pool(torch.nn.Module):  # (a module outside torch.nn: FX traces into it)
    def __init__(self):
        super().__init__()
        self.pool = torch.nn.AdaptiveAvgPool1d(1)
        self.fc = torch.nn.Linear(2, 3)

    def forward(self, x):
        return self.fc(self.pool(x).flatten(1))


class _CallsTheHeadsParts(torch.nn.Module):
    """As timm's MetaFormer forward_head: the head's submodules called one by one, never the head."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Linear(4, 2)
        self.head = _Pool()

    def forward(self, x):
        x = self.stem(x).transpose(1, 2)
        return self.head.fc(self.head.pool(x).flatten(1))


def test_a_module_path_whose_module_its_parent_never_calls_names_a_submodule_instead():
    # The hint was the branch's or the mode's alone; torchvision's node of such a path is the
    # last op traced inside the module (here head.fc's output).
    model, x = _CallsTheHeadsParts().eval(), torch.randn(1, 5, 4)
    extractor = create_feature_extractor(model, ["head"])
    with pytest.raises(RuntimeError) as error:
        extractor(x)
    assert str(error.value) == (
        "this forward pass never reached ['head'] (in a branch it did not take, or a function it did not "
        "call; the model ran in eval mode: a target in a branch only train mode takes is never reached in "
        "it; give the targets of each mode with train_return_nodes= and eval_return_nodes=) (the _Pool at "
        "'head' was not called in this forward; a module path is the output of the module's own call, and "
        "a parent may call its submodules one by one or loop over them instead (as timm's forward_head "
        "calls head.global_pool … head.fc): where they ran, torchvision's node 'head' is the output of the "
        "last of them that ran, which is a target here: one of 'head.pool', 'head.fc')"
    )
    assert torch.equal(create_feature_extractor(model, ["head.fc"])(x)["head.fc"], model(x))
    # A module without submodules has no such hint: the branch's or the mode's.
    model.spare = torch.nn.ReLU()
    with pytest.raises(RuntimeError) as error:
        create_feature_extractor(model, ["spare"])(x)
    assert "(in a branch it did not take, or a function it did not call; " in str(error.value)
    assert "was not called in this forward" not in str(error.value)
    # Targets given per mode: no mode hint, the submodules' alone.
    per_mode = create_feature_extractor(model, train_return_nodes=["stem"], eval_return_nodes=["head"])
    with pytest.raises(RuntimeError, match=r"never reached \['head'\] \(the _Pool at 'head' was not called"):
        per_mode.eval()(x)


class _ReturnsADict(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(2, 2, 1)

    def forward(self, x):
        return {"out": self.conv(x)}


class _HasADictBackbone(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = _ReturnsADict()
        self.head = torch.nn.Conv1d(2, 1, 1)
        self.pair = torch.nn.LSTM(2, 2)  # (a torch.nn module, returning a tuple: FX's leaf)

    def forward(self, x):
        out = self.head(self.backbone(x)["out"])
        self.pair(x.transpose(0, 2).transpose(1, 2))
        return out


def test_a_module_path_whose_module_fx_traces_into_and_returns_a_container_warns_once():
    # torchvision's node 'backbone' of an FCN is layer4's output (the last op FX traced in its
    # IntermediateLayerGetter), not the dict its forward returns; this returned the dict silently.
    model, x = _HasADictBackbone().eval(), torch.randn(1, 2, 3)
    extractor = create_feature_extractor(model, ["backbone", "pair", "head"], stop_early=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = extractor(x)
        second = extractor(x)
    assert [str(w.message) for w in caught] == [
        "return node 'backbone' is a module path: bcrecord returns the dict the forward of the "
        "_ReturnsADict there returns, but FX traces into that module and makes no node of a container "
        "its forward builds: torchvision's node 'backbone' is the last op it traced inside (name that "
        "op's module or site here, from list_targets)"
    ]
    assert caught[0].filename == __file__
    with warnings.catch_warnings():  # (the root's own dict: torchvision has no node '')
        warnings.simplefilter("error")
        whole = create_feature_extractor(model.backbone, [""])(x)[""]
    assert torch.equal(whole["out"], model.backbone.conv(x))
    for got in (first, second):
        assert torch.equal(got["backbone"]["out"], model.backbone.conv(x))
        assert isinstance(got["pair"], tuple)  # (the LSTM's own output, as FX's leaf node)
        assert torch.equal(got["head"], model(x))


class _PyramidLeaf(torch.nn.Module):  # (made an FX leaf below, as torchvision.ops' FPN is one)
    def forward(self, x):
        return {"0": x + 1, "1": x * 2}


class _WithFPN(torch.nn.Module):  # (as torchvision's BackboneWithFPN: the leaf's dict returned)
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(2, 2)
        self.fpn = _PyramidLeaf()

    def forward(self, x):
        return self.fpn(self.body(x))


def test_a_module_returning_the_dict_of_a_leaf_it_holds_gives_torchvision_s_node_without_a_warning():
    # torchvision's node 'backbone' of a detection model is its FPN's call (a leaf), whose value is
    # the dict BackboneWithFPN returns: the same as here; the warning was wrong there.
    model = torch.nn.Sequential()
    model.backbone = _WithFPN()
    x = torch.ones(1, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = create_feature_extractor(model, ["backbone"], tracer_kwargs={"leaf_modules": [_PyramidLeaf]})(x)
    assert torch.equal(got["backbone"]["1"], model.backbone.body(x) * 2)
    with pytest.warns(bcrecord.RecordingWarning, match="return node 'backbone' is a module path"):
        create_feature_extractor(model, ["backbone"])(x)  # (no leaf held: FX traces the dict's ops)


def test_a_target_in_a_branch_only_the_other_mode_takes_says_so():
    class WithLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            out = self.lin(x)
            if self.training:
                loss = out.square().mean()
                return loss
            return out

    model = WithLoss().eval()
    with pytest.raises(RuntimeError, match=r"ran in eval mode: a target in a branch only train mode takes"):
        create_feature_extractor(model, [":forward:loss@0"])(torch.ones(1, 2))
    per_mode = create_feature_extractor(
        model, train_return_nodes=[":forward:loss@0"], eval_return_nodes=["lin"]
    )
    assert torch.equal(per_mode(torch.ones(1, 2))["lin"], model.lin(torch.ones(1, 2)))
    wrong = create_feature_extractor(model, train_return_nodes=["lin"], eval_return_nodes=[":forward:loss@0"])
    with pytest.raises(
        RuntimeError, match=r"never reached \[':forward:loss@0'\]$"
    ):  # given per mode: no hint
        wrong(torch.ones(1, 2))


def test_a_warning_from_an_extractor_s_call_points_at_the_user_s_line():
    # It pointed into torch's Module.__call__ (torch/nn/modules/module.py), between the user's
    # line and the extractor's forward.
    class Skipping(torch.nn.Module):
        def forward(self, x):
            y = x + 1
            if x.sum() > 100:  # not taken: the stop waits for this site, and says so
                y = y * 2
            return y

    extractor = create_feature_extractor(Skipping(), [":forward:y"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        extractor(torch.ones(2)); line = sys._getframe().f_lineno  # fmt: skip
    assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]
    # Named by the extractor's own option (it was record()'s, stop_after_last).
    assert str(caught[0].message).startswith("stop_early: this forward ran to its end")


def test_list_targets_table_heads_a_submodule_named_with_two_colons_by_its_path():
    # The table took the path 'heads.task:cls:v2' for a target of 'heads.task' (the text before
    # its last two ':'): a header 'heads.task', a module that is not there, listing it.
    net = torch.nn.Sequential()
    net.add_module("heads", torch.nn.Sequential())
    net.heads.add_module("task:cls:v2", torch.nn.Tanh())
    lines = str(list_targets(net)).splitlines()
    assert lines[lines.index("heads") + 1 :] == [
        "    heads:forward:input@0",
        "    heads:forward:module@0",
        "    heads:forward:module()@0",
        "    heads:forward:return",
        "heads.task:cls:v2",
        "    heads.task:cls:v2:forward:torch.tanh@0",
        "    heads.task:cls:v2:forward:torch.tanh()@0",
        "    heads.task:cls:v2:forward:return",
    ]


def test_list_targets_table_heads_a_two_colon_path_with_no_targets_after_it_by_its_path():
    # With methods='encode', 'heads.task:cls:v2' (a Tanh, no encode) is listed alone: the table
    # headed it 'heads.task', a module that is not there, listing it as one of its targets.
    class Enc(torch.nn.Module):
        def forward(self, x):
            return x

        def encode(self, x):
            return x + 1

    net = torch.nn.Sequential()
    net.add_module("heads", torch.nn.Sequential())
    net.heads.add_module("task:cls:v2", torch.nn.Tanh())
    net.add_module("enc", Enc())
    assert str(list_targets(net, "encode")).splitlines() == [
        "<root>",
        "heads",
        "heads.task:cls:v2",
        "enc",
        "    enc:encode:+@0",
        "    enc:encode:return",
    ]


def test_an_interrupt_at_any_call_of_an_extractor_s_forward_leaves_no_stop_state_behind():
    # As record()'s stopping forward (test_record): a Ctrl-C or a timeout's exception at a call
    # between the setting of its context variables and their reset left them set.
    from bcrecord.torch import copies

    record_module = sys.modules["bcrecord.torch.record"]
    net, x = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.randn(1, 4)
    extractor = create_feature_extractor(net, ["0"])
    where = calls_made_from(type(extractor).forward.__code__)
    places, _ = interrupted(lambda: extractor(x), where)
    assert len(places) > 10
    for nth in range(1, len(places) + 1):
        interrupted(lambda: extractor(x), where, stop_at=nth)
        state = (record_module._stopping.get(), record_module._catching.get(), copies.returned_inside.get())
        assert state == (False, (), False), nth
        # Nor a recording left entered (its patches armed), nor a module marked.
        assert not bcrecord.runtime.is_active() and record_module._MARK not in vars(net[0]), nth
    assert torch.equal(extractor(x)["0"], net[0](x))
