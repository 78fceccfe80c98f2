"""`swiftspec run --plan`: a plan on the runtime, measured against the simulator's prediction.

The layer above both halves: the runtime (`runtime.launch`, `runtime.engine`) takes plain inputs
(token ids, rank paths, log q by rank) and returns what it measured; the simulator draws the rank
paths a synthetic run replays (`rank_paths`) and re-predicts every task for the run's own workload
(`baseline_predictions`), so measured minus predicted is latency modelling alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from swiftspec.files import run_metadata
from swiftspec.preflight import require, run_needs
from swiftspec.runtime.engine import Job, Task
from swiftspec.runtime.generate import GREEDY
from swiftspec.runtime.groups import Layout
from swiftspec.runtime.launch import load_prompts, plan_tasks, plan_weight_format, run_job, torchrun_env
from swiftspec.runtime.runlog import RunLog
from swiftspec.runtime.synthetic import rank_logprobs
from swiftspec.runtime.vocab import shared_vocab
from swiftspec.runtime.weights import check_checkpoints
from swiftspec.sim.acceptance import AcceptanceModel, default_acceptance
from swiftspec.sim.hardware import gpu_profile, same_gpu
from swiftspec.sim.latency import LatencyModel
from swiftspec.sim.predict_run import RunWorkload, predict_run
from swiftspec.sim.search import load_inputs, load_profile, predict_plan
from swiftspec.spec import LOOPS, AcceptanceProfile, Mode, Plan, Profile, SamplingParams, Split, UserError


def rank_paths(profile: AcceptanceProfile, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """`n` rank paths of `length` positions, as the simulator draws them (same seed, same paths):
    what a synthetic run's verifier replays (`runtime.synthetic.SyntheticVerifier`)."""
    return [[int(r) for r in p] for p in AcceptanceModel(profile).request_paths(n, length, seed)]


@dataclass(frozen=True)
class RunOptions:
    """How `run_plan` runs a plan.

    prompts: "builtin" or a prompt file (`runtime.launch.load_prompts`), the first `num_prompts`,
    `max_new_tokens` each. device / dtype: None takes the plan's device and float32 on CPU,
    bfloat16 on CUDA. weights "random" replays an acceptance profile (`acceptance`, else the
    plan's, else the bundled default); checkpoint weights measure acceptance unless `acceptance`
    is given. modes: the tasks (default: the plan's mode, serial, autoregressive). timeout_s: how
    long a collective may wait or the run make no progress. seed: random weights and rank paths.
    loop: the decoding loop, "host" or "device" (`GenerateConfig.loop`; None: the loop the plan's
    profile measured, meta.json `loop`, host when it names none). profile: what the predictions
    come from (None: `prediction_profile`).
    """

    prompts: str = "builtin"
    num_prompts: int = 8
    max_new_tokens: int = 64
    device: str | None = None
    dtype: str | None = None
    weights: str = "checkpoint"
    acceptance: str | None = None
    modes: tuple[str, ...] | None = None
    timeout_s: float = 300.0
    seed: int = 0
    loop: str | None = None
    profile: str | None = None


def prediction_profile(plan_profile: str | None, plan_gpu: str | None, gpu: str | None,
                       models: Sequence[str] = ()) -> tuple[str | None, str | None]:
    """(profile, why) a run's predictions come from when --profile is not given: on a GPU (`gpu`,
    its name as torch reports it) the plan's profile when it was made for this GPU type
    (`plan_gpu`, `same_gpu`), else this GPU's bundled profile (`gpu_profile`), the rule `plan`
    and `validate` follow; without a GPU (gpu None) the plan's. why: one line for the user, None
    where nothing changes (the plan's profile on a CPU run)."""
    if gpu is None:
        return plan_profile, None
    if plan_profile is not None and plan_gpu is not None and same_gpu(plan_gpu, gpu):
        return plan_profile, f"{plan_profile}, the plan's, made for this {gpu}"
    profile, why = gpu_profile(gpu, models)
    return profile, why + (f" (the plan's is for {plan_gpu})" if plan_gpu else "")


