"""Plan -> `swiftspec run` -> RunLog round trip, with random weights and synthetic acceptance.

The acceptance profile carries explicit rank traces, so what each verify must accept is known: with
a static topology the simulator's own replay (`rank_tree.request_trajectory`) gives the exact
accepted length of every iteration, and the runtime must match it in `async` and `serial` alike.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd

from swiftspec.runtime.runlog import RunLog
from swiftspec.sim.acceptance import AcceptanceModel
from swiftspec.sim.rank_tree import request_trajectory
from swiftspec.spec import AcceptanceProfile, Mode, Plan, Prediction, Split, TreePolicy

TOPOLOGY = (-1, 0, 0, 1, 1, 2, 3, 3)  # root; 2 children; 2 + 1 grandchildren; 1 great-grandchild
TRACES = [[0, 0, 1, -1, 1, 0, 0, 0, 2, 0, 1, 1, 0, -1, 0, 0, 0, 0, 1, 0], [1, 0, -1, 0, 0, 0, 1, 1, 1, 0]]
MAX_NEW = 12


def test_plan_run_round_trip_with_synthetic_acceptance(make_checkpoint, tmp_path):
    target = make_checkpoint("llama", num_hidden_layers=2, seed=5)
    draft = make_checkpoint("llama", num_hidden_layers=1, seed=6)
    acc = AcceptanceProfile(positional=[0.5, 0.2, 0.1], draft_prob_by_rank=[0.6, 0.2, 0.1], traces=TRACES,
                            top_k=3, meta={"source": "synthetic", "name": "unit-traces"})
    acc.save(tmp_path / "acc.json")
    policy = TreePolicy(bs=len(TOPOLOGY), w=2, d=1, kind="static", topology=TOPOLOGY)
    Plan(target=str(target), draft=str(draft), split=Split.disaggregated(1, 1), mode=Mode.async_, policy=policy,
         device="cpu", prediction=Prediction(50.0, 50.0, 40.0, 2.5, 20.0)).save(tmp_path / "plan.json")
    out = tmp_path / "log"
    proc = subprocess.run(
        [sys.executable, "-m", "swiftspec", "run", "--plan", str(tmp_path / "plan.json"), "--weights", "random",
         "--acceptance", str(tmp_path / "acc.json"), "--num-prompts", "2", "--max-new-tokens", str(MAX_NEW),
         "--timeout", "60", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "acceptance: synthetic (unit-traces)" in proc.stdout
    assert "weights: random" in proc.stdout
    assert "async static-bs8" in proc.stdout and "autoregressive" in proc.stdout
    # progress on stderr: the workers started, each model built, then one line per prompt and task
    said = [x for x in proc.stderr.splitlines() if x.startswith("run: ")]
    done = [x for x in said if " done, " in x]
    tasks = ("async static-bs8", "serial static-bs8", "autoregressive")
    assert [x.split(" done,")[0] for x in done] == [f"run: {t} prompt {i}/2" for t in tasks for i in (1, 2)], said
    assert all(x.endswith(" tok/s") for x in done) and "run: " not in proc.stdout
    built = {x.split(" built on")[0] for x in said if " built on rank " in x}
    assert built == {f"run: target {target.name}", f"run: draft {draft.name}"}, said

    log = RunLog.load(out)
    it = pd.read_json(out / "iterations.jsonl", lines=True)  # loadable with plain pandas
    assert set(it["mode"]) == {"async", "serial", "autoregressive"}
    s = log.summary().set_index("mode")
    assert s.loc["async", "predicted_tokens_per_s"] == 50.0
    assert np.isclose(s.loc["async", "error_pct"], 100 * (s.loc["async", "tokens_per_s_mean"] - 50) / 50)

    for mode in ("async", "serial"):
        # request j replays trace j, continued by the next traces (AcceptanceModel.request_paths)
        for prompt, path in enumerate(AcceptanceModel(acc).request_paths(2, MAX_NEW + 64, 0)):
            rows = it[(it["mode"] == mode) & (it["prompt"] == prompt)].sort_values("iteration")
            want = [t.accepted for t in request_trajectory(Mode.serial, policy, np.zeros(2), path, MAX_NEW)]
            assert rows["accepted"].tolist() == want, (mode, prompt)
            consumed = [r for ranks in rows["ranks"] for r in ranks]  # followed ranks + bonus rank per verify
            assert consumed == path[: len(consumed)].tolist()
            assert [len(r) for r in rows["ranks"]] == want
    gen = log.prompts.groupby("mode")["generated"].min()
    assert (gen == MAX_NEW).all()


def test_run_with_temperature_through_the_cli(make_checkpoint, tmp_path):
    """`swiftspec run --temperature` with checkpoint weights: the report says it sampled, and every
    mode (async, serial, autoregressive) produced the same tokens per prompt, seeded alike."""
    target = make_checkpoint("llama", num_hidden_layers=2, seed=5)
    draft = make_checkpoint("llama", num_hidden_layers=1, seed=6)
    Plan(target=str(target), draft=str(draft), split=Split.disaggregated(1, 1), mode=Mode.async_,
         policy=TreePolicy(bs=6, w=2, d=2), device="cpu").save(tmp_path / "plan.json")
    out = tmp_path / "log"
    proc = subprocess.run(
        [sys.executable, "-m", "swiftspec", "run", "--plan", str(tmp_path / "plan.json"), "--num-prompts", "2",
         "--max-new-tokens", "10", "--temperature", "0.9", "--sample-seed", "7", "--timeout", "60", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "sampling: temperature 0.9, seed 7 + prompt index" in proc.stdout
    prompts = pd.read_json(out / "prompts.jsonl", lines=True)
    assert set(prompts["mode"]) == {"async", "serial", "autoregressive"}
    for _, g in prompts.groupby("prompt"):
        assert len({tuple(t) for t in g["tokens"]}) == 1, g[["mode", "tokens"]]
    assert RunLog.load(out).meta["temperature"] == 0.9
