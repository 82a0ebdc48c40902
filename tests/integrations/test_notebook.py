"""bcrecord in IPython and Jupyter: code defined in cells, which has no source file.

Everything runs in one ``InteractiveShell`` (as a notebook's kernel does), but for one real
kernel run of docs/examples/notebook.ipynb through nbclient.
"""

import os
import pathlib
import re
import sys
import textwrap
import traceback
import warnings

import pytest
import torch

IPython = pytest.importorskip("IPython", reason="the py311-torch tox env installs IPython")
from IPython.core.interactiveshell import InteractiveShell  # noqa: E402

import bcrecord  # noqa: E402
from bcrecord.errors import RecordingWarning  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples" / "notebook.ipynb"


@pytest.fixture(scope="module")
def shell(tmp_path_factory):
    """One shell for the module; its history and profile in a temporary folder, not ``~/.ipython``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IPYTHONDIR", str(tmp_path_factory.mktemp("ipython")))
        shell = InteractiveShell.instance()
        yield shell
        shell.reset(new_session=False)
        shell.history_manager.end_session()
        # The shell put its own module in sys.modules["__main__"]: the later tests get pytest's back.
        shell.restore_sys_module_state()
        InteractiveShell.clear_instance()


@pytest.fixture
def run(shell):
    """Runs one cell (source dedented) and returns its result; each test starts a fresh namespace."""
    shell.reset(new_session=False)

    def run_cell(source, error=False):
        result = shell.run_cell(textwrap.dedent(source), store_history=True, silent=False)
        if result.error_before_exec is not None:
            raise result.error_before_exec
        if not error and result.error_in_exec is not None:
            raise result.error_in_exec
        return result

    return run_cell


def shown(shell, value):
    """What a notebook shows for a cell ending in ``value`` (its text/plain display)."""
    return shell.display_formatter.format(value)[0]["text/plain"]


def test_targets_of_a_cell_function_count_lines_from_the_cell_and_display_as_the_table(shell, run):
    run(
        """\
        import bcrecord
        def scaled(a):
            x = a + 1
            x = x * 10
            return x
        """
    )
    found = run("bcrecord.targets(scaled)").result
    assert shell.user_ns["scaled"].__code__.co_filename.startswith("<ipython-input-")
    rows = [(row["spec"], row["line"]) for row in found.as_dict()["targets"]]
    assert rows == [("x@0", 3), ("x@1", 4), ("*@0", 4), ("+@0", 3), ("return", 5)]
    # Before, the notebook showed '<Targets of scaled: 5 sites>': now the table print() shows.
    assert shown(shell, found) == str(found)
    assert shown(shell, found).splitlines()[0] == "scaled(a)"


def test_recording_patching_and_instrumenting_cell_functions_and_classes(shell, run):
    run(
        """\
        import bcrecord
        class Scaler:
            def __init__(self):
                self.scale = 3
            def forward(self, v):
                out = v * self.scale
                return out
        def area(w, h):
            a = w * h
            return a
        @bcrecord.record_locals("acc")
        def summed(values):
            acc = 0
            for v in values:
                acc = acc + v
            return acc
        model = Scaler()
        with bcrecord.patch_method(model, "forward", ["out", "self.scale"], name="m"):
            with bcrecord.patch_function(area, ["a"]), bcrecord.recording() as rec:
                model.forward(2)
                area(2, 5)
                bcrecord.instrument(area, ["return"], name="inst")(3, 4)
                summed([1, 2])
        """
    )
    rec = shell.user_ns["rec"]
    assert dict(rec.items()) == {
        "m:forward:out@0": 6,
        "m:forward:self.scale": 3,
        "__main__:area:a@0": 10,
        "inst:area:return": 12,  # a new function: the patched one's probes are not copied into it
        "__main__:summed:acc@0": 0,
        "__main__:summed:acc@1": 3,
    }
    assert rec.all("__main__:area:a@0") == [10]
    assert shown(shell, rec) == "<Recording inactive, 6 keys>"


def test_a_recording_entered_in_one_cell_records_the_next_cells(shell, run):
    run(
        """\
        import bcrecord
        def inc(a):
            x = a + 1
            return x
        patch = bcrecord.patch_function(inc, ["x"])
        rec = bcrecord.recording()
        rec.__enter__()
        """
    )
    run("inc(1)")
    run("inc(2)")
    assert run("rec.__exit__(None, None, None); patch.remove(); rec.all('__main__:inc:x@0')").result == [2, 3]


def test_running_a_cell_again_makes_a_new_unpatched_function(shell, run):
    define = """\
        def twice(a):
            y = a * 2
            return y
        """
    run("import bcrecord\n" + textwrap.dedent(define))
    first = shell.user_ns["twice"]
    run("patch = bcrecord.patch_function(twice, ['y'])")
    run(define)  # the user runs the cell again: a new function, which nobody patched
    assert shell.user_ns["twice"] is not first
    run("with bcrecord.recording() as rec:\n    twice(1)")
    assert len(shell.user_ns["rec"]) == 0
    with bcrecord.recording() as rec:
        first(5)
    assert rec["__main__:twice:y@0"] == 10
    run("patch.remove()")
    assert first.__code__ is not shell.user_ns["twice"].__code__
    run("with bcrecord.patch_function(twice, ['y']), bcrecord.recording() as rec:\n    twice(4)")
    assert shell.user_ns["rec"]["__main__:twice:y@0"] == 8


def test_a_cell_with_top_level_await_defines_recordable_functions(shell, run):
    run(
        """\
        import asyncio, bcrecord
        await asyncio.sleep(0)
        async def delayed(v):
            w = v + 1
            await asyncio.sleep(0)
            return w
        async def counted(n):
            for i in range(n):
                u = i * 2
                yield u
        with bcrecord.patch_function(delayed, ["w"]), bcrecord.patch_function(counted, ["u"]):
            with bcrecord.recording() as rec:
                got = await delayed(41)
                seen = [u async for u in counted(3)]
        """
    )
    rec = shell.user_ns["rec"]
    assert (shell.user_ns["got"], shell.user_ns["seen"]) == (42, [0, 2, 4])
    assert rec["__main__:delayed:w@0"] == 42
    assert rec.all("__main__:counted:u@0") == [0, 2, 4]


def test_lambdas_and_comprehensions_in_cells(shell, run):
    run(
        """\
        import bcrecord
        bump = lambda q: (q + 1) * 2
        def doubled(xs):
            ys = [x * 2 for x in xs]
            return ys
        with bcrecord.recording() as rec:
            bcrecord.instrument(bump, ["+@0", "return"])(3)
            bcrecord.instrument(doubled, ["ys", "*@0"])([1, 2])
        """
    )
    assert dict(shell.user_ns["rec"].items()) == {
        "__main__:<lambda>:+@0": 4,
        "__main__:<lambda>:return": 8,
        "__main__:doubled:*@0": 4,
        "__main__:doubled:ys@0": [2, 4],
    }


def test_an_exception_in_a_patched_cell_function_points_at_its_cell_line(shell, run, capsys):
    result = run(
        """\
        import bcrecord
        def failing(v):
            w = v + 1
            raise ValueError(w)
        with bcrecord.patch_function(failing, ["w"]), bcrecord.recording() as rec:
            failing(1)
        """,
        error=True,
    )
    error = result.error_in_exec
    assert isinstance(error, ValueError) and error.args == (2,)
    last = traceback.extract_tb(error.__traceback__)[-1]
    assert (last.filename.startswith("<ipython-input-"), last.lineno, last.name) == (True, 4, "failing")
    assert shell.user_ns["rec"]["__main__:failing:w@0"] == 2
    # The traceback IPython prints quotes the cell's line (colours taken out).
    printed = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert "----> 4     raise ValueError(w)" in printed


def test_autoreload_code_set_anew_warns_and_a_new_patch_records_it(shell, run, tmp_path, monkeypatch):
    module = tmp_path / "nb_reloaded.py"
    module.write_text("def f(v):\n    z = v * 2\n    return z\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    run("%load_ext autoreload")
    run("%autoreload 2")
    try:
        run("import bcrecord, nb_reloaded\npatch = bcrecord.patch_function(nb_reloaded.f, ['z'])")
        module.write_text("def f(v):\n    z = v * 200\n    return z\n")
        later = os.stat(module).st_mtime + 10  # autoreload compares modification times
        os.utime(module, (later, later))
        with pytest.warns(RecordingWarning, match="code was replaced while it was patched"):
            run("with bcrecord.recording() as rec:\n    got = nb_reloaded.f(1)")
        assert (shell.user_ns["got"], len(shell.user_ns["rec"])) == (200, 0)  # as the README says
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            run("patch.remove()")
        run(
            """\
            with bcrecord.patch_function(nb_reloaded.f, ["z"]), bcrecord.recording() as rec:
                got = nb_reloaded.f(2)
            """
        )
        assert shell.user_ns["rec"]["nb_reloaded:f:z@0"] == 400
    finally:
        run("%autoreload 0")
        sys.modules.pop("nb_reloaded", None)


def test_torch_record_and_feature_extractor_on_a_cell_model(shell, run):
    run(
        """\
        import torch, bcrecord.torch as bt
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(3, 2)
            def forward(self, x):
                h = self.fc(x)
                h = h.relu()
                return h * 2
        torch.manual_seed(0)
        net = Net()
        x = torch.tensor([[1.0, -2.0, 3.0]])
        with bt.record(net, [":forward:h@0", ":forward:h@1"]) as rec:
            out = net(x)
        features = bt.create_feature_extractor(net, [":forward:h@1"])(x)
        """
    )
    ns = shell.user_ns
    rec, net, x = ns["rec"], ns["net"], ns["x"]
    torch.testing.assert_close(rec[":forward:h@0"], net.fc(x))
    torch.testing.assert_close(rec[":forward:h@1"], net.fc(x).relu())
    torch.testing.assert_close(ns["features"][":forward:h@1"], net.fc(x).relu())
    listing = run("bt.list_targets(net)").result
    # Before, the notebook showed the flat list: now the table grouped by submodule print() shows.
    assert shown(shell, listing) == str(listing)
    assert shown(shell, listing).splitlines()[:2] == ["<root>", "    :forward:h@0"]


def test_the_example_notebook_runs_in_a_real_kernel(tmp_path, monkeypatch):
    # The kernel's connection file and profile go to a temporary folder, not the home directory.
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    nbformat = pytest.importorskip("nbformat", reason="the py311-torch tox env installs nbformat")
    nbclient = pytest.importorskip("nbclient", reason="the py311-torch tox env installs nbclient")
    kernelspec = pytest.importorskip(
        "ipykernel.kernelspec", reason="the py311-torch tox env installs ipykernel"
    )
    # A kernel of this Python: a 'python3' kernelspec of the machine or user could be another one.
    kernelspec.write_kernel_spec(tmp_path / "jupyter" / "kernels" / "bcrecord-tests")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))  # searched first
    notebook = nbformat.read(EXAMPLE, as_version=4)
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="bcrecord-tests").execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]

    def text(cell):
        return "".join(
            out.get("data", {}).get("text/plain", "") + out.get("text", "") for out in cell.outputs
        )

    # Every cell ran without error (execute() raises otherwise); what they show:
    assert text(code[1]).splitlines()[:2] == ["scaled(values, scale)", "kind      target  index  line  spec"]
    assert "total@1" in text(code[1]) and "3:4" in text(code[1])  # the line in its cell
    assert text(code[2]) == "[('__main__:scaled:total@0', 6), ('__main__:scaled:total@1', 60)]"
    assert text(code[3]).splitlines()[:2] == ["<root>", "    :forward:h@0"]
    assert text(code[4]) == "True"
    assert text(code[5]) == "42"
