"""Diagnosis gauges: explain over the last window, on a timer of its own, off the writer's path.

Every INTERVAL_S a thread asks the running tracer's own query socket for
explain over the last SPAN_S seconds of the session (the same request
`ingero explain --since 60s` sends when a tracer holds the file; the
server answers it in a read-only transaction on a cursor of its own, with its
time limit), and keeps one entry per (rule, affected pid) of the chains it
returns, and the steps explain found in the loop it analyses (its main CUDA
process: StepStats in explain --json).  The collector turns them into gauges;
a chain (or a loop) that is no longer found disappears at the next run.  The
writer thread never waits on it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ingero.daemon import client
from ingero.errors import IngeroError

# The window a chain must be active in to be reported: long enough for explain's
# baseline (clean windows of the same run: 30 windows of 2 s), short enough that a
# fixed cause leaves the gauges within a minute.
SPAN_S = 60.0
# How often: one explain over a minute of data costs ~0.1-0.5 s of a core here; every
# 15 s keeps that under 4% of one core, and Prometheus scrapes every 15 s by default.
INTERVAL_S = 15.0
TIMEOUT_S = 30.0
SEVERITY_LEVEL = {"HIGH": 3, "MEDIUM": 2, "LOW": 1}


@dataclass(frozen=True)
class ActiveChain:
    rule: str
    pid: int
    process: str
    severity: str
    share: float  # 0-1 of the process' wall clock


@dataclass(frozen=True)
class StepRate:
    """The loop's steps over the last run's window (a request each, for an inference server)."""

    pid: int
    process: str
    count: int
    median_s: float
    p99_s: float
    per_s: float  # count over the window explain analysed: steps completed in it, per second


@dataclass
class DiagnosisState:
    chains: list[ActiveChain] = field(default_factory=list)
    steps: StepRate | None = None
    runs: int = 0
    errors: int = 0
    last_run_s: float | None = None
    last_error: str | None = None


def _names(payload: dict[str, Any]) -> dict[int, str]:
    names = {}
    for text in (payload.get("analysed") or {}).get("processes") or []:
        # "python (train.py) (PID 4242)"
        head, _, tail = str(text).rpartition(" (PID ")
        if tail.rstrip(")").isdigit():
            names[int(tail.rstrip(")"))] = head
    return names


def active_chains(payload: dict[str, Any]) -> list[ActiveChain]:
    """One entry per (rule, affected pid) of an explain --json payload; the highest share wins."""
    names = _names(payload)
    best: dict[tuple[str, int], ActiveChain] = {}
    for ch in payload.get("chains") or []:
        for pid in ch.get("pids") or []:
            c = ActiveChain(str(ch["rule_id"]), int(pid), names.get(int(pid), ""), str(ch["severity"]),
                            float(ch.get("share") or 0.0))
            old = best.get((c.rule, c.pid))
            if old is None or c.share > old.share:
                best[(c.rule, c.pid)] = c
    return sorted(best.values(), key=lambda c: (c.rule, c.pid))


def step_rate(payload: dict[str, Any]) -> StepRate | None:
    """The steps of an explain --json payload, or None: none found, or none of one traced process
    (an imported trace's ProfilerStep marks carry no pid)."""
    steps = payload.get("steps") or {}
    analysed = payload.get("analysed") or {}
    pid, count = steps.get("pid"), int(steps.get("count") or 0)
    span_s = (int(analysed.get("end_ns") or 0) - int(analysed.get("start_ns") or 0)) / 1e9
    if pid is None or count <= 0 or span_s <= 0:
        return None
    return StepRate(int(pid), _names(payload).get(int(pid), ""), count, float(steps["median_ms"]) / 1e3,
                    float(steps["p99_ms"]) / 1e3, count / span_s)


class Diagnosis:
    """The timer thread; ``snapshot()`` is what the collector reads."""

    def __init__(self, socket_path: Path, session_id: int, *, interval_s: float = INTERVAL_S,
                 span_s: float = SPAN_S, explain: Callable[..., dict[str, Any]] = client.explain) -> None:
        self.socket_path = socket_path
        self.session_id = session_id
        self.interval_s = interval_s
        self.span_s = span_s
        self._explain = explain
        self._state = DiagnosisState()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ingero-metrics-diagnosis", daemon=True)

    def start(self) -> "Diagnosis":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(TIMEOUT_S + 5)

    def snapshot(self) -> DiagnosisState:
        with self._lock:
            s = self._state
            return DiagnosisState(list(s.chains), s.steps, s.runs, s.errors, s.last_run_s, s.last_error)

    def run_once(self) -> None:
        try:
            reply = self._explain(socket_path=self.socket_path, timeout_s=TIMEOUT_S,
                                  session=self.session_id, since_s=self.span_s)
            chains, steps = active_chains(reply["json"]), step_rate(reply["json"])
            error = None
        except IngeroError as exc:  # no data yet, tracer stopping, time limit: no chains this round
            chains, steps, error = [], None, exc.message
        with self._lock:
            s = self._state
            s.chains = chains
            s.steps = steps
            s.runs += 1
            s.errors += error is not None
            s.last_error = error
            s.last_run_s = time.time()

    def _run(self) -> None:
        # the first run after one interval: the session needs data before explain has anything
        while not self._stop.wait(self.interval_s):
            self.run_once()
