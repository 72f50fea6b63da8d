"""The reference job's checkpoint saves (NVRx async or plain synchronous DCP).

Each save of step N goes to ``<root>/step-NNNNNN/``. It is observed through the public hooks
(``Hooks.checkpoint``: ``CheckpointSave``), as any user's own checkpointing would be, which journal
on every rank:

* ``checkpoint_start`` when the save call begins (training blocked from here),
* ``checkpoint_scheduled`` when the call returns (``plan_s`` planning, ``stage_s`` staging and
  hand-off to the writer, ``bytes`` this rank's tensor and byte payload),
* every poll of the writer while a save is in flight (``Hooks.checkpoint_wait``: NVRx's finalize,
  the metadata gather/write, the agreement on success) as that save's blocking, however short,
  without a record per poll (``nvrx_slo.trainer.saves``),
* ``checkpoint_end`` once its outcome is known, with ``written``: the monotonic instant the
  background write itself finished, stamped by the writer process (``write_stamp``), not when
  the trainer happened to notice, and ``waited_s``: the polls charged to it,
* ``checkpoint_worker`` when NVRx's persistent writer process is seen alive or dead.

A checkpoint is complete when DCP's ``.metadata`` exists: the coordinator writes it (atomically)
only after every rank's data landed (``restore.py`` loads the newest complete one).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue as queue_module
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import MetadataIndex

from nvrx_slo import CheckpointSave, Hooks
from nvrx_slo.trainer.reference import cpu_shims, nvrx_async, write_stamp

log = logging.getLogger("nvrx_slo.checkpoint")

# DCP's CheckpointException derives from BaseException, not Exception.
_SAVE_ERRORS = (Exception, dcp.CheckpointException)

# An in-process restart waits this long at most for the writer to finish saves it abandoned, then
# replaces it: below the Wrapper's soft timeout (60 s), which a main thread blocked here would trip.
ABANDONED_WAIT_S = 20.0
REHEARSAL = ".nvrx-slo-rehearsal"  # ready()'s save that writes nothing; never a step-* checkpoint
METADATA = ".metadata"  # written last, by DCP's coordinator: its presence marks a complete checkpoint


def checkpoint_id(step: int) -> str:
    return f"step-{step:06d}"


def _warm_up(*_: Any) -> None:
    """The writer process's first job, run as its preload so that scheduling it returns only once the
    writer runs: import what real saves need (torch, NVRx's writer), so no save waits for the
    writer's start-up or is charged an import."""
    nvrx_async.async_checkpointing()


def _rehearsal_write(*_: Any, **__: Any) -> None:
    """A rehearsal's write (``Checkpointer.ready``, on a GPU host): the writer ran the save's preload
    before it, which is what the rehearsal is for; nothing is written."""


def _warm_results_queue(api: Any) -> None:
    if api.get_results_queue is None:
        return
    results = api.get_results_queue()
    results.put(MetadataIndex("nvrx-slo warm-up"))
    results.get()


def _payload_bytes(write_buckets: list[Any]) -> int:
    total = 0
    for _, _, (bytes_data, tensor_data) in write_buckets:
        total += sum(tensor.numel() * tensor.element_size() for _, tensor in tensor_data)
        total += sum(data.getbuffer().nbytes for _, data in bytes_data if hasattr(data, "getbuffer"))
    return total


@dataclasses.dataclass
class _Pending:
    save: CheckpointSave
    path: Path
    rank: int
    error: str | None = None
    finalized: bool = False


class CheckpointWorkerDied(RuntimeError):
    """NVRx's persistent writer process died: saves in flight are lost and no later save can land.

    Raised by ``poll`` so the job restarts (ft_launcher) instead of hanging in a collective.
    """


class Checkpointer:
    """Saves ``state_dict`` every time ``save`` is called; ``poll`` between steps; ``close`` at the end.

    ``mode="async"`` uses NVRx (``FileSystemWriterAsync`` + ``save_state_dict_async_plan`` +
    ``AsyncCallsQueue(persistent=True)``); ``mode="sync"`` a plain ``torch.distributed.checkpoint.save``.
    Async needs NVRx's async API; without it the checkpointer says so once and saves synchronously.
    ``slow_storage_s`` is fault injection: every write takes that much longer (in the background
    for async saves, blocking for sync ones).
    """

    def __init__(self, hooks: Hooks, root: str | os.PathLike[str], mode: str = "async",
                 slow_storage_s: float = 0.0) -> None:
        if mode not in ("async", "sync"):
            raise ValueError(f"checkpoint mode must be 'async' or 'sync', got {mode!r}")
        self.hooks = hooks
        self.root = Path(root)
        self.slow_storage_s = slow_storage_s
        self._api = nvrx_async.async_checkpointing() if mode == "async" else None
        self.mode = "async" if self._api is not None else "sync"
        self._queue: Any = None
        self._pending: dict[int, _Pending] = {}
        self._worker_alive: bool | None = None
        self._warming: threading.Thread | None = None
        self._warm_up_error: Exception | None = None
        self._stale = False  # saves were abandoned: the writer may still owe their completions
        self._stager = cpu_shims.Stager()
        if self._api is not None:
            cpu_shims.apply(self._api)

    @property
    def in_flight(self) -> int:
        """Saves handed to the writer and not finalized yet."""
        return len(self._pending)

    # --- async lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start NVRx's persistent writer and warm its result queue in the background: call it as soon
        as the process group exists, and ``ready()`` before the first step, so that the writer's
        start-up (spawn, imports, CUDA context: seconds on a GPU host) overlaps building the model
        and restoring, and no save waits for it. Local to this rank.

        A thread schedules the writer's first job (``_warm_up``, as a preload: scheduling returns
        once the writer runs it), then sends a torch object once through NVRx's result queue, whose
        manager process would otherwise import torch while the first save's results wait.
        """
        if self._api is None:
            return
        if self._pending:  # nobody abandoned them when the last incarnation failed
            self.abandon("left over from an earlier incarnation")
        if self._queue is not None and self._stale:
            self._join_warm_up()  # it schedules on the queue the clean-up reads
            self._clear_abandoned()  # may stop a stuck writer: a fresh one starts below
        if self._queue is not None:
            return
        self._queue = self._api.AsyncCallsQueue(persistent=True, **cpu_shims.queue_kwargs(self._api))
        cpu_shims.results_queue(self._api)  # here, not in the thread: the manager dies with its creating thread
        self._warming = threading.Thread(target=self._warm_up_writer, args=(self._queue, self._api), daemon=True,
                                         name="nvrx-slo-checkpoint-warm-up")
        self._warming.start()

    def _warm_up_writer(self, queue: Any, api: Any) -> None:
        try:
            queue.schedule_async_request(api.AsyncRequest(_warm_up, (None, None), [], preload_fn=_warm_up))
            _warm_results_queue(api)
        except Exception as exc:  # ready() raises it in the training thread
            self._warm_up_error = exc

    def ready(self, state_dict: dict[str, Any] | Callable[[], dict[str, Any]] | None = None) -> None:
        """Wait until the writer ``start`` started runs, finalize its first job and, given the
        state a save will write (or the function that gathers it), rehearse a save of it without
        writing: plan it (the first plan pays imports and allocations later ones do not) and stage
        it: on a CPU host in the staging buffers saves then reuse, on a GPU host by the writer's
        own preload (its first allocates pinned host buffers and opens CUDA IPC handles), handed
        to the writer with a write that writes nothing. The first save then costs what a later one
        does. Collective: call it on every rank, at the end of
        initialisation. Raises ``CheckpointWorkerDied`` if the writer died starting (a thread still
        waiting for it is left behind: it is a daemon)."""
        if self._queue is None:
            return
        self._join_warm_up()
        self._check_worker()
        while self._queue.async_calls and not self._pending and not self._stale:  # the warm-up job, before any save
            self._queue.maybe_finalize_async_calls(blocking=False)  # a verdict every rank shares
            if self._queue.async_calls:
                time.sleep(0.01)
                self._check_worker()
        if state_dict is not None:
            self._rehearse(state_dict() if callable(state_dict) else state_dict)

    def _rehearse(self, state_dict: dict[str, Any]) -> None:
        api = self._api
        assert api is not None  # async mode
        path = self.root / REHEARSAL
        try:
            writer = api.FileSystemWriterAsync(str(path), thread_count=1)
            api.save_state_dict_async_plan(state_dict, writer)  # creates the directory on every rank
            _, preload, args = writer.get_save_function_and_args()
            if cpu_shims.needed():
                buckets = nvrx_async.write_buckets(preload, list(args))
                if buckets is not None:
                    self._stager.stage(buckets, reuse=False)
            elif preload is not None:  # the writer preloads: its first time, here and not in the first save
                self._queue.schedule_async_request(api.AsyncRequest(_rehearsal_write, tuple(args), [],
                                                                    preload_fn=preload))
                self._queue.maybe_finalize_async_calls(blocking=True)  # every rank: ready() is collective
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def _join_warm_up(self) -> None:
        warming = self._warming
        if warming is None:
            return
        while warming.is_alive():
            warming.join(0.1)
            self._check_worker()  # a writer that died starting never runs its first job
        self._warming = None
        error, self._warm_up_error = self._warm_up_error, None
        if error is not None:
            raise RuntimeError(f"starting the NVRx checkpoint writer failed: {error}") from error

    def _worker(self) -> Any:
        caller = getattr(self._queue, "persistent_caller", None)
        return getattr(caller, "process", None)

    def _check_worker(self) -> None:
        process = self._worker()
        if process is None or process.pid is None:  # none yet, or the warm-up thread is starting it
            return
        alive = process.is_alive()
        if alive != self._worker_alive:
            self._worker_alive = alive
            self.hooks.checkpoint_worker(alive, process.pid)
        if not alive:
            for pending in self._pending.values():
                pending.save.failed("checkpoint worker died")
            self._pending.clear()
            raise CheckpointWorkerDied(f"NVRx checkpoint worker (pid {process.pid}) exited "
                                       f"with code {process.exitcode}")

    # --- saving -------------------------------------------------------------------------------

    def save(self, state_dict: dict[str, Any] | Callable[[], dict[str, Any]], step: int) -> None:
        """Save ``state_dict`` as the checkpoint of ``step``. Collective: call on every rank.

        Pass the function that gathers it (e.g. ``get_state_dict``) to have that time counted as
        the save's blocking time, where it belongs."""
        ckpt = checkpoint_id(step)
        path = self.root / ckpt
        with self.hooks.checkpoint(step, ckpt, mode=self.mode) as save:
            if self.mode == "sync":
                self._save_sync(state_dict() if callable(state_dict) else state_dict, save, path)
                return
            try:
                self._save_async(state_dict() if callable(state_dict) else state_dict, save, path)
            except BaseException:  # a fault mid-save (a peer died): the block ends it, failed
                self._stale = True  # it may have reached the writer
                raise

    def _save_sync(self, state_dict: dict[str, Any], save: CheckpointSave, path: Path) -> None:
        try:
            time.sleep(self.slow_storage_s)
            dcp.save(state_dict, checkpoint_id=str(path))
        except _SAVE_ERRORS as exc:  # DCP raises the same failure on every rank
            save.failed(exc)
        save.bytes = sum(t.numel() * t.element_size() for t in _local_tensors(state_dict))

    def _save_async(self, state_dict: dict[str, Any], save: CheckpointSave, path: Path) -> None:
        api = self._api
        assert api is not None  # async mode
        if self._queue is None:
            self.start()
        self.ready()
        rank = dist.get_rank()
        writer = api.FileSystemWriterAsync(str(path), thread_count=1)
        planned = api.save_state_dict_async_plan(state_dict, writer)
        save.planned()
        write, preload, args = writer.get_save_function_and_args()
        args = list(args)
        if cpu_shims.needed():  # on a GPU host the worker builds (0.6+) and preloads the buckets itself
            buckets = nvrx_async.write_buckets(preload, args)
            if buckets is not None:
                args[1] = self._stager.stage(buckets, reuse=not self._pending and not self._stale)
                preload = None
        save.bytes = (_payload_bytes(args[1]) if len(args) > 1 and args[1] is not None
                      else sum(t.numel() * t.element_size() for t in _local_tensors(state_dict)))
        save.completion()  # durable once finalized: ``poll`` ends it with the writer's stamp
        pending = _Pending(save, path, rank)

        def finalize() -> None:  # NVRx calls it in the training thread once every rank's write is done
            pending.error = nvrx_async.finalize_save(planned)
            pending.finalized = True

        stamped = write_stamp.StampedWrite(write, str(write_stamp.path(path, rank)), self.slow_storage_s)
        request = api.AsyncRequest(stamped, tuple(args), [finalize], preload_fn=preload)
        index = self._queue.schedule_async_request(request)
        self._pending[index] = pending

    def poll(self, blocking: bool = False) -> None:
        """Finalize saves whose background write is done on every rank (``blocking``: wait for all).
        Collective; call between steps (outside ``hooks.step``), on every rank, the same number of
        times. Each round is one all-reduce whose verdict every rank shares, so ranks leave a
        blocking wait together. Raises ``CheckpointWorkerDied`` if the writer is gone."""
        if self._queue is None:
            return
        if not self._pending:
            self._check_worker()
            return
        with self.hooks.checkpoint_wait():  # every poll is the oldest save's cost, however short
            self._check_worker()
            while True:  # NVRx's own blocking wait never notices a dead writer: poll, and look
                self._queue.maybe_finalize_async_calls(blocking=False)
                if not blocking or all(p.finalized for p in self._pending.values()):
                    break
                time.sleep(0.05)
                self._check_worker()
            now = time.monotonic()
            # NVRx 0.4.1 returns call index 0 for every finalized call: trust our own flags instead
            for index in [i for i, p in self._pending.items() if p.finalized]:
                pending = self._pending.pop(index)
                if pending.error is None:
                    pending.save.done(written=write_stamp.read(pending.path, pending.rank, now))
                else:
                    pending.save.failed(pending.error)

    def abandon(self, reason: str) -> None:
        """After a fault (in-process restart; call it from the Wrapper's ``finalize``): give up on
        saves in flight, at once and without any collective. Each is journaled as failed; the writer
        keeps running, and the next ``start`` clears what it still owes before the next save."""
        for pending in self._pending.values():
            pending.save.failed(f"abandoned: {reason}")
            write_stamp.read(pending.path, pending.rank, 0.0)  # removes the stamp if the write got that far
        self._pending.clear()
        self._stale = self._queue is not None

    def _clear_abandoned(self) -> None:
        """Wait for the writer to finish what it was handed before the fault and drop the results,
        so completions of abandoned saves are never taken for the next save's. A writer that does
        not finish within ``ABANDONED_WAIT_S`` is replaced by a fresh one."""
        caller = self._queue.persistent_caller
        outstanding = len(self._queue.async_calls) - (1 if caller.cur_item is not None else 0)
        deadline = time.monotonic() + ABANDONED_WAIT_S
        replace = False
        for _ in range(outstanding):
            try:
                caller.comp_q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue_module.Empty:
                replace = True
                break
        if replace:
            self.hooks.warning(f"the checkpoint writer did not finish abandoned saves in {ABANDONED_WAIT_S:g} s; "
                               "replacing it")
            self.kill()
        else:
            caller.cur_item = None
            self._queue.async_calls.clear()
        assert self._api is not None  # only async saves are abandoned
        results = self._api.results_queue_module._results_queue
        while results is not None:
            try:
                results.get_nowait()
            except queue_module.Empty:
                break
        self._stale = False

    def close(self) -> None:
        """Finish saves in flight (blocking) and stop the writer. Collective."""
        if self._queue is None:
            return
        try:
            self.poll(blocking=True)
        except CheckpointWorkerDied:
            self.kill()  # NVRx's own close would wait forever for the dead writer
            raise
        self._queue.close()
        self._queue = None
        self._worker_stopped()

    def kill(self) -> None:
        """On the way out after a fault: abandon saves in flight and stop the writer now, without
        any collective (a live non-daemon worker would keep this process from exiting)."""
        if self._queue is None:
            return
        self.abandon("process exiting after a fault")
        process = self._worker()
        if process is not None and process.is_alive():
            process.kill()
            process.join(timeout=10)
        # With nothing left to finalize and no process, NVRx's own close/__del__ (at garbage
        # collection) neither waits for the dead worker nor enters a collective.
        self._queue.async_calls.clear()
        if self._queue.persistent_caller is not None:
            self._queue.persistent_caller.process = None
        self._queue = None
        self._worker_stopped()

    def _worker_stopped(self) -> None:
        if self._worker_alive:
            self._worker_alive = False
            self.hooks.checkpoint_worker(False, None)


def _local_tensors(state_dict: Any) -> list[torch.Tensor]:
    if isinstance(state_dict, dict):
        return [t for value in state_dict.values() for t in _local_tensors(value)]
    if isinstance(state_dict, (list, tuple)):
        return [t for value in state_dict for t in _local_tensors(value)]
    if isinstance(state_dict, torch.Tensor):
        local = state_dict.to_local() if hasattr(state_dict, "to_local") else state_dict
        return [local]
    return []
