"""The accounting: events in, snapshots out (``engine.Engine``, ``snapshot.Snapshot``; ``job`` adds up
pods). Pure: no I/O, threads or clocks; imports ``ingest`` only for the event type."""
