"""The GPU check's sections (c) and (d) (``gpu_check.py``): blocking per save on every save path, and
restart latency by phase.

(c) Each path saves three times, after 10 steps each, with a poll (or a wait on the previous upload)
after every step; the truth is the loop's own clock around its save and poll calls, after waiting
for the steps' queued GPU work (theirs), every wait charged to the oldest save in flight, as the
hooks do. Paths: ``dcp.save``, ``dcp.async_save``, NVRx async through the reference Checkpointer,
and the README's NVRx pattern on NVRx's own ``AsyncCallsQueue``: its polls wrapped in
``checkpoint_wait()``, bare on a queue handed to ``Hooks.checkpoint_queue``, and bare on a queue
the hooks never saw (the contrast: every poll missing from the journal).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from gpu_check_parts import CUDA, engine, row, timed  # bench/, this script's directory

from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.reference import cpu_shims, harness, nvrx_async
from nvrx_slo.trainer.reference.checkpoint import Checkpointer

README = ("NVRx README, wrapped", "NVRx README, handed over", "NVRx README, unwrapped")
WRITE_S = 0.05  # a README save's background write: done within the 10 steps to the next save


def saves(work: Path, stream: Any, state_mib: int) -> None:
    device = "cuda" if CUDA else "cpu"
    dist.init_process_group("nccl" if CUDA else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        state = {f"t{i}": torch.randn(4 * 1024 * 1024, device=device) for i in range(state_mib // 16)}  # 16 MiB each
        for path in ("dcp.save", "dcp.async_save", "NVRx async", *README):
            _save_path(work / f"c-{path.replace(' ', '-').replace(',', '')}", path, state, stream)
    finally:
        dist.destroy_process_group()


def _queue(hooks: Hooks, path: str) -> tuple[Any, Callable[[bool], None]]:
    """NVRx's own queue, its writer started, and the README's poll of it along ``path``."""
    api = nvrx_async.async_checkpointing()
    assert api is not None, "NVRx's async checkpointing is missing"
    cpu_shims.apply(api)
    queue = api.AsyncCallsQueue(persistent=True, **cpu_shims.queue_kwargs(api))
    queue.schedule_async_request(api.AsyncRequest(time.sleep, (0.0,), []))  # start the writer before the loop
    queue.maybe_finalize_async_calls(blocking=True)
    if path == "NVRx README, handed over":
        queue = hooks.checkpoint_queue(queue)

    def poll(blocking: bool) -> None:
        if path == "NVRx README, wrapped":
            with hooks.checkpoint_wait():
                queue.maybe_finalize_async_calls(blocking=blocking)
        else:
            queue.maybe_finalize_async_calls(blocking=blocking)

    return queue, poll


def _save_path(directory: Path, path: str, state: dict[str, torch.Tensor], stream: Any) -> None:
    hooks = Hooks.start(world_size=1, journal_dir=str(directory / "journal"))
    ckpt = Checkpointer(hooks, directory / "ckpt", "async") if path == "NVRx async" else None
    group = dist.new_group(backend="gloo") if path == "dcp.async_save" else None
    queue, poll = _queue(hooks, path) if path in README else (None, None)
    uploads: list[Any] = []  # dcp.async_save's responses not waited for yet
    in_flight: list[str] = []
    truth: dict[str, float] = {}
    if ckpt is not None:
        ckpt.start()
        ckpt.ready(state)

    def wait_upload() -> None:
        with hooks.checkpoint_wait():
            getattr(uploads[0], "upload_completion", uploads[0]).result()
        uploads.pop(0)

    def save(step: int, ckpt_id: str) -> None:
        if ckpt is not None:
            ckpt.save(state, step)
        elif queue is not None:
            api = nvrx_async.async_checkpointing()
            assert api is not None
            with hooks.checkpoint(step, ckpt_id, mode="async") as s:
                queue.schedule_async_request(api.AsyncRequest(time.sleep, (WRITE_S,), [s.completion()]))
        elif group is None:
            with hooks.checkpoint(step, ckpt_id):
                dcp.save(state, checkpoint_id=str(directory / "ckpt" / ckpt_id))
        else:
            with hooks.checkpoint(step, ckpt_id, mode="async") as s:
                uploads.append(s.track(dcp.async_save(state, checkpoint_id=str(directory / "ckpt" / ckpt_id),
                                                      process_group=group)))

    def finish_waits(blocking: bool) -> None:
        """The loop's waits after a step: charged to the oldest save in flight, which they may end."""
        charge = in_flight[0] if in_flight else None
        if ckpt is not None:
            timed(lambda: ckpt.poll(blocking=blocking), truth, charge)
            del in_flight[:max(0, len(in_flight) - ckpt.in_flight)]
        elif queue is not None and poll is not None:
            timed(lambda: poll(blocking), truth, charge)
            del in_flight[:max(0, len(in_flight) - queue.get_num_unfinalized_calls())]
        elif uploads and (blocking or len(uploads) > 1):  # wait before a second one is made
            timed(wait_upload, truth, in_flight.pop(0))

    for step in range(30):
        with hooks.step(step) as s:
            with s.compute():
                stream.run(0.01)
                if not CUDA:
                    stream.synchronize()  # the simulated steps take the host's time too
        finish_waits(blocking=False)
        if (step + 1) % 10 == 0:
            ckpt_id = f"step-{step:06d}"
            truth[ckpt_id] = 0.0
            timed(lambda: save(step, ckpt_id), truth, ckpt_id)  # noqa: B023 (called at once)
            if group is not None or ckpt is not None or queue is not None:
                in_flight.append(ckpt_id)
    while in_flight:
        finish_waits(blocking=True)
    if ckpt is not None:
        ckpt.close()
    if queue is not None:
        queue.close()
    with hooks.step(30):  # carries the last wait
        pass
    hooks.close()
    journaled = {c.ckpt: c.blocking_s for c in engine(directory / "journal").history().checkpoints}
    errors = [1e3 * (journaled[c] - t) for c, t in truth.items()]
    _verdict(path, errors, truth)


