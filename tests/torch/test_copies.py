"""bcrecord.torch.copies: tensor copies per policy and the per-target value policy."""

import pytest
import torch

from bcrecord.errors import RecordingWarning, SpecError
from bcrecord.runtime import copy_value
from bcrecord.torch.copies import _saving_apart_from, detached_clone, value_policy


def test_core_policies_for_tensors():
    base = torch.ones(3, requires_grad=True)
    t = base * 2
    cloned = copy_value(t, "clone")
    assert not cloned.requires_grad and cloned.data_ptr() != t.data_ptr()
    detached = copy_value(t, "detach")
    assert not detached.requires_grad and detached.data_ptr() == t.data_ptr()
    assert torch.equal(copy_value(t, "deepcopy"), t.detach())
    param = torch.nn.Parameter(torch.zeros(2))
    assert copy_value(param, "clone").data_ptr() != param.data_ptr()
    nested = copy_value({"a": (t, 1)}, "clone")
    assert torch.equal(nested["a"][0], t.detach()) and nested["a"][1] == 1


def test_value_policy_options():
    t = torch.arange(6.0).reshape(2, 3)
    keep = value_policy()
    kept = keep(t)
    t.add_(1)
    assert torch.equal(kept, torch.arange(6.0).reshape(2, 3))
    assert value_policy(copy="detach")(t).data_ptr() == t.data_ptr()
    assert value_policy(dtype=torch.float16)(t).dtype == torch.float16
    assert torch.equal(value_policy(reduce=lambda v: v.sum(0))(t), t.sum(0))
    grad_in = torch.ones(2, requires_grad=True) * 3
    assert value_policy(grad=True)(grad_in).requires_grad
    assert value_policy()([t, "label"])[1] == "label"


def test_dtype_casts_only_tensors_of_its_kind():
    scores = torch.tensor([0.5, 2.0])
    indices = torch.tensor([4097, 3])  # float16 would round 4097 to 4096
    wave = torch.tensor([1 + 2j], dtype=torch.complex128)
    kept = value_policy(dtype=torch.float16)({"s": scores, "i": indices, "mask": indices > 4, "w": wave})
    assert kept["s"].dtype == torch.float16 and torch.equal(kept["i"], indices)
    assert kept["mask"].dtype == torch.bool and torch.equal(kept["w"], wave)
    indices.zero_()  # not cast, still copied
    assert kept["i"].tolist() == [4097, 3]
    assert value_policy(dtype=torch.complex64)(wave).dtype == torch.complex64
    for wrong, error in ((torch.int32, SpecError), ("float16", TypeError)):
        with pytest.raises(error, match="floating-point or complex"):
            value_policy(dtype=wrong)


def test_deepcopy_policy_copies_tensors_like_clone():
    t = torch.arange(3.0)
    kept = value_policy(copy="deepcopy")(t)
    t.mul_(10)
    assert torch.equal(kept, torch.arange(3.0)) and kept.data_ptr() != t.data_ptr()
    live = value_policy(copy="deepcopy", reduce=lambda v: v)(t)  # reduce returns the live tensor
    t.zero_()
    assert torch.equal(live, torch.tensor([0.0, 10.0, 20.0]))


def test_value_policy_gives_plain_tensors_one_copier():
    grad_in = torch.ones(2, requires_grad=True) * 3
    plain = value_policy()
    assert plain.copier_for(torch.Tensor) is detached_clone
    assert plain.copier_for(list) is plain and plain.copier_for(torch.nn.Parameter) is plain
    assert value_policy(grad=True).copier_for(torch.Tensor)(grad_in).requires_grad
    detach = value_policy(copy="detach").copier_for(torch.Tensor)
    assert detach(grad_in).data_ptr() == grad_in.data_ptr() and not detach(grad_in).requires_grad
    reduced = value_policy(reduce=lambda v: v.sum()).copier_for(torch.Tensor)
    assert reduced(grad_in).item() == 6.0 and not reduced(grad_in).requires_grad
    for policy in (plain, value_policy(copy="detach"), value_policy(dtype=torch.float64)):
        assert torch.equal(policy.copier_for(torch.Tensor)(grad_in), policy(grad_in))


class FakeStream:
    """Stands in for a CUDA stream: counts how often it is waited for."""

    def __init__(self):
        self.waits = 0

    def synchronize(self):
        self.waits += 1


def test_settle_waits_once_for_each_stream_with_copies_in_flight():
    keep = value_policy(to="cpu")
    first, second = FakeStream(), FakeStream()
    keep._pending.update([first, second])
    keep.settle()
    keep.settle()  # nothing in flight any more: no second wait
    assert (first.waits, second.waits) == (1, 1) and not keep._pending
    # From the CPU to the CPU: nothing to wait for.
    assert torch.equal(keep(torch.ones(2)), torch.ones(2)) and not keep._pending


