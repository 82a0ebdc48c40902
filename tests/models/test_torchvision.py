"""Real torchvision models (no weights): resnet50 locals, Bottleneck outputs, FX comparison."""

import pytest
import torch
import torchvision
from torchvision.models.feature_extraction import create_feature_extractor as fx_extractor
from torchvision.models.resnet import Bottleneck

import bcrecord
from bcrecord.torch import create_feature_extractor, list_targets, record


@pytest.fixture(scope="module")
def resnet():
    torch.manual_seed(0)
    return torchvision.models.resnet50(weights=None).eval()


@pytest.fixture(scope="module")
def image():
    torch.manual_seed(1)
    return torch.randn(1, 3, 64, 64)


def test_forward_impl_locals_equal_an_independent_computation(resnet, image):
    with torch.no_grad(), record(resnet, [":_forward_impl:x"]) as rec:
        out = resnet(image)
    m = resnet
    with torch.no_grad():
        steps = [m.conv1(image)]
        steps.append(m.bn1(steps[-1]))  # BatchNorm, before the in-place ReLU
        for layer in (m.relu, m.maxpool, m.layer1, m.layer2, m.layer3, m.layer4, m.avgpool):
            steps.append(layer(steps[-1].clone()))
        steps.append(torch.flatten(steps[-1], 1))
        steps.append(m.fc(steps[-1]))
    assert rec.keys_of(":_forward_impl:x") == [f":_forward_impl:x@{i}" for i in range(11)]
    for i, expected in enumerate(steps):
        assert torch.allclose(rec[f":_forward_impl:x@{i}"], expected, atol=1e-5), i
    assert torch.equal(rec[":_forward_impl:x@10"], out)


def test_every_out_assignment_in_all_sixteen_bottlenecks(resnet, image):
    blocks = [name for name, mod in resnet.named_modules() if isinstance(mod, Bottleneck)]
    assert len(blocks) == 16
    with torch.no_grad(), record(resnet, ["layer*.*:forward:out", "layer*.*"]) as rec:
        resnet(image)
        codes = {type(resnet.get_submodule(b)).forward.__code__ for b in blocks}
    assert len(codes) == 1  # one rewritten code object shared by the 16 instances
    with torch.no_grad():
        inp = resnet.maxpool(resnet.relu(resnet.bn1(resnet.conv1(image))))
        for name in blocks:
            block = resnet.get_submodule(name)
            expected = [block.conv1(inp)]
            expected.append(block.bn1(expected[-1]))
            expected.append(torch.relu(expected[-1]))
            expected.append(block.conv2(expected[-1]))
            expected.append(block.bn2(expected[-1]))
            expected.append(torch.relu(expected[-1]))
            expected.append(block.conv3(expected[-1]))
            expected.append(block.bn3(expected[-1]))
            identity = inp if block.downsample is None else block.downsample(inp)
            expected.append(expected[-1] + identity)
            expected.append(torch.relu(expected[-1]))
            for i, value in enumerate(expected):
                assert torch.allclose(rec[f"{name}:forward:out@{i}"], value, atol=1e-4), (name, i)
            assert torch.allclose(rec[f"{name}:forward:return"], expected[-1], atol=1e-4)
            inp = rec[f"{name}:forward:return"]


def test_bn1_is_the_true_batch_norm_output_unlike_hooks_and_fx(resnet, image):
    with torch.no_grad():
        true_bn1 = resnet.bn1(resnet.conv1(image))
        ours = create_feature_extractor(resnet, ["bn1", "layer1"])(image)
        fx = fx_extractor(resnet, ["bn1", "layer1"])(image)
        hooked = {}
        handle = resnet.bn1.register_forward_hook(lambda m, i, o: hooked.setdefault("bn1", o))
        resnet(image)
        handle.remove()
    assert (true_bn1 < 0).any()
    assert torch.allclose(ours["bn1"], true_bn1, atol=1e-6)
    assert (fx["bn1"] >= 0).all() and (hooked["bn1"] >= 0).all()  # both see the in-place ReLU's result
    assert torch.allclose(ours["layer1"], fx["layer1"], atol=1e-5)


