"""Process launcher of `swiftspec run`: one process per GPU (or CPU rank), and a watchdog.

`swiftspec.run.run_plan` turns a plan into a `Job` (plain inputs: token ids, rank paths);
`run_job` runs it here and returns what rank 0 gathered.

Two ways in:
  * `launch(job)` spawns the ranks itself (torch.multiprocessing, "spawn"), on one host;
  * under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set) every process
    runs `run_torchrun(job)` itself, so the same command also runs across nodes:
        torchrun --nnodes 2 --nproc-per-node 8 ... -m swiftspec.cli run --plan plan.json

Faults end the whole run within a bounded time, with a clear message and no orphan processes:
  * every collective has a timeout (`init_process_group(timeout=...)`, `--timeout S`);
  * spawned workers die with the launcher (PR_SET_PDEATHSIG) and ignore Ctrl-C, which the launcher
    handles by stopping them (SIGTERM, then SIGKILL after a grace period);
  * the launcher polls its workers: the first one that exits non-zero, or no heartbeat from any
    rank for `timeout` seconds (a hang), stops all of them and raises `RunFailed` naming the rank;
  * a worker's own exception is written to `error-<rank>.txt` and quoted in that message;
  * a worker killed by SIGKILL while the host's available memory was low (below `LOW_MEMORY` of
    its total, or 1 GiB, at any poll during the run) is reported as most likely out of memory,
    with the run's estimate (`Job.meta["memory"]`, from `swiftspec.preflight`): the kernel's OOM
    killer sends SIGKILL, and its log is often not readable.
Under torchrun, torchrun's agent does the stopping; the collective timeouts bound the wait.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from swiftspec.runtime.engine import Ctx, Job, Task, run_worker
from swiftspec.runtime.groups import Layout, make_groups
from swiftspec.runtime.weights import load_tokenizer
from swiftspec.spec import (
    Mode,
    Plan,
    Profile,
    TreePolicy,
    UserError,
    check_int,
    check_list,
    check_str,
    parse_json,
    read_text,
    resolve_model_path,
)

GRACE_S = 3.0  # SIGTERM -> SIGKILL
GIB = 1 << 30
LOW_MEMORY = 0.10  # of the host's total: a SIGKILL below this is reported as out of memory
PROGRESS_FILE = "progress.txt"  # in the run's temporary folder: the workers' progress lines
AVAILABLE_ENV = "SWIFTSPEC_AVAILABLE_GIB"  # pretend this much memory is free (GiB, per device): tests


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory: /proc/meminfo's MemAvailable and MemTotal, else
    `os.sysconf`. `SWIFTSPEC_AVAILABLE_GIB` overrides what is available (tests of the checks)."""
    avail = total = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemAvailable", "MemTotal"):
                n = int(rest.split()[0]) * 1024
                avail, total = (n, total) if key == "MemAvailable" else (avail, n)
    except (OSError, ValueError, IndexError):
        pass
    if not total:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            page = os.sysconf("SC_PAGE_SIZE")
            avail, total = os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
    override = os.environ.get(AVAILABLE_ENV)
    if override:
        with contextlib.suppress(ValueError):
            avail = int(float(override) * GIB)
            total = max(total, avail)
    return avail, total


def memory_is_low(available: int, total: int) -> bool:
    """The rule for "most likely out of memory": less than LOW_MEMORY of the total, or 1 GiB, free."""
    return available < max(LOW_MEMORY * total, GIB)