def test_a_reduce_returning_several_tensors_keeps_each_as_a_reduced_tensor():
    # Each tensor reduce returns is detached, cast and cloned if it is a view of the live value.
    base = torch.tensor([[-1.0, 2.0, -3.0, 4.0]], requires_grad=True)
    live = base * 1
    chunks = value_policy(reduce=lambda t: t.chunk(2, dim=1))(live)
    stats = value_policy(reduce=lambda t: {"mean": t.mean(), "max": t.max()}, dtype=torch.float64)(live)
    with torch.no_grad():
        live.relu_()  # what a later in-place op does to the live value
    assert [c.tolist() for c in chunks] == [[[-1.0, 2.0]], [[-3.0, 4.0]]]
    assert not any(c.requires_grad for c in chunks) and isinstance(chunks, tuple)
    assert stats["mean"].dtype == stats["max"].dtype == torch.float64 and stats["mean"].item() == 0.5
    assert value_policy(reduce=lambda t: t.sum().item())(live) == 6.0


@pytest.mark.parametrize("copy", ["clone", "detach", "none"])
def test_a_reduce_in_the_graph_gives_the_gradient_of_the_value_as_recorded_though_changed_later(copy):
    # The saved-tensor hooks around the reduce turned off torch's version check: pow saved the
    # live value, which an in-place ReLU then changed, and the gradient was the changed value's
    # (zeros where the ReLU cut), with no error. A forward hook doing the same raises torch's.
    import torch.nn as nn

    from bcrecord.torch import record

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(inplace=True))
    x = torch.randn(2, 3)
    squares = lambda t: t.pow(2).sum()  # noqa: E731
    expected = torch.autograd.grad(squares(net[0](x)), net[0].weight)[0]
    with record(net, ["0"], grad=True, reduce=squares, copy=copy) as rec:
        net(x)
    assert torch.equal(torch.autograd.grad(rec["0:forward:return"], net[0].weight)[0], expected)
    # Only what shares the value's memory (a view too) is saved as a copy; a tensor the reduce
    # makes itself is saved as it is (nothing outside the reduce changes it).
    live = torch.ones(2, 3, requires_grad=True) * 2
    save = _saving_apart_from(live)
    made = live * 3
    for shares in (live, live[0]):
        assert save(shares).untyped_storage().data_ptr() != live.untyped_storage().data_ptr()
        assert torch.equal(save(shares), shares)
    assert save(made) is made
    # One copy of what the value spans, however many tensors of it are saved (t * t saved two
    # copies; an expanded view's was as large as the view).
    first, transposed, wide = save(live), save(live.t()), save(live.expand(8, 2, 3))
    assert len({t.untyped_storage().data_ptr() for t in (first, transposed, wide)}) == 1
    assert wide.untyped_storage().nbytes() == live.untyped_storage().nbytes()
    assert torch.equal(transposed, live.t()) and torch.equal(wide, live.expand(8, 2, 3))
    # A conjugate view is copied with its bit (a view of the copy had none: t.conj() saved as t).
    waves = torch.randn(3, dtype=torch.complex128, requires_grad=True) * 1
    assert torch.equal(_saving_apart_from(waves)(waves.conj()), waves.conj())
    # A value spanning far more than itself (a ViT's class token, tokens[:, 0]) is not copied whole.
    tokens = torch.randn(4, 50, 6, requires_grad=True) * 1
    token = tokens[:, 0]
    saved = _saving_apart_from(token)(token)
    assert torch.equal(saved, token) and saved.untyped_storage().nbytes() == token.numel() * 4


def test_containers_of_their_own_kind_and_dataclasses_are_copied():
    import collections
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Out:
        feat: torch.Tensor
        extra: dict

    live = torch.tensor([-1.0, 2.0], requires_grad=True) * 1
    by_name = collections.defaultdict(list, {"a": live})
    kept_dict = value_policy()(by_name)
    kept_out = value_policy()(Out(live, {"b": live}))
    with torch.no_grad():
        live.relu_()
    assert type(kept_dict) is collections.defaultdict and kept_dict.default_factory is list
    assert kept_dict["a"].tolist() == [-1.0, 2.0] and not kept_dict["a"].requires_grad
    assert type(kept_out) is Out and kept_out.feat.tolist() == [-1.0, 2.0] and not kept_out.feat.requires_grad
    assert kept_out.extra["b"].tolist() == [-1.0, 2.0]


def test_a_container_holding_itself_or_one_list_twice_is_copied_once():
    live = torch.ones(2)
    looped: list = [live]
    looped.append(looped)
    kept = value_policy()(looped)
    live.add_(1)
    assert kept[1] is kept and kept[0].tolist() == [1.0, 1.0]
    shared = [live]
    pair = value_policy()((shared, shared))
    assert pair[0] is pair[1] and pair[0] is not shared
    # One tensor twice in a value: one clone, kept twice (not twice the memory).
    for policy in (value_policy(), value_policy(copy="detach"), value_policy(to="cpu")):
        twice = policy([live, {"again": live}])
        assert twice[0] is twice[1]["again"] and twice[0] is not live


