"""The checkpointer on one real gloo rank with real NVRx async checkpointing and real DCP:
snapshots, journaled spans, write failures, a dying writer, and restore fallbacks."""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from nvrx_slo.contracts import schema
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.reference import checkpoint
from nvrx_slo.trainer.reference.checkpoint import METADATA, Checkpointer, CheckpointWorkerDied
from nvrx_slo.trainer.reference.restore import complete_checkpoints, restore

pytestmark = [pytest.mark.slow, pytest.mark.torch]


@pytest.fixture(scope="module", autouse=True)
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _records(hooks: Hooks) -> list[dict]:
    return [schema.decode(line) for line in hooks.journal.path().read_bytes().splitlines()]


def _spans(hooks: Hooks, ckpt: str) -> list[dict]:
    return [r for r in _records(hooks) if r.get("ckpt") == ckpt]


@pytest.fixture(scope="module")
def async_ckpt(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("async")
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp / "journal"))
    ckpt = Checkpointer(hooks, tmp / "ckpt", "async", slow_storage_s=0.3)
    ckpt.start()
    ckpt.ready()
    yield ckpt
    ckpt.close()


@pytest.mark.nvrx
def test_an_async_save_holds_the_state_of_when_save_returned_not_what_training_did_next(async_ckpt):
    state = {"w": torch.zeros(1000)}
    async_ckpt.save(state, step=1)
    state["w"] += 100.0  # the optimizer's next step, while the writer is still writing
    async_ckpt.poll(blocking=True)
    loaded = {"w": torch.empty(1000)}
    dcp.load(loaded, checkpoint_id=str(async_ckpt.root / "step-000001"))
    assert torch.equal(loaded["w"], torch.zeros(1000))
    start, scheduled, end = _spans(async_ckpt.hooks, "step-000001")
    assert [start["type"], scheduled["type"], end["type"]] == [
        "checkpoint_start", "checkpoint_scheduled", "checkpoint_end"]
    assert start["mode"] == "async" and scheduled["bytes"] == 4000 and end["ok"] and end["error"] is None
    assert end["waited_s"] > 0  # the blocking poll that finalized it
    assert scheduled["mono"] + 0.3 <= end["written"] <= end["mono"]  # the writer's own stamp, after its 0.3 s
    assert scheduled["mono"] - start["mono"] < 0.3  # training was not blocked for the write
    assert complete_checkpoints(async_ckpt.root)[0][0] == 1

    async_ckpt.save(state, step=10)  # the staging buffers are reused: still a snapshot
    state["w"] += 100.0
    async_ckpt.poll(blocking=True)
    dcp.load(loaded, checkpoint_id=str(async_ckpt.root / "step-000010"))
    assert torch.equal(loaded["w"], torch.full((1000,), 100.0))


@pytest.mark.nvrx
def test_a_write_that_fails_in_the_background_is_journaled_as_failed_and_training_goes_on(async_ckpt):
    state = {"w": torch.ones(10)}
    async_ckpt.save(state, step=2)
    shutil.rmtree(async_ckpt.root / "step-000002")  # storage lost under the writer during its 0.3 s
    async_ckpt.poll(blocking=True)
    end = _spans(async_ckpt.hooks, "step-000002")[-1]
    assert end["type"] == "checkpoint_end" and not end["ok"] and "write failed" in end["error"]
    assert "No such file or directory" in end["error"], end["error"]  # the writer's own cause, on every NVRx
    async_ckpt.save(state, step=3)  # the next save works
    async_ckpt.poll(blocking=True)
    assert _spans(async_ckpt.hooks, "step-000003")[-1]["ok"]
    assert [step for step, _ in complete_checkpoints(async_ckpt.root)] == [10, 3, 1]


@pytest.mark.nvrx
def test_a_dead_writer_is_journaled_and_raised_instead_of_hanging(tmp_path):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))
    ckpt = Checkpointer(hooks, tmp_path / "ckpt", "async", slow_storage_s=5.0)
    try:
        ckpt.start()
        ckpt.save({"w": torch.ones(10)}, step=7)
        worker = ckpt._worker()
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(timeout=10)
        with pytest.raises(CheckpointWorkerDied, match=str(worker.pid)):
            ckpt.poll()
    finally:
        ckpt.kill()
    liveness = [r for r in _records(hooks) if r["type"] == "checkpoint_worker"]
    assert [r["alive"] for r in liveness] == [True, False] and liveness[0]["worker_pid"] == worker.pid
    end = _spans(hooks, "step-000007")[-1]
    assert end["type"] == "checkpoint_end" and not end["ok"] and "died" in end["error"]


