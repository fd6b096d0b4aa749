"""The machine itself: ingero check passes and a real sched_switch program sees switches."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

pytestmark = [pytest.mark.live, pytest.mark.exact]  # times nothing: runs beside another exact test (Makefile)


def test_check_says_ready(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "ingero", "check", "--json", "--db", str(tmp_path / "x.duckdb")],
                       capture_output=True, text=True)
    doc = json.loads(r.stdout)
    failing = [c for c in doc["checks"] if c["required"] and not c["ok"]]
    assert failing == [] and doc["ready"] is True and r.returncode == 0, r.stdout + r.stderr
    bpf = next(c for c in doc["checks"] if c["name"] == "BPF load")
    assert bpf["ok"] and "loaded" in bpf["detail"]


def test_sched_switch_program_counts_this_threads_switches() -> None:
    from bcc import BPF

    from ingero.collect.kheaders import ensure_tracefs, find_kernel_headers

    ensure_tracefs()
    find_kernel_headers().export()
    b = BPF(text=b"""
    BPF_ARRAY(seen, u64, 1);
    TRACEPOINT_PROBE(sched, sched_switch) {
        if (args->prev_pid != TID) return 0;  /* TID comes from cflags */
        int k = 0; u64 *v = seen.lookup(&k);
        if (v) __sync_fetch_and_add(v, 1);
        return 0;
    }""", cflags=[f"-DTID={threading.get_native_id()}"])
    try:
        for _ in range(50):
            time.sleep(0.001)  # each sleep switches this thread out once
        seen = b["seen"][0].value
    finally:
        b.cleanup()
    assert 50 <= seen <= 60, seen
    assert os.geteuid() == 0


NOBODY = 65534


def test_check_as_another_user_says_what_it_could_not_read(tmp_path: Path) -> None:
    """`ingero check` as a user other than root: each place it may not read is named in its line,
    with root as the way to read it; never `check failed: PermissionError(...)`."""
    from ingero.cli import main

    # as root first: every module the checks import is loaded (the user may not read the checkout)
    assert main(["check", "--json", "--db", str(tmp_path / "warm.duckdb")]) == 0
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nobody, in this interpreter; its stdout and stderr into the pipe
        code = 99
        try:
            os.close(r)
            out = os.fdopen(w, "w")
            sys.stdout = sys.stderr = out
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = main(["check", "--db", str(tmp_path / "x.duckdb")])
        except BaseException:  # noqa: BLE001 - said in the parent's assertion
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        text = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 2, text  # not ready: not root
    assert "check failed" not in text and "Error" not in text and "Traceback" not in text, text
    lines = {line.split()[1]: line for line in text.splitlines() if line.startswith(("ok ", "missing ", "absent "))}
    assert lines["root"] == f"missing  root            running as uid {NOBODY}"
    tracefs = Path("/sys/kernel/tracing")
    if not os.stat(tracefs).st_mode & 0o005:  # root's only, as on Debian: nobody cannot list it
        assert lines["tracepoints"] == (f"missing  tracepoints     skipped: {tracefs} (where they are listed) "
                                        "is readable by root only"), text
    cuda = next(line for line in text.splitlines() if "CUDA libraries" in line)
    # pid 1 is root's: its maps are never nobody's to read
    assert re.search(rf"; not searched as uid {NOBODY}: (.+, )?the memory maps of [\d,]+ processes of other users "
                     r"\(reading them needs root\)$", cuda), cuda
    if not os.stat("/root").st_mode & 0o005:
        assert f"as uid {NOBODY}: /root, " in cuda, cuda
    # the test's directory is root's (0700): the database cannot be reached, nor written
    db = tmp_path / "x.duckdb"
    assert lines["database"] in (f"missing  database        {db} "
                                 f"(cannot be reached as uid {NOBODY}: permission denied)",
                                 f"missing  database        {db} (will be created, not writable)"), text
