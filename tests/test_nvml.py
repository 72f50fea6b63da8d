"""NVML idle sampling: a fake NVML library (the seam) with a fake clock; the real one where there is no GPU."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from nvrx_slo.exporter.ingest import nvml


class FakeNvml:
    """The six pynvml functions the sampler uses, over scripted utilisation percentages."""

    class NVMLError(Exception):
        pass

    def __init__(self, utilisation: list[list[int | None]], init_error: bool = False) -> None:
        self.utilisation = utilisation  # per sample, per device; None = the read fails
        self.init_error = init_error
        self.shut = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.utilisation[0])

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        gpu = self.utilisation[0][handle]
        if gpu is None:
            raise self.NVMLError("GPU is lost")
        return SimpleNamespace(gpu=gpu, memory=0)

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H100 80GB HBM3"  # older nvidia-ml-py returns bytes, newer str

    def nvmlShutdown(self) -> None:
        self.shut = True


def test_the_product_name_is_the_first_devices_as_text():
    sampler = nvml.Sampler.create(FakeNvml([[0, 0]]))
    assert sampler.product() == "NVIDIA H100 80GB HBM3"


def test_idle_is_elapsed_time_times_the_idle_share_per_device():
    lib, now = FakeNvml([[100, 25, 0]]), [10.0]
    sampler = nvml.Sampler.create(lib, clock=lambda: now[0])
    now[0] = 12.0
    assert sampler.sample() == {0: 0.0, 1: 1.5, 2: 2.0}
    lib.utilisation = [[50, None, 0]]
    now[0] = 13.0
    assert sampler.sample() == {0: 0.5, 2: 1.0}  # a failing device is skipped, not fatal
    sampler.close()
    assert lib.shut


@pytest.mark.parametrize("lib, line", [
    (FakeNvml([[0]], init_error=True), "NVML off (no NVIDIA driver visible: Driver Not Loaded)"),
    (FakeNvml([[]]), "NVML off (no GPU visible to the sidecar)"),
])
def test_without_a_driver_or_a_gpu_it_is_off_with_one_line(lib, line, caplog):
    with caplog.at_level(logging.INFO, "nvrx_slo.nvml"):
        assert nvml.Sampler.create(lib) is None
    assert len(caplog.records) == 1 and caplog.records[0].getMessage().startswith(line)


def test_the_real_library_on_this_machine(caplog):
    """No NVIDIA driver here (CI, laptops): the real pynvml says so and the sampler is off."""
    with caplog.at_level(logging.INFO, "nvrx_slo.nvml"):
        sampler = nvml.Sampler.create()
    if sampler is not None:  # a machine with a GPU: it samples every device
        idle = sampler.sample()
        sampler.close()
        assert idle and all(v >= 0 for v in idle.values())
    else:
        assert "NVML off" in caplog.text
