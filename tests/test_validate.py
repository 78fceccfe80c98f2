"""`swiftspec validate`: report schema, predictions recorded for the run's own workload, host terms.

Runs the real sweep on CPU with tiny checkpoints and a small hand-made profile (constant per
token, so the prediction is easy to check by hand), a few configurations, few tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from swiftspec.sim.acceptance import AcceptanceModel, default_acceptance
from swiftspec.sim.latency import LatencyModel
from swiftspec.spec import Mode, ModelSpec, Profile, UserError
from swiftspec.validate import (
    HOST_CAL,
    REPORT_COLUMNS,
    SweepOptions,
    _fit_line,
    calibrate_host,
    format_report,
    read_sweep,
    repredict,
    stand_in_config,
    validate,
    with_host_rows,
)

TOKENS = (1, 2, 4, 8, 16, 32, 64)


def _profile(names: list[str], folder, **meta) -> str:
    rows = []
    for name, ms in zip(names, (2.0, 0.5)):
        for t in TOKENS:
            for kv in (16, 4096):
                rows.append(("layers", name, 1, t, kv, ms + 0.01 * t))
            rows += [("embed", name, 1, t, 0, 0.01), ("lm_head", name, 1, t, 0, 0.1),
                     ("tree_growth", name, 1, t, 0, 0.02)]
        rows += [("kv_compact", name, 1, t, 0, 0.005) for t in (1, 1024)]
    rows += [("host", m, 1, 0, 0, 0.3) for m in ("autoregressive", "chain", "serial", "async")]
    compute = pd.DataFrame(rows, columns=["op", "model", "tp", "tokens", "kv_len", "ms"])
    prof = Profile(compute, pd.DataFrame(columns=["collective", "group_size", "bytes", "ms"]),
                   {"source": "measured", "device": "cpu", "gpu": "cpu", "date": "2026-12-02", **meta})
    prof.save(folder)
    return str(folder)


def _pair(make_checkpoint, tmp_path):
    """A tiny target (2 layers), a draft (1 layer) and a hand-made profile of both."""
    target = make_checkpoint("llama", num_hidden_layers=2, seed=3)
    draft = make_checkpoint("llama", num_hidden_layers=1, seed=9, weight_std=0.02)
    return target, draft, _profile([target.name, draft.name], tmp_path / "prof")


def test_validate_report_schema(make_checkpoint, tmp_path):
    target, draft, prof = _pair(make_checkpoint, tmp_path)
    rep = validate(SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint",
                   configs=4, prompts=2, max_new_tokens=10), profile=prof, calibrate=False)
    rows = rep.rows
    assert list(rows.columns) == list(REPORT_COLUMNS)
    assert len(rows) == 4 and rows["mode"].tolist()[:2] == ["autoregressive", "chain"]
    # same rank paths in the prediction and the run: accepted lengths agree exactly
    assert np.allclose(rows["predicted_accepted"], rows["measured_accepted"])
    assert (rows["measured_accepted"] > 1).sum() >= 2
    err = 100 * (rows["measured_tokens_per_s"] - rows["predicted_tokens_per_s"]) / rows["predicted_tokens_per_s"]
    assert np.allclose(rows["error_pct"], err)
    assert rep.summary["median_abs_error_pct"] == pytest.approx(err.abs().median())
    assert rep.summary["max_abs_error_pct"] == pytest.approx(err.abs().max())
    # autoregressive by hand: embed + layers + lm_head of 1 token + host (its KV is already in place)
    ar = rows.iloc[0]
    assert ar["predicted_iteration_ms"] == pytest.approx(0.01 + 2.01 + 0.1 + 0.3, rel=1e-9)
    m = rep.meta
    for key in ("date", "command", "torch", "profile_label", "acceptance_label", "weights"):
        assert key in m
    assert m["acceptance_label"].startswith("synthetic")
    out = rep.write(tmp_path / "report")
    assert list(pd.read_csv(out / "report.csv").columns) == list(REPORT_COLUMNS)
    doc = json.loads((out / "report.json").read_text())
    assert set(doc) == {"meta", "summary", "rows"} and len(doc["rows"]) == 4


def test_device_loop_sweep_measures_the_same_acceptance(make_checkpoint, tmp_path):
    """`loop="device"`: the same configurations replay the same rank paths through the device loop,
    so the measured accepted lengths equal the predicted ones, and the report says which loop ran."""
    target, draft, prof = _pair(make_checkpoint, tmp_path)
    rep = validate(SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint",
                   configs=7, prompts=2, max_new_tokens=10, loop="device"), profile=prof, calibrate=False)
    assert validate(SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint", configs=1,
                                 prompts=1, max_new_tokens=4), profile=prof, calibrate=False).meta["loop"] == "host"
    rows = rep.rows
    assert np.allclose(rows["predicted_accepted"], rows["measured_accepted"])
    assert (rows["measured_accepted"] > 1).sum() >= 4 and rep.meta["loop"] == "device"
    assert (rows["measured_forward_ms"] > 0).all()


def test_device_loop_time_is_its_graphs_on_cuda_and_its_phases_elsewhere():
    """`GenerateResult.loop_device_ms`, what validate and the profiler subtract from a device-loop
    decode's wall time: the graphs' device time where they replayed, else the phases' wall time."""
    from swiftspec.runtime.generate import GenerateResult, IterationRecord

    recs = [IterationRecord(accepted=2, verified=4, tree_nodes=4, draft_forwards=2, draft_tokens=5,
                            draft_ms=1.5, verify_ms=2.0, commit_ms=0.25)] * 2
    res = GenerateResult(tokens=[1, 2, 3, 4], text=None, tokens_per_s=1.0, mean_accepted=2.0, iterations=2,
                         weights="random", mode="serial", policy="bs4-w2-d2", prompt_len=3, prefill_ms=0.0,
                         decode_s=0.01, stop="max_new_tokens", records=recs, loop="device")
    assert res.loop_device_ms() == 7.0  # CPU: draft + verify phases, commit is host work
    assert replace(res, device_ms=5.5).loop_device_ms() == 5.5

