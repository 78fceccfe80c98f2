"""Tree attention compiled for sm_90 on the CPU (Triton's bundled ptxas, no GPU): the check
reproduces the two shared-memory refusals the H200 gave, and every launch shape `choose_config`
picks for the bundled models fits Hopper's shared memory."""

from __future__ import annotations

import pytest

from swiftspec.kernels import compile_check
from swiftspec.kernels.gemv import DotConfig
from swiftspec.kernels.tree_attention import TreeAttentionConfig, choose_config
from swiftspec.spec import ModelSpec, bundled_models

pytestmark = pytest.mark.skipif(not compile_check.available(), reason="this Triton has no NVIDIA ptxas")


def test_reproduces_the_h200_refusals():
    a, b, c = compile_check.tree_attention_reports([
        # pytest -m gpu, 2026-12-03: "Required: 278528, Hardware limit: 232448"
        (TreeAttentionConfig(64, 128, 4, num_warps=8, num_stages=3), 128, 4),
        # bench_step_kernels-2026-12-03k, Llama-3.2-1B (D 64) with BLOCK_M 128: "Required: 245760"
        (TreeAttentionConfig(128, 128, 4, num_warps=8, num_stages=3), 64, 4),
        # a tile the H200 ran: BLOCK_M 128 x BLOCK_N 64 x 3 stages at D 128
        (TreeAttentionConfig(128, 64, 8, num_warps=8, num_stages=3), 128, 4),
    ])
    assert a.shared_bytes == 278528 and not a.fits
    assert b.shared_bytes == 245760 and not b.fits
    assert c.fits and c.spill_bytes == 0


