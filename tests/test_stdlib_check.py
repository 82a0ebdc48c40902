"""The fast subset of tools/stdlib_check.py runs in CI: CPython's own tests, every site probed."""

import io
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


def test_a_test_is_told_by_its_id_without_the_addresses_its_parameters_print_with():
    # 3.14's test_urlparse has subtests keyed by `parse=<function urlparse at 0x7f...>`: each
    # process printed its own address, and the runs' outcomes were compared as different tests.
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import stdlib_check
    finally:
        sys.path.remove(str(ROOT / "tools"))

    class Test:
        def __init__(self, address):
            self.address = address

        def id(self):
            return f"t.T.test_port (parse=<function urlparse at {self.address}>, bytes=True)"

    ran = [stdlib_check._Result(io.StringIO(), True, 0) for _ in range(2)]
    for result, address in zip(ran, ("0x7f622ea156f0", "0x7fd96d604510"), strict=True):
        result._note(Test(address), "skip")
    assert (
        ran[0].outcomes
        == ran[1].outcomes
        == {"t.T.test_port (parse=<function urlparse>, bytes=True)": "skip"}
    )
