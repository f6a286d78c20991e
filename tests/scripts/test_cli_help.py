"""Every script under scripts/ and benchmarks/ (not the _private helpers they import) answers
``--help`` with its usage, run directly as the docs run it (``python scripts/x.py``), and the one
module there that is not a script says so in a line."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = {"benchmarks/efficiency_report.py"}  # imported by a benchmark, never run
SCRIPTS = sorted(
    str(p.relative_to(ROOT)) for folder in ("scripts", "benchmarks") for p in (ROOT / folder).glob("*.py")
    if not p.name.startswith("_") and str(p.relative_to(ROOT)) not in MODULES
)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help(script):
    done = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage:"), done.stdout[:500]


def test_report_module_run_directly_names_the_script():
    done = subprocess.run([sys.executable, "benchmarks/efficiency_report.py", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "benchmarks/encoder_efficiency.py" in done.stderr
