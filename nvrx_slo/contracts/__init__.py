"""The two contracts between the rooms, kept in neither: the journal schema (``schema``: the
trainer writes it, the exporter reads it) and the metric catalogue (``catalogue``: the exporter
emits it, alerts and dashboards query it). Standard library only, so the base install carries them."""
