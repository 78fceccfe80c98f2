import itertools
import math

import numpy as np
import pytest

from swiftspec.sim.acceptance import (
    TABLE7_ASYNC,
    TABLE7_SERIAL,
    AcceptanceModel,
    default_acceptance,
    fit_synthetic_to_accepted_length,
    follow,
    follow_children,
    ml_tree_paths,
    rank_children,
)
from swiftspec.spec import AcceptanceProfile, UserError

P = [0.55, 0.2, 0.1, 0.05]
Q = [0.5, 0.25, 0.15, 0.05]


def _model(**kw) -> AcceptanceModel:
    return AcceptanceModel(AcceptanceProfile(positional=P, draft_prob_by_rank=Q, meta={"source": "synthetic"}, **kw))


def _paths_of(topology):
    children = rank_children(topology)
    paths = {0: ()}
    for node in range(len(topology)):
        for r, c in enumerate(children[node]):
            if c >= 0:
                paths[int(c)] = (*paths[node], r)
    return {p for p in paths.values() if p}


def test_static_closed_forms_chain_and_star():
    m = _model()
    p0, p1, p2 = P[:3]
    assert m.expected_accepted_static((-1, 0, 1, 2)) == pytest.approx(1 + p0 + p0**2 + p0**3)
    assert m.expected_accepted_static((-1, 0, 0, 0)) == pytest.approx(1 + p0 + p1 + p2)
    # a node's 5th child has rank 4, past the vector: it never accepts
    assert m.expected_accepted_static((-1, 0, 0, 0, 0, 0)) == pytest.approx(1 + sum(P))
    assert m.expected_accepted_static((-1,)) == 1.0


@pytest.mark.parametrize("topology", [(-1, 0, 0, 1, 1, 2), (-1, 0, 1, 1, 0, 3, 3, 5)])
def test_static_expectation_matches_monte_carlo(topology):
    m = _model()
    paths = m.request_paths(n=20000, length=len(topology), seed=3)
    tree = _paths_of(topology)
    children = rank_children(topology)
    acc = np.array([follow(tree, path, 0) + 1 for path in paths])
    assert all(follow_children(children, path, 0) + 1 == a for path, a in zip(paths[:500], acc))
    stderr = acc.std() / math.sqrt(len(acc))
    assert abs(acc.mean() - m.expected_accepted_static(topology)) < 4 * stderr + 1e-3


def test_iid_paths_follow_positional():
    paths = np.concatenate(_model().request_paths(n=50, length=400, seed=1))
    freq = [(paths == k).mean() for k in range(len(P))]
    assert np.allclose(freq, P, atol=0.02)
    assert (paths == -1).mean() == pytest.approx(1 - sum(P), abs=0.02)


def test_follow_stops_at_miss_and_end():
    tree = {(0,), (0, 1), (1,)}
    path = np.array([0, 1, 0, -1, 1, 0])
    assert follow(tree, path, 0) == 2  # (0,), (0,1); then rank 0 under (0,1) is absent
    assert follow(tree, path, 3) == 0  # a miss accepts nothing
    assert follow(tree, path, 4) == 1  # (1,); then (1, 0) absent
    assert follow(tree, path, 5) == 1
    assert follow(tree, path, 6) == 0  # past the end


def test_trace_replay_returns_the_traces():
    traces = [[0, 1, -1, 0], [2, 0]]
    m = _model(traces=traces, trace_probs=[[0.5] * 4, [0.1, 0.6]], top_k=8)
    assert m.request_paths(1, 4, seed=0)[0].tolist() == traces[0]
    two = m.request_paths(3, 5, seed=0)
    assert two[0].tolist() == [0, 1, -1, 0, 2]  # continued by the next trace
    assert two[1].tolist() == [2, 0, 0, 1, -1]
    assert two[2].tolist() == [0, 1, -1, 0, 2]  # cycles over prompts
    assert [x.tolist() for x in m.request_paths(2, 4, seed=0)] == [x.tolist() for x in m.request_paths(2, 4, seed=9)]


def test_malformed_profiles_raise_user_error():
    with pytest.raises(UserError):
        AcceptanceModel(AcceptanceProfile(positional=[0.8, 0.5], draft_prob_by_rank=Q, meta={"source": "synthetic"}))
    with pytest.raises(UserError):
        AcceptanceModel(AcceptanceProfile(positional=P, draft_prob_by_rank=Q, meta={}))
    with pytest.raises(UserError):
        AcceptanceProfile.from_dict({"positional": "abc", "draft_prob_by_rank": Q, "meta": {"source": "synthetic"}})
    with pytest.raises(UserError):
        _model().child_logprobs(8)


def test_child_logprobs():
    assert np.allclose(_model().child_logprobs(3), np.log(Q[:3]))


def test_ml_tree_is_the_top_bs_rank_paths():
    bs, w = 8, 3
    got = ml_tree_paths(Q, bs, w, expansions=bs)
    assert len(got) == bs and got[0] == ()
    assert all(p[:-1] in got for p in got if p)  # connected: every parent is selected
    # with enough expansions the selection is the bs most likely rank paths overall
    every = [p for d in range(bs) for p in itertools.product(range(w), repeat=d)]
    lp = sorted((sum(math.log(Q[r]) for r in p) for p in every), reverse=True)[:bs]
    got_lp = sorted((sum(math.log(Q[r]) for r in p) for p in got), reverse=True)
    assert np.allclose(got_lp, lp)
    # one expansion forwards only the root: its w children
    assert sorted(ml_tree_paths(Q, 10, w, expansions=1)) == [(), (0,), (1,), (2,)]
    # depth limit
    assert max(len(p) for p in ml_tree_paths(Q, 8, 2, expansions=8, max_depth=1)) == 1


def test_fit_reaches_target_and_rejects_unreachable():
    prof = fit_synthetic_to_accepted_length(2.5, bs=4, w=4)
    assert AcceptanceModel(prof).expected_accepted_dynamic(4, 4, 4) == pytest.approx(2.5, abs=1e-9)
    assert prof.synthetic and sum(prof.positional) <= 1
    with pytest.raises(UserError):
        fit_synthetic_to_accepted_length(7.0, bs=4, w=4)


def test_default_profile_is_labelled_synthetic_and_fits_table7():
    prof, ref = default_acceptance()
    m = AcceptanceModel(prof)
    assert m.label == ref.label == "synthetic (qwen2-72b-table7)"
    assert ref.path == "builtin:qwen2-72b-table7" and len(ref.sha256) == 64
    serial = sum(TABLE7_SERIAL) / len(TABLE7_SERIAL)
    assert serial == pytest.approx(3.63, abs=0.005)
    assert sum(TABLE7_ASYNC) / len(TABLE7_ASYNC) == pytest.approx(3.34, abs=0.005)
    assert m.expected_accepted_dynamic(bs=8, w=8, expansions=8) == pytest.approx(serial, abs=1e-3)
    assert all(a > b for a, b in zip(m.positional, m.positional[1:]))
    assert m.draft_prob_by_rank[0] == pytest.approx(0.6)
