"""CUDA step timing (``Hooks(journal, events)``), driven by a fake GPU: one stream on the host's clock.

The fake is the seam ``cuda_timing.DeviceEvent``: kernels queue behind each other, an event completes
when the stream reaches it, and ``elapsed_time`` raises for an event not yet reached, as CUDA does.
Host and GPU share a virtual clock (``CLOCK``, patched into the journal, the hooks and the CUDA
timer): sleeping advances it, so the numbers are exact on any machine, however loaded. What the
fake cannot tell is what a real GPU costs (see the README, "What is not tested here").
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.decode import as_event
from nvrx_slo.trainer import cuda_timing, journal
from nvrx_slo.trainer import hooks as hooks_module
from nvrx_slo.trainer.cuda_timing import MAX_PENDING
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import open_journal


class VirtualClock:
    """The host's monotonic clock in these tests: it moves as much as the test sleeps, and 1 µs per
    reading (as a real one does between two calls, so no two records share an instant)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1e-6
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


CLOCK = VirtualClock()


@pytest.fixture(autouse=True)
def _virtual_time(monkeypatch: pytest.MonkeyPatch) -> None:
    CLOCK.t = time.monotonic()  # after the process's start, which the journal reads from the kernel
    for module in (journal, hooks_module, cuda_timing):
        monkeypatch.setattr(module, "_monotonic", CLOCK)


def _sleep_until(instant: float) -> None:
    CLOCK.sleep(max(0.0, instant - CLOCK()))


class FakeGpu:
    """One CUDA stream on the host's monotonic clock; ``calls`` lists what the hooks asked of its events."""

    def __init__(self) -> None:
        self.tail = 0.0  # when the stream finishes what is queued
        self.calls: list[str] = []
        self.broken: str | None = None  # an event method that raises, like a sticky CUDA error

    def run(self, seconds: float) -> None:
        """A kernel launch: returns at once, the work queues behind the stream's."""
        self.tail = max(self.tail, CLOCK()) + seconds

    def synchronize(self) -> None:
        """What a staging copy, an H2D copy or ``.item()`` does: the host waits for the stream."""
        _sleep_until(self.tail)

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.at: float | None = None  # when the stream reaches it

    def _call(self, name: str) -> None:
        self.gpu.calls.append(name)
        if self.gpu.broken == name:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def _done(self) -> bool:
        assert self.at is not None, "never recorded"
        return CLOCK() >= self.at

    def record(self) -> None:
        self._call("record")
        self.at = max(self.gpu.tail, CLOCK())

    def query(self) -> bool:
        self._call("query")
        return self._done()

    def synchronize(self) -> None:
        self._call("synchronize")
        assert self.at is not None
        _sleep_until(self.at)

    def elapsed_time(self, end_event: FakeEvent) -> float:
        self._call("elapsed_time")
        if not (self._done() and end_event._done()):
            raise RuntimeError("CUDA error: device not ready")
        assert self.at is not None and end_event.at is not None
        return (end_event.at - self.at) * 1000.0


def _records(directory):
    return [schema.decode(line) for path in sorted(directory.iterdir()) for line in path.read_bytes().splitlines()]


def _steps(directory):
    return [r for r in _records(directory) if r["type"] == "step"]


def _run_step(hooks: Hooks, gpu: FakeGpu, step: int, *, load: float = 0.0, compute: float = 0.0,
              optimizer: float = 0.0) -> None:
    with hooks.step(step) as s:
        with s.data():
            CLOCK.sleep(load)
        with s.compute():
            gpu.run(compute)
        with s.optimizer():
            gpu.run(optimizer)


