"""RecorderHook with a real MMEngine Runner on CPU: the proposal's configs, values, saving, cleanup."""

import ast
import copy
import inspect
import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the mmengine tox env installs torch")
mmengine = pytest.importorskip("mmengine", reason="the mmengine tox env installs mmengine")

import cv2  # noqa: E402  (mmengine depends on OpenCV)
import numpy  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from mmengine.evaluator import BaseMetric  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402
from mmengine.model import BaseModel, MMDistributedDataParallel  # noqa: E402
from mmengine.runner import Runner  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402

import bcrecord  # noqa: E402
from bcrecord import runtime  # noqa: E402
from bcrecord.errors import RecordingWarning  # noqa: E402
from bcrecord.integrations.mmengine import (  # noqa: E402
    RecorderConfigError,
    RecorderHook,
    RecorderVisualizationHook,
    image_name,
    parse_recorders,
    resolve_model,
)
from bcrecord.listing import decompiled  # noqa: E402

# MMEngine's and torch's own warnings are noise here; bcrecord's still fail a test.
pytestmark = pytest.mark.filterwarnings("ignore::Warning", "error::bcrecord.errors.RecordingWarning")

PROPOSAL_RECORDERS = [
    dict(type="FunctionRecorder", target="outputs", index=[1]),
    dict(type="AttributeRecorder", target="self.linear1.weight"),
]
RESNET_RECORDER = dict(
    model="resnet", method="_forward_impl", type="FunctionRecorder", target="x", index=[0, 1, 2]
)
OUTPUTS = "runner_model:forward:outputs@1"
WEIGHT = "runner_model:forward:self.linear1.weight"
X_KEYS = ["resnet:_forward_impl:x@0", "resnet:_forward_impl:x@1", "resnet:_forward_impl:x@2"]


# --- models and data, as in the proposal -------------------------------------------------


class ToyModel(BaseModel):
    def __init__(self, data_preprocessor=None):
        super().__init__(data_preprocessor=data_preprocessor)
        self.linear1 = nn.Linear(2, 2)
        self.linear2 = nn.Linear(2, 1)

    def forward(self, inputs, data_samples, mode="tensor"):
        if isinstance(inputs, list):
            inputs = torch.stack(inputs)
        if isinstance(data_samples, list):
            data_sample = torch.stack(data_samples)
        outputs = self.linear1(inputs)
        outputs = self.linear2(outputs)

        if mode == "tensor":
            return outputs
        elif mode == "loss":
            loss = (data_sample - outputs).sum()
            outputs = dict(loss=loss)
            return outputs
        elif mode == "predict":
            return outputs


TOY_FORWARD = ToyModel.forward
TOY_CODE = ToyModel.forward.__code__
LINEAR_FORWARD_CODE = nn.Linear.forward.__code__


class MiniResNet(nn.Module):
    """torchvision's ResNet in miniature: ``_forward_impl`` assigns ``x`` again and again."""

    def __init__(self, out_features=2):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)  # in place, as in torchvision: x@1 must not see it
        self.maxpool = nn.MaxPool2d(2)
        self.layer1 = nn.Conv2d(8, 8, 3, padding=1)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, out_features)

    def _forward_impl(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.avgpool(x)
        x = torch.flatten(x, 1)
        x = self.fc(x)
        return x

    def forward(self, x):
        return self._forward_impl(x)


RESNET_IMPL_CODE = MiniResNet._forward_impl.__code__


class MMResNet(BaseModel):
    def __init__(self):
        super().__init__()
        self.resnet = MiniResNet()

    def forward(self, imgs, labels, mode):
        x = self.resnet(imgs)
        if mode == "loss":
            return {"loss": F.cross_entropy(x, labels)}
        elif mode == "predict":
            return x, labels


class ToyResNetModel(BaseModel):
    """The proposal's ToyModel on top of a ResNet: every recorder of the issue's config applies."""

    def __init__(self):
        super().__init__()
        self.resnet = MiniResNet()
        self.linear1 = nn.Linear(2, 2)
        self.linear2 = nn.Linear(2, 1)

    def forward(self, inputs, data_samples, mode="tensor"):
        if isinstance(inputs, list):
            inputs = torch.stack(inputs)
        if isinstance(data_samples, list):
            data_sample = torch.stack(data_samples)
        outputs = self.linear1(self.resnet(inputs))
        outputs = self.linear2(outputs)
        if mode == "loss":
            return dict(loss=(data_sample - outputs).sum())
        return outputs


GENERATED_SOURCE = """
def forward(self, inputs, data_samples, mode="tensor"):
    if isinstance(inputs, list):
        inputs = torch.stack(inputs)
    if isinstance(data_samples, list):
        data_sample = torch.stack(data_samples)
    outputs = self.linear1(inputs)
    outputs = self.linear2(outputs)
    if mode == "loss":
        return dict(loss=(data_sample - outputs).sum())
    return outputs
"""
_namespace = {"torch": torch}
exec(compile(GENERATED_SOURCE, "<generated>", "exec"), _namespace)


class GeneratedToyModel(ToyModel):
    """ToyModel whose forward was built by exec: there is no source to read."""

    forward = _namespace["forward"]


class ToyDataset(Dataset):
    def __init__(self, n=12, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randn(n, 2, generator=g)
        self.label = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return dict(inputs=self.data[index], data_samples=self.label[index])


class ImageDataset(Dataset):
    def __init__(self, n=8, seed=0, keys=("imgs", "labels")):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 3, 16, 16, generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)
        self.keys = keys

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        if self.keys[1] == "data_samples":
            return dict(inputs=self.images[index], data_samples=self.labels[index : index + 1].float())
        return dict(imgs=self.images[index], labels=self.labels[index])


class CountMetric(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results.append(1)

    def compute_metrics(self, results):
        return dict(batches=float(len(results)))


class Checker(Hook):
    """Runs after RecorderHook; keeps what the MessageHub holds and what is needed to recompute it."""

    priority = "LOWEST"

    def __init__(self, keys, snapshot=None, fail=None):
        self.keys = keys
        self.snapshot = snapshot or (lambda runner, data_batch: None)
        self.fail = fail
        self.iters = {"train": [], "val": [], "test": []}

    def _before(self, runner, mode, batch_idx, data_batch):
        if self.fail is not None and self.fail(runner, mode, batch_idx):
            raise self.fail.error
        model = runner.model.module if hasattr(runner.model, "module") else runner.model
        self.iters[mode].append(
            {
                "step": runner.iter,
                "batch": copy.deepcopy(data_batch),
                "snapshot": self.snapshot(model, data_batch),
                "patched": "forward" in vars(model)
                or "_forward_impl" in vars(getattr(model, "resnet", model)),
            }
        )

    def _after(self, runner, mode):
        self.iters[mode][-1]["hub"] = {key: runner.message_hub.get_info(key) for key in self.keys}

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._before(runner, "train", batch_idx, data_batch)

    def before_val_iter(self, runner, batch_idx, data_batch=None):
        self._before(runner, "val", batch_idx, data_batch)

    def before_test_iter(self, runner, batch_idx, data_batch=None):
        self._before(runner, "test", batch_idx, data_batch)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._after(runner, "train")

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._after(runner, "val")

    def after_test_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self._after(runner, "test")


def toy_snapshot(model, data_batch):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def toy_expected(entry):
    """outputs@1 and linear1.weight computed from the batch and the weights before the step."""
    w = entry["snapshot"]
    x = torch.stack(entry["batch"]["inputs"])
    hidden = F.linear(x, w["linear1.weight"], w["linear1.bias"])
    return {OUTPUTS: F.linear(hidden, w["linear2.weight"], w["linear2.bias"]), WEIGHT: w["linear1.weight"]}


def resnet_snapshot(model, data_batch):
    return {"conv1": copy.deepcopy(model.resnet.conv1), "bn1": copy.deepcopy(model.resnet.bn1)}


def resnet_expected(entry):
    layers = entry["snapshot"]
    images = entry["batch"]["imgs"]
    x0 = layers["conv1"](images)
    x1 = layers["bn1"](x0)  # the copy is in train mode too: the same batch statistics
    return dict(zip(X_KEYS, (x0, x1, torch.relu(x1)), strict=True))


def make_runner(
    tmp_path, model, hooks, *, epochs=1, data=None, batch_size=3, val=False, test=False, iters=None, **kwargs
):
    data = data if data is not None else ToyDataset()
    loader = dict(
        dataset=data,
        sampler=dict(type="DefaultSampler", shuffle=False),
        batch_size=batch_size,
        num_workers=0,
    )
    if isinstance(data, ImageDataset) and data.keys[0] == "imgs":
        loader["collate_fn"] = dict(type="default_collate")
    evaluation = {}
    if val:
        evaluation.update(val_dataloader=dict(loader), val_cfg=dict(), val_evaluator=[CountMetric()])
    if test:
        evaluation.update(test_dataloader=dict(loader), test_cfg=dict(), test_evaluator=[CountMetric()])
    iteration_based = dict(by_epoch=False, max_iters=iters)  # (IterBasedTrainLoop)
    return Runner(
        model=model,
        work_dir=str(tmp_path / "work"),
        experiment_name=f"bcrecord-{uuid.uuid4().hex[:12]}",  # a fresh logger and visualizer
        train_dataloader=loader,
        train_cfg=dict(by_epoch=True, max_epochs=epochs) if iters is None else iteration_based,
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
        default_hooks=dict(checkpoint=None, logger=dict(type="LoggerHook", interval=1)),
        custom_hooks=hooks,
        **evaluation,
        **kwargs,
    )


def log_text(runner):
    return (Path(runner.log_dir) / f"{runner.timestamp}.log").read_text()


def assert_restored(model):
    assert "forward" not in vars(model)
    assert model.forward.__func__ is type(model).forward
    assert type(model).forward.__code__ is (
        TOY_CODE if type(model) is ToyModel else type(model).forward.__code__
    )
    resnet = getattr(model, "resnet", None)
    if resnet is not None:
        assert "_forward_impl" not in vars(resnet)
        assert MiniResNet._forward_impl.__code__ is RESNET_IMPL_CODE
    assert not runtime.is_active()


def proposal_ast_rewrite(method):
    """The first step of the original proposal: read the method's source and parse it with ast."""
    return ast.parse(textwrap.dedent(inspect.getsource(method)))


# --- the proposal's configs ----------------------------------------------------------------


class _Meta(dict):
    def __init__(self, source, **items):
        super().__init__(**items)
        self.source = source


class _Pair(tuple):
    def __new__(cls, a, b):
        return super().__new__(cls, (a, b))


def test_buffered_values_keep_their_containers_on_the_way_to_the_cpu():
    import collections

    from bcrecord.integrations.mmengine import _to_cpu

    counts = _to_cpu(collections.Counter(pos=3, neg=0))
    assert type(counts) is collections.Counter and counts == {"pos": 3, "neg": 0}
    lists = _to_cpu(collections.defaultdict(list, a=[torch.ones(1, requires_grad=True)]))
    assert lists.default_factory is list and not lists["a"][0].requires_grad
    meta = _to_cpu(_Meta("cfg", a=torch.ones(1)))
    assert type(meta) is _Meta and meta.source == "cfg" and torch.equal(meta["a"], torch.ones(1))
    pair = _to_cpu(_Pair(torch.ones(1), 2))
    assert pair[1] == 2 and torch.equal(pair[0], torch.ones(1))


def test_proposal_toy_model_values_reach_the_message_hub(tmp_path):
    torch.manual_seed(0)
    model = ToyModel()
    checker = Checker([OUTPUTS, WEIGHT], toy_snapshot)
    hook = dict(
        type="RecorderHook",
        recorders=PROPOSAL_RECORDERS,
        save_dir=str(tmp_path / "records"),
        print_modification=True,
    )
    runner = make_runner(tmp_path, model, [hook, checker], epochs=2)
    runner.train()

    iters = checker.iters["train"]
    assert [entry["step"] for entry in iters] == list(range(8))  # 12 samples / 3, two epochs
    for entry in iters:
        expected = toy_expected(entry)
        got = entry["hub"]
        assert entry["patched"]
        assert got[OUTPUTS].shape == (3, 1)
        assert torch.allclose(got[OUTPUTS], expected[OUTPUTS], rtol=1e-5, atol=1e-6)
        assert torch.equal(got[WEIGHT], expected[WEIGHT])  # the weight before this step's update
        assert not got[OUTPUTS].requires_grad and not got[WEIGHT].requires_grad
    # Weights moved during training; each iteration published its own copy.
    assert not torch.equal(iters[0]["hub"][WEIGHT], iters[-1]["hub"][WEIGHT])
    assert not torch.equal(iters[-1]["hub"][WEIGHT], model.linear1.weight.detach())

    # Saved records load and equal what was published, step by step.
    loaded = bcrecord.load(tmp_path / "records" / "train")
    assert set(loaded) == {OUTPUTS, WEIGHT}
    assert loaded.steps(OUTPUTS) == list(range(8))
    for entry, outputs, weight in zip(iters, loaded[OUTPUTS], loaded[WEIGHT], strict=True):
        assert torch.equal(outputs, entry["hub"][OUTPUTS])
        assert torch.equal(weight, entry["hub"][WEIGHT])

    # print_modification: the forward before and after, through the runner's logger.
    log = log_text(runner)
    assert f"now records {OUTPUTS}, {WEIGHT}" in log
    assert "original" in log and "patched" in log and "__bcrecord_probe__" in log
    if decompiled(TOY_CODE) is not None:  # depyf is installed
        assert "decompiled, after:" in log and "__bcrecord_probe__(outputs," in log
    else:
        assert "pip install depyf" in log
    assert_restored(model)


def test_resnet_forward_impl_records_each_assignment_of_x(tmp_path):
    torch.manual_seed(0)
    model = MMResNet()
    checker = Checker(X_KEYS, resnet_snapshot)
    hook = dict(
        type="RecorderHook",
        recorders=[RESNET_RECORDER],
        save_dir=str(tmp_path / "records"),
        visualize=dict(channel_reduction=None, topk=4, arrangement=(2, 2), resize_shape=(32, 32)),
    )
    runner = make_runner(tmp_path, model, [hook, checker], data=ImageDataset(), batch_size=4)
    runner.train()

    iters = checker.iters["train"]
    assert len(iters) == 2
    for entry in iters:
        expected = resnet_expected(entry)
        for key in X_KEYS:
            assert torch.allclose(entry["hub"][key], expected[key], atol=1e-5), key
    # x@1 is the batch norm output as assigned, before the in-place ReLU changed that tensor.
    assert (iters[0]["hub"][X_KEYS[1]] < 0).any() and not (iters[0]["hub"][X_KEYS[2]] < 0).any()

    loaded = bcrecord.load(tmp_path / "records" / "train")
    for key in X_KEYS:
        assert loaded.steps(key) == [0, 1]
        for entry, value in zip(iters, loaded[key], strict=True):
            assert torch.equal(value, entry["hub"][key])

    # One picture per key and iteration, through LocalVisBackend; not blank.
    images = Path(runner.log_dir) / "vis_data" / "vis_image"
    for key in X_KEYS:
        for step in (0, 1):
            path = images / f"{image_name(key)}_{step}.png"
            assert path.is_file(), sorted(p.name for p in images.iterdir())
            pixels = cv2.imread(str(path))
            assert pixels.shape[0] >= 32 and pixels.std() > 5
    assert_restored(model)


def test_visualize_interval_counts_the_recorded_iterations(tmp_path):
    torch.manual_seed(0)
    hook = dict(
        type="RecorderHook",
        recorders=[RESNET_RECORDER],
        every_n_iters=2,  # iterations 0 and 2 of 4 recorded
        visualize=dict(keys=[X_KEYS[0]], interval=2),  # every 2nd of those: iteration 2
    )
    runner = make_runner(tmp_path, MMResNet(), [hook], data=ImageDataset(), batch_size=2)
    runner.train()
    images = Path(runner.log_dir) / "vis_data" / "vis_image"
    assert sorted(path.name for path in images.iterdir()) == [f"{image_name(X_KEYS[0])}_2.png"]


class DictHeadModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"cls-head": nn.Linear(2, 2)})

    def forward(self, inputs, data_samples, mode="tensor"):
        outputs = self.heads["cls-head"](torch.stack(inputs))
        if mode == "loss":
            return dict(loss=(torch.stack(data_samples) - outputs.sum(-1, keepdim=True)).sum())
        return outputs


