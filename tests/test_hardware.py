"""Which profile a GPU gets (`sim/hardware.py` `GPUS`): the visible GPU's bundled profile for
`plan`, `run` and `validate`, and `plan --hardware NAME|FILE` for a GPU you do not have (its
bundled profile, else one derived in memory and labelled so). GPU names are passed as strings, as
torch would report them: no GPU is needed.
"""

from __future__ import annotations

import json

import pytest

from swiftspec.cli import _gpu_default_profile
from swiftspec.run import not_comparable, prediction_profile
from swiftspec.sim.derive import hardware_profile_ref
from swiftspec.sim.hardware import GPUS, Gpu, HardwareSpec, bundled_profile, gpu_of, gpu_profile, same_gpu
from swiftspec.spec import Plan, Profile, UserError

QUICK = ["--requests", "2", "--max-new-tokens", "24", "--prompt-len", "200"]
PINNED = ["--gpus", "8", "--modes", "async", "--draft-gpus", "4", "--bs", "8", "--w", "8", "--d", "3", *QUICK]


@pytest.mark.parametrize("gpu,want,has_own", [
    ("NVIDIA H200", "h200-measured", True),
    ("NVIDIA H100 80GB HBM3", "h100-measured", True),
    ("NVIDIA H100 PCIe", "h100-measured", True),
    ("NVIDIA A100-SXM4-80GB", "h200-measured", False),
    ("NVIDIA H20", "h200-measured", False),  # "H20" is a word of "NVIDIA H20", not of "NVIDIA H200"
    ("NVIDIA GH200 480GB", "h200-measured", False),
])  # fmt: skip
def test_the_default_profile_is_the_visible_gpus(gpu, want, has_own):
    """On a GPU, `validate`, `plan` and `run` predict from its bundled profile, say which and why,
    and say so when it has none (then the H200's, with a pointer to `plan --hardware` where a spec
    of that GPU is bundled)."""
    name, why = gpu_profile(gpu)
    assert name == f"builtin:{want}" and Profile.load(name).compute.shape[0] > 0
    assert (f"no bundled profile for {gpu}" in why) == (not has_own) and gpu in why
    assert ("plan --hardware h20" in why) == (gpu == "NVIDIA H20")


def test_a_gpus_best_bundled_profile_wins():
    """A GPU's profiles are tried best first: the first bundled one is used, so a measured profile
    wins over a derived one; a GPU with none bundled gets None."""
    assert bundled_profile(Gpu("x", "X", "h100-sxm", ("h100-not-bundled", "h100-derived"))) == "builtin:h100-derived"
    assert bundled_profile(Gpu("x", "X", "h100-sxm", ("h200-measured", "h100-derived"))) == "builtin:h200-measured"
    assert bundled_profile(Gpu("x", "X", "b200", ("b200-not-bundled",))) is None
    assert [g.name for g in GPUS if gpu_of(f"NVIDIA {g.key}") is not g] == []  # every row finds itself


def test_gpus_compare_by_type():
    """A profile derived for "NVIDIA H100 SXM" predicts a run on an "NVIDIA H100 80GB HBM3": its
    error is computed; an H200 profile against an H100 run is labelled not comparable."""
    assert same_gpu("NVIDIA H100 SXM", "NVIDIA H100 80GB HBM3") and same_gpu("NVIDIA A100", "NVIDIA A100")
    assert not same_gpu("NVIDIA H200", "NVIDIA H20") and not same_gpu("NVIDIA A100-SXM4-80GB", "NVIDIA A100 PCIe")
    run = ("NVIDIA H100 80GB HBM3", "bfloat16", "native")
    assert not_comparable(("NVIDIA H100 SXM", "bfloat16", "native"), run) is None
    assert not_comparable(("NVIDIA H200", "bfloat16", "native"), run).startswith("not comparable: profile <NVIDIA H200")
    assert not_comparable(("NVIDIA H100 SXM", "bfloat16", "fp8"), run) is not None


def test_run_predicts_from_the_plans_profile_only_when_made_for_this_gpu():
    """`run` without --profile: on a GPU the plan's profile when it was made for this GPU type,
    else this GPU's bundled one (and it says why); on a CPU the plan's, silently."""
    assert prediction_profile("my-h100", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe") == (
        "my-h100", "my-h100, the plan's, made for this NVIDIA H100 PCIe")
    profile, why = prediction_profile("builtin:h200-measured", "NVIDIA H200", "NVIDIA H100 80GB HBM3")
    assert profile == "builtin:h100-measured" and why.endswith("(the plan's is for NVIDIA H200)")
    assert prediction_profile(None, None, "NVIDIA H200")[0] == "builtin:h200-measured"
    assert prediction_profile("cpu-prof", "cpu", None) == ("cpu-prof", None)


@pytest.mark.parametrize("text,want", [
    ("h200", "builtin:h200-measured"), ("h100", "builtin:h100-measured"), ("h100-sxm", "builtin:h100-measured"),
    ("b200", "hardware:builtin:b200"), ("builtin:h20", "hardware:builtin:h20"),
])  # fmt: skip
def test_hardware_names_reach_a_bundled_or_derived_profile(text, want):
    assert hardware_profile_ref(text) == want


