"""GPU semantics on a simulated device (``sim_cuda.py``): the hooks' public API, as the README uses it,
over a fake ``torch.cuda`` whose work is queued on streams of a virtual host clock.

Every test plants *queued* work (a launch returns at once; a device read waits for the queue), so
each is ground truth from outside the hooks: the planted seconds, the stream's own schedule, the
simulated NVRx queue's own cost (``SimQueue.own``). Phases: within 0.5 ms of what was planted;
blocking per save: within 1 ms of the polls' own cost.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from fake_gpu import accounted, read_records
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.trainer.hooks import Hooks
from sim_cuda import SimCuda, SimQueue, fake_torch
from virtual_clock import CLOCK

pytestmark = pytest.mark.usefixtures("virtual_time")
PLANT = {"data": 0.008, "compute": 0.012, "optimizer": 0.004}


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> SimCuda:
    """One simulated GPU, as ``sys.modules["torch"].cuda``; CUDA not initialised yet."""
    sim = SimCuda(CLOCK)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(sim))
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return sim


def _of(directory: Path, kind: str) -> list[dict]:
    return [r for r in read_records(directory) if r["type"] == kind]


def readme_step(slo: Hooks, cuda: SimCuda, step: int, *, sync: bool, device: int | None = None,
                data: float = PLANT["data"]) -> float:
    """The README's loop: the loader in ``data`` (after reading the last loss: ``.item()`` waits for
    the queue, when ``sync``), kernels launched in ``compute`` and ``optimizer``. Returns how long
    the GPU waited for the input: from the later of the data phase's start and the end of the work
    queued before it, to the compute's launch (0 where the host leads the GPU)."""
    stream = cuda.streams[cuda.device if device is None else device]
    with slo.step(step) as s:
        with s.data():
            began, queued = CLOCK(), stream.tail
            if sync:
                cuda.item(device)
            CLOCK.sleep(data)
            waited = max(0.0, CLOCK() - max(began, queued))
        with s.compute():
            cuda.run(PLANT["compute"], device)
        with s.optimizer():
            cuda.run(PLANT["optimizer"], device)
    return waited


def _phases_off_ms(step: dict, data: float = PLANT["data"]) -> list[float]:
    truth = {"data": data, "compute": PLANT["compute"], "optimizer": PLANT["optimizer"]}
    return [1e3 * abs(step[f"{phase}_s"] - seconds) for phase, seconds in truth.items()]


# --- phases, with CUDA initialised before or after the first step ---------------------------------


@pytest.mark.parametrize("sync", [True, False], ids=["sync-in-data", "gpu-bound"])
def test_the_readme_loop_times_each_phase_as_planted(tmp_path, cuda, sync):
    cuda.set_device(0)  # the model moved to the GPU before the loop
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path))
    waited = [readme_step(slo, cuda, step, sync=sync) for step in range(30)]
    slo.close()
    steps = _of(tmp_path, "step")
    assert [r["step"] for r in steps] == list(range(30))
    for r in steps:
        assert max(_phases_off_ms(r, waited[r["step"]])) < 0.5, r
    assert all(w == 0.0 for w in waited[1:]) != sync  # GPU-bound: the loader never kept the GPU waiting
    (timing,) = _of(tmp_path, "step_timing")
    assert (timing["timer"], timing["device"], timing["step"]) == ("cuda", 0, 0)
    assert cuda.calls["current_stream"] <= 31 and cuda.calls["record"] <= 4 * 30 + 1  # per step: one lookup, 4 events
    if not sync:
        assert cuda.calls["synchronize"] <= 30 - 16 + 1  # the fence only where the host leads by 16 steps


def test_cuda_initialised_after_the_first_step_switches_to_cuda_events(tmp_path, cuda):
    """A warm-up on the CPU, then the model moves to the GPU: ``timing="auto"`` notices as the next step
    begins. Host clocks would read the queued compute as data wait (the H200's error)."""
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path))
    for step in range(3):
        with slo.step(step) as s:
            with s.compute():
                CLOCK.sleep(0.002)  # CPU work: no CUDA yet
    assert not cuda.is_initialized()
    cuda.set_device(0)  # the model moves to the GPU
    waited = {step: readme_step(slo, cuda, step, sync=True) for step in range(3, 20)}
    slo.close()
    host, gpu = _of(tmp_path, "step_timing")
    assert (host["timer"], host["cuda"], host["step"]) == ("host", False, 0)
    assert (gpu["timer"], gpu["cuda"], gpu["device"], gpu["step"]) == ("cuda", True, 0, 3)
    steps = _of(tmp_path, "step")
    assert [r["step"] for r in steps] == list(range(20))
    for r in steps[3:]:
        assert max(_phases_off_ms(r, waited[r["step"]])) < 0.5, r
    assert "warning" not in [r["type"] for r in read_records(tmp_path)]


