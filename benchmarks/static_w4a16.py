"""What ptxas makes of the W4A16 skinny linear on Hopper, on a machine without a GPU.

    python benchmarks/static_w4a16.py [--out DIR]        # CPU only, ~1 minute

Compiles `gemv._skinny_dot_kernel` with int4 weights for sm_90 (`kernels.compile_check`, Triton's
own ptxas) at several launch shapes and reports, per shape: registers per thread, spill stack
(any spill in the K loop costs far more than the weight bytes saved), shared memory, and the K loop's
SASS instructions per weight (loop instructions per warp x warps / weights per tile). A kernel
whose warps need more instructions per weight than 4 schedulers x SMs x clock issue in one
weight's copy time is bound by issue, not bytes: on an H100 (132 SMs, 1.755 GHz, 2.98 TB/s copy,
0.53 bytes per int4 weight with its group's scale and zero) above ~0.165 per weight, by the
ratio beyond it. The bf16 path at 64 x 128 tiles is listed for comparison (2 bytes per weight:
~0.62 before it is issue-bound). The loop's global loads by kind: LDGSTS (asynchronous copies
into shared memory, which the pipeliner issues stages ahead) and LDG (into registers, waited for in
the same tile; the default x gather is one). Writes DIR/static_w4a16.csv with --out.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from swiftspec.kernels import compile_check  # noqa: E402
from swiftspec.kernels.gemv import DotConfig  # noqa: E402

# name: (int4 group (0: bf16 weights), rows (BLOCK_M), BLOCK_N, BLOCK_K, warps, split K,
#        x gathered a tile ahead (`GemvLaunch.int4_x_ahead`))
SHAPES = {
    "bf16 64 x 128, 1-16 rows": (0, 16, 64, 128, 4, 4, False),
    "int4 x gathered each tile, 1-16 rows": (128, 16, 64, 128, 4, 4, False),
    "int4 default (x one tile ahead), 1-16 rows": (128, 16, 64, 128, 4, 4, True),
    "int4 default (x one tile ahead), 32 rows": (128, 32, 128, 128, 8, 4, True),
    "int4 default (x one tile ahead), 64 rows": (128, 64, 128, 128, 8, 4, True),
    "int4 x gathered each tile, 64 rows": (128, 64, 128, 128, 8, 4, False),
    "int4 default, 128 rows": (128, 128, 128, 128, 8, 4, False),
    "int4 one 256-row tile": (128, 256, 128, 128, 8, 4, False),
    "int4 128 x 8 warps, 1-16 rows": (128, 16, 128, 128, 8, 4, False),
    "int4 64 x 4 warps, 128 rows": (128, 128, 64, 128, 4, 4, False),
    "int4 bk256 (two groups a tile)": (128, 16, 128, 256, 8, 4, False),
    "int4 group 64": (64, 16, 128, 128, 8, 4, False),
}


def loop_facts(kernel) -> dict:
    """The K loop (the body of the longest backward branch in the SASS): instructions per warp and
    the conversion and MMA instructions among them."""
    with tempfile.TemporaryDirectory() as d:
        cubin = Path(d) / "k.cubin"
        cubin.write_bytes(kernel.asm["cubin"])
        tool = Path(compile_check._ptxas_dir()) / "cuobjdump"
        sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    ins = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loop: list[str] = []
    for addr, text in ins:
        t = re.search(r"BRA.*?0x([0-9a-f]+)", text)
        if t and int(t.group(1), 16) < addr:
            body = [x for a, x in ins if int(t.group(1), 16) <= a <= addr]
            loop = body if len(body) > len(loop) else loop
    ops = collections.Counter(x.split()[1 if x.startswith("@") else 0].split(".")[0] for x in loop)
    return {"loop_instructions": len(loop), "loop_conversions": ops["I2F"] + ops["I2FP"] + ops["F2F"] + ops["F2FP"],
            "loop_mma": ops["HGMMA"], "loop_ldg": ops["LDG"], "loop_ldgsts": ops["LDGSTS"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for static_w4a16.csv")
    a = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)  # compiling needs the real JIT
    rows = []
    for name, (group, m, bn, bk, warps, split, ahead) in SHAPES.items():
        cfg = DotConfig(m, bn, bk, warps, 5, split)
        kernel = compile_check.compile_gemv(cfg, False, "", "bf16", 90, group, int4_x_ahead=ahead)
        res = compile_check.resources(kernel)
        facts = loop_facts(kernel)
        per_weight = facts["loop_instructions"] * warps / (bn * bk)
        rows.append({"triton": triton.__version__, "target": "sm_90", "shape": name, "rows": m, "block_n": bn, "block_k": bk, "warps": warps, "group": group,
                     "registers": res.registers, "spill_bytes": res.spill_bytes, "shared_bytes": res.shared_bytes,
                     **facts, "instructions_per_weight": round(per_weight, 3)})
        print(f"{name:32s} regs {res.registers:3d} spill {res.spill_bytes:5d} B  loop {facts['loop_instructions']:4d} "
              f"instr ({per_weight:.3f} per weight)", flush=True)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_csv(out / "static_w4a16.csv", index=False)


if __name__ == "__main__":
    main()
