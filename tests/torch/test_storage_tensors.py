"""Tensors saved with bcrecord.storage come back equal, with their index metadata."""

import os
import subprocess
import sys
import warnings

import pytest
import torch

import bcrecord.storage
from bcrecord.storage import DamagedRecords, Writer, load, save
from bcrecord.torch import record
from bcrecord.viz import summarize

from .models import SmallNet


def test_tensor_round_trip_through_safetensors(tmp_path):
    net = SmallNet().eval()
    writer = Writer(tmp_path)
    kept = []
    for step in range(3):
        with record(net, ["bn1", ":forward:x@5"]) as rec:
            net(torch.randn(1, 3, 8, 8))
        writer.write(rec, step=step)
        kept.append(rec["bn1:forward:return"])
    loaded = load(tmp_path)
    assert loaded.steps("bn1:forward:return") == [0, 1, 2]
    assert all(torch.equal(a, b) for a, b in zip(loaded["bn1:forward:return"], kept, strict=True))
    entry = next(e for e in loaded.entries if e.key == "bn1:forward:return")
    assert entry.info["shape"] == [1, 4, 8, 8] and entry.info["dtype"] == "float32"
    assert entry.info["bytes"] == 4 * 4 * 8 * 8 and entry.info["kind"] == "tensor"
    assert sorted(p.suffix for p in (tmp_path / "records").glob("[!.]*")) == [".safetensors"] * 3


def test_tensors_safetensors_cannot_store_are_pickled_with_the_rest_kept(tmp_path):
    wide = torch.randn(3, dtype=torch.complex128)
    sparse = torch.eye(3).to_sparse()
    plain = torch.arange(4.0)
    with warnings.catch_warnings():  # nested tensors' "prototype stage" warning
        warnings.simplefilter("ignore")
        ragged = torch.nested.nested_tensor([torch.ones(2), torch.arange(3.0)])
    Writer(tmp_path).write({"w": [wide], "s": [sparse], "p": [plain], "n": [ragged]}, step=0)
    loaded = load(tmp_path)
    assert torch.equal(loaded["w"][0], wide) and torch.equal(loaded["p"][0], plain)
    assert torch.equal(loaded["s"][0].to_dense(), torch.eye(3))
    assert [t.tolist() for t in loaded["n"][0].unbind()] == [[1.0, 1.0], [0.0, 1.0, 2.0]]
    kinds = {e.key: (e.info["kind"], e.info["dtype"], e.info["shape"]) for e in loaded.entries}
    assert kinds == {
        "w": ("pickle", "complex128", [3]),
        "s": ("pickle", "float32", [3, 3]),
        "p": ("tensor", "float32", [4]),
        "n": ("pickle", "float32", None),
    }
    (nested,) = summarize(loaded, keys=["n"])  # what `bcrecord view` shows: over every element
    assert (nested.shape, nested.min, nested.mean, nested.max) == (None, 0.0, 1.0, 2.0)


def test_every_kind_of_tensor_saved_is_summarized_for_view(tmp_path):
    with warnings.catch_warnings():  # quantized tensors' deprecation warning
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_tensor(torch.tensor([0.0, 0.5, 1.0]), 0.5, 0, torch.quint8)
    kinds = {
        "coo": torch.eye(3).to_sparse(),
        "csr": torch.eye(3).to_sparse_csr(),
        "quantized": quantized,
        "float8": torch.tensor([0.0, 0.5, 1.0]).to(torch.float8_e4m3fn),
    }
    Writer(tmp_path).write({key: [value] for key, value in kinds.items()}, step=0)
    stats = {s.key: (s.min, s.mean, s.max) for s in summarize(load(tmp_path))}
    assert stats["coo"] == stats["csr"] == (0.0, 1 / 3, 1.0)
    assert stats["quantized"] == stats["float8"] == (0.0, 0.5, 1.0)


class Scaled(torch.Tensor):
    """A program's own tensor subclass (as MONAI's MetaTensor): its module is not torch's."""


def test_a_program_s_own_tensor_subclass_is_indexed_and_summarized_as_a_tensor(tmp_path):
    # Told from other values by its module's name, it was none: view showed '-' for a bfloat16 or
    # complex32 one (numpy has no such dtype), and the index said 'torch.bfloat16', device None.
    kinds = {
        "bf16": torch.tensor([1.0, 2.0, 6.0]).bfloat16().as_subclass(Scaled),
        "chalf": torch.tensor([3 + 4j, 0j]).to(torch.chalf).as_subclass(Scaled),
    }
    Writer(tmp_path).write({key: [value] for key, value in kinds.items()}, step=0)
    loaded = load(tmp_path)
    assert type(loaded["bf16"][0]) is Scaled and torch.equal(loaded["bf16"][0], kinds["bf16"])
    assert [(e.info["dtype"], e.info["device"]) for e in loaded.entries] == [
        ("bfloat16", "cpu"),
        ("complex32", "cpu"),
    ]
    stats = {s.key: (s.dtype, s.min, s.mean, s.max) for s in summarize(loaded)}
    assert stats == {"bf16": ("bfloat16", 1.0, 3.0, 6.0), "chalf": ("complex32", 0.0, 2.5, 5.0)}


