"""NCCL jobs and their collectives, step by step: who entered each collective when.

A job is the processes that share a communicator (ranks.comm_id: the same
ncclUniqueId, whichever libnccl copy each one loaded) or a torchrun / Slurm
job id (ranks.job from the environment); a process with both ties the two.
A process whose communicator was created before the trace began has no
'nccl' row: its collectives still count, with its rank from the environment,
or none (shown as unknown, never guessed).

Collective k of a communicator is the k-th collective call of each of its
ranks (NCCL requires every rank to issue a communicator's collectives in
the same order).  When the trace began mid-run, a rank's first traced call
may be a different k than another's: each rank's sequence is shifted by the
offset (within MAX_SHIFT) that lines its entries up best with the busiest
rank's (least median distance).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import duckdb

from ingero.analyze import procs
from ingero.analyze.context import Context
from ingero.events.ops import COLLECTIVE_OPS, SYNC_OPS
from ingero.store.selection import Selection

# A rank's first traced collective is at most this many calls off another's
# (a trace attached mid-run catches ranks within a step or two of each other).
MAX_SHIFT = 3

# Each collective call, with the return of the thread's next sync (the collective's completion
# as that rank saw it: every rank's sync after collective k returns when k is done, so these
# line the ranks' sequences up even when one rank enters a whole step late).
CALLS_SQL = f"""
WITH c AS (
    SELECT pid, tid, timestamp, comm, op FROM events
    WHERE {Selection.where(pids=False)} AND list_contains($ops, op)
), s AS (
    SELECT tid, timestamp AS s0, timestamp + duration_ns AS s1 FROM events
    WHERE session_id = $sid AND timestamp >= $t0 AND timestamp < $t1 + $wns AND list_contains($sync_ops, op)
      AND tid IN (SELECT DISTINCT tid FROM c)
)
SELECT c.pid, c.timestamp, c.comm, c.op, s.s1 FROM c ASOF LEFT JOIN s ON c.tid = s.tid AND s.s0 >= c.timestamp
ORDER BY c.pid, c.timestamp
"""

# The processes that made a collective call in the range: ing_cuda (windows.build) counts every
# CUDA call of the range by process and op, as CALLS_SQL finds them; read only without --pid
# (with it, ing_cuda holds the chosen processes alone, CALLS_SQL every one).
RANKED_PIDS_SQL = "SELECT count(DISTINCT pid) FROM ing_cuda WHERE list_contains($ops, op)"

RANKS_SQL = """
SELECT pid, source, comm, comm_id, rank, job FROM ranks WHERE session_id = $sid ORDER BY seen_ns
"""


@dataclass
class Job:
    key: str  # the comm_id, else the job id, that names it
    ranks: dict[int, int | None]  # pid -> rank (None: unknown)
    op: str = "ncclAllReduce"  # its most frequent collective
    # entries[k][pid]: when the rank entered collective k (ns), for the collectives every rank was seen in
    entries: list[dict[int, int]] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return sorted(self.ranks, key=lambda p: (self.ranks[p] is None, self.ranks[p] or 0, p))

    def rank_label(self, pid: int) -> str:
        r = self.ranks.get(pid)
        return f"rank {r}" if r is not None else "rank ?"


class _Union:
    def __init__(self) -> None:
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def join(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _rank_rows(con: duckdb.DuckDBPyConnection, sid: int) -> list[tuple]:
    try:
        return con.execute(RANKS_SQL, {"sid": sid}).fetchall()
    except duckdb.CatalogException:  # a database from before the ranks table
        return []


def jobs(ctx: Context) -> list[Job]:
    """The NCCL jobs of the range with at least two ranks, and their aligned collective entries."""
    cached = ctx.derived.nccl_jobs
    if cached is not None:
        return cached
    con = ctx.con
    if not procs.has_column(con, "events", "comm"):
        # a file from before the NCCL probes (schema 10) opened read-only: no collectives to line up
        ctx.derived.nccl_jobs = []
        return []
    if not ctx.pids and con.execute(RANKED_PIDS_SQL, {"ops": list(COLLECTIVE_OPS)}).fetchall()[0][0] < 2:
        # a job needs two ranks: without them the raw calls need not be read (~10 ms of
        # `explain --since 120s` over a day's store, where no process calls NCCL)
        ctx.derived.nccl_jobs = []
        return []
    calls: dict[int, list[tuple[int, int | None, int | None]]] = {}
    ops: dict[tuple[int, str], int] = {}  # (pid, op) -> calls
    params = {"sid": ctx.session_id, "t0": ctx.start_ns, "t1": ctx.end_ns, "wns": ctx.window_ns,
              "ops": list(COLLECTIVE_OPS), "sync_ops": list(SYNC_OPS)}
    for pid, ts, comm, op, done in con.execute(CALLS_SQL, params).fetchall():
        calls.setdefault(int(pid), []).append((int(ts), None if comm is None else int(comm),
                                               None if done is None else int(done)))
        ops[(int(pid), op)] = ops.get((int(pid), op), 0) + 1
    out: list[Job] = []
    if len(calls) >= 2:
        out = _group(calls, _rank_rows(con, ctx.session_id))
        for job in out:
            mine = {}
            for (pid, op), n in ops.items():
                if pid in job.ranks:
                    mine[op] = mine.get(op, 0) + n
            job.op = max(mine, key=mine.get)
    ctx.derived.nccl_jobs = out
    return out


def _group(calls: dict[int, list[tuple[int, int | None, int | None]]], rows: list[tuple]) -> list[Job]:
    u = _Union()
    comm_key: dict[tuple[int, int], str] = {}  # (pid, comm) -> 'c:<comm_id>'
    comm_rank: dict[tuple[int, int], int | None] = {}
    env_key: dict[int, str] = {}
    env_rank: dict[int, int | None] = {}
    for pid, source, comm, comm_id, rank, job in rows:
        pid = int(pid)
        if source == "nccl" and comm is not None and comm_id:
            comm_key[(pid, int(comm))] = f"c:{comm_id}"
            comm_rank[(pid, int(comm))] = rank
        elif source == "env" and job:
            env_key[pid] = f"j:{job}"
            env_rank[pid] = rank
    # keys of each calling process: the communicators its calls name, and its environment's job
    member: dict[int, str] = {}
    for pid, cs in calls.items():
        keys = sorted({comm_key[(pid, c)] for _, c, _ in cs if c is not None and (pid, c) in comm_key})
        if pid in env_key:
            keys.append(env_key[pid])
        if not keys:
            continue  # nothing ties it to a job: not guessed
        for k in keys[1:]:
            u.join(keys[0], k)
        member[pid] = keys[0]
    groups: dict[str, list[int]] = {}
    for pid, key in member.items():
        groups.setdefault(u.find(key), []).append(pid)
    out = []
    for key, pids in sorted(groups.items()):
        if len(pids) < 2:
            continue
        ranks: dict[int, int | None] = {}
        series: dict[int, list[tuple[int, int | None]]] = {}
        for pid in pids:
            known = [comm_rank[(pid, c)] for _, c, _ in calls[pid] if c is not None and (pid, c) in comm_rank]
            ranks[pid] = known[0] if known and known[0] is not None else env_rank.get(pid)
            # the calls on the job's communicator (or every call when its comm is not known here)
            series[pid] = [(ts, done) for ts, c, done in calls[pid] if c is None or (pid, c) not in comm_key
                           or u.find(comm_key[(pid, c)]) == key]
        job = Job(key=key.split(":", 1)[1], ranks=ranks)
        job.entries = _align(series)
        out.append(job)
    return out


def _align(series: dict[int, list[tuple[int, int | None]]]) -> list[dict[int, int]]:
    """entries[k][pid] for the collectives every rank was seen in (see the module docstring).

    Sequences are lined up by the collectives' completions (the return of the sync after each)
    where they are known: the same for every rank of collective k, a step apart from k + 1.
    Entries are not enough: a rank late by more than half a step enters nearer the others' next one.
    """
    ref = max(series, key=lambda p: (len(series[p]), -p))
    base = series[ref]
    shift = {ref: 0}
    for pid, calls in series.items():
        if pid == ref:
            continue
        best = None
        for o in range(-MAX_SHIFT, MAX_SHIFT + 1):
            pairs = [(base[i], calls[i + o]) for i in range(len(base)) if 0 <= i + o < len(calls)]
            done = [(a[1], b[1]) for a, b in pairs if a[1] is not None and b[1] is not None]
            if len(done) * 2 >= len(pairs) > 0:
                d = statistics.median(abs(a - b) for a, b in done)
            elif pairs:
                d = statistics.median(abs(a[0] - b[0]) for a, b in pairs)
            else:
                continue
            if best is None or d < best[0]:
                best = (d, o)
        if best is None:
            return []
        shift[pid] = best[1]
    out = []
    for i in range(len(base)):
        row = {}
        for pid, calls in series.items():
            j = i + shift[pid]
            if not 0 <= j < len(calls):
                break
            row[pid] = calls[j][0]
        else:
            out.append(row)
    return out


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def mad(values: list[float]) -> float:
    """Median absolute deviation from the median."""
    if not values:
        return 0.0
    m = statistics.median(values)
    return float(statistics.median(abs(v - m) for v in values))