def test_a_model_path_through_a_module_dict_key_that_is_no_identifier_records(tmp_path):
    # ModuleDict keys such as 'cls-head' (list_targets lists 'heads.cls-head') were refused.
    torch.manual_seed(0)
    model = DictHeadModel()
    recorder = dict(type="FunctionRecorder", model="heads.cls-head", target="return")
    key = "heads.cls-head:forward:return"
    checker = Checker([key], toy_snapshot)
    runner = make_runner(tmp_path, model, [dict(type="RecorderHook", recorders=[recorder]), checker])
    runner.train()
    assert len(checker.iters["train"]) == 4
    for entry in checker.iters["train"]:
        w, x = entry["snapshot"], torch.stack(entry["batch"]["inputs"])
        expected = F.linear(x, w["heads.cls-head.weight"], w["heads.cls-head.bias"])
        assert torch.allclose(entry["hub"][key], expected, rtol=1e-5, atol=1e-6)
    assert nn.Linear.forward.__code__ is LINEAR_FORWARD_CODE
    # A colon stays refused: it separates a key's parts.
    with pytest.raises(RecorderConfigError, match=r"'model' must be a dotted path .* got 'heads.a:b'"):
        parse_recorders([dict(recorder, model="heads.a:b")])


def test_a_model_or_name_that_is_neither_a_string_nor_none_is_refused_falsy_ones_too():
    # model=0 (a Sequential's child '0' meant) was read as the root, name=0 as no name: they
    # recorded runner_model's forward, unsaid, where model=1 and name=5 were refused.
    recorder = dict(type="FunctionRecorder", target="x")
    for bad in (0, False, [], 1):
        said = rf"'model' must be a dotted path .* got {re.escape(repr(bad))}$"
        with pytest.raises(RecorderConfigError, match=said):
            parse_recorders([dict(recorder, model=bad)])
    for bad in (0, False, 5):
        said = rf"'name' must be a string, got {re.escape(repr(bad))}$"
        with pytest.raises(RecorderConfigError, match=said):
            parse_recorders([dict(recorder, name=bad)])
    [given, default] = parse_recorders([dict(recorder, model="0", name=""), dict(recorder, model=None)])
    assert (given.model, given.owner, default.model, default.owner) == ("0", "0", "", "runner_model")


class CachingHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x):
        self.cache = x.detach().clone()  # set by each call: absent before the first
        return self.lin(x)


class CachingHeadModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.head = CachingHead()

    def forward(self, inputs, data_samples, mode="tensor"):
        outputs = self.head(torch.stack(inputs))
        return dict(loss=outputs.sum()) if mode == "loss" else outputs


def test_an_attribute_a_submodule_s_method_assigns_passes_before_the_run(tmp_path):
    # Only one the model's own methods assign passed: 'self.head.cache' was refused before the run.
    torch.manual_seed(0)
    key = "runner_model:forward:self.head.cache"
    checker = Checker([key])
    recorder = dict(type="AttributeRecorder", target="self.head.cache")
    runner = make_runner(
        tmp_path, CachingHeadModel(), [dict(type="RecorderHook", recorders=[recorder]), checker]
    )
    with pytest.warns(RecordingWarning, match="'CachingHead' object has no attribute 'cache'"):
        runner.train()  # (read at entry: absent in the first iteration)
    iters = checker.iters["train"]
    assert len(iters) == 4 and iters[0]["hub"][key] is None
    for before, entry in zip(iters[:-1], iters[1:], strict=True):  # at entry: the previous batch
        assert torch.equal(entry["hub"][key], torch.stack(before["batch"]["inputs"]))
    # A chain no method assigns is still refused.
    with pytest.raises(RecorderConfigError, match=r"self.head \(CachingHead\) has no attribute 'cash'"):
        make_runner(
            tmp_path,
            CachingHeadModel(),
            [dict(type="RecorderHook", recorders=[dict(recorder, target="self.head.cash")])],
        ).train()


def test_image_names_of_different_keys_differ_and_are_safe_file_names():
    # Every operator site was '_@0': a block's '*@0' and '+=@0' were drawn over each other.
    operators = ["+", "-", "*", "/", "//", "%", "**", "@", "<<", ">>", "&", "|", "^", "~", "not"]
    keys = [f"b:forward:{op}@0" for op in operators] + [f"b:forward:{op}=@0" for op in operators[:13]]
    keys += ["b:forward:self.fc()@0", "b:forward:self.fc@0", "b:forward:x@0", "b:forward:return"]
    names = [image_name(key) for key in keys]
    assert len(set(names)) == len(keys)
    assert all(re.fullmatch(r"[0-9A-Za-z_.@()+=%-]+", name) for name in names)
    assert names[2:4] == ["train_b.forward.%2A@0", "train_b.forward.%2F@0"]
    assert image_name("b:forward:self.fc()@0", "val") == "val_b.forward.self.fc()@0"
    # (None gave AttributeError: 'replace'; a mode of None, the name 'None_...')
    for arguments in ((None,), ("a:b", None)):
        with pytest.raises(TypeError, match="^image_name takes (key|mode) as a str, got None$"):
            image_name(*arguments)


