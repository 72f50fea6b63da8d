"""A virtual monotonic clock for the trainer's hooks, journal, saves and CUDA timer, for tests that wait
for time rather than for a process: ``CLOCK.sleep`` advances it, so spans are exact however loaded the
machine is. The ``virtual_time`` fixture (every module has it, through conftest.py) patches it into the
trainer's one clock seam, each module's ``_monotonic``."""

from __future__ import annotations

import time

import pytest

from nvrx_slo.trainer import cuda_timing, journal, saves
from nvrx_slo.trainer import hooks as hooks_module


class VirtualClock:
    """The host's monotonic clock in these tests: it moves as much as the test sleeps, and 1 µs per
    reading (as a real one does between two calls, so no two records share an instant)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1e-6
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


CLOCK = VirtualClock()


@pytest.fixture
def virtual_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """``CLOCK`` as the trainer's monotonic clock: ``pytest.mark.usefixtures("virtual_time")``."""
    CLOCK.t = time.monotonic()  # after the process's start, which the journal reads from the kernel
    for module in (journal, hooks_module, cuda_timing, saves):
        monkeypatch.setattr(module, "_monotonic", CLOCK)
