"""Faults end a run quickly and cleanly: a dead or hung worker stops every process, names the rank."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from swiftspec.runtime.engine import FAULT_ENV, Job, Task
from swiftspec.runtime.launch import RunFailed, launch
from swiftspec.spec import Mode, Plan, Split, TreePolicy


def _gone(pids):
    for pid in pids:
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return False
    return True


def test_killed_worker_fails_cleanly_via_cli(make_checkpoint, tmp_path):
    """`swiftspec run` with a target rank that exits mid-run: exit 1, a message naming the rank."""
    target = make_checkpoint("llama")
    Plan(target=str(target), draft=str(target), split=Split.disaggregated(1, 1), mode=Mode.async_,
         policy=TreePolicy(bs=4, w=2, d=1), device="cpu").save(tmp_path / "plan.json")
    env = {**os.environ, FAULT_ENV: "1:3:exit"}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "swiftspec", "run", "--plan", str(tmp_path / "plan.json"),
                           "--num-prompts", "2", "--max-new-tokens", "8", "--modes", "async", "--timeout", "20",
                           "-o", str(tmp_path / "log")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert time.monotonic() - t0 < 60
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: run failed: rank 1 (target group, TP rank 0 of 1) exited with code 17"), line
    pids = [int(x) for x in line.split("pids ")[1].rstrip(")").split(", ")]
    assert len(pids) == 2 and _gone(pids)
    assert not (tmp_path / "log").exists()  # nothing half-written


def test_hung_worker_is_stopped_within_timeout(make_checkpoint):
    target = make_checkpoint("llama")
    job = Job(target=str(target), draft=str(target), split=Split.disaggregated(1, 1),
              tasks=[Task(Mode.async_, TreePolicy(bs=4, w=2, d=1))], prompts=[[1, 2, 3]], max_new_tokens=30,
              timeout_s=4)
    seen = []
    os.environ[FAULT_ENV] = "1:2:hang"  # rank 1 blocks SIGTERM and sleeps: only SIGKILL ends it
    try:
        t0 = time.monotonic()
        with pytest.raises(RunFailed) as err:
            launch(job, on_start=seen.extend)
        took = time.monotonic() - t0
    finally:
        del os.environ[FAULT_ENV]
    assert took < 40, took
    assert "stopped all 2 workers" in str(err.value)
    assert seen and _gone(seen)


def test_plan_weight_format_follows_the_plans_profile(tmp_path):
    """`swiftspec run` runs the models in the weight format the plan was predicted for: fp8 for a
    plan made on the bundled fp8 profile, native for the bf16 one, for none, and for a profile
    that is not on this machine."""
    from swiftspec.runtime.launch import plan_weight_format
    from swiftspec.spec import SourceRef

    def plan(path):
        ref = None if path is None else SourceRef(path=path, sha256="", label="")
        return Plan(target="Llama-3-70B", draft="Llama-3.2-3B", split=Split.disaggregated(4, 4), mode=Mode.async_,
                    policy=TreePolicy(bs=16, w=8, d=6), profile=ref)

    assert plan_weight_format(plan("builtin:h200-fp8")) == "fp8"
    assert plan_weight_format(plan("builtin:h200-measured")) == "native"
    assert plan_weight_format(plan(None)) == "native"
    assert plan_weight_format(plan(str(tmp_path / "gone"))) == "native"


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--temperature", "0.7", "--weights", "random"], "--temperature needs measured acceptance"),
    (["--temperature", "0.7", "--sample-top-p", "0"], "--sample-top-p must be in (0, 1]"),
])  # fmt: skip
def test_run_refuses_bad_sampling_before_starting(make_checkpoint, tmp_path, monkeypatch, capsys, args, needle):
    """`swiftspec run --temperature`: a bad value, or sampling with synthetic acceptance (whose rank
    paths choose the tokens), is one line and exit 2 before any worker starts or any file is written."""
    from swiftspec.cli import main

    target = make_checkpoint("llama")
    Plan(target=str(target), draft=str(target), split=Split.disaggregated(1, 1), mode=Mode.async_,
         policy=TreePolicy(bs=4, w=2, d=1), device="cpu").save(tmp_path / "plan.json")
    monkeypatch.setattr(sys, "argv", ["swiftspec", "run", "--plan", str(tmp_path / "plan.json"), *args,
                                      "-o", str(tmp_path / "log")])  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not (tmp_path / "log").exists()


def test_run_refuses_truncated_checkpoint_before_starting(make_checkpoint, tmp_path, monkeypatch, capsys):
    """`run --weights checkpoint` with a truncated safetensors file: one line naming the file and
    exit 2, before any worker starts (no "worker processes started" line) or any file is written."""
    from swiftspec.cli import main

    draft = tmp_path / "draft"
    shutil.copytree(make_checkpoint("llama"), draft)
    data = (draft / "model.safetensors").read_bytes()
    (draft / "model.safetensors").write_bytes(data[: len(data) - 100])
    Plan(target=str(make_checkpoint("llama")), draft=str(draft), split=Split.disaggregated(1, 1),
         mode=Mode.async_, policy=TreePolicy(bs=4, w=2, d=1), device="cpu").save(tmp_path / "plan.json")
    monkeypatch.setattr(sys, "argv", ["swiftspec", "run", "--plan", str(tmp_path / "plan.json"), "--weights",
                                      "checkpoint", "-o", str(tmp_path / "log")])  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1, err
    assert lines[0].startswith(f"error: checkpoint file {draft / 'model.safetensors'} "), lines
    assert "re-download" in lines[0]
    assert not (tmp_path / "log").exists()