def test_resolve_model_refuses_a_path_that_is_no_str():
    # 1 gave AttributeError ('split'); None, the model itself (taken as '').
    net = torch.nn.Sequential(torch.nn.Linear(1, 1))
    for path in (1, None, ["0"]):
        with pytest.raises(TypeError, match="^model= takes a dotted path of a submodule"):
            resolve_model(net, path)
    assert resolve_model(net, "") is net and resolve_model(net, "0") is net[0]


def test_issue_config_exactly(tmp_path, monkeypatch):
    """The whole config of the issue, save_dir='./work_dir' included, on a model it all applies to."""
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    model = ToyResNetModel()
    hook = dict(
        type="RecorderHook",
        recorders=[
            dict(type="FunctionRecorder", target="outputs", index=[1]),
            dict(type="AttributeRecorder", target="self.linear1.weight"),
            dict(
                type="FunctionRecorder", model="resnet", method="_forward_impl", target="x", index=[0, 1, 2]
            ),
        ],
        save_dir="./work_dir",
        print_modification=True,
    )
    keys = [OUTPUTS, WEIGHT, *X_KEYS]
    checker = Checker(keys)
    runner = make_runner(tmp_path, model, [hook, checker], data=ImageDataset(keys=("inputs", "data_samples")))
    runner.train()
    for entry in checker.iters["train"]:
        assert all(isinstance(entry["hub"][key], torch.Tensor) for key in keys)
        assert entry["hub"][X_KEYS[0]].shape[1:] == (8, 16, 16)
    loaded = bcrecord.load("work_dir/train")
    assert sorted(loaded) == sorted(keys)
    log = log_text(runner)
    assert "runner_model ToyResNetModel.forward" in log and "resnet MiniResNet._forward_impl" in log
    assert_restored(model)


