"""A GPU in the few numbers that scale a profile to it (`sim/derive.py`).

`HardwareSpec` holds what bounds each part of a measured row: memory bandwidth (bytes), the
dense bf16 rate (math), the time to launch a kernel (launches), capacity, and the interconnect's
bandwidth and latency (collectives). Bundled specs (`swiftspec/data/hardware/*.json`,
`builtin:NAME`) come from vendors' datasheets and say so (`source`); a spec measured on a machine
(`profile calibrate`) says `calibrated` and lists the fields it measured (`measured`). Bandwidths
are what a device-to-device copy reaches, not the datasheet's peak, where a measurement exists.

`GPUS` is the one table that ties a GPU's name (as torch reports it) to its bundled spec and its
bundled profiles, best first: `validate`, `plan` and `run` take a visible GPU's profile from it
(`gpu_profile`), `plan --hardware NAME` a named GPU's (`sim/derive.py`), and `profile derive` the
spec of the GPU a profile was measured on.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from swiftspec.spec import UserError, check_dict, check_number, check_str, parse_json, read_text, require

PREFIX = "builtin:"
_NUMBERS = ("hbm_tb_s", "hbm_gib", "bf16_tflops", "fp8_tflops", "launch_us", "link_gb_s", "link_us")


@dataclass(frozen=True)
class HardwareSpec:
    """One GPU type.

    hbm_tb_s: memory bandwidth (TB/s) that bytes-bound work reaches; hbm_gib: capacity (GiB);
    bf16_tflops / fp8_tflops: dense tensor-core rates; sms: streaming multiprocessors (compute
    units); launch_us: per-kernel launch and ramp time (µs); link_gb_s / link_us: one GPU's
    interconnect bandwidth (GB/s, one direction) and a collective's base latency (µs). source:
    "datasheet" or "calibrated"; notes: where the numbers come from; device: "cuda" or "cpu" (a
    calibration of a CPU, for tests); measured: the fields measured on the machine (calibrated
    specs; the others come from another spec and the notes say which)."""

    name: str
    hbm_tb_s: float
    hbm_gib: float
    bf16_tflops: float
    fp8_tflops: float
    sms: int
    launch_us: float
    link_gb_s: float
    link_us: float
    source: str = "datasheet"
    notes: str = ""
    device: str = "cuda"
    measured: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.name} ({self.source})"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["measured"] = list(self.measured)
        return d

    @classmethod
    def from_dict(cls, d: object, where: str = "hardware spec") -> HardwareSpec:
        d = check_dict(d, where, "hardware spec")
        nums = {k: check_number(require(d, k, where), where, k, lo=1e-9) for k in _NUMBERS}
        device = check_str(d.get("device", "cuda"), where, "device")
        if device not in ("cuda", "cpu"):
            raise UserError(f"{where}: device must be cuda or cpu, got {device!r}")
        measured = d.get("measured", [])
        if not isinstance(measured, list) or any(m not in (*_NUMBERS, "sms") for m in measured):
            raise UserError(f"{where}: measured must be a list of field names ({', '.join((*_NUMBERS, 'sms'))})")
        return cls(name=check_str(require(d, "name", where), where, "name"), sms=int(check_number(
            require(d, "sms", where), where, "sms", lo=1)), source=check_str(d.get("source", "datasheet"), where, "source"),
            notes=check_str(d.get("notes", ""), where, "notes", empty=True), device=device,
            measured=tuple(measured), **nums)  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> HardwareSpec:
        """A spec JSON file, or `builtin:NAME` (`bundled_specs`)."""
        path = resolve_spec(path)
        return cls.from_dict(parse_json(read_text(path, "hardware spec"), path), str(path))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def _folder() -> Path:
    return Path(str(resources.files("swiftspec") / "data" / "hardware"))


def bundled_specs() -> list[str]:
    """Names of the bundled specs (`builtin:NAME`)."""
    return sorted(p.stem for p in _folder().glob("*.json"))


def resolve_spec(path: str | Path) -> Path:
    """`builtin:NAME` -> the bundled file; else the path as given (one-line error if missing)."""
    text = str(path)
    if text.startswith(PREFIX):
        name = text[len(PREFIX):]
        p = _folder() / f"{name}.json"
        if not p.is_file():
            raise UserError(f"no bundled hardware spec {name!r}: choose from {', '.join(bundled_specs())}")
        return p
    p = Path(text)
    if not p.is_file():
        raise UserError(f"hardware spec {text} does not exist: give a JSON file or builtin:NAME "
                        f"({', '.join(bundled_specs())})")
    return p


# ---- the GPUs swiftspec ships numbers for ----------------------------------------------------


@dataclass(frozen=True)
class Gpu:
    """One GPU type: `name` (what `plan --hardware` takes), `key` (a word of its name as torch
    reports it, e.g. "NVIDIA H100 80GB HBM3"), its bundled spec and its bundled profiles, best first
    (a measured one before a derived one: the first that is bundled is used)."""

    name: str
    key: str
    spec: str
    profiles: tuple[str, ...] = ()


GPUS = (
    Gpu("h100", "H100", "h100-sxm", ("h100-measured", "h100-derived")),
    Gpu("h200", "H200", "h200", ("h200-measured",)),
    Gpu("b200", "B200", "b200"),
    Gpu("h20", "H20", "h20"),
)
# what a GPU without a bundled profile is predicted from (and what what-if profiles derive from)
FALLBACK_PROFILE = "h200-measured"


def gpu_of(gpu: str) -> Gpu | None:
    """The row of `GPUS` whose key is a word of `gpu` (a device name: "NVIDIA H20" is not an
    H200, "NVIDIA GH200" not an H200), or None."""
    return next((g for g in GPUS if re.search(rf"(?<![\w-]){re.escape(g.key)}(?![\w])", gpu)), None)


def _layers_models(folder: Path) -> set[str]:
    """The models a profile folder has `layers` rows for."""
    with open(folder / "compute.csv", newline="") as f:
        return {r["model"] for r in csv.DictReader(f) if r["op"] == "layers"}


def bundled_profile(gpu: Gpu, models: Sequence[str] = ()) -> str | None:
    """builtin:NAME of the GPU's first bundled profile with rows of every model in `models` (a
    measured one before a derived one), else its first bundled profile; None when none is bundled."""
    folder = Path(str(resources.files("swiftspec") / "data" / "profiles"))
    names = [p for p in gpu.profiles if (folder / p / "meta.json").is_file()]
    covering = (p for p in names if not models or set(models) <= _layers_models(folder / p))
    name = next(covering, names[0] if names else None)
    return name and f"{PREFIX}{name}"


def gpu_profile(gpu: str, models: Sequence[str] = ()) -> tuple[str, str]:
    """(builtin:NAME, why) of the bundled profile for a visible GPU named `gpu` (`GPUS`) that covers
    `models` where one does (`bundled_profile`); a GPU without one gets `FALLBACK_PROFILE`, and the
    reason says its predictions are for another GPU."""
    row = gpu_of(gpu)
    name = bundled_profile(row, models) if row else None
    if name:
        first = bundled_profile(row)
        why = "" if name == first else f" ({first} has no rows of {', '.join(models)})"
        return name, f"{name}, the bundled profile of this {gpu}{why}"
    hint = f"`plan --hardware {row.name}` derives one from its datasheet, " if row else ""
    return (f"{PREFIX}{FALLBACK_PROFILE}", f"{PREFIX}{FALLBACK_PROFILE}: no bundled profile for {gpu}, so the "
            f"predictions are an H200's ({hint}`swiftspec profile compute` measures this GPU, `profile derive` "
            "scales one to it)")


def same_gpu(a: str, b: str) -> bool:
    """Whether two device names are one GPU type: equal, or the same row of `GPUS` ("NVIDIA H100
    SXM", a spec's name, and "NVIDIA H100 80GB HBM3", torch's)."""
    ga, gb = gpu_of(a), gpu_of(b)
    return a == b or (ga is not None and ga == gb)
