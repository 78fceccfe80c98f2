"""Algorithm 1 (`engine.py`) with each side's loop on the device: `async` with `--loop device`.

Between messages neither side keeps a tree on the host. The draft side is a `DeviceLoop` without a
target: its expansions, selection and re-root are captured graphs over the device tree (a kept
subtree, so the torch bookkeeping); the target side builds the verify inputs from the subtree
message, verifies, accepts and commits in one graph. The link is what it was, fixed-size int64
messages between the leaders over gloo, so each message crosses the host once:

  draft   probe (tree size, open nodes; one copy) -> expand while the tree holds < bs nodes ->
          select: the subtree message, one copy, isend -> expand d times -> recv the verdict,
          one copy to the device -> accept, emit, re-root (one graph)
  target  recv the subtree, one copy to the device -> verify (one graph) -> the verdict, one copy
          -> isend

Messages and tree semantics are the host loop's (`engine.pack_subtree`, `pack_verdict`), so the
two loops decode the same tokens; static trees keep the host loop.
"""

from __future__ import annotations

import torch

from swiftspec.runtime.capture import capture_graphs
from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.device_loop import (
    DeviceLoop,
    LoopConfig,
    LoopPlan,
    ModelSide,
    accept,
    outside_or_child,
    target_choice,
)
from swiftspec.runtime.groups import KIND_TREE
from swiftspec.runtime.synthetic import NOT_SYNTHETIC
from swiftspec.spec import SamplingParams, TreePolicy


class _Graphs:
    """Named steps, captured as CUDA graphs on first use (warmed up first), else run eagerly.
    Steps that change state are warmed up on the state as it is: capture happens at the start of a
    prompt, and the caller resets the state after `capture`."""

    def __init__(self, steps: dict, use_graphs: bool):
        self.steps, self.use_graphs, self.graphs = steps, use_graphs, {}

    def capture(self, names: list[str]) -> None:
        if not self.use_graphs:
            return
        graphs, _ = capture_graphs([self.steps[name] for name in names])
        self.graphs.update(zip(names, graphs))

    def __call__(self, name: str) -> None:
        g = self.graphs.get(name)
        if g is not None:
            g.replay()
        else:
            self.steps[name]()


def _to_host(src: torch.Tensor, pinned: torch.Tensor) -> list[int]:
    pinned.copy_(src, non_blocking=True)
    if src.is_cuda:
        torch.cuda.current_stream().synchronize()
    return pinned.tolist()


