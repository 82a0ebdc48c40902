"""RecorderCallback with a real Lightning Trainer on CPU: values, patches, loggers, saving."""

import copy
import csv
import inspect
import io
import warnings
import zlib

import pytest
import torch

import bcrecord.patch

pl = pytest.importorskip("lightning.pytorch", reason="the lightning tox env installs lightning")

import bcrecord  # noqa: E402
from bcrecord import runtime  # noqa: E402
from bcrecord.errors import TargetError  # noqa: E402
from bcrecord.integrations.lightning import (  # noqa: E402
    RecorderCallback,
    StepRecord,
    channel_mean_image,
    png_bytes,
    summarize,
)

# Lightning's own warnings (few workers, deprecations) are noise here; bcrecord's still fail a test.
pytestmark = pytest.mark.filterwarnings("ignore::Warning", "error::bcrecord.errors.RecordingWarning")

LINEAR_FORWARD = torch.nn.Linear.forward
CONV_FORWARD = torch.nn.Conv2d.forward


class ConvNet(pl.LightningModule):
    """A conv net that keeps, by its own plain Python, what bcrecord should record."""

    def __init__(self, fail_at_step=None):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 3, 3, padding=1)
        self.head = torch.nn.Linear(3 * 6 * 6, 2)
        self.fail_at_step = fail_at_step
        self.stash = {}  # (stage, batch_idx, global_step) -> what the step computed
        self.patched_during_step = []

    def forward(self, x):
        feats = self.conv(x)
        hidden = torch.relu(feats)
        logits = self.head(hidden.flatten(1))
        return logits

    def _step(self, stage, batch, batch_idx):
        x, y = batch
        weights = {k: v.detach().clone() for k, v in self.state_dict().items()}
        logits = self(x)
        if self.fail_at_step is not None and self.global_step == self.fail_at_step:
            self.stash[("failed", batch_idx, self.global_step)] = (x.clone(), weights, None)
            raise RuntimeError("boom")
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.stash[(stage, batch_idx, self.global_step)] = (x.clone(), weights, logits.detach().clone())
        # the torch layer patches functions in place: is Conv2d.forward's slot live?
        self.patched_during_step.append(("code", id(CONV_FORWARD)) in bcrecord.patch._slots)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step("fit", batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self._step("validate", batch, batch_idx)

    def test_step(self, batch, batch_idx):
        self._step("test", batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


def loader(n=16, batch_size=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 6, 6, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=batch_size)


def trainer(tmp_path, callback, logger=False, **kwargs):
    options = dict(
        max_steps=4,
        accelerator="cpu",
        devices=1,
        logger=logger,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp_path),
        num_sanity_val_steps=0,
    )
    options.update(kwargs)
    return pl.Trainer(**{"callbacks": [callback], **options})  # (or the callbacks given)


def expected_conv(stash_entry):
    x, weights, _ = stash_entry
    return torch.nn.functional.conv2d(x, weights["conv.weight"], weights["conv.bias"], padding=1)


def assert_clean(model):
    """Every patch and marker gone: the code objects are the originals."""
    assert torch.nn.Conv2d.forward is CONV_FORWARD and torch.nn.Linear.forward is LINEAR_FORWARD
    assert torch.nn.Conv2d.forward.__code__ is CONV_FORWARD.__code__
    assert ConvNet.forward.__code__ is FORWARD_CODE and ConvNet._step.__code__ is STEP_CODE
    assert "forward" not in vars(model)
    for _, module in model.named_modules():
        assert "_bcrecord_path" not in vars(module)
    assert not runtime.is_active()


FORWARD_CODE = ConvNet.forward.__code__
STEP_CODE = ConvNet._step.__code__


def test_fit_records_every_n_steps_with_values_equal_to_the_steps_own_computation(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv", ":forward:hidden", "head:forward:self.weight"], every_n_steps=2)
    trainer(tmp_path, callback, max_steps=5).fit(model, loader())
    records = callback.records("fit")
    assert [r.step for r in records] == [0, 2, 4]
    assert [r.batch_idx for r in records] == [0, 2, 0]  # 4 batches an epoch: step 4 is epoch 1, batch 0
    assert [r.epoch for r in records] == [0, 0, 1]
    for r in records:
        assert r.complete and r.stage == "fit"
        assert r.keys() == ["conv:forward:return", ":forward:hidden@0", "head:forward:self.weight"]
        stash = model.stash[("fit", r.batch_idx, r.step)]
        conv = expected_conv(stash)
        assert torch.allclose(r["conv:forward:return"], conv, atol=1e-6)
        assert torch.allclose(r[":forward:hidden@0"], torch.relu(conv), atol=1e-6)
        assert torch.equal(r["head:forward:self.weight"], stash[1]["head.weight"])
        assert r.of(":forward:hidden") == {":forward:hidden@0": r.all(":forward:hidden@0")}
        assert not r["conv:forward:return"].requires_grad
    # weights moved between recorded steps, and each record kept its own
    assert not torch.equal(records[0]["head:forward:self.weight"], records[1]["head:forward:self.weight"])
    assert callback.last is records[-1]
    # patched during every step of the stage, recorded or not; clean afterwards
    assert model.patched_during_step == [True] * 5
    assert type(model).forward.__code__ is FORWARD_CODE
    assert_clean(model)
    assert not callback.patched


def test_a_reused_callback_records_the_first_step_of_every_fit(tmp_path):
    # The step guard (one record per optimizer step) starts afresh with each fit.
    callback = RecorderCallback(["conv"], every_n_steps=50, stages=["fit"])
    for _ in range(2):
        trainer(tmp_path, callback, max_steps=2).fit(ConvNet(), loader())
    assert [r.step for r in callback.records("fit")] == [0, 0]


def test_the_tuner_s_trial_steps_record_nothing_and_the_fit_after_them_records(tmp_path):
    # lr_find sets the trainer's callbacks aside while it tries learning rates (Lightning's own
    # design, for every callback): it records nothing and leaves the model clean.
    from lightning.pytorch.tuner import Tuner

    class Tuned(ConvNet):
        def __init__(self):
            super().__init__()
            self.lr = 0.5

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

    model = Tuned()
    callback = RecorderCallback(["conv"], every_n_steps=1, stages=["fit"])
    fit = trainer(tmp_path, callback, max_steps=3)
    Tuner(fit).lr_find(model, loader(n=64), num_training=8, update_attr=False)
    assert callback.records("fit") == [] and len(model.stash) == 8  # its 8 trial steps ran
    assert_clean(model)
    model.stash.clear()
    fit.fit(model, loader())
    records = callback.records("fit")
    assert [r.step for r in records] == [0, 1, 2]
    assert torch.allclose(
        records[0]["conv:forward:return"], expected_conv(model.stash[("fit", 0, 0)]), atol=1e-6
    )


def test_scalar_summaries_in_callback_metrics_and_trainer_callback_metrics(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv", ":forward:hidden"], every_n_steps=3, log_to_logger=False)
    t = trainer(tmp_path, callback, max_steps=4)
    t.fit(model, loader())
    last = callback.last
    assert last.step == 3
    conv = expected_conv(model.stash[("fit", 3, 3)])
    name = "bcrecord/fit/conv:forward:return"
    expected = {
        "mean": conv.double().mean(),
        "std": conv.double().std(correction=0),
        "min": conv.min(),
        "max": conv.max(),
    }
    for stat, value in expected.items():
        assert float(callback.callback_metrics[f"{name}/{stat}"]) == pytest.approx(float(value), rel=1e-5)
        assert torch.equal(t.callback_metrics[f"{name}/{stat}"], callback.callback_metrics[f"{name}/{stat}"])
        assert last.metrics[f"{name}/{stat}"] == pytest.approx(float(value), rel=1e-5)
    assert float(t.callback_metrics["bcrecord/fit/:forward:hidden@0/min"]) == pytest.approx(0.0)


def test_a_callback_keeping_meta_tensors_fits_with_no_scalar_summaries_of_them(tmp_path):
    # The summaries read each value's numbers: a meta tensor has none, and the fit failed.
    model = ConvNet()
    callback = RecorderCallback(["conv"], every_n_steps=1, log_to_logger=False, to="meta")
    trainer(tmp_path, callback, max_steps=2).fit(model, loader())
    value = callback.last["conv:forward:return"]
    assert value.is_meta and value.shape == expected_conv(model.stash[("fit", 1, 1)]).shape
    assert not any(name.startswith("bcrecord/fit/conv") for name in callback.callback_metrics)
    assert_clean(model)


def test_exception_mid_fit_removes_patches_and_keeps_the_interrupted_batch(tmp_path):
    model = ConvNet(fail_at_step=2)
    callback = RecorderCallback(["conv"], every_n_steps=1, save_dir=tmp_path / "records")
    with pytest.raises(RuntimeError, match="boom"):
        trainer(tmp_path, callback, max_steps=5).fit(model, loader())
    assert_clean(model)
    assert [(r.step, r.complete) for r in callback.history] == [(0, True), (1, True), (2, False)]
    # what the failing batch computed before it failed is kept, and saved
    failed = expected_conv(model.stash[("failed", 2, 2)])
    assert torch.allclose(callback.last["conv:forward:return"], failed, atol=1e-6)
    loaded = bcrecord.load(tmp_path / "records" / "fit")
    assert loaded.steps("conv:forward:return") == [0, 1, 2]
    assert torch.equal(loaded["conv:forward:return"][2], callback.last["conv:forward:return"])
    # and a second run with the same callback works: the module is patched again (a fresh fit
    # into the same save_dir, whose step 0 is saved there again, as the callback says)
    model2 = ConvNet()
    with pytest.warns(
        bcrecord.RecordingWarning, match=r"already holds training steps 0\.\.2 .*\(starting at step 0\)"
    ):
        trainer(tmp_path, callback, max_steps=1).fit(model2, loader())
    assert callback.last.complete and torch.allclose(
        callback.last["conv:forward:return"], expected_conv(model2.stash[("fit", 0, 0)]), atol=1e-6
    )
    assert_clean(model2)


class SkipsTheRestOfEachEpoch(ConvNet):
    """Lightning ends an epoch where ``on_train_batch_start`` returns -1: that batch never runs."""

    def on_train_batch_start(self, batch, batch_idx):
        return -1 if batch_idx == 2 else None


def test_a_batch_that_lightning_skips_is_not_recorded_and_the_next_batch_of_its_step_is(tmp_path):
    model = SkipsTheRestOfEachEpoch()
    callback = RecorderCallback(["conv"], every_n_steps=2, save_dir=tmp_path / "rec")
    # Epoch 0 trains batches 0 and 1 (steps 0, 1) and skips batch 2 (at step 2): step 2 is epoch 1's batch 0.
    trainer(tmp_path, callback, max_steps=4).fit(model, loader())
    records = callback.records("fit")
    assert [(r.step, r.batch_idx, r.epoch) for r in records] == [(0, 0, 0), (2, 0, 1)]
    for r in records:
        assert r.complete and len(r.all("conv:forward:return")) == 1
        expected = expected_conv(model.stash[("fit", 0, r.step)])
        assert torch.allclose(r["conv:forward:return"], expected, atol=1e-6)
    assert bcrecord.load(tmp_path / "rec" / "fit").steps("conv:forward:return") == [0, 2]
    assert_clean(model)


def test_a_fit_resumed_from_an_older_checkpoint_says_which_training_steps_it_saves_again(tmp_path):
    records = tmp_path / "rec"
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1
    )
    first = RecorderCallback(["conv"], save_dir=records, log_to_logger=False)
    with pytest.raises(RuntimeError, match="boom"):  # at step 5, after the checkpoint of step 3
        trainer(tmp_path, first, max_steps=8, callbacks=[first, checkpoints], enable_checkpointing=True).fit(
            ConvNet(fail_at_step=5), loader()
        )
    [checkpoint] = (tmp_path / "ckpt").iterdir()
    assert checkpoint.name == "epoch=0-step=3.ckpt"
    model = ConvNet()
    resumed = RecorderCallback(["conv"], save_dir=records, log_to_logger=False)
    with pytest.warns(bcrecord.RecordingWarning) as warned:
        trainer(tmp_path, resumed, max_steps=8).fit(model, loader(), ckpt_path=str(checkpoint))
    # Steps 3, 4 and 5 ran before the failure and again after the resume: both are kept, and the
    # callback says so, naming them.
    [message] = [str(w.message) for w in warned if w.category is bcrecord.RecordingWarning]
    assert message.startswith(
        f"RecorderCallback: {records / 'fit'} already holds training steps 3..5 of an earlier run; this "
        "fit (resumed at step 3) saves those steps again"
    )
    loaded = bcrecord.load(records / "fit")
    assert loaded.steps("conv:forward:return") == [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]
    assert [r.step for r in resumed.records("fit")] == [3, 4, 5, 6, 7]
    assert torch.equal(loaded["conv:forward:return"][6], expected_conv(model.stash[("fit", 3, 3)]))
    assert_clean(model)


def test_a_resumed_fit_that_saves_every_n_th_step_names_the_steps_it_saved(tmp_path):
    # It named 'steps 3..4': step 3 was never saved (every 2nd step is).
    records = tmp_path / "rec"
    checkpoints = pl.callbacks.ModelCheckpoint(
        dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1
    )
    first = RecorderCallback(["conv"], every_n_steps=2, save_dir=records, log_to_logger=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer(tmp_path, first, max_steps=8, callbacks=[first, checkpoints], enable_checkpointing=True).fit(
            ConvNet(fail_at_step=5), loader()
        )
    [checkpoint] = (tmp_path / "ckpt").iterdir()
    resumed = RecorderCallback(["conv"], every_n_steps=2, save_dir=records, log_to_logger=False)
    with pytest.warns(bcrecord.RecordingWarning) as warned:
        trainer(tmp_path, resumed, max_steps=8).fit(ConvNet(), loader(), ckpt_path=str(checkpoint))
    [message] = [str(w.message) for w in warned if w.category is bcrecord.RecordingWarning]
    assert "already holds training step 4 of an earlier run; this fit (resumed at step 3)" in message
    assert bcrecord.load(records / "fit").steps("conv:forward:return") == [0, 2, 4, 4, 6]


def test_save_dir_round_trip(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv", ":forward:logits"], every_n_steps=2, save_dir=tmp_path / "rec")
    trainer(tmp_path, callback, max_steps=4, limit_val_batches=2, val_check_interval=4).fit(
        model, loader(), loader(n=8, seed=5)
    )
    loaded = bcrecord.load(tmp_path / "rec" / "fit")
    assert loaded.steps("conv:forward:return") == [0, 2]
    for saved, r in zip(loaded["conv:forward:return"], callback.records("fit"), strict=True):
        assert torch.equal(saved, r["conv:forward:return"])
    val = bcrecord.load(tmp_path / "rec" / "validate")
    assert val.steps(":forward:logits@0") == [0]  # validation batches 0 and 1: every 2nd
    stash = model.stash[("validate", 0, 4)]
    assert torch.allclose(val[":forward:logits@0"][0], stash[2], atol=1e-6)


def test_a_stage_run_on_its_own_saves_to_the_folder_named_after_it(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv"], save_dir=tmp_path / "rec", log_to_logger=False)
    run = trainer(tmp_path, callback)
    run.test(model, loader(n=8))
    run.validate(model, loader(n=4))
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == ["test", "validate"]
    tested = bcrecord.load(tmp_path / "rec" / "test")
    assert tested.steps("conv:forward:return") == [0, 1]
    for saved, r in zip(tested["conv:forward:return"], callback.records("test"), strict=True):
        assert torch.equal(saved, r["conv:forward:return"])
    assert torch.equal(tested["conv:forward:return"][1], expected_conv(model.stash[("test", 1, 0)]))


def test_under_ddp_spawn_each_rank_saves_its_own_batches_and_the_launching_callback_keeps_none(tmp_path):
    model = ConvNet()
    weight, bias = model.conv.weight.detach().clone(), model.conv.bias.detach().clone()
    callback = RecorderCallback(["conv"], save_dir=tmp_path / "rec", log_to_logger=False)
    run = trainer(tmp_path, callback, max_steps=2, strategy="ddp_spawn", devices=2)
    run.fit(model, loader())
    conv = torch.nn.functional.conv2d(loader().dataset.tensors[0], weight, bias, padding=1)
    saved = {rank: bcrecord.load(tmp_path / "rec" / "fit" / f"rank{rank}") for rank in (0, 1)}
    samples = {}
    for rank, records in saved.items():
        assert records.steps("conv:forward:return") == [0, 1]
        # step 0: the rank's first batch (its shard, as its DistributedSampler orders it) through the
        # initial conv: each row is one sample's conv output
        first = records["conv:forward:return"][0]
        samples[rank] = [i for row in first for i in range(16) if torch.allclose(row, conv[i], atol=1e-6)]
        assert len(first) == len(set(samples[rank])) == 4
    assert not set(samples[0]) & set(samples[1])  # two shards
    # The batches ran in the spawned processes: this process's callback kept none of them...
    assert callback.last is None and list(callback.history) == [] and callback.callback_metrics == {}
    # ...while Lightning sent rank 0's callback_metrics back to the trainer here.
    rank0_last = saved[0]["conv:forward:return"][-1].double()
    assert float(run.callback_metrics["bcrecord/fit/conv:forward:return/mean"]) == pytest.approx(
        float(rank0_last.mean())
    )
    assert_clean(model)


def test_a_later_run_into_the_same_save_dir_counts_its_evaluation_steps_on(tmp_path):
    # Two processes testing (or a fit resumed) into one save_dir: the second callback starts
    # afresh, and its batches must not be saved again as steps 0, 1 (two values per step).
    model = ConvNet()
    first = RecorderCallback(["conv"], save_dir=tmp_path / "rec", log_to_logger=False)
    trainer(tmp_path, first).test(model, loader(n=8))
    second = RecorderCallback(["conv"], save_dir=tmp_path / "rec", log_to_logger=False)
    trainer(tmp_path, second).test(model, loader(n=8, seed=2))
    assert [r.step for r in second.records("test")] == [2, 3]
    tested = bcrecord.load(tmp_path / "rec" / "test")
    assert tested.steps("conv:forward:return") == [0, 1, 2, 3]
    saved = tested["conv:forward:return"]
    for value, r in zip(saved[2:], second.records("test"), strict=True):
        assert torch.equal(value, r["conv:forward:return"])
    assert not torch.equal(saved[0], saved[2])  # the second run's own batches


class LambdaNet(ConvNet):
    def forward(self, x):
        scale = lambda t: t  # noqa: E731  (a local function: pickle refuses it)
        return scale(super().forward(x))


def test_a_value_that_cannot_be_pickled_is_saved_as_its_repr_and_fit_goes_on(tmp_path):
    model = LambdaNet()
    callback = RecorderCallback(["conv", ":forward:scale"], save_dir=tmp_path / "rec")
    with pytest.warns(bcrecord.RecordingWarning) as warned:
        trainer(tmp_path, callback, max_steps=3).fit(model, loader())
    assert model.global_step == 3
    loaded = bcrecord.load(tmp_path / "rec" / "fit")
    assert loaded.steps(":forward:scale@0") == loaded.steps("conv:forward:return") == [0, 1, 2]
    assert all(
        v.startswith("<function LambdaNet.forward.<locals>.<lambda> at ") for v in loaded[":forward:scale@0"]
    )
    for saved, r in zip(loaded["conv:forward:return"], callback.records("fit"), strict=True):
        assert torch.equal(saved, r["conv:forward:return"])  # the other values as they were
    mine = [w for w in warned if "saved its repr" in str(w.message)]
    assert len(mine) == 1  # once per key, though every step had one
    assert "/bcrecord/" not in mine[0].filename  # pointing outside bcrecord
    mine = [str(w.message) for w in mine]
    assert mine[0].startswith(
        "RecorderCallback: cannot save ':forward:scale@0' (step 0): function cannot be pickled ("
    )
    assert_clean(model)


def test_validation_inside_fit_and_the_sanity_check(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv"], every_n_steps=1, log_to_logger=False)
    trainer(
        tmp_path, callback, max_steps=4, num_sanity_val_steps=2, val_check_interval=2, limit_val_batches=2
    ).fit(model, loader(), loader(n=8, seed=5))
    val = callback.records("validate")
    # two validation runs (after steps 2 and 4) of 2 batches; the sanity check is not recorded
    assert [(r.step, r.batch_idx) for r in val] == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert [r.step for r in callback.records("fit")] == [0, 1, 2, 3]
    for r, global_step in zip(val, [2, 2, 4, 4], strict=True):
        stash = model.stash[("validate", r.batch_idx, global_step)]
        assert torch.allclose(r["conv:forward:return"], expected_conv(stash), atol=1e-6)
    assert_clean(model)


def test_stages_filter(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv"], stages=("validate",), log_to_logger=False)
    trainer(tmp_path, callback, max_steps=2, val_check_interval=2, limit_val_batches=1).fit(
        model, loader(), loader(n=4, seed=5)
    )
    assert {r.stage for r in callback.history} == {"validate"} and len(callback.history) == 1
    assert_clean(model)


class BypassingNet(ConvNet):
    """Its training_step calls the layers itself, never ``forward``; validation goes through ``forward``."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        hidden = torch.relu(self.conv(x))
        return torch.nn.functional.cross_entropy(self.head(hidden.flatten(1)), y)


def test_a_target_the_first_batch_of_a_stage_does_not_reach_is_named_in_a_warning(tmp_path):
    model = BypassingNet()
    callback = RecorderCallback([":forward:hidden", "conv"], log_to_logger=False)
    with pytest.warns(bcrecord.RecordingWarning) as warned:
        trainer(tmp_path, callback, max_steps=3, val_check_interval=3, limit_val_batches=2).fit(
            model, loader(), loader(n=8, seed=5)
        )
    # Once, for training, whose step bypasses forward; validation_step calls forward and reaches it.
    [message] = [str(w.message) for w in warned if w.category is bcrecord.RecordingWarning]
    assert message.startswith(
        "RecorderCallback: the first recorded fit batch did not reach ':forward:hidden': a method "
        "training_step does not call"
    )
    assert [r.keys() for r in callback.records("fit")] == [["conv:forward:return"]] * 3
    assert [sorted(r) for r in callback.records("validate")] == [
        [":forward:hidden@0", "conv:forward:return"]
    ] * 2
    assert_clean(model)


class StepLocalsNet(ConvNet):
    """ConvNet whose training and validation steps each have a local of their own."""

    def training_step(self, batch, batch_idx):
        loss = self._step("fit", batch, batch_idx)
        return loss

    def validation_step(self, batch, batch_idx):
        vloss = self._step("validate", batch, batch_idx)
        return vloss


def test_a_target_in_another_stage_s_step_method_is_not_named_as_unreached(tmp_path):
    # (RecordingWarning is an error here: the callback must not warn at all)
    model = StepLocalsNet()
    callback = RecorderCallback(
        [":training_step:loss", ":validation_step:vloss", ":forward:hidden"], log_to_logger=False
    )
    run = trainer(tmp_path, callback, max_steps=2, val_check_interval=2, limit_val_batches=2)
    run.fit(model, loader(), loader(n=8, seed=5))
    run.test(model, loader(n=8, seed=5))
    assert [sorted(r) for r in callback.records("fit")] == [
        [":forward:hidden@0", ":training_step:loss@0"]
    ] * 2
    assert [sorted(r) for r in callback.records("validate")] == [
        [":forward:hidden@0", ":validation_step:vloss@0"]
    ] * 2
    assert [sorted(r) for r in callback.records("test")] == [[":forward:hidden@0"]] * 2
    _, _, logits = model.stash[("fit", 1, 1)]
    _, y = list(loader())[1]
    expected = torch.nn.functional.cross_entropy(logits, y)
    assert torch.allclose(callback.records("fit")[1][":training_step:loss@0"], expected)
    assert_clean(model)


def test_validate_test_predict(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv", ":forward:logits"], every_n_steps=2, log_to_logger=False)
    t = trainer(tmp_path, callback)
    t.validate(model, loader(n=12, seed=7))
    t.test(model, loader(n=8, seed=8))
    # each trainer function starts with fresh trainer.callback_metrics; the callback's own keep all
    assert "bcrecord/test/conv:forward:return/mean" in t.callback_metrics
    predictions = t.predict(model, loader(n=12, seed=9))
    assert [r.batch_idx for r in callback.records("validate")] == [0, 2]
    assert [r.batch_idx for r in callback.records("test")] == [0]
    predict = callback.records("predict")
    assert [r.step for r in predict] == [0, 2]
    for r in predict:
        assert torch.equal(r[":forward:logits@0"], predictions[r.batch_idx])
    for r in callback.records("test"):
        stash = model.stash[("test", r.batch_idx, 0)]
        assert torch.allclose(r["conv:forward:return"], expected_conv(stash), atol=1e-6)
    assert "bcrecord/validate/conv:forward:return/mean" in callback.callback_metrics
    assert "bcrecord/predict/:forward:logits@0/max" in callback.callback_metrics
    assert_clean(model)


def read_png(data):
    """Decode an 8-bit grayscale or RGB(A) PNG without filters beyond 'None'/'Sub'/'Up'."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")
            channels = {0: 1, 2: 3, 6: 4, 4: 2}[body[9]]
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytes(stride)
    for r in range(height):
        line = raw[r * (stride + 1) : (r + 1) * (stride + 1)]
        kind, row = line[0], bytearray(line[1:])
        for i in range(stride):
            left = row[i - channels] if i >= channels else 0
            up = previous[i]
            if kind == 1:
                row[i] = (row[i] + left) & 255
            elif kind == 2:
                row[i] = (row[i] + up) & 255
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 255
            elif kind == 4:
                ul = previous[i - channels] if i >= channels else 0
                p = left + up - ul
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
                row[i] = (row[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else ul)) & 255
        rows.append(list(row[::channels]))
        previous = bytes(row)
    return torch.tensor(rows, dtype=torch.float32)


def test_png_bytes_round_trip():
    image = torch.linspace(0, 1, 12).reshape(3, 4)
    assert torch.equal(read_png(png_bytes(image)), (image * 255).round())


def test_png_bytes_refuses_what_is_no_picture():
    # None gave AttributeError ('dim'); an empty tensor, a PNG of 0 x 0 pixels no reader opens.
    with pytest.raises(TypeError, match="^png_bytes needs a \\(H, W\\) tensor, got NoneType$"):
        png_bytes(None)
    for empty in (torch.ones(0, 0), torch.ones(0, 3), torch.ones(2, 0)):
        with pytest.raises(ValueError, match="with pixels, got shape"):
            png_bytes(empty)
    assert read_png(png_bytes(torch.ones(1, 1))).tolist() == [[255.0]]


def test_csv_logger_gets_scalars_and_png_pictures(tmp_path):
    model = ConvNet()
    logger = pl.loggers.CSVLogger(str(tmp_path), name="csv")
    callback = RecorderCallback(["conv", ":forward:logits"], every_n_steps=2)
    trainer(tmp_path, callback, logger=logger, max_steps=4).fit(model, loader())
    logger.finalize("success")
    with open(f"{logger.log_dir}/metrics.csv") as handle:
        rows = list(csv.DictReader(handle))
    column = "bcrecord/fit/conv:forward:return/mean"
    logged = {int(row["step"]): float(row[column]) for row in rows if row.get(column)}
    assert sorted(logged) == [0, 2]
    for r in callback.records("fit"):
        conv = expected_conv(model.stash[("fit", r.batch_idx, r.step)])
        assert logged[r.step] == pytest.approx(float(conv.double().mean()), rel=1e-5)
    folder = tmp_path / "csv" / "version_0" / "bcrecord_images" / "fit" / "conv_forward_return"
    assert sorted(p.name for p in folder.iterdir()) == ["step_000000.png", "step_000002.png"]
    picture = read_png((folder / "step_000002.png").read_bytes())
    conv = expected_conv(model.stash[("fit", 2, 2)])
    mean = conv[0].mean(0)
    expected = ((mean - mean.min()) / (mean.max() - mean.min()) * 255).round()
    assert picture.shape == (6, 6) and picture.std() > 10  # not blank
    assert (picture - expected).abs().max() <= 1
    # logits are 2-D: scalars, no picture
    assert not (folder.parent / "_forward_logits_0").exists()
    assert "bcrecord/fit/:forward:logits@0/std" in rows[0] or any(
        row.get("bcrecord/fit/:forward:logits@0/std") for row in rows
    )


def test_tensorboard_logger_gets_scalars_and_images(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = ConvNet()
    logger = pl.loggers.TensorBoardLogger(str(tmp_path), name="tb")
    callback = RecorderCallback(["conv"], every_n_steps=2)
    trainer(tmp_path, callback, logger=logger, max_steps=4).fit(model, loader())
    logger.finalize("success")
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    tag = "bcrecord/fit/conv:forward:return"
    maxima = {e.step: e.value for e in events.Scalars(f"{tag}/max")}
    assert sorted(maxima) == [0, 2]
    for r in callback.records("fit"):
        conv = expected_conv(model.stash[("fit", r.batch_idx, r.step)])
        assert maxima[r.step] == pytest.approx(float(conv.max()), rel=1e-6)
    images = events.Images(tag)
    assert [i.step for i in images] == [0, 2] and (images[0].width, images[0].height) == (6, 6)
    picture = read_png(images[1].encoded_image_string)
    expected = channel_mean_image(expected_conv(model.stash[("fit", 2, 2)])) * 255
    assert picture.std() > 10 and (picture - expected).abs().max() <= 1.0


def test_bad_target_fails_clearly_and_changes_nothing(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["convv"], save_dir=tmp_path / "rec")
    with pytest.raises(TargetError, match="did you mean 'conv'"):
        run = trainer(tmp_path, callback, max_steps=1, num_sanity_val_steps=2)
        run.fit(model, loader(), loader(n=8))
    assert_clean(model)
    # checked as the run is set up: before the sanity check's batches, and before any folder
    assert model.stash == {} and not (tmp_path / "rec").exists()


@pytest.mark.parametrize(
    "keyed, written",
    [
        (["runner_model:forward:logits@0"], "':forward:logits@0'"),
        (["conv", "runner_model.head:forward:input"], "'head:forward:input'"),
        (["runner_model", "runner_model.conv"], "':forward:return' and 'conv'"),
    ],
)
@pytest.mark.parametrize("run", ["fit", "test"])
def test_a_target_written_as_an_mmengine_key_is_told_the_lightning_form_and_changes_nothing(
    tmp_path, keyed, written, run
):
    # Was only "the model has no submodule 'runner_model'".
    model = ConvNet()
    callback = RecorderCallback(keyed, save_dir=tmp_path / "rec")
    with pytest.raises(TargetError) as caught:
        getattr(trainer(tmp_path, callback, max_steps=1), run)(model, loader())
    assert str(caught.value) == (
        "the LightningModule has no submodule 'runner_model': 'runner_model:' is MMEngine's key form; "
        f"a RecorderCallback's targets start at the LightningModule itself: write {written}"
    )
    assert_clean(model)
    assert model.stash == {} and not (tmp_path / "rec").exists()


def test_a_module_with_its_own_runner_model_is_not_told_it_has_none(tmp_path):
    # Was "the LightningModule has no submodule 'runner_model': ... write 'missing'".
    model = ConvNet()
    model.runner_model = torch.nn.Sequential(torch.nn.Identity())
    callback = RecorderCallback(["runner_model.missing"], save_dir=tmp_path / "rec")
    with pytest.raises(TargetError, match="no submodule 'runner_model.missing'") as caught:
        trainer(tmp_path, callback, max_steps=1).fit(model, loader())
    assert "MMEngine" not in str(caught.value)
    assert_clean(model)


class _BuiltLate(pl.LightningModule):
    """Layers made in configure_model(), which Lightning calls after the callbacks' setup()."""

    def __init__(self):
        super().__init__()
        self.net = None

    def configure_model(self):
        if self.net is None:
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        return self.net(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)  # (the layer stays as it is: checked below)


class _TestedLate(_BuiltLate):
    def test_step(self, batch, batch_idx):
        return self.net(batch).sum()


def test_a_later_run_counts_on_also_where_the_layers_are_built_in_configure_model(tmp_path):
    # setup() cannot open the folder (the targets do not exist yet): the stage's start does,
    # before its first batch is numbered.
    data = torch.utils.data.DataLoader(torch.randn(8, 4), batch_size=4)
    steps = []
    for _ in range(2):
        callback = RecorderCallback(["net.0"], save_dir=tmp_path / "rec", log_to_logger=False)
        trainer(tmp_path, callback).test(_TestedLate(), data)
        steps.append([r.step for r in callback.records("test")])
    assert steps == [[0, 1], [2, 3]]
    assert bcrecord.load(tmp_path / "rec" / "test").steps("net.0:forward:return") == [0, 1, 2, 3]


def test_targets_in_layers_built_in_configure_model_are_recorded(tmp_path):
    model = _BuiltLate()
    callback = RecorderCallback(["net.0"], save_dir=tmp_path / "rec", log_to_logger=False)
    data = torch.randn(8, 4)
    trainer(tmp_path, callback, max_steps=2).fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    saved = bcrecord.load(tmp_path / "rec" / "fit")
    assert saved.steps("net.0:forward:return") == [0, 1]
    for got, batch in zip(saved["net.0:forward:return"], data.split(4), strict=True):
        assert torch.allclose(got, model.net[0](batch).detach(), atol=1e-6)
    wrong = RecorderCallback(["net.9"], save_dir=tmp_path / "wrong", log_to_logger=False)
    batches = torch.utils.data.DataLoader(data, batch_size=4)
    with pytest.raises(TargetError, match="net.9"):  # still refused, before any batch
        trainer(tmp_path, wrong, max_steps=1).fit(_BuiltLate(), batches)
    assert not (tmp_path / "wrong").exists()


def test_arguments_are_checked():
    with pytest.raises(ValueError, match="every_n_steps"):
        RecorderCallback(["conv"], every_n_steps=0)
    with pytest.raises(ValueError, match="unknown stage"):
        RecorderCallback(["conv"], stages=("train",))
    with pytest.raises(ValueError, match="stop_after_last"):
        RecorderCallback(["conv"], stop_after_last=True)
    with pytest.raises(ValueError, match="at least one"):
        RecorderCallback([])
    # record()'s options, now rather than when a recorded loop starts (maybe after a whole fit)
    with pytest.raises(bcrecord.SpecError, match="unknown copy policy 'foo'"):
        RecorderCallback(["conv"], copy="foo")
    with pytest.raises(bcrecord.SpecError, match="keep must be"):
        RecorderCallback(["conv"], keep=0)
    with pytest.raises(TypeError, match="unknown option.*cpy; accepted: copy"):
        RecorderCallback(["conv"], cpy="clone")
    with pytest.raises(TypeError, match="reduce must be a callable"):
        RecorderCallback(["conv"], reduce=5)
    with pytest.raises(TypeError, match="dtype= takes a torch.dtype"):
        RecorderCallback(["conv"], dtype="float")
    with pytest.raises(bcrecord.SpecError, match="save_dir is an empty string"):
        RecorderCallback(["conv"], save_dir="")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (dict(targets=5), "targets must be a string or a list of strings, got 5"),
        (dict(targets=["conv", 5]), "targets must be a string or a list of strings, got ['conv', 5]"),
        (dict(stages=5), "stages must be a string or a list of strings, got 5"),
        (dict(history="10"), "history must be a positive int or None, got '10'"),
        (dict(history=2.5), "history must be a positive int or None, got 2.5"),
        (dict(save_dir=5), "save_dir must be a directory's path (a str or a Path), got 5"),
        (dict(log_to_logger="no"), "log_to_logger is True or False, got 'no'"),
        (dict(log_images="False"), "log_images is True or False, got 'False'"),
        (dict(prefix=None), "prefix must be a str, got None"),
        (dict(prefix=["a"]), "prefix must be a str, got ['a']"),
        (
            dict(stages=[]),
            "stages is empty: nothing would be recorded; choose from ['fit', 'validate', 'test', 'predict']",
        ),
    ],
)
def test_an_argument_of_the_wrong_type_is_refused_naming_itself(arguments, message):
    # It was a bare TypeError from deep inside ('int' object is not iterable, '<' not supported),
    # or, for a flag, taken as true ('no'); a bad target was found only when a loop started.
    arguments = {"targets": ["conv"], **arguments}
    with pytest.raises(bcrecord.SpecError) as raised:
        RecorderCallback(**arguments)
    assert str(raised.value) == message
    callback = RecorderCallback(["conv"], stages="fit", history=10, log_to_logger=False)  # the good ones
    assert (callback.stages, callback.history.maxlen, callback.log_to_logger) == (("fit",), 10, False)


def test_a_misspelt_option_of_the_callback_s_own_is_named_with_what_it_may_mean():
    # It went to record()'s options, whose error listed only theirs: every_n_steps looked unknown.
    with pytest.raises(TypeError) as raised:
        RecorderCallback(["conv"], every_n_step=2)
    message = str(raised.value)
    assert message.startswith("RecorderCallback: unknown option(s) every_n_step; accepted: copy, to, ")
    assert message.endswith("; did you mean 'every_n_steps'?")
    assert "stop_after_last" not in message  # refused here: not offered
    own = [
        name
        for name, parameter in inspect.signature(RecorderCallback).parameters.items()
        if name != "targets" and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    ]
    assert message.split(" (record()'s) and ")[1].split(";")[0] == ", ".join(own)


def test_a_save_dir_that_cannot_take_records_stops_the_run_before_it_trains(tmp_path):
    (tmp_path / "rec" / "validate").mkdir(parents=True)
    (tmp_path / "rec" / "validate" / "index.json").write_text('{"name": "my project"}')
    model = ConvNet()
    callback = RecorderCallback(["conv"], save_dir=tmp_path / "rec", log_to_logger=False)
    with pytest.raises(
        bcrecord.storage.StorageError, match=r"RecorderCallback\(save_dir=.*not a bcrecord records index"
    ):
        trainer(tmp_path, callback, max_steps=2).fit(model, loader())
    assert model.global_step == 0 and not (tmp_path / "rec" / "validate" / "records").exists()
    assert_clean(model)


def test_record_options_pass_through(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv"], dtype=torch.float64, log_to_logger=False)
    trainer(tmp_path, callback, max_steps=1).fit(model, loader())
    value = callback.last["conv:forward:return"]
    assert value.dtype == torch.float64
    assert torch.allclose(value, expected_conv(model.stash[("fit", 0, 0)]).double(), atol=1e-6)


def test_deepcopied_module_after_fit_is_clean(tmp_path):
    model = ConvNet()
    trainer(tmp_path, RecorderCallback(["conv"], log_to_logger=False), max_steps=1).fit(model, loader())
    clone = copy.deepcopy(model)
    for _, module in clone.named_modules():
        assert "_bcrecord_path" not in vars(module)


def test_summaries_and_pictures_helpers():
    assert summarize(torch.tensor([2.0])) == {"mean": 2.0, "std": 0.0, "min": 2.0, "max": 2.0}
    assert summarize(torch.tensor([])) == {} and summarize("text") == {}
    # what nn.TransformerEncoder makes with a padding mask in eval mode, and sparse values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ragged = torch.nested.nested_tensor([torch.tensor([1.0, 3.0]), torch.tensor([2.0])])
    assert summarize(ragged) == {"mean": 2.0, "std": (2 / 3) ** 0.5, "min": 1.0, "max": 3.0}
    assert summarize(torch.eye(2).to_sparse())["mean"] == 0.5 and channel_mean_image(ragged) is None
    assert channel_mean_image(torch.ones(1, 2, 3, 3)).abs().sum() == 0  # constant: zeros
    image = channel_mean_image(torch.arange(24.0).reshape(2, 3, 4))  # (C, H, W)
    assert image.shape == (3, 4) and float(image.min()) == 0.0 and float(image.max()) == 1.0
    record = StepRecord("fit", 0, 0, 0, 0, {"k": [1]}, {"t": ["k"]})
    with pytest.raises(KeyError, match="was not recorded"):
        record["missing"]


def test_pytorch_lightning_trainer_too(tmp_path):
    ptl = pytest.importorskip("pytorch_lightning")

    class Small(ptl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            self.seen = batch @ self.lin.weight.detach().T + self.lin.bias.detach()
            return self.lin(batch).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    callback = RecorderCallback(["lin"], log_to_logger=False)
    model = Small()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ptl.Trainer(
            max_steps=2,
            callbacks=[callback],
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            default_root_dir=str(tmp_path),
        ).fit(model, torch.utils.data.DataLoader(torch.randn(8, 3), batch_size=4))
    assert [r.step for r in callback.history] == [0, 1]
    assert torch.allclose(callback.last["lin:forward:return"], model.seen, atol=1e-6)
    assert torch.nn.Linear.forward is LINEAR_FORWARD


def test_repr_and_iteration(tmp_path):
    callback = RecorderCallback(["conv"], log_to_logger=False, history=2)
    trainer(tmp_path, callback, max_steps=3).fit(ConvNet(), loader())
    assert [r.step for r in callback] == [1, 2]  # history keeps the last 2
    assert "idle" in repr(callback) and "2 record(s)" in repr(callback)
    assert io.StringIO(repr(callback)).read().startswith("<RecorderCallback")


def test_a_record_iterates_over_its_keys_as_a_dict_of_latest_values_would(tmp_path):
    model = ConvNet()
    callback = RecorderCallback(["conv", ":forward:hidden"], log_to_logger=False)
    trainer(tmp_path, callback, max_steps=2).fit(model, loader())
    last = callback.last
    keys = ["conv:forward:return", ":forward:hidden@0"]
    assert list(last) == last.keys() == keys
    assert sorted(last) == sorted(keys) and len(last) == 2
    assert all(key in last for key in last) and "conv:forward:x@0" not in last
    latest = dict(zip(last, (last[key] for key in last), strict=True))
    conv = expected_conv(model.stash[("fit", last.batch_idx, last.step)])
    assert torch.allclose(latest["conv:forward:return"], conv, atol=1e-6)
    assert last.get(":forward:hidden@0") is latest[":forward:hidden@0"] and last.get("nope", 0) == 0
    # A kept batch that recorded nothing still counts as kept.
    empty = StepRecord("fit", 0, 0, 0, 0, {}, {}, complete=False)
    assert list(empty) == [] and len(empty) == 0 and bool(empty)


def test_public_api_has_examples_and_types():
    import bcrecord.integrations.lightning as module

    from ..docstring_checks import undocumented

    # Lightning's callback methods (setup, on_train_batch_end...) are documented by Lightning.
    assert undocumented(module) == []
