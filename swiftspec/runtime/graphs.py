"""CUDA graphs for `Transformer.forward` at fixed token counts ("buckets"); eager on CPU.

A host step of eager PyTorch costs far more than the GPU work of a batch-1 decode step (7-11x;
docs/design.md), so on CUDA every forward is a graph replay. One graph per bucket size b (1, 2, 4, ... 256
tokens); a call with T tokens replays the smallest bucket b >= T after copying the inputs into
static buffers and padding rows T..b-1 with dummy tokens that write their K/V to the cache's
scratch slot and attend only to tree slot 0 (never NaN, never visible to real tokens).

All buckets share the static inputs (views of one buffer each) and one memory pool; the mask
buffer is (max_bucket, max_tree) wide, so calls may pass any tree_mask width N <= max_tree.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import numpy as np
import torch

from swiftspec.kernels.topk import MAX_K, logsoftmax_topk_packed, unpack_topk
from swiftspec.runtime.capture import capture_graphs
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.model import Transformer
from swiftspec.runtime.tree import to_host

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class GraphRunner:
    """`run(tokens, positions, slots, prefix_len, tree_mask) -> logits (T, vocab)` via CUDA graphs.

    model, cache: the rank's model and the cache every graph reads and writes (fixed: a graph
    holds its buffers' addresses). buckets: token counts to capture. max_tree: widest tree_mask
    (tree-region slots) any call passes. capture=False (or a CPU model): plain eager calls.
    Calls with more tokens than the largest bucket or a wider mask than max_tree run eagerly and
    are counted in `eager_calls`.
    """

    def __init__(
        self,
        model: Transformer,
        cache: KVCache,
        *,
        buckets: tuple[int, ...] = DEFAULT_BUCKETS,
        max_tree: int | None = None,
        capture: bool = True,
        warmup: int = 2,
    ):
        self.model, self.cache = model, cache
        self.buckets = tuple(sorted(set(buckets)))
        self.max_tree = max_tree if max_tree is not None else self.buckets[-1]
        self.use_graphs = capture and model.device.type == "cuda"
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.eager_calls = 0
        self.replays = 0  # graph replays so far; `last_bucket`: the latest one's bucket (None: eager)
        self.last_bucket: int | None = None
        # (bucket, k, vocab_limit) -> (graph, packed top-k): tree growth on the static logits
        self.topk_graphs: dict[tuple[int, int, int | None], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if self.use_graphs:
            self._capture(warmup)

    def _capture(self, warmup: int) -> None:
        bmax = self.buckets[-1]
        self.inputs = StaticInputs(bmax, self.max_tree, self.cache.scratch_slot, self.model.device)
        self.tokens, self.positions, self.slots = self.inputs.tokens, self.inputs.positions, self.inputs.slots
        self.prefix_len, self.tree_mask = self.inputs.prefix_len, self.inputs.tree_mask
        buckets = list(reversed(self.buckets))  # largest first: smaller graphs reuse its pool memory
        steps = [functools.partial(self.model, self.tokens[:b], self.positions[:b], self.cache, self.slots[:b],
                                   self.prefix_len, self.tree_mask[:b]) for b in buckets]
        graphs, outputs = capture_graphs(steps, warmup=max(warmup, 1))
        self.graphs.update(zip(buckets, graphs))
        self.outputs.update(zip(buckets, outputs))

    def bucket(self, t: int) -> int | None:
        """Smallest captured bucket holding t tokens (None: too many)."""
        return next((b for b in self.buckets if b >= t), None)

    def run(
        self,
        tokens: torch.Tensor | Sequence[int],
        positions: torch.Tensor | Sequence[int],
        slots: torch.Tensor | Sequence[int],
        prefix_len: torch.Tensor | int,
        tree_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Same arguments and result as `Transformer.forward` (minus the cache, fixed here).

        Host inputs (lists or CPU tensors, prefix_len an int, a CPU mask: what `ModelRunner`
        passes) reach the graph's static buffers in one copy from pinned memory; device tensors
        are copied buffer by buffer on the device.
        """
        t, n = len(tokens), tree_mask.shape[1]
        b = self.bucket(t) if self.use_graphs else None
        self.last_bucket = None
        if b is None or n > self.max_tree:
            if self.use_graphs:
                self.eager_calls += 1
            dev = self.model.device
            tokens, positions, slots, tree_mask = (torch.as_tensor(x, dtype=dt, device=dev) for x, dt in (
                (tokens, torch.long), (positions, torch.long), (slots, torch.long), (tree_mask, torch.bool)))
            return self.model(tokens, positions, self.cache, slots, prefix_len, tree_mask)
        if isinstance(prefix_len, int) and not any(
            isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in (tokens, positions, slots, tree_mask)
        ):
            self.inputs.stage(tokens, positions, slots, prefix_len, tree_mask, b)
        else:
            self._copy_on_device(tokens, positions, slots, prefix_len, tree_mask, b)
        self.graphs[b].replay()
        self.replays, self.last_bucket = self.replays + 1, b
        return self.outputs[b][:t].clone()

    def top_logprobs_host(self, start: int, t: int, k: int, vocab_limit: int | None = None):
        """Tree growth on the latest replay's static logits, rows start..start+t, columns
        :vocab_limit: host lists (values (t, k), indices (t, k)) as `tree.top_logprobs_host` gives
        them, from a CUDA graph of `logsoftmax_topk_packed` (one replay instead of two kernel
        launches and allocations, ~70 µs of host time on the H200), then one copy and one sync.

        The graph is captured on first use per (bucket, k rounded up to a power of two >= 8) and
        its top-k cut to k. None when the latest call ran eagerly or k > MAX_K: the caller then
        launches the kernel itself.
        """
        b = self.last_bucket
        vocab = self.outputs[b].shape[-1] if b is not None else 0
        vocab = min(vocab, vocab_limit) if vocab_limit is not None else vocab
        if b is None or k > min(MAX_K, vocab):
            return None
        kc = min(max(8, 1 << (k - 1).bit_length()), MAX_K, vocab)
        entry = self.topk_graphs.get((b, kc, vocab_limit))
        if entry is None:
            logits = self.outputs[b][:, :vocab]
            (graph,), (packed,) = capture_graphs([functools.partial(logsoftmax_topk_packed, logits, kc)])
            entry = self.topk_graphs[(b, kc, vocab_limit)] = (graph, packed)
        graph, packed = entry
        graph.replay()
        (host,) = to_host(packed)
        values, indices = unpack_topk(host.numpy(), b, kc)
        return values[start : start + t, :k].tolist(), indices[start : start + t, :k].tolist()

    def _copy_on_device(self, tokens, positions, slots, prefix_len, tree_mask, b: int) -> None:
        t, n = len(tokens), tree_mask.shape[1]
        self.tokens[:t].copy_(torch.as_tensor(tokens), non_blocking=True)
        self.positions[:t].copy_(torch.as_tensor(positions), non_blocking=True)
        self.slots[:t].copy_(torch.as_tensor(slots), non_blocking=True)
        if t < b:
            self.tokens[t:b].zero_()
            self.positions[t:b].zero_()
            self.slots[t:b].fill_(self.cache.scratch_slot)
        if isinstance(prefix_len, torch.Tensor):
            self.prefix_len.copy_(prefix_len, non_blocking=True)
        else:
            self.prefix_len.fill_(prefix_len)
        mask = self.tree_mask[:b]
        mask.zero_()
        mask[:t, :n].copy_(tree_mask, non_blocking=True)
        mask[t:, 0] = True


