"""Progress of long work on stderr: what the commands print while models build, tokens decode,
runs and sweeps proceed, so a minute of silence never looks like a hang.

`Progress` is a plain callable `(line: str) -> None`, which is all library code takes (a `log` or
`progress` parameter): the runtime and the simulator never import this module. Lines are plain,
never `\\r`-rewritten, so they read the same in a terminal, a log file and CI. `count` reports
"done of total" at most once per `interval_s` (and always the last step). Quiet (`--json`, or
`Progress(quiet=True)`) prints nothing, so stdout and stderr stay machine-readable. `bar` wraps an
iterable in a tqdm bar on a terminal only (and leaves it untouched elsewhere).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from typing import TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")


class Progress:
    """Progress lines on a stream (stderr by default); nothing when quiet."""

    def __init__(self, quiet: bool = False, stream: TextIO | None = None, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.quiet = quiet
        self.stream = stream
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def __call__(self, line: str) -> None:
        if self.quiet:
            return
        out = self._out()
        out.write(f"{line}\n")
        out.flush()

    def count(self, what: str, done: int, total: int | None = None, unit: str = "") -> None:
        """`what: done/total unit`, throttled per `what` to one line per interval (the last always)."""
        if self.quiet:
            return
        now = self.clock()
        final = total is not None and done >= total
        last = self._last.get(what)
        if not final and last is not None and now - last < self.interval_s:
            return
        self._last[what] = now
        of = f"/{total}" if total is not None else ""
        self(f"{what}: {done}{of}{f' {unit}' if unit else ''}")

    def bar(self, items: Iterable[T], desc: str, unit: str = "it") -> Iterable[T]:
        """`items` behind a tqdm bar when the stream is a terminal and not quiet; else as they are."""
        if self.quiet or not self._out().isatty():
            return items
        return tqdm(items, desc=desc, unit=unit, file=self._out(), leave=False)


def progress_for(as_json: bool = False) -> Progress:
    """The progress of one command: on stderr, quiet when it prints JSON."""
    return Progress(quiet=as_json)
