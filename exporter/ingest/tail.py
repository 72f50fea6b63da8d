"""Follow a journal directory: every rank's file, every restart's, every rotated generation.

The writer (``trainer/journal.py``, naming in ``nvrx_slo/contracts/schema.py``) appends to one file per
process and rotates by *starting a new generation file* and deleting the oldest, never by
renaming. So a file is identified by its name and inode, and the reader's position in it is a
byte offset that stays valid for the file's whole life. What this reader guarantees:

* Every complete line is handed on exactly once: the offset only moves past lines already handed
  on, a partial last line waits for its newline, and the offsets are persisted together with the
  engine state that holds those lines (``to_state``), never apart from it.
* Records reach the engine merged by monotonic time across files, however large the backlog
  (a sidecar started late, or restarted): the engine accounts out-of-order records only within a
  short window, so reading one process's file to its end before the next process's would make
  the older one's records "late". Reads go round by round, a chunk per file; a round hands on
  every buffered record up to the lowest "read so far" time of the files that still have more,
  in order of each record's own time, none before its process's first record (seq 0) as read
  (a record dated long before its process began is refused, not taken for its start). A file's
  "read so far" time moves only to a line of its own writer (the pid in its name), not in the
  sidecar's future, once a later line of that writer confirms it (a greater seq, no earlier time,
  as its writer writes them): one line the engine would refuse, even claiming a seq its writer
  wrote too, cannot hold its file's later lines back (they would arrive late), and the time lags
  one line. So a refused record changes nothing (``tests/test_rejected_records.py``). Lines are
  made into items and handed on merged by ``exporter/ingest/merge.py``; this module follows files.
* A file deleted under the reader is still read to its end through the descriptor held open for
  it; only then is it forgotten. A file cut under its offset (``copytruncate``: writers never do)
  is counted as ``RejectReason.FILE_TRUNCATED`` and read again from its start, so the lines written after the
  cut are not lost (lines read twice are the engine's duplicates): one that shrank below the
  offset, and one written past it again between two polls, told by its first line (its seq and
  time) no longer being the one read first. Lines written between the last read and the cut are
  gone with it; the engine counts their seqs lost (``records_lost``). Descriptors of quiet
  files are closed (``idle_close_s``, ``max_open``) and reopened by offset when the file grows.
* At most ``max_open`` descriptors are held: with more files holding new data, the rest wait
  (oldest generations first) until drained files are closed, within the same poll;
  ``complete`` says whether the last poll read every file to its end.
* Bad lines are rejected, and I/O trouble counted, by ``schema.RejectReason`` value (``UNREADABLE``,
  ``FILE_TRUNCATED``); every rejection is counted once and logged at a bounded rate, and nothing
  raises out of ``poll``.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import RejectReason
from nvrx_slo.exporter.events import Event
from nvrx_slo.exporter.ingest.merge import Source, hand_on, split
from nvrx_slo.exporter.ingest.ratelog import BoundedLog

log = logging.getLogger("nvrx_slo.tail")

ROUND_BYTES = 2 << 20  # read per round across all files: a round's lines, decoded, take ~4x this
MIN_CHUNK = 2 << 10  # with many files the round budget wins: 1024 files x 2 KB = 2 MB read per round
_NO_GUARD = nullcontext()  # poll's default guard: nullcontext is reusable and re-entrant

Ingest = Callable[[list[Event]], None]
"""Takes accepted events, in merged order."""


def order_key(name: str) -> tuple[str, int, str]:
    """Sort key putting each process's generations in write order: ``(stem, generation, name)``.

    ``<pod>.<role>.<pid>[.<generation>].jsonl`` — pod names may hold dots, so parse from the right.
    """
    parts = name[: -len(schema.JOURNAL_SUFFIX)].split(".")
    if len(parts) >= 2 and parts[-1].isdigit() and parts[-2].isdigit():
        return ".".join(parts[:-1]), int(parts[-1]), name
    return ".".join(parts), 0, name


def writer_pid(name: str) -> int | None:
    """The pid in a journal file's name (``<pod>.<role>.<pid>[.<generation>].jsonl``), None if none."""
    last = order_key(name)[0].rsplit(".", 1)[-1]
    return int(last) if last.isdigit() else None