def test_stage_outputs_match_fx_and_early_stop_skips_the_rest(resnet, image):
    stages = ["layer1", "layer2", "layer3", "layer4", "avgpool"]
    with torch.no_grad():
        ours = create_feature_extractor(resnet, stages)(image)
        fx = fx_extractor(resnet, stages)(image)
        ran = []
        handle = resnet.layer3.register_forward_pre_hook(lambda *a: ran.append("layer3"))
        only2 = create_feature_extractor(resnet, ["layer2"])(image)
        handle.remove()
    for stage in stages:
        assert torch.allclose(ours[stage], fx[stage], atol=1e-5), stage
    assert ran == [] and torch.allclose(only2["layer2"], fx["layer2"], atol=1e-5)


def test_model_unchanged_after_recording(resnet, image):
    before = {k: v.clone() for k, v in resnet.state_dict().items()}
    classes = {cls: dict(vars(cls)) for cls in {type(m) for m in resnet.modules()}}
    with torch.no_grad(), record(resnet, ["layer*.*:forward:out", ":_forward_impl:x"]):
        resnet(image)
    assert all(torch.equal(before[k], v) for k, v in resnet.state_dict().items())
    assert {cls: dict(vars(cls)) for cls in classes} == classes
    assert not any("_bcrecord_path" in vars(m) for m in resnet.modules())


def test_list_targets_names_every_bottleneck_local(resnet):
    targets = list_targets(resnet)
    assert "layer3.5:forward:out@9" in targets and ":_forward_impl:x@10" in targets
    assert "layer1.0:forward:self.downsample@0" in targets


def test_compiled_resnet_records(resnet, image):
    # Fresh probed code objects too, not those another test compiled (rewrite's cache keeps them):
    # once in CI, Dynamo's guard building failed inside torch on a cache entry of such code.
    torch._dynamo.reset()
    bcrecord.rewrite.clear_cache()
    compiled = torch.compile(resnet, backend="aot_eager")
    with torch.no_grad(), record(resnet, ["layer1", "layer2.0:forward:out@7"]) as rec:
        out = compiled(image)
    with torch.no_grad():
        expected = resnet(image)
        layer1 = resnet.layer1(resnet.maxpool(resnet.relu(resnet.bn1(resnet.conv1(image)))))
    assert torch.allclose(out, expected, atol=1e-4)
    assert torch.allclose(rec["layer1:forward:return"], layer1, atol=1e-4)
    assert rec["layer2.0:forward:out@7"].shape == (1, 512, 8, 8)


def test_errors_name_the_problem(resnet):
    with pytest.raises(bcrecord.TargetError, match="assigned locals: identity, out"):
        with record(resnet, ["layer1.0:forward:outt"]):
            pass


def test_fx_node_names_of_functional_ops_map_to_call_and_operator_sites(resnet, image):
    nodes = ["flatten", "layer1.0.add", "layer3.5.add", "avgpool"]
    with torch.no_grad():
        ours = create_feature_extractor(resnet, nodes)(image)
        fx = fx_extractor(resnet, nodes)(image)
    for node in ("flatten", "avgpool"):
        assert torch.allclose(ours[node], fx[node], atol=1e-5), node
    for node in ("layer1.0.add", "layer3.5.add"):
        # FX returns the sum after the block's in-place ReLU changed it; bcrecord the true sum
        assert (ours[node] < 0).any() and (fx[node] >= 0).all()
        assert torch.allclose(torch.relu(ours[node]), fx[node], atol=1e-5), node
    with pytest.raises(bcrecord.TargetError, match="has 1 'flatten' site"):
        create_feature_extractor(resnet, ["flatten_1"])
    with pytest.raises(bcrecord.TargetError, match="no submodule 'layer1.0.nothing'"):
        create_feature_extractor(resnet, ["layer1.0.nothing"])


