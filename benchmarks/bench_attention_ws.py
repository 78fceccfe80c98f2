"""Warp-specialized (Gluon) tree attention against the Triton kernel, on the many-row shapes.

    python benchmarks/bench_attention_ws.py                 # on a Hopper GPU: ~2 minutes
    python benchmarks/bench_attention_ws.py --shapes 16384:64:32/8 --sweep

Per shape (kv:queries:hq/hkv, head dim 128, bf16, prefix = kv - queries, a random verify tree):
`tree_attention` as the model calls it (impl "triton"; "triton_pdl" with late PDL launches),
`tree_attention_ws` with its defaults (impl "ws": 4 stages, `default_splits`), with PDL launches
("ws_pdl"), with Q in shared memory ("ws_qsmem"); the device µs of each kernel of the default call (torch.profiler,
"ws_kernel:<name>"); and with `--sweep` the ws kernel over block_n x stages x splits x Q in shared
memory ("ws_sweep"). Each row has the bytes floor (K + V + q + out over the copy bandwidth measured
in the same run), the dots' arithmetic (`gflop`: 4 * queries * Hq * kv * D), TFLOP/s, and the
relative error against the pure-torch contract. Timing as `bench_kernels.py`: CUDA-graph replays over enough buffer sets to
miss the L2, median. Writes benchmarks/results/attention_ws_<date>.json and .csv.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import AttentionInputs, copy_bandwidth, time_calls, write_rows  # noqa: E402

from swiftspec.files import run_metadata  # noqa: E402
from swiftspec.kernels import tree_attention_ws as ws  # noqa: E402
from swiftspec.kernels.tree_attention import choose_config, tree_attention  # noqa: E402
from swiftspec.runtime.attention import tree_attention_ref  # noqa: E402

SHAPES = ("16384:64:32/8,4096:64:32/8,1024:64:32/8,16384:128:32/8,16384:16:32/8,1024:128:32/8,"
          "16384:64:8/1,4096:128:8/1,16384:128:8/1,1024:64:8/1")
SWEEP = ([(64, 4, sp, False) for sp in (6, 8, 12)] + [(128, 3, sp, True) for sp in (4, 6, 8, 12, 16)]
         + [(128, 2, 8, True)])


def parse_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """'kv:queries:hq/hkv,...' -> [(kv, queries, hq, hkv)]; ValueError with the bad item."""
    out = []
    for item in text.split(","):
        try:
            kv, t, heads = item.split(":")
            hq, hkv = heads.split("/")
            out.append((int(kv), int(t), int(hq), int(hkv)))
        except ValueError:
            raise ValueError(f"bad shape {item!r}: want kv:queries:hq/hkv, e.g. 16384:64:32/8") from None
    return out


def kernel_rows(base: dict, call, reps: int = 20) -> list[dict]:
    """Median device µs of each kernel one `call` launches (torch.profiler), impl "ws_kernel:<name>"."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            call()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per.setdefault(e.name, []).append(e.device_time)
    return [{**base, "impl": f"ws_kernel:{name}", "us": statistics.median(v)} for name, v in per.items()]


