"""Steps timed by the GPU: what ``Hooks.start`` picks where the process uses CUDA (see ``hooks.py``).

Why: on a GPU, host clocks around ``s.compute()`` time kernel *launches*. The queued work is paid
at the next synchronisation (the next step's data phase, an ``.item()`` in the optimizer, a
checkpoint's staging copy), and booked there: as data wait, or as checkpoint blocking, which pages.

What a step's record means here (the record format is the host timer's):

* Each phase records a CUDA event (``torch.cuda.Event(enable_timing=True)``, on the current stream)
  as it begins and as it ends; it lasts the GPU's ``elapsed_time`` between the two: the time the
  stream took from one boundary to the other. ``data`` is the time the GPU waited for input (near 0
  while it still runs earlier work); ``compute`` and ``optimizer`` hold the work launched in them,
  wherever the host waited for it.
* A step is journaled once the event recorded at its exit has completed, checked with ``query()``
  (never blocking) at every hook call of the steps that follow. Its span ends when its GPU work was
  *seen* finished (the record's ``mono``: it is written then) and starts where the host entered the
  step, or where the previous step was seen finished if that is later: spans never overlap, and
  the records tile the time the GPU worked. A record's phases are those the GPU finished in its
  span: the step's own, and any of the next step's already done when it is written (typically that
  step's data wait), so each phase second is booked once, in the span it happened in.
* Fences (``synchronize()``, blocking): ``settle()`` — before a checkpoint, a user span or an
  injected fault, and at close — so that the GPU work of the steps before is booked to them and not
  to what follows; and on the oldest step once more than ``MAX_PENDING`` wait, which caps the
  host's lead at that many steps. Neither idles the GPU: a save or an evaluation would wait for that
  work anyway (its first copy or kernel queues behind it), and behind the oldest step the newer ones
  are still queued. The host loses the lead it had over the GPU, no more.
* Approximate: a span ends late by the time until a hook call sees the step's work done (at most
  the host's time between two hook calls; the next span is shorter by as much): sums over steps are
  right, a single step's span (the step-duration histogram) is not. Host time between steps
  (logging) while the GPU still ran the step counts to the step. GPU work a user span leaves queued
  is booked to the next step. Work on a stream the current stream does not wait for is not seen.
* Never raises into training: a step that raises writes the steps still waiting without waiting
  for the GPU (host clocks for those whose work is not seen finished, and a warning), and a CUDA
  error switches this process to host clocks for good, with one warning.
"""

from __future__ import annotations

import functools
import sys
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer.journal import Journal
from nvrx_slo.trainer.saves import Waits

MAX_PENDING = 2  # steps left by the host whose GPU work may still run; one more is a fence

_monotonic = time.monotonic


class DeviceEvent(Protocol):
    """What a step needs of ``torch.cuda.Event(enable_timing=True)``; tests pass a fake."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds


def in_use() -> bool:
    """Whether this process uses CUDA: torch is imported and has initialised CUDA. Imports nothing
    (the base install is the standard library) and never raises: torch's own cheap check."""
    torch: Any = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_initialized())
    except Exception:
        return False


def cuda_events() -> Callable[[], DeviceEvent]:
    """New timing events for the current CUDA stream, or ``RuntimeError`` saying why there are none.

    The one place torch is imported, and only where CUDA is in use or a script asks for CUDA timing."""
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(f"torch is not importable ({exc})") from None
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA is not available")
    return functools.partial(torch.cuda.Event, enable_timing=True)


class _Left:
    """A step the host has left, waiting for its GPU work to finish."""

    __slots__ = ("step", "start", "host", "end")

    def __init__(self, step: int, start: float, host: list[float], end: DeviceEvent) -> None:
        self.step = step
        self.start = start
        self.host = host  # host-clock phases: what the record says if CUDA fails
        self.end = end


class _CudaPhase:
    """One phase: an event at each boundary, and the host clock for the fallback."""

    __slots__ = ("_timer", "_index", "_t0", "_begin")

    def __init__(self, timer: CudaStepTimer, index: int) -> None:
        self._timer = timer
        self._index = index
        self._t0 = 0.0
        self._begin: DeviceEvent | None = None

    def __enter__(self) -> None:
        self._timer._poll()
        self._begin = self._timer._record()
        self._t0 = _monotonic()

    def __exit__(self, *exc: object) -> None:
        timer = self._timer
        timer._host[self._index] += _monotonic() - self._t0
        end = timer._record()
        if end is not None and self._begin is not None:
            timer._marks.append((self._index, self._begin, end))
        timer._poll()


