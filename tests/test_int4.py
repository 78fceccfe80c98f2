"""int4 weights: the AWQ GEMM format, round-to-nearest quantization, the W4A16 skinny linear
(interpreted Triton against its torch reference) and int4 models from native and AWQ checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from swiftspec.kernels.gemv import INT4_TILE_ROWS, Epilogue, GemvLaunch, RopeKV, gemv, gemv_ref
from swiftspec.kernels.int4 import (
    AWQ_ORDER,
    awq_dequantize,
    dequantize,
    from_awq,
    pack_nibbles,
    quantize_int4,
    quantize_rtn,
    to_awq,
    unpack_nibbles,
)
from swiftspec.kernels.pdl import PDL_MODES, pdl_available
from swiftspec.kernels.rope_kv import rope_kv
from swiftspec.kernels.silu_mul import silu_mul
from swiftspec.runtime.awq import write_awq_checkpoint
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.runtime.weights import load_model
from swiftspec.spec import ModelSpec, UserError

pytestmark = pytest.mark.usefixtures("one_thread")
# the kernels run on CPU tensors under the interpreter (the README's test command sets it)
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"),
                                 reason="Triton kernels on CPU tensors need TRITON_INTERPRET=1")


def _awq_pack_by_definition(q: torch.Tensor) -> torch.Tensor:
    """The AWQ GEMM packing written out: int32 j of a row holds column 8j + AWQ_ORDER[i] at bits 4i."""
    rows, n = q.shape
    out = torch.zeros(rows, n // 8, dtype=torch.int64)
    for j in range(n // 8):
        for i, c in enumerate(AWQ_ORDER):
            out[:, j] |= q[:, 8 * j + c].to(torch.int64) << (4 * i)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 5), packs=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_nibble_packing_round_trips_and_awq_order_is_the_definition(rows, packs, seed):
    q = torch.randint(0, 16, (rows, 8 * packs), generator=torch.Generator().manual_seed(seed))
    assert torch.equal(unpack_nibbles(pack_nibbles(q)).long(), q)
    awq = quantize_rtn(torch.randn(8 * packs, 32, generator=torch.Generator().manual_seed(seed)), 32)
    # the kernel layout's q, packed by the format's definition, is the checkpoint's qweight
    q_nk = unpack_nibbles(from_awq(awq).qweight)  # (N, K)
    assert torch.equal(_awq_pack_by_definition(q_nk.t()), awq.qweight)


@settings(max_examples=25, deadline=None)
@given(n8=st.integers(1, 4), groups=st.integers(1, 3), group=st.sampled_from([8, 32, 128]),
       seed=st.integers(0, 2**16), shift=st.floats(-0.05, 0.05))
def test_rtn_quantization_error_is_at_most_half_a_step(n8, groups, group, seed, shift):
    """Round to nearest: in a group spanning zero every weight whose integer is inside (0, 15) is
    within half a step (s / 2, plus the float16 scale's rounding) of its dequantized value, and the
    clamped ends within one step (the zero point and the top are rounded separately); the AWQ and
    kernel layouts dequantize to the same numbers and convert both ways exactly."""
    w = torch.randn(8 * n8, groups * group, generator=torch.Generator().manual_seed(seed)) * 0.02 + shift
    awq = quantize_rtn(w, group)
    w4 = from_awq(awq)
    deq = dequantize(w4)
    assert torch.equal(deq, awq_dequantize(awq))
    back = to_awq(w4)
    assert all(torch.equal(a, b) for a, b in zip((back.qweight, back.qzeros, back.scales),
                                                  (awq.qweight, awq.qzeros, awq.scales), strict=True))
    s = w4.scales.float().repeat_interleave(group, dim=1)
    g = w.reshape(w.shape[0], groups, group)
    spans_zero = ((g.amin(2) <= 0) & (g.amax(2) >= 0)).repeat_interleave(group, dim=1)
    err, step = (deq - w).abs(), s * (1 + 2e-3) + 1e-7
    inside = spans_zero & (unpack_nibbles(w4.qweight) > 0) & (unpack_nibbles(w4.qweight) < 15)
    assert bool((err[inside] <= 0.5 * step[inside]).all()) and bool((err[spans_zero] <= step[spans_zero]).all())
    assert w4.qweight.dtype == torch.int32 and w4.scales.dtype == w4.zeros.dtype == torch.float16


def test_quantize_rejects_groups_that_do_not_divide():
    with pytest.raises(ValueError, match="group size"):
        quantize_rtn(torch.randn(8, 96), 64)
    with pytest.raises(ValueError, match="multiple of 8"):
        quantize_rtn(torch.randn(12, 128), 128)


def _tol(dtype: torch.dtype, ref: torch.Tensor) -> float:
    """Allowed |kernel - reference|: float32 summation order; bf16 / fp16 one rounding of the output."""
    eps = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    return eps * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 5, 16, 33, 131])
@pytest.mark.parametrize("group", [32, 128])
@interpreted
def test_w4a16_equals_reference(dtype, rows, group):
    """Random int4 weights (odd N: a partial column block), bias on, split K both ways; a tile of
    one group (bf16 / fp16: scale and zero applied per tile) and of two (dequantized per slice); x
    gathered each tile and a tile ahead (the default at <= 64 rows)."""
    gen = torch.Generator().manual_seed(rows * 7 + group)
    n, k = 72, 256
    w4 = quantize_int4(torch.randn(n, k, generator=gen), group)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    bias = torch.randn(n, generator=gen).to(dtype)
    ref = gemv_ref(x, w4, bias)
    for launch in (GemvLaunch(), GemvLaunch(split_k=2), GemvLaunch(split_k=1, block_k=256),
                   GemvLaunch(int4_x_ahead=rows > 64)):
        got = gemv(x, w4, bias, launch=launch)
        assert got.dtype == dtype and got.shape == (rows, n)
        assert (got.float() - ref.float()).abs().max().item() <= _tol(dtype, ref), launch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k, group", [(1152, 128), (1000, 8)])
@interpreted
def test_w4a16_x_gathered_a_tile_ahead_equals_reference(dtype, k, group):
    """`GemvLaunch.int4_x_ahead` over up to 9 tiles a program (K 1152: whole tiles, the prefetch
    past the last one in bounds; K 1000: a partial last tile, masked), in one program and K split 3
    and 8 ways (K 1152: 2 tiles a split, so splits 5-7 have none)."""
    gen = torch.Generator().manual_seed(k)
    w4 = quantize_int4(torch.randn(24, k, generator=gen), group)
    x = torch.randn(3, k, generator=gen).to(dtype)
    ref = gemv_ref(x, w4)
    for split in (1, 3, 8):
        got = gemv(x, w4, launch=GemvLaunch(split_k=split, int4_x_ahead=True))
        assert (got.float() - ref.float()).abs().max().item() <= _tol(dtype, ref), split


@interpreted
def test_w4a16_epilogues_equal_the_unfused_ops():
    """swiglu and RoPE + KV write in the int4 GEMM's epilogue equal the separate kernels after it."""
    gen = torch.Generator().manual_seed(3)
    dt, t, k, hq, hkv, d = torch.float32, 3, 128, 2, 1, 32
    w13 = quantize_int4(torch.randn(2 * 64, k, generator=gen), 64)
    x = torch.randn(t, k, generator=gen)
    for split in (1, 2):
        got = gemv(x, w13, epilogue=Epilogue(act="swiglu"), launch=GemvLaunch(split_k=split))
        want = silu_mul(gemv(x, w13, launch=GemvLaunch(split_k=split)))
        assert torch.allclose(got, want, atol=1e-5)
    wqkv = quantize_int4(torch.randn((hq + 2 * hkv) * d, k, generator=gen), 128)
    ang = torch.rand(t, d, generator=gen)
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    slots = torch.tensor([0, 2, 5])
    caches = [torch.zeros(hkv, 8, d) for _ in range(4)]
    q = gemv(x, wqkv, epilogue=Epilogue(rope=RopeKV(cos, sin, slots, caches[0], caches[1], hq, hkv)))
    q_ref = rope_kv(gemv(x, wqkv), cos, sin, slots, caches[2], caches[3], hq, hkv)
    assert torch.allclose(q, q_ref, atol=1e-5)
    assert torch.allclose(caches[0], caches[2], atol=1e-5) and torch.allclose(caches[1], caches[3], atol=1e-5)
    # more rows than one launch takes (INT4_TILE_ROWS): each launch gets its rows' cos, sin and slots
    t = INT4_TILE_ROWS + 3
    x = torch.randn(t, k, generator=gen)
    ang = torch.rand(t, d, generator=gen)
    cos, sin, slots = ang.cos(), ang.sin(), torch.randperm(t + 5, generator=gen)[:t]
    caches = [torch.zeros(hkv, t + 5, d) for _ in range(4)]
    q = gemv(x, wqkv, epilogue=Epilogue(rope=RopeKV(cos, sin, slots, caches[0], caches[1], hq, hkv)))
    q_ref = rope_kv(gemv(x, wqkv), cos, sin, slots, caches[2], caches[3], hq, hkv)
    assert torch.allclose(q, q_ref, atol=1e-5) and torch.allclose(caches[0], caches[2], atol=1e-5)
    assert torch.allclose(caches[1], caches[3], atol=1e-5) and caches[0].abs().sum() > 0


def test_w4a16_refuses_what_it_cannot_run():
    w4 = quantize_int4(torch.randn(16, 128), 128)
    with pytest.raises(ValueError, match="int4 weights need"):
        gemv(torch.randn(1, 128), w4, epilogue=Epilogue(rms_eps=1e-6))
    with pytest.raises(ValueError, match="need x"):
        gemv(torch.randn(1, 64), w4)


# int4 models ---------------------------------------------------------------------------------
_SHAPES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


def _logits(model, ids: list[int]) -> torch.Tensor:
    from swiftspec.runtime.kv_cache import KVCache

    t, dev = len(ids), model.device
    cache = KVCache(model.spec, model.shard, 64, dev, model.dtype)
    pos = torch.arange(t, device=dev)
    return model(torch.tensor(ids, device=dev), pos, cache, pos, 0,
                 torch.tril(torch.ones(t, t, dtype=torch.bool, device=dev)))


def _rtn_reference(src, group: int):
    """The native model of `src` with every projection replaced by its dequantized RTN weight."""
    ref = load_model(src)
    with torch.no_grad():
        for layer in ref.layers:
            for name in ("wqkv", "wo", "w13", "w2"):
                w = getattr(layer, name)
                w.copy_(awq_dequantize(quantize_rtn(w, group)))
    return ref


@pytest.fixture(scope="module")
def native_and_awq(make_checkpoint, tmp_path_factory):
    src = make_checkpoint("llama", **_SHAPES)
    dst = write_awq_checkpoint(src, tmp_path_factory.mktemp("awq") / "int4-g32", group_size=32)
    return src, dst


def test_awq_checkpoint_loads_as_int4_and_equals_rtn_of_the_native_model(native_and_awq):
    """The AWQ copy loads as int4 by itself and its logits equal the native model's with every
    projection replaced by its dequantized RTN weight; quantizing while loading (--weight-format
    int4) at the same group gives the same model."""
    src, dst = native_and_awq
    spec = ModelSpec.from_config(dst)
    assert spec.weight_format == "int4" and spec.group_size == 32
    awq = load_model(dst)
    assert awq.weight_format == "int4" and awq.layers[0].wqkv.dtype == torch.int32
    ids = [5, 17, 200, 3, 99]
    want = _logits(_rtn_reference(src, 32), ids)
    assert torch.allclose(_logits(awq, ids), want, atol=1e-4, rtol=1e-4)
    native = _logits(load_model(src), ids)
    assert (native - want).abs().max() > 1e-3  # the quantization does change the model
    spec32 = ModelSpec.from_config(src)
    assert spec32.weight_format == "native"
    with pytest.raises(UserError, match="AWQ int4 checkpoint"):
        load_model(dst, kernels=KernelConfig.resolve("cpu", weight_format="fp8"))


def test_quantizing_while_loading_equals_the_awq_copy(native_and_awq, make_checkpoint, tmp_path):
    src, _ = native_and_awq
    g128 = write_awq_checkpoint(src, tmp_path / "g128", group_size=128)
    on_load = load_model(src, kernels=KernelConfig.resolve("cpu", weight_format="int4"))
    ids = [1, 2, 3, 250]
    assert torch.equal(_logits(on_load, ids), _logits(load_model(g128), ids))
    assert json.loads((g128 / "config.json").read_text())["quantization_config"]["group_size"] == 128
    with pytest.raises(UserError, match="exists"):
        write_awq_checkpoint(src, g128)


@interpreted
def test_int4_model_on_the_w4a16_kernel_equals_its_reference_path(native_and_awq):
    """The same int4 model run by the Triton kernels (interpreted) and by the torch reference path."""
    _, dst = native_and_awq
    ref = load_model(dst)
    tri = load_model(dst, kernels=KernelConfig(linear="triton", fusion="triton", swiglu=True, rope=True,
                                               weight_format="int4"))
    ids = [7, 8, 9]
    assert torch.allclose(_logits(tri, ids), _logits(ref, ids), atol=1e-4, rtol=1e-4)


def test_int4_weight_bytes():
    spec = ModelSpec(name="m", architecture="llama", num_layers=1, hidden=4096, num_heads=32, num_kv_heads=8,
                     head_dim=128, ffn=14336, vocab=1000, qkv_bias=False, tie_embeddings=False)
    native = spec.layer_weight_bytes()
    int4 = ModelSpec(**{**spec.to_dict(), "weight_format": "int4"}).layer_weight_bytes()
    gemm = native // 2 - 2 * 4096  # GEMM weights only
    assert int4 == gemm // 2 + 4 * gemm // 128 + 2 * 4096 * 2


@pytest.mark.parametrize("q, match", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "not supported"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128}, "not supported"),
    ({"quant_method": "awq", "bits": 4, "group_size": 100, "version": "gemm"}, "power of two"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "not supported"),
])
def test_unsupported_quantization_configs_are_one_line_errors(make_checkpoint, tmp_path, q, match):
    src = make_checkpoint("llama", **_SHAPES)
    cfg = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": q}))
    with pytest.raises(UserError, match=match):
        ModelSpec.from_config(tmp_path)


