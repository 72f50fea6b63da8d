"""Offline: a journal directory read after the fact (or followed from outside the sidecar) — the
one replay (``replay``), the timeline built beside it (``timeline_builder``), a job rolled up from its pods'
snapshots (``rollup``), the report and the demo's progress line. Imports ``ingest``, ``engine`` and
``views``; nothing imports it but the commands."""
