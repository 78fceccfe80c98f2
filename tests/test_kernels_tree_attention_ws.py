"""The warp-specialized Gluon tree attention (`swiftspec.kernels.tree_attention_ws`).

Gluon has no CPU interpreter, so on CPU the kernel is compiled for sm_90 with Triton's bundled
ptxas (it must build and fit the shared memory) and the wrapper's refusals are checked; on a Hopper
GPU (marked gpu) its output is compared with the pure-torch contract on random inputs, output
poisoned with NaN first, over prefix lengths that are not block multiples, tree and draft masks,
both GQA groups and every split count / block / stage setting the benchmark uses.
"""

from __future__ import annotations

import dataclasses
import os
import zlib

import pytest
import torch

from swiftspec.kernels import compile_check
from swiftspec.kernels import tree_attention_ws as ws
from swiftspec.kernels.tree_attention import ancestor_mask
from swiftspec.runtime.attention import tree_attention_ref
from swiftspec.runtime.kernel_config import KernelConfig

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(bool(ws.GLUON_ERROR) or not compile_check.available(),
                    reason="needs Triton's Gluon and its bundled ptxas")
@pytest.mark.parametrize("block_n,stages,head_dim,group,q_smem,pdl", [
    (64, 4, 128, 4, False, False), (64, 4, 128, 8, True, True), (64, 2, 64, 1, False, False),
    (64, 3, 128, 4, True, False), (128, 3, 128, 4, True, False)])  # fmt: skip
def test_compiles_for_sm90_and_fits(block_n, stages, head_dim, group, q_smem, pdl):
    """The benchmark's tiles build for the H200 (on this machine's Triton, 3.6 or 3.9) as a launch
    would, and fit its shared memory: K and V rings (2 * stages * block_n * D * 2 bytes), Q when in
    shared memory, plus layout-conversion scratch. The PTX has the partitions' register
    reallocation, wgmma, TMA copies, and griddepcontrol exactly when pdl."""
    (r,) = compile_check.ws_attention_reports([(block_n, stages, head_dim, group, q_smem, pdl)])
    ring = 2 * stages * block_n * head_dim * 2 + (2 * 64 * head_dim * 2 if q_smem else 0)
    assert r.report.fits and ring <= r.report.shared_bytes < ring + 32 * 1024, r
    assert r.setmaxnreg and r.wgmma and r.tma and r.griddepcontrol == pdl, r


def test_refuses_what_it_cannot_run():
    """CPU tensors, float32, or a group that does not divide 64: one clear ValueError."""
    q = torch.randn(4, 8, 128)
    k = torch.randn(1, 64, 128)
    why = ws.check_ws(q, k, k)
    assert why
    with pytest.raises(ValueError, match="tree_attention_ws: "):
        ws.tree_attention_ws(q, k, k, 32, torch.ones(4, 4, dtype=torch.bool), 0.1)
    if not ws.GLUON_ERROR:
        assert "CUDA" in why
    mask = torch.ones(4, 4, dtype=torch.bool)
    for kw in ({"block_n": 32}, {"num_stages": 5}, {"num_stages": 1}):
        with pytest.raises(ValueError, match="block_n must be 64 or 128"):  # the tile is checked first
            ws.tree_attention_ws(q, k, k, 32, mask, 0.1, launch=ws.WsLaunch(**kw))


def test_default_splits_fill_the_sms_once():
    # 32/8 heads, 64 queries: 256 rows per KV head -> 2 row tiles x 8 heads = 16 programs per split
    assert ws.default_splits(256, 8, 16384, 64, 132) == 8
    # short KV: at most one split per key block
    assert ws.default_splits(256, 8, 256, 64, 132) == 4
    assert ws.default_splits(1024, 8, 16384, 64, 132) == 2  # 64 programs per split
    assert ws.default_splits(2048, 8, 16384, 64, 132) == 1


