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
        with slo.checkpoint_wait():                          # outside the step: polls of an async writer
            queue.maybe_finalize_async_calls(blocking=False)
    slo.close()

Steps are timed by CUDA events where the process uses CUDA, by host clocks otherwise: decided at
the first step, and again at the first step after CUDA appears (``Hooks.start``'s ``timing``); each
choice is journaled (``step_timing``). On a GPU, host clocks around a phase time kernel launches,
not the work. ``nvrx_slo.trainer.cuda_timing`` says what the records mean then, where queued work
is booked and what the fences cost.

Why context managers: a span is written once, at its end, so a step that raises (a fault, an
in-process restart) leaves no record at all instead of a half one. Every method is safe to call
with the journal disabled (no ``NVRX_SLO_JOURNAL_DIR``) and none of them raises into training:
the journal counts its own failures.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from nvrx_slo.contracts.schema import EventType, StepTimerKind
from nvrx_slo.trainer import cuda_timing, launch_env
from nvrx_slo.trainer.cuda_timing import CudaStepTimer, DeviceEvent
from nvrx_slo.trainer.journal import Journal, open_journal, process_start_mono
from nvrx_slo.trainer.saves import CheckpointSave, CheckpointWait, SaveWait, Waits, observe_queue
from nvrx_slo.trainer.step_phases import StepPhases

__all__ = ["TIMINGS", "CheckpointSave", "CheckpointWait", "Hooks", "Restored", "StepTimer"]

Q = TypeVar("Q")

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


class StepTimer(StepPhases[_Phase]):
    """Times one training step; ``with hooks.step(n) as s:`` and ``with s.data():`` etc. inside.

    Time in the step outside the three phases counts as compute (loop overhead).
    """

    __slots__ = ("_journal", "_waits", "_step", "_start", "_data", "_compute", "_optimizer")

    def __init__(self, journal: Journal, waits: Waits) -> None:
        self._journal = journal
        self._waits = waits
        self._step = 0
        self._start = 0.0
        self._data = _Phase()
        self._compute = _Phase()
        self._optimizer = _Phase()

    def _reset(self, step: int) -> StepTimer:
        self._step = step
        self._data.seconds = self._compute.seconds = self._optimizer.seconds = 0.0
        return self

    def __enter__(self) -> StepTimer:
        self._start = _monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            waits = self._waits
            self._journal.step(self._step, self._start, self._data.seconds, self._compute.seconds,
                               self._optimizer.seconds, waits.take() if waits.seconds else 0.0)
        else:  # a step that raised did not happen; the instant it left is the fault's
            self._journal.emit(EventType.STEP_FAILED, step=self._step, start=self._start,
                               error=f"{exc_type.__name__}: {exc}"[:300], **self._waits.field())


class _CudaWatch(StepTimer):
    """Host clocks in a process that does not use CUDA (yet), looking for CUDA as each step begins:
    a script may move its model to the GPU after its first step (lazy initialisation, a warm-up
    step on the CPU, a library that initialises CUDA late). ``timing="auto"`` then switches to
    CUDA events; ``timing="host"`` stays, and says so once."""

    __slots__ = ("_hooks", "_timing", "_initialized")

    def __init__(self, hooks: Hooks, timing: str) -> None:
        super().__init__(hooks.journal, hooks._waits)
        self._hooks = hooks
        self._timing = timing
        self._initialized: Callable[[], bool] | None = None  # torch.cuda.is_initialized, once torch is imported

    def _reset(self, step: int) -> StepTimer | CudaStepTimer:  # type: ignore[override]
        initialized = self._initialized
        if initialized is None:
            initialized = self._initialized = cuda_timing.initialized_check()
        if initialized is not None and initialized():
            return self._hooks._choose(self._timing, step, late=True)._reset(step)
        self._step = step
        self._data.seconds = self._compute.seconds = self._optimizer.seconds = 0.0
        return self


class _Undecided:
    """The step timer until the first step, which picks the real one (``Hooks.start``'s ``timing``):
    a script usually starts the hooks before it moves its model to the GPU."""

    __slots__ = ("_hooks", "_timing")

    def __init__(self, hooks: Hooks, timing: str) -> None:
        self._hooks = hooks
        self._timing = timing

    def _reset(self, step: int) -> StepTimer | CudaStepTimer:
        return self._hooks._choose(self._timing, step)._reset(step)

    def settle(self) -> None:
        """No step yet: nothing to wait for."""

    def interrupted(self, why: str) -> None:
        """No step yet: nothing to journal."""


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
    def __init__(self, journal: Journal, waits: Waits, name: str) -> None:
        self._journal = journal
        self._waits = waits
        self._name = name
        self._start = 0.0
        self._before: dict[str, float] = {}

    def __enter__(self) -> None:
        self._before = self._waits.field()  # the waits before the span, in the stretch its record ends
        self._start = _monotonic()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._waits.take()  # waits inside the span are the span's time
        # the time was spent whether or not the block raised; the exception goes on to the caller
        self._journal.emit(EventType.USER_SPAN, name=self._name, start=self._start, **self._before)


TIMINGS = ("auto", "cuda", "host")  # Hooks.start's ``timing``


class Hooks:
    """One per rank process: owns the journal and hands out the timers."""

    def __init__(self, journal: Journal, events: Callable[[], DeviceEvent] | None = None) -> None:
        """``events`` makes new CUDA timing events that record themselves where their device works
        (a fake in tests): steps are then timed by them; without it, or with the journal disabled,
        by host clocks. ``Hooks.start`` is the way in for a training script."""
        self.journal = journal
        self._waits = Waits()
        self._pending: list[CheckpointSave] = []  # asynchronous saves not ended yet, oldest first
        self._step: StepTimer | CudaStepTimer | _Undecided = (
            StepTimer(journal, self._waits) if events is None or not journal.enabled
            else CudaStepTimer(journal, cuda_timing.event_seam(events), self._waits))
        self._wait = SaveWait(self._waits, self._pending, lambda: self._step)

    @classmethod
    def start(cls, world_size: int, journal_dir: str | None = None, *, timing: str = "auto") -> Hooks:
        """Open the journal (``journal_dir`` or ``$NVRX_SLO_JOURNAL_DIR``) and journal the start,
        with the pod's worker count and the restarts its launcher may make, as torchrun or srun
        say (``launch_env``). Its end is journaled at ``close``, or when the interpreter exits
        without it (an uncaught exception, with that exception): a job launched without our
        launcher is over when every process has ended.

        ``timing`` decides at the first step how steps are timed (most scripts start the hooks
        before they move the model to the GPU), and again at the first step after CUDA appears:

        * ``"auto"``: by CUDA events if the process uses CUDA (torch imported, CUDA initialised),
          else by host clocks until it does. It never imports torch itself.
        * ``"cuda"``: by CUDA events (imports torch); without CUDA, host clocks and a warning.
        * ``"host"``: by host clocks. In a process that uses CUDA they time kernel launches, not
          the work, and book queued work where the host waits for it (data wait, checkpoint
          blocking): one warning says so.

        Each choice is journaled (``step_timing``: the timer, the device, why). The events are
        recorded on the stream of the device the rank works on (``cuda_timing.pick_device``).
        ``ValueError`` for another ``timing`` (a mistake in the script, found at its start)."""
        if timing not in TIMINGS:
            raise ValueError(f"timing must be one of {', '.join(TIMINGS)}; got {timing!r}")
        hooks = cls(open_journal(journal_dir))
        # dated when the kernel started the process: its imports and set-up before the hooks are
        # its init too (a worker under torchrun or srun holds its accelerator from its start). Not
        # under our launcher, which dates its workers' start (``launcher_worker_start``, journaled just
        # after it spawned them) and its own from the kernel: a restart's phases are ordered by it.
        started = None if launch_env.ours(os.environ) else process_start_mono()
        hooks.journal.emit_first(EventType.PROCESS_START, _monotonic() if started is None else started,
                                 world_size=world_size, local_world_size=launch_env.local_world_size(os.environ),
                                 max_restarts=launch_env.max_restarts(os.environ))
        if hooks.journal.enabled:
            hooks._step = _Undecided(hooks, timing)
            atexit.register(hooks._exited, os.getpid())
        return hooks

    def _choose(self, timing: str, step: int, late: bool = False) -> StepTimer | CudaStepTimer:
        """The step timer ``timing`` picks at ``step`` (see ``start``), journaled; ``late``: CUDA
        appeared after the first step. Never raises into training."""
        timer = self._step = self._timer(timing, step, late)
        return timer

    def _timer(self, timing: str, step: int, late: bool) -> StepTimer | CudaStepTimer:
        cuda = cuda_timing.in_use()
        when = f"by step {step}" if late else "at the first step"
        if timing == "host" or (timing == "auto" and not cuda):
            if cuda:
                self._warn("timing='host' in a process that uses CUDA: steps are timed by host clocks, which "
                           "time kernel launches and book queued GPU work where the host waits for it (data "
                           "wait, checkpoint blocking); timing='auto' times them by CUDA events")
            self._timing(step, StepTimerKind.HOST, cuda, None, f"timing={timing!r}; CUDA "
                         + (f"in use {when}" if cuda else "not in use at the first step"))
            return StepTimer(self.journal, self._waits) if cuda else _CudaWatch(self, timing)
        try:
            device, warning = cuda_timing.cuda_device(launch_env.local_rank(os.environ))
        except Exception as exc:  # never raise into training
            self._warn(f"timing={timing!r}: {exc}; steps are timed by host clocks")
            self._timing(step, StepTimerKind.HOST, cuda, None, f"timing={timing!r}: {exc}")
            return StepTimer(self.journal, self._waits)
        if warning is not None:
            self._warn(warning)
        self._timing(step, StepTimerKind.CUDA, True, device.index,
                     f"timing={timing!r}; CUDA in use {when}" if cuda else f"timing={timing!r}")
        return CudaStepTimer(self.journal, device, self._waits)

    def _timing(self, step: int, timer: StepTimerKind, cuda: bool, device: int | None, reason: str) -> None:
        log.info("nvrx-slo: steps from %d timed by %s (%s)", step, timer.value, reason)
        self.journal.emit(EventType.STEP_TIMING, step=step, timer=timer.value, cuda=cuda, device=device,
                          reason=reason[:300])

    def _warn(self, message: str) -> None:
        log.warning("nvrx-slo: %s", message)
        self.warning(message)

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
        self.journal.emit(EventType.CHECKPOINT_START, ckpt=ckpt, step=step, mode=mode, **self._waits.field())
        return CheckpointSave(self.journal, self._waits, self._pending, ckpt, step)

    def checkpoint_wait(self) -> SaveWait:
        """``with hooks.checkpoint_wait():`` around each poll of an asynchronous save's writer
        between steps (NVRx's ``queue.maybe_finalize_async_calls(blocking=False)``, a wait on a
        previous save's future): checkpoint blocking, whatever its length, charged to the oldest
        save of this process still in flight (nothing is booked when none is). A save that ends
        inside the block (NVRx runs its finalize functions in the poll) is journaled at its end,
        with this wait counted. No record per poll: see ``nvrx_slo.trainer.saves``.

        While a save is in flight, entering it first waits for the GPU work the steps queued and
        books it to them (a poll that reads a device value waits for it anyway): the wait is the
        save's own cost. With none in flight it costs nothing. Nested waits book once."""
        return self._wait

    def checkpoint_queue(self, queue: Q) -> Q:
        """Hand over NVRx's ``AsyncCallsQueue`` once, and get it back: every poll and finalize of it
        (``maybe_finalize_async_calls``, also the one its ``close()`` makes) is then a
        ``checkpoint_wait()``, wrapped by hand or not. Observed through that public method, set on
        this queue object (the class is left alone); handing it over twice changes nothing."""
        try:
            observe_queue(queue, self.checkpoint_wait)
        except Exception as exc:  # never raise into training
            self._warn(f"cannot observe the checkpoint queue ({type(exc).__name__}: {exc}); wrap each of its "
                       "polls in checkpoint_wait()")
        return queue

    def span(self, name: str) -> _UserSpan:
        """``with hooks.span("eval"):`` around planned work that is not training (evaluation, an SDC
        check): its own category, ``user_span``, broken down by ``name``, instead of unattributed.
        Put it between steps, not inside one (a step's span already covers its time)."""
        self._step.settle()
        return _UserSpan(self.journal, self._waits, name)

    def checkpoint_worker(self, alive: bool, pid: int | None) -> None:
        """The background writer process of async saves was seen alive or dead (``pid`` if known)."""
        self.journal.emit(EventType.CHECKPOINT_WORKER, alive=alive, worker_pid=pid)

    def warning(self, message: str, **fields: Any) -> None:
        """Something the operator should know (a fallback restore, a missing NVRx feature)."""
        self.journal.emit(EventType.WARNING, message=message, **fields)

    def interrupted(self) -> None:
        """A fault left the loop outside a step (the in-process Wrapper's ``finalize`` calls it, and
        the process's exit): journal now, without waiting for the GPU, every step whose GPU work is
        done, with its own times (a step still running on the GPU: with host clocks)."""
        self._step.interrupted("the loop was interrupted outside a step")

    def fault_injected(self, kind: str, step: int) -> None:
        """The reference job is about to inject a fault (tests and demos only)."""
        self._step.settle()
        self.journal.emit(EventType.FAULT_INJECTED, kind=kind, step=step, **self._waits.field())

    def close(self) -> None:
        """Clean exit of this rank process."""
        atexit.unregister(self._exited)
        self._step.settle()
        self.journal.emit(EventType.PROCESS_END, **self._waits.field())
        self.journal.close()

    def _exited(self, pid: int) -> None:
        """The interpreter exits without ``close`` (registered by ``start``): journal the end,
        with the uncaught exception it exits with, if any (Python keeps it for us as
        ``sys.last_value``). Not in a forked child (``pid``: the process that started the hooks).
        After an exception, without waiting on the device (it may be what failed): the steps whose
        GPU work is done are journaled with their own times (``interrupted``), then the end."""
        if os.getpid() != pid:
            return
        exc = getattr(sys, "last_value", None)
        if exc is None:
            self.close()
            return
        self.interrupted()
        self.journal.emit(EventType.PROCESS_END, error=f"{type(exc).__name__}: {exc}"[:300], **self._waits.field())
        self.journal.close()
