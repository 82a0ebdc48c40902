"""Saving recordings to a directory, and :func:`load` to read them back.

Format (one directory, any number of saves into it; a directory given as ``~/runs`` is
the one under the home directory):

* ``index.json`` — ``{"format": "bcrecord-records", "version": 2}``: what the
  directory is.
* ``index.jsonl`` — the index: one line per save, ``{"entries": [...]}``, one entry
  per value: ``key``, ``step``, ``file``, ``name`` (inside that file), ``kind``
  (``"tensor"`` or ``"pickle"``), ``shape``, ``dtype``, ``device``, ``bytes`` and
  ``time`` (seconds since the epoch). A save appends its line, so a long run's
  thousandth save costs what its first did.
* ``records/NNNNNN.safetensors`` — the tensors of one save (needs the
  ``safetensors`` package: ``pip install 'bcrecord[save]'``); a save whose header would pass
  the 100 MB that safetensors reads (a million scalars) fills several, numbered on;
* ``records/NNNNNN.pkl`` — every other value of that save, pickled.

Version 1 directories (every entry in ``index.json``, from bcrecord 0.1's first
saves) load as they are; a :class:`Writer` moves their entries to ``index.jsonl``.

Writes are atomic: each data file is written under a temporary name and renamed,
and the index line is appended last, in one write; a line cut short by a crash has
no newline, and readers ignore it (the next save trims it). So a crash never leaves
a save that :func:`load` accepts half-written; at most the save in progress is lost.
The temporary file a save killed mid-write leaves (``records/.NNNNNN.pkl.tmp``, which
:func:`load` ignores) is replaced or removed by the next save, which writes that number's files.
A full disk or an unwritable
directory raises :class:`StorageError` naming the directory. A data file damaged later (cut
short, emptied) loses only the values it no longer holds whole: :func:`load` warns
(:class:`DamagedRecords`) and returns the rest. Saves into one directory
from several writers or processes at once (``bcrecord run -o DIR`` on each rank) take
turns under a lock file (``records/.lock``; on systems without ``fcntl``, or on a file
system without file locks, saves of one process at a time only), each first reading what
the others appended. Tensors that ``safetensors`` cannot store (``complex128``, sparse,
quantized or nested tensors) are pickled instead, and so are other packages' tensor subclasses
(torchvision's ``BoundingBoxes``: they load with their class and attributes) and torch's own
wrapper subclasses (``MaskedTensor``: its data and mask). Every tensor
pickled, alone or inside another value (a tuple, a dict, a dataclass), is saved detached and on the
CPU (it loads on a machine without a GPU), a view without the rest of its storage, in
``torch.save``'s form where torch cannot read its pickle back (``complex32``). A value a save
cannot hold at all (a tensor of ``vmap`` or of a fake mode, a ``uint4`` tensor) raises
:class:`UnsavableValue` naming its key, or is saved as its repr (see :meth:`Writer.write_many`).

>>> import tempfile, bcrecord
>>> folder = tempfile.mkdtemp()
>>> with bcrecord.recording() as rec:
...     rec.add("m:f:x@0", 1.5)
>>> _ = bcrecord.save(rec, folder, step=3)
>>> loaded = bcrecord.load(folder)
>>> loaded["m:f:x@0"], loaded.steps("m:f:x@0")
([1.5], [3])
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import copyreg
import errno
import importlib.util
import io
import itertools
import json
import numbers
import operator
import os
import pickle
import re
import reprlib
import shutil
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
    cast,
)

from .errors import BcrecordError, did_you_mean, listed
from .specs import require_bool

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock between processes
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "StorageError",
    "UnsavableValue",
    "TensorsNeedTorch",
    "DamagedRecords",
    "Writer",
    "Loaded",
    "save",
    "load",
    "saved_keys",
    "saved_index",
    "iter_saved_index",
]

FORMAT = "bcrecord-records"
VERSION = 2
#: Versions :func:`load` reads (1: every entry in index.json itself).
_READABLE = (1, 2)
_JOURNAL = "index.jsonl"
#: How many of the journal's first bytes tell one journal from another made in its place.
_HEAD = 256
#: How every line of the journal starts (``json.dumps({"entries": ...})``).
_SAVE_LINE_START = b'{"entries": '
PathLike = Union[str, "os.PathLike[str]"]


class StorageError(BcrecordError, OSError):
    """Records could not be written or read (unwritable directory, full disk, bad index)."""


class TensorsNeedTorch(StorageError):
    """A data file holds tensors, and what loading them needs is missing here; ``needs`` says
    what (``'torch (pip install torch)'``)."""

    def __init__(self, path: Path, needs: str, them: str) -> None:
        super().__init__(
            f"{path} holds tensors: loading them needs {needs}; bcrecord.load(DIR, keys=[...]) reads "
            f"the other keys without {them}"
        )
        self.needs = needs


class UnsavableValue(StorageError):
    """A value cannot be saved (a meta tensor's data, an object pickle refuses): its key
    and step are named, and the save it was in wrote nothing."""


class DamagedRecords(UserWarning):
    """:func:`load` read a damaged data file (cut short, emptied, overwritten in part): it names
    the file and the values lost, and the file's intact values load all the same.

    To refuse such a directory instead, make the warning an error:
    ``warnings.simplefilter("error", bcrecord.storage.DamagedRecords)``.
    """


#: Told of each value a save keeps as its repr: ``(key, step, why)``.
Unsavable = Callable[[str, int, str], None]


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (a program's own subclass too), without importing torch.

    >>> is_tensor([1.0])
    False
    """
    tensor = getattr(sys.modules.get("torch"), "Tensor", None)  # (none exists before torch is imported)
    # Asked of the type: a nested tensor's shape raises; a mock's __class__ may say anything.
    return isinstance(tensor, type) and issubclass(type(value), tensor)


#: Per tensor dtype, whether safetensors stores it (asked once per dtype).
_safetensors_dtypes: Dict[Any, bool] = {}
#: Dtypes no safetensors release stores: pickled where safetensors is not installed too, which needs it not.
_NEVER_IN_SAFETENSORS = frozenset({"complex128", "complex32"})


def _in_safetensors(tensor: Any) -> bool:
    """Whether ``tensor`` goes to the safetensors file: a dense tensor of a dtype it stores, of
    torch's own classes. Another package's subclass (torchvision's ``BoundingBoxes``, whose
    ``format`` and ``canvas_size`` say what its numbers mean) is pickled: safetensors keeps the
    numbers alone, and it would load as a plain tensor. So is a wrapper subclass of torch's own
    (its own ``__torch_dispatch__``: a ``MaskedTensor``), whose data safetensors cannot reach."""
    kind = type(tensor)
    if kind.__module__.partition(".")[0] != "torch":
        return False
    if kind.__torch_dispatch__ is not sys.modules["torch"].Tensor.__torch_dispatch__:
        return False
    if tensor.is_sparse or tensor.is_quantized or tensor.is_nested or str(tensor.layout) != "torch.strided":
        return False
    dtype = tensor.dtype
    known = _safetensors_dtypes.get(dtype)
    if known is None:
        try:
            import torch
            from safetensors.torch import save as save_tensors
        except ImportError:  # reported when the save needs it (a dtype that goes there wherever it can)
            return str(dtype).removeprefix("torch.") not in _NEVER_IN_SAFETENSORS
        try:
            save_tensors({"probe": torch.zeros(1, dtype=dtype)})
            known = True
        except Exception:  # complex128, complex32 in today's safetensors
            known = False
        _safetensors_dtypes[dtype] = known
    return known


def _describe(value: Any) -> Dict[str, Any]:
    if is_tensor(value):
        return {
            "kind": "tensor" if _in_safetensors(value) else "pickle",
            "shape": None if value.is_nested else list(value.shape),  # nested: no one shape
            "dtype": str(value.dtype).replace("torch.", ""),
            "device": str(value.device),
            "bytes": int(value.element_size() * value.nelement()),
        }
    shape = _attribute(value, "shape")
    size = _attribute(value, "nbytes")  # numpy arrays and scalars
    dtype = _attribute(value, "dtype")
    try:
        dtype = type(value).__name__ if dtype is None else str(dtype)
    except Exception:  # (a str() that raises)
        dtype = type(value).__name__
    return {
        "kind": "pickle",
        # Plain ints for the index's JSON (a shape may hold numpy's).
        "shape": [int(n) for n in shape]
        if isinstance(shape, tuple) and all(isinstance(n, numbers.Integral) for n in shape)
        else None,
        "dtype": dtype,
        "device": None,
        "bytes": size if type(size) is int else None,
    }


def _attribute(value: Any, name: str) -> Any:
    """``value.name`` for the index, None where it is missing or raises: an object whose
    ``shape`` is a property that raises (not materialized yet) is pickled all the same."""
    try:
        return getattr(value, name, None)
    except Exception:
        return None


@contextlib.contextmanager
def _writing(directory: Path) -> Iterator[None]:
    """An ``OSError`` inside (full disk, unwritable directory) as a StorageError naming ``directory``."""
    try:
        yield
    except StorageError:
        raise
    except OSError as error:
        where = f" ({error.filename})" if error.filename and error.strerror else ""
        why = error.strerror or str(error)
        link = error.filename
        if isinstance(error, FileExistsError) and isinstance(link, str) and os.path.islink(link):
            # A dangling link: 'File exists' where mkdir meets it, yet nothing is there.
            why, where = f"{link} is a link to {os.readlink(link)}, which does not exist", ""
        in_the_way = (
            _file_in_the_way(Path(os.fsdecode(link))) if isinstance(error, NotADirectoryError) else None
        )
        if in_the_way is not None:  # (the path named may be a staging folder's, of a name nobody gave)
            why, where = f"{'it' if in_the_way == directory else in_the_way} is a file, not a folder", ""
        raise StorageError(f"cannot write records to {directory}: {why}{where}") from None


def _file_in_the_way(path: Path) -> Optional[Path]:
    """The first of the folders above ``path``, and ``path``, that is there and is not a folder
    (what 'Not a directory' is about where ``path`` is made or opened), None if none is.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> (folder / "notes").touch()
    >>> _file_in_the_way(folder / "notes" / "run" / "records") == folder / "notes", _file_in_the_way(folder)
    (True, None)
    """
    for above in [*reversed(path.parents), path]:
        if os.path.lexists(above) and not above.is_dir():
            return above
    return None


#: What ``flock`` raises on a file system without file locks (Lustre mounted without
#: ``-o flock``, NFS without its lock daemon, some FUSE file systems).
_NO_FILE_LOCKS = {
    getattr(errno, name) for name in ("ENOSYS", "ENOLCK", "EOPNOTSUPP", "ENOTSUP") if hasattr(errno, name)
}
#: The directories said to be without file locks (once each).
_unlocked: set = set()


@contextlib.contextmanager
def _turn(directory: Path) -> Iterator[None]:
    """Hold the directory's lock file: saves from other processes wait meanwhile.

    On a file system without file locks, saves go on without it (with a warning): as on
    a system without ``fcntl``, one process at a time may save into the directory.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    with open(directory / "records" / ".lock", "a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError as error:
            if error.errno not in _NO_FILE_LOCKS:
                raise
            if directory not in _unlocked:
                _unlocked.add(directory)
                warnings.warn(
                    f"{directory} is on a file system without file locks ({error.strerror or error}): "
                    "saves into it from several processes at once would overwrite each other's files; "
                    "give each process a directory of its own",
                    RuntimeWarning,
                    stacklevel=1,
                )
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _temporary(path: Path) -> Path:
    """Where ``path`` is written before it is renamed: one name per file, not per write.

    Every write holds the directory's lock (:func:`_turn`), so no other process is writing
    it meanwhile; and what a save killed mid-write leaves the next save removes (it reuses the
    killed save's file numbers: its index line was never written; see :func:`_remove_leftovers`),
    so none piles up.

    >>> _temporary(Path("runs/records/000007.pkl")).as_posix()
    'runs/records/.000007.pkl.tmp'
    """
    return path.with_name(f".{path.name}.tmp")


def _atomic_write(path: Path, data: Union[bytes, Sequence[Any]], unlocked: bool = False) -> None:
    """Write ``path`` whole: a reader finds the old file or the new one. ``data``: bytes, or
    buffers written one after another (a tensor's memory, written without a copy of it).
    ``unlocked``: written without the directory's lock (a header before there is a lock), through
    a temporary file of this write's own, named as :func:`_staging` names (a dead writer's is
    removed by the next one)."""
    tmp = _temporary(path)
    if unlocked:
        tmp = tmp.with_name(f"{tmp.stem}.{_HOST}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    # Made anew (another user's, left by a killed save, is replaced, not written through). Not
    # mkstemp: its files are private (0600); these get the umask's mode, as open() gives.
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        parts: Sequence[Any] = [data] if isinstance(data, bytes) else data
        with os.fdopen(fd, "wb") as handle:
            for part in parts:
                handle.write(part)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _sync_directory(directory: Path) -> None:
    """Make the names renamed into ``directory`` durable: a file's own fsync does not
    cover its directory entry, so after a power loss the index could name a data file
    that is not there. Where a directory cannot be opened (Windows), its rename is as
    durable as the system makes it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # a file system that cannot sync a directory
        pass
    finally:
        os.close(fd)


def _makeable_later(directory: Path) -> bool:
    """Whether ``directory`` is not there yet, and the nearest folder above it that is there
    is a directory this process may write in: its first save can make it then. (A file or a
    link in its way, an unwritable folder: the writer says so as it is made, now.)

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> _makeable_later(folder / "a" / "b"), _makeable_later(folder)
    (True, False)
    """
    if os.path.lexists(directory):
        return False
    above = directory.parent
    while not os.path.lexists(above) and above != above.parent:
        above = above.parent
    return above.is_dir() and os.access(above, os.W_OK | os.X_OK)


def _pid_namespace() -> str:
    """'-' and this process's pid namespace's number, '' where the system tells none: processes
    of a container under this host's name count their pids apart (its pid 1 is not this host's).

    >>> _pid_namespace() == "" or _pid_namespace()[1:].isdigit()
    True
    """
    try:
        return "-" + re.sub(r"\D", "", os.readlink("/proc/self/ns/pid"))  # ('pid:[4026531836]')
    except OSError:
        return ""


#: This host's name as :func:`_staging` writes it (no dots, which separate its parts), with its pid
#: namespace's number: a writer in another namespace is never taken for a dead one of this.
_HOST = re.sub(r"[^A-Za-z0-9-]", "-", os.uname().nodename if hasattr(os, "uname") else "") or "host"
_HOST += _pid_namespace()


def _staging_start(directory: Path) -> str:
    """How :func:`_staging`'s names for ``directory`` start: ``.NAME.``, NAME cut where it is too
    long for the rest to fit in a name's 255 bytes (a directory's own name may take them all).

    >>> _staging_start(Path("runs/a")), len(_staging(Path("r" * 255)).name) <= 255
    ('.a.', True)
    """
    room = 255 - len(f"..{_HOST}.{'0' * 10}.{'0' * 12}.making")
    return f".{os.fsdecode(os.fsencode(directory.name)[:room])}."


def _staging(directory: Path) -> Path:
    """Where :func:`_make_whole` makes ``directory`` before renaming it there: beside it, named
    for this host and process (a dead writer's is removed by the next one) and made unique.

    >>> name = _staging(Path("runs/a")).name
    >>> name.startswith(".a.") and name.split(".")[3] == str(os.getpid()), name.endswith(".making")
    (True, True)
    """
    return directory.parent / f"{_staging_start(directory)}{_HOST}.{os.getpid()}.{os.urandom(6).hex()}.making"


def _remove_dead_stagings(directory: Path) -> None:
    """Remove what writers of this host killed while making ``directory`` left beside it (their
    :func:`_staging` folders, or an unlocked :func:`_atomic_write`'s file), where their process
    is gone; a live writer's, another host's and any other folder stay.

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp())
    >>> (folder / f".run.{_HOST}.{os.getpid()}.0a1b.making").mkdir()
    >>> _remove_dead_stagings(folder / "run")
    >>> len(os.listdir(folder))
    1
    """
    if os.name != "posix":  # pragma: no cover - (Windows' os.kill(pid, 0) ends the process)
        return
    start = _staging_start(directory)
    try:
        found = [name for name in os.listdir(directory.parent) if name.startswith(start)]
    except OSError:
        return
    for name in found:
        parts = name[len(start) :].split(".")
        if (
            len(parts) != 4
            or parts[0] != _HOST
            or parts[3] not in ("making", "tmp")
            or not parts[1].isdigit()
        ):
            continue  # (another directory's, named 'run.x'; another host's; not one of ours)
        try:
            os.kill(int(parts[1]), 0)
        except ProcessLookupError:
            if parts[3] == "tmp":  # (a file)
                with contextlib.suppress(OSError):
                    os.unlink(directory.parent / name)
            else:
                shutil.rmtree(directory.parent / name, ignore_errors=True)
        except (OSError, OverflowError):  # alive (another user's: PermissionError)
            pass


def _make_whole(directory: Path) -> None:
    """Make ``directory``, with its records folder, journal and header, as a sibling first and
    then renamed into place: a reader (``bcrecord view`` while a run makes its ``-o`` at its first
    save) never finds it without its header. Where another writer made it meanwhile, theirs stays;
    what writers killed while making it left beside it goes (see :func:`_remove_dead_stagings`).

    >>> import tempfile
    >>> folder = Path(tempfile.mkdtemp()) / "a" / "run"
    >>> _make_whole(folder)
    >>> sorted(path.name for path in folder.iterdir()), os.listdir(folder.parent)
    (['index.json', 'index.jsonl', 'records'], ['run'])
    """
    new = [folder for folder in directory.parents if not folder.exists()]
    _remove_dead_stagings(directory)
    staging = _staging(directory)  # (one per writer)
    try:
        (staging / "records").mkdir(parents=True)
        for folder in reversed(new):  # their names in their folders, durable before anything is saved in them
            _sync_directory(folder.parent)
        with open(staging / _JOURNAL, "ab"):
            pass
        _write_header(staging)
        os.rename(staging, directory)  # (onto a directory made meanwhile: refused unless it is empty)
    except OSError:
        if not os.path.isdir(directory):
            raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    _sync_directory(directory.parent)


@dataclass
class _Prepared:
    """A save's values made ready to write: its index entries (each ``file`` its suffix until the
    write numbers it), its tensors laid out as safetensors files (one, or several where one's
    header would pass :data:`_HEADER_LIMIT`; ``part`` says which holds each tensor, by name, where
    it is not the first), its other values pickled."""

    entries: List[Dict[str, Any]]
    tensors: List[Sequence[Any]]
    pickled: Optional[bytes]
    part: Dict[str, int]


def _prepared(batches: Sequence[Tuple[int, List[Tuple[str, Sequence[Any]]]]]) -> _Prepared:
    """``batches`` of ``(step, [(key, values)])`` made ready to write, or an UnsavableValue naming
    the first value a save cannot hold: before the directory is made or a file written, so
    that such a value leaves nothing behind, not even the folders it was to go in.

    >>> ready = _prepared([(3, [("k", [1.5, "text"])])])
    >>> [(row["step"], row["name"], row["file"]) for row in ready.entries], ready.tensors
    ([(3, 'k#3#0', '.pkl'), (3, 'k#3#1', '.pkl')], [])
    """
    tensors: Dict[str, Any] = {}
    others: Dict[str, Any] = {}
    entries: List[Dict[str, Any]] = []
    now = time.time()
    # Values of one (key, step) count on across batches: a step given twice keeps both.
    positions: Dict[Tuple[str, int], int] = {}
    for step, items in batches:
        for key, values in items:
            for value in values:
                position = positions[(key, step)] = positions.get((key, step), -1) + 1
                name = _name(key, step, position)
                while name in tensors or name in others:  # an escaped key's name is another's too
                    name += "'"
                try:
                    info = _describe(value)
                    if info["kind"] == "tensor":
                        # (no copy of the data but where needed: a save of a tensor held no
                        # more than the tensor; conj and neg views are resolved, as bytes)
                        tensors[name] = value.detach().cpu().contiguous().resolve_conj().resolve_neg()
                        suffix = ".safetensors"
                    else:
                        # (a tensor as it is: the pickler detaches it and moves it to the CPU,
                        # keeping its class, which .cpu() of a torchvision tv_tensor drops)
                        others[name] = value
                        suffix = ".pkl"
                except Exception as error:  # a meta tensor has no data to save
                    raise UnsavableValue(
                        f"cannot save {_cut(repr(key), 200)} (step {step}): {type(error).__name__}: {error}"
                    ) from None
                entries.append({"key": key, "step": step, "file": suffix, "name": name, **info, "time": now})
    # Pickled before the tensors are laid out, as the save failed before (the same value blamed).
    pickled = _pickled(others, entries) if others else None
    parts = _header_parts(tensors, entries) if tensors else []
    part = {name: number for number, group in enumerate(parts) if number for name in group}
    return _Prepared(entries, [_safetensors(group, entries) for group in parts], pickled, part)


#: The largest header a safetensors file of a save may have: safetensors refuses to read a
#: larger one (its ``MAX_HEADER_SIZE``), so a save of more tensors (a million scalars, one key's
#: values of a long run flushed at once) puts them in several files, each numbered as a save's.
_HEADER_LIMIT = 100_000_000


def _header_parts(tensors: Dict[str, Any], entries: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``tensors`` in groups, in order, each of which a safetensors file holds with a header under
    :data:`_HEADER_LIMIT` (counted from above: names as JSON escapes them, every dimension and
    offset 20 digits); an UnsavableValue for a tensor whose name alone passes it."""
    room = _HEADER_LIMIT - 64  # (its braces, its padding to 8 bytes)
    parts: List[Dict[str, Any]] = [{}]
    used = 0
    for name, tensor in tensors.items():
        # ':{"dtype":"","shape":[],"data_offsets":[,]},' and a dtype's name: under 64 bytes.
        size = _json_length(name) + 22 * len(tensor.shape) + 64 + 2 * 20
        if size > room:
            row = next(row for row in entries if row["name"] == name)
            raise UnsavableValue(
                f"cannot save {_cut(repr(row['key']), 200)} (step {row['step']}): its name is too long for a "
                f"safetensors header, which holds at most {_HEADER_LIMIT} bytes"
            )
        if used + size > room:
            parts.append({})
            used = 0
        parts[-1][name] = tensor
        used += size
    return parts


class Writer:
    """Appends saves to a records directory; safe to call from one thread at a time.

    ``last_step`` is the highest step saved in the directory (read when asked), so
    that a resumed run can number on.

    >>> import tempfile, bcrecord
    >>> writer = bcrecord.storage.Writer(tempfile.mkdtemp())
    >>> writer.last_step, writer.write({"k": [1, 2]}, step=4), writer.last_step
    (None, 2, 4)
    """

    def __init__(self, directory: PathLike, check: bool = True, make: bool = True) -> None:
        """``check``: read every save the index holds now, as :func:`load` does, and refuse
        a damaged one (a save added would be refused with it); False reads only the last,
        for a writer made per save (:func:`save`), which would otherwise read them all each time.

        ``make``: False leaves a directory that is not there yet to the first save to make
        (``bcrecord run``: a run that records nothing leaves no empty folder), where the
        nearest folder that is there is a writable directory; anything else is checked (and
        made) now, as with True. :attr:`made` says whether it is made.

        >>> import tempfile, bcrecord
        >>> writer = bcrecord.storage.Writer(Path(tempfile.mkdtemp()) / "run", make=False)
        >>> writer.made, writer.directory.exists(), writer.write({"k": [1]}, step=0), writer.made
        (False, False, 1, True)
        """
        require_bool("check", check, error=TypeError)  # ('no' would check)
        require_bool("make", make, error=TypeError)
        # Absolute: a program may change its working directory (Hydra does) between saves.
        try:
            self.directory = _expanded(directory).absolute()
        except FileNotFoundError:  # (os.getcwd's, for a relative path)
            raise StorageError(
                f"cannot write records to {os.fspath(directory)}: it is relative to the working "
                "directory, which was removed"
            ) from None
        self._lock = threading.Lock()
        #: Which journal this writer has read (its first bytes, as far as read: a journal
        #: made again, even in the same inode, starts otherwise), how much of it, and the
        #: next data file's number.
        self._journal: Optional[bytes] = None
        self._read = 0
        self._next_file = 1
        self._check = check
        parent = self.directory.parent
        if self.directory.name == "records" and ((parent / _JOURNAL).exists() or _is_saved_run(parent)):
            # Its own records/ and index would nest inside the run's, which nothing reads.
            raise StorageError(
                f"cannot write records to {self.directory}: it is the records folder of the saved "
                f"run in {parent}; save to {parent} to add to that run"
            )
        #: Whether the directory is made (False until the first save, for ``make=False``).
        self.made = make or not _makeable_later(self.directory)
        if self.made:
            self._make()

    def _make(self) -> None:
        """Check the directory (its index read), make what it lacks, and say now if it is not writable."""
        with _writing(self.directory):
            # Another program's index.json or index.jsonl: refused before anything is made.
            if (self.directory / "index.json").exists():
                _header(self.directory)
            elif (self.directory / _JOURNAL).exists():
                _check_headerless(self.directory / _JOURNAL)
            records = self.directory / "records"
            if os.path.lexists(records) and not records.is_dir():  # (refused before a header is written)
                raise StorageError(
                    f"cannot write records to {self.directory}: {records} is a file, not a folder"
                )
            if not os.path.lexists(self.directory):
                _make_whole(self.directory)
            elif os.path.isdir(self.directory) and not (self.directory / "index.json").exists():
                if not (self.directory / _JOURNAL).exists():  # (a run's whose header was lost: its own)
                    _refuse_foreign_records(self.directory)
                # Filled in place (a directory there: the program's, made empty), its header first,
                # so that a reader never finds records/ without it (it reads as empty until then);
                # before records/, so before its lock.
                with open(self.directory / _JOURNAL, "ab"):  # (one whose header was lost: kept)
                    pass
                _remove_dead_stagings(self.directory / "index.json")  # (a header's killed write's file)
                _write_header(self.directory, unlocked=True)
            if not (self.directory / "records").is_dir():  # (removed from a run there)
                (self.directory / "records").mkdir(parents=True, exist_ok=True)
                _sync_directory(self.directory)  # its name, durable before anything is saved in it
            with _turn(self.directory):
                # Writable? Say so now. (Under the lock, as every temporary file is written.)
                _atomic_write(self.directory / "records" / ".write-test", b"")
                (self.directory / "records" / ".write-test").unlink(missing_ok=True)
                # Not a records directory: say so now. Version 1: move its entries.
                header = _header(self.directory)
                if header["version"] == 1:
                    _upgrade(self.directory, _version_1_entries(self.directory, header))
                self._catch_up()
        self.made = True

    def _not_there_yet(self) -> bool:
        """Whether this writer has not made its directory and no other has either, whole: its
        header and records/ (where the lock is) both there; one killed before records/ holds none."""
        if self.made:
            return False
        return not ((self.directory / "index.json").exists() and (self.directory / "records").is_dir())

    @property
    def saved(self) -> int:
        """How many values the directory holds (saved by any writer), from its index alone: 0
        where it is not there yet (another process's writer may make it before this one's first save).

        >>> import tempfile, bcrecord
        >>> writer = bcrecord.storage.Writer(tempfile.mkdtemp())
        >>> writer.saved, writer.write({"k": [1, 2]}, step=0), writer.saved
        (0, 2, 2)
        """
        if self._not_there_yet():
            return 0
        with _writing(self.directory), _turn(self.directory):
            return sum(map(len, _index_saves(self.directory)))

    @property
    def last_step(self) -> Optional[int]:
        """The highest step saved in the directory (by any writer), None if none (or if it is
        not there yet: another process's writer may make it before this one's first save).

        Reads the whole index: ask once (a resumed run numbering on), not per save.
        """
        if self._not_there_yet():
            return None
        with _writing(self.directory), _turn(self.directory):
            saves = _index_saves(self.directory)
            return max((entry["step"] for entries in saves for entry in entries), default=None)

    def steps_from(self, start: int) -> List[int]:
        """The steps from ``start`` on saved in the directory (by any writer), in order; none
        where it is not there yet. Reads the whole index, as :attr:`last_step`.

        >>> import tempfile, bcrecord
        >>> writer = bcrecord.storage.Writer(tempfile.mkdtemp())
        >>> for step in (0, 2, 4, 2):
        ...     _ = writer.write({"k": [step]}, step=step)
        >>> writer.steps_from(1), writer.steps_from(5)
        ([2, 4], [])
        """
        if self._not_there_yet():
            return []
        with _writing(self.directory), _turn(self.directory):
            saves = _index_saves(self.directory)
            return sorted({entry["step"] for entries in saves for entry in entries if entry["step"] >= start})

    def write(
        self,
        records: Union[Mapping[str, Sequence[Any]], Any],
        step: int,
        unsavable: Optional[Unsavable] = None,
    ) -> int:
        """Save every value of ``records`` (a Recording or ``{key: [values]}``) as ``step``.

        Returns how many values were written; ``unsavable`` as for :meth:`write_many`.

        >>> import tempfile, bcrecord
        >>> writer = bcrecord.storage.Writer(tempfile.mkdtemp())
        >>> writer.write({"m:f:x@0": [1, 2], "m:f:y@0": [3]}, step=0)
        3
        >>> bcrecord.load(writer.directory).steps("m:f:x@0")
        [0, 0]
        """
        return self.write_many([(step, records)], unsavable)

    def write_many(
        self,
        batches: Iterable[Tuple[int, Union[Mapping[str, Sequence[Any]], Any]]],
        unsavable: Optional[Unsavable] = None,
    ) -> int:
        """Save several steps at once: one data file pair and one index update for all.

        Use it to buffer records and flush every N steps: one data file pair and one
        synced index line per call, not per step.

        A value that cannot be saved (one pickle refuses, a meta tensor) raises
        :class:`UnsavableValue`, and the save writes nothing. With ``unsavable``, the save
        keeps such a value's repr instead and calls ``unsavable(key, step, why)`` for it:
        one odd value does not lose the others (``bcrecord run`` and the training
        integrations warn with it).

        >>> import tempfile, bcrecord
        >>> bcrecord.storage.Writer(tempfile.mkdtemp()).write_many([(0, {"k": [1]}), (1, {"k": [2]})])
        2
        >>> told, odd = [], (i for i in "")
        >>> writer = bcrecord.storage.Writer(tempfile.mkdtemp())
        >>> writer.write_many([(5, {"k": [1, odd]})], lambda *a: told.append(a))
        2
        >>> told
        [('k', 5, "generator cannot be pickled (TypeError: cannot pickle 'generator' object)")]
        """
        items = [(_step(step), _items(records)) for step, records in batches]
        try:
            prepared = _prepared(items)
        except UnsavableValue:
            if unsavable is None:
                raise
            # Only now is each value checked on its own: pickling them one by one costs.
            prepared = _prepared(_with_reprs(items, unsavable))
        return self._save(prepared)

    def _save(self, prepared: _Prepared) -> int:
        """Write a save that :func:`_prepared` made ready, making the directory first where this
        writer has not; returns how many values were written."""
        with self._lock:
            if not self.made:
                if not prepared.entries:  # (nothing to save: no folder yet, as make=False says)
                    return 0
                self._make()
            with _writing(self.directory), _turn(self.directory):
                return self._write(prepared)

    def _write(self, prepared: _Prepared) -> int:
        self._catch_up()  # another writer (another process) may have saved since the last call
        if not prepared.entries:
            return 0
        # Numbered from the next file's number: a save whose tensors fill several files takes
        # one number for each (its pickled values share the first).
        stems = [f"{self._next_file + part:06d}" for part in range(max(1, len(prepared.tensors)))]
        for row in prepared.entries:
            part = prepared.part.get(row["name"], 0) if row["file"] == ".safetensors" else 0
            row["file"] = f"records/{stems[part]}{row['file']}"  # (its suffix until now)
        _remove_leftovers(self.directory / "records", self._next_file)
        for stem, tensors in zip(stems, prepared.tensors, strict=False):  # (no tensors: stems[0] alone)
            _atomic_write(self.directory / f"records/{stem}.safetensors", tensors)
        if prepared.pickled is not None:
            _atomic_write(self.directory / f"records/{stems[0]}.pkl", prepared.pickled)
        _sync_directory(self.directory / "records")  # before the index names the files
        line = json.dumps({"entries": prepared.entries}).encode() + b"\n"  # (starts with _SAVE_LINE_START)
        with open(self.directory / _JOURNAL, "ab") as journal:
            journal.write(line)  # one write: readers see the whole line or no newline
            journal.flush()
            os.fsync(journal.fileno())
        self._read += len(line)
        self._journal = ((self._journal or b"") + line)[:_HEAD]  # its head as far as read
        self._next_file += len(stems)
        return len(prepared.entries)

    def _catch_up(self) -> None:
        """Find the next data file's number from the index lines saved since this writer
        last looked (under the directory's lock); trim a line cut short by a crash.

        Saves append in turn, each numbering its file after the ones before it, so the
        last line holds the highest number: a writer new to a long journal reads only that.
        """
        path = self.directory / _JOURNAL
        with open(path, "r+b") as journal:
            size = os.fstat(journal.fileno()).st_size
            known = self._journal or b""
            if size < self._read or journal.read(len(known)) != known:
                # Replaced (upgraded, or the directory made again, maybe in the same inode).
                self._read, self._next_file = 0, 1
            end = _after_last_newline(journal, 0, size)
            if end < size:  # a save that crashed mid-line: not part of the index
                journal.truncate(end)
            if end > self._read:
                if self._read == 0 and self._check:
                    # New to this journal: every line read, as load() reads them (a save added
                    # to a damaged index would be one nobody can load), a line at a time (a long
                    # run's index is hundreds of MB read whole); later, only the last.
                    journal.seek(0)
                    saves: Iterator[List[Dict[str, Any]]] = (
                        _entries_in(line, path, number) for number, line in _lines(journal, end)
                    )
                else:
                    try:
                        saves = iter([_entries_in(_last_line(journal, self._read, end), path)])
                    except StorageError:
                        # Named by its number, as load() names it: every line read (only now, it is rare).
                        journal.seek(0)
                        for number, line in _lines(journal, end):
                            _entries_in(line, path, number)
                        raise
                for entries in saves:
                    files = {entry["file"] for entry in entries}  # (a save's entries share a file or two)
                    for file in files:
                        self._next_file = max(self._next_file, int(Path(file).stem) + 1)
            self._read = end
            journal.seek(0)
            self._journal = journal.read(min(_HEAD, end))


def _remove_leftovers(records: Path, number: int) -> None:
    """Remove what saves killed mid-write left in ``records`` from data file ``number`` on (the
    next save's, which no index line names): their temporary files, and the files of a save of
    several already renamed (a split save killed writing its third left two). A save writes its
    files in turn, one number after another, so they end at the first number with none.

    >>> import tempfile
    >>> records = Path(tempfile.mkdtemp())
    >>> for name in ("000001.pkl", "000002.safetensors", "000003.safetensors", ".000004.safetensors.tmp"):
    ...     (records / name).touch()
    >>> _remove_leftovers(records, 2); sorted(path.name for path in records.iterdir())
    ['000001.pkl']
    """
    while True:
        found = False
        for kind in ("safetensors", "pkl"):
            path = records / f"{number:06d}.{kind}"
            for leftover in (path, _temporary(path)):
                try:
                    leftover.unlink()
                    found = True
                except FileNotFoundError:
                    pass
        if not found:
            return
        number += 1


def _check_headerless(journal: Path) -> None:
    """Refuse a journal without ``index.json`` unless it is one of ours (every save line starts so).

    Kept, such a journal is trimmed to its last complete line and gets a header: a
    JSON Lines file of another program must not.

    >>> import tempfile
    >>> data = Path(tempfile.mkdtemp()) / "index.jsonl"
    >>> _ = data.write_text('{"id": 1, "text": "a sample"}')
    >>> try:
    ...     _check_headerless(data)
    ... except StorageError as error:
    ...     print(str(error).split(" has ")[1].split(":")[0])
    an index.jsonl that bcrecord did not write (and no index.json)
    """
    with open(journal, "rb") as handle:
        start = handle.read(len(_SAVE_LINE_START))
    if start and not _SAVE_LINE_START.startswith(start):
        raise StorageError(
            f"{journal.parent} has an index.jsonl that bcrecord did not write (and no index.json): "
            "not a records directory; give another directory"
        )


def _is_saved_run(directory: Path) -> bool:
    """Whether ``directory`` has a bcrecord ``index.json`` (a version 1 run has no journal: every
    entry is in it).

    >>> import tempfile, bcrecord
    >>> folder = Path(tempfile.mkdtemp())
    >>> _is_saved_run(folder), _is_saved_run(bcrecord.save({"k": [1]}, folder / "run"))
    (False, True)
    """
    try:
        header = json.loads((directory / "index.json").read_bytes())
    except (OSError, ValueError):
        return False
    return isinstance(header, dict) and header.get("format") == FORMAT


def _write_header(directory: Path, unlocked: bool = False) -> None:
    header = json.dumps({"format": FORMAT, "version": VERSION}).encode()
    _atomic_write(directory / "index.json", header, unlocked)  # (writers at once write the same)
    _sync_directory(directory)  # (and the journal's name, made or renamed there before it)


def _upgrade(directory: Path, entries: List[Dict[str, Any]]) -> None:
    """Move a version 1 index's entries into the journal (under the directory's lock)."""
    lines = json.dumps({"entries": entries}).encode() + b"\n" if entries else b""
    _atomic_write(directory / _JOURNAL, lines)
    _sync_directory(directory)  # the journal's rename durable before the header's replaces the entries
    _write_header(directory)  # last: until then the directory reads as version 1


def _after_last_newline(journal: Any, start: int, end: int) -> int:
    """The position just after the last newline between ``start`` and ``end`` (``start``
    if none), read backwards in chunks: a long journal is not read whole."""
    while end > start:
        chunk_start = max(start, end - (1 << 16))
        journal.seek(chunk_start)
        newline = journal.read(end - chunk_start).rfind(b"\n")
        if newline >= 0:
            return chunk_start + newline + 1
        end = chunk_start
    return start


def _lines(journal: Any, end: int) -> Iterator[Tuple[int, bytes]]:
    """Each line of ``journal`` from where it is to ``end`` (a line's end), numbered from 1."""
    number = 0
    while journal.tell() < end:
        number += 1
        yield number, journal.readline(end - journal.tell())


def _last_line(journal: Any, start: int, end: int) -> bytes:
    """The last line that is not blank between ``start`` and ``end`` (a line's end)."""
    while end > start:
        begin = _after_last_newline(journal, start, end - 1)  # end - 1: the line's own newline
        journal.seek(begin)
        line = journal.read(end - begin)
        if line.strip():
            return line
        end = begin
    return b""


def _entries_in(lines: bytes, path: Path, first: int = 1) -> List[Dict[str, Any]]:
    """The entries of complete journal ``lines`` (blank lines are none), numbered from ``first``."""
    entries: List[Dict[str, Any]] = []
    for number, line in enumerate(lines.splitlines(), first):
        if not line.strip():
            continue
        try:
            entries.extend(_checked(json.loads(line)["entries"]))
        except (ValueError, KeyError, TypeError) as error:
            raise StorageError(f"cannot read {path}: save {number} is damaged ({error})") from None
    return entries


#: What readers take from every index entry, its type and what that is called in messages
#: (the other fields describe the value).
_FIELDS = {"key": (str, "a str"), "step": (int, "an int"), "file": (str, "a str"), "name": (str, "a str")}
_DATA_FILE = re.compile(r"records/[0-9]+\.(safetensors|pkl)")


def _checked(entries: Any) -> List[Dict[str, Any]]:
    """A save's ``entries``, or a ValueError naming the first one readers cannot use.

    >>> _checked([{"key": "k", "step": "0", "file": "records/000001.pkl", "name": "k#0#0"}])
    Traceback (most recent call last):
    ...
    ValueError: entry 1's 'step' is '0', not an int
    """
    if not isinstance(entries, list):
        raise ValueError(f"its entries are a {type(entries).__name__}, not a list")
    # Each entry asked the plain way first, each data file's name matched once: a million entries
    # were four seconds of checks. What fails is asked again field by field, to name what is wrong.
    files: set = set()
    for entry in entries:
        file = entry.get("file") if type(entry) is dict else None
        if not (
            type(file) is str
            and type(entry.get("key")) is str
            and type(entry.get("step")) is int
            and type(entry.get("name")) is str
            and (file in files or _DATA_FILE.fullmatch(file))
        ):
            break
        files.add(file)
    else:
        return entries
    for number, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise ValueError(f"entry {number} is a {type(entry).__name__}, not an object")
        for field, (kind, called) in _FIELDS.items():
            if field not in entry:
                raise ValueError(f"entry {number} has no {field!r}")
            value = entry[field]
            if not isinstance(value, kind) or isinstance(value, bool):  # (True is an int to isinstance)
                raise ValueError(f"entry {number}'s {field!r} is {value!r}, not {called}")
        if not _DATA_FILE.fullmatch(entry["file"]):
            raise ValueError(
                f"entry {number}'s 'file' is {entry['file']!r}, not records/NNNNNN.pkl or .safetensors"
            )
    return entries


def _name(key: str, step: int, position: int) -> str:
    """A value's name in its data file: ``key#step#position`` (``ascii(key)`` for a key that is
    no UTF-8 text, such as one with a lone surrogate, which a safetensors header cannot hold)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        key = ascii(key)
    return f"{key}#{step}#{position}"


def _json_length(text: str) -> int:
    """How long ``text`` is as JSON, quoted (plain text counted without JSON's escaping of it:
    a save of a million tensors counts a million names).

    >>> _json_length("k#0#0"), _json_length('a"b'), _json_length("é")
    (7, 6, 8)
    """
    if text.isascii() and text.isprintable() and '"' not in text and "\\" not in text:
        return len(text) + 2
    return len(json.dumps(text))


def _safetensors(tensors: Dict[str, Any], entries: List[Dict[str, Any]]) -> Sequence[Any]:
    """``tensors`` in safetensors' format (buffers to write in turn), or an UnsavableValue naming
    the key and step of one it refuses."""
    if importlib.util.find_spec("safetensors") is None:
        raise StorageError("saving tensors needs the safetensors package: pip install 'bcrecord[save]'")
    try:
        if sys.byteorder != "little":  # (safetensors stores little-endian numbers: it swaps them)
            return [_saved_by_safetensors(tensors)]
        return _serialized(tensors)
    except Exception as error:
        _blame(entries, tensors, error, "save the tensors")
        raise  # (_blame raises)


#: Per tensor dtype, its name in a safetensors header (``"F32"``), asked of safetensors once;
#: None for one safetensors lays out otherwise (a packed ``float4_e2m1fn_x2``: its shape counts halves).
_safetensors_names: Dict[Any, Optional[str]] = {}


def _safetensors_name(dtype: Any) -> Optional[str]:
    if dtype not in _safetensors_names:
        import torch
        from safetensors.torch import save as save_tensors

        probe = save_tensors({"probe": torch.zeros(1, dtype=dtype)})
        info = json.loads(probe[8 : 8 + int.from_bytes(probe[:8], "little")])["probe"]
        plain = info["shape"] == [1] and info["data_offsets"] == [
            0,
            torch.zeros(1, dtype=dtype).element_size(),
        ]
        _safetensors_names[dtype] = info["dtype"] if plain else None
    return _safetensors_names[dtype]


def _saved_by_safetensors(tensors: Dict[str, Any]) -> bytes:
    """safetensors' own save of ``tensors``, each copied first: it refuses tensors that share memory
    (one tensor recorded twice), and a save's tensors are not copies of their own (:meth:`Writer._write`)."""
    from safetensors.torch import save as save_tensors

    return save_tensors({name: tensor.clone() for name, tensor in tensors.items()})  # type: ignore[no-any-return]


def _serialized(tensors: Dict[str, Any]) -> List[Any]:
    """``tensors`` (contiguous, on the CPU) in safetensors' format, made here, as buffers to
    write in turn: a header, then each tensor's own memory. safetensors' own save converts each
    tensor to a numpy array on its own, 85 us a tensor, most of a save of many small tensors (a
    loss a step), and returns one bytes object, a copy of every tensor (a save of a 2 GB tensor
    held four copies of it at once).

    As safetensors lays them out: a header (its length in 8 bytes, then JSON padded to a
    multiple of 8), then the data, larger elements first so that every tensor is aligned.
    (Tested in tests/torch: the core's doctests run without torch.)
    """
    import torch

    header: Dict[str, Any] = {}
    chunks = []
    offset = 0
    for name, tensor in sorted(tensors.items(), key=lambda item: -item[1].element_size()):
        dtype = _safetensors_name(tensor.dtype)
        if dtype is None:
            return [_saved_by_safetensors(tensors)]
        size = tensor.element_size() * tensor.nelement()
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
        if size:
            chunks.append(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return [len(text).to_bytes(8, "little") + text, *chunks]


def _pickled(others: Dict[str, Any], entries: List[Dict[str, Any]]) -> bytes:
    """``others`` pickled, or an UnsavableValue naming the key and step of a value pickle refuses."""
    try:
        return _dumps(others)
    except Exception as error:
        _blame(entries, others, error, "pickle the values")
        raise  # (_blame raises)


def _blame(entries: List[Dict[str, Any]], values: Dict[str, Any], error: Exception, doing: str) -> None:
    """Raise an UnsavableValue naming the first of ``values`` (by entry name) a save cannot hold."""
    for row in entries:
        why = _why_unsavable(values[row["name"]]) if row["name"] in values else None
        if why is not None:
            key = _cut(repr(row["key"]), 200)
            raise UnsavableValue(f"cannot save {key} (step {row['step']}): {why}") from None
    # Each value saves alone, not all together: no one value to blame.
    raise UnsavableValue(f"cannot {doing}: {type(error).__name__}: {error}") from None


def _why_unsavable(value: Any) -> Optional[str]:
    """Why a save cannot hold ``value``, None if it can: the save's own steps, tried on it alone.

    >>> _why_unsavable(1.5), _why_unsavable(i for i in "")
    (None, "generator cannot be pickled (TypeError: cannot pickle 'generator' object)")
    """
    if is_tensor(value):
        if getattr(value, "is_meta", False):
            return "a meta tensor has no data"
        try:
            with warnings.catch_warnings():  # what trying says on the way (safetensors' own)
                warnings.simplefilter("ignore")
                if _describe(value)["kind"] == "tensor":
                    from safetensors.torch import save as save_tensors

                    save_tensors({"value": value.detach().cpu().contiguous().clone()})
                else:
                    _dumps(value.detach().cpu())
        except ImportError:  # safetensors: the save says so itself
            return None
        except Exception as error:  # a tensor of vmap, of torch.export's fake mode, of uint4...
            return f"{type(value).__name__} cannot be saved ({_said(error)})"
        return None
    try:
        _dumps(value)
    except Exception as error:  # (a meta tensor inside it says so)
        return f"{type(value).__name__} cannot be pickled ({_said(error)})"
    return None


def _said(error: Exception) -> str:
    """``'Type: first line'`` of ``error``, cut to a line's length."""
    said = (str(error).splitlines() or [""])[0]
    said = said if len(said) <= 160 else said[:157] + "..."
    return f"{type(error).__name__}: {said}" if said else type(error).__name__


def _dumps(value: Any) -> bytes:
    """``value`` pickled, every tensor in it (in tuples, dicts, objects) detached, on the CPU and
    loadable (see :class:`_Pickler`)."""
    out = io.BytesIO()
    _Pickler(out).dump(value)
    return out.getvalue()


class _Pickler(pickle.Pickler):
    """A pickler for saved values: tensors anywhere in them are saved as :func:`load` promises.

    That is detached and on the CPU (a GPU run's tuple of tensors loads on a machine without
    one), and in a form that loads: pickle's own for most dtypes; ``torch.save``'s for
    those whose pickle torch cannot read back (``complex32``). Through the pickler's
    dispatch table (every tensor class there is: ``Parameter``, ``MaskedTensor``, a
    program's own subclass), not ``reducer_override``, which is called for every object
    pickled and would slow every save down.
    """

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=4)
        torch = sys.modules.get("torch")  # (a process without it has no tensors to pickle)
        if torch is not None:
            table = dict(copyreg.dispatch_table)
            pending = [torch.Tensor]
            while pending:  # (a dispatch table is looked up by the exact class)
                kind = pending.pop()
                table[kind] = _reduced_tensor
                pending += [sub for sub in kind.__subclasses__() if sub not in table]
            table[torch.UntypedStorage] = _reduced_storage
            self.dispatch_table = table


def _reduced_tensor(tensor: Any) -> Any:
    """How :class:`_Pickler` pickles a tensor: detached, on the CPU, in a form that loads.

    A subclass keeps the attributes set on it, one that cannot be detached or moved (a
    wrapper tensor whose ``__torch_dispatch__`` refuses it) is pickled as it is, and one
    that pickles its own way (its own ``__reduce_ex__``) is left to it once detached,
    but for a dtype whose pickle torch cannot read back.
    """
    if getattr(tensor, "is_meta", False):  # refused as one alone is (no data to save)
        raise NotImplementedError("a meta tensor has no data")
    if tensor.requires_grad or tensor.device.type != "cpu":
        try:
            moved = tensor.detach().cpu()
        except Exception:  # a subclass without detach (its __torch_dispatch__ refuses it)
            return tensor.__reduce_ex__(4)
        state = getattr(tensor, "__dict__", None)
        if state and type(moved) is type(tensor):  # (a Parameter detaches to a plain tensor)
            moved.__dict__.update(state)
        tensor = moved
    tensor = _compact(tensor)
    if _pickle_loads(tensor.dtype):
        return tensor.__reduce_ex__(4)
    import torch

    buffer = io.BytesIO()
    torch.save(tensor, buffer)
    return _torch_loaded, (buffer.getvalue(),)


def _reduced_storage(storage: Any) -> Any:
    """How :class:`_Pickler` pickles an ``UntypedStorage`` (a local holding ``x.untyped_storage()``):
    as a tensor of its bytes, on the CPU. torch's own pickle of one does not load back
    (``AttributeError: type object 'torch.storage.UntypedStorage' has no attribute 'dtype'``).
    """
    import torch

    data = torch.empty(0, dtype=torch.uint8).set_(storage.cpu(), 0, (storage.nbytes(),))
    buffer = io.BytesIO()
    torch.save(data, buffer)
    return _storage_loaded, (buffer.getvalue(),)


def _storage_loaded(data: bytes) -> Any:
    """An ``UntypedStorage`` saved by :func:`_reduced_storage`."""
    return _torch_loaded(data).untyped_storage()


def _compact(tensor: Any) -> Any:
    """``tensor`` in a storage of its own where it is a view of a larger one (a row of a batch,
    a token of a sequence, a quantized one's too): pickled as it is, its whole storage would be
    saved (and loaded).
    """
    try:
        if tensor.is_nested or str(tensor.layout) != "torch.strided":
            return tensor
        if tensor.untyped_storage().nbytes() <= tensor.nelement() * tensor.element_size():
            return tensor  # (its own storage, or an expanded one's smaller than it)
        compact = tensor.detach().clone()  # (a view of a dense tensor clones dense)
    except Exception:  # a subclass whose storage or clone its __torch_dispatch__ refuses
        return tensor
    state = getattr(tensor, "__dict__", None)
    if state and type(compact) is type(tensor):
        compact.__dict__.update(state)
    return compact


#: Per tensor dtype, whether pickle's form of a tensor of it loads back (asked once per dtype).
_pickle_dtypes: Dict[Any, bool] = {}


def _pickle_loads(dtype: Any) -> bool:
    known = _pickle_dtypes.get(dtype)
    if known is None:
        import torch

        try:
            with warnings.catch_warnings():  # what torch says on the way (its TypedStorage's)
                warnings.simplefilter("ignore")
                pickle.loads(pickle.dumps(torch.empty(1, dtype=dtype), protocol=4))
            known = True
        except Exception:  # complex32, bits8...: torch pickles them, and cannot unpickle them
            known = False
        _pickle_dtypes[dtype] = known
    return known


def _torch_loaded(data: bytes) -> Any:
    """A tensor saved with ``torch.save`` into a pickled value (see :class:`_Pickler`)."""
    import torch

    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)


def _with_reprs(
    items: Sequence[Tuple[int, List[Tuple[str, Sequence[Any]]]]], unsavable: Unsavable
) -> List[Tuple[int, List[Tuple[str, Sequence[Any]]]]]:
    """``items`` with each value a save cannot hold replaced by its repr, ``unsavable`` told of each."""
    kept: List[Tuple[int, List[Tuple[str, Sequence[Any]]]]] = []
    for step, pairs in items:
        kept.append((step, []))
        for key, values in pairs:
            savable = []
            for value in values:
                why = _why_unsavable(value)
                if why is not None:
                    unsavable(key, step, why)
                    value = _repr(value)
                savable.append(value)
            kept[-1][1].append((key, savable))
    return kept


def _repr(value: Any) -> str:
    """``repr(value)``, or the default one if the value's own raises: the repr is all that is kept."""
    try:
        return repr(value)
    except Exception:
        return object.__repr__(value)


def _step(step: Any) -> int:
    """``step`` as a plain int (numpy's integers too), or a TypeError naming it."""
    try:
        # (True saved as step 1: a flag passed for the step; numpy's and torch's too)
        if isinstance(step, bool) or str(getattr(step, "dtype", "")) in ("bool", "torch.bool"):
            raise TypeError
        return operator.index(step)
    except TypeError:
        raise TypeError(f"a step is an integer, got {step!r} ({type(step).__name__})") from None


def _items(records: Any) -> List[Tuple[str, Sequence[Any]]]:
    """``records`` (a Recording or ``{key: [values]}``) as pairs, or a TypeError naming what is wrong.

    >>> _items({"k": "text"})
    Traceback (most recent call last):
    TypeError: the values of 'k' are a str, not a list of values (give ["text"] to save one)
    """
    if _is_recording(records):
        return [(key, records.all(key)) for key in records.keys()]
    if not isinstance(records, Mapping):
        kind = type(records).__name__
        raise TypeError(f"records are a Recording or a dict of key -> list of values, got {kind}")
    items = list(records.items())
    for key, values in items:
        if not isinstance(key, str):  # 1 and "1" would be saved under one name
            raise TypeError(f"a key is a string, got {key!r} ({type(key).__name__})")
        # A str (or a tensor, an array) would be saved item by item: one value was meant.
        if not isinstance(values, Sequence) or isinstance(values, (str, bytes, bytearray, memoryview)):
            one = '["text"]' if isinstance(values, str) else "[value]"
            kind = type(values).__name__
            raise TypeError(
                f"the values of {key!r} are a {kind}, not a list of values (give {one} to save one)"
            )
    return items


def _is_recording(records: Any) -> bool:
    """Whether ``records`` is a Recording, or a Lightning callback's :class:`StepRecord`: what
    lists a key's values with ``all(key)``. Asked of the class, not of methods alone: a pandas
    DataFrame has an ``all`` and ``keys`` too (its ``all(key)`` said "No axis named ...").

    >>> import bcrecord
    >>> with bcrecord.recording() as rec:
    ...     pass
    >>> _is_recording(rec), _is_recording({"k": [1]})
    (True, False)
    """
    from .runtime import Recording

    if isinstance(records, Recording):
        return True
    lightning = sys.modules.get("bcrecord.integrations.lightning")  # (imported where one is made)
    return lightning is not None and isinstance(records, lightning.StepRecord)


class Unimportable:
    """A loaded value whose class cannot be imported here, with what it was saved with.

    Classes defined in a program's ``__main__`` (saved by ``bcrecord run``) are the
    usual case: a loader is another program; so are classes of a module that raises when
    imported here (it needs a GPU, or a library this machine lacks) or exits (``SystemExit``:
    ``parse_args()`` at import, given the loader's arguments). The rest of the
    records load as usual.
    ``args`` are its constructor's arguments (a namedtuple's fields), ``state`` its
    attributes, ``items`` the elements or entries of a list or dict subclass.

    >>> kind = _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "Point")
    >>> point = kind.__new__(kind); point.__setstate__({"x": 1}); point
    <no_such_module.Point, not importable here: {'x': 1}>
    """

    _where = ""
    #: The module and name its pickle gave its class (a save of it names them again).
    _module = ""
    _name = ""
    #: Whether unpickling called its class (or a function) with ``args``, not its ``__new__`` alone.
    _called = False
    # Class-level defaults too: a pickle in copyreg's form (object.__reduce__) makes it with
    # object.__new__, past __new__ (its repr and a save of it read these).
    args: Tuple[Any, ...] = ()
    kwargs: Dict[str, Any] = {}  # noqa: RUF012 (never changed in place: each instance sets its own)
    items: Any = None
    state: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> Unimportable:
        self = super().__new__(cls)
        self.args, self.kwargs = args, kwargs
        self.items = None
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # __new__ keeps the arguments (unpickling may call either); a call, not __new__ alone,
        # is how a save of this value makes its class's again.
        self._called = True

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled as what it stands for, to load as its class's value where that imports (a
        program's own ``__main__`` loading its run's save), else as this stand-in again: a
        value loaded here saves again (``bcrecord.save(bcrecord.load(DIR), OTHER)``).

        >>> kind = _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "Point")
        >>> point = kind.__new__(kind); point.__setstate__({"x": 1})
        >>> _unpickled(_dumps(point))
        <no_such_module.Point, not importable here: {'x': 1}>
        """
        # Its class by reference (pickled once per pickle, see _StandInClass): a load looks the
        # class up once, not once per value (a failing module's import ran per value).
        return (_made_again, (type(self), self._called, self.args, self.kwargs), *self._filled())

    def __copy__(self) -> Unimportable:
        """A stand-in of its class again, holding what this one holds (its list or dict its own):
        not through its pickle, which would look its class up again (import its module).

        >>> import copy
        >>> kind = _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "Row")
        >>> row = kind(); row.append(1); other = copy.copy(row); other.append(2)
        >>> type(other) is kind, row.items, other.items
        (True, [1], [1, 2])
        """
        copied = type(self).__new__(type(self))
        copied.__dict__.update(self.__dict__)
        for part in ("items", "state"):
            value = copied.__dict__.get(part)
            if isinstance(value, (list, dict)):
                copied.__dict__[part] = value.copy()
        return copied

    def __deepcopy__(self, memo: Dict[int, Any]) -> Unimportable:
        """A stand-in of its class again, holding a deep copy of what this one holds (see ``__copy__``).

        >>> import copy
        >>> kind = _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "Point")
        >>> point = kind.__new__(kind); point.__setstate__({"x": [1]}); other = copy.deepcopy(point)
        >>> type(other) is kind, other.state, other.state["x"] is point.state["x"]
        (True, {'x': [1]}, False)
        """
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied  # (a value holding itself)
        copied.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return copied

    def _filled(self) -> Tuple[Any, Any, Any]:
        """What pickle sets into it once made: its state, list elements and dict entries."""
        items = self.items
        return (
            getattr(self, "state", None),
            iter(items) if isinstance(items, list) else None,
            iter(items.items()) if isinstance(items, dict) else None,
        )

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:  # a dict subclass's entries
        if self.items is None:
            self.items = {}
        self.items[key] = value

    def append(self, value: Any) -> None:
        """Keep an element of a list subclass (what unpickling one calls).

        >>> kind = _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "Row")
        >>> row = kind(); row.append(1); row.items
        [1]
        """
        if self.items is None:
            self.items = []
        self.items.append(value)

    def extend(self, values: Iterable[Any]) -> None:
        """Keep elements of a list subclass (what unpickling one calls).

        >>> kind = _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "Row")
        >>> row = kind(); row.extend([1, 2]); row
        <no_such_module.Row, not importable here: [1, 2]>
        """
        for value in values:
            self.append(value)

    def __repr__(self) -> str:
        return f"<{self._where}, not importable here: {self._saved_shown()}>"

    def _saved_shown(self) -> str:
        """What it was saved with, in its repr: cut short, and '...' inside stand-ins nested
        deeper than a few (a linked list of 400 of them ran out of stack)."""
        depth = getattr(_repr_depth, "n", 0)
        if depth >= 3:
            return "..."
        saved = [part for part in (self.args, self.items, getattr(self, "state", None)) if part]
        shown = saved[0] if len(saved) == 1 else tuple(saved)
        _repr_depth.n = depth + 1
        try:
            return _cut(_STATE.repr(shown), 1000)
        finally:
            _repr_depth.n = depth


class _StateRepr(reprlib.Repr):
    """reprlib's limits (depth, items, lengths: never a repr of the whole of a large state),
    set for a stand-in's state, a dict shown in its own order (reprlib sorts its keys)."""

    def __init__(self) -> None:
        super().__init__()
        self.maxlevel = 6
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = 30
        self.maxstring = self.maxother = self.maxlong = 1000

    def repr1(self, x: Any, level: int) -> str:
        # Before 3.14, reprlib picks its method by the class's name alone: a stand-in class
        # named 'list' (another module's) went to repr_list, which took its len().
        if type(x).__module__ not in ("builtins", "collections", "array"):
            return self.repr_instance(x, level)
        return super().repr1(x, level)

    def repr_dict(self, x: Dict[Any, Any], level: int) -> str:
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        pieces = [
            f"{self.repr1(key, level - 1)}: {self.repr1(value, level - 1)}"
            for key, value in itertools.islice(x.items(), self.maxdict)
        ]
        return "{" + ", ".join(pieces + (["..."] if len(x) > self.maxdict else [])) + "}"