def _case(kv, t, hq, hkv, d, kind, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(t, hq, d, generator=g).to("cuda", torch.bfloat16)
    # max_len past the live keys; the slots past them hold large finite values, which the mask must drop
    k = (torch.randn(hkv, kv + 64, d, generator=g) * 30).to("cuda", torch.bfloat16)
    v = (torch.randn(hkv, kv + 64, d, generator=g) * 1000).to("cuda", torch.bfloat16)
    k[:, :kv] /= 30
    v[:, :kv] /= 1000
    if kind == "verify":
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, t)])
        mask = ancestor_mask(parents).to("cuda")
    else:  # draft: the last t nodes of a wider tree, a non-square mask
        n = t + 9
        parents = torch.tensor([-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)])
        mask = ancestor_mask(parents)[n - t:].to("cuda")
    return q, k, v, kv - mask.shape[1], mask


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER or bool(ws.GLUON_ERROR), reason="needs an sm_90 GPU and Gluon")
@pytest.mark.parametrize("kv,t,hq,hkv,kind", [(1000, 64, 32, 8, "verify"), (4133, 16, 32, 8, "draft"),
                                              (16384, 64, 32, 8, "verify"), (3000, 64, 8, 1, "verify"),
                                              (777, 128, 8, 1, "draft"), (16384, 8, 8, 1, "verify")])
@pytest.mark.parametrize("block_n,stages,splits,d,q_smem", [(64, 4, None, 128, False), (64, 2, None, 128, False),
                                                        (64, 4, 3, 128, False), (64, 3, 1, 128, False),
                                                        (64, 3, 5, 64, False), (64, 4, None, 128, True),
                                                        (64, 4, 2, 64, True), (128, 3, None, 128, True),
                                                        (128, 3, 2, 64, False)])
def test_gpu_equals_reference(kv, t, hq, hkv, kind, block_n, stages, splits, d, q_smem):
    q, k, v, prefix, mask = _case(kv, t, hq, hkv, d, kind, zlib.crc32(f"{kv}/{t}/{hq}/{kind}".encode()))
    ref = tree_attention_ref(q, k, v, prefix, mask, d**-0.5).float()
    out = torch.full_like(q, float("nan"))
    pl = torch.tensor(prefix, dtype=torch.int32, device="cuda")
    ws.tree_attention_ws(q, k, v, pl, mask, d**-0.5, out=out,
                         launch=ws.WsLaunch(num_splits=splits, num_stages=stages, q_smem=q_smem, block_n=block_n))
    err = float((out.float() - ref).norm() / ref.norm())
    assert not out.isnan().any() and err < 2e-2, err


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER or bool(ws.GLUON_ERROR), reason="needs an sm_90 GPU and Gluon")
@pytest.mark.parametrize("pdl", [False, True])
def test_gpu_graph_replay_reads_the_live_prefix(pdl):
    """Captured once, replayed with a different device prefix length: the result follows it (with
    PDL too: the launches then overlap, and each must still wait for its inputs)."""
    q, k, v, prefix, mask = _case(4096, 64, 32, 8, 128, "verify", 5)
    pl = torch.tensor(prefix, dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    ws.tree_attention_ws(q, k, v, pl, mask, 0.088, out=out, pdl=pdl)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ws.tree_attention_ws(q, k, v, pl, mask, 0.088, out=out, pdl=pdl)
    for p in (prefix, 1500, 3):
        pl.fill_(p)
        graph.replay()
        ref = tree_attention_ref(q, k, v, p, mask, 0.088).float()
        assert float((out.float() - ref).norm() / ref.norm()) < 2e-2, p


@pytest.mark.gpu
@pytest.mark.skipif(not HOPPER or bool(ws.GLUON_ERROR), reason="needs an sm_90 GPU and Gluon")
def test_gpu_model_takes_the_ws_kernel_from_ws_rows():
    """`KernelConfig.attention_ws_rows` 256 on two Llama-3-8B-shaped layers (random weights):
    the prefill (700 tokens) and a 64-node verify (256 rows per KV head) go through the Gluon
    kernel, once per layer each, and the verify's logits match the Triton kernel's (bf16)."""
    from swiftspec.runtime.kv_cache import KVCache
    from swiftspec.runtime.weights import load_model

    def model_with(ws_rows):
        kernels = dataclasses.replace(KernelConfig.resolve("cuda"), attention_ws_rows=ws_rows, attention_ws_min_tokens=0)
        return load_model("Llama-3-8B", weights="random", num_layers=2, device="cuda", dtype=torch.bfloat16,
                          kernels=kernels)

    model = model_with(0)
    g = torch.Generator().manual_seed(3)
    prefix, n = 700, 64
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    mask = ancestor_mask(torch.tensor(parents)).cuda()
    prompt = torch.randint(0, model.spec.vocab, (prefix,), generator=g).cuda()
    toks = torch.randint(0, model.spec.vocab, (n,), generator=g).cuda()
    ar = torch.arange(prefix, device="cuda")
    causal = torch.ones(prefix, prefix, dtype=torch.bool, device="cuda").tril()
    logits = {}
    for ws_rows in (0, 256):
        model = model_with(ws_rows)  # same seed: the same weights
        calls = []
        if ws_rows:
            kernel = model._ws_kernel
            model._ws_kernel = lambda *a, calls=calls, kernel=kernel, **k: calls.append(1) or kernel(*a, **k)
        cache = KVCache(model.spec, model.shard, 1024, "cuda", torch.bfloat16)
        model(prompt, ar, cache, ar, 0, causal)
        logits[ws_rows] = model(toks, prefix + torch.tensor(depth, device="cuda"), cache,
                                prefix + torch.arange(n, device="cuda"), prefix, mask)
        assert len(calls) == (4 if ws_rows else 0)
    a, b = logits[256], logits[0]
    assert float((a - b).norm() / b.norm()) < 2e-2
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() >= 0.9


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or bool(ws.GLUON_ERROR),
                    reason="the Triton attention on CPU needs TRITON_INTERPRET=1; ws_rows needs Gluon")
