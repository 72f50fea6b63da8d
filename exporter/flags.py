"""The sidecar's flags: one typed ``Config``, every value checked once with the flag named in each
error, and the parser that fills it (``nvrx-slo sidecar --help``; ``docs/sidecar.md`` lists them)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from nvrx_slo.contracts.schema import JOURNAL_DIR_ENV
from nvrx_slo.exporter.engine.engine import REORDER_WINDOW_S
from nvrx_slo.exporter.views.view import UNKNOWN_ACCELERATOR

DESCRIPTION = "``nvrx-slo sidecar``: follow a pod's journal directory and serve what it means."
DEFAULT_PORT = 9400
MAX_REORDER_WINDOW_S = 600.0  # records later than this are a reader far behind, not reordering
MAX_INTERVAL_S = 86400.0  # an interval longer than a day is a typo (and inf would overflow a wait)
MAX_RANKS = 1 << 20
MAX_ACCELERATORS_PER_RANK = 64.0
MAX_ACCELERATORS_PER_POD = 1024.0


def _http_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


@dataclass(frozen=True)
class Config:
    """Everything the sidecar can be told; checked here, once, with the flag named in each error."""

    journal_dir: Path
    state_file: Path
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    poll_interval_s: float = 0.5
    state_interval_s: float = 10.0
    per_rank: bool = True
    max_ranks: int = 64
    otlp_endpoint: str | None = None
    otlp_interval_s: float = 15.0
    podinfo_dir: Path | None = None
    cycle_info_dir: Path | None = None  # newer NVRx: ft_launcher --ft-cycle-info-dir
    report_file: str | None = None  # a path, or "-" for stdout
    final_scrape_timeout_s: float = 0.0  # after SIGTERM: wait this long at most for one more scrape
    reorder_window_s: float = REORDER_WINDOW_S  # how late a rank's record may come
    accelerator: str = UNKNOWN_ACCELERATOR  # the model each rank holds where NVML cannot say
    accelerators_per_rank: float | None = None  # None: --accelerators-per-pod shared by its ranks, else 1
    accelerators_per_pod: float | None = None

    def __post_init__(self) -> None:
        def interval(flag: str, value: float) -> tuple[bool, str]:
            return (math.isfinite(value) and 0 < value <= MAX_INTERVAL_S,
                    f"{flag} must be > 0 and <= {MAX_INTERVAL_S:g} seconds, got {value}")

        def count(flag: str, value: float | None, most: float) -> tuple[bool, str]:
            return (value is None or (math.isfinite(value) and 0 < value <= most),
                    f"{flag} must be > 0 and <= {most:g}, got {value}")

        def not_a_directory(flag: str, path: Path | None) -> tuple[bool, str]:
            return path is None or not path.is_dir(), f"{flag} {path} is a directory"

        def directory(flag: str, path: Path | None, must_exist: bool) -> tuple[bool, str]:
            ok = path is None or path.is_dir() or (not must_exist and not path.exists())
            return ok, f"{flag} {path} is not a directory"

        report = None if self.report_file is None or self.report_file == "-" else Path(self.report_file)
        checks = [
            (0 <= self.port <= 65535, f"--port must be 0..65535, got {self.port}"),
            interval("--poll-interval", self.poll_interval_s),
            interval("--state-interval", self.state_interval_s),
            interval("--otlp-interval", self.otlp_interval_s),
            (math.isfinite(self.final_scrape_timeout_s) and 0 <= self.final_scrape_timeout_s <= MAX_INTERVAL_S,
             f"--final-scrape-timeout must be >= 0 and <= {MAX_INTERVAL_S:g} seconds, "
             f"got {self.final_scrape_timeout_s}"),
            (math.isfinite(self.reorder_window_s) and 0 <= self.reorder_window_s <= MAX_REORDER_WINDOW_S,
             f"--reorder-window must be >= 0 and <= {MAX_REORDER_WINDOW_S:g} seconds, got {self.reorder_window_s}"),
            (1 <= self.max_ranks <= MAX_RANKS, f"--max-ranks must be 1..{MAX_RANKS}, got {self.max_ranks}"),
            count("--accelerators-per-rank", self.accelerators_per_rank, MAX_ACCELERATORS_PER_RANK),
            count("--accelerators-per-pod", self.accelerators_per_pod, MAX_ACCELERATORS_PER_POD),
            (self.accelerators_per_rank is None or self.accelerators_per_pod is None,
             "give --accelerators-per-rank or --accelerators-per-pod, not both"),
            (0 < len(self.accelerator) <= 128 and self.accelerator.isprintable(),
             f"--accelerator must be 1 to 128 printable characters, got {self.accelerator!r}"),
            (self.otlp_endpoint is None or _http_url(self.otlp_endpoint),
             f"--otlp-endpoint must be an http(s) URL with a host, got {self.otlp_endpoint!r}"),
            (self.state_file.resolve().parent != self.journal_dir.resolve() or
             not self.state_file.name.endswith(".jsonl"),
             "--state-file must not be a .jsonl file in the journal directory"),
            directory("--journal-dir", self.journal_dir, must_exist=False),  # may appear later
            not_a_directory("--state-file", self.state_file),
            directory("--podinfo-dir", self.podinfo_dir, must_exist=True),
            directory("--ft-cycle-info-dir", self.cycle_info_dir, must_exist=False),
            not_a_directory("--report-file", report),
            (report is None or report.parent.is_dir(),
             f"--report-file {report}: no such directory {report and report.parent}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def _path(text: str) -> Path:
    """A path flag's value: an empty one would be the working directory (``Path("")`` is ``.``)."""
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return Path(text)


