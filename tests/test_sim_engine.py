"""The SimPy engine and the rank-view tree: closed forms with constant latencies, brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest

from swiftspec.sim.acceptance import AcceptanceModel, ml_tree_paths
from swiftspec.sim.engine import Workload, make_trajectories, simulate, to_chrome_trace
from swiftspec.sim.latency import LatencyModel
from swiftspec.sim.rank_tree import RankTree, StaticRankTree, request_trajectory
from swiftspec.spec import AcceptanceProfile, Mode, ModelSpec, Profile, Split, TreePolicy

TGT = ModelSpec("tgt", "llama", num_layers=3, hidden=64, num_heads=4, num_kv_heads=2, head_dim=16, ffn=128,
                vocab=256, qkv_bias=False, tie_embeddings=False)
DRF = ModelSpec("drf", "llama", num_layers=2, hidden=32, num_heads=4, num_kv_heads=2, head_dim=8, ffn=64,
                vocab=256, qkv_bias=False, tie_embeddings=False)

# constant latencies, ms
C = dict(
    layers={"tgt": 7.0, "drf": 1.1}, embed={"tgt": 0.05, "drf": 0.02}, lm_head={"tgt": 0.4, "drf": 0.13},
    tree_growth={"tgt": 0.03, "drf": 0.07}, kv_compact={"tgt": 0.011, "drf": 0.009},
    host={"autoregressive": 0.21, "chain": 0.33, "serial": 0.47, "async": 0.61},
    all_reduce=0.017, send_recv=0.023, internode_send_recv=0.25,
)


def const_profile(scale_target: float = 1.0, memory_bytes: int = 10**12) -> Profile:
    rows = []
    for op in ("layers", "embed", "lm_head", "tree_growth", "kv_compact"):
        for model in ("tgt", "drf"):
            ms = C[op][model] * (scale_target if model == "tgt" else 1.0)
            for tp in range(1, 9):
                kvs = (128, 1 << 16) if op == "layers" else (0,)
                for tokens, kv in itertools.product((1, 4096), kvs):
                    rows.append((op, model, tp, tokens, kv, ms))
    for mode, ms in C["host"].items():
        rows.append(("host", mode, 1, 0, 0, ms))
    comm = []
    for b in (1, 1 << 30):
        for g in range(2, 9):
            comm.append(("all_reduce", g, b, C["all_reduce"]))
        comm.append(("send_recv", 2, b, C["send_recv"]))
        comm.append(("internode_send_recv", 2, b, C["internode_send_recv"]))
    return Profile(
        compute=pd.DataFrame(rows, columns=["op", "model", "tp", "tokens", "kv_len", "ms"]),
        comm=pd.DataFrame(comm, columns=["collective", "group_size", "bytes", "ms"]),
        meta={"source": "derived", "memory_bytes": memory_bytes, "device": "cuda"},
    )


def step(model: str, tp: int, scale: float = 1.0) -> float:
    """Closed form of one forward of a TP group: embed + layers + LM head + (2 L + 1) all-reduces."""
    spec = TGT if model == "tgt" else DRF
    compute = (C["embed"][model] + C["layers"][model] + C["lm_head"][model]) * scale
    return compute + ((2 * spec.num_layers + 1) * C["all_reduce"] if tp > 1 else 0.0)


def always_right(q=(0.6, 0.25, 0.1, 0.05, 0.03, 0.02, 0.01, 0.005)) -> AcceptanceModel:
    """The target's token is always the draft's most likely one."""
    return AcceptanceModel(AcceptanceProfile(positional=[1.0], draft_prob_by_rank=list(q), meta={"source": "synthetic"}))


def random_acceptance(seed_q=(0.5, 0.2, 0.12, 0.08, 0.05, 0.03, 0.01, 0.01)) -> AcceptanceModel:
    return AcceptanceModel(AcceptanceProfile(positional=[0.55, 0.15, 0.06, 0.03, 0.01], draft_prob_by_rank=list(seed_q),
                                             meta={"source": "synthetic"}))


WL = Workload(prompt_len=200, max_new_tokens=60, requests=3, seed=1)


# ---- closed forms ---------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [1, 4])
def test_autoregressive_is_one_over_step(gpus):
    lat = LatencyModel(const_profile())
    r = simulate(lat, always_right(), TGT, None, Split.shared(gpus, with_draft=False), Mode.autoregressive,
                 TreePolicy.autoregressive(), WL)
    t = step("tgt", gpus) + C["host"]["autoregressive"]
    assert r.summary.tokens_per_s_mean == pytest.approx(1000.0 / t, rel=1e-9)
    assert r.summary.tokens_per_s_p95 == pytest.approx(1000.0 / t, rel=1e-9)
    assert r.summary.mean_accepted == 1.0
    assert len(r.timeline) == WL.requests * WL.max_new_tokens
    assert r.summary.target_busy == pytest.approx(step("tgt", gpus) / t, rel=1e-9)


@pytest.mark.parametrize("k,gpus", [(3, 1), (5, 2)])
def test_chain_always_right_closed_form(k, gpus):
    """accepted = k + 1; tokens/s = (k+1) / (host + k t_draft + t_verify + compactions)."""
    lat = LatencyModel(const_profile())
    r = simulate(lat, always_right(), TGT, DRF, Split.shared(gpus), Mode.chain, TreePolicy.chain(k), WL)
    t_draft = step("drf", gpus) + C["tree_growth"]["drf"]
    t_iter = C["host"]["chain"] + k * t_draft + step("tgt", gpus) + C["kv_compact"]["tgt"] + C["kv_compact"]["drf"]
    assert r.summary.mean_accepted == k + 1
    assert r.summary.tokens_per_s_mean == pytest.approx(1000.0 * (k + 1) / t_iter, rel=1e-9)
    assert r.summary.iteration_ms == pytest.approx(t_iter, rel=1e-9)
    # co-located: draft and target never overlap
    df = r.timeline
    assert (df["target_start_ms"] >= df["draft_end_ms"] - 1e-12).all()


def test_serial_tree_closed_form_with_fixed_paths():
    """Serial with a fixed acceptance: tokens/s = accepted / (d t_draft + t_verify + host + compactions),
    per request, with `accepted` from a brute-force walk of the tree's rank paths."""
    lat = LatencyModel(const_profile())
    acc = random_acceptance()
    pol = TreePolicy(bs=8, w=4, d=3)
    r = simulate(lat, acc, TGT, DRF, Split.shared(2), Mode.serial, pol, WL)
    sel = set(ml_tree_paths(acc.draft_prob_by_rank, pol.bs, pol.w, pol.d))
    t_draft = step("drf", 2) + C["tree_growth"]["drf"]
    t_iter = C["host"]["serial"] + pol.d * t_draft + step("tgt", 2) + C["kv_compact"]["tgt"] + C["kv_compact"]["drf"]
    for path, (_, g) in zip(acc.request_paths(WL.requests, WL.max_new_tokens + 64, WL.seed), r.timeline.groupby("request")):
        pos, expect = 0, []
        while pos < WL.max_new_tokens:
            k = 0
            while tuple(int(x) for x in path[pos:pos + k + 1]) in sel:
                k += 1
            expect.append(k + 1)
            pos += k + 1
        assert g["accepted"].tolist() == expect
    # a request's tokens/s counts at most max_new_tokens (the runtime cuts the last verify's overshoot)
    rates = [1000.0 * min(g["accepted"].sum(), WL.max_new_tokens) / (len(g) * t_iter)
             for _, g in r.timeline.groupby("request")]
    assert r.summary.tokens_per_s_mean == pytest.approx(np.mean(rates), rel=1e-9)
    assert r.summary.tokens_per_s_p95 == pytest.approx(np.percentile(rates, 5), rel=1e-9)
    assert r.summary.tokens_per_s_p95 <= r.summary.tokens_per_s_p50


