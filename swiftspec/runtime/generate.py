"""Single-process decoding: autoregressive, chain and serial (tree) speculation.

Follow one token:
  `generate` loop (here)  ->  `DraftTree.expand` (tree.py, draft forwards)  ->
  `DraftTree.select` + `verify_inputs` (tree.py)  ->  `ModelRunner.forward_tree` (decoder.py)  ->
  `Transformer.forward` (model.py)  ->  tree attention (attention.py / kernels)  ->
  `GreedyVerifier.verify` or `SamplingVerifier.verify` (verify.py)  ->
  `ModelRunner.commit` / `reroot_draft` (decoder.py).

Every mode is the same loop: autoregressive is a tree of one node (bs=1) and no draft; chain is a
tree with w=1; serial grows a tree by max-likelihood (or fills a static topology), then verifies.
Both sides start with the prompt minus its last token in their prefix; the last prompt token is
the first root.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch

from swiftspec.runtime.capture import no_collection
from swiftspec.runtime.decoder import ModelRunner, reroot_draft
from swiftspec.runtime.device_loop import DeviceLoop, LoopConfig, LoopPlan
from swiftspec.runtime.kernel_config import TREE_GROWTH_IMPLS, WEIGHT_FORMATS, KernelConfig
from swiftspec.runtime.synthetic import SyntheticVerifier
from swiftspec.runtime.tree import DraftTree, tree_slots_needed
from swiftspec.runtime.verify import GreedyVerifier, SamplingVerifier, Verifier
from swiftspec.runtime.vocab import shared_vocab, vocab_cut
from swiftspec.runtime.weights import load_model, load_tokenizer
from swiftspec.spec import LOOPS, Mode, ModelSpec, SamplingParams, TreePolicy, UserError, resolve_model_path

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GREEDY = SamplingParams()  # the default: the target's argmax
PROGRESS_INTERVAL_S = 1.0  # at most one decoding progress line a second (`generate`)


@dataclass(frozen=True)
class GenerateConfig:
    """What to decode and how.

    keep_subtree: in serial mode, keep the drafted subtree under the bonus token for the next
    round (its KV compacted behind the prefix) instead of starting a fresh tree. Off by default:
    `serial` starts a fresh tree every iteration in the simulator, `run` and `validate` too, so the
    word means one thing everywhere. Chain trees never contain the bonus token; static trees are
    always refilled from a fresh root.
    eos_ids: stop after producing any of these (the stop token is kept in the output).
    rank_logprobs: synthetic acceptance: log q[rank] of the replayed AcceptanceProfile, which
    shapes the draft tree instead of the draft's own log-probabilities (`DraftTree`).
    sampling: greedy verification (`GreedyVerifier`) at temperature 0, else lossless sampling of
    the target (`SamplingVerifier`: the same seed gives the same tokens in every mode).
    loop: "host" (the tree in Python lists, `DraftTree`) or "device" (fixed-shape tensors,
    replayed as CUDA graphs on a GPU: `device_loop.DeviceLoop`); the same tokens either way.
    """

    mode: Mode
    policy: TreePolicy
    max_new_tokens: int
    eos_ids: tuple[int, ...] = ()
    keep_subtree: bool = False
    rank_logprobs: tuple[float, ...] | None = None
    sampling: SamplingParams = GREEDY
    loop: str = "host"


@dataclass(frozen=True)
class IterationRecord:
    """One draft round + verify. Times in ms (host wall clock; each step ends in a device sync)."""

    accepted: int  # tokens this verify produced (accepted drafted tokens + bonus)
    verified: int  # nodes sent to the target (root included)
    tree_nodes: int  # nodes in the draft tree when it was verified
    draft_forwards: int
    draft_tokens: int  # tree nodes in those draft forwards
    draft_ms: float
    verify_ms: float
    commit_ms: float
    forward_tokens: tuple[int, ...] = ()  # tokens of each draft forward (pending verified tokens included)


@dataclass
class GenerateResult:
    """Output of one generation. tokens_per_s = generated tokens / decode time (prefill excluded)."""

    tokens: list[int]
    text: str | None
    tokens_per_s: float
    mean_accepted: float
    iterations: int
    weights: str  # "checkpoint" | "random"
    mode: str
    policy: str  # TreePolicy.key
    prompt_len: int
    prefill_ms: float
    decode_s: float
    stop: str  # "eos" | "max_new_tokens"
    records: list[IterationRecord] = field(default_factory=list)
    weight_format: str = "native"  # the target's GEMM weights: "native" (the dtype) | "fp8" | "int4"
    temperature: float = 0.0  # 0: greedy; > 0: sampled (SamplingVerifier)
    sample_top_k: int = 0  # sampled: the top-k cut (0: off)
    sample_top_p: float = 1.0  # sampled: the nucleus mass (1: off)
    loop: str = "host"  # GenerateConfig.loop
    device_ms: float | None = None  # device loop on CUDA: device time of its graph replays

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def loop_device_ms(self) -> float:
        """ms of the device loop's work in this decode: the device time of its graph replays on CUDA,
        its phases' wall time elsewhere (the eager loop's tree work runs inside those phases)."""
        if self.device_ms is not None:
            return self.device_ms
        return float(sum(r.draft_ms + r.verify_ms for r in self.records))

    def records_frame(self) -> pd.DataFrame:
        """Per-iteration table: one row per IterationRecord."""
        return pd.DataFrame([dataclasses.asdict(r) for r in self.records])


def gc_paused(fn):
    """`fn` with Python's cyclic garbage collector paused: a collection in the middle of a decode
    step costs ms once many objects are alive (a long sweep, a profile in the same process) and
    would be counted as host work; what the call leaves behind is collected after it."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with no_collection():
            return fn(*args, **kwargs)

    return run


