"""Decode/verify step with the per-layer small ops fused three ways, against the HBM floor.

    python benchmarks/bench_step_kernels.py                 # on the H200: < 3 minutes
    TRITON_INTERPRET=1 python benchmarks/bench_step_kernels.py --device cpu --models PATH \\
        --tokens 1,4 --kv 32 --reps 2 --warmup 0 --out /tmp/bsk   # CPU smoke run (tiny checkpoint folder)

Step ("kind" = step): Llama-3-8B and Llama-3.2-1B shapes (random bf16 weights), 1 and 64 new tokens
(decode; tree verify with a causal mask), kv 1024 and 4096, Triton tree attention. Each mode
(--fusions) is one `KernelConfig` over the same loaded weights (`Transformer.with_kernels`):
fusion "off" (eager ops), "compile" (torch.compile of RMSNorm / RoPE / silu*up) or "triton"
(swiftspec.kernels: add+RMSNorm, RoPE+KV write, silu*up; 4 launches per layer), then suffixes:
"+gemv" the skinny linear for forwards of <= 16 tokens (linear "triton"; "+gemvN" up to N tokens);
"+pdl" programmatic dependent launch of every Triton kernel ("+pdllate" its late mode, where each
kernel lets the next launch only after its main loop, "+pdlnp" early without the skinny linear's
peeled first tile, "+pdlpf" early with the skinny linear's L2 prefetch of its first weight lines);
"+kernelcombine" tree attention's in-kernel split merge; "+linearcombine" the skinny linear's
split-K sum inside its launch (`KernelConfig.linear_combine`); "+splitnR" (e.g. +splitn24576)
int4 linears split K only up to R output rows (`KernelConfig.linear_split_max_n`); "+wsN" (e.g. +ws128)
tree attention of at least N rows (tokens x group) per KV head through the warp-specialized Gluon
kernel; "+foldnorm" each add+RMSNorm inside the skinny linear after it (the norm weights are then
folded into the GEMM weights before any mode runs, so every mode runs the same model); "+swiglu"
silu*up in the gate/up skinny linear's epilogue; "+rope" RoPE + the KV write in the qkv one's;
"+fp8" a second copy of the model with weight-only fp8 GEMM weights (with "gemv" the fp8 skinny
linear runs every forward) against its own floor (`bytes_read` of the fp8 spec), its logits
differing from "off" by the quantization; "+int4" the same with W4A16 GEMM weights (round-to-nearest,
groups of 128, `kernels.int4`; floor at half a byte per weight plus scales and zeros). Without a suffix a choice is off, although the runtime's
defaults on CUDA turn most of them on (`KernelConfig.resolve`).
Timed through `GraphRunner.run` with host inputs (one pinned host-to-device copy of the inputs, the
graph replay, the logits copy: what `ModelRunner` pays per step) and as the bare replay, over the
HBM floor = (weights + KV bytes) / device-to-device copy bandwidth measured in the same run (the
definition of benchmarks/bench_step.py). Also per mode: device ops (kernels + memsets) of one eager
forward of 1 token, counted with torch.profiler, and the logits' agreement with "off" (max
relative error, argmax agreement) on the same inputs. `pred_ms` is the prediction written down
before the first run. "gemm_only" rows: the step's GEMMs alone in one graph (the part no small-op
fusion can remove), with `F.linear` (cuBLAS) and, for <= --gemm-gemv-rows tokens (16), the Triton
skinny linear (`impl` column).

Breakdown ("kind" = breakdown, CUDA only, first kv and --breakdown-tokens): torch.profiler over 5
graph replays of the step: per kernel category (linear, attention, norm, rope_kv, act, other) the
kernels per step and their summed µs per step, and "wall" = the replay's own time: wall minus the
summed kernels is the time between kernels (launch gaps); with PDL, kernels overlap their
neighbours (time spent waiting counts in their durations), so the sum can exceed the wall time.
Rows of kind breakdown_kernel split the same replays per kernel name (`kernel`, `median_us` per call).

Kernels ("kind" = kernel): each fused kernel against the eager ops it replaces and their
torch.compile version, at the same model's shapes, 1 and 64 tokens: µs per call inside a CUDA
graph of 20 calls (inputs L2-resident, as in the step where the GEMM just wrote them), and the
kernel's bytes floor.

Order: with `--rounds N` every mode is measured N times, the order of --fusions reversed every
other round (rows: `round`, `position`); the tables show medians over rounds (an order effect made
the same cuBLAS GEMMs up to 10 % slower in whichever mode came second, and rounds of whole modes
still differ by up to 10 %: docs/decisions.md). `--paired` captures every mode at
once and alternates them step by step, in an order rotated every round (rows kind "paired": each
mode's time and its ratio to the first mode's in the same round, median and p10/p90 over --reps
rounds). A drift then moves both sides of every ratio alike: meant for A/B decisions.

Writes benchmarks/results/bench_step_kernels-<date>.{json,csv} with run_metadata(); prints tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import time_calls  # noqa: E402  (sibling script: CUDA-graph timing of many calls)
from bench_step import _free, _q, bytes_read, copy_bandwidth  # noqa: E402  (the floor as bench_step defines it)

from swiftspec.files import atomic_write_text, run_metadata  # noqa: E402
from swiftspec.kernels.gemv import MAX_ROWS, MAX_ROWS_DOT, gemv  # noqa: E402
from swiftspec.kernels.reference import apply_rope, rms_norm, silu_mul  # noqa: E402
from swiftspec.kernels.rmsnorm import add_rmsnorm  # noqa: E402
from swiftspec.kernels.rope_kv import rope_kv  # noqa: E402
from swiftspec.kernels.silu_mul import silu_mul as silu_mul_kernel  # noqa: E402
from swiftspec.profiler.calibrate import time_ms  # noqa: E402
from swiftspec.profiler.compute import without_comm  # noqa: E402
from swiftspec.runtime.graphs import GraphRunner  # noqa: E402
from swiftspec.runtime.kernel_config import KernelConfig  # noqa: E402
from swiftspec.runtime.kv_cache import KVCache  # noqa: E402
from swiftspec.runtime.weights import load_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

# Predictions for fusion "triton" (ms per GraphRunner.run step), written down before any GPU run.
# Key: (model, tokens, kv_len).
PRED_MS = {
    ("Llama-3-8B", 1, 1024): 4.91, ("Llama-3-8B", 1, 4096): 5.22,
    ("Llama-3-8B", 64, 1024): 5.65, ("Llama-3-8B", 64, 4096): 6.50,
    ("Llama-3.2-1B", 1, 1024): 1.17, ("Llama-3.2-1B", 1, 4096): 1.28,
    ("Llama-3.2-1B", 64, 1024): 1.40, ("Llama-3.2-1B", 64, 4096): 1.67,
}  # fmt: skip


def device_ops(model, cache: KVCache, device: torch.device) -> float:
    """Kernels + memsets/memcpys one eager forward of 1 token puts on the GPU (torch.profiler);
    NaN on CPU. The same ops are the nodes of the captured graph."""
    if device.type != "cuda":
        return float("nan")
    one = torch.ones(1, dtype=torch.long, device=device)
    args = (one, one, cache, one, 1, torch.ones(1, 1, dtype=torch.bool, device=device))
    model(*args)  # compiled / JIT-ed already by the graph warm-up; once more to be sure
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model(*args)
        torch.cuda.synchronize()
    return float(sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA))


def step_inputs(spec, t: int, kv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(tokens (t,), positions (t,), causal tree mask (t, t)) of one step after kv cached tokens, as
    host (CPU) tensors: what `ModelRunner` hands `GraphRunner.run`, which stages them with one
    pinned host-to-device copy (device tensors would take its ~8-op device-copy path instead)."""
    gen = torch.Generator().manual_seed(t)
    toks = torch.randint(0, spec.vocab, (t,), generator=gen)
    return toks, kv + torch.arange(t), torch.ones(t, t, dtype=torch.bool).tril()


