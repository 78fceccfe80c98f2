"""RunLog: what `swiftspec run` measured, and how it compares with the plan's prediction.

Three tables, written as one folder (`RunLog.write`; the folder appears complete or not at all):

  iterations.jsonl  one row per (task, prompt, iteration). Times in ms from the prompt's start
                    (all ranks pass a barrier after prefill, then each leader reads its clock):
                    draft_start_ms / draft_end_ms   draft work of the iteration (immediate + overlapped
                                                    expansions; serial: all expansions)
                    draft_gpu_ms                    device time of those draft forwards (CUDA events;
                                                    perf_counter on CPU)
                    send_ms                         subtree handed to the link (async)
                    wait_start_ms / wait_end_ms     draft leader blocked on the verdict (async)
                    target_start_ms / target_end_ms target verify forward + accept decision
                    target_gpu_ms                   device time of the verify forward
                    target_wait_ms                  target leader blocked on the next subtree
                    commit_ms                       KV moves + re-root after the verify
                    accepted, sent, tree_size, kept, draft_forwards, draft_tokens, kv_len, ranks
  prompts.jsonl     one row per (task, prompt): tokens (ids), tokens_per_s, decode_s, prefill_ms,
                    iterations, mean_accepted
  summary.json      per task: tokens/s mean, p50, p95 (the slow tail: 5th percentile over prompts),
                    mean accepted length, iteration ms, the prediction and the error %, plus `meta`
                    (plan, weights, acceptance label, device, hardware and command).
"""

from __future__ import annotations

import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from swiftspec.files import atomic_dir
from swiftspec.spec import (
    UserError,
    check_dict,
    check_int,
    check_list,
    check_number,
    check_str,
    parse_json,
    read_text,
    require,
    to_jsonable,
)


