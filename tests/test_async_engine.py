"""The async engine is lossless: its output equals target-only greedy decoding token for token.

One host-loop launch per layout (1 draft rank + 2 target ranks at TP 2; 2 draft ranks at TP 2 + 1
target rank), several prompts and tree policies per launch (spawning is slow), shared by the tests
that read it (`host_runs`). The draft is the target with its weights perturbed, so acceptance is
partial: some verifies re-root the tree, others start a fresh one, and both paths of Algorithm 1 run.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from swiftspec.runtime.engine import Job, Task
from swiftspec.runtime.generate import LoadOptions, generate_from_checkpoints
from swiftspec.runtime.launch import launch
from swiftspec.spec import Mode, SamplingParams, Split, TreePolicy

PROMPTS = [[5, 17, 99, 3, 250, 41], [7, 7, 7], [200, 1, 64, 128, 32, 16, 8, 4]]
MAX_NEW = 14


def perturbed_copy(src, dst, std: float, seed: int = 0):
    """A draft that mostly agrees with the target: its weights plus N(0, std) noise."""
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "config.json", dst / "config.json")
    g = torch.Generator().manual_seed(seed)
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v + std * torch.randn(v.shape, generator=g) for k, v in tensors.items()},
              str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def pair(make_checkpoint, tmp_path_factory):
    target = make_checkpoint("llama", num_hidden_layers=2, seed=3)
    draft = perturbed_copy(target, tmp_path_factory.mktemp("draft"), std=0.02)
    return target, draft


@pytest.fixture(scope="module")
def reference(pair):
    """Target-only greedy output of every prompt (single process, TP 1)."""
    target, _ = pair
    return [generate_from_checkpoints(target, mode="autoregressive", prompt=p, max_new_tokens=MAX_NEW,
                                      eos=False).tokens for p in PROMPTS]


# the async tasks both loops run, at either layout
ASYNC_TASKS = [
    Task(Mode.async_, TreePolicy(bs=6, w=2, d=2)),
    Task(Mode.async_, TreePolicy(bs=8, w=3, d=1, max_depth=3)),
    Task(Mode.async_, TreePolicy.chain(3)),
]
# the host launch at 1 draft + 2 target ranks adds a static tree and both baselines
HOST_TASKS = {
    (1, 2): [
        *ASYNC_TASKS,
        Task(Mode.async_, TreePolicy(bs=7, w=2, d=1, kind="static", topology=(-1, 0, 0, 1, 1, 2, 3))),
        Task(Mode.serial, TreePolicy(bs=6, w=2, d=2)),
        Task(Mode.autoregressive, TreePolicy.autoregressive()),
    ],
    (2, 1): ASYNC_TASKS,
}


@pytest.fixture(scope="module")
def host_runs(pair):
    """`host_runs(split) -> results`: the host-loop launch of `HOST_TASKS[split]`, once per layout."""
    target, draft = pair
    cache: dict[tuple[int, int], list[dict]] = {}

    def get(split: tuple[int, int]) -> list[dict]:
        if split not in cache:
            cache[split] = launch(Job(target=str(target), draft=str(draft), split=Split.disaggregated(*split),
                                      tasks=HOST_TASKS[split], prompts=PROMPTS, max_new_tokens=MAX_NEW, timeout_s=60))
        return cache[split]

    return get


def _check(results, reference):
    for res in results:
        got = sorted(res["prompts"], key=lambda r: r["prompt"])
        assert [r["tokens"] for r in got] == reference, res["task"]
        rows = res["rows"]
        per_prompt = {}
        for r in rows:
            per_prompt[r["prompt"]] = per_prompt.get(r["prompt"], 0) + r["accepted"]
        assert all(v >= MAX_NEW for v in per_prompt.values()), res["task"]
        json.dumps(rows)  # rows are plain JSON


def test_async_1_draft_2_target_equals_greedy(host_runs, reference):
    results = host_runs((1, 2))
    assert [r["task"] for r in results] == [t.label for t in HOST_TASKS[(1, 2)]]
    _check(results, reference)
    dyn = results[0]["rows"]
    assert max(r["accepted"] for r in dyn) > 1  # the draft is good enough to be accepted
    kept = [r.get("kept") or 0 for r in dyn if "kept" in r]
    assert any(k > 0 for k in kept) and any(k == 0 for k in kept)  # re-roots and fresh trees both ran
    for r in dyn:  # every iteration was timed on both sides; the target verified <= bs nodes
        assert r["sent"] <= 6 and r["draft_end_ms"] >= r["draft_start_ms"]
        assert r["target_end_ms"] >= r["target_start_ms"] and r["target_gpu_ms"] > 0


@pytest.mark.parametrize("split", [(1, 2), (2, 1)], ids=["1draft-2target", "2draft-1target"])
def test_async_device_loop_equals_greedy_and_the_host_loop(pair, reference, host_runs, split):
    """`Job.loop = "device"`: both sides of async keep their loop on the device
    (`device_async`); the output is target-only greedy, and every iteration accepts what the host
    loop's accepts (the same trees, the same verdicts), over TP groups on either side."""
    target, draft = pair
    job = Job(target=str(target), draft=str(draft), split=Split.disaggregated(*split), tasks=ASYNC_TASKS,
              prompts=PROMPTS, max_new_tokens=MAX_NEW, timeout_s=60, loop="device")
    runs = {"device": launch(job), "host": host_runs(split)[:len(ASYNC_TASKS)]}
    labels = [t.label for t in ASYNC_TASKS]
    assert [r["task"] for r in runs["host"]] == [r["task"] for r in runs["device"]] == labels
    _check(runs["device"], reference)
    for dev, host in zip(runs["device"], runs["host"]):
        assert [(r["prompt"], r["accepted"], r["sent"], r["tree_size"]) for r in dev["rows"]] == \
            [(r["prompt"], r["accepted"], r["sent"], r["tree_size"]) for r in host["rows"]], dev["task"]
        assert [r["forward_tokens"] for r in dev["rows"]] == [r["forward_tokens"] for r in host["rows"]], dev["task"]


