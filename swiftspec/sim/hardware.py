"""A GPU in the few numbers that scale a profile to it (`sim/derive.py`).

`HardwareSpec` holds what bounds each part of a measured row: memory bandwidth (bytes), the
dense bf16 rate (math), the time to launch a kernel (launches), capacity, and the interconnect's
bandwidth and latency (collectives). Bundled specs (`swiftspec/data/hardware/*.json`,
`builtin:NAME`) come from vendors' datasheets and say so (`source`); a spec measured on a machine
(`profile calibrate`) says `calibrated`. Bandwidths are what a device-to-device copy reaches, not
the datasheet's peak, where a measurement exists.
"""

from __future__ import annotations

import dataclasses
import json
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
    "datasheet" or "calibrated"; notes: where the numbers come from."""

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

    @property
    def label(self) -> str:
        return f"{self.name} ({self.source})"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: object, where: str = "hardware spec") -> HardwareSpec:
        d = check_dict(d, where, "hardware spec")
        nums = {k: check_number(require(d, k, where), where, k, lo=1e-9) for k in _NUMBERS}
        return cls(name=check_str(require(d, "name", where), where, "name"), sms=int(check_number(
            require(d, "sms", where), where, "sms", lo=1)), source=check_str(d.get("source", "datasheet"), where, "source"),
            notes=check_str(d.get("notes", ""), where, "notes", empty=True), **nums)  # fmt: skip

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
