"""The command line (:mod:`bcrecord.cli`), end to end through subprocesses (core only: no torch).

``targets`` (``--json``, sourceless modules), ``show``, ``view`` of pickled records,
``--help``, and bad input: one clear line on stderr, status 2, no traceback.
``bcrecord run`` has its own module, ``test_runner.py``.
"""

import json
import os
import platform
import py_compile
import shlex
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

import bcrecord
from bcrecord.cli import _resolved, _stripped, _with_environment
from bcrecord.errors import BcrecordError

from .commands import ROOT, _env, cli, one_clear_line
from .typed_text import SETTINGS, TYPED

RUN = dict(env=_env(), capture_output=True, text=True, timeout=300)

# --- targets and show --------------------------------------------------------------------


def test_targets_json_parses(project):
    result = cli("targets", "helper:Scaler.scale", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["function"] == "Scaler.scale"
    assert data["arguments"] == ["self", "v"]
    specs = {(row["kind"], row["target"], row["index"], row["spec"]) for row in data["targets"]}
    assert {("local", "out", 0, "out@0"), ("local", "out", 1, "out@1")} <= specs
    assert {("attribute", "self.factor", 0, "self.factor@0"), ("return", "return", 0, "return")} <= specs


def test_targets_json_stays_json_when_the_module_prints_as_it_is_imported(project):
    (project / "noisy.py").write_text(
        "print('training starts')\n\ndef step(x):\n    y = x + 1\n    return y\n"
    )
    result = cli("targets", "noisy:step", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["function"] == "step"
    assert result.stderr == "training starts\n"


def test_targets_and_show_refusing_a_wrapper_object_give_the_path_of_the_function_that_runs(project):
    # They gave the Python API's patch_function(cf.__wrapped__, specs) alone: no path to type.
    from .test_runner import WRAPPERS

    (project / "wrappers.py").write_text(WRAPPERS)
    named = {
        "part": ("wrappers:base", "base(a, b)"),
        "part_of_made": ("wrappers:made", "made(p)"),  # (it said 'None:made')
        "inst": ("wrappers:K.__call__", "K.__call__(self, z)"),
        "cf": ("wrappers:cf.__wrapped__", "cf(x)"),
    }
    for name, (path, header) in named.items():
        for command in (["targets", f"wrappers:{name}"], ["show", f"wrappers:{name}", "return"]):
            result = cli(*command, cwd=project)
            assert result.returncode == 2 and result.stdout == ""
            assert result.stderr.rstrip().endswith(f"; as a path: {path!r}"), result.stderr
        assert cli("targets", path, cwd=project).stdout.splitlines()[0] == header


def test_targets_of_a_code_object_still_lists_it(project):
    # The wrapper check refused what targets() takes and function_of does not: a code object.
    (project / "coded.py").write_text("def f(a):\n    x = a * 2\n    return x\ncode = f.__code__\n")
    result = cli("targets", "coded:code", cwd=project)
    assert result.returncode == 0 and result.stdout.splitlines()[0] == "f(a)", result.stderr


def test_targets_table_without_source(project):
    """A module imported from a .pyc alone: no source, and targets still lists everything."""
    sourceless = project / "compiled"
    sourceless.mkdir()
    py_compile.compile(str(project / "helper.py"), cfile=str(sourceless / "nosource.pyc"))
    result = cli("targets", "nosource:twice", cwd=sourceless)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "twice(x)"
    assert "y@0" in result.stdout and "return" in result.stdout


def test_show_marks_the_probes(project):
    result = cli("show", "helper:twice", "y", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "1 probe(s): show:twice:y@0" in result.stdout
    inserted = [line for line in result.stdout.splitlines() if line.startswith("+")]
    assert any("SINKS.get" in line or "__bcrecord_probe__" in line for line in inserted)


def test_show_prints_the_source_depyf_decompiles_with_the_probes_spelled_as_calls(project):
    # The command line patches before torch is imported (depyf imports it): inline probes,
    # whose exception handler depyf cannot decompile (on 3.11+), so no source was shown.
    pytest.importorskip("depyf")
    result = cli("show", "helper:twice", "y", cwd=project)
    assert result.returncode == 0, result.stderr
    source = result.stdout.split("decompiled patched source (depyf", 1)[1].split(":\n", 1)[1]
    assert "y = x * 2" in source and "__bcrecord_probe__(y, " in source and "return y" in source


def test_show_takes_the_specs_targets_lists_that_start_with_a_minus(project):
    # '-@0' (a subtraction, as targets lists it) was taken for an option: "unrecognized arguments".
    (project / "minus.py").write_text("def f(a, b):\n    d = a - b\n    d -= 1\n    return d\n")
    listed = json.loads(cli("targets", "minus:f", "--json", cwd=project).stdout)["targets"]
    assert {"-@0", "-=@0"} <= {row["spec"] for row in listed}
    result = cli("show", "minus:f", "-@0", "--name", "n", "-=@0", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "f: 2 probe(s): n:f:-@0, n:f:-=@0"


def test_show_notes_an_entry_chain_the_function_never_loads(project):
    result = cli("show", "helper:Scaler.scale", "self.factr", "out@0", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == [
        "Scaler.scale: 2 probe(s): show:scale:self.factr, show:scale:out@0",
        "note: Scaler.scale never loads self.factr; did you mean 'self.factor'? (the chains it loads: "
        "self.factor); the probe reads self.factr when Scaler.scale starts, and records nothing where "
        "the object has no such attribute",
    ]
    # A chain it loads, or one that extends a loaded one, gets no note.
    for chain in ("self.factor", "self.factor.real"):
        shown = cli("show", "helper:Scaler.scale", chain, cwd=project).stdout.splitlines()
        assert shown[0] == f"Scaler.scale: 1 probe(s): show:scale:{chain}" and shown[1] == "", shown[:3]


def test_show_notes_no_unloaded_chain_for_a_private_name_the_function_loads(project):
    # self.__gain is compiled as self._Amp__gain: a chain it loads in either spelling.
    (project / "amp.py").write_text("class Amp:\n    def run(self, v):\n        return v * self.__gain\n")
    for chain in ("self.__gain", "self._Amp__gain"):
        shown = cli("show", "amp:Amp.run", chain, cwd=project)
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0] == "Amp.run: 1 probe(s): show:run:self._Amp__gain" and lines[1] == "", lines[:3]


def test_targets_and_show_take_a_property_as_run_records_it(project):
    (project / "shapes.py").write_text(
        "class Box:\n    @property\n    def area(self):\n        a = 2 * 3\n        return a\n"
    )
    listed = cli("targets", "shapes:Box.area", cwd=project)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0] == "Box.area(self)" and "a@0" in listed.stdout
    shown = cli("show", "shapes:Box.area", "a", cwd=project)
    assert shown.returncode == 0 and "1 probe(s): show:area:a@0" in shown.stdout, shown.stderr


@pytest.mark.parametrize(
    "args, words",
    [
        (["targets", "no_colon"], "expected 'package.module:Class.method'"),
        (
            ["targets", "helper.Scaler.scale"],
            "got 'helper.Scaler.scale'; did you mean 'helper:Scaler.scale'?",
        ),
        (["targets", "helper.py"], "got 'helper.py'; a function of it is 'helper:FUNCTION', from its folder"),
        (["targets", "no_such_module_xyz:f"], "cannot import module 'no_such_module_xyz'"),
        (["targets", "helpr:twice"], "No module named 'helpr'; did you mean 'helper'"),
        (["targets", "helper:nope"], "has no attribute 'nope'"),
        (["targets", "helper:Scaler.scael"], "has no attribute 'scael'; did you mean 'scale'?"),
        (["targets", ".helper:twice"], "give the module's absolute name (no leading dot)"),
        (["targets", "__main__:twice"], "name a script by its module name ('prog:twice' for prog.py"),
        (["targets", "__main__"], "name a script by its module name ('prog:FUNCTION' for prog.py"),
        (["targets", "./pkg/tool.py:main"], "not a file (e.g. 'pkg.tool:main', from the folder"),
        (["show", "helper:twice", "nosuch"], "no assignment to a local named 'nosuch'"),
        (["show", "helper:twice", "y@9"], "there is no index 9"),
        # A `bcrecord run` target pasted whole: the function and its specs, apart.
        (
            ["targets", "helper:Scaler.scale:out@1"],
            "ends with a spec, as a `bcrecord run` target does: here the function comes alone, "
            "'helper:Scaler.scale', and specs after it ('bcrecord show helper:Scaler.scale out@1')",
        ),
        (["show", "helper:twice:y"], "the function comes alone, 'helper:twice'"),
        (["show", "helper:twice"], "give the specs to show after the path, e.g. 'bcrecord show helper:twice"),
    ],
)
def test_targets_and_show_bad_input(project, args, words):
    assert words in one_clear_line(cli(*args, cwd=project))


@pytest.mark.parametrize("command", [["targets", "pkg.tool"], ["show", "pkg.tool", "x"]])
def test_targets_and_show_of_a_bare_module_ask_for_one_of_its_functions(project, command):
    # It said "did you mean 'pkg:tool'?": the module as an attribute of its package, no function.
    line = one_clear_line(cli(*command, cwd=project))
    assert line.endswith(
        "got 'pkg.tool'; 'pkg.tool' is a module: name a function of it, 'pkg.tool:FUNCTION' "
        "or 'pkg.tool:Class.method'"
    ), line


def test_the_console_command_finds_modules_in_the_working_directory(project, tmp_path_factory):
    # What pip writes for the setup.cfg entry point, run as the installed command is:
    # sys.path[0] is then the script's own folder, not the working directory.
    import configparser

    entry = configparser.ConfigParser()
    entry.read(ROOT / "setup.cfg")
    line = entry["options.entry_points"]["console_scripts"].strip()
    module, function = line.split("=", 1)[1].strip().split(":")
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "bcrecord").write_text(
        f"import sys\nfrom {module} import {function}\nsys.exit({function}())\n"
    )
    command = [sys.executable, str(bin_dir / "bcrecord")]
    listed = subprocess.run([*command, "targets", "helper:twice"], cwd=project, **RUN)
    assert listed.returncode == 0 and "y@0" in listed.stdout, listed.stderr
    ran = subprocess.run(
        [*command, "run", "-r", "pkg.tool:main:joined", "-m", "pkg.tool", "a"], cwd=project, **RUN
    )
    assert ran.returncode == 1 and ran.stdout == "A\n", ran.stderr  # 'A' and its exit status, as python -m
    assert "__main__:main:joined@0  1       'A'" in ran.stderr
    # Under PYTHONSAFEPATH nothing is put first: the PYTHONPATH that names the project stays.
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    safe = dict(
        RUN, env={**RUN["env"], "PYTHONSAFEPATH": "1", "PYTHONPATH": f"{project}:{RUN['env']['PYTHONPATH']}"}
    )
    listed = subprocess.run([*command, "targets", "helper:twice"], cwd=elsewhere, **safe)
    assert listed.returncode == 0 and "y@0" in listed.stdout, listed.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="a working directory in use cannot be removed")
def test_the_console_command_runs_in_a_working_directory_that_was_removed(project, tmp_path_factory):
    # `bcrecord` (not `python -m bcrecord`) failed with os.getcwd()'s FileNotFoundError traceback
    # where python runs the program (a shell left in a build folder made again); `run -m` too.
    bin_dir = tmp_path_factory.mktemp("bin")
    (bin_dir / "bcrecord").write_text("import sys\nfrom bcrecord.cli import _console\nsys.exit(_console())\n")
    gone = tmp_path_factory.mktemp("gone")
    env = {**RUN["env"], "PYTHONPATH": f"{project}:{RUN['env']['PYTHONPATH']}"}
    command = [sys.executable, str(bin_dir / "bcrecord"), "run", "-r", "__main__:main:joined"]
    removed = {**RUN, "env": env, "cwd": gone, "preexec_fn": lambda: gone.rmdir()}
    for program in (["-m", "pkg.tool"], [str(project / "pkg" / "tool.py")]):
        ran = subprocess.run([*command, *program, "a"], **removed)
        assert ran.returncode == 1 and ran.stdout == "A\n", ran.stderr
        assert "Traceback" not in ran.stderr and "@0  1       'A'" in ran.stderr
        gone.mkdir()


def test_help_and_console_entry(project):
    for args in (["--help"], ["run", "--help"], ["view", "--help"], ["demo", "--help"]):
        result = cli(*args, cwd=project)
        assert result.returncode == 0 and "usage: bcrecord" in result.stdout, (args, result.stderr)
    assert "--save-dir" in cli("run", "--help").stdout
    # run's usage (its own, to show the program's part) names every option: --copy and -q were missing.
    usage = cli("run", "--help").stdout.split("\n\n")[0]
    assert all(option in usage for option in ("--record", "--save-dir", "--every", "--copy", "-q", "-m")), (
        usage
    )
    # view's DIR: the demo's folder is one too (its help named `bcrecord run --save-dir` alone).
    assert "bcrecord demo" in " ".join(cli("view", "--help").stdout.split())


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device that is always full)")
def test_output_that_cannot_be_written_is_said_in_one_line(project):
    # `bcrecord targets ... > /dev/full` printed an OSError traceback (only a closed pipe was handled).
    saved = project / "runs"
    bcrecord.save({"m:f:x@0": [1.0]}, saved)
    for args in (
        ["targets", "helper:Scaler.scale"],
        ["targets", "json:dumps", "--json"],
        ["show", "helper:twice", "y"],
        ["view", str(saved), "--no-plots"],
    ):
        with open("/dev/full", "w") as full:
            result = subprocess.run(
                [sys.executable, "-m", "bcrecord", *args],
                cwd=project,
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(),
                timeout=300,
            )
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr == "bcrecord: could not write the output: No space left on device\n", args


