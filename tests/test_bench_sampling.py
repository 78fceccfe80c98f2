"""benchmarks/bench_sampling.py: a tiny pair end to end (every sampled run lossless, the result
files loadable), and a missing checkpoint refused in one line, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_sampling.py"


def test_tiny_pair_end_to_end(make_checkpoint, tmp_path):
    target = make_checkpoint("llama")
    draft = make_checkpoint("llama", num_hidden_layers=1, seed=1)
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--target", str(target), "--draft", str(draft),
                           "--temperatures", "0,0.8", "--prompts", "2", "--max-new-tokens", "6", "--bs", "4",
                           "--w", "2", "--d", "2", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (js,) = out.glob("bench_sampling-*.json")
    data = json.loads(js.read_text())
    assert data["meta"]["weights"] == "checkpoint" and "torch" in data["meta"]
    df = pd.read_csv(js.with_suffix(".csv"))
    assert sorted(df.temperature.unique()) == [0.0, 0.8] and len(df) == 4
    assert df.lossless.all() and (df.mean_accepted >= 1).all()


def test_missing_checkpoint_exit_2(tmp_path):
    out = tmp_path / "results"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--target", str(tmp_path / "nope"), "--out", str(out)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "real_models" in proc.stderr
    (tmp_path / "empty").mkdir()  # a folder, but not a checkpoint
    proc = subprocess.run([sys.executable, str(SCRIPT), "--target", str(tmp_path / "empty"), "--draft",
                           str(tmp_path / "empty"), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "config.json" in proc.stderr
    assert not out.exists()
