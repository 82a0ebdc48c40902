"""tools/zoo_check.py end to end on one small timm model, in a subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("timm", reason="the models tox env installs timm")
pytest.importorskip("torchvision", reason="the models tox env installs torchvision")

TOOL = Path(__file__).resolve().parents[2] / "tools" / "zoo_check.py"


def test_resnet18_records_equal_the_reference_and_outputs_are_identical(tmp_path: Path) -> None:
    command = [sys.executable, str(TOOL), "--pattern", "resnet18", "--limit", "1", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["model"] == "resnet18" and result["status"] == "ok", result
    assert result["identical"] is True and result["after_identical"] is True
    assert result["reference_equal"] is True and result["mismatch_count"] == 0
    assert result["restored"] is True and result["bcrecord_ok"] is True
    assert not result["patch_errors"] and not result["record_errors"]
    # Real work was compared: every BasicBlock's and the stem's locals, value for value.
    assert result["methods_patched"] >= 3 and result["sites"] > 20
    assert result["recorded_values"] == result["reference_values"] > 50
    assert result["compared_keys"] > 20
    assert result["fx_ok"] is True and result["fx_node"] == "fc"
    assert "reference-equal records | 1 (100.0%)" in (tmp_path / "summary.md").read_text()


def test_resume_skips_models_already_checked(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    done_before = {"model": "resnet18", "status": "ok", "identical": True, "bcrecord_ok": True}
    results.write_text(json.dumps(done_before) + "\n")
    command = [sys.executable, str(TOOL), "--pattern", "resnet18", "--out", str(tmp_path), "--resume"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "1 already done" in done.stdout
    assert len(results.read_text().splitlines()) == 1
