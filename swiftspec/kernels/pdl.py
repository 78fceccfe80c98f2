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
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def grid_sync(PDL: tl.constexpr):
    """Wait for the previous kernel in the stream (complete, writes visible), then let the next
    kernel launch. A no-op unless PDL (a launch with `launch_pdl=True`)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


def pdl_available(device: torch.device | str) -> bool:
    """True where PDL launches work: a CUDA device of compute capability >= 9.0, not Triton's CPU
    interpreter (which has no grid dependency control)."""
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def launch_options(pdl: bool) -> dict:
    """Keyword arguments for a Triton launch: `launch_pdl` when pdl (kernels pass PDL=pdl too)."""
    return {"launch_pdl": True} if pdl else {}


def check_pdl(pdl: bool, device: torch.device | str) -> None:
    """Raise ValueError when pdl is asked for where it cannot work (CPU, interpreter, pre-Hopper)."""
    if pdl and not pdl_available(device):
        raise ValueError(f"pdl needs a CUDA GPU of compute capability >= 9.0 (not {device}, not TRITON_INTERPRET)")
