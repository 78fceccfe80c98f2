"""Which transport carries the leader-to-leader messages fastest? (round trip of one iteration's pair)

Per iteration the draft leader sends a subtree (3 + 3*bs int64, 216 B at bs=8) and the target leader
answers with a verdict (4 + bs int64, 96 B). Compared, between two processes on one host:
  gloo        torch.distributed send/recv of CPU tensors (what groups.Link uses)
  shm+pipe    a shared-memory tensor written in place, a 1-byte multiprocessing.Pipe message as signal
  nccl        send/recv of CUDA tensors + the copy to host the tree bookkeeping needs (>= 2 GPUs only)
Prints and writes benchmarks/results/link_<device>.json (median / p90 round trip in µs).

    python benchmarks/bench_link.py [--iters 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from swiftspec.files import atomic_write_text, run_metadata

BS = 8
SUB, VER = 3 + 3 * BS, 4 + BS


def _dist(rank, port, iters, backend, q):
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    dev = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(dev)
    sub = torch.arange(SUB, device=dev)
    ver = torch.zeros(VER, dtype=torch.long, device=dev)
    times = []
    for i in range(iters + 50):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(sub, 1)
            dist.recv(ver, 1)
            ver.tolist()  # the draft reads the verdict on the host
        else:
            dist.recv(sub, 0)
            sub.tolist()
            dist.send(ver, 0)
        if i >= 50:
            times.append((time.perf_counter() - t0) * 1e6)
    if rank == 0:
        q.put(times)
    dist.barrier()
    dist.destroy_process_group()


def _shm(rank, buf, conns, iters, q):
    end = conns[rank]  # this process's end of the pipe
    times = []
    for i in range(iters + 50):
        t0 = time.perf_counter()
        if rank == 0:
            buf[:SUB] = torch.arange(SUB)
            end.send_bytes(b"s")
            end.recv_bytes()
            buf[SUB:].tolist()
        else:
            end.recv_bytes()
            buf[:SUB].tolist()
            buf[SUB:] = 0
            end.send_bytes(b"v")
        if i >= 50:
            times.append((time.perf_counter() - t0) * 1e6)
    if rank == 0:
        q.put(times)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(kind: str, iters: int) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    if kind == "shm+pipe":
        buf = torch.zeros(SUB + VER, dtype=torch.long).share_memory_()
        a, b = ctx.Pipe()
        procs = [ctx.Process(target=_shm, args=(r, buf, (a, b), iters, q)) for r in range(2)]
    else:
        port = _free_port()
        procs = [ctx.Process(target=_dist, args=(r, port, iters, kind, q)) for r in range(2)]
    for p in procs:
        p.start()
    times = q.get(timeout=300)
    for p in procs:
        p.join(60)
    times.sort()
    return {"transport": kind, "round_trip_us_median": statistics.median(times),
            "round_trip_us_p90": times[int(0.9 * len(times))], "iters": iters,
            "bytes": {"subtree": SUB * 8, "verdict": VER * 8}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    kinds = ["gloo", "shm+pipe"] + (["nccl"] if torch.cuda.device_count() >= 2 else [])
    rows = [measure(k, args.iters) for k in kinds]
    for r in rows:
        print(f"{r['transport']:9s} round trip median {r['round_trip_us_median']:8.1f} us   p90 {r['round_trip_us_p90']:8.1f} us")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = Path(__file__).parent / "results" / f"link_{dev}.json"
    atomic_write_text(out, json.dumps({"run_metadata": run_metadata(dev), "results": rows,
                                       "cpu_count": os.cpu_count()}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
