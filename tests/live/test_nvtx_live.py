"""Live: NVTX ranges of a --cmd become spans rows (category 'nvtx').

`ingero trace --cmd` builds its injection library, names it in the command's
NVTX_INJECTION64_PATH and probes it.  Four traced runs:

* workloads/nvtx_steps.py: NVIDIA's Python nvtx package (registered-string
  messages, domains) around cudaLaunchKernel calls on the simulated runtime:
  STEPS ``step`` ranges, each holding a ``forward`` and a ``backward`` one,
  all inside ``epoch`` (start_range, ended on another thread); a name longer
  than ingero keeps; ``unclosed``, pushed, never popped: the process exits in it;
* the same, held inside ``unclosed`` until the tracer is stopped (SIGTERM):
  the span ends where the trace did;
* workloads/nvtx_calls.c: NVTX's C API from NVIDIA's headers (nvtxRangePushA,
  nvtxRangePushEx with an ASCII message, nvtxRangeStartA), on two threads, and
  one message on a page nothing had read before the call;
* workloads/nvtx_legacy.c, linked against NVIDIA's legacy libnvToolsExt.so.1:
  the same injection serves it.
"""

from __future__ import annotations

import signal
import sys
import time

import pytest

import prereqs
import workloads
from workloads import HERE, Tracer, query

pytestmark = [pytest.mark.live, pytest.mark.exact]  # counts rows, times nothing (Makefile: beside another)

STEPS = 50
LAUNCHES = 3  # per forward, per backward
NAME_LONG = "x" * 30 + "_a_very_long_range_name_past_sixty_four_bytes_" + "y" * 20
C_N = 40


def _workload_pid(stderr: str) -> int:
    return next(int(line.split()[1]) for line in stderr.splitlines() if line.startswith("ok "))


