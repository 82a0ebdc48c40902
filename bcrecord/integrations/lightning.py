"""Record inside a LightningModule while Lightning trains, validates, tests or predicts.

:class:`RecorderCallback` takes the target strings of :func:`bcrecord.torch.record`,
relative to the LightningModule (``'net.0'``, ``'net.1:forward:x@0'``,
``':forward:h@1'`` for the module's own ``forward``), and:

* **patches** the module when a loop starts (``on_train_start``,
  ``on_validation_start``, ``on_test_start``, ``on_predict_start``) and removes
  every patch when it ends, and also when the run fails (``on_exception``) or is
  torn down: afterwards the module's code objects are the originals;
* **records** every ``every_n_steps``-th batch of the stages in ``stages``, with a
  recording entered in ``on_*_batch_start`` and left in ``on_*_batch_end``; the
  batches in between run the unpatched code, at no cost (a batch that Lightning skips,
  where ``on_train_batch_start`` returns -1, records nothing: its step is recorded by the
  next batch of that ``global_step``);
* keeps each recorded batch as a :class:`StepRecord` in :attr:`RecorderCallback.last`
  and :attr:`RecorderCallback.history`; the first recorded batch of each stage warns
  (a :class:`~bcrecord.errors.RecordingWarning`) naming the targets it did not reach,
  such as ``':forward:h'`` where ``training_step`` calls the layers, not ``self(x)``
  (a target in another stage's step method, ``':validation_step:loss'`` in a training
  batch, is not named: those batches never run it);
* puts scalar summaries (``mean``, ``std``, ``min``, ``max`` of each tensor) into
  :attr:`RecorderCallback.callback_metrics` and ``trainer.callback_metrics``, under
  ``'bcrecord/<stage>/<key>/<stat>'``, so ``ModelCheckpoint`` or ``EarlyStopping``
  can monitor them;
* with ``log_to_logger``, logs those scalars to the trainer's loggers and, for 3-D
  and 4-D tensors, a channel-mean picture: ``add_image`` on a ``TensorBoardLogger``,
  a PNG file under ``<log_dir>/bcrecord_images/`` for a ``CSVLogger``;
* with ``save_dir``, writes each recorded batch with :class:`bcrecord.storage.Writer`
  to ``<save_dir>/<stage>/`` (``<save_dir>/<stage>/rank<r>/`` when several processes
  train), readable with :func:`bcrecord.load`; a value that cannot be pickled (a local
  lambda) is saved as its repr, with one :class:`~bcrecord.errors.RecordingWarning` per key.

Stages: ``'fit'`` is the training batches, ``'validate'`` the validation batches
(those of ``trainer.validate`` and of the validation loop inside ``fit``; never the
sanity check), ``'test'`` and ``'predict'`` those of ``trainer.test`` and
``trainer.predict``. A record's ``step`` is ``trainer.global_step`` for training
batches (recorded when ``global_step % every_n_steps == 0``, the first batch of
that optimizer step), and for the other stages the number of batches that stage
has run under this callback (recorded when it is a multiple of ``every_n_steps``);
with ``save_dir``, counting on from the last step already saved in that stage's
folder, so a later run (a resumed fit, a second process testing) repeats no step.
Training steps do repeat: a fit resumed from a checkpoint saves again the steps the
earlier fit saved after that checkpoint, and a fresh fit into the same folder starts at
step 0 again; :func:`bcrecord.load` returns both values of such a step, in the order
saved, and the callback warns (a :class:`~bcrecord.errors.RecordingWarning`) naming them.
Lightning's tuner (``Tuner(trainer).lr_find``, ``scale_batch_size``) runs its trial
steps with the trainer's callbacks set aside (its own alone), so they record nothing,
as they run no other callback; a ``fit`` after it records from its first step.
The callback keeps nothing in checkpoints (a checkpoint made with it resumes without it,
and Lightning asks for no callback): a fit resumed with ``ckpt_path=`` numbers its
validation batches from 0 again, unless ``save_dir`` holds the earlier ones.

Several processes: each rank records its own batches (its shard of the data; steps
counted as above, per rank) into its own ``<save_dir>/<stage>/rank<r>/``. Under a
spawning strategy (``strategy='ddp_spawn'``) the batches run in the spawned processes,
so the callback given to the trainer in the launching process keeps no record
(``last`` is None, ``history`` and its ``callback_metrics`` are empty); only the
summaries of rank 0 come back, in ``trainer.callback_metrics``, as Lightning sends them.
Read each rank's values from ``save_dir`` with :func:`bcrecord.load`.

Works with ``lightning`` (``lightning.pytorch``) and with ``pytorch_lightning``:
``pip install 'bcrecord[lightning]'``.

>>> import torch, lightning.pytorch as pl
>>> from bcrecord.integrations.lightning import RecorderCallback
>>> class Net(pl.LightningModule):
...     def __init__(self):
...         super().__init__()
...         self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
...     def training_step(self, batch, batch_idx):
...         hidden = self.net[0](batch)
...         return self.net[2](self.net[1](hidden)).pow(2).mean()
...     def configure_optimizers(self):
...         return torch.optim.SGD(self.parameters(), lr=0.1)
>>> callback = RecorderCallback(["net.0", ":training_step:hidden"], every_n_steps=2, log_to_logger=False)
>>> trainer = pl.Trainer(max_steps=4, callbacks=[callback], logger=False, enable_checkpointing=False,
...                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
>>> trainer.fit(Net(), torch.utils.data.DataLoader(torch.randn(16, 4), batch_size=4))
>>> [record.step for record in callback.history], callback.last.keys()
([0, 2], ['net.0:forward:return', ':training_step:hidden@0'])
>>> torch.equal(callback.last["net.0:forward:return"], callback.last[":training_step:hidden@0"])
True
>>> float(trainer.callback_metrics["bcrecord/fit/net.0:forward:return/max"]) > 0
True
"""