def baseline_predictions(plan: Plan, tasks: list[Task], colocated: int, acceptance_path: str | None,
                         workload: RunWorkload | None = None, seed: int = 0,
                         profile: str | None = None) -> dict[str, dict]:
    """Predictions per task (label -> Prediction dict), made for the run's own workload when it is given.

    With `workload`: every task is re-simulated on it (its prompts' lengths, `max_new_tokens`, and
    the rank paths the synthetic verifier replays, or, measuring acceptance (paths None), the
    acceptance profile's paths for as many requests with `seed`), so the error measures latency
    modelling, not the difference between the plan's workload and the run's. The plan's own figure
    is kept beside it as `plan_tokens_per_s_mean` / `plan_mean_accepted`. Without, or when the
    simulator cannot time a task: the plan's prediction for its own mode. colocated: the devices
    the co-located baselines share.
    """
    preds: dict[str, dict] = {}
    inputs = None
    for t in tasks:
        own = t.mode is plan.mode and t.policy == plan.policy and plan.prediction is not None
        if own:
            preds[t.label] = plan.prediction.to_dict()
        if own and workload is None:
            continue
        try:
            if inputs is None:
                acc = acceptance_path or (plan.acceptance.path if plan.acceptance and
                                          not plan.acceptance.path.startswith("builtin") else None)
                inputs = load_inputs(plan.target, plan.draft, profile, acc, plan.device)
            if t.mode is plan.mode:
                split = plan.split
            else:
                split = Split.shared(colocated, with_draft=t.mode is not Mode.autoregressive)
            if workload is None:
                p = dataclasses.replace(plan, mode=t.mode, split=split, policy=t.policy)
                preds[t.label] = predict_plan(p, inputs).summary.to_prediction().to_dict()
                continue
            acc_model = AcceptanceModel(inputs.acceptance)
            if workload.paths is None:
                n = len(workload.prompt_lens)
                paths = [list(x) for x in acc_model.request_paths(n, workload.max_new_tokens + 64, seed)]
                workload = dataclasses.replace(workload, paths=paths)
            res = predict_run(LatencyModel(inputs.profile), acc_model, inputs.target, inputs.draft, split, t.mode,
                              t.policy, workload, plan.gpus_per_node)
            d = res.summary.to_prediction().to_dict()
            if own:
                d["plan_tokens_per_s_mean"] = plan.prediction.tokens_per_s_mean
                d["plan_mean_accepted"] = plan.prediction.mean_accepted
            d["workload"] = "run"
            preds[t.label] = d
        except Exception:  # noqa: BLE001 -- a task without a prediction is shown as "-"
            continue
    return preds


def profile_conditions(meta: dict | None, device: str) -> tuple[str, str, str]:
    """(GPU or "cpu", dtype, weight format) a profile was measured with (its meta.json; the
    defaults of `profile compute` where it names none: bfloat16 on cuda, float32 on cpu)."""
    meta = meta or {}
    dev = meta.get("device", device)
    gpu = "cpu" if dev == "cpu" else str(meta.get("gpu") or dev)
    dtype = str(meta.get("dtype") or ("float32" if dev == "cpu" else "bfloat16"))
    return gpu, dtype, str(meta.get("weight_format", "native"))


def run_conditions(device: str, dtype: str, weight_format: str, index: int = 0) -> tuple[str, str, str]:
    """(GPU or "cpu", dtype, weight format) of this machine's run."""
    gpu = torch.cuda.get_device_name(index) if device == "cuda" and torch.cuda.is_available() else "cpu"
    return gpu, dtype, weight_format


def not_comparable(profile: tuple[str, str, str], run: tuple[str, str, str]) -> str | None:
    """"not comparable: profile <gpu, dtype, wf> vs run <...>" when the prediction's profile was
    measured on (or derived for) another device type, dtype or weight format than the run's, else
    None: then a prediction error says nothing about the latency model and is not printed as one.
    GPUs compare by type (`same_gpu`: a profile derived for "NVIDIA H100 SXM" predicts an "NVIDIA
    H100 80GB HBM3")."""
    if same_gpu(profile[0], run[0]) and profile[1:] == run[1:]:
        return None
    return f"not comparable: profile <{', '.join(profile)}> vs run <{', '.join(run)}>"


def _profile_or_none(profile: str | None) -> Profile | None:
    """The profile a path names, or None where there is none or it is not on this machine (then
    there is no prediction to compare with either)."""
    if profile is None:
        return None
    try:
        return load_profile(profile)[0]
    except UserError:
        return None


