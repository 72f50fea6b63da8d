"""nvrx-slo: goodput accounting and SLO enforcement for NVRx FSDP training jobs.

What a training script uses comes from here::

    from nvrx_slo import Hooks

``__all__`` is the supported surface: each name is defined in a module at ``nvrx_slo.trainer``'s top
level and keeps working at that full path too. ``nvrx_slo.trainer.reference`` is the reference job
and the demo: example code, not imported by anything here.

A facade like ``prometheus_client``'s, but lazy (PEP 562): ``import nvrx_slo``, which every
``nvrx-slo`` command does first, reads this file and nothing else, and a name costs its own module
on first use — ``nvrx_slo.Hooks`` the standard library only (a training process's base install).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvrx_slo.trainer.hooks import Hooks
    from nvrx_slo.trainer.inprocess_callbacks import inprocess_wrapper, inprocess_wrapper_kwargs
    from nvrx_slo.trainer.saves import CheckpointSave

# Each name of the surface -> the module that defines it under that name.
_HOMES = {
    "Hooks": "nvrx_slo.trainer.hooks",
    "CheckpointSave": "nvrx_slo.trainer.saves",
    "inprocess_wrapper": "nvrx_slo.trainer.inprocess_callbacks",
    "inprocess_wrapper_kwargs": "nvrx_slo.trainer.inprocess_callbacks",
}

__all__ = ["CheckpointSave", "Hooks", "inprocess_wrapper", "inprocess_wrapper_kwargs"]

if not TYPE_CHECKING:  # hidden from mypy, so that a misspelt name is a type error, not Any

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'nvrx_slo' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # resolved once
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
