"""kernels: kernel and step latency against the HBM floor, from benchmark results.

Inputs (files, or folders: a folder gives its `kernels_*.json` grids, `attention_ws_*.json` results
and `bench_step_kernels-*.csv` results, else its `bench_step-*.csv` ones, sweeps left out). Default:
the bundled swiftspec/data/results/kernel-latency: `kernels_h200.json` (the tree-attention grid on
one H200), `attention_ws_h100.json` (Gluon against Triton on one H100) and
`bench_step_kernels-h200.csv` (Llama-3-70B TP-8 shard forwards, 1 and 16 tokens, on one H200).

  kernels_<date>.json / .csv   (benchmarks/bench_kernels.py) rows: kv, queries, heads, impl, us,
                               floor_us; impl `triton` (split-KV tree attention), `sdpa_mask`,
                               `sdpa_nomask`. Floor = bytes of K, V, q, out / copy bandwidth.
  bench_step-<tag>.csv         (benchmarks/bench_step.py) rows: model, tokens, kv_len, attention,
                               impl, median_ms, floor_ms; one decoder forward (CUDA graph replay),
                               floor = weight + KV bytes / copy bandwidth.
  attention_ws_<date>.json / .csv (benchmarks/bench_attention_ws.py) rows: kv, queries, heads,
                               impl, us, floor_us; impl `triton` (split-KV) and `ws` (the Gluon
                               warp-specialized kernel) on the many-row shapes, one GPU per file
                               (its `metadata.gpu`; the `_sweep` / `_bn128` / ... variants are
                               tile sweeps, taken only when named with -i).
  bench_step_kernels-<date>.csv (benchmarks/bench_step_kernels.py) its `kind` = step (or, from a
                               --paired run, paired) rows: the runtime's step per `fusion` (e.g.
                               triton+gemv, the CUDA default; triton+gemv+fp8, weight-only fp8
                               against its own one-byte floor), median over its rounds.

Panels: tree attention µs vs kv length for 32/8 and 8/1 heads (median over query counts, bars
from the fewest to the most queries); the Gluon kernel against the Triton one per many-row shape
(bars, its floor as a tick); and a whole forward's ms vs tokens per model and attention back end at
the smallest kv length, each with its floor. Each attention panel names the GPU its file was
measured on (files of different GPUs are never drawn in one panel's floor).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from swiftspec.spec import UserError
from swiftspec.studies.figure import Progress, StudyOutput, bundled_results, finish, new_figure

NAME = "kernels"
DESCRIPTION = "tree-attention and decoder-step latency vs the HBM floor (bundled H200/H100 results); -i FILES or DIR"
# the bundled default inputs, in swiftspec/data/results/kernel-latency
DEFAULT_RESULTS = ("kernels_h200.json", "attention_ws_h100.json", "bench_step_kernels-h200.csv")
KERNEL_COLUMNS = ("kv", "queries", "heads", "impl", "us", "floor_us")
STEP_COLUMNS = ("model", "tokens", "kv_len", "attention", "impl", "median_ms", "floor_ms")
ATTN_IMPLS = {"sdpa_mask": ("torch SDPA, boolean tree mask", "tab:gray"),
              "sdpa_nomask": ("torch SDPA, no mask", "0.6"),
              "triton": ("swiftspec Triton split-KV", "tab:red")}
WS_IMPLS = {"triton": ("Triton split-KV", "tab:red"), "ws": ("Gluon warp-specialized", "tab:blue")}
STEP_KERNEL_COLUMNS = ("kind", "model", "kv_len", "fusion", "tokens", "median_ms", "floor_ms")
STEP_IMPL = "swiftspec-replay"  # CUDA-graph replay of the runtime's forward (what the runtime does)


def _read_table(path: Path) -> pd.DataFrame:
    try:
        if path.suffix == ".json":
            d = json.loads(path.read_text())
            rows = d.get("rows") if isinstance(d, dict) else None
            if rows is None:
                raise UserError(f"{path}: expected a JSON object with a `rows` list (a benchmark result file)")
            return pd.DataFrame(rows)
        return pd.read_csv(path)
    except (ValueError, pd.errors.ParserError) as e:
        raise UserError(f"{path} is malformed: {str(e).splitlines()[0]}") from None


def _check(df: pd.DataFrame, cols: Sequence[str], path: Path) -> pd.DataFrame:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise UserError(f"{path} lacks columns {', '.join(missing)} (expected a bench_kernels / bench_step result)")
    return df


def _kernel_files(folder: Path) -> list[Path]:
    """bench_kernels.py grids in date order; not its `--fit-sweep` or `--tile-sweep` files
    (kernels_fit_*, kernels_tiles_*: sweeps only)."""
    return sorted(f for f in folder.glob("kernels_*.json") if not f.name.startswith(("kernels_fit_", "kernels_tiles_")))


def _ws_files(folder: Path) -> list[Path]:
    """bench_attention_ws.py results in date order, without its tile sweeps (`_sweep`, `_bn128`, ...)."""
    return sorted(f for f in folder.glob("attention_ws_*.json") if re.fullmatch(r"attention_ws_[\d-]+[a-z]?", f.stem))


def _gpu_of(path: Path) -> str:
    """The GPU a result file was measured on: its JSON `metadata.gpu` or `meta.gpu` (a CSV: the JSON
    beside it), or ""."""
    src = path.with_suffix(".json")
    try:
        d = json.loads(src.read_text()) if src.exists() else {}
    except ValueError:
        return ""
    meta = (d.get("metadata") or d.get("meta") or {}) if isinstance(d, dict) else {}
    gpu = meta.get("gpu", "") if isinstance(meta, dict) else ""
    return str(gpu).replace("NVIDIA ", "")


def _step_files(folder: Path) -> list[Path]:
    """Step results: the bench_step_kernels CSVs, else bench_step's."""
    bsk = sorted(folder.glob("bench_step_kernels-*.csv"))
    if bsk:
        return bsk
    return sorted(folder.glob("bench_step-*.csv"))