@pytest.mark.nvrx
def test_a_writer_stuck_on_an_abandoned_save_is_replaced_within_the_bound_not_waited_for(tmp_path, monkeypatch):
    """An in-process restart abandons a save whose write hangs (storage stalled): the next
    incarnation's ``start`` waits ``ABANDONED_WAIT_S`` at most (the Wrapper's soft timeout would
    fire on a longer wait), says so, and saves again with a fresh writer."""
    monkeypatch.setattr(checkpoint, "ABANDONED_WAIT_S", 1.0)
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))
    ckpt = Checkpointer(hooks, tmp_path / "ckpt", "async", slow_storage_s=60.0)
    try:
        ckpt.start()
        ckpt.save({"w": torch.ones(10)}, step=7)
        stuck = ckpt._worker()
        ckpt.abandon("in-process restart after RuntimeError: boom")
        ckpt.slow_storage_s = 0.0
        began = time.monotonic()
        ckpt.start()
        assert time.monotonic() - began < 15.0  # the bound, plus stopping one writer and starting another
        assert not stuck.is_alive() and ckpt._worker() is not stuck
        ckpt.save({"w": torch.ones(10)}, step=9)
        ckpt.poll(blocking=True)
    finally:
        ckpt.kill()
    records = _records(hooks)
    assert any(r["type"] == "warning" and "replacing it" in r["message"] for r in records)
    ends = {r["ckpt"]: r for r in records if r["type"] == "checkpoint_end"}
    assert not ends["step-000007"]["ok"] and "abandoned" in ends["step-000007"]["error"]
    assert ends["step-000009"]["ok"] and (tmp_path / "ckpt" / "step-000009" / METADATA).exists()


def test_restore_skips_a_corrupt_checkpoint_with_a_warning_and_ignores_an_incomplete_one(tmp_path):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))
    ckpt = Checkpointer(hooks, tmp_path / "ckpt", "sync")
    for step in (10, 20):
        ckpt.save({"w": torch.full((100,), float(step))}, step)
    (tmp_path / "ckpt" / "step-000030").mkdir()  # a save that never finished: no .metadata
    data = next((tmp_path / "ckpt" / "step-000020").glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:50])  # torn
    state = {"w": torch.zeros(100)}

    restored = restore(hooks, tmp_path / "ckpt", lambda path: dcp.load(state, checkpoint_id=str(path)))

    assert restored == 10 and torch.equal(state["w"], torch.full((100,), 10.0))
    records = _records(hooks)
    (warning,) = [r for r in records if r["type"] == "warning"]
    (restore_record,) = [r for r in records if r["type"] == "restore"]
    assert "step-000020" in warning["message"]
    assert restore_record["step"] == 10 and restore_record["path"].endswith("step-000010")
    assert restore_record["fallback"].startswith("step-000020: ")
    assert [r["mode"] for r in records if r["type"] == "checkpoint_start"] == ["sync", "sync"]
    assert all(r["ok"] and r["written"] <= r["mono"] for r in records if r["type"] == "checkpoint_end")


def test_restore_without_any_checkpoint_is_a_fresh_start(tmp_path):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))
    assert restore(hooks, tmp_path / "nothing-here", lambda path: pytest.fail("nothing to load")) is None
    (record,) = [r for r in _records(hooks) if r["type"] == "restore"]
    assert record["step"] is None and record["path"] is None and record["fallback"] is None


def test_the_sync_baseline_blocks_for_the_whole_write(tmp_path):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))
    ckpt = Checkpointer(hooks, tmp_path / "ckpt", "sync", slow_storage_s=0.2)
    t0 = time.monotonic()
    ckpt.save({"w": torch.ones(256)}, 5)
    assert time.monotonic() - t0 >= 0.2
    start, scheduled, end = _spans(hooks, "step-000005")
    assert scheduled["mono"] - start["mono"] >= 0.2 and scheduled["bytes"] == 1024
    assert end["ok"] and end["written"] == pytest.approx(scheduled["mono"], abs=1e-3)
    assert (tmp_path / "ckpt" / "step-000005" / METADATA).is_file()


