"""The contracts between the rooms, kept in neither: the journal schema (``schema``: the trainer
writes it, the exporter reads it), the metric catalogue (``catalogue``: the exporter emits it, alerts
and dashboards query it), the environment a pod's processes read their job, pod and node from
(``pod_env``), and the SLO targets the views judge against (``targets``). Standard library only, so
the base install carries them."""