def test_a_clone_stays_as_it_was_when_numpy_writes_the_memory_it_was_copied_from():
    # An input buffer refilled in place through numpy, step after step (an RL loop, a C
    # loader): torch never sees those writes, so a copy-on-write clone would follow them.
    from bcrecord.torch import record

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    buffer = torch.zeros(1, 4)
    filled = buffer.numpy()
    for policy in ("clone", "deepcopy"):
        with torch.no_grad(), record(net, ["0", "0:forward:input"], copy=policy) as rec:
            for step in range(3):
                filled[:] = step
                net(buffer)
        assert [v[0, 0].item() for v in rec.all("0:forward:return")] == [0.0, 1.0, 2.0]
        assert [v[0, 0].item() for v in rec.all("0:forward:input")] == [0.0, 1.0, 2.0]


def test_what_a_container_holds_besides_tensors_is_copied_as_the_core_copies_it():
    import numpy as np

    live = torch.tensor([-1.0, 2.0])
    for policy in (value_policy(reduce=lambda t: {"array": t.numpy()}), value_policy()):
        kept = policy({"array": live.numpy()}) if policy.reduce is None else policy(live)
        live.relu_()  # written in place after the copy, through the array's memory too
        assert np.array_equal(kept["array"], [-1.0, 2.0])
        live.copy_(torch.tensor([-1.0, 2.0]))


def test_a_view_s_clone_keeps_only_its_own_elements():
    base = torch.arange(1 << 16, dtype=torch.float32)
    kept = detached_clone(base[:4])
    base[:4] = -1  # written after the copy: the copy is as it was
    assert kept.tolist() == [0.0, 1.0, 2.0, 3.0]
    # Not base's 256 KiB kept alive behind a 4-element value (a copy-on-write clone of a view does).
    assert kept.untyped_storage().nbytes() == 16


def test_a_quantized_tensor_s_clone_keeps_its_quantizer():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch deprecates creating quantized tensors
        live = torch.quantize_per_tensor(torch.tensor([0.5, -1.0, 2.0]), 0.5, 4, torch.quint8)
    kept = detached_clone(live)
    # A copy-on-write clone lost it, and using the value crashed the process.
    assert (kept.q_scale(), kept.q_zero_point()) == (0.5, 4)
    assert kept.dequantize().tolist() == [0.5, -1.0, 2.0]


def test_a_small_view_of_a_tensor_in_autograd_is_copied_alone_too():
    leaf = torch.zeros(1 << 16, requires_grad=True)
    kept = detached_clone(leaf[:4])  # detach() of a view is no view: asked before it
    assert kept.untyped_storage().nbytes() == 16 and not kept.requires_grad


def test_dataclass_values_keep_their_links_and_skip_unset_fields():
    import dataclasses
    from typing import List, Optional

    @dataclasses.dataclass
    class Node:
        t: torch.Tensor
        children: List["Node"] = dataclasses.field(default_factory=list)
        parent: Optional["Node"] = None
        cache: list = dataclasses.field(init=False)  # set on demand: not yet

    root = Node(torch.ones(2))
    root.children.append(Node(torch.zeros(2), parent=root))
    copied = value_policy()(root)
    root.t.add_(5)
    assert torch.equal(copied.t, torch.ones(2)) and copied.children[0].parent is copied
    assert not hasattr(copied, "cache") and copied.children[0] is not root.children[0]

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        t: torch.Tensor

        def __copy__(self):  # "immutable": but the tensor it holds is not
            return self

    live = Frozen(torch.ones(2, requires_grad=True) * 2)
    kept = value_policy()(live)
    live.t.data.fill_(7.0)
    assert kept is not live and torch.equal(kept.t, torch.full((2,), 2.0)) and not kept.t.requires_grad
    assert live.t.requires_grad  # the program's object untouched


def test_deepcopy_copies_containers_holding_tensors_in_the_autograd_graph():
    leaf = torch.ones(2, requires_grad=True)
    loss = (leaf * 2).sum()  # in the graph: deepcopy alone refuses it
    copied = copy_value({"loss": loss, "parts": [leaf * 3, 4], "pair": (loss,)}, "deepcopy")
    assert torch.equal(copied["loss"], torch.tensor(4.0)) and not copied["loss"].requires_grad
    assert torch.equal(copied["parts"][0], torch.full((2,), 3.0)) and copied["parts"][1] == 4
    assert copied["pair"][0] is not loss and torch.equal(copied["pair"][0], torch.tensor(4.0))
    plain = {"n": [1, 2]}
    assert copy_value(plain, "deepcopy") == plain and copy_value(plain, "deepcopy")["n"] is not plain["n"]


