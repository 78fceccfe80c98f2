"""`swiftspec study`: every figure renders on CPU from small inputs, with its axes and its command.

Simulated studies run the real planner on a few GPU counts / cells / budgets; the measured ones
read a 40 KB subset of an H200 run log (tests/data/runlog-h200-async-mini: prompt 0, iterations
0-14 of each task), benchmark results in tests/data and the results bundled in swiftspec/data/results.
"""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from swiftspec.sim.profile_default import bundled_profile_dir
from swiftspec.spec import UserError
from swiftspec.studies import (
    STUDIES,
    hardware,
    list_studies,
    run_study,
    speedup_vs_gpus,
    split_heatmap,
    timeline,
    tree_budget,
    validation,
)
from swiftspec.studies import kernels as kernels_study
from swiftspec.studies.simulated import load

DATA = Path(__file__).parent / "data"
RUNLOG = DATA / "runlog-h200-async-mini"
BUNDLED = Path(__file__).parents[1] / "swiftspec" / "data" / "results"
MEASURED_ACC = Path(__file__).parents[1] / "swiftspec" / "data" / "acceptance" / "smollm2-135m__int3g32.json"


def check_written(out, name: str, labels: list[tuple[str, str]]) -> None:
    """PNG and SVG exist and are non-empty; every (xlabel, ylabel) is on some axes and in the SVG text;
    the footer holds the regenerate command."""
    png, svg = out.paths
    assert png.name == f"{name}.png" and svg.name == f"{name}.svg"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    text = svg.read_text()
    assert text.lstrip().startswith("<?xml") and "</svg>" in text
    axes = {(x, y) for _, x, y in out.axes}
    for xl, yl in labels:
        assert (xl, yl) in axes, (xl, yl, axes)
        assert f"<!-- {xl} -->" in text and f"<!-- {yl} -->" in text  # matplotlib keeps text as comments
    assert out.command.startswith(f"swiftspec study {name}")
    assert out.command in text  # footer text (as a comment) and metadata
    assert not list(png.parent.glob(".*.tmp")) and not list(png.parent.glob(f".{name}*"))


# the derived profile: its 141 GB per GPU keeps a bf16 70B off one GPU, which these tests rely on
DERIVED = str(bundled_profile_dir())


@pytest.fixture(scope="module")
def sim_inputs():
    return load(DERIVED, None)


def test_list_names_every_study():
    names = [n for n, _ in list_studies()]
    assert names == list(STUDIES)
    assert {"validation", "speedup-vs-gpus", "split-heatmap", "hardware", "tree-budget", "timeline", "kernels"} <= set(names)
    assert all(d and "\n" not in d for _, d in list_studies())


def test_validation_from_report(tmp_path):
    report = pd.DataFrame({
        "config": ["a", "b", "c", "d"], "mode": ["async", "serial", "autoregressive", "async"],
        "policy": ["bs8-w8-d3", "bs8-w8-d4", "bs1-w1-d0", "bs16-w8-d4"], "pair": ["T + D"] * 4,
        "predicted_tokens_per_s": [100.0, 200.0, 50.0, 80.0],
        "measured_tokens_per_s": [102.0, 190.0, 55.0, 80.0],  # errors +2, -5, +10, 0 %
    })  # fmt: skip
    report.to_csv(tmp_path / "report.csv", index=False)
    out = validation.main([tmp_path / "report.csv"], tmp_path / "fig")
    check_written(out, "validation", [("predicted tokens/s (simulator)", "measured tokens/s (runtime)")])
    title = out.axes[0][0]
    assert "4 configurations" in title and "median |error| 3.5 %" in title and "max 10.0 %" in title
    assert "75% within ±8%" in title  # 3 of 4 within the band


def test_validation_from_committed_h200_report(tmp_path):
    """A `swiftspec validate` report of an H200: target/draft columns, autoregressive rows with no draft."""
    report = DATA / "validation-report-no-draft" / "report.csv"
    df = pd.read_csv(report)
    assert df["draft"].isna().any()  # what this test is about
    out = validation.main([report], tmp_path)
    assert f"{len(df)} configurations" in out.axes[0][0]


