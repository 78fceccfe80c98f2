"""Compile tree attention (Triton and Gluon) and the skinny linear for a GPU on any machine (no GPU
needed) and read what they will cost: shared memory, registers, spills.

Triton compiles for a named target with its bundled ptxas, so a CPU-only machine can check a tile
before any device time is spent on it. The JIT specializes integer arguments divisible by 16 and
16-byte-aligned pointers (`tt.divisibility`), and that specialization is what lets the pipeliner
turn the K/V loads into asynchronous copies with multi-buffered shared memory; so the check
declares it for the pointers, strides and max_len, as a real launch at D 128 gets it. With it the
shared-memory numbers equal those an H200 launch (Triton 3.6) reports for a tile it refuses
(BLOCK_M 64 x BLOCK_N 128 x 3 stages at D 128: 278528 bytes; BLOCK_M 128 x BLOCK_N 128 x 3 stages at
D 64: 245760 bytes). Without it they are 2.4x lower and meaningless.

Under TRITON_INTERPRET=1 (the CPU test runs) `@triton.jit` functions are interpreted and cannot
be compiled, so `tree_attention_reports`, `gemv_reports` and `ws_attention_reports` then compile in
one child process without it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import mangle_type

from swiftspec.kernels import interpreting
from swiftspec.kernels import tree_attention_ws as ws
from swiftspec.kernels.gemv import DotConfig, GemvLaunch, _skinny_dot_kernel, int4_x_ahead_on
from swiftspec.kernels.tree_attention import TreeAttentionConfig, _tree_attn_kernel

# Hopper's per-block shared memory limit (what Triton compares against: 227 KiB).
SM90_SHARED_LIMIT = 232448

_POINTERS = ("Q", "K", "V", "KD", "VD", "PREFIX", "MASKW", "OUT", "PART_ML", "PART_ACC", "COUNTERS")
_DIVISIBLE = (*_POINTERS, "MAX_LEN", "stride_qt", "stride_qh", "stride_kh", "stride_kn", "stride_vh", "stride_vn",
              "stride_ot", "stride_oh")
_INTS = ("T", "N", "MAX_LEN", "NUM_SPLITS", "stride_qt", "stride_qh", "stride_kh", "stride_kn", "stride_vh",
         "stride_vn", "stride_mt", "stride_ot", "stride_oh")


@dataclass(frozen=True)
class CompileReport:
    """What one compiled kernel needs per program: shared memory (bytes), registers per thread,
    spill stack (bytes per thread); `fits` = shared memory within the target's limit."""

    shared_bytes: int
    registers: int
    spill_bytes: int
    fits: bool


def _ptxas_dir() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def available() -> bool:
    """Whether this Triton can compile for NVIDIA targets here (its bundled ptxas and cuobjdump)."""
    return all(os.path.exists(os.path.join(_ptxas_dir(), t)) for t in ("ptxas", "cuobjdump"))


def tree_attention_reports(items: Sequence[tuple[TreeAttentionConfig, int, int]], dtype: str = "bf16",
                           capability: int = 90) -> list[CompileReport]:
    """Compile `_tree_attn_kernel` once per (cfg, head_dim, group) for sm_<capability> (split-KV
    partials when cfg.num_splits > 1, separate combine) and report each one's resources.
    dtype: "bf16", "fp16" or "fp32" (Triton type names)."""
    if not interpreting():
        return [_report(cfg, d, g, dtype, capability) for cfg, d, g in items]
    return _in_child("tree_attention", [[dataclasses.asdict(c), d, g] for c, d, g in items], dtype, capability)


def gemv_reports(items: Sequence[tuple[DotConfig, bool, str]], dtype: str = "bf16",
                 capability: int = 90, int4_group: int = 0, combine: bool = False) -> list[CompileReport]:
    """Compile the skinny linear's dot kernel once per (launch shape, rms, epilogue) (`gemv.dot_config`;
    rms: the RMSNorm kind with a residual, `gemv(rms_eps=, residual=)`; epilogue "", "swiglu"
    (`gemv(act="swiglu")`) or "rope" (`gemv(rope=...)`, head dim 128)) with weights and x in `dtype`;
    int4_group > 0: int4 weights of that group size (`kernels.int4.Int4Weight`) and x in `dtype`;
    combine: split-K partials summed in the launch (`GemvLaunch.combine` "kernel")."""
    if not interpreting():
        return [resources(compile_gemv(cfg, rms, epi, dtype, capability, int4_group, combine=combine))
                for cfg, rms, epi in items]
    return _in_child("gemv", [[dataclasses.asdict(c), r, e] for c, r, e in items], dtype, capability,
                     int4_group=int4_group, combine=combine)