def test_timing_host_says_once_when_cuda_appears_later(tmp_path, cuda):
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path), timing="host")
    with slo.step(0):
        pass
    cuda.set_device(0)
    for step in range(1, 5):
        readme_step(slo, cuda, step, sync=True)
    slo.close()
    timings = _of(tmp_path, "step_timing")
    assert [(r["timer"], r["cuda"], r["step"]) for r in timings] == [("host", False, 0), ("host", True, 1)]
    (warning,) = _of(tmp_path, "warning")
    assert "timing='host'" in warning["message"] and cuda.calls["record"] == 0


def test_a_cuda_error_switches_to_host_clocks_and_journals_the_switch(tmp_path, cuda):
    cuda.set_device(0)
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path))
    for step in range(3):
        readme_step(slo, cuda, step, sync=True)
    cuda.broken = "elapsed_time"
    for step in range(3, 6):
        readme_step(slo, cuda, step, sync=True)
    slo.close()
    assert [r["step"] for r in _of(tmp_path, "step")] == list(range(6))
    first, switch = _of(tmp_path, "step_timing")
    assert (switch["timer"], switch["cuda"], switch["device"]) == ("host", True, 0)
    assert "illegal memory access" in switch["reason"] and len(_of(tmp_path, "warning")) == 1


# --- the device the rank works on -----------------------------------------------------------------


@pytest.mark.parametrize("set_device", [True, False])
def test_on_a_node_of_two_gpus_the_rank_is_timed_on_its_own_device(tmp_path, monkeypatch, set_device):
    cuda = SimCuda(CLOCK, devices=2)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    monkeypatch.setenv("LOCAL_RANK", "1")
    if set_device:
        cuda.set_device(1)
    else:
        cuda.run(0.0, device=1)  # model.to("cuda:1"): CUDA initialised, the current device left at 0
    slo = Hooks.start(world_size=2, journal_dir=str(tmp_path))
    waited = []
    for step in range(10):
        waited.append(readme_step(slo, cuda, step, sync=True, device=1))
        if step == 4:
            cuda.set_device(0)  # a library changes the current device mid-run: the timing stays on cuda:1
            cuda.set_device(1 if set_device else 0)
    slo.close()
    steps = _of(tmp_path, "step")
    assert [r["step"] for r in steps] == list(range(10))
    for r in steps:
        assert max(_phases_off_ms(r, waited[r["step"]])) < 0.5, r
    (timing,) = _of(tmp_path, "step_timing")
    assert (timing["timer"], timing["device"]) == ("cuda", 1)
    warnings = _of(tmp_path, "warning")
    if set_device:
        assert warnings == []
    else:  # one warning naming the fix; GPU 0 never timed
        (warning,) = warnings
        assert "torch.cuda.set_device" in warning["message"] and "cuda:1" in warning["message"]
    assert cuda.streams[0].tail == 0.0


def test_a_rank_that_chose_another_device_is_timed_there_with_a_warning(tmp_path, monkeypatch):
    cuda = SimCuda(CLOCK, devices=4)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    monkeypatch.setenv("LOCAL_RANK", "1")
    cuda.set_device(3)
    slo = Hooks.start(world_size=4, journal_dir=str(tmp_path))
    for step in range(5):
        readme_step(slo, cuda, step, sync=True)
    slo.close()
    (timing,) = _of(tmp_path, "step_timing")
    assert timing["device"] == 3 and max(_phases_off_ms(_of(tmp_path, "step")[-1])) < 0.5
    assert "torch.cuda.set_device" in _of(tmp_path, "warning")[0]["message"]


# --- waits on saves: NVRx's poll drains the queue ---------------------------------------------------


def _request(*finalize_fns):
    return SimpleNamespace(finalize_fns=list(finalize_fns))