def test_config_file_needs_only_custom_imports(tmp_path):
    """In a fresh interpreter, Config.fromfile's custom_imports registers the hook."""
    config = tmp_path / "config.py"
    config.write_text(
        textwrap.dedent(
            """
            custom_imports = dict(imports=['bcrecord.integrations.mmengine'], allow_failed_imports=False)
            custom_hooks = [
                dict(
                    type='RecorderHook',
                    recorders=[
                        dict(type='FunctionRecorder', target='outputs', index=[1]),
                        dict(type='AttributeRecorder', target='self.linear1.weight'),
                        dict(type='FunctionRecorder', model='resnet', method='_forward_impl',
                             target='x', index=[0, 1, 2]),
                    ],
                    save_dir='./work_dir',
                    print_modification=True),
                dict(type='RecorderVisualizationHook', keys=['resnet:*']),
            ]
            """
        )
    )
    script = textwrap.dedent(
        """
        import sys
        from mmengine.config import Config
        from mmengine.registry import HOOKS
        assert 'RecorderHook' not in HOOKS.module_dict
        cfg = Config.fromfile(sys.argv[1])
        hooks = [HOOKS.build(hook) for hook in cfg.custom_hooks]
        print(type(hooks[0]).__module__, [type(h).__name__ for h in hooks], hooks[0].print_modification)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(config)], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "bcrecord.integrations.mmengine ['RecorderHook', 'RecorderVisualizationHook'] True" in done.stdout


# --- no source, where the ast approach cannot go -------------------------------------------


def test_method_without_source_records(tmp_path):
    with pytest.raises(OSError):
        inspect.getsource(GeneratedToyModel.forward)
    with pytest.raises(OSError):  # the proposal's rewrite starts here, and stops
        proposal_ast_rewrite(GeneratedToyModel.forward)

    torch.manual_seed(0)
    model = GeneratedToyModel()
    checker = Checker([OUTPUTS, WEIGHT], toy_snapshot)
    runner = make_runner(tmp_path, model, [dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS), checker])
    runner.train()
    assert len(checker.iters["train"]) == 4
    for entry in checker.iters["train"]:
        expected = toy_expected(entry)
        assert torch.allclose(entry["hub"][OUTPUTS], expected[OUTPUTS], rtol=1e-5, atol=1e-6)
        assert torch.equal(entry["hub"][WEIGHT], expected[WEIGHT])
    assert "forward" not in vars(model) and model.forward.__func__ is _namespace["forward"]


def test_call_and_operator_targets_as_in_the_short_forms(tmp_path):
    torch.manual_seed(0)
    model = ToyModel()
    recorders = [
        dict(type="FunctionRecorder", target="self.linear1()", index=[0]),
        dict(type="FunctionRecorder", target="torch.stack()"),
        dict(type="FunctionRecorder", target="-", index=[0]),
    ]
    linear1, minus = "runner_model:forward:self.linear1()@0", "runner_model:forward:-@0"
    stacks = ["runner_model:forward:torch.stack()@0", "runner_model:forward:torch.stack()@1"]
    checker = Checker([linear1, minus, *stacks], toy_snapshot)
    hook = dict(type="RecorderHook", recorders=recorders)
    runner = make_runner(tmp_path, model, [hook, checker])
    runner.train()
    assert [h for h in runner.hooks if isinstance(h, RecorderHook)][0].keys == (linear1, *stacks, minus)
    for entry in checker.iters["train"]:
        w = entry["snapshot"]
        x, y = (torch.stack(entry["batch"][name]) for name in ("inputs", "data_samples"))
        hidden = F.linear(x, w["linear1.weight"], w["linear1.bias"])
        assert torch.allclose(entry["hub"][linear1], hidden, rtol=1e-5, atol=1e-6)
        assert torch.equal(entry["hub"][stacks[0]], x) and torch.equal(entry["hub"][stacks[1]], y)
        out = F.linear(hidden, w["linear2.weight"], w["linear2.bias"])
        assert torch.allclose(entry["hub"][minus], y - out, rtol=1e-5, atol=1e-6)
    assert len(checker.iters["train"]) == 4
    assert_restored(model)


# --- bad configs fail at before_run ------------------------------------------------------------


HIDDEN_ERROR = (
    "RecorderHook: recorders[1] dict(type='FunctionRecorder', target='hidden'): cannot record in "
    "runner.model.forward: ToyModel.forward has no assignment to a local named 'hidden'; assigned "
    "locals: data_sample, inputs, loss, outputs; arguments (their value at entry): data_samples, mode"
)


def test_the_docs_show_the_error_as_it_is():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "mmengine.md").read_text()
    assert HIDDEN_ERROR in " ".join(docs.split())  # the docs wrap it over lines


@pytest.mark.parametrize(
    ("model_class", "recorder", "message"),
    [
        (ToyModel, dict(type="LayerRecorder", target="outputs"), "unknown recorder type 'LayerRecorder'"),
        (ToyModel, dict(type="FunctionRecorder", index=[1]), "FunctionRecorder needs a 'target'"),
        (ToyModel, dict(type="FunctionRecorder", target="hidden"), HIDDEN_ERROR),
        (ToyModel, dict(type="FunctionRecorder", target="outputs", index=[5]), "there is no index 5"),
        (  # the core's short form said in a recorder's: 'mode@0' is refused as a target
            ToyModel,
            dict(type="FunctionRecorder", target="mode", index=[1]),
            "it has one value, at entry: 'mode' (or 'mode@0') (in a recorder dict, 'mode@0' is "
            "target='mode', index=[0])",
        ),
        (ToyModel, dict(type="AttributeRecorder", target="outputs"), "an attribute target needs a dot"),
        (
            ToyModel,
            dict(type="AttributeRecorder", target="self.linear3.weight"),
            "target 'self.linear3.weight': self (ToyModel) has no attribute 'linear3'; did you mean",
        ),
        (
            ToyModel,
            dict(type="AttributeRecorder", target="self.linear1.wieght"),
            "self.linear1 (Linear) has no attribute 'wieght'; did you mean 'weight'",
        ),
        (
            ToyModel,
            dict(type="FunctionRecorder", method="forwrd", target="outputs"),
            "did you mean 'forward'?",  # once: torch's dir() lists 'forward' twice
        ),
        (
            ToyModel,
            dict(type="FunctionRecorder", model="linear1", method="weight", target="x"),
            "cannot record in linear1.weight: this Linear instance's 'weight' is a Parameter (from "
            "__getattr__): only Python functions defined on it or its class can be patched",
        ),
        (
            ToyModel,
            dict(type="FunctionRecorder", model="linear1.weight", target="x"),
            "model='linear1.weight' is a Parameter, not a module: name the module that reads it, "
            "model='linear1', and record it there (target='self.weight')",
        ),
        (
            ToyModel,
            dict(type="FunctionRecorder", target="return", index=[3]),
            "target='return': a return spec takes no index",
        ),
        (
            MMResNet,
            dict(RESNET_RECORDER, model="resnt"),
            "model='resnt' does not resolve under runner.model (MMResNet): "
            "MMResNet has no attribute 'resnt'; did you mean 'resnet'",
        ),
        (MMResNet, dict(RESNET_RECORDER, model="resnet.layer9"), "MiniResNet has no attribute 'layer9'"),
        (
            ToyModel,  # a key copied from the MessageHub: the recorder that publishes it
            dict(type="FunctionRecorder", target=OUTPUTS),
            f"target={OUTPUTS!r} is a key, '<owner>:<method>:<target>'; the recorder that publishes it is "
            "dict(type='FunctionRecorder', target='outputs', index=[1])",
        ),
        (
            MMResNet,
            dict(type="FunctionRecorder", target=X_KEYS[2]),
            "the recorder that publishes it is dict(type='FunctionRecorder', model='resnet', "
            "method='_forward_impl', target='x', index=[2])",
        ),
    ],
)
def test_bad_config_fails_at_before_run(tmp_path, model_class, recorder, message):
    torch.manual_seed(0)
    model = model_class()
    checker = Checker([])
    good = (
        dict(type="FunctionRecorder", target="outputs", index=[1])
        if model_class is ToyModel
        else RESNET_RECORDER
    )
    hook = dict(type="RecorderHook", recorders=[good, recorder], save_dir=str(tmp_path / "records"))
    data = ImageDataset() if model_class is MMResNet else None
    runner = make_runner(tmp_path, model, [hook, checker], data=data)  # building the runner is fine
    with pytest.raises(RecorderConfigError) as caught:
        runner.train()
    text = str(caught.value)
    assert text.startswith(f"RecorderHook: recorders[1] dict({next(iter(recorder))}=")
    assert message in text
    assert any(entry.name == "before_run" for entry in caught.traceback)
    assert checker.iters["train"] == [] and runner.iter == 0  # no training step ran
    assert_restored(model)  # the good recorder's patch was undone too


@pytest.mark.parametrize(
    ("recorders", "message"),
    [
        (
            [OUTPUTS, WEIGHT],  # the keys the hook publishes, copied from the proposal
            f"RecorderHook: recorders[0] {OUTPUTS!r}: a recorder must be a dict like "
            f"dict(type='FunctionRecorder', target='x'); {OUTPUTS!r} is a key, '<owner>:<method>:<target>': "
            "the recorder that publishes it is dict(type='FunctionRecorder', target='outputs', index=[1])",
        ),
        (
            WEIGHT,
            "RecorderHook: 'recorders' must be a non-empty list of recorder dicts, e.g. "
            f"[dict(type='FunctionRecorder', target='outputs', index=[1])], got {WEIGHT!r}; "
            f"{WEIGHT!r} is a key, '<owner>:<method>:<target>': the recorder that publishes it is "
            "dict(type='AttributeRecorder', target='self.linear1.weight')",
        ),
    ],
)
def test_keys_given_as_recorders_fail_at_before_run_with_the_recorders_that_publish_them(
    tmp_path, recorders, message
):
    torch.manual_seed(0)
    model = ToyModel()
    checker = Checker([])
    runner = make_runner(tmp_path, model, [dict(type="RecorderHook", recorders=recorders), checker])
    with pytest.raises(RecorderConfigError) as caught:
        runner.train()
    assert str(caught.value) == message
    assert checker.iters["train"] == [] and runner.iter == 0
    assert_restored(model)


def test_a_key_with_an_index_that_is_no_decimal_number_is_a_recorder_config_error():
    # '²' is a digit to str.isdigit, no number to int: the recorder that publishes the key has no index.
    with pytest.raises(RecorderConfigError) as caught:
        parse_recorders([dict(type="FunctionRecorder", target="m:forward:x@\u00b2")])
    assert str(caught.value).endswith(
        "the recorder that publishes it is dict(type='FunctionRecorder', model='m', target='x')"
    )


@pytest.mark.parametrize(
    ("key", "recorder"),
    [
        ("runner_model:forward:@@0", "dict(type='FunctionRecorder', target='@', index=[0])"),
        ("runner_model:forward:@=@1", "dict(type='FunctionRecorder', target='@=', index=[1])"),
        ("m:forward:self.fc()@2", "dict(type='FunctionRecorder', model='m', target='self.fc()', index=[2])"),
    ],
)
def test_a_key_of_a_matrix_product_names_its_recorder(key, recorder):
    # The target was cut at the first '@': the recorder told was dict(..., target='').
    with pytest.raises(RecorderConfigError) as caught:
        parse_recorders([dict(type="FunctionRecorder", target=key)])
    assert str(caught.value).endswith(f"the recorder that publishes it is {recorder}")


@pytest.mark.parametrize(
    ("kind", "key", "recorder"),
    [
        # An entry chain's key is an AttributeRecorder's: a FunctionRecorder of it publishes 'self.w@0'...
        (
            "FunctionRecorder",
            "runner_model:forward:self.w",
            "dict(type='AttributeRecorder', target='self.w')",
        ),
        # ... and a load site's, a local's and a call's are a FunctionRecorder's (an AttributeRecorder
        # refuses an index, a name without a dot, and a call).
        (
            "AttributeRecorder",
            "runner_model:forward:self.w@0",
            "dict(type='FunctionRecorder', target='self.w', index=[0])",
        ),
        (
            "AttributeRecorder",
            "runner_model:forward:y@0",
            "dict(type='FunctionRecorder', target='y', index=[0])",
        ),
        (
            "AttributeRecorder",
            "m:forward:self.fc()@0",
            "dict(type='FunctionRecorder', model='m', target='self.fc()', index=[0])",
        ),
    ],
)
def test_a_key_given_as_a_target_is_told_the_recorder_that_publishes_it_whatever_type_it_was_given(
    kind, key, recorder
):
    # The recorder suggested took the type of the dict the key was given in: for an entry chain's key in
    # a FunctionRecorder it said dict(type='FunctionRecorder', target='self.w'), which publishes
    # 'runner_model:forward:self.w@0', not the key; in an AttributeRecorder, a recorder that is refused.
    with pytest.raises(RecorderConfigError) as caught:
        parse_recorders([dict(type=kind, target=key)])
    assert str(caught.value).endswith(f"the recorder that publishes it is {recorder}")
    (config,) = parse_recorders([eval(recorder)])
    owner = key.split(":")[0]
    patch = bcrecord.patch_method(_Keyed, "forward", config.spec, name=owner)
    try:
        assert key in patch.keys
    finally:
        patch.remove()


class _Keyed:
    w = 2

    def forward(self, x):
        y = self.fc(x * self.w)
        return y

    def fc(self, x):
        return x


class _Remembering(ToyModel):
    def forward(self, inputs, data_samples, mode="tensor"):
        outputs = super().forward(inputs, data_samples, mode)
        self.last_outputs = outputs  # exists only after the first iteration
        return outputs


def test_an_attribute_the_model_sets_while_running_is_not_refused_before_it_runs(tmp_path):
    recorder = dict(type="AttributeRecorder", target="self.last_outputs")
    runner = make_runner(tmp_path, _Remembering(), [dict(type="RecorderHook", recorders=[recorder])])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first iteration has nothing to read yet
        runner.train()
    assert set(runner.message_hub.get_info("runner_model:forward:self.last_outputs")) == {"loss"}


class _Stats:
    def __init__(self):
        self.seen = []


class _Counting(ToyModel):
    def __init__(self):
        super().__init__()
        self.stats = _Stats()  # a plain object the forward changes in place

    def forward(self, inputs, data_samples, mode="tensor"):
        self.stats.seen.append(len(inputs))
        return super().forward(inputs, data_samples, mode)


def test_an_attribute_recorder_given_deepcopy_keeps_what_is_no_tensor_as_the_proposal_does(tmp_path):
    # As the docs say: under 'clone' such a value (a module, an object) is the live object, and
    # copy='deepcopy' gives the proposal's copy, its state when the method started.
    recorders = [
        dict(type="AttributeRecorder", target="self.stats", copy="deepcopy"),
        dict(type="AttributeRecorder", target="self.linear1", copy="deepcopy"),
        dict(type="FunctionRecorder", target="self.stats", index=[0]),  # (under 'clone': itself)
    ]
    model = _Counting()
    seen, weights = [], []

    class Reads(Hook):
        priority = "LOW"

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            weights.append(model.linear1.weight.detach().clone())

        def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
            seen.append(runner.message_hub.get_info("runner_model:forward:self.stats").seen)

    hook = dict(type="RecorderHook", recorders=recorders, save_dir=str(tmp_path / "records"), interval=4)
    runner = make_runner(tmp_path, model, [hook, Reads()])
    runner.train()
    assert len(model.stats.seen) == 4 and seen == [[], [3], [3, 3], [3, 3, 3]]
    saved = bcrecord.load(tmp_path / "records" / "train")
    assert [stats.seen for stats in saved["runner_model:forward:self.stats"]] == [[], [3], [3, 3], [3, 3, 3]]
    kept = saved["runner_model:forward:self.linear1"]
    assert all(torch.equal(k.weight, w) for k, w in zip(kept, weights, strict=True))
    assert not torch.equal(kept[0].weight, model.linear1.weight)  # (trained since)
    assert runner.message_hub.get_info("runner_model:forward:self.stats@0") is model.stats


def test_bad_hook_arguments_fail_when_built():
    with pytest.raises(ValueError, match="loops must name some of"):
        RecorderHook(PROPOSAL_RECORDERS, loops=["training"])
    with pytest.raises(ValueError, match=r"got 'trian'; did you mean 'train'\?"):
        RecorderHook(PROPOSAL_RECORDERS, loops="trian")
    with pytest.raises(ValueError, match="interval must be a positive int"):
        RecorderHook(PROPOSAL_RECORDERS, interval=0)
    with pytest.raises(ValueError, match="every_n_iters must be a positive int, got 0"):
        RecorderHook(PROPOSAL_RECORDERS, every_n_iters=0)
    with pytest.raises(bcrecord.SpecError, match="save_dir is an empty string"):  # not the working directory
        RecorderHook(PROPOSAL_RECORDERS, save_dir="")
    with pytest.raises(ValueError, match="fewer than topk=20"):
        RecorderHook(PROPOSAL_RECORDERS, visualize=dict(channel_reduction=None, arrangement=(2, 2)))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(loops=5), "loops must name some of ('train', 'val', 'test'), got 5"),
        (dict(loops=[5]), "loops must name some of ('train', 'val', 'test'), got [5]"),
        (dict(save_dir=5), "save_dir must be a directory's path (a str or a Path), got 5"),
        (dict(print_modification="False"), "print_modification is True or False, got 'False'"),
        (dict(by_epoch="yes"), "by_epoch is True or False, got 'yes'"),
        (
            dict(visualize=dict(keys=5)),
            "visualize keys must be a non-empty list of keys or patterns (or None), got 5",
        ),
    ],
)
def test_a_hook_argument_of_the_wrong_type_is_refused_naming_itself(arguments, message):
    # It was a bare TypeError ('int' object is not iterable; expected str, bytes or os.PathLike
    # object, not int), an AttributeError from did_you_mean, or, for a flag, taken as true
    # (a config's print_modification='False' printed).
    with pytest.raises(bcrecord.SpecError) as caught:
        RecorderHook(PROPOSAL_RECORDERS, **arguments)
    assert str(caught.value) == message
    hook = RecorderHook(PROPOSAL_RECORDERS, loops=["val"], print_modification=False, by_epoch=True)
    assert (hook.loops, hook.print_modification, hook.by_epoch) == (("val",), False, True)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(keyz=["resnet:*"]), r"no option 'keyz' \(its options: keys, .*\); did you mean 'keys'\?"),
        (dict(arrangement=4), r"visualize arrangement must be a pair of positive ints \(rows, col.*got 4"),
        (dict(resize_shape=224), r"visualize resize_shape must be None or a pair of positive ints"),
        (dict(resize_shape=(224, 0)), r"resize_shape must be None or a pair of positive .*got \(224, 0\)"),
        (dict(alpha="0.5"), r"visualize alpha must be a number from 0 to 1, got '0.5'"),
        (dict(alpha=2), r"visualize alpha must be a number from 0 to 1, got 2"),
        (dict(sample_index="a"), r"visualize sample_index must be an int, got 'a'"),
    ],
)
def test_bad_visualize_options_fail_when_built_naming_the_option(options, message):
    # A visualize option that cannot work must stop the run as it is built, naming itself; not
    # fail later in each draw (which visualization logs and skips) or with a bare TypeError.
    with pytest.raises(bcrecord.SpecError, match=message):
        RecorderHook(PROPOSAL_RECORDERS, visualize=options)
    if "keyz" not in options:  # (the visualization hook takes its options as its own arguments)
        with pytest.raises(bcrecord.SpecError, match=message.replace("visualize ", "")):
            RecorderVisualizationHook(**options)
    drawer = RecorderHook(PROPOSAL_RECORDERS, visualize=dict(arrangement=[2, 4], resize_shape=[8, 8])).drawer
    assert (drawer.arrangement, drawer.resize_shape) == ((2, 4), (8, 8))  # lists from a config file
    options = dict(arrangement=(numpy.int64(2), 4), sample_index=numpy.int64(1))  # NumPy ints are ints
    drawer = RecorderHook(PROPOSAL_RECORDERS, visualize=options).drawer
    assert (drawer.arrangement, drawer.sample_index) == ((2, 4), 1)
    # A NumPy float32 alpha (no float) was refused too, though the drawer took it before.
    assert RecorderHook(PROPOSAL_RECORDERS, visualize=dict(alpha=numpy.float32(0.25))).drawer.alpha == 0.25


# --- failures, interruptions, loops, wrappers --------------------------------------------------


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("error", [Boom("boom"), KeyboardInterrupt()])
def test_failed_run_keeps_written_records_and_restores_the_model(tmp_path, error):
    torch.manual_seed(0)
    model = ToyModel()

    def fail(runner, mode, batch_idx):
        return runner.iter == 5

    fail.error = error
    checker = Checker([OUTPUTS], toy_snapshot, fail=fail)
    hook = dict(
        type="RecorderHook", recorders=PROPOSAL_RECORDERS, save_dir=str(tmp_path / "records"), interval=2
    )
    runner = make_runner(tmp_path, model, [hook, checker], epochs=2)
    with pytest.raises(type(error)):
        runner.train()
    # Steps 0-3 were written every 2 iterations, step 4 when the run failed; step 5 never ran.
    loaded = bcrecord.load(tmp_path / "records" / "train")
    assert loaded.steps(OUTPUTS) == [0, 1, 2, 3, 4]
    for entry, value in zip(checker.iters["train"], loaded[OUTPUTS], strict=False):
        assert torch.equal(value, entry["hub"][OUTPUTS])
    assert_restored(model)
    assert "run" not in vars(runner.train_loop)


class FailingToyModel(ToyModel):
    calls = 0

    def forward(self, inputs, data_samples, mode="tensor"):
        FailingToyModel.calls += 1
        outputs = super().forward(inputs, data_samples, mode)  # zero-argument super() inside a patch
        if FailingToyModel.calls == 3:
            raise Boom("inside forward")
        return outputs


def test_failure_inside_forward_stops_recording(tmp_path):
    torch.manual_seed(0)
    model = FailingToyModel()
    key = "runner_model:forward:outputs@0"
    hook = dict(
        type="RecorderHook",
        recorders=[dict(type="FunctionRecorder", target="outputs")],
        save_dir=str(tmp_path / "records"),
        interval=10,
    )
    runner = make_runner(tmp_path, model, [hook])
    with pytest.raises(Boom):
        runner.train()
    assert bcrecord.load(tmp_path / "records" / "train").steps(key) == [0, 1]  # written by the failure
    assert not runtime.is_active()
    assert "forward" not in vars(model)


class LambdaToyModel(ToyModel):
    def forward(self, inputs, data_samples, mode="tensor"):
        scale = lambda t: t  # noqa: E731  (a local function: pickle refuses it)
        return scale(super().forward(inputs, data_samples, mode))


def test_a_value_that_cannot_be_pickled_is_saved_as_its_repr_and_training_goes_on(tmp_path):
    torch.manual_seed(0)
    model = LambdaToyModel()
    first_weight = model.linear1.weight.detach().clone()
    recorders = [dict(type="FunctionRecorder", target="scale"), PROPOSAL_RECORDERS[1]]
    hook = dict(type="RecorderHook", recorders=recorders, save_dir=str(tmp_path / "records"), interval=2)
    runner = make_runner(tmp_path, model, [hook])
    runner.train()
    assert runner.iter == 4
    loaded = bcrecord.load(tmp_path / "records" / "train")
    scale = "runner_model:forward:scale@0"
    assert loaded.steps(scale) == loaded.steps(WEIGHT) == [0, 1, 2, 3]
    assert all(v.startswith("<function LambdaToyModel.forward.<locals>.<lambda> at ") for v in loaded[scale])
    assert torch.equal(loaded[WEIGHT][0], first_weight)  # the other values as they were
    assert not torch.equal(loaded[WEIGHT][3], first_weight)
    warned = [line for line in log_text(runner).splitlines() if "saved its repr" in line]
    assert len(warned) == 1, warned  # once per key, though every write had one
    assert f"RecorderHook: cannot save {scale!r} (step 0): function cannot be pickled (" in warned[0]
    assert_restored(model)


def test_val_and_test_loops(tmp_path):
    torch.manual_seed(0)
    model = ToyModel()
    checker = Checker([OUTPUTS], toy_snapshot)
    hook = dict(
        type="RecorderHook",
        recorders=PROPOSAL_RECORDERS,
        loops=["train", "val", "test"],
        save_dir=str(tmp_path / "records"),
        by_epoch=True,
    )
    runner = make_runner(tmp_path, model, [hook, checker], epochs=2, val=True, test=True)
    runner.train()
    runner.test()
    assert len(checker.iters["val"]) == 8 and len(checker.iters["test"]) == 4  # two evaluations, one test
    for mode in ("train", "val", "test"):
        for entry in checker.iters[mode]:
            assert entry["patched"]
            assert torch.allclose(entry["hub"][OUTPUTS], toy_expected(entry)[OUTPUTS], rtol=1e-5, atol=1e-6)
    loaded = {mode: bcrecord.load(tmp_path / "records" / mode) for mode in ("train", "val", "test")}
    assert loaded["train"].steps(OUTPUTS) == list(range(8))
    assert loaded["val"].steps(OUTPUTS) == list(range(8))  # a running count over both evaluations
    assert loaded["test"].steps(OUTPUTS) == list(range(4))
    for entry, value in zip(checker.iters["val"], loaded["val"][OUTPUTS], strict=True):
        assert torch.equal(value, entry["hub"][OUTPUTS])
    assert_restored(model)


class SavedSteps(Hook):
    """Runs after RecorderHook; keeps the training steps on disk after each iteration."""

    priority = "LOWEST"

    def __init__(self, directory):
        self.directory = directory
        self.seen = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if not self.directory.exists():  # (made at the first save)
            self.seen.append([])
            return
        loaded = bcrecord.load(self.directory)
        self.seen.append(loaded.steps(OUTPUTS) if OUTPUTS in loaded.keys() else [])


@pytest.mark.parametrize("by_epoch", [False, True])
def test_iteration_based_training_writes_every_interval_or_warns_that_it_cannot(tmp_path, by_epoch):
    torch.manual_seed(0)
    records = tmp_path / "records"
    hook = dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS, save_dir=str(records), interval=2)
    hook.update(by_epoch=by_epoch)
    saved = SavedSteps(records / "train")
    runner = make_runner(tmp_path, ToyModel(), [hook, saved], iters=5)
    runner.train()
    warning = "by_epoch=True, but training is iteration-based"
    if by_epoch:  # IterBasedTrainLoop's one epoch is the whole run: nothing is written before it ends
        assert saved.seen == [[]] * 5 and warning in log_text(runner)
    else:
        assert saved.seen == [[], [0, 1], [0, 1], [0, 1, 2, 3], [0, 1, 2, 3]]
        assert warning not in log_text(runner)
    assert bcrecord.load(records / "train").steps(OUTPUTS) == [0, 1, 2, 3, 4]


class _Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def forward(self, x):
        y = self.lin(x)
        return y


class _ValueHeadModel(ToyModel):
    """A submodule whose name starts with 'val', as a reinforcement-learning critic's does."""

    def __init__(self):
        super().__init__()
        self.value_head = _Head()

    def forward(self, inputs, data_samples, mode="tensor"):
        inputs, data_sample = torch.stack(inputs), torch.stack(data_samples)
        outputs = self.value_head(self.linear1(inputs))
        return dict(loss=(data_sample - outputs).sum()) if mode == "loss" else outputs


@pytest.mark.parametrize("name", [None, "head"])
def test_keys_starting_with_val_are_said_to_go_into_the_validation_log(tmp_path, name):
    # MMEngine's LogProcessor reads every MessageHub info whose key starts with 'val' as the
    # validation loop's own, and prints it at the end of each validation epoch.
    recorder = dict(type="FunctionRecorder", model="value_head", target="y")
    if name is not None:
        recorder["name"] = name
    hook = dict(type="RecorderHook", recorders=[recorder])
    runner = make_runner(tmp_path, _ValueHeadModel(), [hook], val=True)
    runner.train()
    log = log_text(runner)
    warned = "RecorderHook: the keys of owner(s) 'value_head' start with 'val' or 'test'"
    assert (warned in log) == (name is None)
    printed = "Epoch(val) [1][4/4]    batches: 4.0000  value_head:forward:y@0: \ntensor("
    assert (printed in log) == (name is None)
    assert runner.message_hub.get_info(f"{name or 'value_head'}:forward:y@0").shape == (3, 1)


def test_every_n_iters_records_every_n_th_iteration_and_writes_every_interval_all_the_same(tmp_path):
    # interval=50 in MMEngine hooks means "every 50 iterations"; here that is every_n_iters, and
    # interval is when buffered records are written: the two need not line up.
    torch.manual_seed(0)
    records = tmp_path / "records"
    hook = dict(
        type="RecorderHook",
        recorders=PROPOSAL_RECORDERS,
        loops=["train", "val"],
        save_dir=str(records),
        every_n_iters=2,
        interval=3,
    )
    checker = Checker([OUTPUTS, WEIGHT], toy_snapshot)
    saved = SavedSteps(records / "train")
    runner = make_runner(tmp_path, ToyModel(), [hook, checker, saved], epochs=2, val=True)
    runner.train()
    train = checker.iters["train"]
    # Training: iterations 0, 2, 4, 6 publish; the others leave the hub as it was.
    for entry in train:
        expected = toy_expected(entry)[OUTPUTS]
        if entry["step"] % 2 == 0:
            assert torch.allclose(entry["hub"][OUTPUTS], expected, rtol=1e-5, atol=1e-6)
        else:
            assert entry["hub"][OUTPUTS] is train[entry["step"] - 1]["hub"][OUTPUTS]
    loaded = bcrecord.load(records / "train")
    assert loaded.steps(OUTPUTS) == [0, 2, 4, 6]
    for step, outputs in zip([0, 2, 4, 6], loaded[OUTPUTS], strict=True):
        assert torch.equal(outputs, train[step]["hub"][OUTPUTS])
    # Written after iterations 2 and 5 (interval=3: whatever is buffered then), the rest when training ends.
    assert saved.seen == [[], [], [0, 2], [0, 2], [0, 2], [0, 2, 4], [0, 2, 4], [0, 2, 4]]
    # Validation: two runs of 4 iterations, counted 0..7; every other one recorded.
    assert bcrecord.load(records / "val").steps(OUTPUTS) == [0, 2, 4, 6]


@pytest.mark.parametrize("policy", ["clone", "none"])
def test_what_a_buffered_weight_is_saved_as_under_each_copy_policy(tmp_path, policy):
    # docs/mmengine.md: under 'none' (or 'detach') a CPU tensor is buffered as the model's own,
    # and saved as it is when the interval is written; 'clone' keeps what each iteration saw.
    torch.manual_seed(0)
    hook = dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS, save_dir=str(tmp_path / "r"), interval=4)
    checker = Checker([WEIGHT], snapshot=toy_snapshot)
    runner = make_runner(tmp_path, ToyModel(), [dict(hook, copy=policy), checker])
    runner.train()
    saved = bcrecord.load(tmp_path / "r" / "train")[WEIGHT]
    if policy == "clone":
        expected = [entry["snapshot"]["linear1.weight"] for entry in checker.iters["train"]]
    else:
        expected = [runner.model.linear1.weight.detach()] * 4  # as it was when the four were written
    assert len(saved) == 4 and all(torch.equal(a, b) for a, b in zip(saved, expected, strict=True))
    assert torch.equal(saved[0], saved[3]) == (policy == "none")  # (SGD changed the weight meanwhile)


