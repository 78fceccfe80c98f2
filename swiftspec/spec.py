"""The shared vocabulary of swiftspec (see docs/design.md): one definition of each name.

`ModelSpec`, `Split`, `Mode`, `TreePolicy`, `Plan`, `Profile` and `AcceptanceProfile` are used
with the same meaning by the simulator, the runtime, the CLI flags, the JSON keys and the plots.
Every class here round-trips through JSON (`to_dict` / `from_dict`) and validates itself; a
validation failure raises `UserError`, which the CLI turns into one line and exit code 2.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from swiftspec.errors import UserError
from swiftspec.files import atomic_dir, atomic_write_text

# --------------------------------------------------------------------------------------------
# Reading and checking input files: every loader below goes through these, so a bad file is one
# line naming the file and the field (or cell), never a Python exception.


def _show(v: Any) -> str:
    """A short repr of a bad value for an error line (numpy scalars as plain Python values)."""
    if hasattr(v, "item") and callable(v.item) and getattr(v, "ndim", 1) == 0:
        v = v.item()
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of `path`; a missing, unreadable or non-UTF-8 file -> UserError naming it."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{what} {p} not found") from None
    except IsADirectoryError:
        raise UserError(f"{what} {p} is a folder: give a file") from None
    except OSError as e:
        raise UserError(f"{what} {p} cannot be read ({e.strerror or type(e).__name__})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {p} is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): "
                        "save it as UTF-8") from None


def parse_json(text: str, where: str) -> Any:
    """json.loads with every failure (syntax, too deep, too long a number) as one UserError line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where} is not valid JSON ({e.msg}, line {e.lineno})") from None
    except (ValueError, RecursionError) as e:
        raise UserError(f"{where} is not valid JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def _range_text(lo: float | None, hi: float | None, both: str) -> str:
    if lo is None and hi is None:
        return ""
    return f" >= {lo}" if hi is None else f" <= {hi}" if lo is None else both


def check_int(v: Any, where: str, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """`v` as an int (an integral float such as 8.0 is accepted), within [lo, hi]; else UserError."""
    ok = not isinstance(v, bool) and (
        isinstance(v, int) or (isinstance(v, float) and math.isfinite(v) and v.is_integer()))
    if ok:
        v = int(v)
        ok = (lo is None or v >= lo) and (hi is None or v <= hi)
    if not ok:
        rng = _range_text(lo, hi, f" in {lo}..{hi}")
        raise UserError(f"{where}: {name} must be an integer{rng}, got {_show(v)}")
    return v


def check_number(v: Any, where: str, name: str, lo: float | None = None, hi: float | None = None) -> float:
    """`v` as a finite float within [lo, hi]; a string, bool, NaN or infinity -> UserError."""
    ok = not isinstance(v, bool) and (isinstance(v, float) and math.isfinite(v) or
                                      isinstance(v, int) and abs(v) < 1e308)
    if ok:
        v = float(v)
        ok = (lo is None or v >= lo) and (hi is None or v <= hi)
    if not ok:
        rng = _range_text(lo, hi, f" in [{lo}, {hi}]")
        raise UserError(f"{where}: {name} must be a finite number{rng}, got {_show(v)}")
    return v


def check_str(v: Any, where: str, name: str, empty: bool = False) -> str:
    """`v` if it is a string (non-empty unless `empty`); else UserError."""
    if not isinstance(v, str) or (not empty and not v.strip()):
        raise UserError(f"{where}: {name} must be a {'' if empty else 'non-empty '}string, got {_show(v)}")
    return v


def check_list(v: Any, where: str, name: str) -> list:
    """`v` if it is a JSON list; else UserError."""
    if not isinstance(v, list):
        raise UserError(f"{where}: {name} must be a list, got {_show(v)}")
    return v


def check_dict(v: Any, where: str, name: str) -> dict:
    """`v` if it is a JSON object; else UserError."""
    if not isinstance(v, dict):
        raise UserError(f"{where}: {name} must be an object, got {_show(v)}")
    return v


def require(d: dict, key: str, where: str) -> Any:
    """d[key], or a UserError naming the missing field."""
    if key not in d:
        raise UserError(f"{where} is malformed: it lacks field {key!r}")
    return d[key]


# --------------------------------------------------------------------------------------------
# ModelSpec


SUPPORTED_MODEL_TYPES = ("llama", "qwen2")
# GEMM weights: the model dtype, weight-only float8 e4m3, or W4A16 in the AWQ format's numbers
WEIGHT_FORMATS = ("native", "fp8", "int4")
_REQUIRED_CONFIG_KEYS = (
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def _configs_dir() -> Path:
    return Path(str(resources.files("swiftspec") / "data" / "configs"))


def bundled_models() -> list[str]:
    """Names of the model configs shipped in `swiftspec/data/configs/` (no download needed)."""
    return sorted(p.name for p in _configs_dir().iterdir() if (p / "config.json").exists())


def resolve_model_path(name_or_path: str | Path) -> Path:
    """A bundled model name (case-insensitive) or a checkpoint folder / config.json -> folder."""
    p = Path(name_or_path)
    if p.is_file() and p.name == "config.json":
        return p.parent
    if p.is_dir():
        if not (p / "config.json").exists():
            raise UserError(f"{p} has no config.json: give a Hugging Face checkpoint folder")
        return p
    by_lower = {n.lower(): n for n in bundled_models()}
    key = str(name_or_path).lower()
    if key in by_lower:
        return _configs_dir() / by_lower[key]
    raise UserError(
        f"unknown model {str(name_or_path)!r}: give a checkpoint folder or one of the bundled "
        f"names: {', '.join(bundled_models())}"
    )


def awq_group_size(raw: dict, where: str) -> int | None:
    """The group size of a config.json's AWQ `quantization_config` (4 bits, zero points, the GEMM
    layout), None without one; any other quantization -> UserError naming what is supported."""
    q = raw.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise UserError(f"{where}: quantization_config must be a JSON object")
    method, version = str(q.get("quant_method", "")).lower(), str(q.get("version", "gemm")).lower()
    bits, zero, group = q.get("bits", q.get("w_bit")), q.get("zero_point", True), q.get("group_size", q.get("q_group_size"))
    if method != "awq" or bits != 4 or zero is not True or version != "gemm":
        raise UserError(f"{where}: quantization_config {_show(json.dumps(q, sort_keys=True))} is not supported "
                        "(supported: quant_method awq, bits 4, zero_point true, version gemm)")
    if not isinstance(group, int) or isinstance(group, bool) or group < 8 or group & (group - 1):
        raise UserError(f"{where}: quantization_config group_size must be a power of two >= 8, got {_show(group)}")
    return group


def check_config_dimensions(raw: dict, where: str) -> None:
    """The sizes of a Hugging Face config that the model is built from: positive integers that fit
    together (heads divide hidden, as transformers requires; KV heads divide heads), finite norm eps
    and rope theta; else UserError naming the field."""
    where = f"model config {where}"
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        check_int(raw[key], where, key, lo=1)
    heads, hidden = int(raw["num_attention_heads"]), int(raw["hidden_size"])
    kv = raw.get("num_key_value_heads")
    kv = heads if kv is None else check_int(kv, where, "num_key_value_heads", lo=1)
    if heads % kv:
        raise UserError(f"{where}: num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    if raw.get("head_dim") is not None:
        check_int(raw["head_dim"], where, "head_dim", lo=1)
    if hidden % heads:
        raise UserError(f"{where}: num_attention_heads {heads} does not divide hidden_size {hidden}")
    for key in ("max_position_embeddings",):
        if raw.get(key) is not None:
            check_int(raw[key], where, key, lo=1)
    for key in ("rms_norm_eps", "rope_theta"):
        if raw.get(key) is not None:
            v = check_number(raw[key], where, key)
            if v <= 0:
                raise UserError(f"{where}: {key} must be > 0, got {_show(raw[key])}")
    for key in ("tie_word_embeddings", "attention_bias"):
        if raw.get(key) is not None and not isinstance(raw[key], bool):
            raise UserError(f"{where}: {key} must be true or false, got {_show(raw[key])}")
    for key in ("rope_scaling", "rope_parameters"):
        if raw.get(key) is not None and not isinstance(raw[key], dict):
            raise UserError(f"{where}: {key} must be an object or null, got {_show(raw[key])}")


@dataclass(frozen=True)
class Shard:
    """Per-rank shapes of a model under tensor parallelism of degree `tp`.

    Head counts are zero-padded so that `tp` divides them (padded heads have zero weights and
    contribute nothing); `ffn` and `vocab` are padded up to a multiple of `tp` the same way.
    """

    tp: int
    q_heads: int  # query heads per rank
    kv_heads: int  # KV heads per rank (a KV head is replicated when tp > num_kv_heads)
    ffn: int  # intermediate size per rank
    vocab: int  # LM-head rows per rank


@dataclass(frozen=True)
class ModelSpec:
    """Architecture numbers of one model, read from a Hugging Face `config.json`."""

    name: str
    architecture: str  # "llama" | "qwen2"
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    qkv_bias: bool
    tie_embeddings: bool
    dtype_bytes: int = 2
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position: int = 8192
    weight_format: str = "native"  # "fp8": GEMM weights (qkv, o, gate/up, down, LM head) at 1 byte + row scales;
    # "int4": qkv, o, gate/up, down packed at half a byte + a float16 scale and zero per group_size inputs
    group_size: int = 128

    @classmethod
    def from_config(cls, name_or_path: str | Path, dtype_bytes: int | None = None) -> ModelSpec:
        """Read a bundled name or a local checkpoint folder through `transformers.AutoConfig`."""
        folder = resolve_model_path(name_or_path)
        cfg_file = folder / "config.json"
        raw = parse_json(read_text(cfg_file, "model config"), f"model config {cfg_file}")
        if not isinstance(raw, dict):
            raise UserError(f"model config {cfg_file} is malformed: expected a JSON object")
        missing = [k for k in _REQUIRED_CONFIG_KEYS if k not in raw]
        if missing:
            raise UserError(f"{cfg_file} lacks required fields: {', '.join(missing)}")
        if raw["model_type"] not in SUPPORTED_MODEL_TYPES:
            raise UserError(
                f"{cfg_file}: architecture {_show(raw['model_type'])} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        check_config_dimensions(raw, str(cfg_file))
        from transformers import AutoConfig  # heavy import: paid only when a config is read

        try:
            cfg = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        except Exception as e:  # transformers' own validation errors have several types
            msg = str(e).strip().splitlines()[-1].strip() if str(e).strip() else type(e).__name__
            raise UserError(f"model config {cfg_file} is not a valid config ({msg})") from None
        heads = cfg.num_attention_heads
        kv = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        if dtype_bytes is None:
            dt = raw.get("torch_dtype") or raw.get("dtype") or "bfloat16"
            dtype_bytes = _DTYPE_BYTES.get(str(dt).replace("torch.", ""), 2)
        rope_scaling = getattr(cfg, "rope_scaling", None)
        rope_theta = getattr(cfg, "rope_theta", None)
        rope_params = getattr(cfg, "rope_parameters", None)  # transformers >= 5
        if isinstance(rope_params, dict):
            rope_theta = rope_params.get("rope_theta", rope_theta)
            if rope_params.get("rope_type", "default") != "default":
                rope_scaling = {k: v for k, v in rope_params.items() if k != "rope_theta"}
        if isinstance(rope_scaling, dict) and rope_scaling.get("rope_type", "default") == "default":
            rope_scaling = None
        awq_group = awq_group_size(raw, str(cfg_file))
        return cls(
            name=folder.name,
            architecture=raw["model_type"],
            num_layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            ffn=cfg.intermediate_size,
            vocab=cfg.vocab_size,
            qkv_bias=raw["model_type"] == "qwen2" or bool(raw.get("attention_bias", False)),
            tie_embeddings=bool(raw.get("tie_word_embeddings", False)),
            dtype_bytes=dtype_bytes,
            rms_eps=float(cfg.rms_norm_eps),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=dict(rope_scaling) if rope_scaling else None,
            max_position=int(getattr(cfg, "max_position_embeddings", 8192)),
            weight_format="native" if awq_group is None else "int4",
            group_size=awq_group or 128,
        )

    def shard(self, tp: int) -> Shard:
        """Per-rank head/ffn/vocab counts at TP degree `tp` (zero-padded where tp does not divide;
        int4: ffn padded to whole groups)."""
        if tp < 1:
            raise UserError(f"TP degree must be >= 1, got {tp}")
        group = self.num_heads // self.num_kv_heads  # query heads per KV head
        if self.num_kv_heads % tp == 0:
            kv_local = self.num_kv_heads // tp
            q_local = kv_local * group
        elif tp % self.num_kv_heads == 0:
            # each KV head replicated over tp/num_kv ranks, its query heads split (and padded)
            kv_local = 1
            q_local = math.ceil(group / (tp // self.num_kv_heads))
        else:
            # pad whole KV groups (KV head + its query heads) with zeros up to a multiple of tp
            kv_local = math.ceil(self.num_kv_heads / tp)
            q_local = kv_local * group
        ffn = math.ceil(self.ffn / tp)
        if self.weight_format == "int4":  # whole groups per rank: the down projection's inputs pack
            ffn = math.ceil(ffn / self.group_size) * self.group_size
        return Shard(
            tp=tp,
            q_heads=q_local,
            kv_heads=kv_local,
            ffn=ffn,
            vocab=math.ceil(self.vocab / tp),
        )

    @property
    def fp8(self) -> bool:
        return self.weight_format == "fp8"

    def linear_shapes(self, tp: int = 1) -> dict[str, tuple[int, int]]:
        """One decoder layer's GEMM weights on one rank at TP degree `tp`, name -> (N output rows,
        K inputs): qkv and gate_up split N (column-parallel), o and down split K (row-parallel)."""
        s, hd, h = self.shard(tp), self.head_dim, self.hidden
        return {"qkv": ((s.q_heads + 2 * s.kv_heads) * hd, h), "o": (h, s.q_heads * hd),
                "gate_up": (2 * s.ffn, h), "down": (h, s.ffn)}

    def layer_weight_bytes(self, tp: int = 1) -> int:
        """Bytes of one decoder layer's weights on one rank (qkv, o, gate/up, down, 2 norms); fp8:
        the four GEMM weights at one byte each plus a float32 scale per output row; int4: half a
        byte each plus a float16 scale and zero point per group of `group_size` inputs."""
        shapes = self.linear_shapes(tp)
        gemm = sum(n * k for n, k in shapes.values())
        qkv_rows = shapes["qkv"][0]
        small = (qkv_rows if self.qkv_bias else 0) + 2 * self.hidden  # bias and norms: the model dtype
        if self.fp8:  # a float32 scale per output row
            return gemm + 4 * sum(n for n, _ in shapes.values()) + small * self.dtype_bytes
        if self.weight_format == "int4":
            return gemm // 2 + 4 * gemm // self.group_size + small * self.dtype_bytes
        return (gemm + small) * self.dtype_bytes

    def weight_bytes(self, tp: int = 1) -> int:
        """Bytes of all weights held by one rank (embedding replicated, LM head vocab-sharded; fp8:
        the LM head is its own fp8 copy even when tied; int4: the LM head in the model dtype)."""
        s = self.shard(tp)
        embed = self.vocab * self.hidden * self.dtype_bytes
        if self.fp8:
            lm_head = s.vocab * (self.hidden + 4)
        else:
            lm_head = 0 if (self.tie_embeddings and tp == 1) else s.vocab * self.hidden * self.dtype_bytes
        return self.num_layers * self.layer_weight_bytes(tp) + embed + lm_head + self.hidden * self.dtype_bytes

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes one token occupies on one rank (all layers, K and V)."""
        return 2 * self.num_layers * self.shard(tp).kv_heads * self.head_dim * self.dtype_bytes

    def param_count(self) -> int:
        """Parameters of the whole model (tied embeddings counted once)."""
        return dataclasses.replace(self, weight_format="native", dtype_bytes=1).weight_bytes(1)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------------------------
# Mode, Split, TreePolicy


#: decoding loops: "host" keeps the draft tree in Python lists and syncs every step; "device" keeps it
#: in fixed-shape device tensors, replayed as CUDA graphs (runtime/device_loop.py)
LOOPS = ("host", "device")


class Mode(str, enum.Enum):
    """How draft and target share the work.

    autoregressive: target only, one token per step.
    chain:          draft proposes a sequence, target verifies it, on the same GPUs.
    serial:         draft grows a token tree, then target verifies it, on the same GPUs.
    async:          SwiftSpec: draft and target on disjoint GPU groups, overlapped.
    """

    autoregressive = "autoregressive"
    chain = "chain"
    serial = "serial"
    async_ = "async"

    @classmethod
    def parse(cls, text: str) -> Mode:
        try:
            return cls(text)
        except ValueError:
            raise UserError(
                f"unknown mode {text!r}: choose from {', '.join(m.value for m in cls)}"
            ) from None

    def __str__(self) -> str:
        return self.value


ALL_MODES = tuple(Mode)


def _parse_mode(text: str, where: str) -> Mode:
    try:
        return Mode.parse(text)
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


@dataclass(frozen=True)
class SamplingParams:
    """How the target's tokens are chosen; the same in every mode, so speculation stays lossless.

    temperature 0: greedy (the target's argmax). temperature > 0: the target's own draws at that
    temperature from a generator seeded by `seed`, so every mode produces the same tokens for the
    same seed. top_k (0: off) keeps the k most likely tokens, top_p (1: off) the smallest set of
    most likely tokens whose probability reaches p; both need temperature > 0.
    """

    temperature: float = 0.0
    seed: int = 0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise UserError(f"temperature must be a finite number >= 0 (0: greedy), got {self.temperature}")
        if isinstance(self.top_k, bool) or int(self.top_k) != self.top_k or self.top_k < 0:
            raise UserError(f"top-k must be an integer >= 0 (0: off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top-p must be in (0, 1] (1: off), got {self.top_p}")
        if self.greedy and (self.top_k or self.top_p < 1):
            raise UserError("top-k and top-p need a temperature > 0 (they cut the sampled distribution)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def for_prompt(self, i: int) -> SamplingParams:
        """The params of prompt i of a set: its draws seeded `seed + i`."""
        return dataclasses.replace(self, seed=self.seed + i)


@dataclass(frozen=True)
class Split:
    """Which GPUs (or CPU ranks) the draft group and the target group get.

    TP degree of a group = its size. Co-located modes (chain, serial) give both groups the same
    GPUs; `async` gives them disjoint GPUs; `autoregressive` has no draft group.
    """

    target_gpus: tuple[int, ...]
    draft_gpus: tuple[int, ...] = ()

    @property
    def target_tp(self) -> int:
        return len(self.target_gpus)

    @property
    def draft_tp(self) -> int:
        return len(self.draft_gpus)

    @property
    def num_gpus(self) -> int:
        return len(set(self.target_gpus) | set(self.draft_gpus))

    @property
    def colocated(self) -> bool:
        return set(self.target_gpus) == set(self.draft_gpus)

    @classmethod
    def disaggregated(cls, draft_gpus: int, target_gpus: int, target_first: bool = False) -> Split:
        """Draft on GPUs 0..draft_gpus-1 and the target on the next target_gpus GPUs, or the
        target first when `target_first` (keeps a large target group inside one node)."""
        if target_first:
            return cls(
                target_gpus=tuple(range(target_gpus)),
                draft_gpus=tuple(range(target_gpus, target_gpus + draft_gpus)),
            )
        return cls(
            target_gpus=tuple(range(draft_gpus, draft_gpus + target_gpus)),
            draft_gpus=tuple(range(draft_gpus)),
        )

    @classmethod
    def shared(cls, gpus: int, with_draft: bool = True) -> Split:
        """Both groups on GPUs 0..gpus-1 (or target only when `with_draft` is False)."""
        ids = tuple(range(gpus))
        return cls(target_gpus=ids, draft_gpus=ids if with_draft else ())

    def validate(self, mode: Mode) -> None:
        if not self.target_gpus:
            raise UserError("the target group needs at least one GPU")
        if len(set(self.target_gpus)) != len(self.target_gpus) or len(set(self.draft_gpus)) != len(
            self.draft_gpus
        ):
            raise UserError(f"a GPU is listed twice in {self}")
        if mode is Mode.autoregressive and self.draft_gpus:
            raise UserError("autoregressive mode has no draft: give the draft no GPUs")
        if mode in (Mode.chain, Mode.serial) and not self.colocated:
            raise UserError(f"{mode} mode runs draft and target on the same GPUs")
        if mode is Mode.async_:
            if not self.draft_gpus:
                raise UserError(
                    "async mode needs at least 2 GPUs: the draft and the target run on disjoint "
                    "GPU groups (use serial or chain on 1 GPU)"
                )
            if set(self.draft_gpus) & set(self.target_gpus):
                raise UserError("async mode needs disjoint draft and target GPUs")

    def to_dict(self) -> dict:
        return {"target_gpus": list(self.target_gpus), "draft_gpus": list(self.draft_gpus)}

    @classmethod
    def from_dict(cls, d: dict, where: str = "split") -> Split:
        d = check_dict(d, where, "split")
        gpus = {}
        for key in ("target_gpus", "draft_gpus"):
            raw = check_list(require(d, key, where) if key == "target_gpus" else d.get(key, []), where, key)
            gpus[key] = tuple(check_int(g, where, f"{key}[{i}]", lo=0) for i, g in enumerate(raw))
        return cls(gpus["target_gpus"], gpus["draft_gpus"])


@dataclass(frozen=True)
class TreePolicy:
    """How the draft tree grows and what the target verifies.

    bs:        tree nodes sent to the target per verify, the root included (the root is the last
               verified token, whose KV the target has not computed yet). Autoregressive: 1.
    w:         leaves expanded per draft forward (w=1 with a chain).
    d:         draft expansions per round (serial/chain: per iteration; async: while the target
               verifies).
    max_depth: deepest node below the root that may be grown (0 = no limit).
    kind:      "dynamic" (max-likelihood growth, SwiftSpec) or "static" (a fixed topology, e.g.
               from the Sequoia DP, filled with the draft's top-ranked children).
    topology:  for kind="static": parent index of each node, node 0 is the root (parent -1),
               parents precede children, children of a node listed in draft-rank order.
    """

    bs: int = 8
    w: int = 8
    d: int = 4
    max_depth: int = 0
    kind: str = "dynamic"
    topology: tuple[int, ...] | None = None

    @property
    def key(self) -> str:
        """Compact id used in tables and JSON keys, e.g. `bs8-w8-d4` or `static-bs16`."""
        if self.kind == "static":
            return f"static-bs{self.bs}"
        return f"bs{self.bs}-w{self.w}-d{self.d}" + (f"-D{self.max_depth}" if self.max_depth else "")

    @property
    def keep_limit(self) -> int:
        """Nodes kept when a tree is re-rooted (async): what one round of `d` expansions can create."""
        return 1 + self.d * self.w * self.w

    @classmethod
    def chain(cls, k: int) -> TreePolicy:
        """Classic speculation: k drafted tokens in a sequence (k+1 nodes with the root)."""
        return cls(bs=k + 1, w=1, d=k)

    @classmethod
    def autoregressive(cls) -> TreePolicy:
        return cls(bs=1, w=1, d=0)

    def validate(self, mode: Mode | None = None) -> None:
        if self.bs < 1 or self.w < 1 or self.d < 0 or self.max_depth < 0:
            raise UserError(f"tree policy {self.key}: bs, w >= 1 and d, max_depth >= 0 required")
        if self.kind not in ("dynamic", "static"):
            raise UserError(f"tree policy kind must be dynamic or static, got {self.kind!r}")
        if self.kind == "static":
            topo = self.topology
            if topo is None or len(topo) != self.bs or topo[0] != -1:
                raise UserError("a static tree policy needs a topology of bs parent indices, root first")
            if any(not (0 <= p < i) for i, p in enumerate(topo) if i > 0):
                raise UserError("static topology: every parent must precede its child")
        if mode is Mode.autoregressive and self.bs != 1:
            raise UserError("autoregressive mode verifies one token: bs must be 1")
        if mode is Mode.chain and self.w != 1:
            raise UserError("chain mode grows a sequence: w must be 1")
        if mode in (Mode.serial, Mode.chain, Mode.async_) and self.bs < 2:
            raise UserError(f"{mode} mode needs bs >= 2 (the root plus at least one drafted token)")
        if mode in (Mode.serial, Mode.chain) and self.kind == "dynamic" and self.d < 1:
            raise UserError(f"{mode} mode needs d >= 1 draft expansions")

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["topology"] = list(self.topology) if self.topology is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "tree policy") -> TreePolicy:
        d = check_dict(d, where, "policy")
        topo = d.get("topology")
        if topo is not None:
            topo = tuple(check_int(x, where, f"topology[{i}]", lo=-1)
                         for i, x in enumerate(check_list(topo, where, "topology")))
        return cls(
            bs=check_int(require(d, "bs", where), where, "policy bs", lo=1),
            w=check_int(require(d, "w", where), where, "policy w", lo=1),
            d=check_int(require(d, "d", where), where, "policy d", lo=0),
            max_depth=check_int(d.get("max_depth", 0), where, "policy max_depth", lo=0),
            kind=check_str(d.get("kind", "dynamic"), where, "policy kind"),
            topology=topo,
        )


# --------------------------------------------------------------------------------------------
# Provenance of inputs


def file_sha256(path: str | Path) -> str:
    """Content hash of a file, or of every file in a folder (sorted by name)."""
    p = Path(path)
    h = hashlib.sha256()
    files = sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
    for q in files:
        h.update(q.name.encode())
        h.update(q.read_bytes())
    return h.hexdigest()


@dataclass(frozen=True)
class SourceRef:
    """Where an input came from: path (or `builtin:<name>`), content hash, and its label.

    `label` is what every output repeats, e.g. `derived`, `measured, NVIDIA H200, <date>` for a
    profile, or `synthetic (qwen2-72b-table7)` / `measured` for an acceptance profile.
    """

    path: str
    sha256: str
    label: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "source") -> SourceRef:
        d = check_dict(d, where, "source")
        return cls(*(check_str(require(d, k, where), where, k, empty=True) for k in ("path", "sha256", "label")))


def read_json_object(path: Path, what: str, hint: str) -> dict:
    """Read a JSON object from `path`; missing file, non-UTF-8 text, bad JSON or a non-object -> UserError."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{what} {path} not found: {hint}")
    d = parse_json(read_text(path, what), f"{what} {path}")
    if not isinstance(d, dict):
        raise UserError(f"{what} {path} is malformed: expected a JSON object")
    return d


# --------------------------------------------------------------------------------------------
# Profile: measured (or derived) latency tables


COMPUTE_COLUMNS = ("op", "model", "tp", "tokens", "kv_len", "ms")
COMM_COLUMNS = ("collective", "group_size", "bytes", "ms")
COMPUTE_KEY = ("op", "model", "tp", "tokens", "kv_len")  # one row per key: a second is refused
COMM_KEY = ("collective", "group_size", "bytes")
_TEXT_COLUMNS = ("op", "model", "collective")
_INT_COLUMNS = {"tp": 1, "tokens": 0, "kv_len": 0, "group_size": 1, "bytes": 0}  # column -> lowest value


def _check_table(df: pd.DataFrame, file: str, cols: tuple[str, ...], key: tuple[str, ...]) -> None:
    """One profile table: every column present, text keys, integer sizes, finite ms >= 0 and no
    key twice; a bad cell -> UserError naming `file`, the row (1 = the first after the header),
    the column and the value."""
    missing = [c for c in cols if c not in df.columns]
    if missing:
        raise UserError(f"{file} lacks columns {', '.join(missing)} (it needs {', '.join(cols)})")

    def bad(col: str, mask: pd.Series, what: str) -> None:
        if mask.any():
            i = int(mask.to_numpy().nonzero()[0][0])
            raise UserError(f"{file} row {i + 1} column {col}: {_show(df[col].iloc[i])} {what}")

    for c in cols:
        col = df[c]
        bad(c, col.isna(), "is empty or NaN: fill it with a measured value or re-profile")
        if c in _TEXT_COLUMNS:
            bad(c, ~col.map(lambda v: isinstance(v, str) and bool(v.strip())).astype(bool), "is not a name")
            continue
        num = pd.to_numeric(col, errors="coerce") if not pd.api.types.is_numeric_dtype(col) else col
        bad(c, num.isna() | pd.Series(pd.api.types.is_bool_dtype(num), index=num.index), "is not a number")
        num = num.astype(float)
        bad(c, ~pd.Series(np.isfinite(num.to_numpy()), index=num.index), "is not finite")
        if c in _INT_COLUMNS:
            bad(c, num != num.round(), "is not an integer")
            bad(c, num < _INT_COLUMNS[c], f"must be >= {_INT_COLUMNS[c]}")
            bad(c, num > 2**53, "is too large")
            df[c] = num.astype("int64")
        else:
            bad(c, num < 0, "is negative")
            df[c] = num  # numbers pandas kept as text (a 30-digit cell) are floats from here on
    dup = df.duplicated(list(key), keep=False)
    if dup.any():
        rows = dup.to_numpy().nonzero()[0]
        first = df.iloc[rows[0]]
        same = [int(r) + 1 for r in rows if all(df.iloc[r][k] == first[k] for k in key)]
        desc = ", ".join(f"{k}={first[k]}" for k in key)
        raise UserError(f"{file} has {len(same)} rows for one key ({desc}; rows {', '.join(map(str, same[:4]))}): "
                        "re-run the profile into an empty folder or remove the duplicate rows")


def _check_profile_meta(meta: Any, file: str) -> None:
    """meta.json: an object whose fields that swiftspec reads have the right types."""
    if not isinstance(meta, dict):
        raise UserError(f"{file} is malformed: expected a JSON object")
    if "source" not in meta:
        raise UserError(f"{file} lacks 'source' (measured or derived)")
    check_str(meta["source"], file, "source")
    for k in ("device", "weight_format"):
        if meta.get(k) is not None:
            check_str(meta[k], file, k)
    if meta.get("memory_bytes") is not None:
        check_number(meta["memory_bytes"], file, "memory_bytes", lo=0)
    for k in ("unmeasured", "kernels_unlike_runtime"):  # both named in the profile's label
        if meta.get(k) is not None and not (isinstance(meta[k], list) and all(isinstance(u, str) for u in meta[k])):
            raise UserError(f"{file}: {k} must be a list of strings, got {_show(meta[k])}")


def _read_csv(path: Path, what: str) -> pd.DataFrame:
    """A profile CSV (UTF-8) as a DataFrame; unparseable text -> UserError naming the file."""
    text = read_text(path, what)
    try:
        df = pd.read_csv(io.StringIO(text))
    except pd.errors.EmptyDataError:
        raise UserError(f"{what} {path} is empty: it needs a header line") from None
    except (ValueError, pd.errors.ParserError) as e:
        raise UserError(f"{what} {path} is malformed: {str(e).splitlines()[0]}") from None
    for c in df.columns:  # integral floats (2.0) in a size column: read as integers
        if c in _INT_COLUMNS and pd.api.types.is_float_dtype(df[c]) and df[c].notna().all() and \
                np.isfinite(df[c]).all() and (df[c] == df[c].round()).all() and (df[c].abs() <= 2**53).all():  # fmt: skip
            df[c] = df[c].astype("int64")
    return df


def profile_path(folder: str | Path) -> Path:
    """The folder of a profile: `folder` itself, or for `builtin:NAME` the bundled
    swiftspec/data/profiles/NAME (h200-measured, h200-fp8, h200-derived)."""
    if not str(folder).startswith("builtin:"):
        return Path(folder)
    base = Path(str(resources.files("swiftspec") / "data" / "profiles"))
    name = str(folder).split(":", 1)[1]
    if not name or not (base / name / "meta.json").is_file():
        have = sorted(q.name for q in base.iterdir() if (q / "meta.json").is_file())
        raise UserError(f"no bundled profile {name!r}: the bundled ones are "
                        f"{', '.join('builtin:' + h for h in have)}")
    return base / name


@dataclass
class Profile:
    """Latencies on one hardware type, as tidy tables (one folder: compute.csv, comm.csv, meta.json).

    compute: columns op, model, tp, tokens, kv_len, ms (+ optional extra columns such as p10/p90).
             `op` is one of the runtime's pieces: `layers` (whole decoder stack of one TP shard,
             no communication), `lm_head`, `embed`, `tree_growth` (log-softmax + top-w over
             `tokens` rows), `kv_compact`, `host` (host work of one iteration; model = mode name).
             `model` is a ModelSpec name; `tokens` the tokens in the forward; `kv_len` the
             cache length attended (0 where it does not matter). Times are medians in ms.
    comm:    columns collective, group_size, bytes, ms; collective one of `all_reduce`,
             `all_reduce_oneshot`, `send_recv`, `internode_send_recv`.
    meta:    gpu, driver, torch, triton, date, command, device ("cuda"|"cpu"),
             memory_bytes (per GPU), source ("measured"|"derived"), unmeasured (parts of a
             measured profile that are copied defaults, named in its label), plus free-form notes.
    """

    compute: pd.DataFrame
    comm: pd.DataFrame
    meta: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """`derived` or `measured, <gpu>, <date>`: repeated in every output that uses it, with the
        kernel settings whose rows this runtime no longer runs (meta.json `kernels_unlike_runtime`,
        `kernel_config.kernel_mismatch`'s lines) named after it."""
        unlike = list(self.meta.get("kernels_unlike_runtime") or [])
        label = self.base_label
        return f"{label}; kernels unlike the runtime's: {', '.join(unlike)}" if unlike else label

    @property
    def base_label(self) -> str:
        """The label without the kernel settings (a derived profile keeps its source's)."""
        src = self.meta.get("source", "measured")
        if src == "measured":
            label = f"measured, {self.meta.get('gpu', '?')}, {str(self.meta.get('date', '?'))[:10]}"
            if self.meta.get("weight_format", "native") != "native":
                label += f", {self.meta['weight_format']} weights"
            unmeasured = list(self.meta.get("unmeasured") or [])
            comm = self.meta.get("comm")
            if isinstance(comm, dict) and comm.get("source") == "derived" and not any(
                    u.startswith("comm") for u in unmeasured):  # fmt: skip
                unmeasured.insert(0, f"comm (published NVLink numbers: {comm.get('gpu_count', '?')} GPU)")
            return f"{label}; not measured: {', '.join(unmeasured)}" if unmeasured else label
        origin, hw = self.meta.get("derived_from"), self.meta.get("hardware")
        if src == "derived" and isinstance(origin, dict) and isinstance(hw, dict):  # `profile derive`
            label = f"derived from {origin.get('label', '?')} for {hw.get('name', '?')} ({hw.get('source', '?')})"
            fmt = self.meta.get("weight_format", "native")
            return label if fmt == "native" or f"{fmt} weights" in label else f"{label}, {fmt} weights"
        return str(src)

    def validate(self, where: str = "profile") -> None:
        """Columns, cell types and ranges, unique keys and meta fields (`_check_table`)."""
        _check_table(self.compute, f"{where}/compute.csv", COMPUTE_COLUMNS, COMPUTE_KEY)
        _check_table(self.comm, f"{where}/comm.csv", COMM_COLUMNS, COMM_KEY)
        _check_profile_meta(self.meta, f"{where}/meta.json")

    def save(self, folder: str | Path) -> None:
        """Write the three files; the folder appears complete or not at all."""
        with atomic_dir(folder) as tmp:
            self.compute.to_csv(tmp / "compute.csv", index=False)
            self.comm.to_csv(tmp / "comm.csv", index=False)
            (tmp / "meta.json").write_text(json.dumps(self.meta, indent=2, default=str) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> Profile:
        """Read a profile folder, or `builtin:NAME` for one bundled with swiftspec (`profile_path`)."""
        p = profile_path(folder)
        if not p.is_dir():
            raise UserError(f"profile {p} not found: give a folder holding compute.csv, comm.csv, meta.json")
        for name in ("compute.csv", "meta.json"):
            if not (p / name).exists():
                raise UserError(f"profile {p} lacks {name}: give a folder holding compute.csv, comm.csv, meta.json")
        compute = _read_csv(p / "compute.csv", "profile table")
        comm = (_read_csv(p / "comm.csv", "profile table") if (p / "comm.csv").exists()
                else pd.DataFrame({"collective": pd.Series(dtype=str), "group_size": pd.Series(dtype="int64"),
                                   "bytes": pd.Series(dtype="int64"), "ms": pd.Series(dtype=float)}))
        meta = parse_json(read_text(p / "meta.json", "profile meta"), f"profile meta {p / 'meta.json'}")
        prof = cls(compute=compute, comm=comm, meta=meta)
        prof.validate(str(p))
        return prof


# --------------------------------------------------------------------------------------------
# AcceptanceProfile: how often the target agrees with the draft


@dataclass
class AcceptanceProfile:
    """Measured (or synthetic) acceptance behaviour of one draft/target pair.

    traces:          one list per prompt, one entry per position along the *target's* greedy
                     path: the 0-based rank of the target's token in the draft's distribution at
                     that position, or -1 when it is not among the draft's `top_k` tokens.
    trace_probs:     same layout: the draft's probability of the target's token there.
    positional:      Sequoia's positional acceptance vector, p[k] = P(target token is the draft's
                     (k+1)-th most likely token); sums to <= 1.
    draft_prob_by_rank: mean draft probability of the draft's (k+1)-th most likely token, used to
                     shape dynamic (max-likelihood) trees in the simulator.
    accepted:        mean accepted length (tokens per verify, bonus token included) that the
                     runtime measured, by TreePolicy key and mode, e.g. {"serial/bs8-w8-d4": 3.6}.
    meta:            target, draft, prompts, source ("measured"|"synthetic"), name, date, command.
    """

    positional: list[float]
    draft_prob_by_rank: list[float]
    traces: list[list[int]] = field(default_factory=list)
    trace_probs: list[list[float]] = field(default_factory=list)
    top_k: int = 0
    accepted: dict[str, float] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def synthetic(self) -> bool:
        return self.meta.get("source") != "measured"

    @property
    def label(self) -> str:
        """`measured` or `synthetic (<name>)`: repeated in every output that uses it."""
        if self.synthetic:
            return f"synthetic ({self.meta.get('name', 'unnamed')})"
        return "measured"

    def validate(self, where: str = "acceptance profile") -> None:
        p = self.positional
        if not p or any(not (0.0 <= x <= 1.0) for x in p) or sum(p) > 1.0 + 1e-6:
            raise UserError(f"{where}: positional must be probabilities in [0, 1] summing to <= 1")
        if not self.draft_prob_by_rank or any(not (0.0 <= x <= 1.0) for x in self.draft_prob_by_rank):
            raise UserError(f"{where}: draft_prob_by_rank must be probabilities in [0, 1]")
        if len(self.trace_probs) not in (0, len(self.traces)):
            raise UserError(f"{where}: trace_probs must have one list per trace")
        for t in self.traces:
            if any((not isinstance(r, int)) or r < -1 for r in t):
                raise UserError(f"{where}: traces hold ranks (integers >= -1)")
        if self.top_k and any(r >= self.top_k for t in self.traces for r in t):
            raise UserError(f"{where}: traces hold ranks below top_k {self.top_k} (or -1)")
        if any(len(t) != len(q) for t, q in zip(self.traces, self.trace_probs)):
            raise UserError(f"{where}: each trace_probs list must be as long as its trace")
        if "source" not in self.meta:
            raise UserError(f"{where}: meta lacks 'source' (measured or synthetic)")
        if not isinstance(self.meta["source"], str):
            raise UserError(f"{where}: meta source must be a string (measured or synthetic)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "acceptance profile") -> AcceptanceProfile:
        d = check_dict(d, where, "acceptance profile")

        def probs(v: Any, name: str) -> list[float]:
            return [check_number(x, where, f"{name}[{i}]", 0.0, 1.0) for i, x in enumerate(check_list(v, where, name))]

        def nested(key: str, one: Callable[[Any, str], Any]) -> list:
            return [[one(x, f"{key}[{i}][{j}]") for j, x in enumerate(check_list(t, where, f"{key}[{i}]"))]
                    for i, t in enumerate(check_list(d.get(key, []), where, key))]

        acc = check_dict(d.get("accepted", {}), where, "accepted")
        ap = cls(
            positional=probs(require(d, "positional", where), "positional"),
            draft_prob_by_rank=probs(require(d, "draft_prob_by_rank", where), "draft_prob_by_rank"),
            traces=nested("traces", lambda x, n: check_int(x, where, n, lo=-1)),
            trace_probs=nested("trace_probs", lambda x, n: check_number(x, where, n, 0.0, 1.0)),
            top_k=check_int(d.get("top_k", 0), where, "top_k", lo=0),
            accepted={str(k): check_number(v, where, f"accepted[{k!r}]", lo=0) for k, v in acc.items()},
            meta=dict(check_dict(d.get("meta", {}), where, "meta")),
        )
        ap.validate(where)
        return ap

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict()) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> AcceptanceProfile:
        p = Path(path)
        d = read_json_object(p, "acceptance profile", hint="make one with `swiftspec profile acceptance`")
        return cls.from_dict(d, where=f"acceptance profile {p}")


# --------------------------------------------------------------------------------------------
# Plan


@dataclass(frozen=True)
class Prediction:
    """What the simulator predicts for one configuration.

    tokens_per_s_{mean,p50,p95}: over simulated requests (p95 = the slow tail, i.e. the 5th
    percentile of per-request tokens/s). iteration_ms: mean wall time of one iteration.
    breakdown_ms: mean time per iteration spent in each piece (draft, target, comm, host, ...).
    """

    tokens_per_s_mean: float
    tokens_per_s_p50: float
    tokens_per_s_p95: float
    mean_accepted: float
    iteration_ms: float
    breakdown_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "prediction") -> Prediction:
        d = check_dict(d, where, "prediction")
        keys = ("tokens_per_s_mean", "tokens_per_s_p50", "tokens_per_s_p95", "mean_accepted", "iteration_ms")
        vals = {k: check_number(require(d, k, where), where, f"prediction {k}", lo=0) for k in keys}
        bd = check_dict(d.get("breakdown_ms", {}), where, "prediction breakdown_ms")
        return cls(**vals, breakdown_ms={str(k): check_number(v, where, f"breakdown_ms[{k!r}]")
                                         for k, v in bd.items()})


@dataclass(frozen=True)
class Plan:
    """A configuration to run and what it is predicted to do.

    target / draft: bundled model names or checkpoint paths (draft None for autoregressive).
    device: "cuda" or "cpu"; gpus_per_node: for plans across nodes.
    """

    target: str
    draft: str | None
    split: Split
    mode: Mode
    policy: TreePolicy
    prediction: Prediction | None = None
    profile: SourceRef | None = None
    acceptance: SourceRef | None = None
    device: str = "cuda"
    gpus_per_node: int = 8
    max_len: int = 4096
    meta: dict = field(default_factory=dict)

    def validate(self) -> None:
        self.split.validate(self.mode)
        self.policy.validate(self.mode)
        if self.mode is not Mode.autoregressive and not self.draft:
            raise UserError(f"{self.mode} mode needs a draft model")
        if self.device not in ("cuda", "cpu"):
            raise UserError(f"device must be cuda or cpu, got {_show(self.device)}")

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "draft": self.draft,
            "split": self.split.to_dict(),
            "mode": self.mode.value,
            "policy": self.policy.to_dict(),
            "prediction": self.prediction.to_dict() if self.prediction else None,
            "profile": self.profile.to_dict() if self.profile else None,
            "acceptance": self.acceptance.to_dict() if self.acceptance else None,
            "device": self.device,
            "gpus_per_node": self.gpus_per_node,
            "max_len": self.max_len,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict, where: str = "plan") -> Plan:
        d = check_dict(d, where, "plan")
        draft = d.get("draft")
        mode = require(d, "mode", where)
        opt = {k: None if d.get(k) is None or d.get(k) == {} else d[k] for k in ("prediction", "profile", "acceptance")}
        plan = cls(
            target=check_str(require(d, "target", where), where, "target"),
            draft=None if draft is None else check_str(draft, where, "draft"),
            split=Split.from_dict(require(d, "split", where), where),
            mode=_parse_mode(check_str(mode, where, "mode"), where),
            policy=TreePolicy.from_dict(require(d, "policy", where), where),
            prediction=Prediction.from_dict(opt["prediction"], where) if opt["prediction"] is not None else None,
            profile=SourceRef.from_dict(opt["profile"], f"{where} profile") if opt["profile"] is not None else None,
            acceptance=(SourceRef.from_dict(opt["acceptance"], f"{where} acceptance")
                        if opt["acceptance"] is not None else None),
            device=check_str(d.get("device", "cuda"), where, "device"),
            gpus_per_node=check_int(d.get("gpus_per_node", 8), where, "gpus_per_node", lo=1),
            max_len=check_int(d.get("max_len", 4096), where, "max_len", lo=1),
            meta=dict(check_dict(d.get("meta", {}), where, "meta")),
        )
        try:
            plan.validate()
        except UserError as e:
            raise UserError(f"{where}: {e}") from None
        return plan

    def save(self, path: str | Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        p = Path(path)
        d = read_json_object(p, "plan", hint=f"make one with `swiftspec plan -o {p}`")
        return cls.from_dict(d, where=f"plan {p}")


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, tuples and numpy scalars -> plain JSON types; a NaN or infinite float
    (a number that does not exist, e.g. a speedup without its baseline) -> None, so the output is
    strict JSON (`null`) that every parser reads."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(obj.to_dict() if hasattr(obj, "to_dict") else dataclasses.asdict(obj))
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
