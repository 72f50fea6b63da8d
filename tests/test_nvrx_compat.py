"""What differs between NVRx releases is answered in two places, from what the installed NVRx does:
``nvrx_compat`` for what the supported hooks use, ``reference/nvrx_async`` for the reference checkpointer.

Each case runs against whichever NVRx is installed (``scripts/compat.sh`` repeats the NVRx-dependent
tests for 0.4.1, 0.5.0 and 0.6.0); the shapes fed to the pure helpers are the ones those releases return.
"""

from __future__ import annotations

import functools
import logging
import traceback

import pytest

from nvrx_slo.trainer import nvrx_compat
from nvrx_slo.trainer.reference import nvrx_async


@pytest.mark.torch
@pytest.mark.nvrx
def test_the_installed_nvrx_has_every_feature_the_hooks_and_the_reference_job_use():
    assert nvrx_compat.version() is not None
    api = nvrx_async.async_checkpointing()
    assert api is not None and api.get_results_queue is not None
    assert nvrx_compat.inprocess() is not None and nvrx_compat.launcher() is not None
    assert nvrx_compat.elastic()


def _preload_tensors(data, non_blocking=True):
    assert non_blocking is False, "built in the training thread: no CUDA synchronize"
    return [("file", "key", ([], [("item", data)]))]


def test_write_buckets_come_from_the_arguments_or_from_the_preload_that_builds_them():
    buckets = [("f", "k", ([], []))]
    assert nvrx_async.write_buckets(functools.partial(_preload_tensors, "x", True), [0, buckets, None]) == buckets
    built = nvrx_async.write_buckets(functools.partial(_preload_tensors, "x", True), [0, None, None])  # 0.6+
    assert built == [("file", "key", ([], [("item", "x")]))]
    assert nvrx_async.write_buckets(None, []) == []  # nothing to write on this rank


def test_a_preload_of_an_unknown_shape_is_one_log_line_naming_the_feature_and_no_buckets(caplog):
    with caplog.at_level(logging.WARNING, logger="nvrx_slo.nvrx"):
        assert nvrx_async.write_buckets(lambda: None, [0, None, None]) is None
    assert "write buckets" in caplog.text and caplog.text.count("\n") == 1


def _wrapped(exc: BaseException) -> tuple:
    try:
        raise RuntimeError(f"Worker failure: {exc}") from exc
    except RuntimeError as wrapped:
        return wrapped, traceback.extract_tb(wrapped.__traceback__)


@pytest.mark.parametrize("results, error", [
    ([], None),
    (["result"], None),
    (RuntimeError("Worker failure: disk gone"), "RuntimeError: Worker failure: disk gone"),  # raised, up to 0.5
    (_wrapped(OSError("disk gone")), "RuntimeError: Worker failure: disk gone"),  # returned, from 0.6
    ({"unexpected": 1}, "unexpected write results: {'unexpected': 1}"),
], ids=["no results", "results", "raised", "wrapped", "unknown"])
def test_a_failed_write_reads_the_same_whether_nvrx_raised_or_returned_it(results, error):
    assert nvrx_async.write_error(results) == error


@pytest.mark.torch
@pytest.mark.nvrx
def test_accepts_sees_through_nvrx_metaclasses_to_the_constructor():
    api = nvrx_async.async_checkpointing()
    assert nvrx_async.accepts(api.AsyncCallsQueue, "persistent")
    assert not nvrx_async.accepts(api.AsyncCallsQueue, "no_such_argument")