_STATE = _StateRepr()
#: How deep the reprs of stand-ins inside stand-ins' states are, in this thread.
_repr_depth = threading.local()


def _cut(text: str, limit: int) -> str:
    """``text``, cut after ``limit`` characters: a stand-in's saved state (a tensor's pickled
    bytes may be megabytes), a key in a message (as long as a program makes it).

    >>> _cut("abc", 5), _cut("abcdefgh", 5)
    ('abc', 'abcde...')
    """
    return text if len(text) <= limit else text[:limit] + "..."


class Unloadable(Unimportable):
    """A loaded value that could not be made again here, with what it was saved with.

    Its class was found, but making it from its pickle raised: an exception class whose
    ``__init__`` takes other arguments than the message it pickles, a ``__setstate__``
    that refuses the state saved. ``error`` says what was raised; ``args``, ``state`` and
    ``items`` are as for :class:`Unimportable`. The other values of its save load as usual.

    >>> made_by_int_of_x = b"cbuiltins\\nint\\n(Vx\\ntR."  # (a pickle whose loading calls int('x'))
    >>> value = _TolerantUnpickler(io.BytesIO(made_by_int_of_x)).load()
    >>> value.error, value.args
    ("ValueError: invalid literal for int() with base 10: 'x'", ('x',))
    >>> value
    <builtins.int, could not be made again (ValueError: invalid literal for int() with base 10: 'x'): ('x',)>
    """

    error = ""

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled as the stand-in it is, what was raised making it kept: a save of it loads as it."""
        return (_unloadable_again, (self._where, self.error, self.args), *self._filled())

    def __repr__(self) -> str:
        return f"<{self._where}, could not be made again ({self.error}): {self._saved_shown()}>"


def _unloadable_again(where: str, error: str, args: Tuple[Any, ...]) -> Unloadable:
    """An :class:`Unloadable` saved again (its state and items pickle sets next)."""
    stand_in = cast(Unloadable, Unloadable.__new__(Unloadable, *args))
    stand_in._where, stand_in.error = where, error
    return stand_in


def _made_again(kind: Any, called: bool, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    """An :class:`Unimportable` saved again, as unpickling made it first: of ``kind``, its class
    (or function) where this process imports it now, else a stand-in again (its state and items
    pickle sets next); an :class:`Unloadable` where making it raises."""
    if isinstance(kind, type) and issubclass(kind, Unimportable):
        stand_in = kind.__new__(kind, *args, **kwargs)
        stand_in._called = called
        return stand_in
    try:
        return kind(*args, **kwargs) if called else kind.__new__(kind, *args, **kwargs)
    except Exception as error:
        return _unloadable(kind, error, args)


class _StandInClass(type):
    """The class of stand-in classes: what pickles one (see :func:`_reduced_stand_in_class`)."""

    _module: str
    _name: str


def _reduced_stand_in_class(kind: _StandInClass) -> Any:
    """How a stand-in class pickles (a class or function of the recorded program's ``__main__``
    saved as a value, loaded elsewhere; the class of every :class:`Unimportable`): as the name
    it stands for, looked up again where it loads (:func:`_class_again`). pickle's own looks the
    name up here, where it is not there: "Can't pickle <class '__main__.loss_fn'>".

    >>> kind = _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "loss_fn")
    >>> _unpickled(_dumps([kind, kind]))
    [<class 'no_such_module.loss_fn'>, <class 'no_such_module.loss_fn'>]
    """
    return _class_again, (kind._module, kind._name)


copyreg.pickle(_StandInClass, _reduced_stand_in_class)  # (pickle asks a class's metaclass first)


def _class_again(module: str, name: str) -> Any:
    """A stand-in class saved again: the class or function it stands for where this process
    imports it now, else a stand-in class again (once for each name a load looks up: see
    :func:`_one_lookup_each`)."""
    finder = _TolerantUnpickler(io.BytesIO(b""))
    finder.proto = 4  # (a dotted name is a nested class's: found as a protocol 4 pickle finds it)
    return finder.find_class(module, name)


#: The stand-in classes of the names a load has looked up, by module and name: each name it
#: cannot import is tried once per load (see :func:`_one_lookup_each`); None outside a load.
_stand_ins: contextvars.ContextVar[Optional[Dict[Tuple[str, str], Any]]] = contextvars.ContextVar(
    "bcrecord_stand_ins", default=None
)


@contextlib.contextmanager
def _one_lookup_each() -> Iterator[None]:
    """Within it (a load, each of its data files, an unpickling), a class or function that
    does not import is tried once, its stand-in class shared: a module that fails to import
    runs its code once per load, as for a pickle (not once per data file or value: 2000
    values of a module that needs a GPU took 11 s; one that parses its arguments at import
    printed its usage once per value).

    >>> with _one_lookup_each():
    ...     first = _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "Point")
    ...     first is _Unpickler(io.BytesIO(b"")).find_class("no_such_module", "Point")
    True
    """
    if _stand_ins.get() is not None:  # (a load's data file: the load's)
        yield
        return
    token = _stand_ins.set({})
    try:
        yield
    finally:
        _stand_ins.reset(token)


def _unloadable(made: Any, error: Exception, args: Tuple[Any, ...], state: Any = None) -> Unloadable:
    """The stand-in for what ``made`` (a class or function) failed to make from ``args`` or ``state``."""
    where = f"{getattr(made, '__module__', None) or '?'}.{getattr(made, '__qualname__', type(made).__name__)}"
    stand_in = cast(Unloadable, Unloadable.__new__(Unloadable, *args))
    stand_in._where, stand_in.error = where, _said(error)
    if state is not None:
        stand_in.state = state
    return stand_in


class _StandInClasses:
    """An unpickler's ``find_class`` standing in :class:`Unimportable` for classes this
    process cannot import."""

    def find_class(self, module: str, name: str) -> Any:
        known = _stand_ins.get()
        if known is not None and (module, name) in known:  # (not imported once already in this load)
            return known[module, name]
        try:
            if module == "__main__" and _main_is_the_command_line():
                # The recorded program's, never bcrecord's own (its 'main'), which it would find there.
                raise LookupError(name)
            return super().find_class(module, name)  # type: ignore[misc]
        except KeyboardInterrupt:
            raise
        # Not there, or its module raises on import here (needs a GPU, a library), or exits
        # (SystemExit: argparse's parse_args() at import, given the loader's arguments; pytest's
        # importorskip): never the loader's end.
        except BaseException:
            where = {"_where": f"{module}.{name}", "_module": module, "_name": name}
            stand_in = _StandInClass(name, (Unimportable,), {**where, "__module__": module})
            if known is not None:
                known[module, name] = stand_in
            return stand_in


def _main_is_the_command_line() -> bool:
    """Whether this process's ``__main__`` is bcrecord's command line: ``python -m bcrecord``,
    or the installed ``bcrecord``, a script holding its entry point (``from bcrecord.cli import _console``).

    >>> _main_is_the_command_line()
    False
    """
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) == "bcrecord.__main__":
        return True
    cli = sys.modules.get("bcrecord.cli")
    return cli is not None and getattr(main, "_console", None) is getattr(cli, "_console", cli)


class _Unpickler(_StandInClasses, pickle.Unpickler):
    """Unpickles, standing in :class:`Unimportable` for classes this process cannot import."""


#: pickle's unpickler in Python, whose opcodes a subclass can change (the C one's it cannot).
_PythonUnpickler: Any = pickle._Unpickler  # type: ignore[attr-defined]


class _TolerantUnpickler(_StandInClasses, _PythonUnpickler):
    """:class:`_Unpickler`, but a value whose making raises is an :class:`Unloadable`.

    pickle's Python unpickler, slower than the C one: used for a data file that one would
    not load, so that one odd value does not lose every other value of its save.
    """

    dispatch = dict(_PythonUnpickler.dispatch)

    def _load_reduce(self) -> None:  # (stack: ... function args)
        args = self.stack.pop()
        try:
            self.stack[-1] = self.stack[-1](*args)
        except Exception as error:
            self.stack[-1] = _unloadable(self.stack[-1], error, tuple(args))

    def _load_newobj(self) -> None:  # (stack: ... class args)
        args = self.stack.pop()
        cls = self.stack.pop()
        try:
            self.append(cls.__new__(cls, *args))
        except Exception as error:
            self.append(_unloadable(cls, error, tuple(args)))

    def _load_newobj_ex(self) -> None:  # (stack: ... class args kwargs)
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        try:
            self.append(cls.__new__(cls, *args, **kwargs))
        except Exception as error:
            self.append(_unloadable(cls, error, tuple(args)))

    def _load_build(self) -> None:  # (stack: ... instance state; pickle's pops the state first)
        state, made = self.stack[-1], self.stack[-2]
        try:
            _PythonUnpickler.load_build(self)
        except Exception as error:
            stand_in = self.stack[-1] = _unloadable(type(made), error, (), state)
            # Memoized before it was built: later references to it are the stand-in too.
            for number, memoized in list(self.memo.items()):
                if memoized is made:
                    self.memo[number] = stand_in

    dispatch[pickle.REDUCE[0]] = _load_reduce
    dispatch[pickle.NEWOBJ[0]] = _load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex
    dispatch[pickle.BUILD[0]] = _load_build


def _unpickled(data: bytes) -> Any:
    """A pickled data file's values; where making one raises, the others all the same (see
    :class:`Unloadable`), and where the file itself is damaged, the C unpickler's error."""
    with _one_lookup_each():
        try:
            return _Unpickler(io.BytesIO(data)).load()
        except Exception as error:
            try:
                return _TolerantUnpickler(io.BytesIO(data)).load()
            except Exception:
                raise error from None


