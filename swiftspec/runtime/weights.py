"""Build a `Transformer` for one TP rank from a Hugging Face checkpoint or from random weights.

Checkpoints: safetensors only (`model.safetensors`, or shards listed in
`model.safetensors.index.json`). Each rank reads only its slice of every sharded weight
(`safe_open(...).get_slice(name)[a:b]`), fuses q/k/v and gate/up, and zero-pads heads, ffn and vocab
per `ModelSpec.shard(tp)`.

Random weights (`weights="random"`, latency work at real shapes): N(0, 0.02) for matrices and
biases, ones for norms. Each tensor is generated *directly at its local (per-rank) shape on the
target device* with its own seed: crc32(f"{seed}/{name}") for replicated tensors (embedding, norms:
identical on all ranks) and crc32(f"{seed}/{name}/rank{r}") for sharded ones. So a random model is
deterministic for (seed, tp, rank) and fast to build even at 70B shapes, but a random model at
tp=2 is not the same function as at tp=1 (use a checkpoint to compare across TP degrees).
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from swiftspec.runtime.model import ATTENTION_COMBINE, Transformer, check_fold_norm
from swiftspec.runtime.tree import resolve_tree_growth
from swiftspec.spec import ModelSpec, UserError, resolve_model_path

WEIGHT_KINDS = ("checkpoint", "random")
_DTYPE_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


@dataclass(frozen=True)
class RankSlices:
    """Global index ranges [start, stop) of the real (unpadded) rows one rank holds.

    q, kv: head ranges; ffn: intermediate rows; vocab: LM-head rows. The rank's local tensors
    hold these first, then zeros up to the `Shard` sizes.
    """

    q: tuple[int, int]
    kv: tuple[int, int]
    ffn: tuple[int, int]
    vocab: tuple[int, int]


def rank_slices(spec: ModelSpec, tp: int, rank: int) -> RankSlices:
    """Which heads / rows rank `rank` of `tp` holds (mirrors the three cases of `ModelSpec.shard`)."""
    sh = spec.shard(tp)
    g = spec.num_heads // spec.num_kv_heads

    def clip(a: int, b: int, hi: int) -> tuple[int, int]:
        return min(a, hi), min(b, hi)

    if spec.num_kv_heads % tp == 0:
        kv = (rank * sh.kv_heads, (rank + 1) * sh.kv_heads)
        q = (kv[0] * g, kv[1] * g)
    elif tp % spec.num_kv_heads == 0:  # KV head replicated over `rep` ranks, its q heads split
        rep = tp // spec.num_kv_heads
        head, part = divmod(rank, rep)
        kv = (head, head + 1)
        q = clip(head * g + part * sh.q_heads, head * g + (part + 1) * sh.q_heads, (head + 1) * g)
    else:  # whole KV groups, padded at the end
        kv = clip(rank * sh.kv_heads, (rank + 1) * sh.kv_heads, spec.num_kv_heads)
        q = (kv[0] * g, kv[1] * g)
    return RankSlices(
        q=q,
        kv=kv,
        ffn=clip(rank * sh.ffn, (rank + 1) * sh.ffn, spec.ffn),
        vocab=clip(rank * sh.vocab, (rank + 1) * sh.vocab, spec.vocab),
    )


# A reader returns rows (dim 0) or columns (dim 1) [a, b) of one HF tensor; dim None = whole tensor.
Reader = Callable[[str, "int | None", int, int], torch.Tensor]


def _checkpoint_reader(folder: Path) -> tuple[Reader, set[str]]:
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
    elif single.exists():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as f:
            weight_map = {k: single.name for k in f.keys()}
    else:
        raise UserError(
            f"{folder} has no safetensors weights (model.safetensors or model.safetensors.index.json); "
            "use --weights random for latency work at this model's shapes"
        )
    from safetensors import safe_open

    handles: dict[str, object] = {}

    def read(name: str, dim: int | None, a: int, b: int) -> torch.Tensor:
        if name not in weight_map:
            raise UserError(f"{folder}: checkpoint lacks tensor {name}")
        fname = weight_map[name]
        if fname not in handles:
            handles[fname] = safe_open(str(folder / fname), framework="pt")
        sl = handles[fname].get_slice(name)
        if dim is None:
            return sl[:]
        return sl[a:b] if dim == 0 else sl[:, a:b]

    return read, set(weight_map)


def _random_reader(spec: ModelSpec, rank: int, seed: int, device, dtype) -> Reader:
    h, hd = spec.hidden, spec.head_dim
    full = {
        "embed_tokens": (spec.vocab, h), "lm_head": (spec.vocab, h), "norm": (h,),
        "q_proj.weight": (spec.num_heads * hd, h), "k_proj.weight": (spec.num_kv_heads * hd, h),
        "v_proj.weight": (spec.num_kv_heads * hd, h), "q_proj.bias": (spec.num_heads * hd,),
        "k_proj.bias": (spec.num_kv_heads * hd,), "v_proj.bias": (spec.num_kv_heads * hd,),
        "o_proj": (h, spec.num_heads * hd), "gate_proj": (spec.ffn, h), "up_proj": (spec.ffn, h),
        "down_proj": (h, spec.ffn),
    }  # fmt: skip

    def read(name: str, dim: int | None, a: int, b: int) -> torch.Tensor:
        shape = list(next(s for k, s in full.items() if k in name))
        if name.endswith("norm.weight"):
            return torch.ones(shape, device=device, dtype=dtype)
        tag = f"{seed}/{name}" if dim is None else f"{seed}/{name}/rank{rank}"
        if dim is not None:
            shape[dim] = b - a
        gen = torch.Generator(device=device).manual_seed(zlib.crc32(tag.encode()))
        return torch.randn(shape, generator=gen, device=device, dtype=dtype).mul_(0.02)

    return read


def _fill(model: Transformer, read: Reader, names: set[str] | None) -> None:
    """Copy every local tensor of `model` from `read`, fusing and zero-padding as documented."""
    spec, sh = model.spec, model.shard
    sl = rank_slices(spec, model.tp_size, model.tp_rank)
    hd = spec.head_dim

    def get(name: str, dim: int | None = None, rng: tuple[int, int] = (0, 0), unit: int = 1, size: int = 0):
        """Rows/cols [rng[0]*unit, rng[1]*unit) of `name`, zero-padded to size*unit along dim."""
        t = read(name, dim, rng[0] * unit, rng[1] * unit).to(device=model.device, dtype=model.dtype)
        if dim is not None and t.shape[dim] < size * unit:
            pad = list(t.shape)
            pad[dim] = size * unit - t.shape[dim]
            t = torch.cat([t, torch.zeros(pad, device=t.device, dtype=t.dtype)], dim=dim)
        return t

    with torch.no_grad():
        model.embed.copy_(get("model.embed_tokens.weight"))
        model.norm.copy_(get("model.norm.weight"))
        for i, layer in enumerate(model.layers):
            p = f"model.layers.{i}."
            layer.attn_norm.copy_(get(p + "input_layernorm.weight"))
            layer.mlp_norm.copy_(get(p + "post_attention_layernorm.weight"))
            def qkv(kind: str, p: str = p) -> torch.Tensor:
                return torch.cat([get(f"{p}self_attn.q_proj.{kind}", 0, sl.q, hd, sh.q_heads),
                                  get(f"{p}self_attn.k_proj.{kind}", 0, sl.kv, hd, sh.kv_heads),
                                  get(f"{p}self_attn.v_proj.{kind}", 0, sl.kv, hd, sh.kv_heads)], dim=0)  # fmt: skip

            model.set_gemm_weight(layer, "wqkv", qkv("weight"))
            if layer.bqkv is not None:
                layer.bqkv.copy_(qkv("bias"))
            model.set_gemm_weight(layer, "wo", get(p + "self_attn.o_proj.weight", 1, sl.q, hd, sh.q_heads))
            gate = get(p + "mlp.gate_proj.weight", 0, sl.ffn, 1, sh.ffn)
            up = get(p + "mlp.up_proj.weight", 0, sl.ffn, 1, sh.ffn)
            model.set_gemm_weight(layer, "w13", torch.cat([gate, up], dim=0))
            model.set_gemm_weight(layer, "w2", get(p + "mlp.down_proj.weight", 1, sl.ffn, 1, sh.ffn))
        if model.lm_head is not model.embed:
            if spec.tie_embeddings or (names is not None and "lm_head.weight" not in names):
                rows = model.embed[sl.vocab[0] : sl.vocab[1]]  # this rank's rows of the tied matrix
                head = torch.zeros(sh.vocab, spec.hidden, device=model.device, dtype=model.dtype)
                head[: rows.shape[0]] = rows
            else:
                head = get("lm_head.weight", 0, sl.vocab, 1, sh.vocab)
            model.set_gemm_weight(model, "lm_head", head)


def resolve_kernels(device: str | torch.device, attention: str = "auto", fusion: str = "auto") -> tuple[str, str]:
    """(attention, fusion) with "auto" replaced by the device's default: Triton kernels on CUDA,
    the torch path on CPU (where Triton runs only under the interpreter)."""
    cuda = torch.device(device).type == "cuda"
    if attention == "auto":
        attention = "triton" if cuda else "torch"
    if fusion == "auto":
        fusion = "triton" if cuda else "off"
    return attention, fusion


def resolve_linear(device: str | torch.device, linear: str = "auto") -> str:
    """`linear` with "auto" replaced by the device's default: the Triton skinny linear on CUDA
    (forwards of <= 16 tokens; the Llama-3-8B step 4-10 % faster at 1-16 tokens in every H200 run,
    the 1B draft within run-to-run noise, benchmarks/KERNELS.md), `F.linear` on CPU."""
    if linear == "auto":
        return "triton" if torch.device(device).type == "cuda" else "torch"
    return linear


ATTENTION_WS_CHOICES = ("auto", "on", "off")
# Rows (tokens x group) per KV head and tokens per forward from which the Gluon tree attention runs
# when on (H100, paired): from 128 rows it made the Llama-3-8B step 1.1-2.7 % faster at 32-128
# tokens, at 64 rows it lost 0.2 % at kv 1024 (bench_step_kernels-2026-12-06j, -06k); the
# Llama-3.2-1B step 0.6-5.8 % faster at 32-128 tokens (-06m). On the 70B TP-8 shard (group 8: 128
# rows at 16 tokens) it lost 1.8-2.6 % at 16 tokens and kv 1024, a single KV head's tile leaving
# most SMs idle, and won 1.3-3.9 % from 64 tokens (-06l, -06n): hence the 32 tokens.
ATTENTION_WS_ROWS = 128
ATTENTION_WS_MIN_TOKENS = 32
PDL_CHOICES = ("auto", "on", "late", "off")
FOLD_NORM_CHOICES = ("auto", "on", "off")
SWIGLU_CHOICES = ("auto", "on", "off")
ROPE_CHOICES = ("auto", "on", "off")
WEIGHT_FORMATS = ("native", "fp8")


def resolve_attention_ws(device: str | torch.device, attention_ws: str = "auto", attention: str = "triton",
                         weight_format: str = "native") -> int:
    """Rows per KV head from which tree attention takes the warp-specialized Gluon kernel
    (`kernels.tree_attention_ws`; 0: never). "on": `ATTENTION_WS_ROWS` (needs CUDA and attention
    "triton"; `load_model` adds `ATTENTION_WS_MIN_TOKENS`; forwards the Gluon kernel cannot run,
    not bf16/fp16 or a group that does not divide 64, keep the Triton kernel); "off": 0; "auto":
    `ATTENTION_WS_ROWS` where the Triton kernels run (CUDA, attention "triton") with native weights
    on an sm_90 GPU (or where no GPU is present to ask: the bundled profiles' H200), else 0.
    Measured paired (benchmarks/KERNELS.md, "Nineteenth" to "Twenty-first session"): on the H200
    the Llama-3-8B step 1.6-3.5 % faster at 32-64 tokens (kv 1024 and 4096); on an H100 the 8B
    1.1-2.7 % at 32-128 tokens, the 1B 0.6-5.8 %, the 70B TP-8 shard 0.4-3.9 % from 64 tokens. The
    bundled `h200-measured` forwards where it runs were re-profiled with it on an H200 (0.83-0.99 of
    the Triton kernel's rows). fp8 weights keep the Triton kernel until their own A/B and re-profile."""
    if attention_ws not in ATTENTION_WS_CHOICES:
        raise UserError(f"attention_ws must be one of {', '.join(ATTENTION_WS_CHOICES)}, got {attention_ws!r}")
    device = torch.device(device)
    if attention_ws == "auto":
        if device.type != "cuda" or attention != "triton" or weight_format != "native":
            return 0
        if torch.cuda.is_available() and torch.cuda.get_device_capability(device) != (9, 0):
            return 0
        return ATTENTION_WS_ROWS
    if attention_ws == "off":
        return 0
    if device.type != "cuda" or attention != "triton":
        raise UserError("attention_ws 'on' needs a CUDA GPU and attention 'triton'")
    return ATTENTION_WS_ROWS


def resolve_pdl(device: str | torch.device, pdl: str = "auto", fusion: str = "triton",
                weight_format: str = "native") -> bool | str:
    """How the model's Triton kernels use programmatic dependent launch (`Transformer.set_pdl`):
    "on" (True: early, each kernel lets the next launch right after its own wait), "late" (after
    its main loop), "off" (False), or "auto" = "late" where the Triton kernels run (CUDA, fusion
    "triton"), native or fp8 weights, on a GPU of compute capability >= 9.0 (or where no GPU is
    present to ask: the bundled profiles' H200), else off. Measured on the H200 (benchmarks/KERNELS.md,
    "Seventeenth session", paired on six shards): late 1.6-4.3 % faster at 1-16 tokens on every
    shard, within 0.6 % at 64; early 2.2-5.2 % faster on the 70B TP 4/8 shards but 0.8-8.3 % slower
    at TP 1. With fp8 weights, paired on an H100 ("Eighteenth session"), late was 2.5-5.2 % faster at
    1-16 tokens on three shards; `h200-fp8` was re-profiled with it on an H200 ("Twenty-first
    session"). `weight_format` no longer changes the answer."""
    if pdl not in PDL_CHOICES:
        raise UserError(f"pdl must be one of {', '.join(PDL_CHOICES)}, got {pdl!r}")
    if pdl == "auto":
        device = torch.device(device)
        if device.type != "cuda" or fusion != "triton":
            return False
        if torch.cuda.is_available() and torch.cuda.get_device_capability(device)[0] < 9:
            return False
        return "late"
    return {"on": True, "late": "late"}.get(pdl, False)


def resolve_fold_norm(device: str | torch.device, fold_norm: str = "auto", linear: str = "triton",
                      fusion: str = "triton", weight_format: str = "native", tp_size: int = 1) -> bool:
    """Whether `load_model` folds the RMSNorm weights into the GEMMs and runs each add+RMSNorm
    inside the skinny linear after it (`Transformer.set_linear(..., fold_norm=True)`): "on", "off",
    or "auto" = on where that path runs (CUDA, linear and fusion "triton", native weights) on an
    unsharded model (TP 1). Measured on the H200 (benchmarks/KERNELS.md, "Eleventh session"): the
    Llama-3-8B and 3.2-3B steps 0.5-2.4 % faster at 1-16 tokens, the 1B within noise; TP 2-8
    shards up to 15 % slower (their narrow GEMMs launch too few programs to hide the norm's work)."""
    if fold_norm not in FOLD_NORM_CHOICES:
        raise UserError(f"fold_norm must be one of {', '.join(FOLD_NORM_CHOICES)}, got {fold_norm!r}")
    if fold_norm == "auto":
        return (torch.device(device).type == "cuda" and linear == "triton" and fusion == "triton"
                and weight_format == "native" and tp_size == 1)
    return fold_norm == "on"


def resolve_swiglu(device: str | torch.device, swiglu: str = "auto", linear: str = "triton",
                   fusion: str = "triton", weight_format: str = "native") -> bool:
    """Whether silu(gate) * up runs in the gate/up skinny linear's epilogue instead of its own launch
    (`Transformer.set_linear(..., swiglu=True)`): "on", "off", or "auto" = on where that path runs
    (CUDA, linear and fusion "triton"), native or fp8 weights, at any TP degree (the K loop is
    untouched). Measured on the H200 (benchmarks/KERNELS.md, "Twelfth session", paired): Llama-3.2-1B
    steps 1.9-2.2 % faster at 1-16 tokens, 3.2-3B 1.2-1.3 %, Llama-3-8B 0.8-1.8 %; with fp8 weights
    (thirteenth session) 1B 2.1-2.7 % and 8B 1.6-2.0 %. Both bundled profiles are measured with it
    (h200-fp8 since the fifteenth session). `weight_format` no longer changes the answer."""
    if swiglu not in SWIGLU_CHOICES:
        raise UserError(f"swiglu must be one of {', '.join(SWIGLU_CHOICES)}, got {swiglu!r}")
    if swiglu == "auto":
        return torch.device(device).type == "cuda" and linear == "triton" and fusion == "triton"
    if swiglu == "on" and linear != "triton":
        raise UserError("swiglu needs linear 'triton' (the skinny linear applies the activation)")
    return swiglu == "on"


def resolve_rope(device: str | torch.device, rope: str = "auto", linear: str = "triton", fusion: str = "triton",
                 weight_format: str = "native") -> bool:
    """Whether RoPE + the KV-cache write run in the qkv skinny linear's epilogue instead of their own
    launch (`Transformer.set_linear(..., rope=True)`): "on", "off", or "auto" = on where that path
    runs (CUDA, linear and fusion "triton"), native or fp8 weights, at any TP degree. Measured on
    the H200 (benchmarks/KERNELS.md, "Twelfth session", paired, on top of swiglu): Llama-3.2-1B steps
    1.2-2.5 % faster, Llama-3-8B 0.3-0.8 %; fp8 weights: 1B 0.1-1.0 %, 8B 0.8-1.3 % (thirteenth
    session). Both bundled profiles are measured with it (h200-fp8 since the fifteenth session);
    `weight_format` no longer changes the answer."""
    if rope not in ROPE_CHOICES:
        raise UserError(f"rope must be one of {', '.join(ROPE_CHOICES)}, got {rope!r}")
    if rope == "auto":
        return torch.device(device).type == "cuda" and linear == "triton" and fusion == "triton"
    if rope == "on" and linear != "triton":
        raise UserError("rope needs linear 'triton' (the skinny linear applies it)")
    return rope == "on"


KERNEL_SETTINGS = ("attention", "attention_combine", "attention_ws", "fold_norm", "fusion", "linear", "pdl", "rope",
                   "swiglu", "tree_growth", "weight_format")


def kernel_settings(device: str | torch.device, weight_format: str = "native") -> dict[str, str]:
    """The kernels `load_model` picks by default on `device` for `weight_format` (the "auto"
    choices), as a profile's meta.json records them: a profile predicts the runtime only while these
    agree. fold_norm "tp1": on for unsharded models only (`resolve_fold_norm`)."""
    attention, fusion = resolve_kernels(device)
    linear = resolve_linear(device)
    fold = resolve_fold_norm(device, linear=linear, fusion=fusion, weight_format=weight_format)
    swiglu = resolve_swiglu(device, linear=linear, fusion=fusion, weight_format=weight_format)
    rope = resolve_rope(device, linear=linear, fusion=fusion, weight_format=weight_format)
    pdl = resolve_pdl(device, fusion=fusion, weight_format=weight_format)
    ws = resolve_attention_ws(device, attention=attention, weight_format=weight_format)
    return {"attention": attention, "attention_combine": ATTENTION_COMBINE if attention == "triton" else "-",
            "attention_ws": "on" if ws else "off",
            "fold_norm": "tp1" if fold else "off", "fusion": fusion, "linear": linear,
            "pdl": {True: "on", "late": "late"}.get(pdl, "off"), "rope": "on" if rope else "off",
            "swiglu": "on" if swiglu else "off",
            "tree_growth": resolve_tree_growth(device), "weight_format": weight_format}


def kernel_mismatch(meta: dict, device: str | torch.device) -> list[str]:
    """The kernel settings where a profile's meta.json differs from today's runtime defaults on
    `device` for the profile's weight format, as 'name: profile X, runtime Y' (settings the profile
    did not record are skipped). The settings that follow the weight format (fold_norm, swiglu) are
    compared at the profile's format; the format itself against the default, native."""
    now = {**kernel_settings(device, meta.get("weight_format", "native")), "weight_format": "native"}
    return [f"{k}: profile {meta[k]}, runtime {now[k]}" for k in KERNEL_SETTINGS if k in meta and meta[k] != now[k]]


def load_model(
    path_or_name: str | Path,
    *,
    weights: str = "checkpoint",
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    tp_rank: int = 0,
    tp_size: int = 1,
    group: dist.ProcessGroup | None = None,
    seed: int = 0,
    attention: str = "auto",
    fusion: str = "auto",
    linear: str = "auto",
    pdl: str = "auto",
    attention_ws: str = "auto",
    fold_norm: str = "auto",
    swiglu: str = "auto",
    rope: str = "auto",
    num_layers: int | None = None,
    weight_format: str = "native",
) -> Transformer:
    """The model of one TP rank. `path_or_name`: checkpoint folder or bundled name (random only).

    attention: "auto" = the Triton tree-attention kernel on CUDA (measured faster than masked
    SDPA at every shape, benchmarks/results/kernels_*.json), the torch path on CPU; or "torch",
    "ref", "triton".

    fusion: "auto" = "triton" on CUDA (the fused add+RMSNorm, RoPE+KV write and silu*up kernels:
    Llama-3-8B 1-token step 7.17 -> 5.04 ms on the H200, benchmarks/results/bench_step_kernels-*),
    "off" on CPU; or "off", "compile", "triton" (see `Transformer.set_fusion`).

    linear: "auto" (see `resolve_linear`), "torch" or "triton" (see `Transformer.set_linear`).

    pdl: "auto" (see `resolve_pdl`), "on", "late" or "off" (see `Transformer.set_pdl`).

    attention_ws: "auto" (see `resolve_attention_ws`), "on" or "off": forwards of many rows per KV
    head (`ATTENTION_WS_ROWS`) and at least `ATTENTION_WS_MIN_TOKENS` tokens through the Gluon
    tree attention (`Transformer.set_attention(..., ws_rows=, ws_min_tokens=)`).

    fold_norm: "auto" (see `resolve_fold_norm`), "on" or "off"; applied after the weights are read.

    swiglu: "auto" (see `resolve_swiglu`), "on" or "off".

    rope: "auto" (see `resolve_rope`), "on" or "off".

    num_layers: keep only the first n decoder layers (latency work on a slice of a big model).
    weight_format: "native" (the GEMM weights in `dtype`) or "fp8" (weight-only float8_e4m3fn with
    per-row scales, quantized while filling (`Transformer.set_gemm_weight`), run by the fp8 skinny
    linear; a different model, so no verb defaults to it: see benchmarks/KERNELS.md, seventh session).
    The returned model carries `model.weights` = "checkpoint" | "random" for labelling outputs.
    """
    if weight_format not in WEIGHT_FORMATS:
        raise UserError(f"weight_format must be one of {', '.join(WEIGHT_FORMATS)}, got {weight_format!r}")
    if weights not in WEIGHT_KINDS:
        raise UserError(f"weights must be one of {', '.join(WEIGHT_KINDS)}, got {weights!r}")
    if not 0 <= tp_rank < tp_size:
        raise UserError(f"tp_rank {tp_rank} is outside 0..{tp_size - 1}")
    folder = resolve_model_path(path_or_name)
    spec = ModelSpec.from_config(folder, dtype_bytes=_DTYPE_BYTES.get(dtype, 2))
    if num_layers is not None:
        if not 1 <= num_layers <= spec.num_layers:
            raise UserError(f"num_layers must be in 1..{spec.num_layers}, got {num_layers}")
        spec = dataclasses.replace(spec, num_layers=num_layers)
    if weights == "checkpoint":
        read, names = _checkpoint_reader(folder)
    else:
        read, names = _random_reader(spec, tp_rank, seed, torch.device(device), dtype), None
    attention, fusion = resolve_kernels(device, attention, fusion)
    linear = resolve_linear(device, linear)
    fold = resolve_fold_norm(device, fold_norm, linear, fusion, weight_format, tp_size)
    if fold:  # before any weight is read
        check_fold_norm(weight_format, linear)
    act = resolve_swiglu(device, swiglu, linear, fusion, weight_format)
    rot = resolve_rope(device, rope, linear, fusion, weight_format)
    ws_rows = resolve_attention_ws(device, attention_ws, attention, weight_format)
    model = Transformer(
        spec, tp_rank=tp_rank, tp_size=tp_size, group=group, device=device, dtype=dtype, attention=attention,
        weight_format=weight_format,
    )
    model.set_fusion(fusion)
    model.set_linear(linear, swiglu=act, rope=rot)
    model.set_pdl(resolve_pdl(device, pdl, fusion, weight_format))
    if ws_rows:
        model.set_attention(attention, ws_rows=ws_rows, ws_min_tokens=ATTENTION_WS_MIN_TOKENS)
    _fill(model, read, names)
    if fold:  # the norm weights fold into the GEMM weights, so after those are read
        model.set_linear(linear, fold_norm=True, swiglu=act, rope=rot)
    model.weights = weights
    return model.eval()


def load_tokenizer(path: str | Path):
    """`transformers.AutoTokenizer` of a checkpoint folder, or None when it ships no tokenizer."""
    p = Path(path)
    if not p.is_dir():
        return None
    if not any((p / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(p), local_files_only=True)