class JournalTail:
    def __init__(self, directory: str | os.PathLike[str], *, clock: Callable[[], float] = time.monotonic,
                 idle_close_s: float = 30.0, max_open: int = 256, round_bytes: int = ROUND_BYTES) -> None:
        self.directory = Path(directory)
        self.offsets: dict[str, tuple[int, int]] = {}  # name -> (inode, offset past the last line handed on)
        self.rejected: Counter[str] = Counter()
        self.directory_ok = False  # the last scan could list the directory
        self.complete = False  # the last poll read every file with new data to its end
        self._waiting = False  # files with new data left unopened (max_open, or out of descriptors)
        self._failing: set[tuple[str, int]] = set()  # (name, inode) counted as unreadable until read
        self._open: dict[str, Source] = {}
        self._clock = clock
        self._idle_close_s = idle_close_s
        self._max_open = max_open
        self._round_bytes = round_bytes
        self._log = BoundedLog(log)
        self._not_after: Callable[[], float] = lambda: float("inf")
        self._starts: dict[int, float] = {}  # pid -> mono of its first record (seq 0), as read
        self._heads: dict[str, tuple[int, int]] = {}  # name -> (length, crc32) of its first line's bytes

    # --- persistence -------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return {
            "offsets": {name: list(v) for name, v in self.offsets.items()},
            "rejected": dict(self.rejected),
            "failing": sorted([name, inode] for name, inode in self._failing),
            "heads": {name: list(head) for name, head in self._heads.items()},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Resume from ``to_state()``; call before the first ``poll``."""
        self.offsets = {name: (int(v[0]), int(v[1])) for name, v in state["offsets"].items()}
        self.rejected = Counter({k: int(v) for k, v in state["rejected"].items()})
        self._failing = {(name, int(inode)) for name, inode in state["failing"]}
        self._heads = {name: (int(length), int(crc)) for name, (length, crc) in state.get("heads", {}).items()}

    # --- reading -----------------------------------------------------------------------------

    def poll(self, ingest: Ingest, stop: Callable[[], bool] = lambda: False,
             guard: AbstractContextManager[Any] = _NO_GUARD,
             not_after: Callable[[], float] = lambda: float("inf")) -> int:
        """Hand every complete new line's event to ``ingest``, merged by time; returns lines handed on.

        ``stop()`` is checked between rounds; the state is consistent whenever ``poll`` returns.
        Each hand-on (``ingest`` and the rejection counts) runs inside ``guard``, the caller's
        lock, so whoever reads ``rejected`` and the engine under it sees both move together.
        ``not_after()``: the latest plausible ``mono`` now; a record past it (which the engine
        rejects) does not move its file's merge key, or it would hold back the file's later lines
        behind every other file's and make them late.
        """
        self._not_after = not_after
        self.complete = False
        listing = self._scan()
        if listing is None:
            return 0
        self._waiting = False
        self._open_sources(listing)
        handed = 0
        while not stop():
            self._read_round()
            live = [s for s in self._open.values() if s.items]
            if not live:
                if not self._waiting:
                    break
                # Out of descriptors with files still unread: close the drained ones, open the next.
                self._retire()
                opened = len(self._open)
                self._waiting = False
                self._open_sources(listing)
                if len(self._open) <= opened and not any(s.more for s in self._open.values()):
                    break  # nothing could be opened (no descriptor at all): try again next poll
                continue
            with guard:
                handed += hand_on(self._open, self.offsets, self._reject, ingest)
        self._retire()
        self.complete = not self._waiting and not stop()
        return handed

    def close(self) -> None:
        for name in list(self._open):
            self._close(name)

    def _scan(self) -> dict[str, tuple[int, int]] | None:
        try:
            with os.scandir(self.directory) as it:
                listing = {}
                for entry in it:
                    if not entry.name.endswith(schema.JOURNAL_SUFFIX):
                        continue
                    try:  # follows a symlink: its target is read (and a file is named by the target's inode)
                        if entry.is_file():
                            stat = entry.stat()
                            listing[entry.name] = (stat.st_ino, stat.st_size)
                    except FileNotFoundError:
                        continue  # deleted between listing and stat
                    except OSError as exc:  # a symlink loop, a dangling permission: this file only
                        self._unreadable(entry.name, entry.inode(), exc)
        except OSError as exc:
            self.directory_ok = False
            self._log.warning("dir", "cannot list journal directory %s: %s", self.directory, exc)
            return None
        self.directory_ok = True
        return listing

    def _open_sources(self, listing: dict[str, tuple[int, int]]) -> None:
        for name, src in list(self._open.items()):
            if name not in listing or listing[name][0] != src.inode:
                src.vanished = True  # read what is left through the descriptor, then forget it
                src.more = True
            elif src.vanished:
                continue
            elif listing[name][1] < src.read_pos:  # truncated under us
                self._truncated(name, src, f"size {listing[name][1]} < offset {src.read_pos}")
            else:
                src.more = listing[name][1] > src.read_pos  # grown since last read (no read otherwise)
                if src.more and not self._same_head(name, src.fd):  # cut and written past the offset again
                    self._truncated(name, src, "its first line changed")
        for name in [n for n in self.offsets if n not in listing and n not in self._open]:
            del self.offsets[name]  # gone while nobody held it open
            self._heads.pop(name, None)
        offsets, opened = self.offsets, self._open
        changed = [name for name, (inode, size) in listing.items()  # the common case: none
                   if (name not in opened or opened[name].vanished) and offsets.get(name) != (inode, size)]
        for name in sorted(changed, key=order_key):
            inode, size = listing[name]
            known_inode, offset = self.offsets.get(name, (inode, 0))
            if known_inode != inode:
                offset = 0  # a new file under an old name (its predecessor, if held, drains first)
            if name in self._open:  # replaced or truncated under us: read again once the old one is drained
                continue
            if size < offset:  # truncated while closed: whatever is there was written after the cut
                self._reject(RejectReason.FILE_TRUNCATED, name,
                             f"size {size} < offset {offset}; reading it again from the start")
                offset = 0
            self.offsets[name] = (inode, offset)
            if size == offset:
                continue
            if len(self._open) >= self._max_open:
                self._waiting = True  # the rest wait for descriptors to be retired
                break
            try:
                fd = os.open(self.directory / name, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE):  # out of descriptors: not this file's fault
                    self._waiting = True
                    break
                self._unreadable(name, inode, exc)
                continue
            if os.fstat(fd).st_ino != inode:  # replaced between scan and open: next poll
                os.close(fd)
                continue
            if offset and not self._same_head(name, fd):  # cut and written past the offset while closed
                self._reject(RejectReason.FILE_TRUNCATED, name,
                             "its first line changed; reading it again from the start")
                offset = 0
                self.offsets[name] = (inode, offset)
            self._open[name] = Source(fd, inode, offset, last_growth=self._clock(), pid=writer_pid(name))

    def _truncated(self, name: str, src: Source, why: str) -> None:
        """A file cut under its open descriptor (``copytruncate``): what it holds now was written
        after the cut, so it is read again from its start (once its lines read so far are handed on)."""
        self._reject(RejectReason.FILE_TRUNCATED, name, f"{why}; reading it again from the start")
        if src.items:  # hand on what was read before the cut first
            src.vanished, src.more, src.pending, src.skipping = True, False, b"", False
            return
        self._close(name)
        self.offsets[name] = (src.inode, 0)
        self._heads.pop(name, None)

    def _same_head(self, name: str, fd: int) -> bool:
        """Whether the file still begins with the line read first from it (unknown: yes). A file cut
        and written past the reader's offset again (``copytruncate`` between two polls) is only told
        apart from one that grew by its first line: the lines before the offset are new ones."""
        head = self._heads.get(name)
        if head is None:
            return True
        length, crc = head
        try:
            return zlib.crc32(os.pread(fd, length, 0)) == crc
        except OSError:
            return True  # unreadable: the read that follows counts it

    def _read_round(self) -> None:
        """Read the next chunk of every file that may have more and whose buffer ran dry, or holds
        only lines waiting for their writer's next line to confirm its time (``_split``)."""
        hungry = [(n, s) for n, s in self._open.items() if s.more and (not s.items or s.items[0][0] > s.key)]
        if not hungry:
            return
        chunk = max(MIN_CHUNK, self._round_bytes // len(hungry))
        for name, src in sorted(hungry, key=lambda ns: order_key(ns[0])):
            try:
                data = os.pread(src.fd, chunk, src.read_pos)
            except OSError as exc:
                self._unreadable(name, src.inode, exc)
                src.more = False
                continue
            self._failing.discard((name, src.inode))
            src.more = len(data) == chunk
            if data:
                src.last_growth = self._clock()
                split(name, src, data, self._starts, self._not_after(), self._heads)

    def _retire(self) -> None:
        """Forget drained vanished files; close quiet descriptors (offsets stay), quietest first."""
        for name, src in list(self._open.items()):
            if src.vanished and not src.more and not src.items:
                if src.pending and not src.skipping:
                    self._reject(RejectReason.MALFORMED, name, "file deleted with a partial last line")
                self._close(name)
                if self.offsets.get(name, (src.inode,))[0] == src.inode:
                    del self.offsets[name]
                    self._heads.pop(name, None)
        now = self._clock()
        by_age = sorted(self._open, key=lambda n: self._open[n].last_growth)
        excess = len(by_age) - self._max_open
        for i, name in enumerate(by_age):
            src = self._open[name]
            drained = self._waiting and not src.more and not src.items  # make room for the waiting
            if i < excess or drained or now - src.last_growth > self._idle_close_s:
                self._close(name)

    def _reject(self, reason: RejectReason, name: str, detail: str) -> None:
        self.rejected[reason.value] += 1
        self._log.warning(reason.value, "journal %s: rejected (%s): %s", name, reason.value, detail)

    def _unreadable(self, name: str, inode: int, exc: OSError) -> None:
        if (name, inode) not in self._failing:
            self._failing.add((name, inode))
            self._reject(RejectReason.UNREADABLE, name, f"{type(exc).__name__}: {exc}")

    def _close(self, name: str) -> None:
        src = self._open.pop(name)
        try:
            os.close(src.fd)
        except OSError:
            pass
