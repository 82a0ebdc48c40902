"""bcrecord: record intermediate values inside Python functions by editing bytecode.

>>> import bcrecord
>>> def f(a):
...     x = a + 1
...     x = x * 10
...     return x
>>> g = bcrecord.instrument(f, "x@1", name="demo")
>>> with bcrecord.recording() as rec:
...     g(1)
20
>>> rec["demo:f:x@1"]
20
"""

from .errors import (
    BcrecordError,
    NotPatchableError,
    RecordingWarning,
    ReturnNodeError,
    SpecError,
    TargetError,
    UnsupportedPythonError,
)
from .patch import Patch, instrument, patch_function, patch_method, record_locals, targets
from .rewrite import set_probe_style
from .runtime import Recording, carry, copy_value, recording, register_copy
from .runtime import register_plugin as _register_plugin
from .specs import Attribute, Call, Expr, Local, Return, parse
from .storage import load, save

__version__ = "0.1.0"

# The layers above the core, imported by it only when a value of their library is met: their
# copies of tensors, torchvision's ImageList, transformers' caches, MMEngine's data elements.
_register_plugin("torch", "bcrecord.torch.copies", at_entry=True)
_register_plugin("torchvision", "bcrecord.integrations.torchvision")
_register_plugin("mmengine", "bcrecord.integrations.mmengine")
_register_plugin("transformers", "bcrecord.integrations.transformers")

__all__ = [
    "Attribute",
    "BcrecordError",
    "Call",
    "Expr",
    "Local",
    "NotPatchableError",
    "Patch",
    "Recording",
    "RecordingWarning",
    "Return",
    "ReturnNodeError",
    "SpecError",
    "TargetError",
    "UnsupportedPythonError",
    "carry",
    "copy_value",
    "instrument",
    "load",
    "parse",
    "patch_function",
    "patch_method",
    "record_locals",
    "recording",
    "register_copy",
    "save",
    "set_probe_style",
    "targets",
]
