import numpy as np
import pandas as pd
import pytest

from swiftspec.sim.latency import ExtrapolationError, LatencyModel
from swiftspec.sim.profile_default import (
    ANCHORS,
    build_derived_h200_profile,
    bundled_profile_dir,
    default_profile,
)
from swiftspec.spec import Mode, ModelSpec, Profile, UserError


@pytest.fixture(scope="module")
def derived():
    return default_profile()


@pytest.fixture(scope="module")
def specs():
    return {n: ModelSpec.from_config(n) for n in ("Llama-3-70B", "Llama-3-8B", "Llama-3.2-1B", "Qwen2-72B")}


def _toy_profile(layers_ms) -> Profile:
    """`tiny` model at tp 1: layers = layers_ms(tokens, kv) on a small grid; other ops constant."""
    rows = [("layers", "tiny", 1, t, k, layers_ms(t, k)) for t in (1, 2, 4, 8) for k in (100, 200, 400)]
    rows += [(op, "tiny", 1, t, 0, 0.01) for op in ("embed", "lm_head") for t in (1, 2, 4, 8)]
    comm = [("all_reduce", 2, b, 0.01 + b * 1e-9) for b in (1024, 4096, 16384)]
    return Profile(
        compute=pd.DataFrame(rows, columns=["op", "model", "tp", "tokens", "kv_len", "ms"]),
        comm=pd.DataFrame(comm, columns=["collective", "group_size", "bytes", "ms"]),
        meta={"source": "derived", "memory_bytes": 1000},
    )


TINY = ModelSpec(name="tiny", architecture="llama", num_layers=2, hidden=64, num_heads=4, num_kv_heads=2,
                 head_dim=16, ffn=128, vocab=100, qkv_bias=False, tie_embeddings=False)


def test_grid_points_reproduced_exactly(derived):
    prof, _ = derived
    lm = LatencyModel(prof)
    rows = prof.compute[prof.compute["op"] != "host"].sample(200, random_state=0)
    for r in rows.itertuples():
        got = lm.op_ms(r.op, r.model, r.tp, r.tokens, r.kv_len)
        assert got == pytest.approx(r.ms, rel=1e-12, abs=1e-12), r
    for r in prof.comm.sample(30, random_state=0).itertuples():
        got = lm.send_recv_ms(r.bytes) if r.collective == "send_recv" else (
            lm.send_recv_ms(r.bytes, internode=True) if r.collective == "internode_send_recv"
            else lm.allreduce_ms(r.group_size, r.bytes, r.collective)
        )
        assert got == pytest.approx(r.ms, rel=1e-12)


def test_interpolation_is_linear_between_points_and_monotone():
    lm = LatencyModel(_toy_profile(lambda t, k: 0.5 + 0.1 * t + 0.002 * k))
    # the toy table is linear in tokens and kv_len, so piecewise-linear interpolation is exact
    for t, k in [(3, 150), (5, 333), (7, 399), (6, 100)]:
        assert lm.forward_ms(TINY, 1, t, k) == pytest.approx(0.02 + 0.5 + 0.1 * t + 0.002 * k)
    # below the smallest kv_len the time is flat (clamped, not flagged)
    assert lm.forward_ms(TINY, 1, 1, 0) == pytest.approx(lm.forward_ms(TINY, 1, 1, 100))
    assert lm.extrapolations == []


def test_derived_is_monotone(derived, specs):
    lm = LatencyModel(derived[0])
    m = specs["Llama-3-70B"]
    by_tokens = [lm.forward_ms(m, 4, t, 3000) for t in range(1, 257)]
    assert np.all(np.diff(by_tokens) >= -1e-12)
    by_kv = [lm.forward_ms(m, 4, 24, k) for k in range(128, 16385, 97)]
    assert np.all(np.diff(by_kv) >= -1e-12)
    by_bytes = [lm.allreduce_ms(8, b) for b in range(1024, 2**26, 2**19)]
    assert np.all(np.diff(by_bytes) >= 0)


def test_missing_rows_raise_naming_them(derived, specs):
    lm = LatencyModel(derived[0])
    with pytest.raises(ExtrapolationError, match=r"`layers` rows for model Llama-3-70B at tp 9"):
        lm.forward_ms(specs["Llama-3-70B"], 9, 1, 1024)
    with pytest.raises(ExtrapolationError, match="no `layers` rows for model tiny at tp 1"):
        lm.forward_ms(TINY, 1, 1, 1024)
    with pytest.raises(ExtrapolationError, match=r"tokens 300 \(profiled 1..256\)"):
        lm.forward_ms(specs["Llama-3-70B"], 8, 300, 1024)
    with pytest.raises(ExtrapolationError, match=r"kv_len 20000"):
        lm.step_ms(specs["Llama-3-70B"], 8, 8, 20000)
    with pytest.raises(ExtrapolationError, match="group size 9"):
        lm.allreduce_ms(9, 4096)
    assert isinstance(ExtrapolationError("x"), UserError)
    assert lm.extrapolations == []