def test_a_second_run_into_the_save_dir_counts_evaluations_on(tmp_path):
    torch.manual_seed(0)
    records = str(tmp_path / "records")
    hook = dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS, loops=["train", "val"], save_dir=records)
    for _ in range(2):  # e.g. a run resumed from its checkpoint, into the same save_dir
        make_runner(tmp_path, ToyModel(), [hook], val=True).train()
    loaded = bcrecord.load(tmp_path / "records" / "val")
    assert loaded.steps(OUTPUTS) == list(range(8))  # 4 validation iterations per run, no step twice
    # Training steps are runner.iter, as docs/mmengine.md says: a fresh run starts at 0 again.
    assert bcrecord.load(tmp_path / "records" / "train").steps(OUTPUTS) == [0, 1, 2, 3] * 2


@pytest.mark.parametrize(
    "every, crash_at, saved, again",
    [
        (1, 6, [0, 1, 2, 3, 4, 5, 4, 5, 6, 7, 8, 9, 10, 11], "steps 4..5"),
        # Every 3rd iteration saved: it named 'steps 4..6', 4 never saved.
        (3, 7, [0, 3, 6, 6, 9], "step 6"),
    ],
)
def test_a_run_resumed_from_an_older_checkpoint_says_which_training_steps_it_saves_again(
    tmp_path, monkeypatch, every, crash_at, saved, again
):
    # mmengine 0.10's resume calls torch.load without weights_only, which torch >= 2.6 refuses
    # for its MessageHub state: what its users set to resume at all.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    records = tmp_path / "records"

    class Boom(Exception):
        pass

    def crash(runner, mode, batch_idx):
        return mode == "train" and runner.iter == crash_at  # in epoch 2 of 3, after epoch 1's checkpoint

    crash.error = Boom()
    recorder = dict(
        type="RecorderHook", recorders=PROPOSAL_RECORDERS, save_dir=str(records), every_n_iters=every
    )
    torch.manual_seed(0)
    first = make_runner(
        tmp_path, ToyModel(), [recorder, dict(type="CheckpointHook", interval=1), Checker([], fail=crash)],
        epochs=3,
    )  # fmt: skip
    with pytest.raises(Boom):
        first.train()
    assert "already holds" not in log_text(first)  # a new folder: nothing saved twice
    assert bcrecord.load(records / "train").steps(OUTPUTS) == list(range(crash_at))[::every]
    resumed = make_runner(tmp_path, ToyModel(), [recorder], epochs=3, resume=True)
    resumed.train()
    # Iterations 4 and 5 ran before the crash and again after the resume from epoch 1 (iteration 4):
    # both are kept, and the log says so, naming those saved.
    assert bcrecord.load(records / "train").steps(OUTPUTS) == saved
    warning = (
        f"RecorderHook: {records / 'train'} already holds training {again} of an earlier run; this "
        "run (resumed at iteration 4) saves those steps again"
    )
    assert warning in log_text(resumed)


