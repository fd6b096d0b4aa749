"""fleet explain: cross-node causal chains over the dataset, as the same Chain objects explain returns.

Three findings, each from the run itself (no fixed step time, no peer list):

fleet-straggler   the slowest node, when its step time lies more than z_min
                  robust deviations above its peers' median (modified
                  z-score on the median absolute deviation of the other
                  nodes; Iglewicz & Hoaglin's 3.5); of two nodes, the slower
                  when min_slowdown slower than the other (compared
                  directly: one peer has no spread); with
                  its own local cause (its segments' strongest chain) and what
                  a synchronous collective per step costs the others: each
                  waits (straggler step - own step) per step.
fleet-shared      one local cause (rule) on at least half of the nodes (two or
                  more): the cause is what they share (storage, code,
                  configuration), not one host.
fleet-busy-host   processes outside the traced job using at least half a
                  core on average on a node; MEDIUM when that node's loop also
                  waited for a CPU at least 25% of its wall clock.

Every node's own top chain is listed beside the findings (``top_chain``); a fix names the PIDs of
the node it is for, and a finding's evidence windows are those of the node(s) it is about.

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

from ingero.analyze.baseline import MIN_EVIDENCE_WINDOWS, TRIM_EDGES_FROM_WINDOWS
from ingero.analyze.model import Analysed, Chain, Culprit, Report, SystemContext, Window
from ingero.events.units import NS
from ingero.fleet.dataset import Catalog

WINDOW_NS = NS  # a segment's windows are one second (segment.py)


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
    # Nodes needed to judge a straggler: with two, one is compared with the other directly (the
    # slowdown floors only); from three on, by the peers' MAD as well.
    min_nodes: int = 2
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
           sum(steps) AS steps, sum(step_median_ms * steps) AS step_ms_x,
           sum(steps) FILTER (step_median_ms IS NOT NULL) AS timed,
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
SELECT node, rule_id, severity, title, share, root, effect, fix, culprits, evidence_windows, segment_start_ns,
       session_id
FROM chains WHERE segment_end_ns > $t0 AND segment_start_ns < $t1
"""
# Each run's (node, session) first and last loop window: partial (start-up, teardown), so not
# judged, as explain leaves a process' first and last window out (analyze/baseline.py).  Over the
# whole session, not the range: a range that cuts a run in two has no edge at the cut.
EDGES_SQL = """
SELECT node, session_id, min(loop_first_ns), max(loop_last_ns), sum(loop_windows) FROM nodes
WHERE node IN (SELECT DISTINCT node FROM nodes WHERE segment_end_ns > $t0 AND segment_start_ns < $t1)
GROUP BY ALL
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
                "first_ns": self.start_ns, "last_ns": self.end_ns, "windows": self.windows}


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
            x.wall_ns, x.cpu_wait_ns, x.ops, x.launches = (float(wall or 0), float(cpu_wait or 0), float(ops or 0),
                                                           float(launches or 0))
            x.windows = int(n or 0)
    return nodes


def run_edges(con: duckdb.DuckDBPyConnection, t0: int, t1: int) -> dict[tuple[str, int], list[tuple[int, int]]]:
    """(node, session) -> its run's first and last loop window [start, end), for a run long enough
    to have a steady state between them (TRIM_EDGES_FROM_WINDOWS, as explain)."""
    out: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for node, sid, first, last, n in con.execute(EDGES_SQL, {"t0": t0, "t1": t1}).fetchall():
        if first is not None and last is not None and (n or 0) >= TRIM_EDGES_FROM_WINDOWS:
            out[(node, int(sid))] = [(int(first), int(first) + WINDOW_NS), (int(last), int(last) + WINDOW_NS)]
    return out


def _off_edges(row: tuple, edges: list[tuple[int, int]] | None) -> tuple | None:
    """A chain row without the evidence (windows or steps) that touches its run's edge windows,
    its share scaled by the evidence time kept; None when fewer than MIN_EVIDENCE_WINDOWS are left."""
    spans = [(int(w["start_ns"]), int(w["end_ns"])) for w in row[9] or []]
    if not edges or not spans:
        return row
    kept = [s for s in spans if not any(s[0] < e1 and s[1] > e0 for e0, e1 in edges)]
    if len(kept) == len(spans):
        return row
    if len(kept) < MIN_EVIDENCE_WINDOWS:
        return None
    total = sum(e - s for s, e in spans)
    share = (row[4] or 0) * (sum(e - s for s, e in kept) / total if total > 0 else len(kept) / len(spans))
    return (*row[:4], share, *row[5:9], [{"start_ns": s, "end_ns": e} for s, e in kept], *row[10:])


def local_chains(con: duckdb.DuckDBPyConnection, nodes: dict[str, Node], t0: int,
                 t1: int) -> dict[str, list[LocalChain]]:
    """Each node's chains merged over its segments, by rule, strongest first.

    A segment's chain rests on its evidence (windows, or steps); what touches its run's first or
    last window (partial: start-up, teardown) does not count, and a chain left with fewer than
    MIN_EVIDENCE_WINDOWS pieces is not the node's (a run's edges are no pattern)."""
    edges = run_edges(con, t0, t1)
    by: dict[tuple[str, str], list[tuple]] = {}
    for raw in con.execute(CHAINS_SQL, {"t0": t0, "t1": t1}).fetchall():
        row = _off_edges(raw, edges.get((raw[0], int(raw[11]))))
        if row is None:
            continue
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
                    culprits.setdefault((int(c["pid"]), c["name"]),
                                        Culprit(int(c["pid"]), c["name"], c.get("detail", "")))
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
                "step times are each node's own durations, so this finding holds; "
                "its time alignment across nodes does not")
    if bound_ns > need_ns:
        return (f"clocks: skew between nodes up to {bound_ns / 1e6:.1f} ms (adjtimex bounds), "
                f"more than the {need_ns / 1e6:.0f} ms this finding aligns to")
    return None


@dataclass(frozen=True)
class Judged:
    """Which node is slowest by ``metric`` and how far from its peers (straggler's judgement)."""

    metric: str
    unit: str
    worse: int  # +1: a larger value is slower (step time), -1: a smaller one (launches/s)
    vals: dict[str, float]
    slow: str
    med: float  # the peers' median (with two nodes: the other node's value)
    ratio: float  # how many times slower than ``med``
    mad: float | None  # None: two nodes, compared directly
    z: float | None
    basis: str
    outlier: bool


def judge(vals: dict[str, float], metric: str, unit: str, worse: int, t: Thresholds = T) -> Judged:
    """The slowest node against its peers: with three or more, by the modified z-score of the
    peers' MAD (leave one out: with a handful of nodes the outlier would otherwise widen the very
    spread it is judged by) and the slowdown floor; with two, directly by the slowdown floor (a
    MAD of one peer is zero: no spread to stand out of, but one node set the pace of both)."""
    slow = max(vals, key=lambda n: (worse * vals[n], n))
    peers = [v for n, v in vals.items() if n != slow]
    med = median(peers)
    ratio = ((vals[slow] / med if med else float("inf")) if worse > 0
             else (med / vals[slow] if vals[slow] else float("inf")))
    if len(vals) == 2:
        fast = next(n for n in vals if n != slow)
        basis = (f"straggler judged by {metric} across 2 nodes: {slow} against {fast} directly, "
                 f"{vals[slow]:.2f} vs {med:.2f} {unit} ({ratio:.2f}x; threshold {t.min_slowdown}x)")
        return Judged(metric, unit, worse, vals, slow, med, ratio, None, None, basis, ratio >= t.min_slowdown)
    mad = median([abs(v - med) for v in peers])
    scale = max(t.mad_scale * mad, t.rel_floor * med)
    z = worse * (vals[slow] - med) / scale
    basis = (f"straggler judged by {metric} across {len(vals)} nodes: {slow} against its peers' median "
             f"{med:.2f} {unit}, MAD {mad:.2f} {unit}, "
             f"threshold {t.z_min} robust deviations (scale {scale:.2f} {unit}) and {t.min_slowdown}x")
    return Judged(metric, unit, worse, vals, slow, med, ratio, mad, z, basis, z > t.z_min and ratio >= t.min_slowdown)


def straggler(nodes: dict[str, Node], local: dict[str, list[LocalChain]],
              t: Thresholds = T) -> tuple[Chain | None, str | None]:
    """The straggler chain (or None) and what the judgement rested on."""
    timed = {n: x.step_ms for n, x in nodes.items() if x.step_ms is not None and x.steps > 0}
    rates = {n: x.launches / (x.wall_ns / NS) for n, x in nodes.items() if x.wall_ns > 0 and x.launches > 0}
    if len(timed) >= t.min_nodes and len(timed) >= len(rates):  # steps, unless launches cover more nodes
        j = judge(timed, "step time", "ms", 1, t)  # type: ignore[arg-type]
    else:
        if len(rates) < t.min_nodes:
            return None, (f"straggler: needs {t.min_nodes} nodes with steps or kernel launches, "
                          f"found {max(len(timed), len(rates))}")
        j = judge(rates, "kernel launches/s", "/s", -1, t)
    metric, vals, unit, slow, med, ratio = j.metric, j.vals, j.unit, j.slow, j.med, j.ratio
    basis = j.basis
    if not j.outlier:
        return None, basis
    me = nodes[slow]
    others = {n: x for n, x in nodes.items() if n != slow}
    if j.mad is None:
        fast = next(n for n in vals if n != slow)
        root = [f"node {slow}: {metric} {vals[slow]:.2f} {unit} vs {med:.2f} {unit} on {fast}, the other node "
                f"({ratio:.2f}x slower)"]
    else:
        root = [f"node {slow}: {metric} {vals[slow]:.2f} {unit} vs {med:.2f} {unit} "
                f"median of its {len(vals) - 1} peers "
                f"({ratio:.2f}x slower, {j.z:.1f} robust deviations above; MAD {j.mad:.2f} {unit})"]
    fix: list[str] = []
    culprits: list[Culprit] = []
    windows: list[Window] = []
    own = [c for c in local.get(slow, []) if _counts(c, t)]
    own = own or local.get(slow, [])
    if own:
        c = own[0]
        root.append(f"its own cause on {slow}: [{c.severity}] {c.title} ({c.share:.0%} of its wall clock)")
        root.extend("  " + line for line in c.root)
        fix.extend(f"on {slow}: {line}" for line in c.fix)
        culprits = [Culprit(x.pid, x.name, f"on node {slow}" + (f": {x.detail}" if x.detail else ""))
                    for x in c.culprits]
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
            who = "the other node waits" if len(per) == 1 else f"each of the other {len(per)} nodes waits"
            effect.append(f"{who} for it at every collective (synchronous data "
                          f"parallel: one all-reduce per step): {mean_wait:.2f} ms per step on average, "
                          f"{lost_total:.1f} s in all over the range")
            for n, wait_ms, steps, lost, share in per[:8]:
                tail = f" (+{share:.0%} on its own {others[n].wall_ns / NS:.0f} s)" if share is not None else ""
                effect.append(f"  {n}: {wait_ms:.2f} ms x {steps:,} steps = {lost:.1f} s{tail}")
            if len(per) > 8:
                effect.append(f"  … and {len(per) - 8} more nodes")
    else:
        effect.append(f"the job runs at {1 / ratio:.0%} of its peers' speed: "
                      "every peer waits for it at each collective")
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
                  contributing=contributing, culprits=culprits, evidence_windows=windows,
                  windows_total=me.windows or len(windows), impact=round(impact, 4), share=round(impact, 4),
                  numbers={"value": round(vals[slow], 4), "median": round(med, 4),
                           **({} if j.mad is None else {"mad": round(j.mad, 4), "z": round(j.z or 0.0, 2)}),
                           "ratio": round(ratio, 4), "others_lost_s": round(lost_total, 3), "nodes": len(vals)})
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
    "failed-calls": "every node's CUDA calls fail: what they share (the image's CUDA runtime, the driver, the "
                    "job's code) is the cause, not one host",
}
# A notice (failed calls) is counted in calls, not a share of wall clock: it is shared whatever its share.
NOTICES = frozenset({"failed-calls"})
# Nodes whose own fix lines a fleet chain lists (each with its own PIDs); the rest are counted.
MAX_NODE_FIXES = 8


