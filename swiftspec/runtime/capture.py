"""CUDA graph capture: every graph of the runtime is warmed up and captured here, by one rule.

Garbage is collected first; then the steps run eagerly (`warmup` times) on a side stream from
PyTorch's stream pool, so kernels compile and autotune and libraries create their handles and
workspaces outside the capture, and are captured on that same stream, with Python's garbage
collector held off from the collection to the end of the capture.

Why: PyTorch keeps cuBLAS workspaces per (handle, stream) and, when a graph is destroyed, drops
the workspaces of the stream it was captured on. Captured on its own side stream (one of the
pool's, not the one capture stream PyTorch otherwise shares among all graphs), a graph's GEMMs use
the workspace its warm-up made, and destroying another runner's graphs (which a collection may do
at any time) cannot take that workspace away in the middle of the capture or, unless the pool
hands the same stream to both, from under a live graph.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence

import torch


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """Python's cyclic garbage collector off inside the block (as it was after)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def capture_graphs(steps: Sequence[Callable[[], object] | None], warmup: int = 1, pool=None, unroll: int = 1,
                   stream: torch.cuda.Stream | None = None) -> tuple[list[torch.cuda.CUDAGraph | None], list[object]]:
    """Warm each step up `warmup` times in order, then capture each into its own CUDA graph (None
    for a None step), all on one side stream (`stream`: one the caller already warmed the steps up
    on) and one memory pool (`pool`, else a new one shared by these graphs). unroll: the step's
    calls per graph. Returns (graphs, each step's last output in the capture: the static tensors a
    replay rewrites)."""
    gc.collect()
    side = stream if stream is not None else torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    pool = pool if pool is not None else torch.cuda.graph_pool_handle()
    graphs: list[torch.cuda.CUDAGraph | None] = []
    outputs: list[object] = []
    with no_collection():
        with torch.cuda.stream(side):
            for _ in range(warmup):
                for step in steps:
                    if step is not None:
                        step()
        side.synchronize()
        for step in steps:
            if step is None:
                graphs.append(None)
                outputs.append(None)
                continue
            graph = torch.cuda.CUDAGraph()
            out = None
            with torch.cuda.graph(graph, pool=pool, stream=side):
                for _ in range(unroll):
                    out = step()
            graphs.append(graph)
            outputs.append(out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    return graphs, outputs
