"""Views: what a ``View`` (``view``) is rendered as — its series (``series``) as Prometheus text and
OTLP, the status page, the text SLO report (both judging the SLOs by ``judgement``), the timeline.
They read no journal and know no process. Never re-derive what the engine decided."""
