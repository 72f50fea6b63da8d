"""Journal lines to validated events, fast: the sidecar's hot path.

``schema.decode`` is the contract; it runs at ~120k lines/s on one core here, below the 200k/s
the sidecar must ingest. This module gets the same answers faster, and hands on *events*: one
``msgspec`` struct class per event type, its attributes named like the schema's fields, ``type``
its event type. The exporter reads records only as events, never as dicts: turning each struct
into a dict was about a quarter of the reader's time (``bench/bench_ingest.py``, README).

* ``msgspec`` parses and type-checks a whole batch of lines as one JSON array of event structs
  (one C call instead of thousands of Python checks), built from the schema's own field tables;
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

from typing import Annotated, Any, Literal, Protocol, Union

import msgspec

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import JournalError


class Event(Protocol):
    """A decoded journal record, as the type checker sees it.

    At run time it is an instance of its event type's struct class (see ``_struct``), built from
    the schema's field tables, so its attributes are the schema's by construction. Those classes
    exist only at run time, so the checker sees the common fields below, typed, and every payload
    field as ``Any``.
    """

    type: str
    v: int
    seq: int
    mono: float
    wall: float
    job: str
    pod: str
    node: str
    rank: int | None
    local_rank: int | None
    pid: int
    restart: int
    iter: int

    def __getattr__(self, name: str) -> Any: ...


_BOUNDED: dict[Any, Any] = {  # the schema's number bounds, checked by msgspec in C
    int: Annotated[int, msgspec.Meta(ge=-schema.MAX_NUMBER, le=schema.MAX_NUMBER)],
    float: Annotated[float, msgspec.Meta(ge=-schema.MAX_NUMBER, le=schema.MAX_NUMBER)],
}


def _union(types: tuple[Any, ...]) -> Any:
    """``types[0] | types[1] | …`` built at run time (one type stays itself), numbers bounded."""
    types = tuple(_BOUNDED.get(t, t) for t in types)
    return Union[types] if len(types) > 1 else types[0]  # noqa: UP007 - a run-time tuple needs Union[...]


def _struct(event: schema.EventType) -> Any:
    """The event's fields as a struct: every field required but the optional ones (``None`` when
    absent), the schema's types exactly (a number is ``int | float``, never ``bool``), tagged by
    ``type``, which is also a class attribute.
    Its fields are scalars and strings, so it can be in no reference cycle: the garbage collector
    need not track it (``gc=False``)."""
    fields: list[tuple[Any, ...]] = [("v", Literal[schema.SCHEMA_VERSION])]
    for name, types in {**schema.COMMON_FIELDS, **schema.PAYLOAD_FIELDS[event]}.items():
        if name not in ("v", "type"):
            fields.append((name, _union(types)))
    for name, types in schema.OPTIONAL_FIELDS.get(event, {}).items():
        fields.append((name, _union(types), None))
    return msgspec.defstruct(event.value, fields, tag_field="type", tag=event.value,
                             namespace={"type": event.value}, module=__name__, gc=False)


_EVENT: Any = _union(tuple(_struct(event) for event in schema.EventType))
_BATCH = msgspec.json.Decoder(list[_EVENT])
_ONE = msgspec.json.Decoder(_EVENT)


MAX_SPAN_S = 7 * 86400.0  # no step, restore, finalize or save lasts a week
_EPS = 1e-6  # float noise allowed where a measured part must fit inside its span


def self_consistent(record: Event, kind: str, begin: float) -> bool:
    """Whether a record's own times and sizes agree with each other (``begin``: its ``start`` if a
    span, else its ``mono``): no span or save ending before it starts or lasting longer than
    ``MAX_SPAN_S``, no step phase negative or longer than its span, no negative bytes, stage
    times or waits on saves. The engine refuses a record that fails it (``implausible``), and the reader lets no such
    record's time move a file's merge order: it is a property of the record alone."""
    mono = record.mono
    if begin > mono + _EPS or mono - begin > MAX_SPAN_S:
        return False
    if kind == "step":
        span = mono - begin + _EPS  # three comparisons written out: this runs once per step
        return (0.0 <= record.data_s <= span and 0.0 <= record.compute_s <= span
                and 0.0 <= record.optimizer_s <= span and (record.blocked_s or 0.0) >= 0.0)
    if kind == "checkpoint_scheduled":
        return 0.0 <= record.plan_s <= MAX_SPAN_S and 0.0 <= record.stage_s <= MAX_SPAN_S and record.bytes >= 0
    if kind == "checkpoint_end":
        return (record.written <= mono + _EPS and mono - record.written <= MAX_SPAN_S
                and 0.0 <= (record.waited_s or 0.0) <= MAX_SPAN_S)
    return 0.0 <= (getattr(record, "blocked_s", None) or 0.0) <= MAX_SPAN_S


def as_event(record: dict[str, Any]) -> Event:
    """The event of a record ``schema.validate`` accepts (a record built in code, not read), or ``JournalError``."""
    return msgspec.convert(schema.validate(record), _EVENT)


def decode(line: bytes) -> Event:
    """One line (no newline needed) to a valid event, or ``JournalError``."""
    try:
        line.decode()  # msgspec skips unknown fields without checking their UTF-8
        return _ONE.decode(line)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        pass
    return msgspec.convert(schema.decode(line), _EVENT)  # the contract's answer, reason included


def decode_batch(lines: list[bytes]) -> list[Event | JournalError]:
    """Decode complete, non-empty lines; item *i* is line *i*'s event or the ``JournalError`` rejecting it."""
    # The joined array splits back into the same lines when every line is one object: each
    # starts with "{" and ends with "}" and the item count matches. Otherwise go line by line.
    if all(line[:1] == b"{" and line[-1:] == b"}" for line in lines):
        joined = b"[" + b",".join(lines) + b"]"
        try:
            joined.decode()  # see decode(): unknown fields' UTF-8
            events = _BATCH.decode(joined)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            events = None
        if events is not None and len(events) == len(lines):
            return events
    out: list[Event | JournalError] = []
    for line in lines:
        try:
            out.append(decode(line))
        except JournalError as exc:
            out.append(exc)
    return out