def test_async_device_loop_replays_rank_paths_as_the_host_loop_does(pair):
    """Synthetic acceptance (`Job.rank_paths`): the device loop follows the same ranks, names the
    same bonus tokens (the draft resolves them in its whole tree) and keeps the same subtrees."""
    target, draft = pair
    paths = [[0, 0, 1, -1, 1, 0, 0, 2, 0, 1, 0, 0, 3, 0, -1, 1] * 3, [1, 0, 0, 0, -1, 0, 2, 1] * 6]
    tasks = [Task(Mode.async_, TreePolicy(bs=6, w=3, d=2))]
    runs = {}
    for loop in ("device", "host"):
        job = Job(target=str(target), draft=str(draft), split=Split.disaggregated(1, 1), tasks=tasks,
                  prompts=PROMPTS[:2], max_new_tokens=MAX_NEW, timeout_s=60, loop=loop, rank_paths=paths,
                  rank_logprobs=[-0.3, -1.6, -2.4, -3.3])  # fmt: skip
        (runs[loop],) = launch(job)
    keys = ("prompt", "accepted", "ranks", "sent", "tree_size", "kept", "forward_tokens")
    assert [[r.get(k) for k in keys] for r in runs["device"]["rows"]] == \
        [[r.get(k) for k in keys] for r in runs["host"]["rows"]]
    assert [p["tokens"] for p in runs["device"]["prompts"]] == [p["tokens"] for p in runs["host"]["prompts"]]
    assert any(r.get("kept") for r in runs["device"]["rows"])  # subtrees were kept


def test_async_2_draft_1_target_equals_greedy(host_runs, reference):
    results = host_runs((2, 1))
    assert [r["task"] for r in results] == [t.label for t in HOST_TASKS[(2, 1)]]
    _check(results, reference)


def test_async_fp8_models_equal_fp8_greedy_at_any_tp(pair, reference):
    """Weight-only fp8 models (`Job.weight_format`, as a plan made on an fp8 profile runs them):
    with 1 draft rank + 2 target ranks, the async output and the same launch's autoregressive
    baseline (TP 3 over all ranks) both equal single-process TP 1 greedy decoding of the fp8 target
    token for token. That holds only because row-parallel shards take the whole row's scale
    (`Transformer.set_gemm_weight`); the fp8 output also differs from the unquantized target's."""
    target, draft = pair
    tasks = [Task(Mode.async_, TreePolicy(bs=6, w=2, d=2)), Task(Mode.autoregressive, TreePolicy.autoregressive())]
    job = Job(target=str(target), draft=str(draft), split=Split.disaggregated(1, 2), tasks=tasks,
              prompts=PROMPTS, max_new_tokens=MAX_NEW, timeout_s=60, weight_format="fp8")
    results = launch(job)
    fp8 = [generate_from_checkpoints(target, mode="autoregressive", prompt=p, max_new_tokens=MAX_NEW,
                                     eos=False, load=LoadOptions(weight_format="fp8")).tokens for p in PROMPTS]
    _check(results, fp8)
    assert max(r["accepted"] for r in results[0]["rows"]) > 1
    assert fp8 != reference  # the fp8 models ran: the unquantized target's greedy output differs


@pytest.mark.parametrize("loop", ["host", "device"])
def test_async_sampling_equals_target_only_sampling(pair, reference, loop):
    """Sampling (`Job.sampling`, truncated by its top_k / top_p): with 1 draft rank + 2
    target ranks, async, serial and the autoregressive baseline all give single-process target-only
    sampling's tokens, prompt i drawn with seed sampling.seed + i; and those differ from greedy (the
    draws ran). Untruncated sampling through `run` is checked in test_async_synthetic.py."""
    target, draft = pair
    tasks = [Task(Mode.async_, TreePolicy(bs=6, w=2, d=2)), Task(Mode.serial, TreePolicy(bs=6, w=2, d=2)),
             Task(Mode.autoregressive, TreePolicy.autoregressive())]
    job = Job(target=str(target), draft=str(draft), split=Split.disaggregated(1, 2), tasks=tasks,
              prompts=PROMPTS, max_new_tokens=MAX_NEW, timeout_s=60, loop=loop,
              sampling=SamplingParams(temperature=0.9, seed=5, top_k=20, top_p=0.9))
    results = launch(job)
    sampled = [generate_from_checkpoints(target, mode="autoregressive", prompt=p, max_new_tokens=MAX_NEW, eos=False,
                                         sampling=SamplingParams(temperature=0.9, seed=5 + i, top_k=20, top_p=0.9)).tokens
               for i, p in enumerate(PROMPTS)]  # fmt: skip
    _check(results, sampled)
    assert max(r["accepted"] for r in results[0]["rows"]) > 1
    assert sampled != reference  # target-only greedy
