"""The `swiftspec` command: thin wrappers that parse flags, call library functions, print.

Each verb lives in its own section below. Bad input raises `UserError` anywhere below; `main`
turns it into one line on stderr and exit code 2 (no traceback). The verbs that run models
(generate, profile compute/comm/acceptance, run, validate) and `study` (matplotlib) import their
library inside their function: `plan`, `simulate` and `--help` start without torch and Triton,
seconds faster.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import sys
from dataclasses import replace

import click
from tqdm import tqdm

from swiftspec.catalog import bundled_profiles, catalog, catalog_text, profile_device, resolve_builtin
from swiftspec.files import atomic_write_text, check_output_dir, check_output_file, folder_lock
from swiftspec.options import (
    BS,
    DEPTH,
    DEVICE_RULE,
    DEVICES,
    DTYPE_RULE,
    DTYPES,
    GPUS,
    MAX_GPUS,
    MAX_TOKENS,
    MAX_TOP_K,
    REQUESTS,
    SEED,
    TOKENS,
    D,
    IntList,
    W,
    count,
    device_dtype,
    seconds,
    visible_gpu_name,
)
from swiftspec.profiler.check import check_profile
from swiftspec.progress import progress_for
from swiftspec.sim.derive import derive_profile, hardware_names, hardware_profile_ref, source_hardware_of
from swiftspec.sim.derive_format import derive_weight_format
from swiftspec.sim.engine import Workload, to_chrome_trace
from swiftspec.sim.hardware import HardwareSpec, gpu_profile
from swiftspec.sim.search import SearchSpace, breakdown_table, load_inputs, predict_plan, search
from swiftspec.spec import LOOPS, WEIGHT_FORMATS, Mode, Plan, Profile, SamplingParams, UserError, to_jsonable


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="swiftspec")
def cli() -> None:
    """swiftspec: plan, run and study disaggregated asynchronous speculative decoding.

    \b
      swiftspec plan --gpus 8          pick split, mode and tree by SimPy simulation (no GPU needed)
      swiftspec simulate --plan P      re-predict one plan
      swiftspec generate ...           single-process decoding (autoregressive/chain/serial)
      swiftspec profile ...            measure latencies and acceptance
      swiftspec run --plan P           run a plan with the asynchronous runtime
      swiftspec study NAME             draw a figure
      swiftspec list                   the bundled models, profiles and acceptance profiles
    """


def main() -> None:
    try:
        cli.main(prog_name="swiftspec", standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:
        e.show()
        sys.exit(2)
    except click.UsageError as e:  # a bad or missing option: one line, like every other bad input
        where = f" (see `{e.ctx.command_path} --help`)" if e.ctx is not None else ""
        click.echo(f"error: {e.format_message().rstrip('.')}{where}", err=True)
        sys.exit(2)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


# ---- plan / simulate (swiftspec.sim) ------------------------------------------------------

HARDWARE_NAMES = hardware_names()
PROFILE_NAMES = " | ".join(f"builtin:{name}" for name in bundled_profiles())

_PLAN_COLUMNS = {
    "rank": "#", "mode": "mode", "split": "draft/target", "policy": "tree", "tokens_per_s_mean": "tok/s",
    "tokens_per_s_p50": "p50", "tokens_per_s_p95": "p95*", "mean_accepted": "accepted",
    "iteration_ms": "iter ms", "speedup_vs_autoregressive": "x AR", "speedup_vs_serial": "x serial",
}


def _plan_table_text(table, top: int) -> str:
    t = table.head(top).copy()
    t["split"] = [f"{d}/{g}" if m == "async" else f"{g} shared" if m != "autoregressive" else f"-/{g}"
                  for m, d, g in zip(t["mode"], t["draft_gpus"], t["target_gpus"])]
    t = t[list(_PLAN_COLUMNS)].rename(columns=_PLAN_COLUMNS)
    return t.to_string(index=False, float_format=lambda x: f"{x:.2f}", na_rep="-")  # "-": no such baseline


def _progress(as_json: bool):
    if as_json or not sys.stderr.isatty():
        return None
    return lambda it: tqdm(it, desc="simulating", unit="config", file=sys.stderr, leave=False)


@cli.command()
@click.option("--gpus", type=GPUS, required=True, help="GPUs (or CPU ranks) to plan for.")
@click.option("--target", default="Llama-3-70B", show_default=True, help="Bundled model name or checkpoint folder.")
@click.option("--draft", default="Llama-3.2-3B", show_default=True, help="Bundled model name or checkpoint folder.")
@click.option("--profile", "profile_dir", default=None,
              help=f"Profile folder, or {PROFILE_NAMES} [default: with a GPU visible, its bundled profile "
                   "(said on stderr); else the embedded H200 profile, measured where it covers both models, else "
                   "derived]; `swiftspec list` shows what each covers.")
@click.option("--hardware", default=None,
              help=f"Plan for this GPU instead: {' | '.join(HARDWARE_NAMES)} or a spec JSON file: the GPU's bundled "
                   "profile where there is one, else one derived in memory from builtin:h200-measured and the spec "
                   "(labelled derived). Not with --profile.")
@click.option("--acceptance", default=None,
              help="Acceptance profile JSON or builtin:NAME (`swiftspec list`) [default: bundled, synthetic].")
@click.option("--modes", default=None, help="Comma-separated modes to consider [default: all four].")
@click.option("--draft-gpus", type=GPUS, default=None, help="Pin the async draft group's size.")
@click.option("--bs", type=BS, default=None, help="Pin tree nodes verified per step.")
@click.option("--w", "w", type=W, default=None, help="Pin leaves expanded per draft forward.")
@click.option("--d", "d", type=D, default=None, help="Pin draft expansions per round.")
@click.option("--top", type=count(1), default=5, show_default=True, help="Rows of the ranked table to print.")
@click.option("--json", "as_json", is_flag=True, help="Print the ranked table as JSON (nothing else on stdout).")
@click.option("-o", "--output", default=None, help="Write the winning plan here (nothing is written without -o).")
@click.option("--gpus-per-node", type=GPUS, default=None, help="GPUs per node when planning across nodes [default: --gpus].")
@click.option("--device", type=click.Choice(DEVICES), default=None,
              help="The device planned for [default: the profile's: cuda for the embedded H200 profile].")
@click.option("--prompt-len", type=TOKENS, default=256, show_default=True, help="Prompt tokens per simulated request.")
@click.option("--max-new-tokens", type=TOKENS, default=256, show_default=True, help="Tokens generated per request.")
@click.option("--requests", type=REQUESTS, default=8, show_default=True, help="Simulated requests per finalist.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the synthetic target paths.")
def plan(gpus, target, draft, profile_dir, hardware, acceptance, modes, draft_gpus, bs, w, d, top, as_json, output,
         gpus_per_node, device, prompt_len, max_new_tokens, requests, seed) -> None:  # fmt: skip
    """Pick split, mode and tree policy for GPUS by SimPy simulation; rank by predicted tokens/s.

    Prints the profile and acceptance labels, the top configurations with speedups over the best
    autoregressive and serial configurations on the same GPUs, and the winner's iteration
    breakdown. p95* = the slow tail: 5th percentile of per-request tokens/s. Options that pin
    parts of the configuration shrink the search; fully pinned, it is one prediction. The
    winning plan is written only when -o is given.
    """
    if hardware is not None and profile_dir is not None:
        raise UserError("give --profile or --hardware, not both (--hardware NAME plans from that GPU's bundled or "
                        "derived profile)")
    if output:
        check_output_file(output, "-o")
    profile_dir, acceptance = resolve_builtin("profile", profile_dir), resolve_builtin("acceptance", acceptance)
    if hardware is not None:
        profile_dir = hardware_profile_ref(hardware, (target, draft))
    elif profile_dir is None and device != "cpu":
        profile_dir = _gpu_default_profile(visible_gpu_name(), (target, draft))
    device = device or profile_device(profile_dir)
    mode_list = tuple(Mode.parse(m.strip()) for m in modes.split(",") if m.strip()) if modes else tuple(Mode)
    space = SearchSpace(gpus=gpus, modes=mode_list, draft_gpus=draft_gpus, bs=bs, w=w, d=d,
                        gpus_per_node=gpus_per_node, device=device)
    space.validate()
    if min(prompt_len, max_new_tokens, requests) < 1:
        raise UserError("--prompt-len, --max-new-tokens and --requests must be >= 1")
    inputs = load_inputs(target, draft, profile_dir, acceptance, device)
    wl = Workload(prompt_len=prompt_len, max_new_tokens=max_new_tokens, requests=requests, seed=seed)
    res = search(inputs, space, wl, progress=_progress(as_json))
    if output:
        res.winner.save(output)
    if as_json:
        click.echo(json.dumps(to_jsonable({
            "profile": inputs.profile_ref.label, "acceptance": inputs.acceptance_ref.label,
            "considered": res.considered, "dropped_memory": res.dropped_memory,
            "skipped_profile": res.skipped_profile, "baselines": res.baselines,
            "rows": res.table.to_dict(orient="records"),
        })))
        return
    win = res.winner
    pred = win.prediction
    click.echo(f"profile: {inputs.profile_ref.label} ({inputs.profile_ref.path})")
    click.echo(f"acceptance: {inputs.acceptance_ref.label} ({inputs.acceptance_ref.path})")
    click.echo(
        f"{inputs.target.name} + {inputs.draft.name if inputs.draft else '-'} on {gpus} GPU(s) ({device}"
        f"{f', {space.per_node} per node' if space.per_node < gpus else ''}): {res.considered} configurations "
        f"simulated, {res.dropped_memory} dropped (do not fit memory), {len(res.skipped_profile)} skipped "
        f"(profile lacks rows)"
    )
    click.echo(f"workload: {requests} requests x {max_new_tokens} new tokens after a {prompt_len}-token prompt "
               f"(seed {seed}); p95* = 5th percentile of per-request tok/s (the slow tail)")
    click.echo("")
    click.echo(_plan_table_text(res.table, top))
    click.echo("")
    missing = [m.value for m in (Mode.autoregressive, Mode.serial) if m.value not in res.baselines]
    click.echo("speedups over: " + ", ".join([f"{m} = {lbl}" for m, lbl in res.baselines.items()]
                                             + [f"{m} = none (no {m} configuration on {gpus} GPUs fits both memory and the profile)"
                                                for m in missing]))
    split = (f"draft {win.split.draft_tp} / target {win.split.target_tp} GPUs" if win.mode is Mode.async_
             else f"{win.split.target_tp} GPUs")
    click.echo(f"winner: {win.mode.value}, {split}, {win.policy.key}: {pred.tokens_per_s_mean:.1f} tok/s "
               f"(p50 {pred.tokens_per_s_p50:.1f}, p95* {pred.tokens_per_s_p95:.1f}), mean accepted "
               f"{pred.mean_accepted:.2f}, {pred.iteration_ms:.2f} ms per iteration")
    click.echo("winner's mean iteration" + (" (the draft runs while the target verifies):" if win.mode is Mode.async_ else ":"))
    click.echo(breakdown_table(pred.breakdown_ms, win.mode).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if res.skipped_profile:
        click.echo(skipped_summary(res.skipped_profile), err=True)
    for line in res.extrapolations[:3]:
        click.echo(f"warning: {line}", err=True)
    if output:
        click.echo(f"wrote {output}")


def _gpu_default_profile(gpu: str | None, models: tuple[str, ...] = ()) -> str | None:
    """The profile `plan` defaults to with `gpu` visible (`gpu_profile`, the rule `run` and
    `validate` follow too), said on stderr; None (the embedded H200 profile) without a GPU."""
    if gpu is None:
        return None
    profile, why = gpu_profile(gpu, models)
    click.echo(f"profile: {why} (--profile or --hardware to choose another)", err=True)
    return profile


def skipped_summary(skipped: list[str]) -> str:
    """One line for the configurations the profile could not time (the full list: --json)."""
    tps: dict[str, set[int]] = {}
    for line in skipped:
        m = re.search(r"for model (\S+) at tp (\d+)", line)
        if m:
            tps.setdefault(m[1], set()).add(int(m[2]))
    where = "; ".join(f"{model} at TP {', '.join(map(str, sorted(t)))}" for model, t in tps.items())
    n = len(skipped)
    return (f"skipped {n} configuration{'s' if n > 1 else ''} the profile does not cover"
            + (f" ({where})" if where else "") + ": see --json 'skipped_profile'")


def _ref_path(ref, builtin_ok: bool = False) -> str | None:
    """The path a plan recorded for an input; None (the default input) for `builtin:` ones unless
    builtin_ok (profiles: `Profile.load` reads `builtin:NAME`, so an fp8 plan stays on h200-fp8)."""
    if ref is None or (ref.path.startswith("builtin:") and not builtin_ok):
        return None
    return ref.path


@cli.command()
@click.option("--plan", "plan_path", required=True, help="plan.json from `swiftspec plan -o`.")
@click.option("--profile", "profile_dir", default=None, help="Profile folder or builtin:NAME [default: the plan's].")
@click.option("--acceptance", default=None, help="Acceptance profile JSON or builtin:NAME [default: the plan's].")
@click.option("--requests", type=REQUESTS, default=None, help="Simulated requests [default: the plan's workload].")
@click.option("--seed", type=SEED, default=None, help="Seed of the synthetic target paths [default: the plan's].")
@click.option("--trace", default=None, help="Also write the timeline as Chrome trace JSON here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (prediction) on stdout.")
def simulate(plan_path, profile_dir, acceptance, requests, seed, trace, as_json) -> None:
    """Re-predict one plan with the simulator (same workload unless overridden)."""
    if trace:
        check_output_file(trace, "--trace")
    profile_dir, acceptance = resolve_builtin("profile", profile_dir), resolve_builtin("acceptance", acceptance)
    p = Plan.load(plan_path)
    inputs = load_inputs(p.target, p.draft, profile_dir or _ref_path(p.profile, builtin_ok=True),
                         acceptance or _ref_path(p.acceptance), p.device)
    w = p.meta.get("workload", {})
    wl = Workload(**{k: int(v) for k, v in w.items() if k in ("prompt_len", "max_new_tokens", "requests", "seed")})
    wl = replace(wl, **{k: v for k, v in (("requests", requests), ("seed", seed)) if v is not None})
    res = predict_plan(p, inputs, wl)
    pred = res.summary.to_prediction()
    if trace:
        atomic_write_text(trace, json.dumps(to_chrome_trace(res.timeline)) + "\n")
    if as_json:
        click.echo(json.dumps(to_jsonable({
            "profile": inputs.profile_ref.label, "acceptance": inputs.acceptance_ref.label,
            "plan": p.to_dict(), "prediction": pred.to_dict(),
        })))
        return
    click.echo(f"profile: {inputs.profile_ref.label} ({inputs.profile_ref.path})")
    click.echo(f"acceptance: {inputs.acceptance_ref.label} ({inputs.acceptance_ref.path})")
    for name, ref, now in (("profile", p.profile, inputs.profile_ref), ("acceptance", p.acceptance, inputs.acceptance_ref)):
        if ref is not None and ref.sha256 != now.sha256:
            click.echo(f"note: the {name} differs from the one the plan was made with ({ref.path})", err=True)
    click.echo(f"plan: {p.mode.value}, draft {p.split.draft_tp} / target {p.split.target_tp} GPUs, {p.policy.key}")
    click.echo(f"predicted: {pred.tokens_per_s_mean:.1f} tok/s (p50 {pred.tokens_per_s_p50:.1f}, p95* "
               f"{pred.tokens_per_s_p95:.1f} = 5th percentile), mean accepted {pred.mean_accepted:.2f}, "
               f"{pred.iteration_ms:.2f} ms per iteration ({wl.requests} requests)")
    if p.prediction is not None:
        click.echo(f"plan said: {p.prediction.tokens_per_s_mean:.1f} tok/s")
    click.echo(breakdown_table(pred.breakdown_ms, p.mode).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if trace:
        click.echo(f"wrote {trace}")


# ---- sampling options (generate, run, profile acceptance) ----------------------------------

# SamplingParams' words for its fields -> the flags that set them (its errors then name the flag)
_SAMPLING_FLAGS = {"temperature": "--temperature", "top-k": "--sample-top-k", "top-p": "--sample-top-p"}


def _sampling_params(temperature: float, seed: int, top_k: int, top_p: float) -> SamplingParams:
    try:
        return SamplingParams(temperature=temperature, seed=seed, top_k=top_k, top_p=top_p)
    except UserError as e:
        msg = re.sub(r"(?<![\w-])(temperature|top-k|top-p)\b", lambda m: _SAMPLING_FLAGS[m[1]], str(e))
        raise UserError(msg) from None


LOOP_HELP = ("host (the draft tree in Python, a sync per step) | device (fixed-shape tensors replayed as CUDA "
             "graphs, no sync per step; the same tokens)")
# generate has no profile to follow: the device loop on a GPU, where it was faster in every
# configuration measured (docs/performance.md), the host loop elsewhere (eager, no syncs to save)
loop_option = click.option("--loop", type=click.Choice(LOOPS), default=None,
                           help=f"Decoding loop: {LOOP_HELP} [default: device on CUDA, host otherwise].")
# run and validate compare with a profile's predictions: by default they run the loop it measured
profile_loop_option = click.option(
    "--loop", type=click.Choice(LOOPS), default=None,
    help=f"Decoding loop: {LOOP_HELP} [default: the loop whose host work the profile measured, meta.json "
         "`loop`; host for the bundled profiles].")


def sampling_options(command):
    """Add --temperature, --sample-seed, --sample-top-k and --sample-top-p to a command, which
    receives them as one `sampling: SamplingParams` (checked before the command runs)."""

    @click.option("--temperature", type=float, default=0.0, show_default=True,
                  help="0: greedy. > 0: sample the target at this temperature, losslessly: every mode gives "
                       "the tokens target-only sampling gives with the same --sample-seed.")
    @click.option("--sample-seed", type=int, default=0, show_default=True,
                  help="Seed of the sampling draws (prompt i of a set: seed + i).")
    @click.option("--sample-top-k", type=int, default=0, show_default=True,
                  help="With --temperature: sample only among the k most likely tokens (0: off).")
    @click.option("--sample-top-p", type=float, default=1.0, show_default=True,
                  help="With --temperature: sample only from the smallest set of most likely tokens whose "
                       "probability reaches p (nucleus; 1: off).")
    @functools.wraps(command)
    def with_sampling(*args, temperature, sample_seed, sample_top_k, sample_top_p, **kwargs):
        sampling = _sampling_params(temperature, sample_seed, sample_top_k, sample_top_p)
        return command(*args, sampling=sampling, **kwargs)

    return with_sampling


# ---- generate (swiftspec.runtime) ----------------------------------------------------------


def _int_list(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    if isinstance(text, tuple):  # already parsed and range-checked by an IntList option
        return list(text)
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated integers, e.g. {flag} 1,2,3 (got {text!r})") from None


DEFAULT_PROMPT_IDS = (1, 2, 3, 4, 5, 6, 7, 8)


@cli.command()
@click.option("--target", required=True, help="Target checkpoint folder (or bundled name with --weights random).")
@click.option("--draft", default=None, help="Draft checkpoint folder (chain / serial).")
@click.option("--mode", default="autoregressive", show_default=True, help="autoregressive | chain | serial.")
@click.option("--bs", type=BS, default=None, help="Tree nodes verified per step, root included.")
@click.option("--w", "w", type=W, default=None, help="Leaves expanded per draft forward.")
@click.option("--d", "d", type=D, default=None, help="Draft expansions per round (chain: drafted tokens).")
@click.option("--max-depth", type=DEPTH, default=0, show_default=True, help="Deepest node grown (0: no limit).")
@click.option("--topology", default=None, help="Static tree: parent index per node, e.g. --topology=-1,0,0,1.")
@click.option("--prompt", default=None, help="Prompt text (needs a tokenizer in the target folder).")
@click.option("--prompt-ids", type=IntList(0), default=None,
              help=f"Prompt as token ids, e.g. 1,2,3 [default with --weights random and no --prompt: "
                   f"{','.join(map(str, DEFAULT_PROMPT_IDS))}].")
@click.option("--max-new-tokens", type=TOKENS, default=32, show_default=True)
@click.option("--device", type=click.Choice(DEVICES), default=None, help=DEVICE_RULE)
@click.option("--dtype", type=click.Choice(DTYPES), default=None, help=DTYPE_RULE)
@click.option("--weights", default="checkpoint", show_default=True, help="checkpoint | random.")
@click.option("--eos/--no-eos", default=True, show_default=True, help="Stop at the config's EOS ids.")
@click.option("--max-len", type=TOKENS, default=4096, show_default=True, help="Most KV-cache slots per model.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of random weights.")
@click.option("--weight-format", default="native", show_default=True,
              help="native | fp8 (weight-only float8 e4m3 GEMM weights, per-row scales: a quantized model, "
                   "faster at few tokens per forward, slower at many; docs/decisions.md) | int4 (W4A16, the AWQ "
                   "format's numbers, rounded to nearest while loading; an AWQ checkpoint is int4 by itself).")
@click.option("--tree-growth", default="auto", show_default=True,
              help="The draft's top-k: auto (the device's default) | torch | triton | graph (replayed from CUDA "
                   "graphs; torch off CUDA).")
@loop_option
@sampling_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def generate(target, draft, mode, bs, w, d, max_depth, topology, prompt, prompt_ids, max_new_tokens, device,
             dtype, weights, eos, max_len, seed, weight_format, tree_growth, loop, sampling, as_json) -> None:  # fmt: skip
    """Decode one prompt on one process: autoregressive, chain or serial (tree) speculation."""
    from swiftspec.preflight import check_models
    from swiftspec.runtime.generate import LoadOptions, generate_from_checkpoints, make_policy

    m = Mode.parse(mode)
    policy = make_policy(m, bs, w, d, max_depth, _int_list(topology, "--topology"))
    if prompt is None and prompt_ids is None and weights == "random":
        prompt_ids = DEFAULT_PROMPT_IDS  # random weights make any ids a fine prompt
    if (prompt is None) == (prompt_ids is None):
        raise UserError("give exactly one of --prompt TEXT or --prompt-ids 1,2,3")
    device, dtype = device_dtype(device, dtype)
    loop = loop or ("device" if device.startswith("cuda") else "host")
    if weights == "checkpoint":  # a truncated file or weights unlike the config: one line, before any work
        from swiftspec.runtime.weights import check_checkpoints
        check_checkpoints(target, draft if m is not Mode.autoregressive else None)
    progress = progress_for(as_json)

    def checked(dev: str, specs: list) -> None:  # the library's last check before it builds the models
        check_models(dev, specs)
        progress(f"generate: building {' and '.join(s.name for s, _ in specs)} ({weights} weights, {device}, "
                 f"{dtype}), then decoding up to {max_new_tokens} tokens")

    load = LoadOptions(device=device, dtype=dtype, weights=weights, seed=seed, weight_format=weight_format,
                       tree_growth=tree_growth, loop=loop, max_len=max_len, memory_check=checked, progress=progress)
    res = generate_from_checkpoints(
        target, draft if m is not Mode.autoregressive else None, mode=m, policy=policy,
        prompt=prompt if prompt is not None else _int_list(prompt_ids, "--prompt-ids"),
        max_new_tokens=max_new_tokens, sampling=sampling, load=load, eos=eos,
    )  # fmt: skip
    if as_json:
        click.echo(json.dumps(to_jsonable(res.to_dict())))
        return
    cut = ((f", top-k {res.sample_top_k}" if res.sample_top_k else "")
           + (f", top-p {res.sample_top_p:g}" if res.sample_top_p < 1 else ""))
    shown = f"  temperature: {res.temperature:g}{cut} (seed {sampling.seed})" if res.temperature > 0 else ""
    click.echo(f"mode: {res.mode}  policy: {res.policy}  device: {device}  dtype: {dtype}{shown}")
    click.echo(f"weights: {res.weights}" + (f" ({res.weight_format})" if res.weight_format != "native" else ""))
    click.echo(f"tokens: {' '.join(map(str, res.tokens))}")
    if res.text is not None:
        click.echo(f"text: {res.text!r}")
    click.echo(
        f"{len(res.tokens)} tokens in {res.iterations} iterations: {res.tokens_per_s:.1f} tokens/s, "
        f"mean accepted {res.mean_accepted:.2f}, stop: {res.stop}, prefill {res.prefill_ms:.1f} ms"
    )


# ---- profile (swiftspec.profiler) ----------------------------------------------------------


@cli.group("profile")
def profile_group() -> None:
    """Measure latencies (compute, comm) and a real pair's acceptance; check a profile.

    \b
      swiftspec profile compute --models Llama-3-8B -o DIR    time the runtime's pieces (one device)
      swiftspec profile comm -o DIR                           collectives (needs >= 2 GPUs; gloo on CPU)
      swiftspec profile acceptance --target T --draft D       rank traces + accepted lengths
      swiftspec profile check DIR                             hold-out error of the latency model
      swiftspec profile derive --from P --hardware builtin:h100-sxm -o DIR   a profile for another GPU
      swiftspec profile calibrate -o SPEC.json                this machine's numbers, as a hardware spec
    """


@profile_group.command("compute")
@click.option("--models", required=True, help="Comma-separated bundled names or checkpoint folders (random weights).")
@click.option("--tp", type=IntList(1, MAX_GPUS), default=None, help="TP shard degrees [default: cuda 1,2,4,6,8; cpu 1].")
@click.option("--tokens", type=IntList(1, MAX_TOKENS), default=None, help="Tokens per forward [default: cuda 1,2,4,...,256].")
@click.option("--kv", type=IntList(1, MAX_TOKENS), default=None, help="Cached tokens attended [default: cuda 512,2048,8192].")
@click.option("--compact", type=IntList(1, MAX_TOKENS), default=None, help="KV slots moved by kv_compact [default: --tokens + 512,1024 on cuda, + 512 on cpu].")
@click.option("-o", "--output", default="profile", show_default=True, help="Profile folder (resumable).")
@click.option("--device", type=click.Choice(DEVICES), default=None, help=DEVICE_RULE)
@click.option("--dtype", type=click.Choice(DTYPES), default=None, help=DTYPE_RULE)
@click.option("--quick", is_flag=True, help="Smaller grid and fewer repeats (a smoke test).")
@click.option("--host/--no-host", default=True, show_default=True, help="Also measure host work per iteration.")
@click.option("--alias/--no-alias", default=True, show_default=True,
              help="Copy rows to models whose shapes equal an earlier model's instead of re-timing.")
@click.option("--attention", default="auto", show_default=True,
              help="auto (the runtime's default: triton on CUDA, torch on CPU) | torch (SDPA) | triton.")
@click.option("--weight-format", default="native", show_default=True,
              help="native (GEMM weights in --dtype) | fp8 (weight-only float8 e4m3, per-row scales) | int4 "
                   "(W4A16, groups of 128): each a separate profile folder, as the bundled h200-fp8.")
@click.option("--attention-ws", default="auto", show_default=True,
              help="auto (the runtime's default: on for native weights on sm_90) | on (forwards of >= 128 rows per KV "
                   "head and >= 32 tokens through the Gluon warp-specialized tree attention: Hopper, bf16/fp16) | "
                   "off. Recorded in meta.json.")
@click.option("--time-budget", type=seconds(), default=None, help="Seconds; then stop and write what was measured.")
@click.option("--loop", type=click.Choice(LOOPS), default=None,
              help="The decoding loop whose host work the host rows measure (meta.json `loop`; `run` and `validate` "
                   "then run that loop by default) [default: a resumed folder's loop, else device on CUDA, host "
                   "otherwise].")
def profile_compute_cmd(models, tp, tokens, kv, compact, output, device, dtype, quick, host, alias, attention,
                        weight_format, attention_ws, time_budget, loop) -> None:  # fmt: skip
    """Time forward/layers, embed, LM head, tree growth, KV compaction and host work per iteration."""
    check_output_dir(output, "-o", ("compute.csv", "comm.csv", "meta.json", "compute.partial.csv"))
    from swiftspec.profiler.compute import ComputeGrid, ComputeOptions, TimingConfig, profile_compute

    device, dtype = device_dtype(device, dtype)
    dflt = ComputeGrid.default(device, quick)
    tok = tuple(_int_list(tokens, "--tokens") or dflt.tokens)
    grid = ComputeGrid(
        tps=tuple(_int_list(tp, "--tp") or dflt.tps), tokens=tok, kv=tuple(_int_list(kv, "--kv") or dflt.kv),
        compact=tuple(_int_list(compact, "--compact") or (dflt.compact if tokens is None else tok)),
    )  # fmt: skip
    res = profile_compute(
        [m.strip() for m in models.split(",") if m.strip()], output, device=device, grid=grid,
        timing=TimingConfig.for_device(device, quick),
        options=ComputeOptions(dtype=dtype, host=host, alias=alias, attention=attention, weight_format=weight_format,
                               attention_ws=attention_ws, time_budget_s=time_budget, loop=loop),
        progress=sys.stderr.isatty(),
        log=None if sys.stderr.isatty() else (lambda line: click.echo(line, err=True)),
    )  # fmt: skip
    for line in res.skipped:
        click.echo(f"skipped {line}", err=True)
    n = res.compute.groupby("op").size().to_dict()
    click.echo(f"wrote {res.out}/compute.csv ({len(res.compute)} rows: "
               + ", ".join(f"{k} {v}" for k, v in sorted(n.items())) + ")")
    if res.missing:
        click.echo(f"incomplete: {res.missing} points not measured (time budget ran out); run the same command again "
                   f"to resume from {res.out}/compute.partial.csv", err=True)


@profile_group.command("comm")
@click.option("-o", "--output", default="profile", show_default=True, help="Profile folder: writes comm.csv.")
@click.option("--sizes", type=IntList(1), default=None,
              help="Message sizes in bytes [default: cuda 1 KiB..64 MiB; cpu 1K,16K,256K].")
@click.option("--world", type=count(1, MAX_GPUS), default=None, help="Processes / GPUs [default: all GPUs; 2 on cpu].")
@click.option("--device", type=click.Choice(DEVICES), default=None, help=f"cuda | cpu (gloo) {DEVICE_RULE}.")
@click.option("--graphs/--no-graphs", default=True, show_default=True, help="Also time CUDA-graph-captured collectives.")
@click.option("--timeout", "timeout_s", type=seconds(), default=480.0, show_default=True,
              help="Seconds before the workers are stopped (rows measured so far are kept).")
def profile_comm_cmd(output, sizes, world, device, graphs, timeout_s) -> None:
    """All-reduce (NCCL, symmetric-memory one-shot) and send/recv over bytes x group size."""
    check_output_dir(output, "-o", ("comm.csv", "meta.json"))
    from swiftspec.profiler.comm import profile_comm, write_comm

    sz = _int_list(sizes, "--sizes")
    with folder_lock(output, "profile comm"):  # one writer per profile folder, from measuring to writing
        res = profile_comm(world=world, sizes=tuple(sz) if sz else None, device=device_dtype(device)[0], graphs=graphs,
                           timeout_s=timeout_s)  # fmt: skip
        for line in res.notes:
            click.echo(line)
        if not write_comm(output, res):
            click.echo(f"kept the measured {output}/comm.csv (defaults never replace measured rows)")
            return
    what = "measured" if res.measured else "defaults (not measured)"
    click.echo(f"wrote {output}/comm.csv ({len(res.comm)} rows, {what})")


@profile_group.command("acceptance")
@click.option("--target", required=True, help="Target checkpoint folder.")
@click.option("--draft", required=True, help="Draft checkpoint folder (same tokenizer).")
@click.option("--prompts", default="builtin", show_default=True,
              help="builtin, builtin:chat,code,math,summarisation, or a JSONL file ({\"prompt\": ...} per line).")
@click.option("--num-prompts", type=count(1), default=12, show_default=True, help="Prompts to trace (first N).")
@click.option("--max-new-tokens", type=TOKENS, default=48, show_default=True, help="Target tokens per prompt.")
@click.option("--top-k", type=count(1, MAX_TOP_K), default=32, show_default=True,
              help="Ranks beyond this are recorded as -1.")
@click.option("--policies", default="chain/bs5-w1-d4,serial/bs8-w8-d4,serial/bs16-w4-d6", show_default=True,
              help="Tree policies whose accepted length the runtime measures.")
@click.option("--accepted-prompts", type=count(0), default=3, show_default=True,
              help="Prompts the accepted-length runs use (first N).")
@click.option("-o", "--output", default=None, help="Output JSON [default: <target>__<draft>.json].")
@click.option("--device", type=click.Choice(DEVICES), default=None, help=DEVICE_RULE)
@click.option("--dtype", type=click.Choice(DTYPES), default=None, help=DTYPE_RULE)
@click.option("--weight-format", default="native", show_default=True,
              help="native | fp8 | int4: both models' GEMM weights (weight-only float8 e4m3; W4A16 "
                   "rounded to nearest).")
@click.option("--draft-weight-format", default=None,
              help="native | fp8 | int4 for the draft alone [default: --weight-format]. --draft = --target "
                   "with --draft-weight-format int4 measures how often the int4 model's greedy token is the "
                   "target's.")
@sampling_options
def profile_acceptance_cmd(target, draft, prompts, num_prompts, max_new_tokens, top_k, policies, accepted_prompts,
                           output, device, dtype, weight_format, draft_weight_format, sampling) -> None:  # fmt: skip
    """Record the rank of the target's token in the draft's distribution along the target's path
    (its greedy path, or its sampled one with --temperature: the profile then plans sampled decoding)."""
    if output:
        check_output_file(output, "-o")
    else:
        check_output_dir(".", "-o (default: the current folder)")
    from swiftspec.profiler.acceptance import AcceptanceOptions, profile_acceptance

    device, dtype = device_dtype(device, dtype)
    options = AcceptanceOptions(prompts=prompts, num_prompts=num_prompts, max_new_tokens=max_new_tokens, top_k=top_k,
                                policies=tuple(p for p in policies.split(",") if p.strip()),
                                accepted_prompts=accepted_prompts)  # fmt: skip
    prof = profile_acceptance(target, draft, options, sampling, device=device, dtype=dtype, weight_format=weight_format,
                              draft_weight_format=draft_weight_format, progress=sys.stderr.isatty(),
                              log=progress_for(False))  # fmt: skip
    out = output or f"{prof.meta['name']}.json"
    prof.save(out)
    m = prof.meta
    click.echo(f"acceptance: measured ({m['target_name']} <- {m['draft_name']}), {m['positions']} positions on "
               f"{len(prof.traces)} prompts, {m['seconds']} s"
               + (f", sampled at temperature {sampling.temperature:g}" if not sampling.greedy else ", greedy")
               + (f", top-k {sampling.top_k}" if sampling.top_k else "")
               + (f", top-p {sampling.top_p:g}" if sampling.top_p < 1 else ""))
    click.echo("positional (rank 0..7): " + " ".join(f"{p:.3f}" for p in prof.positional[:8]))
    click.echo("draft_prob_by_rank (0..7): " + " ".join(f"{p:.3f}" for p in prof.draft_prob_by_rank[:8]))
    for key, v in prof.accepted.items():
        click.echo(f"accepted {key}: {v:.2f} tokens/verify (lossless: {m['lossless'][key]})")
    click.echo(f"wrote {out}")


@profile_group.command("derive")
@click.option("--from", "source", required=True, help="The measured profile: a folder or builtin:NAME.")
@click.option("--hardware", default=None,
              help="The GPU to derive for: a spec JSON (the fields of swiftspec/data/hardware/h200.json) or builtin:NAME: h100-sxm, h200, b200, h20 [default: the source's GPU].")
@click.option("--source-hardware", default=None,
              help="The spec of the GPU the profile was measured on [default: the bundled spec of its meta `gpu`].")
@click.option("--weight-format", default="native", show_default=True,
              help="native | fp8 | int4: the weights the derived rows run; other than the source's native, "
                   "each forward's weight bytes are recomputed for that format (swiftspec/sim/derive_format.py).")
@click.option("-o", "--output", required=True, help="Folder for the derived profile.")
def profile_derive_cmd(source, hardware, source_hardware, weight_format, output) -> None:
    """Scale a measured profile to another GPU or weight format: every row split into its bytes-,
    math- and launch-bound parts, each scaled by the two GPUs' numbers (swiftspec/sim/derive.py)
    or the bytes recomputed for the weights (swiftspec/sim/derive_format.py)."""
    if weight_format not in WEIGHT_FORMATS:
        raise UserError(f"--weight-format must be one of {', '.join(WEIGHT_FORMATS)}, got {weight_format!r}")
    if hardware is None and weight_format == "native":
        raise UserError("give --hardware (another GPU) or --weight-format (other weights): nothing to derive")
    check_output_dir(output, "-o", ("compute.csv", "comm.csv", "meta.json"))
    src = Profile.load(resolve_builtin("profile", source))
    src_hw = HardwareSpec.load(source_hardware or source_hardware_of(src))
    dst_hw = HardwareSpec.load(hardware) if hardware else src_hw
    prof = derive_profile(src, src_hw, dst_hw, source) if hardware else src
    if weight_format != "native":
        prof = derive_weight_format(prof, weight_format, dst_hw, source)
    prof.meta.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     command=" ".join(["swiftspec", *sys.argv[1:]]))
    prof.save(output)
    click.echo(f"wrote {output}: {prof.label}")


@profile_group.command("calibrate")
@click.option("-o", "--output", required=True, help="The spec JSON to write (for `profile derive --hardware` / --source-hardware).")
@click.option("--device", type=click.Choice(DEVICES), default=None, help=DEVICE_RULE)
@click.option("--base", default=None,
              help="Spec (JSON or builtin:NAME) the numbers one device cannot show come from: link_gb_s, link_us "
                   "[default: the bundled spec of this GPU, else builtin:h200].")
def profile_calibrate_cmd(output, device, base) -> None:
    """Measure this machine's copy bandwidth, matmul rates (bf16, fp8 where it runs), kernel launch
    time, memory and SMs, and write them as a hardware spec (small sizes on cpu, for tests)."""
    check_output_file(output, "-o")
    base_spec = HardwareSpec.load(base) if base else None
    from swiftspec.profiler.calibrate import calibrate, check_replace

    device = device_dtype(device)[0]
    check_replace(output, device)
    spec = calibrate(device, base_spec, log=progress_for(False))
    atomic_write_text(output, json.dumps(spec.to_dict(), indent=2) + "\n")
    fp8 = f"{spec.fp8_tflops:.4g} TFLOP/s" if "fp8_tflops" in spec.measured else "not measured"
    click.echo(f"{spec.label}: copy {spec.hbm_tb_s:.4g} TB/s, matmul "
               f"{'bf16' if spec.device == 'cuda' else 'float32'} {spec.bf16_tflops:.4g} TFLOP/s, fp8 {fp8}, "
               f"kernel {spec.launch_us:.3g} µs, {spec.hbm_gib:.1f} GiB, {spec.sms} {'SMs' if spec.device == 'cuda' else 'threads'}")
    click.echo(f"wrote {output} (link_gb_s, link_us: not measured, see its notes); derive between two calibrations "
               "(--hardware, --source-hardware): the bundled specs' launch_us is not measured")


@profile_group.command("check")
@click.argument("folder", metavar="FOLDER|builtin:NAME")
@click.option("--json", "as_json", is_flag=True, help="Print every held-out point as JSON.")
def profile_check_cmd(folder, as_json) -> None:
    """Hold out interior grid lines, predict them with the latency model, report the error."""
    folder = resolve_builtin("profile", folder, as_path=True)
    errors, summary = check_profile(folder)
    if as_json:
        click.echo(errors.to_json(orient="records"))
        return
    click.echo(f"latency model vs held-out points of {folder} (|predicted / measured - 1|):")
    click.echo(summary.to_string(index=False, formatters={"median_abs_err": "{:.2%}".format,
                                                          "max_abs_err": "{:.2%}".format}))  # fmt: skip
    worst = errors.reindex(errors["err"].abs().sort_values(ascending=False).index).head(5)
    click.echo("worst points:")
    click.echo(worst.to_string(index=False, float_format=lambda x: f"{x:.4g}"))


# ---- run (swiftspec.runtime async engine) --------------------------------------------------


@cli.command("run")
@click.option("--plan", "plan_path", required=True, type=click.Path(), help="plan.json from `swiftspec plan`")
@click.option("--prompts", default="builtin", show_default=True, help="builtin, or a JSONL/text file of prompts")
@click.option("--num-prompts", default=8, show_default=True, type=count(1), help="prompts to run (first N)")
@click.option("--max-new-tokens", default=64, show_default=True, type=TOKENS)
@click.option("--device", type=click.Choice(DEVICES), default=None, help="[default: the device the plan names]")
@click.option("--dtype", type=click.Choice(DTYPES), default=None, help=DTYPE_RULE)
@click.option("--weights", type=click.Choice(["checkpoint", "random"]), default="checkpoint", show_default=True)
@click.option("--acceptance", type=click.Path(), default=None,
              help="replay this AcceptanceProfile's rank traces, a JSON file or builtin:NAME (synthetic acceptance; "
                   "default with random weights: the plan's)")
@click.option("--modes", default=None, help="comma list, default: the plan's mode,serial,autoregressive")
@click.option("--profile", "profile_dir", default=None,
              help="profile folder or builtin:NAME the predictions come from [default on cuda: the plan's when it was "
                   "made for this GPU, else this GPU's bundled profile (said on stderr); cpu: the plan's]")
@click.option("-o", "--output", "out_dir", type=click.Path(), default=None, help="write the run log folder here")
@click.option("--timeout", "timeout_s", default=300.0, show_default=True, type=seconds(),
              help="seconds a collective may wait / the run may make no progress before it is stopped")
@click.option("--seed", default=0, show_default=True, type=SEED)
@profile_loop_option
@sampling_options
def run_cmd(plan_path, prompts, num_prompts, max_new_tokens, device, dtype, weights, acceptance, modes, profile_dir,
            out_dir, timeout_s, seed, loop, sampling) -> None:
    """Run a plan with the asynchronous runtime, plus baselines in the same launch; measured vs predicted.
    Sampling (--temperature > 0) needs measured acceptance: --weights checkpoint, no --acceptance."""
    if out_dir:  # before the run: a path that cannot be written must not cost the measurements
        check_output_dir(out_dir, "-o", ("iterations.jsonl", "prompts.jsonl", "summary.json"))
    from swiftspec.run import RunOptions, format_report, run_plan
    from swiftspec.runtime.launch import RunFailed

    acceptance, profile_dir = resolve_builtin("acceptance", acceptance), resolve_builtin("profile", profile_dir)
    options = RunOptions(prompts=prompts, num_prompts=num_prompts, max_new_tokens=max_new_tokens, device=device,
                         dtype=dtype, weights=weights, acceptance=acceptance, profile=profile_dir,
                         modes=tuple(m.strip() for m in modes.split(",") if m.strip()) if modes else None,
                         timeout_s=timeout_s, seed=seed, loop=loop)  # fmt: skip
    progress = progress_for(False)

    def started(pids: list[int]) -> None:
        progress(f"run: {len(pids)} worker process{'es' if len(pids) != 1 else ''} started: {num_prompts} "
                 f"prompt(s) per mode, up to {max_new_tokens} tokens each")

    try:
        log = run_plan(plan_path, options, sampling, on_start=started, progress=progress)
    except RunFailed as e:
        click.echo(f"error: run failed: {e}", err=True)
        sys.exit(1)
    if log is None:  # a torchrun rank other than 0
        return
    click.echo(format_report(log))
    if out_dir:
        log.write(out_dir)
        click.echo(f"run log: {out_dir} (iterations.jsonl, prompts.jsonl, summary.json)")

# ---- study / validate (studies/) -----------------------------------------------------------


@cli.command("study")
@click.argument("name", required=False)
@click.option("-i", "--input", "inputs", multiple=True,
              help="Input file or folder (repeatable; what each study takes: --list) [default: bundled data].")
@click.option("-o", "--output", "out_dir", default="figures", show_default=True, help="Folder for NAME.png and NAME.svg.")
@click.option("--list", "list_", is_flag=True, help="List the studies with one-line descriptions.")
def study_cmd(name, inputs, out_dir, list_) -> None:
    """Draw figure NAME as PNG and SVG, and its data as CSV where the study writes one (studies in
    swiftspec/studies/, see studies/README.md)."""
    from swiftspec.studies import list_studies, run_study  # imports matplotlib: only for this command

    if list_ or not name:
        if not list_:
            raise UserError("give a study NAME (see `swiftspec study --list`)")
        for n, desc in list_studies():
            click.echo(f"{n:16s} {desc}")
        return
    check_output_dir(out_dir, "-o", (f"{name}.png", f"{name}.svg", f"{name}.csv"))
    inputs = tuple(resolve_builtin("input", i) for i in inputs)
    out = run_study(name, inputs, out_dir, progress=_progress(False))
    for line in out.notes:
        click.echo(f"note: {line}", err=True)
    for p in out.paths:
        click.echo(f"wrote {p}")
    click.echo(f"regenerate: {out.command} -o {out_dir}")


def _pairs(text: str | None) -> list[tuple[str, str]] | None:
    if not text:
        return None
    out = []
    for item in text.split(","):
        t, sep, d = item.strip().partition(":")
        if not sep or not t or not d:
            raise UserError(f"--pairs takes TARGET:DRAFT,... (got {item!r})")
        out.append((t, d))
    return out


@cli.command("validate")
@click.option("--gpus", type=GPUS, default=1, show_default=True, help="Devices (1: autoregressive, chain, serial).")
@click.option("--configs", type=count(1), default=None, help="Run only the first N configurations [default: all, >= 20 on cuda].")
@click.option("--device", type=click.Choice(DEVICES), default=None, help=DEVICE_RULE)
@click.option("--profile", "profile_dir", default=None,
              help="Profile folder or builtin:NAME [default on cuda: the bundled profile of the visible GPU, "
                   "h200-measured on an H200, h100-measured on an H100, else h200-measured (said so); cpu: required].")
@click.option("--acceptance", default=None,
              help="Acceptance profile JSON or builtin:NAME to replay [default: smollm2-135m__int3g32].")
@click.option("--pairs", default=None, help="TARGET:DRAFT,... [default on cuda: Llama-3-8B:Llama-3.2-1B,"
              "Llama-3.2-3B:Llama-3.2-1B,Llama-3.2-1B:Llama-3.2-1B].")
@click.option("--weights", type=click.Choice(["random", "checkpoint"]), default="random", show_default=True)
@click.option("--prompts", type=count(1), default=3, show_default=True, help="Builtin prompts per configuration.")
@click.option("--max-new-tokens", type=TOKENS, default=64, show_default=True)
@click.option("--passes", type=count(1), default=None,
              help="Run every configuration this many times (all once per pass) and report the medians "
              "[default: 3 on cuda, 1 on cpu].")
@click.option("--calibrate-host/--no-calibrate-host", default=True, show_default=True,
              help="Measure host work per forward / per token first (stand-ins with each pair's vocab and layers) "
              "and use it in the predictions.")
@click.option("-o", "--output", "out_dir", default=None, help="Write report.csv, report.json, host.csv here.")
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--repredict", default=None, metavar="REPORT",
              help="Run nothing: predict an earlier sweep (its report.json, folder or printed log) again from "
              "--profile, keeping its measurements and host calibration.")
@profile_loop_option
def validate_cmd(gpus, configs, device, profile_dir, acceptance, pairs, weights, prompts, max_new_tokens, passes,
                 calibrate_host, out_dir, seed, repredict, loop) -> None:  # fmt: skip
    """Predict configurations from a profile, then run them in one process: predicted vs measured."""
    if out_dir:  # before the sweep: a path that cannot be written must not cost the measurements
        check_output_dir(out_dir, "-o", ("report.csv", "report.json", "host.csv"))
    from swiftspec.validate import SweepOptions, format_report, validate
    from swiftspec.validate import repredict as repredict_sweep

    profile_dir, acceptance = resolve_builtin("profile", profile_dir), resolve_builtin("acceptance", acceptance)
    progress = progress_for(False)
    if repredict:
        rep = repredict_sweep(repredict, profile=profile_dir, acceptance=acceptance,
                              log=progress)
        click.echo(format_report(rep))
        if out_dir:
            rep.write(out_dir)
            click.echo(f"wrote {out_dir}/report.csv, report.json")
        return
    device = device_dtype(device)[0]
    pair_list = _pairs(pairs)
    sweep = SweepOptions(device=device, pairs=tuple(pair_list) if pair_list else None, configs=configs,
                         weights=weights, prompts=prompts, max_new_tokens=max_new_tokens,
                         passes=passes or (3 if device == "cuda" else 1), seed=seed, gpus=gpus, loop=loop)  # fmt: skip
    rep = validate(sweep, profile=profile_dir, acceptance=acceptance, calibrate=calibrate_host,
                   log=progress)  # fmt: skip
    click.echo(format_report(rep))
    if out_dir:
        rep.write(out_dir)
        click.echo(f"wrote {out_dir}/report.csv, report.json")


# ---- list (swiftspec.catalog) ----------------------------------------------------------------


@cli.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: models, profiles, acceptance.")
def list_cmd(as_json) -> None:
    """The bundled models (with their sizes), profiles (GPU, weight format, the models and TP
    degrees they cover, measured or derived) and acceptance profiles (pair, measured or synthetic,
    temperature). Give a profile or acceptance profile to any option as builtin:NAME."""
    if as_json:
        click.echo(json.dumps(to_jsonable(catalog())))
        return
    click.echo(catalog_text())
