"""fleet explain: cross-node causal chains over the dataset, as the same Chain objects explain returns.

Three findings, each from the run itself (no fixed step time, no peer list):

fleet-straggler   the slowest node, when its step time lies more than z_min
                  robust deviations above its peers' median (modified
                  z-score on the median absolute deviation of the other
                  nodes; Iglewicz & Hoaglin's 3.5), with
                  its own local cause (its segments' strongest chain) and what
                  a synchronous collective per step costs the others: each
                  waits (straggler step - own step) per step.
fleet-shared      one local cause (rule) on at least half of the nodes (two or
                  more): the cause is what they share (storage, code,
                  configuration), not one host.
fleet-busy-host   processes outside the traced job using at least half a
                  core on average on a node; MEDIUM when that node's loop also
                  waited for a CPU at least 25% of its wall clock.

Clocks: every node's facts carry its time-sync state and the kernel's error
bound.  A finding compares per-node durations (each node's own clock) and
aligns nodes only to its range; a skew bound beyond one window, or unknown,
is stated in the finding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb

from ingero.analyze.model import Analysed, Chain, Culprit, Report, SystemContext, Window
from ingero.fleet.dataset import Catalog

NS = 1_000_000_000


@dataclass(frozen=True)
class Thresholds:
    # Modified z-score above which a node is an outlier (Iglewicz & Hoaglin 1993: 3.5).
    z_min: float = 3.5
    # 1.4826 x MAD estimates the standard deviation of normal data.
    mad_scale: float = 1.4826
    # Floor of the deviation scale as a share of the median: three healthy nodes can agree
    # within 0.1 ms, which would make any jitter an outlier; ranks of one job differ by a
    # few percent when healthy (the local straggler rule's same observation).
    rel_floor: float = 0.05
    # ... and the straggler must be at least this much slower than the median to matter.
    min_slowdown: float = 1.15
    high_slowdown: float = 1.5
    min_nodes: int = 3  # a MAD of two values is half their difference: no outlier can stand out
    # A local chain counts for a node when its mean share over the node's segments reaches this.
    min_local_share: float = 0.10
    # Processes outside the job using this many cores on average make a busy host ...
    busy_cores: float = 0.5
    # ... that matters (MEDIUM) when the node's loop waited for a CPU this share of its wall clock.
    busy_cpu_wait_share: float = 0.25


T = Thresholds()

NODES_SQL = """
WITH s AS (
    SELECT node, session_id, min(segment_start_ns) AS t0, max(segment_end_ns) AS t1, count(*) AS segments,
           sum(events) AS events, max(drops_kernel) AS dk, max(drops_user) AS du,
           sum(steps) AS steps, sum(step_median_ms * steps) AS step_ms_x, sum(steps) FILTER (step_median_ms IS NOT NULL) AS timed,
           sum(others_cpu_s) AS others_cpu_s, max(ncpu) AS ncpu, bool_and(clock_synced) AS synced,
           max(clock_max_error_us) AS max_error_us, list(others_top) AS others_top, max(hostname) AS hostname,
           max(gpus) AS gpus
    FROM nodes WHERE segment_end_ns > $t0 AND segment_start_ns < $t1 GROUP BY ALL
)
SELECT node, min(t0), max(t1), sum(segments), sum(events), sum(dk), sum(du), sum(steps),
       sum(step_ms_x) / nullif(sum(timed), 0), sum(others_cpu_s), max(ncpu), bool_and(synced),
       max(max_error_us), flatten(list(others_top)), max(hostname), max(gpus), sum(timed)
