"""Arrival counters of the "last program merges" pattern (tree attention's split-KV combine, the
skinny linear's split-K sum), and the memory ordering that makes it correct.

Each group of programs whose partials one of them merges (a split-KV row tile and KV head, a
split-K column block) owns one int32 counter, zero on entry. A program (1) stores its partial
(all threads), (2) `tl.debug_barrier()` (bar.sync: those stores are performed with respect to
every thread of the CTA), (3) one thread does `atomic_add(counter, 1, sem="acq_rel",
scope="gpu")`; Triton broadcasts the old value to the CTA through shared memory behind a second
bar.sync. The release half of (3) orders the CTA's partial stores (ordered before it by the
barrier: causality order is transitive through bar.sync) before the increment; the atomics on one
address are totally ordered, so the program that reads (group size - 1) comes after every other
increment, and the acquire half of its atomic, followed by the broadcast barrier, orders all its
threads' later loads after every partial's stores. It reads the partials with .cg (L2) loads,
which also rules out a stale L1 line, then resets the counter (an atomic exchange); no other
program touches that counter again in the launch, and the next launch (next layer, next graph
replay) starts after this one ends, so the counters are zero again on entry. This is the CUDA
"last block" reduction pattern (threadfence + atomicInc) with the fence folded into the atomic's
semantics. The interpreter runs programs one after another, so CPU tests check the arithmetic
and the counter reset, not the ordering; GPU tests do the latter.
"""

from __future__ import annotations

import torch


class CounterWorkspace:
    """Arrival counters, zeroed once and shared by many launches.

    Every launch leaves the counters it used at zero (the last program of each group resets its
    own), so all the calls of one stream of work (every layer of a model, every replay of a CUDA
    graph, attention and linears alike) can share one workspace and no memset is needed per call.
    Two launches that may run *concurrently* (different streams) must not share one. Create it
    before graph capture (and call once before capturing, as for Triton's compilation anyway): a
    counter buffer that grows keeps the old one alive, since a captured graph may still point at it.
    """

    def __init__(self, device: torch.device | str, capacity: int = 4096):
        self.device = torch.device(device)
        self.counters = torch.zeros(capacity, dtype=torch.int32, device=self.device)
        self._retired: list[torch.Tensor] = []

    def counters_for(self, n: int) -> torch.Tensor:
        """(>= n,) int32 zeros on the workspace's device."""
        if n > self.counters.numel():
            self._retired.append(self.counters)
            self.counters = torch.zeros(max(n, 2 * self.counters.numel()), dtype=torch.int32, device=self.device)
        return self.counters


def arrival_counters(workspace: CounterWorkspace | None, n: int, device: torch.device) -> torch.Tensor:
    """n zeroed counters for one launch on `device`: the workspace's, or fresh ones (one memset)."""
    if workspace is None:
        return torch.zeros(n, dtype=torch.int32, device=device)
    if workspace.counters.device != device:
        raise ValueError(f"workspace is on {workspace.counters.device}, the launch on {device}")
    return workspace.counters_for(n)