def test_passes_give_the_median_of_each_configuration(make_checkpoint, tmp_path, monkeypatch):
    """passes=3: every configuration runs once per pass; its measured numbers are the medians over
    passes (a slow pass does not decide it), `passes` and `measured_spread_pct` say how steady it was,
    and a configuration that fails in any pass is reported as failed (NaN), not half-measured."""
    import swiftspec.validate as validate_mod

    target, draft, prof = _pair(make_checkpoint, tmp_path)
    sweep = SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint", configs=2,
                         prompts=1, max_new_tokens=6)
    kw = dict(profile=prof, calibrate=False)
    rep = validate(replace(sweep, passes=2), **kw)
    assert (rep.rows["passes"] == 2).all() and (rep.rows["measured_spread_pct"] >= 0).all()
    assert rep.meta["passes"] == 2 and "median of 2 passes" in format_report(rep)
    with pytest.raises(UserError, match="--passes"):
        validate(replace(sweep, passes=0), **kw)

    script = iter([100.0, 40.0, 50.0, RuntimeError("boom"), 102.0])  # pass 1: c1, c2; pass 2: c1, c2; pass 3: c1

    def fake(c, *a, **k):
        v = next(script)
        if isinstance(v, Exception):
            raise v
        return {"tokens_per_s": v, "accepted": 1.0, "iteration_ms": 1e3 / v, "forward_ms": 1.0, "host_ms": 0.1}

    monkeypatch.setattr(validate_mod, "_measure", fake)
    rows = validate(replace(sweep, passes=3), **kw).rows
    assert rows["measured_tokens_per_s"].iloc[0] == 100.0 and rows["passes"].iloc[0] == 3
    assert rows["measured_spread_pct"].iloc[0] == pytest.approx(52.0)
    assert rows["measured_iteration_ms"].iloc[0] == pytest.approx(10.0)
    assert np.isnan(rows["measured_tokens_per_s"].iloc[1]) and rows["passes"].iloc[1] == 0


