"""The fast subset of tools/stdlib_check.py runs in CI: CPython's own tests, every site probed."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_quick_stdlib_subset_has_zero_differences():
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "stdlib_check.py"), "--quick", "--json", "--no-count-events"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert len(rows) >= 17  # (18, less dataclasses from 3.14: NOT_QUICK_FROM)
    for row in rows:
        instrumented, plain = row["runs"]["instrumented"], row["runs"]["plain"]
        assert instrumented["ok"] and plain["ok"], row["target"]
        assert instrumented["tests_run"] == plain["tests_run"] > 0, row["target"]
        assert instrumented["probes_inserted"] > 0 and not instrumented["unpatchable"], row["target"]
        assert row["differences"] == [], (row["target"], row["differences"])
