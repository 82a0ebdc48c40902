"""torch.compile: a patched model compiles, runs correctly and records every value."""

import torch
import torch._dynamo

from bcrecord.torch import record

from .models import SmallNet, reference_smallnet


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
    # the probe runs outside the graph: one break per probe site, nothing else
    reasons = list(counters["graph_break"])
    assert reasons and all("bcrecord_probe" in r for r in reasons), [r[:300] for r in reasons]


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
