"""Derived profiles against what a GPU measured.

Without --h100: derives the H100 profile from the bundled H200 one (`swiftspec profile derive`,
the H100's spec) and compares its forward at 1 token with the device time per iteration that the
H100 measured for the autoregressive configurations of `bench_device_loop.py` (host loop: one graph
replay of one 1-token forward per iteration; the profile's row at its smallest KV length, 512).

With --h100 DIR (a profile measured on an H100 with the runtime's own kernels): row by row, every
forward row the two profiles share, both ways: the H100 derived from `h200-measured` against the
H100's, and the H200 derived from the H100's against `h200-measured`. The specs are the bundled
ones unless --h100-spec / --h200-spec name calibrated ones (`swiftspec profile calibrate`).
CPU only, seconds.

Usage: PYTHONPATH=. python benchmarks/check_derived.py --out DIR
       [--measured benchmarks/results/device_loop_h100/device_loop.csv]
       [--h100 DIR [--h100-spec SPEC] [--h200-spec SPEC]]
Writes DIR/derived_h100_check.json, and with --h100 also DIR/derived_rows.csv (one row per
compared forward row: direction, model, tp, tokens, kv_len, measured_ms, derived_ms, error_pct).
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
KEYS = ["model", "tp", "tokens", "kv_len"]


def forward_errors(derived: Profile, measured: Profile) -> pd.DataFrame:
    """The forward rows both profiles hold: measured_ms, derived_ms and error_pct (derived / measured - 1)."""
    pick = [(p.compute[p.compute["op"] == "forward"][[*KEYS, "ms"]]) for p in (measured, derived)]
    rows = pick[0].merge(pick[1], on=KEYS, suffixes=("_measured", "_derived"))
    rows = rows.rename(columns={"ms_measured": "measured_ms", "ms_derived": "derived_ms"})
    rows["error_pct"] = 100 * (rows["derived_ms"] / rows["measured_ms"] - 1)
    return rows


def _summary(rows: pd.DataFrame) -> dict:
    a = rows["error_pct"].abs()
    per_model = rows.assign(abs_error_pct=a).groupby("model")["abs_error_pct"].median().round(2).to_dict()
    return {"rows": len(rows), "median_abs_error_pct": float(a.median()), "p90_abs_error_pct": float(a.quantile(0.9)),
            "max_abs_error_pct": float(a.max()), "median_error_pct": float(rows["error_pct"].median()),
            "median_abs_error_pct_by_model": per_model}


def both_ways(h100: Profile, h100_ref: str, h100_spec: HardwareSpec, h200_spec: HardwareSpec) -> pd.DataFrame:
    """H200 -> H100 and H100 -> H200, each derived profile against the other GPU's measured one."""
    h200 = Profile.load("builtin:h200-measured")
    out = []
    for name, src, ref, a, b, measured in (("h200->h100", h200, "builtin:h200-measured", h200_spec, h100_spec, h100),
                                           ("h100->h200", h100, h100_ref, h100_spec, h200_spec, h200)):
        out.append(forward_errors(derive_profile(src, a, b, ref), measured).assign(direction=name))
    return pd.concat(out, ignore_index=True)[["direction", *KEYS, "measured_ms", "derived_ms", "error_pct"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for derived_h100_check.json (and derived_rows.csv)")
    ap.add_argument("--measured", default=str(RESULTS / "device_loop_h100" / "device_loop.csv"))
    ap.add_argument("--h100", default=None, help="a profile folder measured on an H100")
    ap.add_argument("--h100-spec", default="builtin:h100-sxm", help="the H100's spec (datasheet or calibrated)")
    ap.add_argument("--h200-spec", default="builtin:h200", help="the H200's spec (datasheet or calibrated)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    h100_spec, h200_spec = HardwareSpec.load(a.h100_spec), HardwareSpec.load(a.h200_spec)
    doc: dict = {"meta": {**run_metadata(), "h100_spec": a.h100_spec, "h200_spec": a.h200_spec}}
    if a.h100:
        rows = both_ways(Profile.load(a.h100), a.h100, h100_spec, h200_spec)
        rows.to_csv(out / "derived_rows.csv", index=False)
        doc["meta"]["measured"] = a.h100
        doc["directions"] = {d: _summary(g) for d, g in rows.groupby("direction")}
        print(json.dumps(doc["directions"], indent=1))
    else:
        src = Profile.load("builtin:h200-measured")
        h100 = derive_profile(src, h200_spec, h100_spec, "builtin:h200-measured")
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
        doc["meta"].update(measured=a.measured, derived=h100.label,
                           notes="measured: H100 device time per autoregressive iteration (graph replay of a 1-token "
                                 "forward, host loop); derived and h200: the profiles' forward at 1 token, KV 512")
        doc.update(rows=rows, median_abs_error_pct=float(table["error_pct"].abs().median()))
    (out / "derived_h100_check.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
