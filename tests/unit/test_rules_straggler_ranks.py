"""straggler across the ranks of an NCCL job: hand-made tables.

``job()`` writes N ranks in lockstep the way NCCL makes them run: per step
each rank copies, launches and then enters the all-reduce
(``ncclAllReduce`` row, its comm); the collective starts when the last rank
is in and the device work queued before it is done, and every rank's stream
sync returns when it ends.  A late rank is late because of something of its
own (preempted by a hog, asleep waiting for its input) for ``delay_ms`` in
the steps ``late(k)`` names; everything else is equal across ranks, with a
little deterministic jitter.
"""

from __future__ import annotations

import pyarrow as pa

from analyze_helpers import MS, SESSION, T0, US, S, Trace
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.analyze.rules import straggler

PID0 = 5100  # rank r is PID0 + r
HOG = 7000
LAUNCHER = 5000
COMM_ID = "ab" * 16


def job(n: int = 4, seconds: float = 20, *, late=lambda k: None, delay_ms: float = 13.0, how: str = "preempt",
        jitter_ms: float = 0.15, ranks_rows: str = "nccl", from_s: float = 6.0, everyone_ms: float = 0.0) -> Trace:
    tr = Trace()
    tr.name(LAUNCHER, "python3 (train.py)", "python3", "python3 train.py --ranks 4")
    for r in range(n):
        tr.name(PID0 + r, "python3 (train.py)", "python3", "python3 train.py --ranks 4", ppid=LAUNCHER)
    tr.name(HOG, "zstd-archiver", "zstd-archiver", "zstd -19 /var/backups/db.tar", ppid=1)
    tr.system(0, seconds)
    t = T0 + 200 * MS
    k = 0
    while t < T0 + int(seconds * S):
        slow = late(k) if t >= T0 + int(from_s * S) else None
        entries = {}
        for r in range(n):
            pid = PID0 + r
            c = t + int(((k * 7 + r * 3) % 5 - 2) * jitter_ms / 2 * MS)  # deterministic jitter
            tr.ev(c, "cudaMemcpyAsync", pid, pid, 20 * US, kind="H2D", bytes=8 << 20)
            c += 30 * US
            for _ in range(8):
                tr.ev(c, "cudaLaunchKernel", pid, pid, 6 * US)
                c += 250 * US
            c += 2 * MS  # Python between backward and the all-reduce
            if everyone_ms and t >= T0 + int(from_s * S):  # every rank shares the cause
                d = int(everyone_ms * MS)
                for s in range(4):
                    tr.switch(c + s * d // 4, pid, pid, d // 4, "preempted", runq=d // 4, other=HOG)
                c += d
            if slow == r:
                d = int(delay_ms * MS)
                if how == "preempt":
                    for s in range(4):
                        tr.switch(c + s * d // 4, pid, pid, d // 4, "preempted", runq=d // 4, other=HOG)
                elif how == "sleep":
                    tr.switch(c, pid, pid, d, "sleep", runq=10 * US)
                # "unseen": on CPU, nothing in the trace says why
                c += d
            tr.ev(c, "ncclAllReduce", pid, pid, 15 * US, kind="sum:float32", bytes=32 << 20, comm=0xC000 + r,
                  stream=0x5150)
            entries[pid] = c + 15 * US
        start = max(max(entries.values()), t + 8 * MS)  # all ranks in, and their kernels done
        end = start + 3 * MS
        for pid, e in entries.items():
            dur = end - e + 40 * US
            tr.ev(e + 5 * US, "cudaStreamSync", pid, pid, dur)
            if end - e > 100 * US:
                tr.switch(e + 20 * US, pid, pid, end - e, "sleep", runq=20 * US)
        t = end + 1 * MS  # optimizer step on the host
        k += 1
    if how == "preempt" or everyone_ms:
        tr.competitor(HOG, "zstd-archiver", from_s, seconds, oncpu=0.9)
    tr.rank_rows = _ranks(n, ranks_rows)
    return tr


def _ranks(n: int, which: str) -> list[dict]:
    rows = []
    for r in range(n):
        pid = PID0 + r
        if which in ("nccl", "both") or (which == "env-only-rank3" and r != 3):
            rows.append({"session_id": SESSION, "pid": pid, "seen_ns": T0, "source": "nccl", "comm": 0xC000 + r,
                         "comm_id": COMM_ID, "rank": r, "nranks": n, "local_rank": None, "job": None})
        if which in ("env", "both", "env-only-rank3"):
            rows.append({"session_id": SESSION, "pid": pid, "seen_ns": T0, "source": "env", "comm": None,
                         "comm_id": None, "rank": r, "nranks": n, "local_rank": r, "job": "run42"})
    return rows


def run(tr: Trace):
    for e in tr.events:  # every row the same columns (pyarrow takes them from the first)
        e.setdefault("comm", None)
        e.setdefault("stream", None)
    store = tr.store()
    if tr.rank_rows:
        store.append("ranks", pa.Table.from_pylist(tr.rank_rows))
    return explain(store.con, Options())


def stragglers(report) -> list:
    return [c for c in report.chains if c.rule_id == "straggler"]


def test_a_rank_preempted_every_step_is_named_with_its_culprit_and_the_waits():
    report = run(job(late=lambda k: 1))
    [chain] = stragglers(report)
    assert chain.severity == "HIGH"
    assert chain.title == straggler.TITLE_RANK
    assert chain.pids == [PID0 + 1]
    assert chain.numbers["late_rank"] == 1
    # 13 ms of preemption before the entry: 13 ms behind the median rank
    assert abs(chain.numbers["lag_ns"] - 13 * MS) < 0.5 * MS
    assert abs(chain.numbers["wait_per_step_ns"] - 13 * MS) < 0.5 * MS
    assert [c.pid for c in chain.culprits] == [HOG]
    summary = chain.root[0]
    assert summary.startswith(f"rank 1 (python3 (train.py) (PID {PID0 + 1})) preempted")
    assert "by zstd-archiver (PID 7000)" in summary
    assert "→ enters the all-reduce 12.9 ms after the others" in summary
    assert "→ ranks 0, 2, 3 wait 13.0 ms per step (61.8% of wall clock)" in summary
    assert chain.fix[0] == (f"taskset -acp 1 {HOG}   "
                            f"(keep zstd-archiver off rank 1 (python3 (train.py) (PID {PID0 + 1}))'s core 0)")
    assert f"renice -n 19 -p {HOG}" in chain.fix
    # the threshold comes from the run: 3 x the noise of the ranks' per-window median lags (the
    # +-0.15 ms jitter of single steps averages out: the floor)
    assert abs(chain.numbers["threshold_ns"] - 3 * chain.numbers["noise_ns"]) <= 2
    assert chain.numbers["noise_ns"] == straggler.T.min_noise_ns
    # the late rank's own cpu-contention chain is there too, listed after the chain it explains
    ids = [(c.rule_id, c.pids) for c in report.chains]
    assert ("cpu-contention", [PID0 + 1]) in ids
    assert ids.index(("straggler", [PID0 + 1])) < ids.index(("cpu-contention", [PID0 + 1]))
    assert report.chains[0] is chain


def test_a_rank_starved_of_input_is_named_with_a_dataloader_fix():
    [chain] = stragglers(run(job(late=lambda k: 2, how="sleep", delay_ms=10)))
    assert chain.pids == [PID0 + 2]
    assert "waiting for its input" in chain.root[2]
    assert chain.fix[0].startswith("DataLoader(num_workers=")
    assert chain.culprits == []


def test_a_rotating_straggler_has_no_single_culprit_and_stays_low():
    [chain] = stragglers(run(job(late=lambda k: k % 4)))
    assert chain.title == straggler.TITLE_ROTATING
    assert chain.severity == "LOW"
    assert chain.numbers["late_share"] <= 0.3
    assert "no single culprit" in chain.root[1]


def test_every_rank_equally_contended_is_contention_not_a_straggler():
    # every rank preempted 12 ms per step by the same hog
    report = run(job(everyone_ms=12))
    assert [c for c in stragglers(report) if c.severity in ("HIGH", "MEDIUM")] == []
    strong = {(c.rule_id, c.pids[0]) for c in report.chains if c.severity in ("HIGH", "MEDIUM")}
    assert strong == {("cpu-contention", PID0 + r) for r in range(4)}
    assert report.chains[0].rule_id == "cpu-contention"


def test_a_late_rank_its_own_evidence_does_not_explain_is_no_culprit_when_all_are_contended():
    # every rank preempted 12 ms per step; rank 2 is 3 ms later for nothing the trace shows
    [chain] = stragglers(run(job(late=lambda k: 2, delay_ms=3, everyone_ms=12, how="unseen")))
    assert chain.severity == "LOW" and chain.pids == [PID0 + 2]
    assert "no cause of its own: every rank is preempted" in chain.root[2]
    assert chain.culprits == []


def test_equal_ranks_give_no_straggler():
    report = run(job())
    assert stragglers(report) == []
    assert [c for c in report.chains if c.severity in ("HIGH", "MEDIUM")] == []


def test_a_small_steady_lag_under_the_wait_threshold_is_low():
    # rank 3 is 0.4 ms late every step: past the noise (jitter 0.05 ms), but ~3% of the others' wall clock
    [chain] = stragglers(run(job(late=lambda k: 3, delay_ms=0.4, jitter_ms=0.05)))
    assert chain.numbers["late_rank"] == 3
    assert chain.numbers["wait_share"] < straggler.T.min_wait_share
    assert chain.severity == "LOW"


def test_ranks_known_only_from_the_environment_are_one_job():
    # rank 3 initialised its communicator before the trace: no 'nccl' row, its RANK from the environment
    [chain] = stragglers(run(job(late=lambda k: 3, ranks_rows="env-only-rank3")))
    assert chain.pids == [PID0 + 3] and chain.numbers["late_rank"] == 3
    assert chain.numbers["ranks"] == 4


def test_a_process_nothing_ties_to_the_job_is_left_out_not_guessed():
    tr = job(late=lambda k: 3)
    tr.rank_rows = [r for r in tr.rank_rows if r["pid"] != PID0 + 3]
    # PID 5103 (late every step) has no ranks row: not part of the job; the three ranks left are equal
    assert stragglers(run(tr)) == []


def test_without_rank_rows_there_is_no_job():
    tr = job(late=lambda k: 1)
    tr.rank_rows = []
    assert all(c.title != straggler.TITLE_RANK for c in stragglers(run(tr)))
