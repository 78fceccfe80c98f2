"""From plan to run: any plan `plan` writes runs; memory is checked first; OOM kills and
predictions from another device, dtype or weight format are named as such."""

from __future__ import annotations

import json
import os
import signal

import pandas as pd
import pytest

from swiftspec.run import RunOptions, format_report, not_comparable, profile_conditions, run_plan
from swiftspec.runtime.engine import FAULT_ENV, Job, Task
from swiftspec.runtime.launch import (
    AVAILABLE_ENV,
    GIB,
    RunFailed,
    _exit_text,
    launch,
    memory_is_low,
    plan_tasks,
)
from swiftspec.runtime.runlog import RunLog
from swiftspec.spec import Mode, Plan, Profile, Split, TreePolicy, UserError
from swiftspec.validate import ValidationReport
from swiftspec.validate import format_report as validation_report

TOKENS = (1, 2, 4, 8, 16, 32, 64)


def _profile(folder, costs: dict[str, float], **meta) -> str:
    """A hand-made CPU profile: `layers` ms per model (plus 0.01 ms a token), small fixed pieces."""
    rows = []
    for name, ms in costs.items():
        for t in TOKENS:
            rows += [("layers", name, 1, t, kv, ms + 0.01 * t) for kv in (16, 4096)]
            rows += [("embed", name, 1, t, 0, 0.01), ("lm_head", name, 1, t, 0, 0.1),
                     ("tree_growth", name, 1, t, 0, 0.02)]
        rows += [("kv_compact", name, 1, t, 0, 0.005) for t in (1, 1024)]
    rows += [("host", m, 1, 0, 0, 0.3) for m in ("autoregressive", "chain", "serial", "async")]
    compute = pd.DataFrame(rows, columns=["op", "model", "tp", "tokens", "kv_len", "ms"])
    base = {"source": "measured", "device": "cpu", "gpu": "cpu", "dtype": "float32", "memory_bytes": 8 * GIB}
    Profile(compute, pd.DataFrame(columns=["collective", "group_size", "bytes", "ms"]), {**base, **meta}).save(folder)
    return str(folder)




@pytest.fixture
def pair(make_checkpoint):
    return make_checkpoint("llama", seed=3), make_checkpoint("llama", seed=9, weight_std=0.02)


def test_an_autoregressive_winner_runs_with_its_baselines(pair, tmp_path, swiftspec_cli):
    """`plan --gpus 1` picks autoregressive when the draft costs three times the target and drops
    the draft; `run --plan` then runs it, leaving out the serial baseline with one note."""
    target, draft = pair
    prof = _profile(tmp_path / "prof", {target.name: 1.0, draft.name: 3.0})
    code, out, err = swiftspec_cli("plan", "--gpus", 1, "--device", "cpu", "--target", target,
                          "--draft", draft, "--profile", prof, "--max-new-tokens", 16, "--prompt-len", 16,
                          "--requests", 2, "-o", tmp_path / "p.json")
    assert code == 0, err
    plan = Plan.load(tmp_path / "p.json")
    assert plan.mode is Mode.autoregressive and plan.draft is None
    log = run_plan(tmp_path / "p.json", RunOptions(num_prompts=1, max_new_tokens=4, timeout_s=60))
    assert list(log.summary()["task"]) == ["autoregressive"]
    text = format_report(log)
    assert "note: serial baseline skipped: the plan has no draft model" in text
    assert log.meta["comparable"] is True and "not comparable" not in text
    assert "%" in text.splitlines()[-1]  # the error is shown: same device, dtype and weight format
    assert f"predicted from: measured, cpu, ? ({prof})" in text  # a CPU run: the plan's profile