@gc_paused
def generate(
    target: ModelRunner,
    draft: ModelRunner | None,
    prompt_ids: Sequence[int],
    cfg: GenerateConfig,
    *,
    verifier: Verifier | None = None,
    tokenizer=None,
    weights: str = "checkpoint",
    progress: Callable[[str], None] | None = None,
) -> GenerateResult:
    """Decode `cfg.max_new_tokens` tokens after `prompt_ids` with fresh runners (empty caches).

    progress: called with "generate: 16/32 tokens, 12.3 tok/s" at most once a second while
    decoding, and once at the end (a long decode is never silent)."""
    if not prompt_ids:
        raise UserError("the prompt is empty: give at least one token")
    verifier = verifier or make_verifier(cfg.sampling)
    policy, speculative = cfg.policy, cfg.mode is not Mode.autoregressive
    if speculative and draft is None:
        raise UserError(f"{cfg.mode} mode needs a draft model (--draft)")
    keep = cfg.keep_subtree and cfg.mode is Mode.serial
    sync = torch.cuda.synchronize if target.device.type == "cuda" else (lambda: None)

    t0 = time.perf_counter()
    target.prefill(prompt_ids[:-1])
    if speculative:
        draft.prefill(prompt_ids[:-1])
    sync()
    prefill_ms = (time.perf_counter() - t0) * 1e3

    if cfg.loop == "device":
        tokens, records, decode_s, device_ms = _decode_on_device(target, draft, prompt_ids[-1], cfg, verifier)
        stop = "eos" if tokens and tokens[-1] in cfg.eos_ids else "max_new_tokens"
        if progress is not None:
            progress(_decoded_line(len(tokens), cfg.max_new_tokens, decode_s) + (" (eos)" if stop == "eos" else ""))
        return _result(target, prompt_ids, cfg, tokens, records, decode_s, prefill_ms, stop, tokenizer, weights,
                       device_ms)

    out: list[int] = []
    records: list[IterationRecord] = []
    stop = "max_new_tokens"
    tree = DraftTree.fresh(prompt_ids[-1], policy, cfg.rank_logprobs)
    t_start = t_said = time.perf_counter()
    while len(out) < cfg.max_new_tokens:
        t_it = time.perf_counter()
        forwards = drafted = 0
        fwd_tokens: list[int] = []
        if speculative:
            rounds = len(policy.topology) if policy.kind == "static" else policy.d
            for _ in range(rounds):
                pending = len(draft.pending)  # run in front of the tree nodes, in the same forward
                n = tree.expand(draft.forward_tree, draft.top_logprobs)
                if n == 0:
                    break
                forwards, drafted = forwards + 1, drafted + n
                fwd_tokens.append(pending + n)
        t_draft = time.perf_counter()

        selected = tree.select(policy.bs)
        logits = target.forward_tree(*tree.verify_inputs(selected))
        verdict = verifier.verify(tree, selected, logits)
        t_verify = time.perf_counter()

        row = {n: i for i, n in enumerate(selected)}
        target.commit([row[n] for n in verdict.path])  # target slot = position in `selected`
        new = verdict.new_tokens(tree)
        tree_nodes = len(tree)
        if speculative:
            tree = reroot_draft(draft, tree, verdict, keep_subtree=keep, keep=policy.keep_limit)
        else:
            tree = DraftTree.fresh(verdict.bonus, policy)
        sync()
        records.append(
            IterationRecord(
                accepted=verdict.accepted_length,
                verified=len(selected),
                tree_nodes=tree_nodes,
                draft_forwards=forwards,
                draft_tokens=drafted,
                draft_ms=(t_draft - t_it) * 1e3,
                verify_ms=(t_verify - t_draft) * 1e3,
                commit_ms=(time.perf_counter() - t_verify) * 1e3,
                forward_tokens=tuple(fwd_tokens),
            )
        )

        for tok in new:
            out.append(tok)
            if tok in cfg.eos_ids:
                stop = "eos"
                break
            if len(out) == cfg.max_new_tokens:
                break
        if stop == "eos":
            break
        if progress is not None and time.perf_counter() - t_said >= PROGRESS_INTERVAL_S:
            t_said = time.perf_counter()
            progress(_decoded_line(len(out), cfg.max_new_tokens, t_said - t_start))
    decode_s = time.perf_counter() - t_start
    if progress is not None:
        progress(_decoded_line(len(out), cfg.max_new_tokens, decode_s) + (" (eos)" if stop == "eos" else ""))

    return _result(target, prompt_ids, cfg, out, records, decode_s, prefill_ms, stop, tokenizer, weights)


