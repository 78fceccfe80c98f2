"""Build the partial profile to resume from when re-profiling with the Gluon tree attention on.

    python benchmarks/ws_resume_partial.py swiftspec/data/profiles/h200-measured OUT_DIR

Writes OUT_DIR/compute.partial.csv and OUT_DIR/meta.json: the source profile's compute rows minus
(a) its `layers` rows (derived from forward, embed and lm_head, so re-derived after the resume),
(b) the rows of its alias models (meta.json `aliases`: copied from their originals again), and
(c) the `forward` rows the Gluon kernel would run in: shards whose heads it takes (`check_ws_shape`:
group dividing 64, head dim 64 or 128), with at least `ATTENTION_WS_MIN_TOKENS` tokens and
`ATTENTION_WS_ROWS` rows (tokens x group) per KV head. Then, on an H200:

    RESUME=OUT_DIR/compute.partial.csv ATTENTION_WS=on bash benchmarks/gpu_profile.sh

measures only the dropped forwards (and re-derives the rest), and `merge_profile.py` merges it back.
Prints what it dropped per model and TP degree. A missing or unreadable profile: one line, exit 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import pandas as pd

from swiftspec.files import atomic_write_text
from swiftspec.kernels.tree_attention_ws import check_ws_shape
from swiftspec.runtime.kernel_config import ATTENTION_WS_MIN_TOKENS, ATTENTION_WS_ROWS
from swiftspec.spec import ModelSpec, UserError

_spec = functools.cache(ModelSpec.from_config)


def ws_forward(spec: ModelSpec, tp: int, tokens: int) -> bool:
    """Whether a forward of `tokens` tokens on a TP-`tp` shard of `spec` takes the Gluon kernel."""
    sh = spec.shard(tp)
    group = sh.q_heads // sh.kv_heads
    return (not check_ws_shape(group, spec.head_dim) and tokens >= ATTENTION_WS_MIN_TOKENS
            and tokens * group >= ATTENTION_WS_ROWS)


def resume_partial(compute: pd.DataFrame, aliases: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(kept rows, dropped forward rows) of a profile's compute table."""
    c = compute[(compute.op != "layers") & ~compute.model.isin(list(aliases))]
    drop = pd.Series([r.op == "forward" and ws_forward(_spec(r.model), int(r.tp), int(r.tokens))
                      for r in c.itertuples()], index=c.index, dtype=bool)
    return c[~drop], c[drop]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path, help="profile folder with compute.csv and meta.json")
    ap.add_argument("out", type=Path, help="folder for compute.partial.csv and meta.json")
    args = ap.parse_args(argv)
    try:
        meta = json.loads((args.profile / "meta.json").read_text())
        kept, dropped = resume_partial(pd.read_csv(args.profile / "compute.csv"), meta.get("aliases", {}))
    except (OSError, ValueError, KeyError, AttributeError, UserError) as e:
        print(f"error: {args.profile} is not a readable profile folder ({e}): give one with compute.csv and "
              f"meta.json, e.g. swiftspec/data/profiles/h200-measured", file=sys.stderr)
        return 2
    atomic_write_text(args.out / "compute.partial.csv", kept.to_csv(index=False))
    atomic_write_text(args.out / "meta.json", json.dumps(meta, indent=1))
    summary = dropped.groupby(["model", "tp"]).tokens.agg(lambda t: sorted(set(t)))
    print(f"kept {len(kept)} rows, dropped {len(dropped)} forward rows to re-measure:")
    print(summary.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