from __future__ import annotations

import collections.abc
import os
import re
import struct
import zlib
from collections import deque
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Deque, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

try:
    import torch
except ImportError as error:  # pragma: no cover - depends on the environment
    # (as when Lightning is missing: the extra installs both)
    raise ImportError(
        "bcrecord.integrations.lightning needs Lightning and PyTorch: pip install 'bcrecord[lightning]'"
    ) from error

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError as error:
        raise ImportError(
            "bcrecord.integrations.lightning needs Lightning and PyTorch: pip install 'bcrecord[lightning]'"
        ) from error

from ..errors import SpecError, TargetError, did_you_mean, warn
from ..specs import require_bool
from ..storage import StorageError, Writer
from ..torch import ModelRecording, record
from ..torch.record import PLAN_OPTIONS, RECORD_OPTIONS, Plan, check_options
from ..viz import as_dense

__all__ = ["RecorderCallback", "StepRecord", "STAGES", "summarize", "channel_mean_image", "png_bytes"]

#: The stages a :class:`RecorderCallback` can record, in Lightning's ``TrainerFn`` names.
STAGES: Tuple[str, ...] = ("fit", "validate", "test", "predict")
#: The stages a run of each kind may record (a fit validates too).
_RUNS: Dict[str, Tuple[str, ...]] = {"fit": ("fit", "validate")}
#: The LightningModule method that runs each stage's batches.
_STEP_METHODS: Dict[str, str] = {
    "fit": "training_step",
    "validate": "validation_step",
    "test": "test_step",
    "predict": "predict_step",
}


