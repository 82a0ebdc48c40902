"""The demo (:mod:`bcrecord.demo`) and its model (:mod:`bcrecord.demo_model`).

Needs torch, safetensors and matplotlib (``pip install -e '.[torch,save,viz,test]'``).
"""

import io

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import bcrecord  # noqa: E402
from bcrecord.demo import TARGETS, _demo_keys, run  # noqa: E402
from bcrecord.demo_model import TinyResNet, example_images  # noqa: E402
from bcrecord.errors import BcrecordError  # noqa: E402
from bcrecord.storage import saved_keys  # noqa: E402
from bcrecord.torch import record  # noqa: E402

from ..commands import cli, one_clear_line  # noqa: E402


def test_demo_model_records_what_an_independent_computation_gives():
    torch.manual_seed(0)
    model = TinyResNet().eval()
    images, labels = example_images(4)
    assert images.shape == (4, 3, 32, 32) and labels.shape == (4,)
    with torch.no_grad(), record(model, TARGETS) as rec:
        logits = model(images)
    with torch.no_grad():
        bn = model.bn1(model.conv1(images))
        block = model.layer1[0]
        block_bn1 = block.bn1(block.conv1(torch.relu(bn)))
    assert logits.shape == (4, 3)
    assert torch.equal(rec[":forward:x@1"], bn)
    assert torch.equal(rec[":forward:x@7"], logits)
    assert torch.allclose(rec["layer1.0:forward:out@1"], block_bn1)
    assert rec["layer1.0:forward:out@1"].min() < 0  # the batch norm output, before the in-place ReLU
    assert torch.equal(rec["layer1.0:forward:out@2"], torch.relu(block_bn1))


def test_run_in_process_reports_and_saves(tmp_path):
    out = io.StringIO()
    assert run(tmp_path / "demo", steps=2, plots=False, out=out) == 0
    text = out.getvalue()
    assert "The value before the in-place ReLU survived" in text
    assert bcrecord.load(tmp_path / "demo").steps(":forward:x@1") == [0, 1]
    # What the demo counts as its own keys (a rerun replaces them) is what it saved.
    assert sorted(saved_keys(tmp_path / "demo")) == sorted(_demo_keys())
    with pytest.raises(BcrecordError, match="--steps must be at least 1"):
        run(tmp_path / "other", steps=0, out=out)
    assert not (tmp_path / "other").exists()


def test_steps_that_are_no_whole_number_are_refused_before_an_earlier_demo_is_cleared(tmp_path):
    # steps=2.5 cleared the earlier demo's records, then failed in range() with a TypeError.
    assert run(tmp_path / "demo", steps=1, plots=False, out=io.StringIO()) == 0
    for steps in (2.5, True, "3"):
        with pytest.raises(BcrecordError, match=f"^--steps must be a whole number, got {steps!r}$"):
            run(tmp_path / "demo", steps=steps, plots=False, out=io.StringIO())
    assert bcrecord.load(tmp_path / "demo").steps(":forward:x@1") == [0]


def test_run_in_process_and_view_take_a_folder_under_home_written_with_a_tilde(tmp_path, monkeypatch):
    from bcrecord.viz import view

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert run("~/demo", steps=1, plots=False, out=io.StringIO()) == 0
    assert not (tmp_path / "~").exists()  # not a folder named '~' in the working directory
    assert bcrecord.load(tmp_path / "home" / "demo").steps(":forward:x@1") == [0]
    out = io.StringIO()
    assert view("~/demo", plots=False, keys=":forward:x@1", out=out) == 0
    assert out.getvalue().splitlines()[1].split()[:2] == [":forward:x@1", "1"]


def test_run_in_process_and_from_the_command_line_take_dot_slash_tilde_as_a_folder_named_tilde(
    tmp_path, monkeypatch
):
    # './~' wrote into the home directory: pathlib drops the './', and expanduser took the rest for home.
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert run("./~", steps=1, plots=False, out=io.StringIO()) == 0
    assert bcrecord.load(tmp_path / "~").steps(":forward:x@1") == [0]
    result = cli(
        "demo", "--no-plots", "--steps", "1", "--out", "./~/again", cwd=tmp_path, env={"HOME": str(home)}
    )
    assert result.returncode == 0, result.stderr
    assert bcrecord.load(tmp_path / "~" / "again").steps(":forward:x@1") == [0]
    assert list(home.iterdir()) == []


