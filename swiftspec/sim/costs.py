"""Per-configuration latencies (ms) the engine needs, memoised, from a `LatencyModel`.

One `StepCosts` holds one (target, draft, split, mode) and answers: a draft expansion, a target
verify, a link message, host work and KV compaction. Lookups are memoised because the engine asks
the same (tokens, kv_len) many times and profile interpolation is the slow part of a simulation.

Across nodes (`gpus_per_node` < GPUs in the plan): a TP group that spans nodes pays, per
all-reduce, the intra-node all-reduce of the profile plus one inter-node exchange of the partial
sums (a hierarchical all-reduce: reduce in the node, swap across nodes, broadcast in the node);
the draft/target link uses `internode_send_recv` when the two group leaders sit on different nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from swiftspec.spec import Mode, ModelSpec, Split

TOKEN_MSG_BYTES = 8  # one int64 token id per verified token (target -> draft)
NODE_MSG_BYTES = 16  # token id (int64) + parent index (int32) + position (int32) per tree node


def _nodes(gpus: tuple[int, ...], gpus_per_node: int) -> set[int]:
    return {g // gpus_per_node for g in gpus}


@dataclass
class Parts:
    """Accumulated time (ms) of each piece of work; keys match Prediction.breakdown_ms."""

    draft_compute: float = 0.0
    draft_tp_comm: float = 0.0
    target_compute: float = 0.0
    target_tp_comm: float = 0.0
    link: float = 0.0
    host: float = 0.0
    kv_compact: float = 0.0


class StepCosts:
    """Memoised latencies (ms) of one configuration.

    latency: a `swiftspec.sim.latency.LatencyModel` (or anything with its methods).
    For co-located modes (chain, serial) both models run at TP = all GPUs and the link is free
    (the tree never leaves the GPUs); autoregressive has no draft.
    """

    def __init__(
        self,
        latency,
        target: ModelSpec,
        draft: ModelSpec | None,
        split: Split,
        mode: Mode,
        gpus_per_node: int = 8,
    ) -> None:
        self.lat = latency
        self.target, self.draft, self.mode = target, draft, mode
        self.tp_t, self.tp_d = split.target_tp, split.draft_tp
        gpn = max(1, gpus_per_node)
        self.target_spans = len(_nodes(split.target_gpus, gpn)) > 1
        self.draft_spans = bool(split.draft_gpus) and len(_nodes(split.draft_gpus, gpn)) > 1
        self.colocated = mode is not Mode.async_
        self.link_internode = (
            not self.colocated and split.draft_gpus[0] // gpn != split.target_gpus[0] // gpn
        )
        self._verify: dict[tuple[int, int], tuple[float, float]] = {}
        self._expand: dict[tuple[int, int], tuple[float, float]] = {}
        self._link: dict[int, float] = {}
        self._compact: dict[tuple[str, int], float] = {}
        self.host_ms = float(latency.host_ms(mode))

    def _step_parts(self, model: ModelSpec, tp: int, tokens: int, kv_len: int, spans: bool) -> tuple[float, float]:
        compute = float(self.lat.forward_ms(model, tp, tokens, kv_len))
        comm = float(self.lat.step_ms(model, tp, tokens, kv_len)) - compute
        if spans:
            nbytes = tokens * model.hidden * model.dtype_bytes
            comm += 2 * model.num_layers * float(self.lat.send_recv_ms(nbytes, internode=True))
        return compute, max(comm, 0.0)

    def verify(self, tokens: int, kv_len: int) -> tuple[float, float]:
        """Target forward over `tokens` tree nodes after `kv_len` cached tokens: (compute, TP comm) ms.

        compute includes the host work that grows with the nodes (`host_verify`), when profiled."""
        key = (tokens, kv_len)
        v = self._verify.get(key)
        if v is None:
            c, m = self._step_parts(self.target, self.tp_t, tokens, kv_len, self.target_spans)
            c += float(self.lat.host_verify_ms(self.mode, tokens)) if hasattr(self.lat, "host_verify_ms") else 0.0
            v = self._verify[key] = (c, m)
        return v

    def expansion(self, tokens: int, kv_len: int) -> tuple[float, float]:
        """One draft expansion forwarding `tokens` nodes (+ top-w tree growth, + its host work when
        profiled as `host_expansion`): (compute, TP comm) ms."""
        key = (tokens, kv_len)
        v = self._expand.get(key)
        if v is None:
            c, m = self._step_parts(self.draft, self.tp_d, tokens, kv_len, self.draft_spans)
            c += float(self.lat.tree_growth_ms(self.draft, self.tp_d, tokens))
            if hasattr(self.lat, "host_expansion_ms"):  # host work per draft forward, when profiled
                c += float(self.lat.host_expansion_ms(self.mode, tokens))
            v = self._expand[key] = (c, m)
        return v

    def link(self, nbytes: int) -> float:
        """One message between the draft and target group leaders (0 when co-located)."""
        if self.colocated:
            return 0.0
        v = self._link.get(nbytes)
        if v is None:
            v = self._link[nbytes] = float(self.lat.send_recv_ms(nbytes, internode=self.link_internode))
        return v

    def compact(self, which: str, tokens: int) -> float:
        """KV compaction moving `tokens` tokens in the `which` ("target"/"draft") cache."""
        if tokens <= 0:
            return 0.0
        key = (which, tokens)
        v = self._compact.get(key)
        if v is None:
            model, tp = (self.target, self.tp_t) if which == "target" else (self.draft, self.tp_d)
            v = self._compact[key] = float(self.lat.kv_compact_ms(model, tp, tokens))
        return v