FROM s GROUP BY node ORDER BY node
"""
# the loop's windows, summed per segment into the nodes rows
LOOP_SQL = """
SELECT node, sum(loop_wall_ns), sum(loop_cpu_wait_ns), sum(loop_ops), sum(loop_launches), sum(loop_windows)
FROM nodes WHERE segment_end_ns > $t0 AND segment_start_ns < $t1 GROUP BY node
"""
CHAINS_SQL = """
SELECT node, rule_id, severity, title, share, root, effect, fix, culprits, evidence_windows, segment_start_ns
FROM chains WHERE segment_end_ns > $t0 AND segment_start_ns < $t1
"""


@dataclass
class Node:
    name: str
    start_ns: int
    end_ns: int
    segments: int
    events: int
    drops_kernel: int
    drops_user: int
    steps: int
    step_ms: float | None
    others_cpu_s: float
    ncpu: int
    synced: bool
    max_error_us: int | None
    others_top: list[dict]
    hostname: str
    gpus: int
    wall_ns: float = 0.0
    cpu_wait_ns: float = 0.0
    ops: float = 0.0
    launches: float = 0.0
    windows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.name, "hostname": self.hostname, "segments": self.segments, "events": self.events,
                "steps": self.steps, "step_ms": None if self.step_ms is None else round(self.step_ms, 3),
                "cpu_wait_share": round(self.cpu_wait_ns / self.wall_ns, 4) if self.wall_ns else None,
                "others_cores": round(self.others_cpu_s / max(1e-9, (self.end_ns - self.start_ns) / NS), 3),
                "drops_kernel": self.drops_kernel, "drops_user": self.drops_user, "gpus": self.gpus,
                "clock_synced": self.synced, "clock_max_error_us": self.max_error_us,
                "first_ns": self.start_ns, "last_ns": self.end_ns}


@dataclass
class LocalChain:
    rule_id: str
    severity: str
    title: str
    share: float  # mean over the node's segments
    root: list[str]
    fix: list[str]
    culprits: list[Culprit]
    windows: list[Window]


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def load_nodes(con: duckdb.DuckDBPyConnection, t0: int, t1: int) -> dict[str, Node]:
    nodes: dict[str, Node] = {}
    for r in con.execute(NODES_SQL, {"t0": t0, "t1": t1}).fetchall():
        tops = []
        for text in r[13] or []:
            try:
                tops.extend(json.loads(text or "[]"))
            except ValueError:
                pass
        nodes[r[0]] = Node(r[0], int(r[1]), int(r[2]), int(r[3]), int(r[4] or 0), int(r[5] or 0), int(r[6] or 0),
                           int(r[7] or 0), float(r[8]) if r[8] is not None else None, float(r[9] or 0),
                           int(r[10] or 1), bool(r[11]), None if r[12] is None else int(r[12]), tops, r[14] or r[0],
                           int(r[15] or 0))
    for node, wall, cpu_wait, ops, launches, n in con.execute(LOOP_SQL, {"t0": t0, "t1": t1}).fetchall():
        if node in nodes:
            x = nodes[node]
            x.wall_ns, x.cpu_wait_ns, x.ops, x.launches = float(wall or 0), float(cpu_wait or 0), float(ops or 0), float(launches or 0)
            x.windows = int(n or 0)
    return nodes


def local_chains(con: duckdb.DuckDBPyConnection, nodes: dict[str, Node], t0: int, t1: int) -> dict[str, list[LocalChain]]:
    """Each node's chains merged over its segments, by rule, strongest first."""
    by: dict[tuple[str, str], list[tuple]] = {}
    for row in con.execute(CHAINS_SQL, {"t0": t0, "t1": t1}).fetchall():
        by.setdefault((row[0], row[1]), []).append(row)
    out: dict[str, list[LocalChain]] = {}
    for (node, rule), rows in by.items():
        segs = nodes[node].segments if node in nodes else len(rows)
        best = max(rows, key=lambda r: (r[4] or 0))
        sev = min((r[2] for r in rows), key=lambda s: {"HIGH": 0, "MEDIUM": 1}.get(s, 2))
        culprits: dict[tuple[int, str], Culprit] = {}
        for r in rows:
            try:
                for c in json.loads(r[8] or "[]"):
                    culprits.setdefault((int(c["pid"]), c["name"]), Culprit(int(c["pid"]), c["name"], c.get("detail", "")))
            except (ValueError, KeyError, TypeError):
                pass
        wins = [Window(int(w["start_ns"]), int(w["end_ns"])) for r in rows for w in (r[9] or [])]
        out.setdefault(node, []).append(LocalChain(
            rule, sev, best[3], sum(r[4] or 0 for r in rows) / max(1, segs), list(best[5] or []), list(best[7] or []),
            list(culprits.values()), sorted(wins, key=lambda w: w.start_ns)))
    for chains in out.values():
        chains.sort(key=lambda c: ({"HIGH": 0, "MEDIUM": 1}.get(c.severity, 2), -c.share))
    return out


