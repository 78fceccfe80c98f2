"""Host work per decode iteration: graph inputs staged in one copy vs copied buffer by buffer.

Building four device tensors from Python lists every forward (four synchronous host-to-device
copies from pageable memory), then about ten small device ops into the graph's static buffers,
costs host time every iteration. `ModelRunner` instead hands the lists to `GraphRunner`, which
writes them into one pinned host buffer and moves them in one copy (`graphs.StaticInputs`). This
benchmark runs both, alternating, in one process (the buffer-by-buffer copy kept here as
`DeviceCopyRunner`), and a third variant, "graph_topk": staged inputs plus tree growth replayed
from captured top-k graphs (models whose `KernelConfig.tree_growth` is "graph") instead of two
eager kernel launches per draft forward.

Models: narrow stand-ins (`validate.stand_in_config`: the real vocabulary and layer count, hidden
64) of the given bundled models, random weights, so the forwards' device time is small and is
subtracted exactly (`validate.replay_ms`, as `validate` calibrates host work). Modes:
autoregressive, and serial bs8-w4-d3 with the model as its own draft (greedy; trees are accepted
deeply, KV compaction runs every iteration).

host_ms per iteration = (decode wall ms - sum over replays of the graph's replay ms) / iterations;
median over `--reps` decodes per variant. Writes benchmarks/results/bench_host-<date>.{json,csv};
`--cprofile` adds bench_host-<date>-cprofile.csv, the host's hot spots per (model, mode).

    python benchmarks/bench_host.py                                   # on the H200: ~1 minute
    python benchmarks/bench_host.py --device cpu --models Llama-3.2-1B --reps 1 --new-tokens 4 \
        --out /tmp/bh                                                 # CPU smoke run (eager)
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import json
import pstats
import statistics
import time
from pathlib import Path

import pandas as pd
import torch

from swiftspec.files import atomic_write_text, run_metadata
from swiftspec.runtime.decoder import PREFILL_CHUNK, ModelRunner
from swiftspec.runtime.generate import GenerateConfig, generate
from swiftspec.runtime.graphs import ForwardClock
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.spec import Mode, ModelSpec, TreePolicy
from swiftspec.validate import _stand_in_model, replay_ms

RESULTS = Path(__file__).resolve().parent / "results"


class DeviceCopyRunner(ModelRunner):
    """`ModelRunner` as it was before the one-copy staging (kept here for the A/B): four
    host-to-device tensors per forward, then `GraphRunner.run`'s per-buffer device copies."""

    def _run(self, tokens, positions, slots, tree_mask):
        if self.graphs is None:  # eager: the same as ModelRunner
            return super()._run(tokens, positions, slots, tree_mask)
        dev = self.device
        args = [torch.tensor(x, dtype=torch.long, device=dev) for x in (tokens, positions, slots)]
        logits = self.graphs.run(*args, self.prefix_len, tree_mask.to(dev))
        return logits if self.vocab_limit is None else logits[:, : self.vocab_limit]


# variant -> (runner class, the models' tree growth)
VARIANTS = {"staged": (ModelRunner, "auto"), "device_copies": (DeviceCopyRunner, "auto"),
            # staged inputs, and tree growth replayed from captured top-k graphs
            "graph_topk": (ModelRunner, "graph")}
MODES = {"autoregressive": (Mode.autoregressive, TreePolicy.autoregressive()),
         "serial-bs8-w4-d3": (Mode.serial, TreePolicy(bs=8, w=4, d=3))}


