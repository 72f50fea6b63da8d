"""A simulated CUDA device: a fake ``torch`` whose ``torch.cuda`` runs its streams on the host clock.

What a GPU does that no CPU test shows: **work is queued.** A kernel launch returns at once and its
work runs later on its stream; whatever reads a device value (``.item()``, a host copy, NVRx's poll,
which all-reduces a flag tensor and reads it) waits first for everything queued before it. Steps
timed on a GPU are only right if the tests plant such queued work, so this module lets them:

* ``SimCuda`` is the fake ``torch.cuda`` the hooks reach through ``sys.modules["torch"]`` (``install``),
  as they reach the real one: ``is_available``, ``is_initialized`` (False until CUDA is first used,
  as torch's lazy initialisation has it, so a test can flip it mid-run), ``device_count``,
  ``current_device``/``set_device``, ``current_stream(device)``, ``Event(enable_timing=True)``,
  ``synchronize``. Two or more devices, one stream each.
* An event completes when its stream reaches it; ``elapsed_time`` raises for one not reached or of
  another device, and recording an event on a stream of another device than its first raises, as
  CUDA does.
* ``run`` launches planted work on the current stream (of the current device, or a named one), and
  ``item`` reads a device value: the host waits for the stream.
* ``SimQueue`` is NVRx's ``AsyncCallsQueue`` as the device sees it (its public methods): a poll
  with calls in flight costs its own time and first drains the current device's stream (NVRx's
  ``sync_all_async_calls`` reads an all-reduced CUDA tensor); a poll that finds the write done runs
  the finalize functions (more device work, then their own time). With nothing in flight a poll is
  free, as NVRx's is.

Host and device share one clock (``virtual_clock.CLOCK`` in the tests: sleeping advances it, so the
figures are exact on any machine; the real monotonic clock for ``bench/bench_hooks.py``). What the
simulation cannot tell is what a real GPU costs: ``bench/gpu_check.py`` on a GPU.
"""

from __future__ import annotations

import sys
import time
import types
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

C = TypeVar("C", "SimCuda", "FreeCuda")


