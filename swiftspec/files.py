"""Writing outputs safely and stamping them with where they were measured.

Every file swiftspec writes appears complete or not at all (write to a temporary name in the same
folder, then rename), so a failed or interrupted command leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` via a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder to fill; on success its entries move into `path`, on failure it is
    removed and `path` is untouched.

    A new `path` appears whole (one rename). An existing `path` keeps everything else in it: only
    the entries written here replace their namesakes (one rename each), so `-o .` is safe.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        if not path.exists():
            os.replace(tmp, path)
            return
        for entry in sorted(tmp.iterdir()):
            dest = path / entry.name
            if dest.is_dir() and not dest.is_symlink():
                shutil.rmtree(dest)  # a folder of the same name is ours to replace
            os.replace(entry, dest)
        tmp.rmdir()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


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
