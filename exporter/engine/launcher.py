"""The pod's ft_launcher as its newest records tell, and what it decides: how many ranks the pod
runs, how many restarts it has left, and whether the pod's job is over — or, where no launcher
of ours runs (torchrun, srun, plain ``python``), what its ranks' own ends decide."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvrx_slo.contracts.schema import EventType, LauncherExit, LauncherStart
from nvrx_slo.exporter.engine.lanes import Lane
from nvrx_slo.exporter.events import Event


@dataclass(slots=True)
class Launcher:
    start: float | None = None  # mono of the newest launcher_start
    exit: float | None = None  # mono of the newest launcher_exit
    code: int = 0  # its exit code
    max_restarts: int | None = None  # of the newest launcher_start
    ranks: int | None = None  # the workers the newest launcher_start said it starts
    world: int | None = None  # the job's ranks a launcher_start said (a fixed-size job)

    def note(self, record: Event) -> None:
        """A record of the launcher process."""
        if isinstance(record, LauncherStart) and (self.start is None or record.mono > self.start):
            self.start, self.max_restarts = record.mono, record.max_restarts
            self.ranks, self.world = record.local_world_size, record.world_size
        elif isinstance(record, LauncherExit) and (self.exit is None or record.mono > self.exit):
            self.exit, self.code = record.mono, record.code

    def exited(self) -> bool:
        """Whether the pod's newest launcher has exited (none journaled: not exited)."""
        return self.exit is not None and self.exit >= (self.start if self.start is not None else float("-inf"))

    def remaining(self, lanes: Mapping[int, Lane]) -> int | None:
        """Restarts the newest launcher may still make: its ``--max-restarts`` minus the highest
        restart count its workers journaled (ranks whose newest record predates it ran under an
        older launcher, which counted from 0 too)."""
        if self.max_restarts is None or self.start is None:
            return None
        start = self.start
        done = max((lane.newest_restart for lane in lanes.values() if lane.newest >= start), default=0)
        return max(0, self.max_restarts - done)

    def pod_ranks(self, lanes: Mapping[int, Lane], finished: bool) -> int:
        """The ranks this pod runs: those its processes journaled, and while its launcher runs, the
        workers it said it starts (so a pod's ranks count from its launcher's start, as its wall does);
        none once it finished (its wall stopped: another pod still running leaves its ranks absent)."""
        if finished:
            return 0
        running = self.start is not None and not self.exited()
        return max(len(lanes), (self.ranks or 0) if running else 0)

    def ending(self, lanes: Mapping[int, Lane], workers_started: float) -> Ending | None:
        """How the pod's job ended, None while it runs. Over when no process of it can run again:

        * under a launcher of ours, once it exited after its last start: failed if it exited with
          an error; finished once every rank of its last round ended (below);
        * without one (torchrun, srun, ``python``; a launcher of ours never journaled), once every
          rank's newest process ended (``process_end``; its successor's start ends a process as
          well): failed if one ended by an exception, unless its launcher restarts the round
          (torchrun's restart count is below its ``max_restarts``).

        A pod decides from its own ranks: in a job of many pods it sees only its share of the world.
        Its ranks' own ``local_world_size`` says how many there are, so a rank whose file is read
        after the others ended keeps the pod running. A killed process journals no end, so a job
        whose last round was killed and not restarted stays running here: the sidecar settles it
        when its pod ends (SIGTERM), and a report of it says so.
        """
        began = float("-inf")
        if self.start is not None:
            if not self.exited():
                return None
            if self.code != 0:
                return Ending(f"launcher exited with code {self.code}")
            # Ranks of the launcher's last round of workers only (``workers_started``: when it began):
            # an earlier round's process may have journaled as another rank before it was torn down
            # (an in-process restart that shifted ranks)
            began = workers_started
        ran = {rank: lane for rank, lane in lanes.items() if lane.newest >= began}
        if not ran or len(ran) < max(lane.local_world_size for lane in ran.values()) or any(
                lane.newest_kind is not EventType.PROCESS_END for lane in ran.values()):
            return None
        failed = [(rank, lane) for rank, lane in sorted(ran.items()) if lane.end_error is not None]
        if not failed:
            return Ending(None)
        if self.start is None and any(lane.max_restarts is not None and lane.newest_restart < lane.max_restarts
                                      for lane in ran.values()):
            return None  # torchrun starts the round again
        rank, lane = failed[0]
        return Ending(f"rank {rank}: {lane.end_error}")


@dataclass(frozen=True, slots=True)
class Ending:
    """A job that is over: ``failure`` says how it failed, None if it finished cleanly."""

    failure: str | None