def test_deepcopy_detaches_a_leaf_that_requires_grad_inside_a_value_as_it_does_one_alone():
    # Alone it was copied detached; in a list (a tuple, a dict, a dataclass) it kept requires_grad=True.
    import dataclasses

    @dataclasses.dataclass
    class Output:
        logits: torch.Tensor

    leaf = torch.ones(2, requires_grad=True)
    for value in (leaf, [leaf], (leaf, 1), {"w": leaf}, Output(leaf)):
        copied = copy_value(value, "deepcopy")
        tensor = next(iter(copied.values())) if isinstance(copied, dict) else copied
        tensor = tensor.logits if isinstance(tensor, Output) else tensor
        tensor = tensor[0] if isinstance(tensor, (list, tuple)) else tensor
        assert torch.equal(tensor, torch.ones(2)) and not tensor.requires_grad and tensor is not leaf


def test_deepcopy_detaches_a_tensor_in_a_set_as_it_does_one_in_a_list():
    # {leaf} and frozenset({leaf}) kept requires_grad=True where [leaf] was detached, and a set of a
    # tensor in the autograd graph was refused ('Only Tensors created explicitly by the user').
    leaf = torch.ones(2, requires_grad=True)
    for tensor in (leaf, leaf * 2):
        for value in ({tensor}, frozenset([tensor]), {"s": {tensor}}):
            copied = copy_value(value, "deepcopy")
            (kept,) = copied["s"] if isinstance(copied, dict) else copied
            assert type(copied) is type(value) and kept is not tensor
            assert torch.equal(kept, tensor.detach()) and not kept.requires_grad


def test_deepcopy_of_a_list_of_tensors_recorded_first_detaches_them_as_later_ones_are():
    # The core deep-copied a list as it is until a tensor alone had loaded the torch layer's copies:
    # a leaf in it kept requires_grad=True, and a tensor in the graph was refused (rec.errors).
    import pathlib
    import subprocess
    import sys

    import bcrecord

    code = (
        "import sys, torch, bcrecord\n"
        "def f(w):\n"
        "    y = [w, w * 2]\n"
        "    return y\n"
        "with bcrecord.patch_function(f, ['y@0']), bcrecord.recording(copy='deepcopy') as rec:\n"
        "    f(torch.ones(2, requires_grad=True))\n"
        "print([t.requires_grad for t in rec['__main__:f:y@0']], len(rec.errors))\n"
    )
    root = str(pathlib.Path(bcrecord.__file__).parents[1])
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": root}, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "[False, False] 0"


def test_deepcopy_of_an_object_holding_a_graph_tensor_its_own_way_fails_as_deepcopy_does():
    class Holder:
        def __init__(self, t):
            self.t = t

    with pytest.raises(RuntimeError, match="graph leaves"):
        copy_value(Holder(torch.ones(1, requires_grad=True) * 2), "deepcopy")


def test_a_device_this_machine_lacks_is_refused_at_once(monkeypatch):
    from bcrecord.torch import create_feature_extractor, record

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    for to in ("cuda", "cuda:0", torch.device("cuda")):
        with pytest.raises(SpecError, match="cuda is not available on this machine"):
            value_policy(to=to)
    with pytest.raises(SpecError, match=r"to='cuda': cuda is not available"):
        with record(model, ["0"], to="cuda"):
            pass
    with pytest.raises(SpecError, match=r"to='mps': mps is not available"):
        create_feature_extractor(model, ["0"], to="mps")
    assert value_policy(to="meta")(torch.ones(2)).device.type == "meta"
    # A device torch has no availability check for: accepted, then every value failed.
    if getattr(torch, "hpu", None) is None:
        with pytest.raises(SpecError, match=r"to='hpu': tensors cannot be moved to hpu here \(\w+Error: "):
            with record(model, ["0"], to="hpu"):
                pass
    with pytest.raises(
        SpecError, match=r"to='lazy': tensors cannot be moved to lazy here \(\w+Error: [^\n]*\)$"
    ):
        value_policy(to="lazy")


def test_a_device_index_past_the_machine_s_devices_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert value_policy(to="cuda:1").device == torch.device("cuda:1")
    with pytest.raises(SpecError, match=r"to='cuda:2': this machine has 2 cuda device\(s\), numbered from 0"):
        value_policy(to="cuda:2")


def test_copy_none_keeps_each_value_itself_as_the_core_does():
    from bcrecord.torch import record

    live = torch.ones(2, requires_grad=True) * 2
    held = [live, 3]
    assert value_policy("none")(live) is live and value_policy("none")(held) is held
    assert value_policy("none").copier_for(torch.Tensor)(live) is live
    cast = value_policy("none", dtype=torch.float64)(live)  # the options still apply, in the graph
    assert cast.dtype == torch.float64 and cast.grad_fn is not None
    assert value_policy("none", reduce=torch.sum)(live).grad_fn is not None
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with record(model, ["0"], copy="none") as rec:
        out = model(torch.ones(1, 2))
    assert rec["0:forward:return"] is out and out.grad_fn is not None
    assert value_policy("detach")(live).grad_fn is None  # 'detach' stays detached


