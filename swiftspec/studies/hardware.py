"""hardware: predicted tokens/s of the default pair across GPU types and GPU counts.

Each GPU's profile is what `plan --hardware NAME` plans from (`sim/derive.py`): the H200's is
measured, the H100's derived from it for the H100 (copy bandwidth measured on one), and the B200
and H20 are what-if parts derived from their datasheets, labelled so. For every GPU and count the
planner searches each mode on a pinned, small grid (autoregressive; chain k = 2..8; serial and
async at bs = 16, w = 8 with the planner's d rule; async over every split) on a short workload,
and the best configuration is plotted. The table is also written as `hardware.csv`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from swiftspec.files import atomic_write_text
from swiftspec.sim.derive import HARDWARE, hardware_profile_ref
from swiftspec.sim.hardware import HardwareSpec, gpu_of
from swiftspec.sim.search import Inputs, SearchSpace
from swiftspec.spec import Mode, UserError
from swiftspec.studies.figure import Progress, StudyOutput, finish, need_path, new_figure
from swiftspec.studies.simulated import best, load

NAME = "hardware"
DESCRIPTION = ("predicted tokens/s of the default pair on H100, H200 and what-if B200, H20 at 2, 4, 8 GPUs; "
               "-i ACCEPTANCE.json")
GPU_NAMES = ("h100", "h200", "b200", "h20")
COUNTS = (2, 4, 8)
STYLE = {"h100": ("tab:blue", "o"), "h200": ("tab:green", "s"), "b200": ("tab:red", "D"), "h20": ("tab:purple", "^")}


def kind_of(ref: str, spec: HardwareSpec, profile_source: str) -> str:
    """How a GPU's profile was obtained: measured; derived (a bundled profile derived from a
    measured one, e.g. the H100's, whose copy bandwidth was measured on one); what-if (datasheet):
    derived here for a GPU known only from its datasheet."""
    if profile_source == "measured":
        return "measured"
    if ref.startswith(HARDWARE):
        return f"what-if ({spec.source})"
    return "derived"


def gpu_inputs(name: str, acceptance: str | None) -> tuple[Inputs, HardwareSpec, str]:
    """The planner's inputs for GPU `name` (`GPU_NAMES`), its spec, and its kind (`kind_of`)."""
    ref = hardware_profile_ref(name)
    inp = load(ref, acceptance)
    hw = inp.profile.meta.get("hardware")
    row = gpu_of(str(inp.profile.meta.get("gpu", "")))
    spec = HardwareSpec.from_dict(hw) if isinstance(hw, dict) else HardwareSpec.load(f"builtin:{row.spec}")
    return inp, spec, kind_of(ref, spec, str(inp.profile.meta.get("source", "measured")))


def compute(gpus: Sequence[str] = GPU_NAMES, counts: Sequence[int] = COUNTS, acceptance: str | None = None,
            bs: int = 16, w: int = 8, progress: Progress = None) -> tuple[pd.DataFrame, dict[str, Inputs]]:
    """One row per (gpu, gpus): tokens_per_s of the best mode (NaN with `reason` when none can be
    given), mode, draft_gpus, target_gpus, policy, mean_accepted, kind, the spec's hbm_tb_s and
    bf16_tflops, and the profile's label. Also the inputs per GPU (their labels go in the footer)."""
    loaded = {g: gpu_inputs(g, acceptance) for g in gpus}
    jobs = [(g, n) for g in gpus for n in counts]
    rows = []
    for g, n in (progress(jobs) if progress else jobs):
        inp, spec, kind = loaded[g]
        found, reasons = [], []
        for mode in Mode:
            if mode is Mode.async_ and n < 2:
                continue
            pins = {"bs": bs, "w": w} if mode in (Mode.serial, Mode.async_) else {}
            b = best(inp, SearchSpace(gpus=n, modes=(mode,), static_trees=False, **pins))
            if b.row is None:
                reasons.append(f"{mode.value}: {b.reason}")
            else:
                found.append(b.row)
        top = max(found, key=lambda r: r.tokens_per_s_mean) if found else None
        rows.append({
            "gpu": g, "label": f"{spec.name.replace(' (what-if)', '')}: {kind}", "kind": kind, "gpus": n,
            "tokens_per_s": np.nan if top is None else float(top.tokens_per_s_mean),
            "mode": "" if top is None else top["mode"], "draft_gpus": 0 if top is None else int(top.draft_gpus),
            "target_gpus": 0 if top is None else int(top.target_gpus), "policy": "" if top is None else top.policy,
            "mean_accepted": np.nan if top is None else float(top.mean_accepted),
            "hbm_tb_s": spec.hbm_tb_s, "bf16_tflops": spec.bf16_tflops, "profile": inp.profile_ref.label,
            "reason": "" if top is not None else "; ".join(reasons),
        })  # fmt: skip
    return pd.DataFrame(rows), {g: v[0] for g, v in loaded.items()}


