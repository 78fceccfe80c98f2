"""benchmarks/bench_step_kernels.py end to end on CPU (Triton interpreted): with --rounds 2 every
mode is measured twice, in reversed order the second time, and "triton" matches "off"."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    pytest.skip("the fused modes run Triton kernels: TRITON_INTERPRET=1 on CPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_step_kernels  # noqa: E402

from swiftspec.spec import ModelSpec  # noqa: E402


def test_rounds_alternate_the_order(make_checkpoint, tmp_path):
    ckpt = make_checkpoint("llama")
    bench_step_kernels.main(["--device", "cpu", "--models", str(ckpt), "--tokens", "1,4", "--kv", "16",
                             "--fusions", "off,triton", "--reps", "2", "--warmup", "0", "--rounds", "2", "--no-kernels",
                             "--breakdown-tokens", "", "--out", str(tmp_path)])  # fmt: skip
    (csv,) = tmp_path.glob("bench_step_kernels-*.csv")
    steps = pd.read_csv(csv).query("kind == 'step'")
    assert len(steps) == 2 * 2 * 2  # rounds x fusions x token counts
    order = steps.drop_duplicates(["round", "fusion"]).sort_values(["round", "position"])
    assert order.groupby("round")["fusion"].apply(list).to_dict() == {0: ["off", "triton"], 1: ["triton", "off"]}
    assert (steps["median_ms"] > 0).all()
    fused = steps[steps["fusion"] == "triton"]
    assert (fused["max_rel_err_vs_off"] < 1e-4).all() and (fused["argmax_agree_vs_off"] == 1).all()
    meta = json.loads(csv.with_suffix(".json").read_text())["meta"]
    assert meta["weights"] == "random" and "partial" not in meta  # the last model's write is the complete file


def test_fp8_mode_has_its_own_floor(make_checkpoint, tmp_path):
    """"+fp8": a weight-only fp8 copy of the model, its floor with GEMM weights at one byte each,
    its logits near (not equal to) those of "off"."""
    ckpt = make_checkpoint("llama")
    bench_step_kernels.main(["--device", "cpu", "--models", str(ckpt), "--tokens", "1", "--kv", "16",
                             "--fusions", "off,triton+gemv+fp8", "--reps", "2", "--warmup", "0", "--no-kernels",
                             "--breakdown-tokens", "", "--out", str(tmp_path)])  # fmt: skip
    steps = pd.read_csv(next(tmp_path.glob("bench_step_kernels-*.csv"))).query("kind == 'step'").set_index("fusion")
    assert steps.loc["triton+gemv+fp8", "weight_format"] == "fp8" and steps.loc["off", "weight_format"] == "native"
    spec = ModelSpec.from_config(ckpt, dtype_bytes=4)  # float32 on CPU
    native, fp8 = (bench_step_kernels.bytes_read(dataclasses.replace(spec, weight_format=f), 1, 16)
                   for f in ("native", "fp8"))  # fmt: skip
    assert steps.loc["off", "bytes"] == native and steps.loc["triton+gemv+fp8", "bytes"] == fp8 < native / 3
    assert 0 < steps.loc["triton+gemv+fp8", "max_rel_err_vs_off"] < 0.15


def test_mode_suffixes_name_the_kernels():
    """Each suffix turns on its own choice and nothing else: "+linearcombine" the skinny linear's
    split-K sum in its launch, "+kernelcombine" the attention's merge, "+int4" the weight format,
    "+splitnR" the int4 split-K row limit."""
    args = bench_step_kernels.argparse.Namespace(attention="triton")
    base = bench_step_kernels.mode_kernels(args, "triton+gemv")
    assert (base.linear_combine, base.attention_combine, base.weight_format) == ("separate", "separate", "native")
    assert bench_step_kernels.mode_kernels(args, "triton+gemv+linearcombine") == dataclasses.replace(
        base, linear_combine="kernel")
    assert bench_step_kernels.mode_kernels(args, "triton+gemv+kernelcombine+int4") == dataclasses.replace(
        base, attention_combine="kernel", weight_format="int4")
    assert bench_step_kernels.mode_kernels(args, "triton+gemv+int4+splitn24576") == dataclasses.replace(
        base, weight_format="int4", linear_split_max_n=24576)


def test_gemv_rows_suffix_and_gemm_table(make_checkpoint, tmp_path):
    """"+gemv32": the skinny linear up to 32 tokens, logits as "off"; --gemm-gemv-rows 32 times it in
    the GEMMs-alone table at 20 tokens, where the default (16) has cuBLAS only."""
    ckpt = make_checkpoint("llama")
    bench_step_kernels.main(["--device", "cpu", "--models", str(ckpt), "--tokens", "1,20", "--kv", "32",
                             "--fusions", "off,triton+gemv32", "--reps", "2", "--warmup", "0", "--no-kernels",
                             "--gemm-gemv-rows", "32", "--breakdown-tokens", "", "--out", str(tmp_path)])  # fmt: skip
    rows = pd.read_csv(next(tmp_path.glob("bench_step_kernels-*.csv")))
    steps = rows.query("kind == 'step' and fusion == 'triton+gemv32'")
    assert len(steps) == 2 and (steps["max_rel_err_vs_off"] < 1e-4).all()
    gemm = rows.query("kind == 'gemm_only'")
    assert sorted(gemm[gemm.tokens == 20].impl) == ["cublas", "gemv"]
    with pytest.raises(SystemExit):
        bench_step_kernels.main(["--device", "cpu", "--models", str(ckpt), "--gemm-gemv-rows", "300"])


def test_paired_alternates_every_step(make_checkpoint, tmp_path):
    """--paired: every fusion captured at once, alternated step by step; each fusion gets `reps`
    timings and its ratio to the first fusion (1 for the first itself), and the outputs agree."""
    ckpt = make_checkpoint("llama")
    bench_step_kernels.main(["--device", "cpu", "--models", str(ckpt), "--tokens", "1,4", "--kv", "16",
                             "--fusions", "off,triton,triton+gemv+foldnorm", "--reps", "3", "--warmup", "0", "--paired",
                             "--no-kernels", "--breakdown-tokens", "", "--out", str(tmp_path)])  # fmt: skip
    rows = pd.read_csv(next(tmp_path.glob("bench_step_kernels-*.csv")))
    paired = rows.query("kind == 'paired'")
    assert len(paired) == 3 * 2 and not len(rows.query("kind == 'step'"))
    assert (paired.reps == 3).all() and (paired.vs == "off").all()
    first = paired[paired.fusion == "off"]
    assert (first.ratio_vs_first == 1.0).all() and (first.max_rel_err_vs_first == 0.0).all()
    assert (paired.ratio_vs_first > 0).all() and (paired.max_rel_err_vs_first < 1e-4).all()
    assert (paired.ratio_p10 <= paired.ratio_vs_first).all() and (paired.ratio_vs_first <= paired.ratio_p90).all()
    with pytest.raises(SystemExit):
        bench_step_kernels.main(["--device", "cpu", "--models", str(ckpt), "--paired", "--warmup", "-1"])


def test_tp_shard_times_rank_zero_against_its_own_floor(make_checkpoint, tmp_path):
    """--tp 2: rank 0 of a 2-way shard (communication skipped) with the folded norm, swiglu and rope
    against the plain skinny linear, paired; the floor is that rank's bytes (less than the whole
    model's), and the shard's logits agree across the modes."""
    ckpt = make_checkpoint("llama")
    bench_step_kernels.main(["--device", "cpu", "--models", str(ckpt), "--tokens", "1,4", "--kv", "16", "--tp", "2",
                             "--fusions", "triton+gemv,triton+gemv+foldnorm+swiglu+rope", "--reps", "2", "--warmup", "0",
                             "--paired", "--no-kernels", "--breakdown-tokens", "", "--out", str(tmp_path)])  # fmt: skip
    rows = pd.read_csv(next(tmp_path.glob("bench_step_kernels-*.csv")))
    paired = rows.query("kind == 'paired'")
    assert len(paired) == 2 * 2 and (paired.tp == 2).all()
    spec = ModelSpec.from_config(ckpt, dtype_bytes=4)
    shard = bench_step_kernels.bytes_read(spec, 1, 16, 2)
    assert shard < bench_step_kernels.bytes_read(spec, 1, 16)
    assert (paired[paired.tokens == 1].bytes == shard).all()
    assert (paired.max_rel_err_vs_first < 1e-4).all()
    with pytest.raises(SystemExit):
        bench_step_kernels.main(["--device", "cpu", "--models", str(ckpt), "--tp", "0"])