def _result(target: ModelRunner, prompt_ids: Sequence[int], cfg: GenerateConfig, out: list[int],
            records: list[IterationRecord], decode_s: float, prefill_ms: float, stop: str, tokenizer, weights: str,
            device_ms: float | None = None) -> GenerateResult:
    return GenerateResult(
        tokens=out,
        text=tokenizer.decode(out) if tokenizer is not None else None,
        tokens_per_s=len(out) / decode_s if decode_s > 0 else 0.0,
        mean_accepted=sum(r.accepted for r in records) / max(len(records), 1),
        iterations=len(records),
        weights=weights,
        weight_format=target.model.kernels.weight_format,
        mode=cfg.mode.value,
        policy=cfg.policy.key,
        prompt_len=len(prompt_ids),
        prefill_ms=prefill_ms,
        decode_s=decode_s,
        stop=stop,
        records=records,
        temperature=cfg.sampling.temperature,
        sample_top_k=cfg.sampling.top_k,
        sample_top_p=cfg.sampling.top_p,
        loop=cfg.loop,
        device_ms=device_ms,
    )


def _decode_on_device(target: ModelRunner, draft: ModelRunner | None, root: int, cfg: GenerateConfig,
                      verifier: Verifier) -> tuple[list[int], list[IterationRecord], float, float | None]:
    """`generate`'s decode by `device_loop.DeviceLoop` (built once per runners and config, kept on
    the target runner). Returns (tokens, records, decode seconds, device ms of the replays on CUDA)."""
    speculative = cfg.mode is not Mode.autoregressive
    if isinstance(verifier, SyntheticVerifier):
        kind, stream = "synthetic", verifier.path[verifier.pos :]
    elif isinstance(verifier, SamplingVerifier):
        kind = "sampled"
        stream = [verifier.uniform(verifier.produced + i) for i in range(cfg.max_new_tokens + 2 * cfg.policy.bs + 2)]
    elif isinstance(verifier, GreedyVerifier):
        kind, stream = "greedy", None
    else:
        raise ValueError(f"the device loop verifies greedily, by sampling or by a rank path, not by {type(verifier).__name__}")
    plan = None
    if speculative:
        vocab = draft.vocab_limit or draft.model.spec.vocab
        plan = LoopPlan.build(cfg.policy, vocab, keep=cfg.keep_subtree and cfg.mode is Mode.serial)
    sampling = verifier.sampling if isinstance(verifier, SamplingVerifier) else cfg.sampling  # the verifier's draws
    lcfg = LoopConfig(plan=plan, verify=kind, max_new_tokens=cfg.max_new_tokens, eos_ids=cfg.eos_ids,
                      sampling=sampling, rank_logprobs=cfg.rank_logprobs if speculative else None,
                      bs=cfg.policy.bs)
    key = (id(draft), lcfg)
    loop = target.loops.get(key)
    if loop is None:
        loop = target.loops[key] = DeviceLoop(target, draft, lcfg)
    t0 = time.perf_counter()
    tokens, stats, times = loop.decode(root, stream)
    decode_s = time.perf_counter() - t0
    records = []
    for row, (draft_ms, verify_ms) in zip(stats, times):
        k, sent, nodes, fwd = row[0], row[1], row[2], row[3:]
        nodes_f, tokens_f = fwd[0::2], fwd[1::2]
        used = [i for i, n in enumerate(nodes_f) if n > 0]
        records.append(IterationRecord(accepted=k, verified=sent, tree_nodes=nodes, draft_forwards=len(used),
                                       draft_tokens=sum(nodes_f), draft_ms=draft_ms, verify_ms=verify_ms,
                                       commit_ms=0.0, forward_tokens=tuple(tokens_f[i] for i in used)))
    if isinstance(verifier, SyntheticVerifier):
        for r in records:
            ranks = [verifier.rank_at(verifier.pos + j) for j in range(r.accepted)]
            verifier.consumed.append(ranks)
            verifier.pos += r.accepted
        verifier.last_bonus_rank = verifier.consumed[-1][-1] if verifier.consumed else verifier.last_bonus_rank
    elif isinstance(verifier, SamplingVerifier):
        verifier.produced += sum(r.accepted for r in records)
    device_ms = sum(a + b for a, b in times) if loop.use_graphs else None
    return tokens, records, decode_s, device_ms


