"""The derived H100 profile against what an H100 measured: one-token forwards of three models.

Derives the H100 profile from the bundled H200 one (`swiftspec profile derive`, datasheet spec of
the H100) and compares its forward at 1 token with the device time per iteration that the H100
measured for the autoregressive configurations of `bench_device_loop.py` (host loop: one graph
replay of one 1-token forward per iteration, prompts of tens of tokens; the profile's row at its
smallest KV length, 512). CPU only, seconds.

Usage: PYTHONPATH=. python benchmarks/check_derived.py --out DIR
       [--measured benchmarks/results/device_loop_h100/device_loop.csv]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from swiftspec.files import run_metadata
from swiftspec.sim.derive import derive_profile
from swiftspec.sim.hardware import HardwareSpec
from swiftspec.sim.latency import LatencyModel
from swiftspec.spec import Profile

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for derived_h100_check.json")
    ap.add_argument("--measured", default=str(RESULTS / "device_loop_h100" / "device_loop.csv"))
    a = ap.parse_args()
    src = Profile.load("builtin:h200-measured")
    h100 = derive_profile(src, HardwareSpec.load("builtin:h200"), HardwareSpec.load("builtin:h100-sxm"),
                          "builtin:h200-measured")
    derived, h200 = LatencyModel(h100), LatencyModel(src)
    d = pd.read_csv(a.measured)
    ar = d[(d["mode"] == "autoregressive") & (d["loop"] == "host")].groupby("config")["device_ms"].median()
    rows = []
    for config, ms in ar.items():
        model = config.split()[0]
        p = derived.op_ms("forward", model, 1, 1, 512)
        q = h200.op_ms("forward", model, 1, 1, 512)
        rows.append({"model": model, "measured_h100_ms": ms, "derived_h100_ms": p, "error_pct": 100 * (p / ms - 1),
                     "h200_profile_ms": q, "h200_profile_error_pct": 100 * (q / ms - 1)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"meta": {**run_metadata(), "measured": a.measured, "derived": h100.label,
                    "notes": "measured: H100 device time per autoregressive iteration (graph replay of a 1-token "
                             "forward, host loop); derived and h200: the profiles' forward at 1 token, KV 512"},
           "rows": rows, "median_abs_error_pct": float(table["error_pct"].abs().median())}
    (out / "derived_h100_check.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
