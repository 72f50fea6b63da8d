"""CUDA step timing (``Hooks(journal, events)``, and what ``Hooks.start``'s ``timing`` picks), driven
by a fake GPU (``fake_gpu.py``): one stream on a virtual host clock, so the numbers are exact on any
machine. What the fake cannot tell is what a real GPU costs (``bench/gpu_check.py``, docs/gpu.md).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from fake_gpu import FakeGpu, accounted, read_records
from nvrx_slo.contracts import schema
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.trainer import cuda_timing
from nvrx_slo.trainer.cuda_timing import MAX_PENDING
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import open_journal
from virtual_clock import CLOCK

pytestmark = pytest.mark.usefixtures("virtual_time")


def _steps(directory):
    return [r for r in read_records(directory) if r["type"] == "step"]


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
    records = read_records(tmp_path)
    (step,) = [r for r in records if r["type"] == "step"]
    (scheduled,) = [r for r in records if r["type"] == "checkpoint_scheduled"]
    seconds = accounted(tmp_path)
    if timed_by == "host":
        assert step["compute_s"] < 0.05 and scheduled["stage_s"] >= 0.2
        assert seconds[Category.CHECKPOINT_BLOCKING] >= 0.2
        return
    assert 0.2 <= step["compute_s"] < 0.25 and 0.03 <= step["optimizer_s"] < 0.06 and 0.02 <= step["data_s"] < 0.05
    assert step["mono"] - step["start"] >= 0.25  # the step ends when its GPU work did
    assert scheduled["stage_s"] < 0.05 and seconds[Category.CHECKPOINT_BLOCKING] < 0.05
    assert seconds[Category.PRODUCTIVE] >= 0.23 and 0.02 <= seconds[Category.DATA_WAIT] < 0.05


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
    assert 0.03 <= accounted(tmp_path)[Category.DATA_WAIT] < 0.06


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
    step, end = read_records(tmp_path)
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
    first, warning, second, failed = read_records(tmp_path)
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
    records = read_records(tmp_path)
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


# --- what Hooks.start's timing picks, at the first step -------------------------------------------


@pytest.fixture
def cuda_in_use(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    """A process that uses CUDA, as ``cuda_timing`` sees one: its check says so, its events are the fake's."""
    gpu = FakeGpu()
    monkeypatch.setattr(cuda_timing, "in_use", lambda: True)
    monkeypatch.setattr(cuda_timing, "cuda_device", lambda local_rank: (cuda_timing.event_seam(gpu.event), None))
    return gpu


def test_by_default_a_process_that_uses_cuda_times_its_steps_by_cuda_events(tmp_path, cuda_in_use):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path))  # the README's first line, as written
    _run_step(hooks, cuda_in_use, 0, load=0.008, compute=0.012, optimizer=0.004)
    _run_step(hooks, cuda_in_use, 1)  # its data phase waits for step 0's queued work (an H2D copy)
    hooks.close()
    first = _steps(tmp_path)[0]
    assert "record" in cuda_in_use.calls and "warning" not in [r["type"] for r in read_records(tmp_path)]
    assert 0.012 <= first["compute_s"] < 0.013 and 0.004 <= first["optimizer_s"] < 0.005


@pytest.mark.parametrize("timing", ["auto", "host"])
def test_a_process_without_cuda_times_its_steps_by_host_clocks_without_a_warning(tmp_path, timing):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path), timing=timing)
    with hooks.step(0) as s:
        with s.compute():
            CLOCK.sleep(0.02)
    records = read_records(tmp_path)
    assert [r["type"] for r in records] == ["process_start", "step_timing", "step"]  # written at its exit
    assert (records[1]["timer"], records[1]["cuda"], records[1]["device"]) == ("host", False, None)
    assert records[2]["compute_s"] >= 0.02


def test_host_timing_in_a_process_that_uses_cuda_warns_once_in_the_journal_and_the_log(tmp_path, cuda_in_use,
                                                                                         caplog):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path), timing="host")
    for step in range(3):
        _run_step(hooks, cuda_in_use, step, compute=0.01)
    hooks.close()
    warnings = [r for r in read_records(tmp_path) if r["type"] == "warning"]
    logged = [r for r in caplog.records if "timing='host'" in r.getMessage()]
    assert len(warnings) == 1 and len(logged) == 1 and "kernel launches" in warnings[0]["message"]
    assert cuda_in_use.calls == [] and len(_steps(tmp_path)) == 3


def test_cuda_timing_without_cuda_says_so_and_times_steps_by_host_clocks(tmp_path, monkeypatch):
    monkeypatch.setattr(cuda_timing, "in_use", lambda: False)
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path), timing="cuda")
    with hooks.step(0) as s:
        with s.compute():
            CLOCK.sleep(0.02)
    hooks.close()
    start, warning, timing, step, _ = read_records(tmp_path)
    assert warning["type"] == "warning" and "timing='cuda'" in warning["message"] and step["compute_s"] >= 0.02
    assert (timing["type"], timing["timer"], timing["step"]) == ("step_timing", "host", 0)
    if "torch" in sys.modules and not sys.modules["torch"].cuda.is_available():
        assert "CUDA is not available" in warning["message"]


def test_a_timing_that_does_not_exist_fails_at_start(tmp_path):
    with pytest.raises(ValueError, match="auto, cuda, host"):
        Hooks.start(world_size=1, journal_dir=str(tmp_path), timing="gpu")


def test_in_use_is_torchs_own_check_and_false_without_torch(monkeypatch):
    class Cuda:
        initialised = False

        def is_initialized(self) -> bool:
            return self.initialised

    fake = type("torch", (), {"cuda": Cuda()})
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert not cuda_timing.in_use()
    fake.cuda.initialised = True
    assert cuda_timing.in_use()
    monkeypatch.delitem(sys.modules, "torch")
    assert not cuda_timing.in_use()


def test_the_hooks_import_no_torch_and_auto_timing_imports_none_either(tmp_path):
    code = ("import sys\nfrom nvrx_slo.trainer.hooks import Hooks\n"
            f"hooks = Hooks.start(world_size=1, journal_dir={str(tmp_path)!r})\n"
            "with hooks.step(0) as s:\n    with s.compute(): pass\n"
            "hooks.close()\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
