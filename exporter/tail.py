"""Follow a journal directory: every rank's file, every restart's, every rotated generation.

The writer (``trainer/journal.py``, naming in ``trainer/schema.py``) appends to one file per
process and rotates by *starting a new generation file* and deleting the oldest, never by
renaming. So a file is identified by its name and inode, and the reader's position in it is a
byte offset that stays valid for the file's whole life. What this reader guarantees:

* Every complete line is handed on exactly once: the offset only moves past whole lines, a
  partial last line waits for its newline, and the offsets are persisted together with the
  engine state that holds those lines (``to_state``), never apart from it.
* Generation N of a process is read to its end before generation N+1 (the writer only opens
  N+1 once N is finished), so each process's records arrive in order.
* A file deleted under the reader is still read to its end through the descriptor held open for
  it; only then is it forgotten. Descriptors of quiet files are closed (``idle_close_s``,
  ``max_open``) and reopened by offset when the file grows.
* Bad lines are rejected by ``schema.RejectReason`` value, I/O trouble by this module's
  ``UNREADABLE`` / ``FILE_TRUNCATED``; every rejection is counted and logged at a bounded rate,
  and nothing raises out of ``poll``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.decode import decode_batch
from exporter.ratelog import BoundedLog
from trainer import schema
from trainer.schema import JournalError, RejectReason

log = logging.getLogger("nvrx_slo.tail")

UNREADABLE = "unreadable"  # a journal file could not be opened or read (counted once per episode)
FILE_TRUNCATED = "file_truncated"  # a file shrank under its read offset (writers never truncate)

MAX_LINE_BYTES = 1 << 20  # a "line" longer than this is garbage: rejected, skipped to its newline

Ingest = Callable[[list[dict[str, Any]]], Iterable[str]]
"""Takes accepted records in order; returns the reasons of any it rejected (duplicates, …)."""


def order_key(name: str) -> tuple[str, int, str]:
    """Sort key putting each process's generations in write order: ``(stem, generation, name)``.

    ``<pod>.<role>.<pid>[.<generation>].jsonl`` — pod names may hold dots, so parse from the right.
    """
    parts = name[: -len(schema.JOURNAL_SUFFIX)].split(".")
    if len(parts) >= 2 and parts[-1].isdigit() and parts[-2].isdigit():
        return ".".join(parts[:-1]), int(parts[-1]), name
    return ".".join(parts), 0, name


@dataclass
class _Open:
    fd: int
    inode: int
    pending: bytes = b""  # bytes after the last newline: a partial line waiting for its end
    skipping: bool = False  # inside an over-long line: drop bytes up to the next newline
    last_growth: float = 0.0


class JournalTail:
    def __init__(self, directory: str | os.PathLike[str], *, clock: Callable[[], float] = time.monotonic,
                 idle_close_s: float = 30.0, max_open: int = 256, chunk_bytes: int = 1 << 20) -> None:
        self.directory = Path(directory)
        self.offsets: dict[str, tuple[int, int]] = {}  # name -> (inode, offset of first unread byte)
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.directory_ok = False  # the last scan could list the directory
        self._failing: set[tuple[str, int]] = set()  # (name, inode) counted as unreadable until read
        self._open: dict[str, _Open] = {}
        self._clock = clock
        self._idle_close_s = idle_close_s
        self._max_open = max_open
        self._chunk = chunk_bytes
        self._log = BoundedLog(log)

    # --- persistence -------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "offsets": {name: list(v) for name, v in self.offsets.items()},
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
            "failing": sorted([name, inode] for name, inode in self._failing),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume from ``to_state()``; call before the first ``poll``."""
        self.offsets = {name: (int(v[0]), int(v[1])) for name, v in state["offsets"].items()}
        self.accepted = int(state["accepted"])
        self.rejected = Counter({k: int(v) for k, v in state["rejected"].items()})
        self._failing = {(name, int(inode)) for name, inode in state["failing"]}

    # --- reading -----------------------------------------------------------------------------

    def poll(self, ingest: Ingest, stop: Callable[[], bool] = lambda: False) -> int:
        """Read every complete new line, hand records to ``ingest``; returns lines consumed.

        Stops early (between chunks, state consistent) when ``stop()`` turns true.
        """
        listing = self._scan()
        if listing is None:
            return 0
        consumed = 0
        for name in [n for n, f in self._open.items() if n not in listing or listing[n][0] != f.inode]:
            consumed += self._drain_vanished(name, ingest)  # deleted or replaced under us
        for name in [n for n in self.offsets if n not in listing and n not in self._open]:
            del self.offsets[name]  # gone while nobody held it open
        for name in sorted(listing, key=order_key):
            if stop():
                break
            inode, size = listing[name]
            consumed += self._read_file(name, inode, size, ingest, stop)
        self._close_idle()
        return consumed

    def close(self) -> None:
        for name in list(self._open):
            self._close(name)

    def _scan(self) -> dict[str, tuple[int, int]] | None:
        try:
            with os.scandir(self.directory) as it:
                listing = {}
                for entry in it:
                    if entry.name.endswith(schema.JOURNAL_SUFFIX) and entry.is_file():
                        try:
                            listing[entry.name] = (entry.inode(), entry.stat().st_size)
                        except OSError:
                            continue  # deleted between listing and stat
        except OSError as exc:
            self.directory_ok = False
            self._log.warning("dir", "cannot list journal directory %s: %s", self.directory, exc)
            return None
        self.directory_ok = True
        return listing

    def _read_file(self, name: str, inode: int, size: int, ingest: Ingest, stop: Callable[[], bool]) -> int:
        known_inode, offset = self.offsets.get(name, (inode, 0))
        if known_inode != inode:
            offset = 0  # a new file under an old name
        opened = self._open.get(name)
        if opened is None:
            if size < offset:
                self._reject(FILE_TRUNCATED, name, f"size {size} < offset {offset}; going on from {size}")
                offset = size
            self.offsets[name] = (inode, offset)
            if size == offset:
                return 0
            try:
                fd = os.open(self.directory / name, os.O_RDONLY | os.O_CLOEXEC)
                if os.fstat(fd).st_ino != inode:  # replaced between scan and open: next poll
                    os.close(fd)
                    return 0
            except OSError as exc:
                self._unreadable(name, inode, exc)
                return 0
            opened = self._open[name] = _Open(fd, inode, last_growth=self._clock())
        return self._read_open(name, opened, ingest, stop)

    def _read_open(self, name: str, opened: _Open, ingest: Ingest, stop: Callable[[], bool]) -> int:
        consumed = 0
        while True:
            inode, offset = self.offsets[name]
            try:
                chunk = os.pread(opened.fd, self._chunk, offset + len(opened.pending))
            except OSError as exc:
                self._unreadable(name, inode, exc)
                self._close(name)
                return consumed
            self._failing.discard((name, inode))
            if not chunk:
                return consumed
            opened.last_growth = self._clock()
            consumed += self._consume(name, opened, chunk, ingest)
            if stop():
                return consumed

    def _consume(self, name: str, opened: _Open, chunk: bytes, ingest: Ingest) -> int:
        """Hand on the complete lines of ``pending + chunk``; advance the offset past them."""
        inode, offset = self.offsets[name]
        if opened.skipping:  # still inside an over-long line: drop through its newline
            newline = chunk.find(b"\n")
            if newline < 0:
                self.offsets[name] = (inode, offset + len(chunk))
                return 0
            opened.skipping = False
            offset += newline + 1
            chunk = chunk[newline + 1:]
        data = opened.pending + chunk
        end = data.rfind(b"\n")
        if end < 0:
            opened.pending = data
            if len(data) > MAX_LINE_BYTES:
                self._reject(RejectReason.MALFORMED.value, name, f"line longer than {MAX_LINE_BYTES} bytes")
                opened.pending, opened.skipping = b"", True
                offset += len(data)
            self.offsets[name] = (inode, offset)
            return 0
        lines = data[:end].split(b"\n")
        opened.pending = data[end + 1:]
        self._ingest([line for line in lines if line], name, ingest)
        self.offsets[name] = (inode, offset + end + 1)
        return len(lines)

    def _ingest(self, lines: list[bytes], name: str, ingest: Ingest) -> None:
        records = []
        for item in decode_batch(lines):
            if isinstance(item, JournalError):
                self._reject(item.reason.value, name, str(item))
            else:
                records.append(item)
        self.accepted += len(records)
        for reason in ingest(records):
            self.accepted -= 1
            self._reject(reason, name, "rejected by the accounting engine")

    def _drain_vanished(self, name: str, ingest: Ingest) -> int:
        """Read a deleted (or replaced) file to its end through the descriptor still held."""
        opened = self._open[name]
        consumed = self._read_open(name, opened, ingest, lambda: False)
        if opened.pending and not opened.skipping:
            self._reject(RejectReason.MALFORMED.value, name, "file deleted with a partial last line")
        self._close(name)
        self.offsets.pop(name, None)
        return consumed

    def _reject(self, reason: str, name: str, detail: str) -> None:
        self.rejected[reason] += 1
        self._log.warning(reason, "journal %s: rejected (%s): %s", name, reason, detail)

    def _unreadable(self, name: str, inode: int, exc: OSError) -> None:
        if (name, inode) not in self._failing:
            self._failing.add((name, inode))
            self._reject(UNREADABLE, name, f"{type(exc).__name__}: {exc}")

    def _close(self, name: str) -> None:
        opened = self._open.pop(name)
        try:
            os.close(opened.fd)
        except OSError:
            pass

    def _close_idle(self) -> None:
        """Close descriptors of quiet files (their offsets stay), the quietest first over ``max_open``."""
        now = self._clock()
        by_age = sorted(self._open, key=lambda n: self._open[n].last_growth)
        excess = len(by_age) - self._max_open
        for i, name in enumerate(by_age):
            if i < excess or now - self._open[name].last_growth > self._idle_close_s:
                self._close(name)
