"""Why a journal line was not accounted, whichever part of the sidecar refused it."""

from __future__ import annotations

from enum import Enum


class RejectReason(str, Enum):
    """Why a journal line was not accounted: every reason the sidecar counts (the ``reason`` label
    of ``nvrx_exporter_rejected_events_total``), whichever part of it refused the line."""

    # the schema's (``schema.validate``): the line is no record of this schema
    MALFORMED = "malformed"  # not valid UTF-8 JSON, or truncated
    NOT_AN_OBJECT = "not_an_object"
    UNKNOWN_VERSION = "unknown_version"
    UNKNOWN_TYPE = "unknown_type"
    MISSING_FIELD = "missing_field"
    BAD_FIELD = "bad_field"  # a field of the wrong type
    OUT_OF_RANGE = "out_of_range"  # a number beyond ±MAX_NUMBER, or not finite (1e400, NaN)
    # the reader's: a journal file it could not read, or found cut under its read offset
    UNREADABLE = "unreadable"  # could not be opened or read (counted once per episode)
    FILE_TRUNCATED = "file_truncated"  # shrank under, or was rewritten past, its read offset (writers never truncate)
    # the engine's: a valid record it did not account
    # Rejected by its plausibility rules: a record whose times contradict themselves (a span ending
    # before it starts, a phase longer than its span), its process's other records (far before the
    # process's first record), or the sidecar's clock (in its future). One such record would skew
    # every rank's wall for good.
    IMPLAUSIBLE = "implausible"
    DUPLICATE = "duplicate"  # this (pid, seq, mono) was accounted already
    LATE = "late"  # older than the reorder window when it arrived
    ENGINE_ERROR = "engine_error"  # the engine raised on it: skipped (a bug; logged)


class JournalError(ValueError):
    """A journal line that does not satisfy this schema; ``reason`` says which rule it broke."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