def test_cli_int4_is_labelled_and_lossless(make_checkpoint, native_and_awq, swiftspec_cli):
    """--weight-format int4 (quantized while loading) and an AWQ checkpoint (int4 by itself): the
    JSON says int4, and serial speculation gives the int4 target's own greedy tokens."""
    src, awq = native_and_awq
    draft = make_checkpoint("llama", **{**_SHAPES, "num_hidden_layers": 1}, seed=5)
    for target, extra in ((src, ["--weight-format", "int4"]), (awq, [])):
        common = ["--target", target, "--prompt-ids", "5,6,7", "--max-new-tokens", 8, "--no-eos", "--json", *extra]
        code, out, err = swiftspec_cli("generate", *common)
        assert code == 0, err
        ref = json.loads(out)
        code, out, err = swiftspec_cli("generate", *common, "--draft", draft, "--mode", "serial", "--bs", 6, "--w", 2,
                                       "--d", 2)
        assert code == 0, err
        res = json.loads(out)
        assert res["weight_format"] == ref["weight_format"] == "int4" and res["tokens"] == ref["tokens"]


def test_awq_checkpoint_at_tp2_gives_the_tp1_tokens(native_and_awq):
    """Each TP rank reads its slice of qweight / qzeros / scales (outputs in packs of 8, inputs in
    whole groups): serial speculation with the AWQ target at TP 2 (gloo) gives its TP-1 greedy tokens."""
    from swiftspec.runtime.engine import Job, Task
    from swiftspec.runtime.generate import generate_from_checkpoints
    from swiftspec.runtime.launch import launch
    from swiftspec.spec import Mode, Split, TreePolicy

    src, awq = native_and_awq
    prompts = [[5, 17, 99, 3], [200, 1, 64]]
    want = [generate_from_checkpoints(awq, mode="autoregressive", prompt=p, max_new_tokens=10, eos=False).tokens
            for p in prompts]
    job = Job(target=str(awq), draft=str(src), split=Split.shared(2), tasks=[Task(Mode.serial, TreePolicy(6, 2, 2))],
              prompts=prompts, max_new_tokens=10, timeout_s=90)
    got = sorted(launch(job)[0]["prompts"], key=lambda r: r["prompt"])
    assert [r["tokens"] for r in got] == want


