"""``bcrecord run`` and ``view`` on torch programs, end to end through subprocesses.

Needs torch, safetensors and matplotlib (``pip install -e '.[torch,save,viz,test]'``).
"""

import collections
import gc
import html.parser
import io
import textwrap
import weakref
from pathlib import Path
from urllib.parse import unquote

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import bcrecord  # noqa: E402

from ..commands import cli, one_clear_line, plain  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


SCRIPT = """
import sys
import torch
from bcrecord.demo_model import TinyResNet, example_images

torch.manual_seed(0)
model = TinyResNet().eval()
images, _ = example_images(4)
steps, reference = int(sys.argv[1]), sys.argv[2]
outputs = []
with torch.no_grad():
    for step in range(steps):
        outputs.append(model(images + 0.1 * step))
torch.save(outputs, reference)
print("logits", [round(v, 4) for v in outputs[-1][0].tolist()])
sys.exit(int(sys.argv[3]) if len(sys.argv) > 3 else 0)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "infer.py"
    path.write_text(textwrap.dedent(SCRIPT))
    return path


def test_run_torch_script(script, tmp_path):
    expected = plain(script, 3, tmp_path / "plain.pt", 5, cwd=tmp_path)
    assert expected.returncode == 5, expected.stderr
    out = tmp_path / "records"
    result = cli(
        "run",
        "--record",
        "bcrecord.demo_model:TinyResNet.forward:x",
        "--record",
        "bcrecord.demo_model:BasicBlock.forward:out@1",
        "--save-dir",
        out,
        script,
        3,
        tmp_path / "recorded.pt",
        5,
        cwd=tmp_path,
    )
    assert result.returncode == 5, result.stderr
    assert result.stdout == expected.stdout
    assert "saved 30 value(s) of 9 key(s)" in result.stderr

    outputs = torch.load(tmp_path / "recorded.pt")
    loaded = bcrecord.load(out)
    assert loaded.steps("TinyResNet:forward:x@7") == [0, 1, 2]
    for recorded, output in zip(loaded["TinyResNet:forward:x@7"], outputs, strict=True):
        assert torch.equal(recorded, output)
    # BasicBlock.forward runs twice per forward (layer1.0, layer2.0): six values.
    before_relu = loaded["BasicBlock:forward:out@1"]
    assert len(before_relu) == 6 and all(float(v.min()) < 0 for v in before_relu)
    after_relu = loaded["TinyResNet:forward:x@2"]
    assert all(float(v.min()) >= 0 for v in after_relu)


def test_run_every_nth_and_flush_on_exception(script, tmp_path):
    crash = tmp_path / "crash.py"
    crash.write_text(
        script.read_text().replace("torch.save(outputs, reference)", "raise RuntimeError('late')")
    )
    out = tmp_path / "records"
    result = cli(
        "run",
        "-r",
        "bcrecord.demo_model:TinyResNet.forward:return",
        "-o",
        out,
        "-n",
        "2",
        crash,
        5,
        "unused",
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert "RuntimeError: late" in result.stderr
    assert bcrecord.load(out).steps("TinyResNet:forward:return") == [0, 2, 4]


def _png_std(path):
    import matplotlib.image

    pixels = matplotlib.image.imread(str(path))
    return float(pixels[..., :3].std())


class _Images(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.sources = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(unquote(dict(attrs)["src"]))


def test_run_summarizes_a_nested_tensor(tmp_path):
    # What nn.TransformerEncoder's eval fast path makes of a padded batch: no one shape.
    program = tmp_path / "ragged.py"
    program.write_text(
        textwrap.dedent(
            """
            import warnings
            import torch
            warnings.simplefilter("ignore")

            def pack():
                batch = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
                shape = torch.empty(2, device="meta")  # no data to save
                return batch

            print(pack().is_nested)
            """
        )
    )
    result = cli("run", "-r", "__main__:pack:batch", program, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr
    assert "__main__:pack:batch@0  1       Tensor (nested) float32" in result.stderr
    assert "Traceback" not in result.stderr
    # Saved: the nested tensor as it is, the meta tensor as its repr (with a warning).
    saved = cli(
        "run", "-r", "__main__:pack:batch", "-r", "__main__:pack:shape", "-o", "out", program, cwd=tmp_path
    )
    assert saved.returncode == 0 and "saved 2 value(s) of 2 key(s)" in saved.stderr, saved.stderr
    assert "__main__:pack:shape@0: a meta tensor has no data; saved its repr" in saved.stderr
    loaded = bcrecord.load(tmp_path / "out")
    assert loaded["__main__:pack:shape@0"] == ["tensor(..., device='meta', size=(2,))"]
    assert [t.tolist() for t in loaded["__main__:pack:batch@0"][0].unbind()] == [[1.0, 1.0], [1.0, 1.0, 1.0]]


def test_view_draws_every_key(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "records"
    torch.manual_seed(0)
    for step in range(3):
        bcrecord.save(
            {
                "m:f:maps@0": [torch.randn(2, 5, 12, 12) + step],
                "m:f:chw@0": [torch.randn(3, 8, 8)],
                "m:f:matrix@0": [torch.randn(6, 9)],
                "m:f:vector@0": [torch.randn(50)],
                "m:f:loss@0": [1.0 / (step + 1)],
                "m:f:name@0": ["text"],
            },
            out,
            step=step * 10,
        )
    result = cli("view", out)
    assert result.returncode == 0, result.stderr
    table = result.stdout.splitlines()
    assert table[0].split() == ["key", "steps", "shape", "dtype", "min", "mean", "max"]
    row = next(line for line in table if line.startswith("m:f:maps@0"))
    assert row.split()[1:5] == ["3", "(0..20)", "2x5x12x12", "float32"]
    loss = next(line for line in table if line.startswith("m:f:loss@0")).split()
    assert loss[-3:] == ["0.3333", "0.6111", "1"]

    plots = out / "plots"
    pngs = sorted(p.name for p in plots.glob("*.png"))
    assert {
        "m_f_maps@0.maps.png",
        "m_f_chw@0.maps.png",
        "m_f_matrix@0.heatmap.png",
        "m_f_vector@0.hist.png",
        "m_f_loss@0.steps.png",
        "m_f_maps@0.steps.png",
    } <= set(pngs)
    assert not any(name.startswith("m_f_name") for name in pngs)  # text: no picture
    for name in pngs:
        assert _png_std(plots / name) > 0.02, name  # not blank
    page = _Images()
    page.feed((plots / "index.html").read_text())
    assert sorted(page.sources) == pngs
    assert "m:f:name@0" in (plots / "index.html").read_text()

    # Viewing again replaces the pictures it drew (not the user's own); --key filters.
    (plots / "mine.png").write_bytes(b"a picture of the user's")
    again = cli("view", out, "--key", "m:f:loss*")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in plots.glob("*.png")) == [
        "m_f_loss@0.hist.png",
        "m_f_loss@0.steps.png",
        "mine.png",
    ]


def test_view_where_pictures_cannot_be_written_prints_the_table_first(tmp_path):
    # A records directory others may not write to (a colleague's, a read-only mount) showed
    # nothing but the error: the table needs no pictures.
    pytest.importorskip("matplotlib")
    records = tmp_path / "records"
    bcrecord.save({"m:f:x@0": [torch.ones(2, 2)]}, records)
    (records / "plots").write_text("a file where the plots folder goes")
    result = cli("view", records)
    assert one_clear_line(result) == (
        f"bcrecord: cannot write pictures to {records / 'plots'}: a file is there, not a folder "
        "(move it away) (or use --no-plots)"
    )
    assert result.stdout.splitlines()[1].split() == ["m:f:x@0", "1", "2x2", "float32", "1", "1", "1"]


def test_view_cut_short_while_printing_its_table_leaves_the_pictures_with_their_index(tmp_path):
    # `bcrecord view DIR | head`: the table's write failed before index.html was written, and the
    # next view, which removes the pictures index.html names, left them there for good.
    pytest.importorskip("matplotlib")
    from bcrecord.viz import view

    records = tmp_path / "records"
    bcrecord.save({"m:f:x@0": [torch.ones(2, 2)], "m:f:y@0": [1.0]}, records)

    class ClosedPipe(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

    with pytest.raises(BrokenPipeError):
        view(records, out=ClosedPipe(), err=io.StringIO())
    plots = records / "plots"
    assert "m_f_x@0.heatmap.png" in (plots / "index.html").read_text()
    view(records, keys="m:f:y@0", out=io.StringIO(), err=io.StringIO())
    assert sorted(path.name for path in plots.iterdir()) == ["index.html"]  # (x's pictures removed)
    # Where index.html cannot be written, the table is shown first, as where a picture cannot.
    (plots / "index.html").unlink()
    (plots / "index.html").mkdir()
    out = io.StringIO()
    with pytest.raises(bcrecord.BcrecordError, match=r"cannot write .*index.html"):
        view(records, out=out, err=io.StringIO())
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["key", "m:f:x@0", "m:f:y@0"]


def test_view_bad_input(tmp_path):
    pytest.importorskip("matplotlib")
    assert "no such directory" in one_clear_line(cli("view", tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert "has no index.json" in one_clear_line(cli("view", tmp_path / "empty"))
    records = tmp_path / "records"
    bcrecord.save({"m:f:x@0": [torch.ones(2, 2)]}, records)
    (records / "plots").write_text("a file where the plots folder goes")
    assert "cannot write pictures to" in one_clear_line(cli("view", records))
    assert "no saved key matches" in one_clear_line(cli("view", records, "--no-plots", "--key", "zzz*"))
    for bad, why in (
        ("0", "must be at least 1, got 0"),
        ("-1", "must be at least 1, got -1"),
        ("x", "expected a whole number"),
    ):
        refused = cli("view", records, "--max-maps", bad)
        assert refused.returncode == 2 and f"argument --max-maps: {why}" in refused.stderr.splitlines()[-1]
    assert not (records / "plots").is_dir()


def test_view_draws_values_with_infinities_and_keys_too_long_for_a_file_name(tmp_path):
    pytest.importorskip("matplotlib")
    records = tmp_path / "records"
    overflowed = torch.tensor([[1.0, float("inf")], [float("-inf"), float("nan")]])
    long_key = "m:f:" + "x" * 300
    for step in range(2):
        bcrecord.save(
            {"m:f:half@0": [overflowed + step], long_key: [torch.randn(8) + step]}, records, step=step
        )
    result = cli("view", records)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("m:f:half@0")).split()
    assert row[-3:] == ["-inf", "nan", "inf"]  # min, mean (inf - inf), max
    pngs = sorted(p.name for p in (records / "plots").glob("*.png"))
    assert {"m_f_half@0.heatmap.png", "m_f_half@0.hist.png", "m_f_half@0.steps.png"} <= set(pngs)
    long_pngs = [name for name in pngs if name.startswith("m_f_xxx")]
    assert len(long_pngs) == 2 and all(len(name) < 140 for name in long_pngs)


def test_view_draws_keys_that_are_no_valid_text_or_differ_in_case_only(tmp_path):
    pytest.importorskip("matplotlib")
    import io

    from bcrecord.viz import view

    records = tmp_path / "records"
    keys = ["m:f:\udcff@0", "m:f:a\nb@0", "m:C:x@0", "m:c:x@0"]
    for step in range(2):
        bcrecord.save({key: [torch.full((4,), float(k + step))] for k, key in enumerate(keys)}, records, step)
    assert view(records, progress=False, out=io.StringIO(), err=io.StringIO()) == 0
    plots = records / "plots"
    pngs = sorted(p.name for p in plots.glob("*.png"))
    assert len(pngs) == 2 * len(keys)  # a histogram and the value over steps each
    assert len({name.casefold() for name in pngs}) == len(pngs)  # one file each on macOS, Windows too
    page = (plots / "index.html").read_text(encoding="utf-8")
    assert "<h2>m:f:\\udcff@0</h2>" in page and "<h2>m:f:a\\nb@0</h2>" in page


def test_view_of_a_dtype_torch_cannot_convert_shows_it_without_numbers(tmp_path):
    pytest.importorskip("matplotlib")
    import io

    from bcrecord.viz import view

    packed = getattr(torch, "float4_e2m1fn_x2", None)
    if packed is None:
        pytest.skip("no packed float4 dtype in this torch")
    records = tmp_path / "records"
    values = {
        "m:f:packed@0": [torch.ones(2, 3, dtype=torch.uint8).view(packed)],
        "m:f:ok@0": [torch.ones(2, 3)],
    }
    bcrecord.save(values, records)
    out = io.StringIO()
    assert view(records, progress=False, out=out, err=io.StringIO()) == 0  # a NotImplementedError before
    rows = {line.split()[0]: line.split()[1:] for line in out.getvalue().splitlines()[1:3]}
    assert rows == {
        "m:f:packed@0": ["1", "2x3", "float4_e2m1fn_x2", "-", "-", "-"],
        "m:f:ok@0": ["1", "2x3", "float32", "1", "1", "1"],
    }
    assert (records / "plots" / "m_f_ok@0.heatmap.png").is_file()


def test_view_says_why_it_cannot_draw_a_tensor_subclass_rather_than_one_number(tmp_path):
    # index.html said "nothing to draw (one number, or no elements)" of a 2x3 TwoTensor saved twice:
    # numpy cannot read a wrapper subclass's values, and only its being unreadable was left.
    pytest.importorskip("matplotlib")
    import io

    from torch.testing._internal.two_tensor import TwoTensor

    from bcrecord.viz import view

    a = torch.arange(6.0).reshape(2, 3)
    records = bcrecord.save({"m:f:tt@0": [TwoTensor(a, a * 2)]}, tmp_path / "records")
    bcrecord.save({"m:f:tt@0": [TwoTensor(a, a * 2)]}, records, step=1)
    err = io.StringIO()
    assert view(records, progress=False, out=io.StringIO(), err=err) == 0
    said = "a TwoTensor (2x3 float32): its values cannot be read to draw"
    assert err.getvalue() == f"bcrecord view: could not draw m:f:tt@0: {said}\n"
    page = (records / "plots" / "index.html").read_text()
    assert f"could not draw it: {said}" in page and "one number" not in page


def test_view_counts_a_sparse_tensor_from_its_stored_values_and_draws_only_a_small_one(tmp_path, monkeypatch):
    # A 10000x10000 COO tensor of 3 values cost 1.2 GB and 1.2 s to view (densified twice, for
    # the numbers and the pictures); a 50000x50000 one ran out of memory.
    pytest.importorskip("matplotlib")
    import io

    from bcrecord.viz import view

    n = 50_000
    coo = torch.sparse_coo_tensor([[0, 5, 5, n - 1], [1, 7, 7, n - 1]], [1.5, 1.0, 1.0, 4.0], (n, n))
    small = torch.sparse_coo_tensor([[0, 1], [1, 0]], [-1.0, 3.0], (4, 4))
    values = {"m:f:coo@0": [coo], "m:f:csr@0": [coo.to_sparse_csr()], "m:f:small@0": [small.to_sparse_csc()]}
    records = bcrecord.save(values, tmp_path / "records")

    to_dense = torch.Tensor.to_dense

    def small_only(self, *args, **kwargs):
        assert self.numel() <= 16, f"densified a {tuple(self.shape)} tensor"
        return to_dense(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to_dense", small_only)
    out, err = io.StringIO(), io.StringIO()
    assert view(records, progress=False, out=out, err=err) == 0
    rows = {line.split()[0]: line.split()[1:] for line in out.getvalue().splitlines()[1:4]}
    mean = f"{7.5 / n**2:.3e}"  # the duplicate (5, 7) summed, as the dense form sums it; zeros counted
    assert rows == {
        "m:f:coo@0": ["1", "50000x50000", "float32", "0", mean, "4"],
        "m:f:csr@0": ["1", "50000x50000", "float32", "0", mean, "4"],
        "m:f:small@0": ["1", "4x4", "float32", "-1", "0.125", "3"],
    }
    said = "a sparse 50000x50000 tensor with 3 stored values: too large to draw dense"
    assert err.getvalue().splitlines() == [
        f"bcrecord view: could not draw m:f:coo@0: {said}",
        f"bcrecord view: could not draw m:f:csr@0: {said}",
    ]
    assert (records / "plots" / "m_f_small@0.heatmap.png").is_file()


Pair = collections.namedtuple("Pair", "low high")  # (saved: a class pickle finds by name)


def test_view_counts_a_named_tuple_s_first_field_and_names_it(tmp_path):
    # x.max(dim=1) showed min 0, mean 4, max 10: its values (5, 10) and indices (1, 0) counted together.
    # Its shape column then said '-' where the row shows that field's numbers: now its shape.
    import io

    from bcrecord.viz import view

    x = torch.tensor([[1.0, 5.0, 3.0], [10.0, 2.0, 0.5]])
    values = {
        "m:f:max@0": [x.max(dim=1)],
        "m:f:topk@0": [x.topk(2)],
        "m:f:pair@0": [Pair(-x, x)],
        "m:f:list@0": [[x, x + 1]],  # of one meaning: every element, as before
        "m:f:x@0": [x],
    }
    out = io.StringIO()
    assert view(bcrecord.save(values, tmp_path / "records"), plots=False, out=out) == 0
    rows = {line[:11].strip(): line[11:].split() for line in out.getvalue().splitlines()[1:]}
    assert rows == {
        "m:f:max@0": ["1", "2", "max", "(values:", "float32)", "5", "7.5", "10"],
        "m:f:topk@0": ["1", "2x2", "topk", "(values:", "float32)", "2", "5", "10"],
        "m:f:pair@0": ["1", "2x3", "Pair", "(low:", "float32)", "-10", "-3.583", "-0.5"],
        "m:f:list@0": ["1", "-", "list", "0.5", "4.083", "11"],
        "m:f:x@0": ["1", "2x3", "float32", "0.5", "3.583", "10"],
    }


def test_view_counts_a_tuple_or_list_whose_items_differ_in_shape(tmp_path):
    # torch.arange(5.0).chunk(2) (shapes 3 and 2) showed '-' and index.html "not a numeric value".
    pytest.importorskip("matplotlib")
    from bcrecord.viz import _pictures, summarize

    values = {
        "m:f:chunks@0": [torch.arange(5.0).chunk(2)],
        "m:f:list@0": [[torch.ones(2), torch.zeros(3, 1)]],
        "m:f:ragged@0": [[[1, 2], [6]]],
        # Ints beyond uint64 (numpy keeps them as objects) were shown as non-numeric.
        "m:f:ints@0": [[2**70, 2, -(2**65)]],
        "m:f:beyond@0": [[10**400, 1]],
    }
    by_key = {s.key: s for s in summarize(bcrecord.load(bcrecord.save(values, tmp_path / "records")))}
    assert {key: (s.min, s.mean, s.max) for key, s in by_key.items()} == {
        "m:f:chunks@0": (0.0, 2.0, 4.0),
        "m:f:list@0": (0.0, 0.4, 1.0),
        "m:f:ragged@0": (1.0, 3.0, 6.0),
        "m:f:ints@0": (-(2.0**65), (2.0**70 + 2 - 2.0**65) / 3, 2.0**70),
        "m:f:beyond@0": (1.0, float("inf"), float("inf")),  # as the one int 10**400 is counted
    }
    for key, elements in (("m:f:chunks@0", 5), ("m:f:ints@0", 3)):
        [(kind, histogram)] = _pictures(by_key[key], max_maps=32)
        assert kind == "hist" and histogram.axes[0].get_title().endswith(
            f"histogram of {elements} element(s)"
        )


def test_view_says_why_it_cannot_draw_a_named_tuple_s_first_field(tmp_path):
    # index.html said "nothing to draw (one number, or no elements)" of a named tuple whose first
    # field, the one drawn, is a sparse tensor too large to draw dense or a TwoTensor; stderr nothing.
    pytest.importorskip("matplotlib")
    import io

    from torch.testing._internal.two_tensor import TwoTensor

    from bcrecord.viz import view

    n = 50_000
    coo = torch.sparse_coo_tensor([[0, 5], [1, 7]], [1.5, 4.0], (n, n))
    a = torch.arange(6.0).reshape(2, 3)
    values = {"m:f:coo@0": [Pair(coo, 1)], "m:f:tt@0": [Pair(Pair(TwoTensor(a, a * 2), 0), 1)]}
    records = bcrecord.save(values, tmp_path / "records")
    err = io.StringIO()
    assert view(records, progress=False, out=io.StringIO(), err=err) == 0
    large = "a sparse 50000x50000 tensor with 2 stored values: too large to draw dense"
    unread = "a TwoTensor (2x3 float32): its values cannot be read to draw"
    assert err.getvalue().splitlines() == [
        f"bcrecord view: could not draw m:f:coo@0: {large}",
        f"bcrecord view: could not draw m:f:tt@0: {unread}",
    ]
    page = (records / "plots" / "index.html").read_text()
    assert f"could not draw it: {large}" in page and f"could not draw it: {unread}" in page
    assert "one number" not in page


def test_every_picture_of_complex_values_says_it_draws_their_magnitudes(tmp_path):
    pytest.importorskip("matplotlib")
    from bcrecord.viz import _pictures, summarize

    z = torch.tensor([[[3 + 4j, -1j], [0j, 1 + 0j]]] * 2, dtype=torch.complex64)  # C x H x W: maps
    values = {"m:f:z@0": [z, z * 0.5], "m:f:r@0": [torch.ones(2, 2, 2)] * 2}
    summaries = {s.key: s for s in summarize(bcrecord.load(bcrecord.save(values, tmp_path / "run")))}

    def titles(key):
        pictures = dict(_pictures(summaries[key], max_maps=32))
        # A grid of maps has its title above the figure; the other pictures, above their axes.
        titled = {kind: figure._suptitle or figure.axes[0].title for kind, figure in pictures.items()}
        return {kind: text.get_text() for kind, text in titled.items()}

    complex_titles = titles("m:f:z@0")
    assert set(complex_titles) == {"maps", "hist", "steps"} and summaries["m:f:z@0"].dtype == "complex64"
    assert all(title.endswith("(complex: magnitudes)") for title in complex_titles.values()), complex_titles
    assert summaries["m:f:z@0"].max == 5.0  # |3+4j|: what the pictures draw too
    assert not any("complex" in title for title in titles("m:f:r@0").values())


def test_pictures_of_complex_values_say_so_whatever_the_dtype_column_names(tmp_path):
    # The note came from the dtype column only: 'mixed' (complex64 and complex128), a tuple of
    # complex tensors and a list of Python complex numbers were drawn as magnitudes unsaid.
    pytest.importorskip("matplotlib")
    from bcrecord.viz import _pictures, summarize

    z = torch.tensor([3 + 4j, 1j])
    values = {
        "m:f:mixed@0": [z, z.to(torch.complex128)],
        "m:f:chunks@0": [z.chunk(2)],
        "m:f:pylist@0": [[3 + 4j, 2j]],
        "m:f:real@0": [torch.ones(2).chunk(2), [1.0, 2.0]],
    }
    summaries = summarize(bcrecord.load(bcrecord.save(values, tmp_path / "run")))
    titles = {
        (summary.key, kind): figure.axes[0].get_title()
        for summary in summaries
        for kind, figure in _pictures(summary, max_maps=32)
    }
    assert [summary.dtype for summary in summaries] == ["mixed", "tuple", "list", "mixed"]
    assert sorted(key for key, title in titles.items() if title.endswith("(complex: magnitudes)")) == [
        ("m:f:chunks@0", "heatmap"),
        ("m:f:chunks@0", "hist"),
        ("m:f:mixed@0", "hist"),
        ("m:f:mixed@0", "steps"),
        ("m:f:pylist@0", "hist"),
    ]
    assert ("m:f:real@0", "hist") in titles


def test_a_histogram_s_title_counts_the_infinities_and_nans_it_leaves_out(tmp_path):
    pytest.importorskip("matplotlib")
    from bcrecord.viz import _pictures, summarize

    def titles(values):
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        [summary] = summarize(bcrecord.load(bcrecord.save(values, folder)))
        return {kind: figure.axes[0].get_title() for kind, figure in _pictures(summary, max_maps=32)}

    # Once "histogram of 1 element(s)" and "of 0 element(s)": the infinities were not there.
    overflowed = torch.tensor([2.0, float("inf"), float("-inf")])
    assert titles({"m:f:x@0": [overflowed]})["hist"].endswith(
        "histogram of 3 element(s) (2 NaN or ±inf left out)"
    )
    assert titles({"m:f:x@0": [torch.full((2,), float("inf"))]})["hist"].endswith(
        "histogram of 2 element(s) (2 NaN or ±inf left out)"
    )
    assert titles({"m:f:x@0": [torch.ones(2)]})["hist"].endswith("histogram of 2 element(s)")
    # The first step's overlay names what it leaves out in its legend label (the title is the last step's).
    two = bcrecord.save(
        {"m:f:x@0": [torch.tensor([1.0, float("nan"), float("inf")])]}, tmp_path / "two", step=0
    )
    [summary] = summarize(bcrecord.load(bcrecord.save({"m:f:x@0": [torch.ones(3)]}, two, step=1)))
    [histogram] = [figure for kind, figure in _pictures(summary, max_maps=32) if kind == "hist"]
    labels = [text.get_text() for text in histogram.axes[0].get_legend().get_texts()]
    assert labels == ["step 0 (first) (2 NaN or ±inf left out)", "step 1"]
    assert histogram.axes[0].get_title().endswith("histogram of 3 element(s)")
    # A large value is drawn from a sample: the title says which part.
    assert titles({"m:f:x@0": [torch.ones(2_500_000)]})["hist"].endswith(
        "histogram of 2500000 element(s) (1 in 3 drawn)"
    )
    # Its bins span every element, not the sample's: once 0..1 here, the 100 left off the axis.
    large = torch.zeros(2_500_000, dtype=torch.float64)
    large[1] = 100.0
    [summary] = summarize(bcrecord.load(bcrecord.save({"m:f:x@0": [large]}, tmp_path / "large")))
    [histogram] = [figure for kind, figure in _pictures(summary, max_maps=32) if kind == "hist"]
    edges = histogram.axes[0].patches[0].get_data().edges
    assert (edges[0], edges[-1]) == (0.0, 100.0)


def test_a_histogram_of_one_large_number_has_its_bar(tmp_path):
    # From 2**53, low + 1.0 == low: every bin edge was that number, and the picture empty
    # (an attention mask filled with torch.finfo(torch.float32).min).
    pytest.importorskip("matplotlib")
    from bcrecord.viz import _pictures, summarize

    near = [2.0**60] * 8 + [2.0**60 + 256] * 8  # (two numbers too close for bins between them)
    for fill in (torch.finfo(torch.float32).min, 1e20, 3.0, torch.finfo(torch.float64).max, near):
        made = torch.tensor(near, dtype=torch.float64).reshape(4, 4) if fill is near else None
        values = {"m:f:mask@0": [made if made is not None else torch.full((4, 4), fill, dtype=torch.float64)]}
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        [summary] = summarize(bcrecord.load(bcrecord.save(values, folder)))
        [histogram] = [figure for kind, figure in _pictures(summary, max_maps=32) if kind == "hist"]
        bars = histogram.axes[0].patches[0].get_data()
        assert (bars.edges[1:] > bars.edges[:-1]).all() and sum(bars.values) == 16, fill


def test_the_table_and_the_steps_picture_give_numbers_near_float64_s_largest_their_mean_and_std(tmp_path):
    pytest.importorskip("matplotlib")
    import warnings

    from bcrecord.viz import _pictures, _step_stats, summarize

    huge = torch.tensor([1e308, 1.5e308], dtype=torch.float64)  # a sum of them overflows
    saved = bcrecord.save({"m:f:x@0": [huge]}, tmp_path / "r", step=0)
    [summary] = summarize(bcrecord.load(bcrecord.save({"m:f:x@0": [huge / 2]}, saved, step=1)))
    assert summary.mean == pytest.approx(0.9375e308)  # once inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow on the way (numpy warns of one)
        assert _step_stats(huge.numpy()) == pytest.approx((1.25e308, 1e308, 1.5e308, 0.25e308, 2))
    [steps] = [figure for kind, figure in _pictures(summary, max_maps=32) if kind == "steps"]
    [mean] = steps.axes[0].lines
    assert list(mean.get_ydata()) == pytest.approx([1.25e308, 0.625e308])
    band = steps.axes[0].collections[1].get_paths()[0].vertices[:, 1]  # mean +/- std, once inf
    assert band.max() == pytest.approx(1.5e308)


def test_the_steps_picture_shows_each_step_s_min_max_and_mean_over_all_its_elements(tmp_path):
    pytest.importorskip("matplotlib")
    from bcrecord.viz import _pictures, summarize

    # Once taken from every 3rd element of a step over 200000: the band was 0..0, mean 0.
    large = torch.zeros(500_000, dtype=torch.float64)
    large[1], large[2] = 1e6, -5.0
    folder = bcrecord.save({"m:f:x@0": [torch.ones(3, dtype=torch.float64)]}, tmp_path / "r", step=0)
    [summary] = summarize(bcrecord.load(bcrecord.save({"m:f:x@0": [large]}, folder, step=1)))
    [steps] = [figure for kind, figure in _pictures(summary, max_maps=32) if kind == "steps"]
    [mean] = steps.axes[0].lines
    assert mean.get_ydata()[1] == pytest.approx(float(large.mean()))
    band = steps.axes[0].collections[0].get_paths()[0].vertices[:, 1]  # the min..max band
    assert (band.min(), band.max()) == (-5.0, 1e6)


def test_view_draws_the_other_keys_when_one_cannot_be_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    from torch.testing._internal.two_tensor import TwoTensor

    records = tmp_path / "records"
    biggest = torch.finfo(torch.float64).max  # an axis from -1.8e308 to 1.8e308 overflows: drawn scaled
    a = torch.arange(6.0).reshape(2, 3)
    bcrecord.save(
        {
            "m:f:huge@0": [torch.tensor([-biggest, 0.0, biggest], dtype=torch.float64)],
            "m:f:ok@0": [torch.randn(8)],
            "m:f:tt@0": [TwoTensor(a, a * 2)],  # numpy cannot read its values
        },
        records,
    )
    result = cli("view", records)
    assert result.returncode == 0, result.stderr
    assert "bcrecord view: could not draw m:f:tt@0: " in result.stderr
    assert "could not draw m:f:huge@0" not in result.stderr and "Traceback" not in result.stderr
    pngs = {p.name for p in (records / "plots").glob("*.png")}
    assert {"m_f_ok@0.hist.png", "m_f_huge@0.hist.png"} <= pngs
    assert "could not draw it: " in (records / "plots" / "index.html").read_text()


def test_feature_maps_of_large_maps_are_thinned_before_they_are_drawn():
    pytest.importorskip("matplotlib")
    import numpy as np

    from bcrecord.viz import KeySummary, _feature_maps

    maps = np.arange(3 * 1000 * 600, dtype=np.float64).reshape(3, 1000, 600)
    summary = KeySummary("m:f:x@0", [0], [maps], maps.shape, False, "float64", 0.0, 1.0, 2.0)
    figure = _feature_maps(summary, maps, "4-D", max_maps=32)
    # Every 4th pixel: a map of 250x150 in the mosaic, not 1000x600 (gigabytes for big maps).
    image = figure.axes[0].images[0].get_array()
    assert max(image.shape) < 600 and "every 4th pixel" in figure._suptitle.get_text()
    figure = _feature_maps(summary, maps[:, :600, :300], "4-D", max_maps=32)
    assert "every 3rd pixel" in figure._suptitle.get_text()  # (it said 'every 3th')
    assert image[0, 1] == pytest.approx(4 / (996 * 600 + 596))  # (0, 4) of map 0 over its kept maximum


def test_tools_answer_help():
    tools = sorted((ROOT / "tools").glob("*.py"))
    for tool in tools:
        result = plain(tool, "--help", cwd=ROOT)
        assert result.returncode == 0 and "usage" in result.stdout.lower(), (tool.name, result.stderr[-500:])


def test_a_target_naming_a_model_object_is_told_its_forward_not_torch_s_call(tmp_path):
    # A model's __call__ is torch's Module._wrapped_call_impl: 'nets:Net.__call__:y' was
    # suggested, which is refused in turn (no local 'y' there).
    (tmp_path / "nets.py").write_text(
        "import torch\nclass Net(torch.nn.Module):\n    def forward(self, x):\n        y = x + 1\n"
        "        return y\nmodel = Net()\n"
    )
    (tmp_path / "usenets.py").write_text("import torch, nets\nprint(nets.model(torch.ones(1)).item())\n")
    result = cli("run", "-r", "nets:model:y", "usenets.py", cwd=tmp_path)
    assert result.returncode == 2 and "patch_method(Net, 'forward', specs)" in result.stderr
    assert result.stderr.rstrip().endswith("; as a target: 'nets:Net.forward:y'"), result.stderr
    assert cli("run", "-r", "nets:Net.forward:y", "usenets.py", cwd=tmp_path).stdout.startswith("2.0\n")
    result = cli("targets", "nets:model", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.rstrip().endswith("; as a path: 'nets:Net.forward'")


def test_a_target_naming_a_model_whose_class_defines_call_is_told_that_call(tmp_path):
    # A model class with its own Python __call__ (code around torch's): its local 'z' is there,
    # not in forward; 'nets:Own.forward:z' was suggested, which is refused in turn.
    (tmp_path / "nets.py").write_text(
        "import torch\nclass Own(torch.nn.Module):\n    def __call__(self, x):\n        z = x + 1\n"
        "        return super().__call__(z)\n    def forward(self, x):\n        return x\nmodel = Own()\n"
    )
    (tmp_path / "usenets.py").write_text("import torch, nets\nprint(nets.model(torch.ones(1)).item())\n")
    result = cli("run", "-r", "nets:model:z", "usenets.py", cwd=tmp_path)
    assert result.returncode == 2 and "patch_method(Own, '__call__', specs)" in result.stderr
    assert result.stderr.rstrip().endswith("; as a target: 'nets:Own.__call__:z'"), result.stderr
    assert cli("run", "-r", "nets:Own.__call__:z", "usenets.py", cwd=tmp_path).stdout.startswith("2.0\n")
    result = cli("targets", "nets:model", cwd=tmp_path)
    assert result.returncode == 2 and result.stderr.rstrip().endswith("; as a path: 'nets:Own.__call__'")


def test_run_torchvision_target_from_the_issue(tmp_path):
    """The issue's example target, in a module the program imports (no weights are downloaded)."""
    pytest.importorskip("torchvision")
    (tmp_path / "tv.py").write_text(
        textwrap.dedent(
            """
            import torch, torchvision
            torch.manual_seed(0)
            model = torchvision.models.resnet18(num_classes=10).eval()
            with torch.no_grad():
                out = model(torch.randn(1, 3, 64, 64))
            torch.save(out, "out.pt")
            """
        )
    )
    out = tmp_path / "records"
    result = cli(
        "run", "-r", "torchvision.models.resnet:ResNet._forward_impl:x", "-o", out, "tv.py", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    loaded = bcrecord.load(out)
    assert loaded["ResNet:_forward_impl:x@0"][0].shape == (1, 64, 32, 32)
    assert torch.equal(loaded["ResNet:_forward_impl:x@10"][0], torch.load(tmp_path / "out.pt"))


def test_the_value_over_steps_follows_the_steps_not_the_order_of_saving():
    import numpy as np

    from bcrecord.viz import KeySummary, _over_steps, _step_stats

    summary = KeySummary("m:f:x@0", [5, 9, 2], [1.0, 2.0, 3.0])  # a second run added step 2
    figure = _over_steps(summary, [_step_stats(np.array([x])) for x in (1.0, 2.0, 3.0)])
    line = figure.axes[0].lines[0]
    assert list(line.get_xdata()) == [2, 5, 9] and list(line.get_ydata()) == [3, 1, 2]


COMPILED = """
import sys
{first}
import torch
import torch._dynamo.utils

@torch.compile(backend="eager")
def f(x):
    y = torch.sin(x) * 2
    z = y + x
    return z

outputs = [f(torch.full((3, 4), float(i))) for i in range(3)]
torch.save(outputs, sys.argv[1])
print("graph breaks", sum(torch._dynamo.utils.counters["graph_break"].values()))
"""


def test_run_of_a_compiled_program_has_dynamo_skip_the_probes(tmp_path):
    # bcrecord.torch (which has Dynamo skip the probe and all it calls) was imported only at
    # the first tensor copy, inside the first compiled call: Dynamo traced into bcrecord's
    # code, with several times the graph breaks and "does not know how to trace" warnings.
    breaks = {}
    for first in ("", "import bcrecord.torch"):
        program = tmp_path / f"compiled{len(first)}.py"
        program.write_text(COMPILED.format(first=first))
        out, reference = tmp_path / f"records{len(first)}", tmp_path / f"outputs{len(first)}.pt"
        result = cli("run", "-r", "__main__:f:y", "-o", out, program, reference, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "does not know how to trace" not in result.stderr
        breaks[first] = result.stdout.split()[-1]
        expected = [torch.sin(torch.full((3, 4), float(i))) * 2 for i in range(3)]
        saved = bcrecord.load(out)["__main__:f:y@0"]
        assert len(saved) == 3 and all(torch.equal(a, b) for a, b in zip(saved, expected, strict=True))
    assert breaks[""] == breaks["import bcrecord.torch"]


def test_pictures_of_a_key_hold_one_step_at_a_time_not_a_float64_copy_of_every_step(monkeypatch):
    # _pictures turned every step into a float64 array at once (and the value-over-steps plot
    # kept a filtered copy of each): a key of 200 MB over 200 steps took 1 GB more to draw.
    import numpy as np

    from bcrecord import viz

    real, alive, most = viz._numpy_array, [], []

    def spy(value):
        gc.collect()
        most.append(sum(ref() is not None for ref in alive))  # earlier steps' copies still held
        array = real(value)
        alive.append(weakref.ref(array))
        return array

    monkeypatch.setattr(viz, "_numpy_array", spy)
    values = [torch.full((2, 3, 4), float(step)) for step in range(10)]
    summary = viz.KeySummary("m:f:x@0", list(range(10)), values, (2, 3, 4), False, "float32", 0.0, 4.5, 9.0)
    pictures = dict(viz._pictures(summary, max_maps=32))
    assert sorted(pictures) == ["hist", "maps", "steps"] and len(alive) == 10
    assert max(most) <= 2  # the first step's (the histogram overlays it) and the one before
    line = pictures["steps"].axes[0].lines[0]
    assert list(line.get_ydata()) == list(np.arange(10.0))
    hist = pictures["hist"].axes[0]
    assert hist.get_title().endswith("histogram of 24 element(s)")


def test_a_key_with_characters_the_font_lacks_draws_without_a_warning_per_character(tmp_path):
    # matplotlib warned twice (message and source line) per missing glyph per picture: a key
    # with CJK characters filled stderr with "Glyph ... missing from font(s)" lines.
    import warnings

    from bcrecord.viz import draw, summarize

    bcrecord.save({"m:f:日本@0": [torch.ones(3, 3)]}, tmp_path, step=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        drawn = draw(summarize(bcrecord.load(tmp_path)), tmp_path)
    assert drawn == {"m:f:日本@0": ["m_f_@0.heatmap.png", "m_f_@0.hist.png"]}
