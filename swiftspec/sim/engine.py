"""The SimPy engine: the draft group, the target group and the link between them as processes.

One iteration (SwiftSpec Algorithm 1, `async`):

    draft:  host work -> immediate expansions (tree < bs) -> send S_n -> d expansions -> wait for
            the verified tokens -> KV compaction / re-root
    link:   carries S_n draft->target and the verified tokens target->draft (send_recv each)
    target: wait for S_n -> verify bs nodes (one forward, TP all-reduces) -> KV compaction -> send

so in steady state an iteration lasts max(d expansions, link + verify + compaction + link) +
compaction + host + immediate expansions. `serial` / `chain` run the same processes with every
expansion done before the send, a free link and both models at TP = all GPUs: draft and target
then never overlap. `autoregressive` is the target alone, one token per step.

What the tree does (forward sizes, tokens accepted) comes from `rank_tree.request_trajectory`
and does not depend on time; this module only times it. Times are ms of simulated time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd
import simpy

from swiftspec.sim.costs import NODE_MSG_BYTES, TOKEN_MSG_BYTES, Parts, StepCosts
from swiftspec.sim.rank_tree import IterationTrace, request_trajectory
from swiftspec.spec import Mode, ModelSpec, Prediction, Split, TreePolicy

TIMELINE_COLUMNS = (
    "request", "iteration", "draft_start_ms", "draft_end_ms", "target_start_ms", "target_end_ms",
    "sync_start_ms", "sync_end_ms", "accepted", "tree_size", "kv_len",
)


@dataclass(frozen=True)
class Workload:
    """The simulated requests: prompt length, tokens generated per request, how many, seed."""

    prompt_len: int = 256
    max_new_tokens: int = 256
    requests: int = 8
    seed: int = 0


DEFAULT_WORKLOAD = Workload()


@dataclass
class SimSummary:
    """Summary of a simulation.

    tokens_per_s_{mean,p50,p95}: over requests; p95 is the slow tail, i.e. the 5th percentile
    of per-request tokens/s. iteration_ms: mean wall time of one iteration. draft_busy /
    target_busy: fraction of wall time each group computes (forwards + KV compaction).
    breakdown_ms: mean ms per iteration of each piece (draft_compute, draft_tp_comm,
    target_compute, target_tp_comm, link, host, kv_compact, target_idle, draft_idle).
    """

    tokens_per_s_mean: float
    tokens_per_s_p50: float
    tokens_per_s_p95: float
    mean_accepted: float
    iteration_ms: float
    draft_busy: float
    target_busy: float
    breakdown_ms: dict[str, float] = field(default_factory=dict)

    def to_prediction(self) -> Prediction:
        bd = dict(self.breakdown_ms)
        bd["draft_busy_fraction"] = self.draft_busy
        bd["target_busy_fraction"] = self.target_busy
        return Prediction(
            tokens_per_s_mean=self.tokens_per_s_mean,
            tokens_per_s_p50=self.tokens_per_s_p50,
            tokens_per_s_p95=self.tokens_per_s_p95,
            mean_accepted=self.mean_accepted,
            iteration_ms=self.iteration_ms,
            breakdown_ms=bd,
        )


@dataclass
class SimResult:
    timeline: pd.DataFrame  # one row per iteration, columns TIMELINE_COLUMNS (ms from request start)
    summary: SimSummary


def _run_request(
    costs: StepCosts, mode: Mode, traj: list[IterationTrace], prompt_len: int, parts: Parts, req: int
) -> tuple[list[tuple], float, float, float]:
    """Simulate one request; returns (timeline rows, elapsed ms, draft busy ms, target busy ms)."""
    env = simpy.Environment()
    n = len(traj)
    ctx = np.concatenate([[0], np.cumsum([t.accepted for t in traj])])[:n] + prompt_len
    nan = math.nan
    # per iteration: draft_start, draft_end, target_start, target_end, sync_end
    times = np.full((n, 5), nan)
    busy = [0.0, 0.0]  # draft, target
    host = costs.host_ms

    if mode is Mode.autoregressive:

        def target_alone():
            for i in range(n):
                if host:
                    yield env.timeout(host)
                c, m = costs.verify(1, int(ctx[i]))
                times[i, 2] = env.now
                yield env.timeout(c + m)
                times[i, 3] = times[i, 4] = env.now
                busy[1] += c + m
                parts.host += host
                parts.target_compute += c
                parts.target_tp_comm += m

        env.run(until=env.process(target_alone()))
        rows = [(req, i, nan, nan, times[i, 2], times[i, 3], times[i, 3], times[i, 4], 1, 1, int(ctx[i]))
                for i in range(n)]
        return rows, env.now, busy[0], busy[1]

    to_target = simpy.Store(env)
    to_draft = simpy.Store(env)
    wire = simpy.Store(env)

    def link():
        while True:
            dest, delay, payload = yield wire.get()
            if delay:
                yield env.timeout(delay)
                parts.link += delay
            yield dest.put(payload)

    def expand(forwards, i):
        for tokens, size in forwards:
            c, m = costs.expansion(tokens, int(ctx[i]) + size)
            yield env.timeout(c + m)
            busy[0] += c + m
            parts.draft_compute += c
            parts.draft_tp_comm += m

    def draft():
        for i, tr in enumerate(traj):
            if host:
                yield env.timeout(host)
                parts.host += host
            times[i, 0] = env.now
            yield from expand(tr.pre, i)
            yield wire.put((to_target, costs.link(NODE_MSG_BYTES * tr.sent), i))
            yield from expand(tr.overlap, i)
            times[i, 1] = env.now
            yield to_draft.get()
            c = costs.compact("draft", tr.accepted + tr.kept)
            if c:
                yield env.timeout(c)
                busy[0] += c
                parts.kv_compact += c
            times[i, 4] = env.now

    def target():
        for i, tr in enumerate(traj):
            yield to_target.get()
            times[i, 2] = env.now
            c, m = costs.verify(tr.sent, int(ctx[i]))
            k = costs.compact("target", tr.accepted)
            yield env.timeout(c + m + k)
            busy[1] += c + m + k
            parts.target_compute += c
            parts.target_tp_comm += m
            parts.kv_compact += k
            times[i, 3] = env.now
            yield wire.put((to_draft, costs.link(TOKEN_MSG_BYTES * tr.accepted), i))

    env.process(link())
    env.process(target())
    env.run(until=env.process(draft()))
    rows = [
        (req, i, times[i, 0], times[i, 1], times[i, 2], times[i, 3], times[i, 3], times[i, 4],
         tr.accepted, tr.tree_size, int(ctx[i]))
        for i, tr in enumerate(traj)
    ]
    return rows, env.now, busy[0], busy[1]


def simulate_trajectories(
    costs: StepCosts,
    mode: Mode,
    trajectories: list[list[IterationTrace]],
    prompt_len: int | Sequence[int],
    max_new_tokens: int | None = None,
) -> SimResult:
    """Time given per-request trajectories under `costs`; see the module docstring.

    prompt_len: tokens in the verified prefix when decoding starts, one for all requests or one
    per request. max_new_tokens: a request's tokens/s counts at most this many tokens (the last
    verify may overshoot; the runtime cuts its output there), None = all produced tokens.
    """
    parts = Parts()
    rows: list[tuple] = []
    rates, iters, tokens, elapsed_all = [], 0, 0, 0.0
    busy_d = busy_t = 0.0
    lens = [int(prompt_len)] * len(trajectories) if isinstance(prompt_len, (int, np.integer)) else list(prompt_len)
    for r, traj in enumerate(trajectories):
        rws, elapsed, bd, bt = _run_request(costs, mode, traj, lens[r], parts, r)
        rows.extend(rws)
        produced = sum(t.accepted for t in traj)
        counted = produced if max_new_tokens is None else min(produced, max_new_tokens)
        rates.append(1000.0 * counted / elapsed)
        iters += len(traj)
        tokens += produced
        elapsed_all += elapsed
        busy_d += bd
        busy_t += bt
    df = pd.DataFrame(rows, columns=list(TIMELINE_COLUMNS))
    it_ms = elapsed_all / iters
    bd = {k: v / iters for k, v in asdict(parts).items()}
    bd["target_idle"] = max(it_ms - busy_t / iters, 0.0)
    bd["draft_idle"] = max(it_ms - busy_d / iters, 0.0) if mode is not Mode.autoregressive else 0.0
    rates_a = np.asarray(rates)
    summary = SimSummary(
        tokens_per_s_mean=float(rates_a.mean()),
        tokens_per_s_p50=float(np.percentile(rates_a, 50)),
        tokens_per_s_p95=float(np.percentile(rates_a, 5)),
        mean_accepted=tokens / iters,
        iteration_ms=it_ms,
        draft_busy=busy_d / elapsed_all,
        target_busy=busy_t / elapsed_all,
        breakdown_ms=bd,
    )
    return SimResult(df, summary)


def simulate(
    latency,
    acceptance,
    target: ModelSpec,
    draft: ModelSpec | None,
    split: Split,
    mode: Mode,
    policy: TreePolicy,
    workload: Workload = DEFAULT_WORKLOAD,
    gpus_per_node: int = 8,
) -> SimResult:
    """Simulate `workload` under one configuration.

    latency: a `LatencyModel`; acceptance: an `AcceptanceModel` (rank paths + draft probabilities).
    """
    costs = StepCosts(latency, target, draft, split, mode, gpus_per_node)
    trajs = make_trajectories(acceptance, mode, policy, workload)
    return simulate_trajectories(costs, mode, trajs, workload.prompt_len, workload.max_new_tokens)


def make_trajectories(acceptance, mode: Mode, policy: TreePolicy, workload: Workload) -> list[list[IterationTrace]]:
    """Rank-tree trajectories of the workload's requests (same seed -> same target paths)."""
    paths = request_paths(acceptance, workload)
    logq = acceptance.child_logprobs(max(policy.w, 1)) if mode is not Mode.autoregressive else np.zeros(1)
    return [request_trajectory(mode, policy, logq, p, workload.max_new_tokens) for p in paths]


