"""Lines read from the journal's files, held until their turn and handed on merged by time
(``JournalTail``'s second job: its first is following the files).

Every complete line read becomes an *item* of its file's ``Source``: (merge key, order, offset just
past the line, event | (file, rejection) | None). The key is the time it waits for before it is
handed on: its own (or the newest before it) among its writer's lines in order; the order is the
record's own time, never before its process's first record (see ``split``). A round hands on, in
order, every item whose key is at most the lowest "read so far" time of the files that have more
(``hand_on``). Nearly every chunk is its writer's records in order: those are made into items a
chunk at a time, each line's key and order its own time.
"""

from __future__ import annotations

import math
import zlib
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from operator import add, attrgetter, itemgetter, le, lt
from typing import Any, cast

from nvrx_slo.contracts.schema import JournalError, RejectReason
from nvrx_slo.exporter.events import Event, begin, self_consistent
from nvrx_slo.exporter.ingest.decode import decode_batch

HEAD_BYTES = 256  # of a file's first line, remembered to tell a file cut and rewritten from one grown
MAX_LINE_BYTES = 1 << 20  # a "line" longer than this is garbage: rejected, skipped to its newline
_NEVER = float("inf")
_MONO, _SEQ, _PID = attrgetter("mono"), attrgetter("seq"), attrgetter("pid")
_KEY, _ORDER, _PAYLOAD = itemgetter(0), itemgetter(1), itemgetter(3)

Item = tuple[float, float, int, Event | tuple[str, JournalError] | None]
Reject = Callable[[RejectReason, str, str], None]


@dataclass
class Source:
    """An open journal file: where reading got to, and lines read but not yet handed on."""

    fd: int
    inode: int
    read_pos: int  # next byte to read; the handed-on offset lives in JournalTail.offsets
    pending: bytes = b""  # after the last newline: a partial line waiting for its end
    skipping: bool = False  # inside an over-long line: drop bytes up to the next newline
    items: list[Item] = field(default_factory=list)
    key: float = float("-inf")  # mono of the newest confirmed line read so far (see split)
    more: bool = True  # the last read filled its chunk: more may be waiting
    vanished: bool = False  # deleted or replaced: read to the end, then forget
    last_growth: float = 0.0
    pid: int | None = None  # the writer its name gives (None: not a journal file name)
    seq: int = -1  # seq of the line that set ``key``
    candidate: tuple[float, int] | None = None  # (mono, seq) of the newest line that may set it once confirmed

    def waits(self) -> float:
        """The time a line read now waits for before it is handed on (``split``)."""
        return self.key if self.candidate is None else self.candidate[0]


def _keeps_order(event: Event, limit: float) -> bool:
    """Whether a line of its file's writer may set its process's start: not in the sidecar's
    future, and its own times agree (what the engine refuses alone)."""
    mono = event.mono
    return mono <= limit and self_consistent(event, begin(event))


def _lower(items: list[Item], key: float) -> None:
    """Buffered items wait for no later time than ``key`` (their keys stay non-decreasing)."""
    i = len(items) - 1
    while i >= 0 and items[i][0] > key:
        items[i] = (key, *items[i][1:])
        i -= 1


def _after(start: float) -> float:
    """The order of a record dated before its process's first record: just after that record."""
    return math.nextafter(start, _NEVER)


def _decoded(lines: list[bytes], body: bytes | None) -> Sequence[Event | JournalError]:
    """``decode_batch``, and if it raises (a decoder bug on some hostile line), line by line, so
    that only the lines it raises on are lost — each counted as malformed — never the chunk."""
    try:
        return decode_batch(lines, body)
    except Exception:  # whatever it is, it must not take the valid lines with it
        out: list[Event | JournalError] = []
        for line in lines:
            try:
                out += decode_batch([line])
            except Exception as exc:
                out.append(JournalError(RejectReason.MALFORMED, f"undecodable: {type(exc).__name__}"))
        return out




def split(name: str, src: Source, data: bytes, starts: dict[int, float], limit: float,
          heads: dict[str, tuple[int, int]]) -> None:
    """Turn ``src.pending + data`` into items, one per complete line; keep the partial tail.
    ``starts``: pid -> mono of its first record (seq 0) as read; ``limit``: the latest plausible
    mono now; ``heads``: name -> (length, crc32) of a file's first line (``JournalTail._same_head``)."""
    start = src.read_pos - len(src.pending)  # file offset of the first byte of pending + data
    src.read_pos += len(data)
    data = src.pending + data
    if start == 0 and (first := data.find(b"\n")) >= 0:  # what the file begins with
        head = data[:min(first + 1, HEAD_BYTES)]
        heads[name] = (len(head), zlib.crc32(head))
    if src.skipping:  # still inside an over-long line: drop through its newline
        newline = data.find(b"\n")
        if newline < 0:
            src.pending = b""
            src.items.append((src.waits(), src.waits(), src.read_pos, None))
            return
        src.skipping = False
        src.items.append((src.waits(), src.waits(), start + newline + 1, None))
        start, data = start + newline + 1, data[newline + 1:]
    end = data.rfind(b"\n")
    if end < 0:
        src.pending = data
        if len(data) > MAX_LINE_BYTES:
            src.pending, src.skipping = b"", True
            src.items.append((src.waits(), src.waits(), src.read_pos, (name, JournalError(
                RejectReason.MALFORMED, f"line longer than {MAX_LINE_BYTES} bytes"))))
        return
    src.pending = data[end + 1:]
    chunk = data[:end]
    lines = chunk.split(b"\n")
    body: bytes | None = chunk
    ends = list(accumulate(map(len, lines)))  # line i ends at start + ends[i] + i + 1 (its newline)
    if all(lines):
        nonempty: Sequence[int] = range(len(lines))
    else:
        nonempty = [i for i, line in enumerate(lines) if line]
        lines, body = [lines[i] for i in nonempty], None
    decoded = _decoded(lines, body)
    pid = src.pid
    if start == 0:  # the file's start: its writer's first record (seq 0), wherever in the chunk it lies
        for item in decoded:
            if (not isinstance(item, JournalError) and item.seq == 0 and item.pid == pid
                    and item.mono < starts.get(pid, _NEVER) and _keeps_order(item, limit)):
                starts[pid] = item.mono
    begun = starts.get(pid, -_NEVER) if pid is not None else -_NEVER
    if not (isinstance(nonempty, range) and _in_order(src, decoded, begun, limit, start, ends)):
        _keyed(name, src, decoded, nonempty, starts, begun, limit, [start + e + i + 1 for i, e in enumerate(ends)])
    if not nonempty or nonempty[-1] != len(ends) - 1:  # trailing empty lines: move past them too
        src.items.append((src.waits(), src.waits(), start + ends[-1] + len(ends), None))


