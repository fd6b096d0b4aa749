"""Bad input to `ingero import`: one line, exit 2, nothing written.  A CPU-only trace is accepted."""

from __future__ import annotations

import gzip
import json
import shutil

import kineto_truth as truth
from ingero.cli import main
from ingero.store.db import Store

SMALL = truth.DATA / "alexnet_a100.json.gz"
TABLES = ("sessions", "events", "device_activity", "spans", "process_names")


def _bad_files(tmp_path):
    text = gzip.decompress(SMALL.read_bytes())
    files = {
        "empty.json": (b"", "the file is empty"),
        "words.json": (b"hello world\n", "expected a JSON object"),
        "list.json": (b"[1, 2]", "expected a JSON object"),
        "other.json": (b'{"name": "x", "items": [1, 2]}', "it has no traceEvents"),
        "no_events.json": (b'{"traceEvents": []}', "has no events ingero can use"),
        "metadata_only.json": (json.dumps({"traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "x"}}]}).encode(),
            "has no events ingero can use"),
        "numbers.json": (b'{"traceEvents": [1, 2]}', "a traceEvents element is not an object"),
        "cut.json": (text[: len(text) // 2], "the trace ends early"),
        "cut.json.gz": (SMALL.read_bytes()[:10_000], "the compressed data is damaged or truncated"),
    }
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    return {name: why for name, (_, why) in files.items()}


def _counts(db):
    store = Store.open(db, read_only=True)
    try:
        return {t: store.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        store.close()


def test_bad_input_is_one_line_exit_2_and_changes_nothing(tmp_path, capsys):
    db = tmp_path / "ingero.duckdb"
    assert main(["import", "--db", str(db), str(SMALL)]) == 0
    capsys.readouterr()
    before = _counts(db)
    assert before["sessions"] == 1
    cases = _bad_files(tmp_path)
    cases["an_ingero.duckdb"] = "it is a DuckDB database"
    shutil.copy(db, tmp_path / "an_ingero.duckdb")
    for name, why in cases.items():
        assert main(["import", "--db", str(db), str(tmp_path / name)]) == 2, name
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and why in err, (name, err)
        assert _counts(db) == before, name


def test_a_bad_file_leaves_no_new_database(tmp_path, capsys):
    _bad_files(tmp_path)
    db = tmp_path / "new.duckdb"
    assert main(["import", "--db", str(db), str(tmp_path / "words.json")]) == 2
    assert not db.exists() and not (tmp_path / "new.duckdb.wal").exists()


def test_a_cpu_only_trace_is_accepted_and_says_what_it_lacks(tmp_path, capsys):
    """No CUDA call, no device: spans and steps only (torch.profiler with ProfilerActivity.CPU)."""
    events = [{"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i}", "pid": 7, "tid": 7,
               "ts": 1_700_000_000_000_000 + i * 1000, "dur": 900} for i in range(3)]
    events += [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 7, "tid": 7,
                "ts": 1_700_000_000_000_100 + i * 1000, "dur": 5.5} for i in range(3)]
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    db = tmp_path / "x.duckdb"
    assert main(["import", "--db", str(db), str(path)]) == 0
    out = capsys.readouterr().out
    assert "0 CUDA calls" in out and "CPU-only trace" in out
    assert _counts(db)["spans"] == 6 and _counts(db)["events"] == 0


def test_keys_after_the_events_and_a_single_line_file(tmp_path):
    """The fast path finds the array's end; keys after it (baseTimeNanoseconds) still apply."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 3, "tid": 4, "ts": 10.5, "dur": 2.25}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [{"id": 0, "name": "GPU [x]"}],
                                "baseTimeNanoseconds": 1_000_000_000}))
    store = Store.memory()
    from ingero.importer import import_trace

    r = import_trace(store, path)
    assert r.devices == ["GPU [x]"]
    assert store.con.execute("SELECT start_ns, end_ns FROM spans").fetchall() == [(1_000_010_500, 1_000_012_750)]