def request_paths(acceptance, workload: Workload) -> list[np.ndarray]:
    """Target rank paths long enough for any tree (max_new_tokens + 64 positions)."""
    return acceptance.request_paths(workload.requests, workload.max_new_tokens + 64, workload.seed)


def to_chrome_trace(df: pd.DataFrame) -> dict:
    """The timeline as Chrome trace JSON (chrome://tracing, Perfetto): one process per request,
    threads `draft`, `target`, `sync`; times in µs."""
    events: list[dict] = []
    lanes = (("draft", 1, "draft_start_ms", "draft_end_ms"), ("target", 2, "target_start_ms", "target_end_ms"),
             ("sync", 3, "sync_start_ms", "sync_end_ms"))
    for req in sorted(df["request"].unique()):
        events.append({"name": "process_name", "ph": "M", "pid": int(req), "args": {"name": f"request {req}"}})
        for name, tid, _, _ in lanes:
            events.append({"name": "thread_name", "ph": "M", "pid": int(req), "tid": tid, "args": {"name": name}})
    for row in df.itertuples(index=False):
        for name, tid, a, b in lanes:
            start, end = getattr(row, a), getattr(row, b)
            if not (math.isfinite(start) and math.isfinite(end)):
                continue
            events.append({
                "name": f"{name} {row.iteration}", "cat": name, "ph": "X", "pid": int(row.request), "tid": tid,
                "ts": start * 1000.0, "dur": (end - start) * 1000.0,
                "args": {"accepted": int(row.accepted), "tree_size": int(row.tree_size), "kv_len": int(row.kv_len)},
            })
    return {"traceEvents": events, "displayTimeUnit": "ms"}
