"""Fit `SplitCostModel` (tree attention's num_splits rule) to a measured num_splits sweep.

    python benchmarks/bench_kernels.py --fit-sweep            # on the GPU: ~2 minutes
    python benchmarks/fit_split_model.py SWEEP.csv            # the sweep it wrote

Least squares on the relative error of `SplitCostModel.time_us` (the library's own formula) over
every row of the sweep (impl "triton_sweep", one combine mode). Prints the fitted constants as a
`SplitCostModel(...)` expression, the rms and worst relative error, and how good the model's pick
is: per shape, the measured time at the modelled-best num_splits over the measured best.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from swiftspec.kernels.tree_attention import SplitCostModel

FITTED = ("fixed_us", "block_us_wide", "block_us_narrow", "ctas_per_sm_wide", "ctas_per_sm_narrow",
          "split_program_us", "combine_us", "merge_per_split_us", "partial_bytes_per_us")


def shape_args(r) -> tuple:
    """(rows, hkv, d, max_len, block_m, block_n) of one sweep row, at the tiles the fit sweeps ran
    (those before the tile sweeps: BLOCK_M 16..64 by the rows, BLOCK_N 64 at D 128, 128 below)."""
    hq, hkv = map(int, r.heads.split("/"))
    t, d, kv = int(r.queries), int(r.head_dim), int(r.kv)
    rows = t * hq // hkv
    return rows, hkv, d, kv, min(64, max(16, 1 << (rows - 1).bit_length())), 64 if d >= 128 else 128


def fit(df: pd.DataFrame, merge_over: str, num_sms: int = 132) -> tuple[SplitCostModel, pd.DataFrame]:
    """The fitted model and the sweep rows with `pred_us` and `rel_err` columns."""
    rows = df[df.impl == "triton_sweep"].reset_index(drop=True)
    args = [shape_args(r) for r in rows.itertuples()]
    splits, us = rows.num_splits.astype(int).to_numpy(), rows.us.to_numpy()
    start = SplitCostModel(merge_over=merge_over)

    def model(p: np.ndarray) -> SplitCostModel:
        return dataclasses.replace(start, **dict(zip(FITTED, map(float, p))))

    def residuals(p: np.ndarray) -> np.ndarray:
        m = model(p)
        return np.array([m.time_us(s, *a, num_sms=num_sms) for s, a in zip(splits, args)]) / us - 1

    p0 = [getattr(start, f) or 1.0 for f in FITTED]
    lo = [0, 0.1, 0.1, 0.2, 0.2, 0, 0, 0, 1e5]
    hi = [30, 10, 10, 8, 8, 30, 30, 10, 1e9]
    sol = least_squares(residuals, p0, bounds=(lo, hi))
    rows["rel_err"] = residuals(sol.x)
    rows["pred_us"] = us * (1 + rows["rel_err"])
    return model(sol.x), rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="bench_kernels.py output with triton_sweep rows")
    ap.add_argument("--combine", default="separate", choices=["separate", "kernel"])
    a = ap.parse_args(argv)
    try:
        df = pd.read_csv(a.csv)
    except (OSError, pd.errors.ParserError) as e:
        print(f"error: cannot read {a.csv}: {e}", file=sys.stderr)
        return 2
    if "combine" not in df or not len(df[(df.impl == "triton_sweep") & (df["combine"] == a.combine)]):
        print(f"error: {a.csv} has no triton_sweep rows with combine {a.combine}; run bench_kernels.py "
              "--fit-sweep first", file=sys.stderr)
        return 2
    df = df[df["combine"] == a.combine]
    model, rows = fit(df, "launched" if a.combine == "separate" else "active")
    key = ["heads", "kv", "queries"]
    pick = rows.loc[rows.groupby(key).pred_us.idxmin()].set_index(key).us
    ratio = pick / rows.groupby(key).us.min()
    consts = ", ".join(f"{f}={getattr(model, f):.4g}" for f in FITTED)
    print(f"SplitCostModel({consts}, merge_over={model.merge_over!r})")
    print(f"{len(rows)} rows, {len(ratio)} shapes: rms {np.sqrt((rows.rel_err ** 2).mean()):.3f}, "
          f"worst {rows.rel_err.abs().max():.3f}; pick / best: mean {ratio.mean():.3f}, worst {ratio.max():.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
