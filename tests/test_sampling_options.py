"""The four sampling options are defined once (`cli.sampling_options`) and behave the same on
`generate`, `run` and `profile acceptance`: same names, defaults, types and help, and the same
one-line error for a bad value, raised before the command loads or starts anything."""

from __future__ import annotations

import sys

import click
import pytest
from click.testing import CliRunner

from swiftspec import cli
from swiftspec.spec import SamplingParams

COMMANDS = (("generate",), ("run",), ("profile", "acceptance"))
FLAGS = {"temperature": ("--temperature", 0.0), "sample_seed": ("--sample-seed", 0),
         "sample_top_k": ("--sample-top-k", 0), "sample_top_p": ("--sample-top-p", 1.0)}  # fmt: skip


def _command(path: tuple[str, ...]) -> click.Command:
    cmd = cli.cli
    for name in path:
        cmd = cmd.commands[name]
    return cmd


def _options(path: tuple[str, ...]) -> dict[str, tuple]:
    params = {p.name: p for p in _command(path).params}
    return {name: (tuple(params[name].opts), params[name].default, params[name].type.name, params[name].help)
            for name in FLAGS}


def test_the_same_four_options_on_every_command():
    first = _options(COMMANDS[0])
    for name, (flag, default) in FLAGS.items():
        assert first[name][0] == (flag,) and first[name][1] == default, name
        assert first[name][3] and "%" not in first[name][3]  # a rule, not a measurement
    for path in COMMANDS[1:]:
        assert _options(path) == first, path
    # the defaults are SamplingParams' own: greedy, seed 0, no truncation
    d = SamplingParams()
    assert (d.temperature, d.seed, d.top_k, d.top_p) == tuple(default for _, default in FLAGS.values())


@pytest.mark.parametrize("path", COMMANDS)
def test_help_lists_them(path):
    out = CliRunner().invoke(cli.cli, [*path, "--help"], terminal_width=100).output
    for flag, _ in FLAGS.values():
        assert flag in out, (path, flag)


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--temperature", "1", "--sample-top-k", "-2"], "--sample-top-k must be an integer >= 0"),
    (["--temperature", "1", "--sample-top-p", "1.5"], "--sample-top-p must be in (0, 1]"),
    (["--sample-top-p", "0.9"], "need a --temperature > 0"),
])  # fmt: skip
def test_bad_values_give_the_same_error_everywhere(tmp_path, monkeypatch, capsys, args, needle):
    """Nothing exists at these paths: the sampling options are checked before anything is read."""
    missing = str(tmp_path / "missing")
    required = {("generate",): ["--target", missing, "--prompt-ids", "1"], ("run",): ["--plan", missing],
                ("profile", "acceptance"): ["--target", missing, "--draft", missing]}  # fmt: skip
    errors = set()
    for path in COMMANDS:
        monkeypatch.setattr(sys, "argv", ["swiftspec", *path, *required[path], *args])
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            cli.main()
        lines = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(lines) == 1 and needle in lines[0], (path, lines)
        errors.add(lines[0])
    assert len(errors) == 1  # word for word the same on every command


def test_commands_receive_one_sampling_params(monkeypatch):
    """The decorated command gets `sampling`, a SamplingParams built from the four flags."""
    seen = []

    @click.command()
    @cli.sampling_options
    def probe(sampling):
        seen.append(sampling)

    CliRunner().invoke(probe, ["--temperature", "0.7", "--sample-seed", "3", "--sample-top-k", "5",
                                             "--sample-top-p", "0.9"], catch_exceptions=False)  # fmt: skip
    CliRunner().invoke(probe, [], catch_exceptions=False)
    assert seen == [SamplingParams(temperature=0.7, seed=3, top_k=5, top_p=0.9), SamplingParams()]
