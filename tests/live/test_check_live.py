"""The machine itself: ingero check passes and a real sched_switch program sees switches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
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
