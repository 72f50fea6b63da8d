"""The journal writer: one append-only JSONL file per process, as ``nvrx_slo/contracts/schema/`` specifies.

Why it looks like this:

* One ``os.write`` per event on an ``O_APPEND`` descriptor, so concurrent writers (ranks, the
  launcher, NVRx's monitor thread) never interleave inside a line.
* The identity part of every line is encoded once (``_prefix``) and re-encoded only when the
  identity changes (an in-process restart bumps ``iter``): the hot path is two clock reads, one
  small ``json`` encode and one syscall.
* It never raises into training. Any failure (unwritable directory, ``ENOSPC``, a payload that is
  not JSON) is counted in ``errors``, logged once, and the event is dropped. A short write (disk
  full mid-line) marks the file so the next record starts on a fresh line and only the torn
  record is lost.
* Rotation never renames (a reader holding an offset stays right): at ``max_bytes`` the writer
  goes on in the next generation file and deletes generations beyond ``keep``, oldest first.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

from nvrx_slo.contracts import pod_env, schema
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer import launch_env

log = logging.getLogger("nvrx_slo.journal")

DEFAULT_MAX_BYTES = 32 * 1024 * 1024
DEFAULT_KEEP = 4

_monotonic = time.monotonic
_time = time.time
_write = os.write
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
# Floats are written with microsecond resolution: '%.6f' costs a third of repr() on the hot path.
_LINE = '{"v":' + str(schema.SCHEMA_VERSION) + ',"type":"%s","seq":%d,"mono":%.6f,"wall":%.6f%s%s}\n'
_STEP_BODY = ',"step":%d,"start":%.6f,"data_s":%.6f,"compute_s":%.6f,"optimizer_s":%.6f'
_BLOCKED = ',"blocked_s":%.6f'


def _encode_payload(payload: dict[str, Any]) -> str:
    """``,"k":v`` for each field — keys are Python identifiers (keyword arguments), never escaped.

    Scalars are formatted inline (this is the hot path); anything else goes through ``json``.
    """
    out = ""
    for key, value in payload.items():
        kind = type(value)
        if kind is str:
            out += ',"' + key + '":' + encode_basestring_ascii(value)
        elif kind is float:
            if value - value != 0.0:  # nan or ±inf: not JSON
                raise ValueError(f"journal field {key} must be a finite number, got {value!r}")
            out += f',"{key}":{value:.6f}'
        elif kind is int:
            out += f',"{key}":{value:d}'
        elif value is None:
            out += ',"' + key + '":null'
        elif kind is bool:
            out += ',"' + key + ('":true' if value else '":false')
        else:  # lists, dicts; numpy scalars and other objects raise TypeError here
            out += ',"' + key + '":' + _ENCODER.encode(value)
    return out


class Writer(schema.Writer):
    """Who writes (``schema.Writer``'s fields), as a process's launcher and pod tell it."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, launcher: bool = False) -> Writer:
        """Read identity the way Kubernetes (Downward API) and the launcher (torchrun, ft_launcher,
        srun: ``launch_env``) hand it to a process; plain ``python`` is rank 0.

        ``launcher=True`` is the ft_launcher process itself: it has no rank.
        """
        env = os.environ if env is None else env
        return cls(
            job=pod_env.job(env),
            pod=pod_env.pod(env),
            node=pod_env.node(env),
            rank=None if launcher else (launch_env.rank(env) or 0),
            local_rank=None if launcher else (launch_env.local_rank(env) or 0),
            pid=os.getpid(),
            restart=launch_env.restart(env) or 0,
        )


def _identity_suffix(identity: Writer) -> str:
    """The encoded identity fields, ``,"job":…,"iter":N`` — appended after ``wall`` on every line."""
    fields = dataclasses.asdict(identity)
    return "," + _ENCODER.encode(fields)[1:-1]


class Journal:
    """Append events to ``<directory>/<journal_file_name(...)>``; a ``None`` directory disables it.

    Thread-safe: one lock orders ``seq`` with the write and guards rotation (uncontended in the
    common case, so it costs well under a microsecond).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        identity: Writer | None = None,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keep: int = DEFAULT_KEEP,
    ) -> None:
        if max_bytes <= 0 or keep < 1:
            raise ValueError(f"journal needs max_bytes > 0 and keep >= 1, got {max_bytes=} {keep=}")
        self.directory = Path(directory) if directory is not None else None
        self.identity = identity or Writer.from_env()
        self.max_bytes = max_bytes
        self.keep = keep
        self.errors = 0  # events dropped because of an error (I/O or encoding)
        self.written = 0  # events written
        self._lock = threading.Lock()
        self._seq = 0
        self._fd: int | None = None
        self._generation = 0
        self._size = 0
        self._torn = False  # the last write was short: start the next one on a fresh line
        self._logged = False
        self._suffix = _identity_suffix(self.identity)

    @property
    def enabled(self) -> bool:
        return self.directory is not None

    def path(self, generation: int | None = None) -> Path | None:
        """The file of ``generation`` (default: the current one)."""
        if self.directory is None:
            return None
        gen = self._generation if generation is None else generation
        ident = self.identity
        return self.directory / schema.journal_file_name(ident.pod, ident.rank, ident.pid, gen)

    def update(self, **fields: Any) -> None:
        """Change identity fields (``iter`` after an in-process restart, ``rank`` after reassignment).

        The file keeps the name it was opened with; the records carry the new values.
        """
        try:
            with self._lock:
                self.identity = dataclasses.replace(self.identity, **fields)
                self._suffix = _identity_suffix(self.identity)
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def emit(self, event: EventType, **payload: Any) -> None:
        """Write one event stamped now. Never raises; failures are counted in ``errors``."""
        if self.directory is None:
            return
        try:
            self._append(event._value_, _encode_payload(payload))
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def emit_first(self, event: EventType, mono: float, **payload: Any) -> None:
        """Write the process's first event, dated ``mono`` (an instant before now, e.g.
        ``process_start_mono()``). Later in the file it is dated now: ``mono`` never goes back along ``seq``."""
        if self.directory is None:
            return
        try:
            self._append(event._value_, _encode_payload(payload), mono, first_only=True)
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def emit_at(self, event: EventType, mono: float, **payload: Any) -> None:
        """Write an event that happened at ``mono``, timed where it happened rather than when it
        could be written (another process's exit, timed by a helper that woke for it): its
        ``mono`` may lie before the previous record's."""
        if self.directory is None:
            return
        try:
            self._append(event._value_, _encode_payload(payload), mono)
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def step(self, step: int, start: float, data_s: float, compute_s: float, optimizer_s: float,
             blocked_s: float = 0.0, at: float | None = None) -> None:
        """``emit(EventType.STEP, ...)`` with a pre-compiled template: the one event written every step
        (``blocked_s`` only when the loop waited on a save since its previous record). ``at``: when
        the step ended, if before now (``emit_at``: a step timed by the GPU is written once seen done)."""
        if self.directory is None:
            return
        try:
            body = _STEP_BODY % (step, start, data_s, compute_s, optimizer_s)
            self._append("step", body + _BLOCKED % blocked_s if blocked_s > 0.0 else body, at)
        except Exception as exc:  # never raise into training
            self._fail(exc)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                try:
                    os.close(self._fd)
                except OSError:
                    pass
                self._fd = None

    # --- internals ------------------------------------------------------------------------------

    def _append(self, event: str, body: str, at: float | None = None, *, first_only: bool = False) -> None:
        with self._lock:  # clocks read under the lock: mono never decreases along seq (but at emit_at's)
            seq = self._seq
            self._seq = seq + 1
            mono, wall = _monotonic(), _time()
            if at is not None and (seq == 0 or not first_only):
                mono, wall = at, wall - (mono - at)
            line = (_LINE % (event, seq, mono, wall, self._suffix, body)).encode()
            if self._torn:
                line = b"\n" + line
            if self._fd is None or (self._size and self._size + len(line) > self.max_bytes):
                if self._fd is not None:
                    self._rotate()
                self._open()
            n = _write(self._fd, line)  # type: ignore[arg-type]
            self._size += n
            if n < len(line):
                self._torn = True
                raise OSError(f"short write ({n} of {len(line)} bytes): device full?")
            self._torn = False
            self.written += 1

    def _open(self) -> None:
        path = self.path()
        assert path is not None
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._fd = fd
        self._size = os.fstat(fd).st_size

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        self._generation += 1
        old = self.path(self._generation - self.keep)
        if self._generation - self.keep >= 0 and old is not None:
            try:
                old.unlink()
            except FileNotFoundError:
                pass

    def _fail(self, exc: BaseException) -> None:
        self.errors += 1  # the descriptor is kept: the next write may succeed (space freed)
        if not self._logged:
            self._logged = True
            log.warning("nvrx-slo journal: dropping events (training goes on): %s: %s",
                        type(exc).__name__, exc)


def process_start_mono() -> float | None:
    """When this process started, on the journal's clock (``CLOCK_MONOTONIC``), from the kernel.

    ``/proc/self/stat`` gives the start in clock ticks since boot (10 ms here), which
    ``CLOCK_BOOTTIME`` relates to now; None where either is missing (not Linux).
    """
    try:
        with open("/proc/self/stat") as f:
            after_name = f.read().rsplit(")", 1)[1].split()  # the name may hold spaces and ")"
        started = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat(5)
        return _monotonic() - (time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def open_journal(directory: str | os.PathLike[str] | None = None, *, launcher: bool = False) -> Journal:
    """The process's journal: ``directory`` or ``$NVRX_SLO_JOURNAL_DIR``; disabled when neither is set."""
    if directory is None:
        directory = os.environ.get(schema.JOURNAL_DIR_ENV) or None
    if directory is not None:
        try:
            Path(directory).mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # the first emit counts and logs the failure
    return Journal(directory, Writer.from_env(launcher=launcher))
