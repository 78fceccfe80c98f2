"""`swiftspec profile acceptance`: how a real draft/target pair agrees, measured with our runtime.

For every prompt:

1. the target's greedy continuation comes from the runtime itself (`generate` in autoregressive
   mode: the same `Transformer`, KV cache and verification code as every other mode);
2. one teacher-forced draft forward over prompt + continuation gives the draft's next-token
   distribution at every position of the target's path at once; the trace records, per position,
   the rank of the target's token among the draft's `top_k` most likely tokens (-1 beyond) and
   the draft's probability of it.

Summaries (`AcceptanceProfile`): `positional[k]` = fraction of positions whose rank is k
(Sequoia's positional acceptance vector), `draft_prob_by_rank[k]` = mean over positions of the
draft's (k+1)-th largest probability, and `accepted["<mode>/<policy>"]` = the mean accepted
length (tokens per verify, bonus included) that `generate` actually got in serial / chain mode on
the first few prompts. Those runs also check losslessness: their output must equal the
autoregressive continuation token for token (recorded in meta `lossless`).

With a temperature (> 0) the target's path is its sampled continuation (prompt i drawn as
`SamplingParams.for_prompt(i)` says, `verify.SamplingVerifier`) and the ranks are those of its draws. A tree node
continues exactly when the draw is among its children, so the replay stays exact and the planner
can plan sampled decoding from such a profile (named `...__T<temperature>`, plus `k<K>` / `p<P>` when
the target's draws are truncated to its top K tokens / its nucleus of mass P).

A pair whose vocabularies differ only by padding rows is measured over its shared ids, the target's
path included (`runtime.vocab`); another vocabulary is refused before the models are built.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from swiftspec.files import run_metadata
from swiftspec.profiler.prompts import encode, load_prompts
from swiftspec.runtime.decoder import ModelRunner
from swiftspec.runtime.generate import (
    DTYPES,
    GREEDY,
    GenerateConfig,
    cache_slots,
    check_device,
    eos_ids_of,
    generate,
)
from swiftspec.runtime.kernel_config import WEIGHT_FORMATS, KernelConfig
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.vocab import shared_vocab, vocab_cut
from swiftspec.runtime.weights import check_checkpoints, load_model, load_tokenizer
from swiftspec.spec import AcceptanceProfile, Mode, SamplingParams, TreePolicy, UserError, resolve_model_path

DEFAULT_POLICIES = ("chain/bs5-w1-d4", "serial/bs8-w8-d4", "serial/bs16-w4-d6")
_POLICY_RE = re.compile(r"^(?:(?P<mode>[a-z]+)/)?bs(?P<bs>\d+)-w(?P<w>\d+)-d(?P<d>\d+)(?:-D(?P<D>\d+))?$")


def parse_policy(text: str) -> tuple[Mode, TreePolicy]:
    """`[mode/]bs8-w8-d4[-D6]` (TreePolicy.key, optionally after a mode) -> (mode, policy).

    Without a mode: chain when w == 1 and bs == d + 1, else serial.
    """
    m = _POLICY_RE.match(text.strip())
    if not m:
        raise UserError(f"bad tree policy {text!r}: write it like serial/bs8-w8-d4 or chain/bs5-w1-d4")
    policy = TreePolicy(bs=int(m["bs"]), w=int(m["w"]), d=int(m["d"]), max_depth=int(m["D"] or 0))
    if m["mode"]:
        mode = Mode.parse(m["mode"])
    else:
        mode = Mode.chain if policy.w == 1 and policy.bs == policy.d + 1 else Mode.serial
    if mode not in (Mode.chain, Mode.serial):
        raise UserError(f"tree policy {text!r}: acceptance runs use serial or chain mode, not {mode}")
    policy.validate(mode)
    return mode, policy


@dataclass
class PairTrace:
    """One prompt's measurements. ranks/probs: (G,) along the target's continuation;
    topk_probs: (G, top_k) the draft's sorted top-k probabilities at each position."""

    prompt_id: str
    prompt_ids: list[int]
    continuation: list[int]
    ranks: list[int]
    probs: list[float]
    topk_probs: np.ndarray


@torch.no_grad()
def draft_distribution_along(draft, ids: Sequence[int], start: int, chunk: int = 256) -> torch.Tensor:
    """Teacher-forced draft forward over `ids`: float32 probabilities (len(ids) - start, vocab)
    of the draft's next token after ids[:start + 1], ..., ids[:len(ids)] (causal, chunked)."""
    dev = draft.device
    n = len(ids)
    cache = KVCache(draft.spec, draft.shard, n, dev, draft.dtype)
    tokens = torch.tensor(list(ids), dtype=torch.long, device=dev)
    rows = []
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        pos = torch.arange(s, e, device=dev)
        mask = torch.ones(e - s, e - s, dtype=torch.bool, device=dev).tril()
        logits = draft(tokens[s:e], pos, cache, pos, s, mask)
        keep_from = max(start - s, 0)
        if keep_from < e - s:
            rows.append(logits[keep_from:].float())
    return torch.softmax(torch.cat(rows), dim=-1)


