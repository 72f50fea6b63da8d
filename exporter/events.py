"""The journal's events as the sidecar holds them: one ``msgspec`` struct class per event type.

Each struct is built from its event's declaration in ``nvrx_slo.contracts.schema`` (the schema's
field tables, which are derived from the declaration) and subclasses it. So an event's
attributes are the schema's fields by construction, its class is also its declaration for
``isinstance`` (``isinstance(event, schema.Step)``, ``isinstance(event, schema.Span)``), and the
type checker reads every payload field with the declaration's type. ``type`` is the event's
``EventType``, a class attribute. Structs hold scalars and strings only, so they can be in no
reference cycle: the garbage collector need not track them (``gc=False``).

The reader decodes journal lines into these structs (``exporter/ingest/decode.py``); the engine
accounts them and keeps those it has not applied yet in its saved state, encoded by msgspec
through the same classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import msgspec

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import Blocked, CheckpointEnd, CheckpointScheduled, EventType, Record, Span, Step

__all__ = ["AFTER_ALL", "BEFORE_ALL", "STRUCTS", "Event", "as_event", "begin", "self_consistent"]

_BOUNDED: dict[Any, Any] = {  # the schema's number bounds, checked by msgspec in C
    int: Annotated[int, msgspec.Meta(ge=-schema.MAX_NUMBER, le=schema.MAX_NUMBER)],
    float: Annotated[float, msgspec.Meta(ge=-schema.MAX_NUMBER, le=schema.MAX_NUMBER)],
}


def _union(types: tuple[Any, ...]) -> Any:
    """``types[0] | types[1] | …`` built at run time (one type stays itself), numbers bounded."""
    types = tuple(_BOUNDED.get(t, t) for t in types)
    return Union[types] if len(types) > 1 else types[0]  # noqa: UP007 - a run-time tuple needs Union[...]


def _struct(kind: EventType, declared: type[Record]) -> type[Record]:
    """The event's fields as a struct subclassing its declaration: every field required but the
    optional ones (``None`` when absent), the schema's types exactly (a number is ``int | float``,
    never ``bool``), tagged by ``type``."""
    fields: list[tuple[Any, ...]] = [("v", Literal[schema.SCHEMA_VERSION])]
    for name, types in {**schema.COMMON_FIELDS, **schema.PAYLOAD_FIELDS[kind]}.items():
        if name not in ("v", "type"):
            fields.append((name, _union(types)))
    for name, types in schema.OPTIONAL_FIELDS.get(kind, {}).items():
        fields.append((name, _union(types), None))
    struct: type[Record] = msgspec.defstruct(kind.value, fields, bases=(msgspec.Struct, declared),  # type: ignore[assignment]
                                             tag_field="type", tag=kind.value, module=__name__, gc=False)
    return struct  # a Struct and its declaration: msgspec's stubs see only the first


STRUCTS: dict[EventType, type[Record]] = {kind: _struct(kind, declared) for kind, declared in schema.EVENTS.items()}

if TYPE_CHECKING:
    Event = Record  # every struct is its declaration's subclass, and so a Record
else:
    Event = Union[tuple(STRUCTS.values())]  # noqa: UP007 - what msgspec decodes: one of the structs, by its tag


# Instants before and after every one a record can hold (``schema.MAX_NUMBER`` bounds them): what
# the engine starts its "newest" and "due" instants at. Finite, so its saved state stays JSON.
BEFORE_ALL = -2.0 * schema.MAX_NUMBER
AFTER_ALL = 2.0 * schema.MAX_NUMBER


def as_event(record: dict[str, Any]) -> Event:
    """The event of a record ``schema.validate`` accepts (a record built in code, not read), or ``JournalError``."""
    return msgspec.convert(schema.validate(record), Event)


def begin(record: Event) -> float:
    """When a record's time begins: its ``start`` if it is a span, else its ``mono``."""
    return record.start if isinstance(record, Span) else record.mono


MAX_SPAN_S = 7 * 86400.0  # no step, restore, finalize or save lasts a week
EPS = 1e-6  # float noise allowed where a measured part must fit inside its span


def self_consistent(record: Event, start: float) -> bool:
    """Whether a record's own times and sizes agree with each other (``start``: ``begin(record)``):
    no span or save ending before it starts or lasting longer than ``MAX_SPAN_S``, no step phase
    negative or longer than its span, no negative bytes, stage times or waits on saves. The engine
    refuses a record that fails it (``implausible``), and the reader lets no such record's time
    move a file's merge order: it is a property of the record alone."""
    mono = record.mono
    if start > mono + EPS or mono - start > MAX_SPAN_S:
        return False
    if isinstance(record, Step):
        span = mono - start + EPS  # three comparisons written out: this runs once per step
        return (0.0 <= record.data_s <= span and 0.0 <= record.compute_s <= span
                and 0.0 <= record.optimizer_s <= span and (record.blocked_s or 0.0) >= 0.0)
    if isinstance(record, CheckpointScheduled):
        return 0.0 <= record.plan_s <= MAX_SPAN_S and 0.0 <= record.stage_s <= MAX_SPAN_S and record.bytes >= 0
    if isinstance(record, CheckpointEnd):
        return (record.written <= mono + EPS and mono - record.written <= MAX_SPAN_S
                and 0.0 <= (record.waited_s or 0.0) <= MAX_SPAN_S)
    return not isinstance(record, Blocked) or 0.0 <= (record.blocked_s or 0.0) <= MAX_SPAN_S
