"""`swiftspec profile calibrate`: the numbers of a `HardwareSpec` that one device shows.

    hbm_tb_s     a device-to-device copy of `copy_bytes` (bytes read + written) over its time
    bf16_tflops  dense n x n x n matmuls, 2 n^3 flops over their time: bf16 on CUDA; float32 on
                 CPU, the dtype the CPU path runs
    fp8_tflops   the same in float8 e4m3 (`torch._scaled_mm`, bf16 out) where the GPU runs it
                 (compute capability 8.9 and up); elsewhere the bf16 rate, not measured
    launch_us    per kernel of a CUDA graph of `launch_kernels` one-element adds, the way the
                 runtime replays its forwards (CPU: one such add, eager)
    hbm_gib      total memory (CPU: the host's); sms: streaming multiprocessors (CPU: threads)

Each time is the median of `reps` runs after warm-up, between CUDA events (`perf_counter` on
CPU). One device cannot show the interconnect: link_gb_s and link_us come from the base spec
given, else the bundled spec of the same GPU (`GPUS`), else the H200's, and are not listed in
`measured`; `notes` says where they came from. Sizes on CUDA are large enough to leave the L2 and
reach the rates (1 GiB copies, 8192^3 matmuls; 23 runs of each); on CPU small (64
MiB, 512^3), for tests.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from swiftspec.sim.hardware import PREFIX, HardwareSpec, gpu_of
from swiftspec.spec import UserError

BASE = f"{PREFIX}h200"  # where the interconnect numbers come from when no bundled spec matches


@dataclass(frozen=True)
class CalibrationOptions:
    """Sizes and repeats: copy_bytes per buffer (bytes), matmul_n (the n of n x n x n),
    launch_kernels (tiny kernels per graph), reps (timed runs per number; median), warmup."""

    copy_bytes: int
    matmul_n: int
    launch_kernels: int = 256
    reps: int = 20
    warmup: int = 3

    @classmethod
    def for_device(cls, device: str) -> CalibrationOptions:
        if device == "cuda":
            return cls(copy_bytes=1 << 30, matmul_n=8192)
        return cls(copy_bytes=64 << 20, matmul_n=512, reps=7, warmup=1)


def fp8_supported(device: str) -> bool:
    """Whether this device runs float8 matmuls (CUDA, compute capability 8.9 and up)."""
    return device == "cuda" and torch.cuda.get_device_capability(0) >= (8, 9) and hasattr(torch, "float8_e4m3fn")


def measured_fields(device: str) -> tuple[str, ...]:
    """The spec fields a calibration on `device` measures (known before it starts)."""
    fields = ("hbm_tb_s", "hbm_gib", "bf16_tflops", "sms", "launch_us")
    return (*fields, "fp8_tflops") if fp8_supported(device) else fields


def check_replace(path: str | Path, device: str) -> None:
    """Refuse (one line) to replace an existing file at `path` with a calibration that measures
    less: a file that is no hardware spec, a spec measured on CUDA when this runs on CPU, or one
    that measured a field this one would not."""
    p = Path(path)
    if not p.is_file():
        return
    try:
        old = HardwareSpec.load(p)
    except UserError:
        raise UserError(f"-o {p} exists and is not a hardware spec: choose another path") from None
    missing = [f for f in old.measured if f not in measured_fields(device)]
    if (old.device == "cuda" and old.measured and device == "cpu") or missing:
        what = f"measured {', '.join(missing)}" if missing else f"is a calibration of {old.name}"
        raise UserError(f"-o {p} {what}, which a calibration on {device} would not: remove it or choose another path")


def time_ms(fn: Callable[[], object], reps: int, warmup: int, device: str | torch.device) -> list[float]:
    """Time of each of `reps` calls of fn in ms, after `warmup` calls: CUDA events on a GPU,
    perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    out = []
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e3)
    return out


def _timer(device: str) -> Callable[[Callable[[], object], int, int], float]:
    """median_ms(fn, reps, warmup): the median time of one call of fn, in ms (`time_ms`)."""
    return lambda fn, reps, warmup: statistics.median(time_ms(fn, reps, warmup, device))


