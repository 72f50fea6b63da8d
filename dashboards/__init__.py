"""Grafana dashboards as code (grafanalib), generated to JSON and ConfigMaps."""
