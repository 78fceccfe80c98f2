"""`swiftspec profile compute` on CPU: schema, exact reproduction by the latency model, resume, check."""

import json
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from swiftspec.profiler.check import holdout_errors, summarize_errors
from swiftspec.profiler.compute import (
    COLUMNS,
    PARTIAL,
    ComputeGrid,
    ComputeOptions,
    TimingConfig,
    profile_compute,
    shard_model,
)
from swiftspec.runtime.kernel_config import kernel_mismatch
from swiftspec.spec import ModelSpec, Profile, UserError

GRID = ComputeGrid(tps=(1, 2), tokens=(1, 2, 4), kv=(16, 32, 64), compact=(1, 4))
FAST = TimingConfig(warmup=1, min_repeats=3, max_repeats=3, target_ms=1.0, unroll=1)


@pytest.fixture(scope="module")
def cpu_profile(make_checkpoint, tmp_path_factory):
    ckpt = make_checkpoint("llama")
    out = tmp_path_factory.mktemp("prof") / "p"
    res = profile_compute([str(ckpt)], out, device="cpu", grid=GRID, timing=FAST,
                          progress=False, options=ComputeOptions(host=False))
    return ckpt, out, res


def test_profile_schema_round_trips(cpu_profile):
    ckpt, out, res = cpu_profile
    prof = Profile.load(out)
    assert set(COLUMNS) <= set(prof.compute.columns)
    assert prof.meta["source"] == "measured" and prof.meta["device"] == "cpu"
    assert prof.meta["compute"]["grid"]["tokens"] == [1, 2, 4]
    assert prof.label.startswith("measured, cpu, ")
    # the kernels it timed, so that a later runtime with other defaults is told (validate)
    assert (prof.meta["attention"], prof.meta["attention_combine"], prof.meta["pdl"], prof.meta["attention_ws"]) == (
        "torch", "-", "off", "off")
    assert kernel_mismatch(prof.meta, "cpu") == []
    name = ModelSpec.from_config(ckpt).name
    c = prof.compute
    # every grid point of every op is there, once, with positive times
    for op, per_tp in (("forward", 9), ("layers", 9), ("embed", 3), ("lm_head", 3), ("tree_growth", 3), ("kv_compact", 2)):
        rows = c[(c["op"] == op) & (c["model"] == name)]
        assert len(rows) == 2 * per_tp, op
        assert not rows.duplicated(["tp", "tokens", "kv_len"]).any()
    assert (c["ms"] > 0).all() and (c["p10"] <= c["ms"]).all() and (c["ms"] <= c["p90"]).all()
    assert not (out / PARTIAL).exists()  # complete: the partial file is gone
    # a second save/load through spec.Profile gives the same tables
    prof.save(out.parent / "copy")
    again = Profile.load(out.parent / "copy")
    pd.testing.assert_frame_equal(again.compute, prof.compute)


def test_layers_is_forward_minus_embed_and_lm_head(cpu_profile):
    _, out, _ = cpu_profile
    c = Profile.load(out).compute
    key = ["model", "tp", "tokens"]
    small = c[c["op"].isin(["embed", "lm_head"])].groupby(key)["ms"].sum()
    fwd = c[c["op"] == "forward"].set_index([*key, "kv_len"])["ms"]
    lay = c[c["op"] == "layers"].set_index([*key, "kv_len"])["ms"]
    for idx, f in fwd.items():
        expect = max(f - small[idx[:3]], 0.05 * f)  # floored at 5 % of the forward (CPU noise)
        assert lay[idx] == pytest.approx(expect, rel=1e-12)


def test_latency_model_reproduces_measured_points(cpu_profile):
    from swiftspec.sim.latency import LatencyModel

    ckpt, out, _ = cpu_profile
    prof = Profile.load(out)
    lat = LatencyModel(prof)
    spec = ModelSpec.from_config(ckpt)
    c = prof.compute
    for r in c[c["op"] == "layers"].itertuples():
        emb = c[(c["op"] == "embed") & (c["tp"] == r.tp) & (c["tokens"] == r.tokens)]["ms"].item()
        head = c[(c["op"] == "lm_head") & (c["tp"] == r.tp) & (c["tokens"] == r.tokens)]["ms"].item()
        assert lat.forward_ms(spec, r.tp, r.tokens, r.kv_len) == pytest.approx(emb + r.ms + head, rel=1e-12)
    for r in c[c["op"] == "tree_growth"].itertuples():
        assert lat.tree_growth_ms(spec, r.tp, r.tokens) == pytest.approx(r.ms, rel=1e-12)
    for r in c[c["op"] == "kv_compact"].itertuples():
        assert lat.kv_compact_ms(spec, r.tp, r.tokens) == pytest.approx(r.ms, rel=1e-12)


