"""The planner: enumerate configurations, simulate them, rank by predicted tokens/s, explain.

Coarse then fine: every candidate is simulated on a short workload (`screen`: few requests, few
tokens; the same target paths for all, so candidates are compared on equal terms), then the best
`refine` of them and the best of every mode again on the full workload. Trajectories of the rank
tree depend on the mode family and tree policy only, so they are shared by all GPU splits.

Candidates for N GPUs:
  autoregressive  target on all N GPUs
  chain           k = 2..8 drafted tokens, both models on all N GPUs
  serial          dynamic trees bs in {4, 8, 16, 32}, w in {1, 2, 4, 8} (w <= bs), d = the fewest
                  expansions that reach bs nodes (d0), d0 + 1, d0 + 3 and bs; static Sequoia trees
  async           target on 1..N-1 GPUs, draft on the rest; the same (bs, w) grid; d = r and r+1
                  with r = floor(t_verify / t_draft_expansion) (SwiftSpec's rule)
Configurations that do not fit GPU memory are dropped (counted), and so are those the profile
cannot time (the missing rows are reported).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd

from swiftspec.sim.acceptance import AcceptanceModel, default_acceptance
from swiftspec.sim.costs import StepCosts
from swiftspec.sim.derive import HARDWARE, load_derived
from swiftspec.sim.engine import (
    DEFAULT_WORKLOAD,
    SimResult,
    Workload,
    make_trajectories,
    simulate_trajectories,
)
from swiftspec.sim.latency import ExtrapolationError, LatencyModel
from swiftspec.sim.memory import memory_use
from swiftspec.sim.profile_default import default_profile
from swiftspec.sim.rank_tree import RankTree
from swiftspec.sim.tree_dp import best_static_tree
from swiftspec.spec import (
    AcceptanceProfile,
    Mode,
    ModelSpec,
    Plan,
    Profile,
    SourceRef,
    Split,
    TreePolicy,
    UserError,
    file_sha256,
    profile_path,
)

BS_GRID = (4, 8, 16, 32)
W_GRID = (1, 2, 4, 8)
CHAIN_K = tuple(range(2, 9))
DEFAULT_MAX_LEN = 4096
SCREEN = Workload(prompt_len=256, max_new_tokens=64, requests=2, seed=0)


@dataclass(frozen=True)
class SearchSpace:
    """What `plan` may choose from. None = search that dimension; a value pins it."""

    gpus: int = 8
    modes: tuple[Mode, ...] = tuple(Mode)
    draft_gpus: int | None = None
    bs: int | None = None
    w: int | None = None
    d: int | None = None
    gpus_per_node: int | None = None  # None: all GPUs in one node
    device: str = "cuda"
    static_trees: bool = True

    @property
    def per_node(self) -> int:
        return self.gpus_per_node or self.gpus

    def validate(self) -> None:
        if self.gpus < 1:
            raise UserError(f"--gpus must be >= 1, got {self.gpus}")
        if not self.modes:
            raise UserError("--modes is empty: choose from " + ", ".join(m.value for m in Mode))
        if self.modes == (Mode.async_,) and self.gpus < 2:
            raise UserError(
                "async mode needs at least 2 GPUs: the draft and the target run on disjoint GPU "
                "groups (use --modes serial or chain on 1 GPU)"
            )
        if self.draft_gpus is not None and not 1 <= self.draft_gpus <= self.gpus - 1:
            raise UserError(
                f"--draft-gpus must be between 1 and {self.gpus - 1} (the target needs >= 1 of the "
                f"{self.gpus} GPUs), got {self.draft_gpus}"
            )
        for name, v in (("--bs", self.bs), ("--w", self.w)):
            if v is not None and v < 1:
                raise UserError(f"{name} must be >= 1, got {v}")
        if self.d is not None and self.d < 0:
            raise UserError(f"--d must be >= 0, got {self.d}")
        if self.gpus_per_node is not None and self.gpus_per_node < 1:
            raise UserError(f"--gpus-per-node must be >= 1, got {self.gpus_per_node}")
        if self.device not in ("cuda", "cpu"):
            raise UserError(f"--device must be cuda or cpu, got {self.device!r}")


@dataclass(frozen=True)
class Candidate:
    mode: Mode
    split: Split
    policy: TreePolicy

    @property
    def label(self) -> str:
        if self.mode is Mode.async_:
            where = f"{self.split.draft_tp}/{self.split.target_tp}"
        else:
            where = f"{self.split.target_tp}"
        return f"{self.mode.value} {where} {self.policy.key}"


@dataclass
class Inputs:
    """Everything a plan is computed from: models (as given and as specs), profile, acceptance."""

    target_name: str
    draft_name: str | None
    target: ModelSpec
    draft: ModelSpec | None
    profile: Profile
    profile_ref: SourceRef
    acceptance: AcceptanceProfile
    acceptance_ref: SourceRef


@dataclass
class SearchResult:
    """Ranked table (best first), the plans behind its rows, and what was left out.

    table columns: rank, mode, draft_gpus, target_gpus, policy, bs, w, d, tokens_per_s_mean,
    tokens_per_s_p50, tokens_per_s_p95 (5th percentile over requests: the slow tail),
    mean_accepted, iteration_ms, speedup_vs_autoregressive, speedup_vs_serial, fidelity ("full":
    simulated on the full workload; "screen": only on the short screening one), requests.
    """

    table: pd.DataFrame
    plans: list[Plan]
    winner_result: SimResult
    considered: int
    dropped_memory: int
    skipped_profile: list[str] = field(default_factory=list)
    baselines: dict[str, str] = field(default_factory=dict)  # mode -> label of the baseline config
    extrapolations: list[str] = field(default_factory=list)

    @property
    def winner(self) -> Plan:
        return self.plans[0]


def load_profile(profile: str | Path) -> tuple[Profile, SourceRef]:
    """A profile and its provenance: a folder, builtin:NAME, or hardware:SPEC (derived in memory,
    `sim.derive.load_derived`)."""
    if str(profile).startswith(HARDWARE):
        return load_derived(str(profile))
    prof = Profile.load(profile)
    return prof, SourceRef(path=str(profile), sha256=file_sha256(profile_path(profile)), label=prof.label)


def load_inputs(
    target: str = "Llama-3-70B",
    draft: str | None = "Llama-3.2-3B",
    profile: str | None = None,
    acceptance: str | None = None,
    device: str = "cuda",
) -> Inputs:
    """Read the models, the profile (`load_profile`, or the embedded H200 profile: measured where it
    covers both models, else derived) and the acceptance profile (a JSON file, or the bundled
    synthetic one)."""
    t = ModelSpec.from_config(target)
    dspec = ModelSpec.from_config(draft) if draft else None
    if profile is None:
        if device == "cpu":
            raise UserError("--device cpu needs a CPU profile: give --profile DIR (from `swiftspec profile --device cpu`)")
        prof, pref = default_profile([m for m in (target, draft) if m])
    else:
        prof, pref = load_profile(profile)
    pdev = prof.meta.get("device", "cuda")
    if pdev != device:
        raise UserError(f"profile {pref.path} was measured on {pdev}, but --device is {device}: give a {device} profile")
    fmt = prof.meta.get("weight_format", "native")
    if fmt != "native":  # a profile of fp8 shards: the memory fit counts fp8 weights too
        t = replace(t, weight_format=fmt)
        dspec = replace(dspec, weight_format=fmt) if dspec else None
    if acceptance is None:
        acc, aref = default_acceptance()
    else:
        acc = AcceptanceProfile.load(acceptance)
        aref = SourceRef(path=str(acceptance), sha256=file_sha256(acceptance), label=acc.label)
    return Inputs(target, draft, t, dspec, prof, pref, acc, aref)


def _serial_min_d(w: int, bs: int, logq) -> int:
    """Fewest expansions of a fresh tree that give it >= bs nodes."""
    tree = RankTree(logq, w)
    d = 0
    while len(tree) < bs and tree.expand():
        d += 1
    return max(d, 1)


def _dynamic_grid(space: SearchSpace) -> list[tuple[int, int]]:
    bss = (space.bs,) if space.bs else BS_GRID
    ws = (space.w,) if space.w else W_GRID
    return [(b, w) for b in bss for w in ws if w <= b and b >= 2]


# the least memory-hungry policy of each mode: if it does not fit, no policy of that mode does
_SMALLEST = {Mode.autoregressive: TreePolicy.autoregressive(), Mode.chain: TreePolicy.chain(2),
             Mode.serial: TreePolicy(bs=4, w=1, d=3), Mode.async_: TreePolicy(bs=4, w=1, d=1)}


def _splits(space: SearchSpace, mode: Mode) -> list[Split]:
    n = space.gpus
    if mode is Mode.autoregressive:
        return [Split.shared(n, with_draft=False)]
    if mode is not Mode.async_:
        return [Split.shared(n)]
    drafts = (space.draft_gpus,) if space.draft_gpus else range(1, n)
    return [_placed(k, n - k, space.per_node) for k in drafts if 1 <= k < n]


def _placed(draft: int, target: int, per_node: int) -> Split:
    """Draft-first or target-first placement, whichever spans fewer nodes (target group first:
    its all-reduces are the most frequent cross-node traffic)."""
    def nodes(gpus: tuple[int, ...]) -> int:
        return len({g // per_node for g in gpus})

    options = (Split.disaggregated(draft, target), Split.disaggregated(draft, target, target_first=True))
    return min(options, key=lambda s: (nodes(s.target_gpus), nodes(s.draft_gpus)))


class Planner:
    """Enumerates, screens and refines candidates for one set of inputs (see module docstring)."""

    def __init__(self, inputs: Inputs, space: SearchSpace, workload: Workload = DEFAULT_WORKLOAD,
                 screen: Workload | None = None, refine: int = 8, max_len: int | None = None):
        space.validate()
        self.inputs, self.space, self.workload = inputs, space, workload
        self.screen = screen or replace(
            SCREEN, prompt_len=workload.prompt_len, seed=workload.seed,
            max_new_tokens=min(SCREEN.max_new_tokens, workload.max_new_tokens),
            requests=min(SCREEN.requests, workload.requests),
        )
        self.refine = refine
        self.max_len = max_len or max(DEFAULT_MAX_LEN, workload.prompt_len + workload.max_new_tokens + 64)
        self.lat = LatencyModel(inputs.profile)
        self.acc = AcceptanceModel(inputs.acceptance)
        self._costs: dict[tuple, StepCosts] = {}
        self._trajs: dict[tuple, list] = {}
        self.skipped: dict[str, str] = {}  # candidate label -> reason

    # -- pieces --------------------------------------------------------------------------------

    def costs(self, mode: Mode, split: Split) -> StepCosts:
        key = (mode, split)
        if key not in self._costs:
            draft = None if mode is Mode.autoregressive else self.inputs.draft
            self._costs[key] = StepCosts(self.lat, self.inputs.target, draft, split, mode, self.space.per_node)
        return self._costs[key]

    def trajectories(self, mode: Mode, policy: TreePolicy, workload: Workload) -> list:
        family = "async" if mode is Mode.async_ else ("ar" if mode is Mode.autoregressive else "serial")
        key = (family, policy, workload)
        if key not in self._trajs:
            self._trajs[key] = make_trajectories(self.acc, mode, policy, workload)
        return self._trajs[key]

    def simulate(self, c: Candidate, workload: Workload) -> SimResult:
        trajs = self.trajectories(c.mode, c.policy, workload)
        return simulate_trajectories(self.costs(c.mode, c.split), c.mode, trajs, workload.prompt_len,
                                     workload.max_new_tokens)

    def fits(self, c: Candidate, gpus_capacity: int | None = None) -> bool:
        cap = gpus_capacity or self.lat.memory_bytes
        draft = None if c.mode is Mode.autoregressive else self.inputs.draft
        return memory_use(self.inputs.target, draft, c.split, c.mode, c.policy, self.max_len, cap,
                          self.space.device).fits

    # -- enumeration ---------------------------------------------------------------------------

    def _async_ds(self, split: Split, bs: int, w: int) -> list[int]:
        if self.space.d is not None:
            return [self.space.d]
        costs = self.costs(Mode.async_, split)
        kv = self.workload.prompt_len
        tv = sum(costs.verify(bs, kv))
        te = sum(costs.expansion(w, kv + bs))
        r = max(1, math.floor(tv / te))
        return [r, r + 1]

    def policies(self, mode: Mode, split: Split) -> Iterable[TreePolicy]:
        s = self.space
        if mode is Mode.autoregressive:
            yield TreePolicy.autoregressive()
            return
        if mode is Mode.chain:
            if s.w not in (None, 1):
                return
            ks = CHAIN_K
            if s.bs is not None:
                ks = (s.bs - 1,)
            if s.d is not None:
                ks = tuple(k for k in ks if k == s.d) if s.bs is not None else (s.d,)
            for k in ks:
                if k >= 1:
                    yield TreePolicy.chain(k)
            return
        grid = _dynamic_grid(s)
        if s.w is None:  # a measured profile may know fewer draft ranks than the widest w
            grid = [(b, w) for b, w in grid if w <= len(self.acc.draft_prob_by_rank)]
        logq = self.acc.child_logprobs(max((w for _, w in grid), default=1))
        for bs, w in grid:
            if mode is Mode.serial:
                dmin = _serial_min_d(w, bs, logq)
                # the fewest expansions that reach bs, one more, and deeper trees up to bs expansions
                # (a fresh tree keeps improving with more expansions: SpecExec grows it to completion)
                ds = (s.d,) if s.d is not None else sorted({dmin, dmin + 1, dmin + 3, max(bs, dmin)})
            else:
                ds = self._async_ds(split, bs, w)
            for d in ds:
                if mode is Mode.serial and d < 1:
                    continue
                yield TreePolicy(bs=bs, w=w, d=d)
        if mode is Mode.serial and s.static_trees and s.w is None and s.d is None:
            for bs in ((s.bs,) if s.bs else BS_GRID):
                if bs >= 2:
                    _, topo = best_static_tree(list(self.inputs.acceptance.positional), bs)
                    topo = tuple(int(p) for p in topo)
                    yield TreePolicy(bs=len(topo), w=1, d=0, kind="static", topology=topo)

    def candidates(self) -> tuple[list[Candidate], int]:
        """(candidates that fit memory and the profile can time, number dropped for memory)."""
        out, dropped = [], 0
        for mode in self.space.modes:
            if mode is Mode.async_ and self.space.gpus < 2:
                continue
            for split in _splits(self.space, mode):
                if not self.fits(Candidate(mode, split, _SMALLEST[mode])):
                    dropped += 1  # nothing fits: drop before asking the profile about it
                    continue
                try:
                    pols = list(self.policies(mode, split))
                except ExtrapolationError as e:
                    self.skipped[f"{mode.value} split {split.draft_tp}/{split.target_tp}"] = str(e)
                    continue
                for pol in pols:
                    c = Candidate(mode, split, pol)
                    if self.fits(c):
                        out.append(c)
                    else:
                        dropped += 1
        return out, dropped

    def smallest_gpus_that_fit(self, limit: int = 64) -> int | None:
        """Fewest GPUs (> space.gpus) on which some configuration of the allowed modes fits memory."""
        for n in range(self.space.gpus + 1, limit + 1):
            for mode in self.space.modes:
                sp = replace(self.space, gpus=n, draft_gpus=None)
                for split in _splits(sp, mode):
                    if self.fits(Candidate(mode, split, _SMALLEST[mode])):
                        return n
        return None

    # -- the search ----------------------------------------------------------------------------

    def run(self, progress: Callable[[Iterable], Iterable] | None = None) -> SearchResult:
        cands, dropped = self.candidates()
        if not cands:
            self._raise_nothing(dropped)
        screened: list[tuple[Candidate, SimResult]] = []
        it = progress(cands) if progress else cands
        single = len(cands) == 1
        for c in it:
            try:
                res = self.simulate(c, self.workload if single else self.screen)
            except ExtrapolationError as e:
                self.skipped[c.label] = str(e)
                continue
            screened.append((c, res))
        if not screened:
            self._raise_nothing(dropped)
        screened.sort(key=lambda cr: -cr[1].summary.tokens_per_s_mean)
        # refine: the best few overall and the best of every mode (the baselines)
        chosen = list(screened[: self.refine])
        for mode in Mode:
            best = next((cr for cr in screened if cr[0].mode is mode), None)
            if best is not None and best not in chosen:
                chosen.append(best)
        full: list[tuple[Candidate, SimResult, int]] = []
        for c, res in chosen:
            if not single:
                try:
                    res = self.simulate(c, self.workload)
                except ExtrapolationError as e:
                    self.skipped[c.label] = str(e)
                    continue
            full.append((c, res, "full"))
        full.sort(key=lambda x: -x[1].summary.tokens_per_s_mean)
        done = {id(c) for c, _, _ in full}
        rest = [(c, r, "screen") for c, r in screened if id(c) not in done]
        rows = full + rest
        if not full:
            self._raise_nothing(dropped)
        base, base_labels = self._baselines(full)
        return self._result(rows, base, base_labels, len(cands), dropped)

    def _baselines(self, full) -> tuple[dict[Mode, float], dict[str, str]]:
        """Best autoregressive and serial tokens/s on the same GPUs: from the search when those
        modes were searched, else one default configuration each (bs8-w8 serial)."""
        base, labels = {}, {}
        for mode in (Mode.autoregressive, Mode.serial):
            found = [(c, r) for c, r, _ in full if c.mode is mode]
            if not found:
                split = _splits(replace(self.space, draft_gpus=None), mode)[0]
                logq = self.acc.child_logprobs(8)
                pol = (TreePolicy.autoregressive() if mode is Mode.autoregressive
                       else TreePolicy(bs=8, w=8, d=_serial_min_d(8, 8, logq)))
                c = Candidate(mode, split, pol)
                try:
                    found = [(c, self.simulate(c, self.workload))] if self.fits(c) else []
                except ExtrapolationError:
                    found = []
            if found:
                c, r = max(found, key=lambda cr: cr[1].summary.tokens_per_s_mean)
                base[mode] = r.summary.tokens_per_s_mean
                labels[mode.value] = c.label
        return base, labels

    def _raise_nothing(self, dropped: int) -> None:
        if dropped and not self.skipped:
            n = self.smallest_gpus_that_fit()
            more = (f"the smallest GPU count that fits is {n} (--gpus {n})" if n
                    else "no GPU count up to 64 fits: use a smaller model or a GPU with more memory")
            cap = self.lat.memory_bytes / 1e9
            raise UserError(
                f"no configuration of {self.inputs.target.name} + {self.inputs.draft.name if self.inputs.draft else '-'} "
                f"fits {self.space.gpus} GPU(s) of {cap:.1f} GB ({dropped} dropped for memory): {more}"
            )
        if self.skipped:
            first = next(iter(self.skipped.values()))
            if len(self.skipped) == 1:
                raise ExtrapolationError(first)
            models = dict.fromkeys(m.name for m in (self.inputs.target, self.inputs.draft) if m is not None)
            have = " and ".join(f"{m} at TP {', '.join(map(str, tps))}" if (tps := self.lat.profiled_tps(m))
                                else f"no rows for {m}" for m in models)
            raise ExtrapolationError(f"none of the {len(self.skipped)} configurations on {self.space.gpus} GPU(s) "
                                     f"is covered by the profile (it has {have}): {first}")
        raise UserError("no configuration to simulate: relax the pinned options (--modes, --bs, --w, --d)")

    def plan_for(self, c: Candidate, res: SimResult) -> Plan:
        i = self.inputs
        plan = Plan(
            target=i.target_name,
            draft=None if c.mode is Mode.autoregressive else i.draft_name,
            split=c.split,
            mode=c.mode,
            policy=c.policy,
            prediction=res.summary.to_prediction(),
            profile=i.profile_ref,
            acceptance=i.acceptance_ref,
            device=self.space.device,
            gpus_per_node=self.space.per_node,
            max_len=self.max_len,
            meta={"workload": {"prompt_len": self.workload.prompt_len, "max_new_tokens": self.workload.max_new_tokens,
                               "requests": self.workload.requests, "seed": self.workload.seed}},
        )
        plan.validate()
        return plan

    def _result(self, rows, base, base_labels, considered, dropped) -> SearchResult:
        recs, plans = [], []
        ar, se = base.get(Mode.autoregressive), base.get(Mode.serial)
        for rank, (c, res, fidelity) in enumerate(rows, 1):
            s = res.summary
            p = c.policy
            recs.append({
                "rank": rank, "mode": c.mode.value,
                "draft_gpus": c.split.draft_tp, "target_gpus": c.split.target_tp,
                "policy": p.key, "bs": p.bs, "w": p.w, "d": p.d,
                "tokens_per_s_mean": s.tokens_per_s_mean, "tokens_per_s_p50": s.tokens_per_s_p50,
                "tokens_per_s_p95": s.tokens_per_s_p95, "mean_accepted": s.mean_accepted,
                "iteration_ms": s.iteration_ms,
                "speedup_vs_autoregressive": s.tokens_per_s_mean / ar if ar else math.nan,
                "speedup_vs_serial": s.tokens_per_s_mean / se if se else math.nan,
                "fidelity": fidelity,
                "requests": self.workload.requests if fidelity == "full" else self.screen.requests,
            })
            plans.append((c, res))
        table = pd.DataFrame(recs)
        winner_c, winner_res = plans[0]
        # plan objects only for the rows a user may pick from (full-fidelity rows)
        plan_objs = [self.plan_for(c, r) for (c, r), (_, _, n) in zip(plans, rows) if n == "full"]
        return SearchResult(
            table=table, plans=plan_objs, winner_result=winner_res, considered=considered,
            dropped_memory=dropped, skipped_profile=[f"{k}: {v}" for k, v in self.skipped.items()],
            baselines=base_labels, extrapolations=list(self.lat.extrapolations),
        )


def search(inputs: Inputs, space: SearchSpace, workload: Workload = DEFAULT_WORKLOAD, progress=None, **kw) -> SearchResult:
    """Plan: enumerate, simulate, rank (see the module docstring)."""
    return Planner(inputs, space, workload, **kw).run(progress)


def breakdown_table(pred_breakdown: dict[str, float], mode: Mode) -> pd.DataFrame:
    """The winner's mean iteration, piece by piece (ms): draft, target compute, TP comm, link,
    host, KV compaction, target idle. In async the draft overlaps the target."""
    b = pred_breakdown
    rows = [
        ("draft compute", b.get("draft_compute", 0.0)),
        ("draft TP comm", b.get("draft_tp_comm", 0.0)),
        ("target compute", b.get("target_compute", 0.0)),
        ("target TP comm", b.get("target_tp_comm", 0.0)),
        ("link (draft<->target)", b.get("link", 0.0)),
        ("host", b.get("host", 0.0)),
        ("kv compaction", b.get("kv_compact", 0.0)),
        ("target idle", b.get("target_idle", 0.0)),
    ]
    if mode is Mode.autoregressive:
        rows = [r for r in rows if not r[0].startswith("draft")]
    return pd.DataFrame(rows, columns=["piece", "ms_per_iteration"])


def predict_plan(plan: Plan, inputs: Inputs, workload: Workload | None = None) -> SimResult:
    """Re-simulate one plan (the `simulate` command)."""
    wl = workload
    if wl is None:
        w = plan.meta.get("workload", {})
        wl = Workload(**{k: int(v) for k, v in w.items() if k in ("prompt_len", "max_new_tokens", "requests", "seed")})
    space = SearchSpace(gpus=plan.split.num_gpus, modes=(plan.mode,), gpus_per_node=plan.gpus_per_node,
                        device=plan.device)
    planner = Planner(inputs, space, wl, max_len=plan.max_len)
    c = Candidate(plan.mode, plan.split, plan.policy)
    if not planner.fits(c):
        u = memory_use(inputs.target, inputs.draft if plan.mode is not Mode.autoregressive else None, c.split,
                       c.mode, c.policy, plan.max_len, planner.lat.memory_bytes, plan.device)
        raise UserError(f"plan does not fit GPU memory: needs {u.total / 1e9:.1f} GB of {u.capacity / 1e9:.1f} GB per GPU")
    return planner.simulate(c, wl)
