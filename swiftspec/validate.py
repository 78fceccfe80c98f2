"""`swiftspec validate`: predict many configurations from a profile, then run them; report the error.

For every configuration (model pair x mode x tree policy that fits one device) the prediction is
made and recorded first, from the profile and an acceptance profile; then all configurations run
in ONE process, models loaded once per pair and their CUDA graphs captured once (one `ModelRunner`
per model, sized for the largest configuration, reset between prompts). Acceptance is replayed
(synthetic, `runtime/synthetic.py`): the same rank paths drive the simulator and the runtime's
verifier, and the draft tree is shaped by the profile's log q[rank], so predicted and measured
accepted lengths agree exactly and the tokens/s error measures latency modelling alone. With
`passes` > 1 every configuration runs once per pass and its measured numbers are the medians over
passes: on a shared host a slow spell of a few seconds would otherwise decide single
configurations.

Host work: the profile's `host` rows are per iteration of one reference policy; the runtime's host
work grows with the draft forwards and the tokens in them. Unless told not to, `validate` first
measures it per model pair (`calibrate_host`): the runtime's own `generate` loop on stand-ins of
the pair (`stand_in_config`: the models' vocabulary and layer count, hidden 64), for other
policies and other rank paths than those validated, minus the forwards' device time as the
profile times it (`replay_ms`) and minus the profile's `tree_growth` (the simulator adds both),
fitted (non-negative least squares) as
    host = base[mode] per iteration + per_forward x draft forwards + per_token x draft tokens
           + per_node x verified nodes
and written as rows `host` (base), `host_expansion` (per_forward + per_token x tokens) and
`host_verify` (per_node x tokens), which the latency model reads. This is a profile measurement
(stand-ins, other policies), not a fit to the configurations validated.

Why stand-ins with the real vocabulary: the eager work around each forward (logits copy out of
the graph, log-softmax + top-w per drafted row, argmax per verified row) reads vocab-wide rows,
which cost nothing at vocab 256 and a large share of the host time at 128,256 (docs/decisions.md).
Why the real layer count and `replay_ms`: a replay issued after a device sync (the runtime)
starts later than the back-to-back replays the profile timed; that launch latency belongs to the
host terms. On CUDA a reference fit on the old tiny model (2 layers,
vocab 256) is logged too (`host_reference`), for comparison only.

Before anything is built: every pair's vocabulary (`runtime.vocab.shared_vocab`; a padded pair
runs over its shared ids) and the memory of the models and caches (`preflight`). A profile
measured on another GPU, dtype or weight format than the run's is reported as `not comparable:
profile <...> vs run <...>`: its predictions are kept (column `comparable` false) but no error is
printed across them.

Outputs (folder -o): report.csv (one row per configuration), report.json (rows, summary: median
and max |error|, and meta: run_metadata(), profile / acceptance labels, weights), host.csv.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from scipy.optimize import nnls

from swiftspec.files import atomic_dir, run_metadata
from swiftspec.preflight import check_models, model_spec
from swiftspec.run import not_comparable, profile_conditions, rank_paths, run_conditions
from swiftspec.runtime.decoder import PREFILL_CHUNK, ModelRunner
from swiftspec.runtime.generate import GenerateConfig, cache_slots, generate
from swiftspec.runtime.graphs import ForwardClock
from swiftspec.runtime.kernel_config import KernelConfig, kernel_mismatch
from swiftspec.runtime.launch import load_prompts
from swiftspec.runtime.synthetic import SyntheticVerifier, rank_logprobs
from swiftspec.runtime.tree import tree_slots_needed
from swiftspec.runtime.vocab import shared_vocab, vocab_cut
from swiftspec.runtime.weights import check_checkpoints, load_model
from swiftspec.sim.acceptance import AcceptanceModel, default_acceptance
from swiftspec.sim.hardware import gpu_profile
from swiftspec.sim.latency import LatencyModel
from swiftspec.sim.predict_run import RunWorkload, predict_run, run_trajectories
from swiftspec.sim.profile_default import default_profile
from swiftspec.sim.tree_dp import best_static_tree
from swiftspec.spec import (
    LOOPS,
    AcceptanceProfile,
    Mode,
    ModelSpec,
    Profile,
    Split,
    TreePolicy,
    UserError,
    check_dict,
    check_int,
    check_list,
    check_number,
    check_str,
    parse_json,
    read_text,
    require,
    to_jsonable,
)

REPORT_COLUMNS = (
    "config", "target", "draft", "mode", "policy", "prompts", "max_new_tokens",
    "predicted_tokens_per_s", "measured_tokens_per_s", "error_pct",
    "predicted_accepted", "measured_accepted", "predicted_iteration_ms", "measured_iteration_ms",
    "measured_forward_ms", "measured_host_ms", "predicted_host_ms", "passes", "measured_spread_pct",
    "comparable",
)
CUDA_PAIRS = (("Llama-3-8B", "Llama-3.2-1B"), ("Llama-3.2-3B", "Llama-3.2-1B"), ("Llama-3.2-1B", "Llama-3.2-1B"))
DYNAMIC = ((4, 2, 2), (8, 8, 3), (16, 4, 4))  # (bs, w, d) of the serial configurations
CHAIN_K = (2, 4)
HOST_CAL = {
    Mode.autoregressive: (TreePolicy.autoregressive(),),
    Mode.chain: (TreePolicy.chain(1), TreePolicy.chain(3), TreePolicy.chain(6)),
    Mode.serial: (TreePolicy(bs=4, w=1, d=3), TreePolicy(bs=8, w=8, d=2), TreePolicy(bs=16, w=4, d=5),
                  TreePolicy(bs=32, w=8, d=4),
                  # a static (Sequoia-style) tree: one draft forward per level, refilled from the root
                  TreePolicy(bs=10, w=1, d=0, kind="static", topology=(-1, 0, 0, 0, 1, 1, 2, 4, 4, 7))),
}
HOST_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Config:
    """One configuration to predict and run on one device."""

    target: str
    draft: str | None
    mode: Mode
    policy: TreePolicy

    @property
    def label(self) -> str:
        t = Path(self.target).name
        if self.mode is Mode.autoregressive:
            return f"{t} autoregressive"
        return f"{t} + {Path(self.draft).name} {self.mode.value} {self.policy.key}"


def default_configs(pairs: Sequence[tuple[str, str]], acceptance_positional: Sequence[float],
                    limit: int | None = None) -> list[Config]:
    """Per pair: autoregressive (once per target), chain k in CHAIN_K, serial trees DYNAMIC and the
    Sequoia static tree of 8 nodes; interleaved over pairs so that `limit` keeps every pair."""
    _, topo = best_static_tree(list(acceptance_positional), 8)
    static = TreePolicy(bs=len(topo), w=1, d=0, kind="static", topology=tuple(int(p) for p in topo))
    per_pair: list[list[Config]] = []
    seen_ar: set[str] = set()
    for t, d in pairs:
        cs = []
        if t not in seen_ar:
            seen_ar.add(t)
            cs.append(Config(t, None, Mode.autoregressive, TreePolicy.autoregressive()))
        cs += [Config(t, d, Mode.chain, TreePolicy.chain(k)) for k in CHAIN_K]
        cs += [Config(t, d, Mode.serial, TreePolicy(bs=b, w=w, d=dd)) for b, w, dd in DYNAMIC]
        cs.append(Config(t, d, Mode.serial, static))
        per_pair.append(cs)
    out = [c for row in _interleave(per_pair) for c in row]
    return out[:limit] if limit else out


def _interleave(lists: list[list]) -> list[list]:
    n = max((len(x) for x in lists), default=0)
    return [[x[i] for x in lists if i < len(x)] for i in range(n)]


# --------------------------------------------------------------------------------------------
# host calibration


def stand_in_config(spec: ModelSpec | None) -> dict:
    """config.json of the host-calibration stand-in for a validated model (`spec`; None: the tiny
    reference model, 2 layers, vocab 256).

    Host work per iteration depends on what the runtime does outside the CUDA graphs: eager
    log-softmax + top-w, argmax and logits copies over `vocab`-wide rows, and one graph launch per
    forward whose nodes grow with the layers. So the stand-in keeps the model's vocabulary and
    layer count and is only narrow (hidden 64, 4 heads, 2 KV heads, ffn 128), so that its device
    time per forward stays small and is subtracted exactly (`replay_ms`)."""
    layers, vocab = (2, 256) if spec is None else (spec.num_layers, spec.vocab)
    return dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
                torch_dtype="float32")  # fmt: skip


def _stand_in_model(spec: ModelSpec | None, device: str, seed: int = 0, kernels: KernelConfig | None = None):
    """A random-weight model of `stand_in_config(spec)` (kernels None: the device's defaults)."""
    folder = Path(tempfile.mkdtemp(prefix="swiftspec-validate-"))
    (folder / "config.json").write_text(json.dumps(stand_in_config(spec)))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return load_model(folder, weights="random", device=device, dtype=dtype, seed=seed, kernels=kernels)


def replay_ms(runner, repeats: int = 12) -> dict[int, float] | None:
    """Device time (ms) of one replay of each of `runner`'s CUDA graphs, timed as the profile times
    `forward` (back-to-back replays, events around each, first dropped, median), or None on CPU.

    The runtime replays one graph after a device sync, so the launch latency of a graph sits in
    its iteration but not in the profile's `forward` rows; subtracting this time (not events
    around the runtime's own replays) leaves that latency in the host terms, where the
    simulator adds it back. Call it before decoding: replays write the scratch KV slot only while
    the graphs' static inputs still hold their capture values."""
    if runner.graphs is None or not runner.graphs.use_graphs:
        return None
    out = {}
    for b, g in runner.graphs.graphs.items():
        g = getattr(g, "graph", g)
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats + 1)]
        for s, e in ev:
            s.record()
            g.replay()
            e.record()
        torch.cuda.synchronize()
        out[b] = float(np.median([s.elapsed_time(e) for s, e in ev[1:]]))
    return out


