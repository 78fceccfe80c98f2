"""benchmarks/bench_gemv.py refuses bad tile-sweep arguments in one line, exit 2, before any work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_gemv.py"


@pytest.mark.parametrize("args,message", [(["--stages", "3,x"], "take comma-separated integers"),
                                          (["--split-k", "1,two"], "take comma-separated integers"),
                                          (["--block-n", "64;128"], "take comma-separated integers"),
                                          (["--layers", "nope"], "no layer named 'nope'"),
                                          (["--shapes", "9b"], "unknown shape set '9b'")])
def test_bad_arguments_exit_2(tmp_path, args, message):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
