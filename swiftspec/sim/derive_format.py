"""A profile for quantized weights on the same GPU, from one measured with native weights.

What changes when a model's GEMM weights shrink is the bytes its forwards must stream. Each
`forward` / `layers` row is split as `derive` splits it (bytes part, math part, rest), the bytes
part recomputed for the new format (`ModelSpec.layer_weight_bytes`: int4 is half a byte per
weight plus a float16 scale and zero point per group), the math part kept (W4A16 runs its products
on bf16 tensor cores) and the rest kept as time (launches, gaps and what the kernels leave of the
bandwidth: the same kernels launch the same number of times):

    ms' = max(bytes' / B, flops / F) + (ms - max(bytes / B, flops / F))

The other rows (embedding, LM head: AWQ keeps it in the model dtype; tree growth, KV moves, host,
collectives) do not depend on the GEMM weights and are copied. The result is labelled derived in
every output. It assumes the quantized kernels keep the native ones' share of the bandwidth; the
W4A16 kernel does not yet (an H100's measured int4 forwards, `h100-int4`, are 1.2-2.0x this
derivation of `h100-measured`), so for int4 it is a bound, not a forecast: the bundled
`h200-int4-derived` is scaled from the measured int4 rows instead (`sim/derive.py`).
"""

from __future__ import annotations

import numpy as np

from swiftspec.sim.derive import _apply, _spec, row_work
from swiftspec.sim.hardware import HardwareSpec
from swiftspec.spec import Profile, UserError

FORMAT_OPS = ("forward", "layers")  # the rows whose bytes are the GEMM weights


def derive_weight_format(source: Profile, weight_format: str, hw: HardwareSpec, source_ref: str) -> Profile:
    """`source` (native weights, measured on `hw`) as the same GPU running `weight_format` weights
    (module docstring). source_ref: how the output names the source (a path or builtin:NAME)."""
    meta = source.meta
    if meta.get("weight_format", "native") != "native":
        raise UserError(f"{source_ref} holds {meta['weight_format']} rows: derive a weight format from native rows")
    if weight_format == "native":
        raise UserError("the derived weight format must differ from the source's (native)")
    dtype_bytes = 4 if meta.get("dtype") == "float32" else 2
    compute = source.compute.copy()
    ratio = np.ones(len(compute))
    bw, rate = hw.hbm_tb_s * 1e9, hw.bf16_tflops * 1e9  # bytes and flops per ms
    for i, r in enumerate(compute.itertuples(index=False)):
        if r.op not in FORMAT_OPS or not r.ms > 0:
            continue
        args = (r.op, int(r.tp), int(r.tokens), float(r.kv_len))
        b, f = row_work(args[0], _spec(str(r.model), dtype_bytes, "native"), *args[1:])
        b_new, _ = row_work(args[0], _spec(str(r.model), dtype_bytes, weight_format), *args[1:])
        bound, bound_new = max(b / bw, f / rate), max(b_new / bw, f / rate)
        new = float(r.ms) * bound_new / bound if r.ms < bound else bound_new + (float(r.ms) - bound)
        ratio[i] = new / float(r.ms)
    _apply(compute, ratio)
    new_meta = {k: v for k, v in meta.items() if k not in ("date", "command", "host", "driver")}
    new_meta.update(
        source="derived", weight_format=weight_format,
        derived_from={"profile": source_ref, "label": source.base_label, "hardware": hw.to_dict()},
        hardware=hw.to_dict(), gpu=hw.name,
        graph_buckets=meta.get("device", "cuda") == "cuda" and meta.get("source") == "measured",
        derived_rows={op: int((compute["op"] == op).sum()) for op in FORMAT_OPS},
        notes=[__doc__.split("\n\n")[1].replace("\n", " ").strip(),
               "embed, lm_head, tree_growth, kv_compact, host and comm rows: copied from the source"],
    )
    prof = Profile(compute.reset_index(drop=True), source.comm.copy().reset_index(drop=True), new_meta)
    prof.validate("derived profile")
    return prof
