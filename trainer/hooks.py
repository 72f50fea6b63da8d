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

On a GPU, pass ``cuda_timing=True``: host clocks around a phase time kernel launches, not the work;
``nvrx_slo.trainer.cuda_timing`` says what the records mean then, where queued work is booked and
what the fences cost.

Why context managers: a span is written once, at its end, so a step that raises (a fault, an
in-process restart) leaves no record at all instead of a half one. Every method is safe to call
with the journal disabled (no ``NVRX_SLO_JOURNAL_DIR``) and none of them raises into training:
the journal counts its own failures.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer.cuda_timing import CudaStepTimer, DeviceEvent, cuda_events
from nvrx_slo.trainer.journal import Journal, int_env, open_journal

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

    def settle(self) -> None:
        """Nothing waits on host clocks: every step is journaled at its exit."""

    def __enter__(self) -> StepTimer:
        self._start = _monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self._journal.step(self._step, self._start, self._data.seconds, self._compute.seconds,
                               self._optimizer.seconds)
        else:  # a step that raised did not happen; the instant it left is the fault's
            self._journal.emit(EventType.STEP_FAILED, step=self._step, start=self._start,
                               error=f"{exc_type.__name__}: {exc}"[:300])


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


class _UserSpan:
    def __init__(self, journal: Journal, name: str) -> None:
        self._journal = journal
        self._name = name
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = _monotonic()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        # the time was spent whether or not the block raised; the exception goes on to the caller
        self._journal.emit(EventType.USER_SPAN, name=self._name, start=self._start)


class CheckpointSave:
    """One save as the training loop sees it; ``with hooks.checkpoint(step) as save:`` around the call.

    The block is the time the loop is blocked (``checkpoint_start`` → ``checkpoint_scheduled``). The
    save is durable (``checkpoint_end``) when the block ends, unless it is asynchronous: then
    ``track`` its future, or hand ``completion()`` to whatever calls back when the write is done.
    Every method is safe from any thread and never raises into training.
    """

    __slots__ = ("_journal", "ckpt", "step", "bytes", "_lock", "_start", "_planned", "_asynchronous", "_scheduled",
                 "_outcome", "_ended")

    def __init__(self, journal: Journal, ckpt: str, step: int) -> None:
        self._journal = journal
        self.ckpt = ckpt
        self.step = step
        self.bytes = 0  # set it if known: this rank's payload
        self._lock = threading.Lock()
        self._start = 0.0
        self._planned: float | None = None
        self._asynchronous = False
        self._scheduled = False
        self._outcome: tuple[float, str | None] | None = None  # (written, error) once known
        self._ended = False

    def track(self, result: Any) -> Any:
        """Observe an asynchronous save's result and return it unchanged: a ``concurrent.futures``
        or ``torch.futures`` Future, or DCP's ``AsyncSaveResponse`` (its ``upload_completion``)."""
        future = getattr(result, "upload_completion", result)
        try:
            if hasattr(future, "add_done_callback"):  # concurrent.futures and torch.futures alike
                self._asynchronous = True
                future.add_done_callback(self._future_done)
            else:
                self._journal.emit(EventType.WARNING, message=f"checkpoint {self.ckpt}: cannot track "
                                   f"{type(result).__name__}; counted durable when its block ends")
        except Exception as exc:  # never raise into training
            self._fail_tracking(exc)
        return result

    def completion(self) -> Callable[..., None]:
        """A callback that marks this save durable when called (an NVRx ``AsyncRequest`` finalize
        function, ``TorchAsyncCheckpoint``'s ``finalize_fn``, a framework's save callback)."""
        self._asynchronous = True
        return self.done

    def planned(self) -> None:
        """Inside the block: planning is over, staging and hand-off begin (``plan_s`` / ``stage_s``)."""
        self._planned = _monotonic()

    def done(self, *_: Any, written: float | None = None) -> None:
        """The write finished and is durable: now, or at ``written`` (``time.monotonic()``) if the
        writer stamped when it finished (the node's clock, so another process's stamp compares)."""
        self._settle(None, written)

    def waited(self, since: float) -> None:
        """The loop spent ``since`` (``time.monotonic()``) to now finishing this save after its
        block: a poll of the writer, the metadata write, the ranks' agreement. Checkpoint cost."""
        self._journal.emit(EventType.CHECKPOINT_FINALIZE, ckpt=self.ckpt, start=since)

    def failed(self, error: BaseException | str) -> None:
        """The save failed; ``error`` says why."""
        reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._settle(reason[:500])

    def _future_done(self, future: Any) -> None:
        try:
            if hasattr(future, "exception"):  # concurrent.futures.Future
                exc = future.exception()
            else:  # torch.futures.Future: wait() raises the save's error
                future.wait()
                exc = None
        except Exception as caught:
            exc = caught
        self._settle(None if exc is None else f"{type(exc).__name__}: {exc}"[:500])

    def _fail_tracking(self, exc: BaseException) -> None:
        self._journal.emit(EventType.WARNING, message=f"checkpoint {self.ckpt}: tracking failed: {exc}"[:500])

    def _settle(self, error: str | None, written: float | None = None) -> None:
        with self._lock:
            if self._outcome is not None:
                return
            self._outcome = (_monotonic() if written is None else written, error)
            ready = self._scheduled
        if ready:
            self._end()

    def _end(self) -> None:
        with self._lock:
            if self._ended or self._outcome is None:
                return
            self._ended = True
            written, error = self._outcome
        self._journal.emit(EventType.CHECKPOINT_END, ckpt=self.ckpt, step=self.step, ok=error is None,
                           written=written, error=error)

    def __enter__(self) -> CheckpointSave:
        self._start = _monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:  # the save call itself failed: over, and failed
            self.failed(exc)
        else:
            planned = self._start if self._planned is None else self._planned
            self._journal.emit(EventType.CHECKPOINT_SCHEDULED, ckpt=self.ckpt, plan_s=planned - self._start,
                               stage_s=_monotonic() - planned, bytes=self.bytes)
            if not self._asynchronous:
                self.done()
        with self._lock:
            self._scheduled = True
        self._end()  # an outcome that came in during the block is written after its scheduled


