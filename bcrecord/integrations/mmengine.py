"""MMEngine hooks: record any local or attribute inside ``runner.model`` into the MessageHub.

Importing this module registers two hooks in MMEngine's ``HOOKS`` registry, so a
config needs only::

    custom_imports = dict(imports=['bcrecord.integrations.mmengine'])
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
    ]

* :class:`RecorderHook` patches the chosen methods of ``runner.model`` (or of the
  submodule at a dotted ``model`` path; distributed wrappers are looked through)
  *per instance* with :func:`bcrecord.patch_method`, records every iteration of
  the chosen loops, and publishes the latest value of each key with
  ``runner.message_hub.update_info(key, value)`` under the keys of the original
  MMEngine proposal: ``'runner_model:forward:outputs@1'``,
  ``'runner_model:forward:self.linear1.weight'``, ``'resnet:_forward_impl:x@0'``.
  With ``save_dir`` the values are also written with :class:`bcrecord.storage.Writer`
  (read them back with :func:`bcrecord.load`); with ``visualize`` 3-D and 4-D
  tensors are drawn with ``Visualizer.draw_featmap`` and sent to the vis backends.
* :class:`RecorderVisualizationHook` draws feature maps found in the MessageHub
  (published by ``RecorderHook`` or by anything else).

Unlike the original proposal, which re-parsed the method's source with ``ast``,
nothing here needs source: methods built by ``exec``, sourceless ``.pyc`` files,
tuple and attribute assignment targets and zero-argument ``super()`` all work,
and a local assigned in a loop is recorded where the assignment runs (the hook
keeps each key's last value of an iteration).

See ``docs/mmengine.md`` for the whole guide.
"""

from __future__ import annotations

import collections.abc
import difflib
import dis
import fnmatch
import functools
import inspect
import numbers
import operator
import os
import re
import types
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

try:
    import torch
    from mmengine.dist import get_dist_info
    from mmengine.hooks import Hook
    from mmengine.model import is_model_wrapper
    from mmengine.registry import HOOKS
    from mmengine.structures import BaseDataElement
    from mmengine.visualization import Visualizer
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "bcrecord.integrations.mmengine needs MMEngine and PyTorch: pip install 'bcrecord[mmengine]'"
    ) from error

import bcrecord.torch  # noqa: F401  (registers detached tensor copies for recordings)

from .._versions import code_qualname
from ..errors import BcrecordError, SpecError, did_you_mean
from ..listing import decompiled, side_by_side
from ..patch import Patch, patch_method
from ..runtime import Recording, copy_value, raised_by_signal_handler, recording, register_copy
from ..specs import COPY_POLICIES, Attribute, Spec, parse, require_bool
from ..storage import Writer
from ..torch.copies import _map
from ..torch.targets import named_modules, unwrap


def _copied_element(element: BaseDataElement, policy: str = "clone") -> BaseDataElement:
    """A data element (an OpenMMLab data sample) as recordings keep it under ``copy=policy``.

    Its fields and metainfo are copied as recordings copy values (tensors become detached
    clones, nested elements copies of their own). ``BaseDataElement.clone()`` copies the
    element alone: its tensors and nested elements stay shared, and what the model changes
    in them later would show in the recorded value.

    >>> import torch
    >>> from mmengine.structures import InstanceData
    >>> sample = BaseDataElement(gt=InstanceData(labels=torch.tensor([0])))
    >>> kept = copy_value(sample, "clone")
    >>> _ = sample.gt.labels.add_(100)
    >>> kept.gt.labels
    tensor([0])
    """
    copied = type(element)()
    copied.set_metainfo(copy_value(dict(element.metainfo_items()), policy))
    copied.set_data({key: copy_value(value, policy) for key, value in element.items()})
    return copied


register_copy(BaseDataElement, "clone", _copied_element)
# (deepcopy refuses tensors in the autograd graph: each field as a recording's deepcopy copies it)
register_copy(BaseDataElement, "deepcopy", functools.partial(_copied_element, policy="deepcopy"))

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    from mmengine.runner import Runner

__all__ = [
    "RecorderHook",
    "RecorderVisualizationHook",
    "RecorderConfig",
    "RecorderConfigError",
    "FeatureMapDrawer",
    "parse_recorders",
    "resolve_model",
    "image_name",
    "ROOT_OWNER",
]

DataBatch = Optional[Union[dict, tuple, list]]
#: The loops a hook can record in.
LOOPS = ("train", "val", "test")
#: The model method each loop runs its iterations through.
_LOOP_STEPS = {"train": "train_step", "val": "val_step", "test": "test_step"}
#: The owner part of keys for recorders without ``model``: the proposal's name.
ROOT_OWNER = "runner_model"
_KINDS = ("FunctionRecorder", "AttributeRecorder")
#: A submodule's path: names without a dot or a colon (the key's separator), as a ModuleDict's
#: ('heads.cls-head'); a name that is no submodule is refused once the model is at hand.
_PATH = re.compile(r"^[^.:]+(\.[^.:]+)*$")
_MARK = "__bcrecord_recorder_hook__"


class RecorderConfigError(BcrecordError, ValueError):
    """A ``RecorderHook`` config that cannot work; raised at ``before_run``.

    The message names the recorder (its position in ``recorders`` and its dict)
    and the problem: an unknown type, a missing target, a local the method does
    not have (and the ones it has), a ``model`` path that does not resolve.
    """


# --- recorder configs ---------------------------------------------------------


@dataclass(frozen=True)
class RecorderConfig:
    """One checked recorder dict: which method of which object, and what to record.

    >>> [rc] = parse_recorders([dict(type='FunctionRecorder', target='outputs', index=[1])])
    >>> rc.model, rc.method, rc.owner, rc.spec
    ('', 'forward', 'runner_model', Local(name='outputs', index=(1,), copy=None))
    """

    #: Position in the hook's ``recorders`` list (used in error messages).
    position: int
    #: The dict as written in the config.
    config: Mapping[str, Any]
    #: Dotted path under ``runner.model``; ``''`` is the model itself.
    model: str
    method: str
    #: The owner part of keys: ``name`` if given, else ``model``, else ``'runner_model'``.
    owner: str
    spec: Spec

    @property
    def where(self) -> str:
        """``recorders[i] dict(...)``, for messages."""
        return f"recorders[{self.position}] {_show(self.config)}"


def _show(config: Any) -> str:
    if isinstance(config, Mapping):
        return "dict(" + ", ".join(f"{k}={v!r}" for k, v in config.items()) + ")"
    return repr(config)


def _fail(where: str, message: str) -> RecorderConfigError:
    return RecorderConfigError(f"RecorderHook: {where}: {message}")


def _in_dict_form(error: BaseException) -> str:
    """How a recorder dict writes the short forms an error from the core names (``'x@0'``), a
    form a recorder's ``target`` does not take; '' where it names none.

    >>> _in_dict_form(ValueError("it has one value, at entry: 'mode' (or 'mode@0')"))
    " (in a recorder dict, 'mode@0' is target='mode', index=[0])"
    """
    found = re.search(r"'([^'@\s]+)@(\d+|\[[\d, ]*\])'", str(error))
    if found is None:
        return ""
    target, index = found.groups()
    listed = index if index.startswith("[") else f"[{index}]"
    return f" (in a recorder dict, {found.group(0)} is target={target!r}, index={listed})"


