"""Sampled speculation on a real pair: accepted length and tokens/s against greedy, and the check
that every sampled run equals target-only sampling with the same seed.

    python -m swiftspec.profiler.real_models        # once: ~/.cache/swiftspec/real/ (README, "Real weights")
    python benchmarks/bench_sampling.py             # CPU, ~3 min with the defaults

For each temperature (0 = greedy) and prompt: target-only decoding (`autoregressive`), then
`serial` speculation with the same seed. Per row: the mean accepted length, tokens/s and whether
the speculative tokens equal the autoregressive ones (`lossless`). Writes
benchmarks/results/bench_sampling-<date>.{json,csv}.

Why acceptance falls with temperature: the trees are grown from the draft's top-w tokens, and a
verify continues at a node only when the target's draw is one of its children (p(children) instead
of the argmax matching), so a flatter target distribution leaves the tree earlier.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from swiftspec.files import atomic_write_text, run_metadata
from swiftspec.runtime.generate import generate_from_checkpoints, make_policy
from swiftspec.runtime.launch import load_prompts
from swiftspec.spec import Mode, ModelSpec, SamplingParams, UserError

RESULTS = Path(__file__).resolve().parent / "results"
REAL = Path.home() / ".cache" / "swiftspec" / "real"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(REAL / "smollm2-135m"))
    ap.add_argument("--draft", default=str(REAL / "smollm2-int3g32"))
    ap.add_argument("--temperatures", default="0,0.3,0.7,1.0")
    ap.add_argument("--prompts", type=int, default=4, help="builtin prompts (first N)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--bs", type=int, default=8)
    ap.add_argument("--w", type=int, default=4)
    ap.add_argument("--d", type=int, default=4)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    try:
        temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--temperatures takes comma-separated numbers, got {args.temperatures!r}")
    for p in (args.target, args.draft):
        if not Path(p).is_dir():
            print(f"error: {p} not found: run `python -m swiftspec.profiler.real_models` first", file=sys.stderr)
            sys.exit(2)

    rows = []
    try:
        ids, how = load_prompts("builtin", args.target, ModelSpec.from_config(args.target).vocab, args.prompts)
        policy = make_policy(Mode.serial, args.bs, args.w, args.d)
        for t in temps:
            for i, prompt in enumerate(ids):
                common = dict(prompt=prompt, max_new_tokens=args.max_new_tokens, eos=False,
                              sampling=SamplingParams(temperature=t, seed=i))  # fmt: skip
                ar = generate_from_checkpoints(args.target, mode=Mode.autoregressive, **common)
                sp = generate_from_checkpoints(args.target, args.draft, mode=Mode.serial, policy=policy, **common)
                rows.append({"temperature": t, "prompt": i, "policy": policy.key, "mean_accepted": sp.mean_accepted,
                             "iterations": sp.iterations, "serial_tokens_per_s": sp.tokens_per_s,
                             "autoregressive_tokens_per_s": ar.tokens_per_s, "lossless": sp.tokens == ar.tokens})
                print(f"T={t:g} prompt {i}: accepted {sp.mean_accepted:.2f}, serial {sp.tokens_per_s:.1f} vs "
                      f"AR {ar.tokens_per_s:.1f} tok/s, lossless {sp.tokens == ar.tokens}", flush=True)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    df = pd.DataFrame(rows)
    summary = df.groupby("temperature").agg(mean_accepted=("mean_accepted", "median"),
                                            serial_tokens_per_s=("serial_tokens_per_s", "median"),
                                            autoregressive_tokens_per_s=("autoregressive_tokens_per_s", "median"),
                                            lossless=("lossless", "all"))  # fmt: skip
    print(summary.to_string())
    meta = {**run_metadata("cpu"), "target": args.target, "draft": args.draft, "weights": "checkpoint",
            "prompts": how, "max_new_tokens": args.max_new_tokens}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"bench_sampling-{meta['date'][:10]}"
    atomic_write_text(out / f"{stem}.json", json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    atomic_write_text(out / f"{stem}.csv", df.to_csv(index=False))
    print(f"wrote {out / stem}.json and .csv")


if __name__ == "__main__":
    main()
