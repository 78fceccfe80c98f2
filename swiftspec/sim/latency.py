"""Latency model: a Profile's tables -> milliseconds for any (model, TP, tokens, kv_len) query.

Compute ops are interpolated piecewise-linearly over the profile's (tokens, kv_len) grid of one
(op, model, tp) with scipy's RegularGridInterpolator; communication linearly over bytes of one
(collective, group_size). Measured points come back exactly and monotone tables give monotone
answers. A query outside the grid is an `ExtrapolationError` naming what to re-profile, unless the
model was built with `allow_extrapolation=True`; then the answer is extended linearly from the
grid's edge segment and a line is appended to `extrapolations` so the output can flag it.

Two low ends are clamped without a flag because time is flat there (launch/latency bound):
kv_len below the smallest profiled kv_len, and message sizes below the smallest profiled size.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.interpolate import RegularGridInterpolator

from swiftspec.spec import Mode, ModelSpec, Profile, UserError

# = runtime.graphs.DEFAULT_BUCKETS: the simulator imports nothing of the runtime, so the value is
# repeated here (tests/test_layering.py checks that the two agree).
GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
LM_HEAD_GATHER_BYTES_PER_TOKEN = 64  # top-8 (value fp32, id int32) of each vocab shard


class ExtrapolationError(UserError):
    """A latency query fell outside what the profile measured."""


class _Table:
    """One (op, model, tp) grid: ms over (tokens, kv_len), either axis possibly a single value."""

    def __init__(self, df: pd.DataFrame, what: str):
        self.what = what
        grid = df.pivot_table(index="tokens", columns="kv_len", values="ms", aggfunc="median")
        if grid.isna().any().any():
            holes = [f"tokens {t} kv_len {k}" for t in grid.index for k in grid.columns if pd.isna(grid.loc[t, k])]
            raise UserError(f"profile: {what} is not a full grid, missing {', '.join(holes[:4])}: re-profile it")
        self.tokens = grid.index.to_numpy(dtype=float)
        self.kv = grid.columns.to_numpy(dtype=float)
        self.values = grid.to_numpy(dtype=float)
        axes, vals = [], self.values
        if len(self.tokens) > 1:
            axes.append(self.tokens)
        else:
            vals = vals[0]
        if len(self.kv) > 1:
            axes.append(self.kv)
        elif vals.ndim == 2:
            vals = vals[:, 0]
        else:
            vals = np.asarray(vals).reshape(-1)
        self._interp = (
            RegularGridInterpolator(tuple(axes), vals, method="linear", bounds_error=False, fill_value=None)
            if axes
            else None
        )

    def __call__(self, tokens: int, kv_len: float, allow: bool, notes: list[str]) -> float:
        """ms at (tokens, kv_len); a kv-independent table (one kv_len, 0) ignores kv_len."""
        point, outside = [], []
        if len(self.tokens) > 1:
            if not self.tokens[0] <= tokens <= self.tokens[-1]:
                outside.append(f"tokens {tokens} (profiled {self.tokens[0]:g}..{self.tokens[-1]:g})")
            point.append(tokens)
        elif tokens != self.tokens[0]:
            outside.append(f"tokens {tokens} (profiled only {self.tokens[0]:g})")
        if len(self.kv) > 1:
            kv = max(kv_len, self.kv[0])  # flat below the grid: clamp, see module docstring
            if kv > self.kv[-1]:
                outside.append(f"kv_len {kv_len} (profiled up to {self.kv[-1]:g})")
            point.append(kv)
        elif self.kv[0] != 0 and kv_len > self.kv[0]:
            outside.append(f"kv_len {kv_len} (profiled only {self.kv[0]:g})")
        if outside:
            msg = f"{self.what}: {', '.join(outside)}"
            if not allow:
                raise ExtrapolationError(
                    f"profile has no {msg}: re-profile a grid that covers it (`swiftspec profile compute`) "
                    "or plan inside it (--prompt-len, --max-new-tokens, --bs)"
                )
            notes.append(f"extrapolated {msg}")
        if self._interp is None:
            return float(self.values.reshape(-1)[0])
        return max(0.0, float(self._interp([point])[0]))


class LatencyModel:
    """Milliseconds for the pieces of one iteration, from a Profile (see module docstring).

    label:          the profile's label ("derived" or "measured, <gpu>, <date>").
    memory_bytes:   usable memory of one GPU (bytes), from the profile's meta.
    extrapolations: one line per distinct out-of-grid query that was allowed.
    """

    def __init__(self, profile: Profile, allow_extrapolation: bool = False):
        profile.validate()
        self.profile = profile
        self.label = profile.label
        self.memory_bytes = int(profile.meta.get("memory_bytes", 0))
        self.allow_extrapolation = allow_extrapolation
        self.extrapolations: list[str] = []
        self._compute = {k: g for k, g in profile.compute.groupby(["op", "model", "tp"])}
        self._comm = {k: g for k, g in profile.comm.groupby(["collective", "group_size"])}
        self._tables: dict[tuple, _Table] = {}
        self._memo: dict[tuple, float] = {}
        # A measured CUDA profile timed the runtime's CUDA graphs, one per bucket of tokens; the
        # runtime replays the smallest bucket >= T (padding rows), so a forward of T tokens costs
        # the bucket's time, not an interpolation between buckets.
        self.graph_buckets = profile.meta.get("device", "cuda") == "cuda" and (
            profile.meta.get("source") == "measured" or bool(profile.meta.get("graph_buckets")))  # derived from one

    # -- lookups -------------------------------------------------------------------------------

    def _note(self, msg: str) -> None:
        if msg not in self.extrapolations:
            self.extrapolations.append(msg)

    def _table(self, key: tuple, rows: dict, what: str) -> _Table:
        if key not in self._tables:
            self._tables[key] = _Table(rows[key], what)
        return self._tables[key]

    def op_ms(self, op: str, model: str, tp: int, tokens: int, kv_len: float) -> float:
        """ms of one compute op (`op` rows of the profile) for `model` at `tp`, interpolated."""
        key = ("op", op, model, tp, tokens, kv_len)
        if key in self._memo:
            return self._memo[key]
        if tokens < 1:
            raise UserError(f"{op} query needs tokens >= 1, got {tokens}")
        notes: list[str] = []
        if (op, model, tp) in self._compute:
            what = f"`{op}` rows for model {model} at tp {tp}"
            ms = self._table((op, model, tp), self._compute, what)(tokens, kv_len, self.allow_extrapolation, notes)
        else:
            ms = self._missing_tp(op, model, tp, tokens, kv_len, notes)
        for n in notes:
            self._note(n)
        self._memo[key] = ms
        return ms

    def profiled_tps(self, model: str, op: str = "layers") -> list[int]:
        """The TP degrees at which the profile has `op` rows for `model` (a model's name)."""
        return sorted(t for (o, m, t) in self._compute if o == op and m == model)

    def _missing_tp(self, op: str, model: str, tp: int, tokens: int, kv_len: float, notes: list[str]) -> float:
        """No rows at this tp: an error, or (allowed) linear in tp between the nearest profiled tps."""
        tps = self.profiled_tps(model, op)
        if not tps or not self.allow_extrapolation:
            have = f" (profiled tp: {', '.join(map(str, tps))})" if tps else ""
            raise ExtrapolationError(
                f"profile has no `{op}` rows for model {model} at tp {tp}{have}: re-profile with "
                f"`swiftspec profile` including {model} at tp {tp}"
            )
        lo = max([t for t in tps if t < tp], default=None)
        hi = min([t for t in tps if t > tp], default=None)
        notes.append(f"extrapolated `{op}` for model {model} to tp {tp} from tp {lo or hi}{f'/{hi}' if lo and hi else ''}")
        if lo is None or hi is None:
            return self.op_ms(op, model, lo or hi, tokens, kv_len)
        a, b = self.op_ms(op, model, lo, tokens, kv_len), self.op_ms(op, model, hi, tokens, kv_len)
        return a + (b - a) * (tp - lo) / (hi - lo)

    def _comm_ms(self, collective: str, group_size: int, nbytes: int) -> float:
        key = ("comm", collective, group_size, nbytes)
        if key in self._memo:
            return self._memo[key]
        if (collective, group_size) not in self._comm:
            have = sorted(g for (c, g) in self._comm if c == collective)
            raise ExtrapolationError(
                f"profile has no `{collective}` rows for group size {group_size}"
                f"{f' (profiled: {have})' if have else ''}: profile communication on a machine with "
                f"{group_size} GPUs (`swiftspec profile`)"
            )
        df = self._comm[(collective, group_size)].rename(columns={"bytes": "tokens"}).assign(kv_len=0)
        table = self._table(("comm", collective, group_size), {("comm", collective, group_size): df},
                            f"`{collective}` rows for group size {group_size}")
        notes: list[str] = []
        ms = table(max(nbytes, int(table.tokens[0])), 0, self.allow_extrapolation, notes)
        for n in notes:
            self._note(n.replace("tokens", "bytes"))
        self._memo[key] = ms
        return ms

    # -- public API ----------------------------------------------------------------------------

    def graph_tokens(self, tokens: int) -> int:
        """Tokens a forward of `tokens` really runs: its CUDA-graph bucket (see __init__), else itself."""
        if not self.graph_buckets or tokens > GRAPH_BUCKETS[-1]:
            return tokens
        return next(b for b in GRAPH_BUCKETS if b >= tokens)

    def forward_ms(self, model: ModelSpec, tp: int, tokens: int, kv_len: int) -> float:
        """embed + decoder layers + LM head of one TP shard over `tokens` tokens, no communication (ms)."""
        tokens = self.graph_tokens(tokens)
        layers = self.op_ms("layers", model.name, tp, tokens, kv_len)  # first: errors name `layers`
        return self.op_ms("embed", model.name, tp, tokens, 0) + layers + self.op_ms("lm_head", model.name, tp, tokens, 0)

    def allreduce_ms(self, group_size: int, nbytes: int, collective: str = "all_reduce") -> float:
        """One all-reduce of `nbytes` per rank over `group_size` GPUs (0 for a group of one), ms."""
        if group_size <= 1:
            return 0.0
        return self._comm_ms(collective, group_size, nbytes)

    def send_recv_ms(self, nbytes: int, internode: bool = False) -> float:
        """One point-to-point message of `nbytes` (NVLink, or InfiniBand when `internode`), ms."""
        return self._comm_ms("internode_send_recv" if internode else "send_recv", 2, nbytes)

    def step_breakdown(self, model: ModelSpec, tp: int, tokens: int, kv_len: int) -> dict[str, float]:
        """One forward of a TP group over `tokens` tokens, split into its pieces (ms).

        Keys: embed, layers, lm_head, compute (their sum), allreduce (2 per layer of
        tokens × hidden × dtype_bytes: after attention and after the MLP), lm_head_gather (one
        small collective of tokens × 64 bytes: each rank's top-8 candidates of its vocab shard,
        needed for argmax / tree growth over the sharded vocabulary), comm (their sum), total.
        """
        tokens = self.graph_tokens(tokens)
        layers = self.op_ms("layers", model.name, tp, tokens, kv_len)
        embed = self.op_ms("embed", model.name, tp, tokens, 0)
        lm_head = self.op_ms("lm_head", model.name, tp, tokens, 0)
        act_bytes = tokens * model.hidden * model.dtype_bytes
        allreduce = 2 * model.num_layers * self.allreduce_ms(tp, act_bytes)
        gather = self.allreduce_ms(tp, tokens * LM_HEAD_GATHER_BYTES_PER_TOKEN)
        compute = embed + layers + lm_head
        comm = allreduce + gather
        return {
            "embed": embed, "layers": layers, "lm_head": lm_head, "compute": compute,
            "allreduce": allreduce, "lm_head_gather": gather, "comm": comm, "total": compute + comm,
        }

    def step_ms(self, model: ModelSpec, tp: int, tokens: int, kv_len: int) -> float:
        """forward_ms + the TP group's communication (see step_breakdown), ms."""
        key = ("step", model.name, model.num_layers, model.hidden, model.dtype_bytes, model.weight_format, tp, tokens,
               kv_len)
        if key not in self._memo:
            self._memo[key] = self.step_breakdown(model, tp, tokens, kv_len)["total"]
        return self._memo[key]

    def tree_growth_ms(self, model: ModelSpec, tp: int, rows: int) -> float:
        """log-softmax + top-w over the draft's `rows` new logit rows (ms)."""
        return self.op_ms("tree_growth", model.name, tp, rows, 0)

    def kv_compact_ms(self, model: ModelSpec, tp: int, tokens: int) -> float:
        """Moving `tokens` tokens' KV (all layers of one shard) into place after a verify (ms)."""
        if tokens <= 0:
            return 0.0
        return self.op_ms("kv_compact", model.name, tp, tokens, 0)

    def _host_table_ms(self, op: str, mode: Mode | str, tokens: int) -> float:
        """An optional host table (`op`, model = mode name) over tokens; 0 when the profile has none."""
        name = (mode if isinstance(mode, Mode) else Mode.parse(mode)).value
        if (op, name, 1) not in self._compute or tokens < 1:
            return 0.0
        return self.op_ms(op, name, 1, tokens, 0)

    def host_expansion_ms(self, mode: Mode | str, tokens: int) -> float:
        """Host work of one draft forward of `tokens` tokens (inputs, mask, tree growth, graph input
        copies), ms; optional op `host_expansion` (0 without it: then `host` holds all host work)."""
        return self._host_table_ms("host_expansion", mode, tokens)

    def host_verify_ms(self, mode: Mode | str, tokens: int) -> float:
        """Host work of the target's verify over `tokens` nodes that grows with them (mask, walk), ms;
        optional op `host_verify` (0 without it)."""
        return self._host_table_ms("host_verify", mode, tokens)

    def host_ms(self, mode: Mode) -> float:
        """Host work of one iteration in `mode` beyond the profiled compute and comm (ms)."""
        name = mode if isinstance(mode, Mode) else Mode.parse(mode)
        rows = self.profile.compute[(self.profile.compute["op"] == "host") & (self.profile.compute["model"] == name.value)]
        if rows.empty:
            raise ExtrapolationError(
                f"profile has no `host` row for mode {name.value}: re-profile with `swiftspec profile`"
            )
        return float(rows["ms"].median())