def step_rows(args, runner: GraphRunner, spec, kv: int, base: dict, bw: float, logits: dict) -> list[dict]:
    """Time every token count through `runner`; compare logits with those of fusion "off"."""
    device, rows = runner.model.device, []
    for t in args.tokens:
        toks, pos, mask = step_inputs(spec, t, kv)
        ms = time_ms(lambda: runner.run(toks, pos, pos, kv, mask), args.reps, args.warmup, device)  # noqa: B023
        out = runner.run(toks, pos, pos, kv, mask).float().clone()  # not the graph's static output
        ref = logits.setdefault((kv, t), out) if base["fusion"] == "off" else logits.get((kv, t))
        nbytes = bytes_read(dataclasses.replace(spec, weight_format=base["weight_format"]), t, kv, args.tp)
        row = {**base, "tokens": t, "floor_ms": nbytes / bw * 1e3, "bytes": nbytes,
               "median_ms": statistics.median(ms), "p10_ms": _q(ms, 0.1), "p90_ms": _q(ms, 0.9), "reps": len(ms),
               "pred_ms": PRED_MS.get((spec.name, t, kv), float("nan")) if base["fusion"] == "triton" else float("nan")}  # fmt: skip
        if runner.use_graphs:
            row["replay_ms"] = statistics.median(time_ms(runner.graphs[runner.bucket(t)].replay, args.reps, 3, device))
            if kv == args.kv[0] and base["round"] == 0 and t in args.breakdown_tokens:
                rows += breakdown_rows(runner.graphs[runner.bucket(t)], {**base, "tokens": t})
        if ref is not None:
            row["max_rel_err_vs_off"] = float((out - ref).abs().max() / ref.abs().max())
            row["argmax_agree_vs_off"] = float((out.argmax(-1) == ref.argmax(-1)).float().mean())
        rows.append(row)
    return rows


