"""ingero.metrics: per-flush aggregates on hand-made records, the exposition prometheus_client
writes from them, the diagnosis gauges from a real query server, and --metrics-port's bad input."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import prereqs
from ingero.cli import main
from ingero.events.ops import Op
from ingero.events.records import EVENT_DTYPE, Kind
from ingero.metrics.aggregate import Aggregates
from ingero import __version__
from ingero.metrics.diagnosis import Diagnosis, StepRate, active_chains, step_rate
from ingero.metrics.server import MetricsServer

REPO = Path(__file__).resolve().parents[2]


def records(*rows: dict) -> np.ndarray:
    out = np.zeros(len(rows), dtype=EVENT_DTYPE)
    for i, r in enumerate(rows):
        for k, v in r.items():
            out[i][k] = int(v)
    return out


def rec(op: Op, pid: int, duration_ns: int = 0, kind: int = int(Kind.NONE), arg: int = 0) -> dict:
    return {"op": int(op), "pid": pid, "tid": pid, "duration_ns": duration_ns, "kind": kind, "arg": arg}


def samples(registry_or_server) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(registry_or_server.registry).decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


@pytest.fixture
def alive():
    pids = {100, 200}
    return pids


@pytest.fixture
def server(alive):
    srv = MetricsServer("127.0.0.1", 0)  # not bound: the collector is what is read here
    srv.aggregates = Aggregates(alive=lambda p: p in alive)
    srv.collector.aggregates = srv.aggregates
    return srv


def test_cuda_calls_count_per_pid_and_op_with_le_buckets(server):
    agg = server.aggregates
    agg.add(records(rec(Op.CUDA_STREAM_SYNC, 100, 1_000), rec(Op.CUDA_STREAM_SYNC, 100, 1_001),
                    rec(Op.CUDA_STREAM_SYNC, 100, 20_000_000_000), rec(Op.CUDA_LAUNCH_KERNEL, 100, 5_000),
                    rec(Op.CUDA_LAUNCH_KERNEL, 200, 5_000)), {100: "python3 (train.py)"})
    agg.add(records(rec(Op.CUDA_STREAM_SYNC, 100, 1_000)))  # a second flush adds up
    s = samples(server)
    sync = {"pid": "100", "process": "python3 (train.py)", "op": "cudaStreamSync"}
    assert s[("ingero_cuda_call_duration_seconds_count", frozenset(sync.items()))] == 4
    # buckets are cumulative and inclusive (le): 1 us holds the two 1,000 ns calls, the next bound
    # (1.096 us) the 1,001 ns one too
    assert s[("ingero_cuda_call_duration_seconds_bucket", frozenset({**sync, "le": "1e-06"}.items()))] == 2
    assert s[("ingero_cuda_call_duration_seconds_bucket", frozenset({**sync, "le": "1.096e-06"}.items()))] == 3
    assert s[("ingero_cuda_call_duration_seconds_bucket", frozenset({**sync, "le": "10.0"}.items()))] == 3
    assert s[("ingero_cuda_call_duration_seconds_bucket", frozenset({**sync, "le": "+Inf"}.items()))] == 4
    assert s[("ingero_cuda_call_duration_seconds_sum", frozenset(sync.items()))] == pytest.approx(20.000003001)
    assert s[("ingero_cuda_call_duration_seconds_count",
              frozenset({"pid": "200", "process": "", "op": "cudaLaunchKernel"}.items()))] == 1


def test_offcpu_split_runqueue_faults_and_block_io(server):
    server.aggregates.add(records(
        rec(Op.SCHED_SWITCH, 100, 3_000_000, int(Kind.PREEMPTED), arg=500_000),
        rec(Op.SCHED_SWITCH, 100, 7_000_000, int(Kind.SLEEP), arg=250_000),
        rec(Op.SCHED_SWITCH, 100, 1_000_000, int(Kind.IO)),
        rec(Op.PAGE_FAULT, 100), rec(Op.PAGE_FAULT, 100), rec(Op.PAGE_FAULT, 200),
        rec(Op.BLOCK_IO, 4242, 2_000_000, int(Kind.READ)), rec(Op.BLOCK_IO, 17, 4_000_000, int(Kind.WRITE)),
    ))
    s = samples(server)
    p = {"pid": "100", "process": ""}
    assert s[("ingero_offcpu_seconds_total", frozenset({**p, "state": "preempted"}.items()))] == pytest.approx(0.003)
    assert s[("ingero_offcpu_seconds_total", frozenset({**p, "state": "blocked"}.items()))] == pytest.approx(0.008)
    assert s[("ingero_offcpu_switches_total", frozenset({**p, "state": "blocked"}.items()))] == 2
    assert s[("ingero_runqueue_wait_seconds_total", frozenset(p.items()))] == pytest.approx(0.00075)
    assert s[("ingero_page_faults_total", frozenset(p.items()))] == 2
    # block I/O is host-wide, by kind: its issuing pids (kernel workers) would only grow the label set
    assert s[("ingero_block_io_duration_seconds_count", frozenset({"kind": "read"}.items()))] == 1
    assert s[("ingero_block_io_duration_seconds_count", frozenset({"kind": "write"}.items()))] == 1


def test_an_exited_process_leaves_at_the_next_scrape(server, alive):
    server.aggregates.add(records(rec(Op.CUDA_LAUNCH_KERNEL, 100, 5_000), rec(Op.CUDA_LAUNCH_KERNEL, 200, 5_000),
                                  rec(Op.PAGE_FAULT, 200), rec(Op.SCHED_SWITCH, 200, 10, int(Kind.SLEEP))))
    assert {dict(k[1]).get("pid") for k in samples(server)} >= {"100", "200"}
    alive.discard(200)
    pids = {dict(k[1]).get("pid") for k in samples(server)}
    assert "200" not in pids and "100" in pids
    assert set(server.aggregates.offcpu) == set() and set(server.aggregates.faults) == set()


def test_health_rate_over_the_last_flushes(server):
    agg = server.aggregates
    for i in range(5):
        agg.set_health(events=1000 * (i + 1), drops_kernel=3, drops_user=1, stale_calls=2, db_bytes=4096,
                       flush_s=0.002, now=100.0 + i)
    snap = agg.snapshot(now=105.0)
    assert snap.health.events_per_s == 5000 / 10  # five 1,000-row flushes over the 10 s window
    assert agg.snapshot(now=200.0).health.events_per_s == 0  # no flush for 10 s: idle
    s = samples(server)
    assert s[("ingero_drops_total", frozenset({"source": "kernel"}.items()))] == 3
    assert s[("ingero_flush_duration_seconds_count", frozenset())] == 5
    assert s[("ingero_db_bytes", frozenset())] == 4096


def test_active_chains_one_per_rule_and_pid():
    payload = {"analysed": {"processes": ["python3 (train.py) (PID 4242)"]},
               "chains": [{"rule_id": "cpu-contention", "severity": "HIGH", "share": 0.4, "pids": [4242]},
                          {"rule_id": "cpu-contention", "severity": "LOW", "share": 0.1, "pids": [4242, 7]}]}
    got = active_chains(payload)
    assert [(c.rule, c.pid, c.process, c.severity, c.share) for c in got] == [
        ("cpu-contention", 7, "", "LOW", 0.1), ("cpu-contention", 4242, "python3 (train.py)", "HIGH", 0.4)]


def test_step_rate_from_explains_steps():
    payload = {"analysed": {"start_ns": 10 * 10**9, "end_ns": 70 * 10**9,
                            "processes": ["python3 (train.py) (PID 4242)"]},
               "steps": {"count": 1200, "median_ms": 48.5, "p99_ms": 61.0, "source": "rhythm", "pid": 4242}}
    assert step_rate(payload) == StepRate(4242, "python3 (train.py)", 1200, 0.0485, 0.061, 20.0)
    # none found, or marks of an imported trace (no pid): no gauge
    assert step_rate({**payload, "steps": None}) is None
    assert step_rate({**payload, "steps": {**payload["steps"], "pid": None}}) is None


def test_build_info_and_no_severity_label_on_the_share(server):
    class Fixed:
        def snapshot(self):
            from ingero.metrics.diagnosis import ActiveChain, DiagnosisState

            return DiagnosisState([ActiveChain("cpu-contention", 100, "python3", "HIGH", 0.4)],
                                  StepRate(100, "python3", 600, 0.05, 0.09, 10.0), runs=1)

    server.collector.diagnosis = Fixed()
    s = samples(server)
    assert s[("ingero_build_info", frozenset({"version": __version__}.items()))] == 1
    p = {"pid": "100", "process": "python3"}
    # one series per (rule, process) whatever the severity: alert rules set their own `severity`
    assert [dict(k[1]) for k in s if k[0] == "ingero_diagnosis_share_ratio"] == [{"rule": "cpu-contention", **p}]
    assert s[("ingero_diagnosis_severity", frozenset({"rule": "cpu-contention", **p}.items()))] == 3
    assert s[("ingero_step_duration_seconds", frozenset({**p, "quantile": "0.5"}.items()))] == 0.05
    assert s[("ingero_step_duration_seconds", frozenset({**p, "quantile": "0.99"}.items()))] == 0.09
    assert s[("ingero_steps_per_second", frozenset(p.items()))] == 10.0


def test_diagnosis_gauges_from_a_real_query_server(tmp_path, server):
    """The demo's cpu-contention replay in a store served by the daemon's QueryServer: the timer's
    explain goes over the socket, and the gauges name the rule, the pid and the severity."""
    from ingero.daemon.server import QueryServer
    from ingero.demo import runner
    from ingero.store.db import Store

    db = tmp_path / "demo.duckdb"
    runner.run("cpu-contention", duration_s=20, keep_db=db, synthetic_only=True, fix=False)
    store = Store.open(db)
    srv = QueryServer(store.con.cursor, tmp_path / "q.sock").start()
    try:
        diag = Diagnosis(srv.socket_path, session_id=1, span_s=3600)
        diag.run_once()
        state = diag.snapshot()
        assert state.errors == 0 and state.runs == 1
        server.collector.diagnosis = diag
        s = samples(server)
    finally:
        srv.stop()
        store.close()
    severity = {dict(k[1])["rule"]: (dict(k[1])["pid"], v) for k, v in s.items()
                if k[0] == "ingero_diagnosis_severity"}
    assert "cpu-contention" in severity
    pid, level = severity["cpu-contention"]
    chain = next(c for c in state.chains if c.rule == "cpu-contention")
    assert pid == str(chain.pid) and level == {"HIGH": 3, "MEDIUM": 2, "LOW": 1}[chain.severity]
    share = [v for k, v in s.items()
             if k[0] == "ingero_diagnosis_share_ratio" and dict(k[1])["rule"] == "cpu-contention"]
    assert share == [pytest.approx(chain.share)] and 0 < chain.share <= 1
    # the loop's steps, as explain found them over the same window
    steps = state.steps
    assert steps is not None and steps.pid == chain.pid and steps.count > 0
    p = {"pid": str(steps.pid), "process": steps.process}
    assert s[("ingero_step_duration_seconds", frozenset({**p, "quantile": "0.5"}.items()))] == steps.median_s > 0
    assert s[("ingero_steps_per_second", frozenset(p.items()))] == steps.per_s > 0


# -- bad input: one line, exit 2, before anything is opened or attached ---------------------


def _trace(tmp_path: Path, capsys, *args: str) -> tuple[int, str]:
    db = tmp_path / "t.duckdb"
    code = main(["trace", "--duration", "1s", "--db", str(db), *args])
    err = capsys.readouterr().err
    assert not db.exists(), "the store was opened: the check came too late"
    return code, err


def test_port_in_use_is_one_line_before_anything_is_attached(tmp_path, capsys):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        code, err = _trace(tmp_path, capsys, "--metrics-port", str(port))
    finally:
        holder.close()
    assert code == 2
    assert err.strip().splitlines() == [
        f"ingero: cannot serve metrics on 127.0.0.1:{port}: Address already in use — another process listens "
        f"there (`ss -ltnp 'sport = :{port}'` names it); pass another --metrics-port"]


@pytest.mark.parametrize("addr, words", [
    ("256.1.1.1", "bad --metrics-addr: '256.1.1.1' is not an IP address"),
    ("my-host", "bad --metrics-addr: 'my-host' is not an IP address"),
    ("192.0.2.1", "cannot serve metrics on 192.0.2.1:"),  # TEST-NET-1: an address this host does not have
])
def test_bad_bind_address_is_one_line(tmp_path, capsys, addr, words):
    code, err = _trace(tmp_path, capsys, "--metrics-port", "9", "--metrics-addr", addr)
    assert code == 2 and len(err.strip().splitlines()) == 1 and words in err


@pytest.mark.parametrize("port", ["0", "65536", "http"])
def test_bad_port_is_one_line(tmp_path, capsys, port):
    code, err = _trace(tmp_path, capsys, "--metrics-port", port)
    assert code == 2 and err.startswith("ingero: bad --metrics-port") and len(err.strip().splitlines()) == 1


def test_promtool_accepts_the_alert_examples_and_the_scrape_config(tmp_path):
    promtool = prereqs.needs(shutil.which("promtool"), "promtool", "apt-get install prometheus, or make setup")
    rules = subprocess.run([promtool, "check", "rules", str(REPO / "deploy" / "ingero-alerts.yml")],
                           capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "SUCCESS: 5 rules found" in rules.stdout
    config = subprocess.run([promtool, "check", "config", str(REPO / "deploy" / "prometheus.yml")],
                            capture_output=True, text=True)
    assert config.returncode == 0, config.stdout + config.stderr


def test_the_session_hook_runs_once_per_flush_with_what_was_stored(monkeypatch):
    """TraceSession.flush (fake ring, in-memory store) hands each stored batch to the metrics hook."""
    from test_session_flush import FakeProgram, FakeReader, records

    from ingero.collect import session
    from ingero.store.db import Store

    monkeypatch.setattr(session, "RingReader", FakeReader)
    monkeypatch.setattr(session, "_process_info", lambda pid: None)
    metrics = MetricsServer("127.0.0.1", 0)
    metrics.aggregates = Aggregates(alive=lambda p: True)
    metrics.collector.aggregates = metrics.aggregates
    calls = []
    real = metrics.on_flush
    monkeypatch.setattr(metrics, "on_flush", lambda s, recs, t: (calls.append(len(recs)), real(s, recs, t)))
    store = Store.memory()
    sess = session.TraceSession(session.TraceOptions(hooks=[metrics]), store, FakeProgram(),
                                store.begin_session(command="test", targets="fake"))
    for n, op in ((3000, Op.CUDA_LAUNCH_KERNEL), (500, Op.CUDA_STREAM_SYNC)):
        sess.reader.queue = records(n, op=op)
        while sess.poll():
            pass
        sess.flush()
    assert calls == [3000, 500]
    s = samples(metrics)
    for op, n in (("cudaLaunchKernel", 3000), ("cudaStreamSync", 500)):
        assert s[("ingero_cuda_call_duration_seconds_count",
                  frozenset({"pid": "42", "process": "", "op": op}.items()))] == n
    assert s[("ingero_events_stored_total", frozenset())] == 3500 == sess.events
    assert s[("ingero_flush_duration_seconds_count", frozenset())] == 2
