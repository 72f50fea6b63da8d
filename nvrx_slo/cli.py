"""The `nvrx-slo` command: a thin dispatcher to each room's own entry point.

Subcommands are imported lazily so that each runs with only its own extras installed (the sidecar
image has no torch, a training image no prometheus-client); a missing extra is named, not a
traceback. Each entry point is a `main(argv: list[str]) -> int` that parses its own arguments
with argparse; those that judge SLOs take `main(argv, targets)` too. The targets are read here,
from the SLO spec that the alert rules are generated from (``alerts/slo.yaml``), because the
exporter may not import the alerts room that owns the spec and its loader: the views get numbers
(``nvrx_slo.contracts.targets``), so a changed spec changes the page and the rules alike.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Iterator

from nvrx_slo.contracts.targets import Targets

# name -> ("module:function", the extras it needs, one-line help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": ("nvrx_slo.demo:main", "trainer,sidecar",
             "run the reference FSDP job with the sidecar and print the SLO report"),
    "train": ("nvrx_slo.trainer.reference.job:main", "trainer",
              "the reference FSDP training job (run it under ft_launcher or torchrun)"),
    "ft-launcher": ("nvrx_slo.trainer.ft_launcher:main", "trainer",
                    "NVRx ft_launcher, unchanged, with its own events journaled"),
    "sidecar": ("nvrx_slo.exporter.sidecar:main", "sidecar",
                "follow a journal directory and serve /metrics, OTLP and a status page"),
    "report": ("nvrx_slo.exporter.offline.report:main", "sidecar",
               "offline HTML report with a timeline from a journal directory"),
    "generate": ("nvrx_slo.generate:main", "generate", "write alert rules, dashboards and Kubernetes manifests"),
    "inject": ("nvrx_slo.inject:main", "generate",
               "add the sidecar to the training pods of Job, PyTorchJob and JobSet manifests"),
}


# The commands whose entry point judges SLOs and so takes the spec's targets.
JUDGES = frozenset({"demo", "sidecar", "report"})


def _targets() -> Targets:
    from nvrx_slo.alerts import spec  # lazily: PyYAML comes with the sidecar and generate extras only

    return spec.load().targets


def _usage() -> str:
    lines = ["usage: nvrx-slo COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<12} {help_}" for name, (_, _, help_) in COMMANDS.items()]
    lines += ["", "Run `nvrx-slo COMMAND --help` for a command's options."]
    return "\n".join(lines)


_PYNVML_MESSAGE = "The pynvml package is deprecated"


@contextlib.contextmanager
def _pynvml_quiet() -> Iterator[None]:
    """NVRx requires the ``pynvml`` package, whose releases from 13 on are a shim that warns, once per
    process, on the first ``import pynvml`` (torch.cuda's at ``import torch``, NVRx's own) that it is
    deprecated for nvidia-ml-py, which NVRx installs too and which that import gets: nothing a user
    of these commands can act on. Only that warning, only while a command runs, in this process and
    in the ones it starts (``PYTHONWARNINGS``: the demo's launchers, ranks and NVRx's writers)."""
    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = ",".join(w for w in (before, f"ignore:{_PYNVML_MESSAGE}:FutureWarning") if w)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_PYNVML_MESSAGE, category=FutureWarning)
            yield
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"nvrx-slo: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    entry, extras, _ = COMMANDS[name]
    module_name, func_name = entry.split(":")
    with _pynvml_quiet():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.partition(".")[0] == "nvrx_slo":
                raise
            print(f"nvrx-slo {name}: needs the {extras!r} extra (no module {exc.name!r}): "
                  f"pip install 'nvrx-slo[{extras}]'", file=sys.stderr)
            return 2
        entry_point = getattr(module, func_name)
        if name in JUDGES:
            return int(entry_point(rest, _targets()) or 0)
        return int(entry_point(rest) or 0)