class RunFailed(RuntimeError):
    """A worker died, failed or hung; the message names it. `pids`: the workers that were stopped."""

    def __init__(self, message: str, pids: list[int]):
        super().__init__(message)
        self.pids = pids


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Linux: get SIGKILL when the launcher dies (no orphans even if it is SIGKILLed)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def run_rank(job: Job, rank: int, world: int, init_method: str, layout: Layout, device: torch.device,
             beat, report=None) -> list[dict] | None:
    """Initialise torch.distributed, build the groups and run the job's tasks on this rank.
    report(line): where this rank's progress lines go (`engine.Ctx.report`; None: nowhere)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=job.timeout_s)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world, timeout=timeout)
    beat()
    groups = make_groups(layout, rank, timeout)
    torch.set_num_threads(max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) // world)))
    ctx = Ctx(job, rank, layout, groups, device, beat)
    if report is not None:
        ctx.report = report
    return run_worker(ctx)


def _spawned(rank: int, world: int, port: int, job: Job, layout: Layout, hb, folder: str) -> None:
    """Entry point of a spawned worker."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher handles Ctrl-C and stops us

    def beat() -> None:
        hb[rank] = time.monotonic()

    def report(line: str) -> None:  # appended whole lines: the launcher forwards them (`_forward`)
        with open(Path(folder) / PROGRESS_FILE, "a") as f:
            f.write(line.replace("\n", " ") + "\n")

    try:
        device = torch.device("cuda", layout.physical[rank]) if job.device == "cuda" else torch.device("cpu")
        out = run_rank(job, rank, world, f"tcp://127.0.0.1:{port}", layout, device, beat, report)
        if rank == 0:
            tmp = Path(folder) / "result.pkl.tmp"
            tmp.write_bytes(pickle.dumps(out))
            os.replace(tmp, Path(folder) / "result.pkl")
    except BaseException as e:  # noqa: BLE001 -- reported to the launcher, then exit non-zero
        first = f"{type(e).__name__}: {e}".splitlines()[0][:400]
        (Path(folder) / f"error-{rank}.txt").write_text(first + "\n" + traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip process-group teardown: peers may already be gone


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)


def _exit_text(code: int, low_memory: bool = False, memory: dict | None = None) -> str:
    """How a worker ended; a SIGKILL while memory was low reads as out of memory (module docstring)."""
    if code == -signal.SIGKILL and low_memory:
        m = memory or {}
        need = f"needs ≈ {m['needed'] / GIB:.1f} GiB, " if m.get("needed") else ""
        avail = m.get("available", m.get("lowest"))
        have = f"{avail / GIB:.1f} GiB available" if avail is not None else "memory was low"
        return f"was killed (SIGKILL), most likely out of memory: {need}{have}"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def launch(job: Job, on_start=None, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Spawn one process per rank of `job.split`, watch them, return rank 0's results.

    on_start(pids): called once the workers are started (tests use it to check for orphans).
    progress(line): the workers' progress lines (one per prompt and task), forwarded as they come.
    Raises RunFailed when a worker fails or the run stalls for `job.timeout_s` seconds.
    """
    layout = Layout.from_split(job.split, job.device, torch.cuda.device_count() if job.device == "cuda" else 0)
    world = layout.world
    ctx = mp.get_context("spawn")
    folder = tempfile.mkdtemp(prefix="swiftspec-run-")
    hb = ctx.Array("d", world, lock=False)
    for i in range(world):
        hb[i] = time.monotonic()
    port = _free_port()
    procs = [ctx.Process(target=_spawned, args=(r, world, port, job, layout, hb, folder), daemon=True)
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        pids = [p.pid for p in procs]
        if on_start is not None:
            on_start(pids)
        _watch(procs, layout, hb, folder, job.timeout_s, job.meta.get("memory"), progress)
        result = Path(folder) / "result.pkl"
        if not result.exists():
            raise RunFailed("rank 0 finished without writing its results", pids)
        return pickle.loads(result.read_bytes())
    finally:
        _stop(procs)
        shutil.rmtree(folder, ignore_errors=True)


def _forward(folder: str, offset: int, progress) -> int:
    """Pass the whole lines the workers appended to the progress file since `offset` to
    `progress`; returns the new offset (a line still being written waits for the next poll)."""
    path = Path(folder) / PROGRESS_FILE
    if progress is None or not path.exists():
        return offset
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].decode("utf-8", "replace").splitlines():
        progress(line)
    return offset + end


def _watch(procs, layout: Layout, hb, folder: str, timeout_s: float, memory: dict | None = None,
           progress=None) -> None:
    pids = [p.pid for p in procs]
    low, lowest = False, None  # the host's available memory was low at some poll (the OOM rule)
    said = 0  # bytes of the progress file forwarded
    while True:
        said = _forward(folder, said, progress)
        avail, total = host_memory()
        low, lowest = low or memory_is_low(avail, total), avail if lowest is None else min(lowest, avail)
        codes = [p.exitcode for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            errors = {r: (Path(folder) / f"error-{r}.txt") for r in failed}
            # the culprit is usually the rank that died without reporting (crash, kill, os._exit)
            first = min(failed, key=lambda r: (errors[r].exists(), r))
            mem = {"lowest": lowest, **(memory or {})}
            msg = f"{layout.describe(first)} {_exit_text(codes[first], low, mem)}"
            if errors[first].exists():
                msg += ": " + errors[first].read_text().splitlines()[0]
            others = [r for r in failed if r != first]
            if others:
                msg += f"; then rank(s) {', '.join(map(str, others))} failed too"
            _stop(procs)
            raise RunFailed(f"{msg}; stopped all {len(procs)} workers (pids {', '.join(map(str, pids))})", pids)
        if all(c == 0 for c in codes):
            _forward(folder, said, progress)
            return
        now = time.monotonic()
        stall = now - max(hb[:])
        if stall > timeout_s:
            stalest = min(range(len(procs)), key=lambda r: hb[r])
            _stop(procs)
            raise RunFailed(
                f"no rank made progress for {stall:.0f} s (--timeout {timeout_s:g}): the run hung; "
                f"{layout.describe(stalest)} was last seen {now - hb[stalest]:.0f} s ago; stopped all "
                f"{len(procs)} workers (pids {', '.join(map(str, pids))})",
                pids,
            )
        time.sleep(0.05)


def torchrun_env() -> dict | None:
    """RANK / WORLD_SIZE / LOCAL_RANK when started by torchrun, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ:
        return {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]),
                "local_rank": int(os.environ.get("LOCAL_RANK", "0"))}
    return None


