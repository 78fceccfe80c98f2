"""split-heatmap: predicted tokens/s of `async` over draft GPUs x target GPUs.

Each cell is the planner's best async configuration with that split pinned (bs = 16, w = 8, the
planner's d rule) on a short workload. Groups of up to 8 GPUs each, 8 GPUs per node, so cells with
more than 8 GPUs in all cross nodes. Empty cells: does not fit memory or the profile cannot time
it (the footer says which).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.patches import Rectangle

from swiftspec.sim.search import SearchSpace
from swiftspec.spec import Mode
from swiftspec.studies.figure import Progress, StudyOutput, finish, new_figure, sim_inputs, synthetic_notes
from swiftspec.studies.simulated import best, load

NAME = "split-heatmap"
DESCRIPTION = "predicted async tokens/s over draft GPUs x target GPUs (1..8 each, 8 per node); -i PROFILE_DIR / ACCEPTANCE.json"


def compute(inputs, max_group: int = 8, max_total: int = 16, gpus_per_node: int = 8, bs: int = 16, w: int = 8,
            progress: Progress = None) -> pd.DataFrame:
    """One row per (draft_gpus, target_gpus) with draft + target <= max_total: tokens_per_s (NaN with a
    `reason` when missing), mean_accepted, policy. inputs: `swiftspec.sim.search.Inputs`."""
    cells = [(k, m) for k in range(1, max_group + 1) for m in range(1, max_group + 1) if k + m <= max_total]
    rows = []
    for k, m in (progress(cells) if progress else cells):
        space = SearchSpace(gpus=k + m, modes=(Mode.async_,), draft_gpus=k, bs=bs, w=w,
                            gpus_per_node=min(gpus_per_node, k + m), static_trees=False)
        b = best(inputs, space)
        r = b.row
        rows.append({"draft_gpus": k, "target_gpus": m,
                     "tokens_per_s": np.nan if r is None else float(r.tokens_per_s_mean),
                     "mean_accepted": np.nan if r is None else float(r.mean_accepted),
                     "policy": "" if r is None else r.policy, "reason": b.reason})
    return pd.DataFrame(rows)


def draw(table: pd.DataFrame, title: str, gpus_per_node: int = 8):
    grid = table.pivot(index="target_gpus", columns="draft_gpus", values="tokens_per_s").sort_index()
    fig = new_figure(7.5, 6.2)
    ax = fig.add_subplot()
    vals = grid.to_numpy(dtype=float)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.92")
    im = ax.imshow(np.ma.masked_invalid(vals), origin="lower", cmap=cmap, aspect="auto",
                   extent=(grid.columns.min() - 0.5, grid.columns.max() + 0.5, grid.index.min() - 0.5,
                           grid.index.max() + 0.5))
    finite = vals[np.isfinite(vals)]
    top = finite.max() if finite.size else np.nan
    for (i, m), (j, k) in ((ij, kk) for ij in enumerate(grid.index) for kk in enumerate(grid.columns)):
        v = vals[i, j]
        if np.isfinite(v):
            best_cell = v == top
            ax.text(k, m, f"{v:.0f}", ha="center", va="center", fontsize=7,
                    color="black" if v > np.nanmin(finite) + 0.6 * (top - np.nanmin(finite)) else "white",
                    fontweight="bold" if best_cell else "normal")
            if best_cell:
                ax.add_patch(_box(k, m))
        elif not table[(table.draft_gpus == k) & (table.target_gpus == m)].empty:
            ax.text(k, m, "×", ha="center", va="center", fontsize=8, color="0.5")
    # cells above the staircase k + m = gpus_per_node need a second node
    cols = np.asarray(grid.columns, dtype=float)
    ax.stairs(gpus_per_node + 0.5 - cols, np.append(cols - 0.5, cols[-1] + 0.5), color="white", lw=1.2,
              ls="--", baseline=None)
    ax.set_xlim(grid.columns.min() - 0.5, grid.columns.max() + 0.5)
    ax.set_ylim(grid.index.min() - 0.5, grid.index.max() + 0.5)
    ax.set_xticks(list(grid.columns))
    ax.set_yticks(list(grid.index))
    ax.set_xlabel("draft GPUs (draft TP degree)")
    ax.set_ylabel("target GPUs (target TP degree)")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="tokens/s (simulated, async)")
    return fig


def _box(x: float, y: float):
    return Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, ec="red", lw=2)


def main(inputs: Sequence[str | Path] = (), out_dir: str | Path = ".", progress: Progress = None,
         max_group: int = 8) -> StudyOutput:
    si = sim_inputs(inputs, NAME)
    inp = load(si.profile, si.acceptance)
    table = compute(inp, max_group=max_group, progress=progress)
    title = (f"{inp.target.name} + {inp.draft.name}: async tokens/s by split (bs16-w8, planner's d)\n"
             "8 GPUs per node: cells above the dashed steps span two nodes; × = not simulated")
    fig = draw(table, title)
    missing = table[table["tokens_per_s"].isna()]
    notes = [f"× {why}: " + ", ".join(f"{k}/{m}" for k, m in zip(g["draft_gpus"], g["target_gpus"]))
             + " (draft/target)" for why, g in missing.groupby("reason", sort=False)]
    ok = table.dropna(subset=["tokens_per_s"])
    if len(ok):
        b = ok.loc[ok["tokens_per_s"].idxmax()]
        notes.insert(0, f"best: draft {b.draft_gpus} / target {b.target_gpus} GPUs, {b.policy}: "
                        f"{b.tokens_per_s:.1f} tok/s (mean accepted {b.mean_accepted:.2f})")
    labels = synthetic_notes(inp.acceptance_ref.label, inp.profile_ref.label)
    return finish(fig, NAME, inputs, out_dir, labels, notes)
