"""Helpers for tests that run real servers (Prometheus, Alertmanager, sidecars) on loopback."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], Any], what: str, timeout: float) -> None:
    """Poll ``check`` until it is truthy; a refused or reset connection counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f}s")


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM a server this test started, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
