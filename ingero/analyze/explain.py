"""``explain(con, opts) -> Report``: the one entry point of the rule engine.

Resolves what to look at, builds the window tables in one pass of SQL, runs
every rule and returns plain objects; renderers print them.  Takes any
DuckDB connection (read-only file, in-memory, or one a daemon hands over).
"""

from __future__ import annotations

import dataclasses

import importlib

import duckdb

from ingero.analyze import activity, context, kind, launch_sampling, procs, saves, waits, windows
from ingero.analyze.context import Context, Options
from ingero.analyze.model import Analysed, Chain, Report, SystemContext, Workload
from ingero.analyze.rules import registry

# Counted from the window tables (no further pass over the events).
COUNTS_SQL = """
SELECT (SELECT coalesce(sum(n), 0) FROM ing_cuda)
     + (SELECT coalesce(sum(n), 0) FROM ing_sched)
     + (SELECT coalesce(sum(n), 0) FROM ing_faults)
     + (SELECT coalesce(sum(n), 0) FROM ing_bio) AS events,
       (SELECT coalesce(sum(n), 0) FROM ing_cuda) AS cuda_events
"""

# Traced processes are those that made CUDA calls (failed ones too: a process whose every
# call failed has no loop thread, yet it is the one traced); the others the tracer followed
# (a launcher's helpers, DataLoader workers) are only counted.
TRACED_SQL = "SELECT pid FROM ing_cuda GROUP BY pid ORDER BY sum(n) DESC, pid"
FOLLOWED_SQL = """
SELECT count(DISTINCT pid) FROM (SELECT pid FROM ing_sched UNION ALL SELECT pid FROM ing_faults)
WHERE pid NOT IN (SELECT pid FROM ing_cuda)
"""

# The processes of the window tables: the rules name them (the loop, the threads that took its
# CPU, block-I/O issuers, fault-heavy processes, helpers).
NAMED_PIDS_SQL = """
SELECT pid FROM (SELECT pid FROM ing_loop UNION SELECT pid FROM ing_failed UNION SELECT other_pid FROM ing_preempt
                 UNION SELECT pid FROM ing_pcpu
                 UNION SELECT pid FROM ing_bio UNION SELECT pid FROM ing_faults UNION SELECT pid FROM ing_sched)
WHERE pid IS NOT NULL
"""

SYSTEM_SQL = """
SELECT avg(cpu_pct), avg(mem_pct), avg(load1), max(ncpu), max(swap_used_bytes), avg(iowait_pct)
FROM ing_sys
"""

GPU_SQL = "SELECT avg(util_pct), count(*) FROM ing_gpu"

# A cause seen in less than this share of the affected process' active
# windows is a burst: its chain drops one severity level (HIGH -> MEDIUM ->
# LOW), however strong it is inside the burst.
MIN_COVERAGE_FOR_SEVERITY = 0.25
_DOWNGRADE = {"HIGH": "MEDIUM", "MEDIUM": "LOW", "LOW": "LOW"}

# Wall clock of each CUDA process' loop over its active windows: the
# denominator of every chain's share, so shares compare across rules.
ACTIVE_WALL_SQL = "SELECT pid, sum(wall_ns) FROM ing_win GROUP BY pid"


# A device busy at least this share of the analysed span is not waiting for
# the host: a host-side chain there is real but not what limits the job, so it
# is at most MEDIUM.  A fed training job keeps its GPU 80-95% busy; the real
# GPU-bound V100 trace in shared/traces is 97.4% busy.
DEVICE_BUSY_NOT_HIGH = 0.90


def _hold_to_the_device(chain: Chain, ctx: context.Context, device_side: set[str]) -> None:
    """Device busy is the effect a host-side cause must show before it is HIGH (a rule whose
    cause is device time itself, or whose effect is the device's measured idleness, DEVICE_SIDE,
    is exempt)."""
    if chain.rule_id in device_side:
        return
    busy = [ctx.device_busy[p] for p in chain.pids if p in ctx.device_busy]
    if busy and chain.severity == "HIGH" and min(busy) >= DEVICE_BUSY_NOT_HIGH:
        chain.severity = "MEDIUM"
        chain.numbers["device_busy_share"] = round(min(busy), 4)


