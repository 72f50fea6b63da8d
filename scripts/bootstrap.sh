#!/usr/bin/env bash
# Create .venv and install the project with every extra (sidecar, trainer, generate, dev).
# Idempotent: re-runs only when pyproject.toml or this script changes.
# torch==2.13.0 goes in first: it is the CPU build on this kind of machine, and anything installed
# before it that depends on torch would otherwise pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=$(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ "$(cat .venv/.bootstrap-stamp 2>/dev/null)" != "$stamp" ]; then
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q "torch==2.13.0"
    .venv/bin/pip install -q -e ".[sidecar,trainer,generate,dev]"
    echo "$stamp" > .venv/.bootstrap-stamp
fi