def draw(table: pd.DataFrame, title: str):
    fig = new_figure(8.5, 5.2)
    ax = fig.add_subplot()
    for g, t in table.groupby("gpu", sort=False):
        t = t.sort_values("gpus")
        color, marker = STYLE.get(g, ("0.3", "o"))
        what_if = t["kind"].iloc[0].startswith("what-if")
        ax.plot(t["gpus"], t["tokens_per_s"], color=color, marker=marker, ls="--" if what_if else "-",
                label=f"{t['label'].iloc[0]} ({t['hbm_tb_s'].iloc[0]:g} TB/s)")
        for r in t[t["tokens_per_s"].notna()].itertuples():
            split = f"{r.draft_gpus}/{r.target_gpus}" if r.mode == "async" else f"{r.target_gpus}"
            ax.annotate(f"{r.tokens_per_s:.0f} {r.mode} {split}", (r.gpus, r.tokens_per_s), textcoords="offset points",
                        xytext=(4, 4), fontsize=6, color=color)
    ax.set_xticks(sorted(table["gpus"].unique()))
    ax.set_xlabel("GPUs")
    ax.set_ylabel("tokens/s (predicted, best configuration)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(title="GPU: profile (copy bandwidth); dashed: what-if", fontsize=8, title_fontsize=8)
    return fig


def write_csv(table: pd.DataFrame, out_dir: str | Path) -> Path:
    """`<out_dir>/hardware.csv`, whole or not at all."""
    path = Path(out_dir) / f"{NAME}.csv"
    atomic_write_text(path, table.to_csv(index=False))
    return path


def main(inputs: Sequence[str | Path] = (), out_dir: str | Path = ".", progress: Progress = None,
         gpus: Sequence[str] = GPU_NAMES, counts: Sequence[int] = COUNTS) -> StudyOutput:
    acceptance = None
    for raw in inputs:
        p = need_path(raw, "input")
        if not (p.is_file() and p.suffix == ".json"):
            raise UserError(f"study {NAME}: -i {p} is not an acceptance profile JSON (each GPU's profile is its own: "
                            "`plan --hardware`)")
        acceptance = str(p)
    table, loaded = compute(gpus, counts, acceptance, progress=progress)
    first = next(iter(loaded.values()))
    title = (f"{first.target.name} + {first.draft.name}: best predicted tokens/s by GPU type and count\n"
             "serial/async bs16-w8 (planner's d), chain k=2..8; 2 requests x 64 tokens")
    fig = draw(table, title)
    labels = [footer_label(g, inp) for g, inp in loaded.items()]
    labels.append(f"acceptance: {first.acceptance_ref.label}")
    missing = table[table["tokens_per_s"].isna()]
    notes = [f"not shown: {r.gpu} on {r.gpus} GPUs ({r.reason})" for r in missing.itertuples()]
    out = finish(fig, NAME, inputs, out_dir, labels, notes)
    out.paths.append(write_csv(table, out_dir))
    return out


def footer_label(gpu: str, inp: Inputs) -> str:
    """`h200: measured, ... (builtin:h200-measured)`; a derived profile by its source's name, not
    its long label (the measured profile's own line gives that)."""
    meta, ref = inp.profile.meta, inp.profile_ref
    origin, hw = meta.get("derived_from"), meta.get("hardware")
    if meta.get("source") == "derived" and isinstance(origin, dict) and isinstance(hw, dict):
        return f"{gpu}: derived from {origin.get('profile', '?')} for {hw.get('name', '?')} ({hw.get('source', '?')}) ({ref.path})"
    return f"{gpu}: {ref.label} ({ref.path})"