def calibrate_host(device: str, acceptance, prompts: int = 2, new_tokens: int = 32, seed: int = 0,
                   modes: Sequence[Mode] = tuple(HOST_CAL), target: ModelSpec | None = None,
                   draft: ModelSpec | None = None,
                   tree_growth_ms: Callable[[int], float] | None = None, loop: str = "host") -> tuple[pd.DataFrame, dict]:
    """Host work of the runtime's `generate` loop on stand-ins of `target` / `draft`
    (`stand_in_config`; None: the tiny reference model) — profile rows and the fit.

    host per decode = wall time - the forwards' device time (CUDA: `replay_ms` of each replayed
    graph; CPU: perf_counter around each eager forward, as the CPU profile times them) - the
    profile's `tree_growth` of every draft forward (`tree_growth_ms(tokens)`, which the simulator
    adds to each expansion itself; omit it when the profile has none). Policies `HOST_CAL`, rank
    paths drawn with seed + 1 (not the paths a validation replays), random prompts. loop: the
    decoding loop calibrated; for the device loop host = wall time - the device time of its graph
    replays (`GenerateResult.loop_device_ms`, tree work included), the quantity a validation
    measures as its host time: what the host adds between the loop's graphs. The stand-ins'
    forwards replayed apart (`replay_ms`) are slower than inside the loop's graphs, so subtracting
    them left nothing (CPU: the forwards are not timed apart from the loop's tree work, all of it
    counts as forwards).

    Returns (rows with the Profile.compute columns, {"base": {mode: ms}, "per_forward": ms,
    "per_token": ms, "per_node": ms, "samples": n, "stand_in": {...}}).
    """
    tmodel = _stand_in_model(target, device, seed)
    same = draft is None or target is None or draft == target
    dmodel = tmodel if same else _stand_in_model(draft, device, seed + 1)
    logq = tuple(rank_logprobs(acceptance))
    paths = rank_paths(acceptance, prompts, new_tokens + 64, seed + 1)
    gen = torch.Generator().manual_seed(seed)
    shared = min(tmodel.spec.vocab, dmodel.spec.vocab)  # a padded pair runs over its shared ids
    ids = [torch.randint(0, shared, (24,), generator=gen).tolist() for _ in range(prompts)]
    t_runner = ModelRunner(tmodel, 1024, vocab_limit=vocab_cut(tmodel.spec.vocab, shared))
    d_runner = ModelRunner(dmodel, 1024, vocab_limit=vocab_cut(dmodel.spec.vocab, shared))
    fixed = {id(r): replay_ms(r) for r in (t_runner, d_runner)}
    clock = ForwardClock([t_runner, d_runner], fixed_ms=fixed)
    X, y = [], []
    mode_list = list(modes)
    for mode in mode_list:
        for policy in HOST_CAL[mode]:
            spec = mode is not Mode.autoregressive
            cfg = GenerateConfig(mode=mode, policy=policy, max_new_tokens=new_tokens, keep_subtree=False,
                                 rank_logprobs=logq if spec else None, loop=loop)
            for rep in range(prompts + 1):  # the first decode warms up (allocations, graph inputs)
                pi = rep % prompts
                for r in (t_runner, d_runner):
                    r.reset()
                clock.take()
                res = generate(t_runner, d_runner if spec else None, ids[pi], cfg,
                               verifier=SyntheticVerifier(paths[pi]) if spec else None)
                if device == "cuda":
                    torch.cuda.synchronize()
                skip = math.ceil((len(ids[pi]) - 1) / PREFILL_CHUNK) * (2 if spec else 1)
                fwd = clock.take(skip)
                if loop == "device":  # its graphs' device time, tree work included: what `_measure` subtracts
                    fwd, growth = res.loop_device_ms(), 0.0
                else:
                    growth = sum(tree_growth_ms(t) for r in res.records for t in r.forward_tokens) if tree_growth_ms else 0.0
                if rep == 0:
                    continue
                host = res.decode_s * 1e3 - fwd - growth
                onehot = [float(res.iterations if m is mode else 0) for m in mode_list]
                X.append([*onehot, sum(len(r.forward_tokens) for r in res.records),
                          sum(sum(r.forward_tokens) for r in res.records), sum(r.verified for r in res.records)])
                y.append(host)
    coef, _ = nnls(np.asarray(X), np.asarray(y))
    base = {m.value: float(c) for m, c in zip(mode_list, coef)}
    per_forward, per_token, per_node = (float(c) for c in coef[len(mode_list):])
    stand_in = {"target_layers": tmodel.spec.num_layers, "draft_layers": dmodel.spec.num_layers,
                "vocab": tmodel.spec.vocab, "device_time": ("loop graphs" if loop == "device" else "replay_ms") if fixed[id(t_runner)] else "perf_counter",
                "tree_growth_subtracted": tree_growth_ms is not None}
    fit = {"base": base, "per_forward": per_forward, "per_token": per_token, "per_node": per_node,
           "samples": len(y), "stand_in": stand_in}
    return host_rows_from_fit(fit), fit