def clock_line(nodes: dict[str, Node], need_ns: int) -> str | None:
    """What the clocks allow, when it is more than ``need_ns`` or unknown (None: nothing to state)."""
    unsynced = sorted(n.name for n in nodes.values() if not n.synced)
    errs = sorted((n.max_error_us or 0 for n in nodes.values()), reverse=True)
    bound_ns = sum(errs[:2]) * 1000
    if unsynced:
        return (f"clocks: {', '.join(unsynced[:5])}{' …' if len(unsynced) > 5 else ''} not synchronised (no "
                f"chrony/timesyncd/ntpd lock): skew between nodes unknown (kernel bound {bound_ns / 1e9:.1f} s); "
                "step times are each node's own durations, so this finding holds; its time alignment across nodes does not")
    if bound_ns > need_ns:
        return f"clocks: skew between nodes up to {bound_ns / 1e6:.1f} ms (adjtimex bounds), more than the {need_ns / 1e6:.0f} ms this finding aligns to"
    return None


def straggler(nodes: dict[str, Node], local: dict[str, list[LocalChain]], t: Thresholds = T) -> tuple[Chain | None, str | None]:
    """The straggler chain (or None) and what the judgement rested on."""
    timed = {n: x.step_ms for n, x in nodes.items() if x.step_ms is not None and x.steps > 0}
    if len(timed) >= t.min_nodes:
        metric, vals, worse, unit = "step time", timed, 1, "ms"
    else:
        rates = {n: x.launches / (x.wall_ns / NS) for n, x in nodes.items() if x.wall_ns > 0 and x.launches > 0}
        if len(rates) < t.min_nodes:
            return None, f"straggler: needs {t.min_nodes} nodes with steps or kernel launches, found {max(len(timed), len(rates))}"
        metric, vals, worse, unit = "kernel launches/s", rates, -1, "/s"
    # the candidate is the worst node; it is judged against its peers' median and MAD (leave one
    # out: with a handful of nodes the outlier would otherwise widen the very spread it is judged by)
    slow = max(vals, key=lambda n: (worse * vals[n], n))
    peers = [v for n, v in vals.items() if n != slow]
    med = median(peers)
    mad = median([abs(v - med) for v in peers])
    scale = max(t.mad_scale * mad, t.rel_floor * med)
    z = {n: worse * (v - med) / scale for n, v in vals.items()}
    ratio = (vals[slow] / med) if worse > 0 else (med / vals[slow] if vals[slow] else float("inf"))
    basis = (f"straggler judged by {metric} across {len(vals)} nodes: {slow} against its peers' median {med:.2f} {unit}, MAD {mad:.2f} {unit}, "
             f"threshold {t.z_min} robust deviations (scale {scale:.2f} {unit}) and {t.min_slowdown}x")
    if z[slow] <= t.z_min or ratio < t.min_slowdown:
        return None, basis
    me = nodes[slow]
    others = {n: x for n, x in nodes.items() if n != slow}
    root = [f"node {slow}: {metric} {vals[slow]:.2f} {unit} vs {med:.2f} {unit} median of its {len(peers)} peers "
            f"({ratio:.2f}x slower, {z[slow]:.1f} robust deviations above; MAD {mad:.2f} {unit})"]
    fix: list[str] = []
    culprits: list[Culprit] = []
    windows: list[Window] = []
    own = [c for c in local.get(slow, []) if c.severity in ("HIGH", "MEDIUM") and c.share >= t.min_local_share]
    own = own or local.get(slow, [])
    if own:
        c = own[0]
        root.append(f"its own cause on {slow}: [{c.severity}] {c.title} ({c.share:.0%} of its wall clock)")
        root.extend("  " + line for line in c.root)
        fix.extend(f"on {slow}: {line}" for line in c.fix)
        culprits = [Culprit(x.pid, x.name, f"on node {slow}" + (f": {x.detail}" if x.detail else "")) for x in c.culprits]
        windows = c.windows
    else:
        root.append(f"no local chain on {slow} explains it: compare `ingero explain` on {slow} with a peer")
    effect: list[str] = []
    lost_total = 0.0
    if metric == "step time":
        per = []
        for n, x in sorted(others.items()):
            if x.step_ms is None or not x.steps:
                continue
            wait_ms = max(0.0, vals[slow] - x.step_ms)
            lost = wait_ms * x.steps / 1000
            lost_total += lost
            per.append((n, wait_ms, x.steps, lost, lost / (x.wall_ns / NS) if x.wall_ns else None))
        if per:
            mean_wait = sum(p[1] for p in per) / len(per)
            effect.append(f"each of the other {len(per)} nodes waits for it at every collective (synchronous data "
                          f"parallel: one all-reduce per step): {mean_wait:.2f} ms per step on average, "
                          f"{lost_total:.1f} s in all over the range")
            for n, wait_ms, steps, lost, share in per[:8]:
                tail = f" (+{share:.0%} on its own {x.wall_ns / NS:.0f} s)" if share is not None else ""
                effect.append(f"  {n}: {wait_ms:.2f} ms x {steps:,} steps = {lost:.1f} s{tail}")
            if len(per) > 8:
                effect.append(f"  … and {len(per) - 8} more nodes")
    else:
        effect.append(f"the job runs at {1 / ratio:.0%} of its peers' speed: every peer waits for it at each collective")
        for n, x in sorted(others.items())[:8]:
            if n not in vals or not x.wall_ns:
                continue
            # at the straggler's pace the same work takes rate_own / rate_slow as long
            lost = x.wall_ns / NS * (vals[n] / vals[slow] - 1) if vals[slow] else 0.0
            lost_total += max(0.0, lost)
            effect.append(f"  {n}: {vals[n]:.0f} vs {vals[slow]:.0f} launches/s: {max(0.0, lost):.1f} s "
                          f"(+{max(0.0, lost) / (x.wall_ns / NS):.0%} on its own {x.wall_ns / NS:.0f} s)")
    contributing = []
    if me.others_cpu_s and (me.end_ns - me.start_ns) > 0:
        cores = me.others_cpu_s / ((me.end_ns - me.start_ns) / NS)
        if cores >= t.busy_cores:
            contributing.append(f"{slow}'s host: processes outside the job used {cores:.2f} cores on average "
                                f"({_top_names(me.others_top)})")
    clock = clock_line(nodes, 1 * NS)
    if clock:
        contributing.append(clock)
    fix.append(f"ingero explain on {slow} (its local store) for the full chain")
    impact = 1 - 1 / ratio if ratio > 0 else 0.0
    chain = Chain(rule_id="fleet-straggler", severity="HIGH" if ratio >= t.high_slowdown else "MEDIUM",
                  title=f"Straggler node: {slow} sets the job's pace", root=root, effect=effect, fix=fix,
                  contributing=contributing, culprits=culprits, evidence_windows=windows[:200],
                  windows_total=me.windows or len(windows), impact=round(impact, 4), share=round(impact, 4),
                  numbers={"value": round(vals[slow], 4), "median": round(med, 4), "mad": round(mad, 4),
                           "z": round(z[slow], 2), "ratio": round(ratio, 4), "others_lost_s": round(lost_total, 3),
                           "nodes": len(vals)})
    chain.numbers["node"] = slow  # type: ignore[assignment]
    return chain, basis