def save(records: Any, directory: PathLike, step: Optional[int] = None) -> Path:
    """Save a recording (or ``{key: [values]}``) into ``directory`` as ``step`` (default 0);
    returns the directory. Records :func:`load` gave keep each value's step, unless ``step``
    is given.

    Saving again into the same directory adds to what is there (a later step, or
    more values of the same step).

    >>> import tempfile, bcrecord
    >>> folder = bcrecord.save({"m:f:x@0": [1, 2]}, tempfile.mkdtemp(), step=0)
    >>> _ = bcrecord.save({"m:f:x@0": [3]}, folder, step=1)
    >>> bcrecord.load(folder)["m:f:x@0"]
    [1, 2, 3]
    >>> bcrecord.load(bcrecord.save(bcrecord.load(folder), tempfile.mkdtemp())).steps("m:f:x@0")
    [0, 0, 1]
    """
    # (checked before the directory is made)
    if isinstance(records, Loaded) and step is None:
        batches = _batches_by_step(records.entries)
    else:
        batches = [(_step(0 if step is None else step), _items(records))]
    directory = _expanded(directory)
    # Every value pickled first: one a save cannot hold leaves nothing behind (no folder made,
    # no header in an empty folder that was there).
    prepared = _prepared(batches)
    Writer(directory, check=False)._save(prepared)  # (one per save: saves in a loop stay quick)
    return directory