def _text(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="nvrx-slo sidecar", description=DESCRIPTION)
    p.add_argument("--journal-dir", type=_path, default=os.environ.get(JOURNAL_DIR_ENV) or None,
                   help=f"journal directory to follow (default: ${JOURNAL_DIR_ENV}, as the trainer uses)")
    p.add_argument("--state-file", type=_path, default=None,
                   help="where to persist state (default: .nvrx-slo-sidecar-state.json in the journal directory)")
    p.add_argument("--host", default=Config.host, help="address to serve HTTP on (default: %(default)s)")
    p.add_argument("--port", type=int, default=Config.port,
                   help="port to serve HTTP on (0: any free port) (default: %(default)s)")
    p.add_argument("--poll-interval", type=float, default=Config.poll_interval_s,
                   help="seconds between journal reads (default: %(default)s)")
    p.add_argument("--state-interval", type=float, default=Config.state_interval_s,
                   help="seconds between state saves (also saved on SIGTERM) (default: %(default)s)")
    p.add_argument("--per-rank", action=argparse.BooleanOptionalAction, default=Config.per_rank,
                   help='per-rank series; off: one rank="all" series per pod (default: %(default)s)')
    p.add_argument("--max-ranks", type=int, default=Config.max_ranks,
                   help='more ranks than this in one pod: rank="all" series only (default: %(default)s)')
    p.add_argument("--otlp-endpoint", default=None,
                   help="OTLP/HTTP endpoint, e.g. http://otel-collector:4318 (default: no OTLP export)")
    p.add_argument("--otlp-interval", type=float, default=Config.otlp_interval_s,
                   help="seconds between OTLP exports (default: %(default)s)")
    p.add_argument("--podinfo-dir", type=_path, default=None,
                   help="Downward API volume holding a 'labels' file (job name, completion index)")
    p.add_argument("--ft-cycle-info-dir", type=_path, default=None,
                   help="also read ft_launcher's cycle-info files here (NVRx versions that write them)")
    p.add_argument("--report-file", type=_text, default=None,
                   help="on exit, write the text SLO report here ('-': stdout)")
    p.add_argument("--final-scrape-timeout", type=float, default=Config.final_scrape_timeout_s,
                   help="on SIGTERM, read the journal once more and keep serving until /metrics is scraped twice "
                        "more, at most this many seconds, so the job's last seconds reach Prometheus and its rules "
                        "(set it above twice the scrape interval and below the pod's termination grace period; "
                        "0: exit at once) (default: %(default)s)")
    p.add_argument("--reorder-window", type=float, default=Config.reorder_window_s,
                   help="seconds a rank's records wait to be accounted, so a record read late still lands in "
                        "order; settled numbers lag the journal by as much (lower it for journals on local "
                        "disk and a more timely SLI) (default: %(default)s)")
    p.add_argument("--accelerator", default=Config.accelerator,
                   help="the accelerator model each rank holds, where NVML cannot say (its product name wins): the "
                        "label badput is priced by, as the SLO spec's cost section names it (default: %(default)s)")
    p.add_argument("--accelerators-per-rank", type=float, default=Config.accelerators_per_rank,
                   help="accelerators each rank holds: badput accelerator-seconds are its rank-seconds times this "
                        "(default: --accelerators-per-pod shared by the pod's ranks, else 1)")
    p.add_argument("--accelerators-per-pod", type=float, default=Config.accelerators_per_pod,
                   help="accelerators the pod holds (its containers' GPU resources: nvrx-slo inject sets it from "
                        "the pod template), shared by the ranks it accounts")
    return p


def parse_args(argv: Sequence[str]) -> Config:
    p = parser()
    args = p.parse_args(argv)
    if args.journal_dir is None:
        p.error(f"--journal-dir is required (or set ${JOURNAL_DIR_ENV})")
    try:
        return Config(
            journal_dir=args.journal_dir,
            state_file=args.state_file or args.journal_dir / ".nvrx-slo-sidecar-state.json",
            host=args.host, port=args.port, poll_interval_s=args.poll_interval, state_interval_s=args.state_interval,
            per_rank=args.per_rank, max_ranks=args.max_ranks, otlp_endpoint=args.otlp_endpoint,
            otlp_interval_s=args.otlp_interval, podinfo_dir=args.podinfo_dir,
            cycle_info_dir=args.ft_cycle_info_dir, report_file=args.report_file,
            final_scrape_timeout_s=args.final_scrape_timeout, reorder_window_s=args.reorder_window,
            accelerator=args.accelerator, accelerators_per_rank=args.accelerators_per_rank,
            accelerators_per_pod=args.accelerators_per_pod)
    except ValueError as exc:
        p.error(str(exc))
        raise  # unreachable: error() exits


