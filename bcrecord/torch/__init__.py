"""The torch layer: record anything inside an ``nn.Module``.

Install with ``pip install bcrecord[torch]``; ``import bcrecord`` alone never imports
torch.

>>> import torch
>>> from bcrecord.torch import record
>>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
>>> with record(net, "0") as rec:
...     y = net(torch.ones(1, 3))
>>> rec["0:forward:return"].shape
torch.Size([1, 3])

* :func:`record` — a context manager yielding the recording of target strings
  such as ``'layer1.0:forward:out@2'``, ``':_forward_impl:x@0'`` or ``'layer1'``.
* :func:`create_feature_extractor` — a drop-in for torchvision's, that also takes
  local and attribute targets and needs no tracing.
* :func:`list_targets` — every recordable target per submodule.

Tensor values are detached clones by default (see :mod:`bcrecord.torch.copies`).
Under ``torch.compile`` the probe runs outside the graph (it is wrapped with
``torch.compiler.disable`` once this package is imported), so compiled models
record correctly, with one graph break per probe site.
"""

from __future__ import annotations

try:
    import torch
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("bcrecord.torch needs PyTorch: pip install 'bcrecord[torch]'") from error

from .. import runtime as _runtime
from . import copies  # noqa: F401  (registers tensor copies)
from .extractor import FeatureExtractor, create_feature_extractor, list_targets
from .record import ModelRecording, StopForward, record
from .targets import Target, expand, unwrap

__all__ = [
    "FeatureExtractor",
    "ModelRecording",
    "StopForward",
    "Target",
    "create_feature_extractor",
    "expand",
    "list_targets",
    "record",
    "unwrap",
]


def _probe_outside_dynamo() -> None:
    """Make torch.compile call the probe eagerly, with everything it calls.

    Tracing into the probe would turn its bookkeeping into graph side effects (and
    lose values on the first compiled call); skipping only the probe's own frame
    would still let Dynamo compile the copy functions it calls. The public
    ``torch.compiler.disable`` wrapper (recursive) roughly doubles the probe's eager
    cost (about 0.3-0.5 us more per recorded value, measured in
    benchmarks/RESULTS.md case 1b), small beside any module's forward.
    """
    import builtins

    setattr(
        builtins, _runtime.PROBE_NAME, torch.compiler.disable(_runtime.__bcrecord_probe__, recursive=True)
    )


_probe_outside_dynamo()