def gemv_prefetch_facts(items: Sequence[tuple[DotConfig, str, int, int, int]], capability: int = 90) -> list[dict]:
    """PDL "prefetch" in the skinny linear's PTX, per (launch shape, epilogue, int4 group (0: bf16
    weights), pdl constexpr, PF_LINES): {"l2_prefetches": `prefetch.global.L2` instructions per
    thread, "before_wait": all of them before the grid's wait (griddepcontrol.wait)}."""
    if interpreting():
        return _in_child("gemv_prefetch", [[dataclasses.asdict(c), *rest] for c, *rest in items], "bf16", capability,
                         raw=True)
    out = []
    for cfg, epilogue, group, pdl, lines in items:
        ptx = compile_gemv(cfg, False, epilogue, "bf16", capability, group, pdl=pdl, pf_lines=lines).asm["ptx"]
        body = ptx[ptx.index(".entry"):]
        n = body.count("prefetch.global.L2")
        wait = body.find("griddepcontrol.wait")
        out.append({"l2_prefetches": n, "before_wait": n == 0 or 0 <= body.rindex("prefetch.global.L2") < wait})
    return out


@dataclass(frozen=True)
class WsCompileReport:
    """`ws_attention_reports`: the compile report plus what the PTX holds: register reallocation
    between partitions (setmaxnreg up and down), wgmma, TMA copies, griddepcontrol (PDL)."""

    report: CompileReport
    setmaxnreg: bool
    wgmma: bool
    tma: bool
    griddepcontrol: bool


def ws_attention_reports(items: Sequence[tuple[int, int, int, int, bool, bool]],
                         capability: int = 90) -> list[WsCompileReport]:
    """Compile the Gluon tree attention (`tree_attention_ws._ws_attn_kernel`, bf16) once per
    (block_n, stages, head_dim, group, q_smem, pdl) for sm_<capability>, with K/V
    descriptors as a launch builds them and 16-divisible pointers and strides."""
    if not interpreting():
        return [_ws_report(*item, capability) for item in items]
    out = _in_child("ws", [list(i) for i in items], "bf16", capability, raw=True)
    return [WsCompileReport(CompileReport(**r.pop("report")), **r) for r in out]


