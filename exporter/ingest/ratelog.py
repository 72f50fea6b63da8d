"""Logging at a bounded rate: a journal full of bad lines must not flood the sidecar's log.

Each key (a reject reason, a file) may log ``burst`` lines per ``period`` seconds; what is held
back is summarised in the next line that gets through ("… and N more like it"). String
arguments (file names, journal text) are escaped (``printable``): one log line per call, never a
forged one, and no terminal escapes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from nvrx_slo.exporter.printable import printable


class BoundedLog:
    def __init__(self, logger: logging.Logger, *, burst: int = 5, period: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger = logger
        self._burst = burst
        self._period = period
        self._clock = clock
        self._windows: dict[str, tuple[float, int, int]] = {}  # key -> (window start, logged, held back)

    def warning(self, key: str, msg: str, *args: object) -> None:
        self._emit(self._logger.warning, key, msg, *args)

    def exception(self, key: str, msg: str, *args: object) -> None:
        """Like ``warning``, with the traceback of the exception being handled."""
        self._emit(self._logger.exception, key, msg, *args)

    def _emit(self, sink: Callable[..., None], key: str, msg: str, *args: object) -> None:
        now = self._clock()
        start, logged, held = self._windows.get(key, (now, 0, 0))
        if now - start >= self._period:
            start, logged = now, 0
        if logged >= self._burst:
            self._windows[key] = (start, logged, held + 1)
            return
        if held:
            msg += f" (and {held} more like it held back)"
        self._windows[key] = (start, logged + 1, 0)
        sink(msg, *(printable(arg) if isinstance(arg, str) else arg for arg in args))
