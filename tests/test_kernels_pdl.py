"""Programmatic dependent launch (`swiftspec.kernels.pdl`): refused where it cannot work (CPU, the
interpreter), and on a Hopper GPU bit-identical to ordinary launches through a chain of every
kernel, captured in a CUDA graph and replayed over fresh inputs -- a kernel that read its
predecessor's output before `grid_sync` would see stale data in some replay."""

from __future__ import annotations

import pytest
import torch

from swiftspec.kernels.pdl import check_pdl, pdl_available
from swiftspec.runtime.kernel_config import KernelConfig, profile_settings
from swiftspec.runtime.weights import load_model
from swiftspec.spec import UserError

HAS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def test_pdl_refused_on_cpu(make_checkpoint):
    assert not pdl_available("cpu")
    for mode in (True, "early", "late"):
        with pytest.raises(ValueError, match="compute capability >= 9.0"):
            check_pdl(mode, "cpu")
    check_pdl(False, "cpu")  # off is always fine
    check_pdl("off", "cpu")
    def pdl(device, **kw):
        return KernelConfig.resolve(device, **kw).pdl

    assert pdl("cpu") == "off" and pdl("cuda", pdl="off") == "off" and pdl("cuda", pdl="early") == "early"
    assert pdl("cuda", pdl="late") == "late"
    # by default: late where the Triton kernels run on Hopper (or no GPU is here to ask), off elsewhere
    hopper_or_none = not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] >= 9
    assert pdl("cuda") == ("late" if hopper_or_none else "off")
    assert pdl("cuda", capability=(9, 0)) == pdl("cuda", capability=(10, 0)) == "late"
    assert pdl("cuda", capability=(8, 0)) == "off"
    assert pdl("cuda", fusion="off") == "off"
    # fp8 weights too
    assert pdl("cuda", weight_format="fp8") == ("late" if hopper_or_none else "off")
    assert profile_settings("cuda")["pdl"] == ("late" if hopper_or_none else "off")
    assert profile_settings("cuda", "fp8")["pdl"] == profile_settings("cuda")["pdl"]
    assert profile_settings("cpu")["pdl"] == "off"
    with pytest.raises(UserError, match="pdl must be one of off, early, late"):
        pdl("cpu", pdl="yes")
    model = load_model(make_checkpoint("llama"))
    assert model.kernels.pdl == "off" and model.pdl is False
    for mode in ("early", "late", "early-nopeel"):
        with pytest.raises(UserError, match="pdl needs a CUDA GPU"):
            load_model(make_checkpoint("llama"), kernels=KernelConfig(pdl=mode))
    assert load_model(make_checkpoint("llama"), kernels=KernelConfig(pdl="off")).pdl is False


def test_pdl_modes():
    """The kernels' PDL constexpr: 0 off, 1 early, 2 late; anything else refused; only early makes the
    skinny linear give up a pipeline stage for its peeled first tile."""
    from swiftspec.kernels.gemv import dot_config
    from swiftspec.kernels.pdl import launch_options, pdl_mode

    modes = (False, None, "off", True, "early", "late", "early-nopeel", "prefetch")
    assert [pdl_mode(m) for m in modes] == [0, 0, 0, 1, 1, 2, 3, 4]
    for bad in ("on", 1.5, "LATE"):
        with pytest.raises(ValueError, match="pdl must be"):
            pdl_mode(bad)
    assert launch_options(False) == {} and launch_options("late") == {"launch_pdl": True}
    stages = {m: dot_config(1, 4096, 4096, 2, 2, pdl=m).num_stages for m in (False, True, "late", "early-nopeel",
                                                                              "prefetch")}
    assert stages[True] == stages[False] - 1
    assert stages["late"] == stages["early-nopeel"] == stages["prefetch"] == stages[False]


def test_prefetch_lines_cover_the_slice_within_the_budget():
    """PDL "prefetch" asks for each program's whole K slice where all programs' lines fit
    `PREFETCH_BYTES` and `PREFETCH_ROW_LINES`, else the largest power of two that does."""
    from swiftspec.kernels.gemv import PREFETCH_BYTES, PREFETCH_ROW_LINES, dot_config, prefetch_lines

    # int4 8B qkv at 1 row: K split 4, a slice of 1024 inputs = 128 packed int32s = 4 lines a row
    cfg = dot_config(1, 6144, 4096, 0.5, 2, int4=True)
    assert cfg.split_k == 4 and prefetch_lines(6144, 4096, 4, cfg, int4=True) == 4
    # int4 gate/up (62 MB): the budget, 16 MiB / (28672 rows x 128 B) = 4.57 lines, rounds down to 4
    cfg = dot_config(1, 28672, 4096, 0.5, 2, int4=True)
    assert cfg.split_k == 1 and prefetch_lines(28672, 4096, 4, cfg, int4=True) == 4
    # bf16 o at TP 8 (512 x 8192): a 16 KiB row slice, capped at PREFETCH_ROW_LINES
    cfg = dot_config(1, 512, 8192, 2, 2)
    assert prefetch_lines(512, 8192, 2, cfg) == PREFETCH_ROW_LINES
    # a budget of less than a line a row still asks for one
    assert prefetch_lines(PREFETCH_BYTES, 4096, 2, dot_config(1, 4096, 4096, 2, 2)) == 1