def _rank(chain: Chain, active_wall: dict[int, float]) -> None:
    """One accounting for every rule: the time the cause took in its evidence
    windows (impact x their wall clock) over the loop's whole active wall clock
    (a process without CUDA calls, e.g. a CPU-only profiler trace: the evidence's)."""
    ev_wall = sum(w.end_ns - w.start_ns for w in chain.evidence_windows)
    total = sum(active_wall.get(p, 0.0) for p in chain.pids) or ev_wall
    if total > 0 and ev_wall > 0:
        chain.share = round(min(1.0, chain.impact * min(ev_wall, total) / total), 4)
    if chain.windows_total and chain.evidence_windows:
        coverage = min(1.0, len(chain.evidence_windows) / chain.windows_total)
        chain.numbers["coverage"] = round(coverage, 4)
        if coverage < MIN_COVERAGE_FOR_SEVERITY:
            chain.severity = _DOWNGRADE[chain.severity]


def _explainers_first(chains: list[Chain], explains) -> None:
    """A chain that names another process' chain as its own cause (a straggler rank: its CPU
    contention makes every other rank wait, the same time again on each) is listed before that
    chain, which it explains: ``explains`` holds (chain, rule id, pid) from the rules."""
    for parent, rule_id, pid in explains:
        if parent not in chains:
            continue
        i = chains.index(parent)
        for j, c in enumerate(chains[:i]):
            if c.rule_id == rule_id and pid in c.pids:
                chains.insert(j, chains.pop(i))
                break


def explain(con: duckdb.DuckDBPyConnection, opts: Options, *, source: str = "summaries") -> Report:
    """``source``: what the window tables are built from (windows.build): the per-second
    summaries (the default), or the raw events (the reference the tests compare with)."""
    with procs.read_once(con):
        return _explain(con, opts, source)


def _explain(con: duckdb.DuckDBPyConnection, opts: Options, source: str) -> Report:
    ctx = context.resolve(con, opts, align=True)
    windows.build(ctx, source)
    waits.build(ctx)
    saves.build(ctx)
    ctx.derived.kinds = kind.classify(ctx)
    procs.name_as_of_cuda_calls(con, ctx.params())  # a pyenv shim's pid is named python3, not bash
    # every process the rules may name, in one query (the rules' lookups then find them read)
    procs.lookup(con, [int(r[0]) for r in con.execute(NAMED_PIDS_SQL).fetchall()])
    device, steps = activity.resolve(ctx)
    if steps is not None and steps.pid in ctx.derived.kinds:  # a server's steps are its requests
        steps = dataclasses.replace(steps, unit="request")
    chains: list[Chain] = []
    notices: list[Chain] = []
    rules = registry()
    for rule in rules:
        # a notice (failed calls) is about the calls themselves, not the loop's time: never
        # ranked by a share of wall clock, listed before every timing chain
        (notices if getattr(rule, "NOTICE", False) else chains).extend(rule.evaluate(con, ctx))
    device_side = {rule.ID for rule in rules if getattr(rule, "DEVICE_SIDE", False)}
    active_wall = {int(p): float(w) for p, w in con.execute(ACTIVE_WALL_SQL).fetchall()}
    for chain in chains:
        _rank(chain, active_wall)
        _hold_to_the_device(chain, ctx, device_side)
    chains.sort(key=Chain.sort_key)
    _explainers_first(chains, ctx.derived.explains)
    chains[:0] = notices
    report = Report(analysed=_analysed(ctx), system=_system(ctx), chains=chains, device=device, steps=steps,
                    workloads=_workloads(ctx))
    disagree = activity.nvml_disagreement(ctx, device) if device is not None else None
    if disagree:
        report.notes.append(disagree)
    if ctx.imported_from:
        report.notes.append(
            "imported from a profiler trace: it holds no scheduler, page-fault or block-I/O events, so "
            "cpu-contention, launch-bound, io-stall and memory-pressure cannot be judged here (trace the "
            "job with `ingero trace` for them)"
        )
    if ctx.derived.calls_from_ns is not None:
        minutes = (ctx.end_ns - ctx.derived.calls_from_ns) / 60e9
        report.notes.append(
            f"device activity and steps were inferred from the last {minutes:.0f} min of the range "
            "(they read the raw calls); the chains cover all of it"
        )
    if not report.analysed.cuda_events:
        report.notes.append("no CUDA calls in this range: only host events were analysed")
    if ctx.drops_kernel or ctx.drops_user:
        report.notes.append(
            f"{ctx.drops_kernel + ctx.drops_user:,} events were dropped while tracing: counts are lower bounds"
        )
    for sampled in (launch_sampling.note(ctx), launch_sampling.counted_note(ctx)):
        if sampled:
            report.notes.append(sampled)
    if opts.stack:
        report.stack = _stack(ctx, report)
    return report