def test_output_to_a_closed_standard_output_is_dropped_as_python_drops_it(project):
    # `bcrecord targets ... >&-` (no standard output: sys.stdout is None) printed an
    # AttributeError traceback, status 1, since its report went through _Output; print() writes
    # nothing there, and bcrecord wrote nothing and exited 0 before.
    saved = project / "runs"
    bcrecord.save({"m:f:x@0": [1.0]}, saved)
    for args in (
        ["targets", "helper:Scaler.scale"],
        ["show", "helper:twice", "y"],
        ["view", str(saved), "--no-plots"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "bcrecord", *args],
            cwd=project,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
            timeout=300,
            preexec_fn=lambda: os.close(1),
        )
        assert (result.returncode, result.stderr) == (0, ""), args


def test_run_options_given_after_the_script_are_said_to_go_before_it(project):
    # `bcrecord run prog.py -r T` gave "the following arguments are required: -r/--record".
    cases = [
        (["prog.py", "a", "-r", "helper:twice:y"], "-r", "prog.py"),
        (["-m", "pkg.tool", "--record=helper:twice:y"], "--record=helper:twice:y", "-m pkg.tool"),
    ]
    for args, option, program in cases:
        assert one_clear_line(cli("run", *args, cwd=project)) == (
            f"bcrecord: {option} comes after the program, which takes it as its own: bcrecord's options "
            f"go before it, bcrecord run --record TARGET ... {program} [args ...]"
        )
    none = cli("run", "prog.py", cwd=project)  # no target at all: argparse's usage, as before
    assert none.returncode == 2 and "the following arguments are required: -r/--record" in none.stderr


