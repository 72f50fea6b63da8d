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
  "read so far" time moves only with the lines of its own writer (the pid in its name), in seq
  order, whose times are self-consistent and not in the sidecar's future: a line the engine would
  refuse cannot hold its file's later lines back (they would arrive late). So a refused record
  changes nothing (``tests/test_rejected_records.py``).
* A file deleted under the reader is still read to its end through the descriptor held open for
  it; only then is it forgotten. A file cut under its offset (``copytruncate``: writers never do)
  is counted as ``FILE_TRUNCATED`` and read again from its start, so the lines written after the
  cut are not lost (lines read twice are the engine's duplicates): one that shrank below the
  offset, and one written past it again between two polls, told by its first line (its seq and
  time) no longer being the one read first. Lines written between the last read and the cut are
  gone with it; the engine counts their seqs lost (``records_lost``). Descriptors of quiet
  files are closed (``idle_close_s``, ``max_open``) and reopened by offset when the file grows.
* At most ``max_open`` descriptors are held: with more files holding new data, the rest wait
  (oldest generations first) until drained files are closed, within the same poll;
  ``complete`` says whether the last poll read every file to its end.
* Bad lines are rejected by ``schema.RejectReason`` value, I/O trouble by
  ``rejects.UNREADABLE`` / ``FILE_TRUNCATED``; every rejection is counted once and logged at a bounded
  rate, and nothing raises out of ``poll``.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from itertools import accumulate
from operator import itemgetter
from pathlib import Path
from typing import Any

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import SPAN_EVENTS, JournalError, RejectReason
from nvrx_slo.exporter.ingest.decode import Event, decode_batch, self_consistent
from nvrx_slo.exporter.ingest.ratelog import BoundedLog
from nvrx_slo.exporter.rejects import FILE_TRUNCATED, UNREADABLE

log = logging.getLogger("nvrx_slo.tail")

HEAD_BYTES = 256  # of a file's first line, remembered to tell a file cut and rewritten from one grown
MAX_LINE_BYTES = 1 << 20  # a "line" longer than this is garbage: rejected, skipped to its newline
ROUND_BYTES = 2 << 20  # read per round across all files: a round's lines, decoded, take ~4x this
MIN_CHUNK = 2 << 10  # with many files the round budget wins: 1024 files x 2 KB = 2 MB read per round
_NEVER = float("inf")
_NO_GUARD = nullcontext()  # poll's default guard: nullcontext is reusable and re-entrant

Ingest = Callable[[list[Event]], None]
"""Takes accepted events, in merged order."""

# One line read and not yet handed on: (merge key, order, offset just past the line, event | (file, rejection) |
# None). The key is the running maximum of ``mono`` in its file (of the lines that may move it: see ``_split``);
# the order is the record's own time, never before its process's first record (see ``_split``).
_Item = tuple[float, float, int, Event | tuple[str, JournalError] | None]


def order_key(name: str) -> tuple[str, int, str]:
    """Sort key putting each process's generations in write order: ``(stem, generation, name)``.

    ``<pod>.<role>.<pid>[.<generation>].jsonl`` — pod names may hold dots, so parse from the right.
    """
    parts = name[: -len(schema.JOURNAL_SUFFIX)].split(".")
    if len(parts) >= 2 and parts[-1].isdigit() and parts[-2].isdigit():
        return ".".join(parts[:-1]), int(parts[-1]), name
    return ".".join(parts), 0, name


def _keeps_order(event: Event, limit: float) -> bool:
    """Whether a line of its file's writer may set the file's merge time or its process's start:
    not in the sidecar's future, and its own times agree (what the engine refuses alone)."""
    mono = event.mono
    return mono <= limit and self_consistent(event, event.type, event.start if event.type in SPAN_EVENTS else mono)


def _after(start: float) -> float:
    """The order of a record dated before its process's first record: just after that record."""
    return math.nextafter(start, _NEVER)


def writer_pid(name: str) -> int | None:
    """The pid in a journal file's name (``<pod>.<role>.<pid>[.<generation>].jsonl``), None if none."""
    last = order_key(name)[0].rsplit(".", 1)[-1]
    return int(last) if last.isdigit() else None


def _decoded(lines: list[bytes]) -> list[Event | JournalError]:
    """``decode_batch``, and if it raises (a decoder bug on some hostile line), line by line, so
    that only the lines it raises on are lost — each counted as malformed — never the chunk."""
    try:
        return decode_batch(lines)
    except Exception:  # whatever it is, it must not take the valid lines with it
        out: list[Event | JournalError] = []
        for line in lines:
            try:
                out += decode_batch([line])
            except Exception as exc:
                out.append(JournalError(RejectReason.MALFORMED, f"undecodable: {type(exc).__name__}"))
        return out


@dataclass
class _Source:
    """An open journal file: where reading got to, and lines read but not yet handed on."""

    fd: int
    inode: int
    read_pos: int  # next byte to read; the handed-on offset lives in JournalTail.offsets
    pending: bytes = b""  # after the last newline: a partial line waiting for its end
    skipping: bool = False  # inside an over-long line: drop bytes up to the next newline
    items: list[_Item] = field(default_factory=list)
    key: float = float("-inf")  # running max of mono read so far
    more: bool = True  # the last read filled its chunk: more may be waiting
    vanished: bool = False  # deleted or replaced: read to the end, then forget
    last_growth: float = 0.0
    pid: int | None = None  # the writer its name gives (None: not a journal file name)
    seq: int = -1  # seq of the newest line that moved ``key``


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
        self._open: dict[str, _Source] = {}
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
                handed += self._hand_on(ingest)
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
                self._reject(FILE_TRUNCATED, name, f"size {size} < offset {offset}; reading it again from the start")
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
                self._reject(FILE_TRUNCATED, name, "its first line changed; reading it again from the start")
                offset = 0
                self.offsets[name] = (inode, offset)
            self._open[name] = _Source(fd, inode, offset, last_growth=self._clock(), pid=writer_pid(name))

    def _truncated(self, name: str, src: _Source, why: str) -> None:
        """A file cut under its open descriptor (``copytruncate``): what it holds now was written
        after the cut, so it is read again from its start (once its lines read so far are handed on)."""
        self._reject(FILE_TRUNCATED, name, f"{why}; reading it again from the start")
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
        """Read the next chunk of every file whose buffer ran dry and that may have more."""
        hungry = [(n, s) for n, s in self._open.items() if s.more and not s.items]
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
                self._split(name, src, data)

    def _split(self, name: str, src: _Source, data: bytes) -> None:
        """Turn ``pending + data`` into items, one per complete line; keep the partial tail."""
        start = src.read_pos - len(src.pending)  # file offset of the first byte of pending + data
        src.read_pos += len(data)
        data = src.pending + data
        if start == 0 and (first := data.find(b"\n")) >= 0:  # what the file begins with: see _same_head
            head = data[:min(first + 1, HEAD_BYTES)]
            self._heads[name] = (len(head), zlib.crc32(head))
        if src.skipping:  # still inside an over-long line: drop through its newline
            newline = data.find(b"\n")
            if newline < 0:
                src.pending = b""
                src.items.append((src.key, src.key, src.read_pos, None))
                return
            src.skipping = False
            src.items.append((src.key, src.key, start + newline + 1, None))
            start, data = start + newline + 1, data[newline + 1:]
        end = data.rfind(b"\n")
        if end < 0:
            src.pending = data
            if len(data) > MAX_LINE_BYTES:
                src.pending, src.skipping = b"", True
                src.items.append((src.key, src.key, src.read_pos, (name, JournalError(
                    RejectReason.MALFORMED, f"line longer than {MAX_LINE_BYTES} bytes"))))
            return
        src.pending = data[end + 1:]
        lines = data[:end].split(b"\n")
        ends = list(accumulate(map(len, lines)))  # line i ends at start + ends[i] + i + 1 (its newline)
        if all(lines):
            nonempty: Sequence[int] = range(len(lines))
        else:
            nonempty = [i for i, line in enumerate(lines) if line]
            lines = [lines[i] for i in nonempty]
        decoded = _decoded(lines)
        starts, pid, limit = self._starts, src.pid, self._not_after()
        if start == 0:  # the file's start: its writer's first record (seq 0), wherever in the chunk it lies
            for item in decoded:
                if (not isinstance(item, JournalError) and item.seq == 0 and item.pid == pid
                        and item.mono < starts.get(pid, _NEVER) and _keeps_order(item, limit)):
                    starts[pid] = item.mono
        key, items, last = src.key, src.items, src.seq
        begun = starts.get(pid, -_NEVER) if pid is not None else -_NEVER
        for i, item in zip(nonempty, decoded, strict=True):
            if isinstance(item, JournalError):
                items.append((key, key, start + ends[i] + i + 1, (name, item)))
                continue
            mono = item.mono
            if item.pid == pid or pid is None:
                if key < mono <= limit and item.seq > last and self_consistent(
                        item, kind := item.type, item.start if kind in SPAN_EVENTS else mono):  # _keeps_order, inlined
                    key, last = mono, item.seq
                order = mono if mono >= begun else _after(begun)
            else:  # another process's record in this file: never its merge time
                theirs = starts.get(item.pid, -_NEVER)
                order = mono if mono >= theirs else _after(theirs)
            items.append((key, order, start + ends[i] + i + 1, item))
        if not nonempty or nonempty[-1] != len(ends) - 1:
            items.append((key, key, start + ends[-1] + len(ends), None))  # trailing empty lines: move past them too
        src.key, src.seq = key, last

    def _hand_on(self, ingest: Ingest) -> int:
        """Ingest every buffered item up to the merge watermark, in key order; advance offsets."""
        watermark = min((s.key for s in self._open.values() if s.more), default=float("inf"))
        batch: list[_Item] = []
        for name, src in self._open.items():
            items = src.items
            n = len(items)
            if items and items[-1][0] > watermark:
                n = next(i for i, item in enumerate(items) if item[0] > watermark)
            if n:
                batch += items[:n]
                self.offsets[name] = (src.inode, items[n - 1][2])
                del items[:n]
        if not batch:  # the file setting the watermark has nothing buffered: read it first
            return 0
        batch.sort(key=itemgetter(1))  # stable: equal times keep their file's order
        events: list[Event] = []
        for _key, _order, _end, payload in batch:
            if isinstance(payload, tuple):
                name, error = payload
                self._reject(error.reason.value, name, str(error))
            elif payload is not None:
                events.append(payload)
        ingest(events)
        return len(batch)

    def _retire(self) -> None:
        """Forget drained vanished files; close quiet descriptors (offsets stay), quietest first."""
        for name, src in list(self._open.items()):
            if src.vanished and not src.more and not src.items:
                if src.pending and not src.skipping:
                    self._reject(RejectReason.MALFORMED.value, name, "file deleted with a partial last line")
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

    def _reject(self, reason: str, name: str, detail: str) -> None:
        self.rejected[reason] += 1
        self._log.warning(reason, "journal %s: rejected (%s): %s", name, reason, detail)

    def _unreadable(self, name: str, inode: int, exc: OSError) -> None:
        if (name, inode) not in self._failing:
            self._failing.add((name, inode))
            self._reject(UNREADABLE, name, f"{type(exc).__name__}: {exc}")

    def _close(self, name: str) -> None:
        src = self._open.pop(name)
        try:
            os.close(src.fd)
        except OSError:
            pass
