"""`KernelConfig`: which kernels a model runs, chosen once per model.

The runtime's kernel choices depend only on the device, its compute capability, the weight
format and the TP degree. `KernelConfig.resolve` makes every choice once from those; the
model reads the finished config (`load_model(..., kernels=)`), and a profile records the
config it was measured with (`profile_settings`), so a prediction is only made from a profile
whose kernels are the runtime's. Benchmarks build explicit configs for their A/B runs
(`dataclasses.replace(KernelConfig.resolve(...), linear="torch")`); each default's measured
effect is a row of docs/decisions.md.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from swiftspec.spec import WEIGHT_FORMATS, UserError

ATTENTION_IMPLS = ("torch", "ref", "triton")
COMBINES = ("separate", "kernel")  # how a kernel's split partials are merged: a second launch, or inside it
FUSION_MODES = ("off", "compile", "triton")
LINEAR_IMPLS = ("torch", "triton")
PDL_MODES = ("off", "early", "late", "early-nopeel", "prefetch")
TREE_GROWTH_IMPLS = ("torch", "triton", "graph")

# The Gluon tree attention takes forwards of at least this many rows (tokens x query heads per KV
# head) and tokens: below them a single KV head's tile leaves most SMs idle (docs/decisions.md).
ATTENTION_WS_ROWS = 128
ATTENTION_WS_MIN_TOKENS = 32
# The capability assumed where no GPU is present to ask: the bundled profiles' H200.
DEFAULT_CAPABILITY = (9, 0)

# The keys a profile's meta.json records (`profile_settings`) and `kernel_mismatch` compares.
KERNEL_SETTINGS = ("attention", "attention_combine", "attention_ws", "fold_norm", "fusion", "linear",
                   "linear_combine", "pdl", "rope", "swiglu", "tree_growth", "weight_format")


@dataclass(frozen=True)
class KernelConfig:
    """The kernels of one model. The defaults are the reference path (torch ops, CPU-safe).

    attention: tree attention by "torch" (SDPA, mask built once per forward), "ref" (the
    contract, slow) or "triton" (`kernels.tree_attention`, split-KV), whose partials are merged
    by `attention_combine` ("separate": a second launch; "kernel": inside the attention launch).
    attention_ws_rows > 0 (with "triton"): forwards of at least that many rows per KV head and
    `attention_ws_min_tokens` tokens take the warp-specialized Gluon kernel where it can run.
    fusion: the small per-layer ops as eager torch ("off"), `torch.compile` ("compile") or the
    fused Triton kernels ("triton": add+RMSNorm, RoPE+KV write, silu*up).
    linear: GEMMs by `F.linear` ("torch") or the skinny linear ("triton", forwards of at most
    `linear_max_rows` tokens; None: `kernels.gemv.MAX_ROWS`), whose split-K partials are summed by
    `linear_combine` ("separate": a second launch; "kernel": inside the linear's launch, by the
    last split of each column block to finish; the same result bit for bit); int4 linears split K
    only where N is at most `linear_split_max_n` (None: `gemv.INT4_SPLIT_MAX_N`). fold_norm, swiglu, rope: the
    skinny linear's epilogues (RMSNorm folded into the weights; silu(gate)*up; RoPE + KV write).
    pdl: programmatic dependent launch of the Triton kernels ("early", "late", "early-nopeel",
    "prefetch", "off"; sm_90+; `kernels.pdl`).
    tree_growth: the draft's top-k after each forward ("torch", "triton", "graph").
    weight_format: "native" (GEMM weights in the model dtype), "fp8" (weight-only e4m3) or "int4"
    (W4A16 in the AWQ format's numbers, `kernels.int4`).
    """

    attention: str = "torch"
    attention_combine: str = "separate"
    attention_ws_rows: int = 0
    attention_ws_min_tokens: int = 0
    fusion: str = "off"
    linear: str = "torch"
    linear_max_rows: int | None = None
    linear_combine: str = "separate"
    linear_split_max_n: int | None = None
    fold_norm: bool = False
    swiglu: bool = False
    rope: bool = False
    pdl: str = "off"
    tree_growth: str = "torch"
    weight_format: str = "native"

    def __post_init__(self) -> None:
        for name, allowed in (("attention", ATTENTION_IMPLS), ("attention_combine", COMBINES),
                              ("linear_combine", COMBINES),
                              ("fusion", FUSION_MODES), ("linear", LINEAR_IMPLS), ("pdl", PDL_MODES),
                              ("tree_growth", TREE_GROWTH_IMPLS), ("weight_format", WEIGHT_FORMATS)):
            value = getattr(self, name)
            if value not in allowed:
                raise UserError(f"kernel setting {name} must be one of {', '.join(allowed)}, got {value!r}")
        if self.linear_split_max_n is not None and self.linear_split_max_n < 1:
            raise UserError(f"linear_split_max_n must be a positive row count, got {self.linear_split_max_n}")
        needs_linear = [n for n in ("fold_norm", "swiglu", "rope") if getattr(self, n)]
        if needs_linear and self.linear != "triton":
            verb = "needs" if len(needs_linear) == 1 else "need"
            raise UserError(f"{', '.join(needs_linear)} {verb} linear 'triton' (the skinny linear runs it)")
        if self.fold_norm and self.weight_format != "native":
            raise UserError(f"fold_norm needs native weights, not {self.weight_format} (folding would re-quantize "
                            "them)")
        if self.attention_ws_rows and self.attention != "triton":
            raise UserError("the warp-specialized attention (attention_ws_rows > 0) needs attention 'triton'")

    @classmethod
    def resolve(cls, device: str | torch.device, *, weight_format: str = "native", tp_size: int = 1,
                capability: tuple[int, int] | None = None,
                **choices: str | int | bool | None) -> KernelConfig:
        """The runtime's kernels on `device` for `weight_format` at TP degree `tp_size`.

        capability: the GPU's compute capability (None: asked of the GPU, or `DEFAULT_CAPABILITY`
        where none is present). choices: a value for any field overrides its default; "auto"
        (or leaving it out) takes the rule below. The rules, each measured (docs/decisions.md):
        - on CUDA the Triton kernels (attention, fusion, linear, tree growth), on CPU torch;
        - swiglu and rope epilogues wherever the skinny linear runs;
        - fold_norm there too, for native weights at TP 1 only (narrow TP shards launch too few
          programs to hide the norm);
        - late PDL on sm_90 and newer;
        - the Gluon attention on sm_90 for native weights;
        - split-K partials summed inside the linear's launch for int4 weights (three of a layer's
          four int4 linears split K), in a second launch for native and fp8 ones.
        """
        choices = {k: v for k, v in choices.items() if v != "auto"}
        unknown = sorted(set(choices) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise UserError(f"unknown kernel setting {unknown[0]!r} (known: {', '.join(KERNEL_SETTINGS)})")
        cuda = torch.device(device).type == "cuda"
        if capability is None:
            capability = _capability(device) if cuda else (0, 0)
        attention = choices.get("attention", "triton" if cuda else "torch")
        fusion = choices.get("fusion", "triton" if cuda else "off")
        linear = choices.get("linear", "triton" if cuda else "torch")
        epilogues = cuda and linear == "triton" and fusion == "triton"
        hopper = cuda and capability >= (9, 0)
        ws = cuda and attention == "triton" and weight_format == "native" and capability == (9, 0)
        defaults = dict(
            attention=attention, fusion=fusion, linear=linear, weight_format=weight_format,
            attention_ws_rows=ATTENTION_WS_ROWS if ws else 0,
            attention_ws_min_tokens=ATTENTION_WS_MIN_TOKENS if ws else 0,
            fold_norm=epilogues and weight_format == "native" and tp_size == 1,
            swiglu=epilogues, rope=epilogues,
            pdl="late" if hopper and fusion == "triton" else "off",
            tree_growth="triton" if cuda else "torch",
            linear_combine="kernel" if linear == "triton" and weight_format == "int4" else "separate",
        )
        if choices.get("tree_growth") == "graph" and not cuda:
            choices["tree_growth"] = "torch"  # graphs are CUDA's: elsewhere the eager top-k
        return cls(**{**defaults, **choices})

    def settings(self) -> dict[str, str]:
        """This config as the strings a profile's meta.json records (`KERNEL_SETTINGS`)."""
        return {
            "attention": self.attention,
            "attention_combine": self.attention_combine if self.attention == "triton" else "-",
            "attention_ws": "on" if self.attention_ws_rows else "off",
            "fold_norm": "on" if self.fold_norm else "off",
            "fusion": self.fusion, "linear": self.linear,
            "linear_combine": self.linear_combine if self.linear == "triton" else "-", "pdl": self.pdl,
            "rope": "on" if self.rope else "off", "swiglu": "on" if self.swiglu else "off",
            "tree_growth": self.tree_growth, "weight_format": self.weight_format,
        }