SHARED_HINTS = {
    "input-bound": "every node waits for its input: the shared storage or data service they read from is the "
                   "common cause, not one host (check its throughput; stage the data on local disks)",
    "io-stall": "every node stalls in block I/O: the shared filesystem (checkpoints, datasets) they all use",
    "transfer-bound": "every node copies through pageable memory: the job's code (pin_memory=True), not a host",
    "cpu-contention": "every node's loop waits for a CPU: the same oversubscription everywhere (too many workers "
                      "or threads per core, or a fleet-wide agent)",
    "memory-pressure": "every node is short of memory: the job's footprint or a fleet-wide agent",
    "launch-bound": "every node issues many tiny kernels: the model code (fuse kernels, CUDA graphs)",
    "sync-heavy": "every node syncs every step: the training code (.item() per step)",
    "gpu-idle": "every node's device idles: the input pipeline or the host code they share",
}


def shared(nodes: dict[str, Node], local: dict[str, list[LocalChain]], t: Thresholds = T) -> list[Chain]:
    rules: dict[str, list[tuple[str, LocalChain]]] = {}
    for node, chains in local.items():
        for c in chains:
            if c.severity in ("HIGH", "MEDIUM") and c.share >= t.min_local_share:
                rules.setdefault(c.rule_id, []).append((node, c))
    out = []
    n = len(nodes)
    for rule, hits in sorted(rules.items()):
        if len(hits) < 2 or len(hits) * 2 < n:
            continue
        names = sorted(h[0] for h in hits)
        mean_share = sum(h[1].share for h in hits) / len(hits)
        root = [f"{rule} on {len(hits)} of {n} nodes ({', '.join(names[:10])}{' …' if len(names) > 10 else ''}), "
                f"{mean_share:.0%} of their wall clock on average"]
        root.extend(f"  {node}: {c.root[0]}" for node, c in sorted(hits)[:3] if c.root)
        hint = SHARED_HINTS.get(rule, "the same cause on every node: look at what they share (data, code, configuration)")
        contributing = []
        clock = clock_line({k: nodes[k] for k in names if k in nodes}, 1 * NS)
        if clock:
            contributing.append(clock)
        fix = [hint] + [f"on every node: {line}" for line in hits[0][1].fix[:2]]
        out.append(Chain(rule_id="fleet-shared", severity="HIGH" if len(hits) == n else "MEDIUM",
                         title=f"Shared cause: {rule} on {len(hits)} of {n} nodes", root=root,
                         effect=[f"the job as a whole is {rule}: fixing one node would not help"], fix=fix,
                         contributing=contributing, impact=round(mean_share, 4), share=round(mean_share, 4),
                         windows_total=sum(nodes[k].windows for k in names if k in nodes),
                         numbers={"nodes": len(hits), "of": n, "mean_share": round(mean_share, 4)}))
    return out


