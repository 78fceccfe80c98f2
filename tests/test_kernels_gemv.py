"""`swiftspec.kernels.gemv` against `F.linear` on random inputs (never zeros), CPU under
TRITON_INTERPRET=1 (small shapes) and GPU when present (Llama-3-8B shapes, marked gpu)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not HAS_CUDA and not INTERPRET:
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if HAS_CUDA else "cpu"

from swiftspec.kernels.gemv import MAX_ROWS, gemv, gemv_ref  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _rand(shape, gen, dtype):
    return (0.3 + torch.randn(shape, generator=gen)).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(1, 40, 96), (3, 17, 200), (8, 64, 64), (16, 33, 130)])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("kind", ["fma", "dot"])
def test_gemv_matches_linear(dtype, m, n, k, with_bias, kind):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w = _rand((m, k), gen, dtype), _rand((n, k), gen, dtype)
    b = _rand((n,), gen, dtype) if with_bias else None
    got = gemv(x, w, b, kind=kind)
    ref = F.linear(x.float(), w.float(), None if b is None else b.float())  # exact-ish reference
    assert got.dtype == dtype and got.shape == (m, n)
    rel = float((got.float() - ref).abs().max() / ref.abs().max())
    assert rel <= TOL[dtype], rel
    assert torch.equal(gemv_ref(x, w, b), F.linear(x, w, b))


@pytest.mark.parametrize("kind", ["fma", "dot"])
def test_gemv_block_overrides_give_the_same_result(kind):
    gen = torch.Generator().manual_seed(5)
    x, w = _rand((2, 300), gen, torch.float32), _rand((50, 300), gen, torch.float32)
    a = gemv(x, w, kind=kind)
    for bn, bk in ((16, 64), (32, 128), (64, 32)):
        torch.testing.assert_close(gemv(x, w, block_n=bn, block_k=bk, kind=kind), a, rtol=1e-5, atol=1e-5)


def test_gemv_rejects_bad_shapes():
    x = torch.randn(MAX_ROWS + 1, 8, device=DEVICE)
    with pytest.raises(ValueError, match="at most"):
        gemv(x, torch.randn(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="need x"):
        gemv(torch.randn(2, 8, device=DEVICE), torch.randn(4, 9, device=DEVICE))
    with pytest.raises(ValueError, match="kind"):
        gemv(torch.randn(2, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE), kind="mma")
    with pytest.raises(ValueError, match="bias"):
        gemv(torch.randn(2, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE), torch.randn(5, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("m,kind", [(1, "fma"), (4, "fma"), (16, "fma"), (1, "dot"), (5, "dot"), (16, "dot")])
def test_gpu_8b_shapes_in_cuda_graph(m, kind):
    gen = torch.Generator().manual_seed(m)
    x = _rand((m, 4096), gen, torch.bfloat16)
    w = _rand((14336 * 2, 4096), gen, torch.bfloat16)
    ref = F.linear(x.float(), w.float())
    graph, y = torch.cuda.CUDAGraph(), None
    gemv(x, w, kind=kind)  # compile outside capture
    with torch.cuda.graph(graph):
        y = gemv(x, w, kind=kind)
    x.copy_(_rand((m, 4096), gen, torch.bfloat16))
    ref = F.linear(x.float(), w.float())
    graph.replay()
    torch.cuda.synchronize()
    assert float((y.float() - ref).abs().max() / ref.abs().max()) <= 1.6e-2