def paired_rows(args, setup: Callable, cache: KVCache, spec, kv: int, bw: float) -> list[dict]:
    """--paired: every fusion captured at once, then per token count `reps` rounds of one step each,
    in an order rotated every round, so clock drift and neighbours' noise hit all fusions alike.
    Rows (kind "paired"): each fusion's median / p10 / p90 ms and the median (p10, p90) over rounds of
    its time / the first fusion's time in the same round (`ratio_vs_first`)."""
    device, rows, runners = cache.k.device, [], []
    for fusion in args.fusions:
        model = setup(fusion)
        runners.append((fusion, GraphRunner(model, cache, buckets=tuple(args.tokens), max_tree=max(args.tokens))))
    for t in args.tokens:
        toks, pos, mask = step_inputs(spec, t, kv)
        times: dict[str, list[float]] = {f: [] for f, _ in runners}
        outs = {}
        for r in range(args.reps + args.warmup):  # warm-up rounds first
            k = r % len(runners)
            for fusion, runner in runners[k:] + runners[:k]:
                ms = time_ms(functools.partial(runner.run, toks, pos, pos, kv, mask), 1, 0, device)
                if r >= args.warmup:
                    times[fusion] += ms
        for fusion, runner in runners:
            # clone: float32 logits are the graph's static output, and runners may share its memory
            outs[fusion] = runner.run(toks, pos, pos, kv, mask).float().clone()
        first = args.fusions[0]
        for fusion, ms in times.items():
            ratios = [a / b for a, b in zip(ms, times[first])]
            fmt = _weight_format(fusion)
            nbytes = bytes_read(dataclasses.replace(spec, weight_format=fmt), t, kv, args.tp)
            ref = outs[first]
            rows.append(dict(kind="paired", model=spec.name, tp=args.tp, layers=spec.num_layers, kv_len=kv, fusion=fusion,
                             attention=args.attention, weight_format=fmt, tokens=t, floor_ms=nbytes / bw * 1e3,
                             bytes=nbytes, median_ms=statistics.median(ms), p10_ms=_q(ms, 0.1), p90_ms=_q(ms, 0.9),
                             reps=len(ms), vs=first, ratio_vs_first=statistics.median(ratios),
                             ratio_p10=_q(ratios, 0.1), ratio_p90=_q(ratios, 0.9),
                             max_rel_err_vs_first=float((outs[fusion] - ref).abs().max() / ref.abs().max())))  # fmt: skip
        print(f"{spec.name} kv {kv} T={t} paired: " + ", ".join(
            f"{r['fusion']} {r['median_ms']:.3f} ms ({r['ratio_vs_first']:.3f}x)" for r in rows if r["tokens"] == t),
            flush=True)  # fmt: skip
    return rows


def kernel_category(name: str) -> str:
    """Category of a kernel name as the profiler reports it (Triton: the jit function's name)."""
    n = name.lower()
    for cat, keys in (("attention", ("tree_attn", "ws_attn", "combine_kernel", "pack_mask", "flash", "sdpa", "attention")),
                      ("norm", ("rmsnorm",)), ("rope_kv", ("rope",)), ("act", ("silu",)),
                      ("linear", ("gemv", "skinny", "gemm", "nvjet", "cutlass", "sm90_xmma", "cublas"))):
        if any(k in n for k in keys):
            return cat
    return "other"


