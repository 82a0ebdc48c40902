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