def bench_shape(kv, t, hq, hkv, bw, gen, sweep: bool) -> list[dict]:
    d, dtype, device = 128, torch.bfloat16, "cuda"
    a = AttentionInputs.make(kv, t, hq, hkv, d, dtype, device, gen)
    ref = tree_attention_ref(a.q[0], a.k[0], a.v[0], a.prefix, a.mask, a.scale).double()
    floor_us = a.set_bytes / bw * 1e6
    # QK^T and PV over every live key: 4 * rows * keys * D per KV head (masked tree keys included)
    gflop = 4 * t * hq * kv * d / 1e9
    base = {"kv": kv, "queries": t, "heads": f"{hq}/{hkv}", "head_dim": d, "floor_us": floor_us, "gflop": gflop,
            "buffer_sets": a.n_sets}
    rows = []

    def measure(impl, fn, **cfg):
        out = torch.full_like(a.q[0], float("nan"))
        fn(0, out)
        err = float((out.double() - ref).norm() / ref.norm())
        us = time_calls([lambda i=i: fn(i, a.outs[i]) for i in range(a.n_sets)], device)
        rows.append({**base, "impl": impl, **cfg, "us": us, "tflops": gflop / us * 1e3, "rel_err": err,
                     "x_floor": us / floor_us})

    cfg = choose_config(t, hq, hkv, d, kv, 2, torch.cuda.get_device_properties(0).multi_processor_count)
    for impl, pdl in (("triton", False), ("triton_pdl", "late")):
        measure(impl, lambda i, o, pdl=pdl: tree_attention(a.q[i], a.k[i], a.v[i], a.pl, a.mask, a.scale,
                                                           packed_mask=a.packed, out=o, pdl=pdl),
                num_splits=cfg.num_splits, block_n=cfg.block_n, stages=cfg.num_stages, pdl=bool(pdl))
    rows_total = t * (hq // hkv)
    splits = ws.default_splits(rows_total, hkv, kv, 64, torch.cuda.get_device_properties(0).multi_processor_count)
    for impl, qs, pdl in (("ws", False, False), ("ws_pdl", False, True), ("ws_qsmem", True, False)):
        measure(impl, lambda i, o, qs=qs, pdl=pdl: ws.tree_attention_ws(
            a.q[i], a.k[i], a.v[i], a.pl, a.mask, a.scale, packed_mask=a.packed, out=o, pdl=pdl,
            launch=ws.WsLaunch(q_smem=qs)),
            num_splits=splits, block_n=64, stages=4, q_smem=qs, pdl=pdl)
    rows += kernel_rows(base, lambda: ws.tree_attention_ws(a.q[0], a.k[0], a.v[0], a.pl, a.mask, a.scale,
                                                           packed_mask=a.packed, out=a.outs[0]))
    for bn, st, sp, qs in SWEEP if sweep else []:
        measure("ws_sweep", lambda i, o, bn=bn, st=st, sp=sp, qs=qs: ws.tree_attention_ws(
            a.q[i], a.k[i], a.v[i], a.pl, a.mask, a.scale, packed_mask=a.packed, out=o,
            launch=ws.WsLaunch(num_splits=sp, block_n=bn, num_stages=st, q_smem=qs)), num_splits=sp, block_n=bn, stages=st, q_smem=qs, pdl=False)
        if bn == 128 and st == 3 and sp == 8 and qs:  # the candidate tile: its kernels too
            rows += kernel_rows({**base, "block_n": 128}, lambda: ws.tree_attention_ws(
                a.q[0], a.k[0], a.v[0], a.pl, a.mask, a.scale, packed_mask=a.packed, out=a.outs[0],
                launch=ws.WsLaunch(num_splits=8, block_n=128, num_stages=3, q_smem=True)))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=SHAPES, help=f"kv:queries:hq/hkv, comma-separated (default: {SHAPES})")
    ap.add_argument("--sweep", action="store_true", help="also the ws kernel over block_n x stages x splits x q_smem")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="result folder")
    args = ap.parse_args(argv)
    try:
        shapes = parse_shapes(args.shapes)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: no GPU: this benchmark needs a Hopper GPU (the kernel has no CPU interpreter)", file=sys.stderr)
        return 2
    why = ws.check_ws(torch.empty(1, 8, 128, device="cuda", dtype=torch.bfloat16),
                      *[torch.empty(1, 8, 128, device="cuda", dtype=torch.bfloat16)] * 2)
    if why:
        print(f"error: the ws kernel cannot run here: {why}", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    bw = copy_bandwidth("cuda")
    print(f"device-to-device copy: {bw / 1e12:.2f} TB/s")
    stem = Path(args.out) / f"attention_ws_{dt.date.today().isoformat()}"
    rows: list[dict] = []
    for kv, t, hq, hkv in shapes:
        rows += bench_shape(kv, t, hq, hkv, bw, gen, args.sweep)
        torch.cuda.empty_cache()
        df = pd.DataFrame(rows)  # rewritten after every shape: a run cut short keeps what it measured
        write_rows(stem, df, {**run_metadata("cuda"), "copy_bandwidth_Bps": bw, "elapsed_s": time.perf_counter() - t0,
                              "weights": "random inputs"})
        r = df[(df.kv == kv) & (df.queries == t) & (df.heads == f"{hq}/{hkv}")]
        best = r.loc[r[r.impl.str.startswith("ws") & ~r.impl.str.startswith("ws_kernel")].us.idxmin()]
        us = dict(zip(r.impl, r.us))  # the sweep's rows last: the named ones keep their own
        kernels = ", ".join(f"{n.split(':')[1][:24]} {v:.1f}" for n, v in us.items() if n.startswith("ws_kernel"))
        print(f"{hq}/{hkv} kv {kv} q {t}: triton {us['triton']:.1f} µs (pdl {us['triton_pdl']:.1f}), ws {us['ws']:.1f} "
              f"(pdl {us['ws_pdl']:.1f}, Q in smem {us['ws_qsmem']:.1f}; "
              f"kernels: {kernels}), best ws {best.us:.1f} (stages {best.stages}, "
              f"splits {best.num_splits}, q_smem {best.q_smem}, pdl {best.pdl}), floor {r.floor_us.iloc[0]:.1f}; max err {r.rel_err.max():.1e}", flush=True)
    print(f"wrote {stem}.json and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