def test_calibrate_host_rows_feed_the_latency_model(make_checkpoint, tmp_path):
    acc, _ = default_acceptance()
    rows, fit = calibrate_host("cpu", acc, prompts=1, new_tokens=8, modes=(Mode.autoregressive, Mode.serial))
    assert fit["samples"] == len(HOST_CAL[Mode.autoregressive]) + len(HOST_CAL[Mode.serial]) == 1 + 5  # a decode each
    assert min(fit["per_forward"], fit["per_token"], fit["per_node"], *fit["base"].values()) >= 0
    assert sum(fit["base"].values()) + fit["per_forward"] + fit["per_token"] > 0
    target = make_checkpoint("llama", num_hidden_layers=2, seed=3)
    prof = with_host_rows(Profile.load(_profile([target.name], tmp_path / "p")), rows)
    lat = LatencyModel(prof)
    assert lat.host_ms(Mode.serial) == pytest.approx(fit["base"]["serial"])
    assert lat.host_expansion_ms(Mode.serial, 4) == pytest.approx(fit["per_forward"] + 4 * fit["per_token"])
    assert lat.host_verify_ms(Mode.serial, 8) == pytest.approx(8 * fit["per_node"])
    assert lat.host_ms(Mode.chain) == 0.3  # not calibrated: the profile's row stays
    assert lat.host_expansion_ms(Mode.chain, 4) == 0.0
    AcceptanceModel(acc)


def test_profile_measured_with_other_kernels_is_flagged(make_checkpoint, tmp_path):
    """A profile whose meta.json records other kernels than the runtime's defaults (here: Triton
    attention with the in-kernel combine, on a CPU run that uses torch attention) gets a warning
    in the log, the report's meta and its printed table; matching or unrecorded settings do not."""
    from swiftspec.runtime.kernel_config import kernel_mismatch, profile_settings

    target = make_checkpoint("llama", num_hidden_layers=2, seed=3)
    draft = make_checkpoint("llama", num_hidden_layers=1, seed=9, weight_std=0.02)
    names = [target.name, draft.name]
    assert kernel_mismatch({"source": "measured"}, "cpu") == []
    assert kernel_mismatch(profile_settings("cuda"), "cuda") == []
    assert kernel_mismatch({"attention_combine": "kernel", "pdl": "late"}, "cuda") == [
        "attention_combine: profile kernel, runtime separate"]
    prof = _profile(names, tmp_path / "prof", attention="triton", attention_combine="kernel", linear="torch")
    said = []
    rep = validate(SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint",
                   configs=1, prompts=1, max_new_tokens=4), profile=prof, calibrate=False, log=said.append)
    want = ["attention: profile triton, runtime torch", "attention_combine: profile kernel, runtime -"]
    assert rep.meta["profile_kernel_mismatch"] == want
    assert any(line.startswith("warning: the profile's kernels differ") for line in said)
    assert f"profile kernels differ from the runtime's: {'; '.join(want)}" in format_report(rep)