def ranks_of(probs: torch.Tensor, targets: Sequence[int], top_k: int) -> tuple[list[int], list[float], np.ndarray]:
    """Rank (0-based, -1 beyond top_k) and probability of each target token under `probs` (G, V)."""
    tgt = torch.tensor(list(targets), dtype=torch.long, device=probs.device)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    hit = top.indices == tgt[:, None]
    ranks = torch.where(hit.any(dim=-1), hit.float().argmax(dim=-1), torch.full_like(tgt, -1))
    p = probs.gather(1, tgt[:, None])[:, 0]
    return ranks.tolist(), p.tolist(), top.values.cpu().numpy()


def summarize_traces(traces: Sequence[PairTrace], top_k: int) -> tuple[list[float], list[float]]:
    """(positional, draft_prob_by_rank), both of length top_k (see the module docstring)."""
    ranks = np.concatenate([np.asarray(t.ranks, dtype=np.int64) for t in traces]) if traces else np.zeros(0)
    if ranks.size == 0:
        raise UserError("no positions were measured: raise --max-new-tokens or give longer prompts")
    positional = [float(np.mean(ranks == k)) for k in range(top_k)]
    tops = np.concatenate([t.topk_probs for t in traces])
    by_rank = tops.mean(axis=0).tolist()
    by_rank += [0.0] * (top_k - len(by_rank))
    return positional, [float(x) for x in by_rank]


def _named(name: str, weight_format: str) -> str:
    """A model's name in profile names and file names: `-fp8` / `-int4` appended for quantized weights."""
    return name if weight_format == "native" else f"{name}-{weight_format}"


def _runner(model, slots: int, vocab_limit: int | None = None) -> ModelRunner:
    return ModelRunner(model, slots, vocab_limit=vocab_limit)


@dataclass(frozen=True)
class AcceptanceOptions:
    """What `profile_acceptance` measures: the first `num_prompts` of `prompts` ("builtin",
    "builtin:chat,code,..." or a JSONL file; None: all), `max_new_tokens` target tokens each, ranks
    up to `top_k` (beyond: -1), and the accepted length of every tree policy in `policies`
    (`parse_policy`) on the first `accepted_prompts` prompts."""

    prompts: str = "builtin"
    num_prompts: int | None = 12
    max_new_tokens: int = 48
    top_k: int = 32
    policies: tuple[str, ...] = DEFAULT_POLICIES
    accepted_prompts: int = 3