def _batches_by_step(entries: Sequence[Entry]) -> List[Tuple[int, List[Tuple[str, Sequence[Any]]]]]:
    """Loaded ``entries`` as batches of ``(step, [(key, values)])``, a batch a run of one step, in
    their order (a step saved again after another keeps its place).

    >>> rows = [("k", 0, "a"), ("k", 1, "b"), ("j", 1, "c"), ("k", 0, "d")]
    >>> _batches_by_step([Entry(key, step, value, {}) for key, step, value in rows])
    [(0, [('k', ['a'])]), (1, [('k', ['b']), ('j', ['c'])]), (0, [('k', ['d'])])]
    """
    batches: List[Tuple[int, List[Tuple[str, Sequence[Any]]]]] = []
    run: Dict[str, List[Any]] = {}
    for at, entry in enumerate(entries):
        run.setdefault(entry.key, []).append(entry.value)
        if at + 1 == len(entries) or entries[at + 1].step != entry.step:
            batches.append((entry.step, list(run.items())))
            run = {}
    return batches


def _expanded(directory: PathLike) -> Path:
    """``directory`` as a Path, ``~`` expanded: never a folder named ``~`` in the working
    directory (which ``rm -rf ~`` would then be asked to remove).

    An empty string (an unset variable, surely) is refused, as the working directory it
    would be (``Path("")`` is ``.``) for saving and loading alike.

    A folder named so is written as the shell writes one, ``./~``: pathlib drops the ``./``
    before expanding, which gave the home folder. A ``~name`` of no user here is refused.

    >>> _expanded("~/runs") == Path.home() / "runs", _expanded("./~") == Path.cwd() / "~"
    (True, True)
    """
    text = str(os.fspath(directory))
    if not text:
        raise StorageError("the records directory is an empty string (give '.' for the working directory)")
    if not text.startswith("~"):
        path = Path(directory)
        # ('./~' is Path('~') once made: absolute, no later expansion takes it for home.)
        return path.absolute() if str(path).startswith("~") else path
    try:
        return Path(text).expanduser()
    except RuntimeError:  # "Could not determine home directory": no such user
        user = text[1:].replace(os.sep, "/").split("/", 1)[0]
        raise StorageError(
            f"{text!r}: there is no user {user!r} on this machine for '~{user}' to name the home of "
            f"(give './{text}' for a folder of that name)"
        ) from None


