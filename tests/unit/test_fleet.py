"""The fleet dataset on hand-made Parquet: straggler by MAD, shared causes, busy hosts, pruning,
versions, the read-only guard, bad input (one line, exit 2)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from ingero.cli import cli, main
from ingero.errors import IngeroError
from ingero.events.units import NS
from ingero.fleet import dataset, layout, schema, status
from ingero.fleet.synthetic import NodeSpec, generate

HOG = [{"rule_id": "cpu-contention", "severity": "HIGH", "share": 0.45,
        "title": "CPU scheduling contention → CUDA calls delayed",
        "root": ["1,662 involuntary context switches on python (train.py) (PID 4242)",
                 "CPU taken by cpu-hog (PID 999)"],
        "fix": ["taskset -acp 0 999   (keep cpu-hog off it)"],
        "culprits": [{"pid": 999, "name": "cpu-hog", "detail": "3.1 s on CPU"}]}]


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args), standalone_mode=False, catch_exceptions=True)
    if r.exception and isinstance(r.exception, IngeroError):
        return 2, r.output, str(r.exception)
    if r.exception and not isinstance(r.exception, SystemExit):
        raise r.exception
    return 0, r.output, ""


@pytest.fixture
def hog_fleet(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("node-a", 20.0), NodeSpec("node-b", 41.0, cpu_wait_share=0.4, chains=HOG,
                                                             others_cores=1.2, others_name="cpu-hog"),
                         NodeSpec("node-c", 20.4), NodeSpec("node-d", 19.8)], seconds=120)
    return root


def test_straggler_names_the_node_its_local_cause_and_what_the_others_lost(hog_fleet: Path):
    cat = dataset.catalog(str(hog_fleet), tables=("nodes", "chains"))
    report, nodes = status.explain(str(hog_fleet), job=None, since_s=None)
    chain = report.chains[0]
    assert chain.rule_id == "fleet-straggler" and chain.severity == "HIGH"
    assert chain.numbers["node"] == "node-b"
    assert "node node-b: step time 41.00 ms vs 20.00 ms median of its 3 peers" in chain.root[0]
    assert "its own cause on node-b: [HIGH] CPU scheduling contention" in chain.root[1]
    assert any("CPU taken by cpu-hog (PID 999)" in line for line in chain.root)
    assert [c.name for c in chain.culprits] == ["cpu-hog"]
    # the others lose (41 - own step) per step: node-a 21.0 ms x 6,000 steps = 126.0 s
    assert "  node-a: 21.00 ms x 6,000 steps = 126.0 s (+105% on its own 120 s)" in chain.effect
    assert chain.fix[0] == "on node-b: taskset -acp 0 999   (keep cpu-hog off it)"
    assert sorted(n["node"] for n in nodes) == ["node-a", "node-b", "node-c", "node-d"]
    # the straggler's busy host is in its chain, not a chain of its own
    assert not [c for c in report.chains if c.rule_id == "fleet-busy-host"]
    assert cat.count(("nodes",)) == 8


def test_healthy_fleet_has_no_chain(tmp_path: Path):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a", 20.0), NodeSpec("b", 20.9), NodeSpec("c", 19.6)], seconds=60)
    report, _ = status.explain(str(root), job=None, since_s=None)
    assert report.chains == []
    assert any("straggler judged by step time across 3 nodes: b against its peers' median 19.80 ms" in n
               for n in report.notes)


def test_just_below_the_slowdown_floor_is_no_straggler(tmp_path: Path):
    # 22.8 / 20.0 = 1.14x: far out in MADs (0.1 ms spread) but below min_slowdown 1.15
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a", 20.0), NodeSpec("b", 20.1), NodeSpec("c", 19.9), NodeSpec("d", 22.8)],
             seconds=60)
    report, _ = status.explain(str(root), job=None, since_s=None)
    assert [c.rule_id for c in report.chains] == []


def test_shared_cause_when_every_node_is_input_bound(tmp_path: Path):
    ib = [{"rule_id": "input-bound", "severity": "HIGH", "share": 0.5, "root": ["waits for its DataLoader"]}]
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec(n, 30.0, chains=ib) for n in ("a", "b", "c")], seconds=60)
    report, _ = status.explain(str(root), job=None, since_s=None)
    assert [c.rule_id for c in report.chains] == ["fleet-shared"]
    c = report.chains[0]
    assert c.severity == "HIGH" and c.root[0].startswith("input-bound on 3 of 3 nodes (a, b, c)")
    assert "shared storage" in c.fix[0]


def test_a_runs_partial_edge_windows_are_not_judged(tmp_path: Path):
    # every node's input-bound chain rests on its run's first and last window only (start-up and
    # teardown, partial): no shared finding; with steady windows besides, the finding stands
    ib = [{"rule_id": "input-bound", "severity": "MEDIUM", "share": 0.3}]
    edges = tmp_path / "edges"
    generate(str(edges), [NodeSpec(n, 20.0, chains=ib, evidence_s=[0, 59]) for n in ("a", "b", "c")], seconds=60,
             segment_s=20)
    report, _ = status.explain(str(edges), job=None, since_s=None)
    assert report.chains == []
    steady = tmp_path / "steady"
    generate(str(steady), [NodeSpec(n, 20.0, chains=ib, evidence_s=[0, 5, 10, 30, 45, 59]) for n in ("a", "b", "c")],
             seconds=60, segment_s=20)
    report, _ = status.explain(str(steady), job=None, since_s=None)
    assert [(c.rule_id, c.numbers["nodes"]) for c in report.chains] == [("fleet-shared", 3)]
    # segment 1 keeps 2 of its 3 windows (share 0.3 x 2/3), segment 2 its one (0.3), segment 3
    # one of 2: too few to count; over the node's 3 segments
    assert report.chains[0].numbers["mean_share"] == round((0.2 + 0.3) / 3, 4)


def test_busy_host_outside_the_job(tmp_path: Path):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a", 20.0), NodeSpec("b", 20.0, others_cores=1.5, others_name="backup",
                                                         cpu_wait_share=0.3), NodeSpec("c", 20.0)], seconds=60)
    report, _ = status.explain(str(root), job=None, since_s=None)
    assert [(c.rule_id, c.severity) for c in report.chains] == [("fleet-busy-host", "MEDIUM")]
    assert "backup (PID 777) 90.0 CPU-s" in report.chains[0].root[0]


def test_unsynchronised_clocks_are_stated_in_the_finding(tmp_path: Path):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a", 20.0), NodeSpec("b", 40.0, synced=False), NodeSpec("c", 20.0)], seconds=60)
    report, _ = status.explain(str(root), job=None, since_s=None)
    assert any(line.startswith("clocks: b not synchronised") for line in report.chains[0].contributing)


def test_time_and_job_pruning_never_read_every_file(tmp_path: Path):
    root = tmp_path / "ds"
    start = 1_795_000_000 * NS
    generate(str(root), [NodeSpec("a"), NodeSpec("b"), NodeSpec("c")], seconds=3 * 3600, segment_s=600,
             start_ns=start)
    generate(str(root), [NodeSpec("a")], job="other", seconds=600, segment_s=600, start_ns=start)
    everything = sum(1 for p in root.rglob("*.parquet"))
    cat = dataset.catalog(str(root), tables=("nodes", "chains"), job="job1", since_s=600)
    # the last 10 minutes (+ one segment that may reach into them) of 3 nodes, nodes only (no chains): 6 files
    assert cat.count() == 6 and everything == 3 * 18 * 2 + 2
    assert cat.pruned_dirs > 0 and cat.pruned_files > 0
    report, _ = status.explain(str(root), job="job1", since_s=600)
    assert any(n.startswith("read 6 files (nodes, chains)") for n in report.notes)


def test_unknown_schema_version_is_one_line_exit_2(tmp_path: Path, capsys):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a", fleet_schema=7), NodeSpec("b", fleet_schema=7)], seconds=60)
    assert main(["fleet", "explain", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ingero: the fleet dataset at {root} has fleet schema version 7; this ingero reads version 1 — "
                   "read it with the ingero version that wrote it (nodes.ingero_version)"]


def test_mixed_versions_are_a_stated_partial_answer(tmp_path: Path):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a"), NodeSpec("b"), NodeSpec("c"), NodeSpec("d", fleet_schema=2)], seconds=60)
    report, nodes = status.explain(str(root), job=None, since_s=None)
    assert sorted(n["node"] for n in nodes) == ["a", "b", "c"]
    assert report.notes[0] == ("partial answer: 1 of 4 segments (node d) have fleet schema version 2, which this "
                               "ingero (version 1) cannot read: they are left out")


@pytest.mark.parametrize("make, expect", [
    (lambda p: None, "no fleet dataset at {root}: it does not exist"),
    (lambda p: p.write_text("x"), "no fleet dataset at {root}: not a directory"),
    (lambda p: p.mkdir(), "no fleet dataset at {root}: it holds no table=nodes directory"),
])
def test_bad_root_is_one_line_exit_2(tmp_path: Path, capsys, make, expect):
    root = tmp_path / "ds"
    make(root)
    for cmd in (["fleet", "explain", str(root)], ["fleet", "status", str(root)],
                ["fleet", "query", str(root), "SELECT 1"]):
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("ingero: " + expect.format(root=root)), err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_unreadable_root_is_one_line(tmp_path: Path, capsys):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a")], seconds=60)
    root.chmod(0)
    try:
        assert main(["fleet", "status", str(root)]) == 2
    finally:
        root.chmod(0o755)
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_fleet_query_reads_every_node_and_is_read_only(tmp_path: Path, capsys):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a", 20.0), NodeSpec("b", 25.0)], seconds=120, events_per_node=1000)
    result, notes = status.query(str(root), "SELECT node, sum(steps) AS steps, count(*) AS segments FROM nodes "
                                            "GROUP BY node ORDER BY node", 100)
    assert result.rows == [("a", 6000, 2), ("b", 4800, 2)]
    result, _ = status.query(str(root), "SELECT count(*) FROM events WHERE node = 'b'", 100)
    assert result.rows == [(1000,)]
    for sql, words in (("COPY nodes TO '/tmp/x.csv'", "COPY is refused"),
                       (f"SELECT * FROM read_parquet('{root}/**/*.parquet')", "refused"),
                       ("SELECT 1; SELECT 2", "refused: 2 statements")):
        assert main(["fleet", "query", str(root), sql]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and words in err[0], err


def test_status_lists_nodes_drops_and_skew(tmp_path: Path, capsys):
    root = tmp_path / "ds"
    generate(str(root), [NodeSpec("a", max_error_us=800), NodeSpec("b", max_error_us=300)], seconds=120)
    assert main(["fleet", "status", str(root), "--json"]) == 0
    out = capsys.readouterr()
    rows = json.loads(out.out)["rows"] if out.out.lstrip().startswith("{") else json.loads(out.out)
    assert [r["node"] if isinstance(r, dict) else r[1] for r in rows] == ["a", "b"]
    assert "clock skew between nodes: at most 1.100 ms" in out.err


def test_explain_json_has_the_explain_shape_and_nodes(hog_fleet: Path, capsys):
    assert main(["fleet", "explain", str(hog_fleet), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format_version"] == 1 and data["chains"][0]["rule_id"] == "fleet-straggler"
    assert {n["node"] for n in data["nodes"]} == {"node-a", "node-b", "node-c", "node-d"}


def test_atomic_write_leaves_no_visible_partial_file_and_names_are_idempotent(tmp_path: Path):
    root = layout.open_root(str(tmp_path / "ds"))
    d = layout.partition_dir(root, "nodes", "j", "n", 1_795_000_000 * NS)
    # a temp file of a dead publisher (pid 1 << 22 is above pid_max) is removed; it never matched *.parquet
    os.makedirs(d)
    stale = Path(d) / (".part-n-1-1795000000000000000-0.parquet" + layout.TMP_MARK + str(1 << 22))
    stale.write_bytes(b"PAR1 half")
    assert not list(Path(d).glob("*.parquet"))
    assert layout.remove_stale_temps(root, d) == 1 and not stale.exists()
    t = schema.conform(__import__("pyarrow").table({"fleet_schema": [1]}), schema.NODES)
    path = f"{d}/{layout.file_name('n', 1, 1_795_000_000 * NS, 0)}"
    layout.write_atomic(root, path, t)
    assert layout.exists(root, path) and os.listdir(d) == [os.path.basename(path)]
    assert pq.read_metadata(path).metadata[schema.VERSION_KEY] == b"1"


def test_every_table_and_column_is_documented():
    text = (Path(__file__).resolve().parents[2] / "docs" / "fleet.md").read_text()
    for table, sch in schema.TABLES.items():
        assert f"### {table}" in text, table
        for f in sch:
            assert f"`{f.name}`" in text, (table, f.name)
    assert f"fleet schema version {schema.FLEET_SCHEMA_VERSION}" in text


# -- the publisher on a store, without eBPF: lost mount, crash, catch-up ------------------------------

class _Sess:
    def __init__(self, store, sid):
        self.store, self.session_id, self.last_counters, self.drops_user = store, sid, None, 0


def _store_with_events(db: Path, n: int = 3000, span_s: int = 30):
    import numpy as np

    from ingero.demo.synthetic import event_batch
    from ingero.store.db import Store

    store = Store.open(db)
    sid = store.begin_session(command="test", targets="test")
    start = store.con.execute("SELECT started_ns FROM sessions WHERE session_id = $s", {"s": sid}).fetchall()[0][0]
    store.append("events", event_batch(sid, start - span_s * NS, start - NS, n, np.random.default_rng(3)))
    store.con.execute("UPDATE sessions SET started_ns = $t WHERE session_id = $s", {"t": start - span_s * NS, "s": sid})
    return store, sid


def _published_events(root: Path, node: str) -> int:
    files = [f for f in root.rglob("*.parquet") if "table=events" in str(f) and f"node={node}" in str(f)]
    return sum(pq.read_metadata(f).num_rows for f in files)


def test_lost_mount_keeps_segments_due_and_the_next_publisher_fills_the_gap(tmp_path: Path):
    from ingero.fleet.publish import Publisher

    db = tmp_path / "n.duckdb"
    store, sid = _store_with_events(db)
    mount = tmp_path / "mnt"
    mount.mkdir()
    root = mount / "ds"
    pub = Publisher.bind(str(root), db, node="n", job="j", segment_s=10)
    sess = _Sess(store, sid)
    pub.on_flush(sess, None, 0.0)
    # the mount goes away: ROOT is now a file, every write fails; the session ends meanwhile
    import shutil
    shutil.rmtree(root)
    root.write_text("not a directory")
    pub.on_end(sess)
    pub.close()
    assert pub.failures >= 1 and pub.published == 0 and "not yet fully published" in pub.summary()
    state = json.loads((tmp_path / "n.duckdb.fleet.json").read_text())["sessions"][str(sid)]
    assert state["done"] is False
    # the mount is back; the next trace on the same store publishes the whole session, once
    root.unlink()
    sid2 = store.begin_session(command="test", targets="test")
    pub2 = Publisher.bind(str(root), db, node="n", job="j", segment_s=10)
    pub2.on_flush(_Sess(store, sid2), None, 0.0)
    pub2.on_end(_Sess(store, sid2))
    pub2.close()
    stored = store.con.execute("SELECT count(*) FROM events WHERE session_id = $s", {"s": sid}).fetchall()[0][0]
    assert _published_events(root, "n") == stored == 3000
    names = sorted(f.name for f in root.rglob("*.parquet") if "table=nodes" in str(f))
    starts = sorted(int(layout.NAME_RE.match(n)["first_ts"]) for n in names
                    if layout.NAME_RE.match(n)["session"] == str(sid))
    assert all(b - a == 10 * NS for a, b in zip(starts, starts[1:]))
    # a third publisher finds nothing due: nothing is written twice
    before = sorted(str(f) for f in root.rglob("*.parquet"))
    pub3 = Publisher.bind(str(root), db, node="n", job="j", segment_s=10)
    sid3 = store.begin_session(command="test", targets="test")
    pub3.on_flush(_Sess(store, sid3), None, 0.0)
    pub3.on_end(_Sess(store, sid3))
    pub3.close()
    assert [f for f in sorted(str(f) for f in root.rglob("*.parquet")) if "-%d-" % sid in f] == \
        [f for f in before if "-%d-" % sid in f]
    store.close()


def test_unwritable_publish_root_is_one_line_before_tracing(tmp_path: Path):
    from ingero.fleet.publish import Publisher

    (tmp_path / "f").write_text("x")
    with pytest.raises(IngeroError) as err:
        Publisher.bind(str(tmp_path / "f" / "ds"), tmp_path / "db.duckdb")
    assert str(err.value).startswith(f"cannot publish to {tmp_path / 'f' / 'ds'}: ")