@pytest.mark.parametrize("timed_by", ["gpu", "host"])
def test_compute_the_gpu_runs_after_the_host_left_is_compute_not_checkpoint_blocking(tmp_path, timed_by):
    """The host-clock timer is the contrast: the same loop books the queued compute to the save."""
    gpu = FakeGpu()
    hooks = Hooks(open_journal(str(tmp_path)), gpu.event if timed_by == "gpu" else None)
    hooks.journal.emit(schema.EventType.PROCESS_START, world_size=1)
    _run_step(hooks, gpu, 1, load=0.02, compute=0.2, optimizer=0.03)
    with hooks.checkpoint(1):
        gpu.synchronize()  # the staging copy queues behind the step's work
    hooks.close()
    records = _records(tmp_path)
    (step,) = [r for r in records if r["type"] == "step"]
    (scheduled,) = [r for r in records if r["type"] == "checkpoint_scheduled"]
    seconds = _accounted(tmp_path)
    if timed_by == "host":
        assert step["compute_s"] < 0.05 and scheduled["stage_s"] >= 0.2
        assert seconds[Category.CHECKPOINT_BLOCKING] >= 0.2
        return
    assert 0.2 <= step["compute_s"] < 0.25 and 0.03 <= step["optimizer_s"] < 0.06 and 0.02 <= step["data_s"] < 0.05
    assert step["mono"] - step["start"] >= 0.25  # the step ends when its GPU work did
    assert scheduled["stage_s"] < 0.05 and seconds[Category.CHECKPOINT_BLOCKING] < 0.05
    assert seconds[Category.PRODUCTIVE] >= 0.23 and 0.02 <= seconds[Category.DATA_WAIT] < 0.05


def _accounted(directory):
    engine = Engine(reorder_window_s=0.0)
    for record in _records(directory):
        engine.ingest(as_event(record))
    return engine.snapshot(CLOCK(), time.time()).ranks[0].seconds


def test_the_next_steps_data_phase_is_the_gpus_wait_not_the_previous_compute(tmp_path):
    gpu = FakeGpu()
    hooks = Hooks(open_journal(str(tmp_path)), gpu.event)
    hooks.journal.emit(schema.EventType.PROCESS_START, world_size=1)
    _run_step(hooks, gpu, 1, compute=0.15)
    with hooks.step(2) as s:
        with s.data():
            gpu.synchronize()  # an H2D copy of the batch waits for the queued compute ...
            CLOCK.sleep(0.03)  # ... then the loader takes a while: the GPU waits for it
        with s.compute():
            gpu.run(0.01)
    hooks.close()
    first, second = _steps(tmp_path)
    assert 0.15 <= first["compute_s"] < 0.2 and 0.01 <= second["compute_s"] < 0.03
    # step 1 was seen finished at step 2's data exit: its record's span holds the GPU's wait for
    # step 2's batch, and books it as data (host clocks would book 0.18 s of data to step 2)
    assert 0.03 <= first["data_s"] + second["data_s"] < 0.06
    assert first["mono"] <= second["start"] < second["mono"]
    assert 0.03 <= _accounted(tmp_path)[Category.DATA_WAIT] < 0.06


def test_steps_are_journaled_in_order_once_their_gpu_work_is_done_without_blocking(tmp_path):
    gpu = FakeGpu()
    hooks = Hooks(open_journal(str(tmp_path)), gpu.event)
    written = []
    for step in range(6):
        _run_step(hooks, gpu, step, load=0.03, compute=0.02)  # the host is the slower: the GPU keeps up
        written.append(len(_steps(tmp_path)))
    assert "synchronize" not in gpu.calls  # the hot path only queries
    assert written[-1] >= 4  # journaled while training, not at close
    hooks.close()
    steps = _steps(tmp_path)
    assert [r["step"] for r in steps] == list(range(6))
    assert all(0.02 <= r["compute_s"] < 0.04 for r in steps)
    # the GPU waited 0.03 s for the first batch, then 0.01 s for each (it ran 0.02 of the host's 0.03)
    assert 0.075 <= sum(r["data_s"] for r in steps) < 0.12
    assert all(a["mono"] <= b["start"] for a, b in zip(steps, steps[1:], strict=False))  # spans never overlap
    assert all(r["data_s"] + r["compute_s"] + r["optimizer_s"] <= r["mono"] - r["start"] + 2e-6 for r in steps)


def test_the_host_leads_the_gpu_by_at_most_max_pending_steps(tmp_path):
    gpu = FakeGpu()
    hooks = Hooks(open_journal(str(tmp_path)), gpu.event)
    for step in range(MAX_PENDING + 2):
        _run_step(hooks, gpu, step, compute=0.05)  # the GPU is the slower: the host runs ahead
        assert len(_steps(tmp_path)) >= step + 1 - MAX_PENDING
    assert gpu.calls.count("synchronize") == 2  # the fence, once for each step beyond the bound
    assert CLOCK() >= gpu.tail - MAX_PENDING * 0.05 - 0.01  # waited for the oldest
    hooks.close()
    steps = _steps(tmp_path)
    assert [r["step"] for r in steps] == list(range(MAX_PENDING + 2))
    assert all(0.045 <= r["compute_s"] < 0.08 for r in steps)


