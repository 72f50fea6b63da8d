"""The CPU-only shims of NVRx's async checkpointing, in one place, applied only when CUDA is absent.

NVRx's async checkpointing and its in-process Wrapper assume a GPU in the places below (0.4.1 to
0.7). On a CPU-only host (CI, the demo) these shims make the reference job's code path run with
gloo; on a GPU host each does nothing and NVRx runs unmodified. Nothing is patched on disk: two
methods are replaced in memory, and one attribute of a built Wrapper.

1. ``AsyncCaller.sync_all_async_calls`` puts its "still writing?" flag on
   ``torch.cuda.current_device()`` before an all-reduce  -> the flag lives on the CPU.
2. ``AsyncRequest.execute_finalize_fns`` does the same with its call-index check
   -> the index lives on the CPU.
3. NVRx's preload (``FileSystemWriterAsync.preload_tensors(..., non_blocking=True)``) calls
   ``torch.cuda.synchronize()``, and on CPU its ``.to("cpu")`` returns the *same* tensor, which
   the spawned worker then reads after training has changed it: the save is not a snapshot.
   ``Stager`` replaces the preload: it copies every tensor once, in the training thread (counted
   as blocking time), into reused shared-memory buffers, and the request carries no preload.

4. NVRx creates its write-result queue in a *spawned* manager process (spawn keeps CUDA contexts out
   of children), which must import torch to unpickle the first results: seconds on a busy CPU host,
   in the first save or the restart path. Without CUDA there is no context to protect:
   ``results_queue`` forks that manager instead (it inherits the imports) and has the kernel end
   it with its trainer (``PR_SET_PDEATHSIG``), which a SIGKILLed rank could not do itself. The
   signal follows the creating *thread*: call it from the training thread.

5. From 0.6 the persistent writer selects a CUDA device at start-up unless the queue is built in
   ``cpu_shm_mode`` (``queue_kwargs``).

6. From 0.5 ``inprocess.Wrapper`` chains GPU and NVLink (and NIC) checks into its
   ``restart_health_check`` whenever ``LOCAL_RANK`` is set; without a driver they fail and the rank
   terminates instead of restarting (``without_gpu_health_checks``).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import multiprocessing
import os
import signal
from multiprocessing.managers import SyncManager
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from nvrx_slo.trainer.reference import nvrx_async

log = logging.getLogger("nvrx_slo.cpu_shims")


@functools.cache
def needed() -> bool:
    return not torch.cuda.is_available()


def _sync_all_async_calls(self: Any, is_alive: int) -> bool:
    flag = torch.tensor([is_alive], dtype=torch.int)
    dist.all_reduce(flag)
    return bool(flag[0] == 0)


def _execute_finalize_fns(self: Any, validate_matching_call_idx: bool = True) -> int:
    for finalize_fn in self.finalize_fns:
        finalize_fn()
    if validate_matching_call_idx:
        index = torch.tensor([self.call_idx], dtype=torch.int)
        dist.all_reduce(index, op=dist.ReduceOp.MAX)
        if index.item() != self.call_idx:
            raise RuntimeError("unmatched async checkpoint calls: not all ranks finalize the same save")
    return int(self.call_idx)


_applied: list[str] = []


def apply(api: SimpleNamespace) -> list[str]:
    """Install shims 1 and 2 on NVRx's classes when CUDA is absent; return their names."""
    if not needed() or _applied:
        return list(_applied)
    api.AsyncCaller.sync_all_async_calls = _sync_all_async_calls
    api.AsyncRequest.execute_finalize_fns = _execute_finalize_fns
    _applied[:] = ["AsyncCaller.sync_all_async_calls", "AsyncRequest.execute_finalize_fns"]
    log.info("nvrx-slo: no CUDA; NVRx async checkpointing runs with CPU shims: %s", ", ".join(_applied))
    return list(_applied)


def _die_with_parent(parent: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def results_queue(api: SimpleNamespace) -> None:
    """Shim 4: NVRx's module-level result queue from a forked manager, if none exists yet."""
    module = api.results_queue_module
    if needed() and getattr(module, "_results_queue", None) is None:
        manager = SyncManager(ctx=multiprocessing.get_context("fork"))
        manager.start(_die_with_parent, (os.getpid(),))
        module._results_queue = manager.Queue()
        _managers.append(manager)  # kept alive for the process's lifetime, like NVRx's own


_managers: list[SyncManager] = []


class Stager:
    """Shim 3: private copies of the tensors a save writes, in shared memory kept across saves.

    One ``copy_`` per tensor, in the training thread (blocking time). The buffers are allocated in
    shared memory once and reused, so later saves pay a memcpy, not page faults, and handing them
    to NVRx's spawned writer passes file descriptors instead of copying again. A buffer is reused
    only when no earlier save can still be reading it (``reuse=False`` allocates fresh ones). It
    holds one extra copy of the rank's checkpointed state in host memory, like NVRx's pinned
    buffers on GPU hosts.
    """

    def __init__(self) -> None:
        self._buffers: dict[Any, torch.Tensor] = {}

    def stage(self, write_buckets: list[Any], reuse: bool) -> list[Any]:
        if not reuse:
            self._buffers = {}
        staged = []
        for file_name, storage_key, (bytes_data, tensor_data) in write_buckets:
            copies = []
            for item, tensor in tensor_data:
                buffer = self._buffers.get(item.index)
                if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
                    buffer = torch.empty(tensor.shape, dtype=tensor.dtype).share_memory_()
                    self._buffers[item.index] = buffer
                copies.append((item, buffer.copy_(tensor.detach())))
            staged.append((file_name, storage_key, (bytes_data, copies)))
        return staged


def queue_kwargs(api: SimpleNamespace) -> dict[str, Any]:
    """Shim 5: ``AsyncCallsQueue`` arguments for a CPU-only host.

    From 0.6 the persistent writer calls ``torch.cuda.set_device(rank % device_count())`` unless
    the queue is built with ``cpu_shm_mode=True``; without a GPU it dies at start-up.
    """
    if needed() and nvrx_async.accepts(api.AsyncCallsQueue, "cpu_shm_mode"):
        return {"cpu_shm_mode": True}
    return {}


def without_gpu_health_checks(wrapper: Any) -> Any:
    """A built ``inprocess.Wrapper`` that can restart in-process on a host without a GPU.

    No release takes the restart health check as an argument, so it is replaced on the built
    Wrapper by the user's own check alone (None runs none), only when CUDA is absent. Releases
    without the attribute are left as they are.
    """
    if needed() and hasattr(wrapper, "restart_health_check"):
        wrapper.restart_health_check = getattr(wrapper, "health_check", None)
        log.info("nvrx-slo: no CUDA; inprocess.Wrapper restarts without its GPU/NVLink health checks")
    return wrapper