def _counts(c: LocalChain, t: Thresholds) -> bool:
    """A node's local chain that counts as its cause (HIGH/MEDIUM, and min_local_share of its wall
    clock unless a notice)."""
    return c.severity in ("HIGH", "MEDIUM") and (c.share >= t.min_local_share or c.rule_id in NOTICES)


def node_fixes(hits: list[tuple[str, LocalChain]], per_node: int = 2) -> list[str]:
    """The nodes' own fix lines: a line every node has word for word once ("on every node: …"),
    the others per node, each with that node's PIDs (a fix names the PIDs of its own node only)."""
    lines = {node: c.fix[:per_node] for node, c in hits}
    common = ([x for x in next(iter(lines.values()), []) if all(x in v for v in lines.values())]
              if len(lines) > 1 else [])
    out = [f"on every node: {x}" for x in common]
    nodes = sorted(lines)
    for node in nodes[:MAX_NODE_FIXES]:
        out.extend(f"on {node}: {x}" for x in lines[node] if x not in common)
    rest = [n for n in nodes[MAX_NODE_FIXES:] if any(x not in common for x in lines[n])]
    if rest:
        out.append(f"on the {len(rest)} other nodes ({', '.join(rest[:5])}{' …' if len(rest) > 5 else ''}): "
                   "their own lines, with their PIDs: `ingero explain` on each")
    return out


