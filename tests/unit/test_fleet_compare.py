"""fleet explain on two and three nodes: the slower of two named with its own cause, every
node's own top chain, --since from the end of the newest data, fixes with each node's own PIDs,
evidence counted on the chain's node, readable status times (issue 38)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from click.testing import CliRunner

from ingero.cli import cli
from ingero.events.units import NS
from ingero.fleet import dataset, status
from ingero.fleet.synthetic import NodeSpec, generate
from ingero.render import fleet as view

START = 1_795_000_000 * NS  # 2026-11-18 11:06:40 UTC


def contention(pid: int, hog: int, share: float = 0.45, severity: str = "HIGH") -> list[dict]:
    return [{"rule_id": "cpu-contention", "severity": severity, "share": share,
             "title": "CPU scheduling contention → CUDA calls delayed",
             "root": [f"1,662 involuntary context switches on python3 (train.py) (PID {pid})",
                      f"CPU taken by cpu-hog (PID {hog})"],
             "fix": [f"taskset -acp 1 {pid}   (the loop on a core of its own)",
                     "pin the job's DataLoader workers away from the loop's core"],
             "culprits": [{"pid": hog, "name": "cpu-hog", "detail": "3.1 s on CPU"}]}]


def two_nodes(tmp: Path, slow_ms: float = 34.5, **kw) -> Path:
    """Node b did 42% fewer steps than a (34.5 ms against 20 ms) with its own HIGH cpu-contention."""
    root = tmp / "ds"
    generate(str(root), [NodeSpec("a", 20.0, pid=1001),
                         NodeSpec("b", slow_ms, pid=2002, cpu_wait_share=0.4, chains=contention(2002, 999))], **kw)
    return root


def test_two_nodes_the_slower_one_is_compared_directly_with_its_own_cause(tmp_path: Path):
    root = two_nodes(tmp_path, seconds=120)
    report, nodes = status.explain(str(root), job=None, since_s=None)
    [chain] = report.chains
    assert (chain.rule_id, chain.severity, chain.numbers["node"]) == ("fleet-straggler", "HIGH", "b")
    assert chain.root[0] == "node b: step time 34.50 ms vs 20.00 ms on a, the other node (1.73x slower)"
    assert chain.root[1] == ("its own cause on b: [HIGH] CPU scheduling contention → CUDA calls delayed "
                             "(44% of its wall clock)")
    assert "  CPU taken by cpu-hog (PID 999)" in chain.root
    assert [(c.pid, c.name) for c in chain.culprits] == [(999, "cpu-hog")]
    # a waits 14.5 ms at each of its 6,000 steps
    assert chain.effect[0].startswith("the other node waits for it at every collective")
    assert "  a: 14.50 ms x 6,000 steps = 87.0 s (+72% on its own 120 s)" in chain.effect
    assert chain.fix[0] == "on b: taskset -acp 1 2002   (the loop on a core of its own)"
    # the evidence is b's own: its cause's windows (the run's first and last are partial: not judged)
    assert (len(chain.evidence_windows), chain.windows_total) == (118, 120)
    assert set(chain.numbers) >= {"value", "median", "ratio", "nodes"} and "z" not in chain.numbers
    assert any(n == "straggler judged by step time across 2 nodes: b against a directly, 34.50 vs 20.00 ms "
                    "(1.73x; threshold 1.15x)" for n in report.notes), report.notes
    assert [n["node"] for n in nodes] == ["a", "b"]


def test_two_nodes_within_the_slowdown_floor_are_no_straggler(tmp_path: Path):
    root = two_nodes(tmp_path, slow_ms=22.8, seconds=60)  # 1.14x
    report, nodes = status.explain(str(root), job=None, since_s=None)
    assert [c.rule_id for c in report.chains] == []
    assert any("across 2 nodes: b against a directly, 22.80 vs 20.00 ms (1.14x; threshold 1.15x)" in n
               for n in report.notes)
    # b's own chain is still listed: every node's own top chain is
    assert nodes[1]["top_chain"]["rule_id"] == "cpu-contention"


def test_every_nodes_own_top_chain_is_listed(tmp_path: Path):
    root = tmp_path / "ds"
    ib = [{"rule_id": "input-bound", "severity": "MEDIUM", "share": 0.2,
           "title": "Input-bound: the loop waits for data",
           "root": ["the loop waited for its next batch 20% of wall clock"]}]
    generate(str(root), [NodeSpec("a", 20.0), NodeSpec("b", 20.4, chains=contention(4242, 999, 0.15, "MEDIUM")),
                         NodeSpec("c", 19.8, chains=ib)], seconds=60)
    report, nodes = status.explain(str(root), job=None, since_s=None)
    assert report.chains == []  # no straggler, no shared cause, no busy host
    tops = {n["node"]: n["top_chain"] and (n["top_chain"]["rule_id"], n["top_chain"]["severity"]) for n in nodes}
    assert tops == {"a": None, "b": ("cpu-contention", "MEDIUM"), "c": ("input-bound", "MEDIUM")}
    out = io.StringIO()
    view.write(report, nodes, out)
    lines = out.getvalue().splitlines()
    i = lines.index("Each node's own top chain:")
    assert lines[i + 1:i + 6] == [
        "  a: no chain of its own in the range",
        "  b: [MEDIUM] CPU scheduling contention → CUDA calls delayed   (14% of its wall clock, 58 of 60 windows)",
        "     1,662 involuntary context switches on python3 (train.py) (PID 4242)",
        "  c: [MEDIUM] Input-bound: the loop waits for data   (19% of its wall clock, 58 of 60 windows)",
        "     the loop waited for its next batch 20% of wall clock",
    ]
    assert view.to_dict(report, nodes)["nodes"][2]["top_chain"]["root"] == ib[0]["root"]


def test_since_counts_back_from_the_end_of_the_newest_data(tmp_path: Path):
    # 130 s of data in 60 s segments: the last segment holds 10 s (the trace ended mid-segment)
    root = two_nodes(tmp_path, seconds=130, segment_s=60)
    cat = dataset.catalog(str(root), tables=("nodes",), since_s=5)
    assert cat.end_ns == START + 130 * NS and cat.start_ns == START + 125 * NS
    for since in (5, 30, 120, 600):  # (each used to miss the data: an all-clear)
        report, nodes = status.explain(str(root), job=None, since_s=since)
        assert [n["node"] for n in nodes] == ["a", "b"], since
        assert [c.rule_id for c in report.chains] == ["fleet-straggler"], (since, report.notes)


def test_a_shared_cause_names_each_nodes_own_pids_and_counts_its_evidence_there(tmp_path: Path):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec(n, 20.0, pid=pid, evidence_s=list(range(10, 40)) if n == "c" else None,
                                  chains=contention(pid, 900 + k))
                         for k, (n, pid) in enumerate((("a", 1001), ("b", 2002), ("c", 3003)))], seconds=60)
    report, _ = status.explain(str(root), job=None, since_s=None)
    [chain] = [c for c in report.chains if c.rule_id == "fleet-shared"]
    assert chain.severity == "HIGH"
    assert chain.fix[1:] == ["on every node: pin the job's DataLoader workers away from the loop's core",
                             "on a: taskset -acp 1 1001   (the loop on a core of its own)",
                             "on b: taskset -acp 1 2002   (the loop on a core of its own)",
                             "on c: taskset -acp 1 3003   (the loop on a core of its own)"]
    # a and b: 58 of their 60 windows each (edges not judged); c: its 30
    assert (len(chain.evidence_windows), chain.windows_total) == (58 + 58 + 30, 180)


def test_a_busy_host_is_reniced_by_its_own_pids_with_its_own_evidence(tmp_path: Path):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a", 20.0), NodeSpec("b", 20.0, others_cores=1.5, others_name="backup",
                                                         cpu_wait_share=0.3,
                                                         chains=contention(4242, 777, 0.08, "MEDIUM"),
                                                         evidence_s=list(range(5, 25))),
                         NodeSpec("c", 20.0)], seconds=60)
    report, _ = status.explain(str(root), job=None, since_s=None)
    [chain] = [c for c in report.chains if c.rule_id == "fleet-busy-host"]
    assert chain.fix[0] == "on b: renice -n 19 -p 777   (backup)"
    assert (len(chain.evidence_windows), chain.windows_total) == (20, 60)


def test_failed_calls_on_every_node_are_a_shared_cause(tmp_path: Path):
    failed = [{"rule_id": "failed-calls", "severity": "HIGH", "share": 0.0, "title": "CUDA calls failed",
               "root": ["python3 (train.py) (PID 4242): 306,000 of 306,000 CUDA calls returned an error (100.0%)"],
               "fix": ["the NVIDIA driver is missing, or older than the CUDA runtime the job loaded"]}]
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec(n, 20.0, chains=failed) for n in ("a", "b")], seconds=60)
    report, nodes = status.explain(str(root), job=None, since_s=None)
    [chain] = report.chains
    assert (chain.rule_id, chain.severity) == ("fleet-shared", "HIGH")
    assert chain.fix == ["every node's CUDA calls fail: what they share (the image's CUDA runtime, the driver, the "
                         "job's code) is the cause, not one host",
                         "on every node: the NVIDIA driver is missing, or older than the CUDA runtime the job loaded"]
    out = io.StringIO()
    view.write(report, nodes, out)
    assert "  a: [HIGH] CUDA calls failed   (58 of 60 windows)" in out.getvalue().splitlines()


def test_status_prints_readable_times_and_json_keeps_nanoseconds(tmp_path: Path):
    root = two_nodes(tmp_path, seconds=120)
    res = CliRunner().invoke(cli, ["fleet", "status", str(root)])
    assert res.exit_code == 0, res.output
    header, _, *rows = res.stdout.splitlines()
    assert "last_segment_end" in header and "last_written" in header and "_ns" not in header
    # the last segment ends 120 s in (11:08:40 UTC) and was written 3 s after
    assert "2026-11-18 11:08:40 UTC  2026-11-18 11:08:43 UTC" in rows[0]
    assert str(START)[:6] not in res.stdout
    res = CliRunner().invoke(cli, ["fleet", "status", str(root), "--json"])
    doc = json.loads(res.stdout)
    assert doc["rows"][0]["last_segment_end_ns"] == START + 120 * NS
