"""Static KV cache of one TP rank: verified prefix, then the tree region ("evolving tree cache").

Layout per layer and KV head: slots [0, prefix_len) hold the verified tokens, slots from
prefix_len on hold the current tree. After a verify the accepted path is moved into the prefix and
the surviving subtree compacted right behind it with one `move` (a gather then a copy, all layers
at once) — no recompute.

K and V live in one buffer `kv` of shape (2, num_layers, kv_heads_local, max_len + 1, head_dim);
`k = kv[0]`, `v = kv[1]`. The extra last slot (`scratch_slot == max_len`) is never attended by a
valid mask: padded tokens of CUDA-graph buckets write their K/V there, so padding never clobbers
real slots. Usable slots: [0, max_len).
"""

from __future__ import annotations

import torch

from swiftspec.spec import ModelSpec, Shard, UserError


class KVCache:
    """K/V buffers for all layers of one rank (shapes in the module docstring)."""

    def __init__(self, spec: ModelSpec, shard: Shard, max_len: int, device, dtype: torch.dtype):
        if max_len < 1:
            raise UserError(f"KV cache length must be >= 1, got {max_len}")
        self.spec, self.shard, self.max_len = spec, shard, max_len
        self.kv = torch.zeros(
            2, spec.num_layers, shard.kv_heads, max_len + 1, spec.head_dim, device=device, dtype=dtype
        )

    @property
    def k(self) -> torch.Tensor:
        """(num_layers, kv_heads_local, max_len + 1, head_dim)"""
        return self.kv[0]

    @property
    def v(self) -> torch.Tensor:
        """(num_layers, kv_heads_local, max_len + 1, head_dim)"""
        return self.kv[1]

    @property
    def scratch_slot(self) -> int:
        """Slot that padded (dummy) tokens write to; never part of the prefix or the tree."""
        return self.max_len

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def move(self, src_slots: torch.Tensor, dst_start: int) -> None:
        """Copy K/V of `src_slots` (in order) to slots [dst_start, dst_start + n), all layers.

        src_slots: (n,) int64 on the cache's device. Sources may overlap the destination range:
        everything is gathered first, then written.
        """
        n = int(src_slots.shape[0])
        if n == 0:
            return
        if dst_start < 0 or dst_start + n > self.max_len:
            raise ValueError(f"move of {n} slots to {dst_start} leaves the cache (max_len {self.max_len})")
        src = src_slots.to(device=self.kv.device, dtype=torch.long)
        self.kv[:, :, :, dst_start : dst_start + n] = self.kv.index_select(3, src)

    def clone(self) -> KVCache:
        """An independent copy (same shapes, same contents)."""
        out = KVCache.__new__(KVCache)
        out.spec, out.shard, out.max_len = self.spec, self.shard, self.max_len
        out.kv = self.kv.clone()
        return out