def _capability(device: str | torch.device) -> tuple[int, int]:
    if torch.cuda.is_available():
        return tuple(torch.cuda.get_device_capability(torch.device(device)))
    return DEFAULT_CAPABILITY


def profile_settings(device: str | torch.device, weight_format: str = "native",
                     capability: tuple[int, int] | None = None,
                     **choices: str | int | bool | None) -> dict[str, str]:
    """The runtime's kernels on `device` (its defaults, or `choices` as `KernelConfig.resolve`
    takes them) as a profile's meta.json records them. A profile spans TP degrees, so fold_norm
    (on at TP 1 only) is recorded as "tp1" where it is on there."""
    config = KernelConfig.resolve(device, weight_format=weight_format, capability=capability, **choices)
    settings = config.settings()
    if settings["fold_norm"] == "on":
        settings["fold_norm"] = "tp1"
    return settings


def kernel_mismatch(meta: dict, device: str | torch.device) -> list[str]:
    """The kernel settings where a profile's meta.json differs from the runtime's defaults on
    `device` for the profile's weight format, as 'name: profile X, runtime Y'. Settings the
    profile did not record are skipped; the weight format itself is compared against native."""
    now = {**profile_settings(device, meta.get("weight_format", "native")), "weight_format": "native"}
    return [f"{k}: profile {meta[k]}, runtime {now[k]}" for k in KERNEL_SETTINGS if k in meta and meta[k] != now[k]]