def _decoded_line(done: int, total: int, seconds: float) -> str:
    rate = f", {done / seconds:.1f} tok/s" if seconds > 0 else ""
    return f"generate: {done}/{total} tokens{rate}"


def make_verifier(sampling: SamplingParams) -> Verifier:
    """Greedy at temperature 0, else lossless sampling as `sampling` says (verify.py)."""
    return GreedyVerifier() if sampling.greedy else SamplingVerifier(sampling)


# --------------------------------------------------------------------------------------------
# From checkpoint paths (what `swiftspec generate` calls)


def make_policy(
    mode: Mode,
    bs: int | None = None,
    w: int | None = None,
    d: int | None = None,
    max_depth: int = 0,
    topology: Sequence[int] | None = None,
) -> TreePolicy:
    """The TreePolicy a mode implies, filled from the flags that were given (None = default).

    autoregressive: bs=1. chain: k = d (or bs-1, default 4) drafted tokens, w=1, bs=k+1.
    serial: dynamic bs/w/d (defaults 8/8/4), or static when a topology is given (bs = its size).
    """
    if mode is Mode.autoregressive:
        policy = TreePolicy.autoregressive()
    elif mode is Mode.chain:
        k = d if d is not None else (bs - 1 if bs is not None else 4)
        policy = TreePolicy.chain(k)
        if (bs is not None and bs != k + 1) or (w is not None and w != 1):
            raise UserError(f"chain mode drafts k={k} tokens: it needs --w 1 and --bs {k + 1} (or leave them out)")
    elif mode is Mode.serial:
        if topology is not None:
            topo = tuple(int(p) for p in topology)
            policy = TreePolicy(bs=len(topo), w=w or 1, d=d or 0, kind="static", topology=topo)
        else:
            dflt = TreePolicy()
            policy = TreePolicy(bs=bs or dflt.bs, w=w or dflt.w, d=d if d is not None else dflt.d, max_depth=max_depth)
    else:
        raise UserError(f"{mode} mode runs on several processes: use `swiftspec run` (generate supports "
                        "autoregressive, chain, serial)")
    policy.validate(mode)
    return policy