def shared(nodes: dict[str, Node], local: dict[str, list[LocalChain]], t: Thresholds = T) -> list[Chain]:
    rules: dict[str, list[tuple[str, LocalChain]]] = {}
    for node, chains in local.items():
        for c in chains:
            if _counts(c, t):
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
        hint = SHARED_HINTS.get(rule, "the same cause on every node: "
                                      "look at what they share (data, code, configuration)")
        contributing = []
        clock = clock_line({k: nodes[k] for k in names if k in nodes}, 1 * NS)
        if clock:
            contributing.append(clock)
        fix = [hint] + node_fixes(sorted(hits))
        # the evidence: each node's own windows of the cause, out of those nodes' windows
        windows = sorted((w for _, c in hits for w in c.windows), key=lambda w: (w.start_ns, w.end_ns))
        out.append(Chain(rule_id="fleet-shared", severity="HIGH" if len(hits) == n else "MEDIUM",
                         title=f"Shared cause: {rule} on {len(hits)} of {n} nodes", root=root,
                         effect=[f"the job as a whole is {rule}: fixing one node would not help"], fix=fix,
                         contributing=contributing, impact=round(mean_share, 4), share=round(mean_share, 4),
                         evidence_windows=windows, windows_total=sum(nodes[k].windows for k in names if k in nodes),
                         numbers={"nodes": len(hits), "of": n, "mean_share": round(mean_share, 4)}))
    return out


