"""NVRx's async checkpointing API as the reference checkpointer drives it, across releases 0.4.1 to 0.7.

What the releases changed in that path (``compatibility.md``) is absorbed here, by feature
detection through ``nvrx_compat`` (a missing piece is logged once and the checkpointer saves
synchronously). This is the reference job's machinery: a user's own stack is observed through
``Hooks.checkpoint`` and needs none of it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from nvrx_slo.trainer.nvrx_compat import first_module, missing


@functools.cache
def async_checkpointing() -> SimpleNamespace | None:
    """NVRx's async DCP path: ``AsyncCallsQueue``, ``AsyncRequest``, ``FileSystemWriterAsync``,
    ``save_state_dict_async_plan`` (and ``AsyncCaller`` for the CPU shims), or None."""
    base = "nvidia_resiliency_ext.checkpointing.async_ckpt"
    core = first_module(f"{base}.core")
    fs = first_module(f"{base}.filesystem_async")
    saver = first_module(f"{base}.state_dict_saver")
    names = {"AsyncCallsQueue": core, "AsyncRequest": core, "AsyncCaller": core,
             "FileSystemWriterAsync": fs, "save_state_dict_async_plan": saver}
    found = {name: getattr(module, name, None) if module else None for name, module in names.items()}
    if not all(found.values()):
        absent = ", ".join(name for name, value in found.items() if value is None)
        missing("async checkpointing", f"missing {absent}: saves are synchronous")
        return None
    # the writers' shared result queue: ``_get_write_results_queue`` up to 0.5, public from 0.6
    get_results_queue = getattr(fs, "get_write_results_queue", None) or getattr(fs, "_get_write_results_queue", None)
    return SimpleNamespace(results_queue_module=fs, get_results_queue=get_results_queue, **found)


def accepts(function: Callable[..., Any], parameter: str) -> bool:
    """Whether ``function`` (an NVRx callable or class) takes a keyword ``parameter`` in this release."""
    if isinstance(function, type):  # a class's own __init__: NVRx's metaclasses hide it from signature()
        function = function.__init__  # type: ignore[misc]
    try:
        return parameter in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


def write_buckets(preload: Callable[..., Any] | None, args: Sequence[Any]) -> list[Any] | None:
    """The write buckets of a planned save, built in the calling thread, or None.

    ``FileSystemWriterAsync.get_save_function_and_args()`` returns ``(write, preload, args)``.
    Up to 0.5 the buckets are ``args[1]``; from 0.6 ``args[1]`` is None and the worker builds them
    by calling ``preload``, a ``functools.partial`` of ``preload_tensors(data, non_blocking)``.
    Calling that function here with ``non_blocking=False`` builds the same buckets without a CUDA
    synchronize. None when neither shape is found (logged once).
    """
    if len(args) < 2:  # nothing to write on this rank
        return []
    if args[1] is not None:
        return list(args[1])
    if isinstance(preload, functools.partial) and len(preload.args) == 2:
        return list(preload.func(preload.args[0], non_blocking=False))
    missing("write buckets in get_save_function_and_args()", "the writer stages its own tensors")
    return None


def write_error(results: Any) -> str | None:
    """The error in ``FileSystemWriterAsync.retrieve_write_results()``'s answer, or None.

    Up to 0.5 a failed write raises (pass the caught exception); from 0.6 it is returned, wrapped
    as ``(exception, traceback)``. A list of write results means success.
    """
    if isinstance(results, list):
        return None
    cause = results[0] if isinstance(results, tuple) and results else results
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {cause}"[:500]
    return f"unexpected write results: {results!r}"[:500]


def finalize_save(planned: tuple[Any, Any, Any]) -> str | None:
    """NVRx's ``save_state_dict_async_finalize``, failing the same way on every rank, with or without CUDA.

    NVRx's version raises on the rank that saw a failure only (up to 0.4), which leaves the others
    waiting in a collective, and from 0.5 broadcasts its verdict from ``torch.cuda.current_device()``,
    which a CPU-only host has not. Here every rank gathers, the coordinator writes ``.metadata`` if
    all writes landed, and its verdict (None or the error) is broadcast as an object. ``planned``
    is what ``save_state_dict_async_plan`` returned: the writer, the global metadata, the wrapper.
    """
    writer, metadata, dist_wrapper = planned
    try:
        results: Any = writer.retrieve_write_results()
    except Exception as exc:
        results = exc
    failure = write_error(results)
    gathered = dist_wrapper.gather_object(results if failure is None else failure)
    error = None
    if dist_wrapper.is_coordinator:
        failures = [r for r in gathered if isinstance(r, str)]
        if failures:
            error = f"write failed: {failures[0]}"
        else:
            try:
                writer.finish(metadata, gathered)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:500]
    return dist_wrapper.broadcast_object(error)