def test_a_save_dir_naming_the_rank_gives_each_rank_its_own_directory(project, monkeypatch):
    # Under torchrun the shell that starts it has no RANK: '-o runs/rank$RANK' reached every
    # rank as 'runs/rank', and quoted it was a folder named 'rank$RANK', shared by all.
    monkeypatch.delenv("RANK", raising=False)
    for rank in ("0", "1"):
        args = ("run", "-r", "helper:twice:y", "-o", "runs/rank$RANK", "prog.py")
        result = cli(*args, cwd=project, env={"RANK": rank})
        assert result.returncode == 0, result.stderr
        assert f"runs/rank{rank}" in result.stderr
    assert sorted(path.name for path in (project / "runs").iterdir()) == ["rank0", "rank1"]
    assert bcrecord.load(project / "runs" / "rank1")["helper:twice:y@0"] == [0, 2, 4, 6, 8, 10]
    # Not under torchrun: said, not a folder named 'rank$RANK'.
    unset = cli("run", "-r", "helper:twice:y", "-o", "runs/rank${RANK}", "prog.py", cwd=project)
    assert one_clear_line(unset) == (
        "bcrecord: --save-dir 'runs/rank${RANK}': RANK is not set in this process's environment"
    )
    assert not (project / "runs" / "rank${RANK}").exists()