def test_validate_cli_needs_pairs_on_cpu():
    proc = subprocess.run([sys.executable, "-m", "swiftspec", "validate", "--device", "cpu"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "error: " in proc.stderr and "--pairs" in proc.stderr


def test_measured_cuda_profile_times_forwards_at_their_graph_bucket(tmp_path):
    """The runtime replays the smallest CUDA-graph bucket >= T tokens: 3 tokens cost what 4 cost."""
    folder = _profile(["m"], tmp_path / "p")
    prof = Profile.load(folder)
    spec = type("S", (), {"name": "m", "hidden": 64, "num_layers": 2, "dtype_bytes": 2})()
    cpu = LatencyModel(prof)
    cuda = LatencyModel(Profile(prof.compute, prof.comm, {**prof.meta, "device": "cuda"}))
    assert cpu.forward_ms(spec, 1, 3, 100) == pytest.approx((cpu.forward_ms(spec, 1, 2, 100) + cpu.forward_ms(spec, 1, 4, 100)) / 2)
    assert cuda.forward_ms(spec, 1, 3, 100) == cuda.forward_ms(spec, 1, 4, 100) > cuda.forward_ms(spec, 1, 2, 100)
    assert cuda.forward_ms(spec, 1, 5, 100) == cuda.forward_ms(spec, 1, 8, 100)


def test_stand_in_keeps_vocab_and_layers_of_the_model():
    spec = ModelSpec.from_config("Llama-3-8B")
    cfg = stand_in_config(spec)
    assert (cfg["vocab_size"], cfg["num_hidden_layers"]) == (spec.vocab, spec.num_layers) == (128256, 32)
    assert cfg["hidden_size"] == 64 and cfg["intermediate_size"] == 128  # narrow: device time ~ launches
    assert (stand_in_config(None)["vocab_size"], stand_in_config(None)["num_hidden_layers"]) == (256, 2)


def test_host_calibration_grows_with_the_vocabulary(make_checkpoint):
    """The eager work per verify (logits copy out of the forward, argmax over the vocabulary) is
    host work: a stand-in with a real-size vocabulary measures more host time per iteration than
    one with 256 tokens (CPU: argmax + copy of one 131,072-wide row is ~0.2 ms)."""
    acc, _ = default_acceptance()
    per_iteration = {}
    for vocab in (256, 131072):
        spec = ModelSpec.from_config(make_checkpoint("llama", vocab_size=vocab))
        rows, fit = calibrate_host("cpu", acc, prompts=2, new_tokens=24, modes=(Mode.autoregressive,),
                                   target=spec, draft=spec)
        assert fit["stand_in"]["vocab"] == vocab and fit["stand_in"]["target_layers"] == 2
        per_iteration[vocab] = fit["base"]["autoregressive"] + fit["per_node"]
    assert per_iteration[131072] > per_iteration[256] + 0.05


def test_calibration_subtracts_the_profiled_tree_growth(make_checkpoint):
    """The simulator adds the profile's `tree_growth` to every expansion itself: the calibration takes
    it out of the host it measures (a 50 ms growth per forward would make host negative; the
    non-negative fit then leaves nothing per draft forward or token)."""
    acc, _ = default_acceptance()
    spec = ModelSpec.from_config(make_checkpoint("llama"))
    _, fit = calibrate_host("cpu", acc, prompts=1, new_tokens=12, modes=(Mode.chain,), target=spec, draft=spec,
                            tree_growth_ms=lambda t: 50.0)
    assert fit["per_forward"] == 0.0 and fit["per_token"] == 0.0
    assert fit["stand_in"]["tree_growth_subtracted"]


def test_validate_calibrates_host_per_pair(make_checkpoint, tmp_path):
    target, draft, prof = _pair(make_checkpoint, tmp_path)
    rep = validate(SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint",
                   configs=2, prompts=1, max_new_tokens=6), profile=prof, calibrate=True)
    key = f"{target.name}+{draft.name}"
    fit = rep.meta["host_calibration"][key]
    assert (fit["stand_in"]["target_layers"], fit["stand_in"]["draft_layers"]) == (2, 1)
    assert {r["pair"] for r in rep.meta["host_rows"]} == {key}
    ar = rep.rows.iloc[0]  # autoregressive: base + one verified node per iteration, from this pair's fit
    assert ar["predicted_host_ms"] == pytest.approx(fit["base"]["autoregressive"] + fit["per_node"], rel=1e-9)


def test_repredict_with_the_same_profile_reproduces_the_predictions(make_checkpoint, tmp_path):
    target, draft, prof = _pair(make_checkpoint, tmp_path)
    rep = validate(SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint",
                   configs=3, prompts=1, max_new_tokens=6), profile=prof, calibrate=True)
    rep.write(tmp_path / "run")
    again = repredict(tmp_path / "run", profile=prof)
    cols = ["config", "predicted_tokens_per_s", "predicted_iteration_ms", "predicted_host_ms", "measured_tokens_per_s"]
    pd.testing.assert_frame_equal(again.rows[cols], rep.rows[cols])
    assert "repredicted" in again.meta and "re-predicted" in format_report(again)
    # another profile (every layer 2x slower) changes the predictions, not the measurements
    slow = Profile.load(prof)
    slow.compute.loc[slow.compute["op"] == "layers", "ms"] *= 2
    slow.save(tmp_path / "slow")
    other = repredict(tmp_path / "run", profile=str(tmp_path / "slow"))
    assert (other.rows["predicted_tokens_per_s"] < rep.rows["predicted_tokens_per_s"]).all()
    assert np.allclose(other.rows["measured_tokens_per_s"], rep.rows["measured_tokens_per_s"], rtol=1e-12)