@pytest.mark.parametrize(
    "name, options, size, nodes",
    [
        # InceptionE.forward is torch.cat(self._forward(x)): its two cats in _forward come first
        ("inception_v3", dict(aux_logits=False, init_weights=False), 96, ["Mixed_7b.cat", "Mixed_7b.cat_2"]),
        # _DenseLayer's cat is in bn_function, which forward calls; GoogLeNet's flatten in _forward
        ("densenet121", {}, 64, ["features.denseblock1.denselayer2.cat", "flatten"]),
        ("googlenet", dict(aux_logits=False, init_weights=False), 64, ["flatten", "inception3a.cat"]),
        ("resnet18", {}, 64, ["layer1.0.relu_1", "layer2.0.add"]),  # a branch with no relu in it
    ],
)
def test_fx_names_of_ops_in_methods_forward_calls_equal_fx(name, options, size, nodes):
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **options).eval()
    for module in model.modules():  # FX would return values changed in place after the op
        if hasattr(module, "inplace"):
            module.inplace = False
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        ours = create_feature_extractor(model, nodes)(x)
        fx = fx_extractor(model, nodes)(x)
    for node in nodes:
        assert ours[node].shape == fx[node].shape and torch.allclose(ours[node], fx[node], atol=1e-5), node


def test_resnet_forward_impl_call_results(resnet, image):
    targets = [
        ":_forward_impl:self.avgpool()@0",
        ":_forward_impl:torch.flatten()@0",
        ":_forward_impl:self.fc()@0",
    ]
    with torch.no_grad(), record(resnet, targets) as rec:
        out = resnet(image)
        pooled = resnet.avgpool(
            resnet.layer4(
                resnet.layer3(
                    resnet.layer2(resnet.layer1(resnet.maxpool(resnet.relu(resnet.bn1(resnet.conv1(image))))))
                )
            )
        )
    assert torch.allclose(rec[":_forward_impl:self.avgpool()@0"], pooled, atol=1e-5)
    assert torch.allclose(rec[":_forward_impl:torch.flatten()@0"], torch.flatten(pooled, 1), atol=1e-5)
    assert torch.equal(rec[":_forward_impl:self.fc()@0"], out)


def test_maxvit_buffer_views_are_no_fx_nodes_so_its_bias_view_is_refused_not_misread():
    # RelativePositionalMultiHeadAttention: self.relative_position_index.view(-1) (a buffer:
    # FX runs it, no node), then table[index].view(...) (FX's 'view', which is no site).
    model = torchvision.models.maxvit_t(weights=None).eval()
    node = "blocks.0.layers.0.layers.window_attention.attn_layer.1.view"
    from torchvision.models.feature_extraction import get_graph_node_names

    eval_nodes = get_graph_node_names(model)[1]
    assert node in eval_nodes and f"{node}_1" not in eval_nodes
    with pytest.raises(bcrecord.TargetError, match=r"calls \.view\(\) only on values that are not a name"):
        create_feature_extractor(model, [node])


def test_a_compiled_extractor_switched_to_its_other_mode_gives_that_mode_s_nodes_as_torchvision():
    # Traced by Dynamo, the plan of the second mode came out with the first mode's targets:
    # KeyError 'features.1' at the first call after .train().
    torch.manual_seed(0)
    model, x = torchvision.models.mobilenet_v3_small().eval(), torch.randn(2, 3, 64, 64)
    nodes = {"train_return_nodes": ["features.1", "features.3.block.1"]}
    nodes["eval_return_nodes"] = ["features.2", "classifier.0"]
    ours, theirs = create_feature_extractor(model, **nodes), fx_extractor(model, **nodes)
    compiled = torch.compile(ours, backend="eager")
    with torch.no_grad():
        for mode in (False, True, False):
            ours.train(mode)
            theirs.train(mode)
            features, expected = compiled(x), theirs(x)
            assert (
                list(features)
                == list(expected)
                == nodes["train_return_nodes" if mode else "eval_return_nodes"]
            )
            assert all(torch.allclose(features[k], expected[k], atol=1e-5) for k in expected), mode
    ours.close()


