"""timeline: iteration Gantt of draft and target work, simulated and measured, side by side.

Input: a RunLog folder (`swiftspec run -o DIR`). The measured panel draws one prompt of one task
(the plan's mode): draft expansions, the draft leader waiting for the verdict, KV commit, and the
target's verify. The simulated panel re-simulates the same configuration on the run's own workload
(`swiftspec.sim.predict_run`: the prompt's length, the run's max_new_tokens and, with synthetic
acceptance, the very rank path the run replayed), so both panels decode the same tokens.
Iteration 0 is left out of both (first-call warm-up); times are ms from the start of iteration 1.

Default run log: the bundled swiftspec/data/results/runlog-h200-async (benchmarks/bench_async_gpu.py
on one H200: Llama-3-8B + Llama-3.2-1B shapes, random bf16 weights, synthetic acceptance, draft and
target processes sharing the one GPU; prompt 0 of each task). Without a run log, only the simulated
panel is drawn, for the planner's best async configuration of the default pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from swiftspec.runtime.runlog import RunLog
from swiftspec.sim.acceptance import AcceptanceModel
from swiftspec.sim.latency import LatencyModel
from swiftspec.sim.predict_run import RunWorkload, predict_run
from swiftspec.sim.search import SearchSpace, load_inputs, predict_plan
from swiftspec.spec import Mode, Plan, Split, TreePolicy, UserError
from swiftspec.studies.figure import (
    Progress,
    StudyOutput,
    bundled_results,
    finish,
    new_figure,
    synthetic_notes,
)
from swiftspec.studies.simulated import STUDY_WORKLOAD, best, load

NAME = "timeline"
DESCRIPTION = "iteration Gantt of draft/target work, simulated vs measured; -i RUNLOG_DIR [PROFILE_DIR] [ACCEPTANCE.json]"
ITERATIONS = 12
COLORS = {"draft": "tab:blue", "target": "tab:red", "wait": "0.85", "commit": "tab:orange", "sync": "tab:orange"}


def default_runlog() -> Path | None:
    """The bundled run log (a folder named *runlog* with summary.json under swiftspec/data/results),
    the last by name if there are several; None without one."""
    found = sorted(bundled_results().glob("*runlog*/summary.json"))
    return found[-1].parent if found else None


def _window(df: pd.DataFrame, iterations: int) -> pd.DataFrame:
    """Iterations 1..iterations of one prompt, times shifted to start at 0 (iteration 0 is warm-up)."""
    w = df[(df["iteration"] >= 1) & (df["iteration"] <= iterations)].copy()
    if w.empty:
        w = df.head(iterations).copy()
    cols = [c for c in w.columns if c.endswith("_ms") and c not in ("draft_gpu_ms", "target_gpu_ms", "commit_ms",
                                                                    "target_wait_ms")]
    t0 = np.nanmin(w[[c for c in ("draft_start_ms", "target_start_ms") if c in w]].to_numpy(dtype=float))
    for c in cols:
        w[c] = w[c].astype(float) - t0
    return w


def _bars(ax, y: float, starts, ends, color: str, label: str, hatch: str | None = None) -> None:
    spans = [(s, e - s) for s, e in zip(starts, ends) if math.isfinite(s) and math.isfinite(e) and e > s]
    if spans:
        ax.broken_barh(spans, (y - 0.35, 0.7), facecolors=color, edgecolor="black", linewidth=0.4, hatch=hatch,
                       label=label)


def draw_measured(ax, w: pd.DataFrame, title: str) -> None:
    f = lambda c: w[c].to_numpy(dtype=float) if c in w else np.full(len(w), np.nan)  # noqa: E731
    _bars(ax, 1, f("draft_start_ms"), f("draft_end_ms"), COLORS["draft"], "draft expansions")
    _bars(ax, 1, f("wait_start_ms"), f("wait_end_ms"), COLORS["wait"], "draft waits for verdict", "//")
    commit0 = np.where(np.isfinite(f("wait_end_ms")), f("wait_end_ms"), f("target_end_ms"))
    _bars(ax, 1, commit0, commit0 + np.nan_to_num(f("commit_ms")), COLORS["commit"], "KV commit / re-root")
    _bars(ax, 0, f("target_start_ms"), f("target_end_ms"), COLORS["target"], "target verify")
    _accepted(ax, w)
    _style(ax, title)


def draw_simulated(ax, w: pd.DataFrame, title: str) -> None:
    f = lambda c: w[c].to_numpy(dtype=float)  # noqa: E731
    _bars(ax, 1, f("draft_start_ms"), f("draft_end_ms"), COLORS["draft"], "draft expansions")
    _bars(ax, 1, f("sync_start_ms"), f("sync_end_ms"), COLORS["sync"], "sync (verdict, compaction)")
    _bars(ax, 0, f("target_start_ms"), f("target_end_ms"), COLORS["target"], "target verify (+ compaction)")
    _accepted(ax, w)
    _style(ax, title)


def _accepted(ax, w: pd.DataFrame) -> None:
    for r in w.itertuples():
        s, e = float(r.target_start_ms), float(r.target_end_ms)
        if math.isfinite(s) and math.isfinite(e):
            ax.text((s + e) / 2, -0.5, f"+{int(r.accepted)}", ha="center", va="top", fontsize=6, color="0.3")


def _style(ax, title: str) -> None:
    ax.set_yticks([0, 1], ["target", "draft"])
    ax.set_ylim(-0.9, 2.1)
    ax.set_xlabel("time (ms from the start of iteration 1)")
    ax.set_ylabel("GPU group")
    ax.set_title(title, fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=7, ncols=4, loc="upper right")


def _pick_task(log, plan: Plan) -> str:
    s = log.summary()
    own = s[s["mode"] == plan.mode.value]
    return str((own if len(own) else s)["task"].iloc[0])


def simulate_run(log, task: str, prompt: int, profile: str | None, acceptance: str | None):
    """Re-simulate `task` of a RunLog on its own workload; returns (timeline DataFrame, Inputs)."""
    plan = Plan.from_dict(log.meta["plan"], where="run log plan")
    def own(ref):
        return ref.path if ref is not None and not ref.path.startswith("builtin:") and Path(ref.path).exists() else None

    prof = profile or own(plan.profile)
    if prof is None and plan.device == "cpu":
        raise UserError("the run log is from a CPU run: give its CPU profile too, -i PROFILE_DIR "
                        "(from `swiftspec profile compute --device cpu`)")
    inputs = load_inputs(plan.target, plan.draft, prof, acceptance or own(plan.acceptance), plan.device)
    it = log.iterations[(log.iterations["task"] == task) & (log.iterations["prompt"] == prompt)]
    mode = Mode.parse(str(it["mode"].iloc[0]))
    pr = log.prompts[(log.prompts["task"] == task) & (log.prompts["prompt"] == prompt)].iloc[0]
    max_new = int(log.meta.get("max_new_tokens", len(pr["tokens"])))
    policy = plan.policy if mode is plan.mode else _policy_of(str(it["policy"].iloc[0]), plan)
    split = plan.split if mode is plan.mode else Split.shared(int(log.meta.get("colocated_ranks", plan.split.num_gpus)),
                                                              with_draft=mode is not Mode.autoregressive)
    acc = AcceptanceModel(inputs.acceptance)
    path = acc.request_paths(1, max_new + 64, 0)[0]
    if "ranks" in it and it["ranks"].notna().all():  # the rank path the synthetic verifier replayed
        replayed = [int(r) for rs in it.sort_values("iteration")["ranks"] for r in rs]
        path = np.concatenate([np.asarray(replayed, dtype=np.int64), path])
    prompt_len = int(it.sort_values("iteration")["kv_len"].iloc[0]) + 1 if "kv_len" in it else 256
    res = predict_run(LatencyModel(inputs.profile), acc, inputs.target, inputs.draft if mode is not Mode.autoregressive
                      else None, split, mode, policy, RunWorkload([prompt_len], max_new, [path]), plan.gpus_per_node)
    return res.timeline, inputs


def _policy_of(key: str, plan: Plan):
    if key == "bs1-w1-d0":
        return TreePolicy.autoregressive()
    parts = dict((p[0], int(p[1:])) for p in key.split("-") if p[:1] in "bwd" and p[1:].isdigit())
    return TreePolicy(bs=int(key.split("-")[0][2:]), w=parts.get("w", 1), d=parts.get("d", 0))


def main(inputs: Sequence[str | Path] = (), out_dir: str | Path = ".", progress: Progress = None,
         iterations: int = ITERATIONS) -> StudyOutput:
    runlog = profile = acceptance = None
    for raw in inputs:
        p = Path(raw)
        if p.is_dir() and (p / "summary.json").exists():
            runlog = p
        elif p.is_dir() and (p / "compute.csv").exists():
            profile = str(p)
        elif p.is_file() and p.suffix == ".json":
            acceptance = str(p)
        else:
            raise UserError(f"study {NAME}: -i {p} is not a run log folder (with summary.json), a profile folder "
                            "or an acceptance profile JSON" + ("" if p.exists() else " (it does not exist)"))
    given = runlog is not None
    runlog = runlog or default_runlog()
    fig = new_figure(11, 6.2)
    ax_s, ax_m = fig.subplots(2, 1)
    labels, notes = [], []
    if runlog is not None:
        log = RunLog.load(runlog)
        if "plan" not in log.meta or log.iterations.empty:
            raise UserError(f"run log {runlog} has no plan in summary.json meta or no iterations")
        plan = Plan.from_dict(log.meta["plan"], where=f"run log {runlog} plan")
        task = _pick_task(log, plan)
        sim, inp = simulate_run(log, task, 0, profile, acceptance)
        meas = log.iterations[(log.iterations["task"] == task) & (log.iterations["prompt"] == 0)].sort_values("iteration")
        m = log.meta
        hw = m.get("gpu", m.get("device", "?"))
        draw_measured(ax_m, _window(meas, iterations),
                      f"measured: {task}, prompt 0 ({m.get('device', '?')}, {hw}, {m.get('dtype', '?')}; "
                      f"weights {m.get('weights', '?')}, acceptance {m.get('acceptance', '?')})")
        shown = runlog if given else f"{runlog.name} (bundled)"
        labels += [f"run log: {shown}", f"weights: {m.get('weights', '?')}", f"run acceptance: {m.get('acceptance', '?')}"]
        if m.get("shared_devices"):
            notes.append("measured ranks shared one GPU (gloo link): host-side timing, not a disaggregated run")
        what = f"{task}, the run's workload"
    else:
        inp = load(profile, acceptance)
        b = best(inp, SearchSpace(gpus=8, modes=(Mode.async_,), bs=16, w=8, static_trees=False))
        if b.row is None:
            raise UserError(f"study {NAME}: the planner found no async configuration on 8 GPUs ({b.reason})")
        r = b.row
        plan = Plan(target=inp.target_name, draft=inp.draft_name, split=Split.disaggregated(int(r.draft_gpus),
                    int(r.target_gpus)), mode=Mode.async_, policy=TreePolicy(bs=int(r.bs), w=int(r.w), d=int(r.d)))
        sim = predict_plan(plan, inp, STUDY_WORKLOAD.__class__(prompt_len=256, max_new_tokens=64, requests=1)).timeline
        what = f"async {int(r.draft_gpus)}/{int(r.target_gpus)} GPUs {r.policy}, planner's best on 8 GPUs"
        ax_m.text(0.5, 0.5, "no run log: give one with -i RUNLOG_DIR (from `swiftspec run --plan P -o DIR`)",
                  ha="center", va="center", transform=ax_m.transAxes, fontsize=9, color="0.3")
        ax_m.set_xlabel("time (ms from the start of iteration 1)")
        ax_m.set_ylabel("GPU group")
        ax_m.set_title("measured: no run log", fontsize=9)
        ax_m.set_yticks([])
        notes.append("no measured run log given or bundled")
    sim0 = sim[sim["request"] == sim["request"].min()].sort_values("iteration")
    draw_simulated(ax_s, _window(sim0, iterations),
                   f"simulated: {inp.target.name} + {inp.draft.name if inp.draft else '-'}, {what} (SimPy)")
    labels = synthetic_notes(inp.acceptance_ref.label, inp.profile_ref.label) + labels
    fig.suptitle(f"iteration timeline, iterations 1-{iterations}: draft and target work (+n: tokens accepted)",
                 fontsize=10)
    return finish(fig, NAME, inputs, out_dir, labels, notes)
