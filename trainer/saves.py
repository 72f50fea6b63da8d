"""A save as the training loop sees it (``Hooks.checkpoint``), and the loop's waits on saves between steps.

A save blocks the loop twice: in its block (``checkpoint_start`` → ``checkpoint_scheduled``), and
later, between steps, while the loop polls the writer to finish it (NVRx's
``maybe_finalize_async_calls``: the gather of write results, the metadata write, the ranks'
agreement). The second part comes as many short waits — on a GPU about a hundred polls under 1 ms
per save — so each wait is booked without a record of its own, whatever its length:

* to the rank's time: ``Waits`` sums them, and the next record the loop writes (a step, a save's
  start, a user span, a fault, the process's end) carries the sum as ``blocked_s``: the engine
  books that much of the stretch since the rank's previous record as ``checkpoint_blocking``
  (``docs/accounting.md``), so the categories still tile the rank's wall;
* to the save: its ``checkpoint_end`` carries the waits charged to it as ``waited_s`` (its
  blocking after its block), which is why an end arriving during a wait is written when the wait
  is over (``CheckpointSave._hold``).

``SaveWait`` is ``Hooks.checkpoint_wait()`` (reentrant; with a save in flight it first settles the
steps' GPU work), and ``observe_queue`` makes every poll of a handed-over NVRx queue one.

Every method is safe from any thread and never raises into training.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer.journal import Journal

_monotonic = time.monotonic


class Waits:
    """The loop's waits on saves that no record has carried yet (see the module docstring)."""

    __slots__ = ("seconds", "blocks", "_lock")

    def __init__(self) -> None:
        self.seconds = 0.0
        self.blocks = 0  # save blocks under way (``CheckpointSave``): a wait inside one is the block's
        self._lock = threading.Lock()

    def add(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def take(self) -> float:
        """The sum so far, now carried by the caller's record (the hot path reads without the lock)."""
        if not self.seconds:
            return 0.0
        with self._lock:
            seconds, self.seconds = self.seconds, 0.0
        return seconds

    def field(self) -> dict[str, float]:
        """``take()`` as the optional ``blocked_s`` field of the record the loop writes now."""
        seconds = self.take()
        return {"blocked_s": seconds} if seconds > 0.0 else {}


class CheckpointSave:
    """One save as the training loop sees it; ``with hooks.checkpoint(step) as save:`` around the call.

    The block is the time the loop is blocked (``checkpoint_start`` → ``checkpoint_scheduled``). The
    save is durable (``checkpoint_end``) when the block ends, unless it is asynchronous: then
    ``track`` its future, or hand ``completion()`` to whatever calls back when the write is done.
    """

    __slots__ = ("_journal", "_waits", "_pending", "ckpt", "step", "bytes", "_lock", "_start", "_planned",
                 "_asynchronous", "_scheduled", "_outcome", "_ended", "_waited", "_holds")

    def __init__(self, journal: Journal, waits: Waits, pending: list[CheckpointSave], ckpt: str, step: int) -> None:
        """``pending``: the hooks' asynchronous saves not ended yet, oldest first (this one joins it
        when its block ends unfinished)."""
        self._journal = journal
        self._waits = waits
        self._pending = pending
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
        self._waited = 0.0  # the loop's waits on this save after its block
        self._holds = 0  # waits under way: the end is written after them

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
        """The loop spent ``since`` (``time.monotonic()``) to now waiting on this save after its
        block, between steps (a poll of its writer, the metadata write, the ranks' agreement):
        checkpoint cost, however short. ``Hooks.checkpoint_wait()`` calls it for the oldest save
        in flight; a wait after the save's end counts to the rank's time, not to the save."""
        seconds = _monotonic() - since
        if seconds <= 0.0:
            return
        self._waits.add(seconds)
        with self._lock:
            if not self._ended:
                self._waited += seconds

    def failed(self, error: BaseException | str) -> None:
        """The save failed; ``error`` says why."""
        reason = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        self._settle(reason[:500])

    def _hold(self) -> None:
        with self._lock:
            self._holds += 1

    def _release(self) -> None:
        with self._lock:
            self._holds -= 1
        self._end()

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
        self._end()

    def _end(self) -> None:
        """Write the end once its outcome is known, the block is over and no wait on it is under way."""
        with self._lock:
            if self._ended or self._outcome is None or not self._scheduled or self._holds:
                return
            self._ended = True
            written, error = self._outcome
            waited = self._waited
        try:
            self._pending.remove(self)
        except ValueError:  # a synchronous save, or one that ended in its block
            pass
        self._journal.emit(EventType.CHECKPOINT_END, ckpt=self.ckpt, step=self.step, ok=error is None,
                           written=written, error=error, **({"waited_s": waited} if waited > 0.0 else {}))

    def __enter__(self) -> CheckpointSave:
        self._waits.blocks += 1
        self._start = _monotonic()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._waits.blocks -= 1
        self._waits.take()  # waits inside the block are the block's: it is blocking already
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
            if self._outcome is None:
                self._pending.append(self)
        self._end()  # an outcome that came in during the block is written after its scheduled


class CheckpointWait:
    """``with hooks.checkpoint_wait():`` around a poll of the checkpoint writer (see ``Hooks.checkpoint_wait``)."""

    __slots__ = ("_pending", "_save", "_start")

    def __init__(self, pending: list[CheckpointSave]) -> None:
        self._pending = pending
        self._save: CheckpointSave | None = None
        self._start = 0.0

    def __enter__(self) -> None:
        try:
            self._save = self._pending[0]
        except IndexError:  # no save in flight: nothing to wait for, nothing booked
            self._save = None
            return
        self._save._hold()
        self._start = _monotonic()

    def __exit__(self, *exc: object) -> None:
        save = self._save
        if save is not None:
            save.waited(self._start)
            save._release()


class StepTimerLike(Protocol):
    """What a wait asks of the hooks' step timer."""

    def settle(self) -> None: ...

    def interrupted(self, why: str) -> None: ...


class SaveWait:
    """``Hooks.checkpoint_wait()``: one per hooks, reentrant. Only the outermost wait books (a poll
    of a handed-over queue inside the user's own ``checkpoint_wait()``), and none inside a save's
    block, which is blocking already (NVRx's drain of its writer before a new save's staging).
    ``timer`` gives the hooks' step timer now: with a save in flight, a wait first settles the
    steps' GPU work (a poll that reads a device value waits for it anyway, and it is theirs)."""

    __slots__ = ("_waits", "_pending", "_timer", "_depth", "_wait")

    def __init__(self, waits: Waits, pending: list[CheckpointSave], timer: Callable[[], StepTimerLike]) -> None:
        self._waits = waits
        self._pending = pending
        self._timer = timer
        self._depth = 0
        self._wait: CheckpointWait | None = None

    def __enter__(self) -> None:
        self._depth += 1
        if self._depth > 1 or self._waits.blocks:
            return
        if self._pending:
            self._timer().settle()
        self._wait = CheckpointWait(self._pending)
        self._wait.__enter__()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._depth -= 1
        if self._depth:
            return
        wait, self._wait = self._wait, None
        if wait is not None:
            wait.__exit__(exc_type, exc, tb)
        if exc_type is not None:
            self._timer().interrupted(f"a wait on a save raised {exc_type.__name__}")


def observe_queue(queue: Any, wait: Callable[[], SaveWait]) -> None:
    """Set on ``queue`` (NVRx's ``AsyncCallsQueue``) a ``maybe_finalize_async_calls`` that runs its
    own inside ``wait()``; once (a queue observed already is left as it is). Raises what the queue
    raised (no such method)."""
    poll = queue.maybe_finalize_async_calls
    if getattr(poll, "nvrx_slo_observed", False):
        return
    # a weak reference to the bound method: the queue's __del__ (NVRx closes it there) still runs
    method: Callable[[], Any] = weakref.WeakMethod(poll) if inspect.ismethod(poll) else (lambda: poll)

    @functools.wraps(poll)
    def observed(*args: Any, **kwargs: Any) -> Any:
        with wait():
            return method()(*args, **kwargs)

    observed.nvrx_slo_observed = True  # type: ignore[attr-defined]
    queue.maybe_finalize_async_calls = observed
