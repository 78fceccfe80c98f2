"""benchmarks/gpu_multi.sh (issues 8 and 9: one device call each) end to end on the CPU: tiny shapes,
gloo ranks — profile compute + comm, plan --modes async, run async/serial/autoregressive, one archive.
Guards the script against drift of the CLI it strings together (the multi-GPU machines are rarely
lent, so their one call must not fail on a renamed flag)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_multi_script_smoke_on_cpu(tmp_path):
    """3 ranks with WEIGHT_FORMAT=fp8: the profile is measured on fp8 shards (TP 1..3), and `run`
    follows the plan's profile to fp8 models. One run: with SMOKE=1 the script takes the same path
    at any GPUS (SMOKE sets the pair and the measured compute), and 3 ranks with fp8 pass every
    flag that 2 ranks with native weights pass. Elsewhere: gloo comm at world 2
    (test_profiler_comm.py), native weights from a plan's profile (test_launch.py), `plan` then
    `run` with native weights (test_plan_to_run.py, test_async_synthetic.py)."""
    gpus, weight_format = 3, "fp8"
    env = {**os.environ, "DEVICE": "cpu", "SMOKE": "1", "GPUS": str(gpus), "OUT": str(tmp_path),
           "PY": sys.executable, "OMP_NUM_THREADS": "1", "WEIGHT_FORMAT": weight_format}
    proc = subprocess.run(["bash", "benchmarks/gpu_multi.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    log = (tmp_path / "multi.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    assert not (tmp_path / "multi").exists()  # packed into the archive, then removed
    with tarfile.open(tmp_path / "multi.tgz") as tar:
        names = set(tar.getnames())
        assert "multi/plan_1.json" in names and "multi/run_1/iterations.jsonl" in names
        assert "multi/plan_2.json" not in names  # the smoke run plans its one pair
        summary = json.load(tar.extractfile("multi/run_1/summary.json"))
        assert summary["meta"]["plan"]["mode"] == "async"
        assert summary["meta"]["weight_format"] == weight_format
        split = summary["meta"]["plan"]["split"]  # disjoint draft and target ranks covering all
        assert sorted(split["draft_gpus"] + split["target_gpus"]) == list(range(gpus))
        tasks = {t["mode"]: t for t in summary["tasks"]}
        assert set(tasks) == {"async", "serial", "autoregressive"}, summary["tasks"]
        assert all(t["tokens_per_s_mean"] > 0 and t["prompts"] == 2 for t in tasks.values())
        assert tasks["async"]["predicted_tokens_per_s"] > 0  # measured against a prediction
        assert "multi/profile/comm.csv" in names and "multi/profile/compute.csv" in names
    assert "error:" not in log
