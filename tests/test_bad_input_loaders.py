"""One CLI-level test per class of bad input file: `swiftspec` exits 2 with one line on stderr that
starts `error:` (no traceback), and writes no output.

Each case calls the real entry point (`swiftspec.cli.main`, what `python -m swiftspec` runs) in
this process, so the suite pays no interpreter start per case.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

DATA = Path(__file__).parent / "data"
PKG = Path(str(resources.files("swiftspec") / "data"))
PLAN = json.loads((DATA / "plan-gpus8.json").read_text())
RUNLOG = DATA / "runlog-h200-async-mini"
TINY_CONFIG = {"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 32, "rms_norm_eps": 1e-6,
               "max_position_embeddings": 64, "tie_word_embeddings": False}  # fmt: skip




# ---- how each bad input is made: (tmp folder) -> CLI arguments, with -o OUT where the verb writes


def _profile(tmp: Path, edit: Callable[[Path], None]) -> Path:
    prof = tmp / "prof"
    shutil.copytree(PKG / "profiles" / "h200-measured", prof)
    edit(prof)
    return prof


def _edit_csv(name: str, row: int, col: str, value: str) -> Callable[[Path], None]:
    def edit(prof: Path) -> None:
        lines = (prof / name).read_text().splitlines()
        header = lines[0].split(",")
        cells = lines[row].split(",")
        cells[header.index(col)] = value
        lines[row] = ",".join(cells)
        (prof / name).write_text("\n".join(lines) + "\n")
    return edit


def _append_duplicate(name: str) -> Callable[[Path], None]:
    def edit(prof: Path) -> None:
        lines = (prof / name).read_text().splitlines()
        (prof / name).write_text("\n".join(lines + [lines[5]]) + "\n")
    return edit


def _drop_column(name: str, col: str) -> Callable[[Path], None]:
    def edit(prof: Path) -> None:
        rows = [r.split(",") for r in (prof / name).read_text().splitlines()]
        j = rows[0].index(col)
        (prof / name).write_text("\n".join(",".join(r[:j] + r[j + 1:]) for r in rows) + "\n")
    return edit


def _write(name: str, data: bytes | str) -> Callable[[Path], None]:
    def edit(prof: Path) -> None:
        (prof / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return edit


def plan_with_profile(edit: Callable[[Path], None]) -> Callable[[Path], list[str]]:
    return lambda tmp: ["plan", "--gpus", "2", "--profile", str(_profile(tmp, edit)), "-o", str(tmp / "OUT")]


def plan_with_acceptance(doc_or_bytes) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        p = tmp / "acc.json"
        if isinstance(doc_or_bytes, bytes):
            p.write_bytes(doc_or_bytes)
        else:
            base = json.loads((PKG / "acceptance" / "qwen2-72b-table7.json").read_text())
            p.write_text(json.dumps({**base, **doc_or_bytes}))
        return ["plan", "--gpus", "2", "--acceptance", str(p), "-o", str(tmp / "OUT")]
    return make


def run_with_plan(edit: Callable[[dict], None] | bytes) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        p = tmp / "plan.json"
        if isinstance(edit, bytes):
            p.write_bytes(edit)
        else:
            doc = json.loads(json.dumps(PLAN))
            edit(doc)
            p.write_text(json.dumps(doc))
        return ["run", "--plan", str(p), "--device", "cpu", "--weights", "random", "-o", str(tmp / "OUT")]
    return make


def run_with_prompts(text: bytes, suffix: str = ".jsonl") -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        p = tmp / f"prompts{suffix}"
        p.write_bytes(text)
        return ["run", "--plan", str(DATA / "plan-gpus8.json"), "--device", "cpu", "--weights", "random",
                "--prompts", str(p), "-o", str(tmp / "OUT")]
    return make


def study_with_runlog(name: str, data: bytes) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        shutil.copytree(RUNLOG, tmp / "log")
        (tmp / "log" / name).write_bytes(data)
        return ["study", "timeline", "-i", str(tmp / "log"), "-o", str(tmp / "OUT")]
    return make


def repredict_with(name: str, data: bytes) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / name).write_bytes(data)
        return ["validate", "--repredict", str(tmp / name), "-o", str(tmp / "OUT")]
    return make


def _tiny_checkpoint(folder: Path, config: dict) -> Path:
    folder.mkdir()
    g = torch.Generator().manual_seed(0)
    shapes = {"model.embed_tokens.weight": (32, 8), "model.norm.weight": (8,), "lm_head.weight": (32, 8),
              "model.layers.0.input_layernorm.weight": (8,), "model.layers.0.post_attention_layernorm.weight": (8,),
              "model.layers.0.self_attn.q_proj.weight": (8, 8), "model.layers.0.self_attn.k_proj.weight": (4, 8),
              "model.layers.0.self_attn.v_proj.weight": (4, 8), "model.layers.0.self_attn.o_proj.weight": (8, 8),
              "model.layers.0.mlp.gate_proj.weight": (16, 8), "model.layers.0.mlp.up_proj.weight": (16, 8),
              "model.layers.0.mlp.down_proj.weight": (8, 16)}  # fmt: skip
    save_file({k: torch.randn(s, generator=g) for k, s in shapes.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def generate_truncated(tmp: Path) -> list[str]:
    ckpt = _tiny_checkpoint(tmp / "ckpt", TINY_CONFIG)
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) - 100])
    return ["generate", "--target", str(ckpt), "--prompt-ids", "1,2", "--max-new-tokens", "2", "--device", "cpu",
            "--dtype", "float32"]


def plan_with_config(**bad) -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text(json.dumps({**TINY_CONFIG, **bad}))
        return ["plan", "--gpus", "2", "--target", str(tmp / "model"), "-o", str(tmp / "OUT")]
    return make


def _set(path: tuple, value) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        d = doc
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return edit


NOT_UTF8 = b'{"target": "\xff\xfe caf\xe9"}\n'

# class -> (how to make it, what the error line says)
CASES = {
    "profile-text-in-numeric-cell": (plan_with_profile(_edit_csv("compute.csv", 3, "ms", "fast")),
                                     "compute.csv row 3 column ms: 'fast' is not a number"),
    "profile-nan-ms": (plan_with_profile(_edit_csv("compute.csv", 3, "ms", "nan")), "row 3 column ms: nan is empty or NaN"),
    "profile-infinite-ms": (plan_with_profile(_edit_csv("comm.csv", 2, "ms", "inf")), "comm.csv row 2 column ms: inf is not finite"),
    "profile-negative-ms": (plan_with_profile(_edit_csv("compute.csv", 3, "ms", "-0.5")), "is negative"),
    "profile-fractional-size": (plan_with_profile(_edit_csv("compute.csv", 3, "tokens", "2.5")), "not an integer"),
    "profile-missing-column": (plan_with_profile(_drop_column("compute.csv", "kv_len")), "lacks columns kv_len"),
    "profile-duplicate-compute-key": (plan_with_profile(_append_duplicate("compute.csv")),
                                      "compute.csv has 2 rows for one key .*empty folder or remove the duplicate"),
    "profile-duplicate-comm-key": (plan_with_profile(_append_duplicate("comm.csv")), "comm.csv has 2 rows"),
    "profile-csv-not-utf8": (plan_with_profile(_write("comm.csv", b"collective,group_size,bytes,ms\n\xff,2,1,1\n")),
                             "comm.csv is not UTF-8"),
    "profile-meta-not-object": (plan_with_profile(_write("meta.json", "[1, 2]")), "meta.json is malformed"),
    "profile-meta-wrong-type": (plan_with_profile(_write("meta.json", '{"source": "measured", "memory_bytes": "lots"}')),
                                "memory_bytes must be a finite number"),
    "profile-meta-caveats-not-a-list": (
        plan_with_profile(_write("meta.json", '{"source": "measured", "kernels_unlike_runtime": "linear_combine"}')),
        "kernels_unlike_runtime must be a list of strings"),
    "acceptance-wrong-type": (plan_with_acceptance({"positional": "0.5, 0.2"}), "positional must be a list"),
    "acceptance-infinite-value": (plan_with_acceptance({"accepted": {"serial/bs8": float("inf")}}),
                                  "accepted.* must be a finite number"),
    "acceptance-probability-out-of-range": (plan_with_acceptance({"positional": [1.5]}), r"positional\[0\]"),
    "acceptance-negative-rank": (plan_with_acceptance({"traces": [[0, -2]]}), r"traces\[0\]\[1\] must be"),
    "acceptance-not-utf8": (plan_with_acceptance(NOT_UTF8), "is not UTF-8 text"),
    "plan-null-field": (run_with_plan(_set(("policy",), None)), "policy must be an object, got None"),
    "plan-malformed-field": (run_with_plan(_set(("split", "target_gpus"), "4-7")), "target_gpus must be a list"),
    "plan-negative-gpu-index": (run_with_plan(_set(("split", "draft_gpus"), [-1, 1, 2, 3])), r"draft_gpus\[0\]"),
    "plan-fractional-bs": (run_with_plan(_set(("policy", "bs"), 12.5)), "bs must be an integer >= 1, got 12.5"),
    "plan-unknown-mode": (run_with_plan(_set(("mode",), "turbo")), "unknown mode 'turbo'"),
    "plan-not-utf8": (run_with_plan(NOT_UTF8), "plan .* is not UTF-8 text"),
    "prompts-ids-wrong-type": (run_with_prompts(b'{"ids": ["1", 2]}\n'), r'line 1: "ids"\[0\] must be an integer'),
    "prompts-negative-id": (run_with_prompts(b'{"ids": [1, -2]}\n'), r'"ids"\[1\] must be an integer in 0\.\.'),
    "prompts-id-beyond-vocab": (run_with_prompts(b'{"ids": [99999999]}\n'), "got 99999999"),
    "prompts-not-utf8": (run_with_prompts(b"hello \xff\n", ".txt"), "prompt file .* is not UTF-8"),
    "runlog-not-json": (study_with_runlog("summary.json", b"{nope"), "summary.json is not valid JSON"),
    "runlog-missing-column": (study_with_runlog("prompts.jsonl", b'{"task": "x"}\n'), "lacks field 'mode'"),
    "runlog-not-utf8": (study_with_runlog("iterations.jsonl", b"\xff\n"), "iterations.jsonl is not UTF-8"),
    "report-not-utf8": (repredict_with("report.json", NOT_UTF8), "validation report .* is not UTF-8"),
    "report-wrong-type": (repredict_with("report.json", json.dumps({"meta": {"prompts": 3}, "rows": {}}).encode()),
                          "rows must be a list"),
    "report-log-bad-cell": (repredict_with("run.log", b"config pred tok/s\nx a b c d e f g h i j\n"),
                            "table cell .* is not a number"),
    "checkpoint-truncated": (generate_truncated, "model.safetensors is not a readable safetensors file"),
    "config-zero-size": (plan_with_config(hidden_size=0), "hidden_size must be an integer >= 1, got 0"),
    "config-heads-not-dividing-hidden": (plan_with_config(num_attention_heads=3), "3 does not divide hidden_size"),
    "config-kv-heads-not-dividing-heads": (plan_with_config(num_key_value_heads=3), "does not divide num_attention"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, swiftspec_cli):
    make, match = CASES[case]
    args = make(tmp_path)
    code, out, err = swiftspec_cli(*args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (case, err)
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("error: "), err
    import re

    assert re.search(match, lines[0]), (match, lines[0])
    assert not (tmp_path / "OUT").exists()


def test_every_class_is_listed():
    """The classes covered here are the ones listed for the docs (one per line, `CASES`)."""
    assert len(CASES) >= 30 and all(k == k.lower() and " " not in k for k in CASES)