def test_read_sweep_parses_the_printed_log(make_checkpoint, tmp_path):
    target, draft, prof = _pair(make_checkpoint, tmp_path)
    rep = validate(SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint",
                   configs=3, prompts=2, max_new_tokens=6), profile=prof, calibrate=True)
    key, fit = next(iter(rep.meta["host_calibration"].items()))
    log = tmp_path / "validation.log"
    log.write_text(f"host fit {key}: {_fit_line(fit)}\n" + format_report(rep) + "\n")
    sweep = read_sweep(log)
    assert (sweep["prompts"], sweep["max_new_tokens"]) == (2, 6)
    assert sweep["fits"][key]["per_node"] == pytest.approx(fit["per_node"], abs=1e-4)
    assert sweep["fits"][key]["base"]["serial"] == pytest.approx(fit["base"]["serial"], abs=1e-4)
    assert list(sweep["measured"]) == rep.rows["config"].tolist()
    for r in rep.rows.itertuples():
        got = sweep["measured"][r.config]
        assert got["tokens_per_s"] == pytest.approx(r.measured_tokens_per_s, abs=0.051)
        assert got["iteration_ms"] == pytest.approx(r.measured_iteration_ms, abs=0.0051)
    with pytest.raises(UserError, match="not a validation report"):
        (tmp_path / "other.log").write_text("hello\n")
        read_sweep(tmp_path / "other.log")


@pytest.mark.gpu
def test_replay_ms_times_every_graph_bucket():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from swiftspec.runtime.decoder import ModelRunner
    from swiftspec.validate import ForwardClock, _stand_in_model, replay_ms

    runner = ModelRunner(_stand_in_model(None, "cuda"), 64)
    table = replay_ms(runner)
    assert set(table) == set(runner.graphs.graphs) and all(ms > 0 for ms in table.values())
    clock = ForwardClock([runner], fixed_ms={id(runner): table})
    runner.prefill([1, 2, 3])  # 3 tokens: bucket 4
    assert clock.take() == pytest.approx(table[4])