class Hooks:
    """One per rank process: owns the journal and hands out the timers."""

    def __init__(self, journal: Journal, events: Callable[[], DeviceEvent] | None = None) -> None:
        """``events`` makes new CUDA timing events (``cuda_events()``, a fake in tests): steps are
        then timed by the GPU; without it, or with the journal disabled, by host clocks."""
        self.journal = journal
        self._step: StepTimer | CudaStepTimer = (
            StepTimer(journal) if events is None or not journal.enabled else CudaStepTimer(journal, events))

    @classmethod
    def start(cls, world_size: int, journal_dir: str | None = None, *, cuda_timing: bool = False) -> Hooks:
        """Open the journal (``journal_dir`` or ``$NVRX_SLO_JOURNAL_DIR``) and journal the start,
        with the pod's worker count from the launcher's ``$LOCAL_WORLD_SIZE``.

        ``cuda_timing``: time steps by CUDA events (imports torch now). Opt-in, because it defers
        each step's record and fences before saves; where CUDA is missing it journals a warning and
        steps are timed by host clocks."""
        events, unavailable = None, None
        if cuda_timing:
            try:
                events = cuda_events()
            except Exception as exc:  # never raise into training
                unavailable = str(exc)
        hooks = cls(open_journal(journal_dir), events)
        hooks.journal.emit(EventType.PROCESS_START, world_size=world_size,
                           local_world_size=int_env(os.environ, "LOCAL_WORLD_SIZE"))
        if unavailable is not None:
            hooks.warning(f"cuda_timing: {unavailable}; steps are timed by host clocks")
        return hooks

    def step(self, step: int) -> StepTimer | CudaStepTimer:
        """``with hooks.step(n) as s:`` around one training step (not around checkpoint saves)."""
        return self._step._reset(step)

    def restore(self) -> _RestoreSpan:
        """``with hooks.restore() as r:`` around loading state; set ``r.step`` and ``r.path``."""
        return _RestoreSpan(self.journal)

    def checkpoint(self, step: int, ckpt: str | None = None, mode: str = "sync") -> CheckpointSave:
        """``with hooks.checkpoint(step) as save:`` around one save call of any checkpointing stack,
        on every rank. ``ckpt`` names the save the same on every rank (default ``step-NNNNNN``);
        ``mode`` ("sync" or "async") is shown in views. See ``CheckpointSave``."""
        ckpt = ckpt or f"step-{step:06d}"
        self._step.settle()  # the steps' GPU work is theirs, not the save's
        self.journal.emit(EventType.CHECKPOINT_START, ckpt=ckpt, step=step, mode=mode)
        return CheckpointSave(self.journal, ckpt, step)

    def span(self, name: str) -> _UserSpan:
        """``with hooks.span("eval"):`` around planned work that is not training (evaluation, an SDC
        check): its own category, ``user_span``, broken down by ``name``, instead of unattributed.
        Put it between steps, not inside one (a step's span already covers its time)."""
        self._step.settle()
        return _UserSpan(self.journal, name)

    def checkpoint_worker(self, alive: bool, pid: int | None) -> None:
        """The background writer process of async saves was seen alive or dead (``pid`` if known)."""
        self.journal.emit(EventType.CHECKPOINT_WORKER, alive=alive, worker_pid=pid)

    def warning(self, message: str, **fields: Any) -> None:
        """Something the operator should know (a fallback restore, a missing NVRx feature)."""
        self.journal.emit(EventType.WARNING, message=message, **fields)

    def fault_injected(self, kind: str, step: int) -> None:
        """The reference job is about to inject a fault (tests and demos only)."""
        self._step.settle()
        self.journal.emit(EventType.FAULT_INJECTED, kind=kind, step=step)

    def close(self) -> None:
        """Clean exit of this rank process."""
        self._step.settle()
        self.journal.emit(EventType.PROCESS_END)
        self.journal.close()