def _top_names(tops: list[dict]) -> str:
    by: dict[str, float] = {}
    for t in tops:
        name = f"{t.get('name')} (PID {t.get('pid')})"
        by[name] = by.get(name, 0.0) + float(t.get("cpu_s") or 0)
    best = sorted(by.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {v:.1f} CPU-s" for k, v in best) or "unnamed"


def busy_hosts(nodes: dict[str, Node], skip: set[str], t: Thresholds = T) -> list[Chain]:
    out = []
    for name, x in sorted(nodes.items()):
        span_s = (x.end_ns - x.start_ns) / NS
        if name in skip or span_s <= 0:
            continue
        cores = x.others_cpu_s / span_s
        if cores < t.busy_cores:
            continue
        wait = x.cpu_wait_ns / x.wall_ns if x.wall_ns else 0.0
        sev = "MEDIUM" if wait >= t.busy_cpu_wait_share else "LOW"
        out.append(Chain(rule_id="fleet-busy-host", severity=sev, title=f"Busy host: {name} runs work outside the job",
                         root=[f"{name}: processes outside the traced job used {cores:.2f} of {x.ncpu} cores on average: "
                               f"{_top_names(x.others_top)}"],
                         effect=[f"its loop waited for a CPU {wait:.0%} of its wall clock"],
                         fix=[f"on {name}: move or renice what is not the job (see `ingero explain` there)"],
                         impact=round(wait, 4), share=round(wait, 4), windows_total=x.windows,
                         numbers={"others_cores": round(cores, 3), "cpu_wait_share": round(wait, 4)}))
    return out


def explain(con: duckdb.DuckDBPyConnection, cat: Catalog, t: Thresholds = T) -> tuple[Report, list[dict]]:
    t0, t1 = cat.start_ns or 0, cat.end_ns or (1 << 62)
    nodes = load_nodes(con, t0, t1)
    local = local_chains(con, nodes, t0, t1)
    chains: list[Chain] = []
    notes = list(cat.notes)
    slow, basis = straggler(nodes, local, t)
    if slow is not None:
        chains.append(slow)
    chains.extend(shared(nodes, local, t))
    chains.extend(busy_hosts(nodes, {slow.numbers["node"]} if slow is not None else set(), t))  # type: ignore[arg-type]
    chains.sort(key=Chain.sort_key)
    if basis:
        notes.append(basis)
    read = cat.count(("nodes", "chains"))
    notes.append(f"read {read} files (nodes, chains); pruned {cat.pruned_dirs} partitions and "
                 f"{cat.pruned_files} files by job and time; events and windows files are not read")
    if not nodes:
        notes.append("no node published a segment in this range")
    start = min((x.start_ns for x in nodes.values()), default=t0)
    end = max((x.end_ns for x in nodes.values()), default=t1)
    dk = sum(x.drops_kernel for x in nodes.values())
    du = sum(x.drops_user for x in nodes.values())
    if dk or du:
        notes.append(f"{dk + du:,} events were dropped while tracing on "
                     f"{sum(1 for x in nodes.values() if x.drops_kernel or x.drops_user)} node(s): counts are lower bounds")
    analysed = Analysed(session_id=None, start_ns=start, end_ns=end, window_s=1.0,
                        windows=sum(x.windows for x in nodes.values()), events=sum(x.events for x in nodes.values()),
                        cuda_events=int(sum(x.ops for x in nodes.values())),
                        processes=[f"node {n}" for n in sorted(nodes)], drops_kernel=dk, drops_user=du)
    return Report(analysed=analysed, system=SystemContext(ncpu=None), chains=chains, notes=notes), \
        [x.to_dict() for x in nodes.values()]