def test_kernels_refuse_pdl_on_cpu():
    from swiftspec.kernels.gemv import gemv
    from swiftspec.kernels.rmsnorm import add_rmsnorm
    from swiftspec.kernels.silu_mul import silu_mul

    x = torch.randn(2, 32)
    for call in (lambda: gemv(x, torch.randn(16, 32), pdl=True), lambda: silu_mul(x, pdl=True),
                 lambda: add_rmsnorm(x, None, torch.ones(32), 1e-6, pdl=True)):  # fmt: skip
        with pytest.raises(ValueError, match="compute capability"):
            call()


def _layer_chain(p: dict, x: torch.Tensor, res: torch.Tensor, pdl: bool | str) -> list[torch.Tensor]:
    """One decoder layer's kernels in the order the model runs them, then kv_move; all outputs."""
    from swiftspec.kernels.gemv import gemv
    from swiftspec.kernels.kv_move import kv_move
    from swiftspec.kernels.rmsnorm import add_rmsnorm
    from swiftspec.kernels.rope_kv import rope_kv
    from swiftspec.kernels.silu_mul import silu_mul
    from swiftspec.kernels.tree_attention import TreeAttentionLaunch, pack_tree_mask, tree_attention

    packed = pack_tree_mask(p["mask"], pdl=pdl)
    h, res1 = add_rmsnorm(x, res, p["n1"], 1e-5, pdl=pdl)
    qkv = gemv(h, p["wqkv"], p["bqkv"], pdl=pdl)
    q = rope_kv(qkv, p["cos"], p["sin"], p["slots"], p["kc"], p["vc"], p["hq"], p["hkv"], pdl=pdl)
    a = tree_attention(q, p["kc"], p["vc"], p["prefix"], p["mask"], 0.125, packed_mask=packed, pdl=pdl,
                       launch=TreeAttentionLaunch(workspace=p["ws"], num_splits=4))  # fmt: skip
    o = gemv(a.reshape(a.shape[0], -1), p["wo"], pdl=pdl)
    h2, res2 = add_rmsnorm(o, res1, p["n2"], 1e-5, pdl=pdl)
    m = silu_mul(gemv(h2, p["w13"], pdl=pdl), pdl=pdl)
    down = gemv(m, p["w2"], pdl=pdl)
    kv_move(p["kc"][None], p["vc"][None], p["move_src"], p["prefix"], pdl=pdl)
    return [packed, h, res1, qkv, q, a, o, h2, res2, m, down]


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_HOPPER, reason="needs a CUDA GPU of compute capability >= 9.0")
def test_gpu_pdl_chain_bit_identical_in_cuda_graph():
    from swiftspec.kernels.counters import CounterWorkspace
    from swiftspec.kernels.tree_attention import ancestor_mask

    dev, dt, t, hid, hq, hkv, d, ffn, max_len = "cuda", torch.bfloat16, 8, 1024, 8, 2, 128, 2048, 1024
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape, s=1.0):
        return (s * torch.randn(*shape, generator=g, device=dev)).to(dt)

    def params() -> dict:
        parents = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 5], device=dev)
        return {"wqkv": rnd((hq + 2 * hkv) * d, hid, s=0.03), "bqkv": rnd((hq + 2 * hkv) * d, s=0.1),
                "wo": rnd(hid, hq * d, s=0.03), "w13": rnd(2 * ffn, hid, s=0.03), "w2": rnd(hid, ffn, s=0.03),
                "n1": 1 + rnd(hid, s=0.1), "n2": 1 + rnd(hid, s=0.1), "cos": rnd(t, d), "sin": rnd(t, d),
                "kc": rnd(hkv, max_len, d), "vc": rnd(hkv, max_len, d), "hq": hq, "hkv": hkv,
                "prefix": torch.tensor(700, device=dev), "slots": 700 + torch.arange(t, device=dev),
                "mask": ancestor_mask(parents), "move_src": torch.tensor([700, 701, 704, 707], device=dev),
                "ws": CounterWorkspace(dev)}  # fmt: skip

    modes = (False, True, "late", "early-nopeel", "prefetch")
    runs = {}  # equal weights and caches for every variant: the same seed for each
    for mode in modes:
        g.manual_seed(0)
        runs[mode] = params()
    x0, r0 = rnd(t, hid), rnd(t, hid)  # the same inputs for all: the warm-up run writes the caches too
    x_in = {k: x0.clone() for k in modes}
    r_in = {k: r0.clone() for k in modes}
    graphs, outs = {}, {}
    for pdl, p in runs.items():
        _layer_chain(p, x_in[pdl], r_in[pdl], pdl)  # compile outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs[pdl] = _layer_chain(p, x_in[pdl], r_in[pdl], pdl)
        graphs[pdl] = graph
    for rep in range(6):
        x, r = rnd(t, hid), rnd(t, hid)
        for pdl, p in runs.items():  # same inputs, same cache state for both variants
            x_in[pdl].copy_(x), r_in[pdl].copy_(r)
            p["prefix"].fill_(600 + 17 * rep)
            p["slots"].copy_(600 + 17 * rep + torch.arange(t, device=dev))
            graphs[pdl].replay()
        torch.cuda.synchronize()
        for mode in modes[1:]:
            for i, (a, b) in enumerate(zip(outs[False], outs[mode])):
                assert torch.equal(a, b), f"replay {rep}: output {i} differs with pdl={mode!r}"
            assert torch.equal(runs[False]["kc"], runs[mode]["kc"]) and torch.equal(runs[False]["vc"], runs[mode]["vc"])
        # and the chain is right, not just repeatable: the last GEMM against torch on the same input
        ref = torch.nn.functional.linear(outs[True][9], runs[True]["w2"])
        assert float((outs[True][10].float() - ref.float()).abs().max()) <= 2e-2 * float(ref.float().abs().max())
