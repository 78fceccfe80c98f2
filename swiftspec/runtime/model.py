"""Llama / Qwen2 decoder for one tensor-parallel rank, with tree attention over a static KV cache.

One `Transformer` holds the weights of one TP rank (see `weights.load_model`):

    embed      (vocab, hidden)                         replicated
    per layer  wqkv (q_local*hd + 2*kv_local*hd, hidden) [+ bqkv for Qwen2]   column-parallel, fused
               wo   (hidden, q_local*hd)               row-parallel  -> all-reduce
               w13  (2*ffn_local, hidden)              column-parallel gate|up, fused
               w2   (hidden, ffn_local)                row-parallel  -> all-reduce
    lm_head    (vocab_local, hidden)                   vocab-parallel -> all-gather of logits

weight_format "fp8": wqkv, wo, w13, w2 and lm_head are float8 e4m3 with a float32 scale per row
(`{name}_quant`), and the LM head is its own copy even when tied. weight_format "int4" (W4A16, the
AWQ format's numbers): wqkv, wo, w13 and w2 are packed int4 (N, K / 8) int32 with a float16 scale
and zero point per group of inputs (`{name}_quant`, a `kernels.int4.Int4Weight`); embedding and
LM head stay in the model dtype, as AWQ checkpoints keep them.

Head counts, ffn and vocab are zero-padded per `ModelSpec.shard(tp)`: padded query heads have zero
rows in wqkv and zero columns in wo, so they add nothing; padded KV heads only serve padded query
heads. Numerics follow Hugging Face (RMSNorm in float32 then cast, RoPE cos/sin in float32 cast
to the model dtype) so float32 logits match transformers to ~1e-6.

`forward` takes everything as tensors (positions, slots, prefix_len, tree_mask) so the same call
can be captured in a CUDA graph (`graphs.GraphRunner`).
"""

from __future__ import annotations

import copy
import functools
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from swiftspec.kernels.counters import CounterWorkspace
from swiftspec.kernels.gemv import (
    MAX_ROWS,
    MAX_ROWS_DOT,
    MAX_ROWS_FP8,
    MAX_ROWS_INT4,
    Epilogue,
    GemvLaunch,
    RopeKV,
    fold_norm_weight,
    gemv,
    quantize_fp8,
)
from swiftspec.kernels.int4 import Int4Weight, check_group, dequantize, quantize_int4
from swiftspec.kernels.pdl import pdl_available
from swiftspec.kernels.reference import apply_rope, rms_norm, silu_mul
from swiftspec.kernels.rmsnorm import add_rmsnorm
from swiftspec.kernels.rope_kv import rope_kv
from swiftspec.kernels.silu_mul import silu_mul as silu_mul_kernel
from swiftspec.kernels.tree_attention import (
    TreeAttentionLaunch,
    pack_tree_mask,
    tree_attention,
)
from swiftspec.kernels.tree_attention_ws import GLUON_ERROR, check_ws, tree_attention_ws
from swiftspec.runtime.attention import tree_attention_ref
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.runtime.kv_cache import KVCache
from swiftspec.spec import ModelSpec, Shard, UserError

FP8 = torch.float8_e4m3fn  # weight-only fp8 GEMM weights (kernels.gemv)
# The kernels' `pdl=` argument for each `KernelConfig.pdl` mode (`kernels.pdl.pdl_mode`).
_PDL_ARG = {"off": False, "early": True, "late": "late", "early-nopeel": "early-nopeel", "prefetch": "prefetch"}


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


