import pytest

from swiftspec.files import atomic_dir


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
