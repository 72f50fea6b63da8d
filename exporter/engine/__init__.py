"""The accounting: events in, snapshots out (``engine.Engine``, ``snapshot.Snapshot``; a job of
several pods is ``offline/rollup.py``'s). Pure: no I/O, threads or clocks; it reads events as
``nvrx_slo.exporter.events`` holds them."""
