"""When a save's background write actually finished, as the writer process saw it: it stamps the
instant in a file beside the checkpoint, and the trainer reads it back as ``checkpoint_end``'s
``written`` (not when the trainer happened to notice)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def path(checkpoint: Path, rank: int) -> Path:
    """Where the rank's writer stamps the instant its write of ``checkpoint`` finished."""
    return checkpoint / f".nvrx-slo-written.{rank}"


class StampedWrite:
    """Runs NVRx's write function in the writer process, then records when it actually finished.

    Picklable (it crosses to NVRx's spawned worker). CLOCK_MONOTONIC is node-wide, so the stamp
    compares directly with the trainer's clock.
    """

    def __init__(self, write: Callable[..., Any], stamp: str, delay_s: float) -> None:
        self.write = write
        self.stamp = stamp
        self.delay_s = delay_s

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        try:
            time.sleep(self.delay_s)
            self.write(*args, **kwargs)
        finally:
            try:  # an exception here would end NVRx's worker loop: the trainer falls back to "observed"
                with open(self.stamp, "w") as f:
                    f.write(repr(time.monotonic()))
            except OSError:
                pass


def read(checkpoint: Path, rank: int, default: float) -> float:
    """When the rank's write of ``checkpoint`` finished, by its stamp (removed once read), else ``default``."""
    stamp = path(checkpoint, rank)
    try:
        written = float(stamp.read_text())
        stamp.unlink()
        return written
    except (OSError, ValueError):
        return default