def test_validation_report_labels_its_weights(tmp_path):
    """A report whose report.json says random fp8 weights is labelled so in the figure's inputs
    line; one without a report.json is not labelled."""
    committed = DATA / "validation-report-random-fp8" / "report.csv"
    assert validation.read_report(committed)["source"].iloc[0] == "validation-report-random-fp8/report.csv (random weights, fp8)"
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "report.csv").write_text(committed.read_text())
    assert validation.read_report(bare / "report.csv")["source"].iloc[0] == "bare/report.csv"


def test_validation_default_is_the_newest_bundled_run(tmp_path):
    """Without -i the study reads the newest bundled report: the highest-numbered run (run12 after
    run9, not before it)."""
    report = (DATA / "validation-report-random-fp8" / "report.csv").read_text()
    for run in ("validation_run9", "validation_run12", "validation"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "report.csv").write_text(report)
    runs = [p.parent.name for p in tmp_path.glob("validation_run*/report.csv")]
    newest = max(runs, key=lambda r: int(r.rsplit("run", 1)[1]))
    assert newest != max(runs)  # string order would pick another run
    assert validation.newest_report(tmp_path) == tmp_path / newest / "report.csv"
    bundled = validation.newest_report(BUNDLED)
    assert bundled is not None and bundled.is_relative_to(BUNDLED)
    assert validation.load([])["source"].iloc[0].startswith(f"{bundled.parent.name}/report.csv")


def test_validation_from_runlog(tmp_path):
    out = validation.main([RUNLOG], tmp_path)
    summary = json.loads((RUNLOG / "summary.json").read_text())
    assert f"{len(summary['tasks'])} configurations" in out.axes[0][0]
    assert any("synthetic" in lbl for lbl in out.labels) and any("random" in lbl for lbl in out.labels)