def test_every_default_launch_shape_fits_sm90():
    """Bundled models x TP 1-8 shards x 1-256 queries x kv 512-16384, bf16: every distinct tile
    choose_config picks compiles for sm_90 within its shared memory (GROUP only changes index
    arithmetic, so one group per tile)."""
    tiles = set()
    for name in bundled_models():
        spec = ModelSpec.from_config(name)
        group = spec.num_heads // spec.num_kv_heads
        for tp in (1, 2, 4, 8):
            hkv = max(1, spec.num_kv_heads // tp)
            for t in (1, 2, 4, 8, 16, 32, 64, 128, 256):
                for kv in (512, 2048, 8192, 16384):
                    c = choose_config(t, hkv * group, hkv, spec.head_dim, kv, 2)
                    tiles.add((c.block_m, c.block_n, c.num_warps, c.num_stages, c.num_splits > 1, spec.head_dim))
    assert len(tiles) >= 8
    items = [(TreeAttentionConfig(bm, bn, 2 if split else 1, num_warps=warps, num_stages=stages), d, 4)
             for bm, bn, warps, stages, split, d in sorted(tiles)]
    for item, r in zip(items, compile_check.tree_attention_reports(items), strict=True):
        assert r.fits, (item, r)


def _shard_linears(lm_head: bool) -> set[tuple[int, int, bool, str]]:
    """(N, K, normed input, fused epilogue) of every linear of the bundled models' TP 1-8 shards:
    qkv (rope), o, gate/up (swiglu), down, and the LM head."""
    out = set()
    for name in bundled_models():
        spec = ModelSpec.from_config(name)
        for tp in (1, 2, 4, 8):
            sh = spec.shard(tp)
            qkv = (sh.q_heads + 2 * sh.kv_heads) * spec.head_dim
            out |= {(qkv, spec.hidden, True, "rope"), (spec.hidden, sh.q_heads * spec.head_dim, False, ""),
                    (2 * sh.ffn, spec.hidden, True, "swiglu"), (spec.hidden, sh.ffn, False, "")}
            if lm_head:
                out.add((sh.vocab, spec.hidden, True, ""))
    return out


def test_skinny_linear_launches_fit_sm90():
    """Every dot-kind launch the model makes at 1-16 rows on the bundled models' TP 1-8 shards,
    plain and (before qkv, gate/up and the LM head) as the RMSNorm kind with a residual, with the
    gate/up's swiglu epilogue and the qkv's rope epilogue, compiles for sm_90 within its shared
    memory and without spills. The stage rule counts the residual tile (4 stages of 256-wide K steps
    there; 6 would not fit, so the check can fail)."""
    from swiftspec.kernels.gemv import dot_config

    launches = set()
    for n, k, normed, epilogue in _shard_linears(lm_head=True):
        for m in (1, 4, 16):
            for rms in (False, True) if normed else (False,):
                for epi in {"", epilogue}:
                    launches.add((dot_config(m, n, k, 2, 2, residual=rms, norm=rms), rms, epi))
    items = sorted(launches, key=str)
    assert any(cfg.block_k == 256 and rms for cfg, rms, _ in items)  # 256-wide steps with a residual occur
    assert any(cfg.split_k > 1 and epi == "rope" for cfg, _, epi in items)  # the rope epilogue in a split launch
    assert any(cfg.split_k > 1 and rms and epi == "rope" for cfg, rms, epi in items)  # folded norm, split K
    for item, r in zip(items, compile_check.gemv_reports(items), strict=True):
        assert r.fits and r.spill_bytes == 0, (item, r)
    cfg = dot_config(1, 1280, 8192, 2, 2, residual=True)  # 70B TP-8 qkv
    six = compile_check.gemv_reports([(DotConfig(**{**cfg.__dict__, "num_stages": 6}), True, "")])[0]
    assert cfg.num_stages == 4 and six.shared_bytes > compile_check.SM90_SHARED_LIMIT and not six.fits


def test_int4_launches_fit_sm90_without_spills():
    """Every int4 launch the model makes (1-128 rows per launch: more run in launches of 128) on
    the bundled models' TP 1-8 shards, with the qkv's rope and the gate/up's swiglu epilogues,
    compiles for sm_90 within its shared memory and without spilling registers (the K loop's
    spills are what made the first W4A16 kernel 16-104x its floor). A 256-row tile does spill,
    so the check can fail."""
    from swiftspec.kernels.gemv import INT4_TILE_ROWS, dot_config

    launches = set()
    for n, k, _, epilogue in _shard_linears(lm_head=False):  # the LM head stays in the model dtype
        for m in (1, 4, 16, 32, 64, INT4_TILE_ROWS):
            for epi in {"", epilogue}:
                launches.add((dot_config(m, n, k, 0.5, 2, int4=True), False, epi))
    items = sorted(launches, key=str)
    assert {cfg.block_m for cfg, _, _ in items} == {16, 32, 64, 128}
    for item, r in zip(items, compile_check.gemv_reports(items, int4_group=128), strict=True):
        assert r.fits and r.spill_bytes == 0, (item, r)
    big = dot_config(256, 4096, 4096, 0.5, 2, int4=True)
    assert compile_check.gemv_reports([(big, False, "")], int4_group=128)[0].spill_bytes > 0


def test_split_k_combined_in_the_launch_fits_sm90():
    """The split-K sum inside the launch (`GemvLaunch.combine` "kernel") adds an epilogue, not a
    loop: split launches of each weight format (70B TP-8 qkv with the folded norm and rope, the 8B's
    down in fp8, int4 with rope) compile for sm_90 within the same shared memory as the separate
    sum and without spills."""
    from swiftspec.kernels.gemv import dot_config

    cases = [((dot_config(1, 1280, 8192, 2, 2, residual=True, norm=True), True, "rope"), 0),
             ((dot_config(16, 4096, 14336, 1, 2, fp8=True), False, ""), 0),
             ((dot_config(1, 1280, 8192, 0.5, 2, int4=True), False, "rope"), 128)]
    for group in (0, 128):
        items = [item for item, g in cases if g == group]
        assert all(cfg.split_k > 1 for cfg, _, _ in items)
        kernel, separate = (compile_check.gemv_reports(items, int4_group=group, combine=c) for c in (True, False))
        for item, k, s in zip(items, kernel, separate, strict=True):
            assert k.fits and k.spill_bytes == 0 and k.shared_bytes == s.shared_bytes, (item, k)


def test_prefetch_mode_asks_the_l2_for_each_line_before_the_wait():
    """PDL "prefetch" (constexpr 4) compiles for sm_90 with one `prefetch.global.L2` per line a
    thread asks for, all before the grid's wait, and the other modes with none."""
    from swiftspec.kernels.gemv import dot_config, prefetch_lines

    items, expect = [], []
    for int4 in (False, True):
        n, k = 6144, 4096
        cfg = dot_config(1, n, k, 0.5 if int4 else 2, 2, int4=int4, pdl="prefetch")
        lines = prefetch_lines(n, k, 4 if int4 else 2, cfg, int4=int4)
        # (BLOCK_N rows x lines) weight lines over the program's threads, and for int4 a line of
        # scales and one of zero points per row (a vector of BLOCK_N: at least one per thread)
        threads = 32 * cfg.num_warps
        quant = 2 * max(1, cfg.block_n // threads) if int4 else 0
        for pdl, pf in ((2, 0), (3, 0), (4, lines)):
            items.append((cfg, "rope", 128 if int4 else 0, pdl, pf))
            expect.append(cfg.block_n * lines // threads + quant if pf else 0)
    facts = compile_check.gemv_prefetch_facts(items)
    assert [f["l2_prefetches"] for f in facts] == expect
    assert all(f["before_wait"] for f in facts)
