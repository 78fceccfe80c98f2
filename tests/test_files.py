import fcntl
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from swiftspec.files import (
    LOCK_NAME,
    atomic_dir,
    atomic_write_text,
    check_output_dir,
    check_output_file,
    folder_lock,
    process_umask,
)
from swiftspec.spec import UserError


def test_atomic_dir_into_an_existing_folder_keeps_what_it_did_not_write(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    (tmp_path / "report.csv").write_text("old")
    with atomic_dir(tmp_path) as tmp:  # e.g. `swiftspec validate -o .`
        (tmp / "report.csv").write_text("new")
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x").write_text("1")
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert (tmp_path / "report.csv").read_text() == "new" and (tmp_path / "sub" / "x").read_text() == "1"
    assert not [p for p in tmp_path.parent.iterdir() if p.name.startswith(f".{tmp_path.name}.")]


def test_atomic_dir_failure_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "half.csv").write_text("x")
        raise RuntimeError("boom")
    assert not out.exists() and list(tmp_path.iterdir()) == []


# ---- nothing that was there is lost ---------------------------------------------------------


def test_atomic_dir_keeps_a_users_folder_named_like_an_output_file(tmp_path):
    """A folder where an output file goes is never deleted: nothing moves, UserError names the
    folder and where the new output is kept."""
    (tmp_path / "report.csv").mkdir()
    (tmp_path / "report.csv" / "notes.txt").write_text("the user's")
    (tmp_path / "report.json").write_text("old")
    with pytest.raises(UserError, match="report.csv is a folder where a file goes") as e, atomic_dir(tmp_path) as tmp:
        (tmp / "report.csv").write_text("new")
        (tmp / "report.json").write_text("new")
    assert (tmp_path / "report.csv" / "notes.txt").read_text() == "the user's"
    assert (tmp_path / "report.json").read_text() == "old"  # all or nothing
    kept = Path(str(e.value).split("the new output is in ")[1].split(" ")[0])
    assert (kept / "report.csv").read_text() == "new" and (kept / "report.json").read_text() == "new"


def test_atomic_dir_merges_subfolders_and_refuses_a_file_where_a_folder_goes(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "old.txt").write_text("keep")
    with atomic_dir(tmp_path) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "new.txt").write_text("new")
    assert (tmp_path / "sub" / "old.txt").read_text() == "keep" and (tmp_path / "sub" / "new.txt").exists()
    (tmp_path / "plain").write_text("a file")
    with pytest.raises(UserError, match="file where a folder goes"), atomic_dir(tmp_path / "plain") as tmp:
        (tmp / "x").write_text("1")
    assert (tmp_path / "plain").read_text() == "a file"


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_outputs_are_readable_by_others_under_the_usual_umask(tmp_path, umask022):
    atomic_write_text(tmp_path / "a.json", "{}")
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o644
    with atomic_dir(tmp_path / "new") as tmp:
        (tmp / "f.csv").write_text("x")
        (tmp / "sub").mkdir()
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "new" / "f.csv").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "new" / "sub").stat().st_mode) == 0o755
    # an existing file keeps its mode; the umask is respected, not forced
    os.chmod(tmp_path / "a.json", 0o640)
    atomic_write_text(tmp_path / "a.json", "[]")
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640
    os.umask(0o077)
    atomic_write_text(tmp_path / "b.json", "{}")
    assert stat.S_IMODE((tmp_path / "b.json").stat().st_mode) == 0o600
    assert process_umask() == 0o077


# ---- output paths checked before any work ---------------------------------------------------