@pytest.mark.parametrize("scale", [1.0, 0.1])  # verify-bound, then draft-bound
def test_async_chain_always_right_closed_form(scale):
    """w=1, bs=4, d=2, draft always right: accepted = bs every iteration, and each steady
    iteration is max(d t_draft, t_verify + compaction + 2 links) + draft compaction + host + 2 t_draft
    (the tree is re-rooted 3 deep, keeps 2 nodes, and is grown back to bs at once)."""
    lat = LatencyModel(const_profile(scale_target=scale))
    pol = TreePolicy(bs=4, w=1, d=2)
    r = simulate(lat, always_right(), TGT, DRF, Split.disaggregated(2, 3), Mode.async_, pol,
                 Workload(prompt_len=200, max_new_tokens=80, requests=1))
    df = r.timeline
    assert (df["accepted"] == 4).all()
    t_d = step("drf", 2) + C["tree_growth"]["drf"]
    t_v = step("tgt", 3, scale) + C["kv_compact"]["tgt"]
    link = C["send_recv"]
    period = max(2 * t_d, t_v + 2 * link) + C["kv_compact"]["drf"] + C["host"]["async"] + 2 * t_d
    np.testing.assert_allclose(np.diff(df["target_start_ms"].to_numpy())[1:], period, rtol=1e-9)
    # draft and target overlap: the draft expands while the target verifies
    assert (df["draft_end_ms"] > df["target_start_ms"]).all()