@dataclass
class StepRecord:
    """What one recorded batch produced.

    ``values`` maps each key to every value recorded during the batch, in order
    (a local inside a loop, or a module called twice, has several); ``record[key]``
    is the latest. ``targets`` maps each target string to its keys. ``complete`` is
    False for a batch that an exception interrupted.

    >>> r = StepRecord("fit", 3, 3, 0, 0, {"m:forward:x@0": [1, 2]}, {"m:forward:x": ["m:forward:x@0"]})
    >>> r["m:forward:x@0"], r.all("m:forward:x@0"), r.of("m:forward:x")
    (2, [1, 2], {'m:forward:x@0': [1, 2]})
    """

    #: ``'fit'``, ``'validate'``, ``'test'`` or ``'predict'``.
    stage: str
    #: ``trainer.global_step`` for training batches; the stage's batch count otherwise.
    step: int
    #: The ``batch_idx`` Lightning passed to the hooks.
    batch_idx: int
    #: ``trainer.current_epoch``.
    epoch: int
    #: The ``dataloader_idx`` (0 for training batches).
    dataloader_idx: int
    values: Dict[str, List[Any]]
    targets: Dict[str, List[str]]
    #: Scalar summaries of this batch, named as in ``trainer.callback_metrics``.
    metrics: Dict[str, float] = field(default_factory=dict)
    complete: bool = True

    def __getitem__(self, key: str) -> Any:
        try:
            return self.values[key][-1]
        except KeyError:
            raise KeyError(f"{key!r} was not recorded in this batch; keys: {list(self.values)}") from None

    def __contains__(self, key: object) -> bool:
        return key in self.values

    def __iter__(self) -> Iterator[str]:
        """The recorded keys, as :meth:`keys` lists them: ``list(record)``, ``sorted(record)``,
        ``dict(...)`` over them and ``for key in record`` work as for a dict of latest values.

        >>> r = StepRecord("fit", 0, 0, 0, 0, {"m:forward:y@0": [5], "m:forward:x@0": [1, 2]}, {})
        >>> list(r), sorted(r), len(r), {key: r[key] for key in r}
        (['m:forward:y@0', 'm:forward:x@0'], ['m:forward:x@0', 'm:forward:y@0'], 2, \
{'m:forward:y@0': 5, 'm:forward:x@0': 2})
        """
        return iter(list(self.values))  # a copy: a key recorded meanwhile does not break the loop

    def __len__(self) -> int:
        return len(self.values)

    def __bool__(self) -> bool:
        # A kept batch, also one that recorded nothing (an exception came first): ``if
        # callback.last:`` says whether a batch was kept, as it did before records had a length.
        return True

    def get(self, key: str, default: Any = None) -> Any:
        """The latest value of ``key``, or ``default`` where the batch recorded none.

        >>> r = StepRecord("fit", 0, 0, 0, 0, {"m:forward:x@0": [1, 2]}, {})
        >>> r.get("m:forward:x@0"), r.get("m:forward:z@0", "none")
        (2, 'none')
        """
        return self[key] if key in self.values else default

    def all(self, key: str) -> List[Any]:
        """Every value of ``key`` recorded during the batch, in order.

        >>> r = StepRecord("fit", 0, 0, 0, 0, {"m:forward:y@0": [5], "m:forward:x@0": [1, 2]},
        ...                {"m:forward:x": ["m:forward:x@0", "m:forward:x@1"]})
        >>> r.all("m:forward:x@0")
        [1, 2]
        """
        return list(self.values[key])

    def keys(self) -> List[str]:
        """Recorded keys, in the order each was first recorded.

        >>> r = StepRecord("fit", 0, 0, 0, 0, {"m:forward:y@0": [5], "m:forward:x@0": [1, 2]},
        ...                {"m:forward:x": ["m:forward:x@0", "m:forward:x@1"]})
        >>> r.keys()
        ['m:forward:y@0', 'm:forward:x@0']
        """
        return list(self.values)

    def of(self, target: str) -> Dict[str, List[Any]]:
        """``{key: values}`` for a target string as given to the callback (keys with none left out).

        >>> r = StepRecord("fit", 0, 0, 0, 0, {"m:forward:y@0": [5], "m:forward:x@0": [1, 2]},
        ...                {"m:forward:x": ["m:forward:x@0", "m:forward:x@1"]})
        >>> r.of("m:forward:x")
        {'m:forward:x@0': [1, 2]}
        """
        return {key: self.values[key] for key in self.targets[target] if key in self.values}


def summarize(value: Any) -> Dict[str, float]:
    """Scalar summaries of a recorded value: ``mean``/``std``/``min``/``max`` of a tensor.

    ``std`` is the population standard deviation (correction 0), so a one-element
    tensor gives 0, not NaN. A Python number gives ``{'value': number}``; anything
    else (tuples, empty tensors, complex tensors, meta tensors: ``to='meta'``) gives nothing.

    >>> summarize(torch.tensor([1.0, 3.0]))
    {'mean': 2.0, 'std': 1.0, 'min': 1.0, 'max': 3.0}
    >>> summarize(7), summarize((1, 2)), summarize(torch.ones(2, device="meta"))
    ({'value': 7.0}, {}, {})
    """
    if isinstance(value, torch.Tensor):
        if value.is_complex() or value.is_meta:  # (a meta tensor has no numbers: the fit failed)
            return {}
        data = as_dense(value.detach())  # sparse, quantized or nested: their values
        if data.numel() == 0:
            return {}
        # float64 for exact sums of large tensors; MPS has no float64.
        data = data.to(torch.float32 if value.device.type == "mps" else torch.float64)
        std = data.std(correction=0) if data.numel() > 1 else data.new_zeros(())
        return {
            "mean": float(data.mean()),
            "std": float(std),
            "min": float(data.min()),
            "max": float(data.max()),
        }
    if isinstance(value, (bool, int, float)):
        return {"value": float(value)}
    return {}


def channel_mean_image(value: Any) -> Optional[torch.Tensor]:
    """A ``(H, W)`` picture in ``[0, 1]`` of a 4-D ``(N, C, H, W)`` or 3-D tensor, else None.

    4-D: the first sample, averaged over channels. 3-D: averaged over the first
    dimension (``(C, H, W)`` gives the channel mean; ``(batch, tokens, features)``
    the batch mean, a tokens × features picture). Scaled so that its minimum is 0
    and its maximum 1 (all zeros when constant); non-finite values count as 0.

    >>> channel_mean_image(torch.arange(8.0).reshape(1, 2, 2, 2))
    tensor([[0.0000, 0.3333],
            [0.6667, 1.0000]])
    >>> channel_mean_image(torch.ones(3, 4)) is None
    True
    """
    if not isinstance(value, torch.Tensor) or value.is_nested or value.is_complex():
        return None
    if value.dim() not in (3, 4) or value.numel() == 0:
        return None
    data = as_dense(value.detach())
    data = data[0] if data.dim() == 4 else data
    image = torch.nan_to_num(data.to(torch.float32).mean(0), nan=0.0, posinf=0.0, neginf=0.0).cpu()
    low, high = image.min(), image.max()
    if float(high) > float(low):
        return (image - low) / (high - low)
    return torch.zeros_like(image)


