"""`swiftspec profile compute`: time the runtime's own pieces on one device, at TP-shard shapes.

What is timed (rows of `Profile.compute`, all times are medians in ms, with p10/p90 and the
sample count n):

    forward      one `Transformer.forward` of a TP shard (rank 0 of `tp`, communication skipped)
                 over `tokens` new tokens after `kv_len` cached ones, replayed from the runtime's
                 own `GraphRunner` CUDA graph (eager on CPU). Kept as the ground truth.
    embed        the embedding gather of `tokens` ids (kv_len 0)
    lm_head      final RMSNorm + LM-head matmul of the shard's vocab rows + float cast (kv_len 0)
    layers       forward - embed - lm_head at the same (tokens, kv_len): the decoder stack plus the
                 per-forward RoPE/mask set-up, so that embed + layers + lm_head = forward exactly
    tree_growth  log-softmax + top-w (w=8) over `tokens` rows of fp32 logits of the vocab shard,
                 what `DraftTree.grow` runs on the device (kv_len 0)
    kv_compact   `KVCache.move` of `tokens` slots, all layers of the shard (kv_len 0)
    host         host work of one decoding iteration per mode (model = mode name; see
                 `measure_host`)

A TP shard is profiled on one device with shard-sized shapes (as Vidur does): `load_model` with
`tp_size=t, tp_rank=0, group=None`, random weights at the real shapes, and the two all-reduces per
layer and the logits all-gather replaced by identities (`without_comm`): communication is
profiled separately (`swiftspec profile comm`) and added by the latency model. The full decoder
stack of the shard is built (never "a few layers x num_layers"): a 70B TP-8 shard is 19.5 GB.

Timing: on CUDA, device events around each graph replay,
after warm-up replays, median of many. Small ops (everything but `forward`) are captured `unroll`
times into one CUDA graph so launch gaps do not count, and the time is divided by `unroll`; their
inputs stay L2-warm, as in the runtime, where the forward has just written them.
The first measured replay is dropped. When a shard's weights + KV are smaller than 2 x L2, `R`
independent KV caches (and graphs) are rotated so the L2 cannot serve repeated reads; every
bundled model's shard is far larger than the H200's 60 MB L2, so there R = 1. On CPU the same
code runs eagerly under `time.perf_counter`.

Resumable: every measured row is appended to `<out>/compute.partial.csv` at once; a restart skips
the (op, model, tp, tokens, kv_len) keys found there. The final `compute.csv` and `meta.json`
are written atomically at the end and the partial file is removed. One process writes a folder at
a time (a second gets one line and exit 2), and a run that completes no table leaves the earlier
tables as they were.
"""

from __future__ import annotations

import contextlib
import csv
import gc
import json
import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from swiftspec.files import atomic_write_text, folder_lock, run_metadata
from swiftspec.kernels.reference import rms_norm
from swiftspec.runtime.capture import capture_graphs
from swiftspec.runtime.decoder import PREFILL_CHUNK, ModelRunner
from swiftspec.runtime.generate import GenerateConfig, cache_slots, generate
from swiftspec.runtime.graphs import ForwardClock, GraphRunner
from swiftspec.runtime.kernel_config import (
    ATTENTION_WS_MIN_TOKENS,
    ATTENTION_WS_ROWS,
    WEIGHT_FORMATS,
    KernelConfig,
    profile_settings,
)
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.tree import top_logprobs
from swiftspec.runtime.weights import load_model
from swiftspec.sim.profile_default import HOST_MS
from swiftspec.spec import (
    COMM_COLUMNS,
    LOOPS,
    Mode,
    ModelSpec,
    Profile,
    TreePolicy,
    UserError,
    resolve_model_path,
)

HOST_CAVEAT = "host (tiny stand-in: under-estimates real shapes; `swiftspec validate` calibrates per pair)"
OPS = ("forward", "embed", "lm_head", "layers", "tree_growth", "kv_compact", "host")
COLUMNS = ("op", "model", "tp", "tokens", "kv_len", "ms", "p10", "p90", "n")
PARTIAL = "compute.partial.csv"
TREE_WIDTH = 8  # top-w of tree_growth: the default TreePolicy's w
HOST_MODES = (Mode.autoregressive, Mode.chain, Mode.serial)
HOST_POLICIES = {
    Mode.autoregressive: TreePolicy.autoregressive(),
    Mode.chain: TreePolicy.chain(4),
    Mode.serial: TreePolicy(bs=8, w=8, d=4),
}
PROMPT_LEN = 32  # tokens of each random prompt a host row decodes
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ComputeGrid:
    """What to profile. tokens: forward sizes; kv: cached tokens attended; compact: slots moved."""

    tps: tuple[int, ...]
    tokens: tuple[int, ...]
    kv: tuple[int, ...]
    compact: tuple[int, ...]

    @classmethod
    def default(cls, device: str, quick: bool = False) -> ComputeGrid:
        """GPU: tokens 1..256 x kv {512, 2048, 8192} x tp {1,2,4,6,8}; CPU: smaller (tiny models)."""
        if device == "cuda":
            tokens = (1, 4, 16, 64) if quick else tuple(2**i for i in range(9))
            kv = (512, 2048) if quick else (512, 2048, 8192)
            return cls(tps=(1, 2, 4, 6, 8), tokens=tokens, kv=kv, compact=(*tokens, 512, 1024))
        tokens = (1, 4, 16) if quick else (1, 2, 4, 8, 16, 32, 64)
        kv = (64, 256) if quick else (128, 512, 2048)
        return cls(tps=(1,), tokens=tokens, kv=kv, compact=(*tokens, 512))  # a kept subtree reaches 257