@pytest.mark.parametrize("pattern", ["wrapped", "handed-over", "both"])
def test_each_saves_blocking_is_its_polls_own_cost_and_the_steps_keep_their_compute(tmp_path, cuda, pattern):
    """The README's NVRx pattern on a GPU-bound loop: a poll after every step, each 0.5 ms of its own
    after it drained 16 ms of the steps' queued work (before: 167 ms a save against 5.8 ms)."""
    cuda.set_device(0)
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path))
    queue = SimQueue(cuda, poll_s=0.0005, finalize_s=0.002, finalize_gpu_s=0.001, write_s=0.12)
    if pattern != "wrapped":
        queue = slo.checkpoint_queue(queue)
    own: dict[str, float] = {}
    block = 0.003
    waited = []
    for step in range(60):
        waited.append(readme_step(slo, cuda, step, sync=False, data=0.0005))
        if step % 20 == 9:
            with slo.checkpoint(step, mode="async") as save:
                CLOCK.sleep(block)  # planning and staging (the staging copy waits for no step work: settled)
                queue.schedule_async_request(_request(save.completion()))
            own[save.ckpt] = -queue.own
        before = queue.get_num_unfinalized_calls()
        if pattern == "handed-over":
            queue.maybe_finalize_async_calls(blocking=False)
        else:
            with slo.checkpoint_wait():
                queue.maybe_finalize_async_calls(blocking=False)
        if before and not queue.get_num_unfinalized_calls():
            own[next(c for c, v in own.items() if v <= 0.0)] += queue.own
    slo.close()
    records = read_records(tmp_path)
    assert len(own) == 3 and queue.polls > 3 * 7
    for ckpt, truth in own.items():
        start, scheduled, end = (r for r in records if r.get("ckpt") == ckpt)
        assert 1e3 * abs(end["waited_s"] - truth) < 1.0, ckpt
        assert 1e3 * abs(scheduled["mono"] - start["mono"] + end["waited_s"] - block - truth) < 1.0, ckpt
    steps = [r for r in records if r["type"] == "step"]
    for r in steps:
        assert max(_phases_off_ms(r, waited[r["step"]])) < 0.5, r
    assert sum(r.get("blocked_s", 0.0) for r in records) == pytest.approx(queue.own, abs=1e-4)
    blocking = accounted(tmp_path)[Category.CHECKPOINT_BLOCKING]
    assert blocking == pytest.approx(3 * block + queue.own, abs=3e-3)


def test_closing_a_handed_over_queue_books_its_last_finalize_to_the_save(tmp_path, cuda):
    cuda.set_device(0)
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path))
    queue = slo.checkpoint_queue(SimQueue(cuda, poll_s=0.0005, write_s=0.5))
    assert slo.checkpoint_queue(queue) is queue
    for step in range(3):
        readme_step(slo, cuda, step, sync=False)
    with slo.checkpoint(2, mode="async") as save:
        queue.schedule_async_request(_request(save.completion()))
    readme_step(slo, cuda, 3, sync=False)
    queue.close()  # NVRx's close waits for the write and finalizes it
    slo.close()
    (end,) = _of(tmp_path, "checkpoint_end")
    assert end["ok"] and end["waited_s"] == pytest.approx(queue.own, abs=1e-4) and queue.own > 0.45


# --- faults outside a step ------------------------------------------------------------------------


def _gpu_bound_steps(slo: Hooks, cuda: SimCuda, steps: range) -> dict[int, float]:
    """GPU-bound steps (the host leads); returns when each one's GPU work ends: the stream's schedule."""
    ends = {}
    for step in steps:
        readme_step(slo, cuda, step, sync=False, data=0.0005)
        ends[step] = cuda.streams[0].tail
    return ends


@pytest.mark.parametrize("told", [True, False], ids=["wrapper-finalize", "next-step"])
def test_finished_steps_survive_a_fault_outside_a_step_with_their_own_times(tmp_path, cuda, told):
    """A peer dies while this rank is in a collective between steps: the steps the GPU finished
    meanwhile are journaled with their own times, told (the Wrapper's finalize calls
    ``interrupted``) or found at the next step after the restart, never dated by the restart."""
    cuda.set_device(0)
    slo = Hooks.start(world_size=2, journal_dir=str(tmp_path))
    ends = _gpu_bound_steps(slo, cuda, range(8))
    CLOCK.sleep(0.3)  # the collective waits for the dead peer; the GPU finishes meanwhile
    fault = CLOCK()
    if told:
        slo.interrupted()
        assert [r["step"] for r in _of(tmp_path, "step")] == list(range(8))
    CLOCK.sleep(5.0)  # the in-process restart
    ends |= _gpu_bound_steps(slo, cuda, range(8, 12))
    slo.close()
    steps = _of(tmp_path, "step")
    assert [r["step"] for r in steps] == list(range(12))
    for r in steps:
        assert r["mono"] == pytest.approx(ends[r["step"]], abs=5e-5), r
        assert r["data_s"] + r["compute_s"] + r["optimizer_s"] <= r["mono"] - r["start"] + 1e-5
    assert all(r["mono"] < fault for r in steps[:8]) and _of(tmp_path, "warning") == []