def _refuse_foreign_records(directory: Path) -> None:
    """Refuse to make a run in ``directory``, which has no index nor journal, where its
    ``records`` folder holds files: no run of bcrecord's left them (it writes its journal
    before its records folder, and removes it after), and its numbered files would replace them."""
    try:
        found = sorted(entry.name for entry in os.scandir(directory / "records"))
    except (FileNotFoundError, NotADirectoryError):
        return
    foreign = [name for name in found if name not in (".lock", ".write-test")]
    if foreign:
        raise StorageError(
            f"cannot write records to {directory}: its records folder holds files no run of bcrecord's "
            f"wrote ({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}), which the run's "
            "files could replace; save to another folder"
        )


def _nearby_records(directory: Path) -> str:
    """Where the records are, for a ``directory`` that holds none: the records directories in it
    (``rank0``, ``rank1``), or the one it is in (its ``plots`` or ``records`` folder), or ``''``.

    >>> import tempfile, bcrecord
    >>> folder = Path(tempfile.mkdtemp())
    >>> _ = bcrecord.save({"m:f:x@0": [1]}, folder / "run")
    >>> _nearby_records(folder), _nearby_records(folder / "run" / "records")[-23:]
    (' (records directories in it: run; read each)', 'run: read that instead)')
    """
    inside = sorted(found.parent.name for found in directory.glob("*/index.json"))  # (rank0, rank1...)
    if inside:
        return f" (records directories in it: {', '.join(inside)}; read each)"
    around = directory.absolute().parent  # (bcrecord-demo/plots: what `view` drew, not the records)
    if (around / "index.json").is_file():
        given = directory.parent if directory.name not in ("", "..") else around  # as the caller wrote it
        return f" (it is a folder of the records directory {given}: read that instead)"
    return ""


