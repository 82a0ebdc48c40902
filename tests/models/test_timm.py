"""timm: a ViT's per-block tokens from its `for blk in self.blocks` style loop."""

import pytest
import torch

timm = pytest.importorskip("timm", reason="the models tox env installs timm")

import bcrecord  # noqa: E402
from bcrecord.torch import create_feature_extractor, record  # noqa: E402


def test_vit_tiny_tokens_after_every_block_in_order():
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    image = torch.randn(1, 3, 224, 224)
    with torch.no_grad(), record(model, [":forward_features:x", "blocks.*"]) as rec:
        out = model(image)
    # ViT's blocks run as one nn.Sequential call: x@3 is its result; each block's output
    # is recorded in order, and equals running the blocks one by one.
    with torch.no_grad():
        x = model.patch_embed(image)
        x = model._pos_embed(x)
        x = model.patch_drop(x)
        x = model.norm_pre(x)
        for i, block in enumerate(model.blocks):
            x = block(x)
            assert torch.allclose(rec[f"blocks.{i}:forward:return"], x, atol=1e-5), i
    assert len([k for k in rec.keys() if k.startswith("blocks.")]) == len(model.blocks) == 12
    keys = rec.keys_of(":forward_features:x")
    assert torch.allclose(rec[keys[-1]], model.norm(x), atol=1e-5)
    with torch.no_grad():
        assert torch.allclose(out, model(image), atol=1e-5)


def test_vit_attention_locals_in_every_block():
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    image = torch.randn(1, 3, 224, 224)
    feats = create_feature_extractor(model, {"blocks.3.attn:forward:x@0": "qkv_input", "blocks.3": "block3"})(
        image
    )
    assert feats["qkv_input"].shape[0] == 1 and feats["block3"].shape == (1, 197, 192)


def test_levit_attention_transpose_is_refused_where_fx_names_an_op_that_is_no_site():
    # Attention.forward: q.transpose() where use_conv, else (attn @ v).transpose() (no site).
    model = timm.create_model("levit_128s", pretrained=False).eval()
    node = "stages.0.blocks.0.attn.transpose"
    from torchvision.models.feature_extraction import get_graph_node_names

    assert node in get_graph_node_names(model)[1]
    with pytest.raises(bcrecord.TargetError, match="a branch decides whether it or the sites run"):
        create_feature_extractor(model, [node])


def test_coat_lite_shared_conv_pos_enc_ops_are_its_first_runs_as_torchvision_names_them():
    # One ConvPosEnc ('cpe1') runs in each serial block: FX's 'cpe1.transpose' is its
    # first run's (the second's 'cpe1.transpose_2'); stop_early=False gave both, in a list.
    from torchvision.models.feature_extraction import create_feature_extractor as fx_extractor

    torch.manual_seed(0)
    model = timm.create_model("coat_lite_tiny", pretrained=False).eval()
    nodes = ["cpe1.transpose", "cpe1.flatten"]
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        ours = create_feature_extractor(model, nodes, stop_early=False)(x)
        fx = fx_extractor(model, nodes)(x)
    for node in nodes:
        assert isinstance(ours[node], torch.Tensor) and torch.allclose(ours[node], fx[node], atol=1e-5), node


def test_a_metaformer_head_its_forward_head_never_calls_names_its_last_submodule():
    # forward_head calls self.head.global_pool ... self.head.fc, never self.head: 'head' was
    # accepted and then never reached, with a hint about branches and modes alone.
    from torchvision.models.feature_extraction import create_feature_extractor as fx_extractor

    torch.manual_seed(0)
    model, x = timm.create_model("poolformer_s12", pretrained=False).eval(), torch.randn(1, 3, 64, 64)
    # Closed at once: their patches (of torch.nn's Sequential and Linear) would otherwise go
    # when the garbage collector finds them, maybe during a later test's torch.compile.
    whole, part = create_feature_extractor(model, ["head"]), create_feature_extractor(model, ["head.fc"])
    try:
        with torch.no_grad(), pytest.raises(RuntimeError) as error:
            whole(x)
        assert "(the Sequential at 'head' was not called in this forward; " in str(error.value)
        assert str(error.value).endswith(
            "one of 'head.global_pool', 'head.norm', 'head.flatten', 'head.drop', 'head.fc')"
        )
        with torch.no_grad():
            ours = part(x)["head.fc"]
            theirs = fx_extractor(model, ["head"])(x)["head"]
            assert torch.equal(ours, theirs) and torch.equal(ours, model(x))
    finally:
        whole.close()
        part.close()
