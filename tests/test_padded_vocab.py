"""Pairs whose vocabularies differ only by padding rows decode over their shared ids, losslessly,
in `generate` and `run`; a real mismatch is refused with one line, the same for every verb."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from swiftspec.run import RunOptions, run_plan
from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.generate import (
    GenerateConfig,
    LoadOptions,
    cache_slots,
    generate,
    generate_from_checkpoints,
)
from swiftspec.runtime.vocab import mismatch_line, shared_vocab
from swiftspec.runtime.weights import load_model
from swiftspec.spec import Mode, Plan, Profile, SamplingParams, Split, TreePolicy, UserError

POLICY = TreePolicy(bs=4, w=2, d=2)
PROMPT = [5, 17, 99, 3, 42]


def padded(src: Path, dst: Path, vocab: int) -> Path:
    """A copy of checkpoint `src` with its embedding and LM head padded by zero rows to `vocab`
    (what Qwen-style padding is: rows no token uses), tokenizer files copied."""
    if dst.exists():
        return dst
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["vocab_size"] = vocab
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(src / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = tensors[name]
        tensors[name] = torch.cat([w, w.new_zeros(vocab - w.shape[0], w.shape[1])])
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def models(make_checkpoint, tmp_path_factory):
    """target and draft (vocab 256, byte tokenizer) and their copies padded to 272 rows."""
    root = tmp_path_factory.mktemp("padded")
    target = make_checkpoint("llama", seed=3, tokenizer=True)
    draft = make_checkpoint("llama", seed=9, weight_std=0.02, num_hidden_layers=1, tokenizer=True)
    return {"target": target, "draft": draft, "target+": padded(target, root / "target-272", 272),
            "draft+": padded(draft, root / "draft-272", 272)}


@pytest.mark.parametrize("t,d", [("target+", "draft"), ("target", "draft+")], ids=["smaller-draft", "larger-draft"])
def test_generate_padded_pair_equals_target_only(models, t, d):
    """Greedy serial and chain speculation on a pair whose vocabularies differ by padding rows
    give the target-only tokens exactly, whichever side is padded."""
    target, draft = models[t], models[d]
    assert shared_vocab(target, draft) == 256
    ref = generate_from_checkpoints(target, prompt=PROMPT, max_new_tokens=16, eos=False).tokens
    for mode, policy in ((Mode.serial, POLICY), (Mode.chain, TreePolicy.chain(3))):
        out = generate_from_checkpoints(target, draft, prompt=PROMPT, mode=mode, policy=policy, max_new_tokens=16,
                                        eos=False)
        assert out.tokens == ref, mode


def _restricted_target_only(path, vocab: int, cfg: GenerateConfig, weights: str = "checkpoint") -> list[int]:
    """The pair's reference: the target alone with its logits cut to the shared ids."""
    model = load_model(path, weights=weights)
    runner = ModelRunner(model, cache_slots(len(PROMPT), cfg.max_new_tokens, cfg.policy, draft=False),
                         vocab_limit=vocab)
    return generate(runner, None, PROMPT, cfg).tokens


def test_sampled_padded_pair_is_the_targets_draw_over_the_shared_ids(models):
    """Sampling (temperature 0.9): speculation on the padded pair equals target-only sampling with
    the same seed over the shared ids (the pair's rule: the target's padding rows carry mass at a
    temperature, so the target is cut there in every mode of the pair)."""
    sampling = SamplingParams(temperature=0.9, seed=4)
    out = generate_from_checkpoints(models["target+"], models["draft"], prompt=PROMPT, mode=Mode.serial,
                                    policy=POLICY, max_new_tokens=16, eos=False, sampling=sampling)
    ar = TreePolicy.autoregressive()
    ref = _restricted_target_only(models["target+"], 256, GenerateConfig(Mode.autoregressive, ar, 16,
                                                                       sampling=sampling))
    assert out.tokens == ref and max(out.tokens) < 256


