"""failed-calls: CUDA calls that returned an error, by op and by the error's name.

A call that fails does no GPU work: NVIDIA's runtime without a driver returns
cudaErrorInsufficientDriver from every call in about a microsecond, so a loop of them looks
like a host launching tiny kernels flat out.  The window tables keep failed calls apart
(windows.SPLIT_FAILED_SQL: category 'failed', out of every launch, sync and copy the timing
rules read), and this rule says what they were: N of M calls failed, per op and per error
name (analyze/return_codes.py), with the fix the error asks for.  A notice (``NOTICE``):
explain lists it before every timing chain and does not rank it by a share of wall clock
(it is counted in calls).  When every call failed there is no loop thread and so no timing
chain at all.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ingero.analyze import procs, return_codes, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain, Window

ID = "failed-calls"
TITLE = "CUDA calls failed: no GPU work behind them"
NOTICE = True


@dataclass(frozen=True)
class Thresholds:
    # Any failed call is reported: an error return is never part of a healthy loop's work,
    # and the user must know which timings it leaves out.
    min_failed_calls: int = 1
    # At least half of a process' calls failing: most of its GPU work never happened (the
    # driver missing, no device, a kernel fault that every later call returns): HIGH.
    high_failed_share: float = 0.5
    # At least 1% failing: a steady failure inside the loop (a stale stream handle, memory
    # exhausted now and then): MEDIUM.  Below it (a few calls at start-up or teardown): LOW.
    medium_failed_share: float = 0.01
    # Lines of errors, ops and fixes printed (the JSON's numbers hold every one).
    max_lines: int = 6


T = Thresholds()

# Calls made while the process exits (the runtime unloading): harmless at teardown, never
# above LOW on their own.
TEARDOWN = frozenset({"cudaErrorCudartUnloading", "CUDA_ERROR_DEINITIALIZED"})

FAILED_SQL = """
SELECT pid, w, op, ret, sum(n)::BIGINT AS n, min(first_ns) AS first_ns, max(last_ns) AS last_ns
FROM ing_failed GROUP BY ALL
"""
# Every call of each process and op, failed or not (ing_cuda holds both).
CALLS_SQL = "SELECT pid, op, sum(n)::BIGINT FROM ing_cuda GROUP BY ALL"
# Windows in which the failing processes made a CUDA call (the evidence's denominator).
ACTIVE_SQL = "SELECT count(DISTINCT w) FROM ing_cuda WHERE list_contains($pids, pid) AND w >= 0 AND w < $nw"


def _severity(failed: int, calls: int, names: set[str]) -> str:
    if names <= TEARDOWN:
        return "LOW"
    share = failed / calls if calls else 1.0
    return "HIGH" if share >= T.high_failed_share else "MEDIUM" if share >= T.medium_failed_share else "LOW"


def _joined(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def evaluate(con, ctx: Context) -> list[Chain]:
    rows = con.execute(FAILED_SQL).fetchall()
    if sum(int(r[4]) for r in rows) < T.min_failed_calls:
        return []
    calls_by: dict[int, dict[str, int]] = defaultdict(dict)
    for pid, op, n in con.execute(CALLS_SQL).fetchall():
        calls_by[int(pid)][str(op)] = int(n)
    failed_by_pid: dict[int, int] = defaultdict(int)
    by_op: dict[str, int] = defaultdict(int)
    by_name: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # name -> op -> n
    codes: dict[str, int] = {}
    names_by_pid: dict[int, set[str]] = defaultdict(set)
    windows: set[int] = set()
    first = min(int(r[5]) for r in rows)
    last = max(int(r[6]) for r in rows)
    for pid, w, op, ret, n, _, _ in rows:
        name = return_codes.name(op, ret)
        failed_by_pid[int(pid)] += int(n)
        by_op[op] += int(n)
        by_name[name][op] += int(n)
        codes[name] = int(ret)
        names_by_pid[int(pid)].add(name)
        if 0 <= int(w) < ctx.n_windows:
            windows.add(int(w))
    pids = sorted(failed_by_pid, key=lambda p: (-failed_by_pid[p], p))
    failed = sum(failed_by_pid.values())
    calls = sum(sum(calls_by[p].values()) for p in pids)
    every = all(failed_by_pid[p] >= sum(calls_by[p].values()) for p in pids)
    names = procs.lookup(con, pids)
    ordered = sorted(by_name, key=lambda k: (-sum(by_name[k].values()), k))
    root = [f"{names[p].label if p in names else f'PID {p}'}: {failed_by_pid[p]:,} of "
            f"{sum(calls_by[p].values()):,} CUDA calls returned an error "
            f"({units.pct(failed_by_pid[p] / max(1, sum(calls_by[p].values())))})" for p in pids[:T.max_lines]]
    root += [f"{name} ({codes[name]}): {sum(by_name[name].values()):,} calls ({_joined(by_name[name])})"
             for name in ordered[:T.max_lines]]
    op_calls: dict[str, int] = defaultdict(int)
    for p in pids:
        for op, n in calls_by[p].items():
            op_calls[op] += n
    effect = [f"{op}: {n:,} of {max(n, op_calls.get(op, n)):,} failed"
              for op, n in sorted(by_op.items(), key=lambda kv: (-kv[1], kv[0]))[:T.max_lines]]
    effect.append("every call failed: no kernel ran and nothing was copied, so no timing chain is built on them"
                  if every else f"the timing chains read only the {calls - failed:,} calls that succeeded")
    span = ctx.end_ns - ctx.start_ns
    if span > 0:
        effect.append(f"failures from {(first - ctx.start_ns) / 1e9:.1f} s to {(last - ctx.start_ns) / 1e9:.1f} s "
                      f"into the {span / 1e9:.0f} s analysed")
    fixes: list[str] = []
    seen: set[str] = set()
    for name in ordered:  # one line per fix, most frequent error first
        text = return_codes.fix(name)
        if text not in seen:
            seen.add(text)
            fixes.append(f"{name}: {text}" if len(ordered) > 1 else text)
    severity = max((_severity(failed_by_pid[p], sum(calls_by[p].values()), names_by_pid[p]) for p in pids),
                   key=lambda s: {"HIGH": 2, "MEDIUM": 1}.get(s, 0))
    active = int(con.execute(ACTIVE_SQL, {"pids": pids, "nw": ctx.n_windows}).fetchone()[0])
    return [Chain(
        rule_id=ID,
        severity=severity,
        title=TITLE,
        headline=f"{failed:,} of {calls:,} CUDA calls failed",
        root=root,
        effect=effect,
        fix=fixes[:T.max_lines],
        pids=pids,
        evidence_windows=[Window(*ctx.window_bounds(w)) for w in sorted(windows)],
        windows_total=active,
        numbers={"failed_calls": failed, "calls": calls, "failed_share": round(failed / calls, 4) if calls else 1.0,
                 "every_call_failed": every,
                 "errors": {name: sum(by_name[name].values()) for name in ordered},  # type: ignore[dict-item]
                 "failed_by_op": dict(sorted(by_op.items())),  # type: ignore[dict-item]
                 "first_failed_ns": first, "last_failed_ns": last},
    )]