def host_rows_from_fit(fit: dict) -> pd.DataFrame:
    """Profile rows (`host`, `host_expansion`, `host_verify`; Profile.compute columns) of a host fit
    ({"base": {mode: ms}, "per_forward", "per_token", "per_node": ms})."""
    rows = []
    for mode, base in fit["base"].items():
        rows.append({"op": "host", "model": mode, "tp": 1, "tokens": 0, "kv_len": 0, "ms": base})
        for t in HOST_TOKENS:
            if mode != Mode.autoregressive.value:
                rows.append({"op": "host_expansion", "model": mode, "tp": 1, "tokens": t, "kv_len": 0,
                             "ms": fit["per_forward"] + fit["per_token"] * t})
            rows.append({"op": "host_verify", "model": mode, "tp": 1, "tokens": t, "kv_len": 0,
                         "ms": fit["per_node"] * t})
    return pd.DataFrame(rows)


def with_host_rows(profile: Profile, rows: pd.DataFrame) -> Profile:
    """The profile with its host rows for the calibrated modes replaced by `rows`."""
    c = profile.compute
    ops = {"host", "host_expansion", "host_verify"}
    drop = c["op"].isin(ops) & c["model"].isin(set(rows["model"]))
    compute = pd.concat([c[~drop], rows], ignore_index=True)
    meta = {**profile.meta, "host_calibrated": True}
    return Profile(compute=compute, comm=profile.comm, meta=meta)


# --------------------------------------------------------------------------------------------
# the sweep


@dataclass
class ValidationReport:
    """rows: one per configuration (REPORT_COLUMNS); summary: median/max |error|; meta: labels."""

    rows: pd.DataFrame
    summary: dict
    meta: dict

    def write(self, folder: str | Path) -> Path:
        folder = Path(folder)
        doc = {"meta": self.meta, "summary": self.summary,
               "rows": json.loads(self.rows.to_json(orient="records"))}
        with atomic_dir(folder) as tmp:
            self.rows.to_csv(tmp / "report.csv", index=False)
            (tmp / "report.json").write_text(json.dumps(to_jsonable(doc), indent=2, default=str) + "\n")
            if "host_rows" in self.meta:
                pd.DataFrame(self.meta["host_rows"]).to_csv(tmp / "host.csv", index=False)
        return folder


def summarize(rows: pd.DataFrame) -> dict:
    """median and max |error_pct| over configurations with both numbers, and how many."""
    err = rows["error_pct"].dropna().abs()
    if err.empty:
        return {"configs": int(len(rows)), "compared": 0, "median_abs_error_pct": None, "max_abs_error_pct": None}
    worst = rows.loc[err.idxmax(), "config"]
    return {"configs": int(len(rows)), "compared": int(len(err)), "median_abs_error_pct": float(err.median()),
            "max_abs_error_pct": float(err.max()), "worst": str(worst),
            "goal": "median |error| <= 3 %, max <= 8 %",
            "goal_met": bool(err.median() <= 3.0 and err.max() <= 8.0), **split_errors(rows)}


def split_errors(rows: pd.DataFrame) -> dict:
    """Where the tokens/s error comes from: |predicted / measured - 1| in % of the forwards' device
    time per iteration (predicted iteration - predicted host vs measured forward ms) and of the host
    time per iteration, median and max over configurations; {} without those columns."""
    cols = ("predicted_iteration_ms", "predicted_host_ms", "measured_forward_ms", "measured_host_ms")
    if not set(cols) <= set(rows.columns):
        return {}
    forward = ((rows.predicted_iteration_ms - rows.predicted_host_ms) / rows.measured_forward_ms - 1).abs().dropna() * 100
    host = (rows.predicted_host_ms / rows.measured_host_ms - 1).abs().dropna() * 100
    if forward.empty or host.empty:
        return {}
    return {"forward_median_abs_error_pct": float(forward.median()), "forward_max_abs_error_pct": float(forward.max()),
            "host_median_abs_error_pct": float(host.median()), "host_max_abs_error_pct": float(host.max())}


def _default_profile(device: str) -> str | None:
    if device != "cuda":
        return None
    p = Path(str(resources.files("swiftspec") / "data" / "profiles" / "h200-measured"))
    return str(p) if (p / "compute.csv").exists() else None


def _default_acceptance() -> str | None:
    p = Path(str(resources.files("swiftspec") / "data" / "acceptance" / "smollm2-135m__int3g32.json"))
    return str(p) if p.exists() else None


