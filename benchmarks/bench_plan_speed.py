"""Time `swiftspec plan --gpus 8` (default settings) end to end; median of 3 runs.

Writes benchmarks/results/plan_speed.json with the machine's metadata. Target: <= 20 s on a
2-core CI machine. Run: python benchmarks/bench_plan_speed.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from swiftspec.files import atomic_write_text, run_metadata

OUT = Path(__file__).parent / "results" / "plan_speed.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    args = ap.parse_args()
    exe = shutil.which("swiftspec")
    cmd = ([exe] if exe else [sys.executable, "-m", "swiftspec"]) + ["plan", "--gpus", str(args.gpus)]
    times, cpu, load = [], [], []
    stdout = ""
    for _ in range(args.runs):
        load.append(os.getloadavg()[0])
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, check=True)
        times.append(time.perf_counter() - t0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        stdout = p.stdout
    result = {
        "benchmark": "plan_speed",
        "command": " ".join(["swiftspec", *cmd[-3:]]),
        "runs_s": [round(t, 3) for t in times],
        "median_s": round(statistics.median(times), 3),
        "target_s": 20.0,
        # CPU seconds (user + sys) of the command: what wall time would be on an idle machine
        "cpu_s": [round(c, 3) for c in cpu],
        "median_cpu_s": round(statistics.median(cpu), 3),
        "load_average_1min_before_each_run": load,
        "output": stdout.splitlines(),
        "meta": run_metadata(device="cpu"),
    }
    atomic_write_text(OUT, json.dumps(result, indent=2) + "\n")
    print(f"swiftspec plan --gpus {args.gpus}: median {result['median_s']} s over {args.runs} runs {result['runs_s']}"
          f" (cpu {result['median_cpu_s']} s, load {load}); wrote {OUT}")


if __name__ == "__main__":
    main()