def test_nested_tensors_of_either_layout_are_summarized_for_view(tmp_path):
    # A jagged nested tensor made view crash: int() of its ragged size raised AttributeError.
    parts = [torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 4.0], [5.0, 6.0]])]
    kinds = {
        layout: torch.nested.nested_tensor(parts, layout=layout) for layout in (torch.strided, torch.jagged)
    }
    with warnings.catch_warnings():  # (the strided layout's prototype warning)
        warnings.simplefilter("ignore")
        Writer(tmp_path).write({str(layout): [value] for layout, value in kinds.items()}, step=0)
        summaries = summarize(load(tmp_path))
    assert [(s.key, s.shape, s.min, s.mean, s.max) for s in summaries] == [
        ("torch.strided", None, 1.0, 3.5, 6.0),
        ("torch.jagged", None, 1.0, 3.5, 6.0),
    ]


def test_a_value_with_no_data_is_named_and_the_save_writes_nothing(tmp_path):
    from bcrecord.storage import UnsavableValue

    with pytest.raises(UnsavableValue, match=r"cannot save 'm:f:w@0' \(step 3\): NotImplementedError"):
        Writer(tmp_path).write({"m:f:x@0": [1.0], "m:f:w@0": [torch.empty(2, device="meta")]}, step=3)
    assert len(load(tmp_path)) == 0 and not list((tmp_path / "records").glob("[!.]*"))


def test_a_meta_tensor_inside_a_value_is_refused_as_one_alone_is(tmp_path):
    from bcrecord.storage import UnsavableValue

    for value in [(torch.ones(1), torch.empty(2, device="meta")), {"h": torch.empty(2, device="meta")}]:
        # The message says why: the meta tensor inside, not only that the container fails.
        why = r"cannot save 'm:f:h@0' \(step 0\): .*a meta tensor has no data"
        with pytest.raises(UnsavableValue, match=why):
            Writer(tmp_path).write({"m:f:h@0": [value]}, step=0)
    assert len(load(tmp_path)) == 0 and not list((tmp_path / "records").glob("[!.]*"))


class _ArrayLike:
    """Not an array, with a shape as numpy gives one."""


def test_a_shape_of_numpy_integers_is_indexed_as_numbers(tmp_path):
    numpy = pytest.importorskip("numpy")
    value = _ArrayLike()
    value.shape = (numpy.int64(3), numpy.int32(2))
    Writer(tmp_path).write({"m:f:a@0": [value]}, step=0)
    (entry,) = load(tmp_path).entries
    assert entry.info["shape"] == [3, 2] and isinstance(entry.value, _ArrayLike)


def test_tensors_inside_values_are_saved_detached_and_loadable(tmp_path):
    leaf = torch.ones(2, requires_grad=True)
    graph = leaf * 3  # a non-leaf that requires grad: torch refuses to pickle it as it is
    half = torch.tensor([1 + 2j, -3j], dtype=torch.complex32)  # torch pickles it and cannot unpickle it
    values = {"m:f:pair@0": [(graph, {"half": half, "n": 4})], "m:f:half@0": [half], "m:f:n@0": [7]}
    Writer(tmp_path).write(values, step=0)
    loaded = load(tmp_path)
    (pair,) = loaded["m:f:pair@0"]
    assert torch.equal(pair[0], torch.full((2,), 3.0)) and not pair[0].requires_grad
    assert pair[1]["half"].dtype == torch.complex32 and pair[1]["n"] == 4
    assert torch.equal(pair[1]["half"].to(torch.complex64), half.to(torch.complex64))
    assert torch.equal(loaded["m:f:half@0"][0].to(torch.complex64), half.to(torch.complex64))
    assert loaded["m:f:n@0"] == [7] and load(tmp_path, keys=["m:f:n@0"])["m:f:n@0"] == [7]


def test_a_tensor_the_save_cannot_hold_is_named_and_with_unsavable_only_it_is_lost(tmp_path):
    from bcrecord.storage import UnsavableValue

    odd = torch.zeros(4, dtype=torch.uint8).view(torch.uint4) if hasattr(torch, "uint4") else None
    if odd is None:
        pytest.skip("this torch has no uint4")
    values = {"m:f:x@0": [torch.arange(3.0)], "m:f:odd@0": [odd], "m:f:n@0": [1]}
    with pytest.raises(UnsavableValue, match=r"cannot save 'm:f:odd@0' \(step 2\): Tensor cannot be saved"):
        Writer(tmp_path / "strict").write(values, step=2)
    told = []
    assert Writer(tmp_path / "lenient").write(values, step=2, unsavable=lambda *a: told.append(a)) == 3
    assert [(key, step) for key, step, _ in told] == [("m:f:odd@0", 2)]
    loaded = load(tmp_path / "lenient")
    assert torch.equal(loaded["m:f:x@0"][0], torch.arange(3.0)) and loaded["m:f:n@0"] == [1]
    assert isinstance(loaded["m:f:odd@0"][0], str)  # its repr