def test_random_weights_restrict_the_target_to_the_shared_ids(tmp_path):
    """Random weights fill the padding rows too, so the target alone often picks a padding id: the
    pair decodes over the shared ids instead (the documented rule), and equals the target so cut."""
    for name, vocab in (("t512", 512), ("d256", 256)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({
            "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": vocab,
            "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}))
    target, draft = tmp_path / "t512", tmp_path / "d256"
    load = LoadOptions(weights="random")
    alone = generate_from_checkpoints(target, prompt=PROMPT, max_new_tokens=12, eos=False, load=load).tokens
    assert max(alone) >= 256  # the rule matters: unrestricted, the random target names padding ids
    out = generate_from_checkpoints(target, draft, prompt=PROMPT, mode=Mode.serial, policy=POLICY, max_new_tokens=12,
                                    eos=False, load=load).tokens
    ar = TreePolicy.autoregressive()
    assert out == _restricted_target_only(target, 256, GenerateConfig(Mode.autoregressive, ar, 12), weights="random")
    assert max(out) < 256


def test_run_padded_pair_on_two_ranks_is_lossless(models, tmp_path):
    """`run` (two gloo ranks) with a draft vocabulary smaller than the target's, as Qwen2-1.5B for
    Qwen2-72B: async and serial produce the autoregressive baseline's tokens for every prompt."""
    Plan(target=str(models["target+"]), draft=str(models["draft"]), split=Split.disaggregated(1, 1), mode=Mode.async_,
         policy=POLICY, device="cpu").save(tmp_path / "plan.json")
    log = run_plan(tmp_path / "plan.json", RunOptions(num_prompts=2, max_new_tokens=10, timeout_s=120))
    p = log.prompts
    assert set(p["mode"]) == {"async", "serial", "autoregressive"}
    for _, group in p.groupby("prompt"):
        tokens = {mode: list(t) for mode, t in zip(group["mode"], group["tokens"])}
        assert tokens["async"] == tokens["autoregressive"] == tokens["serial"]
        assert len(tokens["async"]) == 10


def _profile(folder, names) -> str:
    rows = []
    for name in names:
        for t in (1, 2, 4, 8, 16, 32, 64):
            rows += [("layers", name, 1, t, kv, 1.0) for kv in (16, 4096)]
            rows += [("embed", name, 1, t, 0, 0.01), ("lm_head", name, 1, t, 0, 0.1), ("tree_growth", name, 1, t, 0, 0.02)]
        rows += [("kv_compact", name, 1, t, 0, 0.005) for t in (1, 1024)]
    rows += [("host", m, 1, 0, 0, 0.3) for m in ("autoregressive", "chain", "serial", "async")]
    Profile(pd.DataFrame(rows, columns=["op", "model", "tp", "tokens", "kv_len", "ms"]),
            pd.DataFrame(columns=["collective", "group_size", "bytes", "ms"]),
            {"source": "measured", "device": "cpu", "gpu": "cpu"}).save(folder)
    return str(folder)


def test_a_real_mismatch_is_one_line_the_same_for_every_verb(make_checkpoint, tmp_path, monkeypatch, capsys):
    """A draft whose begin-of-text id differs from the target's is another vocabulary: generate,
    run, validate and profile acceptance refuse it with the same line (exit 2), before any model."""
    from swiftspec.cli import main

    target = make_checkpoint("llama", seed=3)
    draft = make_checkpoint("llama", seed=9, vocab_size=272, bos_token_id=7)
    Plan(target=str(target), draft=str(draft), split=Split.disaggregated(1, 1), mode=Mode.async_, policy=POLICY,
         device="cpu").save(tmp_path / "plan.json")
    prof = _profile(tmp_path / "prof", [target.name, draft.name])
    verbs = {
        "generate": ["generate", "--target", target, "--draft", draft, "--mode", "serial", "--prompt-ids", "1,2,3"],
        "run": ["run", "--plan", tmp_path / "plan.json", "-o", tmp_path / "log"],
        "validate": ["validate", "--device", "cpu", "--pairs", f"{target}:{draft}", "--profile", prof,
                     "--no-calibrate-host", "-o", tmp_path / "val"],
        "profile acceptance": ["profile", "acceptance", "--target", target, "--draft", draft, "-o", tmp_path / "a.json"],
    }
    lines = {}
    for verb, args in verbs.items():
        monkeypatch.setattr(sys, "argv", ["swiftspec", *map(str, args)])
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main()
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1, (verb, err)
        lines[verb] = err[0]
    expected = "error: " + mismatch_line(target, draft, "begin-of-text ids 1 vs 7")
    assert set(lines.values()) == {expected}, lines
    assert not any((tmp_path / f).exists() for f in ("log", "val", "a.json"))


def test_shared_vocab_rules(make_checkpoint):
    """Equal tokenizers and padding: the smaller vocabulary; disjoint end-of-text ids or another
    tokenizer: the mismatch line."""
    base = make_checkpoint("llama", seed=3, tokenizer=True)
    assert shared_vocab(base, make_checkpoint("llama", seed=5, vocab_size=300, tokenizer=True)) == 256
    assert shared_vocab(base, None) == 256
    with pytest.raises(UserError, match=r"do not share a vocabulary \(end-of-text ids \[2\] vs \[9\]\)"):
        shared_vocab(make_checkpoint("llama", seed=3), make_checkpoint("llama", seed=5, eos_token_id=9))
    with pytest.raises(UserError, match=r"tokenizer's ids reach 255, beyond the smaller vocabulary of 200 rows"):
        shared_vocab(base, make_checkpoint("llama", seed=5, vocab_size=200, tokenizer=True))


def test_validate_and_profile_acceptance_run_a_padded_pair(models, tmp_path):
    """`validate` (host calibration on stand-ins of both vocabularies included) and `profile
    acceptance` run a pair whose draft vocabulary is smaller than the target's; acceptance's
    speculative runs stay lossless."""
    from swiftspec.profiler.acceptance import AcceptanceOptions, profile_acceptance
    from swiftspec.sim.acceptance import default_acceptance
    from swiftspec.spec import ModelSpec
    from swiftspec.validate import SweepOptions, calibrate_host, validate

    target, draft = str(models["target+"]), str(models["draft"])
    rep = validate(SweepOptions(device="cpu", pairs=((target, draft),), weights="checkpoint", configs=3, prompts=1,
                                max_new_tokens=6), profile=_profile(tmp_path / "prof", [Path(target).name, Path(draft).name]),
                   calibrate=False)  # fmt: skip
    assert rep.rows["measured_tokens_per_s"].notna().all() and rep.rows["comparable"].all()
    _, fit = calibrate_host("cpu", default_acceptance()[0], prompts=1, new_tokens=6, modes=(Mode.serial,),
                            target=ModelSpec.from_config(target), draft=ModelSpec.from_config(draft))
    assert fit["samples"] > 0
    prof = profile_acceptance(target, draft, AcceptanceOptions(num_prompts=2, max_new_tokens=8,
                                                               policies=("serial/bs4-w2-d2",), accepted_prompts=1),
                              progress=False)  # fmt: skip
    assert prof.meta["lossless"] == {"serial/bs4-w2-d2": True}
