"""Tree attention: the contract every attention implementation in swiftspec follows.

The KV cache of one layer holds, per KV head, `max_len` slots: the verified prefix in slots
[0, prefix_len), then the tree region starting at slot `prefix_len`. New tokens (the draft's
leaves or the target's verify tree) write their K/V into their slots *before* attention, so a
query sees itself through the mask.

Query i attends to every prefix slot and to tree slot `prefix_len + j` iff `tree_mask[i, j]`.
This covers square masks (target verify: T = N), non-square masks (draft: w new leaves over a
larger tree region), plain decode (T = N = 1) and chunked prefill (prefix_len = 0, causal mask).
For CUDA graphs `tree_mask` is padded with False to a fixed width and `prefix_len` is a tensor.
"""

from __future__ import annotations

import torch


def tree_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_len: torch.Tensor | int,
    tree_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Pure-torch reference of tree attention for one layer (GQA).

    Shapes:
        q:          (T, Hq, D)        queries of the new tokens
        k_cache:    (Hkv, max_len, D) keys of this layer; Hq % Hkv == 0, q head h uses KV head
                                      h // (Hq // Hkv)
        v_cache:    (Hkv, max_len, D)
        prefix_len: int or 0-d integer tensor, number of verified slots
        tree_mask:  (T, N) bool, N <= max_len - prefix_len
    Returns:
        (T, Hq, D), dtype of q. Softmax in float32.
    """
    T, hq, d = q.shape
    hkv, max_len, _ = k_cache.shape
    n = tree_mask.shape[1]
    pl = prefix_len if isinstance(prefix_len, torch.Tensor) else torch.tensor(prefix_len, device=q.device)
    s = max_len  # attend over the whole buffer with a mask: shape-static, graph-friendly
    slot = torch.arange(s, device=q.device)
    in_prefix = slot < pl  # (S,)
    tree_idx = slot - pl  # position within the tree region
    in_tree = (tree_idx >= 0) & (tree_idx < n)
    gathered = tree_mask[:, tree_idx.clamp(0, max(n - 1, 0))] if n > 0 else torch.zeros(T, s, dtype=torch.bool, device=q.device)
    allowed = in_prefix.unsqueeze(0) | (in_tree.unsqueeze(0) & gathered)  # (T, S)
    group = hq // hkv
    k = k_cache.float().repeat_interleave(group, dim=0)  # (Hq, S, D)
    v = v_cache.float().repeat_interleave(group, dim=0)
    scores = torch.einsum("thd,hsd->hts", q.float(), k) * scale  # (Hq, T, S)
    scores = scores.masked_fill(~allowed.unsqueeze(0), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.einsum("hts,hsd->thd", probs, v)
    return out.to(q.dtype)