def _step_kernel_rows(df: pd.DataFrame) -> pd.DataFrame:
    """bench_step_kernels rows -> the step panel's columns: `attention` names the fusion mode
    (the line style), the median over rounds per (model, fusion, tokens, kv_len). Its `kind` =
    step rows, and the `paired` rows of a --paired run (each fusion's own median over rounds)."""
    s = df[df["kind"].isin(["step", "paired"])]
    if "tp" in s.columns:  # a TP shard (communication skipped) is labelled as one
        tp = s["tp"].fillna(1).astype(int)
        s = s.assign(model=s["model"].where(tp == 1, s["model"] + " TP " + tp.astype(str)))
    keys = ["model", "fusion", "tokens", "kv_len"]
    s = s.groupby(keys, as_index=False)[["median_ms", "floor_ms"]].median()
    return s.rename(columns={"fusion": "attention"}).assign(impl=STEP_IMPL)


def load_results(inputs: Sequence[str | Path]) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(kernel rows, step rows with a `source` column, file names used) from files or folders."""
    files: list[Path] = []
    for raw in inputs:
        p = Path(raw)
        if not p.exists():
            raise UserError(f"study {NAME}: -i {p} not found")
        files += _kernel_files(p) + _ws_files(p) + _step_files(p) if p.is_dir() else [p]
    if not inputs:
        d = bundled_results("kernel-latency")
        files = [d / f for f in DEFAULT_RESULTS if (d / f).is_file()]
        if not files:
            raise UserError(f"study {NAME}: no benchmark results in {d}: give -i kernels_<date>.json bench_step-<tag>.csv")
    kernels, steps = [], []
    for f in files:
        df = _read_table(f)
        if f.name.startswith("attention_ws_"):
            # the many-row comparison panel: its own impl names, so the kv panels never mix it in
            df = _check(df, KERNEL_COLUMNS, f)
            df = df[df["impl"].isin(list(WS_IMPLS))]
            kernels.append(df.assign(impl="ws:" + df["impl"], gpu=_gpu_of(f)))
        elif "floor_us" in df.columns or f.name.startswith("kernels_"):
            kernels.append(_check(df, KERNEL_COLUMNS, f).assign(gpu=_gpu_of(f)))
        elif f.name.startswith("bench_step_kernels") or "fusion" in df.columns:
            steps.append(_step_kernel_rows(_check(df, STEP_KERNEL_COLUMNS, f)).assign(source=f.stem, gpu=_gpu_of(f)))
        elif "floor_ms" in df.columns or f.name.startswith("bench_step"):
            steps.append(_check(df, STEP_COLUMNS, f).assign(source=f.stem, gpu=_gpu_of(f)))
        else:
            raise UserError(f"{f} is neither a kernel benchmark (floor_us) nor a step benchmark (floor_ms) result")
    k = pd.concat(kernels, ignore_index=True) if kernels else pd.DataFrame(columns=KERNEL_COLUMNS)
    s = pd.concat(steps, ignore_index=True) if steps else pd.DataFrame(columns=[*STEP_COLUMNS, "source"])
    if k.empty and s.empty:
        raise UserError(f"study {NAME}: the inputs hold no benchmark rows")
    return k, s, [f.name for f in files]


def draw(kernels: pd.DataFrame, steps: pd.DataFrame, title: str):
    impls = kernels.get("impl", pd.Series(dtype=str)).astype(str)
    ws = kernels[impls.str.startswith("ws:")]
    grid = kernels[~impls.str.startswith("ws:")]
    heads = [h for h in ("32/8", "8/1") if h in set(grid.get("heads", []))]
    n = len(heads) + (1 if len(ws) else 0) + (1 if len(steps) else 0)
    fig = new_figure(4.6 * max(n, 1), 4.8)
    axes = list(fig.subplots(1, max(n, 1), squeeze=False)[0])
    for ax, h in zip(axes, heads):
        k = grid[grid["heads"] == h]
        for impl, (label, color) in ATTN_IMPLS.items():
            g = k[k["impl"] == impl].groupby("kv")["us"]
            if not len(g):
                continue
            med, lo, hi = g.median(), g.min(), g.max()
            ax.errorbar(med.index, med.values, yerr=[med - lo, hi - med], marker="o", capsize=3, color=color,
                        label=label)
        floor = k.dropna(subset=["floor_us"]).groupby("kv")["floor_us"].median()
        ax.plot(floor.index, floor.values, "k--", label="HBM floor (bytes / copy bandwidth)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("kv length (cached tokens)")
        ax.set_ylabel("tree attention latency (µs)")
        q = sorted(k["queries"].unique())
        ax.set_title(f"tree attention, {h} heads, D 128 ({q[0]}-{q[-1]} queries){_gpus(k)}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    if len(ws):
        _draw_ws(axes[len(heads)], ws)
    if len(steps):
        ax = axes[len(heads) + (1 if len(ws) else 0)]
        kv = int(steps["kv_len"].min())
        s = steps[(steps["impl"] == STEP_IMPL) & (steps["kv_len"] == kv)]
        if s.empty:  # an older result without replay rows: the captured graph
            s = steps[(steps["kv_len"] == kv) & steps["impl"].str.contains("graph")]
        colors = dict(zip(sorted(s["model"].unique()), ("tab:blue", "tab:green", "tab:purple", "tab:brown")))
        styles = {a: ls for a, ls in zip(sorted(s["attention"].unique()), ("-", "-.", ":", (0, (5, 1))))}
        for (model, attn), g in s.groupby(["model", "attention"]):
            g = g.groupby("tokens")["median_ms"].median()
            ax.plot(g.index, g.values, marker="o", ms=3, color=colors[model], ls=styles[attn],
                    label=f"{model}, {attn}")
        for (model, _), g in s.groupby(["model", "attention"]):  # fp8 rows have their own floor
            f = g.groupby("tokens")["floor_ms"].median()
            ax.plot(f.index, f.values, color=colors[model], ls="--", lw=1, alpha=0.7)
        ax.plot([], [], "k--", lw=1, label="HBM floor (weights + KV / copy bandwidth)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens per forward")
        ax.set_ylabel("decoder forward latency (ms)")
        ax.set_title(f"one forward (CUDA graph replay), kv {kv}{_gpus(s)}", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    return fig


def _gpus(k: pd.DataFrame) -> str:
    gpus = sorted({g for g in k.get("gpu", pd.Series(dtype=str)).fillna("") if g})
    return f", {' + '.join(gpus)}" if gpus else ""


def _draw_ws(ax, ws: pd.DataFrame) -> None:
    """Gluon against Triton per many-row shape, its floor as a tick. Several files (GPUs): the last
    one given per shape and impl, since floors differ between GPUs."""
    ws = ws.drop_duplicates(["heads", "kv", "queries", "impl"], keep="last")
    shapes = ["heads", "kv", "queries"]
    us = ws.pivot(index=shapes, columns="impl", values="us").sort_index()
    floor = ws.groupby(shapes)["floor_us"].median().reindex(us.index)
    x = range(len(us))
    width = 0.8 / len(WS_IMPLS)
    for i, (impl, (label, color)) in enumerate(WS_IMPLS.items()):
        if f"ws:{impl}" in us.columns:
            ax.bar([j + (i - (len(WS_IMPLS) - 1) / 2) * width for j in x], us[f"ws:{impl}"], width, color=color,
                   label=label)
    ax.plot(list(x), floor.values, "k_", ms=14, mew=2, ls="none", label="HBM floor (bytes / copy bandwidth)")
    ax.set_xticks(list(x), [f"{h} kv{int(kv)} q{int(q)}" for h, kv, q in us.index], rotation=60, ha="right",
                  fontsize=6)
    ax.set_yscale("log")
    ax.set_xlabel("shape (heads, kv length, queries)")
    ax.set_ylabel("tree attention latency (µs)")
    ax.set_title(f"many-row shapes, Gluon vs Triton{_gpus(ws)}", fontsize=9)
    ax.grid(alpha=0.3, which="both", axis="y")
    ax.legend(fontsize=6, loc="lower left")


def main(inputs: Sequence[str | Path] = (), out_dir: str | Path = ".", progress: Progress = None) -> StudyOutput:
    kernels, steps, names = load_results(inputs)
    fp8 = len(steps) and steps["attention"].astype(str).str.contains("fp8").any()
    title = ("kernel and step latency against the HBM floor (bf16, batch 1"
             + ("; +fp8: weight-only fp8 GEMM weights, floor at one byte per weight)" if fp8 else ")"))
    fig = draw(kernels, steps, title)
    labels = [f"results: {', '.join(names)}"]
    if len(steps) and "weights" not in steps.columns:
        labels.append("step benchmarks use random weights at real shapes")
    return finish(fig, NAME, inputs, out_dir, labels)