def breakdown_rows(graph: torch.cuda.CUDAGraph, base: dict, replays: int = 5) -> list[dict]:
    """Per kernel category: kernels and summed µs per replay of `graph` (torch.profiler, CUPTI), plus
    the replay's wall time (CUDA events, same replays)."""
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
    wall_us = start.elapsed_time(end) * 1e3 / replays
    by_name: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            by_name.setdefault(e.name, []).append(e.device_time)
    per: dict[str, list[float]] = {}
    for n, v in by_name.items():
        per.setdefault(kernel_category(n), []).extend(v)
    rows = [{**base, "kind": "breakdown", "category": c, "kernels_per_step": len(v) / replays,
             "us_per_step": sum(v) / replays} for c, v in sorted(per.items())]  # fmt: skip
    # one row per kernel name too (kind breakdown_kernel), to tell e.g. an attention kernel from its combine
    rows += [{**base, "kind": "breakdown_kernel", "category": kernel_category(n), "kernel": n[:120],
              "kernels_per_step": len(v) / replays, "us_per_step": sum(v) / replays,
              "median_us": statistics.median(v)} for n, v in sorted(by_name.items())]  # fmt: skip
    busy = sum(r["us_per_step"] for r in rows if r["kind"] == "breakdown")
    rows.append({**base, "kind": "breakdown", "category": "wall", "kernels_per_step": sum(len(v) for v in per.values()) / replays,
                 "us_per_step": wall_us, "gap_us_per_step": wall_us - busy})  # fmt: skip
    return rows


def mode_kernels(args, fusion: str) -> KernelConfig:
    """The kernels of mode `fusion` ("triton+gemv+pdllate", ...): fusion and attention as named,
    every other choice off unless a suffix turns it on (the runtime's defaults on CUDA are on)."""
    fu, *extras = fusion.split("+")
    gemv_rows = next((int(e[4:]) for e in extras if e.startswith("gemv") and e[4:].isdigit()), None)
    ws_rows = next((int(e[2:]) for e in extras if e.startswith("ws") and e[2:].isdigit()), 0)
    split_n = next((int(e[6:]) for e in extras if e.startswith("splitn") and e[6:].isdigit()), None)
    pdl = {"pdllate": "late", "pdlnp": "early-nopeel", "pdlpf": "prefetch", "pdl": "early"}
    return KernelConfig(
        attention=args.attention, attention_combine="kernel" if "kernelcombine" in extras else "separate",
        linear_combine="kernel" if "linearcombine" in extras else "separate", linear_split_max_n=split_n,
        attention_ws_rows=ws_rows if args.attention == "triton" else 0, fusion=fu,
        linear="triton" if "gemv" in extras or gemv_rows else "torch", linear_max_rows=gemv_rows,
        fold_norm="foldnorm" in extras, swiglu="swiglu" in extras, rope="rope" in extras,
        pdl=next((pdl[e] for e in extras if e in pdl), "off"), weight_format=_weight_format(fusion),
    )


def _weight_format(fusion: str) -> str:
    """The GEMM weights' format of mode `fusion`: its "+fp8" / "+int4" suffix, else native."""
    extras = fusion.split("+")[1:]
    return next((f for f in ("fp8", "int4") if f in extras), "native")


