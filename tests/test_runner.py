"""``bcrecord run`` (:mod:`bcrecord.runner`) on pure-Python programs, through subprocesses.

Output, arguments and exit status pass through; records are saved and load back;
every N-th value; flushing when the program fails; ``-m``; modules imported later;
threads and unpicklable values; bad input stops the run before the program starts.
"""

import ast
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

import bcrecord
from bcrecord.runner import RunError, parse_target
from bcrecord.specs import Local, Return

from .commands import _env, cli, one_clear_line, plain
from .forking import fork_while_held
from .typed_text import CHAINS, NAMES, SETTINGS, TYPED, specs_and_short_forms


def test_parse_target_splits_module_path_and_spec():
    target = parse_target("pkg.mod:Model.forward:x@[0,2]")
    assert (target.module, target.path, target.qualname) == ("pkg.mod", ("Model", "forward"), "Model.forward")
    assert target.spec == Local("x", (0, 2))
    assert parse_target("m:f:return").spec == Return()


@pytest.mark.parametrize(
    "text, words",
    [
        ("m:f", "needs three parts"),
        # The module left out: the script's own class, the spec given.
        (
            "Net.forward:hidden",
            "'__main__:Net.forward:hidden' (spec 'hidden' of Net.forward, defined in the script)",
        ),
        (
            "__main__:step",
            "needs three parts, 'package.module:Class.method:SPEC': '__main__:step:return' (function step,",
        ),
        (
            "Net.forward:out@1",
            "'package.module:Class.method:SPEC': '__main__:Net.forward:out@1' (spec 'out@1'",
        ),
        (":f:x", "bad target ':f:x': expected 'package.module:Class.method:SPEC'"),
        ("m::x", "bad target 'm::x'"),
        ("m:f:x@one", "bad index in 'x@one'"),
        # A script named by its file: its functions are __main__'s (said: 'must be dotted Python names').
        (
            "./my-train.py:step:loss",
            "'./my-train.py' is no module's dotted name; a function of the program itself is "
            "'__main__:step:loss'",
        ),
        ("m:f-g:x", "'f-g' must be a dotted Python name (Class.method)"),
    ],
)
def test_parse_target_bad_input(text, words):
    with pytest.raises(RunError) as caught:
        parse_target(text)
    assert words in str(caught.value)


@pytest.mark.parametrize(
    "text, offered",
    [
        # A script named by its file, a spec that is several: no '__main__:...' that is itself refused.
        ("./train.py:loss", []),
        ("my-train:loss", []),
        ("m:f x", []),
        ("__main__:./f", []),
        ("Net.forward:out@1", ["'__main__:Net.forward:out@1'"]),
    ],
)
def test_a_two_part_target_is_offered_only_three_part_targets_that_parse(text, offered):
    # './train.py:loss' was offered '__main__:./train.py:loss', which parse_target refuses
    # ("'./train.py' must be a dotted Python name"); so were '__main__:m:f x' and '__main__:./f:return'.
    with pytest.raises(RunError) as caught:
        parse_target(text)
    guesses = re.findall(r"'([^']*)' \(", str(caught.value))
    assert [f"'{guess}'" for guess in guesses] == offered
    for guess in guesses:
        assert parse_target(guess).text == guess
    if not offered:
        assert str(caught.value) == (
            f"target {text!r} needs three parts, 'package.module:Class.method:SPEC', e.g. 'json:dumps:return'"
        )


def test_a_two_part_target_whose_spec_is_a_keyword_is_offered_no_function_named_by_it():
    # 'json.dumps:return' was offered 'json.dumps:return:return' (function return of module
    # json.dumps), a function no module can hold; 'json:class' only 'json:class:return'.
    with pytest.raises(RunError) as caught:
        parse_target("json.dumps:return")
    assert str(caught.value) == (
        "target 'json.dumps:return' needs three parts, 'package.module:Class.method:SPEC': "
        "'json:dumps:return' (function dumps of module json) or '__main__:json.dumps:return' "
        "(spec 'return' of json.dumps, defined in the script)"
    )
    with pytest.raises(RunError) as caught:
        parse_target("json:class")
    assert str(caught.value) == (
        "target 'json:class' needs three parts, 'package.module:Class.method:SPEC', e.g. 'json:dumps:return'"
    )


def test_run_passes_output_arguments_and_exit_status_through(project):
    expected = plain("prog.py", "3", "--every", "x", cwd=project)
    assert expected.returncode == 3
    result = cli(
        "run",
        "-r",
        "__main__:accumulate:acc",
        "-r",
        "helper:twice:y",
        "prog.py",
        "3",
        "--every",
        "x",
        cwd=project,
    )
    assert result.returncode == 3, result.stderr
    assert result.stdout == expected.stdout
    assert "argv ['3', '--every', 'x']" in result.stdout
    assert "tracing False" in result.stdout  # the trace that patches __main__ is gone by then
    assert result.stderr.startswith(expected.stderr)
    summary = result.stderr[len(expected.stderr) :]
    assert "__main__:accumulate:acc@1  15" in summary  # 0+1+...+5 loop iterations
    assert "helper:twice:y@0" in summary