@pytest.mark.nvrx
def test_closing_after_the_writer_died_raises_at_once_instead_of_waiting_for_it(tmp_path):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))
    ckpt = Checkpointer(hooks, tmp_path / "ckpt", "async", slow_storage_s=5.0)
    ckpt.start()
    ckpt.save({"w": torch.ones(10)}, step=3)
    worker = ckpt._worker()
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(timeout=10)
    outcome: list[BaseException | None] = []

    def close() -> None:
        try:
            ckpt.close()
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(timeout=60)
    assert not closer.is_alive(), "close() waited for a dead writer"
    assert len(outcome) == 1 and isinstance(outcome[0], CheckpointWorkerDied)
    assert _spans(hooks, "step-000003")[-1]["ok"] is False


def test_gathering_the_state_inside_the_save_is_counted_as_its_blocking_time(async_ckpt, tmp_path):
    def gather() -> dict:
        time.sleep(0.1)  # a planted get_state_dict cost
        return {"w": torch.ones(10)}

    sync = Checkpointer(Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal")), tmp_path / "ckpt", "sync")
    for ckpt in (async_ckpt, sync):
        ckpt.save(gather, step=11)
        ckpt.poll(blocking=True)
        start, scheduled = (r for r in _spans(ckpt.hooks, "step-000011")
                            if r["type"] in ("checkpoint_start", "checkpoint_scheduled"))
        assert scheduled["mono"] - start["mono"] >= 0.1, ckpt.mode
        assert _spans(ckpt.hooks, "step-000011")[-1]["ok"]


@pytest.mark.nvrx
def test_a_poll_that_finishes_a_save_is_that_saves_cost_and_its_end_is_written_after_it(async_ckpt):
    async_ckpt.save({"w": torch.ones(10)}, step=12)
    before = time.monotonic()
    async_ckpt.poll(blocking=True)
    after = time.monotonic()
    end = _spans(async_ckpt.hooks, "step-000012")[-1]
    assert end["type"] == "checkpoint_end" and 0.3 <= end["waited_s"] <= after - before  # the write's 0.3 s
    assert before + end["waited_s"] <= end["mono"] <= after  # NVRx's all-reduces inside the wait


# --- every poll is a save's cost; the first save costs what a later one does -----------------------

HOLD = 6  # polls after each save that find nothing, as a GPU's polls do while the writer writes
PLANTED = [0.0002, 0.0007, 0.0004, 0.0009, 0.0003, 0.0006, 0.0005, 0.0008]  # per poll, each under 1 ms


class SlowQueue:
    """NVRx's queue (the real one behind it) with each non-blocking poll slowed by a planted
    sub-millisecond sleep, and the first ``HOLD`` polls after a save finding nothing to finalize."""

    planted = 0  # polls slowed, over every queue

    def __init__(self, queue) -> None:
        self.queue = queue
        self.held = 0

    def __getattr__(self, name: str):
        return getattr(self.queue, name)

    def schedule_async_request(self, request):
        self.held = HOLD
        return self.queue.schedule_async_request(request)

    def maybe_finalize_async_calls(self, blocking: bool = False, **kwargs):
        time.sleep(PLANTED[SlowQueue.planted % len(PLANTED)])
        SlowQueue.planted += 1
        if self.held:
            self.held -= 1
            return []
        return self.queue.maybe_finalize_async_calls(blocking=blocking, **kwargs)


@pytest.fixture(scope="module")
def reference_loop(tmp_path_factory):
    """The reference job's loop on one rank (TinyLM under FSDP2, AdamW, NVRx async saves every 10
    steps, a poll after every step), in three incarnations, each with a writer of its own started
    and readied as the job does it. The truth is the loop's own clock around each save call and
    each poll until the next save."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    from nvrx_slo.trainer.reference.model import ModelConfig, TinyLM, loss_fn, synthetic_batch

    tmp = tmp_path_factory.mktemp("loop")
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp / "journal"))
    cfg = ModelConfig()
    model = TinyLM(cfg)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def state() -> dict:
        model_sd, optim_sd = get_state_dict(model, optim)
        return {"model": model_sd, "optim": optim_sd}

    truth: dict[str, float] = {}  # every wait charged to the oldest save in flight, as the hooks do
    incarnations: list[list[str]] = []
    step = 0
    for incarnation in range(3):
        ckpt = Checkpointer(hooks, tmp / f"ckpt-{incarnation}", "async")
        ckpt.start()  # as early as the job can: the writer starts while the rest initialises
        ckpt.ready(state)
        ckpt._queue = SlowQueue(ckpt._queue)  # the seam: NVRx's queue, slowed by the test's planted polls
        saves: list[str] = []
        in_flight: list[str] = []
        for _ in range(40):
            with hooks.step(step) as s:
                with s.data():
                    tokens = synthetic_batch(cfg, 0, step, 0, torch.device("cpu"))
                with s.compute():
                    loss_fn(model, tokens).backward()
                with s.optimizer():
                    optim.step()
                    optim.zero_grad(set_to_none=True)
            t0 = time.monotonic()
            ckpt.poll()
            if in_flight:
                truth[in_flight[0]] += time.monotonic() - t0
                del in_flight[:max(0, len(in_flight) - ckpt.in_flight)]
            if (step + 1) % 10 == 0:
                saves.append(checkpoint.checkpoint_id(step))
                t0 = time.monotonic()
                ckpt.save(state, step)
                truth[saves[-1]] = time.monotonic() - t0
                in_flight.append(saves[-1])
            step += 1
        t0 = time.monotonic()
        ckpt.poll(blocking=True)
        truth[in_flight[0]] += time.monotonic() - t0
        with hooks.step(step):  # carries the last wait (the newest record waits for its job's end)
            step += 1
        ckpt.close()
        incarnations.append(saves)
    hooks.close()
    return hooks, truth, incarnations


def _blocking(hooks: Hooks) -> dict[str, float]:
    """Each save's blocking as the journal has it: its block, and the loop's waits on it after."""
    parts: dict[str, dict] = {}
    for r in _records(hooks):
        if r["type"].startswith("checkpoint_") and "ckpt" in r:
            parts.setdefault(r["ckpt"], {})[r["type"]] = r
    return {ckpt: p["checkpoint_scheduled"]["mono"] - p["checkpoint_start"]["mono"]
            + (p["checkpoint_end"].get("waited_s") or 0.0) for ckpt, p in parts.items()}


@pytest.mark.nvrx
def test_sub_millisecond_polls_add_up_to_the_blocking_the_loop_measured_within_a_millisecond_per_save(
        reference_loop):
    from nvrx_slo.contracts.catalogue import Category
    from nvrx_slo.exporter.engine.engine import Engine
    from nvrx_slo.exporter.events import as_event

    hooks, truth, _ = reference_loop
    assert SlowQueue.planted >= len(truth) * HOLD and max(PLANTED) < 0.001
    journaled = _blocking(hooks)
    assert journaled.keys() == truth.keys() and len(truth) == 12
    errors = {ckpt: journaled[ckpt] - seconds for ckpt, seconds in truth.items()}
    print("journal - loop's clock per save, ms:", " ".join(f"{1e3 * e:+.3f}" for e in errors.values()))
    # The loop's clock also holds the hooks' own calls and the journal's writes of each save's records
    # (a few hundred µs per save here), and a busy machine can preempt any one of them for tens of ms
    # (-20.4 ms once, under a full suite beside four others' tests): the median save is the measure.
    # Polls dropped by a threshold would shift every save by its planted polls, the median too.
    assert statistics.median(abs(e) for e in errors.values()) < 0.001
    assert not [r for r in _records(hooks) if r["type"] == "checkpoint_finalize"]  # no record per poll
    engine = Engine(reorder_window_s=0.0)
    for record in _records(hooks):
        engine.ingest(as_event(record))
    rank = engine.snapshot(time.monotonic() + 60, time.time() + 60).ranks[0]
    # The engine books what the journal says (its fields are written to the microsecond: three per save,
    # each half a microsecond off at most); against the truth, the median above (a sum over saves would
    # carry one preempted save's error: 12.3 ms of 12 allowed, once, under load).
    assert rank.seconds[Category.CHECKPOINT_BLOCKING] == pytest.approx(sum(journaled.values()), abs=2e-6 * len(truth))


@pytest.mark.nvrx
def test_the_first_save_after_a_start_blocks_no_longer_than_the_steady_ones(reference_loop):
    """``start`` early and ``ready(state)`` at the end of initialisation, as the reference job does:
    the writer's start-up, its first job and the first plan and staging are paid before the loop.
    A busy machine only adds time, to any save: the quickest of three first saves (each after its
    own start) against the steady saves' median. (Started just before the loop instead, every first
    save waited 0.5-0.9 s here for the writer, against 30 ms for a steady one; on an H200, 7.8 s.)"""
    hooks, _, incarnations = reference_loop
    blocking = _blocking(hooks)
    firsts = sorted(blocking[saves[0]] for saves in incarnations)
    steady = sorted(blocking[ckpt] for saves in incarnations for ckpt in saves[1:-1])  # the last waits for its write
    print(f"blocking per save, ms: first saves {', '.join(f'{1e3 * b:.1f}' for b in firsts)}; "
          f"steady {', '.join(f'{1e3 * b:.1f}' for b in steady)}")
    assert firsts[0] <= 1.5 * statistics.median(steady), (firsts, steady)


@pytest.mark.nvrx
def test_a_handed_over_queues_unwrapped_polls_and_its_close_are_booked_to_the_save(tmp_path):
    """NVRx's own ``AsyncCallsQueue`` handed to the hooks once (``Hooks.checkpoint_queue``), polled bare
    between steps as NVRx's docs do: every poll while a save is in flight, blocking or not, is that
    save's blocking, and so is the finalize that ``close()`` makes (within the close, which also stops
    the writer). The truth brackets it from outside the hooks: at least NVRx's own calls (timed inside
    the hooks' wrapper), at most the loop's clock around them (the hooks' own overhead between the
    two, and under load whatever preempted the loop there)."""
    from nvrx_slo.trainer.reference import cpu_shims, nvrx_async

    api = nvrx_async.async_checkpointing()
    cpu_shims.apply(api)
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))
    raw = api.AsyncCallsQueue(persistent=True, **cpu_shims.queue_kwargs(api))
    inner = {"polled": 0.0, "waited": 0.0, "closed": 0.0}
    saving = ["polled"]
    bare = raw.maybe_finalize_async_calls

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.monotonic()
        try:
            return bare(*args, **kwargs)
        finally:
            inner[saving[0]] += time.monotonic() - t0

    raw.maybe_finalize_async_calls = timed
    queue = hooks.checkpoint_queue(raw)
    outer = {"polled": 0.0, "waited": 0.0}
    for name, step in (("polled", 3), ("waited", 6), ("closed", 9)):
        saving[0] = name
        with hooks.checkpoint(step, name, mode="async") as save:
            queue.schedule_async_request(api.AsyncRequest(time.sleep, (0.5,), [save.completion()]))
        with hooks.step(step):
            time.sleep(0.02)
        while name == "polled" and queue.get_num_unfinalized_calls():
            t0 = time.monotonic()
            queue.maybe_finalize_async_calls(blocking=False)  # bare: no checkpoint_wait
            outer[name] += time.monotonic() - t0
            with hooks.step(step):
                time.sleep(0.02)
        if name == "waited":
            t0 = time.monotonic()
            queue.maybe_finalize_async_calls(blocking=True)
            outer[name] += time.monotonic() - t0
    t0 = time.monotonic()
    queue.close()  # the last save's write is waited for and finalized here, then the writer stops
    closed = time.monotonic() - t0
    hooks.close()
    ends = {r["ckpt"]: r for r in _records(hooks) if r["type"] == "checkpoint_end"}
    assert all(end["ok"] for end in ends.values()) and len(ends) == 3
    for name, seconds in outer.items():
        print(f"{name}: NVRx's calls {1e3 * inner[name]:.3f} ms <= journal {1e3 * ends[name]['waited_s']:.3f} ms "
              f"<= the loop's clock {1e3 * seconds:.3f} ms")
        assert inner[name] - 2e-6 <= ends[name]["waited_s"] <= seconds + 2e-6, (name, inner[name], seconds)
    assert inner["closed"] > 0.3  # close() finalized the last save through the queue's own poll
    assert 0.3 < ends["closed"]["waited_s"] <= closed
