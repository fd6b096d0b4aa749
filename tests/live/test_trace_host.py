"""Live: host events under `ingero trace` -- children, preemption, block I/O."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from workloads import Tracer, build, libcudart, query, wait_for

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def bins(tmp_path_factory):
    d = tmp_path_factory.mktemp("bin")
    return {name: build(name, d) for name in ("cudart_calls", "spin")}


def test_forked_child_of_cmd_is_traced_and_the_trace_ends_with_the_command(tmp_path, bins):
    """--cmd narrows tracing to the command: its CUDA-calling child is traced through fork."""
    lib = libcudart()
    assert lib is not None, "nvidia-cuda-runtime-cu12 is needed"
    db = tmp_path / "t.duckdb"
    out = tmp_path / "child.out"
    # sh forks the workload: the CUDA rows belong to the child, not to sh
    tracer = Tracer(db, "--cmd", f"sh -c '{bins['cudart_calls']} {lib} 7 64 > {out}; true'")
    tracer.wait_started()
    summary = tracer.finish(sig=None)  # ends by itself when the command exits
    assert summary["ended_by"] == "command exited" and summary["command_exit"] == 0
    child_pid = int(out.read_text().split()[1])
    rows = query(db, "SELECT pid, count(*) FROM events WHERE op = 'cudaMalloc' GROUP BY pid")
    assert rows == [(child_pid, 7)]
    sh_pid = query(db, "SELECT pid FROM events WHERE op = 'proc_exec' ORDER BY timestamp LIMIT 1")
    assert sh_pid and sh_pid[0][0] != child_pid


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_hog_on_the_traced_core_shows_as_preemptions_and_names_the_hog(tmp_path, bins):
    db = tmp_path / "t.duckdb"
    cpu = str(os.cpu_count() - 1)
    go = tmp_path / "go"
    # exec'd under its final name: the tracer meets the hog at once, before spin could rename itself
    hog_exe = tmp_path / "ingero-test-hog"
    hog_exe.symlink_to(bins["spin"])
    # the spinner waits for GO, so the hog starts after the BPF compile (a hog beside the
    # compiler on a 2-core box made the start take minutes) and before the spinner runs; the
    # gate neither holds the tracer's pipes nor outlives a failed start by more than ~90 s
    tracer = Tracer(db, "--cmd", f"sh -c 'exec >/dev/null 2>&1; i=0; "
                                 f"while [ ! -e {go} ] && [ $i -lt 1800 ]; do sleep 0.05; i=$((i+1)); done; "
                                 f"exec taskset -c {cpu} {bins['spin']} 2.5'")
    hog = None
    try:
        tracer.wait_started()
        hog = subprocess.Popen(["taskset", "-c", cpu, str(hog_exe), "60", "ingero-test-hog"])  # killed below
        # the spinner starts once the hog runs its own code (taskset has exec'd it)
        assert wait_for(lambda: _comm(hog.pid) == "ingero-test-hog", timeout=60)
        go.touch()
        summary = tracer.finish(sig=None)
    finally:
        if tracer.proc.poll() is None:
            tracer.proc.kill()
        if hog is not None:
            hog.kill()
            hog.wait()
    cmd_pid = query(db, "SELECT pid FROM events WHERE op = 'proc_exec' ORDER BY timestamp LIMIT 1")[0][0]
    pre = query(db, """SELECT count(*), sum(duration_ns), sum(runq_ns) FROM events
                       WHERE op = 'sched_switch' AND pid = $p AND kind = 'preempted'""", {"p": cmd_pid})[0]
    assert pre[0] >= 5, f"expected preemptions of the traced spinner, got {pre}"
    assert pre[1] == pre[2]  # preempted: runnable (waiting for a CPU) the whole time off CPU
    # who ran instead: the hog, by pid in the events and by name in process_cpu
    others = {r[0] for r in query(db, "SELECT DISTINCT other_pid FROM events WHERE op = 'sched_switch' AND pid = $p",
                                  {"p": cmd_pid})}
    assert hog.pid in others
    cpu_rows = query(db, """SELECT comm, sum(preempted_traced), sum(oncpu_ns) FROM process_cpu
                            WHERE pid = $p GROUP BY comm""", {"p": hog.pid})
    assert cpu_rows and cpu_rows[0][0] == "ingero-test-hog" and cpu_rows[0][1] > 0 and cpu_rows[0][2] > 0
    assert summary["events"] == query(db, "SELECT count(*) FROM events")[0][0]


def test_direct_reads_give_block_io_rows_with_latency_and_the_readers_pid(tmp_path):
    data = tmp_path / "data.bin"
    size = 4 << 20
    with open(data, "wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db)
    tracer.wait_started()
    # O_DIRECT: every read goes to the device, issued by dd itself
    reader = subprocess.run(["dd", f"if={data}", "of=/dev/null", "bs=256k", "iflag=direct"],
                            capture_output=True, timeout=30)
    assert reader.returncode == 0
    wait_for(lambda: False, timeout=1.2)  # one flush interval
    tracer.finish()
    rows = query(db, """SELECT e.pid, count(*), sum(bytes), min(duration_ns) FROM events e
                        JOIN process_names n USING (pid)
                        WHERE op = 'block_io' AND kind = 'read' AND n.comm = 'dd' GROUP BY e.pid""")
    assert len(rows) == 1, rows
    pid, count, nbytes, min_latency = rows[0]
    assert nbytes >= size and count >= size // (256 << 10)
    assert min_latency > 0


def test_comm_traces_only_processes_of_that_name(tmp_path, bins):
    import shutil

    lib = libcudart()
    assert lib is not None, "nvidia-cuda-runtime-cu12 is needed"
    other = tmp_path / "other_calls"
    shutil.copy(bins["cudart_calls"], other)  # same program, another comm
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--comm", "cudart_calls")
    tracer.wait_started()
    mine = subprocess.run([str(bins["cudart_calls"]), str(lib), "5", "8"], capture_output=True, text=True, check=True)
    theirs = subprocess.run([str(other), str(lib), "5", "8"], capture_output=True, text=True, check=True)
    tracer.finish()
    mine_pid, theirs_pid = int(mine.stdout.split()[1]), int(theirs.stdout.split()[1])
    rows = dict(query(db, "SELECT pid, count(*) FROM events WHERE op = 'cudaMalloc' GROUP BY pid"))
    assert rows == {mine_pid: 5}
    assert theirs_pid not in rows


def test_comm_of_the_full_fifteen_characters_loads_and_matches(tmp_path, bins):
    """The kernel keeps 15 characters of a name; a --comm that long fills the
    whole 16-byte compare (it once failed to load) and must match exactly,
    while a name differing only in the last character must not."""
    import shutil

    lib = libcudart()
    assert lib is not None, "nvidia-cuda-runtime-cu12 is needed"
    mine, near = tmp_path / "cudart_calls_15", tmp_path / "cudart_calls_16"
    shutil.copy(bins["cudart_calls"], mine)
    shutil.copy(bins["cudart_calls"], near)
    assert len(mine.name) == 15
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--comm", mine.name)
    tracer.wait_started()
    a = subprocess.run([str(mine), str(lib), "4", "8"], capture_output=True, text=True, check=True)
    b = subprocess.run([str(near), str(lib), "4", "8"], capture_output=True, text=True, check=True)
    tracer.finish()
    rows = dict(query(db, "SELECT pid, count(*) FROM events WHERE op = 'cudaMalloc' GROUP BY pid"))
    assert rows == {int(a.stdout.split()[1]): 4}
    assert int(b.stdout.split()[1]) not in rows