def test_a_save_dir_variable_whose_value_holds_a_dollar_is_kept_as_it_is(monkeypatch):
    # The check for names left unset ran on the expanded text: a value holding a '$' (a path
    # such as '/data/$shared') was "shared is not set", a name the user never wrote.
    monkeypatch.setenv("BCRECORD_ROOT", "/data/$shared")
    monkeypatch.setenv("RANK", "1")
    assert _with_environment("${BCRECORD_ROOT}/rank$RANK") == "/data/$shared/rank1"
    monkeypatch.delenv("BCRECORD_UNSET", raising=False)
    with pytest.raises(BcrecordError, match=r"\$\{\} is not set"):  # (was 'None is not set')
        _with_environment("runs/${}")
    with pytest.raises(BcrecordError, match="BCRECORD_UNSET is not set"):
        _with_environment("$BCRECORD_ROOT/$BCRECORD_UNSET")


def test_targets_and_show_take_a_path_with_spaces_around_its_parts_as_run_does(project):
    # 'helper: Scaler.scale ' was "module has no attribute ' Scaler'"; run takes such a target.
    listed = cli("targets", "helper: Scaler.scale ", cwd=project)
    assert listed.returncode == 0 and listed.stdout.startswith("Scaler.scale(self, v)\n"), listed.stderr
    shown = cli("show", " helper :Scaler.scale", "out@1", cwd=project)
    assert shown.returncode == 0 and shown.stdout.startswith("Scaler.scale: 1 probe(s): show:scale:out@1\n")


