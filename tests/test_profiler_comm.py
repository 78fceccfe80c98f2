"""`swiftspec profile comm` with gloo and 2 processes on CPU."""

import json
import os

import pandas as pd
import pytest
import torch

from swiftspec.profiler.comm import NO_MULTICAST_ENV, CommResult, profile_comm, published_defaults, write_comm
from swiftspec.spec import COMM_COLUMNS, Profile, UserError

SIZES = (1024, 65536)


@pytest.fixture(scope="module")
def gloo_result():
    return profile_comm(device="cpu", world=2, sizes=SIZES, timeout_s=120)


def test_gloo_two_processes_produce_rows(gloo_result):
    df = gloo_result.comm
    assert gloo_result.measured and not gloo_result.notes
    assert set(COMM_COLUMNS) <= set(df.columns)
    got = set(zip(df["collective"], df["group_size"], df["bytes"]))
    assert got == {(c, 2, b) for c in ("all_reduce", "send_recv") for b in SIZES}
    assert (df["ms"] > 0).all() and (df["p10"] <= df["ms"]).all() and (df["ms"] <= df["p90"]).all()
    assert (df["n"] == 5).all()
    # multicast stays off for everything spawned from here on
    assert all(os.environ[k] == v for k, v in NO_MULTICAST_ENV.items())


def test_comm_rows_feed_the_latency_model(gloo_result, tmp_path):
    from swiftspec.sim.latency import LatencyModel

    write_comm(tmp_path, gloo_result)
    # a compute table for the folder to load as a Profile
    pd.DataFrame([("layers", "m", 1, 1, 0, 1.0)], columns=["op", "model", "tp", "tokens", "kv_len", "ms"]).to_csv(
        tmp_path / "compute.csv", index=False
    )
    prof = Profile.load(tmp_path)
    assert prof.meta["comm"]["source"] == "measured" and prof.meta["comm"]["config"]["world"] == 2
    lat = LatencyModel(prof)
    df = gloo_result.comm.set_index(["collective", "bytes"])["ms"]
    for b in SIZES:
        assert lat.allreduce_ms(2, b) == pytest.approx(df[("all_reduce", b)], rel=1e-12)
        assert lat.send_recv_ms(b) == pytest.approx(df[("send_recv", b)], rel=1e-12)
    # published defaults (a one-GPU run) never replace measured rows
    before = (tmp_path / "comm.csv").read_text()
    defaults, label = published_defaults()
    assert not write_comm(tmp_path, CommResult(defaults, False, [label]))
    assert (tmp_path / "comm.csv").read_text() == before


def test_one_gpu_keeps_labelled_defaults():
    if not torch.cuda.is_available() or torch.cuda.device_count() != 1:
        df, label = published_defaults()
        assert {"all_reduce", "send_recv"} <= set(df["collective"]) and "not measured" in label
        pytest.skip("the one-GPU path needs exactly one GPU; checked the defaults it returns instead")
    res = profile_comm(device="cuda")
    assert not res.measured and "needs >= 2 GPUs" in res.notes[0]


def test_bad_world_and_sizes():
    with pytest.raises(UserError, match="--world must be >= 2"):
        profile_comm(device="cpu", world=1)
    with pytest.raises(UserError, match="--sizes"):
        profile_comm(device="cpu", world=2, sizes=(0,))


def test_derived_comm_is_named_in_the_profile_label(gloo_result, tmp_path):
    """A profile whose comm table is the published defaults (a one-GPU machine) says so in its
    label, which every plan prints; measured comm does not add the caveat."""
    defaults, label = published_defaults()

    def label_of(folder, result) -> str:
        assert write_comm(folder, result)
        meta = json.loads((folder / "meta.json").read_text())
        return Profile(pd.DataFrame(), result.comm, {**meta, "source": "measured", "gpu": "G"}).label

    assert "not measured: comm (published NVLink numbers" in label_of(tmp_path / "d", CommResult(defaults, False, [label]))
    assert "not measured" not in label_of(tmp_path / "m", gloo_result)