def test_resume_skips_measured_keys(make_checkpoint, tmp_path):
    ckpt = make_checkpoint("llama")
    name = ModelSpec.from_config(ckpt).name
    grid = ComputeGrid(tps=(1,), tokens=(1, 2), kv=(16,), compact=(1,))
    out = tmp_path / "p"
    out.mkdir()
    # a partial file from an interrupted run: these keys must be kept, not re-measured
    sentinel = [{"op": "forward", "model": name, "tp": 1, "tokens": 2, "kv_len": 16, "ms": 123.0, "p10": 122.0,
                 "p90": 124.0, "n": 7},
                {"op": "embed", "model": name, "tp": 1, "tokens": 1, "kv_len": 0, "ms": 0.5, "p10": 0.5, "p90": 0.5,
                 "n": 7}]  # fmt: skip
    pd.DataFrame(sentinel, columns=list(COLUMNS)).to_csv(out / PARTIAL, index=False)
    profile_compute([str(ckpt)], out, device="cpu", grid=grid, timing=FAST,
                    progress=False, options=ComputeOptions(host=False))
    c = Profile.load(out).compute
    fwd = c[(c["op"] == "forward") & (c["tokens"] == 2)]
    assert fwd["ms"].tolist() == [123.0] and fwd["n"].tolist() == [7]
    assert c[(c["op"] == "embed") & (c["tokens"] == 1)]["ms"].tolist() == [0.5]
    assert c[(c["op"] == "forward") & (c["tokens"] == 1)]["n"].item() == FAST.max_repeats  # measured now
    assert not (out / PARTIAL).exists()
    # a finished compute.csv as the partial (its derived layers rows included): nothing is doubled
    (out / "compute.csv").rename(out / PARTIAL)
    profile_compute([str(ckpt)], out, device="cpu", grid=grid, timing=FAST,
                    progress=False, options=ComputeOptions(host=False))
    again = Profile.load(out).compute
    keys = ["op", "model", "tp", "tokens", "kv_len"]
    assert not again.duplicated(keys).any() and len(again) == len(c)
    assert again.sort_values(keys)["ms"].tolist() == c.sort_values(keys)["ms"].tolist()


def test_time_budget_leaves_partial_and_marks_incomplete(make_checkpoint, tmp_path):
    ckpt = make_checkpoint("llama")
    res = profile_compute([str(ckpt)], tmp_path / "p", device="cpu", grid=GRID, timing=FAST, progress=False,
                          options=ComputeOptions(host=False, time_budget_s=1e-9))  # fmt: skip
    assert res.missing > 0
    assert (tmp_path / "p" / PARTIAL).exists()
    assert json.loads((tmp_path / "p" / "meta.json").read_text())["compute"]["incomplete"] is True


def test_shards_without_room_are_not_counted_as_budget_misses():
    """A shard that does not fit the device is skipped: its points are not 'missing' (a rerun cannot
    measure them), while a budget-cut shard's points are."""
    from swiftspec.profiler.compute import budget_missing

    wanted = {("forward", "A", 1, 1, 16), ("forward", "A", 1, 2, 16), ("forward", "A", 2, 1, 16), ("embed", "B", 1, 1, 0)}
    have = {("forward", "A", 2, 1, 16)}
    assert budget_missing(wanted, have, set()) == 3
    assert budget_missing(wanted, have, {("A", 1)}) == 1
    assert budget_missing(wanted, have, {("A", 1), ("B", 1)}) == 0