def test_run_with_the_device_loop_gives_the_host_loops_tokens(pair, tmp_path, swiftspec_cli):
    """`run --loop device`: the co-located tasks decode on the device loop, every prompt's tokens
    are the host loop's, and the run log says which loop ran; without --loop, the loop whose host
    work the plan's profile measured (meta.json `loop`) runs."""
    target, draft = pair
    prof = _profile(tmp_path / "prof", {target.name: 3.0, draft.name: 0.3}, loop="device")
    code, out, err = swiftspec_cli("plan", "--gpus", 1, "--device", "cpu", "--target", target,
                                   "--draft", draft, "--profile", prof, "--max-new-tokens", 16, "--prompt-len", 16,
                                   "--requests", 2, "-o", tmp_path / "p.json")  # fmt: skip
    assert code == 0, err
    assert Plan.load(tmp_path / "p.json").mode is not Mode.autoregressive
    logs = {loop or "device": run_plan(tmp_path / "p.json", RunOptions(num_prompts=2, max_new_tokens=8, timeout_s=60,
                                                                      loop=loop))
            for loop in ("host", None)}  # fmt: skip
    tokens = {loop: {(r["task"], r["prompt"]): r["tokens"] for r in log.prompts.to_dict(orient="records")}
              for loop, log in logs.items()}  # fmt: skip
    assert len(tokens["device"]) >= 4 and tokens["device"] == tokens["host"]
    assert logs["device"].meta["loop"] == "device" and logs["host"].meta["loop"] == "host"


def test_plan_tasks_of_old_and_draftless_plans():
    """A plan without a draft: only autoregressive, or a one-line error when a draft mode is asked
    for by name; an old autoregressive plan that kept its draft runs serial on the default tree."""
    bare = Plan(target="Llama-3.2-1B", draft=None, split=Split.shared(1, with_draft=False),
                mode=Mode.autoregressive, policy=TreePolicy.autoregressive(), device="cpu")
    tasks, notes = plan_tasks(bare, None)
    assert [t.mode for t in tasks] == [Mode.autoregressive] and len(notes) == 1
    with pytest.raises(UserError, match="serial mode needs a draft model but the plan has none"):
        plan_tasks(bare, ["serial"])
    kept = Plan.from_dict({**bare.to_dict(), "draft": "Llama-3.2-1B"})
    tasks, notes = plan_tasks(kept, None)
    assert [t.mode for t in tasks] == [Mode.autoregressive, Mode.serial] and notes == []
    assert tasks[1].policy == TreePolicy()


def test_run_refuses_what_does_not_fit_memory_before_starting(pair, tmp_path, monkeypatch, swiftspec_cli):
    """With 10 MiB available (the check reads SWIFTSPEC_AVAILABLE_GIB), run, generate and validate
    refuse in one line saying what is needed and what is free; no worker starts, nothing is written."""
    target, draft = pair
    Plan(target=str(target), draft=str(draft), split=Split.disaggregated(1, 1), mode=Mode.async_,
         policy=TreePolicy(bs=4, w=2, d=1), device="cpu").save(tmp_path / "plan.json")
    prof = _profile(tmp_path / "prof", {target.name: 1.0, draft.name: 0.5})
    monkeypatch.setenv(AVAILABLE_ENV, str(10 / 1024))
    started = []
    with pytest.raises(UserError, match=r"this run \(2 ranks\) needs ≈ 0\.\d\d GiB of host memory .* but 0\.01 GiB "
                                        r"is available"):
        run_plan(tmp_path / "plan.json", RunOptions(num_prompts=1, max_new_tokens=4), on_start=started.extend)
    assert started == []
    for args in (["run", "--plan", tmp_path / "plan.json", "-o", tmp_path / "log"],
                 ["generate", "--target", target, "--draft", draft, "--mode", "serial", "--prompt-ids", "1,2,3"],
                 ["validate", "--device", "cpu", "--pairs", f"{target}:{draft}", "--profile", prof,
                  "--configs", 2, "-o", tmp_path / "val"]):
        code, out, err = swiftspec_cli(*args)
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and "GiB is available" in lines[0], (args[0], err)
        assert lines[0].startswith("error: ") and "needs ≈" in lines[0]
    assert not (tmp_path / "log").exists() and not (tmp_path / "val").exists()