def test_a_checkpoint_holds_no_recorded_key_and_resuming_from_it_does_not_warn(tmp_path):
    from mmengine.logging import MessageHub, MMLogger

    torch.manual_seed(0)
    hooks = [dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS), dict(type="CheckpointHook", interval=1)]
    runner = make_runner(tmp_path, ToyModel(), hooks)
    runner.train()
    assert torch.is_tensor(runner.message_hub.get_info(OUTPUTS))  # published all the same
    saved = torch.load(Path(runner.work_dir) / "epoch_1.pth", map_location="cpu", weights_only=False)
    hub_state = saved["message_hub"]
    assert "train/loss" in hub_state["resumed_keys"]  # the hub's own keys stay
    assert not {OUTPUTS, WEIGHT} & (set(hub_state["resumed_keys"]) | set(hub_state["runtime_info"]))
    assert {OUTPUTS, WEIGHT} <= set(runner.message_hub._resumed_keys)  # the live hub untouched
    # What Runner.resume does with it: MessageHub.load_state_dict, which warned once per key.
    logged = []

    def keep(record):
        logged.append(record.getMessage())
        return True

    logger = MMLogger.get_current_instance()
    logger.addFilter(keep)
    try:
        MessageHub(f"resumed-{uuid.uuid4().hex[:12]}").load_state_dict(hub_state)
    finally:
        logger.removeFilter(keep)
    assert not [line for line in logged if "is not defined in message_hub" in line]


def test_only_the_chosen_loops_record(tmp_path):
    torch.manual_seed(0)
    model = ToyModel()
    checker = Checker([OUTPUTS])
    loss = dict(type="FunctionRecorder", target="loss")  # assigned in mode='loss' only
    hook = dict(type="RecorderHook", recorders=[*PROPOSAL_RECORDERS, loss], loops="val")
    runner = make_runner(tmp_path, model, [hook, checker], val=True)
    runner.train()
    assert all(entry["hub"][OUTPUTS] is None for entry in checker.iters["train"])
    assert all(entry["hub"][OUTPUTS].shape == (3, 1) for entry in checker.iters["val"])
    assert runner.message_hub.get_info("runner_model:forward:loss@0") is None
    assert "the first val iteration did not reach runner_model:forward:loss@0" in log_text(runner)
    assert_restored(model)


def test_a_key_in_another_loop_s_step_method_is_not_named_as_unreached(tmp_path):
    torch.manual_seed(0)
    model = ToyModel()
    recorders = [
        dict(type="FunctionRecorder", method="train_step", target="parsed_losses"),  # train only
        dict(type="FunctionRecorder", method="val_step", target="data"),  # validation only
        dict(type="FunctionRecorder", target="loss"),  # assigned in mode='loss' only: named in val
    ]
    runner = make_runner(
        tmp_path, model, [dict(type="RecorderHook", recorders=recorders, loops=["train", "val"])], val=True
    )
    runner.train()
    warnings = [line for line in log_text(runner).splitlines() if "did not reach" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        "RecorderHook: the first val iteration did not reach runner_model:forward:loss@0 (a branch not "
        "taken, or a method not called in this loop); those keys are published only in iterations "
        "that reach them"
    )
    last_loss = runner.message_hub.get_scalar("train/loss").current()
    assert float(runner.message_hub.get_info("runner_model:train_step:parsed_losses@0")) == pytest.approx(
        last_loss
    )
    last_batch = runner.message_hub.get_info("runner_model:val_step:data@0")[
        "inputs"
    ]  # (pseudo_collate's list)
    assert torch.equal(torch.stack(last_batch), ToyDataset().data[9:12])
    assert_restored(model)


def test_a_run_that_runs_none_of_the_hook_s_loops_says_so(tmp_path):
    # tools/test.py with the proposal's config, which names no loops: the default, 'train', never runs.
    torch.manual_seed(0)
    model = ToyModel()
    hook = dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS, save_dir=str(tmp_path / "records"))
    runner = make_runner(tmp_path, model, [hook], test=True)
    runner.test()
    assert runner.message_hub.get_info(OUTPUTS) is None and not (tmp_path / "records").exists()
    assert (
        "RecorderHook: loops=['train'], but this run runs the test loop(s): nothing will be recorded; "
        "give loops=['train', 'test'] to record them too"
    ) in log_text(runner)
    assert_restored(model)
    # A run that runs one of them does not say it.
    hook["loops"] = ["train", "test"]
    runner = make_runner(tmp_path / "again", ToyModel(), [hook], test=True)  # (a log file of its own)
    runner.test()
    assert runner.message_hub.get_info(OUTPUTS).shape == (3, 1)
    assert "nothing will be recorded" not in log_text(runner)


def test_a_later_run_of_the_runner_that_runs_none_of_the_hook_s_loops_says_so(tmp_path):
    # MMEngine's tutorial: runner.train(), then runner.test() with the same runner and hook. The
    # training run built the train loop; the test run runs only the test loop, and records nothing.
    torch.manual_seed(0)
    runner = make_runner(tmp_path, ToyModel(), [RecorderHook(PROPOSAL_RECORDERS)], val=True, test=True)
    runner.train()
    assert "nothing will be recorded" not in log_text(runner)
    trained = runner.message_hub.get_info(OUTPUTS)
    runner.test()
    assert runner.message_hub.get_info(OUTPUTS) is trained  # (not recorded again)
    assert (
        "RecorderHook: loops=['train'], but this run runs the test loop(s): nothing will be recorded; "
        "give loops=['train', 'test'] to record them too"
    ) in log_text(runner)
    runner.val()
    assert "but this run runs the val loop(s): nothing will be recorded; give loops=['train', 'val']" in (
        log_text(runner)
    )


