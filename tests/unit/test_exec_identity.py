"""Process identity that follows exec: the tracer's naming at proc_exec, process_history, and
analyze naming a pid as of the time it made its CUDA calls."""

from __future__ import annotations

import io

import numpy as np
import pytest

from analyze_helpers import MAIN_PID, S, SESSION, T0, Trace, chains_of
from ingero.analyze import procs
from ingero.collect import session
from ingero.collect.session import TraceOptions, TraceSession
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, Kind
from ingero.render import terminal
from ingero.store.db import Store
from test_session_flush import FakeProgram, FakeReader

PID = 4242
SHIM = {"pid": PID, "name": "bash (python3)", "comm": "bash", "cmdline": "bash /opt/bin/python3 loop.py", "ppid": 1}
PYTHON = {"pid": PID, "name": "python3 (loop.py)", "comm": "python3", "cmdline": "/usr/bin/python3 loop.py",
          "ppid": 1}


def rec(op: Op, ts: int, pid: int = PID) -> np.ndarray:
    r = np.zeros(1, dtype=EVENT_DTYPE)
    r["ts_ns"], r["pid"], r["tid"], r["op"], r["kind"], r["stack_id"] = ts, pid, pid, int(op), int(Kind.NONE), -1
    return r


@pytest.fixture
def sess(monkeypatch: pytest.MonkeyPatch) -> TraceSession:
    """A session over a fake ring whose /proc is the dict ``sess.proc`` (pid -> process_info)."""
    monkeypatch.setattr(session, "RingReader", FakeReader)
    store = Store.memory()
    sid = store.begin_session(command="test", targets="fake")
    s = TraceSession(TraceOptions(), store, FakeProgram(), sid)
    s.proc = {}  # type: ignore[attr-defined]
    monkeypatch.setattr(session, "_process_info", lambda pid: s.proc.get(pid))  # type: ignore[attr-defined]
    return s


def feed(s: TraceSession, *records: np.ndarray) -> None:
    s.reader.queue = np.concatenate(records)
    s.poll()


def history(s: TraceSession, pid: int = PID) -> list[tuple]:
    return s.store.con.execute("SELECT from_ns, name, cmdline FROM process_history WHERE pid = $p ORDER BY from_ns",
                               {"p": pid}).fetchall()


def names(s: TraceSession, pid: int = PID) -> tuple:
    return s.store.con.execute("SELECT name, cmdline FROM process_names WHERE pid = $p", {"p": pid}).fetchall()[0]


def test_an_exec_names_the_process_again_as_of_the_exec(sess: TraceSession) -> None:
    sess.proc[PID] = SHIM
    feed(sess, rec(Op.SCHED_SWITCH, 1_000))
    assert names(sess) == ("bash (python3)", SHIM["cmdline"])
    sess.proc[PID] = PYTHON
    feed(sess, rec(Op.SCHED_SWITCH, 5_000), rec(Op.PROC_EXEC, 9_000), rec(Op.CUDA_LAUNCH_KERNEL, 9_500))
    assert names(sess) == ("python3 (loop.py)", PYTHON["cmdline"])  # process_names: the latest
    rows = history(sess)
    assert [r[1:] for r in rows] == [("bash (python3)", SHIM["cmdline"]), ("python3 (loop.py)", PYTHON["cmdline"])]
    assert rows[1][0] == 9_000 + sess.offset_ns  # from the exec, on the events' clock


def test_execs_read_after_the_next_one_add_no_duplicate_rows(sess: TraceSession) -> None:
    sess.proc[PID] = PYTHON  # both execs are read once the process is python already
    feed(sess, rec(Op.PROC_EXEC, 1_000), rec(Op.PROC_EXEC, 2_000))
    feed(sess, rec(Op.PROC_EXEC, 3_000))
    assert history(sess) == [(2_000 + sess.offset_ns, "python3 (loop.py)", PYTHON["cmdline"])]


def test_a_process_gone_before_its_exec_is_read_keeps_its_exec_comm(sess: TraceSession) -> None:
    sess.proc[PID] = SHIM
    feed(sess, rec(Op.SCHED_SWITCH, 1_000))
    del sess.proc[PID]  # exec'd basename and exited before the read
    feed(sess, rec(Op.PROC_EXEC, 4_000))
    stats = np.zeros(1, dtype=[("comm", "S16")])
    stats["comm"] = b"basename"
    sess._name_from_comm(np.array([PID]), stats)
    assert names(sess) == ("basename", None)
    assert [r[:2] for r in history(sess)][-1] == (4_000 + sess.offset_ns, "basename")


