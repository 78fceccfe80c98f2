"""The command line's option types: ranges every numeric option is checked against, the bounds
that keep a search short, and the device and dtype defaults that follow the machine.

A value out of range is a click usage error (exit 2, one line) raised while the options are
parsed, so nothing has started yet. The bounds are what the planner and the runtime handle
quickly:

- `MAX_GPUS` (1024): `plan` enumerates every async split of N GPUs; above this it spends most of
  a minute only to find that no profile covers such TP degrees.
- `MAX_BS` (256): the largest forward the runtime captures in a CUDA graph and the largest token
  count the bundled profiles time; a verified tree never holds more nodes.
- `MAX_W`, `MAX_D` (64): leaves per draft forward and expansions per round. A pinned
  `plan --bs 256 --d 64` simulates in about 20 s on 2 cores; `--d 1024` or `--bs 4096` take
  minutes.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import click

MAX_GPUS = 1024
MAX_BS = 256
MAX_W = 64
MAX_D = 64
MAX_DEPTH = MAX_BS  # the deepest node a tree of MAX_BS nodes can hold, root excluded, is MAX_BS - 1
MAX_REQUESTS = 1024  # simulated requests: 64 already take 40 s in `plan --gpus 8` on 2 cores
MAX_TOKENS = 1 << 17  # prompt or generated tokens of one request: the longest context of a bundled model
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds alike
MAX_TOP_K = 4096  # draft ranks recorded per position by `profile acceptance`

DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16", "float16")
DEVICE_RULE = "[default: cuda when a GPU is visible, else cpu]"
DTYPE_RULE = "[default: bfloat16 on cuda, float32 on cpu]"


def count(lo: int = 1, hi: int | None = None) -> click.IntRange:
    """An integer option in [lo, hi] (hi None: no upper bound)."""
    return click.IntRange(min=lo, max=hi)


SEED = click.IntRange(min=0, max=MAX_SEED)
GPUS = count(1, MAX_GPUS)
BS = count(1, MAX_BS)
W = count(1, MAX_W)
D = count(0, MAX_D)
DEPTH = count(0, MAX_DEPTH)
REQUESTS = count(1, MAX_REQUESTS)
TOKENS = count(1, MAX_TOKENS)


class FiniteFloat(click.FloatRange):
    """A float in a range that is also finite: click's FloatRange lets `nan` and `inf` through."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


def seconds(min_open: bool = True) -> FiniteFloat:
    """A duration in seconds: > 0 (or >= 0 with min_open False), finite."""
    return FiniteFloat(min=0.0, min_open=min_open)


class IntList(click.ParamType):
    """Comma-separated integers, each in [lo, hi], e.g. `--tp 1,2,4`; gives a tuple."""

    name = "ints"

    def __init__(self, lo: int = 1, hi: int | None = None, allow_empty: bool = False) -> None:
        self.lo, self.hi, self.allow_empty = lo, hi, allow_empty

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        items = [x.strip() for x in str(value).split(",") if x.strip()]
        try:
            out = tuple(int(x) for x in items)
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers (e.g. 1,2,4).", param, ctx)
        if not out and not self.allow_empty:
            self.fail("the list is empty: give comma-separated integers (e.g. 1,2,4).", param, ctx)
        bad = [x for x in out if x < self.lo or (self.hi is not None and x > self.hi)]
        if bad:
            rng = f"{self.lo}<=x<={self.hi}" if self.hi is not None else f"x>={self.lo}"
            self.fail(f"{bad[0]} is not in the range {rng}.", param, ctx)
        return out

    def get_metavar(self, param, ctx=None) -> str:
        return "N,N,..."


def gpu_visible() -> bool:
    """Whether torch sees a CUDA GPU (imports torch: only the verbs that run models call this)."""
    import torch

    return torch.cuda.is_available()


def visible_gpu_name() -> str | None:
    """The first CUDA GPU's name as torch reports it ("NVIDIA H100 80GB HBM3"), or None. torch is
    imported only where an NVIDIA driver is installed, so `plan` stays free of it elsewhere."""
    if not (Path("/proc/driver/nvidia").exists() or shutil.which("nvidia-smi")):
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def device_dtype(device: str | None, dtype: str | None = None) -> tuple[str, str]:
    """The device and dtype a command runs with: the ones given, else cuda when a GPU is visible
    (cpu otherwise), and bfloat16 on cuda (float32 on cpu). Every verb that runs models uses this
    rule, so a GPU user gets the GPU's fast dtype without flags."""
    dev = device or ("cuda" if gpu_visible() else "cpu")
    return dev, dtype or ("bfloat16" if dev == "cuda" else "float32")
