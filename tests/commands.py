"""Running the command line in a fresh interpreter, for the tests of each command."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _env(extra=None):
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("PYTHONWARNINGS", None)
    # As tox runs them (it passes no PYTHONUNBUFFERED): a program's output buffered as a user's is.
    env.pop("PYTHONUNBUFFERED", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    # Plain tracebacks, which the tests read: Python 3.13 colours them when FORCE_COLOR is set
    # (tox passes it on from a CI's environment), also into a pipe. PYTHON_COLORS overrides it.
    env["PYTHON_COLORS"] = "0"
    return env


def cli(*args, cwd=None, timeout=300, input=None, env=None):
    """Run ``python -m bcrecord ARGS`` in a fresh interpreter (``input`` its stdin, ``env`` more
    environment variables); returns the CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-m", "bcrecord", *map(str, args)],
        cwd=cwd,
        input=input,
        env=_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def plain(*args, cwd=None, timeout=300, input=None):
    """Run ``python ARGS`` (no bcrecord), for comparison."""
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        input=input,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_clear_line(result):
    """Status 2, exactly one line on stderr, naming bcrecord, and no traceback."""
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("bcrecord: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]