def test_version_says_which_bcrecord_on_which_python():
    # `bcrecord --version` (what a bug report asks for) was an error: "arguments are required: command".
    result = cli("--version")
    python = platform.python_version()
    assert (result.returncode, result.stdout) == (0, f"bcrecord {bcrecord.__version__} (Python {python})\n")


@pytest.mark.parametrize(
    "command", [["run", "-r", "helper:twice:y", "helper.py"], ["targets", "helper:twice"]]
)
def test_a_failure_caused_by_a_module_of_the_working_directory_says_which(project, command):
    # Started in a folder with its own platform.py, bcrecord's own parser (its --version text)
    # failed on platform.python_version() with a bare traceback, where the README says bcrecord
    # warns of such a module of the program's: the failure now comes with that warning.
    (project / "platform.py").write_text("MINE = 1\n")
    result = cli(*command, cwd=project)
    said = "bcrecord: warning: bcrecord imported the program's own platform in place of the module(s)"
    assert result.returncode == 1 and said in result.stderr, result.stderr
    failed = "AttributeError: module 'platform' has no attribute 'python_version'"
    assert result.stderr.splitlines()[-1].startswith(failed)  # (3.13 adds why to the message)
    (project / "platform.py").unlink()
    assert "warning" not in cli(*command, cwd=project).stderr


def test_a_failure_after_the_user_s_own_modules_are_imported_never_names_them(tmp_path, monkeypatch, capsys):
    # The user's modules (a program's utils.py, the module of 'targets mod:f') are theirs: a
    # bcrecord failure after importing them must not say bcrecord took them as its own.
    (tmp_path / "users_own.py").write_text("X = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    def fails_after_importing(argv):
        __import__("users_own")
        raise RuntimeError("a failure of bcrecord's own")

    monkeypatch.setattr(bcrecord.cli, "_main", fails_after_importing)
    monkeypatch.delitem(sys.modules, "users_own", raising=False)
    with pytest.raises(RuntimeError, match="a failure of bcrecord's own"):
        bcrecord.cli.main(["targets", "users_own:f"])
    assert sys.modules.pop("users_own") and capsys.readouterr().err == ""


@pytest.mark.parametrize("command", [["targets", "helper:Scaler"], ["show", "helper:Scaler", "out"]])
def test_a_class_gets_a_method_path_to_give(project, command):
    assert one_clear_line(cli(*command, cwd=project)) == (
        "bcrecord: 'helper:Scaler' is a class: name one of its methods, e.g. 'helper:Scaler.scale'"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # A class whose methods it inherits: one of those, not a 'forward' it lacks.
        (
            ["targets", "inherits:Sub"],
            "'inherits:Sub' is a class: name one of its methods, e.g. 'inherits:Sub.step'",
        ),
        # A class of C code: no method to name at all.
        (
            ["targets", "functools:partial"],
            "'functools:partial': partial is a class whose methods are all C code: nothing in it can be "
            "patched",
        ),
        (
            ["run", "-r", "functools:partial:x", "prog.py"],
            "target 'functools:partial:x': partial is a class whose methods are all C code: nothing in it "
            "can be patched",
        ),
    ],
)
def test_a_class_without_methods_of_its_own_gets_one_it_has_or_none(project, args, said):
    (project / "inherits.py").write_text(
        "class Base:\n    def step(self, a):\n        y = a\n        return y\n\nclass Sub(Base):\n    pass\n"
    )
    assert one_clear_line(cli(*args, cwd=project)) == f"bcrecord: {said}"


