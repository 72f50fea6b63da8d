"""Steps timed by the GPU: what ``Hooks.start`` picks where the process uses CUDA (see ``hooks.py``).

Why: on a GPU, host clocks around ``s.compute()`` time kernel *launches*. The queued work is paid
at the next synchronisation (the next step's data phase, an ``.item()``, NVRx's poll, a
checkpoint's staging copy), and booked there: as data wait, or as checkpoint blocking, which pages.

What a step's record means here (the record format is the host timer's):

* The device: the one the rank works on (``pick_device``): its current device, or its local rank's
  on a node of several GPUs where the current device is still 0 (a script that moves work with
  ``.to(f"cuda:{local_rank}")`` and never calls ``torch.cuda.set_device``), with one warning
  whenever the two differ. Every event is recorded on that device's current stream, looked up
  once per step.
* Each phase records one CUDA event as it begins, and the step one as it ends (four a step in the
  usual loop). A phase lasts the GPU's ``elapsed_time`` from its event to the next one: the time
  the stream took between those boundaries. ``data`` is the GPU's wait for input (near 0 while it
  still runs earlier work); ``compute`` holds the work launched from its start to the optimizer's
  (the loop's own work between the two included); ``optimizer`` the work to the step's end.
* A step is written once its end event completed, checked with ``query()`` (never blocking) as
  each later step begins, and dated by the GPU: its ``mono`` is the instant the stream reached its
  end (an *anchor*'s host instant plus ``elapsed_time`` from the anchor's event), its ``start``
  where the host entered it or where the previous step ended on the GPU, if later. So spans never
  overlap, they tile the GPU's work, and a record written late (after a fault) keeps its own times.
  Anchor: an event whose host instant is known, taken at the first step (an event on an idle
  stream, or one the host waited for: work queued before the first step is waited for once) and at
  every fence that waits.
* Fences (``settle()``: a wait on the newest step's end event): before a checkpoint, a wait on a
  save in flight (NVRx's poll drains the queue anyway), a user span, an injected fault, and at
  close, so that the steps' GPU work is theirs and not what follows; and once more than
  ``MAX_PENDING`` steps wait, which only a loop that never reads a device value reaches. Neither
  idles the GPU: the host loses the lead it had over it, no more.
* Faults (``interrupted()``: a step, a wait or a span that raised, the in-process Wrapper's
  finalize, the process's exit): bounded work, never a wait for the GPU. The steps whose work is
  done are written with their own times; any other is written with host clocks, with a warning.
  A CUDA error switches the process to host clocks for good, with a warning and a
  ``step_timing`` record.
* Work on a stream the timed stream does not wait for is not seen. A CUDA graph's capture cannot
  hold an event record: time the graph's replay, not its capture (``docs/gpu.md``).
"""

from __future__ import annotations

import functools
import sys
import time
from collections import deque
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from nvrx_slo.contracts.schema import EventType, StepTimerKind
from nvrx_slo.trainer.journal import Journal
from nvrx_slo.trainer.saves import Waits
from nvrx_slo.trainer.step_phases import StepPhases

MAX_PENDING = 16  # steps left by the host whose GPU work may still run; one more is a fence

_monotonic = time.monotonic


class DeviceEvent(Protocol):
    """What a step needs of ``torch.cuda.Event(enable_timing=True)``; tests pass a fake."""

    def record(self, stream: Any = None) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds


class CudaDevice:
    """The device a rank's steps are timed on: its current stream (``stream()``) and new timing events."""

    __slots__ = ("index", "stream", "event")

    def __init__(self, index: int | None, stream: Callable[[], Any], event: Callable[[], DeviceEvent]) -> None:
        self.index = index
        self.stream = stream
        self.event = event


def in_use() -> bool:
    """Whether this process uses CUDA: torch is imported and has initialised CUDA. Imports nothing
    (the base install is the standard library) and never raises: torch's own cheap check."""
    torch: Any = sys.modules.get("torch")
    try:
        return torch is not None and bool(torch.cuda.is_initialized())
    except Exception:
        return False


def initialized_check() -> Callable[[], bool] | None:
    """``torch.cuda.is_initialized`` once torch is imported (None before): what ``in_use`` asks, for a
    caller that asks every step. Imports nothing."""
    torch: Any = sys.modules.get("torch")
    try:
        return None if torch is None else torch.cuda.is_initialized
    except Exception:
        return None


