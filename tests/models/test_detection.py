"""torchvision detection and segmentation models (no weights): locals inside RoIHeads, the RPN and
postprocessing, train mode's losses, ImageList values, extractors per mode, segmentation's OrderedDict.

torchvision's FX ``create_feature_extractor`` cannot trace these detection models at all: Faster R-CNN's
forward iterates over its input list (``TraceError: Proxy object cannot be iterated``), even for a target
as plain as ``'backbone.body.layer2'`` (checked below), and FX has no node for a local inside a method.
bcrecord's extractor runs the model's own forward, so it reaches those values, and stops it early.
"""

import pytest
import torch
from torchvision.models.detection import fasterrcnn_resnet50_fpn, maskrcnn_resnet50_fpn
from torchvision.models.detection.image_list import ImageList
from torchvision.models.feature_extraction import create_feature_extractor as fx_extractor
from torchvision.models.segmentation import fcn_resnet50

from bcrecord.torch import create_feature_extractor, list_targets, record

# Small images, and 100 proposals per image (not 1000): the box head's cost is per proposal.
SMALL = dict(weights=None, weights_backbone=None, min_size=160, max_size=160, rpn_post_nms_top_n_test=100)


@pytest.fixture(scope="module")
def detector():
    torch.manual_seed(0)
    return fasterrcnn_resnet50_fpn(**SMALL, rpn_post_nms_top_n_train=100, box_batch_size_per_image=32).eval()


@pytest.fixture(scope="module")
def images():
    torch.manual_seed(1)
    return [torch.rand(3, 160, 160), torch.rand(3, 140, 170)]


@pytest.fixture(scope="module")
def targets():
    return [
        dict(boxes=torch.tensor([[10.0, 20, 80, 90]]), labels=torch.tensor([3])),
        dict(boxes=torch.tensor([[5.0, 5, 60, 70], [30, 30, 100, 120]]), labels=torch.tensor([1, 2])),
    ]


def _same_detections(first, second):
    return all(torch.equal(a[key], b[key]) for a, b in zip(first, second, strict=True) for key in a)


def test_locals_inside_rpn_and_roi_heads_equal_their_submodules_rerun(detector, images):
    names = [
        "transform:forward:image_list@0",
        "backbone",
        "rpn:forward:return",
        "roi_heads:forward:class_logits@0",
        "roi_heads:forward:box_regression@0",
        "roi_heads:postprocess_detections:return",
    ]
    with torch.no_grad():
        expected = detector(images)
        with record(detector, names) as rec:
            out = detector(images)
    assert _same_detections(out, expected)  # recording changes no bit of the output
    m, image_list = detector, rec["transform:forward:image_list@0"]
    with torch.no_grad():
        features = m.backbone(image_list.tensors)
        proposals, _ = m.rpn(image_list, features)
        pooled = m.roi_heads.box_roi_pool(features, proposals, image_list.image_sizes)
        logits, regression = m.roi_heads.box_predictor(m.roi_heads.box_head(pooled))
    assert list(rec["backbone:forward:return"]) == ["0", "1", "2", "3", "pool"]
    for level, value in features.items():
        assert torch.equal(rec["backbone:forward:return"][level], value), level
    assert all(torch.equal(a, b) for a, b in zip(rec["rpn:forward:return"][0], proposals, strict=True))
    assert torch.equal(rec["roi_heads:forward:class_logits@0"], logits)
    assert torch.equal(rec["roi_heads:forward:box_regression@0"], regression)
    boxes, scores, labels = rec["roi_heads:postprocess_detections:return"]
    result = [dict(boxes=b, scores=s, labels=c) for b, s, c in zip(boxes, scores, labels, strict=True)]
    original = [tuple(image.shape[-2:]) for image in images]
    assert _same_detections(m.transform.postprocess(result, image_list.image_sizes, original), out)


def test_an_image_list_is_copied_cast_and_unchanged_later(detector, images):
    live = []
    hook = detector.backbone.register_forward_pre_hook(lambda module, args: live.append(args[0]))
    try:
        with torch.no_grad(), record(detector, ["transform:forward:image_list@0"], keep="all") as rec:
            detector(images)
            detector(images[:1])
        with (
            torch.no_grad(),
            record(detector, ["transform:forward:image_list@0"], dtype=torch.float16) as half,
        ):
            detector(images)
    finally:
        hook.remove()
    kept = rec.values_of("transform:forward:image_list@0")["transform:forward:image_list@0"]
    assert [type(value) for value in kept] == [ImageList, ImageList]
    assert [value.image_sizes for value in kept] == [[(160, 160), (131, 160)], [(160, 160)]]
    assert torch.equal(kept[0].tensors, live[0]) and kept[0].tensors.data_ptr() != live[0].data_ptr()
    live[0].add_(1)  # the model's own batch tensor, changed after the fact
    assert not torch.equal(kept[0].tensors, live[0])
    assert half["transform:forward:image_list@0"].tensors.dtype == torch.float16


