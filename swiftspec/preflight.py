"""Memory checks made before a verb starts workers or builds models: does the work fit what is free?

Needed: the simulator's estimate (`sim.memory.group_use`): per rank, the weights of every model it
holds, the largest KV cache and logits it allocates at once, and the per-rank reserve. Available:
on a CPU, the host's MemAvailable (`runtime.launch.host_memory`; every rank shares it), on a GPU,
`torch.cuda.mem_get_info` of each device (ranks on one device add up). `SWIFTSPEC_AVAILABLE_GIB`
overrides what is available on every device, so a test can exercise the refusal itself.

Too little memory is a `UserError` of one line saying how much is needed and how much is free;
a run also keeps the numbers (`Job.meta["memory"]`) so a worker the OOM killer ends anyway is
reported with them (`runtime.launch`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import torch

from swiftspec.runtime.decoder import PREFILL_CHUNK
from swiftspec.runtime.engine import Job, draft_slots, target_slots
from swiftspec.runtime.groups import Layout
from swiftspec.runtime.launch import AVAILABLE_ENV, GIB, host_memory
from swiftspec.sim.memory import group_use, reserve_bytes
from swiftspec.spec import Mode, ModelSpec, UserError

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def model_spec(path: str, dtype: str, weight_format: str = "native") -> ModelSpec:
    """The architecture of `path` at the bytes per weight it will run with (an AWQ checkpoint runs
    as int4 whatever `weight_format` says, as `load_model` loads it)."""
    spec = ModelSpec.from_config(path, dtype_bytes=DTYPE_BYTES.get(dtype, 2))
    return spec if spec.weight_format == "int4" else dataclasses.replace(spec, weight_format=weight_format)


def available_bytes(device: str, index: int = 0) -> int:
    """Free memory of GPU `index` (cuda) or of the host (cpu); `SWIFTSPEC_AVAILABLE_GIB` overrides.
    On a GPU: total minus NVML's used bytes when NVML answers (the launcher then creates no CUDA
    context on the workers' GPUs), else `torch.cuda.mem_get_info`."""
    if device == "cuda" and not os.environ.get(AVAILABLE_ENV):
        try:
            used = torch.cuda.device_memory_used(index)
            return int(torch.cuda.get_device_properties(index).total_memory - used)
        except Exception:  # noqa: BLE001 -- no NVML (pynvml): ask the CUDA runtime
            return int(torch.cuda.mem_get_info(index)[0])
    return host_memory()[0]


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}" if n < 10 * GIB else f"{n / GIB:.1f}"


def require(needs: dict[int, int], device: str, what: str) -> dict:
    """Refuse (UserError, one line) when a device needs more than it has free. needs: device index
    (-1: the host) -> bytes. Returns {"needed", "available"} of the fullest device, for `Job.meta`."""
    worst = None
    for index, need in sorted(needs.items()):
        have = available_bytes(device, max(index, 0))
        where = "host" if device != "cuda" else f"GPU {index}"
        if need > have:
            raise UserError(f"{what} needs ≈ {_gib(need)} GiB of {where} memory (weights + KV cache + reserve) but "
                            f"{_gib(have)} GiB is available: free memory, or use fewer ranks, --dtype bfloat16 or "
                            "smaller models")
        if worst is None or need / max(have, 1) > worst["needed"] / max(worst["available"], 1):
            worst = {"needed": need, "available": have}
    return worst or {"needed": 0, "available": available_bytes(device)}


def models_bytes(models: Sequence[tuple[ModelSpec, int]], device: str, shared_weights: bool = False) -> int:
    """One process holding every model of `models` ((spec, KV slots) each, TP 1). shared_weights:
    entries with equal specs are runners of one loaded model (weights counted once)."""
    total = reserve_bytes(device)
    loaded: set[str] = set()
    for spec, slots in models:
        w, kv, logits = group_use(spec, 1, slots, PREFILL_CHUNK)
        key = repr(spec)
        total += kv + logits + (0 if shared_weights and key in loaded else w)
        loaded.add(key)
    return total


def check_models(device: str, models: Sequence[tuple[ModelSpec, int]], what: str = "generate",
                 shared_weights: bool = False) -> dict:
    """`require` for one process holding `models` ((spec, KV slots) each; `models_bytes`) on GPU 0
    or the host."""
    return require({0 if device == "cuda" else -1: models_bytes(models, device, shared_weights)}, device, what)


def run_needs(job: Job, layout: Layout) -> dict[int, int]:
    """Bytes per device (-1: the host) of a run: each rank holds every model its tasks load (cached
    across tasks, `engine._model`) and the KV caches of one task at a time."""
    longest = max(len(p) for p in job.prompts)
    t = model_spec(job.target, job.dtype, job.weight_format)
    d = model_spec(job.draft, job.dtype, job.weight_format) if job.draft else None
    needs: dict[int, int] = {}
    for rank in range(layout.world):
        held: dict[tuple[str, int], ModelSpec] = {}
        kv_peak = 0
        for task in job.tasks:
            pol, new = task.policy, job.max_new_tokens
            parts: list[tuple[str, ModelSpec, int, int]] = []  # (role, spec, tp, slots)
            if task.mode is Mode.async_:
                if layout.role(rank) == "draft":
                    parts.append(("draft", d, len(layout.draft_ranks), draft_slots(longest, new, pol)))
                else:
                    parts.append(("target", t, len(layout.target_ranks), target_slots(longest, new, pol)))
            elif rank in layout.colocated:
                tp = len(layout.colocated)
                parts.append(("target", t, tp, target_slots(longest, new, pol)))
                if task.mode is not Mode.autoregressive and d is not None:
                    parts.append(("draft", d, tp, draft_slots(longest, new, pol)))
            kv = 0
            for role, spec, tp, slots in parts:
                held[(role, tp)] = spec
                kv += group_use(spec, tp, slots, PREFILL_CHUNK)[1] + group_use(spec, tp, 0, PREFILL_CHUNK)[2]
            kv_peak = max(kv_peak, kv)
        weights = sum(spec.weight_bytes(tp) for (_, tp), spec in held.items())
        key = layout.physical[rank] if job.device == "cuda" else -1
        needs[key] = needs.get(key, 0) + weights + kv_peak + reserve_bytes(job.device)
    return needs
