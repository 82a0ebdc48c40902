"""``bcrecord view`` (:mod:`bcrecord.viz`): its summary without matplotlib, a few pictures with it.

Pictures of tensors are tested in ``tests/torch/test_cli_torch.py``.
"""

import gc
import importlib.util
import io
import sys
import types
import weakref

import pytest

import bcrecord
from bcrecord import viz
from bcrecord.errors import BcrecordError
from bcrecord.viz import KeySummary, draw, summarize, table, view, write_index


@pytest.fixture
def saved(tmp_path):
    folder = tmp_path / "records"
    bcrecord.save({"m:f:x@0": [1, 5], "m:f:name@0": ["a"], "m:g:v@0": [[1.0, 2.0]]}, folder, step=0)
    bcrecord.save({"m:f:x@0": [3]}, folder, step=4)
    return folder


def test_summarize_statistics_and_steps(saved):
    by_key = {s.key: s for s in summarize(bcrecord.load(saved))}
    x = by_key["m:f:x@0"]
    assert (x.steps, x.min, x.mean, x.max, x.dtype, x.numeric) == ([0, 0, 4], 1.0, 3.0, 5.0, "int", True)
    assert x.row()[1] == "3 (0..4, repeated)"  # steps that are not 0, 1, 2... show their range
    bcrecord.save({"m:f:x@0": [7]}, saved, step=2)  # saved again, out of order
    assert {s.key: s for s in summarize(bcrecord.load(saved))}["m:f:x@0"].row()[1] == "4 (0..4, repeated)"
    assert not by_key["m:f:name@0"].numeric and by_key["m:f:name@0"].row()[4:] == ("-", "-", "-")
    # Lists of numbers are summarized through numpy when it is installed.
    numpy = importlib.util.find_spec("numpy") is not None
    assert by_key["m:g:v@0"].dtype == "list" and by_key["m:g:v@0"].mean == (1.5 if numpy else None)
    assert [s.key for s in summarize(bcrecord.load(saved), keys=["m:f:*"])] == ["m:f:x@0", "m:f:name@0"]


def test_table_aligns_columns():
    rows = table(
        [
            KeySummary("a:f:x@0", [0], [1.0], (), False, "float", 1.0, 1.0, 1.0),
            KeySummary("a:f:longer@0", [0, 1], [[1, 2]], (2,), False, "int", 1.0, 1.5, 2.0),
        ]
    ).splitlines()
    assert rows[0].split() == ["key", "steps", "shape", "dtype", "min", "mean", "max"]
    assert rows[1].split() == ["a:f:x@0", "1", "scalar", "float", "1", "1", "1"]
    assert rows[2].split() == ["a:f:longer@0", "2", "2", "int", "1", "1.5", "2"]
    assert len({row.index("steps" if i == 0 else row.split()[1]) for i, row in enumerate(rows)}) == 1
    # a key that is no valid text (saved and loaded as it is) is shown escaped, not a crash
    odd = table([KeySummary("a:f:\ud800@0", [0], [1.0], (), False, "float", 1.0, 1.0, 1.0)])
    assert odd.splitlines()[1].split()[0] == "a:f:\\ud800@0" and odd.encode("utf-8")
    # control characters are escaped (a newline broke the row), an empty key is shown as ''
    lines = table([KeySummary(k, [0], [1.0], (), False, "float", 1.0, 1.0, 1.0) for k in ("a:\nb\t", "")])
    assert [line.split()[0] for line in lines.splitlines()[1:]] == ["a:\\nb\\t", "''"]


