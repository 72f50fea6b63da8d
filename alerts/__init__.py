"""SLO spec and generated Prometheus alerting rules / Alertmanager config."""