def eos_ids_of(path_or_name: str | Path) -> tuple[int, ...]:
    """EOS ids of a checkpoint: generation_config.json's if present, else config.json's."""
    folder = resolve_model_path(path_or_name)
    for name in ("generation_config.json", "config.json"):
        f = folder / name
        if f.exists():
            eos = json.loads(f.read_text()).get("eos_token_id")
            if eos is not None:
                return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))
    return ()


def cache_slots(prompt_len: int, max_new_tokens: int, policy: TreePolicy, draft: bool) -> int:
    """KV slots one side needs: prompt + generated tokens + a round's overshoot + its tree region."""
    tree = tree_slots_needed(policy) + 1 if draft else policy.bs  # +1: a pending token
    return prompt_len + max_new_tokens + policy.bs + tree


def check_device(device: str, dtype: str) -> None:
    """`device` is cpu or an available cuda, `dtype` one of DTYPES; else one-line UserError."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but no CUDA GPU is available: use --device cpu")


@dataclass(frozen=True)
class LoadOptions:
    """How `generate_from_checkpoints` loads the models and sizes their caches.

    weights: "checkpoint" or "random" (at the checkpoint's shapes, seeded by `seed`; a distinct
    draft gets seed + 1). weight_format: both models' GEMM weights, "native", "fp8" or "int4".
    tree_growth: the draft's top-k ("auto": the device's default, `KernelConfig.resolve`).
    loop: the decoding loop, "host" or "device" (`GenerateConfig.loop`).
    max_len: the most KV-cache slots per model.
    memory_check(device, [(spec, KV slots) per model]): called after every other check, before a
    model is built (`swiftspec.preflight.check_models` refuses when the models do not fit).
    progress(line): what the work is doing, on the caller's channel (the CLI: stderr): each
    model built and how long it took, then the decode (`generate`'s progress).
    """

    device: str = "cpu"
    dtype: str = "float32"
    weights: str = "checkpoint"
    seed: int = 0
    weight_format: str = "native"
    tree_growth: str = "auto"
    loop: str = "host"
    max_len: int = 4096
    memory_check: Callable[[str, list[tuple[ModelSpec, int]]], object] | None = None
    progress: Callable[[str], None] | None = None

    def kernels(self) -> KernelConfig:
        """The models' kernels (checked flags first: a bad one is a one-line UserError naming it)."""
        check_device(self.device, self.dtype)
        if self.weights not in ("checkpoint", "random"):
            raise UserError(f"--weights must be checkpoint or random, got {self.weights!r}")
        if self.weight_format not in WEIGHT_FORMATS:
            raise UserError(f"--weight-format must be one of {', '.join(WEIGHT_FORMATS)}, got {self.weight_format!r}")
        if self.loop not in LOOPS:
            raise UserError(f"--loop must be one of {', '.join(LOOPS)}, got {self.loop!r}")
        if self.tree_growth not in ("auto", *TREE_GROWTH_IMPLS):
            raise UserError(f"--tree-growth must be one of auto, {', '.join(TREE_GROWTH_IMPLS)}, "
                            f"got {self.tree_growth!r}")
        return KernelConfig.resolve(self.device, weight_format=self.weight_format, tree_growth=self.tree_growth)


def generate_from_checkpoints(
    target: str | Path,
    draft: str | Path | None = None,
    *,
    prompt: str | Sequence[int],
    mode: Mode | str = Mode.autoregressive,
    policy: TreePolicy | None = None,
    max_new_tokens: int = 32,
    sampling: SamplingParams = GREEDY,
    load: LoadOptions = LoadOptions(),
    eos: bool = True,
    keep_subtree: bool = False,
) -> GenerateResult:
    """Check the inputs, load the models and run `generate` (the library side of the CLI).

    prompt: text (needs the target's tokenizer) or token ids. eos: stop at the target's EOS ids
    (`eos_ids_of`). keep_subtree: see `GenerateConfig`. Everything is checked before a model is
    built: the pair's vocabulary (`runtime.vocab.shared_vocab`: a draft whose vocabulary differs
    only by padding decodes over the shared ids, the target's logits cut there too), the tokenizer
    and prompt, the cache room, and `load.memory_check` when given. `load.progress` hears each
    model built and the decode."""
    mode = Mode.parse(mode) if isinstance(mode, str) else mode
    policy = policy or make_policy(mode)
    policy.validate(mode)
    kernels = load.kernels()
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    speculative = mode is not Mode.autoregressive
    if speculative and draft is None:
        raise UserError(f"{mode} mode needs a draft model: add --draft PATH")

    vocab = shared_vocab(target, draft if speculative else None)
    tokenizer = load_tokenizer(resolve_model_path(target))
    if isinstance(prompt, str):
        if tokenizer is None:
            raise UserError(f"{target} has no tokenizer: give the prompt as --prompt-ids 1,2,3")
        ids = list(tokenizer(prompt)["input_ids"])
    else:
        ids = [int(x) for x in prompt]
    if not ids:
        raise UserError("the prompt is empty: give at least one token")
    bad = [x for x in ids if not 0 <= x < vocab]
    if bad:
        raise UserError(f"prompt ids {bad[:5]} are outside the vocabulary [0, {vocab})")
    t_slots = cache_slots(len(ids), max_new_tokens, policy, draft=False)
    d_slots = cache_slots(len(ids), max_new_tokens, policy, draft=True)
    need = max(t_slots, d_slots if speculative else t_slots)
    if need > load.max_len:
        raise UserError(
            f"prompt ({len(ids)} tokens) + --max-new-tokens {max_new_tokens} + tree room need {need} KV "
            f"slots but the cache holds --max-len {load.max_len}: shorten the prompt or raise --max-len"
        )
    torch_dtype = DTYPES[load.dtype]
    if load.memory_check is not None:
        nbytes = _DTYPE_BYTES[load.dtype]
        models = [(target, t_slots)] + ([(draft, d_slots)] if speculative else [])
        specs = [(dataclasses.replace(ModelSpec.from_config(m, dtype_bytes=nbytes), weight_format=load.weight_format),
                  slots) for m, slots in models]
        load.memory_check(load.device, specs)

    def build(role: str, path: str | Path, seed: int):
        t0 = time.perf_counter()
        model = load_model(path, weights=load.weights, device=load.device, dtype=torch_dtype, seed=seed,
                           kernels=kernels)  # fmt: skip
        if load.progress is not None:
            load.progress(f"generate: {role} {Path(path).name} built ({model.spec.num_layers} layers, "
                          f"{load.weights} weights) in {time.perf_counter() - t0:.1f} s")
        return model

    tmodel = build("target", target, load.seed)
    dmodel = None
    if speculative:
        # random weights: a draft named like the target is the target (a self-draft); else its own seed
        dmodel = build("draft", draft, load.seed if str(draft) == str(target) else load.seed + 1)
    shared = vocab if speculative else None
    target_runner = ModelRunner(tmodel, t_slots, vocab_limit=vocab_cut(tmodel.spec.vocab, shared))
    draft_runner = None
    if dmodel is not None:
        draft_runner = ModelRunner(dmodel, d_slots, vocab_limit=vocab_cut(dmodel.spec.vocab, shared))
    cfg = GenerateConfig(
        mode=mode,
        policy=policy,
        max_new_tokens=max_new_tokens,
        eos_ids=eos_ids_of(target) if eos else (),
        keep_subtree=keep_subtree,
        sampling=sampling,
        loop=load.loop,
    )
    return generate(target_runner, draft_runner, ids, cfg, tokenizer=tokenizer, weights=load.weights,
                    progress=load.progress)