def _workloads(ctx: Context) -> list[Workload]:
    names = procs.lookup(ctx.con, list(ctx.derived.kinds))
    return [Workload(k.pid, k.kind, names[k.pid].label if k.pid in names else f"PID {k.pid}", k.evidence,
                     k.requests_per_s) for k in ctx.derived.kinds.values()]


def _analysed(ctx: Context) -> Analysed:
    events, cuda = ctx.con.execute(COUNTS_SQL).fetchone()
    pids = [int(r[0]) for r in ctx.con.execute(TRACED_SQL).fetchall()]
    names = procs.lookup(ctx.con, pids)
    return Analysed(
        session_id=ctx.session_id,
        start_ns=ctx.start_ns,
        end_ns=ctx.end_ns,
        window_s=ctx.window_s,
        windows=ctx.n_windows,
        events=int(events or 0),
        cuda_events=int(cuda or 0),
        processes=[names[p].label for p in pids if p in names],
        followed=int(ctx.con.execute(FOLLOWED_SQL).fetchone()[0]),
        drops_kernel=ctx.drops_kernel,
        drops_user=ctx.drops_user,
        stale_calls=ctx.stale_calls,
        probe_misses=ctx.probe_misses,
    )


def _system(ctx: Context) -> SystemContext:
    cpu, mem, load, ncpu, swap, iowait = ctx.con.execute(SYSTEM_SQL).fetchone()
    util, n = ctx.con.execute(GPU_SQL).fetchone()
    return SystemContext(
        cpu_pct=cpu,
        mem_pct=mem,
        load1=load,
        ncpu=int(ncpu) if ncpu else ctx.ncpu,
        swap_used_bytes=int(swap) if swap is not None else None,
        iowait_pct=iowait,
        gpu_util_pct=util if n else None,
    )


def _stack(ctx: Context, report: Report) -> dict:
    """explain --stack: the callers module (when installed) names source lines."""
    try:
        callers = importlib.import_module("ingero.analyze.callers")
    except ModuleNotFoundError:
        return {"note": "stack analysis is not available in this build"}
    return {
        "top_callers": callers.top_callers(ctx.con, ctx.selection),
        "preempted_lines": callers.most_preempted_lines(ctx.con, ctx.selection),
        "sampled_lines": _sampled_lines(ctx),
    }


def _sampled_lines(ctx: Context) -> list[dict]:
    """The main loop thread's CPU samples outside CUDA calls, by line (the --stack sampler)."""
    from ingero.analyze import cpu_samples

    row = ctx.con.execute("SELECT pid, tid FROM ing_loop ORDER BY cuda_n DESC, pid LIMIT 1").fetchone()
    if row is None:
        return []
    ws = [int(r[0]) for r in ctx.con.execute("SELECT w FROM ing_win WHERE pid = $pid", {"pid": row[0]}).fetchall()]
    found = cpu_samples.top_lines(ctx, int(row[1]), ws, limit=10)
    return [x.to_dict() | {"text": x.text()} for x in found.lines] if found else []