def _header(directory: Path) -> Dict[str, Any]:
    """``index.json``, checked: a StorageError says why ``directory`` is no records directory."""
    try:
        index = json.loads((directory / "index.json").read_text())
    except FileNotFoundError:
        if not directory.exists():
            raise StorageError(f"no such directory: {directory}") from None
        raise StorageError(
            f"{directory} has no index.json: not a bcrecord records directory{_nearby_records(directory)}"
        ) from None
    except NotADirectoryError:  # (a file of the records given: 'run/index.json', 'run/index.jsonl')
        around = [up for up in directory.parents[:2] if (up / "index.json").is_file()]  # (records/<file>)
        inside = f"of the records directory {around[0]}: give that" if around else "not a records directory"
        raise StorageError(f"{directory} is a file, {inside}") from None
    except (OSError, ValueError) as error:
        raise StorageError(f"cannot read {directory / 'index.json'}: {error}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise StorageError(f"{directory / 'index.json'} is not a bcrecord records index")
    version = index.get("version")
    if type(version) is not int or version not in _READABLE:  # (true and 1.0 are == 1: not version 1)
        readable = f"this bcrecord reads versions {_READABLE[0]} to {_READABLE[-1]}"
        newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
        # (written by a later bcrecord: the one thing that helps is a bcrecord that reads it)
        why = f"written by a newer bcrecord ({readable}): upgrade bcrecord to read it" if newer else readable
        raise StorageError(f"{directory}: records format version {version!r} is not supported, {why}")
    return index


def _version_1_entries(directory: Path, header: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The entries of a version 1 ``index.json``, checked as a journal's are."""
    try:
        return list(_checked(header.get("entries", [])))
    except ValueError as error:
        raise StorageError(f"cannot read {directory / 'index.json'}: it is damaged ({error})") from None


def _read_index(directory: Path) -> List[Dict[str, Any]]:
    return [entry for entries in _index_saves(directory) for entry in entries]


def _index_saves(directory: Path) -> Iterator[List[Dict[str, Any]]]:
    """The entries of each save the index of ``directory`` holds, a save at a time: what
    needs only a part of each (its keys, a count) holds one save's entries, not the index's
    (a million small values' entries are some 700 MB)."""
    header = _header(directory)
    if header["version"] == 1:  # from the one read: a writer may be upgrading it meanwhile
        yield _version_1_entries(directory, header)
        return
    path = directory / _JOURNAL
    try:
        with open(path, "rb") as journal:
            for number, line in enumerate(journal, 1):
                if not line.endswith(b"\n"):  # a line cut short: not part of the index
                    return
                yield _entries_in(line, path, number)
    except StorageError:
        raise
    except OSError as error:
        raise StorageError(f"cannot read {path}: {error.strerror or error}") from None


@dataclass(frozen=True, slots=True)  # (slots: a long run's million entries load sooner, in less memory)
class Entry:
    """One saved value and what the index says about it."""

    key: str
    step: int
    value: Any
    info: Mapping[str, Any]


class Loaded(Mapping[str, List[Any]]):
    """Saved records: ``loaded[key]`` lists values in save order; :meth:`steps` their steps.

    >>> import tempfile, bcrecord
    >>> folder = bcrecord.save({"m:f:x@0": [1.0]}, tempfile.mkdtemp(), step=0)
    >>> loaded = bcrecord.load(bcrecord.save({"m:f:x@0": [2.0]}, folder, step=5))
    >>> loaded["m:f:x@0"], loaded.steps("m:f:x@0"), len(loaded)
    ([1.0, 2.0], [0, 5], 1)
    >>> loaded
    <Loaded: 1 key, 2 values>
    """

    def __init__(self, entries: List[Entry]) -> None:
        self.entries = entries
        self._by_key: Dict[str, List[Entry]] = {}
        for entry in entries:
            self._by_key.setdefault(entry.key, []).append(entry)

    def _entries_of(self, key: str) -> List[Entry]:
        try:
            return self._by_key[key]
        except KeyError:
            hint = did_you_mean(key, self._by_key, hide_private=False) if isinstance(key, str) else ""
            raise KeyError(f"no saved values for {key!r}{hint}; saved keys: {listed(self._by_key)}") from None

    def __getitem__(self, key: str) -> List[Any]:
        return [entry.value for entry in self._entries_of(key)]

    def get(self, key: str, default: Any = None) -> Any:
        """``loaded[key]``, or ``default`` where no value of ``key`` is saved.

        Not Mapping's (through ``__getitem__``): its KeyError's hint compares every saved key,
        seconds for a key missing from a long run's thousands.

        >>> import tempfile, bcrecord
        >>> loaded = bcrecord.load(bcrecord.save({"m:f:x@0": [1.0]}, tempfile.mkdtemp()))
        >>> loaded.get("m:f:x@0"), loaded.get("m:f:y@0"), loaded.get("m:f:y@0", [])
        ([1.0], None, [])
        """
        entries = self._by_key.get(key)
        return default if entries is None else [entry.value for entry in entries]

    def steps(self, key: str) -> List[int]:
        """The step of each value of ``key``, in the order ``loaded[key]`` lists the values.

        >>> import tempfile, bcrecord
        >>> folder = bcrecord.save({"m:f:x@0": [1, 2]}, tempfile.mkdtemp(), step=0)
        >>> _ = bcrecord.save({"m:f:x@0": [3]}, folder, step=10)
        >>> bcrecord.load(folder).steps("m:f:x@0")
        [0, 0, 10]
        """
        return [entry.step for entry in self._entries_of(key)]

    def __contains__(self, key: object) -> bool:
        # Not Mapping's (through __getitem__): its KeyError's hint compares every saved key.
        return key in self._by_key

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def __repr__(self) -> str:
        # What a notebook shows for a cell ending in bcrecord.load(...): was the default object repr.
        keys, values = len(self._by_key), len(self.entries)
        return f"<Loaded: {keys} key{'' if keys == 1 else 's'}, {values} value{'' if values == 1 else 's'}>"


@_one_lookup_each()  # (a class that does not import is tried once per load, not once per file)
def load(directory: PathLike, keys: Optional[Iterable[str]] = None) -> Loaded:
    """Read records saved with :func:`save` / :class:`Writer` (tensors come back on CPU, copies of
    their own: a data file overwritten or cut short afterwards leaves them as they were).

    ``keys`` (a key, or several) limits what is read (and kept: a data file's other values are
    let go once it is read); a key the directory has no value for is a ``KeyError`` that names
    the saved keys, not an empty result. Files that the index does not name (a save cut short
    by a crash) are ignored. A data file damaged since it was saved (cut short, emptied,
    deleted) loses only its values that cannot be read whole: the others load, and a
    :class:`DamagedRecords` warning names the file and the keys and steps left out (make it an
    error to refuse the directory instead).

    >>> import tempfile, bcrecord
    >>> folder = bcrecord.save({"m:f:x@0": [1.5], "m:f:y@0": ["text"]}, tempfile.mkdtemp(), step=7)
    >>> loaded = bcrecord.load(folder, keys=["m:f:y@0"])
    >>> list(loaded), loaded["m:f:y@0"], loaded.steps("m:f:y@0")
    (['m:f:y@0'], ['text'], [7])
    """
    directory = _expanded(directory)
    try:
        if isinstance(keys, (bytes, bytearray, memoryview)):  # (its items are numbers, not keys)
            raise TypeError
        wanted = None if keys is None else {keys} if isinstance(keys, str) else set(keys)
    except TypeError:  # (set(3) says "'int' object is not iterable", naming no argument)
        raise TypeError(f"keys is a key or a list of keys, got {keys!r:.80}") from None
    # Only the wanted values' entries are kept as the index is read: loading one key of a long
    # run needs the memory of that key's entries, not of the index's.
    rows: List[Dict[str, Any]] = []
    saved: Dict[str, None] = {}  # every saved key, in the order first saved (for a KeyError)
    held: Dict[str, int] = {}  # how many values the index gives each data file
    for one_save in _index_saves(directory):
        for row in one_save:
            held[row["file"]] = held.get(row["file"], 0) + 1
        if wanted is None:
            rows += one_save
        else:
            saved.update(dict.fromkeys(row["key"] for row in one_save))
            rows += [row for row in one_save if row["key"] in wanted]
    if wanted is not None:
        _check_saved(wanted, list(saved), directory)
    at_of: Dict[str, List[int]] = {}  # where in rows each file's values are, in the order saved
    for at, row in enumerate(rows):
        at_of.setdefault(row["file"], []).append(at)
    # Only the wanted values of each file are kept (its others are dropped as soon as it is
    # read): loading a few keys of a long run needs the memory of those keys' values alone.
    values: List[Any] = [_UNREAD] * len(rows)
    for file in sorted(at_of):
        path = directory / file
        rows_of = [rows[at] for at in at_of[file]]
        try:
            found = _data_file(path, [row["name"] for row in rows_of], held[file])
        except ImportError as error:
            # safetensors' torch module imports torch: where torch is what is missing (the
            # 'save' extra installs safetensors alone), installing safetensors would not help.
            if (error.name or "").partition(".")[0] == "torch":
                raise TensorsNeedTorch(path, "torch (pip install torch)", "it") from None
            if importlib.util.find_spec("torch") is None:  # (said now: not after safetensors is installed)
                needs = "torch and the safetensors package (pip install torch 'bcrecord[save]')"
                raise TensorsNeedTorch(path, needs, "them") from None
            raise StorageError(
                "loading tensors needs the safetensors package: pip install 'bcrecord[save]'"
            ) from None
        except _Missing as missing:
            # A value the index names is not in it: another save's file in its place (two writers,
            # a copy mixed up), whose values of the same names are not this save's: none is read.
            found = {}
            names = [
                row["name"] for entries in _index_saves(directory) for row in entries if row["file"] == file
            ]
            lacks = "" if missing.args[0] is None else f"no value {missing.args[0]!r}, which the index names"
            count = f"{missing.holds} value{'' if missing.holds == 1 else 's'}"
            holds = f"{count} where the index names {len(names)}"
            why = f"it has {lacks or holds}: another save's file?"
            _warn_damaged(path, why, rows_of, len(names), len(names))
        except Exception as error:
            if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
                # (a file this process may not read, a disk that fails: no damage to work round)
                raise StorageError(f"cannot read {path}: {error.strerror or error}") from None
            # Every value's name in the file, in the order saved (the index read again: a
            # damaged file is rare, and the names of a long run's every value are not kept).
            names = [
                row["name"] for entries in _index_saves(directory) for row in entries if row["file"] == file
            ]
            found, why = _salvaged(path, names, error)
            lost = [row for row in rows_of if row["name"] not in found]
            if lost:
                unread = sum(name not in found for name in names)
                _warn_damaged(path, why, lost, unread, len(names))
        for at, row in zip(at_of[file], rows_of, strict=True):
            if row["name"] in found:
                values[at] = found[row["name"]]
        del found
    entries = [
        Entry(row["key"], row["step"], value, row)
        for row, value in zip(rows, values, strict=True)
        if value is not _UNREAD
    ]
    return Loaded(entries)


#: A value :func:`load` did not read (its data file is damaged).
_UNREAD = object()


#: The largest safetensors file :func:`load` reads whole where it wants most of its tensors
#: (a larger one's tensors are read one at a time, each into memory of its own).
_READ_WHOLE = 64 << 20


class _Missing(KeyError):
    """A data file lacks a value its index names (``args[0]``, the value's name), or (None) holds
    more values (``holds``) than the index gives it: another save's file."""

    def __init__(self, name: Optional[str], holds: int = 0) -> None:
        super().__init__(name)
        self.holds = holds


def _data_file(path: Path, wanted: Sequence[str], total: int) -> Dict[str, Any]:
    """The ``wanted`` values of one data file, by name (a safetensors file's others are not
    read); raises where the file is damaged or missing, :class:`_Missing` where it lacks one
    or holds more values than ``total``, what the index gives it."""
    if path.suffix == ".safetensors":
        import safetensors.torch  # noqa: F401 (imports torch: where that fails, its ImportError says so)

        # Read, not mapped (safe_open's): a loaded tensor is a copy of its own (one mapped changed
        # with its file, or SIGBUS killed the process reading it once the file was cut short),
        # and one read into its own memory is not copied again out of a mapped file (which held
        # a 200 MB load's values twice: 400 MB at its peak).
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            layout, start = _tensor_layout(handle, size)
            if len(layout) > total:
                raise _Missing(None, len(layout))
            kept = {name: layout[name] for name in wanted if name in layout}
            if len(wanted) * 4 < len(layout) or size > _READ_WHOLE:
                found = _read_tensors(handle, start, kept)
            else:
                # Many small tensors, most of them wanted (a scalar a step): read whole, they
                # load faster than one at a time (each a storage of its own still). Where that
                # fails (safetensors' Python side lacks a dtype its reader has: F4), one at a time.
                try:
                    handle.seek(0)
                    everything = safetensors.torch.load(handle.read())
                except Exception:
                    everything = _read_tensors(handle, start, kept)
                found = {name: everything[name] for name in wanted if name in everything}
                del everything
    else:
        found = _unpickled(path.read_bytes())
        if not isinstance(found, dict):
            raise TypeError(f"it holds a {type(found).__name__}, not a dict of values")
        if len(found) > total:  # (fewer: an older bcrecord named two values of one step alike)
            raise _Missing(None, len(found))
    for name in wanted:
        if name not in found:
            raise _Missing(name)
    return found


#: safetensors' dtype names, each the name of torch's dtype (one a torch release may lack), and
#: how many of its elements a byte of it holds (F4's shape counts halves of torch's packed pairs).
_TENSOR_DTYPES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
    "F4": "float4_e2m1fn_x2",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "C64": "complex64",
    "I64": "int64",
    "U64": "uint64",
    "F64": "float64",
}
#: The dtypes whose header shape counts the halves of torch's packed elements.
_PACKED_IN_PAIRS = frozenset({"F4"})


class _Layout(Dict[str, Tuple[Any, List[int], int, int]]):
    """A safetensors file's tensors by name: each one's dtype, shape and the span of its bytes
    from the data's start; ``size``, how many bytes of data the file has."""

    size = 0


def _tensor_layout(handle: Any, size: int) -> Tuple[_Layout, int]:
    """The tensors of the safetensors file open in ``handle`` (``size`` bytes long) and where its
    data starts, from its header; a ValueError where the file is not whole, as safetensors refuses
    it: a header that does not describe its data, data cut short or followed by other bytes.
    (Tested in tests/torch: the core's doctests run without torch.)"""
    import torch

    length = int.from_bytes(handle.read(8), "little")
    if size < 8 or length > _HEADER_LIMIT or 8 + length > size:
        raise ValueError(f"its header ({length} bytes) does not fit in its {size} bytes")
    header = json.loads(handle.read(length))
    if not isinstance(header, dict):
        raise ValueError("its header is no JSON object")
    layout = _Layout()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = getattr(torch, _TENSOR_DTYPES.get(info["dtype"], ""), None)
        shape, (begin, end) = list(info["shape"]), info["data_offsets"]
        if not isinstance(dtype, torch.dtype) or not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"{name!r} is of dtype {info['dtype']!r} and shape {shape!r}, unknown here")
        if info["dtype"] in _PACKED_IN_PAIRS and shape and shape[-1] % 2 == 0:
            shape[-1] //= 2
        elements = 1
        for n in shape:
            elements *= n
        if type(begin) is not int or type(end) is not int or end - begin != elements * dtype.itemsize:
            raise ValueError(f"{name!r} spans bytes {begin} to {end}, not its {dtype} of shape {shape}")
        layout[name] = (dtype, shape, begin, end)
    for begin, end in sorted(span[2:] for span in layout.values()):
        if begin != layout.size:  # (one after another, from the data's start)
            raise ValueError(f"a value's bytes start at {begin}, not {layout.size}")
        layout.size = end
    if 8 + length + layout.size != size:
        raise ValueError(f"its data is {size - 8 - length} bytes, its header names {layout.size}")
    return layout, 8 + length