@pytest.fixture(scope="module")
def steps(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    prereqs.needs_nvtx_package()
    lib = workloads.simcuda()
    db = tmp_path_factory.mktemp("nvtx") / "t.duckdb"
    tracer = Tracer(db, "--cuda-lib", str(lib), "--duration", "120s", "--cmd",
                    f"{sys.executable} {HERE / 'nvtx_steps.py'} {lib} {STEPS} {LAUNCHES}")
    tracer.wait_started()
    summary = tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert summary["ended_by"] == "command exited", tracer.stderr
    return db, _workload_pid(tracer.stderr), summary


def test_every_range_is_one_span_with_its_name(steps: tuple) -> None:
    db, pid, summary = steps
    rows = query(db, "SELECT name, category, count(*), count(DISTINCT tid), min(tid) FROM spans "
                     "WHERE pid = $pid GROUP BY ALL ORDER BY ALL", {"pid": pid})
    assert rows == sorted([
        ("backward", "nvtx", STEPS, 1, pid),
        ("epoch", "nvtx", 1, 1, pid),  # the starting thread's, though another thread ended it
        ("forward", "nvtx", STEPS, 1, pid),
        ("step", "nvtx", STEPS, 1, pid),
        ("unclosed", "nvtx", 1, 1, pid),
        (NAME_LONG[:64], "nvtx", 1, 1, pid),  # cut at 64 bytes (NVTX_TEXT_MAX)
    ])
    assert query(db, "SELECT count(*) FROM spans")[0][0] == 3 * STEPS + 3
    assert summary["drops_kernel"] == summary["drops_user"] == 0
    # the records are spans only, never events rows
    assert query(db, "SELECT count(*) FROM events WHERE op LIKE 'nvtx%'")[0][0] == 0


def test_explain_takes_the_step_ranges_for_the_steps(steps: tuple) -> None:
    # the loop syncs once a step, so the rhythm would find the steps too; the ranges come first
    import io

    import duckdb

    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain
    from ingero.render import terminal

    db, _, _ = steps
    con = duckdb.connect(str(db), read_only=True)
    try:
        report = explain(con, Options())
    finally:
        con.close()
    st = report.steps
    assert (st.source, st.marker, st.count) == ("nvtx", "step", STEPS)
    out = io.StringIO()
    terminal.write(report, out)
    assert f"Steps: {STEPS} (from NVTX ranges 'step'), p50 " in out.getvalue()


def test_ranges_nest_within_their_step_on_the_same_thread(steps: tuple) -> None:
    db, pid, _ = steps
    # every forward / backward inside exactly one step of its thread, every step holding one of each
    rows = query(db, """
        SELECT s.start_ns, list(c.name ORDER BY c.start_ns) AS children
        FROM spans s LEFT JOIN spans c ON c.pid = s.pid AND c.tid = s.tid AND c.name IN ('forward', 'backward')
             AND c.start_ns > s.start_ns AND c.end_ns < s.end_ns
        WHERE s.pid = $pid AND s.name = 'step' GROUP BY s.start_ns""", {"pid": pid})
    assert len(rows) == STEPS
    assert all(children == ["forward", "backward"] for _, children in rows)
    outside = query(db, """SELECT count(*) FROM spans c WHERE c.pid = $pid AND c.name IN ('forward', 'backward')
                           AND (SELECT count(*) FROM spans s WHERE s.name = 'step' AND s.tid = c.tid
                                AND c.start_ns > s.start_ns AND c.end_ns < s.end_ns) <> 1""", {"pid": pid})
    assert outside == [(0,)]
    # steps do not overlap, and all lie inside the epoch
    assert query(db, """SELECT count(*) FROM spans a JOIN spans b ON a.name = 'step' AND b.name = 'step'
                        AND a.start_ns < b.start_ns AND b.start_ns < a.end_ns""") == [(0,)]
    assert query(db, """SELECT count(*) FROM spans s, spans e WHERE s.name = 'step' AND e.name = 'epoch'
                        AND s.start_ns > e.start_ns AND s.end_ns < e.end_ns""") == [(STEPS,)]


def test_each_step_holds_its_launches_on_the_events_clock(steps: tuple) -> None:
    db, pid, _ = steps
    rows = query(db, """
        SELECT s.name, count(e.timestamp) AS launches
        FROM spans s LEFT JOIN events e ON e.pid = s.pid AND e.tid = s.tid AND e.op = 'cudaLaunchKernel'
             AND e.timestamp >= s.start_ns AND e.timestamp + e.duration_ns <= s.end_ns
        WHERE s.pid = $pid AND s.name IN ('step', 'forward', 'backward') GROUP BY s.name, s.start_ns""", {"pid": pid})
    per = {}
    for name, n in rows:
        per.setdefault(name, set()).add(n)
    assert per == {"step": {2 * LAUNCHES}, "forward": {LAUNCHES}, "backward": {LAUNCHES}}
    # every launch of the run is inside a step, and every sync too
    assert query(db, """SELECT e.op, count(*) FROM events e WHERE e.pid = $pid
                        AND e.op IN ('cudaLaunchKernel', 'cudaDeviceSync') AND NOT EXISTS (
                            SELECT 1 FROM spans s WHERE s.name = 'step' AND s.tid = e.tid
                            AND e.timestamp >= s.start_ns AND e.timestamp + e.duration_ns <= s.end_ns)
                        GROUP BY ALL""", {"pid": pid}) == []
    assert query(db, "SELECT count(*) FROM events WHERE pid = $pid AND op = 'cudaLaunchKernel'",
                 {"pid": pid}) == [(2 * LAUNCHES * STEPS,)]


def test_a_range_open_at_the_process_exit_ends_at_its_exit(steps: tuple) -> None:
    db, pid, _ = steps
    rows = query(db, """SELECT s.start_ns < s.end_ns, s.end_ns = e.timestamp FROM spans s
                        JOIN events e ON e.pid = s.pid AND e.op = 'proc_exit'
                        WHERE s.pid = $pid AND s.name = 'unclosed'""", {"pid": pid})
    assert rows == [(True, True)]


def test_the_probes_are_on_the_injection_library(steps: tuple) -> None:
    db, *_ = steps
    rows = query(db, "SELECT symbol, op, probe_kind, attached FROM probes WHERE target LIKE '%libingero_nvtx.so' "
                     "ORDER BY symbol")
    assert rows == [("ingero_nvtx_end", "nvtx_end", "uprobe", True), ("ingero_nvtx_pop", "nvtx_pop", "uprobe", True),
                    ("ingero_nvtx_push", "nvtx_push", "uprobe", True),
                    ("ingero_nvtx_start", "nvtx_start", "uprobe", True)]


def test_a_range_open_when_the_trace_stops_ends_at_the_trace_end(tmp_path) -> None:
    prereqs.needs_nvtx_package()
    lib = workloads.simcuda()
    db, hold = tmp_path / "t.duckdb", tmp_path / "inside"
    tracer = Tracer(db, "--cuda-lib", str(lib), "--duration", "300s", "--cmd",
                    f"{sys.executable} {HERE / 'nvtx_steps.py'} {lib} 2 1 {hold}")
    tracer.wait_started()
    deadline = time.monotonic() + workloads.START_TIMEOUT_S
    while not hold.exists():
        assert time.monotonic() < deadline and tracer.proc.poll() is None, "the workload never got inside 'unclosed'"
        time.sleep(0.1)
    summary = tracer.finish(sig=signal.SIGTERM)
    assert summary["ended_by"] == "SIGTERM", tracer.stderr
    pid = _workload_pid(tracer.stderr)
    rows = query(db, """SELECT s.name, s.end_ns > s.start_ns, s.end_ns <= x.ended_ns FROM spans s
                        JOIN sessions x USING (session_id) WHERE s.pid = $pid ORDER BY s.start_ns""", {"pid": pid})
    assert [r[0] for r in rows] == ["epoch", "step", "forward", "backward", "step", "forward", "backward",
                                    NAME_LONG[:64], "unclosed"]
    assert all(r[1] and r[2] for r in rows)
    # it did not exit inside the trace: no exit ended it, the trace's end did
    assert query(db, "SELECT count(*) FROM events WHERE pid = $pid AND op = 'proc_exit'", {"pid": pid}) == [(0,)]
    assert any("1 never closed" in n for n in summary["notes"]), summary["notes"]


@pytest.fixture(scope="module")
def c_api(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    include = prereqs.needs_nvtx_headers()
    tmp = tmp_path_factory.mktemp("nvtx_c")
    exe = tmp / "nvtx_calls"
    import shutil
    import subprocess

    subprocess.run([shutil.which("cc") or "gcc", "-O1", f"-I{include}", "-o", str(exe), str(HERE / "nvtx_calls.c"),
                    "-ldl", "-lpthread"], check=True)
    db = tmp / "t.duckdb"
    tracer = Tracer(db, "--duration", "120s", "--cmd", f"{exe} {C_N}")
    tracer.wait_started()
    summary = tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert summary["ended_by"] == "command exited" and summary["command_exit"] == 0, tracer.stderr
    return db, _workload_pid(tracer.stderr), summary


def test_the_c_api_ranges_per_thread(c_api: tuple) -> None:
    db, pid, summary = c_api
    rows = query(db, "SELECT name, tid = pid, count(*) FROM spans WHERE pid = $pid GROUP BY ALL ORDER BY ALL",
                 {"pid": pid})
    # far_away: a message on a page nothing had read (the injection library reads it before the probe)
    assert rows == [("far_away", True, 1), ("inner_ex", True, C_N), ("outer", True, C_N), ("started", True, C_N),
                    ("worker", False, C_N)]
    nested = query(db, """SELECT count(*) FROM spans i JOIN spans o ON i.tid = o.tid AND o.name = 'outer'
                          AND i.start_ns > o.start_ns AND i.end_ns < o.end_ns WHERE i.name = 'inner_ex'""")
    assert nested == [(C_N,)]
    # the stray pop (NVTX returned -1) made no span and reached no probe
    assert not any("without their push" in n for n in summary.get("notes", []))


def test_the_legacy_shared_library_loads_the_same_injection(tmp_path) -> None:
    lib = prereqs.needs_libnvtoolsext()
    import shutil
    import subprocess

    exe = tmp_path / "nvtx_legacy"
    subprocess.run([shutil.which("cc") or "gcc", "-O1", "-o", str(exe), str(HERE / "nvtx_legacy.c"), str(lib),
                    f"-Wl,-rpath,{lib.parent}"], check=True)
    tracer = Tracer(tmp_path / "t.duckdb", "--duration", "120s", "--cmd", f"{exe} {C_N}")
    tracer.wait_started()
    summary = tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    assert summary["ended_by"] == "command exited" and summary["command_exit"] == 0, tracer.stderr
    pid = _workload_pid(tracer.stderr)
    rows = query(tmp_path / "t.duckdb", """SELECT i.name, count(*) FROM spans i JOIN spans o ON o.tid = i.tid
                 AND o.name = 'legacy_step' AND i.start_ns > o.start_ns AND i.end_ns < o.end_ns
                 WHERE i.pid = $pid GROUP BY ALL""", {"pid": pid})
    assert rows == [("legacy_inner", C_N)]
    assert query(tmp_path / "t.duckdb", "SELECT count(*) FROM spans") == [(2 * C_N,)]