@pytest.mark.parametrize(
    ("args", "usage", "complaint"),
    [
        (["targets", "json:dumps", "--bogus"], "usage: bcrecord targets", "unrecognized arguments: --bogus"),
        (["view", "--bogus", "x"], "usage: bcrecord view", "unrecognized arguments: --bogus"),
        (
            ["run", "-r", "m:f:x", "-c", "print(1)"],
            "usage: bcrecord run --record TARGET",
            "unrecognized arguments: -c "
            "(bcrecord run runs a script or -m module: save the -c code as a script)",
        ),
    ],
)
def test_unknown_options_get_their_command_s_usage(capsys, args, usage, complaint):
    from bcrecord.cli import main

    with pytest.raises(SystemExit) as ended:
        main(args)
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert err.startswith(usage) and err.rstrip().endswith(complaint), err


def test_view_table_of_pickled_records(project, tmp_path):
    out = tmp_path / "records"
    assert cli("run", "-r", "helper:twice:y", "-o", out, "prog.py", cwd=project).returncode == 0
    result = cli("view", out, "--no-plots")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].split() == ["key", "steps", "shape", "dtype", "min", "mean", "max"]
    assert result.stdout.splitlines()[1].split() == ["helper:twice:y@0", "6", "-", "int", "0", "5", "10"]
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        without = cli("view", out)
        assert "pictures need matplotlib" in one_clear_line(without)
        assert without.stdout.startswith("key")  # the table came first
        assert not (out / "plots").exists()


def test_view_never_takes_the_recorded_program_s_main_for_its_own(tmp_path):
    # A recorded function of the program named 'main' loaded as bcrecord.cli.main, which
    # 'python -m bcrecord' holds in its __main__: view called it a function.
    program = tmp_path / "prog.py"
    program.write_text("def main():\n    me = main\n    return 0\n\nmain()\n")
    out = tmp_path / "records"
    assert cli("run", "-r", "__main__:main:me", "-o", out, program, cwd=tmp_path).returncode == 0
    row = ["__main__:main:me@0", "1", "-", "main", "(not", "importable)", "-", "-", "-"]
    result = cli("view", out, "--no-plots")
    assert result.returncode == 0 and result.stdout.splitlines()[1].split() == row, result.stderr
    # The installed command, a script holding its entry point ('_console' here, as pip writes it).
    command = tmp_path / "bcrecord"
    command.write_text("import sys\nfrom bcrecord.cli import _console\nsys.exit(_console())\n")
    result = subprocess.run([sys.executable, command, "view", out, "--no-plots"], **RUN)
    assert result.returncode == 0 and result.stdout.splitlines()[1].split() == row, result.stderr


