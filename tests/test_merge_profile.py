"""benchmarks/merge_profile.py: a partial re-profile merged into the bundled H200 profile."""

import contextlib
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "merge_profile.py"
BUNDLED = ROOT / "swiftspec" / "data" / "profiles" / "h200-measured"


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*args, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    """A script's `main` in this process (a subprocess would import torch again for each call): its
    exit code and what it printed. Each bad-input test runs its script once as a process too."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _load_script(script).main([str(a) for a in args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


@pytest.fixture
def new_profile(tmp_path) -> Path:
    """A re-profile of Llama-3-8B (rows of the bundled one at 0.9x) with its own host rows (2x)."""
    base = pd.read_csv(BUNDLED / "compute.csv")
    rows = base[(base.model == "Llama-3-8B") | (base.op == "host")].copy()
    rows["ms"] = rows.ms * (rows.op == "host").map({True: 2.0, False: 0.9})
    meta = json.loads((BUNDLED / "meta.json").read_text())
    meta.update(date="2026-12-31T00:00:00+00:00", command="profile compute --models Llama-3-8B", aliases={},
                skipped=[], incomplete_tables=[])
    folder = tmp_path / "new"
    folder.mkdir()
    rows.to_csv(folder / "compute.csv", index=False)
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


@pytest.mark.parametrize("host", ["new", "base"])
def test_merge_replaces_the_model_its_aliases_and_host_rows(tmp_path, new_profile, host):
    out = tmp_path / "out"
    proc = run(BUNDLED, new_profile, "-o", out, "--host", host)
    assert proc.returncode == 0, proc.stderr
    base, merged = pd.read_csv(BUNDLED / "compute.csv"), pd.read_csv(out / "compute.csv")
    assert len(merged) == len(base)
    key = ["op", "model", "tp", "tokens", "kv_len"]
    both = base.merge(merged, on=key, suffixes=("_base", "_merged"))
    assert len(both) == len(base)  # the same points, no duplicates
    ratio = (both.ms_merged / both.ms_base).round(6)
    replaced = both.model.isin(["Llama-3-8B", "R1-Distill-Llama-8B"])  # and its alias
    assert (ratio[replaced] == 0.9).all()
    is_host = both.op == "host"
    assert (ratio[is_host] == (2.0 if host == "new" else 1.0)).all()
    assert (ratio[~replaced & ~is_host] == 1.0).all()
    meta = json.loads((out / "meta.json").read_text())
    entry = meta["merged"][-1]
    assert entry["models"] == ["Llama-3-8B", "R1-Distill-Llama-8B"] and entry["host"] == (host == "new")
    assert entry["command"] == "profile compute --models Llama-3-8B"
    assert meta["aliases"] == json.loads((BUNDLED / "meta.json").read_text())["aliases"]
    assert (out / "comm.csv").read_bytes() == (BUNDLED / "comm.csv").read_bytes()


def test_a_tp1_re_profile_keeps_the_other_shards_of_its_model(tmp_path, new_profile):
    """NEW measured Llama-3-8B at TP 1 only, with the device loop's host rows: its TP 1 rows (and its
    alias's) are replaced, the TP 2-8 rows stay BASE's, the merge entry says which shards are newer
    and meta.json which loop the host rows measured."""
    rows = pd.read_csv(new_profile / "compute.csv")
    rows[(rows.tp == 1) | (rows.op == "host")].to_csv(new_profile / "compute.csv", index=False)
    meta = json.loads((new_profile / "meta.json").read_text())
    (new_profile / "meta.json").write_text(json.dumps({**meta, "loop": "device"}))
    out = tmp_path / "out"
    proc = run(BUNDLED, new_profile, "-o", out)
    assert proc.returncode == 0, proc.stderr
    base, merged = pd.read_csv(BUNDLED / "compute.csv"), pd.read_csv(out / "compute.csv")
    both = base.merge(merged, on=["op", "model", "tp", "tokens", "kv_len"], suffixes=("_base", "_merged"))
    assert len(both) == len(base) == len(merged)
    ratio = (both.ms_merged / both.ms_base).round(6)
    eight_b = both.model.isin(["Llama-3-8B", "R1-Distill-Llama-8B"]) & (both.op != "host")
    assert (ratio[eight_b & (both.tp == 1)] == 0.9).all() and (eight_b & (both.tp == 1)).sum() > 0
    assert (ratio[eight_b & (both.tp > 1)] == 1.0).all() and (eight_b & (both.tp > 1)).sum() > 0
    merged_meta = json.loads((out / "meta.json").read_text())
    assert merged_meta["merged"][-1]["tps"] == [1]
    assert merged_meta["loop"] == "device"  # the host rows taken are the device loop's


def test_merge_bad_input_is_one_line_and_writes_nothing(tmp_path, new_profile):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "missing"), str(new_profile), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)  # the script's own exit, once
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1
    meta = json.loads((new_profile / "meta.json").read_text())
    meta["weight_format"] = "fp8"
    (new_profile / "meta.json").write_text(json.dumps(meta))
    proc = run(BUNDLED, new_profile, "-o", out)
    assert proc.returncode == 2 and "weight_format differs" in proc.stderr and proc.stderr.count("\n") == 1
    meta["weight_format"] = "native"
    (new_profile / "meta.json").write_text(json.dumps(meta))
    rows = pd.read_csv(new_profile / "compute.csv")
    pd.concat([rows, rows[rows.op == "forward"].head(3)]).to_csv(new_profile / "compute.csv", index=False)
    proc = run(BUNDLED, new_profile, "-o", out)
    # 3 points and their 3 alias copies (R1-Distill-Llama-8B)
    assert proc.returncode == 2 and "6 points twice" in proc.stderr and proc.stderr.count("\n") == 1
    assert not out.exists()


def test_merge_keeps_incomplete_entries_of_models_new_did_not_finish(tmp_path, new_profile):
    """A budget-cut re-profile of two models that finished only one: the merged meta lists NEW's
    incomplete tables of the replaced model, and none of the unfinished one, whose rows stay BASE's."""
    meta = json.loads((new_profile / "meta.json").read_text())
    meta["incomplete_tables"] = ["forward Llama-3-70B tp2", "layers Llama-3-70B tp8", "lm_head Llama-3-8B tp8"]
    (new_profile / "meta.json").write_text(json.dumps(meta))
    out = tmp_path / "out"
    proc = run(BUNDLED, new_profile, "-o", out)
    assert proc.returncode == 0, proc.stderr
    merged = json.loads((out / "meta.json").read_text())
    kept = [e for e in json.loads((BUNDLED / "meta.json").read_text())["incomplete_tables"] if "-8B " not in e]
    assert merged["incomplete_tables"] == [*kept, "lm_head Llama-3-8B tp8"] and merged["incomplete"] is True
    assert "forward Llama-3-70B tp2" not in merged["incomplete_tables"]
    assert (pd.read_csv(out / "compute.csv").model == "Llama-3-70B").sum() == (
        pd.read_csv(BUNDLED / "compute.csv").model == "Llama-3-70B").sum()


