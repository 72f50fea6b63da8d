"""The sidecar for tests: the real ``nvrx-slo sidecar`` as a process on loopback, or its parts
assembled in process over a journal directory; either scraped into samples (``samples``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from nvrx_slo.exporter.views.collector import SnapshotCollector
from nvrx_slo.exporter.views.exposition import TextRenderer

IDENT = PodIdentity(namespace="ns", pod="pod-0", node="node-0", job_name="job")
_SERVING = re.compile(rb"serving http://127\.0\.0\.1:(\d+)/metrics")


class SidecarProcess:
    def __init__(self, journal_dir: Path, state_file: Path, log_file: Path, *extra: str,
                 preexec_fn: Callable[[], object] | None = None) -> None:
        self.log_file = log_file
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        self._log = open(log_file, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nvrx_slo", "sidecar", "--journal-dir", str(journal_dir),
             "--state-file", str(state_file), "--host", "127.0.0.1", "--port", "0", "--poll-interval", "0.1",
             *extra], stdout=subprocess.PIPE, stderr=self._log, env=env, preexec_fn=preexec_fn)
        self.port = self._wait_for_port()

    def _wait_for_port(self, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        start = self.log_file.stat().st_size if self.log_file.exists() else 0
        while time.monotonic() < deadline:
            match = _SERVING.search(self.log_file.read_bytes()[start:])
            if match:
                return int(match.group(1))
            if self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited {self.proc.returncode}:\n{self.log_file.read_text()}")
            time.sleep(0.05)
        raise TimeoutError(f"sidecar did not start:\n{self.log_file.read_text()}")

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.get("/readyz")[0] != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"sidecar not ready:\n{self.log_file.read_text()}")
            time.sleep(0.05)

    def scrape(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """Every sample of /metrics, parsed by prometheus-client: (name, sorted labels) -> value."""
        status, body = self.get("/metrics")
        assert status == 200, body
        return samples(body.decode())

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, bytes]:
        """Signal the sidecar and wait; returns (exit code, stdout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()
        return self.proc.returncode, out or b""

    def __enter__(self) -> SidecarProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.stop(signal.SIGKILL)


def value(samples: dict, name: str, **labels: str) -> float:
    hits = [v for (n, ls), v in samples.items() if n == name and all(dict(ls).get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def counters(samples: dict) -> dict:
    """The samples that must never go down: counters and histogram buckets, sums and counts."""
    return {k: v for k, v in samples.items()
            if k[0].endswith(("_total", "_bucket", "_count")) or k[0].endswith("_seconds_sum")}


ACCOUNTING = ("nvrx_wall_seconds_total", "nvrx_time_seconds_total", "nvrx_unprotected_work_seconds",
              "nvrx_steps_total", "nvrx_restarts_total", "nvrx_restart_duration_seconds_sum",
              "nvrx_restart_phase_seconds_total", "nvrx_checkpoint_blocking_seconds_sum",
              "nvrx_checkpoint_background_seconds_sum", "nvrx_step_duration_seconds_count",
              "nvrx_training_step", "nvrx_checkpoint_last_step")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, parsed by prometheus-client: (name, sorted labels) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def scrape_in_process(directory: Path) -> dict:
    live = Live(Engine(), JournalTail(directory))
    live.poll()
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(live.view, IDENT))
    return samples(TextRenderer().generate(registry).decode())