@dataclass(frozen=True)
class SweepOptions:
    """What `validate` predicts and runs.

    device: "cuda" or "cpu"; gpus: devices (1 for now: autoregressive, chain, serial). pairs:
    (target, draft) names or checkpoint folders (None: `CUDA_PAIRS` on cuda; cpu needs them).
    configs: only the first N configurations (`default_configs`). weights: "random" or
    "checkpoint". prompts: builtin prompts per configuration, `max_new_tokens` each. passes: runs
    of every configuration (measured numbers: medians over passes). seed: random weights, rank
    paths and the host calibration's prompts. loop: the decoding loop measured and calibrated
    (`GenerateConfig.loop`; None: the profile's, meta.json `loop`, host when it names none).
    """

    device: str = "cuda"
    pairs: tuple[tuple[str, str], ...] | None = None
    configs: int | None = None
    weights: str = "random"
    prompts: int = 3
    max_new_tokens: int = 64
    passes: int = 1
    seed: int = 0
    gpus: int = 1
    loop: str | None = None


def validate(
    sweep: SweepOptions = SweepOptions(),
    *,
    profile: str | None = None,
    acceptance: str | None = None,
    calibrate: bool = True,
    host_reference: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Predict, then run, every configuration of `sweep` (module docstring) from `profile`
    (default: the bundled measured one on cuda) and `acceptance` (default: the bundled measured
    pair). calibrate: measure host work per pair first; host_reference: also fit the tiny
    reference model (default: on cuda). Returns the report (not written)."""
    gpus, device, configs, pairs = sweep.gpus, sweep.device, sweep.configs, sweep.pairs
    weights, prompts, max_new_tokens, passes, seed = (sweep.weights, sweep.prompts, sweep.max_new_tokens,
                                                      sweep.passes, sweep.seed)
    say = log or (lambda s: None)
    if gpus != 1:
        raise UserError("validate runs on one device for now (--gpus 1): async needs two GPUs and a launcher")
    if device not in ("cuda", "cpu"):
        raise UserError(f"--device must be cuda or cpu, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but no CUDA GPU is available: use --device cpu")
    if prompts < 1 or max_new_tokens < 1 or passes < 1 or (configs is not None and configs < 1):
        raise UserError("--prompts, --max-new-tokens, --passes and --configs must be positive")
    if weights not in ("random", "checkpoint"):
        raise UserError(f"weights must be random or checkpoint, got {weights!r}")
    pairs = list(pairs or (CUDA_PAIRS if device == "cuda" else ()))
    if not pairs:
        raise UserError("give model pairs: --pairs TARGET:DRAFT,... (on cpu: checkpoint folders or bundled names)")
    if weights == "checkpoint":  # a truncated file or weights unlike the config: one line, before any model
        check_checkpoints(*dict.fromkeys(name for pair in pairs for name in pair))

    if profile is None and device == "cuda":
        profile, why = gpu_profile(torch.cuda.get_device_name(), [m for pair in pairs for m in pair])
        say(f"profile: {why} (--profile to choose another)")
    if profile is None:
        if device == "cpu":
            raise UserError("--device cpu needs a CPU profile: give --profile DIR (from `swiftspec profile compute --device cpu`)")
        prof, prof_label = default_profile()[0], "derived"
    else:
        prof = Profile.load(profile)
        prof_label = prof.label
    if prof.meta.get("device", "cuda") != device:
        raise UserError(f"profile {profile} was measured on {prof.meta.get('device')}, not {device}")
    # an fp8 profile (`profile compute --weight-format fp8`) is validated on fp8 models
    weight_format = prof.meta.get("weight_format", "native")
    # the loop whose host work the profile measured, unless the sweep names one
    sweep = replace(sweep, loop=sweep.loop or prof.meta.get("loop", "host"))
    if sweep.loop not in LOOPS:
        raise UserError(f"--loop must be one of {', '.join(LOOPS)}, got {sweep.loop!r}")
    stale = [m for m in kernel_mismatch(prof.meta, device) if not m.startswith("weight_format:")]
    if stale:  # predictions then describe other kernels than the ones that run
        say(f"warning: the profile's kernels differ from the runtime's ({'; '.join(stale)}): re-profile "
            "with `swiftspec profile compute` for predictions of what runs")
    acceptance = acceptance or _default_acceptance()
    acc = AcceptanceProfile.load(acceptance) if acceptance else default_acceptance()[0]
    acc_label = acc.label if acc.synthetic else f"synthetic (replay of measured {Path(acceptance).name})"
    acc_model = AcceptanceModel(acc)

    cfgs = default_configs(pairs, acc.positional, configs)
    shared = {(t, d): shared_vocab(t, d) for t, d in pairs}  # the one mismatch line of every verb

    # prompts and rank paths: the same for every configuration
    vocab = min(shared.values())
    ids, how = load_prompts("builtin", pairs[0][0], vocab, prompts)
    paths = rank_paths(acc, len(ids), max_new_tokens + 64, seed)
    logq = tuple(rank_logprobs(acc))
    prompt_lens = [len(p) for p in ids]
    dtype = "bfloat16" if device == "cuda" else "float32"
    memory = check_models(device, sweep_models(cfgs, ids, max_new_tokens, dtype, weight_format), "this sweep",
                          shared_weights=True)
    label = not_comparable(profile_conditions(prof.meta, device), run_conditions(device, dtype, weight_format))
    if label:
        say(f"{label}: predictions are made, errors are not computed")
    base_lat = LatencyModel(prof)
    lats: dict[Config, LatencyModel] = {c: base_lat for c in cfgs}
    host_fit, host_rows = None, None
    if calibrate:
        host_fit, host_rows = {}, []
        if host_reference if host_reference is not None else device == "cuda":
            say("host work, reference: tiny stand-in (2 layers, vocab 256), for comparison only ...")
            _, ref = calibrate_host(device, acc, prompts=1, new_tokens=24, seed=seed, loop=sweep.loop)
            host_fit["reference tiny-2L-v256"] = ref
            say(f"host fit tiny-2L-v256 (reference): {_fit_line(ref)}")
        for t_name, d_name in pairs:
            if not any(c.target == t_name and c.draft in (d_name, None) for c in cfgs):
                continue  # --configs left this pair out
            t_spec, d_spec = ModelSpec.from_config(t_name), ModelSpec.from_config(d_name)
            key = f"{Path(t_name).name}+{Path(d_name).name}"
            say(f"calibrating host work for {key}: stand-ins {t_spec.num_layers}/{d_spec.num_layers} layers, "
                f"vocab {t_spec.vocab} ...")
            growth = _tree_growth_fn(base_lat, d_spec)
            # 3 prompts on CUDA: the fit has 6 terms, and 2 prompts (18 decodes) leave them noisy
            # from pair to pair though the pairs' host work is about the same
            rows, fit = calibrate_host(device, acc, prompts=3 if device == "cuda" else 2, seed=seed, target=t_spec,
                                       draft=d_spec, tree_growth_ms=growth, loop=sweep.loop)
            host_fit[key] = fit
            host_rows += [{"pair": key, **r} for r in rows.to_dict(orient="records")]
            say(f"host fit {key}: {_fit_line(fit)}")
            _use_for_pair(lats, base_lat, t_name, d_name, LatencyModel(with_host_rows(prof, rows)))

    # 1. predictions, recorded before anything runs
    preds = _predict_all(cfgs, lats, acc_model, prompt_lens, max_new_tokens, paths, say)

    # 2. run them all in this process
    measured = _run_all(cfgs, ids, paths, logq, sweep, KernelConfig.resolve(device, weight_format=weight_format), say,
                        shared)
    table = _report_table(cfgs, preds, measured, len(ids), max_new_tokens, comparable=label is None)
    meta = {**run_metadata(device), "profile": profile or "builtin:h200-derived", "profile_label": prof_label,
            "acceptance": acceptance or "builtin:qwen2-72b-table7", "acceptance_label": acc_label,
            "weights": weights, "weight_format": weight_format, "device": device, "gpus": gpus, "loop": sweep.loop,
            "pairs": [list(p) for p in pairs],
            "prompts": len(ids), "prompt_lens": prompt_lens, "tokenized_with": how,
            "max_new_tokens": max_new_tokens, "seed": seed, "passes": passes,
            "host_calibration": host_fit, "load": _load(), "profile_kernel_mismatch": stale,
            "dtype": dtype, "memory": memory, "comparable": label is None, "comparability": label or "comparable",
            "notes": "predicted: simulated for this run's own workload (prompt lengths, max_new_tokens, the "
                     "rank paths the synthetic verifier replays); measured: decode tokens/s (prefill excluded), "
                     "mean over prompts; forward_ms / host_ms: per iteration, device time of the forwards "
                     "(CUDA events around each replay; CPU: perf_counter) and the rest; with passes > 1 each measured "
                     "number is the median over passes (every configuration once per pass) and measured_spread_pct "
                     "the tokens/s range over passes; predicted_host_ms: the calibrated "
                     "host terms, which on CUDA also hold the launch latency of each replay (measured forwards "
                     "include it, the profile's back-to-back forwards do not): compare iteration times"}  # fmt: skip
    if host_rows:
        meta["host_rows"] = host_rows
    return ValidationReport(table, summarize(table), meta)


def _use_for_pair(lats: dict, base_lat, t_name: str, d_name: str, lat) -> None:
    """Give `lat` (a pair's host-calibrated latency model) to that pair's configurations;
    autoregressive ones have no draft: they take the first pair with their target."""
    for c in lats:
        if c.target == t_name and (c.draft == d_name or (c.draft is None and lats[c] is base_lat)):
            lats[c] = lat


def _predict_all(cfgs: list[Config], lats: dict, acc_model, prompt_lens: list[int], max_new: int,
                 paths: list[list[int]], say: Callable[[str], None]) -> dict[Config, dict]:
    """Config -> {"tokens_per_s", "accepted", "iteration_ms", "host_ms"} (or {"error"}), simulated
    for the sweep's own workload with each configuration's latency model."""
    preds: dict[Config, dict] = {}
    for c in cfgs:
        t = ModelSpec.from_config(c.target)
        d = ModelSpec.from_config(c.draft) if c.draft else None
        split = Split.shared(1, with_draft=c.mode is not Mode.autoregressive)
        try:
            lat = lats[c]
            s = predict_run(lat, acc_model, t, d, split, c.mode, c.policy,
                            RunWorkload(prompt_lens, max_new, paths)).summary
            preds[c] = {"tokens_per_s": s.tokens_per_s_mean, "accepted": s.mean_accepted,
                        "iteration_ms": s.iteration_ms,
                        "host_ms": _host_per_iteration(lat, acc_model, c, paths, max_new)}
            say(f"predicted {c.label}: {s.tokens_per_s_mean:.1f} tok/s, accepted {s.mean_accepted:.2f}, "
                f"iteration {s.iteration_ms:.3f} ms")
        except UserError as e:
            preds[c] = {"error": str(e)}
            say(f"no prediction for {c.label}: {e}")
    say(f"predicted {sum('error' not in p for p in preds.values())} of {len(cfgs)} configurations")
    return preds


def _report_table(cfgs: list[Config], preds: dict[Config, dict], measured: dict[Config, dict], prompts: int,
                  max_new: int, comparable: bool = True) -> pd.DataFrame:
    """One row per configuration (REPORT_COLUMNS). comparable: the profile was measured on the
    run's device, dtype and weight format (else `error_pct` is kept but not shown as an error)."""
    rows = []
    for c in cfgs:
        p, m = preds[c], measured[c]
        ptps = p.get("tokens_per_s")
        err = 100.0 * (m["tokens_per_s"] - ptps) / ptps if ptps and m["tokens_per_s"] == m["tokens_per_s"] else None
        rows.append({"config": c.label, "target": Path(c.target).name, "draft": Path(c.draft).name if c.draft else None,
                     "mode": c.mode.value, "policy": c.policy.key, "prompts": prompts, "max_new_tokens": max_new,
                     "predicted_tokens_per_s": ptps, "measured_tokens_per_s": m["tokens_per_s"], "error_pct": err,
                     "predicted_accepted": p.get("accepted"), "measured_accepted": m["accepted"],
                     "predicted_iteration_ms": p.get("iteration_ms"), "measured_iteration_ms": m["iteration_ms"],
                     "measured_forward_ms": m["forward_ms"], "measured_host_ms": m["host_ms"],
                     "predicted_host_ms": p.get("host_ms"), "passes": m.get("passes", 1),
                     "measured_spread_pct": m.get("spread_pct"), "comparable": comparable})  # fmt: skip
    return pd.DataFrame(rows, columns=list(REPORT_COLUMNS))


# --------------------------------------------------------------------------------------------
# re-prediction of a measured sweep

_LOG_FIT = re.compile(r"^host fit (?P<key>\S+): (?P<terms>\{.*\}) base (?P<base>\{.*\})$")
_LOG_WORKLOAD = re.compile(r"^workload: (?P<prompts>\d+) prompts .*, (?P<new>\d+) new tokens each")


def read_sweep(source: str | Path) -> dict:
    """The measured side of a sweep: {"pairs", "prompts", "max_new_tokens", "seed", "fits": {pair:
    fit}, "measured": {config label: {"tokens_per_s", "accepted", "iteration_ms", "forward_ms",
    "host_ms"}}} from a report.json (or its folder) or from the log `validate` prints (the table
    and the "host fit" lines; seed 0). Every field is type-checked: a bad one -> UserError naming
    the file and the field (or line)."""
    path = Path(source)
    if path.is_dir():
        path = path / "report.json"
    if not path.is_file():
        raise UserError(f"{source}: no such file (give a validation report.json, its folder, or a validation log)")
    text = read_text(path, "validation report")
    where = f"validation report {source}"
    if path.suffix == ".json":
        sweep, fits, measured = _sweep_from_json(parse_json(text, where), where)
    else:
        sweep, fits, measured = _sweep_from_log(text, where)
    fits = {k: f for k, f in fits.items() if "+" in k}  # the reference fit on the tiny model is not a pair's
    if not measured or not sweep["prompts"] or not sweep["max_new_tokens"]:
        raise UserError(f"{source}: not a validation report or log (no measured table / workload line)")
    check_int(sweep["prompts"], where, "prompts", lo=1)
    check_int(sweep["max_new_tokens"], where, "max_new_tokens", lo=1)
    check_int(sweep["seed"], where, "seed")
    if not fits:
        raise UserError(f"{source}: has no per-pair host calibration; re-run validate with --calibrate-host")
    for key, fit in fits.items():
        fw = f"{where} host fit {key}"
        check_dict(fit, fw, "fit")
        for term in ("per_forward", "per_token", "per_node"):
            check_number(require(fit, term, fw), fw, term)
        for mode, ms in check_dict(require(fit, "base", fw), fw, "base").items():
            check_number(ms, fw, f"base[{mode!r}]")
    return {**sweep, "fits": fits, "measured": measured}


def _sweep_from_json(doc: object, where: str) -> tuple[dict, dict, dict]:
    """(sweep, fits, measured) of a report.json document (`read_sweep`)."""
    if not isinstance(doc, dict):
        raise UserError(f"{where} is malformed: expected a JSON object")
    meta = check_dict(doc.get("meta", {}), where, "meta")
    fits = dict(check_dict(meta.get("host_calibration") or {}, where, "meta host_calibration"))

    def value(r: dict, key: str, i: int) -> float | None:
        v = r.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UserError(f"{where}: rows[{i}] {key} must be a number, got {v!r:.40}")
        return v

    measured = {}
    for i, r in enumerate(check_list(doc.get("rows", []), where, "rows")):
        check_dict(r, where, f"rows[{i}]")
        measured[check_str(require(r, "config", f"{where} rows[{i}]"), where, f"rows[{i}] config")] = {
            "tokens_per_s": value(r, "measured_tokens_per_s", i), "accepted": value(r, "measured_accepted", i),
            "iteration_ms": value(r, "measured_iteration_ms", i), "forward_ms": value(r, "measured_forward_ms", i),
            "host_ms": value(r, "measured_host_ms", i), "passes": value(r, "passes", i) or 1,
            "spread_pct": value(r, "measured_spread_pct", i)}  # fmt: skip
    pairs = []
    for i, pr in enumerate(check_list(meta.get("pairs", []), where, "meta pairs")):
        if not (isinstance(pr, list) and len(pr) == 2 and all(isinstance(x, str) and x for x in pr)):
            raise UserError(f"{where}: meta pairs[{i}] must be [target, draft] (two model names), got {pr!r:.60}")
        pairs.append(tuple(pr))
    sweep = {"pairs": pairs, "prompts": meta.get("prompts"), "max_new_tokens": meta.get("max_new_tokens"),
             "seed": meta.get("seed", 0)}
    return sweep, fits, measured


def _log_cell(x: str, where: str) -> float:
    """A number of the printed table (`-` or nan: not measured)."""
    if x in ("-", "nan"):
        return float("nan")
    try:
        return float(x)
    except ValueError:
        raise UserError(f"{where}: table cell {x!r:.30} is not a number") from None


def _sweep_from_log(text: str, where: str) -> tuple[dict, dict, dict]:
    """(sweep, fits, measured) of the log `validate` prints (`read_sweep`)."""
    fits, measured, sweep = {}, {}, {"pairs": [], "prompts": None, "max_new_tokens": None, "seed": 0}
    header = False
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.rstrip()
        lw = f"{where} line {n}"
        if m := _LOG_FIT.match(line):
            fits[m["key"]] = {**check_dict(parse_json(m["terms"], lw), lw, "host fit terms"),
                              "base": check_dict(parse_json(m["base"], lw), lw, "host fit base")}
        elif m := _LOG_WORKLOAD.match(line):
            if len(m["prompts"]) > 9 or len(m["new"]) > 9:
                raise UserError(f"{lw}: the workload's numbers are out of range")
            sweep["prompts"], sweep["max_new_tokens"] = int(m["prompts"]), int(m["new"])
        elif line.lstrip().startswith("config pred tok/s"):
            header = True
        elif header and line.startswith("median |error|"):
            header = False
        elif header and line.strip():
            cells = line.split()
            if len(cells) < 10:
                continue
            label, v = " ".join(cells[:-9]), cells[-9:]
            measured[label] = {k: _log_cell(v[i], lw) for k, i in (("tokens_per_s", 1), ("accepted", 4),
                               ("iteration_ms", 6), ("forward_ms", 7), ("host_ms", 8))}
    sweep["pairs"] = [tuple(k.split("+", 1)) for k in fits if "+" in k]
    return sweep, fits, measured


def repredict(source: str | Path, profile: str | None = None, acceptance: str | None = None,
              log: Callable[[str], None] | None = None) -> ValidationReport:
    """Predict an already measured sweep again, from `profile` (default: the bundled H200 one): the
    same configurations, workload, rank paths and per-pair host calibration as the run (host work
    measured before the run, on stand-ins), only the device-time tables change. For a sweep whose
    profile was incomplete or stale when it ran; the report says so (meta `repredicted`)."""
    say = log or (lambda s: None)
    sweep = read_sweep(source)
    profile = profile or _default_profile("cuda")
    if profile is None:
        raise UserError("give --profile DIR: no bundled measured profile")
    prof = Profile.load(profile)
    acceptance = acceptance or _default_acceptance()
    acc = AcceptanceProfile.load(acceptance)
    acc_model = AcceptanceModel(acc)
    pairs = sweep["pairs"]
    cfgs = [c for c in default_configs(pairs, acc.positional, None) if c.label in sweep["measured"]]
    if not cfgs:
        raise UserError(f"{source}: none of its configurations is one `validate` makes for pairs {pairs}")
    base_lat = LatencyModel(prof)
    lats: dict[Config, LatencyModel] = {c: base_lat for c in cfgs}
    for t_name, d_name in pairs:
        key = f"{Path(t_name).name}+{Path(d_name).name}"
        if key not in sweep["fits"]:
            raise UserError(f"{source}: no host calibration for pair {key}")
        _use_for_pair(lats, base_lat, t_name, d_name,
                      LatencyModel(with_host_rows(prof, host_rows_from_fit(sweep["fits"][key]))))
    vocab = min(ModelSpec.from_config(t).vocab for pair in pairs for t in pair)
    ids, how = load_prompts("builtin", pairs[0][0], vocab, sweep["prompts"])
    paths = rank_paths(acc, len(ids), sweep["max_new_tokens"] + 64, sweep["seed"])
    preds = _predict_all(cfgs, lats, acc_model, [len(p) for p in ids], sweep["max_new_tokens"], paths, say)
    measured = {c: sweep["measured"][c.label] for c in cfgs}
    table = _report_table(cfgs, preds, measured, len(ids), sweep["max_new_tokens"])
    meta = {**run_metadata("cpu"), "profile": profile, "profile_label": prof.label, "acceptance": acceptance,
            "acceptance_label": f"synthetic (replay of measured {Path(acceptance).name})", "weights": "random",
            "device": "cuda", "tokenized_with": how, "pairs": [list(p) for p in pairs], "prompts": len(ids), "max_new_tokens": sweep["max_new_tokens"],
            "seed": sweep["seed"], "host_calibration": sweep["fits"],
            "repredicted": {"measured_in": str(source), "note": "measured numbers and host calibration from the "
                            "run; predictions made afterwards from this profile (device-time tables only)"}}
    return ValidationReport(table, summarize(table), meta)


def _fit_line(fit: dict) -> str:
    terms = {k: round(fit[k], 4) for k in ("per_forward", "per_token", "per_node")}
    return json.dumps(terms) + " base " + json.dumps({k: round(v, 4) for k, v in fit["base"].items()})


def _tree_growth_fn(lat, draft: ModelSpec) -> Callable[[int], float] | None:
    """tokens -> the profile's `tree_growth` ms of `draft` at tp 1, or None when it has no such rows."""
    try:
        lat.tree_growth_ms(draft, 1, 1)
    except UserError:
        return None
    return lambda t: lat.tree_growth_ms(draft, 1, t)


def _host_per_iteration(lat, acc_model, c: Config, paths, max_new: int) -> float:
    """Predicted host ms per iteration: base + host of every draft forward + of the verify."""
    total, n = 0.0, 0
    base = lat.host_ms(c.mode)
    for traj in run_trajectories(acc_model, c.mode, c.policy, paths, max_new):
        for tr in traj:
            total += base + lat.host_verify_ms(c.mode, tr.sent)
            total += sum(lat.host_expansion_ms(c.mode, f) for f, _ in (*tr.pre, *tr.overlap))
            n += 1
    return total / max(n, 1)


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def sweep_models(cfgs: list[Config], ids: list[list[int]], max_new: int, dtype: str,
                 weight_format: str) -> list[tuple[ModelSpec, int]]:
    """What `_run_all` holds at once, for the memory check: one (spec, KV slots) per runner, a
    runner per model and role (the weights of a model in two roles are loaded once)."""
    longest = max(len(p) for p in ids)
    slots = max(cache_slots(longest, max_new, c.policy, draft=True) for c in cfgs) + 8
    roles = {(c.target, "target") for c in cfgs} | {(c.draft, "draft") for c in cfgs if c.draft}
    return [(model_spec(name, dtype, weight_format), slots) for name, _ in sorted(roles)]


def _run_all(cfgs: list[Config], ids: list[list[int]], paths: list[list[int]], logq: tuple[float, ...],
             sweep: SweepOptions, kernels: KernelConfig, say: Callable[[str], None],
             shared: dict[tuple[str, str], int] | None = None) -> dict[Config, dict]:
    """Run every configuration (models and runners made once, reused) `sweep.passes` times, all
    configurations once per pass; measured numbers per config: the median over passes of each
    pass's means over prompts (`_measure`), so a slow spell of the host during one pass does not
    decide a configuration's number; `passes` and `spread_pct` (max - min tokens/s over passes, %
    of the median) say how steady it was. kernels: the models' (weight format: the profile's).
    shared: (target, draft) -> the pair's shared ids (`runtime.vocab`): both models' logits are cut
    there in that pair's configurations."""
    device, weights, seed, max_new, passes = sweep.device, sweep.weights, sweep.seed, sweep.max_new_tokens, sweep.passes
    weight_format = kernels.weight_format
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    longest = max(len(p) for p in ids)
    slots = max(cache_slots(longest, max_new, c.policy, draft=True) for c in cfgs) + 8
    # graphs take tree masks as wide as the widest tree region (+ pending tokens), not the whole
    # cache: the tree attention kernel reads prefix + mask width keys, the profile timed prefix + T
    max_tree = max(tree_slots_needed(c.policy) + 2 * c.policy.bs + 8 for c in cfgs)
    models: dict[tuple, object] = {}
    runners: dict[tuple, ModelRunner] = {}

    def model(name: str, role: str):
        # random weights: a self-draft is the target itself; a distinct draft gets its own seed
        key = (name, seed)
        if key not in models:
            t0 = time.perf_counter()
            models[key] = load_model(name, weights=weights, device=device, dtype=dtype, seed=seed, kernels=kernels)
            fmt = "" if weight_format == "native" else f", {weight_format}"
            say(f"loaded {Path(name).name} ({weights} weights{fmt}) in {time.perf_counter() - t0:.1f} s")
        return models[key]

    def runner(name: str, role: str, vocab: int | None = None) -> ModelRunner:
        m = model(name, role)
        cut = vocab_cut(m.spec.vocab, vocab)
        key = (name, role, cut)
        if key not in runners:
            t0 = time.perf_counter()
            runners[key] = ModelRunner(m, slots, max_tree=max_tree, vocab_limit=cut)
            say(f"runner {Path(name).name} ({role}): {slots} KV slots, tree masks <= {max_tree}, graphs in "
                f"{time.perf_counter() - t0:.1f} s")
        return runners[key]

    fields = ("tokens_per_s", "accepted", "iteration_ms", "forward_ms", "host_ms")
    nan = float("nan")
    seen: dict[Config, list[dict]] = {c: [] for c in cfgs}
    failed: set[Config] = set()
    for p in range(passes):
        for i, c in enumerate(cfgs):
            if c in failed:
                continue
            try:
                vocab = (shared or {}).get((c.target, c.draft)) if c.draft else None
                run = lambda name, role, v=vocab: runner(name, role, v)  # noqa: E731
                seen[c].append(_measure(c, run, ids, paths, logq, max_new, device, warm=p == 0, loop=sweep.loop))
            except (RuntimeError, ValueError) as e:  # one broken configuration must not sink the sweep
                say(f"[{i + 1}/{len(cfgs)}] {c.label} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
                failed.add(c)
                continue
            tag = f" (pass {p + 1}/{passes})" if passes > 1 else ""
            say(f"[{i + 1}/{len(cfgs)}] {c.label}{tag}: {seen[c][-1]['tokens_per_s']:.1f} tok/s, "
                f"accepted {seen[c][-1]['accepted']:.2f}")
    out: dict[Config, dict] = {}
    for c in cfgs:
        if c in failed:
            out[c] = {**dict.fromkeys(fields, nan), "passes": 0, "spread_pct": nan}
            continue
        tps = [m["tokens_per_s"] for m in seen[c]]
        out[c] = {f: float(np.median([m[f] for m in seen[c]])) for f in fields}
        out[c].update(passes=len(tps), spread_pct=100.0 * (max(tps) - min(tps)) / float(np.median(tps)))
    return out


def _measure(c: Config, runner, ids: list[list[int]], paths: list[list[int]], logq: tuple[float, ...], max_new: int,
             device: str, warm: bool, loop: str = "host") -> dict:
    """One pass of configuration `c` over every prompt: the means over prompts of decode tokens/s,
    accepted length, and per-iteration wall, forward-device and host ms. warm: first a decode of
    the first prompt (allocator, caches, first replays; for the device loop its graphs' capture).
    loop: the decoding loop; the device loop's "forward" time is the device time of its graphs,
    tree work included (CPU: its phases' wall time)."""
    spec = c.mode is not Mode.autoregressive
    target = runner(c.target, "target")
    draft = runner(c.draft, "draft") if spec else None
    rs = [target] + ([draft] if draft is not None else [])
    clock = ForwardClock(rs)
    cfg = GenerateConfig(mode=c.mode, policy=c.policy, max_new_tokens=max_new, keep_subtree=False,
                         rank_logprobs=logq if spec else None, loop=loop)

    def once(pi: int, cfg: GenerateConfig = cfg):
        for r in rs:
            r.reset()
        if device == "cuda":
            torch.cuda.synchronize()
        clock.take()
        res = generate(target, draft, ids[pi], cfg, verifier=SyntheticVerifier(paths[pi]) if spec else None)
        if device == "cuda":
            torch.cuda.synchronize()
        skip = math.ceil((len(ids[pi]) - 1) / PREFILL_CHUNK) * len(rs)
        fwd = clock.take(skip)
        if loop == "device":
            fwd = res.loop_device_ms()
        return res, fwd

    if warm:  # the device loop is captured per max_new_tokens: warm it at the measured one
        once(0, cfg if loop == "device" else replace(cfg, max_new_tokens=min(max_new, 16)))
    tps, acc, it_ms, fwd_ms, host_ms = [], [], [], [], []
    for pi in range(len(ids)):
        res, fwd = once(pi)
        tps.append(len(res.tokens) / res.decode_s)
        acc.extend(r.accepted for r in res.records)
        it_ms.append(res.decode_s * 1e3 / res.iterations)
        fwd_ms.append(fwd / res.iterations)
        host_ms.append((res.decode_s * 1e3 - fwd) / res.iterations)
    return {"tokens_per_s": float(np.mean(tps)), "accepted": float(np.mean(acc)), "iteration_ms": float(np.mean(it_ms)),
            "forward_ms": float(np.mean(fwd_ms)), "host_ms": float(np.mean(host_ms))}


def format_report(rep: ValidationReport) -> str:
    """The table `swiftspec validate` prints, then the summary line and labels."""
    t = rep.rows
    comparable = bool(rep.meta.get("comparable", True))
    show = pd.DataFrame({
        "config": t["config"], "pred tok/s": t["predicted_tokens_per_s"].map(_f1),
        "meas tok/s": t["measured_tokens_per_s"].map(_f1),
        "error": t["error_pct"].map(lambda x: "-" if x is None or x != x else f"{x:+.1f}%" if comparable else "n/c"),
        "pred acc": t["predicted_accepted"].map(_f2), "meas acc": t["measured_accepted"].map(_f2),
        "pred iter ms": t["predicted_iteration_ms"].map(_f2), "meas iter ms": t["measured_iteration_ms"].map(_f2),
        "meas fwd ms": t["measured_forward_ms"].map(_f2), "meas host ms": t["measured_host_ms"].map(_f2),
    })  # fmt: skip
    s, m = rep.summary, rep.meta
    lines = [f"profile: {m['profile']} ({m['profile_label']})   acceptance: {m['acceptance_label']}   "
             f"weights: {m['weights']}   device: {m['device']}",
             f"workload: {m['prompts']} prompts ({m['tokenized_with']}), {m['max_new_tokens']} new tokens each",
             show.to_string(index=False)]
    if "repredicted" in m:
        lines.insert(0, f"re-predicted: measured in {m['repredicted']['measured_in']}; {m['repredicted']['note']}")
    if m.get("profile_kernel_mismatch"):
        lines.insert(1, f"profile kernels differ from the runtime's: {'; '.join(m['profile_kernel_mismatch'])}")
    if not comparable:
        lines.append(f"{m['comparability']}: predictions shown, no error computed (report.csv keeps the numbers, "
                     "column `comparable`)")
    elif s.get("compared"):
        lines.append(f"median |error| {s['median_abs_error_pct']:.2f} %   max |error| {s['max_abs_error_pct']:.2f} % "
                     f"({s['worst']})   over {s['compared']} configurations; goal: {s['goal']}")
        if "forward_median_abs_error_pct" in s:
            lines.append(f"of which forwards (device time per iteration): median |error| "
                         f"{s['forward_median_abs_error_pct']:.2f} %, max {s['forward_max_abs_error_pct']:.2f} %; "
                         f"host time per iteration: median {s['host_median_abs_error_pct']:.1f} %, "
                         f"max {s['host_max_abs_error_pct']:.1f} %")
    spread = t["measured_spread_pct"].dropna() if "measured_spread_pct" in t else t.iloc[:0]
    if m.get("passes", 1) > 1 and len(spread):
        lines.append(f"measured: median of {m['passes']} passes (every configuration once per pass); tokens/s range "
                     f"over passes: median {spread.median():.1f} %, max {spread.max():.1f} % "
                     f"({t.loc[spread.idxmax(), 'config']})")
    return "\n".join(lines)


def _f1(x) -> str:
    return "-" if x is None or x != x else f"{x:.1f}"


def _f2(x) -> str:
    return "-" if x is None or x != x else f"{x:.2f}"
