"""Writing outputs safely and stamping them with where they were measured.

Every file swiftspec writes appears complete or not at all (write to a temporary name in the same
folder, then rename), so a failed or interrupted command leaves nothing half-written. Nothing that
was there is lost: an output replaces only a file of its own name, never a folder, and a folder
is never deleted. Outputs get the modes of ordinary files and folders (0666 / 0777 less the
process umask: 0644 / 0755 under the usual 022), readable by others. The verbs check their output
paths before any work (`check_output_file`, `check_output_dir`), and a profile folder is written
by one process at a time (`folder_lock`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import fcntl
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from swiftspec.errors import UserError

LOCK_NAME = ".swiftspec.lock"


def process_umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux), so that threads
    creating files meanwhile never see another mask."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # reading the umask elsewhere means setting it: put it straight back
    os.umask(mask)
    return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` via a temporary file and a rename.

    The file keeps the mode of the file it replaces, else gets an ordinary file's (0666 less the
    umask): mkstemp alone would make it 0600, unreadable by others. A write the OS refuses (no
    space, no permission) is UserError naming the path.
    """
    path = Path(path)
    with _as_user_error(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            mode = path.stat().st_mode & 0o7777 if path.is_file() else 0o666 & ~process_umask()
        except OSError:
            mode = 0o666 & ~process_umask()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                os.fchmod(f.fileno(), mode)
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


@contextlib.contextmanager
def _as_user_error(path: Path) -> Iterator[None]:
    """An OSError while writing `path` becomes one line (UserError) naming it."""
    try:
        yield
    except OSError as e:
        raise UserError(f"could not write {path}: {e.strerror or e}"
                              + (f" ({e.filename})" if e.filename and str(e.filename) != str(path) else "")) from None


def _collisions(src: Path, dest: Path) -> list[str]:
    """Entries of `src` whose namesake in `dest` is of the other kind (a folder where a file goes,
    or a file where a folder goes): moving them in would delete what is there."""
    out = []
    for entry in sorted(src.iterdir()):
        d = dest / entry.name
        if not os.path.lexists(d):
            continue
        d_dir = d.is_dir() and not d.is_symlink()
        if entry.is_dir() and d_dir:
            out += _collisions(entry, d)
        elif entry.is_dir() or d_dir:
            out.append(f"{d} is a {'folder' if d_dir else 'file'} where a {'folder' if entry.is_dir() else 'file'} goes")
    return out


def _merge_into(src: Path, dest: Path) -> None:
    """Move every entry of `src` into `dest` (files replace files of their name, folders merge)."""
    for entry in sorted(src.iterdir()):
        d = dest / entry.name
        if entry.is_dir() and d.is_dir() and not d.is_symlink():
            _merge_into(entry, d)
            entry.rmdir()
        else:
            os.replace(entry, d)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success its entries move into `path`, on failure it is
    removed and `path` is untouched.

    A new `path` appears whole (one rename) with an ordinary folder's mode. An existing `path`
    keeps everything else in it (so `-o .` is safe): the temporary folder lives inside it, files
    written here replace only files of their name and folders merge into folders of theirs. A
    namesake of the other kind (e.g. a user's folder named like an output file) is never deleted:
    nothing moves, the output stays in the temporary folder and UserError says where.
    """
    path = Path(path)
    with _as_user_error(path):
        if path.is_dir():
            tmp = Path(tempfile.mkdtemp(dir=path, prefix=".swiftspec-new-", suffix=".tmp"))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        with _as_user_error(path):
            os.chmod(tmp, 0o777 & ~process_umask())  # mkdtemp makes 0700
            yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        if not path.exists():
            os.replace(tmp, path)
            return
        clash = [f"{path} is a file where a folder goes"] if not path.is_dir() else _collisions(tmp, path)
        if clash:
            raise UserError(f"{clash[0]}: not written over; the new output is in {tmp} (move it from there)")
        _merge_into(tmp, path)
        tmp.rmdir()
    except OSError as e:  # what did not move stays in `tmp`
        raise UserError(f"could not write {path}: {e.strerror or e}; the new output is in {tmp}") from None


# ---- output paths, checked before any work -------------------------------------------------


def _check_creatable(path: Path, option: str, shown: str) -> None:
    """The nearest existing folder above `path` must be a writable folder (`path` and any missing
    folders between are created in it)."""
    anc = Path(os.path.abspath(path)).parent
    while not os.path.lexists(anc) and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise UserError(f"{option} {shown}: {anc} is a file, not a folder; choose another path")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise UserError(f"{option} {shown}: cannot write in {anc} (read-only folder); choose another path")


def check_output_file(path: str | Path, option: str) -> Path:
    """Refuse (UserError, one line naming `option`) an output file that cannot be written: an
    existing folder of that name, a parent that is a file, a read-only folder."""
    p = Path(path)
    if str(path) == "" or (p.is_dir() and not p.is_symlink()):
        raise UserError(f"{option} {path or repr('')}: is a folder; give a file path (e.g. {p / 'out.json'})")
    _check_creatable(p, option, str(path))
    return p


def check_output_dir(path: str | Path, option: str, entries: Iterable[str] = ()) -> Path:
    """Refuse (UserError, one line naming `option`) an output folder that cannot be written: an
    existing file of that name, a read-only folder, a parent that is a file, or an entry the verb
    writes (`entries`, file names) that exists there as a folder."""
    p = Path(path)
    if os.path.lexists(p) and not p.is_dir():
        raise UserError(f"{option} {path}: is a file, not a folder; give a folder path")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise UserError(f"{option} {path}: cannot write in it (read-only folder); choose another path")
        for name in entries:
            q = p / name
            if q.is_dir() and not q.is_symlink():
                raise UserError(f"{option} {path}: {q} is a folder where the output file {name} goes; "
                                f"move it away or choose another path")
    else:
        _check_creatable(p, option, str(path))
    return p


# ---- one writer per profile folder ---------------------------------------------------------

_HELD: dict[str, list] = {}  # realpath -> [lock file object, depth]: the locks this process holds


@contextlib.contextmanager
def folder_lock(folder: str | Path, what: str = "a profile") -> Iterator[Path]:
    """Hold an exclusive lock on `folder` (created if missing) while a block writes it.

    A second process asking for the lock gets UserError at once (one line). The lock is an flock
    on a hidden file inside the folder: the OS releases it when the process ends, so a crash
    leaves no stale lock; the file is removed on release (and a lock taken on a file that was
    removed meanwhile is taken again). Re-entrant within a process. A folder created here that is
    still empty on release is removed, so a refused or failed command leaves nothing behind.
    """
    folder = Path(folder)
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(folder)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield folder
        finally:
            _HELD[key][1] -= 1
        return
    lock_path = folder / LOCK_NAME
    while True:
        f = open(lock_path, "a")  # noqa: SIM115 (held across the yield)
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            f.close()
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise UserError(f"{folder} is being written by another swiftspec process ({what}); wait for it to "
                                f"finish or write to another folder (-o)") from None
            raise
        try:
            same = os.stat(lock_path).st_ino == os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        f.close()  # the holder removed the file as we opened it: lock the new one
    _HELD[key] = [f, 1]
    try:
        yield folder
    finally:
        del _HELD[key]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(lock_path)
        f.close()
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if empty


# ---- metadata ------------------------------------------------------------------------------


def run_metadata(device: str | None = None) -> dict:
    """GPU, driver, torch, triton, python, host, date and the command line, for result files."""
    meta: dict = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "python": platform.python_version(),
        "host": platform.node(),
    }
    # torch and triton are heavy: imported here, when a result is stamped, so that `plan` and the
    # studies (which import this module through spec.py) never load them.
    try:
        import torch

        meta["torch"] = torch.__version__
        if torch.cuda.is_available() and device != "cpu":
            meta["device"] = "cuda"
            meta["gpu"] = torch.cuda.get_device_name(0)
            meta["gpu_count"] = torch.cuda.device_count()
            meta["memory_bytes"] = torch.cuda.get_device_properties(0).total_memory
            meta["cuda"] = torch.version.cuda
        else:
            meta["device"] = "cpu"
            meta["gpu"] = "cpu"
            meta["cpu"] = platform.processor() or platform.machine()
            meta["cpu_count"] = os.cpu_count()
    except ImportError:
        pass
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        meta["triton"] = None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
        meta["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        meta["driver"] = None
    return meta

