"""Tree attention followed by the o-projection GEMV, with and without an L2 prefetch of the
GEMV weight inside the attention launch (32 layers of distinct weights in one CUDA graph, µs per
layer, median of 30 replays). Args: q heads, kv heads, head dim, kv length.

    python benchmarks/bench_l2_prefetch.py 32 8 128 1024
"""
import statistics
import sys

import torch

from swiftspec.kernels.gemv import gemv
from swiftspec.kernels.tree_attention import pack_tree_mask, tree_attention

dev = "cuda"; torch.manual_seed(0)
L = 32
hq, hkv, d, kv = (int(a) for a in sys.argv[1:5]) if len(sys.argv) > 4 else (32, 8, 128, 1024)
N, K = 4096 if hq == 32 else 8192, hq * d
ws = [torch.randn(N, K, device=dev, dtype=torch.bfloat16) for _ in range(L)]
ks = [torch.randn(hkv, kv + 64, d, device=dev, dtype=torch.bfloat16) for _ in range(L)]
vs = [torch.randn(hkv, kv + 64, d, device=dev, dtype=torch.bfloat16) for _ in range(L)]
q = torch.randn(1, hq, d, device=dev, dtype=torch.bfloat16)
mask = torch.ones(1, 1, dtype=torch.bool, device=dev); packed = pack_tree_mask(mask)
pl = torch.tensor(kv, device=dev, dtype=torch.int32)
x = torch.randn(1, K, device=dev, dtype=torch.bfloat16)
out = torch.empty_like(q)
def att(i, pf=None, f=1.0, at="start", bulk=True):
    kind = ("bulk" if bulk else "line") + "-" + at
    return tree_attention(q, ks[i], vs[i], pl, mask, d**-0.5, packed_mask=packed, out=out, prefetch=pf, prefetch_fraction=f, prefetch_kind=kind)
variants = {
 "gemv_cold": lambda: [gemv(x, ws[i], kind="dot") for i in range(L)],
 "gemv_warm(same w)": lambda: [gemv(x, ws[0], kind="dot") for i in range(L)],
 "attn": lambda: [att(i) for i in range(L)],
 "attn+pf": lambda: [att(i, ws[i]) for i in range(L)],
 "attn->gemv": lambda: [gemv(att(i).view(1, K), ws[i], kind="dot") for i in range(L)],
 "attn+pf->gemv": lambda: [gemv(att(i, ws[i]).view(1, K), ws[i], kind="dot") for i in range(L)],
 "attn+pf50->gemv": lambda: [gemv(att(i, ws[i], .5).view(1, K), ws[i], kind="dot") for i in range(L)],
 "attn+pfEnd": lambda: [att(i, ws[i], at="end") for i in range(L)],
 "attn+pfEnd->gemv": lambda: [gemv(att(i, ws[i], at="end").view(1, K), ws[i], kind="dot") for i in range(L)],
 "attn+pfEnd50->gemv": lambda: [gemv(att(i, ws[i], .5, at="end").view(1, K), ws[i], kind="dot") for i in range(L)],
 "attn+line": lambda: [att(i, ws[i], bulk=False) for i in range(L)],
 "attn+line->gemv": lambda: [gemv(att(i, ws[i], bulk=False).view(1, K), ws[i], kind="dot") for i in range(L)],
 "attn+line50->gemv": lambda: [gemv(att(i, ws[i], .5, bulk=False).view(1, K), ws[i], kind="dot") for i in range(L)],
 "attn+lineEnd": lambda: [att(i, ws[i], at="end", bulk=False) for i in range(L)],
 "attn+lineEnd->gemv": lambda: [gemv(att(i, ws[i], at="end", bulk=False).view(1, K), ws[i], kind="dot") for i in range(L)],
 "attn+pf25->gemv": lambda: [gemv(att(i, ws[i], .25).view(1, K), ws[i], kind="dot") for i in range(L)],
 "gemv(w)->gemv(w)": lambda: [(gemv(x, ws[i], kind="dot"), gemv(x, ws[i], kind="dot")) for i in range(L)],
}
graphs = {}
for name, fn in variants.items():
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    graphs[name] = g
times = {n: [] for n in graphs}
for _r in range(30):
    for n, g in graphs.items():
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); g.replay(); e.record(); e.synchronize()
        times[n].append(s.elapsed_time(e) * 1e3 / L)
print(f"heads {hq}/{hkv} kv {kv} wo {N}x{K} ({N*K*2/1e6:.1f} MB); us per layer (median of 30)")
for n, t in times.items():
    print(f"  {n:22s} {statistics.median(t):7.2f}")
