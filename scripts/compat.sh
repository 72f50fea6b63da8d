#!/usr/bin/env bash
# The NVRx compatibility matrix: every NVRx-dependent test, once per NVRx release, on this machine's Python.
#
#   bash scripts/compat.sh                 # 0.4.1, 0.5.0 and 0.6.0 (what CI runs after the main suite)
#   bash scripts/compat.sh 0.6.0           # one release
#
# Each release is installed into its own directory (.compat/nvrx-X) that goes first on PYTHONPATH over
# the project's .venv: the release's wheel from PyPI as published (`--platform`: 0.4.1 is built for
# glibc 2.31, 0.5+ only for glibc 2.39), and its dependencies resolved for this machine.
# What that proves: NVRx's own Python code of that release (checkpointing, inprocess, ft_launcher,
# everything nvrx-slo uses) runs with nvrx-slo on this torch. What it does not: the wheel's one compiled
# module (nvrx_cupti_module, used only by NVRx's GPU straggler detector) is never loaded, and the
# dependency versions are this machine's, not a Debian 13 resolution.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
PY=.venv/bin/python
tag=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
# Every file with a test marked nvrx and not external (tests/test_compat_list.py holds this list to
# that), the whole file; the external ones (Prometheus, Chromium) check what the sidecar renders,
# which no NVRx release reaches, except the deploy flags that ft_launcher's own parser must accept.
tests=(tests/test_nvrx_compat.py tests/test_hooks_inprocess.py tests/test_hooks_checkpoint.py tests/test_trainer_checkpoint.py
       tests/test_trainer_cli.py tests/test_reference_job.py tests/test_demo_command.py
       tests/test_sidecar_demo.py tests/test_demo_pods.py tests/test_launcher_edges.py tests/test_fault_dating.py
       tests/test_gpu_check.py tests/test_cli.py
       "tests/test_deploy_images.py::test_every_trainer_flag_is_one_its_parser_accepts")
versions=("$@")
[ $# -gt 0 ] || versions=(0.4.1 0.5.0 0.6.0)
failed=()
for v in "${versions[@]}"; do
    dir=.compat/nvrx-$v
    if [ ! -f "$dir/.installed" ]; then
        rm -rf "$dir"
        "$PY" -m pip install -q --target "$dir" --no-deps --only-binary=:all: --implementation cp \
            --python-version "$tag" --platform manylinux_2_39_x86_64 --platform manylinux_2_31_x86_64 \
            "nvidia-resiliency-ext==$v"
        # its own dependencies (torch is the project's pinned build, never a second one)
        mapfile -t deps < <("$PY" - "$dir" "$v" <<'EOF'
import sys
from importlib.metadata import PathDistribution
from pathlib import Path
dist = PathDistribution(Path(sys.argv[1]) / f"nvidia_resiliency_ext-{sys.argv[2]}.dist-info")
for req in dist.requires or []:
    if "extra ==" not in req and not req.replace(" ", "").startswith("torch"):
        print(req.split(";")[0].replace(" ", "").replace("(", "").replace(")", ""))
EOF
        )
        "$PY" -m pip install -q --target "$dir" "${deps[@]}"
        touch "$dir/.installed"
    fi
    got=$(PYTHONPATH=$dir "$PY" -c 'import importlib.metadata as m; print(m.version("nvidia-resiliency-ext"))')
    [ "$got" = "$v" ] || { echo "compat: asked for NVRx $v, imported $got" >&2; exit 1; }
    echo "=== NVRx $v (Python $tag): ${#tests[@]} test files"
    if ! PYTHONPATH=$dir "$PY" -m pytest -q -p no:cacheprovider -m "" "${tests[@]}"; then
        failed+=("$v")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "compat: failed on NVRx ${failed[*]}" >&2
    exit 1
fi
echo "compat: passed on NVRx ${versions[*]}"
