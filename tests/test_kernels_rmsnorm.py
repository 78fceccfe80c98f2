"""Fused residual add + RMSNorm (Triton) against the model's eager ops, and SwiGLU's silu*up.

CPU under TRITON_INTERPRET=1 (small shapes) and GPU when present (Llama-3-8B shapes, marked gpu).
Inputs are random (norm weights around 1, never zeros); outputs are written into NaN-filled views
of wider buffers, so an unwritten element stays NaN and a stray write past a row shows up.

Tolerances: float32 to 1e-5 (only the summation order of the mean of squares differs); float16
within an ulp or two; bfloat16 a few ulps, because Triton's CPU interpreter truncates float32 ->
bfloat16 casts where the GPU (and torch) round to nearest even.
"""

from __future__ import annotations

import os

import pytest
import torch

from swiftspec.kernels.reference import add_rmsnorm_ref
from swiftspec.kernels.reference import silu_mul as silu_mul_ref
from swiftspec.kernels.rmsnorm import add_rmsnorm
from swiftspec.kernels.silu_mul import silu_mul

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not HAS_CUDA and not INTERPRET:
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if HAS_CUDA else "cpu"
# (rtol, atol) per dtype, see the module docstring
TOL = {torch.float32: (1e-5, 1e-6), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2.4e-2, 2e-2)}
EXACT_ADD = {torch.float32: True, torch.float16: True, torch.bfloat16: HAS_CUDA}


def rand(shape, dtype, gen, scale=1.0, shift=0.0):
    return (shift + scale * torch.randn(shape, generator=gen)).to(dtype).to(DEVICE)


def poisoned(t: int, n: int, dtype, extra: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN (t, n + extra) buffer and its (t, n) left view (row stride n + extra)."""
    big = torch.full((t, n + extra), float("nan"), dtype=dtype, device=DEVICE)
    return big, big[:, :n]


def close(got: torch.Tensor, want: torch.Tensor, dtype) -> None:
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,h", [(1, 64), (7, 96), (33, 1000)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rmsnorm_matches_eager(dtype, t, h, with_residual):
    gen = torch.Generator().manual_seed(t * 1000 + h + with_residual)
    x = rand((t, h), dtype, gen, scale=3.0)
    res = rand((t, h), dtype, gen, scale=2.0, shift=0.5) if with_residual else None
    w = rand((h,), dtype, gen, scale=0.3, shift=1.0)
    eps = 1e-5 if t % 2 else 1e-6
    big_out, out = poisoned(t, h, dtype)
    big_res, res_out = poisoned(t, h, dtype)
    normed, new_res = add_rmsnorm(x, res, w, eps, out=out, residual_out=res_out)
    want_normed, want_res = add_rmsnorm_ref(x, res, w, eps)
    assert normed.data_ptr() == out.data_ptr()
    close(normed, want_normed, dtype)
    if with_residual:
        assert new_res.data_ptr() == res_out.data_ptr()
        if EXACT_ADD[dtype]:
            assert torch.equal(new_res, want_res)  # one rounded add, same as eager
        close(new_res, want_res, dtype)
    else:
        assert new_res is x and torch.isnan(big_res).all()  # nothing to add: the residual is x
    assert torch.isnan(big_out[:, h:]).all()  # no stray writes past the row


def test_add_rmsnorm_allocates_and_checks_shapes():
    gen = torch.Generator().manual_seed(3)
    x, r, w = rand((3, 48), torch.float32, gen), rand((3, 48), torch.float32, gen), rand((48,), torch.float32, gen)
    normed, new_res = add_rmsnorm(x, r, w, 1e-6)
    want = add_rmsnorm_ref(x, r, w, 1e-6)
    close(normed, want[0], torch.float32)
    assert torch.equal(new_res, want[1])
    # RMSNorm's defining property: every row of normed / weight has root-mean-square 1
    rms = (normed / w).pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="weight"):
        add_rmsnorm(x, r, w[:10], 1e-6)
    with pytest.raises(ValueError, match="residual"):
        add_rmsnorm(x, r[:2], w, 1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("t,f", [(1, 128), (5, 1000), (9, 2500)])
def test_silu_mul_matches_eager(dtype, t, f):
    gen = torch.Generator().manual_seed(t + f)
    gate_up = rand((t, 2 * f), dtype, gen, scale=3.0)
    big, out = poisoned(t, f, dtype)
    got = silu_mul(gate_up, out=out)
    assert got.data_ptr() == out.data_ptr()
    close(got, silu_mul_ref(gate_up), dtype)
    assert torch.isnan(big[:, f:]).all()
    if dtype == torch.float32:  # closed form, independent of the model code
        g, u = gate_up.double().chunk(2, dim=-1)
        torch.testing.assert_close(silu_mul(gate_up).double(), g / (1 + torch.exp(-g)) * u, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_8b_shapes_and_graph_replay():
    """Llama-3-8B widths in bf16, and a CUDA graph replay picking up new inputs."""
    gen = torch.Generator().manual_seed(8)
    dtype = torch.bfloat16
    for t in (1, 64):
        x, r = rand((t, 4096), dtype, gen), rand((t, 4096), dtype, gen)
        w = rand((4096,), dtype, gen, 0.3, 1.0)
        normed, new_res = add_rmsnorm(x, r, w, 1e-5)
        want = add_rmsnorm_ref(x, r, w, 1e-5)
        assert torch.equal(new_res, want[1])
        close(normed, want[0], dtype)
        gu = rand((t, 2 * 14336), dtype, gen, 3.0)
        close(silu_mul(gu), silu_mul_ref(gu), dtype)
    x, r = rand((8, 4096), dtype, gen), rand((8, 4096), dtype, gen)
    w = rand((4096,), dtype, gen, 0.3, 1.0)
    add_rmsnorm(x, r, w, 1e-5)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        normed, new_res = add_rmsnorm(x, r, w, 1e-5)
    x.copy_(rand((8, 4096), dtype, gen))
    graph.replay()
    want = add_rmsnorm_ref(x, r, w, 1e-5)
    assert torch.equal(new_res, want[1])
    close(normed, want[0], dtype)