def copy_tb_s(device: str, o: CalibrationOptions) -> float:
    """Device-to-device copy bandwidth, TB/s (bytes read + written)."""
    src = torch.empty(o.copy_bytes // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    ms = _timer(device)(lambda: dst.copy_(src), o.reps, o.warmup)
    return 2 * o.copy_bytes / (ms * 1e-3) / 1e12


def matmul_tflops(device: str, o: CalibrationOptions, fp8: bool = False) -> float:
    """Dense matmul rate, TFLOP/s: bf16 (CUDA) or float32 (CPU); fp8: float8 e4m3 operands."""
    n = o.matmul_n
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    if fp8:
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t().contiguous().t()  # b column-major
        one = torch.ones((), device=device, dtype=torch.float32)

        def fn():
            return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        def fn():
            return a @ b
    ms = _timer(device)(fn, o.reps, o.warmup)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def launch_us(device: str, o: CalibrationOptions) -> float:
    """Time per tiny kernel, µs: in a CUDA graph of `launch_kernels` of them (CPU: eager, one)."""
    x = torch.zeros(1, device=device)
    if device != "cuda":
        return _timer(device)(lambda: x.add_(1), max(o.reps, 200), 20) * 1e3
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up off the default stream, as graph capture asks
        for _ in range(3):
            x.add_(1)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(o.launch_kernels):
            x.add_(1)
    return _timer(device)(graph.replay, o.reps, o.warmup) * 1e3 / o.launch_kernels


def _memory_gib(device: str) -> float:
    if device == "cuda":
        return torch.cuda.get_device_properties(0).total_memory / 2**30
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def calibrate(device: str, base: HardwareSpec | None = None, options: CalibrationOptions | None = None,
              log: Callable[[str], None] | None = None) -> HardwareSpec:
    """Measure this machine's spec on `device` ("cuda": GPU 0, or "cpu"); see the module docstring.
    base: where the numbers one device cannot show come from (None: the bundled spec of this GPU,
    else the H200's). log(line): a progress line per number."""
    say = log or (lambda s: None)
    if device not in ("cuda", "cpu"):
        raise UserError(f"--device must be cuda or cpu, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was requested but no CUDA GPU is available: use --device cpu")
    o = options or CalibrationOptions.for_device(device)
    name = torch.cuda.get_device_name(0) if device == "cuda" else f"cpu ({platform.processor() or platform.machine()})"
    row = gpu_of(name) if device == "cuda" else None
    base_from = "the base spec given" if base else f"{PREFIX}{row.spec}, this GPU's bundled spec" if row else BASE
    base = base or HardwareSpec.load(f"{PREFIX}{row.spec}" if row else BASE)
    t0 = time.perf_counter()
    say(f"calibrate: {name} ({device}); interconnect numbers from {base_from}")
    hbm = copy_tb_s(device, o)
    say(f"calibrate: copy of {o.copy_bytes / 2**20:.0f} MiB: {hbm:.3f} TB/s (read + write)")
    bf16 = matmul_tflops(device, o)
    say(f"calibrate: {o.matmul_n}^3 {'bf16' if device == 'cuda' else 'float32'} matmul: {bf16:.1f} TFLOP/s")
    fp8 = None
    if fp8_supported(device):
        try:
            fp8 = matmul_tflops(device, o, fp8=True)
            say(f"calibrate: {o.matmul_n}^3 fp8 matmul: {fp8:.1f} TFLOP/s")
        except (RuntimeError, TypeError, AttributeError) as e:  # torch builds without a usable _scaled_mm
            say(f"calibrate: fp8 matmul did not run ({str(e).splitlines()[0][:80]}): fp8_tflops = the bf16 rate")
    launch = launch_us(device, o)
    say(f"calibrate: tiny kernel{' in a CUDA graph' if device == 'cuda' else ', eager'}: {launch:.2f} µs")
    measured = tuple(f for f in measured_fields(device) if f != "fp8_tflops" or fp8 is not None)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda" else torch.get_num_threads()
    notes = (f"measured by `swiftspec profile calibrate` on {device} (torch {torch.__version__}): copy "
             f"{o.copy_bytes / 2**20:.0f} MiB, matmul {o.matmul_n}^3"
             f"{'' if device == 'cuda' else ' float32'}, {'graphed' if device == 'cuda' else 'eager'} tiny kernels; "
             f"link_gb_s, link_us not measured (from {base.name}, {base.source})"
             + ("" if fp8 is not None else "; fp8_tflops not measured (no fp8 matmul here: the bf16 rate)"))
    spec = HardwareSpec(name=name, hbm_tb_s=round(hbm, 4), hbm_gib=round(_memory_gib(device), 2),
                        bf16_tflops=round(bf16, 3), fp8_tflops=round(fp8 if fp8 is not None else bf16, 3), sms=int(sms),
                        launch_us=round(launch, 4), link_gb_s=base.link_gb_s, link_us=base.link_us,
                        source="calibrated", notes=notes, device=device, measured=measured)
    say(f"calibrate: done in {time.perf_counter() - t0:.1f} s")
    return spec
