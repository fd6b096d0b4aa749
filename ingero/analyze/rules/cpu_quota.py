"""cpu-quota: the loop waits for a CPU because its cgroup's CPU quota is spent.

Physics: a cgroup limited to Q of CPU time per period P (Kubernetes
``resources.limits.cpu`` = Q/P CPUs, ``docker --cpus``, systemd CPUQuota)
runs at most Q per period; a job that needs more is throttled until the
next period, whoever else the CPU runs meanwhile or if it idles.  The
cause metric is the loop thread's CPU wait that the quota explains
(ing_win.quota_wait_ns, analyze/quota.py: preempted with the CPU left
idle, and the rest of its CPU wait up to the cgroup's throttled time, in
windows whose cgroup cpu.stat counted throttling).  cpu-contention counts
only the CPU wait beyond it.

A rule of its own, not a root inside cpu-contention: the evidence is
another table (the cgroup's counters), the fix another kind (the limit,
computed from the job's measured demand, never taskset or renice of
processes that merely ran while the loop was throttled), and a job can
have both (a limit and a neighbour on its core): each chain then says its
own part of the wait.
"""

from __future__ import annotations

import math
import shlex
import unicodedata
from dataclasses import dataclass

from ingero.analyze import baseline, procs, units
from ingero.analyze.context import Context
from ingero.analyze.model import Chain
from ingero.events.ops import SYNC_OPS

ID = "cpu-quota"
TITLE = "CPU quota throttling → CUDA calls delayed"


@dataclass(frozen=True)
class Thresholds:
    # The quota is a root of the same lost time as cpu-contention's (the loop
    # runnable, off CPU): the same bars.  A window is evidence at 10% of its
    # wall clock waiting for the quota; HIGH at a quarter (or a quarter of the
    # throughput lost against clean windows).
    min_wait_share: float = 0.10
    high_wait_share: float = 0.25
    high_drop: float = 0.25
    # With clean windows, the call rate must fall at least this much where the
    # quota throttles (a healthy run's rate varies by ~5-10% between windows).
    min_drop: float = 0.15
    # A sync op is named in the effect when its p99 grows at least this much.
    min_p99_ratio: float = 2.0
    # The suggested limit: the measured demand (CPU used + throttled, over the
    # time read) plus this share.  A limit at the mean demand still throttles
    # the bursts inside a period (a step's host work comes in one piece).
    headroom: float = 0.20
    # ... rounded up to this many CPUs (Kubernetes takes millicores; 100m
    # steps read as what a person would set).
    limit_step_cpus: float = 0.1
    # The CPU wait beyond the quota's is named (cpu-contention's part) when it
    # is at least this share of the loop's wall clock in the evidence windows.
    min_other_wait_share: float = 0.05
    # A window is clean (a baseline) only if the quota barely touched it: a throttled window
    # is not "the run without the cause" however little it waited (baseline.split's quietest
    # quarter would take a run throttled throughout at 4-19% a window as its own baseline,
    # and find no drop: a 0.3-CPU limit binding all run long went unnamed).
    max_clean_share: float = 0.02
    # Without clean windows the cgroup's own counters are the comparison: throttled in at
    # least this share of its periods, the limit is binding, and the chain is MEDIUM (HIGH
    # at high_wait_share) rather than LOW.
    binding_periods_share: float = 0.5
    # Waits for the device on CPU (spinning syncs) are named when they burned at
    # least this share of the CPU the cgroup used: less would buy the loop no
    # meaningful part of its quota back.
    min_spin_share: float = 0.10


T = Thresholds()

# The cgroup whose limit throttled the process (ing_cgroup.binding), and its own cgroup.
CGROUP_SQL = """
SELECT cgroup, own, version, mount, container_id, pod_uid, quota_us, period_us, periods_n, throttled_n,
       throttled_ns, usage_ns, usage_known, covered_ns, binding
FROM ing_cgroup WHERE pid = $pid AND (binding OR own)
ORDER BY binding DESC
"""

# CPU used by the traced processes limited by the same cgroup, over the span its readings
# cover, where the cgroup's own usage counter is not readable (v1 without cpuacct beside cpu).
USAGE_SQL = """
SELECT coalesce(sum(oncpu_ns), 0)::DOUBLE FROM ing_pcpu
WHERE pid IN (SELECT pid FROM ing_cgroup WHERE binding AND cgroup = $cgroup)
"""

