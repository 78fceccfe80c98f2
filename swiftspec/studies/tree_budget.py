"""tree-budget: mean accepted length and tokens/s against the tree budget bs (serial and async).

For each bs the planner searches serial (all GPUs) and async (every split) with w = min(8, bs)
and its d rule, on a short workload; the best configuration's mean accepted length (tokens per
verify, bonus included) and tokens/s are plotted. Measured points are overlaid where the
acceptance profile has them: the runtime's accepted lengths in its `accepted` dict (keys such as
`serial/bs8-w8-d4`), or, for the bundled synthetic profile, the paper's Table 7 means at bs = 8.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from swiftspec.sim.search import SearchSpace
from swiftspec.spec import Mode
from swiftspec.studies.figure import Progress, StudyOutput, finish, new_figure, sim_inputs, synthetic_notes
from swiftspec.studies.simulated import best, load

NAME = "tree-budget"
DESCRIPTION = "accepted length and tokens/s vs tree budget bs, serial and async (simulated; measured overlay); -i ACCEPTANCE.json"
BUDGETS = (2, 4, 8, 16, 32, 64)
STYLE = {"serial": ("tab:blue", "^"), "async": ("tab:red", "D"), "chain": ("tab:green", "s")}


def compute(inputs, budgets: Sequence[int] = BUDGETS, gpus: int = 8, w_max: int = 8,
            progress: Progress = None) -> pd.DataFrame:
    """One row per (mode, bs): mean_accepted, tokens_per_s, policy, draft_gpus, target_gpus, reason.

    inputs: `swiftspec.sim.search.Inputs`; w = min(w_max, bs, ranks the acceptance profile knows).
    """
    ranks = len(inputs.acceptance.draft_prob_by_rank)
    jobs = [(m, b) for m in (Mode.serial, Mode.async_) for b in budgets]
    rows = []
    for mode, bs in (progress(jobs) if progress else jobs):
        w = max(1, min(w_max, bs, ranks))
        space = SearchSpace(gpus=gpus, modes=(mode,), bs=bs, w=w, static_trees=False)
        b = best(inputs, space)
        r = b.row
        rows.append({"mode": mode.value, "bs": bs, "w": w,
                     "mean_accepted": np.nan if r is None else float(r.mean_accepted),
                     "tokens_per_s": np.nan if r is None else float(r.tokens_per_s_mean),
                     "policy": "" if r is None else r.policy,
                     "draft_gpus": 0 if r is None else int(r.draft_gpus),
                     "target_gpus": 0 if r is None else int(r.target_gpus), "reason": b.reason})
    return pd.DataFrame(rows)


def measured_points(acceptance) -> pd.DataFrame:
    """Accepted lengths measured outside the simulator: mode, bs, mean_accepted, label.

    From `AcceptanceProfile.accepted` (`mode/bsB-wW-dD` keys, the runtime's measurement), or the
    published means a synthetic profile was fitted to (`paper_serial_mean` / `paper_async_mean`).
    """
    rows = []
    for key, v in acceptance.accepted.items():
        m = re.match(r"(\w+)/(?:static-)?bs(\d+)", key)
        if m:
            rows.append({"mode": m.group(1), "bs": int(m.group(2)), "mean_accepted": float(v),
                         "label": f"measured by the runtime: {key}"})
    meta = acceptance.meta
    for mode in ("serial", "async"):
        v = meta.get(f"paper_{mode}_mean")
        if v is not None:
            bs = int(meta.get("fit", {}).get("bs", 8))
            rows.append({"mode": mode, "bs": bs, "mean_accepted": float(v),
                         "label": f"published (paper Table 7), {mode}, bs = w = {bs}"})
    return pd.DataFrame(rows, columns=["mode", "bs", "mean_accepted", "label"])


def draw(table: pd.DataFrame, measured: pd.DataFrame, title: str):
    fig = new_figure(11, 4.8)
    ax_a, ax_t = fig.subplots(1, 2)
    for mode, g in table.groupby("mode", sort=False):
        color, marker = STYLE.get(mode, ("0.3", "o"))
        g = g.sort_values("bs")
        ax_a.plot(g["bs"], g["mean_accepted"], color=color, marker=marker, label=f"{mode} (simulated)")
        ax_t.plot(g["bs"], g["tokens_per_s"], color=color, marker=marker, label=f"{mode} (simulated)")
        for r in g.dropna(subset=["tokens_per_s"]).itertuples():
            if mode == "async":
                ax_t.annotate(f"{r.draft_gpus}/{r.target_gpus}", (r.bs, r.tokens_per_s), textcoords="offset points",
                              xytext=(0, 6), ha="center", fontsize=6, color=color)
    for r in measured.itertuples():
        color, _ = STYLE.get(r.mode, ("0.3", "o"))
        published = r.label.startswith("published")
        ax_a.scatter([r.bs], [r.mean_accepted], s=90, marker="*" if published else "o",
                     facecolors=color if published else "none", edgecolors=color, linewidths=1.5, zorder=5,
                     label=r.label)
    for ax in (ax_a, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(table["bs"].unique()), [str(b) for b in sorted(table["bs"].unique())])
        ax.set_xlabel("tree budget bs (nodes verified per step)")
        ax.grid(alpha=0.3)
    ax_a.set_ylabel("mean accepted length (tokens per verify)")
    ax_a.set_title("accepted length", fontsize=10)
    ax_t.set_ylabel("tokens/s (simulated, best configuration)")
    ax_t.set_title("tokens/s (async: draft/target GPUs)", fontsize=10)
    ax_a.legend(fontsize=7)
    ax_t.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    return fig


def main(inputs: Sequence[str | Path] = (), out_dir: str | Path = ".", progress: Progress = None,
         budgets: Sequence[int] = BUDGETS, gpus: int = 8) -> StudyOutput:
    si = sim_inputs(inputs, NAME)
    inp = load(si.profile, si.acceptance)
    table = compute(inp, budgets=budgets, gpus=gpus, progress=progress)
    meas = measured_points(inp.acceptance)
    acc = inp.acceptance_ref.label
    name = "" if inp.acceptance.synthetic else f" ({inp.acceptance.meta.get('name', '?')})"
    title = (f"tree budget: acceptance {acc}{name}; timing {inp.target.name} + {inp.draft.name} on {gpus} GPUs, "
             f"w = min(8, bs), planner's d; 2 requests x 64 tokens")
    fig = draw(table, meas, title)
    missing = table[table["tokens_per_s"].isna()]
    notes = [f"not simulated: {r.mode} bs {r.bs} ({r.reason})" for r in missing.itertuples()]
    if inp.acceptance.synthetic:
        notes.insert(0, "accepted lengths come from a SYNTHETIC acceptance profile (fitted to published means)")
    labels = synthetic_notes(acc, inp.profile_ref.label)
    return finish(fig, NAME, inputs, out_dir, labels, notes)
