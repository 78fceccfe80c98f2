"""`swiftspec.kernels.gemv` against `F.linear` on random inputs (never zeros), CPU under
TRITON_INTERPRET=1 (small shapes) and GPU when present (Llama-3-8B shapes, marked gpu)."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.nn.functional as F

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
if not HAS_CUDA and not INTERPRET:
    pytest.skip("Triton kernels need a GPU or TRITON_INTERPRET=1", allow_module_level=True)
DEVICE = "cuda" if HAS_CUDA else "cpu"

from swiftspec.kernels.gemv import (  # noqa: E402
    FP8,
    MAX_ROWS,
    MAX_ROWS_DOT,
    MAX_ROWS_FP8,
    Epilogue,
    GemvLaunch,
    gemv,
    gemv_ref,
    quantize_fp8,
)

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def _rand(shape, gen, dtype):
    return (0.3 + torch.randn(shape, generator=gen)).to(dtype).to(DEVICE)


def assert_same_epilogue(got: torch.Tensor, ref: torch.Tensor) -> None:
    """An epilogue variant (its tile rows interleaved) against the plain launch + the separate
    kernel: bit for bit on the GPU in bfloat16. Under the interpreter a dot's float32 sums depend on
    the weight row's position in the tile (numpy), so there it is all but the last bit: float32
    within 1e-6 of the largest value; bf16 >= 99 % of the values equal, the rest within one bf16
    rounding (4e-3) of the largest."""
    if got.is_cuda and got.dtype == torch.bfloat16:
        assert torch.equal(got, ref)
        return
    tol = 1e-6 if got.dtype == torch.float32 else 4e-3
    assert float((got.float() - ref.float()).abs().max() / ref.float().abs().max()) <= tol
    if got.dtype != torch.float32:
        assert float((got == ref).float().mean()) >= 0.99


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
        got = gemv(x, w, kind=kind, launch=GemvLaunch(block_n=bn, block_k=bk))
        torch.testing.assert_close(got, a, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(17, 40, 96), (40, 33, 130), (64, 24, 200), (MAX_ROWS_DOT, 16, 48)])
def test_gemv_dot_beyond_sixteen_rows(dtype, m, n, k):
    """The dot kind above the model's default 16 rows (`KernelConfig.linear_max_rows`):
    token rows padded to the next power of two on the MMA's N side, up to 256."""
    gen = torch.Generator().manual_seed(m + n + k)
    x, w, b = _rand((m, k), gen, dtype), _rand((n, k), gen, dtype), _rand((n,), gen, dtype)
    got = gemv(x, w, b, kind="dot")
    ref = F.linear(x.float(), w.float(), b.float())
    assert got.dtype == dtype and got.shape == (m, n)
    assert float((got.float() - ref).abs().max() / ref.abs().max()) <= TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k", [(1, 40, 96), (3, 70, 200), (16, 33, 130), (2, 64, 1100)])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("pdl", [False, True, "late"] if HAS_CUDA else [False])