def test_qwen2_awq_checkpoint_keeps_its_biases_and_slices_at_tp2(make_checkpoint, tmp_path):
    """Qwen2 (q/k/v biases stay in the model dtype, as AWQ keeps them): the AWQ copy's logits equal
    the RTN reference with the native biases, and serial speculation at TP 2 (gloo) gives the copy's
    TP-1 greedy tokens."""
    from swiftspec.runtime.engine import Job, Task
    from swiftspec.runtime.generate import generate_from_checkpoints
    from swiftspec.runtime.launch import launch
    from swiftspec.spec import Mode, Split, TreePolicy

    src = make_checkpoint("qwen2", **_SHAPES)
    awq = write_awq_checkpoint(src, tmp_path / "qwen2-int4-g32", group_size=32)
    spec = ModelSpec.from_config(awq)
    assert spec.architecture == "qwen2" and spec.qkv_bias and spec.weight_format == "int4"
    model = load_model(awq)
    assert model.layers[0].bqkv.abs().sum() > 0 and model.layers[0].bqkv.dtype == model.dtype
    ids = [5, 17, 200, 3, 99]
    assert torch.allclose(_logits(model, ids), _logits(_rtn_reference(src, 32), ids), atol=1e-4, rtol=1e-4)
    prompt = [5, 17, 99, 3]
    want = generate_from_checkpoints(awq, mode="autoregressive", prompt=prompt, max_new_tokens=10, eos=False).tokens
    job = Job(target=str(awq), draft=str(src), split=Split.shared(2), tasks=[Task(Mode.serial, TreePolicy(6, 2, 2))],
              prompts=[prompt], max_new_tokens=10, timeout_s=90)
    assert launch(job)[0]["prompts"][0]["tokens"] == want


