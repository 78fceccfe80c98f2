"""Every numeric option is range-checked while click parses it: a value out of range is one line
and exit 2, and the command itself never starts (nothing built, read or written). Devices and
dtypes default to what the machine has."""

from __future__ import annotations

import json
import sys

import click
import pytest

from swiftspec import cli, options
from swiftspec.cli import skipped_summary

# (command path, the arguments a command needs to be valid, the option, a bad value, what the error says)
CASES = [
    (("plan",), [], "--gpus", "0", "1<=x<=1024"),
    (("plan",), [], "--gpus", "10000", "1<=x<=1024"),
    (("plan",), ["--gpus", "8"], "--bs", "1000000", "1<=x<=256"),
    (("plan",), ["--gpus", "8"], "--d", "1000000", "0<=x<=64"),
    (("plan",), ["--gpus", "8"], "--w", "65", "1<=x<=64"),
    (("plan",), ["--gpus", "8"], "--top", "-1", "x>=1"),
    (("plan",), ["--gpus", "8"], "--draft-gpus", "0", "1<=x<=1024"),
    (("plan",), ["--gpus", "8"], "--gpus-per-node", "0", "1<=x<=1024"),
    (("plan",), ["--gpus", "8"], "--requests", "0", "1<=x<=1024"),
    (("plan",), ["--gpus", "8"], "--prompt-len", "-5", "1<=x<=131072"),
    (("plan",), ["--gpus", "8"], "--max-new-tokens", "0", "1<=x<=131072"),
    (("plan",), ["--gpus", "8"], "--seed", "-1", "0<=x<=4294967295"),
    (("plan",), ["--gpus", "8"], "--device", "tpu", "'tpu' is not one of 'cpu', 'cuda'"),
    (("simulate",), ["--plan", "MISSING"], "--requests", "0", "1<=x<=1024"),
    (("simulate",), ["--plan", "MISSING"], "--requests", "-3", "1<=x<=1024"),
    (("generate",), ["--target", "MISSING", "--prompt-ids", "1"], "--bs", "1000000", "1<=x<=256"),
    (("generate",), ["--target", "MISSING", "--prompt-ids", "1"], "--max-depth", "-1", "0<=x<=256"),
    (("generate",), ["--target", "MISSING", "--prompt-ids", "1"], "--max-new-tokens", "0", "1<=x<=131072"),
    (("generate",), ["--target", "MISSING", "--prompt-ids", "1"], "--max-len", "0", "1<=x<=131072"),
    (("generate",), ["--target", "MISSING"], "--prompt-ids", "1,-2", "x>=0"),
    (("generate",), ["--target", "MISSING", "--prompt-ids", "1"], "--dtype", "float8", "'float8' is not one of"),
    (("profile", "compute"), ["--models", "MISSING"], "--tp", "0,2", "1<=x<=1024"),
    (("profile", "compute"), ["--models", "MISSING"], "--tokens", "1,x", "not a comma-separated list"),
    (("profile", "compute"), ["--models", "MISSING"], "--time-budget", "-1", "x>0.0"),
    (("profile", "comm"), [], "--timeout", "-5", "x>0.0"),
    (("profile", "comm"), [], "--timeout", "nan", "not a finite number"),
    (("profile", "comm"), [], "--world", "0", "1<=x<=1024"),
    (("profile", "comm"), [], "--sizes", "1024,0", "x>=1"),
    (("profile", "acceptance"), ["--target", "MISSING", "--draft", "MISSING"], "--num-prompts", "0", "x>=1"),
    (("profile", "acceptance"), ["--target", "MISSING", "--draft", "MISSING"], "--top-k", "-1", "1<=x<=4096"),
    (("run",), ["--plan", "MISSING"], "--timeout", "-1", "x>0.0"),
    (("run",), ["--plan", "MISSING"], "--timeout", "inf", "not a finite number"),
    (("run",), ["--plan", "MISSING"], "--num-prompts", "0", "x>=1"),
    (("validate",), [], "--passes", "0", "x>=1"),
    (("validate",), [], "--configs", "0", "x>=1"),
    (("validate",), [], "--prompts", "-1", "x>=1"),
    (("validate",), [], "--gpus", "0", "1<=x<=1024"),
]


def _command(path: tuple[str, ...]) -> click.Command:
    cmd = cli.cli
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _all_commands(group: click.Group = cli.cli, path: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, (*path, name))
        else:
            yield (*path, name), cmd


@pytest.mark.parametrize("path,needed,flag,value,says", CASES,
                         ids=[f"{' '.join(c[0])} {c[2]} {c[3]}" for c in CASES])  # fmt: skip
def test_out_of_range_is_one_line_and_nothing_starts(monkeypatch, capsys, tmp_path, path, needed, flag, value, says):
    started = []
    monkeypatch.setattr(_command(path), "callback", lambda *a, **k: started.append(1))
    needed = [str(tmp_path / "missing") if a == "MISSING" else a for a in needed]
    monkeypatch.setattr(sys, "argv", ["swiftspec", *path, *needed, flag, value])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        cli.main()
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert e.value.code == 2 and out == "", (out, err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0] and says in lines[0], lines
    assert not started and not list(tmp_path.iterdir())