# The loop thread's CPU time inside calls that wait for the device (syncs, and copies beyond
# their transfer) while on CPU: a spinning or yielding wait (CUDA's default) burns quota.
SPIN_SQL = """
SELECT coalesce(sum(sync_ns), 0)::DOUBLE,
       (SELECT coalesce(sum(s.off_ns), 0)::DOUBLE FROM ing_sched s JOIN ing_loop l ON s.pid = l.pid AND s.tid = l.tid
        WHERE s.pid = $pid AND s.inside IN ('sync', 'copy'))
FROM ing_win WHERE pid = $pid
"""

# Longer cgroup paths are cut in chain text (a Kubernetes pod's container under the systemd
# driver is ~190 characters); never in a fix's command.
MAX_PATH_CHARS = 240


def printable(text: str, limit: int | None = MAX_PATH_CHARS) -> str:
    """A cgroup path (any bytes a name may hold) as terminal-safe text: control and other
    unprintable characters as '?', a path longer than ``limit`` cut in its middle."""
    safe = "".join(ch if unicodedata.category(ch)[0] != "C" else "?" for ch in text)
    if limit is not None and len(safe) > limit:
        half = (limit - 1) // 2
        safe = safe[:half] + "…" + safe[-half:]
    return safe


def _share(r: baseline.Row) -> float:
    return r["quota_wait_ns"] / r["wall_ns"] if r["wall_ns"] else 0.0


def evaluate(con, ctx: Context) -> list[Chain]:
    chains = []
    loops = baseline.loop_threads(ctx)
    for pid, rows in baseline.windows_by_pid(ctx).items():
        if not any(r.get("quota_wait_ns") for r in rows):
            continue
        chain = _evaluate_pid(con, ctx, pid, loops.get(pid, pid), rows)
        if chain:
            chains.append(chain)
    return chains


@dataclass
class Limit:
    """The binding cgroup's limit and what its counters said over the range."""

    cgroup: str
    own: bool
    version: int
    mount: str
    container_id: str | None
    pod_uid: str | None
    quota_us: int | None
    period_us: int | None
    periods_n: int
    throttled_n: int
    throttled_ns: float
    usage_ns: float | None
    covered_ns: float

    @property
    def cpus(self) -> float | None:
        return self.quota_us / self.period_us if self.quota_us and self.period_us else None


def _limits(con, pid: int) -> tuple[Limit | None, str | None]:
    """(the binding limit, the process's own cgroup path when the limit is an ancestor's)."""
    rows = con.execute(CGROUP_SQL, {"pid": pid}).fetchall()
    bind = next((r for r in rows if r[14]), None)
    if bind is None:
        return None, None
    own_path = next((r[0] for r in rows if r[1] and not r[14]), None)
    (cgroup, own, version, mount, container, pod, quota, period, periods, throttled, thr_ns, usage, usage_known,
     covered, _) = bind
    limit = Limit(cgroup, bool(own), int(version), mount or "", container, pod,
                  int(quota) if quota is not None else None, int(period) if period is not None else None,
                  int(periods), int(throttled), float(thr_ns), float(usage) if usage_known else None,
                  float(covered or 0.0))
    if limit.usage_ns is None:
        limit.usage_ns = float(con.execute(USAGE_SQL, {"cgroup": cgroup}).fetchone()[0])
    return limit, own_path


