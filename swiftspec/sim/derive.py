"""A profile for a GPU you do not have, from one you measured (`swiftspec profile derive`).

Every measured row is split into the part bound by bytes or by math and the rest, and each part
is scaled by the ratio of the two GPUs' numbers (`HardwareSpec`):

    bytes part  Tb = bytes / B      math part  Tm = flops / F      bound = max(Tb, Tm)
    rest        R  = ms - bound     (launches, gaps, what the kernels leave of the bandwidth)
    ms'         =  max(Tb * B/B', Tm * F/F') + R * L'/L

(B memory bandwidth a copy reaches, F dense bf16 rate, L launch time). `bytes` and `flops` come
from the model's shapes at the row's tokens, KV length and TP shard (`row_work`), so the split
needs no fit: the floors are the parts the GPU's numbers bound, and what the kernels lose beyond
them is assumed to cost the same time on both GPUs (same SMs and clocks between Hopper parts; a
spec with other launch times scales it). A row measured below its floor (a work model that
over-counts) is scaled by the floors' ratio alone. Collectives split the same way into bytes over
the link and a latency rest. Host rows are the host machine's and are copied; weight-only fp8
GEMMs still run on bf16 tensor cores, so the bf16 rate scales their math. Every derived profile
says `derived from <source> for <spec>` in its label.

`plan --hardware NAME|FILE` plans for a GPU you do not have (`hardware_profile_ref`): its best
bundled profile where `GPUS` names one, else a profile derived from `FALLBACK_PROFILE` when it is
loaded (`hardware:SPEC`, `load_derived`); nothing is written.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from swiftspec.sim.hardware import (
    FALLBACK_PROFILE,
    GPUS,
    PREFIX,
    HardwareSpec,
    bundled_profile,
    bundled_specs,
    gpu_of,
    resolve_spec,
)
from swiftspec.spec import ModelSpec, Profile, SourceRef, UserError, file_sha256, profile_path

# a profile reference derived when loaded: hardware:SPEC (builtin:NAME or a spec file)
HARDWARE = "hardware:"

# ops whose work scales with the model's shapes; everything else (host) is copied
SCALED_OPS = ("forward", "layers", "embed", "lm_head", "tree_growth", "kv_compact")


@functools.lru_cache(maxsize=64)
def _spec(model: str, dtype_bytes: int, weight_format: str) -> ModelSpec:
    try:
        spec = ModelSpec.from_config(model, dtype_bytes=dtype_bytes)
    except UserError:
        raise UserError(f"the profile's model {model!r} is neither bundled nor a checkpoint folder here: "
                        "derive needs its config.json for the bytes and flops of its rows") from None
    return dataclasses.replace(spec, weight_format=weight_format)


def row_work(op: str, spec: ModelSpec, tp: int, tokens: int, kv_len: float) -> tuple[float, float]:
    """(bytes moved, flops) of one row of `op` for `spec` on one TP rank: weights and KV read by
    the forward's layers; the LM head's weights; the logits tree growth reads; the K/V that
    `kv_compact` moves (`tokens` = slots)."""
    s = spec.shard(tp)
    hd, h = spec.head_dim, spec.hidden
    gemm = sum(n * k for n, k in spec.linear_shapes(tp).values())  # weights per layer
    kv = kv_len * spec.kv_bytes_per_token(tp)
    layer_bytes = spec.num_layers * spec.layer_weight_bytes(tp) + kv
    layer_flops = spec.num_layers * (2 * tokens * gemm + 4 * tokens * kv_len * s.q_heads * hd)
    head_bytes, head_flops = s.vocab * h * spec.dtype_bytes, 2 * tokens * h * s.vocab
    if op == "layers":
        return layer_bytes, layer_flops
    if op == "forward":
        return layer_bytes + head_bytes, layer_flops + head_flops
    if op == "lm_head":
        return head_bytes, head_flops
    if op == "embed":
        return tokens * h * spec.dtype_bytes, 0.0
    if op == "tree_growth":
        return 4.0 * tokens * s.vocab, 4.0 * tokens * s.vocab
    if op == "kv_compact":
        return 2.0 * tokens * spec.kv_bytes_per_token(tp), 0.0
    raise ValueError(f"no work model for op {op!r}")


def scale_row(ms: float, bytes_: float, flops: float, src: HardwareSpec, dst: HardwareSpec) -> float:
    """One compute row's ms on `dst` (module docstring)."""
    tb, tm = bytes_ / (src.hbm_tb_s * 1e9), flops / (src.bf16_tflops * 1e9)  # ms
    bound = max(tb, tm)
    new = max(tb * src.hbm_tb_s / dst.hbm_tb_s, tm * src.bf16_tflops / dst.bf16_tflops)
    if bound <= 0:
        return ms * dst.launch_us / src.launch_us
    if ms < bound:
        return ms * new / bound
    return new + (ms - bound) * dst.launch_us / src.launch_us


def scale_comm(ms: float, bytes_: float, src: HardwareSpec, dst: HardwareSpec) -> float:
    """One collective's ms on `dst`: bytes over the link, the rest as latency."""
    tb = bytes_ / (src.link_gb_s * 1e6)
    if ms < tb:
        return ms * src.link_gb_s / dst.link_gb_s
    return tb * src.link_gb_s / dst.link_gb_s + (ms - tb) * dst.link_us / src.link_us


