"""`swiftspec validate`: report schema, predictions recorded for the run's own workload, host terms.

Runs the real sweep on CPU with tiny checkpoints and a small hand-made profile (constant per
token, so the prediction is easy to check by hand), a few configurations, few tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from swiftspec.sim.acceptance import AcceptanceModel, default_acceptance
from swiftspec.sim.latency import LatencyModel
from swiftspec.spec import Mode, Profile
from swiftspec.validate import REPORT_COLUMNS, calibrate_host, validate, with_host_rows

TOKENS = (1, 2, 4, 8, 16, 32, 64)


def _profile(names: list[str], folder) -> str:
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
                   {"source": "measured", "device": "cpu", "gpu": "cpu", "date": "2026-12-02"})
    prof.save(folder)
    return str(folder)


def test_validate_report_schema(make_checkpoint, tmp_path):
    target = make_checkpoint("llama", num_hidden_layers=2, seed=3)
    draft = make_checkpoint("llama", num_hidden_layers=1, seed=9, weight_std=0.02)
    prof = _profile([target.name, draft.name], tmp_path / "prof")
    rep = validate(device="cpu", pairs=[(str(target), str(draft))], profile=prof, weights="checkpoint",
                   configs=4, prompts=2, max_new_tokens=10, calibrate=False)
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


def test_calibrate_host_rows_feed_the_latency_model(make_checkpoint, tmp_path):
    acc, _ = default_acceptance()
    rows, fit = calibrate_host("cpu", acc, prompts=1, new_tokens=8, modes=(Mode.autoregressive, Mode.serial))
    assert fit["samples"] == 1 + 4  # one decode per calibration policy
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
