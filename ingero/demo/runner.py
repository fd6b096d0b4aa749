"""Runs a demo scenario: slow run traced live -> explain -> fixed run -> before/after.

Live mode (root + BCC + a C compiler or a built library + the tracer): the
workload (demos/workloads/train.py) runs on the simulated CUDA runtime
under ``python -m ingero trace --cmd ... --db ...``, with the scenario's
interference processes beside it; explain reads that DB.  The interference
starts after a clean baseline share of the run, so explain compares windows
of the same session.  Then the fixed workload runs (traced too, into its own
DB) and both workloads' summaries are compared.

Otherwise: a synthetic replay (ingero.demo.synthetic) through the same
store and explain, with the reason in ``DemoResult.reason``.

Library code: never prints; progress goes to a callback.  Interference
processes run in their own process groups and are killed in ``finally``
blocks, including on KeyboardInterrupt.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ingero.demo import scenarios as scn
from ingero.demo import synthetic
from ingero.demo.scenarios import BASELINE_SHARE, Interferer, Scenario
from ingero.errors import IngeroError
from ingero.events.units import NS
from ingero.store.db import Store, sched_autogroup_enabled

REPO = Path(__file__).resolve().parents[2]
DEMOS = REPO / "demos"
LIBCUDART = DEMOS / "build" / "libcudart.so.12"
LIBNCCL = DEMOS / "build" / "libnccl.so.2"  # the simulated NCCL (multi-rank scenarios)
TRAIN = DEMOS / "workloads" / "train.py"
# The tracer gets this much longer than the workload: it stops when the
# command exits, this only bounds a stuck run.
TRACE_MARGIN_S = 15.0
# Dataset for the loader/mmap scenarios: larger than a few batches, small
# enough to write in a second.
DATASET_BYTES = 256 << 20
# The tracer compiles its BPF program before it starts the workload (~5-20 s
# on these VMs, longer when the box is busy: `ingero trace --cmd true` took
# 135 s to start at load 18 on 2026-11-26).
WORKLOAD_START_TIMEOUT_S = 180.0
# After the workload's run: the tracer drains, stores and detaches its uprobes one at a time
# (closing 10 uprobe fds took 9.7 s at load 12).
EXIT_TIMEOUT_S = 120.0
# Seconds between SIGTERM and SIGKILL when cleaning up.
KILL_GRACE_S = 2.0

Progress = Callable[[str], None]


@dataclass
class Run:
    """One run of the workload (slow or fixed)."""

    label: str  # 'before' | 'after'
    summary: dict[str, Any]
    db_path: Path | None
    report: Any = None  # ingero.analyze.model.Report
    report_dict: dict[str, Any] | None = None
    trace_note: str = ""
    # Explain starts at the loop's first step: interpreter start-up and
    # allocation (imports, pinned buffers: thousands of first-touch faults)
    # are not the job's steady state.
    steady_from_ns: int | None = None


@dataclass
class DemoResult:
    scenario: Scenario
    mode: str  # 'live' | 'synthetic'
    reason: str | None  # why synthetic
    before: Run
    after: Run | None
    notes: list[str] = field(default_factory=list)
    report_line: str | None = None  # what `--report` wrote (the slow run's HTML report)

    @property
    def policy(self) -> str:
        """The CUDA wait policy the runs used, as stated by the scenario and resolved ('auto -> spin')."""
        how = scn.wait_policy(self.scenario.policy)
        return self.scenario.policy if how == self.scenario.policy else f"{self.scenario.policy} -> {how}"

    @property
    def chains(self) -> list[dict[str, Any]]:
        return (self.before.report_dict or {}).get("chains", [])

    @property
    def top_rule(self) -> str | None:
        strong = [c for c in self.chains if c.get("severity") in ("HIGH", "MEDIUM")]
        return strong[0]["rule_id"] if strong else None

    @property
    def diagnosed(self) -> bool:
        return self.top_rule == self.scenario.expected_rule

    def to_dict(self) -> dict[str, Any]:
        def run(r: Run | None) -> dict[str, Any] | None:
            if r is None:
                return None
            return {"summary": r.summary, "db": str(r.db_path) if r.db_path else None,
                    "explain": r.report_dict, "trace_note": r.trace_note}

        return {
            "scenario": self.scenario.name,
            "title": self.scenario.title,
            "mode": self.mode,
            "reason": self.reason,
            "wait_policy": self.policy,
            "expected_rule": self.scenario.expected_rule,
            "top_rule": self.top_rule,
            "diagnosed": self.diagnosed,
            "fix": self.scenario.fix,
            "before": run(self.before),
            "after": run(self.after),
            "notes": self.notes,
            "report": self.report_line,
        }


# ---- capability ------------------------------------------------------------


def live_unavailable(build: bool = True) -> str | None:
    """Why the live demo cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "not root: eBPF tracing needs root (sudo ingero demo ...)"
    if importlib.util.find_spec("bcc") is None:
        return "BCC is not installed (apt install python3-bpfcc)"
    if importlib.util.find_spec("ingero.commands.trace") is None:
        return "the tracer (ingero trace) is not in this build"
    if not TRAIN.exists() or not (DEMOS / "Makefile").exists():
        return f"the demo workloads are not here ({DEMOS}): run from a source checkout"
    if not LIBCUDART.exists() or not LIBNCCL.exists():
        if not build:
            return "the simulated CUDA runtime is not built (make -C demos)"
        if shutil.which(os.environ.get("CC", "cc")) is None or shutil.which("make") is None:
            return "no C compiler (cc) or make to build the simulated CUDA runtime"
        proc = subprocess.run(["make", "-C", str(DEMOS)], capture_output=True, text=True)
        if proc.returncode != 0 or not LIBCUDART.exists():
            last = (proc.stderr.strip().splitlines() or ["failed"])[-1]
            return f"building the simulated CUDA runtime failed: {last}"
    return None


