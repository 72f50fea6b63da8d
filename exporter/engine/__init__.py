"""The accounting: events in, snapshots out (``engine.Engine``, ``snapshot.Snapshot``; ``job`` adds up
pods). Pure: no I/O, threads or clocks; it reads events as ``nvrx_slo.exporter.events`` holds them."""
