#!/usr/bin/env bash
# Create .venv and install the project with every extra (sidecar, trainer, generate, dev).
# Idempotent: re-runs only when pyproject.toml or this script changes.
# torch==2.13.0 goes in first, so nothing installed after it pulls another torch. Where no NVIDIA GPU
# is present it comes from PyTorch's CPU wheel index (about 200 MB): PyPI's torch for x86_64 Linux
# is the CUDA build, which pulls several GB of CUDA libraries. An index that cannot be reached fails
# fast (short timeout, one retry) and the default index is used instead (pip's own configuration,
# e.g. a CPU wheel it is told to find locally, or else the CUDA build). With a GPU: the default index.
set -euo pipefail
cd "$(dirname "$0")/.."
# The trainer needs a Python that NVRx publishes wheels for (3.10-3.12; none for 3.13, Debian 13's python3).
supported() { "$1" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))' 2>/dev/null; }
if [ -n "${PYTHON:-}" ]; then
    supported "$PYTHON" || { echo "bootstrap: PYTHON=$PYTHON is not Python 3.10-3.12 (NVRx has no wheel for it)" >&2; exit 2; }
    PY=$PYTHON
else
    PY=
    for candidate in python3 python3.11 python3.12 python3.10; do
        if command -v "$candidate" >/dev/null && supported "$candidate"; then PY=$candidate; break; fi
    done
    [ -n "$PY" ] || { echo "bootstrap: no Python 3.10-3.12 found (python3 is $(python3 -V 2>&1)); install one, e.g. apt-get install python3.11, or set PYTHON" >&2; exit 2; }
    [ "$PY" = python3 ] || echo "bootstrap: python3 is $(python3 -V 2>&1 | cut -d' ' -f2), which NVRx has no wheel for; using $PY"
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
TORCH="torch==2.13.0"
CPU_INDEX=https://download.pytorch.org/whl/cpu
gpu() { [ -n "$(ls /proc/driver/nvidia/gpus 2>/dev/null)" ] || nvidia-smi -L >/dev/null 2>&1; }
stamp=$(sha256sum pyproject.toml scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ "$(cat .venv/.bootstrap-stamp 2>/dev/null)" != "$stamp" ]; then
    .venv/bin/pip install -q --upgrade pip
    if gpu; then
        .venv/bin/pip install -q "$TORCH"
    else
        .venv/bin/pip install -q --index-url "$CPU_INDEX" --timeout 10 --retries 1 "$TORCH" || {
            echo "bootstrap: no $TORCH from $CPU_INDEX; installing it from the default index" >&2
            .venv/bin/pip install -q "$TORCH"
        }
    fi
    .venv/bin/pip install -q -e ".[sidecar,trainer,generate,dev]"
    echo "$stamp" > .venv/.bootstrap-stamp
fi
