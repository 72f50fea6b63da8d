"""Feature detection for NVRx (``nvidia-resiliency-ext``) 0.4.1 through 0.7.

NVRx is imported lazily and only here, so the rest of ``trainer/`` asks "is the feature there?"
instead of comparing version numbers. A missing feature is logged once, in one clear line, and
the caller degrades (a synchronous checkpoint instead of an async one, no in-process restarts,
fewer launcher events); nothing here raises ImportError into training.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import logging
from types import ModuleType, SimpleNamespace

log = logging.getLogger("nvrx_slo.nvrx")


@functools.cache
def version() -> str | None:
    try:
        return importlib.metadata.version("nvidia-resiliency-ext")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _missing(feature: str, detail: str) -> None:
    log.warning("nvrx-slo: NVRx %s has no %s (%s); going on without it", version() or "(not installed)",
                feature, detail)


def _first_module(*names: str) -> ModuleType | None:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


@functools.cache
def async_checkpointing() -> SimpleNamespace | None:
    """NVRx's async DCP path: ``AsyncCallsQueue``, ``AsyncRequest``, ``FileSystemWriterAsync``,
    ``save_state_dict_async_plan`` (and ``AsyncCaller`` for the CPU shims), or None."""
    base = "nvidia_resiliency_ext.checkpointing.async_ckpt"
    core = _first_module(f"{base}.core")
    fs = _first_module(f"{base}.filesystem_async")
    saver = _first_module(f"{base}.state_dict_saver")
    names = {"AsyncCallsQueue": core, "AsyncRequest": core, "AsyncCaller": core,
             "FileSystemWriterAsync": fs, "save_state_dict_async_plan": saver}
    found = {name: getattr(module, name, None) if module else None for name, module in names.items()}
    if not all(found.values()):
        missing = ", ".join(name for name, value in found.items() if value is None)
        _missing("async checkpointing", f"missing {missing}: saves are synchronous")
        return None
    return SimpleNamespace(results_queue_module=fs, **found)


@functools.cache
def inprocess() -> ModuleType | None:
    """``nvidia_resiliency_ext.inprocess`` (Wrapper, Compose and the callback base classes), or None."""
    module = _first_module("nvidia_resiliency_ext.inprocess")
    if module is None or not hasattr(module, "Wrapper"):
        _missing("inprocess.Wrapper", "no in-process restarts")
        return None
    return module


def wrapper_accepts(parameter: str) -> bool:
    """Whether this NVRx's ``inprocess.Wrapper`` takes ``parameter`` (e.g. ``restart_health_check``,
    added after 0.4.1)."""
    module = inprocess()
    return module is not None and parameter in inspect.signature(module.Wrapper.__init__).parameters


@functools.cache
def launcher() -> ModuleType | None:
    """``nvidia_resiliency_ext.fault_tolerance.launcher`` (its ``main`` is ft_launcher), or None."""
    module = _first_module("nvidia_resiliency_ext.fault_tolerance.launcher")
    if module is None or not hasattr(module, "main"):
        _missing("ft_launcher", "cannot launch")
        return None
    return module


@functools.cache
def elastic() -> list[SimpleNamespace]:
    """The torchelastic metrics/events APIs a launcher may report through.

    NVRx 0.4.1 vendors torchelastic (``fault_tolerance._torch_elastic_compat``); other versions may
    use torch's own modules. Both are returned when both exist (installing a handler on the one the
    launcher does not use costs nothing).
    """
    found = []
    for prefix in ("nvidia_resiliency_ext.fault_tolerance._torch_elastic_compat", "torch.distributed.elastic"):
        metrics = _first_module(f"{prefix}.metrics.api")
        handlers = _first_module(f"{prefix}.events.handlers")
        if metrics is not None and hasattr(metrics, "configure") and hasattr(handlers, "_log_handlers"):
            found.append(SimpleNamespace(metrics=metrics, event_handlers=handlers._log_handlers))
    if not found:
        _missing("torchelastic metrics/events", "launcher events limited to start and exit")
    return found