def test_tv_tensors_saved_alone_load_with_their_class_and_metadata(tmp_path):
    # A BoundingBoxes saved alone loaded as a plain tensor: its format and canvas_size were lost.
    from torchvision import tv_tensors

    boxes = tv_tensors.BoundingBoxes(torch.tensor([[0.0, 0, 5, 5]]), format="CXCYWH", canvas_size=(8, 8))
    image = tv_tensors.Image(torch.rand(3, 4, 4))
    bcrecord.save({"m:f:boxes@0": [boxes], "m:f:image@0": [image]}, tmp_path)
    loaded = bcrecord.load(tmp_path)
    (boxes_back,), (image_back,) = loaded["m:f:boxes@0"], loaded["m:f:image@0"]
    assert type(boxes_back) is tv_tensors.BoundingBoxes and boxes_back.format == boxes.format
    assert boxes_back.canvas_size == (8, 8) and torch.equal(boxes_back, boxes)
    assert type(image_back) is tv_tensors.Image and torch.equal(image_back, image)


def test_segmentation_heads_interpolate_before_the_aux_branch_maps_as_fx():
    # DeepLabV3.forward: F.interpolate of the main output, then, under `if self.aux_classifier`,
    # the aux one: 'interpolate' was refused (not every site runs), though FX's is always the first.
    torch.manual_seed(0)
    model = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(
        weights=None, weights_backbone=None, aux_loss=True
    ).eval()
    x = torch.randn(1, 3, 64, 64)
    nodes = ["interpolate", "interpolate_1"]
    with torch.no_grad():
        ours = create_feature_extractor(model, nodes)(x)
        fx = fx_extractor(model, nodes)(x)
        out = model(x)
    for node, output in zip(nodes, ["out", "aux"], strict=True):
        assert torch.equal(ours[node], fx[node]) and torch.equal(ours[node], out[output]), node


def test_a_torchvision_ops_module_run_twice_is_a_leaf_as_torchvision_traces_it_without_a_warning():
    # torchvision's extractor makes torchvision.ops' modules leaves: Swin's StochasticDepth,
    # called twice per block, is 'stochastic_depth' then 'stochastic_depth_1'. bcrecord took
    # it as traced into and warned that torchvision's node was the last op of its last run.
    import warnings

    torch.manual_seed(0)
    model, x = torchvision.models.swin_t(weights=None).eval(), torch.randn(1, 3, 64, 64)
    nodes = ["features.1.1.stochastic_depth", "features.1.1.stochastic_depth_1"]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.RecordingWarning)
        ours = create_feature_extractor(model, nodes)(x)
        fx = fx_extractor(model, nodes)(x)
    assert not torch.equal(fx[nodes[0]], fx[nodes[1]])
    for node in nodes:
        assert torch.equal(ours[node], fx[node]), node


def test_an_fcn_backbone_s_path_warns_that_torchvision_s_node_is_its_last_op_not_its_dict():
    # The IntermediateLayerGetter's forward returns an OrderedDict, of which FX makes no node:
    # torchvision's 'backbone' is layer4's output. bcrecord returned the dict without a word.
    torch.manual_seed(0)
    model = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad(), pytest.warns(bcrecord.RecordingWarning) as caught:
        ours = create_feature_extractor(model, ["backbone"])(x)["backbone"]
    fx = fx_extractor(model, ["backbone"])
    with torch.no_grad():
        theirs = fx(x)["backbone"]
    assert [str(w.message).split(":")[0] for w in caught] == ["return node 'backbone' is a module path"]
    message = str(caught[0].message)
    assert "the OrderedDict the forward of the IntermediateLayerGetter there returns" in message
    assert list(ours) == ["out"] and torch.equal(ours["out"], theirs)


def test_a_detection_backbone_s_path_is_its_fpn_s_dict_as_torchvision_s_node_without_a_warning():
    # BackboneWithFPN returns what its FeaturePyramidNetwork (a torchvision.ops module, which
    # torchvision's tracer keeps whole) returns: torchvision's node 'backbone' is that dict too.
    import warnings

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None
    ).eval()
    image = torch.rand(3, 64, 64)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", bcrecord.RecordingWarning)
        got = create_feature_extractor(model, ["backbone"])([image])["backbone"]
        expected = model.backbone(model.transform([image])[0].tensors)
    assert list(got) == list(expected) == ["0", "1", "pool"]
    assert all(torch.equal(got[key], expected[key]) for key in expected)