def _read_tensors(
    handle: Any, start: int, layout: Mapping[str, Tuple[Any, List[int], int, int]]
) -> Dict[str, Any]:
    """The tensors of ``layout`` read from ``handle``, whose data starts at ``start``: each read
    into memory of its own, which the tensor is (no copy of it made)."""
    import torch

    found = {}
    for name, (dtype, shape, begin, end) in sorted(layout.items(), key=lambda item: item[1][2]):
        if begin == end:  # (frombuffer takes no empty buffer)
            found[name] = torch.empty(shape, dtype=dtype)
            continue
        data = bytearray(end - begin)
        handle.seek(start + begin)
        if handle.readinto(data) != len(data):
            raise ValueError(f"cut short while read: {name!r} is not whole")
        found[name] = torch.frombuffer(data, dtype=torch.uint8).view(dtype).reshape(shape)
    return found


def _salvaged(path: Path, names: Sequence[str], error: Exception) -> Tuple[Dict[str, Any], str]:
    """The intact values of a data file that :func:`_data_file` could not read (``error``),
    and what is wrong with it: never a value some of whose bytes are missing or unread."""
    try:
        data = path.read_bytes()
    except OSError as missing:
        return {}, missing.strerror or str(missing)
    if path.suffix == ".safetensors":
        return _intact_tensors(data)
    return _intact_pickled(data, names), f"{error}; {len(data)} bytes"


