"""Live: sched_switch and page_fault rows carry the thread's CUDA state (events.in_call, queued).

The workload (tests/live/workloads/call_state.c, on the simulated runtime)
sleeps a known number of times in each state, SLEEP_MS each: inside
cudaStreamSynchronize with a kernel queued, outside any call right after a
sync, and outside any call after a launch that no sync followed; and a helper
thread that never calls CUDA sleeps too.  Each sleep is one voluntary switch,
so the off-CPU rows of at least LONG_NS per state are exact counts.  Nothing
else the workload does sleeps that long: the GO-file poll before its first
call sleeps 1 ms at a time (and is before the first call, which the query
leaves out), launches spin 5 us.  A sleep whose switch back onto a CPU the
tracer did not see (about once a trace here, counted: bpf/sched.bpf.c close_unseen)
is still its row, zero-length where its wake-up went unseen too: counted
with the long ones, and only as many as the tracer says.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import workloads
from workloads import build, query, trace_gated

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)

IN_SYNC = 6  # N: sleeps inside cudaStreamSynchronize, kernel queued
AFTER_SYNC = 5  # M: sleeps right after a sync
AFTER_LAUNCH = 4  # K: sleeps after a launch, no sync
HELPER = 3  # L: sleeps of a thread that never calls CUDA
PAGES = 8  # fresh pages touched before each sleep of phases M and K
# The workload's sleeps are 5 ms (SLEEP_MS in call_state.c); a sync sleeps
# until its 100 ms kernel ends: less than that by however long the thread
# waited for a CPU between launch and sync (a 5 ms kernel lost one sleep
# under the 4 ms bar at load 9; 15 ms of such a wait was seen).
LONG_NS = 4_000_000


def _one_slot_bpf(tmp: Path) -> Path:
    """A copy of bpf/ built with a single thread slot: every thread of the workload
    keeps its state in the fallback maps (task storage, the `threads` hash), the
    path a tid takes where pid_max exceeds the slots and its slot is taken."""
    src = Path(__file__).resolve().parents[2] / "bpf"
    out = tmp / "bpf-one-slot"
    shutil.copytree(src, out)
    main = out / "ingero.bpf.c"
    main.write_text("#define THREAD_SLOTS 1\n" + main.read_text())
    return out


@pytest.fixture(scope="module", params=["slots", "fallback maps"])
def traced(request, tmp_path_factory, simcuda: Path) -> tuple[Path, int, int, int]:
    tmp = tmp_path_factory.mktemp("call_state")
    lib = simcuda
    # blocking syncs: the workload's sleeps inside cudaStreamSynchronize are what is tagged
    # (the simulated runtime's default, CUDA's Auto, spins on this host)
    env = {"SIMCUDA_SCHEDULE": "block"}
    if request.param == "fallback maps":
        env["INGERO_BPF_DIR"] = str(_one_slot_bpf(tmp))
    tracer, summary, db = trace_gated(build("call_state", tmp), lib, tmp,
                                      IN_SYNC, AFTER_SYNC, AFTER_LAUNCH, HELPER, PAGES, env=env)
    assert "done" in tracer.stderr, tracer.stderr  # the command's output goes to stderr under --json
    assert (summary["ended_by"], summary["command_exit"]) == ("command exited", 0)
    main_tid = int(re.search(r"^main (\d+)$", tracer.stderr, re.M).group(1))  # type: ignore[union-attr]
    helper_tid = int(re.search(r"^helper (\d+)$", tracer.stderr, re.M).group(1))  # type: ignore[union-attr]
    # sleeps whose switch back no probe saw (the tracer's note; 0 without one)
    unseen = sum(int(m.group(1).replace(",", "")) for m in
                 (re.match(r"scheduler: ([\d,]+) off-CPU interval", n) for n in summary.get("notes", [])) if m)
    return db, main_tid, helper_tid, unseen


def _states(db: Path, tid: int, op: str, min_ns: int) -> dict[tuple, int]:
    """(in_call, queued) -> rows of ``op`` of thread ``tid`` since its first CUDA call (sleeps >= min_ns,
    or zero-length: a sleep whose end the tracer did not see)."""
    sleep_only = "AND kind = 'sleep' AND (duration_ns >= $min_ns OR duration_ns = 0)" if op == "sched_switch" else ""
    rows = query(db, f"""
        SELECT in_call, queued, count(*) FROM events
        WHERE tid = $tid AND op = $op {sleep_only}
          AND timestamp >= coalesce((SELECT min(timestamp) FROM events
                                     WHERE tid = $tid AND op LIKE 'cuda%'), 0)
        GROUP BY ALL""", {"tid": tid, "op": op, **({"min_ns": min_ns} if sleep_only else {})})
    return {(a, b): n for a, b, n in rows}


def test_sleeps_are_tagged_with_the_call_and_the_queued_work(traced) -> None:
    db, main_tid, _, _ = traced
    assert _states(db, main_tid, "sched_switch", LONG_NS) == {
        ("cudaStreamSync", True): IN_SYNC,
        (None, False): AFTER_SYNC,
        (None, True): AFTER_LAUNCH,
    }
    # the calls behind it: every launch and sync returned 0 and was stored
    ops = dict(query(db, "SELECT op, count(*) FROM events WHERE tid = $t AND op LIKE 'cuda%' AND ret = 0 GROUP BY op",
                     {"t": main_tid}))
    assert ops == {"cudaLaunchKernel": IN_SYNC + AFTER_LAUNCH, "cudaStreamSync": IN_SYNC + 1}


def test_a_thread_that_never_called_cuda_has_no_queued_state(traced) -> None:
    db, _, helper_tid, _ = traced
    assert _states(db, helper_tid, "sched_switch", LONG_NS) == {(None, None): HELPER}
    # every row of it, short ones included
    assert query(db, "SELECT count(*) FROM events WHERE tid = $t AND (queued IS NOT NULL OR in_call IS NOT NULL)",
                 {"t": helper_tid}) == [(0,)]


def test_page_faults_carry_the_state_too(traced) -> None:
    db, main_tid, _, _ = traced
    faults = _states(db, main_tid, "page_fault", 0)
    # the pages touched after a sync and after a launch (code and stack pages were faulted in by phase N)
    assert faults.get((None, False), 0) >= AFTER_SYNC * PAGES
    assert faults.get((None, True), 0) >= AFTER_LAUNCH * PAGES
    assert faults.get((None, None), 0) == 0


def test_other_rows_carry_no_call_state(traced) -> None:
    db, _, _, _ = traced
    assert query(db, """SELECT count(*) FROM events WHERE op NOT IN ('sched_switch', 'page_fault')
                        AND (in_call IS NOT NULL OR queued IS NOT NULL)""") == [(0,)]
    # in_call holds op names only
    assert {r[0] for r in query(db, "SELECT DISTINCT in_call FROM events WHERE in_call IS NOT NULL")} <= {
        "cudaStreamSync", "cudaLaunchKernel"}


def test_a_zero_length_sleep_is_one_whose_end_the_tracer_did_not_see(traced) -> None:
    # a switch-out's row always ends later than it starts, but for a sleep whose switch back onto
    # a CPU no probe saw, and whose wake-up none saw either: the tracer counts the first, and says
    # how many (each ends where its wake-up was, when that was seen)
    db, _, _, unseen = traced
    [(zero,)] = query(db, "SELECT count(*) FROM events WHERE op = 'sched_switch' AND duration_ns = 0")
    assert zero <= unseen


def test_sql_derivation_agrees_with_bpf_on_every_row(traced) -> None:
    """ingero/store/derive.py (migration of older files, explain's view over them) gives each
    recorded switch and fault the state BPF tagged it with."""
    import duckdb

    from ingero.store import derive

    db, main_tid, _, _ = traced
    con = duckdb.connect(str(db), read_only=True)
    try:
        sid = con.execute("SELECT max(session_id) FROM events").fetchone()[0]
        view = derive.derived_events_view(con, sid, name="derived")
        mismatched = con.execute(f"""
            SELECT e.tid, e.op, e.timestamp, e.in_call, e.queued, d.in_call, d.queued
            FROM events e JOIN {view} d USING (session_id, tid, op, timestamp)
            WHERE e.op IN ('sched_switch', 'page_fault')
              AND (e.in_call IS DISTINCT FROM d.in_call OR e.queued IS DISTINCT FROM d.queued)""").fetchall()
        compared = con.execute("""SELECT count(*) FILTER (tid = $t), count(*) FROM events
                                   WHERE op IN ('sched_switch', 'page_fault')""", {"t": main_tid}).fetchone()
    finally:
        con.close()
    assert mismatched == []
    assert compared[0] >= IN_SYNC + AFTER_SYNC + AFTER_LAUNCH  # the comparison covered the workload's rows


FAILED_LAUNCHES = 5


def test_failed_launches_queue_nothing(tmp_path: Path) -> None:
    """NVIDIA's libcudart without a driver: every launch returns 35, so a sleep after it has
    nothing queued (bpf/cuda.bpf.c sets the bit only for a launch that returned 0)."""
    lib = workloads.libcudart()
    if lib is None:
        pytest.fail("nvidia-cuda-runtime-cu12 is not installed in the venv (its libcudart is needed)")
    tracer, summary, db = trace_gated(build("call_state_failed", tmp_path), lib, tmp_path, FAILED_LAUNCHES)
    assert f"done {FAILED_LAUNCHES}" in tracer.stderr, tracer.stderr
    assert summary["command_exit"] == 0
    tid = int(re.search(r"^main (\d+)$", tracer.stderr, re.M).group(1))  # type: ignore[union-attr]
    assert query(db, "SELECT op, ret, count(*) FROM events WHERE tid = $t AND op LIKE 'cuda%' GROUP BY ALL",
                 {"t": tid}) == [("cudaLaunchKernel", 35, FAILED_LAUNCHES + 1)]  # + the one after the last sleep
    assert _states(db, tid, "sched_switch", LONG_NS) == {(None, False): FAILED_LAUNCHES}, summary