def test_allowed_extrapolation_is_linear_and_flagged():
    lm = LatencyModel(_toy_profile(lambda t, k: 0.5 + 0.1 * t + 0.002 * k), allow_extrapolation=True)
    assert lm.forward_ms(TINY, 1, 16, 800) == pytest.approx(0.02 + 0.5 + 1.6 + 1.6)
    assert any("tokens 16" in e and "kv_len 800" in e for e in lm.extrapolations)
    # a missing tp between/beyond profiled ones: nearest tp, flagged
    assert lm.forward_ms(TINY, 2, 1, 100) == pytest.approx(lm.forward_ms(TINY, 1, 1, 100))
    assert any("tp 2" in e for e in lm.extrapolations)


def test_step_adds_tp_communication(derived, specs):
    lm = LatencyModel(derived[0])
    m = specs["Llama-3-70B"]
    assert lm.step_ms(m, 1, 8, 1024) == pytest.approx(lm.forward_ms(m, 1, 8, 1024))
    b = lm.step_breakdown(m, 4, 8, 1024)
    ar = lm.allreduce_ms(4, 8 * m.hidden * 2)
    assert b["allreduce"] == pytest.approx(2 * 80 * ar)
    assert b["total"] == pytest.approx(lm.forward_ms(m, 4, 8, 1024) + b["comm"])
    assert lm.step_ms(m, 4, 8, 1024) == pytest.approx(b["total"])
    assert 0.012 <= ar <= 0.015  # SwiftSpec Table 3: 12.0-15.3 µs per all-reduce at TP4
    assert lm.allreduce_ms(1, 10**6) == 0.0
    assert lm.allreduce_ms(2, 10) == lm.allreduce_ms(2, 1024)  # tiny messages: latency-bound


def test_derived_reproduces_the_anchors(derived, specs):
    lm = LatencyModel(derived[0])
    assert lm.label == "derived" and lm.memory_bytes == 141_000_000_000
    for name, tp, tokens, kv, ms in ANCHORS:
        got = lm.forward_ms(specs[name], tp, tokens, kv)
        assert got == pytest.approx(ms, rel=0.10), (name, tp, tokens)
    # per-layer attention increments from the SDPA anchors (tree mask, 8-128 queries, µs)
    m = specs["Llama-3-8B"]
    for tokens in (8, 64):
        d1 = (lm.forward_ms(m, 1, tokens, 4096) - lm.forward_ms(m, 1, tokens, 1024)) / 32 * 1e3
        d2 = (lm.forward_ms(m, 1, tokens, 16384) - lm.forward_ms(m, 1, tokens, 4096)) / 32 * 1e3
        assert 103 - 45 <= d1 * 1.1 and d1 <= (117 - 40) * 1.1
        assert 355 - 117 <= d2 * 1.1 and d2 <= (412 - 103) * 1.1
    # SwiftSpec Table 7 async: 10.48 ms target + host + two messages = 12.19 ms per iteration
    per_iter = 10.48 + lm.host_ms(Mode.async_) + 2 * lm.send_recv_ms(256)
    assert per_iter == pytest.approx(1000 * 3.34 / 274, rel=0.01)
    assert 10.34 + 3.73 + lm.host_ms("serial") == pytest.approx(1000 * 3.63 / 200, rel=0.01)


def test_bundled_profile_matches_builder_and_is_small(derived):
    prof, ref = derived
    assert ref.path == "builtin:h200-derived" and ref.label == "derived" and len(ref.sha256) == 64
    assert sum(f.stat().st_size for f in bundled_profile_dir().iterdir()) < 3e6
    fresh = build_derived_h200_profile()
    pd.testing.assert_frame_equal(fresh.compute.reset_index(drop=True), prof.compute, check_dtype=False)
    pd.testing.assert_frame_equal(fresh.comm.reset_index(drop=True), prof.comm, check_dtype=False, rtol=1e-9)


def test_default_profile_is_measured_only_where_it_covers_the_models():
    prof, ref = default_profile(["Llama-3-70B", "Llama-3.2-3B"])
    assert ref.path == "builtin:h200-measured" and prof.label.startswith("measured, NVIDIA H200")
    assert "not measured: comm" in prof.label  # copied parts are named in the label
    _, ref = default_profile(["deepseek-coder-33b", "deepseek-coder-1.3b"])  # both measured in the bundled profile
    assert ref.path == "builtin:h200-measured"
    _, ref = default_profile(["Llama-3-70B", "my-finetune"])  # a model the measured grid lacks
    assert ref.path == "builtin:h200-derived"
    assert default_profile()[1].path == "builtin:h200-derived"
