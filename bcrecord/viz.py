"""``bcrecord view DIR``: saved records as a summary table and as pictures.

:func:`view` reads a records directory (written by ``bcrecord run --save-dir``,
:func:`bcrecord.save` or :class:`bcrecord.storage.Writer`), prints one row per key
(key, steps, shape, dtype, min/mean/max over every saved value) and writes PNGs to
``DIR/plots``:

* ``<key>.maps.png`` -- a grid of feature maps, for 4-D values (``N, C, H, W``:
  the channels of the first sample) and 3-D ones (``C, H, W``);
* ``<key>.heatmap.png`` -- a heatmap, for 2-D values (and ``N, C, 1, 1``);
* ``<key>.hist.png`` -- a histogram of the elements (last step; the first step
  overlaid when the key was saved repeatedly);
* ``<key>.steps.png`` -- for keys saved repeatedly, the value over steps: mean,
  mean +/- std and the min..max band of each step (over the values in saved order
  where values share a step: a local recorded in a loop, saved at one step);
* ``index.html`` -- every picture with the summary table, to open in a browser.

Pictures show the last saved value of each key. The pictures an earlier ``view``
drew in ``DIR/plots`` (those its ``index.html`` shows) are removed first; other
files there stay. matplotlib is imported only when
pictures are drawn (its Agg renderer, through :class:`matplotlib.figure.Figure`;
pyplot's global state is never touched). A progress bar goes to stderr when it is
a terminal.

>>> import tempfile, bcrecord
>>> from bcrecord.viz import summarize, table
>>> folder = tempfile.mkdtemp()
>>> _ = bcrecord.save({"m:f:x@0": [1.0]}, folder, step=0)
>>> _ = bcrecord.save({"m:f:x@0": [3.0]}, folder, step=1)
>>> print(table(summarize(bcrecord.load(folder))))
key      steps  shape  dtype  min  mean  max
m:f:x@0  2      -      float  1    2     3
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import html
import math
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, TextIO, Tuple, Union
from urllib.parse import quote, unquote

from .errors import BcrecordError, aligned, did_you_mean, listed
from .specs import require_bool
from .storage import (
    DamagedRecords,
    Loaded,
    TensorsNeedTorch,
    Unimportable,
    Unloadable,
    _expanded,
    is_tensor,
    iter_saved_index,
    load,
)

__all__ = ["KeySummary", "summarize", "table", "draw", "write_index", "view", "Progress"]

PathLike = Union[str, "os.PathLike[str]"]


# --- numbers -----------------------------------------------------------------------------


#: The stats of a numeric value with no number to count (NaN, an empty tensor).
_NO_NUMBERS = (math.inf, 0.0, -math.inf, 0)


def _stats(value: Any, divisor: int = 1) -> Optional[Tuple[float, float, float, int]]:
    """(min, sum, max, count) of the finite-or-infinite, non-NaN numbers in ``value``; None if not numeric.

    A NaN step (a loss that diverged) or an empty tensor counts nothing, but the key
    stays numeric: its other steps still give min, mean and max. ``divisor``: the sum is
    of each number divided by it first (a sum of numbers near float64's largest overflows).

    >>> _stats(2), _stats(float("nan")), _stats(10**400)[0], _stats("text"), _stats([4, 6], divisor=2)
    ((2.0, 2.0, 2.0, 1), (inf, 0.0, -inf, 0), inf, None, (4.0, 5.0, 6.0, 2))
    """
    named = _first_field(value)
    if named is not None:  # its fields are different things (max's values and indices): the first's
        return _stats(named[1], divisor)
    if isinstance(value, bool) or isinstance(value, (int, float)):
        number = _float(value)
        return _NO_NUMBERS if math.isnan(number) else (number, number / divisor, number, 1)
    if is_tensor(value):
        try:
            # A sparse tensor's stored values and its implicit zeros, counted as the zeros they
            # are: never densified (a 50000x50000 one with 3 values would take 10 GB).
            stored = _stored(value.detach())
            t, zeros = (as_dense(value.detach()), 0) if stored is None else stored
            if t.is_complex():
                t = _magnitude(t)
            if str(t.dtype) not in ("torch.float32", "torch.float64"):  # ints, bool, float8: no aminmax
                t = t.double()
        except (RuntimeError, NotImplementedError):  # a dtype torch converts to nothing (packed float4)
            return None
        if t.numel() and bool(t.isnan().any()):
            t = t[~t.isnan()]
        if t.numel() == 0:
            return (0.0, 0.0, 0.0, zeros) if zeros else _NO_NUMBERS
        low, high = t.aminmax()
        low, high = (min(float(low), 0.0), max(float(high), 0.0)) if zeros else (float(low), float(high))
        float64 = t.new_zeros(()).double().dtype
        total = t.sum(dtype=float64) if divisor == 1 else (t.to(float64) / divisor).sum()
        return low, float(total), high, int(t.numel()) + zeros
    array = _numpy_array(value)
    if array is None:
        return None
    array = array[~_isnan(array)]
    if array.size == 0:
        return _NO_NUMBERS
    import numpy as np

    # (an overflowed sum, [1e400, -1e400]'s inf - inf: summarize sums again, with a divisor)
    with np.errstate(over="ignore", invalid="ignore"):
        total = array.sum() if divisor == 1 else (array / divisor).sum()
    return float(array.min()), float(total), float(array.max()), int(array.size)


def _float(number: Union[int, float]) -> float:
    """``number`` as a float: an int beyond float's range is ±inf.

    >>> _float(3), _float(-(10**400))
    (3.0, -inf)
    """
    try:
        return float(number)
    except OverflowError:
        return math.inf if number > 0 else -math.inf


def as_dense(tensor: Any) -> Any:
    """``tensor``'s values in a plain strided tensor, to summarize or draw: a sparse
    tensor densified, a quantized one dequantized, a nested one's elements in one
    flat tensor (it has no one shape), a ``MaskedTensor``'s data with its masked-out
    elements NaN (left out of the numbers); any other tensor as it is.

    >>> import torch
    >>> as_dense(torch.eye(2).to_sparse()).tolist()
    [[1.0, 0.0], [0.0, 1.0]]
    """
    if tensor.is_nested:
        import torch

        return torch.cat([part.reshape(-1) for part in tensor.unbind()])
    if tensor.is_quantized:
        return tensor.dequantize()
    if hasattr(tensor, "get_mask") and hasattr(tensor, "get_data"):  # a MaskedTensor (most ops refuse it)
        import torch

        data = tensor.get_data()
        if not (data.is_floating_point() or data.is_complex()):
            data = data.double()
        return torch.where(tensor.get_mask(), data, torch.full((), math.nan, dtype=data.dtype))
    if str(tensor.layout) != "torch.strided":  # sparse COO, CSR, CSC, BSR...
        return tensor.to_dense()
    return tensor


def _stored(tensor: Any) -> Optional[Tuple[Any, int]]:
    """A sparse tensor's stored values (a COO one's duplicates summed, as its dense form sums
    them) and how many of its elements are implicit zeros; None for a tensor of another layout.

    >>> import torch
    >>> values, zeros = _stored(torch.eye(3).to_sparse_csr())
    >>> values.tolist(), zeros
    ([1.0, 1.0, 1.0], 6)
    """
    layout = str(tensor.layout)
    if layout == "torch.sparse_coo":
        values = tensor.coalesce().values()
    elif layout in ("torch.sparse_csr", "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc"):
        values = tensor.values()  # (a block format's blocks, their zeros stored)
    else:
        return None
    return values, tensor.numel() - values.numel()


#: The most elements a sparse tensor's dense form may have to be drawn: its float64 copy for the
#: pictures is then at most what :func:`view` reads at once (256 MB), where a larger one would
#: cost memory its few stored values never needed (a 50000x50000 one, 20 GB).
_MAX_DENSE_DRAWN = 32 << 20


def _too_large_to_draw(value: Any) -> Optional[str]:
    """Why ``value``, a sparse tensor whose dense form has over :data:`_MAX_DENSE_DRAWN`
    elements, is not drawn; None for any other value.

    >>> import torch
    >>> big = torch.sparse_coo_tensor([[0, 1, 2], [0, 1, 2]], [1.0, 2.0, 3.0], (50000, 50000))
    >>> _too_large_to_draw(big)
    'a sparse 50000x50000 tensor with 3 stored values: too large to draw dense'
    """
    if not is_tensor(value) or value.is_nested or str(value.layout) == "torch.strided":
        return None
    stored = _stored(value.detach())
    if stored is None or value.numel() <= _MAX_DENSE_DRAWN:
        return None
    shape = "x".join(map(str, value.shape))
    count = stored[0].numel()
    values = "value" if count == 1 else "values"
    return f"a sparse {shape} tensor with {count} stored {values}: too large to draw dense"


def _first_field(value: Any) -> Optional[Tuple[str, Any]]:
    """The name and value of the first field of a named tuple (a ``namedtuple``, or a struct
    sequence such as ``torch.return_types.max``: values and indices), whose numbers are the ones
    :func:`view` counts and draws (fields of several meanings mixed would mean nothing); None for
    any other value (a plain tuple or a list of tensors may be of one meaning: ``t.chunk(2)``).

    >>> import collections
    >>> _first_field(collections.namedtuple("Max", "values indices")([2.0], [1])), _first_field((1, 2))
    (('values', [2.0]), None)
    """
    if not isinstance(value, tuple) or not value:
        return None
    kind = type(value)
    names = getattr(kind, "_fields", None) if hasattr(kind, "_make") else None  # a namedtuple
    if names is None and hasattr(kind, "n_sequence_fields"):  # a struct sequence
        names = getattr(kind, "__match_args__", None)
    if not names or not isinstance(names[0], str):
        return None
    return names[0], value[0]


def _drawn_part(value: Any) -> Any:
    """What ``value`` is drawn by: a named tuple's first field (a nested one's, through them all),
    any other value itself.

    >>> import collections
    >>> Max = collections.namedtuple("Max", "values indices")
    >>> _drawn_part(Max(Max([2.0], [1]), [1])), _drawn_part((1, 2))
    ([2.0], (1, 2))
    """
    named = _first_field(value)
    return value if named is None else _drawn_part(named[1])


def _isnan(array: Any) -> Any:
    import numpy as np

    return np.isnan(array)


def _magnitude(t: Any) -> Any:
    """The magnitude of a complex tensor's elements; of a kind torch takes no ``abs`` of
    (``bcomplex32``) too, through ``complex64``.

    >>> import torch
    >>> _magnitude(torch.tensor([3 + 4j], dtype=torch.complex64)).tolist()
    [5.0]
    """
    try:
        return t.abs()
    except (RuntimeError, NotImplementedError):
        import torch  # (a tensor is here: torch is imported)

        return t.to(torch.complex64).abs()


def _numpy_array(value: Any) -> Any:
    """``value`` as a float64 numpy array (tensors, numpy arrays, numbers, lists); None if not numeric.

    A masked array's masked-out elements are NaN, left out of the numbers (as a ``MaskedTensor``'s).

    >>> import numpy as np
    >>> _numpy_array(np.ma.masked_array([1, 9, 3], mask=[0, 1, 0])).tolist(), _numpy_array([3 + 4j]).tolist()
    ([1.0, nan, 3.0], [5.0])
    """
    try:
        import numpy as np
    except ImportError:
        return None
    named = _first_field(value)
    if named is not None:  # (as _stats counts it)
        return _numpy_array(named[1])
    if is_tensor(value):
        if _too_large_to_draw(value) is not None:
            return None
        try:
            t = as_dense(value.detach().cpu())
            return (_magnitude(t) if t.is_complex() else t).double().numpy()
        except (RuntimeError, NotImplementedError):  # (as in _stats)
            return None
    if isinstance(value, str) or value is None:
        return None
    # np.asarray drops a mask: a masked array, or a list of them, is read with its mask.
    masked = isinstance(value, np.ma.MaskedArray) or (
        isinstance(value, (list, tuple)) and any(isinstance(item, np.ma.MaskedArray) for item in value)
    )
    try:
        array = np.ma.asarray(value) if masked else np.asarray(value)
    except Exception:
        array = None
    if (array is None or array.dtype.kind == "O") and isinstance(value, (list, tuple)) and value:
        # Items of different shapes (t.chunk(2) of an odd length), counted together as the rest are.
        parts = [_numpy_array(item) for item in value]
        return None if any(part is None for part in parts) else np.concatenate([p.ravel() for p in parts])
    if array is None:
        return None
    if array.dtype.kind == "O" and isinstance(value, int) and not isinstance(value, bool):
        # An int beyond int64 and uint64, which numpy keeps as an object: counted as a float (as
        # one int alone is), not as something non-numeric.
        return np.array(_float(value))
    if array.dtype.kind == "c":
        array = np.abs(array)
    if array.dtype.kind not in "biuf":
        return None
    array = array.astype(np.float64)
    return array.filled(np.nan) if masked else array


def _shape(value: Any) -> Optional[Tuple[int, ...]]:
    """``value``'s shape as ints, None where it has none: a nested tensor has no one shape (a
    jagged one's ragged size is a symbol that ``int`` raises AttributeError on).

    >>> _shape([1, 2]), _shape(type("Array", (), {"shape": (2, 3)})())
    (None, (2, 3))
    """
    if is_tensor(value) and value.is_nested:
        return None
    try:
        shape = getattr(value, "shape", None)
        return None if shape is None else tuple(int(d) for d in shape)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a nested tensor has no one shape
        return None


def _number(x: Optional[float]) -> str:
    """A short form for the table: whole numbers exactly, others to 4 significant digits.

    >>> [_number(v) for v in (None, 0.0, 19999.0, 0.33333, 12345.678, 2.5e-7, -4e9)]
    ['-', '0', '19999', '0.3333', '1.235e+04', '2.500e-07', '-4000000000']
    """
    if x is None:
        return "-"
    if math.isfinite(x) and x.is_integer() and abs(x) < 1e12:
        return str(int(x))
    if 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.4g}" if not math.isfinite(x) else f"{x:.3e}"


# --- summary -----------------------------------------------------------------------------


@dataclass
class KeySummary:
    """What one key holds: its steps, shape, dtype and min/mean/max over every saved value."""

    key: str
    steps: List[int]
    values: List[Any] = field(repr=False)
    shape: Optional[Tuple[int, ...]] = None
    #: True when the saved values do not all have one shape.
    varied_shape: bool = False
    dtype: str = "-"
    min: Optional[float] = None
    mean: Optional[float] = None
    max: Optional[float] = None
    #: True when every value is numeric, also where none has a number to count (every
    #: element NaN, or none): min/mean/max are unknown then, but the key is no text.
    numbers: bool = False

    @property
    def numeric(self) -> bool:
        """Whether min/mean/max could be computed."""
        return self.mean is not None

    def row(self) -> Tuple[str, ...]:
        """The table row: key, steps, shape, dtype, min, mean, max.

        >>> from bcrecord.viz import KeySummary
        >>> KeySummary("m:f:x@0", [3, 4], [0.5, 1.5], (2, 3), False, "float32", 0.0, 0.25, 1.5).row()
        ('m:f:x@0', '2 (3..4)', '2x3', 'float32', '0', '0.25', '1.5')
        >>> KeySummary("m:f:x@0", [5, 9, 2], [1, 2, 3]).row()[1]  # saved out of order: the range
        '3 (2..9)'
        >>> KeySummary("m:f:x@0", [0, 0], [1, 2]).row()[1]  # two runs into one directory
        '2 (all at 0)'
        >>> KeySummary("m:f:x@0", [0, 1, 0, 1], [1, 2, 3, 4]).row()[1]
        '4 (0..1, repeated)'
        """
        steps = str(len(self.steps))
        if self.steps and self.steps != list(range(len(self.steps))):
            low, high = min(self.steps), max(self.steps)
            if low == high:
                steps += f" ({'all ' if len(self.steps) > 1 else ''}at {low})"
            else:
                steps += f" ({low}..{high}{', repeated' if len(set(self.steps)) < len(self.steps) else ''})"
        if self.varied_shape:
            shape = "varies"
        elif self.shape is None:
            shape = "-"
        else:
            shape = "x".join(map(str, self.shape)) if self.shape else "scalar"
        key = _shown(self.key)
        return (key, steps, shape, self.dtype, _number(self.min), _number(self.mean), _number(self.max))


def _shown(key: str) -> str:
    """``key`` as the table, a picture's title and ``index.html`` show it: a key that is no valid
    text (a lone surrogate) escaped, as printing or drawing it would fail; control characters
    too (a newline would break the table's row, a title's line); and '' shown.

    >>> print(_shown("m:f:x@0"), _shown("a\\nb\\udcff"), _shown(""))
    m:f:x@0 a\\nb\\udcff ''
    """
    key = key.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in key) or "''"


def _dtype(value: Any) -> str:
    """What the table's dtype column says of ``value``: a tensor's or array's dtype, else its
    type; for a value that loaded as a stand-in, the class it was saved as, and why it is none.

    >>> from bcrecord.storage import _unloadable
    >>> _dtype(1.5), _dtype(_unloadable(ValueError, TypeError("takes 2 arguments"), ("x",)))
    ('float', 'ValueError (unloadable)')
    >>> import collections
    >>> _dtype(collections.namedtuple("Stats", "loss acc")(0.5, 0.9))  # the field whose numbers are shown
    'Stats (loss: float)'
    >>> import io
    >>> from bcrecord.storage import _Unpickler
    >>> _dtype(_Unpickler(io.BytesIO(b"")).find_class("no_such_module", "step"))  # a function, saved by name
    'step (not importable)'
    """
    if isinstance(value, Unimportable):  # (its own type is Unloadable, or a stand-in named as the class)
        name = (value._where or type(value).__name__).rpartition(".")[2]
        return f"{name} ({'unloadable' if isinstance(value, Unloadable) else 'not importable'})"
    if isinstance(value, type) and issubclass(value, Unimportable):  # a class or function saved by name
        return f"{value._where.rpartition('.')[2]} (not importable)"
    named = _first_field(value)
    if named is not None:  # the field whose numbers the row shows, named
        return f"{type(value).__name__} ({named[0]}: {_dtype(named[1])})"
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return str(dtype).replace("torch.", "")
    return type(value).__name__


def summarize(loaded: Loaded, keys: Union[str, Iterable[str], None] = None) -> List[KeySummary]:
    """One :class:`KeySummary` per key of ``loaded`` (``keys``: a glob pattern, or several, to keep).

    >>> import tempfile, bcrecord
    >>> from bcrecord.viz import summarize
    >>> folder = tempfile.mkdtemp()
    >>> _ = bcrecord.save({"a:f:x@0": [1, 2], "a:f:s@0": ["text"]}, folder, step=0)
    >>> [(s.key, s.numeric, s.mean) for s in summarize(bcrecord.load(folder), keys=["*x*"])]
    [('a:f:x@0', True, 1.5)]
    """
    patterns = _patterns(keys)
    out = []
    for key in loaded:
        if patterns is not None and not any(fnmatch.fnmatchcase(key, p) for p in patterns):
            continue
        values = loaded[key]
        summary = KeySummary(key, loaded.steps(key), values)
        shapes = {_shape(_drawn_part(v)) for v in values}  # (a named tuple's: its shown field's)
        summary.varied_shape = len(shapes) > 1
        summary.shape = next(iter(shapes)) if len(shapes) == 1 else None
        dtypes = {_dtype(v) for v in values}
        summary.dtype = dtypes.pop() if len(dtypes) == 1 else "mixed"
        low, total, high, count = math.inf, 0.0, -math.inf, 0
        for value in values:
            stats = _stats(value)
            if stats is None:
                count = -1
                break
            low, total, high, count = (
                min(low, stats[0]),
                total + stats[1],
                max(high, stats[2]),
                count + stats[3],
            )
        summary.numbers = count >= 0
        if count > 0:
            mean = total / count
            if math.isinf(mean) and math.isfinite(low) and math.isfinite(high):
                # Finite numbers near float64's largest: their sum overflowed, not their mean,
                # which lies between min and max. Summed again, each number divided first.
                mean = math.fsum(_stats(value, count)[1] for value in values)  # type: ignore[index]
            summary.min, summary.mean, summary.max = low, mean, high
        out.append(summary)
    return out


def _patterns(keys: Union[str, Iterable[str], None]) -> Optional[List[str]]:
    """``keys`` as a list of glob patterns: one string is one pattern (as :func:`load` takes
    one key), not its characters (whose ``'*'`` would match every key).

    >>> _patterns("layer1.*"), _patterns(["a*", "b"]), _patterns(None)
    (['layer1.*'], ['a*', 'b'], None)
    """
    if keys is None:
        return None
    return [keys] if isinstance(keys, str) else list(keys)


def _no_match(patterns: Sequence[str], saved: Sequence[str], shown: int = 20) -> str:
    """Why no saved key matches ``patterns``: the close keys or wider globs to give instead, and
    the first ``shown`` saved keys (a long run saves hundreds: one line, not all of them).

    >>> _no_match(["forward:x@1"], [":forward:x@0", ":forward:x@1"])
    "no saved key matches forward:x@1; did you mean ':forward:x@1', ':forward:x@0'?; saved keys: \
:forward:x@0, :forward:x@1"
    >>> _no_match(["layer1"], ["layer1.0:forward:out@1"])
    "no saved key matches layer1 (a glob matches whole keys: '*layer1*'); saved keys: layer1.0:forward:out@1"
    >>> _no_match(["zz*"], [f"k{i}" for i in range(25)], shown=3)
    'no saved key matches zz*; saved keys: k0, k1, k2 and 22 more'
    >>> _no_match([""], ["m:f:x@0"])
    "no saved key matches '' (an empty --key matches only an empty key); saved keys: m:f:x@0"
    """
    hints = []
    for pattern in patterns:
        hint = did_you_mean(pattern, saved, hide_private=False)
        if not pattern:  # (it is a part of every key: '**' was hinted)
            hint = " (an empty --key matches only an empty key)"
        elif not hint and not any(c in pattern for c in "*?[") and any(pattern in key for key in saved):
            hint = f" (a glob matches whole keys: '*{pattern}*')"  # a part of keys, as grep takes it
        hints.append(hint)
    more = f" and {len(saved) - shown} more" if len(saved) > shown else ""
    listed = ", ".join(map(_shown, saved[:shown])) + more
    return f"no saved key matches {', '.join(map(_shown, patterns))}{''.join(hints)}; saved keys: {listed}"


def _glob_notes(patterns: Sequence[str], matching: Sequence[str]) -> List[str]:
    """A note for each pattern that is a key itself but, as a glob, matched other keys too.

    Operator keys hold glob characters (``Net:forward:*@0``, the first ``*``): given as
    it is listed, such a key selects every key the glob matches, which a note says.

    >>> _glob_notes(["m:f:*@0"], ["m:f:*@0", "m:f:x@0"])
    ["--key 'm:f:*@0' is a glob and matched 2 keys; for the key 'm:f:*@0' alone give 'm:f:[*]@0'"]
    >>> _glob_notes(["m:f:*@0"], ["m:f:*@0"])
    []
    """
    notes = []
    for pattern in patterns:
        if pattern in matching:
            also = [key for key in matching if key != pattern and fnmatch.fnmatchcase(key, pattern)]
            if also:
                literal = re.sub(r"([*?\[])", r"[\1]", pattern)
                notes.append(
                    f"--key {pattern!r} is a glob and matched {len(also) + 1} keys; "
                    f"for the key {pattern!r} alone give {literal!r}"
                )
    return notes


def table(summaries: Sequence[KeySummary], encoding: Optional[str] = None) -> str:
    """The summary as an aligned text table (``encoding``: the stream's it is printed to, whose
    escapes of characters it lacks are what the columns are measured by).

    >>> from bcrecord.viz import KeySummary, table
    >>> print(table([KeySummary("m:f:x@0", [0, 1], [1.0, 3.0], (), False, "float", 1.0, 2.0, 3.0)]))
    key      steps  shape   dtype  min  mean  max
    m:f:x@0  2      scalar  float  1    2     3
    """
    rows = [("key", "steps", "shape", "dtype", "min", "mean", "max")] + [s.row() for s in summaries]
    return "\n".join(aligned(rows, encoding))


# --- progress ------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on ``stream`` (shown only when ``enabled``).

    >>> import io
    >>> from bcrecord.viz import Progress
    >>> stream = io.StringIO()
    >>> bar = Progress(2, "plots", stream, enabled=True)
    >>> bar.advance("a"); bar.advance("b"); bar.close()
    >>> stream.getvalue().rstrip().rsplit("\\r", 1)[-1].split()[:3]
    ['plots', '[##############################]', '2/2']
    """

    def __init__(self, total: int, label: str, stream: TextIO, enabled: bool, width: int = 30) -> None:
        self.total, self.label, self.stream, self.enabled, self.width = total, label, stream, enabled, width
        self.done = 0
        self.started = time.monotonic()
        self._draw("")

    def _draw(self, note: str) -> None:
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total) if self.total else self.width
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = time.monotonic() - self.started
        line = f"\r{self.label} [{bar}] {self.done}/{self.total} {elapsed:4.1f}s {note}"
        self.stream.write(line[:120].ljust(100))
        self.stream.flush()

    def advance(self, note: str = "") -> None:
        """One more item done; ``note`` ends the line (what was just done).

        >>> import io
        >>> from bcrecord.viz import Progress
        >>> stream = io.StringIO()
        >>> bar = Progress(4, "plots", stream, enabled=True, width=4)
        >>> bar.advance("m:f:x@0")
        >>> shown = stream.getvalue().rsplit("\\r", 1)[-1].split()  # then the time taken so far
        >>> shown[:3], shown[-1]
        (['plots', '[#...]', '1/4'], 'm:f:x@0')
        """
        self.done += 1
        self._draw(note)

    def close(self) -> None:
        """End the line (nothing is written when not ``enabled``).

        >>> import io
        >>> from bcrecord.viz import Progress
        >>> stream = io.StringIO()
        >>> Progress(1, "plots", stream, enabled=False).close()
        >>> stream.getvalue()
        ''
        """
        if self.enabled:
            self._draw("done")
            self.stream.write("\n")
            self.stream.flush()


