"""The loop's waits on saves between steps (``Hooks.checkpoint_wait``): every one is checkpoint blocking,
however short, with no record of its own; on a virtual clock (``fake_gpu.py``), so the sums are exact.

Ground truth is what the test planted: sub-millisecond polls (a GPU's NVRx finalize polls are about a
hundred per save, each under 1 ms), steps of known length, a save block of known length. Both step
timers run the same loops: host clocks, and CUDA events from the fake GPU.
"""

from __future__ import annotations

import math

import pytest

from fake_gpu import FakeGpu, accounted, rank_accounted, read_records
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import open_journal
from virtual_clock import CLOCK

pytestmark = pytest.mark.usefixtures("virtual_time")
POLLS = [0.0003, 0.0008, 0.0001, 0.0006, 0.0009, 0.0002, 0.0005, 0.0004]  # each under a millisecond


@pytest.fixture(params=["host", "gpu"])
def loop(request, tmp_path):
    gpu = FakeGpu()
    hooks = Hooks(open_journal(str(tmp_path)), gpu.event if request.param == "gpu" else None)
    hooks.journal.emit(EventType.PROCESS_START, world_size=1)
    return hooks, gpu


def _step(hooks: Hooks, gpu: FakeGpu, step: int) -> None:
    with hooks.step(step) as s:
        with s.data():
            CLOCK.sleep(0.002)
        with s.compute():
            gpu.run(0.02)
            gpu.synchronize()  # an .item(): the host waits for the GPU (both timers agree on the work)
        with s.optimizer():
            gpu.run(0.005)


def _tiles(tmp_path) -> bool:
    """The rank's categories and its unprotected work add up to its wall."""
    rank = rank_accounted(tmp_path)
    return math.isclose(math.fsum(rank.seconds.values()) + rank.unprotected_s, rank.wall_s, abs_tol=1e-6)


def test_sub_millisecond_polls_add_up_to_each_saves_blocking_and_the_ranks(tmp_path, loop):
    hooks, gpu = loop
    planted: dict[str, float] = {}
    step = 0
    for save_step in (4, 9):
        for _ in range(5):
            _step(hooks, gpu, step)
            step += 1
        with hooks.checkpoint(save_step, mode="async") as save:
            CLOCK.sleep(0.010)  # planning and staging
            done = save.completion()
        planted[save.ckpt] = 0.010
        for i, poll in enumerate(POLLS):  # one poll after each step while the save is in flight
            _step(hooks, gpu, step)
            step += 1
            with hooks.checkpoint_wait():
                CLOCK.sleep(poll)
                if i == len(POLLS) - 1:
                    done()  # the poll that finds the write done runs the finalize functions
            planted[save.ckpt] += poll
    _step(hooks, gpu, step)
    hooks.close()
    records = read_records(tmp_path)
    for ckpt, truth in planted.items():
        start, scheduled, end = (r for r in records if r.get("ckpt") == ckpt)
        blocking = scheduled["mono"] - start["mono"] + end["waited_s"]
        assert blocking == pytest.approx(truth, abs=1e-4), ckpt  # the clock ticks 1 µs per reading
        assert end["waited_s"] == pytest.approx(sum(POLLS), abs=5e-5)
    assert [r["type"] for r in records].count("checkpoint_finalize") == 0  # no record per poll
    carried = [r["blocked_s"] for r in records if r["type"] == "step" and "blocked_s" in r]
    assert sum(carried) == pytest.approx(2 * sum(POLLS), abs=1e-4) and len(carried) == 2 * len(POLLS)
    seconds = accounted(tmp_path)
    assert seconds[Category.CHECKPOINT_BLOCKING] == pytest.approx(sum(planted.values()), abs=2e-4)
    assert _tiles(tmp_path)


def test_a_wait_before_a_save_a_user_span_or_the_end_is_carried_by_that_record(tmp_path, loop):
    hooks, gpu = loop
    _step(hooks, gpu, 0)
    with hooks.checkpoint(0, mode="async") as first:
        done = first.completion()
    for before in ("checkpoint", "span", "close"):
        with hooks.checkpoint_wait():
            CLOCK.sleep(0.0007)
        if before == "checkpoint":
            with hooks.checkpoint(1):  # a synchronous save while the first is still in flight
                CLOCK.sleep(0.001)
        elif before == "span":
            with hooks.span("eval"):
                CLOCK.sleep(0.003)
        else:
            done()
            hooks.close()
    records = read_records(tmp_path)
    carriers = [r for r in records if "blocked_s" in r]
    assert [r["type"] for r in carriers] == ["checkpoint_start", "user_span", "process_end"]
    assert all(r["blocked_s"] == pytest.approx(0.0007, abs=1e-5) for r in carriers)
    seconds = accounted(tmp_path)  # its end settles every record: the job is over
    assert seconds[Category.CHECKPOINT_BLOCKING] == pytest.approx(3 * 0.0007 + 0.001, abs=5e-5)
    assert seconds[Category.USER_SPAN] == pytest.approx(0.003, abs=5e-5)
    assert _tiles(tmp_path)


def test_waits_inside_a_span_the_hooks_time_are_that_spans_not_counted_twice(tmp_path, loop):
    hooks, gpu = loop
    with hooks.checkpoint(0, mode="async") as first:
        first.completion()
    with hooks.checkpoint(1, mode="async") as second:
        with hooks.checkpoint_wait():  # waiting on the first save inside the second's block
            CLOCK.sleep(0.004)
        second.completion()
    with hooks.span("eval"):
        with hooks.checkpoint_wait():
            CLOCK.sleep(0.002)
    _step(hooks, gpu, 2)
    hooks.close()
    assert not [r for r in read_records(tmp_path) if "blocked_s" in r]
    seconds = accounted(tmp_path)
    assert seconds[Category.USER_SPAN] == pytest.approx(0.002, abs=5e-5)
    assert _tiles(tmp_path)


def test_with_no_save_in_flight_a_wait_books_nothing(tmp_path, loop):
    hooks, gpu = loop
    with hooks.checkpoint(0):  # synchronous: durable when its block ends
        pass
    with hooks.checkpoint_wait():
        CLOCK.sleep(0.001)
    _step(hooks, gpu, 1)
    hooks.close()
    assert not [r for r in read_records(tmp_path) if "blocked_s" in r or "waited_s" in r]


def test_a_save_that_ends_in_another_thread_before_the_poll_keeps_the_waits_before_it(tmp_path, loop):
    """A future's callback ends the save between two polls: the end carries the waits so far; later
    polls charge the next save in flight, or nothing."""
    hooks, gpu = loop
    with hooks.checkpoint(0, mode="async") as save:
        done = save.completion()
    with hooks.checkpoint_wait():
        CLOCK.sleep(0.0005)
    done()  # the callback thread, between the loop's polls
    with hooks.checkpoint_wait():
        CLOCK.sleep(0.0005)
    _step(hooks, gpu, 1)
    hooks.close()
    records = read_records(tmp_path)
    (end,) = [r for r in records if r["type"] == "checkpoint_end"]
    assert end["waited_s"] == pytest.approx(0.0005, abs=1e-5)
    assert sum(r.get("blocked_s", 0.0) for r in records) == pytest.approx(0.0005, abs=1e-5)
