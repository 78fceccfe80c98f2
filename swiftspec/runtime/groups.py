"""Process groups of one `swiftspec run`: who is draft, who is target, and the link between them.

Rank layout (the same on every process, from the plan's `Split`):

    ranks 0 .. D-1          draft group  (draft_gpus[i] for rank i)      leader: rank 0
    ranks D .. D+T-1        target group (target_gpus[i] for rank D+i)   leader: rank D
    ranks 0 .. C-1          co-located group for the `serial` / `autoregressive` baselines,
                            C = number of distinct devices the run spans (see `Layout.colocated`)

Groups (created in the same order on every rank, as torch.distributed requires):

    world          gloo, all ranks: control (barriers at prompt starts, gathering the run log)
    draft_tp       TP collectives inside the draft model      NCCL on distinct GPUs, else gloo
    target_tp      TP collectives inside the target model     NCCL on distinct GPUs, else gloo
    draft_ctrl     gloo: the draft leader broadcasts each verdict to the other draft ranks
    target_ctrl    gloo: the target leader broadcasts each subtree to the other target ranks
    link           gloo, {draft leader, target leader}: one small message each way per iteration
    colo_tp / colo_ctrl   the same two roles for the co-located baselines
    idle           gloo, all ranks, long timeout: ranks outside a task wait here for it to end

Messages are small int64 CPU tensors (a few hundred bytes): with either decoding loop one copy
each way crosses the host, so the link never touches device memory. `benchmarks/bench_link.py` compares transports for them.

NCCL refuses two ranks on one GPU. When ranks share a device (e.g. draft and target processes on
one H200) their groups fall back to gloo; such runs are for correctness and host-side timing only.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from swiftspec.spec import Split

IDLE_TIMEOUT = datetime.timedelta(hours=12)  # ranks outside a task wait for it; the watchdog guards hangs


@dataclass(frozen=True)
class Layout:
    """Which rank does what. `physical[r]`: device index of rank r (cuda) or -1 (cpu)."""

    split: Split
    device: str  # "cuda" | "cpu"
    physical: tuple[int, ...]

    @classmethod
    def from_split(cls, split: Split, device: str, device_count: int = 0, local_ranks: tuple[int, ...] | None = None) -> Layout:
        """Map ranks to devices: GPU id modulo the visible devices (or the torchrun LOCAL_RANKs)."""
        disagg = bool(split.draft_gpus) and not set(split.draft_gpus) & set(split.target_gpus)
        gpus = (*split.draft_gpus, *split.target_gpus) if disagg else split.target_gpus
        if device != "cuda":
            phys = tuple(-1 for _ in gpus)
        elif local_ranks is not None:
            phys = tuple(lr % max(device_count, 1) for lr in local_ranks)
        else:
            phys = tuple(g % max(device_count, 1) for g in gpus)
        return cls(split, device, phys)

    @property
    def disaggregated(self) -> bool:
        """True when the split has a draft group disjoint from the target group (async plans)."""
        return bool(self.split.draft_gpus) and not set(self.split.draft_gpus) & set(self.split.target_gpus)

    @property
    def world(self) -> int:
        if not self.disaggregated:  # serial / chain / autoregressive plans: one rank per target GPU
            return self.split.target_tp
        return self.split.draft_tp + self.split.target_tp

    @property
    def draft_ranks(self) -> list[int]:
        return list(range(self.split.draft_tp))

    @property
    def target_ranks(self) -> list[int]:
        return list(range(self.split.draft_tp, self.world))

    @property
    def draft_leader(self) -> int:
        return 0

    @property
    def target_leader(self) -> int:
        return self.split.draft_tp

    @property
    def colocated(self) -> list[int]:
        """Ranks of the co-located baselines: one per distinct device (CPU: every rank)."""
        if self.device != "cuda":
            return list(range(self.world))
        seen: dict[int, int] = {}
        for r, p in enumerate(self.physical):
            seen.setdefault(p, r)
        return sorted(seen.values())

    def role(self, rank: int) -> str:
        return "draft" if rank < self.split.draft_tp else "target"

    def describe(self, rank: int) -> str:
        """e.g. `rank 2 (target group, TP rank 1 of 2)`."""
        if rank < self.split.draft_tp:
            return f"rank {rank} (draft group, TP rank {rank} of {self.split.draft_tp})"
        i = rank - self.split.draft_tp
        return f"rank {rank} (target group, TP rank {i} of {self.split.target_tp})"

    def backend_for(self, ranks: list[int]) -> str:
        """NCCL when every rank of the group has its own GPU, else gloo."""
        if self.device != "cuda":
            return "gloo"
        phys = [self.physical[r] for r in ranks]
        return "nccl" if len(set(phys)) == len(phys) else "gloo"


@dataclass
class Groups:
    """The process groups of one rank (None where the rank is not a member)."""

    layout: Layout
    rank: int
    draft_tp: dist.ProcessGroup | None
    target_tp: dist.ProcessGroup | None
    draft_ctrl: dist.ProcessGroup | None
    target_ctrl: dist.ProcessGroup | None
    link: dist.ProcessGroup | None
    colo_tp: dist.ProcessGroup | None
    colo_ctrl: dist.ProcessGroup | None
    idle: dist.ProcessGroup


def make_groups(layout: Layout, rank: int, timeout: datetime.timedelta) -> Groups:
    """Create every group (collective call: all ranks, same order). World must be initialised."""

    def new(ranks: list[int], backend: str, to: datetime.timedelta = timeout) -> dist.ProcessGroup | None:
        g = dist.new_group(ranks=ranks, backend=backend, timeout=to)
        return g if rank in ranks else None

    dr, tr, co = layout.draft_ranks, layout.target_ranks, layout.colocated
    if not layout.disaggregated:  # no async task: only the co-located groups
        return Groups(layout, rank, None, None, None, None, None,
                      colo_tp=new(co, layout.backend_for(co)), colo_ctrl=new(co, "gloo"),
                      idle=new(list(range(layout.world)), "gloo", IDLE_TIMEOUT))
    return Groups(
        layout=layout,
        rank=rank,
        draft_tp=new(dr, layout.backend_for(dr)),
        target_tp=new(tr, layout.backend_for(tr)),
        draft_ctrl=new(dr, "gloo"),
        target_ctrl=new(tr, "gloo"),
        link=new(sorted({layout.draft_leader, layout.target_leader}), "gloo"),
        colo_tp=new(co, layout.backend_for(co)),
        colo_ctrl=new(co, "gloo"),
        idle=new(list(range(layout.world)), "gloo", IDLE_TIMEOUT),
    )


def broadcast(msg: torch.Tensor, src: int, group: dist.ProcessGroup | None, size: int) -> torch.Tensor:
    """Broadcast a CPU message from global rank `src` inside `group` (no-op for a group of one)."""
    if size > 1:
        dist.broadcast(msg, src=src, group=group)
    return msg


# the first word of every link message: a subtree, a verdict with more to come, the last verdict
KIND_TREE, KIND_MORE, KIND_DONE = 1, 2, 3


class Link:
    """The leader-to-leader channel: fixed-size int64 CPU messages over a 2-rank gloo group.

    `isend` returns a handle the sender waits on before reusing the buffer; the draft posts its
    subtree with `isend` and goes on expanding (the asynchrony of Algorithm 1).
    """

    def __init__(self, group: dist.ProcessGroup, peer: int):
        self.group, self.peer = group, peer

    def isend(self, msg: torch.Tensor):
        return dist.isend(msg, dst=self.peer, group=self.group)

    def send(self, msg: torch.Tensor) -> None:
        dist.send(msg, dst=self.peer, group=self.group)

    def recv(self, buf: torch.Tensor) -> torch.Tensor:
        dist.recv(buf, src=self.peer, group=self.group)
        return buf