def pick_device(current: int, count: int, local_rank: int | None) -> tuple[int, str | None]:
    """The device a rank works on, and a warning where that is a guess.

    One GPU visible, or the current device its local rank's: the current device. Otherwise the
    current device if the script chose one (``set_device`` to another than 0), else the local
    rank's (torchrun's convention: a script that moves work with ``.to(f"cuda:{local_rank}")``
    and leaves the current device at 0), with a warning naming the fix either way."""
    if local_rank is None or count < 2 or not 0 <= local_rank < count or current == local_rank:
        return current, None
    chosen = current if current != 0 else local_rank
    return chosen, (f"the current CUDA device is {current} but LOCAL_RANK is {local_rank} on a node with {count} "
                    f"GPUs: steps are timed on the stream of cuda:{chosen}; call torch.cuda.set_device(local_rank) "
                    "before the first step, so that the rank's work, NCCL and the step timing use one device")


def cuda_device(local_rank: int | None) -> tuple[CudaDevice, str | None]:
    """The device this rank works on (``pick_device``) and its warning, or ``RuntimeError`` saying
    why there is none. The one place torch is imported, and only where CUDA is in use or a script
    asks for CUDA timing."""
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(f"torch is not importable ({exc})") from None
    cuda = torch.cuda
    if not cuda.is_available():
        raise RuntimeError("CUDA is not available")
    index, warning = pick_device(cuda.current_device(), cuda.device_count(), local_rank)
    return CudaDevice(index, functools.partial(cuda.current_stream, index),
                      functools.partial(cuda.Event, enable_timing=True)), warning


def event_seam(events: Callable[[], DeviceEvent]) -> CudaDevice:
    """Timing events recorded where they record themselves (``Hooks(journal, events)``: a test's fake)."""
    return CudaDevice(None, lambda: None, events)


class _Left:
    """A step the host has left, waiting for its GPU work to finish."""

    __slots__ = ("step", "start", "exit", "host", "marks", "end")

    def __init__(self, step: int, start: float, exit_: float, host: list[float],
                 marks: list[tuple[int, DeviceEvent]], end: DeviceEvent) -> None:
        self.step = step
        self.start = start
        self.exit = exit_  # when the host left it: the earliest its work can end
        self.host = host  # host-clock phases: what the record says if its GPU work is not seen done
        self.marks = marks  # (phase, event recorded as it began), in order
        self.end = end


class _CudaPhase:
    """One phase: an event as it begins, and the host clock for the fallback."""

    __slots__ = ("_timer", "_index", "_t0")

    def __init__(self, timer: CudaStepTimer, index: int) -> None:
        self._timer = timer
        self._index = index
        self._t0 = 0.0

    def __enter__(self) -> None:
        self._timer._mark(self._index)
        self._t0 = _monotonic()

    def __exit__(self, *exc: object) -> None:
        self._timer._host[self._index] += _monotonic() - self._t0