def test_lookup_names_a_pid_as_of_a_time() -> None:
    store = Store.memory()
    store.upsert_process_names([{**SHIM, "session_id": 1, "seen_ns": 100}])
    store.upsert_process_names([{**PYTHON, "session_id": 1, "seen_ns": 300, "from_ns": 200}])
    con = store.con
    assert procs.lookup(con, [PID])[PID].name == "python3 (loop.py)"  # no time: the latest
    assert procs.lookup(con, [PID], at_ns=150)[PID].command == SHIM["cmdline"]
    assert procs.lookup(con, [PID], at_ns=200)[PID].name == "python3 (loop.py)"
    assert procs.lookup(con, [PID], at_ns=50)[PID].name == "bash (python3)"  # before every row: the first
    other = procs.lookup(con, [77])[77]
    assert (other.name, other.known) == ("pid 77", False)


def test_lookup_falls_back_to_process_names_without_history() -> None:
    store = Store.memory()
    store.con.execute("INSERT INTO process_names (pid, name, comm, cmdline) VALUES (5, 'gzip', 'gzip', 'gzip -9 x')")
    assert procs.lookup(store.con, [5])[5].command == "gzip -9 x"
    store.con.execute("DROP TABLE process_history")  # a database from before schema 9
    assert procs.lookup(store.con, [5], at_ns=1)[5].name == "gzip"


def contended_after_exec() -> Trace:
    """The loop's pid was a shim's bash until T0 + 1 s, then python3 (the CUDA calls); a hog preempts it."""
    tr = Trace()
    tr.name(7000, "stress", "stress", "stress --cpu 2")
    tr.loop(1, 10).loop(10, 20, preempt_ms=40, preempt_by=7000).loop(20, 30)
    tr.competitor(7000, "stress", 10, 20).system(0, 30, cpu_pct=91.0, load1=6.1)
    return tr


def test_explain_names_the_image_that_made_the_cuda_calls() -> None:
    tr = contended_after_exec()
    store = tr.store()
    shim = {**SHIM, "pid": MAIN_PID, "session_id": SESSION}
    python = {**PYTHON, "pid": MAIN_PID, "session_id": SESSION, "cmdline": "/usr/bin/python3 train.py"}
    store.upsert_process_names([{**shim, "seen_ns": T0}])
    store.upsert_process_names([{**python, "seen_ns": T0 + S, "from_ns": T0 + S}])
    # after the run the pid exec'd once more (a cleanup script): not the job
    store.upsert_process_names([{**shim, "name": "sh (cleanup.sh)", "cmdline": "sh cleanup.sh",
                                 "seen_ns": T0 + 40 * S}])
    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain

    report = explain(store.con, Options())
    assert report.analysed.processes == [f"python3 (loop.py) (PID {MAIN_PID})"]
    (chain,) = chains_of(report, "cpu-contention")
    assert any(f.startswith("taskset -c ") and "/usr/bin/python3 train.py" in f for f in chain.fix), chain.fix
    text = " ".join(chain.root + chain.fix)
    assert "cleanup" not in text and "bash" not in text


def test_the_analysed_line_counts_followed_processes_apart() -> None:
    tr = contended_after_exec()
    tr.name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    for k in range(3):  # a launcher's helpers: scheduled, no CUDA call
        tr.worker(6000 + k, 0, 5, oncpu=0.1)
    report = tr.explain()
    assert report.analysed.processes == [f"python3 (train.py) (PID {MAIN_PID})"]
    assert report.analysed.followed == 3
    out = io.StringIO()
    terminal.write(report, out)
    assert "from 1 traced process (+3 followed without CUDA calls) over " in out.getvalue()


def test_a_read_that_succeeds_later_is_not_overwritten_by_an_earlier_comm(sess: TraceSession) -> None:
    feed(sess, rec(Op.PROC_EXEC, 1_000))  # unreadable at this exec
    sess.proc[PID] = PYTHON
    feed(sess, rec(Op.PROC_EXEC, 2_000))  # readable at the next
    stats = np.zeros(1, dtype=[("comm", "S16")])
    stats["comm"] = b"bash"
    sess._name_from_comm(np.array([PID]), stats)
    assert names(sess) == ("python3 (loop.py)", PYTHON["cmdline"])
