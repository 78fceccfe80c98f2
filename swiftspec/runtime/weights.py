"""Build a `Transformer` for one TP rank from a Hugging Face checkpoint or from random weights.

Checkpoints: safetensors only (`model.safetensors`, or shards listed in
`model.safetensors.index.json`). Each rank reads only its slice of every sharded weight
(`safe_open(...).get_slice(name)[a:b]`), fuses q/k/v and gate/up, and zero-pads heads, ffn and vocab
per `ModelSpec.shard(tp)`. AWQ checkpoints (config.json `quantization_config` quant_method "awq",
4 bits, the GEMM layout; `kernels.int4`) hold each projection as qweight / qzeros / scales: a rank
reads its rows or columns of those (output slices in whole packs of 8, input slices in whole
groups) and the model runs them as they are (weight_format "int4"); the embedding, norms and LM
head are in the checkpoint's dtype.

Random weights (`weights="random"`, latency work at real shapes): N(0, 0.02) for matrices and
biases, ones for norms. Each tensor is generated *directly at its local (per-rank) shape on the
target device* with its own seed: crc32(f"{seed}/{name}") for replicated tensors (embedding, norms:
identical on all ranks) and crc32(f"{seed}/{name}/rank{r}") for sharded ones. So a random model is
deterministic for (seed, tp, rank) and fast to build even at 70B shapes, but a random model at
tp=2 is not the same function as at tp=1 (use a checkpoint to compare across TP degrees).
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open

from swiftspec.kernels.int4 import AwqTensors, awq_unpacked, check_group, from_parts
from swiftspec.runtime.kernel_config import KernelConfig
from swiftspec.runtime.model import Transformer
from swiftspec.spec import ModelSpec, UserError, parse_json, read_text, require, resolve_model_path

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


def _open_safetensors(path: Path):
    """safe_open of one checkpoint file; a truncated or corrupt file -> UserError naming it."""
    if not path.is_file():
        raise UserError(f"checkpoint file {path} not found: re-download the checkpoint")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as e:  # SafetensorError (truncated, bad header) and OSError
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"checkpoint file {path} is not a readable safetensors file ({msg}): "
                        "re-download it") from None


def _weight_map(folder: Path) -> dict[str, str]:
    """Tensor name -> file of a checkpoint folder (`model.safetensors` or its index)."""
    index = folder / "model.safetensors.index.json"
    single = folder / "model.safetensors"
    if index.exists():
        where = f"checkpoint index {index}"
        doc = parse_json(read_text(index, "checkpoint index"), where)
        if not isinstance(doc, dict):
            raise UserError(f"{where} is malformed: expected a JSON object")
        weight_map = require(doc, "weight_map", where)
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) and v for v in weight_map.values()):
            raise UserError(f"{where}: weight_map must map tensor names to file names")
        for fname in set(weight_map.values()):
            if Path(fname).name != fname:
                raise UserError(f"{where}: weight_map names {fname!r:.60}: give file names inside {folder}")
        return weight_map
    if single.exists():
        return {k: single.name for k in _open_safetensors(single).keys()}
    raise UserError(
        f"{folder} has no safetensors weights (model.safetensors or model.safetensors.index.json); "
        "use --weights random for latency work at this model's shapes"
    )


PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
               "mlp.up_proj", "mlp.down_proj")


def _projection_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """(N outputs, K inputs) of each projection of a layer (`PROJECTIONS`)."""
    h, q, kv = spec.hidden, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return dict(zip(PROJECTIONS, ((q, h), (kv, h), (kv, h), (h, q), (spec.ffn, h), (spec.ffn, h), (h, spec.ffn)),
                    strict=True))


def _expected_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Full (unsharded) shape of every tensor `_fill` reads (lm_head: when the checkpoint has one;
    an AWQ checkpoint's projections: qweight (K, N / 8), qzeros (K / g, N / 8), scales (K / g, N))."""
    h, q, kv = spec.hidden, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    out = {"model.embed_tokens.weight": (spec.vocab, h), "model.norm.weight": (h,)}
    if not spec.tie_embeddings:
        out["lm_head.weight"] = (spec.vocab, h)
    g = spec.group_size
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        for proj, (n, k) in _projection_shapes(spec).items():
            if spec.weight_format == "int4":
                out.update({f"{p}{proj}.qweight": (k, n // 8), f"{p}{proj}.qzeros": (k // g, n // 8),
                            f"{p}{proj}.scales": (k // g, n)})
            else:
                out[f"{p}{proj}.weight"] = (n, k)
        if spec.qkv_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})  # fmt: skip
    return out


def check_checkpoint(folder: Path, spec: ModelSpec) -> tuple[dict[str, str], dict[str, object]]:
    """Open every file of the checkpoint in `folder` and check that each tensor the model reads is
    there at the shape `spec` gives, before any model is built. Returns the tensor -> file map and
    file -> open handle;
    a truncated file, a missing tensor or a wrong shape -> UserError naming the file and tensor."""
    weight_map = _weight_map(folder)
    if spec.weight_format == "int4":
        for proj, (n, k) in _projection_shapes(spec).items():
            try:
                check_group(k, spec.group_size, f"{folder}: {proj}")
            except ValueError as e:
                raise UserError(f"{e}: this AWQ checkpoint's group size does not fit the model") from None
            if n % 8:
                raise UserError(f"{folder}: {proj} has {n} outputs, not a multiple of 8: not an AWQ GEMM layout")
    handles = {f: _open_safetensors(folder / f) for f in sorted(set(weight_map.values()))}
    for name, shape in _expected_shapes(spec).items():
        if name not in weight_map:
            if name == "lm_head.weight":
                continue  # no LM head: tied to the embedding (`_fill`)
            raise UserError(f"checkpoint {folder} lacks tensor {name}: is it a {spec.architecture} checkpoint "
                            "of this config.json?")
        fname = weight_map[name]
        try:
            got = tuple(handles[fname].get_slice(name).get_shape())
        except Exception as e:  # SafetensorError: the index names a tensor the file lacks
            raise UserError(f"checkpoint file {folder / fname} has no readable tensor {name} "
                            f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        if got != shape:
            raise UserError(f"checkpoint file {folder / fname}: tensor {name} has shape {list(got)} but "
                            f"config.json gives {list(shape)}: the weights do not match the config")
    return weight_map, handles


def check_checkpoints(*paths: str | Path | None) -> None:
    """`check_checkpoint` of each checkpoint folder given (None skipped): a verb calls it before it
    prints progress, starts workers or builds models, so a truncated file or a config that does not
    match the weights is one line up front."""
    for path in paths:
        if path is not None:
            folder = resolve_model_path(path)
            check_checkpoint(folder, ModelSpec.from_config(folder))


def _checkpoint_reader(folder: Path, spec: ModelSpec) -> tuple[Reader, set[str]]:
    weight_map, handles = check_checkpoint(folder, spec)

    def read(name: str, dim: int | None, a: int, b: int) -> torch.Tensor:
        if name not in weight_map:
            raise UserError(f"{folder}: checkpoint lacks tensor {name}")
        sl = handles[weight_map[name]].get_slice(name)
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


def _awq_slice(read: Reader, base: str, dim: int, a: int, b: int, size: int,
               group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Outputs (dim 0) or inputs (dim 1) [a, b) of the AWQ projection `base`, zero-padded to `size`
    along that dim: (q (N, K) uint8, zeros, scales (N, K / g)). Zero q, zeros and scales make the
    padded rows and columns zero weights."""
    unit = 8 if dim == 0 else group  # outputs come in packs of 8, inputs in whole groups
    if a % unit or b % unit:
        raise UserError(f"{base}: this rank's {'outputs' if dim == 0 else 'inputs'} [{a}, {b}) split a "
                        f"{'pack of 8' if dim == 0 else f'group of {group}'}: use another TP degree")
    if dim == 0:
        t = AwqTensors(read(base + ".qweight", 1, a // 8, b // 8), read(base + ".qzeros", 1, a // 8, b // 8),
                       read(base + ".scales", 1, a, b))
    else:
        t = AwqTensors(read(base + ".qweight", 0, a, b), read(base + ".qzeros", 0, a // group, b // group),
                       read(base + ".scales", 0, a // group, b // group))
    q, z, s = awq_unpacked(t)
    short = size - (b - a)
    if short > 0:
        pad = (0, 0, 0, short) if dim == 0 else (0, short)
        q = torch.nn.functional.pad(q, pad)
        small = pad if dim == 0 else (0, short // group)
        z, s = torch.nn.functional.pad(z, small), torch.nn.functional.pad(s, small)
    return q, z, s


def _fill(model: Transformer, read: Reader, names: set[str] | None, awq: bool = False) -> None:
    """Copy every local tensor of `model` from `read`, fusing and zero-padding as documented
    (awq: the projections are an AWQ checkpoint's, `_awq_slice`)."""
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
            def weight(proj: str, dim: int, rng: tuple[int, int], unit: int, size: int, p: str = p):
                if awq:
                    return _awq_slice(read, p + proj, dim, rng[0] * unit, rng[1] * unit, size * unit, spec.group_size)
                return get(f"{p}{proj}.weight", dim, rng, unit, size)

            def fused(*parts):
                """Projections stacked along their outputs: the fused GEMM weight."""
                if awq:
                    return from_parts(*(torch.cat(t, dim=0) for t in zip(*parts, strict=True)))
                return torch.cat(parts, dim=0)

            def qkv_bias(p: str = p) -> torch.Tensor:
                return torch.cat([get(f"{p}self_attn.q_proj.bias", 0, sl.q, hd, sh.q_heads),
                                  get(f"{p}self_attn.k_proj.bias", 0, sl.kv, hd, sh.kv_heads),
                                  get(f"{p}self_attn.v_proj.bias", 0, sl.kv, hd, sh.kv_heads)], dim=0)  # fmt: skip

            model.set_gemm_weight(layer, "wqkv", fused(weight("self_attn.q_proj", 0, sl.q, hd, sh.q_heads),
                                                       weight("self_attn.k_proj", 0, sl.kv, hd, sh.kv_heads),
                                                       weight("self_attn.v_proj", 0, sl.kv, hd, sh.kv_heads)))
            if layer.bqkv is not None:
                layer.bqkv.copy_(qkv_bias())
            model.set_gemm_weight(layer, "wo", fused(weight("self_attn.o_proj", 1, sl.q, hd, sh.q_heads)))
            model.set_gemm_weight(layer, "w13", fused(weight("mlp.gate_proj", 0, sl.ffn, 1, sh.ffn),
                                                      weight("mlp.up_proj", 0, sl.ffn, 1, sh.ffn)))
            model.set_gemm_weight(layer, "w2", fused(weight("mlp.down_proj", 1, sl.ffn, 1, sh.ffn)))
        if model.lm_head is not model.embed:
            if spec.tie_embeddings or (names is not None and "lm_head.weight" not in names):
                rows = model.embed[sl.vocab[0] : sl.vocab[1]]  # this rank's rows of the tied matrix
                head = torch.zeros(sh.vocab, spec.hidden, device=model.device, dtype=model.dtype)
                head[: rows.shape[0]] = rows
            else:
                head = get("lm_head.weight", 0, sl.vocab, 1, sh.vocab)
            model.set_gemm_weight(model, "lm_head", head)


RTN_GROUPS = (128, 64, 32)  # quantizing while loading: the first that divides every K of the shard


def rtn_group_size(spec: ModelSpec, tp: int) -> int:
    """The group size of int4 quantization while loading: 128 (AWQ's usual) where it divides the
    inputs of every projection of a TP-`tp` shard, else 64, else 32 (SmolLM2-135M's hidden 576
    takes 64); UserError when none does."""
    sh = spec.shard(tp)
    ks = (spec.hidden, sh.q_heads * spec.head_dim, sh.ffn)
    for g in RTN_GROUPS:
        if all(k % g == 0 for k in ks):
            return g
    raise UserError(f"{spec.name} at TP {tp}: no int4 group size of {', '.join(map(str, RTN_GROUPS))} divides the "
                    f"projections' inputs {', '.join(map(str, ks))}: use another TP degree")


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
    num_layers: int | None = None,
    kernels: KernelConfig | None = None,
) -> Transformer:
    """The model of one TP rank. `path_or_name`: checkpoint folder or bundled name (random only).

    weights: "checkpoint" or "random" (module docstring); seed: the random weights' seed.
    num_layers: keep only the first n decoder layers (latency work on a slice of a big model).
    kernels: how every op runs (None: `KernelConfig.resolve(device, tp_size=tp_size)`, the runtime's
    defaults). Its weight_format "fp8" stores the GEMM weights as weight-only float8_e4m3fn with
    per-row scales, quantized while filling (`Transformer.set_gemm_weight`): a different model, so
    no verb defaults to it; "int4" stores them as W4A16 (`kernels.int4`), quantized round-to-nearest
    while filling, or an AWQ checkpoint's own (such a checkpoint always loads as int4: a native
    kernel config is switched to int4, fp8 is an error). With its fold_norm the norm weights are
    folded into the GEMM weights once those are read (`Transformer.fold_norms`).
    The returned model carries `model.weights` = "checkpoint" | "random" and `model.kernels` for
    labelling outputs.
    """
    if weights not in WEIGHT_KINDS:
        raise UserError(f"weights must be one of {', '.join(WEIGHT_KINDS)}, got {weights!r}")
    if not 0 <= tp_rank < tp_size:
        raise UserError(f"tp_rank {tp_rank} is outside 0..{tp_size - 1}")
    if kernels is None:
        kernels = KernelConfig.resolve(device, tp_size=tp_size)
    folder = resolve_model_path(path_or_name)
    spec = ModelSpec.from_config(folder, dtype_bytes=_DTYPE_BYTES.get(dtype, 2))
    if num_layers is not None:
        if not 1 <= num_layers <= spec.num_layers:
            raise UserError(f"num_layers must be in 1..{spec.num_layers}, got {num_layers}")
        spec = dataclasses.replace(spec, num_layers=num_layers)
    awq = weights == "checkpoint" and spec.weight_format == "int4"
    if awq and kernels.weight_format == "fp8":
        raise UserError(f"{folder} is an AWQ int4 checkpoint: load it with weight format int4, not fp8")
    if awq and kernels.weight_format == "native":
        kernels = dataclasses.replace(kernels, weight_format="int4", fold_norm=False)
    if weights == "checkpoint":
        read, names = _checkpoint_reader(folder, spec)
    else:
        read, names = _random_reader(spec, tp_rank, seed, torch.device(device), dtype), None
    spec = dataclasses.replace(spec, weight_format=kernels.weight_format)
    if kernels.weight_format == "int4" and not awq:
        spec = dataclasses.replace(spec, group_size=rtn_group_size(spec, tp_size))
    model = Transformer(spec, tp_rank=tp_rank, tp_size=tp_size, group=group, device=device, dtype=dtype,
                        kernels=kernels)
    _fill(model, read, names, awq=awq)
    if kernels.fold_norm:  # the norm weights fold into the GEMM weights, so after those are read
        model.fold_norms()
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