def test_derived_int4_profile_recomputes_the_forwards_weight_bytes():
    """`profile derive --weight-format int4`: forward and layers rows shrink by exactly the bytes
    the int4 weights save (math and the rest kept), every other row is copied, the label says so.
    The bundled `h200-int4-derived` is the other derivation, of the measured `h100-int4` rows to
    the H200's datasheet (the measured kernels' share of the bandwidth kept), and it stays int4."""
    from swiftspec.sim.derive import _spec, row_work
    from swiftspec.sim.derive_format import derive_weight_format
    from swiftspec.sim.hardware import HardwareSpec
    from swiftspec.spec import Profile

    src = Profile.load("builtin:h200-measured")
    hw = HardwareSpec.load("builtin:h200")
    got = derive_weight_format(src, "int4", hw, "builtin:h200-measured")
    assert "int4 weights" in got.label and got.meta["weight_format"] == "int4"
    a, b = src.compute, got.compute
    same = ~a["op"].isin(["forward", "layers"])
    assert (a.loc[same, "ms"].to_numpy() == b.loc[same, "ms"].to_numpy()).all()
    fwd = a["op"] == "forward"
    assert (b.loc[fwd, "ms"] <= a.loc[fwd, "ms"] * (1 + 1e-12)).all()  # math-bound rows keep their time
    one = fwd & (a["tokens"] == 1)
    assert (b.loc[one, "ms"] < a.loc[one, "ms"]).all()
    r = a[fwd & (a["model"] == "Llama-3-8B") & (a["tp"] == 1) & (a["tokens"] == 1)].iloc[0]
    by, f = row_work("forward", _spec("Llama-3-8B", 2, "native"), 1, 1, float(r.kv_len))
    b4, _ = row_work("forward", _spec("Llama-3-8B", 2, "int4"), 1, 1, float(r.kv_len))
    bw = hw.hbm_tb_s * 1e9
    assert by / bw > f / (hw.bf16_tflops * 1e9)  # 1 token: bytes-bound
    want = r.ms - (by - b4) / bw
    assert abs(float(b.loc[r.name, "ms"]) - want) < 1e-9
    from swiftspec.sim.derive import derive_profile

    h100 = Profile.load("builtin:h100-int4")
    want = derive_profile(h100, HardwareSpec.load("builtin:h100-sxm"), hw, "builtin:h100-int4")
    bundled = Profile.load("builtin:h200-int4-derived")
    assert bundled.compute["ms"].round(9).tolist() == want.compute["ms"].round(9).tolist()
    assert bundled.meta["weight_format"] == "int4" and "int4 weights" in bundled.label
    with pytest.raises(UserError, match="from native rows"):
        derive_weight_format(got, "int4", hw, "x")