@pytest.mark.parametrize("key", ["swiglu", "attention_ws"])
def test_merged_kernel_setting_is_the_one_all_models_were_measured_with(tmp_path, key):
    """A kernel switched in NEW (`key` flipped) is the folder's setting only once every model's rows
    come from profiles measured with it; before that the folder says "mixed"."""
    base = pd.read_csv(BUNDLED / "compute.csv")
    meta = json.loads((BUNDLED / "meta.json").read_text())
    flipped = "off" if meta.get(key) == "on" else "on"
    measured = sorted(set(base[base.op != "host"].model) - set(meta["aliases"]))
    folders = []
    for i, models in enumerate((measured[:1], measured[1:])):
        folder = tmp_path / f"new{i}"
        folder.mkdir()
        base[base.model.isin(models)].to_csv(folder / "compute.csv", index=False)
        (folder / "meta.json").write_text(json.dumps({**meta, key: flipped, "aliases": {}, "skipped": [],
                                                      "incomplete_tables": []}))
        folders.append(folder)
    assert run(BUNDLED, folders[0], "-o", tmp_path / "m1", "--host", "base").returncode == 0
    m1 = json.loads((tmp_path / "m1" / "meta.json").read_text())
    assert m1[key] == "mixed" and m1["attention"] == meta["attention"]
    assert run(tmp_path / "m1", folders[1], "-o", tmp_path / "m2", "--host", "base").returncode == 0
    m2 = json.loads((tmp_path / "m2" / "meta.json").read_text())
    assert m2[key] == flipped and m2["merged"][-1]["kernels"][key] == flipped
    assert m2["fold_norm"] == meta["fold_norm"]