@pytest.mark.parametrize(
    "options",
    [{}, {"copy": "deepcopy"}, {"grad": True}, {"dtype": torch.float64}, {"reduce": lambda t: t * 1}],
)
def test_values_copied_under_inference_mode_are_normal_tensors_autograd_takes(options):
    # They were inference tensors: a linear probe trained on recorded features raised
    # "Inference tensors cannot be saved for backward", and in-place ops refused them.
    from bcrecord.torch import record

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
    x = torch.randn(5, 3)
    targets = ["0", "1:forward:input", "0:forward:self.weight"]
    with torch.inference_mode(), record(model, targets, **options) as rec:
        model(x)
    feature = rec["0:forward:return"]
    assert not feature.is_inference() and not rec["0:forward:self.weight"].is_inference()
    assert not rec["0:forward:self.weight"].requires_grad  # inference mode built no graph to keep
    assert torch.allclose(feature.float(), model[0](x).detach())
    probe = torch.nn.Linear(4, 1).to(feature.dtype)
    probe(feature).sum().backward()
    assert torch.allclose(probe.weight.grad, feature.sum(0, keepdim=True))
    assert torch.allclose(feature.add_(1) - 1, rec["1:forward:input"].to(feature.dtype))
    with torch.inference_mode(), record(model, ["0"], copy="detach") as rec:
        model(x)
    assert rec["0:forward:return"].is_inference()  # 'detach' keeps the tensor itself, as it is


class _Batch:
    """An object holding a tensor, as torchvision's ImageList holds the padded images."""

    def __init__(self, tensors: torch.Tensor, sizes: list) -> None:
        self.tensors = tensors
        self.sizes = sizes


def test_a_registered_holder_is_rebuilt_around_copies_of_its_tensors():
    from bcrecord.torch import record
    from bcrecord.torch.copies import register_holder

    register_holder(_Batch, lambda batch, copy: _Batch(copy(batch.tensors), list(batch.sizes)))

    class Net(torch.nn.Module):
        def forward(self, x):
            batch = _Batch(x * 2, [tuple(x.shape)])
            batch.tensors.add_(1)  # changed in place after the assignment
            return batch.tensors

    net = Net()
    with record(net, [":forward:batch@0"]) as rec:
        net(torch.ones(2))
    with record(net, [":forward:batch@0"], dtype=torch.float64, reduce=lambda t: t.sum()) as summed:
        net(torch.ones(2))
    kept = rec[":forward:batch@0"]
    assert type(kept) is _Batch and torch.equal(kept.tensors, torch.full((2,), 2.0)) and kept.sizes == [(2,)]
    assert summed[":forward:batch@0"].tensors.dtype == torch.float64
    assert float(summed[":forward:batch@0"].tensors) == 4.0
    detached = copy_value(_Batch(torch.ones(1, requires_grad=True) * 3, []), "detach")
    assert type(detached) is _Batch and not detached.tensors.requires_grad


def test_deepcopy_of_a_container_of_a_registered_holder_in_the_autograd_graph_rebuilds_it():
    # [ImageList(...)] or (logits, cache) under copy='deepcopy' was lost since 2c4be51, rec.errors
    # 'Only Tensors created explicitly by the user (graph leaves) support the deepcopy protocol':
    # no tensor of the container's own required grad, and copy.deepcopy's refusal was no longer caught.
    from bcrecord.torch.copies import register_holder

    register_holder(_Batch, lambda batch, copy: _Batch(copy(batch.tensors), list(batch.sizes)))
    in_graph = torch.ones(2, requires_grad=True) * 3
    for value in ([_Batch(in_graph, [(2,)])], {"images": _Batch(in_graph, [(2,)]), "n": 1}):
        copied = copy_value(value, "deepcopy")
        batch = copied[0] if isinstance(copied, list) else copied["images"]
        assert type(copied) is type(value) and type(batch) is _Batch and batch.sizes == [(2,)]
        assert torch.equal(batch.tensors, torch.full((2,), 3.0)) and not batch.tensors.requires_grad
    assert in_graph.grad_fn is not None


class _Cache:
    """A base class of objects holding tensors, as transformers' Cache is of DynamicCache's."""

    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys


class _GrowingCache(_Cache):
    pass


def test_a_holder_registered_for_a_base_class_and_some_policies_rebuilds_its_subclasses_there():
    # register_holder took exactly one class under every policy: a transformers cache
    # (DynamicCache, StaticCache... subclasses of Cache), kept live under 'detach', was copied
    # by the core's copy for Cache instead, and record()'s dtype/to/reduce never reached it.
    from bcrecord.torch.copies import register_holder

    register_holder(_Cache, lambda cache, copy: type(cache)(copy(cache.keys)), policies=("clone",))
    live = _GrowingCache(torch.ones(2))
    cast = value_policy(dtype=torch.float64)([live])[0]
    assert type(cast) is _GrowingCache and cast.keys.dtype == torch.float64
    live.keys.add_(1)
    assert torch.equal(copy_value(live, "clone").keys, torch.full((2,), 2.0))
    assert copy_value(live, "clone") is not live
    assert value_policy(copy="detach", dtype=torch.float64)(live) is live  # not registered for 'detach'
    assert copy_value(live, "detach") is live
    assert value_policy(copy="none", dtype=torch.float64)(live).keys.dtype == torch.float64
    with pytest.raises(SpecError, match="policies are some of"):
        register_holder(_Cache, lambda cache, copy: cache, policies=("none",))