def test_model_falls_back_where_the_ws_kernel_cannot_run(make_checkpoint):
    """On CPU (float32, head dim 16) `check_ws` refuses, so a model with ws_rows keeps the Triton
    kernel: the same logits, bit for bit, as without it."""
    from swiftspec.runtime.kv_cache import KVCache
    from swiftspec.runtime.weights import load_model

    path = make_checkpoint("llama")
    prompt = torch.tensor([3, 14, 15, 92, 65, 35])
    ar = torch.arange(6)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    out = []
    for ws_rows in (0, 1):
        model = load_model(path, kernels=KernelConfig(attention="triton", attention_ws_rows=ws_rows))
        cache = KVCache(model.spec, model.shard, 16, "cpu", torch.float32)
        out.append(model(prompt, ar, cache, ar, 0, causal))
    assert torch.equal(out[0], out[1])


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") in ("", "0") or bool(ws.GLUON_ERROR),
                    reason="the Triton attention on CPU needs TRITON_INTERPRET=1; ws_rows needs Gluon")
def test_model_gates_the_ws_kernel_by_rows_and_tokens(make_checkpoint):
    """`attention_ws_rows` and `attention_ws_min_tokens` both gate the Gluon kernel: with its refusal and the kernel
    replaced by a recorder (which runs the Triton kernel, so the logits are unchanged), a forward
    takes it only with at least ws_min_tokens tokens and ws_rows rows (tokens x group) per KV head,
    once per layer."""
    from swiftspec.kernels.tree_attention import tree_attention
    from swiftspec.runtime.kv_cache import KVCache
    from swiftspec.runtime.weights import load_model

    path = make_checkpoint("llama")
    model = load_model(path, kernels=KernelConfig(attention="triton"))
    group = model.shard.q_heads // model.shard.kv_heads
    layers = model.spec.num_layers
    prompt = torch.tensor([3, 14, 15, 92, 65, 35])
    for ws_rows, min_tokens, want in ((1, 4, {6: layers, 2: 0}), (3 * group, 0, {6: layers, 2: 0}),
                                      (1, 0, {6: layers, 2: layers}), (7 * group, 0, {6: 0, 2: 0})):
        model = load_model(path, kernels=KernelConfig(attention="triton", attention_ws_rows=ws_rows,
                                                      attention_ws_min_tokens=min_tokens))
        calls = []
        model._ws_check = lambda *a: ""
        model._ws_kernel = lambda q, *a, calls=calls, pdl=False, **k: calls.append(q.shape[0]) or tree_attention(
            q, *a, **k)
        cache = KVCache(model.spec, model.shard, 16, "cpu", torch.float32)
        got = {}
        for n, start in ((6, 0), (2, 6)):
            before = len(calls)
            toks, pos = prompt[:n], start + torch.arange(n)
            model(toks, pos, cache, pos, start, torch.ones(n, n, dtype=torch.bool).tril())
            got[n] = len(calls) - before
        assert got == want, (ws_rows, min_tokens, got)