def test_view_writes_a_key_the_terminal_cannot_encode_escaped(tmp_path):
    import bcrecord

    bcrecord.save({"m:f:größe@0": [1, 2]}, tmp_path / "records", step=0)
    result = subprocess.run(
        [sys.executable, "-m", "bcrecord", "view", str(tmp_path / "records"), "--no-plots"],
        env={**_env(), "PYTHONIOENCODING": "ascii"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1].split()[0] == "m:f:gr\\xf6\\xdfe@0"


def test_targets_and_show_of_a_function_defined_inside_another_say_why_not(project):
    # "<function outer at 0x...> has no attribute 'inner'", where bcrecord run says why.
    (project / "nested.py").write_text("def outer():\n    def inner(v):\n        u = v\n        return u\n")
    for args in (("targets", "nested:outer.inner"), ("show", "nested:outer.inner", "u")):
        line = one_clear_line(cli(*args, cwd=project))
        assert line == (
            "bcrecord: 'nested:outer.inner': inner is a function defined inside outer, made anew by each "
            "call, out of the module's reach: it cannot be a target"
        )


@pytest.mark.parametrize(
    "path, words",
    [
        (
            "tables:ROWS",
            "bcrecord: 'tables:ROWS': [0, 1, 2, 3, 4, 5, ...], a list: only Python functions can be patched",
        ),
        ("tables:ROWS.f", "'tables:ROWS.f': [0, 1, 2, 3, 4, 5, ...] has no attribute 'f'"),
        ("tables:net", "this Net instance is a callable Net object"),
        ("tables:net.fc.f", "'tables:net.fc.f': this Linear instance has no attribute 'f'"),
    ],
)
def test_targets_shows_a_module_level_value_short(project, path, words):
    # The message held the value's whole repr: every item of a table, a model's lines.
    (project / "tables.py").write_text(
        "class Linear:\n    def __repr__(self):\n        return 'Linear(\\n  2, 3\\n)'\n\n"
        "class Net:\n    fc = Linear()\n\n    def __call__(self, x):\n        return x\n\n"
        "    def __repr__(self):\n        return 'Net(\\n  (fc): Linear()\\n)'\n\n"
        "ROWS = list(range(100_000))\nnet = Net()\n"
    )
    line = one_clear_line(cli("targets", path, cwd=project))
    assert words in line and len(line) < 200, line


def test_targets_and_show_of_a_module_level_value_name_its_path(project):
    # As `bcrecord run` does, and as they do of a path that does not resolve: the value alone
    # did not say which path gave it.
    (project / "values.py").write_text("value = 5\ncode = (lambda: 1).__code__\n")
    for args in (("targets", "values:value"), ("show", "values:value", "x")):
        line = one_clear_line(cli(*args, cwd=project))
        assert line == "bcrecord: 'values:value': 5, an int: only Python functions can be patched"
    line = one_clear_line(cli("show", "values:code", "return", cwd=project))
    assert line == (
        "bcrecord: 'values:code' is a code object: show patches a function ('bcrecord targets "
        "values:code' lists what a code object holds)"
    )


def test_targets_of_a_module_that_raises_on_import_is_one_clear_line(project):
    (project / "broken.py").write_text("ratio = 1 / 0\n\ndef f():\n    return ratio\n")
    line = one_clear_line(cli("targets", "broken:f", cwd=project))
    assert "importing module 'broken' raised ZeroDivisionError: division by zero" in line


@pytest.mark.parametrize(
    "top, said",
    [
        ("import sys\nsys.exit(3)\n", "raised SystemExit: 3"),
        ("import sys\nsys.exit(0)\n", "raised SystemExit: 0"),
        ("import sys\nsys.exit()\n", "raised SystemExit"),
        # A script that parses its arguments at import: it sees bcrecord's.
        ("import argparse\nargparse.ArgumentParser().parse_args()\n", "raised SystemExit: 2"),
    ],
)
def test_targets_and_show_of_a_module_that_exits_on_import_is_one_clear_line(project, top, said):
    (project / "exits.py").write_text(top + "\ndef f(x):\n    y = x\n    return y\n")
    for args in (("targets", "exits:f"), ("show", "exits:f", "y")):
        result = cli(*args, cwd=project)
        assert result.returncode == 2 and "Traceback" not in result.stderr, result
        # After whatever the module printed itself (argparse's usage and complaint).
        assert result.stderr.strip().splitlines()[-1].startswith(f"bcrecord: importing module 'exits' {said}")
        assert result.stdout == ""


def test_targets_and_show_write_a_local_the_terminal_cannot_encode_escaped(tmp_path):
    # Under PYTHONIOENCODING=ascii both ended in a UnicodeEncodeError traceback (view escaped it).
    (tmp_path / "wide.py").write_text("def f(x):\n    größe = x * 2\n    return größe\n", encoding="utf-8")
    ascii_env = {"PYTHONIOENCODING": "ascii"}
    listed = cli("targets", "wide:f", cwd=tmp_path, env=ascii_env)
    assert listed.returncode == 0, listed.stderr
    line = "2:4" if sys.version_info >= (3, 11) else "2"  # (3.10's code has no columns)
    assert listed.stdout.splitlines()[2].split() == ["local", "gr\\xf6\\xdfe", "0", line, "gr\\xf6\\xdfe@0"]
    shown = cli("show", "wide:f", "größe", cwd=tmp_path, env=ascii_env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0] == "f: 1 probe(s): show:f:gr\\xf6\\xdfe@0"


def test_the_targets_table_stays_aligned_on_a_terminal_that_writes_a_local_escaped(tmp_path):
    # Measured as '日本' (four columns), the local printed as '\\u65e5\\u672c' (twelve) pushed its
    # row's next columns eight further than the rest.
    (tmp_path / "wide.py").write_text("def f(x):\n    日本 = x * 2\n    return 日本\n", encoding="utf-8")
    listed = cli("targets", "wide:f", cwd=tmp_path, env={"PYTHONIOENCODING": "ascii"})
    assert listed.returncode == 0, listed.stderr
    line = "2:4" if sys.version_info >= (3, 11) else "2"  # (3.10's code has no columns)
    assert listed.stdout.splitlines()[1:3] == [
        "kind      target        index  line  spec",
        f"local     \\u65e5\\u672c  0      {line:<4}  \\u65e5\\u672c@0",
    ]


@pytest.mark.parametrize("encoding", ["ascii", "utf-8"])
def test_show_keeps_its_right_column_in_line_for_a_wide_or_escaped_local(tmp_path, encoding):
    # The left column was padded by code points: '日本' (four terminal columns) pushed its rows'
    # patched side two columns right; written '\\u65e5\\u672c' under ASCII (twelve), ten.
    (tmp_path / "wide.py").write_text("def f(x):\n    日本 = x * 2\n    return 日本\n", encoding="utf-8")
    shown = cli("show", "wide:f", "日本", cwd=tmp_path, env={"PYTHONIOENCODING": encoding})
    assert shown.returncode == 0, shown.stderr

    def columns(text):
        return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)

    lines = shown.stdout.splitlines()
    header = lines[2].index("patched")  # where the right column starts
    stores = [line for line in lines if line.count("STORE_FAST") == 2]
    assert len(stores) == 1 and ("\\u65e5\\u672c" in stores[0]) == (encoding == "ascii")
    assert columns(stores[0][: stores[0].rindex("2 STORE_FAST")]) == header + len("    ")