# ---- processes -------------------------------------------------------------


def _expand(args: tuple[str, ...], paths: dict[str, str]) -> list[str]:
    return [a.format(**paths) for a in args]


def start_interference(items: tuple[Interferer, ...], paths: dict[str, str], procs: list[subprocess.Popen],
                       *, nice: int = 0) -> list[subprocess.Popen]:
    """Start every interference process, each in its own process group, appending each to
    ``procs`` as soon as it exists (so the caller's ``finally`` can always kill it)."""
    try:
        for item in items:
            for _ in range(item.count):
                p = subprocess.Popen(
                    [sys.executable, "-m", "ingero.demo.interference", item.kind, *_expand(item.args, paths)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                procs.append(p)
                if item.cpu is not None:
                    os.sched_setaffinity(p.pid, {item.cpu})
                if nice:
                    lower_priority(p.pid, nice)
    except BaseException:
        stop_processes(procs)
        raise
    return procs


def lower_priority(pid: int, nice: int) -> None:
    """renice, and where the kernel groups CPU time per session (each interference process has
    its own), the session's autogroup nice too: without it renice changes nothing against the
    loop, which is in another session (the fix explain prints says the same)."""
    os.setpriority(os.PRIO_PROCESS, pid, nice)
    if sched_autogroup_enabled():
        try:
            Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        except OSError:
            pass  # not permitted (not root): renice alone is what a user could do too


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + KILL_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def _make_dataset(workdir: Path) -> Path:
    path = workdir / "dataset.bin"
    chunk = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for _ in range(DATASET_BYTES >> 20):
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())
    return path


def workload_command(flags: tuple[str, ...], paths: dict[str, str], duration_s: float, summary: Path,
                     ready: Path | None = None, measure_from: Path | None = None) -> list[str]:
    cmd = [sys.executable, str(TRAIN), "--lib", str(LIBCUDART), *_expand(flags, paths),
           "--duration", f"{duration_s:g}", "--summary-json", str(summary)]
    if ready is not None:
        cmd += ["--ready-file", str(ready)]
    if measure_from is not None:
        cmd += ["--measure-from", str(measure_from)]
    return cmd


# ---- live ------------------------------------------------------------------


def _live_run(s: Scenario, label: str, fixed: bool, duration_s: float, db: Path, workdir: Path,
              paths: dict[str, str], progress: Progress, trace_args: tuple[str, ...] = ()) -> Run:
    flags = s.fix_workload if fixed else s.workload
    items = s.interference if not fixed or s.fix_interference is None else s.fix_interference
    summary_path = workdir / f"{label}.json"
    ready = workdir / f"{label}.ready"
    # The slow run's clean lead-in (baseline windows for explain) is not what "before" means in
    # before/after: its step times count from the moment the cause starts.
    cause = workdir / f"{label}.cause" if items and not fixed else None
    cmd = workload_command(flags, paths, duration_s, summary_path, ready, measure_from=cause)
    # --cuda-lib: probes go on the simulated runtime before the workload starts.  Found
    # later (when the process maps it), the attach races with calls in flight.
    # a multi-rank job loads the simulated NCCL too: its probes go on before the ranks start
    nccl = ("--cuda-lib", str(LIBNCCL)) if "--ranks" in flags else ()
    tracer_cmd = [sys.executable, "-m", "ingero", "trace", "--cmd", shlex.join(cmd),
                  "--cuda-lib", str(LIBCUDART), *nccl,
                  "--duration", f"{duration_s + TRACE_MARGIN_S:g}", "--db", str(db), *trace_args]
    procs: list[subprocess.Popen] = []
    # the tracer's output goes to files: a pipe nobody reads while we wait would fill and stall it
    log_path = workdir / f"{label}.trace.log"
    # the workload inherits the tracer's environment: the simulated runtime waits by the scenario's policy
    env = {**os.environ, "SIMCUDA_SCHEDULE": s.policy}
    with open(log_path, "w") as log:
        tracer = subprocess.Popen(tracer_cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True, env=env)
    _keep_off_loop_core(tracer.pid, flags)
    try:
        # the tracer takes seconds to compile and attach (minutes on a busy box): every clock
        # below counts from the workload's first step
        started = _wait(tracer, WORKLOAD_START_TIMEOUT_S, until=ready.exists)
        if items:
            # a clean baseline first, then the cause (on the slow run)
            delay = 0.0 if fixed else BASELINE_SHARE * duration_s
            progress(f"{label}: workload running, interference in {delay:.0f} s" if delay
                     else f"{label}: workload running with interference")
            if started and _wait(tracer, delay):
                start_interference(items, paths, procs, nice=19 if fixed and s.fix_renice else 0)
                if cause is not None:
                    cause.touch()
        else:
            progress(f"{label}: workload running")
        try:
            # the workload's run, then the tracer's exit (its uprobes detach one at a time)
            tracer.wait(timeout=duration_s + 2 * TRACE_MARGIN_S + EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(tracer.pid, signal.SIGINT)
            tracer.wait(timeout=30)
    except BaseException:
        if tracer.poll() is None:
            os.killpg(tracer.pid, signal.SIGINT)
            try:
                tracer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(tracer.pid, signal.SIGKILL)
        raise
    finally:
        stop_processes(procs)
    err = log_path.read_text(errors="replace")
    if tracer.returncode != 0:
        last = (err.strip().splitlines() or [f"exit code {tracer.returncode}"])[-1]
        raise IngeroError(f"ingero trace failed during the {label} run: {last}",
                          "run `ingero check`, or `ingero demo --synthetic` for a replay")
    if not summary_path.exists():
        raise IngeroError(f"the demo workload wrote no summary in the {label} run",
                          f"run it alone: {shlex.join(cmd)}")
    summary = json.loads(summary_path.read_text())
    run = Run(label, summary, db, trace_note=(err.strip().splitlines() or [""])[-1])
    if ready.exists():
        run.steady_from_ns = ready.stat().st_mtime_ns
    return run


def _keep_off_loop_core(pid: int, flags: tuple[str, ...]) -> None:
    """The tracer (decoding, DuckDB) runs on the cores the training loop is not pinned to.

    On two cores an unpinned tracer lands on the loop's core half the time
    and becomes a competitor of its own demo; the workload sets its own
    affinity (--cpu) at start, so pinning the tracer first is harmless to it.
    """
    if "--cpu" not in flags:
        return
    loop = {int(c) for c in flags[flags.index("--cpu") + 1].split(",")}
    others = set(os.sched_getaffinity(0)) - loop
    if others:
        try:
            os.sched_setaffinity(pid, others)
        except ProcessLookupError:
            pass


def _wait(proc: subprocess.Popen, seconds: float, until: Callable[[], bool] | None = None) -> bool:
    """Sleep up to ``seconds`` or until ``until()``; False if ``proc`` ended meanwhile."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            return False
        if until is not None and until():
            return True
        time.sleep(0.05)
    return proc.poll() is None and (until is None or until())


# ---- explain ---------------------------------------------------------------


def explain_db(path: Path, from_ns: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Run explain on a DB (every process: the competitors are part of the story): (Report, JSON dict)."""
    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain
    from ingero.render import json as render_json

    store = Store.open(path, read_only=True)
    try:
        report = explain(store.con, Options(from_ns=from_ns))
    finally:
        store.close()
    return report, render_json.to_dict(report)


# ---- entry point -----------------------------------------------------------


def _check_replaceable_db(path: Path) -> None:
    """--keep-db replaces only a DuckDB database (an earlier demo's): never a device, link or other file."""
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise IngeroError(f"--keep-db {path} exists and is not a regular file", "choose another path")
    with open(path, "rb") as f:
        if f.read(12)[8:12] != b"DUCK":  # DuckDB's file header: its magic at byte 8
            raise IngeroError(f"--keep-db {path} exists and is not a DuckDB database: it is left alone",
                              "choose another path, or move that file away yourself")


def run(name: str, *, duration_s: float = scn.DEFAULT_DURATION_S, keep_db: Path | None = None,
        fix: bool = True, synthetic_only: bool = False, progress: Progress | None = None,
        report: Callable[[Path, int | None, Path | None, int | None], str] | None = None,
        trace_args: tuple[str, ...] = ()) -> DemoResult:
    """Run scenario ``name``; see the module docstring.  ``report``: called with the slow run's DB
    and the start of its steady state (what explain reads), then the fixed run's (None, None
    without one), before the DBs go; returns a line.  ``trace_args``: more `ingero trace`
    options for the live runs (bench_budget_demos: a budget)."""
    s = scn.get(name)
    if duration_s <= 0:
        raise IngeroError("--duration must be positive")
    say = progress or (lambda _msg: None)
    reason = "asked with --synthetic" if synthetic_only else live_unavailable()
    say(f"CUDA wait policy: {s.policy} (SIMCUDA_SCHEDULE={s.policy})")
    tmp = Path(tempfile.mkdtemp(prefix=f"ingero-demo-{s.name}-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    try:
        before_db = keep_db if keep_db is not None else tmp / "before.duckdb"
        if keep_db is not None and os.path.lexists(keep_db):
            _check_replaceable_db(keep_db)
            keep_db.unlink()
        after_db = tmp / "after.duckdb"
        # slow run and fixed run share the duration
        per_run = duration_s / 2 if fix else duration_s
        if reason is None:
            paths = {"workdir": str(tmp)}
            if s.needs_dataset:
                say("writing the demo dataset")
                paths["dataset"] = str(_make_dataset(tmp))
            before = _live_run(s, "before", False, per_run, before_db, tmp, paths, say, trace_args)
            mode = "live"
        else:
            say(f"synthetic replay ({reason})")
            before = _synthetic_run(s, "before", False, per_run, before_db)
            mode = "synthetic"
        say("explaining the slow run")
        before.report, before.report_dict = explain_db(before_db, before.steady_from_ns)
        after = None
        if fix and s.expected_rule is not None:
            say(f"applying the fix: {s.fix}")
            if mode == "live":
                after = _live_run(s, "after", True, per_run, after_db, tmp, paths, say, trace_args)
            else:
                after = _synthetic_run(s, "after", True, per_run, after_db)
            after.report, after.report_dict = explain_db(after_db, after.steady_from_ns)
            after.db_path = None  # temporary
        report_line = None
        if report is not None:  # after both runs: the page shows before/after
            say("writing the HTML report")
            report_line = report(before_db, before.steady_from_ns, after_db if after is not None else None,
                                 after.steady_from_ns if after is not None else None)
        return DemoResult(s, mode, reason, before, after, report_line=report_line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _synthetic_run(s: Scenario, label: str, fixed: bool, duration_s: float, db: Path) -> Run:
    # A whole second ago the replay ends: explain's windows are whole seconds, so a start off
    # the second moved every window boundary and changed the diagnosis from run to run (a
    # seeded replay gave HIGH, or nothing, depending on the clock's fraction of a second).
    start_s = time.time_ns() // NS - math.ceil(duration_s)
    replay = synthetic.generate(s, duration_s=duration_s, fixed=fixed, seed=1 if fixed else 0,
                                start_ns=start_s * NS)
    store = Store.open(db)
    try:
        synthetic.write(store, s, replay, label=label)
    finally:
        store.close()
    return Run(label, replay.summary(), db)
