"""Live: a job started through a shim that execs python is named after python, not the shim.

Issue 15, finding 3: a `python3` that is a pyenv shim (a bash script that
forks a few helpers, then execs the real interpreter) was called `bash (pyenv)`
everywhere, the fix read `taskset -c 1 bash pyenv …`, and every helper the
shim forked was listed among the "traced processes".  Here a bash wrapper of
our own plays the shim (it is not in a `shims/` directory, so only following
the exec can name it right), under `ingero trace --cmd`, with two hogs on the
loop's core so that explain usually has a fix to write (checked when it does;
tests/unit/test_exec_identity.py checks the fix deterministically).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from workloads import INGERO, REPO, Tracer, build, query

pytestmark = pytest.mark.live

TRAIN = REPO / "demos" / "workloads" / "train.py"

# A pyenv-like shim: helpers forked in command substitutions, then exec.  The
# sleep stands for the rest of pyenv's lookups (~30 forked helpers, over 100 ms
# here): the tracer sees the shim's bash first, as it saw pyenv's.
SHIM = """#!/usr/bin/env bash
set -e
program="$(basename "$0")"
version="$(cat "$(dirname "$0")/version")"
real="$(command -v {python})"
[ -n "$program" ] && [ -n "$version" ]
sleep 1
exec "$real" "$@"
"""


def test_a_shim_that_execs_python_is_named_python_and_counted_once(tmp_path, simcuda):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "python3"
    shim.write_text(SHIM.format(python=sys.executable))
    shim.chmod(0o755)
    (bindir / "version").write_text("3.11.7\n")
    spin = build("spin", tmp_path)
    db = tmp_path / "t.duckdb"
    cmd = (f"taskset -c 0 {shim} {TRAIN} --lib {simcuda} --duration 6 --workers 0 --kernel-us 300 "
           f"--kernels-per-step 8 --batch-bytes 200KB --host-us 300")
    hogs = [subprocess.Popen(["taskset", "-c", "0", str(spin), "30", f"ingero-hog{i}"], stdout=subprocess.DEVNULL)
            for i in range(2)]
    try:
        tracer = Tracer(db, "--cuda-lib", str(simcuda), "--cmd", cmd)
        tracer.wait_started()
        summary = tracer.finish(sig=None, timeout=180)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert summary["ended_by"] == "command exited" and summary["command_exit"] == 0, tracer.stderr

    # one pid made every CUDA call: the shim's pid, after its exec
    (pid,) = [r[0] for r in query(db, "SELECT DISTINCT pid FROM events WHERE op = 'cudaLaunchKernel'")]
    execs = query(db, "SELECT count(*) FROM events WHERE op = 'proc_exec' AND pid = $p", {"p": pid})[0][0]
    assert execs >= 3  # taskset -> env -> bash (the shim) -> python
    # process_names shows the latest image; process_history ends with it
    name, cmdline, seen_ns = query(db, "SELECT name, cmdline, last_seen_ns FROM process_names WHERE pid = $p",
                                   {"p": pid})[0]
    history = query(db, "SELECT from_ns, name FROM process_history WHERE pid = $p ORDER BY from_ns", {"p": pid})
    ends = query(db, "SELECT op, timestamp FROM events WHERE pid = $p AND op IN ('proc_exec', 'proc_exit') "
                     "ORDER BY timestamp", {"p": pid})
    why = f"history {history}, exec/exit {ends}, named at {seen_ns}"
    assert name == "python (train.py)" and cmdline.startswith(f"{sys.executable} {TRAIN}"), why
    assert history[-1][1] == "python (train.py)", why

    proc = subprocess.run([*INGERO, "explain", "--db", str(db), "--json"], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["analysed"]["processes"] == [f"python (train.py) (PID {pid})"]
    # with hogs on its core explain usually has a fix to write (whether it does is the rules'
    # business): every chain names the job, and a taskset fix starts python, not the shim
    chains = report["chains"]
    text = json.dumps(chains)  # other processes of a shared box may be called bash: the shim's name may not
    assert "bash (python3)" not in text and str(shim) not in text
    for fix in (f for c in chains for f in c["fix"] if f.startswith("taskset -c ")):
        assert " python train.py" in fix, fix

    terminal = subprocess.run([*INGERO, "explain", "--db", str(db)], capture_output=True, text=True, cwd=REPO)
    assert terminal.returncode == 0, terminal.stderr
    assert "from 1 traced process " in " ".join(terminal.stdout.split())  # (wrapped to 100 columns)
