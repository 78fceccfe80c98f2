"""async vs serial vs autoregressive on ONE H200, random weights at real shapes, synthetic acceptance.

Llama-3-8B-shaped target, Llama-3.2-1B-shaped draft (bundled configs, random bf16 weights), the
bundled synthetic acceptance profile (swiftspec/data/acceptance, qwen2-72b-table7). The plan puts
the draft and the target on "GPUs" 0 and 1, which both map to the one visible GPU: two processes
share it and talk over gloo (NCCL refuses two ranks on one GPU), so the async numbers measure the
host side and the overlap the GPU allows when shared -- not the two-GPU speed the plan predicts.
Serial and autoregressive run in the same launch on that GPU (TP 1).

    python benchmarks/bench_async_gpu.py [--max-new-tokens 128] [--num-prompts 4] [--d 3] [--loop device]

Writes benchmarks/results/async_gpu_h200.json (run_metadata, plan, report, summary) and the run
log folder benchmarks/results/async_gpu_h200_runlog/, or async_gpu.json and runlog/ in `--out`.
`--loop device` runs every side's loop on the device (`runtime/device_async.py`). Budget: <= 4
minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from swiftspec.files import atomic_write_text, run_metadata
from swiftspec.run import RunOptions, format_report, run_plan
from swiftspec.sim.search import load_inputs, predict_plan
from swiftspec.spec import Mode, Plan, Split, TreePolicy

RESULTS = Path(__file__).parent / "results"


def make_plan(bs: int, w: int, d: int) -> Plan:
    """The async plan with the simulator's prediction (derived H200 profile, bundled acceptance)."""
    plan = Plan(target="Llama-3-8B", draft="Llama-3.2-1B", split=Split.disaggregated(1, 1), mode=Mode.async_,
                policy=TreePolicy(bs=bs, w=w, d=d), device="cuda", max_len=1024)
    try:
        inputs = load_inputs(plan.target, plan.draft, None, None, "cuda")
        res = predict_plan(plan, inputs)
        plan = dataclasses.replace(plan, prediction=res.summary.to_prediction(), profile=inputs.profile_ref,
                                   acceptance=inputs.acceptance_ref)
    except Exception as e:  # noqa: BLE001 -- the run still measures; the report shows "-"
        print(f"no prediction: {type(e).__name__}: {e}")
    return plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=4)
    ap.add_argument("--bs", type=int, default=8)
    ap.add_argument("--w", type=int, default=8)
    ap.add_argument("--d", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=200)
    ap.add_argument("--loop", choices=("host", "device"), default="host")
    ap.add_argument("--out", default=None, help="folder for async_gpu.json and runlog/ [default: results/, h200 names]")
    args = ap.parse_args()
    out_json = Path(args.out) / "async_gpu.json" if args.out else RESULTS / "async_gpu_h200.json"
    out_log = Path(args.out) / "runlog" if args.out else RESULTS / "async_gpu_h200_runlog"
    plan = make_plan(args.bs, args.w, args.d)
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        plan.save(Path(tmp) / "plan.json")
        options = RunOptions(weights="random", device="cuda", num_prompts=args.num_prompts,
                             max_new_tokens=args.max_new_tokens, timeout_s=args.timeout, loop=args.loop)
        log = run_plan(Path(tmp) / "plan.json", options)
    report = format_report(log)
    print(report)
    log.write(out_log)
    out = {"run_metadata": run_metadata("cuda"), "wall_s": time.time() - t0, "plan": plan.to_dict(),
           "report": report.splitlines(), "summary": json.loads(log.summary().to_json(orient="records")),
           "loop": args.loop,
           "notes": "draft and target processes share one GPU through a gloo link: host-side timing only"}
    out_json.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_json, json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {out_json} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
