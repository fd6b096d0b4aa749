"""Live: `ingero trace` as a newcomer types it (issue 42).

`trace -- CMD ARGS` starts the job with exactly those words; the job's stdout
is its own (ingero's start lines, per-second lines and summary are on
stderr); the tracer's own accounting (how its summaries were written) shows
only under -v; -p takes a comma list and -d stops the trace.
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
import sys

import pytest

from workloads import INGERO, REPO, TRACED_RUN_TIMEOUT_S, query

pytestmark = pytest.mark.live

# words a shell would split, expand or glob: after `--` each must reach the job unchanged
AWKWARD = ["a b", '"q"', "it's", "$HOME", "", "*", "tab\there", "--json", "-p", "--"]
# the job: sleeps past the tracer's first per-second lines, then prints its argv
JOB = [sys.executable, "-c", "import sys, time; time.sleep(2.5); print(repr(sys.argv[1:]))"]
TICK = re.compile(r"^ +\d+\.\ds  \d+ events  [\d,]+/s  drops \d+  ")


def trace(tmp_path, *args: str) -> subprocess.CompletedProcess:
    # --no-cupti/--no-nvtx: nothing to inject into a job that makes no CUDA call
    return subprocess.run([*INGERO, "trace", "--no-serve", "--no-cupti", "--no-nvtx",
                           "--db", str(tmp_path / "t.duckdb"),
                           *args], cwd=REPO, capture_output=True, text=True, timeout=TRACED_RUN_TIMEOUT_S)


def test_the_job_gets_its_words_and_its_stdout_alone(tmp_path):
    r = trace(tmp_path, "-d", "120s", "--", *JOB, *AWKWARD)
    assert r.returncode == 0, r.stderr
    assert ast.literal_eval(r.stdout) == AWKWARD and r.stdout.count("\n") == 1  # nothing of ingero's
    err = r.stderr.splitlines()
    assert any(TICK.match(line) for line in err), r.stderr  # the per-second lines: stderr
    assert re.match(r"^ingero: session 1 -> .*  \(Ctrl-C to stop\)$", next(x for x in err if " -> " in x))
    assert re.search(r"^ingero: session 1 closed \(command exited\) after ", r.stderr, re.M)
    assert err[-2:] == ["ingero: the command exited with code 0",
                        f"ingero: next: ingero explain --db {tmp_path / 't.duckdb'}"]
    # the tracer's own accounting is a detail: not without -v
    assert not [line for line in err if line.startswith(("ingero: summaries: ", "ingero: holds: "))], r.stderr
    # the session row keeps the command line as typed, each word quoted back
    [(command, targets)] = query(tmp_path / "t.duckdb", "SELECT command, targets FROM sessions")
    assert command.endswith(" -- " + shlex.join([*JOB, *AWKWARD]))
    assert targets.startswith("cmd ")


def test_verbose_adds_the_tracers_accounting_and_cmd_reads_the_same(tmp_path):
    line = shlex.join([*JOB, "a b", "c"])
    r = trace(tmp_path, "-v", "--cmd", line)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "['a b', 'c']\n"
    summaries = [x for x in r.stderr.splitlines() if x.startswith("ingero: summaries: ")]
    assert len(summaries) == 1 and re.match(r"ingero: summaries: [\d,]+ flushes summarised in ", summaries[0]), r.stderr


def test_short_options_pid_list_and_duration(tmp_path):
    sleepers = [subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"]) for _ in range(2)]
    try:
        pids = [p.pid for p in sleepers]
        r = trace(tmp_path, "-p", f"{pids[0]},{pids[1]}", "-d", "2s")
    finally:
        for p in sleepers:
            p.kill()
            p.wait()
    assert r.returncode == 0, r.stderr
    assert r.stdout == ""
    assert re.search(r"^ingero: session 1 closed \(duration\) after ", r.stderr, re.M), r.stderr
    [(targets,)] = query(tmp_path / "t.duckdb", "SELECT targets FROM sessions")
    assert targets == f"pid {pids[0]},{pids[1]} (and their children)"
    # both were seen switching out while they slept
    seen = {pid for (pid,) in query(tmp_path / "t.duckdb", "SELECT DISTINCT pid FROM events WHERE op = 'sched_switch'")}
    assert set(pids) <= seen