class AsyncDraftLoop:
    """The draft side of Algorithm 1 on device tensors (module docstring). One per runner and
    policy; `start` per prompt. fused: expansions by the Triton kernels (`DeviceLoop`; None: on
    CUDA)."""

    def __init__(self, runner: ModelRunner, policy: TreePolicy, max_new_tokens: int,
                 rank_logprobs: tuple[float, ...] | None = None, fused: bool | None = None):
        self.policy, self.bs = policy, policy.bs
        vocab = runner.vocab_limit or runner.model.spec.vocab
        imm = -(-(policy.bs - 1) // max(min(policy.w, vocab), 1))  # expansions a fresh tree needs to reach bs
        plan = LoopPlan.build(policy, vocab, keep=True, rounds=max(imm + policy.d, 2))
        cfg = LoopConfig(plan=plan, verify="synthetic" if rank_logprobs else "greedy", max_new_tokens=max_new_tokens,
                         rank_logprobs=rank_logprobs, bs=policy.bs)  # fmt: skip
        self.loop = lp = DeviceLoop(None, runner, cfg, graphs=False, fused=fused)
        dev = lp.dev
        self.first, self.later = plan.expansions[0], plan.expansions[1]
        self.sel = torch.zeros(self.bs, dtype=torch.long, device=dev)
        self.msg = torch.zeros(3 + 3 * self.bs, dtype=torch.long, device=dev)
        self.verdict = torch.zeros(4 + self.bs, dtype=torch.long, device=dev)
        self.probe_out = torch.zeros(3, dtype=torch.long, device=dev)  # tree size, open nodes, kept
        self.kept = torch.zeros((), dtype=torch.long, device=dev)
        pin = dev.type == "cuda"
        self.h_msg = torch.zeros(3 + 3 * self.bs, dtype=torch.long, pin_memory=pin)
        self.h_probe = torch.zeros(3, dtype=torch.long, pin_memory=pin)
        self.h_verdict = torch.zeros(4 + self.bs, dtype=torch.long, pin_memory=pin)
        self.fwd_log = torch.zeros(cfg.max_new_tokens * (imm + policy.d + 2) + 8, dtype=torch.long, device=dev)
        self.nfwd = torch.zeros((), dtype=torch.long, device=dev)
        steps = {"first": lambda: self._expand(0, self.first), "later": lambda: self._expand(1, self.later),
                 "select": self._select, "apply": self._apply, "probe": self._probe}  # fmt: skip
        self.graphs = _Graphs(steps, dev.type == "cuda")

    def start(self, root: int) -> None:
        """Reset for a prompt whose prefix the runner holds (its last token is the root)."""
        if self.graphs.use_graphs and not self.graphs.graphs:
            self._reset(root)
            self.graphs.capture(["probe", "first", "later", "select", "apply"])
        self._reset(root)

    def _reset(self, root: int) -> None:
        lp = self.loop
        lp.d.prefix.fill_(lp.d.runner.prefix_len)
        lp.d.pend_n.zero_()
        lp._reset_tree(torch.tensor(root, dtype=torch.long, device=lp.dev))
        for x in (lp.pos, lp.nout, lp.iters, self.nfwd, self.kept):
            x.zero_()
        lp.done.zero_()

    # ---- steps (graphs on CUDA) ------------------------------------------------------------

    def _probe(self) -> None:
        lp = self.loop
        open_ = (lp.ar_n < lp.count) & (lp.slot[: lp.N] < 0)
        if self.policy.max_depth > 0:
            open_ &= lp.dep[: lp.N] < self.policy.max_depth
        self.probe_out.copy_(torch.stack([lp.count, open_.sum(), self.kept]))

    def _expand(self, e: int, x) -> None:
        lp = self.loop
        lp._expand(e, x)
        self.fwd_log[self.nfwd.view(1)] = lp._fwd_tok[e].view(1)
        self.nfwd += 1

    def _select(self) -> None:
        """The bs best nodes and the subtree message (`engine.pack_subtree`)."""
        lp, bs, N = self.loop, self.bs, self.loop.N
        sel = lp._pick(lp.ar_n < lp.count, bs)
        self.sel.copy_(sel)
        vs = sel < N
        inv = torch.zeros(N + 1, dtype=torch.long, device=lp.dev)
        inv[sel] = torch.arange(bs, device=lp.dev)
        fields = lp.nodes[:, sel]
        par = torch.where(sel == 0, -1, inv[fields[1].clamp(min=0)])
        head = torch.stack([torch.full_like(lp.count, KIND_TREE), vs.sum(), torch.zeros_like(lp.count)])
        self.msg.copy_(torch.cat([head, torch.where(vs, fields[0], 0), torch.where(vs, par, 0),
                                  torch.where(vs, fields[2], 0)]))

    def _apply(self) -> None:
        """The verdict (`engine.pack_verdict`, on the device): emit the path's tokens and the
        bonus, then re-root at the bonus token (its subtree kept) or start a fresh tree."""
        lp, N = self.loop, self.loop.N
        ar = lp.ar_bs
        k, bonus, bonus_rank = self.verdict[1], self.verdict[2:3], self.verdict[3]
        on_path = ar < k
        rows = torch.where(on_path, self.verdict[4:], 0)
        path_nodes = torch.where(on_path, self.sel[rows], N)
        last = path_nodes[(k - 1).clamp(min=0).view(1)]
        bonus = torch.where(bonus_rank != NOT_SYNTHETIC, lp._synthetic_bonus(last, bonus, bonus_rank), bonus)
        nxt = torch.cat([path_nodes[1:], path_nodes.new_full((1,), N)])
        live = ~lp.done
        lp._emit(torch.where(ar == k - 1, bonus, lp.tok[nxt]), k, live)
        kid = (lp.ar_n < lp.count) & (lp.par[:N] == last) & (lp.tok[:N] == bonus)
        found = kid.any()
        lp._reroot(path_nodes, on_path, last, bonus, live)
        self.kept.copy_(torch.where(found, lp.count, 0))

    # ---- the host side of one iteration ----------------------------------------------------

    def probe(self) -> tuple[int, int, int]:
        """(tree size, open nodes, nodes kept by the last re-root), one copy."""
        self.graphs("probe")
        return tuple(_to_host(self.probe_out, self.h_probe))

    def expand(self, first: bool) -> None:
        self.graphs("first" if first else "later")

    def select(self) -> torch.Tensor:
        """The subtree message on the host (a pinned buffer: send it, then wait before the next)."""
        self.graphs("select")
        _to_host(self.msg, self.h_msg)
        return self.h_msg

    def apply(self, verdict: torch.Tensor) -> None:
        self.verdict.copy_(verdict, non_blocking=True)
        self.graphs("apply")

    def result(self) -> tuple[list[int], list[int]]:
        """(the tokens produced, tokens of every draft forward in order)."""
        lp = self.loop
        n, f = int(lp.nout), int(self.nfwd)
        lp.d.runner.prefix_len = int(lp.d.prefix)
        lp.d.runner.pending = [int(lp.d.pend_tok)] if int(lp.d.pend_n) else []
        return lp.out[:n].tolist(), self.fwd_log[:f].tolist()


class AsyncTargetLoop:
    """The target side of Algorithm 1 on device tensors: the subtree message in, the verdict out
    (module docstring). verify: "greedy", "sampled" (uniforms `stream` by output position, as
    `verify.SamplingVerifier` draws them) or "synthetic" (the rank path `stream`)."""

    def __init__(self, runner: ModelRunner, policy: TreePolicy, verify: str, sampling: SamplingParams,
                 stream_len: int):
        self.side, self.bs, self.verify, self.sampling = ModelSide(runner), policy.bs, verify, sampling
        dev, bs = runner.device, policy.bs
        self.dev = dev
        self.msg = torch.zeros(3 + 3 * bs, dtype=torch.long, device=dev)
        self.verdict = torch.zeros(4 + bs, dtype=torch.long, device=dev)
        self.h_verdict = torch.zeros(4 + bs, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.stream_len = stream_len
        self.stream = torch.zeros(stream_len, dtype=torch.float64 if verify == "sampled" else torch.long, device=dev)
        self.pos = torch.zeros((), dtype=torch.long, device=dev)
        self.ar = torch.arange(bs, device=dev)
        self.graphs = _Graphs({"verify": self._verify}, dev.type == "cuda")

    def start(self, stream=None) -> None:
        """Reset for a prompt whose prefix the runner holds; stream: uniforms or rank path."""
        if self.graphs.use_graphs and not self.graphs.graphs:
            self._reset(stream)
            self.msg.zero_()
            self.msg[1] = 1  # a one-node subtree for the warm-up
            self.graphs.capture(["verify"])
        self._reset(stream)

    def _reset(self, stream) -> None:
        self.side.prefix.fill_(self.side.runner.prefix_len)
        self.pos.zero_()
        if stream is not None:
            vals = list(stream)[: self.stream_len]
            vals += [-1 if self.verify == "synthetic" else 0.0] * (self.stream_len - len(vals))
            self.stream.copy_(torch.tensor(vals, dtype=self.stream.dtype))

    def _verify(self) -> None:
        side, bs, ar, msg = self.side, self.bs, self.ar, self.msg
        n = msg[1]
        tok, par, dep = msg[3 : 3 + bs], msg[3 + bs : 3 + 2 * bs], msg[3 + 2 * bs :]
        vs = ar < n
        # ancestor-or-self closure of the parent links (parents precede children): log2(bs) squarings
        anc = (ar[:, None] == ar[None, :]) | ((par[:, None] == ar[None, :]) & vs[:, None])
        for _ in range(max(bs - 1, 1).bit_length()):
            anc = anc | ((anc.float() @ anc.float()) > 0)
        mask = anc & vs[:, None] & vs[None, :]
        mask[:, 0] |= ~vs
        tp = side.prefix
        logits = side.forward(torch.where(vs, tok, 0), torch.where(vs, tp + dep, 0), torch.where(vs, tp + ar, side.scratch),
                              tp, mask)
        step = self.pos + dep
        choice = target_choice(logits, self.verify, self.sampling, self.stream, step)
        # a node's rank among its siblings (children come in draft-rank order)
        sib = ((par[None, :] == par[:, None]) & (ar[None, :] < ar[:, None]) & vs[None, :]).sum(dim=1)
        if self.verify == "synthetic":
            ok = sib == self.stream[(step - 1).clamp(0, self.stream_len - 1)]
        else:
            ok = tok == choice[par.clamp(min=0)]
        k, last_row, path_rows = accept(mask, vs & ((ar == 0) | ok), vs, dep)
        bonus = choice[last_row]
        bonus_rank = torch.full_like(k, NOT_SYNTHETIC)
        if self.verify == "synthetic":  # synthetic.resolve_bonus over the subtree; the draft re-resolves
            bonus_rank = self.stream[(self.pos + dep[last_row]).clamp(max=self.stream_len - 1)][0]
            kid = vs & (par == last_row)
            bonus = outside_or_child(kid, tok, kid & (sib == bonus_rank), bonus, bs + 1)
        on_path = ar < k
        src = torch.where(on_path, tp + path_rows.clamp(max=bs - 1), side.scratch)
        side.move(src, torch.where(on_path, tp + ar, side.scratch))
        side.prefix += k
        self.pos += k
        self.verdict.copy_(torch.cat([torch.stack([torch.zeros_like(k), k, bonus[0], bonus_rank]),
                                      torch.where(on_path, path_rows, 0)]))

    def step(self, subtree: torch.Tensor) -> list[int]:
        """Verify one subtree message (host int64); returns the verdict as host ints
        [0, path length, bonus, bonus rank, path rows...] (the caller sets the kind)."""
        self.msg.copy_(subtree, non_blocking=True)
        self.graphs("verify")
        return _to_host(self.verdict, self.h_verdict)

