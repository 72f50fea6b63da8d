"""The sidecar's event structs are the schema's declarations, field for field and type for type."""

from __future__ import annotations

import typing

import msgspec
import pytest

from journal_fixtures import record, step
from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.exporter.events import STRUCTS, as_event


def _accepts(hint: object) -> set[type]:
    """The Python types a struct field's annotation admits (its bounds, ``Annotated``, left aside)."""
    out: set[type] = set()
    for part in typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,):
        if typing.get_origin(part) is typing.Annotated:
            part = typing.get_args(part)[0]
        out.add(type(None) if part is None else part)
    return out


@pytest.mark.parametrize("kind", list(EventType))
def test_each_struct_has_exactly_its_declarations_fields_with_their_types(kind):
    struct = STRUCTS[kind]
    declared = schema.EVENTS[kind]
    fields = {f.name: f for f in msgspec.structs.fields(struct)}
    required = {**schema.COMMON_FIELDS, **schema.PAYLOAD_FIELDS[kind]}
    optional = schema.OPTIONAL_FIELDS.get(kind, {})
    assert set(fields) == (set(required) | set(optional)) - {"type"}
    for name, types in {**required, **optional}.items():
        if name in ("v", "type"):
            continue
        assert _accepts(fields[name].type) == set(types), name
        assert (fields[name].default is None) == (name in optional), name
    assert fields["v"].type == typing.Literal[schema.SCHEMA_VERSION]
    assert issubclass(struct, declared) and struct.type is kind is declared.type


def test_the_field_tables_are_read_from_the_declarations():
    """What the validator checks is what a declaration says: its annotations, its defaults (optional)
    and its mixins (the span and checkpoint sets)."""
    assert schema.PAYLOAD_FIELDS[EventType.CHECKPOINT_END]["error"] == (str, type(None))  # required, nullable
    assert schema.OPTIONAL_FIELDS[EventType.CHECKPOINT_END] == {"waited_s": (int, float, type(None))}
    assert schema.PAYLOAD_FIELDS[EventType.STEP]["start"] == (int, float)  # from Span
    assert schema.SPAN_EVENTS == {"step", "step_failed", "user_span", "restore", "checkpoint_finalize"}
    assert schema.CHECKPOINT_EVENTS == {"checkpoint_start", "checkpoint_scheduled", "checkpoint_finalize",
                                        "checkpoint_end"}
    assert set(schema.EVENTS) == set(EventType)


def test_an_event_is_an_instance_of_its_declaration_and_its_mixins():
    event = as_event(step(7, 10.0, 3))
    assert isinstance(event, schema.Step) and isinstance(event, schema.Span) and isinstance(event, schema.Blocked)
    assert not isinstance(event, schema.CheckpointPart)
    assert event.type is EventType.STEP and (event.step, event.blocked_s) == (3, None)
    end = as_event(record("checkpoint_end", 4, 8.0, ckpt="c1", step=3, ok=True, written=7.5, error=None))
    assert isinstance(end, schema.CheckpointEnd) and isinstance(end, schema.CheckpointPart)