def _top_names(tops: list[dict]) -> str:
    by: dict[str, float] = {}
    for t in tops:
        name = f"{t.get('name')} (PID {t.get('pid')})"
        by[name] = by.get(name, 0.0) + float(t.get("cpu_s") or 0)
    best = sorted(by.items(), key=lambda kv: -kv[1])[:3]
    return ", ".join(f"{k} {v:.1f} CPU-s" for k, v in best) or "unnamed"


def _renice(tops: list[dict]) -> str:
    """renice of the busiest processes outside the job, by their PIDs on their own node."""
    by: dict[int, str] = {}
    for x in sorted(tops, key=lambda x: -float(x.get("cpu_s") or 0)):
        try:
            by.setdefault(int(x["pid"]), str(x.get("name")))
        except (KeyError, TypeError, ValueError):
            continue
    pids = list(by)[:3]
    return f"renice -n 19 -p {' '.join(map(str, pids))}   ({', '.join(by[p] for p in pids)})" if pids else ""


def busy_hosts(nodes: dict[str, Node], skip: set[str], local: dict[str, list[LocalChain]] | None = None,
               t: Thresholds = T) -> list[Chain]:
    """``local``: the nodes' own chains; a node's cpu-contention windows are the busy host's evidence."""
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
        renice = _renice(x.others_top)
        waits = [w for c in (local or {}).get(name, []) if c.rule_id == "cpu-contention" for w in c.windows]
        out.append(Chain(rule_id="fleet-busy-host", severity=sev, title=f"Busy host: {name} runs work outside the job",
                         root=[f"{name}: processes outside the traced job used {cores:.2f} of {x.ncpu} cores "
                               "on average: "
                               f"{_top_names(x.others_top)}"],
                         effect=[f"its loop waited for a CPU {wait:.0%} of its wall clock"],
                         fix=[*([f"on {name}: {renice}"] if renice else []),
                              f"on {name}: move what is not the job off its cores (see `ingero explain` there)"],
                         evidence_windows=waits, impact=round(wait, 4), share=round(wait, 4), windows_total=x.windows,
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
    chains.extend(busy_hosts(nodes, {slow.numbers["node"]} if slow is not None else set(), local, t))  # type: ignore[arg-type]
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
                     f"{sum(1 for x in nodes.values() if x.drops_kernel or x.drops_user)} node(s): "
                     "counts are lower bounds")
    analysed = Analysed(session_id=None, start_ns=start, end_ns=end, window_s=1.0,
                        windows=sum(x.windows for x in nodes.values()), events=sum(x.events for x in nodes.values()),
                        cuda_events=int(sum(x.ops for x in nodes.values())),
                        processes=[f"node {n}" for n in sorted(nodes)], drops_kernel=dk, drops_user=du)
    return Report(analysed=analysed, system=SystemContext(ncpu=None), chains=chains, notes=notes), \
        [{**x.to_dict(), "top_chain": top_chain(local.get(x.name, []))} for x in nodes.values()]


def top_chain(chains: list[LocalChain]) -> dict[str, Any] | None:
    """A node's own strongest chain over the range (its segments' chains merged, by severity, then
    share), as each node's row lists it: every node's cause is seen, not only a straggler's."""
    if not chains:
        return None
    c = chains[0]
    return {"rule_id": c.rule_id, "severity": c.severity, "title": c.title, "share": round(c.share, 4),
            "root": c.root, "fix": c.fix, "windows": len(c.windows)}