def run_plan(plan_path: str | Path, options: RunOptions = RunOptions(), sampling: SamplingParams = GREEDY,
             *, tasks: list[Task] | None = None, on_start=None,
             progress: Callable[[str], None] | None = None) -> RunLog | None:
    """Run a plan (and its baselines) and return its RunLog (rank 0; None on other torchrun ranks).

    Synthetic acceptance (random weights or `options.acceptance`) is labelled `acceptance:
    synthetic (...)`. Sampling (temperature > 0) needs measured acceptance, since a replayed rank
    path decides the tokens itself. on_start(pids), progress(line) (one line per prompt and task):
    see `runtime.launch.launch`. Before any worker starts: the tasks (`plan_tasks`: a plan without
    a draft runs autoregressive and notes the baselines it leaves out), checkpoint weights
    (`check_checkpoints`: every file opened, every tensor's shape against config.json), the pair's
    vocabulary (`runtime.vocab.shared_vocab`) and the memory the ranks need (`preflight`). After:
    `meta["comparable"]` says whether the predictions' profile (`options.profile`, else
    `prediction_profile`) was measured on this run's device, dtype and weight format
    (`not_comparable`).
    """
    o = options
    plan = Plan.load(plan_path)
    device = o.device or plan.device
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but no CUDA GPU is available: use --device cpu")
    dtype = o.dtype or ("float32" if device == "cpu" else "bfloat16")
    if o.weights not in ("checkpoint", "random"):
        raise UserError(f"--weights must be checkpoint or random, got {o.weights!r}")
    if o.max_new_tokens < 1 or o.num_prompts < 1 or o.timeout_s <= 0:
        raise UserError("--max-new-tokens, --num-prompts and --timeout must be positive")
    if not sampling.greedy and (o.weights == "random" or o.acceptance is not None):
        raise UserError("--temperature needs measured acceptance (--weights checkpoint, no --acceptance): "
                        "with synthetic acceptance the replayed rank paths choose the tokens")
    layout = Layout.from_split(plan.split, device, torch.cuda.device_count() if device == "cuda" else 0)
    gpu_index = max(layout.physical[0], 0) if device == "cuda" else 0  # the GPU the predictions are for
    plan_profile = plan.profile.path if plan.profile is not None else None
    profile, why = o.profile, None
    if profile is None:
        made_on = _profile_or_none(plan_profile)
        gpu = run_conditions(device, dtype, "native", gpu_index)[0] if device == "cuda" else None
        profile, why = prediction_profile(plan_profile, made_on.meta.get("gpu") if made_on else None, gpu,
                                          [m for m in (plan.target, plan.draft) if m])
    if why and progress is not None:
        progress(f"profile: {why} (--profile to choose another)")
    predicted_from = load_profile(profile)[0] if o.profile else _profile_or_none(profile)  # --profile: must load
    planned_on = predicted_from.meta if predicted_from else {"device": plan.device}
    plan = Plan.from_dict({**plan.to_dict(), "device": device})
    notes: list[str] = []
    if tasks is None:
        tasks, notes = plan_tasks(plan, list(o.modes) if o.modes else None)
    if o.weights == "checkpoint":  # a truncated file or weights unlike the config: one line, no worker
        speculative = any(t.mode is not Mode.autoregressive for t in tasks)
        check_checkpoints(plan.target, plan.draft if speculative else None)
    vocab = shared_vocab(plan.target, plan.draft)
    ids, how = load_prompts(o.prompts, plan.target, vocab, o.num_prompts)

    acc_label, paths, acc_path, logq = "measured", None, None, None
    if o.weights == "random" or o.acceptance is not None:
        if o.acceptance is not None:
            acc_path = o.acceptance
        elif plan.acceptance is not None and Path(plan.acceptance.path).is_file():
            acc_path = plan.acceptance.path
        prof = AcceptanceProfile.load(acc_path) if acc_path is not None else default_acceptance()[0]
        acc_label = prof.label if prof.synthetic else f"synthetic (replay of measured {Path(acc_path).name})"
        paths = rank_paths(prof, len(ids), o.max_new_tokens + 64, o.seed)
        logq = rank_logprobs(prof)

    weight_format = plan_weight_format(plan)
    loop = o.loop or planned_on.get("loop", "host")  # the loop the prediction's host terms describe
    if loop not in LOOPS:
        raise UserError(f"--loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    job = Job(target=plan.target, draft=plan.draft, split=plan.split, tasks=tasks, prompts=ids,
              max_new_tokens=o.max_new_tokens, device=device, dtype=dtype, weights=o.weights, seed=o.seed,
              rank_paths=paths, timeout_s=o.timeout_s, rank_logprobs=logq, weight_format=weight_format,
              sampling=sampling, vocab=vocab if plan.draft else None, loop=loop)  # fmt: skip
    if torchrun_env() is None:  # under torchrun each node's memory is its own: no check across them
        ranks = f"{layout.world} rank{'s' if layout.world > 1 else ''}"
        job.meta["memory"] = require(run_needs(job, layout), device, f"this run ({ranks})")
    results = run_job(job, on_start=on_start, progress=progress)
    if results is None:
        return None
    iters = pd.DataFrame([r for res in results for r in res["rows"]])
    prs = pd.DataFrame([r for res in results for r in res["prompts"]])
    meta = {**run_metadata(device), "plan": plan.to_dict(), "plan_path": str(plan_path), "weights": o.weights,
            "loop": loop,
            "weight_format": weight_format, "temperature": sampling.temperature, "sample_seed": sampling.seed,
            "sample_top_k": sampling.top_k, "sample_top_p": sampling.top_p, "acceptance": acc_label,
            "device": device, "dtype": dtype, "prompts": o.prompts,
            "tokenized_with": how, "max_new_tokens": o.max_new_tokens, "colocated_ranks": len(layout.colocated),
            "world": layout.world, "shared_devices": device == "cuda" and len(set(layout.physical)) < layout.world,
            "notes": notes, "memory": job.meta.get("memory"), "profile": profile,
            "profile_label": predicted_from.label if predicted_from else None}
    label = not_comparable(profile_conditions(planned_on, plan.device),
                           run_conditions(device, dtype, weight_format, gpu_index))
    meta.update(comparable=label is None, comparability=label or "comparable: profile and run on the same "
                "device, dtype and weight format")
    workload = RunWorkload([len(x) for x in ids], o.max_new_tokens, paths)
    return RunLog(iters, prs, meta, baseline_predictions(plan, tasks, len(layout.colocated), acc_path, workload,
                                                         o.seed, profile))


