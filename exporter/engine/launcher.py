"""The pod's ft_launcher as its newest records tell, and what it decides: how many ranks the pod
runs, how many restarts it has left, and whether the pod finished."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from nvrx_slo.contracts.schema import EventType, LauncherStart
from nvrx_slo.exporter.engine.lanes import Lane
from nvrx_slo.exporter.engine.restarts import LauncherMark
from nvrx_slo.exporter.events import Event


@dataclass(slots=True)
class Launcher:
    start: float | None = None  # mono of the newest launcher_start
    exit: float | None = None  # mono of the newest launcher_exit
    max_restarts: int | None = None  # of the newest launcher_start
    ranks: int | None = None  # the workers the newest launcher_start said it starts
    world: int | None = None  # the job's ranks a launcher_start said (a fixed-size job)

    def note(self, record: Event) -> None:
        """A record of the launcher process."""
        if isinstance(record, LauncherStart) and (self.start is None or record.mono > self.start):
            self.start, self.max_restarts = record.mono, record.max_restarts
            self.ranks, self.world = record.local_world_size, record.world_size
        elif record.type is EventType.LAUNCHER_EXIT and (self.exit is None or record.mono > self.exit):
            self.exit = record.mono

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

    def finished(self, lanes: Mapping[int, Lane], marks: list[LauncherMark]) -> bool:
        """The pod's launcher exited after its last start, and every rank it ran ended cleanly.

        A pod decides from its own ranks: in a job of many pods it sees only its share of the
        world, and the launcher's exit says none of its workers is left. Its ranks' own
        ``local_world_size`` says how many there are, so a rank whose file is read after the
        launcher's exit still keeps the pod running. Without a journaled launcher a pod never
        counts as finished: a launcher read late could still show it running, and un-finishing
        would take settled seconds back.
        """
        if not self.exited():
            return False
        # Ranks of the launcher's last round of workers only (``marks``: its records, oldest first):
        # an earlier round's process may have journaled as another rank before it was torn down
        # (an in-process restart that shifted ranks)
        began = next((at for at, kind in reversed(marks) if kind is EventType.LAUNCHER_WORKER_START), float("-inf"))
        ran = [lane for lane in lanes.values() if lane.newest >= began]
        return (len(ran) >= max((lane.local_world_size for lane in ran), default=1)
                and all(lane.newest_kind is EventType.PROCESS_END for lane in ran))
