"""What every study shares: the output record, the footer, writing PNG + SVG, reading inputs.

Figures are drawn on a bare `matplotlib.figure.Figure` (Agg canvas), never through pyplot, so no
global backend or figure registry is touched. Each figure carries, in its footer and in the
PNG/SVG metadata, the one command that regenerates it and the labels of its inputs (profile
`derived` / `measured, ...`, acceptance `synthetic (...)` / `measured`, weights `random`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import tempfile
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from swiftspec.spec import UserError

Progress = Callable[[Iterable], Iterable] | None


@dataclass
class StudyOutput:
    """What a study wrote: its files (PNG, SVG), the command that regenerates them, the labels of
    its inputs, and every axes' (title, xlabel, ylabel) so tests and users can check them."""

    name: str
    paths: list[Path]
    command: str
    labels: list[str] = field(default_factory=list)
    axes: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def study_command(name: str, inputs: Sequence[str | Path] = ()) -> str:
    """The command line that regenerates a figure (output folder aside)."""
    parts = ["swiftspec", "study", name]
    for p in inputs:
        parts += ["-i", str(p)]
    return shlex.join(parts)


def new_figure(width: float = 8.0, height: float = 5.0) -> Figure:
    """A figure on its own Agg canvas (no pyplot state)."""
    fig = Figure(figsize=(width, height), dpi=120, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def add_footer(fig: Figure, command: str, labels: Sequence[str], notes: Sequence[str] = ()) -> None:
    """Small grey text under the axes: the inputs' labels, notes (a line each, at most 4), then the
    command that regenerates the figure."""
    width = int(fig.get_figwidth() * 16)  # characters of 7 pt monospace per line
    lines = textwrap.wrap(" · ".join(labels), width) if labels else []
    lines += [n if len(n) <= width else n[: width - 3] + "..." for n in notes[:4]]
    lines.append(f"regenerate: {command}")
    h = 0.03 * len(lines) * 5.0 / fig.get_figheight() + 0.01
    fig.get_layout_engine().set(rect=(0, h, 1, 1 - h))
    fig.text(0.005, 0.005, "\n".join(lines), fontsize=7, color="0.35", ha="left", va="bottom", family="monospace")


def save_figure(fig: Figure, name: str, out_dir: str | Path, command: str, labels: Sequence[str]) -> list[Path]:
    """Write `<out_dir>/<name>.png` and `.svg`; each appears complete or not at all.

    PNG text chunks and SVG metadata hold the command and labels; the SVG has no date, so the same
    inputs give the same file.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create output folder {out}: {e.strerror}") from None
    desc = f"{command}\n" + "\n".join(labels)
    paths = []
    for ext, meta in (("png", {"Description": desc, "Software": "swiftspec"}),
                      ("svg", {"Description": desc, "Creator": "swiftspec", "Date": None})):
        path = out / f"{name}.{ext}"
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{path.name}.", suffix=f".{ext}")
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the figure gets an ordinary file's mode
        try:
            fig.savefig(tmp, format=ext, metadata=meta)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        paths.append(path)
    return paths


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def axes_labels(fig: Figure) -> list[tuple[str, str, str]]:
    """(title, xlabel, ylabel) of every axes with data (colorbars left out)."""
    return [(a.get_title(), a.get_xlabel(), a.get_ylabel()) for a in fig.axes if a.get_label() != "<colorbar>"]


def finish(fig: Figure, name: str, inputs: Sequence[str | Path], out_dir: str | Path, labels: Sequence[str],
           notes: Sequence[str] = ()) -> StudyOutput:
    """Footer, write PNG + SVG, and the StudyOutput record."""
    cmd = study_command(name, inputs)
    labels = list(dict.fromkeys(labels))  # keep order, drop repeats
    add_footer(fig, cmd, labels, notes)
    paths = save_figure(fig, name, out_dir, cmd, labels)
    return StudyOutput(name=name, paths=paths, command=cmd, labels=labels, axes=axes_labels(fig), notes=list(notes))


# --------------------------------------------------------------------------------------------
# inputs


def bundled_results(name: str = "") -> Path:
    """`swiftspec/data/results/<name>`: the measured results the studies draw by default.

    They ship inside the package (package data), so an installed `swiftspec` draws them with no
    source checkout; -i points a study at other files.
    """
    return Path(str(resources.files("swiftspec") / "data" / "results" / name))


def need_path(p: str | Path, what: str) -> Path:
    path = Path(p)
    if not path.exists():
        raise UserError(f"{what} {path} not found")
    return path


@dataclass
class SimInputs:
    """Simulator inputs named by -i: a profile folder and/or an acceptance profile JSON (None =
    the embedded H200 profile, measured where it covers the pair / synthetic acceptance)."""

    profile: str | None = None
    acceptance: str | None = None


def sim_inputs(inputs: Sequence[str | Path], study: str) -> SimInputs:
    """Sort -i paths into a profile folder (holds compute.csv) and an acceptance JSON."""
    got = SimInputs()
    for raw in inputs:
        p = need_path(raw, "input")
        if p.is_dir() and (p / "compute.csv").exists():
            got.profile = str(p)
        elif p.is_file() and p.suffix == ".json":
            got.acceptance = str(p)
        else:
            raise UserError(
                f"study {study}: -i {p} is neither a profile folder (with compute.csv) nor an acceptance "
                "profile JSON"
            )
    return got


def synthetic_notes(acceptance_label: str, profile_label: str) -> list[str]:
    """Footer labels of simulator inputs, saying plainly when they are not measurements."""
    return [f"profile: {profile_label}" + (" (derived from anchor timings, not measured)"
                                           if profile_label == "derived" else ""),
            f"acceptance: {acceptance_label}"]
