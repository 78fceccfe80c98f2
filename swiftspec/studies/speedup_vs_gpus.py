"""speedup-vs-gpus: simulated best tokens/s of each mode against GPU count (1..16, 8 per node).

For every GPU count and mode the planner searches a pinned, small grid (autoregressive; chain with
k = 2..8; serial and async with bs = 16, w = 8 and the planner's d rule; async over every split)
on a short workload (2 requests x 64 tokens), and the best configuration is plotted. Points the
planner cannot give (does not fit memory, the profile has no rows at that TP degree) are missing,
and the footer says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from swiftspec.sim.search import SearchSpace
from swiftspec.spec import Mode
from swiftspec.studies.figure import Progress, StudyOutput, finish, new_figure, sim_inputs, synthetic_notes
from swiftspec.studies.simulated import best, load

NAME = "speedup-vs-gpus"
DESCRIPTION = "simulated best tokens/s per mode vs GPU count 1..16 (8 per node); -i PROFILE_DIR / ACCEPTANCE.json"
MODE_STYLE = {"autoregressive": ("0.3", "o"), "chain": ("tab:green", "s"), "serial": ("tab:blue", "^"),
              "async": ("tab:red", "D")}


def compute(inputs, gpus: Sequence[int] = tuple(range(1, 17)), gpus_per_node: int = 8, bs: int = 16, w: int = 8,
            progress: Progress = None) -> pd.DataFrame:
    """One row per (gpus, mode): tokens_per_s, mean_accepted, draft_gpus, target_gpus, policy, reason.

    inputs: `swiftspec.sim.search.Inputs`. tokens_per_s is NaN where `reason` says why.
    """
    jobs = [(n, m) for n in gpus for m in Mode]
    rows = []
    for n, mode in (progress(jobs) if progress else jobs):
        if mode is Mode.async_ and n < 2:
            rows.append({"gpus": n, "mode": mode.value, "tokens_per_s": np.nan, "reason": "async needs >= 2 GPUs"})
            continue
        pins = {"bs": bs, "w": w} if mode in (Mode.serial, Mode.async_) else {}
        space = SearchSpace(gpus=n, modes=(mode,), gpus_per_node=min(gpus_per_node, n), static_trees=False, **pins)
        b = best(inputs, space)
        r = b.row
        rows.append({
            "gpus": n, "mode": mode.value,
            "tokens_per_s": np.nan if r is None else float(r.tokens_per_s_mean),
            "mean_accepted": np.nan if r is None else float(r.mean_accepted),
            "draft_gpus": 0 if r is None else int(r.draft_gpus), "target_gpus": 0 if r is None else int(r.target_gpus),
            "policy": "" if r is None else r.policy, "reason": b.reason,
        })  # fmt: skip
    return pd.DataFrame(rows)


def draw(table: pd.DataFrame, title: str, gpus_per_node: int = 8):
    fig = new_figure(8.5, 5.2)
    ax = fig.add_subplot()
    for mode, (color, marker) in MODE_STYLE.items():
        t = table[table["mode"] == mode].sort_values("gpus")
        if t["tokens_per_s"].notna().any():
            ax.plot(t["gpus"], t["tokens_per_s"], color=color, marker=marker, label=mode)
    for r in table[(table["mode"] == "async") & table["tokens_per_s"].notna()].itertuples():
        ax.annotate(f"{int(r.draft_gpus)}/{int(r.target_gpus)}", (r.gpus, r.tokens_per_s), textcoords="offset points",
                    xytext=(0, 6), ha="center", fontsize=6, color="tab:red")
    n_max = int(table["gpus"].max())
    for edge in range(gpus_per_node, n_max, gpus_per_node):
        ax.axvline(edge + 0.5, color="0.6", ls=":", lw=1)
        ax.text(edge + 0.6, ax.get_ylim()[1], "next node", fontsize=7, color="0.4", va="top")
    ax.set_xticks(sorted(table["gpus"].unique()))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s (simulated, best configuration)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="mode (async: draft/target GPUs)", fontsize=8, title_fontsize=8)
    return fig


def main(inputs: Sequence[str | Path] = (), out_dir: str | Path = ".", progress: Progress = None,
         gpus: Sequence[int] = tuple(range(1, 17))) -> StudyOutput:
    si = sim_inputs(inputs, NAME)
    inp = load(si.profile, si.acceptance)
    table = compute(inp, gpus=gpus, progress=progress)
    title = (f"{inp.target.name} + {inp.draft.name}: best simulated tokens/s by GPU count\n"
             f"serial/async bs16-w8 (planner's d), chain k=2..8; 2 requests x 64 tokens")
    fig = draw(table, title)
    missing = table[table["tokens_per_s"].isna()]
    notes = ["not shown: " + m + " on " + ", ".join(f"{_ranges(g['gpus'])} GPUs ({why})"
                                                   for why, g in grp.groupby("reason", sort=False))
             for m, grp in missing.groupby("mode", sort=False)]
    labels = synthetic_notes(inp.acceptance_ref.label, inp.profile_ref.label)
    return finish(fig, NAME, inputs, out_dir, labels, notes)


def _ranges(values) -> str:
    """[1, 9, 10, 11] -> '1, 9-11'."""
    vals, out = sorted(int(v) for v in values), []
    for v in vals:
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)