def test_close_journals_the_waiting_steps_before_the_end(tmp_path):
    gpu = FakeGpu()
    hooks = Hooks(open_journal(str(tmp_path)), gpu.event)
    _run_step(hooks, gpu, 7, compute=0.1)
    assert _steps(tmp_path) == []
    hooks.close()
    step, end = _records(tmp_path)
    assert (step["type"], step["step"], end["type"]) == ("step", 7, "process_end")
    assert 0.1 <= step["compute_s"] < 0.15 and step["mono"] <= end["mono"]


def test_a_step_that_raises_journals_the_waiting_steps_without_waiting_for_the_gpu(tmp_path):
    gpu = FakeGpu()
    hooks = Hooks(open_journal(str(tmp_path)), gpu.event)
    _run_step(hooks, gpu, 1, compute=0.02)
    _run_step(hooks, gpu, 2, compute=1.0)  # still running when step 3 fails
    raised = None
    with pytest.raises(RuntimeError, match="NCCL timeout"):
        with hooks.step(3) as s:
            with s.data():
                CLOCK.sleep(0.05)  # step 1's work finishes meanwhile
            raised = CLOCK()
            raise RuntimeError("NCCL timeout")
    assert CLOCK() - raised < 0.2 and "synchronize" not in gpu.calls
    first, warning, second, failed = _records(tmp_path)
    assert first["step"] == 1 and 0.02 <= first["compute_s"] < 0.05  # seen finished: timed by the GPU
    assert second["step"] == 2 and second["compute_s"] < 0.01  # not seen finished: host clocks
    assert warning["type"] == "warning" and "[2]" in warning["message"] and "step 3 failed" in warning["message"]
    assert (failed["type"], failed["step"]) == ("step_failed", 3)


@pytest.mark.parametrize("method", ["query", "record", "elapsed_time", "synchronize"])
def test_a_cuda_error_switches_to_host_clocks_with_one_warning_and_loses_no_step(tmp_path, method):
    gpu = FakeGpu()
    hooks = Hooks(open_journal(str(tmp_path)), gpu.event)
    _run_step(hooks, gpu, 0, load=0.01, compute=0.01)
    gpu.broken = method
    for step in range(1, 5):
        _run_step(hooks, gpu, step, load=0.01, compute=0.01)
    hooks.close()
    records = _records(tmp_path)
    assert [r["step"] for r in records if r["type"] == "step"] == list(range(5))
    warnings = [r for r in records if r["type"] == "warning"]
    assert len(warnings) == 1 and "host clocks" in warnings[0]["message"] and "illegal memory" in warnings[0]["message"]
    host_timed = [r for r in records[records.index(warnings[0]):] if r["type"] == "step"]
    assert host_timed and all(r["data_s"] >= 0.01 for r in host_timed)
    calls = len(gpu.calls)
    _run_step(hooks, gpu, 5)
    assert len(gpu.calls) == calls  # CUDA is left alone from then on


def test_with_the_journal_disabled_no_event_is_recorded():
    gpu = FakeGpu()
    hooks = Hooks(open_journal(None), gpu.event)
    _run_step(hooks, gpu, 0, compute=0.01)
    hooks.close()
    assert gpu.calls == []


def test_cuda_timing_without_cuda_says_so_and_times_steps_by_host_clocks(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path), cuda_timing=True)
    with hooks.step(0) as s:
        with s.compute():
            CLOCK.sleep(0.02)
    assert [r["type"] for r in _records(tmp_path)] == ["process_start", "warning", "step"]  # written at its exit
    hooks.close()
    warning, step = _records(tmp_path)[1:3]
    assert "CUDA is not available" in warning["message"] and step["compute_s"] >= 0.02


def test_the_hooks_import_no_torch():
    code = "import sys, nvrx_slo.trainer.hooks; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
