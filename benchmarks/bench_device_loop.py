"""Host loop against device loop on the validation configurations, paired in one process.

For every configuration of `swiftspec validate` (random weights at the real shapes, synthetic
acceptance replayed from the bundled profile, the same prompts and rank paths) each prompt is
decoded by `generate` with `loop="host"` and with `loop="device"`, the order alternating from pass
to pass, and the script records per decode:

  * host_ms per iteration = (decode wall time - device time of the graph replays) / iterations:
    for the host loop the forwards' replays (CUDA events, `graphs.ForwardClock`), for the device
    loop its own two graphs per iteration (events around each replay);
  * tokens/s of the decode (prefill excluded), and whether both loops produced the same tokens.

Per configuration it also gives the bound on any loop's speedup: the host loop's iteration time
over its device time (every host millisecond removed, the forwards unchanged).

Output: `device_loop.csv` (one row per decode) and `device_loop.json` (per configuration: median
host ms of each loop, the paired tokens/s ratio, plus the machine's metadata).
Usage: PYTHONPATH=. python benchmarks/bench_device_loop.py --out DIR [--configs N] [--prompts 3]
       [--max-new-tokens 96] [--passes 2]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from swiftspec.files import run_metadata
from swiftspec.run import rank_paths
from swiftspec.runtime.decoder import PREFILL_CHUNK, ModelRunner
from swiftspec.runtime.generate import GenerateConfig, cache_slots, generate
from swiftspec.runtime.graphs import ForwardClock
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.runtime.launch import load_prompts
from swiftspec.runtime.synthetic import SyntheticVerifier, rank_logprobs
from swiftspec.runtime.tree import tree_slots_needed
from swiftspec.runtime.vocab import shared_vocab, vocab_cut
from swiftspec.runtime.weights import load_model
from swiftspec.sim.acceptance import default_acceptance
from swiftspec.spec import AcceptanceProfile, Mode
from swiftspec.validate import CUDA_PAIRS, _default_acceptance, default_configs

LOOPS = ("host", "device")


def _decode(c, rs: list[ModelRunner], clock: ForwardClock, loop: str, prompt: list[int], path: list[int],
            logq: tuple[float, ...], max_new: int, sync) -> tuple:
    """One decode of configuration `c` by `loop` on fresh prefixes: (result, device ms of its replays)."""
    spec = c.mode is not Mode.autoregressive
    cfg = GenerateConfig(mode=c.mode, policy=c.policy, max_new_tokens=max_new, rank_logprobs=logq if spec else None,
                         loop=loop)
    for r in rs:
        r.prefix_len, r.tree_len, r.pending = 0, 0, []
    sync()
    clock.take()
    res = generate(rs[0], rs[1] if spec else None, prompt, cfg, verifier=SyntheticVerifier(path) if spec else None)
    sync()
    fwd = clock.take(math.ceil((len(prompt) - 1) / PREFILL_CHUNK) * len(rs))
    return res, (res.device_ms if res.device_ms is not None else fwd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for device_loop.csv and device_loop.json")
    ap.add_argument("--configs", type=int, default=None, help="only the first N configurations")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--passes", type=int, default=2, help="decodes of every prompt by each loop")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--pairs", default=None, help="TARGET:DRAFT,... (default: the validation pairs)")
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    device, cuda = a.device, a.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    acc_path = _default_acceptance()
    acc = AcceptanceProfile.load(acc_path) if acc_path else default_acceptance()[0]
    pairs = [tuple(p.split(":")) for p in a.pairs.split(",")] if a.pairs else list(CUDA_PAIRS)
    cfgs = default_configs(pairs, acc.positional, a.configs)
    vocab = min(shared_vocab(t, d) for t, d in pairs)
    ids, _ = load_prompts("builtin", pairs[0][0], vocab, a.prompts)
    paths = rank_paths(acc, len(ids), a.max_new_tokens + 64, 0)
    logq = tuple(rank_logprobs(acc))
    longest = max(len(p) for p in ids)
    slots = max(cache_slots(longest, a.max_new_tokens, c.policy, draft=True) for c in cfgs) + 64
    max_tree = max(tree_slots_needed(c.policy) + 2 * c.policy.bs + 8 for c in cfgs)
    kernels = KernelConfig.resolve(device)
    models, runners = {}, {}

    def runner(name: str, role: str, cut_to: int | None) -> ModelRunner:
        if name not in models:
            models[name] = load_model(name, weights="random", device=device, dtype=dtype, seed=0, kernels=kernels)
        cut = vocab_cut(models[name].spec.vocab, cut_to)
        key = (name, role, cut)
        if key not in runners:
            runners[key] = ModelRunner(models[name], slots, max_tree=max_tree, vocab_limit=cut)
        return runners[key]

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows = []
    for ci, c in enumerate(cfgs):
        spec = c.mode is not Mode.autoregressive
        shared = shared_vocab(c.target, c.draft) if spec else None
        target = runner(c.target, "target", shared)
        draft = runner(c.draft, "draft", shared) if spec else None
        rs = [target] + ([draft] if draft is not None else [])
        clock = ForwardClock(rs)
        tokens_of: dict[tuple[int, int, str], list[int]] = {}

        def once(loop: str, pi: int, c=c, rs=rs, clock=clock) -> tuple:
            return _decode(c, rs, clock, loop, ids[pi], paths[pi], logq, a.max_new_tokens, sync)

        for loop in LOOPS:  # warm-up: graphs captured, kernels tuned
            once(loop, 0)
        for p in range(a.passes):
            for pi in range(len(ids)):
                order = LOOPS if (p + pi) % 2 == 0 else LOOPS[::-1]
                for loop in order:
                    res, dev_ms = once(loop, pi)
                    tokens_of[(p, pi, loop)] = res.tokens
                    wall = res.decode_s * 1e3
                    rows.append({"config": c.label, "mode": c.mode.value, "policy": c.policy.key, "loop": loop,
                                 "pass": p, "prompt": pi, "tokens": len(res.tokens), "iterations": res.iterations,
                                 "tokens_per_s": len(res.tokens) / res.decode_s, "iteration_ms": wall / res.iterations,
                                 "device_ms": dev_ms / res.iterations,
                                 "host_ms": (wall - dev_ms) / res.iterations})
                rows[-1]["same_tokens"] = rows[-2]["same_tokens"] = tokens_of[(p, pi, "host")] == tokens_of[(p, pi, "device")]
        target.loops.clear()  # free the device loop's graphs before the next configuration
        last = [r for r in rows if r["config"] == c.label]
        med = {lp: float(np.median([r["host_ms"] for r in last if r["loop"] == lp])) for lp in LOOPS}
        tps = {lp: float(np.median([r["tokens_per_s"] for r in last if r["loop"] == lp])) for lp in LOOPS}
        print(f"[{ci + 1}/{len(cfgs)}] {c.label}: host ms/iteration {med['host']:.3f} -> {med['device']:.3f}, "
              f"tok/s {tps['host']:.1f} -> {tps['device']:.1f}", file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "device_loop.csv", index=False)
    summary = []
    for label, g in df.groupby("config", sort=False):
        h, d = g[g["loop"] == "host"], g[g["loop"] == "device"]
        ratio = d["tokens_per_s"].to_numpy() / h["tokens_per_s"].to_numpy()  # paired: same pass and prompt
        summary.append({"config": label, "mode": g["mode"].iloc[0], "policy": g["policy"].iloc[0],
                        "host_ms_host_loop": float(h["host_ms"].median()),
                        "host_ms_device_loop": float(d["host_ms"].median()),
                        "tokens_per_s_host_loop": float(h["tokens_per_s"].median()),
                        "tokens_per_s_device_loop": float(d["tokens_per_s"].median()),
                        "speedup_paired_median": float(np.median(ratio)),
                        # what no loop can beat: the host loop's iteration with its host time at zero
                        "speedup_zero_host_bound": float(h["iteration_ms"].median() / h["device_ms"].median()),
                        "same_tokens": bool(g["same_tokens"].all())})
    doc = {"meta": {**run_metadata(device), "command": " ".join(sys.argv), "weights": "random",
                    "acceptance": f"synthetic (replay of {Path(acc_path).name if acc_path else 'builtin'})",
                    "prompts": len(ids), "max_new_tokens": a.max_new_tokens, "passes": a.passes},
           "configs": summary}
    (out / "device_loop.json").write_text(json.dumps(doc, indent=1))
    pd.DataFrame(summary).to_csv(out / "device_loop_summary.csv", index=False)
    print(pd.DataFrame(summary).to_string(index=False))


if __name__ == "__main__":
    main()
