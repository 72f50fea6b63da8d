#!/usr/bin/env bash
# README command 2: install what is needed (Python env + Debian's Prometheus, Alertmanager, Chromium,
# VictoriaMetrics), run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v promtool >/dev/null || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null || need+=(prometheus-alertmanager)
command -v chromium >/dev/null || need+=(chromium)
command -v vmalert >/dev/null || need+=(victoria-metrics)  # with victoria-metrics and vmagent
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
bash scripts/bootstrap.sh
export NVRX_SLO_TESTS_NEED_ALL=1  # every tool is installed now: a test that misses one fails (tests/needs.py)
exec .venv/bin/python -m pytest -m "" "$@"  # every tier: plain pytest leaves the slow one out