def test_view_prints_the_table_and_filters_keys(saved):
    out = io.StringIO()
    assert view(saved, plots=False, keys=["m:g:*"], out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[1].split()[0] == "m:g:v@0" and len(lines) == 2
    assert not (saved / "plots").exists()


def test_view_of_some_keys_reads_only_their_values(tmp_path):
    # Another key's damaged data file does not stop them (the whole view says it is damaged).
    folder = tmp_path / "records"
    bcrecord.save({"m:f:x@0": [1, 2]}, folder, step=0)
    bcrecord.save({"m:g:y@0": [3]}, folder, step=1)
    damaged = sorted((folder / "records").glob("*.pkl"))[-1]
    damaged.write_bytes(damaged.read_bytes()[:5])
    out, err = io.StringIO(), io.StringIO()
    assert view(folder, plots=False, keys=["m:f:*"], out=out, err=err) == 0
    assert out.getvalue().splitlines()[1].split()[0] == "m:f:x@0" and err.getvalue() == ""
    assert bcrecord.storage.saved_keys(folder) == ["m:f:x@0", "m:g:y@0"]


def test_view_of_a_run_with_a_damaged_data_file_shows_the_rest_and_says_what_was_lost(tmp_path):
    # It stopped with 'cannot read ...000002.pkl: pickle data was truncated', showing nothing.
    folder = tmp_path / "records"
    bcrecord.save({"m:f:x@0": [1, 2]}, folder, step=0)
    bcrecord.save({"m:g:y@0": [3], "m:f:x@0": [4]}, folder, step=1)
    damaged = folder / "records" / "000002.pkl"
    damaged.write_bytes(damaged.read_bytes()[:5])
    out, err = io.StringIO(), io.StringIO()
    assert view(folder, plots=False, out=out, err=err) == 0
    assert [line.split()[:2] for line in out.getvalue().splitlines()] == [["key", "steps"], ["m:f:x@0", "2"]]
    assert err.getvalue().startswith(f"bcrecord view: {damaged} is damaged (")
    assert "2 of its 2 values could not be read; left out: 'm:g:y@0' (step 1), 'm:f:x@0' (step 1);" in (
        err.getvalue()
    )


class Block:
    """A value the index counts as 1 MB (its ``nbytes``), which a weakref can follow."""

    nbytes = 1_000_000

    def __init__(self, number):
        self.number = number


def test_view_reads_a_group_of_keys_at_a_time_and_lets_each_go_before_the_next(tmp_path, monkeypatch):
    # view loaded every saved value at once: a long run of large tensors could exhaust memory.
    folder = tmp_path / "records"
    for step in range(3):
        bcrecord.save({f"m:f:k{k}@0": [Block(k)] for k in range(5)}, folder, step=step)
    real_load, asked, alive, held = viz.load, [], [], []

    def spy(directory, keys=None):
        gc.collect()
        held.append(sum(ref() is not None for ref in alive))  # values of earlier reads still held
        loaded = real_load(directory, keys=keys)
        asked.append(list(loaded))
        alive.extend(weakref.ref(entry.value) for entry in loaded.entries)
        return loaded

    monkeypatch.setattr(viz, "load", spy)
    monkeypatch.setattr(viz, "_READ_AT_ONCE", 6_000_000)  # two keys of 3 values each
    out = io.StringIO()
    assert view(folder, plots=False, out=out) == 0
    assert asked == [["m:f:k0@0", "m:f:k1@0"], ["m:f:k2@0", "m:f:k3@0"], ["m:f:k4@0"]]
    assert held == [0, 0, 0] and len(alive) == 15
    rows = [line.split() for line in out.getvalue().splitlines()[1:]]
    assert [row[:2] for row in rows] == [[f"m:f:k{k}@0", "3"] for k in range(5)]


def test_view_never_holds_the_whole_index(saved, monkeypatch):
    # A long run's index is some 700 bytes a value as dicts: view reads it a save at a time
    # (the sizes of its keys, then each group's rows in load), never as one list.
    def whole_index(directory):
        raise AssertionError(f"the whole index of {directory} was read at once")

    monkeypatch.setattr(bcrecord.storage, "_read_index", whole_index)
    out = io.StringIO()
    assert view(saved, plots=False, out=out) == 0
    rows = [line.split()[0] for line in out.getvalue().splitlines()[1:]]
    assert rows == ["m:f:x@0", "m:f:name@0", "m:g:v@0"]


def test_view_bad_input_changes_nothing(saved, tmp_path, monkeypatch):
    with pytest.raises(BcrecordError, match="no such directory"):
        view(tmp_path / "missing", plots=False, out=io.StringIO())
    # '' (an unset "$OUT") read the working directory's records, which saving to '' refuses.
    monkeypatch.chdir(saved)
    with pytest.raises(BcrecordError, match="the records directory is an empty string"):
        view("", plots=False, out=io.StringIO())
    with pytest.raises(BcrecordError, match="no saved key matches zz\\*; saved keys: m:f:x@0"):
        view(saved, plots=False, keys=["zz*"], out=io.StringIO())
    assert sorted(p.name for p in saved.iterdir()) == ["index.json", "index.jsonl", "records"]


def test_a_key_that_matches_nothing_gets_the_key_or_glob_to_give(tmp_path):
    # '--key forward:x@1' (the leading ':' left out) and '--key layer1' (a part of keys) said only
    # "no saved key matches" with every saved key, however many: a run of 300 keys, 300 names.
    folder = tmp_path / "rec"
    bcrecord.save({f"layer{i}:forward:x@0": [float(i)] for i in range(30)} | {":forward:x@1": [1.0]}, folder)
    with pytest.raises(BcrecordError) as missing:
        view(folder, plots=False, keys="forward:x@1", out=io.StringIO())
    assert "no saved key matches forward:x@1; did you mean ':forward:x@1', " in str(missing.value)
    assert str(missing.value).endswith("layer19:forward:x@0 and 11 more")
    with pytest.raises(
        BcrecordError, match=r"no saved key matches layer2 \(a glob matches whole keys: '\*layer2\*'\)"
    ):
        view(folder, plots=False, keys="layer2", out=io.StringIO())
    assert sorted(p.name for p in folder.iterdir()) == ["index.json", "index.jsonl", "records"]


def test_an_operator_key_given_as_listed_selects_by_glob_and_a_note_says_how_to_select_it_alone(tmp_path):
    # Operator keys hold '*': '--key Net:forward:*@0' copied from the listing showed every @0 key
    # without a word; the note gives the escaped key, which selects that key alone.
    folder = tmp_path / "rec"
    bcrecord.save({"Net:forward:*@0": [2.0], "Net:forward:x@0": [1.0], "Net:forward:x@1": [3.0]}, folder)
    out, err = io.StringIO(), io.StringIO()
    view(folder, plots=False, keys="Net:forward:*@0", out=out, err=err)
    shown = [line.split()[0] for line in out.getvalue().splitlines()[1:]]
    assert shown == ["Net:forward:*@0", "Net:forward:x@0"]
    assert err.getvalue() == (
        "bcrecord view: --key 'Net:forward:*@0' is a glob and matched 2 keys; "
        "for the key 'Net:forward:*@0' alone give 'Net:forward:[*]@0'\n"
    )
    out, err = io.StringIO(), io.StringIO()
    view(folder, plots=False, keys="Net:forward:[*]@0", out=out, err=err)
    assert [line.split()[0] for line in out.getvalue().splitlines()[1:]] == ["Net:forward:*@0"]
    assert err.getvalue() == ""


def test_a_max_maps_that_draws_no_map_is_refused_before_the_plots_folder_is_touched(saved):
    # It drew nothing of such a key: ZeroDivisionError for its grid, its other pictures lost with it,
    # after the earlier view's pictures had been removed.
    plots = saved / "plots"
    plots.mkdir()
    (plots / "index.html").write_text('<img src="m_f_x@0.hist.png">')
    (plots / "m_f_x@0.hist.png").write_bytes(b"an earlier view's picture")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(BcrecordError, match=f"^max_maps must be a positive int .*, got {bad!r}$"):
            view(saved, max_maps=bad, out=io.StringIO())
        with pytest.raises(BcrecordError, match="^max_maps must be a positive int"):
            draw(summarize(bcrecord.load(saved)), plots, max_maps=bad)
    assert sorted(p.name for p in plots.iterdir()) == ["index.html", "m_f_x@0.hist.png"]


def test_view_s_flags_that_are_no_bools_are_refused_before_the_plots_folder_is_touched(saved):
    # plots='no' drew every picture (a non-empty string is true), after removing the earlier ones.
    plots = saved / "plots"
    plots.mkdir()
    (plots / "m_f_x@0.hist.png").write_bytes(b"an earlier view's picture")
    for flags, said in (
        ({"plots": "no"}, "plots is True or False, got 'no'"),
        ({"plots": False, "progress": "on"}, "progress is True or False, got 'on'"),
    ):
        with pytest.raises(BcrecordError, match=f"^{said}$"):
            view(saved, out=io.StringIO(), **flags)
    assert [p.name for p in plots.iterdir()] == ["m_f_x@0.hist.png"]


class TwoArgumentError(Exception):
    """An exception whose pickle (its message only) does not make it again: it loads as Unloadable."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def test_the_table_names_the_class_of_a_value_that_loaded_as_a_stand_in(tmp_path, monkeypatch):
    # The dtype column said 'Unloadable' (not which class), and a bare 'Point' for a class not
    # importable here, as if the value had loaded.
    gone = types.ModuleType("bcrecord_test_gone_module")
    exec("class Point:\n    def __init__(self):\n        self.x = 1.0\n", gone.__dict__)
    monkeypatch.setitem(sys.modules, gone.__name__, gone)
    folder = bcrecord.save({"m:f:p@0": [gone.Point()], "m:f:e@0": [TwoArgumentError("x", 2)]}, tmp_path / "r")
    monkeypatch.delitem(sys.modules, gone.__name__)
    loaded = bcrecord.load(folder)
    assert isinstance(loaded["m:f:e@0"][0], bcrecord.storage.Unloadable)
    assert isinstance(loaded["m:f:p@0"][0], bcrecord.storage.Unimportable)
    rows = {s.key: s.row() for s in summarize(loaded)}
    assert rows["m:f:p@0"][3] == "Point (not importable)"
    assert rows["m:f:e@0"][3] == "TwoArgumentError (unloadable)"


def test_view_of_a_file_says_it_is_not_a_directory(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(BcrecordError, match="^'.*afile' is not a directory$"):
        view(tmp_path / "afile", plots=False, out=io.StringIO())


def test_a_file_where_the_plots_folder_goes_is_said_to_be_a_file(tmp_path):
    # It said "cannot write pictures to DIR/plots: File exists", of a folder that is not there.
    from bcrecord.viz import _prepare

    (tmp_path / "plots").write_text("notes")
    with pytest.raises(BcrecordError) as caught:
        _prepare(tmp_path / "plots")
    assert (
        str(caught.value)
        == f"cannot write pictures to {tmp_path / 'plots'}: a file is there, not a folder (move it away) "
        "(or use --no-plots)"
    )
    assert (tmp_path / "plots").read_text() == "notes"


def test_write_index_links_every_key_and_escapes(tmp_path):
    summaries = [
        KeySummary("m:f:<x>@0", [0], [1.0], (), False, "float", 1.0, 1.0, 1.0),
        KeySummary("m:f:s@0", [0], ["text"]),
    ]
    page = write_index(summaries, {"m:f:<x>@0": ["x 1.png"]}, tmp_path, "run <1>").read_text()
    assert "<title>run &lt;1&gt;</title>" in page
    assert 'href="#k0">m:f:&lt;x&gt;@0</a>' in page and 'src="x%201.png"' in page
    assert "no picture: not a numeric value" in page  # the string key has none


def test_index_says_a_single_number_has_no_picture_without_calling_it_non_numeric(tmp_path):
    summaries = [KeySummary("m:f:loss@0", [0], [0.25], (), False, "float", 0.25, 0.25, 0.25)]
    page = write_index(summaries, {}, tmp_path, "run").read_text()
    assert "no picture: nothing to draw (one number, or no elements): see the table" in page
    assert "not a numeric value" not in page


def test_a_nan_step_or_an_empty_value_leaves_the_other_steps_counted(tmp_path):
    bcrecord.save({"m:f:loss@0": [1.0, float("nan"), 3.0], "m:f:big@0": [10**400, 1]}, tmp_path, step=0)
    by_key = {s.key: s for s in summarize(bcrecord.load(tmp_path))}
    loss = by_key["m:f:loss@0"]
    assert (loss.min, loss.mean, loss.max, loss.numeric) == (1.0, 2.0, 3.0, True)
    big = by_key["m:f:big@0"]
    assert (big.min, big.max) == (1.0, float("inf"))
    bcrecord.save({"m:f:gone@0": [float("nan")]}, tmp_path / "nan", step=0)
    (gone,) = summarize(bcrecord.load(tmp_path / "nan"))
    assert gone.row()[4:] == ("-", "-", "-")


def test_the_mean_of_numbers_near_float64_s_largest_is_their_mean_not_an_overflowed_sum(tmp_path):
    largest = sys.float_info.max
    values = {"m:f:huge@0": [0.9 * largest, 0.8 * largest], "m:f:both@0": [largest, -largest, largest]}
    by_key = {s.key: s for s in summarize(bcrecord.load(bcrecord.save(values, tmp_path, step=0)))}
    assert by_key["m:f:huge@0"].mean == pytest.approx(0.85 * largest)  # once inf: the sum overflowed
    assert by_key["m:f:both@0"].mean == pytest.approx(largest / 3)
    # A real infinity still makes the mean infinite.
    bcrecord.save({"m:f:inf@0": [largest, float("inf")]}, tmp_path / "inf", step=0)
    assert [s.mean for s in summarize(bcrecord.load(tmp_path / "inf"))] == [float("inf")]


def test_index_says_a_key_whose_every_element_is_nan_has_no_number_not_that_it_is_no_number(tmp_path):
    bcrecord.save({"m:f:loss@0": [float("nan"), float("nan")], "m:f:s@0": ["text"]}, tmp_path, step=0)
    loss, text = summarize(bcrecord.load(tmp_path))
    assert (loss.numeric, loss.numbers, text.numbers) == (False, True, False)
    page = write_index([loss, text], {}, tmp_path, "run").read_text()
    assert page.count("no picture: no number to draw (every element is NaN, or there are none)") == 1
    assert page.count("no picture: not a numeric value") == 1  # the text's


def test_one_pattern_given_as_a_string_is_one_pattern_not_its_characters(saved):
    loaded = bcrecord.load(saved)
    assert [s.key for s in summarize(loaded, keys="m:g:*")] == ["m:g:v@0"]  # '*' alone kept them all
    out = io.StringIO()
    assert view(saved, plots=False, keys="m:f:x*", out=out) == 0
    assert [line.split()[0] for line in out.getvalue().splitlines()[1:]] == ["m:f:x@0"]


def test_a_key_named_as_a_windows_device_gets_a_picture_file_windows_can_write():
    # 'con' drew into 'con.hist.png', which Windows takes for the console, not a file.
    assert [viz._slug(key) for key in ("con", "Aux", "LPT1.x", "nul:f:x@0", "console")] == [
        "_con",
        "_Aux",
        "_LPT1.x",
        "nul_f_x@0",
        "console",
    ]


def test_the_table_stays_aligned_for_a_key_of_wide_characters():
    # Columns were padded by code points: '日本' takes four terminal columns, not two.
    rows = table([KeySummary("m:日本@0", [0], [1.0], (), False, "float", 1.0, 1.0, 1.0)]).splitlines()
    assert rows == [
        "key       steps  shape   dtype  min  mean  max",
        "m:日本@0  1      scalar  float  1    1     1",
    ]


def test_view_s_table_stays_aligned_on_a_terminal_that_writes_wide_keys_escaped(tmp_path):
    # PYTHONIOENCODING=ascii: '日本' is printed as '\u65e5\u672c' (12 columns), padded as 4.
    from .commands import cli

    bcrecord.save({"m:日本@0": [1.0], "m:x@0": [2.0]}, tmp_path / "run")
    result = cli("view", "--no-plots", tmp_path / "run", env={"PYTHONIOENCODING": "ascii"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "key               steps  shape  dtype  min  mean  max",
        "m:\\u65e5\\u672c@0  1      -      float  1    1     1",
        "m:x@0             1      -      float  2    2     2",
    ]


def test_a_numpy_masked_array_s_masked_out_elements_are_left_out_of_the_numbers(tmp_path):
    # np.asarray dropped the mask: the masked-out 1e9 made the mean 3.333e+08 and the max 1e9.
    np = pytest.importorskip("numpy")
    one = np.ma.masked_array([1.0, 1e9, 3.0], mask=[0, 1, 0])
    two = [np.ma.masked_array([5, -7], mask=[0, 1]), np.ma.masked_array([-9], mask=[1])]  # a list of them
    bcrecord.save({"m:f:one@0": [one], "m:f:two@0": [two]}, tmp_path, step=0)
    out = io.StringIO()
    assert view(tmp_path, plots=False, out=out) == 0
    rows = [line.split() for line in out.getvalue().splitlines()[1:]]
    assert [row[-3:] for row in rows] == [["1", "2", "3"], ["5", "5", "5"]]


def test_pictures_of_values_that_share_a_step_say_so_and_draw_them_in_saved_order(tmp_path):
    # A local recorded 5 times, saved at step 0: "over 5 saved steps" drew a vertical line at x=0,
    # "histogram of the values of 5 steps" had the legend "steps 0..0".
    pytest.importorskip("matplotlib")
    from bcrecord.viz import _pictures

    bcrecord.save({"m:f:x@1": [0, 1, 3, 6, 10], "m:f:v@0": [[1.0, 2.0], [3.0, 4.0]]}, tmp_path, step=0)
    x, v = summarize(bcrecord.load(tmp_path))
    assert x.row()[1] == "5 (all at 0)"
    pictures = dict(_pictures(x, max_maps=32))
    steps, hist = pictures["steps"].axes[0], pictures["hist"].axes[0]
    assert steps.get_title() == "m:f:x@1\nover 5 saved values (all at step 0)"
    assert steps.get_xlabel() == "value, in saved order (0: the first)"
    assert list(steps.lines[0].get_xdata()) == [0, 1, 2, 3, 4]
    assert list(steps.lines[0].get_ydata()) == [0, 1, 3, 6, 10]
    assert hist.get_title() == "m:f:x@1\nhistogram of 5 saved values (all at step 0)"
    assert [text.get_text() for text in hist.get_legend().get_texts()] == ["step 0"]
    # Values of several numbers: the histogram's first and last are named so, not "step 0" twice.
    hist = dict(_pictures(v, max_maps=32))["hist"].axes[0]
    labels = [text.get_text() for text in hist.get_legend().get_texts()]
    assert labels == ["first value (step 0)", "last value (step 0)"]
    # Steps of their own are drawn over the steps, as before.
    bcrecord.save({"m:f:y@0": [1.0]}, tmp_path / "own", step=3)
    [y] = summarize(bcrecord.load(bcrecord.save({"m:f:y@0": [2.0]}, tmp_path / "own", step=7)))
    steps = dict(_pictures(y, max_maps=32))["steps"].axes[0]
    assert steps.get_title() == "m:f:y@0\nover 2 saved steps" and list(steps.lines[0].get_xdata()) == [3, 7]


def test_a_picture_that_cannot_be_written_leaves_no_part_of_it_and_the_table_is_shown(tmp_path, monkeypatch):
    # A full disk ended view with no table, a cut-off k0.heatmap.png left in plots and no index.html.
    pytest.importorskip("matplotlib")
    import errno

    from matplotlib.figure import Figure

    def full_disk(figure, path, **options):
        with open(path, "wb") as file:
            file.write(b"\x89PNG\r\n\x1a\n")  # the start of a PNG, then the disk was full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full_disk)
    bcrecord.save({"k0": [[[1.0, 2.0], [3.0, 4.0]]], "k1": [5.0]}, tmp_path, step=0)
    out = io.StringIO()
    with pytest.raises(BcrecordError) as caught:
        view(tmp_path, out=out, err=io.StringIO())
    picture = tmp_path / "plots" / "k0.heatmap.png"
    assert str(caught.value) == f"cannot write {picture}: No space left on device"
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["key", "k0", "k1"]
    assert list((tmp_path / "plots").iterdir()) == []


def test_an_empty_key_that_matches_nothing_is_said_to_match_only_an_empty_key(tmp_path):
    # '--key ""' was hinted "a glob matches whole keys: '**'" ('' is a part of every key).
    bcrecord.save({"m:f:x@0": [1.0]}, tmp_path / "run")
    with pytest.raises(BcrecordError) as missing:
        view(tmp_path / "run", plots=False, keys=[""], out=io.StringIO())
    assert str(missing.value) == (
        "no saved key matches '' (an empty --key matches only an empty key); saved keys: m:f:x@0"
    )
    bcrecord.save({"": [2.0]}, tmp_path / "run")  # an empty key is a key: it selects it
    out = io.StringIO()
    assert view(tmp_path / "run", plots=False, keys=[""], out=out) == 0
    assert out.getvalue().splitlines()[1].split()[:2] == ["''", "1"]


def test_a_histogram_of_values_whose_span_overflows_is_drawn_in_units_of_a_power_of_two(tmp_path):
    # [-1e308, 1e308] failed in matplotlib's ticks ("could not draw"): its span is no float.
    pytest.importorskip("matplotlib")
    from bcrecord.viz import _pictures

    bcrecord.save({"m:f:wide@0": [[-1e308, 1e308, 0.0]]}, tmp_path, step=0)
    [wide] = summarize(bcrecord.load(tmp_path))
    figure = dict(_pictures(wide, max_maps=32))["hist"]
    figure.savefig(io.BytesIO(), format="png")  # (where the ticks are computed: this failed)
    hist = figure.axes[0]
    assert hist.get_xlabel() == "value / 2**1024"
    heights = [patch.get_path().vertices[:, 1].max() for patch in hist.patches]
    assert sum(heights) > 0 and hist.get_xlim()[0] < -0.5 < 0.5 < hist.get_xlim()[1]


def test_view_without_torch_shows_the_keys_it_can_and_names_those_holding_tensors(tensors_without_torch):
    # It showed no table at all: its error pointed to bcrecord.load(DIR, keys=[...]).
    out, err = io.StringIO(), io.StringIO()
    assert view(tensors_without_torch, plots=False, out=out, err=err) == 0
    assert err.getvalue() == (
        "bcrecord view: 1 key(s) hold tensors, which showing needs torch and the safetensors package "
        "(pip install torch 'bcrecord[save]'): t\n"
    )
    assert [line.split()[0] for line in out.getvalue().splitlines()] == ["key", "n"]


def test_view_without_torch_says_a_damaged_file_once(tensors_without_torch):
    # Loaded again without the tensors, the file's damage was said once per load.
    pickled = next((tensors_without_torch / "records").glob("*.pkl"))
    pickled.write_bytes(pickled.read_bytes()[:10])
    err = io.StringIO()
    assert view(tensors_without_torch, plots=False, out=io.StringIO(), err=err) == 0
    notes = err.getvalue().splitlines()
    assert len(notes) == 2 and notes[0].startswith("bcrecord view: 1 key(s) hold tensors")
    assert f"{pickled.name} is damaged" in notes[1]


class _WarnsWhenLoaded:
    """A value whose unpickling warns (a program's own warning, as an old pickle's)."""

    def __setstate__(self, state):
        import warnings

        warnings.warn("old pickle version", UserWarning, stacklevel=2)
        self.__dict__.update(state)


def test_view_without_torch_passes_the_program_s_own_warnings_on(tensors_without_torch):
    # The first load's warnings were all dropped with its damage notes: a module's or value's own.
    import warnings

    value = _WarnsWhenLoaded()
    value.version = 1  # (a state to set: an empty one is not)
    bcrecord.save({"w": [value]}, tensors_without_torch, step=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        assert view(tensors_without_torch, plots=False, out=io.StringIO(), err=io.StringIO()) == 0
    assert [str(w.message) for w in caught] == ["old pickle version"]
