"""`profile derive`: a measured profile scaled to another GPU's numbers (sim/derive.py).

Closed forms: a row made of a rest and its bytes or math floor on the source GPU scales the floor
by the GPUs' bandwidth or math ratio and the rest by their launch ratio; a spec equal to the
source's reproduces the profile; memory scales with capacity; collectives scale with the link.
Bad specs are one line and exit 2.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from swiftspec.sim.derive import derive_profile, row_work, source_hardware_of
from swiftspec.sim.hardware import HardwareSpec, bundled_specs
from swiftspec.sim.latency import LatencyModel
from swiftspec.spec import ModelSpec, Profile, UserError

BASE = HardwareSpec(name="base", hbm_tb_s=4.0, hbm_gib=100.0, bf16_tflops=1000.0, fp8_tflops=2000.0, sms=100,
                    launch_us=2.0, link_gb_s=400.0, link_us=10.0)
MODELS = ("Llama-3.2-1B", "Llama-3-8B")


def _floors(r, hw: HardwareSpec) -> tuple[float, float]:
    b, f = row_work(r.op, ModelSpec.from_config(r.model, dtype_bytes=2), r.tp, r.tokens, r.kv_len)
    return b / (hw.hbm_tb_s * 1e9), f / (hw.bf16_tflops * 1e9)


def _profile(rest: dict[tuple[str, int], float]) -> Profile:
    """Rows that are exactly a rest (per model and TP) plus the larger of their bytes and math
    floors on BASE."""
    rows = []
    for model in MODELS:
        spec = ModelSpec.from_config(model, dtype_bytes=2)
        for tp in (1, 2):
            for op in ("forward", "lm_head", "kv_compact"):
                for t in (1, 8, 64):
                    for kv in (512, 4096):
                        b, f = row_work(op, spec, tp, t, kv)
                        bound = max(b / (BASE.hbm_tb_s * 1e9), f / (BASE.bf16_tflops * 1e9))
                        rows.append((op, model, tp, t, kv, rest[(model, tp)] + bound))
    rows += [("host", "serial", 1, 0, 0, 0.7)]
    compute = pd.DataFrame(rows, columns=["op", "model", "tp", "tokens", "kv_len", "ms"])
    comm = pd.DataFrame([("all_reduce", 2, n, 0.01 + n / (BASE.link_gb_s * 1e6)) for n in (1024, 65536, 1 << 20)],
                        columns=["collective", "group_size", "bytes", "ms"])
    return Profile(compute, comm, {"source": "measured", "device": "cuda", "gpu": "base GPU", "dtype": "bfloat16",
                                   "memory_bytes": 100 * 2**30, "date": "2026-01-01"})


REST = {("Llama-3.2-1B", 1): 0.3, ("Llama-3.2-1B", 2): 0.25, ("Llama-3-8B", 1): 0.6, ("Llama-3-8B", 2): 0.5}


@pytest.mark.parametrize("change", ["identity", "bandwidth", "math", "launch", "all"])
def test_rows_scale_part_by_part(change: str) -> None:
    src = _profile(REST)
    bw, fl, la = {"identity": (1, 1, 1), "bandwidth": (2, 1, 1), "math": (1, 3, 1), "launch": (1, 1, 0.5),
                  "all": (0.7, 0.4, 1.5)}[change]  # fmt: skip
    dst = dataclasses.replace(BASE, name="dst", hbm_tb_s=BASE.hbm_tb_s * bw, bf16_tflops=BASE.bf16_tflops * fl,
                              launch_us=BASE.launch_us * la)
    got = derive_profile(src, BASE, dst, "src")
    scaled = src.compute["op"] != "host"
    want = src.compute["ms"].astype(float).copy()
    for i, r in src.compute[scaled].iterrows():
        tb, tm = _floors(r, BASE)
        want[i] = REST[(r.model, r.tp)] * la + max(tb / bw, tm / fl)
    np.testing.assert_allclose(got.compute.loc[scaled, "ms"], want[scaled], rtol=1e-6)
    assert (got.compute.loc[~scaled, "ms"] == src.compute.loc[~scaled, "ms"]).all()  # host rows are the host's
    if change == "identity":
        assert got.compute["ms"].equals(src.compute["ms"].astype(float))


def test_meta_label_memory_and_links() -> None:
    src = _profile(REST)
    dst = dataclasses.replace(BASE, name="big", hbm_gib=150.0, link_gb_s=800.0, link_us=5.0, source="calibrated")
    got = derive_profile(src, dataclasses.replace(BASE, source="calibrated"), dst, "builtin:src")
    assert got.meta["source"] == "derived" and got.meta["derived_from"]["profile"] == "builtin:src"
    assert got.label.startswith("derived from measured, base GPU") and got.label.endswith("for big (calibrated)")
    assert got.meta["memory_bytes"] == 150 * 2**30
    assert LatencyModel(got).graph_buckets  # a measured CUDA profile's buckets stay
    # collectives: latency part halves, bandwidth part halves
    want = 0.005 + src.comm["bytes"] / (BASE.link_gb_s * 1e6) / 2
    np.testing.assert_allclose(got.comm["ms"], want, rtol=1e-6)


def test_bundled_specs_load_and_the_source_gpu_is_found() -> None:
    names = bundled_specs()
    assert {"h100-sxm", "h200", "b200", "h20"} <= set(names)
    for n in names:
        spec = HardwareSpec.load(f"builtin:{n}")
        assert spec.source == "datasheet" and spec.notes
    assert source_hardware_of(Profile.load("builtin:h200-measured")) == "builtin:h200"
    with pytest.raises(UserError, match="give --source-hardware"):
        source_hardware_of(_profile(REST))


def test_derived_h100_forward_is_slower_by_at_most_the_bandwidth_ratio() -> None:
    """The bundled H200 profile to the H100: bytes-bound forwards slow down by at most the copy
    bandwidth ratio (4.25 / 3.0), launch-bound ones by less; nothing gets faster."""
    src = Profile.load("builtin:h200-measured")
    got = derive_profile(src, HardwareSpec.load("builtin:h200"), HardwareSpec.load("builtin:h100-sxm"), "h200")
    fwd = src.compute["op"] == "forward"
    ratio = got.compute.loc[fwd, "ms"] / src.compute.loc[fwd, "ms"]
    assert ratio.min() >= 1.0 and ratio.max() <= 4.25 / 3.0 + 1e-9
    assert ratio.median() > 1.1


@pytest.mark.parametrize("case,match", [
    ("missing", "does not exist"),
    ("builtin", "no bundled hardware spec"),
    ("negative", "hbm_tb_s"),
    ("not-json", "is not valid JSON"),
    ("measured", "measured must be a list of field names"),
    ("device", "device must be cuda or cpu"),
])  # fmt: skip
def test_cli_bad_specs_exit_2(case: str, match: str, tmp_path, swiftspec_cli) -> None:
    spec = {**BASE.to_dict()}
    path = tmp_path / "spec.json"
    if case == "negative":
        spec["hbm_tb_s"] = -1
    spec.update({"measured": {"measured": ["speed"]}, "device": {"device": "tpu"}}.get(case, {}))
    path.write_text("{nope" if case == "not-json" else json.dumps(spec))
    hw = {"missing": str(tmp_path / "none.json"), "builtin": "builtin:nope"}.get(case, str(path))
    code, out, err = swiftspec_cli("profile", "derive", "--from", "builtin:h200-measured", "--hardware", hw,
                                   "-o", tmp_path / "out")  # fmt: skip
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_cli_derive_writes_a_profile_plan_can_use(tmp_path, swiftspec_cli) -> None:
    code, out, err = swiftspec_cli("profile", "derive", "--from", "builtin:h200-measured", "--hardware",
                                   "builtin:h100-sxm", "-o", tmp_path / "h100")  # fmt: skip
    assert code == 0, err
    prof = Profile.load(tmp_path / "h100")
    assert "for NVIDIA H100 SXM (datasheet)" in prof.label and "for NVIDIA H100 SXM" in out
    code, out, err = swiftspec_cli("plan", "--gpus", 2, "--target", "Llama-3-8B", "--draft", "Llama-3.2-1B",
                                   "--profile", tmp_path / "h100", "--json")  # fmt: skip
    assert code == 0, err
    assert "derived from measured" in json.loads(out)["profile"]
