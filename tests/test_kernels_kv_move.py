"""Triton KV compaction (kv_move) against the pure-torch gather-then-scatter reference.

CPU under TRITON_INTERPRET=1 with small caches; GPU (marked) with a Llama-3-8B-shaped cache and a
CUDA-graph replay. The whole cache is compared, so unwritten destinations and stray writes fail.
"""

from __future__ import annotations

import os

import pytest
import torch

from swiftspec.kernels.kv_move import kv_move
from swiftspec.kernels.reference import kv_move_ref

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not HAS_CUDA and not INTERPRET:
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if HAS_CUDA else "cpu"


def caches(shape, dtype, gen):
    k = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    v = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    return k, v


def check(shape, dtype, src, dst, n_valid=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k, v = caches(shape, dtype, gen)
    k_ref, v_ref = k.clone(), v.clone()
    src = src.to(DEVICE)
    dst_arg = torch.tensor(dst, device=DEVICE) if seed % 2 else dst  # int and tensor forms
    kv_move(k, v, src, dst_arg, n_valid=n_valid)
    kv_move_ref(k_ref, v_ref, src, dst, n_valid=n_valid)
    assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def compaction(n_prefix: int, n_tree: int, keep: int, gen: torch.Generator) -> torch.Tensor:
    """Sorted surviving tree slots (accepted path + subtree), all above the destination start."""
    return torch.sort(torch.randperm(n_tree, generator=gen)[:keep]).values + n_prefix


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(
    "src,dst",
    [
        ([37, 40, 41, 50], 37),  # compaction: first accepted node already in place
        ([45, 38, 52], 38),  # unsorted; slot 38 is both a source and a destination
        ([3, 5], 2),  # dst 3 is src[0]: a read-after-write hazard if done naively
        ([10, 11, 12], 11),  # moves UP onto its own sources (overlap the other way)
        ([60], 0),  # single token, far move
    ],
)
def test_kv_move_overlapping_any_order(src, dst, dtype):
    check((3, 2, 64, 32), dtype, torch.tensor(src), dst, seed=len(src) + dst)


def test_kv_move_random_compaction_and_padding():
    gen = torch.Generator().manual_seed(9)
    for trial in range(4):
        src = compaction(40, 60, 25, gen)
        check((2, 3, 128, 16), torch.float32, src, 40 + trial, seed=trial)
    # Graph-style padding: 32 slots passed, only the first 11 are live.
    src = torch.cat([compaction(40, 60, 11, gen), torch.full((21,), 127)])
    check((2, 3, 128, 16), torch.float32, src, 40, n_valid=torch.tensor(11, device=DEVICE), seed=1)


def test_kv_move_long_chunked_in_order():
    """n > 256 moves in chunks: correct for sorted sources moving to lower-or-equal slots."""
    gen = torch.Generator().manual_seed(4)
    src = compaction(20, 700, 300, gen)
    check((1, 2, 800, 16), torch.float16, src, 10, seed=2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_kv_move_8b_cache_in_cuda_graph():
    gen = torch.Generator().manual_seed(0)
    k, v = caches((32, 8, 2048, 128), torch.bfloat16, gen)
    k_ref, v_ref = k.clone(), v.clone()
    src = torch.full((64,), 2047, dtype=torch.int64, device="cuda")
    dst = torch.zeros((), dtype=torch.int64, device="cuda")
    n_valid = torch.zeros((), dtype=torch.int64, device="cuda")
    kv_move(k, v, src, dst, n_valid=n_valid)  # compile outside capture (n_valid 0: no-op)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kv_move(k, v, src, dst, n_valid=n_valid)
    for start, keep in ((1000, 8), (1200, 64), (1300, 1)):
        live = compaction(start, 200, keep, gen).cuda()
        src[:keep] = live
        dst.fill_(start)
        n_valid.fill_(keep)
        graph.replay()
        kv_move_ref(k_ref, v_ref, live, start)
        torch.cuda.synchronize()
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)
