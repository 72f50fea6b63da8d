"""Why a journal line was not accounted: every reason one is counted under, as exported
(``nvrx_exporter_rejected_events_total{reason}``).

The journal's own reasons come with its contract (``schema.RejectReason``: the schema or the
plausibility rules refused the line); the others are the reader's I/O trouble and the sidecar's
refusals. Plain names in a module every layer may import: the reader and the sidecar count under
them, the views list them all (a reason never seen is exported as 0, so its rate reads 0, not absent).
"""

from __future__ import annotations

from nvrx_slo.contracts.schema import RejectReason

UNREADABLE = "unreadable"  # a journal file could not be opened or read (counted once per episode)
FILE_TRUNCATED = "file_truncated"  # a file shrank under its read offset (writers never truncate)
DUPLICATE = "duplicate"  # the engine saw this (pid, seq) already: ignored
LATE = "late"  # older than the engine's reorder window when it arrived: not accounted
IMPLAUSIBLE = RejectReason.IMPLAUSIBLE.value  # the engine's plausibility rules refused it
ENGINE_ERROR = "engine_error"  # a valid record the engine raised on: skipped (a bug; logged)

REASONS: tuple[str, ...] = (*(r.value for r in RejectReason), UNREADABLE, FILE_TRUNCATED, DUPLICATE, LATE,
                            ENGINE_ERROR)
