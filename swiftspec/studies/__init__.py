"""Figures: `swiftspec study NAME [-i INPUT ...] [-o DIR]`, one module per figure.

Each module has NAME, DESCRIPTION and `main(inputs, out_dir, progress=None) -> StudyOutput`, which
writes `<out_dir>/<NAME>.png` and `.svg` with the command that regenerates them in the footer and
the file metadata. Inputs default to data bundled in the package (the embedded H200 profile, the
synthetic acceptance profile, the measured results in swiftspec/data/results), so every study runs
with no arguments from an installed `swiftspec`; -i points a study at other files.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from pathlib import Path

from swiftspec.spec import UserError
from swiftspec.studies.figure import Progress, StudyOutput

# name -> module, in the order `--list` shows them
STUDIES = {
    "validation": "swiftspec.studies.validation",
    "speedup-vs-gpus": "swiftspec.studies.speedup_vs_gpus",
    "split-heatmap": "swiftspec.studies.split_heatmap",
    "hardware": "swiftspec.studies.hardware",
    "tree-budget": "swiftspec.studies.tree_budget",
    "timeline": "swiftspec.studies.timeline",
    "kernels": "swiftspec.studies.kernels",
}


def study_module(name: str):
    if name not in STUDIES:
        raise UserError(f"unknown study {name!r}: choose from {', '.join(STUDIES)} (swiftspec study --list)")
    return importlib.import_module(STUDIES[name])


def list_studies() -> list[tuple[str, str]]:
    """(name, one-line description) of every study."""
    return [(n, study_module(n).DESCRIPTION) for n in STUDIES]


def run_study(name: str, inputs: Sequence[str | Path] = (), out_dir: str | Path = ".",
              progress: Progress = None) -> StudyOutput:
    """Draw one figure; returns what was written and the command that regenerates it."""
    return study_module(name).main(list(inputs), out_dir, progress=progress)


__all__ = ["STUDIES", "StudyOutput", "list_studies", "run_study", "study_module"]