def bench_steps(args, name: str, device: torch.device, dtype: torch.dtype, bw: float) -> list[dict]:
    def load(fmt: str):
        kernels = KernelConfig(attention=args.attention, weight_format=fmt)
        model = load_model(name, weights="random", device=device, dtype=dtype, num_layers=args.layers,
                           tp_rank=0, tp_size=args.tp, kernels=kernels)  # fmt: skip
        without_comm(model)  # rank 0 of a shard on one device, as the profiler times it
        return model

    native = load("native")
    if any("foldnorm" in f.split("+") for f in args.fusions):
        native.fold_norms()  # before any mode is captured, so every mode runs the same (folded) weights
    # loaded on first use of a "+fp8" / "+int4" mode: the same random weights quantized
    quantized: dict[str, object] = {}
    spec, rows, logits = native.spec, [], {}

    def setup(fusion: str):
        """The model that runs `fusion` ("triton+gemv+pdllate", ...): the loaded weights, its kernels."""
        kernels = mode_kernels(args, fusion)
        fmt = kernels.weight_format
        if fmt != "native" and fmt not in quantized:
            quantized[fmt] = load(fmt)
        # the copy keeps the loaded model's weights and its skipped communication (`without_comm`)
        return (quantized[fmt] if fmt != "native" else native).with_kernels(kernels)

    for kv in args.kv:
        cache = KVCache(spec, native.shard, kv + max(args.tokens), device, dtype)
        # A random prefix: with a zeroed one, keys of score 0 and values 0 dilute every step's
        # attention so much that two attention kernels give identical logits, and the error
        # columns compare next to nothing.
        cache.kv.normal_(generator=torch.Generator(device).manual_seed(kv))
        if args.paired:
            rows += paired_rows(args, setup, cache, spec, kv, bw)
            cache = None
            _free(device)
            continue
        # rounds alternate the order (ABBA...): a mode measured second in one round is first in the
        # next, so a drift or an order effect (the earlier mode's graphs freed just before, clocks)
        # shows up between rounds instead of as a difference between modes
        for rnd, pos, fusion in ((r, i, f) for r in range(args.rounds)
                                 for i, f in enumerate(args.fusions if r % 2 == 0 else args.fusions[::-1])):
            base = dict(kind="step", model=spec.name, tp=args.tp, layers=spec.num_layers, kv_len=kv, fusion=fusion,
                        attention=args.attention, round=rnd, position=pos,
                        weight_format=_weight_format(fusion))  # fmt: skip
            try:
                model = setup(fusion)
                runner = GraphRunner(model, cache, buckets=tuple(args.tokens), max_tree=max(args.tokens))
                first = kv == args.kv[0] and rnd == 0
                base["device_ops_1tok"] = device_ops(model, cache, device) if first else float("nan")
                new = step_rows(args, runner, spec, kv, base, bw, logits)
            except Exception as e:  # a mode that fails to compile or capture: record it, go on
                rows.append({**base, "error": f"{type(e).__name__}: {e}"[:300]})
                print(f"{spec.name} kv {kv} fusion {fusion}: FAILED {type(e).__name__}: {e}", flush=True)
                new = []
            rows += new
            print(f"{spec.name} kv {kv} fusion {fusion}" + (f" (round {rnd})" if args.rounds > 1 else "") + ": " + ", ".join(
                f"T={r['tokens']} {r['median_ms']:.3f} ms ({r['median_ms'] / r['floor_ms']:.2f}x floor)"
                for r in new if r["kind"] == "step"), flush=True)  # fmt: skip
            runner = None  # free its graphs and pool before the next mode captures
            _free(device)
        cache = None
        _free(device)
    quantized.clear()
    _free(device)
    rows += gemm_rows(args, native, device, bw)
    if not args.no_kernels:
        rows += bench_kernels(args, native, device, dtype, bw)
    return rows


def gemm_rows(args, model, device: torch.device, bw: float) -> list[dict]:
    """The step's GEMMs alone (every layer's qkv, o, gate/up, down, then the LM head) in one graph:
    what is left of the step when every small op and attention cost nothing."""
    rows = []
    for t in args.tokens:
        x = torch.randn(t, model.spec.hidden, device=device).to(model.dtype)
        a = torch.randn(t, model.shard.q_heads * model.spec.head_dim, device=device).to(model.dtype)
        m = torch.randn(t, model.shard.ffn, device=device).to(model.dtype)

        for impl in ("cublas", "gemv") if t <= args.gemm_gemv_rows else ("cublas",):
            lin = F.linear if impl == "cublas" else functools.partial(gemv, kind="dot")  # as the model calls it

            def gemms(x=x, a=a, m=m, lin=lin):
                for layer in model.layers:
                    lin(x, layer.wqkv, layer.bqkv), lin(a, layer.wo)
                    lin(x, layer.w13), lin(m, layer.w2)
                lin(x, model.lm_head)

            ms = time_calls([gemms], device.type) / 1e3
            nbytes = bytes_read(model.spec, t, 0, args.tp)
            rows.append(dict(kind="gemm_only", model=model.spec.name, tp=args.tp, layers=model.spec.num_layers,
                             tokens=t, impl=impl, median_ms=ms, floor_ms=nbytes / bw * 1e3, bytes=nbytes))  # fmt: skip
    return rows