def test_demo(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "demo"
    result = cli("demo", "--out", out, "--steps", "2")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    before = next(line for line in text.splitlines() if "layer1.0:forward:out@1  out = self.bn1(out)" in line)
    after = next(line for line in text.splitlines() if "layer1.0:forward:out@2  out = self.relu(out)" in line)
    assert float(before.split("min")[1].split()[0]) < 0 <= float(after.split("min")[1].split()[0])
    assert "picture(s) in" in text
    pngs = list((out / "plots").glob("*.png"))
    assert len(pngs) >= 20
    assert bcrecord.load(out).steps(":forward:x@1") == [0, 1]
    # A second run replaces the first; a folder the demo did not make is refused.
    assert cli("demo", "--out", out, "--steps", "1", "--no-plots").returncode == 0
    assert bcrecord.load(out).steps(":forward:x@1") == [0]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert "was not made by bcrecord demo" in one_clear_line(cli("demo", "--out", other))
    assert (other / "keep.txt").exists()
    assert "is a file, not a directory" in one_clear_line(cli("demo", "--out", other / "keep.txt"))
    assert (other / "keep.txt").read_text() == "mine"


def test_demo_keeps_a_folder_that_bcrecord_run_saved_into(tmp_path):
    # demo, then `bcrecord run -o` into the demo's folder, then demo again: the run's values stay.
    (tmp_path / "prog.py").write_text("def f(v):\n    y = v * 2\n    return y\n\nf(3)\n")
    assert cli("demo", "--out", "dd", "--steps", "1", "--no-plots", cwd=tmp_path).returncode == 0
    ran = cli("run", "-r", "__main__:f:y", "-o", "dd", "prog.py", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    before = sorted(p.name for p in (tmp_path / "dd").rglob("*"))
    line = one_clear_line(cli("demo", "--out", "dd", "--steps", "1", "--no-plots", cwd=tmp_path))
    assert "holds values the demo did not save (__main__:f:y@0)" in line, line
    assert sorted(p.name for p in (tmp_path / "dd").rglob("*")) == before  # nothing deleted
    assert bcrecord.load(tmp_path / "dd")["__main__:f:y@0"] == [6]
    assert bcrecord.load(tmp_path / "dd").steps(":forward:x@1") == [0]


def test_demo_refuses_an_earlier_demo_s_folder_it_cannot_read(tmp_path):
    out = tmp_path / "demo"
    assert run(out, steps=1, plots=False, out=io.StringIO()) == 0
    (out / "index.json").write_text("{not json")
    with pytest.raises(BcrecordError, match="has an index the demo cannot read"):
        run(out, steps=1, plots=False, out=io.StringIO())
    assert (out / "records").is_dir() and (out / "index.jsonl").exists()


def test_demo_suggests_a_view_command_that_a_shell_takes(tmp_path):
    result = cli("demo", "--out", "sp ace/dïr", "--steps", "1", "--no-plots", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    commands = [line.split("#")[0].strip() for line in result.stdout.splitlines() if "bcrecord view" in line]
    assert commands == ["4. bcrecord view 'sp ace/dïr':", "bcrecord view 'sp ace/dïr'"]
    # After --no-plots, what that command does: it draws the pictures ("no --no-plots there" read
    # as if view had no such option).
    said = next(line for line in result.stdout.splitlines() if line.startswith("   bcrecord view"))
    assert said.split("#")[1].strip() == "this table again, now with the pictures"


def test_demo_without_matplotlib_suggests_a_view_that_draws_none(tmp_path, monkeypatch):
    # It suggested `bcrecord view DIR`, "now with the pictures", which then said pictures need matplotlib.
    import importlib.util

    real = importlib.util.find_spec

    def find_spec(name, *rest):
        return None if name == "matplotlib" else real(name, *rest)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    out = io.StringIO()
    assert run(tmp_path / "d", steps=1, plots=False, out=out) == 0
    said = next(line for line in out.getvalue().splitlines() if line.startswith("   bcrecord view"))
    command, note = (part.strip() for part in said.split("#"))
    assert command.endswith("--no-plots")
    assert note == "this table again (pictures need: pip install 'bcrecord[viz]')"


def test_readme_and_the_demo_s_docstring_say_how_long_it_takes_as_measured():
    # Measured on a 2-core CPU (2026-12-06, a fresh virtual environment as the quickstart makes):
    # 5.7-5.8 s (6.1 s the first run, matplotlib building its font cache), 2.9-3.0 s with
    # --no-plots. What the README and the module say is that, neither less nor far more.
    import re
    from pathlib import Path

    import bcrecord.demo

    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    docstring = " ".join((bcrecord.demo.__doc__ or "").split())
    for text in (readme, docstring):
        found = re.search(r"about (\d+) seconds on a 2-core CPU \(the first run a little longer", text)
        assert found is not None and 6 <= int(found.group(1)) <= 8, text[:2000]
        assert re.search(r"about 3 with(out the pictures \(`--no-plots`\)| ``plots=False``)", text), text