def test_a_key_that_is_no_utf8_text_saves_its_tensor(tmp_path):
    key = "m:f:\udc80x@0"  # a lone surrogate (a file name read with surrogateescape)
    Writer(tmp_path).write({key: [torch.arange(2.0)], "m:f:y@0": [torch.ones(1)]}, step=0)
    loaded = load(tmp_path)
    assert torch.equal(loaded[key][0], torch.arange(2.0)) and loaded.entries[0].info["kind"] == "tensor"


class Tagged(torch.Tensor):
    """A program's own tensor class."""


class OwnPickling(torch.Tensor):
    """A tensor class that pickles its own way."""

    def __reduce_ex__(self, protocol):
        return super().__reduce_ex__(protocol)


def test_tensor_subclasses_inside_values_are_saved_detached(tmp_path):
    tagged = (torch.ones(2, requires_grad=True) * 2).as_subclass(Tagged)
    tagged.layer = "layer3"  # an attribute set on it is saved with it
    param = torch.nn.Parameter(torch.arange(2.0))
    Writer(tmp_path).write({"m:f:pair@0": [(tagged, {"p": param})]}, step=0)
    (pair,) = load(tmp_path)["m:f:pair@0"]
    assert torch.equal(pair[0], torch.full((2,), 2.0)) and not pair[0].requires_grad
    assert type(pair[0]) is Tagged and pair[0].layer == "layer3"
    assert torch.equal(pair[1]["p"], torch.arange(2.0)) and not pair[1]["p"].requires_grad


def test_a_subclass_with_its_own_pickling_of_a_dtype_pickle_cannot_read_back_loads(tmp_path):
    half = torch.tensor([1 + 2j], dtype=torch.complex32).as_subclass(OwnPickling)
    Writer(tmp_path).write({"m:f:h@0": [(half, 1)], "m:f:n@0": [2]}, step=0)
    loaded = load(tmp_path)
    (pair,) = loaded["m:f:h@0"]
    assert pair[0].dtype == torch.complex32 and torch.equal(
        pair[0].to(torch.complex64), half.to(torch.complex64)
    )
    assert loaded["m:f:n@0"] == [2]