# ------------------------------------------------------------------------------ per kernel


def _rope_kv_eager(rope: Callable) -> Callable:
    """The model's eager RoPE + KV write, with `rope` = apply_rope (eager) or its compiled form."""

    def run(qkv, cos, sin, slots, kc, vc, hq, hkv):
        t, d = qkv.shape[0], kc.shape[-1]
        q = rope(qkv[:, : hq * d].view(t, hq, d), cos, sin)
        k = rope(qkv[:, hq * d : (hq + hkv) * d].view(t, hkv, d), cos, sin)
        kc[:, slots] = k.transpose(0, 1)
        vc[:, slots] = qkv[:, (hq + hkv) * d :].view(t, hkv, d).transpose(0, 1)
        return q

    return run


def _add_norm_eager(norm: Callable) -> Callable:
    def run(x, res, w, eps):
        new = res + x
        return norm(new, w, eps), new

    return run


def kernel_cases(model, t: int, device: torch.device, dtype: torch.dtype, compiled: dict) -> dict:
    """{kernel: (bytes moved, {impl: call})} at the model's shapes for t tokens; impl "torch" is the
    model's eager ops, "compile" the same through torch.compile (when `compiled` has them)."""
    spec, sh = model.spec, model.shard
    h, hq, hkv, d, f = spec.hidden, sh.q_heads, sh.kv_heads, spec.head_dim, sh.ffn
    el = torch.tensor([], dtype=dtype).element_size()
    g = torch.Generator(device=device).manual_seed(t)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    x, res, w, eps = rnd(t, h), rnd(t, h), 1 + 0.1 * rnd(h), spec.rms_eps
    qkv = rnd(t, (hq + 2 * hkv) * d)
    freqs = (torch.arange(t, device=device) + 1000).float()[:, None] * model.inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    kc, vc = torch.zeros(2, hkv, 4096 + 64, d, device=device, dtype=dtype)
    slots = 4096 + torch.arange(t, device=device)
    rope_args = (qkv, cos, sin, slots, kc, vc, hq, hkv)
    gu = rnd(t, 2 * f)
    cases = {
        "add_rmsnorm": ((4 * t * h + h) * el, {"triton": lambda: add_rmsnorm(x, res, w, eps),
                                               "torch": lambda: _add_norm_eager(rms_norm)(x, res, w, eps)}),
        "rope_kv": (((hq + 2 * hkv) * d * 2 + 2 * d + (hq + 2 * hkv) * d) * t * el,
                    {"triton": lambda: rope_kv(*rope_args), "torch": lambda: _rope_kv_eager(apply_rope)(*rope_args)}),
        "silu_mul": (3 * t * f * el, {"triton": lambda: silu_mul_kernel(gu), "torch": lambda: silu_mul(gu)}),
    }  # fmt: skip
    if compiled:
        cases["add_rmsnorm"][1]["compile"] = lambda: _add_norm_eager(compiled["norm"])(x, res, w, eps)
        cases["rope_kv"][1]["compile"] = lambda: _rope_kv_eager(compiled["rope"])(*rope_args)
        cases["silu_mul"][1]["compile"] = lambda: compiled["act"](gu)
    return cases