def format_report(log) -> str:
    """What `swiftspec run` prints: the labels, then measured vs predicted per task."""
    m = log.meta
    plan = m["plan"]
    split = plan["split"]
    unit = "CPU ranks" if m["device"] == "cpu" else "GPUs"
    lines = [
        f"plan: {m['plan_path']} ({plan['mode']}; draft {len(split['draft_gpus'])} / target "
        f"{len(split['target_gpus'])} {unit}; baselines on {m['colocated_ranks']} {unit})",
        f"weights: {m['weights']}{'' if m.get('weight_format', 'native') == 'native' else ', ' + m['weight_format']}"
        f"   acceptance: {m['acceptance']}   device: {m['device']} ({m['dtype']})",
        f"prompts: {m['prompts']} ({len(log.prompts) and log.prompts['prompt'].nunique()}, {m['tokenized_with']}), "
        f"{m['max_new_tokens']} new tokens each",
    ]
    if m.get("profile_label"):
        lines.append(f"predicted from: {m['profile_label']} ({m.get('profile')})")
    if any(isinstance(p, dict) and p.get("workload") == "run" for p in log.predictions.values()):
        lines.append("predicted: re-simulated for this run's workload (its prompts, length and rank paths)")
    if m.get("temperature", 0) > 0:
        cut = "".join(f", {name} {m[k]:g}" for k, name, off in (("sample_top_k", "top-k", 0),
                                                                  ("sample_top_p", "top-p", 1)) if m.get(k, off) != off)
        lines.append(f"sampling: temperature {m['temperature']:g}{cut}, seed {m['sample_seed']} + prompt index (the "
                     "predictions use the plan's acceptance profile: plan on one measured with these settings, "
                     "`profile acceptance --temperature" + (" --sample-top-k/-p" if cut else "") + "`)")
    if m.get("shared_devices"):
        lines.append("note: ranks share a GPU (gloo link, no NCCL): correctness and host-side timing only")
    lines += [f"note: {n}" for n in m.get("notes") or ()]
    comparable = m.get("comparable", True)
    if not comparable:
        lines.append(f"{m['comparability']}: predictions shown, no error computed")
    s = log.summary()

    def f(x, fmt="{:.1f}"):
        return "-" if x is None or x != x else fmt.format(x)

    table = [(r.task, f(r.tokens_per_s_mean), f(r.tokens_per_s_p50), f(r.tokens_per_s_p95), f(r.mean_accepted, "{:.2f}"),
              f(r.iteration_ms, "{:.2f}"), f(r.predicted_tokens_per_s),
              f(r.error_pct, "{:+.1f}%") if comparable else "n/c",
              f(r.predicted_mean_accepted, "{:.2f}")) for r in s.itertuples()]
    head = ("task", "tok/s mean", "p50", "p95", "accepted", "iter ms", "predicted tok/s", "error", "pred. accepted")
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    for row in (head, *table):
        lines.append("  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)
