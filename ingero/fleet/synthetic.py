"""A generated fleet dataset: the same files publishing writes, made directly (tests, `make bench`).

``generate`` writes, per node and segment, a nodes row, one summary row per
second for the node's training process, the chains given for that node and,
optionally, synthetic events (CUDA launches and syncs, off-CPU intervals).
Step time per node is what the caller says; everything else follows from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from ingero.events.units import NS
from ingero.fleet import layout, schema


@dataclass
class NodeSpec:
    name: str
    step_ms: float = 20.0
    cpu_wait_share: float = 0.02
    others_cores: float = 0.0
    others_name: str = "sshd"
    chains: list[dict] = field(default_factory=list)  # rule_id, severity, share, title, root, fix, culprits
    fleet_schema: int = schema.FLEET_SCHEMA_VERSION
    synced: bool = True
    max_error_us: int = 500
    # seconds of the run (from its start) that are the chains' evidence windows; None: all of them
    evidence_s: list[int] | None = None
    pid: int = 4242  # the training process (each node its own)


def generate(root_url: str, nodes: list[NodeSpec], *, job: str = "job1", start_ns: int = 1_795_000_000 * NS,
             seconds: int = 120, segment_s: int = 60, events_per_node: int = 0, seed: int = 1) -> int:
    """Write the dataset; returns the number of files."""
    root = layout.open_root(root_url)
    rng = np.random.default_rng(seed)
    files = 0
    seg_ns = segment_s * NS
    nseg = -(-seconds // segment_s)
    for spec in nodes:
        pid = spec.pid
        per_seg_events = events_per_node // nseg if events_per_node else 0
        for k in range(nseg):
            t0 = start_ns + k * seg_ns
            secs = min(segment_s, seconds - k * segment_s)
            tables: dict[str, pa.Table] = {}
            steps = int(secs * 1000 / spec.step_ms)
            w = np.arange(secs)
            wall = np.full(secs, float(NS))
            launches = np.full(secs, 8.0 * 1000 / spec.step_ms)
            win = {"session_id": np.full(secs, 1, np.int32), "pid": np.full(secs, pid, np.int32),
                   "process": ["python3 (train.py)"] * secs, "start_ns": t0 + w * NS,
                   "window_ns": np.full(secs, NS), "wall_ns": wall, "ops_n": launches * 1.5,
                   "launch_n": launches, "sync_n": launches / 8, "cpu_wait_ns": wall * spec.cpu_wait_share}
            tables["windows"] = schema.conform(pa.table(win), schema.WINDOWS)
            if per_seg_events:
                tables["events"] = _events(rng, per_seg_events, t0, secs, pid)
            rows = []
            seconds_here = range(k * segment_s, k * segment_s + secs)
            ev = [x for x in seconds_here if spec.evidence_s is None or x in spec.evidence_s]
            for i, c in enumerate(spec.chains if ev else [], 1):
                rows.append({"session_id": 1, "segment_start_ns": t0, "segment_end_ns": t0 + seg_ns, "rank": i,
                             "rule_id": c["rule_id"], "severity": c.get("severity", "HIGH"),
                             "title": c.get("title", c["rule_id"]), "share": c.get("share", 0.4),
                             "impact": c.get("share", 0.4), "correlation": None, "pids": c.get("pids", [pid]),
                             "culprits": json.dumps(c.get("culprits", [])),
                             "evidence_windows": [{"start_ns": start_ns + x * NS, "end_ns": start_ns + (x + 1) * NS}
                                                  for x in ev],
                             "root": c.get("root", [f"{c['rule_id']} on {spec.name}"]), "effect": [],
                             "fix": c.get("fix", []), "numbers": "{}"})
            if rows:
                tables["chains"] = pa.Table.from_pylist(rows, schema=schema.CHAINS)
            tables["nodes"] = pa.Table.from_pylist([{
                "fleet_schema": spec.fleet_schema, "session_id": 1, "segment_start_ns": t0,
                "segment_end_ns": t0 + seg_ns, "segment_ns": seg_ns, "written_ns": t0 + seg_ns + 3 * NS,
                "hostname": spec.name, "kernel": "6.18", "ncpu": 8, "gpus": 8, "gpu_names": ["H100"] * 8,
                "clock_offset_ns": 0, "clock_sync": "chrony", "clock_synced": spec.synced,
                "clock_max_error_us": spec.max_error_us, "clock_est_error_us": spec.max_error_us // 10,
                "events": per_seg_events, "drops_kernel": 0, "drops_user": 0, "steps": steps,
                "step_median_ms": spec.step_ms, "step_p99_ms": spec.step_ms * 1.2, "device_busy": 0.8,
                "loop_pids": [pid], "loop_wall_ns": float(wall.sum()),
                "loop_cpu_wait_ns": float(win["cpu_wait_ns"].sum()),
                "loop_ops": float(win["ops_n"].sum()), "loop_launches": float(launches.sum()), "loop_windows": secs,
                "loop_first_ns": t0, "loop_last_ns": t0 + (secs - 1) * NS, "host_cpu_pct": 50.0, "load1": 4.0,
                "others_cpu_s": spec.others_cores * secs,
                "others_top": json.dumps([{"pid": 777, "name": spec.others_name, "cpu_s": spec.others_cores * secs}]),
                "ingero_version": "synthetic"}], schema=schema.NODES)
            for table in schema.WRITE_ORDER:
                if table not in tables:
                    continue
                directory = layout.partition_dir(root, table, job, spec.name, t0)
                layout.write_atomic(root, f"{directory}/{layout.file_name(spec.name, 1, t0, 0)}", tables[table])
                files += 1
    return files


def _events(rng: np.random.Generator, n: int, t0: int, secs: int, pid: int) -> pa.Table:
    ts = np.sort(t0 + rng.integers(0, secs * NS, n))
    op_codes = rng.choice(4, n, p=[0.7, 0.1, 0.15, 0.05])
    ops = pa.DictionaryArray.from_arrays(pa.array(op_codes.astype(np.int8)),
                                         pa.array(["cudaLaunchKernel", "cudaStreamSync", "sched_switch",
                                                   "cudaMemcpyAsync"]))
    t = pa.table({"session_id": np.full(n, 1, np.int32), "timestamp": ts,
                  "duration_ns": rng.integers(2_000, 200_000, n), "pid": np.full(n, pid, np.int32),
                  "tid": np.full(n, pid, np.int32), "op": ops.cast(pa.string())})
    return schema.conform(t, schema.EVENTS)