def bench_kernels(args, model, device: torch.device, dtype: torch.dtype, bw: float) -> list[dict]:
    """µs per call of each fused kernel vs the eager ops it replaces (and their torch.compile)."""
    compiled = {}
    if "compile" in args.fusions and device.type == "cuda":
        compiled = {k: torch.compile(fn, dynamic=False, fullgraph=True)
                    for k, fn in (("norm", rms_norm), ("rope", apply_rope), ("act", silu_mul))}  # fmt: skip
    rows = []
    for t in args.tokens:
        for kname, (nbytes, impls) in kernel_cases(model, t, device, dtype, compiled).items():
            for impl, call in impls.items():
                base = dict(kind="kernel", model=model.spec.name, kernel=kname, impl=impl, tokens=t)
                try:
                    us = time_calls([call] * args.calls, device.type)
                except Exception as e:  # record and go on
                    rows.append({**base, "error": f"{type(e).__name__}: {e}"[:300]})
                    continue
                floor = nbytes / bw * 1e6 if device.type == "cuda" else float("nan")
                rows.append({**base, "us": us, "bytes": nbytes, "floor_us": floor})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="Llama-3-8B,Llama-3.2-1B", help="bundled names or checkpoint folders")
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--kv", default="1024,4096")
    ap.add_argument("--fusions", default="off,triton,triton+gemv",
                    help="comma list of off | compile | triton | triton+gemv (fusion triton, skinny linear on);"
                         " append +pdl for programmatic dependent launch (+pdllate: late mode, +pdlnp: early without the peeled tile, +pdlpf: early with the L2 prefetch), +kernelcombine (tree attention's"
                         " in-kernel combine), +linearcombine (the skinny linear's split-K sum in its launch), +splitnR (int4 linears split K only up to R output rows), +wsN (Gluon warp-specialized attention from N rows), +gemvN (skinny linear up to N"
                         " tokens instead of 16), +foldnorm (add+RMSNorm inside the skinny linear), +swiglu (silu*up in the gate/up skinny linear), +rope (RoPE + KV write in the qkv one) and/or +fp8 / +int4 (weight-only fp8 / W4A16 GEMM weights), e.g. triton+gemv+fp8, triton+gemv64")
    ap.add_argument("--gemm-gemv-rows", type=int, default=MAX_ROWS,
                    help=f"GEMMs-alone table: the skinny linear too for up to this many tokens (default {MAX_ROWS},"
                         f" at most {MAX_ROWS_DOT})")
    ap.add_argument("--breakdown-tokens", default="1,64",
                    help="token counts whose graph replay gets a per-kernel-category profile (CUDA, first kv)")
    ap.add_argument("--attention", default="triton", help="torch | triton")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--layers", type=int, default=None, help="keep only the first n layers")
    ap.add_argument("--tp", type=int, default=1,
                    help="time rank 0 of a TP-way shard (communication skipped, as `profile compute` does); "
                         "the floor is that rank's bytes")
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed steps before each mode's timed reps per token count (default 10); with "
                         "--paired, untimed rounds of every mode per token count (default 3)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure the fusions this many times, the order reversed every other round; "
                         "tables show the median over rounds, rows keep `round` and `position`")
    ap.add_argument("--paired", action="store_true",
                    help="capture every fusion at once and alternate them step by step (rotated order), "
                         "reporting each one's time relative to the first fusion's in the same round "
                         "(rows kind 'paired'); no breakdown or device-op count")
    ap.add_argument("--calls", type=int, default=20, help="kernel calls per captured graph (per-kernel timing)")
    ap.add_argument("--no-kernels", action="store_true", help="skip the per-kernel microbenchmarks")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.reps < 1:
        ap.error("--rounds and --reps must be >= 1")
    if args.warmup is None:
        args.warmup = 3 if args.paired else 10
    if args.warmup < 0:
        ap.error("--warmup must be >= 0")
    if args.tp < 1:
        ap.error("--tp must be >= 1")
    if not 1 <= args.gemm_gemv_rows <= MAX_ROWS_DOT:
        ap.error(f"--gemm-gemv-rows must be in 1..{MAX_ROWS_DOT}")
    device = torch.device(args.device)
    args.tokens = [int(x) for x in args.tokens.split(",")]
    args.kv = [int(x) for x in args.kv.split(",")]
    args.fusions = args.fusions.split(",")
    args.breakdown_tokens = [int(x) for x in args.breakdown_tokens.split(",") if x]
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(0)

    bw = copy_bandwidth(device)
    print(f"device-to-device copy: {bw / 1e12:.3f} TB/s (read + write)", flush=True)
    rows = []
    models = args.models.split(",")
    meta = run_metadata(args.device)
    meta.update(copy_bandwidth_Bps=bw, dtype=str(dtype).replace("torch.", ""), weights="random",
                attention=args.attention)  # fmt: skip
    stem = f"bench_step_kernels-{meta['date'][:10]}"
    out = Path(args.out)
    for i, name in enumerate(models):
        rows += bench_steps(args, name, device, dtype, bw)
        # Written after every model: a run cut short by a device time limit keeps the models it finished.
        part = {"partial": f"{i + 1} of {len(models)} models"} if i + 1 < len(models) else {}
        clean = [{k: (None if isinstance(v, float) and v != v else v) for k, v in r.items()} for r in rows]  # NaN -> null
        atomic_write_text(out / f"{stem}.json", json.dumps({"meta": {**meta, **part}, "rows": clean}, indent=1) + "\n")
        atomic_write_text(out / f"{stem}.csv", pd.DataFrame(rows).to_csv(index=False))
    df = pd.DataFrame(rows)

    fmt = {"display.width": 200, "display.max_columns": 30, "display.float_format": "{:.3f}".format}
    steps = df[df["kind"] == "step"]
    if len(steps) and "median_ms" in steps:
        steps = steps.dropna(subset=["median_ms"]).assign(x_floor=lambda d: d["median_ms"] / d["floor_ms"])
        table = steps.pivot_table(index=["model", "kv_len", "tokens"], columns="fusion",
                                  values=["median_ms", "x_floor"], aggfunc="median")  # fmt: skip
        table[("floor_ms", "")] = steps.groupby(["model", "kv_len", "tokens"])["floor_ms"].first()
        table[("pred_ms", "triton")] = steps[steps["fusion"] == "triton"].groupby(
            ["model", "kv_len", "tokens"])["pred_ms"].first()  # fmt: skip
        with pd.option_context(*[x for kv in fmt.items() for x in kv]):
            print(f"\nms per step through GraphRunner ({meta['gpu']}, {meta['dtype']}, random weights, "
                  f"{args.attention} attention; goals 1 token <= 1.15x floor, 64 tokens <= 1.3x)\n{table}")  # fmt: skip
            ops = steps.dropna(subset=["device_ops_1tok"]) if "device_ops_1tok" in steps else steps.iloc[:0]
            if len(ops):
                print("\ndevice ops per 1-token forward\n"
                      f"{ops.groupby(['model', 'fusion'])['device_ops_1tok'].first().unstack()}")  # fmt: skip
    paired = df[df["kind"] == "paired"]
    if len(paired):
        ptab = paired.pivot_table(index=["model", "kv_len", "tokens"], columns="fusion",
                                  values=["median_ms", "ratio_vs_first"], aggfunc="first")  # fmt: skip
        with pd.option_context(*[x for kv in fmt.items() for x in kv]):
            print(f"\npaired steps (alternated every step; ratio = time / {args.fusions[0]}'s in the same round, "
                  f"median of {args.reps})\n{ptab}")  # fmt: skip
    brk = df[df["kind"] == "breakdown"]
    if len(brk):
        btab = brk.pivot_table(index=["model", "tokens", "fusion"], columns="category", values="us_per_step",
                               aggfunc="first")  # fmt: skip
        with pd.option_context(*[x for kv in fmt.items() for x in kv]):
            print(f"\nµs per step by kernel category (profiler, kv {args.kv[0]}; wall = replay time)\n{btab}")
    bk = df[df["kind"] == "breakdown_kernel"]
    if len(bk):
        top = bk.sort_values("us_per_step", ascending=False).groupby(["model", "tokens", "fusion"]).head(12)
        with pd.option_context(*[x for kv in fmt.items() for x in kv], "display.max_colwidth", 60):
            print("\nlargest kernels per step (profiler; median_us per call)\n"
                  f"{top.set_index(['model', 'tokens', 'fusion', 'kernel'])[['kernels_per_step', 'us_per_step', 'median_us']]}")  # fmt: skip
    gemm = df[df["kind"] == "gemm_only"]
    if len(gemm):
        with pd.option_context(*[x for kv in fmt.items() for x in kv]):
            print("\nGEMMs alone (all layers + LM head, one graph; floor = weight bytes)\n"
                  f"{gemm.set_index(['model', 'tokens', 'impl'])[['median_ms', 'floor_ms']].assign(x_floor=lambda d: d['median_ms'] / d['floor_ms'])}")  # fmt: skip
    kern = df[df["kind"] == "kernel"]
    if "us" in kern and len(kern):
        ktab = kern.pivot_table(index=["model", "kernel", "tokens"], columns="impl", values="us", aggfunc="first")
        ktab["floor_us"] = kern.groupby(["model", "kernel", "tokens"])["floor_us"].first()
        with pd.option_context(*[x for kv in fmt.items() for x in kv]):
            print(f"\nµs per call inside a CUDA graph of {args.calls} calls\n{ktab}")
    if "error" in df and df["error"].notna().any():
        print("\nFAILED:\n" + "\n".join(df["error"].dropna().astype(str)))
    print(f"\nwrote {out / stem}.json and .csv")


if __name__ == "__main__":
    main()
