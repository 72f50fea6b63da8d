"""What the launcher told a rank process, read from its environment: torchrun (and ft_launcher,
which is torchrun's agent), srun, or nothing (plain ``python``: rank 0 of one).

torchrun's variables win where both are set (srun starting one torchrun per node). Each function
takes the environment and returns None where nothing says, so a caller picks its own default.

============== =============================== =========================================
what           torchrun / ft_launcher          srun
============== =============================== =========================================
rank           ``RANK``                        ``SLURM_PROCID``
local rank     ``LOCAL_RANK``                  ``SLURM_LOCALID``
ranks here     ``LOCAL_WORLD_SIZE``            this node's entry of ``SLURM_TASKS_PER_NODE``
restart count  ``TORCHELASTIC_RESTART_COUNT``  ``SLURM_RESTART_COUNT`` (a requeued job)
restarts left  ``TORCHELASTIC_MAX_RESTARTS``   (srun restarts nothing)
============== =============================== =========================================
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Set by ``nvrx-slo ft-launcher`` for its workers: the launcher journals when it started them.
OUR_LAUNCHER = "NVRX_SLO_FT_LAUNCHER"
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")  # one SLURM_TASKS_PER_NODE entry: "2" or "2(x3)"


def int_env(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "")
    return int(value) if value.strip().lstrip("-").isdigit() else None


def _first(env: Mapping[str, str], *names: str) -> int | None:
    return next((v for v in (int_env(env, n) for n in names) if v is not None), None)


def ours(env: Mapping[str, str]) -> bool:
    """Whether ``nvrx-slo ft-launcher`` started this process."""
    return env.get(OUR_LAUNCHER) == "1"


def rank(env: Mapping[str, str]) -> int | None:
    return _first(env, "RANK", "SLURM_PROCID")


def local_rank(env: Mapping[str, str]) -> int | None:
    return _first(env, "LOCAL_RANK", "SLURM_LOCALID")


def restart(env: Mapping[str, str]) -> int | None:
    return _first(env, "TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")


def max_restarts(env: Mapping[str, str]) -> int | None:
    return int_env(env, "TORCHELASTIC_MAX_RESTARTS")


def local_world_size(env: Mapping[str, str]) -> int | None:
    """The workers of this process's node: torchrun's count, else srun's tasks on node
    ``SLURM_NODEID`` (``SLURM_TASKS_PER_NODE`` lists them node by node: ``2(x3),1``)."""
    local = int_env(env, "LOCAL_WORLD_SIZE")
    node = int_env(env, "SLURM_NODEID")
    if local is not None or node is None:
        return local
    counts: list[int] = []
    for entry in env.get("SLURM_TASKS_PER_NODE", "").split(","):
        match = _TASKS.match(entry.strip())
        if match is None:
            return None
        counts += [int(match[1])] * int(match[2] or 1)
    return counts[node] if 0 <= node < len(counts) else None
