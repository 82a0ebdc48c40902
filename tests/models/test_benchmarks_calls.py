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


def test_calls_benchmark_in_a_fresh_process_with_its_own_environment():
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import calls
    finally:
        sys.path.remove(str(ROOT))
    measured = calls.measure_elsewhere(1, 1, 32, calls.KEEP_FREED_MEMORY)
    assert sorted(measured.times) == sorted(calls.NAMES)
    assert all(len(times) == 1 and times[0] > 0 for times in measured.times.values())
    # 10 call sites in Bottleneck.forward; 16 blocks, 4 of them with a downsample
    assert (measured.sites, measured.per_forward) == (10, 148)
    assert measured.malloc == calls.KEEP_FREED_MEMORY  # the process started with them
    assert calls.measure_elsewhere(1, 1, 32, {}).malloc == {}