def test_a_run_that_fails_before_its_loop_starts_leaves_no_records_folder(tmp_path):
    # A hook after it failing in before_run (as a checkpoint that does not load fails after it):
    # the train folder was made, empty, for a run that never started.
    class FailsBeforeRun(Hook):
        priority = "LOWEST"

        def before_run(self, runner):
            raise RuntimeError("no checkpoint")

    records = tmp_path / "records"
    recorder = dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS, save_dir=str(records))
    model = ToyModel()
    runner = make_runner(tmp_path, model, [recorder, FailsBeforeRun()])
    with pytest.raises(RuntimeError, match="no checkpoint"):
        runner.train()
    assert not records.exists()
    assert_restored(model)
    runner = make_runner(tmp_path, ToyModel(), [recorder])
    runner.train()  # (the folder made at the first save)
    assert bcrecord.load(records / "train").steps(OUTPUTS) == [0, 1, 2, 3]


def test_two_recorder_hooks_share_a_method(tmp_path):
    torch.manual_seed(0)
    model = ToyModel()
    checker = Checker([OUTPUTS, WEIGHT])
    hooks = [
        dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS[:1]),
        dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS[1:], loops="val"),
        checker,
    ]
    runner = make_runner(tmp_path, model, hooks, val=True)
    runner.train()
    assert all(entry["hub"][WEIGHT] is None for entry in checker.iters["train"])
    assert all(entry["hub"][OUTPUTS].shape == (3, 1) for entry in checker.iters["train"])
    for entry in checker.iters["val"]:  # outputs keeps the last training value; the weight is fresh
        assert entry["hub"][OUTPUTS] is checker.iters["train"][-1]["hub"][OUTPUTS]
        assert torch.equal(entry["hub"][WEIGHT], model.linear1.weight.detach())
    assert_restored(model)
    assert "run" not in vars(runner.train_loop) and "run" not in vars(runner.val_loop)