def run_torchrun(job: Job, progress: Callable[[str], None] | None = None) -> list[dict] | None:
    """Run this process's rank under torchrun. Rank 0 returns the results, the others None.
    progress given: the ranks that lead a task print their progress lines on their own stderr."""
    env = torchrun_env()
    assert env is not None
    layout = Layout.from_split(job.split, job.device)
    if env["world"] != layout.world:
        raise UserError(f"the plan needs {layout.world} processes but torchrun started {env['world']}: "
                        f"use --nproc-per-node/--nnodes that multiply to {layout.world}")
    # every rank has its own GPU under torchrun: mark devices distinct so groups use NCCL
    layout = Layout(layout.split, layout.device, tuple(range(layout.world)) if job.device == "cuda" else layout.physical)
    device = torch.device("cuda", env["local_rank"]) if job.device == "cuda" else torch.device("cpu")
    report = (lambda line: print(line, file=sys.stderr, flush=True)) if progress is not None else None
    return run_rank(job, env["rank"], env["world"], "env://", layout, device, lambda: None, report)


# --------------------------------------------------------------------------------------------
# a plan's inputs: prompts, tasks, weight format


BUILTIN_PROMPTS = ("chat", "code", "math", "summarisation")


def read_prompt_file(spec: str, vocab: int) -> list[str | list[int]]:
    """The prompts of a file, each text or a list of ids: JSONL (`.jsonl`, one object per line with
    "prompt" (text) or "ids" (integers in [0, vocab))) or plain UTF-8 text, one prompt per line.
    A bad line -> UserError naming the file, the line and the field."""
    p = Path(spec)
    if not p.is_file():
        raise UserError(f"prompt file {p} not found: give a JSONL/text file or `builtin`")
    items: list = []
    for i, line in enumerate(read_text(p, "prompt file").splitlines(), start=1):
        if not line.strip():
            continue
        if p.suffix != ".jsonl":
            items.append(line)
            continue
        where = f"prompt file {p} line {i}"
        obj = parse_json(line, where)
        if not isinstance(obj, dict) or ("ids" in obj) == ("prompt" in obj):
            raise UserError(f'{where}: expected a JSON object with "prompt" (text) or "ids" (token ids)')
        if "prompt" in obj:
            items.append(check_str(obj["prompt"], where, '"prompt"'))
            continue
        ids = check_list(obj["ids"], where, '"ids"')
        if not ids:
            raise UserError(f'{where}: "ids" is empty: give at least one token id')
        items.append([check_int(x, where, f'"ids"[{j}]', 0, vocab - 1) for j, x in enumerate(ids)])
    return items