def test_validation_bad_columns_is_one_line_user_error(tmp_path):
    pd.DataFrame({"config": ["a"], "predicted": [1.0], "measured": [2.0]}).to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(UserError, match="lacks columns predicted_tokens_per_s, measured_tokens_per_s"):
        validation.main([tmp_path / "r.csv"], tmp_path / "fig")
    assert not (tmp_path / "fig").exists() or not any((tmp_path / "fig").iterdir())  # nothing half-written
    proc = subprocess.run([sys.executable, "-m", "swiftspec", "study", "validation", "-i", str(tmp_path / "r.csv"),
                           "-o", str(tmp_path / "fig")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: validation report") and len(proc.stderr.strip().splitlines()) == 1


def test_speedup_vs_gpus(tmp_path, sim_inputs):
    table = speedup_vs_gpus.compute(sim_inputs, gpus=(1, 2, 3))
    one = table[table["gpus"] == 1]
    assert one["tokens_per_s"].isna().all()  # a 70B target does not fit one 141 GB GPU
    assert (one[one["mode"] != "async"]["reason"] == "does not fit GPU memory").all()
    ar = table[table["mode"] == "autoregressive"].set_index("gpus")["tokens_per_s"]
    assert ar[3] > ar[2] > 0  # more TP, faster steps
    spec = table[(table["gpus"] == 3) & (table["mode"] == "serial")]["tokens_per_s"].iloc[0]
    assert spec > ar[3]  # the synthetic acceptance (3.6 tokens per verify) pays for the draft
    out = speedup_vs_gpus.main([DERIVED], tmp_path, gpus=(1, 2, 3))
    check_written(out, "speedup-vs-gpus", [("GPUs", "tokens/s (simulated, best configuration)")])
    assert any("synthetic" in lbl for lbl in out.labels) and any("derived" in lbl for lbl in out.labels)
    assert any("not shown: autoregressive on 1 GPUs (does not fit GPU memory)" in n for n in out.notes)


def test_split_heatmap(tmp_path, sim_inputs):
    table = split_heatmap.compute(sim_inputs, max_group=2)
    assert len(table) == 4
    t1 = table[table["target_gpus"] == 1]
    assert t1["tokens_per_s"].isna().all() and (t1["reason"] == "does not fit GPU memory").all()
    assert table[table["target_gpus"] == 2]["tokens_per_s"].gt(0).all()
    out = split_heatmap.main([DERIVED], tmp_path, max_group=2)
    check_written(out, "split-heatmap", [("draft GPUs (draft TP degree)", "target GPUs (target TP degree)")])
    assert out.notes[0].startswith("best: draft ")


def test_tree_budget(tmp_path):
    out = tree_budget.main([MEASURED_ACC], tmp_path, budgets=(2, 8), gpus=4)
    check_written(out, "tree-budget", [("tree budget bs (nodes verified per step)", "mean accepted length (tokens per verify)"),
                                       ("tree budget bs (nodes verified per step)", "tokens/s (simulated, best configuration)")])
    assert any(lbl == "acceptance: measured" for lbl in out.labels)
    inp = load(None, str(MEASURED_ACC))
    table = tree_budget.compute(inp, budgets=(2, 8), gpus=4)
    serial = table[table["mode"] == "serial"].set_index("bs")["mean_accepted"]
    assert serial[8] > serial[2] >= 1.0  # a bigger tree accepts more
    pts = tree_budget.measured_points(inp.acceptance)
    assert sorted(pts["bs"]) == [5, 8, 16]  # chain/bs5, serial/bs8, serial/bs16 from the runtime


def test_tree_budget_synthetic_is_labelled(sim_inputs):
    pts = tree_budget.measured_points(sim_inputs.acceptance)
    assert set(pts["mode"]) == {"serial", "async"} and all(lbl.startswith("published") for lbl in pts["label"])


def test_timeline_measured_and_simulated(tmp_path):
    out = timeline.main([RUNLOG], tmp_path, iterations=6)
    xl = "time (ms from the start of iteration 1)"
    check_written(out, "timeline", [(xl, "GPU group")])
    titles = [t for t, _, _ in out.axes]
    assert titles[0].startswith("simulated: Llama-3-8B + Llama-3.2-1B, async bs8-w8-d3")
    assert titles[1].startswith("measured: async bs8-w8-d3, prompt 0 (cuda, NVIDIA H200")
    assert any("shared one GPU" in n for n in out.notes)


def test_timeline_window_starts_at_iteration_one():
    from swiftspec.runtime.runlog import RunLog

    log = RunLog.load(RUNLOG)
    it = log.iterations[(log.iterations["task"] == "async bs8-w8-d3") & (log.iterations["prompt"] == 0)]
    w = timeline._window(it, 5)
    assert list(w["iteration"]) == [1, 2, 3, 4, 5]
    assert math.isclose(min(w["draft_start_ms"].min(), w["target_start_ms"].min()), 0.0, abs_tol=1e-9)
    one = it[it["iteration"] == 1].iloc[0]
    assert math.isclose(w["target_end_ms"].iloc[0] - w["target_start_ms"].iloc[0],
                        one["target_end_ms"] - one["target_start_ms"], rel_tol=1e-9)


def test_timeline_cpu_run_without_profile_is_user_error(tmp_path):
    from swiftspec.runtime.runlog import RunLog

    log = RunLog.load(RUNLOG)
    log.meta["plan"] = {**log.meta["plan"], "device": "cpu"}
    log.write(tmp_path / "cpu-log")
    with pytest.raises(UserError, match="CPU run: give its CPU profile"):
        timeline.main([tmp_path / "cpu-log"], tmp_path / "fig")


def test_kernels_from_committed_results(tmp_path):
    kern = BUNDLED / "kernel-latency" / "kernels_h200.json"  # the bundled grid
    assert kernels_study.load_results([])[2][0] == kern.name  # the default input picks it too
    step = DATA / "step-h200-triton" / "bench_step-H200-triton.csv"
    out = run_study("kernels", [kern, step], tmp_path)
    check_written(out, "kernels", [("kv length (cached tokens)", "tree attention latency (µs)"),
                                   ("tokens per forward", "decoder forward latency (ms)")])
    k, s, names = kernels_study.load_results([kern, step])
    assert (k["us"] > k["floor_us"].fillna(0)).all()  # nothing beats the bytes floor
    assert names == [kern.name, step.name] and set(s["source"]) == {step.stem}


def test_kernels_step_panel_from_bench_step_kernels(tmp_path):
    """A bench_step_kernels result (the default step input since it exists): its step rows, one
    per (model, fusion, tokens) as the median over rounds, fp8 rows with their own (lower) floor;
    the title says what +fp8 means."""
    src = DATA / "step-kernels-fp8" / "bench_step_kernels-fp8.csv"
    raw = pd.read_csv(src)
    assert kernels_study.load_results([])[2][-1] == "bench_step_kernels-h200.csv"  # the bundled step result
    _, s, _ = kernels_study.load_results([src])
    assert not s.duplicated(["model", "attention", "tokens", "kv_len"]).any()
    one = raw[(raw.kind == "step") & (raw.model == "Llama-3-8B") & (raw.fusion == "triton+gemv") & (raw.tokens == 1)]
    got = s[(s.model == "Llama-3-8B") & (s.attention == "triton+gemv") & (s.tokens == 1)]["median_ms"].item()
    assert got == pytest.approx(one["median_ms"].median())
    floors = s[s.tokens == 1].set_index(["model", "attention"])["floor_ms"]
    assert floors["Llama-3-8B", "triton+gemv+fp8"] < 0.6 * floors["Llama-3-8B", "triton+gemv"]
    out = kernels_study.main([src], tmp_path)
    assert out.axes[-1][1:] == ("tokens per forward", "decoder forward latency (ms)")
    fig = kernels_study.draw(pd.DataFrame(columns=kernels_study.KERNEL_COLUMNS), s, "t")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert "Llama-3-8B, triton+gemv+fp8" in labels and "Llama-3.2-1B, triton+gemv" in labels


def test_kernels_ws_panel_and_paired_steps(tmp_path):
    """The Gluon-vs-Triton panel (bench_attention_ws results: its rows never reach the kv panels,
    whose floors are another GPU's), each attention panel naming its GPU, and the step panel from a
    --paired run (its `paired` rows are each fusion's own medians)."""
    ws = DATA / "attention-ws-h100" / "attention_ws_h100.json"
    grid = BUNDLED / "kernel-latency" / "kernels_h200.json"
    paired = DATA / "step-kernels-paired-h100" / "bench_step_kernels-paired.csv"
    for stem in ("attention_ws_1", "attention_ws_1b", "attention_ws_1_sweep", "attention_ws_1_bn128"):
        (tmp_path / f"{stem}.json").write_text(ws.read_text())  # bench_attention_ws.py names, dates aside
    found = kernels_study._ws_files(tmp_path)
    assert [f.stem for f in found] == ["attention_ws_1", "attention_ws_1b"]  # in order, no tile sweeps
    assert "attention_ws_h100.json" in kernels_study.load_results([])[2]  # the default inputs take the bundled one
    k, s, _ = kernels_study.load_results([grid, ws, paired])
    mine = k[k["impl"].str.startswith("ws:")]
    assert set(mine["impl"]) == {"ws:triton", "ws:ws"} and set(mine["gpu"]) == {"H100 80GB HBM3"}
    assert set(k[~k["impl"].str.startswith("ws:")]["gpu"]) == {"H200"}
    raw = pd.read_csv(paired)
    assert len(s) == (raw["kind"] == "paired").sum() and set(s["gpu"]) == {"H100 80GB HBM3"}
    out = kernels_study.main([grid, ws, paired], tmp_path)
    assert [a[1:] for a in out.axes][2] == ("shape (heads, kv length, queries)", "tree attention latency (µs)")
    fig = kernels_study.draw(k, s, "t")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles[0].endswith(", H200") and "Gluon vs Triton, H100" in titles[2] and titles[3].endswith("H100 80GB HBM3")
    bars = [p.get_height() for p in fig.axes[2].patches]
    assert len(bars) == 2 * mine[["kv", "queries", "heads"]].drop_duplicates().shape[0]
    goal = mine[(mine.kv == 16384) & (mine.queries == 64) & (mine.heads == "32/8")].set_index("impl")["us"]
    assert goal["ws:ws"] < goal["ws:triton"] and goal["ws:ws"] in bars
    _, s70, _ = kernels_study.load_results([DATA / "step-kernels-70b-tp8" / "bench_step_kernels-70b-tp8.csv"])
    assert set(s70["model"]) == {"Llama-3-70B TP 8"}  # a shard says so


def test_kernels_wrong_file_is_user_error(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="neither a kernel benchmark"):
        kernels_study.main([tmp_path / "x.csv"], tmp_path)
    with pytest.raises(UserError, match="not found"):
        kernels_study.main([tmp_path / "missing.json"], tmp_path)


def test_cli_list_and_unknown_name():
    from click.testing import CliRunner

    from swiftspec.cli import cli

    res = CliRunner().invoke(cli, ["study", "--list"])
    assert res.exit_code == 0
    assert [line.split()[0] for line in res.output.strip().splitlines()] == list(STUDIES)
    res = CliRunner().invoke(cli, ["study", "nope"])
    assert isinstance(res.exception, UserError) and "unknown study 'nope'" in str(res.exception)


def _dominates(a: pd.Series, b: pd.Series) -> bool:
    return a.hbm_tb_s >= b.hbm_tb_s and a.bf16_tflops >= b.bf16_tflops and (a.hbm_tb_s, a.bf16_tflops) != (
        b.hbm_tb_s, b.bf16_tflops)


def test_hardware_across_gpus_and_counts(tmp_path):
    """Every GPU x count is in the table and the CSV; a GPU with more bandwidth and at least the
    math rate of another never predicts fewer tokens/s at the same count (B200 >= H200 >= H100,
    both >= H20); more GPUs never predict fewer; the what-if parts are labelled so."""
    out = hardware.main([], tmp_path, counts=(2, 8))
    table = pd.read_csv(tmp_path / "hardware.csv")
    assert sorted(zip(table["gpu"], table["gpus"])) == sorted((g, n) for g in hardware.GPU_NAMES for n in (2, 8))
    assert table["tokens_per_s"].gt(0).all()
    pairs = 0
    for n, t in table.groupby("gpus"):
        for a in t.itertuples():
            for b in t.itertuples():
                if _dominates(a, b):
                    pairs += 1
                    assert a.tokens_per_s >= b.tokens_per_s, (n, a.gpu, b.gpu)
    assert pairs == 2 * 5  # all pairs but H100 / H20 (more bandwidth, less math)
    by = table.set_index(["gpu", "gpus"])["tokens_per_s"]
    assert all(by[(g, 8)] > by[(g, 2)] for g in hardware.GPU_NAMES)
    kinds = table.drop_duplicates("gpu").set_index("gpu")["kind"].to_dict()
    assert kinds == {"h100": "measured", "h200": "measured", "b200": "what-if (datasheet)", "h20": "what-if (datasheet)"}
    check_written(dataclasses.replace(out, paths=out.paths[:2]), "hardware",
                  [("GPUs", "tokens/s (predicted, best configuration)")])
    assert out.paths[2] == tmp_path / "hardware.csv"
    assert any(lbl.startswith("b200: derived from builtin:h200-measured for NVIDIA B200 (what-if) (datasheet)")
               for lbl in out.labels)
    with pytest.raises(UserError, match="not an acceptance profile JSON"):
        hardware.main([DERIVED], tmp_path)