def test_distributed_wrapper_resolves_through_module(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = ToyModel()
        wrapped = MMDistributedDataParallel(module=model)
        checker = Checker([OUTPUTS, WEIGHT], toy_snapshot)
        hook = dict(type="RecorderHook", recorders=PROPOSAL_RECORDERS, save_dir=str(tmp_path / "records"))
        runner = make_runner(tmp_path, wrapped, [hook, checker])
        assert runner.model is wrapped
        runner.train()
    finally:
        dist.destroy_process_group()
    for entry in checker.iters["train"]:
        assert entry["patched"]
        expected = toy_expected(entry)
        assert torch.allclose(entry["hub"][OUTPUTS], expected[OUTPUTS], rtol=1e-5, atol=1e-6)
    assert bcrecord.load(tmp_path / "records" / "train").steps(WEIGHT) == [0, 1, 2, 3]
    assert_restored(model)
    assert "forward" not in vars(wrapped)


def test_a_wrapper_s_own_train_step_is_recorded_where_it_runs(tmp_path):
    import torch.distributed as dist

    losses = "runner_model:train_step:losses@0"
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = ToyModel()
        wrapped = MMDistributedDataParallel(module=model)
        checker = Checker([losses, "runner_model:val_step:return"], toy_snapshot)
        # train_step: the wrapper's own (it never calls the model's); val_step: handed on to the model.
        recorders = [
            dict(type="FunctionRecorder", method="train_step", target="losses"),
            dict(type="FunctionRecorder", method="val_step", target="return"),
        ]
        hook = dict(type="RecorderHook", recorders=recorders, loops=["train", "val"])
        runner = make_runner(tmp_path, wrapped, [hook, checker], val=True)
        runner.train()
    finally:
        dist.destroy_process_group()
    assert len(checker.iters["train"]) == 4
    for entry in checker.iters["train"]:
        labels = torch.stack(entry["batch"]["data_samples"])
        expected = (labels - toy_expected(entry)[OUTPUTS]).sum()
        assert torch.allclose(entry["hub"][losses]["loss"], expected, rtol=1e-5, atol=1e-6)
    for entry in checker.iters["val"]:  # the model's val_step: its predictions
        w = entry["snapshot"]
        hidden = F.linear(torch.stack(entry["batch"]["inputs"]), w["linear1.weight"], w["linear1.bias"])
        expected = F.linear(hidden, w["linear2.weight"], w["linear2.bias"])
        assert torch.allclose(entry["hub"]["runner_model:val_step:return"], expected, rtol=1e-5, atol=1e-6)
    assert len(checker.iters["val"]) == 4
    assert_restored(model)
    assert "train_step" not in vars(wrapped) and "val_step" not in vars(model)


def test_a_wrapper_s_forward_is_looked_through(tmp_path):
    import torch.distributed as dist
    from mmengine.model import MMFullyShardedDataParallel

    # FSDP's forward hands on to the model without naming forward: the model's is recorded.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = ToyModel()
        wrapped = MMFullyShardedDataParallel(module=model, device_id=torch.device("cpu"))
        checker = Checker([OUTPUTS], toy_snapshot)
        hook = dict(
            type="RecorderHook", recorders=[dict(type="FunctionRecorder", target="outputs", index=[1])]
        )
        make_runner(tmp_path, wrapped, [hook, checker]).train()
    finally:
        dist.destroy_process_group()
    assert len(checker.iters["train"]) == 4
    for entry in checker.iters["train"]:
        expected = toy_expected(entry)[OUTPUTS]
        assert torch.allclose(entry["hub"][OUTPUTS], expected, rtol=1e-5, atol=1e-6)
    assert "forward" not in vars(wrapped) and type(model).forward.__code__ is TOY_CODE


@pytest.mark.parametrize("option", ["compile", "activation_checkpointing"])
def test_runner_options_that_wrap_a_recorded_method_after_before_run(tmp_path, option):
    # MMEngine sets model.train_step = torch.compile(model.train_step), and submodule.forward =
    # wraps(submodule.forward)(checkpointed), between before_run and before_train.
    if option == "compile":
        recorders, key = [dict(type="FunctionRecorder", method="train_step", target="losses")], None
        cfg = dict(compile=dict(backend="eager"))
    else:
        recorders = [dict(type="FunctionRecorder", model="linear1", target="return")]
        cfg = dict(activation_checkpointing=["linear1"])
    key = "runner_model:train_step:losses@0" if option == "compile" else "linear1:forward:return"
    torch.manual_seed(0)
    model = ToyModel()
    checker = Checker([key], toy_snapshot)
    runner = make_runner(tmp_path, model, [dict(type="RecorderHook", recorders=recorders), checker], cfg=cfg)
    runner.train()
    assert len(checker.iters["train"]) == 4
    for entry in checker.iters["train"]:
        w = entry["snapshot"]
        hidden = F.linear(torch.stack(entry["batch"]["inputs"]), w["linear1.weight"], w["linear1.bias"])
        if option == "compile":
            labels = torch.stack(entry["batch"]["data_samples"])
            outputs = F.linear(hidden, w["linear2.weight"], w["linear2.bias"])
            assert torch.allclose(entry["hub"][key]["loss"], (labels - outputs).sum(), rtol=1e-5, atol=1e-5)
        else:
            assert torch.allclose(entry["hub"][key], hidden, rtol=1e-5, atol=1e-6)
    assert type(model).train_step.__code__ is BaseModel.train_step.__code__
    assert nn.Linear.forward.__code__ is LINEAR_FORWARD_CODE


def test_a_complex_feature_map_is_drawn_by_its_magnitude_not_its_real_part():
    from bcrecord.integrations.mmengine import FeatureMapDrawer

    # Cast to float32, it lost its imaginary part (with torch's ComplexWarning every iteration).
    phase = torch.polar(torch.arange(1.0, 17.0).reshape(1, 4, 4), torch.full((1, 4, 4), 1.5))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = FeatureMapDrawer().featmap(phase)
    assert torch.allclose(drawn, torch.arange(1.0, 17.0).reshape(1, 4, 4))


def test_a_sample_index_past_either_end_of_the_batch_draws_its_last_or_first_sample():
    # One below -N failed to draw ("cannot draw ...: IndexError", logged, nothing drawn),
    # where one above N-1 drew the last sample.
    from types import SimpleNamespace

    from bcrecord.integrations.mmengine import FeatureMapDrawer

    batch = torch.stack([torch.zeros(1, 4, 4), torch.ones(1, 4, 4)])  # samples 0 and 1
    images, logged = [], []
    visualizer = SimpleNamespace(add_image=lambda name, image, step: images.append(name))
    runner = SimpleNamespace(visualizer=visualizer, logger=SimpleNamespace(warning=logged.append))
    for index, sample in ((-5, 0.0), (-2, 0.0), (-1, 1.0), (1, 1.0), (5, 1.0)):
        drawer = FeatureMapDrawer(sample_index=index)
        assert drawer.featmap(batch).mean().item() == sample
        assert drawer.draw(runner, {"m:forward:x@0": batch}, "val", step=0) == ["val_m.forward.x@0"]
        assert drawer.failed == set()
    assert (len(images), logged) == (5, [])


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
def test_what_a_signal_handler_raises_while_a_feature_map_is_drawn_reaches_the_run():
    # A SIGALRM timeout's TimeoutError raised while a feature map was drawn was logged as
    # "cannot draw" and the run went on past its timeout.
    from types import SimpleNamespace

    from bcrecord.integrations.mmengine import FeatureMapDrawer

    def add_image(name, image, step):
        signal.raise_signal(signal.SIGALRM)  # the timer fires while the image is written

    def times_out(number, frame):
        raise TimeoutError("timed out")

    runner = SimpleNamespace(visualizer=SimpleNamespace(add_image=add_image))
    drawer = FeatureMapDrawer()
    old = signal.signal(signal.SIGALRM, times_out)
    try:
        with pytest.raises(TimeoutError, match="timed out"):
            drawer.draw(runner, {"m:forward:x@0": torch.rand(1, 4, 6, 6)}, "val", step=1)
    finally:
        signal.signal(signal.SIGALRM, old)
    assert drawer.failed == set()  # not taken for a value that cannot be drawn


def test_visualization_hook_draws_from_the_message_hub(tmp_path):
    torch.manual_seed(0)
    model = MMResNet()
    hooks = [
        dict(type="RecorderHook", recorders=[RESNET_RECORDER]),
        RecorderVisualizationHook(keys=["resnet:_forward_impl:x@*"], interval=1),
    ]
    runner = make_runner(tmp_path, model, hooks, data=ImageDataset(), batch_size=4)
    runner.train()
    images = Path(runner.log_dir) / "vis_data" / "vis_image"
    names = sorted(p.name for p in images.iterdir())
    assert names == sorted(f"{image_name(key)}_{step}.png" for key in X_KEYS for step in (0, 1))
    for name in names:
        pixels = cv2.imread(str(images / name))
        assert pixels.shape[:2] == (16, 16) and pixels.std() > 5


def test_visualization_hook_never_draws_an_older_iteration_s_value_under_a_later_step():
    from types import SimpleNamespace

    images = []
    hub = {}
    visualizer = SimpleNamespace(add_image=lambda name, image, step: images.append((name, step)))
    runner = SimpleNamespace(visualizer=visualizer, message_hub=SimpleNamespace(runtime_info=hub), iter=0)
    hook = RecorderVisualizationHook(interval=2)
    published = {0: torch.rand(1, 2, 4, 4), 3: torch.rand(1, 2, 4, 4)}  # iterations 1, 2 reach no key
    for iteration in range(4):
        if iteration in published:
            hub["m:forward:x@0"] = published[iteration]
        runner.iter = iteration
        hook.after_train_iter(runner, iteration)
    # Drawn steps are 1 and 3: at 1 the hub still held iteration 0's value, which is not step 1's.
    assert images == [("train_m.forward.x@0", 3)]


def test_visualization_hook_draws_a_tensor_changed_in_place_as_a_new_value():
    # Under copy='none' the hub holds one parameter, which the optimizer changes in place: it
    # was drawn once, at the first iteration, however often it was published.
    from types import SimpleNamespace

    images = []
    weight = torch.rand(1, 2, 4, 4)
    hub = {"m:forward:self.weight": weight}
    visualizer = SimpleNamespace(add_image=lambda name, image, step: images.append(step))
    runner = SimpleNamespace(visualizer=visualizer, message_hub=SimpleNamespace(runtime_info=hub), iter=0)
    hook = RecorderVisualizationHook(interval=1)
    for iteration in range(4):
        if iteration in (1, 2):
            weight.add_(1)  # an optimizer's step, between two iterations' forwards
        runner.iter = iteration
        hook.after_train_iter(runner, iteration)
    assert images == [0, 1, 2]  # not 3: the same tensor, unchanged since


def test_a_later_run_of_the_same_runner_counts_evaluations_on_and_draws_over_no_image(tmp_path):
    # runner.val() after runner.train() started the validation steps at 0 again: without a
    # save_dir, its images, in the same folder, replaced those drawn in training's evaluations.
    torch.manual_seed(0)
    hook = dict(type="RecorderHook", recorders=[RESNET_RECORDER], loops=["train", "val"], visualize=True)
    runner = make_runner(tmp_path, MMResNet(), [hook], data=ImageDataset(), batch_size=4, val=True)
    runner.train()
    images = Path(runner.log_dir) / "vis_data" / "vis_image"
    drawn = {path.name: path.read_bytes() for path in images.glob("val_*.png")}
    runner.val()
    again = {path.name: path.read_bytes() for path in images.glob("val_*.png")}
    assert {name: again[name] for name in drawn} == drawn  # every image of the first run kept
    steps = sorted({int(name.rsplit("_", 1)[1][:-4]) for name in again})
    assert steps == [0, 1, 2, 3] and len(again) == 2 * len(drawn) == 12


def test_hook_object_is_reusable_across_runs(tmp_path):
    torch.manual_seed(0)
    model = ToyModel()
    hook = RecorderHook(PROPOSAL_RECORDERS, loops=["train", "test"])
    runner = make_runner(tmp_path, model, [hook], test=True)
    runner.train()
    assert not hook.patched and hook.keys == (OUTPUTS, WEIGHT)
    runner.message_hub.pop_info(OUTPUTS)
    runner.test()
    assert runner.message_hub.get_info(OUTPUTS).shape == (3, 1)
    assert_restored(model)
    assert os.path.isdir(runner.log_dir)


def test_a_submodule_wrapped_on_its_own_resolves_through_its_wrapper(tmp_path):
    # MMSeparateDistributedDataParallel (GANs) wraps each child in its own DDP.
    import torch.distributed as dist
    from mmengine.model import MMSeparateDistributedDataParallel

    class Generator(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(2, 2)

        def forward(self, x):
            h = self.lin(x)
            return h

    class Pair(BaseModel):
        def __init__(self):
            super().__init__()
            self.generator, self.disc = Generator(), nn.Linear(2, 1)

        def forward(self, inputs, data_samples=None, mode="tensor"):
            return self.generator(inputs)

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = Pair()
        generator = model.generator
        wrapped = MMSeparateDistributedDataParallel(module=model)
        assert type(wrapped.module.generator).__name__ == "MMDistributedDataParallel"
        assert resolve_model(wrapped, "generator") is generator
        assert resolve_model(wrapped, "generator.module") is generator
        assert resolve_model(wrapped, "generator.lin") is generator.lin
    finally:
        dist.destroy_process_group()


def test_a_model_path_hint_names_a_submodule_compiled_in_place_at_its_own_path():
    # The hint listed torch's raw named_modules() paths: 'blocks.0._orig_mod' (torch.compile's
    # wrapper attribute) among the close matches, never 'blocks.0.0', the path targets take.
    import torch._dynamo

    torch._dynamo.reset()
    model = nn.Sequential()
    model.blocks = nn.Sequential(nn.Sequential(nn.Linear(2, 2)), nn.ReLU())
    model.blocks[0] = torch.compile(model.blocks[0], backend="eager")
    with pytest.raises(
        RecorderConfigError, match=r"did you mean 'blocks\.0\.0', 'blocks\.0', 'blocks\.1'\?$"
    ) as error:
        resolve_model(model, "blocks.0.lin")
    assert "(Sequential): Sequential has no attribute 'lin'" in str(error.value)  # not OptimizedModule
    with pytest.raises(RecorderConfigError) as error:
        resolve_model(model, "zzz")
    assert str(error.value).endswith("; submodules include 'blocks', 'blocks.0', 'blocks.0.0', 'blocks.1'")
    assert resolve_model(model, "blocks.0.0") is model.blocks[0]._orig_mod[0]
    torch._dynamo.reset()


def test_public_api_has_examples_and_types():
    import bcrecord.integrations.mmengine as module

    from ..docstring_checks import undocumented

    # MMEngine's hook methods (before_run, after_train_iter...) are documented by MMEngine.
    assert undocumented(module) == []


@pytest.mark.parametrize("policy", ["clone", "deepcopy"])
def test_a_data_sample_is_kept_as_it_was_nested_elements_and_tensors_included(policy):
    from mmengine.structures import BaseDataElement, InstanceData

    live = torch.ones(2, requires_grad=True) * 2
    sample = BaseDataElement(metainfo=dict(img_shape=(2, 2)))
    sample.gt_instances = InstanceData(labels=torch.tensor([0]))
    sample.pred = live
    kept = runtime.copy_value({"sample": sample, "loss": live}, policy)["sample"]
    sample.gt_instances.labels.add_(100)  # what the model does with it later
    sample.gt_instances.scores = torch.ones(1)
    assert kept.gt_instances.labels.tolist() == [0] and "scores" not in kept.gt_instances
    assert kept.img_shape == (2, 2) and not kept.pred.requires_grad and torch.equal(kept.pred, live.detach())


def test_two_recorders_whose_keys_are_one_fail_at_before_run(tmp_path):
    model = ToyModel()
    recorders = [
        dict(type="FunctionRecorder", model="linear1", name="lin", target="return"),
        dict(type="FunctionRecorder", model="linear2", name="lin", target="return"),
    ]
    runner = make_runner(tmp_path, model, [dict(type="RecorderHook", recorders=recorders)])
    with pytest.raises(RecorderConfigError) as caught:
        runner.train()
    text = str(caught.value)
    assert text.startswith("RecorderHook: recorders[1] dict(type='FunctionRecorder', model='linear2'")
    assert "its key 'lin:forward:return' is also that of recorders[0]" in text and "another name=" in text
    assert runner.iter == 0
    assert_restored(model)


# --- properties: a recorder dict parses to its spec; any config is recorders or a RecorderConfigError ---

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bcrecord.specs import Attribute, Expr, Return  # noqa: E402

from ..typed_text import JSON, NAMES, SETTINGS, TYPED, specs_and_short_forms  # noqa: E402

_MODELS = st.sampled_from(["", "backbone", "backbone.layer1", "resnet.0"])


@SETTINGS
@given(specs_and_short_forms(), _MODELS, st.one_of(st.just("forward"), NAMES), st.one_of(st.none(), NAMES))
def test_property_a_function_recorder_parses_to_the_spec_of_its_short_form(
    spec_and_text, model, method, name
):
    spec, text = spec_and_text
    bare = spec.op if isinstance(spec, Expr) else text.partition("@")[0]
    index = None if isinstance(spec, Return) or spec.index is None else list(spec.index)
    recorder = dict(type="FunctionRecorder", target=bare, index=index, model=model, method=method, name=name)
    (parsed,) = parse_recorders([recorder])
    expected = Attribute(spec.target, at="load", index=spec.index) if isinstance(spec, Attribute) else spec
    assert (parsed.model, parsed.method, parsed.owner, parsed.spec) == (
        model,
        method,
        name or model or "runner_model",
        expected,
    )


_KEYS = st.sampled_from(["type", "target", "index", "copy", "at", "model", "method", "name", "idx", 1])
_VALUES = st.one_of(
    JSON, st.sampled_from(["FunctionRecorder", "AttributeRecorder", "self.fc", "m:forward:x@1"])
)


@SETTINGS
@given(
    st.one_of(JSON, TYPED, st.lists(st.one_of(st.dictionaries(_KEYS, _VALUES, max_size=6), JSON), max_size=3))
)
def test_property_any_config_is_recorders_or_a_recorder_config_error_that_names_it(recorders):
    try:
        parsed = parse_recorders(recorders)
    except RecorderConfigError as error:
        assert str(error).startswith("RecorderHook: ")
    else:
        assert parsed and all(
            isinstance(config.spec, (Attribute, Expr, Return, bcrecord.Local, bcrecord.Call))
            for config in parsed
        )