def load_prompts(spec: str, target: str, vocab: int, n: int) -> tuple[list[list[int]], str]:
    """Prompts as token ids, and how they were tokenized.

    spec: "builtin" (the bundled chat/code/math/summarisation sets, interleaved) or a file: JSONL
    with {"prompt": text} or {"ids": [...]} per line, or plain text with one prompt per line.
    Without a tokenizer (bundled model names, random weights) text becomes byte ids mod vocab.
    """
    items: list = []
    if spec == "builtin":
        sets = []
        for name in BUILTIN_PROMPTS:
            f = Path(str(resources.files("swiftspec") / "data" / "prompts" / f"{name}.jsonl"))
            sets.append([json.loads(x)["prompt"] for x in f.read_text().splitlines() if x.strip()])
        for i in range(max(len(s) for s in sets)):
            items.extend(s[i] for s in sets if i < len(s))
    else:
        items = read_prompt_file(spec, vocab)
    items = items[:n]
    if not items:
        raise UserError(f"no prompts in {spec}")
    tok = load_tokenizer(resolve_model_path(target))
    out = []
    for it in items:
        if isinstance(it, list):
            ids = [int(x) for x in it]
        elif tok is not None:
            ids = list(tok(it)["input_ids"])
        else:
            ids = [b % vocab for b in it.encode()]
        if len(ids) < 1 or any(not 0 <= x < vocab for x in ids):
            raise UserError(f"a prompt has ids outside the vocabulary [0, {vocab}) or is empty")
        out.append(ids)
    how = "tokenizer" if tok is not None else f"byte ids mod {vocab} (no tokenizer)"
    return out, how


def tasks_for(plan: Plan, modes: list[str] | None) -> list[Task]:
    """The plan's mode first, then the baselines (default: serial and autoregressive); see `plan_tasks`."""
    return plan_tasks(plan, modes)[0]


def plan_tasks(plan: Plan, modes: list[str] | None) -> tuple[list[Task], list[str]]:
    """(tasks, notes): the plan's mode first, then the baselines (default: serial and
    autoregressive). A plan without a draft (an autoregressive winner) runs with the baselines it
    can run: a default baseline that needs a draft is left out with a note saying why; a mode
    asked for by name (`modes`) that needs one is a UserError."""
    wanted = [Mode.parse(m) for m in modes] if modes else [plan.mode, Mode.serial, Mode.autoregressive]
    tasks, notes = [], []
    for m in dict.fromkeys(wanted):
        if m is Mode.autoregressive:
            tasks.append(Task(m, TreePolicy.autoregressive()))
            continue
        if not plan.draft:
            if modes is None:
                notes.append(f"{m} baseline skipped: the plan has no draft model (its winner is {plan.mode}; "
                             "plan with --modes serial to run speculation)")
                continue
            raise UserError(f"{m} mode needs a draft model but the plan has none: leave it out of --modes")
        if m is Mode.async_ and not Layout.from_split(plan.split, plan.device).disaggregated:
            raise UserError("async mode needs a plan with disjoint draft and target GPUs (its split is co-located)")
        policy = plan.policy if m is not Mode.chain or plan.policy.w == 1 else TreePolicy.chain(max(plan.policy.bs - 1, 1))
        if plan.mode is Mode.autoregressive:  # a draft but no tree in the plan: the default trees
            policy = TreePolicy.chain(4) if m is Mode.chain else TreePolicy()
        policy.validate(m)
        tasks.append(Task(m, policy))
    return tasks, notes


def plan_weight_format(plan: Plan) -> str:
    """The GEMM weight format the plan was predicted for: its profile's (meta `weight_format`), so
    a plan made on an fp8 profile runs fp8 models. "native" when the plan names no profile or its
    profile is not on this machine (then `run` has no prediction to match either)."""
    if plan.profile is None:
        return "native"
    try:
        return Profile.load(plan.profile.path).meta.get("weight_format", "native")
    except UserError:
        return "native"


def run_job(job: Job, on_start=None, progress: Callable[[str], None] | None = None) -> list[dict] | None:
    """Run `job`: under torchrun this process's rank (rank 0 returns the results, the others
    None), else every rank spawned here (`launch`). progress(line): one line per prompt and task."""
    if torchrun_env() is not None:
        return run_torchrun(job, progress)
    return launch(job, on_start=on_start, progress=progress)
