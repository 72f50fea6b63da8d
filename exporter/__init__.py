"""The sidecar: journal reader, time-accounting engine and its views. Never imports torch or NVRx.

Layered one way: ``ingest`` (journal files to events, side inputs) → ``engine`` (events to
snapshots, pure) → ``views`` (a ``View`` of a snapshot to Prometheus, OTLP, pages, reports). At
the top, the sidecar process that runs them: ``live`` (the one state every view reads),
``sidecar`` (the loop and the command line), ``server`` (HTTP) and ``state_store``
(persistence); beside it, ``offline`` (a journal read after the fact: the report, the demo's
progress line). ``identity``, ``printable`` and ``rejects`` are plain helpers any layer may use.
"""
