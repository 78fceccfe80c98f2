"""Programmatic dependent launch (PDL) for the decode step's kernels (Hopper and later).

A batch-1 decode layer is a chain of ~9 small dependent kernels; between two of them the GPU
drains the first, then launches and ramps up the second (≈ 1–3 µs inside a CUDA graph). With PDL
the second kernel is launched while the first is still running: its programs start, do whatever
does not depend on the first kernel (index math; the skinny linear starts streaming its weights),
and wait at `griddepcontrol.wait` until the first kernel has completed and its writes are visible.

Every kernel here calls `grid_sync(PDL)` before it touches memory that the previous kernel may
write or read (inputs, outputs, counters), and signals its own dependents right after the wait.
So when a kernel starts, every kernel before its immediate predecessor has completed (each of those
waited before signalling), and only data produced by the immediate predecessor needs the wait;
static weights may be read before it. With PDL off (`pdl=False`, the default, and always on CPU)
the launches are ordinary and `grid_sync` compiles to nothing.

When the dependents may launch is the mode (`pdl=` of every kernel; `pdl_mode`):
* True or "early": each program signals right after its wait, so the next kernel launches as soon
  as every program of this one has started. Its programs then sit on the SMs (registers, shared
  memory) while this kernel still runs; the skinny linear also peels its first weight tile out of
  the pipelined loop to load it before the wait (one pipeline stage fewer).
* "early-nopeel": each program signals right after its wait, as "early", but the skinny linear
  peels nothing (all its pipeline stages): separates the two costs of "early" in A/B runs.
* "prefetch": each program signals right after its wait, as "early-nopeel", and the skinny linear
  first asks the L2 for the start of its weight slice (`gemv.prefetch_lines`: lines, not registers
  or shared memory), so the bytes a program streams first arrive while the previous kernel runs.
* "late": each program waits first and signals only after its main loop (the skinny linear's K
  loop, tree attention's key loop; the small kernels at their exit), so the next kernel's launch
  overlaps only this kernel's epilogue and drain, and no loop is peeled.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from swiftspec.kernels import interpreting

PDL_MODES = ("off", "early", "late", "early-nopeel", "prefetch")


def pdl_mode(pdl: bool | str | None) -> int:
    """The kernels' PDL constexpr for a `pdl=` argument: 0 off (False, None, "off"), 1 early (True,
    "early"), 2 late ("late"), 3 early without the skinny linear's peeled tile ("early-nopeel"), 4
    early with the skinny linear's L2 prefetch ("prefetch"); ValueError for anything else."""
    if pdl is None or pdl is False or pdl == "off":
        return 0
    if pdl is True or pdl == "early":
        return 1
    if pdl == "late":
        return 2
    if pdl == "early-nopeel":
        return 3
    if pdl == "prefetch":
        return 4
    raise ValueError(f"pdl must be False, True or one of {', '.join(PDL_MODES)}, got {pdl!r}")


@triton.jit
def grid_sync(PDL: tl.constexpr):
    """Wait for the previous kernel in the stream (complete, writes visible); with PDL 1, 3 or 4
    (early) then let the next kernel launch. A no-op unless PDL > 0 (a launch with `launch_pdl=True`)."""
    if PDL != 0:
        tl.extra.cuda.gdc_wait()
    if PDL == 1 or PDL == 3 or PDL == 4:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def grid_release(PDL: tl.constexpr):
    """With PDL 2 (late): let the next kernel launch, once this program's main loop is done. Other
    modes: nothing (early signalled in `grid_sync`; a program that never signals does at exit)."""
    if PDL == 2:
        tl.extra.cuda.gdc_launch_dependents()


def pdl_available(device: torch.device | str) -> bool:
    """True where PDL launches work: a CUDA device of compute capability >= 9.0, not Triton's CPU
    interpreter (which has no grid dependency control)."""
    device = torch.device(device)
    if device.type != "cuda" or interpreting():
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(pdl: bool | str) -> dict:
    """Keyword arguments for a Triton launch: `launch_pdl` when pdl is on in any mode (kernels pass
    PDL=pdl_mode(pdl) too)."""
    return {"launch_pdl": True} if pdl_mode(pdl) else {}


def check_pdl(pdl: bool | str, device: torch.device | str) -> None:
    """Raise ValueError when pdl is not a mode (`pdl_mode`) or is asked for where it cannot work
    (CPU, interpreter, pre-Hopper)."""
    if pdl_mode(pdl) and not pdl_available(device):
        raise ValueError(f"pdl needs a CUDA GPU of compute capability >= 9.0 (not {device}, not TRITON_INTERPRET)")