def test_async_period_matches_formula_with_random_acceptance():
    """Every steady iteration: max(overlap expansions, link + verify + compaction + link) + draft
    compaction + host + immediate expansions of the next tree."""
    lat = LatencyModel(const_profile())
    acc = random_acceptance()
    pol = TreePolicy(bs=8, w=4, d=3)
    wl = Workload(prompt_len=200, max_new_tokens=120, requests=1, seed=3)
    r = simulate(lat, acc, TGT, DRF, Split.disaggregated(1, 3), Mode.async_, pol, wl)
    traj = make_trajectories(acc, Mode.async_, pol, wl)[0]
    t_d = step("drf", 1) + C["tree_growth"]["drf"]
    t_v = step("tgt", 3) + C["kv_compact"]["tgt"]
    starts = r.timeline["target_start_ms"].to_numpy()
    assert len(starts) == len(traj)
    assert any(len(t.pre) for t in traj[1:]) and any(t.kept == 0 for t in traj)  # both paths exercised
    for i in range(len(traj) - 1):
        expect = (max(len(traj[i].overlap) * t_d, t_v + 2 * C["send_recv"])
                  + C["kv_compact"]["drf"] + C["host"]["async"] + len(traj[i + 1].pre) * t_d)
        assert starts[i + 1] - starts[i] == pytest.approx(expect, rel=1e-9)
    total = r.timeline["sync_end_ms"].iloc[-1]
    assert r.summary.tokens_per_s_mean == pytest.approx(1000.0 * r.timeline["accepted"].sum() / total, rel=1e-9)


def test_internode_link_and_tp_cost_more():
    lat = LatencyModel(const_profile())
    acc = random_acceptance()
    pol = TreePolicy(bs=8, w=4, d=3)
    same = simulate(lat, acc, TGT, DRF, Split.disaggregated(4, 4), Mode.async_, pol, WL, gpus_per_node=8)
    across = simulate(lat, acc, TGT, DRF, Split.disaggregated(4, 4), Mode.async_, pol, WL, gpus_per_node=4)
    spans = simulate(lat, acc, TGT, DRF, Split.disaggregated(2, 6), Mode.async_, pol, WL, gpus_per_node=4)
    assert across.summary.breakdown_ms["link"] == pytest.approx(
        same.summary.breakdown_ms["link"] * C["internode_send_recv"] / C["send_recv"], rel=1e-9)
    # target TP group over two nodes: one inter-node exchange per all-reduce (2 per layer)
    assert spans.summary.breakdown_ms["target_tp_comm"] == pytest.approx(
        (2 * TGT.num_layers + 1) * C["all_reduce"] + 2 * TGT.num_layers * C["internode_send_recv"], rel=1e-9)


