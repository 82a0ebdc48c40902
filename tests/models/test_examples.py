"""Every script in docs/examples runs, and what it prints and writes is right.

Each example runs in a subprocess of this interpreter; its artefacts are checked
against computations made here, independently of bcrecord. An example whose
libraries are missing is skipped, so each tox environment runs its own: ``models``
(torchvision, timm), ``lightning``, ``transformers``.
"""

import csv
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

import bcrecord

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "docs" / "examples"


def run_example(name, out):
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(ROOT),
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_example_is_covered_here():
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    source = Path(__file__).read_text()
    assert scripts and all(f'"{name}"' in source for name in scripts), scripts


# --- torchvision -----------------------------------------------------------------


def test_torchvision_resnet_stages_and_pre_relu_values(tmp_path):
    torchvision = pytest.importorskip("torchvision")
    stdout = run_example("torchvision_resnet.py", tmp_path)
    saved = bcrecord.load(tmp_path)
    torch.manual_seed(0)
    m = torchvision.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        stem = m.bn1(m.conv1(x))
        assert torch.allclose(saved[":_forward_impl:x@1"][0], stem, atol=1e-5)
        h = m.maxpool(torch.relu(stem))
        for s in range(1, 5):
            stage = getattr(m, f"layer{s}")
            for b, block in enumerate(stage):
                after_bn1 = block.bn1(block.conv1(h))
                identity = block.downsample(h) if block.downsample is not None else h
                after_add = block.bn2(block.conv2(torch.relu(after_bn1))) + identity
                assert torch.allclose(saved[f"layer{s}.{b}:forward:out@1"][0], after_bn1, atol=1e-4)
                assert torch.allclose(saved[f"layer{s}.{b}:forward:out@5"][0], after_add, atol=1e-4)
                h = torch.relu(after_add)
            assert torch.allclose(saved[f"layer{s}:forward:return"][0], h, atol=1e-4)
    assert len(saved) == 21
    # the pre-ReLU values really are negative in part; a forward hook saw them already clipped
    negatives = re.findall(r"layer1\.0:forward:out@1 +\(1, 64, 16, 16\) +negative +([\d.]+)%", stdout)
    assert negatives and 30 < float(negatives[0]) < 70
    line = re.search(r"bn1 output min: recorded (-[\d.]+), forward hook ([\d.]+)", stdout)
    assert line and float(line.group(1)) == pytest.approx(float(after_bn1_min(m, x)), abs=1e-4)
    assert float(line.group(2)) == 0.0
    assert "saved 21 keys" in stdout


def after_bn1_min(m, x):
    with torch.no_grad():
        h = m.maxpool(torch.relu(m.bn1(m.conv1(x))))
        return m.layer1[0].bn1(m.layer1[0].conv1(h)).min()


# --- timm ------------------------------------------------------------------------


def test_timm_vit_tokens_after_every_block(tmp_path):
    timm = pytest.importorskip("timm")
    stdout = run_example("timm_vit_tokens.py", tmp_path)
    saved = bcrecord.load(tmp_path)
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64).eval()
    attention = model.blocks[0].attn
    images = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
        assert torch.allclose(saved[":forward_features:x@3"][0], x, atol=1e-5)
        norms, to_self = [], []
        for i, block in enumerate(model.blocks):
            qkv = (
                block.attn.qkv(block.norm1(x))
                .reshape(2, 17, 3, attention.num_heads, -1)
                .permute(2, 0, 3, 1, 4)
            )
            q, k = qkv[0], qkv[1]
            probs = torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1)
            assert torch.allclose(saved[f"blocks.{i}.attn:forward:attn@2"][0], probs, atol=1e-5), i
            to_self.append(float(probs[:, :, 0, 0].mean()))
            x = block(x)
            assert torch.allclose(saved[f"blocks.{i}:forward:return"][0], x, atol=1e-4), i
            norms.append(float(x[:, 0].norm(dim=-1).mean()))
        assert torch.allclose(saved[":forward_features:x@7"][0], model.norm(x), atol=1e-4)
    assert saved[":forward_features:x@7"][0].shape == (2, 17, 192)
    printed = [float(v) for v in re.findall(r"cls norm +([\d.]+)", stdout)]
    assert printed == pytest.approx(norms, abs=2e-3)
    printed = [float(v) for v in re.findall(r"cls->cls attention ([\d.]+)", stdout)]
    assert printed == pytest.approx(to_self, abs=2e-3)
    assert "12 blocks, tokens (2, 17, 192)" in stdout and "saved 30 keys" in stdout