def test_train_mode_losses_are_recorded_and_unchanged(detector, images, targets):
    detector.train()
    try:
        torch.manual_seed(5)  # (the RoI sampler draws at random)
        expected = detector(images, targets)
        with record(
            detector, ["roi_heads:forward:losses@1", ":forward:losses@0", "roi_heads:forward:labels@0"]
        ) as rec:
            torch.manual_seed(5)
            losses = detector(images, targets)
        sum(losses.values()).backward()  # the recorded copies are outside the graph
    finally:
        detector.eval()
        detector.zero_grad(set_to_none=True)
    assert {key: torch.equal(value, expected[key]) for key, value in losses.items()} == dict.fromkeys(
        losses, True
    )
    box_losses = rec["roi_heads:forward:losses@1"]
    assert list(box_losses) == ["loss_classifier", "loss_box_reg"]
    assert all(
        torch.equal(value, losses[key]) and not value.requires_grad for key, value in box_losses.items()
    )
    assert rec[":forward:losses@0"] == {}  # as it was when assigned: filled by update() later
    labels = rec["roi_heads:forward:labels@0"]  # the sampled RoIs' classes: targets' or background
    assert [len(image_labels) for image_labels in labels] == [32, 32]
    assert set(torch.cat(labels).tolist()) <= {0, 1, 2, 3}


def test_options_apply_to_each_tensor_in_a_list(detector, images):
    with torch.no_grad(), record(detector, ["rpn:forward:objectness@0"], reduce=lambda t: t.amax()) as peaks:
        detector(images)
    with torch.no_grad(), record(detector, ["rpn:forward:objectness@0"], copy="detach", to="cpu") as rec:
        detector(images)
    levels = rec["rpn:forward:objectness@0"]  # one tensor per FPN level
    assert len(levels) == 5 and all(tensor.device.type == "cpu" for tensor in levels)
    assert [float(peak) for peak in peaks["rpn:forward:objectness@0"]] == [float(t.amax()) for t in levels]


def test_extractor_per_mode_and_the_error_for_a_branch_the_mode_skips(detector, images, targets):
    with pytest.raises(
        RuntimeError, match=r"ran in eval mode: .* train_return_nodes= and eval_return_nodes="
    ):
        create_feature_extractor(detector, ["roi_heads:forward:loss_classifier@0"])(images)
    extractor = create_feature_extractor(
        detector,
        train_return_nodes=["roi_heads:forward:loss_classifier@0"],
        eval_return_nodes=["roi_heads:postprocess_detections:return"],
    )
    with torch.no_grad():
        expected = detector(images)
        detections = extractor(images)["roi_heads:postprocess_detections:return"]
    assert [len(boxes) for boxes in detections[0]] == [len(image["boxes"]) for image in expected]
    extractor.train()
    try:
        torch.manual_seed(5)
        loss = extractor(images, targets)["roi_heads:forward:loss_classifier@0"]
        torch.manual_seed(5)
        assert torch.equal(loss, detector(images, targets)["loss_classifier"])
    finally:
        extractor.eval()


def test_early_stop_after_the_rpn_where_fx_cannot_trace(detector, images):
    try:
        with pytest.raises(Exception, match="Proxy object cannot be iterated"):
            fx_extractor(detector, ["backbone.body.layer2"])
    finally:
        detector.eval()  # (FX's extractor traces in train mode, and its error leaves the model there)
    ran = []
    hook = detector.roi_heads.register_forward_pre_hook(lambda *args: ran.append("roi_heads"))
    try:
        with torch.no_grad():
            feats = create_feature_extractor(
                detector, ["backbone.body.layer2", "rpn:filter_proposals:return"]
            )(images)
    finally:
        hook.remove()
    boxes, scores = feats["rpn:filter_proposals:return"]
    assert ran == [] and feats["backbone.body.layer2"].shape == (2, 512, 20, 20)
    assert [len(b) for b in boxes] == [len(s) for s in scores] and all(len(b) <= 100 for b in boxes)


def test_list_targets_names_locals_of_rpn_roi_heads_and_transform(detector):
    targets = list_targets(detector, ["forward", "filter_proposals", "postprocess_detections"])
    for name in (
        "rpn:filter_proposals:final_boxes@0",
        "roi_heads:postprocess_detections:pred_boxes_list@0",
        "transform:forward:image_list@0",
        "roi_heads:forward:self.box_predictor()@0",
        "backbone.body.layer2",
    ):
        assert name in targets, name


def test_mask_rcnn_mask_logits_equal_the_mask_head_rerun(images):
    torch.manual_seed(2)
    model = maskrcnn_resnet50_fpn(**SMALL, box_detections_per_img=4).eval()
    with torch.no_grad():
        expected = model(images)
        with record(model, ["roi_heads:forward:mask_features@1", "roi_heads:forward:mask_logits@0"]) as rec:
            out = model(images)
        logits = model.roi_heads.mask_predictor(rec["roi_heads:forward:mask_features@1"])
    assert _same_detections(out, expected)
    assert rec["roi_heads:forward:mask_logits@0"].shape == (8, 91, 28, 28)
    assert torch.equal(rec["roi_heads:forward:mask_logits@0"], logits)


def test_segmentation_aux_and_main_heads_from_its_ordered_dict():
    torch.manual_seed(3)
    model = fcn_resnet50(weights=None, weights_backbone=None, aux_loss=True, num_classes=4).eval()
    image = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        expected = model(image)
        with record(model, ["backbone", "classifier", "aux_classifier", ":forward:result@0"]) as rec:
            out = model(image)
        features = model.backbone(image)
    assert list(out) == ["out", "aux"] and all(torch.equal(out[k], expected[k]) for k in out)
    assert list(rec["backbone:forward:return"]) == ["aux", "out"] == list(features)  # (layer3's, layer4's)
    assert torch.equal(rec["classifier:forward:return"], model.classifier(features["out"]))
    assert torch.equal(rec["aux_classifier:forward:return"], model.aux_classifier(features["aux"]))
    assert type(rec[":forward:result@0"]).__name__ == "OrderedDict" and rec[":forward:result@0"] == {}