class Clock(Protocol):
    def __call__(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """The host's own monotonic clock, for the benchmark."""

    __call__ = staticmethod(time.monotonic)
    sleep = staticmethod(time.sleep)


class SimStream:
    """One device's stream: ``tail`` is when the work queued on it is done."""

    def __init__(self, cuda: SimCuda, device: int) -> None:
        self.cuda = cuda
        self.device_index = device
        self.tail = 0.0

    def launch(self, seconds: float) -> None:
        """A kernel: returns at once; its work queues behind the stream's."""
        self.tail = max(self.tail, self.cuda.clock()) + seconds

    def synchronize(self) -> None:
        self.cuda.calls["synchronize"] += 1
        clock = self.cuda.clock
        clock.sleep(max(0.0, self.tail - clock()))


class SimEvent:
    """``torch.cuda.Event``: bound to the device of the first stream it is recorded on."""

    def __init__(self, cuda: SimCuda, enable_timing: bool = False) -> None:
        self.cuda = cuda
        self.timing = enable_timing
        self.device: int | None = None
        self.at: float | None = None  # when its stream reaches it

    def record(self, stream: SimStream | None = None) -> None:
        cuda = self.cuda
        cuda.calls["record"] += 1
        cuda.fail("record")
        stream = stream or cuda.current_stream()
        if self.device is None:
            self.device = stream.device_index
        elif self.device != stream.device_index:
            raise RuntimeError(f"Event device index {self.device} does not match recording stream's device "
                               f"{stream.device_index}")
        self.at = max(stream.tail, cuda.clock())

    def _done(self) -> bool:
        return self.at is not None and self.cuda.clock() >= self.at

    def query(self) -> bool:
        self.cuda.calls["query"] += 1
        self.cuda.fail("query")
        return self.at is None or self._done()

    def synchronize(self) -> None:
        cuda = self.cuda
        cuda.calls["synchronize"] += 1
        cuda.fail("synchronize")
        if self.at is not None:
            cuda.clock.sleep(max(0.0, self.at - cuda.clock()))

    def elapsed_time(self, end: SimEvent) -> float:
        self.cuda.calls["elapsed_time"] += 1
        self.cuda.fail("elapsed_time")
        if not (self.timing and end.timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self.device != end.device:
            raise RuntimeError("Both events must be recorded on the same device")
        if not (self._done() and end._done()):
            raise RuntimeError("CUDA error: device not ready")
        assert self.at is not None and end.at is not None
        return (end.at - self.at) * 1000.0


class SimCuda:
    """The fake ``torch.cuda``; ``calls`` counts what was asked of it (events and synchronisations)."""

    def __init__(self, clock: Clock, devices: int = 1) -> None:
        self.clock = clock
        self.initialized = False
        self.device = 0
        self.streams = [SimStream(self, d) for d in range(devices)]
        self.calls: Counter[str] = Counter()
        self.broken: str | None = None  # an event method that raises, like a sticky CUDA error

    # --- what torch.cuda offers ----------------------------------------------------------------

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.streams)

    def current_device(self) -> int:
        self.initialized = True  # torch's lazy initialisation
        return self.device

    def set_device(self, device: int) -> None:
        self.initialized = True
        self.device = device

    def current_stream(self, device: int | None = None) -> SimStream:
        self.calls["current_stream"] += 1
        return self._stream(device)

    def Event(self, enable_timing: bool = False) -> SimEvent:  # torch.cuda.Event: a class there
        return SimEvent(self, enable_timing)

    def synchronize(self, device: int | None = None) -> None:
        self._stream(device).synchronize()

    # --- what a training step does to it ---------------------------------------------------------

    def run(self, seconds: float, device: int | None = None) -> None:
        """Launch ``seconds`` of work on the current stream (of ``device``, default the current one)."""
        self._stream(device).launch(seconds)

    def item(self, device: int | None = None) -> None:
        """Read a device value (``.item()``, a host copy): the host waits for the stream."""
        self._stream(device).synchronize()

    def _stream(self, device: int | None) -> SimStream:
        self.initialized = True  # torch's lazy initialisation
        return self.streams[self.device if device is None else device]

    def fail(self, method: str) -> None:
        if self.broken == method:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")


def fake_torch(cuda: SimCuda | FreeCuda) -> types.ModuleType:
    """A ``torch`` module holding only ``cuda``: what the hooks look for in ``sys.modules``."""
    module = types.ModuleType("torch")
    module.cuda = cuda  # type: ignore[attr-defined]
    return module


@contextmanager
def installed(cuda: C) -> Iterator[C]:
    """``cuda`` as ``sys.modules["torch"].cuda`` for the block (the hooks never hold torch across calls)."""
    saved = sys.modules.get("torch")
    sys.modules["torch"] = fake_torch(cuda)
    try:
        yield cuda
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved


class SimQueue:
    """NVRx's ``AsyncCallsQueue`` as the simulated device sees it (its public methods only).

    ``poll_s``: a poll's own host time (looking at the writer, the all-reduce's host side);
    ``finalize_s``: the finalize functions' own time (gather, metadata write, broadcast), after
    ``finalize_gpu_s`` of their device work; ``write_s``: how long a write runs in the background.
    ``own`` sums what the polls cost themselves, from the end of each one's drain of the steps'
    queued work: the ground truth of the saves' blocking after their blocks.
    """

    def __init__(self, cuda: SimCuda, *, poll_s: float, finalize_s: float = 0.0, finalize_gpu_s: float = 0.0,
                 write_s: float) -> None:
        self.cuda = cuda
        self.poll_s, self.finalize_s, self.finalize_gpu_s, self.write_s = poll_s, finalize_s, finalize_gpu_s, write_s
        self.async_calls: list[tuple[int, float, list[Callable[[], Any]]]] = []  # (index, written at, finalize fns)
        self.call_idx = -1
        self.own = 0.0
        self.polls = 0

    def schedule_async_request(self, request: Any) -> int:
        self.call_idx += 1
        self.async_calls.append((self.call_idx, self.cuda.clock() + self.write_s, list(request.finalize_fns)))
        return self.call_idx

    def maybe_finalize_async_calls(self, blocking: bool = False, no_dist: bool = False) -> list[int]:
        finalized: list[int] = []
        cuda, clock = self.cuda, self.cuda.clock
        while self.async_calls:
            self.polls += 1
            cuda.item()  # the flag tensor's all-reduce, read on the host: the queue drains first
            started = clock()  # from here on, the poll's own time
            if blocking:
                clock.sleep(max(0.0, self.async_calls[0][1] - clock()))
            clock.sleep(self.poll_s)
            if clock() < self.async_calls[0][1]:
                self.own += clock() - started
                break
            index, _, finalize_fns = self.async_calls.pop(0)
            cuda.run(self.finalize_gpu_s)
            cuda.item()  # the finalize's collectives read device values too: its own work only, now
            clock.sleep(self.finalize_s)
            for fn in finalize_fns:
                fn()
            self.own += clock() - started
            finalized.append(index)
        return finalized

    def get_num_unfinalized_calls(self) -> int:
        return len(self.async_calls)

    def close(self) -> None:
        self.maybe_finalize_async_calls(blocking=True)


class _FreeEvent:
    __slots__ = ()

    def record(self, stream: object = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: object) -> float:
        return 0.0


class FreeCuda:
    """The simulated device with nothing simulated: one GPU, CUDA initialised, every method returns at
    once (events done when recorded). ``bench/bench_hooks.py`` times the hooks over it: their own
    Python, not a GPU's, which ``bench/gpu_check.py`` measures on one."""

    _stream = object()

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def current_stream(self, device: int | None = None) -> object:
        return self._stream

    def Event(self, enable_timing: bool = False) -> _FreeEvent:  # torch.cuda.Event: a class there
        return _FreeEvent()
