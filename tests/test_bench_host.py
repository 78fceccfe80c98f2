"""benchmarks/bench_host.py end to end on CPU: both input paths decode the same tokens, and the
result file has one finite host time per (model, mode, variant)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_host  # noqa: E402


def test_bench_host_cpu_smoke(tmp_path):
    assert bench_host.main(["--device", "cpu", "--models", "Llama-3.2-1B", "--reps", "1", "--new-tokens", "3",
                            "--out", str(tmp_path), "--cprofile"]) == 0
    (csv,) = tmp_path.glob("bench_host-*[0-9].csv")
    df = pd.read_csv(csv)
    assert sorted(zip(df["mode"], df["variant"])) == sorted(
        (m, v) for m in bench_host.MODES for v in bench_host.VARIANTS)
    assert df.host_ms.notna().all() and (df.tokens_per_s > 0).all()
    # the two input paths run the same model on the same prompt: same iterations, same acceptance
    for _, g in df.groupby("mode"):
        assert g.iterations.nunique() == 1 and g.mean_accepted.nunique() == 1
    meta = json.loads(csv.with_suffix(".json").read_text())["metadata"]
    assert meta["weights"].startswith("random")
    # --cprofile: the host's hot spots per mode, the decode's own functions among them
    (prof,) = tmp_path.glob("bench_host-*-cprofile.csv")
    hot = pd.read_csv(prof)
    assert set(hot["mode"]) == set(bench_host.MODES) and (hot.tottime_us_per_iteration >= 0).all()
    assert hot.function.str.contains("linear").any()  # eager on CPU: the forwards' GEMMs dominate
