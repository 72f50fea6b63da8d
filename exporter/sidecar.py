"""``nvrx-slo sidecar``: follow a pod's journal directory and serve what it means.

Runs beside the training container (a native sidecar sharing the journal ``emptyDir``). It reads
every journal file into the accounting engine (``nvrx_slo.exporter.live``), persists engine state and read
offsets together (``nvrx_slo.exporter.state_store``; every ``--state-interval`` seconds and on SIGTERM),
and serves one state through every view:

* ``/metrics`` — Prometheus text (``nvrx_slo.exporter.views.collector``); 503 until the state is loaded and the
  journal read to its end once, so a restarted sidecar never shows counters lower than before.
* ``/healthz`` — the process is alive; ``/readyz`` — journal directory readable and caught up.
* ``/`` — the status page (``nvrx_slo.exporter.views.status_page``).
* OTLP/HTTP to ``--otlp-endpoint`` when one is given (``nvrx_slo.exporter.views.otlp``).

Side inputs: NVML accelerator idle time when GPUs are visible (``nvrx_slo.exporter.ingest.nvml``), container
restarts from the Kubernetes API inside a cluster (``nvrx_slo.exporter.ingest.podwatch``), each off with one log
line where it cannot work; and, with ``--ft-cycle-info-dir``, the cycle-info files of NVRx versions
that write them (``nvrx_slo.exporter.ingest.cycleinfo``). What each rank holds, which its badput is
priced by (``nvrx_rank_accelerators``): NVML's product name where it sees GPUs, else
``--accelerator``; ``--accelerators-per-rank`` of them, or ``--accelerators-per-pod`` (the pod's GPU
resources, which ``nvrx-slo inject`` reads from its template) shared by the pod's ranks, else one.
A job whose every process ended is over, however it was launched: its numbers settle and stop
(``nvrx_slo.exporter.engine.engine``).
SIGTERM (or SIGINT) settles what the reorder window still holds (the pod ends: nothing more will
be read), saves the state, writes ``--report-file`` (the text SLO report) if asked, sends a last
OTLP export and exits 0 — after, with ``--final-scrape-timeout``, reading the journal once more
before it settles and serving two more scrapes: a job's last seconds reach Prometheus only
through a scrape after them, and its rules only while those series are fresh; the kubelet stops
the sidecar right after the job's end.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import CollectorRegistry

from nvrx_slo.contracts.targets import Targets
from nvrx_slo.exporter import identity as identity_mod
from nvrx_slo.exporter import state_store
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.flags import Config, parse_args, parser
from nvrx_slo.exporter.ingest import nvml, podwatch
from nvrx_slo.exporter.ingest.cycleinfo import CycleInfoReader
from nvrx_slo.exporter.ingest.ratelog import BoundedLog
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live, View
from nvrx_slo.exporter.server import TEXT, Response, Server
from nvrx_slo.exporter.views import slo_report, status_page
from nvrx_slo.exporter.views.collector import SnapshotCollector
from nvrx_slo.exporter.views.exposition import CONTENT_TYPE, TextRenderer
from nvrx_slo.exporter.views.view import AcceleratorsSaid

log = logging.getLogger("nvrx_slo.sidecar")

FINAL_SCRAPES = 2  # after SIGTERM: scrapes of the final numbers to wait for (see Sidecar._final_scrape)
HTML = "text/html; charset=utf-8"


def _max_open() -> int:
    """Journal descriptors the reader may hold: a share of RLIMIT_NOFILE (after ``main`` raised it),
    leaving the rest to the HTTP server, NVML, the state file and the libraries."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 256
    return max(4, min(256, (soft - 64) // 2))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """A scrape allocates ~100k short-lived objects without cycles (refcounting frees them); meanwhile
    the cyclic collector would walk the engine's long-lived state again and again: ~35 ms of a
    ~100 ms scrape at 1024 ranks. Scrapes are serialized, so the pause is bounded by one."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Sidecar:
    def __init__(self, config: Config, targets: Targets, *, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.targets = targets
        self.identity = identity_mod.from_environment(env, config.podinfo_dir)
        self.live = self._fresh_live()
        self.stop = threading.Event()
        self._caught_up = False
        self._registry = CollectorRegistry(auto_describe=False)
        self._registry.register(SnapshotCollector(self.view, self.identity, per_rank=config.per_rank,
                                                  max_ranks=config.max_ranks))
        self._renderer = TextRenderer()
        self._log = BoundedLog(log)
        self._render_lock = threading.Lock()
        self._scraped = threading.Condition()
        self._scrapes = 0  # /metrics answers rendered, counted under _render_lock
        self.server = Server(config.host, config.port, {
            "/metrics": self._metrics, "/healthz": self._healthz, "/readyz": self._readyz, "/": self._index},
            quick=("/healthz", "/readyz"))  # read two flags: answered at once, however busy the renders are

    def _fresh_live(self) -> Live:
        cycles = (CycleInfoReader(self.config.cycle_info_dir, self.identity)
                  if self.config.cycle_info_dir is not None else None)
        tail = JournalTail(self.config.journal_dir, max_open=_max_open())
        return Live(Engine(self.config.reorder_window_s), tail, cycles=cycles)

    # --- views ---------------------------------------------------------------------------------

    def view(self) -> View | None:
        """The current view, or ``None`` before the journal has been read to its end once."""
        return self.live.view() if self._caught_up else None

    def _metrics(self) -> Response:
        if not self._caught_up:
            return 503, TEXT, b"catching up with the journal\n"
        with self._render_lock, _gc_paused():
            body = self._renderer.generate(self._registry)
            with self._scraped:
                self._scrapes += 1
                self._scraped.notify_all()
        return 200, CONTENT_TYPE, body

    def _healthz(self) -> Response:
        return 200, TEXT, b"ok\n"

    def _readyz(self) -> Response:
        if not self.live.tail.directory_ok:
            return 503, TEXT, f"journal directory {self.config.journal_dir} not readable\n".encode()
        if not self._caught_up:
            return 503, TEXT, b"catching up with the journal\n"
        return 200, TEXT, b"ready\n"

    def _index(self) -> Response:
        view = self.view()
        if view is None:
            return 503, TEXT, b"catching up with the journal\n"
        return 200, HTML, status_page.render(view, self.targets).encode()

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        self._load_state()
        self.server.start()
        log.info("serving http://%s:%d/metrics for journal %s", self.config.host, self.server.port,
                 self.config.journal_dir)
        sampler = nvml.Sampler.create()
        model = (sampler.product() if sampler is not None else None) or self.config.accelerator
        c = self.config
        self.live.accelerators = AcceleratorsSaid(model, c.accelerators_per_rank, c.accelerators_per_pod)
        log.info("accelerators: %s", f"{c.accelerators_per_rank:g} × {model} per rank" if c.accelerators_per_rank
                 else f"{c.accelerators_per_pod:g} × {model} per pod, shared by its ranks" if c.accelerators_per_pod
                 else f"1 × {model} per rank (neither --accelerators-per-rank nor --accelerators-per-pod given)")
        watcher = podwatch.start(self.identity, self.live.observe_containers)
        otlp_export = None
        if self.config.otlp_endpoint:
            from nvrx_slo.exporter.views import otlp  # only then: opentelemetry costs ~9 MB and 0.2 s to import

            otlp_export = otlp.start(self.view, self.identity, endpoint=self.config.otlp_endpoint,
                                  interval_s=self.config.otlp_interval_s, per_rank=self.config.per_rank,
                                  max_ranks=self.config.max_ranks)
        try:
            self._loop(sampler)
            self._final_scrape()
        finally:
            self._save_state()
            if self.config.report_file and self._caught_up:
                self._write_report()
            if otlp_export is not None:
                otlp_export.shutdown()
            if watcher is not None:
                watcher.stop()
            if sampler is not None:
                sampler.close()
            self.server.stop()
            self.live.tail.close()
        return 0

    def _loop(self, sampler: nvml.Sampler | None) -> None:
        next_save = time.monotonic() + self.config.state_interval_s
        while not self.stop.is_set():
            try:
                handed = self.live.poll(self.stop.is_set)
            except Exception:  # a reader bug: keep serving what is known, try again next round
                self._log.exception("poll", "reading the journal failed; retrying")
                self.stop.wait(self.config.poll_interval_s)
                continue
            if not self._caught_up and self.live.tail.complete and not self.stop.is_set():
                self._caught_up = True
                log.info("caught up with the journal (%d lines)", handed)
            if sampler is not None:
                self.live.add_gpu_idle(sampler.sample())
            if time.monotonic() >= next_save:
                self._save_state()
                next_save = time.monotonic() + self.config.state_interval_s
            self.stop.wait(self.config.poll_interval_s)

    def _final_scrape(self) -> None:
        """After SIGTERM: read what the journal still holds and settle it, then serve until
        ``FINAL_SCRAPES`` scrapes rendered it (``--final-scrape-timeout`` at most; 0: settle only).
        One brings the job's last settlement to Prometheus; the next keeps those series fresh one
        scrape interval more, so that a rule evaluation (as frequent as the scrapes) sees them
        before the series go stale with the sidecar: one evaluation missing the last samples loses
        the job's last badput."""
        timeout = self.config.final_scrape_timeout_s
        if not self._caught_up:
            return
        deadline = time.monotonic() + timeout
        if timeout > 0:
            try:
                self.live.poll(lambda: time.monotonic() > deadline)
            except Exception:
                self._log.exception("poll", "reading the journal failed; serving what is known")
        self.live.settle()
        if timeout <= 0:
            return
        with self._render_lock:  # a scrape counted after this began rendering after the poll
            seen = self._scrapes
        log.info("final numbers settled: serving them to %d scrapes, %g s at most", FINAL_SCRAPES, timeout)
        with self._scraped:
            while self._scrapes < seen + FINAL_SCRAPES and (left := deadline - time.monotonic()) > 0:
                self._scraped.wait(left)
            scraped = self._scrapes - seen
        log.info("final numbers %s", f"scraped {min(scraped, FINAL_SCRAPES)} times" if scraped
                 else f"not scraped within {timeout:g} s; exiting")

    def _load_state(self) -> None:
        self.live = resume(self.config, self._fresh_live)

    def _save_state(self) -> None:
        try:
            state_store.save(self.config.state_file, self.config.journal_dir, self.live.to_state())
        except (OSError, ValueError) as exc:  # the last good state stays; a restart resumes from it
            self._log.warning("save", "cannot save state to %s: %s", self.config.state_file, exc)

    def _write_report(self) -> None:
        text = slo_report.render(self.live.view().snapshot, self.targets)
        if self.config.report_file == "-":
            sys.stdout.write(text)
            sys.stdout.flush()
            return
        try:
            Path(self.config.report_file).write_text(text)  # type: ignore[arg-type]
        except OSError as exc:
            log.error("cannot write the SLO report to %s: %s", self.config.report_file, exc)


def resume(config: Config, fresh: Callable[[], Live]) -> Live:
    """A ``Live`` resumed from ``config.state_file``, or ``fresh()`` where there is no usable state.

    A state file is not trusted because it loads: the resumed state must also render a view and
    save again, or it would fail every scrape or every save from now on. Anything else (a file
    edited by hand, another version's, a bug) means a rebuild from the journal, never a crash.
    """
    parts = state_store.load(config.state_file, config.journal_dir)
    if parts is None:
        log.info("no saved state: reading the journal from the start")
        return fresh()
    live = fresh()
    try:
        live.load_state(parts)
        if live.engine.window != config.reorder_window_s:  # accounted with another window: account again
            log.info("saved state has a reorder window of %g s, not %g s: reading the journal from the start",
                     live.engine.window, config.reorder_window_s)
            return fresh()
        live.view()
        state_store.save(os.devnull, config.journal_dir, live.to_state(), dry_run=True)
    except Exception as exc:  # any state that is not one of ours: never a crash loop on it
        log.error("saved state %s unusable (%s: %s): reading the journal from the start", config.state_file,
                  type(exc).__name__, str(exc)[:200])
        return fresh()
    log.info("resumed from %s", config.state_file)
    return live


def main(argv: list[str], targets: Targets) -> int:
    """``nvrx-slo sidecar``; ``targets`` come from the SLO spec (``nvrx_slo/cli.py`` loads it)."""
    config = parse_args(argv)
    state_dir = config.state_file.parent
    # checked at start, not with the flags: in a pod the directory is a volume, mounted by then. Saved
    # every --state-interval, a state file whose directory does not exist would fail every save, and a
    # restart would rebuild from the journal (the journal's own directory may appear later: it is exempt)
    if not state_dir.is_dir() and state_dir.resolve() != config.journal_dir.resolve():
        parser().error(f"--state-file {config.state_file}: no such directory {state_dir}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    # One descriptor per journal file with new data while a backlog is merged: allow what the
    # container allows (the soft limit is often 1024, the hard one far higher).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        sidecar = Sidecar(config, targets)
    except OSError as exc:  # the address cannot be listened on: a wrong flag, not a crash
        parser().error(f"--host/--port: cannot listen on {config.host!r} port {config.port}: {exc.strerror or exc}")
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: sidecar.stop.set())
    return sidecar.run()
