"""The planner: enumeration, memory fit, ranking, pinning (constant-latency profile, tiny models)."""

from __future__ import annotations

import math

import pytest
from test_sim_engine import DRF, TGT, C, const_profile, random_acceptance, step

from swiftspec.sim.engine import Workload
from swiftspec.sim.latency import ExtrapolationError
from swiftspec.sim.memory import GIB, memory_use
from swiftspec.sim.search import Inputs, Planner, SearchSpace, predict_plan, search
from swiftspec.spec import AcceptanceProfile, Mode, ModelSpec, SourceRef, Split, TreePolicy, UserError

WL = Workload(prompt_len=200, max_new_tokens=40, requests=2, seed=0)


def inputs(memory_bytes: int = 10**12, profile=None) -> Inputs:
    acc = random_acceptance().profile
    return Inputs("tgt", "drf", TGT, DRF, profile or const_profile(memory_bytes=memory_bytes),
                  SourceRef("mem:const", "0", "derived"), acc, SourceRef("mem:acc", "0", acc.label))


def test_memory_use_adds_weights_kv_and_workspace():
    t70 = ModelSpec.from_config("Llama-3-70B")
    d3 = ModelSpec.from_config("Llama-3.2-3B")
    u = memory_use(t70, None, Split.shared(1, with_draft=False), Mode.autoregressive, TreePolicy.autoregressive(),
                   4096, 141_000_000_000)
    assert u.weights == t70.weight_bytes(1) and u.kv == t70.kv_bytes_per_token(1) * 4097
    assert not u.fits  # 141.1 GB of bf16 weights alone exceed one 141 GB H200
    u2 = memory_use(t70, d3, Split.shared(2), Mode.serial, TreePolicy(8, 8, 2), 4096, 141_000_000_000)
    assert u2.weights == t70.weight_bytes(2) + d3.weight_bytes(2) and u2.fits
    ua = memory_use(t70, d3, Split.disaggregated(1, 2), Mode.async_, TreePolicy(8, 8, 4), 4096, 141_000_000_000)
    assert ua.weights == t70.weight_bytes(2)  # the fuller GPU is the target's
    assert ua.workspace >= 2 * GIB


def test_candidates_cover_splits_and_d_rule():
    space = SearchSpace(gpus=4, modes=(Mode.async_,), bs=8, w=4)
    pl = Planner(inputs(), space, WL)
    cands, dropped = pl.candidates()
    assert dropped == 0
    assert sorted({(c.split.draft_tp, c.split.target_tp) for c in cands}) == [(1, 3), (2, 2), (3, 1)]
    for c in cands:
        tv = step("tgt", c.split.target_tp)
        te = step("drf", c.split.draft_tp) + C["tree_growth"]["drf"]
        r = max(1, math.floor(tv / te))
        assert {x.policy.d for x in cands if x.split == c.split} == {r, r + 1}


def test_search_ranks_and_baselines():
    res = search(inputs(), SearchSpace(gpus=3, static_trees=True), WL, refine=4)
    t = res.table
    full = t[t["fidelity"] == "full"]
    assert list(full["tokens_per_s_mean"]) == sorted(full["tokens_per_s_mean"], reverse=True)
    assert set(t["mode"]) == {"autoregressive", "chain", "serial", "async"}
    assert (t["mode"] == "serial").sum() > 8 and any(k.startswith("static") for k in t["policy"])
    ar = full[full["mode"] == "autoregressive"].iloc[0]
    assert ar["tokens_per_s_mean"] == pytest.approx(1000 / (step("tgt", 3) + C["host"]["autoregressive"]))
    assert ar["speedup_vs_autoregressive"] == pytest.approx(1.0)
    best_serial = full[full["mode"] == "serial"]["tokens_per_s_mean"].max()
    assert t.iloc[0]["speedup_vs_serial"] == pytest.approx(t.iloc[0]["tokens_per_s_mean"] / best_serial)
    assert res.winner.prediction.tokens_per_s_mean == t.iloc[0]["tokens_per_s_mean"]
    # the plan re-predicts to the same number
    again = predict_plan(res.winner, inputs(), WL)
    assert again.summary.tokens_per_s_mean == pytest.approx(res.winner.prediction.tokens_per_s_mean)


def test_fully_pinned_is_one_prediction_and_memory_drops():
    res = search(inputs(), SearchSpace(gpus=4, modes=(Mode.async_,), draft_gpus=1, bs=8, w=4, d=3), WL)
    assert len(res.table) == 1 and res.considered == 1
    assert res.winner.split == Split.disaggregated(1, 3) and res.winner.policy == TreePolicy(8, 4, 3)
    # memory just above the target's weights + KV at TP 1: nothing fits on 1 GPU ... with a real model
    t70 = ModelSpec.from_config("Llama-3-70B")
    inp = inputs()
    inp.target, inp.draft = t70, ModelSpec.from_config("Llama-3.2-3B")
    pl = Planner(inp, SearchSpace(gpus=1, modes=(Mode.autoregressive,)), WL)
    pl.lat.memory_bytes = 141_000_000_000
    assert pl.candidates() == ([], 1)
    assert pl.smallest_gpus_that_fit() == 2


