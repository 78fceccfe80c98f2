"""`swiftspec profile check DIR`: how well the latency model predicts points it did not see.

Hold-out by grid line: for each op and each *interior* value v of one axis (a token count or a
KV length strictly inside a table's range), drop that op's rows at v from every (op, model, tp)
table, build the simulator's `LatencyModel` from the rest, and predict the dropped rows. The
relative error (predicted / measured - 1) of every dropped row is reported, and per op its
median and max |error|. Interior lines only: the latency model refuses to extrapolate, so an end
line cannot be predicted from the others.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from swiftspec.sim.latency import LatencyModel
from swiftspec.spec import Profile, UserError

CHECK_OPS = ("layers", "forward", "lm_head", "embed", "tree_growth", "kv_compact")


def holdout_errors(profile: Profile, ops: tuple[str, ...] = CHECK_OPS) -> pd.DataFrame:
    """One row per held-out point: op, model, tp, tokens, kv_len, axis, measured, predicted, err."""
    c = profile.compute
    rows = []
    for op in ops:
        sub = c[c["op"] == op]
        if sub.empty:
            continue
        for axis in ("tokens", "kv_len"):
            ranges = sub.groupby(["model", "tp"])[axis].agg(["min", "max", "nunique"])
            for v in sorted(sub[axis].unique()):
                inside = ranges[(ranges["min"] < v) & (ranges["max"] > v) & (ranges["nunique"] >= 3)].index
                if len(inside) == 0:
                    continue
                keys = set(inside)
                in_keys = np.array([(m, t) in keys for m, t in zip(c["model"], c["tp"])], dtype=bool)
                held = ((c["op"] == op) & (c[axis] == v)).to_numpy() & in_keys
                reduced = Profile(compute=c[~held], comm=profile.comm, meta=profile.meta)
                lat = LatencyModel(reduced)
                for r in c[held].itertuples(index=False):
                    pred = lat.op_ms(op, r.model, int(r.tp), int(r.tokens), float(r.kv_len))
                    rows.append((op, r.model, int(r.tp), int(r.tokens), int(r.kv_len), axis, float(r.ms), pred,
                                 pred / r.ms - 1 if r.ms > 0 else np.nan))  # fmt: skip
    return pd.DataFrame(
        rows, columns=["op", "model", "tp", "tokens", "kv_len", "axis", "measured", "predicted", "err"]
    )


def summarize_errors(errors: pd.DataFrame) -> pd.DataFrame:
    """Per op: held-out points, median and max |relative error| (fractions, 0.03 = 3 %)."""
    if errors.empty:
        return pd.DataFrame(columns=["op", "points", "median_abs_err", "max_abs_err"])
    e = errors.assign(abs_err=errors["err"].abs())
    out = e.groupby("op")["abs_err"].agg(points="size", median_abs_err="median", max_abs_err="max").reset_index()
    total = pd.DataFrame([{"op": "all", "points": len(e), "median_abs_err": e["abs_err"].median(),
                           "max_abs_err": e["abs_err"].max()}])  # fmt: skip
    return pd.concat([out, total], ignore_index=True)


def check_profile(folder: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Load a profile folder and return (per-point errors, per-op summary)."""
    prof = Profile.load(folder)
    errors = holdout_errors(prof)
    if errors.empty:
        raise UserError(f"profile {folder} has no grid with 3 or more values on an axis: nothing to hold out")
    return errors, summarize_errors(errors)