def test_view_of_a_damaged_index_or_a_file_is_one_clear_line(project, tmp_path):
    out = tmp_path / "records"
    assert cli("run", "-r", "helper:twice:y", "-o", out, "prog.py", cwd=project).returncode == 0
    with open(out / "index.jsonl", "a") as journal:
        journal.write('{"entries": [{"key": "k", "step": 0}]}\n')
    line = one_clear_line(cli("view", out, "--no-plots"))
    assert line == f"bcrecord: cannot read {out / 'index.jsonl'}: save 2 is damaged (entry 1 has no 'file')"
    (tmp_path / "afile").write_text("")
    assert one_clear_line(cli("view", "afile", cwd=tmp_path)) == "bcrecord: 'afile' is not a directory"


def test_show_keys_a_method_by_the_name_it_is_reached_by(project):
    (project / "aliased.py").write_text(
        "class C:\n    def _impl(self, x):\n        y = x + 1\n        return y\n\n    forward = _impl\n"
    )
    result = cli("show", "aliased:C.forward", "y", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "C._impl: 1 probe(s): show:forward:y@0"  # as run keys it


def test_resolve_path_finds_the_caller_s_own_main_module(monkeypatch):
    import sys

    from bcrecord.cli import resolve_path

    def step(v):  # a notebook's or a script's own function
        return v

    monkeypatch.setattr(sys.modules["__main__"], "step", step, raising=False)
    assert resolve_path("__main__:step")[1] is step  # only the commands refuse '__main__'


def test_targets_imports_a_module_that_asks_about_stdout_also_without_a_stderr(project):
    (project / "asks.py").write_text(
        "import sys\n\nCOLOR = sys.stdout.isatty()\n\ndef f(x):\n    y = x\n    return y\n"
    )
    command = f"{shlex.quote(sys.executable)} -m bcrecord targets asks:f --json 2>&-"
    result = subprocess.run(["sh", "-c", command], cwd=project, **RUN)
    assert result.returncode == 0 and json.loads(result.stdout)["function"] == "f"


# --- properties: any path given to `bcrecord targets/show` resolves or is a BcrecordError ---


# (modules safe to import, and missing ones: an arbitrary name could be 'antigravity')
_MODULES = st.sampled_from(
    ["json", "json.decoder", "bcrecord.specs", "", " json ", "json.", ".json", "no_such_q"]
)
_ATTRIBUTES = st.one_of(
    TYPED, st.sampled_from(["dumps", "JSONDecoder.decode", "JSONDecoder", "Local.__init__"])
)


@SETTINGS
@given(_MODULES, st.sampled_from([":", "", "::", " : ", "\uff1a"]), _ATTRIBUTES)
def test_property_any_path_resolves_or_is_an_error_that_names_it(module, separator, attribute):
    path = _stripped(f"{module}{separator}{attribute}")
    try:
        _, found = _resolved(path)
    except bcrecord.BcrecordError as error:
        assert str(error)
    else:
        assert callable(found) or isinstance(found, property)
