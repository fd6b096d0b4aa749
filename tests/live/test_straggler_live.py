"""Live: ranks of a data-parallel job on the simulated NCCL, traced with real eBPF.

demos/workloads/train.py --ranks 2 starts two rank processes torchrun-style
(one per core); each all-reduces its gradients every step through
demos/build/libnccl.so.2, whose collectives really wait for every rank.

* A healthy job whose ranks load two different copies of libnccl: one
  communicator (the same ncclUniqueId in both ranks' init rows), one job to
  explain, every all-reduce of both ranks traced, no HIGH or MEDIUM
  straggler (and nothing else about the job itself: a neighbour's load on
  this shared box may show as cpu-contention, as in test_demo_live).
* A job traced only after its communicators exist (the tracer attached by
  --pid once the first step is done), with the same hogs on both ranks'
  cores: every all-reduce is still a row, the ranks come from the torchrun
  environment (no 'nccl' row to take them from), and explain names CPU
  contention on both ranks. The tracer and the box's other load run on one
  of the two cores, so one rank can really be late for a while: a straggler
  chain above LOW must then be true by the simulated NCCL's own measure in
  its evidence windows.

The straggler scenario itself (hogs on one rank's core) is in
test_demo_live.py with the other demo scenarios.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import workloads
from workloads import REPO, Tracer, query, simcuda, wait_for

pytestmark = pytest.mark.live


@pytest.fixture(autouse=True)
def patient_start(monkeypatch):
    """Two ranks, their workers and hogs on 2 cores: the tracer has taken 135 s to start at load 18."""
    monkeypatch.setattr(workloads, "START_TIMEOUT_S", 240)

TRAIN = REPO / "demos" / "workloads" / "train.py"
STEPS = 200
# host work after each step's sync is on the critical path, so CPU hogs make a rank late
JOB = ("--ranks", "2", "--rank-cpus", "0,1", "--workers", "1", "--kernel-us", "1000", "--host-us", "3000")
# a healthy job: 16 ms of kernels per step, 0.3 ms of host work (3 ms of it would leave the
# device idle a quarter of each step: host-bound by its own physics)
HEALTHY_JOB = ("--ranks", "2", "--rank-cpus", "0,1", "--workers", "1", "--kernel-us", "2000", "--host-us", "300")
STRONG = ("HIGH", "MEDIUM")
# Rules whose cause can be any process on the host, the test's neighbours included.
HOST_RULES = {"cpu-contention", "io-stall", "memory-pressure"}


def _explain(db: Path, from_ns: int | None = None):
    from ingero.analyze import collectives, context, windows
    from ingero.analyze.context import Options
    from ingero.analyze.explain import explain
    from ingero.store.db import Store

    store = Store.open(db, read_only=True)
    try:
        report = explain(store.con, Options(from_ns=from_ns))
        ctx = context.resolve(store.con, Options(from_ns=from_ns))
        windows.build(ctx)
        jobs = collectives.jobs(ctx)
    finally:
        store.close()
    return report, jobs


def test_healthy_job_on_two_libnccl_copies_is_one_job_without_a_straggler(tmp_path):
    cudart = simcuda()
    nccl = cudart.parent / "libnccl.so.2"
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / "libnccl.so.2"
    shutil.copy(nccl, copy)  # another file: its own probes, its own inode
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, str(TRAIN), "--lib", str(cudart), "--nccl", f"{nccl},{copy}", *HEALTHY_JOB,
           "--steps", str(STEPS), "--summary-json", str(summary)]
    db = tmp_path / "t.duckdb"
    tracer = Tracer(db, "--cuda-lib", str(cudart), "--cuda-lib", str(nccl), "--cuda-lib", str(copy),
                    "--duration", "120s", "--cmd", " ".join(cmd))
    tracer.wait_started()
    assert tracer.finish(sig=None, timeout=180)["ended_by"] == "command exited", tracer.stderr
    job = json.loads(summary.read_text())
    pids = [r["pid"] for r in job["per_rank"]]
    assert [r["steps"] for r in job["per_rank"]] == [STEPS, STEPS]

    # every all-reduce of both ranks, one init each, on the two files
    rows = query(db, """SELECT pid, op, count(*) FROM events WHERE list_contains($p, pid) AND op LIKE 'nccl%'
                        GROUP BY ALL ORDER BY ALL""", {"p": pids})
    assert rows == sorted((p, op, n) for p in pids
                          for op, n in (("ncclAllReduce", STEPS), ("ncclCommInitRank", 1), ("ncclCommDestroy", 1)))
    attached = query(db, """SELECT DISTINCT target FROM probes WHERE symbol = 'ncclAllReduce' AND attached
                            ORDER BY target""")
    # (other copies on this host, e.g. in other virtualenvs, are probed too)
    assert {str(nccl.resolve()), str(copy.resolve())} <= {t for (t,) in attached}
    ranks = query(db, """SELECT pid, rank, nranks, comm_id FROM ranks WHERE source = 'nccl' ORDER BY rank""")
    assert [(p, r, n) for p, r, n, _ in ranks] == [(pids[0], 0, 2), (pids[1], 1, 2)]
    assert ranks[0][3] == ranks[1][3]  # one ncclUniqueId whichever copy each rank loaded

    report, jobs = _explain(db)
    assert [(j.ranks, len(j.entries)) for j in jobs] == [({pids[0]: 0, pids[1]: 1}, STEPS)]
    strong = [(c.rule_id, c.severity, c.root[0]) for c in report.chains
              if c.severity in STRONG and c.rule_id not in HOST_RULES | {"straggler"}]
    assert strong == []
    # a neighbour's load on this shared box can make one rank a real straggler: the chain then
    # blames that load, never the job's own processes (the job itself is healthy)
    job_pids = {job["pid"], *pids, *(p for q in pids for p in _children_seen(db, q))}
    for c in report.chains:
        if c.rule_id == "straggler" and c.severity in STRONG:
            assert not {x.pid for x in c.culprits} & job_pids, (c.root, c.culprits)


def _children_seen(db: Path, pid: int) -> list[int]:
    return [p for (p,) in query(db, "SELECT DISTINCT pid FROM process_names WHERE ppid = $p", {"p": pid})]


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def test_job_traced_after_init_and_contended_on_every_rank_is_contention_and_any_straggler_is_true(tmp_path):
    cudart = simcuda()
    nccl = cudart.parent / "libnccl.so.2"
    ready = tmp_path / "ready"
    summary = tmp_path / "summary.json"
    hogs: list[subprocess.Popen] = []
    job = subprocess.Popen([sys.executable, str(TRAIN), "--lib", str(cudart), "--nccl", str(nccl), *JOB,
                            "--duration", "600", "--ready-file", str(ready), "--summary-json", str(summary),
                            "--wait-timeline"],
                           stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        # the same two busy processes on each rank's core
        for cpu in (0, 0, 1, 1):
            hogs.append(subprocess.Popen([sys.executable, "-m", "ingero.demo.interference", "cpu-hog", str(cpu)],
                                         start_new_session=True, cwd=REPO))
        # the communicators exist once a rank has done a step (ncclCommInitRank returns when all joined)
        assert wait_for(ready.exists, timeout=60), "the job never made a step"
        ranks = []
        assert wait_for(lambda: len(ranks.extend(_children(job.pid)) or ranks) >= 2, timeout=10)
        ranks = sorted(set(ranks))[:2]
        db = tmp_path / "t.duckdb"
        tracer = Tracer(db, "--cuda-lib", str(cudart), "--cuda-lib", str(nccl), "--duration", "12s",
                        "--pid", ",".join(str(p) for p in (job.pid, *ranks)))
        tracer.wait_started()
        tracer.finish(sig=None)
    finally:
        for p in hogs:
            os.killpg(p.pid, 9)
            p.wait()
        if job.poll() is None:
            job.terminate()  # the ranks agree on a last step and stop
        job.wait(timeout=60)

    # no init in the trace: every all-reduce still a row, the ranks from the environment only
    counts = dict(query(db, """SELECT op, count(DISTINCT pid) FROM events WHERE op LIKE 'nccl%' GROUP BY op"""))
    assert counts.get("ncclAllReduce") == 2 and "ncclCommInitRank" not in counts, counts
    env = query(db, """SELECT source, rank, nranks, count(DISTINCT job) FROM ranks WHERE list_contains($p, pid)
                       GROUP BY ALL ORDER BY rank""", {"p": ranks})
    assert env == [("env", 0, 2, 1), ("env", 1, 2, 1)]

    report, jobs = _explain(db)
    assert len(jobs) == 1 and sorted(jobs[0].ranks.values()) == [0, 1]
    strong = {(c.rule_id, p) for c in report.chains if c.severity in STRONG for p in c.pids}
    assert ("cpu-contention", ranks[0]) in strong and ("cpu-contention", ranks[1]) in strong, strong
    # Equal hogs make equal ranks only if the rest of the box's load spreads evenly too, and the
    # tracer itself runs on one of the two cores: a rank can really be late for a few seconds.
    # A straggler chain must then be true where it says so: in its evidence windows, by the
    # simulated NCCL's truth (how long each rank's all-reduces stood waiting for the other),
    # the other rank waited for the named one longer than the named one waited for it.
    per_rank = json.loads(summary.read_text())["per_rank"]
    waits = {r["pid"]: _step_waits(r["collective_wait_timeline"]) for r in per_rank}
    for c in report.chains:
        if c.rule_id != "straggler" or c.severity not in STRONG:
            continue
        assert len(c.pids) == 1, c.root
        (late,) = c.pids
        inside = {p: _sum_in(ws, c.evidence_windows) for p, ws in waits.items()}
        other = max(v for p, v in inside.items() if p != late)
        assert other > inside[late], (inside, c.root)


def _step_waits(timeline: list[list[int]]) -> list[tuple[int, int]]:
    """(end of step ns, this step's all-reduce wait ns) from a rank's cumulative timeline."""
    out, prev = [], None
    for t, cum in timeline:
        if prev is not None:
            out.append((t, cum - prev))
        prev = cum
    return out


def _sum_in(steps: list[tuple[int, int]], windows) -> int:
    """The waits of the steps that ended inside any of ``windows``."""
    inside = [w for t, w in steps if any(win.start_ns <= t < win.end_ns for win in windows)]
    assert len(inside) >= 3, f"{len(inside)} steps in the evidence windows"
    return sum(inside)
