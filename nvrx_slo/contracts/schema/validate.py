"""The schema's own validator, standard library only: the contract a reader's answers are held to.

The sidecar decodes with msgspec (``nvrx_slo.exporter.ingest.decode``), faster, and falls back to
``decode`` here for a line its structs refuse, so every reject reason is this module's; tests read
journals through it as the truth. ``encode`` writes a record as a writer would.
"""

from __future__ import annotations

import json
from typing import Any

from nvrx_slo.contracts.schema.fields import COMMON_FIELDS, OPTIONAL_FIELDS, PAYLOAD_FIELDS
from nvrx_slo.contracts.schema.records import SCHEMA_VERSION, EventType
from nvrx_slo.contracts.schema.rejects import JournalError, RejectReason

_TYPES = {t.value: t for t in EventType}

# Every number a reader accepts lies within ±MAX_NUMBER (2**53: the integers a float holds
# exactly), and every float is finite. Sums of many such values stay far inside int64 and
# float range, so counters and the persisted state (64-bit JSON) can always hold them.
MAX_NUMBER = 2**53


def _check(record: dict[str, Any], fields: dict[str, tuple[type, ...]]) -> None:
    for name, types in fields.items():
        if name not in record:
            raise JournalError(RejectReason.MISSING_FIELD, name)
        value = record[name]
        # bool is an int subclass: never accept it where a number is meant, nor a number for a bool.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise JournalError(RejectReason.BAD_FIELD, f"{name}={value!r:.40}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not (
                -MAX_NUMBER <= value <= MAX_NUMBER):  # NaN fails both comparisons
            raise JournalError(RejectReason.OUT_OF_RANGE, f"{name}={value!r:.40}")


def validate(record: Any) -> dict[str, Any]:
    """Return ``record`` if it is a valid v1 event, else raise ``JournalError``."""
    if not isinstance(record, dict):
        raise JournalError(RejectReason.NOT_AN_OBJECT, type(record).__name__)
    if record.get("v") != SCHEMA_VERSION:
        raise JournalError(RejectReason.UNKNOWN_VERSION, repr(record.get("v")))
    kind = record.get("type")
    event_type = _TYPES.get(kind) if isinstance(kind, str) else None  # a list or dict here is not a type
    if event_type is None:
        raise JournalError(RejectReason.UNKNOWN_TYPE, repr(record.get("type")))
    _check(record, COMMON_FIELDS)
    _check(record, PAYLOAD_FIELDS[event_type])
    optional = OPTIONAL_FIELDS.get(event_type)
    if optional:
        _check(record, {name: types for name, types in optional.items() if name in record})
    return record


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (writers use allow_nan=False)")


def decode(line: bytes | str) -> dict[str, Any]:
    """Parse and validate one journal line (with or without its trailing newline)."""
    try:
        text = line.decode() if isinstance(line, bytes) else line  # strict UTF-8: no lone surrogates
        record = json.loads(text, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise JournalError(RejectReason.MALFORMED, str(exc)[:80]) from None
    except RecursionError:
        raise JournalError(RejectReason.MALFORMED, "nested too deep") from None
    return validate(record)


def encode(record: dict[str, Any]) -> bytes:
    """Serialise one record to a full line. Compact, ASCII-safe, newline-terminated."""
    return (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
