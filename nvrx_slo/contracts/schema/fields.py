"""The field tables, derived from the declarations (``records``): what each record type requires and
what it may leave out, as the Python types a JSON value of it may have."""

from __future__ import annotations

import typing
from typing import Any

from nvrx_slo.contracts.schema.records import EVENTS, CheckpointPart, EventType, Record, Span, Writer


def _accepted(hint: Any) -> tuple[type, ...]:
    """The JSON values a field's annotation admits: ``float`` is any number, ``X | None`` adds null."""
    out: list[type] = []
    for part in typing.get_args(hint) or (hint,):
        part = type(None) if part is None else part
        out += [int, float] if part is float else [str] if part is EventType else [part]
    return tuple(out)


def _fields(cls: type, below: type | None) -> tuple[dict[str, tuple[type, ...]], dict[str, tuple[type, ...]]]:
    """The required and the optional fields ``cls`` declares (less those of ``below``)."""
    skip = typing.get_type_hints(below) if below is not None else {}
    required: dict[str, tuple[type, ...]] = {}
    optional: dict[str, tuple[type, ...]] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if name not in skip:
            (optional if hasattr(cls, name) and name != "type" else required)[name] = _accepted(hint)
    return required, optional


# the record's stamp, then who wrote it (every identity field is required of a record)
COMMON_FIELDS: dict[str, tuple[type, ...]] = {
    **_fields(Record, None)[0], **{name: _accepted(hint) for name, hint in typing.get_type_hints(Writer).items()}}
# Required payload fields per event type. Writers may add extra fields; readers ignore them.
PAYLOAD_FIELDS: dict[EventType, dict[str, tuple[type, ...]]] = {kind: _fields(cls, Record)[0]
                                                                 for kind, cls in EVENTS.items()}
# Payload fields a writer may leave out: checked like the required ones when present (so they are
# nullable), ``None`` to a reader when absent.
OPTIONAL_FIELDS: dict[EventType, dict[str, tuple[type, ...]]] = {
    kind: optional for kind, cls in EVENTS.items() if (optional := _fields(cls, Record)[1])}
# Events that cover a stretch of time (``Span``), and the parts of one save (``CheckpointPart``).
SPAN_EVENTS = frozenset(kind.value for kind, cls in EVENTS.items() if issubclass(cls, Span))
CHECKPOINT_EVENTS = frozenset(kind.value for kind, cls in EVENTS.items() if issubclass(cls, CheckpointPart))
