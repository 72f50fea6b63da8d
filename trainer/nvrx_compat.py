"""Feature detection for NVRx (``nvidia-resiliency-ext``) 0.4.1 through 0.7.

NVRx is imported lazily and only through ``first_module``, so the rest of ``trainer/`` asks "is the
feature there?" instead of comparing version numbers. A missing feature is logged once, in one
clear line (``missing``), and the caller degrades (no in-process restarts, fewer launcher events;
the reference checkpointer's async path, ``reference/nvrx_async.py``, falls back to synchronous
saves); nothing here raises ImportError into training.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
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
def missing(feature: str, detail: str) -> None:
    log.warning("nvrx-slo: NVRx %s has no %s (%s); going on without it", version() or "(not installed)",
                feature, detail)


def first_module(*names: str) -> ModuleType | None:
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


@functools.cache
def inprocess() -> ModuleType | None:
    """``nvidia_resiliency_ext.inprocess`` (Wrapper, Compose and the callback base classes), or None."""
    module = first_module("nvidia_resiliency_ext.inprocess")
    if module is None or not hasattr(module, "Wrapper"):
        missing("inprocess.Wrapper", "no in-process restarts")
        return None
    return module


@functools.cache
def launcher() -> ModuleType | None:
    """``nvidia_resiliency_ext.fault_tolerance.launcher`` (its ``main`` is ft_launcher), or None."""
    module = first_module("nvidia_resiliency_ext.fault_tolerance.launcher")
    if module is None or not hasattr(module, "main"):
        missing("ft_launcher", "cannot launch")
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
        metrics = first_module(f"{prefix}.metrics.api")
        log_handlers = getattr(first_module(f"{prefix}.events.handlers"), "_log_handlers", None)
        if metrics is not None and hasattr(metrics, "configure") and log_handlers is not None:
            found.append(SimpleNamespace(metrics=metrics, event_handlers=log_handlers))
    if not found:
        missing("torchelastic metrics/events", "launcher events limited to start and exit")
    return found
