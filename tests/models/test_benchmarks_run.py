"""``benchmarks/run.py --quick`` runs, prints every case and writes its report (timings never checked)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision", reason="the models tox env installs torchvision")
pytest.importorskip("matplotlib", reason="benchmarks/run.py draws results.png with matplotlib")

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "benchmarks" / "run.py"

HEADINGS = (
    "bcrecord benchmarks vs alternatives (quick run)",
    "torchvision ",
    "bytecode ",
    "== 1. Per-event cost",
    "1b. per-event cost with bcrecord.torch imported",
    "== 2. Idle cost",
    "== 3. ToyModel of the MMEngine proposal",
    "source rewrite, proposal-style (getsource/ast/exec)",
    "forward hooks (2 hooks + 1 pre-hook, detach().clone())",
    "== 4. resnet50: five stage outputs, early stop, peak memory",
    "torchvision FX create_feature_extractor(model, stages)",
    "early stop after layer2",
    "diagnostic: early stop by a forward hook on layer2, clone",
    "diagnostic: hook stop, no copy / FX early stop",
    "4b. peak memory of one forward",
    "== 5. Set-up time",
    "FX: torchvision create_feature_extractor(resnet50, stages)",
    "== 6. torch.compile",
    "== 7. resnet50: every call site of Bottleneck.forward recorded",
    "every Bottleneck call site recorded (clone)",
    "7b. the same at 1x3x224x224",
    "freed memory kept (MALLOC_*): forward hooks, clone of every module call",
    "graph breaks",
    "== Summary ==",
    "IQR",
)


def test_benchmark_runner_quick_prints_every_case_and_writes_its_report(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    missing = [heading for heading in HEADINGS if heading not in result.stdout]
    assert not missing, f"missing from the output: {missing}\n{result.stdout}"
    # Every target line ends in a verdict; which one is a matter of timing, never checked.
    summary = result.stdout.split("== Summary ==", 1)[1].splitlines()
    verdicts = [line for line in summary if re.match(r"  \d\. ", line)]
    assert len(verdicts) >= 10
    assert all(line.rstrip().endswith(("MET", "MISSED")) for line in verdicts)
    # Each table's ratios in one column, under its heading, however long a variant's name (some
    # were longer than the column, and pushed their row's ratio out of it).
    tables = result.stdout.split("\n  variant ")[1:]
    assert len(tables) >= 8
    for table in tables:
        heading, _, rest = table.partition("\n")
        ends = {len("  variant ") + heading.index("ratio") + len("ratio")}
        for line in rest.splitlines()[1:]:  # (under the dashes)
            ratio = re.match(r"  .*? (\d+\.\d+x|n/a)(?= )", line)
            if ratio is None:
                break
            ends.add(ratio.end(1))
        assert len(ends) == 1, table

    markdown = (tmp_path / "RESULTS.md").read_text()
    for number in range(1, 8):
        assert f"\n## {number}. " in markdown
    assert "| variant | ratio (median) | IQR | context |" in markdown
    assert "**1c. each block's values freed right after it**" in markdown
    assert "- 1c: freed right after each block" in markdown
    assert "**7b. the same at 1x3x224x224, a fresh process each" in markdown
    assert "- 7b: 2 rounds of 1 forward(s) per process; 'freed memory kept' starts" in markdown
    assert "![ratios per case" in markdown
    # Case 4's early-stop verdict names the floor of a hook stop, measured in the same run.
    assert re.search(r"The least an early stop in Python can do, .* is \d\.\d+x \(IQR", markdown)
    png = (tmp_path / "results.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    # --out is honoured: the committed benchmarks/RESULTS.md is left alone.
    assert f"wrote {tmp_path / 'RESULTS.md'} and {tmp_path / 'results.png'}" in result.stdout