def test_missing_profile_rows_are_named():
    prof = const_profile()
    prof.compute = prof.compute[~((prof.compute["model"] == "drf") & (prof.compute["tp"] == 2))]
    with pytest.raises(ExtrapolationError, match="drf at tp 2"):
        search(inputs(profile=prof), SearchSpace(gpus=2, modes=(Mode.serial,), bs=4, w=2), WL)
    # in a wider search the configurations the profile cannot time are skipped, the rest ranked
    res = search(inputs(profile=prof), SearchSpace(gpus=2, bs=4, w=2), WL)
    assert set(res.table["mode"]) == {"autoregressive", "async"} and res.skipped_profile
    # where none is covered, the one line says what the profile has of each model
    prof.compute = prof.compute[prof.compute["model"] != "drf"]
    with pytest.raises(ExtrapolationError, match=r"none of the \d+ configurations on 2 GPU\(s\) is covered by the "
                                                 r"profile \(it has tgt at TP 1, 2(, \d+)* and no rows for drf\)"):
        search(inputs(profile=prof), SearchSpace(gpus=2, modes=(Mode.serial, Mode.async_), bs=4, w=2), WL)


def test_bad_space():
    with pytest.raises(UserError, match="at least 2 GPUs"):
        SearchSpace(gpus=1, modes=(Mode.async_,)).validate()
    with pytest.raises(UserError, match="--draft-gpus"):
        SearchSpace(gpus=4, draft_gpus=4).validate()
    bad = AcceptanceProfile(positional=[0.5], draft_prob_by_rank=[0.5, 0.3], meta={"source": "synthetic"})
    inp = inputs()
    inp.acceptance = bad
    with pytest.raises(UserError, match="w=4"):
        search(inp, SearchSpace(gpus=2, modes=(Mode.serial,), bs=8, w=4), WL)


def test_async_split_keeps_the_target_inside_one_node():
    from swiftspec.sim.search import _placed

    s = _placed(draft=1, target=8, per_node=8)  # 9 GPUs: draft-first would straddle nodes
    assert {g // 8 for g in s.target_gpus} == {0} and s.draft_gpus == (8,)
    s = _placed(draft=4, target=4, per_node=8)  # one node: unchanged, draft first
    assert s.draft_gpus == (0, 1, 2, 3)


def test_fp8_profile_makes_the_memory_fit_count_fp8_weights(tmp_path):
    """A profile of fp8 shards (meta.json weight_format fp8) gives fp8 specs to the plan, so a
    70B target that needs 2 GPUs in bf16 fits on one (the same profile copied, only the label
    and the format changed)."""
    import json
    import shutil
    from importlib import resources

    from swiftspec.sim.search import load_inputs

    src = resources.files("swiftspec") / "data" / "profiles" / "h200-measured"
    shutil.copytree(str(src), tmp_path / "p")
    meta = json.loads((tmp_path / "p" / "meta.json").read_text())
    (tmp_path / "p" / "meta.json").write_text(json.dumps({**meta, "weight_format": "fp8"}))
    native = load_inputs(profile=str(src))
    fp8 = load_inputs(profile=str(tmp_path / "p"))
    assert native.target.weight_format == "native" and fp8.target.weight_format == fp8.draft.weight_format == "fp8"
    assert "fp8 weights" in fp8.profile_ref.label
    auto = TreePolicy.autoregressive()
    one = Split(target_gpus=(0,))
    fits = [memory_use(i.target, None, one, Mode.autoregressive, auto, 2048, 141 * 10**9).fits for i in (native, fp8)]
    assert fits == [False, True]


def test_bundled_fp8_profile_by_builtin_name(tmp_path):
    """`--profile builtin:h200-fp8` reads the bundled fp8 profile (70B, 8B, 3B, 1B at TP 1-8,
    measured with fp8 weights): the plan's specs are fp8, the plan records the builtin name, and
    a plan made with it is simulated on it again, not on the default profile. An unknown builtin
    name is one UserError that lists the bundled ones."""
    from swiftspec.cli import _ref_path
    from swiftspec.sim.search import load_inputs
    from swiftspec.spec import Profile, UserError

    prof = Profile.load("builtin:h200-fp8")
    assert prof.meta["weight_format"] == "fp8" and prof.meta["source"] == "measured"
    layers = prof.compute[prof.compute.op == "layers"]
    assert {(m, tp) for m, tp in zip(layers.model, layers.tp)} >= {
        (m, tp) for m in ("Llama-3-70B", "Llama-3-8B", "Llama-3.2-3B", "Llama-3.2-1B") for tp in (1, 2, 4, 8)}
    inputs = load_inputs(target="Llama-3-70B", draft="Llama-3.2-3B", profile="builtin:h200-fp8")
    assert inputs.target.weight_format == inputs.draft.weight_format == "fp8"
    assert inputs.profile_ref.path == "builtin:h200-fp8" and "fp8 weights" in inputs.profile_ref.label
    assert _ref_path(inputs.profile_ref, builtin_ok=True) == "builtin:h200-fp8"
    assert _ref_path(inputs.profile_ref) is None
    with pytest.raises(UserError, match="builtin:h200-fp8.*builtin:h200-measured|builtin:h200-derived.*builtin:h200-fp8"):
        Profile.load("builtin:h200-int4")