def test_a_tensor_subclass_whose_class_is_gone_loses_no_other_value_of_its_save(tmp_path, monkeypatch):
    # A program's own tensor subclass in a tuple (pickled), loaded where its module is not:
    # torch cannot rebuild it on the stand-in class, which made the whole data file unreadable.
    import sys

    import bcrecord

    (tmp_path / "own_tensors.py").write_text("import torch\nclass Tagged(torch.Tensor):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import own_tensors

    tagged = torch.arange(3.0).as_subclass(own_tensors.Tagged)
    Writer(tmp_path / "saved").write({"m:f:pair@0": [(tagged, torch.ones(2))], "m:f:n@0": [7]}, step=0)
    monkeypatch.delitem(sys.modules, "own_tensors")
    (tmp_path / "own_tensors.py").unlink()
    loaded = load(tmp_path / "saved")
    (gone, ones), n = loaded["m:f:pair@0"][0], loaded["m:f:n@0"]
    assert isinstance(gone, bcrecord.storage.Unloadable) and gone.args[1]._where == "own_tensors.Tagged"
    assert torch.equal(ones, torch.ones(2)) and n == [7]


def _tensors_saved(folder):
    """Two saves: 20 tensors of several dtypes (file 1), one more (file 2); what was saved."""
    kinds = (torch.float32, torch.bfloat16, torch.int64, torch.float16, torch.bool)
    saved = [torch.arange(n * 10, dtype=torch.float64).to(kinds[n % 5]) for n in range(20)]
    save({"m:f:x@0": saved}, folder, step=0)
    save({"m:f:x@0": [torch.ones(2)]}, folder, step=1)
    return saved, folder / "records" / "000001.safetensors"


@pytest.mark.parametrize("cut", [0.5, 0.99])
def test_a_safetensors_file_cut_short_keeps_every_tensor_whose_bytes_are_there(tmp_path, cut):
    # load() raised 'incomplete metadata, file not fully covered': every value of the run was lost.
    saved, data = _tensors_saved(tmp_path)
    whole = data.read_bytes()
    data.write_bytes(whole[: int(len(whole) * cut)])
    with pytest.warns(DamagedRecords) as caught:
        loaded = load(tmp_path)
    # (by its position in the save, from its name in the file: "m:f:x@0#0#<position>")
    kept = {int(e.info["name"].rsplit("#", 1)[1]): e.value for e in loaded.entries if e.step == 0}
    assert 0 < len(kept) < 20 and all(
        torch.equal(value, saved[n]) and value.dtype == saved[n].dtype for n, value in kept.items()
    )
    assert torch.equal(loaded["m:f:x@0"][-1], torch.ones(2)) and loaded.steps("m:f:x@0")[-1] == 1
    (message,) = [str(warning.message) for warning in caught]
    assert message.startswith(
        f"{data} is damaged (cut short: {int(len(whole) * cut)} bytes of the {len(whole)} its header names): "
        f"{20 - len(kept)} of its 20 values could not be read"
    )


@pytest.mark.parametrize("damage", ["empty", "header", "added"])
def test_a_safetensors_file_emptied_overwritten_or_added_to_loses_no_other_file_s_values(tmp_path, damage):
    saved, data = _tensors_saved(tmp_path)
    whole = data.read_bytes()
    if damage == "added":  # bytes after its data: every tensor is whole
        data.write_bytes(whole + b"more")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert all(torch.equal(a, b) for a, b in zip(load(tmp_path)["m:f:x@0"], saved, strict=False))
        return
    data.write_bytes(b"" if damage == "empty" else whole[:20] + b"\xff" * 8 + whole[28:])
    with pytest.warns(
        DamagedRecords, match=r"its header is unreadable .* 20 of its 20 values could not be read"
    ):
        loaded = load(tmp_path)
    assert loaded.steps("m:f:x@0") == [1] and torch.equal(loaded["m:f:x@0"][0], torch.ones(2))


@pytest.mark.parametrize("lie", ["overlap", "length"])
def test_a_safetensors_header_whose_offsets_or_length_were_overwritten_returns_no_wrong_value(tmp_path, lie):
    # Salvage trusted every span inside the file: one value's offsets moved into another's
    # bytes, or a length 4 short (all read 4 bytes early), gave wrong values, and no warning.
    import json

    saved, data = _tensors_saved(tmp_path)
    whole = data.read_bytes()
    length = int.from_bytes(whole[:8], "little")
    if lie == "overlap":
        header = json.loads(whole[8 : 8 + length])
        name = next(n for n in header if n.endswith("#3"))
        header[name]["data_offsets"] = [0, header[name]["data_offsets"][1] - header[name]["data_offsets"][0]]
        text = json.dumps(header, separators=(",", ":")).encode()
        data.write_bytes(whole[:8] + text + b" " * (length - len(text)) + whole[8 + length :])
    else:
        data.write_bytes((length - 4).to_bytes(8, "little") + whole[8:])
    # (4 bytes short may end the JSON inside its padding, or cut it: unreadable)
    said = r"its header (does not describe its data|is unreadable) .* 20 of its 20 values could not be read"
    with pytest.warns(DamagedRecords, match=said):
        loaded = load(tmp_path)
    assert loaded.steps("m:f:x@0") == [1] and torch.equal(loaded["m:f:x@0"][0], torch.ones(2))


def test_a_view_inside_a_value_is_saved_without_the_rest_of_its_storage(tmp_path):
    # A tuple holding one row of a (1000, 1000) batch saved all 4 MB of the batch, and loaded them.
    batch = torch.randn(1000, 1000)
    row, corner, expanded = batch[7], batch.t()[:3, :3], torch.ones(3).expand(1000, 3)
    save({"m:f:out@0": [(row, corner, expanded, batch[:2].clone())]}, tmp_path)
    assert (tmp_path / "records" / "000001.pkl").stat().st_size < 40_000
    loaded = load(tmp_path)["m:f:out@0"][0]
    assert all(torch.equal(a, b) for a, b in zip(loaded, (row, corner, expanded, batch[:2]), strict=True))
    assert [t.untyped_storage().nbytes() for t in loaded] == [4000, 36, 12, 8000]


def test_a_quantized_view_is_saved_without_the_rest_of_its_storage(tmp_path):
    # Quantized tensors are pickled: 4 and 1,000 numbers of a (1000, 1000) qint8 batch saved 2 MB.
    batch = torch.quantize_per_tensor(torch.randn(1000, 1000), 0.1, 3, torch.qint8)
    row, column = batch[7, :4], batch[:, 2]
    save({"m:f:q@0": [row], "m:f:qs@0": [(column,)]}, tmp_path)
    assert (tmp_path / "records" / "000001.pkl").stat().st_size < 40_000
    loaded = load(tmp_path)
    kept_row, (kept_column,) = loaded["m:f:q@0"][0], loaded["m:f:qs@0"][0]
    assert torch.equal(kept_row.dequantize(), row.dequantize())
    assert torch.equal(kept_column.dequantize(), column.dequantize())
    assert kept_row.q_scale() == 0.1 and kept_row.q_zero_point() == 3
    assert [kept_row.untyped_storage().nbytes(), kept_column.untyped_storage().nbytes()] == [4, 1000]


BOXES_MODULE = '''
import torch

class Boxes(torch.Tensor):
    """As torchvision's tv_tensors.BoundingBoxes: a format saying what its numbers mean, and
    every operation but detach and clone giving a plain tensor."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        out = super().__torch_function__(func, types, args, kwargs or {})
        if func in (torch.Tensor.detach, torch.Tensor.clone) and isinstance(args[0], Boxes):
            out = out.as_subclass(Boxes) if type(out) is not Boxes else out
            out.format = args[0].format
            return out
        return out.as_subclass(torch.Tensor) if isinstance(out, Boxes) else out
'''


def test_another_package_s_tensor_subclass_saved_alone_keeps_its_class_and_attributes(tmp_path, monkeypatch):
    # A torchvision BoundingBoxes saved alone went to safetensors (its module starts with "torch"),
    # and loaded as a plain tensor without its format; inside a tuple it kept both.
    (tmp_path / "torchboxes.py").write_text(BOXES_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import torchboxes

    boxes = torch.tensor([[0.0, 0, 5, 5]]).as_subclass(torchboxes.Boxes)
    boxes.format = "XYXY"
    Writer(tmp_path / "saved").write({"m:f:boxes@0": [boxes], "m:f:pair@0": [(boxes, 1)]}, step=0)
    loaded = load(tmp_path / "saved")
    alone, (inside, _) = loaded["m:f:boxes@0"][0], loaded["m:f:pair@0"][0]
    for value in (alone, inside):
        assert type(value) is torchboxes.Boxes and value.format == "XYXY"
        assert torch.equal(value.as_subclass(torch.Tensor), torch.tensor([[0.0, 0, 5, 5]]))
    row = loaded.entries[0].info
    assert (row["kind"], row["dtype"], row["shape"]) == ("pickle", "float32", [1, 4])


def test_a_masked_tensor_saved_alone_keeps_its_data_and_mask(tmp_path):
    # torch's MaskedTensor (a wrapper subclass, of a "torch" module) went to safetensors, which
    # cannot reach its data: it was refused, and `bcrecord run` saved its repr; in a tuple it saved.
    with warnings.catch_warnings():  # its "prototype stage" warning
        warnings.simplefilter("ignore")
        from torch.masked import masked_tensor

        masked = masked_tensor(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False, True]))
        Writer(tmp_path).write({"m:f:x@0": [masked], "m:f:pair@0": [(masked, 1)]}, step=0)
        loaded = load(tmp_path)
        alone, (inside, _) = loaded["m:f:x@0"][0], loaded["m:f:pair@0"][0]
        for value in (alone, inside):
            assert type(value) is type(masked)
            assert torch.equal(value.get_data(), torch.tensor([1.0, 2.0, 3.0]))
            assert torch.equal(value.get_mask(), torch.tensor([True, False, True]))
        # `bcrecord view` counts the elements not masked out (its own ops refuse most reductions)
        (summary,) = summarize(loaded, keys="m:f:x@0")
    assert (summary.min, summary.mean, summary.max) == (1.0, 2.0, 3.0)
    assert loaded.entries[0].info["kind"] == "pickle"