@pytest.mark.gpu
def test_device_loop_host_calibration_is_what_the_host_adds():
    """On CUDA the device loop's calibrated host work per iteration is the time between its graphs:
    above zero (launches, the token copy) and far below an iteration of the stand-in."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from swiftspec.validate import calibrate_host

    _, fit = calibrate_host("cuda", default_acceptance(), prompts=1, new_tokens=24, loop="device")
    assert fit["stand_in"]["device_time"] == "loop graphs"
    per = fit["per_forward"] + fit["per_token"] + fit["per_node"]  # an expansion of 1 token, a 1-node verify
    assert all(0.0 < base + per < 1.0 for base in fit["base"].values()), fit


def test_summary_splits_the_error_into_forwards_and_host():
    """The split errors, by hand: forwards 9.0 - 1.0 = 8 ms predicted vs 10 measured (20 %) and
    4.5 - 0.5 = 4 vs 4 (0 %); host 1.0 vs 0.5 (100 %) and 0.5 vs 1.0 (50 %)."""
    from swiftspec.validate import summarize

    rows = pd.DataFrame({"config": ["a", "b"], "error_pct": [-10.0, 4.0],
                         "predicted_iteration_ms": [9.0, 4.5], "predicted_host_ms": [1.0, 0.5],
                         "measured_forward_ms": [10.0, 4.0], "measured_host_ms": [0.5, 1.0]})  # fmt: skip
    s = summarize(rows)
    assert s["median_abs_error_pct"] == pytest.approx(7.0) and s["worst"] == "a"
    assert s["forward_median_abs_error_pct"] == pytest.approx(10.0)
    assert s["forward_max_abs_error_pct"] == pytest.approx(20.0)
    assert s["host_median_abs_error_pct"] == pytest.approx(75.0)
    assert s["host_max_abs_error_pct"] == pytest.approx(100.0)
    assert "forward_median_abs_error_pct" not in summarize(rows.drop(columns="measured_host_ms"))


@pytest.mark.parametrize("fmt", ["fp8", "int4"])
def test_quantized_profile_is_validated_on_quantized_models(make_checkpoint, tmp_path, fmt):
    """A profile measured with fp8 or int4 weights (meta weight_format) runs its configurations on
    such models: the log and the report say so, and the format is not flagged as a kernel mismatch."""
    target, draft, _ = _pair(make_checkpoint, tmp_path)
    prof = _profile([target.name, draft.name], tmp_path / f"{fmt}prof", weight_format=fmt)
    said = []
    rep = validate(SweepOptions(device="cpu", pairs=((str(target), str(draft)),), weights="checkpoint",
                   configs=2, prompts=1, max_new_tokens=4), profile=prof, calibrate=False, log=said.append)
    assert rep.meta["weight_format"] == fmt
    assert f"{fmt} weights" in rep.meta["profile_label"]
    assert not rep.meta.get("profile_kernel_mismatch")
    assert any(f"checkpoint weights, {fmt})" in line for line in said), said
    assert (rep.rows["measured_tokens_per_s"] > 0).all()


def test_validate_refuses_truncated_checkpoint_before_any_model(make_checkpoint, tmp_path, monkeypatch):
    """--weights checkpoint with a truncated file: one line naming it, before any model is built."""
    import shutil

    import swiftspec.validate as validate_mod

    target, draft, prof = _pair(make_checkpoint, tmp_path)
    broken = tmp_path / "broken"
    shutil.copytree(draft, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) - 100])
    monkeypatch.setattr(validate_mod, "load_model", lambda *a, **k: pytest.fail("a model was built"))
    with pytest.raises(UserError, match="checkpoint file .*broken/model.safetensors is not a readable"):
        validate(SweepOptions(device="cpu", pairs=((str(target), str(broken)),), weights="checkpoint",
                              configs=1, prompts=1, max_new_tokens=4), profile=prof, calibrate=False)


def test_validate_cli_progress_on_stderr(make_checkpoint, tmp_path, monkeypatch, capsys):
    """`swiftspec validate` prints each model loaded and each configuration measured on stderr;
    stdout holds the report alone."""
    from swiftspec.cli import main

    target, draft, prof = _pair(make_checkpoint, tmp_path)
    monkeypatch.setattr(sys, "argv", ["swiftspec", "validate", "--device", "cpu", "--profile", prof,
                                      "--pairs", f"{target}:{draft}", "--weights", "checkpoint", "--configs", "2",
                                      "--prompts", "1", "--max-new-tokens", "4", "--no-calibrate-host"])  # fmt: skip
    capsys.readouterr()
    main()
    out, err = capsys.readouterr()
    said = err.splitlines()
    assert any(x.startswith(f"loaded {target.name} (checkpoint weights) in ") for x in said), err
    configs = [x for x in said if x.startswith("[")]
    assert [x[:6] for x in configs] == ["[1/2] ", "[2/2] "], err
    assert all(" tok/s, accepted " in x for x in configs), err
    assert not any(x.startswith(("[", "loaded ")) for x in out.splitlines())