def test_a_worker_killed_while_memory_is_low_is_reported_as_out_of_memory(pair, monkeypatch):
    """SIGKILL + low available memory (the launcher's rule) reads as out of memory with the run's
    estimate; the rule itself: below 10 % of the total or 1 GiB."""
    target, _ = pair
    job = Job(target=str(target), draft=None, split=Split.shared(1, with_draft=False),
              tasks=[Task(Mode.autoregressive, TreePolicy.autoregressive())], prompts=[[1, 2, 3]], max_new_tokens=8,
              timeout_s=30, meta={"memory": {"needed": 3 * GIB, "available": 2 * GIB}})
    monkeypatch.setenv(FAULT_ENV, "0:1:kill")
    monkeypatch.setenv(AVAILABLE_ENV, "0.5")
    with pytest.raises(RunFailed) as err:
        launch(job)
    msg = str(err.value)
    assert "rank 0 (target group, TP rank 0 of 1) was killed (SIGKILL), most likely out of memory: needs ≈ 3.0 " \
           "GiB, 2.0 GiB available" in msg, msg
    assert memory_is_low(GIB // 2, 64 * GIB) and memory_is_low(5 * GIB, 64 * GIB)
    assert not memory_is_low(20 * GIB, 64 * GIB)
    assert _exit_text(-signal.SIGKILL, low_memory=False) == "was killed by SIGKILL"


def _runlog(meta: dict) -> RunLog:
    prompts = pd.DataFrame([{"task": "autoregressive", "mode": "autoregressive", "policy": "bs1-w1-d0", "prompt": 0,
                             "tokens": [1, 2], "generated": 2, "decode_s": 0.1, "tokens_per_s": 20.0,
                             "prefill_ms": 1.0, "iterations": 2, "mean_accepted": 1.0}])
    iters = pd.DataFrame([{"task": "autoregressive", "prompt": 0, "iteration": i, "accepted": 1} for i in range(2)])
    base = {"plan_path": "p.json", "plan": {"mode": "autoregressive", "split": {"draft_gpus": [], "target_gpus": [0]}},
            "colocated_ranks": 1, "device": "cpu", "dtype": "float32", "weights": "random",
            "acceptance": "synthetic (x)", "prompts": "builtin", "tokenized_with": "ids", "max_new_tokens": 2}
    return RunLog(iters, prompts, {**base, **meta}, {"autoregressive": {"tokens_per_s_mean": 5000.0}})


def test_predictions_from_another_device_are_labelled_not_compared(tmp_path):
    """An H200 bf16 profile against a CPU float32 run: the report says `not comparable: profile
    <...> vs run <...>` and prints no error percentage; summary.json keeps the numbers and the flag.
    The same for `validate`'s report."""
    label = not_comparable(profile_conditions({"device": "cuda", "gpu": "NVIDIA H200", "dtype": "bfloat16"}, "cuda"),
                           ("cpu", "float32", "native"))
    assert label == "not comparable: profile <NVIDIA H200, bfloat16, native> vs run <cpu, float32, native>"
    assert not_comparable(profile_conditions({"device": "cpu"}, "cpu"), ("cpu", "float32", "native")) is None
    f32 = not_comparable(profile_conditions({"device": "cpu", "dtype": "float32"}, "cpu"), ("cpu", "bfloat16", "native"))
    assert f32 == "not comparable: profile <cpu, float32, native> vs run <cpu, bfloat16, native>"

    log = _runlog({"comparable": False, "comparability": label})
    text = format_report(log)
    assert label in text and "%" not in text.split("pred. accepted")[-1] and " n/c " in text
    log.write(tmp_path / "log")
    doc = json.loads((tmp_path / "log" / "summary.json").read_text())
    assert doc["meta"]["comparable"] is False and doc["tasks"][0]["error_pct"] == pytest.approx(-99.6)
    assert "-99.6%" in format_report(_runlog({"comparable": True}))

    rows = pd.DataFrame([{"config": "t autoregressive", "predicted_tokens_per_s": 5000.0, "measured_tokens_per_s": 20.0,
                          "error_pct": -99.6, "predicted_accepted": 1.0, "measured_accepted": 1.0,
                          "predicted_iteration_ms": 0.2, "measured_iteration_ms": 50.0, "measured_forward_ms": 40.0,
                          "measured_host_ms": 10.0, "comparable": False}])
    rep = ValidationReport(rows, {"compared": 1, "median_abs_error_pct": 99.6, "max_abs_error_pct": 99.6,
                                  "worst": "t autoregressive", "goal": "g"},
                           {"profile": "p", "profile_label": "measured", "acceptance_label": "a", "weights": "random",
                            "device": "cpu", "prompts": 1, "tokenized_with": "ids", "max_new_tokens": 2,
                            "comparable": False, "comparability": label})
    text = validation_report(rep)
    assert label in text and "99.6" not in text and "%" not in text.replace("no error computed", "")


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="reads /proc/meminfo")
def test_host_memory_reads_the_machine_and_the_override(monkeypatch):
    from swiftspec.runtime.launch import host_memory

    avail, total = host_memory()
    assert 0 < avail <= total
    monkeypatch.setenv(AVAILABLE_ENV, "0.25")
    assert host_memory()[0] == GIB // 4