def parse_recorders(recorders: Any) -> List[RecorderConfig]:
    """Check the ``recorders`` of a ``RecorderHook`` config; raise naming the bad one.

    Each recorder is ``dict(type='FunctionRecorder' | 'AttributeRecorder',
    target=..., index=..., model=..., method=..., name=..., copy=..., at=...)``.

    >>> parse_recorders([dict(type='FunctionRecorder', model='resnet', method='_forward_impl',
    ...                       target='x', index=[0, 1, 2])])[0].owner
    'resnet'
    >>> parse_recorders([dict(type='LayerRecorder', target='x')])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    bcrecord...RecorderConfigError: RecorderHook: recorders[0] dict(type='LayerRecorder', target='x'): \
unknown recorder type 'LayerRecorder'; use type='FunctionRecorder' ...
    """
    if isinstance(recorders, Mapping):
        recorders = [recorders]
    if not isinstance(recorders, (list, tuple)) or not recorders:
        raise RecorderConfigError(
            "RecorderHook: 'recorders' must be a non-empty list of recorder dicts, e.g. "
            f"[dict(type='FunctionRecorder', target='outputs', index=[1])], got {recorders!r}"
            + _as_recorder(recorders)
        )
    parsed = []
    for position, config in enumerate(recorders):
        where = f"recorders[{position}] {_show(config)}"
        if not isinstance(config, Mapping):
            raise _fail(
                where,
                "a recorder must be a dict like dict(type='FunctionRecorder', target='x')"
                + _as_recorder(config),
            )
        kind = config.get("type")
        if kind not in _KINDS:
            close = difflib.get_close_matches(str(kind), _KINDS, n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _fail(
                where,
                f"unknown recorder type {kind!r}{hint}; use type='FunctionRecorder' (a local, an "
                "attribute load site, a call 'self.fc()', an operator '+' or 'return') or "
                "type='AttributeRecorder' (an attribute chain read when the method starts)",
            )
        target = config.get("target")
        if target is None or (isinstance(target, str) and not target.strip()):
            example = "target='outputs'" if kind == "FunctionRecorder" else "target='self.linear1.weight'"
            raise _fail(where, f"{kind} needs a 'target' naming what to record, e.g. {example}")
        if isinstance(target, str) and target.count(":") == 2:
            raise _fail(where, _key_as_target(target))
        model = config.get("model")
        model = "" if model is None else model  # (not `or ""`: model=0 was taken for the root)
        if not isinstance(model, str) or (model and not _PATH.match(model)):
            raise _fail(
                where,
                f"'model' must be a dotted path under runner.model like 'backbone.layer1', got {model!r}",
            )
        method = config.get("method", "forward")
        if not isinstance(method, str) or not method.isidentifier():
            raise _fail(where, f"'method' must be a method name like 'forward', got {method!r}")
        name = config.get("name")
        if name is not None and not isinstance(name, str):  # (name=0 was taken for no name)
            raise _fail(where, f"'name' must be a string, got {name!r}")
        owner = name or model or ROOT_OWNER
        try:
            spec = parse(config)
        except BcrecordError as error:
            raise _fail(where, str(error)) from error
        parsed.append(RecorderConfig(position, config, model, method, owner, spec))
    return parsed


def _key_as_target(key: str) -> str:
    """What to write instead of a MessageHub key given as a ``target``: the recorder that makes it
    (of the type that publishes the key, whichever type the key was given in).

    >>> _key_as_target('resnet:_forward_impl:x@1')
    "target='resnet:_forward_impl:x@1' is a key, '<owner>:<method>:<target>'; the recorder that \
publishes it is dict(type='FunctionRecorder', model='resnet', method='_forward_impl', target='x', index=[1])"
    """
    return (
        f"target={key!r} is a key, '<owner>:<method>:<target>'; the recorder that publishes it is "
        + _recorder_of_key(key)
    )


def _recorder_of_key(key: str) -> str:
    """The recorder dict, as written in a config, that publishes the key ``'<owner>:<method>:<target>'``."""
    owner, method, rest = key.split(":")
    target, at, index = rest.rpartition("@")  # (the last '@': '@' and '@=' are operators too)
    if not target:
        target, index = rest, ""
    # A chain's key without an index is an AttributeRecorder's ('runner_model:forward:self.linear1.weight').
    kind = "AttributeRecorder" if "." in rest and "@" not in rest and "(" not in rest else "FunctionRecorder"
    parts = [f"type={kind!r}"]
    if owner and owner != ROOT_OWNER:
        parts.append(f"model={owner!r}")
    if method and method != "forward":
        parts.append(f"method={method!r}")
    parts.append(f"target={target!r}")
    if index.isdigit() and index.isascii():  # ('²' is a digit to isdigit, and no number to int)
        parts.append(f"index=[{int(index)}]")
    return f"dict({', '.join(parts)})"


def _as_recorder(value: Any) -> str:
    """For a key given where a recorder dict goes (``recorders=['runner_model:forward:outputs@1']``,
    the keys the hook publishes): the recorder that publishes it, to end a message with; else ''.

    >>> _as_recorder('resnet:_forward_impl:x@0')
    "; 'resnet:_forward_impl:x@0' is a key, '<owner>:<method>:<target>': the recorder that \
publishes it is dict(type='FunctionRecorder', model='resnet', method='_forward_impl', target='x', index=[0])"
    >>> _as_recorder('runner_model:forward:self.linear1.weight')[-76:]
    "publishes it is dict(type='AttributeRecorder', target='self.linear1.weight')"
    >>> _as_recorder(3)
    ''
    """
    if not isinstance(value, str) or value.count(":") != 2:
        return ""
    return (
        f"; {value!r} is a key, '<owner>:<method>:<target>': the recorder that publishes it is "
        + _recorder_of_key(value)
    )


_MISSING = object()


def _unwrap(model: Any) -> Any:
    """``model`` without distributed wrappers (MMEngine's, DataParallel, DDP)."""
    while True:
        inner = unwrap(model) if isinstance(model, torch.nn.Module) else model
        if inner is model and isinstance(model, torch.nn.Module) and is_model_wrapper(model):
            inner = getattr(model, "module", model)
        if inner is model:
            return model
        model = inner


def _where_it_runs(model: Any, inner: Any, method: str) -> Any:
    """Whose step ``method`` runs when the runner calls ``runner.model.<method>``: a wrapper's
    own (``MMDistributedDataParallel.train_step`` runs the inner model's steps itself, never
    its ``train_step``), unless it hands the call on (``self.module.val_step(data)``):
    ``inner``'s, as is every other method (``forward``)."""
    if model is inner or method not in ("train_step", "val_step", "test_step"):
        return inner  # (a wrapper's forward hands on in its own way: FSDP's self._fsdp_wrapped_module)
    own = getattr(type(model), method, None)
    if not isinstance(own, types.FunctionType) or own is getattr(type(inner), method, None):
        return inner
    return inner if method in own.__code__.co_names else model


def resolve_model(model: Any, path: str) -> Any:
    """The object at dotted ``path`` under ``model``; wrappers resolve through ``.module``.

    ``''`` is the (unwrapped) model itself. A path that does not resolve raises
    :class:`RecorderConfigError` naming the missing part and close submodule names.

    >>> net = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.ReLU())
    >>> resolve_model(torch.nn.DataParallel(net), '1') is net[1]
    True
    >>> resolve_model(net, '2')
    Traceback (most recent call last):
    ...
    bcrecord.integrations.mmengine.RecorderConfigError: model='2' does not resolve under runner.model \
(Sequential): Sequential has no attribute '2'; submodules include '0', '1'
    """
    if not isinstance(path, str):
        raise TypeError(
            f"model= takes a dotted path of a submodule ('' for the model itself), got {path!r:.80}"
        )
    inner = _unwrap(model)
    if not path:
        return inner
    first_error = ""
    for root in (inner, model) if inner is not model else (inner,):
        obj = root
        for part in path.split("."):
            # A submodule may be wrapped too (MMSeparateDistributedDataParallel wraps each
            # child in its own DDP): look through it, or at it ('generator.module').
            found = _MISSING
            for holder in (_unwrap(obj), obj):
                found = getattr(holder, part, _MISSING)
                if found is not _MISSING:
                    break
            if found is _MISSING:
                if not first_error:
                    # (the module the path names, not torch.compile's OptimizedModule around it)
                    first_error = f"{type(_unwrap(obj)).__name__} has no attribute {part!r}"
                break
            obj = found
        else:
            return _unwrap(obj)
    # (a submodule compiled in its place at its own path, as targets name it: not '_orig_mod')
    names = [name for name, _ in named_modules(inner) if name] if isinstance(inner, torch.nn.Module) else []
    close = difflib.get_close_matches(path, names, n=3)
    if close:
        hint = f"; did you mean {', '.join(map(repr, close))}?"
    elif names:
        hint = f"; submodules include {', '.join(map(repr, names[:8]))}"
    else:
        hint = ""
    raise RecorderConfigError(
        f"model={path!r} does not resolve under runner.model ({type(inner).__name__}): {first_error}{hint}"
    )


# --- feature maps -------------------------------------------------------------


def image_name(key: str, mode: str = "train") -> str:
    """The image name a recorded key is drawn under: safe as a file name on any system.

    Another character than a letter, a digit or one of ``_.@()+=-`` is written ``%XX``
    (its UTF-8 bytes), so that no two keys share a name (the operator sites ``'*@0'`` and
    ``'/@0'`` were both ``'_@0'``).

    >>> image_name('resnet:_forward_impl:x@0'), image_name('b:forward:*@0', 'val')
    ('train_resnet._forward_impl.x@0', 'val_b.forward.%2A@0')
    """
    for name, value in (("key", key), ("mode", mode)):
        if not isinstance(value, str):
            raise TypeError(f"image_name takes {name} as a str, got {value!r:.80}")
    return f"{mode}_" + re.sub(r"[^0-9A-Za-z_.@()+=-]", _escaped, key.replace(":", "."))


def _escaped(match: re.Match) -> str:
    return "".join(f"%{byte:02X}" for byte in match.group().encode("utf-8"))


class FeatureMapDrawer:
    """Draws recorded 3-D ``(C, H, W)`` and 4-D ``(N, C, H, W)`` tensors as images.

    The drawing is MMEngine's ``Visualizer.draw_featmap``; ``channel_reduction``,
    ``topk``, ``arrangement``, ``resize_shape`` and ``alpha`` are passed to it
    unchanged (``alpha`` blends the map over an image, and none is given: it changes
    nothing); a bad one raises :class:`SpecError` as the drawer is built. A 4-D
    tensor is drawn for its sample ``sample_index`` (a negative one counts from the end;
    past either end of a smaller batch, its last or first sample is drawn). ``keys``
    selects what is drawn (exact keys or ``fnmatch`` patterns such as
    ``'resnet:*'``; None: every 3-D or 4-D tensor); other values are skipped.

    >>> drawer = FeatureMapDrawer(keys=['resnet:*'])
    >>> image = drawer.image(torch.rand(2, 8, 6, 6))
    >>> image.shape, image.dtype.name, drawer.image(torch.rand(2, 3)) is None
    ((6, 6, 3), 'uint8', True)
    """

    def __init__(
        self,
        keys: Optional[Sequence[str]] = None,
        interval: int = 1,
        channel_reduction: Optional[str] = "squeeze_mean",
        topk: int = 20,
        arrangement: Tuple[int, int] = (4, 5),
        resize_shape: Optional[Tuple[int, int]] = None,
        alpha: float = 0.5,
        sample_index: int = 0,
    ) -> None:
        if isinstance(keys, str):
            keys = [keys]
        listed = isinstance(keys, collections.abc.Iterable) and not isinstance(keys, collections.abc.Mapping)
        if keys is not None and (not listed or not keys or not all(isinstance(k, str) for k in keys)):
            raise SpecError(f"keys must be a non-empty list of keys or patterns (or None), got {keys!r}")
        if channel_reduction not in (None, "squeeze_mean", "select_max"):
            raise SpecError(
                f"channel_reduction must be 'squeeze_mean', 'select_max' or None, got {channel_reduction!r}"
            )
        if not isinstance(topk, int) or isinstance(topk, bool):
            raise SpecError(f"topk must be an int, got {topk!r}")
        # Checked here, not left to draw_featmap: a failed drawing is logged and skipped.
        rows, cols = _pair(arrangement, "arrangement must be a pair of positive ints (rows, columns)")
        if channel_reduction is None and topk > 0 and rows * cols < topk:
            raise SpecError(f"arrangement {(rows, cols)} has fewer than topk={topk} cells")
        shape = "resize_shape must be None or a pair of positive ints (height, width)"
        resize = None if resize_shape is None else _pair(resize_shape, shape)
        # (a NumPy float too: numpy.float32 is no float, and the drawer took it before)
        real: Any = alpha  # (typeshed's float is no numbers.Real)
        if not isinstance(real, numbers.Real) or isinstance(real, bool) or not 0 <= float(real) <= 1:
            raise SpecError(f"alpha must be a number from 0 to 1, got {alpha!r}")
        if _integer(sample_index) is None:
            raise SpecError(f"sample_index must be an int, got {sample_index!r}")
        self.keys = None if keys is None else list(keys)
        self.interval = _positive(interval, "interval")
        self.channel_reduction = channel_reduction
        self.topk = topk
        self.arrangement = (rows, cols)
        self.resize_shape = resize
        self.alpha = alpha
        self.sample_index = int(sample_index)
        self.failed: set = set()

    def wants(self, key: str) -> bool:
        """Whether ``key`` is selected by ``keys``.

        >>> drawer = FeatureMapDrawer(keys=['resnet:*', 'head:forward:x@0'])
        >>> drawer.wants('resnet:_forward_impl:x@0'), drawer.wants('head:forward:x@1')
        (True, False)
        """
        return self.keys is None or any(key == k or fnmatch.fnmatchcase(key, k) for k in self.keys)

    def featmap(self, value: Any) -> Optional[torch.Tensor]:
        """The ``(C, H, W)`` float tensor to draw for ``value``, or None if it is not one.

        >>> drawer = FeatureMapDrawer(sample_index=1)
        >>> drawer.featmap(torch.zeros(2, 8, 4, 4, dtype=torch.float16)).shape, drawer.featmap(torch.ones(3))
        (torch.Size([8, 4, 4]), None)

        A sample index past either end of the batch gives its last or first sample:

        >>> batch = torch.arange(2.0).reshape(2, 1, 1, 1)  # samples 0 and 1
        >>> [FeatureMapDrawer(sample_index=i).featmap(batch).item() for i in (5, -1, -5)]
        [1.0, 1.0, 0.0]

        A complex map gives its magnitude:

        >>> drawer.featmap(torch.full((1, 1, 1), 3 + 4j)).tolist()
        [[[5.0]]]
        """
        if not isinstance(value, torch.Tensor) or value.ndim not in (3, 4) or value.numel() == 0:
            return None
        if value.ndim == 4:
            # (clamped at both ends: an index below -N failed the drawing, one above N-1 did not)
            value = value[max(-value.shape[0], min(self.sample_index, value.shape[0] - 1))]
        if self.channel_reduction is None and self.topk <= 0 and value.shape[0] not in (1, 3):
            return None
        value = value.detach()
        if value.is_complex():  # by magnitude, as bcrecord view draws it (a cast keeps the real part)
            value = value.abs()
        return value.to("cpu", torch.float32)

    def image(self, value: Any) -> Optional[np.ndarray]:
        """The RGB image ``draw_featmap`` makes of ``value``, or None when it is no feature map.

        >>> FeatureMapDrawer().image(torch.rand(4, 5, 7)).shape
        (5, 7, 3)
        """
        featmap = self.featmap(value)
        if featmap is None:
            return None
        return Visualizer.draw_featmap(
            featmap,
            None,
            channel_reduction=self.channel_reduction,
            topk=self.topk,
            arrangement=self.arrangement,
            resize_shape=self.resize_shape,
            alpha=self.alpha,
        )

    def draw(self, runner: Runner, values: Mapping[str, Any], mode: str, step: int) -> List[str]:
        """Draw the selected feature maps of ``values`` to the runner's vis backends.

        Returns the image names drawn. A value that fails to draw is logged once
        per key and skipped: visualization never stops a run.

        >>> from types import SimpleNamespace
        >>> images = []
        >>> visualizer = SimpleNamespace(add_image=lambda name, image, step: images.append((name, step)))
        >>> runner = SimpleNamespace(visualizer=visualizer)
        >>> values = {'m:forward:x@0': torch.rand(1, 4, 6, 6), 'm:forward:n@0': 3}
        >>> FeatureMapDrawer().draw(runner, values, 'val', step=7), images
        (['val_m.forward.x@0'], [('val_m.forward.x@0', 7)])
        """
        drawn = []
        for key, value in values.items():
            if not self.wants(key):
                continue
            name = image_name(key, mode)
            try:
                image = self.image(value)
                if image is None:
                    continue
                runner.visualizer.add_image(name, image, step=step)
            except Exception as error:
                if raised_by_signal_handler(error):  # the program's own (a timeout's), not a failed drawing
                    raise
                if key not in self.failed:
                    self.failed.add(key)
                    runner.logger.warning(
                        f"RecorderHook: cannot draw {key} (shape {tuple(getattr(value, 'shape', ()))}): "
                        f"{type(error).__name__}: {error}"
                    )
                continue
            drawn.append(name)
        return drawn


def _positive(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise SpecError(f"{what} must be a positive int, got {value!r}")
    return value


def _pair(value: Any, must: str) -> Tuple[int, int]:
    """``value`` as a pair of positive ints (a list from a config file too); else raise ``must``.

    >>> import numpy
    >>> _pair([2, numpy.int64(4)], "arrangement must be a pair")
    (2, 4)
    """
    if isinstance(value, (tuple, list)) and len(value) == 2:
        first, second = _integer(value[0]), _integer(value[1])
        if first is not None and second is not None and first > 0 and second > 0:
            return first, second
    raise SpecError(f"{must}, got {value!r}")


def _integer(value: Any) -> Optional[int]:
    """``value`` as an int if it is an integer (a NumPy one too; not a bool, a float or a str)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _loops(value: Union[str, Sequence[str]]) -> Tuple[str, ...]:
    iterable = isinstance(value, collections.abc.Iterable) and not isinstance(value, collections.abc.Mapping)
    loops = (value,) if isinstance(value, str) else tuple(value) if iterable else ()
    bad = [loop for loop in loops if loop not in LOOPS]
    if bad or not loops:
        close = did_you_mean(bad[0], LOOPS) if bad and isinstance(bad[0], str) else ""
        raise SpecError(f"loops must name some of {LOOPS}, got {value!r}{close}")
    return loops


def _to_cpu(value: Any) -> Any:
    # Containers rebuilt as recordings copy them (a Counter, a defaultdict, a subclass
    # whose constructor takes other arguments keep their items).
    return _map(value, _detached_on_cpu)


def _detached_on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu()


def _drawer(options: Mapping[str, Any]) -> FeatureMapDrawer:
    """The drawer of ``RecorderHook(visualize=options)``; a bad option raises naming it.

    >>> _drawer(dict(keyz=['resnet:*']))
    Traceback (most recent call last):
    ...
    bcrecord.errors.SpecError: visualize has no option 'keyz' (its options: keys, interval, \
channel_reduction, topk, arrangement, resize_shape, alpha, sample_index); did you mean 'keys'?
    """
    names = list(inspect.signature(FeatureMapDrawer).parameters)
    for option in options:
        if option not in names:
            raise SpecError(
                f"visualize has no option {option!r} (its options: {', '.join(names)})"
                + did_you_mean(str(option), names)
            )
    try:
        return FeatureMapDrawer(**options)
    except SpecError as error:
        raise SpecError(f"visualize {error}") from None


# --- the hooks ----------------------------------------------------------------


def _missing_attribute(model: Any, spec: Any) -> Optional[str]:
    """Why an attribute recorder's chain (``self.linear1.weight``) cannot be read on
    ``model`` now, or None. An attribute that some method of its owner's class assigns
    (``self.cache = ...`` in the forward of the model or of a submodule) may not exist
    before the first iteration: it passes."""
    if not isinstance(spec, Attribute) or spec.at != "entry" or spec.chain[0] != "self":
        return None
    value, path = model, "self"
    for part in spec.chain[1:]:
        try:
            value = getattr(value, part)
        except AttributeError:
            if _assigned_by_methods(type(value), part):  # (a submodule's cache too: self.head.cache)
                return None
            hint = did_you_mean(part, [n for n in dir(value) if not n.startswith("_")])
            return f"target {spec.target!r}: {path} ({type(value).__name__}) has no attribute {part!r}{hint}"
        except Exception:  # a property that fails before the run: leave it to the iteration
            return None
        path += f".{part}"
    return None


def _assigned_by_methods(cls: type, name: str) -> bool:
    """Whether a method of ``cls`` (or a base) assigns ``self.<name>``."""
    for kind in cls.__mro__:
        for member in vars(kind).values():
            code = getattr(getattr(member, "__func__", member), "__code__", None)
            if code is not None and any(
                instr.opname == "STORE_ATTR" and instr.argval == name for instr in dis.get_instructions(code)
            ):
                return True
    return False


@HOOKS.register_module()
class RecorderHook(Hook):
    """Record locals and attributes inside ``runner.model`` into the MessageHub.

    Args:
        recorders: recorder dicts. ``dict(type='FunctionRecorder', target='outputs',
            index=[1])`` records local ``outputs`` after its assignment number 1
            (``index`` may list several; omitted: every assignment);
            ``target='return'`` the returned value; a dotted target such as
            ``'self.linear1'`` each time the body loads it.
            ``dict(type='AttributeRecorder', target='self.linear1.weight')`` reads
            the chain when the method starts. Optional keys: ``model`` (a dotted
            path under ``runner.model``; default the model itself, looked up
            through distributed wrappers), ``method`` (default ``'forward'``),
            ``name`` (the owner part of keys; default ``model``, or
            ``'runner_model'``) and ``copy`` (``'clone'``, ``'detach'``, ...).
        save_dir: if set, every recorded iteration is also written under
            ``save_dir/<loop>`` (``train``, ``val``, ``test``) with
            :class:`bcrecord.storage.Writer`; ``bcrecord.load(save_dir + '/train')``
            reads it back. When several processes run, each writes its own
            ``save_dir/<loop>/rank<r>``. A value that cannot be pickled (a local
            lambda) is saved as its repr, with one warning per key in the log.
        print_modification: log each patched method before and after (disassembly
            side by side, and decompiled source when ``depyf`` is installed)
            through the runner's logger at ``before_run``.
        loops: the loops to record in: ``'train'`` (default), ``'val'``,
            ``'test'``, or several.
        every_n_iters: record every ``every_n_iters``-th iteration of each recorded loop
            (training: ``runner.iter % every_n_iters == 0``; validation and test: their
            running count); the others run the original code, publish and save nothing.
        interval: write buffered records every ``interval`` iterations (or
            epochs with ``by_epoch=True``). Records are also written at the end
            of each loop, of the run, and when the run fails or is interrupted,
            so at most the iteration in progress is lost.
        by_epoch: count ``interval`` in training epochs instead of iterations (an
            iteration-based loop has one epoch: ``before_run`` warns that its records would
            be written when training ends only).
        visualize: draw recorded feature maps with ``Visualizer.draw_featmap``
            to the runner's vis backends: ``True``, or a dict of
            :class:`FeatureMapDrawer` options (``keys``, ``interval``,
            ``channel_reduction``, ``topk``, ``arrangement``, ``resize_shape``,
            ``alpha``, ``sample_index``).
        copy: how values are kept (``'clone'``: detached clones of tensors).

    Keys are ``'<owner>:<method>:<target>'``, e.g. ``'runner_model:forward:outputs@1'``,
    ``'runner_model:forward:self.linear1.weight'``, ``'resnet:_forward_impl:x@0'``.
    They are published with ``runner.message_hub.update_info(key, value, resumed=False)``
    after every recorded iteration (so recorded values never go into checkpoints; nor
    do their keys, which resuming would warn about),
    and a key keeps its last value in iterations that do not reach it.

    The recorders are checked at ``before_run``: a bad one raises
    :class:`RecorderConfigError` before any iteration runs. Patches are per
    instance and installed when a selected loop starts; they are removed when
    the outermost loop ends, at ``after_run``, and when a loop raises (the
    exception then propagates), leaving the model exactly as it was.

    Example (in a config)::

        custom_imports = dict(imports=['bcrecord.integrations.mmengine'])
        custom_hooks = [dict(type='RecorderHook',
                             recorders=[dict(type='FunctionRecorder', target='outputs', index=[1])],
                             save_dir='./work_dir', print_modification=True)]

    >>> hook = RecorderHook([dict(type='AttributeRecorder', target='self.linear1.weight')],
    ...                     loops=['train', 'val'], visualize=dict(topk=4, channel_reduction=None))
    >>> hook.loops, hook.drawer.topk
    (('train', 'val'), 4)
    """

    priority = "ABOVE_NORMAL"

    def __init__(
        self,
        recorders: Sequence[Mapping[str, Any]],
        save_dir: Optional[Union[str, Path]] = None,
        print_modification: bool = False,
        loops: Union[str, Sequence[str]] = "train",
        interval: int = 1,
        by_epoch: bool = False,
        visualize: Union[bool, Mapping[str, Any], None] = None,
        copy: str = "clone",
        every_n_iters: int = 1,
    ) -> None:
        # Recorder dicts are checked at before_run, where the model is known.
        self.recorders = recorders
        # Each argument is checked here, naming itself: not a bare TypeError from Path(5) or
        # tuple(5), nor a flag taken as true from a config's string ('False').
        if save_dir is not None and not isinstance(save_dir, (str, os.PathLike)):
            raise SpecError(f"save_dir must be a directory's path (a str or a Path), got {save_dir!r}")
        if save_dir is not None and not os.fspath(save_dir):  # Path("") would be the working directory
            raise SpecError("save_dir is an empty string (give '.' for the working directory)")
        self.save_dir = None if save_dir is None else Path(save_dir)
        self.print_modification = require_bool("print_modification", print_modification)
        self.loops = _loops(loops)
        self.interval = _positive(interval, "interval")
        self.every_n_iters = _positive(every_n_iters, "every_n_iters")
        self.by_epoch = require_bool("by_epoch", by_epoch)
        if copy not in COPY_POLICIES:
            raise SpecError(f"copy must be one of {COPY_POLICIES}, got {copy!r}")
        self.copy = copy
        if visualize is True:
            visualize = {}
        if visualize is not None and visualize is not False and not isinstance(visualize, Mapping):
            raise SpecError(
                f"visualize must be True or a dict of FeatureMapDrawer options, got {visualize!r}"
            )
        self.drawer = _drawer(visualize) if isinstance(visualize, Mapping) else None
        #: The runner of the last run (weakly): its next run counts validation and test on.
        self._runner: Optional[weakref.ReferenceType] = None
        self._reset()

    def _reset(self) -> None:
        self._parsed: List[RecorderConfig] = []
        self._patches: List[Patch] = []
        self._recording: Optional[Recording] = None
        self._buffers: Dict[str, List[Tuple[int, Dict[str, Any]]]] = {}
        self._writers: Dict[str, Writer] = {}
        self._unsavable: set = set()  # keys warned of: a value saved as its repr
        self._counts: Dict[str, int] = {}
        self._depth = 0
        self._wrapped: List[Any] = []
        self._checked: set = set()
        self._keys: Tuple[str, ...] = ()
        #: The method each key records in.
        self._methods: Dict[str, Optional[str]] = {}
        self._save_root: Optional[Path] = None

    # public state ------------------------------------------------------------

    @property
    def keys(self) -> Tuple[str, ...]:
        """Every key the recorders can produce (known after ``before_run``)."""
        return self._keys

    @property
    def patched(self) -> bool:
        """Whether the model is patched right now."""
        return bool(self._patches)

    def records_dir(self, loop: str = "train") -> Optional[Path]:
        """Where the records of ``loop`` go: ``save_dir/<loop>``, ``save_dir/<loop>/rank<r>``
        when several processes run (None without ``save_dir``).

        >>> recorders = [dict(type='FunctionRecorder', target='outputs')]
        >>> RecorderHook(recorders, save_dir='work_dir/records').records_dir('val').parts[-2:]
        ('records', 'val')
        >>> RecorderHook(recorders).records_dir() is None
        True
        """
        if self.save_dir is None:
            return None
        root = self._save_root or self.save_dir
        rank, world_size = get_dist_info()
        return root / loop if world_size == 1 else root / loop / f"rank{rank}"

    # set up and tear down --------------------------------------------------------

    def before_run(self, runner: Runner) -> None:
        """Check every recorder against the model (raising before any iteration) and prepare."""
        self._finish(runner, failed=False, unwrap_loops=True)
        # Another run of the same runner (runner.val() after runner.train()) draws into the same
        # folder: its validation and test steps count on, never drawing over the last run's images.
        counts = self._counts if self._runner is not None and self._runner() is runner else {}
        self._reset()
        self._counts.update(counts)
        self._runner = weakref.ref(runner)
        self._parsed = parse_recorders(self.recorders)
        patches = self._apply(runner)  # checks everything; raises with nothing changed
        try:
            self._keys = tuple(dict.fromkeys(key for patch in patches for key in patch.keys))
            self._methods = {key: patch.attribute for patch in patches for key in patch.keys}
            if self.print_modification:
                self._log_modifications(runner, patches)
        finally:
            # Installed again when a loop starts, so nothing in between (weight init,
            # resume, other hooks deep-copying the model) sees a patched model.
            for patch in reversed(patches):
                patch.remove()
        if self.save_dir is not None:
            # Relative to the working directory at before_run, as the runner's work_dir is.
            self._save_root = self.save_dir.expanduser().absolute()
            for loop in self._built_loops(runner):
                if loop in self.loops:
                    directory = self.records_dir(loop)
                    try:
                        # Made at its first save: a run that fails before one leaves no empty folder.
                        writer = self._writers[loop] = Writer(directory, make=False)  # type: ignore[arg-type]
                    except BcrecordError as error:
                        message = f"RecorderHook: save_dir={str(directory)!r}: {error}"
                        raise RecorderConfigError(message) from error
                    # A resumed run's evaluations count on from the saved ones.
                    saved = writer.last_step if loop != "train" else None  # reads the index
                    if saved is not None:
                        self._counts[loop] = max(self._counts.get(loop, 0), saved + 1)
        self._wrap_loops(runner)
        self._warn_of_epochs_that_never_end(runner)
        self._warn_of_keys_the_log_prints(runner)
        where = f"; records go to {self._save_root}/<loop>" if self._save_root is not None else ""
        runner.logger.info(
            f"RecorderHook: recording {len(self._keys)} keys in the {'/'.join(self.loops)} loop(s){where}: "
            + ", ".join(self._keys)
        )

    def _warn_of_epochs_that_never_end(self, runner: Runner) -> None:
        """With ``by_epoch=True`` and ``save_dir``, say so when training is iteration-based: its one
        "epoch" is the whole run, so every recorded iteration would wait in memory until it ends."""
        from mmengine.runner import IterBasedTrainLoop

        loop = self._built_loops(runner).get("train")
        if self.by_epoch and "train" in self._writers and isinstance(loop, IterBasedTrainLoop):
            runner.logger.warning(
                "RecorderHook: by_epoch=True, but training is iteration-based (IterBasedTrainLoop runs "
                "one epoch): every recorded training iteration is kept in memory and written when "
                f"training ends; give by_epoch=False to write every interval={self.interval} iterations"
            )

    def _warn_of_keys_the_log_prints(self, runner: Runner) -> None:
        """Say so when a key starts with ``'val'`` or ``'test'`` (``model='value_head'``): MMEngine's
        ``LogProcessor`` takes every MessageHub info whose key starts with the loop's name for that
        loop's own and prints it, a tensor in full, at the end of each validation or test epoch,
        whichever loop published it."""
        owners = sorted({rc.owner for rc in self._parsed if rc.owner.startswith(("val", "test"))})
        if owners:
            runner.logger.warning(
                f"RecorderHook: the keys of owner(s) {', '.join(map(repr, owners))} start with 'val' or "
                "'test': MMEngine's LogProcessor prints every MessageHub info whose key starts with "
                "'val' ('test') at the end of each validation (test) epoch, the recorded value in "
                "full; give such a recorder a name= (the owner part of its keys) that starts "
                "otherwise to keep its values out of the log"
            )

    def _warn_of_loops_that_do_not_run(self, runner: Runner, outermost: str) -> None:
        """Say so when none of ``loops`` runs in this run, whose outermost loop is ``outermost``:
        ``runner.test()`` (``tools/test.py``) with the default ``loops='train'`` would record
        nothing, silently. (Known when it starts, not at ``before_run``: a runner that trained
        keeps its built train loop in the runs after, ``runner.test()`` too.)"""
        runs = [outermost]
        if outermost == "train" and "val" in self._built_loops(runner):
            runs.append("val")  # (validation runs inside training)
        if not any(loop in runs for loop in self.loops):
            runner.logger.warning(
                f"RecorderHook: loops={list(self.loops)}, but this run runs the {'/'.join(runs)} loop(s): "
                f"nothing will be recorded; give loops={[*self.loops, *runs]} to record them too"
            )

    def after_run(self, runner: Runner) -> None:
        """Write what is buffered and remove every patch and loop wrapper."""
        self._finish(runner, failed=False, unwrap_loops=True)

    def before_save_checkpoint(self, runner: Runner, checkpoint: dict) -> None:
        """Leave the recorded keys out of the checkpoint's MessageHub state: their values are
        not saved (``resumed=False``), but their names would be, and resuming from it would
        warn ``resumed key: ... is not defined in message_hub`` for each."""
        hub_state = checkpoint.get("message_hub")
        if not isinstance(hub_state, dict):
            return
        resumed_keys = hub_state.get("resumed_keys")
        if isinstance(resumed_keys, Mapping):
            # A new dict: MessageHub.state_dict() hands over the hub's own one.
            ours = set(self._keys)
            hub_state["resumed_keys"] = {k: v for k, v in resumed_keys.items() if k not in ours}

    def _apply(self, runner: Runner) -> List[Patch]:
        applied: List[Patch] = []
        #: Each key's recorder and where it records: two places must not share one key.
        places: Dict[str, Tuple[Any, str, str]] = {}
        try:
            for rc in self._parsed:
                try:
                    target = resolve_model(runner.model, rc.model)
                except RecorderConfigError as error:
                    raise _fail(rc.where, str(error)) from None
                if not rc.model:
                    target = _where_it_runs(runner.model, target, rc.method)
                if isinstance(target, (type, types.ModuleType)):
                    raise _fail(
                        rc.where,
                        f"model={rc.model!r} is a {type(target).__name__}, not a module instance: "
                        "RecorderHook patches instances only",
                    )
                if isinstance(target, torch.Tensor):  # model='linear1.weight'
                    owner, _, name = rc.model.rpartition(".")
                    raise _fail(
                        rc.where,
                        f"model={rc.model!r} is a {type(target).__name__}, not a module: name the module "
                        f"that reads it, model={owner!r}, and record it there (target='self.{name}')",
                    )
                missing = _missing_attribute(target, rc.spec)
                if missing is not None:
                    raise _fail(rc.where, missing)
                try:
                    applied.append(patch_method(target, rc.method, rc.spec, name=rc.owner))
                except BcrecordError as error:
                    what = f"{rc.owner}.{rc.method}" if rc.model else f"runner.model.{rc.method}"
                    said = f"cannot record in {what}: {error}{_in_dict_form(error)}"
                    raise _fail(rc.where, said) from error
                for key in applied[-1].keys:
                    other = places.setdefault(key, (target, rc.method, rc.where))
                    if other[0] is not target or other[1] != rc.method:  # one value would be lost
                        raise _fail(
                            rc.where,
                            f"its key {key!r} is also that of {other[2]}, which records elsewhere: "
                            "give one of them another name=",
                        )
        except BaseException:
            for patch in reversed(applied):
                patch.remove()
            raise
        return applied

    def _install(self, runner: Runner) -> None:
        if not self._patches and self._parsed:
            self._patches = self._apply(runner)

    def _finish(self, runner: Runner, failed: bool, unwrap_loops: bool = False) -> None:
        """Stop recording, remove patches, write buffers; safe to call repeatedly."""
        rec, self._recording = self._recording, None
        patches, self._patches = self._patches, []
        try:
            if rec is not None:
                rec.__exit__(None, None, None)
        finally:
            for patch in reversed(patches):
                patch.remove()
            if unwrap_loops:
                self._unwrap_loops()
        try:
            written = self._flush_all(runner)
        except Exception as error:
            if not failed:
                raise
            runner.logger.error(f"RecorderHook: could not write records after the failure: {error}")
            return
        if failed and (rec is not None or patches or written):  # once, for the innermost loop
            runner.logger.warning(
                "RecorderHook: the run failed; patches removed"
                + (f", {written} buffered values written to {self._save_root}" if written else "")
            )

    def _built_loops(self, runner: Runner) -> Dict[str, Any]:
        loops = {}
        for mode in LOOPS:
            loop = getattr(runner, f"_{mode}_loop", None)
            if loop is not None and not isinstance(loop, Mapping) and callable(getattr(loop, "run", None)):
                loops[mode] = loop
        return loops

    def _wrap_loops(self, runner: Runner) -> None:
        """Make each built loop's ``run`` clean up (and re-raise) when it fails."""
        for loop in self._built_loops(runner).values():
            if getattr(vars(loop).get("run"), _MARK, None) is self:
                continue  # another RecorderHook's guard may be there: guards stack
            loop.run = self._guard(runner, loop.run)
            self._wrapped.append(loop)

    def _guard(self, runner: Runner, run: Callable[..., Any]) -> Callable[..., Any]:
        def run_and_clean_up_on_failure(*args: Any, **kwargs: Any) -> Any:
            try:
                return run(*args, **kwargs)
            except BaseException:
                self._finish(runner, failed=True, unwrap_loops=True)
                raise

        setattr(run_and_clean_up_on_failure, _MARK, self)
        return run_and_clean_up_on_failure

    def _unwrap_loops(self) -> None:
        loops, self._wrapped = self._wrapped, []
        for loop in loops:
            installed = vars(loop).get("run")
            if getattr(installed, _MARK, None) is self:
                del loop.run

    # loops ---------------------------------------------------------------------------

    def _loop_started(self, runner: Runner, mode: str) -> None:
        if self._depth == 0:
            self._warn_of_loops_that_do_not_run(runner, mode)
        self._depth += 1
        if mode in self.loops:
            self._install(runner)

    def _loop_ended(self, runner: Runner, mode: str) -> None:
        self._depth = max(0, self._depth - 1)
        self._flush(runner, mode)
        if self._depth == 0:
            self._finish(runner, failed=False)

    def before_train(self, runner: Runner) -> None:
        """Install the patches if training is recorded (and say so where its records folder
        already holds the steps this run is about to save)."""
        self._warn_of_steps_saved_again(runner)
        self._loop_started(runner, "train")

    def _warn_of_steps_saved_again(self, runner: Runner) -> None:
        """Training steps are ``runner.iter``: a run resumed from a checkpoint older than the
        last saved iteration (or a fresh run) saves those steps again, next to the earlier
        run's values; say so, naming them, since nothing in the folder tells them apart."""
        writer = self._writers.get("train")
        if writer is None:
            return
        start = runner.iter  # (resume has set it by now)
        again = writer.steps_from(start)
        if not again:
            return
        # (Those saved: every n-th iteration only, where every_n_iters is more than 1.)
        steps = f"step {again[0]}" if len(again) == 1 else f"steps {again[0]}..{again[-1]}"
        run = f"resumed at iteration {start}" if start else "starting at iteration 0"
        runner.logger.warning(
            f"RecorderHook: {writer.directory} already holds training {steps} of an earlier run; this "
            f"run ({run}) saves those steps again: bcrecord.load returns both values of each, in the "
            "order saved (this run's last); give each run its own save_dir to keep them apart"
        )

    def before_val(self, runner: Runner) -> None:
        """Install the patches if validation is recorded."""
        self._loop_started(runner, "val")

    def before_test(self, runner: Runner) -> None:
        """Install the patches if testing is recorded."""
        self._loop_started(runner, "test")

    def after_train(self, runner: Runner) -> None:
        """Write the training records; remove the patches if no loop is left running."""
        self._loop_ended(runner, "train")

    def after_val(self, runner: Runner) -> None:
        """Write the validation records; remove the patches if no loop is left running."""
        self._loop_ended(runner, "val")

    def after_test(self, runner: Runner) -> None:
        """Write the test records; remove the patches if no loop is left running."""
        self._loop_ended(runner, "test")

    # iterations ----------------------------------------------------------------------

    def _start(self, runner: Runner, mode: str) -> None:
        if mode not in self.loops or not self._patches:
            return
        count = runner.iter if mode == "train" else self._counts.get(mode, 0)
        if count % self.every_n_iters:
            return  # (an iteration not recorded runs the original code: no recording is active)
        if self._recording is not None:  # an iteration that never reached its after_*_iter
            self._recording.__exit__(None, None, None)
        self._recording = recording(copy=self.copy, keep="last", only=self._patches).__enter__()

    def _step(self, runner: Runner, mode: str) -> int:
        """This iteration's step: ``runner.iter`` in training, else the loop's running count
        (counting every iteration, recorded or not)."""
        if mode == "train":
            return runner.iter
        step = self._counts.get(mode, 0)
        self._counts[mode] = step + 1
        return step

    def _stop(self, runner: Runner, mode: str, batch_idx: int) -> None:
        rec, self._recording = self._recording, None
        if mode not in self.loops or not self._patches:
            return
        step = self._step(runner, mode)
        if rec is not None:
            self._publish(runner, mode, step, rec)
        if not self.by_epoch:  # (every iteration: a recorded one may never be the interval's last)
            due = (
                self.every_n_train_iters(runner, self.interval)
                if mode == "train"
                else self.every_n_inner_iters(batch_idx, self.interval)
            )
            if due:
                self._flush(runner, mode)

    def _publish(self, runner: Runner, mode: str, step: int, rec: Recording) -> None:
        """Publish a recorded iteration's values to the MessageHub; buffer and draw them."""
        rec.__exit__(None, None, None)
        values = dict(rec.items())
        for key, value in values.items():
            runner.message_hub.update_info(key, value, resumed=False)
        if mode not in self._checked:
            self._checked.add(mode)
            failed = {error.key for error in rec.errors}  # reached, but the value could not be copied
            # A key in another loop's step method (train_step in validation) is never reached
            # in this loop, by design: naming it would be noise.
            others = set(_LOOP_STEPS.values()) - {_LOOP_STEPS[mode]}
            missing = [
                key
                for key in self._keys
                if key not in values and key not in failed and self._methods.get(key) not in others
            ]
            if missing:
                runner.logger.warning(
                    f"RecorderHook: the first {mode} iteration did not reach {', '.join(missing)} "
                    "(a branch not taken, or a method not called in this loop); those keys are "
                    "published only in iterations that reach them"
                )
        if mode in self._writers:
            self._buffers.setdefault(mode, []).append((step, {k: _to_cpu(v) for k, v in values.items()}))
        # The drawer's interval counts recorded iterations (every_n_iters apart).
        if self.drawer is not None and (step // self.every_n_iters + 1) % self.drawer.interval == 0:
            self.drawer.draw(runner, values, mode, step)

    def before_train_iter(self, runner: Runner, batch_idx: int, data_batch: DataBatch = None) -> None:
        """Start recording this training iteration."""
        self._start(runner, "train")

    def before_val_iter(self, runner: Runner, batch_idx: int, data_batch: DataBatch = None) -> None:
        """Start recording this validation iteration."""
        self._start(runner, "val")

    def before_test_iter(self, runner: Runner, batch_idx: int, data_batch: DataBatch = None) -> None:
        """Start recording this test iteration."""
        self._start(runner, "test")

    def after_train_iter(
        self, runner: Runner, batch_idx: int, data_batch: DataBatch = None, outputs: Any = None
    ) -> None:
        """Publish this iteration's values to the MessageHub (and buffer, draw, write)."""
        self._stop(runner, "train", batch_idx)

    def after_val_iter(
        self, runner: Runner, batch_idx: int, data_batch: DataBatch = None, outputs: Any = None
    ) -> None:
        """Publish this iteration's values to the MessageHub (and buffer, draw, write)."""
        self._stop(runner, "val", batch_idx)

    def after_test_iter(
        self, runner: Runner, batch_idx: int, data_batch: DataBatch = None, outputs: Any = None
    ) -> None:
        """Publish this iteration's values to the MessageHub (and buffer, draw, write)."""
        self._stop(runner, "test", batch_idx)

    def after_train_epoch(self, runner: Runner) -> None:
        """With ``by_epoch=True``, write the records every ``interval`` epochs."""
        if self.by_epoch and self.every_n_epochs(runner, self.interval):
            self._flush(runner, "train")

    # saving ------------------------------------------------------------------------

    def _flush(self, runner: Runner, mode: str) -> int:
        """Write the buffered iterations of ``mode`` in one save; returns values written."""
        buffer = self._buffers.get(mode)
        writer = self._writers.get(mode)
        if not buffer or writer is None:
            return 0

        def unsavable(key: str, step: int, why: str) -> None:
            # Its repr is saved instead: one value (a local lambda) must not stop training.
            if key not in self._unsavable:
                self._unsavable.add(key)
                runner.logger.warning(
                    f"RecorderHook: cannot save {key!r} (step {step}): {why}; saved its repr"
                )

        written = writer.write_many(
            [(step, {key: [value] for key, value in values.items()}) for step, values in buffer], unsavable
        )
        buffer.clear()
        return written

    def _flush_all(self, runner: Runner) -> int:
        return sum(self._flush(runner, mode) for mode in list(self._buffers))

    # print_modification --------------------------------------------------------------

    def _log_modifications(self, runner: Runner, patches: Sequence[Patch]) -> None:
        groups: Dict[Tuple[int, Optional[str]], List[Patch]] = {}
        for patch in patches:
            groups.setdefault((id(patch.target), patch.attribute), []).append(patch)
        for group in groups.values():
            last = group[-1]  # its code holds the probes of every patch on this method
            original, probed = last.original_code, last.code
            keys = [key for patch in group for key in patch.keys]
            owners = ", ".join(dict.fromkeys(str(patch.name) for patch in group))
            qualname = code_qualname(original) or original.co_name
            lines = [
                f"RecorderHook: {owners} {qualname} ({original.co_filename}:{original.co_firstlineno}) "
                f"now records {', '.join(keys)}",
                side_by_side(original, probed),
            ]
            before, after = decompiled(original), decompiled(probed)
            if before is not None and after is not None:
                lines += ["decompiled, before:", before.rstrip(), "decompiled, after:", after.rstrip()]
            else:
                lines.append("(pip install depyf to also see the decompiled source)")
            runner.logger.info("\n".join(lines))


def _version(tensor: torch.Tensor) -> int:
    """How many times ``tensor`` was written in place (-1 for an inference tensor, which does not count).

    >>> t = torch.zeros(2)
    >>> before = _version(t)
    >>> _ = t.add_(1)
    >>> _version(t) - before
    1
    """
    try:
        return tensor._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        return -1


@HOOKS.register_module()
class RecorderVisualizationHook(Hook):
    """Draw feature maps found in the MessageHub with ``Visualizer.draw_featmap``.

    Reads ``runner.message_hub`` after each iteration of the chosen loops and draws
    every 3-D ``(C, H, W)`` or 4-D ``(N, C, H, W)`` tensor whose key is selected by
    ``keys`` (keys or ``fnmatch`` patterns; None: all), once per new value (one tensor
    changed in place is a new value), to the
    runner's vis backends (``LocalVisBackend`` files by default, TensorBoard when
    configured), in the iteration that published it: every ``interval``-th iteration
    draws the values published in that iteration, never an older one the hub still
    holds. Runs after ``RecorderHook`` publishes (its priority is lower).
    Images are named by :func:`image_name`; the step is ``runner.iter`` in
    training and a running count of iterations in validation and test.

    Example (in a config)::

        custom_hooks = [
            dict(type='RecorderHook', recorders=[dict(type='FunctionRecorder', model='resnet',
                 method='_forward_impl', target='x', index=[0, 1, 2])]),
            dict(type='RecorderVisualizationHook', keys=['resnet:*'], interval=50,
                 channel_reduction=None, topk=8, arrangement=(2, 4)),
        ]

    >>> RecorderVisualizationHook(keys=['resnet:*'], loops='val').loops
    ('val',)
    """

    priority = "NORMAL"

    def __init__(
        self,
        keys: Optional[Sequence[str]] = None,
        loops: Union[str, Sequence[str]] = "train",
        interval: int = 1,
        channel_reduction: Optional[str] = "squeeze_mean",
        topk: int = 20,
        arrangement: Tuple[int, int] = (4, 5),
        resize_shape: Optional[Tuple[int, int]] = None,
        alpha: float = 0.5,
        sample_index: int = 0,
    ) -> None:
        self.loops = _loops(loops)
        self.drawer = FeatureMapDrawer(
            keys, interval, channel_reduction, topk, arrangement, resize_shape, alpha, sample_index
        )
        #: Per key, the value seen last and its version (see _draw).
        self._last: Dict[str, Tuple[torch.Tensor, int]] = {}
        self._counts: Dict[str, int] = {}

    def _draw(self, runner: Runner, mode: str) -> None:
        if mode not in self.loops:
            return
        if mode == "train":
            step = runner.iter
        else:
            step = self._counts.get(mode, 0)
            self._counts[mode] = step + 1
        fresh = {}
        for key, value in runner.message_hub.runtime_info.items():
            # A key whose value is the one seen last iteration, unchanged, was not published
            # again. (One tensor changed in place, a parameter published under copy='none' as
            # the optimizer steps it, is a new value: its version counts the writes.)
            if not isinstance(value, torch.Tensor) or not self.drawer.wants(key):
                continue
            seen = (value, _version(value))
            last = self._last.get(key)
            if last is None or last[0] is not value or last[1] != seen[1]:
                fresh[key] = seen
        # Seen every iteration, drawn or not: an older iteration's value, still in the hub,
        # is never drawn under a later step.
        self._last.update(fresh)
        if (step + 1) % self.drawer.interval == 0:
            self.drawer.draw(runner, {key: value for key, (value, _) in fresh.items()}, mode, step)

    def after_train_iter(
        self, runner: Runner, batch_idx: int, data_batch: DataBatch = None, outputs: Any = None
    ) -> None:
        """Draw the new feature maps of this training iteration."""
        self._draw(runner, "train")

    def after_val_iter(
        self, runner: Runner, batch_idx: int, data_batch: DataBatch = None, outputs: Any = None
    ) -> None:
        """Draw the new feature maps of this validation iteration."""
        self._draw(runner, "val")

    def after_test_iter(
        self, runner: Runner, batch_idx: int, data_batch: DataBatch = None, outputs: Any = None
    ) -> None:
        """Draw the new feature maps of this test iteration."""
        self._draw(runner, "test")