class CudaStepTimer(StepPhases[_CudaPhase]):
    """``StepTimer`` with its phases timed by CUDA events: used the same way, writes the same records
    (see the module docstring for what they mean here)."""

    __slots__ = ("_journal", "_waits", "_device", "_stream", "_free", "_pending", "_marks", "_step", "_start",
                 "_host", "_end", "_anchor", "_data", "_compute", "_optimizer")

    def __init__(self, journal: Journal, device: CudaDevice, waits: Waits) -> None:
        self._journal = journal
        self._waits = waits  # the loop's waits on saves: carried by the next record written
        self._device: CudaDevice | None = device  # None: CUDA failed, host clocks
        self._stream: Any = None  # the device's current stream, looked up as each step begins
        self._free: list[DeviceEvent] = []  # completed events, to record again
        self._pending: deque[_Left] = deque()
        self._marks: list[tuple[int, DeviceEvent]] = []
        self._step = 0
        self._start = 0.0
        self._host = [0.0, 0.0, 0.0]
        self._end = 0.0  # where the last step written ended
        self._anchor: tuple[DeviceEvent, float] | None = None  # (event, the host instant the stream reached it)
        self._data, self._compute, self._optimizer = _CudaPhase(self, 0), _CudaPhase(self, 1), _CudaPhase(self, 2)

    def _reset(self, step: int) -> CudaStepTimer:
        self._step = step
        self._host = [0.0, 0.0, 0.0]  # fresh lists: a waiting step keeps its own
        self._marks = []
        return self

    def settle(self) -> None:
        """Fence: wait for the GPU work of the steps the host has left, and journal them."""
        self._fence(0)

    def interrupted(self, why: str) -> None:
        """A fault (``why``): journal every waiting step without waiting for the GPU: with its own
        times if its work is done, else with host clocks and a warning."""
        self._poll()
        if self._pending:
            unseen = [left.step for left in self._pending]
            self._journal.emit(EventType.WARNING, message=f"steps {unseen}: GPU work not seen finished when "
                               f"{why}; journaled with host clocks"[:500])
            self._write_host()

    def __enter__(self) -> CudaStepTimer:
        if self._pending:
            self._poll()
        device = self._device
        if device is not None:
            try:
                self._stream = device.stream()
                if self._anchor is None:
                    self._take_anchor(device)
            except Exception as exc:  # never raise into training
                self._fail(exc)
        self._start = _monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.interrupted(f"step {self._step} failed")  # and drop the failed step's events
            self._journal.emit(EventType.STEP_FAILED, step=self._step, start=self._start,
                               error=f"{exc_type.__name__}: {exc}"[:300], **self._waits.field())
            return
        left = _monotonic()
        end = self._event()
        if end is None:  # host clocks: written now, as StepTimer writes it
            host = self._host
            self._journal.step(self._step, self._start, host[0], host[1], host[2], self._waits.take())
            return
        self._pending.append(_Left(self._step, self._start, left, self._host, self._marks, end))
        if len(self._pending) > MAX_PENDING:
            self._fence(MAX_PENDING)

    # --- internals ------------------------------------------------------------------------------

    def _event(self) -> DeviceEvent | None:
        """An event recorded now on the step's stream; None on host clocks."""
        device = self._device
        if device is None:
            return None
        try:
            event = self._free.pop() if self._free else device.event()
            event.record(self._stream)
            return event
        except Exception as exc:  # never raise into training
            self._fail(exc)
            return None

    def _mark(self, index: int) -> None:
        event = self._event()
        if event is not None:
            self._marks.append((index, event))

    def _take_anchor(self, device: CudaDevice) -> None:
        """The first anchor: an event on the stream, done at once if the stream is idle, else
        waited for (the work queued before the first step: once). Raises what CUDA raised."""
        event = device.event()
        event.record(self._stream)
        if not event.query():
            event.synchronize()
        self._anchor = (event, _monotonic())

    def _poll(self) -> None:
        """Journal the waiting steps whose GPU work has finished, oldest first, without blocking."""
        pending = self._pending
        try:
            while pending and pending[0].end.query():
                self._write(pending[0])
                pending.popleft()
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def _fence(self, keep: int) -> None:
        """Wait for the oldest waiting steps' GPU work until ``keep`` remain, and journal them; a
        wait that was needed gives a fresh anchor (the host saw the stream reach that event)."""
        pending = self._pending
        if len(pending) <= keep:
            return
        try:
            newest = pending[len(pending) - keep - 1].end
            waited = not newest.query()
            if waited:
                newest.synchronize()
            seen = _monotonic()
            while len(pending) > keep:
                self._write(pending[0])
                pending.popleft()
            if waited and self._anchor is not None:
                self._free.remove(newest)  # the anchor from now on
                self._free.append(self._anchor[0])
                self._anchor = (newest, seen)
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def _write(self, left: _Left) -> None:
        """Journal ``left``, its GPU work done, dated by the GPU. Raises what CUDA raised."""
        assert self._anchor is not None  # taken at the first step, before any step waits
        phases = [0.0, 0.0, 0.0]
        marks, end = left.marks, left.end
        for k, (index, event) in enumerate(marks):
            following = marks[k + 1][1] if k + 1 < len(marks) else end
            phases[index] += max(0.0, event.elapsed_time(following) / 1000.0)
        anchor, at = self._anchor
        start = max(left.start, self._end)
        finished = max(min(at + anchor.elapsed_time(end) / 1000.0, _monotonic()), left.exit, start)
        span, total = finished - start, phases[0] + phases[1] + phases[2]
        if total > span:  # the anchor's error, or the clocks drifting apart
            phases = [p * span / total for p in phases]
        self._journal.step(left.step, start, phases[0], phases[1], phases[2], self._waits.take(), at=finished)
        self._end = finished
        free = self._free
        free += (event for _, event in marks)
        free.append(end)

    def _write_host(self) -> None:
        """Journal every waiting step with its host-clock phases, ending where the host left it; the
        events are dropped (maybe unfinished)."""
        while self._pending:
            left = self._pending.popleft()
            start = max(left.start, self._end)
            self._end = finished = max(left.exit, start)
            self._journal.step(left.step, start, left.host[0], left.host[1], left.host[2], self._waits.take(),
                               at=finished)

    def _fail(self, exc: BaseException) -> None:
        """CUDA failed: host clocks for the rest of this process, with one warning."""
        device, self._device = self._device, None
        self._free.clear()
        self._marks = []
        self._anchor = None
        self._stream = None
        self._journal.emit(EventType.WARNING, message=f"CUDA step timing failed ({type(exc).__name__}: {exc}); "
                           "steps are timed by host clocks from here"[:500])
        self._journal.emit(EventType.STEP_TIMING, step=self._step, timer=StepTimerKind.HOST.value, cuda=True,
                           device=None if device is None else device.index,
                           reason=f"CUDA error: {type(exc).__name__}: {exc}"[:300])
        self._write_host()
