"""Merge a partial re-profile into a profile folder (e.g. the bundled h200-measured).

    python benchmarks/merge_profile.py BASE NEW -o OUT [--host base|new]

BASE and NEW are `swiftspec profile compute` folders (compute.csv, comm.csv, meta.json). Every
(model, TP) shard NEW measured replaces that shard's rows in BASE, together with those of the BASE
models that were copied from it (meta.json `aliases`, e.g. R1-Distill-Llama-8B from Llama-3-8B);
shards NEW did not measure keep BASE's rows (a TP 1 re-profile leaves TP 2-8 as they were); NEW's
host rows replace BASE's unless `--host base` (host rows come from a tiny stand-in model and vary
run to run: keep the set that the validation ran with).
comm.csv stays BASE's. meta.json stays BASE's (its `loop` NEW's when NEW's host rows are taken),
with NEW's `skipped`/`incomplete_tables` entries for the replaced models and one entry under
`merged` (date, command, models, tps, kernels) so the file says which rows are newer; each kernel
setting (attention, rope, ...) becomes the one all models' rows were measured with, or "mixed".
Used after a kernel change that only some models' rows need (benchmarks/README.md). OUT is written
through a temporary folder: on error nothing is left behind.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pandas as pd

from swiftspec.runtime.kernel_config import KERNEL_SETTINGS

# meta.json keys naming the kernels a profile was measured with (the weight format must match: checked)
KERNELS = tuple(k for k in KERNEL_SETTINGS if k != "weight_format")


def merge_profiles(base: Path, new: Path, host: str = "new") -> tuple[pd.DataFrame, dict]:
    """(compute rows, meta) of BASE with NEW's (model, tp) shards (and their BASE aliases') replaced,
    and its host rows with NEW's when host="new" and NEW has some."""
    if host not in ("base", "new"):
        raise ValueError(f"host must be 'base' or 'new', got {host!r}")
    for folder in (base, new):
        for name in ("compute.csv", "meta.json"):
            if not (folder / name).is_file():
                raise ValueError(f"{folder / name} is missing: give two `swiftspec profile compute` folders")
    b, n = pd.read_csv(base / "compute.csv"), pd.read_csv(new / "compute.csv")
    mb, mn = json.loads((base / "meta.json").read_text()), json.loads((new / "meta.json").read_text())
    if list(b.columns) != list(n.columns):
        raise ValueError(f"column mismatch: {base} has {list(b.columns)}, {new} has {list(n.columns)}")
    for key, default in (("gpu", None), ("dtype", None), ("weight_format", "native")):  # older folders: native
        if mb.get(key, default) != mn.get(key, default):
            raise ValueError(f"{key} differs: {base} {mb.get(key, default)!r}, {new} {mn.get(key, default)!r};"
                             " merge only like with like")
    models = sorted(set(n[n.op != "host"].model))
    aliases = {a: src for a, src in (mb.get("aliases") or {}).items() if src in models}
    copies = [n[n.model == src].assign(model=a) for a, src in aliases.items()]
    replaced = set(models) | set(aliases)
    new_host = host == "new" and bool((n.op == "host").any())
    shards = {(m, tp) for m, tp in n[n.op != "host"][["model", "tp"]].drop_duplicates().itertuples(index=False)}
    shards |= {(a, tp) for a, src in aliases.items() for m, tp in shards if m == src}
    in_new = pd.MultiIndex.from_frame(b[["model", "tp"]]).isin(shards)
    keep = b[~(in_new & (b.op != "host")) & ~((b.op == "host") & new_host)]
    # NEW's own rows of an alias (a resumed run keeps the ones it was given) give way to the copies
    own = n[~n.model.isin(aliases) & (new_host | (n.op != "host"))]
    rows = pd.concat([keep, own, *copies], ignore_index=True)
    dup = rows.duplicated(["op", "model", "tp", "tokens", "kv_len"])
    if dup.any():
        first = rows[dup].iloc[0]
        raise ValueError(f"{int(dup.sum())} points twice after the merge (first: {first.op} {first.model} tp "
                         f"{first.tp}, {first.tokens} tokens, kv {first.kv_len}): {new / 'compute.csv'} repeats rows")
    # the order `profile compute` writes, so that a merge's diff shows only the rows that changed
    rows = rows.sort_values(["op", "model", "tp", "kv_len", "tokens"], kind="stable", ignore_index=True)
    meta = dict(mb)
    def names(e: str) -> set[str]:  # entries such as "forward Llama-3-70B tp1", "Qwen2-72B tp1: needs ..."
        return set(e.replace(":", " ").split())

    # a model NEW did not finish keeps BASE's rows, so BASE's entries for it stand and NEW's do not
    for key in ("skipped", "incomplete_tables"):
        meta[key] = ([e for e in mb.get(key, []) if not replaced & names(e)]
                     + [e for e in mn.get(key, []) if replaced & names(e)])
    meta["incomplete"] = bool(meta["incomplete_tables"])
    if new_host:  # the host rows say which decoding loop they measured (`profile compute --loop`)
        meta["loop"] = mn.get("loop", "host")
    meta["merged"] = list(mb.get("merged", [])) + [
        {"date": mn.get("date"), "command": mn.get("command"), "models": sorted(replaced),
         "tps": sorted({int(tp) for _, tp in shards}),
         "host": new_host, "kernels": {k: mn.get(k) for k in KERNELS}}]
    measured = rows[rows.op != "host"].model.unique()
    for key in KERNELS:
        if (setting := kernel_setting(meta, measured, key)) is not None:  # None: never recorded
            meta[key] = setting
    return rows, meta


def kernel_setting(meta: dict, models, key: str):
    """The setting `key` (e.g. "rope") that every model's rows were measured with: per model, that of
    the last `merged` entry listing the model and recording the key, else the folder's own value;
    "mixed" where the models disagree (the runtime then reports a kernel mismatch)."""
    def one(model: str):
        for entry in reversed(meta.get("merged", [])):
            if model in entry.get("models", []) and key in entry.get("kernels", {}):
                return entry["kernels"][key]
        return meta.get(key)

    values = {one(m) for m in models}
    return values.pop() if len(values) == 1 else "mixed"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base", type=Path, help="profile folder whose rows are kept (e.g. swiftspec/data/profiles/h200-measured)")
    ap.add_argument("new", type=Path, help="profile folder of the re-profiled models")
    ap.add_argument("-o", "--out", type=Path, required=True, help="output folder (may be BASE)")
    ap.add_argument("--host", choices=["new", "base"], default="new", help="whose host rows to keep (default: NEW's)")
    args = ap.parse_args(argv)
    try:
        rows, meta = merge_profiles(args.base, args.new, args.host)
    except (ValueError, OSError, json.JSONDecodeError, pd.errors.ParserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.out.parent) as tmp:
        t = Path(tmp)
        rows.to_csv(t / "compute.csv", index=False)
        (t / "meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
        if (args.base / "comm.csv").is_file():
            shutil.copy(args.base / "comm.csv", t / "comm.csv")
        args.out.mkdir(exist_ok=True)
        for f in t.iterdir():
            shutil.move(str(f), args.out / f.name)
    print(f"merged {len(rows)} rows ({', '.join(meta['merged'][-1]['models'])} from {args.new}) into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
