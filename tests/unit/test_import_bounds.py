"""`ingero import` within bounds: pipes and standard input, limits, bad numbers, hostile names.

Each bad input is one line on stderr, exit 2, and changes nothing in the DB;
each bad number is a counted, skipped value.  Property tests (hypothesis) for
the number and token handling: any values give a store within range and the
same rows on the fast path (DuckDB's reader) and the streaming one.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import re
import sys
import threading
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kineto_truth as truth
from ingero.cli import main
from ingero.importer import import_trace, raw, reader
from ingero.importer.report import terminal_safe
from ingero.importer.source import Limits, Source
from ingero.store.db import Store

SMALL = truth.DATA / "alexnet_a100.json.gz"
TABLES = ("sessions", "events", "device_activity", "spans", "process_names")
T0 = 1_700_000_000_000_000  # µs


def _call(**kw) -> dict:
    e = {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": T0, "dur": 5,
         "args": {"correlation": 1}}
    e.update(kw)
    return e


def _write(path: Path, events: list[dict], **meta) -> Path:
    path.write_text(json.dumps({"traceEvents": events, **meta}))
    return path


def _counts(db: Path) -> dict[str, int]:
    store = Store.open(db, read_only=True)
    try:
        return {t: store.con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}
    finally:
        store.close()


def _rows(store: Store, sid: int) -> dict[str, list]:
    q = {"events": "SELECT timestamp, duration_ns, pid, tid, op, kind, bytes, stream FROM events",
         "device_activity": "SELECT * EXCLUDE (session_id) FROM device_activity",
         "spans": "SELECT * EXCLUDE (session_id) FROM spans"}
    return {t: store.con.execute(f"{sql} WHERE session_id = $s ORDER BY ALL", {"s": sid}).fetchall()
            for t, sql in q.items()}


def _one_line_exit_2(argv: list[str], capsys, *needles: str) -> str:
    assert main(argv) == 2, argv
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    for n in needles:
        assert n in err, (n, err)
    return err


# -- pipes and standard input ---------------------------------------------------------------

class _Writer(threading.Thread):
    """Writes ``data`` into a pipe in small pieces, as zcat would, and closes it."""

    def __init__(self, data: bytes):
        super().__init__(daemon=True)
        self.r, self.w = os.pipe()
        self.data = data

    def run(self) -> None:
        with os.fdopen(self.w, "wb") as f:
            for i in range(0, len(self.data), 65536):
                try:
                    f.write(self.data[i:i + 65536])
                except BrokenPipeError:
                    return


@pytest.fixture(scope="module")
def from_file():
    store = Store.memory()
    r = import_trace(store, truth.DATA / "a100_nccl_rank0.json.gz")
    yield _rows(store, r.session_id), r
    store.close()


@pytest.mark.parametrize("gz", [True, False])
def test_a_pipe_imports_as_the_file_does(from_file, gz):
    """`ingero import <(zcat t.json.gz)`: a pipe, read once; gzip known by its bytes, not its name."""
    data = (truth.DATA / "a100_nccl_rank0.json.gz").read_bytes()
    w = _Writer(data if gz else gzip.decompress(data))
    w.start()
    store = Store.memory()
    r = import_trace(store, f"/dev/fd/{w.r}")
    os.close(w.r)
    w.join()
    assert _rows(store, r.session_id) == from_file[0]
    assert (r.calls, r.device, r.spans, r.unused) == (from_file[1].calls, from_file[1].device, from_file[1].spans,
                                                       from_file[1].unused)
    assert store.con.execute("SELECT imported_from FROM sessions").fetchone()[0] == f"/dev/fd/{w.r}"


def test_a_pipe_is_replayed_when_the_fast_path_gives_up_midway(from_file, monkeypatch):
    """DuckDB refuses the third piece: the streaming reader starts over from the spool, then reads on."""
    monkeypatch.setattr(raw, "PIECE_BYTES", 1 << 20)
    monkeypatch.setattr(raw, "TAIL_WINDOW", 256 << 10)
    calls = []
    insert = raw._insert

    def refuse_third(con, path, fmt):
        calls.append(fmt)
        if fmt == "array" and calls.count("array") == 3:
            raise duckdb.InvalidInputException("refused")
        insert(con, path, fmt)

    monkeypatch.setattr(raw, "_insert", refuse_third)
    w = _Writer((truth.DATA / "a100_nccl_rank0.json.gz").read_bytes())
    w.start()
    store = Store.memory()
    r = import_trace(store, f"/dev/fd/{w.r}")
    os.close(w.r)
    w.join()
    assert calls.count("array") == 3 and "newline_delimited" in calls
    assert _rows(store, r.session_id) == from_file[0]


def test_standard_input(from_file, monkeypatch, tmp_path, capsys):
    w = _Writer((truth.DATA / "a100_nccl_rank0.json.gz").read_bytes())
    w.start()
    monkeypatch.setattr(sys, "stdin", os.fdopen(w.r, "r"))
    db = tmp_path / "x.duckdb"
    assert main(["import", "--db", str(db), "-"]) == 0
    w.join()
    out = capsys.readouterr().out
    assert out.startswith("standard input: imported as session 1")
    store = Store.open(db, read_only=True)
    try:
        assert _rows(store, 1) == from_file[0]
        assert store.con.execute("SELECT imported_from FROM sessions").fetchone()[0] == "<stdin>"
    finally:
        store.close()
    _one_line_exit_2(["import", "--db", str(db), "-", "-"], capsys, "standard input ('-') can be imported once")


def test_gzip_is_found_by_its_magic_bytes_not_the_name(tmp_path):
    plain = tmp_path / "t.json.gz"
    plain.write_bytes(gzip.decompress(SMALL.read_bytes()))
    packed = tmp_path / "t.json"
    packed.write_bytes(SMALL.read_bytes())
    store = Store.memory()
    a, b, c = (import_trace(store, p) for p in (plain, packed, SMALL))
    assert _rows(store, a.session_id) == _rows(store, b.session_id) == _rows(store, c.session_id)
    assert a.calls == c.calls > 0


# -- limits -----------------------------------------------------------------------------------

def _bomb(path: Path, blank_mib: int) -> Path:
    with gzip.open(path, "wb", compresslevel=9) as f:
        f.write(json.dumps({"traceEvents": [_call()]})[:-2].encode())
        for _ in range(blank_mib):
            f.write(b" " * (1 << 20))
        f.write(b"]}")
    return path


def test_a_gzip_bomb_is_refused_by_its_ratio_and_the_limit_can_be_raised(tmp_path, capsys):
    bomb = _bomb(tmp_path / "bomb.json.gz", 16)  # ~16 KB inflating ~1,000x
    assert os.path.getsize(bomb) < 30_000
    db = tmp_path / "x.duckdb"
    assert main(["import", "--db", str(db), str(SMALL)]) == 0
    capsys.readouterr()
    before = _counts(db)
    _one_line_exit_2(["import", "--db", str(db), str(bomb)], capsys, "inflates to more than 100x", "--max-ratio")
    assert _counts(db) == before
    # allowed: 16 MiB of blanks after the event are skipped, the one call is stored
    assert main(["import", "--db", str(db), "--max-ratio", "2000", str(bomb)]) == 0
    assert "1 CUDA calls -> events" in capsys.readouterr().out
    assert _counts(db)["events"] == before["events"] + 1


def test_the_absolute_limit_on_json_and_its_option(tmp_path, capsys):
    db = tmp_path / "x.duckdb"
    big = truth.DATA / "sampled_rank0_ws128.json.gz"  # 1.76 MB of JSON
    _one_line_exit_2(["import", "--db", str(db), "--max-json", "1MB", str(big)], capsys,
                     "holds more than 976.6 KiB of JSON", "--max-json")
    assert not db.exists()
    assert main(["import", "--db", str(db), "--max-json", "2MB", str(big)]) == 0
    capsys.readouterr()
    _one_line_exit_2(["import", "--db", str(db), "--max-json", "nan", str(big)], capsys, "--max-json")
    _one_line_exit_2(["import", "--db", str(db), "--max-ratio", "0", str(big)], capsys, "--max-ratio")


def test_a_pipe_is_held_to_the_same_limits(tmp_path):
    w = _Writer((truth.DATA / "sampled_rank0_ws128.json.gz").read_bytes())
    w.start()
    store = Store.memory()
    with pytest.raises(Exception) as exc:
        import_trace(store, f"/dev/fd/{w.r}", limits=Limits(max_json_bytes=1 << 20))
    os.close(w.r)
    w.join()
    assert type(exc.value).__name__ == "IngeroError" and "holds more than 1.0 MiB of JSON" in str(exc.value)
    assert store.con.execute("SELECT count(*) FROM sessions").fetchone()[0] == 0


@pytest.fixture
def small_buffers(monkeypatch):
    """Pieces, tail window and the one-value limit small, so that a test of them stays small."""
    monkeypatch.setattr(raw, "PIECE_BYTES", 256 << 10)
    monkeypatch.setattr(raw, "TAIL_WINDOW", 64 << 10)
    monkeypatch.setattr(raw, "MAX_TOKEN_BYTES", 1 << 20)
    monkeypatch.setattr(reader, "MAX_TOKEN_BYTES", 1 << 20)
    monkeypatch.setattr(reader, "CHUNK_BYTES", 64 << 10)
    monkeypatch.setattr(raw, "CHUNK_BYTES", 64 << 10)


def test_one_value_longer_than_the_limit_is_one_line(tmp_path, capsys, small_buffers):
    events = [_call(ts=T0 + i) for i in range(5000)] + [_call(name="k" * (3 << 20))] + [_call()] * 10
    path = _write(tmp_path / "long.json", events)
    _one_line_exit_2(["import", "--db", str(tmp_path / "x.duckdb"), str(path)], capsys,
                     "one JSON value is longer than 1.0 MiB")


def test_a_long_run_of_blanks_between_events_is_skipped(tmp_path, small_buffers):
    text = json.dumps({"traceEvents": [_call(ts=T0 + i) for i in range(3000)]})
    cut = text.index("}, {", len(text) // 2) + 2
    path = tmp_path / "blank.json"
    path.write_text(text[:cut] + " " * (8 << 20) + "\n" + text[cut:])
    store = Store.memory()
    r = import_trace(store, path)
    assert r.calls == 3000 and r.skipped == {}


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["key before", "element", "in args", "key after"])
def test_200k_nested_brackets_are_one_line(where, tmp_path, capsys):
    deep = _nested(200_000)
    text = {"key before": '{"x": ' + deep + ', "traceEvents": []}',
            "element": '{"traceEvents": [' + deep + "]}",
            "in args": '{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, '
                       '"ts": 1, "dur": 1, "args": {"x": ' + deep + '}}], "y": ' + deep + "}",
            "key after": '{"traceEvents": [], "y": ' + deep + "}"}[where]
    path = tmp_path / "deep.json"
    path.write_text(text)
    db = tmp_path / "x.duckdb"
    _one_line_exit_2(["import", "--db", str(db), str(path)], capsys, "nests deeper than the decoder's limit")
    assert not db.exists()


# -- bad numbers ----------------------------------------------------------------------------

BAD_NUMBERS = [
    ("ts 1e308", _call(ts=1e308), {"ts": 1}),
    ('ts "1e999"', _call(ts="1e999"), {"ts": 1}),
    ("ts NaN", _call(ts=math.nan), {"ts": 1}),
    ("ts Infinity", _call(ts=math.inf), {"ts": 1}),
    ("ts -Infinity", _call(ts=-math.inf), {"ts": 1}),
    ("ts near 2^63 ns", _call(ts=9.2e15), {"ts": 1}),
    ("ts int near 2^63 ns", _call(ts=9_223_372_036_854_775), {"ts": 1}),
    ("ts before 1970", _call(ts=-5), {"ts": 1}),
    ("dur 1e308", _call(dur=1e308), {"dur": 1}),
    ("dur negative", _call(dur=-3), {"dur": 1}),
    ("pid 1.5", _call(pid=1.5), {"pid": 1}),
    ("pid 2^40", _call(pid=1 << 40), {"pid": 1}),
    ("correlation 1e30", _call(args={"correlation": 1e30}), {"args.correlation": 1}),
    ("correlation 10^30", _call(args={"correlation": 10**30}), {"args.correlation": 1}),
    ("correlation NaN", _call(args={"correlation": math.nan}), {"args.correlation": 1}),
    ("kernel bytes -5, device 2^40", {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": T0, "dur": 1,
                                      "args": {"bytes": -5, "device": 1 << 40, "correlation": 1}},
     {"args.bytes": 1, "args.device": 1}),
]


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "streaming"])
@pytest.mark.parametrize("case, bad, skipped", BAD_NUMBERS, ids=[c[0] for c in BAD_NUMBERS])
def test_a_bad_number_is_counted_and_skipped(case, bad, skipped, fast, tmp_path, monkeypatch):
    if not fast:
        monkeypatch.setattr(raw, "_stage_fast", lambda con, src: None)
    path = _write(tmp_path / "t.json", [_call(ts=T0 + 10, args={"correlation": 2}), bad])
    store = Store.memory()
    r = import_trace(store, path)
    assert r.skipped == skipped
    stored = json.loads(store.con.execute("SELECT import_unused FROM sessions").fetchone()[0])
    assert {k.removeprefix("bad numbers skipped: "): v for k, v in stored.items()
            if k.startswith("bad numbers")} == skipped
    assert store.con.execute("SELECT count(*) FROM events WHERE timestamp = $t",
                             {"t": (T0 + 10) * 1000}).fetchone()[0] == 1
    lo, hi, dmax = store.con.execute("SELECT min(timestamp), max(timestamp), max(duration_ns) FROM events").fetchone()
    assert 0 <= lo <= hi <= 1 << 62 and dmax <= 1 << 61


def test_the_summary_names_the_skipped_values(tmp_path, capsys):
    path = _write(tmp_path / "t.json", [_call(), _call(ts=math.nan), _call(args={"correlation": 1.5})])
    assert main(["import", "--db", str(tmp_path / "x.duckdb"), str(path)]) == 0
    out = capsys.readouterr().out
    assert "bad numbers skipped: 2 values (args.correlation 1, ts 1)" in out
    assert "1  cuda_runtime events without a usable ts/dur" in out


@pytest.mark.parametrize("base", [10**30, "1e999", -1, "abc", True, 1.5, [1]])
def test_a_bad_base_time_is_one_line(base, tmp_path, capsys):
    path = _write(tmp_path / "t.json", [_call(ts=10)], baseTimeNanoseconds=base)
    db = tmp_path / "x.duckdb"
    _one_line_exit_2(["import", "--db", str(db), str(path)], capsys, "baseTimeNanoseconds", "is not a time in ns")
    assert not db.exists()


def test_bad_numbers_in_the_metadata_are_skipped(tmp_path):
    path = _write(tmp_path / "t.json", [_call()], distributedInfo={"rank": 10**30, "world_size": 8},
                  deviceProperties=[{"id": 0, "name": "GPU", "totalGlobalMem": math.inf, "x": math.nan}])
    store = Store.memory()
    r = import_trace(store, path)
    assert (r.rank, r.world_size) == (None, 8)
    assert r.skipped == {"distributedInfo.rank": 1, "deviceProperties": 2}
    props = store.con.execute("SELECT device_properties FROM sessions").fetchone()[0]

    def strict(c):
        raise ValueError(c)

    assert json.loads(props, parse_constant=strict) == [{"id": 0, "name": "GPU", "totalGlobalMem": None, "x": None}]


# -- names from the trace on the terminal ---------------------------------------------------

def test_the_summary_shows_hostile_names_escaped(tmp_path, capsys):
    evil = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"
    events = [_call(), _call(name="cudaFoo" + evil), {"ph": "X", "cat": evil, "name": "x", "pid": 1, "tid": 1,
                                                     "ts": T0, "dur": 1}]
    path = _write(tmp_path / f"t{evil[:5]}.json", events, deviceProperties=[{"name": "GPU " + evil}])
    assert main(["import", "--db", str(tmp_path / "x.duckdb"), str(path)]) == 0
    out = capsys.readouterr().out
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", out)
    escaped = "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\u202e"
    assert f"GPU {escaped}" in out and f"CUDA calls without an op name: cudaFoo{escaped}" in out
    assert f"{escaped} events" in out and "t\\x1b]0;o.json: imported as session 1" in out


@given(st.text())
def test_terminal_safe_leaves_no_control_character(text):
    out = terminal_safe(text)
    assert not re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]", out)
    assert (out == text) == (re.search("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]",
                                       text) is None)


# -- property tests: numbers and tokens -----------------------------------------------------

# Values a trace's numeric fields may hold: JSON integers of any size, floats with NaN and the
# infinities, numbers as strings (PyTorch 1.x wrote tids so), other strings, booleans, null.
_NUMBERISH = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=-(1 << 70), max_value=1 << 70).map(str),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["stream 7", "abc", "", "Spans", "1e999", "-0", "007"]),
    st.booleans(), st.none(),
)
_REALISH = st.one_of(
    st.integers(min_value=0, max_value=4_000_000_000_000_000),
    st.floats(min_value=-1e6, max_value=5e15, allow_nan=False),
    _NUMBERISH,
)
_EVENT = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "M", "i"]),
     "cat": st.sampled_from(["cuda_runtime", "kernel", "gpu_memcpy", "cpu_op", "Runtime", "Kernel", "Operator"]),
     "name": st.sampled_from(["cudaLaunchKernel", "cudaMemcpyAsync", "k", "ProfilerStep#1", "process_name"]),
     "pid": _NUMBERISH, "tid": _NUMBERISH, "ts": _REALISH, "dur": _REALISH},
    optional={"args": st.one_of(
        st.fixed_dictionaries({}, optional={k: _NUMBERISH for k in ("correlation", "device", "stream", "bytes",
                                                                      "External id", "external id")}),
        _NUMBERISH)})
_EVENTS = st.lists(_EVENT, min_size=1, max_size=12)


def _staged(con, path: Path, fast: bool) -> list[tuple]:
    raw.stage(con, path, fast=fast)
    return con.execute("SELECT * FROM _imp_raw ORDER BY ALL").fetchall()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=_EVENTS)
def test_any_numbers_stage_the_same_rows_on_both_paths(events, tmp_path):
    """DuckDB's reader and the streaming one see the same text and convert it by the same rules."""
    path = _write(tmp_path / "p.json", events)
    con = duckdb.connect()
    try:
        fast_meta = raw._stage_fast(con, path)
        assert fast_meta is not None  # valid JSON of objects: the fast path reads it
        fast = con.execute("SELECT * FROM _imp_raw ORDER BY ALL").fetchall()
        assert _nan_equal(fast) == _nan_equal(_staged(con, path, fast=False))
    finally:
        raw.detach_scratch(con)
        con.close()