# --- pictures -----------------------------------------------------------------------------


#: File names Windows keeps for devices, whatever extension follows them.
_RESERVED_ON_WINDOWS = {"CON", "PRN", "AUX", "NUL"} | {
    f"{kind}{n}" for kind in ("COM", "LPT") for n in range(10)
}


def _slug(key: str, limit: int = 120) -> str:
    """A file-name-safe form of a key, at most ``limit`` characters (file systems allow 255).

    A longer key is cut and given a hash of the whole key, so two long keys that
    share their start still get different names.

    >>> _slug("layer1.0:forward:out@1"), _slug("nul"), _slug("com1.x")
    ('layer1.0_forward_out@1', '_nul', '_com1.x')
    >>> len(_slug("m:" + "x" * 300)), _slug("m:" + "x" * 300) != _slug("m:" + "x" * 299 + "y")
    (120, True)
    """
    slug = re.sub(r"[^A-Za-z0-9_.@-]+", "_", key).strip("._") or "key"
    if slug.partition(".")[0].upper() in _RESERVED_ON_WINDOWS:  # 'nul.hist.png' is the device there
        slug = "_" + slug
    if len(slug) <= limit:
        return slug
    digest = hashlib.sha1(key.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{slug[: limit - 13]}-{digest}"


def _figure(width: float, height: float) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def _title(summary: KeySummary, what: str) -> str:
    # Complex values are drawn by magnitude (as the table counts them): the picture says so, of
    # the values themselves (the dtype column names no complex dtype for 'mixed' or a list).
    if any(_complex(value) for value in summary.values):
        what += " (complex: magnitudes)"
    return f"{_shown(summary.key)}\n{what}"


def _complex(value: Any) -> bool:
    """Whether any of the numbers :func:`_numpy_array` draws of ``value`` is complex.

    >>> _complex([1.0, 3 + 4j]), _complex((2.0, [1])), _complex(True)
    (True, False, False)
    """
    value = _drawn_part(value)
    if isinstance(value, complex):
        return True
    if isinstance(value, (list, tuple)):
        return any(_complex(item) for item in value)
    dtype = getattr(value, "dtype", None)  # a tensor's (torch.complex64) or an array's
    return bool(getattr(dtype, "is_complex", False)) or getattr(dtype, "kind", None) == "c"


def _mosaic(maps: Any, cols: int, pad: int) -> Any:
    """Tile ``maps`` (C, H, W) into one image, each map scaled to 0..1 on its own; NaN between."""
    import numpy as np

    count, height, width = maps.shape
    rows = math.ceil(count / cols)
    mosaic = np.full((rows * (height + pad) - pad, cols * (width + pad) - pad), np.nan)
    for i in range(count):
        one = maps[i]
        finite = one[np.isfinite(one)]
        low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        scaled = (one - low) / (high - low) if high > low else np.zeros_like(one)
        r, c = divmod(i, cols)
        mosaic[
            r * (height + pad) : r * (height + pad) + height, c * (width + pad) : c * (width + pad) + width
        ] = scaled
    return mosaic


def _ordinal(number: int) -> str:
    """``'2nd'``, ``'3rd'``, ``'11th'``...

    >>> [_ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 103)]
    ['1st', '2nd', '3rd', '4th', '11th', '12th', '13th', '21st', '22nd', '103rd']
    """
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def _feature_maps(summary: KeySummary, maps: Any, note: str, max_maps: int) -> Any:
    """One picture of up to ``max_maps`` channels side by side (one image, so it draws fast)."""
    channels, height, width = maps.shape
    shown = min(channels, max_maps)
    # A picture has a few hundred pixels a map: thinned first, a 3000x3000 map does not
    # cost a full-size mosaic (and gigabytes) for nothing.
    stride = max(1, math.ceil(max(height, width) / 256))
    if stride > 1:
        maps = maps[:shown, ::stride, ::stride]
        channels_note = f"every {_ordinal(stride)} pixel, "
        height, width = maps.shape[1:]
    else:
        channels_note = ""
    cols = math.ceil(math.sqrt(shown * height / max(width, 1)))
    rows = math.ceil(shown / cols)
    pad = max(1, min(height, width) // 8)
    mosaic = _mosaic(maps[:shown], cols, pad)
    scale = 7.0 / max(mosaic.shape)
    fig = _figure(max(4.0, mosaic.shape[1] * scale + 0.4), mosaic.shape[0] * scale + 1.0)
    ax = fig.add_axes((0.02, 0.02, 0.96, 1 - 0.9 / (mosaic.shape[0] * scale + 1.0)))
    cmap = _colormap("viridis")
    ax.imshow(mosaic, cmap=cmap, interpolation="nearest", vmin=0, vmax=1)
    for i in range(shown):
        r, c = divmod(i, cols)
        ax.text(
            c * (width + pad) + 0.5,
            r * (height + pad) + 0.5,
            str(i),
            color="white",
            fontsize=7,
            ha="left",
            va="top",
        )
    ax.set_axis_off()
    fig.suptitle(
        _title(
            summary,
            f"step {summary.steps[-1]}, {note}, {channels_note}channels 0..{shown - 1} of {channels} "
            f"({rows}x{cols} grid, each scaled to its own range)",
        ),
        fontsize=9,
    )
    return fig


def _integer_ticks(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _colormap(name: str) -> Any:
    import matplotlib

    return matplotlib.colormaps[name].with_extremes(bad="white")  # (a copy: set_bad is deprecated)


def _heatmap(summary: KeySummary, array: Any, note: str) -> Any:
    import numpy as np

    stride_r = max(1, math.ceil(array.shape[0] / 512))
    stride_c = max(1, math.ceil(array.shape[1] / 512))
    shown = array[::stride_r, ::stride_c]
    fig = _figure(6.4, 4.8)
    ax = fig.add_axes((0.12, 0.1, 0.72, 0.76))
    finite = shown[np.isfinite(shown)]  # NaN and ±inf are left blank
    low, high = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    extent = (-0.5, array.shape[1] - 0.5, array.shape[0] - 0.5, -0.5)  # axes in the array's own indices
    if low < 0 < high:
        bound = max(-low, high)
        image = ax.imshow(
            shown,
            cmap="coolwarm",
            vmin=-bound,
            vmax=bound,
            aspect="auto",
            interpolation="nearest",
            extent=extent,
        )
    else:
        image = ax.imshow(shown, cmap="viridis", aspect="auto", interpolation="nearest", extent=extent)
    fig.colorbar(image, cax=fig.add_axes((0.87, 0.1, 0.03, 0.76)))
    strided = "" if stride_r == stride_c == 1 else f", every ({stride_r}, {stride_c})-th element"
    ax.set_title(_title(summary, f"step {summary.steps[-1]}, {note}{strided}"), fontsize=9)
    _integer_ticks(ax.xaxis)
    _integer_ticks(ax.yaxis)
    ax.set_xlabel("column (dim 1)")
    ax.set_ylabel("row (dim 0)")
    return fig


def _sample(array: Any, limit: int = 1_000_000) -> Any:
    """The finite elements of ``array`` (NaN and ±inf have no place on an axis), at most ``limit``."""
    import numpy as np

    flat = array.ravel()
    flat = flat[np.isfinite(flat)]
    return flat if flat.size <= limit else flat[:: math.ceil(flat.size / limit)]


def _left_out(array: Any, limit: int = 1_000_000) -> str:
    """What a histogram of ``array`` leaves out, for its title: the NaN and ±inf elements (no
    place on an axis), and those that :func:`_sample` skips to draw at most ``limit``.

    >>> import numpy as np
    >>> _left_out(np.array([1.0, np.inf, -np.inf, np.nan])), _left_out(np.ones(3))
    (' (3 NaN or ±inf left out)', '')
    >>> _left_out(np.ones(10), limit=4)
    ' (1 in 3 drawn)'
    """
    import numpy as np

    finite = int(np.isfinite(array).sum())
    notes = [f"{array.size - finite} NaN or ±inf left out"] if finite < array.size else []
    if finite > limit:
        notes.append(f"1 in {math.ceil(finite / limit)} drawn")  # as _sample takes them
    return f" ({'; '.join(notes)})" if notes else ""


def _histogram(summary: KeySummary, first: Any, last: Any, what: str = "") -> Any:
    import numpy as np

    fig = _figure(6.4, 4.0)
    ax = fig.add_axes((0.12, 0.13, 0.84, 0.72))
    data = _sample(last)
    earlier = None if first is None else _sample(first)
    bins = max(10, min(100, int(math.sqrt(max(data.size, 1)))))
    # The bins span every finite element, not the sample's only: a large value's outliers stay on the axis.
    low, high = math.inf, -math.inf
    for array in (last,) if first is None else (last, first):
        finite = np.isfinite(array)
        low = min(low, float(array.min(initial=math.inf, where=finite)))
        high = max(high, float(array.max(initial=-math.inf, where=finite)))
    low, high = (low, high) if low <= high else (0.0, 1.0)
    largest = max(abs(low), abs(high))
    if (high - low) / bins <= 4 * math.ulp(largest):
        # One number, or numbers too close for bins between them (from 2**53, low + 1 == low):
        # bins around them, as wide as their size allows.
        middle, spread = low / 2 + high / 2, max(0.5, largest * 2.0**-20)
        low, high = max(middle - spread, -sys.float_info.max), min(middle + spread, sys.float_info.max)
    # In units of a power of two where the span overflows (-1e308 and 1e308): matplotlib's ticks
    # need it finite. A power of two divides exactly: no value changes its bin.
    shift = 0 if math.isfinite(high - low) else math.frexp(largest)[1]
    edges = np.linspace(math.ldexp(low, -shift), math.ldexp(high, -shift), bins + 1)
    if shift:
        data = np.ldexp(data, -shift)
        earlier = None if earlier is None else np.ldexp(earlier, -shift)
    # Values that share a step are told apart as the first and the last saved.
    shared = _shared_steps(summary.steps) is not None
    if earlier is not None:
        counts, _ = np.histogram(earlier, edges)
        # The title speaks for the last step; the first step's own NaN/±inf are named in its label.
        first_label = (
            f"first value (step {summary.steps[0]})" if shared else f"step {summary.steps[0]} (first)"
        )
        ax.stairs(
            counts, edges, fill=True, alpha=0.45, color="tab:gray", label=first_label + _left_out(first)
        )
    counts, _ = np.histogram(data, edges)
    low_step, high_step = min(summary.steps), max(summary.steps)
    if what:  # every step's one number
        label = f"step {low_step}" if low_step == high_step else f"steps {low_step}..{high_step}"
    else:
        label = f"last value (step {summary.steps[-1]})" if shared else f"step {summary.steps[-1]}"
    ax.stairs(counts, edges, fill=True, alpha=0.7, color="tab:blue", label=label)
    if data.size > 1000:
        ax.set_yscale("symlog", linthresh=1)
    ax.set_xlabel(f"value / 2**{shift}" if shift else "value")
    ax.set_ylabel("count")
    ax.legend(fontsize=8)
    # Every element counted, those left out named: two infinities are not "0 elements".
    what = (what or f"histogram of {last.size} element(s)") + _left_out(last)
    ax.set_title(_title(summary, what), fontsize=9)
    return fig


def _step_stats(array: Any) -> Tuple[float, float, float, float, int]:
    """(mean, min, max, std, size) of one step's finite elements (NaN where it has none), for
    :func:`_over_steps`: taken as each step is read, so no step's array outlives its turn.

    >>> import numpy as np
    >>> _step_stats(np.array([1.0, 3.0, np.inf]))
    (2.0, 1.0, 3.0, 1.0, 3)
    >>> _step_stats(np.array([1e308, 1.5e308]))[:4]  # (their sum overflows)
    (1.25e+308, 1e+308, 1.5e+308, 2.5e+307)
    """
    import numpy as np

    flat = array.ravel()
    flat = flat[np.isfinite(flat)]  # every one: a sample's min..max band misses a step's outliers
    if not flat.size:
        return (math.nan, math.nan, math.nan, math.nan, int(array.size))
    low, high = float(flat.min()), float(flat.max())
    largest = max(-low, high)
    if largest <= 2.0**500:
        return (float(flat.mean()), low, high, float(flat.std()), int(array.size))
    # Numbers near float64's largest overflow a sum and a square: taken on the numbers scaled
    # down by a power of two (exactly), then scaled back.
    exponent = math.frexp(largest)[1]
    scaled = np.ldexp(flat, -exponent)
    with np.errstate(over="ignore"):
        mean, std = (float(np.ldexp(part, exponent)) for part in (scaled.mean(), scaled.std()))
    return (mean, low, high, std, int(array.size))


def _shared_steps(steps: Sequence[int]) -> Optional[str]:
    """How a picture's title names ``steps`` where values share one (a local recorded in a loop
    and saved at one step, two runs saved into one directory); None where each has its own.

    >>> _shared_steps([0, 0, 0]), _shared_steps([0, 1, 0, 1]), _shared_steps([5, 9, 2])
    ('all at step 0', 'steps 0..1, repeated', None)
    """
    if len(set(steps)) == len(steps):
        return None
    low, high = min(steps), max(steps)
    return f"all at step {low}" if low == high else f"steps {low}..{high}, repeated"


def _over_steps(summary: KeySummary, stats: List[Tuple[float, float, float, float, int]]) -> Any:
    """The value over steps: ``stats`` are each step's :func:`_step_stats`, in save order; over
    the values in save order where values share a step (a line over one step would be vertical)."""
    import numpy as np

    shared = _shared_steps(summary.steps[: len(stats)])
    if shared is None:
        steps = np.array(summary.steps[: len(stats)], dtype=float)
        # In the order of the steps, not of saving (a second run into the directory adds its own).
        order = np.argsort(steps, kind="stable")
        steps = steps[order]
    else:
        order = np.arange(len(stats))
        steps = order.astype(float)
    mean, low, high, std = (np.array([stats[k][i] for k in order]) for i in range(4))
    marker = "o" if len(stats) <= 60 else None
    fig = _figure(6.4, 4.0)
    ax = fig.add_axes((0.12, 0.13, 0.84, 0.72))
    if max(one[4] for one in stats) > 1:
        ax.fill_between(steps, low, high, color="tab:blue", alpha=0.15, label="min..max")
        ax.fill_between(steps, mean - std, mean + std, color="tab:blue", alpha=0.3, label="mean +/- std")
        ax.plot(steps, mean, marker=marker, markersize=3, color="tab:blue", label="mean")
        ax.legend(fontsize=8)
    else:
        ax.plot(steps, mean, marker=marker, markersize=3, color="tab:blue")
    _integer_ticks(ax.xaxis)
    ax.set_xlabel("step" if shared is None else "value, in saved order (0: the first)")
    ax.set_ylabel("value")
    what = (
        f"over {len(stats)} saved steps" if shared is None else f"over {len(stats)} saved values ({shared})"
    )
    ax.set_title(_title(summary, what), fontsize=9)
    return fig


def _pictures(summary: KeySummary, max_maps: int) -> List[Tuple[str, Any]]:
    """``(kind, figure)`` for one key; nothing for values that are not numeric arrays."""
    import numpy as np

    if not summary.numeric:
        return []
    # One step's float64 copy at a time (with the first, which the histogram overlays): a long
    # key of large tensors needs no float64 copy of itself whole.
    first = last = None
    stats: List[Tuple[float, float, float, float, int]] = []
    numbers: Optional[List[Any]] = []  # each step's one number, where every step has one
    for value in summary.values:
        last = _numpy_array(value)
        if last is None:
            return []
        if first is None:
            first = last
        stats.append(_step_stats(last))
        if numbers is not None and last.size == 1:
            numbers.append(last.ravel())
        else:
            numbers = None
    assert first is not None and last is not None  # (a summary holds a value at least)
    out: List[Tuple[str, Any]] = []
    if last.ndim == 4 and last.shape[2] * last.shape[3] > 1 and last.size:
        note = f"sample 0 of {last.shape[0]}" if last.shape[0] > 1 else "sample 0"
        out.append(("maps", _feature_maps(summary, last[0], note, max_maps)))
    elif last.ndim == 3 and last.shape[1] * last.shape[2] > 1 and last.size:
        out.append(("maps", _feature_maps(summary, last, "C x H x W", max_maps)))
    elif last.ndim == 4 and last.size:
        out.append(("heatmap", _heatmap(summary, last.reshape(last.shape[0], -1), "N x C (1 x 1 maps)")))
    elif last.ndim == 2 and last.size:
        out.append(("heatmap", _heatmap(summary, last, "x".join(map(str, last.shape)))))
    repeated = len(stats) > 1
    shared = _shared_steps(summary.steps)
    if numbers is not None:
        if repeated:  # one number per step: the distribution of those numbers
            out.append(
                (
                    "hist",
                    _histogram(
                        summary,
                        None,
                        np.concatenate(numbers),
                        f"histogram of the values of {len(stats)} steps"
                        if shared is None
                        else f"histogram of {len(stats)} saved values ({shared})",
                    ),
                )
            )
    else:
        out.append(("hist", _histogram(summary, first if repeated else None, last)))
    if repeated:
        out.append(("steps", _over_steps(summary, stats)))
    return out


def _need_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
        import numpy  # noqa: F401
    except ImportError:
        raise BcrecordError(
            "pictures need matplotlib: pip install 'bcrecord[viz]' (or use --no-plots)"
        ) from None


def _check_max_maps(max_maps: Any) -> None:
    """Refuse a ``max_maps`` that draws no feature map (each grid would fail to draw, and take
    its key's other pictures with it).

    >>> _check_max_maps(0)
    Traceback (most recent call last):
    ...
    bcrecord.errors.BcrecordError: max_maps must be a positive int (feature maps per grid picture), got 0
    """
    if isinstance(max_maps, bool) or not isinstance(max_maps, int) or max_maps < 1:
        raise BcrecordError(
            f"max_maps must be a positive int (feature maps per grid picture), got {max_maps!r}"
        )


def draw(
    summaries: Sequence[KeySummary],
    plot_dir: PathLike,
    max_maps: int = 32,
    progress: Optional[Progress] = None,
    failed: Optional[Dict[str, str]] = None,
) -> Dict[str, List[str]]:
    """Write the PNGs of every key into ``plot_dir``; returns ``{key: [file names]}``.

    Needs matplotlib (``pip install 'bcrecord[viz]'``). With ``failed``, a key whose
    pictures cannot be drawn (values matplotlib cannot place on an axis, such as
    +-1.8e308 together) is noted there, ``{key: why}``, and the others are drawn;
    without it, the error is raised. ``max_maps`` is as :func:`view`'s; ``progress``, where
    given, is advanced once a key is drawn.

    >>> import tempfile, bcrecord
    >>> from bcrecord.viz import draw, summarize
    >>> folder = bcrecord.save({"m:f:x@0": [[1.0, 2.0], [0.5, 4.0]]}, tempfile.mkdtemp())
    >>> draw(summarize(bcrecord.load(folder)), folder)
    {'m:f:x@0': ['m_f_x@0.hist.png', 'm_f_x@0.steps.png']}
    """
    _check_max_maps(max_maps)
    _need_matplotlib()
    plot_dir = Path(plot_dir)
    written: Dict[str, List[str]] = {}
    used: set = set()
    for summary in summaries:
        written[summary.key] = _draw_one(summary, plot_dir, max_maps, used, failed)
        if progress is not None:
            progress.advance(summary.key)
    return written


def _draw_one(
    summary: KeySummary, plot_dir: Path, max_maps: int, used: set, failed: Optional[Dict[str, str]]
) -> List[str]:
    """Write the PNGs of one key (see :func:`draw`); ``used``: the file names taken so far."""
    slug = base = _slug(summary.key)
    n = 1
    # Compared ignoring case: 'C:f:x@0' and 'c:f:x@0' are one file name on macOS and Windows.
    while slug.casefold() in used:
        n += 1
        slug = f"{base}-{n}"
    used.add(slug.casefold())
    files: List[str] = []
    try:
        with warnings.catch_warnings():
            # A key's character that the font lacks is drawn as a box; matplotlib's warning of it
            # came twice a character a picture (the key is shown whole in the table and index.html).
            warnings.filterwarnings("ignore", "Glyph .* missing from font", UserWarning)
            # numpy's and matplotlib's on numbers near float64's largest: what fails is said below.
            warnings.simplefilter("ignore", RuntimeWarning)
            for kind, figure in _pictures(summary, max_maps):
                name = f"{slug}.{kind}.png"
                _save_png(figure, plot_dir / name)
                files.append(name)
    except (ArithmeticError, ValueError, RuntimeWarning) as error:  # matplotlib's and numpy's
        if failed is None:
            raise
        failed[summary.key] = f"{type(error).__name__}: {error}"
    if not files and summary.numeric and failed is not None and summary.key not in failed:
        # Counted, yet not drawn: a tensor numpy cannot read (a wrapper subclass, TwoTensor), which
        # index.html would otherwise call 'one number'.
        drawn = [_drawn_part(value) for value in summary.values]  # (a named tuple's first field)
        large = next((why for why in map(_too_large_to_draw, drawn) if why), None)
        unread = next((v for v in drawn if is_tensor(v) and _numpy_array(v) is None), None)
        if large is not None:
            failed[summary.key] = large
        elif unread is not None:
            failed[summary.key] = f"{_tensor_described(unread)}: its values cannot be read to draw"
    return files


def _save_png(figure: Any, path: Path) -> None:
    """Write ``figure`` to ``path`` as a PNG whole or not at all: into a file beside it, renamed
    once written (a full disk left a PNG cut off), removed if it is not; BcrecordError if not written."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        try:
            figure.savefig(partial, format="png")
            os.replace(partial, path)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            raise
    except OSError as error:
        raise BcrecordError(f"cannot write {path}: {error.strerror or error}") from None


def _tensor_described(tensor: Any) -> str:
    """A tensor by its class, shape and dtype, as far as they can be read (a subclass's may raise).

    >>> import torch
    >>> _tensor_described(torch.zeros(2, 3)), _tensor_described(torch.tensor(1))
    ('a Tensor (2x3 float32)', 'a Tensor (scalar int64)')
    """
    name = type(tensor).__name__
    shape = _shape(tensor)
    try:
        dtype = str(tensor.dtype).removeprefix("torch.")
    except Exception:
        return f"a {name}"
    if shape is None:
        return f"a {name} ({dtype})"
    return f"a {name} ({'x'.join(map(str, shape)) if shape else 'scalar'} {dtype})"


def write_index(
    summaries: Sequence[KeySummary],
    pictures: Dict[str, List[str]],
    plot_dir: PathLike,
    title: str,
    failed: Optional[Mapping[str, str]] = None,
) -> Path:
    """Write ``plot_dir/index.html``: the summary table and every picture, by key.

    ``failed``: why a key's pictures could not be drawn (see :func:`draw`), shown for it.

    >>> import tempfile
    >>> from bcrecord.viz import KeySummary, write_index
    >>> summary = KeySummary("m:f:x@0", [0], [2.0], (), False, "float", 2.0, 2.0, 2.0)
    >>> page = write_index([summary], {"m:f:x@0": ["x.hist.png"]}, tempfile.mkdtemp(), "run 1")
    >>> text = page.read_text()
    >>> page.name, '<img src="x.hist.png"' in text, "<title>run 1</title>" in text
    ('index.html', True, True)
    """
    head = ("key", "steps", "shape", "dtype", "min", "mean", "max")
    rows = []
    sections = []
    for i, summary in enumerate(summaries):
        cells = summary.row()
        anchor = f"k{i}"
        link = f'<a href="#{anchor}">{html.escape(cells[0])}</a>'
        rows.append("<tr><td>" + "</td><td>".join([link, *map(html.escape, cells[1:])]) + "</td></tr>")
        images = "".join(
            f'<img src="{quote(name)}" alt="{html.escape(name)}" title="{html.escape(name)}">'
            for name in pictures.get(summary.key, [])
        )
        if failed and summary.key in failed:
            images += f"<p class=none>could not draw it: {html.escape(failed[summary.key])}</p>"
        if not images:  # a numeric one drew nothing: one number saved once, or no elements
            if summary.numeric:
                why = "nothing to draw (one number, or no elements): see the table"
            elif summary.numbers:  # (a loss that diverged)
                why = "no number to draw (every element is NaN, or there are none)"
            else:
                why = "not a numeric value"
            images = f"<p class=none>no picture: {why}</p>"
        sections.append(f'<section id="{anchor}"><h2>{html.escape(cells[0])}</h2>{images}</section>')
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; font-family: monospace; }}
img {{ max-width: 48%; margin: 0.3em; border: 1px solid #eee; vertical-align: top; }}
.none {{ color: #888; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>
{chr(10).join(rows)}
</table>
{chr(10).join(sections)}
</body></html>
"""
    path = Path(plot_dir) / "index.html"
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as error:
        raise BcrecordError(f"cannot write {path}: {error.strerror or error}") from None
    return path


def _prepare(plot_dir: Path) -> None:
    """Make ``plot_dir`` and remove the pictures an earlier ``view`` left there (those its
    ``index.html`` shows: a picture put there otherwise stays)."""
    try:
        plot_dir.mkdir(parents=True, exist_ok=True)
        index = plot_dir / "index.html"
        if index.is_file():
            drawn = re.findall(r'<img src="([^"/]+\.png)"', index.read_text(errors="replace"))
            for name in dict.fromkeys(unquote(found) for found in drawn):
                old = plot_dir / name
                if old.parent == plot_dir and old.is_file():
                    old.unlink()
            index.unlink()
    except OSError as error:
        why = error.strerror or str(error)
        if plot_dir.exists() and not plot_dir.is_dir():  # (mkdir's 'File exists' said of a file)
            why = "a file is there, not a folder (move it away)"
        raise BcrecordError(f"cannot write pictures to {plot_dir}: {why} (or use --no-plots)") from None


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread meanwhile: recorded tensors are small, and threads only contend."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def view(
    directory: PathLike,
    *,
    plots: bool = True,
    keys: Union[str, Iterable[str], None] = None,
    progress: Optional[bool] = None,
    max_maps: int = 32,
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
) -> int:
    """Print the summary table of ``directory``; with ``plots``, write ``directory/plots``. Returns 0.

    ``keys`` is a glob pattern (``'layer1.*'``) or several; the pictures an earlier ``view`` drew
    are removed first, so ``plots`` then holds only those keys' pictures. ``progress``
    forces the progress bar on or off (default: on when ``err`` is a terminal). ``max_maps``
    is how many feature maps a grid picture shows (a positive int). The table goes to ``out``,
    the progress bar and notes to ``err`` (default: ``sys.stdout`` and ``sys.stderr``).

    >>> import io, tempfile, bcrecord
    >>> from bcrecord.viz import view
    >>> folder = tempfile.mkdtemp()
    >>> _ = bcrecord.save({"m:f:name@0": ["abc"]}, folder)
    >>> view(folder, plots=False, out=io.StringIO())
    0
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    # Checked before anything is read or removed: plots='no' would draw.
    require_bool("plots", plots, error=BcrecordError)
    if progress is not None:
        require_bool("progress", progress, error=BcrecordError)
    _check_max_maps(max_maps)  # now: the plots folder is cleared before anything is drawn
    directory = _expanded(directory)  # '~/runs' as load() reads it; '' refused as there
    if directory.exists() and not directory.is_dir():
        raise BcrecordError(f"{str(directory)!r} is not a directory")
    if not directory.is_dir():
        raise BcrecordError(f"no such directory: {str(directory)!r}")
    keys = _patterns(keys)
    sizes = _sizes(iter_saved_index(directory))  # (the index read a save at a time, not held whole)
    saved = list(sizes)
    matching = [key for key in saved if keys is None or any(fnmatch.fnmatchcase(key, k) for k in keys)]
    if keys is not None and not matching:
        raise BcrecordError(_no_match(keys, saved))
    for note in _glob_notes(keys or (), matching):
        print(f"bcrecord view: {note}", file=err)
    if not matching:
        print(f"{directory}: no records", file=out)
        return 0
    plot_dir = directory / "plots"
    missing: Optional[BcrecordError] = None
    if plots:
        try:
            _need_matplotlib()
            _prepare(plot_dir)
        except BcrecordError as error:  # said after the table, which needs neither (a read-only DIR)
            plots, missing = False, error
    shown = bool(err.isatty()) if progress is None else progress
    bar = Progress(len(matching), "bcrecord view: drawing", err, enabled=plots and shown)
    summaries: List[KeySummary] = []
    pictures: Dict[str, List[str]] = {}
    failed: Dict[str, str] = {}
    notes: List[str] = []
    used: set = set()
    try:
        # A group of keys at a time (only the matching keys' values are read: another key's
        # data file may be damaged), each group's values let go once summarized and drawn: a
        # long run of large tensors needs the memory of a group, not of the run.
        for group in _groups(sizes, matching):
            loaded = _load_noting_damage(directory, group, notes)
            with _one_thread():
                for summary in summarize(loaded):
                    if plots:
                        try:
                            pictures[summary.key] = _draw_one(summary, plot_dir, max_maps, used, failed)
                        except BcrecordError as error:  # a picture not written (full disk): after the table
                            plots, missing = False, error
                        else:
                            bar.advance(summary.key)
                    summary.values = []
                    summaries.append(summary)
            del loaded
    finally:
        bar.close()
    for note in notes:
        print(f"bcrecord view: {note}", file=err)
    if not summaries:
        print(f"{directory}: no records", file=out)
        return 0
    # Before the table: one cut short (`bcrecord view DIR | head`) must not leave the pictures
    # without their index, which the next view reads to remove them.
    index_page = None
    if plots and missing is None:
        try:
            index_page = write_index(summaries, pictures, plot_dir, f"bcrecord records: {directory}", failed)
        except BcrecordError as error:  # (said after the table, as a picture not written is)
            missing = error
    print(table(summaries, getattr(out, "encoding", None)), file=out)
    if missing is not None:
        raise missing
    if index_page is None:
        return 0
    for key, why in failed.items():
        print(f"bcrecord view: could not draw {key}: {why}", file=err)
    count = sum(len(files) for files in pictures.values())
    print(f"\n{count} picture(s) in {plot_dir}; open {index_page}", file=out)
    return 0


#: How many bytes of values (as the index counts them) :func:`view` reads at once: keys are read
#: in groups of up to this size (a key larger than this alone), each let go before the next.
_READ_AT_ONCE = 256 << 20
#: What a value of no known size (a pickled object other than an array) counts as.
_UNKNOWN_SIZE = 1 << 10


def _sizes(index: Iterable[Mapping[str, Any]]) -> Dict[str, int]:
    """The bytes of each key's values as the ``index`` rows count them, the keys in the order
    first saved (a value of no known size counts :data:`_UNKNOWN_SIZE`).

    >>> _sizes([{"key": "a", "bytes": 8}, {"key": "b", "bytes": None}, {"key": "a", "bytes": 4}])
    {'a': 12, 'b': 1024}
    """
    sizes: Dict[str, int] = {}
    for row in index:
        size = row.get("bytes")
        sizes[row["key"]] = sizes.get(row["key"], 0) + (
            size if type(size) is int and size >= 0 else _UNKNOWN_SIZE
        )
    return sizes


def _groups(sizes: Mapping[str, int], keys: Sequence[str]) -> List[List[str]]:
    """``keys`` in order, in groups whose values (their ``sizes``) are at most
    :data:`_READ_AT_ONCE` bytes (a key of more alone).

    >>> _groups({"a": 200 << 20, "b": 50 << 20, "c": 300 << 20, "d": 1024}, ["a", "b", "c", "d"])
    [['a', 'b'], ['c'], ['d']]
    """
    groups: List[List[str]] = []
    total = 0
    for key in keys:
        if not groups or total + sizes[key] > _READ_AT_ONCE:
            groups.append([])
            total = 0
        groups[-1].append(key)
        total += sizes[key]
    return groups


def _load_noting_damage(directory: Path, keys: List[str], notes: List[str]) -> Loaded:
    """``load(directory, keys)``, what it warns of a damaged data file added to ``notes``
    (said as one line each, as the rest of ``view``'s report is); keys whose tensors need
    torch where it is missing are left out, and said so."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DamagedRecords)
        try:
            loaded = load(directory, keys=keys)
        except TensorsNeedTorch as error:
            # The load without the tensors says what is damaged, of what it reads; the program's
            # own warnings (a module warning as it is imported) are kept.
            caught[:] = [warning for warning in caught if not issubclass(warning.category, DamagedRecords)]
            # (A core-only interpreter reading a torch program's records: the index says which
            # keys have values in tensor files.)
            wanted = set(keys)
            tensors = {
                row["key"]
                for row in iter_saved_index(directory)
                if row["key"] in wanted and str(row.get("file", "")).endswith(".safetensors")
            }
            left = [key for key in keys if key in tensors]
            notes.append(
                f"{len(left)} key(s) hold tensors, which showing needs {error.needs}: {listed(left)}"
            )
            loaded = load(directory, keys=[key for key in keys if key not in tensors])
    for warning in caught:
        if issubclass(warning.category, DamagedRecords):
            notes.append(str(warning.message))
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return loaded
