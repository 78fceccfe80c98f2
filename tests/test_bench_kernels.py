"""benchmarks/bench_kernels.py on CPU (TRITON_INTERPRET=1): every tile the tile sweep tries matches
the torch reference and its file says which tile each row ran; the grid's complete file (with
goals) replaces the partial ones it writes after every shape."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_kernels.py"
sys.path.insert(0, str(BENCH.parent))

import bench_kernels  # noqa: E402


def run_bench(*args: str) -> subprocess.CompletedProcess:
    """bench_kernels.py --quick with `args`, interpreted Triton, in a child process."""
    return subprocess.run([sys.executable, str(BENCH), "--quick", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1"})


def test_tile_sweep_quick(tmp_path):
    proc = run_bench("--tile-sweep", "--tiles", "16/32/4/2,32/64/4/2/tma", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (csv,) = tmp_path.glob("kernels_tiles_*_quick.csv")
    df = pd.read_csv(csv)
    assert set(zip(df.block_m, df.block_n, df.tma)) == {(16, 32, False), (32, 64, True)}
    assert set(df.num_splits) == {1, 2}
    assert (df.rel_err < 2e-2).all() and df.us.notna().all()
    meta = json.loads(csv.with_suffix(".json").read_text())["metadata"]
    assert meta["shapes_done"] == meta["shapes"] == 1
    assert "best tile per shape" in proc.stdout


def test_grid_quick_final_file_replaces_the_partial_ones(tmp_path):
    proc = run_bench("--no-sweep", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (js,) = tmp_path.glob("kernels_*_quick.json")
    d = json.loads(js.read_text())
    assert "partial" not in d["metadata"] and "goals" in d
    df = pd.DataFrame(d["rows"])
    tri = df[df.impl == "triton"]
    assert sorted(tri.kv) == [96, 160] and (tri.rel_err < 2e-2).all()
    assert (df.impl == "sdpa_mask").any() and df.impl.str.startswith("kv_move").any()  # the run went past the grid
    growth = df[df.impl == "tree_growth_triton"]  # the last rows: same top-k as torch (else rel_err is inf)
    assert sorted(growth.queries) == [1, 4] and (growth.rel_err < 1e-4).all() and growth.wall_us.notna().all()


def test_bad_tile_arguments_are_one_line_exit_2(tmp_path, capsys):
    """The first bad argument through the script (its exit status, nothing else on stderr), the
    rest through `main` in this process (the same parse and return)."""
    proc = run_bench("--tile-sweep", "--tiles", "128/64/8", "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    for bad in (["--tiles", "128/64/8/3/x"], ["--tile-shapes", "1024:32"], ["--tile-shapes", "1024:32:32/8:64:1"]):
        code = bench_kernels.main(["--quick", "--tile-sweep", *bad, "--out", str(tmp_path)])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert not any(tmp_path.iterdir())  # nothing written