def _intact_tensors(data: bytes) -> Tuple[Dict[str, Any], str]:
    """The tensors of a damaged safetensors file whose bytes are all there, and what is wrong.

    Its header (8 bytes of length, then JSON) says where each tensor's bytes are: a file
    cut short keeps those before the cut, one with bytes added after its data keeps all.
    """
    from safetensors.torch import load as load_tensors

    length = int.from_bytes(data[:8], "little")
    start = 8 + length
    header: Any = None
    try:
        header = json.loads(data[8:start]) if len(data) >= 8 and start <= len(data) else None
        spans = {
            name: (int(info["data_offsets"][0]), int(info["data_offsets"][1]))
            for name, info in header.items()
            if name != "__metadata__"
        }
    except Exception:  # (cut inside the header, or bytes of it overwritten)
        header = None
    if not isinstance(header, dict):
        return {}, f"its header is unreadable ({len(data)} bytes): no value of it can be read"
    # What every writer gives: data aligned to 8 bytes, each value's bytes right after the one
    # before. Otherwise the header was changed (a length or an offset overwritten): what it says
    # of any value cannot be trusted (a value read from another's bytes, or 4 bytes early).
    expected = 0
    for begin, end in sorted(spans.values()):
        if begin != expected or end < begin:
            expected = -1
            break
        expected = end
    if start % 8 or expected < 0:
        return (
            {},
            "its header does not describe its data (values' spans overlap, leave gaps or are not aligned): "
            "no value of it can be read",
        )
    kept: Dict[str, Any] = {}
    chunks: List[bytes] = []
    offset = 0
    for name, (begin, end) in spans.items():
        if 0 <= begin <= end and start + end <= len(data):
            kept[name] = dict(header[name], data_offsets=[offset, offset + end - begin])
            chunks.append(data[start + begin : start + end])
            offset += end - begin
    promised = start + max((end for _, end in spans.values()), default=0)
    if promised > len(data):
        why = f"cut short: {len(data)} bytes of the {promised} its header names"
    else:
        why = f"{len(data) - promised} bytes after its last value's"
    rebuilt = json.dumps(kept).encode()
    rebuilt += b" " * (-len(rebuilt) % 8)  # (safetensors aligns its data to 8 bytes)
    try:
        tensors = load_tensors(len(rebuilt).to_bytes(8, "little") + rebuilt + b"".join(chunks))
    except Exception as error:  # a header overwritten in part, still JSON: trust none of it
        return {}, f"its header does not describe its data ({error}): no value of it can be read"
    return cast(Dict[str, Any], tensors), why


class _Salvager(_TolerantUnpickler):
    """Unpickles what it can of a damaged data file; what it had made stays on its stacks."""

    stack: List[Any]
    metastack: List[List[Any]]


def _intact_pickled(data: bytes, names: Sequence[str]) -> Dict[str, Any]:
    """The values of a damaged pickled data file that were whole before it ends or is damaged.

    A data file is one dict, ``{name: value}`` in the order of ``names``, pickled in batches:
    the entries of batches already set into it are whole, and so is each value of the batch in
    progress that the next name follows (pickle writes a value whole before the next name).
    """
    salvager = _Salvager(io.BytesIO(data))
    try:
        made = salvager.load()
        pending: List[Any] = []
    except Exception:
        levels = [*getattr(salvager, "metastack", []), getattr(salvager, "stack", [])]
        made = levels[0][0] if levels[0] else None
        # A batch of one item is set without a mark: its name and value follow the dict itself.
        pending = levels[0][1:] if len(levels[0]) > 1 else levels[1] if len(levels) > 1 else []
    if not isinstance(made, dict) or list(made) != list(names[: len(made)]):
        return {}  # (not the dict of these names: bytes overwritten, it is no data file of ours)
    kept = dict(made)
    for at in range(len(made), len(names) - 1):
        index = 2 * (at - len(made))
        if index + 2 >= len(pending) or not all(
            type(found) is str and found == name
            for found, name in ((pending[index], names[at]), (pending[index + 2], names[at + 1]))
        ):
            break
        kept[names[at]] = pending[index + 1]
    return kept


def _warn_damaged(path: Path, why: str, lost: Sequence[Mapping[str, Any]], unread: int, total: int) -> None:
    """Warn that ``unread`` of the ``total`` values of ``path`` could not be read (``why``), naming
    the keys and steps of those asked for (``lost``)."""
    by_key: Dict[str, List[int]] = {}
    for row in lost:
        by_key.setdefault(row["key"], []).append(row["step"])
    named = []
    for key, steps in by_key.items():
        distinct = sorted(set(steps))
        if len(distinct) == 1:
            named.append(f"{key!r} (step {distinct[0]})")
        elif len(distinct) <= 5:
            named.append(f"{key!r} (steps {', '.join(map(str, distinct))})")
        else:
            named.append(f"{key!r} ({len(steps)} values, steps {distinct[0]}..{distinct[-1]})")
    shown = ", ".join(named[:5]) + (f" and {len(named) - 5} more keys" if len(named) > 5 else "")
    rest = "every other file's values" if unread >= total else "its other values, and every other file's,"
    warnings.warn(
        f"{path} is damaged ({why}): {unread} of its {total} values could not be read; left out: "
        f"{shown}; {rest} are loaded",
        DamagedRecords,
        stacklevel=3,
    )


def saved_index(directory: PathLike) -> List[Dict[str, Any]]:
    """What the index of ``directory`` says of every saved value, in save order, reading no
    value: one dict each, with its ``key``, ``step``, the data ``file`` that holds it, its
    ``kind``, ``shape``, ``dtype``, ``device`` and size in ``bytes`` where known, and the
    ``time`` it was saved.

    >>> import tempfile, bcrecord
    >>> folder = bcrecord.save({"m:f:x@0": [1.0, 2.5]}, tempfile.mkdtemp(), step=3)
    >>> [(row["key"], row["step"], row["dtype"]) for row in saved_index(folder)]
    [('m:f:x@0', 3, 'float'), ('m:f:x@0', 3, 'float')]
    """
    return _read_index(_expanded(directory))


def iter_saved_index(directory: PathLike) -> Iterator[Dict[str, Any]]:
    """The rows of :func:`saved_index`, one at a time, as the index is read a save at a time:
    a long run's index (some 700 bytes a value as dicts) is never held whole.

    >>> import tempfile, bcrecord
    >>> folder = bcrecord.save({"m:f:x@0": [1.0], "m:f:y@0": [2]}, tempfile.mkdtemp())
    >>> [(row["key"], row["dtype"]) for row in iter_saved_index(folder)]
    [('m:f:x@0', 'float'), ('m:f:y@0', 'int')]
    """
    for entries in _index_saves(_expanded(directory)):
        yield from entries


def saved_keys(directory: PathLike) -> List[str]:
    """The keys ``directory`` holds values of, in the order first saved, from its index alone
    (no value is read: a data file of other keys may be damaged).

    >>> import tempfile, bcrecord
    >>> folder = bcrecord.save({"m:f:x@0": [1], "m:f:y@0": [2]}, tempfile.mkdtemp())
    >>> _ = bcrecord.save({"m:f:x@0": [3]}, folder, step=1)
    >>> saved_keys(folder)
    ['m:f:x@0', 'm:f:y@0']
    """
    return list(dict.fromkeys(row["key"] for row in iter_saved_index(directory)))


def _check_saved(wanted: Iterable[str], saved: List[str], directory: Path) -> None:
    """A KeyError naming the first wanted key with no saved value, before any file is read."""
    for key in wanted:
        if not isinstance(key, str):
            raise TypeError(f"a key is a string, got {key!r} ({type(key).__name__})")
    missing = sorted(set(wanted) - set(saved))
    if missing:
        names = list(dict.fromkeys(saved))
        hint = did_you_mean(missing[0], names, hide_private=False)
        raise KeyError(
            f"{directory} has no saved values for {', '.join(map(repr, missing))}{hint}; "
            f"saved keys: {listed(names)}"
        )
