"""A save made by the user's own checkpointing stack is observed through ``Hooks.checkpoint``.

The contract tests drive the span with real futures (``concurrent.futures`` and ``torch.futures``);
the end-to-end tests save with plain ``torch.distributed.checkpoint`` and with NVRx's public async
API on one gloo rank, replay the journal through the sidecar's engine, and compare its productive
time with what the test measured itself: its own step timestamps, and DCP's commit marker
(``.metadata``, written last) for which saves are durable.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import Journal, Writer
from servers import free_port

pytestmark = pytest.mark.torch


def _hooks(tmp_path: Path) -> Hooks:
    (tmp_path / "journal").mkdir()
    return Hooks(Journal(tmp_path / "journal", Writer.from_env({"RANK": "0"})))


def _records(tmp_path: Path) -> list[dict]:
    files = sorted((tmp_path / "journal").glob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def _save_records(tmp_path: Path) -> list[dict]:
    return [r for r in _records(tmp_path) if r["type"].startswith("checkpoint_")]


def test_a_synchronous_save_is_durable_when_its_block_ends(tmp_path):
    slo = _hooks(tmp_path)
    with slo.checkpoint(5) as save:
        save.bytes = 1234
        time.sleep(0.05)
    start, scheduled, end = _save_records(tmp_path)
    assert [r["type"] for r in (start, scheduled, end)] == ["checkpoint_start", "checkpoint_scheduled",
                                                            "checkpoint_end"]
    assert start["ckpt"] == scheduled["ckpt"] == end["ckpt"] == "step-000005" and start["mode"] == "sync"
    assert scheduled["bytes"] == 1234 and scheduled["stage_s"] >= 0.05
    assert end["ok"] and end["step"] == 5 and scheduled["mono"] <= end["written"] <= end["mono"]


def test_a_writer_that_stamps_its_finish_and_a_loop_that_waits_for_it_are_each_journaled_where_they_belong(tmp_path):
    """The richer path, for a checkpointer that knows more (the reference job's): planning apart
    from staging, the writer's own finish stamp as ``written``, the loop's later wait on the save
    (``checkpoint_wait``: on the save's end and on the loop's next record, no record of its own),
    and the writer process's liveness."""
    slo = _hooks(tmp_path)
    with slo.checkpoint(7, mode="async") as save:
        time.sleep(0.03)
        save.planned()
        time.sleep(0.02)
        done = save.completion()
    stamp = time.monotonic()  # the writer finished here; the loop notices later
    waited_from = time.monotonic()
    with slo.checkpoint_wait():
        time.sleep(0.02)
        done(written=stamp)  # NVRx runs the finalize functions inside its poll
        assert [r["type"] for r in _save_records(tmp_path)] == ["checkpoint_start", "checkpoint_scheduled"]
    waited = time.monotonic() - waited_from
    slo.checkpoint_worker(False, None)
    with slo.step(8):
        pass
    start, scheduled, end, worker = _save_records(tmp_path)
    assert [r["type"] for r in (start, scheduled, end, worker)] == [
        "checkpoint_start", "checkpoint_scheduled", "checkpoint_end", "checkpoint_worker"]
    assert scheduled["plan_s"] >= 0.03 and scheduled["stage_s"] >= 0.02  # each its own sleep, or more
    assert scheduled["plan_s"] + scheduled["stage_s"] == pytest.approx(scheduled["mono"] - start["mono"], abs=1e-3)
    assert 0.02 <= end["waited_s"] <= waited
    step = _records(tmp_path)[-1]
    assert step["type"] == "step" and step["blocked_s"] == end["waited_s"]
    assert end["ok"] and end["written"] == pytest.approx(stamp, abs=1e-6) and stamp < end["mono"]  # µs in the journal
    assert worker["alive"] is False and worker["worker_pid"] is None


def test_an_async_save_is_durable_when_its_future_completes_not_when_its_block_ends(tmp_path):
    slo = _hooks(tmp_path)
    future: concurrent.futures.Future = concurrent.futures.Future()
    with slo.checkpoint(7, mode="async") as save:
        assert save.track(future) is future
    assert [r["type"] for r in _save_records(tmp_path)] == ["checkpoint_start", "checkpoint_scheduled"]
    time.sleep(0.05)
    finished = time.monotonic()
    future.set_result(None)
    end = _save_records(tmp_path)[-1]
    assert end["type"] == "checkpoint_end" and end["ok"]
    assert abs(end["written"] - finished) < 0.01 and end["written"] - _save_records(tmp_path)[1]["mono"] >= 0.05


def test_a_torch_future_that_fails_ends_the_save_failed_with_its_error(tmp_path):
    slo = _hooks(tmp_path)
    future: torch.futures.Future = torch.futures.Future()
    with slo.checkpoint(9, mode="async") as save:
        save.track(future)
    future.set_exception(OSError("bucket gone"))
    end = _save_records(tmp_path)[-1]
    assert end["type"] == "checkpoint_end" and not end["ok"] and "bucket gone" in end["error"]


def test_a_save_that_completes_inside_its_block_still_ends_after_it_is_scheduled(tmp_path):
    slo = _hooks(tmp_path)
    with slo.checkpoint(3, mode="async") as save:
        done = save.completion()
        done()  # e.g. a finalize function run synchronously inside the save call
    assert [r["type"] for r in _save_records(tmp_path)] == ["checkpoint_start", "checkpoint_scheduled",
                                                            "checkpoint_end"]


def test_a_save_call_that_raises_ends_failed_and_the_exception_reaches_the_caller(tmp_path):
    slo = _hooks(tmp_path)
    with pytest.raises(RuntimeError, match="planner"):
        with slo.checkpoint(4):
            raise RuntimeError("planner failed")
    start, end = _save_records(tmp_path)
    assert end["type"] == "checkpoint_end" and not end["ok"] and "planner failed" in end["error"]


def test_completion_from_another_thread_is_written_once(tmp_path):
    slo = _hooks(tmp_path)
    with slo.checkpoint(2, mode="async") as save:
        done = save.completion()
    threads = [threading.Thread(target=done) for _ in range(8)] + [threading.Thread(target=save.failed, args=("x",))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["type"] for r in _save_records(tmp_path)].count("checkpoint_end") == 1


def test_a_result_that_cannot_be_tracked_is_a_warning_and_the_save_ends_with_its_block(tmp_path):
    slo = _hooks(tmp_path)
    with slo.checkpoint(1, mode="async") as save:
        save.track(object())
    records = _records(tmp_path)
    assert any(r["type"] == "warning" and "cannot track" in r["message"] for r in records)
    assert records[-1]["type"] == "checkpoint_end" and records[-1]["ok"]


def test_nothing_raises_into_training_when_the_journal_cannot_be_written(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    slo = Hooks(Journal(blocker / "journal", Writer.from_env({"RANK": "0"})))
    future: concurrent.futures.Future = concurrent.futures.Future()
    with slo.checkpoint(1, mode="async") as save:
        save.track(future)
    future.set_result(None)
    assert slo.journal.errors >= 3 and slo.journal.written == 0


# --- end to end: the user's own stack, the sidecar's engine, ground truth from the test -----------


@pytest.fixture
def one_rank():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", WORLD_SIZE="1")
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def _train(slo: Hooks, steps: int, save, every: int) -> dict[int, float]:
    """Run ``steps`` steps of ~20 ms; save after each ``every``-th. Returns each step's work as the
    test measured it (its own clock, around the hooks' span)."""
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    work = {}
    for step in range(steps):
        t0 = time.monotonic()
        with slo.step(step) as s:
            with s.compute():
                model(torch.randn(8, 64)).sum().backward()
                time.sleep(0.02)
            with s.optimizer():
                opt.step()
                opt.zero_grad()
        work[step] = time.monotonic() - t0
        if (step + 1) % every == 0:
            save({"model": model.state_dict()}, step)
    return work


def _productive(journal_dir: Path) -> tuple[float, float]:
    engine = Engine(reorder_window_s=0.0)  # one process's file, read in order: apply at once
    tail = JournalTail(journal_dir)
    tail.poll(lambda events: [engine.ingest(e) for e in events])
    tail.close()
    snap = engine.snapshot(time.monotonic() + 60, time.time() + 60)  # past every reorder window
    return snap.seconds.get(Category.PRODUCTIVE, 0.0), snap.ranks[0].unprotected_s


def _durable_steps(root: Path) -> list[int]:
    """DCP's commit marker: ``.metadata`` is written last, once every rank's data landed."""
    return sorted(int(p.parent.name.split("-")[1]) for p in root.glob("step-*/.metadata"))


def _check(work: dict[int, float], durable: list[int], productive: float) -> None:
    kept = sum(w for step, w in work.items() if step <= max(durable))
    assert abs(productive - kept) < 0.002 * len(work), (productive, kept)
    after = sum(w for step, w in work.items() if step > max(durable))
    assert after > 0 and productive < sum(work.values()) - after / 2, "steps after the last durable save wait"


def test_plain_dcp_async_save_with_the_hooks_gives_the_productive_time_the_test_measured(tmp_path, one_rank):
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))
    pg = dist.new_group(backend="gloo")  # DCP's advice: a separate group for background saves
    responses = []

    def save(state, step):
        with slo.checkpoint(step, mode="async") as s:
            responses.append(s.track(dcp.async_save(state, checkpoint_id=str(tmp_path / f"step-{step:06d}"),
                                                    process_group=pg)))

    work = _train(slo, 23, save, every=5)
    for response in responses:
        getattr(response, "upload_completion", response).result(timeout=60)
    slo.close()
    durable = _durable_steps(tmp_path)
    assert durable == [4, 9, 14, 19]
    ends = [r for r in _records(tmp_path) if r["type"] == "checkpoint_end"]
    assert [e["step"] for e in ends] == durable and all(e["ok"] for e in ends)
    productive, unprotected = _productive(tmp_path / "journal")
    _check(work, durable, productive)
    assert unprotected > 0.05