def test_hardware_files_and_unknown_names(tmp_path):
    good = tmp_path / "mine.json"
    good.write_text(json.dumps({**HardwareSpec.load("builtin:h100-sxm").to_dict(), "name": "mine"}))
    assert hardware_profile_ref(str(good)) == f"hardware:{good}"
    with pytest.raises(UserError, match=r"unknown --hardware 'a100': choose h100, h200, b200, h20"):
        hardware_profile_ref("a100")
    with pytest.raises(UserError, match="hardware spec nope/x.json does not exist"):
        hardware_profile_ref("nope/x.json")
    (tmp_path / "bad.json").write_text(json.dumps({"name": "bad", "hbm_tb_s": -1}))
    with pytest.raises(UserError, match="hbm_tb_s"):
        hardware_profile_ref(str(tmp_path / "bad.json"))


def test_a_gpu_gets_its_measured_profile_where_it_covers_the_models():
    """The H100's measured profile lacks the deepseek-coder pair: planning it on an H100 takes the
    derived H100 profile, and says why; the measured one for models it has (or none named)."""
    h100 = "NVIDIA H100 80GB HBM3"
    assert gpu_profile(h100)[0] == gpu_profile(h100, ("Llama-3-70B", "Llama-3.2-3B"))[0] == "builtin:h100-measured"
    profile, why = gpu_profile(h100, ("deepseek-coder-33b", "deepseek-coder-1.3b"))
    assert profile == "builtin:h100-derived" and "h100-measured has no rows of deepseek-coder-33b" in why
    assert hardware_profile_ref("h100", ("deepseek-coder-33b",)) == "builtin:h100-derived"
    assert gpu_profile(h100, ("/not/a/bundled/model",))[0] == "builtin:h100-measured"  # none covers it: the first


def test_no_gpu_keeps_the_embedded_default():
    assert _gpu_default_profile(None) is None


def test_plan_for_a_what_if_gpu_says_derived_everywhere(tmp_path, swiftspec_cli):
    """`plan --hardware b200`: the table, the JSON and plan.json say the profile is derived from
    the measured H200 profile for the B200's datasheet; nothing is written without -o; `simulate`
    derives it again to the same prediction; more bandwidth and math predict more tokens/s."""
    code, out, err = swiftspec_cli("plan", *PINNED, "--hardware", "b200", "--json")
    assert code == 0, err
    b200 = json.loads(out)
    label = b200["profile"]
    assert label.startswith("derived from measured, NVIDIA H200") and label.endswith("for NVIDIA B200 (what-if) (datasheet)")
    code, out, err = swiftspec_cli("plan", *PINNED, "--hardware", "h200", "--json")
    h200 = json.loads(out)
    assert h200["profile"].startswith("measured, NVIDIA H200")
    assert b200["rows"][0]["tokens_per_s_mean"] > 1.1 * h200["rows"][0]["tokens_per_s_mean"]

    code, out, err = swiftspec_cli("plan", *PINNED, "--hardware", "b200", "-o", tmp_path / "plan.json")
    assert code == 0, err
    assert f"profile: {label} (hardware:builtin:b200)" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]
    plan = Plan.load(tmp_path / "plan.json")
    assert plan.profile.label == label and plan.profile.path == "hardware:builtin:b200"
    code, out, err = swiftspec_cli("simulate", "--plan", tmp_path / "plan.json", "--json")
    assert code == 0, err
    assert json.loads(out)["prediction"]["tokens_per_s_mean"] == pytest.approx(plan.prediction.tokens_per_s_mean)
    assert json.loads(out)["profile"] == label and "differs" not in err


@pytest.mark.parametrize("args,match", [
    (["--hardware", "b200", "--profile", "builtin:h200-measured"], "give --profile or --hardware, not both"),
    (["--hardware", "a100"], "unknown --hardware 'a100': choose h100, h200, b200, h20"),
])  # fmt: skip
def test_plan_hardware_bad_input_is_one_line(args, match, tmp_path, swiftspec_cli):
    code, out, err = swiftspec_cli("plan", "--gpus", "8", *args, "-o", tmp_path / "plan.json")
    assert code == 2 and out == "" and not (tmp_path / "plan.json").exists()
    assert err.startswith(f"error: {match}") and len(err.strip().splitlines()) == 1, err


def test_plan_on_a_gpu_uses_its_profile_and_keeps_json_pure(monkeypatch, swiftspec_cli):
    """With an H100 visible (its name as torch would give it), `plan` predicts from the H100's
    bundled profile and says so on stderr; stdout stays one JSON object; --profile overrides."""
    monkeypatch.setattr("swiftspec.cli.visible_gpu_name", lambda: "NVIDIA H100 80GB HBM3")
    code, out, err = swiftspec_cli("plan", *PINNED, "--json")
    assert code == 0, err
    assert json.loads(out)["profile"].startswith("measured, NVIDIA H100")
    assert err.strip() == ("profile: builtin:h100-measured, the bundled profile of this NVIDIA H100 80GB HBM3 "
                           "(--profile or --hardware to choose another)")
    code, out, err = swiftspec_cli("plan", *PINNED, "--json", "--profile", "builtin:h200-measured")
    assert json.loads(out)["profile"].startswith("measured, NVIDIA H200") and err == ""