def _evaluate_pid(con, ctx: Context, pid: int, tid: int, rows) -> Chain | None:
    s = baseline.split(rows, _share, T.min_wait_share)
    if not s.evidence:
        return None
    s = baseline.Split(s.evidence, [r for r in s.clean if _share(r) <= T.max_clean_share], s.all)
    limit, own_path = _limits(con, pid)
    if limit is None or limit.cpus is None:
        return None
    wait_share = baseline.mean_share(s.evidence, "quota_wait_ns")
    base_rate, ev_rate, drop = baseline.throughput(s)
    corr = baseline.evidence_correlation(s, _share, baseline.ops_rate, expect=-1)
    if s.has_baseline:
        raw_corr = baseline.correlation([_share(r) for r in rows], [baseline.ops_rate(r) for r in rows])
        if drop < T.min_drop or (raw_corr is not None and raw_corr > 0):
            return None
        severity = "HIGH" if (wait_share >= T.high_wait_share or drop >= T.high_drop) else "MEDIUM"
    elif wait_share >= T.high_wait_share:
        severity = "HIGH"
    elif limit.periods_n and limit.throttled_n >= T.binding_periods_share * limit.periods_n:
        severity = "MEDIUM"  # throttled throughout: cpu.stat says the limit binds
    else:
        severity = "LOW"

    ws = [int(r["w"]) for r in s.evidence]
    ev_wall = sum(r["wall_ns"] for r in s.evidence)
    quota_ns = sum(r["quota_wait_ns"] for r in s.evidence)
    idle_ns = _idle_wait(con, pid, ws)
    other_ns = sum(max(0.0, r["cpu_wait_ns"] - r["quota_wait_ns"]) for r in s.evidence)
    me = procs.lookup(con, [pid])[pid]
    where = printable(limit.cgroup)
    ids = []
    if limit.pod_uid:
        ids.append(f"pod {limit.pod_uid}")
    if limit.container_id:
        ids.append(f"container {limit.container_id[:12]}")
    root = [
        f"cgroup CPU limit {_cpus(limit.cpus)} CPU ({_ms(limit.quota_us)} per {_ms(limit.period_us)}, "
        f"{where}{', ' + ', '.join(ids) if ids else ''}, cgroup v{limit.version}): "
        f"throttled {units.count(limit.throttled_n)} "
        f"times in {units.count(limit.periods_n)} periods, {units.ns(limit.throttled_ns)} throttled in "
        f"{units.ns(limit.covered_ns)} (cpu.stat)",
        f"{me.label} waited for its quota {units.ns(quota_ns)} of {units.ns(ev_wall)} "
        f"({units.pct(wait_share)} of the loop's time in {len(ws)} of {len(rows)} windows): switched out while "
        f"runnable with the CPU left idle ({units.ns(idle_ns)}) or running processes of no higher claim "
        f"({units.ns(max(0.0, quota_ns - idle_ns))})",
    ]
    effect = []
    for op, clean_p99, ev_p99 in baseline.op_p99(ctx, pid, tid, SYNC_OPS, s)[:2]:
        if s.has_baseline and clean_p99 > 0 and ev_p99 >= T.min_p99_ratio * clean_p99:
            effect.append(f"{op} p99 {units.ratio(ev_p99, clean_p99)} baseline "
                          f"({units.ns(clean_p99)} → {units.ns(ev_p99)})")
    if s.has_baseline:
        effect.append(f"CUDA ops/s down {units.pct(drop)} from clean windows "
                      f"({units.count(base_rate)} → {units.count(ev_rate)})")
    else:
        oncpu = sum(max(0.0, r["wall_ns"] - r["off_ns"]) for r in s.all)
        waited = sum(r["quota_wait_ns"] for r in s.all)
        wanted = oncpu + sum(r["cpu_wait_ns"] for r in s.all)  # runnable: on CPU or waiting for one
        effect.append(
            f"no clean window to compare with (throttled in {len(s.evidence)} of {len(s.all)} active windows): "
            f"of the {units.ns(wanted)} the loop was runnable it ran {units.ns(oncpu)} "
            f"and waited {units.ns(waited)} for its quota ({units.pct(waited / wanted if wanted else 0.0)})"
        )
    contributing = []
    if not limit.own and own_path is not None:
        contributing.append(f"the limit is {where}'s, above the process's own cgroup {printable(own_path)}")
    if other_ns >= T.min_other_wait_share * ev_wall:
        contributing.append(f"waited another {units.ns(other_ns)} for a CPU other processes held "
                            "(cpu-contention's part)")
    spin = _spin_line(con, pid, limit.usage_ns or 0.0)
    if spin:
        contributing.append(spin)
    demand, suggested = _demand(limit)
    if demand is not None:
        contributing.append(
            f"demand up to {_cpus(demand)} CPU: the cgroup used {units.ns(limit.usage_ns)} of CPU and was throttled "
            f"{units.ns(limit.throttled_ns)} in {units.ns(limit.covered_ns)}"
        )
    return baseline.chain(
        ID, TITLE, ctx, pid, s,
        severity=severity,
        root=root,
        effect=effect,
        contributing=contributing,
        fix=_fixes(limit, demand, suggested),
        corr=corr,
        corr_note="CUDA ops/s fall as the wait for the quota rises",
        impact=wait_share,
        numbers={
            "quota_cpus": round(limit.cpus, 4),
            "quota_us": limit.quota_us,
            "period_us": limit.period_us,
            "throttled_n": limit.throttled_n,
            "periods_n": limit.periods_n,
            "throttled_ns": limit.throttled_ns,
            "quota_wait_ns": quota_ns,
            "quota_wait_share": round(wait_share, 4),
            "idle_wait_ns": idle_ns,
            "other_cpu_wait_ns": other_ns,
            **({"demand_cpus": round(demand, 3), "suggested_cpus": suggested} if demand is not None else {}),
            "ops_per_s_clean": round(base_rate, 1),
            "ops_per_s_evidence": round(ev_rate, 1),
            "throughput_drop": round(drop, 4),
        },
    )