def test_plain_dcp_save_with_the_hooks_gives_the_productive_time_the_test_measured(tmp_path, one_rank):
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))

    def save(state, step):
        with slo.checkpoint(step):
            dcp.save(state, checkpoint_id=str(tmp_path / f"step-{step:06d}"))

    work = _train(slo, 13, save, every=4)
    slo.close()
    durable = _durable_steps(tmp_path)
    assert durable == [3, 7, 11]
    productive, _ = _productive(tmp_path / "journal")
    _check(work, durable, productive)


@pytest.mark.slow
@pytest.mark.nvrx
def test_nvrx_public_async_api_with_the_hooks_gives_the_productive_time_the_test_measured(tmp_path, one_rank):
    from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import save_state_dict_async_finalize

    from nvrx_slo.trainer.reference import cpu_shims, nvrx_async

    api = nvrx_async.async_checkpointing()
    cpu_shims.apply(api)  # NVRx's CUDA assumptions, as any CPU-only user must bypass them
    queue = api.AsyncCallsQueue(persistent=True, **cpu_shims.queue_kwargs(api))
    slo = Hooks.start(world_size=1, journal_dir=str(tmp_path / "journal"))

    def finalize(planned):
        if cpu_shims.needed():  # from 0.5 NVRx's finalize broadcasts its verdict from a CUDA device
            assert nvrx_async.finalize_save(planned) is None
        else:
            save_state_dict_async_finalize(*planned)

    def save(state, step):
        with slo.checkpoint(step, mode="async") as s:
            writer = api.FileSystemWriterAsync(str(tmp_path / f"step-{step:06d}"), thread_count=1)
            planned = api.save_state_dict_async_plan(state, writer)
            write, preload, args = writer.get_save_function_and_args()
            args = list(args)
            args[1] = nvrx_async.write_buckets(preload, args)  # built here: NVRx's preload syncs CUDA
            request = api.AsyncRequest(write, tuple(args), [lambda: finalize(planned)])
            queue.schedule_async_request(request._replace(finalize_fns=[*request.finalize_fns, s.completion()]))
        with slo.checkpoint_wait():  # the README's way: every poll is the save's cost
            queue.maybe_finalize_async_calls(blocking=False)

    try:
        work = _train(slo, 18, save, every=5)
        with slo.checkpoint_wait():
            queue.maybe_finalize_async_calls(blocking=True)
    finally:
        queue.close()
    slo.close()
    durable = _durable_steps(tmp_path)
    assert durable == [4, 9, 14]
    ends = [r for r in _records(tmp_path) if r["type"] == "checkpoint_end"]
    assert all(e["waited_s"] > 0 for e in ends[-1:])  # the last save, finalized by the blocking poll
    productive, _ = _productive(tmp_path / "journal")
    _check(work, durable, productive)