class SpanTimer:
    """Device time of spans of work: CUDA events on GPU (resolved once, at `collect`), else host time.

    `t = timer.begin(); ...; timer.end(t)` records one span; `collect()` returns their ms in order
    and clears the timer (one device sync).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans: list = []

    def begin(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def end(self, start) -> None:
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.spans.append((start, ev))
        else:
            self.spans.append((time.perf_counter() - start) * 1e3)

    def collect(self) -> list[float]:
        if self.cuda and self.spans:
            self.spans[-1][1].synchronize()
            out = [a.elapsed_time(b) for a, b in self.spans]
        else:
            out = list(self.spans)
        self.spans = []
        return out


def error_pct(measured: float | None, predicted: float | None) -> float | None:
    """(measured - predicted) / predicted in %, or None without a prediction."""
    if measured is None or predicted is None or predicted == 0:
        return None
    return 100.0 * (measured - predicted) / predicted


@dataclass
class RunLog:
    """Tables of one run (module docstring). `predictions`: task -> Prediction dict (or absent)."""

    iterations: pd.DataFrame
    prompts: pd.DataFrame
    meta: dict = field(default_factory=dict)
    predictions: dict[str, dict] = field(default_factory=dict)

    def summary(self) -> pd.DataFrame:
        """One row per task, in run order: measured tokens/s and accepted length vs predicted."""
        rows = []
        for task in dict.fromkeys(self.prompts["task"]):
            p = self.prompts[self.prompts["task"] == task]
            it = self.iterations[self.iterations["task"] == task]
            tps = p["tokens_per_s"].to_numpy(dtype=float)
            pred = self.predictions.get(task) or {}
            mean = float(tps.mean())
            acc = float(it["accepted"].mean()) if len(it) else float("nan")
            rows.append({
                "task": task,
                "mode": p["mode"].iloc[0],
                "policy": p["policy"].iloc[0],
                "prompts": len(p),
                "tokens_per_s_mean": mean,
                "tokens_per_s_p50": float(np.percentile(tps, 50)),
                "tokens_per_s_p95": float(np.percentile(tps, 5)),  # slow tail, as in Prediction
                "mean_accepted": acc,
                "iteration_ms": float(1e3 * p["decode_s"].sum() / max(p["iterations"].sum(), 1)),
                "predicted_tokens_per_s": pred.get("tokens_per_s_mean"),
                "error_pct": error_pct(mean, pred.get("tokens_per_s_mean")),
                "predicted_mean_accepted": pred.get("mean_accepted"),
                "predicted_iteration_ms": pred.get("iteration_ms"),
                "plan_predicted_tokens_per_s": pred.get("plan_tokens_per_s_mean"),  # plan's own workload
            })  # fmt: skip
        return pd.DataFrame(rows)

    def write(self, folder: str | Path) -> Path:
        """iterations.jsonl, prompts.jsonl and summary.json into `folder` (atomically)."""
        folder = Path(folder)
        summary = {"meta": self.meta, "predictions": self.predictions,
                   "tasks": json.loads(self.summary().to_json(orient="records"))}
        with atomic_dir(folder) as tmp:
            self.iterations.to_json(tmp / "iterations.jsonl", orient="records", lines=True)
            self.prompts.to_json(tmp / "prompts.jsonl", orient="records", lines=True)
            (tmp / "summary.json").write_text(json.dumps(to_jsonable(summary), indent=2, default=str) + "\n")
        return folder

    @classmethod
    def load(cls, folder: str | Path) -> RunLog:
        """Read a run log folder; a missing file, non-UTF-8 text, bad JSON or a table without the
        columns `summary` reads -> UserError naming the file."""
        folder = Path(folder)
        if not folder.is_dir():
            raise UserError(f"run log {folder} not found: give the folder `swiftspec run -o` wrote")
        s = parse_json(read_text(folder / "summary.json", "run log file"), f"run log file {folder / 'summary.json'}")
        if not isinstance(s, dict):
            raise UserError(f"run log file {folder / 'summary.json'} is malformed: expected a JSON object")
        meta = check_dict(s.get("meta", {}), f"run log file {folder / 'summary.json'}", "meta")
        if meta.get("plan") is not None:
            check_dict(meta["plan"], f"run log file {folder / 'summary.json'}", "meta plan")
        preds = check_dict(s.get("predictions", {}), f"run log file {folder / 'summary.json'}", "predictions")
        for task, pred in preds.items():
            if pred is not None:
                check_dict(pred, f"run log file {folder / 'summary.json'}", f"predictions[{task!r}]")
        it = _read_table(folder / "iterations.jsonl", _ITERATION_COLUMNS)
        pr = _read_table(folder / "prompts.jsonl", _PROMPT_COLUMNS)
        if len(pr) == 0:
            raise UserError(f"run log file {folder / 'prompts.jsonl'} holds no prompts: the run measured nothing")
        return cls(it, pr, meta, preds)


_PROMPT_COLUMNS = {"task": str, "mode": str, "policy": str, "prompt": int, "tokens": list,
                   "tokens_per_s": float, "decode_s": float, "iterations": int}
_ITERATION_COLUMNS = {"task": str, "prompt": int, "iteration": int, "accepted": float}


def _read_table(path: Path, columns: dict[str, type]) -> pd.DataFrame:
    """One JSON-lines table of a run log: one object per line, the named columns present with
    values of their type (numbers finite and >= 0)."""
    where = f"run log file {path}"
    rows = []
    for n, line in enumerate(read_text(path, "run log file").splitlines(), start=1):
        if not line.strip():
            continue
        row = parse_json(line, f"{where} line {n}")
        if not isinstance(row, dict):
            raise UserError(f"{where} line {n} is malformed: expected a JSON object")
        for col, kind in columns.items():
            v = require(row, col, f"{where} line {n}")
            if kind is str:
                check_str(v, f"{where} line {n}", col)
            elif kind is int:
                check_int(v, f"{where} line {n}", col, lo=0)
            elif kind is list:
                for i, t in enumerate(check_list(v, f"{where} line {n}", col)):
                    check_int(t, f"{where} line {n}", f"{col}[{i}]", lo=0)
            elif v is not None:  # a float column may hold null (not measured)
                check_number(v, f"{where} line {n}", col, lo=0)
        rows.append(row)
    if not rows:
        return pd.DataFrame(columns=list(columns))
    try:
        return pd.read_json(io.StringIO("\n".join(json.dumps(r) for r in rows)), orient="records", lines=True)
    except ValueError as e:
        raise UserError(f"{where} is malformed: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