def test_plan_on_the_int4_profile_is_labelled_and_faster(swiftspec_cli):
    code, out, err = swiftspec_cli("plan", "--gpus", 8, "--profile", "builtin:h200-int4-derived", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert "int4 weights" in doc["profile"]
    code, out2, err = swiftspec_cli("plan", "--gpus", 8, "--json")
    assert doc["rows"][0]["tokens_per_s_mean"] > json.loads(out2)["rows"][0]["tokens_per_s_mean"]
    code, _, err = swiftspec_cli("profile", "derive", "--from", "builtin:h200-measured", "-o", "/tmp/never-written")
    assert code == 2 and "nothing to derive" in err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("n, k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
def test_w4a16_on_the_gpu_equals_reference_at_llama_8b_shapes(n, k):
    gen = torch.Generator("cuda").manual_seed(n + k)
    w4 = quantize_int4(torch.randn(n, k, generator=gen, device="cuda") * 0.02, 128)
    for rows in (1, 16, 64, 256):
        x = torch.randn(rows, k, generator=gen, device="cuda").bfloat16()
        ref = gemv_ref(x, w4).float()
        for launch in (GemvLaunch(), GemvLaunch(block_k=256), GemvLaunch(int4_x_ahead=False),
                       GemvLaunch(int4_x_ahead=True)):
            got = gemv(x, w4, launch=launch).float()
            assert (got - ref).abs().max().item() <= 1.6e-2 * max(1.0, ref.abs().max().item()), (rows, launch)
        if pdl_available("cuda"):  # every PDL mode runs the same arithmetic: equal bit for bit
            plain = gemv(x, w4)
            for pdl in PDL_MODES[1:]:
                assert torch.equal(gemv(x, w4, pdl=pdl), plain), (rows, pdl)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_int4_model_on_the_gpu_kernels_equals_its_reference_path(native_and_awq):
    """The AWQ model in bf16 on the GPU: the runtime's kernels (W4A16 with its epilogues, PDL)
    against the torch reference path (dequantized weights, `F.linear`)."""
    _, dst = native_and_awq
    ref = load_model(dst, device="cuda", dtype=torch.bfloat16, kernels=KernelConfig(weight_format="int4"))
    fast = load_model(dst, device="cuda", dtype=torch.bfloat16,
                      kernels=KernelConfig.resolve("cuda", weight_format="int4"))
    assert fast.kernels.linear == "triton" and fast.kernels.weight_format == "int4"
    ids = [7, 8, 9, 100]
    a, b = _logits(fast, ids).float(), _logits(ref, ids).float()
    assert (a - b).abs().max() <= 0.05 * b.abs().max()


def test_int4_shards_hold_whole_groups_for_the_bundled_models():
    """int4 pads each rank's ffn to whole groups, so every bundled model quantizes with groups of
    128 at every TP degree of a node, and the padded ffn still covers the model's."""
    import dataclasses

    from swiftspec.catalog import catalog
    from swiftspec.runtime.weights import rtn_group_size

    names = [m["name"] for m in catalog()["models"]]
    assert {"Llama-3-70B", "Qwen2-72B", "Llama-3.2-1B", "Qwen2-1.5B"} <= set(names)
    for name in names:
        spec = dataclasses.replace(ModelSpec.from_config(name), weight_format="int4")
        for tp in (1, 2, 4, 6, 8):
            sh = spec.shard(tp)
            assert sh.ffn % 128 == 0 and sh.ffn * tp >= spec.ffn and sh.ffn - -(-spec.ffn // tp) < 128
            assert rtn_group_size(spec, tp) == 128, (name, tp)