def test_a_resumed_profile_with_alias_rows_merges_without_duplicates(tmp_path, new_profile):
    """A resumed re-profile also holds the alias's old rows (R1-Distill-Llama-8B at 0.5x here): the
    merge copies the alias from its source's new rows instead, and never keeps a point twice."""
    rows = pd.read_csv(new_profile / "compute.csv")
    base = pd.read_csv(BUNDLED / "compute.csv")
    stale = base[base.model == "R1-Distill-Llama-8B"].iloc[::2].assign(ms=lambda d: d.ms * 0.5)
    pd.concat([rows, stale]).to_csv(new_profile / "compute.csv", index=False)
    out = tmp_path / "out"
    proc = run(BUNDLED, new_profile, "-o", out)
    assert proc.returncode == 0, proc.stderr
    merged = pd.read_csv(out / "compute.csv")
    key = ["op", "model", "tp", "tokens", "kv_len"]
    assert not merged.duplicated(key).any() and len(merged) == len(base)
    alias = merged[merged.model == "R1-Distill-Llama-8B"].merge(base, on=key, suffixes=("", "_base"))
    assert len(alias) == (base.model == "R1-Distill-Llama-8B").sum()
    assert ((alias.ms / alias.ms_base).round(6) == 0.9).all()


def test_ws_resume_partial_drops_exactly_the_forwards_the_gluon_rule_takes(tmp_path):
    """The partial to resume a Gluon-attention re-profile from keeps every row the rule leaves
    alone and drops the others: forwards of >= 32 tokens and >= 128 rows per KV head on shards
    whose group divides 64 (Llama-3-8B group 4 from 32 tokens; Qwen2-1.5B TP 6 group 2 from 64;
    Llama-3.2-3B group 3 and Qwen2-1.5B TP 4 group 3 never), the derived `layers` rows and the
    alias models' rows."""
    proc = run(BUNDLED, tmp_path, script=ROOT / "benchmarks" / "ws_resume_partial.py")
    assert proc.returncode == 0, proc.stderr
    base = pd.read_csv(BUNDLED / "compute.csv")
    kept = pd.read_csv(tmp_path / "compute.partial.csv")
    aliases = json.loads((tmp_path / "meta.json").read_text())["aliases"]
    assert aliases and not kept.model.isin(list(aliases)).any() and not (kept.op == "layers").any()
    fwd = kept[kept.op == "forward"]

    def tokens_kept(model, tp):
        return set(fwd[(fwd.model == model) & (fwd.tp == tp)].tokens)

    def tokens_base(model, tp):
        return set(base[(base.op == "forward") & (base.model == model) & (base.tp == tp)].tokens)

    assert tokens_kept("Llama-3-8B", 1) == {t for t in tokens_base("Llama-3-8B", 1) if t < 32}
    assert tokens_kept("Qwen2-1.5B", 6) == {t for t in tokens_base("Qwen2-1.5B", 6) if t < 64}
    assert tokens_kept("Qwen2-1.5B", 4) == tokens_base("Qwen2-1.5B", 4)
    assert tokens_kept("Llama-3.2-3B", 1) == tokens_base("Llama-3.2-3B", 1)
    # everything but forwards, layers and aliases is kept unchanged
    other = base[~base.op.isin(["forward", "layers"]) & ~base.model.isin(list(aliases))]
    assert len(kept[kept.op != "forward"]) == len(other)


def test_ws_resume_partial_refuses_a_missing_profile_in_one_line(tmp_path):
    script = ROOT / "benchmarks" / "ws_resume_partial.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "nope"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "not a readable profile folder" in proc.stderr
    assert not (tmp_path / "out").exists()