def test_aliases_copy_rows_of_identical_shapes(make_checkpoint, tmp_path):
    a = make_checkpoint("llama")
    b = make_checkpoint("llama", seed=5)  # same shapes, other folder name
    grid = ComputeGrid(tps=(1,), tokens=(1, 2), kv=(16,), compact=(1,))
    res = profile_compute([str(a), str(b)], tmp_path / "p", device="cpu", grid=grid, timing=FAST, progress=False,
                          options=ComputeOptions(host=False))  # fmt: skip
    na, nb = ModelSpec.from_config(a).name, ModelSpec.from_config(b).name
    meta = json.loads((tmp_path / "p" / "meta.json").read_text())
    assert meta["compute"]["aliases"] == {nb: na}
    c = res.compute
    cols = ["op", "tp", "tokens", "kv_len", "ms"]
    ra = c[c["model"] == na][cols].reset_index(drop=True)
    rb = c[c["model"] == nb][cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(ra, rb)


def test_shard_model_skips_communication(make_checkpoint):
    """A TP shard runs on one process: logits are the shard's vocab rows, no collective is called."""
    from swiftspec.runtime.kv_cache import KVCache

    ckpt = make_checkpoint("llama", vocab_size=250)
    m = shard_model(str(ckpt), 2, "cpu", torch.float32)
    cache = KVCache(m.spec, m.shard, 8, "cpu", torch.float32)
    t = torch.tensor([3, 4, 5])
    logits = m(t, torch.arange(3), cache, torch.arange(3), 0, torch.ones(3, 3, dtype=torch.bool).tril())
    assert logits.shape == (3, m.shard.vocab) and m.shard.vocab == 125
    assert torch.isfinite(logits).all() and logits.std() > 0


def test_holdout_reproduces_linear_tables_exactly_and_sees_curvature():
    """Piecewise-linear interpolation is exact on a function linear in tokens and kv; not on a quadratic."""
    rows = []
    for op, f in (("layers", lambda t, k: 1.0 + 0.5 * t + 0.001 * k), ("forward", lambda t, k: 1.0 + 0.01 * t * t + k / 1e3)):
        for t in (1, 2, 4, 8):
            for k in (128, 512, 2048):
                rows.append((op, "m", 1, t, k, f(t, k)))
    prof = Profile(pd.DataFrame(rows, columns=["op", "model", "tp", "tokens", "kv_len", "ms"]),
                   pd.DataFrame(columns=["collective", "group_size", "bytes", "ms"]), {"source": "measured"})
    err = holdout_errors(prof, ops=("layers", "forward"))
    lin = err[err["op"] == "layers"]
    # interior lines: tokens 2, 4 (3 kv each) and kv 512 (4 tokens each)
    assert len(lin) == 2 * 3 + 4
    assert np.allclose(lin["err"], 0, atol=1e-12)
    quad = err[(err["op"] == "forward") & (err["axis"] == "tokens")]
    # held-out t=2 predicted from t=1,4: 1 + 0.01*(1 + (16-1)/3) vs 1.04 -> over-predicts
    assert (quad["err"] > 0).all()
    summary = summarize_errors(err)
    assert summary.set_index("op").loc["all", "points"] == len(err)


def test_cli_compute_bad_model_exits_2(monkeypatch, capsys, tmp_path):
    from swiftspec import cli

    monkeypatch.setattr(sys, "argv", ["swiftspec", "profile", "compute", "--models", str(tmp_path / "nope"),
                                      "--device", "cpu", "-o", str(tmp_path / "out")])  # fmt: skip
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown model")
    assert not (tmp_path / "out").exists()


def test_cli_compute_attention_ws_on_cpu_exits_2(make_checkpoint, monkeypatch, capsys, tmp_path):
    """--attention-ws on needs a CUDA GPU: one line, exit 2, no folder."""
    from swiftspec import cli

    monkeypatch.setattr(sys, "argv", ["swiftspec", "profile", "compute", "--models", str(make_checkpoint("llama")),
                                      "--device", "cpu", "--attention-ws", "on", "-o", str(tmp_path / "out")])  # fmt: skip
    with pytest.raises(SystemExit) as e:
        cli.main()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "attention_ws 'on' needs a CUDA GPU" in err[0]
    assert not (tmp_path / "out").exists()


def test_host_rows_cover_every_mode(make_checkpoint, tmp_path):
    from swiftspec.sim.latency import LatencyModel
    from swiftspec.spec import Mode

    ckpt = make_checkpoint("llama")
    grid = ComputeGrid(tps=(1,), tokens=(1,), kv=(16,), compact=(1,))
    res = profile_compute([str(ckpt)], tmp_path / "p", device="cpu", grid=grid, timing=FAST, progress=False,
                          options=ComputeOptions(host_decodes=(2, 8)))  # fmt: skip
    host = res.compute[res.compute["op"] == "host"].set_index("model")
    assert set(host.index) == {m.value for m in Mode}
    assert (host.loc[["autoregressive", "chain", "serial"], "n"] == 2).all()  # measured: 2 decodes each
    assert host.loc["async", "n"] == 0  # not measurable in one process: marked, from the derived profile
    lat = LatencyModel(Profile.load(tmp_path / "p"))
    for m in Mode:
        assert lat.host_ms(m) == pytest.approx(host.loc[m.value, "ms"], rel=1e-12)


def test_host_rows_of_the_device_loop_are_labelled_and_kept_apart(make_checkpoint, tmp_path):
    """--loop device: the host rows measure the device loop, meta.json says so (run and validate
    then run that loop by default), a folder holding the host loop's rows refuses them, and a
    resumed folder keeps its loop when none is asked for."""
    ckpt = make_checkpoint("llama")
    grid = ComputeGrid(tps=(1,), tokens=(1,), kv=(16,), compact=(1,))
    res = profile_compute([str(ckpt)], tmp_path / "dev", device="cpu", grid=grid, timing=FAST, progress=False,
                          options=ComputeOptions(host_decodes=(1, 6), loop="device"))  # fmt: skip
    assert Profile.load(tmp_path / "dev").meta["loop"] == "device"
    host = res.compute[res.compute["op"] == "host"].set_index("model")
    assert (host.loc[["autoregressive", "chain", "serial"], "n"] == 1).all()
    profile_compute([str(ckpt)], tmp_path / "host", device="cpu", grid=grid, timing=FAST, progress=False,
                    options=ComputeOptions(host=False))  # fmt: skip
    assert Profile.load(tmp_path / "host").meta["loop"] == "host"
    with pytest.raises(UserError, match="holds host rows of the host loop"):
        profile_compute([str(ckpt)], tmp_path / "host", device="cpu", grid=grid, timing=FAST, progress=False,
                        options=ComputeOptions(host_decodes=(1, 6), loop="device"))  # fmt: skip
    # no loop asked for: a resumed folder keeps its own (a new CPU folder takes the host loop, above)
    profile_compute([str(ckpt)], tmp_path / "dev", device="cpu", grid=grid, timing=FAST, progress=False,
                    options=ComputeOptions(host_decodes=(1, 6)))  # fmt: skip
    assert Profile.load(tmp_path / "dev").meta["loop"] == "device"


def test_host_rows_time_a_loop_built_before_them(monkeypatch):
    """The timed decodes of each mode reuse the runners of one warm-up decode, so the device loop
    (captured into CUDA graphs when built) is built once per mode and its capture is no host work."""
    from swiftspec.profiler.compute import HOST_MODES, measure_host
    from swiftspec.runtime import generate as gen_mod

    built = []

    class CountedLoop(gen_mod.DeviceLoop):
        def __init__(self, *args, **kwargs):
            built.append(args[2])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(gen_mod, "DeviceLoop", CountedLoop)
    rows = measure_host("cpu", prompts=2, new_tokens=6, loop="device")
    assert [r["n"] for r in rows] == [2] * len(HOST_MODES)  # the warm-up decode is not a sample
    assert len(built) == len(HOST_MODES)


def test_cli_check_reports_errors_per_op(cpu_profile, monkeypatch, capsys):
    from swiftspec import cli

    _, out, _ = cpu_profile
    monkeypatch.setattr(sys, "argv", ["swiftspec", "profile", "check", str(out)])
    cli.main()
    text = capsys.readouterr().out
    # interior lines of the test grid: tokens 2 (both tps, 3 kv) and kv 32 (both tps, 3 tokens)
    assert "layers" in text and "worst points" in text
    rows = [line.split() for line in text.splitlines() if line.strip().startswith(("layers", "all"))]
    assert rows[0][:2] == ["layers", str(2 * 3 + 2 * 3)]


def test_fp8_profile_is_labelled_and_kept_apart(cpu_profile, make_checkpoint, tmp_path):
    """--weight-format fp8: the shards are quantized (their weight bytes halve the forward's),
    meta.json and the label say fp8, the runtime's native defaults are flagged as a mismatch, and
    a folder holding native rows refuses fp8 ones."""
    ckpt, native_out, _ = cpu_profile
    grid = ComputeGrid(tps=(1,), tokens=(1, 2), kv=(16, 32), compact=(1,))
    out = tmp_path / "fp8"
    res = profile_compute([str(ckpt)], out, device="cpu", grid=grid, timing=FAST, progress=False,
                          options=ComputeOptions(host=False, weight_format="fp8"))  # fmt: skip
    prof = Profile.load(out)
    assert prof.meta["weight_format"] == "fp8" and ", fp8 weights" in prof.label
    assert any(m.startswith("weight_format: profile fp8") for m in kernel_mismatch(prof.meta, "cpu"))
    assert (res.compute["op"] == "forward").any()
    assert Profile.load(native_out).meta["weight_format"] == "native"
    with pytest.raises(UserError, match="holds a native-weight profile"):
        profile_compute([str(ckpt)], native_out, device="cpu", grid=grid, timing=FAST, progress=False,
                        options=ComputeOptions(host=False, weight_format="fp8"))  # fmt: skip
    with pytest.raises(UserError, match="--weight-format must be one of"):
        profile_compute([str(ckpt)], tmp_path / "x", device="cpu", grid=grid, timing=FAST, progress=False,
                        options=ComputeOptions(host=False, weight_format="int3"))  # fmt: skip