def test_run_saves_records_that_load_back(project, tmp_path):
    out = tmp_path / "records"
    result = cli(
        "run",
        "--record",
        "prog:accumulate:return",
        "--record",
        "helper:Scaler.scale:out",
        "--save-dir",
        out,
        "prog.py",
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    assert f"saved 18 value(s) of 3 key(s) to {out}" in result.stderr
    loaded = bcrecord.load(out)
    assert loaded["__main__:accumulate:return"] == [0, 0, 1, 3, 6, 10]
    assert loaded.steps("__main__:accumulate:return") == [0, 1, 2, 3, 4, 5]
    assert loaded["Scaler:scale:out@0"] == [3 * k for k in range(6)]
    assert loaded["Scaler:scale:out@1"] == [3 * k + 1 for k in range(6)]
    first_save = json.loads((out / "index.jsonl").read_text().splitlines()[0])
    assert {"key", "step", "shape", "dtype", "device", "bytes", "time"} <= set(first_save["entries"][0])


def test_the_summary_of_a_key_whose_copies_all_failed_says_so(tmp_path):
    import io
    import warnings

    from bcrecord.runner import run

    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            class NoClone:
                def clone(self):
                    raise RuntimeError("no clone today")
            def step(i):
                odd = NoClone()
                return i
            for i in range(5):
                step(i)
            """
        )
    )
    err = io.StringIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run(["__main__:step:odd"], str(script), stderr=err) == 0
    assert [str(w.message).count("no clone today") for w in caught] == [1]  # warned once
    line = err.getvalue().splitlines()[-1].split()
    # Fired 5 times, each copy failed (said above: "5 value(s) not recorded"): no value, not None.
    assert line == ["__main__:step:odd@0", "0", "-", "(copy", "failed)"]
    assert "__main__:step:odd@0: 5 value(s) not recorded, their copy failed" in err.getvalue()


@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_the_summary_stays_aligned_for_a_key_of_wide_characters(project, encoding):
    # Padded by code points: '日本' takes four columns (twelve as '\u65e5\u672c' on an ASCII terminal).
    program = "def f(x):\n    日本 = x * 2\n    return 日本\nf(21)\n"
    (project / "wide.py").write_text(program, encoding="utf-8")
    result = cli("run", "-r", "__main__:f:日本", "wide.py", cwd=project, env={"PYTHONIOENCODING": encoding})
    key = "__main__:f:日本@0" if encoding == "utf-8" else "__main__:f:\\u65e5\\u672c@0"
    pad = " " * (len(key) - len("key") + (2 if encoding == "utf-8" else 0))
    assert result.stderr.splitlines()[1:] == [f"  key{pad}  values  last value", f"  {key}  1       42"]


def test_a_summary_that_saved_nothing_names_a_save_dir_given_after_the_program(tmp_path):
    # "bcrecord run -r T train.py -o out": -o is train.py's own (it may have one), so it runs as
    # given; the summary says why nothing was saved rather than only "no --save-dir".
    import io

    from bcrecord.runner import run

    script = tmp_path / "train.py"
    script.write_text("import sys\ndef step(v):\n    w = v * 2\n    return w\nstep(len(sys.argv))\n")
    err = io.StringIO()
    assert run(["__main__:step:w"], str(script), ["--epochs", "2", "-o", "out"], stderr=err) == 0
    assert err.getvalue().splitlines() == [
        "bcrecord: recorded ('-o out' came after the program, which took it as its own, "
        "so nothing was saved):",
        "  key                values  last value",
        "  __main__:step:w@0  1       10",
    ]
    assert not (tmp_path / "out").exists()


def test_run_refuses_an_empty_save_dir_and_saves_nothing(project):
    # -o "$OUT" with OUT unset: not the working directory
    result = cli("run", "-r", "helper:twice:y", "-o", "", "prog.py", cwd=project)
    assert "the records directory is an empty string" in one_clear_line(result)
    assert not (project / "index.json").exists() and not (project / "records").exists()


def test_a_second_run_into_a_save_dir_says_it_adds_to_what_is_there(project, tmp_path):
    out = tmp_path / "twice"
    first = cli("run", "-r", "helper:twice:y", "-o", out, "prog.py", "2", cwd=project)
    assert first.returncode == 2 and "saved before" not in first.stderr
    second = cli("run", "-r", "helper:twice:y", "-o", out, "prog.py", "2", cwd=project)
    saved = len(bcrecord.load(out)["helper:twice:y@0"])
    assert second.stderr.splitlines()[0] == (
        f"bcrecord: {out} holds {saved // 2} value(s) saved before; this run's are added to them "
        "(their steps start again at 0)"
    )
    quiet = cli("run", "-q", "-r", "helper:twice:y", "-o", out, "prog.py", "2", cwd=project)
    assert "saved before" not in quiet.stderr  # as -q's help says


def test_a_second_run_without_a_stderr_leaves_the_program_s_stdout_as_it_is(project, tmp_path):
    import subprocess

    from .commands import _env

    out = tmp_path / "twice"
    env = _env()
    alone = f"{shlex.quote(sys.executable)} prog.py 2 2>&-"  # (its own stderr lines on stdout then)
    expected = subprocess.run(
        ["sh", "-c", alone], cwd=project, env=env, capture_output=True, text=True
    ).stdout
    run = f"{shlex.quote(sys.executable)} -m bcrecord run -r helper:twice:y -o {shlex.quote(str(out))}"
    for _ in range(2):  # the second finds values saved before: said on no stderr, not on stdout
        result = subprocess.run(
            ["sh", "-c", run + " prog.py 2 2>&-"], cwd=project, env=env, capture_output=True, text=True
        )
        assert result.stdout == expected
    assert len(bcrecord.load(out)["helper:twice:y@0"]) > 0


@pytest.mark.parametrize(
    "options, said",
    [
        ({"quiet": "yes"}, "quiet is True or False, got 'yes'"),
        ({"module": None}, "module is True or False, got None"),
        ({"linger": "no"}, "linger is True or False, got 'no'"),
        ({"every": True, "save_dir": "out"}, "--every must be a positive integer, got True"),
    ],
)
def test_run_refuses_flags_that_are_no_bools_before_the_program_starts(tmp_path, options, said):
    # linger='no' lingered; every=True saved every value as every=1 does.
    from bcrecord.runner import run

    script = tmp_path / "prog.py"
    script.write_text("open('ran', 'w').close()\n")
    with pytest.raises(RunError, match=f"^{re.escape(said)}$"):
        run(["__main__:f:x"], str(script), **options)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prog.py"]


def test_run_every_nth_value(project, tmp_path):
    out = tmp_path / "every"
    result = cli("run", "-r", "helper:twice:y", "-o", out, "--every", "4", "prog.py", cwd=project)
    assert result.returncode == 0, result.stderr
    loaded = bcrecord.load(out)
    assert loaded["helper:twice:y@0"] == [0, 8]
    assert loaded.steps("helper:twice:y@0") == [0, 4]


@pytest.mark.parametrize("how, status", [("raise", 1), ("message", 1), ("7", 7)])
def test_run_flushes_when_the_program_fails(project, tmp_path, how, status):
    out = tmp_path / how
    expected = plain("prog.py", how, cwd=project)
    result = cli("run", "-r", "helper:twice:y", "-o", out, "prog.py", how, cwd=project)
    assert result.returncode == expected.returncode == status
    assert result.stdout == expected.stdout
    assert bcrecord.load(out)["helper:twice:y@0"] == [0, 2, 4, 6, 8, 10]
    if how == "raise":
        traceback = result.stderr.split("Traceback (most recent call last):\n", 1)[1]
        assert "bcrecord" not in traceback.split("ValueError")[0]  # no frames of bcrecord or runpy
        assert "runpy" not in traceback
        assert 'prog.py", line' in traceback and "ValueError: the program failed" in traceback
    if how == "message":
        assert "fatal: stopped" in result.stderr


def test_run_module_with_dash_m(project):
    expected = plain("-m", "pkg.tool", "a", "-r", "b", cwd=project)
    result = cli("run", "-r", "pkg.tool:main:joined", "-m", "pkg.tool", "a", "-r", "b", cwd=project)
    assert result.returncode == expected.returncode == 3
    assert result.stdout == expected.stdout == "A -R B\n"
    assert "__main__:main:joined@0  1" in result.stderr


def test_run_module_s_parent_package_sees_the_argv_python_gives_it(project):
    (project / "argv_pkg").mkdir()
    (project / "argv_pkg" / "__init__.py").write_text("import sys\nprint(sys.argv)\n")
    (project / "argv_pkg" / "tool.py").write_text("def x():\n    y = 1\n    return y\n\nprint('tool', x())\n")
    expected = plain("-m", "argv_pkg.tool", "a", "b", cwd=project)
    result = cli("run", "-r", "argv_pkg.tool:x:y", "-m", "argv_pkg.tool", "a", "b", cwd=project)
    assert result.stdout == expected.stdout == "['-m', 'a', 'b']\ntool 1\n", result.stderr


@pytest.mark.parametrize(
    "init, said",
    [
        ("raise RuntimeError('no config')", "RuntimeError: no config"),
        ("import no_such_dependency_xyz", "ModuleNotFoundError: No module named 'no_such_dependency_xyz'"),
    ],
)
def test_run_module_whose_parent_package_raises_shows_its_traceback_as_python_does(project, init, said):
    # The package's own error came out of bcrecord's frames (cli.py, runner.py's _program).
    (project / "failing").mkdir()
    (project / "failing" / "__init__.py").write_text(f"{init}\n")
    (project / "failing" / "tool.py").write_text("def x():\n    y = 1\n    return y\n")
    expected = plain("-m", "failing.tool", cwd=project)
    result = cli("run", "-r", "failing.tool:x:y", "-m", "failing.tool", cwd=project)
    assert result.returncode == expected.returncode == 1
    assert expected.stderr.endswith(said + "\n") and result.stderr.endswith(said + "\n")
    init_file = project / "failing" / "__init__.py"
    assert result.stderr == (
        f'Traceback (most recent call last):\n  File "{init_file}", line 1, in <module>\n    {init}\n{said}\n'
    )


def test_run_module_named_as_a_file_says_to_drop_dash_m(project):
    result = cli("run", "-r", "pkg.tool:main:joined", "-m", "pkg/tool.py", cwd=project)
    assert "(a script? drop -m: bcrecord run ... pkg/tool.py)" in one_clear_line(result)


def test_run_module_after_combined_short_flags_gets_its_own_arguments(project, tmp_path):
    # '-qm MODULE' is '-q -m MODULE', as python and argparse read it: what follows is the
    # program's (its '-o' included), not bcrecord's.
    expected = plain("-m", "pkg.tool", "-o", "x", cwd=project)
    out = tmp_path / "out"
    result = cli("run", "-r", "pkg.tool:main:joined", f"-qo{out}", "-qm", "pkg.tool", "-o", "x", cwd=project)
    assert result.stdout == expected.stdout == "-O X\n" and result.returncode == expected.returncode
    assert bcrecord.load(out)["__main__:main:joined@0"] == ["-O X"]
    assert result.stderr == ""  # -q


def test_run_module_keeps_the_program_s_own_double_dash(project):
    # After -m MODULE everything is the program's, "--" included (as with python -m);
    # before a script, "--" only ends bcrecord's options.
    expected = plain("-m", "pkg.tool", "--", "a", cwd=project)
    result = cli("run", "-r", "pkg.tool:main:joined", "-m", "pkg.tool", "--", "a", cwd=project)
    assert result.stdout == expected.stdout == "-- A\n"
    script = cli("run", "-r", "__main__:main:joined", "--", "pkg/tool.py", "--", "a", cwd=project)
    assert script.stdout == plain("pkg/tool.py", "--", "a", cwd=project).stdout == "-- A\n"


def test_run_target_in_a_module_imported_later(project):
    """json.decoder is not imported until the program imports json."""
    (project / "usejson.py").write_text("import json\nprint(json.loads('[1, 2]'))\n")
    result = cli("run", "-r", "json.decoder:JSONDecoder.decode:obj", "usejson.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[1, 2]\n"
    assert "JSONDecoder:decode:obj@0" in result.stderr


def test_run_of_a_target_without_its_function_never_guesses_a_module_is_one(project):
    # It guessed "'pkg:tool:main' (function tool of module pkg)": pkg.tool is a module.
    line = one_clear_line(cli("run", "-r", "pkg.tool:main", "prog.py", cwd=project))
    assert "pkg:tool" not in line, line
    assert "'pkg.tool:main:return' (function main of module pkg.tool;" in line, line


@pytest.mark.parametrize(
    "args, words",
    [
        (["-r", "helper:twice:nosuch", "prog.py"], "no assignment to a local named 'nosuch'"),
        (["-r", "helper:nope:x", "prog.py"], "module helper never defines 'nope'"),
        (["-r", "__main__:nope:x", "prog.py"], "prog.py never defines 'nope'"),
        # A misspelt function or class, in the program or in a module: the names it does define.
        (
            ["-r", "__main__:acumulate:acc", "prog.py"],
            "never defines 'acumulate'; did you mean 'accumulate'?",
        ),
        (["-r", "helper:scaler.scale:out", "prog.py"], "never defines 'scaler'; did you mean 'Scaler'?"),
        (["-r", "helper:twice:y@3", "prog.py"], "there is no index 3"),
        (["-r", "helper:twice", "prog.py"], "needs three parts"),
        # Two specs in one target: one --record each.
        (
            ["-r", "helper:Scaler.scale:out@[0, 1], self.factor", "prog.py"],
            "(one spec a target: --record 'helper:Scaler.scale:out@[0, 1]' "
            "--record 'helper:Scaler.scale:self.factor')",
        ),
        # The module's name run on into its class with a dot: the target meant comes first.
        (
            ["-r", "helper.Scaler.scale:out", "prog.py"],
            "needs three parts, 'package.module:Class.method:SPEC': 'helper:Scaler.scale:out' "
            "(function Scaler.scale of module helper) or '__main__:helper.Scaler.scale:out'",
        ),
        (["-r", "helper:Scaler.scael:out", "prog.py"], "has no attribute 'scael'; did you mean 'scale'?"),
        (
            ["-r", "prog.py:accumulate:acc", "prog.py"],
            "(the script's own accumulate: '__main__:accumulate:...')",
        ),
        (["-r", "helper:twice:y", "-n", "0", "prog.py"], "--every must be a positive integer"),
        (
            ["-r", "helper:twice:y", "-n", "3", "prog.py"],
            "--every 3 chooses the values to save: give --save-dir",
        ),
        (["-r", "no_such_module_xyz:f:x", "prog.py"], "no module named 'no_such_module_xyz'"),
        (["-r", "pkg.no_such:f:x", "prog.py"], "no module named 'pkg.no_such'"),
        (["-r", "helper:twice:y", "no_such_script.py"], "no such file: 'no_such_script.py'"),
        # Misspelt modules and scripts: the close names there are.
        (["-r", "helpr:twice:y", "prog.py"], "its folder); did you mean 'helper'"),
        (["-r", "pkg.tol:main:x", "prog.py"], "no module named 'pkg.tol' on sys.path"),
        (["-r", "pkg.tol:main:x", "prog.py"], "; did you mean 'pkg.tool'?"),
        (["-r", "helper:twice:y", "prg.py"], "no such file: 'prg.py'; did you mean 'prog.py'"),
        (["-r", "helper:twice:y", "-m", "pkg.tol"], "no module named 'pkg.tol'; did you mean 'pkg.tool'?"),
        # A misspelt package: the close names of the package (there was no hint at all).
        (["-r", "pkgg.tool:main:x", "prog.py"], "; no module named 'pkgg' either; did you mean 'pkg'"),
        (["-r", "helper:twice:y", "-m", "pkgg.tool"], "No module named 'pkgg'; did you mean 'pkg'"),
        (["-r", "helper:twice:y", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["-r", "helper:twice:y"], "no program given"),
    ],
)
def test_run_bad_input(project, args, words):
    result = cli("run", *args, cwd=project)
    assert words in one_clear_line(result)
    assert result.stdout == ""  # the program never started


STDIN_PROGRAM = textwrap.dedent(
    """
    import sys
    import helper

    class Point:
        def __init__(self, x):
            self.x = x

    def accumulate(n):
        acc = 0
        for i in range(n):
            acc = acc + i
        return acc

    def make(x):
        point = Point(x)
        return point

    print(accumulate(4), helper.twice(5), make(7).x, sys.argv, repr(sys.path[0]), __file__, __name__)
    """
)


def test_run_reads_the_program_from_stdin_as_python_dash_does(project, tmp_path):
    out = tmp_path / "records"
    expected = plain("-", "a", "-m", "b", cwd=project, input=STDIN_PROGRAM)
    result = cli(
        *("run", "-r", "__main__:accumulate:acc", "-r", "helper:twice:y", "-r", "__main__:make:point"),
        *("-o", out, "-", "a", "-m", "b"),
        cwd=project,
        input=STDIN_PROGRAM,
    )
    assert result.returncode == expected.returncode == 0, result.stderr
    assert result.stdout == expected.stdout == "6 10 7 ['-', 'a', '-m', 'b'] '' <stdin> __main__\n"
    loaded = bcrecord.load(out)
    assert loaded["__main__:accumulate:acc@1"] == [0, 1, 3, 6]
    assert loaded["helper:twice:y@0"] == [10]
    (point,) = loaded["__main__:make:point@0"]  # the program's class: its saved state
    assert point.state == {"x": 7}


@pytest.mark.parametrize(
    "target, words",
    [
        ("__main__:nope:x", "target '__main__:nope:x': the program on stdin never defines 'nope'"),
        ("__main__:accumulate:nosuch", "no assignment to a local named 'nosuch'"),
    ],
)
def test_run_checks_a_stdin_program_s_targets_before_it_starts(project, target, words):
    result = cli("run", "-r", target, "-", cwd=project, input=STDIN_PROGRAM)
    assert words in one_clear_line(result)
    assert result.stdout == ""


def test_run_shows_a_syntax_error_of_a_stdin_program_as_python_does(project):
    plain_run = plain("-", cwd=project, input="def f(v):\n    x = = v\n")
    result = cli("run", "-r", "__main__:f:x", "-", cwd=project, input="def f(v):\n    x = = v\n")
    assert result.returncode == plain_run.returncode == 1
    assert result.stderr.startswith(plain_run.stderr), result.stderr
    assert "bcrecord: target '__main__:f:x' was never applied: the program does not compile" in result.stderr


PIPED_PROGRAM = (
    "import sys\n\ndef f(v):\n    x = v * 2\n    return x\n\n"
    "print(f(3), f(4), sys.argv, __file__, type(__loader__).__name__, __cached__)\n"
    "raise ValueError('from the pipe')\n"
)


@pytest.mark.skipif(not os.path.exists("/dev/stdin"), reason="needs /dev/stdin")
def test_run_of_a_script_that_is_a_pipe_reads_it_once_and_runs_it(project, tmp_path):
    # `bcrecord run ... <(generate)` or /dev/stdin: bcrecord read the pipe to check the
    # targets, then runpy found it empty: the program did nothing, status 0.
    out = tmp_path / "records"
    expected = plain("/dev/stdin", "a", cwd=project, input=PIPED_PROGRAM)
    result = cli("run", "-r", "__main__:f:x", "-o", out, "/dev/stdin", "a", cwd=project, input=PIPED_PROGRAM)
    assert result.returncode == expected.returncode == 1, result.stderr
    assert result.stdout == expected.stdout == "6 8 ['/dev/stdin', 'a'] /dev/stdin SourceFileLoader None\n"
    assert result.stderr.startswith(expected.stderr), result.stderr  # its traceback, as Python's
    assert 'File "/dev/stdin", line 8, in <module>' in result.stderr
    assert bcrecord.load(out)["__main__:f:x@0"] == [6, 8]
    checked = cli("run", "-r", "__main__:g:x", "/dev/stdin", cwd=project, input=PIPED_PROGRAM)
    assert "target '__main__:g:x': /dev/stdin never defines 'g'" in one_clear_line(checked)


def test_run_shows_a_script_s_compile_time_warning_once_as_python_does(project):
    # bcrecord compiled the script to check its targets, then runpy compiled it again: each
    # SyntaxWarning (3.14's `return` in `finally`, `x is 1`) was shown twice, first without
    # its line of source.
    (project / "warns.py").write_text("def f(v):\n    x = v is 1\n    return x\n\nprint(f(1))\n")
    expected = plain("warns.py", cwd=project)
    result = cli("run", "-r", "__main__:f:x", "warns.py", cwd=project)
    assert result.returncode == expected.returncode == 0, result.stderr
    assert expected.stderr.count("SyntaxWarning") == result.stderr.count("SyntaxWarning") == 1, result.stderr
    assert result.stderr.startswith(expected.stderr)
    checked = cli("run", "-r", "__main__:g:x", "warns.py", cwd=project)
    assert "SyntaxWarning" not in checked.stderr and "never defines 'g'" in one_clear_line(checked)


@pytest.mark.parametrize("no_pyc", ["1", ""])
def test_run_shows_a_target_module_s_compile_time_warning_once_as_python_does(project, no_pyc):
    # The target check compiled the module (loader.get_code): where that wrote no .pyc
    # (PYTHONDONTWRITEBYTECODE, a read-only folder) the import compiled it again, and its
    # SyntaxWarning was shown twice.
    (project / "warnmod.py").write_text("def g(v):\n    z = v is 1\n    return z\n")
    (project / "uses.py").write_text("import warnmod\nprint(warnmod.g(1))\n")
    env = {"PYTHONDONTWRITEBYTECODE": no_pyc}
    result = cli("run", "-r", "warnmod:g:z", "uses.py", cwd=project, env=env)
    assert result.returncode == 0 and result.stdout == "True\n", result.stderr
    assert result.stderr.count("SyntaxWarning") == 1, result.stderr
    assert "warnmod:g:z@0  1       True" in result.stderr
    # Python shows it as the module is first compiled, and never again from its .pyc.
    assert plain("uses.py", cwd=project).stderr.count("SyntaxWarning") == (1 if no_pyc else 0)


def test_run_of_a_compiled_script_checks_and_records_its_targets(project):
    # A .pyc runs as python runs it; its targets were said to be in a program that
    # "does not compile (... null bytes)", and were not checked before it started.
    import py_compile

    (project / "source.py").write_text("def f(v):\n    x = v * 2\n    return x\n\nprint(f(5))\n")
    py_compile.compile(str(project / "source.py"), cfile=str(project / "compiled.pyc"), doraise=True)
    expected = plain("compiled.pyc", cwd=project)
    result = cli("run", "-r", "__main__:f:x", "compiled.pyc", cwd=project)
    assert result.returncode == expected.returncode == 0, result.stderr
    assert result.stdout == expected.stdout == "10\n"
    assert "__main__:f:x@0  1       10" in result.stderr
    checked = cli("run", "-r", "__main__:g:x", "compiled.pyc", cwd=project)
    assert "target '__main__:g:x': compiled.pyc never defines 'g'" in one_clear_line(checked)


def test_run_copy_none_saves_a_value_as_it_is_when_written_as_its_help_says(project, tmp_path):
    (project / "grows.py").write_text(
        "def f(acc, i):\n    acc.append(i)\n    snapshot = acc\n    return snapshot\n"
        "acc = []\nfor i in range(3):\n    f(acc, i)\n"
    )
    for copy, expected in (("clone", [[0], [0, 1], [0, 1, 2]]), ("none", [[0, 1, 2]] * 3)):
        out = tmp_path / copy
        result = cli(
            "run", "-q", "--copy", copy, "-r", "__main__:f:snapshot", "-o", out, "grows.py", cwd=project
        )
        assert result.returncode == 0, result.stderr
        assert bcrecord.load(out)["__main__:f:snapshot@0"] == expected
    assert "a value the program changes in place meanwhile is saved changed" in " ".join(
        cli("run", "--help").stdout.split()
    )


def test_run_refuses_a_package_or_directory_with_nothing_to_run(project):
    (project / "nomain").mkdir()
    (project / "nomain" / "__init__.py").write_text("print('imported')\n")
    (project / "appdir").mkdir()
    package = cli("run", "-r", "helper:twice:y", "-m", "nomain", cwd=project)
    assert "'nomain' is a package with no __main__ module" in one_clear_line(package)
    directory = cli("run", "-r", "helper:twice:y", "appdir", cwd=project)
    assert "'appdir' is a directory with no __main__.py" in one_clear_line(directory)
    assert directory.stdout == ""  # (the package was imported, as `python -m nomain` does)


def test_a_run_that_records_nothing_makes_no_save_dir_and_a_blocked_one_is_refused_first(project):
    # -o names a folder a run that saves nothing leaves unmade (the report says so); a file in
    # its way is still refused before the program runs, not after it.
    (project / "idle.py").write_text("def f(x):\n    y = x\n    return y\nprint('ran')\n")
    out = project / "runs" / "a"
    result = cli("run", "-r", "__main__:f:y", "-o", out, "idle.py", cwd=project)
    assert (result.returncode, result.stdout) == (0, "ran\n")
    assert result.stderr.splitlines()[-1] == f"bcrecord: nothing was saved, and {out} was not made"
    assert not (project / "runs").exists()
    # A program that makes that folder itself is not told bcrecord left it unmade.
    maker = f"import os\ndef f(x):\n    y = x\n    return y\nos.makedirs({str(out)!r})\n"
    (project / "maker.py").write_text(maker)
    made = cli("run", "-r", "__main__:f:y", "-o", out, "maker.py", cwd=project)
    assert made.stderr.splitlines()[-1] == f"bcrecord: nothing was saved to {out}"
    assert list(out.iterdir()) == []
    out.rmdir(), (project / "runs").rmdir()
    (project / "runs").write_text("a file")
    blocked = cli("run", "-r", "__main__:f:y", "-o", out, "idle.py", cwd=project)
    said = f"cannot write records to {out}: {project / 'runs'} is a file, not a folder"
    assert said in one_clear_line(blocked)
    assert blocked.stdout == ""
    saved = cli("run", "-r", "helper:twice:y", "-o", project / "b" / "c", "prog.py", cwd=project)
    assert bcrecord.load(project / "b" / "c")["helper:twice:y@0"] == [0, 2, 4, 6, 8, 10]
    assert "was removed while the program ran" not in saved.stderr


def test_run_unwritable_directory(project):
    blocker = project / "a_file"
    blocker.write_text("not a directory")
    result = cli("run", "-r", "helper:twice:y", "--save-dir", blocker / "records", "prog.py", cwd=project)
    assert f"cannot write records to {blocker / 'records'}" in one_clear_line(result)
    assert result.stdout == ""


def test_run_target_that_fails_when_applied(project):
    """A target that passes the static check but not the real import stops the run, status 2."""
    (project / "dyn.py").write_text("def make():\n    return 1\nbuilt = len\n")
    (project / "usedyn.py").write_text("print('started')\nimport dyn\nprint('not reached')\n")
    result = cli("run", "-r", "dyn:built:x", "usedyn.py", cwd=project)
    assert result.returncode == 2
    assert result.stdout == "started\n"
    assert result.stderr.strip().splitlines() == [
        "bcrecord: target 'dyn:built:x': len is a builtin or C function: it has no bytecode to patch"
    ]


def test_run_records_threads_and_unpicklable_values(project, tmp_path):
    (project / "threads.py").write_text(
        textwrap.dedent(
            """
            import threading
            import helper

            def make(n):
                gen = (i for i in range(n))
                return gen

            workers = [threading.Thread(target=helper.twice, args=(k,)) for k in range(4)]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            print(sum(make(3)))
            """
        )
    )
    out = tmp_path / "records"
    result = cli(
        "run", "-r", "helper:twice:y", "-r", "__main__:make:gen", "-o", out, "threads.py", cwd=project
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "3\n"
    why = "generator cannot be pickled (TypeError: cannot pickle 'generator' object)"
    assert f"__main__:make:gen@0: {why}; saved its repr" in result.stderr
    loaded = bcrecord.load(out)
    assert sorted(loaded["helper:twice:y@0"]) == [0, 2, 4, 6]
    assert loaded["__main__:make:gen@0"][0].startswith("<generator object")


def test_run_s_note_on_values_saved_as_their_repr_counts_them_all_and_says_each_reason(project, tmp_path):
    # It said the first value's reason alone, once per key: a key whose later values were
    # saved as reprs too, for other reasons, read as if one value alone had been.
    (project / "odd.py").write_text(
        textwrap.dedent(
            """
            import threading

            def keep(v):
                x = v
                return x

            for value in [1, (i for i in ""), threading.Lock(), 2, (i for i in "")]:
                keep(value)
            """
        )
    )
    out = tmp_path / "records"
    result = cli("run", "-r", "__main__:keep:x", "-o", out, "odd.py", cwd=project)
    assert result.returncode == 0, result.stderr
    gen = "generator cannot be pickled (TypeError: cannot pickle 'generator' object)"
    lock = "lock cannot be pickled (TypeError: cannot pickle '_thread.lock' object)"
    assert f"bcrecord: __main__:keep:x@0: 3 values saved as their repr: {gen}; {lock}\n" in result.stderr
    saved = bcrecord.load(out)["__main__:keep:x@0"]
    assert [type(v).__name__ for v in saved] == ["int", "str", "str", "int", "str"]


def test_run_saves_values_of_the_program_s_own_classes(project, tmp_path):
    # Pickled while the program's __main__ is at hand; loaded elsewhere (no such class
    # there) as Unimportable with their state, the rest of the records as usual.
    (project / "points.py").write_text(
        textwrap.dedent(
            """
            import collections

            class Point:
                def __init__(self, x):
                    self.x = x

            class Table(dict):
                pass

            Pair = collections.namedtuple("Pair", "a b")

            def make(x):
                point = Point(x)
                table = Table(k=x)
                pair = Pair(x, -x)
                total = x * 2
                return point, total

            print(make(3)[0].x)
            """
        )
    )
    out = tmp_path / "records"
    targets = ["-r", "__main__:make:point", "-r", "__main__:make:total", "-r", "__main__:make:table"]
    targets += ["-r", "__main__:make:pair"]
    result = cli("run", *targets, "-o", out, "points.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "cannot be pickled" not in result.stderr
    loaded = bcrecord.load(out)
    (point,) = loaded["__main__:make:point@0"]
    assert isinstance(point, bcrecord.storage.Unimportable) and point.state == {"x": 3}
    assert repr(point) == "<__main__.Point, not importable here: {'x': 3}>"
    assert loaded["__main__:make:total@0"] == [6]
    (table,) = loaded["__main__:make:table@0"]
    (pair,) = loaded["__main__:make:pair@0"]
    assert table.items == {"k": 3} and pair.args == (3, -3)


def test_run_qualifies_owners_where_two_classes_share_a_name(project):
    for module, factor in (("enc", 2), ("dec", 100)):
        (project / f"{module}.py").write_text(
            f"class Block:\n    def forward(self, x):\n        out = x * {factor}\n        return out\n"
        )
    (project / "both.py").write_text(
        "import enc, dec\nprint(enc.Block().forward(1) + dec.Block().forward(1))\n"
    )
    targets = ["-r", "enc:Block.forward:out", "-r", "dec:Block.forward:out"]
    result = cli("run", *targets, "both.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "102\n", result.stderr
    rows = {line.split()[0]: line.split()[-1] for line in result.stderr.splitlines()[2:]}
    assert rows == {"enc.Block:forward:out@0": "2", "dec.Block:forward:out@0": "100"}


def test_run_records_an_inherited_method_only_on_the_class_named(project):
    (project / "inh.py").write_text(
        "class Base:\n    def forward(self, x):\n        y = x + 1\n        return y\n\n"
        "class Sub(Base):\n    pass\n"
    )
    (project / "useinh.py").write_text("import inh\nprint(inh.Base().forward(100), inh.Sub().forward(1))\n")
    result = cli("run", "-r", "inh:Sub.forward:y", "useinh.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "101 2\n", result.stderr
    rows = [line.split() for line in result.stderr.splitlines()[2:]]
    assert rows == [["Sub:forward:y@0", "1", "2"]]  # the Base() call is not Sub's


def test_run_records_a_property_s_getter(project):
    (project / "prop.py").write_text(
        "class C:\n    @property\n    def p(self):\n        v = 41\n        return v + 1\n"
    )
    (project / "useprop.py").write_text("import prop\nprint(prop.C().p)\n")
    for target in ("prop:C.p:v", "prop:C.p.fget:v"):
        result = cli("run", "-r", target, "useprop.py", cwd=project)
        assert result.returncode == 0 and result.stdout == "42\n", (target, result.stderr)
        assert [line.split() for line in result.stderr.splitlines()[2:]] == [["C:p:v@0", "1", "41"]]


def test_run_targets_and_the_commands_name_functions_and_classes_as_written_in_the_source(project):
    # The compiler stores '\ufb01x' (a ligature) as 'fix': a target written as the source has it
    # was refused ("never defines"), and targets/show said the module had no such attribute.
    (project / "lig.py").write_text(
        "def \ufb01x(a):\n    y = a + 1\n    return y\n\n"
        "class \ufb01C:\n    def m(self):\n        v = 7\n        return v\n"
    )
    (project / "uselig.py").write_text("import lig\nlig.fix(1)\nlig.fiC().m()\n")
    result = cli("run", "-r", "lig:\ufb01x:y", "-r", "lig:\ufb01C.m:v", "uselig.py", cwd=project)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stderr.splitlines()[2:]]
    assert rows == [["lig:fix:y@0", "1", "2"], ["fiC:m:v@0", "1", "7"]]
    listed = cli("targets", "lig:\ufb01C.m", "--json", cwd=project)
    assert listed.returncode == 0 and json.loads(listed.stdout)["function"] == "fiC.m", listed.stderr
    shown = cli("show", "lig:\ufb01x", "y", cwd=project)
    assert shown.returncode == 0 and "show:fix:y@0" in shown.stdout, shown.stderr


def test_run_a_directory_program_finds_its_own_modules(project):
    app = project / "app"
    app.mkdir()
    (app / "__main__.py").write_text(
        "import inner\n\ndef main():\n    z = inner.h(2)\n    print(z)\n\nmain()\n"
    )
    (app / "inner.py").write_text("def h(a):\n    b = a + 1\n    return b\n")
    expected = plain("app", cwd=project)
    result = cli("run", "-r", "inner:h:b", "-r", "__main__:main:z", "app", cwd=project)
    assert result.returncode == expected.returncode == 0, result.stderr
    assert result.stdout == expected.stdout == "3\n"
    rows = sorted(line.split()[0] for line in result.stderr.splitlines()[2:])
    assert rows == ["__main__:main:z@0", "inner:h:b@0"]
    refused = cli("run", "-r", "__main__:nope:x", "app", cwd=project)
    assert "never defines 'nope'" in one_clear_line(refused) and refused.stdout == ""


@pytest.mark.parametrize("main", ["__main__.py", "__main__.pyc"])
def test_run_a_zip_program_checks_its_targets_before_it_starts(project, main):
    # A zip's __main__ was not read: a wrong target was said only at the end ("the program
    # ended before defining nope"), after the program ran; a zip with __main__.pyc (which
    # python runs) was refused as having no __main__.py.
    import py_compile
    import zipfile

    source = project / "zmain.py"
    source.write_text("import inner\n\ndef main():\n    z = inner.h(2)\n    print(z)\n\nmain()\n")
    if main.endswith(".pyc"):
        source = py_compile.compile(str(source), cfile=str(project / "zmain.pyc"), doraise=True)
    with zipfile.ZipFile(project / "app.zip", "w") as archive:
        archive.write(source, main)
        archive.writestr("inner.py", "def h(a):\n    b = a + 1\n    return b\n")
    expected = plain("app.zip", cwd=project)
    result = cli("run", "-r", "inner:h:b", "-r", "__main__:main:z", "app.zip", cwd=project)
    assert result.returncode == expected.returncode == 0, result.stderr
    assert result.stdout == expected.stdout == "3\n"
    rows = sorted(line.split()[0] for line in result.stderr.splitlines()[2:])
    assert rows == ["__main__:main:z@0", "inner:h:b@0"]
    refused = cli("run", "-r", "__main__:nope:x", "app.zip", cwd=project)
    assert "target '__main__:nope:x': app.zip never defines 'nope'" in one_clear_line(refused)
    assert refused.stdout == ""


def test_run_a_directory_program_with_only_a_main_pyc_runs_it_as_python_does(project):
    # It was refused as having no __main__.py; python runs the __main__.pyc.
    import py_compile

    app = project / "pycapp"
    app.mkdir()
    source = project / "pycmain.py"
    source.write_text("def step(x):\n    loss = x * 2\n    return loss\n\nprint(step(3))\n")
    py_compile.compile(str(source), cfile=str(app / "__main__.pyc"), doraise=True)
    expected = plain("pycapp", cwd=project)
    result = cli("run", "-r", "__main__:step:loss", "pycapp", cwd=project)
    assert result.returncode == expected.returncode == 0, result.stderr
    assert result.stdout == expected.stdout == "6\n"
    assert [line.split() for line in result.stderr.splitlines()[2:]] == [["__main__:step:loss@0", "1", "6"]]


def test_run_says_a_pyc_of_another_python_version_has_a_bad_magic_number(project):
    # It was said not to compile: "source code string cannot contain null bytes".
    import importlib.util
    import py_compile

    compiled = py_compile.compile(str(project / "helper.py"), cfile=str(project / "other.pyc"), doraise=True)
    data = bytearray(open(compiled, "rb").read())
    data[:2] = (int.from_bytes(importlib.util.MAGIC_NUMBER[:2], "little") + 1).to_bytes(2, "little")
    open(compiled, "wb").write(bytes(data))
    result = cli("run", "-r", "__main__:twice:y", "other.pyc", cwd=project)
    assert result.returncode != 0
    assert (
        "bcrecord: target '__main__:twice:y' was never applied: the program does not compile "
        "(RuntimeError: Bad magic number in .pyc file (compiled by another Python version))"
    ) in result.stderr


def test_run_targets_functions_the_program_defines_with_exec(project):
    # A function a module defines by exec (or a star import, or through globals()) is in no
    # store of its code: the target was refused before the program ran ("never defines 'gen'").
    (project / "genmod.py").write_text("exec('def gen(x):\\n    y = x * 7\\n    return y\\n')\n")
    (project / "execs.py").write_text(
        "import genmod\n"
        "exec(compile('def made(a):\\n    b = a + 1\\n    return b\\n', '<generated>', 'exec'))\n\n"
        "def main():\n    print(made(genmod.gen(2)))\n\nmain()\n"
    )
    (project / "stars.py").write_text("from genmod import *\n\ndef main():\n    print(gen(3))\n\nmain()\n")
    result = cli("run", "-r", "genmod:gen:y", "-r", "__main__:made:b", "execs.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "15\n", result.stderr
    rows = sorted(line.split() for line in result.stderr.splitlines()[2:])
    assert rows == [["__main__:made:b@0", "1", "15"], ["genmod:gen:y@0", "1", "14"]]
    starred = cli("run", "-r", "__main__:gen:y", "stars.py", cwd=project)
    assert starred.returncode == 0 and starred.stdout == "21\n", starred.stderr
    assert [line.split() for line in starred.stderr.splitlines()[2:]] == [["__main__:gen:y@0", "1", "21"]]
    # A misspelt one is said once the module has run, with the names it has.
    refused = cli("run", "-r", "genmod:gne:y", "execs.py", cwd=project)
    assert refused.returncode == 2
    assert "has no attribute 'gne'; did you mean 'gen'?" in one_clear_line(refused)


def test_run_checks_targets_before_a_program_that_only_names_exec_or_globals_otherwise(project):
    # An attribute (Qt's app.exec(), self.globals) or a string ('exec', compile's mode) is no
    # call of the builtins: a misspelt target is still refused before the program's first line.
    (project / "qtlike.py").write_text(
        "class App:\n    def exec(self):\n        self.globals = {}\n        return 0\n\n"
        "def work(x):\n    y = x * 2\n    return y\n\n"
        "mode = 'exec'\nprint(work(3))\nApp().exec()\n"
    )
    refused = cli("run", "-r", "__main__:wrok:y", "qtlike.py", cwd=project)
    assert refused.returncode == 2 and refused.stdout == ""
    assert "never defines 'wrok'; did you mean 'work'?" in one_clear_line(refused)


SHOWS_SYS_PATH = "import sys\n\ndef f():\n    y = 1\n    return y\n\nf()\nprint(sys.path)\n"


@pytest.mark.parametrize("safe_path", ["", "1"])
@pytest.mark.parametrize("program", ["prog.py", "app", "-m"])
def test_run_gives_the_program_the_sys_path_python_gives_it(project, tmp_path, program, safe_path):
    # A directory program had its folder on sys.path twice; under python -P (PYTHONSAFEPATH),
    # where Python adds no script's folder, bcrecord put it in place of PYTHONPATH's first entry.
    import subprocess

    from .commands import _env

    if safe_path and not hasattr(sys.flags, "safe_path"):
        pytest.skip("python -P is Python 3.11+")
    (project / "app").mkdir()
    (project / "app" / "__main__.py").write_text(SHOWS_SYS_PATH)
    (project / "shows.py").write_text(SHOWS_SYS_PATH)
    extra = tmp_path / "extra"  # on PYTHONPATH: found under python -P too
    extra.mkdir()
    (extra / "shows_m.py").write_text(SHOWS_SYS_PATH)
    env = dict(_env(), PYTHONSAFEPATH=safe_path)
    env["PYTHONPATH"] += os.pathsep + str(extra)
    where = {"prog.py": ["shows.py"], "app": ["app"], "-m": ["-m", "shows_m"]}[program]

    def ran(*command):
        done = subprocess.run(
            [sys.executable, *command], cwd=project, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    expected = ran(*where)
    assert ran("-m", "bcrecord", "run", "-q", "-r", "__main__:f:y", *where) == expected
    path = ast.literal_eval(expected)
    assert str(extra) in path
    folder = str(project / "app") if program == "app" else str(project)
    assert path.count(folder) == (0 if safe_path and program != "app" else 1)


@pytest.mark.parametrize("program", ["prog.py", "app", "-m"])
def test_run_under_python_dash_i_gives_the_program_the_sys_path_python_dash_i_gives_it(project, program):
    # python -I adds no script's, -m's or working directory's folder, as -P does; on 3.10,
    # which has no -P, bcrecord put the program's folder in place of sys.path's first entry.
    import subprocess

    from .commands import ROOT

    (project / "app").mkdir()
    (project / "app" / "__main__.py").write_text(SHOWS_SYS_PATH)
    (project / "shows.py").write_text(SHOWS_SYS_PATH)
    where = {"prog.py": ["shows.py"], "app": ["app"], "-m": ["-m", "site"]}[program]  # (site shows it)
    # -I ignores PYTHONPATH: this bcrecord is found at the end of sys.path (and left out below).
    command = [
        "import sys",
        f"sys.path.append({str(ROOT)!r})",
        "from bcrecord.cli import main",
        f"sys.argv = ['bcrecord', 'run', '-q', '-r', 'json:dumps:return', *{where!r}]",
        "sys.exit(main())",
    ]

    def ran(*args):
        done = subprocess.run([sys.executable, "-I", *args], cwd=project, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    expected, shown = ran(*where), ran("-c", "\n".join(command))
    if program == "-m":
        # (only the entry of ROOT itself: a virtual environment inside the checkout, tox's, is under it)
        ours = f"    {str(ROOT)!r},"
        assert [line for line in shown.splitlines() if line != ours] == expected.splitlines()
        assert str(project) not in shown
    else:
        assert [p for p in ast.literal_eval(shown) if p != str(ROOT)] == ast.literal_eval(expected)


def test_run_whose_saves_fail_says_so_once_and_exits_2(project, tmp_path):
    out = tmp_path / "records"
    out.mkdir()  # (there already: the run makes its records folder as it starts, for the program to remove)
    (project / "sabotage.py").write_text(
        "import shutil, sys, helper\n"
        "helper.twice(1)\n"
        f"shutil.rmtree({str(out / 'records')!r})\n"
        f"open({str(out / 'records')!r}, 'w').close()  # where the data files go: now a file\n"
        "print('done')\n"
    )
    result = cli("run", "-r", "helper:twice:y", "-o", out, "sabotage.py", cwd=project)
    assert result.returncode == 2 and result.stdout == "done\n"
    errors = [line for line in result.stderr.splitlines() if "cannot write records" in line]
    assert len(errors) == 1, result.stderr


def test_run_property_targets_in_a_loaded_module_once_per_getter_and_where_defined(project):
    (project / "props.py").write_text(
        "class Base:\n    @property\n    def p(self):\n        v = 10\n        return v\n\n"
        "class Sub(Base):\n    pass\n"
    )
    (project / "useprops.py").write_text("import props\nprint(props.Base().p, props.Sub().p)\n")
    both = cli("run", "-r", "props:Base.p:v", "-r", "props:Base.p.fget:v", "useprops.py", cwd=project)
    assert both.returncode == 0 and both.stdout == "10 10\n", both.stderr
    assert [line.split() for line in both.stderr.splitlines()[2:]] == [["Base:p:v@0", "2", "10"]]
    inherited = cli("run", "-r", "props:Sub.p:v", "useprops.py", cwd=project)
    assert "Sub.p is a property it inherits from Base" in one_clear_line(inherited)
    assert "target 'props:Base.p:...'" in inherited.stderr
    # A module loaded before the program starts (threading) is checked live: the getter.
    (project / "named.py").write_text("import threading\nprint(threading.Thread(name='w').name)\n")
    loaded = cli("run", "-r", "threading:Thread.name:return", "named.py", cwd=project)
    assert loaded.returncode == 0 and loaded.stdout == "w\n", loaded.stderr
    assert "Thread:name:return  1       'w'" in loaded.stderr


def test_run_records_a_target_given_under_both_names_of_the_program_once(project, tmp_path):
    (project / "sq.py").write_text(
        "class C:\n    def f(self, v):\n        y = v + 1\n        return y\n\n"
        "def square(v):\n    out = v * v\n    return out\n\n"
        "print(sum(square(i) + C().f(i) for i in range(4)))\n"
    )
    for order in (("__main__", "sq"), ("sq", "__main__")):
        out = tmp_path / "-".join(order)
        targets = [arg for name in order for arg in ("-r", f"{name}:square:out", "-r", f"{name}:C.f:y")]
        result = cli("run", *targets, "-o", out, "sq.py", cwd=project)
        assert result.returncode == 0 and result.stdout == "24\n", result.stderr
        assert "never applied" not in result.stderr
        loaded = bcrecord.load(out)
        assert {key: loaded[key] for key in loaded} == {
            "__main__:square:out@0": [0, 1, 4, 9],
            "C:f:y@0": [1, 2, 3, 4],
        }
    # Different specs under the two names: each records.
    both = cli("run", "-r", "__main__:square:out", "-r", "sq:square:return", "sq.py", cwd=project)
    rows = [line.split()[:2] for line in both.stderr.splitlines()[2:]]
    assert rows == [["__main__:square:out@0", "4"], ["__main__:square:return", "4"]], both.stderr
    # A method under the two names: one class, keyed by its name as usual.
    both = cli("run", "-r", "__main__:C.f:y", "-r", "sq:C.f:return", "sq.py", cwd=project)
    rows = [line.split()[:2] for line in both.stderr.splitlines()[2:]]
    assert rows == [["C:f:y@0", "4"], ["C:f:return", "4"]], both.stderr


def test_run_records_in_test_modules_pytest_s_assertion_rewriter_loads(project):
    # pytest's assertion rewriter, a finder it puts first on sys.meta_path, loads the test files:
    # it said "test_thing was imported, but not through bcrecord's import hook", recording nothing.
    (project / "test_thing.py").write_text(
        "def helper(v):\n    y = v * 3\n    return y\n\n"
        "def test_a():\n    z = helper(2) + 1\n    assert z == 8\n"
    )
    result = cli(
        "run", "-r", "test_thing:helper:y", "-r", "test_thing:test_a:z",
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_thing.py",
        cwd=project,
    )  # fmt: skip
    rows = [line.split()[:3] for line in result.stderr.splitlines()[2:]]
    assert rows == [["test_thing:helper:y@0", "1", "6"], ["test_thing:test_a:z@0", "1", "7"]], result.stderr
    # The rewriter still loaded the file: the failure shows the values compared.
    assert result.returncode == 1 and "assert 7 == 8" in result.stdout, result.stdout


def test_run_says_when_another_finder_loaded_a_target_s_module(project):
    (project / "lib.py").write_text("def f(v):\n    x = v + 1\n    return x\n")
    (project / "first.py").write_text(
        "import importlib.machinery, sys\n\n"
        "class Finder:  # first on sys.meta_path, right before the import\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        return importlib.machinery.PathFinder.find_spec(name, path) if name == 'lib' else None\n\n"
        "sys.meta_path.insert(0, Finder())\nimport lib\nprint(lib.f(1))\n"
    )
    result = cli("run", "-r", "lib:f:x", "first.py", cwd=project)
    assert result.stdout == "2\n"
    assert "lib was imported, but not through bcrecord's import hook (a finder ahead of it" in result.stderr


def test_run_of_a_symlinked_script_finds_the_modules_beside_its_real_file(project):
    (project / "real").mkdir()
    (project / "links").mkdir()
    (project / "real" / "sibling.py").write_text("NAME = 'beside the real file'\n")
    (project / "real" / "main.py").write_text(
        "import sibling\n\ndef f(v):\n    x = v\n    return x\n\nprint(f(sibling.NAME))\n"
    )
    (project / "links" / "main.py").symlink_to(project / "real" / "main.py")
    expected = plain("links/main.py", cwd=project)
    result = cli("run", "-r", "__main__:f:x", "links/main.py", cwd=project)
    assert result.stdout == expected.stdout == "beside the real file\n", result.stderr


@pytest.mark.parametrize("script", ["globals_.py", "tool"])  # (a bin/ script has no suffix)
def test_run_gives_the_program_s_module_what_python_gives_it(project, script):
    # line_profiler's fallback sets __builtins__.profile; pkgutil reads __loader__.
    (project / script).write_text(
        "print(type(__builtins__).__name__, type(__loader__).__name__, repr(__package__))\n"
        "def f(v):\n    x = v\n    return x\n\nf(1)\n"
    )
    expected = plain(script, cwd=project)
    result = cli("run", "-r", "__main__:f:x", script, cwd=project)
    assert result.stdout == expected.stdout == "module SourceFileLoader None\n", result.stderr


#: The program's view of ``__main__`` and ``sys``, at its first line and at its end.
_SHOWS_ITS_MAIN = (
    "import sys\n"
    "def seen():\n"
    "    names = {k: v for k, v in globals().items() if k.startswith('__')}\n"
    "    names['__loader__'] = type(names['__loader__']).__name__\n"
    "    names['__spec__'] = getattr(names['__spec__'], 'name', None)\n"
    "    names['__builtins__'] = type(names['__builtins__']).__name__\n"
    "    if '__annotate__' in names: names['__annotate__'] = names['__annotate__'](1)\n"
    "    return [list(globals()), names, sys.argv, sys.path[0]]\n\n"
    "print(seen())\n"
    "def f(v):\n    x = v\n    return x\n\n"
    "f(1)\n"
    "print(seen())\n"
)


@pytest.mark.parametrize(
    "program",
    [
        ("prog_ns.py", "a"),
        ("annotated.py",),
        ("app_ns", "z"),
        ("app_ns.zip",),
        ("-m", "pkg_ns.tool", "a"),
        ("-m", "pkg_ns"),
        ("-", "a"),
        ("./prog_ns.py",),
        ("./app_ns/",),
        (".",),
    ],
    ids=[
        "script",
        "annotated",
        "directory",
        "zip",
        "module",
        "package",
        "stdin",
        "dot-script",
        "dot-dir",
        "dot",
    ],
)
def test_run_gives_the_program_the_main_module_and_argv_python_gives_it(project, program):
    # __main__ had no __annotations__ (python 3.10-3.13 put an empty one there as they start:
    # a script's module-level __annotations__ raised NameError under bcrecord), and a script's
    # sys.argv[0] was its absolute path while its code ran ('app_ns.zip' is what python gives),
    # and its __file__ normalised ('/project/./prog_ns.py' is what python gives).
    import zipfile

    (project / "prog_ns.py").write_text(_SHOWS_ITS_MAIN)
    (project / "annotated.py").write_text("limit: int = 3\n" + _SHOWS_ITS_MAIN)
    (project / "app_ns").mkdir()
    (project / "app_ns" / "__main__.py").write_text(_SHOWS_ITS_MAIN)
    with zipfile.ZipFile(project / "app_ns.zip", "w") as archive:
        archive.writestr("__main__.py", _SHOWS_ITS_MAIN)
    (project / "pkg_ns").mkdir()
    (project / "pkg_ns" / "__init__.py").write_text("")
    (project / "pkg_ns" / "tool.py").write_text(_SHOWS_ITS_MAIN)
    (project / "pkg_ns" / "__main__.py").write_text(_SHOWS_ITS_MAIN)
    stdin = _SHOWS_ITS_MAIN if program[0] == "-" else None
    cwd = project / "app_ns" if program == (".",) else project
    expected = plain(*program, cwd=cwd, input=stdin)
    result = cli("run", "-q", "-r", "__main__:f:x", *program, cwd=cwd, input=stdin)
    assert expected.returncode == 0, expected.stderr
    assert result.returncode == 0 and result.stdout == expected.stdout, result.stderr
    first = ast.literal_eval(result.stdout.splitlines()[0].replace("<class 'int'>", "'int'"))
    assert ("__annotations__" in first[0]) == (sys.version_info < (3, 14))
    if program[0] == "annotated.py":  # (3.14 makes them when asked: __annotate__(1) gives them)
        assert first[1]["__annotations__" if sys.version_info < (3, 14) else "__annotate__"] == {
            "limit": "int"
        }


def test_run_shows_a_syntax_error_in_the_program_as_python_does(project):
    (project / "broken.py").write_text("def f(v):\n    x = = v\n")
    plain_run = plain("broken.py", cwd=project)
    result = cli("run", "-r", "__main__:f:x", "broken.py", cwd=project)
    assert result.returncode == plain_run.returncode == 1
    assert result.stderr.startswith(plain_run.stderr), result.stderr  # then bcrecord's own lines
    assert (
        "bcrecord: target '__main__:f:x' was never applied: the program does not compile "
        "(SyntaxError: invalid syntax (broken.py, line 2))\n"
    ) in result.stderr


def test_run_records_a_function_the_program_rebinds_to_a_wrapper_once(project):
    # step = deco(step), A.m = deco(A.m): the same function inside, patched once.
    (project / "wrapped.py").write_text(
        textwrap.dedent(
            """
            import functools

            def deco(fn):
                @functools.wraps(fn)
                def wrapper(*a, **k):
                    return fn(*a, **k)
                return wrapper

            def step(v):
                y = v + 1
                return y

            class A:
                def m(self, v):
                    y = v * 10
                    return y

            step = deco(step)
            A.m = deco(A.m)
            print(sum(step(i) + A().m(i) for i in range(3)))
            """
        )
    )
    result = cli("run", "-r", "__main__:step:y", "-r", "__main__:A.m:y", "wrapped.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "36\n", result.stderr
    rows = [line.split()[:3] for line in result.stderr.splitlines()[2:]]
    assert rows == [["__main__:step:y@0", "3", "3"], ["A:m:y@0", "3", "20"]], result.stderr


def test_run_records_the_function_a_cached_property_or_a_partial_holds(project):
    (project / "held.py").write_text(
        textwrap.dedent(
            """
            import functools

            class K:
                @functools.cached_property
                def cp(self):
                    w = 4
                    return w

            def wrapped(a, b):
                inner = a * b
                return inner

            part = functools.partial(wrapped, 3)
            """
        )
    )
    (project / "useheld.py").write_text("import held\nprint(held.K().cp, held.part(2))\n")
    result = cli("run", "-r", "held:K.cp.func:w", "-r", "held:part.func:inner", "useheld.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "4 6\n", result.stderr
    # The keys bcrecord.patch_function(held.K.cp.func) and (held.part.func) give.
    rows = sorted(line.split() for line in result.stderr.splitlines()[2:])
    assert rows == [["K:cp:w@0", "1", "4"], ["held:wrapped:inner@0", "1", "6"]]


def test_run_keys_the_function_an_lru_cache_wraps_as_patch_function_does(project):
    # patch.py's error for 'C.lc' says to patch 'C.lc.__wrapped__': its keys are the function's
    # own, as patch_function(C.lc.__wrapped__) gives them, not '_lru_cache_wrapper:__wrapped__'.
    (project / "cached.py").write_text(
        textwrap.dedent(
            """
            import functools

            class C:
                @functools.lru_cache
                def lc(self, x):
                    q = x * 2
                    return q

            @functools.cache
            def cf(x):
                cc = x * 3
                return cc
            """
        )
    )
    (project / "usecached.py").write_text("import cached as c\nprint(c.C().lc(5), c.cf(2), c.cf(2))\n")
    targets = ["-r", "cached:C.lc.__wrapped__:q", "-r", "cached:cf.__wrapped__:cc"]
    result = cli("run", *targets, "usecached.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "10 6 6\n", result.stderr
    rows = sorted(line.split() for line in result.stderr.splitlines()[2:])
    assert rows == [["C:lc:q@0", "1", "10"], ["cached:cf:cc@0", "1", "6"]], result.stderr


def test_run_refuses_a_numba_function_without_naming_its_python_function_as_a_target(project):
    # It said "as a target: 'jitted:fast.__wrapped__:s'": numba then compiles the probed
    # function at its first call, inside the run, and fails the program with a TypingError.
    (project / "jitted.py").write_text(
        textwrap.dedent(
            """
            class CPUDispatcher:  # what @numba.njit makes: machine code around a Python function
                __module__ = "numba.core.registry"

                def __init__(self, func):
                    self.__wrapped__ = self.py_func = func
                    self.__qualname__ = func.__qualname__

                def __call__(self, a):
                    return a * 2

            def _fast(a):
                s = a * 2
                return s

            fast = CPUDispatcher(_fast)
            """
        )
    )
    (project / "usejitted.py").write_text("import jitted\nprint(jitted.fast(2))\n")
    result = cli("run", "-r", "jitted:fast:s", "usejitted.py", cwd=project)
    line = one_clear_line(result)
    assert result.stdout == "", result.stdout
    assert "is a numba CPUDispatcher: its calls run compiled machine code" in line, line
    assert "as a target" not in line, line


WRAPPERS = """
import functools

def base(a, b):
    c = a + b
    return c

class K:
    def __call__(self, z):
        w = z + 1
        return w

part = functools.partial(base, 1)
inst = K()

made_in = {}  # exec'd in globals without a __name__: made.__module__ is None
exec("def made(p):\\n    q = p * 3\\n    return q\\n", made_in)
made = made_in["made"]
part_of_made = functools.partial(made, 2)

@functools.cache
def cf(x):
    cc = x * 3
    return cc
"""


def test_run_refusing_a_partial_or_a_callable_object_gives_the_target_of_the_function_that_runs(project):
    # Only a function functools.cache wraps had its target named: a partial's refusal and a
    # callable object's said patch_function(base, specs), patch_method(K, '__call__', specs).
    (project / "wrappers.py").write_text(WRAPPERS)
    (project / "usewrappers.py").write_text("import wrappers as w\nprint(w.part(2), w.inst(3))\n")
    for target, named in [
        ("wrappers:part:c", "wrappers:base:c"),
        ("wrappers:inst:w", "wrappers:K.__call__:w"),
    ]:
        result = cli("run", "-r", target, "usewrappers.py", cwd=project)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.rstrip().endswith(f"; as a target: {named!r}"), result.stderr
        assert cli("run", "-r", named, "usewrappers.py", cwd=project).stdout == "3 4\n"


def test_run_refusing_a_callable_object_holding_the_def_names_the_function_it_holds(project):
    # A decorator's object (click's Command): the hint named its class's __call__, which has not
    # the def's locals and was refused in turn.
    (project / "commands.py").write_text(
        "class Command:\n    def __init__(self, callback):\n        self.callback = callback\n\n"
        "    def __call__(self, *args):\n        return self.callback(*args)\n\n"
        "@Command\ndef train(lr):\n    w = 1.0 - lr\n    return w\n\nprint(train(0.5))\n"
    )
    result = cli("run", "-r", "__main__:train:w", "commands.py", cwd=project)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.rstrip().endswith(
        "; but its __call__ has no such site: the function it holds as .callback has, as a target: "
        "'__main__:train.callback:w'"
    ), result.stderr
    done = cli("run", "-r", "__main__:train.callback:w", "commands.py", cwd=project)
    assert done.returncode == 0 and done.stdout == "0.5\n" and "Command:callback:w@0" in done.stderr


def test_run_refusing_a_wrapper_written_with_spaces_gives_a_whole_target(project):
    # The text was split at ':part:': 'wrappers : part : c' gave 'wrappers:base:' (its spec
    # lost) and 'wrappers: cf :cc' gave 'wrappers: cf :cc:cf.__wrapped__:'.
    (project / "wrappers.py").write_text(WRAPPERS)
    (project / "usewrappers.py").write_text("import wrappers as w\nprint(w.part(2), w.cf(1))\n")
    for target, named in [
        ("wrappers : part : c", "wrappers:base:c"),
        ("wrappers: cf :cc", "wrappers:cf.__wrapped__:cc"),
        ("wrappers:inst :w", "wrappers:K.__call__:w"),
    ]:
        result = cli("run", "-r", target, "usewrappers.py", cwd=project)
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr.rstrip().endswith(f"; as a target: {named!r}"), result.stderr


def test_run_refusing_a_wrapper_object_gives_the_target_of_the_function_it_wraps(project):
    # The refusal said patch_function(cf.__wrapped__, specs), which is no target (a pytest 8.4+
    # fixture, a FixtureFunctionDefinition, is refused the same way).
    (project / "cached.py").write_text(
        textwrap.dedent(
            """
            import functools

            @functools.cache
            def cf(x):
                cc = x * 3
                return cc
            """
        )
    )
    (project / "usecached.py").write_text("import cached as c\nprint(c.cf(2))\n")
    result = cli("run", "-r", "cached:cf:cc", "usecached.py", cwd=project)
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.rstrip().endswith(
        "patch the function it wraps, patch_function(cf.__wrapped__, specs); "
        "as a target: 'cached:cf.__wrapped__:cc'"
    ), result.stderr


def test_run_target_naming_an_instance_s_method_records_that_instance_only(project):
    # 'm:model.forward': patched in place, every instance of the class was recorded under the key
    # (a teacher, a deep copy). In place still: a pickle of the model made meanwhile stays clean.
    (project / "inst.py").write_text(
        textwrap.dedent(
            """
            import copy, pickle

            class Net:
                def __init__(self, scale):
                    self.scale = scale

                def forward(self, x):
                    y = x * self.scale
                    return y

            class Bare:
                __slots__ = ()

                def forward(self, x):
                    z = x + 1
                    return z

            model = Net(10)
            forward = model.forward
            teacher = Net(100)
            bare = Bare()
            ema = copy.deepcopy(model)
            print(forward(1), teacher.forward(2), model.forward(3), end=" ")
            print(bare.forward(4), Bare().forward(5), ema.forward(6))
            print(sorted(vars(pickle.loads(pickle.dumps(model)))))
            model = Net(1000)  # bound anew: this one is the target now
            print(model.forward(7))
            """
        )
    )
    targets = ["-r", "__main__:model.forward:y", "-r", "__main__:bare.forward:z"]
    result = cli("run", *targets, "inst.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "10 200 30 5 6 60\n['scale']\n7000\n", result.stderr
    rows = sorted(line.split() for line in result.stderr.splitlines()[2:])
    assert rows == [["Bare:forward:z@0", "1", "5"], ["Net:forward:y@0", "3", "7000"]], result.stderr


@pytest.mark.parametrize(
    "top",
    [
        "import raises\n",
        "import importlib\nimportlib.import_module('raises')\n",
        "import mid\n",
        # A chained exception's traceback too: "The above exception was the direct cause..."
        "try:\n    import raises\nexcept RuntimeError as e:\n    raise KeyError('wrapped') from e\n",
    ],
)
def test_run_traceback_of_a_module_raising_on_import_is_python_s(project, top):
    (project / "raises.py").write_text("raise RuntimeError('nope')\n\ndef f(x):\n    y = x\n    return y\n")
    (project / "mid.py").write_text("import raises\n\ndef g(x):\n    return x\n")
    (project / "useraises.py").write_text(top)
    expected = plain("useraises.py", cwd=project)
    result = cli("run", "-r", "raises:f:y", "-r", "mid:g:x", "useraises.py", cwd=project)
    assert result.returncode == expected.returncode == 1
    assert result.stderr.startswith(expected.stderr), result.stderr  # the same frames, no more
    assert result.stderr[len(expected.stderr) :].splitlines() == [
        "bcrecord: target 'raises:f:y' was never applied: importing raises raised RuntimeError",
        "bcrecord: target 'mid:g:x' was never applied: "
        + ("importing mid raised RuntimeError" if "mid" in top else "mid was not imported"),
        "bcrecord: nothing was recorded",
    ]


@pytest.mark.parametrize("own_hook", [False, True])
def test_run_keyboard_interrupt_ends_the_program_as_python_does(project, own_hook):
    hook = "import sys\nsys.excepthook = lambda *e: print('own hook', e[0].__name__)\n" if own_hook else ""
    (project / "interrupted.py").write_text(
        hook + "def f(x):\n    y = x + 1\n    return y\n\nf(1)\nraise KeyboardInterrupt\n"
    )
    # What a console script (bin/bcrecord) is: its frame is bcrecord's too.
    (project / "console.py").write_text("import sys\nfrom bcrecord.cli import main\nsys.exit(main())\n")
    expected = plain("interrupted.py", cwd=project)
    for result in (
        cli("run", "-r", "__main__:f:y", "interrupted.py", cwd=project),
        plain("console.py", "run", "-r", "__main__:f:y", "interrupted.py", cwd=project),
    ):
        assert result.returncode == expected.returncode != 0
        assert result.stdout == expected.stdout == ("own hook KeyboardInterrupt\n" if own_hook else "")
        # Python's traceback, only the program's frame (none of bcrecord's or runpy's), then the summary.
        assert result.stderr.startswith(expected.stderr), result.stderr
        assert "__main__:f:y@0  1       2" in result.stderr[len(expected.stderr) :]


def test_run_interrupt_inside_a_probe_shows_the_program_s_line(project):
    # A Ctrl-C while a probe copies a value: the traceback ends at the line that ran the probe.
    (project / "copying.py").write_text(
        "class Slow:\n    def clone(self):\n        raise KeyboardInterrupt\n\n"
        "def f():\n    v = Slow()\n    return v\n\nf()\n"
    )
    result = cli("run", "-r", "__main__:f:v", "copying.py", cwd=project)
    frames = [line.split(", in ")[-1] for line in result.stderr.splitlines() if line.startswith("  File")]
    assert result.returncode != 0 and frames == ["<module>", "f"], result.stderr
    assert "bcrecord" not in result.stderr.split("KeyboardInterrupt")[0]


def test_run_keeps_the_program_s_frames_that_bcrecord_s_code_called(project):
    # A program using bcrecord itself: an error in its code called from bcrecord's shows as Python shows it.
    (project / "calls_back.py").write_text(
        "from bcrecord.runtime import silently\n\ndef f(x):\n    y = x\n    return y\n\n"
        "def boom(x):\n    raise ValueError(x)\n\nf(1)\nsilently(boom, 3)\n"
    )
    expected = plain("calls_back.py", cwd=project)
    result = cli("run", "-r", "__main__:f:y", "calls_back.py", cwd=project)
    assert result.returncode == expected.returncode == 1
    assert result.stderr.startswith(expected.stderr) and "in boom" in expected.stderr, result.stderr


def test_run_in_process_leaves_a_keyboard_interrupt_to_its_caller(project, monkeypatch):
    import sys

    from bcrecord import runner

    (project / "interrupted.py").write_text(
        "def f(x):\n    y = x\n    return y\n\nraise KeyboardInterrupt('stop')\n"
    )
    monkeypatch.chdir(project)
    hook = sys.excepthook
    with pytest.raises(KeyboardInterrupt, match="stop"):
        runner.run(["__main__:f:y"], "interrupted.py", [], quiet=True)
    assert sys.excepthook is hook  # nothing of bcrecord's left to print a later error


def test_run_target_of_a_program_that_ends_before_defining_it(project):
    (project / "early.py").write_text("import sys\nsys.exit(4)\n\ndef f(x):\n    y = x\n    return y\n")
    result = cli("run", "-r", "__main__:f:y", "early.py", cwd=project)
    assert result.returncode == 4
    assert result.stderr.splitlines()[0] == (
        "bcrecord: target '__main__:f:y' was never applied: the program ended before defining f"
    )


def test_run_patches_a_program_s_method_assigned_after_its_class(project):
    (project / "late.py").write_text(
        "class A:\n    pass\n\ndef _m(self, x):\n    y = x + 1\n    return y\n\nA.m = _m\nprint(A().m(1))\n"
    )
    result = cli("run", "-r", "__main__:A.m:y", "late.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "2\n", result.stderr
    assert [line.split() for line in result.stderr.splitlines()[2:]] == [["A:m:y@0", "1", "2"]]
    (project / "never.py").write_text("class A:\n    pass\n\nprint(1)\n")
    result = cli("run", "-r", "__main__:A.m:y", "never.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "1\n"
    assert result.stderr.splitlines()[0] == (
        "bcrecord: target '__main__:A.m:y' was never applied: the program ended before defining A.m: "
        "<class '__main__.A'> has no attribute 'm'"
    )
    (project / "typo.py").write_text("class A:\n    def add(self):\n        return 1\n\nprint(A().add())\n")
    result = cli("run", "-r", "__main__:A.ad:y", "typo.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "1\n"
    assert result.stderr.splitlines()[0].endswith("has no attribute 'ad'; did you mean 'add'?")
    # A typo of a method assigned after its class: close to what the class has at the end.
    result = cli("run", "-r", "__main__:A.mm:y", "late.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "2\n"
    assert result.stderr.splitlines()[0].endswith("has no attribute 'mm'; did you mean 'm'?")


def test_run_refuses_a_function_defined_inside_another(project):
    (project / "nested.py").write_text(
        "def outer(a):\n    def inner(b):\n        w = b + 1\n        return w\n    return inner(a)\n\n"
        "def g():\n    return 1\n\ndef h():\n    return 2\n\nh.alt = g\nprint(outer(1), h.alt())\n"
    )
    result = cli("run", "-r", "__main__:outer.inner:w", "nested.py", cwd=project)
    assert result.returncode == 2 and result.stdout == ""  # before the program starts
    assert one_clear_line(result) == (
        "bcrecord: target '__main__:outer.inner:w': inner is a function defined inside outer, made "
        "anew by each call, out of the module's reach: it cannot be a target"
    )
    result = cli("run", "-r", "__main__:g.x:return", "nested.py", cwd=project)  # no def: checked at the end
    assert result.returncode == 0 and result.stdout == "2 1\n"
    assert "before defining g.x: <function g at" in result.stderr and "has no attribute 'x'" in result.stderr
    result = cli("run", "-r", "__main__:h.alt:return", "nested.py", cwd=project)  # h.alt = g sets it
    assert result.returncode == 0 and result.stdout == "2 1\n", result.stderr
    assert [line.split() for line in result.stderr.splitlines()[2:]] == [["__main__:g:return", "1", "1"]]


@pytest.mark.parametrize(
    ("target", "suggested"),
    [
        ("__main__:Acc:y", "'__main__:Acc.add:y'"),  # the program's class, from its code
        ("acc:Acc:y", "'acc:Acc.add:y'"),  # a module's, from its code before it is imported
        ("json.decoder:JSONDecoder:obj", "'json.decoder:JSONDecoder.decode:obj'"),  # imported already
    ],
)
def test_run_refuses_a_class_naming_one_of_its_methods(project, target, suggested):
    source = "class Acc:\n    def __init__(self):\n        self.n = 0\n\n"
    source += "    def add(self, x):\n        y = x + 1\n        return y\n"
    (project / "acc.py").write_text(source)
    (project / "useacc.py").write_text(source + "\nimport acc\nprint(Acc().add(1))\n")
    result = cli("run", "-r", target, "useacc.py", cwd=project)
    assert result.stdout == ""  # refused before the program starts
    name = target.split(":")[1]
    assert one_clear_line(result) == (
        f"bcrecord: target {target!r}: {name} is a class: name one of its methods, e.g. {suggested}"
    )


def test_run_patches_each_definition_of_a_program_s_function(project):
    (project / "again.py").write_text(
        "def step(i):\n    old = i + 0.5\n    return old\n\nprint(step(1))\n\n"
        "def step(i):\n    new = i * 100\n    return new\n\nprint(step(2))\n"
    )
    for target, rows in [
        ("__main__:step:return", [["__main__:step:return", "2", "200"]]),  # both definitions record
        ("__main__:step:new", [["__main__:step:new@0", "1", "200"]]),  # the definition that has it
    ]:
        result = cli("run", "-r", target, "again.py", cwd=project)
        assert result.returncode == 0 and result.stdout == "1.5\n200\n", (target, result.stderr)
        assert [line.split() for line in result.stderr.splitlines()[2:]] == rows
    (project / "either.py").write_text(  # two definitions, one runs: the other would have had it
        "import sys\nif len(sys.argv) > 5:\n    def step(i):\n        new = i * 100\n        return new\n"
        "else:\n    def step(i):\n        old = i + 1\n        return old\n\n"
        "print(sys.gettrace(), step(1))\n"
    )
    result = cli("run", "-r", "__main__:step:old", "either.py", cwd=project)
    # past the last line that binds it, nothing is traced any more (the rest runs at full speed)
    assert result.returncode == 0 and result.stdout == "None 2\n", result.stderr
    result = cli("run", "-r", "__main__:step:new", "either.py", cwd=project)
    assert result.returncode == 2 and result.stdout == ""  # as for a program's only definition
    assert result.stderr.splitlines() == [
        "bcrecord: target '__main__:step:new': step has no assignment to a local named 'new'; "
        "assigned locals: old; arguments (their value at entry): i"
    ]
    (project / "classes.py").write_text(  # a classmethod is found as a new bound method each time
        "class A:\n    @classmethod\n    def make(cls, x):\n        y = x + 1\n        return y\n\n"
        "A = A\nprint(A.make(1))\n\n"
        "class A:\n    @classmethod\n    def make(cls, x):\n        y = x + 100\n        return y\n\n"
        "print(A.make(1))\n"
    )
    result = cli("run", "-r", "__main__:A.make:y", "classes.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "2\n101\n", result.stderr
    assert [line.split() for line in result.stderr.splitlines()[2:]] == [["A:make:y@0", "2", "101"]]


def test_run_suggests_a_view_command_that_a_shell_takes(project, tmp_path):
    out = tmp_path / "dïr ñ"
    result = cli("run", "-r", "helper:twice:y", "-o", out, "prog.py", cwd=project)
    assert result.returncode == 0, result.stderr
    command = result.stderr.strip().splitlines()[-1].split("see them with: ", 1)[1]
    assert shlex.split(command) == ["bcrecord", "view", str(out)]


@pytest.mark.skipif(sys.platform == "win32" or not shutil.which("bash"), reason="bash, and bytes names")
@pytest.mark.parametrize("encoding", ["utf-8", "ascii"])
def test_run_suggests_a_view_command_that_bash_takes_for_a_name_that_is_no_utf_8(project, tmp_path, encoding):
    # Printed as '.../bad\udcffdir ñ' (Python's escape of the byte 0xff): pasted, that names another
    # folder. Now bash's $'...' with the bytes; on an ASCII terminal for 'ñ' too.
    out = os.path.join(os.fsencode(tmp_path), b"bad\xffdir \xc3\xb1")
    run = subprocess.run(
        [sys.executable, "-m", "bcrecord", "run", "-r", "helper:twice:y", b"-o" + out, "prog.py"],
        cwd=project,
        env=_env({"PYTHONIOENCODING": encoding}),
        capture_output=True,
    )
    assert run.returncode == 0, run.stderr
    command = run.stderr.strip().splitlines()[-1].split(b"see them with: ", 1)[1]
    assert command.startswith(b"bcrecord view $'")
    argument = subprocess.run(
        ["bash", "-c", b"printf %s " + command.removeprefix(b"bcrecord view ")], capture_output=True
    ).stdout
    assert argument == out


def _values_saved(directory, key):
    """How many values of ``key`` ``directory`` holds (0 before any is saved)."""
    return len(bcrecord.load(directory).get(key, [])) if directory.exists() else 0


def test_values_recorded_before_a_quiet_stretch_are_written_before_a_kill(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from .commands import _env

    # 1000 values, then a long quiet stretch (an evaluation, say) that a scheduler ends with
    # SIGTERM: they were written only with the next value, so they were lost.
    program = tmp_path / "quiet.py"
    program.write_text(
        textwrap.dedent(
            """
            import time
            def f(i):
                x = i * 2
                return x
            for i in range(1000):
                f(i)
            print("recorded", flush=True)
            time.sleep(120)
            """
        )
    )
    save = tmp_path / "saved"
    command = [sys.executable, "-m", "bcrecord", "run", "-r", "__main__:f:x", "-o", str(save), str(program)]
    process = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "recorded\n"
        # Written within seconds, with nothing more coming. (All of them waited for: on a loaded
        # machine, a start slower than the write interval writes the first value alone, at once.)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _values_saved(save, "__main__:f:x@0") < 1000:
            time.sleep(0.25)
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == -signal.SIGTERM  # killed as it would be: no handler of bcrecord's
    assert bcrecord.load(save)["__main__:f:x@0"] == [2 * i for i in range(1000)]


def test_a_program_that_joins_every_thread_it_finds_ends(project, tmp_path):
    # The thread that writes waiting values runs only while some wait: joined, it ends.
    (project / "joins.py").write_text(
        textwrap.dedent(
            """
            import threading, time
            def f(v):
                x = v
                return x
            workers = [threading.Thread(target=f, args=(i,)) for i in range(3)]
            for worker in workers:
                worker.start()
            time.sleep(0.2)
            for thread in threading.enumerate():
                if thread is not threading.main_thread():
                    thread.join()
            print("joined")
            """
        )
    )
    result = cli("run", "-r", "__main__:f:x", "-o", tmp_path / "out", "joins.py", cwd=project, timeout=60)
    assert result.stdout == "joined\n", result.stderr
    assert sorted(bcrecord.load(tmp_path / "out")["__main__:f:x@0"]) == [0, 1, 2]


def test_a_program_s_own_sigterm_handling_is_left_as_it_is(tmp_path):
    # As Lightning's does, it calls the handler it found, if it found one: Python's default
    # under bcrecord run too, so the program finishes as it would have.
    program = tmp_path / "graceful.py"
    program.write_text(
        textwrap.dedent(
            """
            import os, signal
            found = signal.getsignal(signal.SIGTERM)
            got = []
            def mine(number, frame):
                got.append(number)
                if callable(found):
                    found(number, frame)
            signal.signal(signal.SIGTERM, mine)
            def step(i):
                v = i * 2
                return v
            for i in range(20):
                step(i)
                if i == 5:
                    os.kill(os.getpid(), signal.SIGTERM)
            print("finished, got", got)
            """
        )
    )
    out = tmp_path / "out"
    result = cli("run", "-r", "__main__:step:v", "-o", out, program)
    assert result.returncode == 0 and result.stdout == plain(program).stdout == "finished, got [15]\n"
    assert bcrecord.load(out)["__main__:step:v@0"] == [2 * i for i in range(20)]


def test_run_records_only_the_program_s_calls_not_its_own_or_runpy_s(tmp_path, monkeypatch, capsys):
    from bcrecord import runner

    # The writer (json.dumps, os.path) every 0.2 s, from its thread and from the program's:
    # its calls were saved as the program's, and so were runpy's (os.fsdecode, abspath).
    monkeypatch.setenv("_BCRECORD_FLUSH_SECONDS", "0.2")
    program = tmp_path / "prog.py"
    program.write_text(
        textwrap.dedent(
            """
            import json, os, time
            json.dumps(1)
            os.path.join("a", "b")
            time.sleep(0.7)
            json.dumps(2)
            """
        )
    )
    targets = ["json:dumps:return", "posixpath:join:return", "posixpath:abspath:return"]
    targets += ["os:fsdecode:return", "threading:Event.wait:return"]
    assert runner.run(targets, str(program), save_dir=str(tmp_path / "out")) == 0
    assert dict(bcrecord.load(tmp_path / "out")) == {
        "json:dumps:return": ["1", "2"],
        "posixpath:join:return": ["a/b"],
    }
    assert "saved 3 value(s) of 2 key(s)" in capsys.readouterr().err


@pytest.mark.parametrize("sets_itself_again", [False, True])
@pytest.mark.parametrize("target", ["__main__:f:y", "json:dumps:return"])
def test_run_hands_every_event_to_a_tracer_set_before_it(tmp_path, target, sets_itself_again, capsys):
    import sys

    from bcrecord import runner

    # coverage, a debugger's breakpoints: they must keep seeing the program's lines.
    program = tmp_path / "traced.py"
    program.write_text("import json\ndef f(v):\n    y = v + 1\n    return y\nf(json.dumps(1) and 1)\n")
    lines = []

    def tracer(frame, event, arg):
        if sets_itself_again and event == "call":
            sys.settrace(tracer)  # as coverage's C tracer does: that took bcrecord's trace out
        if frame.f_code.co_filename == str(program):
            if event == "line":
                lines.append(frame.f_lineno)
            return tracer
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        assert runner.run([target], str(program)) == 0
    finally:
        sys.settrace(previous)
    assert lines == [1, 2, 5, 3, 4]
    assert "values  last value" in capsys.readouterr().err


def test_run_of_a_program_that_rebinds_its_patched_method_ends_without_a_warning(tmp_path, capsys):
    import warnings

    from bcrecord import RecordingWarning, runner

    program = tmp_path / "rebind.py"
    program.write_text(
        "class A:\n    def m(self, x):\n        y = x + 1\n        return y\n\nclass B(A):\n    pass\n\n"
        "def m2(self, x):\n    y = x * 10\n    return y\n\nB().m(1)\nB.m = m2\nB().m(1)\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecordingWarning)  # the program's own rebinding: no warning
        assert runner.run(["__main__:B.m:y"], str(program)) == 0
    assert [line.split() for line in capsys.readouterr().err.splitlines()[2:]] == [["B:m:y@0", "2", "10"]]


def test_run_names_a_target_that_recorded_nothing(tmp_path, capsys):
    from bcrecord import runner

    # Its code ran only in child processes (DataLoader workers), or never: the report said
    # nothing of it, only "saved N value(s) of 1 key(s)" for the other target.
    program = tmp_path / "prog.py"
    program.write_text(
        "def used(v):\n    y = v\n    if v > 10:\n        w = 1\n    return y\n\n"
        "def unused(v):\n    z = v\n    return z\n\nused(1)\n"
    )
    targets = ["__main__:used:y", "__main__:used:w", "__main__:unused:z"]  # w: a branch not taken
    assert runner.run(targets, str(program), save_dir=str(tmp_path / "o")) == 0
    err = capsys.readouterr().err.splitlines()
    why = "recorded nothing in this process (nothing reached it once patched; child processes, such as "
    assert err[:2] == [
        f"bcrecord: target '__main__:used:w' {why}DataLoader workers, are not recorded)",
        f"bcrecord: target '__main__:unused:z' {why}DataLoader workers, are not recorded)",
    ]
    assert err[2].startswith("bcrecord: saved 1 value(s) of 1 key(s)") and len(err) == 3


def test_a_target_an_imported_module_calls_only_as_it_is_imported_is_said_to_be_so(
    tmp_path, capsys, monkeypatch
):
    # The report blamed child processes: the module's own code ran before its patch.
    from bcrecord import runner

    (tmp_path / "vocab_at_import.py").write_text(
        "def build(n):\n    words = list(range(n))\n    return words\n\nVOCAB = build(3)\n"
    )
    program = tmp_path / "prog.py"
    program.write_text("from vocab_at_import import VOCAB\nprint(len(VOCAB))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert runner.run(["vocab_at_import:build:words"], str(program)) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "bcrecord: target 'vocab_at_import:build:words' recorded nothing in this process (nothing "
        "reached it once patched; vocab_at_import was patched once imported, so calls its own code "
        "made while it was being imported are not recorded; child processes, such as DataLoader "
        "workers, are not recorded)"
    )


def test_the_report_comes_after_the_program_s_buffered_output_in_one_log(tmp_path):
    # `bcrecord run ... > log 2>&1`: the report at exit came first, the program's block-buffered
    # stdout being flushed by Python only after the atexit handlers.
    program = tmp_path / "prog.py"
    program.write_text("def f(v):\n    w = v\n    return w\n\nfor i in range(3):\n    print('epoch', f(i))\n")
    with open(tmp_path / "log.txt", "w") as log:
        done = subprocess.run(
            [sys.executable, "-m", "bcrecord", "run", "-r", "__main__:f:w", str(program)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(),
            cwd=tmp_path,
            timeout=120,
        )
    assert done.returncode == 0
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert lines[:4] == [
        "epoch 0",
        "epoch 1",
        "epoch 2",
        "bcrecord: recorded (no --save-dir, so nothing was saved):",
    ]


def test_a_function_a_decorator_wraps_without_functools_wraps_is_recorded_in_the_wrapper(tmp_path, capsys):
    # The check before the start read the def; the patch read the wrapper, named by the name:
    # "timed.<locals>.inner has no assignment to a local named 'y'", status 2, mid-program.
    from bcrecord import runner

    program = tmp_path / "prog.py"
    program.write_text(
        "def timed(fn):\n    def inner(*a):\n        return fn(*a)\n    return inner\n\n"
        "@timed\ndef step(x):\n    y = x + 1\n    return y\n\n"
        "class Model:\n    @timed\n    def run(self, x):\n        z = x * 2\n        return z\n\n"
        "print(step(1), step(2), Model().run(5))\n"
    )
    assert runner.run(["__main__:step:y", "__main__:Model.run:z"], str(program)) == 0
    out, err = capsys.readouterr()
    assert out == "2 3 10\n"
    assert [line.split() for line in err.splitlines()[2:]] == [
        ["__main__:step:y@0", "2", "3"],
        ["Model:run:z@0", "1", "10"],
    ]


def test_a_signal_held_during_a_write_reaches_a_wakeup_fd_once(tmp_path):
    # asyncio's loop.add_signal_handler (Trio, Qt...) hears of a signal through a wakeup fd, which
    # the held signal had reached already: replayed with raise_signal, the handler ran twice (a
    # graceful shutdown's "Ctrl-C again to force quit" from one Ctrl-C).
    import signal
    import socket

    from bcrecord import runner

    called = []
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    reader.setblocking(False)
    previous = signal.signal(signal.SIGINT, lambda number, frame: called.append(number))
    previous_fd = signal.set_wakeup_fd(writer.fileno())
    try:
        with runner._SignalsHeld():
            signal.raise_signal(signal.SIGINT)  # Ctrl-C mid-write
            assert called == []
        assert called == [signal.SIGINT]
        assert reader.recv(100) == bytes([signal.SIGINT])  # one byte: one signal for the loop
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGINT, previous)
        reader.close()
        writer.close()


@pytest.mark.skipif(sys.platform != "linux", reason="reads Linux's struct sigaction")
def test_a_write_leaves_siginterrupt_as_the_program_set_it(tmp_path):
    # signal.siginterrupt(SIGALRM, False) (system calls restarted, as a sampling profiler
    # asks for its SIGPROF) was undone by the first write: holding the handler set the
    # OS's action anew, SA_RESTART cleared, and so did putting it back.
    import ctypes

    from bcrecord import runner, storage

    class Action(ctypes.Structure):  # Linux's (glibc's, musl's) struct sigaction
        _fields_ = [
            ("handler", ctypes.c_void_p),
            ("mask", ctypes.c_ulong * 16),
            ("flags", ctypes.c_int),
            ("restorer", ctypes.c_void_p),
        ]

    libc = ctypes.CDLL(None, use_errno=True)

    def restarts(number):
        action = Action()
        assert libc.sigaction(number, None, ctypes.byref(action)) == 0
        return bool(action.flags & 0x10000000)  # SA_RESTART

    previous = signal.signal(signal.SIGALRM, lambda number, frame: None)
    try:
        assert not restarts(signal.SIGALRM)
        signal.siginterrupt(signal.SIGALRM, False)
        assert restarts(signal.SIGALRM)
        collector = runner._Collector(storage.Writer(tmp_path))
        collector.deliver("m:f:x@0", 0, 10)
        collector.flush()
        assert restarts(signal.SIGALRM)
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert bcrecord.load(tmp_path)["m:f:x@0"] == [10]


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
@pytest.mark.parametrize("when", ["holding", "putting back"])
def test_a_timeout_while_handlers_are_held_or_put_back_reaches_the_program_with_every_handler_back(
    when, monkeypatch
):
    # A SIGALRM timeout that came while the handlers were held (before its own was) was
    # taken for a signal that cannot be held here: TimeoutError is an OSError, dropped
    # (1 to 2 of some 5000 timers of 0.3 ms under run); it comes once the write is done, as a
    # held one's. One that came while they were put
    # back (after its own was) stopped that: SIGTERM's and every later signal's handler
    # stayed the one that holds it, so the program no longer saw a SIGTERM.
    from bcrecord import runner

    def times_out(number, frame):
        raise TimeoutError("timed out")

    def stops(number, frame):  # a program's SIGTERM handler
        raise SystemExit(143)

    getsignal, set_signal = signal.getsignal, signal.signal
    fire = [when]

    def looked_up(number):  # holding: the timer fires before SIGALRM's handler is held
        if number == signal.SIGALRM and fire == ["holding"]:
            signal.raise_signal(fire.pop() and signal.SIGALRM)
        return getsignal(number)

    def put(number, handler):  # putting back: the timer fires right after its handler is back
        old = set_signal(number, handler)
        if handler is times_out and fire == ["putting back"]:
            signal.raise_signal(fire.pop() and signal.SIGALRM)
        return old

    previous = set_signal(signal.SIGALRM, times_out), set_signal(signal.SIGTERM, stops)
    try:
        monkeypatch.setattr(signal, "getsignal", looked_up)
        monkeypatch.setattr(signal, "signal", put)
        written = []
        with pytest.raises(TimeoutError, match="timed out"):
            with runner._SignalsHeld():
                written.append("batch")  # the write: whole, before the timeout comes
        monkeypatch.undo()
        assert written == ["batch"] and fire == []
        assert getsignal(signal.SIGALRM) is times_out and getsignal(signal.SIGTERM) is stops
    finally:
        monkeypatch.undo()
        set_signal(signal.SIGALRM, previous[0])
        set_signal(signal.SIGTERM, previous[1])


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
def test_a_timeout_as_a_write_begins_loses_no_value(tmp_path, monkeypatch):
    # A SIGALRM timeout that came after flush took the batch out of the buffer and before its
    # handler was held dropped the whole batch: 10,000 values of a run whose timer fired every
    # 0.3 ms went missing, some runs in two (3.12, 3.13).
    import time
    import types

    from bcrecord import runner, storage

    def times_out(number, frame):
        raise TimeoutError("timed out")

    fire = [True]

    def monotonic():  # (what flush reads as it begins): the timer fires then
        if fire:
            signal.raise_signal(fire.pop() and signal.SIGALRM)
        return time.monotonic()

    collector = runner._Collector(storage.Writer(tmp_path))
    for step in range(3):
        collector.deliver("m:f:x@0", step, step * 10)
    previous = signal.signal(signal.SIGALRM, times_out)
    try:
        monkeypatch.setattr(runner, "time", types.SimpleNamespace(monotonic=monotonic))
        with pytest.raises(TimeoutError, match="timed out"):
            collector.flush()
        monkeypatch.undo()
        collector.deliver("m:f:x@0", 3, 30)
        collector.flush()
    finally:
        signal.signal(signal.SIGALRM, previous)
    assert bcrecord.load(tmp_path)["m:f:x@0"] == [0, 10, 20, 30] and collector.error is None


@pytest.mark.skipif(not hasattr(signal, "SIGALRM"), reason="needs SIGALRM")
def test_a_timeout_as_the_writing_thread_starts_leaves_it_running(tmp_path, monkeypatch):
    # A SIGALRM timeout that came inside Thread.start (a probe starts the writing thread)
    # left a thread started but unknown: "Exception ignored in thread started by ...
    # KeyError" on the program's stderr (2 in some runs of a timer of 0.3 ms, 3.12, 3.13),
    # the collector without its thread, values waiting for the next one.
    import threading

    from bcrecord import runner, storage

    def times_out(number, frame):
        raise TimeoutError("timed out")

    name = "_start_joinable_thread" if hasattr(threading, "_start_joinable_thread") else "_start_new_thread"
    start, fire = getattr(threading, name), [True]

    def started(*args, **kwargs):  # the timer fires as the new thread starts
        handle = start(*args, **kwargs)
        if fire:
            signal.raise_signal(fire.pop() and signal.SIGALRM)
        return handle

    collector = runner._Collector(storage.Writer(tmp_path), flush_seconds=3600)
    collector.start_timer()
    previous = signal.signal(signal.SIGALRM, times_out)
    try:
        monkeypatch.setattr(threading, name, started)
        with pytest.raises(TimeoutError, match="timed out"):
            collector.deliver("m:f:x@0", 0, 10)  # the first value waiting: the thread starts
        monkeypatch.undo()
        assert fire == [] and collector.timer is not None and collector.timer.is_alive()
    finally:
        signal.signal(signal.SIGALRM, previous)
        collector.stop_timer()
    collector.flush()
    assert bcrecord.load(tmp_path)["m:f:x@0"] == [10]


@pytest.mark.skipif(not hasattr(signal, "siginterrupt"), reason="no sigaction")
def test_what_a_write_imports_is_imported_before_the_program_runs(tmp_path):
    # The first write imported ctypes (to read the signals' actions) before the program's
    # handlers were held, and importlib takes an OSError in a path's stat for a file not
    # there: a timeout's TimeoutError then never reached the program (1 in some runs of a
    # timer of 0.3 ms, 3.12, 3.13).
    import subprocess

    from .commands import _env

    code = (
        "import sys; from bcrecord import runner, storage; "
        f"runner._Collector(storage.Writer({str(tmp_path)!r})); print('ctypes' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True)
    assert done.stdout.split() == ["True"], done.stderr


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM", "SIGALRM"])
def test_a_signal_during_a_write_in_the_main_thread_waits_for_the_write(tmp_path, monkeypatch, signal_name):
    # SIGALRM: a timeout's handler raising TimeoutError mid-write was taken for a failed
    # write, which ended saving for the run (and the program ran on past its timeout).
    import signal

    from bcrecord import runner, storage

    number = getattr(signal, signal_name)

    def exits(number, frame):  # a program's SIGTERM handler
        raise SystemExit(143)

    def times_out(number, frame):  # a SIGALRM timeout's
        raise TimeoutError("timed out")

    # Python's own Ctrl-C handler (whatever an earlier test left), or a program's handler.
    handler = {"SIGINT": signal.default_int_handler, "SIGTERM": exits, "SIGALRM": times_out}[signal_name]
    raised = {"SIGINT": KeyboardInterrupt, "SIGTERM": SystemExit, "SIGALRM": TimeoutError}[signal_name]
    previous = signal.signal(number, handler)
    collector = runner._Collector(storage.Writer(tmp_path))
    real = storage.Writer.write_many

    def interrupted(self, *args, **kwargs):
        signal.raise_signal(number)  # Ctrl-C (or a scheduler's SIGTERM) mid-write
        return real(self, *args, **kwargs)

    monkeypatch.setattr(storage.Writer, "write_many", interrupted)
    try:
        for step in range(3):
            collector.deliver("m:f:x@0", step, step * 10)
        with pytest.raises(raised):
            collector.flush()
        # The handler was put back as it was before the write.
        assert signal.getsignal(number) is handler
    finally:
        signal.signal(number, previous)
    # The batch was written whole before the handler ran; nothing is left to write.
    assert bcrecord.load(tmp_path)["m:f:x@0"] == [0, 10, 20] and collector.buffer == []
    assert collector.error is None  # saving goes on
    monkeypatch.setattr(storage.Writer, "write_many", real)
    collector.deliver("m:f:x@0", 3, 30)
    collector.flush()
    assert bcrecord.load(tmp_path)["m:f:x@0"] == [0, 10, 20, 30]


_CTRL_C_MID_SAVE = (
    "import signal\nfrom bcrecord import storage\n\nreal = storage.Writer.write_many\n\n"
    "def interrupted(self, *args, **kwargs):\n"
    "    signal.raise_signal(signal.SIGINT)  # Ctrl-C while bcrecord saves\n"
    "    return real(self, *args, **kwargs)\n\n"
    "def f(x):\n    y = x + 1\n    return y\n\n"
)
#: No write before the interrupted one, however slowly a loaded machine runs the program: a
#: write every few seconds could otherwise save f(1) early, with the real writer, or write f(2)
#: inside the program's atexit handler, where the Ctrl-C would be the handler's.
_NO_EARLY_WRITE = {"_BCRECORD_FLUSH_SECONDS": "3600"}


@pytest.fixture
def ctrl_c_reaches_the_program():
    """Python's own Ctrl-C handler here while the test starts its programs, as in a terminal.

    Started from a background job of a non-interactive shell (``tox &`` in a CI script), pytest
    ignores SIGINT; an ignored signal stays ignored across exec, so the program ignored the
    Ctrl-C and ran on (exit status 0). A handler of our own is reset to the default in the child.
    """
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous is not None:  # (None: a handler set from C, which Python cannot put back)
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_during_the_save_after_the_program_ends_shows_no_frames_of_bcrecord_s(
    project, ctrl_c_reaches_the_program
):
    # The save when the program's code has ended: Python's own KeyboardInterrupt line, no traceback
    # through bcrecord's signal holding (nor contextlib), and the process ends by SIGINT as Python's does.
    (project / "ends.py").write_text(_CTRL_C_MID_SAVE + "f(1)\nstorage.Writer.write_many = interrupted\n")
    expected = plain("-c", "raise KeyboardInterrupt", cwd=project)
    result = cli("run", "-r", "__main__:f:y", "-o", "out", "ends.py", cwd=project, env=_NO_EARLY_WRITE)
    assert result.returncode == expected.returncode != 0
    assert result.stderr.splitlines()[0] == "KeyboardInterrupt", result.stderr
    assert "Traceback" not in result.stderr and "File " not in result.stderr, result.stderr
    assert bcrecord.load(project / "out")["__main__:f:y@0"] == [2]  # written whole before the interrupt


def test_a_ctrl_c_during_the_save_at_exit_is_one_line_after_the_report(project, ctrl_c_reaches_the_program):
    # Values from the program's atexit handler are saved by bcrecord's, at exit: a Ctrl-C there.
    (project / "late.py").write_text(
        _CTRL_C_MID_SAVE + "def late():\n    storage.Writer.write_many = interrupted\n    f(2)\n\n"
        "import atexit\natexit.register(late)\nf(1)\n"
    )
    result = cli("run", "-r", "__main__:f:y", "-o", "out", "late.py", cwd=project, env=_NO_EARLY_WRITE)
    assert "Traceback" not in result.stderr and "File " not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-2:] == [
        f"bcrecord: saved 2 value(s) of 1 key(s) to {project / 'out'}; see them with: "
        f"bcrecord view {shlex.quote(str(project / 'out'))}",
        "bcrecord: KeyboardInterrupt during the last save, after the program ended (what was saved is "
        "said above)",
    ]
    assert bcrecord.load(project / "out")["__main__:f:y@0"] == [2, 3]


def test_the_test_setting_of_the_write_interval_holds_back_early_writes_and_refuses_bad_values(project):
    # The Ctrl-C tests above rely on it: a program slower than the usual interval (5 seconds,
    # as on a loaded machine) has its first value written at once, before it ends, without it.
    (project / "slow.py").write_text(
        "import time\nfrom bcrecord import storage\n\ndef f(x):\n    y = x + 1\n    return y\n\n"
        "time.sleep(0.3)\nf(1)\nprint(storage.Writer(__import__('sys').argv[1]).saved)\n"
    )
    fast = cli(
        "run",
        "-r",
        "__main__:f:y",
        "-o",
        "a",
        "slow.py",
        "a",
        cwd=project,
        env={"_BCRECORD_FLUSH_SECONDS": "0.1"},
    )
    assert fast.returncode == 0 and fast.stdout == "1\n", fast.stderr
    held = cli("run", "-r", "__main__:f:y", "-o", "b", "slow.py", "b", cwd=project, env=_NO_EARLY_WRITE)
    assert held.returncode == 0 and held.stdout == "0\n", held.stderr
    assert bcrecord.load(project / "b")["__main__:f:y@0"] == [2]  # written at the end
    for bad in ("soon", "0", "-1", "inf", "nan"):
        line = one_clear_line(
            cli(
                "run",
                "-r",
                "__main__:f:y",
                "-o",
                "c",
                "slow.py",
                cwd=project,
                env={"_BCRECORD_FLUSH_SECONDS": bad},
            )
        )
        assert line == f"bcrecord: _BCRECORD_FLUSH_SECONDS must be a positive number of seconds, got {bad!r}"
    assert not (project / "c").exists()


def test_run_keeps_the_program_s_module_as_main_for_its_threads_and_atexit_handlers(project):
    # python script.py keeps the script's module as __main__ after its code ends: a
    # thread still running, or an atexit handler, pickles the script's own classes.
    (project / "late.py").write_text(
        textwrap.dedent(
            """
            import atexit, pickle, threading, time

            class Checkpoint:
                def __init__(self, n):
                    self.n = n

            def f(x):
                y = x + 1
                return y

            def save_later():
                time.sleep(0.2)
                print("thread pickled", len(pickle.dumps(Checkpoint(f(1)))) > 0)

            @atexit.register
            def at_exit():
                import __main__
                print("atexit sees", __main__.Checkpoint is Checkpoint)

            threading.Thread(target=save_later).start()
            """
        )
    )
    result = cli("run", "-q", "-r", "__main__:f:y", "late.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "thread pickled True\natexit sees True\n"


def test_run_flushes_a_file_the_program_leaves_open_as_python_does_at_exit(project, tmp_path):
    # The program's module, no longer __main__ after the run closed, was left to the garbage
    # collector, which finalized the file's buffer before its text layer: the line was lost.
    log = tmp_path / "program.log"
    (project / "leaves_open.py").write_text(
        textwrap.dedent(
            f"""
            def f(x):
                y = x + 1
                return y

            log = open({str(log)!r}, "w")
            log.write("a line never flushed by the program\\n")
            f(1)
            """
        )
    )
    assert plain("leaves_open.py", cwd=project).returncode == 0
    assert log.read_text() == "a line never flushed by the program\n"
    log.unlink()
    result = cli("run", "-q", "-r", "__main__:f:y", "leaves_open.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert log.read_text() == "a line never flushed by the program\n"


def test_run_makes_a_records_directory_the_program_removes_again(project, tmp_path):
    out = tmp_path / "out"
    out.mkdir()  # (there already: the run makes its records folder as it starts)
    (project / "wipes.py").write_text(
        textwrap.dedent(
            """
            import os, shutil, sys

            def f(x):
                y = x + 1
                return y

            f(0)  # before the wipe: still buffered, so saved after it
            out = sys.argv[1]
            shutil.rmtree(out)  # a training script starting afresh in its output folder
            os.makedirs(out)
            print([f(i) for i in range(3)])
            """
        )
    )
    result = cli("run", "-r", "__main__:f:y", "-o", out, "-n", "1", "wipes.py", out, cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[1, 2, 3]\n"
    made_again = f"the records directory {out} was removed while the program ran, and made again\n"
    assert made_again in result.stderr  # (nothing saved in it before: nothing said to be gone)
    assert bcrecord.load(out)["__main__:f:y@0"] == [1, 1, 2, 3]


def _saving_nothing(calls, ending=""):
    """A program that puts a file where the run's records folder is (given as its argument),
    then records ``__main__:f:y`` ``calls`` times, then runs ``ending``."""
    return textwrap.dedent(
        f"""
        import os, shutil, sys

        def f(x):
            y = x + 1
            return y

        out = sys.argv[1]
        shutil.rmtree(os.path.join(out, "records"))
        open(os.path.join(out, "records"), "w").close()  # no directory can be made there
        for x in range({calls}):
            f(x)
        {ending}
        """
    )


@pytest.mark.parametrize("ending", ["", "sys.exit(0)"])
def test_run_ends_with_status_2_where_the_records_could_not_be_saved(project, tmp_path, ending):
    out = tmp_path / "out"
    out.mkdir()  # (there already: the run makes its records folder as it starts)
    (project / "blocks.py").write_text(_saving_nothing(3, ending))
    # The report counts every value lost (it said only that saving had failed), whether the
    # failed write held all three or the first of them, the others coming after it.
    result = cli("run", "-r", "__main__:f:y", "-o", out, "blocks.py", out, cwd=project)
    assert result.returncode == 2, result.stderr
    said = f"bcrecord: cannot write records to {out}: {out / 'records'} is a file, not a folder\n"
    assert said in result.stderr and "nothing more is saved" not in result.stderr  # (said once, at the end)
    lost = "before saving failed (3 value(s) recorded were not saved)"
    assert f"saved 0 value(s) of 0 key(s) to {out} {lost}\n" in result.stderr
    assert "bcrecord view" not in result.stderr


def test_run_says_at_once_that_saving_failed_while_the_program_goes_on(project, tmp_path):
    # It was said only in the end-of-run report: after hours of a run that saved nothing.
    out = tmp_path / "out"
    out.mkdir()
    goes_on = 'print("the program goes on", file=sys.stderr)'
    (project / "later.py").write_text(_saving_nothing(10_000, goes_on))  # (written at the 10,000th)
    result = cli("run", "-r", "__main__:f:y", "-o", out, "later.py", out, cwd=project)
    assert result.returncode == 2, result.stderr
    told = (
        f"bcrecord: cannot write records to {out}: {out / 'records'} is a file, not a folder; nothing more "
        "is saved in this run, which goes on (the report at its end says what was saved)\n"
        "the program goes on\n"
    )
    assert told in result.stderr
    assert "before saving failed (10000 value(s) recorded were not saved)" in result.stderr


def test_run_reports_values_whose_copy_failed_whatever_the_program_s_warning_filters(project, tmp_path):
    (project / "locks.py").write_text(
        textwrap.dedent(
            """
            import threading, warnings
            warnings.filterwarnings("ignore")

            def f(x):
                lock = threading.Lock()
                y = x + 1
                return y

            print([f(i) for i in range(3)])
            """
        )
    )
    out = tmp_path / "out"
    result = cli(
        "run",
        "--copy",
        "deepcopy",
        "-r",
        "__main__:f:lock",
        "-r",
        "__main__:f:y",
        "-o",
        out,
        "locks.py",
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    assert (
        "bcrecord: __main__:f:lock@0: 3 value(s) not recorded, their copy failed (the first: TypeError: "
        in result.stderr
    )
    assert list(bcrecord.load(out)) == ["__main__:f:y@0"]


def test_run_summary_counts_the_values_recorded_not_those_whose_copy_failed(project):
    # One of three values cannot be deep-copied (a generator): the table said 3 values.
    (project / "some.py").write_text(
        textwrap.dedent(
            """
            def f(x):
                v = (i for i in range(x)) if x == 1 else x * 10
                lock = __import__("threading").Lock()
                return v

            for i in range(3):
                f(i)
            """
        )
    )
    targets = ["-r", "__main__:f:v", "-r", "__main__:f:lock"]
    result = cli("run", "--copy", "deepcopy", *targets, "some.py", cwd=project)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert "bcrecord: __main__:f:v@0: 1 value(s) not recorded, their copy failed" in result.stderr
    table = lines[lines.index("bcrecord: recorded (no --save-dir, so nothing was saved):") + 1 :]
    assert [line.split(None, 2) for line in table[1:]] == [
        ["__main__:f:v@0", "2", "20"],
        ["__main__:f:lock@0", "0", "- (copy failed)"],
    ]


def test_run_says_a_misspelt_entry_chain_could_not_be_read_and_what_the_function_loads(project):
    # Scaler.scale loads self.factor; self.factr reads (and fails) at each call: reached, no copy made.
    result = cli(
        "run", "-r", "helper:Scaler.scale:self.factr", "-r", "helper:Scaler.scale:out@0", "prog.py",
        cwd=project,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = [line for line in result.stderr.splitlines() if line.startswith("bcrecord:")]
    assert report[0] == (
        "bcrecord: Scaler:scale:self.factr: 6 value(s) not recorded: reading self.factr when Scaler.scale "
        "starts failed (the first: AttributeError: 'Scaler' object has no attribute 'factr'); Scaler.scale "
        "never loads self.factr; did you mean 'self.factor'? (the chains it loads: self.factor)"
    )
    assert report[1] == "bcrecord: recorded (no --save-dir, so nothing was saved):" and len(report) == 2
    assert "nothing reached" not in result.stderr and "copy failed" not in result.stderr


def test_run_says_a_private_entry_chain_could_not_be_read_in_either_spelling(project):
    # self.__gain is the instance's _Amp__gain (its key's spelling), which only some instances have.
    (project / "amp.py").write_text(
        textwrap.dedent(
            """
            class Amp:
                def __init__(self, gain=None):
                    if gain is not None:
                        self.__gain = gain

                def run(self, v):
                    out = v * getattr(self, "_Amp__gain", 1)
                    return out

            for amp in (Amp(2), Amp(), Amp()):
                amp.run(3)
            """
        )
    )
    for chain in ("self.__gain", "self._Amp__gain"):
        result = cli("run", "-r", f"__main__:Amp.run:{chain}", "amp.py", cwd=project)
        assert result.returncode == 0, result.stderr
        report = [line for line in result.stderr.splitlines() if line.startswith("bcrecord:")]
        assert report[0] == (
            f"bcrecord: Amp:run:self._Amp__gain: 2 value(s) not recorded: reading {chain} when Amp.run "
            "starts failed (the first: AttributeError: 'Amp' object has no attribute '_Amp__gain'); Amp.run "
            f"never loads {chain} (the chains it loads: none)"
        )
        assert "copy failed" not in result.stderr


def test_run_reports_on_the_stderr_it_started_with(project, tmp_path):
    log = tmp_path / "program.log"
    (project / "logs.py").write_text(
        textwrap.dedent(
            f"""
            import sys

            def f(x):
                y = x + 1
                return y

            sys.stderr = open({str(log)!r}, "w")  # the program's own log
            print("program log line", file=sys.stderr)
            f(1)
            """
        )
    )
    result = cli("run", "-r", "__main__:f:y", "logs.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert "__main__:f:y@0  1       2" in result.stderr
    assert log.read_text() == "program log line\n"


def test_run_says_so_when_the_program_turned_off_the_tracing_that_patches_its_targets(project):
    (project / "untraced.py").write_text(
        "import sys\nsys.settrace(None)\n\ndef f(x):\n    y = x + 1\n    return y\n\nprint(f(1))\n"
    )
    result = cli("run", "-r", "__main__:f:y", "untraced.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "2\n"
    assert (
        "target '__main__:f:y' was never applied: the program defined f after it turned off bcrecord's "
        "tracing of its module's lines (sys.settrace" in result.stderr
    )


def test_run_warns_where_a_module_of_the_program_s_folder_has_a_name_bcrecord_imported(project, tmp_path):
    # Run from elsewhere: from the folder itself, its bytecode.py would be imported by bcrecord
    # too (python -m puts the working directory first), as by any other tool.
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "bytecode.py").write_text("def detect():\n    return 'mine'\n")
    (folder / "plat.py").write_text(
        "import bytecode\n\ndef f():\n    return hasattr(bytecode, 'detect')\n\nprint(f())\n"
    )
    result = cli("run", "-q", "-r", "__main__:f:return", folder / "plat.py", cwd=project)
    assert result.returncode == 0 and result.stdout == "False\n"
    said = "bcrecord: warning: the program's folder has module(s) of its own named bytecode, which"
    assert said in result.stderr
    assert "warning" not in cli("run", "-q", "-r", "helper:twice:y", "prog.py", "1", cwd=project).stderr


def test_run_from_the_program_s_folder_warns_where_bcrecord_took_the_program_s_module_as_its_own(project):
    # Started in the folder (the working directory first on sys.path), bcrecord's own import of
    # shlex got the program's shlex.py: nothing said so, and its report then failed at exit
    # ("Exception ignored in atexit callback ... module 'shlex' has no attribute 'quote'").
    (project / "shlex.py").write_text("MINE = 1\n")
    (project / "mine.py").write_text("import shlex\n\ndef f():\n    y = 1\n    return y\n\nf()\n")
    result = cli("run", "-r", "__main__:f:y", "mine.py", cwd=project)
    said = (
        "bcrecord: warning: bcrecord imported the program's own shlex in place of the module(s) of "
        "that name it uses (the working directory, the program's folder, comes first on sys.path)"
    )
    assert result.returncode == 0 and said in result.stderr, result.stderr
    (project / "shlex.py").unlink()
    assert "warning" not in cli("run", "-r", "__main__:f:y", "mine.py", cwd=project).stderr


def test_run_reports_on_descriptor_2_when_the_program_closed_sys_stderr(project):
    (project / "closes.py").write_text(
        "import sys\n\ndef f(x):\n    y = x + 1\n    return y\n\nf(1)\nsys.stderr.close()\n"
    )
    result = cli("run", "-r", "__main__:f:y", "closes.py", cwd=project)
    assert result.returncode == 0
    assert "__main__:f:y@0  1       2" in result.stderr


def test_run_warns_of_no_folder_module_named_like_a_built_in_one(project, tmp_path):
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "gc.py").write_text("")  # python prog.py imports the built-in gc too
    (folder / "prog.py").write_text("import gc\n\ndef f():\n    return gc.isenabled()\n\nf()\n")
    result = cli("run", "-q", "-r", "__main__:f:return", folder / "prog.py", cwd=project)
    assert result.returncode == 0 and "warning" not in result.stderr, result.stderr


def test_buffered_containers_count_their_items_bytes_toward_a_write(tmp_path):
    # A tuple of large values (an LSTM's output and state) was counted by the tuple alone,
    # some 60 bytes: such values were buffered, gigabytes of them, until the next timed write.
    import dataclasses

    from bcrecord import runner, storage

    @dataclasses.dataclass
    class Output:
        logits: bytes

    collector = runner._Collector(storage.Writer(tmp_path), flush_bytes=10_000, flush_seconds=3600)
    collector.deliver("m:f:pair@0", 0, (bytes(6000), bytes(6000)))
    assert collector.buffer == []  # written at once: 12 kB is over the threshold
    collector.deliver("m:f:named@0", 0, {"a": [bytes(4000)], "b": [bytes(4000)], "c": [bytes(4000)]})
    collector.deliver("m:f:out@0", 0, Output(bytes(12_000)))
    assert collector.buffer == []
    collector.deliver("m:f:small@0", 0, (1, 2))
    assert len(collector.buffer) == 1 and collector.buffered < 1000
    loaded = bcrecord.load(tmp_path)
    assert loaded["m:f:pair@0"] == [(bytes(6000), bytes(6000))]
    assert loaded["m:f:named@0"][0]["c"] == [bytes(4000)]


def test_many_small_values_are_written_in_batches_of_a_bounded_number(tmp_path):
    # Small values (a loss a step) never reach the bytes threshold: a fast program's million
    # of them were written in one batch at the end, its index entries taking 1.5 GB at once.
    from bcrecord import runner, storage

    assert runner._Collector(None).flush_values == 10_000
    collector = runner._Collector(storage.Writer(tmp_path), flush_seconds=3600, flush_values=3)
    for step in range(7):
        collector.deliver("m:f:loss@0", step, step / 2)
    assert [value for _, _, value in collector.buffer] == [3.0]  # the 7th waits for the next batch
    assert bcrecord.load(tmp_path)["m:f:loss@0"] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]
    collector.flush()
    assert bcrecord.load(tmp_path)["m:f:loss@0"][-1] == 3.0 and collector.saved["m:f:loss@0"] == 7


def test_a_value_written_is_let_go(tmp_path):
    # The last value of each key was kept for the summary printed without --save-dir, also
    # with one: a run recording ten 40 MB activations held 400 MB (on the GPU, for GPU
    # tensors) after they were written, to its end.
    import array
    import gc
    import weakref

    from bcrecord import runner, storage

    collector = runner._Collector(storage.Writer(tmp_path), flush_seconds=3600)
    value = array.array("d", [0.5] * 1000)  # (an array: pickled, and weakly referable)
    gone = weakref.ref(value)
    collector.deliver("m:f:x@0", 0, value)
    collector.flush()
    del value
    gc.collect()
    assert gone() is None
    assert bcrecord.load(tmp_path)["m:f:x@0"] == [array.array("d", [0.5] * 1000)]


def test_sizing_a_nested_container_looks_at_a_bounded_number_of_items(monkeypatch):
    # Every item down to 4 levels was looked at: a million calls (half a second, in the
    # program's thread) for each recorded list of lists of lists. Items are sampled now.
    from bcrecord import runner

    class Blob:
        nbytes = 1000

    calls = []
    sized = runner._nbytes
    monkeypatch.setattr(runner, "_nbytes", lambda value, *rest: calls.append(1) or sized(value, *rest))
    nested = [[[[Blob()] * 100] * 100] * 100]
    assert runner._nbytes(nested) >= 100**3 * 1000  # every Blob counted, most by their sample's size
    assert len(calls) <= runner._SIZED_ITEMS + 1
    assert runner._nbytes([Blob()] * 5000) >= 5000 * 1000


def test_a_target_naming_a_module_level_value_shows_it_short(project):
    # The message held the value's whole repr: every item of a module-level table.
    (project / "tables.py").write_text("ROWS = list(range(100_000))\n")
    (project / "uses.py").write_text("import tables\n")
    line = one_clear_line(cli("run", "-r", "tables:ROWS.f:x", "uses.py", cwd=project))
    assert line.endswith("target 'tables:ROWS.f:x': [0, 1, 2, 3, 4, 5, ...] has no attribute 'f'"), line
    line = one_clear_line(cli("run", "-r", "tables:ROWS:x", "uses.py", cwd=project))
    assert line.endswith("'ROWS' is [0, 1, 2, 3, 4, 5, ...], a list: only Python functions can be patched")


def test_a_save_dir_under_home_written_with_a_tilde_is_under_home(project, tmp_path, monkeypatch):
    # '--save-dir=~/runs' reaches bcrecord as it is (the shell expands no '~' after '='): the
    # values went to a folder named '~' in the working directory.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    result = cli("run", "-r", "helper:twice:y", "--save-dir=~/runs", "prog.py", cwd=project)
    assert result.returncode == 0, result.stderr
    assert not (project / "~").exists()
    assert bcrecord.load(tmp_path / "home" / "runs")["helper:twice:y@0"] == [0, 2, 4, 6, 8, 10]
    viewed = cli("view", "--no-plots", "~/runs", cwd=project)
    assert viewed.returncode == 0 and "helper:twice:y@0" in viewed.stdout, viewed.stderr


def test_the_summary_shows_values_whose_repr_raises_or_spans_lines(project):
    # A repr that raised lost the whole report ("Exception ignored in atexit callback").
    (project / "odd.py").write_text(
        textwrap.dedent(
            """
            class Broken:
                def __repr__(self):
                    raise RuntimeError("no repr")

            class Net:
                def __repr__(self):
                    return "Net(\\n  (fc): Linear()\\n)"

            class Shaped:
                def shape(self):  # a method, not an array's shape
                    return 3

            def f():
                a = Broken()
                b = Net()
                c = Shaped()
                return a

            f()
            """
        )
    )
    targets = [arg for spec in ("a", "b", "c") for arg in ("-r", f"__main__:f:{spec}")]
    result = cli("run", *targets, "odd.py", cwd=project)
    assert result.returncode == 0 and "Exception" not in result.stderr, result.stderr
    rows = {line.split()[0]: line.split(None, 2)[2] for line in result.stderr.splitlines()[2:]}
    assert rows["__main__:f:a@0"].startswith("<Broken instance at 0x")
    assert rows["__main__:f:b@0"] == "this Net instance"
    assert rows["__main__:f:c@0"].startswith("<__main__.Shaped object at 0x")


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_values_of_forked_and_spawned_children_are_not_saved_and_the_parent_s_are_saved_once(project):
    # A child forked while values wait to be written inherits them: exiting through Python
    # (sys.exit runs atexit), it must neither write them again nor add its own, nor leave
    # the parent's saves numbered twice. Spawned children run the program's module anew.
    (project / "forks.py").write_text(
        textwrap.dedent(
            """
            import multiprocessing, os, sys

            def f(v):
                out = v * 2
                return out

            def work(i):
                return f(100 + i)

            if __name__ == "__main__":
                for i in range(3):
                    f(i)
                child = os.fork()
                if child == 0:
                    f(50)
                    sys.exit(0)
                os.waitpid(child, 0)
                f(3)
                for method in ("fork", "spawn"):
                    with multiprocessing.get_context(method).Pool(2) as pool:
                        print(method, pool.map(work, range(3)))
                f(4)
            """
        )
    )
    result = cli("run", "-r", "__main__:f:out", "-o", project / "saved", project / "forks.py", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["fork [200, 202, 204]", "spawn [200, 202, 204]"]
    assert "Traceback" not in result.stderr
    loaded = bcrecord.load(project / "saved")
    key = "__main__:f:out@0"
    assert loaded[key] == [0, 2, 4, 6, 8] and loaded.steps(key) == [0, 1, 2, 3, 4]
    assert "saved 5 value(s) of 1 key(s)" in result.stderr


def test_the_writing_thread_stops_for_a_fork_and_starts_again_after_it(tmp_path):
    # It ran on through a fork: a child forked mid-write (a DataLoader worker) kept the locks
    # the write held. Now os.register_at_fork hooks stop it (its write done) and start it again.
    from bcrecord import runner, storage

    collector = runner._Collector(storage.Writer(tmp_path), flush_seconds=3600)
    collector.start_timer()
    collector.deliver("m:f:x@0", 0, 1)
    writing = collector.timer
    assert writing is not None and writing.is_alive()
    runner._before_fork()
    assert not writing.is_alive() and collector.timer is None and not collector.timing
    assert [value for _, _, value in collector.buffer] == [1]  # still waiting, written later
    runner._after_fork_in_parent()
    assert collector.timing and collector.timer is not None and collector.timer.is_alive()
    collector.stop_timer()
    collector.flush()
    assert bcrecord.load(tmp_path)["m:f:x@0"] == [1]
    runner._before_fork()  # a fork after the run: nothing of the run's to stop or start
    runner._after_fork_in_parent()
    assert collector.timer is None or not collector.timer.is_alive()


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_program_that_replaces_itself_with_exec_saves_its_values_first(project):
    # os.exec* runs no exit handler: the values waiting to be written and the report were lost.
    # A failed exec (execlp of a missing program) leaves the program running, unrecorded, and
    # a child's exec after a fork is the child's; execvp's own failed tries along PATH are no
    # failure of the program's.
    (project / "execs.py").write_text(
        textwrap.dedent(
            """
            import os, sys

            def f(v):
                out = v * 2
                return out

            f(1)
            child = os.fork()
            if child == 0:
                f(50)
                os.execv(sys.executable, [sys.executable, "-c", "pass"])
            os.waitpid(child, 0)
            f(2)
            if sys.argv[1:] == ["fail"]:
                try:
                    os.execlp("bcrecord-no-such-program", "x")
                except OSError:
                    print("failed", flush=True)  # (exec flushes nothing, with or without bcrecord)
                f(3)
            os.environ["PATH"] = os.pathsep.join(["/bcrecord-no-such-dir", os.path.dirname(sys.executable)])
            print("thrown away")  # (exec flushes nothing: bcrecord's close flushed it)
            os.execvp(os.path.basename(sys.executable), [sys.executable, "-c", "print('replaced')"])
            """
        )
    )
    assert plain(project / "execs.py").stdout == "replaced\n"
    result = cli("run", "-r", "__main__:f:out", "-o", project / "saved", project / "execs.py", timeout=60)
    assert result.returncode == 0 and result.stdout == "replaced\n", result.stderr
    assert bcrecord.load(project / "saved")["__main__:f:out@0"] == [2, 4]
    assert result.stderr.splitlines()[-1].startswith("bcrecord: saved 2 value(s) of 1 key(s)")
    summary = cli("run", "-r", "__main__:f:out", project / "execs.py", "fail", timeout=60)
    assert summary.returncode == 0 and summary.stdout == "failed\nreplaced\n", summary.stderr
    assert [line.split() for line in summary.stderr.splitlines()[2:3]] == [["__main__:f:out@0", "2", "4"]]
    assert summary.stderr.splitlines()[3] == (
        "bcrecord: the program's os.execlp raised FileNotFoundError: bcrecord had ended the run to save "
        "its values before the exec, so what it does from here on is not recorded"
    )
    # In process (the Python API), os's exec functions are os's own again once the run ends.
    import io
    import os
    import posix

    from bcrecord.runner import run

    before = {name: getattr(os, name) for name in ("execv", "execve", "execvp", "execl", "_exit")}
    builtin = {name: getattr(posix, name) for name in ("execv", "execve", "_exit")}
    (project / "noexec.py").write_text("def f(v):\n    out = v * 2\n    return out\n\nf(1)\n")
    assert run(["__main__:f:out"], str(project / "noexec.py"), stderr=io.StringIO()) == 0
    assert {name: getattr(os, name) for name in before} == before
    assert {name: getattr(posix, name) for name in builtin} == builtin


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
@pytest.mark.parametrize("ending", ["os._exit(7)", "posix._exit(7)"])
def test_a_program_that_ends_with_os_exit_saves_its_values_and_reports_first(project, ending):
    # os._exit runs no exit handler (a training script may end with it, to skip a slow
    # teardown): the values waiting to be written and the report were lost. A forked child's
    # os._exit (as multiprocessing ends one) is the child's: the run goes on in the parent.
    (project / "ends.py").write_text(
        textwrap.dedent(
            f"""
            import os, posix, sys

            def f(v):
                out = v * 2
                return out

            f(1)
            child = os.fork()
            if child == 0:
                f(50)
                os._exit(0)
            os.waitpid(child, 0)
            f(2)
            print("ending", flush=True)
            print("thrown away")  # (os._exit flushes nothing: bcrecord's close flushed it)
            sys.stderr.write("half a line, thrown away")  # (line-buffered: the report wrote it out)
            {ending}
            """
        )
    )
    assert plain(project / "ends.py").stdout == "ending\n"
    assert plain(project / "ends.py").stderr == ""
    result = cli("run", "-r", "__main__:f:out", "-o", project / "saved", project / "ends.py", timeout=60)
    assert result.returncode == 7 and result.stdout == "ending\n", result.stderr
    assert bcrecord.load(project / "saved")["__main__:f:out@0"] == [2, 4]
    assert result.stderr.splitlines()[-1].startswith("bcrecord: saved 2 value(s) of 1 key(s)")
    assert "half a line" not in result.stderr
    summary = cli("run", "-r", "__main__:f:out", project / "ends.py", timeout=60)
    assert summary.returncode == 7, summary.stderr
    assert [line.split() for line in summary.stderr.splitlines()[2:]] == [["__main__:f:out@0", "2", "4"]]


def test_a_program_that_closes_file_descriptor_2_ends_with_its_own_status_and_its_values_saved(project):
    # The report, written to the closed descriptor at exit, made Python's exit status 120.
    (project / "detaches.py").write_text(
        "import os\n\ndef f(v):\n    out = v * 2\n    return out\n\nf(1)\nos.close(2)\nprint('done')\n"
    )
    alone = plain(project / "detaches.py")
    assert (alone.returncode, alone.stdout) == (0, "done\n")
    for saving in ([], ["-o", project / "saved"]):
        result = cli("run", "-r", "__main__:f:out", *saving, project / "detaches.py", timeout=60)
        assert (result.returncode, result.stdout, result.stderr) == (0, "done\n", "")
    assert bcrecord.load(project / "saved")["__main__:f:out@0"] == [2]


def test_a_program_that_ends_with_os_exit_0_where_its_records_could_not_be_saved_ends_with_2(
    project, tmp_path
):
    out = tmp_path / "out"
    out.mkdir()  # (there already: the run makes its records folder as it starts)
    (project / "blocks.py").write_text(
        textwrap.dedent(
            """
            import os, shutil, sys

            def f(x):
                y = x + 1
                return y

            shutil.rmtree(os.path.join(sys.argv[1], "records"))
            open(os.path.join(sys.argv[1], "records"), "w").close()  # no directory can be made there
            f(1)
            os._exit(0)
            """
        )
    )
    result = cli("run", "-r", "__main__:f:y", "-o", out, "blocks.py", out, cwd=project)
    assert result.returncode == 2, result.stderr
    said = f"bcrecord: cannot write records to {out}: {out / 'records'} is a file, not a folder\n"
    assert said in result.stderr


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_program_that_replaces_itself_with_posix_execv_saves_its_values_first(project):
    # os.execv is posix.execv: a program (or a library) calling it there lost its values.
    (project / "posix_exec.py").write_text(
        "import posix, sys\n\ndef f(v):\n    out = v * 2\n    return out\n\nf(1)\nf(2)\n"
        "posix.execv(sys.executable, [sys.executable, '-c', 'print(\"replaced\")'])\n"
    )
    result = cli(
        "run", "-r", "__main__:f:out", "-o", project / "saved", project / "posix_exec.py", timeout=60
    )
    assert result.returncode == 0 and result.stdout == "replaced\n", result.stderr
    assert bcrecord.load(project / "saved")["__main__:f:out@0"] == [2, 4]
    assert result.stderr.splitlines()[-1].startswith("bcrecord: saved 2 value(s) of 1 key(s)")


@pytest.mark.parametrize(
    "typo, message",
    [
        (
            "mod\uff1af\uff1ax",
            "bad target 'mod\uff1af\uff1ax': it has full-width characters: write 'mod:f:x'",
        ),
        ("mod:f:x\uff201", "it has full-width characters: write 'mod:f:x@1'"),
        ("mod:f:x@1@2", "several sites are one list: 'x@[1,2]'"),
        (
            "mod:f:x@01",
            "bad target 'mod:f:x@01': bad index in 'x@01': a leading zero is not accepted: write 'x@1'",
        ),
    ],
)
def test_a_target_with_a_likely_typo_is_told_the_form_to_write(typo, message):
    with pytest.raises(RunError) as caught:
        parse_target(typo)
    assert message in str(caught.value)
    assert parse_target("mod:\uff46:x").path == ("f",)  # (a full-width letter is the name's)


# --- properties: a target's three parts parse back; any text is a target or a RunError ---


@SETTINGS
@given(st.one_of(NAMES, CHAINS), st.one_of(NAMES, CHAINS), specs_and_short_forms())
def test_property_a_target_s_module_function_and_spec_parse_back(module, qualname, spec_and_text):
    spec, spec_text = spec_and_text
    target = parse_target(f"{module}:{qualname}:{spec_text}")
    assert (target.module, target.qualname, target.spec) == (
        module,
        bcrecord.specs.compiled_name(qualname),
        spec,
    )


@SETTINGS
@given(st.one_of(TYPED, st.lists(TYPED, max_size=4).map(":".join)))
def test_property_any_text_is_a_run_target_or_a_run_error_that_names_it(text):
    try:
        target = parse_target(text)
    except RunError as error:
        assert repr(text) in str(error) or repr(text.split(":", 2)[-1].strip()) in str(error)
    else:
        assert target.text == text and all(part.isidentifier() for part in target.path)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("held", ["stream", "import hook"])
def test_a_child_forked_while_another_thread_holds_a_lock_of_the_run_records_and_does_not_hang(held):
    # A key's counter is made under the stream's lock, the import hook moves or leaves
    # under its own: a child forked while another thread held one waited for it for good.
    from bcrecord import runner

    def f(a):
        x = a * 2
        return x

    patch = bcrecord.patch.patch_function(f, "x")
    delivered = []
    stream = runner._Stream(lambda key, step, value: delivered.append((key, step, value)), 1, "none")
    stream._take(patch)
    hook = runner._ImportHook(["nothing_here"], lambda module: None)

    def in_child():
        with stream:
            f(21)
        hook.close()
        return delivered, hook.closed

    try:
        lock = stream._counters_lock if held == "stream" else hook._lock
        assert fork_while_held(lock, in_child) == f"([({patch.keys[0]!r}, 0, 42)], True)"
    finally:
        patch.remove()


def test_the_torch_layer_is_loaded_once_torch_s_code_is_done_where_importing_torch_imports_dynamo(
    monkeypatch,
):
    # Up to torch 2.8, `import torch` imports torch._dynamo itself: the runner put the torch layer
    # off "until torch is done" and never came back to it, so Dynamo traced into the probes.
    import importlib
    import importlib.machinery
    import types

    from bcrecord import runner

    torch = types.ModuleType("torch")
    torch.__spec__ = importlib.machinery.ModuleSpec("torch", None)
    torch.__spec__._initializing = True  # (as importlib leaves it until torch's code returns)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._dynamo", types.ModuleType("torch._dynamo"))
    monkeypatch.delitem(sys.modules, "bcrecord.torch", raising=False)
    loaded = []
    monkeypatch.setattr(runner.importlib, "import_module", loaded.append)
    runner._torch_layer_for_dynamo(sys.modules["torch._dynamo"])  # (Dynamo's code done, torch's not)
    runner._torch_layer_for_dynamo()
    assert loaded == []
    runner._torch_layer_for_dynamo(torch)  # torch's code done
    assert loaded == ["bcrecord.torch"]


def test_a_variable_of_the_script_s_top_level_is_told_to_be_recorded_in_a_function(project):
    # '__main__:loss' was offered '__main__:loss:return' ("loss, defined in the script"), and that
    # ended with "'loss' is 4, an int: only Python functions can be patched", saying no more.
    (project / "flat.py").write_text("for i in range(3):\n    loss = i * 2\nprint('end')\n")
    result = cli("run", "-r", "__main__:loss", "flat.py", cwd=project)
    assert "'__main__:loss:return' (function loss, defined in the script; any spec" in result.stderr
    result = cli("run", "-r", "__main__:loss:return", "flat.py", cwd=project)
    assert result.stdout == "end\n"
    assert (
        "'loss' is 4, an int: only Python functions can be patched (a variable the program's top level "
        "assigns: record it inside a function that assigns it, '__main__:that_function:loss')"
    ) in result.stderr