def _in_order(src: Source, decoded: Sequence[Event | JournalError], begun: float, limit: float, start: int,
              ends: list[int]) -> bool:
    """Make items of a chunk of its writer's records in order, all plausible in time, a chunk at a
    time (what ``_keyed`` makes of them line by line: each waits for its own time, in its own
    order); False, changing nothing, if the chunk is not one."""
    if src.pid is None or any(issubclass(t, JournalError) for t in set(map(type, decoded))):
        return False
    monos, seqs = list(map(_MONO, decoded)), list(map(_SEQ, decoded))
    if (set(map(_PID, decoded)) != {src.pid} or monos[0] < begun or monos[-1] > limit
            or not all(map(le, monos, monos[1:])) or not all(map(lt, seqs, seqs[1:]))):
        return False
    candidate = src.candidate
    if candidate is not None and seqs[0] > candidate[1] and monos[0] >= candidate[0]:
        key, last = candidate  # its first line confirms the newest line before it
    elif seqs[0] > src.seq and monos[0] >= src.key:
        key, last = src.key, src.seq
        _lower(src.items, monos[0])
    else:
        return False
    if len(monos) > 1:
        key, last = monos[-2], seqs[-2]
    src.key, src.seq, src.candidate = key, last, (monos[-1], seqs[-1])
    events = cast("Sequence[Event]", decoded)  # no rejection among them: see above
    src.items += zip(monos, monos, map(add, ends, range(start + 1, start + 1 + len(ends))), events, strict=True)
    return True


def _keyed(name: str, src: Source, decoded: Sequence[Event | JournalError], nonempty: Sequence[int],
           starts: dict[int, float], begun: float, limit: float, ends: list[int]) -> None:
    """Make an item of each line (``ends``: the offset past each line, by line number) with its merge
    key and order. A file's "read so far" time moves only to a line of its own writer (the pid in
    its name), not in the sidecar's future, once a later line of that writer confirms it (a greater
    seq, no earlier time): one line the engine would refuse cannot hold its file's later lines back."""
    pid, key, items, last, candidate = src.pid, src.key, src.items, src.seq, src.candidate
    for i, item in zip(nonempty, decoded, strict=True):
        held = key if candidate is None else candidate[0]  # what this line waits for, unless it moves it
        if isinstance(item, JournalError):
            items.append((held, held, ends[i], (name, item)))
            continue
        mono = item.mono
        if item.pid == pid or pid is None:
            if mono <= limit:  # the merge key: see the docstring
                seq = item.seq
                if candidate is not None and seq > candidate[1] and mono >= candidate[0]:
                    key, last = candidate  # confirmed by a later line of its writer
                    candidate, held = (mono, seq), mono
                elif seq > last and mono >= key:  # the first, or one that contradicts the candidate
                    candidate, held = (mono, seq), mono
                    _lower(items, mono)  # the lines read since no longer wait for the candidate's time
            order = mono if mono >= begun else _after(begun)
        else:  # another process's record in this file: never its merge time
            theirs = starts.get(item.pid, -_NEVER)
            order = mono if mono >= theirs else _after(theirs)
        items.append((held, order, ends[i], item))
    src.key, src.seq, src.candidate = key, last, candidate


def hand_on(sources: dict[str, Source], offsets: dict[str, tuple[int, int]], reject: Reject,
            ingest: Callable[[list[Event]], None]) -> int:
    """Ingest every buffered item up to the merge watermark, in order; advance ``offsets``
    (name -> (inode, offset past the last line handed on)). Returns the lines handed on."""
    watermark = min((s.key for s in sources.values() if s.more), default=_NEVER)
    batch: list[Item] = []
    for name, src in sources.items():
        items = src.items
        n = len(items)
        if items and items[-1][0] > watermark:  # keys never decrease along a file's items
            n = bisect_right(items, watermark, key=_KEY)
        if n:
            batch += items[:n]
            offsets[name] = (src.inode, items[n - 1][2])
            del items[:n]
    if not batch:  # the file setting the watermark has nothing buffered: read it first
        return 0
    batch.sort(key=_ORDER)  # stable: equal times keep their file's order
    payloads: list[Any] = list(map(_PAYLOAD, batch))
    if {tuple, type(None)}.isdisjoint(map(type, payloads)):  # all events: the usual case
        ingest(payloads)
        return len(batch)
    events: list[Event] = []
    for payload in payloads:
        if isinstance(payload, tuple):
            name, error = payload
            reject(error.reason, name, str(error))
        elif payload is not None:
            events.append(payload)
    ingest(events)
    return len(batch)
