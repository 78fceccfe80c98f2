"""`swiftspec profile acceptance` and the prompt sets, on tiny checkpoints (CPU)."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from swiftspec.profiler.acceptance import AcceptanceOptions, parse_policy, profile_acceptance, ranks_of
from swiftspec.profiler.prompts import builtin_sets, encode, load_prompts, read_jsonl
from swiftspec.spec import AcceptanceProfile, Mode, SamplingParams, TreePolicy, UserError


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    p.write_text('{"id": "a", "prompt": "The cat sat on"}\n\n{"prompt": "Numbers: 1, 2, 3,"}\n{"tokens": [5, 9, 77]}\n')
    return p


def test_draft_equal_to_target_accepts_everything(make_checkpoint, prompts_file, tmp_path):
    ckpt = make_checkpoint("llama", tokenizer=True)
    opts = AcceptanceOptions(prompts=str(prompts_file), max_new_tokens=10, top_k=4,
                             policies=("chain/bs3-w1-d2", "bs5-w1-d4", "serial/bs6-w2-d3"))
    said: list[str] = []
    prof = profile_acceptance(ckpt, ckpt, opts, progress=False, log=said.append)
    assert len(prof.traces) == 3 and all(len(t) >= 1 for t in prof.traces)
    # without a bar: each model built, each prompt traced and each policy measured is a line
    built = [x.split(" built")[0] for x in said[:2]]
    assert built == [f"acceptance: {r} {ckpt.name}" for r in ("target", "draft")], said
    assert [x.split(" (")[0] for x in said[2:5]] == [f"acceptance: traced prompt {i}/3" for i in (1, 2, 3)]
    assert said[5:] == [f"acceptance: {k}: {v:.2f} tokens per verify" for k, v in prof.accepted.items()]
    assert all(r == 0 for t in prof.traces for r in t)
    assert prof.positional == [1.0, 0.0, 0.0, 0.0]
    # chain of k drafted tokens accepts all k plus the bonus token every verify
    assert prof.accepted["chain/bs3-w1-d2"] == 3.0
    assert prof.accepted["chain/bs5-w1-d4"] == 5.0
    assert prof.accepted["serial/bs6-w2-d3"] >= 2.0
    assert all(prof.meta["lossless"].values())
    assert all(0 < p <= 1 for t in prof.trace_probs for p in t)
    assert prof.draft_prob_by_rank == sorted(prof.draft_prob_by_rank, reverse=True)
    out = tmp_path / "acc.json"
    prof.save(out)
    again = AcceptanceProfile.load(out)
    assert again.meta["source"] == "measured" and not again.synthetic and again.accepted == prof.accepted


def test_sampled_profile_ranks_the_targets_draws(make_checkpoint, prompts_file):
    """temperature > 0: the path is the target's sampled continuation, so a self-draft no longer
    ranks every token 0 (greedy: all 0, above); the speculative runs at the same seeds still equal
    it token for token, and the profile says it is sampled."""
    ckpt = make_checkpoint("llama", tokenizer=True)
    opts = AcceptanceOptions(prompts=str(prompts_file), max_new_tokens=12, top_k=256,
                             policies=("chain/bs3-w1-d2", "serial/bs6-w2-d3"))
    prof = profile_acceptance(ckpt, ckpt, opts, SamplingParams(temperature=1.5, seed=4), progress=False)
    ranks = [r for t in prof.traces for r in t]
    assert ranks.count(0) < len(ranks) and -1 not in ranks  # top_k = vocab: every draw has a rank
    assert all(prof.meta["lossless"].values()) and prof.accepted["chain/bs3-w1-d2"] < 3.0
    assert prof.meta["temperature"] == 1.5 and prof.meta["sample_seed"] == 4 and prof.meta["name"].endswith("__T1.5")
    with pytest.raises(UserError, match="temperature must be a finite number >= 0"):
        profile_acceptance(ckpt, ckpt, AcceptanceOptions(prompts=str(prompts_file)), SamplingParams(temperature=-1),
                           progress=False)


def test_truncated_sampled_profile_stays_inside_the_cut(make_checkpoint, prompts_file):
    """sample_top_k 3: the target draws only among its 3 most likely tokens, so against a self-draft
    (the same distribution) every rank is 0, 1 or 2, some are not 0; speculation at the same cut
    stays lossless; the name and meta record the cut."""
    ckpt = make_checkpoint("llama", tokenizer=True)
    opts = AcceptanceOptions(prompts=str(prompts_file), max_new_tokens=12, top_k=256, policies=("serial/bs6-w2-d3",))
    prof = profile_acceptance(ckpt, ckpt, opts, SamplingParams(temperature=2.0, seed=1, top_k=3, top_p=0.95),
                              progress=False)
    ranks = [r for t in prof.traces for r in t]
    assert set(ranks) <= {0, 1, 2} and set(ranks) != {0}, ranks
    assert all(prof.meta["lossless"].values())
    assert prof.meta["name"].endswith("__T2k3p0.95")
    assert (prof.meta["sample_top_k"], prof.meta["sample_top_p"]) == (3, 0.95)
    with pytest.raises(UserError, match="top-p must be in"):
        profile_acceptance(ckpt, ckpt, AcceptanceOptions(prompts=str(prompts_file)),
                           SamplingParams(temperature=1, top_p=0), progress=False)


def test_fp8_draft_of_the_target_measures_fp8_fidelity(make_checkpoint, prompts_file):
    """The target against its own fp8 copy (`draft_weight_format="fp8"`): a different model, so not
    every rank is 0, yet mostly 0 (e4m3 keeps the greedy token at most positions of a random
    checkpoint); the names and meta say which side is fp8, and speculation stays lossless. Both
    sides fp8 is the fp8 model against itself: every rank 0."""
    ckpt = make_checkpoint("llama", tokenizer=True, num_hidden_layers=2, seed=3)
    opts = AcceptanceOptions(prompts=str(prompts_file), max_new_tokens=24, top_k=4, policies=("chain/bs3-w1-d2",))
    kw = dict(options=opts, progress=False)
    prof = profile_acceptance(ckpt, ckpt, draft_weight_format="fp8", **kw)
    ranks = [r for t in prof.traces for r in t]
    assert 0 < ranks.count(0) < len(ranks) and ranks.count(0) >= len(ranks) / 2, ranks
    m = prof.meta
    assert (m["target_weight_format"], m["draft_weight_format"]) == ("native", "fp8")
    assert m["draft_name"] == f"{ckpt.name}-fp8" and m["name"] == f"{ckpt.name}__{ckpt.name}-fp8"
    assert all(m["lossless"].values())
    both = profile_acceptance(ckpt, ckpt, weight_format="fp8", **kw)
    assert all(r == 0 for t in both.traces for r in t) and both.meta["target_name"] == f"{ckpt.name}-fp8"
    with pytest.raises(UserError, match="--draft-weight-format must be one of"):
        profile_acceptance(ckpt, ckpt, draft_weight_format="int3", **kw)


def test_ranks_match_transformers_teacher_forcing(make_checkpoint, prompts_file):
    """Ranks and probabilities of the target's tokens under the draft, against HF's own forward."""
    from transformers import AutoModelForCausalLM

    target = make_checkpoint("llama", tokenizer=True)
    draft = make_checkpoint("llama", tokenizer=True, seed=3)
    opts = AcceptanceOptions(prompts=str(prompts_file), max_new_tokens=8, top_k=256, policies=())
    prof = profile_acceptance(target, draft, opts, progress=False)
    hf_t = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    hf_d = AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval()
    from swiftspec.runtime.weights import load_tokenizer

    tok = load_tokenizer(target)
    for p, ranks, probs in zip(load_prompts(str(prompts_file)), prof.traces, prof.trace_probs):
        ids = encode(p, tok, 256)
        with torch.no_grad():
            cont = hf_t.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False,
                                 eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()  # fmt: skip
            cont = cont[: len(ranks)]
            q = torch.softmax(hf_d(torch.tensor([ids + cont])).logits[0, len(ids) - 1 : -1].float(), dim=-1)
        assert len(ranks) == len(cont)
        for i, tkn in enumerate(cont):
            expect_rank = int((q[i] > q[i, tkn]).sum())  # brute force: tokens strictly more likely
            assert ranks[i] == expect_rank
            assert probs[i] == pytest.approx(q[i, tkn].item(), rel=1e-3, abs=1e-6)
    total = sum(len(t) for t in prof.traces)
    assert sum(prof.positional) == pytest.approx(1.0)  # top_k = vocab: every token has a rank
    assert prof.positional[0] == pytest.approx(sum(r == 0 for t in prof.traces for r in t) / total)


def test_ranks_beyond_top_k_are_minus_one():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]])
    ranks, p, tops = ranks_of(probs, [3, 3], top_k=2)
    assert ranks == [-1, 0] and p == pytest.approx([0.05, 0.4])
    assert torch.allclose(torch.from_numpy(tops), torch.tensor([[0.5, 0.3], [0.4, 0.3]]))


def test_parse_policy():
    assert parse_policy("serial/bs8-w8-d4") == (Mode.serial, TreePolicy(bs=8, w=8, d=4))
    assert parse_policy("bs5-w1-d4") == (Mode.chain, TreePolicy.chain(4))
    assert parse_policy("bs16-w4-d6-D5") == (Mode.serial, TreePolicy(bs=16, w=4, d=6, max_depth=5))
    for bad in ("bs8", "async/bs8-w8-d4", "chain/bs8-w2-d4"):
        with pytest.raises(UserError):
            parse_policy(bad)


def test_builtin_prompt_sets():
    assert builtin_sets() == ["chat", "code", "math", "summarisation"]
    allp = load_prompts("builtin")
    assert len(allp) >= 40 and len({p.id for p in allp}) == len(allp)
    first = load_prompts("builtin", limit=4)
    assert {p.source for p in first} == {f"builtin:{s}" for s in builtin_sets()}  # interleaved
    code = load_prompts("builtin:code")
    assert 8 <= len(code) <= 16 and all(p.text and p.source == "builtin:code" for p in code)
    with pytest.raises(UserError, match="unknown built-in prompt set"):
        load_prompts("builtin:poetry")


@pytest.mark.parametrize(
    "line, msg",
    [("{not json", "not valid JSON"), ('["a"]', "expected an object"), ('{"text": "x"}', "exactly one of"),
     ('{"tokens": [1, -2]}', "token ids"), ('{"prompt": ""}', "non-empty")],
)  # fmt: skip
def test_malformed_prompts_file(tmp_path, line, msg):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "ok"}\n' + line + "\n")
    with pytest.raises(UserError, match=msg) as e:
        read_jsonl(p)
    assert "line 2" in str(e.value) and "\n" not in str(e.value)


def _cli(monkeypatch, capsys, *args):
    from swiftspec import cli

    monkeypatch.setattr(sys, "argv", ["swiftspec", *args])
    with pytest.raises(SystemExit) as e:
        cli.main()
    return e.value.code, capsys.readouterr().err.strip().splitlines()


def test_cli_bad_inputs_exit_2_one_line(make_checkpoint, monkeypatch, capsys, tmp_path):
    ckpt = str(make_checkpoint("llama", tokenizer=True))
    out = tmp_path / "a.json"
    code, err = _cli(monkeypatch, capsys, "profile", "acceptance", "--target", str(tmp_path / "missing"),
                     "--draft", ckpt, "-o", str(out))  # fmt: skip
    assert code == 2 and len(err) == 1 and err[0].startswith("error: unknown model")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"prompt": 3\n')
    code, err = _cli(monkeypatch, capsys, "profile", "acceptance", "--target", ckpt, "--draft", ckpt,
                     "--prompts", str(bad), "-o", str(out))  # fmt: skip
    assert code == 2 and len(err) == 1 and "line 2" in err[0]
    code, err = _cli(monkeypatch, capsys, "profile", "acceptance", "--target", ckpt, "--draft", ckpt,
                     "--policies", "bs8", "-o", str(out))  # fmt: skip
    assert code == 2 and len(err) == 1 and "bad tree policy" in err[0]
    assert not out.exists()


def test_cli_acceptance_writes_profile(make_checkpoint, monkeypatch, capsys, tmp_path, prompts_file):
    from swiftspec import cli

    ckpt = str(make_checkpoint("llama", tokenizer=True))
    out = tmp_path / "a.json"
    monkeypatch.setattr(sys, "argv", ["swiftspec", "profile", "acceptance", "--target", ckpt, "--draft", ckpt,
                                      "--prompts", str(prompts_file), "--max-new-tokens", "4", "--top-k", "3",
                                      "--policies", "chain/bs3-w1-d2", "-o", str(out)])  # fmt: skip
    cli.main()
    text = capsys.readouterr().out
    assert "accepted chain/bs3-w1-d2: 3.00" in text
    d = json.loads(out.read_text())
    assert d["top_k"] == 3 and d["meta"]["prompts"] == str(prompts_file)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["int3g32", "drop4"])
def test_real_pair_matches_shipped_profile(draft):
    """SmolLM2-135M and a self-draft (needs SWIFTSPEC_CACHE with the prepared real pair)."""
    cache = Path(os.environ.get("SWIFTSPEC_CACHE", Path.home() / ".cache" / "swiftspec")) / "real"
    if not (cache / "smollm2-135m" / "model.safetensors").exists():
        pytest.skip("real SmolLM2 pair not prepared (python -m swiftspec.profiler.real_models)")
    opts = AcceptanceOptions(num_prompts=2, max_new_tokens=16, policies=("chain/bs5-w1-d4",), accepted_prompts=1)
    prof = profile_acceptance(cache / "smollm2-135m", cache / f"smollm2-{draft}", opts, progress=False)
    shipped = AcceptanceProfile.load(Path(__file__).parents[1] / "swiftspec" / "data" / "acceptance"
                                     / f"smollm2-135m__{draft}.json")  # fmt: skip
    # the shipped traces start with the same prompts: the first 16 ranks of each must agree
    for mine, theirs in zip(prof.traces, shipped.traces):
        assert mine == theirs[: len(mine)]
    assert prof.meta["lossless"]["chain/bs5-w1-d4"]


def test_truncated_checkpoint_is_refused_before_any_model(make_checkpoint, tmp_path, monkeypatch):
    """A truncated safetensors file: one line naming it, before the target (which is fine) is built."""
    import shutil

    import swiftspec.profiler.acceptance as acceptance

    draft = tmp_path / "draft"
    shutil.copytree(make_checkpoint("llama"), draft)
    data = (draft / "model.safetensors").read_bytes()
    (draft / "model.safetensors").write_bytes(data[: len(data) // 2])
    monkeypatch.setattr(acceptance, "load_model", lambda *a, **k: pytest.fail("a model was built"))
    where = re.escape(f"checkpoint file {draft / 'model.safetensors'} is not a readable")
    with pytest.raises(UserError, match=where):
        profile_acceptance(make_checkpoint("llama"), draft, AcceptanceOptions(num_prompts=1), progress=False)