# --- transformers ----------------------------------------------------------------


def test_transformers_attention_map_picture(tmp_path):
    transformers = pytest.importorskip("transformers")
    image = pytest.importorskip("matplotlib.image")
    stdout = run_example("transformers_attention_map.py", tmp_path)
    assert stdout.count("equal output_attentions: True") == 2
    picture = image.imread(str(tmp_path / "attention.png"))
    assert picture.ndim == 3 and picture.shape[0] > 100 and picture.shape[1] > 300
    rgb = picture[..., :3].reshape(-1, 3)
    assert float(rgb.std()) > 0.05 and len({tuple(p) for p in (rgb[::7] * 255).round().tolist()}) > 20
    saved = bcrecord.load(tmp_path / "records")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=4, n_embd=32, vocab_size=100, n_positions=64, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager", initializer_range=0.3,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        attentions = model(ids, output_attentions=True).attentions
    for i in range(2):
        probs = saved[f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@2"][0]
        assert torch.equal(probs, attentions[i])
        scores = saved[f"transformer.h.{i}.attn:eager_attention_forward:attn_weights@0"][0]
        causal = torch.full((12, 12), float("-inf")).triu(1)
        assert torch.allclose(torch.softmax(scores + causal, -1), probs, atol=1e-6)


# --- lightning -------------------------------------------------------------------


def read_gray_png(data):
    """Decode an unfiltered 8-bit grayscale PNG (what bcrecord writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert data[24:26] == b"\x08\x00"  # 8 bits, grayscale
    start = data.index(b"IDAT") + 4
    length = int.from_bytes(data[start - 8 : start - 4], "big")
    raw = zlib.decompress(data[start : start + length])
    rows = [raw[r * (width + 1) : (r + 1) * (width + 1)] for r in range(height)]
    assert all(row[0] == 0 for row in rows)
    return torch.tensor([list(row[1:]) for row in rows], dtype=torch.float32)


def test_lightning_callback_example(tmp_path):
    pytest.importorskip("lightning.pytorch")
    stdout = run_example("lightning_callback.py", tmp_path)
    assert "patched after fit: False; Conv2d.forward is the original: True" in stdout
    assert "saved training steps: [0, 2, 4]" in stdout
    saved = bcrecord.load(tmp_path / "records" / "fit")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 1, 8, 8, generator=g)
    stds = {}
    for position, step in enumerate(saved.steps("conv:forward:return")):
        batch = x[8 * step : 8 * step + 8]  # one epoch of 6 batches: step k is batch k
        weight, bias = saved["conv:forward:self.weight"][position], saved["conv:forward:self.bias"][position]
        expected = torch.nn.functional.conv2d(batch, weight, bias, padding=1)
        assert torch.allclose(saved["conv:forward:return"][position], expected, atol=1e-5)
        assert torch.equal(saved[":forward:feats@0"][position], saved["conv:forward:return"][position])
        stds[step] = float(expected.double().std(correction=0))
    # the weights changed between recorded steps
    assert not torch.equal(saved["conv:forward:self.weight"][0], saved["conv:forward:self.weight"][1])
    for step, std in stds.items():
        printed = re.search(rf"fit +step {step} .* std ([\d.]+)", stdout)
        assert printed and float(printed.group(1)) == pytest.approx(std, abs=1e-4)
    log_dir = tmp_path / "csv" / "version_0"
    with open(log_dir / "metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    column = "bcrecord/fit/conv:forward:return/std"
    logged = {int(row["step"]): float(row[column]) for row in rows if row.get(column)}
    assert logged == pytest.approx(stds, abs=1e-5)
    assert any(row.get("train_loss") for row in rows)  # the module's own logging is untouched
    pictures = sorted((log_dir / "bcrecord_images" / "fit" / "conv_forward_return").iterdir())
    assert [p.name for p in pictures] == ["step_000000.png", "step_000002.png", "step_000004.png"]
    picture = read_gray_png(pictures[-1].read_bytes())
    conv = saved["conv:forward:return"][-1][0].mean(0)
    expected = ((conv - conv.min()) / (conv.max() - conv.min()) * 255).round()
    assert picture.shape == (8, 8) and float(picture.std()) > 10 and (picture - expected).abs().max() <= 1
    validate = bcrecord.load(tmp_path / "records" / "validate")
    assert validate.steps("conv:forward:return") == [0, 2]


# --- the command line on an unmodified script ------------------------------------------


def load_script(name):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"example_{name[:-3]}", EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_run_on_an_unmodified_training_script(tmp_path):
    import importlib.util

    if importlib.util.find_spec("bcrecord.runner") is None:
        pytest.skip("this bcrecord has no 'bcrecord run' (bcrecord.runner)")
    stdout = run_example("cli_run.py", tmp_path)
    alone = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_plain.py"), "--steps", "6"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert alone.count("loss") == 6 and stdout.startswith(alone)  # the script's output passes through
    assert "exit status 0" in stdout and "hidden@1 == relu(hidden@0) at every saved step: True" in stdout
    saved = bcrecord.load(tmp_path)
    # the same training, by hand: fc1's output and the loss at steps 0, 2, 4
    plain = load_script("train_plain.py")
    torch.manual_seed(0)
    x = torch.randn(32, 4)
    y = x.sum(1, keepdim=True)
    model = plain.TinyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hidden, losses = [], []
    for step in range(6):
        batch = slice(8 * (step % 4), 8 * (step % 4) + 8)
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        if step % 2 == 0:
            hidden.append(model.fc1(x[batch]).detach())
            losses.append(float(loss.detach()))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert saved.steps("TinyNet:forward:hidden@0") == [0, 2, 4]
    for got, expected in zip(saved["TinyNet:forward:hidden@0"], hidden, strict=True):
        assert torch.allclose(got, expected, atol=1e-6)
    assert [float(v) for v in saved["__main__:main:loss@1"]] == pytest.approx(losses, rel=1e-6)


# --- MMEngine --------------------------------------------------------------------


def test_mmengine_config_example(tmp_path):
    pytest.importorskip("mmengine")
    pytest.importorskip("bcrecord.integrations.mmengine")
    from mmengine.config import Config

    config = Config.fromfile(str(EXAMPLES / "mmengine_toy_config.py"))
    assert config.custom_hooks[0]["type"] == "RecorderHook"
    stdout = run_example("mmengine_config.py", tmp_path)
    assert "saved iterations: [0, 1, 2, 3]" in stdout and "model patched after the run: False" in stdout
    saved = bcrecord.load(tmp_path / "records" / "train")
    g = torch.Generator().manual_seed(0)
    data = torch.randn(12, 2, generator=g)
    key = "runner_model:forward:"
    for i in range(4):
        inputs = saved[key + "inputs@0"][i]
        assert torch.equal(inputs, data[3 * i : 3 * i + 3])
        w1, b1 = saved[key + "self.linear1.weight"][i], saved[key + "self.linear1.bias"][i]
        w2, b2 = saved[key + "self.linear2.weight"][i], saved[key + "self.linear2.bias"][i]
        expected = torch.nn.functional.linear(torch.nn.functional.linear(inputs, w1, b1), w2, b2)
        assert torch.allclose(saved[key + "outputs@1"][i], expected, atol=1e-6)
    assert not torch.equal(saved[key + "self.linear1.weight"][0], saved[key + "self.linear1.weight"][3])
    printed = re.search(r"outputs@1 \(3, 1\) = \[([-\d., ]+)\]", stdout)
    last = saved[key + "outputs@1"][3].flatten().tolist()
    assert printed and [float(v) for v in printed.group(1).split(",")] == pytest.approx(last, abs=1e-4)