@dataclass(frozen=True)
class TimingConfig:
    """Repeats per point: enough to fill `target_ms` of device time, within [min, max] samples."""

    warmup: int = 3
    min_repeats: int = 5
    max_repeats: int = 30
    target_ms: float = 60.0  # graph replays vary by ~1 %: 5-30 samples give a stable median
    unroll: int = 16  # copies of a small op per captured graph (CUDA only)

    @classmethod
    def for_device(cls, device: str, quick: bool = False) -> TimingConfig:
        if device == "cuda":
            return cls(min_repeats=3, max_repeats=10, target_ms=40.0) if quick else cls()
        return cls(warmup=1, min_repeats=3, max_repeats=9, target_ms=20.0, unroll=1) if quick else cls(
            warmup=2, min_repeats=5, max_repeats=15, target_ms=40.0, unroll=1
        )


# --------------------------------------------------------------------------------------------
# timing primitives


def summarize(samples: Sequence[float]) -> dict:
    """median / p10 / p90 / n of a list of ms samples."""
    a = np.asarray(samples, dtype=float)
    return {"ms": float(np.median(a)), "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90)), "n": len(a)}


class Timer:
    """Times a callable that launches device work: CUDA events on GPU, perf_counter on CPU.

    `time(fns, per_call)` runs the callables round-robin (rotation), returns ms samples, each
    divided by `per_call` (the number of op copies one call runs).
    """

    def __init__(self, device: str, cfg: TimingConfig):
        self.cuda = device == "cuda"
        self.cfg = cfg

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fns: Sequence[Callable[[], object]], per_call: int = 1) -> list[float]:
        cfg = self.cfg
        for _ in range(cfg.warmup):
            for f in fns:
                f()
        self.sync()
        t0 = time.perf_counter()
        fns[0]()
        self.sync()
        est_ms = max((time.perf_counter() - t0) * 1e3, 1e-3)
        n = int(min(cfg.max_repeats, max(cfg.min_repeats, math.ceil(cfg.target_ms / est_ms)))) + 1
        if self.cuda:
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
            for i, (s, e) in enumerate(ev):
                s.record()
                fns[i % len(fns)]()
                e.record()
            torch.cuda.synchronize()
            samples = [s.elapsed_time(e) for s, e in ev]
        else:
            samples = []
            for i in range(n):
                t = time.perf_counter()
                fns[i % len(fns)]()
                samples.append((time.perf_counter() - t) * 1e3)
        # the first sample may include a launch gap (nothing queued before it): drop it
        return [s / per_call for s in samples[1:]]


def graphed(fn: Callable[[], object], device: str, unroll: int) -> tuple[Callable[[], object], int]:
    """On CUDA: `fn` captured up to `unroll` times into one graph -> (replay, copies). On CPU: (fn, 1).

    Copies only pay where launch gaps would show: an op whose eager call (launch + run) takes
    over 0.5 ms is captured once, over 0.1 ms four times.
    """
    if device != "cuda":
        return fn, 1
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
        side.synchronize()
        t = time.perf_counter()
        fn()
        side.synchronize()
        eager_ms = (time.perf_counter() - t) * 1e3
    unroll = 1 if eager_ms > 0.5 else min(unroll, 4) if eager_ms > 0.1 else unroll
    (graph,), _ = capture_graphs([fn], warmup=0, unroll=unroll, stream=side)
    return graph.replay, unroll


# --------------------------------------------------------------------------------------------
# a TP shard without communication


def without_comm(model) -> None:
    """Make a shard model (tp_size > 1, group None) run on one device: all-reduces and the
    logits all-gather become identities. Its logits are then the shard's (T, vocab_local)."""
    if model.tp_size > 1:
        model._all_reduce = lambda x: x
        model._gather_logits = lambda local: local


