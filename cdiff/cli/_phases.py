"""The phases of `cdiff run` (set-up, compilation, the run, the reference solution,
plotting, writing, the animation): announced on stderr as each starts, timed, and
summed up as the table's wall time."""

from __future__ import annotations

import os
import sys
import time

from cdiff.cli._interrupt import Interrupt


class Phases:
    """The phases of `cdiff run`: `start` says on stderr what begins (with the
    time since the command started) and ends the phase before; `times` holds the
    seconds of each."""

    #: How an interrupt names each phase.
    NAMES = {"set-up": "set-up", "compile": "compilation", "run": "the solve",
             "reference": "the reference solution", "plotting": "plotting",
             "writing": "writing", "animation": "the animation"}

    def __init__(self, before: float = 0.0, interrupt: Interrupt | None = None):
        self.started = time.perf_counter()
        self.before = before  # seconds before `main` (Python and JAX start-up)
        self.times: dict[str, float] = {}
        self._current: tuple[str, float] | None = None
        self.interrupt = Interrupt() if interrupt is None else interrupt

    def start(self, key: str, message: str) -> None:
        now = self.stop()
        self._current = (key, now)
        self.interrupt.during = self.NAMES.get(key, key)
        print(f"[{self.before + now - self.started:6.1f} s] {message} ...",
              file=sys.stderr, flush=True)

    def stop(self) -> float:
        now = time.perf_counter()
        if self._current is not None:
            key, then = self._current
            self.times[key] = self.times.get(key, 0.0) + now - then
            self._current = None
        return now

    def total(self) -> float:
        return self.before + time.perf_counter() - self.started


def startup_time() -> float:
    """Seconds from the creation of this process until now (Linux's /proc; 0
    where it cannot be read): the start-up of `python -m cdiff.cli`, which
    imports `cdiff` before any code of the command runs. (The creation is the
    fork, not the exec: whatever the process did before it ran Python counts too.
    The console script measures from its own first statement instead,
    `cdiff_cli_entry.STARTED`.)"""
    try:
        with open("/proc/self/stat") as f:
            started = float(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


def wall_time(phases: Phases) -> tuple[str, str]:
    """The table's wall time: the whole command, and each phase."""
    names = {"start-up": "start-up (Python, JAX imports)"}
    times = ({"start-up": phases.before} if phases.before else {}) | phases.times
    total = phases.total()
    # (The rest, outside every phase: parsing, the errors and the table.)
    times["other"] = max(0.0, total - sum(times.values()))
    parts = [f"{names.get(key, key)} {seconds:.2f} s"
             for key, seconds in times.items()]
    return f"{total:.2f} s, the whole command:", ", ".join(parts)
