"""`swiftspec plan` / `swiftspec simulate` through the CLI entry point: output, files, bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from test_sim_engine import const_profile

from swiftspec.sim.profile_default import bundled_profile_dir
from swiftspec.spec import Plan

QUICK = ["--requests", "2", "--max-new-tokens", "24", "--prompt-len", "200"]




@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Configs of two tiny models (folders named like the constant profile's models) + that profile."""
    root = tmp_path_factory.mktemp("tiny")
    for name, layers, hidden in (("tgt", 3, 64), ("drf", 2, 32)):
        (root / name).mkdir()
        cfg = {"model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden,
               "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
               "vocab_size": 256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}
        (root / name / "config.json").write_text(json.dumps(cfg))
    const_profile().save(root / "profile")
    return root


def test_plan_prints_labels_table_breakdown_and_writes_plan(tiny, tmp_path, swiftspec_cli):
    out_file = tmp_path / "plan.json"
    code, out, err = swiftspec_cli("plan", "--gpus", "3", "--target", str(tiny / "tgt"),
                             "--draft", str(tiny / "drf"), "--profile", str(tiny / "profile"), "--top", "4",
                             "-o", str(out_file), *QUICK)
    assert code == 0, err
    assert "profile: derived" in out and "acceptance: synthetic" in out
    assert "x AR" in out and "x serial" in out and "target compute" in out and "link" in out
    plan = Plan.load(out_file)
    assert plan.prediction is not None and plan.profile.path == str(tiny / "profile")
    # simulate re-predicts the same plan to the same number
    code, out, err = swiftspec_cli("simulate", "--plan", str(out_file), "--json",
                             "--trace", str(tmp_path / "trace.json"))
    assert code == 0, err
    got = json.loads(out)
    assert got["prediction"]["tokens_per_s_mean"] == pytest.approx(plan.prediction.tokens_per_s_mean)
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]


def test_plan_json_is_only_json(tiny, swiftspec_cli):
    code, out, err = swiftspec_cli("plan", "--gpus", "2", "--target", str(tiny / "tgt"),
                             "--draft", str(tiny / "drf"), "--profile", str(tiny / "profile"), "--json",
                             "--modes", "async,autoregressive", *QUICK)
    assert code == 0, err
    d = json.loads(out)
    assert d["profile"] == "derived" and d["acceptance"].startswith("synthetic")
    assert {r["mode"] for r in d["rows"]} == {"async", "autoregressive"}
    assert d["rows"][0]["tokens_per_s_mean"] >= d["rows"][1]["tokens_per_s_mean"]


def test_default_pair_fully_pinned(tmp_path, swiftspec_cli):
    code, out, err = swiftspec_cli("plan", "--gpus", "8", "--modes", "async", "--draft-gpus", "4",
                             "--bs", "8", "--w", "8", "--d", "3", "--json", *QUICK)
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert len(rows) == 1 and rows[0]["draft_gpus"] == 4 and rows[0]["policy"] == "bs8-w8-d3"
    assert rows[0]["speedup_vs_autoregressive"] > 1


def test_plan_without_a_baseline_says_so(swiftspec_cli):
    """Where no autoregressive or serial configuration on the GPUs can be simulated (the int4
    profile has the 8B and 1B at TP 1 only), the speedup columns show "-" and the speedups line
    says why, instead of NaN and an empty list; --json has null there (strict JSON)."""
    code, out, err = swiftspec_cli("plan", "--gpus", "2", "--profile", "builtin:h100-int4", "--target",
                                   "Llama-3-8B", "--draft", "Llama-3.2-1B", "--modes", "async", *QUICK)
    assert code == 0, err
    table = out.split("x serial", 1)[1].split("speedups over", 1)[0]
    assert "NaN" not in out and table.split()[-2:] == ["-", "-"]
    assert "autoregressive = none (no autoregressive configuration on 2 GPUs" in out and "serial = none" in out
    code, out, err = swiftspec_cli("plan", "--gpus", "2", "--profile", "builtin:h100-int4", "--target",
                                   "Llama-3-8B", "--draft", "Llama-3.2-1B", "--modes", "async", "--json", *QUICK)
    assert code == 0, err

    def strict(word):
        raise ValueError(f"not JSON: {word}")

    rows = json.loads(out, parse_constant=strict)["rows"]  # no NaN: null where a speedup has no baseline
    assert rows[0]["speedup_vs_autoregressive"] is None and rows[0]["tokens_per_s_mean"] > 0


def bad(swiftspec_cli, tmp_path, *args) -> str:
    out_file = tmp_path / "never.json"
    code, out, err = swiftspec_cli(*args, "-o", str(out_file), *QUICK)
    assert code == 2, (out, err)
    assert not out_file.exists() and not list(tmp_path.glob(".never*"))
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_bad_inputs(swiftspec_cli, tiny, tmp_path):
    msg = bad(swiftspec_cli, tmp_path, "plan", "--gpus", "2", "--target", "Llama-9-1T")
    assert "Llama-3-70B" in msg and "Qwen2-72B" in msg  # lists the bundled names
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    msg = bad(swiftspec_cli, tmp_path, "plan", "--gpus", "2", "--draft", str(broken))
    assert "num_hidden_layers" in msg and "vocab_size" in msg
    msg = bad(swiftspec_cli, tmp_path, "plan", "--gpus", "1", "--modes", "async")
    assert "at least 2 GPUs" in msg and "disjoint" in msg
    prof = const_profile()
    prof.compute = prof.compute[~((prof.compute["model"] == "tgt") & (prof.compute["tp"] == 2))]
    prof.save(tmp_path / "holey")
    msg = bad(swiftspec_cli, tmp_path, "plan", "--gpus", "2", "--modes", "autoregressive",
              "--target", str(tiny / "tgt"), "--draft", str(tiny / "drf"), "--profile", str(tmp_path / "holey"))
    assert "tgt at tp 2" in msg
    (tmp_path / "acc.json").write_text(json.dumps({"positional": [0.9, 0.5], "draft_prob_by_rank": [0.5],
                                                   "meta": {"source": "synthetic"}}))
    msg = bad(swiftspec_cli, tmp_path, "plan", "--gpus", "2", "--acceptance", str(tmp_path / "acc.json"))
    assert "positional" in msg
    derived = str(bundled_profile_dir())  # its 141 GB per GPU: a bf16 70B plus its cache does not fit
    msg = bad(swiftspec_cli, tmp_path, "plan", "--gpus", "1", "--profile", derived)
    assert "fits" in msg and "--gpus 2" in msg
    msg = bad(swiftspec_cli, tmp_path, "plan", "--gpus", "2", "--modes", "turbo")
    assert "unknown mode" in msg


def test_console_script_exit_code(tmp_path):
    exe = shutil.which("swiftspec")
    cmd = [exe] if exe else [sys.executable, "-m", "swiftspec"]
    p = subprocess.run([*cmd, "plan", "--gpus", "1", "--modes", "async"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: async mode needs at least 2 GPUs")
    assert p.stdout == ""
