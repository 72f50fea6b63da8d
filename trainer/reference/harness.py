"""The demo's harness: the reference job under ft_launcher, with one crash and one exception: on CUDA +
NCCL with one rank per GPU where GPUs are visible, else on 2 CPU ranks (``demo_device``); as several
pods, one of which its node may lose (``NodeLoss``).

``run_demo`` is the reusable part (tests start their own sidecar or Prometheus beside a run and
read ``DemoResult.journal_dir``). ``nvrx-slo demo`` (``nvrx_slo/demo.py``) runs it with the sidecar
beside it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

from nvrx_slo.contracts import pod_env, schema
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer.reference.faults import Fault

# The crash (SIGKILL, an in-job restart by ft_launcher) comes well after the first checkpoint and
# the exception (an in-process restart by inprocess.Wrapper) after the fourth, so both roll back work.
JOB_NAME = "demo"  # NVRX_SLO_JOB of every pod of a demo run (the Downward API sets it in a cluster)
DEFAULT_FAULTS = (Fault("crash", 24), Fault("exception", 45))
_FLAGS = {"crash": "--crash-at", "exception": "--raise-at", "hang": "--hang-at"}


@dataclasses.dataclass(frozen=True)
class DemoDevice:
    """Where a one-pod demo runs, and its size there."""

    kind: str  # "cuda" (NCCL, one rank per GPU: NCCL refuses two ranks on one GPU) or "cpu" (gloo)
    ranks: int
    steps: int
    checkpoint_every: int
    faults: tuple[Fault, ...]
    train_args: tuple[str, ...] = ()  # nvrx-slo train's model size
    timeout_s: float = 300.0  # a run still going then is killed
    # a rank takes CUDA whenever it sees a GPU: a CPU demo on a GPU host hides them
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)


CPU = DemoDevice("cpu", 2, 50, 10, DEFAULT_FAULTS, env={"CUDA_VISIBLE_DEVICES": ""})
# On a GPU: 118 M parameters (1.4 GB of model and optimizer state to save), 16 K tokens a step, TF32
# matmuls: about 1.3e13 FLOP a step, estimated at 50-150 ms on an H100/H200 (not measured: see
# docs/gpu.md). A save every 500 steps (25-75 s) keeps a steady save's blocking (the state's copy to
# host memory, planning, polls: a few hundred ms) near 1% of the time between saves; 1,500 steps, a
# crash after the first save and an exception after the second: an estimated 2-5 minutes.
SIZES = {  # nvrx-slo train's model flags, by ``--size``
    "tiny": (),  # the reference job's defaults: the CPU demo
    "small": ("--vocab", "8192", "--d-model", "512", "--heads", "8", "--layers", "4", "--seq", "512", "--batch", "8"),
    "large": ("--vocab", "8192", "--d-model", "1024", "--heads", "16", "--layers", "8", "--seq", "1024",
              "--batch", "16"),
}
GPU_FAULTS = (Fault("crash", 600), Fault("exception", 1100))
GPU = DemoDevice("cuda", 1, 1500, 500, GPU_FAULTS, SIZES["large"], timeout_s=900.0)


def demo_device(gpus: int, *, size: str | None = None, steps: int | None = None, checkpoint_every: int | None = None,
                faults: Sequence[Fault] | None = None) -> DemoDevice:
    """The one-pod demo for a host with ``gpus`` visible CUDA devices, each its rank (else 2 CPU ranks),
    at that device's defaults but for what is given: the model ``size`` (``SIZES``), the ``steps``, a
    save every ``checkpoint_every`` steps, the ``faults`` (on the last rank)."""
    base = CPU if gpus < 1 else dataclasses.replace(GPU, ranks=gpus)
    return dataclasses.replace(
        base, train_args=base.train_args if size is None else SIZES[size],
        steps=base.steps if steps is None else steps,
        checkpoint_every=base.checkpoint_every if checkpoint_every is None else checkpoint_every,
        faults=base.faults if faults is None else tuple(faults))


def parse_faults(text: str) -> tuple[Fault, ...]:
    """``crash@600,exception@1100`` (kinds: crash, exception, hang), or ``none``; ``ValueError`` else."""
    if text.strip() == "none":
        return ()
    faults = []
    for part in text.split(","):
        kind, _, step = part.strip().partition("@")
        if kind not in _FLAGS or not step.strip().isdigit():
            raise ValueError(f"{part.strip()!r} is not KIND@STEP with KIND one of {', '.join(_FLAGS)}")
        faults.append(Fault(kind, int(step)))
    return tuple(faults)


def visible_gpus() -> int:
    """The CUDA devices a rank started here would see: torch's count (CUDA is not initialised)."""
    import torch  # the trainer extra; imported only when a demo starts

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@dataclasses.dataclass(frozen=True)
class NodeLoss:
    """Every process of one pod killed at once, as when its node is lost, and a replacement pod
    (a new launcher with a new journal directory, as Kubernetes reschedules it) started later."""

    pod: int  # the pod's index
    at_step: int  # killed once its rank journaled this step
    replace_after_s: float


