"""One target forward step (decode: 1 token; tree verify: 8..128 tokens) against the HBM floor.

For each model shape (random bf16 weights at real shapes), each KV length and each token count:
  swiftspec-graph   our Transformer replayed from a CUDA graph (GraphRunner.run, input copies and
                    padding included) — the number the runtime gets per step
  swiftspec-eager   the same forward without graphs (host-bound; few reps)
  hf-eager          transformers' LlamaForCausalLM forward of T new tokens over a KV cache of the
                    same length (causal mask; few reps, it is slow), plus generate() tokens/s
  floor             (weights read + KV read) / measured device-to-device copy bandwidth
                    (bytes read + written per second, measured in the same run)

Run on the GPU machine:  python benchmarks/bench_step.py
CPU smoke (tiny shape):  python benchmarks/bench_step.py --device cpu --models PATH --tokens 1,8
                         --kv 32 --reps 3 --hf-reps 1
Writes benchmarks/results/bench_step-<gpu>-<date>.{json,csv} with run_metadata() and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import json
import statistics
from pathlib import Path

import pandas as pd
import torch

from swiftspec.files import atomic_write_text, run_metadata
from swiftspec.profiler.calibrate import time_ms
from swiftspec.runtime.graphs import GraphRunner
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.runtime.weights import load_model
from swiftspec.spec import ModelSpec, resolve_model_path

RESULTS = Path(__file__).resolve().parent / "results"


def copy_bandwidth(device: torch.device, nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read + written."""
    if device.type != "cuda":
        nbytes = 64 << 20
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    ms = statistics.median(time_ms(lambda: dst.copy_(src), 20, 3, device))
    return 2 * nbytes / (ms / 1e3)


def bytes_read(spec: ModelSpec, tokens: int, kv_len: int, tp: int = 1) -> int:
    """Bytes one forward of one rank of a `tp`-way shard must read: its weights except the
    embedding table (only T rows of it are gathered; an unsharded tied model reads the table once as
    the LM head, unless fp8 gives the LM head its own copy) plus its K/V of kv_len + tokens slots."""
    embed = spec.vocab * spec.hidden * spec.dtype_bytes
    weights = spec.weight_bytes(tp) - (0 if spec.tie_embeddings and not spec.fp8 and tp == 1 else embed)
    return weights + (kv_len + tokens) * spec.kv_bytes_per_token(tp)


def bench_ours(args, name: str, device: torch.device, dtype: torch.dtype, bw: float) -> list[dict]:
    # the runtime's kernels on the device with the attention asked for; the small ops eager or compiled
    kernels = KernelConfig.resolve(device, attention=args.attention)
    kernels = dataclasses.replace(kernels, fusion="compile" if args.fuse else "off")
    model = load_model(name, weights="random", device=device, dtype=dtype, num_layers=args.layers, kernels=kernels)
    spec, rows = model.spec, []
    for kv in args.kv:
        cache = KVCache(spec, model.shard, kv + max(args.tokens), device, dtype)
        runner = GraphRunner(model, cache, buckets=tuple(args.tokens), max_tree=max(args.tokens))
        for t in args.tokens:
            toks = torch.randint(0, spec.vocab, (t,), device=device)
            pos = kv + torch.arange(t, device=device)
            mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()
            floor = bytes_read(spec, t, kv) / bw * 1e3
            base = dict(model=spec.name, layers=spec.num_layers, tokens=t, kv_len=kv, floor_ms=floor,
                        bytes=bytes_read(spec, t, kv), attention=args.attention + ("+fused" if args.fuse else ""))  # fmt: skip
            ms = time_ms(lambda: runner.run(toks, pos, pos, kv, mask), args.reps, 10, device)  # noqa: B023
            impl = "swiftspec-graph" if runner.use_graphs else "swiftspec-eager"
            rows.append({**base, "impl": impl, "median_ms": statistics.median(ms),
                         "p10_ms": _q(ms, 0.1), "p90_ms": _q(ms, 0.9), "reps": len(ms)})  # fmt: skip
            if runner.use_graphs:
                g = runner.graphs[runner.bucket(t)]
                ms = time_ms(g.replay, args.reps, 3, device)
                rows.append({**base, "impl": "swiftspec-replay", "median_ms": statistics.median(ms),
                             "p10_ms": _q(ms, 0.1), "p90_ms": _q(ms, 0.9), "reps": len(ms)})  # fmt: skip
                ms = time_ms(lambda: model(toks, pos, cache, pos, kv, mask), args.hf_reps, 2, device)  # noqa: B023
                rows.append({**base, "impl": "swiftspec-eager", "median_ms": statistics.median(ms),
                             "p10_ms": _q(ms, 0.1), "p90_ms": _q(ms, 0.9), "reps": len(ms)})  # fmt: skip
    return rows


