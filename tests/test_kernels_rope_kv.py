"""RoPE + KV-cache write (Triton, one launch) against the model's eager ops.

CPU under TRITON_INTERPRET=1 (small shapes) and GPU when present (Llama-3-8B heads, CUDA-graph
replay with new slots and positions; marked gpu). The cache is random (not zeros) and laid out as
the model's (2, layers, Hkv, S, D) buffer: after the call everything but the rotated K rows must
equal the reference bit for bit (V copies, other layers and slots), so a wrong slot, a wrong layer
or a stray write fails; the rotated K rows are exact where both sides round identically and
on the GPU for 16-bit dtypes within the error of rounding each product and the sum, around the
float64 rotation (compiled, the kernel's roundings differ from eager torch's in ~20 % of the K
elements). The q output is a NaN-filled strided buffer. bfloat16 tolerances
are a few ulps on CPU (the interpreter truncates float32 -> bfloat16).
"""

from __future__ import annotations

import os

import pytest
import torch

from swiftspec.kernels.reference import rope_kv_ref
from swiftspec.kernels.rope_kv import rope_kv

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not HAS_CUDA and not INTERPRET:
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if HAS_CUDA else "cpu"
TOL = {torch.float32: (1e-6, 1e-6), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2.4e-2, 2e-2)}
# Bit-exact K rows where both sides round identically (the CPU interpreter, float32 and float16);
# float32 on a GPU may contract x*cos - y*sin into an FMA, the interpreter truncates bf16 casts.
EXACT = {torch.float32: not HAS_CUDA, torch.float16: not HAS_CUDA, torch.bfloat16: False}


def cos_sin(positions: torch.Tensor, d: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, D) rows as `Transformer.forward` builds them (float32 angles, cast to the dtype)."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = positions.float()[:, None] * inv[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)


def case(t, hq, hkv, d, dtype, gen, layers=3, s=70, theta=10000.0):
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(dtype).to(DEVICE)
    pos = torch.randint(0, 8192, (t,), generator=gen)
    cos, sin = cos_sin(pos, d, theta, dtype)
    slots = torch.randperm(s, generator=gen)[:t].to(DEVICE)
    kv = torch.randn(2, layers, hkv, s, d, generator=gen).to(dtype).to(DEVICE)
    return qkv, cos, sin, slots, kv


