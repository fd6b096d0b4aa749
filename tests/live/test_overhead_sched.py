"""Live: what the cheaper sched_switch / CUDA paths must still record exactly.

bpf/sched.bpf.c keeps one entry per thread from its first switch-out to its
exit (marked on/off CPU) instead of creating and deleting off-CPU state at
every switch, and both the sched and CUDA paths cache "my process is a
target" per thread, invalidated when BPF removes a target.  These tests pin
what that must not change: one row per off-CPU interval, intervals of a
thread that do not overlap, run-queue latency inside the interval, and no
rows once the process stopped being a target.  The floor test checks the
premise of bench/bench_overhead.py: the empty programs fire exactly where
the real ones do.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from workloads import Tracer, build, libcudart, query

pytestmark = pytest.mark.live

SLEEPS = 12
SLEEP_MS = 20
# A 20 ms nanosleep is 20 ms off CPU plus timer slack; nothing else this
# workload does blocks for more than a few ms.
LONG_NS = 15_000_000

SLEEPER_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void nap(long ms) { struct timespec t = {ms / 1000, (ms % 1000) * 1000000L}; nanosleep(&t, NULL); }

static int sleeps, ms;

static void *worker(void *arg)
{
	(void)arg;
	printf("worker %ld\n", (long)syscall(SYS_gettid));
	fflush(stdout);
	nap(150); /* starts while the process is a target: one long row */
	for (int i = 0; i < sleeps; i++)
		nap(ms); /* after the leader exited: the process is no target any more */
	return NULL;
}

int main(int argc, char **argv)
{
	sleeps = atoi(argv[2]);
	ms = atoi(argv[3]);
	if (argv[1][0] == 's') { /* sleeps: SLEEPS naps of MS in the main thread */
		for (int i = 0; i < sleeps; i++)
			nap(ms);
		return 0;
	}
	/* leader-exits: a worker outlives the main thread */
	pthread_t t;
	pthread_create(&t, NULL, worker, NULL);
	nap(50);
	pthread_exit(NULL);
}
"""


@pytest.fixture(scope="module")
def sleeper(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sleeper")
    (d / "sleeper.c").write_text(SLEEPER_C)
    subprocess.run(["cc", "-O1", "-o", str(d / "sleeper"), str(d / "sleeper.c"), "-lpthread"], check=True)
    return d / "sleeper"


def test_each_sleep_of_a_traced_thread_is_one_row_and_rows_do_not_overlap(tmp_path, sleeper):
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--cmd", f"{sleeper} sleeps {SLEEPS} {SLEEP_MS}")
    tracer.wait_started()
    tracer.finish(sig=None)
    pid, exec_ts = query(db, "SELECT pid, timestamp FROM events WHERE op = 'proc_exec' ORDER BY timestamp LIMIT 1")[0]
    # after the exec: before it, the launcher holds the child until the probes are in place
    where = "op = 'sched_switch' AND pid = $p AND duration_ns >= $long AND timestamp >= $exec"
    args = {"p": pid, "long": LONG_NS, "exec": exec_ts}
    long_rows = query(db, f"SELECT duration_ns, runq_ns FROM events WHERE {where} AND kind = 'sleep' "
                          "ORDER BY timestamp", args)
    assert len(long_rows) == SLEEPS, long_rows
    # anything else that long is the thread preempted on a busy box, never a sleep split or merged
    assert {kind for (kind,) in query(db, f"SELECT kind FROM events WHERE {where}", args)} <= {"sleep", "preempted"}
    # woken by its timer, then a wait for the CPU: inside the interval
    assert all(0 < runq < dur for dur, runq in long_rows), long_rows
    # every off-CPU interval of the thread once, none overlapping the next
    spans = query(db, """SELECT timestamp, duration_ns FROM events WHERE op = 'sched_switch' AND tid = $p
                         ORDER BY timestamp""", {"p": pid})
    for (t0, d0), (t1, _) in zip(spans, spans[1:]):
        assert t0 + d0 <= t1, spans


def test_a_thread_is_no_longer_traced_once_its_process_stopped_being_a_target(tmp_path, sleeper):
    """The leader's exit removes the target; its surviving worker's cached 'traced' must not outlive that."""
    db = tmp_path / "t.duckdb"
    out = tmp_path / "out"
    tracer = Tracer(db, "--cmd", f"sh -c 'exec {sleeper} leader-exits {SLEEPS} {SLEEP_MS} > {out}'")
    tracer.wait_started()
    tracer.finish(sig=None)
    worker = int(out.read_text().split()[1])
    rows = query(db, "SELECT duration_ns FROM events WHERE op = 'sched_switch' AND tid = $t AND duration_ns >= $long",
                 {"t": worker, "long": LONG_NS})
    durations = sorted(r[0] for r in rows)
    # the 150 ms nap began while traced (one row); the 20 ms naps after the leader's exit: none
    assert len(durations) == 1 and durations[0] >= 140_000_000, durations


def _runs_per_program(empty: bool, lib: Path, argv: list[str]) -> dict[str, int]:
    from ingero.collect.libs import LibraryWatcher
    from ingero.collect.loader import BpfSettings, load_program

    found = next(x for x in LibraryWatcher(extra=[lib]).poll() if x.path == lib)
    prog = load_program(BpfSettings(empty=empty))
    try:
        prog.attach_library(found.path, found.kind, found.identity, found.symbols)
        fds = {name: f for name, f in prog.program_fds().items() if not name.startswith("tracepoint__")}

        def runs() -> dict[str, int]:
            out = {}
            for name, named in fds.items():
                out[name] = sum(int(Path(f"/proc/self/fdinfo/{fd}").read_text().split("run_cnt:")[1].split()[0])
                                for fd in named)
            return out

        before = runs()
        subprocess.run(argv, check=True, capture_output=True)
        after = runs()
        return {k: after[k] - before[k] for k in after if after[k] != before[k]}
    finally:
        prog.close()


def test_the_overhead_floor_fires_exactly_where_the_tracer_does(tmp_path):
    """bench_overhead's floor: the empty object's uprobes run as often as the real object's."""
    lib = libcudart()
    assert lib is not None, "nvidia-cuda-runtime-cu12 is needed"
    # a private copy (a uprobe belongs to a file): other tracers on the host do not touch it
    copy = tmp_path / "cudart-private.so"
    copy.write_bytes(lib.read_bytes())
    calls = build("cudart_calls", tmp_path)
    n = 40
    stats = Path("/proc/sys/kernel/bpf_stats_enabled")
    saved = stats.read_text().strip()
    stats.write_text("1")
    try:
        real = _runs_per_program(False, copy, [str(calls), str(copy), str(n), "64"])
        floor = _runs_per_program(True, copy, [str(calls), str(copy), str(n), "64"])
    finally:
        stats.write_text(saved)
    assert real["cuda_return"] == 9 * n  # nine probed calls per iteration
    assert real["cuda_malloc_host_enter"] == 2 * n  # cudaMallocHost and cudaHostAlloc
    assert real["cuda_launch_kernel_enter"] == n
    assert floor == real