@pytest.mark.parametrize("split_k", [1, 3])
def test_gemv_rms_matches_add_rmsnorm_then_gemv(dtype, m, n, k, with_residual, pdl, split_k):
    """gemv(x, fold_norm_weight(w, g), rms_eps=, residual=r) = gemv(add_rmsnorm(x, r, g)[0], w) up to
    rounding order: float32 within 1e-5; bf16 no further from the exact float64 result than the
    two-launch path (+ 0.4 %); residual_out = x + r exactly, as add_rmsnorm rounds it. With K split
    in 3 (the split-sum launch applies 1 / rms and the bias) the same holds."""
    from swiftspec.kernels.gemv import fold_norm_weight
    from swiftspec.kernels.rmsnorm import add_rmsnorm

    gen = torch.Generator().manual_seed(m + n + k + with_residual)
    x, w, b = 3 * _rand((m, k), gen, dtype), _rand((n, k), gen, dtype), _rand((n,), gen, dtype)  # rms(x) ~ 3
    g = (1 + 0.3 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
    r = _rand((m, k), gen, dtype) if with_residual else None
    h, new_res = add_rmsnorm(x, r, g, 1e-5)
    ref = gemv(h, w, b)
    out = torch.full_like(x, float("nan")) if with_residual else None
    got = gemv(x, fold_norm_weight(w, g), b, pdl=pdl, epilogue=Epilogue(rms_eps=1e-5, residual=r, residual_out=out),
               launch=GemvLaunch(split_k=split_k, block_k=32 if split_k > 1 else None))  # 32-wide steps: every split has several
    hd = (x if r is None else (x.float() + r.float()).to(dtype)).double()  # h as add_rmsnorm rounds it
    exact = F.linear(hd * torch.rsqrt(hd.pow(2).mean(1, keepdim=True) + 1e-5) * g.double(), w.double(), b.double())

    def err(y):
        return float((y.double() - exact).abs().max() / exact.abs().max())

    if dtype == torch.float32:
        assert err(got) <= 1e-5 and err(ref) <= 1e-5
    else:
        assert err(got) <= err(ref) + 4e-3
    if with_residual:
        assert torch.equal(out, new_res)
    # without the norm the result is another one: the test would see a missing rms scale
    assert err(gemv(x, fold_norm_weight(w, g), b)) > 0.5


def _epilogue_case(m: int, n: int, k: int, split_k, variant: str, gen, dtype):
    """x (m, k), weights (n, k) ~ 1/sqrt(k) (outputs of a few units: there silu(g) is not g, as it
    is in float at ~300), gemv's keyword arguments (launch, fp8 scale) and epilogue for `variant`:
    "fp8" (quantized weights and their scales), "rms" (the folded norm with a residual), otherwise
    plain."""
    from swiftspec.kernels.gemv import fold_norm_weight

    x, w = _rand((m, k), gen, dtype), (_rand((n, k), gen, torch.float32) / k**0.5).to(dtype)
    kw: dict = {"launch": GemvLaunch(split_k=split_k)}
    epi = Epilogue()
    if variant == "fp8":
        w, kw["scale"] = (t.to(DEVICE) for t in quantize_fp8(w.float().cpu()))
    if variant == "rms":
        g = (1 + 0.3 * torch.randn(k, generator=gen)).to(dtype).to(DEVICE)
        w, r = fold_norm_weight(w, g), _rand((m, k), gen, dtype)
        epi = Epilogue(rms_eps=1e-5, residual=r, residual_out=torch.empty_like(x))
    return x, w, kw, epi


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,f,k,split_k", [(1, 20, 96, 1), (3, 35, 200, 1), (16, 64, 130, 1), (5, 40, 4096, None),
                                           (2, 33, 300, 2), (20, 24, 256, 4)])
@pytest.mark.parametrize("variant", ["plain", "fp8", "rms"])
def test_gemv_swiglu_equals_silu_mul_after_gemv(dtype, m, f, k, split_k, variant):
    """act="swiglu" gives silu_mul(gemv(x, w13, ...)): in the epilogue (split_k 1) and in the split-K
    sum (split_k 2, 4, and the default rule's 4 at K 4096), with fp8 weights and with the folded
    norm (and its residual); (M, F) from gate|up weights (2F, K). Equal as `assert_same_epilogue`
    says (bit for bit in bf16 on the GPU)."""
    from swiftspec.kernels.silu_mul import silu_mul

    gen = torch.Generator().manual_seed(m * 7 + f + k)
    x, w, kw, epi = _epilogue_case(m, 2 * f, k, split_k, variant, gen, dtype)
    got = gemv(x, w, epilogue=dataclasses.replace(epi, act="swiglu"), **kw)
    ref_epi = dataclasses.replace(epi, residual_out=torch.empty_like(x)) if variant == "rms" else epi
    ref = silu_mul(gemv(x, w, epilogue=ref_epi, **kw))
    assert got.shape == (m, f) and got.dtype == dtype
    assert_same_epilogue(got, ref)
    if variant == "rms":  # h = x + residual, stored as the plain folded launch stores it
        assert torch.equal(epi.residual_out, ref_epi.residual_out)
    # the activation really ran: the product alone differs
    plain = gemv(x, w, epilogue=epi, **kw)
    assert not torch.equal(got, plain[:, :f] * plain[:, f:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,hq,hkv,d,k,split_k", [(1, 4, 2, 16, 96, 1), (3, 6, 2, 32, 200, 1), (16, 2, 1, 64, 130, 1),
                                                  (5, 4, 2, 16, 4096, None), (2, 3, 3, 16, 300, 2),
                                                  (9, 4, 1, 32, 256, 4)])
