"""sessions.probe_misses: runs of our BPF programs the kernel skipped, read from fdinfo,
stored, migrated onto older files as unknown, and shown wherever drops are shown."""

from __future__ import annotations

import io
import json
from pathlib import Path

from ingero.analyze.model import Analysed
from ingero.collect.loader import recursion_misses
from ingero.traceapi import OpStats, TraceSummary
from ingero.daemon.state import collect_status
from ingero.render.status import lines as format_status
from ingero.render.live import LiveView
from ingero.render.terminal import analysed_line
from ingero.store.db import Store
from old_schemas import write_old_file

# /proc/PID/fdinfo/FD of a tracepoint program on Linux 6.18 (values changed)
FDINFO = """pos:	0
flags:	02000002
mnt_id:	16
ino:	1057
prog_type:	5
prog_jited:	1
prog_tag:	4a1e1a5b3c7d9e0f
memlock:	4096
prog_id:	34358
run_time_ns:	0
run_cnt:	0
recursion_misses:	17
verified_insns:	311
"""


def test_recursion_misses_is_read_from_fdinfo() -> None:
    assert recursion_misses(FDINFO) == 17
    # kernels before 5.12 have no such line: nothing is known to be missed
    assert recursion_misses(FDINFO.replace("recursion_misses:\t17\n", "")) == 0


def test_version_5_file_gains_the_column_unknown_for_old_sessions(tmp_path: Path) -> None:
    path = tmp_path / "v5.duckdb"
    write_old_file(path, version=5)
    store = Store.open(path)
    sid = store.begin_session(command="ingero trace", targets="all")
    rows = store.con.execute("SELECT session_id, probe_misses FROM sessions ORDER BY 1").fetchall()
    store.close()
    assert rows == [(1, None), (sid, 0)]


def test_status_and_explain_show_the_count(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "s.duckdb")
    sid = store.begin_session(command="ingero trace", targets="all")
    store.end_session(sid, events=0, drops_kernel=0, drops_user=0, probe_misses=3)
    st = collect_status(store.con)
    store.close()
    assert st["session"]["probe_misses"] == 3
    drops = [line for line in format_status(st) if line.startswith("drops:")]
    assert drops == ["drops: 0 in kernel, 0 in user space; 3 probe runs skipped by the kernel (rows may be missing)"]
    a = Analysed(session_id=1, start_ns=0, end_ns=60 * 10**9, window_s=5.0, windows=12, events=100,
                 cuda_events=40, processes=["python3 (train.py) (PID 1)"], probe_misses=3)
    assert analysed_line(type("R", (), {"analysed": a})()).endswith(
        "drops: 0 kernel, 0 user; 3 probe runs skipped by the kernel (rows may be missing)")
    a.probe_misses = 1
    assert analysed_line(type("R", (), {"analysed": a})()).endswith(
        "drops: 0 kernel, 0 user; 1 probe run skipped by the kernel (rows may be missing)")


def test_trace_summary_line_and_json() -> None:
    s = TraceSummary(session_id=3, db_path="/tmp/x.duckdb", elapsed_s=2.0, events=10, drops_kernel=0,
                     drops_user=0, nest_skipped=0, ops={"cudaStreamSync": OpStats(count=10)},
                     ended_by="command exited", probe_misses=1)
    out = io.StringIO()
    LiveView(stream=out, err=io.StringIO()).finish(s)
    assert [ln for ln in out.getvalue().splitlines() if "skipped" in ln] == [
        "ingero: the kernel skipped 1 run of ingero's BPF programs (another BPF program or a bpf() syscall held "
        "the CPU); each may have lost a row (sessions.probe_misses)"]
    out = io.StringIO()
    LiveView(as_json=True, stream=out).finish(s)
    assert json.loads(out.getvalue())["probe_misses"] == 1