class _Box:
    def __init__(self, held: torch.Tensor) -> None:
        self.held = held


class _SubBox(_Box):
    pass


class _Once:
    def __init__(self, held: torch.Tensor) -> None:
        self.held = held


def test_a_holder_registered_again_or_for_a_subclass_with_fewer_policies_is_copied_as_before():
    # Both were a RecursionError under the policies left out: the copy registered for the base
    # class (or earlier for the class) rebuilt nothing and handed the value back to itself.
    from bcrecord.torch.copies import register_holder

    def rebuild(box, copy):
        return type(box)(copy(box.held))

    register_holder(_Box, rebuild)
    register_holder(_SubBox, rebuild, policies=("clone",))
    live = _SubBox(torch.ones(2, requires_grad=True) * 2)
    for policy in ("clone", "detach", "deepcopy"):  # under detach and deepcopy: as a _Box is
        copied = copy_value(live, policy)
        assert type(copied) is _SubBox and copied is not live and not copied.held.requires_grad
        in_list = value_policy(copy=policy, dtype=torch.float64)([live])[0]
        assert type(in_list) is _SubBox and in_list.held.dtype == torch.float64
    register_holder(_Once, rebuild)
    register_holder(_Once, rebuild, policies=("clone",))
    once = _Once(torch.ones(1))
    assert copy_value(once, "detach") is once
    assert value_policy(copy="detach", dtype=torch.float64)(once) is once
    assert copy_value(once, "clone") is not once