def shard_model(name_or_path: str, tp: int, device: str, dtype: torch.dtype,
                kernels: KernelConfig | None = None, seed: int = 0):
    """Rank 0 of a `tp`-way shard with random weights at real shapes, communication skipped;
    kernels None: the runtime's defaults for the shard (`KernelConfig.resolve(device, tp_size=tp)`)."""
    kernels = kernels or KernelConfig.resolve(device, tp_size=tp)
    model = load_model(name_or_path, weights="random", device=device, dtype=dtype, tp_rank=0, tp_size=tp, seed=seed,
                       kernels=kernels)  # fmt: skip
    without_comm(model)
    return model


def _randn_(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fill with N(0,1) (never time on zeros: some GPUs run them faster)."""
    return t.copy_(torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32).to(t.dtype))


def _l2_bytes(device: str) -> int:
    if device != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20))


def rotations(working_set: int, device: str) -> int:
    """Independent copies to rotate so the L2 cannot serve repeated reads (1 when ws >= 2 x L2)."""
    l2 = _l2_bytes(device)
    if not l2 or working_set >= 2 * l2:
        return 1
    return min(4, math.ceil(2 * l2 / max(working_set, 1)))


# --------------------------------------------------------------------------------------------
# one shard: every op


@dataclass
class ShardJob:
    """Everything to time for one (model, tp); `done` holds keys already measured."""

    name: str  # ModelSpec name (the `model` column)
    source: str  # bundled name or checkpoint folder
    spec: ModelSpec
    tp: int
    grid: ComputeGrid
    done: set = field(default_factory=set)
    kernels: KernelConfig = field(default_factory=KernelConfig)  # the shard's kernels (fold_norm follows tp)

    def keys(self) -> list[tuple]:
        m, t = self.name, self.tp
        keys = [("forward", m, t, n, kv) for kv in self.grid.kv for n in self.grid.tokens]
        keys += [(op, m, t, n, 0) for op in ("embed", "lm_head", "tree_growth") for n in self.grid.tokens]
        keys += [("kv_compact", m, t, n, 0) for n in self.grid.compact]
        return keys

    def todo(self) -> list[tuple]:
        return [k for k in self.keys() if k not in self.done]


def _shard_bytes(spec: ModelSpec, tp: int, kv_slots: int, dtype_bytes: int) -> int:
    """Weights + one KV cache of `kv_slots` of one shard at `dtype_bytes` per element."""
    w = spec.weight_bytes(tp) // spec.dtype_bytes * dtype_bytes
    return w + kv_slots * spec.kv_bytes_per_token(tp) // spec.dtype_bytes * dtype_bytes


def profile_shard(job: ShardJob, device: str, dtype: torch.dtype, timer: Timer, emit: Callable[[dict], None],
                  progress=None, deadline: float | None = None) -> None:
    """Time every key of `job.todo()` and `emit` one row dict per key."""
    todo = set(job.todo())
    if not todo:
        return
    model = shard_model(job.source, job.tp, device, dtype, job.kernels)
    spec, shard = model.spec, model.shard
    gen = torch.Generator(device=device).manual_seed(1234)
    dev = torch.device(device)
    esize = torch.tensor([], dtype=dtype).element_size()

    def out(op: str, tokens: int, kv: int, samples: list[float]) -> None:
        row = {"op": op, "model": job.name, "tp": job.tp, "tokens": tokens, "kv_len": kv, **summarize(samples)}
        emit(row)
        if progress is not None:
            progress.update(1)

    def expired() -> bool:
        return deadline is not None and time.time() > deadline

    g_unroll = timer.cfg.unroll if device == "cuda" else 1

    # ---- forward: the runtime's GraphRunner, one graph per (tokens, kv) ----------------------
    for kv in job.grid.kv:
        for t in job.grid.tokens:
            if ("forward", job.name, job.tp, t, kv) not in todo or expired():
                continue
            max_len = kv + t
            reps = rotations(_shard_bytes(spec, job.tp, max_len + 1, esize), device)
            tokens = torch.randint(0, spec.vocab, (t,), generator=gen, device=dev)
            positions = torch.arange(kv, kv + t, device=dev)  # a chain: node i at depth i
            mask = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
            fns, keep = [], []
            for _ in range(reps):
                cache = KVCache(spec, shard, max_len, dev, dtype)
                _randn_(cache.kv, gen)
                if device == "cuda":
                    runner = GraphRunner(model, cache, buckets=(t,), max_tree=t, warmup=2)
                    runner.run(tokens, positions, positions, kv, mask)  # sets the static inputs
                    fns.append(runner.graphs[t].replay)
                    keep.append(runner)
                else:
                    fns.append(lambda c=cache, a=(tokens, positions, kv, mask): model(a[0], a[1], c, a[1], a[2], a[3]))
                keep.append(cache)
            out("forward", t, kv, timer.time(fns))
            del fns, keep

    # ---- embed, lm_head, tree_growth: small ops, graph-captured `unroll` times ---------------
    x_all = torch.empty(max(job.grid.tokens), spec.hidden, device=dev, dtype=dtype)
    _randn_(x_all, gen)
    for t in job.grid.tokens:
        if expired():
            break
        ids = torch.randint(0, spec.vocab, (t,), generator=gen, device=dev)
        x = x_all[:t]
        logits = torch.empty(t, shard.vocab, device=dev, dtype=torch.float32)
        _randn_(logits, gen)
        k = min(TREE_WIDTH, shard.vocab)
        small = {
            "embed": lambda ids=ids: model.embed[ids],
            "lm_head": lambda x=x: model._lin(rms_norm(x, model.norm, spec.rms_eps), model.lm_head, None, model.lm_head_quant).float(),
            # what DraftTree.grow runs
            "tree_growth": lambda lg=logits, k=k: top_logprobs(lg, k, model.kernels.tree_growth),
        }
        for op, fn in small.items():
            if (op, job.name, job.tp, t, 0) in todo:
                f, per = graphed(fn, device, g_unroll)
                out(op, t, 0, timer.time([f], per_call=per))

    # ---- kv_compact: KVCache.move of `t` slots (all layers) -----------------------------------
    big = max(job.grid.compact)
    cache = KVCache(spec, shard, 2 * big + 8, dev, dtype)
    _randn_(cache.kv, gen)
    for t in job.grid.compact:
        if ("kv_compact", job.name, job.tp, t, 0) not in todo or expired():
            continue
        # a surviving subtree scattered behind the prefix, gathered into place (every other slot)
        src = torch.arange(8, 8 + 2 * t, 2, device=dev)
        f, per = graphed(lambda src=src: cache.move(src, 4), device, g_unroll)
        out("kv_compact", t, 0, timer.time([f], per_call=per))


# --------------------------------------------------------------------------------------------
# host overhead of one iteration


def _tiny_config_dir() -> Path:
    """A config.json of a tiny Llama (random weights are made from it): GPU work ~ launch cost."""
    folder = Path(tempfile.mkdtemp(prefix="swiftspec-host-"))
    cfg = dict(
        model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
        max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="float32",
    )  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _async_host_row() -> dict:
    """`async` host work is not measured here (it needs the multi-process runtime): the derived
    profile's value, marked by n = 0, so plans for async mode still work from this profile."""
    ms = HOST_MS[Mode.async_.value]
    return {"op": "host", "model": Mode.async_.value, "tp": 1, "tokens": 0, "kv_len": 0, "ms": ms, "p10": ms,
            "p90": ms, "n": 0}


def measure_host(device: str, modes: Iterable[Mode] = HOST_MODES, prompts: int = 3, new_tokens: int = 48,
                 seed: int = 0, loop: str = "host") -> list[dict]:
    """Host work of one iteration per mode (ms): iteration wall time minus the forwards' device time.

    Runs the runtime's own `generate` loop (tree growth, selection, verification, KV compaction,
    graph input copies, device syncs) on a tiny Llama (hidden 64, 2 layers, vocab 256, random
    weights; the draft is the same model, so trees are accepted deeply and KV compaction runs
    every iteration). Caveat, found by `swiftspec validate` on the H200: host work is NOT independent
    of the model: eager log-softmax/top-w, argmax and logits copies scale with the vocabulary and
    graph launches with the layers, so these rows under-estimate real shapes (≈ 2× on the
    bundled models); `validate` calibrates on stand-ins with the real vocabulary and depth instead.
    For each decode, host = (decode wall time - sum of the decode forwards' device time, from
    events around each graph replay on CUDA, perf_counter around each eager forward on CPU) /
    iterations; the row is the median over `prompts` decodes, after one warm-up decode on the same
    runners (graph captures, the device loop's included, and first allocations are not host work of
    an iteration). The device time of log-softmax/top-w and of `KVCache.move` stays in host
    (launch-bound at this size, a few µs); the profile's `tree_growth` and `kv_compact` rows hold
    their device time at real shapes. `async` needs the multi-process runtime and is not measured
    here. loop: the decoding loop measured (`GenerateConfig.loop`); for the device loop the
    subtracted device time is its graphs' (tree kernels included), so the rows hold what the host
    adds.
    """
    folder = _tiny_config_dir()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = load_model(folder, weights="random", device=device, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for mode in modes:
        policy = HOST_POLICIES[mode]
        per_decode = []
        speculative = mode is not Mode.autoregressive
        target = ModelRunner(model, cache_slots(PROMPT_LEN, new_tokens, policy, draft=False))
        draft = ModelRunner(model, cache_slots(PROMPT_LEN, new_tokens, policy, draft=True)) if speculative else None
        clocks = [ForwardClock([r]) for r in (target, draft) if r is not None]
        cfg = GenerateConfig(mode=mode, policy=policy, max_new_tokens=new_tokens, loop=loop)
        for rep in range(prompts + 1):
            ids = torch.randint(0, model.spec.vocab, (PROMPT_LEN,), generator=gen).tolist()
            for r in (target, draft):
                if r is not None:
                    r.reset()
            for clock in clocks:
                clock.take()
            res = generate(target, draft, ids, cfg)
            if device == "cuda":
                torch.cuda.synchronize()
            skip = math.ceil((len(ids) - 1) / PREFILL_CHUNK)  # prefill forwards come first
            fwd = sum(clock.take(skip) for clock in clocks)
            if loop == "device":  # its forwards run inside its own graphs (CPU: its phases)
                fwd = res.loop_device_ms()
            if rep > 0:  # the first decode warms up: graph captures (the device loop's too), allocations
                per_decode.append((res.decode_s * 1e3 - fwd) / res.iterations)
        rows.append({"op": "host", "model": mode.value, "tp": 1, "tokens": 0, "kv_len": 0, **summarize(per_decode)})
    with contextlib.suppress(OSError):
        (folder / "config.json").unlink()
        folder.rmdir()
    return rows


# --------------------------------------------------------------------------------------------
# the whole run: grid, resume, output


def shape_key(spec: ModelSpec) -> tuple:
    """Fields that decide a shard's latency (name, RoPE and tied embeddings do not)."""
    return (spec.architecture, spec.num_layers, spec.hidden, spec.num_heads, spec.num_kv_heads, spec.head_dim,
            spec.ffn, spec.vocab, spec.qkv_bias)  # fmt: skip


def derive_layers(df: pd.DataFrame) -> pd.DataFrame:
    """`layers` rows = forward - embed - lm_head at the same (model, tp, tokens) (see module doc)."""
    fwd = df[df["op"] == "forward"]
    if fwd.empty:
        return df.iloc[0:0]
    small = df[df["op"].isin(["embed", "lm_head"])].pivot_table(
        index=["model", "tp", "tokens"], columns="op", values="ms", aggfunc="median"
    )
    rows = []
    for r in fwd.itertuples(index=False):
        key = (r.model, r.tp, r.tokens)
        if key not in small.index or small.loc[key].isna().any():
            continue
        extra = float(small.loc[key, "embed"] + small.loc[key, "lm_head"])
        floor = 0.05 * r.ms  # never below 5 % of the forward (noise on tiny CPU models)
        rows.append({"op": "layers", "model": r.model, "tp": r.tp, "tokens": r.tokens, "kv_len": r.kv_len,
                     "ms": max(r.ms - extra, floor), "p10": max(r.p10 - extra, floor),
                     "p90": max(r.p90 - extra, floor), "n": r.n})  # fmt: skip
    return pd.DataFrame(rows, columns=list(COLUMNS))


def _read_partial(path: Path) -> pd.DataFrame:
    if not path.exists():
        return pd.DataFrame(columns=list(COLUMNS))
    try:
        return pd.read_csv(path)
    except (ValueError, pd.errors.ParserError, pd.errors.EmptyDataError):
        raise UserError(f"{path} is corrupt: delete it to start the profile afresh") from None


@dataclass
class ComputeResult:
    """What `profile_compute` did: the output folder, its table, skipped (model, tp) with reasons."""

    out: Path
    compute: pd.DataFrame
    skipped: list[str]
    missing: int  # keys not measured because the time budget ran out (shards that do not fit: `skipped`)


def _parse_models(models: Sequence[str]) -> list[tuple[str, str, ModelSpec]]:
    out = []
    for m in models:
        folder = resolve_model_path(m)  # UserError for unknown names / folders without config.json
        spec = ModelSpec.from_config(folder)
        out.append((spec.name, str(m), spec))
    return out


@dataclass(frozen=True)
class ComputeOptions:
    """What `profile_compute` measures and how, beyond the grid and the timing.

    dtype: "bfloat16" | "float16" | "float32" (None: bfloat16 on CUDA, float32 on CPU).
    host: also time host work per iteration, over `host_decodes` = (prompts, new tokens) decodes
    per mode. alias: models whose shapes equal an earlier model's are not re-timed; its rows are
    copied under their name (meta.json `aliases`). attention: the tree attention to time ("auto" =
    the runtime's default for the device, "torch" SDPA or "triton"); the other kernels are the
    runtime's defaults. weight_format: "native", "fp8" or "int4" (recorded in meta.json and the profile's
    label; a folder keeps one format). attention_ws: "auto", "on" or "off", the Gluon tree attention
    for many-row forwards. time_budget_s: stop starting new points after this many seconds and
    write what was measured (meta.json `incomplete` says so). loop: the decoding loop whose host
    work the host rows measure (meta.json `loop`; `run` and `validate` then run that loop by
    default; a folder keeps one loop). None: a resumed folder's loop, else "device" on CUDA (faster
    in every configuration measured, docs/performance.md) and "host" on CPU (eager: no syncs to save).
    """

    dtype: str | None = None
    host: bool = True
    host_decodes: tuple[int, int] = (3, 48)
    alias: bool = True
    attention: str = "auto"
    weight_format: str = "native"
    attention_ws: str = "auto"
    time_budget_s: float | None = None
    loop: str | None = None

    def kernel_choices(self, device: str) -> dict:
        """The `KernelConfig.resolve` choices these options make (UserError for a bad one)."""
        if self.weight_format not in WEIGHT_FORMATS:
            raise UserError(f"--weight-format must be one of {', '.join(WEIGHT_FORMATS)}, "
                            f"got {self.weight_format!r}")
        if self.attention_ws not in ("auto", "on", "off"):
            raise UserError(f"attention_ws must be one of auto, on, off, got {self.attention_ws!r}")
        choices = {"weight_format": self.weight_format, "attention": self.attention}
        if self.attention_ws == "on":
            triton = KernelConfig.resolve(device, attention=self.attention).attention == "triton"
            if device != "cuda" or not triton:
                raise UserError("attention_ws 'on' needs a CUDA GPU and attention 'triton'")
            choices.update(attention_ws_rows=ATTENTION_WS_ROWS,
                           attention_ws_min_tokens=ATTENTION_WS_MIN_TOKENS)
        elif self.attention_ws == "off":
            choices.update(attention_ws_rows=0, attention_ws_min_tokens=0)
        return choices


def profile_compute(
    models: Sequence[str],
    out: str | Path,
    *,
    device: str = "cuda",
    grid: ComputeGrid | None = None,
    timing: TimingConfig | None = None,
    options: ComputeOptions | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
) -> ComputeResult:
    """Profile `models` (bundled names or checkpoint folders) into `out` (see the module docstring).

    options: dtype, host rows, aliasing, kernels and time budget (`ComputeOptions`). meta.json
    records the kernels profiled (`kernel_config.profile_settings`), so a plan only predicts a
    runtime whose kernels are these. log: called with one line per finished (model, tp) (for
    non-interactive runs).

    `out` is locked for the whole run (`files.folder_lock`): a second process profiling into it
    gets UserError at once, so two runs never interleave rows in one partial file. A run that
    completes no table leaves an earlier compute.csv and meta.json as they were and raises
    UserError (its rows stay in the partial file, for the next run to resume); one that completes
    some tables writes them (with the earlier rows it did not re-measure) and reports the rest in
    `missing`.
    """
    with folder_lock(out, "profile compute"):
        return _profile_compute(models, Path(out), device=device, grid=grid, timing=timing,
                                options=options, progress=progress, log=log)  # fmt: skip


def _profile_compute(
    models: Sequence[str],
    out: Path,
    *,
    device: str,
    grid: ComputeGrid | None,
    timing: TimingConfig | None,
    options: ComputeOptions | None,
    progress: bool,
    log: Callable[[str], None] | None,
) -> ComputeResult:
    """`profile_compute` with `out` locked."""
    opts = options or ComputeOptions()
    host, alias, weight_format = opts.host, opts.alias, opts.weight_format
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but no CUDA GPU is available: use --device cpu")
    if not models:
        raise UserError("give at least one model: --models NAME|PATH,...")
    dtype = opts.dtype or ("bfloat16" if device == "cuda" else "float32")
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    grid = grid or ComputeGrid.default(device)
    for name, vals in (("--tp", grid.tps), ("--tokens", grid.tokens), ("--kv", grid.kv)):
        if not vals or any(v < 1 for v in vals):
            raise UserError(f"{name} needs positive integers, got {list(vals)}")
    timing = timing or TimingConfig.for_device(device)
    # what the profiled forwards run: the device defaults, with the attention asked for
    choices = opts.kernel_choices(device)
    kernels = profile_settings(device, **choices)
    parsed = _parse_models(models)
    out = Path(out)
    old_meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    if old_meta.get("weight_format", "native") != weight_format and (
            (out / "compute.csv").exists() or (out / PARTIAL).exists()):  # fmt: skip
        raise UserError(f"{out} holds a {old_meta.get('weight_format', 'native')}-weight profile: write the "
                        f"{weight_format} one to another folder (-o)")
    old_loop = old_meta.get("loop", "host") if (out / "compute.csv").exists() else None
    loop = opts.loop or old_loop or ("device" if device == "cuda" else "host")
    if loop not in LOOPS:
        raise UserError(f"--loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if old_loop not in (None, loop):
        raise UserError(f"{out} holds host rows of the {old_loop} loop: write the {loop} "
                        "loop's profile to another folder (-o)")
    out.mkdir(parents=True, exist_ok=True)
    partial_path = out / PARTIAL
    partial = _read_partial(partial_path)
    done = {tuple(k) for k in partial[["op", "model", "tp", "tokens", "kv_len"]].itertuples(index=False, name=None)}
    deadline = time.time() + opts.time_budget_s if opts.time_budget_s else None

    jobs, aliases, seen, skipped = [], {}, {}, []
    no_room: set[tuple[str, int]] = set()  # (model, tp) shards that do not fit the device
    for name, source, spec in parsed:
        key = shape_key(spec)
        if alias and key in seen and seen[key] != name:
            aliases[name] = seen[key]
            continue
        seen.setdefault(key, name)
        for tp in grid.tps:
            shard_kernels = KernelConfig.resolve(device, tp_size=tp, **choices)
            jobs.append(ShardJob(name, source, spec, tp, grid, done, shard_kernels))
    host_keys = [("host", m.value, 1, 0, 0) for m in HOST_MODES] if host else []

    fh = partial_path.open("a", newline="")
    writer = csv.DictWriter(fh, fieldnames=list(COLUMNS))
    if partial_path.stat().st_size == 0:
        writer.writeheader()

    def emit(row: dict) -> None:
        writer.writerow({k: row[k] for k in COLUMNS})
        fh.flush()
        done.add((row["op"], row["model"], row["tp"], row["tokens"], row["kv_len"]))

    total = sum(len(j.todo()) for j in jobs) + sum(k not in done for k in host_keys)
    bar = None
    if progress:
        bar = tqdm(total=total, desc="profile compute", unit="pt", dynamic_ncols=True)
    timer = Timer(device, timing)
    esize = torch.tensor([], dtype=torch_dtype).element_size()
    t_start = time.time()
    try:
        # host work first: seconds of work, and the per-iteration cost every plan needs
        if host and not all(k in done for k in host_keys) and (deadline is None or time.time() < deadline):
            for row in measure_host(device, prompts=opts.host_decodes[0], new_tokens=opts.host_decodes[1],
                                    loop=loop):
                if (row["op"], row["model"], 1, 0, 0) not in done:
                    emit(row)
                    if bar is not None:
                        bar.update(1)
        for job in jobs:
            if deadline is not None and time.time() > deadline:
                break
            if not job.todo():
                continue
            if device == "cuda":
                free, total = torch.cuda.mem_get_info()
                # margin: graph pools, logits, allocator slack; a shard that barely fits has no room for
                # KV in practice and an OOM inside a graph capture is hard to recover from
                margin = max(2 * 2**30, int(0.05 * total))
                spec = replace(job.spec, weight_format=weight_format)  # fp8: quantized while loading
                need = _shard_bytes(spec, job.tp, max(grid.kv) + max(grid.tokens) + 1, esize) + margin
                if need > free:
                    skipped.append(f"{job.name} tp{job.tp}: needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
                    no_room.add((job.name, job.tp))
                    if bar is not None:
                        bar.update(len(job.todo()))
                    continue
            if bar is not None:
                bar.set_postfix_str(f"{job.name} tp{job.tp}")
            t_job, n_before = time.time(), len(done)
            try:
                profile_shard(job, device, torch_dtype, timer, emit, bar, deadline)
            except torch.cuda.OutOfMemoryError:
                skipped.append(f"{job.name} tp{job.tp}: out of device memory")
                no_room.add((job.name, job.tp))
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()  # the shard's weights, caches and graphs are gone now
            if log is not None:
                log(f"{job.name} tp{job.tp}: {len(done) - n_before} points in {time.time() - t_job:.1f} s "
                    f"(total {time.time() - t_start:.0f} s)")
    finally:
        fh.close()
        if bar is not None:
            bar.close()

    measured = _read_partial(partial_path)
    # layers rows are derived below; a partial built from a finished compute.csv carries them too
    measured = measured[measured["op"] != "layers"]
    wanted = {k for j in jobs for k in j.keys()} | set(host_keys)
    have = {tuple(k) for k in measured[["op", "model", "tp", "tokens", "kv_len"]].itertuples(index=False, name=None)}
    missing = budget_missing(wanted, have, no_room)
    # a table cut short by the time budget stays in the partial file only: the latency model
    # needs full grids (layers follows forward)
    cut = sorted({(op, m, tp) for op, m, tp, *_ in wanted - have})
    cut += [("layers", m, tp) for op, m, tp in cut if op == "forward"]

    def uncut(df: pd.DataFrame) -> pd.DataFrame:
        return df[np.array([k not in set(cut) for k in zip(df["op"], df["model"], df["tp"])], dtype=bool)]

    if uncut(measured).empty and (out / "compute.csv").exists():  # nothing new: the measured tables stay
        why = f"; skipped {skipped[0]}" if skipped else " (the time budget ran out)" if missing else ""
        raise UserError(f"profile compute completed no table{why}: kept {out}/compute.csv and meta.json as they "
                        f"were; rows measured so far are in {partial_path}: run the same command again (with more "
                        f"--time-budget) to resume")
    measured = uncut(measured)
    compute = uncut(pd.concat([measured, derive_layers(measured)], ignore_index=True))
    if host and not ((compute["op"] == "host") & (compute["model"] == Mode.async_.value)).any():
        compute = pd.concat([compute, pd.DataFrame([_async_host_row()])], ignore_index=True)
    for name, src in aliases.items():
        rows = compute[(compute["model"] == src) & (compute["op"] != "host")].assign(model=name)
        compute = pd.concat([compute, rows], ignore_index=True)
    compute = _merge_existing(out / "compute.csv", compute)
    compute = compute.sort_values(["op", "model", "tp", "kv_len", "tokens"], kind="stable").reset_index(drop=True)

    meta = run_metadata(device)
    meta.update(
        source="measured",
        dtype=dtype,
        loop=loop,
        **kernels,
        weights="random (real shapes)",
        grid=asdict(grid),
        timing=asdict(timing),
        aliases=aliases,
        skipped=skipped,
        incomplete=bool(cut),
        incomplete_tables=[f"{op} {m} tp{tp}" for op, m, tp in cut],
        # named in the profile's label (Profile.label), so every plan that uses it says so
        unmeasured=[HOST_CAVEAT, "host async (copied from the derived profile)"] if host else [],
        notes=[
            "forward: Transformer.forward of rank 0 of a TP shard, communication skipped, replayed "
            "from the runtime's GraphRunner CUDA graph (eager on CPU); layers = forward - embed - lm_head.",
            "embed, lm_head, tree_growth (log-softmax + top-8 over the vocab shard), kv_compact "
            "(KVCache.move, all layers): device time, graph-captured x unroll on CUDA.",
            measure_host.__doc__.split("\n\n")[1].replace("\n", " ").replace("    ", " ").strip(),
            "host async (n = 0): NOT measured, copied from the derived profile (SwiftSpec Table 7 gap); "
            "measure it with the multi-process runtime (swiftspec run).",
            "medians of n samples after warm-up (p10/p90 beside); CUDA events on GPU, perf_counter on CPU.",
        ],
    )
    if device == "cpu":
        meta["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    write_profile_files(out, compute=compute, meta_update={"compute": meta}, top_meta=meta)
    if missing == 0:
        partial_path.unlink(missing_ok=True)
    return ComputeResult(out=out, compute=compute, skipped=skipped, missing=missing)


def budget_missing(wanted: set[tuple], have: set[tuple], no_room: set[tuple[str, int]]) -> int:
    """Points (op, model, tp, tokens, kv_len) wanted but not measured because the time budget ran out:
    shards that do not fit the device (`no_room`, (model, tp)) are skipped, not missing, so a
    rerun cannot measure them and the partial file need not stay for them."""
    return sum((m, tp) not in no_room for _, m, tp, *_ in wanted - have)


def _merge_existing(path: Path, new: pd.DataFrame) -> pd.DataFrame:
    """Rows of an earlier compute.csv in the folder whose keys this run did not measure, + `new`."""
    if not path.exists():
        return new
    old = pd.read_csv(path)
    keys = ["op", "model", "tp", "tokens", "kv_len"]
    new_keys = set(new[keys].itertuples(index=False, name=None))
    keep = old[[k not in new_keys for k in old[keys].itertuples(index=False, name=None)]]
    return pd.concat([keep, new], ignore_index=True) if len(keep) else new


def write_profile_files(out: Path, *, compute: pd.DataFrame | None = None, comm: pd.DataFrame | None = None,
                        meta_update: dict | None = None, top_meta: dict | None = None) -> None:
    """Write compute.csv / comm.csv / meta.json of a profile folder, each atomically.

    meta.json is merged: `meta_update` keys (e.g. "compute", "comm": the metadata of that run)
    replace their old values, `top_meta` fills the top-level fields (gpu, date, ...) when given
    or when meta.json is new. A folder without comm.csv gets an empty one (header only).
    """
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if top_meta is not None or not meta:
        base = dict(top_meta or {})
        for k in ("compute", "comm"):
            if k in meta:
                base[k] = meta[k]
        meta = base
    meta.update(meta_update or {})
    meta.setdefault("source", "measured")
    if compute is not None:
        atomic_write_text(out / "compute.csv", compute.to_csv(index=False))
    if comm is not None:
        atomic_write_text(out / "comm.csv", comm.to_csv(index=False))
    elif not (out / "comm.csv").exists():
        atomic_write_text(out / "comm.csv", pd.DataFrame(columns=list(COMM_COLUMNS)).to_csv(index=False))
    atomic_write_text(meta_path, json.dumps(meta, indent=2, default=str) + "\n")
    if (out / "compute.csv").exists():
        Profile.load(out)  # the folder must load as a Profile (raises UserError otherwise)