def profile_acceptance(
    target: str | Path,
    draft: str | Path,
    options: AcceptanceOptions = AcceptanceOptions(),
    sampling: SamplingParams = GREEDY,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    weight_format: str = "native",
    draft_weight_format: str | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> AcceptanceProfile:
    """Measure the pair as `options` says (see the module docstring) -> an AcceptanceProfile.

    weight_format / draft_weight_format (default: weight_format): the models' GEMM weights,
    "native", "fp8" or "int4" (`load_model`). The same checkpoint as target and draft with only the draft
    in fp8 measures how often the fp8 model's greedy token is the native one's (`top1_agreement`).
    sampling: the target's path is its greedy (temperature 0) or sampled continuation (module
    docstring). progress: a tqdm bar over the runs; log(line): each model built, and each run done
    when there is no bar (a log file or CI sees the work going on)."""
    prompts, num_prompts, max_new_tokens = options.prompts, options.num_prompts, options.max_new_tokens
    top_k, policies, accepted_prompts = options.top_k, options.policies, options.accepted_prompts
    temperature, sample_top_k, sample_top_p = sampling.temperature, sampling.top_k, sampling.top_p
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    if top_k < 1:
        raise UserError(f"--top-k must be >= 1, got {top_k}")
    check_device(device, dtype)
    draft_weight_format = draft_weight_format or weight_format
    for flag, fmt in (("--weight-format", weight_format), ("--draft-weight-format", draft_weight_format)):
        if fmt not in WEIGHT_FORMATS:
            raise UserError(f"{flag} must be one of {', '.join(WEIGHT_FORMATS)}, got {fmt!r}")
    parsed = [parse_policy(p) for p in policies]
    tfolder, dfolder = resolve_model_path(target), resolve_model_path(draft)
    check_checkpoints(tfolder, dfolder)  # a truncated file, weights unlike the config: one line, no model built
    plist = load_prompts(prompts, limit=num_prompts)
    vocab_limit = shared_vocab(target, draft)  # the pair's shared ids (padding rows may differ)
    tok = load_tokenizer(tfolder)
    say = log or (lambda line: None)

    def build(role: str, folder: Path, fmt: str):
        t0 = time.perf_counter()
        model = load_model(folder, device=device, dtype=DTYPES[dtype],
                           kernels=KernelConfig.resolve(device, weight_format=fmt))
        say(f"acceptance: {role} {folder.name} built ({model.spec.num_layers} layers) in "
            f"{time.perf_counter() - t0:.1f} s")
        return model

    tmodel, dmodel = build("target", tfolder, weight_format), build("draft", dfolder, draft_weight_format)
    t_cut = vocab_cut(tmodel.spec.vocab, vocab_limit)  # the target's path stays on ids the draft can name
    d_cut = vocab_cut(dmodel.spec.vocab, vocab_limit)
    eos = eos_ids_of(tfolder)
    encoded = [(p.id, encode(p, tok, vocab_limit)) for p in plist]

    bar = None
    if progress:
        bar = tqdm(total=len(encoded) + len(parsed) * min(accepted_prompts, len(encoded)), desc="acceptance",
                   unit="run", dynamic_ncols=True)  # fmt: skip
    t0 = time.perf_counter()
    traces: list[PairTrace] = []
    ar = TreePolicy.autoregressive()
    for i, (pid, ids) in enumerate(encoded):
        res = generate(
            _runner(tmodel, cache_slots(len(ids), max_new_tokens, ar, draft=False), t_cut), None, ids,
            GenerateConfig(mode=Mode.autoregressive, policy=ar, max_new_tokens=max_new_tokens, eos_ids=eos,
                           sampling=sampling.for_prompt(i)),
        )  # fmt: skip
        cont = res.tokens
        probs = draft_distribution_along(dmodel, ids + cont[:-1], start=len(ids) - 1)[:, :vocab_limit]
        ranks, p, tops = ranks_of(probs, cont, top_k)
        traces.append(PairTrace(pid, ids, cont, ranks, p, tops))
        if bar is not None:
            bar.update(1)
        else:
            say(f"acceptance: traced prompt {i + 1}/{len(encoded)} ({len(cont)} tokens)")

    accepted: dict[str, float] = {}
    lossless: dict[str, bool] = {}
    for mode, policy in parsed:
        key = f"{mode.value}/{policy.key}"
        acc = its = 0
        same = True
        for i, tr in enumerate(traces[:accepted_prompts]):
            ids = tr.prompt_ids
            res = generate(
                _runner(tmodel, cache_slots(len(ids), max_new_tokens, policy, draft=False), t_cut),
                _runner(dmodel, cache_slots(len(ids), max_new_tokens, policy, draft=True), d_cut),
                ids,
                GenerateConfig(mode=mode, policy=policy, max_new_tokens=max_new_tokens, eos_ids=eos,
                               sampling=sampling.for_prompt(i)),
            )
            acc += sum(r.accepted for r in res.records)
            its += len(res.records)
            same &= res.tokens == tr.continuation
            if bar is not None:
                bar.update(1)
        if bar is None and its:
            say(f"acceptance: {key}: {acc / its:.2f} tokens per verify")
        if its:
            accepted[key] = acc / its
            lossless[key] = same
    if bar is not None:
        bar.close()

    positional, by_rank = summarize_traces(traces, top_k)
    recipe = dfolder / "swiftspec_draft.json"  # how a self-draft was made (real_models.py)
    meta = run_metadata(device)
    tname, dname = _named(tfolder.name, weight_format), _named(dfolder.name, draft_weight_format)
    meta.update(
        source="measured",
        name=f"{tname}__{dname}" + (f"__T{temperature:g}" if temperature > 0 else "")
        + (f"k{sample_top_k}" if sample_top_k else "") + (f"p{sample_top_p:g}" if sample_top_p < 1 else ""),
        target=str(tfolder),
        draft=str(dfolder),
        target_name=tname,
        draft_name=dname,
        target_weight_format=weight_format,
        draft_weight_format=draft_weight_format,
        draft_recipe=json.loads(recipe.read_text()) if recipe.exists() else None,
        prompts=prompts,
        prompt_ids=[t.prompt_id for t in traces],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        sample_seed=sampling.seed if temperature > 0 else None,
        sample_top_k=sample_top_k,
        sample_top_p=sample_top_p,
        dtype=dtype,
        positions=int(sum(len(t.ranks) for t in traces)),
        top1_agreement=positional[0],
        accepted_prompts=min(accepted_prompts, len(traces)),
        lossless=lossless,
        seconds=round(time.perf_counter() - t0, 1),
    )
    prof = AcceptanceProfile(
        positional=positional,
        draft_prob_by_rank=by_rank,
        traces=[t.ranks for t in traces],
        trace_probs=[[float(f"{x:.4g}") for x in t.probs] for t in traces],  # 4 significant digits: small files
        top_k=top_k,
        accepted=accepted,
        meta=meta,
    )
    prof.validate("measured acceptance profile")
    return prof
