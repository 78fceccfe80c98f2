"""validation: predicted vs measured tokens/s, one point per configuration, y = x and a ±8 % band.

Inputs (-i, repeatable):
  a validation report CSV (`swiftspec validate -o DIR`), one row per configuration. Required
      columns: predicted_tokens_per_s, measured_tokens_per_s. Used when present: config, mode,
      policy, pair (or model_pair, or target + draft), error_pct (recomputed when absent, as
      100 · (measured - predicted) / predicted), acceptance, weights.
  a RunLog folder (`swiftspec run -o DIR`): one point per task with a prediction.
Default: the bundled report (swiftspec/data/results/validation-h200: `swiftspec validate` of three
Llama pairs on one H200, bf16 random weights, synthetic acceptance); of several bundled reports, the
newest by name (`newest_report`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from swiftspec.runtime.runlog import RunLog
from swiftspec.spec import UserError
from swiftspec.studies.figure import Progress, StudyOutput, bundled_results, finish, new_figure

NAME = "validation"
DESCRIPTION = "predicted vs measured tokens/s per configuration (y = x, ±8 % band); -i REPORT.csv or RUNLOG_DIR"
REQUIRED = ("predicted_tokens_per_s", "measured_tokens_per_s")
BAND = 0.08  # the goal: max |error| <= 8 %
MODE_STYLE = {"autoregressive": ("0.3", "o"), "chain": ("tab:green", "s"), "serial": ("tab:blue", "^"),
              "async": ("tab:red", "D")}


def read_report(path: str | Path) -> pd.DataFrame:
    """A validation report CSV -> DataFrame with at least REQUIRED, mode, config, error_pct."""
    p = Path(path)
    try:
        df = pd.read_csv(p)
    except (ValueError, pd.errors.ParserError) as e:
        raise UserError(f"validation report {p} is malformed: {str(e).splitlines()[0]}") from None
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise UserError(f"validation report {p} lacks columns {', '.join(missing)} "
                        f"(needs {', '.join(REQUIRED)}; from `swiftspec validate -o DIR`)")
    source = f"{p.parent.name}/{p.name}" if p.parent.name else p.name
    sibling = p.with_name("report.json")
    if sibling.is_file():  # `validate --repredict`, random or fp8 weights: its meta says so; the figure too
        try:
            meta = json.loads(sibling.read_text()).get("meta", {})
            if "repredicted" in meta:
                source += " (re-predicted)"
            weights = [f"{meta['weights']} weights"] if meta.get("weights") else []
            weights += [meta["weight_format"]] if meta.get("weight_format", "native") != "native" else []
            if weights:
                source += f" ({', '.join(weights)})"
        except (ValueError, AttributeError):
            pass
    return _normalise(df, source)


def read_runlog(path: str | Path) -> pd.DataFrame:
    """A RunLog folder -> one row per task that has a prediction."""
    log = RunLog.load(path)
    s = log.summary().rename(columns={"tokens_per_s_mean": "measured_tokens_per_s", "task": "config"})
    s = s.dropna(subset=["predicted_tokens_per_s"])
    m, plan = log.meta, log.meta.get("plan", {})
    s["pair"] = f"{Path(str(plan.get('target', '?'))).name} + {Path(str(plan.get('draft') or '-')).name}"
    s["acceptance"] = m.get("acceptance", "?")
    s["weights"] = m.get("weights", "?")
    return _normalise(s, Path(path).name)


def _normalise(df: pd.DataFrame, source: str) -> pd.DataFrame:
    df = df.copy()
    for c in REQUIRED:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    bad = df[list(REQUIRED)].isna().any(axis=1) | (df[list(REQUIRED)] <= 0).any(axis=1)
    if bad.all():
        raise UserError(f"{source}: no row has positive predicted and measured tokens/s")
    df = df[~bad]
    if "mode" not in df:
        df["mode"] = "?"
    if "config" not in df:
        df["config"] = [f"{m} {p}" if "policy" in df else str(m) for m, p in
                        zip(df["mode"], df.get("policy", df["mode"]))]
    if "pair" not in df:
        if "model_pair" in df:
            df["pair"] = df["model_pair"]
        elif "target" in df:
            df["pair"] = (df["target"].astype(str) + " + "
                          + df.get("draft", pd.Series("-", index=df.index)).fillna("-").astype(str))
        else:
            df["pair"] = ""
    if "error_pct" not in df or df["error_pct"].isna().all():
        df["error_pct"] = 100.0 * (df["measured_tokens_per_s"] - df["predicted_tokens_per_s"]) / df["predicted_tokens_per_s"]
    df["source"] = source
    return df


def _name_order(path: Path) -> list:
    """Sort key: the path's text with each run of digits compared as a number."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in re.split(r"(\d+)", str(path))]


