"""Llama / Qwen2 decoder for one tensor-parallel rank, with tree attention over a static KV cache.

One `Transformer` holds the weights of one TP rank (see `weights.load_model`):

    embed      (vocab, hidden)                         replicated
    per layer  wqkv (q_local*hd + 2*kv_local*hd, hidden) [+ bqkv for Qwen2]   column-parallel, fused
               wo   (hidden, q_local*hd)               row-parallel  -> all-reduce
               w13  (2*ffn_local, hidden)              column-parallel gate|up, fused
               w2   (hidden, ffn_local)                row-parallel  -> all-reduce
    lm_head    (vocab_local, hidden)                   vocab-parallel -> all-gather of logits

weight_format "fp8": wqkv, wo, w13, w2 and lm_head are float8 e4m3 with a float32 scale per row
(`{name}_scale`), and the LM head is its own copy even when tied.

Head counts, ffn and vocab are zero-padded per `ModelSpec.shard(tp)`: padded query heads have zero
rows in wqkv and zero columns in wo, so they add nothing; padded KV heads only serve padded query
heads. Numerics follow Hugging Face (RMSNorm in float32 then cast, RoPE cos/sin in float32 cast
to the model dtype) so float32 logits match transformers to ~1e-6.

`forward` takes everything as tensors (positions, slots, prefix_len, tree_mask) so the same call
can be captured in a CUDA graph (`graphs.GraphRunner`).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from swiftspec.runtime.attention import tree_attention_ref
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.spec import ModelSpec, Shard, UserError

ATTENTION_IMPLS = ("torch", "ref", "triton")
ATTENTION_COMBINE = "separate"  # tree attention's default split merge (benchmarks/KERNELS.md, 2026-12-03)
FUSION_MODES = ("off", "compile", "triton")
FP8 = torch.float8_e4m3fn  # weight-only fp8 GEMM weights (kernels.gemv)
LINEAR_IMPLS = ("torch", "triton")


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse RoPE frequencies, shape (head_dim/2,) float32, with default/linear/llama3 scaling.

    Written to reproduce transformers' `modeling_rope_utils` bit for bit.
    """
    dim = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = spec.rope_scaling or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_len = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
        smooth = (old_len / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old_len / hi) * ~(wavelen > old_len / lo)
        return torch.where(medium, smoothed, scaled)
    raise UserError(f"{spec.name}: RoPE scaling {kind!r} is not supported (supported: default, linear, llama3)")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as Hugging Face computes it: statistics in float32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (T, H, D); cos, sin: (T, D). Rotate-half convention (HF Llama)."""
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rot * sin.unsqueeze(1)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """(T, 2F) fused gate|up projection -> silu(gate) * up, (T, F)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def attention_mask(prefix_len: torch.Tensor, tree_mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """(T, max_len) bool: query t may see slot s. Same rule as `tree_attention_ref` (tensors only)."""
    n = tree_mask.shape[1]
    slot = torch.arange(max_len, device=tree_mask.device)
    tree_idx = slot - prefix_len
    in_tree = (tree_idx >= 0) & (tree_idx < n)
    gathered = tree_mask[:, tree_idx.clamp(0, max(n - 1, 0))]
    return (slot < prefix_len).unsqueeze(0) | (in_tree.unsqueeze(0) & gathered)


def sdpa_tree_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Tree attention through `scaled_dot_product_attention`, mask built once per forward.

    q (T, Hq, D), k_cache/v_cache (Hkv, S, D), allowed (T, S) bool -> (T, Hq, D).
    GQA without copying KV: the g query heads of one KV head are folded into the query axis, so
    each KV head is read once (batch-1 decode is bandwidth-bound).
    """
    t, hq, d = q.shape
    hkv = k_cache.shape[0]
    g = hq // hkv
    qf = q.view(t, hkv, g, d).permute(1, 2, 0, 3).reshape(1, hkv, g * t, d)
    mask = allowed.repeat(g, 1).view(1, 1, g * t, -1)
    out = F.scaled_dot_product_attention(qf, k_cache.unsqueeze(0), v_cache.unsqueeze(0), attn_mask=mask, scale=scale)
    return out.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hq, d)


def check_fold_norm(weight_format: str, linear: str | None = None) -> None:
    """Refuse a norm fold the model cannot run: folding fp8 weights would re-quantize them, and the
    norm runs inside the skinny linear (linear None: the weights are folded, nothing runs yet)."""
    if linear is not None and linear != "triton":
        raise UserError("fold_norm needs linear 'triton' (the skinny linear applies the norm)")
    if weight_format != "native":
        raise UserError("fold_norm needs native weights, not fp8 (folding would re-quantize them)")


class Layer(nn.Module):
    """One decoder layer's local weights (shapes in the module docstring)."""

    def __init__(self, spec: ModelSpec, shard: Shard, device, dtype, weight_format: str = "native"):
        super().__init__()
        hd, h = spec.head_dim, spec.hidden
        qkv_rows = (shard.q_heads + 2 * shard.kv_heads) * hd

        def p(*shape, dt=dtype):
            return nn.Parameter(torch.zeros(*shape, device=device, dtype=dt), requires_grad=False)

        gemm = FP8 if weight_format == "fp8" else dtype
        self.attn_norm, self.mlp_norm = p(h), p(h)
        self.wqkv = p(qkv_rows, h, dt=gemm)
        self.bqkv = p(qkv_rows) if spec.qkv_bias else None
        self.wo = p(h, shard.q_heads * hd, dt=gemm)
        self.w13 = p(2 * shard.ffn, h, dt=gemm)
        self.w2 = p(h, shard.ffn, dt=gemm)
        # fp8: one float32 scale per weight row (`Transformer.set_gemm_weight`); None: model dtype
        self.wqkv_scale = self.wo_scale = self.w13_scale = self.w2_scale = None


class Transformer(nn.Module):
    """Llama / Qwen2 decoder for one TP rank (see the module docstring for the weight layout).

    Build it with `weights.load_model`; `Transformer(spec, ...)` alone holds zero weights.
    """

    def __init__(
        self,
        spec: ModelSpec,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        group: dist.ProcessGroup | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        attention: str = "torch",
        weight_format: str = "native",
    ):
        super().__init__()
        if spec.architecture not in ("llama", "qwen2"):
            raise UserError(f"architecture {spec.architecture!r} is not supported (supported: llama, qwen2)")
        self.spec, self.tp_rank, self.tp_size, self.group = spec, tp_rank, tp_size, group
        self.shard = spec.shard(tp_size)
        self.device, self.dtype = torch.device(device), dtype
        z = dict(device=device, dtype=dtype)
        self.embed = nn.Parameter(torch.zeros(spec.vocab, spec.hidden, **z), requires_grad=False)
        # "fp8": the GEMM weights (qkv, o, gate/up, down, LM head) in float8 e4m3 with a scale per
        # row, quantized as they are filled (`set_gemm_weight`), so the model-dtype copy never exists
        self.weight_format = weight_format
        self._dequantized: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # CPU fp8 only: see `_lin`
        self.layers = nn.ModuleList(Layer(spec, self.shard, device, dtype, weight_format) for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.zeros(spec.hidden, **z), requires_grad=False)
        if spec.tie_embeddings and tp_size == 1 and weight_format != "fp8":
            self.lm_head = self.embed  # shared storage, as in HF (fp8: the LM head is its own copy)
        else:
            head_dtype = FP8 if weight_format == "fp8" else dtype
            self.lm_head = nn.Parameter(torch.zeros(self.shard.vocab, spec.hidden, device=device, dtype=head_dtype),
                                        requires_grad=False)  # fmt: skip
        self.lm_head_scale: torch.Tensor | None = None
        self.register_buffer("inv_freq", rope_inv_freq(spec).to(device), persistent=False)
        self.scale = spec.head_dim**-0.5
        self.set_attention(attention)
        self.set_fusion("off")  # load_model picks the device default ("triton" on CUDA)
        self._norms_folded = False  # `fold_norms`
        self.set_linear("torch")
        self.set_pdl(False)

    def set_linear(self, impl: str, max_rows: int | None = None, fold_norm: bool = False,
                   swiglu: bool = False, rope: bool = False) -> None:
        """How the GEMMs run: "torch" = `F.linear` (cuBLAS on CUDA); "triton" = the skinny-linear
        kernel `swiftspec.kernels.gemv` for forwards of at most `max_rows` tokens (a pure weight
        stream; default `gemv.MAX_ROWS`, 16, the rows it was measured at; up to `gemv.MAX_ROWS_DOT`
        for A/B runs), `F.linear` above that. fp8 weights take it for every forward up to
        `gemv.MAX_ROWS_FP8`. The choice is per forward shape, so a captured graph holds one.
        fold_norm (linear "triton", fusion "triton", native weights; `load_model` turns it on
        there at TP 1 by default, `weights.resolve_fold_norm`): where the skinny linear runs, the
        residual add + RMSNorm before the qkv, gate/up and LM-head GEMMs happens inside that
        GEMM's launch (`gemv(rms_eps=...)`), one launch fewer each. It first folds every RMSNorm
        weight into the GEMM after it (`fold_norms`), for good.
        swiglu (linear "triton", fusion "triton"): where the skinny linear runs the gate/up GEMM,
        silu(gate) * up happens in its epilogue (`gemv(act="swiglu")`), one launch fewer per layer.
        rope (linear "triton", fusion "triton"; `load_model` turns it on there, `weights.resolve_rope`): likewise
        RoPE + the KV-cache write in the qkv GEMM's epilogue (`gemv(rope=...)`) instead of `rope_kv`'s
        launch (H200, paired, on top of swiglu: Llama-3.2-1B steps 1.2-2.5 % faster, Llama-3-8B 0.3-0.8 %)."""
        if impl not in LINEAR_IMPLS:
            raise UserError(f"linear must be one of {', '.join(LINEAR_IMPLS)}, got {impl!r}")
        if fold_norm:
            check_fold_norm(self.weight_format, impl)
        self._gemv, self._gemv_rows, self._gemv_fp8_rows = None, 0, 0
        if impl == "triton":
            try:
                from swiftspec.kernels.gemv import MAX_ROWS, MAX_ROWS_DOT, MAX_ROWS_FP8, gemv
            except ImportError as e:
                raise UserError(f"the triton linear is not available ({e}); use linear 'torch'") from None
            rows = MAX_ROWS if max_rows is None else max_rows
            if not 1 <= rows <= MAX_ROWS_DOT:
                raise UserError(f"max_rows must be in 1..{MAX_ROWS_DOT}, got {rows}")
            self._gemv, self._gemv_rows, self._gemv_fp8_rows = gemv, rows, MAX_ROWS_FP8
            if fold_norm:
                self.fold_norms()
        self.linear, self.fold_norm = impl, bool(fold_norm)
        self.swiglu, self.rope = bool(swiglu) and impl == "triton", bool(rope) and impl == "triton"

    def fold_norms(self) -> None:
        """Fold each RMSNorm's weight into the GEMM that consumes its output (W · diag(g): attn_norm
        into wqkv, mlp_norm into w13, the final norm into the LM head) and set the norm weights to
        ones: the same model up to one rounding per weight, whose norms can then run inside the GEMM
        (`gemv(rms_eps=...)`). Idempotent; call after the weights are loaded. A tied LM head gets
        its own copy (vocab × hidden more memory). Native weights only (fp8 weights are quantized)."""
        if self._norms_folded:
            return
        check_fold_norm(self.weight_format)
        from swiftspec.kernels.gemv import fold_norm_weight

        for layer in self.layers:
            for w, g in ((layer.wqkv, layer.attn_norm), (layer.w13, layer.mlp_norm)):
                w.copy_(fold_norm_weight(w, g))
                g.fill_(1.0)
        if self.lm_head is self.embed:
            self.lm_head = nn.Parameter(self.embed.detach().clone(), requires_grad=False)
        self.lm_head.copy_(fold_norm_weight(self.lm_head, self.norm))
        self.norm.fill_(1.0)
        self._norms_folded = True

    def set_gemm_weight(self, owner: nn.Module, name: str, w: torch.Tensor) -> None:
        """Write GEMM weight `name` of `owner` (a Layer, or the model for "lm_head") from `w` (N, K);
        with fp8 weights quantized per row (`kernels.gemv.quantize_fp8`), its scale kept beside it
        as `{name}_scale`. Outputs then change by the quantization: a different model.

        The row-parallel weights (wo, w2) hold a slice of every row on each rank: their per-row
        amax is the max over the TP group (one all-reduce per weight while loading), so each
        rank's scales are the unsharded model's and the fp8 model is the same at every TP size.
        Without a group (the profiler's lone rank 0, communication skipped) the slice's own amax."""
        if self.weight_format != "fp8":
            getattr(owner, name).copy_(w)
            return
        from swiftspec.kernels.gemv import quantize_fp8

        amax = None
        if name in ("wo", "w2") and self.tp_size > 1 and self.group is not None:
            amax = w.float().abs().amax(dim=1)
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
        w8, scale = quantize_fp8(w, amax)
        self._dequantized.clear()  # a weight changed: the CPU path's dequantized copies are stale
        getattr(owner, name).copy_(w8)
        setattr(owner, f"{name}_scale", scale)

    def _lin(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
             scale: torch.Tensor | None = None, act: str | None = None, rope=None) -> torch.Tensor:
        """x (T, K) @ w (N, K).T + b -> (T, N) by the chosen impl (`set_linear`); `scale` (N,):
        w is fp8 (`set_gemm_weight`): the fp8 skinny linear with linear "triton", else the
        dequantized weight w * scale (the reference path): per call on a GPU, where a second copy
        would undo the bytes fp8 saves; kept after the first call on the CPU, where the per-call
        e4m3 conversion made real-model runs 4.5x slower than native (profile acceptance,
        SmolLM2-135M) and host memory is cheap. act, rope: `gemv`'s epilogues, only where the
        skinny linear runs (`_gemv_runs`)."""
        if scale is not None:
            if self._gemv_runs(x.shape[0], scale):
                return self._gemv(x.contiguous(), w, b, scale=scale, kind="dot", pdl=self.pdl, act=act, rope=rope)
            if w.device.type != "cpu":
                return F.linear(x, w.to(x.dtype) * scale[:, None].to(x.dtype), b)
            key = (w.data_ptr(), x.dtype)
            if key not in self._dequantized:
                self._dequantized[key] = w.to(x.dtype) * scale[:, None].to(x.dtype)
            return F.linear(x, self._dequantized[key], b)
        if self._gemv_runs(x.shape[0], scale):
            # the faster kind at 1-16 rows (bench_gemv)
            return self._gemv(x.contiguous(), w, b, kind="dot", pdl=self.pdl, act=act, rope=rope)
        if act is not None or rope is not None:
            raise ValueError(f"gemv's epilogues need the skinny linear ({x.shape[0]} rows go to F.linear)")
        return F.linear(x, w, b)

    def _gemv_runs(self, rows: int, scale: torch.Tensor | None) -> bool:
        """Whether `_lin` runs a GEMM of `rows` token rows through the skinny linear (fp8 weights:
        `scale` given)."""
        return self._gemv is not None and rows <= (self._gemv_rows if scale is None else self._gemv_fp8_rows)

    def set_pdl(self, on: bool | str) -> None:
        """Launch the Triton kernels (fusion "triton", attention "triton", linear "triton") as
        programmatic dependent launches, so each one's launch and ramp-up overlaps the tail of the
        kernel before it (`swiftspec.kernels.pdl`). on: False / "off", True / "early" (the next
        kernel launches once every program has started; "early-nopeel" the same without the skinny
        linear's peeled first tile) or "late" (once every program's main loop is done). Needs a CUDA GPU of compute capability >= 9."""
        from swiftspec.kernels.pdl import pdl_available, pdl_mode

        try:
            mode = pdl_mode(on)
        except ValueError as e:
            raise UserError(str(e)) from None
        if mode == 0:
            self.pdl = False
            return
        if not pdl_available(self.device):
            raise UserError(f"pdl needs a CUDA GPU of compute capability >= 9.0 (model on {self.device})")
        self.pdl = True if mode == 1 else on

    def set_fusion(self, mode: str | bool) -> None:
        """How the small per-layer ops run (a batch-1 step is launch-bound):

        "off" (or False): plain eager ops, the reference. "compile" (or True): RMSNorm, RoPE and
        silu*up through `torch.compile` (one fused kernel each instead of ~5-8 launches; CUDA).
        "triton": `swiftspec.kernels` — residual add + RMSNorm, RoPE + KV-cache write, silu*up —
        one launch each (4 per layer instead of ~30); runs on CPU under TRITON_INTERPRET=1.
        """
        mode = {False: "off", True: "compile"}.get(mode, mode) if isinstance(mode, bool) else mode
        if mode not in FUSION_MODES:
            raise UserError(f"fusion must be one of {', '.join(FUSION_MODES)}, got {mode!r}")
        self.fusion, self.fused = mode, mode != "off"
        on = mode == "compile"
        # dynamic=None: the first token count is compiled static, the next ones share one kernel
        # with a symbolic length. dynamic=False compiled every graph bucket and prefill length
        # anew and hit dynamo's recompile limit (8), which fullgraph turns into an error.
        fuse = (lambda f: torch.compile(f, dynamic=None, fullgraph=True)) if on else (lambda f: f)
        self._norm, self._rope, self._act = fuse(rms_norm), fuse(apply_rope), fuse(silu_mul)
        self._fused_ops = self._workspace = None
        if mode == "triton":
            try:
                from swiftspec.kernels.rmsnorm import add_rmsnorm
                from swiftspec.kernels.rope_kv import rope_kv
                from swiftspec.kernels.silu_mul import silu_mul as silu_mul_kernel
                from swiftspec.kernels.tree_attention import TreeAttentionWorkspace
            except ImportError as e:
                raise UserError(f"triton fusion is not available ({e}); use fusion 'off'") from None
            self._fused_ops = (add_rmsnorm, rope_kv, silu_mul_kernel)
            # split-KV combine counters shared by every layer: no memset launch per layer
            self._workspace = TreeAttentionWorkspace(self.device)

    def set_attention(self, impl: str, combine: str = ATTENTION_COMBINE, max_block_m: int = 128,
                      tma: bool | None = None, ws_rows: int = 0, ws_min_tokens: int = 0) -> None:
        """"torch": SDPA with the mask built once per forward; "ref": `tree_attention_ref` per layer
        (the contract, slow); "triton": `swiftspec.kernels.tree_attention.tree_attention`, whose
        split-KV partials are merged by `combine` ("separate": a second launch, the default;
        "kernel": inside the attention launch); max_block_m 64 keeps its tiles of before the
        2026-12-03 tile sweep and tma=False its plain K/V loads (benchmarks' A/B runs).
        ws_rows > 0 (with "triton"): forwards of at least ws_rows rows (tokens x group) per KV head
        take the warp-specialized Gluon kernel (`kernels.tree_attention_ws`) where it can run (an
        sm_90 GPU, bf16/fp16; `check_ws`), if they also have at least ws_min_tokens tokens;
        `load_model` sets both (`weights.resolve_attention_ws`: on by default on sm_90 with native
        weights)."""
        if impl not in ATTENTION_IMPLS:
            raise UserError(f"attention must be one of {', '.join(ATTENTION_IMPLS)}, got {impl!r}")
        if combine not in ("separate", "kernel"):
            raise UserError(f"combine must be 'separate' or 'kernel', got {combine!r}")
        self.attn_combine = combine
        self.attn_max_block_m, self.attn_tma = max_block_m, tma
        self._kernel = self._pack = self._ws_kernel = None
        self.attn_ws_rows, self.attn_ws_min_tokens = ws_rows, ws_min_tokens
        if impl == "triton" and ws_rows > 0:
            from swiftspec.kernels.tree_attention_ws import GLUON_ERROR, check_ws, tree_attention_ws

            if GLUON_ERROR:
                raise UserError(f"the warp-specialized attention needs Triton's Gluon ({GLUON_ERROR})")
            self._ws_kernel, self._ws_check = tree_attention_ws, check_ws
        if impl == "triton":
            try:
                from swiftspec.kernels.tree_attention import pack_tree_mask, tree_attention
            except ImportError as e:
                raise UserError(f"triton tree attention is not available ({e}); use attention='torch'") from None
            self._kernel, self._pack = tree_attention, pack_tree_mask
        self.attention = impl

    def _all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def _gather_logits(self, local: torch.Tensor) -> torch.Tensor:
        """(T, vocab_local) on each rank -> (T, vocab) on every rank."""
        if self.tp_size == 1:
            return local[:, : self.spec.vocab]
        t, vl = local.shape
        if local.is_cuda:  # one NCCL call, capturable in a CUDA graph
            out = torch.empty(self.tp_size * t, vl, device=local.device, dtype=local.dtype)
            dist.all_gather_into_tensor(out, local.contiguous(), group=self.group)
            full = out.view(self.tp_size, t, vl).permute(1, 0, 2).reshape(t, self.tp_size * vl)
        else:
            parts = [torch.empty_like(local) for _ in range(self.tp_size)]
            dist.all_gather(parts, local.contiguous(), group=self.group)
            full = torch.cat(parts, dim=1)
        return full[:, : self.spec.vocab]

    @torch.no_grad()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slots: torch.Tensor,
        prefix_len: torch.Tensor | int,
        tree_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Run T new tokens; write their K/V into `slots`; return float32 logits (T, vocab).

        tokens, positions, slots: (T,) int64. positions are RoPE positions (prefix_len + depth for
        tree nodes); slots are cache slots (normally prefix_len + index in the tree region).
        prefix_len: verified slots [0, prefix_len) every token sees. tree_mask: (T, N) bool, token
        t sees tree slot prefix_len + j iff tree_mask[t, j] (see `attention.py`).
        """
        spec, sh = self.spec, self.shard
        hd, t = spec.head_dim, tokens.shape[0]
        if not isinstance(prefix_len, torch.Tensor):
            prefix_len = torch.tensor(prefix_len, device=tokens.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(self.dtype), emb.sin().to(self.dtype)
        # per-step mask work done once, shared by every layer (plan once, run per layer)
        allowed = attention_mask(prefix_len, tree_mask, cache.k.shape[2]) if self.attention == "torch" else None
        packed = self._pack(tree_mask, pdl=self.pdl) if self._pack is not None else None
        nq, nkv = sh.q_heads * hd, sh.kv_heads * hd
        x = self.embed[tokens]
        if self._fused_ops is not None:
            local = self._layers_triton(x, cos, sin, cache, slots, prefix_len, tree_mask, allowed, packed)
            return self._gather_logits(local.float())
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.attn_norm, spec.rms_eps)
            qkv = self._lin(h, layer.wqkv, layer.bqkv, layer.wqkv_scale)
            q = self._rope(qkv[:, :nq].view(t, sh.q_heads, hd), cos, sin)
            k = self._rope(qkv[:, nq : nq + nkv].view(t, sh.kv_heads, hd), cos, sin)
            v = qkv[:, nq + nkv :].view(t, sh.kv_heads, hd)
            kc, vc = cache.k[i], cache.v[i]
            kc[:, slots] = k.transpose(0, 1)
            vc[:, slots] = v.transpose(0, 1)
            a = self._attend(q, kc, vc, prefix_len, tree_mask, allowed, packed)
            x = x + self._all_reduce(self._lin(a.reshape(t, nq), layer.wo, None, layer.wo_scale))
            h = self._norm(x, layer.mlp_norm, spec.rms_eps)
            up = self._act(self._lin(h, layer.w13, None, layer.w13_scale))
            x = x + self._all_reduce(self._lin(up, layer.w2, None, layer.w2_scale))
        x = self._norm(x, self.norm, spec.rms_eps)
        return self._gather_logits(self._lin(x, self.lm_head, None, self.lm_head_scale).float())

    def _attend(self, q, kc, vc, prefix_len, tree_mask, allowed, packed) -> torch.Tensor:
        """One layer's tree attention by the chosen impl: q (T, Hq, D) -> (T, Hq, D)."""
        if allowed is not None:
            return sdpa_tree_attention(q, kc, vc, allowed, self.scale)
        if self._ws_kernel is not None and q.shape[0] * (q.shape[1] // kc.shape[0]) >= self.attn_ws_rows \
                and q.shape[0] >= self.attn_ws_min_tokens and not self._ws_check(q, kc, vc):
            return self._ws_kernel(q, kc, vc, prefix_len, tree_mask, self.scale, packed_mask=packed,
                                   pdl=bool(self.pdl))
        if self._kernel is not None:
            ws = {"workspace": self._workspace} if self._workspace is not None else {}
            return self._kernel(q, kc, vc, prefix_len, tree_mask, self.scale, packed_mask=packed, pdl=self.pdl,
                                combine=self.attn_combine, max_block_m=self.attn_max_block_m, tma=self.attn_tma,
                                **ws)
        return tree_attention_ref(q, kc, vc, prefix_len, tree_mask, self.scale)

    def _layers_triton(self, x, cos, sin, cache, slots, prefix_len, tree_mask, allowed, packed):
        """The decoder layers, the final norm and the LM head with fusion "triton": per layer
        add+RMSNorm, qkv GEMM, RoPE+KV write, attention, o GEMM, add+RMSNorm, gate/up GEMM, silu*up,
        down GEMM. Each residual add is folded into the next norm (the last into the final norm), so
        the arithmetic is that of the eager loop above; with `fold_norm` each add+RMSNorm runs inside
        the GEMM after it (`_norm_lin`). x: (T, hidden) embeddings -> (T, vocab_local) logits."""
        _, rope_kv, act = self._fused_ops
        spec, sh, t, pdl = self.spec, self.shard, x.shape[0], self.pdl
        if self.rope:
            from swiftspec.kernels.gemv import RopeKV
        nq = sh.q_heads * spec.head_dim
        res = None  # the residual stream; x: what the next norm adds to it
        for i, layer in enumerate(self.layers):
            kc, vc = cache.k[i], cache.v[i]
            if self.rope and self._gemv_runs(t, layer.wqkv_scale):  # RoPE + KV write in the GEMM's epilogue
                epi = RopeKV(cos, sin, slots, kc, vc, sh.q_heads, sh.kv_heads)
                q, res = self._norm_lin(x, res, layer.attn_norm, layer.wqkv, layer.bqkv, layer.wqkv_scale, rope=epi)
            else:
                qkv, res = self._norm_lin(x, res, layer.attn_norm, layer.wqkv, layer.bqkv, layer.wqkv_scale)
                q = rope_kv(qkv, cos, sin, slots, kc, vc, sh.q_heads, sh.kv_heads, pdl=pdl)
            a = self._attend(q, kc, vc, prefix_len, tree_mask, allowed, packed)
            o = self._all_reduce(self._lin(a.reshape(t, nq), layer.wo, None, layer.wo_scale))
            if self.swiglu and self._gemv_runs(t, layer.w13_scale):  # silu * up in the GEMM's epilogue
                up, res = self._norm_lin(o, res, layer.mlp_norm, layer.w13, None, layer.w13_scale, act="swiglu")
            else:
                gate_up, res = self._norm_lin(o, res, layer.mlp_norm, layer.w13, None, layer.w13_scale)
                up = act(gate_up, pdl=pdl)
            x = self._all_reduce(self._lin(up, layer.w2, None, layer.w2_scale))
        return self._norm_lin(x, res, self.norm, self.lm_head, None, self.lm_head_scale)[0]

    def _norm_lin(self, x, res, norm_w, w, b, scale, act: str | None = None,
                  rope=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear(RMSNorm(x + res) * norm_w), x + res): with `fold_norm` in one skinny-linear launch
        where it runs (<= its rows; norm_w is then ones, folded into w), else add_rmsnorm then
        `_lin`. res None: x alone. act, rope: as `_lin`'s."""
        eps, pdl = self.spec.rms_eps, self.pdl
        if self.fold_norm and scale is None and self._gemv_runs(x.shape[0], scale):
            x = x.contiguous()
            new_res = torch.empty_like(x) if res is not None else x
            y = self._gemv(x, w, b, kind="dot", pdl=pdl, rms_eps=eps, residual=res,
                           residual_out=new_res if res is not None else None, act=act, rope=rope)
            return y, new_res
        h, new_res = self._fused_ops[0](x, res, norm_w, eps, pdl=pdl)
        return self._lin(h, w, b, scale, act=act, rope=rope), new_res
