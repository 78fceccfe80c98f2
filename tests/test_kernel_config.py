"""`KernelConfig`: the one place kernel choices are made. `resolve` gives the kernels the runtime
chose before the config existed (its seven resolvers, written out as a table below), refuses
combinations the model cannot run, and profiles record and compare it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from swiftspec.runtime.kernel_config import (
    ATTENTION_WS_MIN_TOKENS,
    ATTENTION_WS_ROWS,
    KernelConfig,
    kernel_mismatch,
    profile_settings,
)
from swiftspec.spec import UserError

PROFILES = Path(__file__).resolve().parents[1] / "swiftspec" / "data" / "profiles"

# (device, weight format, TP, capability) -> attention, fusion, linear, fold_norm, swiglu, rope, pdl,
# attention_ws_rows, tree_growth: what the resolvers chose ("auto" everywhere), written out.
EXPECTED = [
    ('cpu', 'native', 1, (9, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'native', 1, (8, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'native', 1, (10, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'native', 2, (9, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'native', 2, (8, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'native', 2, (10, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'native', 8, (9, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'native', 8, (8, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'native', 8, (10, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 1, (9, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 1, (8, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 1, (10, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 2, (9, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 2, (8, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 2, (10, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 8, (9, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 8, (8, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cpu', 'fp8', 8, (10, 0), 'torch', 'off', 'torch', False, False, False, 'off', 0, 'torch'),
    ('cuda', 'native', 1, (9, 0), 'triton', 'triton', 'triton', True, True, True, 'late', 128, 'triton'),
    ('cuda', 'native', 1, (8, 0), 'triton', 'triton', 'triton', True, True, True, 'off', 0, 'triton'),
    ('cuda', 'native', 1, (10, 0), 'triton', 'triton', 'triton', True, True, True, 'late', 0, 'triton'),
    ('cuda', 'native', 2, (9, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 128, 'triton'),
    ('cuda', 'native', 2, (8, 0), 'triton', 'triton', 'triton', False, True, True, 'off', 0, 'triton'),
    ('cuda', 'native', 2, (10, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 0, 'triton'),
    ('cuda', 'native', 8, (9, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 128, 'triton'),
    ('cuda', 'native', 8, (8, 0), 'triton', 'triton', 'triton', False, True, True, 'off', 0, 'triton'),
    ('cuda', 'native', 8, (10, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 0, 'triton'),
    ('cuda', 'fp8', 1, (9, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 0, 'triton'),
    ('cuda', 'fp8', 1, (8, 0), 'triton', 'triton', 'triton', False, True, True, 'off', 0, 'triton'),
    ('cuda', 'fp8', 1, (10, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 0, 'triton'),
    ('cuda', 'fp8', 2, (9, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 0, 'triton'),
    ('cuda', 'fp8', 2, (8, 0), 'triton', 'triton', 'triton', False, True, True, 'off', 0, 'triton'),
    ('cuda', 'fp8', 2, (10, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 0, 'triton'),
    ('cuda', 'fp8', 8, (9, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 0, 'triton'),
    ('cuda', 'fp8', 8, (8, 0), 'triton', 'triton', 'triton', False, True, True, 'off', 0, 'triton'),
    ('cuda', 'fp8', 8, (10, 0), 'triton', 'triton', 'triton', False, True, True, 'late', 0, 'triton'),
]


@pytest.mark.parametrize("row", EXPECTED, ids=lambda r: f"{r[0]}-{r[1]}-tp{r[2]}-sm{r[3][0]}{r[3][1]}")
def test_resolve_gives_the_kernels_of_before(row):
    device, fmt, tp, cap, attention, fusion, linear, fold, swiglu, rope, pdl, ws_rows, growth = row
    k = KernelConfig.resolve(device, weight_format=fmt, tp_size=tp, capability=cap)
    got = (k.attention, k.fusion, k.linear, k.fold_norm, k.swiglu, k.rope, k.pdl, k.attention_ws_rows,
           k.tree_growth)
    assert got == (attention, fusion, linear, fold, swiglu, rope, pdl, ws_rows, growth)
    assert k.weight_format == fmt and k.attention_combine == "separate" and k.linear_max_rows is None
    assert k.attention_ws_min_tokens == (ATTENTION_WS_MIN_TOKENS if ws_rows else 0)
    assert ws_rows in (0, ATTENTION_WS_ROWS)
    # "auto" for every choice is the same as leaving it out
    auto = {name: "auto" for name in ("attention", "fusion", "linear", "pdl", "tree_growth")}
    assert KernelConfig.resolve(device, weight_format=fmt, tp_size=tp, capability=cap, **auto) == k


@pytest.mark.parametrize("choices,message", [
    ({"attention": "flash"}, "attention must be one of torch, ref, triton"),
    ({"fusion": "cuda"}, "fusion must be one of off, compile, triton"),
    ({"linear": "cublas"}, "linear must be one of torch, triton"),
    ({"pdl": "on"}, "pdl must be one of off, early, late"),
    ({"tree_growth": "cub"}, "tree_growth must be one of torch, triton, graph"),
    ({"weight_format": "int3"}, "weight_format must be one of native, fp8, int4"),
    ({"attention_combine": "atomic"}, "attention_combine must be one of separate, kernel"),
    ({"linear_combine": "atomic"}, "linear_combine must be one of separate, kernel"),
    ({"linear_split_max_n": 0}, "linear_split_max_n must be a positive row count"),
    ({"fold_norm": True, "linear": "torch"}, "fold_norm needs linear 'triton'"),
    ({"swiglu": True, "rope": True, "linear": "torch"}, "swiglu, rope need linear 'triton'"),
    ({"fold_norm": True, "weight_format": "fp8"}, "fold_norm needs native weights"),
    ({"attention": "torch", "attention_ws_rows": ATTENTION_WS_ROWS}, "needs attention 'triton'"),
    ({"attention_ws": "on"}, "unknown kernel setting 'attention_ws'"),
])  # fmt: skip
def test_bad_combinations_are_user_errors(choices, message):
    with pytest.raises(UserError, match=message):
        KernelConfig.resolve("cuda", capability=(9, 0), **choices)


def test_explicit_choices_override_the_rules():
    k = KernelConfig.resolve("cuda", capability=(8, 0), tp_size=8, pdl="early", fold_norm=True, fusion="off")
    assert (k.pdl, k.fold_norm, k.fusion) == ("early", True, "off")
    assert (k.swiglu, k.rope) == (False, False)  # the epilogues follow fusion "off"
    assert KernelConfig.resolve("cpu", tree_growth="graph").tree_growth == "torch"  # graphs are CUDA's
    assert KernelConfig() == KernelConfig.resolve("cpu")  # the defaults are the CPU's reference path


def test_settings_as_a_profile_records_them():
    s = KernelConfig.resolve("cuda", capability=(9, 0)).settings()
    assert s == {"attention": "triton", "attention_combine": "separate", "attention_ws": "on", "fold_norm": "on",
                 "fusion": "triton", "linear": "triton", "linear_combine": "separate", "pdl": "late", "rope": "on",
                 "swiglu": "on", "tree_growth": "triton", "weight_format": "native"}
    cpu = KernelConfig.resolve("cpu").settings()
    assert cpu["attention_combine"] == cpu["linear_combine"] == "-"  # no split merge without triton
    assert KernelConfig(pdl="early").settings()["pdl"] == "early"
    assert profile_settings("cuda", capability=(9, 0)) == {**s, "fold_norm": "tp1"}  # a profile spans TP degrees
    assert profile_settings("cuda", "fp8", capability=(9, 0))["fold_norm"] == "off"
    # int4's split linears sum their partials in the launch; native and fp8 ones in a second launch
    assert [profile_settings("cuda", f, capability=(9, 0))["linear_combine"] for f in ("native", "fp8", "int4")] == [
        "separate", "separate", "kernel"]
    assert profile_settings("cpu", attention="triton")["attention_combine"] == "separate"


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                    reason="the bundled profiles are the H200's (sm_90)")
def test_bundled_profiles_match_the_runtime():
    """The bundled profiles' recorded kernels are the runtime's on CUDA; the fp8 and int4 ones say
    where they differ, so `validate` reports it."""
    int4 = ["linear_combine: profile separate, runtime kernel", "weight_format: profile int4, runtime native"]
    want = {"h200-derived": [], "h200-measured": [], "h200-fp8": ["weight_format: profile fp8, runtime native"],
            "h200-int4-derived": int4}  # its rows were timed with the split-K sums in a second launch
    for name, mismatch in want.items():
        meta = json.loads((PROFILES / name / "meta.json").read_text())
        assert kernel_mismatch(meta, "cuda") == mismatch, name


@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                    reason="the bundled profiles are Hopper's (sm_90)")
def test_bundled_profiles_name_the_kernels_they_lack_in_their_label():
    """A bundled profile whose rows were timed with kernels the runtime no longer runs says which
    in its label (meta.json `kernels_unlike_runtime`), so every plan made from it shows it."""
    from swiftspec.catalog import bundled_profiles
    from swiftspec.sim.derive import derive_profile, source_hardware_of
    from swiftspec.sim.hardware import HardwareSpec
    from swiftspec.spec import Profile

    for name in bundled_profiles():
        prof = Profile.load(PROFILES / name)
        unlike = [m for m in kernel_mismatch(prof.meta, prof.meta.get("device", "cpu"))
                  if not m.startswith("weight_format:")]
        assert prof.meta.get("kernels_unlike_runtime", []) == unlike, name
        assert ("kernels unlike the runtime's: " + ", ".join(unlike) in prof.label) == bool(unlike), name
    # a profile derived from one keeps the settings and says them once
    src = Profile.load(PROFILES / "h100-int4")
    got = derive_profile(src, HardwareSpec.load(source_hardware_of(src)), HardwareSpec.load("builtin:h200"), "src")
    assert got.meta["kernels_unlike_runtime"] == src.meta["kernels_unlike_runtime"]
    assert got.label.count("kernels unlike the runtime's") == 1