def newest_report(folder: Path) -> Path | None:
    """The last by name of `folder`'s validation*.csv and validation*/report.csv, numbers compared as
    numbers (copies do not keep mtimes): validation_run12 after validation_run9, and validation_run3
    after validation; None when there is none."""
    reports = [*folder.glob("validation*.csv"), *folder.glob("validation*/report.csv")] if folder.is_dir() else []
    return max(reports, key=_name_order, default=None)


def load(inputs: Sequence[str | Path]) -> pd.DataFrame:
    paths = [Path(p) for p in inputs]
    if not paths:
        d = bundled_results()
        newest = newest_report(d)
        paths = [newest] if newest else sorted(p.parent for p in d.glob("*runlog*/summary.json"))
        if not paths:
            raise UserError(f"study {NAME}: no validation report or run log in {d}: run `swiftspec validate -o DIR` "
                            "and give -i DIR/<report>.csv")
    frames = []
    for p in paths:
        if p.is_dir() and (p / "summary.json").exists():
            frames.append(read_runlog(p))
        elif p.is_file() and p.suffix == ".csv":
            frames.append(read_report(p))
        else:
            raise UserError(f"study {NAME}: -i {p} is not a validation report CSV or a run log folder"
                            + ("" if p.exists() else " (it does not exist)"))
    return pd.concat(frames, ignore_index=True)


def draw(df: pd.DataFrame, title: str, label_points: bool = True):
    fig = new_figure(7.2, 6.6)
    ax = fig.add_subplot()
    hi = 1.1 * float(np.nanmax(df[list(REQUIRED)].to_numpy()))
    x = np.linspace(0, hi, 50)
    ax.fill_between(x, (1 - BAND) * x, (1 + BAND) * x, color="tab:green", alpha=0.12, label=f"±{BAND:.0%}")
    ax.plot(x, x, "k-", lw=1, label="y = x (perfect prediction)")
    for mode, g in df.groupby("mode", sort=False):
        color, marker = MODE_STYLE.get(mode, ("tab:purple", "o"))
        ax.scatter(g["predicted_tokens_per_s"], g["measured_tokens_per_s"], color=color, marker=marker, s=36,
                   edgecolors="black", linewidths=0.4, label=f"{mode} ({len(g)})", zorder=3)
    if label_points and len(df) <= 30:
        for r in df.itertuples():
            ax.annotate(str(r.config), (r.predicted_tokens_per_s, r.measured_tokens_per_s), textcoords="offset points",
                        xytext=(4, -3), fontsize=5, color="0.3")
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("predicted tokens/s (simulator)")
    ax.set_ylabel("measured tokens/s (runtime)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def main(inputs: Sequence[str | Path] = (), out_dir: str | Path = ".", progress: Progress = None) -> StudyOutput:
    df = load(inputs)
    err = df["error_pct"].abs()
    inside = float((err <= 100 * BAND).mean())
    title = (f"predicted vs measured: {len(df)} configurations, median |error| {err.median():.1f} %, "
             f"max {err.max():.1f} %, {inside:.0%} within ±{BAND:.0%}")
    fig = draw(df, title)
    labels = [f"inputs: {', '.join(sorted(df['source'].unique()))}"]
    pairs = sorted(p for p in df["pair"].fillna("").astype(str).unique() if p)
    if pairs:
        labels.append("pairs: " + ", ".join(pairs))
    for col in ("acceptance", "weights"):
        if col in df:
            labels.append(f"{col}: " + ", ".join(sorted(df[col].astype(str).unique())))
    synthetic = any("synthetic" in str(v) for v in df.get("acceptance", [])) or \
        any(str(v) == "random" for v in df.get("weights", []))
    notes = ["points with synthetic acceptance / random weights are latency validation, not acceptance validation"] \
        if synthetic else []
    worst = df.loc[err.idxmax()]
    notes.append(f"worst: {worst['config']} ({worst['pair']}): predicted {worst['predicted_tokens_per_s']:.1f}, "
                 f"measured {worst['measured_tokens_per_s']:.1f} tok/s ({worst['error_pct']:+.1f} %)")
    return finish(fig, NAME, inputs, out_dir, labels, notes)
