"""explain end to end: healthy runs, ranges, filters, rendering, CLI edges, JSON shape."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyze_helpers import MAIN_PID, SESSION, S, T0, Trace, healthy, silent
from ingero.analyze import context
from ingero.analyze.context import Options
from ingero.analyze.explain import explain
from ingero.cli import cli, main
from ingero.errors import IngeroError
from ingero.render import json as render_json
from ingero.render import terminal

STRESS = 7000


def contended() -> Trace:
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(STRESS, "stress", "stress", "stress --cpu 2")
    tr.loop(0, 10).loop(10, 20, preempt_ms=40, preempt_by=STRESS).loop(20, 30)
    return tr.competitor(STRESS, "stress", 10, 20).system(0, 30, cpu_pct=91.0, load1=6.1)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "ingero.duckdb"
    contended().store(path).close()
    return path


def test_healthy_run_has_no_high_or_medium_chain_and_says_what_was_analysed():
    report = healthy(30).explain()
    assert [c for c in report.chains if c.severity in ("HIGH", "MEDIUM")] == []
    out = io.StringIO()
    terminal.write(report, out)
    text = out.getvalue()
    assert "No causal chains" in text
    # the two DataLoader workers made no CUDA call: counted, not listed
    assert "from 1 traced process (+2 followed without CUDA calls) over 30 s" in text
    assert report.analysed.processes == ["python3 (train.py) (PID 4242)"]
    assert "drops: 0 kernel, 0 user" in text
    assert report.analysed.cuda_events == sum(1 for e in healthy(30).events if e["op"].startswith("cuda"))


def test_healthy_variants_stay_silent():
    # GPU-bound with long syncs, a few waits, pinned copies, modest worker load
    for step in ({"device_ms": 80}, {"wait_ms": 2}, {"launches": 200, "device_ms": 40}):
        report = healthy(20, **step).explain()
        assert [c.rule_id for c in report.chains if c.severity != "LOW"] == [], step


def test_drops_are_shown():
    report = healthy(10).explain(drops=1234)
    assert report.analysed.drops_kernel == 1234
    out = io.StringIO()
    terminal.write(report, out)
    assert "1,234 events were dropped" in out.getvalue()


def test_since_limits_to_the_last_span_and_loses_the_earlier_cause():
    tr = Trace().name(MAIN_PID, "python3 (train.py)", "python3", "python3 train.py")
    tr.name(STRESS, "stress", "stress").loop(0, 10, preempt_ms=40, preempt_by=STRESS).loop(10, 40).system(0, 40)
    assert tr.explain().chains[0].rule_id == "cpu-contention"
    report = tr.explain(since_s=20)
    assert silent(report)
    assert report.analysed.end_ns - report.analysed.start_ns == pytest.approx(20 * S, rel=0.01)


def test_pid_filter_keeps_only_that_process():
    tr = contended().loop(0, 30, pid=4300, tid=4300)
    report = tr.explain(pids=(4300,))
    assert [p for p in report.analysed.processes] == ["pid 4300 (PID 4300)"]
    assert silent(report)


def test_adaptive_window():
    assert context.adaptive_window_ns(30 * S) == 1 * S
    assert context.adaptive_window_ns(120 * S) == 4 * S
    assert context.adaptive_window_ns(3600 * S) == 60 * S
    assert healthy(10).explain(window_s=2.0).analysed.windows == 5


def test_empty_database_is_a_user_error():
    from ingero.store.db import Store

    with pytest.raises(IngeroError, match="no sessions"):
        explain(Store.memory().con, Options())


def test_parse_time():
    assert context.parse_time("1700000000") == 1_700_000_000 * S
    assert context.parse_time("2023-11-14T22:13:20Z") == 1_700_000_000 * S
    with pytest.raises(ValueError):
        context.parse_time("yesterday")


def test_terminal_view_of_a_chain():
    out = io.StringIO()
    terminal.write(contended().explain(), out)
    text = out.getvalue()
    assert text.startswith("System Context: CPU: 91.0% | Memory: 40.0% | Load: 6.1 (2 cores) | Swap: 0 MB")
    assert "Causal Chains (last 30 s):" in text
    assert ("[HIGH] CPU scheduling contention → CUDA calls delayed — 29.5% of the loop's time in the range\n"
            "  Root:         884 involuntary context switches on python3 (train.py) (PID 4242)\n") in text
    assert "  Fix:          taskset -c 1 python3 train.py   (give the loop its own core)\n" in text


def test_cli_text_and_json(db: Path):
    runner = CliRunner()
    res = runner.invoke(cli, ["explain", "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "[HIGH] CPU scheduling contention" in res.output
    res = runner.invoke(cli, ["explain", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["format_version"] == render_json.FORMAT_VERSION
    assert set(doc) == {"format_version", "analysed", "system", "chains", "notes", "stack", "device", "steps",
                        "workloads"}
    chain = doc["chains"][0]
    assert set(chain) == {
        "rule_id", "severity", "title", "root", "effect", "contributing", "fix", "pids", "culprits",
        "evidence_windows", "windows_total", "correlation", "correlation_note", "impact", "share", "numbers",
        "headline",
    }
    assert chain["rule_id"] == "cpu-contention" and chain["culprits"][0]["pid"] == STRESS
    assert set(chain["evidence_windows"][0]) == {"start_ns", "end_ns"}
    assert chain["evidence_windows"][0]["start_ns"] == T0 + 10 * S
    assert doc["analysed"]["drops_kernel"] == 0


def test_cli_pid_and_window_and_session(db: Path):
    res = CliRunner().invoke(cli, ["explain", "--db", str(db), "--session", "1", "--pid", str(MAIN_PID),
                                   "--window", "2s", "--from", str(T0 // S), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["analysed"]["window_s"] == 2.0
    assert doc["chains"][0]["rule_id"] == "cpu-contention"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--since", "5x"], "ingero: bad --since: '5x' is not a duration"),
        (["--from", "yesterday"], "ingero: bad --from: 'yesterday' is not a time"),
        (["--session", "9"], "ingero: no session 9 in the database"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(db: Path, capsys, args, message):
    assert main(["explain", "--db", str(db), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1


def test_cli_missing_db_is_one_line_exit_2(tmp_path: Path, capsys):
    assert main(["explain", "--db", str(tmp_path / "nope.duckdb")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ingero: no ingero database at {tmp_path / 'nope.duckdb'}")
    assert err.count("\n") == 1


def test_stack_section_renders_callers():
    from ingero.analyze.model import Analysed, Report, SystemContext

    report = Report(
        analysed=Analysed(1, 0, 10 * S, 1.0, 10, 5, 3, []),
        system=SystemContext(ncpu=2),
        chains=[],
        stack={
            "top_callers": [{"file": "train.py", "line": 142, "function": "step", "source": "loss.backward()",
                             "op": "cudaStreamSync", "calls": 1204, "total_ns": 3.1e9, "max_ns": 8e6}],
            "preempted_lines": [],
        },
    )
    out = io.StringIO()
    terminal.write(report, out)
    text = out.getvalue()
    assert "train.py:142  loss.backward()   cudaStreamSync: 1,204 calls, 3.1 s total, max 8.0 ms" in text
    assert "Most preempted lines:\n  (none)" in text


def test_explain_stack_option_runs_the_callers_module():
    report = contended().explain(stack=True)
    assert set(report.stack) == {"top_callers", "preempted_lines", "sampled_lines"}
    assert report.stack["top_callers"] == []  # no stacks recorded in this trace
    assert report.stack["sampled_lines"] == []  # nor CPU samples


def test_cli_asks_the_running_tracer_when_the_db_is_locked(db: Path, monkeypatch):
    from ingero.daemon import client
    from ingero.store import db as store_db

    def locked(*a, **k):
        raise store_db.DatabaseLocked(db, "Conflicting lock is held")

    asked = {}

    def fake_explain(*, socket_path, **args):
        asked.update(args, socket=socket_path)
        return {"json": {"format_version": 1, "chains": []}, "text": "from the tracer\n"}

    monkeypatch.setattr(store_db.Store, "open", classmethod(lambda cls, *a, **k: locked()))
    monkeypatch.setattr(client, "find_socket", lambda path, **kw: Path("/run/ingero.sock"))
    monkeypatch.setattr(client, "explain", fake_explain)
    res = CliRunner().invoke(cli, ["explain", "--db", str(db), "--since", "2m", "--pid", "7"])
    assert res.exit_code == 0, res.output
    assert res.output == "from the tracer\n"
    assert asked["since_s"] == 120.0 and asked["pids"] == [7] and asked["socket"] == Path("/run/ingero.sock")


def _with_nvml(tr, util_pct: float, gpus: int = 1, seconds: int = 10):
    for s in range(seconds):
        for g in range(gpus):
            tr.gpu.append({"session_id": SESSION, "timestamp": T0 + s * 1_000_000_000 + 500_000_000, "gpu": g,
                           "name": "A100", "util_pct": util_pct, "mem_util_pct": 10.0})
    return tr


@pytest.mark.parametrize(("device_ms", "wait_ms", "util", "says"), [
    (30.0, 0.0, 88.0, None),  # GPU-bound, NVML agrees: no note
    (3.0, 30.0, 95.0, "more than"),  # 30 ms asleep after each sync, nothing queued: the calls allow ~15%
    (30.0, 0.0, 20.0, "less than"),  # the syncs waited most of the time: NVML saw another GPU
])
def test_nvml_is_shown_beside_the_inferred_share_and_a_disagreement_is_noted(device_ms, wait_ms, util, says):
    report = _with_nvml(healthy(10, device_ms=device_ms, wait_ms=wait_ms), util).explain()
    d = report.device
    assert d.source == "inferred" and d.nvml_util == pytest.approx(util / 100)
    notes = [n for n in report.notes if n.startswith("NVML says")]
    if says is None:
        assert d.low - 0.05 <= d.nvml_util <= d.high + 0.05 and notes == []
    else:
        assert len(notes) == 1 and says in notes[0], (d, notes)
    out = io.StringIO()
    terminal.write(report, out)
    assert f"; NVML {util:.1f}%" in out.getvalue()


def test_nvml_of_two_gpus_is_not_compared():
    report = _with_nvml(healthy(10, device_ms=3.0, wait_ms=30.0), 95.0, gpus=2).explain()
    assert report.device.nvml_util is None and not [n for n in report.notes if n.startswith("NVML says")]


def test_a_nan_nvml_sample_is_not_compared():
    report = _with_nvml(healthy(10, device_ms=3.0, wait_ms=30.0), float("nan")).explain()
    assert report.device.nvml_util is None and not [n for n in report.notes if n.startswith("NVML says")]
