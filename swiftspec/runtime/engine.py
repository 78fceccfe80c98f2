"""The SwiftSpec engine: Algorithm 1 on a draft group and a target group, plus co-located baselines.

Follow one iteration of `async` (n = iteration, S_n = the subtree sent in it):

  draft ranks (every rank runs the same host logic; TP collectives inside the model keep them in step)
      expand until the tree holds >= bs nodes           (immediate expansions; a fresh tree's first
                                                          expansion forwards only the root)
      S_n = the bs best nodes; the leader posts it on the link with isend and does NOT wait
      expand d times                                    <- overlaps the target's verify of S_n
      leader: recv verdict_n; broadcast it to the draft group
      re-root at the bonus token if the tree holds it (keeping its subtree, KV compacted behind the
      new prefix), else start a fresh tree at it         (decoder.reroot_draft)
  target ranks
      leader: recv S_n; broadcast it to the target group
      one forward over S_n with the tree mask; greedy (or synthetic) verification
      commit the accepted path's KV into the prefix; leader sends (path, bonus) back

The draft never blocks between expansions: it has posted S_n and only waits once its d expansions
are done ("expand d times, then receive", the paper's fixed-d round; deterministic, so every draft
rank takes the same decisions without extra messages). `d` is the plan's; pick it so both sides
finish together (the planner does).

Messages (int64 CPU tensors of fixed size, see `groups.Link`):
  subtree  draft -> target   [KIND, n, 0, tokens[bs], parents[bs] (index in the subtree), depths[bs]]
  verdict  target -> draft   [KIND, path length, bonus token, bonus rank, path[bs] (subtree indices)]
Both sides start a prompt with the prompt minus its last token prefilled; the last prompt token is
the first root (same convention as `generate.py`).

`serial`, `chain` and `autoregressive` run `generate.generate` unchanged on the co-located ranks
(models TP-sharded over them), so the baselines and `swiftspec generate` agree token for token.
Serial starts a fresh tree every iteration (the simulator's convention).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from swiftspec.runtime.decoder import ModelRunner, reroot_draft
from swiftspec.runtime.device_async import AsyncDraftLoop, AsyncTargetLoop
from swiftspec.runtime.generate import GREEDY, GenerateConfig, gc_paused, generate, make_verifier
from swiftspec.runtime.groups import KIND_DONE, KIND_MORE, KIND_TREE, Groups, Layout, Link, broadcast
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.runtime.runlog import SpanTimer
from swiftspec.runtime.synthetic import NOT_SYNTHETIC, SyntheticVerifier, resolve_bonus
from swiftspec.runtime.tree import DraftTree
from swiftspec.runtime.verify import SamplingVerifier, Verdict
from swiftspec.runtime.vocab import vocab_cut
from swiftspec.runtime.weights import load_model
from swiftspec.spec import Mode, ModelSpec, SamplingParams, Split, TreePolicy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FAULT_ENV = "SWIFTSPEC_FAULT"  # "RANK:ITERATION:exit|hang|kill" -- test hook: that rank fails there


@dataclass(frozen=True)
class Task:
    """One measured configuration of a run: a mode and its tree policy."""

    mode: Mode
    policy: TreePolicy

    @property
    def label(self) -> str:
        return self.mode.value if self.mode is Mode.autoregressive else f"{self.mode.value} {self.policy.key}"


@dataclass
class Job:
    """Everything every rank needs (pickled to each spawned process).

    prompts: token ids per prompt. rank_paths: one rank path per prompt for synthetic acceptance
    (None: measured acceptance, the target decides: its argmax, or its draw when sampling).
    rank_logprobs: with rank_paths, log q by draft rank of the replayed profile: it shapes the
    draft tree (`DraftTree.rank_logprobs`). weight_format: both models' GEMM weights, "native" or
    "fp8" or "int4"; each model's kernels are resolved for it and its TP degree (`KernelConfig.resolve`; a
    checkpoint's fp8 model is the same at every TP size). sampling: greedy, or lossless sampling of the target
    (`verify.SamplingVerifier`) with prompt i's draws seeded `sampling.for_prompt(i)`, so every mode
    produces the same tokens. vocab: the ids the pair decodes over (`runtime.vocab.shared_vocab`):
    a model with a larger vocabulary has its logits cut there, the target's too (None: no cut).
    meta: what the launcher reports with a failure (e.g. "memory": the run's estimate).
    loop: the decoding loop, "host" or "device" (`GenerateConfig.loop`; async with a dynamic tree:
    `device_async`).
    """

    target: str
    draft: str | None
    split: Split
    tasks: list[Task]
    prompts: list[list[int]]
    max_new_tokens: int
    device: str = "cpu"
    dtype: str = "float32"
    weights: str = "checkpoint"
    seed: int = 0
    rank_paths: list[list[int]] | None = None
    timeout_s: float = 120.0
    rank_logprobs: list[float] | None = None
    weight_format: str = "native"
    sampling: SamplingParams = GREEDY
    vocab: int | None = None
    meta: dict = field(default_factory=dict)
    loop: str = "host"


@dataclass
class Ctx:
    """One rank's view: its layout, groups, device and heartbeat. report(line): progress of the
    run, called by the rank that leads a task once per prompt (the launcher forwards it)."""

    job: Job
    rank: int
    layout: Layout
    groups: Groups
    device: torch.device
    beat: Callable[[], None]
    models: dict = field(default_factory=dict)
    steps: int = 0  # iterations done by this rank (fault hook, heartbeats)
    report: Callable[[str], None] = lambda line: None

    def step(self) -> None:
        self.steps += 1
        self.beat()
        fault = os.environ.get(FAULT_ENV)
        if fault:
            r, it, kind = fault.split(":")
            if int(r) == self.rank and int(it) == self.steps:
                if kind == "hang":
                    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])  # a truly stuck worker
                    time.sleep(1e6)
                if kind == "kill":  # as the kernel's OOM killer ends a process
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(17)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


# --------------------------------------------------------------------------------------------
# models and runners


def _model(ctx: Ctx, which: str, tp_rank: int, tp_size: int, group) -> torch.nn.Module:
    """Load (once per TP configuration) the target or draft model of this rank, with the kernels
    of the job's weight format at this TP degree."""
    key = (which, tp_size, tp_rank, id(group) if tp_size > 1 else None)
    if key not in ctx.models:
        job = ctx.job
        path = job.target if which == "target" else job.draft
        seed = job.seed if which == "target" else job.seed + 1
        kernels = KernelConfig.resolve(ctx.device, weight_format=job.weight_format, tp_size=tp_size)
        t0 = time.perf_counter()
        ctx.models[key] = load_model(path, weights=job.weights, device=ctx.device, dtype=DTYPES[job.dtype],
                                     tp_rank=tp_rank, tp_size=tp_size, group=group, seed=seed, kernels=kernels)
        ctx.beat()
        if tp_rank == 0:  # one line per model and TP degree, from its first shard
            ctx.report(f"run: {which} {Path(path).name} built on rank {ctx.rank} (TP {tp_size}, "
                       f"{ctx.models[key].spec.num_layers} layers) in {time.perf_counter() - t0:.1f} s")
    return ctx.models[key]


def draft_slots(prompt_len: int, max_new: int, policy: TreePolicy) -> int:
    """Draft KV slots: prefix + a round's overshoot + kept subtree + one round of expansions."""
    return prompt_len + max_new + policy.bs + policy.keep_limit + (policy.bs + policy.d + 1) * policy.w + 2


def target_slots(prompt_len: int, max_new: int, policy: TreePolicy) -> int:
    return prompt_len + max_new + 2 * policy.bs + 1


def _runner(model, max_len: int, vocab_limit: int | None = None) -> ModelRunner:
    return ModelRunner(model, max_len, vocab_limit=vocab_limit)


def _vocab_limit(ctx: Ctx, model) -> int | None:
    """Where `model`'s logits are cut: the job's shared ids (`Job.vocab`, else the smaller of the
    two vocabularies), for the draft and, when the job has a draft, the target alike (`runtime.vocab`)."""
    job = ctx.job
    if not job.draft:
        return None
    shared = job.vocab or min(ModelSpec.from_config(job.target).vocab, ModelSpec.from_config(job.draft).vocab)
    return vocab_cut(model.spec.vocab, shared)


# --------------------------------------------------------------------------------------------
# messages


def pack_subtree(tree: DraftTree, sel: list[int], bs: int) -> torch.Tensor:
    msg = torch.zeros(3 + 3 * bs, dtype=torch.long)
    pos = {n: i for i, n in enumerate(sel)}
    n = len(sel)
    msg[0], msg[1] = KIND_TREE, n
    msg[3 : 3 + n] = torch.tensor([tree.tokens[i] for i in sel])
    msg[3 + bs : 3 + bs + n] = torch.tensor([pos[tree.parents[i]] if i else -1 for i in sel])
    msg[3 + 2 * bs : 3 + 2 * bs + n] = torch.tensor([tree.depths[i] for i in sel])
    return msg


def unpack_subtree(msg: torch.Tensor, policy: TreePolicy) -> DraftTree:
    """The target's copy of a subtree: nodes 0..n-1, children in draft-rank order."""
    bs = policy.bs
    v = msg.tolist()
    n = v[1]
    tokens, parents, depths = v[3 : 3 + n], v[3 + bs : 3 + bs + n], v[3 + 2 * bs : 3 + 2 * bs + n]
    children: list[list[int]] = [[] for _ in range(n)]
    for i in range(1, n):
        children[parents[i]].append(i)
    return DraftTree(policy, tokens=tokens, parents=parents, depths=depths, cum_logprob=[0.0] * n,
                     slots=list(range(n)), children=children, topo=[-1] * n, num_slots=n)


def pack_verdict(kind: int, verdict: Verdict, bonus_rank: int, bs: int) -> torch.Tensor:
    msg = torch.zeros(4 + bs, dtype=torch.long)
    k = len(verdict.path)
    msg[0], msg[1], msg[2], msg[3] = kind, k, verdict.bonus, bonus_rank
    msg[4 : 4 + k] = torch.tensor(verdict.path)
    return msg


# --------------------------------------------------------------------------------------------
# async: the draft side


def _expand(tree: DraftTree, fwd, runner, fwd_nodes: list[int], fwd_tokens: list[int]) -> bool:
    """One draft forward, logged in `fwd_nodes` / `fwd_tokens`; False when nothing is left to expand."""
    pending = len(runner.pending)
    f = tree.expand(fwd, runner.top_logprobs)
    if f:
        fwd_nodes.append(f)
        fwd_tokens.append(pending + f)
    return f > 0


def _device_side(ctx: Ctx, task: Task) -> bool:
    """Whether this task's async loops run on the device (`Job.loop`; static trees keep the host loop)."""
    return ctx.job.loop == "device" and task.policy.kind == "dynamic"


@gc_paused
def _async_draft_device(ctx: Ctx, task: Task, runner: ModelRunner, prompt: list[int], t0: float) -> tuple[list, list]:
    """`_async_draft` with the tree on the device (`device_async.AsyncDraftLoop`)."""
    lay, g, policy, job = ctx.layout, ctx.groups, task.policy, ctx.job
    leader = ctx.rank == lay.draft_leader
    link = Link(g.link, lay.target_leader) if leader else None
    synthetic = job.rank_paths is not None
    key = ("async-draft", policy, job.max_new_tokens, synthetic)
    dl = runner.loops.get(key)
    if dl is None:
        logq = tuple(job.rank_logprobs) if synthetic and job.rank_logprobs else None
        dl = runner.loops[key] = AsyncDraftLoop(runner, policy, job.max_new_tokens, logq)
    dl.start(prompt[-1])
    ms = lambda: (time.perf_counter() - t0) * 1e3  # noqa: E731
    vbuf = torch.zeros(4 + policy.bs, dtype=torch.long)
    rows, counts = [], []
    it = 0
    while True:
        ctx.step()
        row = {"iteration": it, "draft_start_ms": ms()}
        forwards, first = 0, True
        size, open_, kept = dl.probe()
        if it > 0:  # what the previous iteration's re-root kept (the last iteration does not re-root)
            rows[-1]["kept"] = kept
        while size < policy.bs and open_ > 0:  # immediate expansions
            dl.expand(first)
            first, forwards = False, forwards + 1
            size, open_, _ = dl.probe()
        row["pre_forwards"] = forwards
        smsg = dl.select()
        row.update(sent=int(smsg[1]), tree_size=size)
        work = link.isend(smsg) if leader else None  # smsg stays untouched until work.wait()
        row["send_ms"] = ms()
        for _ in range(policy.d):  # overlapped with the target's verify
            dl.expand(first)
            first, forwards = False, forwards + 1
        row["draft_end_ms"] = row["wait_start_ms"] = ms()
        if leader:
            work.wait()
            link.recv(vbuf)
        broadcast(vbuf, lay.draft_leader, g.draft_ctrl, len(lay.draft_ranks))
        row["wait_end_ms"] = ms()
        kind, k = int(vbuf[0]), int(vbuf[1])
        c0 = time.perf_counter()
        dl.apply(vbuf)
        row.update(accepted=k, draft_forwards=forwards, commit_ms=(time.perf_counter() - c0) * 1e3)
        rows.append(row)
        counts.append(forwards)
        it += 1
        if kind == KIND_DONE:
            break
    ctx.sync()
    out, fwd_tokens = dl.result()
    at = 0
    for row, n in zip(rows, counts):
        row["forward_tokens"] = fwd_tokens[at : at + n]
        row["draft_tokens"] = sum(row["forward_tokens"])
        row["draft_gpu_ms"] = 0.0  # inside the device loop's graphs; not timed apart
        at += n
    return out[: job.max_new_tokens], rows


@gc_paused
def _async_target_device(ctx: Ctx, task: Task, runner: ModelRunner, prompt_index: int, t0: float) -> list:
    """`_async_target` with verification on the device (`device_async.AsyncTargetLoop`)."""
    lay, g, policy, job = ctx.layout, ctx.groups, task.policy, ctx.job
    leader = ctx.rank == lay.target_leader
    link = Link(g.link, lay.draft_leader) if leader else None
    if job.rank_paths:
        kind_v, stream = "synthetic", job.rank_paths[prompt_index]
    elif job.sampling.greedy:
        kind_v, stream = "greedy", None
    else:
        kind_v = "sampled"
        sv = SamplingVerifier(job.sampling.for_prompt(prompt_index))
        stream = [sv.uniform(i) for i in range(job.max_new_tokens + 2 * policy.bs + 2)]
    key = ("async-target", policy, kind_v, job.sampling)
    tl_ = runner.loops.get(key)
    if tl_ is None:
        tl_ = runner.loops[key] = AsyncTargetLoop(runner, policy, kind_v, job.sampling,
                                                  job.max_new_tokens + 2 * policy.bs + 2)  # fmt: skip
    tl_.start(stream)
    ms = lambda: (time.perf_counter() - t0) * 1e3  # noqa: E731
    sbuf = torch.zeros(3 + 3 * policy.bs, dtype=torch.long)
    produced, rows, pending_send, it = 0, [], None, 0
    while True:
        ctx.step()
        w0 = ms()
        if leader:
            link.recv(sbuf)
        broadcast(sbuf, lay.target_leader, g.target_ctrl, len(lay.target_ranks))
        row = {"iteration": it, "target_wait_ms": ms() - w0, "target_start_ms": ms(), "kv_len": runner.prefix_len}
        v = tl_.step(sbuf)
        row["target_end_ms"] = ms()
        k = v[1]
        if kind_v == "synthetic":
            path = job.rank_paths[prompt_index]
            row["ranks"] = [path[produced + j] if produced + j < len(path) else -1 for j in range(k)]
        produced += k
        runner.prefix_len += k
        kind = KIND_DONE if produced >= job.max_new_tokens else KIND_MORE
        if leader:
            if pending_send is not None:
                pending_send[0].wait()
            msg = torch.tensor([kind, *v[1:]], dtype=torch.long)
            pending_send = (link.isend(msg), msg)
            row["target_send_ms"] = ms()
        row["target_gpu_ms"] = 0.0  # inside the verify graph; not timed apart
        rows.append(row)
        it += 1
        if kind == KIND_DONE:
            if pending_send is not None:
                pending_send[0].wait()
            return rows


@gc_paused
def _async_draft(ctx: Ctx, task: Task, runner: ModelRunner, prompt: list[int], t0: float) -> tuple[list, list]:
    """Algorithm 1, draft side, one prompt. Returns (generated tokens, iteration rows) on the leader."""
    if _device_side(ctx, task):
        return _async_draft_device(ctx, task, runner, prompt, t0)
    lay, g, policy = ctx.layout, ctx.groups, task.policy
    leader = ctx.rank == lay.draft_leader
    link = Link(g.link, lay.target_leader) if leader else None
    timer = SpanTimer(ctx.device)
    ms = lambda: (time.perf_counter() - t0) * 1e3  # noqa: E731

    def fwd(*args):
        s = timer.begin()
        out = runner.forward_tree(*args)
        timer.end(s)
        return out

    vbuf = torch.zeros(4 + policy.bs, dtype=torch.long)
    tree = DraftTree.fresh(prompt[-1], policy, ctx.job.rank_logprobs if ctx.job.rank_paths else None)
    out: list[int] = []
    rows: list[dict] = []
    it = 0
    while True:
        ctx.step()
        row = {"iteration": it, "draft_start_ms": ms()}
        fwd_nodes: list[int] = []  # tree nodes forwarded, per draft forward
        fwd_tokens: list[int] = []  # the same, pending verified tokens included
        while len(tree) < policy.bs and _expand(tree, fwd, runner, fwd_nodes, fwd_tokens):  # immediate expansions (and a fresh tree's first ones)
            pass
        row["pre_forwards"] = len(fwd_tokens)
        sel = tree.select(policy.bs)
        row.update(sent=len(sel), tree_size=len(tree))
        smsg = pack_subtree(tree, sel, policy.bs)
        work = link.isend(smsg) if leader else None  # smsg stays alive until work.wait()
        row["send_ms"] = ms()
        for _ in range(policy.d):  # overlapped with the target's verify of `sel`
            if not _expand(tree, fwd, runner, fwd_nodes, fwd_tokens):
                break
        row["draft_end_ms"] = row["wait_start_ms"] = ms()
        if leader:
            work.wait()
            link.recv(vbuf)
        broadcast(vbuf, lay.draft_leader, g.draft_ctrl, len(lay.draft_ranks))
        row["wait_end_ms"] = ms()
        v = vbuf.tolist()
        kind, k, bonus, bonus_rank = v[:4]
        path = [sel[i] for i in v[4 : 4 + k]]
        if bonus_rank != NOT_SYNTHETIC:  # synthetic: the draft, which holds the whole tree, names it
            bonus = resolve_bonus(tree, path[-1], bonus_rank, bonus)
        verdict = Verdict(path=path, bonus=bonus)
        out.extend(verdict.new_tokens(tree))
        gpu = timer.collect()
        row.update(accepted=k, draft_forwards=len(fwd_nodes), draft_tokens=sum(fwd_nodes), draft_gpu_ms=sum(gpu),
                   forward_tokens=fwd_tokens)
        if kind == KIND_DONE:
            row["commit_ms"] = 0.0
            rows.append(row)
            break
        c0 = time.perf_counter()
        found = not tree.static and tree.child_with_token(path[-1], bonus) is not None
        tree = reroot_draft(runner, tree, verdict, keep_subtree=True, keep=policy.keep_limit)
        row.update(kept=len(tree) if found else 0, commit_ms=(time.perf_counter() - c0) * 1e3)
        rows.append(row)
        it += 1
    return out[: ctx.job.max_new_tokens], rows


# --------------------------------------------------------------------------------------------
# async: the target side


@gc_paused
def _async_target(ctx: Ctx, task: Task, runner: ModelRunner, prompt_index: int, t0: float) -> list:
    """Algorithm 1, target side, one prompt. Returns iteration rows on the leader."""
    if _device_side(ctx, task):
        return _async_target_device(ctx, task, runner, prompt_index, t0)
    lay, g, policy, job = ctx.layout, ctx.groups, task.policy, ctx.job
    leader = ctx.rank == lay.target_leader
    link = Link(g.link, lay.draft_leader) if leader else None
    timer = SpanTimer(ctx.device)
    ms = lambda: (time.perf_counter() - t0) * 1e3  # noqa: E731
    verifier = (SyntheticVerifier(job.rank_paths[prompt_index]) if job.rank_paths
                else make_verifier(job.sampling.for_prompt(prompt_index)))
    sbuf = torch.zeros(3 + 3 * policy.bs, dtype=torch.long)
    produced, rows, pending_send = 0, [], None
    it = 0
    while True:
        ctx.step()
        w0 = ms()
        if leader:
            link.recv(sbuf)
        broadcast(sbuf, lay.target_leader, g.target_ctrl, len(lay.target_ranks))
        row = {"iteration": it, "target_wait_ms": ms() - w0, "target_start_ms": ms()}
        sub = unpack_subtree(sbuf, policy)
        selected = list(range(len(sub)))
        row["kv_len"] = runner.prefix_len
        s = timer.begin()
        logits = runner.forward_tree(*sub.verify_inputs(selected))
        timer.end(s)
        verdict = verifier.verify(sub, selected, logits)
        row["target_end_ms"] = ms()
        runner.commit(verdict.path)
        produced += len(verdict.path)
        kind = KIND_DONE if produced >= job.max_new_tokens else KIND_MORE
        rank = verifier.last_bonus_rank if isinstance(verifier, SyntheticVerifier) else NOT_SYNTHETIC
        if leader:
            if pending_send is not None:
                pending_send[0].wait()
            msg = pack_verdict(kind, verdict, rank, policy.bs)
            pending_send = (link.isend(msg), msg)  # the buffer lives until the send completes
            row["target_send_ms"] = ms()
        row["target_gpu_ms"] = timer.collect()[0]
        if isinstance(verifier, SyntheticVerifier):
            row["ranks"] = verifier.consumed[-1]
        rows.append(row)
        it += 1
        if kind == KIND_DONE:
            if pending_send is not None:
                pending_send[0].wait()
            return rows


# --------------------------------------------------------------------------------------------
# co-located baselines: generate.generate on TP-sharded models


def _colocated(ctx: Ctx, task: Task) -> dict | None:
    lay, g, job = ctx.layout, ctx.groups, ctx.job
    ranks = lay.colocated
    tp, tp_rank = len(ranks), ranks.index(ctx.rank)
    policy = task.policy if task.mode is not Mode.autoregressive else TreePolicy.autoregressive()
    longest = max(len(p) for p in job.prompts)
    tmodel = _model(ctx, "target", tp_rank, tp, g.colo_tp)
    target = _runner(tmodel, target_slots(longest, job.max_new_tokens, policy), _vocab_limit(ctx, tmodel))
    draft = None
    if task.mode is not Mode.autoregressive:
        dmodel = _model(ctx, "draft", tp_rank, tp, g.colo_tp)
        draft = _runner(dmodel, draft_slots(longest, job.max_new_tokens, policy), _vocab_limit(ctx, dmodel))
    synthetic = job.rank_paths is not None and draft is not None
    cfg = GenerateConfig(mode=task.mode, policy=policy, max_new_tokens=job.max_new_tokens, keep_subtree=False,
                         rank_logprobs=tuple(job.rank_logprobs) if synthetic and job.rank_logprobs else None,
                         loop=job.loop)
    prompts, rows = [], []
    for pi, prompt in enumerate(job.prompts):
        ctx.step()
        target.reset()
        if draft is not None:
            draft.reset()
        synth = SyntheticVerifier(job.rank_paths[pi]) if synthetic else None
        verifier = synth or make_verifier(job.sampling.for_prompt(pi))
        ctx.sync()
        dist.barrier(group=g.colo_ctrl)
        res = generate(target, draft, prompt, cfg, verifier=verifier, weights=job.weights)
        prompts.append(_prompt_row(task, pi, res.tokens, res.decode_s, res.prefill_ms, res.iterations))
        if ctx.rank == ranks[0]:
            _report_prompt(ctx, task, prompts[-1])
        t = 0.0
        for i, r in enumerate(res.records):
            row = {"task": task.label, "mode": task.mode.value, "policy": policy.key, "prompt": pi, "iteration": i,
                   "draft_start_ms": t, "draft_end_ms": t + r.draft_ms, "draft_gpu_ms": r.draft_ms,
                   "draft_forwards": r.draft_forwards, "draft_tokens": r.draft_tokens,
                   "target_start_ms": t + r.draft_ms, "target_end_ms": t + r.draft_ms + r.verify_ms,
                   "target_gpu_ms": r.verify_ms, "commit_ms": r.commit_ms, "accepted": r.accepted,
                   "sent": r.verified, "tree_size": r.tree_nodes, "forward_tokens": list(r.forward_tokens)}  # fmt: skip
            if synth is not None:
                row["ranks"] = synth.consumed[i]
            rows.append(row)
            t += r.draft_ms + r.verify_ms + r.commit_ms
    return {"prompts": prompts, "rows": rows} if ctx.rank == ranks[0] else None


def _report_prompt(ctx: Ctx, task: Task, row: dict) -> None:
    """One progress line per prompt done: "run: serial bs8-w8-d4 prompt 3/8 done, 45.1 tok/s"."""
    ctx.report(f"run: {task.label} prompt {row['prompt'] + 1}/{len(ctx.job.prompts)} done, "
               f"{row['tokens_per_s']:.1f} tok/s")


def _prompt_row(task: Task, pi: int, tokens: list[int], decode_s: float, prefill_ms: float, iterations: int) -> dict:
    return {"task": task.label, "mode": task.mode.value, "policy": task.policy.key, "prompt": pi,
            "tokens": list(tokens), "generated": len(tokens), "decode_s": decode_s,
            "tokens_per_s": len(tokens) / decode_s if decode_s > 0 else 0.0, "prefill_ms": prefill_ms,
            "iterations": iterations, "mean_accepted": len(tokens) / max(iterations, 1)}  # fmt: skip


# --------------------------------------------------------------------------------------------
# async task on all ranks


def _async(ctx: Ctx, task: Task) -> dict | None:
    lay, g, job = ctx.layout, ctx.groups, ctx.job
    longest = max(len(p) for p in job.prompts)
    is_draft = lay.role(ctx.rank) == "draft"
    if is_draft:
        ranks = lay.draft_ranks
        m = _model(ctx, "draft", ranks.index(ctx.rank), len(ranks), g.draft_tp)
        runner = _runner(m, draft_slots(longest, job.max_new_tokens, task.policy), _vocab_limit(ctx, m))
    else:
        ranks = lay.target_ranks
        m = _model(ctx, "target", ranks.index(ctx.rank), len(ranks), g.target_tp)
        runner = _runner(m, target_slots(longest, job.max_new_tokens, task.policy), _vocab_limit(ctx, m))
    prompts, rows = [], []
    for pi, prompt in enumerate(job.prompts):
        ctx.step()
        runner.reset()
        p0 = time.perf_counter()
        runner.prefill(prompt[:-1])
        ctx.sync()
        prefill_ms = (time.perf_counter() - p0) * 1e3
        dist.barrier()  # world (gloo): both groups start decoding together
        t0 = time.perf_counter()
        if is_draft:
            tokens, r = _async_draft(ctx, task, runner, prompt, t0)
            decode_s = time.perf_counter() - t0
            prompts.append(_prompt_row(task, pi, tokens, decode_s, prefill_ms, len(r)))
            if ctx.rank == lay.draft_leader:
                _report_prompt(ctx, task, prompts[-1])
        else:
            r = _async_target(ctx, task, runner, pi, t0)
        for row in r:
            row.update(task=task.label, mode=task.mode.value, policy=task.policy.key, prompt=pi)
        rows.extend(r)
    if ctx.rank == lay.draft_leader:
        return {"prompts": prompts, "rows": rows, "side": "draft"}
    if ctx.rank == lay.target_leader:
        return {"rows": rows, "side": "target"}
    return None


def _merge(parts: list[dict | None]) -> dict:
    """Join the leaders' outputs of one task: draft and target rows on (prompt, iteration)."""
    parts = [p for p in parts if p]
    prompts = [r for p in parts for r in p.get("prompts", [])]
    draft = {(r["prompt"], r["iteration"]): r for p in parts if p.get("side") != "target" for r in p["rows"]}
    for p in parts:
        if p.get("side") == "target":
            for r in p["rows"]:
                key = (r["prompt"], r["iteration"])
                base = draft.setdefault(key, {})
                base.update({k: v for k, v in r.items() if k not in base or k.startswith("target")})
                base.setdefault("ranks", r.get("ranks"))
    rows = sorted(draft.values(), key=lambda r: (r["prompt"], r["iteration"]))
    return {"prompts": prompts, "rows": rows}


def run_worker(ctx: Ctx) -> list[dict] | None:
    """Run every task of the job on this rank. Rank 0 returns one {task, prompts, rows} per task."""
    out = []
    world = ctx.layout.world
    for task in ctx.job.tasks:
        if task.mode is Mode.async_:
            part = _async(ctx, task)
        elif ctx.rank in ctx.layout.colocated:
            part = _colocated(ctx, task)
        else:
            part = None
        gathered = [None] * world if ctx.rank == 0 else None
        dist.gather_object(part, gathered, dst=0, group=ctx.groups.idle)  # ranks outside the task wait here
        ctx.beat()
        if ctx.rank == 0:
            out.append({"task": task.label, **_merge(gathered)})
    return out if ctx.rank == 0 else None
