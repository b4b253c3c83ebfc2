"""Progress lines on stderr while the bench runs (a terminal gets one updating line)."""

from __future__ import annotations

import sys
import time


class Progress:
    """A bar on stderr when it is a terminal: tqdm if installed, else one plain line redrawn; with -v, one
    line per phase with the time since the start instead (where a long run spends its time)."""

    def __init__(self, total_steps: int, enabled: bool, log_phases: bool = False):
        self._enabled = enabled
        self._log_phases = log_phases
        self._start = time.perf_counter()
        self._total = total_steps
        self._done = 0
        self._label = ""
        self._bar = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total_steps, file=sys.stderr, leave=False, unit="step",
                                 bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}]")

    def step(self, label: str) -> None:
        """Start the next phase."""
        if self._done:
            self._advance()
        self._done += 1
        self._label = label
        if self._log_phases:
            print(f"ckptfs bench: {time.perf_counter() - self._start:7.1f} s  {label}", file=sys.stderr)
        self._draw(label)

    @property
    def phase(self) -> str:
        return self._label

    def detail(self, text: str) -> None:
        self._draw(f"{self._label}: {text}")

    def _advance(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def _draw(self, text: str) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.set_description_str(text[:60])
            return
        width = 30
        filled = width * (self._done - 1) // max(1, self._total)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self._done}/{self._total} {text[:60]:<60}")
        sys.stderr.flush()

    def close(self) -> None:
        if not self._enabled:
            return
        self._enabled = False
        if self._bar is not None:
            self._bar.close()
        else:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()
