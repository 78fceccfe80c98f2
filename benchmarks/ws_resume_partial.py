"""Build the partial profile to resume from when re-profiling with the Gluon tree attention on.

    python benchmarks/ws_resume_partial.py swiftspec/data/profiles/h200-measured OUT_DIR

Writes OUT_DIR/compute.partial.csv and OUT_DIR/meta.json: the source profile's compute rows minus
(a) its `layers` rows (derived from forward, embed and lm_head, so re-derived after the resume),
(b) the rows of its alias models (meta.json `aliases`: copied from their originals again), and
(c) the `forward` rows the Gluon kernel would run in: shards whose group (query heads per KV head)
divides 64, with at least `ATTENTION_WS_MIN_TOKENS` tokens and `ATTENTION_WS_ROWS` rows
(tokens x group) per KV head. Then, on an H200:

    RESUME=OUT_DIR/compute.partial.csv ATTENTION_WS=on bash benchmarks/gpu_profile.sh

measures only the dropped forwards (and re-derives the rest), and `merge_profile.py` merges it back.
Prints what it dropped per model and TP degree.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from swiftspec.kernels.tree_attention_ws import CONSUMER_ROWS
from swiftspec.runtime.weights import ATTENTION_WS_MIN_TOKENS, ATTENTION_WS_ROWS
from swiftspec.spec import ModelSpec


def ws_forward(spec: ModelSpec, tp: int, tokens: int) -> bool:
    """Whether a forward of `tokens` tokens on a TP-`tp` shard of `spec` takes the Gluon kernel."""
    sh = spec.shard(tp)
    group = sh.q_heads // sh.kv_heads
    return (spec.head_dim in (64, 128) and CONSUMER_ROWS % group == 0
            and tokens >= ATTENTION_WS_MIN_TOKENS and tokens * group >= ATTENTION_WS_ROWS)


def resume_partial(compute: pd.DataFrame, aliases: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kept rows, dropped forward rows) of a profile's compute table."""
    c = compute[(compute.op != "layers") & ~compute.model.isin(list(aliases))]
    specs: dict[str, ModelSpec] = {}
    drop = []
    for row in c.itertuples():
        if row.op != "forward":
            drop.append(False)
            continue
        spec = specs.get(row.model) or specs.setdefault(row.model, ModelSpec.from_config(row.model))
        drop.append(ws_forward(spec, int(row.tp), int(row.tokens)))
    mask = pd.Series(drop, index=c.index)
    return c[~mask], c[mask]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path, help="profile folder with compute.csv and meta.json")
    ap.add_argument("out", type=Path, help="folder for compute.partial.csv and meta.json")
    args = ap.parse_args(argv)
    meta = json.loads((args.profile / "meta.json").read_text())
    kept, dropped = resume_partial(pd.read_csv(args.profile / "compute.csv"), meta.get("aliases", {}))
    args.out.mkdir(parents=True, exist_ok=True)
    kept.to_csv(args.out / "compute.partial.csv", index=False)
    (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
    summary = dropped.groupby(["model", "tp"]).tokens.agg(lambda t: sorted(set(t)))
    print(f"kept {len(kept)} rows, dropped {len(dropped)} forward rows to re-measure:")
    print(summary.to_string())


if __name__ == "__main__":
    main()