def png_bytes(image: torch.Tensor) -> bytes:
    """An 8-bit grayscale PNG of a ``(H, W)`` tensor with values in ``[0, 1]``.

    >>> png_bytes(torch.zeros(2, 3))[:8]
    b'\\x89PNG\\r\\n\\x1a\\n'
    """
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"png_bytes needs a (H, W) tensor, got {type(image).__name__}")
    if image.dim() != 2 or not image.numel():  # (PNG has no empty image)
        raise ValueError(f"png_bytes needs a (H, W) tensor with pixels, got shape {tuple(image.shape)}")
    pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    height, width = pixels.shape
    raw = b"".join(b"\x00" + bytes(row.tolist()) for row in pixels)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _safe_name(key: str) -> str:
    """A file-name form of a key (``':'`` and other odd characters become ``'_'``)."""
    return re.sub(r"[^-\w.@]", "_", key) or "_"


#: A target written as MMEngine's RecorderHook keys it: ``'runner_model'`` is its name of the model.
_MMENGINE_ROOT = re.compile(r"^\s*runner_model\s*(?:$|\.(?P<path>[^:]*)|(?P<rest>:.*))")


def _lightning_form(target: str) -> Optional[str]:
    """The target for this callback of one written as an MMEngine key, else None.

    >>> _lightning_form("runner_model:forward:outputs@1"), _lightning_form("runner_model.backbone:forward:x")
    (':forward:outputs@1', 'backbone:forward:x')
    >>> _lightning_form("runner_model"), _lightning_form("backbone")
    (':forward:return', None)
    """
    keyed = _MMENGINE_ROOT.match(target) if isinstance(target, str) else None
    if keyed is None:
        return None
    rest = target[keyed.end() :]
    if keyed.group("path") is not None:
        return keyed.group("path").strip() + rest
    return keyed.group("rest") or ":forward:return"


@contextmanager
def _mmengine_keys_told(pl_module: Any, targets: Sequence[str]) -> Iterator[None]:
    """A missing ``'runner_model'`` submodule's error, told the form of the targets written as MMEngine
    keys: here the LightningModule itself is the root (unless it has a ``runner_model`` of its own)."""
    try:
        yield
    except TargetError as error:
        forms = {t: _lightning_form(t) for t in targets if _lightning_form(t) is not None}
        has_own = "runner_model" in getattr(pl_module, "_modules", {})  # (its error is of a path below)
        if not forms or has_own or "submodule 'runner_model" not in str(error):
            raise
        written = " and ".join(repr(form) for form in forms.values())
        raise TargetError(
            "the LightningModule has no submodule 'runner_model': 'runner_model:' is MMEngine's key form; "
            f"a RecorderCallback's targets start at the LightningModule itself: write {written}"
        ) from None


def _logger_kind(logger: Any) -> Optional[str]:
    """``'tensorboard'``, ``'csv'`` or None, for loggers of either Lightning package."""
    for module in ("lightning.pytorch.loggers", "pytorch_lightning.loggers"):
        try:
            loggers = __import__(module, fromlist=["TensorBoardLogger", "CSVLogger"])
        except ImportError:
            continue
        if isinstance(logger, loggers.TensorBoardLogger):
            return "tensorboard"
        if isinstance(logger, loggers.CSVLogger):
            return "csv"
    return None


#: The callback's own options, besides the targets (record()'s go to ``**record_options``).
_OWN_OPTIONS = ("every_n_steps", "stages", "save_dir", "log_to_logger", "log_images", "history", "prefix")


def _check_option_names(record_options: Dict[str, Any]) -> None:
    """Refuse an option that neither the callback nor :func:`bcrecord.torch.record` takes, with the
    callback's own among those a misspelt one may mean (``every_n_step``: ``every_n_steps``).

    >>> _check_option_names({"copy": "detach"})
    >>> _check_option_names({"every_n_step": 2})
    Traceback (most recent call last):
    TypeError: RecorderCallback: unknown option(s) every_n_step; accepted: copy, to, dtype, reduce, grad, \
keep, threads (record()'s) and every_n_steps, stages, save_dir, log_to_logger, log_images, history, prefix; \
did you mean 'every_n_steps'?
    """
    accepted = [name for name in RECORD_OPTIONS if name != "stop_after_last"]
    unknown = sorted(set(record_options) - set(RECORD_OPTIONS))
    if unknown:
        raise TypeError(
            f"RecorderCallback: unknown option(s) {', '.join(unknown)}; accepted: {', '.join(accepted)} "
            f"(record()'s) and {', '.join(_OWN_OPTIONS)}"
            + did_you_mean(unknown[0], accepted + list(_OWN_OPTIONS))
        )


