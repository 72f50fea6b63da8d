#!/usr/bin/env bash
# README command 1: install what is needed, then run the reference job with the sidecar and print the SLO report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/nvrx-slo demo "$@"