def test_an_untyped_storage_comes_back_as_one_with_its_bytes(tmp_path):
    # torch pickles an UntypedStorage and cannot unpickle it: it saved, and loaded as an Unloadable.
    storage = torch.tensor([1.5, -2.0]).untyped_storage()
    Writer(tmp_path).write({"m:f:s@0": [storage], "m:f:pair@0": [(storage, 1)]}, step=0)
    loaded = load(tmp_path)
    for value in (loaded["m:f:s@0"][0], loaded["m:f:pair@0"][0][0]):
        assert type(value) is torch.UntypedStorage
        assert torch.equal(torch.empty(0).set_(value), torch.tensor([1.5, -2.0]))


def test_a_file_of_many_small_tensors_is_read_whole_and_a_few_of_them_one_at_a_time(tmp_path, monkeypatch):
    save({"loss": [torch.tensor(float(i)) for i in range(40)], "x": [torch.arange(3.0)]}, tmp_path)
    read = bcrecord.storage._read_tensors
    asked = []

    def counted(handle, start, layout):
        asked.extend(layout)
        return read(handle, start, layout)

    monkeypatch.setattr(bcrecord.storage, "_read_tensors", counted)
    loaded = load(tmp_path)
    assert [float(value) for value in loaded["loss"]] == [float(i) for i in range(40)] and asked == []
    assert loaded["x"][0].untyped_storage().nbytes() == 12  # (a storage of its own, not the file's)
    assert torch.equal(load(tmp_path, keys=["x"])["x"][0], torch.arange(3.0)) and asked == ["x#0#0"]