def host_profile(target, draft, prompt: list[int], mode: Mode, policy: TreePolicy, new_tokens: int,
                 top: int = 25) -> pd.DataFrame:
    """Where one decode's host time goes: cProfile over `generate`, the `top` functions by own
    time, in µs per iteration. cProfile's per-call overhead inflates small, frequent calls, so the
    shares rank the pieces; the absolute numbers are upper bounds."""
    for r in (target, draft):
        if r is not None:
            r.prefix_len, r.tree_len, r.pending = 0, 0, []
    prof = cProfile.Profile()
    prof.enable()
    res = generate(target, draft, prompt, GenerateConfig(mode=mode, policy=policy, max_new_tokens=new_tokens))
    prof.disable()
    it = max(res.iterations, 1)
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, tottime, cumtime, callers)
    rows = [{"function": f"{Path(f).name}:{line}({fn})", "calls_per_iteration": nc / it,
             "tottime_us_per_iteration": tt / it * 1e6, "cumtime_us_per_iteration": ct / it * 1e6}
            for (f, line, fn), (_, nc, tt, ct, _) in stats.items()]  # fmt: skip
    return pd.DataFrame(rows).sort_values("tottime_us_per_iteration", ascending=False).head(top)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="Llama-3.2-1B,Llama-3-8B", help="bundled names (their stand-ins run)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=5, help="decodes per (model, mode, variant), after one warm-up")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--cprofile", action="store_true",
                    help="also profile one decode per (model, mode) of the staged path with cProfile: "
                         "bench_host-<date>-cprofile.csv (top functions by own time, µs per iteration)")
    args = ap.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    rows, prof_rows = [], []
    for name in args.models.split(","):
        spec = ModelSpec.from_config(name)
        models = {g: _stand_in_model(spec, args.device, kernels=KernelConfig.resolve(args.device, tree_growth=g))
                  for g in {g for _, g in VARIANTS.values()}}
        prompt = torch.randint(0, spec.vocab, (24,), generator=gen).tolist()
        runners = {v: (cls(models[g], 1024), cls(models[g], 1024)) for v, (cls, g) in VARIANTS.items()}
        clocks = {}
        for v, pair in runners.items():
            fixed = {id(r): replay_ms(r) for r in pair}
            clocks[v] = ForwardClock(list(pair), fixed_ms=fixed)
        for mode_name, (mode, policy) in MODES.items():
            samples = {v: [] for v in VARIANTS}
            for rep in range(args.reps + 1):
                for v, (target, draft) in runners.items():  # alternate: drifts hit both alike
                    for r in (target, draft):
                        r.prefix_len, r.tree_len, r.pending = 0, 0, []
                    clocks[v].take()
                    spec_mode = mode is not Mode.autoregressive
                    res = generate(target, draft if spec_mode else None, prompt,
                                   GenerateConfig(mode=mode, policy=policy, max_new_tokens=args.new_tokens))
                    if args.device == "cuda":
                        torch.cuda.synchronize()
                    skip = -(-(len(prompt) - 1) // PREFILL_CHUNK) * (2 if spec_mode else 1)
                    fwd = clocks[v].take(skip)
                    if rep:
                        samples[v].append(((res.decode_s * 1e3 - fwd) / res.iterations, res.tokens_per_s,
                                           res.iterations, res.mean_accepted))
            for v, s in samples.items():
                rows.append({"model": name, "stand_in": f"{spec.num_layers} layers, vocab {spec.vocab}, hidden 64",
                             "mode": mode_name, "variant": v,
                             "host_ms": statistics.median(x[0] for x in s),
                             "host_ms_min": min(x[0] for x in s), "host_ms_max": max(x[0] for x in s),
                             "tokens_per_s": statistics.median(x[1] for x in s),
                             "iterations": s[0][2], "mean_accepted": s[0][3], "reps": len(s)})
            print(pd.DataFrame(rows[-len(samples):])[["model", "mode", "variant", "host_ms", "tokens_per_s"]]
                  .to_string(index=False, header=False), flush=True)
            if args.cprofile:
                target, draft = runners["staged"]
                top = host_profile(target, draft if mode is not Mode.autoregressive else None, prompt, mode, policy,
                                   args.new_tokens)  # fmt: skip
                prof_rows += top.assign(model=name, mode=mode_name).to_dict(orient="records")
        del runners, clocks, models
    df = pd.DataFrame(rows)
    meta = {**run_metadata(args.device), "weights": "random (narrow stand-ins)", "new_tokens": args.new_tokens,
            "prompt_tokens": 24}
    stem = Path(args.out) / f"bench_host-{dt.date.today().isoformat()}"
    atomic_write_text(stem.with_suffix(".json"), json.dumps(
        {"metadata": meta, "rows": json.loads(df.to_json(orient="records"))}, indent=1))
    atomic_write_text(stem.with_suffix(".csv"), df.to_csv(index=False))
    if prof_rows:
        prof_df = pd.DataFrame(prof_rows)
        atomic_write_text(stem.parent / f"{stem.name}-cprofile.csv", prof_df.to_csv(index=False))
        for (m, mode_name), g in prof_df.groupby(["model", "mode"], sort=False):
            print(f"\nhost hot spots, {m} {mode_name} (cProfile, µs per iteration, upper bounds):")
            print(g.head(12)[["function", "calls_per_iteration", "tottime_us_per_iteration"]].round(1)
                  .to_string(index=False))
    print(df.pivot_table(index=["model", "mode"], columns="variant", values="host_ms").round(3).to_string())
    print(f"wrote {stem}.json and .csv ({time.strftime('%H:%M:%S')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