def test_a_fault_with_gpu_work_still_queued_writes_it_by_host_clocks_without_waiting(tmp_path, cuda):
    cuda.set_device(0)
    slo = Hooks.start(world_size=2, journal_dir=str(tmp_path))
    ends = _gpu_bound_steps(slo, cuda, range(6))
    CLOCK.sleep(0.05)  # three of the six steps' GPU work is done
    syncs = cuda.calls["synchronize"]
    with pytest.raises(RuntimeError):
        with slo.checkpoint_wait():  # nothing in flight: no settle
            raise RuntimeError("NCCL error: remote process exited")
    assert cuda.calls["synchronize"] == syncs  # bounded: queries only
    steps = _of(tmp_path, "step")
    done = [s for s, end in ends.items() if end <= CLOCK()]
    assert [r["step"] for r in steps] == list(range(6)) and len(done) == 3
    for r in steps:
        if r["step"] in done:
            assert r["mono"] == pytest.approx(ends[r["step"]], abs=5e-5)
        else:
            assert r["mono"] < CLOCK()
    (warning,) = _of(tmp_path, "warning")
    assert f"{[3, 4, 5]}" in warning["message"]


def test_a_process_that_exits_on_a_fault_journals_its_finished_steps(tmp_path):
    """No close, no Wrapper: the exception ends the process, which journals its finished steps on the
    way out (real clock, real exit)."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from sim_cuda import RealClock, SimCuda, installed
        from nvrx_slo.trainer.hooks import Hooks
        cuda = SimCuda(RealClock())
        with installed(cuda):
            cuda.set_device(0)
            slo = Hooks.start(world_size=2, journal_dir={str(tmp_path)!r})
            for step in range(5):
                with slo.step(step) as s:
                    with s.compute():
                        cuda.run(0.02)
                print("end", step, cuda.streams[0].tail, flush=True)
            time.sleep(0.3)
            print("fault", time.monotonic(), flush=True)
            raise RuntimeError("a peer died in an all-reduce between steps")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 1 and "a peer died" in out.stderr
    lines = [line.split() for line in out.stdout.splitlines()]
    ends = {int(w[1]): float(w[2]) for w in lines if w[0] == "end"}
    fault = next(float(w[1]) for w in lines if w[0] == "fault")
    steps = _of(tmp_path, "step")
    assert [r["step"] for r in steps] == list(range(5))
    for r in steps:
        assert abs(r["mono"] - ends[r["step"]]) < 0.002 and r["mono"] < fault


# --- how each process timed its steps, as the sidecar shows it -------------------------------------


def test_the_metrics_status_page_and_report_say_how_the_ranks_timed_their_steps(tmp_path, monkeypatch):
    """Two ranks on one node of two simulated GPUs: rank 0 by CUDA events, rank 1 by host clocks in a
    process that uses CUDA (``timing="host"``), which shows, on the page in red."""
    from nvrx_slo.contracts import catalogue as cat
    from nvrx_slo.exporter.engine.engine import Engine
    from nvrx_slo.exporter.events import as_event
    from nvrx_slo.exporter.views import slo_report, status_page
    from nvrx_slo.exporter.views.view import View
    from snapshot_fixtures import TARGETS
    from test_collector import scrape, value

    cuda = SimCuda(CLOCK, devices=2)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda))
    for rank, timing in ((0, "auto"), (1, "host")):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        monkeypatch.setattr(os, "getpid", lambda rank=rank: 4000 + rank)  # two processes
        cuda.set_device(rank)
        slo = Hooks.start(world_size=2, journal_dir=str(tmp_path), timing=timing)
        for step in range(3):
            readme_step(slo, cuda, step, sync=True)
        slo.close()
    engine = Engine(reorder_window_s=0.0)
    for record in sorted(read_records(tmp_path), key=lambda r: r["mono"]):
        engine.ingest(as_event(record))
    snap = engine.snapshot(CLOCK(), 0.0)
    assert [r.step_timer for r in snap.ranks] == [cat.StepTimer.CUDA, cat.StepTimer.HOST_ON_GPU]
    view = View(snap, {}, {}, {})
    _, families = scrape(view)
    assert value(families, cat.STEP_TIMING_RANKS, timer="cuda") == 1
    assert value(families, cat.STEP_TIMING_RANKS, timer="host_on_gpu") == 1
    page = status_page.render(view, TARGETS)
    assert '<td class="">CUDA events</td>' in page and '<td class="fail">HOST CLOCKS on a GPU</td>' in page
    report = slo_report.render(snap, TARGETS)
    assert "steps timed by CUDA events on 1 rank(s), HOST CLOCKS on a GPU on 1 rank(s)" in report