def test_a_save_of_many_tensors_lays_them_out_itself_as_safetensors_reads_them(tmp_path, monkeypatch):
    import safetensors.torch
    from safetensors import safe_open

    values = {
        "flag": [torch.tensor(True)],
        "x": [torch.arange(6.0).reshape(2, 3)[:, 1]],  # (a view: saved as its own data)
        "half": [torch.ones(3, dtype=torch.float16)],
        "empty": [torch.zeros(0, 4)],
        "bf16": [torch.full((2,), 1.5, dtype=torch.bfloat16)],
        "ints": [torch.arange(5)],
        "loss": [torch.tensor(0.25), torch.tensor(0.5)],
    }
    save(values, tmp_path, step=0)  # (asks safetensors what each dtype is called, once)
    asked = []
    real = safetensors.torch.save
    monkeypatch.setattr(safetensors.torch, "save", lambda *args: asked.append(len(args[0])) or real(*args))
    save(values, tmp_path, step=1)
    assert asked == []  # safetensors' save converted each tensor to numpy on its own: 85 us a tensor
    with safe_open(str(tmp_path / "records" / "000002.safetensors"), framework="pt") as data:
        read = {name: data.get_tensor(name) for name in data.keys()}
    assert sorted(read) == sorted(f"{key}#1#{n}" for key, kept in values.items() for n in range(len(kept)))
    for key, kept in values.items():
        for n, value in enumerate(kept):
            same = read[f"{key}#1#{n}"]
            assert same.dtype == value.dtype and same.shape == value.shape and torch.equal(same, value), key
    assert all(
        torch.equal(a, b) for key in values for a, b in zip(load(tmp_path)[key], values[key] * 2, strict=True)
    )


def test_a_packed_dtype_safetensors_lays_out_its_own_way_round_trips(tmp_path):
    packed = getattr(torch, "float4_e2m1fn_x2", None)
    if packed is None:
        pytest.skip("no packed float4 dtype in this torch")
    value = torch.arange(6, dtype=torch.uint8).reshape(2, 3).view(packed)
    save({"p": [value], "loss": [torch.tensor(1.0)] * 3}, tmp_path)  # (its shape counts halves there)
    loaded = load(tmp_path)["p"][0]
    assert loaded.dtype == packed and loaded.shape == (2, 3)
    assert loaded.view(torch.uint8).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_a_save_writes_each_tensor_from_its_own_memory_conj_and_neg_views_resolved(tmp_path, monkeypatch):
    import bcrecord.storage as storage

    big = torch.arange(1000.0)
    conj = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64).conj()  # (lazy views: a bit, no data)
    neg = torch._neg_view(torch.tensor([1.0, 2.0]))
    written = []
    real = storage._atomic_write

    def spy(path, data, *rest):
        written.append((path.suffix, data))
        real(path, data, *rest)

    monkeypatch.setattr(storage, "_atomic_write", spy)
    save({"big": [big, big[10:]], "conj": [conj], "neg": [neg]}, tmp_path, step=0)
    # Written straight from each tensor's memory: a save of a 512 MiB tensor peaked 1.5 GiB above
    # its start when each was copied, then joined, then copied into bytes; now 10 MiB.
    [parts] = [data for suffix, data in written if suffix == ".safetensors"]
    addresses = [torch.frombuffer(part, dtype=torch.uint8).data_ptr() for part in parts[1:]]
    assert big.data_ptr() in addresses and big[10:].data_ptr() in addresses
    loaded = load(tmp_path)
    assert torch.equal(loaded["big"][0], big) and torch.equal(loaded["big"][1], torch.arange(10.0, 1000.0))
    assert loaded["conj"][0].tolist() == [1 - 2j, 3 + 1j] and not loaded["conj"][0].is_conj()
    assert loaded["neg"][0].tolist() == [-1.0, -2.0]


def test_a_save_of_tensors_without_safetensors_says_what_to_install_and_writes_nothing(tmp_path, monkeypatch):
    import sys

    from bcrecord.storage import StorageError

    writer = Writer(tmp_path)
    for name in ("safetensors", "safetensors.torch"):  # (None: not importable here)
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(StorageError, match=r"needs the safetensors package: pip install 'bcrecord\[save\]'"):
        writer.write({"t": [torch.ones(2)], "n": [3]}, step=0)
    assert [p.name for p in (tmp_path / "records").iterdir()] == [".lock"]
    assert list(load(tmp_path).keys()) == []


def test_a_tensor_safetensors_never_stores_is_pickled_without_safetensors_installed(tmp_path, monkeypatch):
    # It is pickled where safetensors is installed; without it, the save asked for safetensors.
    import sys

    monkeypatch.setattr(bcrecord.storage, "_safetensors_dtypes", {})  # (what an earlier test asked of it)
    for name in ("safetensors", "safetensors.torch"):  # (None: not importable here)
        monkeypatch.setitem(sys.modules, name, None)
    wide = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex128)
    save({"z": [wide], "n": [3]}, tmp_path)
    [row, _] = bcrecord.storage.saved_index(tmp_path)
    assert (row["kind"], row["file"], row["dtype"]) == ("pickle", "records/000001.pkl", "complex128")
    loaded = load(tmp_path)
    assert loaded["z"][0].dtype == torch.complex128 and loaded["z"][0].tolist() == [1 + 2j, 3 - 4j]


def _header_length(path):
    with open(path, "rb") as data:
        return int.from_bytes(data.read(8), "little")


