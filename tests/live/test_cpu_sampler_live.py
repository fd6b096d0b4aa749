"""The --stack CPU sampler (bpf/sample.bpf.c), live: samples of a traced thread name its hot line.

sample_burn.py burns CPU_S of CPU time on one known line of burn(), then
sleeps 1 s.  The sampler runs at 99 Hz on a cpu-clock event, which ticks
only while a task runs: the burning thread gets ~99 samples per CPU-second,
each with its Python stack, none while it sleeps.
"""

from __future__ import annotations

import sys

import pytest

import workloads

pytestmark = pytest.mark.live

SCRIPT = workloads.HERE.parent / "sample_burn.py"
CPU_S = 2.0
HZ = 99


def test_samples_name_the_burning_line(tmp_path, monkeypatch):
    monkeypatch.setattr(workloads, "START_TIMEOUT_S", 400)  # a compile at a load of 20-30 takes minutes
    db = tmp_path / "t.duckdb"
    tracer = workloads.Tracer(db, "--stack", "--duration", "90s", "--cmd", f"{sys.executable} {SCRIPT} {CPU_S}")
    tracer.wait_started()
    tracer.finish(sig=None, timeout=workloads.TRACED_RUN_TIMEOUT_S)
    lines = _lines()
    [(attached,)] = workloads.query(db, "SELECT attached FROM probes WHERE probe_kind = 'perf_event'")
    assert attached
    rows = workloads.query(db, """
        WITH inner_frame AS (
            SELECT stack_id, arg_min(file, depth) AS file, arg_min(line, depth) AS line,
                   arg_min(function, depth) AS function
            FROM stacks WHERE frame_kind = 'python' GROUP BY stack_id
        )
        SELECT f.file, f.line, f.function, count(*) AS n, min(e.duration_ns), max(e.duration_ns),
               count(*) FILTER (e.in_call IS NOT NULL)
        FROM events e JOIN inner_frame f USING (stack_id)
        WHERE e.op = 'cpu_sample' GROUP BY ALL ORDER BY n DESC""")
    assert rows, "no cpu_sample rows with a Python stack"
    total = sum(r[3] for r in rows)
    file, line, function, n, dmin, dmax, in_call = rows[0]
    assert (file, line, function) == (str(SCRIPT), lines["BURN_LINE"], "burn"), rows[:5]
    # CPU_S of CPU at 99 Hz: the hot line holds nearly every sample (start-up imports the rest)
    assert n >= 0.9 * total, rows[:5]
    assert n >= 0.5 * CPU_S * HZ, (n, rows[:5])
    assert all(r[1] != lines["SLEEP_LINE"] for r in rows), rows
    assert (dmin, dmax) == (10**9 // HZ, 10**9 // HZ)  # each sample stands for one period
    assert in_call == 0  # no CUDA call here
    # only the traced process is sampled (the machine runs other Python processes meanwhile)
    rows = workloads.query(db, """SELECT DISTINCT e.pid, n.cmdline FROM events e LEFT JOIN process_names n USING (pid)
                                  WHERE e.op = 'cpu_sample'""")
    assert len(rows) == 1 and str(SCRIPT) in (rows[0][1] or ""), rows


def _lines() -> dict:
    text = list(enumerate(SCRIPT.read_text().splitlines(), 1))
    return {tag: next(no for no, t in text if f"# {tag}" in t and "no, t" not in t)
            for tag in ("BURN_LINE", "SLEEP_LINE")}