@dataclasses.dataclass(frozen=True)
class PodLost:
    """What the harness did, on its own clock (CLOCK_MONOTONIC, the journal's): the ground truth."""

    pod: int
    killed_mono: float
    killed_wall: float
    replacement_journal: Path
    replaced_mono: float | None  # the replacement's launcher started; None if the job ended first


@dataclasses.dataclass(frozen=True)
class DemoResult:
    run_dir: Path
    journal_dirs: tuple[Path, ...]  # one per pod (a replacement pod's last), each followed by its own sidecar
    checkpoint_dir: Path  # shared by every pod, as a job's checkpoint volume is
    log_path: Path  # the launchers' and ranks' combined output
    returncode: int  # the first non-zero exit among the launchers not killed on purpose, else 0
    lost: PodLost | None = None

    @property
    def journal_dir(self) -> Path:
        """The journal of a one-pod run."""
        (journal_dir,) = self.journal_dirs
        return journal_dir


def journal_dirs(run_dir: Path, pods: int) -> tuple[Path, ...]:
    """Where a run's pods journal: ``run_dir/journal``, or ``run_dir/pod-<i>/journal`` for several."""
    return (run_dir / "journal",) if pods == 1 else tuple(run_dir / f"pod-{i}" / "journal" for i in range(pods))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tree(pid: int) -> list[int]:
    """``pid`` and every process descended from it (workers run in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        out.append(todo.pop())
        todo += children.get(out[-1], [])
    return out


def _kill_tree(pid: int) -> None:
    for p in _tree(pid):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_listening(port: int, proc: subprocess.Popen[bytes], deadline: float) -> None:
    while proc.poll() is None and time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)


def _reached(journal_dir: Path, step: int) -> bool:
    """A rank of the pod journaled ``step`` (the node loss's trigger): its files' step records."""
    for path in journal_dir.glob(f"*{schema.JOURNAL_SUFFIX}"):
        for line in path.read_bytes().splitlines():
            try:
                record = schema.decode(line)
            except schema.JournalError:
                continue
            if record["type"] == EventType.STEP.value and record["step"] >= step:
                return True
    return False


def launch_args(checkpoint_dir: Path, *, device: DemoDevice, pods: int, steps: int, checkpoint_every: int,
                faults: Sequence[Fault], inprocess: bool, rdzv_port: int | None) -> list[str]:
    """``nvrx-slo ft-launcher``'s arguments for a demo run: the pods' topology, then ``nvrx-slo train``'s."""
    train = ["-m", "nvrx_slo", "train", "--steps", str(steps), "--checkpoint-every", str(checkpoint_every),
             "--checkpoint-dir", str(checkpoint_dir), *(["--inprocess"] if inprocess else []), *device.train_args]
    for fault in faults:
        train += [_FLAGS[fault.kind], str(fault.step)]
    if pods == 1:
        topology = ["--standalone", "--nproc-per-node", str(device.ranks)]
        train += ["--fault-rank", str(device.ranks - 1)]  # not rank 0 (it hosts the stores) unless alone
    else:
        topology = ["--nnodes", f"{pods}:{pods}", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                    "--rdzv-endpoint", f"127.0.0.1:{rdzv_port}", "--rdzv-id", "demo"]
        # faults on the job's last rank: a Wrapper that terminates the faulty rank renumbers every
        # rank above it (ShiftRanks); with none above, each pod's process keeps its rank
        train += ["--fault-rank", str(pods - 1)]
    return [*topology, "--max-restarts", "3", "--monitor-interval", "0.5", *train]


def _check(run_dir: Path, checkpoint_dir: Path, pod_journals: Sequence[Path], device: DemoDevice,
           node_loss: NodeLoss | None) -> None:
    """Refuse a run that cannot be made (see ``run_demo``)."""
    pods = len(pod_journals)
    if checkpoint_dir.exists() or any(d.exists() for d in pod_journals):
        raise FileExistsError(f"{run_dir} already holds a run; choose a fresh directory")
    if pods > 1 and device.kind != "cpu":
        raise ValueError("a demo of several pods runs on CPU: on one host every pod's rank would take GPU 0")
    if node_loss is not None and not 0 < node_loss.pod < pods:
        raise ValueError(f"pod {node_loss.pod} cannot be lost: pods 1 to {pods - 1} can (pod 0 hosts the "
                         "rendezvous store, and the job cannot outlive it)")


def _ended(procs: Iterable[subprocess.Popen[bytes]], killed: subprocess.Popen[bytes] | None) -> list[int]:
    """The launchers' exit codes, each killed (with its tree) if still running, but the one killed on purpose's."""
    codes = []
    for proc in procs:
        if proc.poll() is None:
            _kill_tree(proc.pid)
        code = proc.wait()
        if proc is not killed:
            codes.append(code)
    return codes


def run_demo(run_dir: Path, *, faults: Sequence[Fault] = DEFAULT_FAULTS, steps: int = 50,
             checkpoint_every: int = 10, pods: int = 1, inprocess: bool = True, node_loss: NodeLoss | None = None,
             on_pod: Callable[[str, Path], None] | None = None, extra_args: Sequence[str] = (),
             extra_env: Mapping[str, str] | None = None, timeout_s: float = 300,
             device: DemoDevice = CPU) -> DemoResult:
    """Run the reference job (``--inprocess`` unless told not) under ``nvrx-slo ft-launcher`` in ``run_dir``.

    One pod: a standalone launcher with ``device``'s ranks (faults on the last), journal in
    ``run_dir/journal``. Several (CPU only: each pod's rank would take GPU 0): one launcher per pod
    (``pod-<i>``, 1 rank each, its own journal in ``run_dir/pod-<i>/journal``) meeting in a c10d
    rendezvous on loopback, as the pods of a job on N nodes do. ``node_loss`` kills one of them and
    starts ``pod-<i>-replacement`` later; ``on_pod("lost", journal_dir)`` is called just after the
    kill, ``on_pod("starting", journal_dir)`` just before the replacement starts (a sidecar starts
    before its pod's main container).
    ``run_dir`` must not hold an earlier run (faults fire once per checkpoint directory).
    ``extra_args`` go to ``nvrx-slo train``. Returns when every launcher exits; a run still going
    after ``timeout_s`` is killed (launchers, ranks and writers) and reported with code -9.
    """
    run_dir = Path(run_dir)
    checkpoint_dir, log_path = run_dir / "checkpoints", run_dir / "demo.log"
    pod_journals = journal_dirs(run_dir, pods)
    _check(run_dir, checkpoint_dir, pod_journals, device, node_loss)
    run_dir.mkdir(parents=True, exist_ok=True)
    port = _free_port() if pods > 1 else None
    cmd = [sys.executable, "-m", "nvrx_slo", "ft-launcher",
           *launch_args(checkpoint_dir, device=device, pods=pods, steps=steps, checkpoint_every=checkpoint_every,
                        faults=faults, inprocess=inprocess, rdzv_port=port), *extra_args]
    deadline = time.monotonic() + timeout_s
    with open(log_path, "wb") as log:

        def launch(i: int, name: str, journal_dir: Path) -> subprocess.Popen[bytes]:
            # GROUP_RANK: the pod's node index. NVRx 0.5 refuses to rendezvous without an
            # infrastructure rank (GROUP_RANK or SLURM_PROCID); 0.4.1 ignores it, 0.6+ assigns ranks by it.
            env = {**os.environ, schema.JOURNAL_DIR_ENV: str(journal_dir), pod_env.JOB: JOB_NAME,
                   "GROUP_RANK": str(i), "OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR",
                   **device.env, **({} if pods == 1 else {pod_env.POD: name}), **(extra_env or {})}
            return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        procs = {"pod-0": launch(0, "pod-0", pod_journals[0])}
        if port is not None:  # pod 0 hosts the rendezvous store (its endpoint), as a job's first pod does
            _wait_listening(port, procs["pod-0"], deadline)
        procs.update({f"pod-{i}": launch(i, f"pod-{i}", d) for i, d in enumerate(pod_journals) if i})
        lost: PodLost | None = None
        killed: subprocess.Popen[bytes] | None = None
        while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
            if node_loss is not None and killed is None and _reached(pod_journals[node_loss.pod], node_loss.at_step):
                killed = procs[f"pod-{node_loss.pod}"]
                _kill_tree(killed.pid)
                name = f"pod-{node_loss.pod}-replacement"
                lost = PodLost(node_loss.pod, time.monotonic(), time.time(), run_dir / name / "journal", None)
                if on_pod is not None:
                    on_pod("lost", pod_journals[node_loss.pod])
            if node_loss is not None and lost is not None and lost.replaced_mono is None and \
                    time.monotonic() >= lost.killed_mono + node_loss.replace_after_s:
                if on_pod is not None:
                    on_pod("starting", lost.replacement_journal)
                procs[f"pod-{node_loss.pod}-replacement"] = launch(node_loss.pod, name, lost.replacement_journal)
                lost = dataclasses.replace(lost, replaced_mono=time.monotonic())
            time.sleep(0.2)
        codes = _ended(procs.values(), killed)
    dirs = pod_journals if lost is None or lost.replaced_mono is None else (*pod_journals, lost.replacement_journal)
    return DemoResult(run_dir, dirs, checkpoint_dir, log_path, next((c for c in codes if c), 0), lost)