def _strings(value: Any, name: str) -> List[str]:
    """``value``, a list (or other iterable) of strings, as a list; else a :class:`SpecError` naming ``name``.

    >>> _strings(("fit", "test"), "stages")
    ['fit', 'test']
    >>> _strings(["encoder.0", 5], "targets")
    Traceback (most recent call last):
    bcrecord.errors.SpecError: targets must be a string or a list of strings, got ['encoder.0', 5]
    """
    listed = isinstance(value, collections.abc.Iterable) and not isinstance(value, collections.abc.Mapping)
    items = list(value) if listed and not isinstance(value, bytes) else None
    if items is None or not all(isinstance(item, str) for item in items):
        raise SpecError(f"{name} must be a string or a list of strings, got {value!r}")
    return items


class _Stage:
    """One open stage: its record() context (patches) and its recording."""

    def __init__(self, stack: ExitStack, rec: ModelRecording) -> None:
        self.stack = stack
        self.rec = rec
        #: The batch being recorded: (step, batch_idx, epoch, dataloader_idx), or None.
        self.current: Optional[Tuple[int, int, int, int]] = None


class RecorderCallback(pl.Callback):  # type: ignore[misc]
    """A Lightning callback that records ``targets`` inside the LightningModule.

    Args:
        targets: target strings of :func:`bcrecord.torch.record`, relative to the
            LightningModule (``'encoder.0'``, ``'encoder.0:forward:x@1'``,
            ``':training_step:hidden'``, globs such as ``'blocks.*'``).
        every_n_steps: record every n-th step (see the module docstring).
        stages: which of ``'fit'``, ``'validate'``, ``'test'``, ``'predict'`` to record.
        save_dir: a directory to write records to (``<save_dir>/<stage>/``), or None.
        log_to_logger: log scalar summaries and pictures to the trainer's loggers.
        log_images: with ``log_to_logger``, also log channel-mean pictures.
        history: how many :class:`StepRecord` to keep in :attr:`history` (None: all).
        prefix: the first part of metric and image names.
        **record_options: passed to :func:`bcrecord.torch.record` (``copy``, ``to``,
            ``dtype``, ``reduce``, ``grad``, ``keep``).

    After (or during) a run: :attr:`last` is the latest :class:`StepRecord`,
    :attr:`history` the kept ones, :attr:`callback_metrics` the latest scalar
    summaries by name (also in ``trainer.callback_metrics``).
    """

    def __init__(
        self,
        targets: Union[str, Sequence[str]],
        every_n_steps: int = 1,
        stages: Iterable[str] = STAGES,
        save_dir: Union[str, os.PathLike, None] = None,
        log_to_logger: bool = True,
        *,
        log_images: bool = True,
        history: Optional[int] = 100,
        prefix: str = "bcrecord",
        **record_options: Any,
    ) -> None:
        super().__init__()
        # Each argument is checked here, naming itself (not a bare TypeError from list(5) or
        # 5 < 1), and targets' types too: the targets themselves only when a loop starts.
        self.targets: List[str] = [targets] if isinstance(targets, str) else _strings(targets, "targets")
        if not self.targets:
            raise SpecError("RecorderCallback needs at least one target")
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise SpecError(f"every_n_steps must be a positive int, got {every_n_steps!r}")
        stages = (stages,) if isinstance(stages, str) else tuple(_strings(stages, "stages"))
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            raise SpecError(f"unknown stage(s) {unknown}; choose from {list(STAGES)}")
        if not stages:
            raise SpecError(f"stages is empty: nothing would be recorded; choose from {list(STAGES)}")
        if record_options.get("stop_after_last"):
            raise SpecError("stop_after_last would end the module's forward early: not available here")
        _check_option_names(record_options)
        if history is not None and (isinstance(history, bool) or not isinstance(history, int) or history < 1):
            raise SpecError(f"history must be a positive int or None, got {history!r}")
        check_options(**record_options)  # now, not when a recorded loop starts
        if save_dir is not None and not isinstance(save_dir, (str, os.PathLike)):
            raise SpecError(f"save_dir must be a directory's path (a str or a Path), got {save_dir!r}")
        if save_dir is not None and not os.fspath(save_dir):  # Path("") would be the working directory
            raise SpecError("save_dir is an empty string (give '.' for the working directory)")
        require_bool("log_to_logger", log_to_logger)
        require_bool("log_images", log_images)
        if not isinstance(prefix, str):  # (the first part of every metric and image name)
            raise SpecError(f"prefix must be a str, got {prefix!r:.80}")
        self.every_n_steps = every_n_steps
        self.stages: Tuple[str, ...] = stages
        self.save_dir: Optional[Path] = None if save_dir is None else Path(save_dir)
        self.log_to_logger = log_to_logger
        self.log_images = log_images
        self.prefix = prefix
        self.record_options = record_options
        #: The latest recorded batch, of any stage.
        self.last: Optional[StepRecord] = None
        #: The recorded batches kept (the latest ``history`` of them), oldest first.
        self.history: Deque[StepRecord] = deque(maxlen=history)
        #: The latest scalar summary under each name (0-d float tensors).
        self.callback_metrics: Dict[str, torch.Tensor] = {}
        self._open: Dict[str, _Stage] = {}
        self._batches: Dict[str, int] = {stage: 0 for stage in STAGES}
        self._last_fit_step: Optional[int] = None
        self._writers: Dict[str, Writer] = {}
        self._warned: set = set()  # keys whose values were saved as their repr
        self._checked: set = set()  # stages whose first recorded batch was checked for unreached targets

    # --- public helpers --------------------------------------------------------

    def records(self, stage: Optional[str] = None) -> List[StepRecord]:
        """The kept records, of one stage or of all.

        >>> callback = RecorderCallback(["net.0"])
        >>> callback.history.append(StepRecord("validate", 0, 0, 0, 0, {}, {}))
        >>> [r.stage for r in callback.records()], callback.records("fit")
        (['validate'], [])
        """
        return [r for r in self.history if stage is None or r.stage == stage]

    @property
    def patched(self) -> bool:
        """Whether some stage currently has the module patched."""
        return bool(self._open)

    # --- opening and closing stages -------------------------------------------

    def _start(self, stage: str, trainer: Any, pl_module: Any) -> None:
        if stage not in self.stages or stage in self._open or getattr(trainer, "sanity_checking", False):
            return
        stack = ExitStack()
        try:
            # record() checks every target first: a bad one raises with nothing patched.
            with _mmengine_keys_told(pl_module, self.targets):
                rec = stack.enter_context(record(pl_module, self.targets, **self.record_options))
            rec.__exit__(None, None, None)  # patched, idle until a recorded batch
            # Its folder, where setup() could not open it (layers built later): now, so that
            # the stage's steps count on from those saved there before a batch is numbered.
            self._open_folders(stage)
        except BaseException:
            stack.close()
            raise
        self._open[stage] = _Stage(stack, rec)
        if stage == "fit":  # a new fit (or a resumed one) starts its own steps, this callback reused or not
            self._last_fit_step = None
            self._warn_of_steps_saved_again(int(trainer.global_step))

    def _warn_of_steps_saved_again(self, start: int) -> None:
        """Training steps are ``global_step``: a fit resumed from a checkpoint older than the last
        saved step (or a fresh fit) saves those steps again, next to the earlier run's values; say
        so, naming them, since nothing in the folder tells them apart."""
        writer = self._writers.get("fit")
        if writer is None:
            return
        again = writer.steps_from(start)
        if not again:
            return
        # (Those saved: every n-th step only, where every_n_steps is more than 1.)
        steps = f"step {again[0]}" if len(again) == 1 else f"steps {again[0]}..{again[-1]}"
        run = f"resumed at step {start}" if start else "starting at step 0"
        warn(
            f"RecorderCallback: {writer.directory} already holds training {steps} of an earlier run; "
            f"this fit ({run}) saves those steps again: bcrecord.load returns both values of each, in "
            "the order saved (this fit's last); give each run its own save_dir to keep them apart"
        )

    def _end(self, stage: str, interrupted: bool = False) -> None:
        state = self._open.pop(stage, None)
        if state is None:
            return
        try:
            if state.rec.active:
                state.rec.__exit__(None, None, None)
                if state.current is not None and interrupted:
                    self._keep(stage, state, complete=False)
        finally:
            state.stack.close()

    def _end_all(self, interrupted: bool = False) -> None:
        errors = []
        for stage in list(self._open):
            try:
                self._end(stage, interrupted)
            except Exception as error:  # close every stage even if one fails
                errors.append(error)
        if errors:
            raise errors[0]

    # --- recording batches -------------------------------------------------------

    def _batch_start(self, stage: str, trainer: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        state = self._open.get(stage)
        if state is None:
            return
        self._drop_unfinished(stage)
        if stage == "fit":
            step = int(trainer.global_step)
            wanted = step % self.every_n_steps == 0 and step != self._last_fit_step
            if wanted:
                self._last_fit_step = step
        else:
            step = self._batches[stage]
            self._batches[stage] += 1
            wanted = step % self.every_n_steps == 0
        if not wanted:
            return
        state.rec.clear()
        state.current = (step, batch_idx, int(trainer.current_epoch), dataloader_idx)
        state.rec.__enter__()

    def _drop_unfinished(self, stage: str) -> None:
        """Leave, keeping nothing, a recording whose batch never ran: Lightning skips the rest of an
        epoch where ``on_train_batch_start`` returns -1, after this callback's hook entered it. Its
        step is then still to record, by the next batch (of the next epoch, at the same global_step)."""
        state = self._open.get(stage)
        if state is None or not state.rec.active:
            return
        state.rec.__exit__(None, None, None)
        state.rec.clear()
        state.current = None
        if stage == "fit":
            self._last_fit_step = None

    def _batch_end(self, stage: str, trainer: Any) -> None:
        state = self._open.get(stage)
        if state is None or not state.rec.active:
            return
        state.rec.__exit__(None, None, None)
        record_ = self._keep(stage, state, complete=True)
        if record_ is None:
            return
        self._publish(trainer, record_)

    def _keep(self, stage: str, state: _Stage, complete: bool) -> Optional[StepRecord]:
        if state.current is None:
            return None
        step, batch_idx, epoch, dataloader_idx = state.current
        state.current = None
        rec = state.rec
        values = {key: rec.all(key) for key in rec.keys()}
        record_ = StepRecord(
            stage,
            step,
            batch_idx,
            epoch,
            dataloader_idx,
            values,
            {t: list(k) for t, k in rec.targets.items()},
            complete=complete,
        )
        for key, found in values.items():
            if found:
                for stat, number in summarize(found[-1]).items():
                    record_.metrics[self._metric_name(stage, key, stat)] = number
        if complete and stage not in self._checked:
            self._checked.add(stage)
            self._warn_of_unreached_targets(stage, record_)
        self.last = record_
        self.history.append(record_)
        if self.save_dir is not None and values:
            self._writer(stage).write(values, step=step, unsavable=self._unsavable)
        rec.clear()  # the values live on in the StepRecord only
        return record_

    def _warn_of_unreached_targets(self, stage: str, record_: StepRecord) -> None:
        """Say which targets the first recorded batch of ``stage`` did not reach: a method its step
        never calls (a ``forward`` that ``training_step`` bypasses) records nothing, silently else."""
        step = _STEP_METHODS[stage]
        # A target in another stage's step method (':validation_step:loss' in a training batch) is
        # never reached in this stage's batches, by design: naming it would be noise.
        others = tuple(f":{method}:" for method in _STEP_METHODS.values() if method != step)
        unreached = [
            target
            for target, keys in record_.targets.items()
            if not any(k in record_ for k in keys) and not (keys and all(k.startswith(others) for k in keys))
        ]
        if not unreached:
            return
        warn(
            f"RecorderCallback: the first recorded {stage} batch did not reach "
            f"{', '.join(map(repr, unreached))}: a method {step} does not call (a forward it bypasses, "
            f"calling the layers itself), or a branch not taken; those targets are recorded only in "
            f"batches that reach them (stages= chooses the stages to record; stages now: {list(self.stages)})"
        )

    def _metric_name(self, stage: str, key: str, stat: str) -> str:
        name = f"{self.prefix}/{stage}/{key}"
        return name if stat == "value" else f"{name}/{stat}"

    def _unsavable(self, key: str, step: int, why: str) -> None:
        """A value saved as its repr (a local lambda): warn once per key, and train on."""
        if key not in self._warned:
            self._warned.add(key)
            warn(f"RecorderCallback: cannot save {key!r} (step {step}): {why}; saved its repr")

    def _writer(self, stage: str) -> Writer:
        writer = self._writers.get(stage)
        if writer is None:
            assert self.save_dir is not None
            directory = self.save_dir / stage
            if self._world_size > 1:
                directory = directory / f"rank{self._rank}"
            writer = self._writers[stage] = Writer(directory)
            if stage != "fit":  # (training batches are numbered by global_step, resumed or not)
                # A later run into the same save_dir (another process: a resumed fit, a second
                # test) counts on from the batches saved there, as steps must not repeat.
                saved = writer.last_step
                if saved is not None:
                    self._batches[stage] = max(self._batches[stage], saved + 1)
        return writer

    def _publish(self, trainer: Any, record_: StepRecord) -> None:
        """Scalars into callback_metrics (here and on the trainer) and the loggers."""
        tensors = {name: torch.tensor(number) for name, number in record_.metrics.items()}
        self.callback_metrics.update(tensors)
        trainer_metrics = getattr(trainer, "callback_metrics", None)
        if isinstance(trainer_metrics, dict):
            trainer_metrics.update(tensors)
        if not self.log_to_logger or not record_.metrics:
            return
        for logger in getattr(trainer, "loggers", None) or []:
            logger.log_metrics(dict(record_.metrics), step=record_.step)
            if self.log_images and getattr(trainer, "is_global_zero", True):
                self._log_images(logger, record_)

    def _log_images(self, logger: Any, record_: StepRecord) -> None:
        kind = _logger_kind(logger)
        if kind is None:
            return
        for key, found in record_.values.items():
            image = channel_mean_image(found[-1]) if found else None
            if image is None:
                continue
            tag = f"{self.prefix}/{record_.stage}/{key}"
            if kind == "tensorboard":
                logger.experiment.add_image(
                    tag, image.unsqueeze(0), global_step=record_.step, dataformats="CHW"
                )
            else:
                folder = Path(logger.log_dir) / "bcrecord_images" / record_.stage / _safe_name(key)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"step_{record_.step:06d}.png").write_bytes(png_bytes(image))

    # --- Lightning hooks -----------------------------------------------------------

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Remember the process's rank (records of several processes go to separate folders);
        open the records folders of the stages this run records (a bad ``save_dir`` stops it now)."""
        self._world_size = int(getattr(trainer, "world_size", 1) or 1)
        self._rank = int(getattr(trainer, "global_rank", 0) or 0)
        stage = str(getattr(stage, "value", stage))  # Lightning passes its TrainerFn enum
        if any(s in self.stages for s in _RUNS.get(stage, (stage,))):
            # The targets, checked now: before a sanity check runs batches, or folders are made.
            # A module that builds layers in its own setup() or configure_model() (they run
            # after this) has them checked again once it has: at on_fit_start, or the stage's start.
            try:
                self._check_targets(pl_module)
            except TargetError:
                self._check_again = stage  # (its folders then too: none for targets that stay missing)
                return
        self._open_folders(stage)

    def _open_folders(self, stage: str) -> None:
        """Make the records folders of the stages ``stage`` records (a bad ``save_dir`` stops it now)."""
        if self.save_dir is None:
            return
        for recorded in [s for s in _RUNS.get(stage, (stage,)) if s in self.stages]:
            try:
                self._writer(recorded)
            except StorageError as error:
                raise StorageError(f"RecorderCallback(save_dir={str(self.save_dir)!r}): {error}") from None

    _world_size = 1
    _rank = 0
    #: The stage whose targets setup() could not find (built later, by the module's own setup).
    _check_again: Optional[str] = None

    def _check_targets(self, pl_module: Any) -> None:
        planned = {k: v for k, v in self.record_options.items() if k in PLAN_OPTIONS}
        with _mmengine_keys_told(pl_module, self.targets):
            Plan(pl_module, self.targets, **planned)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Check the targets that setup() could not, before the sanity check runs batches."""
        stage, self._check_again = self._check_again, None
        if stage is not None:
            self._check_targets(pl_module)
            self._open_folders(stage)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Remove every patch still in place."""
        self._end_all()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Remove every patch; an interrupted batch is kept with ``complete=False``."""
        self._end_all(interrupted=True)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Patch for the training batches."""
        self._start("fit", trainer, pl_module)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        """Stop a recording whose batch Lightning skipped (``on_train_batch_start`` returned -1)."""
        self._drop_unfinished("fit")

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Remove the training patches."""
        self._end("fit")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Patch for the validation batches (not during the sanity check)."""
        self._start("validate", trainer, pl_module)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """Remove the validation patches."""
        self._end("validate")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        """Patch for the test batches."""
        self._start("test", trainer, pl_module)

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        """Remove the test patches."""
        self._end("test")

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        """Patch for the prediction batches."""
        self._start("predict", trainer, pl_module)

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        """Remove the prediction patches."""
        self._end("predict")

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        """Start recording if this step is recorded."""
        self._batch_start("fit", trainer, batch_idx)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Stop recording; keep, publish and save the batch's values."""
        self._batch_end("fit", trainer)

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Start recording if this batch is recorded."""
        self._batch_start("validate", trainer, batch_idx, dataloader_idx)

    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Stop recording; keep, publish and save the batch's values."""
        self._batch_end("validate", trainer)

    def on_test_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Start recording if this batch is recorded."""
        self._batch_start("test", trainer, batch_idx, dataloader_idx)

    def on_test_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Stop recording; keep, publish and save the batch's values."""
        self._batch_end("test", trainer)

    def on_predict_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Start recording if this batch is recorded."""
        self._batch_start("predict", trainer, batch_idx, dataloader_idx)

    def on_predict_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Stop recording; keep, publish and save the batch's values."""
        self._batch_end("predict", trainer)

    def __iter__(self) -> Iterator[StepRecord]:
        return iter(list(self.history))

    def __repr__(self) -> str:
        state = f"patched for {sorted(self._open)}" if self._open else "idle"
        return (
            f"<RecorderCallback {len(self.targets)} target(s), every {self.every_n_steps} step(s), "
            f"stages {list(self.stages)}, {state}, {len(self.history)} record(s)>"
        )