def _ws_report(block_n: int, stages: int, head_dim: int, group: int, q_smem: bool, pdl: bool,
               capability: int) -> WsCompileReport:
    if ws.GLUON_ERROR:
        raise RuntimeError(f"no Gluon here: {ws.GLUON_ERROR}")
    from triton.experimental.gluon._runtime import GluonASTSource  # experimental: absent without Gluon
    cache = torch.zeros(8 * 1024, head_dim, dtype=torch.bfloat16)  # only its shape, strides and dtype matter
    layout = ws.gl.NVMMASharedLayout.get_default_for([block_n, head_dim], ws.gl.bfloat16)
    desc = mangle_type(ws.TensorDescriptor.from_tensor(cache, [block_n, head_dim], layout))
    fn = ws._ws_attn_kernel
    names = list(inspect.signature(fn.fn).parameters)
    constexprs = {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_N": block_n, "STAGES": stages, "Q_SMEM": q_smem,
                  "PDL": pdl}
    signature = {"Q": "*bf16", "KD": desc, "VD": desc, "PREFIX": "*i32", "MASKW": "*i32", "PART_ML": "*fp32",
                 "PART_ACC": "*fp32", "scale_log2": "fp32",
                 **dict.fromkeys(("T", "N", "MAX_LEN", "NUM_SPLITS", "stride_qt", "stride_qh", "stride_mt"), "i32"),
                 **dict.fromkeys(constexprs, "constexpr")}
    divisible = ("Q", "PREFIX", "MASKW", "PART_ML", "PART_ACC", "MAX_LEN", "stride_qt", "stride_qh")
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    kernel = triton.compile(GluonASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", capability, 32), options={"num_warps": 4})
    ptx = kernel.asm["ptx"]
    report = resources(kernel)
    return WsCompileReport(report, "setmaxnreg.inc" in ptx and "setmaxnreg.dec" in ptx, "wgmma.mma_async" in ptx,
                           "cp.async.bulk.tensor" in ptx, "griddepcontrol.wait" in ptx)


def _in_child(kernel: str, items: list, dtype: str, capability: int, raw: bool = False, int4_group: int = 0,
              combine: bool = False) -> list:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    job = {"kernel": kernel, "dtype": dtype, "capability": capability, "items": items, "int4_group": int4_group,
           "combine": combine}
    done = subprocess.run([sys.executable, "-m", "swiftspec.kernels.compile_check"], input=json.dumps(job), env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"compile_check child failed: {done.stderr[-1000:]}")
    # the child's stdout may carry other libraries' chatter: the answer is its last line
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    return rows if raw else [CompileReport(**r) for r in rows]


@functools.lru_cache(maxsize=256)
def compile_gemv(cfg: DotConfig, rms: bool, epilogue: str, dtype: str = "bf16", capability: int = 90,
                 int4_group: int = 0, int4_x_ahead: bool | None = None, pdl: int = 0, pf_lines: int = 0,
                 combine: bool = False):
    """The skinny linear's dot kernel compiled for sm_<capability> (`gemv_reports`' arguments;
    int4_x_ahead: `GemvLaunch.int4_x_ahead`, None: what `gemv` picks for cfg.block_m; pdl:
    `pdl.pdl_mode`'s constexpr, pf_lines: its `PF_LINES` under PDL "prefetch"; combine: the split-K
    sum in the launch, `GemvLaunch.combine` "kernel"), as Triton's
    CompiledKernel: `asm["cubin"]` holds the machine code. Not under TRITON_INTERPRET=1."""
    names = list(inspect.signature(_skinny_dot_kernel.fn).parameters)
    pointers = ("X", "W", "S", "B", "Y", "P", "SQ", "CNT", "RES", "NEW_RES", "COS", "SIN", "SLOTS", "KC", "VC", "SZ",
                "ZP")
    ints = ("M", "N", "K", "stride_x", "stride_w", "stride_y", "stride_r", "stride_cos", "stride_kc_h", "stride_kc_s",
            "stride_vc_h", "stride_vc_s", "HQ", "HKV", "stride_s")
    constexprs = {"INT4": int4_group > 0, "GROUP": max(int4_group, 1), "EVEN_K": True, "PTX": int4_group > 0, "X_AHEAD": int4_group > 0 and int4_x_ahead_on(GemvLaunch(int4_x_ahead=int4_x_ahead), cfg.block_m), "HAS_BIAS": False, "HAS_SCALE": False,
                  "IEEE": dtype == "fp32", "UPCAST": False, "F16": False, "X_F16": False, "SPLIT_K": cfg.split_k, "RMS": rms, "HAS_RES": rms, "SWIGLU": epilogue == "swiglu",
                  "ROPE": epilogue == "rope", "HALF": 64, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                  "BLOCK_K": cfg.block_k, "PDL": pdl, "PF_LINES": pf_lines, "COMBINE": combine and cfg.split_k > 1}
    types = {"S": "*fp32", "P": "*fp32", "SQ": "*fp32", "CNT": "*i32", "SLOTS": "*i64"}
    if int4_group:
        types.update(W="*i32", SZ="*fp16", ZP="*fp16")
    signature = {**{p: types.get(p, f"*{dtype}") for p in pointers},
                 "eps": "fp32", **dict.fromkeys(ints, "i32"), **dict.fromkeys(constexprs, "constexpr")}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in (*pointers, *ints[1:])}  # M (rows) is not
    return triton.compile(ASTSource(fn=_skinny_dot_kernel, signature=signature, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


@functools.lru_cache(maxsize=256)
def _report(cfg: TreeAttentionConfig, head_dim: int, group: int, dtype: str, capability: int) -> CompileReport:
    names = list(inspect.signature(_tree_attn_kernel.fn).parameters)
    ptr_types = {n: "*fp32" if n.startswith("PART_") else "*i32" if n in ("PREFIX", "MASKW", "COUNTERS") else f"*{dtype}"
                 for n in _POINTERS}
    constexprs = {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
                  "SPLIT": cfg.num_splits > 1, "IEEE": dtype == "fp32", "DOT_F32": False, "IN_KERNEL_COMBINE": False,
                  "SPLITS_P2": 1, "PDL": False, "TMA": False}
    signature = {**ptr_types, "scale_log2": "fp32", **dict.fromkeys(_INTS, "i32"),
                 **dict.fromkeys(constexprs, "constexpr")}
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in _DIVISIBLE}
    return _compiled_report(_tree_attn_kernel, signature, constexprs, attrs, cfg.num_warps, cfg.num_stages,
                            capability)


def _compiled_report(fn, signature: dict, constexprs: dict, attrs: dict, num_warps: int, num_stages: int,
                     capability: int) -> CompileReport:
    kernel = triton.compile(
        ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs),
        target=GPUTarget("cuda", capability, 32), options={"num_warps": num_warps, "num_stages": num_stages},
    )
    return resources(kernel)


def resources(kernel) -> CompileReport:
    """Shared memory (Triton's metadata), registers and spill stack (cuobjdump) of a compiled kernel."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(_ptxas_dir(), "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    if m is None:
        raise RuntimeError(f"cuobjdump gave no resource line: {usage[-300:]}")
    shared = int(kernel.metadata.shared)
    return CompileReport(shared, int(m.group(1)), int(m.group(2)), shared <= SM90_SHARED_LIMIT)


if __name__ == "__main__":  # the child of the *_reports functions under TRITON_INTERPRET=1
    job = json.load(sys.stdin)
    if job["kernel"] == "ws":
        print(json.dumps([dataclasses.asdict(r)
                          for r in ws_attention_reports([tuple(i) for i in job["items"]], job["capability"])]))
        sys.exit(0)
    if job["kernel"] == "gemv_prefetch":
        print(json.dumps(gemv_prefetch_facts([(DotConfig(**c), *rest) for c, *rest in job["items"]], job["capability"])))
        sys.exit(0)
    if job["kernel"] == "gemv":
        reports = gemv_reports([(DotConfig(**c), r, e) for c, r, e in job["items"]], job["dtype"], job["capability"],
                               job.get("int4_group", 0), job.get("combine", False))
    else:
        reports = tree_attention_reports([(TreeAttentionConfig(**c), d, g) for c, d, g in job["items"]],
                                         job["dtype"], job["capability"])
    print(json.dumps([dataclasses.asdict(r) for r in reports]))
