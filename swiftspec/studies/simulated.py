"""Planner calls shared by the simulated studies: one short workload, best configuration of a
pinned search, and why a point is missing when the planner cannot give one."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from swiftspec.sim.engine import Workload
from swiftspec.sim.search import Inputs, SearchSpace, load_inputs, search
from swiftspec.spec import UserError

DEFAULT_TARGET = "Llama-3-70B"  # the pair `swiftspec plan` defaults to
DEFAULT_DRAFT = "Llama-3.2-3B"
# Short but not tiny: 2 requests x 64 tokens is the planner's own screening workload.
STUDY_WORKLOAD = Workload(prompt_len=256, max_new_tokens=64, requests=2, seed=0)


@dataclass
class Best:
    """Best configuration of one pinned search (None fields when nothing could be simulated)."""

    row: pd.Series | None
    reason: str = ""  # why there is no row (does not fit memory, profile lacks rows, ...)


def load(profile: str | None, acceptance: str | None, target: str = DEFAULT_TARGET,
         draft: str = DEFAULT_DRAFT) -> Inputs:
    return load_inputs(target, draft, profile, acceptance, "cuda")


def best(inputs: Inputs, space: SearchSpace, workload: Workload = STUDY_WORKLOAD) -> Best:
    """The top row of `search` (tokens/s, mean accepted, split, policy), or why there is none.

    A configuration that does not fit memory or that the profile cannot time is a missing point
    in a figure, not an error of the figure: the reason goes to the figure's notes.
    """
    try:
        res = search(inputs, space, workload, refine=1, screen=workload)
    except UserError as e:
        return Best(None, why_missing(str(e)))
    return Best(res.table.iloc[0])


def why_missing(msg: str) -> str:
    """A short reason for a figure's notes, from the planner's one-line error."""
    if "fits" in msg and "GPU" in msg:
        return "does not fit GPU memory"
    m = re.search(r"profile has no `(\w+)` rows for model (\S+) at tp (\d+) \(profiled tp: ([\d, ]+)\)", msg)
    if m:
        top = max(int(x) for x in m.group(4).split(","))
        return f"the profile stops at TP {top}" if int(m.group(3)) > top else f"the profile lacks TP {m.group(3)}"
    return msg if len(msg) < 90 else msg[:87] + "..."