class _Tanh(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        pair = (h, torch.tanh(h))
        return pair[1] * 2


def _said_why(rec, stand_in: str) -> bool:
    return bool(rec.errors) and all(
        isinstance(e.error, ValueError) and stand_in in str(e.error) and "outside the trace" in str(e.error)
        for e in rec.errors
    )


def test_a_recording_around_torch_export_or_make_fx_keeps_no_fake_tensor_and_adds_nothing_to_the_graph():
    # The fake tensors export and make_fx trace on were recorded (reading one raised, saving
    # one too), and their clones were left in the exported graph, run by every call of it.
    from torch.fx.experimental.proxy_tensor import make_fx

    from bcrecord.torch import record

    torch.manual_seed(0)
    model, x = _Tanh(), torch.randn(2, 3)
    expected = torch.tanh(model.lin(x)) * 2
    params = dict(model.named_parameters())
    traces = {
        "export": lambda: torch.export.export(model, (x,)).module(),
        "make_fx": lambda: make_fx(
            lambda p, x: torch.func.functional_call(model, p, (x,)), tracing_mode="fake"
        )(params, x),
    }
    for name, trace in traces.items():
        for options in ({}, {"copy": "detach"}, {"grad": True}, {"reduce": lambda t: t.sum()}):
            with (
                pytest.warns(RecordingWarning, match="FakeTensor"),
                record(model, [":forward:h", ":forward:pair", "lin"], **options) as rec,
            ):
                traced = trace()
            assert rec.keys() == [] and _said_why(rec, "a FakeTensor"), (name, options)
            ops = [str(node.target) for node in traced.graph.nodes if node.op == "call_function"]
            assert not any("clone" in op or "_to_copy" in op for op in ops), (name, options, ops)
            out = traced(x) if name == "export" else traced(params, x)
            assert torch.allclose(out, expected)
    with record(model, [":forward:h"]) as rec:  # a run outside the trace records
        model(x)
    assert torch.allclose(rec[":forward:h@0"], model.lin(x))


def test_a_recording_around_fx_symbolic_trace_keeps_no_proxy():
    # FX's Proxy objects were recorded as the values (holding the tracer and its graph).
    import bcrecord
    from bcrecord.torch import record

    model, x = _Tanh(), torch.randn(2, 3)
    with pytest.warns(RecordingWarning, match="Proxy"), record(model, [":forward:h"]) as rec:
        graph_module = torch.fx.symbolic_trace(model)
    assert rec.keys() == [] and _said_why(rec, "a torch.fx Proxy")
    with pytest.warns(RecordingWarning, match="Proxy"), bcrecord.recording() as core:
        with bcrecord.patch_method(_Tanh, "forward", ["h"]):
            torch.fx.symbolic_trace(model)
    assert core.keys() == [] and _said_why(core, "a torch.fx Proxy")
    assert torch.allclose(graph_module(x), torch.tanh(model.lin(x)) * 2)

    # In a list under 'deepcopy' too (deepcopy copied the proxies).
    def pair(value):
        both = [value, value * 2]
        return both

    paired = bcrecord.instrument(pair, ["both"], name="pair")

    class Pairs(torch.nn.Module):
        def forward(self, value):
            return paired(value)[1]

    with pytest.warns(RecordingWarning, match="Proxy"), bcrecord.recording(copy="deepcopy") as core:
        torch.fx.symbolic_trace(Pairs())
    assert core.keys() == [] and _said_why(core, "a torch.fx Proxy")


def test_a_wrapper_subclass_around_a_tracer_s_fake_tensors_is_not_recorded():
    # A DTensor-like wrapper (any __tensor_flatten__ subclass) traced by make_fx holds fake
    # tensors: it was recorded (its clone left in the graph); a real one still is.
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.testing._internal.two_tensor import TwoTensor

    from bcrecord.torch import record

    class Double(torch.nn.Module):
        def forward(self, x):
            h = x * 2
            return h + 1

    model, x = Double(), TwoTensor(torch.ones(3), torch.full((3,), 2.0))
    with pytest.warns(RecordingWarning, match="TwoTensor around a FakeTensor"):
        with record(model, [":forward:h"]) as rec:
            traced = make_fx(model, tracing_mode="fake")(x)
    assert rec.keys() == [] and _said_why(rec, "a TwoTensor around a FakeTensor")
    ops = [str(node.target) for node in traced.graph.nodes if node.op == "call_function"]
    assert not any("clone" in op for op in ops), ops
    with record(model, [":forward:h"]) as rec:
        model(x)
    kept = rec[":forward:h@0"]
    assert type(kept) is TwoTensor and torch.equal(kept.b, torch.full((3,), 4.0))


@pytest.mark.parametrize("copy", ["clone", "detach", "deepcopy"])
def test_a_wrapper_subclass_around_fake_tensors_is_not_recorded_by_a_core_recording_either(copy):
    # A record() block refused it; bcrecord.recording() around a patch (each core policy's
    # tensor copier) recorded TwoTensor(FakeTensor, FakeTensor) and left its clone in the graph.
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.testing._internal.two_tensor import TwoTensor

    import bcrecord

    def double(x):
        h = x * 2
        return h + 1

    x = TwoTensor(torch.ones(3), torch.full((3,), 2.0))
    with bcrecord.patch_function(double, ["h"], name="m"):
        with pytest.warns(RecordingWarning, match="TwoTensor around a FakeTensor"):
            with bcrecord.recording(copy=copy) as rec:
                traced = make_fx(double, tracing_mode="fake")(x)
        assert rec.keys() == [] and _said_why(rec, "a TwoTensor around a FakeTensor")
        ops = [str(node.target) for node in traced.graph.nodes if node.op == "call_function"]
        assert not any("clone" in op or "detach" in op for op in ops), ops
        with bcrecord.recording(copy=copy) as rec:
            double(x)
    kept = rec["m:double:h@0"]
    assert type(kept) is TwoTensor and torch.equal(kept.b, torch.full((3,), 4.0))


def test_to_meta_keeps_each_tensor_s_shape_and_dtype_not_its_data():
    kept = value_policy(to="meta")((torch.ones(2, 3), torch.arange(4)))
    assert [(t.device.type, tuple(t.shape), t.dtype) for t in kept] == [
        ("meta", (2, 3), torch.float32),
        ("meta", (4,), torch.int64),
    ]


def _logged(name: str) -> str:
    entry = name
    return entry


@pytest.mark.parametrize("mode", ["dispatch", "function"])
@pytest.mark.parametrize("copy", ["clone", "detach", "deepcopy"])
def test_a_copy_s_ops_seen_by_a_program_s_mode_record_nothing(mode, copy):
    # A mode's __torch_dispatch__ or __torch_function__ runs for the copy's ops too, and
    # called patched code, whose values the recordings took as the program's.
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    import bcrecord

    class Logs(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            _logged(str(func))
            return func(*args, **(kwargs or {}))

    class LogsCalls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            _logged(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    def double(x):
        y = x * 2
        return y

    x = torch.ones(2)
    with (
        bcrecord.patch_function(_logged, ["entry"], name="log"),
        bcrecord.patch_function(double, ["y"], name="f"),
        bcrecord.recording(copy=copy) as rec,
    ):
        with Logs() if mode == "dispatch" else LogsCalls():
            double(x)
    assert rec.all("log:_logged:entry@0") == (["aten.mul.Tensor"] if mode == "dispatch" else ["mul"])
    assert torch.equal(rec["f:double:y@0"], torch.full((2,), 2.0))


def test_a_tensor_kept_in_the_graph_from_under_vmap_is_taken_silently_under_a_mode_too():
    # copy='detach' with grad=True inside vmap: its movedim ops were the program's values.
    from torch.overrides import TorchFunctionMode

    import bcrecord
    from bcrecord.torch import record

    class LogsCalls(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            _logged(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    with bcrecord.patch_function(_logged, ["entry"], name="log"):
        with record(model, [""], copy="detach", grad=True) as rec, bcrecord.recording() as logged:
            with LogsCalls():
                torch.func.vmap(model)(x)
    assert "movedim" not in logged.all("log:_logged:entry@0")
    assert torch.allclose(rec[":forward:return"], model(x))


def test_the_default_device_s_mode_is_no_program_s_mode_copies_run_silently_under():
    # torch.set_default_device turns a function mode on for the whole program: torch's own, which
    # calls nothing patched. Silencing each copy under it cost several times the copy.
    from torch.overrides import TorchFunctionMode

    from bcrecord.torch.copies import _function_modes

    assert not torch._C._is_torch_function_mode_enabled()  # (None: no mode, as every test leaves it)
    torch.set_default_device("cpu")
    try:
        assert not _function_modes()
        with TorchFunctionMode():
            assert _function_modes()
    finally:
        torch.set_default_device(None)  # ('cpu' again would leave its mode on: no fast paths after)
    assert not _function_modes() and not torch._C._is_torch_function_mode_enabled()


@pytest.mark.parametrize("options", [{"dtype": torch.float64}, {"reduce": torch.sum}, {"to": "meta"}])
def test_a_set_s_tensors_take_the_options_as_a_list_s_do(options):
    # A set alone was copied by the core: dtype, reduce and to were not applied.
    keep = value_policy(**options)
    alone, in_list = keep({torch.ones(2)}), keep([{torch.ones(2)}])
    for kept in (next(iter(alone)), next(iter(in_list[0]))):
        expected = torch.ones(2)
        expected = expected.sum() if "reduce" in options else expected.to(options.get("dtype", torch.float32))
        assert kept.shape == expected.shape and kept.dtype == expected.dtype
        assert kept.device.type == ("meta" if "to" in options else "cpu")


def test_a_reduce_giving_a_set_s_tensor_an_unhashable_value_is_told_why_it_cannot_be_kept():
    with pytest.raises(TypeError, match=r"unhashable type: 'dict': a set in the value holds what reduce"):
        value_policy(reduce=lambda t: {"mean": t.mean()})([{torch.ones(2)}])
    with pytest.raises(TypeError, match=r"^unhashable type: 'list'$"):  # (no set: the reduce's own error)
        value_policy(reduce=lambda t: hash([]))([torch.ones(2)])


def test_deepcopy_of_a_module_beside_its_parameter_keeps_its_parameters_parameters():
    # A plug-in's 'deepcopy' copier is taken inside containers (deepcopy's memo): the tensor one
    # was too, and the module's copy got a plain tensor where its Parameter was.
    frozen = torch.nn.Linear(2, 2).requires_grad_(False)
    module, weight = copy_value((frozen, frozen.weight), "deepcopy")
    assert type(module.weight) is torch.nn.Parameter and module.weight is weight
    assert torch.equal(weight, frozen.weight) and weight is not frozen.weight
    assert module.to("meta").weight.device.type == "meta"


def test_deepcopy_under_inference_mode_gives_normal_tensors_in_containers_too():
    import bcrecord

    def f(x):
        t = x * 2
        y = [x * 2, {"k": x * 3}]
        return t

    with (
        torch.inference_mode(),
        bcrecord.recording(copy="deepcopy") as rec,
        bcrecord.patch_function(f, ["t", "y"], name="f"),
    ):
        f(torch.ones(2))
    listed = rec["f:f:y@0"]
    assert not rec["f:f:t@0"].is_inference()
    assert not listed[0].is_inference() and not listed[1]["k"].is_inference()  # (they were)
    assert torch.equal(listed[0].add_(1), torch.full((2,), 3.0))


def test_what_a_reduce_returns_is_copied_under_clone_however_it_shares_memory():
    live = torch.zeros(3)
    # Its own tensor, changed in place by the next call (a running mean): each value its own.
    mean = torch.zeros(())
    running = value_policy(reduce=lambda t: mean.mul_(0.5).add_(0.5 * t.mean()))
    kept = [running(torch.full((2,), float(i))) for i in range(3)]
    assert [value.item() for value in kept] == [0.0, 0.5, 1.25]
    # Sharing live's memory through a storage of its own: later writes to live do not show.
    shared = value_policy(reduce=lambda t: torch.utils.dlpack.from_dlpack(t[1:]))(live)
    live.add_(100)
    assert torch.equal(shared, torch.zeros(2))
    # A view of a temporary: only its own elements are kept, not the temporary.
    row = value_policy(reduce=lambda t: t.softmax(-1)[0])(torch.zeros(100, 100))
    assert row.untyped_storage().nbytes() == 100 * 4
    # Still one copy where to or dtype made one: not copied again.
    cast = value_policy(dtype=torch.float64, reduce=lambda t: t * 2)(torch.ones(2))
    assert cast.dtype == torch.float64 and cast._base is None