def test_every_numeric_option_has_a_range():
    """A plain int or float option would accept -1, 0 or nan: each one names its range instead.
    The sampling options are checked by SamplingParams before the command runs (one line too)."""
    sampling = {"temperature", "sample_seed", "sample_top_k", "sample_top_p"}
    plain = []
    for path, cmd in _all_commands():
        for p in cmd.params:
            if p.name in sampling or not isinstance(p, click.Option):
                continue
            if p.type in (click.INT, click.FLOAT):
                plain.append(f"{' '.join(path)} {p.opts[0]}")
            if isinstance(p.type, click.FloatRange):
                assert isinstance(p.type, options.FiniteFloat), f"{' '.join(path)} {p.opts[0]}: nan passes"
    assert plain == []


def test_missing_and_unknown_options_are_one_line(monkeypatch, capsys):
    for args, needle in ((["plan"], "Missing option '--gpus'"), (["plan", "--gpux", "2"], "No such option")):
        monkeypatch.setattr(sys, "argv", ["swiftspec", *args])
        with pytest.raises(SystemExit) as e:
            cli.main()
        lines = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(lines) == 1 and needle in lines[0] and "swiftspec plan --help" in lines[0]


def test_no_command_still_shows_the_help(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["swiftspec"])
    with pytest.raises(SystemExit):
        cli.main()
    out, err = capsys.readouterr()
    assert "Commands:" in out + err and "list" in out + err


@pytest.mark.parametrize("gpu,want", [(True, ("cuda", "bfloat16")), (False, ("cpu", "float32"))])
def test_device_and_dtype_follow_the_machine(monkeypatch, gpu, want):
    monkeypatch.setattr(options, "gpu_visible", lambda: gpu)
    assert options.device_dtype(None, None) == want
    assert options.device_dtype("cpu", None) == ("cpu", "float32")
    assert options.device_dtype(None, "float16") == (want[0], "float16")


def test_every_verb_that_runs_models_defaults_to_the_machine():
    """No command fixes --device or --dtype to cpu / float32: the default is None, resolved by
    `options.device_dtype` (run: the plan's device; plan: the profile's), and --help says so."""
    for path, cmd in _all_commands():
        for p in cmd.params:
            if p.name in ("device", "dtype"):
                assert p.default is None, (path, p.name)
                assert isinstance(p.type, click.Choice), (path, p.name)
                if path not in (("plan",), ("run",)) and p.name == "device":
                    assert "cuda when a GPU is visible" in p.help, path
                if p.name == "dtype":
                    assert "bfloat16 on cuda" in p.help, path


def test_skipped_splits_are_one_line():
    skipped = [f"async split {d}/{8 - d}: profile has no `layers` rows for model Llama-3-70B at tp {8 - d} "
               f"(profiled tp: 2, 4, 6, 8): re-profile with `swiftspec profile` including Llama-3-70B at tp {8 - d}"
               for d in (1, 3, 5, 7)]  # fmt: skip
    line = skipped_summary(skipped)
    assert "\n" not in line and line.startswith("skipped 4 configurations")
    assert "Llama-3-70B at TP 1, 3, 5, 7" in line and "--json 'skipped_profile'" in line
    assert skipped_summary(["something else"]).startswith("skipped 1 configuration the profile")


def test_plan_plans_for_the_profiles_device(tmp_path):
    from swiftspec.catalog import profile_device

    (tmp_path / "meta.json").write_text('{"source": "measured", "device": "cpu"}')
    assert profile_device(str(tmp_path)) == "cpu"
    assert profile_device(None) == "cuda" and profile_device("builtin:h200-measured") == "cuda"


@pytest.fixture
def tiny_config(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 512}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    return tmp_path / "m"


def _main(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["swiftspec", *map(str, args)])
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = int(e.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_generate_random_weights_needs_no_prompt(monkeypatch, capsys, tiny_config):
    code, out, err = _main(monkeypatch, capsys, "generate", "--target", tiny_config, "--weights", "random",
                           "--device", "cpu", "--max-new-tokens", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["prompt_len"] == len(cli.DEFAULT_PROMPT_IDS) and err == ""  # --json: quiet
    code, out, err = _main(monkeypatch, capsys, "generate", "--target", tiny_config, "--weights", "random",
                           "--device", "cpu", "--max-new-tokens", "2")
    assert code == 0 and err.startswith("generate: building m (random weights, cpu, float32)"), err


def test_generate_text_prompt_without_tokenizer_fails_before_building(monkeypatch, capsys, tiny_config):
    import swiftspec.runtime.generate as gen

    def no_build(*a, **k):
        raise AssertionError("a model was built")

    monkeypatch.setattr(gen, "load_model", no_build)
    code, out, err = _main(monkeypatch, capsys, "generate", "--target", tiny_config, "--weights", "random",
                           "--prompt", "hello")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "no tokenizer" in lines[0] and "--prompt-ids" in lines[0], err


def test_progress_lines_are_plain_throttled_and_quiet_under_json():
    import io

    from swiftspec.progress import Progress

    now = [0.0]
    buf = io.StringIO()
    p = Progress(stream=buf, interval_s=1.0, clock=lambda: now[0])
    p("building target")
    for done in range(1, 11):  # ten steps within one interval: the first and the last are shown
        now[0] += 0.05
        p.count("tokens", done, 10)
    assert buf.getvalue().splitlines() == ["building target", "tokens: 1/10", "tokens: 10/10"]
    assert "\r" not in buf.getvalue()
    quiet = io.StringIO()
    q = Progress(quiet=True, stream=quiet)
    q("x")
    q.count("y", 1, 1)
    assert quiet.getvalue() == "" and list(q.bar([1, 2], "z")) == [1, 2]
