"""The in-process hooks a training script calls: process lifecycle, steps with phases, restore.

Usage (see the README, "Instrumenting your training script")::

    slo = Hooks.start(world_size=dist.get_world_size())
    with slo.restore() as restored:
        restored.step, restored.path = load_latest(...)     # None, None for a fresh start
    for step in range(restored.next_step, steps):
        with slo.step(step) as s:
            with s.data():
                batch = next(batches)
            with s.compute():
                loss = model(batch).sum(); loss.backward()
            with s.optimizer():
                opt.step(); opt.zero_grad()
        ckpt.poll()                                          # nvrx_slo.trainer.checkpoint, outside the step
    slo.close()

Why context managers: a span is written once, at its end, so a step that raises (a fault, an
in-process restart) leaves no record at all instead of a half one. Every method is safe to call
with the journal disabled (no ``NVRX_SLO_JOURNAL_DIR``) and none of them raises into training:
the journal counts its own failures.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import Any

from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer.journal import Journal, open_journal

log = logging.getLogger("nvrx_slo.hooks")

_monotonic = time.monotonic


class _Phase:
    """One timed phase of a step; reused across steps (no allocation on the hot path)."""

    __slots__ = ("seconds", "_t0")

    def __init__(self) -> None:
        self.seconds = 0.0
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._t0 = _monotonic()

    def __exit__(self, *exc: object) -> None:
        self.seconds += _monotonic() - self._t0


class StepTimer:
    """Times one training step; ``with hooks.step(n) as s:`` and ``with s.data():`` etc. inside.

    Time in the step outside the three phases counts as compute (loop overhead).
    """

    __slots__ = ("_journal", "_step", "_start", "_data", "_compute", "_optimizer")

    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._step = 0
        self._start = 0.0
        self._data = _Phase()
        self._compute = _Phase()
        self._optimizer = _Phase()

    def _reset(self, step: int) -> StepTimer:
        self._step = step
        self._data.seconds = self._compute.seconds = self._optimizer.seconds = 0.0
        return self

    def data(self) -> _Phase:
        """Waiting for input (the data loader): ``data_wait`` in the accounting."""
        return self._data

    def compute(self) -> _Phase:
        """Forward and backward."""
        return self._compute

    def optimizer(self) -> _Phase:
        """The optimizer step (and gradient clipping, zeroing)."""
        return self._optimizer

    def __enter__(self) -> StepTimer:
        self._start = _monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:  # a step that raised did not happen
            self._journal.step(self._step, self._start, self._data.seconds, self._compute.seconds,
                               self._optimizer.seconds)


class Restored:
    """What a restore produced: set ``step`` (the step the loaded state holds) and ``path``.

    ``fallback`` says why an older checkpoint (or a fresh start) was used instead of the newest.
    Leave ``step`` None for a fresh start.
    """

    def __init__(self) -> None:
        self.step: int | None = None
        self.path: str | None = None
        self.fallback: str | None = None

    @property
    def next_step(self) -> int:
        """The first step to run: one past the restored step, or 0."""
        return 0 if self.step is None else self.step + 1


class _RestoreSpan:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self._restored = Restored()
        self._start = 0.0

    def __enter__(self) -> Restored:
        self._start = _monotonic()
        return self._restored

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        r = self._restored
        if exc_type is None:
            self._journal.emit(EventType.RESTORE, start=self._start, step=r.step, path=r.path,
                               fallback=r.fallback)
        else:
            self._journal.emit(EventType.WARNING, message=f"restore failed: {exc_type.__name__}: {exc}")


class Hooks:
    """One per rank process: owns the journal and hands out the timers."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._step = StepTimer(journal)

    @classmethod
    def start(cls, world_size: int, journal_dir: str | None = None) -> Hooks:
        """Open the journal (``journal_dir`` or ``$NVRX_SLO_JOURNAL_DIR``) and journal the start."""
        hooks = cls(open_journal(journal_dir))
        hooks.journal.emit(EventType.PROCESS_START, world_size=world_size)
        return hooks

    def step(self, step: int) -> StepTimer:
        """``with hooks.step(n) as s:`` around one training step (not around checkpoint saves)."""
        return self._step._reset(step)

    def restore(self) -> _RestoreSpan:
        """``with hooks.restore() as r:`` around loading state; set ``r.step`` and ``r.path``."""
        return _RestoreSpan(self.journal)

    def warning(self, message: str, **fields: Any) -> None:
        """Something the operator should know (a fallback restore, a missing NVRx feature)."""
        self.journal.emit(EventType.WARNING, message=message, **fields)

    def fault_injected(self, kind: str, step: int) -> None:
        """The reference job is about to inject a fault (tests and demos only)."""
        self.journal.emit(EventType.FAULT_INJECTED, kind=kind, step=step)

    def close(self) -> None:
        """Clean exit of this rank process."""
        self.journal.emit(EventType.PROCESS_END)
        self.journal.close()
