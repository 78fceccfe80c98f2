"""What ships with swiftspec, and the `builtin:NAME` names that reach it.

`swiftspec list` prints these three tables: the bundled model configs (with their key sizes), the
bundled latency profiles (GPU, weight format, which models at which TP degrees, measured or
derived) and the bundled acceptance profiles (pair, measured or synthetic, temperature).
`resolve_builtin` is the one place a `builtin:NAME` option value becomes what the loaders read,
for every option that takes a profile folder or an acceptance file.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pandas as pd

from swiftspec.spec import ModelSpec, UserError, bundled_models, profile_path

PREFIX = "builtin:"
KINDS = ("profile", "acceptance", "input")


def _data(sub: str) -> Path:
    return Path(str(resources.files("swiftspec") / "data" / sub))


def bundled_profiles() -> list[str]:
    """Names of the bundled profile folders (`builtin:NAME` for --profile)."""
    return sorted(p.name for p in _data("profiles").iterdir() if (p / "meta.json").is_file())


def bundled_acceptance() -> list[str]:
    """Names of the bundled acceptance profiles (`builtin:NAME` for --acceptance)."""
    return sorted(p.stem for p in _data("acceptance").glob("*.json"))


def _known(kind: str) -> list[str]:
    if kind == "profile":
        return bundled_profiles()
    if kind == "acceptance":
        return bundled_acceptance()
    return sorted(set(bundled_profiles()) | set(bundled_acceptance()))


def resolve_builtin(kind: str, text: str | None, as_path: bool = False) -> str | None:
    """An option value as the loaders read it: unchanged unless it is `builtin:NAME`.

    kind "profile": `builtin:NAME` stays as it is (Profile.load reads it, and a plan records the
    portable name) once NAME is known; as_path gives the bundled folder instead. kind
    "acceptance": the bundled JSON file's path (NAME with or without `.json`). kind "input" (the
    studies' -i): the folder or file of either kind. An unknown NAME raises one line that lists
    the known ones.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if text is None or not str(text).startswith(PREFIX):
        return text
    name = str(text)[len(PREFIX):].strip()
    name = name[: -len(".json")] if name.endswith(".json") else name
    if kind in ("profile", "input") and name in bundled_profiles():
        return str(_data("profiles") / name) if as_path or kind == "input" else f"{PREFIX}{name}"
    if kind in ("acceptance", "input") and name in bundled_acceptance():
        return str(_data("acceptance") / f"{name}.json")
    what = {"profile": "profile", "acceptance": "acceptance profile", "input": "profile or acceptance profile"}[kind]
    known = ", ".join(PREFIX + n for n in _known(kind))
    raise UserError(f"no bundled {what} {name!r}: the bundled ones are {known} (see `swiftspec list`)")


def profile_device(profile: str | None) -> str:
    """The device a profile was measured on (its meta.json `device`; cuda for the embedded H200
    profile, None): what `plan` plans for unless --device says otherwise. An unreadable profile
    gives cuda here; its loader then names what is wrong with it."""
    if profile is None:
        return "cuda"
    try:
        meta = json.loads((profile_path(profile) / "meta.json").read_text())
    except (OSError, ValueError, UserError):
        return "cuda"
    dev = meta.get("device", "cuda") if isinstance(meta, dict) else "cuda"
    return dev if dev in ("cpu", "cuda") else "cuda"


# ---- the tables of `swiftspec list` ----------------------------------------------------------


def models_table() -> pd.DataFrame:
    """One row per bundled model config: architecture and the sizes that decide its cost."""
    rows = []
    for name in bundled_models():
        s = ModelSpec.from_config(name)
        rows.append({"name": name, "architecture": s.architecture, "params_b": round(s.param_count() / 1e9, 2),
                     "layers": s.num_layers, "hidden": s.hidden, "heads": s.num_heads, "kv_heads": s.num_kv_heads,
                     "ffn": s.ffn, "vocab": s.vocab, "weights_gb_bf16": round(s.weight_bytes() / 1e9, 1)})
    return pd.DataFrame(rows)


def _tp_ranges(tps: list[int]) -> str:
    return ",".join(str(t) for t in sorted(set(tps)))