def test_a_save_whose_header_would_pass_safetensors_limit_fills_several_files_that_all_load(
    tmp_path, monkeypatch
):
    # Written whole, a header over safetensors' MAX_HEADER_SIZE (a million scalars of one save)
    # loaded none of the save's values: "header too large". Here the limit is lowered.
    monkeypatch.setattr(bcrecord.storage, "_HEADER_LIMIT", 4000)
    losses = [torch.tensor(float(i)) for i in range(150)]
    save({"m:f:loss@0": losses, "m:f:x@0": [torch.arange(6.0).reshape(2, 3)], "m:f:s@0": ["text"]}, tmp_path)
    save({"m:f:loss@0": [torch.tensor(-1.0)]}, tmp_path, step=1)
    records = tmp_path / "records"
    files = sorted(path.name for path in records.glob("[!.]*"))
    parts = [name for name in files if name.endswith(".safetensors")]
    assert len(parts) >= 4 and "000001.pkl" in files  # (the pickled values beside its first part)
    assert parts == [f"{number:06d}.safetensors" for number in range(1, len(parts) + 1)]  # the last: step 1's
    assert all(_header_length(records / name) <= 4000 for name in parts)
    loaded = load(tmp_path)
    assert [float(value) for value in loaded["m:f:loss@0"]] == [float(i) for i in range(150)] + [-1.0]
    assert loaded.steps("m:f:loss@0") == [0] * 150 + [1]
    assert torch.equal(loaded["m:f:x@0"][0], torch.arange(6.0).reshape(2, 3)) and loaded["m:f:s@0"] == [
        "text"
    ]
    assert [float(value) for value in load(tmp_path, keys=["m:f:loss@0"])["m:f:loss@0"]][-3:] == [
        148.0,
        149.0,
        -1.0,
    ]


def test_a_tensor_whose_name_alone_passes_the_header_limit_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(bcrecord.storage, "_HEADER_LIMIT", 400)
    key = "m:f:" + "x" * 400 + "@0"
    with pytest.raises(
        bcrecord.storage.UnsavableValue, match=r"\(step 2\): its name is too long .* 400 bytes"
    ):
        save({key: [torch.ones(2)]}, tmp_path / "run", step=2)
    assert not (tmp_path / "run").exists()


def _overwrite_data(path):
    """Overwrite the last 64 bytes of ``path`` in place (as ``cp`` of another file over it does)."""
    with open(path, "r+b") as data:
        data.seek(path.stat().st_size - 64)
        data.write(b"\x00\x00\x80\x3f" * 16)  # (float32 1.0)


@pytest.mark.parametrize("read_whole", [64 << 20, 0])
def test_loaded_tensors_do_not_change_when_their_data_file_is_overwritten(tmp_path, monkeypatch, read_whole):
    # Tensors read one at a time (a few keys of a file; every one of a file over 64 MB) stayed
    # mapped onto the file: overwritten, they changed; cut short, reading them killed the process.
    monkeypatch.setattr(bcrecord.storage, "_READ_WHOLE", read_whole)  # (0: as a large file's)
    save({f"k{i}": [torch.zeros(4)] for i in range(10)}, tmp_path)
    few = load(tmp_path, keys=["k9"])["k9"][0]
    every = load(tmp_path)
    path = tmp_path / "records" / "000001.safetensors"
    _overwrite_data(path)
    assert load(tmp_path, keys=["k9"])["k9"][0].tolist() == [1.0] * 4  # (the file did change)
    assert few.tolist() == [0.0] * 4
    assert all(every[f"k{i}"][0].tolist() == [0.0] * 4 for i in range(10))
    path.write_bytes(b"")  # cut short
    assert few.tolist() == [0.0] * 4 and every["k9"][0].tolist() == [0.0] * 4


_EVERY_DTYPE = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.uint16,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.uint32,
    torch.float32,
    torch.complex64,
    torch.int64,
    torch.uint64,
    torch.float64,
    *(
        getattr(torch, name)
        for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
        if hasattr(torch, name)
    ),
]


def _bits(tensor):
    """``tensor``'s bytes and shape (float8's NaNs and equality need no care)."""
    return (
        tuple(tensor.shape),
        tensor.dtype,
        bytes(tensor.reshape(-1).view(torch.uint8).tolist()),
    )


