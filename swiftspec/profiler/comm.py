"""`swiftspec profile comm`: collectives over bytes x group size, with the GPUs they span.

`world` processes are spawned (torch.multiprocessing, one per GPU; gloo on CPU). For every group
size g in 2..world (ranks 0..g-1) and every message size, rank 0 records (collective, group_size,
bytes, ms, p10, p90, n):

    all_reduce               NCCL all-reduce captured in a CUDA graph (what the runtime's graphed
                             forward runs); on CPU: gloo, eager
    all_reduce_eager         NCCL all-reduce launched eagerly (GPU only)
    all_reduce_oneshot       torch symmetric-memory one-shot all-reduce (every rank reads its
                             peers' buffers over NVLink; no multicast), graph-captured, messages
                             <= 8 MiB (GPU only; skipped with a note where torch lacks it)
    send_recv                rank 0 -> rank 1 message, eager: half of a ping-pong round trip
                             (group_size 2)
    send_recv_graph          the same ping-pong captured in CUDA graphs (GPU only)

NVLink multicast (NVLS) is never used: NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1
are set before any process is spawned.

Each point: warm-up, then `batches` batches of `per_batch` back-to-back operations; a batch's time
(device events on GPU, perf_counter on CPU after a barrier) divided by `per_batch` is one sample;
the row holds the median. Rank 0 appends rows to a JSONL file as it goes, so a run that is killed
(time limit) keeps what it measured.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from swiftspec.files import folder_lock, run_metadata
from swiftspec.profiler.compute import write_profile_files
from swiftspec.sim.profile_default import published_comm_table
from swiftspec.spec import COMM_COLUMNS, UserError

NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
ONESHOT_MAX_BYTES = 8 * 2**20
COLUMNS = (*COMM_COLUMNS, "p10", "p90", "n")


@dataclass(frozen=True)
class CommConfig:
    """What one comm profile measures (see the module docstring)."""

    world: int
    sizes: tuple[int, ...]
    device: str  # "cuda" | "cpu"
    graphs: bool = True
    warmup: int = 5
    batches: int = 7
    per_batch: int = 20

    @classmethod
    def default_sizes(cls, device: str) -> tuple[int, ...]:
        """GPU: 1 KiB .. 64 MiB in powers of two; CPU (gloo): 1 KiB .. 256 KiB by 16x."""
        if device == "cuda":
            return tuple(2**k for k in range(10, 27))
        return (2**10, 2**14, 2**18)


def _set_no_multicast() -> None:
    os.environ.update(NO_MULTICAST_ENV)


# --------------------------------------------------------------------------------------------
# worker side (runs in each spawned process)


def _samples(run_batch, sync, cfg: CommConfig, cuda: bool) -> list[float]:
    """`run_batch()` issues cfg.per_batch operations; returns per-operation ms samples."""
    run_batch()  # warm-up (also lazy communicator set-up)
    sync()
    out = []
    for _ in range(cfg.batches):
        sync()
        if cuda:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run_batch()
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e) / cfg.per_batch)
        else:
            t = time.perf_counter()
            run_batch()
            out.append((time.perf_counter() - t) * 1e3 / cfg.per_batch)
    return out


def _graph_of(fn, n: int):
    """`fn` captured n times into one CUDA graph (after a warm-up on a side stream) -> replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    torch.cuda.synchronize()
    return g.replay


