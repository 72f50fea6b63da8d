"""Views: what a snapshot is rendered as (Prometheus text, OTLP, the status page, the text and HTML
reports, the timeline, the progress line). Never re-derive what the engine decided."""