class CudaStepTimer:
    """``StepTimer`` with its phases timed by CUDA events: used the same way, writes the same records
    (see the module docstring for what they mean here)."""

    __slots__ = ("_journal", "_waits", "_new_event", "_free", "_pending", "_marks", "_step", "_start", "_host",
                 "_seen", "_data", "_compute", "_optimizer")

    def __init__(self, journal: Journal, new_event: Callable[[], DeviceEvent], waits: Waits) -> None:
        self._journal = journal
        self._waits = waits  # the loop's waits on saves: carried by the next record written
        self._new_event: Callable[[], DeviceEvent] | None = new_event  # None: CUDA failed, host clocks
        self._free: list[DeviceEvent] = []  # completed events, to record again
        self._pending: deque[_Left] = deque()
        self._marks: deque[tuple[int, DeviceEvent, DeviceEvent]] = deque()  # (phase, begin, end), not yet booked
        self._step = 0
        self._start = 0.0
        self._host = [0.0, 0.0, 0.0]
        self._seen = 0.0  # when the last step journaled from events was written
        self._data, self._compute, self._optimizer = _CudaPhase(self, 0), _CudaPhase(self, 1), _CudaPhase(self, 2)

    def _reset(self, step: int) -> CudaStepTimer:
        self._step = step
        self._host = [0.0, 0.0, 0.0]  # a fresh list: a waiting step keeps its own
        return self

    def data(self) -> _CudaPhase:
        """Waiting for input: the GPU's wait, ``data_wait`` in the accounting."""
        return self._data

    def compute(self) -> _CudaPhase:
        """Forward and backward: the GPU's time for the work launched here."""
        return self._compute

    def optimizer(self) -> _CudaPhase:
        """The optimizer step (and gradient clipping, zeroing)."""
        return self._optimizer

    def settle(self) -> None:
        """Fence: wait for the GPU work of the steps the host has left, and journal them."""
        self._fence(0)

    def __enter__(self) -> CudaStepTimer:
        self._poll()
        self._start = _monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self._at_fault()
            self._journal.emit(EventType.STEP_FAILED, step=self._step, start=self._start,
                               error=f"{exc_type.__name__}: {exc}"[:300], **self._waits.field())
            return
        end = self._record()
        if end is None:  # host clocks: written now, as StepTimer writes it
            host = self._host
            self._journal.step(self._step, self._start, host[0], host[1], host[2], self._waits.take())
            return
        self._pending.append(_Left(self._step, self._start, self._host, end))
        if len(self._pending) > MAX_PENDING:
            self._fence(MAX_PENDING)

    # --- internals ------------------------------------------------------------------------------

    def _record(self) -> DeviceEvent | None:
        """An event recorded now on the current stream; None on host clocks."""
        if self._new_event is None:
            return None
        try:
            event = self._free.pop() if self._free else self._new_event()
            event.record()
            return event
        except Exception as exc:  # never raise into training
            self._fail(exc)
            return None

    def _poll(self) -> None:
        """Journal the waiting steps whose GPU work has finished, oldest first, without blocking."""
        pending = self._pending
        try:
            while pending and pending[0].end.query():
                self._write(pending[0], _monotonic())
                pending.popleft()
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def _fence(self, keep: int) -> None:
        """Wait for the oldest waiting steps' GPU work until ``keep`` remain, and journal them."""
        pending = self._pending
        try:
            while len(pending) > keep:
                pending[0].end.synchronize()
                self._write(pending[0], _monotonic())
                pending.popleft()
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def _write(self, left: _Left, seen: float) -> None:
        """Journal ``left``, its GPU work seen finished at ``seen``, with the phases the GPU finished in
        its span: its own, and any of the next steps' already done. Raises what CUDA raised."""
        phases = [0.0, 0.0, 0.0]
        marks, free = self._marks, self._free
        first = marks[0][0] if marks else 0
        while marks and marks[0][2].query():
            index, begin, end = marks[0]
            phases[index] += max(0.0, begin.elapsed_time(end) / 1000.0)
            free += (begin, end)
            marks.popleft()
        start = max(left.start, self._seen)
        span = seen - start
        excess = phases[0] + phases[1] + phases[2] - span
        if excess > 0.0:  # the first phase began before the span: the previous record holds that part
            phases[first] -= min(excess, phases[first])
            total = phases[0] + phases[1] + phases[2]
            if total > span:  # float noise, or the clocks drifting apart
                phases = [p * span / total for p in phases]
        self._journal.step(left.step, start, phases[0], phases[1], phases[2], self._waits.take())
        self._seen = _monotonic()  # not before the record's mono: the next span starts after it
        free.append(left.end)

    def _write_host(self) -> None:
        """Journal every waiting step with its host-clock phases; the events are dropped (maybe unfinished)."""
        self._marks.clear()
        while self._pending:
            left = self._pending.popleft()
            self._journal.step(left.step, left.start, left.host[0], left.host[1], left.host[2], self._waits.take())

    def _at_fault(self) -> None:
        """A step raised: the GPU may be faulted, so journal the waiting steps without waiting for it."""
        self._poll()
        if self._pending:
            unseen = [left.step for left in self._pending]
            self._journal.emit(EventType.WARNING, message=f"steps {unseen}: GPU work not seen finished when step "
                               f"{self._step} failed; journaled with host clocks"[:500])
        self._write_host()  # and drop the failed step's events

    def _fail(self, exc: BaseException) -> None:
        """CUDA failed: host clocks for the rest of this process, with one warning."""
        self._new_event = None
        self._free.clear()
        self._journal.emit(EventType.WARNING, message=f"CUDA step timing failed ({type(exc).__name__}: {exc}); "
                           "steps are timed by host clocks from here"[:500])
        self._write_host()