def _worker(rank: int, cfg: CommConfig, init_file: str, rows_path: str, notes_path: str) -> None:
    _set_no_multicast()  # the spawning parent set it already; set here too so a worker never runs without it
    cuda = cfg.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=cfg.world)  # fmt: skip

    def barrier(group=None) -> None:
        if cuda:  # NCCL: the barrier must run on this rank's device
            dist.barrier(group=group, device_ids=[rank])
        else:
            dist.barrier(group=group)

    def emit(collective: str, g: int, nbytes: int, samples: list[float]) -> None:
        if rank != 0:
            return
        a = np.asarray(samples)
        row = {"collective": collective, "group_size": g, "bytes": nbytes, "ms": float(np.median(a)),
               "p10": float(np.percentile(a, 10)), "p90": float(np.percentile(a, 90)), "n": len(a)}  # fmt: skip
        with open(rows_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def note(text: str) -> None:
        if rank == 0:
            with open(notes_path, "a") as f:
                f.write(text + "\n")

    symm = None
    if cuda:
        try:
            import torch.distributed._symmetric_memory as symm  # private and optional: absent in some torch
        except ImportError:
            note("all_reduce_oneshot: torch.distributed._symmetric_memory is not available in this torch")

    n = cfg.per_batch
    for g in range(2, cfg.world + 1):
        group = dist.new_group(list(range(g)))  # collective: every rank calls it
        if rank < g:

            def sync(group=group) -> None:
                if cuda:
                    torch.cuda.synchronize()
                barrier(group)

            for nbytes in cfg.sizes:
                numel = max(1, nbytes // esize)
                buf = torch.randn(numel, device=dev).to(dtype)

                def ar(buf=buf, group=group):
                    dist.all_reduce(buf, group=group)

                if cuda:
                    emit("all_reduce_eager", g, nbytes, _samples(lambda: [ar() for _ in range(n)], sync, cfg, cuda))
                    if cfg.graphs:
                        emit("all_reduce", g, nbytes, _samples(_graph_of(ar, n), sync, cfg, cuda))
                else:
                    emit("all_reduce", g, nbytes, _samples(lambda: [ar() for _ in range(n)], sync, cfg, cuda))
                if cuda and symm is not None and nbytes <= ONESHOT_MAX_BYTES:
                    try:
                        if hasattr(symm, "enable_symm_mem_for_group"):
                            symm.enable_symm_mem_for_group(group.group_name)
                        sbuf = symm.empty(numel, device=dev, dtype=dtype)
                        sbuf.copy_(buf)
                        symm.rendezvous(sbuf, group.group_name)

                        def oneshot(sbuf=sbuf, group=group):
                            torch.ops.symm_mem.one_shot_all_reduce(sbuf, "sum", group.group_name)

                        run = _graph_of(oneshot, n) if cfg.graphs else (lambda: [oneshot() for _ in range(n)])
                        emit("all_reduce_oneshot", g, nbytes, _samples(run, sync, cfg, cuda))
                    except (RuntimeError, AttributeError, TypeError) as e:  # same on every rank
                        note(f"all_reduce_oneshot skipped at group {g}: {type(e).__name__}: {str(e).splitlines()[0]}")
                        symm = None
        barrier()

    # point to point: ping-pong between ranks 0 and 1 (the other ranks wait)
    if rank < 2:
        peer = 1 - rank
        for nbytes in cfg.sizes:
            buf = torch.randn(max(1, nbytes // esize), device=dev).to(dtype)

            two = lambda buf=buf: [_pingpong(buf, rank, peer) for _ in range(n)]  # noqa: E731
            emit("send_recv", 2, nbytes, [x / 2 for x in _samples(two, lambda: torch.cuda.synchronize() if cuda
                                                                   else None, cfg, cuda)])  # fmt: skip
    barrier()
    if cuda and cfg.graphs and rank < 2:
        try:
            for nbytes in cfg.sizes:
                buf = torch.randn(max(1, nbytes // esize), device=dev).to(dtype)
                run = _graph_of(lambda buf=buf: _pingpong(buf, rank, 1 - rank), n)
                emit("send_recv_graph", 2, nbytes, [x / 2 for x in _samples(run, torch.cuda.synchronize, cfg, cuda)])
        except RuntimeError as e:
            note(f"send_recv_graph skipped: {type(e).__name__}: {str(e).splitlines()[0]}")
    barrier()
    dist.destroy_process_group()


def _pingpong(buf, rank: int, peer: int) -> None:
    """One round trip of the tensor `buf` between ranks 0 and 1 (rank 0 sends first)."""
    if rank == 0:
        dist.send(buf, peer)
        dist.recv(buf, peer)
    else:
        dist.recv(buf, peer)
        dist.send(buf, peer)


# --------------------------------------------------------------------------------------------
# driver


def published_defaults() -> tuple[pd.DataFrame, str]:
    """The bundled derived profile's comm table (published NVLink / IB latencies) and its label."""
    return published_comm_table(), "derived (published NVLink/InfiniBand latencies, not measured)"


@dataclass
class CommResult:
    """Rows measured (or the labelled defaults), notes, and whether they were measured."""

    comm: pd.DataFrame
    measured: bool
    notes: list[str]
    config: CommConfig | None = None


def profile_comm(
    *,
    world: int | None = None,
    sizes: tuple[int, ...] | None = None,
    device: str | None = None,
    graphs: bool = True,
    timeout_s: float = 480.0,
) -> CommResult:
    """Spawn `world` processes and measure the collectives (see the module docstring).

    device: "cuda" (default when a GPU exists) or "cpu" (gloo). On CUDA with fewer than 2 GPUs
    nothing can be measured: the published defaults come back, labelled, with measured=False.
    """
    _set_no_multicast()  # before anything spawns, always
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device not in ("cpu", "cuda"):
        raise UserError(f"unknown device {device!r}: choose cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but no CUDA GPU is available: use --device cpu")
    ngpu = torch.cuda.device_count() if device == "cuda" else 0
    if world is None:
        world = ngpu if device == "cuda" else 2
    if device == "cuda" and (ngpu < 2 or world < 2):
        df, label = published_defaults()
        return CommResult(df.assign(p10=df["ms"], p90=df["ms"], n=0), False,
                          [f"communication needs >= 2 GPUs (this machine has {ngpu}): kept the {label}"])  # fmt: skip
    if world < 2:
        raise UserError(f"--world must be >= 2 (communication needs two processes), got {world}")
    if device == "cuda" and world > ngpu:
        raise UserError(f"--world {world} needs {world} GPUs, this machine has {ngpu}")
    sizes = tuple(sizes) if sizes else CommConfig.default_sizes(device)
    if any(s < 1 for s in sizes):
        raise UserError(f"--sizes must be positive byte counts, got {list(sizes)}")
    cfg = CommConfig(world=world, sizes=tuple(sorted(sizes)), device=device, graphs=graphs and device == "cuda",
                     per_batch=20 if device == "cuda" else 5, batches=7 if device == "cuda" else 5)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="swiftspec-comm-") as tmp:
        init_file, rows_path, notes_path = (str(Path(tmp) / n) for n in ("init", "rows.jsonl", "notes.txt"))
        ctx = mp.start_processes(_worker, args=(cfg, init_file, rows_path, notes_path), nprocs=world,
                                 join=False, start_method="spawn")  # fmt: skip
        deadline = time.time() + timeout_s
        notes: list[str] = []
        try:
            while not ctx.join(timeout=1.0):
                if time.time() > deadline:
                    notes.append(f"stopped after {timeout_s:.0f} s: rows measured until then are kept")
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    break
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:  # the others are terminated
            raise UserError(f"comm profiling failed in a worker: {str(e).strip().splitlines()[-1]}") from None
        rows = [json.loads(line) for line in Path(rows_path).read_text().splitlines()] if Path(rows_path).exists() else []
        if Path(notes_path).exists():
            notes += Path(notes_path).read_text().splitlines()
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    return CommResult(df, True, notes, cfg)


def write_comm(out: str | Path, result: CommResult) -> bool:
    """comm.csv + meta.json["comm"] into a profile folder (compute.csv untouched), with the folder
    locked (`files.folder_lock`).

    Nothing measured is lost: defaults never replace measured rows (returns False and writes
    nothing when `result` was not measured and the folder already holds a measured comm table); a
    measurement that produced no row writes nothing and raises UserError (e.g. --timeout too short);
    one that produced some rows keeps the earlier measured rows of the keys it did not measure
    (collective, group size, bytes) and says so in its notes.
    """
    out = Path(out)
    meta_path = out / "meta.json"
    where = f"kept {out}/comm.csv as it was" if (out / "comm.csv").exists() else "wrote nothing"
    if result.measured and result.comm.empty:
        why = next((n for n in result.notes if n.startswith("stopped after")), "no collective finished")
        raise UserError(f"profile comm measured nothing ({why.split(':')[0]}): {where}; "
                        f"raise --timeout or measure fewer --sizes")
    with folder_lock(out, "profile comm"):
        old_meta = json.loads(meta_path.read_text()).get("comm", {}) if meta_path.exists() else {}
        old_measured = old_meta.get("source") == "measured" and (out / "comm.csv").exists()
        if not result.measured and old_measured:
            return False
        comm, notes = result.comm, list(result.notes)
        if result.measured and old_measured:
            comm, kept = _with_earlier_rows(pd.read_csv(out / "comm.csv"), comm)
            if kept:
                notes.append(f"kept {kept} rows of the earlier measured comm.csv that this run did not measure")
        meta = run_metadata(result.config.device if result.config else None)
        meta.update(source="measured" if result.measured else "derived", notes=notes,
                    config=asdict(result.config) if result.config else None,
                    env=dict(NO_MULTICAST_ENV))  # fmt: skip
        write_profile_files(out, comm=comm, meta_update={"comm": meta})
    return True


def _with_earlier_rows(old: pd.DataFrame, new: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """`new` plus the rows of `old` whose (collective, group_size, bytes) `new` lacks, sorted; and
    how many of `old` were kept."""
    keys = ["collective", "group_size", "bytes"]
    if any(k not in old.columns for k in keys):
        return new, 0
    have = set(new[keys].itertuples(index=False, name=None))
    keep = old[[k not in have for k in old[keys].itertuples(index=False, name=None)]]
    if keep.empty:
        return new, 0
    both = pd.concat([new, keep.reindex(columns=new.columns)], ignore_index=True)
    return both.sort_values(keys, kind="stable").reset_index(drop=True), len(keep)