def _dequantized(w: torch.Tensor, quant: torch.Tensor | Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    """The weight (N, K) in `dtype` that fp8 `w` with its scale, or an `Int4Weight`, stands for."""
    if isinstance(quant, Int4Weight):
        return dequantize(quant, dtype)
    return w.to(dtype) * quant[:, None].to(dtype)


def _check_int4_shapes(spec: ModelSpec, shard: Shard) -> None:
    """UserError unless every int4 GEMM weight of this shard packs: K a multiple of the group size
    (which keeps a row-parallel shard's groups the unsharded model's) and N of 8."""
    for name, (n, k) in spec.linear_shapes(shard.tp).items():
        try:
            check_group(k, spec.group_size, f"{spec.name} {name} projection at TP {shard.tp}")
            if n % 8:
                raise ValueError(f"{spec.name} {name} projection at TP {shard.tp}: {n} output rows, not a multiple of 8")
        except ValueError as e:
            raise UserError(f"{e}: int4 weights need another TP degree or group size") from None


def _epilogue(act: str | None, rope: RopeKV | None) -> Epilogue | None:
    """The skinny linear's epilogue for an activation and/or RoPE (None: a plain product)."""
    return None if act is None and rope is None else Epilogue(act=act, rope=rope)


class Layer(nn.Module):
    """One decoder layer's local weights (shapes in the module docstring)."""

    def __init__(self, spec: ModelSpec, shard: Shard, device, dtype, weight_format: str = "native"):
        super().__init__()
        h, shapes = spec.hidden, spec.linear_shapes(shard.tp)

        def p(*shape, dt=dtype):
            return nn.Parameter(torch.zeros(*shape, device=device, dtype=dt), requires_grad=False)

        def gemm(n: int, k: int) -> nn.Parameter:
            if weight_format == "int4":  # the packed ints; the rest of the weight is `{name}_quant`
                return p(n, k // 8, dt=torch.int32)
            return p(n, k, dt=FP8 if weight_format == "fp8" else dtype)

        self.attn_norm, self.mlp_norm = p(h), p(h)
        self.wqkv = gemm(*shapes["qkv"])
        self.bqkv = p(shapes["qkv"][0]) if spec.qkv_bias else None
        self.wo, self.w13, self.w2 = gemm(*shapes["o"]), gemm(*shapes["gate_up"]), gemm(*shapes["down"])
        # what the weight format needs beside each GEMM weight (`Transformer.set_gemm_weight`): fp8
        # its float32 scale per row, int4 its `Int4Weight`; None: weights in the model dtype
        self.wqkv_quant = self.wo_quant = self.w13_quant = self.w2_quant = None


class Transformer(nn.Module):
    """Llama / Qwen2 decoder for one TP rank (see the module docstring for the weight layout).

    Build it with `weights.load_model`; `Transformer(spec, ...)` alone holds zero weights.
    `kernels` (kept as `model.kernels`) says how every op runs (`KernelConfig`); it is read once here.
    With `kernels.fold_norm`, call `fold_norms` once the weights are filled: until then the norms
    run on their own, so the model is correct at every point.
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
        kernels: KernelConfig = KernelConfig(),  # noqa: B008 - frozen, so one shared default is safe
    ):
        super().__init__()
        if spec.architecture not in ("llama", "qwen2"):
            raise UserError(f"architecture {spec.architecture!r} is not supported (supported: llama, qwen2)")
        self.spec, self.tp_rank, self.tp_size, self.group = spec, tp_rank, tp_size, group
        self.shard = spec.shard(tp_size)
        self.device, self.dtype = torch.device(device), dtype
        weight_format = kernels.weight_format
        z = dict(device=device, dtype=dtype)
        self.embed = nn.Parameter(torch.zeros(spec.vocab, spec.hidden, **z), requires_grad=False)
        # "fp8": the GEMM weights (qkv, o, gate/up, down, LM head) in float8 e4m3 with a scale per
        # row, quantized as they are filled (`set_gemm_weight`), so the model-dtype copy never exists
        self.weight_format = weight_format
        self._dequantized: dict[tuple[int, torch.dtype], torch.Tensor] = {}  # CPU fp8 / int4: see `_lin`
        if weight_format == "int4":
            _check_int4_shapes(spec, self.shard)
        self.layers = nn.ModuleList(Layer(spec, self.shard, device, dtype, weight_format) for _ in range(spec.num_layers))
        self.norm = nn.Parameter(torch.zeros(spec.hidden, **z), requires_grad=False)
        if spec.tie_embeddings and tp_size == 1 and weight_format != "fp8":
            self.lm_head = self.embed  # shared storage, as in HF (fp8: the LM head is its own copy)
        else:
            head_dtype = FP8 if weight_format == "fp8" else dtype
            self.lm_head = nn.Parameter(torch.zeros(self.shard.vocab, spec.hidden, device=device, dtype=head_dtype),
                                        requires_grad=False)  # fmt: skip
        self.lm_head_quant: torch.Tensor | None = None
        self.register_buffer("inv_freq", rope_inv_freq(spec).to(device), persistent=False)
        self.scale = spec.head_dim**-0.5
        self._norms_folded = False  # `fold_norms`
        self._configure(kernels)

    def _configure(self, kernels: KernelConfig) -> None:
        """Set up every op as `kernels` says (once per model: `__init__`, `with_kernels`)."""
        self.kernels = kernels
        self._init_attention(kernels)
        self._init_fusion(kernels.fusion)
        # the split merge of the Triton tree attention; fusion "triton" shares one counter workspace
        self._attn_launch = TreeAttentionLaunch(combine=kernels.attention_combine, workspace=self._workspace)
        self._init_linear(kernels)
        self.pdl = _PDL_ARG[kernels.pdl]  # the kernels' `pdl=` argument
        if self.pdl and not pdl_available(self.device):
            raise UserError(f"pdl needs a CUDA GPU of compute capability >= 9.0 (model on {self.device})")

    def with_kernels(self, kernels: KernelConfig) -> Transformer:
        """This model's weights (shared, not copied) run by other kernels: A/B runs over one set of
        weights. The weight format must be this model's, and fold_norm needs the norms folded
        already (`fold_norms`: folding the shared weights would change this model's norms too)."""
        if kernels.weight_format != self.weight_format:
            raise UserError(f"with_kernels keeps the {self.weight_format} weights, got weight_format "
                            f"{kernels.weight_format!r}")
        if kernels.fold_norm and not self._norms_folded:
            raise UserError("with_kernels(fold_norm) needs the norms folded first (`fold_norms`)")
        other = copy.copy(self)
        for name in ("_parameters", "_buffers", "_modules"):  # the containers, not the tensors
            setattr(other, name, dict(getattr(self, name)))
        other._configure(kernels)
        return other

    def _init_linear(self, kernels: KernelConfig) -> None:
        """How the GEMMs run: linear "torch" = `F.linear` (cuBLAS on CUDA); "triton" = the skinny
        linear `kernels.gemv` (a pure weight stream) for forwards of at most `linear_max_rows` tokens
        (default `gemv.MAX_ROWS`; up to `gemv.MAX_ROWS_DOT`), `F.linear` above that; fp8 and int4
        weights take it for every forward up to `gemv.MAX_ROWS_FP8` / `MAX_ROWS_INT4`, above that
        their dequantized copy. The choice is per forward shape, so a captured graph holds one.
        Where the skinny linear runs, its epilogues save a launch each: fold_norm the residual add + RMSNorm before the qkv, gate/up and LM-head GEMMs (once
        `fold_norms` has folded the norm weights into them), swiglu silu(gate) * up after gate/up,
        rope RoPE + the KV-cache write after qkv. linear_combine "kernel": split-K partials summed
        inside the linear's launch, its counters in the model's workspace (`kernels.counters`);
        linear_split_max_n: the int4 linears' split-K rule (`GemvLaunch.int4_split_max_n`)."""
        self._gemv, self._gemv_rows, self._gemv_quant_rows = None, 0, 0
        if kernels.linear == "triton":
            rows = MAX_ROWS if kernels.linear_max_rows is None else kernels.linear_max_rows
            if not 1 <= rows <= MAX_ROWS_DOT:
                raise UserError(f"linear_max_rows must be in 1..{MAX_ROWS_DOT}, got {rows}")
            quant_rows = MAX_ROWS_INT4 if kernels.weight_format == "int4" else MAX_ROWS_FP8
            run = gemv
            if kernels.linear_combine == "kernel" and self._workspace is None:
                self._workspace = CounterWorkspace(self.device)  # one set of counters for every counting launch
            launch = GemvLaunch(combine=kernels.linear_combine, int4_split_max_n=kernels.linear_split_max_n,
                                workspace=self._workspace if kernels.linear_combine == "kernel" else None)
            if launch != GemvLaunch():
                run = functools.partial(gemv, launch=launch)
            self._gemv, self._gemv_rows, self._gemv_quant_rows = run, rows, quant_rows

    def fold_norms(self) -> None:
        """Fold each RMSNorm's weight into the GEMM that consumes its output (W · diag(g): attn_norm
        into wqkv, mlp_norm into w13, the final norm into the LM head) and set the norm weights to
        ones: the same model up to one rounding per weight, whose norms can then run inside the GEMM
        (`Epilogue.rms_eps`, with `kernels.fold_norm`). Idempotent; `load_model` calls it after the
        weights are filled. A tied LM head gets its own copy (vocab × hidden more memory). Native
        weights only (folding fp8 weights would re-quantize them)."""
        if self._norms_folded:
            return
        if self.weight_format != "native":
            raise UserError(f"fold_norm needs native weights, not {self.weight_format} (folding would re-quantize "
                            "them)")
        for layer in self.layers:
            for w, g in ((layer.wqkv, layer.attn_norm), (layer.w13, layer.mlp_norm)):
                w.copy_(fold_norm_weight(w, g))
                g.fill_(1.0)
        if self.lm_head is self.embed:
            self.lm_head = nn.Parameter(self.embed.detach().clone(), requires_grad=False)
        self.lm_head.copy_(fold_norm_weight(self.lm_head, self.norm))
        self.norm.fill_(1.0)
        self._norms_folded = True

    def set_gemm_weight(self, owner: nn.Module, name: str, w: torch.Tensor | Int4Weight) -> None:
        """Write GEMM weight `name` of `owner` (a Layer, or the model for "lm_head") from `w` (N, K);
        with fp8 weights quantized per row (`kernels.gemv.quantize_fp8`), its scale kept beside it
        as `{name}_quant`; with int4 weights (not the LM head) `w` is an `Int4Weight` already (an AWQ
        checkpoint's) or quantized here (`kernels.int4.quantize_int4`, round to nearest, groups of
        `spec.group_size`), its packed ints in `name` and the whole `Int4Weight` as `{name}_quant`.
        Outputs then change by the quantization: a different model.

        The row-parallel weights (wo, w2) hold a slice of every row on each rank: their per-row
        amax is the max over the TP group (one all-reduce per weight while loading), so each
        rank's scales are the unsharded model's and the fp8 model is the same at every TP size.
        Without a group (the profiler's lone rank 0, communication skipped) the slice's own amax.
        int4 groups run along each row, so a row-parallel shard whose width is a multiple of the group
        holds exactly the unsharded model's groups (`_check_int4_shapes`)."""
        if self.weight_format == "int4" and name != "lm_head":
            w4 = w if isinstance(w, Int4Weight) else quantize_int4(w, self.spec.group_size)
            w4 = Int4Weight(*(t.to(self.device) for t in (w4.qweight, w4.scales, w4.zeros)), w4.group_size)
            param = getattr(owner, name)
            if w4.qweight.shape != param.shape:
                raise ValueError(f"{name}: int4 weight {tuple(w4.qweight.shape)} does not fit {tuple(param.shape)}")
            param.copy_(w4.qweight)
            self._dequantized.clear()
            setattr(owner, f"{name}_quant", Int4Weight(param.data, w4.scales, w4.zeros, w4.group_size))
            return
        if self.weight_format != "fp8":
            getattr(owner, name).copy_(w)
            return
        amax = None
        if name in ("wo", "w2") and self.tp_size > 1 and self.group is not None:
            amax = w.float().abs().amax(dim=1)
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
        w8, scale = quantize_fp8(w, amax)
        self._dequantized.clear()  # a weight changed: the CPU path's dequantized copies are stale
        getattr(owner, name).copy_(w8)
        setattr(owner, f"{name}_quant", scale)

    def _lin(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
             quant: torch.Tensor | Int4Weight | None = None, act: str | None = None, rope=None) -> torch.Tensor:
        """x (T, K) @ w (N, K).T + b -> (T, N) by the configured linear (`_init_linear`). `quant`
        (`set_gemm_weight`): w is fp8 with this scale (N,), or int4 with this `Int4Weight`: the
        quantized skinny linear with linear "triton", else the dequantized weight (the reference
        path): per call on a GPU, where a second copy would undo the bytes quantization saves;
        kept after the first call on the CPU, where the per-call conversion makes real-model runs
        several times slower than native and host memory is cheap. act, rope: `gemv`'s epilogues,
        only where the skinny linear runs (`_gemv_runs`)."""
        if quant is not None:
            if self._gemv_runs(x.shape[0], quant):
                int4 = isinstance(quant, Int4Weight)
                return self._gemv(x.contiguous(), quant if int4 else w, b, scale=None if int4 else quant, kind="dot",
                                  pdl=self.pdl, epilogue=_epilogue(act, rope))
            if w.device.type != "cpu":
                return F.linear(x, _dequantized(w, quant, x.dtype), b)
            key = (w.data_ptr(), x.dtype)
            if key not in self._dequantized:
                self._dequantized[key] = _dequantized(w, quant, x.dtype)
            return F.linear(x, self._dequantized[key], b)
        if self._gemv_runs(x.shape[0], quant):
            # the faster kind at 1-16 rows (docs/decisions.md)
            return self._gemv(x.contiguous(), w, b, kind="dot", pdl=self.pdl, epilogue=_epilogue(act, rope))
        if act is not None or rope is not None:
            raise ValueError(f"gemv's epilogues need the skinny linear ({x.shape[0]} rows go to F.linear)")
        return F.linear(x, w, b)

    def _gemv_runs(self, rows: int, quant: torch.Tensor | Int4Weight | None) -> bool:
        """Whether `_lin` runs a GEMM of `rows` token rows through the skinny linear (fp8 or int4
        weights: `quant` given)."""
        return self._gemv is not None and rows <= (self._gemv_rows if quant is None else self._gemv_quant_rows)

    def _init_fusion(self, mode: str) -> None:
        """How the small per-layer ops run (a batch-1 step is launch-bound): "off" plain eager ops,
        the reference; "compile" RMSNorm, RoPE and silu*up through `torch.compile` (one fused kernel
        each instead of ~5-8 launches; CUDA); "triton" the `swiftspec.kernels` residual add + RMSNorm,
        RoPE + KV-cache write and silu*up, one launch each (4 per layer instead of ~30; runs on CPU
        under TRITON_INTERPRET=1)."""
        on = mode == "compile"
        # dynamic=None: the first token count is compiled static, the next ones share one kernel
        # with a symbolic length. dynamic=False compiled every graph bucket and prefill length
        # anew and hit dynamo's recompile limit (8), which fullgraph turns into an error.
        fuse = (lambda f: torch.compile(f, dynamic=None, fullgraph=True)) if on else (lambda f: f)
        self._norm, self._rope, self._act = fuse(rms_norm), fuse(apply_rope), fuse(silu_mul)
        self._fused_ops = self._workspace = None
        if mode == "triton":
            self._fused_ops = (add_rmsnorm, rope_kv, silu_mul_kernel)
            # arrival counters shared by every layer (the in-kernel split merges): no memset per launch
            self._workspace = CounterWorkspace(self.device)

    def _init_attention(self, kernels: KernelConfig) -> None:
        """Tree attention: "torch" SDPA with the mask built once per forward; "ref"
        `tree_attention_ref` per layer (the contract, slow); "triton" `kernels.tree_attention`, whose
        split-KV partials are merged by `kernels.attention_combine`. With attention_ws_rows > 0,
        forwards of at least that many rows (tokens x group) per KV head and attention_ws_min_tokens
        tokens take the warp-specialized Gluon kernel (`kernels.tree_attention_ws`) where it can run
        (an sm_90 GPU, bf16/fp16; `check_ws`)."""
        self._kernel = self._pack = self._ws_kernel = None
        if kernels.attention == "triton" and kernels.attention_ws_rows > 0:
            if GLUON_ERROR:
                raise UserError(f"the warp-specialized attention needs Triton's Gluon ({GLUON_ERROR})")
            self._ws_kernel, self._ws_check = tree_attention_ws, check_ws
        if kernels.attention == "triton":
            self._kernel, self._pack = tree_attention, pack_tree_mask

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
        sdpa = self.kernels.attention == "torch"
        allowed = attention_mask(prefix_len, tree_mask, cache.k.shape[2]) if sdpa else None
        packed = self._pack(tree_mask, pdl=self.pdl) if self._pack is not None else None
        nq, nkv = sh.q_heads * hd, sh.kv_heads * hd
        x = self.embed[tokens]
        if self._fused_ops is not None:
            local = self._layers_triton(x, cos, sin, cache, slots, prefix_len, tree_mask, allowed, packed)
            return self._gather_logits(local.float())
        for i, layer in enumerate(self.layers):
            h = self._norm(x, layer.attn_norm, spec.rms_eps)
            qkv = self._lin(h, layer.wqkv, layer.bqkv, layer.wqkv_quant)
            q = self._rope(qkv[:, :nq].view(t, sh.q_heads, hd), cos, sin)
            k = self._rope(qkv[:, nq : nq + nkv].view(t, sh.kv_heads, hd), cos, sin)
            v = qkv[:, nq + nkv :].view(t, sh.kv_heads, hd)
            kc, vc = cache.k[i], cache.v[i]
            kc[:, slots] = k.transpose(0, 1)
            vc[:, slots] = v.transpose(0, 1)
            a = self._attend(q, kc, vc, prefix_len, tree_mask, allowed, packed)
            x = x + self._all_reduce(self._lin(a.reshape(t, nq), layer.wo, None, layer.wo_quant))
            h = self._norm(x, layer.mlp_norm, spec.rms_eps)
            up = self._act(self._lin(h, layer.w13, None, layer.w13_quant))
            x = x + self._all_reduce(self._lin(up, layer.w2, None, layer.w2_quant))
        x = self._norm(x, self.norm, spec.rms_eps)
        return self._gather_logits(self._lin(x, self.lm_head, None, self.lm_head_quant).float())

    def _attend(self, q, kc, vc, prefix_len, tree_mask, allowed, packed) -> torch.Tensor:
        """One layer's tree attention by the chosen impl: q (T, Hq, D) -> (T, Hq, D)."""
        if allowed is not None:
            return sdpa_tree_attention(q, kc, vc, allowed, self.scale)
        ws_rows, ws_tokens = self.kernels.attention_ws_rows, self.kernels.attention_ws_min_tokens
        if self._ws_kernel is not None and q.shape[0] * (q.shape[1] // kc.shape[0]) >= ws_rows \
                and q.shape[0] >= ws_tokens and not self._ws_check(q, kc, vc):
            return self._ws_kernel(q, kc, vc, prefix_len, tree_mask, self.scale, packed_mask=packed,
                                   pdl=bool(self.pdl))
        if self._kernel is not None:
            return self._kernel(q, kc, vc, prefix_len, tree_mask, self.scale, packed_mask=packed, pdl=self.pdl,
                                launch=self._attn_launch)
        return tree_attention_ref(q, kc, vc, prefix_len, tree_mask, self.scale)

    def _layers_triton(self, x, cos, sin, cache, slots, prefix_len, tree_mask, allowed, packed):
        """The decoder layers, the final norm and the LM head with fusion "triton": per layer
        add+RMSNorm, qkv GEMM, RoPE+KV write, attention, o GEMM, add+RMSNorm, gate/up GEMM, silu*up,
        down GEMM. Each residual add is folded into the next norm (the last into the final norm), so
        the arithmetic is that of the eager loop above; with `fold_norm` each add+RMSNorm runs inside
        the GEMM after it (`_norm_lin`). x: (T, hidden) embeddings -> (T, vocab_local) logits."""
        _, rope_kv, act = self._fused_ops
        spec, sh, t, pdl = self.spec, self.shard, x.shape[0], self.pdl
        nq = sh.q_heads * spec.head_dim
        res = None  # the residual stream; x: what the next norm adds to it
        for i, layer in enumerate(self.layers):
            kc, vc = cache.k[i], cache.v[i]
            if self.kernels.rope and self._gemv_runs(t, layer.wqkv_quant):  # RoPE + KV write in the GEMM's epilogue
                epi = RopeKV(cos, sin, slots, kc, vc, sh.q_heads, sh.kv_heads)
                q, res = self._norm_lin(x, res, layer.attn_norm, layer.wqkv, layer.bqkv, layer.wqkv_quant, rope=epi)
            else:
                qkv, res = self._norm_lin(x, res, layer.attn_norm, layer.wqkv, layer.bqkv, layer.wqkv_quant)
                q = rope_kv(qkv, cos, sin, slots, kc, vc, sh.q_heads, sh.kv_heads, pdl=pdl)
            a = self._attend(q, kc, vc, prefix_len, tree_mask, allowed, packed)
            o = self._all_reduce(self._lin(a.reshape(t, nq), layer.wo, None, layer.wo_quant))
            if self.kernels.swiglu and self._gemv_runs(t, layer.w13_quant):  # silu * up in the GEMM's epilogue
                up, res = self._norm_lin(o, res, layer.mlp_norm, layer.w13, None, layer.w13_quant, act="swiglu")
            else:
                gate_up, res = self._norm_lin(o, res, layer.mlp_norm, layer.w13, None, layer.w13_quant)
                up = act(gate_up, pdl=pdl)
            x = self._all_reduce(self._lin(up, layer.w2, None, layer.w2_quant))
        return self._norm_lin(x, res, self.norm, self.lm_head, None, self.lm_head_quant)[0]

    def _norm_lin(self, x, res, norm_w, w, b, quant, act: str | None = None,
                  rope=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(linear(RMSNorm(x + res) * norm_w), x + res): with `fold_norm` in one skinny-linear launch
        where it runs (<= its rows; norm_w is then ones, folded into w), else add_rmsnorm then
        `_lin`. res None: x alone. act, rope: as `_lin`'s."""
        eps, pdl = self.spec.rms_eps, self.pdl
        folded = self._norms_folded and self.kernels.fold_norm
        if folded and quant is None and self._gemv_runs(x.shape[0], quant):
            x = x.contiguous()
            new_res = torch.empty_like(x) if res is not None else x
            epi = Epilogue(rms_eps=eps, residual=res, residual_out=new_res if res is not None else None, act=act,
                           rope=rope)
            y = self._gemv(x, w, b, kind="dot", pdl=pdl, epilogue=epi)
            return y, new_res
        h, new_res = self._fused_ops[0](x, res, norm_w, eps, pdl=pdl)
        return self._lin(h, w, b, quant, act=act, rope=rope), new_res
