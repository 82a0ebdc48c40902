"""tools/test.sh, the README's test command, run against a stand-in Python that logs what it runs."""

import os
import pathlib
import stat
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Stands in for the virtual environment's python: pip succeeds; `tox run` exits $TOX_RC and
# `tox run -e py314` $PY314_RC; every call is logged.
FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in
  *"tox run -e py314"*) exit "$PY314_RC" ;;
  *"tox run"*) exit "$TOX_RC" ;;
esac
exit 0
"""


def _executable(path: pathlib.Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _test_sh(tmp_path: pathlib.Path, *args: str, tox_rc: int, py314_rc: int = 0):
    """Run tools/test.sh ARGS with the stand-in python as the active virtual environment's;
    returns its exit status and the tox commands it ran."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _executable(venv / "bin" / "python", FAKE_PYTHON)
    _executable(venv / "bin" / "python3.14", "#!/bin/sh\nexit 0\n")  # found first on PATH: no fetch
    calls = tmp_path / "calls"
    env = {
        **os.environ,
        "VIRTUAL_ENV": str(venv),
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "CALLS": str(calls),
        "TOX_RC": str(tox_rc),
        "PY314_RC": str(py314_rc),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "tools" / "test.sh"), *args], env=env, capture_output=True, text=True
    )
    return done.returncode, [line for line in calls.read_text().splitlines() if "tox run" in line]


@pytest.mark.parametrize("tox_rc, py314_rc, expected", [(0, 0, 0), (1, 0, 1), (0, 3, 3), (1, 3, 1)])
def test_py314_runs_after_a_failing_env_and_the_status_is_the_first_failure(
    tmp_path, tox_rc, py314_rc, expected
):
    returncode, runs = _test_sh(tmp_path, tox_rc=tox_rc, py314_rc=py314_rc)
    assert returncode == expected
    assert runs == ["-m tox run", "-m tox run -e py314"]


def test_arguments_go_to_tox_alone(tmp_path):
    assert _test_sh(tmp_path, "-e", "lint", tox_rc=4) == (4, ["-m tox run -e lint"])
