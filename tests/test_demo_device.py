"""What ``nvrx-slo demo`` runs on: CUDA + NCCL with one rank per GPU where GPUs are visible, else 2 CPU
ranks on gloo. No GPU runs here: this checks the choice (``demo_device``) and the command it makes,
read back with the reference job's own parser; the GPU run itself is unverified (docs/gpu.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nvrx_slo.trainer.reference import harness
from nvrx_slo.trainer.reference.harness import CPU, DEFAULT_FAULTS, demo_device, launch_args
from nvrx_slo.trainer.reference.job import parse_args
from nvrx_slo.trainer.reference.model import ModelConfig

pytestmark = pytest.mark.torch


def _args(device, pods: int = 1) -> tuple[list[str], list[str]]:
    args = launch_args(Path("/ckpt"), device=device, pods=pods, steps=device.steps,
                       checkpoint_every=device.checkpoint_every, faults=device.faults, inprocess=True,
                       rdzv_port=29500 if pods > 1 else None)
    split = args.index("-m")
    return args[:split], args[split + 3:]  # the launcher's topology; nvrx-slo train's flags


def _params(model: ModelConfig) -> int:
    block = 4 * model.d_model**2 + 8 * model.d_model**2  # attention projections, the 4x feed-forward
    return model.layers * block + 2 * model.vocab * model.d_model + model.seq * model.d_model


def test_without_a_gpu_the_demo_is_two_cpu_ranks_with_cuda_hidden_as_before():
    device = demo_device(0)
    launcher, train = _args(device)
    cfg = parse_args(train)
    assert device == CPU and device.kind == "cpu" and device.env == {"CUDA_VISIBLE_DEVICES": ""}
    assert launcher[launcher.index("--nproc-per-node") + 1] == "2" and cfg.fault_rank == 1
    assert (cfg.steps, cfg.checkpoint_every, cfg.model) == (50, 10, ModelConfig())
    assert [(f.kind, f.step) for f in cfg.faults] == [(f.kind, f.step) for f in DEFAULT_FAULTS]


@pytest.mark.parametrize("gpus", [1, 8])
def test_with_gpus_the_demo_runs_one_rank_per_gpu_with_its_faults_on_the_last(gpus):
    device = demo_device(gpus)
    launcher, train = _args(device)
    cfg = parse_args(train)
    assert device.kind == "cuda" and "CUDA_VISIBLE_DEVICES" not in device.env
    assert launcher[launcher.index("--nproc-per-node") + 1] == str(gpus) and cfg.fault_rank == gpus - 1
    assert cfg.inprocess and device.timeout_s > CPU.timeout_s


def test_the_gpu_demo_is_sized_to_be_productive_between_saves_and_still_show_both_restarts():
    """The sizes the docs reason from (docs/gpu.md): a model whose steps are long against what a save
    and the loop cost, saves far apart, and each fault after a save, so each rolls back work."""
    device = demo_device(1)
    cfg = parse_args(_args(device)[1])
    params = _params(cfg.model)
    state_bytes = 3 * 4 * params  # fp32 parameters and AdamW's two moments
    flop_per_step = 6 * params * cfg.model.batch * cfg.model.seq
    assert 100e6 < params < 150e6 and 1e9 < state_bytes < 2e9 and flop_per_step > 1e13
    saves = range(device.checkpoint_every - 1, cfg.steps, device.checkpoint_every)
    assert len(saves) >= 3 and all(any(s < f.step < s + device.checkpoint_every for s in saves) for f in cfg.faults)
    assert cfg.steps > max(f.step for f in cfg.faults) and {f.kind for f in cfg.faults} == {"crash", "exception"}


def test_a_demo_of_several_pods_runs_on_cpu_only(tmp_path):
    with pytest.raises(ValueError, match="runs on CPU"):
        harness.run_demo(tmp_path / "run", pods=2, device=demo_device(2))
    launcher, train = _args(CPU, pods=3)
    assert "--nnodes" in launcher and parse_args(train).fault_rank == 2


def test_the_demo_is_shortened_by_its_flags_on_a_gpu_and_on_the_cpu():
    """``--size``, ``--steps``, ``--save-every`` and ``--faults`` reach nvrx-slo train's command: a demo
    that fits a slow GPU, or a longer CPU one."""
    faults = harness.parse_faults("crash@120,exception@220")
    for gpus in (0, 2):
        device = demo_device(gpus, size="small", steps=300, checkpoint_every=100, faults=faults)
        cfg = parse_args(_args(device)[1])
        assert (cfg.steps, cfg.checkpoint_every, cfg.model.d_model, cfg.model.layers) == (300, 100, 512, 4)
        assert [(f.kind, f.step) for f in cfg.faults] == [("crash", 120), ("exception", 220)]
        assert device.kind == ("cuda" if gpus else "cpu") and device.ranks == (gpus or 2)
    assert demo_device(1, faults=harness.parse_faults("none")).faults == ()
    assert parse_args(_args(demo_device(0, size="large"))[1]).model.d_model == 1024
    for bad in ("crash", "crash@x", "boom@3", "crash@3,,"):
        with pytest.raises(ValueError, match="KIND@STEP"):
            harness.parse_faults(bad)