def _idle_wait(con, pid: int, ws: list[int]) -> float:
    row = con.execute("SELECT coalesce(sum(idle_wait_ns), 0) FROM ing_quota WHERE pid = $pid AND list_contains($ws, w)",
                      {"pid": pid, "ws": ws}).fetchone()
    return float(row[0])


def _spin_line(con, pid: int, used_ns: float) -> str | None:
    """The loop's waits for the device that ran on its CPU (spinning, CUDA's default) burned quota."""
    waiting, off = con.execute(SPIN_SQL, {"pid": pid}).fetchone()
    spun = max(0.0, float(waiting) - float(off))
    if spun <= 0 or spun < T.min_spin_share * used_ns:
        return None
    return (f"{units.ns(spun)} of its quota went to waiting for the device on CPU (syncs that spin or yield, "
            "CUDA's default): cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) sleeps instead")


def _demand(limit: Limit) -> tuple[float | None, float | None]:
    """(CPUs the cgroup wanted: used + throttled over the time read, the limit to set).

    An upper bound: a throttled run queue waits out the rest of the period, and a job that
    would have slept part of it (a sync that blocks) is counted as wanting the CPU all along
    (docs/rules.md, cpu-quota): a limit set there does not throttle."""
    if limit.covered_ns <= 0 or limit.usage_ns is None:
        return None, None
    demand = (limit.usage_ns + limit.throttled_ns) / limit.covered_ns
    step = T.limit_step_cpus
    want = math.ceil(round(demand * (1 + T.headroom) / step, 6)) * step
    current = limit.cpus or 0.0
    return demand, round(max(want, current + step), 3)


def _cpus(value: float) -> str:
    return f"{value:.2f}".rstrip("0").rstrip(".") if value < 10 else f"{value:.1f}"


def _ms(us: int | None) -> str:
    if us is None:
        return "n/a"
    return f"{us // 1000} ms" if us % 1000 == 0 else units.ns(us * 1000)


def _fixes(limit: Limit, demand: float | None, suggested: float | None) -> list[str]:
    if suggested is None or not limit.period_us:
        return [f"raise the CPU limit of {printable(limit.cgroup, None)} above {_cpus(limit.cpus or 0)} CPU"]
    why = f"(the measured demand {_cpus(demand or 0)} CPU + {T.headroom:.0%})"
    quota_us = round(suggested * limit.period_us)
    base = printable(limit.mount.rstrip("/") + limit.cgroup, None)
    fix = []
    if limit.pod_uid:
        # the kubelet rewrites the pod's and container's cgroups from the pod spec
        fix.append(f'resources.limits.cpu: "{round(suggested * 1000)}m"   in the container\'s spec (pod '
                   f"{limit.pod_uid}) {why}")
    elif limit.container_id and "docker" in limit.cgroup:
        fix.append(f"docker update --cpus {_cpus(suggested)} {limit.container_id[:12]}   {why}")
    elif limit.cgroup.rstrip("/").endswith((".service", ".scope", ".slice")) and not limit.container_id:
        unit = printable(limit.cgroup.rstrip("/").rsplit("/", 1)[-1], None)
        fix.append(f"systemctl set-property {shlex.quote(unit)} CPUQuota={round(suggested * 100)}%   {why}")
    if limit.version == 2:
        fix.append(f"echo '{quota_us} {limit.period_us}' > {shlex.quote(base + '/cpu.max')}   "
                   f"({_cpus(suggested)} CPU: {why[1:-1]}; 'max' removes the limit)")
    else:
        fix.append(f"echo {quota_us} > {shlex.quote(base + '/cpu.cfs_quota_us')}   "
                   f"({_cpus(suggested)} CPU: {why[1:-1]}; -1 removes the limit)")
    return fix
