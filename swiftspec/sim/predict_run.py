"""Predict a run for the workload it actually ran: its prompts, its length, its rank paths.

A plan's prediction is made for the plan's workload (e.g. 8 requests x 256 tokens, paths drawn
with the plan's seed); a run decodes other prompts for other lengths. Comparing the two mixes
sampling noise into the error. `predict_run` re-simulates one configuration for the run's own
workload — each prompt's prefix length, `max_new_tokens`, and the same rank paths the synthetic
verifier replays — so measured minus predicted is latency modelling alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from swiftspec.sim.costs import StepCosts
from swiftspec.sim.engine import SimResult, simulate_trajectories
from swiftspec.sim.rank_tree import IterationTrace, request_trajectory
from swiftspec.spec import Mode, ModelSpec, Split, TreePolicy


def run_trajectories(
    acceptance, mode: Mode, policy: TreePolicy, paths: Sequence[Sequence[int]], max_new_tokens: int
) -> list[list[IterationTrace]]:
    """One rank-tree trajectory per rank path (acceptance: an `AcceptanceModel`, for log q)."""
    logq = acceptance.child_logprobs(max(policy.w, 1)) if mode is not Mode.autoregressive else np.zeros(1)
    return [request_trajectory(mode, policy, logq, np.asarray(p, dtype=np.int64), max_new_tokens) for p in paths]


@dataclass(frozen=True)
class RunWorkload:
    """The workload a run decoded. prompt_lens: prompt tokens of each request (the runtime
    prefills all but the last, which is the first root, so decoding starts after len - 1 cached
    tokens); paths: one rank path per request, as given to the runtime's `SyntheticVerifier`
    (None: not drawn yet, the caller draws them)."""

    prompt_lens: Sequence[int]
    max_new_tokens: int
    paths: Sequence[Sequence[int]] | None = None


def predict_run(
    latency,
    acceptance,
    target: ModelSpec,
    draft: ModelSpec | None,
    split: Split,
    mode: Mode,
    policy: TreePolicy,
    workload: RunWorkload,
    gpus_per_node: int = 8,
) -> SimResult:
    """Simulate one configuration on the run's workload (its paths must be given)."""
    if workload.paths is None:
        raise ValueError("predict_run needs the workload's rank paths")
    costs = StepCosts(latency, target, draft if mode is not Mode.autoregressive else None, split, mode, gpus_per_node)
    trajs = run_trajectories(acceptance, mode, policy, workload.paths, workload.max_new_tokens)
    return simulate_trajectories(costs, mode, trajs, [max(n - 1, 0) for n in workload.prompt_lens],
                                 workload.max_new_tokens)
