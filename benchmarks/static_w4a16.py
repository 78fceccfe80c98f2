"""What ptxas makes of the W4A16 skinny linear on Hopper, on a machine without a GPU.

    python benchmarks/static_w4a16.py [--out DIR]        # CPU only, ~1 minute

Compiles `gemv._skinny_dot_kernel` with int4 weights for sm_90 (Triton's own ptxas) at several
launch shapes and reports, per shape: registers per thread, local-memory spill instructions (any
spill in the K loop costs far more than the weight bytes saved), shared memory, and the K loop's
SASS instructions per weight (loop instructions per warp x warps / weights per tile). A kernel
whose warps need more instructions per weight than 4 schedulers x SMs x clock issue in one
weight's copy time is bound by issue, not bytes: on an H100 (132 SMs, 1.755 GHz, 2.98 TB/s copy,
0.53 bytes per int4 weight with its group's scale and zero) above ~0.165 per weight, by the
ratio beyond it. The bf16 path at 64 x 128 tiles is listed for comparison (2 bytes per weight:
~0.62 before it is issue-bound). Writes DIR/static_w4a16.csv with --out.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swiftspec.kernels import gemv as G  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
POINTERS = {"X": "*bf16", "S": "*fp32", "B": "*bf16", "Y": "*bf16", "P": "*fp32", "SQ": "*fp32", "RES": "*bf16",
            "NEW_RES": "*bf16", "COS": "*bf16", "SIN": "*bf16", "SLOTS": "*i64", "KC": "*bf16", "VC": "*bf16",
            "SZ": "*fp16", "ZP": "*fp16", "eps": "fp32"}
# name: (int4, rows (BLOCK_M), BLOCK_N, BLOCK_K, warps, split K, group)
SHAPES = {
    "bf16 64 x 128, 1-16 rows": (False, 16, 64, 128, 4, 4, 128),
    "int4 default, 1-16 rows": (True, 16, 128, 128, 8, 4, 128),
    "int4 default, 32 rows": (True, 32, 128, 128, 8, 1, 128),
    "int4 default, 64 rows": (True, 64, 128, 128, 8, 1, 128),
    "int4 default, 128 rows": (True, 128, 128, 128, 8, 1, 128),
    "int4 default, 256 rows": (True, 256, 128, 128, 8, 1, 128),
    "int4 64 x 4 warps, 1-16 rows": (True, 16, 64, 128, 4, 4, 128),
    "int4 64 x 4 warps, 128 rows": (True, 128, 64, 128, 4, 1, 128),
    "int4 bk256 (two groups a tile)": (True, 16, 128, 256, 8, 4, 128),
    "int4 group 64": (True, 16, 128, 128, 8, 4, 64),
}


def compile_shape(int4: bool, rows: int, bn: int, bk: int, warps: int, split: int, group: int, stages: int = 5):
    """The compiled kernel (Triton's CompiledKernel) for sm_90a."""
    fn = G._skinny_dot_kernel
    const = dict(INT4=int4, GROUP=group, HAS_BIAS=False, HAS_SCALE=False, IEEE=False, UPCAST=False, F16=False,
                 X_F16=False, SPLIT_K=split, RMS=False, HAS_RES=False, SWIGLU=False, ROPE=False, HALF=1, BLOCK_M=rows,
                 BLOCK_N=bn, BLOCK_K=bk, PDL=0)
    ptr = {**POINTERS, "W": "*i32" if int4 else "*bf16"}
    sig = {a: "constexpr" if a in const else ptr.get(a, "i32") for a in fn.arg_names}
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(a),): v for a, v in const.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})


def sass_facts(kernel) -> dict:
    """Registers, stack, spill and K-loop instruction counts from the cubin's SASS."""
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        sass = subprocess.run([BIN / "cuobjdump", "-sass", cubin], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([BIN / "cuobjdump", "-res-usage", cubin], capture_output=True, text=True, check=True).stdout
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4})\*/\s+([^;]*);", sass)]
    loop = []
    for addr, text in ins:  # the K loop: the body of the longest backward branch
        t = re.search(r"BRA.*?0x([0-9a-f]+)", text)
        if t and int(t.group(1), 16) < addr:
            body = [x for a, x in ins if int(t.group(1), 16) <= a <= addr]
            loop = body if len(body) > len(loop) else loop
    ops = collections.Counter(x.split()[1 if x.startswith("@") else 0].split(".")[0] for x in loop)
    return {"registers": int(res.split("REG:")[1].split()[0]), "stack_bytes": int(res.split("STACK:")[1].split()[0]),
            "spill_instructions": sass.count("STL") + sass.count("LDL"), "shared_bytes": kernel.metadata.shared,
            "loop_instructions": len(loop), "loop_conversions": ops["I2F"] + ops["I2FP"] + ops["F2F"] + ops["F2FP"],
            "loop_mma": ops["HGMMA"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for static_w4a16.csv")
    a = ap.parse_args()
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    rows = []
    for name, (int4, m, bn, bk, warps, split, group) in SHAPES.items():
        facts = sass_facts(compile_shape(int4, m, bn, bk, warps, split, group))
        per_weight = facts["loop_instructions"] * warps / (bn * bk)
        rows.append({"shape": name, "rows": m, "block_n": bn, "block_k": bk, "warps": warps, "group": group, **facts,
                     "instructions_per_weight": round(per_weight, 3)})
        print(f"{name:32s} regs {facts['registers']:3d} spills {facts['spill_instructions']:4d} "
              f"loop {facts['loop_instructions']:4d} instr ({per_weight:.3f} per weight)", flush=True)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(out / "static_w4a16.csv", index=False)


if __name__ == "__main__":
    main()
