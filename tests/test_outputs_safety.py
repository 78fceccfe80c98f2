"""Nothing that was there is lost, through the CLI: output paths are checked before any work, a
measurement that produced nothing keeps the earlier one, a profile folder has one writer at a time,
and outputs are readable by others."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time

import pandas as pd
import pytest
from test_plan_cli import QUICK, tiny  # noqa: F401 (tiny: a fixture)

from swiftspec.files import LOCK_NAME
from swiftspec.spec import Mode, Plan, Split, TreePolicy


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.fixture
def bad_paths(tmp_path):
    """(label, path, what the error says) for every class of output that cannot be written."""
    (tmp_path / "a_folder").mkdir()
    (tmp_path / "a_file").write_text("x")
    return tmp_path, {
        "parent is a file": (tmp_path / "a_file" / "out", "a_file is a file, not a folder"),
        "missing parent under a file": (tmp_path / "a_file" / "more" / "out", "a_file is a file, not a folder"),
    }


def test_plan_and_simulate_refuse_unwritable_outputs_first(tiny, bad_paths, swiftspec_cli):  # noqa: F811
    root, cases = bad_paths
    plan_args = ["plan", "--gpus", "2", "--target", str(tiny / "tgt"), "--draft", str(tiny / "drf"),
                 "--profile", str(tiny / "profile"), *QUICK]
    for path, needle in [(root / "a_folder", "is a folder; give a file path"), *cases.values()]:
        code, out, err = swiftspec_cli(*plan_args, "-o", str(path))
        assert code == 2 and needle in one_error_line(err) and "-o" in err and out == ""
    # the check comes before the inputs are read: a bad --target too still gets the -o line
    code, _, err = swiftspec_cli("plan", "--gpus", "2", "--target", "Llama-9-1T",
                           "-o", str(root / "a_folder"))
    assert code == 2 and "-o" in one_error_line(err) and "Llama-9-1T" not in err
    code, _, err = swiftspec_cli("simulate", "--plan", str(root / "nope.json"),
                           "--trace", str(root / "a_folder"))
    assert code == 2 and "--trace" in one_error_line(err)
    code, _, err = swiftspec_cli("study", "any-figure", "-o", str(root / "a_file"))
    assert code == 2 and "-o" in one_error_line(err) and "is a file, not a folder" in err
    assert sorted(p.name for p in root.iterdir()) == ["a_file", "a_folder"] and not list((root / "a_folder").iterdir())


def test_plan_output_is_readable_by_others(tiny, tmp_path, swiftspec_cli):  # noqa: F811
    old = os.umask(0o022)
    try:
        code, _, err = swiftspec_cli("plan", "--gpus", "1", "--target", str(tiny / "tgt"),
                               "--draft", str(tiny / "drf"), "--profile", str(tiny / "profile"),
                               "--modes", "autoregressive", "-o", str(tmp_path / "new" / "p.json"),
                               "--requests", "1", "--max-new-tokens", "4", "--prompt-len", "8")
    finally:
        os.umask(old)
    assert code == 0, err
    assert stat.S_IMODE((tmp_path / "new" / "p.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o755


@pytest.fixture
def plan_file(make_checkpoint, tmp_path):
    target = make_checkpoint("llama")
    Plan(target=str(target), draft=str(target), split=Split.disaggregated(1, 1), mode=Mode.async_,
         policy=TreePolicy(bs=4, w=2, d=1), device="cpu").save(tmp_path / "plan.json")
    return tmp_path / "plan.json"


def _no_work(monkeypatch):
    """Make starting workers or a sweep fail the test: the output check must come first."""
    import swiftspec.run
    import swiftspec.runtime.launch
    import swiftspec.validate

    def started(*a, **k):
        raise AssertionError("work started before the output path was checked")

    monkeypatch.setattr(swiftspec.runtime.launch, "launch", started)
    monkeypatch.setattr(swiftspec.run, "run_plan", started)
    monkeypatch.setattr(swiftspec.validate, "validate", started)
    monkeypatch.setattr(swiftspec.validate, "repredict", started)


def test_run_and_validate_refuse_unwritable_outputs_before_any_worker(monkeypatch, capsys, plan_file, bad_paths, swiftspec_cli):
    root, cases = bad_paths
    _no_work(monkeypatch)
    capsys.readouterr()  # the fixtures' output
    (root / "logs").mkdir()
    (root / "logs" / "summary.json").mkdir()  # a folder where the run log's file goes
    (root / "rep").mkdir()
    (root / "rep" / "report.csv").mkdir()
    before = sorted(str(p) for p in root.rglob("*"))
    run_cases = [(root / "a_file", "is a file, not a folder"), (root / "logs", "summary.json is a folder"),
                 *cases.values()]
    for path, needle in run_cases:
        t0 = time.monotonic()
        code, _, err = swiftspec_cli("run", "--plan", str(plan_file), "--num-prompts", "1",
                               "-o", str(path))
        assert code == 2 and needle in one_error_line(err) and "-o" in err
        assert time.monotonic() - t0 < 5
    for path, needle in [(root / "a_file", "is a file, not a folder"), (root / "rep", "report.csv is a folder"),
                         *cases.values()]:
        for extra in ([], ["--repredict", str(root / "rep")]):
            t0 = time.monotonic()
            code, _, err = swiftspec_cli("validate", "--device", "cpu", *extra, "-o", str(path))
            assert code == 2 and needle in one_error_line(err) and "-o" in err
            assert time.monotonic() - t0 < 5
    assert sorted(str(p) for p in root.rglob("*")) == before  # nothing created


def test_profile_verbs_refuse_unwritable_outputs(bad_paths, swiftspec_cli):
    root, cases = bad_paths
    (root / "prof").mkdir()
    (root / "prof" / "compute.csv").mkdir()
    before = sorted(str(p) for p in root.rglob("*"))
    for verb in (["compute", "--models", "Llama-3.2-1B", "--device", "cpu"], ["comm", "--device", "cpu"]):
        for path, needle in [(root / "a_file", "is a file, not a folder"), *cases.values()]:
            code, _, err = swiftspec_cli("profile", *verb, "-o", str(path))
            assert code == 2 and needle in one_error_line(err) and "-o" in err
    code, _, err = swiftspec_cli("profile", "compute", "--models", "Llama-3.2-1B", "--device", "cpu",
                           "-o", str(root / "prof"))
    assert code == 2 and "compute.csv is a folder where the output file compute.csv goes" in one_error_line(err)
    code, _, err = swiftspec_cli("profile", "acceptance", "--target", "t", "--draft", "d",
                           "-o", str(root / "a_folder"))
    assert code == 2 and "is a folder" in one_error_line(err)
    assert sorted(str(p) for p in root.rglob("*")) == before


# ---- measurements that produced nothing keep the earlier ones -------------------------------


MEASURED = pd.DataFrame({"collective": ["all_reduce", "all_reduce"], "group_size": [2, 2], "bytes": [1024, 16384],
                         "ms": [0.05, 0.07], "p10": [0.04, 0.06], "p90": [0.06, 0.08], "n": [5, 5]})


def _measured_comm_folder(path):
    from swiftspec.profiler.comm import CommResult, write_comm

    assert write_comm(path, CommResult(MEASURED, True, [], None))
    return (path / "comm.csv").read_text(), json.loads((path / "meta.json").read_text())


def test_profile_comm_that_measured_nothing_keeps_the_measured_table(monkeypatch, tmp_path, swiftspec_cli):
    """A too-short --timeout measures no row: the measured comm.csv and meta.json stay, one line, exit 2."""
    import swiftspec.profiler.comm as comm
    from swiftspec.profiler.comm import COLUMNS, CommResult

    csv, meta = _measured_comm_folder(tmp_path / "p")
    empty = CommResult(pd.DataFrame(columns=list(COLUMNS)), True, ["stopped after 0 s: rows measured until then are kept"])
    monkeypatch.setattr(comm, "profile_comm", lambda **k: empty)
    code, _, err = swiftspec_cli("profile", "comm", "--device", "cpu", "--timeout", "0.01",
                           "-o", str(tmp_path / "p"))
    line = one_error_line(err)
    assert code == 2 and "measured nothing (stopped after 0 s)" in line and "kept" in line and "--timeout" in line
    assert (tmp_path / "p" / "comm.csv").read_text() == csv
    assert json.loads((tmp_path / "p" / "meta.json").read_text()) == meta
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["comm.csv", "meta.json"]  # no lock left
    # a fresh folder: nothing written at all, not even the folder
    code, _, err = swiftspec_cli("profile", "comm", "--device", "cpu", "-o", str(tmp_path / "q"))
    assert code == 2 and "wrote nothing" in one_error_line(err) and not (tmp_path / "q").exists()


def test_profile_comm_cut_short_keeps_earlier_rows_it_did_not_measure(tmp_path):
    from swiftspec.profiler.comm import CommResult, write_comm
    from swiftspec.spec import Profile

    _measured_comm_folder(tmp_path)
    part = MEASURED.iloc[:1].assign(ms=0.5)
    assert write_comm(tmp_path, CommResult(part, True, ["stopped after 1 s: rows measured until then are kept"]))
    got = pd.read_csv(tmp_path / "comm.csv").set_index("bytes")["ms"].to_dict()
    assert got == {1024: 0.5, 16384: 0.07}  # the new row replaces its namesake, the other stays
    assert any("kept 1 rows" in n for n in json.loads((tmp_path / "meta.json").read_text())["comm"]["notes"])
    assert len(Profile.load(tmp_path).comm) == 2 if (tmp_path / "compute.csv").exists() else True


def test_profile_compute_that_completed_nothing_keeps_the_measured_table(make_checkpoint, tmp_path):
    from swiftspec.profiler.compute import PARTIAL, ComputeGrid, ComputeOptions, TimingConfig, profile_compute
    from swiftspec.spec import UserError

    out = tmp_path / "p"
    out.mkdir()
    (out / "compute.csv").write_text("op,model,tp,tokens,kv_len,ms\nforward,m,1,1,16,1.0\n")
    (out / "meta.json").write_text('{"source": "measured", "gpu": "earlier"}\n')
    before = {p.name: p.read_text() for p in out.iterdir()}
    with pytest.raises(UserError, match=r"completed no table .*kept .*compute.csv and meta.json as they were"):
        profile_compute([str(make_checkpoint("llama"))], out, device="cpu",
                        grid=ComputeGrid(tps=(1,), tokens=(1,), kv=(16,), compact=(1,)),
                        timing=TimingConfig.for_device("cpu", True), progress=False,
                        options=ComputeOptions(host=False, time_budget_s=1e-9))  # fmt: skip
    assert {p.name: p.read_text() for p in out.iterdir() if p.name != PARTIAL} == before


# ---- one writer per profile folder ----------------------------------------------------------


@pytest.mark.parametrize("verb", [["compute", "--models", "Llama-3.2-1B", "--device", "cpu", "--quick"],
                                  ["comm", "--device", "cpu", "--world", "2"]])
def test_a_second_profile_writer_is_refused(monkeypatch, tmp_path, verb, swiftspec_cli):
    """While a process writes a profile folder, another gets one line and exit 2, and the folder is
    as it was (held here as another process would hold it: its own open file and flock)."""
    import swiftspec.profiler.comm as comm

    monkeypatch.setattr(comm, "profile_comm", lambda **k: pytest.fail("measured while another wrote the folder"))
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "meta.json").write_text("{}\n")
    with open(tmp_path / "p" / LOCK_NAME, "a") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        code, _, err = swiftspec_cli("profile", *verb, "-o", str(tmp_path / "p"))
    assert code == 2 and "being written by another swiftspec process" in one_error_line(err)
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == [LOCK_NAME, "meta.json"]
    assert (tmp_path / "p" / "meta.json").read_text() == "{}\n"


