"""`swiftspec list`: the bundled models, profiles and acceptance profiles, as a table and as JSON;
and `builtin:NAME`, which reaches them from every profile and acceptance option."""

from __future__ import annotations

import json

import pytest
from test_plan_cli import QUICK, tiny  # noqa: F401  (tiny is a fixture)

from swiftspec.catalog import bundled_acceptance, bundled_profiles, catalog, resolve_builtin
from swiftspec.spec import UserError, bundled_models


def test_list_table_names_everything_bundled(swiftspec_cli):
    code, out, err = swiftspec_cli("list")
    assert code == 0, err
    for name in bundled_models():
        assert name in out
    for name in bundled_profiles() + bundled_acceptance():
        assert f"builtin:{name}" in out
    assert "TP 2,4,6,8: Llama-3-70B" in out  # what the measured profile covers, by TP degree
    assert "0.7" in out and "synthetic" in out and "derived" in out
    int4 = next(line for line in out.splitlines() if line.startswith("builtin:h100-int4 "))
    assert int4.endswith("; kernels unlike the runtime's: linear_combine: profile separate, runtime kernel")


def test_list_json_is_the_library_catalog(swiftspec_cli):
    code, out, err = swiftspec_cli("list", "--json")
    assert code == 0, err
    got = json.loads(out)
    assert got == json.loads(json.dumps(catalog()))
    models = {m["name"]: m for m in got["models"]}
    assert models["Llama-3-70B"]["layers"] == 80 and models["Qwen2-72B"]["vocab"] == 152064
    profiles = {p["name"]: p for p in got["profiles"]}
    assert profiles["builtin:h200-fp8"]["weight_format"] == "fp8"
    assert profiles["builtin:h200-derived"]["source"] == "derived"
    assert profiles["builtin:h200-derived"]["kernels_unlike_runtime"] == []
    assert profiles["builtin:h100-int4"]["kernels_unlike_runtime"] == ["linear_combine: profile separate, runtime kernel"]
    assert "Llama-3-70B" in profiles["builtin:h200-measured"]["covers"]["2,4,6,8"]
    acc = {a["name"]: a for a in got["acceptance"]}
    assert acc["builtin:qwen2-72b-table7"]["source"] == "synthetic"
    assert acc["builtin:smollm2-135m__int3g32__T0.7"]["temperature"] == 0.7
    assert acc["builtin:smollm2-135m__int3g32"]["temperature"] == 0


def test_resolve_builtin():
    assert resolve_builtin("profile", None) is None
    assert resolve_builtin("profile", "some/folder") == "some/folder"
    assert resolve_builtin("profile", "builtin:h200-fp8") == "builtin:h200-fp8"
    assert resolve_builtin("profile", "builtin:h200-fp8", as_path=True).endswith("profiles/h200-fp8")
    path = resolve_builtin("acceptance", "builtin:smollm2-135m__drop10")
    assert path.endswith("acceptance/smollm2-135m__drop10.json")
    assert resolve_builtin("acceptance", "builtin:smollm2-135m__drop10.json") == path
    assert resolve_builtin("input", "builtin:h200-measured").endswith("profiles/h200-measured")
    with pytest.raises(UserError, match="builtin:qwen2-72b-table7") as e:
        resolve_builtin("acceptance", "builtin:h200-fp8")  # a profile is no acceptance profile
    assert "\n" not in str(e.value)


def test_plan_reads_builtin_acceptance(tiny, swiftspec_cli):  # noqa: F811
    code, out, err = swiftspec_cli("plan", "--gpus", "2", "--target", str(tiny / "tgt"),
                             "--draft", str(tiny / "drf"), "--profile", str(tiny / "profile"), "--json",
                             "--modes", "serial", "--acceptance", "builtin:smollm2-135m__int3g32", *QUICK)
    assert code == 0, err
    assert json.loads(out)["acceptance"] == "measured"


@pytest.mark.parametrize("flag,kind", [("--profile", "profile"), ("--acceptance", "acceptance profile")])
def test_unknown_builtin_is_one_line_listing_the_known(tmp_path, flag, kind, swiftspec_cli):
    for args in (["plan", "--gpus", "2"], ["simulate", "--plan", str(tmp_path / "plan.json")],
                 ["validate", "--device", "cpu"]):
        code, out, err = swiftspec_cli(*args, flag, "builtin:nope")
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (args, err)
        assert f"no bundled {kind} 'nope'" in lines[0] and "builtin:" in lines[0].split("are", 1)[1]


def test_profile_check_reads_builtin(swiftspec_cli):
    code, out, err = swiftspec_cli("profile", "check", "builtin:nope")
    assert code == 2 and "builtin:h200-measured" in err


def test_run_and_study_read_builtin_names(tmp_path, swiftspec_cli):
    code, out, err = swiftspec_cli("run", "--plan", str(tmp_path / "plan.json"), "--acceptance",
                             "builtin:nope")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "no bundled acceptance profile 'nope'" in err
    code, out, err = swiftspec_cli("study", "split-heatmap", "-i", "builtin:nope",
                             "-o", str(tmp_path / "figs"))
    assert code == 2 and "no bundled profile or acceptance profile 'nope'" in err and "builtin:h200-fp8" in err