def derive_profile(source: Profile, src_hw: HardwareSpec, dst_hw: HardwareSpec, source_ref: str) -> Profile:
    """`source` (measured on `src_hw`) scaled to `dst_hw` (module docstring). source_ref: how the
    output names the source (a path or builtin:NAME)."""
    if (src_hw.source == "calibrated") != (dst_hw.source == "calibrated"):
        cal, other = (src_hw, dst_hw) if src_hw.source == "calibrated" else (dst_hw, src_hw)
        raise UserError(f"{cal.name} is calibrated and {other.name} is not ({other.source}): a calibration measures "
                        "achieved matmul rates and launch times, a datasheet states peaks, so their ratios would scale "
                        "every row wrongly; give both GPUs' calibrations (`swiftspec profile derive --hardware A "
                        "--source-hardware B`) or neither")
    meta = source.meta
    dtype_bytes = 4 if meta.get("dtype") == "float32" else 2
    weight_format = meta.get("weight_format", "native")
    compute = source.compute.copy()
    ratio = np.ones(len(compute))
    fits: dict[str, int] = {}
    for i, r in enumerate(compute.itertuples(index=False)):
        if r.op in SCALED_OPS:
            b, f = row_work(r.op, _spec(str(r.model), dtype_bytes, weight_format), int(r.tp), int(r.tokens),
                            float(r.kv_len))
            ratio[i] = scale_row(float(r.ms), b, f, src_hw, dst_hw) / float(r.ms) if r.ms > 0 else 1.0
            fits[r.op] = fits.get(r.op, 0) + 1
    _apply(compute, ratio)
    comm = source.comm.copy()
    if len(comm):
        cr = np.array([scale_comm(float(ms), float(b), src_hw, dst_hw) / float(ms) if ms > 0 else 1.0
                       for ms, b in zip(comm["ms"], comm["bytes"])])
        _apply(comm, cr)
    new_meta = {k: v for k, v in meta.items() if k not in ("date", "command", "host", "driver", "memory_bytes")}
    new_meta.update(
        source="derived",
        derived_from={"profile": source_ref, "label": source.base_label, "hardware": src_hw.to_dict()},
        hardware=dst_hw.to_dict(),
        gpu=dst_hw.name,
        graph_buckets=meta.get("device", "cuda") == "cuda" and meta.get("source") == "measured",
        derived_rows=fits,
        notes=[__doc__.split("\n\n")[1].replace("\n", " ").strip(),
               "host rows: copied from the source (the host machine's, not the GPU's)"],
    )
    if meta.get("memory_bytes"):
        new_meta["memory_bytes"] = int(float(meta["memory_bytes"]) * dst_hw.hbm_gib / src_hw.hbm_gib)
    prof = Profile(compute.reset_index(drop=True), comm.reset_index(drop=True), new_meta)
    prof.validate("derived profile")
    return prof


def _apply(table, ratio: np.ndarray) -> None:
    """Scale the table's ms (and its p10 / p90 where present) by `ratio`, row by row."""
    for col in ("ms", "p10", "p90"):
        if col in table.columns:
            table[col] = table[col].astype(float) * ratio


def source_hardware_of(profile: Profile) -> str:
    """The bundled spec of the GPU a profile was measured on (its meta `gpu`; `GPUS`), as builtin:NAME."""
    gpu = str(profile.meta.get("gpu", ""))
    row = gpu_of(gpu)
    if row is None:
        raise UserError(f"no bundled hardware spec for the profile's GPU {gpu!r}: give --source-hardware FILE")
    return f"{PREFIX}{row.spec}"


def hardware_names() -> list[str]:
    """What `plan --hardware` takes by name: the GPUs of `GPUS`, then bundled specs beyond them."""
    names = [g.name for g in GPUS]
    return names + [n for n in bundled_specs() if n not in names]


def hardware_profile_ref(text: str, models: Sequence[str] = ()) -> str:
    """The profile `plan --hardware TEXT` plans from: the GPU's best bundled profile (builtin:NAME,
    one with rows of `models` where there is one: `bundled_profile`) where `GPUS` names one, else
    `hardware:SPEC`, derived from `FALLBACK_PROFILE` when loaded (`load_derived`). TEXT: a name
    (`hardware_names`), builtin:NAME, or a spec JSON file, checked here (one line when it is none
    of them)."""
    name = text[len(PREFIX):] if text.startswith(PREFIX) else text
    row = next((g for g in GPUS if name in (g.name, g.spec)), None)
    if row is not None:
        return bundled_profile(row, models) or f"{HARDWARE}{PREFIX}{row.spec}"
    if name in bundled_specs():
        return f"{HARDWARE}{PREFIX}{name}"
    if not text.startswith(PREFIX) and Path(text).is_file():
        HardwareSpec.load(text)  # a bad spec is one line now, before any work
        return f"{HARDWARE}{text}"
    what = f"hardware spec {text} does not exist" if "/" in text or text.endswith(".json") else \
        f"unknown --hardware {text!r}"
    raise UserError(f"{what}: choose {', '.join(hardware_names())} (bundled) or give a spec JSON file (the fields "
                    "of `swiftspec profile derive --help`)")


def load_derived(ref: str) -> tuple[Profile, SourceRef]:
    """A `hardware:SPEC` reference as a profile: `FALLBACK_PROFILE` derived in memory for SPEC,
    and its SourceRef (path `ref`; hash of the source profile and the spec; the derived label)."""
    spec_ref = ref[len(HARDWARE):]
    dst = HardwareSpec.load(spec_ref)
    source = f"{PREFIX}{FALLBACK_PROFILE}"
    src = Profile.load(source)
    prof = derive_profile(src, HardwareSpec.load(source_hardware_of(src)), dst, source)
    sha = hashlib.sha256((file_sha256(profile_path(source)) + file_sha256(resolve_spec(spec_ref))).encode())
    return prof, SourceRef(path=ref, sha256=sha.hexdigest(), label=prof.label)