@pytest.mark.parametrize("variant", ["plain", "bias", "fp8", "rms"])
def test_gemv_rope_equals_rope_kv_after_gemv(dtype, m, hq, hkv, d, k, split_k, variant):
    """gemv(epilogue=Epilogue(rope=RopeKV(...))) on a fused qkv projection gives `rope_kv(gemv(x, wqkv, ...), ...)`: the
    same q and the same two caches (rotated k and v at the slots, every other slot untouched), in
    the epilogue (split_k 1) and in the split-K sum (2, 4, and the rule's 4 at K 4096), with a qkv
    bias, fp8 weights and the folded norm. Equal as `assert_same_epilogue` says."""
    from swiftspec.kernels.gemv import RopeKV
    from swiftspec.kernels.rope_kv import rope_kv

    gen = torch.Generator().manual_seed(m * 11 + hq + d + k)
    n = (hq + 2 * hkv) * d
    x, w, kw, epi = _epilogue_case(m, n, k, split_k, variant, gen, dtype)
    b = _rand((n,), gen, dtype) if variant == "bias" else None
    ang = torch.randn(m, d // 2, generator=gen) * 3
    cos = torch.cat([ang.cos()] * 2, 1).to(dtype).to(DEVICE)
    sin = torch.cat([ang.sin()] * 2, 1).to(dtype).to(DEVICE)
    slots = torch.randperm(2 * m + 3, generator=gen)[:m].to(DEVICE)
    caches = [_rand((hkv, 2 * m + 3, d), gen, dtype) for _ in range(2)]
    ref_caches = [c.clone() for c in caches]
    got = gemv(x, w, b, epilogue=dataclasses.replace(epi, rope=RopeKV(cos, sin, slots, *caches, hq, hkv)), **kw)
    ref_epi = dataclasses.replace(epi, residual_out=torch.empty_like(x)) if variant == "rms" else epi
    qkv = gemv(x, w, b, epilogue=ref_epi, **kw)
    ref = rope_kv(qkv, cos, sin, slots, *ref_caches, hq, hkv)
    assert got.shape == (m, hq, d) and got.dtype == dtype
    for a, e in ((got, ref), *zip(caches, ref_caches)):
        assert_same_epilogue(a, e)
    if variant == "rms":
        assert torch.equal(epi.residual_out, ref_epi.residual_out)
    # the rotation really ran: q differs from the projection's q columns
    assert float((got.reshape(m, -1) - qkv[:, : hq * d]).abs().max()) > 0.1


def test_gemv_rope_rejects_bad_arguments():
    from swiftspec.kernels.gemv import RopeKV

    x, w = torch.randn(2, 8, device=DEVICE), torch.randn(4 * 16, 8, device=DEVICE)
    cs = torch.randn(2, 16, device=DEVICE)
    cache = torch.randn(1, 8, 16, device=DEVICE)
    slots = torch.tensor([0, 1], device=DEVICE)
    with pytest.raises(ValueError, match="qkv must be"):
        gemv(x, w, epilogue=Epilogue(rope=RopeKV(cs, cs, slots, cache, cache, 3, 1)))  # (3 + 2) * 16 rows != 64
    with pytest.raises(ValueError, match="no act"):
        gemv(x, w, epilogue=Epilogue(rope=RopeKV(cs, cs, slots, cache, cache, 2, 1), act="swiglu"))
    with pytest.raises(ValueError, match="cos and sin"):
        gemv(x, w, epilogue=Epilogue(rope=RopeKV(cs[:1], cs, slots, cache, cache, 2, 1)))
    with pytest.raises(ValueError, match="one row stride"):
        gemv(x, w, epilogue=Epilogue(rope=RopeKV(cs, torch.randn(2, 32, device=DEVICE)[:, :16], slots, cache, cache, 2, 1)))


def test_gemv_swiglu_rejects_bad_arguments():
    x, w = torch.randn(2, 8, device=DEVICE), torch.randn(6, 8, device=DEVICE)
    with pytest.raises(ValueError, match="act must be"):
        gemv(x, w, epilogue=Epilogue(act="gelu"))
    with pytest.raises(ValueError, match="act must be"):
        gemv(x, w, torch.randn(6, device=DEVICE), epilogue=Epilogue(act="swiglu"))
    with pytest.raises(ValueError, match="act must be"):
        gemv(x, w[:5], epilogue=Epilogue(act="swiglu"))
    with pytest.raises(ValueError, match="act must be"):
        gemv(x, w, kind="fma", epilogue=Epilogue(act="swiglu"))


def test_gemv_rms_rejects_bad_arguments():
    x, w = torch.randn(2, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="residual needs rms_eps"):
        gemv(x, w, epilogue=Epilogue(residual=x))
    with pytest.raises(ValueError, match="go together"):
        gemv(x, w, epilogue=Epilogue(rms_eps=1e-5, residual=x))
    with pytest.raises(ValueError, match="kind 'dot'"):
        gemv(x, w, kind="fma", epilogue=Epilogue(rms_eps=1e-5))
    with pytest.raises(ValueError, match="must be contiguous"):
        bad = x[:, :4].repeat(1, 2).t().contiguous().t()
        gemv(x, w, epilogue=Epilogue(rms_eps=1e-5, residual=bad, residual_out=x.clone()))


def test_gemv_rejects_bad_shapes():
    with pytest.raises(ValueError, match="'fma' takes at most 16 rows"):
        gemv(torch.randn(MAX_ROWS + 1, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE), kind="fma")
    with pytest.raises(ValueError, match="'dot' takes at most 256 rows"):
        gemv(torch.randn(MAX_ROWS_DOT + 1, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE))
    with pytest.raises(ValueError, match="need x"):
        gemv(torch.randn(2, 8, device=DEVICE), torch.randn(4, 9, device=DEVICE))
    with pytest.raises(ValueError, match="kind"):
        gemv(torch.randn(2, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE), kind="mma")
    with pytest.raises(ValueError, match="bias"):
        gemv(torch.randn(2, 8, device=DEVICE), torch.randn(4, 8, device=DEVICE), torch.randn(5, device=DEVICE))


def test_quantize_fp8_round_trip():
    """Per-row scales: every row's largest |value| becomes 448, and dequantized weights are within
    e4m3's relative rounding (2^-4 of the row's amax, worst case) of the originals."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(37, 130, generator=gen) * torch.logspace(-3, 2, 37)[:, None]  # rows of very different size
    w[5] = 0.0
    w8, scale = quantize_fp8(w)
    assert w8.dtype == FP8 and scale.shape == (37,) and scale[5] == 1.0
    assert torch.equal(w8.float().abs().amax(dim=1)[torch.arange(37) != 5], torch.full((36,), 448.0))
    err = (w8.float() * scale[:, None] - w).abs().amax(dim=1) / w.abs().amax(dim=1).clamp_min(1e-30)
    assert float(err.max()) <= 2**-4


def test_quantize_fp8_slices_with_the_rows_amax_equal_slices_of_the_whole():
    """A row-parallel shard quantized with its whole rows' amax is exactly that slice of the
    unsharded quantization (what makes an fp8 model independent of the TP size); with the slice's
    own amax it is not."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn(16, 96, generator=gen)
    full8, full_scale = quantize_fp8(w)
    amax = w.abs().amax(dim=1)
    own = []
    for cols in (slice(0, 40), slice(40, 96)):
        s8, scale = quantize_fp8(w[:, cols], amax)
        assert torch.equal(s8.float(), full8[:, cols].float()) and torch.equal(scale, full_scale)
        own.append(torch.equal(quantize_fp8(w[:, cols])[1], full_scale))
    assert not all(own)


@pytest.mark.parametrize("m,n,k", [(1, 40, 96), (5, 17, 200), (16, 64, 64), (40, 33, 130), (MAX_ROWS_FP8, 24, 48)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_fp8_weights_match_dequantized_reference(m, n, k, with_bias):
    """fp8 weights + per-row scale, x in bfloat16 (the model's dtype on GPU) and float32: the kernel
    equals F.linear with the dequantized weights, from 1 row to a prefill chunk (256)."""
    gen = torch.Generator().manual_seed(m * 7 + n + k)
    for dtype in (torch.float32, torch.bfloat16):
        x = _rand((m, k), gen, dtype)
        w8, scale = quantize_fp8(_rand((n, k), gen, torch.float32))
        w8, scale = w8.to(DEVICE), scale.to(DEVICE)
        b = _rand((n,), gen, dtype) if with_bias else None
        got = gemv(x, w8, b, scale=scale)
        ref = F.linear(x.float(), w8.float() * scale[:, None], None if b is None else b.float())
        assert got.dtype == dtype and got.shape == (m, n)
        rel = float((got.float() - ref).abs().max() / ref.abs().max())
        assert rel <= TOL[dtype], (dtype, rel)
        rel_ref = float((gemv_ref(x, w8, b, scale).float() - ref).abs().max() / ref.abs().max())
        assert rel_ref <= TOL[dtype]


@pytest.mark.parametrize("m,n,k,split_k", [(1, 40, 300, 2), (3, 17, 200, 4), (16, 64, 1000, 3), (2, 8, 64, 8)])
@pytest.mark.parametrize("fp8", [False, True])
def test_gemv_split_k_matches_reference(m, n, k, split_k, fp8):
    """K split over programs (float32 partials, summed in order by a second launch): the result
    equals the reference, the bias counted once, for K slices that do not divide K and for more
    splits than K steps (clamped), and two calls agree bit for bit (no atomics)."""
    gen = torch.Generator().manual_seed(m + n + k + split_k)
    for dtype in (torch.float32, torch.bfloat16):
        x = _rand((m, k), gen, dtype)
        w = _rand((n, k), gen, torch.float32)
        scale = None
        if fp8:
            w, scale = quantize_fp8(w)
            w, scale = w.to(DEVICE), scale.to(DEVICE)
        else:
            w = w.to(dtype)
        b = _rand((n,), gen, dtype)
        launch = GemvLaunch(split_k=split_k, block_k=64)
        got = gemv(x, w, b, scale=scale, launch=launch)
        ref = F.linear(x.float(), w.float() * (scale[:, None] if fp8 else 1), b.float())
        rel = float((got.float() - ref).abs().max() / ref.abs().max())
        assert rel <= TOL[dtype], (dtype, rel)
        assert torch.equal(got, gemv(x, w, b, scale=scale, launch=launch))


def _combine_case(variant: str, dtype, gen, workspace):
    """One split-K call of `variant` as {combine: (outputs)} for combine "separate" and "kernel"
    (the latter through `workspace`): the result and everything else the call writes."""
    from swiftspec.kernels.gemv import RopeKV
    from swiftspec.kernels.int4 import quantize_int4

    m, hq, hkv, d, k = 3, 3, 1, 16, 640  # 80 weight rows: two column blocks of 64 (pairs: of 32)
    n = (hq + 2 * hkv) * d
    x, w, kw, epi = _epilogue_case(m, n, k, 3, "rms" if variant == "rms" else "fp8" if variant == "fp8" else "plain",
                                   gen, dtype)
    kw["launch"] = GemvLaunch(split_k=3, block_k=64)
    b = _rand((n,), gen, dtype) if variant in ("bias", "rms", "rope") else None
    if variant == "int4":
        w, kw["launch"] = quantize_int4(w.float(), 128), GemvLaunch(split_k=3)
    ang = torch.randn(m, d // 2, generator=gen) * 3
    cos, sin = (torch.cat([f(ang)] * 2, 1).to(dtype).to(DEVICE) for f in (torch.cos, torch.sin))
    runs = {}
    for combine in ("separate", "kernel"):
        e, outs = epi, []
        if variant == "rms":
            e = dataclasses.replace(epi, residual_out=torch.empty_like(x))
            outs.append(e.residual_out)
        if variant == "swiglu":
            e = dataclasses.replace(epi, act="swiglu")
        if variant == "rope":
            caches = [torch.zeros((hkv, 2 * m, d), dtype=dtype, device=DEVICE) for _ in range(2)]
            e = dataclasses.replace(epi, rope=RopeKV(cos, sin, torch.arange(m, device=DEVICE) * 2, *caches, hq, hkv))
            outs += caches
        launch = dataclasses.replace(kw["launch"], combine=combine, workspace=workspace)
        runs[combine] = (gemv(x, w, None if variant == "swiglu" else b, epilogue=e,
                              **{**kw, "launch": launch}), *outs)
    return runs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", ["plain", "bias", "fp8", "rms", "swiglu", "rope", "int4"])
def test_split_k_combined_in_the_launch_equals_the_sum_launch(dtype, variant):
    """combine "kernel" (the last split of each column block sums the partials) gives what the
    split-sum launch gives, bit for bit: the result and everything else the call writes (h with the
    folded norm, the caches with RoPE), with a bias, fp8 and int4 weights and each epilogue. The
    workspace starts smaller than the grid (it grows) and is all zeros after every call, so the
    next call, or graph replay, finds its counters zero. (The interpreter runs the programs in
    order; `test_gpu_split_k_combined_in_the_launch_under_concurrency` checks the ordering.)"""
    from swiftspec.kernels.counters import CounterWorkspace

    if variant == "int4" and dtype == torch.float32 and INTERPRET:
        dtype = torch.bfloat16  # the int4 tile's exact-integer path (float32 x dequantizes per slice)
    ws = CounterWorkspace(DEVICE, capacity=1)
    runs = _combine_case(variant, dtype, torch.Generator().manual_seed(len(variant)), ws)
    for sep, ker in zip(runs["separate"], runs["kernel"]):
        assert torch.equal(sep, ker)
    assert ws.counters.numel() >= 2 and int(ws.counters.abs().sum()) == 0


def test_native_split_k_rule_and_default_launch():
    """Native weights split K at <= 16 rows only with too few column blocks for a long K
    (`SPLIT_RULES`), with or without the folded norm; such a default launch equals the reference and
    the unsplit launch up to float32 summation order."""
    from swiftspec.kernels.gemv import SPLIT_RULES, dot_config

    def split(m, n, k, **kw):
        return dot_config(m, n, k, 2, 2, **kw).split_k

    assert SPLIT_RULES[0] == (32, 4096, 4)
    assert split(1, 1280, 8192) == 4 and split(16, 768, 4096) == 4  # 70B TP 8, 8B TP 8 qkv
    assert split(8, 2048, 8192) == 4 and split(8, 2048, 2048) == 1  # the 1B's down and o (32 blocks)
    assert split(1, 2560, 8192) == 2 and split(1, 2560, 4096) == 1  # 70B TP 4 qkv (40 blocks); short K
    assert split(1, 64 * 41, 8192) == 1 and split(1, 4096, 14336) == 1  # enough column blocks
    assert split(1, 1280, 2048) == 1 and split(32, 1280, 8192) == 1  # short K, more rows
    assert split(1, 1280, 8192, norm=True) == 4 and split(1, 1280, 8192, residual=True) == 4  # the folded norm too
    assert split(1, 1280, 8192, launch=GemvLaunch(split_k=2)) == 2 and dot_config(1, 1280, 8192, 1, 2, fp8=True).split_k == 4
    gen = torch.Generator().manual_seed(11)
    x, w = _rand((3, 4096), gen, torch.float32), _rand((70, 4096), gen, torch.float32)
    got, one = gemv(x, w), gemv(x, w, launch=GemvLaunch(split_k=1))
    ref = F.linear(x.double(), w.double())
    assert float((got.double() - ref).abs().max() / ref.abs().max()) <= 1e-5
    assert float((one.double() - ref).abs().max() / ref.abs().max()) <= 1e-5
    assert not torch.equal(got, one)  # a split launch really ran: another summation order


def test_int4_split_k_rule_and_its_row_limit():
    """int4 weights split K so a program streams ~8 tiles (at most 8 ways) at <= 16 rows and 4 ways
    from 32 rows, only up to `INT4_SPLIT_MAX_N` output rows, or `GemvLaunch.int4_split_max_n`'s:
    the Llama-3-8B's measured choices (qkv and o 4, down 8, gate/up unsplit) hold under both limits
    below its gate/up's 28672 rows, and a higher limit splits the 70B TP 6 gate/up (9728 rows)."""
    from swiftspec.kernels.gemv import INT4_SPLIT_MAX_N, dot_config

    def split(m, n, k, most=None):
        return dot_config(m, n, k, 0.5, 2, int4=True, launch=GemvLaunch(int4_split_max_n=most)).split_k

    assert INT4_SPLIT_MAX_N == 8192
    for most in (None, 24576):
        assert [split(1, n, k, most) for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))] == [4, 4, 1, 8]
        assert split(32, 4096, 4096, most) == 4 and split(1, 1280, 1024, most) == 1  # more rows; short K
    assert split(1, 9728, 8192) == 1 and split(1, 9728, 8192, 24576) == 8
    assert split(32, 9728, 8192) == 1 and split(32, 9728, 8192, 24576) == 4
    assert split(16, 9728, 8192, 9727) == 1 and split(16, 9728, 8192, 9728) == 8  # the limit is inclusive


@pytest.mark.parametrize("m,n,k", [(3, 40, 200), (40, 33, 130)])
def test_gemv_fp8_x_converted_once_is_bit_identical(m, n, k):
    """x_f16 (x to float16 before the launch) gives the in-kernel conversion's result bit for bit,
    including an x entry beyond float16's range (both saturate at 65504), and stays in x's dtype."""
    gen = torch.Generator().manual_seed(m + n)
    x = _rand((m, k), gen, torch.bfloat16)
    x[0, 0] = 1e6
    w8, scale = quantize_fp8(_rand((n, k), gen, torch.float32))
    w8, scale = w8.to(DEVICE), scale.to(DEVICE)
    inside = gemv(x, w8, scale=scale)
    once = gemv(x, w8, scale=scale, launch=GemvLaunch(x_f16=True))
    assert once.dtype == torch.bfloat16 and torch.equal(once, inside)
    ref = F.linear(x.float().clamp(-65504, 65504).half().float(), w8.float() * scale[:, None])
    assert float((once.float() - ref).abs().max() / ref.abs().max()) <= TOL[torch.bfloat16]


def test_gemv_fp8_rejects_bad_arguments():
    w8, scale = quantize_fp8(torch.randn(4, 8))
    w8, scale, x = w8.to(DEVICE), scale.to(DEVICE), torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="need their scale"):
        gemv(x, w8)
    with pytest.raises(ValueError, match="need their scale"):
        gemv(x, torch.randn(4, 8, device=DEVICE), scale=scale)
    with pytest.raises(ValueError, match="kind 'dot'"):
        gemv(x, w8, scale=scale, kind="fma")
    with pytest.raises(ValueError, match="at most 256"):
        gemv(torch.randn(MAX_ROWS_FP8 + 1, 8, device=DEVICE), w8, scale=scale)
    with pytest.raises(ValueError, match="split_k"):
        gemv(x, w8, scale=scale, launch=GemvLaunch(split_k=0))


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


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("m", [1, 16, 64, 256])
def test_gpu_fp8_8b_shapes_in_cuda_graph(m):
    gen = torch.Generator().manual_seed(m)
    w8, scale = quantize_fp8(_rand((14336 * 2, 4096), gen, torch.float32))
    w8, scale = w8.cuda(), scale.cuda()
    x = _rand((m, 4096), gen, torch.bfloat16)
    gemv(x, w8, scale=scale)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = gemv(x, w8, scale=scale)
    x.copy_(_rand((m, 4096), gen, torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    ref = F.linear(x.float(), w8.float() * scale[:, None])
    assert float((y.float() - ref).abs().max() / ref.abs().max()) <= 1.6e-2


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "int4"])
def test_gpu_split_k_combined_in_the_launch_under_concurrency(fmt):
    """On the GPU the splits finish in any order: combine "kernel" at Llama-3-8B's o and down shapes
    (4096 outputs: 64 column blocks, K split 4-8) equals the split-sum launch bit for bit over 200
    replays of a CUDA graph of 8 calls sharing one workspace, new inputs each replay, and leaves
    the counters zero."""
    from swiftspec.kernels.counters import CounterWorkspace
    from swiftspec.kernels.int4 import quantize_int4

    gen = torch.Generator().manual_seed(7)
    ws = CounterWorkspace("cuda")
    calls = []
    for k in (4096, 14336):
        w = _rand((4096, k), gen, torch.float32)
        kw = {}
        if fmt == "bf16":
            w = w.bfloat16().cuda()
        elif fmt == "fp8":
            w, kw["scale"] = (t.cuda() for t in quantize_fp8(w))
        else:
            w = quantize_int4(w.cuda(), 128)
        split = 8 if k > 4096 else 4
        x = _rand((1, k), gen, torch.bfloat16)
        for combine in ("separate", "kernel"):
            calls.append((x, w, kw, GemvLaunch(split_k=split, combine=combine, workspace=ws)))
    for x, w, kw, launch in calls:  # compile outside capture
        gemv(x, w, launch=launch, **kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = [gemv(x, w, launch=launch, **kw) for _ in range(2) for x, w, kw, launch in calls]
    for _ in range(200):
        for x, *_ in calls[::2]:
            x.copy_(torch.randn(x.shape, device="cuda").bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        for sep, ker in zip(ys[0::2], ys[1::2]):
            assert torch.equal(sep, ker)
    assert int(ws.counters.abs().sum()) == 0