def _verdict(path: str, errors: list[float], truth: dict[str, float]) -> None:
    # the median save: what a definition gets wrong (polls left out) moves every save, while the
    # scheduler preempting the loop between its clock and the hooks' moves one (-5.4 ms once, CPU, load 3)
    typical = statistics.median(errors)
    if path == "NVRx README, unwrapped":
        target, verdict = "-", "the polls a handed-over queue books"
    elif path in README:
        target, verdict = "median save within 1 ms", "ok" if abs(typical) <= 1 else "OFF"
    else:
        target, verdict = "median save within 5 ms", "ok" if abs(typical) <= 5 else "OFF"
    row("c", f"{path}: blocking per save, journal vs the loop's clock ({len(errors)} saves)",
        f"{1e3 * statistics.fmean(truth.values()):.1f} ms per save; journal - loop: "
        + ", ".join(f"{e:+.2f}" for e in errors) + " ms", target, verdict,
        path=path, errors_ms=errors, blocking_ms=[1e3 * t for t in truth.values()])


# --- (d) restart latency by phase ---------------------------------------------------------------------


def restarts(work: Path) -> None:
    device = harness.CPU
    if CUDA:
        device = harness.DemoDevice("cuda", torch.cuda.device_count(), 50, 10, harness.DEFAULT_FAULTS, timeout_s=300)
    result = harness.run_demo(work / "d", device=device, steps=device.steps, checkpoint_every=device.checkpoint_every,
                           faults=device.faults, timeout_s=device.timeout_s)
    if result.returncode != 0:
        row("d", "the reference job", f"exit {result.returncode}; see {result.log_path}", "exit 0", "OFF")
        return
    for record in engine(result.journal_dir).history().restarts:
        parts = ", ".join(f"{phase.value} {seconds:.2f}" for phase, seconds in record.phases.items())
        row("d", f"{record.level.value} restart on {device.ranks} {device.kind} rank(s)",
            f"{record.duration_s:.2f} s ({parts})", "recovery SLO: < 10 s", "measured",
            level=record.level.value, seconds=record.duration_s,
            phases={phase.value: seconds for phase, seconds in record.phases.items()})