class StaticInputs:
    """A graph's static inputs as views of ONE device byte buffer, filled from a pinned host copy.

    Layout (bytes): tokens, positions, slots (bmax int64 each), prefix_len (one int64), then the
    tree mask (bmax, max_tree) bool. `stage` writes a call's inputs, padding rows included, into
    the host buffer with numpy and moves them with one host-to-device copy, instead of ~10 small
    copies and fills: each costs host time on the step's critical path (docs/design.md: host work).
    """

    def __init__(self, bmax: int, max_tree: int, scratch_slot: int, device: torch.device | str):
        device = torch.device(device)
        self.bmax, self.max_tree, self.scratch_slot = bmax, max_tree, scratch_slot
        self.int_bytes = 8 * (3 * bmax + 1)
        total = self.int_bytes + bmax * max_tree
        self.device_buf = torch.zeros(total, dtype=torch.uint8, device=device)
        self.host_buf = torch.zeros(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
        ints = self.device_buf[: self.int_bytes].view(torch.long)
        self.tokens, self.positions, self.slots = ints[:bmax], ints[bmax : 2 * bmax], ints[2 * bmax : 3 * bmax]
        self.prefix_len = ints[3 * bmax]  # 0-dim view: the graphs read it in place
        self.tree_mask = self.device_buf[self.int_bytes :].view(torch.bool).view(bmax, max_tree)
        host = self.host_buf.numpy()
        self._h_ints = host[: self.int_bytes].view(np.int64)
        self._h_mask = host[self.int_bytes :].view(np.bool_).reshape(bmax, max_tree)
        # until the first call, every row is padding (the capture's warm-up forwards run on these)
        self._h_ints[2 * bmax : 3 * bmax] = scratch_slot
        self._h_mask[:, 0] = True
        self.device_buf.copy_(self.host_buf)
        # the host buffer may be rewritten only after the previous copy has read it
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def stage(self, tokens, positions, slots, prefix_len: int, tree_mask: torch.Tensor, b: int) -> None:
        """Write one call's inputs for bucket b (>= T = len(tokens)) into the static buffers.

        tokens, positions, slots: (T,) ints (lists or CPU tensors); tree_mask: (T, N) bool, CPU,
        N <= max_tree. Rows T..b-1 are padding: token 0 at position 0 writing the scratch slot and
        attending only to tree slot 0.
        """
        t, n, m = len(tokens), tree_mask.shape[1], self.bmax
        if self._copied is not None:
            self._copied.synchronize()
        h = self._h_ints
        for start, vals, pad in ((0, tokens, 0), (m, positions, 0), (2 * m, slots, self.scratch_slot)):
            h[start : start + t] = vals.numpy() if isinstance(vals, torch.Tensor) else vals
            h[start + t : start + b] = pad
        h[3 * m] = prefix_len
        mask = self._h_mask[:b]
        mask.fill(False)
        mask[:t, :n] = tree_mask.numpy()
        mask[t:, 0] = True
        nbytes = self.int_bytes + b * self.max_tree
        self.device_buf[:nbytes].copy_(self.host_buf[:nbytes], non_blocking=True)
        if self._copied is not None:
            self._copied.record()


# --------------------------------------------------------------------------------------------
# device time of forwards (profiler, validate)


class TimedGraph:
    """A captured graph whose replays log their device time: CUDA events around the replay, or a
    fixed ms per replay (`fixed_ms`, see `replay_ms`)."""

    def __init__(self, graph, log: list, fixed_ms: float | None = None):
        self.graph, self.log, self.fixed_ms = graph, log, fixed_ms

    def replay(self) -> None:
        if self.fixed_ms is not None:
            self.graph.replay()
            self.log.append(self.fixed_ms)
            return
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        self.graph.replay()
        e.record()
        self.log.append((s, e))


class ForwardClock:
    """Device time of every forward of some runners: CUDA events around graph replays (or, with
    `fixed_ms[id(runner)]` = {bucket: ms}, that fixed time per replay), else perf_counter around
    `ModelRunner._run` (CPU: the forward *is* host time, as in the profile)."""

    def __init__(self, runners: Sequence, fixed_ms: dict[int, dict[int, float] | None] | None = None) -> None:
        self.log: list = []
        for r in runners:
            if r.graphs is not None and r.graphs.use_graphs:
                table = (fixed_ms or {}).get(id(r)) or {}
                r.graphs.graphs = {b: TimedGraph(getattr(g, "graph", g), self.log, table.get(b))
                                   for b, g in r.graphs.graphs.items()}
            else:
                run = getattr(r, "_untimed_run", r._run)
                r._untimed_run = run

                def timed(*a, _run=run, **k):
                    t = time.perf_counter()
                    out = _run(*a, **k)
                    self.log.append((time.perf_counter() - t) * 1e3)
                    return out

                r._run = timed

    def take(self, skip: int = 0) -> float:
        """ms of the forwards logged since the last take, the first `skip` left out."""
        vals = [x if isinstance(x, float) else x[0].elapsed_time(x[1]) for x in self.log[skip:]]
        self.log.clear()
        return float(sum(vals))
