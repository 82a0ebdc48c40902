"""``benchmarks/core.py --quick`` runs and prints its table (timings are never checked).

Also: ``benchmarks/run.py`` without torch says what to install, not a traceback.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "core.py"

HEADINGS = (
    "bcrecord core benchmarks (quick: 5 interleaved rounds per case)",
    "bytecode ",
    "== 1. Per-event cost",
    "== 2. Idle cost",
    "== 3. Patch time",
    "variant",
    "ratio",
    "IQR",
    "unpatched",
    "bcrecord instrument + recording(copy='none')",
    "bcrecord, default recording() (copy='clone')",
    "bcrecord, probes as calls, copy='none'",
    "sys.settrace line recorder (f_locals)",
    "sys.monitoring LINE recorder (_getframe)",
    "hand-written floor (list.append(x))",
    "settrace / bcrecord",
    "1c. the same with each block's values freed right after it",
    "bcrecord recording(copy='none'), freed after",
    "hand-written floor, freed after",
    "the allocator's share",
    "Targets:",
    "bcrecord inline probes, copy='none' / unpatched",
    "settrace recorder / bcrecord inline probes",
    "idle patched / unpatched",
    "(a) first-time patch + remove (cache cleared)",
    "(b) cached patch + remove",
    "(c) source route (getsource..exec)",
    "(d) 50 instance patches + removes",
    "source route / first-time patch",
    "source route / cached patch",
    "rewrite cache misses over 50 instance patches",
    "== 4. bcrecord run: the program's module code watched until its target's def has run",
    "ratios to the plain run of the same loop (a fresh process per variant and round)",
    "call of a one-line function: watched",
    "call of a one-line function: defined first",
    "module-level while loop step: watched",
    "module-level while loop step: defined first",
)


def _run(script: str | Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a benchmark script with this checkout first on the path, as a user would."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )


def test_core_benchmark_quick_prints_its_table() -> None:
    result = _run(SCRIPT, "--quick")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    missing = [heading for heading in HEADINGS if heading not in result.stdout]
    assert not missing, f"missing from the output: {missing}\n{result.stdout}"
    # Each target line ends in a verdict; which one is a matter of timing, never checked.
    verdicts = [line for line in result.stdout.splitlines() if "target " in line]
    assert len(verdicts) == 4
    assert all(line.rstrip().endswith(("MET", "MISSED")) for line in verdicts)


def test_run_benchmarks_without_torch_say_what_to_install() -> None:
    result = _run(ROOT / "benchmarks" / "run.py", "--help")
    if importlib.util.find_spec("torch") is None:  # the core environments
        assert result.returncode == 1
        assert "Traceback" not in result.stderr
        assert "benchmarks/run.py needs torch, torchvision and matplotlib" in result.stderr
        assert "pip install torch==2.14.1 torchvision==0.29.1 matplotlib timm" in result.stderr
    else:
        assert result.returncode == 0, result.stderr[-4000:]
        assert "--quick" in result.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("torchvision") is not None,
    reason="for an environment with torch and without torchvision (the torch layer's)",
)
def test_run_benchmarks_without_torchvision_say_what_to_install_before_the_first_case(tmp_path) -> None:
    # It ran cases 1 to 3 first, then died with a traceback in case 4.
    result = _run(ROOT / "benchmarks" / "run.py", "--quick", "--out", str(tmp_path))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    assert "benchmarks/run.py needs torchvision" in result.stderr
    assert "pip install torch==2.14.1 torchvision==0.29.1 matplotlib timm" in result.stderr
    assert "== 1." not in result.stdout  # (no case ran)