def _nan_equal(rows: list[tuple]) -> list[tuple]:
    """Rows with NaN as a marker (NaN != NaN: two paths staging the same NaN compare equal)."""
    return [tuple("<NaN>" if isinstance(v, float) and math.isnan(v) else v for v in r) for r in rows]


def _int_ok(v, bits: int) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, str):
        if not re.fullmatch(r"-?(0|[1-9][0-9]*)", v) or v == "-0":
            return False
        v = int(v)
    return isinstance(v, int) and -(1 << bits - 1) <= v < 1 << bits - 1


def _is_number(v) -> bool:
    """A JSON number, or a string holding one (what DuckDB casts to a double)."""
    if isinstance(v, bool) or v is None:
        return False
    if isinstance(v, (int, float)):
        return True
    try:
        float(v)
    except ValueError:
        return False
    return v.strip() == v and "_" not in v and v != ""


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=_EVENTS)
def test_any_numbers_import_within_range_and_every_bad_one_is_counted(events, tmp_path):
    path = _write(tmp_path / "p.json", events)
    store = Store.memory()
    try:
        try:
            r = import_trace(store, path)
        except Exception as exc:  # only a user error: one line
            assert type(exc).__name__ == "IngeroError" and "\n" not in str(exc), exc
            assert "has no events ingero can use" in str(exc)
            return
        want = {"pid": 0, "tid": 0, "args.correlation": 0, "args.device": 0, "args.bytes": 0}
        for e in events:
            for field, key, bits in (("pid", "pid", 32), ("tid", "tid", 32)):
                v = e.get(key)
                want[field] += v is not None and not _int_ok(v, bits) and _is_number(v)
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            for key, bits in (("correlation", 64), ("device", 32), ("bytes", 64)):
                v = args.get(key)
                ok = _int_ok(v, bits) and not (key == "bytes" and int(v) < 0)
                want[f"args.{key}"] += v is not None and not ok and _is_number(v)
        got = {k: v for k, v in r.skipped.items() if k in want}
        assert got == {k: v for k, v in want.items() if v}
        c = store.con
        for table, t, d in (("events", "timestamp", "duration_ns"), ("spans", "start_ns", "end_ns - start_ns"),
                            ("device_activity", "start_ns", "end_ns - start_ns")):
            lo, hi, dmin, dmax = c.execute(f"SELECT min({t}), max({t}), min({d}), max({d}) FROM {table}").fetchone()
            if lo is not None:
                assert 0 <= lo <= hi <= 1 << 62 and 0 <= dmin <= dmax <= 1 << 61
    finally:
        store.close()


_JSON_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=40)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(_JSON_TEXT, min_size=1, max_size=20), chunk=st.integers(min_value=1, max_value=97),
       indent=st.sampled_from([None, 0, 2]))
def test_the_streaming_reader_decodes_any_text_across_any_chunk_boundary(names, chunk, indent, tmp_path,
                                                                          monkeypatch):
    """Tokens cut anywhere (inside a string, an escape, a number, a multi-byte character) decode whole."""
    monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
    events = [{"ph": "X", "cat": "cpu_op", "name": n, "pid": 1, "tid": 2, "ts": 1.5 + i, "dur": 12345.678}
              for i, n in enumerate(names)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"a": names, "traceEvents": events, "z": {"n": names[-1]}}, indent=indent,
                               ensure_ascii=bool(chunk % 2)))
    r = reader.KinetoReader(Source(path))
    try:
        got = [e for batch in r.events() for e in batch]
    finally:
        r.close()
    assert got == events and r.meta == {"a": names, "z": {"n": names[-1]}}