@pytest.mark.parametrize("read_whole", [64 << 20, 0])
def test_tensors_of_every_dtype_and_shape_load_as_saved_read_whole_or_one_at_a_time(
    tmp_path, monkeypatch, read_whole
):
    monkeypatch.setattr(bcrecord.storage, "_READ_WHOLE", read_whole)  # (0: as a large file's)
    values = {}
    for dtype in _EVERY_DTYPE:
        data = torch.arange(1, 17, dtype=torch.uint8)
        whole = (data % 2 if dtype == torch.bool else data).view(dtype)  # (a bool's bytes 0 or 1)
        values[str(dtype)] = [whole.reshape(2, -1), whole[0].reshape(()), whole[:0], whole[:0].reshape(0, 3)]
    if hasattr(torch, "float4_e2m1fn_x2"):  # (its header's shape counts halves)
        values["float4"] = [torch.arange(6, dtype=torch.uint8).view(torch.float4_e2m1fn_x2).reshape(2, 3)]
    save(values, tmp_path)
    for keys in (None, ["torch.float32"]):
        loaded = load(tmp_path, keys=keys)
        for key in loaded:
            assert [_bits(value) for value in loaded[key]] == [_bits(value) for value in values[key]], key


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="measures with Linux's /proc")
def test_loaded_tensors_are_read_into_their_own_memory_not_copied_out_of_a_mapped_file(tmp_path):
    # Each tensor was copied out of the file safe_open mapped, which stayed mapped meanwhile:
    # a load of 80 MB of values reached 164 MB more than before it.
    save({"k": [torch.randn(1024, 1024) for _ in range(20)]}, tmp_path)
    measure = f"""
import bcrecord, torch
def status(field):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(field + ":"))
with open("/proc/self/clear_refs", "w") as reset:
    reset.write("5")  # (the process's peak size: its size now)
before = status("VmHWM")
values = bcrecord.load({str(tmp_path)!r})["k"]
assert len(values) == 20 and values[0].dtype == torch.float32 and values[0].shape == (1024, 1024)
print((status("VmHWM") - before) >> 10)
"""
    ran = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True)
    if "Permission denied" in ran.stderr:
        pytest.skip("this process may not reset its peak size")
    assert ran.returncode == 0, ran.stderr
    assert 70 < int(ran.stdout) < 120, ran.stdout  # (80 MB of values, in MB)


@pytest.mark.parametrize("cut", [False, True])
def test_a_damaged_file_read_one_tensor_at_a_time_loses_only_what_is_not_whole(tmp_path, monkeypatch, cut):
    monkeypatch.setattr(bcrecord.storage, "_READ_WHOLE", 0)
    save({f"k{i}": [torch.full((2,), float(i))] for i in range(5)}, tmp_path)
    path = tmp_path / "records" / "000001.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-4] if cut else data + b"\0" * 8)  # (bytes after its data: every value whole)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = load(tmp_path)
    told = [str(warning.message) for warning in caught if warning.category is DamagedRecords]
    assert {key: loaded[key][0].tolist() for key in loaded} == {
        f"k{i}": [float(i)] * 2 for i in range(4 if cut else 5)
    }
    assert len(told) == cut and (not cut or "cut short" in told[0] and "'k4' (step 0)" in told[0])


class _Killed(BaseException):
    """What stops a save mid-write here, as a kill would: nothing cleans up after it."""


def test_the_next_save_removes_what_a_save_of_several_files_killed_mid_write_left(tmp_path, monkeypatch):
    # A save of several tensor files killed writing its third left its first two and a temporary
    # file: the next save replaced the first alone, and the others stayed for good.
    monkeypatch.setattr(bcrecord.storage, "_HEADER_LIMIT", 1500)
    save({"a": [torch.zeros(1)]}, tmp_path, step=0)
    write, writes = bcrecord.storage._atomic_write, []

    def killed_at_the_third(path, data, unlocked=False):
        writes.extend([path.name] if path.suffix == ".safetensors" else [])  # (not its .write-test)
        if len(writes) == 3:
            bcrecord.storage._temporary(path).write_bytes(b"partial")
            raise _Killed
        write(path, data, unlocked)

    monkeypatch.setattr(bcrecord.storage, "_atomic_write", killed_at_the_third)
    with pytest.raises(_Killed):
        save({"a": [torch.full((1,), float(i)) for i in range(1, 40)], "p": ["pickled"]}, tmp_path, step=1)
    records = tmp_path / "records"
    assert sorted(path.name for path in records.iterdir()) == [
        ".000004.safetensors.tmp",
        ".lock",
        *(f"00000{number}.safetensors" for number in (1, 2, 3)),
    ]
    monkeypatch.setattr(bcrecord.storage, "_atomic_write", write)
    save({"a": [torch.full((1,), 100.0)], "p": ["second"]}, tmp_path, step=2)
    assert sorted(path.name for path in records.iterdir()) == [
        ".lock",
        "000001.safetensors",
        "000002.pkl",
        "000002.safetensors",
    ]
    loaded = load(tmp_path)
    assert [value.tolist() for value in loaded["a"]] == [[0.0], [100.0]] and loaded["p"] == ["second"]


class _NoAbs(torch.Tensor):
    """A complex tensor torch takes no abs of (torch 2.14's bcomplex32: "abs_cpu" not implemented)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.abs and args[0].dtype != torch.complex64:
            raise NotImplementedError('"abs_cpu" not implemented for this kind')
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_complex_tensor_torch_takes_no_abs_of_is_summarized_by_magnitude(tmp_path):
    # view showed '-' for a bcomplex32 value, and drew nothing of it, saying nothing.
    from bcrecord import viz

    value = torch.tensor([3 + 4j, 0j]).to(torch.complex32).as_subclass(_NoAbs)
    assert viz._stats(value) == (0.0, 5.0, 5.0, 2)  # (min, sum, max, count) of the magnitudes
    assert viz._numpy_array(value).tolist() == [5.0, 0.0]
