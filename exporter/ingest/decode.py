"""Journal lines to validated events, fast: the sidecar's hot path.

``schema.decode`` is the contract; it runs at ~120k lines/s on one core here, below the 200k/s
the sidecar must ingest. This module gets the same answers faster, and hands on *events*
(``nvrx_slo.exporter.events``: one ``msgspec`` struct class per event type, built from the
schema's declarations). The exporter reads records only as events, never as dicts: turning each struct
into a dict was about a quarter of the reader's time (``bench/bench_ingest.py``, docs/benchmarks.md).

* ``msgspec`` parses and type-checks a whole batch of lines at once, as read (``decode_lines``:
  one C call instead of thousands of Python checks, and no copy of the chunk);
  a batch with a bad line falls back to line-by-line so only that line is rejected. Splicing
  two corrupt lines into one object would take several coincident corruptions (see
  ``decode_batch``); the journal's writer is trusted, its storage is not adversarial.
* The structs accept what ``schema.validate`` accepts (extra fields are ignored, as the schema
  says readers do); a line they refuse goes through ``schema.decode`` itself,
  so reject reasons are the contract's by construction (pinned by a property test).

A line the structs refuse is decoded by ``schema.decode`` itself, the contract, so its reason is
the contract's: ``NaN``/``Infinity`` and invalid UTF-8 (anywhere, unknown fields included) are
``malformed``, a number past ``schema.MAX_NUMBER`` (or ``1e400``) is ``out_of_range``, and a line
nested too deep for the parser is ``malformed`` — that line alone, never the lines read with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter

import msgspec

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import JournalError
from nvrx_slo.exporter.events import Event

_ONE = msgspec.json.Decoder(Event)
_FIRST, _LAST = itemgetter(0), itemgetter(-1)  # a line's first and last byte


def decode(line: bytes) -> Event:
    """One line (no newline needed) to a valid event, or ``JournalError``."""
    try:
        line.decode()  # msgspec skips unknown fields without checking their UTF-8
        return _ONE.decode(line)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        pass
    return msgspec.convert(schema.decode(line), Event)  # the contract's answer, reason included


def decode_batch(lines: list[bytes], body: bytes | None = None) -> Sequence[Event | JournalError]:
    """Decode complete, non-empty lines; item *i* is line *i*'s event or the ``JournalError`` rejecting it.
    ``body``: the lines as read, ``b"\\n".join(lines)`` (given, it is not joined again)."""
    # msgspec reads the lines as a stream of JSON values, which may span lines or share one. They
    # split back into the same lines when every line starts with "{" and ends with "}" (no value
    # then continues past its line's end) and the value count matches. Otherwise go line by line.
    n = len(lines)
    if n and all(lines) and set(map(_FIRST, lines)) == {ord("{")} and set(map(_LAST, lines)) == {ord("}")}:
        if body is None:
            body = b"\n".join(lines)
        try:
            if not body.isascii():
                body.decode()  # see decode(): unknown fields' UTF-8
            events = _ONE.decode_lines(body)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            events = None
        if events is not None and len(events) == n:
            return events
    out: list[Event | JournalError] = []
    for line in lines:
        try:
            out.append(decode(line))
        except JournalError as exc:
            out.append(exc)
    return out
