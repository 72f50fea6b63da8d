"""Accelerator idle time measured by NVML (``nvidia-ml-py``), when the sidecar can see GPUs.

Each ``sample()`` reads every device's utilisation (the share of the driver's last sample period
in which a kernel ran) and credits ``elapsed × (1 − utilisation)`` idle seconds to the device.
It is a sampled estimate, labelled ``source="nvml"`` so it is never confused with the journal's
step-phase estimate. Without a driver (or with no device) ``Sampler.create`` logs one line and
returns ``None``: the sidecar then reports the step-phase estimate only.

The devices' product name (``product()``) names the accelerator model the pod's cost is priced by.

``lib`` is the seam: the ``pynvml`` module in production, a fake with the same six functions in
tests.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

from nvrx_slo.exporter.ingest.ratelog import BoundedLog

with warnings.catch_warnings():  # a stray "pynvml" wrapper package warns on import; the API is the same
    warnings.simplefilter("ignore", FutureWarning)
    import pynvml

log = logging.getLogger("nvrx_slo.nvml")


class Sampler:
    def __init__(self, lib: Any, handles: list[Any], clock: Callable[[], float] = time.monotonic) -> None:
        self._lib = lib
        self._handles = handles
        self._clock = clock
        self._last = clock()
        self._log = BoundedLog(log)

    @classmethod
    def create(cls, lib: ModuleType | Any = pynvml, clock: Callable[[], float] = time.monotonic) -> Sampler | None:
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            log.info("NVML off (no NVIDIA driver visible: %s); accelerator idle time comes from step phases only", exc)
            return None
        try:
            handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
        except lib.NVMLError as exc:
            log.warning("NVML off (cannot list devices: %s)", exc)
            lib.nvmlShutdown()
            return None
        if not handles:
            log.info("NVML off (no GPU visible to the sidecar)")
            lib.nvmlShutdown()
            return None
        log.info("NVML on: sampling %d GPU(s)", len(handles))
        return cls(lib, handles, clock)

    def product(self) -> str | None:
        """The first device's product name (``NVIDIA H100 80GB HBM3``); None if NVML cannot say."""
        try:
            name = self._lib.nvmlDeviceGetName(self._handles[0])
        except self._lib.NVMLError as exc:
            log.warning("NVML: no product name for GPU 0: %s", exc)
            return None
        return (name.decode(errors="replace") if isinstance(name, bytes) else str(name)).strip() or None

    def sample(self) -> dict[int, float]:
        """Idle seconds per device index since the previous sample."""
        now = self._clock()
        elapsed, self._last = now - self._last, now
        idle = {}
        for index, handle in enumerate(self._handles):
            try:
                busy = self._lib.nvmlDeviceGetUtilizationRates(handle).gpu
            except self._lib.NVMLError as exc:
                self._log.warning(f"gpu{index}", "NVML: no utilisation for GPU %d: %s", index, exc)
                continue
            idle[index] = elapsed * (100 - busy) / 100
        return idle

    def close(self) -> None:
        try:
            self._lib.nvmlShutdown()
        except self._lib.NVMLError:
            pass
