"""The torch layer on each device there is: the CPU always, CUDA where a GPU is present.

Every test runs once per device. Without a GPU only the CPU cases run (that checks
the tests themselves); on a machine with one, the CUDA cases check what differs
there: clones that are real copies (no copy-on-write), copies to the CPU made with
``non_blocking=True`` that the recording waits for before anyone reads them, and
gradients arriving from the backward pass.
"""

import pytest
import torch
import torchvision

from bcrecord.torch import create_feature_extractor, record

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def resnet(device):
    torch.manual_seed(0)
    return torchvision.models.resnet18(weights=None).eval().to(device)


def _image(device, batch=2, size=64):
    torch.manual_seed(1)
    # Larger on a GPU, so that a copy to the CPU is still in flight when it is read.
    if device.type == "cuda":
        batch, size = 16, 224
    return torch.randn(batch, 3, size, size, device=device)


def _stem(m, x):
    """The ResNet stem, step by step: conv1, bn1 (before the in-place ReLU), relu, maxpool."""
    conv = m.conv1(x)
    bn = m.bn1(conv)
    relu = torch.relu(bn)
    return bn, m.maxpool(relu)


def test_values_on_the_device_are_as_assigned(resnet, device):
    x = _image(device)
    with torch.no_grad(), record(resnet, ["bn1", "layer1", ":_forward_impl:x@4"]) as rec:
        out = resnet(x)
    with torch.no_grad():
        bn, pooled = _stem(resnet, x)
        layer1 = resnet.layer1(pooled)
    got = rec["bn1:forward:return"]
    assert got.device == x.device and not got.requires_grad
    # The true BatchNorm output: negative values survive the model's in-place ReLU.
    assert torch.allclose(got, bn, atol=1e-4) and bool((got < 0).any())
    assert torch.allclose(rec["layer1:forward:return"], layer1, atol=1e-4)
    assert torch.equal(rec[":_forward_impl:x@4"], rec["layer1:forward:return"])
    assert out.shape == (x.shape[0], 1000)


def test_offloaded_values_are_complete_when_read(resnet, device):
    x = _image(device)
    with torch.no_grad():
        bn, pooled = _stem(resnet, x)
        expected = {"bn1": bn, "layer1": resnet.layer1(pooled)}
        expected["layer4"] = resnet.layer4(resnet.layer3(resnet.layer2(expected["layer1"])))
    with torch.no_grad(), record(resnet, list(expected), to="cpu") as rec:
        resnet(x)
        # Read at once, inside the block, with no synchronize by the caller.
        got = {name: rec[f"{name}:forward:return"] for name in expected}
    for name, value in got.items():
        assert value.device.type == "cpu", name
        assert torch.allclose(value, expected[name].cpu(), atol=1e-4), name
    assert bool((got["bn1"] < 0).any())


def test_extractor_offloads_and_casts(resnet, device):
    x = _image(device)
    extractor = create_feature_extractor(
        resnet, {"layer2": "c3", "avgpool": "pooled"}, to="cpu", dtype=torch.float64
    )
    with torch.no_grad():
        features = extractor(x)
        expected = resnet.avgpool(
            resnet.layer4(resnet.layer3(resnet.layer2(resnet.layer1(_stem(resnet, x)[1]))))
        )
    assert features["pooled"].device.type == "cpu" and features["pooled"].dtype == torch.float64
    assert torch.allclose(features["pooled"], expected.cpu().double(), atol=1e-4)
    assert features["c3"].shape[1] == 128
    extractor.close()


def test_gradients_follow_the_value_options(device):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)).to(device)
    x = torch.randn(32, 8, device=device)
    with record(net, ["1:forward:return.grad"], to="cpu") as rec:
        net(x).sum().backward()
        grad = rec["1:forward:return.grad"]
    hidden = torch.tanh(net[0](x)).detach().requires_grad_()
    (expected,) = torch.autograd.grad(net[2](hidden).sum(), hidden)
    assert grad.device.type == "cpu" and not grad.requires_grad
    assert torch.allclose(grad, expected.cpu(), atol=1e-5)


def test_compiled_model_records_what_eager_records(resnet, device):
    x = _image(device)
    compiled = torch.compile(resnet, backend="aot_eager")
    with torch.no_grad(), record(resnet, ["layer1.0:forward:out@2", "layer3"]) as eager:
        resnet(x)
    try:
        with torch.no_grad(), record(resnet, ["layer1.0:forward:out@2", "layer3"]) as rec:
            compiled(x)
    finally:
        torch._dynamo.reset()  # (its compiled code, on code objects other tests run, goes with it)
    for key in eager.keys():
        assert torch.allclose(rec[key], eager[key], atol=1e-4), key


def test_saved_values_load_on_the_cpu(device, tmp_path):
    from bcrecord.storage import Writer, load

    # A top-level tensor goes to safetensors; those in a tuple (an LSTM's output) are pickled.
    out, state = torch.arange(3.0, device=device), torch.ones(2, device=device)
    Writer(tmp_path).write({"m:f:out@0": [out], "m:f:pair@0": [(out, {"state": state})]}, step=0)
    loaded = load(tmp_path)
    (pair,) = loaded["m:f:pair@0"]
    assert [t.device.type for t in (loaded["m:f:out@0"][0], pair[0], pair[1]["state"])] == ["cpu"] * 3
    assert torch.equal(pair[0], out.cpu()) and torch.equal(pair[1]["state"], state.cpu())