def bench_hf(args, name: str, device: torch.device, dtype: torch.dtype, bw: float) -> list[dict]:
    """transformers' own model (random init via from_config) on the same shapes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = resolve_model_path(name)
    cfg = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    if args.layers:
        cfg.num_hidden_layers = args.layers
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    spec = ModelSpec.from_config(folder, dtype_bytes=2 if dtype != torch.float32 else 4)
    if args.layers:
        spec = dataclasses.replace(spec, num_layers=args.layers)
    rows = []
    with torch.no_grad():
        for kv in args.kv:
            prompt = torch.randint(0, spec.vocab, (1, kv), device=device)
            base_cache = model(prompt, use_cache=True).past_key_values
            for t in args.tokens:
                new = torch.randint(0, spec.vocab, (1, t), device=device)
                caches = [copy.deepcopy(base_cache) for _ in range(args.hf_reps + 1)]

                def step(caches=caches, new=new):
                    model(new, past_key_values=caches.pop(), use_cache=True)

                ms = time_ms(step, args.hf_reps, 1, device)
                rows.append(dict(model=spec.name, layers=spec.num_layers, tokens=t, kv_len=kv, impl="hf-eager",
                                 floor_ms=bytes_read(spec, t, kv) / bw * 1e3, bytes=bytes_read(spec, t, kv),
                                 attention="hf", median_ms=statistics.median(ms), p10_ms=_q(ms, 0.1),
                                 p90_ms=_q(ms, 0.9), reps=len(ms)))  # fmt: skip
            # generate(): per-token time from two lengths, so the prefill cancels out
            n = args.gen_tokens
            kw = dict(do_sample=False, pad_token_id=0)
            t1 = time_ms(lambda: model.generate(prompt, max_new_tokens=1, min_new_tokens=1, **kw), 1, 1, device)[0]  # noqa: B023
            tn = time_ms(lambda: model.generate(prompt, max_new_tokens=n + 1, min_new_tokens=n + 1, **kw), 1, 0, device)[0]  # noqa: B023
            per_tok = (tn - t1) / n
            rows.append(dict(model=spec.name, layers=spec.num_layers, tokens=1, kv_len=kv, impl="hf-generate",
                             floor_ms=bytes_read(spec, 1, kv) / bw * 1e3, bytes=bytes_read(spec, 1, kv),
                             attention="hf", median_ms=per_tok, p10_ms=per_tok, p90_ms=per_tok, reps=n))  # fmt: skip
    return rows


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="Llama-3-8B,Llama-3.2-3B,Llama-3.2-1B",
                    help="bundled names or checkpoint/config folders, comma-separated")  # fmt: skip
    ap.add_argument("--tokens", default="1,8,16,32,64,128")
    ap.add_argument("--kv", default="1024,4096")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    ap.add_argument("--attention", default="torch", help="torch | triton")
    ap.add_argument("--fuse", action="store_true", help="torch.compile the elementwise ops (KernelConfig.fusion 'compile')")
    ap.add_argument("--layers", type=int, default=None, help="keep only the first n layers")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--hf-reps", type=int, default=5)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    args.tokens = [int(x) for x in args.tokens.split(",")]
    args.kv = [int(x) for x in args.kv.split(",")]
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    torch.manual_seed(0)

    bw = copy_bandwidth(device)
    print(f"device-to-device copy: {bw / 1e12:.3f} TB/s (read + write)", flush=True)
    rows = []
    for name in args.models.split(","):
        rows += bench_ours(args, name, device, dtype, bw)
        _free(device)
        print(f"{name}: swiftspec done", flush=True)
        if not args.no_hf:
            rows += bench_hf(args, name, device, dtype, bw)
            _free(device)
            print(f"{name}: transformers done", flush=True)
    df = pd.DataFrame(rows)
    df["x_floor"] = df["median_ms"] / df["floor_ms"]
    meta = run_metadata(args.device)
    meta.update(copy_bandwidth_Bps=bw, dtype=str(dtype).replace("torch.", ""), weights="random")
    stem = f"bench_step-{meta.get('gpu', 'cpu').replace(' ', '_')}-{meta['date'][:10]}"
    out = Path(args.out)
    atomic_write_text(out / f"{stem}.json", json.dumps({"meta": meta, "rows": df.to_dict("records")}, indent=1) + "\n")
    atomic_write_text(out / f"{stem}.csv", df.to_csv(index=False))
    table = df.pivot_table(index=["model", "kv_len", "tokens"], columns="impl", values="median_ms", aggfunc="first")
    floor = df.groupby(["model", "kv_len", "tokens"])["floor_ms"].first()
    table.insert(0, "floor", floor)
    for col in ("swiftspec-graph", "swiftspec-replay"):
        if col in table:
            table[f"{col}/floor"] = table[col] / table["floor"]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.float_format", "{:.3f}".format):
        print(f"\nms per forward ({meta['gpu']}, {meta['dtype']}, random weights)\n{table}")
    print(f"\nwrote {out / stem}.json and .csv")


if __name__ == "__main__":
    main()