def close(got, want, dtype):
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def exact_k(qkv, cos, sin, hq, hkv) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, Hkv, D) rotated keys in float64 from the same (rounded) inputs, and the elementwise
    bound of rounding each product and the sum to the dtype: 2u (|k cos| + |rot sin|)."""
    t, d = qkv.shape[0], cos.shape[1]
    k = qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d).double()
    rot = torch.cat((-k[..., d // 2 :], k[..., : d // 2]), dim=-1)
    a, b = k * cos.double()[:, None], rot * sin.double()[:, None]
    return a + b, torch.finfo(qkv.dtype).eps * (a.abs() + b.abs())


def check_cache(kv, kv_ref, layer, slot_sets, dtype, k_exact=None):
    """The (2, layers, Hkv, S, D) cache after rope_kv calls that wrote `slot_sets` of `layer`;
    k_exact: `exact_k` of the last call (its slots are slot_sets[-1])."""
    close(kv, kv_ref, dtype)
    k_rows = torch.zeros(kv.shape, dtype=torch.bool, device=kv.device)
    for slots in slot_sets:
        k_rows[0, layer][:, slots.long()] = True
    assert torch.equal(kv[~k_rows], kv_ref[~k_rows])  # V copies, other layers and slots: bit for bit
    if EXACT[dtype]:
        assert torch.equal(kv[k_rows], kv_ref[k_rows])
    elif HAS_CUDA and dtype != torch.float32:
        # compiled, the kernel's roundings differ from eager torch's (it is not bit-exact there):
        # hold it to the error of rounding each product and the sum, around the exact rotation
        got = kv[0, layer][:, slot_sets[-1].long()].transpose(0, 1).double()
        exact, bound = k_exact
        assert bool(((got - exact).abs() <= bound).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "t,hq,hkv,d",
    [(1, 4, 2, 16), (7, 8, 1, 64), (33, 6, 2, 32), (5, 2, 2, 24)],  # D 24: half 12, a masked block
)
def test_rope_kv_matches_eager(dtype, t, hq, hkv, d):
    gen = torch.Generator().manual_seed(t * 100 + hq * 10 + d)
    qkv, cos, sin, slots, kv = case(t, hq, hkv, d, dtype, gen, theta=500000.0 if d >= 64 else 10000.0)
    layer = 1
    kv_ref = kv.clone()
    big = torch.full((t, hq + 1, d), float("nan"), dtype=dtype, device=DEVICE)
    out = big[:, :hq]  # head stride (hq + 1) * d: a strided output view
    if t % 2:
        slots = slots.to(torch.int32)
    q = rope_kv(qkv, cos, sin, slots, kv[0, layer], kv[1, layer], hq, hkv, out=out)
    q_ref = rope_kv_ref(qkv, cos, sin, slots.long(), kv_ref[0, layer], kv_ref[1, layer], hq, hkv)
    assert q.data_ptr() == out.data_ptr() and torch.isnan(big[:, hq:]).all()
    close(q, q_ref, dtype)
    check_cache(kv, kv_ref, layer, [slots], dtype, exact_k(qkv, cos, sin, hq, hkv))


def test_rope_kv_rotation_properties():
    """Independent of the model code: RoPE preserves each pair's norm, and position 0 is the
    identity (q unchanged, k stored as is)."""
    gen = torch.Generator().manual_seed(5)
    t, hq, hkv, d = 6, 4, 2, 32
    qkv, _, _, slots, kv = case(t, hq, hkv, d, torch.float32, gen)
    pos = torch.tensor([0, 1, 2, 100, 4000, 0])
    cos, sin = cos_sin(pos, d, 10000.0, torch.float32)
    q = rope_kv(qkv, cos, sin, slots, kv[0, 0], kv[1, 0], hq, hkv)
    x = qkv[:, : hq * d].view(t, hq, d)
    half = d // 2

    def pair_norm(y):
        return y[..., :half] ** 2 + y[..., half:] ** 2

    torch.testing.assert_close(pair_norm(q), pair_norm(x), rtol=1e-5, atol=1e-6)
    for i in (0, 5):  # position 0
        torch.testing.assert_close(q[i], x[i])
        k0 = qkv[i, hq * d : (hq + hkv) * d].view(hkv, d)
        torch.testing.assert_close(kv[0, 0][:, slots[i]], k0)
    v = qkv[:, (hq + hkv) * d :].view(t, hkv, d)
    assert torch.equal(kv[1, 0][:, slots], v.transpose(0, 1))


def test_rope_kv_rejects_bad_shapes():
    gen = torch.Generator().manual_seed(6)
    qkv, cos, sin, slots, kv = case(3, 4, 2, 16, torch.float32, gen)
    with pytest.raises(ValueError, match="qkv"):
        rope_kv(qkv[:, :-16], cos, sin, slots, kv[0, 0], kv[1, 0], 4, 2)
    with pytest.raises(ValueError, match="cos"):
        rope_kv(qkv, cos[:2], sin, slots, kv[0, 0], kv[1, 0], 4, 2)
    with pytest.raises(ValueError, match="slots"):
        rope_kv(qkv, cos, sin, slots.float(), kv[0, 0], kv[1, 0], 4, 2)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_8b_heads_in_cuda_graph():
    """Llama-3-8B heads (32/8, D 128) in bf16; a graph captured once, replayed with new qkv,
    positions and slots (device tensors read at replay time)."""
    gen = torch.Generator().manual_seed(7)
    t, hq, hkv, d, dtype = 64, 32, 8, 128, torch.bfloat16
    qkv, cos, sin, slots, kv = case(t, hq, hkv, d, dtype, gen, layers=2, s=4096 + 1, theta=500000.0)
    kv_ref = kv.clone()
    rope_kv(qkv, cos, sin, slots, kv[0, 1], kv[1, 1], hq, hkv)  # compile outside capture
    rope_kv_ref(qkv, cos, sin, slots, kv_ref[0, 1], kv_ref[1, 1], hq, hkv)
    first_slots = slots.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q = rope_kv(qkv, cos, sin, slots, kv[0, 1], kv[1, 1], hq, hkv)
    new_qkv, new_cos, new_sin, new_slots, _ = case(t, hq, hkv, d, dtype, gen, layers=1, s=4096 + 1, theta=500000.0)
    for buf, val in ((qkv, new_qkv), (cos, new_cos), (sin, new_sin), (slots, new_slots)):
        buf.copy_(val)
    graph.replay()
    q_ref = rope_kv_ref(qkv, cos, sin, slots, kv_ref[0, 1], kv_ref[1, 1], hq, hkv)
    close(q, q_ref, dtype)
    check_cache(kv, kv_ref, 1, [first_slots, slots], dtype, exact_k(qkv, cos, sin, hq, hkv))