def test_check_output_file_refuses_what_cannot_be_written(tmp_path, monkeypatch):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match=r"^-o .*dir: is a folder; give a file path"):
        check_output_file(tmp_path / "dir", "-o")
    with pytest.raises(UserError, match=r"^--trace .*: .*file is a file, not a folder"):
        check_output_file(tmp_path / "file" / "deeper" / "t.json", "--trace")
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if Path(p) == ro else real_access(p, m))
    with pytest.raises(UserError, match=r"cannot write in .*ro \(read-only folder\)"):
        check_output_file(ro / "p.json", "-o")
    with pytest.raises(UserError, match=r"cannot write in .*ro \(read-only folder\)"):
        check_output_file(ro / "missing" / "p.json", "-o")  # a missing folder under a read-only one
    assert check_output_file(tmp_path / "new" / "p.json", "-o") == tmp_path / "new" / "p.json"
    assert check_output_file(tmp_path / "file", "-o") == tmp_path / "file"  # replaced atomically
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir", "file", "ro"]  # checking creates nothing


def test_check_output_dir_refuses_what_cannot_be_written(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    (tmp_path / "out" / "report.csv").mkdir(parents=True)
    with pytest.raises(UserError, match=r"^-o .*file: is a file, not a folder"):
        check_output_dir(tmp_path / "file", "-o")
    with pytest.raises(UserError, match=r"file is a file, not a folder"):
        check_output_dir(tmp_path / "file" / "sub", "-o")
    with pytest.raises(UserError, match=r"report.csv is a folder where the output file report.csv goes"):
        check_output_dir(tmp_path / "out", "-o", ("report.json", "report.csv"))
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, m: False if Path(p) == tmp_path / "out" else real_access(p, m))
    with pytest.raises(UserError, match=r"read-only folder"):
        check_output_dir(tmp_path / "out", "-o")
    with pytest.raises(UserError, match=r"read-only folder"):
        check_output_dir(tmp_path / "out" / "a" / "b", "-o")
    assert check_output_dir(tmp_path / "fresh" / "x", "-o") == tmp_path / "fresh" / "x"
    assert not (tmp_path / "fresh").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_really_read_only_folder_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    try:
        with pytest.raises(UserError, match="read-only"):
            check_output_dir(ro, "-o")
        with pytest.raises(UserError, match="read-only"):
            check_output_file(ro / "sub" / "p.json", "-o")
    finally:
        ro.chmod(0o755)


# ---- one writer per profile folder ----------------------------------------------------------


def test_folder_lock_refuses_a_second_writer_and_leaves_nothing(tmp_path):
    folder = tmp_path / "prof"
    with folder_lock(folder) as f, folder_lock(folder):  # re-entrant in one process
        assert f == folder and (folder / LOCK_NAME).exists()
        with open(folder / LOCK_NAME) as other:  # another open file: as another process would
            with pytest.raises(BlockingIOError):
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    assert not folder.exists()  # created here, empty at the end: removed
    (tmp_path / "held").mkdir()
    with open(tmp_path / "held" / LOCK_NAME, "a") as holder:
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        with pytest.raises(UserError, match=r"being written by another swiftspec process \(profile comm\)"):
            with folder_lock(tmp_path / "held", "profile comm"):
                pass
    with folder_lock(tmp_path / "held"):  # released with its holder
        pass
    assert list((tmp_path / "held").iterdir()) == []


def test_a_crashed_writer_leaves_no_stale_lock(tmp_path):
    """The lock dies with its process: a holder killed by SIGKILL never blocks the next writer."""
    (tmp_path / "p").mkdir()
    code = ("import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
            "print('held', flush=True); time.sleep(60)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "p" / LOCK_NAME)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError), folder_lock(tmp_path / "p"):
            pass
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(tmp_path / "p"):
        pass


def test_a_write_the_os_refuses_is_one_line(tmp_path, monkeypatch):
    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(UserError, match=r"could not write .*a.json: No space left on device"):
        atomic_write_text(tmp_path / "a.json", "{}")
    (tmp_path / "out").mkdir()
    with pytest.raises(UserError, match=r"could not write .*out: No space left on device; the new output is in"):
        with atomic_dir(tmp_path / "out") as tmp:
            (tmp / "r.csv").write_text("x")
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary file left beside