def profile_row(name: str) -> dict:
    """What one bundled profile covers: device, GPU, weight format, source, models by TP degree, and
    the kernel settings its rows were timed with that the runtime no longer runs (`Profile.label`)."""
    folder = _data("profiles") / name
    meta = json.loads((folder / "meta.json").read_text())
    compute = pd.read_csv(folder / "compute.csv", usecols=["op", "model", "tp"])
    layers = compute[compute["op"] == "layers"]
    covers = {str(m): [int(t) for t in g["tp"]] for m, g in layers.groupby("model")}
    aliases = meta.get("aliases") if isinstance(meta.get("aliases"), dict) else {}
    for alias, of in aliases.items():
        if of in covers and alias not in covers:
            covers[str(alias)] = covers[of]
    by_tp: dict[str, list[str]] = {}
    for model, tps in sorted(covers.items()):
        by_tp.setdefault(_tp_ranges(tps), []).append(model)
    return {"name": f"{PREFIX}{name}", "source": str(meta.get("source", "measured")),
            "device": str(meta.get("device", "cuda")), "gpu": str(meta.get("gpu", "?")),
            "weight_format": str(meta.get("weight_format", "native")), "dtype": str(meta.get("dtype", "bfloat16")),
            "models": len(covers), "covers": {tp: models for tp, models in by_tp.items()},
            "kernels_unlike_runtime": [str(k) for k in meta.get("kernels_unlike_runtime") or []]}


def profiles_table() -> pd.DataFrame:
    return pd.DataFrame([profile_row(n) for n in bundled_profiles()])


def acceptance_row(name: str) -> dict:
    """One bundled acceptance profile: its pair, source, temperature and measured accepted lengths."""
    d = json.loads((_data("acceptance") / f"{name}.json").read_text())
    meta = d.get("meta", {})
    target = meta.get("target_name") or Path(str(meta.get("target", "?"))).name
    draft = meta.get("draft_name") or Path(str(meta.get("draft", "?"))).name
    traces = d.get("traces") or []
    return {"name": f"{PREFIX}{name}", "target": str(target), "draft": str(draft),
            "source": str(meta.get("source", "measured")), "temperature": float(meta.get("temperature", 0.0)),
            "device": str(meta.get("device", "-")), "positions": int(meta.get("positions", sum(map(len, traces)))),
            "accepted": {str(k): round(float(v), 2) for k, v in (d.get("accepted") or {}).items()}}


def acceptance_table() -> pd.DataFrame:
    return pd.DataFrame([acceptance_row(n) for n in bundled_acceptance()])


def catalog() -> dict[str, list[dict]]:
    """The three tables as JSON-ready lists of rows (`swiftspec list --json`)."""
    return {"models": models_table().to_dict(orient="records"),
            "profiles": profiles_table().to_dict(orient="records"),
            "acceptance": acceptance_table().to_dict(orient="records")}


def catalog_text() -> str:
    """The three tables as text (`swiftspec list`)."""
    models = models_table().to_string(index=False)
    prof = profiles_table()
    prof_lines = []
    for r in prof.itertuples():
        unlike = f"; kernels unlike the runtime's: {', '.join(r.kernels_unlike_runtime)}" if r.kernels_unlike_runtime else ""
        prof_lines.append(f"{r.name}  {r.source}, {r.gpu} ({r.device}), {r.dtype}, {r.weight_format} weights, "
                          f"{r.models} models{unlike}")
        for tp, names in r.covers.items():
            prof_lines.append(f"    TP {tp}: {', '.join(names)}")
    acc = acceptance_table()
    acc_view = pd.DataFrame({
        "name": acc["name"], "pair (target <- draft)": acc["target"] + " <- " + acc["draft"],
        "source": acc["source"],
        "temperature": [f"{t:g}" if t > 0 else "0 (greedy)" for t in acc["temperature"]],
        "positions": acc["positions"],
        "accepted (policy: tokens/verify)": [", ".join(f"{k}: {v:.2f}" for k, v in a.items()) or "-"
                                             for a in acc["accepted"]],
    })  # fmt: skip
    return "\n".join([
        "models (swiftspec/data/configs; give the name to --target, --draft, --models):", models, "",
        "profiles (--profile builtin:NAME):", *prof_lines, "",
        "acceptance profiles (--acceptance builtin:NAME):", acc_view.to_string(index=False),
    ])  # fmt: skip