def test_chrome_trace_and_busy_fractions():
    lat = LatencyModel(const_profile())
    r = simulate(lat, random_acceptance(), TGT, DRF, Split.disaggregated(1, 2), Mode.async_, TreePolicy(8, 4, 3), WL)
    tr = to_chrome_trace(r.timeline)
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == 3 * len(r.timeline)
    tgt = [e for e in xs if e["cat"] == "target"]
    assert sum(e["dur"] for e in tgt) / 1000 == pytest.approx(
        (r.timeline["target_end_ms"] - r.timeline["target_start_ms"]).sum())
    s = r.summary
    assert 0 < s.draft_busy <= 1 and 0 < s.target_busy <= 1
    p = s.to_prediction()
    assert p.tokens_per_s_mean == s.tokens_per_s_mean and p.mean_accepted == s.mean_accepted


# ---- rank tree ------------------------------------------------------------------------------


@pytest.mark.parametrize("bs,w,d", [(4, 2, 2), (8, 4, 3), (16, 8, 2), (8, 1, 7), (32, 4, 9)])
def test_fresh_tree_selection_matches_independent_enumeration(bs, w, d):
    q = [0.5, 0.2, 0.12, 0.08, 0.05, 0.03, 0.01, 0.01]
    tree = RankTree(np.log(q), w)
    forwarded = [tree.expand() for _ in range(d)]
    assert forwarded[0] == 1  # the first expansion forwards only the root
    sel = tree.select(bs)

    def rank_path(i):
        out = []
        while tree.parent[i] >= 0:
            out.append(tree.rank[i])
            i = tree.parent[i]
        return tuple(reversed(out))

    assert {rank_path(i) for i in sel} == set(ml_tree_paths(q, bs, w, d))
    assert 0 in sel and all(tree.parent[i] in sel for i in sel if i)  # connected, root included


def test_verify_and_reroot_brute_force():
    rng = np.random.default_rng(0)
    q = [0.4, 0.3, 0.2, 0.1]
    for _ in range(30):
        tree = RankTree(np.log(q), 3)
        for _ in range(int(rng.integers(1, 6))):
            tree.expand()
        sel = tree.select(int(rng.integers(2, 12)))
        path = rng.choice([-1, 0, 1, 2, 3], size=12, p=[0.1, 0.5, 0.2, 0.1, 0.1])

        def rp(i, t=tree):
            out = []
            while t.parent[i] >= 0:
                out.append(t.rank[i])
                i = t.parent[i]
            return tuple(reversed(out))

        paths_sel = {rp(i) for i in sel}
        last, k = tree.verify(sel, path, 0)
        kk = 0
        while tuple(int(x) for x in path[: kk + 1]) in paths_sel:
            kk += 1
        assert k == kk and rp(last) == tuple(int(x) for x in path[:k])
        before = {rp(i) for i in range(len(tree))}
        bonus = (*rp(last), int(path[k]))
        kept = tree.advance(last, int(path[k]))
        assert kept == (bonus in before)
        after = {rp(i) for i in range(len(tree))}
        if kept:
            assert after == {p[len(bonus):] for p in before if p[: len(bonus)] == bonus}
            assert tree.cum[0] == 0.0 and tree.depth[0] == 0
        else:
            assert after == {()}


def test_static_tree_and_trajectories():
    topo = (-1, 0, 0, 1, 1, 3)  # root; ranks 0,1; under rank 0: ranks 0,1; under (0,0): rank 0
    t = StaticRankTree(topo)
    assert t.forwards == [(1, 0), (1, 1), (1, 2)]  # levels 0, 1, 2 each forward one node with children
    path = np.array([0, 0, 0, 1, 0, 0, 1, 0])
    traj = request_trajectory(Mode.serial, TreePolicy(bs=6, w=1, d=0, kind="static", topology=topo), None, path, 6)
    # (0,0,0) accepted -> 3 followed? depth-3 node exists: follows 0,0,0 -> 4 tokens; then path[4:]=[0,0,1,0]
    assert [x.accepted for x in traj] == [4, 3]
    ar = request_trajectory(Mode.autoregressive, TreePolicy.autoregressive(), None, path, 5)
    assert len(ar) == 5 and all(x.accepted == 1 for x in ar)
    assert math.isclose(sum(x.accepted for x in traj), 7)
