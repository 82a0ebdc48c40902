"""benchmarks/calls.py runs (a smoke run; never a timing assertion)."""

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_calls_benchmark_quick_run():
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "calls.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    assert "every Bottleneck call site recorded (clone)" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].split()[-1] in ("MET", "MISSED")
