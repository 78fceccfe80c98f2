"""Does a configuration fit GPU memory? Weights + KV cache + workspace of the fullest GPU.

Per GPU (bytes):
  weights   = ModelSpec.weight_bytes(tp) of every model on that GPU (both, when co-located)
  kv        = kv_bytes_per_token(tp) * cache length: the target caches `max_len` tokens plus the
              `bs` tree tokens it verifies; the draft caches `max_len` plus its tree region
              (at most (d + bs) * w expanded nodes per round, Algorithm 1)
  workspace = a fixed reserve (CUDA context, NCCL buffers, CUDA graphs, allocator slack:
              2 GiB on a GPU, 256 MiB on a CPU rank) + fp32 logits of the widest forward
"""

from __future__ import annotations

from dataclasses import dataclass

from swiftspec.spec import Mode, ModelSpec, Split, TreePolicy

GIB = 1 << 30
RESERVE_BYTES = {"cuda": 2 * GIB, "cpu": GIB // 4}


@dataclass(frozen=True)
class MemoryUse:
    """Bytes on the fullest GPU of a configuration, and what that GPU holds."""

    weights: int
    kv: int
    workspace: int
    capacity: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.workspace

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def group_use(model: ModelSpec, tp: int, cache_tokens: int, forward_tokens: int) -> tuple[int, int, int]:
    """(weights, KV cache, fp32 logits) bytes of one rank of `model` at TP `tp` caching
    `cache_tokens` tokens and forwarding `forward_tokens` at once. The runtime's memory checks
    (`swiftspec.preflight`) add these up per rank of a run."""
    logits = 4 * forward_tokens * model.shard(tp).vocab
    return model.weight_bytes(tp), model.kv_bytes_per_token(tp) * cache_tokens, logits


def reserve_bytes(device: str) -> int:
    """The fixed reserve of one GPU or CPU rank (module docstring)."""
    return RESERVE_BYTES.get(device, RESERVE_BYTES["cuda"])


def memory_use(
    target: ModelSpec,
    draft: ModelSpec | None,
    split: Split,
    mode: Mode,
    policy: TreePolicy,
    max_len: int,
    capacity: int,
    device: str = "cuda",
) -> MemoryUse:
    """Memory of the fullest GPU (target group, draft group, or the shared GPUs when co-located)."""
    reserve = reserve_bytes(device)
    t = group_use(target, split.target_tp, max_len + policy.bs, policy.bs)
    if mode is Mode.autoregressive or draft is None:
        return MemoryUse(t[0], t[1], reserve + t[2], capacity)
    tree = (policy.d + policy.bs) * max(policy.w, 1)
    d = group_use(draft, split.draft_tp, max_len + tree, max(policy.w, 1))
    if mode is Mode.async_:
        ut = MemoryUse(t[0], t[1], reserve + t[2], capacity)
        ud = MemoryUse(d[0], d[1], reserve + d[2], capacity)
        return max(ut, ud, key=lambda u: u.total)
    return MemoryUse(t[0] + d[0], t[1] + d[1], reserve + max(t[2], d[2]), capacity)
